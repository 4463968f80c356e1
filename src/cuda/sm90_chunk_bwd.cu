/*
 * sm90_chunk_bwd.cu - gdn_chunk_bwd on CUDA (GDN gates): limits, workspace, launches of the
 * passes in sm90_chunk_bwd.cuh (which documents them).
 *
 * The backward reads the state entering every chunk (K V 16-bit values, as S^T) and the chunk's
 * record (19200 B) from the forward's saved states (gdn_chunk_fwd_args.saved_states, saved_bytes:
 * 812 B per token and value head at K = V = 128). Where the caller gives none, it runs that
 * forward itself first (gdn_cuda_chunk_fwd with saving, into its own workspace, o to a scratch
 * tile, no final state): the same kernels, so the same states and records, and the same
 * gradients bit for bit. Its workspace holds the gradient of the state leaving every chunk (2 K V:
 * hi and lo parts, 1024 B per token and value head at K = V = 128) and the gate partials; without
 * saved states also the saved states, o and the forward's own workspace; with context
 * parallelism (few pairs of fixed length, gdn_chunk::plan_cp) the segments' maps and starts.
 * Chunk slots follow the forward's map (varlen: sequence n starts at slot floor(cu[n] / 64) + n),
 * so cu_seqlens is read on the device only. No allocation, no host sync; bitwise repeatable (no
 * atomics, fixed orders).
 */
#include "cuda_pack.cuh"
#include "sm90_chunk_bwd.cuh"

namespace gdn_bwd {

static size_t align256(size_t x) { return (x + 255) / 256 * 256; }

struct WsPlan {
    size_t o, fwd, fwd_bytes;        /* without saved states: after the saved states (at 0), o and the
                                      * forward's workspace */
    size_t dS, gpart, cp, bytes;     /* cp: the reverse chain's segment maps and starts, if any */
    gdn_chunk::CpPlan seg;
};

/* The forward that the backward runs where nothing was saved, writing into ws at the plan's
 * offsets (ws may be NULL for the workspace query: only offsets and alignment matter there). */
static gdn_problem forward_problem(const gdn_problem *p, unsigned char *ws, const WsPlan &w)
{
    gdn_problem f = *p;
    const uintptr_t base = (uintptr_t)ws;
    f.saved_states = ws;
    f.o.data = reinterpret_cast<void *>(base + w.o);
    f.o.dtype = p->q.dtype;
    contiguous_strides(p->T, p->HV, p->V, f.o.s);
    f.final_state = gdn_view{};
    f.workspace = reinterpret_cast<void *>(base + w.fwd);
    f.workspace_bytes = w.fwd_bytes;
    return f;
}

static WsPlan plan_ws(const gdn_problem *p)
{
    const size_t units = (size_t)slots_per_head(p) * (size_t)p->HV;
    WsPlan w = {};
    if (!p->saved_states) {
        w.o = align256(saved_bytes(p));
        w.fwd = w.o + align256((size_t)(p->B * p->T * p->HV * p->V) * 2);
        const gdn_problem f = forward_problem(p, nullptr, w);
        w.fwd_bytes = gdn_cuda_chunk_fwd_workspace_size(&f);
        w.dS = w.fwd + align256(w.fwd_bytes);
    }
    w.gpart = w.dS + align256(units * (size_t)(p->K * p->V) * 4);
    w.cp = w.gpart + align256(units * sizeof(float2));
    w.seg = gdn_chunk::plan_cp(p);
    w.bytes = w.cp + align256(gdn_chunk::cp_ws_bytes(p, w.seg));
    return w;
}

template <typename KernelT>
static gdn_status launch(KernelT kernel, dim3 grid, int threads, int smem, cudaStream_t stream, const BwdParams &prm,
                         const char *what)
{
    if (grid.x == 0 || grid.y == 0)
        return GDN_OK;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess) {
        kernel<<<grid, threads, smem, stream>>>(prm);
        err = cudaGetLastError();
    }
    return gdn_cuda_check(err, what);
}

