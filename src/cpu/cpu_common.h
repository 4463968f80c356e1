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

/* beta of token (b, t) and value head hv, from beta or from logits (rounded as gdn_load_gate). */
static inline double gdn_load_beta(const gdn_problem *p, int64_t b, int64_t t, int64_t hv, int exact)
{
    double x = gdn_ld(p->beta.data, p->beta.dtype, b * p->beta.s[0] + t * p->beta.s[1] + hv * p->beta.s[2]);
    if (!p->beta_from_logits)
        return x;
    double beta = gdn_beta_from_logit(x, p->allow_neg_eigval);
    return exact ? beta : (double)(float)beta;
}

/* Offset of state element (row r of K, column c of V) of (slot, hv) in a state view. */
static inline int64_t gdn_state_off(const gdn_view *s, int64_t slot, int64_t hv, int64_t r, int64_t c)
{
    return slot * s->s[0] + hv * s->s[1] + r * s->s[2] + c * s->s[3];
}

/* Largest head dims the CPU backend handles (scratch is sized from the actual K and V). */
#define GDN_CPU_MAX_HEAD_DIM 256

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
