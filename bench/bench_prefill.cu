/*
 * bench_prefill.cu - times gdn_chunk_fwd (CUDA, bf16, L2 norm on, K = V = 128, final state f32)
 * at the six prefill shapes of issue 4, under CUDA graph replay and eagerly, and prints one line
 * per shape: milliseconds, tokens/s and TFLOP/s counted as 4 * T * HV * d^2.
 *
 *   cmake -S . -B build -DGDN_BENCH=ON && cmake --build build --target bench_prefill
 *   build/bench_prefill [out.txt|-] [shape substring]
 *
 * Varlen shape 4 draws its 64 lengths from the LCG shared with bench/fla_prefill.py, so both see
 * the same cu_seqlens. Outputs are checked for NaN / Inf / poison before timing.
 *
 * GDN_BENCH_POOL=M (environment) times the serving form instead: the states live in a VK pool (the
 * layout of vLLM's and SGLang's pools) read and written in place through state_indices (slots
 * 0 .. N - 1; GDN_BENCH_POOL_LAYOUT=kv for a KV pool), and with M > 0 every sequence
 * also writes a prefix-cache checkpoint every M tokens into slots of its own; M = -1: the pool
 * without checkpoints.
 */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gdn.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

struct shape {
    const char *name;
    int B, T, H, HV;
    int nseq;      /* > 0: varlen */
    int fixed_len; /* varlen: every sequence this long; 0: random 1 .. 4096 */
};

/* Lengths 1 .. 4096 from a 31-bit LCG (same in fla_prefill.py). */
static std::vector<int> random_lengths(int n)
{
    std::vector<int> l(n);
    uint32_t x = 12345u;
    for (int i = 0; i < n; ++i) {
        x = (x * 1103515245u + 12345u) & 0x7fffffffu;
        l[i] = 1 + (int)(x % 4096u);
    }
    return l;
}

__device__ float hash_normal(uint64_t i, uint32_t seed)
{
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u1 = ((z >> 40) + 1) * (1.0f / 16777217.0f), u2 = ((z >> 16) & 0xffffff) * (1.0f / 16777216.0f);
    return sqrtf(-2.f * logf(u1)) * cosf(6.2831853f * u2);
}

__global__ void fill_bf16(__nv_bfloat16 *x, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16(hash_normal(i, seed));
}

/* kind 0: logsigmoid(randn) log decays; kind 1: sigmoid(randn) betas. */
__global__ void fill_gate(float *x, size_t n, uint32_t seed, int kind)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float r = hash_normal(i, seed);
        x[i] = kind == 0 ? -log1pf(expf(-r)) : 1.f / (1.f + expf(-r));
    }
}

__global__ void count_bad_bf16(const __nv_bfloat16 *x, size_t n, unsigned long long *bad)
{
    unsigned long long c = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        c += !isfinite(__bfloat162float(x[i]));
    if (c)
        atomicAdd(bad, c);
}

static gdn_tensor dev_tensor(void *p, gdn_dtype dt, int rank, const int64_t *shape)
{
    return gdn_tensor_make(p, dt, GDN_DEVICE_CUDA, 0, rank, shape);
}

