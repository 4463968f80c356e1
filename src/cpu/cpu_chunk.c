/*
 * cpu_chunk.c - the chunked forward (prefill) of GDN_MATH.md on the CPU, in f32.
 *
 * One work item per (sequence n, value head j), run on the thread pool; each walks its sequence
 * in chunks of C = 64 tokens, keeping the state S (K x V, f32) in per-thread scratch. Per chunk,
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
 * are register-tiled loops the compiler vectorizes (4 rows x 16 columns).
 *
 * f64 problems (the oracle) go to the recurrent reference, which is exact in double.
 */
#include <stdlib.h>

#include "cpu_common.h"

#define CHUNK 64
#define PAD 16 /* head dims are padded to multiples of this */
#define MR 4   /* matmul tile: MR rows x NR columns of accumulators (MR is written out as 4 rows) */
#define NR 16
#define KDA_NB 8 /* column block of the KDA decayed products */
/* Log decays below this are raised to it: exp() of it is already 0 in f32 and f64, so nothing
 * changes, except that a full reset (g = -inf) keeps GDN's gam_i - gam_j finite instead of NaN. */
#define G_FLOOR (-1.0e4)
#define FS_BLOCK 16 /* rows per block of the forward substitution */
#define ROW_PAD 16  /* a short chunk is computed with its rows padded to a multiple of this */

/* Triangular structure a matmul may exploit. */
enum {
    MM_FULL = 0,
    MM_LOWER_OUT = 1, /* only C[i][j] with j <= i is wanted: other NR-blocks are left unwritten */
    MM_LOWER_A = 2    /* A[i][l] = 0 for l > i: the sum stops at the diagonal */
};

/* C[M][N] (+)= alpha * A[M][L] B[L][N], row-major with leading dims; M % MR == 0, N % NR == 0.
 * Four named accumulator rows (not an [MR][NR] array): with the array GCC vectorizes along l
 * and shuffles, 5x slower; this form becomes four vector accumulators per column block. */
static void matmul(int64_t M, int64_t N, int64_t L, float alpha, const float *restrict A, int64_t lda,
                   const float *restrict B, int64_t ldb, float *restrict Cm, int64_t ldc, int accumulate, int tri)
{
    for (int64_t i0 = 0; i0 < M; i0 += MR) {
        const float *a0 = A + i0 * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
        const int64_t n_end = tri == MM_LOWER_OUT && i0 + MR < N ? i0 + MR : N;
        const int64_t l_end = tri == MM_LOWER_A && i0 + MR < L ? i0 + MR : L;
        for (int64_t j0 = 0; j0 < n_end; j0 += NR) {
            float c0[NR] = {0}, c1[NR] = {0}, c2[NR] = {0}, c3[NR] = {0};
            for (int64_t l = 0; l < l_end; l++) {
                const float *b = B + l * ldb + j0;
                const float x0 = a0[l], x1 = a1[l], x2 = a2[l], x3 = a3[l];
                for (int u = 0; u < NR; u++) {
                    c0[u] += x0 * b[u];
                    c1[u] += x1 * b[u];
                    c2[u] += x2 * b[u];
                    c3[u] += x3 * b[u];
                }
            }
            float *d0 = Cm + i0 * ldc + j0, *d1 = d0 + ldc, *d2 = d1 + ldc, *d3 = d2 + ldc;
            for (int u = 0; u < NR; u++) {
                d0[u] = (accumulate ? d0[u] : 0.0f) + alpha * c0[u];
                d1[u] = (accumulate ? d1[u] : 0.0f) + alpha * c1[u];
                d2[u] = (accumulate ? d2[u] : 0.0f) + alpha * c2[u];
                d3[u] = (accumulate ? d3[u] : 0.0f) + alpha * c3[u];
            }
        }
    }
}

/* dst[c][r] = src[r][c] for a rows x cols block. */
static void transpose(int64_t rows, int64_t cols, const float *restrict src, int64_t lds, float *restrict dst,
                      int64_t ldd)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[c * ldd + r] = src[r * lds + c];
}

