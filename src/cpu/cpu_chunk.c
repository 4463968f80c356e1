/*
 * cpu_chunk.c - the chunked forward (prefill) of GDN_MATH.md on the CPU, in f32.
 *
 * One work item per sequence n and group of up to HEAD_GROUP value heads, run on the thread pool;
 * each walks its sequence in chunks of C = 64 tokens, all heads of the group per chunk (a token's
 * rows of adjacent heads are adjacent in memory), keeping the states S (K x V, f32) in per-thread
 * scratch. Per chunk,
 * with Gam the in-chunk cumulative log decay (GDN one scalar per token, KDA one per key channel):
 *
 *     A    = strictly lower, A[i][j] = beta_i * sum_r k_i[r] k_j[r] exp(Gam_i[r] - Gam_j[r])
 *     P    = lower incl.,    P[i][j] =          sum_r q_i[r] k_j[r] exp(Gam_i[r] - Gam_j[r])
 *     W    = (I + A)^-1 (beta exp(Gam) K),   U = (I + A)^-1 (beta V)     forward substitution
 *     Vnew = U - W S
 *     O    = (exp(Gam) Q) S + P Vnew          (q carries the scale)
 *     S   <- exp(Gam_C) S + (exp(Gam_C - Gam) K)^T Vnew
 *
 * GDN: gam is summed in double; the decays factor out of the sums, so P and A come from Q K^T
 * and K K^T (lower blocks only), scaled by exp(gam_i - gam_j) (i >= j, never positive).
 * KDA: the decay sits inside the sums. Every factor exp(Gam_a[r] - Gam_b[r]) (a >= b) is formed
 * as the running product of exp(g_t[r]) over the tokens b < t <= a: for each j the vector
 * k_j[r] exp(Gam_i[r] - Gam_j[r]) is carried down the rows i > j; exp(Gam_i) and exp(Gam_C - Gam_i)
 * are products from the first and from the last token. No exponential of a positive number is
 * ever formed, only K exponentials per token are taken, and the relative error of a factor grows
 * only with the number of tokens it spans (at most 63 roundings in f32).
 *
 * A short last chunk is zero padded to a multiple of 16 rows (zero q, k, v and beta, g = 0), and
 * head dims to multiples of 16 columns, so the matrix products need no edge cases. The products
 * run on register tiles (8 rows x 32 columns with AVX-512, 4 x 16 otherwise). The ISA-dependent
 * code is in cpu_chunk.inc, compiled once per instruction set (cpu_isa.h).
 *
 * f64 problems (the oracle) go to the recurrent reference, which is exact in double.
 */
#include <stdlib.h>

#include "cpu_common.h"
#include "cpu_isa.h"

#define CHUNK 64
#define PAD 16 /* head dims are padded to multiples of this */
/* Log decays below this are raised to it: exp() of it is already 0 in f32 and f64, so nothing
 * changes, except that a full reset (g = -inf) keeps GDN's gam_i - gam_j finite instead of NaN. */
#define G_FLOOR (-1.0e4)
#define FS_BLOCK 16 /* rows per block of the forward substitution */
#define ROW_PAD 16  /* a short chunk is computed with its rows padded to a multiple of this */
#define HEAD_GROUP 4 /* value heads per work item, walked together chunk by chunk */

/* Triangular structure a matmul may exploit. */
enum {
    MM_FULL = 0,
    MM_LOWER_OUT = 1, /* only C[i][j] with j <= i is wanted: column blocks past a tile's last row
                       * are left unwritten */
    MM_LOWER_A = 2    /* A[i][l] = 0 for l > i: the sum stops at the diagonal */
};

/* Per-thread scratch, carved from one block. Kp, Vp: padded head dims. */
typedef struct chunk_buf {
    double *gam;  /* [C] GDN: in-chunk cumulative log decay */
    float *QK;    /* [2C][Kp]: rows 0..C-1 q (scaled, normalised), rows C..2C-1 k */
    float *Kt;    /* [Kp][C]: k transposed (KDA: the decayed keys D) */
    float *V;     /* [C][Vp]: v, then U = beta v solved, then Vnew */
    float *QW;    /* [2C][Kp]: rows 0..C-1 exp(Gam) q (later exp(Gam_C - Gam) k), rows C..2C-1 W */
    float *Y;     /* [2C][Vp]: rows 0..C-1 O, rows C..2C-1 W S */
    float *PA;    /* [2C][C]:  rows 0..C-1 P, rows C..2C-1 A */
    float *S;     /* [hg][Kp][Vp] the states of the item's heads */
    float *eg;    /* [C][Kp] KDA: exp(g) per token and channel */
    float *beta;  /* [C] */
    double *row;  /* [Kp] a token's gates (gdn_load_gate_f32's scratch), then KDA's running decays */
} chunk_buf;

