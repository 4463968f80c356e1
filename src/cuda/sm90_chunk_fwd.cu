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
 *               workspace: Tb = T diag(beta) and Pm (bf16 / f16, 64 x 64 each, lower
 *               triangular: only the 16 x 16 blocks on and below the diagonal are kept) and f32
 *               row factors.
 *   chunk_wg    (sm90_chunk_wg.cuh) one CTA per (sequence, value head, 64 value rows): the state
 *               chain on warpgroup MMA, S^T (64 x K, f32) in accumulators across chunks, with an
 *               output warpgroup and a copy warpgroup beside it. Per chunk (M = value rows):
 *                 Y^T  = S^T K^T          X^T = V^T - ck * Y^T   (f32, one rounding)
 *                 Vn^T = X^T Tb^T         O^T = cq * (S^T Q^T) + Vn^T Pm^T
 *                 S^T  = gC * S^T + (Vn^T * cu) K
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
#include <cstring>

#include "cuda_common.cuh"
#include "cuda_pack.cuh"
#include "sm90_chunk_mma.cuh"
#include "sm90_wgmma.cuh"

namespace gdn_chunk {

constexpr int C = 64;                                    /* chunk length */
constexpr int TILE_BYTES = C * C * 2;                    /* one 64 x 64 bf16 / f16 tile in shared memory */
constexpr int TRI_BYTES = 16 * (2 + 4 + 6 + 8) * 16;     /* its 16 x 16 blocks on and below the diagonal */
constexpr int COEF_FLOATS = 3 * C + 4;                   /* ck, cq, cu [64] each, gC, padding */
constexpr int WS_CHUNK = 2 * TRI_BYTES + COEF_FLOATS * 4;  /* workspace: Tb, Pm, coefficients: 11024 B */
static_assert(WS_CHUNK % 16 == 0 && (COEF_FLOATS * 4) % 16 == 0, "workspace: whole 16-byte copies");
constexpr int WS_COPIES = WS_CHUNK / 16;                   /* 689 */
constexpr int WS_MAP_BYTES = (WS_COPIES * 2 + 15) / 16 * 16; /* shared-memory offset of each copy */

/* Tb and Pm are lower triangular: the workspace keeps only their 16 x 16 blocks on and below the
 * diagonal (chunk_wg zeroes the others once in shared memory): row i holds its first 2 (i / 16 + 1) 16-byte chunks
 * (logical, unswizzled order), rows packed one after another. Index of chunk ch of row i. */
__device__ __forceinline__ int tri_chunk(int i, int ch)
{
    const int b = i >> 4;
    return 16 * b * (b + 1) + (i & 15) * 2 * (b + 1) + ch;
}

struct params {
    int64_t T, N, HV, G, V;
    int64_t cps;               /* chunks per sequence without cu_seqlens */
    int64_t slots;             /* workspace chunk slots per value head */
    int64_t prep_heads;        /* value heads per chunk_prep CTA (divides G; prep_heads_for) */
    int *ready;                /* [HV][flag_blocks(slots)] records written, or NULL (launch_coop) */
    int64_t coop_main;         /* launch_coop: CTAs of the main pass; the rest run chunk_prep */
#ifdef GDN_CHUNK_DEV_COOP_PROBE
    int probe; /* dev builds, launch_coop after the first call: 1 prep units alone, 2 the main pass alone,
                  3 as 2 without the flag polls */
#endif
    const int32_t *cu;         /* [N + 1] or NULL */
    const void *q, *k, *v;     /* [B, T, H, K] / [B, T, HV, V] */
    void *o;
    int64_t q_b, q_t, q_h, k_b, k_t, k_h, v_b, v_t, v_h, o_b, o_t, o_h;
    const float *g;            /* [B, T, HV] or NULL */
    int64_t g_b, g_t, g_h;
    const void *a;             /* raw gate [B, T, HV] or NULL */
    gdn_dtype a_dtype;
    int64_t a_b, a_t, a_h;
    const float *A_log;        /* [HV] */
    const float *dt_bias;      /* may be NULL */
    int64_t dt_h;
    float sp_beta, sp_threshold;
    const void *beta;          /* [B, T, HV] */
    gdn_dtype beta_dtype;
    int64_t be_b, be_t, be_h;
    int beta_from_logits, allow_neg_eigval;
    float scale;
    int l2norm;
    const void *h0;            /* may be NULL */
    void *ht;                  /* may be NULL */
    gdn_dtype state_dtype;
    int64_t h0_s[4], ht_s[4];  /* {seq, hv, k, v} */
    unsigned char *ws;
    /* Context parallelism (fixed-length sequences only): each sequence is split into nseg
     * segments of seg_chunks chunks; seg_chunks = 0: off. cp_pre holds, per (sequence, value
     * head, segment), the segment's affine map as the final S^T of the chain over V + K virtual
     * value columns: rows 0 .. V - 1 are N^T (real v, zero start), rows V .. V + K - 1 are M^T
     * (v = 0, identity start), f32, row pitch K. cp_start holds the state entering each segment
     * (S^T, V x K, f32), written by the scan. */
    int64_t seg_chunks, nseg;
    float *cp_pre, *cp_start;
};

__device__ __forceinline__ float load_any(const void *p, gdn_dtype dt, int64_t i)
{
    switch (dt) {
    case GDN_DTYPE_BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    case GDN_DTYPE_F16: return __half2float(static_cast<const __half *>(p)[i]);
    default: return static_cast<const float *>(p)[i];
    }
}

/* 2^x in one MUFU.EX2 (relative error ~2^-22); x <= 0 here, so no overflow. */
__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Sequence n: batch row, first token, length, first workspace slot. */
struct seq_info {
    int64_t row, bos, len, slot0;
};

__host__ __device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ __forceinline__ int64_t clamp_t(const params &p, int32_t x)
{
    return x < 0 ? 0 : (x > p.T ? p.T : (int64_t)x);
}

__device__ __forceinline__ seq_info sequence(const params &p, int64_t n)
{
    seq_info s;
    if (p.cu) {
        const int64_t a = clamp_t(p, p.cu[n]), b = clamp_t(p, p.cu[n + 1]);
        s.row = 0;
        s.bos = a;
        s.len = b > a ? b - a : 0;
        s.slot0 = a / C + n;
    } else {
        s.row = n;
        s.bos = 0;
        s.len = p.T;
        s.slot0 = n * p.cps;
    }
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* chunk_prep                                                                                  */

/* Most value heads one chunk_prep CTA handles: warp w < heads runs the cumsum of head w, and the
 * gates of every head stay in shared memory (3 x 256 B per head). */
constexpr int PREP_MAX_HEADS = 4;
static_assert(PREP_MAX_HEADS <= 4, "chunk_prep: one cumsum warp per head, 4 warps");

template <int K> struct prep_smem {
    static constexpr int QK = C * K * 2;         /* Q and K tiles, bytes each */
    /* f32 matrix row pitch: 68 = 4 mod 32 banks, so the tf32 A fragments (rows g, columns t) of
     * the inverse read 32 different banks; rows stay 16-byte aligned for the float4 row reads. */
    static constexpr int LD = C + 4;
    static constexpr int MAT = C * LD * 4;       /* A and T (f32), aliasing Q and K once consumed */
    static constexpr int GATES = (3 * PREP_MAX_HEADS + 2) * C * 4; /* gam, beta, raw g per head; rk, rq */
    static constexpr int BYTES = (2 * QK > 2 * MAT ? 2 * QK : 2 * MAT) + GATES;
};

/* K K^T is the same for every value head of a group, and only its blocks on and below the diagonal
 * are used, as are only those of A and T: so the raw K K^T of warp w's blocks (w, b), b <= w, waits
 * in the 12 blocks above the diagonals of A and T, which nothing else reads or writes: block (w, b)
 * with b < w in A's block (b, w), the diagonal ones in T's (0, 1), (1, 2), (2, 3), (0, 2). */
template <int LD> __device__ __forceinline__ float *kk_home(float *As, float *Ts, int w, int b)
{
    return b < w ? As + 16 * b * LD + 16 * w : Ts + (w < 3 ? 16 * w * LD + 16 * (w + 1) : 16 * 2);
}

/* The triangular inverse's block products run on tensor cores in 3xTF32: x ~ hi + lo, a b ~ a_hi b_hi
 * + a_hi b_lo + a_lo b_hi with f32 accumulation. hi is x truncated to tf32 (its low 13 mantissa
 * bits cleared: |x - hi| < 2^-10 |x|), lo is x - hi (exact in f32) truncated the same way, so
 * |x - hi - lo| < 2^-20 |x|: f32-class accuracy, far below the bf16 / f16 rounding of the Tb it
 * feeds. Three instructions a split; cvt.rna.tf32 (no native form on sm_90) took about eight.
 * m16n8k8 fragments (g = lane / 4, t = lane % 4): A a0 = (g, t), a1 = (g + 8, t), a2 = (g, t + 4),
 * a3 = (g + 8, t + 4); B b0 = (t, g), b1 = (t + 4, g); C as m16n8k16. */
struct tf32_pair {
    uint32_t hi, lo;
};
__device__ __forceinline__ tf32_pair split_tf32(float x)
{
    tf32_pair r;
    r.hi = __float_as_uint(x) & 0xffffe000u;
    r.lo = __float_as_uint(x - __uint_as_float(r.hi)) & 0xffffe000u;
    return r;
}
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The three partial products of 3xTF32 in separate accumulators (three independent mma chains
 * instead of one); sum() adds them in a fixed order. */
struct acc3 {
    float hh[4], hl[4], lh[4];
    __device__ __forceinline__ float sum(int e) const { return (lh[e] + hl[e]) + hh[e]; }
};

/* c += X Y: X a 16 x 16 block, Y a 16 x 8 block, both f32 in shared memory with row pitch LD. */
template <int LD>
__device__ __forceinline__ void mma_16x8_f32(acc3 &c, const float *X, const float *Y, int g, int t)
{
#pragma unroll
    for (int ks = 0; ks < 16; ks += 8) {
        const tf32_pair a0 = split_tf32(X[g * LD + ks + t]), a1 = split_tf32(X[(g + 8) * LD + ks + t]);
        const tf32_pair a2 = split_tf32(X[g * LD + ks + t + 4]), a3 = split_tf32(X[(g + 8) * LD + ks + t + 4]);
        const tf32_pair b0 = split_tf32(Y[(ks + t) * LD + g]), b1 = split_tf32(Y[(ks + t + 4) * LD + g]);
        const uint32_t ah[4] = {a0.hi, a1.hi, a2.hi, a3.hi}, al[4] = {a0.lo, a1.lo, a2.lo, a3.lo};
        mma_tf32(c.lh, al, b0.hi, b1.hi);
        mma_tf32(c.hl, ah, b0.lo, b1.lo);
        mma_tf32(c.hh, ah, b0.hi, b1.hi);
    }
}

template <int LD>
__device__ __forceinline__ void store_16x8(float *dst, const acc3 &c, float sign, int g, int t)
{
    *reinterpret_cast<float2 *>(dst + g * LD + 2 * t) = make_float2(sign * c.sum(0), sign * c.sum(1));
    *reinterpret_cast<float2 *>(dst + (g + 8) * LD + 2 * t) = make_float2(sign * c.sum(2), sign * c.sum(3));
}

/* Columns n0 .. n0 + 7 of the blocks (i0, j) .. (i0 + NI - 1, j) of T = (I + A)^-1 (one warp),
 * as the lower-left corner of the inverse of the 2 x 2 block split at i0:
 *   T[i0.., j] = -T[i0.., i0..] A[i0.., j .. i0 - 1] T[j .. i0 - 1, j],
 * from blocks that are already final: the diagonal blocks and those of the same column above i0,
 * and T[i0.., i0..] (for NI = 2, T[i0 + 1, i0] too). The middle product passes through the target
 * blocks themselves (this warp's columns only) to become the B operand of the last one. */
template <int LD, int NI>
__device__ __forceinline__ void inverse_blocks(const float *As, float *Ts, int i0, int j, int n0, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    acc3 s[NI] = {}, r[NI] = {};
#pragma unroll
    for (int ii = 0; ii < NI; ++ii)
        for (int kb = j; kb < i0; ++kb)
            mma_16x8_f32<LD>(s[ii], As + 16 * (i0 + ii) * LD + 16 * kb, Ts + 16 * kb * LD + 16 * j + n0, g, t);
#pragma unroll
    for (int ii = 0; ii < NI; ++ii)
        store_16x8<LD>(Ts + 16 * (i0 + ii) * LD + 16 * j + n0, s[ii], 1.f, g, t);
    __syncwarp();
#pragma unroll
    for (int ii = 0; ii < NI; ++ii)
#pragma unroll
        for (int m = 0; m <= ii; ++m)
            mma_16x8_f32<LD>(r[ii], Ts + 16 * (i0 + ii) * LD + 16 * (i0 + m), Ts + 16 * (i0 + m) * LD + 16 * j + n0, g, t);
    __syncwarp();
#pragma unroll
    for (int ii = 0; ii < NI; ++ii)
        store_16x8<LD>(Ts + 16 * (i0 + ii) * LD + 16 * j + n0, r[ii], -1.f, g, t);
}

/* The masks of one head from the K K^T / Q K^T fragments in registers, warp w's rows 16 w + g and
 * + 8, column blocks 0 .. w: Pm (to the workspace, pm_out) and, WITH_A, the rows of A (to As).
 * Gam is scaled to log2 so each decay is one ex2. gh / bh: the head's Gam and beta. */
constexpr float LOG2E = 1.4426950408889634f;

/* This thread's two rows 16 warp + g + {0, 8}: the log decay in log2 units and, WITH_B, the
 * row factor beta * k-norm of A. */
template <bool WITH_B>
__device__ __forceinline__ void row_factors(const float *gh, const float *bh, const float *rk, int warp, int g,
                                            float (&gr)[2], float (&br)[2])
{
#pragma unroll
    for (int hrow = 0; hrow < 2; ++hrow) {
        const int i = 16 * warp + g + 8 * hrow;
        gr[hrow] = gh[i] * LOG2E;
        br[hrow] = WITH_B ? bh[i] * rk[i] : 0.f;
    }
}

template <bool WITH_A, int LD, typename T>
__device__ __forceinline__ void mask_rows(const float (&kk)[8][4], const float (&qk)[8][4], const float *gh,
                                          const float *bh, const float *rk, const float (&rqr)[2], float *As,
                                          uint32_t *pm_out, int pm_row8, int warp, int g, int t)
{
    float gr[2], br[2];
    row_factors<WITH_A>(gh, bh, rk, warp, g, gr, br);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        if (nt >= 2 * (warp + 1)) /* past block row warp's diagonal block: never read */
            break;
        const float2 gcol = make_float2(gh[8 * nt + 2 * t] * LOG2E, gh[8 * nt + 2 * t + 1] * LOG2E);
        const float2 kcol = *reinterpret_cast<const float2 *>(rk + 8 * nt + 2 * t);
#pragma unroll
        for (int hrow = 0; hrow < 2; ++hrow) {
            const int i = 16 * warp + g + 8 * hrow;
            float av[2], pv[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = 8 * nt + 2 * t + e;
                /* Only i >= j: 2^x of a non-positive number. */
                const float dec = i >= j ? fast_exp2(gr[hrow] - (e ? gcol.y : gcol.x)) * (e ? kcol.y : kcol.x) : 0.f;
                av[e] = i > j ? br[hrow] * dec * kk[nt][2 * hrow + e] : 0.f;
                pv[e] = rqr[hrow] * dec * qk[nt][2 * hrow + e];
            }
            if (WITH_A)
                *reinterpret_cast<float2 *>(As + i * LD + 8 * nt + 2 * t) = make_float2(av[0], av[1]);
            pm_out[hrow * pm_row8 + 4 * nt] = op<T>::pack(pv[0], pv[1]);
        }
    }
}

/* The workspace record of (value head hv, chunk slot). */
__device__ __forceinline__ unsigned char *ws_head(const params &p, int64_t hv, int64_t slot)
{
    return p.ws + ((size_t)hv * p.slots + (size_t)slot) * WS_CHUNK;
}

/* CTAs per SM the registers of chunk_prep are fitted to: 5 (96 registers, no spills; 6 would
 * spill ~350 bytes) measured up to 3.5 % faster in all than 4 on an H100 where prep is a large
 * share (0.924 vs 0.957 ms at T = 65536, H = 2, HV = 8), within +-1 % elsewhere (measured before
 * the tensor-core inverse; 5 x 35.3 KB of shared memory still fit). Dev builds may try others. */
constexpr float G_FLOOR = -40.f; /* log decays below it are raised to it (chunk_prep) */

#ifdef GDN_CHUNK_DEV_PREP_CTAS
constexpr int PREP_CTAS = GDN_CHUNK_DEV_PREP_CTAS;
#else
constexpr int PREP_CTAS = 5;
#endif

/* Named barriers (ids 1 ..; 0 is __syncthreads). */
__device__ __forceinline__ void bar_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* chunk_prep's barrier: the CTA's (bar 0), or named barrier bar of 128 threads when four warps of
 * a larger CTA run it as a unit (chunk_wg's prep role). */
__device__ __forceinline__ void unit_sync(int bar)
{
    if (bar == 0)
        __syncthreads();
    else
        bar_sync(bar, 128);
}

/* GROUPED = false: one head per CTA, nh = 1 at compile time (no head loops). The grouped kernel
 * run with nh = 1 measured 2-5 % slower end to end than the one-head kernel before it at the
 * shapes without GVA (H100, dev/prefill/README.md). */
/* A chunk_prep work item: the chunk in slot `slot` of value heads hv0 .. hv0 + nh - 1 (nh divides
 * G: heads of one key head), cl of its tokens real (0: no chunk in this slot). */
struct prep_item {
    seq_info sq;
    int64_t slot, t0, h;
    int hv0, nh, cl;
};

/* Item `item` of the chunk_prep grid: groups of nh value heads fastest, the groups that share a key
 * head together, so all but the first find its Q / K rows in L2. */
template <bool GROUPED> __device__ __forceinline__ prep_item prep_locate(const params &p, int64_t item)
{
    prep_item it;
    it.nh = GROUPED ? (int)p.prep_heads : 1;
    const unsigned groups = (unsigned)(p.HV / it.nh);
    it.slot = item / groups;
    it.hv0 = (int)(item % groups) * it.nh;
    int64_t n, c;
    if (!p.cu) {
        n = it.slot / p.cps;
        c = it.slot % p.cps;
    } else {
        /* Largest n with floor(cu[n] / 64) + n <= slot. */
        int64_t lo = 0, hi = p.N - 1;
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            if (clamp_t(p, p.cu[mid]) / C + mid <= it.slot)
                lo = mid;
            else
                hi = mid - 1;
        }
        n = lo;
        c = it.slot - (clamp_t(p, p.cu[n]) / C + n);
    }
    it.sq = sequence(p, n);
    /* No chunk: padding, or a cu_seqlens that decreases. */
    it.cl = c < 0 || c * C >= it.sq.len ? 0 : (int)min64(C, it.sq.len - c * C);
    it.t0 = it.sq.bos + c * C;
    it.h = it.hv0 / p.G;
    return it;
}

/* launch_coop counts the items done per value head and block of FLAG_BLOCK slots: the main pass
 * polls once per block instead of once per chunk (a poll's round trip to L2 sits on its copy
 * threads' path: polling every chunk cost it 14 % at B1_T32768_H16_HV32, H100), at the price of
 * waiting for a whole block of records. */
#ifdef GDN_CHUNK_DEV_FLAG_BLOCK
constexpr int FLAG_BLOCK = GDN_CHUNK_DEV_FLAG_BLOCK;
#else
constexpr int FLAG_BLOCK = 4;
#endif
__host__ __device__ __forceinline__ int64_t flag_blocks(int64_t slots) { return (slots + FLAG_BLOCK - 1) / FLAG_BLOCK; }

/* launch_coop: the item's records are written (or it has none): one more for its block. */
__device__ __forceinline__ void prep_release(const params &p, int hv0, int nh, int64_t slot, int tid)
{
    if (p.ready && tid < nh)
        asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p.ready + (hv0 + tid) * flag_blocks(p.slots) + slot / FLAG_BLOCK),
                     "r"(1)
                     : "memory");
}