static float median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv)
{
    const shape shapes[] = {
        {"B1_T32768_H16_HV32", 1, 32768, 16, 32, 0, 0},
        {"B2_T16384_H16_HV16", 2, 16384, 16, 16, 0, 0},
        {"varlen16x16384_H16_HV16", 1, 0, 16, 16, 16, 16384},
        {"varlen64rand_H16_HV32", 1, 0, 16, 32, 64, 0},
        {"B1_T8192_H2_HV8", 1, 8192, 2, 8, 0, 0},
        {"B1_T65536_H2_HV8", 1, 65536, 2, 8, 0, 0},
        {"B2_T4096_H16_HV64", 2, 4096, 16, 64, 0, 0},
        {"B8_T8192_H16_HV64", 8, 8192, 16, 64, 0, 0},
        {"B1_T32768_H2_HV8", 1, 32768, 2, 8, 0, 0},
    };
    const int D = 128, WARM = 3, ITERS = 20;
    const long pool_m = getenv("GDN_BENCH_POOL") ? strtol(getenv("GDN_BENCH_POOL"), nullptr, 10) : 0;
    if (pool_m != 0)
        printf("serving form: state pool%s (GDN_BENCH_POOL=%ld)\n", pool_m > 0 ? " with checkpoints" : "", pool_m);
    FILE *out = argc > 1 && strcmp(argv[1], "-") != 0 ? fopen(argv[1], "w") : nullptr;
    const char *only = argc > 2 ? argv[2] : nullptr;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    printf("%-26s %8s %10s %10s %12s %10s %10s\n", "shape", "tokens", "graph_ms", "eager_ms", "Mtok/s", "TFLOP/s_g",
           "TFLOP/s_e");
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    for (const shape &s : shapes) {
        if (only && !strstr(s.name, only))
            continue;
        std::vector<int32_t> cu;
        int64_t T = s.T, N = s.B;
        if (s.nseq > 0) {
            std::vector<int> lens = s.fixed_len ? std::vector<int>(s.nseq, s.fixed_len) : random_lengths(s.nseq);
            cu.push_back(0);
            for (int l : lens)
                cu.push_back(cu.back() + l);
            T = cu.back();
            N = s.nseq;
        }
        const int64_t B = s.B, H = s.H, HV = s.HV;
        const size_t nqk = (size_t)(B * T * H * D), nv = (size_t)(B * T * HV * D), ng = (size_t)(B * T * HV);
        /* Checkpoint columns: the most any sequence needs (fixed length T, or up to 16384 varlen). */
        const int64_t ck_cols = pool_m > 0 ? (s.nseq > 0 ? 16384 : T) / pool_m : 0;
        const int64_t slots = N + N * ck_cols;
        const size_t nst = (size_t)(slots * HV * D * D);
        __nv_bfloat16 *q, *k, *v, *o;
        float *g, *beta, *ht;
        int32_t *dcu = nullptr;
        CK(cudaMalloc(&q, nqk * 2));
        CK(cudaMalloc(&k, nqk * 2));
        CK(cudaMalloc(&v, nv * 2));
        CK(cudaMalloc(&o, nv * 2));
        CK(cudaMalloc(&g, ng * 4));
        CK(cudaMalloc(&beta, ng * 4));
        CK(cudaMalloc(&ht, nst * 4));
        fill_bf16<<<1024, 256, 0, stream>>>(q, nqk, 1);
        fill_bf16<<<1024, 256, 0, stream>>>(k, nqk, 2);
        fill_bf16<<<1024, 256, 0, stream>>>(v, nv, 3);
        fill_gate<<<1024, 256, 0, stream>>>(g, ng, 4, 0);
        fill_gate<<<1024, 256, 0, stream>>>(beta, ng, 5, 1);
        CK(cudaGetLastError());
        CK(cudaMemsetAsync(o, 0xff, nv * 2, stream)); /* poison: bf16 0xffff is NaN */
        if (!cu.empty()) {
            CK(cudaMalloc(&dcu, cu.size() * 4));
            CK(cudaMemcpy(dcu, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
        }

        gdn_chunk_fwd_args a;
        memset(&a, 0, sizeof a);
        const int64_t sqk[4] = {B, T, H, D}, svo[4] = {B, T, HV, D}, sg[3] = {B, T, HV}, sst[4] = {N, HV, D, D};
        a.q = dev_tensor(q, GDN_DTYPE_BF16, 4, sqk);
        a.k = dev_tensor(k, GDN_DTYPE_BF16, 4, sqk);
        a.v = dev_tensor(v, GDN_DTYPE_BF16, 4, svo);
        a.o = dev_tensor(o, GDN_DTYPE_BF16, 4, svo);
        a.gate.kind = GDN_GATE_GDN;
        a.gate.g = dev_tensor(g, GDN_DTYPE_F32, 3, sg);
        a.gate.beta = dev_tensor(beta, GDN_DTYPE_F32, 3, sg);
        a.use_qk_l2norm = 1;
        if (dcu) {
            const int64_t scu[1] = {N + 1};
            a.cu_seqlens = dev_tensor(dcu, GDN_DTYPE_I32, 1, scu);
        }
        int32_t *didx = nullptr;
        if (pool_m == 0) {
            a.final_state = dev_tensor(ht, GDN_DTYPE_F32, 4, sst);
        } else {
            std::vector<int32_t> idx(N + N * ck_cols);
            for (int64_t i = 0; i < (int64_t)idx.size(); ++i)
                idx[i] = (int32_t)i; /* slots 0 .. N - 1 start states, then each sequence's checkpoints */
            CK(cudaMalloc(&didx, idx.size() * 4));
            CK(cudaMemcpy(didx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
            CK(cudaMemsetAsync(ht, 0, nst * 4, stream));
            const int64_t spool[4] = {slots, HV, D, D}, sidx[1] = {N}, sck[2] = {N, ck_cols};
            a.initial_state = dev_tensor(ht, GDN_DTYPE_F32, 4, spool);
            const char *lay = getenv("GDN_BENCH_POOL_LAYOUT");
            a.state_layout = lay && strcmp(lay, "kv") == 0 ? GDN_STATE_KV : GDN_STATE_VK;
            a.state_indices = dev_tensor(didx, GDN_DTYPE_I32, 1, sidx);
            if (pool_m > 0) {
                a.checkpoint_interval = pool_m;
                a.checkpoint_indices = dev_tensor(didx + N, GDN_DTYPE_I32, 2, sck);
            }
        }
        a.stream = stream;
        size_t wsb = 0;
        if (gdn_chunk_fwd_workspace_size(&a, &wsb) != GDN_OK) {
            fprintf(stderr, "%s: workspace query: %s\n", s.name, gdn_last_error());
            return 1;
        }
        void *ws = nullptr;
        CK(cudaMalloc(&ws, wsb ? wsb : 256));
        a.workspace = ws;
        a.workspace_bytes = wsb;

        gdn_status st = gdn_chunk_fwd(&a);
        if (st != GDN_OK) {
            fprintf(stderr, "%s: gdn_chunk_fwd: %s\n", s.name, gdn_last_error());
            return 1;
        }
        unsigned long long *bad;
        CK(cudaMalloc(&bad, 8));
        CK(cudaMemsetAsync(bad, 0, 8, stream));
        count_bad_bf16<<<1024, 256, 0, stream>>>(o, nv, bad);
        unsigned long long hbad = 0;
        CK(cudaMemcpyAsync(&hbad, bad, 8, cudaMemcpyDeviceToHost, stream));
        CK(cudaStreamSynchronize(stream));
        if (hbad) {
            fprintf(stderr, "%s: %llu non-finite or unwritten outputs\n", s.name, hbad);
            return 1;
        }

        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        std::vector<float> te, tg;
        for (int i = 0; i < WARM + ITERS; ++i) {
            CK(cudaEventRecord(e0, stream));
            st = gdn_chunk_fwd(&a);
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (st != GDN_OK)
                return 1;
            if (i >= WARM)
                te.push_back(ms);
        }
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        st = gdn_chunk_fwd(&a);
        CK(cudaStreamEndCapture(stream, &graph));
        if (st != GDN_OK) {
            fprintf(stderr, "%s: capture: %s\n", s.name, gdn_last_error());
            return 1;
        }
        CK(cudaGraphInstantiate(&exec, graph, 0));
        for (int i = 0; i < WARM + ITERS; ++i) {
            CK(cudaEventRecord(e0, stream));
            CK(cudaGraphLaunch(exec, stream));
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (i >= WARM)
                tg.push_back(ms);
        }
        const float mg = median(tg), me = median(te);
        const double flop = 4.0 * (double)(B * T) * HV * D * D;
        printf("%-26s %8lld %10.4f %10.4f %12.1f %10.1f %10.1f\n", s.name, (long long)(B * T), mg, me,
               (double)(B * T) / mg * 1e-3, flop / mg * 1e-9, flop / me * 1e-9);
        if (out)
            fprintf(out, "%s %lld %.5f %.5f\n", s.name, (long long)(B * T), mg, me);
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
        void *bufs[] = {q, k, v, o, g, beta, ht, dcu, ws, bad, didx};
        for (void *b : bufs)
            CK(cudaFree(b));
    }
    if (out)
        fclose(out);
    CK(cudaStreamDestroy(stream));
    return 0;
}
