/*
 * cpu_recurrent.c - the reference recurrence of GDN_MATH.md on the CPU, with the state pool.
 * It runs for f64 inputs (the oracle); f32 / bf16 / f16 inputs take the f32 recurrence of
 * cpu_recurrent_f32.c, which the tests check against this one. The pool rules (start slot,
 * skipped sequences) live here for both.
 *
 * One work item per (sequence n, value head j); the state S (K x V) lives in a double scratch
 * matrix for the whole sequence, so nothing is rounded between tokens: every load widens to
 * double and every store (o, final_state, per-step states, pool writes) rounds once to its
 * dtype. With f64 tensors nothing is rounded at all: this is the float64 oracle of the tests.
 * Per token:
 *
 *     S <- exp(g) * S              (KDA: row r times exp(g[r]))
 *     u <- beta * (v - S^T k)
 *     S <- S + k u^T
 *     o <- S^T (scale * q)
 *
 * Slots (recurrent only): with state_indices the start state is slot
 * idx[n, num_accepted[n] - 1] (or idx[n, 0]); a negative start slot (or 0 with null_slot_zero)
 * or num_accepted outside [1, idx_cols] skips the sequence: nothing is read or written in the
 * pool and its o / final_state / step_states rows are zeroed. Pool writes: 1-D indices
 * (idx_cols == 1) write the final state to the start slot; 2-D indices write the state after
 * token t to idx[n, t], skipping invalid slots (negative, or 0 with null_slot_zero, as gdn.h says).
 */
#include <stdlib.h>

#include "cpu_common.h"

typedef struct rec_ctx {
    const gdn_problem *p;
    double *scratch;   /* per thread: S [K][V], q [K], k [K], g [K], u [V], o [V] */
    int64_t per_thread;
    int exact;         /* f64 problem: keep in-kernel gates in double */
} rec_ctx;

int gdn_cpu_slot_valid(const gdn_problem *p, int64_t slot) { return p->null_slot_zero ? slot > 0 : slot >= 0; }

static void store_state(const gdn_problem *p, const gdn_view *dst, int64_t slot, int64_t hv, const double *S)
{
    for (int64_t r = 0; r < p->K; r++)
        gdn_st_vec(dst->data, p->state_dtype, gdn_state_off(dst, slot, hv, r, 0), dst->s[3], p->V, S + r * p->V);
}

static void zero_state(const gdn_problem *p, const gdn_view *dst, int64_t slot, int64_t hv)
{
    for (int64_t r = 0; r < p->K; r++)
        for (int64_t c = 0; c < p->V; c++)
            gdn_st(dst->data, p->state_dtype, gdn_state_off(dst, slot, hv, r, c), 0.0);
}

/* Loads q or k of one token and head as double, l2-normalised when asked, times `mul`. */
static void load_qk(const gdn_problem *p, const gdn_view *x, int64_t b, int64_t t, int64_t h, double mul, double *out)
{
    gdn_ld_vec(x->data, x->dtype, gdn_tok_off(x, b, t, h, 0), x->s[3], p->K, out);
    double ss = 0.0;
    for (int64_t r = 0; r < p->K; r++)
        ss += out[r] * out[r];
    if (p->use_qk_l2norm)
        mul /= sqrt(ss + 1e-6);
    for (int64_t r = 0; r < p->K; r++)
        out[r] *= mul;
}

void gdn_cpu_skip_sequence(const gdn_problem *p, int64_t n, int64_t hv, int64_t b, int64_t bos, int64_t len)
{
    for (int64_t t = bos; t < bos + len; t++) {
        for (int64_t c = 0; c < p->V; c++)
            gdn_st(p->o.data, p->o.dtype, gdn_tok_off(&p->o, b, t, hv, c), 0.0);
        if (p->step_states.data)
            zero_state(p, &p->step_states, b * p->T + t, hv);
    }
    if (p->final_state.data)
        zero_state(p, &p->final_state, n, hv);
}

