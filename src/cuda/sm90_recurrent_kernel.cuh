/*
 * sm90_recurrent_kernel.cuh - the recurrent forward kernel template (decode / multi-token verify,
 * GDN and KDA gates). Launched by sm90_recurrent_fwd.cu (rules in sm90_recurrent_launch.cuh);
 * dev/decode/decode_sweeps.cu launches it directly with tiles the launcher does not pick.
 *
 * Memory-bound at T = 1: every call reads and writes each touched state (K x V per value head).
 * Common to both kernels:
 *   - a state row is one v with all K keys; a lane group of 8 lanes owns a row, each lane K/8
 *     keys in 16-byte pieces (4 f32 or 8 bf16) interleaved so that each access of the group covers
 *     128 contiguous bytes; a warp is 4 lane groups, each lane works RPL rows at once;
 *   - the CTA stages the inputs of up to TOKEN_CHUNK tokens (the fast path's one-token instance:
 *     one) in shared memory once (warp w l2-normalises q and k of tokens w, w + W, .., with k.q
 *     and the gates; all threads copy v), while the state is on its way;
 *   - registers hold S~ = S / c with a running scalar c (the product of the decays, folded back
 *     into S~ when it leaves [2^-20, 2^20]), so per token and element the update is one FMA;
 *     KDA (KDA = true) decays each key by its own exp(g), staged per token in shared memory
 *     (KdaStage), so each lane multiplies its keys of the state (c stays 1);
 *   - per token, the 8 lanes of a group reduce both dots of the old state, S~^T k by a butterfly
 *     (every lane needs u) and S~^T q by a reduce-scatter to the lane that writes o:
 *         o = S_new^T q = ce * (S~^T q) + u * (k . q),   u = beta * (v - ce * (S~^T k)),  ce = c * e,
 *     so the output needs no second reduction; the state stays in registers across the chunk's
 *     tokens and per-step states (c * S~) are stored straight from registers with 16-byte stores.
 * recurrent_fwd_tma_kernel (fast path, VK rows with K contiguous): bulk copies bring a 32 KB
 * state tile per CTA (16 KB in one-token calls) into shared memory, so bytes in flight do not
 * cost registers. It waits for the previous grid in the stream before its first global access
 * (grid_dependency_sync), so the launcher may start it early (programmatic dependent launch).
 * recurrent_fwd_kernel (generic path: unaligned VK views, views with neither index contiguous):
 * element-wise loads straight into registers. KV states with the value index contiguous have a
 * kernel of their own (sm90_recurrent_kv.cuh).
 */
#ifndef GDN_SM90_RECURRENT_KERNEL_CUH
#define GDN_SM90_RECURRENT_KERNEL_CUH

#include <type_traits>

#include "sm90_recurrent_util.cuh"

