/*
 * sm90_recurrent_fwd.cu - recurrent forward (decode / multi-token verify) on Hopper: the launcher.
 * Picks a compile-time instance of a kernel by head dim, state dtype and input dtype, and the
 * path. When every state view has K contiguous and 16-byte aligned rows (the VK pools engines
 * use): single-token calls with few (sequence, value head) pairs take the latency path
 * (sm90_recurrent_rows.cuh), multi-token calls with many the persistent double-buffered path
 * (sm90_recurrent_stream.cuh), the others the bulk-copy fast path (sm90_recurrent_kernel.cuh);
 * else the element-wise generic path (KV layout, unaligned strides). Then a tile / CTA size by
 * batch. Grid: (row blocks, HV, sequences), the kernels looping over sequences beyond 65535, or
 * (persistent) about two CTAs per SM. Every kernel is launched with programmatic stream
 * serialization: its launch overlaps the end of the previous kernel in the stream, and it waits
 * for that grid before its first global access (grid_dependency_sync).
 */
#include "cuda_common.cuh"
#include "sm90_recurrent_rows.cuh"
#include "sm90_recurrent_stream.cuh"

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

bool single_token_call(const gdn_problem *p)
{
    return p->cu_seqlens ? p->T <= p->N : p->T == 1;
}

/* One launch with programmatic stream serialization (see the header). */
template <typename... Args>
gdn_status launch(void (*kernel)(Args...), dim3 grid, int threads, size_t smem, const gdn_problem *p, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3((unsigned)threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = (cudaStream_t)p->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return gdn_cuda_check(cudaLaunchKernelEx(&cfg, kernel, args...), "gdn_recurrent_fwd: kernel launch");
}

dim3 grid_3d(int64_t row_blocks, const gdn_problem *p)
{
    return dim3((unsigned)row_blocks, (unsigned)p->HV, (unsigned)(p->N < 65535 ? p->N : 65535));
}

/* The generic path: state rows element by element, straight to registers. */
template <int K, typename StateT, typename InT, bool VEC>
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
    return launch(recurrent_fwd_kernel<K, StateT, InT, RPL, VEC>, grid_3d((warps_per_head + warps - 1) / warps, p),
                  32 * warps, 0, p, prm);
}

/* The fast path: bulk copies of whole rows into a shared-memory tile. */
template <int K, typename StateT, typename InT> gdn_status launch_tma(const RecurrentParams &prm, const gdn_problem *p)
{
    constexpr int RPL = default_rows_per_lane<K, StateT>();
    constexpr int ROWS_PER_WARP = 4 * RPL;
    /* The largest tile that still gives about two CTAs per SM (132 on an H100). Two warps per CTA
     * for f32 single-token decode (more CTAs fit per SM), four otherwise (the token loop is
     * compute; bf16 tiles hold twice the rows). Measured: bench_decode --variants. */
    int rows = tile_rows<K, StateT>();
    while (rows > ROWS_PER_WARP && p->N * p->HV * ((p->V + rows - 1) / rows) < 256)
        rows /= 2;
    const int64_t v_rounded = (p->V + ROWS_PER_WARP - 1) / ROWS_PER_WARP * ROWS_PER_WARP;
    if (rows > v_rounded)
        rows = (int)v_rounded;
    int warps = sizeof(StateT) == 4 && single_token_call(p) ? 2 : 4;
    if (warps > rows / ROWS_PER_WARP)
        warps = rows / ROWS_PER_WARP;
    const gdn_status st = gdn_cuda_check(prefer_shared_tma_kernel<K, StateT, InT, RPL>(), "gdn_recurrent_fwd: carveout");
    if (st != GDN_OK)
        return st;
    return launch(recurrent_fwd_tma_kernel<K, StateT, InT, RPL>, grid_3d((p->V + rows - 1) / rows, p), 32 * warps, 0,
                  p, prm, rows);
}

/* The latency path: rows straight to registers, no shared memory, no barriers. Warps per CTA:
 * the most (up to 4) that still give about 4 CTAs per SM. */
template <int K, typename StateT, typename InT> gdn_status launch_rows(const RecurrentParams &prm, const gdn_problem *p)
{
    constexpr int RPL = default_rows_per_lane<K, StateT>();
    constexpr int ROWS_PER_WARP = 4 * RPL;
    int warps = 4;
    while (warps > 1 && p->N * p->HV * ((p->V + ROWS_PER_WARP * warps - 1) / (ROWS_PER_WARP * warps)) < 528)
        warps /= 2;
    return launch(recurrent_fwd_rows_kernel<K, StateT, InT, RPL>,
                  grid_3d((p->V + ROWS_PER_WARP * warps - 1) / (ROWS_PER_WARP * warps), p), 32 * warps, 0, p, prm);
}

/* Threads per CTA of the persistent path: 8 warps, so that one pass of a 64-row f32 tile (128
 * rows for bf16) keeps every warp of the CTA busy. */
constexpr int kStreamThreads = 256;

