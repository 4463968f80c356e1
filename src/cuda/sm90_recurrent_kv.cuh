/*
 * sm90_recurrent_kv.cuh - the recurrent forward for KV states with the value index contiguous
 * ([N, HV, K, V]: FLA's and transformers' layout), laid out for that layout: a CTA owns 32 value
 * columns of one (sequence, value head), warp w the keys 32 w .. 32 w + 31 of them, lane l column
 * 32 blockIdx.x + l. A warp's state access at one key is 32 contiguous elements (128 bytes in f32),
 * a lane holds 32 state values, and the dots S^T k and S^T q of each token are summed over the
 * warps through shared memory. bf16 states in one-token calls take 64 columns a CTA, two a lane as
 * bf16 pairs (KvCols). Everything else is the generic kernel's: the staged tokens (stage_tokens),
 * the start slot (sequence_start), per-step states and pool slots, skipped sequences. One-token
 * steps are bound by the state bytes in flight, so the register count sets the speed: at K = 128
 * the kernel is held to 72 registers (seven CTAs an SM; ptxas alone gives KDA 96, five;
 * kv_max_registers), and KDA loads the state after staging its first tokens, whose per-key gates
 * would otherwise be live beside it (dev/decode/README.md, "KV states").
 */
#ifndef GDN_SM90_RECURRENT_KV_CUH
#define GDN_SM90_RECURRENT_KV_CUH

#include "sm90_recurrent_kernel.cuh"