/* Internal linkage: the library and the benchmark each compile their own copy. */
namespace {

constexpr int LANES_PER_ROW = 8;
constexpr int TOKEN_CHUNK = 8;  /* tokens staged in shared memory at once */
constexpr int MAX_WARPS = 8;    /* CTA size limit (launch bounds) */

/* Rows a lane works at once: 32 state values in registers. At K = 128, 2 rows per lane beat 1
 * (per-warp overhead) and 4 (registers). */
template <int K, typename StateT> __host__ __device__ constexpr int default_rows_per_lane()
{
    return K >= 256 ? 1 : 256 / K;
}

/* Shared staging of one chunk of up to TC tokens (the tensor-core path's MmaStage extends it; its
 * short-chunk instances stage TC = 4, the CUDA-core fast path's one-token instance TC = 1, the
 * other CUDA-core instances TOKEN_CHUNK). e, beta and kq keep TOKEN_CHUNK entries whatever TC (the
 * tensor-core path reads e and beta of padding tokens). e and beta are 16-byte aligned for the
 * tensor-core path's vector reads (no change to the layout: they follow 16-byte multiples). */
template <int K, int ROWS_PER_CTA, int TC = TOKEN_CHUNK> struct TokenStage {
    static constexpr int TOKENS = TC;
    alignas(16) float q[TC][K]; /* l2-normalised (if asked) and scaled by `scale` */
    alignas(16) float k[TC][K]; /* l2-normalised (if asked) */
    float v[TC][ROWS_PER_CTA];
    alignas(16) float e[TOKEN_CHUNK];
    alignas(16) float beta[TOKEN_CHUNK];
    float kq[TOKEN_CHUNK];
};

/* KDA's stage: TokenStage plus the decays exp(g_t) of every key, computed once per token by the
 * staging warp and read by each lane at its own keys (e and kq of TokenStage: e is unused). The
 * kernels pick it by their KDA parameter; stage_token and token_step by the stage type. */
template <int K, int ROWS_PER_CTA, int TC = TOKEN_CHUNK> struct KdaStage : TokenStage<K, ROWS_PER_CTA, TC> {
    alignas(16) float ek[TC][K];
};

template <typename Stage> struct is_kda_stage : std::false_type {};
template <int K, int ROWS, int TC> struct is_kda_stage<KdaStage<K, ROWS, TC>> : std::true_type {};

template <int K, int ROWS, bool KDA, int TC = TOKEN_CHUNK>
using StageOf = typename std::conditional<KDA, KdaStage<K, ROWS, TC>, TokenStage<K, ROWS, TC>>::type;

/* Writes q and k of token j at key (stage_token): TokenStage keeps them as they are; the
 * tensor-core path's MmaStage has an overload in sm90_recurrent_mma.cuh (found by argument-
 * dependent lookup when stage_token is instantiated; the exact match beats this one). */
template <int K, int ROWS, int TC>
__device__ __forceinline__ void stage_put_qk(TokenStage<K, ROWS, TC> &st, int j, int key, float q, float k)
{
    st.q[j][key] = q;
    st.k[j][key] = k;
}

/* The inputs of token t of row b (key head h, value head hv) as one warp holds them: lane l has
 * q and k at keys l, l + 32, .. as loaded (InT); token_inputs issues every load of the token
 * before any is used (stage_token converts them), so staging a token costs one round trip to
 * memory, not one per dependent load. */
/* KDA: the raw per-key gates of a token at the lane's keys (g as f32 bits, or a in a_dtype bits
 * with dt_bias, 0 without); nothing for GDN. */
template <int K, bool KDA> struct KeyGates {};
template <int K> struct KeyGates<K, true> {
    uint32_t x[K / 32];
    float dt[K / 32];
};

template <int K, typename InT, bool KDA = false> struct TokenInputs {
    InT q[K / 32], k[K / 32];
    GateInputs gates;
    KeyGates<K, KDA> kg;
};

template <int K, typename InT, bool KDA = false>
__device__ __forceinline__ TokenInputs<K, InT, KDA> token_inputs(const RecurrentParams &p, int64_t b, int64_t t,
                                                                 int h, int hv, int lane)
{
    const InT *q = (const InT *)p.q + b * p.q_s[0] + t * p.q_s[1] + h * p.q_s[2];
    const InT *k = (const InT *)p.k + b * p.k_s[0] + t * p.k_s[1] + h * p.k_s[2];
    TokenInputs<K, InT, KDA> in;
#pragma unroll
    for (int i = 0; i < K / 32; i++) {
        const int64_t d = lane + 32 * i;
        in.q[i] = q[d * p.q_s[3]];
        in.k[i] = k[d * p.k_s[3]];
    }
    if constexpr (KDA) {
        if (p.g) {
            const float *g = p.g + b * p.g_s[0] + t * p.g_s[1] + hv * p.g_s[2];
#pragma unroll
            for (int i = 0; i < K / 32; i++)
                in.kg.x[i] = __float_as_uint(g[(lane + 32 * i) * p.g_sr]);
        } else {
            const int64_t a0 = b * p.a_s[0] + t * p.a_s[1] + hv * p.a_s[2];
#pragma unroll
            for (int i = 0; i < K / 32; i++) {
                const int64_t d = lane + 32 * i;
                in.kg.x[i] = load_bits(p.a, p.a_dtype, a0 + d * p.a_sr);
                in.kg.dt[i] = p.dt_bias ? p.dt_bias[hv * p.dt_s + d * p.dt_sr] : 0.0f;
            }
        }
    }
    in.gates = gate_inputs<KDA>(p, b, t, hv);
    return in;
}

/* Stages token j of st from its inputs (one warp): q l2-normalised (if asked) and scaled, k
 * l2-normalised (if asked), k.q, the decay exp(g) (KDA: of every key, st.ek) and beta. */
template <int K, typename InT, typename Stage>
__device__ __forceinline__ void stage_token(const RecurrentParams &p, Stage &st, int j,
                                            const TokenInputs<K, InT, is_kda_stage<Stage>::value> &in, int lane)
{
    constexpr bool KDA = is_kda_stage<Stage>::value;
    float qv[K / 32], kv[K / 32];
    float sq = 0.0f, sk = 0.0f, qk = 0.0f;
#pragma unroll
    for (int i = 0; i < K / 32; i++) {
        qv[i] = gdn_to_f32<InT>(in.q[i]);
        kv[i] = gdn_to_f32<InT>(in.k[i]);
        sq = fmaf(qv[i], qv[i], sq);
        sk = fmaf(kv[i], kv[i], sk);
        qk = fmaf(qv[i], kv[i], qk);
    }
    float e, beta;
    if constexpr (KDA) {
        e = 1.0f;
        beta = gate_beta_value(p, in.gates);
        /* the fast gate form, in log2 units (KdaGate, as kda_prep computes it), one branch per
         * token; 2^g2 of a log decay <= 0 is in [0, 1]: g = -inf gives 0 */
        float g2[K / 32];
        if (p.g) {
#pragma unroll
            for (int i = 0; i < K / 32; i++)
                g2[i] = __uint_as_float(in.kg.x[i]) * LOG2E;
        } else {
            const KdaGate kg = kda_gate_consts(in.gates.alog, p.lower_bound, p.softplus_beta, p.softplus_threshold);
            if (p.lower_bound < 0.0f) {
#pragma unroll
                for (int i = 0; i < K / 32; i++)
                    g2[i] = kda_gate_safe_log2(bits_to_f32(in.kg.x[i], p.a_dtype), kg.c2 * in.kg.dt[i], kg);
            } else {
#pragma unroll
                for (int i = 0; i < K / 32; i++)
                    g2[i] = kda_gate_softplus_log2(bits_to_f32(in.kg.x[i], p.a_dtype), in.kg.dt[i], kg);
            }
        }
#pragma unroll
        for (int i = 0; i < K / 32; i++)
            st.ek[j][lane + 32 * i] = fast_exp2(g2[i]);
    } else {
        gate_values(p, in.gates, &e, &beta);
    }
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) {
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
    for (int i = 0; i < K / 32; i++) {
        stage_put_qk(st, j, lane + 32 * i, qv[i] * rq, kv[i] * rk);
    }
    if (lane == 0) {
        st.kq[j] = qk * rq * rk;
        st.e[j] = e;
        st.beta[j] = beta;
    }
}

/* v of token tok, row `row` of value head hv (0 past V). */
template <typename InT>
__device__ __forceinline__ InT token_v(const RecurrentParams &p, int64_t b, int64_t tok, int hv, int row)
{
    const InT *v = (const InT *)p.v + b * p.v_s[0] + tok * p.v_s[1] + hv * p.v_s[2];
    return row < p.V ? v[(int64_t)row * p.v_s[3]] : gdn_from_f32<InT>(0.0f);
}

/* Stages tokens [tok0, tok0 + tc) of row b into st (tc <= Stage::TOKENS): run by the whole CTA. A
 * staging warp issues the loads of TPW of its tokens at once (more registers: the fast path's
 * state is not in registers yet, the generic path's is), then stages them. Token j goes to warp
 * (j + 1) % W (warp 0, which looks up the slot and issues the state copies, comes last), or with
 * SPARE_W0 (the tensor-core path) to warps 1 .. W - 1 only: warp 0's tokens would start their
 * memory round trip late and hold up the whole CTA. VPR > 0: v of rows
 * threadIdx.x + u * blockDim.x (u < VPR) of every token is loaded into registers before the tokens, so that v does
 * not cost a round trip of its own (the tensor-core path; in the CUDA-core fast path this raised
 * the register count past five CTAs per SM, and capping it slowed the token loop). */
template <int K, typename InT, int TPW, int VPR, bool SPARE_W0, typename Stage>
__device__ __forceinline__ void stage_tokens(const RecurrentParams &p, Stage &st, int64_t b,
                                             int64_t tok0, int tc, int h, int hv, int row_base, int rows_per_cta)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    InT vpre[Stage::TOKENS][VPR > 0 ? VPR : 1];
    if constexpr (VPR > 0) {
#pragma unroll
        for (int j = 0; j < Stage::TOKENS; j++)
#pragma unroll
            for (int u = 0; u < VPR; u++) {
                const int rr = threadIdx.x + u * blockDim.x;
                if (j < tc && rr < rows_per_cta)
                    vpre[j][u] = token_v<InT>(p, b, tok0 + j, hv, row_base + rr);
            }
    }
    static_assert(TPW == 1 || TPW == 2, "tokens in flight per warp: 1 or 2");
    constexpr bool KDA = is_kda_stage<Stage>::value;
    const bool spare = SPARE_W0 && nwarps > 1;
    const int nst = spare ? nwarps - 1 : nwarps;                    /* staging warps */
    const int sw = spare ? warp - 1 : (warp + nwarps - 1) % nwarps; /* this warp among them */
    for (int j = sw; sw >= 0 && j < tc; j += TPW * nst) {
        const TokenInputs<K, InT, KDA> in0 = token_inputs<K, InT, KDA>(p, b, tok0 + j, h, hv, lane);
        if (TPW == 2 && j + nst < tc) {
            const TokenInputs<K, InT, KDA> in1 = token_inputs<K, InT, KDA>(p, b, tok0 + j + nst, h, hv, lane);
            stage_token<K, InT>(p, st, j, in0, lane);
            stage_token<K, InT>(p, st, j + nst, in1, lane);
        } else {
            stage_token<K, InT>(p, st, j, in0, lane);
        }
    }
    if constexpr (VPR > 0) {
#pragma unroll
        for (int j = 0; j < Stage::TOKENS; j++)
#pragma unroll
            for (int u = 0; u < VPR; u++) {
                const int rr = threadIdx.x + u * blockDim.x;
                if (j < tc && rr < rows_per_cta)
                    st.v[j][rr] = gdn_to_f32<InT>(vpre[j][u]);
            }
        for (int j = 0; j < tc; j++) /* rows past VPR * blockDim (CTAs of fewer warps) */
            for (int rr = threadIdx.x + VPR * blockDim.x; rr < rows_per_cta; rr += blockDim.x)
                st.v[j][rr] = gdn_to_f32<InT>(token_v<InT>(p, b, tok0 + j, hv, row_base + rr));
    } else {
        for (int i = threadIdx.x; i < tc * rows_per_cta; i += blockDim.x) {
            const int j = i / rows_per_cta, rr = i - j * rows_per_cta;
            st.v[j][rr] = gdn_to_f32<InT>(token_v<InT>(p, b, tok0 + j, hv, row_base + rr));
        }
    }
}

