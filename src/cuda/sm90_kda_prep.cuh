/*
 * sm90_kda_prep.cuh - kda_prep, chunk_prep's counterpart for KDA gates (one log decay per key
 * channel): it writes KDA's chunk record (KdaRec, sm90_chunk_common.cuh), which chunk_wg<KDA>
 * reads. What differs from GDN is where the decay sits: inside the products over the key
 * channels, so it cannot be a row factor applied after them.
 *
 * One CTA (4 warps) per (chunk, value head), or a warpgroup of chunk_wg's cooperative grid taking
 * items in turn (launch_coop): the decays depend on the value head, so GDN's grouping of value
 * heads that share K K^T has nothing to share here.
 *   - Gam, the per-key cumsum of the chunk's log decays (log2 units), in shared memory; q / k
 *     norms as row factors, as chunk_prep keeps them.
 *   - The three tile images Q~, K~, K^ and exp(Gam_C) to the record.
 *   - The decayed K K^T and Q K^T of 16 x 16 blocks, warp w block row w, on tensor cores: with
 *     an anchor token a of block w, Gam_i - Gam_j = (Gam_i - Gam_a) + (Gam_a - Gam_j), so each
 *     product is (X_i o 2^(Gam_i - Gam_a)) . (K_j o 2^(Gam_a - Gam_j)), the factors scaled in
 *     registers between ldmatrix and mma. With a = 16 w (the block's first token) both factors
 *     of the blocks left of the diagonal are <= 1: safe for any gate. The diagonal block also
 *     needs j > a, where 2^(Gam_a - Gam_j) grows with the decay over the block; so a moves to
 *     the block's middle token 16 w + 8 and the diagonal block runs on tensor cores when the
 *     decay over either half is at most 2^kda_span_max() in every key (FLA's lower_bound of -5
 *     gives at most e^40 = 2^58), and otherwise on CUDA cores, each term 2^(Gam_i - Gam_j) with
 *     i >= j, any gate.
 *   - A, Pm and T = (I + A)^-1 as chunk_prep (mask_rows without decay, prep_inverse_tb).
 */
#ifndef GDN_SM90_KDA_PREP_CUH
#define GDN_SM90_KDA_PREP_CUH

#include <type_traits>

#include "sm90_chunk_prep.cuh"

namespace gdn_chunk {

/* The largest decay over half a 16-token block (log2 units) that the diagonal block's products
 * take on tensor cores in bf16: factors up to 2^96 ~ 8e28 stay far from bf16's 2^128 once
 * multiplied by a key entry. f16 (largest 65504, smallest 2^-24) has no such room: its diagonal
 * blocks always take the CUDA-core path (factors <= 1 elsewhere only lose what underflows). */
template <typename T> constexpr float kda_span_max() { return gdn_sm90::is_f16<T>::value ? -1.f : 96.f; }

/* G_FLOOR in the log2 units that kda_prep keeps Gam in. */
constexpr float G_FLOOR2 = G_FLOOR * LOG2E;

template <int K> struct KdaPrepSmem {
    static constexpr int QK = C * K * 2;       /* Q and K tiles, bytes each */
    static constexpr int GLD = K + 8;          /* Gam row pitch (floats): fragment reads conflict-free */
    static constexpr int GAM = C * GLD * 4;
    static constexpr int LD = PrepSmem<K>::LD; /* A and T, as chunk_prep's; they alias Q, K and Gam */
    static constexpr int MAT = C * LD * 4;
    static constexpr int GOFF = 2 * QK - TUNE_KDA_PREP_OVERLAP; /* Gam's offset: after Q and K */
    static constexpr int MAIN = GOFF + GAM > 2 * MAT ? GOFF + GAM : 2 * MAT;
    static constexpr int BYTES = MAIN + 3 * C * 4; /* + beta, rk, rq */
    static constexpr int UNIT = (BYTES + 1023) / 1024 * 1024; /* a unit's region in launch_coop's grid */
};

/* x (a packed pair of T) times 2^e0, 2^e1. */
template <typename T> __device__ __forceinline__ uint32_t scale_pair(uint32_t x, float e0, float e1)
{
    const float2 f = Mma16<T>::unpack(x);
    return Mma16<T>::pack(f.x * fast_exp2(e0), f.y * fast_exp2(e1));
}

/* The chunk's gate inputs from any view (cl tokens x K keys, from base + off) into Gs as f32,
 * row pitch ld: the 128 threads along the keys, 32 loads of a thread in flight before their
 * stores. */
template <typename E>
__device__ __forceinline__ void kda_load_gates(const E *base, int64_t off, int64_t st, int64_t sr, int cl, int K, int tid,
                                               float *Gs, int ld)
{
    constexpr int PER = 32;
    const int per_row = 128 / K; /* rows covered by the CTA per step (1 or 2) */
    const int d = tid % K, r0 = tid / K;
#pragma unroll 1
    for (int rb = r0; rb < cl; rb += PER * per_row) {
        float x[PER];
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int r = rb + j * per_row;
            x[j] = r < cl ? gdn_to_f32(base[off + r * st + d * sr]) : 0.f;
        }
#pragma unroll
        for (int j = 0; j < PER; ++j)
            Gs[(rb + j * per_row) * ld + d] = x[j];
    }
}