/* Q and K of the item into Qs / Ks (one cp.async group): thread tid copies 16-byte column chunk
 * ch of rows r0, r0 + RP, ... */
template <int K, typename T>
__device__ __forceinline__ void prep_issue_qk(const params &p, const prep_item &it, int tid, T *Qs, T *Ks)
{
    constexpr int KC = K / 8, RP = 128 / KC;
    const T *q = static_cast<const T *>(p.q), *k = static_cast<const T *>(p.k);
    const int ch = tid % KC, r0 = tid / KC;
    const T *qp = q + it.sq.row * p.q_b + it.h * p.q_h + ch * 8 + (it.t0 + r0) * p.q_t;
    const T *kp = k + it.sq.row * p.k_b + it.h * p.k_h + ch * 8 + (it.t0 + r0) * p.k_t;
    const int64_t q_step = RP * p.q_t, k_step = RP * p.k_t;
#pragma unroll
    for (int i = 0; i < C / RP; ++i) {
        const int r = r0 + RP * i;
        const bool ok = r < it.cl;
        cp_async16(Qs + swz<KC>(r, ch * 8), ok ? qp : q, ok ? 16 : 0);
        cp_async16(Ks + swz<KC>(r, ch * 8), ok ? kp : k, ok ? 16 : 0);
        qp += q_step;
        kp += k_step;
    }
    cp_async_commit();
}

