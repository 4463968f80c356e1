/*
 * cuda_gating.cu - the gating op on CUDA: raw a, b -> g (f32) and beta, for GDN and KDA.
 *
 * Elementwise: one thread per (b, t, hv, r) of g (r = 0 only for GDN); the r = 0 thread of each
 * (b, t, hv) also writes beta. Grid-stride loop with 64-bit indices. Accurate expf / log1pf: the
 * results are judged against float64.
 */
#include "cuda_common.cuh"
#include "cuda_gate.cuh"

namespace {

struct GatingParams {
    int64_t T, HV, K, total;                 /* total = B * T * HV * K */
    const void *a;                           /* s = {b, t, hv, r} */
    gdn_dtype a_dtype;
    int64_t a_s[4];
    const float *A_log;                      /* [HV] */
    const float *dt_bias;                    /* s = {hv, r}; may be NULL */
    int64_t dt_s[2];
    float lower_bound, softplus_beta, softplus_threshold;
    float *g;                                /* f32, s = {b, t, hv, r} */
    int64_t g_s[4];
    const void *b;                           /* s = {b, t, hv}; may be NULL */
    gdn_dtype b_dtype;
    int64_t b_s[3];
    int allow_neg_eigval;
    void *beta;                              /* s = {b, t, hv} */
    gdn_dtype beta_dtype;
    int64_t beta_s[3];
};

__global__ void gating_kernel(const GatingParams p)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < p.total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i % p.K;
        const int64_t hv = (i / p.K) % p.HV;
        const int64_t t = (i / (p.K * p.HV)) % p.T;
        const int64_t b = i / (p.K * p.HV * p.T);

        const float x = load_elem(p.a, p.a_dtype, b * p.a_s[0] + t * p.a_s[1] + hv * p.a_s[2] + r * p.a_s[3]);
        const float dt = p.dt_bias ? p.dt_bias[hv * p.dt_s[0] + r * p.dt_s[1]] : 0.0f;
        const float g =
            gate_log_decay_kda(x, dt, p.A_log[hv], p.lower_bound, p.softplus_beta, p.softplus_threshold);
        p.g[b * p.g_s[0] + t * p.g_s[1] + hv * p.g_s[2] + r * p.g_s[3]] = g;

        if (p.b && r == 0) {
            const float beta =
                gate_beta(load_elem(p.b, p.b_dtype, b * p.b_s[0] + t * p.b_s[1] + hv * p.b_s[2]), p.allow_neg_eigval);
            store_elem(p.beta, p.beta_dtype, b * p.beta_s[0] + t * p.beta_s[1] + hv * p.beta_s[2], beta);
        }
    }
}

} /* namespace */

extern "C" gdn_status gdn_cuda_gating(const gdn_gating_problem *p)
{
    DeviceGuard device;
    const gdn_status dst = device.enter(p->device_ordinal);
    if (dst != GDN_OK)
        return dst;
    GatingParams prm = {};
    prm.T = p->T;
    prm.HV = p->HV;
    prm.K = p->kind == GDN_GATE_KDA ? p->K : 1;
    prm.total = p->B * p->T * p->HV * prm.K;
    if (prm.total == 0)
        return GDN_OK;
    prm.a = p->a.data;
    prm.a_dtype = p->a.dtype;
    prm.A_log = p->A_log;
    prm.dt_bias = (const float *)p->dt_bias.data;
    prm.dt_s[0] = p->dt_bias.s[0];
    prm.dt_s[1] = p->dt_bias.s[1];
    prm.lower_bound = p->kind == GDN_GATE_KDA ? p->lower_bound : 0.0f;
    prm.softplus_beta = p->softplus_beta;
    prm.softplus_threshold = p->softplus_threshold;
    prm.g = (float *)p->g_out.data;
    for (int i = 0; i < 4; i++) {
        prm.a_s[i] = p->a.s[i];
        prm.g_s[i] = p->g_out.s[i];
    }
    prm.b = p->b.data;
    prm.b_dtype = p->b.dtype;
    prm.allow_neg_eigval = p->allow_neg_eigval;
    prm.beta = p->beta_out.data;
    prm.beta_dtype = p->beta_out.dtype;
    for (int i = 0; i < 3; i++) {
        prm.b_s[i] = p->b.s[i];
        prm.beta_s[i] = p->beta_out.s[i];
    }

    const int threads = 256;
    const int64_t want = (prm.total + threads - 1) / threads;
    const unsigned blocks = (unsigned)(want < 65536 ? want : 65536);
    gating_kernel<<<blocks, threads, 0, (cudaStream_t)p->stream>>>(prm);
    return gdn_cuda_check(cudaGetLastError(), "gdn_gating: kernel launch");
}
