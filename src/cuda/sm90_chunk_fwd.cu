/*
 * sm90_chunk_fwd.cu - chunked forward (prefill) of GDN on Hopper tensor cores (bf16 / f16
 * operands, f32 accumulation), chunk C = 64, following the chunked form of GDN_MATH.md with
 * Vnew = T diag(beta) (V - exp(Gam) K S), T = (I + A)^-1, so that W and U are never formed.
 *
 * Two kernels:
 *   chunk_prep  one CTA (4 warps, mma.sync) per (chunk, group of 1 .. 4 value heads of one key
 *               head), all chunks in parallel. Everything of a chunk that does not depend on the
 *               state: gates and their cumsum Gam, q/k L2 norms (kept as row factors, never
 *               rounded into q / k), K K^T and Q K^T (once per group: they depend on the key head
 *               only), then per value head A from K K^T, T = (I + A)^-1 in 16 x 16 blocks
 *               (diagonal blocks by forward substitution in f32, the others by 3xTF32
 *               tensor-core products), and the masked, decayed Q K^T. Writes per chunk to the
 *               workspace: Tb = T diag(beta) below the diagonal and Pm (bf16 / f16, 64 x 64
 *               each, lower triangular: only the 16 x 16 blocks on and below the diagonal are
 *               kept), f32 row factors and beta.
 *   chunk_wg    (sm90_chunk_wg.cuh) one CTA per (sequence, value head, 64 value rows): the state
 *               chain on warpgroup MMA, S^T (64 x K, f32) in accumulators across chunks, with an
 *               output warpgroup and a copy warpgroup beside it. Per chunk (M = value rows):
 *                 Y^T  = S^T K^T          X^T = V^T - ck * Y^T   (f32, one rounding)
 *                 Vn^T = X^T diag(beta) + X^T Tb^T      O^T = cq * (S^T Q^T) + Vn^T Pm^T
 *                 S^T  = gC * S^T + (Vn^T * cu) K
 *
 * KDA gates (a decay per key): kda_prep (sm90_kda_prep.cuh) takes chunk_prep's place, one CTA per
 * (chunk, value head), and writes the decays into the record's Q~, K~, K^ tiles and exp(Gam_C)
 * per key; chunk_wg<KDA> reads those tiles where GDN reads Q and K, and decays S^T by column.
 * Context parallelism and the cooperative grid are the same (KDA's grid: fixed-length sequences,
 * the first chunks' records written before it).
 *
 * Grids are one-dimensional with the CTAs that read the same tiles adjacent (head groups of a key
 * head in chunk_prep; V tiles, then value heads in chunk_wg), so those tiles come from L2.
 *
 * Few (sequence, head) pairs without CP (launch_coop): the main pass would leave most SMs idle and
 * chunk_prep would run alone before it, so both run in one cooperative grid, chunk_prep as units
 * of the spare CTAs (one per warpgroup), the main pass waiting on per-block counts of finished
 * records.
 *
 * Context parallelism (few (sequence, head) pairs, fixed-length sequences; plan_cp): the serial
 * chunk chain of a pair would keep only a few SMs busy, so each sequence is split into segments
 * of whole chunks. A segment maps its entering state affinely, S_out = M S_in + N (GDN_MATH.md's
 * chunk recurrence is linear in S). Between chunk_prep and the main pass:
 *   chunk_wg<PRE>  per (segment but the last, sequence, value head): the chain alone over V + K
 *                  virtual value rows, the real ones from a zero state (the first segment from
 *                  the initial state) giving N, K more with v = 0 from the identity giving M;
 *                  its final S^T (f32) to the workspace.
 *   cp_scan        per (sequence, value head, 8 value rows): S_j+1 = M_j S_j + N_j in f32, the
 *                  state entering every segment to the workspace.
 *   chunk_wg       per (segment, sequence, value head, 64 value rows), started from that state.
 * Everything stays in f32 between the passes; deterministic (no atomics, fixed orders).
 *
 * Varlen: chunk slots are laid out per sequence without host knowledge of the lengths: sequence n
 * starts at slot floor(cu[n] / 64) + n, which leaves room for its ceil(len / 64) chunks; the
 * workspace holds floor(T / 64) + N + 1 slots per value head. cu_seqlens is read on the device only
 * and clamped into [0, T]. No atomics in any arithmetic (launch_coop's counters only order the
 * passes): results are bitwise reproducible. With CP, the workspace also holds K (2 V + K) floats
 * per (sequence, value head, segment). q, k, v or o whose rows cannot be bulk-copied in place
 * (strides, alignment) are copied to or from a contiguous buffer at the workspace's start (plan_pack).
 */