/* The persistent path, when it has at least kStreamMinItems work items per CTA: a grid of as many
 * CTAs as fit on the device (two per SM at K = 128), each walking work items of a whole tile.
 * *launched is false (and nothing happened) when the call is too small for it. */
constexpr int64_t kStreamMinItems = 8;

template <int K, typename StateT, typename InT>
gdn_status launch_stream(const RecurrentParams &prm, const gdn_problem *p, bool *launched)
{
    constexpr int RPL = default_rows_per_lane<K, StateT>();
    constexpr int ROWS_PER_WARP = 4 * RPL;
    *launched = false;
    const int64_t v_rounded = (p->V + ROWS_PER_WARP - 1) / ROWS_PER_WARP * ROWS_PER_WARP;
    const int rows = (int)(tile_rows<K, StateT>() < v_rounded ? tile_rows<K, StateT>() : v_rounded);
    const int nrb = (int)((p->V + rows - 1) / rows);
    const int64_t items = p->N * p->HV * nrb;
    int sms = 0, per_sm = 0;
    gdn_status st = gdn_cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p->device_ordinal),
                                   "gdn_recurrent_fwd: device attribute");
    if (st == GDN_OK)
        st = gdn_cuda_check(stream_kernel_setup<K, StateT, InT, RPL>(kStreamThreads, &per_sm),
                            "gdn_recurrent_fwd: persistent kernel setup");
    if (st != GDN_OK)
        return st;
    const int64_t ctas = (int64_t)sms * per_sm;
    if (ctas < 1 || items < kStreamMinItems * ctas)
        return GDN_OK;
    *launched = true;
    return launch(recurrent_fwd_stream_kernel<K, StateT, InT, RPL>, dim3((unsigned)ctas), kStreamThreads,
                  sizeof(StreamSmem<K, StateT>), p, prm, rows, nrb, items);
}

/* (sequence, value head) pairs up to which single-token calls take the latency path. */
constexpr int64_t kRowsPathMaxHeads = 32;

template <int K, typename StateT, typename InT> gdn_status dispatch_path(const RecurrentParams &prm, const gdn_problem *p)
{
    constexpr int VE = 16 / sizeof(StateT);
    const bool vec = state_view_vec(p->state_in, VE) && state_view_vec(p->final_state, VE) &&
                     state_view_vec(p->step_states, VE);
    if (!vec)
        return launch_generic<K, StateT, InT, false>(prm, p);
    if (single_token_call(p)) {
        if (p->N * p->HV <= kRowsPathMaxHeads)
            return launch_rows<K, StateT, InT>(prm, p);
    } else {
        bool launched;
        const gdn_status st = launch_stream<K, StateT, InT>(prm, p, &launched);
        if (st != GDN_OK || launched)
            return st;
    }
    return launch_tma<K, StateT, InT>(prm, p);
}

template <int K, typename StateT> gdn_status dispatch_input(const RecurrentParams &prm, const gdn_problem *p)
{
    switch (p->q.dtype) {
    case GDN_DTYPE_BF16: return dispatch_path<K, StateT, __nv_bfloat16>(prm, p);
    case GDN_DTYPE_F16: return dispatch_path<K, StateT, __half>(prm, p);
    case GDN_DTYPE_F32: return dispatch_path<K, StateT, float>(prm, p);
    default:
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "gdn_recurrent_fwd: CUDA inputs must be f32, bf16 or f16");
    }
}

template <int K> gdn_status dispatch_state(const RecurrentParams &prm, const gdn_problem *p)
{
    switch (p->state_dtype) {
    case GDN_DTYPE_F32: return dispatch_input<K, float>(prm, p);
    case GDN_DTYPE_BF16: return dispatch_input<K, __nv_bfloat16>(prm, p);
    default: return gdn_set_error(GDN_ERR_UNSUPPORTED, "gdn_recurrent_fwd: CUDA state dtype must be f32 or bf16");
    }
}

} /* namespace */

extern "C" size_t gdn_cuda_recurrent_fwd_workspace_size(const gdn_problem *p)
{
    (void)p;
    return 0;
}

extern "C" gdn_status gdn_cuda_recurrent_fwd(const gdn_problem *p)
{
    if (p->gate_kind != GDN_GATE_GDN)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "gdn_recurrent_fwd: the CUDA backend supports GDN gates only");
    if (p->N == 0 || p->HV == 0 || p->V == 0)
        return GDN_OK;
    if (p->HV > 65535)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "gdn_recurrent_fwd: HV = %lld value heads exceed the CUDA grid",
                             (long long)p->HV);

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
    prm.scale = p->scale;
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

    switch (p->K) {
    case 64: return dispatch_state<64>(prm, p);
    case 128: return dispatch_state<128>(prm, p);
    case 256: return dispatch_state<256>(prm, p);
    default:
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "gdn_recurrent_fwd: CUDA head dim K = %lld (supported: 64, 128, 256)",
                             (long long)p->K);
    }
}
