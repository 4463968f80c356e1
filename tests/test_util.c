/*
 * test_util.c - the shared test harness (see test_util.h).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "test_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef GDN_WITH_CUDA
#include <cuda_runtime.h>
#endif

/* ------------------------------------------------------------------------------------------ */
/* Random numbers                                                                              */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

tu_rng tu_rng_make(uint64_t seed)
{
    tu_rng r;
    r.s = splitmix64(&seed);
    if (r.s == 0) /* xorshift's one fixed point */
        r.s = 0x2545F4914F6CDD1Dull;
    return r;
}

uint64_t tu_rng_u64(tu_rng *r)
{
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

double tu_rng_uniform(tu_rng *r)
{
    return (double)(tu_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}

double tu_rng_normal(tu_rng *r)
{
    double u1 = tu_rng_uniform(r), u2 = tu_rng_uniform(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t tu_rng_int(tu_rng *r, int64_t lo, int64_t hi)
{
    uint64_t span = (uint64_t)(hi - lo) + 1;
    return lo + (int64_t)(tu_rng_u64(r) % span);
}

void tu_fill_uniform(float *x, size_t n, tu_rng *r, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(lo + (hi - lo) * tu_rng_uniform(r));
}

void tu_fill_normal(float *x, size_t n, tu_rng *r, float mean, float std)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(mean + std * tu_rng_normal(r));
}

void tu_fill_logsigmoid_normal(float *x, size_t n, tu_rng *r)
{
    for (size_t i = 0; i < n; i++) {
        double z = tu_rng_normal(r);
        /* log(sigmoid(z)) = -log1p(exp(-z)), written to stay finite for either sign */
        x[i] = (float)(z < 0 ? z - log1p(exp(z)) : -log1p(exp(-z)));
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Floating-point formats                                                                      */

/* The library's conversions (gdn.h; tested exhaustively by test_convert.c), one element at a time. */
static float to_f32(gdn_dtype dtype, uint16_t h)
{
    float x;
    if (dtype == GDN_DTYPE_BF16)
        gdn_bf16_to_f32(&h, &x, 1);
    else
        gdn_f16_to_f32(&h, &x, 1);
    return x;
}

static uint16_t from_f32(gdn_dtype dtype, float x)
{
    uint16_t h;
    if (dtype == GDN_DTYPE_BF16)
        gdn_f32_to_bf16(&x, &h, 1);
    else
        gdn_f32_to_f16(&x, &h, 1);
    return h;
}

float tu_round(gdn_dtype dtype, float x)
{
    switch (dtype) {
    case GDN_DTYPE_BF16:
    case GDN_DTYPE_F16: return to_f32(dtype, from_f32(dtype, x));
    default: return x;
    }
}

void tu_round_array(float *x, size_t n, gdn_dtype dtype)
{
    for (size_t i = 0; i < n; i++)
        x[i] = tu_round(dtype, x[i]);
}

double tu_get(const void *p, gdn_dtype dtype, size_t i)
{
    switch (dtype) {
    case GDN_DTYPE_F32: return ((const float *)p)[i];
    case GDN_DTYPE_BF16:
    case GDN_DTYPE_F16: return to_f32(dtype, ((const uint16_t *)p)[i]);
    case GDN_DTYPE_I32: return ((const int32_t *)p)[i];
    case GDN_DTYPE_F64: return ((const double *)p)[i];
    }
    return NAN;
}

void tu_set(void *p, gdn_dtype dtype, size_t i, double x)
{
    switch (dtype) {
    case GDN_DTYPE_F32: ((float *)p)[i] = (float)x; break;
    case GDN_DTYPE_BF16:
    case GDN_DTYPE_F16: ((uint16_t *)p)[i] = from_f32(dtype, (float)x); break;
    case GDN_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)x; break;
    case GDN_DTYPE_F64: ((double *)p)[i] = x; break;
    }
}

void tu_store_f32(void *dst, gdn_dtype dtype, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        tu_set(dst, dtype, i, src[i]);
}

void tu_load_f64(double *dst, const void *src, gdn_dtype dtype, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = tu_get(src, dtype, i);
}

/* ------------------------------------------------------------------------------------------ */
/* Host buffers and tensor descriptors                                                         */

static size_t dtype_bytes(gdn_dtype dtype)
{
    switch (dtype) {
    case GDN_DTYPE_F32: case GDN_DTYPE_I32: return 4;
    case GDN_DTYPE_BF16: case GDN_DTYPE_F16: return 2;
    case GDN_DTYPE_F64: return 8;
    }
    return 0;
}

void *tu_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory allocating %zu bytes\n", bytes);
        exit(2);
    }
    return p;
}

void *tu_alloc_elems(gdn_dtype dtype, size_t n)
{
    void *p = tu_alloc(n * dtype_bytes(dtype));
    memset(p, 0, n * dtype_bytes(dtype));
    return p;
}

gdn_tensor tu_tensor(void *data, gdn_dtype dtype, int rank, const int64_t *shape)
{
    int64_t stride[GDN_MAX_RANK] = {0};
    int64_t s = 1;
    for (int d = rank - 1; d >= 0; d--) {
        stride[d] = s;
        s *= shape[d];
    }
    return tu_tensor_strided(data, dtype, rank, shape, stride);
}

gdn_tensor tu_tensor_strided(void *data, gdn_dtype dtype, int rank, const int64_t *shape,
                             const int64_t *stride)
{
    gdn_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.device = GDN_DEVICE_CPU;
    t.device_ordinal = 0;
    t.rank = rank;
    for (int d = 0; d < rank && d < GDN_MAX_RANK; d++) {
        t.shape[d] = shape[d];
        t.stride[d] = stride[d];
    }
    return t;
}

size_t tu_numel(const gdn_tensor *t)
{
    size_t n = 1;
    for (int d = 0; d < t->rank; d++)
        n *= (size_t)t->shape[d];
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* Poison                                                                                      */

#define TU_POISON_F32 0x7fc00badu
#define TU_POISON_16_BF 0x7fc0u
#define TU_POISON_16_F 0x7e00u
#define TU_POISON_F64 0x7ff8000000000badull

void tu_poison(void *p, gdn_dtype dtype, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        switch (dtype) {
        case GDN_DTYPE_F32: case GDN_DTYPE_I32: ((uint32_t *)p)[i] = TU_POISON_F32; break;
        case GDN_DTYPE_BF16: ((uint16_t *)p)[i] = TU_POISON_16_BF; break;
        case GDN_DTYPE_F16: ((uint16_t *)p)[i] = TU_POISON_16_F; break;
        case GDN_DTYPE_F64: ((uint64_t *)p)[i] = TU_POISON_F64; break;
        }
    }
}

size_t tu_count_poison(const void *p, gdn_dtype dtype, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) {
        switch (dtype) {
        case GDN_DTYPE_F32: case GDN_DTYPE_I32: c += ((const uint32_t *)p)[i] == TU_POISON_F32; break;
        case GDN_DTYPE_BF16: c += ((const uint16_t *)p)[i] == TU_POISON_16_BF; break;
        case GDN_DTYPE_F16: c += ((const uint16_t *)p)[i] == TU_POISON_16_F; break;
        case GDN_DTYPE_F64: c += ((const uint64_t *)p)[i] == TU_POISON_F64; break;
        }
    }
    return c;
}

void *tu_snapshot(const void *p, size_t bytes)
{
    void *s = tu_alloc(bytes);
    memcpy(s, p, bytes);
    return s;
}

int tu_same_bytes(const void *a, const void *b, size_t bytes)
{
    return memcmp(a, b, bytes) == 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */

tu_err tu_compare(const void *out, gdn_dtype out_dtype, const void *ref, gdn_dtype ref_dtype, size_t n)
{
    tu_err e;
    memset(&e, 0, sizeof e);
    e.n = n;
    double num = 0, den = 0, worst = -1;
    for (size_t i = 0; i < n; i++) {
        double o = tu_get(out, out_dtype, i), r = tu_get(ref, ref_dtype, i);
        if (!isfinite(r) && ((isnan(r) && isnan(o)) || o == r))
            continue; /* the same non-finite value on both sides */
        if (!isfinite(o) || !isfinite(r)) {
            if (e.nonfinite++ == 0) {
                e.worst = i;
                e.worst_out = o;
                e.worst_ref = r;
            }
            continue;
        }
        double d = o - r;
        num += d * d;
        den += r * r;
        if (fabs(d) > worst && e.nonfinite == 0) {
            worst = fabs(d);
            e.worst = i;
            e.worst_out = o;
            e.worst_ref = r;
        }
        if (fabs(d) > e.max_abs)
            e.max_abs = fabs(d);
    }
    e.rel = den > 0 ? sqrt(num / den) : sqrt(num);
    return e;
}

/* State of the test being run. */
static int g_failures;
static double g_worst_ratio, g_worst_rel, g_worst_tol;
static const char *g_test_name;
static char g_worst_what[96];
static char g_skip_reason[160];

int tu_check(const char *what, tu_err err, double tol)
{
    int ok = err.nonfinite == 0 && err.rel <= tol;
    double ratio = err.nonfinite ? INFINITY : (tol > 0 ? err.rel / tol : err.rel);
    if (ratio > g_worst_ratio || g_worst_what[0] == 0) {
        g_worst_ratio = ratio;
        g_worst_rel = err.nonfinite ? INFINITY : err.rel;
        g_worst_tol = tol;
        snprintf(g_worst_what, sizeof g_worst_what, "%s", what);
    }
    if (!ok) {
        g_failures++;
        printf("    FAIL %s: %s: rel %.3e (tol %.1e), %zu non-finite of %zu, worst [%zu] out %.9g ref %.9g\n",
               g_test_name ? g_test_name : "?", what, err.rel, tol, err.nonfinite, err.n, err.worst,
               err.worst_out, err.worst_ref);
    }
    return ok;
}

int tu_expect(int cond, const char *fmt, ...)
{
    if (cond)
        return 1;
    g_failures++;
    printf("    FAIL %s: ", g_test_name ? g_test_name : "?");
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    return 0;
}

void tu_skip_reason(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_skip_reason, sizeof g_skip_reason, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------------------------ */
/* Runner                                                                                      */

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int selected(const char *name, int argc, char **argv)
{
    if (argc <= 1)
        return 1;
    for (int i = 1; i < argc; i++)
        if (strstr(name, argv[i]))
            return 1;
    return 0;
}

int tu_main(const tu_test *tests, int count, int argc, char **argv)
{
    int passed = 0, failed = 0, skipped = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < count; i++) {
        if (!selected(tests[i].name, argc, argv))
            continue;
        g_failures = 0;
        g_worst_ratio = 0;
        g_worst_rel = 0;
        g_worst_tol = 0;
        g_worst_what[0] = 0;
        g_skip_reason[0] = 0;
        g_test_name = tests[i].name;
        double t0 = now_seconds();
        int rc = tests[i].fn();
        double dt = now_seconds() - t0;
        if (rc == TU_SKIP && g_failures == 0) {
            skipped++;
            printf("SKIP %-44s %s\n", tests[i].name, g_skip_reason[0] ? g_skip_reason : "");
            continue;
        }
        int ok = rc == TU_PASS && g_failures == 0;
        if (ok)
            passed++;
        else
            failed++;
        if (g_worst_what[0])
            printf("%s %-44s worst rel %.2e (tol %.0e, %s) %6.2fs\n", ok ? "PASS" : "FAIL", tests[i].name,
                   g_worst_rel, g_worst_tol, g_worst_what, dt);
        else
            printf("%s %-44s %6.2fs\n", ok ? "PASS" : "FAIL", tests[i].name, dt);
    }
    if (skipped)
        printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    else
        printf("%d passed, %d failed\n", passed, failed);
    if (failed)
        return 1;
    return skipped && !passed ? TU_EXIT_SKIPPED : 0;
}

int tu_cuda_device_count(void)
{
#ifdef GDN_WITH_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error for later calls */
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

#ifdef GDN_WITH_CUDA

/* Bytes from a tensor's first to last element (0 for an empty one). */
static size_t extent_bytes(const gdn_tensor *t)
{
    size_t extent = 1;
    for (int i = 0; i < t->rank; i++) {
        if (t->shape[i] == 0)
            return 0;
        extent += (size_t)((t->shape[i] - 1) * t->stride[i]);
    }
    return extent * gdn_dtype_size(t->dtype);
}

void tu_mirror_tensor(tu_mirror *m, gdn_tensor *t)
{
    if (!t->data)
        return;
    size_t bytes = extent_bytes(t);
    for (int i = 0; i < m->count; i++) {
        if (m->host[i] == t->data) {
            if (bytes > m->bytes[i]) { /* the largest extent wins */
                void *d;
                TU_CUDA_OK(cudaMalloc(&d, bytes));
                TU_CUDA_OK(cudaMemcpy(d, t->data, bytes, cudaMemcpyHostToDevice));
                TU_CUDA_OK(cudaFree(m->dev[i]));
                m->dev[i] = d;
                m->bytes[i] = bytes;
            }
            t->data = m->dev[i];
            t->device = GDN_DEVICE_CUDA;
            return;
        }
    }
    if (m->count == TU_MAX_MIRROR) {
        fprintf(stderr, "tu_mirror: too many tensors\n");
        exit(1);
    }
    void *d = NULL;
    TU_CUDA_OK(cudaMalloc(&d, bytes ? bytes : 16));
    if (bytes)
        TU_CUDA_OK(cudaMemcpy(d, t->data, bytes, cudaMemcpyHostToDevice));
    m->host[m->count] = t->data;
    m->dev[m->count] = d;
    m->bytes[m->count] = bytes;
    m->count++;
    t->data = d;
    t->device = GDN_DEVICE_CUDA;
}

void tu_mirror_back(tu_mirror *m)
{
    TU_CUDA_OK(cudaDeviceSynchronize());
    for (int i = 0; i < m->count; i++) {
        if (m->bytes[i])
            TU_CUDA_OK(cudaMemcpy(m->host[i], m->dev[i], m->bytes[i], cudaMemcpyDeviceToHost));
        TU_CUDA_OK(cudaFree(m->dev[i]));
    }
    m->count = 0;
}
#endif

const char *tu_cuda_unavailable(void)
{
#ifdef GDN_WITH_CUDA
    static char why[200];
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, sizeof why, "no usable CUDA device: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        cudaGetLastError();
        return why;
    }
    return n > 0 ? NULL : "no CUDA device";
#else
    return "libgdn built without CUDA";
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* A random problem and its oracle                                                             */

double tu_softplus(double x, double beta, double threshold)
{
    if (beta == 0)
        beta = 1;
    if (threshold == 0)
        threshold = 20;
    if (beta * x > threshold)
        return x;
    return log1p(exp(beta * x)) / beta;
}

double tu_gate_value(gdn_gate_kind kind, double a, double A_log, double dt_bias, double lower_bound,
                     double sp_beta, double sp_threshold)
{
    if (kind == GDN_GATE_KDA && lower_bound != 0)
        return lower_bound / (1 + exp(-exp(A_log) * (a + dt_bias)));
    return -exp(A_log) * tu_softplus(a + dt_bias, sp_beta, sp_threshold);
}

double tu_beta_value(double b, int allow_neg_eigval)
{
    double s = 1 / (1 + exp(-b));
    return allow_neg_eigval ? 2 * s : s;
}

void tu_case_seq(const tu_case *c, int64_t n, int64_t *start, int64_t *end)
{
    if (c->cu) {
        *start = c->cu[n];
        *end = c->cu[n + 1];
    } else {
        *start = n * c->c.T;
        *end = (n + 1) * c->c.T;
    }
}

/* Rounds x through dtype in place and keeps it twice: in a new buffer of dtype and in double. */
static void keep_rounded(float *x, size_t n, gdn_dtype dtype, void **out, double **out64)
{
    tu_round_array(x, n, dtype);
    *out = tu_alloc_elems(dtype, n);
    tu_store_f32(*out, dtype, x, n);
    *out64 = tu_alloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        (*out64)[i] = x[i];
}

/* Draws n values, rounds them through dtype, stores them in dtype and in double. */
static void draw_normal(tu_rng *r, size_t n, float std, gdn_dtype dtype, void **out, double **out64)
{
    float *x = tu_alloc(n * sizeof(float));
    tu_fill_normal(x, n, r, 0.0f, std);
    keep_rounded(x, n, dtype, out, out64);
    free(x);
}

void tu_case_init(tu_case *c, const tu_case_config *cfg)
{
    memset(c, 0, sizeof *c);
    c->c = *cfg;
    tu_case_config *k = &c->c;
    if (k->nseq > 0) {
        k->B = 1;
        c->N = k->nseq;
        c->cu = tu_alloc((size_t)(k->nseq + 1) * sizeof(int32_t));
        c->cu[0] = 0;
        for (int n = 0; n < k->nseq; n++)
            c->cu[n + 1] = c->cu[n] + k->seqlens[n];
        k->T = c->cu[k->nseq];
    } else {
        c->N = k->B;
    }
    tu_rng rng = tu_rng_make(k->seed);
    int kda = k->kind == GDN_GATE_KDA;
    size_t ntok = (size_t)(k->B * k->T);
    size_t nqk = ntok * (size_t)(k->H * k->K), nv = ntok * (size_t)(k->HV * k->V);
    c->gate_numel = (int64_t)ntok * k->HV * (kda ? k->K : 1);
    c->state_numel = c->N * k->HV * k->K * k->V;

    draw_normal(&rng, nqk, 1.0f, k->dtype, &c->q, &c->q64);
    {
        /* without in-kernel l2norm the caller normalises k (an unnormalised delta rule with
         * ||k||^2 ~ K diverges); round after normalising, as a model would */
        float *x = tu_alloc(nqk * sizeof(float));
        tu_fill_normal(x, nqk, &rng, 0.0f, 1.0f);
        if (!k->l2norm) {
            for (size_t i = 0; i < nqk; i += (size_t)k->K) {
                double ss = 0;
                for (int64_t d = 0; d < k->K; d++)
                    ss += (double)x[i + d] * x[i + d];
                for (int64_t d = 0; d < k->K; d++)
                    x[i + d] = (float)(x[i + d] / sqrt(ss));
            }
        }
        keep_rounded(x, nqk, k->dtype, &c->k, &c->k64);
        free(x);
    }
    draw_normal(&rng, nv, 1.0f, k->dtype, &c->v, &c->v64);

    size_t ng = (size_t)c->gate_numel, nb = ntok * (size_t)k->HV;
    c->g = tu_alloc(ng * sizeof(float));
    c->g64 = tu_alloc(ng * sizeof(double));
    c->a = tu_alloc(ng * sizeof(float));
    c->A_log = tu_alloc((size_t)k->HV * sizeof(float));
    size_t ndt = (size_t)(k->HV * (kda ? k->K : 1));
    c->dt_bias = tu_alloc(ndt * sizeof(float));
    if (k->raw_gates) {
        /* A = exp(A_log) in [0.5, 4], softplus(a + dt_bias) ~ 0.35: about logsigmoid(randn)'s strength */
        tu_fill_normal(c->a, ng, &rng, 0.0f, 1.0f);
        for (int64_t j = 0; j < k->HV; j++)
            c->A_log[j] = (float)log(0.5 + 3.5 * tu_rng_uniform(&rng));
        tu_fill_normal(c->dt_bias, ndt, &rng, -1.0f, 0.5f);
        for (size_t i = 0; i < ng; i++) {
            size_t tok_head = kda ? i / (size_t)k->K : i;
            size_t j = tok_head % (size_t)k->HV;
            size_t dt_i = kda ? j * (size_t)k->K + i % (size_t)k->K : j;
            c->g64[i] = tu_gate_value(k->kind, c->a[i], c->A_log[j], c->dt_bias[dt_i], k->lower_bound, 0, 0);
            c->g[i] = (float)c->g64[i];
        }
    } else {
        double std = k->gate_std != 0 ? k->gate_std : 1.0;
        for (size_t i = 0; i < ng; i++) {
            double z = k->gate_mean + std * tu_rng_normal(&rng);
            c->g[i] = (float)(z < 0 ? z - log1p(exp(z)) : -log1p(exp(-z)));
            c->g64[i] = c->g[i];
        }
    }

    {
        float *x = tu_alloc(nb * sizeof(float));
        tu_fill_normal(x, nb, &rng, 0.0f, 1.0f);
        if (!k->raw_gates)
            for (size_t i = 0; i < nb; i++)
                x[i] = (float)(1 / (1 + exp(-(double)x[i])));
        keep_rounded(x, nb, k->beta_dtype, &c->beta, &c->beta64);
        if (k->raw_gates) /* the oracle takes beta itself, from the rounded logits */
            for (size_t i = 0; i < nb; i++)
                c->beta64[i] = tu_beta_value(x[i], k->allow_neg_eigval);
        free(x);
    }

    size_t ns = (size_t)c->state_numel;
    if (k->initial_state)
        draw_normal(&rng, ns, 0.5f, k->state_dtype, &c->h0, &c->h064);
    c->o = tu_alloc_elems(k->dtype, nv);
    c->ht = tu_alloc_elems(k->state_dtype, ns);
    c->o_ref = tu_alloc(nv * sizeof(double));
    c->ht_ref = tu_alloc(ns * sizeof(double));
    tu_case_poison(c);
    tu_poison(c->o_ref, GDN_DTYPE_F64, nv);
    tu_poison(c->ht_ref, GDN_DTYPE_F64, ns);
}

void tu_case_free(tu_case *c)
{
    void *bufs[] = {c->cu, c->q, c->k, c->v, c->q64, c->k64, c->v64, c->g, c->a, c->A_log, c->dt_bias,
                    c->beta, c->g64, c->beta64, c->h0, c->h064, c->o, c->ht, c->o_ref, c->ht_ref};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    memset(c, 0, sizeof *c);
}

void tu_case_poison(tu_case *c)
{
    tu_poison(c->o, c->c.dtype, (size_t)(c->c.B * c->c.T * c->c.HV * c->c.V));
    tu_poison(c->ht, c->c.state_dtype, (size_t)c->state_numel);
}

gdn_tensor tu_case_qk(const tu_case *c, void *data, gdn_dtype dtype)
{
    return TU_TENSOR(data, dtype, c->c.B, c->c.T, c->c.H, c->c.K);
}

gdn_tensor tu_case_vo(const tu_case *c, void *data, gdn_dtype dtype)
{
    return TU_TENSOR(data, dtype, c->c.B, c->c.T, c->c.HV, c->c.V);
}

gdn_tensor tu_case_state(const tu_case *c, void *data, gdn_dtype dtype, int64_t rows)
{
    if (c->c.layout == GDN_STATE_VK)
        return TU_TENSOR(data, dtype, rows, c->c.HV, c->c.V, c->c.K);
    return TU_TENSOR(data, dtype, rows, c->c.HV, c->c.K, c->c.V);
}

gdn_tensor tu_case_gate(const tu_case *c, void *data, gdn_dtype dtype)
{
    if (c->c.kind == GDN_GATE_KDA)
        return TU_TENSOR(data, dtype, c->c.B, c->c.T, c->c.HV, c->c.K);
    return TU_TENSOR(data, dtype, c->c.B, c->c.T, c->c.HV);
}

gdn_tensor tu_case_beta(const tu_case *c, void *data, gdn_dtype dtype)
{
    return TU_TENSOR(data, dtype, c->c.B, c->c.T, c->c.HV);
}

gdn_gate_params tu_case_gate_params(const tu_case *c)
{
    gdn_gate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.kind = c->c.kind;
    gp.beta = tu_case_beta(c, c->beta, c->c.beta_dtype);
    if (c->c.raw_gates) {
        gp.a = tu_case_gate(c, c->a, GDN_DTYPE_F32);
        gp.A_log = TU_TENSOR(c->A_log, GDN_DTYPE_F32, c->c.HV);
        if (c->c.kind == GDN_GATE_KDA)
            gp.dt_bias = TU_TENSOR(c->dt_bias, GDN_DTYPE_F32, c->c.HV, c->c.K);
        else
            gp.dt_bias = TU_TENSOR(c->dt_bias, GDN_DTYPE_F32, c->c.HV);
        gp.lower_bound = c->c.lower_bound;
        gp.beta_from_logits = 1;
        gp.allow_neg_eigval = c->c.allow_neg_eigval;
    } else {
        gp.g = tu_case_gate(c, c->g, GDN_DTYPE_F32);
    }
    return gp;
}

static gdn_tensor case_cu(const tu_case *c)
{
    gdn_tensor t;
    memset(&t, 0, sizeof t);
    if (c->cu)
        t = TU_TENSOR(c->cu, GDN_DTYPE_I32, c->N + 1);
    return t;
}

gdn_recurrent_fwd_args tu_case_recurrent_args(const tu_case *c)
{
    gdn_recurrent_fwd_args a;
    memset(&a, 0, sizeof a);
    a.q = tu_case_qk(c, c->q, c->c.dtype);
    a.k = tu_case_qk(c, c->k, c->c.dtype);
    a.v = tu_case_vo(c, c->v, c->c.dtype);
    a.o = tu_case_vo(c, c->o, c->c.dtype);
    a.gate = tu_case_gate_params(c);
    a.scale = c->c.scale;
    a.use_qk_l2norm = c->c.l2norm;
    a.cu_seqlens = case_cu(c);
    a.state_layout = c->c.layout;
    if (c->h0)
        a.state = tu_case_state(c, c->h0, c->c.state_dtype, c->N);
    a.final_state = tu_case_state(c, c->ht, c->c.state_dtype, c->N);
    return a;
}

gdn_chunk_fwd_args tu_case_chunk_args(const tu_case *c)
{
    gdn_recurrent_fwd_args a = tu_case_recurrent_args(c);
    return tu_chunk_args(&a);
}

gdn_chunk_fwd_args tu_chunk_args(const gdn_recurrent_fwd_args *r)
{
    gdn_chunk_fwd_args a;
    memset(&a, 0, sizeof a);
    a.q = r->q;
    a.k = r->k;
    a.v = r->v;
    a.o = r->o;
    a.gate = r->gate;
    a.scale = r->scale;
    a.use_qk_l2norm = r->use_qk_l2norm;
    a.cu_seqlens = r->cu_seqlens;
    a.state_layout = r->state_layout;
    a.initial_state = r->state;
    a.final_state = r->final_state;
    a.stream = r->stream;
    return a;
}

/* 256-byte aligned host memory of at least `bytes` (NULL for 0). */
static void *host_workspace(size_t bytes)
{
    return bytes ? aligned_alloc(256, (bytes + 255) / 256 * 256) : NULL;
}

gdn_status tu_chunk_fwd(const gdn_chunk_fwd_args *a)
{
    if (!a || a->workspace)
        return gdn_chunk_fwd(a);
    gdn_chunk_fwd_args c = *a;
    gdn_status st = gdn_chunk_fwd_workspace_size(&c, &c.workspace_bytes);
    if (st != GDN_OK)
        return st;
    c.workspace = host_workspace(c.workspace_bytes);
    st = gdn_chunk_fwd(&c);
    free(c.workspace);
    return st;
}

gdn_status tu_recurrent_fwd(const gdn_recurrent_fwd_args *a)
{
    if (!a || a->workspace)
        return gdn_recurrent_fwd(a);
    gdn_recurrent_fwd_args r = *a;
    gdn_status st = gdn_recurrent_fwd_workspace_size(&r, &r.workspace_bytes);
    if (st != GDN_OK)
        return st;
    r.workspace = host_workspace(r.workspace_bytes);
    st = gdn_recurrent_fwd(&r);
    free(r.workspace);
    return st;
}

gdn_status tu_fwd(int op, const gdn_recurrent_fwd_args *a)
{
    if (op == TU_RECURRENT)
        return tu_recurrent_fwd(a);
    gdn_chunk_fwd_args c = tu_chunk_args(a);
    return tu_chunk_fwd(&c);
}

unsigned char *tu_case_fused_qkv(const tu_case *c, int64_t ds, gdn_tensor *q, gdn_tensor *k, gdn_tensor *v)
{
    const tu_case_config *g = &c->c;
    int64_t B = g->B, T = g->T, H = g->H, HV = g->HV, K = g->K, V = g->V;
    int64_t es = (int64_t)gdn_dtype_size(g->dtype), row = ds * 2 * H * K + HV * V;
    unsigned char *fused = tu_alloc((size_t)(B * T * row * es));
    tu_poison(fused, g->dtype, (size_t)(B * T * row));
    for (int64_t bt = 0; bt < B * T; bt++) {
        for (int64_t i = 0; i < H * K; i++) {
            memcpy(fused + (size_t)((bt * row + i * ds) * es), (char *)c->q + (size_t)((bt * H * K + i) * es),
                   (size_t)es);
            memcpy(fused + (size_t)((bt * row + ds * H * K + i * ds) * es),
                   (char *)c->k + (size_t)((bt * H * K + i) * es), (size_t)es);
        }
        memcpy(fused + (size_t)((bt * row + ds * 2 * H * K) * es), (char *)c->v + (size_t)(bt * HV * V * es),
               (size_t)(HV * V * es));
    }
    int64_t qk_shape[4] = {B, T, H, K}, qk_stride[4] = {T * row, row, K * ds, ds};
    int64_t v_shape[4] = {B, T, HV, V}, v_stride[4] = {T * row, row, V, 1};
    *q = tu_tensor_strided(fused, g->dtype, 4, qk_shape, qk_stride);
    *k = tu_tensor_strided(fused + (size_t)(ds * H * K * es), g->dtype, 4, qk_shape, qk_stride);
    *v = tu_tensor_strided(fused + (size_t)(ds * 2 * H * K * es), g->dtype, 4, v_shape, v_stride);
    return fused;
}

gdn_status tu_case_reference(tu_case *c)
{
    const gdn_dtype f64 = GDN_DTYPE_F64;
    gdn_recurrent_fwd_args a;
    memset(&a, 0, sizeof a);
    a.q = tu_case_qk(c, c->q64, f64);
    a.k = tu_case_qk(c, c->k64, f64);
    a.v = tu_case_vo(c, c->v64, f64);
    a.o = tu_case_vo(c, c->o_ref, f64);
    a.gate.kind = c->c.kind;
    a.gate.g = tu_case_gate(c, c->g64, f64);
    a.gate.beta = tu_case_beta(c, c->beta64, f64);
    a.scale = c->c.scale;
    a.use_qk_l2norm = c->c.l2norm;
    a.cu_seqlens = case_cu(c);
    a.state_layout = c->c.layout;
    if (c->h064)
        a.state = tu_case_state(c, c->h064, f64, c->N);
    a.final_state = tu_case_state(c, c->ht_ref, f64, c->N);
    gdn_status st = tu_recurrent_fwd(&a);
    if (st != GDN_OK)
        printf("    oracle failed: %s (%s)\n", gdn_status_string(st), gdn_last_error());
    return st;
}

/* Offset of state element (row, head j, key r, value c) in the case's layout. */
static size_t state_at(const tu_case *c, int64_t row, int64_t j, int64_t r, int64_t col)
{
    const tu_case_config *k = &c->c;
    if (k->layout == GDN_STATE_VK)
        return (size_t)(((row * k->HV + j) * k->V + col) * k->K + r);
    return (size_t)(((row * k->HV + j) * k->K + r) * k->V + col);
}

void tu_case_naive(const tu_case *c, double *o, double *ht, double *steps)
{
    const tu_case_config *k = &c->c;
    int64_t K = k->K, V = k->V, G = k->HV / k->H;
    double scale = k->scale != 0 ? k->scale : 1 / sqrt((double)K);
    double *S = tu_alloc((size_t)(K * V) * sizeof(double));
    double *qn = tu_alloc((size_t)K * sizeof(double)), *kn = tu_alloc((size_t)K * sizeof(double));
    double *u = tu_alloc((size_t)V * sizeof(double));
    for (int64_t n = 0; n < c->N; n++) {
        int64_t t0, t1;
        tu_case_seq(c, n, &t0, &t1);
        for (int64_t j = 0; j < k->HV; j++) {
            int64_t i = j / G;
            for (int64_t r = 0; r < K; r++)
                for (int64_t col = 0; col < V; col++)
                    S[r * V + col] = c->h064 ? c->h064[state_at(c, n, j, r, col)] : 0.0;
            for (int64_t p = t0; p < t1; p++) {
                const double *qp = c->q64 + (p * k->H + i) * K, *kp = c->k64 + (p * k->H + i) * K;
                const double *vp = c->v64 + (p * k->HV + j) * V;
                double sq = 0, sk = 0;
                for (int64_t r = 0; r < K; r++) {
                    sq += qp[r] * qp[r];
                    sk += kp[r] * kp[r];
                }
                double nq = k->l2norm ? 1 / sqrt(sq + 1e-6) : 1, nk = k->l2norm ? 1 / sqrt(sk + 1e-6) : 1;
                for (int64_t r = 0; r < K; r++) {
                    qn[r] = qp[r] * nq * scale;
                    kn[r] = kp[r] * nk;
                }
                for (int64_t r = 0; r < K; r++) {
                    double gr = k->kind == GDN_GATE_KDA ? c->g64[(p * k->HV + j) * K + r] : c->g64[p * k->HV + j];
                    double d = exp(gr);
                    for (int64_t col = 0; col < V; col++)
                        S[r * V + col] *= d;
                }
                double b = c->beta64[p * k->HV + j];
                for (int64_t col = 0; col < V; col++) {
                    double kS = 0;
                    for (int64_t r = 0; r < K; r++)
                        kS += kn[r] * S[r * V + col];
                    u[col] = b * (vp[col] - kS);
                }
                for (int64_t r = 0; r < K; r++)
                    for (int64_t col = 0; col < V; col++)
                        S[r * V + col] += kn[r] * u[col];
                for (int64_t col = 0; col < V; col++) {
                    double acc = 0;
                    for (int64_t r = 0; r < K; r++)
                        acc += qn[r] * S[r * V + col];
                    o[(p * k->HV + j) * V + col] = acc;
                }
                if (steps)
                    for (int64_t r = 0; r < K; r++)
                        for (int64_t col = 0; col < V; col++)
                            steps[state_at(c, p, j, r, col)] = S[r * V + col];
            }
            for (int64_t r = 0; r < K; r++)
                for (int64_t col = 0; col < V; col++)
                    ht[state_at(c, n, j, r, col)] = S[r * V + col];
        }
    }
    free(S);
    free(qn);
    free(kn);
    free(u);
}

/* ------------------------------------------------------------------------------------------ */
/* gdn_recurrent_fwd with a state pool                                                         */

/* A slot the pool may read or write. */
static int pool_usable(const tu_pool_spec *s, int32_t slot)
{
    return slot >= (s->null_slot_zero ? 1 : 0) && slot < s->P;
}

/* The slot sequence n starts from, or -1 if the sequence is skipped. */
static int pool_start_slot(const tu_pool_spec *s, int n)
{
    int32_t slot;
    if (s->rank2 && s->use_nat) {
        if (s->nat[n] < 1 || s->nat[n] > s->cols)
            return -1;
        slot = s->idx[n][s->nat[n] - 1];
    } else {
        slot = s->idx[n][0];
    }
    return pool_usable(s, slot) ? slot : -1;
}

static size_t count_nonzero(const void *p, gdn_dtype dtype, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += tu_get(p, dtype, i) != 0.0;
    return c;
}

void tu_pool_run(const tu_pool_spec *s, const tu_case_config *base, uint64_t seed, tu_recurrent_fn run,
                 double tol_o, double tol_state)
{
    tu_case_config cfg = *base;
    cfg.B = s->N;
    cfg.T = s->T;
    if (s->varlen) {
        cfg.nseq = s->N;
        memcpy(cfg.seqlens, s->lens, (size_t)s->N * sizeof(int32_t));
    }
    cfg.state_dtype = s->state_dtype;
    cfg.layout = s->layout;
    cfg.initial_state = 1;
    cfg.seed = seed;
    tu_case c;
    tu_case_init(&c, &cfg);

    gdn_dtype sd = s->state_dtype;
    size_t esz = gdn_dtype_size(sd);
    int64_t slot_elems = cfg.HV * cfg.K * cfg.V, slot_stride = slot_elems + s->pad;
    size_t pool_bytes = (size_t)(s->P * slot_stride) * esz;

    /* Pool: random values everywhere (padding included), then each live sequence's start state
     * copied from the case's initial state, so the naive reference starts from the same values. */
    unsigned char *pool = tu_alloc(pool_bytes);
    {
        tu_rng r = tu_rng_make(seed ^ 0xabcdef);
        for (int64_t i = 0; i < s->P * slot_stride; i++)
            tu_set(pool, sd, (size_t)i, 0.5 * tu_rng_normal(&r));
    }
    int start[TU_POOL_MAXN];
    for (int n = 0; n < s->N; n++) {
        start[n] = pool_start_slot(s, n);
        if (s->chunk && s->use_has && !s->has[n]) { /* a new request: the reference starts from zeros */
            for (int64_t i = 0; i < slot_elems; i++) {
                tu_set(c.h0, sd, (size_t)(n * slot_elems + i), 0.0);
                c.h064[n * slot_elems + i] = 0.0;
            }
            continue;
        }
        if (start[n] >= 0)
            memcpy(pool + (size_t)(start[n] * slot_stride) * esz, (char *)c.h0 + (size_t)(n * slot_elems) * esz,
                   (size_t)slot_elems * esz);
    }
    unsigned char *before = tu_snapshot(pool, pool_bytes);

    int64_t ntok = c.c.B * c.c.T, tok_o = cfg.HV * cfg.V; /* packed tokens; o elements per token */
    size_t n_o = (size_t)(ntok * tok_o), n_steps = (size_t)(ntok * slot_elems);
    double *o_ref = tu_alloc(n_o * sizeof(double)), *ht_ref = tu_alloc((size_t)c.state_numel * sizeof(double));
    double *steps_ref = tu_alloc(n_steps * sizeof(double));
    tu_case_naive(&c, o_ref, ht_ref, steps_ref);

    void *steps = tu_alloc_elems(sd, n_steps);
    tu_poison(steps, sd, n_steps);
    tu_case_poison(&c);

    int32_t idx_flat[TU_POOL_MAXN * TU_POOL_MAXT], nat[TU_POOL_MAXN];
    int cols = s->rank2 ? s->cols : 1;
    for (int n = 0; n < s->N; n++) {
        for (int t = 0; t < cols; t++)
            idx_flat[n * cols + t] = s->idx[n][t];
        nat[n] = s->nat[n];
    }
    int64_t pool_shape[4] = {s->P, cfg.HV, s->layout == GDN_STATE_VK ? cfg.V : cfg.K,
                             s->layout == GDN_STATE_VK ? cfg.K : cfg.V};
    int64_t pool_stride[4] = {slot_stride, pool_shape[2] * pool_shape[3], pool_shape[3], 1};

    gdn_recurrent_fwd_args a = tu_case_recurrent_args(&c);
    a.state = tu_tensor_strided(pool, sd, 4, pool_shape, pool_stride);
    a.state_indices =
        s->rank2 ? TU_TENSOR(idx_flat, GDN_DTYPE_I32, s->N, cols) : TU_TENSOR(idx_flat, GDN_DTYPE_I32, s->N);
    if (s->use_nat)
        a.num_accepted_tokens = TU_TENSOR(nat, GDN_DTYPE_I32, s->N);
    a.inplace_state = s->inplace;
    a.null_slot_zero = s->null_slot_zero;
    if (!s->with_final)
        memset(&a.final_state, 0, sizeof a.final_state);
    if (s->with_steps)
        a.step_states = tu_case_state(&c, steps, sd, ntok);

    gdn_status st;
    int32_t has[TU_POOL_MAXN], ck[TU_POOL_MAXN * TU_POOL_MAXC];
    if (s->chunk) {
        gdn_chunk_fwd_args ca = tu_chunk_args(&a);
        ca.state_indices = a.state_indices;
        ca.null_slot_zero = s->null_slot_zero;
        memset(&ca.final_state, 0, sizeof ca.final_state);
        if (s->use_has) {
            memcpy(has, s->has, sizeof has);
            ca.has_initial_state = TU_TENSOR(has, GDN_DTYPE_I32, s->N);
        }
        if (s->M > 0) {
            for (int n = 0; n < s->N; n++)
                for (int j = 0; j < s->ck_cols; j++)
                    ck[n * s->ck_cols + j] = s->ck[n][j];
            ca.checkpoint_interval = s->M;
            ca.checkpoint_indices = TU_TENSOR(ck, GDN_DTYPE_I32, s->N, s->ck_cols);
        }
        st = s->run_chunk ? s->run_chunk(ca) : tu_chunk_fwd(&ca);
    } else {
        st = run ? run(a) : tu_recurrent_fwd(&a);
    }
    if (!tu_expect(st == GDN_OK, "%s: %s (%s)", s->label, gdn_status_string(st), gdn_last_error()))
        goto done;

    /* Which slot receives which reference state. */
    const double *expect[TU_POOL_MAXP] = {0};
    for (int n = 0; n < s->N; n++) {
        if (start[n] < 0 || !s->inplace)
            continue;
        int64_t p0, p1;
        tu_case_seq(&c, n, &p0, &p1);
        for (int j = 0; s->chunk && s->M > 0 && j < s->ck_cols && (j + 1) * s->M <= p1 - p0; j++)
            if (pool_usable(s, s->ck[n][j]))
                expect[s->ck[n][j]] = steps_ref + (size_t)((p0 + (j + 1) * s->M - 1) * slot_elems);
        if (!s->rank2) {
            expect[start[n]] = ht_ref + (size_t)(n * slot_elems);
        } else {
            for (int64_t t = 0; t < p1 - p0; t++)
                if (pool_usable(s, s->idx[n][t]))
                    expect[s->idx[n][t]] = steps_ref + (size_t)((p0 + t) * slot_elems);
        }
    }
    char what[160];
    for (int p = 0; p < s->P; p++) {
        unsigned char *slot = pool + (size_t)(p * slot_stride) * esz, *old = before + (size_t)(p * slot_stride) * esz;
        if (expect[p]) {
            snprintf(what, sizeof what, "%s pool slot %d", s->label, p);
            tu_check(what, tu_compare(slot, sd, expect[p], GDN_DTYPE_F64, (size_t)slot_elems), tol_state);
            tu_expect(tu_same_bytes(slot + (size_t)slot_elems * esz, old + (size_t)slot_elems * esz,
                                    (size_t)s->pad * esz),
                      "%s: padding after pool slot %d was written", s->label, p);
        } else {
            tu_expect(tu_same_bytes(slot, old, (size_t)slot_stride * esz), "%s: pool slot %d should be untouched",
                      s->label, p);
        }
    }
    for (int n = 0; n < s->N; n++) {
        int64_t p0, p1;
        tu_case_seq(&c, n, &p0, &p1);
        size_t per_seq_o = (size_t)((p1 - p0) * tok_o), per_seq_steps = (size_t)((p1 - p0) * slot_elems);
        void *o_n = (char *)c.o + (size_t)(p0 * tok_o) * gdn_dtype_size(cfg.dtype);
        void *ht_n = (char *)c.ht + (size_t)(n * slot_elems) * esz;
        void *steps_n = (char *)steps + (size_t)(p0 * slot_elems) * esz;
        if (start[n] < 0) {
            tu_expect(count_nonzero(o_n, cfg.dtype, per_seq_o) == 0, "%s: skipped sequence %d: o not zeroed",
                      s->label, n);
            if (s->with_final)
                tu_expect(count_nonzero(ht_n, sd, (size_t)slot_elems) == 0,
                          "%s: skipped sequence %d: final_state not zeroed", s->label, n);
            if (s->with_steps)
                tu_expect(count_nonzero(steps_n, sd, per_seq_steps) == 0,
                          "%s: skipped sequence %d: step_states not zeroed", s->label, n);
            continue;
        }
        snprintf(what, sizeof what, "%s o seq %d", s->label, n);
        tu_check(what, tu_compare(o_n, cfg.dtype, o_ref + p0 * tok_o, GDN_DTYPE_F64, per_seq_o), tol_o);
        if (s->with_final) {
            snprintf(what, sizeof what, "%s final_state seq %d", s->label, n);
            tu_check(what, tu_compare(ht_n, sd, ht_ref + (size_t)(n * slot_elems), GDN_DTYPE_F64, (size_t)slot_elems),
                     tol_state);
        }
        if (s->with_steps) {
            snprintf(what, sizeof what, "%s step_states seq %d", s->label, n);
            tu_check(what, tu_compare(steps_n, sd, steps_ref + p0 * slot_elems, GDN_DTYPE_F64, per_seq_steps),
                     tol_state);
        }
    }
done:
    free(pool);
    free(before);
    free(o_ref);
    free(ht_ref);
    free(steps_ref);
    free(steps);
    tu_case_free(&c);
}

/* The chunk-op pool specs: gdn_chunk_fwd reading and writing the pool: start slots, has_initial_state (a new request
 * starts from zeros whatever its slot holds), skipped sequences (checkpoint slots of a skipped
 * sequence stay untouched too), checkpoints every M tokens with a skipped column, varlen with an
 * empty sequence and a sequence shorter than M, null_slot_zero, both layouts, a bf16 pool. */
void tu_chunk_pool_specs(int variant, tu_pool_spec *s)
{
    memset(s, 0, sizeof *s);
    s->chunk = 1;
    s->inplace = 1;
    s->P = 12;
    s->pad = 24;
    s->N = 4;
    switch (variant) {
    case 0:
        s->label = "chunk pool KV f32, has_initial_state, checkpoints M=64";
        s->T = 150;
        s->idx[0][0] = 5, s->idx[1][0] = 2, s->idx[2][0] = -1, s->idx[3][0] = 0;
        s->use_has = 1;
        s->has[0] = 1, s->has[1] = 0, s->has[2] = 1, s->has[3] = 1;
        s->M = 64;
        s->ck_cols = 3; /* 150 tokens: two checkpoints due, the third column unused */
        s->ck[0][0] = 6, s->ck[0][1] = -1, s->ck[0][2] = 11;
        s->ck[1][0] = 3, s->ck[1][1] = 4, s->ck[1][2] = 10;
        s->ck[2][0] = 8, s->ck[2][1] = 9; /* skipped sequence: untouched */
        s->ck[3][0] = 1, s->ck[3][1] = 7;
        s->layout = GDN_STATE_KV;
        s->state_dtype = GDN_DTYPE_F32;
        break;
    case 1:
        s->label = "chunk pool VK bf16 varlen, null_slot_zero, checkpoints M=128";
        s->varlen = 1;
        s->lens[0] = 0, s->lens[1] = 130, s->lens[2] = 300, s->lens[3] = 64;
        s->idx[0][0] = 3, s->idx[1][0] = 0, s->idx[2][0] = 7, s->idx[3][0] = 9;
        s->null_slot_zero = 1; /* sequence 1 (slot 0) is skipped */
        s->use_has = 1;
        s->has[0] = 1, s->has[1] = 1, s->has[2] = 1, s->has[3] = 0;
        s->M = 128;
        s->ck_cols = 2;
        s->ck[0][0] = 1;               /* empty sequence: no checkpoint */
        s->ck[1][0] = 2;               /* skipped */
        s->ck[2][0] = 4, s->ck[2][1] = 5;
        s->ck[3][0] = 6;               /* 64 tokens < M */
        s->layout = GDN_STATE_VK;
        s->state_dtype = GDN_DTYPE_BF16;
        break;
    default:
        s->label = "chunk pool VK f32, no options";
        s->T = 70;
        s->idx[0][0] = 11, s->idx[1][0] = 4, s->idx[2][0] = 0, s->idx[3][0] = 8;
        s->layout = GDN_STATE_VK;
        s->state_dtype = GDN_DTYPE_F32;
        break;
    }
}

/* Log decays that push the kernels to their limits (decode's running decay scale, prefill's floor
 * on g): per value head, hv % 4 == 0 cycles through g = -inf (exp(g) = 0), -60, -15, -3, -0.5,
 * -1e-4 and 0; 1 and 2 hold g = -3 and -1.5 for every token (the product of the decays leaves
 * [2^-20, 1] after 5 and 10 tokens); 3 keeps the drawn logsigmoid gates. KDA: the same per key
 * channel r, the cycle shifted by r and holding -1e4 as well, so that every token mixes keys
 * that are wiped, kept whole and in between. */
void tu_case_set_extreme_gates(tu_case *c)
{
    static const double cyc[] = {-INFINITY, -60.0, -15.0, -3.0, -0.5, -1e-4, 0.0};
    static const double cyc_kda[] = {-INFINITY, -1e4, -60.0, -15.0, -3.0, -0.5, -1e-4, 0.0};
    const tu_case_config *k = &c->c;
    const int64_t nr = k->kind == GDN_GATE_KDA ? k->K : 1;
    for (int64_t i = 0; i < k->B * k->T * k->HV * nr; i++) {
        const int64_t r = i % nr, hv = (i / nr) % k->HV, tok = i / (nr * k->HV);
        double g = c->g64[i];
        if (hv % 4 == 0)
            g = nr > 1 ? cyc_kda[(tok + hv / 4 + r) % 8] : cyc[(tok + hv / 4) % 7];
        else if (hv % 4 == 1)
            g = -3.0;
        else if (hv % 4 == 2)
            g = -1.5;
        c->g64[i] = g;
        c->g[i] = (float)g;
    }
}

void tu_case_set_zero_gates(tu_case *c, int64_t t0, int64_t t1)
{
    const tu_case_config *k = &c->c;
    const int64_t per_tok = k->HV * (k->kind == GDN_GATE_KDA ? k->K : 1);
    for (int64_t i = 0; i < k->B * k->T * per_tok; i++) {
        const int64_t tok = i / per_tok % k->T;
        if (tok >= t0 && tok < t1)
            c->g64[i] = 0.0, c->g[i] = 0.0f;
    }
}
