/*
 * sm90_chunk_bwd_prep.cuh - bwd_prep: the record of every (chunk slot, value head).
 */
#ifndef GDN_SM90_CHUNK_BWD_PREP_CUH
#define GDN_SM90_CHUNK_BWD_PREP_CUH

#include "sm90_chunk_bwd_common.cuh"

namespace gdn_bwd {

template <typename T, int K> struct PrepBwdSmem {
    static constexpr int LDK = Pitch<K>::LD;
    static constexpr int LDF = C + 4; /* prep_inverse's f32 pitch */
    static constexpr int BYTES = 2 * C * LDK * 2 + 2 * C * LDF * 4 + 4 * C * 4;
};

template <typename T, int K>
__global__ void __launch_bounds__(128) bwd_prep_kernel(const BwdParams p)
{
    using S = PrepBwdSmem<T, K>;
    constexpr int LDK = S::LDK, LDF = S::LDF;
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int64_t hv = blockIdx.x % p.HV, slot = blockIdx.x / p.HV;
    const Loc L = locate(p, slot);
    if (L.cl == 0)
        return;
    const int64_t h = hv / p.G;
    T *Qs = reinterpret_cast<T *>(smem);
    T *Ks = Qs + C * LDK;
    float *As = reinterpret_cast<float *>(Ks + C * LDK);
    float *Ts = As + C * LDF;
    float *glog = Ts + C * LDF, *bet = glog + C, *rk = bet + C, *rq = rk + C;

    load_tile<T, K, LDK, 128>(Qs, p.q, L.row, L.t0, h, L.cl, 0, tid);
    load_tile<T, K, LDK, 128>(Ks, p.k, L.row, L.t0, h, L.cl, 0, tid);
    unsigned char *rec = rec_of(p, hv, slot);
    float *rows = reinterpret_cast<float *>(rec + REC_ROWS);
    if (tid < C) {
        float gv = 0.f, bv = 0.f, live = 1.f;
        if (tid < L.cl) {
            const int64_t tok = L.t0 + tid;
            if (p.g.data) {
                gv = static_cast<const float *>(p.g.data)[L.row * p.g.s[0] + tok * p.g.s[1] + hv * p.g.s[2]];
            } else {
                const float a = load_elem(p.a.data, p.a.dtype, L.row * p.a.s[0] + tok * p.a.s[1] + hv * p.a.s[2]);
                gv = gate_log_decay(a, p.dt_bias ? p.dt_bias[hv * p.dt_h] : 0.f, p.A_log[hv], p.sp_beta,
                                    p.sp_threshold);
            }
            /* The forward's floor (chunk_prep): below it the decay is a reset, and its derivative is 0. */
            if (gv < G_FLOOR) {
                gv = G_FLOOR;
                live = 0.f;
            }
            bv = load_elem(p.beta.data, p.beta.dtype, L.row * p.beta.s[0] + tok * p.beta.s[1] + hv * p.beta.s[2]);
            if (p.beta_from_logits)
                bv = gate_beta(bv, p.allow_neg_eigval);
        }
        glog[tid] = gv;
        bet[tid] = bv;
        rows[R_LIVE * C + tid] = live;
        rows[R_BETA * C + tid] = bv;
    }
    loads_done();
    __syncthreads();
    /* Norm factors, a warp per row; the cumsum by warp 0 after. */
    for (int r = warp; r < C; r += 4) {
        float sq = 0.f, sk = 0.f;
        for (int d = lane; d < K; d += 32) {
            const float qv = gdn_to_f32(Qs[r * LDK + d]), kv = gdn_to_f32(Ks[r * LDK + d]);
            sq += qv * qv;
            sk += kv * kv;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            sq += __shfl_xor_sync(0xffffffffu, sq, off);
            sk += __shfl_xor_sync(0xffffffffu, sk, off);
        }
        if (lane == 0) {
            /* chunk_prep's expression, so that forward and backward normalise identically */
            rq[r] = p.l2norm ? 1.f / sqrtf(sq + 1e-6f) : 1.f;
            rk[r] = p.l2norm ? 1.f / sqrtf(sk + 1e-6f) : 1.f;
        }
    }
    if (warp == 0) {
        const float2 cs = gdn_chunk::warp_cumsum_pairs(glog[2 * lane], glog[2 * lane + 1], lane);
        __syncwarp();
        glog[2 * lane] = cs.x;
        glog[2 * lane + 1] = cs.y;
    }
    __syncthreads();
    if (tid < C)
        gdn_chunk::store_bwd_rows(rows, tid, glog[tid], glog[C - 1], rk[tid], rq[tid], p.scale);

    /* A (strictly lower) and Pm (lower, with the diagonal) from K K^T and Q K^T, warp w rows 16 w... */
    float kk[8][4], qk[8][4];
    zero_acc(kk);
    zero_acc(qk);
    warp_mm<T, 8, K, false, true, LDK, LDK>(kk, Ks, 16 * warp, Ks, 0, lane);
    warp_mm<T, 8, K, false, true, LDK, LDK>(qk, Qs, 16 * warp, Ks, 0, lane);
    T *pm = reinterpret_cast<T *>(rec) + C * C;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int i = 16 * warp + g + 8 * hr, j = 8 * nt + 2 * t;
            float av[2], pv[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int jj = j + e;
                const float D = jj <= i ? decay(glog[i] - glog[jj]) : 0.f;
                av[e] = jj < i ? bet[i] * rk[i] * rk[jj] * kk[nt][2 * hr + e] * D : 0.f;
                pv[e] = p.scale * rq[i] * rk[jj] * qk[nt][2 * hr + e] * D;
            }
            *reinterpret_cast<float2 *>(As + i * LDF + j) = make_float2(av[0], av[1]);
            *reinterpret_cast<uint32_t *>(pm + i * C + j) = Mma16<T>::pack(pv[0], pv[1]);
        }
    gdn_chunk::prep_inverse<LDF>(As, Ts, tid, 0);
    gdn_chunk::store_lower<LDF, T>(Ts, reinterpret_cast<T *>(rec), tid);
}

} /* namespace gdn_bwd */

#endif /* GDN_SM90_CHUNK_BWD_PREP_CUH */
