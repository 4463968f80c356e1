/*
 * bench_decode_common.cuh - what the decode benchmark (bench_decode.cu) and the decode tile sweeps
 * (dev/decode/decode_sweeps.cu) share: the issue's shape, buffer sets with random device fills,
 * the correctness check against the CPU backend, graph-replay timing, the copy ceiling.
 * Public API only (gdn.h).
 */
#ifndef GDN_BENCH_DECODE_COMMON_CUH
#define GDN_BENCH_DECODE_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "gdn.h"

#define CK(call)                                                                                                   \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));                 \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

static const int64_t H = 16, HV = 32, K = 128, V = 128;

/* The gate kind of every call (bench_decode --kda): KDA takes raw a [B, T, HV, K] and dt_bias
 * [HV, K] (one log decay per key channel, softplus gate), GDN a [B, T, HV] and dt_bias [HV]. */
static gdn_gate_kind g_kind = GDN_GATE_GDN;

static int64_t gate_width() { return g_kind == GDN_GATE_KDA ? K : 1; }

/* The pool's layout (bench_decode --kv: KV, FLA's and transformers' [P, HV, K, V]; default VK,
 * vLLM's [P, HV, V, K]). */
static gdn_state_layout g_layout = GDN_STATE_VK;

/* ------------------------------------------------------------------------------------------ */
/* Random device fills (a hash of the index: no generator state, any size)                     */

__device__ float hash_uniform(uint64_t seed, uint64_t i)
{
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + i;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

template <typename T> __global__ void fill_kernel(T *x, int64_t n, uint64_t seed, float amp)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        /* sum of three uniforms: roughly normal, std amp */
        float u = hash_uniform(seed, 3 * i) + hash_uniform(seed, 3 * i + 1) + hash_uniform(seed, 3 * i + 2);
        x[i] = T(u * amp); /* round to nearest, for bf16 too */
    }
}

__global__ void iota_kernel(int32_t *x, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = (int32_t)i;
}

template <typename T> static void fill(T *x, int64_t n, uint64_t seed, float amp)
{
    fill_kernel<T><<<1024, 256>>>(x, n, seed, amp);
    CK(cudaGetLastError());
}

/* ------------------------------------------------------------------------------------------ */
/* One set of buffers for one call                                                             */

struct Set {
    int64_t B, T;
    gdn_dtype sd;
    __nv_bfloat16 *q, *k, *v, *o;
    float *a, *b, *A_log, *dt_bias;
    void *pool;
    int32_t *idx;
};

static size_t state_elems(int64_t B) { return (size_t)(B * HV * V * K); }

static Set make_set(int64_t B, int64_t T, gdn_dtype sd, uint64_t seed)
{
    Set s;
    s.B = B, s.T = T, s.sd = sd;
    size_t nqk = (size_t)(B * T * H * K), nv = (size_t)(B * T * HV * V), ng = (size_t)(B * T * HV);
    size_t na = ng * (size_t)gate_width(), ndt = (size_t)(HV * gate_width());
    CK(cudaMalloc(&s.q, nqk * 2));
    CK(cudaMalloc(&s.k, nqk * 2));
    CK(cudaMalloc(&s.v, nv * 2));
    CK(cudaMalloc(&s.o, nv * 2));
    CK(cudaMalloc(&s.a, na * 4));
    CK(cudaMalloc(&s.b, ng * 4));
    CK(cudaMalloc(&s.A_log, HV * 4));
    CK(cudaMalloc(&s.dt_bias, ndt * 4));
    CK(cudaMalloc(&s.pool, state_elems(B) * gdn_dtype_size(sd)));
    CK(cudaMalloc(&s.idx, (size_t)B * 4));
    fill(s.q, (int64_t)nqk, seed + 1, 0.6f);
    fill(s.k, (int64_t)nqk, seed + 2, 0.6f);
    fill(s.v, (int64_t)nv, seed + 3, 0.6f);
    fill(s.a, (int64_t)na, seed + 4, 0.6f);
    fill(s.b, (int64_t)ng, seed + 5, 0.6f);
    fill(s.A_log, HV, seed + 6, 0.3f);
    fill(s.dt_bias, (int64_t)ndt, seed + 7, 0.3f);
    if (sd == GDN_DTYPE_F32)
        fill((float *)s.pool, (int64_t)state_elems(B), seed + 8, 0.05f);
    else
        fill((__nv_bfloat16 *)s.pool, (int64_t)state_elems(B), seed + 8, 0.05f);
    iota_kernel<<<64, 256>>>(s.idx, B);
    CK(cudaGetLastError());
    return s;
}

static void free_set(Set &s)
{
    void *ps[] = {s.q, s.k, s.v, s.o, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.idx};
    for (void *p : ps)
        CK(cudaFree(p));
}

/* Bytes a call must move at least. */
static double call_bytes(int64_t B, int64_t T, gdn_dtype sd)
{
    double st = 2.0 * (double)state_elems(B) * (double)gdn_dtype_size(sd);
    double io = (double)(B * T) * (2.0 * H * K * 2 + 2.0 * HV * V * 2 + (1.0 + gate_width()) * HV * 4);
    return st + io + (1.0 + gate_width()) * HV * 4 + B * 4.0;
}