/* The raw gate inputs of a thread's tokens (index tid + 128 j over [head][token]): g or a, and
 * beta, loaded apart from their use so that a unit can fetch the next item's during this one. */
constexpr int PREP_GATES_PER_THREAD = PREP_MAX_HEADS * C / 128;
struct prep_gates {
    float g[PREP_GATES_PER_THREAD], b[PREP_GATES_PER_THREAD];
};

__device__ __forceinline__ void prep_load_gates(const params &p, const prep_item &it, int tid, prep_gates &r)
{
#pragma unroll
    for (int j = 0; j < PREP_GATES_PER_THREAD; ++j) {
        const int idx = tid + 128 * j, tok = idx & (C - 1);
        r.g[j] = r.b[j] = 0.f;
        if (idx < it.nh * C && tok < it.cl) {
            const int64_t hv = it.hv0 + idx / C, t = it.t0 + tok;
            r.g[j] = p.g ? p.g[it.sq.row * p.g_b + t * p.g_t + hv * p.g_h]
                         : load_any(p.a, p.a_dtype, it.sq.row * p.a_b + t * p.a_t + hv * p.a_h);
            r.b[j] = load_any(p.beta, p.beta_dtype, it.sq.row * p.be_b + t * p.be_t + hv * p.be_h);
        }
    }
}

/* The gates of every head of the item: token r of head hh at [hh * C + r]; padding tokens get no
 * decay and no write (g = beta = 0). */
