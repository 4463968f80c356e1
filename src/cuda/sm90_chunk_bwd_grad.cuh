/*
 * sm90_chunk_bwd_grad.cuh - bwd_grad: every chunk's gradients; bwd_gate: the gate parameters' sums.
 */
#ifndef GDN_SM90_CHUNK_BWD_GRAD_CUH
#define GDN_SM90_CHUNK_BWD_GRAD_CUH

#include "sm90_chunk_bwd_common.cuh"

namespace gdn_bwd {

/* dq or dk from its gradient in the normalised space (summed over the group): dx = r (dxn - xn
 * (xn . dxn)) with xn = r x (r = 1 without the L2 norm), on the warp's key columns cc .. cc + K / 2
 * of rows i0, i1; the row dots over both column halves meet in dotp ([2][C]), summed in a fixed
 * order. Every thread of the CTA calls it (one barrier). */
template <typename T, int NKH, int LDK>
__device__ __forceinline__ void grad_l2_store(const float (&gx)[NKH][4], const T *Xs, const float *r, float *dotp,
                                              int half, int cc, int i0, int i1, int t, int cl, const gdn_view &dx,
                                              int64_t row, int64_t t0, int64_t head, bool l2norm)
{
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < NKH; ++nt) {
        const int d = cc + 8 * nt + 2 * t;
        s0 += gdn_to_f32(Xs[i0 * LDK + d]) * gx[nt][0] + gdn_to_f32(Xs[i0 * LDK + d + 1]) * gx[nt][1];
        s1 += gdn_to_f32(Xs[i1 * LDK + d]) * gx[nt][2] + gdn_to_f32(Xs[i1 * LDK + d + 1]) * gx[nt][3];
    }
    s0 = row_sum4(s0);
    s1 = row_sum4(s1);
    if (t == 0) {
        dotp[half * C + i0] = s0;
        dotp[half * C + i1] = s1;
    }
    __syncthreads();
    const float r0 = r[i0], r1 = r[i1];
    const float p0 = l2norm ? r0 * r0 * (dotp[i0] + dotp[C + i0]) : 0.f;
    const float p1 = l2norm ? r1 * r1 * (dotp[i1] + dotp[C + i1]) : 0.f;
    T *base = static_cast<T *>(dx.data) + row * dx.s[0] + t0 * dx.s[1] + head * dx.s[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int i = hr ? i1 : i0;
        if (i >= cl)
            continue;
        const float ri = hr ? r1 : r0, pi = hr ? p1 : p0;
#pragma unroll
        for (int nt = 0; nt < NKH; ++nt) {
            const int d = cc + 8 * nt + 2 * t;
            const float a = ri * (gx[nt][2 * hr] - gdn_to_f32(Xs[i * LDK + d]) * pi);
            const float b = ri * (gx[nt][2 * hr + 1] - gdn_to_f32(Xs[i * LDK + d + 1]) * pi);
            T *dst = base + i * dx.s[1] + d * dx.s[3];
            if (dx.s[3] == 1 && ((uintptr_t)dst & 3) == 0) {
                *reinterpret_cast<uint32_t *>(dst) = Mma16<T>::pack(a, b);
            } else {
                dst[0] = gdn_from_f32<T>(a);
                dst[dx.s[3]] = gdn_from_f32<T>(b);
            }
        }
    }
}

template <typename T, int K, int V> struct GradSmem {
    static constexpr int LDK = Pitch<K>::LD, LDV = Pitch<V>::LD, LD64 = Pitch<64>::LD;
    /* Qs, Ks [C][LDK]; dOs, Wb, Vnb [C][LDV]; Ss (S^T) [V][LDK], dSs [K][LDV]; Tm, Pm [C][LD64]; then one region
     * holding in turn dS' lo [K][LDV], dVn lo [C][LDV], then Eq, Ek, F1, F2 [C][LD64]; f32: rows,
     * column partials [4][C], row partials [2][3][C] (one set per column half), reduction [8], the
     * L2-norm row dots of q and k [2][2][C]. */
    static constexpr int LO = K * LDV > 4 * C * LD64 ? K * LDV : 4 * C * LD64;
    static constexpr int HALF = 2 * C * LDK + 3 * C * LDV + V * LDK + K * LDV + 2 * C * LD64 + LO;
    static constexpr int BYTES = HALF * 2 + (R_COUNT * C + 4 * C + 6 * C + 8 + 4 * C) * 4;
};