/* 16-bit raw gate rows (contiguous, 16-byte aligned) staged with cp.async, in flight with Q and
 * K: row r's K values go to the last K * 2 bytes of Gs row r (kda_stage16 bytes into it), where
 * kda_gate_rows converts them in place. Rows past cl: zeros. */
template <int K, int GLD> constexpr int kda_stage16() { return GLD * 4 - K * 2; }

template <int K, int GLD, typename E>
__device__ __forceinline__ void kda_stage_gates16(const E *base, int64_t off, int64_t st, int cl, int tid, float *Gs)
{
    constexpr int CH = K / 8, RP = 128 / CH;
    static_assert(kda_stage16<K, GLD>() % 16 == 0, "16-byte staging");
    const int ch = tid % CH, r0 = tid / CH;
    unsigned char *dst = reinterpret_cast<unsigned char *>(Gs) + kda_stage16<K, GLD>() + 16 * ch;
#pragma unroll 4
    for (int r = r0; r < C; r += RP)
        cp_async16(dst + r * GLD * 4, r < cl ? base + off + r * st + 8 * ch : base, r < cl ? 16 : 0);
    cp_async_commit();
}

/* The gate formula over the raw inputs in Gs, row by row: warp w takes rows w, w + 4, ..., lane l
 * keys [l K / 32, (l + 1) K / 32). A warp reads its lanes' inputs of a row (f32 in place, or the
 * staged 16-bit values, E) before it writes any f32 of that row, and no other warp touches the
 * row, so the in-place conversion is safe. Writes the floored log2 decays. */
template <int K, int GLD, typename E, bool SAFE>
__device__ __forceinline__ void kda_gate_rows(const ChunkParams &p, int64_t hv, int cl, int tid, float *Gs)
{
    constexpr int KPL = K / 32;
    const int lane = tid & 31, warp = tid >> 5, d0 = KPL * lane;
    const KdaGate kg = kda_gate_consts(p.A_log[hv], p.lower_bound, p.sp_beta, p.sp_threshold);
    float dtb[KPL];
#pragma unroll
    for (int j = 0; j < KPL; ++j) {
        dtb[j] = p.dt_bias ? p.dt_bias[hv * p.dt_h + (d0 + j) * p.dt_r] : 0.f;
        if (SAFE)
            dtb[j] *= kg.c2;
    }
    static_assert(KPL == 2 || KPL == 4, "K = 64 or 128");
    /* A lane's KPL values move as one vector: with a lane stride of KPL words, scalar accesses would
     * hit each bank KPL ways. */
    using FV = std::conditional_t<KPL == 4, float4, float2>;
    using WV = std::conditional_t<KPL == 4, uint2, uint32_t>;
#pragma unroll 4
    for (int r = warp; r < cl; r += 4) {
        float *row = Gs + r * GLD;
        float x[KPL];
        if constexpr (sizeof(E) == 2) {
            const WV wv = *reinterpret_cast<const WV *>(reinterpret_cast<const unsigned char *>(row) +
                                                        kda_stage16<K, GLD>() + 2 * d0);
            const uint32_t *w = reinterpret_cast<const uint32_t *>(&wv);
#pragma unroll
            for (int j = 0; j < KPL / 2; ++j) {
                const float2 f = Mma16<E>::unpack(w[j]);
                x[2 * j] = f.x;
                x[2 * j + 1] = f.y;
            }
        } else {
            const FV v = *reinterpret_cast<const FV *>(row + d0);
            const float *vx = reinterpret_cast<const float *>(&v);
#pragma unroll
            for (int j = 0; j < KPL; ++j)
                x[j] = vx[j];
        }
        __syncwarp();
        FV out;
        float *y = reinterpret_cast<float *>(&out);
#pragma unroll
        for (int j = 0; j < KPL; ++j) {
            const float g2 = SAFE ? kda_gate_safe_log2(x[j], dtb[j], kg) : kda_gate_softplus_log2(x[j], dtb[j], kg);
            y[j] = g2 < G_FLOOR2 ? G_FLOOR2 : g2;
        }
        *reinterpret_cast<FV *>(row + d0) = out;
    }
}

