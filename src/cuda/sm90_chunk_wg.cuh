/*
 * sm90_chunk_wg.cuh - chunk_wg, the state chain of the chunked forward on warpgroup MMA (wgmma),
 * reading the records of chunk_prep (sm90_chunk_prep.cuh), whose units it also runs in the
 * cooperative grid. One bf16 / f16 rounding of S^T, X^T and Vn^T as operands, f32 accumulation
 * and f32 state. It replaced an mma.sync kernel of 16-column slabs (chunk_main; dev/prefill/README.md).
 *
 * One CTA per (segment, sequence, value head, 64 value rows v0 .. v0 + 63), three warpgroups:
 *   warps 0-3 (chain warpgroup)  S^T (64 x K, f32) in wgmma accumulators across chunks. Per chunk:
 *                                S^T as bf16 A fragments, also stored to shared memory for the
 *                                output warpgroup; Y^T = S^T K^T (RS); X^T = V^T - ck Y^T in f32,
 *                                rounded once; Vn^T = X^T diag(beta) (f32) + X^T Tb^T (RS, Tb
 *                                strictly lower), stored for the output warpgroup;
 *                                S^T = gC S^T + (Vn^T cu) K (RS, K as MN-major B).
 *   warps 4-7 (output warpgroup) O^T = cq (S^T Q^T) + Vn^T Pm^T (SS, both A operands from the
 *                                chain's hand-off tiles), then O through a staging tile
 *                                (stmatrix.trans) with 16-byte stores of the valid rows.
 *   warps 8-11 (copy warpgroup)  Q, K, V tile and the workspace chunk (Tb, Pm, coefficients) of
 *                                chunk c + 2 with cp.async into a three-stage ring, rows past
 *                                the sequence end zero-filled. One warp alone cannot issue the
 *                                ~3250 copies of a chunk in time: the other warpgroups would
 *                                wait for it. The CP pre pass takes K and V of whole chunks by
 *                                TMA; a box of a partial chunk would read the next sequence's
 *                                rows past a varlen sequence's end instead of zeros.
 * Every tile is a 128-byte-swizzled box (sm90_primitives.cuh), so wgmma reads them through
 * descriptors. The workspace keeps only the lower-triangular 16 x 16 blocks of Tb and Pm; the
 * blocks above the diagonal are zeroed once per stage at the start and never written again, so
 * full-tile products read zeros there. The stage ring runs on mbarriers; named barriers hand
 * S^T (1) and Vn^T (2) from the chain to the output warpgroup, give them back (4, 5), and order
 * the output staging tiles (3).
 *
 * launch_coop: the same kernel in a cooperative grid; CTAs past coop_main run chunk_prep as three
 * units (a warpgroup each, 72 KB of shared memory: two Q / K buffers, so that a unit fetches its
 * next item during the current one), with KDA gates kda_prep as three units (67 KB each at K = 128:
 * the grid is then launched with more shared memory than chunk_wg<KDA> needs), and the copy
 * warpgroup waits for each block of FLAG_BLOCK slots' records before copying them.
 *
 * DUAL (the two-kernel path with more than a wave of CTAs; sm90_chunk_fwd.cu, dual_fits): 128 value
 * rows a CTA, warps 0-3 and 4-7 each a chain warpgroup of 64 rows that also forms its own outputs
 * (O^T = cq (S^T Q^T) from the S^T fragments, + Vn^T Pm^T from Vn^T's, both from registers) and
 * stores them through its own staging tile; no output warpgroup and no hand-off tiles. The two
 * chains share the stage (all but V, which is two boxes), and while one waits on its dependent
 * products the other's fill the tensor pipe. Same products, roundings and order as the one-chain
 * CTA: o and the states are bitwise equal.
 *
 * PRE (context parallelism's first pass): the chain alone over V + K virtual value rows, the real
 * ones from a zero state (the first segment from the initial state) giving N^T, K more with v = 0
 * from the identity giving M^T; its final S^T (f32) to cp_pre. No output warpgroup and no Q, a
 * two-stage ring and two copy warps: 192 threads and 86 KB at K = 128, two CTAs per SM.
 */
#ifndef GDN_SM90_CHUNK_WG_CUH
#define GDN_SM90_CHUNK_WG_CUH

#include <type_traits>

#include "sm90_chunk_prep.cuh"
#include "sm90_kda_prep.cuh"