int gdn_cpu_reads_state(const gdn_problem *p, int64_t n)
{
    return p->state_in.data && (!p->has_initial_state || p->has_initial_state[n * p->has_init_stride] != 0);
}

int64_t gdn_cpu_checkpoint_slot(const gdn_problem *p, int64_t n, int64_t tokens)
{
    const int64_t M = p->checkpoint_interval;
    if (M <= 0 || tokens % M != 0 || tokens / M > p->ckpt_cols)
        return -1;
    const int64_t slot = p->checkpoint_indices[n * p->ckpt_stride_n + (tokens / M - 1) * p->ckpt_stride_j];
    return gdn_cpu_slot_valid(p, slot) ? slot : -1;
}

int gdn_cpu_start_slot(const gdn_problem *p, int64_t n, int64_t *slot)
{
    *slot = n;
    if (!p->state_indices)
        return 1;
    const int32_t *idx_row = p->state_indices + n * p->idx_stride_n;
    int64_t col = 0;
    if (p->num_accepted_tokens) {
        int64_t acc = p->num_accepted_tokens[n];
        if (acc < 1 || acc > p->idx_cols)
            return 0;
        col = acc - 1;
    }
    *slot = idx_row[col * p->idx_stride_t];
    return gdn_cpu_slot_valid(p, *slot);
}

static void recurrent_item(void *ctxp, int64_t item, int thread)
{
    const rec_ctx *ctx = (const rec_ctx *)ctxp;
    const gdn_problem *p = ctx->p;
    const int64_t K = p->K, V = p->V;
    const int64_t n = item / p->HV, hv = item % p->HV, h = hv / p->G;
    const int kda = p->gate_kind == GDN_GATE_KDA;
    int64_t b, bos, len;
    gdn_seq_bounds(p, n, &b, &bos, &len);

    /* Where the state comes from: slot of the pool, or row n of state_in. */
    int64_t slot;
    if (!gdn_cpu_start_slot(p, n, &slot)) {
        gdn_cpu_skip_sequence(p, n, hv, b, bos, len);
        return;
    }
    const int32_t *idx_row = p->state_indices ? p->state_indices + n * p->idx_stride_n : NULL;

    double *S = ctx->scratch + (int64_t)thread * ctx->per_thread;
    double *q = S + K * V, *k = q + K, *g = k + K, *u = g + K, *o = u + V;

    if (gdn_cpu_reads_state(p, n)) {
        for (int64_t r = 0; r < K; r++)
            gdn_ld_vec(p->state_in.data, p->state_dtype, gdn_state_off(&p->state_in, slot, hv, r, 0), p->state_in.s[3],
                       V, S + r * V);
    } else {
        memset(S, 0, (size_t)(K * V) * sizeof *S);
    }

    const int per_step_pool = p->state_indices && p->inplace_state && p->idx_cols > 1;
    for (int64_t i = 0; i < len; i++) {
        const int64_t t = bos + i;
        load_qk(p, &p->q, b, t, h, p->scale, q);
        load_qk(p, &p->k, b, t, h, 1.0, k);
        gdn_load_gate(p, b, t, hv, ctx->exact, g);
        const double beta = gdn_load_beta(p, b, t, hv, ctx->exact);

        /* Decay, then u = v - S^T k (accumulated in u over the rows of S). */
        gdn_ld_vec(p->v.data, p->v.dtype, gdn_tok_off(&p->v, b, t, hv, 0), p->v.s[3], V, u);
        const double eg = exp(g[0]);
        for (int64_t r = 0; r < K; r++) {
            const double d = kda ? exp(g[r]) : eg, kr = k[r];
            double *Sr = S + r * V;
            for (int64_t c = 0; c < V; c++) {
                Sr[c] *= d;
                u[c] -= kr * Sr[c];
            }
        }
        for (int64_t c = 0; c < V; c++) {
            u[c] *= beta;
            o[c] = 0.0;
        }
        /* S += k u^T, then o = S^T q (q carries the scale). */
        for (int64_t r = 0; r < K; r++) {
            const double kr = k[r], qr = q[r];
            double *Sr = S + r * V;
            for (int64_t c = 0; c < V; c++) {
                Sr[c] += kr * u[c];
                o[c] += qr * Sr[c];
            }
        }
        gdn_st_vec(p->o.data, p->o.dtype, gdn_tok_off(&p->o, b, t, hv, 0), p->o.s[3], V, o);

        if (p->step_states.data)
            store_state(p, &p->step_states, b * p->T + t, hv, S);
        if (per_step_pool && i < p->idx_cols) {
            int64_t dst = idx_row[i * p->idx_stride_t];
            if (gdn_cpu_slot_valid(p, dst))
                store_state(p, &p->state_in, dst, hv, S);
        }
        const int64_t ckpt = gdn_cpu_checkpoint_slot(p, n, i + 1);
        if (ckpt >= 0)
            store_state(p, &p->state_in, ckpt, hv, S);
    }

    if (p->final_state.data)
        store_state(p, &p->final_state, n, hv, S);
    if (p->state_indices && p->inplace_state && !per_step_pool)
        store_state(p, &p->state_in, slot, hv, S);
}

