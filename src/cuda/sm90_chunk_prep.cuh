/*
 * sm90_chunk_prep.cuh - chunk_prep, the state-free part of every chunk (gates and their cumsum,
 * q / k norms, K K^T and Q K^T, T = (I + A)^-1, the masked decayed Q K^T), written to the
 * workspace as records that chunk_wg reads; also run as units of the cooperative grid.
 */
#ifndef GDN_SM90_CHUNK_PREP_CUH
#define GDN_SM90_CHUNK_PREP_CUH

#include "sm90_chunk_common.cuh"

namespace gdn_chunk {
/* ------------------------------------------------------------------------------------------ */
/* chunk_prep                                                                                  */

/* Most value heads one chunk_prep CTA handles: warp w < heads runs the cumsum of head w, and the
 * gates of every head stay in shared memory (3 x 256 B per head). */
constexpr int PREP_MAX_HEADS = 4;
static_assert(PREP_MAX_HEADS <= 4, "chunk_prep: one cumsum warp per head, 4 warps");

template <int K> struct PrepSmem {
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

/* The triangular inverse's block products run on tensor cores in 3xTF32 (sm90_primitives.cuh),
 * f32-class accuracy, far below the bf16 / f16 rounding of the Tb they feed. */
/* The three partial products of 3xTF32 in separate accumulators (three independent mma chains
 * instead of one); sum() adds them in a fixed order. */
struct Acc3 {
    float hh[4], hl[4], lh[4];
    __device__ __forceinline__ float sum(int e) const { return (lh[e] + hl[e]) + hh[e]; }
};

/* c += X Y: X a 16 x 16 block, Y a 16 x 8 block, both f32 in shared memory with row pitch LD. */
template <int LD>
__device__ __forceinline__ void mma_16x8_f32(Acc3 &c, const float *X, const float *Y, int g, int t)
{
#pragma unroll
    for (int ks = 0; ks < 16; ks += 8) {
        const Tf32Pair a0 = tf32_split<true>(X[g * LD + ks + t]), a1 = tf32_split<true>(X[(g + 8) * LD + ks + t]);
        const Tf32Pair a2 = tf32_split<true>(X[g * LD + ks + t + 4]), a3 = tf32_split<true>(X[(g + 8) * LD + ks + t + 4]);
        const Tf32Pair b0 = tf32_split<true>(Y[(ks + t) * LD + g]), b1 = tf32_split<true>(Y[(ks + t + 4) * LD + g]);
        const uint32_t ah[4] = {a0.hi, a1.hi, a2.hi, a3.hi}, al[4] = {a0.lo, a1.lo, a2.lo, a3.lo};
        mma_tf32<true>(c.lh, al, b0.hi, b1.hi);
        mma_tf32<true>(c.hl, ah, b0.lo, b1.lo);
        mma_tf32<true>(c.hh, ah, b0.hi, b1.hi);
    }
}

template <int LD>
__device__ __forceinline__ void store_16x8(float *dst, const Acc3 &c, float sign, int g, int t)
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
    Acc3 s[NI] = {}, r[NI] = {};
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
 * Gam is scaled to log2 so each decay is one ex2 (LOG2E, cuda_gate.cuh). gh / bh: the head's Gam
 * and beta. */

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

/* DECAY = false (KDA): the decays are inside kk and qk already; gh's values go unused. */
template <bool WITH_A, int LD, typename T, bool DECAY = true>
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
        const float2 gcol = DECAY ? make_float2(gh[8 * nt + 2 * t] * LOG2E, gh[8 * nt + 2 * t + 1] * LOG2E)
                                  : make_float2(0.f, 0.f);
        const float2 kcol = *reinterpret_cast<const float2 *>(rk + 8 * nt + 2 * t);
#pragma unroll
        for (int hrow = 0; hrow < 2; ++hrow) {
            const int i = 16 * warp + g + 8 * hrow;
            float av[2], pv[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = 8 * nt + 2 * t + e;
                /* Only i >= j: 2^x of a non-positive number. */
                const float kc = e ? kcol.y : kcol.x;
                const float dec = i >= j ? (DECAY ? fast_exp2(gr[hrow] - (e ? gcol.y : gcol.x)) * kc : kc) : 0.f;
                av[e] = i > j ? br[hrow] * dec * kk[nt][2 * hrow + e] : 0.f;
                /* KDA's qk above the diagonal may be inf (kda_prep): selected away, never multiplied. */
                pv[e] = DECAY || i >= j ? rqr[hrow] * dec * qk[nt][2 * hrow + e] : 0.f;
            }
            if (WITH_A)
                *reinterpret_cast<float2 *>(As + i * LD + 8 * nt + 2 * t) = make_float2(av[0], av[1]);
            pm_out[hrow * pm_row8 + 4 * nt] = Mma16<T>::pack(pv[0], pv[1]);
        }
    }
}