namespace gdn_chunk {

/* Main pass: 384 threads; the copy warpgroup gives registers to the other two (168 each at
 * launch; 200 for the chain and output warpgroups, 96 for the copy warpgroup). PRE: 192. */
template <bool PRE> struct WgConfig {
    static constexpr int THREADS = PRE ? 192 : 384, COPY = PRE ? 64 : 128, STAGES = PRE ? 2 : 3;
};

/* A stage: Q (none in PRE), K, KDA's K^ (KU; GDN's update reads K), V, then the workspace chunk's
 * image (Tb, Pm, coefficients with beta; KDA: exp(Gam_C) per key, beta). KDA's stage holds one more K-wide tile,
 * so two stages fit where GDN has three. */
template <int K, bool PRE, bool KDA = false, bool DUAL = false> struct WgSmem {
    static constexpr int B = gdn_sm90::BOX_BYTES, KB = K / 64; /* KB: boxes of a Q or K tile */
    static constexpr int S = KDA ? 2 : WgConfig<PRE>::STAGES, VB = DUAL ? 2 : 1; /* VB: boxes of the V tile */
    static constexpr int Q = 0, KT = PRE ? 0 : KB * B, KU = KDA ? KT + KB * B : KT, V = KU + KB * B;
    static constexpr int TB = V + VB * B, PM = TB + B, COEF = PM + B, COEF_BYTES = KDA ? (K + C) * 4 : COEF_FLOATS * 4;
    static constexpr int STAGE = (COEF + COEF_BYTES + 1023) / 1024 * 1024;
    /* DUAL: no hand-off tiles; one output staging tile per math warpgroup. */
    static constexpr int SBUF = S * STAGE, VNBUF = SBUF + (PRE || DUAL ? 0 : KB * B), OST = VNBUF + (PRE || DUAL ? 0 : B);
    static constexpr int MAP = OST + (PRE ? 0 : 2 * B);
    static constexpr int BARS = MAP + WS_MAP_BYTES;       /* full[S], empty[S] mbarriers */
    static constexpr int BYTES = BARS + 2 * S * 8 + 1024; /* + slack to align the base to 1024 */
    static_assert(PM == TB + TILE_BYTES && COEF == TB + 2 * TILE_BYTES, "workspace image: Tb, Pm, coefficients");
};

/* SERVE: the call has a state pool or checkpoints (ChunkParams::pool_idx, ckpt_every). Those calls
 * take their own instances, so that the per-chunk checkpoint test and the zeroing of skipped
 * sequences' outputs stay out of the plain kernels' loops.
 * KDA: the records are kda_prep's (KdaRec): Q~, K~ and K^ replace Q, K and K in the products and
 * carry every decay and row factor but exp(Gam_C), by which S^T's columns (keys) decay. */
template <int K, typename T, bool PRE, bool SERVE, bool KDA = false, bool DUAL = false>
__global__ void __launch_bounds__(WgConfig<PRE>::THREADS, PRE ? 2 : 1) chunk_wg_kernel(const __grid_constant__ ChunkParams p)
{
    using namespace gdn_sm90;
    static_assert(!DUAL || !PRE, "DUAL: the main pass");
    using L = WgSmem<K, PRE, KDA, DUAL>;
    constexpr int THREADS = WgConfig<PRE>::THREADS, COPY = WgConfig<PRE>::COPY, STAGES = L::S;
    constexpr int KB = K / 64, KC = K / 8, AHEAD = STAGES - 1, BV = DUAL ? 128 : 64;
    /* setmaxnreg budgets (not PRE) of the copy warpgroup and each of the two others: their sum may not
     * exceed the launch's registers (__launch_bounds__: at most 65536 / THREADS a thread, in steps of
     * 8), or setmaxnreg.inc waits forever for registers no warpgroup gives back. */
    constexpr int REGS_COPY = DUAL ? (KDA ? 88 : 56) : 96, REGS_MATH = DUAL ? (KDA ? 208 : 224) : 200;
    static_assert(PRE || 128 * (REGS_COPY + 2 * REGS_MATH) <= 65536 / THREADS / 8 * 8 * THREADS, "setmaxnreg budget");
    constexpr int BAR_S = 1, BAR_V = 2, BAR_O = 3, BAR_SFREE = 4, BAR_VFREE = 5;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    const uint32_t sb = smem_u32(smem);
    const uint64_t dk = desc_kmajor(sb), dm = desc_mnmajor(sb); /* descriptors of the smem base */

    /* The warp index through a shuffle: the compiler then knows the role branches are warp-uniform
     * and keeps wgmma unserialized in them (without it, ptxas reported C7518 serialization in PRE,
     * whose chain has no setmaxnreg to show convergence). */
    const int tid = threadIdx.x, lane = tid & 31, warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
    if constexpr (!PRE && !KDA) {
        if constexpr (TUNE_COOP_PROBE != 0) {
            const int probe = coop_probe_now();
            if (p.ready && (probe >= 2 ? blockIdx.x >= p.coop_main : probe == 1 && blockIdx.x < p.coop_main))
                return;
        }
        if (p.ready && blockIdx.x >= p.coop_main) {
            /* launch_coop's prep role: each warpgroup is a chunk_prep unit with its own shared memory
             * and named barrier, taking work items (chunk, head group) in chunk order. */
            const int unit = warp >> 2, ut = tid & 127;
            const int64_t groups = p.HV / p.prep_heads, units = 3 * (int64_t)(gridDim.x - p.coop_main);
            const int64_t items = p.slots * groups, first = 3 * (int64_t)(blockIdx.x - p.coop_main) + unit;
            auto order = [&](int64_t i) { return coop_item(p, i, groups); };
            using PL = PrepSmem<K>;
            constexpr int BUF = PL::BYTES - PL::GATES; /* Q and K, then A and T */
            constexpr int UNIT2 = (2 * BUF + PL::GATES + 1023) / 1024 * 1024;
            if constexpr (3 * UNIT2 <= L::BYTES - 1024) {
                /* Two buffers a unit: the next item's Q / K copies and gate loads are issued before
                 * this item's work, so their latency hides behind it. */
                unsigned char *ub = smem + unit * UNIT2;
                float *gates = reinterpret_cast<float *>(ub + 2 * BUF);
                auto run = [&](auto grouped) {
                    constexpr bool G = decltype(grouped)::value;
                    PrepItem cur = {};
                    PrepGates gr;
                    if (first < items) {
                        cur = prep_locate<G>(p, order(first));
                        if (cur.cl > 0) {
                            prep_issue_qk<K, T>(p, cur, ut, reinterpret_cast<T *>(ub), reinterpret_cast<T *>(ub) + C * K);
                            prep_load_gates(p, cur, ut, gr);
                        }
                    }
                    int b = 0;
                    for (int64_t i = first; i < items; i += units, b ^= 1) {
                        /* The previous item ended on the unit's barrier: its gates are consumed. */
                        if (cur.cl > 0)
                            prep_store_gates(p, cur, ut, gr, gates + 2 * PREP_MAX_HEADS * C, gates + PREP_MAX_HEADS * C);
                        cp_async_wait<0>();
                        unit_sync(1 + unit);
                        PrepItem nxt = {};
                        if (i + units < items) {
                            nxt = prep_locate<G>(p, order(i + units));
                            if (nxt.cl > 0) {
                                T *q2 = reinterpret_cast<T *>(ub + (b ^ 1) * BUF);
                                prep_issue_qk<K, T>(p, nxt, ut, q2, q2 + C * K);
                                prep_load_gates(p, nxt, ut, gr);
                            }
                        }
                        if (cur.cl > 0)
                            prep_body<K, T, G>(p, cur.hv0, cur.slot, ut, ub + b * BUF, gates, 1 + unit);
                        else
                            prep_release(p, cur.hv0, cur.nh, cur.slot, ut);
                        cur = nxt;
                    }
                };
                if (p.prep_heads > 1)
                    run(std::true_type{});
                else
                    run(std::false_type{});
            } else {
                constexpr int UNIT = (PL::BYTES + 1023) / 1024 * 1024;
                static_assert(3 * UNIT <= L::BYTES - 1024, "three chunk_prep units in chunk_wg's shared memory");
                for (int64_t i = first; i < items; i += units) {
                    if (p.prep_heads > 1)
                        prep_chunk<K, T, true>(p, order(i), ut, smem + unit * UNIT, 1 + unit);
                    else
                        prep_chunk<K, T, false>(p, order(i), ut, smem + unit * UNIT, 1 + unit);
                }
            }
            return;
        }
    }
    if constexpr (!PRE && KDA) {
        if (p.ready && blockIdx.x >= p.coop_main) {
            /* launch_coop's prep role with KDA gates: three kda_prep units (a warpgroup each, its
             * own shared memory and named barrier) take the items from coop_first on, the
             * earlier ones having run before the grid (kda_prep_kernel). */
            constexpr int UNIT = KdaPrepSmem<K>::UNIT;
            const int unit = warp >> 2, ut = tid & 127;
            const int64_t units = 3 * (int64_t)(gridDim.x - p.coop_main), items = p.slots * p.HV;
            for (int64_t i = p.coop_first + 3 * (int64_t)(blockIdx.x - p.coop_main) + unit; i < items; i += units)
                kda_prep_chunk<K, T>(p, coop_item(p, i, p.HV), ut, smem + unit * UNIT, 1 + unit);
            return;
        }
    }
    const bool chain = warp < (DUAL ? 8 : 4);
    const int t = tid & 127, w = warp & 3, mi = lane >> 3, r8 = lane & 7;
    const int mg = DUAL && warp < 8 ? warp >> 2 : 0; /* DUAL: the math warpgroup, 64 value rows each */
    const unsigned ntiles = (unsigned)((PRE ? p.V + K : p.V) / BV), unit = blockIdx.x / ntiles;
    const unsigned pairs = (unsigned)(p.N * p.HV), pair = unit % pairs;
    const int64_t seg = unit / pairs;
    const int64_t n = !PRE && !KDA && p.order ? p.order[pair / (unsigned)p.HV] : pair / (unsigned)p.HV;
    const int64_t hv = pair % (unsigned)p.HV, h = hv / p.G;
    const int64_t vt0 = (int64_t)(blockIdx.x % ntiles) * BV, v0 = vt0 + 64 * mg; /* the tile's rows; this warpgroup's */
    const bool v_real = !PRE || v0 < p.V; /* PRE: rows v0 >= V are M's, with v = 0 */
    if (PRE && seg == 0 && !v_real)
        return; /* the first segment starts from the known state: no M */
    SeqInfo sq = sequence(p, n);
    const int64_t seq_len = sq.len, hrow = SERVE ? state_row(p, n) : n; /* hrow < 0: skipped, o zeroed */
    int64_t nchunks = (sq.len + C - 1) / C, cbeg = 0;
    nchunks = min64(nchunks, max64(0, p.slots - sq.slot0));
    if (p.seg_chunks > 0) {
        cbeg = min64(nchunks, seg * p.seg_chunks);
        nchunks = min64(nchunks - cbeg, p.seg_chunks);
        sq.bos += cbeg * C;
        sq.len = min64(sq.len - cbeg * C, p.seg_chunks * C);
        sq.slot0 += cbeg;
    }

    /* The blocks of Tb and Pm above the diagonal: zero in every stage, for good; so is the V tile
     * of M's rows, which is never loaded. */
    for (int u = tid; u < STAGES * 2 * TILE_BYTES / 16; u += THREADS) {
        const int st = u / (2 * TILE_BYTES / 16), off = u % (2 * TILE_BYTES / 16);
        *reinterpret_cast<uint4 *>(smem + st * L::STAGE + L::TB + 16 * off) = make_uint4(0, 0, 0, 0);
    }
    if (!v_real)
        for (int u = tid; u < STAGES * L::B / 16; u += THREADS)
            *reinterpret_cast<uint4 *>(smem + u / (L::B / 16) * L::STAGE + L::V + 16 * (u % (L::B / 16))) = make_uint4(0, 0, 0, 0);
    /* Shared-memory offset (from Tb) of each 16-byte copy of the workspace chunk: Tb and Pm rows of
     * 2 (b + 1) chunks in block row b (tri_chunk), then the coefficients. */
    constexpr int MAP_COPIES = KDA ? KdaRec<K>::COPIES : WS_COPIES;
    uint16_t *ws_map = reinterpret_cast<uint16_t *>(smem + L::MAP);
    for (int u = tid; u < MAP_COPIES; u += THREADS) {
        int off;
        if (u < 2 * TRI_BYTES / 16) {
            const int tile = u >= TRI_BYTES / 16, ti = u - tile * (TRI_BYTES / 16);
            const int b = ti < 32 ? 0 : (ti < 96 ? 1 : (ti < 192 ? 2 : 3)), wi = ti - 16 * b * (b + 1);
            off = tile * TILE_BYTES + 2 * swz<8>(16 * b + wi / (2 * (b + 1)), wi % (2 * (b + 1)) * 8);
        } else {
            off = 2 * TILE_BYTES + 16 * (u - 2 * TRI_BYTES / 16);
        }
        ws_map[u] = (uint16_t)off;
    }
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + L::BARS), *empty = full + STAGES;
    if (tid == 0) {
        for (int i = 0; i < STAGES; ++i) {
            mbar_init(&full[i], COPY);            /* the copy threads, their copies landed */
            mbar_init(&empty[i], PRE ? 128 : 256); /* the chain (and output) warpgroups, done with the stage */
        }
        mbar_fence_init();
    }
    fence_proxy_async();
    __syncthreads();

