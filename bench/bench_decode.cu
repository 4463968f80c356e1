/*
 * bench_decode.cu - decode / multi-token verify benchmark of gdn_recurrent_fwd on CUDA.
 *
 * Shape of the issue: H = 16, HV = 32, K = V = 128, bf16 q/k/v, q/k l2 norm in-kernel, gating from
 * raw a / b / A_log / dt_bias in-kernel, a state pool [B, HV, V, K] (VK) updated in place through
 * 1-D state_indices, as serving engines call it. For state f32 and bf16, T in {1, 2, 4, 8},
 * B in {1, 8, 32, 64, 128, 256, 512}:
 *   - time per call under CUDA graph replay, hot (one buffer set: small states sit in L2) and
 *     cold (rotating buffer sets together larger than 3x L2);
 *   - effective bandwidth over every byte that must move (state read + write, q/k/v/o, a/b,
 *     A_log/dt_bias, indices) and its fraction of the copy ceiling: a 1 GiB device-to-device
 *     copy timed with events outside graph replay (under replay it reads lower and would flatter).
 * Before timing, it checks one small case of each state dtype against the CPU backend.
 * With --variants it also times tile shapes the launcher does not pick (fast path: tile rows and
 * warps per CTA; the register path with 16-byte pieces) by launching the kernel templates directly.
 * With --pdl it times, for the T and B of --T / --B, the fast path with the launcher's tile
 * launched with and without programmatic dependent launch (hot and cold): the data behind the
 * launcher's tma_use_pdl. --tiles times fast-path tiles and the register path at those T and B;
 * --mma times the tensor-core path's tiles (sm90_recurrent_mma.cuh) against the CUDA-core fast
 * path's launcher tile: the data behind the launcher's choice of path.
 *
 * Output: a human table on stdout, and with --tsv FILE one line per measurement
 * (state T B hot_us cold_us bytes) for bench/fla_decode.py to merge with FLA's numbers.
 * --T LIST and --B LIST (comma-separated) time only those token counts and batches.
 * Build: see scripts/device_decode.sh (nvcc, links the library's objects).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "gdn.h"
#include "cuda/sm90_recurrent_mma.cuh"

#define CK(call)                                                                                                   \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));                 \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

static const int64_t H = 16, HV = 32, K = 128, V = 128;

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
        x[i] = gdn_from_f32<T>(u * amp);
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
    CK(cudaMalloc(&s.q, nqk * 2));
    CK(cudaMalloc(&s.k, nqk * 2));
    CK(cudaMalloc(&s.v, nv * 2));
    CK(cudaMalloc(&s.o, nv * 2));
    CK(cudaMalloc(&s.a, ng * 4));
    CK(cudaMalloc(&s.b, ng * 4));
    CK(cudaMalloc(&s.A_log, HV * 4));
    CK(cudaMalloc(&s.dt_bias, HV * 4));
    CK(cudaMalloc(&s.pool, state_elems(B) * gdn_dtype_size(sd)));
    CK(cudaMalloc(&s.idx, (size_t)B * 4));
    fill(s.q, (int64_t)nqk, seed + 1, 0.6f);
    fill(s.k, (int64_t)nqk, seed + 2, 0.6f);
    fill(s.v, (int64_t)nv, seed + 3, 0.6f);
    fill(s.a, (int64_t)ng, seed + 4, 0.6f);
    fill(s.b, (int64_t)ng, seed + 5, 0.6f);
    fill(s.A_log, HV, seed + 6, 0.3f);
    fill(s.dt_bias, HV, seed + 7, 0.3f);
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
    double io = (double)(B * T) * (2.0 * H * K * 2 + 2.0 * HV * V * 2 + 2.0 * HV * 4);
    return st + io + 2.0 * HV * 4 + B * 4.0;
}

/* Arguments for a set, with the given pointers (device or host copies of the same layout). */
static gdn_recurrent_fwd_args make_args(const Set &s, gdn_device_type dev, void *q, void *k, void *v, void *o,
                                        void *a, void *b, void *A_log, void *dt_bias, void *pool, void *idx,
                                        cudaStream_t stream)
{
    gdn_recurrent_fwd_args x;
    memset(&x, 0, sizeof x);
    int64_t qs[4] = {s.B, s.T, H, K}, vs[4] = {s.B, s.T, HV, V}, gs[3] = {s.B, s.T, HV}, hs[1] = {HV};
    int64_t ps[4] = {s.B, HV, V, K}, is[1] = {s.B};
    x.q = gdn_tensor_make(q, GDN_DTYPE_BF16, dev, 0, 4, qs);
    x.k = gdn_tensor_make(k, GDN_DTYPE_BF16, dev, 0, 4, qs);
    x.v = gdn_tensor_make(v, GDN_DTYPE_BF16, dev, 0, 4, vs);
    x.o = gdn_tensor_make(o, GDN_DTYPE_BF16, dev, 0, 4, vs);
    x.gate.kind = GDN_GATE_GDN;
    x.gate.a = gdn_tensor_make(a, GDN_DTYPE_F32, dev, 0, 3, gs);
    x.gate.A_log = gdn_tensor_make(A_log, GDN_DTYPE_F32, dev, 0, 1, hs);
    x.gate.dt_bias = gdn_tensor_make(dt_bias, GDN_DTYPE_F32, dev, 0, 1, hs);
    x.gate.beta = gdn_tensor_make(b, GDN_DTYPE_F32, dev, 0, 3, gs);
    x.gate.beta_from_logits = 1;
    x.use_qk_l2norm = 1;
    x.state_layout = GDN_STATE_VK;
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
    size_t np = state_elems(B) * gdn_dtype_size(sd);
    void *hq = to_host(s.q, nqk), *hk = to_host(s.k, nqk), *hv = to_host(s.v, nv), *ha = to_host(s.a, ng),
         *hb = to_host(s.b, ng), *hA = to_host(s.A_log, HV * 4), *hdt = to_host(s.dt_bias, HV * 4),
         *hpool = to_host(s.pool, np), *hidx = to_host(s.idx, (size_t)B * 4);
    void *ho = calloc(nv, 1);
    api_call(set_args(s, 0));
    CK(cudaDeviceSynchronize());
    void *do_ = to_host(s.o, nv), *dpool = to_host(s.pool, np);
    gdn_recurrent_fwd_args x = make_args(s, GDN_DEVICE_CPU, hq, hk, hv, ho, ha, hb, hA, hdt, hpool, hidx, 0);
    gdn_status st = gdn_recurrent_fwd(&x);
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
/* Tile variants, launched directly (state pool VK, in place, shape of the issue)              */

static RecurrentParams variant_params(const Set &s)
{
    RecurrentParams p;
    memset(&p, 0, sizeof p);
    p.T = s.T, p.HV = HV, p.G = HV / H, p.V = V, p.N = s.B;
    p.q = s.q, p.k = s.k, p.v = s.v, p.o = s.o;
    int64_t qk[4] = {s.T * H * K, H * K, K, 1}, vo[4] = {s.T * HV * V, HV * V, V, 1};
    memcpy(p.q_s, qk, sizeof qk), memcpy(p.k_s, qk, sizeof qk);
    memcpy(p.v_s, vo, sizeof vo), memcpy(p.o_s, vo, sizeof vo);
    p.a = s.a, p.a_dtype = GDN_DTYPE_F32;
    int64_t gs[3] = {s.T * HV, HV, 1};
    memcpy(p.a_s, gs, sizeof gs), memcpy(p.beta_s, gs, sizeof gs);
    p.A_log = s.A_log, p.dt_bias = s.dt_bias, p.dt_s = 1;
    p.softplus_beta = 1.0f, p.softplus_threshold = 20.0f;
    p.beta = s.b, p.beta_dtype = GDN_DTYPE_F32, p.beta_from_logits = 1;
    p.scale = 1.0f / sqrtf((float)K), p.use_qk_l2norm = 1;
    p.state_in = s.pool;
    p.st_in = StateStrides{HV * V * K, V * K, 1, K};
    p.num_slots = s.B;
    p.state_indices = s.idx, p.idx_s_n = 1, p.idx_cols = 1;
    p.inplace_state = 1;
    return p;
}

/* Time per call (cold; *hot too when given) of the kernel `launch(stream, params)` on the issue's
 * shape. */
template <typename F>
static double time_kernel(cudaStream_t stream, int64_t B, int64_t T, gdn_dtype sd, size_t l2, F launch,
                          double *hot = NULL)
{
    double set_bytes = call_bytes(B, T, sd);
    int nsets = std::max(1, (int)ceil(3.0 * (double)l2 / set_bytes));
    std::vector<Set> sets;
    std::vector<RecurrentParams> prm;
    for (int i = 0; i < nsets; i++) {
        sets.push_back(make_set(B, T, sd, 2000 + (uint64_t)i));
        prm.push_back(variant_params(sets.back()));
    }
    CK(cudaDeviceSynchronize());
    int n = std::max(launches_for(est_us(B, T, sd)), std::min(nsets, 400));
    double us = time_graph(stream, n, 7, [&](int i) {
        launch(stream, prm[(size_t)(i % nsets)]);
        CK(cudaGetLastError());
    });
    if (hot)
        *hot = time_graph(stream, launches_for(est_us(B, T, sd)), 7, [&](int) {
            launch(stream, prm[0]);
            CK(cudaGetLastError());
        });
    for (Set &s : sets)
        free_set(s);
    return us;
}

/* Launches a bulk-copy kernel (kernel(p, rows): either fast path) with programmatic stream
 * serialization (pdl) or plainly. */
template <typename Kernel>
static void launch_rows(Kernel kernel, cudaStream_t st, dim3 grid, int warps, size_t smem, bool pdl,
                        const RecurrentParams &p, int rows)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3((unsigned)(32 * warps));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, kernel, p, rows));
}

