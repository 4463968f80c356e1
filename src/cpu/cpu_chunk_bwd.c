/*
 * cpu_chunk_bwd.c - the backward of the chunked forward on the CPU: reverse mode through the
 * recurrence of GDN_MATH.md, token by token, in double. With f64 tensors nothing is rounded: this
 * is the float64 oracle the fast backends are checked against. Other dtypes widen on load and
 * round once on store.
 *
 * One work item per (sequence n, key head h): its G value heads share q and k, so dq and dk
 * (summed over the group, GVA) are complete within the item and need no atomics. Per item:
 *
 *   1. for each value head, run the recurrence forward and keep the state before every chunk of
 *      CKPT tokens (the checkpoints);
 *   2. walk the chunks from last to first; in each, for each value head, recompute the states
 *      after every token of the chunk from its checkpoint, then walk the tokens in reverse with
 *      the adjoint state dS (dL/dS after the token; dht, or zero, after the last token):
 *
 *        forward:   Sd = e^g S_prev,  r = v - Sd^T k,  u = beta r,  S = Sd + k u^T,  o = S^T q~
 *        backward:  dq~ = S do,       dS += q~ do^T,   du = dS^T k, dk += dS u,
 *                   dbeta = du . r,   dv = beta du,
 *                   dSd = dS - beta k du^T,  dk -= beta Sd du,  dg = <dSd, Sd>,  dS_prev = e^g dSd
 *
 *      (q~ = scale q, q and k l2-normalised when asked); then take dq and dk of the chunk's
 *      tokens through the normalisation and store them;
 *   3. dh0 = the adjoint state before the first token.
 *
 * In-kernel gates chain through g = -exp(A_log) softplus(a + dt_bias) and beta = s sigmoid(b);
 * dA_log and ddt_bias are summed per (sequence, value head) into the workspace and reduced over
 * the sequences in order after the items (deterministic). All scratch comes from the caller's
 * workspace (gdn.h documents its size).
 */
#include "cpu_common.h"

#define CKPT 64 /* tokens between state checkpoints */

typedef struct bwd_ctx {
    const gdn_bwd_problem *bp;
    unsigned char *scratch;
    size_t per_thread;
    double *partials; /* [N][HV][2]: dA_log, ddt_bias of each sequence and value head */
    int exact;        /* f64 problem: in-kernel gates stay in double */
} bwd_ctx;

/* One thread's scratch, in doubles. KV = K * V. */
typedef struct bwd_buf {
    double *ck;        /* [nseg][G][KV] the state before each chunk */
    double *st;        /* [CKPT + 1][KV] the states before / after each token of a chunk */
    double *dS;        /* [G][KV] the adjoint states */
    double *qh, *kh;   /* [CKPT][K] normalised q (unscaled) and k */
    double *qn, *kn;   /* [CKPT] their norms sqrt(sum x^2 + 1e-6) (1 without l2norm) */
    double *dqh, *dkh; /* [CKPT][K] gradients w.r.t. the normalised q (scale applied) and k */
    double *uu, *rr;   /* [CKPT][V] u and r = v - Sd^T k per token */
    double *g, *beta;  /* [CKPT] */
    double *vec;       /* [2 V + K] do, du, dq~ */
} bwd_buf;

static int64_t num_segments(int64_t len) { return (len + CKPT - 1) / CKPT; }

static size_t per_thread_doubles(const gdn_bwd_problem *bp)
{
    const gdn_problem *p = &bp->fwd;
    const int64_t KV = p->K * p->V, nseg = num_segments(bp->max_len);
    return (size_t)(nseg * p->G * KV + (CKPT + 1) * KV + p->G * KV + 4 * CKPT * p->K + 2 * CKPT +
                    2 * CKPT * p->V + 2 * CKPT + 2 * p->V + p->K);
}

