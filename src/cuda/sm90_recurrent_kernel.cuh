/*
 * sm90_recurrent_kernel.cuh - the recurrent forward kernel template (decode / multi-token verify,
 * GDN gates). Launched by sm90_recurrent_fwd.cu; bench/bench_decode.cu includes it as well to time
 * tile variants the launcher does not pick.
 *
 * Memory-bound: every call reads and writes each touched state (K x V per value head), so the
 * kernel is built to stream states at copy bandwidth. Tiling (VK layout, K contiguous):
 *   - a state row is one v with all K keys; a lane group of 8 lanes owns a row, each lane K/8
 *     keys in 16-byte pieces (4 f32 or 8 bf16) interleaved so that each load instruction of the
 *     group covers 128 contiguous bytes;
 *   - a warp is 4 lane groups and each lane works RPL rows at once (RPL = rows_per_lane below), so
 *     a warp owns 4 * RPL rows of one (sequence, value head); warps never talk to each other:
 *     no shared memory, no barriers; the CTA size is only a launch choice;
 *   - all state loads are issued before any arithmetic; the state stays in registers across the
 *     tokens of the sequence (T > 1), and per-step states are stored straight from registers.
 * Per token, one butterfly over the 8 lanes of a group reduces both dots of a row at once, using
 *     o = S_new^T q = e * (S^T q) + u * (k . q),   u = beta * (v - e * (S^T k)),
 * so the output needs no second reduction after the update. q/k norms and k.q are one more
 * 3-value butterfly per token, computed redundantly by every group (it costs the same shuffles).
 * Other layouts or unaligned strides take the same code with scalar loads (the "generic" path).
 */
#ifndef GDN_SM90_RECURRENT_KERNEL_CUH
#define GDN_SM90_RECURRENT_KERNEL_CUH

#include "sm90_recurrent_util.cuh"