/* Where sequence n starts: *src is the state to read (NULL: zeros); false if it is skipped. */
template <typename StateT>
__device__ __forceinline__ bool sequence_start(const RecurrentParams &p, int64_t n, int hv, StateT **src)
{
    *src = nullptr;
    if (p.state_indices) {
        int64_t col = 0;
        if (p.num_accepted_tokens) {
            const int64_t na = p.num_accepted_tokens[n];
            if (na < 1 || na > p.idx_cols)
                return false;
            col = na - 1;
        }
        const int64_t slot = p.state_indices[n * p.idx_s_n + col * p.idx_s_t];
        if (!slot_valid(p, slot))
            return false;
        *src = state_at<StateT>(p.state_in, p.st_in, slot, hv);
    } else if (p.state_in) {
        *src = state_at<StateT>(p.state_in, p.st_in, n, hv);
    }
    return true;
}

/* Sequence n's tokens: b (its batch row of q / k / v / o), [bos, eos) clamped so that any
 * cu_seqlens content stays in bounds, and packed0, the packed index of its first token. */
struct SeqRange {
    int64_t b, bos, eos, packed0;
};

__device__ __forceinline__ SeqRange sequence_range(const RecurrentParams &p, int64_t n)
{
    SeqRange r = {n, 0, p.T, n * p.T};
    if (p.cu_seqlens) {
        r.b = 0;
        r.bos = clamp64(p.cu_seqlens[n], 0, p.T);
        r.eos = clamp64(p.cu_seqlens[n + 1], r.bos, p.T);
        r.packed0 = r.bos;
    }
    return r;
}

