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

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t tu_f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* keep NaN a NaN (force a quiet mantissa bit) */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float tu_bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

uint16_t tu_f32_to_f16(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00u;
    if (a >= 0x477ff000u) /* >= 65520 rounds to Inf */
        return sign | 0x7c00u;
    if (a < 0x38800000u) {
        /* below the smallest normal 2^-14: count units of 2^-24 (exact scaling), round to even
         * with the default rounding mode; 0x400 correctly becomes the smallest normal */
        float m = f32_from_bits(a) * 16777216.0f;
        return sign | (uint16_t)nearbyintf(m);
    }
    uint32_t mant = a & 0x7fffffu;
    uint32_t h = ((((a >> 23) - 127u + 15u)) << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the right answer */
    return sign | (uint16_t)h;
}

float tu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (e == 31)
        return f32_from_bits(sign | 0x7f800000u | (m << 13));
    return f32_from_bits(sign | ((e - 15u + 127u) << 23) | (m << 13));
}

float tu_round(gdn_dtype dtype, float x)
{
    switch (dtype) {
    case GDN_DTYPE_BF16: return tu_bf16_to_f32(tu_f32_to_bf16(x));
    case GDN_DTYPE_F16: return tu_f16_to_f32(tu_f32_to_f16(x));
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
    case GDN_DTYPE_BF16: return tu_bf16_to_f32(((const uint16_t *)p)[i]);
    case GDN_DTYPE_F16: return tu_f16_to_f32(((const uint16_t *)p)[i]);
    case GDN_DTYPE_I32: return ((const int32_t *)p)[i];
    case GDN_DTYPE_F64: return ((const double *)p)[i];
    }
    return NAN;
}

void tu_set(void *p, gdn_dtype dtype, size_t i, double x)
{
    switch (dtype) {
    case GDN_DTYPE_F32: ((float *)p)[i] = (float)x; break;
    case GDN_DTYPE_BF16: ((uint16_t *)p)[i] = tu_f32_to_bf16((float)x); break;
    case GDN_DTYPE_F16: ((uint16_t *)p)[i] = tu_f32_to_f16((float)x); break;
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
            passed++;
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
        printf("(%d skipped, counted as passed)\n", skipped);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
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