static bwd_buf carve(const gdn_bwd_problem *bp, double *d)
{
    const gdn_problem *p = &bp->fwd;
    const int64_t KV = p->K * p->V, K = p->K, V = p->V;
    bwd_buf w;
    w.ck = d; d += num_segments(bp->max_len) * p->G * KV;
    w.st = d; d += (CKPT + 1) * KV;
    w.dS = d; d += p->G * KV;
    w.qh = d; d += CKPT * K;
    w.kh = d; d += CKPT * K;
    w.dqh = d; d += CKPT * K;
    w.dkh = d; d += CKPT * K;
    w.qn = d; d += CKPT;
    w.kn = d; d += CKPT;
    w.uu = d; d += CKPT * V;
    w.rr = d; d += CKPT * V;
    w.g = d; d += CKPT;
    w.beta = d; d += CKPT;
    w.vec = d;
    return w;
}

static size_t align64(size_t bytes) { return (bytes + 63) / 64 * 64; }

static size_t partials_bytes(const gdn_problem *p) { return align64((size_t)(p->N * p->HV * 2) * sizeof(double)); }

static double flops_of(const gdn_problem *p)
{
    /* Two forward passes (about 4 K V each) and the reverse pass (about 16 K V) per token and head. */
    return 24.0 * (double)(p->B * p->T) * (double)(p->HV * p->K * p->V);
}

static int threads_wanted(const gdn_problem *p)
{
    return gdn_cpu_threads_for(p->N * p->H > 0 ? p->N * p->H : 1, flops_of(p));
}

size_t gdn_cpu_chunk_bwd_workspace_size(const gdn_bwd_problem *bp, int threads)
{
    const gdn_problem *p = &bp->fwd;
    if (threads <= 0)
        threads = threads_wanted(p);
    return partials_bytes(p) + (size_t)threads * align64(per_thread_doubles(bp) * sizeof(double));
}

/* Loads the normalised q or k of one token (x / n, n = sqrt(sum x^2 + 1e-6), or x and n = 1). */
static void load_unit(const gdn_problem *p, const gdn_view *x, int64_t b, int64_t t, int64_t h, double *out,
                      double *norm)
{
    gdn_ld_vec(x->data, x->dtype, gdn_tok_off(x, b, t, h, 0), x->s[3], p->K, out);
    *norm = 1.0;
    if (!p->use_qk_l2norm)
        return;
    double ss = 0.0;
    for (int64_t r = 0; r < p->K; r++)
        ss += out[r] * out[r];
    *norm = sqrt(ss + 1e-6);
    for (int64_t r = 0; r < p->K; r++)
        out[r] /= *norm;
}

/* One token forward on a double state: dst = e^g src + k u^T with u = beta (v - e^g src^T k);
 * u and r = v - e^g src^T k are returned. dst may equal src. */
static void step_forward(int64_t K, int64_t V, const double *src, double *dst, const double *k, double g, double beta,
                         const double *v, double *u, double *r)
{
    const double e = exp(g);
    for (int64_t c = 0; c < V; c++)
        r[c] = v[c];
    for (int64_t i = 0; i < K; i++) {
        const double *s = src + i * V; /* may be d: each element is read before it is written */
        double *d = dst + i * V;
        const double ki = k[i];
        for (int64_t c = 0; c < V; c++) {
            d[c] = e * s[c];
            r[c] -= ki * d[c];
        }
    }
    for (int64_t c = 0; c < V; c++)
        u[c] = beta * r[c];
    for (int64_t i = 0; i < K; i++) {
        double *d = dst + i * V;
        const double ki = k[i];
        for (int64_t c = 0; c < V; c++)
            d[c] += ki * u[c];
    }
}

/* The raw gate input x = a + dt_bias of (b, t, hv). */
static double raw_gate_input(const gdn_problem *p, int64_t b, int64_t t, int64_t hv)
{
    double x = gdn_ld(p->a.data, p->a.dtype, gdn_tok_off(&p->a, b, t, hv, 0));
    if (p->dt_bias.data)
        x += gdn_ld(p->dt_bias.data, p->dt_bias.dtype, hv * p->dt_bias.s[0]);
    return x;
}

/* Stores the gate gradients of token (b, t), value head hv, given dL/dg and dL/dbeta; adds the
 * token's dA_log and ddt_bias terms to part[0], part[1]. */