/* Per-thread scratch, carved from one block. Kp, Vp: padded head dims. */
typedef struct chunk_buf {
    double *gam;  /* [C] GDN: in-chunk cumulative log decay */
    float *QK;    /* [2C][Kp]: rows 0..C-1 q (scaled, normalised), rows C..2C-1 k */
    float *Kt;    /* [Kp][C]: k transposed (KDA: the decayed keys D); later exp(Gam_C - Gam) k transposed */
    float *V;     /* [C][Vp]: v, then U = beta v solved, then Vnew */
    float *QW;    /* [2C][Kp]: rows 0..C-1 exp(Gam) q, rows C..2C-1 W */
    float *Y;     /* [2C][Vp]: rows 0..C-1 O, rows C..2C-1 W S */
    float *PA;    /* [2C][C]:  rows 0..C-1 P, rows C..2C-1 A */
    float *S;     /* [Kp][Vp] state */
    float *eg;    /* [C][Kp] KDA: exp(g) per token and channel */
    float *beta;  /* [C] */
    double *row;  /* [Kp] one token's q, k or g as double */
} chunk_buf;

static size_t chunk_buf_bytes(int64_t Kp, int64_t Vp)
{
    const int64_t C = CHUNK;
    int64_t doubles = C + Kp;
    int64_t floats = 2 * C * Kp + Kp * C + C * Vp + 2 * C * Kp + 2 * C * Vp + 2 * C * C + Kp * Vp + C * Kp + C;
    size_t bytes = (size_t)doubles * sizeof(double) + (size_t)floats * sizeof(float);
    return (bytes + 63) / 64 * 64; /* keeps every thread's block 64-byte aligned */
}

static chunk_buf chunk_buf_carve(void *base, int64_t Kp, int64_t Vp)
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
    w.S = f; f += Kp * Vp;
    w.eg = f; f += C * Kp;
    w.beta = f;
    return w;
}

typedef struct chunk_ctx {
    const gdn_problem *p;
    unsigned char *scratch;
    size_t per_thread;
    int64_t Kp, Vp;
} chunk_ctx;

/* Loads q or k of one token as f32 into out[0..Kp), l2-normalised if asked, times mul; the
 * norm is taken in double. Padding columns are zero. */
static void load_qk_row(const gdn_problem *p, const gdn_view *x, int64_t b, int64_t t, int64_t h, double mul,
                        double *tmp, float *out, int64_t Kp)
{
    gdn_ld_vec(x->data, x->dtype, gdn_tok_off(x, b, t, h, 0), x->s[3], p->K, tmp);
    double ss = 0.0;
    for (int64_t r = 0; r < p->K; r++)
        ss += tmp[r] * tmp[r];
    if (p->use_qk_l2norm)
        mul /= sqrt(ss + 1e-6);
    for (int64_t r = 0; r < p->K; r++)
        out[r] = (float)(tmp[r] * mul);
    for (int64_t r = p->K; r < Kp; r++)
        out[r] = 0.0f;
}

/* Fills q, k, v, beta and the cumulative gates of the chunk of c tokens starting at token t0,
 * zero padding rows c..cp-1 (with g = 0 there, so Gam stays flat past the last token). */
static void load_chunk(const gdn_problem *p, const chunk_buf *w, int64_t Kp, int64_t Vp, int64_t b, int64_t t0,
                       int64_t c, int64_t cp, int64_t hv)
{
    const int64_t C = CHUNK, h = hv / p->G;
    const int kda = p->gate_kind == GDN_GATE_KDA;
    const int64_t ng = kda ? Kp : 1;
    double *g = w->row;
    for (int64_t i = 0; i < cp; i++) {
        float *q = w->QK + i * Kp, *k = w->QK + (C + i) * Kp, *v = w->V + i * Vp;
        if (i < c) {
            const int64_t t = t0 + i;
            load_qk_row(p, &p->q, b, t, h, p->scale, w->row, q, Kp);
            load_qk_row(p, &p->k, b, t, h, 1.0, w->row, k, Kp);
            gdn_ld_vec_f32(p->v.data, p->v.dtype, gdn_tok_off(&p->v, b, t, hv, 0), p->v.s[3], p->V, v);
            for (int64_t j = p->V; j < Vp; j++)
                v[j] = 0.0f;
            w->beta[i] = (float)gdn_load_beta(p, b, t, hv, 0);
            gdn_load_gate(p, b, t, hv, 0, g);
            for (int64_t r = 0; r < (kda ? p->K : 1); r++)
                if (g[r] < G_FLOOR)
                    g[r] = G_FLOOR;
            for (int64_t r = (kda ? p->K : 1); r < ng; r++)
                g[r] = 0.0;
        } else {
            memset(q, 0, (size_t)Kp * sizeof *q);
            memset(k, 0, (size_t)Kp * sizeof *k);
            memset(v, 0, (size_t)Vp * sizeof *v);
            w->beta[i] = 0.0f;
            for (int64_t r = 0; r < ng; r++)
                g[r] = 0.0;
        }
        if (kda)
            for (int64_t r = 0; r < Kp; r++)
                w->eg[i * Kp + r] = expf((float)g[r]);
        else
            w->gam[i] = (i > 0 ? w->gam[i - 1] : 0.0) + g[0];
    }
}

