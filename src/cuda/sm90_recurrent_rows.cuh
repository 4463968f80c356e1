/*
 * sm90_recurrent_rows.cuh - the small-batch recurrent forward kernel (decode latency path), for
 * VK state rows with K contiguous and 16-byte aligned. Launched by sm90_recurrent_fwd.cu when a
 * call has few (sequence, value head) pairs; bench/bench_decode.cu times its shapes directly.
 *
 * At B = 1..32 a call is a chain of latencies, not a stream of bytes: launch, the slot index, the
 * state, two reductions, the stores. This kernel keeps that chain to one dependent load before
 * the state and nothing between the state and the arithmetic:
 *   - no shared memory and no barriers: each lane group of 8 lanes owns whole rows (as in the
 *     other kernels: 16-byte pieces interleaved, RPL rows per lane) and computes what its rows
 *     need itself: the q / k norms over the group's own pieces (3 shuffle levels, the 8 lanes of
 *     a group hold all K keys) and the token's gates (a few scalar instructions per warp);
 *   - every load that does not depend on the slot (q, k, v, the gate inputs of the first token)
 *     is issued before the slot index is waited for, the state loads right after it, so the
 *     token arithmetic runs while the state is in flight;
 *   - the decay is applied directly (S <- e S + k u), the state stays in registers across tokens.
 * It serves any T (a token loop) and every option of the fast path, but its per-token work is
 * per warp, not per CTA, so the launcher sends it single-token calls only.
 */
#ifndef GDN_SM90_RECURRENT_ROWS_CUH
#define GDN_SM90_RECURRENT_ROWS_CUH

#include "sm90_recurrent_kernel.cuh"