#include <cstdlib>
#include <cstring>

#include "cuda_pack.cuh"
#include "sm90_chunk_common.cuh"
#include "sm90_chunk_prep.cuh"
#include "sm90_kda_prep.cuh"
#include "sm90_chunk_wg.cuh"
#include "sm90_chunk_scan.cuh"

namespace gdn_chunk {

/* ------------------------------------------------------------------------------------------ */
/* Host side                                                                                   */

/* Value heads per chunk_prep CTA: the most (a divisor of G, at most PREP_MAX_HEADS) that still
 * leave two waves of resident CTAs, since one CTA is one serial chain and a group's heads run one
 * after another: grouping saves the shared Q / K part (loads, norms, K K^T, Q K^T) but at a few
 * CTAs per SM lengthens the chains that then set the time. TUNE_PREP_HEADS caps the group
 * without the wave rule. */
static int64_t prep_heads_for(const gdn_problem *p, int64_t slots)
{
    if (TUNE_PREP_HEADS != 0) {
        for (int64_t nh = TUNE_PREP_HEADS < PREP_MAX_HEADS ? TUNE_PREP_HEADS : PREP_MAX_HEADS; nh > 1; --nh)
            if (p->G % nh == 0)
                return nh;
        return 1;
    }
    const int64_t resident = (int64_t)sm_count(p) * PREP_CTAS;
    for (int64_t nh = PREP_MAX_HEADS; nh > 1; --nh)
        if (p->G % nh == 0 && slots * p->HV / nh >= 2 * resident)
            return nh;
    return 1;
}

/* launch_coop's counters: one int per value head and block of FLAG_BLOCK slots. */
static size_t coop_flag_bytes(int64_t slots, int64_t HV) { return (size_t)flag_blocks(slots) * (size_t)HV * sizeof(int); }

/* Bytes of one chunk's record: GDN's (Tb, Pm, coefficients) or KDA's (KdaRec). */
static size_t record_bytes(const gdn_problem *p)
{
    if (p->gate_kind != GDN_GATE_KDA)
        return WS_CHUNK;
    return p->K == 64 ? KdaRec<64>::BYTES : KdaRec<128>::BYTES;
}

/* Bytes of the chunk workspace (the records, launch_coop's counters, then with cu_seqlens the main
 * pass's order of sequences, GDN gates), then of the CP buffers. */
static size_t order_offset(const gdn_problem *p)
{
    const int64_t slots = slots_per_head(p);
    return (size_t)slots * (size_t)p->HV * record_bytes(p) + (coop_flag_bytes(slots, p->HV) + 15) / 16 * 16;
}

static size_t chunk_ws_bytes(const gdn_problem *p)
{
    const bool ordered = p->cu_seqlens && p->gate_kind != GDN_GATE_KDA; /* launch_two */
    return order_offset(p) + (ordered ? ((size_t)p->N * sizeof(int) + 15) / 16 * 16 : 0);
}

/* q, k, v and o views whose rows the kernels cannot bulk-copy in place (gdn_cuda_rows_aligned16) get
 * a contiguous copy at the start of the workspace: q, k and v are packed into it before the kernels
 * run, o is written there and copied out after. Each copy starts on a 256-byte boundary. */
struct PackPlan {
    const gdn_view *view[4]; /* q, k, v, o */
    int64_t H[4], D[4];
    size_t off[4];           /* byte offset of each copy, or SIZE_MAX: used in place */
    size_t bytes;            /* all copies */
};

static PackPlan plan_pack(const gdn_problem *p)
{
    PackPlan pk = {{&p->q, &p->k, &p->v, &p->o}, {p->H, p->H, p->HV, p->HV}, {p->K, p->K, p->V, p->V}, {}, 0};
    for (int i = 0; i < 4; ++i) {
        pk.off[i] = SIZE_MAX;
        if (gdn_cuda_rows_aligned16(pk.view[i]))
            continue;
        pk.off[i] = pk.bytes;
        pk.bytes += ((size_t)(p->B * p->T * pk.H[i] * pk.D[i]) * 2 + 255) / 256 * 256;
    }
    return pk;
}

/* One launch (cooperative: every CTA resident at once, or cudaErrorCooperativeLaunchTooLarge), with
 * the kernel's dynamic shared memory limit raised to smem first; the error of that launch alone
 * (not one an earlier call left pending). */
static cudaError_t launch_raw(void (*kernel)(const ChunkParams), int64_t ctas, int threads, int smem, cudaStream_t stream,
                              const ChunkParams &prm, bool cooperative)
{
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess)
        return e;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)ctas);
    cfg.blockDim = dim3((unsigned)threads);
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = stream;
    cfg.attrs = cooperative ? attr : NULL;
    cfg.numAttrs = cooperative ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, prm);
}

