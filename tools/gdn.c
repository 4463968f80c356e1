/*
 * gdn.c - the `gdn` command: a demo of one Qwen3-Next-shaped GDN layer, a benchmark, version.
 *
 *   gdn demo        prefill 4 sequences (4096 tokens) with gdn_chunk_fwd (in-kernel gating and
 *                   l2norm, bf16 inputs, f32 states in VK layout written straight into a state
 *                   pool), then 8 decode steps with gdn_recurrent_fwd updating the pool in place;
 *                   checks both against the float64 recurrence on a subset of heads and prints
 *                   a table. Runs on the GPU when the library has CUDA and a GPU is present, and
 *                   says why it runs on the CPU otherwise.
 *   gdn bench ...   timing of chunk (prefill) and recurrent (decode) at any shape, dtype, state layout
 *                   and device given as options (gdn help lists them; numbers are parsed strictly)
 *   gdn --version | help
 *
 * Build: cmake -S . -B build && cmake --build build -j; run: build/tools/gdn demo
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gdn.h"

#ifdef GDN_WITH_CUDA
#include <cuda_runtime.h>
#endif

/* Qwen3-Next linear-attention layer */
enum { H = 16, HV = 32, DK = 128, DV = 128, NSEQ = 4, DECODE_STEPS = 8, POOL_SLOTS = 2 * NSEQ + 1 };
static const int32_t SEQLENS[NSEQ] = {1500, 1100, 900, 596}; /* 4096 tokens */
static const double TOL_O = 1e-2, TOL_STATE = 1e-2; /* bf16 inputs and outputs (GDN_MATH.md "Accuracy") */
/* Heads checked against float64: key heads 0 and H-1 with their value heads */
enum { SUB_H = 2, SUB_HV = 2 * (HV / H) };

/* ------------------------------------------------------------------------------------------ */
/* Small helpers                                                                               */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Zeroed host memory, 256-byte aligned as the library wants its workspaces (and as cudaMalloc
 * returns); free() releases it. */
static void *host_alloc(size_t bytes)
{
    const size_t n = (bytes + 255) / 256 * 256;
    void *p = aligned_alloc(256, n ? n : 256);
    if (!p) {
        fprintf(stderr, "gdn: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    memset(p, 0, n ? n : 256);
    return p;
}

static void *xmalloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "gdn: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double uniform01(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (double)((g_rng * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}

static double randn(void)
{
    double u1 = uniform01(), u2 = uniform01();
    return sqrt(-2.0 * log(u1 > 1e-300 ? u1 : 1e-300)) * cos(6.283185307179586 * u2);
}

/* One bf16 value (the library's conversion, gdn.h). */
static double from_bf16(uint16_t h)
{
    float x;
    gdn_bf16_to_f32(&h, &x, 1);
    return x;
}

static gdn_tensor tensor(void *data, gdn_dtype dtype, gdn_device_type dev, int rank, const int64_t *shape)
{
    return gdn_tensor_make(data, dtype, dev, 0, rank, shape);
}

static float *f32_randn(size_t n, double mean, double std)
{
    float *p = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(mean + std * randn());
    return p;
}

static uint16_t *bf16_randn(size_t n, double std)
{
    float *x = f32_randn(n, 0.0, std);
    uint16_t *p = xmalloc(n * sizeof(uint16_t));
    gdn_f32_to_bf16(x, p, n);
    free(x);
    return p;
}

/* ------------------------------------------------------------------------------------------ */
/* Where tensors live: host memory for the CPU backend, device memory for CUDA                 */

typedef struct backend {
    int cuda;
    char name[80];
} backend;

#ifdef GDN_WITH_CUDA
static void check_cuda_call(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "gdn: %s failed\n", what);
        exit(2);
    }
}
#endif

static void *dev_alloc(const backend *bk, size_t bytes)
{
#ifdef GDN_WITH_CUDA
    if (bk->cuda) {
        void *p = NULL;
        check_cuda_call(cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess, "cudaMalloc");
        check_cuda_call(cudaMemset(p, 0, bytes) == cudaSuccess, "cudaMemset");
        return p;
    }
#endif
    return host_alloc(bytes);
}

static void dev_put(const backend *bk, void *dev, const void *host, size_t bytes)
{
#ifdef GDN_WITH_CUDA
    if (bk->cuda) {
        check_cuda_call(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess, "cudaMemcpy H2D");
        return;
    }
#endif
    memcpy(dev, host, bytes);
}

static void *dev_upload(const backend *bk, const void *host, size_t bytes)
{
    void *p = dev_alloc(bk, bytes);
    dev_put(bk, p, host, bytes);
    return p;
}

static void dev_download(const backend *bk, void *host, const void *dev, size_t bytes)
{
#ifdef GDN_WITH_CUDA
    if (bk->cuda) {
        check_cuda_call(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost) == cudaSuccess, "cudaMemcpy D2H");
        return;
    }
#endif
    memcpy(host, dev, bytes);
}

static void dev_free(const backend *bk, void *p)
{
#ifdef GDN_WITH_CUDA
    if (bk->cuda) {
        cudaFree(p);
        return;
    }
#endif
    free(p);
}