/* [P; A] for GDN, rows and columns 0..cp-1: Q K^T and K K^T, then the decays
 * exp(gam_i - gam_j) and beta. */
static void gdn_pa(const chunk_buf *w, int64_t Kp, int64_t cp)
{
    const int64_t C = CHUNK;
    transpose(cp, Kp, w->QK + C * Kp, Kp, w->Kt, C);
    matmul(cp, cp, Kp, 1.0f, w->QK, Kp, w->Kt, C, w->PA, C, 0, MM_LOWER_OUT);
    matmul(cp, cp, Kp, 1.0f, w->QK + C * Kp, Kp, w->Kt, C, w->PA + C * C, C, 0, MM_LOWER_OUT);
    float *P = w->PA, *A = w->PA + C * C;
    for (int64_t i = 0; i < cp; i++) {
        for (int64_t j = 0; j < cp; j++) {
            if (j > i) {
                P[i * C + j] = 0.0f;
                A[i * C + j] = 0.0f;
                continue;
            }
            const float d = expf((float)(w->gam[i] - w->gam[j]));
            P[i * C + j] *= d;
            A[i * C + j] = j < i ? A[i * C + j] * w->beta[i] * d : 0.0f;
        }
    }
}

/* One KDA_NB-column block of kda_pa: sa[u] = sum_r k[r] D[r][u], sp[u] = sum_r q[r] D[r][u].
 * Written like matmul (read-only D, named accumulators) so that it vectorizes over u. */
static void kda_block(int64_t Kp, const float *restrict D, int64_t ldd, const float *restrict k,
                      const float *restrict q, float *restrict sa, float *restrict sp)
{
    float a[KDA_NB] = {0}, b[KDA_NB] = {0};
    for (int64_t r = 0; r < Kp; r++) {
        const float *d = D + r * ldd;
        const float kr = k[r], qr = q[r];
        for (int u = 0; u < KDA_NB; u++) {
            a[u] += kr * d[u];
            b[u] += qr * d[u];
        }
    }
    for (int u = 0; u < KDA_NB; u++) {
        sa[u] = a[u];
        sp[u] = b[u];
    }
}

/* [P; A] for KDA, the decay inside the sums (see the file comment). Walking down the rows i,
 * D[r][j] = k_j[r] exp(Gam_i[r] - Gam_j[r]) for all j < i is kept transposed in Kt, rescaled
 * by exp(g_i) on entering row i; then A[i][j] = beta_i sum_r k_i[r] D[r][j] and
 * P[i][j] = sum_r q_i[r] D[r][j] are column-block products like matmul's (vectorized over j).
 * Columns j >= i of D are still zero, so those sums vanish; row i then appends k_i as column i. */
static void kda_pa(const chunk_buf *w, int64_t Kp, int64_t c)
{
    const int64_t C = CHUNK;
    const float *Q = w->QK, *K = w->QK + C * Kp;
    float *P = w->PA, *A = w->PA + C * C, *D = w->Kt;
    memset(w->PA, 0, (size_t)(2 * C * C) * sizeof(float));
    memset(D, 0, (size_t)(Kp * C) * sizeof(float));
    for (int64_t i = 0; i < c; i++) {
        const float *qi = Q + i * Kp, *ki = K + i * Kp, *e = w->eg + i * Kp;
        const int64_t jn = (i + KDA_NB - 1) / KDA_NB * KDA_NB;
        for (int64_t r = 0; r < Kp; r++)
            for (int64_t j = 0; j < jn; j++)
                D[r * C + j] *= e[r];
        for (int64_t j0 = 0; j0 < i; j0 += KDA_NB) {
            float sa[KDA_NB], sp[KDA_NB];
            kda_block(Kp, D + j0, C, ki, qi, sa, sp);
            for (int u = 0; u < KDA_NB && j0 + u < i; u++) {
                A[i * C + j0 + u] = w->beta[i] * sa[u];
                P[i * C + j0 + u] = sp[u];
            }
        }
        float diag = 0.0f;
        for (int64_t r = 0; r < Kp; r++) {
            diag += qi[r] * ki[r];
            D[r * C + i] = ki[r];
        }
        P[i * C + i] = diag;
    }
}