static gdn_status launch_kernel(void (*kernel)(const ChunkParams), int64_t ctas, int threads, int smem,
                                cudaStream_t stream, const ChunkParams &prm, const char *what)
{
    return gdn_cuda_check(launch_raw(kernel, ctas, threads, smem, stream, prm, false), what);
}

template <typename T, int K, bool KDA>
static gdn_status launch_prep(const ChunkParams &prm, const gdn_problem *p, cudaStream_t stream)
{
    if (p->T <= 0 || prm.slots <= 0)
        return GDN_OK;
    if (KDA)
        return launch_kernel(kda_prep_kernel<K, T>, prm.slots * p->HV, 128, KdaPrepSmem<K>::BYTES, stream, prm,
                             "kda_prep launch");
    auto prep = prm.prep_heads > 1 ? chunk_prep_kernel<K, T, true> : chunk_prep_kernel<K, T, false>;
    return launch_kernel(prep, prm.slots * p->HV / prm.prep_heads, 128, PrepSmem<K>::BYTES, stream, prm,
                         "chunk_prep launch");
}

/* The main pass's 64-row value tiles: its one-chain CTAs, one per SM at a time (the plain path's
 * grid; the cooperative grid's first coop_main CTAs). */
static int64_t wg_tiles(const gdn_problem *p) { return p->N * p->HV * (p->V / 64); }

/* chunk_wg over nseg segments, with PRE the chain alone over V + K virtual rows; DUAL: 128 value
 * rows a CTA. */
template <typename T, int K, bool SERVE, bool KDA, bool PRE, bool DUAL = false>
static gdn_status launch_wg(const ChunkParams &prm, const gdn_problem *p, int64_t nseg, cudaStream_t stream)
{
    const int64_t rows = PRE ? p->V + K : p->V;
    return launch_kernel(chunk_wg_kernel<K, T, PRE, SERVE, KDA, DUAL>, nseg * p->N * p->HV * (rows / (DUAL ? 128 : 64)),
                         WgConfig<PRE>::THREADS, WgSmem<K, PRE, KDA, DUAL>::BYTES, stream, prm, "chunk_wg launch");
}

/* Dev builds (GDN_CHUNK_DEV_DUAL_ENV): GDN_DEV_DUAL=0 never takes DUAL, 1 takes it wherever allowed,
 * also in place of the cooperative grid (so that the tests' small shapes run it); -1 without it. */
static int dev_dual()
{
#ifdef GDN_CHUNK_DEV_DUAL_ENV
    if (const char *e = getenv("GDN_DEV_DUAL"))
        return atoi(e) != 0;
#endif
    return -1;
}

/* Two math warpgroups a CTA (DUAL), each the chain and the outputs of 64 value rows, where the
 * main pass has more than a wave of CTAs: the tensor pipe then interleaves two chains, where one
 * chain a CTA leaves it idle during its own dependent steps. Not for the training call (the saved
 * states come from the output warpgroup's hand-off tile). */