/* Internal linkage: the library and the benchmark each compile their own copy. */
namespace {

constexpr int kLanesPerRow = 8;

/* Rows a lane works at once: about 32 state values in registers for f32 (8 x 16-byte loads in
 * flight per lane at K = 128), 64 for bf16 (its loads are half as large). */
template <int K, typename StateT> __host__ __device__ constexpr int default_rows_per_lane()
{
    return sizeof(StateT) == 4 ? (K >= 256 ? 1 : 256 / K) : (K >= 256 ? 2 : 4);
}

/* K: key head dim; StateT: state dtype in memory; InT: q/k/v/o dtype; RPL: rows per lane;
 * VEC: every state row and q/k is moved in 16-byte (state) pieces, else element by element with
 * any strides (the generic path: KV layout, sliced or unaligned tensors). */
template <int K, typename StateT, typename InT, int RPL, bool VEC>
__global__ void __launch_bounds__(128) recurrent_fwd_kernel(const RecurrentParams p)
{
    constexpr int VE = 16 / sizeof(StateT);     /* elements per 16-byte state piece */
    constexpr int NV = K / (kLanesPerRow * VE); /* pieces per lane per row */
    constexpr int EPL = NV * VE;                /* keys per lane */
    constexpr int ROWS_PER_WARP = 4 * RPL;
    static_assert(NV >= 1 && NV * VE * kLanesPerRow == K, "K must be a multiple of 8 state pieces");

    const int lane = threadIdx.x & 31;
    const int group = lane / kLanesPerRow;
    const int gl = lane % kLanesPerRow;
    const int64_t rows_per_cta = (int64_t)ROWS_PER_WARP * (blockDim.x / 32);

    /* blockIdx.x enumerates (sequence, value head, row block), row block fastest. */
    const int64_t row_blocks = (p.V + rows_per_cta - 1) / rows_per_cta;
    const int64_t bid = blockIdx.x;
    const int64_t hv = (bid / row_blocks) % p.HV;
    const int64_t n = bid / (row_blocks * p.HV);
    const int64_t h = hv / p.G;
    const int64_t row0 = (bid % row_blocks) * rows_per_cta + (threadIdx.x / 32) * ROWS_PER_WARP;
    if (row0 >= p.V)
        return; /* the whole warp leaves: no shuffle loses a partner */

    int64_t rows[RPL];
    bool row_ok[RPL];
#pragma unroll
    for (int r = 0; r < RPL; r++) {
        rows[r] = row0 + r * 4 + group;
        row_ok[r] = rows[r] < p.V;
    }

    /* Token range, clamped so that any cu_seqlens content stays in bounds. */
    int64_t b = n, bos = 0, eos = p.T;
    if (p.cu_seqlens) {
        b = 0;
        bos = clamp64(p.cu_seqlens[n], 0, p.T);
        eos = clamp64(p.cu_seqlens[n + 1], bos, p.T);
    }
    const int64_t len = eos - bos;
    const int64_t packed0 = p.cu_seqlens ? bos : n * p.T; /* packed index of the first token */

    /* Start state: a pool slot, a per-sequence state, or zeros. */
    bool skip = false;
    StateT *src = nullptr;
    if (p.state_indices) {
        int64_t col = 0;
        if (p.num_accepted_tokens) {
            const int64_t na = p.num_accepted_tokens[n];
            skip = na < 1 || na > p.idx_cols;
            col = skip ? 0 : na - 1;
        }
        if (!skip) {
            const int64_t slot = p.state_indices[n * p.idx_s_n + col * p.idx_s_t];
            skip = !slot_valid(p, slot);
            if (!skip)
                src = (StateT *)p.state_in + slot * p.st_in.s0 + hv * p.st_in.s1;
        }
    } else if (p.state_in) {
        src = (StateT *)p.state_in + n * p.st_in.s0 + hv * p.st_in.s1;
    }
    if (skip) {
        zero_outputs<StateT, InT, RPL, EPL, VE, NV, VEC>(p, rows, row_ok, gl, b, bos, eos, packed0, n, hv);
        return;
    }

    /* All state loads first: they are the whole cost of the kernel. */
    float s[RPL][EPL];
#pragma unroll
    for (int r = 0; r < RPL; r++) {
#pragma unroll
        for (int c = 0; c < NV; c++) {
            const int64_t key = (int64_t)(c * kLanesPerRow + gl) * VE;
            if (src && row_ok[r]) {
                load_f32<StateT, VE, VEC>(src + rows[r] * p.st_in.sv + key * p.st_in.sk, p.st_in.sk, &s[r][c * VE]);
            } else {
#pragma unroll
                for (int e = 0; e < VE; e++)
                    s[r][c * VE + e] = 0.0f;
            }
        }
    }

    /* The token loop's loads would each wait a full memory round trip: pull the first tokens'
     * inputs into L1 now, while the state loads are in flight. */
    for (int64_t t = 0; t < len && t < p.prefetch_tokens; t++)
        prefetch_token<InT, RPL, VE, NV>(p, b, bos + t, h, hv, rows, row_ok, gl);

    for (int64_t t = 0; t < len; t++) {
        const int64_t tok = bos + t;
        TokenIn<EPL, RPL> cur;
        load_token<InT, EPL, RPL, VE, NV, VEC>(p, b, tok, h, hv, rows, row_ok, gl, cur);

        /* |q|^2, |k|^2 and k.q over the 8 lanes of the row */
        float sq = 0.0f, sk = 0.0f, qk = 0.0f;
#pragma unroll
        for (int i = 0; i < EPL; i++) {
            sq = fmaf(cur.q[i], cur.q[i], sq);
            sk = fmaf(cur.k[i], cur.k[i], sk);
            qk = fmaf(cur.q[i], cur.k[i], qk);
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
        const float kq = qk * rq * rk;
#pragma unroll
        for (int i = 0; i < EPL; i++) {
            cur.q[i] *= rq;
            cur.k[i] *= rk;
        }
        const float e = expf(cur.g);

        /* S^T k and S^T q of the old state, reduced together */
        float dk[RPL], dq[RPL];
#pragma unroll
        for (int r = 0; r < RPL; r++) {
            dk[r] = 0.0f;
            dq[r] = 0.0f;
#pragma unroll
            for (int i = 0; i < EPL; i++) {
                dk[r] = fmaf(s[r][i], cur.k[i], dk[r]);
                dq[r] = fmaf(s[r][i], cur.q[i], dq[r]);
            }
        }
#pragma unroll
        for (int m = 1; m < kLanesPerRow; m *= 2) {
#pragma unroll
            for (int r = 0; r < RPL; r++) {
                dk[r] += __shfl_xor_sync(0xffffffffu, dk[r], m);
                dq[r] += __shfl_xor_sync(0xffffffffu, dq[r], m);
            }
        }

        InT *o = (InT *)p.o + b * p.o_s[0] + tok * p.o_s[1] + hv * p.o_s[2];
#pragma unroll
        for (int r = 0; r < RPL; r++) {
            const float u = cur.beta * (cur.v[r] - e * dk[r]);
#pragma unroll
            for (int i = 0; i < EPL; i++)
                s[r][i] = fmaf(e, s[r][i], cur.k[i] * u);
            if (gl == r && row_ok[r])
                o[rows[r] * p.o_s[3]] = gdn_from_f32<InT>(fmaf(e, dq[r], u * kq));
        }

        /* per-step states: the step_states row of this token, and the 2-D pool slot */
        if (p.step_states)
            store_rows<StateT, RPL, EPL, VE, NV, VEC>((StateT *)p.step_states + (packed0 + t) * p.st_step.s0 +
                                                     hv * p.st_step.s1,
                                                 p.st_step, rows, row_ok, gl, s);
        if (p.inplace_state && p.idx_2d && t < p.idx_cols) {
            const int64_t slot = p.state_indices[n * p.idx_s_n + t * p.idx_s_t];
            if (slot_valid(p, slot))
                store_rows<StateT, RPL, EPL, VE, NV, VEC>((StateT *)p.state_in + slot * p.st_in.s0 + hv * p.st_in.s1,
                                                     p.st_in, rows, row_ok, gl, s);
        }
    }

    if (p.final_state)
        store_rows<StateT, RPL, EPL, VE, NV, VEC>((StateT *)p.final_state + n * p.st_fin.s0 + hv * p.st_fin.s1, p.st_fin,
                                             rows, row_ok, gl, s);
    if (p.inplace_state && !p.idx_2d && src)
        store_rows<StateT, RPL, EPL, VE, NV, VEC>(src, p.st_in, rows, row_ok, gl, s);
}

} /* namespace */

#endif /* GDN_SM90_RECURRENT_KERNEL_CUH */