/* The CPU's limits, for the chunk op as well: any head dims up to GDN_CPU_MAX_HEAD_DIM, every gate,
 * dtype and state option of the API. */
gdn_status gdn_cpu_recurrent_fwd_check(const gdn_problem *p)
{
    if (p->K < 1 || p->K > GDN_CPU_MAX_HEAD_DIM || p->V < 1 || p->V > GDN_CPU_MAX_HEAD_DIM)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "head dims K = %lld, V = %lld: the CPU backend takes each in 1 .. %d",
                             (long long)p->K, (long long)p->V, GDN_CPU_MAX_HEAD_DIM);
    return GDN_OK;
}

gdn_status gdn_cpu_chunk_fwd_check(const gdn_problem *p) { return gdn_cpu_recurrent_fwd_check(p); }

/* The reference's scratch per thread, in doubles (rounded to 64 bytes), and its thread count. */
static int ref_plan(const gdn_problem *p, int64_t *per_thread)
{
    *per_thread = (p->K * p->V + 3 * p->K + 2 * p->V + 7) / 8 * 8;
    const double flops = 6.0 * (double)(p->B * p->T) * (double)(p->HV * p->K * p->V);
    return gdn_cpu_threads_for(p->N * p->HV, flops);
}

size_t gdn_cpu_recurrent_fwd_workspace(const gdn_problem *p, int least)
{
    if (p->q.dtype != GDN_DTYPE_F64)
        return gdn_cpu_recurrent_f32_workspace(p, least);
    if (p->N * p->HV == 0)
        return 0;
    int64_t per_thread;
    const int threads = ref_plan(p, &per_thread);
    return (size_t)(least ? 1 : threads) * (size_t)per_thread * sizeof(double);
}

gdn_status gdn_cpu_recurrent_fwd(const gdn_problem *p)
{
    if (p->q.dtype != GDN_DTYPE_F64)
        return gdn_cpu_recurrent_f32(p);
    const int64_t items = p->N * p->HV;
    if (items == 0)
        return GDN_OK;
    rec_ctx ctx;
    ctx.p = p;
    ctx.exact = p->q.dtype == GDN_DTYPE_F64;
    int threads = ref_plan(p, &ctx.per_thread);
    /* As many threads as the caller's workspace covers (the API checked it covers one). */
    const size_t per_thread_bytes = (size_t)ctx.per_thread * sizeof(double);
    if ((size_t)threads * per_thread_bytes > p->workspace_bytes)
        threads = (int)(p->workspace_bytes / per_thread_bytes);
    ctx.scratch = (double *)p->workspace;
    gdn_cpu_parallel_for(threads, items, recurrent_item, &ctx);
    return GDN_OK;
}
