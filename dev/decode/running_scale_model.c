/*
 * running_scale_model.c - a plain-C model of the decode kernel's token loop, checking the
 * running decay scale of multi-token-running-scale.patch on the CPU (no GPU needed).
 *
 * One value head, K = 128 keys, NV rows of the state (S^T rows, as the VK tile holds them), f32
 * arithmetic as the kernel does it, against the recurrence of GDN_MATH.md in float64:
 *   direct:  main's token_step: d = S^T k, S^T q of the old state; u = beta (v - e d);
 *            o = e (S^T q) + u (k . q); s = fmaf(e, s, k u)
 *   scaled:  the patch: registers hold S~ = S / c; ce = c e, folded into S~ when outside
 *            [2^-20, 2^20]; u = beta (v - ce (S~^T k)); o = ce (S~^T q) + u (k . q);
 *            s~ = fmaf(k, u / ce, s~); every state leaving registers is ce * s~.
 * Both run in chunks of 8 tokens; with `tile` the state is stored (rounded to the state dtype)
 * and reloaded with c = 1 between chunks, as the bulk-copy kernel does; without it the state
 * stays in registers across chunks (the generic kernel).
 * Gates: logsigmoid(randn), and extreme patterns (exp(g) = 0, g = -60, -15, long runs of -3 and
 * -1.5, g = 0). Prints the worst relative RMS error (GDN_MATH.md's measure) of o, the per-step
 * states and the final state for each variant, and exits non-zero if any is not finite or above
 * 1e-5 (f32 state) / 1e-2 (bf16 state).
 *
 *   cc -O2 -std=c11 -ffp-contract=off dev/decode/running_scale_model.c -lm && ./a.out
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K 128
#define NV 8
#define TMAX 200
#define CHUNK 8

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double uniform(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
}

static double normal(void) { return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()); }

static float round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u)
        u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* One problem: inputs already rounded to f32, l2-normalised q (with scale) and k. */
typedef struct {
    int T;
    float q[TMAX][K], k[TMAX][K], v[TMAX][NV], g[TMAX], beta[TMAX], h0[NV][K];
} problem;

typedef struct {
    double o[TMAX][NV], s[TMAX][NV][K];
} result;

static void reference(const problem *p, result *r)
{
    double s[NV][K];
    for (int i = 0; i < NV; i++)
        for (int j = 0; j < K; j++)
            s[i][j] = p->h0[i][j];
    for (int t = 0; t < p->T; t++) {
        double e = exp((double)p->g[t]);
        for (int i = 0; i < NV; i++) {
            double d = 0, dq = 0;
            for (int j = 0; j < K; j++) {
                s[i][j] *= e;
                d += s[i][j] * p->k[t][j];
            }
            double u = p->beta[t] * (p->v[t][i] - d);
            for (int j = 0; j < K; j++) {
                s[i][j] += p->k[t][j] * u;
                dq += s[i][j] * p->q[t][j];
            }
            r->o[t][i] = dq;
            for (int j = 0; j < K; j++)
                r->s[t][i][j] = s[i][j];
        }
    }
}

/* The kernel's arithmetic: scaled = 0 for main, 1 for the patch; tile: state leaves registers
 * (rounded to bf16 when bf16) between chunks. */
static void kernel_model(const problem *p, int scaled, int tile, int bf16, result *r, int *folds)
{
    float s[NV][K], c = 1.0f;
    for (int i = 0; i < NV; i++)
        for (int j = 0; j < K; j++)
            s[i][j] = bf16 ? round_bf16(p->h0[i][j]) : p->h0[i][j];
    for (int t = 0; t < p->T; t++) {
        float e = expf(p->g[t]), ce = e, kq = 0;
        for (int j = 0; j < K; j++)
            kq = fmaf(p->q[t][j], p->k[t][j], kq);
        if (scaled) {
            ce = c * e;
            if (!(ce >= 0x1p-20f && ce <= 0x1p20f)) {
                for (int i = 0; i < NV; i++)
                    for (int j = 0; j < K; j++)
                        s[i][j] *= ce;
                ce = 1.0f;
                (*folds)++;
            }
            c = ce;
        }
        const float rc = 1.0f / ce;
        for (int i = 0; i < NV; i++) {
            float dk = 0, dq = 0;
            for (int j = 0; j < K; j++) {
                dk = fmaf(s[i][j], p->k[t][j], dk);
                dq = fmaf(s[i][j], p->q[t][j], dq);
            }
            const float u = p->beta[t] * (p->v[t][i] - ce * dk);
            r->o[t][i] = fmaf(ce, dq, u * kq);
            for (int j = 0; j < K; j++)
                s[i][j] = scaled ? fmaf(p->k[t][j], u * rc, s[i][j]) : fmaf(e, s[i][j], p->k[t][j] * u);
            for (int j = 0; j < K; j++) {
                const float st = scaled ? s[i][j] * c : s[i][j];
                r->s[t][i][j] = bf16 ? round_bf16(st) : st;
            }
        }
        if (tile && (t + 1) % CHUNK == 0) { /* the tile write-back and the next chunk's load */
            for (int i = 0; i < NV; i++)
                for (int j = 0; j < K; j++) {
                    const float st = scaled ? s[i][j] * c : s[i][j];
                    s[i][j] = bf16 ? round_bf16(st) : st;
                }
            c = 1.0f;
        }
    }
}

