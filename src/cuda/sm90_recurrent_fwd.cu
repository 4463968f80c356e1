/*
 * sm90_recurrent_fwd.cu - recurrent forward (decode / multi-token verify) on Hopper: the launcher.
 * Picks a compile-time instance of a kernel in sm90_recurrent_kernel.cuh by gate kind, head dim,
 * state dtype and input dtype, and the path: the bulk-copy fast path when every state view has K
 * contiguous and 16-byte aligned rows (the VK pools engines use), else the KV kernel when every
 * view has the value index contiguous (FLA's and transformers' layout, sm90_recurrent_kv.cuh),
 * else the element-wise generic path (unaligned VK views, other strides); on the bulk-copy views,
 * multi-token calls go to the tensor-core path (sm90_recurrent_mma.cuh, use_mma_path); then a
 * tile / CTA size by batch.
 * Grid: (row blocks, HV, sequences); the kernels loop over sequences beyond 65535. The fast path is launched with
 * programmatic stream serialization where that pays (tma_use_pdl).
 * KDA gates (a decay per key) take the same paths by the same rules, as instances with KDA = true
 * (the per-key decays staged in shared memory; sm90_recurrent_kernel.cuh, sm90_recurrent_mma.cuh).
 */
#include "cuda_common.cuh"
#include "sm90_recurrent_kv.cuh"
#include "sm90_recurrent_launch.cuh"

namespace {

StateStrides state_strides(const gdn_view &v)
{
    return StateStrides{v.s[0], v.s[1], v.s[2], v.s[3]};
}

/* A state view whose rows can be moved in 16-byte pieces of ve elements. */
bool state_view_vec(const gdn_view &v, int64_t ve)
{
    return !v.data || ((uintptr_t)v.data % 16 == 0 && v.s[2] == 1 && v.s[0] % ve == 0 && v.s[1] % ve == 0 &&
                       v.s[3] % ve == 0);
}

/* A state view with the value index contiguous (KV layout; any other strides). */
inline bool state_view_kv(const gdn_view &v) { return !v.data || v.s[3] == 1; }

/* The generic path: state rows element by element, straight to registers. */
template <int K, typename StateT, typename InT, bool VEC, bool KDA>
gdn_status launch_generic(const RecurrentParams &prm, const gdn_problem *p)
{
    constexpr int RPL = default_rows_per_lane<K, StateT>();
    constexpr int ROWS_PER_WARP = 4 * RPL;
    /* One-warp CTAs spread small batches over every SM; at large batches 4-warp CTAs stage each
     * token's inputs once for 4 warps. */
    const int64_t warps_per_head = (p->V + ROWS_PER_WARP - 1) / ROWS_PER_WARP;
    int warps = p->N * p->HV * warps_per_head < 4096 ? 1 : 4;
    if (warps > warps_per_head)
        warps = (int)warps_per_head;
    const dim3 grid((unsigned)((warps_per_head + warps - 1) / warps), (unsigned)p->HV,
                    (unsigned)(p->N < 65535 ? p->N : 65535));
    recurrent_fwd_kernel<K, StateT, InT, RPL, VEC, KDA><<<grid, 32 * warps, 0, (cudaStream_t)p->stream>>>(prm);
    return gdn_cuda_check(cudaGetLastError(), "gdn_recurrent_fwd: kernel launch");
}

/* A launch's grid: the problem's row blocks of `tile` (bulk-copy tiles; the KV kernel's columns),
 * value heads and sequences. */
inline dim3 tile_grid(const gdn_problem *p, TmaTile tile)
{
    return dim3((unsigned)((p->V + tile.rows - 1) / tile.rows), (unsigned)p->HV,
                (unsigned)(p->N < 65535 ? p->N : 65535));
}

inline gdn_status device_sms(const gdn_problem *p, int *sms)
{
    return gdn_cuda_check(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, p->device_ordinal),
                          "gdn_recurrent_fwd: device attribute");
}