static void dev_sync(const backend *bk)
{
#ifdef GDN_WITH_CUDA
    if (bk->cuda)
        check_cuda_call(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
#else
    (void)bk;
#endif
}

/* The GPU when the library has the CUDA backend and a device is present, else the CPU; `why`
 * (when not NULL) says why the CPU was chosen. */
static backend pick_backend(char *why, size_t why_size)
{
    backend bk = {0, ""};
    snprintf(bk.name, sizeof bk.name, "cpu (%d threads)", gdn_get_num_threads());
    if (why)
        snprintf(why, why_size, "libgdn was built without the CUDA backend");
#ifdef GDN_WITH_CUDA
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    struct cudaDeviceProp prop;
    if (e == cudaSuccess && n > 0)
        e = cudaGetDeviceProperties(&prop, 0);
    if (e == cudaSuccess && n > 0) {
        bk.cuda = 1;
        snprintf(bk.name, sizeof bk.name, "cuda (%.60s)", prop.name);
    } else if (why) {
        if (e != cudaSuccess)
            snprintf(why, why_size, "the CUDA backend is built, but the CUDA runtime found no usable GPU: %s (%s)",
                     cudaGetErrorString(e), cudaGetErrorName(e));
        else
            snprintf(why, why_size, "the CUDA backend is built, but there is no CUDA device");
    }
    cudaGetLastError(); /* clear a sticky "no device" error */
#endif
    return bk;
}

/* ------------------------------------------------------------------------------------------ */
/* The layer's inputs (host, bf16 where a model would have bf16)                               */

typedef struct layer {
    int64_t T;                 /* prefill tokens */
    int32_t cu[NSEQ + 1];
    uint16_t *q, *k, *v, *b;   /* prefill [1, T, H, K], [1, T, HV, V], b [1, T, HV] */
    float *a, *A_log, *dt_bias;
    uint16_t *dq[DECODE_STEPS], *dk[DECODE_STEPS], *dv[DECODE_STEPS], *db[DECODE_STEPS];
    float *da[DECODE_STEPS];
    int32_t slots[NSEQ];       /* pool slot of each sequence: 1, 3, 5, 7 (strided final_state) */
} layer;

static void layer_init(layer *L, const int32_t *seqlens)
{
    L->cu[0] = 0;
    for (int n = 0; n < NSEQ; n++)
        L->cu[n + 1] = L->cu[n] + seqlens[n];
    L->T = L->cu[NSEQ];
    size_t T = (size_t)L->T;
    L->q = bf16_randn(T * H * DK, 1.0);
    L->k = bf16_randn(T * H * DK, 1.0);
    L->v = bf16_randn(T * HV * DV, 1.0);
    L->b = bf16_randn(T * HV, 1.0);
    L->a = f32_randn(T * HV, 0.0, 1.0);
    L->A_log = xmalloc(HV * sizeof(float));
    for (int j = 0; j < HV; j++)
        L->A_log[j] = (float)log(1.0 + 15.0 * uniform01()); /* A ~ U(1, 16), as Qwen3-Next initialises */
    L->dt_bias = f32_randn(HV, -3.0, 1.0);
    for (int s = 0; s < DECODE_STEPS; s++) {
        L->dq[s] = bf16_randn(NSEQ * H * DK, 1.0);
        L->dk[s] = bf16_randn(NSEQ * H * DK, 1.0);
        L->dv[s] = bf16_randn(NSEQ * HV * DV, 1.0);
        L->db[s] = bf16_randn(NSEQ * HV, 1.0);
        L->da[s] = f32_randn(NSEQ * HV, 0.0, 1.0);
    }
    for (int n = 0; n < NSEQ; n++)
        L->slots[n] = 2 * n + 1;
}

static void layer_free(layer *L)
{
    free(L->q), free(L->k), free(L->v), free(L->b), free(L->a), free(L->A_log), free(L->dt_bias);
    for (int s = 0; s < DECODE_STEPS; s++)
        free(L->dq[s]), free(L->dk[s]), free(L->dv[s]), free(L->db[s]), free(L->da[s]);
}

/* ------------------------------------------------------------------------------------------ */
/* float64 reference on a subset of heads                                                       */

static int sub_key_head(int i) { return i == 0 ? 0 : H - 1; }
static int sub_value_head(int j) { return sub_key_head(j / (HV / H)) * (HV / H) + j % (HV / H); }

typedef struct reference {
    double *o;                 /* prefill [T, SUB_HV, V] */
    double *state;             /* [NSEQ, SUB_HV, V, K] after prefill, then after each decode step */
    double *prefill_state;     /* a copy of state after prefill */
    double *dec_o[DECODE_STEPS]; /* [NSEQ, SUB_HV, V] */
} reference;

static double gate_g(const layer *L, double a, int j)
{
    double x = a + L->dt_bias[j];
    double sp = x > 20.0 ? x : log1p(exp(x));
    return -exp((double)L->A_log[j]) * sp;
}

/* Runs gdn_recurrent_fwd in float64 on the CPU over the subset of heads of `ntok` tokens. */
static int reference_run(const layer *L, int64_t ntok, int nseq, const int32_t *cu, const uint16_t *q,
                         const uint16_t *k, const uint16_t *v, const float *a, const uint16_t *b, double *state,
                         double *o)
{
    size_t T = (size_t)ntok;
    double *q64 = xmalloc(T * SUB_H * DK * sizeof(double)), *k64 = xmalloc(T * SUB_H * DK * sizeof(double));
    double *v64 = xmalloc(T * SUB_HV * DV * sizeof(double));
    double *g64 = xmalloc(T * SUB_HV * sizeof(double)), *beta64 = xmalloc(T * SUB_HV * sizeof(double));
    for (size_t t = 0; t < T; t++) {
        for (int i = 0; i < SUB_H; i++)
            for (int d = 0; d < DK; d++) {
                size_t src = (t * H + (size_t)sub_key_head(i)) * DK + (size_t)d, dst = (t * SUB_H + (size_t)i) * DK + (size_t)d;
                q64[dst] = from_bf16(q[src]);
                k64[dst] = from_bf16(k[src]);
            }
        for (int j = 0; j < SUB_HV; j++) {
            int jv = sub_value_head(j);
            for (int d = 0; d < DV; d++)
                v64[(t * SUB_HV + (size_t)j) * DV + (size_t)d] = from_bf16(v[(t * HV + (size_t)jv) * DV + (size_t)d]);
            g64[t * SUB_HV + (size_t)j] = gate_g(L, a[t * HV + (size_t)jv], jv);
            beta64[t * SUB_HV + (size_t)j] = 1.0 / (1.0 + exp(-from_bf16(b[t * HV + (size_t)jv])));
        }
    }
    int64_t B = cu ? 1 : nseq, Tb = cu ? ntok : 1;
    gdn_recurrent_fwd_args r;
    memset(&r, 0, sizeof r);
    const gdn_device_type cpu = GDN_DEVICE_CPU;
    r.q = tensor(q64, GDN_DTYPE_F64, cpu, 4, (int64_t[]){B, Tb, SUB_H, DK});
    r.k = tensor(k64, GDN_DTYPE_F64, cpu, 4, (int64_t[]){B, Tb, SUB_H, DK});
    r.v = tensor(v64, GDN_DTYPE_F64, cpu, 4, (int64_t[]){B, Tb, SUB_HV, DV});
    r.o = tensor(o, GDN_DTYPE_F64, cpu, 4, (int64_t[]){B, Tb, SUB_HV, DV});
    r.gate.kind = GDN_GATE_GDN;
    r.gate.g = tensor(g64, GDN_DTYPE_F64, cpu, 3, (int64_t[]){B, Tb, SUB_HV});
    r.gate.beta = tensor(beta64, GDN_DTYPE_F64, cpu, 3, (int64_t[]){B, Tb, SUB_HV});
    r.use_qk_l2norm = 1;
    if (cu)
        r.cu_seqlens = tensor((void *)cu, GDN_DTYPE_I32, cpu, 1, (int64_t[]){nseq + 1});
    r.state_layout = GDN_STATE_VK;
    r.state = tensor(state, GDN_DTYPE_F64, cpu, 4, (int64_t[]){nseq, SUB_HV, DV, DK});
    r.final_state = r.state; /* exact alias: updated in place */
    gdn_status st = gdn_recurrent_fwd_workspace_size(&r, &r.workspace_bytes);
    if (st == GDN_OK && r.workspace_bytes)
        r.workspace = host_alloc(r.workspace_bytes);
    if (st == GDN_OK)
        st = gdn_recurrent_fwd(&r);
    free(r.workspace);
    if (st != GDN_OK)
        fprintf(stderr, "gdn: float64 reference failed: %s (%s)\n", gdn_status_string(st), gdn_last_error());
    free(q64), free(k64), free(v64), free(g64), free(beta64);
    return st == GDN_OK;
}

/* Relative RMS error of the subset heads of `got` (full heads, [rows, HV, inner]) vs ref. */
typedef struct errsum {
    double num, den;
    int nonfinite;
} errsum;

static void err_add(errsum *e, double got, double ref)
{
    if (!isfinite(got)) {
        e->nonfinite = 1;
        return;
    }
    e->num += (got - ref) * (got - ref);
    e->den += ref * ref;
}

static double err_rel(const errsum *e) { return e->nonfinite ? INFINITY : sqrt(e->num / (e->den > 0 ? e->den : 1)); }

/* ------------------------------------------------------------------------------------------ */
/* The demo                                                                                    */

typedef struct row {
    const char *op;
    char backend[96], shape[96];
    double seconds, tokens, err_o, err_state;
    int ok;
} row;

static void print_row(const row *r)
{
    printf("%-25s %-22s %-34s %10.3f ms %10.0f tok/s   o %.2e  state %.2e  %s\n", r->op, r->backend, r->shape,
           1e3 * r->seconds, r->tokens / r->seconds, r->err_o, r->err_state, r->ok ? "PASS" : "FAIL");
}

/* Builds the chunk args for the prefill on the backend's buffers. */
typedef struct dev_bufs {
    void *q, *k, *v, *b, *a, *A_log, *dt_bias, *cu, *o, *pool, *idx, *ws;
    size_t ws_bytes;
    void *dq, *dk, *dv, *db, *da, *dout;
} dev_bufs;

static gdn_chunk_fwd_args prefill_args(const layer *L, const dev_bufs *d, gdn_device_type dev)
{
    gdn_chunk_fwd_args c;
    memset(&c, 0, sizeof c);
    int64_t T = L->T;
    c.q = tensor(d->q, GDN_DTYPE_BF16, dev, 4, (int64_t[]){1, T, H, DK});
    c.k = tensor(d->k, GDN_DTYPE_BF16, dev, 4, (int64_t[]){1, T, H, DK});
    c.v = tensor(d->v, GDN_DTYPE_BF16, dev, 4, (int64_t[]){1, T, HV, DV});
    c.o = tensor(d->o, GDN_DTYPE_BF16, dev, 4, (int64_t[]){1, T, HV, DV});
    c.gate.kind = GDN_GATE_GDN;
    c.gate.a = tensor(d->a, GDN_DTYPE_F32, dev, 3, (int64_t[]){1, T, HV});
    c.gate.A_log = tensor(d->A_log, GDN_DTYPE_F32, dev, 1, (int64_t[]){HV});
    c.gate.dt_bias = tensor(d->dt_bias, GDN_DTYPE_F32, dev, 1, (int64_t[]){HV});
    c.gate.beta = tensor(d->b, GDN_DTYPE_BF16, dev, 3, (int64_t[]){1, T, HV});
    c.gate.beta_from_logits = 1;
    c.use_qk_l2norm = 1;
    c.cu_seqlens = tensor(d->cu, GDN_DTYPE_I32, dev, 1, (int64_t[]){NSEQ + 1});
    c.state_layout = GDN_STATE_VK;
    /* final states land in pool slots 1, 3, 5, 7: a strided view of the pool */
    int64_t slot = (int64_t)HV * DV * DK;
    c.final_state = tensor((float *)d->pool + slot, GDN_DTYPE_F32, dev, 4, (int64_t[]){NSEQ, HV, DV, DK});
    c.final_state.stride[0] = 2 * slot;
    c.workspace = d->ws;
    c.workspace_bytes = d->ws_bytes;
    return c;
}

static gdn_recurrent_fwd_args decode_args(const dev_bufs *d, gdn_device_type dev)
{
    gdn_recurrent_fwd_args r;
    memset(&r, 0, sizeof r);
    r.q = tensor(d->dq, GDN_DTYPE_BF16, dev, 4, (int64_t[]){NSEQ, 1, H, DK});
    r.k = tensor(d->dk, GDN_DTYPE_BF16, dev, 4, (int64_t[]){NSEQ, 1, H, DK});
    r.v = tensor(d->dv, GDN_DTYPE_BF16, dev, 4, (int64_t[]){NSEQ, 1, HV, DV});
    r.o = tensor(d->dout, GDN_DTYPE_BF16, dev, 4, (int64_t[]){NSEQ, 1, HV, DV});
    r.gate.kind = GDN_GATE_GDN;
    r.gate.a = tensor(d->da, GDN_DTYPE_F32, dev, 3, (int64_t[]){NSEQ, 1, HV});
    r.gate.A_log = tensor(d->A_log, GDN_DTYPE_F32, dev, 1, (int64_t[]){HV});
    r.gate.dt_bias = tensor(d->dt_bias, GDN_DTYPE_F32, dev, 1, (int64_t[]){HV});
    r.gate.beta = tensor(d->db, GDN_DTYPE_BF16, dev, 3, (int64_t[]){NSEQ, 1, HV});
    r.gate.beta_from_logits = 1;
    r.use_qk_l2norm = 1;
    r.state_layout = GDN_STATE_VK;
    r.state = tensor(d->pool, GDN_DTYPE_F32, dev, 4, (int64_t[]){POOL_SLOTS, HV, DV, DK});
    r.state_indices = tensor(d->idx, GDN_DTYPE_I32, dev, 1, (int64_t[]){NSEQ});
    r.inplace_state = 1;
    return r;
}

static void put_decode_inputs(const backend *bk, dev_bufs *d, const layer *L, int s)
{
    dev_put(bk, d->dq, L->dq[s], NSEQ * H * DK * 2);
    dev_put(bk, d->dk, L->dk[s], NSEQ * H * DK * 2);
    dev_put(bk, d->dv, L->dv[s], NSEQ * HV * DV * 2);
    dev_put(bk, d->db, L->db[s], NSEQ * HV * 2);
    dev_put(bk, d->da, L->da[s], NSEQ * HV * 4);
}

/* Uploads everything the layer needs to the backend. Decode inputs are uploaded per step. */
static dev_bufs upload(const backend *bk, const layer *L)
{
    dev_bufs d;
    memset(&d, 0, sizeof d);
    size_t T = (size_t)L->T;
    d.q = dev_upload(bk, L->q, T * H * DK * 2);
    d.k = dev_upload(bk, L->k, T * H * DK * 2);
    d.v = dev_upload(bk, L->v, T * HV * DV * 2);
    d.b = dev_upload(bk, L->b, T * HV * 2);
    d.a = dev_upload(bk, L->a, T * HV * 4);
    d.A_log = dev_upload(bk, L->A_log, HV * 4);
    d.dt_bias = dev_upload(bk, L->dt_bias, HV * 4);
    d.cu = dev_upload(bk, L->cu, sizeof L->cu);
    d.o = dev_alloc(bk, T * HV * DV * 2);
    d.pool = dev_alloc(bk, (size_t)POOL_SLOTS * HV * DV * DK * 4);
    d.idx = dev_upload(bk, L->slots, sizeof L->slots);
    d.dq = dev_alloc(bk, NSEQ * H * DK * 2);
    d.dk = dev_alloc(bk, NSEQ * H * DK * 2);
    d.dv = dev_alloc(bk, NSEQ * HV * DV * 2);
    d.db = dev_alloc(bk, NSEQ * HV * 2);
    d.da = dev_alloc(bk, NSEQ * HV * 4);
    d.dout = dev_alloc(bk, NSEQ * HV * DV * 2);
    return d;
}

static void free_bufs(const backend *bk, dev_bufs *d)
{
    void *ps[] = {d->q, d->k, d->v, d->b, d->a, d->A_log, d->dt_bias, d->cu, d->o, d->pool, d->idx,
                  d->ws, d->dq, d->dk, d->dv, d->db, d->da, d->dout};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        if (ps[i])
            dev_free(bk, ps[i]);
    memset(d, 0, sizeof *d);
}

/* Error of the 4 live pool slots (subset heads) against a reference state, and whether the
 * never-addressed slots (0 and the even ones) are still zero. */
static double pool_error(const layer *L, const float *pool, const double *ref_state)
{
    errsum e = {0, 0, 0};
    size_t slot = (size_t)HV * DV * DK;
    for (int n = 0; n < NSEQ; n++)
        for (int j = 0; j < SUB_HV; j++)
            for (size_t x = 0; x < (size_t)DV * DK; x++)
                err_add(&e, pool[(size_t)L->slots[n] * slot + (size_t)sub_value_head(j) * DV * DK + x],
                        ref_state[((size_t)n * SUB_HV + (size_t)j) * DV * DK + x]);
    for (int p = 0; p < POOL_SLOTS; p += 2)
        for (size_t x = 0; x < slot; x++)
            if (pool[(size_t)p * slot + x] != 0.0f)
                e.nonfinite = 1;
    return err_rel(&e);
}

/* The prefill on one backend: final states go into `pool` (host, POOL_SLOTS slots). */
static gdn_status run_prefill(const backend *bk, const layer *L, const reference *ref, row *r, float *pool)
{
    gdn_device_type dev = bk->cuda ? GDN_DEVICE_CUDA : GDN_DEVICE_CPU;
    dev_bufs d = upload(bk, L);
    size_t T = (size_t)L->T, pool_n = (size_t)POOL_SLOTS * HV * DV * DK;
    gdn_chunk_fwd_args c = prefill_args(L, &d, dev);
    gdn_status st = gdn_chunk_fwd_workspace_size(&c, &d.ws_bytes);
    if (st == GDN_OK && d.ws_bytes)
        d.ws = dev_alloc(bk, d.ws_bytes);
    c = prefill_args(L, &d, dev);
    /* warm-up (the first CUDA call loads modules); the timed run writes the same states again */
    if (st == GDN_OK && bk->cuda)
        st = gdn_chunk_fwd(&c);
    dev_sync(bk);
    double t0 = now_s();
    if (st == GDN_OK)
        st = gdn_chunk_fwd(&c);
    dev_sync(bk);
    r->seconds = now_s() - t0;
    if (st == GDN_OK) {
        uint16_t *o = xmalloc(T * HV * DV * 2);
        dev_download(bk, o, d.o, T * HV * DV * 2);
        dev_download(bk, pool, d.pool, pool_n * 4);
        errsum eo = {0, 0, 0};
        for (size_t t = 0; t < T; t++)
            for (int j = 0; j < SUB_HV; j++)
                for (int e = 0; e < DV; e++)
                    err_add(&eo, from_bf16(o[(t * HV + (size_t)sub_value_head(j)) * DV + (size_t)e]),
                            ref->o[(t * SUB_HV + (size_t)j) * DV + (size_t)e]);
        free(o);
        r->op = "prefill gdn_chunk_fwd";
        snprintf(r->backend, sizeof r->backend, "%s", bk->name);
        snprintf(r->shape, sizeof r->shape, "N=%d T=%lld H=%d HV=%d K=V=%d", NSEQ, (long long)L->T, H, HV, DK);
        r->tokens = (double)T;
        r->err_o = err_rel(&eo);
        r->err_state = pool_error(L, pool, ref->prefill_state);
        r->ok = r->err_o <= TOL_O && r->err_state <= TOL_STATE;
    }
    free_bufs(bk, &d);
    return st;
}

/* DECODE_STEPS decode steps on one backend, starting from `pool` (host), updated in place. */
static gdn_status run_decode(const backend *bk, const layer *L, const reference *ref, row *r, float *pool)
{
    gdn_device_type dev = bk->cuda ? GDN_DEVICE_CUDA : GDN_DEVICE_CPU;
    dev_bufs d = upload(bk, L);
    size_t pool_n = (size_t)POOL_SLOTS * HV * DV * DK;
    dev_put(bk, d.pool, pool, pool_n * 4);
    gdn_recurrent_fwd_args a = decode_args(&d, dev);
    gdn_status st = gdn_recurrent_fwd_workspace_size(&a, &d.ws_bytes);
    if (st == GDN_OK && d.ws_bytes)
        a.workspace = d.ws = dev_alloc(bk, d.ws_bytes);
    a.workspace_bytes = d.ws_bytes;
    double seconds = 0;
    errsum eo = {0, 0, 0};
    uint16_t *out = xmalloc(NSEQ * HV * DV * 2);
    for (int s = 0; s < DECODE_STEPS && st == GDN_OK; s++) {
        put_decode_inputs(bk, &d, L, s);
        if (s == 0 && bk->cuda) {
            /* warm-up without touching the pool: read it, write nothing back */
            a.inplace_state = 0;
            st = gdn_recurrent_fwd(&a);
            a.inplace_state = 1;
            dev_sync(bk);
        }
        double t0 = now_s();
        if (st == GDN_OK)
            st = gdn_recurrent_fwd(&a);
        dev_sync(bk);
        seconds += now_s() - t0;
        if (st != GDN_OK)
            break;
        dev_download(bk, out, d.dout, NSEQ * HV * DV * 2);
        for (int n = 0; n < NSEQ; n++)
            for (int j = 0; j < SUB_HV; j++)
                for (int e = 0; e < DV; e++)
                    err_add(&eo, from_bf16(out[((size_t)n * HV + (size_t)sub_value_head(j)) * DV + (size_t)e]),
                            ref->dec_o[s][((size_t)n * SUB_HV + (size_t)j) * DV + (size_t)e]);
    }
    if (st == GDN_OK) {
        dev_download(bk, pool, d.pool, pool_n * 4);
        r->op = "decode gdn_recurrent_fwd";
        snprintf(r->backend, sizeof r->backend, "%s", bk->name);
        snprintf(r->shape, sizeof r->shape, "N=%d x %d steps, pool %d slots", NSEQ, DECODE_STEPS, POOL_SLOTS);
        r->seconds = seconds;
        r->tokens = NSEQ * DECODE_STEPS;
        r->err_o = err_rel(&eo);
        r->err_state = pool_error(L, pool, ref->state);
        r->ok = r->err_o <= TOL_O && r->err_state <= TOL_STATE;
    }
    free(out);
    free_bufs(bk, &d);
    return st;
}

static backend cpu_backend(void)
{
    backend bk = {0, ""};
    snprintf(bk.name, sizeof bk.name, "cpu (%d threads)", gdn_get_num_threads());
    return bk;
}

/* The CUDA backend has no (or no suitable) kernel for this call yet: run it on the CPU instead. */
static int cuda_lacks(gdn_status st, const backend *bk)
{
    return bk->cuda && (st == GDN_ERR_NOT_IMPLEMENTED || st == GDN_ERR_UNSUPPORTED);
}

static int cmd_demo(void)
{
    layer L;
    layer_init(&L, SEQLENS);
    printf("libgdn %s demo: one Qwen3-Next GDN layer (H=%d, HV=%d, K=V=%d, bf16 inputs, in-kernel gating and "
           "l2norm, f32 VK state pool)\n", gdn_version_string(), H, HV, DK);

    /* float64 reference on key heads 0 and H-1 with their value heads */
    double t0 = now_s();
    reference ref;
    memset(&ref, 0, sizeof ref);
    size_t state_bytes = (size_t)NSEQ * SUB_HV * DV * DK * sizeof(double);
    ref.o = xmalloc((size_t)L.T * SUB_HV * DV * sizeof(double));
    ref.state = xmalloc(state_bytes);
    int ok = reference_run(&L, L.T, NSEQ, L.cu, L.q, L.k, L.v, L.a, L.b, ref.state, ref.o);
    ref.prefill_state = xmalloc(state_bytes);
    memcpy(ref.prefill_state, ref.state, state_bytes);
    for (int s = 0; s < DECODE_STEPS && ok; s++) {
        ref.dec_o[s] = xmalloc((size_t)NSEQ * SUB_HV * DV * sizeof(double));
        ok = reference_run(&L, NSEQ, NSEQ, NULL, L.dq[s], L.dk[s], L.dv[s], L.da[s], L.db[s], ref.state,
                           ref.dec_o[s]);
    }
    if (!ok)
        return 1;
    printf("float64 reference (CPU recurrent) on %d of %d value heads: %.2f s\n\n", SUB_HV, HV, now_s() - t0);

    /* Each op on the best backend; one the CUDA backend does not implement yet runs on the CPU. */
    char why[256];
    backend best = pick_backend(why, sizeof why), cpu = cpu_backend();
    if (!best.cuda)
        printf("note: running on the CPU: %s\n", why);
    float *pool = xmalloc((size_t)POOL_SLOTS * HV * DV * DK * sizeof(float));
    row rows[2];
    memset(rows, 0, sizeof rows);
    gdn_status st = run_prefill(&best, &L, &ref, &rows[0], pool);
    if (cuda_lacks(st, &best)) {
        printf("note: prefill falls back to the CPU: %s\n", gdn_last_error());
        st = run_prefill(&cpu, &L, &ref, &rows[0], pool);
    }
    if (st == GDN_OK) {
        st = run_decode(&best, &L, &ref, &rows[1], pool);
        if (cuda_lacks(st, &best)) {
            printf("note: decode falls back to the CPU: %s\n", gdn_last_error());
            st = run_decode(&cpu, &L, &ref, &rows[1], pool);
        }
    }
    if (st != GDN_OK) {
        fprintf(stderr, "gdn: %s (%s)\n", gdn_status_string(st), gdn_last_error());
        return 1;
    }
    printf("%-25s %-22s %-34s %13s %16s   %-27s %s\n", "op", "backend", "shape", "time", "throughput",
           "rel. RMS error vs float64", "check");
    print_row(&rows[0]);
    print_row(&rows[1]);
    int pass = rows[0].ok && rows[1].ok;
    printf("\n%s (tolerance %.0e; state = the 4 live pool slots after prefill / after %d in-place decode steps; "
           "untouched slots checked to stay zero)\n", pass ? "PASS" : "FAIL", TOL_O, DECODE_STEPS);
    free(pool);
    free(ref.o), free(ref.state), free(ref.prefill_state);
    for (int s = 0; s < DECODE_STEPS; s++)
        free(ref.dec_o[s]);
    layer_free(&L);
    return pass ? 0 : 1;
}

/* ------------------------------------------------------------------------------------------ */
/* gdn bench: time gdn_chunk_fwd (prefill) and gdn_recurrent_fwd (decode) at any shape          */

typedef struct bench_opts {
    int64_t B, T, decode_T, H, HV, K, V, reps;
    gdn_dtype dtype, state_dtype;
    gdn_state_layout layout;
    const char *device; /* "auto", "cpu", "cuda" */
    int chunk, recurrent;
} bench_opts;

/* Strict parsing of a whole decimal integer in [lo, hi]: digits only (no sign, spaces, exponent or
 * suffix), so that "abc", "1e3", "10x", "-4" and "" are rejected with a message naming the option. */
static int parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    int64_t v = 0;
    for (const char *c = s; *c || c == s; c++) {
        if (*c < '0' || *c > '9') { /* also the empty string */
            fprintf(stderr, "gdn bench: %s needs a whole number in [%lld, %lld] (digits only), got '%s'\n", opt,
                    (long long)lo, (long long)hi, s);
            return 0;
        }
        if (v > (hi - (*c - '0')) / 10) { /* v * 10 + digit > hi, checked without overflowing */
            fprintf(stderr, "gdn bench: %s = %s is too large (at most %lld)\n", opt, s, (long long)hi);
            return 0;
        }
        v = v * 10 + (*c - '0');
    }
    if (v < lo) {
        fprintf(stderr, "gdn bench: %s = %s is too small (at least %lld)\n", opt, s, (long long)lo);
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_choice(const char *opt, const char *s, const char *const *names, int count, int *out)
{
    for (int i = 0; i < count; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            return 1;
        }
    fprintf(stderr, "gdn bench: %s must be one of", opt);
    for (int i = 0; i < count; i++)
        fprintf(stderr, "%s %s", i ? "," : "", names[i]);
    fprintf(stderr, "; got '%s'\n", s);
    return 0;
}

/* *acc *= x, or 0 with a message naming what overflowed. */
static int mul_checked(size_t *acc, int64_t x, const char *what)
{
    if (x < 0 || (x > 0 && *acc > SIZE_MAX / (size_t)x)) {
        fprintf(stderr, "gdn bench: the size of %s overflows; choose a smaller shape\n", what);
        return 0;
    }
    *acc *= (size_t)x;
    return 1;
}

/* Bytes of a tensor of the given dims and dtype, or 0 with a message on overflow. */
static int tensor_bytes(const char *what, gdn_dtype dt, int rank, const int64_t *dims, size_t *bytes)
{
    size_t n = gdn_dtype_size(dt);
    for (int i = 0; i < rank; i++)
        if (!mul_checked(&n, dims[i], what))
            return 0;
    *bytes = n;
    return 1;
}

/* n random values (normal(mean, std), then through `map`) stored as dt. */
enum { MAP_NONE, MAP_LOGSIGMOID, MAP_SIGMOID };
static void *host_random(gdn_dtype dt, size_t n, double mean, double std, int map)
{
    float *x = f32_randn(n, mean, std);
    for (size_t i = 0; i < n; i++) {
        double z = x[i];
        if (map == MAP_LOGSIGMOID)
            x[i] = (float)(z < 0 ? z - log1p(exp(z)) : -log1p(exp(-z)));
        else if (map == MAP_SIGMOID)
            x[i] = (float)(1.0 / (1.0 + exp(-z)));
    }
    if (dt == GDN_DTYPE_F32)
        return x;
    uint16_t *h = xmalloc(n * sizeof(uint16_t));
    if (dt == GDN_DTYPE_BF16)
        gdn_f32_to_bf16(x, h, n);
    else
        gdn_f32_to_f16(x, h, n);
    free(x);
    return h;
}

typedef struct bench_tensor {
    void *dev;
    gdn_tensor t;
} bench_tensor;

/* A tensor on the backend: random (kind >= 0, a MAP_ value) or zero (kind < 0). */
static int bench_alloc(const backend *bk, bench_tensor *bt, const char *what, gdn_dtype dt, int rank,
                       const int64_t *dims, double mean, double std, int kind)
{
    size_t bytes;
    if (!tensor_bytes(what, dt, rank, dims, &bytes))
        return 0;
    bt->dev = dev_alloc(bk, bytes);
    if (kind >= 0) {
        void *host = host_random(dt, bytes / gdn_dtype_size(dt), mean, std, kind);
        dev_put(bk, bt->dev, host, bytes);
        free(host);
    }
    bt->t = tensor(bt->dev, dt, bk->cuda ? GDN_DEVICE_CUDA : GDN_DEVICE_CPU, rank, dims);
    return 1;
}

/* ts[0 .. 5] = q, k, v, o, g, beta for B sequences of T tokens (o zeroed, the others random). */
static int bench_token_tensors(const backend *bk, const bench_opts *o, int64_t T, bench_tensor *ts)
{
    int64_t qk[4] = {o->B, T, o->H, o->K}, vo[4] = {o->B, T, o->HV, o->V}, gate[3] = {o->B, T, o->HV};
    return bench_alloc(bk, &ts[0], "q", o->dtype, 4, qk, 0, 1, MAP_NONE) &&
           bench_alloc(bk, &ts[1], "k", o->dtype, 4, qk, 0, 1, MAP_NONE) &&
           bench_alloc(bk, &ts[2], "v", o->dtype, 4, vo, 0, 1, MAP_NONE) &&
           bench_alloc(bk, &ts[3], "o", o->dtype, 4, vo, 0, 0, -1) &&
           bench_alloc(bk, &ts[4], "g", GDN_DTYPE_F32, 3, gate, 0, 1, MAP_LOGSIGMOID) &&
           bench_alloc(bk, &ts[5], "beta", o->dtype, 3, gate, 0, 1, MAP_SIGMOID);
}

typedef struct bench_timing {
    double best, mean;
} bench_timing;

typedef gdn_status (*bench_call)(const void *args);
static gdn_status call_chunk(const void *a) { return gdn_chunk_fwd((const gdn_chunk_fwd_args *)a); }
static gdn_status call_recurrent(const void *a) { return gdn_recurrent_fwd((const gdn_recurrent_fwd_args *)a); }

/* One warm-up call, then `reps` timed calls, each synchronised (wall clock). */
static gdn_status bench_time(const backend *bk, bench_call fn, const void *args, int64_t reps, bench_timing *tm)
{
    gdn_status st = fn(args);
    dev_sync(bk);
    tm->best = INFINITY;
    tm->mean = 0;
    for (int64_t r = 0; r < reps && st == GDN_OK; r++) {
        double t0 = now_s();
        st = fn(args);
        dev_sync(bk);
        double dt = now_s() - t0;
        tm->best = dt < tm->best ? dt : tm->best;
        tm->mean += dt / (double)reps;
    }
    return st;
}

static const char *dtype_name(gdn_dtype dt)
{
    return dt == GDN_DTYPE_F32 ? "f32" : dt == GDN_DTYPE_BF16 ? "bf16" : "f16";
}

static void bench_report(const char *op, const backend *bk, const bench_opts *o, int64_t T, const bench_timing *tm)
{
    printf("%-18s %-28s B=%lld T=%lld H=%lld HV=%lld K=%lld V=%lld %s, %s %s state  best %10.3f ms  mean %10.3f ms"
           "  %12.0f tok/s\n", op, bk->name, (long long)o->B, (long long)T, (long long)o->H, (long long)o->HV,
           (long long)o->K, (long long)o->V, dtype_name(o->dtype), o->layout == GDN_STATE_KV ? "KV" : "VK",
           dtype_name(o->state_dtype), 1e3 * tm->best, 1e3 * tm->mean, (double)(o->B * T) / tm->best);
}

/* Times the ops of `o` on `bk`; returns the exit code. */
static int bench_run(const backend *bk, const bench_opts *o)
{
    enum { NT = 16 };
    bench_tensor ts[NT];
    memset(ts, 0, sizeof ts);
    int ok = 1, rc = 0;
    gdn_status st = GDN_OK;
    int64_t sdims[4] = {o->B, o->HV, o->layout == GDN_STATE_KV ? o->K : o->V,
                        o->layout == GDN_STATE_KV ? o->V : o->K};
    if (o->chunk) {
        int64_t T = o->T;
        ok = bench_token_tensors(bk, o, T, ts) &&
             bench_alloc(bk, &ts[6], "final_state", o->state_dtype, 4, sdims, 0, 0, -1);
        if (ok) {
            gdn_chunk_fwd_args c;
            memset(&c, 0, sizeof c);
            c.q = ts[0].t, c.k = ts[1].t, c.v = ts[2].t, c.o = ts[3].t;
            c.gate.kind = GDN_GATE_GDN;
            c.gate.g = ts[4].t, c.gate.beta = ts[5].t;
            c.use_qk_l2norm = 1;
            c.state_layout = o->layout;
            c.final_state = ts[6].t;
            st = gdn_chunk_fwd_workspace_size(&c, &c.workspace_bytes);
            if (st == GDN_OK && c.workspace_bytes)
                c.workspace = ts[7].dev = dev_alloc(bk, c.workspace_bytes);
            bench_timing tm;
            if (st == GDN_OK)
                st = bench_time(bk, call_chunk, &c, o->reps, &tm);
            if (st == GDN_OK)
                bench_report("gdn_chunk_fwd", bk, o, T, &tm);
        }
    }
    if (o->recurrent && ok && st == GDN_OK) {
        int64_t T = o->decode_T;
        ok = bench_token_tensors(bk, o, T, ts + 8) &&
             bench_alloc(bk, &ts[14], "state", o->state_dtype, 4, sdims, 0, 0.1, MAP_NONE);
        if (ok) {
            gdn_recurrent_fwd_args r;
            memset(&r, 0, sizeof r);
            r.q = ts[8].t, r.k = ts[9].t, r.v = ts[10].t, r.o = ts[11].t;
            r.gate.kind = GDN_GATE_GDN;
            r.gate.g = ts[12].t, r.gate.beta = ts[13].t;
            r.use_qk_l2norm = 1;
            r.state_layout = o->layout;
            r.state = ts[14].t;
            r.final_state = ts[14].t; /* in place, as a decode step updates its states */
            st = gdn_recurrent_fwd_workspace_size(&r, &r.workspace_bytes);
            if (st == GDN_OK && r.workspace_bytes)
                r.workspace = ts[15].dev = dev_alloc(bk, r.workspace_bytes);
            bench_timing tm;
            if (st == GDN_OK)
                st = bench_time(bk, call_recurrent, &r, o->reps, &tm);
            if (st == GDN_OK)
                bench_report("gdn_recurrent_fwd", bk, o, T, &tm);
        }
    }
    if (!ok)
        rc = 2;
    else if (st != GDN_OK) {
        fprintf(stderr, "gdn bench: %s (%s)\n", gdn_status_string(st), gdn_last_error());
        rc = 1;
    }
    for (int i = 0; i < NT; i++)
        if (ts[i].dev)
            dev_free(bk, ts[i].dev);
    return rc;
}

static int cmd_bench(int argc, char **argv)
{
    bench_opts o = {.B = 4, .T = 1024, .decode_T = 1, .H = 16, .HV = 32, .K = 128, .V = 128, .reps = 0,
                    .dtype = GDN_DTYPE_BF16, .state_dtype = GDN_DTYPE_F32, .layout = GDN_STATE_VK,
                    .device = "auto", .chunk = 1, .recurrent = 1};
    static const char *const dtypes[] = {"f32", "bf16", "f16"}, *const state_dtypes[] = {"f32", "bf16"};
    static const char *const layouts[] = {"kv", "vk"}, *const devices[] = {"auto", "cpu", "cuda"};
    static const char *const ops[] = {"both", "chunk", "recurrent"};
    const int64_t DIM_MAX = INT32_MAX;
    for (int i = 2; i < argc; i++) {
        const char *opt = argv[i];
        if (strncmp(opt, "--", 2) != 0) {
            fprintf(stderr, "gdn bench: unexpected argument '%s' (options start with --; see gdn help)\n", opt);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "gdn bench: %s needs a value (see gdn help)\n", opt);
            return 2;
        }
        const char *val = argv[++i];
        int choice = 0, ok;
        if (!strcmp(opt, "--batch"))
            ok = parse_int(opt, val, 1, DIM_MAX, &o.B);
        else if (!strcmp(opt, "--tokens"))
            ok = parse_int(opt, val, 1, DIM_MAX, &o.T);
        else if (!strcmp(opt, "--decode-tokens"))
            ok = parse_int(opt, val, 1, DIM_MAX, &o.decode_T);
        else if (!strcmp(opt, "--heads"))
            ok = parse_int(opt, val, 1, DIM_MAX, &o.H);
        else if (!strcmp(opt, "--value-heads"))
            ok = parse_int(opt, val, 1, DIM_MAX, &o.HV);
        else if (!strcmp(opt, "--key-dim"))
            ok = parse_int(opt, val, 1, DIM_MAX, &o.K);
        else if (!strcmp(opt, "--value-dim"))
            ok = parse_int(opt, val, 1, DIM_MAX, &o.V);
        else if (!strcmp(opt, "--reps"))
            ok = parse_int(opt, val, 1, 1000000, &o.reps);
        else if (!strcmp(opt, "--dtype")) {
            ok = parse_choice(opt, val, dtypes, 3, &choice);
            o.dtype = choice == 0 ? GDN_DTYPE_F32 : choice == 1 ? GDN_DTYPE_BF16 : GDN_DTYPE_F16;
        } else if (!strcmp(opt, "--state-dtype")) {
            ok = parse_choice(opt, val, state_dtypes, 2, &choice);
            o.state_dtype = choice == 0 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
        } else if (!strcmp(opt, "--state-layout")) {
            ok = parse_choice(opt, val, layouts, 2, &choice);
            o.layout = choice == 0 ? GDN_STATE_KV : GDN_STATE_VK;
        } else if (!strcmp(opt, "--device")) {
            ok = parse_choice(opt, val, devices, 3, &choice);
            o.device = devices[choice];
        } else if (!strcmp(opt, "--op")) {
            ok = parse_choice(opt, val, ops, 3, &choice);
            o.chunk = choice != 2;
            o.recurrent = choice != 1;
        } else {
            fprintf(stderr, "gdn bench: unknown option '%s' (see gdn help)\n", opt);
            return 2;
        }
        if (!ok)
            return 2;
    }
    if (o.HV % o.H != 0) {
        fprintf(stderr, "gdn bench: --value-heads %lld must be a multiple of --heads %lld\n", (long long)o.HV,
                (long long)o.H);
        return 2;
    }
    char why[256];
    backend bk = pick_backend(why, sizeof why);
    if (!strcmp(o.device, "cpu"))
        bk = cpu_backend();
    else if (!strcmp(o.device, "cuda") && !bk.cuda) {
        fprintf(stderr, "gdn bench: --device cuda: %s\n", why);
        return 1;
    } else if (!bk.cuda)
        printf("note: running on the CPU: %s\n", why);
    if (o.reps == 0)
        o.reps = bk.cuda ? 20 : 3;
    return bench_run(&bk, &o);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: gdn <command> [options]\n"
               "  demo          one Qwen3-Next GDN layer: chunked prefill + 8 decode steps, checked against float64;\n"
               "                on the GPU when the CUDA backend is built and a GPU is present, else on the CPU\n"
               "  bench [options]\n"
               "                time gdn_chunk_fwd (prefill of B sequences of T tokens) and gdn_recurrent_fwd\n"
               "                (decode: the B states updated in place), precomputed gates, in-kernel q/k l2norm;\n"
               "                one warm-up call, then the best and mean of --reps synchronised calls\n"
               "    --batch B            sequences (default 4)\n"
               "    --tokens T           prefill tokens per sequence (default 1024)\n"
               "    --decode-tokens T    tokens per sequence in one recurrent call (default 1)\n"
               "    --heads H            query / key heads (default 16)\n"
               "    --value-heads HV     value heads, a multiple of H (default 32)\n"
               "    --key-dim K          key head dim (default 128)\n"
               "    --value-dim V        value head dim (default 128)\n"
               "    --dtype D            q, k, v, beta, o: f32 | bf16 | f16 (default bf16)\n"
               "    --state-dtype D      states: f32 | bf16 (default f32)\n"
               "    --state-layout L     kv ([B, HV, K, V]) | vk ([B, HV, V, K]) (default vk)\n"
               "    --device D           auto | cpu | cuda (default auto: the GPU when there is one)\n"
               "    --op OP              both | chunk | recurrent (default both)\n"
               "    --reps N             timed calls (default 20 on the GPU, 3 on the CPU)\n"
               "                numbers are whole decimal numbers (no sign, exponent or suffix)\n"
               "  --version     print the library version\n"
               "  help          this text\n"
               "environment: GDN_NUM_THREADS sets the CPU backend's thread count\n");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "demo"))
        return cmd_demo();
    if (!strcmp(cmd, "bench"))
        return cmd_bench(argc, argv);
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("gdn %s (libgdn %s, CUDA backend: %s)\n", gdn_version_string(), gdn_version_string(),
               gdn_has_cuda() ? "yes" : "no");
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "gdn: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