/* The workspace record of (value head hv, chunk slot): WS_CHUNK bytes each (KDA: KdaRec's). */
__device__ __forceinline__ unsigned char *ws_head(const ChunkParams &p, int64_t hv, int64_t slot,
                                                  size_t rec_bytes = WS_CHUNK)
{
    return p.ws + hv_slot(hv, p.slots, slot) * rec_bytes;
}

/* Training: the backward's record of (value head hv, chunk slot) (gdn_rec), in the saved states. */
__device__ __forceinline__ unsigned char *bwd_rec_of(const ChunkParams &p, int64_t hv, int64_t slot)
{
    return p.bwd_rec + hv_slot(hv, p.slots, slot) * REC_BYTES;
}

constexpr float G_FLOOR = -40.f; /* log decays below it are raised to it (chunk_prep) */


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

/* Inclusive cumsum of 64 values held in pairs (g0, g1) by the 32 lanes of a warp: the sums up to
 * and including each of the lane's two values. */
__device__ __forceinline__ float2 warp_cumsum_pairs(float g0, float g1, int lane)
{
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
    return make_float2(ex + g0, s);
}

/* GROUPED = false: one head per CTA, nh = 1 at compile time: the head loops of the grouped kernel
 * cost time at shapes without GVA. */
/* A chunk_prep work item: the chunk in slot `slot` of value heads hv0 .. hv0 + nh - 1 (nh divides
 * G: heads of one key head), cl of its tokens real (0: no chunk in this slot). */
struct PrepItem {
    SeqInfo sq;
    int64_t slot, t0, h;
    int hv0, nh, cl;
};

/* Item `item` of the chunk_prep grid: groups of nh value heads fastest, the groups that share a key
 * head together, so all but the first find its Q / K rows in L2. */
template <bool GROUPED> __device__ __forceinline__ PrepItem prep_locate(const ChunkParams &p, int64_t item)
{
    PrepItem it;
    it.nh = GROUPED ? (int)p.prep_heads : 1;
    const unsigned groups = (unsigned)(p.HV / it.nh);
    it.slot = item / groups;
    it.hv0 = (int)(item % groups) * it.nh;
    int64_t c;
    const int64_t n = slot_sequence(p, it.slot, c);
    it.sq = sequence(p, n);
    /* No chunk: padding, or a cu_seqlens that decreases. */
    it.cl = c < 0 || c * C >= it.sq.len ? 0 : (int)min64(C, it.sq.len - c * C);
    it.t0 = it.sq.bos + c * C;
    it.h = it.hv0 / p.G;
    return it;
}

/* launch_coop's order of prep items (groups of them per slot): chunk-major over the sequences
 * (fixed length: slot = n cps + c, and slots = N cps), so that every main-pass CTA is fed from
 * its start and the first i items are the first i / (N groups) chunks of every sequence; varlen in
 * slot order. */
__device__ __forceinline__ int64_t coop_item(const ChunkParams &p, int64_t i, int64_t groups)
{
    if (p.cu)
        return i;
    const int64_t r = i / groups, c = r / p.N, n = r % p.N;
    return (n * p.cps + c) * groups + i % groups;
}

/* launch_coop counts the items done per value head and block of FLAG_BLOCK slots: the main pass
 * polls once per block instead of once per chunk (a poll's round trip to L2 sits on its copy
 * threads' path), at the price of waiting for a whole block of records. */