    /* Copy threads: pt copies 16-byte chunk qk_ch of rows qk_r0 + QK_RP it of Q and K, chunk v_ch
     * of rows v_r0 + V_RP it of the V tile, and copies pt + COPY it of the workspace chunk. */
    constexpr int VCH = 8 * L::VB, QK_RP = COPY / KC, V_RP = COPY / VCH; /* VCH: 16-byte chunks of a V row */
    const int pt = tid % COPY;
    auto load_chunk = [&](int64_t c, int stage) {
        const T *q = static_cast<const T *>(p.q), *k = static_cast<const T *>(p.k), *v = static_cast<const T *>(p.v);
        const int qk_ch = pt % KC, qk_r0 = pt / KC, v_ch = pt % VCH, v_r0 = pt / VCH;
        const int64_t t0 = sq.bos + c * C;
        unsigned char *base = smem + stage * L::STAGE;
        const int cl = (int)min64(C, sq.len - c * C);
        const int64_t q_step = QK_RP * p.q_t, k_step = QK_RP * p.k_t, v_step = V_RP * p.v_t;
        const T *qp = q + sq.row * p.q_b + h * p.q_h + qk_ch * 8 + (t0 + qk_r0) * p.q_t;
        const T *kp = k + sq.row * p.k_b + h * p.k_h + qk_ch * 8 + (t0 + qk_r0) * p.k_t;
        const T *vp = v + sq.row * p.v_b + hv * p.v_h + vt0 + v_ch * 8 + (t0 + v_r0) * p.v_t;
        /* The CP pre pass takes K and V of whole chunks by TMA, one thread, their bytes expected on
         * the stage's barrier (the copy threads' arrivals still wait for the record's cp.async
         * copies). Partial chunks keep cp.async with zero fill, since a box would read the next
         * sequence's rows; the main pass keeps it too, where TMA measured no better
         * (dev/prefill/README.md). */
        const bool whole = !KDA && PRE && p.tma && cl == C;
        if (whole && pt == 0) {
            mbar_expect_bytes(&full[stage], (uint32_t)(KB * L::B) + (v_real ? (uint32_t)L::B : 0u));
#pragma unroll
            for (int b = 0; b < KB; ++b)
                tma_load_4d(base + L::KT + b * L::B, &p.tm_k, 64 * b, (int)h, (int)t0, (int)sq.row, &full[stage]);
            if (v_real)
                tma_load_4d(base + L::V, &p.tm_v, (int)v0, (int)hv, (int)t0, (int)sq.row, &full[stage]);
        }
        if (!KDA && !whole) { /* KDA: Q~, K~ and K^ come with the record */
#pragma unroll
            for (int it = 0; it < C / QK_RP; ++it) {
                const int r = qk_r0 + QK_RP * it;
                const bool ok = r < cl;
                const uint32_t off = (uint32_t)(qk_ch >> 3) * L::B + box_offset(r, (qk_ch & 7) * 8);
                if constexpr (!PRE) /* no outputs, no Q */
                    cp_async16(base + L::Q + off, ok ? qp : q, ok ? 16 : 0);
                cp_async16(base + L::KT + off, ok ? kp : k, ok ? 16 : 0);
                qp += q_step;
                kp += k_step;
            }
        }
        if (v_real && !whole)
#pragma unroll
            for (int it = 0; it < C / V_RP; ++it) {
                const int r = v_r0 + V_RP * it;
                const bool ok = r < cl;
                cp_async16(base + L::V + (v_ch >> 3) * L::B + box_offset(r, (v_ch & 7) * 8), ok ? vp : v, ok ? 16 : 0);
                vp += v_step;
            }
        const size_t rec_bytes = KDA ? (size_t)KdaRec<K>::BYTES : (size_t)WS_CHUNK;
        const unsigned char *rec = p.ws + hv_slot(hv, p.slots, sq.slot0 + c) * rec_bytes;
        const unsigned char *wsc = rec + 16 * pt;
        unsigned char *dst = base + L::TB;
#pragma unroll
        for (int u = pt; u < MAP_COPIES; u += COPY) {
            cp_async16(dst + ws_map[u], wsc, 16);
            wsc += 16 * COPY;
        }
        if constexpr (KDA) {
            /* The images, as they are: Q~ K~ K^ onto Q KT KU (PRE: K~ K^ onto KT KU). */
            constexpr int FROM = KdaRec<K>::IMG + (PRE ? KdaRec<K>::TILE : 0), N16 = (PRE ? 2 : 3) * KdaRec<K>::TILE / 16;
            static_assert(L::KU == L::KT + KdaRec<K>::TILE && (PRE || L::KT == L::Q + KdaRec<K>::TILE), "image order");
#pragma unroll
            for (int u = pt; u < N16; u += COPY)
                cp_async16(base + (PRE ? L::KT : L::Q) + 16 * u, rec + FROM + 16 * u, 16);
        }
    };