/* Warp 0 of a bulk-copy CTA (both fast paths): looks up sequence n's slot and issues one bulk copy
 * per state row of the CTA (rows row_base .. + cta_rows of value head hv, into tile with row stride
 * K), each completing on the barrier of its pass of pass_rows rows; *s_src / *s_live receive the
 * slot for the whole CTA (read after a barrier). */
template <int K, typename StateT>
__device__ __forceinline__ void issue_state_tile(const RecurrentParams &p, int64_t n, int hv, StateT *tile,
                                                 int row_base, int cta_rows, int pass_rows, int passes, uint64_t *bar,
                                                 StateT **s_src, int *s_live)
{
    constexpr uint32_t ROW_BYTES = K * sizeof(StateT);
    const int lane = threadIdx.x & 31;
    StateT *src0;
    const bool live0 = sequence_start(p, n, hv, &src0);
    if (live0 && src0) {
        if (lane < passes) {
            const int first = lane * pass_rows;
            const int n_rows = cta_rows - first < pass_rows ? cta_rows - first : pass_rows;
            mbar_expect_tx(&bar[lane], n_rows > 0 ? (uint32_t)n_rows * ROW_BYTES : 0u);
        }
        for (int i = lane; i < cta_rows; i += 32)
            bulk_load(&tile[i * K], src0 + (int64_t)(row_base + i) * p.st_in.sv, ROW_BYTES, &bar[i / pass_rows]);
    }
    if (lane == 0) {
        *s_src = src0;
        *s_live = live0;
    }
}

/* A skipped sequence in a bulk-copy CTA: zeros for its rows row_base .. + cta_rows (zero_outputs,
 * the CUDA-core lane mapping), run by the whole CTA. */
template <int K, typename StateT, typename InT>
__device__ __forceinline__ void zero_cta_outputs(const RecurrentParams &p, const SeqRange &sr, int64_t n, int hv,
                                                 int row_base, int cta_rows)
{
    constexpr int RPL = default_rows_per_lane<K, StateT>();
    constexpr int VE = 16 / sizeof(StateT), NV = K / (LANES_PER_ROW * VE), EPL = NV * VE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int group = lane / LANES_PER_ROW, gl = lane % LANES_PER_ROW;
    for (int r0 = warp * 4 * RPL; r0 < cta_rows; r0 += nwarps * 4 * RPL) {
        int rows[RPL];
        bool row_ok[RPL];
#pragma unroll
        for (int r = 0; r < RPL; r++) {
            rows[r] = row_base + r0 + r * 4 + group;
            row_ok[r] = r0 + r * 4 + group < cta_rows;
        }
        zero_outputs<StateT, InT, RPL, EPL, VE, NV, true>(p, rows, row_ok, gl, sr.b, sr.bos, sr.eos, sr.packed0, n, hv);
    }
}

/* The running scale: registers hold S~ with S = c * S~, so that the decay of a token is one
 * multiply of the scalar c and the update one FMA per element. c is the same for every row of a
 * (sequence, value head), hence uniform over the CTA; it is folded back into S~ (S~ *= c, c = 1)
 * when it leaves [2^-20, 2^20] (strong decays, exp(g) = 0 for g = -inf, NaN), so 1 / c never
 * exceeds 2^20 and S~ stays within 2^20 of S. */
constexpr float SCALE_LO = 0x1p-20f, SCALE_HI = 0x1p20f;

/* Reduces x[0..N) over the 8 lanes of a row group, keeping only x[0] = the sum of row gl % N:
 * each level sends half of the values still held to the partner and adds the other half
 * (N - 1 + 3 - log2 N shuffles instead of 3 N). */
