/*
 * cpu_common.h - helpers shared by the CPU backend (the files of src/cpu): element loads and stores for
 * every dtype, the gate formulas, sequence bounds, and the thread pool interface.
 *
 * Loads widen to double; stores round once from double to the destination dtype (bf16 and f16
 * with round-to-nearest-even, through an f32 rounded to odd so that the double rounding is exact).
 * Everything is plain C11: no compiler extensions, no half-precision types.
 */
#ifndef GDN_CPU_COMMON_H
#define GDN_CPU_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "convert.h"
#include "problem.h"

/* ------------------------------------------------------------------------------------------ */
/* Rounding double to bf16 / f16 (the f32 conversions themselves are in ../convert.h)          */

/* d rounded to f32 with round-to-odd: rounding that again to any format at least two bits
 * narrower (bf16, f16) gives the correctly rounded result of d. */
static inline float gdn_f64_to_f32_odd(double d)
{
    float f = (float)d;
    if ((double)f == d || d != d || isinf(f))
        return f;
    uint32_t u = gdn_f32_bits(f);
    if (fabs((double)f) > fabs(d))
        u -= 1; /* f was rounded away from zero: step back to the truncation */
    return gdn_f32_from_bits(u | 1u);
}

/* ------------------------------------------------------------------------------------------ */
/* Element access (i in elements, from a typed base pointer)                                   */

static inline double gdn_ld(const void *base, gdn_dtype dt, int64_t i)
{
    switch (dt) {
    case GDN_DTYPE_F32: return ((const float *)base)[i];
    case GDN_DTYPE_BF16: return gdn_bf16_to_f32_one(((const uint16_t *)base)[i]);
    case GDN_DTYPE_F16: return gdn_f16_to_f32_one(((const uint16_t *)base)[i]);
    case GDN_DTYPE_F64: return ((const double *)base)[i];
    case GDN_DTYPE_I32: return ((const int32_t *)base)[i];
    }
    return 0.0;
}

static inline void gdn_st(void *base, gdn_dtype dt, int64_t i, double x)
{
    switch (dt) {
    case GDN_DTYPE_F32: ((float *)base)[i] = (float)x; break;
    case GDN_DTYPE_BF16: ((uint16_t *)base)[i] = gdn_f32_to_bf16_one(gdn_f64_to_f32_odd(x)); break;
    case GDN_DTYPE_F16: ((uint16_t *)base)[i] = gdn_f32_to_f16_one(gdn_f64_to_f32_odd(x)); break;
    case GDN_DTYPE_F64: ((double *)base)[i] = x; break;
    case GDN_DTYPE_I32: ((int32_t *)base)[i] = (int32_t)x; break;
    }
}