static size_t chunk_buf_bytes(int64_t Kp, int64_t Vp, int64_t hg)
{
    const int64_t C = CHUNK;
    int64_t doubles = C + Kp;
    int64_t floats = 2 * C * Kp + Kp * C + C * Vp + 2 * C * Kp + 2 * C * Vp + 2 * C * C + hg * Kp * Vp + C * Kp + C;
    size_t bytes = (size_t)doubles * sizeof(double) + (size_t)floats * sizeof(float);
    return (bytes + 63) / 64 * 64; /* keeps every thread's block 64-byte aligned */
}

static chunk_buf chunk_buf_carve(void *base, int64_t Kp, int64_t Vp, int64_t hg)
{
    const int64_t C = CHUNK;
    chunk_buf w;
    double *d = (double *)base;
    w.gam = d;
    d += C;
    w.row = d;
    d += Kp;
    float *f = (float *)d;
    w.QK = f; f += 2 * C * Kp;
    w.Kt = f; f += Kp * C;
    w.V = f; f += C * Vp;
    w.QW = f; f += 2 * C * Kp;
    w.Y = f; f += 2 * C * Vp;
    w.PA = f; f += 2 * C * C;
    w.S = f; f += hg * Kp * Vp;
    w.eg = f; f += C * Kp;
    w.beta = f;
    return w;
}

typedef struct chunk_ctx {
    const gdn_problem *p;
    unsigned char *scratch;
    size_t per_thread;
    int64_t Kp, Vp;
    int64_t hg; /* value heads per work item */
} chunk_ctx;


#define GDN_CPU_KERNELS "cpu_chunk.inc"
#include "cpu_isa_instances.h"

/* The call's layout (ctx: padded dims, heads per item, scratch per thread) and thread count: one
 * home for the query and the call. */
static int chunk_plan(const gdn_problem *p, chunk_ctx *ctx)
{
    ctx->p = p;
    ctx->scratch = NULL;
    ctx->Kp = (p->K + PAD - 1) / PAD * PAD;
    ctx->Vp = (p->V + PAD - 1) / PAD * PAD;
    /* Per token and head: about 4 C (K + V) + 6 K V flops of products and substitution. */
    const double flops = (double)(p->B * p->T) * (double)p->HV *
                         (4.0 * CHUNK * (double)(p->K + p->V) + 6.0 * (double)(p->K * p->V));
    const int threads = gdn_cpu_threads_for(p->N * p->HV, flops);
    /* Heads per item: up to HEAD_GROUP while every thread still gets two items to balance. */
    ctx->hg = HEAD_GROUP;
    while (ctx->hg > 1 && p->N * ((p->HV + ctx->hg - 1) / ctx->hg) < 2 * threads)
        ctx->hg /= 2;
    ctx->per_thread = chunk_buf_bytes(ctx->Kp, ctx->Vp, ctx->hg);
    return threads;
}

/* least: one thread's share for the largest head group, which covers every smaller one (the call
 * plans its head group again, for the thread count of that moment). The query never gives less:
 * with few items the plan's group is smaller than the largest, and one thread's share of it would
 * be refused by the call. */
size_t gdn_cpu_chunk_fwd_workspace(const gdn_problem *p, int least)
{
    if (p->q.dtype == GDN_DTYPE_F64)
        return gdn_cpu_recurrent_fwd_workspace(p, least);
    if (p->N * p->HV == 0)
        return 0;
    chunk_ctx ctx;
    const int threads = chunk_plan(p, &ctx);
    const size_t one = chunk_buf_bytes(ctx.Kp, ctx.Vp, HEAD_GROUP), all = (size_t)threads * ctx.per_thread;
    return least || all < one ? one : all;
}

gdn_status gdn_cpu_chunk_fwd(const gdn_problem *p)
{
    if (p->q.dtype == GDN_DTYPE_F64)
        return gdn_cpu_recurrent_fwd(p);
    if (p->N * p->HV == 0)
        return GDN_OK;
    chunk_ctx ctx;
    int threads = chunk_plan(p, &ctx);
    /* As many threads as the caller's workspace covers (the API checked it covers one). */
    if ((size_t)threads * ctx.per_thread > p->workspace_bytes)
        threads = (int)(p->workspace_bytes / ctx.per_thread);
    ctx.scratch = (unsigned char *)p->workspace;
    gdn_cpu_parallel_for(threads, p->N * ((p->HV + ctx.hg - 1) / ctx.hg), GDN_CPU_PICK(gdn_cpu_isa(), chunk_item),
                         &ctx);
    return GDN_OK;
}
