/*
 * cpu_gating.c - the gating op on the CPU: raw a, b -> g (f32) and beta.
 *
 *   GDN  g = -exp(A_log[j]) * softplus(a + dt_bias[j])
 *   KDA  g[r] = -exp(A_log[j]) * softplus(a[r] + dt_bias[j, r]),
 *        or with lower_bound L: g[r] = L * sigmoid(exp(A_log[j]) * (a[r] + dt_bias[j, r]))
 *   beta = sigmoid(b), times 2 with allow_neg_eigval
 *
 * Evaluated in double and rounded once on store, through the same helpers (cpu_common.h) the
 * kernels use for in-kernel gating, so both routes give identical g and beta. Parallel over
 * tokens (one item per (b, t) row of HV x K gates).
 */
#include "cpu_common.h"

static void gating_row(void *ctx, int64_t item, int thread)
{
    const gdn_gating_problem *p = (const gdn_gating_problem *)ctx;
    int64_t b = item / p->T, t = item % p->T;
    (void)thread;
    for (int64_t hv = 0; hv < p->HV; hv++) {
        double A_log = p->A_log[hv];
        for (int64_t r = 0; r < p->K; r++) {
            double x = gdn_ld(p->a.data, p->a.dtype, b * p->a.s[0] + t * p->a.s[1] + hv * p->a.s[2] + r * p->a.s[3]);
            if (p->dt_bias.data)
                x += gdn_ld(p->dt_bias.data, p->dt_bias.dtype, hv * p->dt_bias.s[0] + r * p->dt_bias.s[1]);
            double g = gdn_gate_from_raw(p->kind, x, A_log, p->lower_bound, p->softplus_beta, p->softplus_threshold);
            gdn_st(p->g_out.data, p->g_out.dtype,
                   b * p->g_out.s[0] + t * p->g_out.s[1] + hv * p->g_out.s[2] + r * p->g_out.s[3], g);
        }
        if (p->b.data) {
            double logit = gdn_ld(p->b.data, p->b.dtype, b * p->b.s[0] + t * p->b.s[1] + hv * p->b.s[2]);
            gdn_st(p->beta_out.data, p->beta_out.dtype,
                   b * p->beta_out.s[0] + t * p->beta_out.s[1] + hv * p->beta_out.s[2],
                   gdn_beta_from_logit(logit, p->allow_neg_eigval));
        }
    }
}

gdn_status gdn_cpu_gating(const gdn_gating_problem *p)
{
    int64_t rows = p->B * p->T;
    /* About 40 flops of exp / log1p per gate. */
    int threads = gdn_cpu_threads_for(rows, 40.0 * (double)rows * (double)(p->HV * (p->K + 1)));
    gdn_cpu_parallel_for(threads, rows, gating_row, (void *)p);
    return GDN_OK;
}