/* A KV state view whose bf16 pairs of value columns are 4-byte aligned. */
inline bool state_view_pairs(const gdn_view &v)
{
    return !v.data || ((uintptr_t)v.data % 4 == 0 && v.s[3] == 1 && v.s[0] % 2 == 0 && v.s[1] % 2 == 0 &&
                       v.s[2] % 2 == 0);
}

/* Two value columns a lane (bf16 pairs, rounded once a token: sm90_recurrent_kv.cuh) for bf16
 * states in one-token calls (fixed length: with cu_seqlens a sequence may hold more), V a multiple
 * of 64 and every state view's pairs aligned. */
inline bool kv_pairs_fit(const gdn_problem *p)
{
    return p->state_dtype == GDN_DTYPE_BF16 && !p->cu_seqlens && p->T == 1 && p->V % 64 == 0 &&
           state_view_pairs(p->state_in) && state_view_pairs(p->final_state) && state_view_pairs(p->step_states);
}

/* KV states on the kernel laid out for them: 32 (bf16 pairs: 64) value columns a CTA, a warp per
 * 32 keys. */
template <int K, typename StateT, typename InT, bool KDA>
gdn_status launch_kv(const RecurrentParams &prm, const gdn_problem *p)
{
    if constexpr (std::is_same<StateT, __nv_bfloat16>::value) {
        if (kv_pairs_fit(p)) {
            recurrent_fwd_kv_kernel<K, StateT, InT, KDA, 2>
                <<<tile_grid(p, TmaTile{2 * KV_COLS, K / 32}), K, 0, (cudaStream_t)p->stream>>>(prm);
            return gdn_cuda_check(cudaGetLastError(), "gdn_recurrent_fwd: kernel launch");
        }
    }
    recurrent_fwd_kv_kernel<K, StateT, InT, KDA>
        <<<tile_grid(p, TmaTile{KV_COLS, K / 32}), K, 0, (cudaStream_t)p->stream>>>(prm);
    return gdn_cuda_check(cudaGetLastError(), "gdn_recurrent_fwd: kernel launch");
}

/* Launches a bulk-copy kernel (both fast paths: kernel(prm, rows)) over tile_grid, with
 * programmatic stream serialization where tma_use_pdl says so. */
template <typename Kernel>
gdn_status launch_tile_kernel(Kernel kernel, const RecurrentParams &prm, const gdn_problem *p, TmaTile tile,
                              size_t smem)
{
    const dim3 grid = tile_grid(p, tile);
    int sms = 0;
    gdn_status st = device_sms(p, &sms);
    if (st != GDN_OK)
        return st;
    const int64_t ctas = (int64_t)grid.x * grid.y * grid.z;

    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(32 * tile.warps);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = (cudaStream_t)p->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = tma_use_pdl(ctas, sms) ? 1 : 0;
    return gdn_cuda_check(cudaLaunchKernelEx(&cfg, kernel, prm, tile.rows), "gdn_recurrent_fwd: kernel launch");
}

/* The fast path: bulk copies of whole rows into a shared-memory tile. Calls of one token per
 * sequence take the instance whose stage holds one token and whose tile is half as large
 * (one_token_tile_rows): the CTA's shared memory is then mostly its state tile, so more CTAs, and
 * more state bytes, are in flight per SM (dev/decode/README.md). */
inline bool one_token_calls(const gdn_problem *p) { return one_token(p->N, p->T, p->cu_seqlens != NULL); }

template <int K, typename StateT> constexpr int one_token_tile_rows() { return base_tile_rows<K, StateT>() / 2; }

template <int K, typename StateT, typename InT, bool KDA, int TILE, int TC, bool BOUNDED = false>
gdn_status launch_tma_instance(const RecurrentParams &prm, const gdn_problem *p, TmaTile tile)
{
    constexpr int RPL = default_rows_per_lane<K, StateT>();
    const gdn_status st = gdn_cuda_check(prefer_shared_tma_kernel<K, StateT, InT, RPL, KDA, TILE, TC, BOUNDED>(),
                                         "gdn_recurrent_fwd: carveout");
    if (st != GDN_OK)
        return st;
    return launch_tile_kernel(recurrent_fwd_tma_kernel<K, StateT, InT, RPL, KDA, TILE, TC, BOUNDED>, prm, p, tile, 0);
}