template <int N> __device__ __forceinline__ void reduce_scatter8(float *x, int gl)
{
    int m = 1;
#pragma unroll
    for (int n = N; n > 1; n /= 2, m *= 2) {
        const bool hi = (gl & m) != 0;
#pragma unroll
        for (int i = 0; i < n / 2; i++) {
            const float keep = hi ? x[2 * i + 1] : x[2 * i], send = hi ? x[2 * i] : x[2 * i + 1];
            x[i] = keep + __shfl_xor_sync(0xffffffffu, send, m);
        }
    }
#pragma unroll
    for (; m < LANES_PER_ROW; m *= 2)
        x[0] += __shfl_xor_sync(0xffffffffu, x[0], m);
}

/* One token for this lane's RPL rows: the delta-rule update of S~ in registers (S = c * S~,
 * c updated here), o, and the per-step state writes. KDA (a KdaStage): the decay differs per key,
 * so it cannot live in the scalar c; each lane multiplies its keys of S by their staged exp(g)
 * (c stays 1) in the pass that forms the dots, one multiply per element. srow: the rows' index into the staged v.
 * t: token index within the sequence; o: the token's output at (b, tok, hv), advanced by the
 * caller (no 64-bit multiplies per token). */
template <int K, typename StateT, typename InT, int RPL, int EPL, int VE, int NV, bool VEC, typename Stage>
__device__ __forceinline__ void token_step(const RecurrentParams &p, const Stage &st, int j,
                                           float (*s)[EPL], float &c, const int *rows, const bool *row_ok,
                                           const int *srow, int gl, int64_t n, int hv, int64_t t, InT *o,
                                           int64_t packed0)
{
    static_assert(RPL <= LANES_PER_ROW && (RPL & (RPL - 1)) == 0, "rows per lane: a power of two up to 8");
    constexpr bool KDA = is_kda_stage<Stage>::value;
    const float beta = st.beta[j], kq = st.kq[j];

    /* the decay: S = ce * S~ (KDA: below, per key) */
    float ce = 1.0f, rc = 1.0f;
    if constexpr (!KDA) {
        ce = c * st.e[j];
        if (!(ce >= SCALE_LO && ce <= SCALE_HI)) { /* uniform over the CTA */
#pragma unroll
            for (int r = 0; r < RPL; r++)
#pragma unroll
                for (int i = 0; i < EPL; i++)
                    s[r][i] *= ce;
            ce = 1.0f;
        }
        c = ce;
        rc = 1.0f / ce;
    }

    /* S~^T k and S~^T q of the decayed state; k stays in registers for the update */
    float ka[EPL], dk[RPL], dq[RPL];
#pragma unroll
    for (int r = 0; r < RPL; r++)
        dk[r] = dq[r] = 0.0f;
#pragma unroll
    for (int cc = 0; cc < NV; cc++) {
#pragma unroll
        for (int m = 0; m < VE; m += 4) {
            const int key = (cc * LANES_PER_ROW + gl) * VE + m;
            const float4 q4 = *reinterpret_cast<const float4 *>(&st.q[j][key]);
            const float4 k4 = *reinterpret_cast<const float4 *>(&st.k[j][key]);
            const float qa[4] = {q4.x, q4.y, q4.z, q4.w};
            ka[cc * VE + m] = k4.x, ka[cc * VE + m + 1] = k4.y, ka[cc * VE + m + 2] = k4.z, ka[cc * VE + m + 3] = k4.w;
            if constexpr (KDA) {
                const float4 e4 = *reinterpret_cast<const float4 *>(&st.ek[j][key]);
                const float ea[4] = {e4.x, e4.y, e4.z, e4.w};
#pragma unroll
                for (int r = 0; r < RPL; r++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        s[r][cc * VE + m + i] *= ea[i];
            }
#pragma unroll
            for (int r = 0; r < RPL; r++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    dk[r] = fmaf(s[r][cc * VE + m + i], ka[cc * VE + m + i], dk[r]);
                    dq[r] = fmaf(s[r][cc * VE + m + i], qa[i], dq[r]);
                }
            }
        }
    }
    /* every lane needs S^T k of all its rows (for u); S^T q only in the lane that writes o */
#pragma unroll
    for (int m = 1; m < LANES_PER_ROW; m *= 2) {
#pragma unroll
        for (int r = 0; r < RPL; r++)
            dk[r] += __shfl_xor_sync(0xffffffffu, dk[r], m);
    }
    reduce_scatter8<RPL>(dq, gl); /* dq[0]: row gl % RPL */

    /* u = beta (v - S^T k); o = S_new^T q = ce (S~^T q) + u (k . q), by lane gl == r */
    float ur[RPL];
#pragma unroll
    for (int r = 0; r < RPL; r++) {
        const float u = beta * (st.v[j][srow[r]] - ce * dk[r]);
        if (gl == r && row_ok[r])
            o[(int64_t)rows[r] * p.o_s[3]] = gdn_from_f32<InT>(fmaf(ce, dq[0], u * kq));
        ur[r] = u * rc;
    }
    /* S~ += k (u / ce) */
#pragma unroll
    for (int r = 0; r < RPL; r++)
#pragma unroll
        for (int i = 0; i < EPL; i++)
            s[r][i] = fmaf(ka[i], ur[r], s[r][i]);

    /* per-step states: the step_states row of this token, and the 2-D pool slot */
    if (p.step_states)
        store_rows<StateT, RPL, EPL, VE, NV, VEC>(state_at<StateT>(p.step_states, p.st_step, packed0 + t, hv),
                                                  p.st_step, rows, row_ok, gl, s, ce);
    if (p.inplace_state && p.idx_2d && t < p.idx_cols) {
        const int64_t slot = p.state_indices[n * p.idx_s_n + t * p.idx_s_t];
        if (slot_valid(p, slot))
            store_rows<StateT, RPL, EPL, VE, NV, VEC>(state_at<StateT>(p.state_in, p.st_in, slot, hv),
                                                      p.st_in, rows, row_ok, gl, s, ce);
    }
}