    /* launch_coop: chunk_prep runs in this grid's other CTAs; wait until chunk c's records are
     * written (before its load_chunk). Called before the wait for the stage to free up, so that
     * the load's round trip to L2 overlaps that wait. */
    int64_t ready_block = -1; /* the last block of slots seen complete */
    auto wait_records = [&](int64_t c) {
        if (PRE || !p.ready)
            return;
        if constexpr (TUNE_COOP_PROBE != 0)
            if (coop_probe_now() == 3)
                return;
        const int64_t blk = (sq.slot0 + c) / FLAG_BLOCK;
        if (blk == ready_block)
            return;
        /* Every slot of the block has one item per head, also those without a chunk. */
        const int64_t nblk = flag_blocks(p.slots);
        const int *flag = p.ready + hv * nblk + blk;
        const int want = (int)min64(FLAG_BLOCK, p.slots - blk * FLAG_BLOCK);
        for (;;) {
            int done;
            asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(done) : "l"(flag) : "memory");
            if (done >= want)
                break;
            __nanosleep(64);
        }
        ready_block = blk;
    };

    /* Roles. Each loops over the chunks on its own; the branches never merge, so the register
     * budget of each holds for its whole code. The stage ring runs on mbarriers (full: loaded;
     * empty: both consumers done), so the chain may start chunk c + 1 while the output
     * warpgroup still finishes chunk c; the hand-off tiles are single, so the output warpgroup
     * gives each back (named barriers 4, 5) before the chain overwrites it. */
    const int c_end = (int)nchunks;
    if (warp >= (THREADS - COPY) / 32) {
        if constexpr (!PRE)
            regs_dec<REGS_COPY>();
#pragma unroll
        for (int i = 0; i < AHEAD; ++i) {
            if (i < c_end) {
                wait_records(i);
                load_chunk(i, i);
            }
            cp_async_commit();
        }
        int stage = 0;
#pragma unroll 1
        for (int c = 0; c < c_end; ++c, stage = stage == STAGES - 1 ? 0 : stage + 1) {
            cp_async_wait<AHEAD - 1>();
            fence_proxy_async();
            mbar_arrive(&full[stage]);
            if (c + AHEAD < c_end) {
                /* The stage of chunk c + AHEAD last held chunk c - 1 (its (c - 1) / STAGES-th use). */
                const int prev = stage == 0 ? STAGES - 1 : stage - 1;
                wait_records(c + AHEAD);
                if (c >= 1)
                    mbar_wait(&empty[prev], (uint32_t)((c - 1) / STAGES) & 1u);
                load_chunk(c + AHEAD, prev);
            }
            cp_async_commit();
        }
        cp_async_wait<0>();
        return;
    }
    if constexpr (!PRE)
        regs_inc<REGS_MATH>();

    /* O of chunk c, this warpgroup's 64 value rows: transposed into the staging tile ost ([token][v]),
     * then the valid rows out, the tile ordered by the warpgroup's named barrier bar. Double-buffered
     * (the output warpgroup: tiles by chunk parity), a thread writes a tile only after every thread
     * of the warpgroup has passed the last barrier, so after it finished reading that tile two chunks
     * ago; a single tile (DUAL) takes a second barrier before the writes. */
    auto store_o = [&](int c, const auto &oa, int ost, int bar, int single) {
        if (single && c > 0)
            bar_sync(bar, 128);
#pragma unroll
        for (int jt = 0; jt < 4; ++jt) {
            uint32_t ov[4];
            pack_frag<T>(oa, jt, ov);
            stsm_x4_t(sb + ost + box_offset(16 * jt + (mi >> 1) * 8 + r8, 16 * w + (mi & 1) * 8), ov);
        }
        bar_sync(bar, 128);
        const int cl = (int)min64(C, sq.len - (int64_t)c * C);
        T *op_ = static_cast<T *>(p.o) + sq.row * p.o_b + (sq.bos + (int64_t)c * C) * p.o_t + hv * p.o_h + v0 + 8 * (t & 7);
#pragma unroll
        for (int it = 0; it < 4; ++it) {
            const int r = (t >> 3) + 16 * it;
            if (r < cl)
                *reinterpret_cast<uint4 *>(op_ + r * p.o_t) =
                    !SERVE || hrow >= 0 ? *reinterpret_cast<const uint4 *>(smem + ost + box_offset(r, 8 * (t & 7)))
                                        : make_uint4(0, 0, 0, 0);
        }
    };

    if (chain) {
        /* s[b][i] = S^T[v0 + acc_row(t, i)][64 b + acc_col(t, i)]. */
        float s[KB][32];
        /* This CTA's rows of S into row `row` of ht (the final state, or a pool slot). With keys
         * contiguous and pairs aligned (ChunkParams::ht_pairs) each register pair, two adjacent
         * keys, is one store: a warp's f32 store then writes 32 contiguous bytes of each of its 8
         * rows, where single elements write every other 4 bytes of twice as many spans (bf16:
         * 16 bytes a row, against every other 2). The thread index is read in volatile asm, so
         * that the compiler cannot hoist the offsets out of the chunk loop, where they would hold
         * registers across the chain. Each offset is the thread's first element (x0) plus the
         * 8-row step for register pairs i with (i >> 1) & 1 = 1, plus multiples of the key stride
         * (immediates on the pair path, where that stride is 1). */
        auto store_s = [&](int64_t row) {
            int tt;
            asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tt));
            tt &= 127;
            const int64_t x0 = (v0 + acc_row(tt, 0)) * p.ht_s[3] + acc_col(tt, 0) * p.ht_s[2] + row * p.ht_s[0] + hv * p.ht_s[1];
            const int64_t rstep = 8 * p.ht_s[3], k1 = p.ht_s[2], k8 = 8 * k1, k64 = 64 * k1;
            auto off = [&](int b, int i) { return ((i >> 1) & 1 ? rstep : 0) + b * k64 + (i >> 2) * k8 + (i & 1) * k1; };
            /* With pairs the key stride is 1: the key offsets are immediates. */
            auto pair_off = [&](int b, int i) { return ((i >> 1) & 1 ? rstep : 0) + 64 * b + 8 * (i >> 2); };
            auto put = [&](auto *h) {
                using E = std::remove_pointer_t<decltype(h)>;
                if (p.ht_pairs) {
#pragma unroll
                    for (int b = 0; b < KB; ++b)
#pragma unroll
                        for (int i = 0; i < 32; i += 2)
                            *reinterpret_cast<typename GdnPair<E>::type *>(h + pair_off(b, i)) =
                                GdnPair<E>::make(s[b][i], s[b][i + 1]);
                } else {
#pragma unroll
                    for (int b = 0; b < KB; ++b)
#pragma unroll
                        for (int i = 0; i < 32; ++i)
                            h[off(b, i)] = gdn_from_f32<E>(s[b][i]);
                }
            };
            if (p.state_dtype == GDN_DTYPE_BF16)
                put(static_cast<__nv_bfloat16 *>(p.ht) + x0);
            else
                put(static_cast<float *>(p.ht) + x0);
        };