template <int K, typename StateT, typename InT, bool KDA>
gdn_status launch_tma(const RecurrentParams &prm, const gdn_problem *p)
{
    const bool varlen = p->cu_seqlens != NULL;
    if (!one_token_calls(p))
        return launch_tma_instance<K, StateT, InT, KDA, tile_rows<K, StateT, KDA>(), TOKEN_CHUNK>(
            prm, p, tma_tile<K, StateT, KDA>(p->N, p->HV, p->V, p->T, varlen));
    constexpr int TILE = one_token_tile_rows<K, StateT>();
    const TmaTile tile = tma_tile<K, StateT, KDA>(p->N, p->HV, p->V, p->T, varlen, TILE);
    if (KDA) {
        int sms = 0;
        const gdn_status st = device_sms(p, &sms);
        if (st != GDN_OK)
            return st;
        const dim3 grid = tile_grid(p, tile);
        if (one_token_bounded((int64_t)grid.x * grid.y * grid.z, sms))
            return launch_tma_instance<K, StateT, InT, KDA, TILE, 1, KDA>(prm, p, tile);
    }
    return launch_tma_instance<K, StateT, InT, KDA, TILE, 1>(prm, p, tile);
}

/* Tokens per sequence of a call (varlen: on average). */
inline int64_t tokens_per_sequence(const gdn_problem *p)
{
    return p->cu_seqlens ? p->T / (p->N > 0 ? p->N : 1) : p->T;
}

/* The tensor-core path (multi-token calls) with its tile, wide or not, and its chunk. */
template <int K, typename StateT, typename InT, bool KDA, bool WIDE, int TC = TOKEN_CHUNK>
gdn_status launch_mma_tile(const RecurrentParams &prm, const gdn_problem *p)
{
    const gdn_status st = gdn_cuda_check(prepare_mma_kernel<K, StateT, InT, KDA, WIDE, TC>(),
                                         "gdn_recurrent_fwd: shared memory attributes");
    if (st != GDN_OK)
        return st;
    return launch_tile_kernel(recurrent_fwd_mma_kernel<K, StateT, InT, KDA, WIDE, TC>, prm, p,
                              mma_tile<K, StateT, WIDE>(p->N, p->HV, p->V),
                              mma_smem_bytes<K, StateT, KDA, WIDE, TC>());
}

/* KDA with an f32 state at K = 128 takes the wide tile for full chunks of 8 tokens, where its
 * stage is largest (decode_sweeps --kda --mma: at T = 8 it beat 64-row tiles at every batch, at
 * T = 4 it lost from 128 pairs on; dev/decode/README.md). */
inline bool use_mma_wide(const gdn_problem *p) { return tokens_per_sequence(p) >= TOKEN_CHUNK; }

/* KDA calls of at most 4 tokens per sequence (varlen: on average, as use_mma_path counts them; a long
 * sequence among short ones then runs in chunks of 4, correct but in twice the chunks, a bf16
 * state rounded in the tile every 4 tokens) take chunks of 4: a stage of half the size, so five
 * CTAs per SM at K = 128, not four, which is faster for both state dtypes at every batch measured
 * but the smallest. GDN keeps chunks of 8: its stage fits five CTAs already, and the short form was
 * slower there. Measurements: dev/decode/README.md. */
inline bool use_mma_short(const gdn_problem *p) { return tokens_per_sequence(p) <= 4; }

template <int K, typename StateT, typename InT, bool KDA>
gdn_status launch_mma(const RecurrentParams &prm, const gdn_problem *p)
{
    if constexpr (mma_has_wide<K, StateT, KDA>()) {
        if (use_mma_wide(p))
            return launch_mma_tile<K, StateT, InT, KDA, true>(prm, p);
    }
    if constexpr (KDA) { /* no GDN instance of the short chunks is built */
        if (use_mma_short(p))
            return launch_mma_tile<K, StateT, InT, KDA, false, 4>(prm, p);
    }
    return launch_mma_tile<K, StateT, InT, KDA, false>(prm, p);
}