__host__ __device__ __forceinline__ int64_t flag_blocks(int64_t slots) { return (slots + FLAG_BLOCK - 1) / FLAG_BLOCK; }

/* launch_coop: the item's records are written (or it has none): one more for its block. */
__device__ __forceinline__ void prep_release(const ChunkParams &p, int hv0, int nh, int64_t slot, int tid)
{
    if (p.ready && tid < nh)
        asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p.ready + (hv0 + tid) * flag_blocks(p.slots) + slot / FLAG_BLOCK),
                     "r"(1)
                     : "memory");
}

/* Q and K of the item into Qs / Ks (one cp.async group): thread tid copies 16-byte column chunk
 * ch of rows r0, r0 + RP, ... */
template <int K, typename T>
__device__ __forceinline__ void prep_issue_qk(const ChunkParams &p, const PrepItem &it, int tid, T *Qs, T *Ks)
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
struct PrepGates {
    float g[PREP_GATES_PER_THREAD], b[PREP_GATES_PER_THREAD];
};

__device__ __forceinline__ void prep_load_gates(const ChunkParams &p, const PrepItem &it, int tid, PrepGates &r)
{
#pragma unroll
    for (int j = 0; j < PREP_GATES_PER_THREAD; ++j) {
        const int idx = tid + 128 * j, tok = idx & (C - 1);
        r.g[j] = r.b[j] = 0.f;
        if (idx < it.nh * C && tok < it.cl) {
            const int64_t hv = it.hv0 + idx / C, t = it.t0 + tok;
            r.g[j] = p.g ? p.g[it.sq.row * p.g_b + t * p.g_t + hv * p.g_h]
                         : load_elem(p.a, p.a_dtype, it.sq.row * p.a_b + t * p.a_t + hv * p.a_h);
            r.b[j] = load_elem(p.beta, p.beta_dtype, it.sq.row * p.be_b + t * p.be_t + hv * p.be_h);
        }
    }
}

/* The gates of every head of the item: token r of head hh at [hh * C + r]; padding tokens get no
 * decay and no write (g = beta = 0). In training (bwd_rec) also the backward record's beta and
 * live rows (live: the log decay is above the floor, where its derivative is not 0). */
__device__ __forceinline__ void prep_store_gates(const ChunkParams &p, const PrepItem &it, int tid, const PrepGates &r,
                                                 float *graw, float *bet)
{
#pragma unroll
    for (int j = 0; j < PREP_GATES_PER_THREAD; ++j) {
        const int idx = tid + 128 * j;
        if (idx >= it.nh * C)
            break;
        float gv = 0.f, bv = 0.f, live = 1.f;
        const int64_t hv = it.hv0 + idx / C;
        if ((idx & (C - 1)) < it.cl) {
            gv = r.g[j];
            if (!p.g)
                gv = gate_log_decay(gv, p.dt_bias ? p.dt_bias[hv * p.dt_h] : 0.f, p.A_log[hv], p.sp_beta,
                                    p.sp_threshold);
            /* A floor on the log decay: exp(-40) ~ 4e-18 resets any f32 state as g = -inf does, and
             * it keeps gam_i - gam_j finite (-inf - -inf would be NaN) and exact enough in f32.
             * NaN stays NaN. */
            if (gv < G_FLOOR) {
                gv = G_FLOOR;
                live = 0.f;
            }
            bv = p.beta_from_logits ? gate_beta(r.b[j], p.allow_neg_eigval) : r.b[j];
        }
        graw[idx] = gv;
        bet[idx] = bv;
        if (p.bwd_rec) {
            float *rows = reinterpret_cast<float *>(bwd_rec_of(p, hv, it.slot) + REC_ROWS);
            rows[R_LIVE * C + (idx & (C - 1))] = live;
            rows[R_BETA * C + (idx & (C - 1))] = bv;
        }
    }
}

/* T = (I + A)^-1 of one head into Ts (f32, row pitch LD), once the unit's warps wrote rows
 * 16 w .. 16 w + 15 of A (As; each warp its own, so a warp barrier orders them for the diagonal
 * blocks). Ends with the unit's barrier. Shared by chunk_prep and kda_prep. */