#pragma unroll
        for (int b = 0; b < KB; ++b)
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                const int64_t vv = v0 + acc_row(t, i), d = 64 * b + acc_col(t, i);
                float x = 0.f;
                if (PRE && !v_real)
                    x = vv - p.V == d ? 1.f : 0.f;
                else if (!PRE && p.seg_chunks > 0)
                    x = p.cp_start[(((int64_t)pair * p.nseg + seg) * p.V + vv) * K + d];
                else if (seg == 0 && (SERVE ? hrow >= 0 && reads_h0(p, n) : p.h0 != nullptr))
                    x = load_state(p, p.h0, hrow * p.h0_s[0] + hv * p.h0_s[1] + d * p.h0_s[2] + vv * p.h0_s[3]);
                s[b][i] = x;
            }
        /* Checkpoints: every ck_every chunks of the sequence; ck_left counts down to the next one
         * (32-bit counters, so that the chain loop keeps its registers). A short last chunk ends
         * none. */
        const int ck_every = SERVE && !PRE && p.ckpt_every > 0 && hrow >= 0 ? (int)(p.ckpt_every / C) : 0;
        int ck_left = ck_every > 0 ? ck_every - (int)(cbeg % ck_every) : -1;
        const int ck_end = seq_len % C == 0 || cbeg + c_end < (seq_len + C - 1) / C ? c_end : c_end - 1;
        int stage = 0;
        uint32_t phase = 0;