__device__ __forceinline__ void prep_store_gates(const params &p, const prep_item &it, int tid, const prep_gates &r,
                                                 float *graw, float *bet)
{
#pragma unroll
    for (int j = 0; j < PREP_GATES_PER_THREAD; ++j) {
        const int idx = tid + 128 * j;
        if (idx >= it.nh * C)
            break;
        float gv = 0.f, bv = 0.f;
        if ((idx & (C - 1)) < it.cl) {
            const int64_t hv = it.hv0 + idx / C;
            gv = r.g[j];
            if (!p.g) {
                const float x = gv + (p.dt_bias ? p.dt_bias[hv * p.dt_h] : 0.f);
                const float bx = p.sp_beta * x;
                const float sp = bx > p.sp_threshold ? x : log1pf(expf(bx)) / p.sp_beta;
                gv = -expf(p.A_log[hv]) * sp;
            }
            /* A floor on the log decay: exp(-40) ~ 4e-18 resets any f32 state as g = -inf does, and
             * it keeps gam_i - gam_j finite (-inf - -inf would be NaN) and exact enough in f32.
             * NaN stays NaN. */
            if (gv < G_FLOOR)
                gv = G_FLOOR;
            bv = r.b[j];
            if (p.beta_from_logits) {
                bv = 1.f / (1.f + expf(-bv));
                if (p.allow_neg_eigval)
                    bv *= 2.f;
            }
        }
        graw[idx] = gv;
        bet[idx] = bv;
    }
}

/* The rest of an item once its Q, K (in buf) and gates (in gates) are in shared memory and the
 * unit has synchronized: norms, decays, masks, the inverse, the records. buf holds Q and K, then
 * A and T in their place; gates holds prep_smem's GATES part. */