static void store_gate_grads(const gdn_bwd_problem *bp, int64_t b, int64_t t, int64_t hv, double dg, double dbeta,
                             double *part)
{
    const gdn_problem *p = &bp->fwd;
    const int64_t bth = b * p->beta.s[0] + t * p->beta.s[1] + hv * p->beta.s[2];
    if (p->beta_from_logits) {
        const double s = gdn_sigmoid(gdn_ld(p->beta.data, p->beta.dtype, bth));
        dbeta *= (p->allow_neg_eigval ? 2.0 : 1.0) * s * (1.0 - s);
    }
    gdn_st(bp->dbeta.data, bp->dbeta.dtype, b * bp->dbeta.s[0] + t * bp->dbeta.s[1] + hv * bp->dbeta.s[2], dbeta);
    if (p->g.data) {
        gdn_st(bp->dg.data, bp->dg.dtype, b * bp->dg.s[0] + t * bp->dg.s[1] + hv * bp->dg.s[2], dg);
        return;
    }
    /* g = -exp(A_log) softplus(x): dg/dx = -exp(A_log) sigmoid(beta_sp x) (1 on the linear branch),
     * dg/dA_log = g. */
    const double x = raw_gate_input(p, b, t, hv), A = exp((double)p->A_log[hv]);
    const double bx = p->softplus_beta * x;
    const double slope = bx > p->softplus_threshold ? 1.0 : gdn_sigmoid(bx);
    const double g = -A * gdn_softplus(x, p->softplus_beta, p->softplus_threshold);
    const double dx = dg * -A * slope;
    gdn_st(bp->da.data, bp->da.dtype, b * bp->da.s[0] + t * bp->da.s[1] + hv * bp->da.s[2], dx);
    part[0] += dg * g;
    part[1] += dx;
}

/* dL/dx from dL/dx_hat for x_hat = x / n: (dxh - xh (xh . dxh)) / n; stored at (b, t, h). */
static void store_qk_grad(const gdn_problem *p, const gdn_view *dst, int64_t b, int64_t t, int64_t h, const double *xh,
                          double n, double *dxh)
{
    if (p->use_qk_l2norm) {
        double dot = 0.0;
        for (int64_t r = 0; r < p->K; r++)
            dot += xh[r] * dxh[r];
        for (int64_t r = 0; r < p->K; r++)
            dxh[r] = (dxh[r] - xh[r] * dot) / n;
    }
    gdn_st_vec(dst->data, dst->dtype, gdn_tok_off(dst, b, t, h, 0), dst->s[3], p->K, dxh);
}

static void load_state(const gdn_problem *p, const gdn_view *s, int64_t n, int64_t hv, double *S)
{
    for (int64_t r = 0; r < p->K; r++)
        gdn_ld_vec(s->data, p->state_dtype, gdn_state_off(s, n, hv, r, 0), s->s[3], p->V, S + r * p->V);
}