#pragma unroll 1
        for (int c = 0; c < c_end; ++c) {
            mbar_wait(&full[stage], phase);
            const uint32_t so = stage * L::STAGE, st = sb + so;
            const uint64_t dks = desc_add(dk, so), dms = desc_add(dm, so);
            const float *ck = reinterpret_cast<const float *>(smem + so + L::COEF), *cu = ck + 2 * C;
            const float *gck = ck; /* KDA: exp(Gam_C) [K] */
            const float *bc = KDA ? ck + K : ck + COEF_BETA; /* beta [C] */
            /* The products are asynchronous: the work that does not feed the next one (hand-offs to
             * the output warpgroup, fragment loads, the decay of S^T) runs while it computes. A
             * register that an issued wgmma reads or writes is touched only after its wait. */

            /* Y^T = S^T K^T (M = 64 value rows, N = 64 tokens, k = d), S^T as A fragments, also
             * into the hand-off tile. All fragments first, then the products: packing box 1
             * between box 0's products gains nothing, and in PRE it makes ptxas inject a wgmma
             * wait (C7517). */
            uint32_t sa[K / 16][4];
            float y[32];
            if (!PRE && !DUAL && c > 0)
                bar_sync(BAR_SFREE, 256); /* the output warpgroup's S^T Q^T of chunk c - 1 is done */
#pragma unroll
            for (int j = 0; j < K / 16; ++j) {
                const int b = j >> 2;
                pack_frag<T>(s[b], j & 3, sa[j]);
                if constexpr (!PRE && !DUAL)
                    stsm_x4(sb + L::SBUF + b * L::B + box_offset(16 * w + (mi & 1) * 8 + r8, 16 * (j & 3) + (mi >> 1) * 8), sa[j]);
            }
            fence();
#pragma unroll
            for (int j = 0; j < K / 16; ++j)
                mma_rs<T, 0>(y, sa[j], desc_add(dks, L::KT + kmajor_step(j)), j > 0);
            commit();
            /* DUAL: this warpgroup's own outputs, O^T = cq (S^T Q^T) + Vn^T Pm^T, from the same
             * fragments; the other math warpgroup's products fill the tensor pipe meanwhile. */
            float oa[DUAL ? 32 : 1];
            if constexpr (DUAL) {
#pragma unroll
                for (int j = 0; j < K / 16; ++j)
                    mma_rs<T, 0>(oa, sa[j], desc_add(dks, L::Q + kmajor_step(j)), j > 0);
                commit();
            } else if constexpr (!PRE) {
                fence_proxy_async();
                bar_arrive(BAR_S, 256);
            }

            /* Meanwhile: V^T fragments and ck. */
            uint32_t vt[4][4];
            float2 c0[4], c1[4];
#pragma unroll
            for (int jt = 0; jt < 4; ++jt) {
                ldsm_x4_t(vt[jt], st + L::V + mg * L::B + box_offset(16 * jt + (mi >> 1) * 8 + r8, 16 * w + (mi & 1) * 8));
                if constexpr (KDA)
                    c0[jt] = c1[jt] = make_float2(1.f, 1.f);
                else if constexpr (!PRE)
                    col_pairs(ck, jt, t, c0[jt], c1[jt]);
            }
            wait<DUAL ? 1 : 0>();
            acc_fence(y);

            /* X^T = V^T - ck Y^T in f32, rounded once into A fragments (k = tokens); Vn^T starts
             * as X^T diag(beta) from the f32 values (the record's Tb has no diagonal). */
            uint32_t xa[4][4];
            float (&vn)[32] = y; /* each y is read once, then holds its Vn^T start */
#pragma unroll
            for (int jt = 0; jt < 4; ++jt) {
                const float2 v00 = Mma16<T>::unpack(vt[jt][0]), v10 = Mma16<T>::unpack(vt[jt][1]);
                const float2 v01 = Mma16<T>::unpack(vt[jt][2]), v11 = Mma16<T>::unpack(vt[jt][3]);
                const float *yj = y + 8 * jt;
                if constexpr (PRE && !KDA)
                    col_pairs(ck, jt, t, c0[jt], c1[jt]); /* here, not under Y^T: fewer live registers */
                const float x[8] = {v00.x - c0[jt].x * yj[0], v00.y - c0[jt].y * yj[1], v10.x - c0[jt].x * yj[2],
                                    v10.y - c0[jt].y * yj[3], v01.x - c1[jt].x * yj[4], v01.y - c1[jt].y * yj[5],
                                    v11.x - c1[jt].x * yj[6], v11.y - c1[jt].y * yj[7]};
                float2 b0, b1;
                col_pairs(bc, jt, t, b0, b1);
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    xa[jt][e] = Mma16<T>::pack(x[2 * e], x[2 * e + 1]);
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    vn[8 * jt + e] = x[e] * (e < 4 ? (e & 1 ? b0.y : b0.x) : (e & 1 ? b1.y : b1.x));
            }

            /* Vn^T += X^T Tb^T (Tb stored [i][j]: K-major B). */
            fence();
#pragma unroll
            for (int j = 0; j < 4; ++j)
                mma_rs<T, 0>(vn, xa[j], desc_add(dks, L::TB + kmajor_step(j)), 1);
            commit();

            /* Meanwhile: S^T decays by gC, and cu. */
            if constexpr (KDA) {
                /* Column d (key) of S^T decays by exp(Gam_C)[d]: adjacent accumulator pairs. */
#pragma unroll
                for (int b = 0; b < KB; ++b)
#pragma unroll
                    for (int i = 0; i < 32; i += 2) {
                        const float2 gd = *reinterpret_cast<const float2 *>(gck + 64 * b + acc_col(t, i));
                        s[b][i] *= gd.x;
                        s[b][i + 1] *= gd.y;
                    }
            } else {
                scale_acc(s, cu[C]);
            }
            float2 u0[4], u1[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if constexpr (KDA)
                    u0[j] = u1[j] = make_float2(1.f, 1.f);
                else
                    col_pairs(cu, j, t, u0[j], u1[j]);
            }
            wait<0>();
            acc_fence(vn);
            if constexpr (DUAL && !KDA) { /* KDA: Q~ carries the scale, norm and decay */
                acc_fence(oa);
                const float *cq = ck + C;
#pragma unroll
                for (int i = 0; i < 32; i += 2) {
                    const float2 cf = *reinterpret_cast<const float2 *>(cq + acc_col(t, i));
                    oa[i] *= cf.x;
                    oa[i + 1] *= cf.y;
                }
            }

            /* S^T += (Vn^T cu) K: per box of 64 d, N = 64 d, k = tokens (K as MN-major B). */
            uint32_t ua[4][4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                ua[j][0] = Mma16<T>::pack(vn[8 * j + 0] * u0[j].x, vn[8 * j + 1] * u0[j].y);
                ua[j][1] = Mma16<T>::pack(vn[8 * j + 2] * u0[j].x, vn[8 * j + 3] * u0[j].y);
                ua[j][2] = Mma16<T>::pack(vn[8 * j + 4] * u1[j].x, vn[8 * j + 5] * u1[j].y);
                ua[j][3] = Mma16<T>::pack(vn[8 * j + 6] * u1[j].x, vn[8 * j + 7] * u1[j].y);
            }
            fence();
            mma_rs_boxes<T, KB>(s, ua, desc_add(dms, L::KU));
            commit();

            /* Meanwhile: Vn^T to the output warpgroup (DUAL: O^T += Vn^T Pm^T here). */
            if constexpr (DUAL) {
                uint32_t va[4][4];
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    pack_frag<T>(vn, j, va[j]);
                fence();
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    mma_rs<T, 0>(oa, va[j], desc_add(dks, L::PM + kmajor_step(j)), 1);
                commit();
            } else if constexpr (!PRE) {
                if (c > 0)
                    bar_sync(BAR_VFREE, 256); /* its Vn^T Pm^T of chunk c - 1 is done */
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    uint32_t va[4];
                    pack_frag<T>(vn, j, va);
                    stsm_x4(sb + L::VNBUF + box_offset(16 * w + (mi & 1) * 8 + r8, 16 * j + (mi >> 1) * 8), va);
                }
                fence_proxy_async();
                bar_arrive(BAR_V, 256);
            }
            wait<0>();