/* Arguments for a set, with the given pointers (device or host copies of the same layout). */
static gdn_recurrent_fwd_args make_args(const Set &s, gdn_device_type dev, void *q, void *k, void *v, void *o,
                                        void *a, void *b, void *A_log, void *dt_bias, void *pool, void *idx,
                                        cudaStream_t stream)
{
    gdn_recurrent_fwd_args x;
    memset(&x, 0, sizeof x);
    int64_t qs[4] = {s.B, s.T, H, K}, vs[4] = {s.B, s.T, HV, V}, gs[3] = {s.B, s.T, HV}, hs[1] = {HV};
    int64_t as[4] = {s.B, s.T, HV, K}, dts[2] = {HV, K};
    const bool kda = g_kind == GDN_GATE_KDA;
    int64_t ps[4] = {s.B, HV, g_layout == GDN_STATE_KV ? K : V, g_layout == GDN_STATE_KV ? V : K}, is[1] = {s.B};
    x.q = gdn_tensor_make(q, GDN_DTYPE_BF16, dev, 0, 4, qs);
    x.k = gdn_tensor_make(k, GDN_DTYPE_BF16, dev, 0, 4, qs);
    x.v = gdn_tensor_make(v, GDN_DTYPE_BF16, dev, 0, 4, vs);
    x.o = gdn_tensor_make(o, GDN_DTYPE_BF16, dev, 0, 4, vs);
    x.gate.kind = g_kind;
    x.gate.a = kda ? gdn_tensor_make(a, GDN_DTYPE_F32, dev, 0, 4, as) : gdn_tensor_make(a, GDN_DTYPE_F32, dev, 0, 3, gs);
    x.gate.A_log = gdn_tensor_make(A_log, GDN_DTYPE_F32, dev, 0, 1, hs);
    x.gate.dt_bias = kda ? gdn_tensor_make(dt_bias, GDN_DTYPE_F32, dev, 0, 2, dts)
                         : gdn_tensor_make(dt_bias, GDN_DTYPE_F32, dev, 0, 1, hs);
    x.gate.beta = gdn_tensor_make(b, GDN_DTYPE_F32, dev, 0, 3, gs);
    x.gate.beta_from_logits = 1;
    x.use_qk_l2norm = 1;
    x.state_layout = g_layout;
    x.state = gdn_tensor_make(pool, s.sd, dev, 0, 4, ps);
    x.state_indices = gdn_tensor_make(idx, GDN_DTYPE_I32, dev, 0, 1, is);
    x.inplace_state = 1;
    x.stream = stream;
    return x;
}

static gdn_recurrent_fwd_args set_args(const Set &s, cudaStream_t stream)
{
    return make_args(s, GDN_DEVICE_CUDA, s.q, s.k, s.v, s.o, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.idx, stream);
}

static void api_call(const gdn_recurrent_fwd_args &x)
{
    gdn_status st = gdn_recurrent_fwd(&x);
    if (st != GDN_OK) {
        fprintf(stderr, "gdn_recurrent_fwd: %s (%s)\n", gdn_status_string(st), gdn_last_error());
        exit(1);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Correctness: one call on the device against the CPU backend on copies of the same inputs     */

static void *to_host(const void *d, size_t bytes)
{
    void *h = malloc(bytes);
    CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

static double rel_rms(const void *x, const void *ref, size_t n, gdn_dtype dt)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double a, b;
        if (dt == GDN_DTYPE_F32) {
            a = ((const float *)x)[i], b = ((const float *)ref)[i];
        } else {
            uint32_t ua = (uint32_t)((const uint16_t *)x)[i] << 16, ub = (uint32_t)((const uint16_t *)ref)[i] << 16;
            float fa, fb;
            memcpy(&fa, &ua, 4), memcpy(&fb, &ub, 4);
            a = fa, b = fb;
        }
        if (!isfinite(a))
            return INFINITY;
        num += (a - b) * (a - b), den += b * b;
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static int check_case(gdn_dtype sd, int64_t B, int64_t T)
{
    Set s = make_set(B, T, sd, 99 + (uint64_t)T);
    CK(cudaDeviceSynchronize());
    size_t nqk = (size_t)(B * T * H * K) * 2, nv = (size_t)(B * T * HV * V) * 2, ng = (size_t)(B * T * HV) * 4;
    size_t np = state_elems(B) * gdn_dtype_size(sd), gw = (size_t)gate_width();
    void *hq = to_host(s.q, nqk), *hk = to_host(s.k, nqk), *hv = to_host(s.v, nv), *ha = to_host(s.a, ng * gw),
         *hb = to_host(s.b, ng), *hA = to_host(s.A_log, HV * 4), *hdt = to_host(s.dt_bias, HV * 4 * gw),
         *hpool = to_host(s.pool, np), *hidx = to_host(s.idx, (size_t)B * 4);
    void *ho = calloc(nv, 1);
    api_call(set_args(s, 0));
    CK(cudaDeviceSynchronize());
    void *do_ = to_host(s.o, nv), *dpool = to_host(s.pool, np);
    gdn_recurrent_fwd_args x = make_args(s, GDN_DEVICE_CPU, hq, hk, hv, ho, ha, hb, hA, hdt, hpool, hidx, 0);
    gdn_status st = gdn_recurrent_fwd_workspace_size(&x, &x.workspace_bytes); /* the CPU's scratch */
    if (st == GDN_OK && x.workspace_bytes && !(x.workspace = aligned_alloc(256, (x.workspace_bytes + 255) / 256 * 256)))
        st = GDN_ERR_OUT_OF_MEMORY;
    if (st == GDN_OK)
        st = gdn_recurrent_fwd(&x);
    free(x.workspace);
    double eo = st == GDN_OK ? rel_rms(do_, ho, nv / 2, GDN_DTYPE_BF16) : INFINITY;
    double es = st == GDN_OK ? rel_rms(dpool, hpool, np / gdn_dtype_size(sd), sd) : INFINITY;
    double tol_o = 1e-2, tol_s = sd == GDN_DTYPE_F32 ? 1e-4 : 1e-2;
    int ok = eo <= tol_o && es <= tol_s;
    printf("check vs CPU backend: state %s B=%lld T=%lld: o rel %.2e, state rel %.2e  %s\n",
           sd == GDN_DTYPE_F32 ? "f32" : "bf16", (long long)B, (long long)T, eo, es, ok ? "ok" : "FAIL");
    void *hs[] = {hq, hk, hv, ha, hb, hA, hdt, hpool, hidx, ho, do_, dpool};
    for (void *p : hs)
        free(p);
    free_set(s);
    return ok;
}

/* ------------------------------------------------------------------------------------------ */
/* Timing                                                                                      */

/* Median time per launch (us) of `n` launches captured in one graph, over `reps` replays. */
template <typename F> static double time_graph(cudaStream_t stream, int n, int reps, F launch)
{
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n; i++)
        launch(i);
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, stream)); /* warm-up */
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(e0, stream));
        CK(cudaGraphLaunch(exec, stream));
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return 1000.0 * ms[ms.size() / 2] / n;
}