static double rel_rms(const double *x, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            return INFINITY;
        num += (x[i] - ref[i]) * (x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

enum { GATES_REAL, GATES_CYCLE, GATES_RUN3, GATES_RUN15, GATES_ZERO, GATES_N };
static const char *gate_names[] = {"logsigmoid(randn)", "cycle -inf,-60,-15,-3,-0.5,-1e-4,0", "g = -3 always",
                                   "g = -1.5 always", "g = 0 always"};

static void make_problem(problem *p, int T, int gates)
{
    static const float cyc[] = {-INFINITY, -60.0f, -15.0f, -3.0f, -0.5f, -1e-4f, 0.0f};
    p->T = T;
    for (int t = 0; t < T; t++) {
        double nq = 0, nk = 0, qv[K], kv[K];
        for (int j = 0; j < K; j++) {
            qv[j] = normal(), kv[j] = normal();
            nq += qv[j] * qv[j], nk += kv[j] * kv[j];
        }
        for (int j = 0; j < K; j++) {
            p->q[t][j] = (float)(qv[j] / sqrt(nq + 1e-6) / sqrt((double)K));
            p->k[t][j] = (float)(kv[j] / sqrt(nk + 1e-6));
        }
        for (int i = 0; i < NV; i++)
            p->v[t][i] = (float)normal();
        double z = normal();
        p->g[t] = gates == GATES_REAL    ? (float)(z < 0 ? z - log1p(exp(z)) : -log1p(exp(-z)))
                  : gates == GATES_CYCLE ? cyc[t % 7]
                  : gates == GATES_RUN3  ? -3.0f
                  : gates == GATES_RUN15 ? -1.5f
                                         : 0.0f;
        p->beta[t] = (float)uniform();
    }
    for (int i = 0; i < NV; i++)
        for (int j = 0; j < K; j++)
            p->h0[i][j] = (float)(0.3 * normal());
}

int main(void)
{
    static problem p;
    static result ref, out;
    static const int Ts[] = {1, 2, 4, 8, 9, 37, 200};
    double all[2][2] = {{0}}; /* [state bf16][patch]: worst over everything */
    int bad = 0;
    printf("worst relative RMS error vs float64 over T in {1, 2, 4, 8, 9, 37, 200}, 4 draws each\n");
    printf("%-36s %-4s %-4s | %-26s | %-26s %s\n", "gates", "path", "st", "main: o      steps    final",
           "patch: o     steps    final", "folds");
    for (int gates = 0; gates < GATES_N; gates++) {
        for (int tile = 1; tile >= 0; tile--) {
            for (int bf16 = 0; bf16 < 2; bf16++) {
                double worst[2][3] = {{0}};
                int folds_max = 0;
                for (unsigned ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                    const int T = Ts[ti];
                    for (int rep = 0; rep < 4; rep++) {
                        make_problem(&p, T, gates);
                        if (bf16)
                            for (int i = 0; i < NV; i++)
                                for (int j = 0; j < K; j++)
                                    p.h0[i][j] = round_bf16(p.h0[i][j]);
                        reference(&p, &ref);
                        for (int scaled = 0; scaled < 2; scaled++) {
                            int folds = 0;
                            kernel_model(&p, scaled, tile, bf16, &out, &folds);
                            if (folds > folds_max)
                                folds_max = folds;
                            const double err[3] = {rel_rms(&out.o[0][0], &ref.o[0][0], (size_t)T * NV),
                                                   rel_rms(&out.s[0][0][0], &ref.s[0][0][0], (size_t)T * NV * K),
                                                   rel_rms(&out.s[T - 1][0][0], &ref.s[T - 1][0][0], (size_t)NV * K)};
                            for (int m = 0; m < 3; m++) {
                                if (!(err[m] <= (bf16 ? 1e-2 : 1e-5)))
                                    bad = 1;
                                if (!(err[m] <= worst[scaled][m]))
                                    worst[scaled][m] = err[m];
                                if (!(err[m] <= all[bf16][scaled]))
                                    all[bf16][scaled] = err[m];
                            }
                        }
                    }
                }
                printf("%-36s %-4s %-4s | %.2e %.2e %.2e | %.2e %.2e %.2e %d\n", gate_names[gates],
                       tile ? "tile" : "regs", bf16 ? "bf16" : "f32", worst[0][0], worst[0][1], worst[0][2],
                       worst[1][0], worst[1][1], worst[1][2], folds_max);
            }
        }
    }
    printf("worst overall: f32 state main %.2e, patch %.2e; bf16 state main %.2e, patch %.2e\n", all[0][0],
           all[0][1], all[1][0], all[1][1]);
    printf("%s\n", bad ? "FAIL: an error above tolerance or not finite" : "all within tolerance");
    return bad;
}