#pragma unroll
            for (int b = 0; b < KB; ++b)
                acc_fence(s[b]);
            if constexpr (DUAL)
                acc_fence(oa);
            mbar_arrive(&empty[stage]);
            if constexpr (!PRE && SERVE) {
                /* Prefix-cache checkpoint: S after this chunk, when it ends a multiple of the interval. */
                if (--ck_left == 0) {
                    ck_left = ck_every;
                    const int64_t slot = c < ck_end ? ckpt_slot(p, n, (cbeg + c + 1) * C) : -1;
                    if (slot >= 0)
                        store_s(slot);
                }
            }
            if constexpr (DUAL) /* named barriers 1 + mg: BAR_S and BAR_V, which DUAL leaves unused */
                store_o(c, oa, L::OST + mg * L::B, 1 + mg, 1);
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1u;
            }
        }
        if constexpr (PRE) {
            /* The segment's map, two adjacent d per register pair. */
            const int64_t pcs = (int64_t)pair * p.nseg + seg;
#pragma unroll
            for (int b = 0; b < KB; ++b)
#pragma unroll
                for (int i = 0; i < 32; i += 2) {
                    const int64_t vv = v0 + acc_row(t, i), d = 64 * b + acc_col(t, i);
                    *reinterpret_cast<float2 *>(p.cp_pre + (pcs * (p.V + K) + vv) * K + d) = make_float2(s[b][i], s[b][i + 1]);
                }
        } else if (p.ht && (!SERVE || hrow >= 0) && (p.seg_chunks == 0 || seg == p.nseg - 1)) {
            store_s(hrow);
        }
        return;
    }

    if constexpr (!PRE && !DUAL) {
        /* Output warpgroup. */
        int stage = 0;
        uint32_t phase = 0;
#pragma unroll 1
        for (int c = 0; c < c_end; ++c) {
            mbar_wait(&full[stage], phase);
            const uint32_t so = stage * L::STAGE, ost = L::OST + (c & 1) * L::B;
            const uint64_t dks = desc_add(dk, so);
            const float *cq = reinterpret_cast<const float *>(smem + so + L::COEF) + C;
            /* Output warpgroup: O^T = cq (S^T Q^T) + Vn^T Pm^T. */
            float oa[32];
            bar_sync(BAR_S, 256);
            fence();
#pragma unroll
            for (int j = 0; j < K / 16; ++j)
                mma_ss<T, 0>(oa, desc_add(dk, L::SBUF + kmajor_step(j)), desc_add(dks, L::Q + kmajor_step(j)), j > 0);
            commit();
            if constexpr (!KDA) {
                /* Training: S^T entering this chunk (this CTA's 64 value rows) out for the backward,
                 * read from the hand-off tile beside the product (both only read it). */
                if (p.states_out) {
                    T *so = static_cast<T *>(p.states_out) + (hv_slot(hv, p.slots, sq.slot0 + c) * p.V + v0) * K;
#pragma unroll
                    for (int u = t; u < BV * KC; u += 128) {
                        const int r = u / KC, ch = u % KC;
                        *reinterpret_cast<uint4 *>(so + r * K + 8 * ch) = *reinterpret_cast<const uint4 *>(
                            smem + L::SBUF + (ch >> 3) * L::B + box_offset(r, (ch & 7) * 8));
                    }
                }
            }
            wait<0>();
            acc_fence(oa);
            if (c + 1 < c_end)
                bar_arrive(BAR_SFREE, 256);
            if constexpr (!KDA) { /* KDA: Q~ carries the scale, norm and decay */
#pragma unroll
                for (int i = 0; i < 32; i += 2) {
                    const float2 cf = *reinterpret_cast<const float2 *>(cq + acc_col(t, i));
                    oa[i] *= cf.x;
                    oa[i + 1] *= cf.y;
                }
            }
            bar_sync(BAR_V, 256);
            fence();
#pragma unroll
            for (int j = 0; j < 4; ++j)
                mma_ss<T, 0>(oa, desc_add(dk, L::VNBUF + kmajor_step(j)), desc_add(dks, L::PM + kmajor_step(j)), 1);
            commit();
            wait<0>();
            acc_fence(oa);
            if (c + 1 < c_end)
                bar_arrive(BAR_VFREE, 256);
            mbar_arrive(&empty[stage]); /* Q, Pm and cq read */
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1u;
            }

            store_o(c, oa, ost, BAR_O, 0);
        }
    }
}

} /* namespace gdn_chunk */

#endif /* GDN_SM90_CHUNK_WG_CUH */
