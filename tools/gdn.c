/*
 * gdn.c - the `gdn` command: a demo of one Qwen3-Next-shaped GDN layer, a CPU benchmark, version.
 *
 *   gdn demo        prefill 4 sequences (4096 tokens) with gdn_chunk_fwd (in-kernel gating and
 *                   l2norm, bf16 inputs, f32 states in VK layout written straight into a state
 *                   pool), then 8 decode steps with gdn_recurrent_fwd updating the pool in place;
 *                   checks both against the float64 recurrence on a subset of heads and prints
 *                   a table. Runs on the GPU when the library has CUDA and a GPU is present.
 *   gdn bench [T]   CPU timing of chunk (prefill of T tokens) and recurrent (decode) at the demo shape
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

static uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even; inputs here are finite */
    return (uint16_t)(u >> 16);
}

static double from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static gdn_tensor tensor(void *data, gdn_dtype dtype, gdn_device_type dev, int rank, const int64_t *shape)
{
    return gdn_tensor_make(data, dtype, dev, 0, rank, shape);
}

static uint16_t *bf16_randn(size_t n, double std)
{
    uint16_t *p = xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        p[i] = to_bf16((float)(std * randn()));
    return p;
}

static float *f32_randn(size_t n, double mean, double std)
{
    float *p = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(mean + std * randn());
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
    return xmalloc(bytes);
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

static backend pick_backend(void)
{
    backend bk = {0, ""};
    snprintf(bk.name, sizeof bk.name, "cpu (%d threads)", gdn_get_num_threads());
#ifdef GDN_WITH_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
            bk.cuda = 1;
            snprintf(bk.name, sizeof bk.name, "cuda (%.60s)", prop.name);
        }
    } else {
        cudaGetLastError();
    }
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
    gdn_status st = gdn_recurrent_fwd(&r);
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
    gdn_status st = GDN_OK;
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
    backend best = pick_backend(), cpu = cpu_backend();
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

/* CPU timing of both ops at the demo's head shape, no correctness check beyond the status. */
static int cmd_bench(int argc, char **argv)
{
    int64_t T = argc > 2 ? atoll(argv[2]) : 4096;
    if (T < NSEQ) {
        fprintf(stderr, "gdn bench: T must be >= %d\n", NSEQ);
        return 2;
    }
    int32_t lens[NSEQ];
    for (int n = 0; n < NSEQ; n++)
        lens[n] = (int32_t)(T / NSEQ + (n < T % NSEQ));
    layer L;
    layer_init(&L, lens);
    backend bk = cpu_backend();
    dev_bufs d = upload(&bk, &L);
    gdn_chunk_fwd_args c = prefill_args(&L, &d, GDN_DEVICE_CPU);
    double best = INFINITY;
    gdn_status st = GDN_OK;
    for (int rep = 0; rep < 3 && st == GDN_OK; rep++) {
        double t0 = now_s();
        st = gdn_chunk_fwd(&c);
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    if (st != GDN_OK) {
        fprintf(stderr, "gdn: %s (%s)\n", gdn_status_string(st), gdn_last_error());
        return 1;
    }
    printf("%-26s %-20s T=%-7lld %10.3f ms %12.0f tok/s\n", "gdn_chunk_fwd (best of 3)", bk.name, (long long)T,
           1e3 * best, (double)T / best);
    gdn_recurrent_fwd_args r = decode_args(&d, GDN_DEVICE_CPU);
    put_decode_inputs(&bk, &d, &L, 0);
    best = INFINITY;
    for (int rep = 0; rep < 20 && st == GDN_OK; rep++) {
        double t0 = now_s();
        st = gdn_recurrent_fwd(&r);
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    if (st != GDN_OK) {
        fprintf(stderr, "gdn: %s (%s)\n", gdn_status_string(st), gdn_last_error());
        return 1;
    }
    printf("%-26s %-20s N=%-7d %10.3f ms %12.0f tok/s\n", "gdn_recurrent_fwd (best/20)", bk.name, NSEQ, 1e3 * best,
           NSEQ / best);
    free_bufs(&bk, &d);
    layer_free(&L);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: gdn <command>\n"
               "  demo          one Qwen3-Next GDN layer: chunked prefill + 8 decode steps, checked against float64\n"
               "  bench [T]     CPU timing of gdn_chunk_fwd (T tokens, default 4096) and gdn_recurrent_fwd\n"
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