/* Internal linkage: the library and the benchmark each compile their own copy. */
namespace {

/* One token's inputs as this lane needs them: its keys of q and k (raw), v of its rows, and the
 * raw gate inputs. Loads only: the arithmetic waits until the state loads are issued. */
template <int K, int EPL, int VE, int NV, int RPL> struct TokenIn {
    float q[EPL], k[EPL], v[RPL];
    float g;    /* g, or a + dt_bias */
    float beta; /* beta, or its logit */
};

/* q and k can be read in vector pieces of VE elements: keys contiguous, every piece aligned
 * (fused projections or an element stride may break either). */
template <typename InT, int VE> __device__ __forceinline__ bool inputs_vec(const RecurrentParams &p)
{
    const int64_t a = VE * (int64_t)sizeof(InT);
    bool ok = p.q_s[3] == 1 && p.k_s[3] == 1 && (uintptr_t)p.q % a == 0 && (uintptr_t)p.k % a == 0;
    for (int i = 0; i < 3; i++)
        ok = ok && p.q_s[i] % VE == 0 && p.k_s[i] % VE == 0;
    return ok;
}

template <int K, typename InT, int EPL, int VE, int NV, int RPL>
__device__ __forceinline__ void load_token(const RecurrentParams &p, bool vec_in, int64_t b, int64_t t, int h, int hv,
                                           const int *rows, const bool *row_ok, int gl,
                                           TokenIn<K, EPL, VE, NV, RPL> &in)
{
    const InT *q = (const InT *)p.q + b * p.q_s[0] + t * p.q_s[1] + h * p.q_s[2];
    const InT *k = (const InT *)p.k + b * p.k_s[0] + t * p.k_s[1] + h * p.k_s[2];
    const InT *v = (const InT *)p.v + b * p.v_s[0] + t * p.v_s[1] + hv * p.v_s[2];
    if (vec_in) {
#pragma unroll
        for (int c = 0; c < NV; c++) {
            const int key = (c * kLanesPerRow + gl) * VE;
            load_f32<InT, VE, true>(q + key, 1, &in.q[c * VE]);
            load_f32<InT, VE, true>(k + key, 1, &in.k[c * VE]);
        }
    } else {
#pragma unroll
        for (int c = 0; c < NV; c++) {
            const int64_t key = (c * kLanesPerRow + gl) * VE;
            load_f32<InT, VE, false>(q + key * p.q_s[3], p.q_s[3], &in.q[c * VE]);
            load_f32<InT, VE, false>(k + key * p.k_s[3], p.k_s[3], &in.k[c * VE]);
        }
    }
#pragma unroll
    for (int r = 0; r < RPL; r++)
        in.v[r] = row_ok[r] ? gdn_to_f32<InT>(v[(int64_t)rows[r] * p.v_s[3]]) : 0.0f;
    if (p.g)
        in.g = p.g[b * p.g_s[0] + t * p.g_s[1] + hv * p.g_s[2]];
    else
        in.g = load_any(p.a, p.a_dtype, b * p.a_s[0] + t * p.a_s[1] + hv * p.a_s[2]) +
               (p.dt_bias ? p.dt_bias[hv * p.dt_s] : 0.0f);
    in.beta = load_any(p.beta, p.beta_dtype, b * p.beta_s[0] + t * p.beta_s[1] + hv * p.beta_s[2]);
}

/* The loaded token made ready: q and k normalised (over the 8 lanes of the group, which hold all
 * K keys between them) and q scaled; *kq = k . q; *e = exp(g); *beta. Same formulas as
 * stage_tokens / token_gates. a_log: A_log[hv], loaded once per CTA. */
template <int K, int EPL, int VE, int NV, int RPL>
__device__ __forceinline__ void prepare_token(const RecurrentParams &p, float a_log, TokenIn<K, EPL, VE, NV, RPL> &in,
                                              float *kq, float *e, float *beta)
{
    float sq = 0.0f, sk = 0.0f, qk = 0.0f;
#pragma unroll
    for (int i = 0; i < EPL; i++) {
        sq = fmaf(in.q[i], in.q[i], sq);
        sk = fmaf(in.k[i], in.k[i], sk);
        qk = fmaf(in.q[i], in.k[i], qk);
    }
#pragma unroll
    for (int m = 1; m < kLanesPerRow; m *= 2) {
        sq += __shfl_xor_sync(0xffffffffu, sq, m);
        sk += __shfl_xor_sync(0xffffffffu, sk, m);
        qk += __shfl_xor_sync(0xffffffffu, qk, m);
    }
    float rq = p.scale, rk = 1.0f;
    if (p.use_qk_l2norm) {
        rq = p.scale / sqrtf(sq + 1e-6f);
        rk = 1.0f / sqrtf(sk + 1e-6f);
    }
#pragma unroll
    for (int i = 0; i < EPL; i++) {
        in.q[i] *= rq;
        in.k[i] *= rk;
    }
    *kq = qk * rq * rk;
    const float g = p.g ? in.g : -expf(a_log) * softplus(in.g, p.softplus_beta, p.softplus_threshold);
    *e = expf(g);
    float bt = in.beta;
    if (p.beta_from_logits) {
        bt = 1.0f / (1.0f + expf(-bt));
        if (p.allow_neg_eigval)
            bt *= 2.0f;
    }
    *beta = bt;
}

/* K: key head dim; StateT: state dtype in memory (VK rows, K contiguous, 16-byte aligned, as for
 * the fast path); InT: q/k/v/o dtype; RPL: rows per lane. A CTA of W warps owns 4 * RPL * W rows
 * of one (sequence, value head). Grid: (row blocks, HV, sequences), looping over sequences beyond
 * gridDim.z. */
template <int K, typename StateT, typename InT, int RPL>
__global__ void __launch_bounds__(128) recurrent_fwd_rows_kernel(const RecurrentParams p)
{
    constexpr int VE = 16 / sizeof(StateT);
    constexpr int NV = K / (kLanesPerRow * VE);
    constexpr int EPL = NV * VE;
    constexpr int ROWS_PER_WARP = 4 * RPL;
    static_assert(NV >= 1 && NV * VE * kLanesPerRow == K, "K must be a multiple of 8 state pieces");
    static_assert(RPL <= kLanesPerRow && (RPL & (RPL - 1)) == 0, "rows per lane: a power of two up to 8");

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = lane / kLanesPerRow, gl = lane % kLanesPerRow;
    const int hv = blockIdx.y;
    const int h = hv / (int)p.G;
    int rows[RPL];
    bool row_ok[RPL];
#pragma unroll
    for (int r = 0; r < RPL; r++) {
        rows[r] = (blockIdx.x * (blockDim.x >> 5) + warp) * ROWS_PER_WARP + r * 4 + group;
        row_ok[r] = rows[r] < p.V;
    }

    grid_dependency_sync();
    const float a_log = p.g ? 0.0f : p.A_log[hv];
    const bool vec_in = inputs_vec<InT, VE>(p);

    for (int64_t n = blockIdx.z; n < p.N; n += gridDim.z) {
        int64_t b = n, bos = 0, eos = p.T;
        if (p.cu_seqlens) {
            b = 0;
            bos = clamp64(p.cu_seqlens[n], 0, p.T);
            eos = clamp64(p.cu_seqlens[n + 1], bos, p.T);
        }
        const int64_t len = eos - bos;
        const int64_t packed0 = p.cu_seqlens ? bos : n * p.T;

        /* The first token's inputs, then the slot, then the state: all in flight together. */
        TokenIn<K, EPL, VE, NV, RPL> in;
        if (len > 0)
            load_token<K, InT, EPL, VE, NV, RPL>(p, vec_in, b, bos, h, hv, rows, row_ok, gl, in);
        StateT *src;
        if (!sequence_start(p, n, hv, &src)) { /* uniform over the CTA */
            zero_outputs<StateT, InT, RPL, EPL, VE, NV, true>(p, rows, row_ok, gl, b, bos, eos, packed0, n, hv);
            continue;
        }
        float s[RPL][EPL];
#pragma unroll
        for (int r = 0; r < RPL; r++) {
#pragma unroll
            for (int c = 0; c < NV; c++) {
                if (src && row_ok[r]) {
                    load_f32<StateT, VE, true>(src + (int64_t)rows[r] * p.st_in.sv + (c * kLanesPerRow + gl) * VE, 1,
                                               &s[r][c * VE]);
                } else {
#pragma unroll
                    for (int e = 0; e < VE; e++)
                        s[r][c * VE + e] = 0.0f;
                }
            }
        }

        InT *o = (InT *)p.o + b * p.o_s[0] + bos * p.o_s[1] + hv * p.o_s[2];
        for (int64_t t = 0; t < len; t++, o += p.o_s[1]) {
            if (t > 0)
                load_token<K, InT, EPL, VE, NV, RPL>(p, vec_in, b, bos + t, h, hv, rows, row_ok, gl, in);
            float kq, e, beta;
            prepare_token<K, EPL, VE, NV, RPL>(p, a_log, in, &kq, &e, &beta);

            /* S^T k and S^T q of the old state (the decay e applies to both) */
            float dk[RPL], dq[RPL];
#pragma unroll
            for (int r = 0; r < RPL; r++) {
                dk[r] = dq[r] = 0.0f;
#pragma unroll
                for (int i = 0; i < EPL; i++) {
                    dk[r] = fmaf(s[r][i], in.k[i], dk[r]);
                    dq[r] = fmaf(s[r][i], in.q[i], dq[r]);
                }
            }
#pragma unroll
            for (int m = 1; m < kLanesPerRow; m *= 2) {
#pragma unroll
                for (int r = 0; r < RPL; r++)
                    dk[r] += __shfl_xor_sync(0xffffffffu, dk[r], m);
            }
            reduce_scatter8<RPL>(dq, gl); /* dq[0]: row gl % RPL */

            /* u = beta (v - e S^T k); o = e (S^T q) + u (k . q); S <- e S + k u */
#pragma unroll
            for (int r = 0; r < RPL; r++) {
                const float u = beta * (in.v[r] - e * dk[r]);
                if (gl == r && row_ok[r])
                    o[(int64_t)rows[r] * p.o_s[3]] = gdn_from_f32<InT>(fmaf(e, dq[0], u * kq));
#pragma unroll
                for (int i = 0; i < EPL; i++)
                    s[r][i] = fmaf(in.k[i], u, e * s[r][i]);
            }

            if (p.step_states)
                store_rows<StateT, RPL, EPL, VE, NV, true>((StateT *)p.step_states + (packed0 + t) * p.st_step.s0 +
                                                               hv * p.st_step.s1,
                                                           p.st_step, rows, row_ok, gl, s, 1.0f);
            if (p.inplace_state && p.idx_2d && t < p.idx_cols) {
                const int64_t slot = p.state_indices[n * p.idx_s_n + t * p.idx_s_t];
                if (slot_valid(p, slot))
                    store_rows<StateT, RPL, EPL, VE, NV, true>((StateT *)p.state_in + slot * p.st_in.s0 +
                                                                   hv * p.st_in.s1,
                                                               p.st_in, rows, row_ok, gl, s, 1.0f);
            }
        }
        store_final<StateT, RPL, EPL, VE, NV, true>(p, src, n, hv, rows, row_ok, gl, s, 1.0f);
    }
}

} /* namespace */

#endif /* GDN_SM90_RECURRENT_ROWS_CUH */