/* The tensor-core path takes calls of at least 8 tokens per sequence, at least 4 from 128
 * (sequence, value head) pairs on, or with a bf16 state at least 3 from 256 pairs on (varlen:
 * tokens per sequence on average), on bulk-copy state views at K <= 128 that write no per-step
 * states (step_states, 2-D in-place pools). Its cost hardly grows with the tokens of a chunk; the
 * CUDA-core path's grows by one token loop per token; the thresholds are where the two cross
 * (decode_sweeps --mma; dev/decode/README.md). */
inline bool use_mma_path(const RecurrentParams &prm, const gdn_problem *p)
{
    const int64_t tokens = tokens_per_sequence(p);
    const int64_t pairs = p->N * p->HV;
    const bool enough = tokens >= 8 || (tokens >= 4 && pairs >= 128) ||
                        (tokens >= 3 && p->state_dtype == GDN_DTYPE_BF16 && pairs >= 256);
    return enough && p->K <= 128 && !prm.step_states && !(prm.inplace_state && prm.idx_2d);
}

template <int K, typename StateT, typename InT, bool KDA>
gdn_status dispatch_path(const RecurrentParams &prm, const gdn_problem *p)
{
    constexpr int VE = 16 / sizeof(StateT);
    const bool vec = state_view_vec(p->state_in, VE) && state_view_vec(p->final_state, VE) &&
                     state_view_vec(p->step_states, VE);
    if (!vec) {
        /* KV layout (FLA's and transformers' default) */
        if (state_view_kv(p->state_in) && state_view_kv(p->final_state) && state_view_kv(p->step_states))
            return launch_kv<K, StateT, InT, KDA>(prm, p);
        return launch_generic<K, StateT, InT, false, KDA>(prm, p);
    }
    if constexpr (K <= 128) {
        if (use_mma_path(prm, p))
            return launch_mma<K, StateT, InT, KDA>(prm, p);
    }
    return launch_tma<K, StateT, InT, KDA>(prm, p);
}

template <int K, typename StateT, bool KDA> gdn_status dispatch_input(const RecurrentParams &prm, const gdn_problem *p)
{
    switch (p->q.dtype) {
    case GDN_DTYPE_BF16: return dispatch_path<K, StateT, __nv_bfloat16, KDA>(prm, p);
    case GDN_DTYPE_F16: return dispatch_path<K, StateT, __half, KDA>(prm, p);
    case GDN_DTYPE_F32: return dispatch_path<K, StateT, float, KDA>(prm, p);
    default:
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "gdn_recurrent_fwd: CUDA inputs must be f32, bf16 or f16");
    }
}

template <int K, bool KDA> gdn_status dispatch_state(const RecurrentParams &prm, const gdn_problem *p)
{
    switch (p->state_dtype) {
    case GDN_DTYPE_F32: return dispatch_input<K, float, KDA>(prm, p);
    case GDN_DTYPE_BF16: return dispatch_input<K, __nv_bfloat16, KDA>(prm, p);
    default: return gdn_set_error(GDN_ERR_UNSUPPORTED, "gdn_recurrent_fwd: CUDA state dtype must be f32 or bf16");
    }
}

} /* namespace */

extern "C" size_t gdn_cuda_recurrent_fwd_workspace_size(const gdn_problem *p)
{
    (void)p;
    return 0;
}

/* The CUDA recurrent path's limits: GDN and KDA gates, K and V = 64, 128 or 256, f32 / bf16 / f16
 * inputs, f32 or bf16 states, HV within a grid dimension. */