template <int K, typename T, bool GROUPED>
__device__ __forceinline__ void prep_body(const params &p, int hv0, int64_t slot, int tid, unsigned char *buf,
                                          float *gates, int bar)
{
    constexpr int KC = K / 8;
    constexpr int LD = prep_smem<K>::LD;
    T *Qs = reinterpret_cast<T *>(buf);
    T *Ks = Qs + C * K;
    float *As = reinterpret_cast<float *>(buf);
    float *Ts = As + C * LD;
    float *gam = gates; /* [head][C], as bet, graw */
    float *bet = gam + PREP_MAX_HEADS * C;
    float *graw = bet + PREP_MAX_HEADS * C;
    float *rk = graw + PREP_MAX_HEADS * C;
    float *rq = rk + C;
    const int lane = tid & 31, warp = tid >> 5;
    const int nh = GROUPED ? (int)p.prep_heads : 1; /* the item's nh, read from the parameters */

    /* Inclusive cumsum of the log decays: warp w for head w, two tokens per lane. */
    if (warp < nh) {
        const float g0 = graw[warp * C + 2 * lane], g1 = graw[warp * C + 2 * lane + 1];
        float s = g0 + g1;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const float u = __shfl_up_sync(0xffffffffu, s, off);
            if (lane >= off)
                s += u;
        }
        float ex = __shfl_up_sync(0xffffffffu, s, 1);
        if (lane == 0)
            ex = 0.f;
        gam[warp * C + 2 * lane] = ex + g0;
        gam[warp * C + 2 * lane + 1] = s;
    }

    /* K K^T and Q K^T: warp w computes rows 16w .. 16w + 15, only the column blocks on and below
     * the diagonal (nothing above it is read: A is strictly lower triangular, Pm lower); and the
     * diagonal block of Q Q^T, for the squared norms of the Q rows (those of K are on K K^T's
     * diagonal). */
    const int m = lane >> 3, r8 = lane & 7, g = lane >> 2, t = lane & 3;
    float kk[8][4], qk[8][4], qq[2][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            kk[i][e] = qk[i][e] = 0.f;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            qq[i][e] = 0.f;
#pragma unroll
    for (int kc = 0; kc < K / 16; ++kc) {
        uint32_t ak[4], aq[4], bq[4];
        ldsm_x4(ak, smem_u32(Ks + swz<KC>(16 * warp + (m & 1) * 8 + r8, 16 * kc + (m >> 1) * 8)));
        ldsm_x4(aq, smem_u32(Qs + swz<KC>(16 * warp + (m & 1) * 8 + r8, 16 * kc + (m >> 1) * 8)));
        ldsm_x4(bq, smem_u32(Qs + swz<KC>(16 * warp + (m >> 1) * 8 + r8, 16 * kc + (m & 1) * 8)));
        op<T>::mma(qq[0], aq, bq[0], bq[1]);
        op<T>::mma(qq[1], aq, bq[2], bq[3]);
#pragma unroll
        for (int nn = 0; nn < 4; ++nn) {
            if (nn > warp)
                break;
            uint32_t b[4];
            ldsm_x4(b, smem_u32(Ks + swz<KC>(16 * nn + (m >> 1) * 8 + r8, 16 * kc + (m & 1) * 8)));
            op<T>::mma(kk[2 * nn], ak, b[0], b[1]);
            op<T>::mma(kk[2 * nn + 1], ak, b[2], b[3]);
            op<T>::mma(qk[2 * nn], aq, b[0], b[1]);
            op<T>::mma(qk[2 * nn + 1], aq, b[2], b[3]);
        }
    }

    /* Row factors of the L2 norm from the diagonals: element (16 w + g, 16 w + g) of a diagonal
     * block is in column tile 0 at column g, held by the thread with t = g / 2 as c[g & 1]; row
     * 16 w + g + 8 in column tile 1, as c[2 + (g & 1)]. (Zero padding rows get 1 / sqrt(1e-6):
     * they multiply zeros.) */
    if (t == (g >> 1)) {
        float sk[2] = {0.f, 0.f};
#pragma unroll
        for (int nn = 0; nn < 4; ++nn)
            if (nn == warp) {
                sk[0] = (g & 1) ? kk[2 * nn][1] : kk[2 * nn][0];
                sk[1] = (g & 1) ? kk[2 * nn + 1][3] : kk[2 * nn + 1][2];
            }
        const float sq0 = (g & 1) ? qq[0][1] : qq[0][0], sq1 = (g & 1) ? qq[1][3] : qq[1][2];
        rk[16 * warp + g] = p.l2norm ? 1.f / sqrtf(sk[0] + 1e-6f) : 1.f;
        rk[16 * warp + g + 8] = p.l2norm ? 1.f / sqrtf(sk[1] + 1e-6f) : 1.f;
        rq[16 * warp + g] = p.l2norm ? 1.f / sqrtf(sq0 + 1e-6f) : 1.f;
        rq[16 * warp + g + 8] = p.l2norm ? 1.f / sqrtf(sq1 + 1e-6f) : 1.f;
    }
    unit_sync(bar); /* Q and K consumed: A and T (and the parked K K^T) take their place */

    /* Row factors of Q into registers first: the stores into As below may alias them as far as
     * the compiler knows. */
    const int pm_row8 = 8 * (warp + 1) * 8; /* in uint32_t: 8 rows x 2 (warp + 1) chunks x 4 */
    float rqr[2];
#pragma unroll
    for (int hrow = 0; hrow < 2; ++hrow)
        rqr[hrow] = p.scale * rq[16 * warp + g + 8 * hrow];
    if (nh > 1) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            if (nt >= 2 * (warp + 1))
                break;
            float *home = kk_home<LD>(As, Ts, warp, nt >> 1) + 8 * (nt & 1) + 2 * t;
#pragma unroll
            for (int hrow = 0; hrow < 2; ++hrow)
                *reinterpret_cast<float2 *>(home + (g + 8 * hrow) * LD) = make_float2(kk[nt][2 * hrow], kk[nt][2 * hrow + 1]);
        }
    }
    /* Pm of every head of the group while Q K^T is in registers, and A of the first head (K K^T
     * from registers, as with one head per CTA; the first call is the last use of kk). */
    {
        uint32_t *pm_out = reinterpret_cast<uint32_t *>(
            reinterpret_cast<T *>(ws_head(p, hv0, slot) + TRI_BYTES) + tri_chunk(16 * warp + g, 0) * 8 + 2 * t);
        mask_rows<true, LD, T>(kk, qk, gam, bet, rk, rqr, As, pm_out, pm_row8, warp, g, t);
    }
    for (int hh = 1; hh < nh; ++hh) {
        uint32_t *pm_out = reinterpret_cast<uint32_t *>(
            reinterpret_cast<T *>(ws_head(p, hv0 + hh, slot) + TRI_BYTES) + tri_chunk(16 * warp + g, 0) * 8 + 2 * t);
        mask_rows<false, LD, T>(kk, qk, gam + hh * C, bet + hh * C, rk, rqr, As, pm_out, pm_row8, warp, g, t);
    }

    /* Per value head: A (from the parked K K^T, but for the first head), T = (I + A)^-1, Tb,
     * coefficients. */
    for (int hh = 0; hh < nh; ++hh) {
        const float *gh = gam + hh * C, *bh = bet + hh * C;
        unsigned char *wsc = ws_head(p, hv0 + hh, slot);
        if (hh > 0) {
            unit_sync(bar); /* the previous head's Tb reads of T are done */
            float gr[2], br[2];
            row_factors<true>(gh, bh, rk, warp, g, gr, br);
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                if (nt >= 2 * (warp + 1))
                    break;
                const float2 gcol = make_float2(gh[8 * nt + 2 * t] * LOG2E, gh[8 * nt + 2 * t + 1] * LOG2E);
                const float2 kcol = *reinterpret_cast<const float2 *>(rk + 8 * nt + 2 * t);
                const float *home = kk_home<LD>(As, Ts, warp, nt >> 1) + 8 * (nt & 1) + 2 * t;
#pragma unroll
                for (int hrow = 0; hrow < 2; ++hrow) {
                    const int i = 16 * warp + g + 8 * hrow;
                    const float2 kv = *reinterpret_cast<const float2 *>(home + (g + 8 * hrow) * LD);
                    float av[2];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int j = 8 * nt + 2 * t + e;
                        /* The same expressions as in mask_rows: the same values. */
                        const float dec = i >= j ? fast_exp2(gr[hrow] - (e ? gcol.y : gcol.x)) * (e ? kcol.y : kcol.x) : 0.f;
                        av[e] = i > j ? br[hrow] * dec * (e ? kv.y : kv.x) : 0.f;
                    }
                    *reinterpret_cast<float2 *>(As + i * LD + 8 * nt + 2 * t) = make_float2(av[0], av[1]);
                }
            }
        }
        __syncwarp(); /* warp w wrote rows 16 w .. 16 w + 15 of A, all its diagonal block needs */

        /* T = (I + A)^-1, unit lower triangular, by 16 x 16 blocks. The four diagonal blocks at
         * once, warp w block w, by forward substitution: lane cc < 16 solves column cc in
         * registers, each row of A read as float4 (a broadcast). Then, with 3xTF32 tensor-core
         * products (inverse_blocks), the blocks (1, 0), (2, 1), (3, 2), and last (2, 0) with
         * (3, 0), and (3, 1): three barriers in all. */
        if (lane < 16) {
            const int r0 = 16 * warp, cc = lane;
            float x[16];
#pragma unroll
            for (int i2 = 0; i2 < 16; ++i2) {
                const float *arow = As + (r0 + i2) * LD + r0;
                float a[16];
#pragma unroll
                for (int q4 = 0; q4 < (i2 + 3) / 4; ++q4) {
                    const float4 v = *reinterpret_cast<const float4 *>(arow + 4 * q4);
                    a[4 * q4] = v.x;
                    a[4 * q4 + 1] = v.y;
                    a[4 * q4 + 2] = v.z;
                    a[4 * q4 + 3] = v.w;
                }
                float s = i2 == cc ? 1.f : 0.f;
#pragma unroll
                for (int ii = 0; ii < i2; ++ii)
                    s -= a[ii] * x[ii];
                x[i2] = s;
            }
#pragma unroll
            for (int ii = 0; ii < 16; ++ii)
                Ts[(r0 + ii) * LD + r0 + cc] = x[ii];
        }
        unit_sync(bar);
        /* (1, 0), (2, 1), (3, 2): six tasks of 8 columns over the four warps. */
        for (int task = warp; task < 6; task += 4)
            inverse_blocks<LD, 1>(As, Ts, (task >> 1) + 1, task >> 1, 8 * (task & 1), lane);
        unit_sync(bar);
        if (warp < 2)
            inverse_blocks<LD, 2>(As, Ts, 2, 0, 8 * warp, lane);
        else
            inverse_blocks<LD, 1>(As, Ts, 3, 1, 8 * (warp & 1), lane);
        unit_sync(bar);

        /* Tb = T diag(beta): the chunks of the blocks on and below the diagonal (tri_chunk). A
         * warp takes one chunk column of 32 rows: with the pitch of 68 floats its float4 reads
         * of T hit every bank once per 8 rows, and beta is a broadcast. */
        T *tb_out = reinterpret_cast<T *>(wsc);
        for (int idx = tid; idx < C * 8; idx += 128) {
            const int i = idx & (C - 1), ch = idx / C, j = ch * 8;
            if ((ch >> 1) > (i >> 4))
                continue;
            const float4 t0 = *reinterpret_cast<const float4 *>(Ts + i * LD + j);
            const float4 t1 = *reinterpret_cast<const float4 *>(Ts + i * LD + j + 4);
            const float4 b0 = *reinterpret_cast<const float4 *>(bh + j);
            const float4 b1 = *reinterpret_cast<const float4 *>(bh + j + 4);
            const float x[8] = {t0.x * b0.x, t0.y * b0.y, t0.z * b0.z, t0.w * b0.w,
                                t1.x * b1.x, t1.y * b1.y, t1.z * b1.z, t1.w * b1.w};
            uint32_t w[4];
#pragma unroll
            for (int e = 0; e < 4; ++e)
                w[e] = op<T>::pack(j + 2 * e <= i ? x[2 * e] : 0.f, j + 2 * e + 1 <= i ? x[2 * e + 1] : 0.f);
            *reinterpret_cast<uint4 *>(tb_out + tri_chunk(i, ch) * 8) = make_uint4(w[0], w[1], w[2], w[3]);
        }
        float *coef = reinterpret_cast<float *>(wsc + 2 * TRI_BYTES);
        if (tid < C) {
            const float gi = gh[tid], gc = gh[C - 1];
            coef[tid] = rk[tid] * expf(gi);                     /* ck: rows of K in Y = K S */
            coef[C + tid] = p.scale * rq[tid] * expf(gi);       /* cq: rows of Q in Q S */
            coef[2 * C + tid] = rk[tid] * expf(gc - gi);        /* cu: rows of Vnew in the update */
            if (tid < 4)
                coef[3 * C + tid] = tid == 0 ? expf(gc) : 0.f; /* gC */
        }
    }
    if (p.ready) {
        /* chunk_wg runs beside (launch_coop): publish the chunk's records of the group's heads.
         * The barrier also tells the unit that this item's shared memory is free. */
        __threadfence();
        unit_sync(bar);
        prep_release(p, hv0, nh, slot, tid);
    }
}