static bool dual_fits(const ChunkParams &prm, const gdn_problem *p)
{
    if (prm.states_out || p->V % 128 != 0)
        return false;
    const int dev = dev_dual();
    if (dev >= 0)
        return dev > 0;
    /* Waves of one CTA per SM: DUAL's CTAs are half as many and each takes TUNE_DUAL_COST % of the
     * time of a one-chain CTA. */
    const int64_t sms = sm_count(p), tiles = wg_tiles(p);
    const int64_t one = (tiles + sms - 1) / sms, two = (tiles / 2 + sms - 1) / sms;
    return two * TUNE_DUAL_COST <= one * 100;
}

/* prep; the chain of every segment but the last from a zero state (the first from the initial
 * state) and from the identity, giving N and M; the scan; the main pass of every segment. */
template <typename T, int K, bool SERVE, bool KDA>
static gdn_status launch_cp(const ChunkParams &prm, const gdn_problem *p, cudaStream_t stream)
{
    gdn_status st = launch_prep<T, K, KDA>(prm, p, stream);
    if (st != GDN_OK)
        return st;
    if ((st = launch_wg<T, K, SERVE, KDA, true>(prm, p, prm.nseg - 1, stream)) != GDN_OK)
        return st;
    if ((st = launch_kernel(cp_scan_kernel<K>, p->N * p->HV * (p->V / SCAN_ROWS), scan_threads<K>(),
                            scan_smem_bytes<K>(), stream, prm, "cp_scan launch")) != GDN_OK)
        return st;
    return launch_wg<T, K, SERVE, KDA, false>(prm, p, prm.nseg, stream);
}

/* Few (sequence, head) pairs without CP: the main pass's CTAs (one per SM) leave most SMs idle,
 * and chunk_prep would run alone before it. launch_coop runs both in one cooperative grid of one
 * CTA per SM: the first coop_main CTAs are the main pass; each other CTA runs three chunk_prep
 * (kda_prep) units (one per warpgroup), which count the items they finish per value head and block
 * of FLAG_BLOCK slots (red.release); the main pass's copy warpgroup waits for a block's count (an
 * acquire load) before copying its records. A cooperative launch guarantees that every CTA is
 * resident at once (or fails to launch), so the waits always end, also where kernels are
 * serialized (compute-sanitizer, profilers' replay). Taken when the main pass needs at most half
 * the SMs (unless TUNE_NO_COOP); with KDA gates for fixed-length sequences only (kda_coop_first
 * needs the chunk count). */
static bool coop_fits(const gdn_problem *p, bool kda)
{
    return !TUNE_NO_COOP && p->T > 0 && (!kda || !p->cu_seqlens) && wg_tiles(p) <= sm_count(p) / 2;
}

/* The cooperative grid's shared memory: chunk_wg's, or with KDA gates three kda_prep units if
 * more (the grid holds one CTA per SM either way). */
template <int K, bool KDA> constexpr int coop_smem_bytes()
{
    constexpr int WB = WgSmem<K, false, KDA>::BYTES, UNITS = 3 * KdaPrepSmem<K>::UNIT + 1024;
    return KDA && UNITS > WB ? UNITS : WB;
}

/* Peak DRAM bandwidth per SM in MB/s (memory clock, double data rate, bus width), or 0 if the
 * device does not report it. */
static int64_t dram_mbps_per_sm(const gdn_problem *p)
{
    int khz = 0, bits = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, p->device_ordinal) != cudaSuccess ||
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, p->device_ordinal) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return (int64_t)khz * 2 * bits / 8 / 1000 / sm_count(p);
}

/* KDA: the grid's kda_prep units may fall behind the main pass, so the first X of every sequence's
 * cps chunks run before the grid, on every SM (kda_prep_kernel). Per SM of three units an item
 * takes rho main-pass chunk steps; the units then keep up when (1 - X) pairs rho <= spare, with
 * pairs = N HV (one item serves a pair's value tiles): X = 1 - spare / (pairs rho). rho from the
 * prefix sweeps (dev/prefill/README.md, "KDA's cooperative grid"): 2.83 on the H100 (25.4 GB/s per
 * SM: best 25 % at H32, none at H16 and B2 H12) and 3.54 on the H200 (36.4 GB/s per SM: best 40 %
 * at H32, none at H16 and B2 H12); the main pass gains more from bandwidth than the units do.
 * Between them by bandwidth per SM, clamped to the two outside. Returns the items of those chunks
 * (coop_item's first ones). */
