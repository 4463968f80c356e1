/*
 * sm90_chunk_bwd.cu - gdn_chunk_bwd on CUDA (GDN gates): limits, workspace, launches of the
 * passes in sm90_chunk_bwd.cuh (which documents them).
 *
 * Storage: per (chunk slot, value head) the backward keeps a record (19200 B), the state entering
 * the chunk (K V 16-bit values, as S^T) and the gradient of the state leaving it (2 K V: hi and lo
 * parts): 1836 B of workspace per token and value head at K = V = 128. Where the forward saved them
 * (gdn_chunk_fwd_args.saved_states, saved_bytes: 812 B per token and value head, the states written
 * by chunk_wg's output warpgroup, the records by chunk_prep), the backward reads the states and the
 * records from there: the workspace drops both (1024 B), and neither bwd_prep nor bwd_chain runs.
 * Chunk slots follow the forward's map
 * (varlen: sequence n starts at slot floor(cu[n] / 64) + n), so cu_seqlens is read on the device
 * only. No allocation, no host sync; bitwise repeatable (no atomics, fixed orders).
 */
#include "sm90_chunk_bwd.cuh"

namespace gdn_bwd {

static size_t align256(size_t x) { return (x + 255) / 256 * 256; }

struct WsPlan {
    size_t rec, S, dS, gpart, bytes;
};

/* Without saved states: the records, then the states entering the chunks ([HV][slots][V][K] in the
 * input type); with them, neither. */
static WsPlan plan_ws(const gdn_problem *p)
{
    const size_t units = (size_t)slots_per_head(p) * (size_t)p->HV;
    WsPlan w;
    w.rec = 0;
    w.S = w.rec + (p->saved_states ? 0 : align256(units * REC_BYTES));
    w.dS = w.S + (p->saved_states ? 0 : align256(saved_tiles_bytes(p)));
    w.gpart = w.dS + align256(units * (size_t)(p->K * p->V) * 4);
    w.bytes = w.gpart + align256(units * sizeof(float2));
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
    const unsigned units = (unsigned)(prm.slots * prm.HV);
    /* The records: the forward's where it saved them. */
    if (!prm.S_saved &&
        (st = launch(bwd_prep_kernel<T, K>, dim3(units), 128, PrepBwdSmem<T, K>::BYTES, stream, prm, "bwd_prep")) !=
            GDN_OK)
        return st;
    /* The forward chain only where the forward did not save the states; then the reverse chain. */
    if (!prm.S_saved) {
        const unsigned ctas = (unsigned)(prm.N * prm.HV * (V / prm.chain_vs));
        st = prm.chain_vs == 16 ? launch(bwd_chain_kernel<T, K, 16>, dim3(ctas), CHAIN_THREADS, ChainSmem<T, K, 16>::BYTES,
                                         stream, prm, "bwd_chain")
                                : launch(bwd_chain_kernel<T, K, 32>, dim3(ctas), CHAIN_THREADS, ChainSmem<T, K, 32>::BYTES,
                                         stream, prm, "bwd_chain");
        if (st != GDN_OK)
            return st;
    }
    if ((st = launch(bwd_rev_kernel<T, K>, dim3((unsigned)(prm.N * prm.HV * (V / 64))), REV_THREADS,
                     RevSmem<K>::BYTES, stream, prm, "bwd_rev")) != GDN_OK)
        return st;
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
    if (slots_per_head(p) * p->HV > INT32_MAX || p->N * p->HV * (p->V / 16) > INT32_MAX)
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
    prm.scale = p->scale;
    prm.l2norm = p->use_qk_l2norm;
    prm.state_dtype = p->state_dtype;
    prm.h0 = p->state_in;
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
    prm.rec = p->saved_states ? static_cast<unsigned char *>(p->saved_states) + saved_rec_offset(p) : ws + w.rec;
    prm.S = p->saved_states ? p->saved_states : ws + w.S;
    prm.S_saved = p->saved_states != nullptr;
    /* The forward chain's value columns per CTA: 16 where 32 would leave more than half of the SMs
     * idle (its CTAs run one per SM): shorter steps on twice the CTAs. */
    prm.chain_vs = p->N * p->HV * (p->V / 32) <= sm_count(p) / 2 ? 16 : 32;
    prm.dS = ws + w.dS;
    prm.gpart = reinterpret_cast<float2 *>(ws + w.gpart);
    if (p->HV == 0)
        return GDN_OK;
    if (p->N == 0) {
        /* No sequence (the API asks N >= 1; this keeps the backend whole on its own): only the
         * gate-parameter sums exist, zeros written through their strides by bwd_gate over no slots. */
        prm.slots = 0;
        return prm.a.data ? launch(bwd_gate_kernel, dim3((unsigned)prm.HV), 256, 0, stream, prm, "bwd_gate") : GDN_OK;
    }
    return p->q.dtype == GDN_DTYPE_BF16 ? launch_dims<__nv_bfloat16>(p, prm, stream) : launch_dims<__half>(p, prm, stream);
}