/* One item, start to end, in one prep_smem region. */
template <int K, typename T, bool GROUPED>
__device__ __forceinline__ void prep_chunk(const params &p, int64_t item, int tid, unsigned char *smem, int bar)
{
    using L = prep_smem<K>;
    const prep_item it = prep_locate<GROUPED>(p, item);
    if (it.cl == 0) {
        /* With launch_coop a main-pass CTA may still wait on this slot when cu_seqlens is
         * malformed: release it, records untouched, so that such input gives wrong output as on
         * the two-kernel path, never a hang. */
        prep_release(p, it.hv0, it.nh, it.slot, tid);
        return;
    }
    T *Qs = reinterpret_cast<T *>(smem);
    float *gates = reinterpret_cast<float *>(smem + L::BYTES - L::GATES);
    prep_issue_qk<K, T>(p, it, tid, Qs, Qs + C * K);
    prep_gates g;
    prep_load_gates(p, it, tid, g);
    prep_store_gates(p, it, tid, g, gates + 2 * PREP_MAX_HEADS * C, gates + PREP_MAX_HEADS * C);
    cp_async_wait<0>();
    unit_sync(bar);
    prep_body<K, T, GROUPED>(p, it.hv0, it.slot, tid, smem, gates, bar);
}

template <int K, typename T, bool GROUPED>
__global__ void __launch_bounds__(128, PREP_CTAS) chunk_prep_kernel(const params p)
{
    extern __shared__ __align__(128) unsigned char smem[];
    prep_chunk<K, T, GROUPED>(p, blockIdx.x, threadIdx.x, smem, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* chunk_wg (sm90_chunk_wg.cuh)                                                                */

__device__ __forceinline__ float load_state(const params &p, const void *base, int64_t i)
{
    return p.state_dtype == GDN_DTYPE_BF16 ? __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[i])
                                           : static_cast<const float *>(base)[i];
}

#include "sm90_chunk_wg.cuh"

/* ------------------------------------------------------------------------------------------ */
/* cp_scan: the states entering each segment, S_j+1 = M_j S_j + N_j, in f32 (as S^T:            */
/* S^T_j+1 = S^T_j M_j^T + N_j^T). One CTA per (sequence, value head, SCAN_ROWS value rows of   */
/* S^T), the segments in order; M_j^T is staged in shared memory (the next one is already       */
/* loading into registers while this one is applied), S^T stays there between segments. Each   */
/* thread owns 4 adjacent d of one row: a float4 of M^T per step of the sum, no bank conflicts. */
/* At B1_T8192_H2_HV8 it takes 32 us (ncu, H100, base clocks). Every CTA of a pair reads all of */
/* each M_j, but more rows a CTA (fewer reads) measured slower: 16 rows 1.12x, 32 rows 1.41x of */
/* the call's time with 8 (the FMAs of a step gather on fewer SMs).                              */

#ifdef GDN_CHUNK_DEV_SCAN_ROWS
constexpr int SCAN_ROWS = GDN_CHUNK_DEV_SCAN_ROWS;
#else
constexpr int SCAN_ROWS = 8;
#endif
static_assert(SCAN_ROWS * 128 / 4 <= 1024 && 64 % SCAN_ROWS == 0, "cp_scan: 1024 threads at K = 128, V = 64 tiles");

template <int K> constexpr int scan_threads() { return SCAN_ROWS * K / 4; }
template <int K> constexpr int scan_smem_bytes() { return (K * K + SCAN_ROWS * K) * 4; }

template <int K>
__global__ void __launch_bounds__(scan_threads<K>()) cp_scan_kernel(const params p)
{
    constexpr int D4 = K / 4, THREADS = scan_threads<K>(), ML = K * K / 4 / THREADS;
    extern __shared__ __align__(128) unsigned char smem[];
    float4 *Ms = reinterpret_cast<float4 *>(smem);   /* M_j^T, K x K */
    float *Ss = reinterpret_cast<float *>(Ms + K * D4); /* S^T rows c0 .. c0 + 7, 8 x K */

    const unsigned tiles = (unsigned)(p.V / SCAN_ROWS), pair = blockIdx.x / tiles;
    const int64_t n = pair / (unsigned)p.HV, hv = pair % (unsigned)p.HV;
    const int64_t c0 = (int64_t)(blockIdx.x % tiles) * SCAN_ROWS;
    const int tid = threadIdx.x, d4 = tid % D4, row = tid / D4;
    float *start = p.cp_start + (size_t)pair * p.nseg * p.V * K;
    const float *pre = p.cp_pre + (size_t)pair * p.nseg * (p.V + K) * K;

    float4 mr[ML];
    auto fetch_m = [&](int64_t j) {
        const float4 *src = reinterpret_cast<const float4 *>(pre + ((size_t)j * (p.V + K) + p.V) * K);
#pragma unroll
        for (int i = 0; i < ML; ++i)
            mr[i] = src[tid + i * THREADS];
    };
    if (p.nseg > 2)
        fetch_m(1);

    /* Segment 0 starts from the initial state (the main pass reads it from here, so a final
     * state aliasing the initial one is written only after every read); segment 1 from the
     * end of segment 0's chain, which PRE started from the initial state. */
    for (int i = tid; i < SCAN_ROWS * K; i += THREADS) {
        const int r = i / K, d = i % K;
        const int64_t vv = c0 + r;
        start[vv * K + d] =
            p.h0 ? load_state(p, p.h0, n * p.h0_s[0] + hv * p.h0_s[1] + d * p.h0_s[2] + vv * p.h0_s[3]) : 0.f;
        const float x = pre[vv * K + d];
        Ss[r * K + d] = x;
        start[(p.V + vv) * K + d] = x;
    }
#pragma unroll 1
    for (int64_t j = 1; j + 1 < p.nseg; ++j) {
        const float *pj = pre + (size_t)j * (p.V + K) * K;
        float4 acc = *reinterpret_cast<const float4 *>(pj + (c0 + row) * K + 4 * d4);
        __syncthreads(); /* the previous segment's reads of Ms and writes of Ss are done */
#pragma unroll
        for (int i = 0; i < ML; ++i)
            Ms[tid + i * THREADS] = mr[i];
        __syncthreads();
        if (j + 2 < p.nseg)
            fetch_m(j + 1);
        /* Four partial sums over e mod 4: four dependent FMA chains of K / 4 instead of one of K. */
        float4 part[4] = {acc, make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f),
                          make_float4(0.f, 0.f, 0.f, 0.f)};
#pragma unroll 2
        for (int e = 0; e < K; e += 4) {
            const float4 sv = *reinterpret_cast<const float4 *>(Ss + row * K + e);
            const float s4[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const float4 mv = Ms[(e + u) * D4 + d4];
                part[u].x += s4[u] * mv.x;
                part[u].y += s4[u] * mv.y;
                part[u].z += s4[u] * mv.z;
                part[u].w += s4[u] * mv.w;
            }
        }
        acc = make_float4((part[0].x + part[1].x) + (part[2].x + part[3].x), (part[0].y + part[1].y) + (part[2].y + part[3].y),
                          (part[0].z + part[1].z) + (part[2].z + part[3].z), (part[0].w + part[1].w) + (part[2].w + part[3].w));
        __syncthreads();
        *reinterpret_cast<float4 *>(Ss + row * K + 4 * d4) = acc;
        *reinterpret_cast<float4 *>(start + ((size_t)(j + 1) * p.V + c0 + row) * K + 4 * d4) = acc;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Host side                                                                                   */

static int64_t slots_per_head(const gdn_problem *p)
{
    if (p->cu_seqlens)
        return p->T / C + p->N + 1;
    return p->N * ((p->T + C - 1) / C);
}

/* The SM count of the problem's device (a cached driver attribute, no sync), which sizes the tiles
 * and the context-parallel segments; the workspace query and the call see the same value. */
static int sm_count(const gdn_problem *p)
{
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p->device_ordinal) != cudaSuccess || sms <= 0) {
        (void)cudaGetLastError();
        sms = 132;
    }
    return sms;
}

/* Context parallelism: with few (sequence, head) pairs, the serial chunk chain of each pair
 * would run on a few SMs. Splitting every sequence into segments costs about three times the
 * chain work (the M columns of the first pass double it), so it pays only when the wide tiles
 * of 64 value columns fill at most an eighth of the SMs: then about SMs / tiles segments give
 * one wave of the main pass. Fixed-length sequences only (the segment grid comes from T on the
 * host); varlen takes the plain path. */