/* W <- (I + A)^-1 W and U <- (I + A)^-1 U for the unit lower triangular I + A (A strictly lower,
 * [C][C]), rows 0..c-1. Blocks of FS_BLOCK rows: the earlier blocks' contribution is one matmul,
 * only the small triangles inside a block are row by row. */
static void forward_substitute(const float *A, float *W, int64_t Kp, float *U, int64_t Vp, int64_t c)
{
    const int64_t C = CHUNK;
    for (int64_t b0 = 0; b0 < c; b0 += FS_BLOCK) {
        if (b0 > 0) {
            matmul(FS_BLOCK, Kp, b0, -1.0f, A + b0 * C, C, W, Kp, W + b0 * Kp, Kp, 1, MM_FULL);
            matmul(FS_BLOCK, Vp, b0, -1.0f, A + b0 * C, C, U, Vp, U + b0 * Vp, Vp, 1, MM_FULL);
        }
        const int64_t b1 = b0 + FS_BLOCK < c ? b0 + FS_BLOCK : c;
        for (int64_t i = b0 + 1; i < b1; i++) {
            for (int64_t j = b0; j < i; j++) {
                const float a = A[i * C + j];
                for (int64_t r = 0; r < Kp; r++)
                    W[i * Kp + r] -= a * W[j * Kp + r];
                for (int64_t r = 0; r < Vp; r++)
                    U[i * Vp + r] -= a * U[j * Vp + r];
            }
        }
    }
}

static void chunk_item(void *ctxp, int64_t item, int thread)
{
    const chunk_ctx *ctx = (const chunk_ctx *)ctxp;
    const gdn_problem *p = ctx->p;
    const int64_t C = CHUNK, Kp = ctx->Kp, Vp = ctx->Vp, K = p->K, V = p->V;
    const int64_t n = item / p->HV, hv = item % p->HV;
    const int kda = p->gate_kind == GDN_GATE_KDA;
    const chunk_buf w = chunk_buf_carve(ctx->scratch + (size_t)thread * ctx->per_thread, Kp, Vp);
    int64_t b, bos, len;
    gdn_seq_bounds(p, n, &b, &bos, &len);

    memset(w.S, 0, (size_t)(Kp * Vp) * sizeof(float));
    if (p->state_in.data)
        for (int64_t r = 0; r < K; r++)
            gdn_ld_vec_f32(p->state_in.data, p->state_dtype, gdn_state_off(&p->state_in, n, hv, r, 0),
                           p->state_in.s[3], V, w.S + r * Vp);

    for (int64_t t0 = 0; t0 < len; t0 += C) {
        /* c tokens, computed as cp rows: a short last chunk costs what its length needs. */
        const int64_t c = len - t0 < C ? len - t0 : C, cp = (c + ROW_PAD - 1) / ROW_PAD * ROW_PAD;
        load_chunk(p, &w, Kp, Vp, b, bos + t0, c, cp, hv);
        if (kda)
            kda_pa(&w, Kp, c);
        else
            gdn_pa(&w, Kp, cp);

        /* exp(Gam) q, W = beta exp(Gam) k, U = beta v; then the forward substitution. KDA takes
         * exp(Gam_i) as the running product of exp(g) (in double, one row of factors per token),
         * as kda_pa does, instead of 2 K exponentials per token. */
        float *Qg = w.QW, *W = w.QW + C * Kp, *U = w.V;
        const float *Q = w.QK, *Kc = w.QK + C * Kp;
        double *run = w.row;
        for (int64_t r = 0; r < Kp; r++)
            run[r] = 1.0;
        for (int64_t i = 0; i < cp; i++) {
            const float bi = w.beta[i];
            if (kda) {
                for (int64_t r = 0; r < Kp; r++) {
                    run[r] *= w.eg[i * Kp + r];
                    const float e = (float)run[r];
                    Qg[i * Kp + r] = e * Q[i * Kp + r];
                    W[i * Kp + r] = bi * e * Kc[i * Kp + r];
                }
            } else {
                const float e = expf((float)w.gam[i]);
                for (int64_t r = 0; r < Kp; r++) {
                    Qg[i * Kp + r] = e * Q[i * Kp + r];
                    W[i * Kp + r] = bi * e * Kc[i * Kp + r];
                }
            }
            for (int64_t j = 0; j < Vp; j++)
                U[i * Vp + j] *= bi;
        }
        forward_substitute(w.PA + C * C, W, Kp, U, Vp, c);

        /* O = exp(Gam) q S, Vnew = U - W S, O += P Vnew. */
        float *WS = w.Y + C * Vp;
        matmul(cp, Vp, Kp, 1.0f, Qg, Kp, w.S, Vp, w.Y, Vp, 0, MM_FULL);
        matmul(cp, Vp, Kp, 1.0f, W, Kp, w.S, Vp, WS, Vp, 0, MM_FULL);
        for (int64_t i = 0; i < cp * Vp; i++)
            U[i] -= WS[i];
        matmul(cp, Vp, cp, 1.0f, w.PA, C, U, Vp, w.Y, Vp, 1, MM_LOWER_A);
        for (int64_t i = 0; i < c; i++)
            gdn_st_vec_f32(p->o.data, p->o.dtype, gdn_tok_off(&p->o, b, bos + t0 + i, hv, 0), p->o.s[3], V,
                           w.Y + i * Vp);

        /* S <- exp(Gam_C) S + (exp(Gam_C - Gam) k)^T Vnew, Gam_C the last token's row. KDA: run
         * holds exp(Gam_C) from the loop above (padding rows have exp(g) = 1), and
         * exp(Gam_C - Gam_i) is the running product of exp(g) from the end down to row i + 1. */
        if (kda) {
            for (int64_t r = 0; r < Kp; r++) {
                const float e = (float)run[r];
                for (int64_t j = 0; j < Vp; j++)
                    w.S[r * Vp + j] *= e;
                run[r] = 1.0;
            }
            for (int64_t i = cp - 1; i >= 0; i--) {
                for (int64_t r = 0; r < Kp; r++) {
                    w.Kt[r * C + i] = (float)run[r] * Kc[i * Kp + r];
                    run[r] *= w.eg[i * Kp + r];
                }
            }
        } else {
            const double gl = w.gam[c - 1];
            for (int64_t i = 0; i < cp; i++) {
                const float e = expf((float)(gl - w.gam[i]));
                for (int64_t r = 0; r < Kp; r++)
                    w.Kt[r * C + i] = e * Kc[i * Kp + r];
            }
            const float e = expf((float)gl);
            for (int64_t i = 0; i < Kp * Vp; i++)
                w.S[i] *= e;
        }
        matmul(Kp, Vp, cp, 1.0f, w.Kt, C, U, Vp, w.S, Vp, 1, MM_FULL);
    }

    if (p->final_state.data)
        for (int64_t r = 0; r < K; r++)
            gdn_st_vec_f32(p->final_state.data, p->state_dtype, gdn_state_off(&p->final_state, n, hv, r, 0),
                           p->final_state.s[3], V, w.S + r * Vp);
}