extern "C" gdn_status gdn_cuda_recurrent_fwd_check(const gdn_problem *p)
{
    if (p->K != 64 && p->K != 128 && p->K != 256)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "q: head dim K = %lld (CUDA recurrent path: 64, 128 or 256)",
                             (long long)p->K);
    if (p->V != 64 && p->V != 128 && p->V != 256)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "v: head dim V = %lld (CUDA recurrent path: 64, 128 or 256)",
                             (long long)p->V);
    if (p->q.dtype != GDN_DTYPE_F32 && p->q.dtype != GDN_DTYPE_BF16 && p->q.dtype != GDN_DTYPE_F16)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "gdn_recurrent_fwd: CUDA inputs must be f32, bf16 or f16");
    if (p->state_dtype != GDN_DTYPE_F32 && p->state_dtype != GDN_DTYPE_BF16)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "gdn_recurrent_fwd: CUDA state dtype must be f32 or bf16");
    if (p->HV > 65535)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "gdn_recurrent_fwd: HV = %lld value heads exceed the CUDA grid",
                             (long long)p->HV);
    return GDN_OK;
}

extern "C" gdn_status gdn_cuda_recurrent_fwd(const gdn_problem *p)
{
    DeviceGuard device;
    const gdn_status dst = device.enter(p->device_ordinal);
    if (dst != GDN_OK)
        return dst;
    if (p->N == 0 || p->HV == 0 || p->V == 0)
        return GDN_OK;

    RecurrentParams prm = {};
    prm.T = p->T;
    prm.HV = p->HV;
    prm.G = p->G;
    prm.V = p->V;
    prm.N = p->N;
    prm.cu_seqlens = p->cu_seqlens;
    prm.q = p->q.data;
    prm.k = p->k.data;
    prm.v = p->v.data;
    prm.o = p->o.data;
    for (int i = 0; i < 4; i++) {
        prm.q_s[i] = p->q.s[i];
        prm.k_s[i] = p->k.s[i];
        prm.v_s[i] = p->v.s[i];
        prm.o_s[i] = p->o.s[i];
    }
    prm.g = (const float *)p->g.data;
    prm.a = p->a.data;
    prm.a_dtype = p->a.dtype;
    for (int i = 0; i < 3; i++) {
        prm.g_s[i] = p->g.s[i];
        prm.a_s[i] = p->a.s[i];
        prm.beta_s[i] = p->beta.s[i];
    }
    prm.A_log = p->A_log;
    prm.dt_bias = (const float *)p->dt_bias.data;
    prm.dt_s = p->dt_bias.s[0];
    prm.softplus_beta = p->softplus_beta;
    prm.softplus_threshold = p->softplus_threshold;
    prm.beta = p->beta.data;
    prm.beta_dtype = p->beta.dtype;
    prm.beta_from_logits = p->beta_from_logits;
    prm.allow_neg_eigval = p->allow_neg_eigval;
    prm.scale = (float)p->scale;
    prm.use_qk_l2norm = p->use_qk_l2norm;
    prm.state_in = p->state_in.data;
    prm.st_in = state_strides(p->state_in);
    prm.num_slots = p->num_slots;
    prm.final_state = p->final_state.data;
    prm.st_fin = state_strides(p->final_state);
    prm.step_states = p->step_states.data;
    prm.st_step = state_strides(p->step_states);
    prm.state_indices = p->state_indices;
    prm.idx_s_n = p->idx_stride_n;
    prm.idx_s_t = p->idx_stride_t;
    prm.idx_cols = p->idx_cols;
    prm.idx_2d = p->state_indices && p->idx_cols > 1;
    prm.num_accepted_tokens = p->num_accepted_tokens;
    prm.inplace_state = p->inplace_state && p->state_indices;
    prm.null_slot_zero = p->null_slot_zero;
    prm.g_sr = p->g.s[3];
    prm.a_sr = p->a.s[3];
    prm.dt_sr = p->dt_bias.s[1];
    prm.lower_bound = p->lower_bound;

    const bool kda = p->gate_kind == GDN_GATE_KDA;
    switch (p->K) {
    case 64: return kda ? dispatch_state<64, true>(prm, p) : dispatch_state<64, false>(prm, p);
    case 128: return kda ? dispatch_state<128, true>(prm, p) : dispatch_state<128, false>(prm, p);
    case 256: return kda ? dispatch_state<256, true>(prm, p) : dispatch_state<256, false>(prm, p);
    default:
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "gdn_recurrent_fwd: CUDA head dim K = %lld (supported: 64, 128, 256)",
                             (long long)p->K);
    }
}