constexpr int CP_MIN_SEGS = 8, CP_MIN_SEG_CHUNKS = 4;

struct cp_plan {
    int64_t nseg, seg_chunks; /* seg_chunks = 0: off */
};

static cp_plan plan_cp(const gdn_problem *p)
{
    cp_plan cp = {1, 0};
#ifdef GDN_CHUNK_DEV_NO_CP
    return cp;
#endif
    if (p->cu_seqlens || p->T <= 0 || p->N <= 0 || p->HV <= 0 || p->V % 64 != 0 || p->K % 64 != 0 ||
        p->V % SCAN_ROWS != 0)
        return cp;
    const int64_t cps = (p->T + C - 1) / C, tiles = p->N * p->HV * (p->V / 64);
    int64_t nseg = min64(sm_count(p) / tiles, cps / CP_MIN_SEG_CHUNKS);
    if (nseg < CP_MIN_SEGS)
        return cp;
#ifdef GDN_CHUNK_DEV_SEGS /* dev builds: another segment count, for bench comparisons */
    nseg = min64(GDN_CHUNK_DEV_SEGS > 2 ? GDN_CHUNK_DEV_SEGS : 2, cps); /* CP needs two segments or more */
#endif
    cp.seg_chunks = (cps + nseg - 1) / nseg;
    cp.nseg = (cps + cp.seg_chunks - 1) / cp.seg_chunks;
    return cp;
}

/* Value heads per chunk_prep CTA: the most (a divisor of G, at most PREP_MAX_HEADS) that still
 * leave two waves of resident CTAs, since one CTA is one serial chain and a group's heads run one
 * after another: grouping saves the shared Q / K part (loads, norms, K K^T, Q K^T) but at a few
 * CTAs per SM lengthens the chains that then set the time. GDN_CHUNK_DEV_PREP_HEADS caps the
 * group in dev builds, without the wave rule (tests: every G takes the grouped path). */
static int64_t prep_heads_for(const gdn_problem *p, int64_t slots)
{
#ifdef GDN_CHUNK_DEV_PREP_HEADS
    for (int64_t nh = GDN_CHUNK_DEV_PREP_HEADS < PREP_MAX_HEADS ? GDN_CHUNK_DEV_PREP_HEADS : PREP_MAX_HEADS; nh > 1; --nh)
        if (p->G % nh == 0)
            return nh;
    return 1;
#else
    const int64_t resident = (int64_t)sm_count(p) * PREP_CTAS;
    for (int64_t nh = PREP_MAX_HEADS; nh > 1; --nh)
        if (p->G % nh == 0 && slots * p->HV / nh >= 2 * resident)
            return nh;
    return 1;
#endif
}

/* launch_coop's counters: one int per value head and block of FLAG_BLOCK slots. */
static size_t coop_flag_bytes(int64_t slots, int64_t HV) { return (size_t)flag_blocks(slots) * (size_t)HV * sizeof(int); }

/* Bytes of the chunk workspace (Tb, Pm, coefficients, then launch_coop's counters), then of the
 * CP buffers. */
static size_t chunk_ws_bytes(const gdn_problem *p)
{
    const int64_t slots = slots_per_head(p);
    return (size_t)slots * (size_t)p->HV * WS_CHUNK + (coop_flag_bytes(slots, p->HV) + 15) / 16 * 16;
}

static size_t cp_ws_bytes(const gdn_problem *p, const cp_plan &cp)
{
    if (cp.seg_chunks == 0)
        return 0;
    return (size_t)(p->N * p->HV * cp.nseg) * (size_t)p->K * (size_t)(2 * p->V + p->K) * sizeof(float);
}

/* q, k, v and o views whose rows the kernels cannot bulk-copy in place (gdn_cuda_rows_aligned16) get
 * a contiguous copy at the start of the workspace: q, k and v are packed into it before the kernels
 * run, o is written there and copied out after. Each copy starts on a 256-byte boundary. */
struct pack_plan {
    const gdn_view *view[4]; /* q, k, v, o */
    int64_t H[4], D[4];
    size_t off[4];           /* byte offset of each copy, or SIZE_MAX: used in place */
    size_t bytes;            /* all copies */
};

static pack_plan plan_pack(const gdn_problem *p)
{
    pack_plan pk = {{&p->q, &p->k, &p->v, &p->o}, {p->H, p->H, p->HV, p->HV}, {p->K, p->K, p->V, p->V}, {}, 0};
    for (int i = 0; i < 4; ++i) {
        pk.off[i] = SIZE_MAX;
        if (gdn_cuda_rows_aligned16(pk.view[i]))
            continue;
        pk.off[i] = pk.bytes;
        pk.bytes += ((size_t)(p->B * p->T * pk.H[i] * pk.D[i]) * 2 + 255) / 256 * 256;
    }
    return pk;
}

static void contiguous_strides(int64_t T, int64_t H, int64_t D, int64_t s[4])
{
    s[3] = 1;
    s[2] = D;
    s[1] = H * D;
    s[0] = T * H * D;
}

/* One launch (cooperative: every CTA resident at once, or cudaErrorCooperativeLaunchTooLarge), with
 * the kernel's dynamic shared memory limit raised to smem first; the error of that launch alone
 * (not one an earlier call left pending). */
static cudaError_t launch_raw(void (*kernel)(const params), int64_t ctas, int threads, int smem, cudaStream_t stream,
                              const params &prm, bool cooperative)
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

static gdn_status launch_kernel(void (*kernel)(const params), int64_t ctas, int threads, int smem,
                                cudaStream_t stream, const params &prm, const char *what)
{
    return gdn_cuda_check(launch_raw(kernel, ctas, threads, smem, stream, prm, false), what);
}

template <typename T, int K>
static gdn_status launch_prep(const params &prm, const gdn_problem *p, cudaStream_t stream)
{
    if (p->T <= 0 || prm.slots <= 0)
        return GDN_OK;
    auto prep = prm.prep_heads > 1 ? chunk_prep_kernel<K, T, true> : chunk_prep_kernel<K, T, false>;
    return launch_kernel(prep, prm.slots * p->HV / prm.prep_heads, 128, prep_smem<K>::BYTES, stream, prm,
                         "chunk_prep launch");
}

/* chunk_wg over nseg segments, with PRE the chain alone over V + K virtual rows. */
template <typename T, int K, bool PRE>
static gdn_status launch_wg(const params &prm, const gdn_problem *p, int64_t nseg, cudaStream_t stream)
{
    const int64_t rows = PRE ? p->V + K : p->V;
    return launch_kernel(chunk_wg_kernel<K, T, PRE>, nseg * p->N * p->HV * (rows / 64), wg_cfg<PRE>::THREADS,
                         wg_smem<K, PRE>::BYTES, stream, prm, "chunk_wg launch");
}

/* prep; the chain of every segment but the last from a zero state (the first from the initial
 * state) and from the identity, giving N and M; the scan; the main pass of every segment. */
template <typename T, int K>
static gdn_status launch_cp(const params &prm, const gdn_problem *p, cudaStream_t stream)
{
    gdn_status st = launch_prep<T, K>(prm, p, stream);
    if (st != GDN_OK)
        return st;
    if ((st = launch_wg<T, K, true>(prm, p, prm.nseg - 1, stream)) != GDN_OK)
        return st;
    if ((st = launch_kernel(cp_scan_kernel<K>, p->N * p->HV * (p->V / SCAN_ROWS), scan_threads<K>(),
                            scan_smem_bytes<K>(), stream, prm, "cp_scan launch")) != GDN_OK)
        return st;
    return launch_wg<T, K, false>(prm, p, prm.nseg, stream);
}