template <int K, int GLD, typename E>
__device__ __forceinline__ void kda_gate_rows(const ChunkParams &p, int64_t hv, int cl, int tid, float *Gs)
{
    if (p.lower_bound < 0.0f)
        kda_gate_rows<K, GLD, E, true>(p, hv, cl, tid, Gs);
    else
        kda_gate_rows<K, GLD, E, false>(p, hv, cl, tid, Gs);
}

/* The first image row of warp w (w = 4: the end). In the products warp w takes w + 1 B blocks, so
 * the warps with fewer blocks take more image rows, and the four reach the barrier after the
 * products closer together (the split chosen, and the others tried: dev/prefill/README.md, "kda_prep
 * by instruction count"). Any split is exact: a warp step covers 32 / (K / 8) rows, each row below
 * the warp's end once. */
__device__ __forceinline__ int kda_img_rows(int w) { return w == 0 ? 0 : w == 1 ? 28 : w == 2 ? 48 : w == 3 ? 58 : C; }

/* One item, start to end, in one KdaPrepSmem region; bar as unit_sync's (0: the CTA's). With
 * launch_coop (p.ready) the item's records are published to the main pass at the end. */
template <int K, typename T>
__device__ __forceinline__ void kda_prep_chunk(const ChunkParams &p, int64_t item, int tid, unsigned char *smem, int bar)
{
    using L = KdaPrepSmem<K>;
    constexpr int KC = K / 8, GLD = L::GLD, LD = L::LD;
    const PrepItem it = prep_locate<false>(p, item);
    if (it.cl == 0) {
        prep_release(p, it.hv0, 1, it.slot, tid); /* as prep_chunk: a waiting main pass never hangs */
        return;
    }
    const int64_t hv = it.hv0;
    T *Qs = reinterpret_cast<T *>(smem);
    T *Ks = Qs + C * K;
    float *Gs = reinterpret_cast<float *>(smem + L::GOFF);
    float *As = reinterpret_cast<float *>(smem), *Ts = As + C * LD; /* after the products */
    float *bet = reinterpret_cast<float *>(smem + L::MAIN), *rk = bet + C, *rq = rk + C;
    unsigned char *rec = ws_head(p, hv, it.slot, KdaRec<K>::BYTES);
    const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;

    prep_issue_qk<K, T>(p, it, tid, Qs, Ks);

    /* Gam: the gate inputs into Gs, then thread d sums key d's log decays (log2 units) over the
     * chunk in place, each floored as chunk_prep floors them (exp(-40) resets any state, and every
     * difference stays finite); padding tokens decay 0. Rows of 16-byte aligned keys come with
     * cp.async, in flight together with Q and K (f32 in place, 16-bit staged at the end of each
     * row); other views element by element. Raw inputs then pass the gate formula
     * (kda_gate_rows). Its loops stay rolled: unrolled, the gate formula's code would not fit the
     * instruction cache. */
    const float *g32 = p.g ? p.g : (p.a_dtype == GDN_DTYPE_F32 ? static_cast<const float *>(p.a) : nullptr);
    const int64_t gs_b = p.g ? p.g_b : p.a_b, gs_t = p.g ? p.g_t : p.a_t, gs_h = p.g ? p.g_h : p.a_h;
    const int64_t gs_r = p.g ? p.g_r : p.a_r, goff = it.sq.row * gs_b + it.t0 * gs_t + hv * gs_h;
    const bool rows16 = gs_r == 1 && (reinterpret_cast<uintptr_t>(p.g ? p.g : p.a) & 15) == 0;
    bool staged16 = false; /* 16-bit raw gates staged in Gs rows (kda_stage_gates16) */
    if (g32 && rows16 && ((gs_b | gs_t | gs_h) & 3) == 0) {
        constexpr int GC4 = K / 4, GRP = 128 / GC4;
        const int ch = tid % GC4, r0 = tid / GC4;
        const float *src = g32 + goff + r0 * gs_t + 4 * ch;
#pragma unroll 4
        for (int r = r0; r < C; r += GRP, src += GRP * gs_t)
            cp_async16(Gs + r * GLD + 4 * ch, r < it.cl ? src : g32, r < it.cl ? 16 : 0);
        cp_async_commit();
    } else if (g32) {
        kda_load_gates(g32, goff, gs_t, gs_r, it.cl, K, tid, Gs, GLD);
    } else if (rows16 && ((gs_b | gs_t | gs_h) & 7) == 0) {
        if (p.a_dtype == GDN_DTYPE_BF16)
            kda_stage_gates16<K, GLD>(static_cast<const __nv_bfloat16 *>(p.a), goff, gs_t, it.cl, tid, Gs);
        else
            kda_stage_gates16<K, GLD>(static_cast<const __half *>(p.a), goff, gs_t, it.cl, tid, Gs);
        staged16 = true;
    } else if (p.a_dtype == GDN_DTYPE_BF16) {
        kda_load_gates(static_cast<const __nv_bfloat16 *>(p.a), goff, gs_t, gs_r, it.cl, K, tid, Gs, GLD);
    } else {
        kda_load_gates(static_cast<const __half *>(p.a), goff, gs_t, gs_r, it.cl, K, tid, Gs, GLD);
    }
    if (tid < C) {
        float bv = 0.f;
        if (tid < it.cl) {
            bv = load_elem(p.beta, p.beta_dtype, it.sq.row * p.be_b + (it.t0 + tid) * p.be_t + hv * p.be_h);
            if (p.beta_from_logits)
                bv = gate_beta(bv, p.allow_neg_eigval);
        }
        bet[tid] = bv;
    }
    cp_async_wait<0>();
    unit_sync(bar);
    if (!p.g) {
        if (staged16 && p.a_dtype == GDN_DTYPE_BF16)
            kda_gate_rows<K, GLD, __nv_bfloat16>(p, hv, it.cl, tid, Gs);
        else if (staged16)
            kda_gate_rows<K, GLD, __half>(p, hv, it.cl, tid, Gs);
        else
            kda_gate_rows<K, GLD, float>(p, hv, it.cl, tid, Gs);
        unit_sync(bar);
    }
    if (tid < K) {
        /* Key d's running sum over the chunk, in place, in log2 units (the gate formula wrote them
         * floored; precomputed g is scaled and floored here). */
        const int d = tid;
        float acc = 0.f;
        if (p.g) {
#pragma unroll 8
            for (int r = 0; r < it.cl; ++r) {
                const float g2 = Gs[r * GLD + d] * LOG2E;
                acc += g2 < G_FLOOR2 ? G_FLOOR2 : g2;
                Gs[r * GLD + d] = acc;
            }
        } else {
#pragma unroll 8
            for (int r = 0; r < it.cl; ++r) {
                acc += Gs[r * GLD + d];
                Gs[r * GLD + d] = acc;
            }
        }
        for (int r = it.cl; r < C; ++r)
            Gs[r * GLD + d] = acc;
    }

    /* Row norms: two threads per row, half the columns each, lanes l and l + 16 of warp w on row 16 w + l:
     * each 8-lane phase of a 16-byte load then reads 8 rows, whose swizzled chunks cover the 32 banks once
     * (with the halves of a row in adjacent lanes, both hit the same banks). */
    {
        const int r = 16 * warp + (lane & 15), half = lane >> 4;
        float sq = 0.f, sk = 0.f;
#pragma unroll
        for (int ch = half * KC / 2; ch < (half + 1) * KC / 2; ++ch) {
            const uint4 qv = *reinterpret_cast<const uint4 *>(Qs + swz<KC>(r, 8 * ch));
            const uint4 kv = *reinterpret_cast<const uint4 *>(Ks + swz<KC>(r, 8 * ch));
            const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w}, kw[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float2 a = Mma16<T>::unpack(qw[e]), b = Mma16<T>::unpack(kw[e]);
                sq += a.x * a.x + a.y * a.y;
                sk += b.x * b.x + b.y * b.y;
            }
        }
        sq += __shfl_xor_sync(0xffffffffu, sq, 16);
        sk += __shfl_xor_sync(0xffffffffu, sk, 16);
        if (half == 0) {
            rq[r] = p.l2norm ? 1.f / sqrtf(sq + 1e-6f) : 1.f;
            rk[r] = p.l2norm ? 1.f / sqrtf(sk + 1e-6f) : 1.f;
        }
    }
    unit_sync(bar);

    /* The record's images and exp(Gam_C). A thread takes one 16-byte chunk column ch of its rows
     * and writes all three tiles' chunks there at once: Q~ and K~ share their 2^Gam, K~ and K^
     * share the k-norm-scaled K, and exp(Gam_C) of the chunk's keys stays in registers. The rows
     * go to the warps unevenly (kda_img_rows), against the products below, where warp w takes
     * w + 1 blocks: the barrier after them then waits less on warp 3. */
    {
        using KR = KdaRec<K>;
        constexpr int RSTEP = 32 / KC; /* rows of a warp step */
        const int ch = lane % KC, r0 = kda_img_rows(warp) + lane / KC, r1 = kda_img_rows(warp + 1);
        const float *gc = Gs + (C - 1) * GLD + 8 * ch;
        float gcv[8];
        {
            const float4 c0 = *reinterpret_cast<const float4 *>(gc), c1 = *reinterpret_cast<const float4 *>(gc + 4);
            gcv[0] = c0.x, gcv[1] = c0.y, gcv[2] = c0.z, gcv[3] = c0.w;
            gcv[4] = c1.x, gcv[5] = c1.y, gcv[6] = c1.z, gcv[7] = c1.w;
        }
        unsigned char *img = rec + KR::IMG + (uint32_t)(ch >> 3) * gdn_sm90::BOX_BYTES;
        /* Lanes 4-7 of each 8 read the second half of their 8 keys first: each 8-lane phase of a
         * 16-byte load then covers all 32 banks once (in key order, lanes 0 and 4 would meet). */
        const int sw = (ch >> 2) & 1;
#pragma unroll 1
        for (int r = r0; r < r1; r += RSTEP) {
            const uint4 qv = *reinterpret_cast<const uint4 *>(Qs + swz<KC>(r, 8 * ch));
            const uint4 kv = *reinterpret_cast<const uint4 *>(Ks + swz<KC>(r, 8 * ch));
            const float4 ga = *reinterpret_cast<const float4 *>(Gs + r * GLD + 8 * ch + 4 * sw);
            const float4 gb = *reinterpret_cast<const float4 *>(Gs + r * GLD + 8 * ch + 4 - 4 * sw);
            const float4 g0 = sw ? gb : ga, g1 = sw ? ga : gb;
            const float e[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
            const float fq = p.scale * rq[r], fk = rk[r];
            const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w}, kw[4] = {kv.x, kv.y, kv.z, kv.w};
            uint32_t wq[4], wk[4], wu[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 qf = Mma16<T>::unpack(qw[j]), kf = Mma16<T>::unpack(kw[j]);
                const float d0 = fast_exp2(e[2 * j]), d1 = fast_exp2(e[2 * j + 1]);
                const float u0 = fast_exp2(gcv[2 * j] - e[2 * j]), u1 = fast_exp2(gcv[2 * j + 1] - e[2 * j + 1]);
                const float k0 = fk * kf.x, k1 = fk * kf.y;
                wq[j] = Mma16<T>::pack(fq * qf.x * d0, fq * qf.y * d1);
                wk[j] = Mma16<T>::pack(k0 * d0, k1 * d1);
                wu[j] = Mma16<T>::pack(k0 * u0, k1 * u1);
            }
            unsigned char *dst = img + gdn_sm90::box_offset(r, (ch & 7) * 8);
            *reinterpret_cast<uint4 *>(dst) = make_uint4(wq[0], wq[1], wq[2], wq[3]);
            *reinterpret_cast<uint4 *>(dst + KR::TILE) = make_uint4(wk[0], wk[1], wk[2], wk[3]);
            *reinterpret_cast<uint4 *>(dst + 2 * KR::TILE) = make_uint4(wu[0], wu[1], wu[2], wu[3]);
        }
        if (tid < K)
            reinterpret_cast<float *>(rec + KR::GC)[tid] = fast_exp2(Gs[(C - 1) * GLD + tid]);
        if (tid < C)
            reinterpret_cast<float *>(rec + KR::BETA)[tid] = bet[tid];
    }

    /* The decayed products of block row w (see the file comment). */
    const int m = lane >> 3, r8 = lane & 7, i0 = 16 * warp;
    float span = 0.f;
    for (int d = lane; d < K; d += 32)
        span = fmaxf(span, fmaxf(Gs[i0 * GLD + d] - Gs[(i0 + 8) * GLD + d], Gs[(i0 + 8) * GLD + d] - Gs[(i0 + 15) * GLD + d]));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        span = fmaxf(span, __shfl_xor_sync(0xffffffffu, span, off));
    /* false for NaN too: the CUDA-core path */
    const bool diag_tc = TUNE_KDA_PREP_OVERLAP > 0 || span <= kda_span_max<T>();
    const int anchor = diag_tc ? i0 + 8 : i0, nblk = diag_tc ? warp + 1 : warp;
    float kk[8][4], qk[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            kk[i][e] = qk[i][e] = 0.f;
    /* Two key chunks a step: their fragment loads and scalings overlap (139 registers at K = 128,
     * which kda_prep_kernel's launch bounds leave room for). */
#pragma unroll 2
    for (int kc = 0; kc < K / 16; ++kc) {
        const int c0 = 16 * kc + 2 * t;
        const float2 ga0 = *reinterpret_cast<const float2 *>(Gs + anchor * GLD + c0);
        const float2 ga1 = *reinterpret_cast<const float2 *>(Gs + anchor * GLD + c0 + 8);
        uint32_t ak[4], aq[4];
        ldsm_x4(ak, smem_u32(Ks + swz<KC>(i0 + (m & 1) * 8 + r8, 16 * kc + (m >> 1) * 8)));
        ldsm_x4(aq, smem_u32(Qs + swz<KC>(i0 + (m & 1) * 8 + r8, 16 * kc + (m >> 1) * 8)));
        /* A fragments: a[0] (row g, cols c0, c0 + 1), a[1] (row g + 8), a[2] / a[3] (cols + 8). */
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = i0 + g + 8 * (e & 1), col = c0 + 8 * (e >> 1);
            const float2 gr = *reinterpret_cast<const float2 *>(Gs + row * GLD + col);
            const float2 ga = e >> 1 ? ga1 : ga0;
            ak[e] = scale_pair<T>(ak[e], gr.x - ga.x, gr.y - ga.y);
            aq[e] = scale_pair<T>(aq[e], gr.x - ga.x, gr.y - ga.y);
        }
#pragma unroll
        for (int nn = 0; nn < 4; ++nn) {
            if (nn >= nblk)
                break;
            uint32_t b[4];
            ldsm_x4(b, smem_u32(Ks + swz<KC>(16 * nn + (m >> 1) * 8 + r8, 16 * kc + (m & 1) * 8)));
            /* b[0] (token 16 nn + g, cols c0, c0 + 1), b[1] (cols + 8), b[2] / b[3] (token + 8). */
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = 16 * nn + g + 8 * (e >> 1), col = c0 + 8 * (e & 1);
                const float2 gr = *reinterpret_cast<const float2 *>(Gs + row * GLD + col);
                const float2 ga = e & 1 ? ga1 : ga0;
                b[e] = scale_pair<T>(b[e], ga.x - gr.x, ga.y - gr.y);
            }
            Mma16<T>::mma(kk[2 * nn], ak, b[0], b[1]);
            Mma16<T>::mma(kk[2 * nn + 1], ak, b[2], b[3]);
            Mma16<T>::mma(qk[2 * nn], aq, b[0], b[1]);
            Mma16<T>::mma(qk[2 * nn + 1], aq, b[2], b[3]);
        }
    }
    if (!diag_tc) {
        /* The diagonal block on CUDA cores: this thread's entries (i, j), i >= j, of column tiles
         * 2 w and 2 w + 1, each a sum over the keys of 2^(Gam_i - Gam_j) k_j (k_i, q_i). */
        float dk[2][4], dq[2][4];
#pragma unroll 1
        for (int u = 0; u < 8; ++u) {
            const int nt = u >> 2, hrow = (u >> 1) & 1, e = u & 1;
            const int i = i0 + g + 8 * hrow, j = i0 + 8 * nt + 2 * t + e;
            float sk = 0.f, sq = 0.f;
            if (i >= j) {
#pragma unroll 1
                for (int ch = 0; ch < KC; ++ch) {
                    const uint4 kiv = *reinterpret_cast<const uint4 *>(Ks + swz<KC>(i, 8 * ch));
                    const uint4 qiv = *reinterpret_cast<const uint4 *>(Qs + swz<KC>(i, 8 * ch));
                    const uint4 kjv = *reinterpret_cast<const uint4 *>(Ks + swz<KC>(j, 8 * ch));
                    const uint32_t ki[4] = {kiv.x, kiv.y, kiv.z, kiv.w}, qi[4] = {qiv.x, qiv.y, qiv.z, qiv.w},
                                   kj[4] = {kjv.x, kjv.y, kjv.z, kjv.w};
#pragma unroll
                    for (int w2 = 0; w2 < 4; ++w2) {
                        const int d = 8 * ch + 2 * w2;
                        const float2 a = Mma16<T>::unpack(ki[w2]), q2 = Mma16<T>::unpack(qi[w2]),
                                     b = Mma16<T>::unpack(kj[w2]);
                        const float d0 = b.x * fast_exp2(Gs[i * GLD + d] - Gs[j * GLD + d]);
                        const float d1 = b.y * fast_exp2(Gs[i * GLD + d + 1] - Gs[j * GLD + d + 1]);
                        sk += a.x * d0 + a.y * d1;
                        sq += q2.x * d0 + q2.y * d1;
                    }
                }
            }
            /* Registers by compile-time index: a select per slot. */
#pragma unroll
            for (int v = 0; v < 8; ++v)
                if (v == u) {
                    dk[v >> 2][v & 3] = sk;
                    dq[v >> 2][v & 3] = sq;
                }
        }
        /* Into the diagonal tiles, by compile-time indices (the fragments stay in registers). */
#pragma unroll
        for (int nn = 0; nn < 4; ++nn)
            if (nn == warp)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        kk[2 * nn + nt][e] = dk[nt][e];
                        qk[2 * nn + nt][e] = dq[nt][e];
                    }
    }
    unit_sync(bar); /* Q, K and Gam consumed: A and T take their place */

    float rqr[2];
