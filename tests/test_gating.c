/*
 * test_gating.c - gdn_gating on the CPU against the closed forms of GDN_MATH.md computed here in
 * double: GDN and KDA decays, the softplus threshold (beta_sp * x > threshold passes x through),
 * softplus_beta, KDA's lower_bound (safe gate), beta = sigmoid(b) and 2 * sigmoid(b) with
 * allow_neg_eigval, a / b / beta_out in f32, bf16 and f16, absent dt_bias and b, and a / b read
 * with strides from one fused [B, T, 2 * HV] projection.
 *   build/tests/test_gating [name-substring ...]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

typedef struct gate_spec {
    const char *label;
    gdn_gate_kind kind;
    int64_t B, T, HV, K;
    gdn_dtype a_dtype, beta_dtype;
    float a_std;               /* spread of a: large values cross the softplus threshold */
    int with_dt_bias, with_b, allow_neg_eigval, fused;
    float lower_bound, softplus_beta, softplus_threshold;
    const float *special;      /* values written over the first elements of a */
    int n_special;
} gate_spec;

static void run_gating(const gate_spec *s, uint64_t seed)
{
    tu_rng r = tu_rng_make(seed);
    int kda = s->kind == GDN_GATE_KDA;
    int64_t K = kda ? s->K : 1;
    size_t ntok = (size_t)(s->B * s->T), ng = ntok * (size_t)(s->HV * K), nb = ntok * (size_t)s->HV;

    float *a32 = tu_alloc(ng * sizeof(float)), *b32 = tu_alloc(nb * sizeof(float));
    tu_fill_normal(a32, ng, &r, 0.0f, s->a_std);
    for (int i = 0; i < s->n_special && (size_t)i < ng; i++)
        a32[i] = s->special[i];
    tu_round_array(a32, ng, s->a_dtype);
    tu_fill_normal(b32, nb, &r, 0.0f, 3.0f);
    tu_round_array(b32, nb, s->a_dtype);
    float A_log[64], dt_bias[64 * 256];
    for (int64_t j = 0; j < s->HV; j++)
        A_log[j] = (float)log(0.5 + 7.5 * tu_rng_uniform(&r));
    tu_fill_normal(dt_bias, (size_t)(s->HV * K), &r, 0.0f, 1.0f);

    /* a and b either contiguous, or interleaved per token in one [B, T, 2 * HV] buffer (GDN) */
    void *a_buf, *b_buf;
    gdn_tensor a_t, b_t;
    if (s->fused) {
        a_buf = tu_alloc_elems(s->a_dtype, 2 * nb);
        for (size_t p = 0; p < ntok; p++)
            for (int64_t j = 0; j < s->HV; j++) {
                tu_set(a_buf, s->a_dtype, p * 2 * (size_t)s->HV + (size_t)j, a32[p * (size_t)s->HV + (size_t)j]);
                tu_set(a_buf, s->a_dtype, p * 2 * (size_t)s->HV + (size_t)(s->HV + j), b32[p * (size_t)s->HV + (size_t)j]);
            }
        b_buf = NULL;
        int64_t shape[3] = {s->B, s->T, s->HV}, stride[3] = {s->T * 2 * s->HV, 2 * s->HV, 1};
        a_t = tu_tensor_strided(a_buf, s->a_dtype, 3, shape, stride);
        b_t = tu_tensor_strided((char *)a_buf + (size_t)s->HV * gdn_dtype_size(s->a_dtype), s->a_dtype, 3, shape,
                                stride);
    } else {
        a_buf = tu_alloc_elems(s->a_dtype, ng);
        tu_store_f32(a_buf, s->a_dtype, a32, ng);
        b_buf = tu_alloc_elems(s->a_dtype, nb);
        tu_store_f32(b_buf, s->a_dtype, b32, nb);
        a_t = kda ? TU_TENSOR(a_buf, s->a_dtype, s->B, s->T, s->HV, K) : TU_TENSOR(a_buf, s->a_dtype, s->B, s->T, s->HV);
        b_t = TU_TENSOR(b_buf, s->a_dtype, s->B, s->T, s->HV);
    }
    float *g = tu_alloc(ng * sizeof(float));
    void *beta = tu_alloc_elems(s->beta_dtype, nb);
    tu_poison(g, GDN_DTYPE_F32, ng);
    tu_poison(beta, s->beta_dtype, nb);

    gdn_gating_args args;
    memset(&args, 0, sizeof args);
    args.kind = s->kind;
    args.a = a_t;
    args.A_log = TU_TENSOR(A_log, GDN_DTYPE_F32, s->HV);
    if (s->with_dt_bias)
        args.dt_bias = kda ? TU_TENSOR(dt_bias, GDN_DTYPE_F32, s->HV, K) : TU_TENSOR(dt_bias, GDN_DTYPE_F32, s->HV);
    args.lower_bound = s->lower_bound;
    args.softplus_beta = s->softplus_beta;
    args.softplus_threshold = s->softplus_threshold;
    args.g_out = kda ? TU_TENSOR(g, GDN_DTYPE_F32, s->B, s->T, s->HV, K) : TU_TENSOR(g, GDN_DTYPE_F32, s->B, s->T, s->HV);
    if (s->with_b) {
        args.b = b_t;
        args.beta_out = TU_TENSOR(beta, s->beta_dtype, s->B, s->T, s->HV);
        args.allow_neg_eigval = s->allow_neg_eigval;
    }
    gdn_status st = gdn_gating(&args);
    if (!tu_expect(st == GDN_OK, "%s: %s (%s)", s->label, gdn_status_string(st), gdn_last_error()))
        goto done;

    double *g_ref = tu_alloc(ng * sizeof(double)), *beta_ref = tu_alloc(nb * sizeof(double));
    double worst_el = 0;
    size_t worst_i = 0;
    for (size_t i = 0; i < ng; i++) {
        size_t j = (i / (size_t)K) % (size_t)s->HV, rr = i % (size_t)K;
        double dt = s->with_dt_bias ? dt_bias[j * (size_t)K + rr] : 0.0;
        g_ref[i] = tu_gate_value(s->kind, a32[i], A_log[j], dt, s->lower_bound, s->softplus_beta,
                                 s->softplus_threshold);
        double e = fabs(g[i] - g_ref[i]) / fmax(fabs(g_ref[i]), 1e-30);
        if (e > worst_el || isnan(g[i])) {
            worst_el = isnan(g[i]) ? INFINITY : e;
            worst_i = i;
        }
    }
    char what[160];
    snprintf(what, sizeof what, "%s g", s->label);
    tu_check(what, tu_compare(g, GDN_DTYPE_F32, g_ref, GDN_DTYPE_F64, ng), 1e-6);
    /* element-wise as well: the threshold branch shows in single elements, not in an RMS */
    tu_expect(worst_el <= 1e-5, "%s: g[%zu] = %.9g, closed form %.9g (a = %.9g): element rel error %.3g", s->label,
              worst_i, (double)g[worst_i], g_ref[worst_i], (double)a32[worst_i], worst_el);
    if (s->with_b) {
        for (size_t i = 0; i < nb; i++)
            beta_ref[i] = tu_round(s->beta_dtype, (float)tu_beta_value(b32[i], s->allow_neg_eigval));
        snprintf(what, sizeof what, "%s beta", s->label);
        /* the reference is rounded to beta_out's dtype: only rare 1-ulp ties may differ */
        tu_check(what, tu_compare(beta, s->beta_dtype, beta_ref, GDN_DTYPE_F64, nb),
                 s->beta_dtype == GDN_DTYPE_F32 ? 1e-6 : 1e-3);
    } else {
        tu_expect(tu_count_poison(beta, s->beta_dtype, nb) == nb, "%s: beta_out absent but memory written", s->label);
    }
    free(g_ref);
    free(beta_ref);
done:
    free(a32);
    free(b32);
    free(a_buf);
    free(b_buf);
    free(g);
    free(beta);
}