/* Few (sequence, head) pairs without CP: the main pass's CTAs (one per SM) leave most SMs idle,
 * and chunk_prep would run alone before it. launch_coop runs both in one cooperative grid of one
 * CTA per SM: the first coop_main CTAs are the main pass; each other CTA runs three chunk_prep
 * units (one per warpgroup), which count the items they finish per value head and block of
 * FLAG_BLOCK slots (red.release); the main pass's copy warpgroup waits for a block's count (an
 * acquire load) before copying its records. A cooperative launch guarantees that every CTA is
 * resident at once (or fails to launch), so the waits always end, also where kernels are
 * serialized (compute-sanitizer, profilers' replay). Taken when the main pass needs at most half
 * the SMs. GDN_CHUNK_DEV_NO_COOP turns it off (dev builds: comparisons). */
static bool coop_fits(const gdn_problem *p)
{
#ifdef GDN_CHUNK_DEV_NO_COOP
    return false;
#else
    return p->T > 0 && p->N * p->HV * (p->V / 64) <= sm_count(p) / 2;
#endif
}

/* chunk_prep, then the main pass. */
template <typename T, int K> static gdn_status launch_two(const params &prm, const gdn_problem *p, cudaStream_t stream)
{
    const gdn_status st = launch_prep<T, K>(prm, p, stream);
    return st != GDN_OK ? st : launch_wg<T, K, false>(prm, p, 1, stream);
}

template <typename T, int K>
static gdn_status launch_coop(params prm, const gdn_problem *p, cudaStream_t stream)
{
    if (p->T <= 0 || prm.slots <= 0)
        return GDN_OK;
    gdn_status st;
    auto wg = chunk_wg_kernel<K, T, false>;
    constexpr int WB = wg_smem<K, false>::BYTES;
    int per_sm = 0;
    if ((st = gdn_cuda_check(cudaFuncSetAttribute(wg, cudaFuncAttributeMaxDynamicSharedMemorySize, WB),
                             "chunk_wg smem")) != GDN_OK ||
        (st = gdn_cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, wg, wg_cfg<false>::THREADS, WB),
                             "chunk_wg occupancy")) != GDN_OK)
        return st;
    const int64_t main_ctas = p->N * p->HV * (p->V / 64), ctas = (int64_t)sm_count(p) * per_sm;
    if (per_sm < 1 || ctas <= main_ctas) /* no room for prep units */
        return launch_two<T, K>(prm, p, stream);
    prm.ready = reinterpret_cast<int *>(prm.ws + (size_t)prm.slots * (size_t)p->HV * WS_CHUNK);
    prm.coop_main = main_ctas;
    int flags0 = 0;
#ifdef GDN_CHUNK_DEV_COOP_PROBE
    /* Dev builds: from the second call on (records and output of the first stay in place; bench
     * with one shape per process), time the prep units alone (1) or the main pass alone (2, with
     * every flag set before the launch; 3, also without polling). */
    static int calls = 0;
    prm.probe = calls++ > 0 ? GDN_CHUNK_DEV_COOP_PROBE : 0;
    flags0 = prm.probe >= 2 ? 1 : 0;
#endif
    if ((st = gdn_cuda_check(cudaMemsetAsync(prm.ready, flags0, coop_flag_bytes(prm.slots, p->HV), stream),
                             "chunk flags")) != GDN_OK)
        return st;
    const cudaError_t e = launch_raw(wg, ctas, wg_cfg<false>::THREADS, WB, stream, prm, true);
    if (e == cudaErrorCooperativeLaunchTooLarge) {
        /* Fewer SMs than the device reports (MPS limits): the two-kernel path, flags unused. */
        (void)cudaGetLastError();
        prm.ready = NULL;
        return launch_two<T, K>(prm, p, stream);
    }
    return gdn_cuda_check(e, "chunk_wg cooperative launch");
}

/* chunk_prep, then the main pass; or context parallelism's four passes; or both in one grid. */
template <typename T, int K>
static gdn_status launch_all(const params &prm, const gdn_problem *p, cudaStream_t stream)
{
    if (prm.seg_chunks > 0)
        return launch_cp<T, K>(prm, p, stream);
    if (coop_fits(p))
        return launch_coop<T, K>(prm, p, stream);
    return launch_two<T, K>(prm, p, stream);
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

extern "C" gdn_status gdn_cuda_chunk_fwd(const gdn_problem *p)
{
    if (p->gate_kind != GDN_GATE_GDN)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "gdn_chunk_fwd: KDA gates are not supported on CUDA");
    if (p->q.dtype != GDN_DTYPE_BF16 && p->q.dtype != GDN_DTYPE_F16)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "q: the CUDA chunk path takes bf16 or f16 inputs");
    if (p->K != 64 && p->K != 128)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "q: head dim K = %lld (CUDA chunk path: 64 or 128)", (long long)p->K);
    if (p->V % 64 != 0)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "v: head dim V = %lld must be a multiple of 64", (long long)p->V);
    if (p->state_dtype != GDN_DTYPE_F32 && p->state_dtype != GDN_DTYPE_BF16)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "state: f32 or bf16 on CUDA");
    const size_t need = gdn_cuda_chunk_fwd_workspace_min(p);
    if (need > 0 && (!p->workspace || p->workspace_bytes < need || (uintptr_t)p->workspace % 16 != 0))
        return gdn_set_error(GDN_ERR_WORKSPACE, "workspace: at least %zu bytes needed, 16-byte aligned", need);
    if (p->N == 0 || p->HV == 0)
        return GDN_OK;
    /* One-dimensional grids (V / 64 CTAs per sequence and head in chunk_wg; CP: at most an SM's
     * worth of segments, each (V + K) / 64). */
    if (slots_per_head(p) * p->HV > INT32_MAX || p->N * p->HV * (p->V / 64) > INT32_MAX)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "q: %lld tokens x %lld value heads exceed the CUDA chunk path's grid",
                             (long long)p->T, (long long)p->HV);

    params prm = {};
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
    const pack_plan pk = plan_pack(p);
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
    prm.g_b = p->g.s[0], prm.g_t = p->g.s[1], prm.g_h = p->g.s[2];
    prm.a = p->a.data;
    prm.a_dtype = p->a.dtype;
    prm.a_b = p->a.s[0], prm.a_t = p->a.s[1], prm.a_h = p->a.s[2];
    prm.A_log = p->A_log;
    prm.dt_bias = static_cast<const float *>(p->dt_bias.data);
    prm.dt_h = p->dt_bias.s[0];
    prm.sp_beta = p->softplus_beta;
    prm.sp_threshold = p->softplus_threshold;
    prm.beta = p->beta.data;
    prm.beta_dtype = p->beta.dtype;
    prm.be_b = p->beta.s[0], prm.be_t = p->beta.s[1], prm.be_h = p->beta.s[2];
    prm.beta_from_logits = p->beta_from_logits;
    prm.allow_neg_eigval = p->allow_neg_eigval;
    prm.scale = p->scale;
    prm.l2norm = p->use_qk_l2norm;
    prm.h0 = p->state_in.data;
    prm.ht = p->final_state.data;
    prm.state_dtype = p->state_dtype;
    for (int i = 0; i < 4; ++i) {
        prm.h0_s[i] = p->state_in.s[i];
        prm.ht_s[i] = p->final_state.s[i];
    }
    prm.ws = ws + pk.bytes;
    cp_plan cp = plan_cp(p);
    if (cp.seg_chunks > 0 && p->workspace_bytes < need + cp_ws_bytes(p, cp))
        cp = cp_plan{1, 0}; /* a workspace sized for the plain path: run that */
    prm.seg_chunks = cp.seg_chunks;
    prm.nseg = cp.nseg;
    if (cp.seg_chunks > 0) {
        prm.cp_pre = reinterpret_cast<float *>(prm.ws + chunk_ws_bytes(p));
        prm.cp_start = prm.cp_pre + (size_t)(p->N * p->HV * cp.nseg) * (size_t)(p->V + p->K) * (size_t)p->K;
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