/* Copy ceiling: 1 GiB device-to-device, events around each copy outside any graph. */
static double copy_gbps(cudaStream_t stream, bool graph)
{
    size_t bytes = (size_t)1 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    double us;
    if (graph) {
        us = time_graph(stream, 4, 7, [&](int) { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream)); });
    } else {
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        std::vector<float> ms;
        for (int r = 0; r < 12; r++) {
            CK(cudaEventRecord(e0, stream));
            CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            if (r >= 2)
                ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        us = 1000.0 * ms[ms.size() / 2];
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * (double)bytes / (us * 1e3);
}

/* Launches per graph: about 3 ms of work, at least 8. */
static int launches_for(double est_us)
{
    int n = (int)(3000.0 / (est_us > 1.0 ? est_us : 1.0));
    return n < 8 ? 8 : (n > 400 ? 400 : n);
}

static double est_us(int64_t B, int64_t T, gdn_dtype sd) { return 2.0 + call_bytes(B, T, sd) / 2.5e6 + T; }

/* Hot and cold time per call through the public API. */
static void time_api(cudaStream_t stream, int64_t B, int64_t T, gdn_dtype sd, size_t l2, double *hot, double *cold)
{
    double set_bytes = call_bytes(B, T, sd);
    int nsets = (int)ceil(3.0 * (double)l2 / set_bytes);
    nsets = nsets < 1 ? 1 : nsets;
    std::vector<Set> sets;
    std::vector<gdn_recurrent_fwd_args> args;
    for (int i = 0; i < nsets; i++) {
        sets.push_back(make_set(B, T, sd, 1000 + (uint64_t)i));
        args.push_back(set_args(sets.back(), stream));
    }
    CK(cudaDeviceSynchronize());
    int n = launches_for(est_us(B, T, sd));
    *hot = time_graph(stream, n, 7, [&](int) { api_call(args[0]); });
    int nc = std::max(n, std::min(nsets, 400));
    *cold = time_graph(stream, nc, 7, [&](int i) { api_call(args[i % nsets]); });
    for (Set &s : sets)
        free_set(s);
}

/* Percent of the copy ceiling (GB/s) reached by moving `bytes` in `us`. */
static double pct_copy(double bytes, double us, double copy)
{
    return 100.0 * bytes / (us * 1e3) / copy;
}

/* ------------------------------------------------------------------------------------------ */

/* A comma-separated list of positive integers, e.g. "1,2,4,8". */
static std::vector<int64_t> parse_list(const char *s)
{
    std::vector<int64_t> out;
    for (char *end; *s; s = *end ? end + 1 : end) {
        long long x = strtoll(s, &end, 10);
        if (end == s || x < 1 || (*end && *end != ',')) {
            fprintf(stderr, "bad list '%s' (want e.g. 1,2,4,8)\n", s);
            exit(2);
        }
        out.push_back((int64_t)x);
    }
    return out;
}

#endif /* GDN_BENCH_DECODE_COMMON_CUH */