template <typename T, int K, int V>
static gdn_status launch_all(const BwdParams &prm, cudaStream_t stream)
{
    gdn_status st;
    const unsigned pairs = (unsigned)(prm.N * prm.HV);
    if (prm.seg_chunks > 0) { /* context parallelism: the segments' maps, then their starts */
        if ((st = launch(bwd_rev_kernel<T, K, true>, dim3((unsigned)(prm.nseg - 1) * pairs * ((V + K) / 64)), REV_THREADS,
                         RevSmem<K>::BYTES, stream, prm, "bwd_rev (segment maps)")) != GDN_OK)
            return st;
        if ((st = launch(bwd_scan_kernel<K>, dim3(pairs * (unsigned)(V / gdn_chunk::SCAN_ROWS)),
                         gdn_chunk::scan_threads<K>(), gdn_chunk::scan_smem_bytes<K>(), stream, prm, "bwd_scan")) != GDN_OK)
            return st;
    }
    if ((st = launch(bwd_rev_kernel<T, K, false>, dim3((unsigned)prm.nseg * pairs * (V / 64)), REV_THREADS,
                     RevSmem<K>::BYTES, stream, prm, "bwd_rev")) != GDN_OK)
        return st;
    if constexpr (grad_two_ctas<K, V>()) {
        /* Two CTAs per SM (launch bounds) only with the whole shared memory as carveout. */
        const cudaError_t err = cudaFuncSetAttribute(bwd_grad_kernel<T, K, V>,
                                                     cudaFuncAttributePreferredSharedMemoryCarveout,
                                                     (int)cudaSharedmemCarveoutMaxShared);
        if (err != cudaSuccess)
            return gdn_cuda_check(err, "bwd_grad (carveout)");
    }
    if ((st = launch(bwd_grad_kernel<T, K, V>, dim3((unsigned)(prm.slots * prm.H)), GRAD_THREADS,
                     GradSmem<T, K, V>::BYTES, stream, prm, "bwd_grad")) != GDN_OK)
        return st;
    if (prm.a.data)
        return launch(bwd_gate_kernel, dim3((unsigned)prm.HV), 256, 0, stream, prm, "bwd_gate");
    return GDN_OK;
}

template <typename T>
static gdn_status launch_dims(const gdn_problem *p, const BwdParams &prm, cudaStream_t stream)
{
    if (p->K == 64)
        return p->V == 64 ? launch_all<T, 64, 64>(prm, stream) : launch_all<T, 64, 128>(prm, stream);
    return p->V == 64 ? launch_all<T, 128, 64>(prm, stream) : launch_all<T, 128, 128>(prm, stream);
}

} /* namespace gdn_bwd */

using namespace gdn_bwd;

/* The CUDA backward's limits: bf16 / f16 inputs, K and V of 64 or 128, f32 or bf16 states. */
extern "C" gdn_status gdn_cuda_chunk_bwd_check(const gdn_bwd_problem *bp)
{
    const gdn_problem *p = &bp->fwd;
    if (p->q.dtype != GDN_DTYPE_BF16 && p->q.dtype != GDN_DTYPE_F16)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "q: the CUDA backward takes bf16 or f16 inputs");
    if (p->K != 64 && p->K != 128)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "q: head dim K = %lld (CUDA backward: 64 or 128)", (long long)p->K);
    if (p->V != 64 && p->V != 128)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "v: head dim V = %lld (CUDA backward: 64 or 128)", (long long)p->V);
    if (p->state_dtype != GDN_DTYPE_F32 && p->state_dtype != GDN_DTYPE_BF16)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "state: f32 or bf16 on CUDA");
    if (slots_per_head(p) * p->HV > INT32_MAX || p->N * p->HV * (p->V / 64) > INT32_MAX)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "q: %lld tokens x %lld value heads exceed the CUDA backward's grid",
                             (long long)p->T, (long long)p->HV);
    return GDN_OK;
}

/* The bytes of states the forward saves for this backward: 0 where the backward would not take the
 * call (it then recomputes nothing it could have read). */
extern "C" size_t gdn_cuda_chunk_saved_states_size(const gdn_problem *p)
{
    const bool takes = p->gate_kind == GDN_GATE_GDN && (p->q.dtype == GDN_DTYPE_BF16 || p->q.dtype == GDN_DTYPE_F16) &&
                       (p->K == 64 || p->K == 128) && (p->V == 64 || p->V == 128) && !p->state_indices;
    return takes ? saved_bytes(p) : 0;
}

extern "C" size_t gdn_cuda_chunk_bwd_workspace_size(const gdn_bwd_problem *bp) { return plan_ws(&bp->fwd).bytes; }