/* The fast path with a tile of `rows` rows and `warps` warps per CTA, launched with programmatic
 * stream serialization (pdl) or plainly. */
template <typename StateT>
static double time_tma(cudaStream_t stream, int64_t B, int64_t T, int rows, int warps, size_t l2, bool pdl = false,
                       double *hot = NULL)
{
    gdn_dtype sd = sizeof(StateT) == 4 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
    constexpr int RPL = default_rows_per_lane<128, StateT>();
    const dim3 grid((unsigned)((V + rows - 1) / rows), (unsigned)HV, (unsigned)B);
    CK((prefer_shared_tma_kernel<128, StateT, __nv_bfloat16, RPL>()));
    return time_kernel(
        stream, B, T, sd, l2,
        [&](cudaStream_t st, const RecurrentParams &p) {
            launch_rows(recurrent_fwd_tma_kernel<128, StateT, __nv_bfloat16, RPL>, st, grid, warps, 0, pdl, p, rows);
        },
        hot);
}

/* The fast path's launcher tile (sm90_recurrent_fwd.cu, launch_tma) with and without programmatic
 * dependent launch, for each T and B: hot / cold us and the CTAs of the grid. */
static void run_pdl(cudaStream_t stream, size_t l2, const std::vector<int64_t> &Ts, const std::vector<int64_t> &Bs)
{
    printf("\nfast path, launcher tile, without / with programmatic dependent launch (us hot / cold)\n");
    for (int sdi = 0; sdi < 2; sdi++) {
        for (int64_t T : Ts) {
            for (int64_t B : Bs) {
                const TmaTile tile = sdi ? tma_tile<128, __nv_bfloat16>(B, HV, V, T, false)
                                         : tma_tile<128, float>(B, HV, V, T, false);
                const int rows = tile.rows, warps = tile.warps;
                double h0, c0, h1, c1;
                c0 = sdi ? time_tma<__nv_bfloat16>(stream, B, T, rows, warps, l2, false, &h0)
                         : time_tma<float>(stream, B, T, rows, warps, l2, false, &h0);
                c1 = sdi ? time_tma<__nv_bfloat16>(stream, B, T, rows, warps, l2, true, &h1)
                         : time_tma<float>(stream, B, T, rows, warps, l2, true, &h1);
                printf("pdl %s T=%lld B=%lld tile %dx%d, %lld CTAs | plain %.2f / %.2f | pdl %.2f / %.2f\n",
                       sdi ? "bf16" : "f32", (long long)T, (long long)B, rows, warps,
                       (long long)(B * HV * ((V + rows - 1) / rows)), h0, c0, h1, c1);
                fflush(stdout);
            }
        }
    }
}

