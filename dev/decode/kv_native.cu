/*
 * kv_native.cu - a one-token decode kernel for KV states ([N, HV, K, V], value index contiguous: FLA's
 * and transformers' layout) built around that layout, beside libgdn's KV path and a device copy of the
 * state (the floor of a one-token step). Go / no-go experiment for dev/decode/README.md "KV states":
 * the library's generic kernel with row vectors runs KV at 0.63-0.66 of copy (H200), its VK bulk-copy
 * path at 0.93-0.94.
 *
 * The kernel: a CTA owns 32 value columns of one (sequence, value head); warp w holds keys 32 w ..
 * 32 w + 31, lane l column 32 blockIdx.x + l. A warp's load (and store) at one key is 128 contiguous
 * bytes; a lane holds 32 state values, so about 32 warps an SM fit and each keeps 4 KB of loads in
 * flight. The dots S^T k and S^T q are summed over the four warps through shared memory once per token.
 * Math (GDN_MATH.md): S' = diag(e) S (GDN: one e for all keys), u = beta (v - S'^T k),
 * S_new = S' + k u^T, o = S_new^T q = S'^T q + u (k . q); q, k l2-normalised, q scaled by K^-1/2.
 * T = 1, f32 states, bf16 q / k / v / o, precomputed f32 g and beta, K = V = 128.
 *
 * Checked against libgdn's gdn_recurrent_fwd on the same inputs (itself tested against the float64
 * reference), relative RMS of o and of the final state, then timed (CUDA events, mean of 20 calls after
 * warm-up, us) for B in 1 8 64 128 256, GDN and KDA.
 *
 * Build (here; carry the binary):
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude dev/decode/kv_native.cu \
 *        build/libgdn_static.a -lpthread -o kv_native
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gdn.h"

#define CK(x)                                                                                          \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));          \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

constexpr int H = 16, HV = 32, K = 128, V = 128, COLS = 32, WARPS = K / 32;

struct Params {
    const __nv_bfloat16 *q, *k, *v; /* [B, 1, H, K], [B, 1, H, K], [B, 1, HV, V] */
    const float *g, *beta;          /* GDN [B, 1, HV] / KDA [B, 1, HV, K]; [B, 1, HV] */
    const float *h0;                /* [B, HV, K, V] */
    float *ht;                      /* [B, HV, K, V] */
    __nv_bfloat16 *o;               /* [B, 1, HV, V] */
    float scale;
};

template <bool KDA> __global__ void __launch_bounds__(32 * WARPS) kv_native_kernel(const Params p)
{
    __shared__ float qs[K], ks[K], es[KDA ? K : 1], red[2][WARPS][COLS], kq_e[2];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int col = blockIdx.x * COLS + lane, hv = blockIdx.y, n = blockIdx.z, h = hv / (HV / H);
    const size_t head = ((size_t)n * HV + hv) * K * V;

    /* The state loads first: they are the kernel's cost, and nothing below waits for them until the dots. */
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; i++)
        s[i] = p.h0[head + (size_t)(32 * warp + i) * V + col];

    /* Warp 0 stages q and k (normalised, q scaled) and k . q; warp 1 the KDA decays. */
    if (warp == 0) {
        const __nv_bfloat16 *q = p.q + ((size_t)n * H + h) * K, *k = p.k + ((size_t)n * H + h) * K;
        float qv[K / 32], kv[K / 32], sq = 0.f, sk = 0.f;
#pragma unroll
        for (int j = 0; j < K / 32; j++) {
            qv[j] = __bfloat162float(q[lane + 32 * j]);
            kv[j] = __bfloat162float(k[lane + 32 * j]);
            sq += qv[j] * qv[j];
            sk += kv[j] * kv[j];
        }
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) {
            sq += __shfl_xor_sync(0xffffffffu, sq, m);
            sk += __shfl_xor_sync(0xffffffffu, sk, m);
        }
        const float rq = p.scale * rsqrtf(sq + 1e-6f), rk = rsqrtf(sk + 1e-6f);
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < K / 32; j++) {
            qs[lane + 32 * j] = qv[j] * rq;
            ks[lane + 32 * j] = kv[j] * rk;
            dot += qv[j] * rq * kv[j] * rk;
        }