/* The state after the last token: final_state, and the start slot for 1-D in-place pools. */
template <typename StateT, int RPL, int EPL, int VE, int NV, bool VEC>
__device__ __forceinline__ void store_final(const RecurrentParams &p, StateT *src, int64_t n, int hv, const int *rows,
                                            const bool *row_ok, int gl, const float (*s)[EPL], float c)
{
    if (p.final_state)
        store_rows<StateT, RPL, EPL, VE, NV, VEC>(state_at<StateT>(p.final_state, p.st_fin, n, hv),
                                                  p.st_fin, rows, row_ok, gl, s, c);
    if (p.inplace_state && !p.idx_2d && src)
        store_rows<StateT, RPL, EPL, VE, NV, VEC>(src, p.st_in, rows, row_ok, gl, s, c);
}

/* The generic path: K: key head dim; StateT: state dtype in memory; InT: q/k/v/o dtype; RPL:
 * rows per lane; VEC: state rows moved in 16-byte pieces, else element by element with any
 * strides (unaligned pools, any layout); KDA: per-key gates (KdaStage). The state goes straight
 * from memory to registers. */
template <int K, typename StateT, typename InT, int RPL, bool VEC, bool KDA = false>
__global__ void __launch_bounds__(32 * MAX_WARPS) recurrent_fwd_kernel(const RecurrentParams p)
{
    constexpr int VE = 16 / sizeof(StateT);     /* elements per 16-byte state piece */
    constexpr int NV = K / (LANES_PER_ROW * VE); /* pieces per lane per row */
    constexpr int EPL = NV * VE;                /* keys per lane */
    constexpr int ROWS_PER_WARP = 4 * RPL;
    constexpr int MAX_ROWS_PER_CTA = ROWS_PER_WARP * MAX_WARPS;
    static_assert(NV >= 1 && NV * VE * LANES_PER_ROW == K, "K must be a multiple of 8 state pieces");
    static_assert(VE % 4 == 0, "q/k pieces are read from shared memory as float4");
    __shared__ StageOf<K, MAX_ROWS_PER_CTA, KDA> st;
    static_assert(is_kda_stage<decltype(st)>::value == KDA, "token_step sees the gate kind by the stage type");

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = lane / LANES_PER_ROW, gl = lane % LANES_PER_ROW;
    const int rows_per_cta = ROWS_PER_WARP * (blockDim.x >> 5);
    const int row_base = blockIdx.x * rows_per_cta;
    const int hv = blockIdx.y;
    const int h = hv / (int)p.G;

    int rows[RPL], srow[RPL];
    bool row_ok[RPL];
#pragma unroll
    for (int r = 0; r < RPL; r++) {
        srow[r] = warp * ROWS_PER_WARP + r * 4 + group;
        rows[r] = row_base + srow[r];
        row_ok[r] = rows[r] < p.V;
    }

    for (int64_t n = blockIdx.z; n < p.N; n += gridDim.z) {
        /* Token range, clamped so that any cu_seqlens content stays in bounds. (Not sequence_range:
         * with it this kernel's register count moved, 93 -> 97 at K = 128, 99 -> 80 at K = 64.) */
        int64_t b = n, bos = 0, eos = p.T;
        if (p.cu_seqlens) {
            b = 0;
            bos = clamp64(p.cu_seqlens[n], 0, p.T);
            eos = clamp64(p.cu_seqlens[n + 1], bos, p.T);
        }
        const int64_t len = eos - bos;
        const int64_t packed0 = p.cu_seqlens ? bos : n * p.T; /* packed index of the first token */

        StateT *src;
        if (!sequence_start(p, n, hv, &src)) { /* uniform over the CTA */
            zero_outputs<StateT, InT, RPL, EPL, VE, NV, VEC>(p, rows, row_ok, gl, b, bos, eos, packed0, n, hv);
            continue;
        }

        /* All state loads first: they are the whole cost of the kernel. */
        float s[RPL][EPL];
#pragma unroll
        for (int r = 0; r < RPL; r++) {
#pragma unroll
            for (int c = 0; c < NV; c++) {
                const int key = (c * LANES_PER_ROW + gl) * VE;
                if (src && row_ok[r]) {
                    load_f32<StateT, VE, VEC>(src + (int64_t)rows[r] * p.st_in.sv + key * p.st_in.sk, p.st_in.sk,
                                              &s[r][c * VE]);
                } else {
#pragma unroll
                    for (int e = 0; e < VE; e++)
                        s[r][c * VE + e] = 0.0f;
                }
            }
        }

        float c = 1.0f; /* S = c * s */
        for (int64_t t0 = 0; t0 < len; t0 += TOKEN_CHUNK) {
            const int tc = (int)(len - t0 < TOKEN_CHUNK ? len - t0 : TOKEN_CHUNK);
            __syncthreads(); /* the previous chunk (or sequence) is no longer read */
            stage_tokens<K, InT, 1, 0, false>(p, st, b, bos + t0, tc, h, hv, row_base, rows_per_cta);
            __syncthreads();
            InT *o = token_o<InT>(p, b, bos + t0, hv);
            for (int j = 0; j < tc; j++, o += p.o_s[1])
                token_step<K, StateT, InT, RPL, EPL, VE, NV, VEC>(
                    p, st, j, s, c, rows, row_ok, srow, gl, n, hv, t0 + j, o, packed0);
        }
        store_final<StateT, RPL, EPL, VE, NV, VEC>(p, src, n, hv, rows, row_ok, gl, s, c);
    }
}