static int64_t kda_coop_first(const gdn_problem *p, int64_t cps, int64_t spare)
{
    constexpr int64_t BW0 = 25400, BW1 = 36400, RHO0 = 283, RHO1 = 354; /* MB/s per SM; hundredths */
    const int64_t bw = max64(BW0, min64(BW1, dram_mbps_per_sm(p)));
    const int64_t rho = RHO0 + (RHO1 - RHO0) * (bw - BW0) / (BW1 - BW0), pairs = p->N * p->HV;
    const int64_t lag = pairs * rho - 100 * spare; /* (1 - X) = 100 spare / (pairs rho) */
    int64_t x = lag <= 0 ? 0 : (cps * lag + pairs * rho - 1) / (pairs * rho);
#ifdef GDN_CHUNK_DEV_KDA_PREFIX_ENV
    if (const char *e = getenv("GDN_DEV_KDA_PREFIX")) /* percent of the chunks (dev/prefill/kda_coop_sweep.py) */
        x = atoi(e) > 0 ? (cps * atoi(e) + 99) / 100 : 0;
#endif
    return min64(x, cps) * p->N * p->HV;
}

/* chunk_prep (kda_prep), then the main pass. GDN gates with cu_seqlens, up to ORDER_MAX_SEQS
 * sequences and more main-pass CTAs than SMs: chunk_prep also orders the sequences for the main
 * pass (order_sequence). Not with KDA gates: there the order measured no gain
 * (dev/prefill/README.md, "Varlen sequences longest first"). */
template <typename T, int K, bool SERVE, bool KDA>
static gdn_status launch_two(const ChunkParams &prm_in, const gdn_problem *p, cudaStream_t stream)
{
    ChunkParams prm = prm_in;
    /* T > 0: launch_prep launches nothing without tokens, and the main pass still runs (h0 to ht). */
    if (!KDA && p->cu_seqlens && p->T > 0 && prm.slots > 0 && p->N > 1 && p->N <= ORDER_MAX_SEQS &&
        wg_tiles(p) > sm_count(p))
        prm.order = reinterpret_cast<int *>(prm.ws + order_offset(p));
    const gdn_status st = launch_prep<T, K, KDA>(prm, p, stream);
    if (st != GDN_OK)
        return st;
    if (dual_fits(prm, p))
        return launch_wg<T, K, SERVE, KDA, false, true>(prm, p, 1, stream);
    return launch_wg<T, K, SERVE, KDA, false>(prm, p, 1, stream);
}

template <typename T, int K, bool SERVE, bool KDA>
static gdn_status launch_coop(ChunkParams prm, const gdn_problem *p, cudaStream_t stream)
{
    if (p->T <= 0 || prm.slots <= 0)
        return GDN_OK;
    gdn_status st;
    auto wg = chunk_wg_kernel<K, T, false, SERVE, KDA>;
    constexpr int WB = coop_smem_bytes<K, KDA>();
    int per_sm = 0;
    if ((st = gdn_cuda_check(cudaFuncSetAttribute(wg, cudaFuncAttributeMaxDynamicSharedMemorySize, WB),
                             "chunk_wg smem")) != GDN_OK ||
        (st = gdn_cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, wg, WgConfig<false>::THREADS, WB),
                             "chunk_wg occupancy")) != GDN_OK)
        return st;
    const int64_t main_ctas = wg_tiles(p), ctas = (int64_t)sm_count(p) * per_sm;
    if (per_sm < 1 || ctas <= main_ctas) /* no room for prep units */
        return launch_two<T, K, SERVE, KDA>(prm, p, stream);
    prm.ready = reinterpret_cast<int *>(prm.ws + (size_t)prm.slots * (size_t)p->HV * record_bytes(p));
    prm.coop_main = main_ctas;
    int flags0 = 0;
#ifdef GDN_CHUNK_DEV_COOP_PROBE
    /* Probes start at the second call (bench one shape per process). */
    static int calls = 0;
    static int probe = 0;
    probe = calls++ > 0 ? TUNE_COOP_PROBE : 0;
    flags0 = probe >= 2 ? 1 : 0;
    if ((st = gdn_cuda_check(cudaMemcpyToSymbolAsync(coop_probe, &probe, sizeof probe, 0, cudaMemcpyHostToDevice, stream),
                             "chunk probe")) != GDN_OK)
        return st;
