/*
 * cpu_recurrent_f32.c - the recurrence of GDN_MATH.md in f32 for f32 / bf16 / f16 inputs
 * (decode, multi-token verify), with the state pool. f64 inputs take the reference in
 * cpu_recurrent.c instead, and the tests check this path against it.
 *
 * Every value column c of the state evolves on its own: with e = exp(g) (a scalar for GDN, a
 * vector over the K channels for KDA), s = S[:, c] and q carrying the scale,
 *
 *     u_c = beta (v_c - s . (e k))        o_c = s . (e q) + (k . q) u_c        s <- e s + u_c k
 *
 * so the state is walked once per token, in tiles of columns that stay in L1 across a block of
 * tokens. The tile's inner loop follows the layout: VK (K contiguous) tiles are RB value rows of
 * K and take the two dot products along K; KV (V contiguous) tiles are NB columns wide and
 * accumulate the dots as vectors over the columns. Both bring each state element from memory
 * and write it back once per token, so both layouts run at about the same speed. The
 * ISA-dependent code is in cpu_recurrent_f32.inc, compiled once per instruction set (cpu_isa.h).
 *
 * Work items are (sequence, value head) pairs on the thread pool, so a single sequence with many
 * heads uses every thread. The state stays where it is when that is possible (f32, unit inner
 * stride, the source slot is the only destination: in-place decode); otherwise it is gathered
 * once into per-thread f32 scratch and scattered to every destination at the end (and to the
 * per-token destinations after each token).
 */
#include <stdlib.h>

#include "cpu_common.h"
#include "cpu_isa.h" /* before the kernels: immintrin.h for the AVX-512 instance */

#define TB 32 /* tokens prepared per block */
#define VL 16 /* lanes of the VK dot products; K is padded to a multiple */
#define RB 16 /* value rows per VK tile */
#define NB 64 /* value columns per KV tile; V is padded to a multiple */
#define KV_AHEAD 8 /* rows of a KV tile prefetched ahead of the dot products */

typedef struct rec32_ctx {
    const gdn_problem *p;
    unsigned char *scratch;
    size_t per_thread;
    int64_t Kp, Vp; /* K rounded up to VL, V rounded up to NB */
    int64_t tb;     /* tokens per block: TB, or fewer for shorter problems */
    int vk;         /* state tiles in VK form */
    int direct;     /* the state is updated where it lies */
} rec32_ctx;

/* Per-thread scratch: the prepared token block and the state's home when it is not direct. */
typedef struct rec32_buf {
    float *k, *ek, *eq, *e; /* [TB][Kp]: k, e k, e q (q scaled and normalised), e = exp(g) */
    float *v, *o;           /* [TB][Vp] */
    float *beta, *kq;       /* [TB] */
    float *home;            /* VK [Vp][Kp], KV [Kp][Vp] */
    double *g;              /* [Kp] one token's log decays */
} rec32_buf;

/* Scratch is sized to the call (small for decode, where a large block would cost page faults). */
static size_t rec32_buf_bytes(int64_t Kp, int64_t Vp, int64_t tb, int direct)
{
    size_t floats = (size_t)(4 * tb * Kp + 2 * tb * Vp + 2 * tb + (direct ? 0 : Kp * Vp));
    size_t bytes = floats * sizeof(float) + (size_t)Kp * sizeof(double);
    return (bytes + 63) / 64 * 64;
}

static rec32_buf rec32_buf_carve(unsigned char *base, int64_t Kp, int64_t Vp, int64_t tb, int direct)
{
    rec32_buf w;
    w.g = (double *)base;
    float *f = (float *)(w.g + Kp);
    w.k = f; f += tb * Kp;
    w.ek = f; f += tb * Kp;
    w.eq = f; f += tb * Kp;
    w.e = f; f += tb * Kp;
    w.v = f; f += tb * Vp;
    w.o = f; f += tb * Vp;
    w.beta = f; f += tb;
    w.kq = f; f += tb;
    w.home = direct ? NULL : f;
    return w;
}

#define GDN_CPU_KERNELS "cpu_recurrent_f32.inc"
#include "cpu_isa_instances.h"

/* Can the state be updated where it lies? Only when the source slot is its one destination. */
static int can_update_in_place(const gdn_problem *p, int vk)
{
    const gdn_view *s = &p->state_in;
    if (!s->data || p->state_dtype != GDN_DTYPE_F32 || p->step_states.data)
        return 0;
    if (vk ? s->s[2] != 1 || p->K % VL != 0 : s->s[3] != 1 || p->V % NB != 0)
        return 0;
    if (p->state_indices)
        return p->inplace_state && p->idx_cols == 1 && !p->final_state.data;
    const gdn_view *f = &p->final_state;
    return f->data == s->data && f->s[0] == s->s[0] && f->s[1] == s->s[1] && f->s[2] == s->s[2] &&
           f->s[3] == s->s[3];
}

/* The call's scratch per thread (ctx) and its thread count: one home for the query and the call. */
static int rec32_plan(const gdn_problem *p, rec32_ctx *ctx)
{
    rec32_ctx c;
    c.p = p;
    c.Kp = (p->K + VL - 1) / VL * VL;
    c.Vp = (p->V + NB - 1) / NB * NB;
    c.vk = p->state_layout == GDN_STATE_VK;
    c.direct = can_update_in_place(p, c.vk);
    c.tb = p->T < 1 ? 1 : p->T < TB ? p->T : TB;
    c.per_thread = rec32_buf_bytes(c.Kp, c.Vp, c.tb, c.direct);
    c.scratch = NULL;
    *ctx = c;
    /* Per token and head: the two dots and the update, 6 K V flops, plus reading the state. */
    const double flops = 8.0 * (double)(p->B * p->T + p->N) * (double)(p->HV * p->K * p->V);
    return gdn_cpu_threads_for(p->N * p->HV, flops);
}

size_t gdn_cpu_recurrent_f32_workspace(const gdn_problem *p, int least)
{
    if (p->N * p->HV == 0)
        return 0;
    rec32_ctx ctx;
    const int threads = rec32_plan(p, &ctx);
    return (size_t)(least ? 1 : threads) * ctx.per_thread;
}

gdn_status gdn_cpu_recurrent_f32(const gdn_problem *p)
{
    const int64_t items = p->N * p->HV;
    if (items == 0)
        return GDN_OK;
    rec32_ctx ctx;
    int threads = rec32_plan(p, &ctx);
    /* As many threads as the caller's workspace covers (the API checked it covers one). */
    if ((size_t)threads * ctx.per_thread > p->workspace_bytes)
        threads = (int)(p->workspace_bytes / ctx.per_thread);
    ctx.scratch = (unsigned char *)p->workspace;
    gdn_cpu_parallel_for(threads, items, GDN_CPU_PICK(gdn_cpu_isa(), rec32_item), &ctx);
    return GDN_OK;
}