template <int LD>
__device__ __forceinline__ void prep_inverse(const float *As, float *Ts, int tid, int bar)
{
    const int lane = tid & 31, warp = tid >> 5;
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
}

/* The backward record's factor rows of token i from its log-decay cumsum G_i (natural units), the
 * chunk's G_c and the norm factors (chunk_prep, training). */
__device__ __forceinline__ void store_bwd_rows(float *rows, int i, float G_i, float G_c, float rk, float rq, float scale)
{
    const float gam = expf(G_i), gu = expf(G_c - G_i);
    rows[R_CK * C + i] = rk * gam;
    rows[R_CQ * C + i] = scale * rq * gam;
    rows[R_CU * C + i] = rk * gu;
    rows[R_GAM * C + i] = gam;
    rows[R_RK * C + i] = rk;
    rows[R_RQ * C + i] = rq;
    rows[R_GLOG * C + i] = G_i;
    rows[R_GU * C + i] = gu;
    rows[R_GC * C + i] = expf(G_c);
}

/* The lower triangle of an f32 [C][LD] matrix as a [C][C] 16-bit one, zeros above the diagonal
 * (the backward record's T), by 128 threads. */
template <int LD, typename T> __device__ __forceinline__ void store_lower(const float *Ts, T *out, int tid)
{
#pragma unroll 1
    for (int idx = tid; idx < C * C / 2; idx += 128) {
        const int i = idx / (C / 2), j = 2 * (idx % (C / 2));
        *reinterpret_cast<uint32_t *>(out + i * C + j) =
            Mma16<T>::pack(j <= i ? Ts[i * LD + j] : 0.f, j + 1 <= i ? Ts[i * LD + j + 1] : 0.f);
    }
}

/* A lower-triangular matrix from the record's block layout (tri_chunk) to [C][C] with zeros above
 * its diagonal blocks (the backward record's Pm), by 128 threads. The source is global memory this
 * CTA wrote before a barrier: read through L2 (ld.global.cg). */
template <typename T> __device__ __forceinline__ void tri_to_full(const T *tri, T *out, int tid)
{
#pragma unroll 1
    for (int idx = tid; idx < C * 8; idx += 128) {
        const int i = idx >> 3, ch = idx & 7;
        const uint4 x = (ch >> 1) > (i >> 4) ? make_uint4(0, 0, 0, 0)
                                             : __ldcg(reinterpret_cast<const uint4 *>(tri + tri_chunk(i, ch) * 8));
        *reinterpret_cast<uint4 *>(out + i * C + ch * 8) = x;
    }
}

/* prep_inverse, then Tb = T diag(beta) below the diagonal into the record (tb_out); bh is the
 * head's beta. The diagonal (T's is 1) is left 0: chunk_wg applies beta there in f32 (Vn^T starts
 * as X^T diag(beta)), so a chunk's own token reaches Vn rounded once, not through a bf16 beta and
 * a bf16 X as well. */