static gate_spec base(const char *label, gdn_gate_kind kind)
{
    gate_spec s;
    memset(&s, 0, sizeof s);
    s.label = label;
    s.kind = kind;
    s.B = 2;
    s.T = 37;
    s.HV = 8;
    s.K = kind == GDN_GATE_KDA ? 64 : 1;
    s.a_std = 1.0f;
    s.with_dt_bias = 1;
    s.with_b = 1;
    return s;
}

static int test_gdn_gate(void)
{
    /* a + dt_bias around the default threshold 20, far above and far below */
    static const float special[] = {19.0f, 19.9f, 20.0f, 20.1f, 21.0f, 25.0f, 40.0f, -30.0f, -90.0f, 0.0f};
    gate_spec s = base("gdn f32", GDN_GATE_GDN);
    run_gating(&s, 1);
    s = base("gdn wide a (threshold region)", GDN_GATE_GDN);
    s.a_std = 15.0f;
    s.with_dt_bias = 0; /* so that the special values are exactly a + dt_bias */
    s.special = special;
    s.n_special = (int)(sizeof special / sizeof special[0]);
    run_gating(&s, 2);
    s = base("gdn bf16 a, bf16 beta", GDN_GATE_GDN);
    s.a_dtype = GDN_DTYPE_BF16;
    s.beta_dtype = GDN_DTYPE_BF16;
    run_gating(&s, 3);
    s = base("gdn f16 a, f16 beta", GDN_GATE_GDN);
    s.a_dtype = GDN_DTYPE_F16;
    s.beta_dtype = GDN_DTYPE_F16;
    run_gating(&s, 4);
    s = base("gdn no b", GDN_GATE_GDN);
    s.with_b = 0;
    run_gating(&s, 5);
    return TU_PASS;
}