#endif
    if ((st = gdn_cuda_check(cudaMemsetAsync(prm.ready, flags0, coop_flag_bytes(prm.slots, p->HV), stream),
                             "chunk flags")) != GDN_OK)
        return st;
    if (KDA) {
        prm.coop_first = kda_coop_first(p, prm.cps, ctas - main_ctas);
        if (prm.coop_first > 0 &&
            (st = launch_kernel(kda_prep_kernel<K, T>, prm.coop_first, 128, KdaPrepSmem<K>::BYTES, stream, prm,
                                "kda_prep launch")) != GDN_OK)
            return st;
    }
    const cudaError_t e = launch_raw(wg, ctas, WgConfig<false>::THREADS, WB, stream, prm, true);
    if (e == cudaErrorCooperativeLaunchTooLarge) {
        /* Fewer SMs than the device reports (MPS limits): the two-kernel path, flags unused (KDA's
         * first records are written again, the same). */
        (void)cudaGetLastError();
        prm.ready = NULL;
        prm.coop_first = 0;
        return launch_two<T, K, SERVE, KDA>(prm, p, stream);
    }
    return gdn_cuda_check(e, "chunk_wg cooperative launch");
}

/* chunk_prep, then the main pass; or context parallelism's four passes; or both in one grid. */
template <typename T, int K, bool SERVE, bool KDA>
static gdn_status launch_paths(const ChunkParams &prm, const gdn_problem *p, cudaStream_t stream)
{
    if (prm.seg_chunks > 0)
        return launch_cp<T, K, SERVE, KDA>(prm, p, stream);
    if (coop_fits(p, KDA) && !(dev_dual() > 0 && dual_fits(prm, p)))
        return launch_coop<T, K, SERVE, KDA>(prm, p, stream);
    return launch_two<T, K, SERVE, KDA>(prm, p, stream);
}

/* The serving instances (state pool, checkpoints) or the plain ones; GDN or KDA gates. */
template <typename T, int K>
static gdn_status launch_all(const ChunkParams &prm, const gdn_problem *p, cudaStream_t stream)
{
    const bool serve = prm.pool_idx || prm.ckpt_every > 0;
    if (p->gate_kind == GDN_GATE_KDA)
        return serve ? launch_paths<T, K, true, true>(prm, p, stream) : launch_paths<T, K, false, true>(prm, p, stream);
    return serve ? launch_paths<T, K, true, false>(prm, p, stream) : launch_paths<T, K, false, false>(prm, p, stream);
}

} /* namespace gdn_chunk */

using namespace gdn_chunk;

/* The query's size: the plain path's workspace plus, where context parallelism pays, its segment
 * maps. The call needs only the plain part (gdn_cuda_chunk_fwd_workspace_min, which never grows
 * when N, T or HV shrink) and takes the context-parallel path only when the rest is there too, so
 * a workspace sized by the query for the largest batch serves every smaller one. */
extern "C" size_t gdn_cuda_chunk_fwd_workspace_size(const gdn_problem *p)
{
    return plan_pack(p).bytes + chunk_ws_bytes(p) + cp_ws_bytes(p, plan_cp(p));
}

extern "C" size_t gdn_cuda_chunk_fwd_workspace_min(const gdn_problem *p)
{
    return plan_pack(p).bytes + chunk_ws_bytes(p);
}

/* The CUDA chunk path's limits: GDN or KDA gates, bf16 / f16 inputs, K = 64 or 128, V = 64, 128 or
 * 256, f32 or bf16 states, and one-dimensional grids (V / 64 CTAs per sequence and head in
 * chunk_wg; CP: at most an SM's worth of segments, each (V + K) / 64). */