/* The register path with 16-byte state pieces (RPL rows per lane, `warps` warps per CTA). */
template <typename StateT, int RPL>
static double time_regs(cudaStream_t stream, int64_t B, int64_t T, int warps, size_t l2)
{
    gdn_dtype sd = sizeof(StateT) == 4 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
    const int rows = 4 * RPL * warps;
    const dim3 grid((unsigned)((V + rows - 1) / rows), (unsigned)HV, (unsigned)B);
    return time_kernel(stream, B, T, sd, l2, [&](cudaStream_t st, const RecurrentParams &p) {
        recurrent_fwd_kernel<128, StateT, __nv_bfloat16, RPL, true><<<grid, 32 * warps, 0, st>>>(p);
    });
}

/* The register path (16-byte state pieces straight to registers; cold us, % of copy) for the T and
 * B of --T / --B: RPL 2 and 4 rows per lane, 1, 2 and 4 warps (the main table times the launcher). */
static void run_regs(cudaStream_t stream, size_t l2, double copy, const std::vector<int64_t> &Ts,
                     const std::vector<int64_t> &Bs)
{
    printf("\nregister path (cold us, %% of copy)\n");
    for (int sdi = 0; sdi < 2; sdi++) {
        for (int64_t T : Ts) {
            for (int64_t B : Bs) {
                const gdn_dtype sd = sdi ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
                const double bytes = call_bytes(B, T, sd);
                printf("regs %s T=%lld B=%lld |", sdi ? "bf16" : "f32", (long long)T, (long long)B);
                for (int w : {1, 2, 4}) {
                    double u2 = sdi ? time_regs<__nv_bfloat16, 2>(stream, B, T, w, l2) : time_regs<float, 2>(stream, B, T, w, l2);
                    double u4 = sdi ? time_regs<__nv_bfloat16, 4>(stream, B, T, w, l2) : time_regs<float, 4>(stream, B, T, w, l2);
                    printf(" 2x%d %.2f (%.1f%%) 4x%d %.2f (%.1f%%)", w, u2, pct_copy(bytes, u2, copy), w, u4,
                           pct_copy(bytes, u4, copy));
                }
                printf("\n");
                fflush(stdout);
            }
        }
    }
}