template <int LD, typename T>
__device__ __forceinline__ void prep_inverse_tb(const float *As, float *Ts, const float *bh, T *tb_out, int tid, int bar)
{
    prep_inverse<LD>(As, Ts, tid, bar);

    /* The chunks of the blocks on and below the diagonal (tri_chunk). A
     * warp takes one chunk column of 32 rows: with the pitch of 68 floats its float4 reads
     * of T hit every bank once per 8 rows, and beta is a broadcast. */
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
            w[e] = Mma16<T>::pack(j + 2 * e < i ? x[2 * e] : 0.f, j + 2 * e + 1 < i ? x[2 * e + 1] : 0.f);
        *reinterpret_cast<uint4 *>(tb_out + tri_chunk(i, ch) * 8) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

/* The rest of an item once its Q, K (in buf) and gates (in gates) are in shared memory and the
 * unit has synchronized: norms, decays, masks, the inverse, the records. buf holds Q and K, then
 * A and T in their place; gates holds PrepSmem's GATES part. */
template <int K, typename T, bool GROUPED>
__device__ __forceinline__ void prep_body(const ChunkParams &p, int hv0, int64_t slot, int tid, unsigned char *buf,
                                          float *gates, int bar)
{
    constexpr int KC = K / 8;
    constexpr int LD = PrepSmem<K>::LD;
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
        const float2 cs = warp_cumsum_pairs(graw[warp * C + 2 * lane], graw[warp * C + 2 * lane + 1], lane);
        gam[warp * C + 2 * lane] = cs.x;
        gam[warp * C + 2 * lane + 1] = cs.y;
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
        Mma16<T>::mma(qq[0], aq, bq[0], bq[1]);
        Mma16<T>::mma(qq[1], aq, bq[2], bq[3]);
#pragma unroll
        for (int nn = 0; nn < 4; ++nn) {
            if (nn > warp)
                break;
            uint32_t b[4];
            ldsm_x4(b, smem_u32(Ks + swz<KC>(16 * nn + (m >> 1) * 8 + r8, 16 * kc + (m & 1) * 8)));
            Mma16<T>::mma(kk[2 * nn], ak, b[0], b[1]);
            Mma16<T>::mma(kk[2 * nn + 1], ak, b[2], b[3]);
            Mma16<T>::mma(qk[2 * nn], aq, b[0], b[1]);
            Mma16<T>::mma(qk[2 * nn + 1], aq, b[2], b[3]);
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
        prep_inverse_tb<LD, T>(As, Ts, bh, reinterpret_cast<T *>(wsc), tid, bar);
        if (p.bwd_rec) {
            /* Training: T (in Ts until the next head's barrier) and Pm (this record's, written by
             * mask_rows before the inverse's barriers) in the backward's layout. */
            T *bt = reinterpret_cast<T *>(bwd_rec_of(p, hv0 + hh, slot));
            store_lower<LD, T>(Ts, bt, tid);
            tri_to_full<T>(reinterpret_cast<const T *>(wsc + TRI_BYTES), bt + C * C, tid);
        }
        float *coef = reinterpret_cast<float *>(wsc + 2 * TRI_BYTES);
        if (tid < C) {
            const float gi = gh[tid], gc = gh[C - 1];
            coef[tid] = rk[tid] * expf(gi);                     /* ck: rows of K in Y = K S */
            coef[C + tid] = p.scale * rq[tid] * expf(gi);       /* cq: rows of Q in Q S */
            coef[2 * C + tid] = rk[tid] * expf(gc - gi);        /* cu: rows of Vnew in the update */
            if (tid < 4)
                coef[3 * C + tid] = tid == 0 ? expf(gc) : 0.f; /* gC */
            coef[COEF_BETA + tid] = bh[tid];                    /* beta: Tb's diagonal, in f32 */
            if (p.bwd_rec) /* its beta and live rows come from prep_store_gates */
                store_bwd_rows(reinterpret_cast<float *>(bwd_rec_of(p, hv0 + hh, slot) + REC_ROWS), tid, gi, gc,
                               rk[tid], rq[tid], p.scale);
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

/* One item, start to end, in one PrepSmem region. */
template <int K, typename T, bool GROUPED>
__device__ __forceinline__ void prep_chunk(const ChunkParams &p, int64_t item, int tid, unsigned char *smem, int bar)
{
    using L = PrepSmem<K>;
    const PrepItem it = prep_locate<GROUPED>(p, item);
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
    PrepGates g;
    prep_load_gates(p, it, tid, g);
    prep_store_gates(p, it, tid, g, gates + 2 * PREP_MAX_HEADS * C, gates + PREP_MAX_HEADS * C);
    cp_async_wait<0>();
    unit_sync(bar);
    prep_body<K, T, GROUPED>(p, it.hv0, it.slot, tid, smem, gates, bar);
}

template <int K, typename T, bool GROUPED>
__global__ void __launch_bounds__(128, PREP_CTAS) chunk_prep_kernel(const ChunkParams p)
{
    extern __shared__ __align__(128) unsigned char smem[];
    prep_chunk<K, T, GROUPED>(p, blockIdx.x, threadIdx.x, smem, 0);
    if (p.order && blockIdx.x < p.N)
        order_sequence(p, blockIdx.x, threadIdx.x);
}

} /* namespace gdn_chunk */

#endif /* GDN_SM90_CHUNK_PREP_CUH */