static void bwd_item(void *ctxp, int64_t item, int thread)
{
    const bwd_ctx *ctx = (const bwd_ctx *)ctxp;
    const gdn_bwd_problem *bp = ctx->bp;
    const gdn_problem *p = &bp->fwd;
    const int64_t K = p->K, V = p->V, KV = K * V, G = p->G;
    const int64_t n = item / p->H, h = item % p->H;
    int64_t b, bos, len;
    gdn_seq_bounds(p, n, &b, &bos, &len);
    const int64_t nseg = num_segments(len);
    bwd_buf w = carve(bp, (double *)(ctx->scratch + (size_t)thread * ctx->per_thread));
    double *dov = w.vec, *du = dov + V, *dqt = du + V;
    double *part = ctx->partials + (n * p->HV + h * G) * 2;
    for (int64_t j = 0; j < G; j++)
        part[2 * j] = part[2 * j + 1] = 0.0;

    /* 1. Checkpoints, and the adjoint states after the last token. */
    for (int64_t j = 0; j < G; j++) {
        const int64_t hv = h * G + j;
        double *S = w.st; /* the running state */
        if (p->state_in.data)
            load_state(p, &p->state_in, n, hv, S);
        else
            memset(S, 0, (size_t)KV * sizeof *S);
        for (int64_t s = 0; s < nseg; s++) {
            memcpy(w.ck + (s * G + j) * KV, S, (size_t)KV * sizeof *S);
            if (s == nseg - 1)
                break; /* the last chunk's end state is never needed */
            for (int64_t i = 0; i < CKPT; i++) {
                const int64_t t = bos + s * CKPT + i;
                double gv, nk;
                load_unit(p, &p->k, b, t, h, w.kh, &nk);
                gdn_load_gate(p, b, t, hv, ctx->exact, &gv);
                gdn_ld_vec(p->v.data, p->v.dtype, gdn_tok_off(&p->v, b, t, hv, 0), p->v.s[3], V, dov);
                step_forward(K, V, S, S, w.kh, gv, gdn_load_beta(p, b, t, hv, ctx->exact), dov, w.uu, w.rr);
            }
        }
        double *dS = w.dS + j * KV;
        if (bp->dht.data)
            load_state(p, &bp->dht, n, hv, dS);
        else
            memset(dS, 0, (size_t)KV * sizeof *dS);
    }

    /* 2. The chunks in reverse. */
    for (int64_t s = nseg - 1; s >= 0; s--) {
        const int64_t t0 = bos + s * CKPT, L = len - s * CKPT < CKPT ? len - s * CKPT : CKPT;
        for (int64_t i = 0; i < L; i++) {
            load_unit(p, &p->q, b, t0 + i, h, w.qh + i * K, w.qn + i);
            load_unit(p, &p->k, b, t0 + i, h, w.kh + i * K, w.kn + i);
        }
        memset(w.dqh, 0, (size_t)(L * K) * sizeof(double));
        memset(w.dkh, 0, (size_t)(L * K) * sizeof(double));

        for (int64_t j = 0; j < G; j++) {
            const int64_t hv = h * G + j;
            double *restrict dS = w.dS + j * KV;
            memcpy(w.st, w.ck + (s * G + j) * KV, (size_t)KV * sizeof(double));
            for (int64_t i = 0; i < L; i++) {
                const int64_t t = t0 + i;
                gdn_load_gate(p, b, t, hv, ctx->exact, w.g + i);
                w.beta[i] = gdn_load_beta(p, b, t, hv, ctx->exact);
                gdn_ld_vec(p->v.data, p->v.dtype, gdn_tok_off(&p->v, b, t, hv, 0), p->v.s[3], V, dov);
                step_forward(K, V, w.st + i * KV, w.st + (i + 1) * KV, w.kh + i * K, w.g[i], w.beta[i], dov,
                             w.uu + i * V, w.rr + i * V);
            }
            for (int64_t i = L - 1; i >= 0; i--) {
                const int64_t t = t0 + i;
                const double *restrict S = w.st + (i + 1) * KV, *restrict Sp = w.st + i * KV;
                const double *k = w.kh + i * K, *q = w.qh + i * K, *u = w.uu + i * V, *r = w.rr + i * V;
                const double beta = w.beta[i], e = exp(w.g[i]);
                double *dk = w.dkh + i * K, *dq = w.dqh + i * K;
                gdn_ld_vec(bp->d_o.data, bp->d_o.dtype, gdn_tok_off(&bp->d_o, b, t, hv, 0), bp->d_o.s[3], V, dov);
                for (int64_t c = 0; c < V; c++)
                    du[c] = 0.0;
                /* o = S^T q~: dq~ = S do, dS += q~ do^T; then S = Sd + k u^T: du = dS^T k, dk += dS u. */
                for (int64_t x = 0; x < K; x++) {
                    const double *restrict Sx = S + x * V;
                    double *restrict dSx = dS + x * V;
                    const double qx = p->scale * q[x], kx = k[x];
                    double a0 = 0.0, a1 = 0.0;
                    for (int64_t c = 0; c < V; c++) {
                        a0 += Sx[c] * dov[c];
                        dSx[c] += qx * dov[c];
                        du[c] += kx * dSx[c];
                        a1 += dSx[c] * u[c];
                    }
                    dqt[x] = a0;
                    dk[x] += a1;
                }
                /* u = beta r: dbeta = du . r, dv = beta du (dr = beta du, dv = dr). */
                double dbeta = 0.0;
                for (int64_t c = 0; c < V; c++) {
                    dbeta += du[c] * r[c];
                    du[c] *= beta; /* now dr = dv */
                }
                gdn_st_vec(bp->dv.data, bp->dv.dtype, gdn_tok_off(&bp->dv, b, t, hv, 0), bp->dv.s[3], V, du);
                /* r = v - Sd^T k: dSd = dS - k dr^T, dk -= Sd dr; Sd = e Sp: dg = <dSd, Sd>, dSp = e dSd. */
                double dg = 0.0;
                for (int64_t x = 0; x < K; x++) {
                    const double *restrict Spx = Sp + x * V;
                    double *restrict dSx = dS + x * V;
                    const double kx = k[x];
                    double a1 = 0.0, a2 = 0.0;
                    for (int64_t c = 0; c < V; c++) {
                        const double sd = e * Spx[c], dsd = dSx[c] - kx * du[c];
                        a1 += sd * du[c];
                        a2 += dsd * sd;
                        dSx[c] = e * dsd;
                    }
                    dk[x] -= a1;
                    dg += a2;
                }
                for (int64_t x = 0; x < K; x++)
                    dq[x] += p->scale * dqt[x];
                store_gate_grads(bp, b, t, hv, dg, dbeta, part + 2 * j);
            }
        }
        for (int64_t i = 0; i < L; i++) {
            store_qk_grad(p, &bp->dq, b, t0 + i, h, w.qh + i * K, w.qn[i], w.dqh + i * K);
            store_qk_grad(p, &bp->dk, b, t0 + i, h, w.kh + i * K, w.kn[i], w.dkh + i * K);
        }
    }

    /* 3. dh0. */
    if (bp->dh0.data)
        for (int64_t j = 0; j < G; j++)
            for (int64_t x = 0; x < K; x++)
                gdn_st_vec(bp->dh0.data, p->state_dtype, gdn_state_off(&bp->dh0, n, h * G + j, x, 0), bp->dh0.s[3], V,
                           w.dS + j * KV + x * V);
}