/* Strided vectors: out[i] = element off + i * stride, the dtype switch taken once per vector. */
static inline void gdn_ld_vec(const void *base, gdn_dtype dt, int64_t off, int64_t stride, int64_t n, double *out)
{
    switch (dt) {
    case GDN_DTYPE_F32: {
        const float *x = (const float *)base + off;
        for (int64_t i = 0; i < n; i++)
            out[i] = x[i * stride];
        break;
    }
    case GDN_DTYPE_BF16: {
        const uint16_t *x = (const uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            out[i] = gdn_bf16_to_f32_one(x[i * stride]);
        break;
    }
    case GDN_DTYPE_F64: {
        const double *x = (const double *)base + off;
        for (int64_t i = 0; i < n; i++)
            out[i] = x[i * stride];
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++)
            out[i] = gdn_ld(base, dt, off + i * stride);
    }
}

static inline void gdn_ld_vec_f32(const void *base, gdn_dtype dt, int64_t off, int64_t stride, int64_t n, float *out)
{
    switch (dt) {
    case GDN_DTYPE_F32: {
        const float *x = (const float *)base + off;
        if (stride == 1)
            memcpy(out, x, (size_t)n * sizeof *out);
        else
            for (int64_t i = 0; i < n; i++)
                out[i] = x[i * stride];
        break;
    }
    case GDN_DTYPE_BF16: {
        const uint16_t *x = (const uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            out[i] = gdn_bf16_to_f32_one(x[i * stride]);
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++)
            out[i] = (float)gdn_ld(base, dt, off + i * stride);
    }
}

/* Element off + i * stride = in[i], rounded once to dt. */
static inline void gdn_st_vec(void *base, gdn_dtype dt, int64_t off, int64_t stride, int64_t n, const double *in)
{
    switch (dt) {
    case GDN_DTYPE_F32: {
        float *x = (float *)base + off;
        for (int64_t i = 0; i < n; i++)
            x[i * stride] = (float)in[i];
        break;
    }
    case GDN_DTYPE_F64: {
        double *x = (double *)base + off;
        for (int64_t i = 0; i < n; i++)
            x[i * stride] = in[i];
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++)
            gdn_st(base, dt, off + i * stride, in[i]);
    }
}

static inline void gdn_st_vec_f32(void *base, gdn_dtype dt, int64_t off, int64_t stride, int64_t n, const float *in)
{
    switch (dt) {
    case GDN_DTYPE_F32: {
        float *x = (float *)base + off;
        if (stride == 1)
            memcpy(x, in, (size_t)n * sizeof *x);
        else
            for (int64_t i = 0; i < n; i++)
                x[i * stride] = in[i];
        break;
    }
    case GDN_DTYPE_BF16: {
        uint16_t *x = (uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            x[i * stride] = gdn_f32_to_bf16_one(in[i]);
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++)
            gdn_st(base, dt, off + i * stride, in[i]);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Gates (GDN_MATH.md "Gating computed inside the kernel"), in double                          */

static inline double gdn_softplus(double x, double beta, double threshold)
{
    double bx = beta * x;
    if (bx > threshold)
        return x;
    /* log(1 + e^bx) written so that exp never overflows, whatever the threshold. */
    return (bx > 0.0 ? bx + log1p(exp(-bx)) : log1p(exp(bx))) / beta;
}

static inline double gdn_sigmoid(double x)
{
    /* Both branches exponentiate a non-positive number: no overflow for any x. */
    if (x >= 0.0)
        return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

/* Log decay from a raw gate value x = a (+ dt_bias already added). lower_bound applies to KDA. */
static inline double gdn_gate_from_raw(gdn_gate_kind kind, double x, double A_log, double lower_bound,
                                       double softplus_beta, double softplus_threshold)
{
    if (kind == GDN_GATE_KDA && lower_bound != 0.0)
        return lower_bound * gdn_sigmoid(exp(A_log) * x);
    return -exp(A_log) * gdn_softplus(x, softplus_beta, softplus_threshold);
}

static inline double gdn_beta_from_logit(double b, int allow_neg_eigval)
{
    double s = gdn_sigmoid(b);
    return allow_neg_eigval ? 2.0 * s : s;
}

/* ------------------------------------------------------------------------------------------ */
/* Problem helpers                                                                             */

/* Sequence n of p: batch row *b, first token *bos within that row, *len tokens. */
static inline void gdn_seq_bounds(const gdn_problem *p, int64_t n, int64_t *b, int64_t *bos, int64_t *len)
{
    if (p->cu_seqlens) {
        *b = 0;
        *bos = p->cu_seqlens[n];
        *len = (int64_t)p->cu_seqlens[n + 1] - p->cu_seqlens[n];
    } else {
        *b = n;
        *bos = 0;
        *len = p->T;
    }
}

/* Offset of element (b, t, h, d) of a token-major view. */
static inline int64_t gdn_tok_off(const gdn_view *x, int64_t b, int64_t t, int64_t h, int64_t d)
{
    return b * x->s[0] + t * x->s[1] + h * x->s[2] + d * x->s[3];
}

/* Log decays of token (b, t) and value head hv as doubles: g[0] for GDN, g[0..K) for KDA.
 * Computed from raw a when the problem carries a instead of g; `exact` keeps the computed
 * value in double (the f64 oracle), otherwise it is rounded to f32 exactly as gdn_gating stores
 * it, so that "gating op, then kernel with g" and "kernel with raw a" agree bit for bit. */
static inline void gdn_load_gate(const gdn_problem *p, int64_t b, int64_t t, int64_t hv, int exact, double *g)
{
    int64_t nr = p->gate_kind == GDN_GATE_KDA ? p->K : 1;
    if (p->g.data) {
        for (int64_t r = 0; r < nr; r++)
            g[r] = gdn_ld(p->g.data, p->g.dtype, gdn_tok_off(&p->g, b, t, hv, r));
        return;
    }
    double A_log = p->A_log[hv];
    for (int64_t r = 0; r < nr; r++) {
        double x = gdn_ld(p->a.data, p->a.dtype, gdn_tok_off(&p->a, b, t, hv, r));
        if (p->dt_bias.data)
            x += gdn_ld(p->dt_bias.data, p->dt_bias.dtype, hv * p->dt_bias.s[0] + r * p->dt_bias.s[1]);
        double gv = gdn_gate_from_raw(p->gate_kind, x, A_log, p->lower_bound, p->softplus_beta, p->softplus_threshold);
        g[r] = exact ? gv : (double)(float)gv;
    }
}

/* The f32 paths' gate loader: log decays of token (b, t), value head hv, as f32 (g[0] for GDN,
 * g[0 .. K) for KDA), as gdn_load_gate rounds them, straight from an f32 g tensor. */
static inline void gdn_load_gate_f32(const gdn_problem *p, int64_t b, int64_t t, int64_t hv, double *tmp, float *g)
{
    const int64_t nr = p->gate_kind == GDN_GATE_KDA ? p->K : 1;
    if (p->g.data && p->g.dtype == GDN_DTYPE_F32) {
        gdn_ld_vec_f32(p->g.data, p->g.dtype, gdn_tok_off(&p->g, b, t, hv, 0), p->g.s[3], nr, g);
        return;
    }
    gdn_load_gate(p, b, t, hv, 0, tmp);
    for (int64_t r = 0; r < nr; r++)
        g[r] = (float)tmp[r];
}

/* beta of token (b, t) and value head hv, from beta or from logits (rounded as gdn_load_gate). */
static inline double gdn_load_beta(const gdn_problem *p, int64_t b, int64_t t, int64_t hv, int exact)
{
    double x = gdn_ld(p->beta.data, p->beta.dtype, b * p->beta.s[0] + t * p->beta.s[1] + hv * p->beta.s[2]);
    if (!p->beta_from_logits)
        return x;
    double beta = gdn_beta_from_logit(x, p->allow_neg_eigval);
    return exact ? beta : (double)(float)beta;
}

/* sum x[r] y[r] over r < n (a multiple of 16) in double, in 16 partial sums: vector lanes once
 * inlined into a kernel, where one chain of additions would set the pace. */
static inline double gdn_dot_f32(const float *restrict x, const float *restrict y, int64_t n)
{
    double acc[16] = {0};
    for (int64_t r0 = 0; r0 < n; r0 += 16)
        for (int l = 0; l < 16; l++)
            acc[l] += (double)x[r0 + l] * y[r0 + l];
    double sum = 0.0;
    for (int l = 0; l < 16; l++)
        sum += acc[l];
    return sum;
}

/* q or k of one token, loaded as f32 into out[0 .. K), made what the kernels use: zeros up to np
 * (a multiple of 16), l2-normalised when the problem asks (norm summed in double), times mul. */
static inline void gdn_scale_qk_f32(const gdn_problem *p, double mul, float *out, int64_t np)
{
    for (int64_t r = p->K; r < np; r++)
        out[r] = 0.0f;
    if (p->use_qk_l2norm)
        mul /= sqrt(gdn_dot_f32(out, out, np) + 1e-6);
    for (int64_t r = 0; r < p->K; r++)
        out[r] = (float)(out[r] * mul);
}

/* q or k of token (b, t), key head h, loaded and scaled (gdn_scale_qk_f32) into out: the f32
 * paths' one loader. */
static inline void gdn_load_qk_f32(const gdn_problem *p, const gdn_view *x, int64_t b, int64_t t, int64_t h,
                                   double mul, float *out, int64_t np)
{
    gdn_ld_vec_f32(x->data, x->dtype, gdn_tok_off(x, b, t, h, 0), x->s[3], p->K, out);
    gdn_scale_qk_f32(p, mul, out, np);
}

/* A read prefetch hint (nothing where the compiler has none). */
#if defined(__GNUC__)
#define GDN_PREFETCH(addr) __builtin_prefetch(addr)
#else
#define GDN_PREFETCH(addr) ((void)(addr))
#endif

/* exp(x) in f32 for x <= 0, flushing below the normal range to zero without the underflow
 * path of expf (errno, slow). */
static inline float gdn_expf_nonpos(float x) { return x < -87.0f ? 0.0f : expf(x); }

/* y[i] = exp(x[i]) for x[i] <= 88 (x[i] < -87 gives 0), within 2 ulp: plain arithmetic that
 * vectorizes once inlined into a kernel, for the per-channel decays that would otherwise cost
 * one libm call each. exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln 2 / 2, exp(r) by
 * Cephes' expf polynomial. */
static inline void gdn_expf_vec(const float *x, float *y, int64_t count)
{
    for (int64_t i = 0; i < count; i++) {
        const float xi = x[i] < -87.0f ? -87.0f : x[i] > 88.0f ? 88.0f : x[i];
        const float fn = (xi * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to integer */
        const float r = (xi - fn * 0.693359375f) - fn * -2.12194440e-4f;
        float p = 1.9875691500e-4f;
        p = p * r + 1.3981999507e-3f;
        p = p * r + 8.3334519073e-3f;
        p = p * r + 4.1665795894e-2f;
        p = p * r + 1.6666665459e-1f;
        p = p * r + 5.0000001201e-1f;
        p = p * r * r + r + 1.0f;
        const uint32_t bits = (uint32_t)((int32_t)fn + 127) << 23;
        y[i] = x[i] < -87.0f ? 0.0f : p * gdn_f32_from_bits(bits);
    }
}

/* Offset of state element (row r of K, column c of V) of (slot, hv) in a state view. */
static inline int64_t gdn_state_off(const gdn_view *s, int64_t slot, int64_t hv, int64_t r, int64_t c)
{
    return slot * s->s[0] + hv * s->s[1] + r * s->s[2] + c * s->s[3];
}

/* Largest head dims the CPU backend handles (scratch is sized from the actual K and V). */
#define GDN_CPU_MAX_HEAD_DIM 256

/* ------------------------------------------------------------------------------------------ */
/* State pool rules (cpu_recurrent.c), shared by the reference and the f32 recurrence           */

/* Is `slot` a usable pool slot under the null-slot rules? */
int gdn_cpu_slot_valid(const gdn_problem *p, int64_t slot);
/* The slot (or state row) sequence n starts from; 0 when the sequence is skipped (invalid start
 * slot, or num_accepted_tokens[n] outside [1, idx_cols]). */
int gdn_cpu_start_slot(const gdn_problem *p, int64_t n, int64_t *slot);
/* Zeroes every output row (o, step_states, final_state) of skipped sequence n for value head hv. */
void gdn_cpu_skip_sequence(const gdn_problem *p, int64_t n, int64_t hv, int64_t b, int64_t bos, int64_t len);
/* Whether sequence n starts from state_in (present, and has_initial_state[n] != 0 where given). */
int gdn_cpu_reads_state(const gdn_problem *p, int64_t n);
/* The chunk op's checkpoint after the first `tokens` tokens of sequence n: its pool slot, or -1
 * when none is due there (not a multiple of the interval, past the last column, invalid slot). */
int64_t gdn_cpu_checkpoint_slot(const gdn_problem *p, int64_t n, int64_t tokens);

/* The f32 recurrence for f32 / bf16 / f16 inputs (cpu_recurrent_f32.c), and its workspace. */
gdn_status gdn_cpu_recurrent_f32(const gdn_problem *p);
size_t gdn_cpu_recurrent_f32_workspace(const gdn_problem *p, int least);

/* ------------------------------------------------------------------------------------------ */
/* Threads (cpu_threads.c)                                                                     */

/* fn(ctx, item, thread) for every item in [0, items); thread in [0, threads) names the calling
 * thread's scratch. Items are handed out dynamically, so uneven items balance. */
typedef void (*gdn_cpu_task_fn)(void *ctx, int64_t item, int thread);

/* Threads worth using for `items` independent items costing `flops` in total (>= 1). */
int gdn_cpu_threads_for(int64_t items, double flops);
/* Runs fn over all items on up to `threads` threads (the caller is thread 0) and returns when
 * all are done. If a thread cannot be created, the others do its share. */
void gdn_cpu_parallel_for(int threads, int64_t items, gdn_cpu_task_fn fn, void *ctx);

#endif /* GDN_CPU_COMMON_H */