gdn_status gdn_cpu_chunk_fwd(const gdn_problem *p)
{
    if (p->q.dtype == GDN_DTYPE_F64)
        return gdn_cpu_recurrent_fwd(p);
    if (p->K < 1 || p->K > GDN_CPU_MAX_HEAD_DIM || p->V < 1 || p->V > GDN_CPU_MAX_HEAD_DIM)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "cpu chunk_fwd: head dims K = %lld, V = %lld (each 1 .. %d)",
                             (long long)p->K, (long long)p->V, GDN_CPU_MAX_HEAD_DIM);
    const int64_t items = p->N * p->HV;
    if (items == 0)
        return GDN_OK;
    chunk_ctx ctx;
    ctx.p = p;
    ctx.Kp = (p->K + PAD - 1) / PAD * PAD;
    ctx.Vp = (p->V + PAD - 1) / PAD * PAD;
    ctx.per_thread = chunk_buf_bytes(ctx.Kp, ctx.Vp);
    /* Per token and head: about 4 C (K + V) + 6 K V flops of products and substitution. */
    const double flops = (double)(p->B * p->T) * (double)p->HV *
                         (4.0 * CHUNK * (double)(p->K + p->V) + 6.0 * (double)(p->K * p->V));
    const int threads = gdn_cpu_threads_for(items, flops);
    const size_t bytes = (size_t)threads * ctx.per_thread;
    ctx.scratch = (unsigned char *)aligned_alloc(64, bytes);
    if (!ctx.scratch)
        return gdn_set_error(GDN_ERR_OUT_OF_MEMORY, "cpu chunk_fwd: cannot allocate %zu bytes of scratch", bytes);
    gdn_cpu_parallel_for(threads, items, chunk_item, &ctx);
    free(ctx.scratch);
    return GDN_OK;
}