/* The forward's limits (head dims 1 .. GDN_CPU_MAX_HEAD_DIM); the API refuses KDA gates itself. */
gdn_status gdn_cpu_chunk_bwd_check(const gdn_bwd_problem *bp) { return gdn_cpu_chunk_fwd_check(&bp->fwd); }

gdn_status gdn_cpu_chunk_bwd(const gdn_bwd_problem *bp)
{
    const gdn_problem *p = &bp->fwd;
    bwd_ctx ctx;
    ctx.bp = bp;
    ctx.exact = p->q.dtype == GDN_DTYPE_F64;
    ctx.per_thread = align64(per_thread_doubles(bp) * sizeof(double));
    ctx.partials = (double *)p->workspace;
    ctx.scratch = (unsigned char *)p->workspace + partials_bytes(p);
    /* As many threads as wanted and as the workspace covers (the API checked it covers one). */
    int threads = threads_wanted(p);
    const size_t fit = (p->workspace_bytes - partials_bytes(p)) / ctx.per_thread;
    if ((size_t)threads > fit)
        threads = (int)fit;
    gdn_cpu_parallel_for(threads, p->N * p->H, bwd_item, &ctx);

    if (bp->dA_log.data || bp->ddt_bias.data) {
        for (int64_t hv = 0; hv < p->HV; hv++) {
            double dA = 0.0, db = 0.0;
            for (int64_t n = 0; n < p->N; n++) {
                dA += ctx.partials[(n * p->HV + hv) * 2];
                db += ctx.partials[(n * p->HV + hv) * 2 + 1];
            }
            if (bp->dA_log.data)
                gdn_st(bp->dA_log.data, bp->dA_log.dtype, hv * bp->dA_log.s[0], dA);
            if (bp->ddt_bias.data)
                gdn_st(bp->ddt_bias.data, bp->ddt_bias.dtype, hv * bp->ddt_bias.s[0], db);
        }
    }
    return GDN_OK;
}