/* Fast-path tiles (rows x warps) and the register path (4 rows per lane x 4 warps) for the T and B
 * of --T / --B (cold us, % of copy): the data behind the launcher's tile choice. */
static void run_tiles(cudaStream_t stream, size_t l2, double copy, const std::vector<int64_t> &Ts,
                      const std::vector<int64_t> &Bs)
{
    printf("\nfast-path tiles and the register path (cold us, %% of copy)\n");
    for (int sdi = 0; sdi < 2; sdi++) {
        for (int64_t T : Ts) {
            for (int64_t B : Bs) {
                const double bytes = call_bytes(B, T, sdi ? GDN_DTYPE_BF16 : GDN_DTYPE_F32);
                printf("tiles %s T=%lld B=%lld |", sdi ? "bf16" : "f32", (long long)T, (long long)B);
                const int shapes[][2] = {{128, 4}, {64, 4}, {64, 2}, {32, 4}, {32, 2}, {16, 2}};
                for (const auto &sh : shapes) {
                    if (!sdi && sh[0] > 64)
                        continue;
                    const double us = sdi ? time_tma<__nv_bfloat16>(stream, B, T, sh[0], sh[1], l2, true)
                                          : time_tma<float>(stream, B, T, sh[0], sh[1], l2, true);
                    printf(" %dx%d %.2f (%.1f%%)", sh[0], sh[1], us, pct_copy(bytes, us, copy));
                }
                const double us = sdi ? time_regs<__nv_bfloat16, 4>(stream, B, T, 4, l2) : time_regs<float, 4>(stream, B, T, 4, l2);
                printf(" | regs 4x4 %.2f (%.1f%%)\n", us, pct_copy(bytes, us, copy));
                fflush(stdout);
            }
        }
    }
}