#pragma unroll
        for (int m = 16; m > 0; m >>= 1)
            dot += __shfl_xor_sync(0xffffffffu, dot, m);
        if (lane == 0) {
            kq_e[0] = dot;
            kq_e[1] = KDA ? 1.f : __expf(p.g[(size_t)n * HV + hv]);
        }
    } else if (KDA && warp == 1) {
        const float *g = p.g + ((size_t)n * HV + hv) * K;
#pragma unroll
        for (int j = 0; j < K / 32; j++)
            es[lane + 32 * j] = __expf(g[lane + 32 * j]);
    }
    const float beta = p.beta[(size_t)n * HV + hv];
    const float vv = __bfloat162float(p.v[((size_t)n * HV + hv) * V + col]);
    __syncthreads();

    /* This warp's share of S'^T k and S'^T q (KDA: the decay enters S here, per key). */
    float dk = 0.f, dq = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int key = 32 * warp + i;
        if (KDA)
            s[i] *= es[key];
        dk = fmaf(s[i], ks[key], dk);
        dq = fmaf(s[i], qs[key], dq);
    }
    red[0][warp][lane] = dk;
    red[1][warp][lane] = dq;
    __syncthreads();
    float kvs = 0.f, qss = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) { /* the same order in every warp: one u for the column */
        kvs += red[0][w][lane];
        qss += red[1][w][lane];
    }
    const float e = kq_e[1], u = beta * (vv - e * kvs);
    if (warp == 0)
        p.o[((size_t)n * HV + hv) * V + col] = __float2bfloat16(e * qss + u * kq_e[0]);
#pragma unroll
    for (int i = 0; i < 32; i++)
        p.ht[head + (size_t)(32 * warp + i) * V + col] = fmaf(ks[32 * warp + i], u, e * s[i]);
}

static void launch(bool kda, int B, const Params &p, cudaStream_t st)
{
    const dim3 grid(V / COLS, HV, B);
    if (kda)
        kv_native_kernel<true><<<grid, 32 * WARPS, 0, st>>>(p);
    else
        kv_native_kernel<false><<<grid, 32 * WARPS, 0, st>>>(p);
}

struct Bufs {
    __nv_bfloat16 *q, *k, *v, *o, *o_ref;
    float *g, *beta, *h0, *ht, *ht_ref;
};

static gdn_tensor dev_tensor(void *data, gdn_dtype dt, int rank, const int64_t *shape)
{
    return gdn_tensor_make(data, dt, GDN_DEVICE_CUDA, 0, rank, shape);
}

/* libgdn's call on the same buffers: KV layout, precomputed g and beta, l2 norm, default scale. */
static gdn_recurrent_fwd_args lib_args(bool kda, int B, const Bufs &b, cudaStream_t st)
{
    gdn_recurrent_fwd_args a;
    memset(&a, 0, sizeof a);
    const int64_t qs[4] = {B, 1, H, K}, vs[4] = {B, 1, HV, V}, gs[4] = {B, 1, HV, K}, ss[4] = {B, HV, K, V};
    a.q = dev_tensor(b.q, GDN_DTYPE_BF16, 4, qs);
    a.k = dev_tensor(b.k, GDN_DTYPE_BF16, 4, qs);
    a.v = dev_tensor(b.v, GDN_DTYPE_BF16, 4, vs);
    a.o = dev_tensor(b.o_ref, GDN_DTYPE_BF16, 4, vs);
    a.gate.kind = kda ? GDN_GATE_KDA : GDN_GATE_GDN;
    a.gate.g = dev_tensor(b.g, GDN_DTYPE_F32, kda ? 4 : 3, gs);
    a.gate.beta = dev_tensor(b.beta, GDN_DTYPE_F32, 3, vs);
    a.use_qk_l2norm = 1;
    a.state_layout = GDN_STATE_KV;
    a.state = dev_tensor(b.h0, GDN_DTYPE_F32, 4, ss);
    a.final_state = dev_tensor(b.ht_ref, GDN_DTYPE_F32, 4, ss);
    a.stream = st;
    size_t ws = 0;
    if (gdn_recurrent_fwd_workspace_size(&a, &ws) != GDN_OK || ws != 0) {
        fprintf(stderr, "workspace query: %s (%zu bytes)\n", gdn_last_error(), ws);
        exit(1);
    }
    return a;
}

template <typename T> static T *dalloc(size_t n)
{
    T *p = nullptr;
    CK(cudaMalloc(&p, n * sizeof(T)));
    return p;
}

static void fill(void *dst, size_t n, bool bf16, float lo, float hi, unsigned seed)
{
    std::vector<float> h(n);
    srand(seed);
    for (size_t i = 0; i < n; i++)
        h[i] = lo + (hi - lo) * (float)rand() / (float)RAND_MAX;
    if (bf16) {
        std::vector<__nv_bfloat16> hb(n);
        for (size_t i = 0; i < n; i++)
            hb[i] = __float2bfloat16(h[i]);
        CK(cudaMemcpy(dst, hb.data(), n * 2, cudaMemcpyHostToDevice));
    } else {
        CK(cudaMemcpy(dst, h.data(), n * 4, cudaMemcpyHostToDevice));
    }
}