static int test_softplus_params(void)
{
    /* beta_sp = 2, threshold = 5: x = 3 passes through (6 > 5) where softplus would give 3.0012 */
    static const float special[] = {3.0f, 2.4f, 2.6f, 2.5f, -3.0f, 10.0f};
    gate_spec s = base("softplus beta 2 threshold 5", GDN_GATE_GDN);
    s.softplus_beta = 2.0f;
    s.softplus_threshold = 5.0f;
    s.a_std = 4.0f;
    s.with_dt_bias = 0;
    s.special = special;
    s.n_special = (int)(sizeof special / sizeof special[0]);
    run_gating(&s, 10);
    s = base("softplus beta 0.5 default threshold", GDN_GATE_GDN);
    s.softplus_beta = 0.5f;
    s.a_std = 30.0f;
    run_gating(&s, 11);
    return TU_PASS;
}

static int test_kda_gate(void)
{
    gate_spec s = base("kda", GDN_GATE_KDA);
    run_gating(&s, 20);
    s = base("kda lower_bound -5", GDN_GATE_KDA);
    s.lower_bound = -5.0f;
    s.a_std = 3.0f;
    run_gating(&s, 21);
    s = base("kda lower_bound -0.5 bf16 a", GDN_GATE_KDA);
    s.lower_bound = -0.5f;
    s.a_dtype = GDN_DTYPE_BF16;
    run_gating(&s, 22);
    s = base("kda K=128 no dt_bias", GDN_GATE_KDA);
    s.K = 128;
    s.with_dt_bias = 0;
    run_gating(&s, 23);
    return TU_PASS;
}

static int test_beta(void)
{
    gate_spec s = base("allow_neg_eigval f32", GDN_GATE_GDN);
    s.allow_neg_eigval = 1;
    run_gating(&s, 30);
    s = base("allow_neg_eigval bf16", GDN_GATE_GDN);
    s.allow_neg_eigval = 1;
    s.a_dtype = GDN_DTYPE_BF16;
    s.beta_dtype = GDN_DTYPE_BF16;
    run_gating(&s, 31);
    return TU_PASS;
}

static int test_fused_strided(void)
{
    gate_spec s = base("a, b strided from fused [B, T, 2*HV]", GDN_GATE_GDN);
    s.fused = 1;
    run_gating(&s, 40);
    s.label = "a, b strided from fused bf16";
    s.a_dtype = GDN_DTYPE_BF16;
    run_gating(&s, 41);
    return TU_PASS;
}

int main(int argc, char **argv)
{
    static const tu_test tests[] = {
        {"gating_gdn", test_gdn_gate},
        {"gating_softplus_params", test_softplus_params},
        {"gating_kda", test_kda_gate},
        {"gating_beta", test_beta},
        {"gating_fused_strided", test_fused_strided},
    };
    return tu_main(tests, TU_COUNT(tests), argc, argv);
}