/* Rows of the fast path's state tile: 32 KB of state (16 KB at K = 256, where the staged q and k
 * take 16 KB), so that the CTA's static shared memory stays under 48 KB. KDA's stage adds the
 * decays of every key: where tile and stage then pass 48 KB (K = 128, bf16 state), half the rows. */
constexpr size_t STATIC_SMEM_MAX = 48 * 1024;

template <int K, typename StateT> __host__ __device__ constexpr int base_tile_rows()
{
    return (K >= 256 ? 16384 : 32768) / (K * (int)sizeof(StateT));
}

template <int K, typename StateT, bool KDA = false> __host__ __device__ constexpr int tile_rows()
{
    constexpr int ROWS = base_tile_rows<K, StateT>();
    constexpr size_t BARRIERS = 8 * ROWS; /* at most one 8-byte barrier per row */
    return KDA && ROWS * K * sizeof(StateT) + sizeof(KdaStage<K, ROWS>) + BARRIERS > STATIC_SMEM_MAX ? ROWS / 2
                                                                                                  : ROWS;
}

/* The fast path (VK rows, K contiguous, 16-byte aligned): one CTA owns up to TILE rows of one
 * (sequence, value head), rows_per_cta of them (a launch choice); its static shared memory holds a
 * tile of TILE rows and a stage of TC tokens (a one-token instance: TC = 1 and half the tile). One
 * bulk copy per row (cp.async.bulk, completing on an mbarrier) brings the CTA's whole state tile
 * into shared memory without holding registers, so each SM keeps several tiles in flight; meanwhile the CTA
 * stages the token inputs. Then each warp takes passes of 4 * RPL rows from the tile into
 * registers, runs the chunk's tokens on them and stores results straight to global memory
 * (or back into the tile when more chunks follow). Each pass has its own mbarrier, so the first
 * passes compute while the later rows are still arriving.
 * BOUNDED caps the registers for five 128-thread CTAs an SM, ten of the one-token launch's two-warp
 * CTAs (KDA's one-token instance needs more than that cap allows without it). Otherwise there is no
 * minimum (0): a minimum of one CTA lets ptxas spend up to 255 registers, at the cost of occupancy. */
template <int K, typename StateT, typename InT, int RPL, bool KDA = false, int TILE = tile_rows<K, StateT, KDA>(),
          int TC = TOKEN_CHUNK, bool BOUNDED = false>