constexpr int GRAD_THREADS = 256;

/* Eight warps: warp w owns rows 16 (w % 4) of every result and half of its columns (h = w / 4):
 * value columns h V / 2, key columns h K / 2, chunk columns 32 h. Two warps per scheduler hide
 * each other's latencies. Results that a later product contracts over (dU, Eq, Ek, F1, F2) go
 * through shared memory, whole, since each warp holds only half of their columns. One CTA per
 * (chunk slot, key head) walks the G value heads of the group: q and k are loaded once, and dq, dk
 * are summed in registers instead of through a workspace pass. */
template <typename T, int K, int V>
__global__ void __launch_bounds__(GRAD_THREADS, 1) bwd_grad_kernel(const BwdParams p)
{
    using SM = GradSmem<T, K, V>;
    constexpr int LDK = SM::LDK, LDV = SM::LDV, LD64 = SM::LD64, NTH = GRAD_THREADS;
    constexpr int NVH = V / 16, NKH = K / 16, NJH = C / 16; /* n8 tiles of a warp's column half */
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int64_t h = blockIdx.x % p.H, slot = blockIdx.x / p.H;
    const Loc L = locate(p, slot);
    if (L.cl == 0) {
        for (int64_t j = tid; j < p.G; j += NTH) /* a padding slot adds nothing to any head's sums */
            p.gpart[(h * p.G + j) * p.slots + slot] = make_float2(0.f, 0.f);
        return;
    }
    T *Qs = reinterpret_cast<T *>(smem);
    T *Ks = Qs + C * LDK;
    T *dOs = Ks + C * LDK;
    T *Wb = dOs + C * LDV; /* W, then dVn hi, then dU */
    T *Vnb = Wb + C * LDV;
    T *Ss = Vnb + C * LDV;
    T *dSs = Ss + V * LDK;
    T *Tm = dSs + K * LDV;
    T *Pm = Tm + C * LD64;
    T *Lo = Pm + C * LD64; /* dS' lo, then dVn lo, then Eq, Ek, F1, F2 */
    T *Eq = Lo, *Ek = Lo + C * LD64, *F1 = Lo + 2 * C * LD64, *F2 = Lo + 3 * C * LD64;
    float *rows = reinterpret_cast<float *>(Lo + SM::LO);
    float *colp = rows + R_COUNT * C; /* [4][C] */
    float *rres = colp + 4 * C;       /* [2][3][C]: dGam row terms, dbeta, S'-term of dGam_C */
    float *red = rres + 6 * C;
    float *dotq = red + 8, *dotk = dotq + 2 * C;

    const int rgrp = warp & 3, half = warp >> 2;
    const int m0 = 16 * rgrp, i0 = m0 + g, i1 = i0 + 8;
    const int cv = half * (V / 2), ckc = half * (K / 2), cj = half * (C / 2);
    const float *ck = rows + R_CK * C, *cu = rows + R_CU * C, *gam = rows + R_GAM * C, *bet = rows + R_BETA * C;
    const float *rk = rows + R_RK * C, *rq = rows + R_RQ * C, *glog = rows + R_GLOG * C, *gu = rows + R_GU * C;
    /* dq, dk in the normalised space, summed over the group's value heads (the warp's key columns). */
    float dqs[NKH][4], dks[NKH][4];
    zero_acc(dqs);
    zero_acc(dks);

    for (int64_t hv = h * p.G; hv < (h + 1) * p.G; ++hv) {
        const bool first = hv == h * p.G;
        float2 *gpart = p.gpart + hv * p.slots + slot;
        const unsigned char *rec = rec_of(p, hv, slot);
        const size_t tile = ((size_t)hv * p.slots + slot) * K * V;
        const T *dS_ws = static_cast<const T *>(p.dS) + 2 * tile;
        /* Four commit groups in the order of first use, so that the products start while the later
         * tiles are still in flight (one CTA per SM: nothing else hides the copies): K (first head
         * only), S, v and the rows; T; dS' (hi, lo), Pm and dO; Q (first head only). */
        if (first)
            load_tile<T, K, LDK, NTH>(Ks, p.k, L.row, L.t0, h, L.cl, 0, tid);
        load_mat<V, K, K, LDK>(Ss, static_cast<const T *>(p.S) + tile, 0, tid, NTH);
        load_tile<T, V, LDV, NTH>(Wb, p.v, L.row, L.t0, hv, L.cl, 0, tid);
        load_f32(rows, rec + REC_ROWS, R_COUNT * C, tid, NTH);
        gdn_sm90::cp_async_commit();
        load_mat<C, C, C, LD64>(Tm, reinterpret_cast<const T *>(rec), 0, tid, NTH);
        gdn_sm90::cp_async_commit();
        load_mat<K, V, V, LDV>(dSs, dS_ws, 0, tid, NTH);
        load_mat<K, V, V, LDV>(Lo, dS_ws + K * V, 0, tid, NTH);
        load_mat<C, C, C, LD64>(Pm, reinterpret_cast<const T *>(rec) + C * C, 0, tid, NTH);
        load_tile<T, V, LDV, NTH>(dOs, p.d_o, L.row, L.t0, hv, L.cl, 0, tid);
        gdn_sm90::cp_async_commit();
        if (first)
            load_tile<T, K, LDK, NTH>(Qs, p.q, L.row, L.t0, h, L.cl, 0, tid);
        gdn_sm90::cp_async_commit();
        gdn_sm90::cp_async_wait<3>();
        __syncthreads();

        const float gC = rows[R_GC * C];
        float rg0 = 0.f, rg1 = 0.f; /* this thread's share of dGam of rows i0, i1 */

        /* X = V - ck (K S), kept in registers; W = beta X in Wb (each thread its own elements). */
        float x[NVH][4];
        zero_acc(x);
        warp_mm<T, NVH, K, false, true, LDK, LDK>(x, Ks, m0, Ss, cv, lane);
#pragma unroll
        for (int nt = 0; nt < NVH; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = e < 2 ? i0 : i1, col = cv + 8 * nt + 2 * t + (e & 1);
                x[nt][e] = gdn_to_f32(Wb[i * LDV + col]) - ck[i] * x[nt][e];
            }
        __syncwarp();
        store_acc<T, NVH, LDV>(Wb + cv, x, m0, lane, bet[i0], bet[i1]);
        gdn_sm90::cp_async_wait<2>(); /* T */
        __syncthreads();
        float acc[NVH][4];
        zero_acc(acc);
        warp_mm<T, NVH, C, false, false, LD64, LDV>(acc, Tm, m0, Wb, cv, lane); /* Vn = T W */
        store_acc<T, NVH, LDV>(Vnb + cv, acc, m0, lane, 1.f, 1.f);
        gdn_sm90::cp_async_wait<1>(); /* dS', Pm, dO */
        __syncthreads();
        /* K dS' and dU = T^T dVn take the hi + lo parts of dS' and dVn: their bf16 rounding would
         * otherwise dominate the error of dbeta (the two terms below cancel in part). */
        zero_acc(acc);
        warp_mm<T, NVH, K, false, false, LDK, LDV>(acc, Ks, m0, dSs, cv, lane); /* K dS' */
        warp_mm<T, NVH, K, false, false, LDK, LDV>(acc, Ks, m0, Lo, cv, lane);
#pragma unroll
        for (int nt = 0; nt < NVH; ++nt) {
            acc[nt][0] *= cu[i0];
            acc[nt][1] *= cu[i0];
            acc[nt][2] *= cu[i1];
            acc[nt][3] *= cu[i1];
        }
        warp_mm<T, NVH, C, true, false, LD64, LDV>(acc, Pm, m0, dOs, cv, lane); /* dVn = cu K dS' + Pm^T dO */
        store_acc<T, NVH, LDV>(Wb + cv, acc, m0, lane, 1.f, 1.f);
        __syncthreads(); /* dS' lo read by all */
#pragma unroll
        for (int nt = 0; nt < NVH; ++nt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int r = m0 + g + 8 * hr, col = cv + 8 * nt + 2 * t;
                const float2 hi = Mma16<T>::unpack(*reinterpret_cast<const uint32_t *>(Wb + r * LDV + col));
                *reinterpret_cast<uint32_t *>(Lo + r * LDV + col) =
                    Mma16<T>::pack(acc[nt][2 * hr] - hi.x, acc[nt][2 * hr + 1] - hi.y);
            }
        __syncthreads();
        zero_acc(acc);
        warp_mm<T, NVH, C, true, false, LD64, LDV>(acc, Tm, m0, Wb, cv, lane); /* dU = T^T dVn */
        warp_mm<T, NVH, C, true, false, LD64, LDV>(acc, Tm, m0, Lo, cv, lane);
        float db0 = 0.f, db1 = 0.f; /* dbeta: dU . X, then sum_j dA_ij B_ij */
#pragma unroll
        for (int nt = 0; nt < NVH; ++nt) {
            db0 += acc[nt][0] * x[nt][0] + acc[nt][1] * x[nt][1];
            db1 += acc[nt][2] * x[nt][2] + acc[nt][3] * x[nt][3];
        }
        __syncthreads(); /* dVn (hi in Wb, lo in Lo) read by all before dU, Eq, Ek, F1, F2 take their place */
        store_acc<T, NVH, LDV>(Wb + cv, acc, m0, lane, 1.f, 1.f);
        gdn_sm90::cp_async_wait<0>(); /* Q */
        __syncthreads();

        /* The 64 x 64 terms on the warp's chunk columns: dP = dO Vn^T with Q K^T (Pm's part),
         * dA = -(dU Vn^T) with K K^T (A's part). */
        float colc[NJH][2]; /* this thread's column shares of dGam (columns cj + 8 nt + 2 t + e) */
        {
            float dp[NJH][4], qk[NJH][4];
            zero_acc(dp);
            zero_acc(qk);
            warp_mm<T, NJH, V, false, true, LDV, LDV>(dp, dOs, m0, Vnb, cj, lane);
            warp_mm<T, NJH, K, false, true, LDK, LDK>(qk, Qs, m0, Ks, cj, lane);
#pragma unroll
            for (int nt = 0; nt < NJH; ++nt) {
                colc[nt][0] = colc[nt][1] = 0.f;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e < 2 ? i0 : i1, j = cj + 8 * nt + 2 * t + (e & 1);
                    const float D = j <= i ? decay(glog[i] - glog[j]) : 0.f;
                    const float em = p.scale * dp[nt][e] * D; /* dL/d(Qn_i . Kn_j) */
                    const float term = em * rq[i] * rk[j] * qk[nt][e]; /* dP_ij Pm_ij */
                    if (e < 2)
                        rg0 += term;
                    else
                        rg1 += term;
                    colc[nt][e & 1] -= term;
                    qk[nt][e] = em * rk[j]; /* Eq */
                    dp[nt][e] = em * rq[i]; /* Ek */
                }
            }
            store_acc<T, NJH, LD64>(Eq + cj, qk, m0, lane, 1.f, 1.f);
            store_acc<T, NJH, LD64>(Ek + cj, dp, m0, lane, 1.f, 1.f);
        }
        {
            float da[NJH][4], kk[NJH][4];
            zero_acc(da);
            zero_acc(kk);
            warp_mm<T, NJH, V, false, true, LDV, LDV>(da, Wb, m0, Vnb, cj, lane);
            warp_mm<T, NJH, K, false, true, LDK, LDK>(kk, Ks, m0, Ks, cj, lane);
#pragma unroll
            for (int nt = 0; nt < NJH; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e < 2 ? i0 : i1, j = cj + 8 * nt + 2 * t + (e & 1);
                    const float D = j < i ? decay(glog[i] - glog[j]) : 0.f;
                    const float dA = -da[nt][e];
                    const float bv = rk[i] * rk[j] * kk[nt][e] * D; /* B_ij */
                    const float term = dA * bet[i] * bv;             /* dA_ij A_ij */
                    if (e < 2) {
                        db0 += dA * bv;
                        rg0 += term;
                    } else {
                        db1 += dA * bv;
                        rg1 += term;
                    }
                    colc[nt][e & 1] -= term;
                    const float f = bet[i] * dA * D; /* dL/d(Kn_i . Kn_j) */
                    kk[nt][e] = f * rk[j];           /* F1 */
                    da[nt][e] = f * rk[i];           /* F2 */
                }
            store_acc<T, NJH, LD64>(F1 + cj, kk, m0, lane, 1.f, 1.f);
            store_acc<T, NJH, LD64>(F2 + cj, da, m0, lane, 1.f, 1.f);
        }
        /* Column shares: sum over the rows of the warp (lanes of equal t), then one row group per warp. */
#pragma unroll
        for (int nt = 0; nt < NJH; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float v = colc[nt][e];
                v += __shfl_xor_sync(0xffffffffu, v, 4);
                v += __shfl_xor_sync(0xffffffffu, v, 8);
                v += __shfl_xor_sync(0xffffffffu, v, 16);
                if (g == 0)
                    colp[rgrp * C + cj + 8 * nt + 2 * t + e] = v;
            }
        __syncthreads(); /* Eq, Ek, F1, F2 whole */

        /* dQn = scale gam (dO S^T) + Eq K, on the warp's key columns. */
        {
            float q1[NKH][4];
            zero_acc(q1);
            warp_mm<T, NKH, V, false, false, LDV, LDK>(q1, dOs, m0, Ss, ckc, lane);
            const float s0 = p.scale * gam[i0], s1 = p.scale * gam[i1];
#pragma unroll
            for (int nt = 0; nt < NKH; ++nt) {
                const int d = ckc + 8 * nt + 2 * t;
                rg0 += s0 * rq[i0] * (gdn_to_f32(Qs[i0 * LDK + d]) * q1[nt][0] + gdn_to_f32(Qs[i0 * LDK + d + 1]) * q1[nt][1]);
                rg1 += s1 * rq[i1] * (gdn_to_f32(Qs[i1 * LDK + d]) * q1[nt][2] + gdn_to_f32(Qs[i1 * LDK + d + 1]) * q1[nt][3]);
                q1[nt][0] *= s0;
                q1[nt][1] *= s0;
                q1[nt][2] *= s1;
                q1[nt][3] *= s1;
            }
            warp_mm<T, NKH, C, false, false, LD64, LDK>(q1, Eq, m0, Ks, ckc, lane);
#pragma unroll
            for (int nt = 0; nt < NKH; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dqs[nt][e] += q1[nt][e];
        }
        /* dKn = gu (Vn dS'^T) - gam beta (dU S^T) + F1 K + F2^T K + Ek^T Q. dGam takes Kn . dKn of the
         * first two terms apart: the X term adds to dGam_i, the S' term subtracts from it and adds to
         * dGam_C. */
        float gc0 = 0.f, gc1 = 0.f; /* dGam_C's share from the S' term */
        {
            float k1[NKH][4], k2[NKH][4];
            zero_acc(k1);
            zero_acc(k2);
            warp_mm<T, NKH, V, false, true, LDV, LDV>(k1, Vnb, m0, dSs, ckc, lane);
            warp_mm<T, NKH, V, false, false, LDV, LDK>(k2, Wb, m0, Ss, ckc, lane);
            const float x0 = -gam[i0] * bet[i0], x1 = -gam[i1] * bet[i1];
            float d10 = 0.f, d11 = 0.f, d20 = 0.f, d21 = 0.f;
#pragma unroll
            for (int nt = 0; nt < NKH; ++nt) {
                const int d = ckc + 8 * nt + 2 * t;
                const float ka = gdn_to_f32(Ks[i0 * LDK + d]), kb = gdn_to_f32(Ks[i0 * LDK + d + 1]);
                const float kc = gdn_to_f32(Ks[i1 * LDK + d]), kd = gdn_to_f32(Ks[i1 * LDK + d + 1]);
                k1[nt][0] *= gu[i0];
                k1[nt][1] *= gu[i0];
                k1[nt][2] *= gu[i1];
                k1[nt][3] *= gu[i1];
                k2[nt][0] *= x0;
                k2[nt][1] *= x0;
                k2[nt][2] *= x1;
                k2[nt][3] *= x1;
                d10 += ka * k1[nt][0] + kb * k1[nt][1];
                d11 += kc * k1[nt][2] + kd * k1[nt][3];
                d20 += ka * k2[nt][0] + kb * k2[nt][1];
                d21 += kc * k2[nt][2] + kd * k2[nt][3];
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    k1[nt][e] += k2[nt][e];
            }
            /* Kn . dKn = rk K . dKn */
            rg0 += rk[i0] * (d20 - d10);
            rg1 += rk[i1] * (d21 - d11);
            gc0 += rk[i0] * d10;
            gc1 += rk[i1] * d11;
            warp_mm<T, NKH, C, false, false, LD64, LDK>(k1, F1, m0, Ks, ckc, lane);
            warp_mm<T, NKH, C, true, false, LD64, LDK>(k1, F2, m0, Ks, ckc, lane);
            warp_mm<T, NKH, C, true, false, LD64, LDK>(k1, Ek, m0, Qs, ckc, lane);
#pragma unroll
            for (int nt = 0; nt < NKH; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dks[nt][e] += k1[nt][e];
        }
        /* Row totals of the warp's columns (the four lanes of a row), then <dS', S> over the CTA in a
         * fixed order. */
        rg0 = row_sum4(rg0);
        rg1 = row_sum4(rg1);
        db0 = row_sum4(db0);
        db1 = row_sum4(db1);
        gc0 = row_sum4(gc0);
        gc1 = row_sum4(gc1);
        if (t == 0) {
            float *rr = rres + half * 3 * C;
            rr[i0] = rg0;
            rr[i1] = rg1;
            rr[C + i0] = db0;
            rr[C + i1] = db1;
            rr[2 * C + i0] = gc0;
            rr[2 * C + i1] = gc1;
        }
        /* <S, dS'> from S^T and dS' by 8 x 8 blocks: ldmatrix gives a lane the same elements of a
         * block of S^T and (transposing) of dS'^T, four blocks an instruction, conflict-free. */
        float dot = 0.f;
        for (int it = warp; it < (V / 8) * (K / 8) / 4; it += NTH / 32) {
            const int bi = 4 * it + (lane >> 3), vb = bi % (V / 8), db = bi / (V / 8), r = lane & 7;
            uint32_t sa[4], sb[4];
            gdn_sm90::ldsm_x4(sa, gdn_sm90::smem_u32(Ss + (vb * 8 + r) * LDK + db * 8));
            gdn_sm90::ldsm_x4_t(sb, gdn_sm90::smem_u32(dSs + (db * 8 + r) * LDV + vb * 8));
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                const float2 a = Mma16<T>::unpack(sa[m]), b = Mma16<T>::unpack(sb[m]);
                dot += a.x * b.x + a.y * b.y;
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            dot += __shfl_xor_sync(0xffffffffu, dot, off);
        if (lane == 0)
            red[warp] = dot;
        __syncthreads();

        /* dGam per row, dg_t = sum over rows i >= t (warp 0, two rows a lane), the gate chain. */
        if (warp == 0) {
            const float *r0 = rres, *r1 = rres + 3 * C;
            float dgam[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = 2 * lane + e;
                dgam[e] = (r0[i] + r1[i]) + ((colp[i] + colp[C + i]) + (colp[2 * C + i] + colp[3 * C + i]));
            }
            if (lane == 31) {
                float gsum = 0.f;
                for (int i = 0; i < C; ++i)
                    gsum += r0[2 * C + i] + r1[2 * C + i];
                dgam[1] += gC * (((red[0] + red[1]) + (red[2] + red[3])) + ((red[4] + red[5]) + (red[6] + red[7]))) + gsum;
            }
            /* Suffix sums: inclusive scan of the pairs from the top lane down. */
            float s = dgam[0] + dgam[1];
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const float u = __shfl_down_sync(0xffffffffu, s, off);
                if (lane + off < 32)
                    s += u;
            }
            const float dgv[2] = {s, s - dgam[0]};
            float pa = 0.f, pb = 0.f;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = 2 * lane + e;
                if (i >= L.cl)
                    continue;
                const int64_t tok = L.t0 + i;
                const float dgt = rows[R_LIVE * C + i] != 0.f ? dgv[e] : 0.f;
                float dbt = r0[C + i] + r1[C + i];
                const int64_t bo = L.row * p.beta.s[0] + tok * p.beta.s[1] + hv * p.beta.s[2];
                if (p.beta_from_logits)
                    dbt *= gate_beta_grad(load_elem(p.beta.data, p.beta.dtype, bo), p.allow_neg_eigval);
                store_elem(p.dbeta.data, p.dbeta.dtype, L.row * p.dbeta.s[0] + tok * p.dbeta.s[1] + hv * p.dbeta.s[2], dbt);
                if (p.g.data) {
                    static_cast<float *>(p.dg.data)[L.row * p.dg.s[0] + tok * p.dg.s[1] + hv * p.dg.s[2]] = dgt;
                } else {
                    /* g = -exp(A_log) softplus(x): dg/dx = -exp(A_log) softplus'(x). */
                    const float xin = load_elem(p.a.data, p.a.dtype, L.row * p.a.s[0] + tok * p.a.s[1] + hv * p.a.s[2]) +
                                      (p.dt_bias ? p.dt_bias[hv * p.dt_h] : 0.f);
                    const float slope = gate_softplus_slope(xin, p.sp_beta, p.sp_threshold);
                    const float A = expf(p.A_log[hv]);
                    const float dx = dgt * -A * slope;
                    store_elem(p.da.data, p.da.dtype, L.row * p.da.s[0] + tok * p.da.s[1] + hv * p.da.s[2], dx);
                    if (dgt != 0.f) /* a floored token adds nothing, even where g itself overflows to -inf */
                        pa += dgt * gate_log_decay(xin, 0.f, p.A_log[hv], p.sp_beta, p.sp_threshold);
                    pb += dx;
                }
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                pa += __shfl_xor_sync(0xffffffffu, pa, off);
                pb += __shfl_xor_sync(0xffffffffu, pb, off);
            }
            if (lane == 0)
                *gpart = make_float2(pa, pb);
        }
        __syncthreads(); /* every read of this head's tiles done before the next head's copies */
    } /* value heads of the group */
    grad_l2_store<T, NKH, LDK>(dqs, Qs, rq, dotq, half, ckc, i0, i1, t, L.cl, p.dq, L.row, L.t0, h, p.l2norm);
    grad_l2_store<T, NKH, LDK>(dks, Ks, rk, dotk, half, ckc, i0, i1, t, L.cl, p.dk, L.row, L.t0, h, p.l2norm);
}



/* dA_log[hv], ddt_bias[hv]: the slots' partials in a fixed order (strided shares, then a fixed tree). */
__global__ void __launch_bounds__(256) bwd_gate_kernel(const BwdParams p)
{
    __shared__ float sa[256], sb[256];
    const int64_t hv = blockIdx.x;
    float a = 0.f, b = 0.f;
    for (int64_t s = threadIdx.x; s < p.slots; s += 256) {
        const float2 v = p.gpart[hv * p.slots + s];
        a += v.x;
        b += v.y;
    }
    sa[threadIdx.x] = a;
    sb[threadIdx.x] = b;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w) {
            sa[threadIdx.x] += sa[threadIdx.x + w];
            sb[threadIdx.x] += sb[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (p.dA_log.data)
            store_elem(p.dA_log.data, p.dA_log.dtype, hv * p.dA_log.s[0], sa[0]);
        if (p.ddt_bias.data)
            store_elem(p.ddt_bias.data, p.ddt_bias.dtype, hv * p.ddt_bias.s[0], sb[0]);
    }
}

} /* namespace gdn_bwd */

#endif /* GDN_SM90_CHUNK_BWD_GRAD_CUH */