/* The tensor-core path with a tile of `rows` rows and `warps` warps per CTA (programmatic launch
 * by the launcher's rule, tma_use_pdl). */
template <typename StateT>
static double time_mma(cudaStream_t stream, int64_t B, int64_t T, int rows, int warps, size_t l2, int sms)
{
    gdn_dtype sd = sizeof(StateT) == 4 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
    const dim3 grid((unsigned)((V + rows - 1) / rows), (unsigned)HV, (unsigned)B);
    CK((prepare_mma_kernel<128, StateT, __nv_bfloat16>()));
    const bool pdl = tma_use_pdl((int64_t)grid.x * grid.y * grid.z, sms);
    return time_kernel(stream, B, T, sd, l2, [&](cudaStream_t st, const RecurrentParams &p) {
        launch_rows(recurrent_fwd_mma_kernel<128, StateT, __nv_bfloat16>, st, grid, warps, mma_smem_bytes<128, StateT>(),
                    pdl, p, rows);
    });
}

/* The tensor-core path's tiles (rows x warps) against the CUDA-core fast path's launcher tile for
 * the T and B of --T / --B (cold us): the data behind the launcher's choice of path and tile. */
static void run_mma(cudaStream_t stream, size_t l2, const std::vector<int64_t> &Ts, const std::vector<int64_t> &Bs,
                    int sms)
{
    printf("\ntensor-core path tiles against the CUDA-core launcher tile (cold us)\n");
    for (int sdi = 0; sdi < 2; sdi++) {
        for (int64_t T : Ts) {
            for (int64_t B : Bs) {
                const TmaTile t = sdi ? tma_tile<128, __nv_bfloat16>(B, HV, V, T, false)
                                      : tma_tile<128, float>(B, HV, V, T, false);
                const double base = sdi ? time_tma<__nv_bfloat16>(stream, B, T, t.rows, t.warps, l2, true)
                                        : time_tma<float>(stream, B, T, t.rows, t.warps, l2, true);
                printf("mma %s T=%lld B=%lld | cuda-core %dx%d %.2f |", sdi ? "bf16" : "f32", (long long)T, (long long)B,
                       t.rows, t.warps, base);
                for (int rows = 16; rows <= (sdi ? 128 : 64); rows *= 2) {
                    const int warps = rows / kMmaRows < 4 ? rows / kMmaRows : 4;
                    const double us = sdi ? time_mma<__nv_bfloat16>(stream, B, T, rows, warps, l2, sms)
                                          : time_mma<float>(stream, B, T, rows, warps, l2, sms);
                    printf(" %dx%d %.2f", rows, warps, us);
                }
                printf("\n");
                fflush(stdout);
            }
        }
    }
}