__global__ void __launch_bounds__(128, BOUNDED ? 5 : 0)
    recurrent_fwd_tma_kernel(const RecurrentParams p, int rows_per_cta)
{
    constexpr int VE = 16 / sizeof(StateT);
    constexpr int NV = K / (LANES_PER_ROW * VE);
    constexpr int EPL = NV * VE;
    constexpr int ROWS_PER_WARP = 4 * RPL;
    constexpr int TILE_ROWS = TILE;
    static_assert(NV >= 1 && NV * VE * LANES_PER_ROW == K, "K must be a multiple of 8 state pieces");
    static_assert(TILE_ROWS * K * sizeof(StateT) + sizeof(StageOf<K, TILE_ROWS, KDA, TC>) + 8 * TILE_ROWS <=
                      STATIC_SMEM_MAX,
                  "the tile, the stage and the barriers fit the static shared memory");
    static_assert(TILE_ROWS % ROWS_PER_WARP == 0, "whole warp passes");
    __shared__ alignas(128) StateT tile[TILE_ROWS * K];
    __shared__ StageOf<K, TILE_ROWS, KDA, TC> st;
    static_assert(is_kda_stage<decltype(st)>::value == KDA, "token_step sees the gate kind by the stage type");
    constexpr int MAX_PASSES = TILE_ROWS / ROWS_PER_WARP;
    __shared__ alignas(8) uint64_t bar[MAX_PASSES]; /* one per pass: a pass starts when its rows land */
    __shared__ StateT *s_src;                        /* warp 0's slot lookup, for the whole CTA */
    __shared__ int s_live;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int group = lane / LANES_PER_ROW, gl = lane % LANES_PER_ROW;
    const int row_base = blockIdx.x * rows_per_cta;
    const int hv = blockIdx.y;
    const int h = hv / (int)p.G;
    const int cta_rows = (int)(p.V - row_base < rows_per_cta ? p.V - row_base : rows_per_cta);
    const int passes = (rows_per_cta + nwarps * ROWS_PER_WARP - 1) / (nwarps * ROWS_PER_WARP);

    const int pass_rows = nwarps * ROWS_PER_WARP;
    if (threadIdx.x < passes)
        mbar_init(&bar[threadIdx.x], 1), mbar_fence_init();
    __syncthreads();
    grid_dependency_sync();
    uint32_t phase = 0;

    for (int64_t n = blockIdx.z; n < p.N; n += gridDim.z) {
        const SeqRange sr = sequence_range(p, n);
        const int64_t b = sr.b, bos = sr.bos, eos = sr.eos, len = eos - bos, packed0 = sr.packed0;

        /* The tile and the stage of the previous sequence are no longer read; order those generic
         * accesses before the bulk copies that overwrite the tile. */
        fence_proxy_async();
        __syncthreads();
        /* Warp 0 looks up the slot and issues the bulk copies while the other warps stage the
         * tokens (stage_tokens starts on warp 1), so the slot lookup does not delay the stage. */
        if (warp == 0)
            issue_state_tile<K, StateT>(p, n, hv, tile, row_base, cta_rows, pass_rows, passes, bar, &s_src, &s_live);
        if (!p.state_indices && !p.state_in) /* no initial state: zeros */
            for (int i = threadIdx.x; i < cta_rows * K; i += blockDim.x)
                tile[i] = gdn_from_f32<StateT>(0.0f);
        const int tc0 = (int)(len < TC ? len : TC);
        stage_tokens<K, InT, (K <= 128 ? 2 : 1), 0, false>(p, st, b, bos, tc0, h, hv, row_base, cta_rows);
        __syncthreads();
        StateT *const src = s_src;
        if (!s_live) { /* skipped: uniform over the CTA (zero_cta_outputs, inlined here: through it
                        * this kernel took 116-128 registers instead of 96 at K = 64) */
            for (int ps = 0; ps < passes; ps++) {
                int rows[RPL];
                bool row_ok[RPL];
#pragma unroll
                for (int r = 0; r < RPL; r++) {
                    const int i = (ps * nwarps + warp) * ROWS_PER_WARP + r * 4 + group;
                    rows[r] = row_base + i;
                    row_ok[r] = i < cta_rows;
                }
                zero_outputs<StateT, InT, RPL, EPL, VE, NV, true>(p, rows, row_ok, gl, b, bos, eos, packed0, n, hv);
            }
            continue;
        }

        const int64_t chunks = len > 0 ? (len + TC - 1) / TC : 1;
        for (int64_t ci = 0; ci < chunks; ci++) {
            const int64_t t0 = ci * TC;
            const int tc = (int)(len - t0 < TC ? len - t0 : TC);
            if (ci > 0) {
                __syncthreads(); /* the previous chunk's stage and tile write-backs are done */
                stage_tokens<K, InT, (K <= 128 ? 2 : 1), 0, false>(p, st, b, bos + t0, tc, h, hv, row_base, cta_rows);
                __syncthreads();
            }
            const bool last = ci == chunks - 1;

            for (int ps = 0; ps < passes; ps++) {
                int rows[RPL], srow[RPL];
                bool row_ok[RPL];
#pragma unroll
                for (int r = 0; r < RPL; r++) {
                    srow[r] = (ps * nwarps + warp) * ROWS_PER_WARP + r * 4 + group;
                    rows[r] = row_base + srow[r];
                    row_ok[r] = srow[r] < cta_rows;
                }
                if (ci == 0 && src)
                    mbar_wait(&bar[ps], phase);
                float s[RPL][EPL], c = 1.0f; /* S = c * s */
#pragma unroll
                for (int r = 0; r < RPL; r++)
#pragma unroll
                    for (int cc = 0; cc < NV; cc++)
                        load_f32<StateT, VE, true>(&tile[(row_ok[r] ? srow[r] : 0) * K + (cc * LANES_PER_ROW + gl) * VE],
                                                   1, &s[r][cc * VE]);
                InT *o = token_o<InT>(p, b, bos + t0, hv);
                for (int j = 0; j < tc; j++, o += p.o_s[1])
                    token_step<K, StateT, InT, RPL, EPL, VE, NV, true>(
                        p, st, j, s, c, rows, row_ok, srow, gl, n, hv, t0 + j, o, packed0);
                if (last) {
                    store_final<StateT, RPL, EPL, VE, NV, true>(p, src, n, hv, rows, row_ok, gl, s, c);
                } else {
#pragma unroll
                    for (int r = 0; r < RPL; r++)
                        if (row_ok[r])
#pragma unroll
                            for (int cc = 0; cc < NV; cc++)
                                st_shared_16(smem_u32(&tile[srow[r] * K + (cc * LANES_PER_ROW + gl) * VE]),
                                             pack16<StateT, VE>(&s[r][cc * VE], c));
                }
            }
        }
        if (src)
            phase ^= 1;
    }
}

} /* namespace */

#endif /* GDN_SM90_RECURRENT_KERNEL_CUH */