extern "C" gdn_status gdn_cuda_chunk_fwd_check(const gdn_problem *p)
{
    if (p->q.dtype != GDN_DTYPE_BF16 && p->q.dtype != GDN_DTYPE_F16)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "q: the CUDA chunk path takes bf16 or f16 inputs");
    if (p->K != 64 && p->K != 128)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "q: head dim K = %lld (CUDA chunk path: 64 or 128)", (long long)p->K);
    if (p->V != 64 && p->V != 128 && p->V != 256)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "v: head dim V = %lld (CUDA chunk path: 64, 128 or 256)",
                             (long long)p->V);
    if (p->state_dtype != GDN_DTYPE_F32 && p->state_dtype != GDN_DTYPE_BF16)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "state: f32 or bf16 on CUDA");
    if (slots_per_head(p) * p->HV > INT32_MAX || wg_tiles(p) > INT32_MAX)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "q: %lld tokens x %lld value heads exceed the CUDA chunk path's grid",
                             (long long)p->T, (long long)p->HV);
    return GDN_OK;
}

extern "C" gdn_status gdn_cuda_chunk_fwd(const gdn_problem *p)
{
    DeviceGuard device;
    const gdn_status dst = device.enter(p->device_ordinal);
    if (dst != GDN_OK)
        return dst;
    if (p->N == 0 || p->HV == 0)
        return GDN_OK;

    ChunkParams prm = {};
    prm.T = p->T;
    prm.N = p->N;
    prm.HV = p->HV;
    prm.G = p->G;
    prm.V = p->V;
    prm.cps = (p->T + C - 1) / C;
    prm.slots = slots_per_head(p);
    prm.prep_heads = prep_heads_for(p, prm.slots);
    prm.cu = p->cu_seqlens;
    /* The kernels' view of q, k, v, o: the caller's tensor, or its contiguous copy (plan_pack). */
    const PackPlan pk = plan_pack(p);
    unsigned char *const ws = static_cast<unsigned char *>(p->workspace);
    void *io[4];
    int64_t io_s[4][4];
    for (int i = 0; i < 4; ++i) {
        if (pk.off[i] == SIZE_MAX) {
            io[i] = pk.view[i]->data;
            memcpy(io_s[i], pk.view[i]->s, sizeof io_s[i]);
        } else {
            io[i] = ws + pk.off[i];
            contiguous_strides(p->T, pk.H[i], pk.D[i], io_s[i]);
        }
    }
    prm.q = io[0];
    prm.k = io[1];
    prm.v = io[2];
    prm.o = io[3];
    prm.q_b = io_s[0][0], prm.q_t = io_s[0][1], prm.q_h = io_s[0][2];
    prm.k_b = io_s[1][0], prm.k_t = io_s[1][1], prm.k_h = io_s[1][2];
    prm.v_b = io_s[2][0], prm.v_t = io_s[2][1], prm.v_h = io_s[2][2];
    prm.o_b = io_s[3][0], prm.o_t = io_s[3][1], prm.o_h = io_s[3][2];
    prm.g = static_cast<const float *>(p->g.data);
    prm.g_b = p->g.s[0], prm.g_t = p->g.s[1], prm.g_h = p->g.s[2], prm.g_r = p->g.s[3];
    prm.a = p->a.data;
    prm.a_dtype = p->a.dtype;
    prm.a_b = p->a.s[0], prm.a_t = p->a.s[1], prm.a_h = p->a.s[2], prm.a_r = p->a.s[3];
    prm.A_log = p->A_log;
    prm.dt_bias = static_cast<const float *>(p->dt_bias.data);
    prm.dt_h = p->dt_bias.s[0];
    prm.dt_r = p->dt_bias.s[1];
    prm.lower_bound = p->lower_bound;
    prm.sp_beta = p->softplus_beta;
    prm.sp_threshold = p->softplus_threshold;
    prm.beta = p->beta.data;
    prm.beta_dtype = p->beta.dtype;
    prm.be_b = p->beta.s[0], prm.be_t = p->beta.s[1], prm.be_h = p->beta.s[2];
    prm.beta_from_logits = p->beta_from_logits;
    prm.allow_neg_eigval = p->allow_neg_eigval;
    prm.scale = (float)p->scale;
    prm.l2norm = p->use_qk_l2norm;
    prm.h0 = p->state_in.data;
    prm.state_dtype = p->state_dtype;
    /* With a pool the final states go back into it (the API refuses a final_state beside it). */
    const gdn_view &fin = p->state_indices ? p->state_in : p->final_state;
    prm.ht = fin.data;
    for (int i = 0; i < 4; ++i) {
        prm.h0_s[i] = p->state_in.s[i];
        prm.ht_s[i] = fin.s[i];
    }
    const size_t pair_bytes = p->state_dtype == GDN_DTYPE_F32 ? 8 : 4;
    prm.ht_pairs = fin.data && fin.s[2] == 1 && fin.s[0] % 2 == 0 && fin.s[1] % 2 == 0 && fin.s[3] % 2 == 0 &&
                   (uintptr_t)fin.data % pair_bytes == 0;
    prm.pool_idx = p->state_indices;
    prm.pool_idx_s = p->idx_stride_n;
    prm.pool_slots = p->num_slots;
    prm.pool_slot_min = p->null_slot_zero ? 1 : 0;
    prm.has_init = p->has_initial_state;
    prm.has_init_s = p->has_init_stride;
    prm.ckpt_every = p->checkpoint_interval;
    prm.ckpt = p->checkpoint_indices;
    prm.ckpt_n = p->ckpt_stride_n;
    prm.ckpt_j = p->ckpt_stride_j;
    prm.ckpt_cols = p->ckpt_cols;
    /* Training (saved_bytes): chunk_wg writes the states, chunk_prep the backward's records. */
    const bool save = p->gate_kind == GDN_GATE_GDN && p->saved_states;
    prm.states_out = save ? p->saved_states : nullptr;
    prm.bwd_rec = save ? static_cast<unsigned char *>(p->saved_states) + saved_rec_offset(p) : nullptr;
    prm.ws = ws + pk.bytes;
    CpPlan cp = plan_cp(p);
    if (cp.seg_chunks > 0 && p->workspace_bytes < pk.bytes + chunk_ws_bytes(p) + cp_ws_bytes(p, cp))
        cp = CpPlan{1, 0}; /* a workspace sized for the plain path: run that */
    prm.seg_chunks = cp.seg_chunks;
    prm.nseg = cp.nseg;
    if (cp.seg_chunks > 0) {
        prm.cp_pre = reinterpret_cast<float *>(prm.ws + chunk_ws_bytes(p));
        prm.cp_start = prm.cp_pre + (size_t)(p->N * p->HV * cp.nseg) * (size_t)(p->V + p->K) * (size_t)p->K;
        /* The pre pass's maps (only it loads by TMA), over the kernels' view of k and v. */
        const gdn_view kv = {io[1], p->q.dtype, {io_s[1][0], io_s[1][1], io_s[1][2], io_s[1][3]}};
        const gdn_view vv = {io[2], p->q.dtype, {io_s[2][0], io_s[2][1], io_s[2][2], io_s[2][3]}};
        prm.tma = gdn_cuda_tma_rows(&prm.tm_k, &kv, p->B, p->T, p->H, p->K) &&
                  gdn_cuda_tma_rows(&prm.tm_v, &vv, p->B, p->T, p->HV, p->V);
    }

    cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    gdn_status st;
    for (int i = 0; i < 3; ++i)
        if (pk.off[i] != SIZE_MAX &&
            (st = gdn_cuda_copy_view(pk.view[i]->data, pk.view[i]->s, io[i], io_s[i], p->B, p->T, pk.H[i], pk.D[i],
                                     stream)) != GDN_OK)
            return st;
    const bool bf16 = p->q.dtype == GDN_DTYPE_BF16;
    switch (p->K) {
    case 64: st = bf16 ? launch_all<__nv_bfloat16, 64>(prm, p, stream) : launch_all<__half, 64>(prm, p, stream); break;
    case 128: st = bf16 ? launch_all<__nv_bfloat16, 128>(prm, p, stream) : launch_all<__half, 128>(prm, p, stream); break;
    default: return gdn_set_error(GDN_ERR_UNSUPPORTED, "q: head dim K = %lld", (long long)p->K);
    }
    if (st != GDN_OK || pk.off[3] == SIZE_MAX)
        return st;
    return gdn_cuda_copy_view(io[3], io_s[3], p->o.data, p->o.s, p->B, p->T, p->HV, p->V, stream);
}