/* Relative RMS difference of two device arrays (f32 or bf16). */
static double rel_rms(const void *a, const void *b, size_t n, bool bf16)
{
    std::vector<float> ha(n), hb(n);
    if (bf16) {
        std::vector<__nv_bfloat16> ta(n), tb(n);
        CK(cudaMemcpy(ta.data(), a, n * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(tb.data(), b, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++)
            ha[i] = __bfloat162float(ta[i]), hb[i] = __bfloat162float(tb[i]);
    } else {
        CK(cudaMemcpy(ha.data(), a, n * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hb.data(), b, n * 4, cudaMemcpyDeviceToHost));
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)ha[i] - hb[i];
        num += std::isfinite(d) ? d * d : 1e30;
        den += (double)hb[i] * hb[i];
    }
    return std::sqrt(num / (den > 0 ? den : 1));
}

template <typename F> static double time_us(cudaStream_t st, F fn)
{
    for (int i = 0; i < 3; i++)
        fn();
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < 20; i++)
        fn();
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return ms * 1e3 / 20;
}

int main()
{
    const int BS[] = {1, 8, 64, 128, 256}, BMAX = 256;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    Bufs b;
    const size_t nq = (size_t)BMAX * H * K, nv = (size_t)BMAX * HV * V, ns = (size_t)BMAX * HV * K * V;
    b.q = dalloc<__nv_bfloat16>(nq), b.k = dalloc<__nv_bfloat16>(nq), b.v = dalloc<__nv_bfloat16>(nv);
    b.o = dalloc<__nv_bfloat16>(nv), b.o_ref = dalloc<__nv_bfloat16>(nv);
    b.g = dalloc<float>((size_t)BMAX * HV * K), b.beta = dalloc<float>((size_t)BMAX * HV);
    b.h0 = dalloc<float>(ns), b.ht = dalloc<float>(ns), b.ht_ref = dalloc<float>(ns);
    fill(b.q, nq, true, -1.f, 1.f, 1), fill(b.k, nq, true, -1.f, 1.f, 2), fill(b.v, nv, true, -1.f, 1.f, 3);
    fill(b.g, (size_t)BMAX * HV * K, false, -2.f, -0.01f, 4), fill(b.beta, (size_t)BMAX * HV, false, 0.f, 1.f, 5);
    fill(b.h0, ns, false, -0.3f, 0.3f, 6);

    printf("H%d HV%d K=V=%d, T=1, f32 KV state in and out, bf16 q/k/v/o; us per call (events, mean of 20)\n", H, HV, K);
    printf("%4s %4s %10s %10s %10s %8s %9s %9s %9s %s\n", "B", "op", "kv_native", "libgdn", "copy", "lib/nat",
           "copy/nat", "o err", "ht err", "check");
    int failed = 0;
    for (int B : BS) {
        const size_t nsb = (size_t)B * HV * K * V, nvb = (size_t)B * HV * V;
        for (int kda = 0; kda < 2; kda++) {
            Params p = {b.q, b.k, b.v, b.g, b.beta, b.h0, b.ht, b.o, 1.f / sqrtf((float)K)};
            /* poisoned outputs: every element must be written */
            CK(cudaMemset(b.ht, 0xff, nsb * 4));
            CK(cudaMemset(b.o, 0xff, nvb * 2));
            launch(kda, B, p, st);
            CK(cudaGetLastError());
            gdn_recurrent_fwd_args a = lib_args(kda, B, b, st);
            if (gdn_recurrent_fwd(&a) != GDN_OK) {
                fprintf(stderr, "gdn_recurrent_fwd: %s\n", gdn_last_error());
                return 1;
            }
            CK(cudaStreamSynchronize(st));
            const double eo = rel_rms(b.o, b.o_ref, nvb, true), eh = rel_rms(b.ht, b.ht_ref, nsb, false);
            const bool ok = eo < 1e-2 && eh < 1e-5;
            failed += !ok;
            const double t_nat = time_us(st, [&] { launch(kda, B, p, st); });
            const double t_lib = time_us(st, [&] { gdn_recurrent_fwd(&a); });
            const double t_copy = time_us(st, [&] { cudaMemcpyAsync(b.ht, b.h0, nsb * 4, cudaMemcpyDeviceToDevice, st); });
            printf("%4d %4s %10.1f %10.1f %10.1f %8.2f %9.2f %9.2e %9.2e %s\n", B, kda ? "kda" : "gdn", t_nat, t_lib,
                   t_copy, t_lib / t_nat, t_copy / t_nat, eo, eh, ok ? "ok" : "FAIL");
            fflush(stdout);
        }
    }
    printf(failed ? "FAIL: %d cases\n" : "all cases match libgdn\n", failed);
    return failed ? 1 : 0;
}