extern "C" gdn_status gdn_cuda_chunk_bwd(const gdn_bwd_problem *bp)
{
    const gdn_problem *p = &bp->fwd;
    DeviceGuard device;
    const gdn_status dst = device.enter(p->device_ordinal);
    if (dst != GDN_OK)
        return dst;
    cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    BwdParams prm = {};
    prm.T = p->T;
    prm.N = p->N;
    prm.H = p->H;
    prm.HV = p->HV;
    prm.G = p->G;
    prm.V = p->V;
    prm.cps = (p->T + C - 1) / C;
    prm.slots = slots_per_head(p);
    prm.cu = p->cu_seqlens;
    prm.q = p->q;
    prm.k = p->k;
    prm.v = p->v;
    prm.d_o = bp->d_o;
    prm.g = p->g;
    prm.a = p->a;
    prm.beta = p->beta;
    prm.A_log = p->A_log;
    prm.dt_bias = static_cast<const float *>(p->dt_bias.data);
    prm.dt_h = p->dt_bias.s[0];
    prm.sp_beta = p->softplus_beta;
    prm.sp_threshold = p->softplus_threshold;
    prm.beta_from_logits = p->beta_from_logits;
    prm.allow_neg_eigval = p->allow_neg_eigval;
    prm.scale = (float)p->scale;
    prm.l2norm = p->use_qk_l2norm;
    prm.state_dtype = p->state_dtype;
    prm.dht = bp->dht;
    prm.dh0 = bp->dh0;
    prm.dq = bp->dq;
    prm.dk = bp->dk;
    prm.dv = bp->dv;
    prm.dg = bp->dg;
    prm.da = bp->da;
    prm.dbeta = bp->dbeta;
    prm.dA_log = bp->dA_log;
    prm.ddt_bias = bp->ddt_bias;
    const WsPlan w = plan_ws(p);
    unsigned char *ws = static_cast<unsigned char *>(p->workspace);
    prm.dS = ws + w.dS;
    prm.gpart = reinterpret_cast<float2 *>(ws + w.gpart);
    prm.nseg = w.seg.nseg;
    prm.seg_chunks = w.seg.seg_chunks;
    prm.cp_pre = reinterpret_cast<float *>(ws + w.cp);
    prm.cp_start = prm.cp_pre + (size_t)(p->N * p->HV * w.seg.nseg) * (size_t)(p->V + p->K) * (size_t)p->K;
    if (p->HV == 0)
        return GDN_OK;
    if (p->N == 0) {
        /* No sequence (the API asks N >= 1; this keeps the backend whole on its own): only the
         * gate-parameter sums exist, zeros written through their strides by bwd_gate over no slots. */
        prm.slots = 0;
        return prm.a.data ? launch(bwd_gate_kernel, dim3((unsigned)prm.HV), 256, 0, stream, prm, "bwd_gate") : GDN_OK;
    }
    /* The states and records: the caller's saved ones, or those of the forward run here. */
    void *saved = p->saved_states;
    if (!saved) {
        const gdn_problem f = forward_problem(p, ws, w);
        const gdn_status st = gdn_cuda_chunk_fwd(&f);
        if (st != GDN_OK)
            return st;
        saved = f.saved_states;
    }
    prm.S = saved;
    prm.rec = static_cast<unsigned char *>(saved) + saved_rec_offset(p);
    prm.tma = gdn_cuda_tma_rows(&prm.tm_q, &p->q, p->B, p->T, p->H, p->K) &&
              gdn_cuda_tma_rows(&prm.tm_k, &p->k, p->B, p->T, p->H, p->K) &&
              gdn_cuda_tma_rows(&prm.tm_do, &bp->d_o, p->B, p->T, p->HV, p->V) &&
              gdn_cuda_tma_mat(&prm.tm_rec, prm.rec, p->q.dtype, (int64_t)prm.slots * p->HV * (REC_BYTES / 128), 64) &&
              gdn_cuda_tma_mat(&prm.tm_ds, prm.dS, p->q.dtype, (int64_t)prm.slots * p->HV * 2 * p->K, p->V);
    prm.tma_dv = gdn_cuda_tma_rows(&prm.tm_dv, &bp->dv, p->B, p->T, p->HV, p->V);
    prm.tma_grad = prm.tma && gdn_cuda_tma_rows(&prm.tm_v, &p->v, p->B, p->T, p->HV, p->V) &&
                   gdn_cuda_tma_mat(&prm.tm_s, prm.S, p->q.dtype, (int64_t)prm.slots * p->HV * p->V, p->K);
    prm.tma_dqk = gdn_cuda_tma_rows(&prm.tm_dq, &bp->dq, p->B, p->T, p->H, p->K) &&
                  gdn_cuda_tma_rows(&prm.tm_dk, &bp->dk, p->B, p->T, p->H, p->K);
    return p->q.dtype == GDN_DTYPE_BF16 ? launch_dims<__nv_bfloat16>(p, prm, stream) : launch_dims<__half>(p, prm, stream);
}