namespace {

constexpr int KV_COLS = 32; /* value columns of a CTA per column of a lane */

/* A lane's share of the state: 32 keys of CPL value columns. CPL = 1: f32 values. CPL = 2 (bf16
 * states, one-token calls): bf16 pairs, both columns in one register, rounded at each write, so a
 * lane keeps twice the state bytes in flight for its registers; in a one-token call that single
 * rounding is the one the state's store makes anyway (kv_pairs_fit). */
template <typename StateT, int CPL> struct KvCols {
    static_assert(CPL == 1, "two columns a lane: bf16 states only");
    float x[32];
    __device__ __forceinline__ float get(int i, int) const { return x[i]; }
    __device__ __forceinline__ void set(int i, float a, float) { x[i] = a; }
    __device__ __forceinline__ void load(const StateT *at, int i) { x[i] = gdn_to_f32<StateT>(*at); }
    __device__ __forceinline__ void store(StateT *at, int i) const { *at = gdn_from_f32<StateT>(x[i]); }
};
template <> struct KvCols<__nv_bfloat16, 2> {
    __nv_bfloat162 x[32];
    __device__ __forceinline__ float get(int i, int c) const { return c ? __high2float(x[i]) : __low2float(x[i]); }
    __device__ __forceinline__ void set(int i, float a, float b) { x[i] = __floats2bfloat162_rn(a, b); }
    __device__ __forceinline__ void load(const __nv_bfloat16 *at, int i) { x[i] = *(const __nv_bfloat162 *)at; }
    __device__ __forceinline__ void store(__nv_bfloat16 *at, int i) const { *(__nv_bfloat162 *)at = x[i]; }
};

/* This lane's columns of the state at base (keys 32 warp .. + 31); ok false: nothing. Element
 * (key, col) is at key * st.sk + col * st.sv (CPL = 2: sv = 1, pairs 4-byte aligned). */
template <typename StateT, int CPL>
__device__ __forceinline__ void kv_store_cols(StateT *base, const StateStrides &st, int warp, int col, bool ok,
                                              const KvCols<StateT, CPL> &s)
{
    if (!ok)
        return;
#pragma unroll
    for (int i = 0; i < 32; i++)
        s.store(base + (int64_t)(32 * warp + i) * st.sk + col * st.sv, i);
}

template <typename StateT, int CPL>
__device__ __forceinline__ void kv_load_cols(const StateT *src, const StateStrides &st, int warp, int col, bool ok,
                                             KvCols<StateT, CPL> &s)
{
#pragma unroll
    for (int i = 0; i < 32; i++) {
        if (src && ok)
            s.load(src + (int64_t)(32 * warp + i) * st.sk + col * st.sv, i);
        else
            s.set(i, 0.0f, 0.0f);
    }
}

/* The decay of key `key` at staged token j: KDA's per-key exp(g), else the token's e. */
template <bool KDA, typename Stage>
__device__ __forceinline__ float kv_decay(const Stage &st, int j, int key, float e)
{
    if constexpr (KDA)
        return st.ek[j][key];
    else
        return e;
}

/* The register cap of an instance: 72 at K = 128 (seven CTAs an SM), 80 at K = 64 and for GDN at
 * K = 256 (ptxas alone gives its bf16 state 144, one CTA an SM), 128 for KDA at K = 256, where a
 * lower cap spills; with bf16 pairs 96 (128 at K = 256), below which they spill more. Any cap
 * changes ptxas's choices, so every instance gets one (none spills more than 16 bytes with one
 * column a lane, 32 with pairs). */
template <int K, bool KDA, int CPL> constexpr int kv_max_registers()
{
    if constexpr (CPL == 2)
        return K == 256 ? 128 : 96;
    return K == 128 ? 72 : K == 256 && KDA ? 128 : 80;
}

/* K / 32 warps of 32 keys; grid (V / (32 CPL) rounded up, HV, sequences). */
template <int K, typename StateT, typename InT, bool KDA, int CPL = 1>
__global__ void __launch_bounds__(K) __maxnreg__((kv_max_registers<K, KDA, CPL>())) recurrent_fwd_kv_kernel(const RecurrentParams p)
{
    static_assert(K % 32 == 0 && K <= 256, "a warp per 32 keys, at most 8 warps");
    constexpr int WARPS = K / 32, COLS = KV_COLS * CPL;
    __shared__ StageOf<K, COLS, KDA> st;
    __shared__ float red[2][2][WARPS][COLS]; /* token parity, (S^T k, S^T q), warp, column */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row_base = blockIdx.x * COLS, c0 = CPL * lane, col = row_base + c0;
    const int cols = (int)(p.V - row_base < COLS ? p.V - row_base : COLS);
    const bool col_ok = c0 < cols; /* CPL = 2: V is a multiple of 64 (kv_pairs_fit) */
    const int hv = blockIdx.y, h = hv / (int)p.G;
    /* KDA loads the state after the first chunk's staging (header); GDN's loads overlap it */
    constexpr bool LATE = KDA;

    for (int64_t n = blockIdx.z; n < p.N; n += gridDim.z) {
        const SeqRange sr = sequence_range(p, n);
        const int64_t b = sr.b, bos = sr.bos, len = sr.eos - sr.bos, packed0 = sr.packed0;
        KvCols<StateT, CPL> s;
        StateT *src;
        const bool live = sequence_start(p, n, hv, &src); /* uniform over the CTA */
        if (!live) {
#pragma unroll
            for (int i = 0; i < 32; i++)
                s.set(i, 0.0f, 0.0f);
            for (int64_t t = 0; t < len; t++) {
                if (warp == 0 && col_ok) {
#pragma unroll
                    for (int c = 0; c < CPL; c++)
                        token_o<InT>(p, b, bos + t, hv)[(col + c) * p.o_s[3]] = gdn_from_f32<InT>(0.0f);
                }
                if (p.step_states)
                    kv_store_cols(state_at<StateT>(p.step_states, p.st_step, packed0 + t, hv),
                                  p.st_step, warp, col, col_ok, s);
            }
            if (p.final_state)
                kv_store_cols(state_at<StateT>(p.final_state, p.st_fin, n, hv), p.st_fin, warp, col, col_ok, s);
            continue;
        }

        if (!LATE || len == 0)
            kv_load_cols(src, p.st_in, warp, col, col_ok, s);

        for (int64_t t0 = 0; t0 < len; t0 += TOKEN_CHUNK) {
            const int tc = (int)(len - t0 < TOKEN_CHUNK ? len - t0 : TOKEN_CHUNK);
            __syncthreads(); /* the previous chunk (or sequence) is no longer read */
            stage_tokens<K, InT, 1, 0, false>(p, st, b, bos + t0, tc, h, hv, row_base, cols);
            if (LATE && t0 == 0)
                kv_load_cols(src, p.st_in, warp, col, col_ok, s);
            __syncthreads();
            for (int j = 0; j < tc; j++) {
                const int64_t t = t0 + j;
                const int par = (int)(t & 1);
                /* S' = diag(e) S; this warp's share of S'^T k and S'^T q. CPL = 1 keeps S' in s; the
                 * pairs recompute it below (the same products), so that s is rounded once a token. */
                const float e = st.e[j];
                float dk[CPL], dq[CPL];
#pragma unroll
                for (int c = 0; c < CPL; c++)
                    dk[c] = dq[c] = 0.0f;
#pragma unroll
                for (int i = 0; i < 32; i++) {
                    const int key = 32 * warp + i;
                    const float d = kv_decay<KDA>(st, j, key, e);
#pragma unroll
                    for (int c = 0; c < CPL; c++) {
                        const float sp = s.get(i, c) * d;
                        if constexpr (CPL == 1)
                            s.set(i, sp, 0.0f);
                        dk[c] = fmaf(sp, st.k[j][key], dk[c]);
                        dq[c] = fmaf(sp, st.q[j][key], dq[c]);
                    }
                }
#pragma unroll
                for (int c = 0; c < CPL; c++) {
                    red[par][0][warp][c0 + c] = dk[c];
                    red[par][1][warp][c0 + c] = dq[c];
                }
                __syncthreads(); /* red[par] whole; the reads of red[par] two tokens back are done */
                float u[CPL];
#pragma unroll
                for (int c = 0; c < CPL; c++) {
                    float kvs = 0.0f, qs = 0.0f;
#pragma unroll
                    for (int w = 0; w < WARPS; w++) { /* one order in every warp: one u per column */
                        kvs += red[par][0][w][c0 + c];
                        qs += red[par][1][w][c0 + c];
                    }
                    /* u = beta (v - S'^T k); o = S_new^T q = S'^T q + u (k . q); S_new = S' + k u^T */
                    u[c] = st.beta[j] * (st.v[j][c0 + c] - kvs);
                    if (warp == 0 && col_ok)
                        token_o<InT>(p, b, bos + t, hv)[(col + c) * p.o_s[3]] =
                            gdn_from_f32<InT>(fmaf(u[c], st.kq[j], qs));
                }
#pragma unroll
                for (int i = 0; i < 32; i++) {
                    const int key = 32 * warp + i;
                    if constexpr (CPL == 1) {
                        s.set(i, fmaf(st.k[j][key], u[0], s.get(i, 0)), 0.0f);
                    } else { /* the decay read again after the barrier: not the f32 S' of the first loop */
                        const float d = kv_decay<KDA>(st, j, key, st.e[j]);
                        s.set(i, fmaf(st.k[j][key], u[0], s.get(i, 0) * d),
                              fmaf(st.k[j][key], u[CPL - 1], s.get(i, 1) * d));
                    }
                }
                if (p.step_states)
                    kv_store_cols(state_at<StateT>(p.step_states, p.st_step, packed0 + t, hv),
                                  p.st_step, warp, col, col_ok, s);
                if (p.inplace_state && p.idx_2d && t < p.idx_cols) {
                    const int64_t slot = p.state_indices[n * p.idx_s_n + t * p.idx_s_t];
                    if (slot_valid(p, slot))
                        kv_store_cols(state_at<StateT>(p.state_in, p.st_in, slot, hv), p.st_in, warp, col, col_ok, s);
                }
            }
        }
        if (p.final_state)
            kv_store_cols(state_at<StateT>(p.final_state, p.st_fin, n, hv), p.st_fin, warp, col, col_ok, s);
        if (p.inplace_state && !p.idx_2d && src)
            kv_store_cols(src, p.st_in, warp, col, col_ok, s);
    }
}

} /* namespace */

#endif /* GDN_SM90_RECURRENT_KV_CUH */