#pragma unroll
    for (int hrow = 0; hrow < 2; ++hrow)
        rqr[hrow] = p.scale * rq[i0 + g + 8 * hrow];
    const int pm_row8 = 8 * (warp + 1) * 8;
    uint32_t *pm_out = reinterpret_cast<uint32_t *>(reinterpret_cast<T *>(rec + TRI_BYTES) + tri_chunk(i0 + g, 0) * 8 + 2 * t);
    mask_rows<true, LD, T, false>(kk, qk, bet, bet, rk, rqr, As, pm_out, pm_row8, warp, g, t);
    prep_inverse_tb<LD, T>(As, Ts, bet, reinterpret_cast<T *>(rec), tid, bar);
    if (p.ready) {
        /* launch_coop: publish the record; the barrier also frees the unit's shared memory for its
         * next item (units run only with p.ready set). */
        __threadfence();
        unit_sync(bar);
        prep_release(p, (int)hv, 1, it.slot, tid);
    }
}

/* One item per CTA; with launch_coop (p.ready) the first items of coop_item's order (the prefix
 * that runs before the cooperative grid), else the items in slot order. K = 128: shared memory
 * holds an SM to three CTAs, so registers may grow to 168 a thread; K = 64 (35.6 KB a CTA) keeps
 * the 128 of four CTAs an SM, as does the occupancy probe. */
template <int K, typename T>
__global__ void __launch_bounds__(128, K == 128 && TUNE_KDA_PREP_OVERLAP == 0 ? 3 : 4) kda_prep_kernel(const ChunkParams p)
{
    /* sm_90's 228 KB of shared memory an SM, 1 KB of it reserved a CTA (the occupancy probe,
     * TUNE_KDA_PREP_OVERLAP, runs four) */
    static_assert(K != 128 || TUNE_KDA_PREP_OVERLAP > 0 || 4 * (KdaPrepSmem<K>::BYTES + 1024) > 228 * 1024,
                  "K = 128: three CTAs an SM by shared memory");
    extern __shared__ __align__(128) unsigned char smem[];
    const int64_t i = blockIdx.x;
    kda_prep_chunk<K, T>(p, p.ready ? coop_item(p, i, p.HV) : i, threadIdx.x, smem, 0);
}

} /* namespace gdn_chunk */

#endif /* GDN_SM90_KDA_PREP_CUH */