static void run_variants(cudaStream_t stream, size_t l2, double copy)
{
    printf("\nvariants (cold us, %% of copy): tma rows x warps ..., regs RPL x warps\n");
    const int64_t cases[][2] = {{1, 1}, {8, 1}, {64, 1}, {512, 1}, {256, 4}, {256, 8}};
    for (int sdi = 0; sdi < 2; sdi++) {
        for (const auto &c : cases) {
            int64_t B = c[0], T = c[1];
            gdn_dtype sd = sdi ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
            double bytes = call_bytes(B, T, sd);
            printf("variant %s T=%lld B=%lld |", sdi ? "bf16" : "f32", (long long)T, (long long)B);
            const int max_rows = sdi ? 128 : 64;
            for (int rows = 16; rows <= max_rows; rows *= 2) {
                for (int w : {1, 2, 4}) {
                    if (w * 8 > rows)
                        continue;
                    double us = sdi ? time_tma<__nv_bfloat16>(stream, B, T, rows, w, l2)
                                    : time_tma<float>(stream, B, T, rows, w, l2);
                    printf(" tma %dx%d %.2f (%.0f%%)", rows, w, us, pct_copy(bytes, us, copy));
                }
            }
            double us = sdi ? time_regs<__nv_bfloat16, 4>(stream, B, T, 1, l2) : time_regs<float, 4>(stream, B, T, 1, l2);
            printf(" | regs 4x1 %.2f (%.0f%%)\n", us, pct_copy(bytes, us, copy));
            fflush(stdout);
        }
    }
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

int main(int argc, char **argv)
{
    const char *tsv_path = NULL;
    bool variants = false, pdl = false, regs = false, tiles = false, mma = false;
    std::vector<int64_t> Ts = {1, 2, 4, 8}, Bs = {1, 8, 32, 64, 128, 256, 512};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tsv") && i + 1 < argc)
            tsv_path = argv[++i];
        else if (!strcmp(argv[i], "--variants"))
            variants = true;
        else if (!strcmp(argv[i], "--pdl"))
            pdl = true;
        else if (!strcmp(argv[i], "--regs"))
            regs = true;
        else if (!strcmp(argv[i], "--tiles"))
            tiles = true;
        else if (!strcmp(argv[i], "--mma"))
            mma = true;
        else if (!strcmp(argv[i], "--T") && i + 1 < argc)
            Ts = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "--B") && i + 1 < argc)
            Bs = parse_list(argv[++i]);
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    size_t l2 = (size_t)prop.l2CacheSize;
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    printf("device: %s, %d SMs, L2 %.0f MB\n", prop.name, prop.multiProcessorCount, l2 / 1e6);

    double copy = copy_gbps(stream, false), copy_graph = copy_gbps(stream, true);
    printf("copy ceiling: 1 GiB D2D %.0f GB/s with events (the reference), %.0f GB/s under graph replay\n", copy,
           copy_graph);

    int ok = 1;
    for (gdn_dtype sd : {GDN_DTYPE_F32, GDN_DTYPE_BF16})
        for (int64_t T : {1, 4})
            ok &= check_case(sd, 3, T);
    if (!ok) {
        printf("correctness check failed: not timing\n");
        return 1;
    }

    FILE *tsv = tsv_path ? fopen(tsv_path, "w") : NULL;
    if (tsv)
        fprintf(tsv, "# copy_gbps %.1f copy_graph_gbps %.1f\nstate\tT\tB\thot_us\tcold_us\tbytes\n", copy, copy_graph);
    printf("\n%-5s %2s %4s %10s %10s %9s %7s\n", "state", "T", "B", "hot us", "cold us", "cold GB/s", "% copy");
    for (gdn_dtype sd : {GDN_DTYPE_F32, GDN_DTYPE_BF16}) {
        for (int64_t T : Ts) {
            for (int64_t B : Bs) {
                double hot, cold;
                time_api(stream, B, T, sd, l2, &hot, &cold);
                double bytes = call_bytes(B, T, sd);
                printf("%-5s %2lld %4lld %10.2f %10.2f %9.0f %6.1f%%\n", sd == GDN_DTYPE_F32 ? "f32" : "bf16",
                       (long long)T, (long long)B, hot, cold, bytes / (cold * 1e3), pct_copy(bytes, cold, copy));
                fflush(stdout);
                if (tsv)
                    fprintf(tsv, "%s\t%lld\t%lld\t%.3f\t%.3f\t%.0f\n", sd == GDN_DTYPE_F32 ? "f32" : "bf16",
                            (long long)T, (long long)B, hot, cold, bytes);
            }
        }
    }
    if (tsv)
        fclose(tsv);
    if (variants)
        run_variants(stream, l2, copy);
    if (pdl)
        run_pdl(stream, l2, Ts, Bs);
    if (regs)
        run_regs(stream, l2, copy, Ts, Bs);
    if (tiles)
        run_tiles(stream, l2, copy, Ts, Bs);
    if (mma)
        run_mma(stream, l2, Ts, Bs, prop.multiProcessorCount);
    CK(cudaStreamDestroy(stream));
    return 0;
}
