/*
 * sm90_recurrent_kv.cuh - the recurrent forward for KV states with the value index contiguous
 * ([N, HV, K, V]: FLA's and transformers' layout), laid out for that layout: a CTA owns 32 value
 * columns of one (sequence, value head), warp w the keys 32 w .. 32 w + 31 of them, lane l column
 * 32 blockIdx.x + l. A warp's state access at one key is 32 contiguous elements (128 bytes in f32),
 * a lane holds 32 state values, and the dots S^T k and S^T q of each token are summed over the
 * warps through shared memory. Everything else is the generic kernel's: the staged tokens
 * (stage_tokens), the start slot (sequence_start), per-step states and pool slots, skipped
 * sequences. One-token steps are bound by the state bytes in flight, so the register count sets
 * the speed: at K = 128 the kernel is held to 72 registers (seven CTAs an SM; ptxas alone gives
 * KDA 96, five), and KDA loads the state after staging its first tokens, whose per-key gates
 * would otherwise be live beside it (dev/decode/README.md, "KV states").
 */
#ifndef GDN_SM90_RECURRENT_KV_CUH
#define GDN_SM90_RECURRENT_KV_CUH

#include "sm90_recurrent_kernel.cuh"

namespace {

constexpr int KV_COLS = 32; /* value columns of a CTA: one per lane */

/* This lane's column of the state at base (keys 32 warp .. + 31, in s); col_ok false: nothing.
 * Element (key, col) is at key * st.sk + col * st.sv. */
template <typename StateT>
__device__ __forceinline__ void kv_store_col(StateT *base, const StateStrides &st, int warp, int col, bool col_ok,
                                             const float (&s)[32])
{
    if (!col_ok)
        return;
#pragma unroll
    for (int i = 0; i < 32; i++)
        base[(int64_t)(32 * warp + i) * st.sk + col * st.sv] = gdn_from_f32<StateT>(s[i]);
}

template <typename StateT>
__device__ __forceinline__ void kv_load_col(const StateT *src, const StateStrides &st, int warp, int col, bool col_ok,
                                            float (&s)[32])
{
#pragma unroll
    for (int i = 0; i < 32; i++)
        s[i] = src && col_ok ? gdn_to_f32<StateT>(src[(int64_t)(32 * warp + i) * st.sk + col * st.sv]) : 0.0f;
}

/* The register cap of an instance: 72 at K = 128 (seven CTAs an SM), 80 at K = 64 and for GDN at
 * K = 256 (ptxas alone gives its bf16 state 144, one CTA an SM), 128 for KDA at K = 256, where a
 * lower cap spills. Any cap changes ptxas's choices, so every instance gets one (none spills more
 * than 16 bytes). */
template <int K, bool KDA> constexpr int kv_max_registers() { return K == 128 ? 72 : K == 256 && KDA ? 128 : 80; }

/* K / 32 warps of 32 keys; grid (V / 32 rounded up, HV, sequences). */
template <int K, typename StateT, typename InT, bool KDA>
__global__ void __launch_bounds__(K) __maxnreg__((kv_max_registers<K, KDA>())) recurrent_fwd_kv_kernel(const RecurrentParams p)
{
    static_assert(K % 32 == 0 && K <= 256, "a warp per 32 keys, at most 8 warps");
    constexpr int WARPS = K / 32;
    __shared__ StageOf<K, KV_COLS, KDA> st;
    __shared__ float red[2][2][WARPS][KV_COLS]; /* token parity, (S^T k, S^T q), warp, column */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row_base = blockIdx.x * KV_COLS, col = row_base + lane;
    const int cols = (int)(p.V - row_base < KV_COLS ? p.V - row_base : KV_COLS);
    const bool col_ok = lane < cols;
    const int hv = blockIdx.y, h = hv / (int)p.G;
    /* KDA loads the state after the first chunk's staging (header); GDN's loads overlap it */
    constexpr bool LATE = KDA;

    for (int64_t n = blockIdx.z; n < p.N; n += gridDim.z) {
        const SeqRange sr = sequence_range(p, n);
        const int64_t b = sr.b, bos = sr.bos, len = sr.eos - sr.bos, packed0 = sr.packed0;
        float s[32];
        StateT *src;
        const bool live = sequence_start(p, n, hv, &src); /* uniform over the CTA */
        if (!live) {
#pragma unroll
            for (int i = 0; i < 32; i++)
                s[i] = 0.0f;
            for (int64_t t = 0; t < len; t++) {
                if (warp == 0 && col_ok)
                    token_o<InT>(p, b, bos + t, hv)[col * p.o_s[3]] = gdn_from_f32<InT>(0.0f);
                if (p.step_states)
                    kv_store_col((StateT *)p.step_states + (packed0 + t) * p.st_step.s0 + hv * p.st_step.s1,
                                 p.st_step, warp, col, col_ok, s);
            }
            if (p.final_state)
                kv_store_col((StateT *)p.final_state + n * p.st_fin.s0 + hv * p.st_fin.s1, p.st_fin, warp, col,
                             col_ok, s);
            continue;
        }

        if (!LATE || len == 0)
            kv_load_col(src, p.st_in, warp, col, col_ok, s);

        for (int64_t t0 = 0; t0 < len; t0 += TOKEN_CHUNK) {
            const int tc = (int)(len - t0 < TOKEN_CHUNK ? len - t0 : TOKEN_CHUNK);
            __syncthreads(); /* the previous chunk (or sequence) is no longer read */
            stage_tokens<K, InT, 1, 0, false>(p, st, b, bos + t0, tc, h, hv, row_base, cols);
            if (LATE && t0 == 0)
                kv_load_col(src, p.st_in, warp, col, col_ok, s);
            __syncthreads();
            for (int j = 0; j < tc; j++) {
                const int64_t t = t0 + j;
                const int par = (int)(t & 1);
                /* S' = diag(e) S; this warp's share of S'^T k and S'^T q */
                const float e = st.e[j];
                float dk = 0.0f, dq = 0.0f;
#pragma unroll
                for (int i = 0; i < 32; i++) {
                    const int key = 32 * warp + i;
                    if constexpr (KDA)
                        s[i] *= st.ek[j][key];
                    else
                        s[i] *= e;
                    dk = fmaf(s[i], st.k[j][key], dk);
                    dq = fmaf(s[i], st.q[j][key], dq);
                }
                red[par][0][warp][lane] = dk;
                red[par][1][warp][lane] = dq;
                __syncthreads(); /* red[par] whole; the reads of red[par] two tokens back are done */
                float kvs = 0.0f, qs = 0.0f;
#pragma unroll
                for (int w = 0; w < WARPS; w++) { /* one order in every warp: one u per column */
                    kvs += red[par][0][w][lane];
                    qs += red[par][1][w][lane];
                }
                /* u = beta (v - S'^T k); o = S_new^T q = S'^T q + u (k . q); S_new = S' + k u^T */
                const float u = st.beta[j] * (st.v[j][lane] - kvs);
                if (warp == 0 && col_ok)
                    token_o<InT>(p, b, bos + t, hv)[col * p.o_s[3]] =
                        gdn_from_f32<InT>(fmaf(u, st.kq[j], qs));
#pragma unroll
                for (int i = 0; i < 32; i++)
                    s[i] = fmaf(st.k[j][32 * warp + i], u, s[i]);
                if (p.step_states)
                    kv_store_col((StateT *)p.step_states + (packed0 + t) * p.st_step.s0 + hv * p.st_step.s1,
                                 p.st_step, warp, col, col_ok, s);
                if (p.inplace_state && p.idx_2d && t < p.idx_cols) {
                    const int64_t slot = p.state_indices[n * p.idx_s_n + t * p.idx_s_t];
                    if (slot_valid(p, slot))
                        kv_store_col((StateT *)p.state_in + slot * p.st_in.s0 + hv * p.st_in.s1, p.st_in, warp, col,
                                     col_ok, s);
                }
            }
        }
        if (p.final_state)
            kv_store_col((StateT *)p.final_state + n * p.st_fin.s0 + hv * p.st_fin.s1, p.st_fin, warp, col, col_ok, s);
        if (p.inplace_state && !p.idx_2d && src)
            kv_store_col(src, p.st_in, warp, col, col_ok, s);
    }
}

} /* namespace */

#endif /* GDN_SM90_RECURRENT_KV_CUH */
