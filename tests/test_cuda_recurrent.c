/*
 * test_cuda_recurrent.c - the CUDA recurrent forward (decode / multi-token verify) and the CUDA
 * gating op, through the public API, against the harness's naive float64 recurrence.
 *
 * Every test builds host arguments exactly as a CPU test would (fresh random inputs, poisoned
 * outputs), mirrors every present tensor to the device (aliases stay aliases), runs the op there,
 * copies the outputs back and compares. Covered: T = 1..8 and 17, fixed and varlen (empty
 * sequences too), GVA, K / V in {64, 128, 256}, bf16 / f16 / f32 inputs, f32 / bf16 states, both
 * state layouts, in-kernel l2 norm and gating or precomputed g / beta, step_states, state pools
 * with 1-D / 2-D indices, num_accepted_tokens, in-place writes, padded slots and skipped slots,
 * q / k sliced from a fused projection, out-of-range device indices, CUDA graph capture. KDA gates
 * (a log decay per key channel) through the same cases: the kda_* tests.
 * Without a usable GPU it exits with TU_EXIT_SKIPPED (ctest: skipped).
 *   build/tests/test_cuda_recurrent [name-substring ...]
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"

/* Fresh inputs on every run; the seed is printed so that a failure can be replayed. */
static uint64_t g_seed;

static void mirror_args(tu_mirror *m, gdn_recurrent_fwd_args *a)
{
    gdn_tensor *ts[] = {&a->q, &a->k, &a->v, &a->o, &a->gate.g, &a->gate.a, &a->gate.A_log, &a->gate.dt_bias,
                        &a->gate.beta, &a->cu_seqlens, &a->state, &a->state_indices, &a->num_accepted_tokens,
                        &a->final_state, &a->step_states};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        tu_mirror_tensor(m, ts[i]);
}


static gdn_status run_cuda(gdn_recurrent_fwd_args a)
{
    tu_mirror m = {0};
    mirror_args(&m, &a);
    gdn_status st = gdn_recurrent_fwd(&a);
    if (st != GDN_OK)
        printf("    gdn_recurrent_fwd: %s (%s)\n", gdn_status_string(st), gdn_last_error());
    tu_mirror_back(&m);
    return st;
}

static int need_gpu(void)
{
    if (tu_cuda_device_count() > 0)
        return 1;
    tu_skip_reason("no CUDA device");
    return 0;
}

static double tol_o(gdn_dtype dt) { return dt == GDN_DTYPE_BF16 ? 6e-3 : dt == GDN_DTYPE_F16 ? 1.5e-3 : 2e-5; }
static double tol_state(gdn_dtype dt) { return dt == GDN_DTYPE_BF16 ? 6e-3 : 2e-5; }

static const char *dtn(gdn_dtype dt)
{
    return dt == GDN_DTYPE_BF16 ? "bf16" : dt == GDN_DTYPE_F16 ? "f16" : "f32";
}

/* ------------------------------------------------------------------------------------------ */
/* One case of the option matrix                                                               */

typedef struct opts {
    int64_t B, T, H, HV, K, V;
    int nseq;                 /* varlen when > 0 */
    int32_t seqlens[TU_MAX_SEQS];
    gdn_dtype dtype, state_dtype, beta_dtype;
    gdn_state_layout layout;
    int initial_state, l2norm, raw_gates, allow_neg_eigval, steps;
    int extreme_gates; /* overwrite g (raw_gates = 0) with the patterns of set_extreme_gates */
    float scale;
    gdn_gate_kind kind;
    float lower_bound; /* KDA with raw gates: FLA's safe gate */
} opts;

static void run_case(const opts *o, uint64_t seed)
{
    tu_case_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.B = o->B;
    cfg.T = o->T;
    cfg.H = o->H;
    cfg.HV = o->HV;
    cfg.K = o->K;
    cfg.V = o->V;
    cfg.nseq = o->nseq;
    memcpy(cfg.seqlens, o->seqlens, sizeof cfg.seqlens);
    cfg.dtype = o->dtype;
    cfg.beta_dtype = o->beta_dtype;
    cfg.state_dtype = o->state_dtype;
    cfg.layout = o->layout;
    cfg.kind = o->kind;
    cfg.lower_bound = o->lower_bound;
    cfg.initial_state = o->initial_state;
    cfg.l2norm = o->l2norm;
    cfg.raw_gates = o->raw_gates;
    cfg.allow_neg_eigval = o->allow_neg_eigval;
    cfg.scale = o->scale;
    cfg.seed = seed;
    tu_case c;
    tu_case_init(&c, &cfg);
    if (o->extreme_gates)
        tu_case_set_extreme_gates(&c);

    const tu_case_config *k = &c.c;
    size_t n_o = (size_t)(k->B * k->T * k->HV * k->V), n_ht = (size_t)c.state_numel;
    size_t n_steps = (size_t)(k->B * k->T * k->HV * k->K * k->V);
    double *o_ref = tu_alloc(n_o * sizeof(double)), *ht_ref = tu_alloc(n_ht * sizeof(double));
    double *steps_ref = tu_alloc((n_steps ? n_steps : 1) * sizeof(double));
    tu_case_naive(&c, o_ref, ht_ref, steps_ref);

    void *steps = tu_alloc_elems(k->state_dtype, n_steps ? n_steps : 1);
    tu_poison(steps, k->state_dtype, n_steps);
    tu_case_poison(&c);

    gdn_recurrent_fwd_args a = tu_case_recurrent_args(&c);
    if (o->steps)
        a.step_states = tu_case_state(&c, steps, k->state_dtype, k->B * k->T);

    char what[240];
    snprintf(what, sizeof what, "%sB%lld T%lld%s H%lld HV%lld K%lld V%lld %s state %s %s%s%s%s%s",
             o->kind == GDN_GATE_KDA ? "KDA " : "", (long long)k->B, (long long)k->T, o->nseq ? " varlen" : "", (long long)k->H, (long long)k->HV, (long long)k->K,
             (long long)k->V, dtn(k->dtype), dtn(k->state_dtype), k->layout == GDN_STATE_VK ? "VK" : "KV",
             o->l2norm ? " l2" : "", o->raw_gates ? " raw-gates" : "", o->initial_state ? " h0" : "",
             o->steps ? " steps" : "");
    if (o->extreme_gates)
        snprintf(what + strlen(what), sizeof what - strlen(what), " extreme-gates");
    if (o->lower_bound < 0.0f)
        snprintf(what + strlen(what), sizeof what - strlen(what), " lower_bound %g", (double)o->lower_bound);
    if (tu_expect(run_cuda(a) == GDN_OK, "%s: call failed", what)) {
        char w[280];
        snprintf(w, sizeof w, "%s: o", what);
        /* a bf16 state is rounded when it leaves registers: every 8 tokens on the fast path */
        double to = tol_o(k->dtype);
        if (k->state_dtype == GDN_DTYPE_BF16 && to < 1e-3)
            to = 1e-3;
        tu_check(w, tu_compare(c.o, k->dtype, o_ref, GDN_DTYPE_F64, n_o), to);
        snprintf(w, sizeof w, "%s: final_state", what);
        tu_check(w, tu_compare(c.ht, k->state_dtype, ht_ref, GDN_DTYPE_F64, n_ht), tol_state(k->state_dtype));
        if (o->steps) {
            snprintf(w, sizeof w, "%s: step_states", what);
            tu_check(w, tu_compare(steps, k->state_dtype, steps_ref, GDN_DTYPE_F64, n_steps),
                     tol_state(k->state_dtype));
        }
    }
    free(o_ref);
    free(ht_ref);
    free(steps_ref);
    free(steps);
    tu_case_free(&c);
}

static opts base_opts(void)
{
    opts o;
    memset(&o, 0, sizeof o);
    o.B = 3;
    o.T = 1;
    o.H = 2;
    o.HV = 4;
    o.K = 128;
    o.V = 128;
    o.dtype = GDN_DTYPE_BF16;
    o.beta_dtype = GDN_DTYPE_F32;
    o.state_dtype = GDN_DTYPE_F32;
    o.layout = GDN_STATE_VK;
    o.initial_state = 1;
    o.l2norm = 1;
    o.raw_gates = 1;
    return o;
}

/* Each axis of the scope swept with the others at engine defaults. */
static int test_matrix(void)
{
    if (!need_gpu())
        return TU_SKIP;
    uint64_t seed = g_seed;
    static const int64_t Ts[] = {1, 2, 3, 4, 8, 17};
    static const gdn_dtype dts[] = {GDN_DTYPE_BF16, GDN_DTYPE_F16, GDN_DTYPE_F32};
    static const gdn_dtype sds[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    static const int64_t KVs[][2] = {{64, 64}, {128, 128}, {256, 256}, {64, 128}, {128, 64}, {256, 64}};
    for (int li = 0; li < 2; li++) {
        for (int si = 0; si < 2; si++) {
            for (int di = 0; di < 3; di++) {
                for (int ti = 0; ti < 6; ti++) {
                    opts o = base_opts();
                    o.layout = li ? GDN_STATE_KV : GDN_STATE_VK;
                    o.state_dtype = sds[si];
                    o.dtype = dts[di];
                    o.T = Ts[ti];
                    o.steps = ti % 2 == 1;
                    run_case(&o, seed++);
                }
                for (int ki = 0; ki < 6; ki++) {
                    opts o = base_opts();
                    o.layout = li ? GDN_STATE_KV : GDN_STATE_VK;
                    o.state_dtype = sds[si];
                    o.dtype = dts[di];
                    o.K = KVs[ki][0];
                    o.V = KVs[ki][1];
                    /* T = 8 on tensor cores: K = 64 / V = 128 (two passes of an f32 tile), K = 128 / V = 64
                     * (single-token calls at K = 64, V = 128: test_single_token_paths) */
                    o.T = ki == 0 ? 1 : ki < 3 ? 4 : 8;
                    run_case(&o, seed++);
                }
            }
        }
    }
    return TU_PASS;
}

/* Gate and norm options, GVA ratios, no initial state, beta dtypes; again on the tensor-core
 * path. */
static int test_options(void)
{
    if (!need_gpu())
        return TU_SKIP;
    uint64_t seed = g_seed + 1000;
    for (int v = 0; v < 16; v++) {
        opts o = base_opts();
        o.T = v % 4 == 0 ? 1 : 1 + v % 5;
        o.l2norm = v & 1;
        o.raw_gates = (v >> 1) & 1;
        o.allow_neg_eigval = o.raw_gates && (v >> 2) & 1;
        o.initial_state = v % 3 != 0;
        o.beta_dtype = v % 5 == 0 ? GDN_DTYPE_BF16 : v % 5 == 1 ? GDN_DTYPE_F16 : GDN_DTYPE_F32;
        o.H = v % 4 == 3 ? 4 : v % 4 == 2 ? 1 : 2; /* G = 1, 4, 2 */
        o.HV = 4;
        o.scale = v % 7 == 0 ? 0.3f : 0.0f;
        o.layout = v & 8 ? GDN_STATE_KV : GDN_STATE_VK;
        o.state_dtype = v % 6 == 5 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        run_case(&o, seed++);
    }
    /* the same options on the tensor-core path (VK, 8 tokens; 12 with two chunks) */
    for (int v = 0; v < 8; v++) {
        opts o = base_opts();
        o.T = v == 5 ? 12 : 8;
        o.l2norm = v & 1;
        o.raw_gates = (v >> 1) & 1;
        o.allow_neg_eigval = o.raw_gates && (v >> 2) & 1;
        o.initial_state = v % 3 != 0;
        o.beta_dtype = v % 3 == 0 ? GDN_DTYPE_BF16 : v % 3 == 1 ? GDN_DTYPE_F16 : GDN_DTYPE_F32;
        o.H = v % 3 == 0 ? 4 : v % 3 == 1 ? 1 : 2;
        o.scale = v % 4 == 1 ? 0.3f : 0.0f;
        o.state_dtype = v % 2 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        o.dtype = v == 6 ? GDN_DTYPE_F32 : v == 3 ? GDN_DTYPE_F16 : GDN_DTYPE_BF16;
        run_case(&o, seed++);
    }
    return TU_PASS;
}

/* Decays of exp(g) = 0, very strong, and long runs of strong ones (the running decay scale of
 * the CUDA-core kernels folds back into the state; the tensor-core path's decay products reach
 * 0), over several chunks of tokens, every path, both state dtypes, with and without per-step
 * states. */
static void extreme_gates_cases(gdn_gate_kind kind, uint64_t seed)
{
    for (int v = 0; v < 12; v++) {
        opts o = base_opts();
        o.kind = kind;
        o.raw_gates = 0;
        o.extreme_gates = 1;
        o.T = v % 2 ? 37 : 9;
        o.layout = v & 2 && v < 8 ? GDN_STATE_KV : GDN_STATE_VK;
        o.state_dtype = v & 4 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        o.dtype = v & 4 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        o.steps = v < 8; /* without: the tensor-core path (VK, K <= 128) */
        if (v >= 10)
            o.K = o.V = 64;
        run_case(&o, seed++);
    }
}

static int test_extreme_gates(void)
{
    if (!need_gpu())
        return TU_SKIP;
    extreme_gates_cases(GDN_GATE_GDN, g_seed + 1500);
    return TU_PASS;
}

/* Six packed sequences of 9 tokens on average (one empty): varlen calls on the tensor-core path. */
static const int32_t MMA_VARLEN_LENS[6] = {9, 0, 12, 8, 17, 8};

/* Packed sequences of unequal (and zero) length; larger batches. */
static int test_varlen_and_batch(void)
{
    if (!need_gpu())
        return TU_SKIP;
    uint64_t seed = g_seed + 2000;
    static const int32_t lens[][6] = {{1, 1, 1, 1, 1, 1}, {3, 0, 5, 1, 8, 2}, {17, 4, 0, 0, 9, 1}};
    for (int v = 0; v < 6; v++) {
        opts o = base_opts();
        o.nseq = 6;
        memcpy(o.seqlens, lens[v % 3], sizeof lens[0]);
        o.layout = v < 3 ? GDN_STATE_VK : GDN_STATE_KV;
        o.state_dtype = v % 2 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        o.steps = v % 3 == 1;
        run_case(&o, seed++);
    }
    for (int v = 0; v < 2; v++) {
        opts o = base_opts();
        o.nseq = 6;
        memcpy(o.seqlens, MMA_VARLEN_LENS, sizeof MMA_VARLEN_LENS);
        o.state_dtype = v ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        o.initial_state = v == 0;
        run_case(&o, seed++);
    }
    for (int v = 0; v < 4; v++) {
        opts o = base_opts();
        o.B = v < 2 ? 64 : 9;
        o.T = v < 2 ? 1 : 4;
        o.H = 16;
        o.HV = 32;
        o.state_dtype = v % 2 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        run_case(&o, seed++);
    }
    return TU_PASS;
}

/* q and k sliced out of one fused [B, T, 2 * H * K + HV * V] projection, v too; and q / k with
 * an element stride of 2 (the element-wise path). */
static int test_strided_inputs(void)
{
    if (!need_gpu())
        return TU_SKIP;
    for (int v = 0; v < 4; v++) {
        tu_case_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.B = 3, cfg.T = v < 2 ? 3 : 1, cfg.H = 2, cfg.HV = 4, cfg.K = 128, cfg.V = 64;
        cfg.dtype = GDN_DTYPE_BF16, cfg.beta_dtype = GDN_DTYPE_F32, cfg.state_dtype = GDN_DTYPE_F32;
        cfg.layout = GDN_STATE_VK, cfg.initial_state = 1, cfg.l2norm = 1, cfg.raw_gates = 1;
        cfg.seed = g_seed + 3000 + (uint64_t)v;
        tu_case c;
        tu_case_init(&c, &cfg);
        int64_t B = cfg.B, T = cfg.T, HV = cfg.HV, V = cfg.V;
        double *o_ref = tu_alloc((size_t)(B * T * HV * V) * sizeof(double));
        double *ht_ref = tu_alloc((size_t)c.state_numel * sizeof(double));
        tu_case_naive(&c, o_ref, ht_ref, NULL);
        gdn_recurrent_fwd_args a = tu_case_recurrent_args(&c);
        unsigned char *fused = tu_case_fused_qkv(&c, v % 2 == 0 ? 1 : 2, &a.q, &a.k, &a.v); /* q / k element stride */
        const char *what = (const char *[]){"fused qkv projection", "q/k element stride 2", "fused qkv projection T=1",
                                            "q/k element stride 2 T=1"}[v];
        if (tu_expect(run_cuda(a) == GDN_OK, "%s: call failed", what)) {
            char w[120];
            snprintf(w, sizeof w, "%s: o", what);
            tu_check(w, tu_compare(c.o, cfg.dtype, o_ref, GDN_DTYPE_F64, (size_t)(B * T * HV * V)), tol_o(cfg.dtype));
            snprintf(w, sizeof w, "%s: final_state", what);
            tu_check(w, tu_compare(c.ht, cfg.state_dtype, ht_ref, GDN_DTYPE_F64, (size_t)c.state_numel), 2e-5);
        }
        free(fused);
        free(o_ref);
        free(ht_ref);
        tu_case_free(&c);
    }
    return TU_PASS;
}

/* Single-token calls on VK states, small grids and large ones (the fast path is launched with or
 * without programmatic dependent launch by grid size): both state dtypes, K = 64 / 128 / 256,
 * GVA, per-step states, no initial state, f32 inputs; varlen calls with T <= N (sequences of 0, 1
 * and 3 tokens). */
static int test_single_token_paths(void)
{
    if (!need_gpu())
        return TU_SKIP;
    uint64_t seed = g_seed + 2500;
    static const int64_t Ks[] = {64, 128, 256};
    for (int v = 0; v < 12; v++) {
        opts o = base_opts();
        o.state_dtype = v & 1 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        o.K = o.V = Ks[(v / 2) % 3];
        o.steps = v % 3 == 0;
        o.initial_state = v % 5 != 4;
        o.dtype = v % 4 == 3 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
        o.H = v < 6 ? 2 : 1;
        if (v >= 6) { /* 2560 (sequence, value head) pairs: several waves of CTAs */
            o.B = 160, o.HV = 16, o.K = 64, o.V = v < 9 ? 64 : 128;
            o.steps = 0;
        }
        run_case(&o, seed++);
    }
    static const int32_t lens[][6] = {{3, 0, 1, 0, 0, 1}, {1, 1, 0, 1, 1, 1}};
    for (int v = 0; v < 4; v++) {
        opts o = base_opts();
        o.nseq = 6;
        memcpy(o.seqlens, lens[v % 2], sizeof lens[0]);
        o.state_dtype = v < 2 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
        o.steps = v != 1;
        run_case(&o, seed++);
    }
    return TU_PASS;
}

/* Multi-token calls on at least 2560 tiles of a (sequence, value head) (several waves of CTAs):
 * both state dtypes, per-step states, two chunks of tokens, no initial state, varlen with empty
 * sequences; then 3 tokens of a bf16 state on 512 pairs (the tensor-core path). */
static int test_multi_token_paths(void)
{
    if (!need_gpu())
        return TU_SKIP;
    uint64_t seed = g_seed + 2700;
    for (int v = 0; v < 4; v++) {
        opts o = base_opts();
        o.H = 16, o.HV = 32;
        o.B = v == 0 ? 40 : 80;          /* f32 K = 128: 2 tiles per head; K = 64: 1 */
        o.K = o.V = v == 0 ? 128 : 64;
        o.T = v == 1 ? 9 : v == 3 ? 2 : v == 2 ? 5 : 3; /* 5: the tensor-core path */
        o.state_dtype = v == 1 || v == 3 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        o.steps = v < 2;
        o.initial_state = v != 2;
        run_case(&o, seed++);
    }
    opts o3 = base_opts();
    o3.H = 16, o3.HV = 32, o3.B = 16, o3.K = o3.V = 128, o3.T = 3;
    o3.state_dtype = GDN_DTYPE_BF16;
    run_case(&o3, seed++);
    opts o = base_opts();
    o.H = 16, o.HV = 128;
    o.nseq = 16;
    static const int32_t lens[16] = {2, 0, 3, 9, 1, 2, 0, 4, 2, 2, 5, 1, 3, 2, 0, 2};
    memcpy(o.seqlens, lens, sizeof lens);
    o.steps = 1;
    run_case(&o, seed++);
    return TU_PASS;
}

/* ------------------------------------------------------------------------------------------ */
/* State pools                                                                                 */

/* One pool call (tu_pool_run, which test_state_pool.c runs on the CPU) on bf16 inputs, H = 2,
 * HV = 4, V = 128, in-kernel gating of the given kind (KDA: with lower_bound on odd seeds). */
static void run_pool(const tu_pool_spec *s, int64_t K, uint64_t seed, gdn_gate_kind kind)
{
    tu_case_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.H = 2, cfg.HV = 4, cfg.K = K, cfg.V = 128;
    cfg.dtype = GDN_DTYPE_BF16, cfg.beta_dtype = GDN_DTYPE_F32;
    cfg.l2norm = 1, cfg.raw_gates = 1;
    cfg.kind = kind;
    cfg.lower_bound = kind == GDN_GATE_KDA && seed % 2 ? -5.0f : 0.0f;
    tu_pool_run(s, &cfg, seed, run_cuda, tol_o(cfg.dtype), tol_state(s->state_dtype));
}

static void pool_decode_cases(gdn_gate_kind kind, uint64_t seed)
{
    for (int v = 0; v < 10; v++) {
        tu_pool_spec s;
        memset(&s, 0, sizeof s);
        s.label = (const char *[]){"pool T=1 VK f32",       "pool T=1 VK bf16",      "pool T=1 KV f32",
                                   "pool T=1 null_slot_zero", "pool T=3 VK f32 steps", "pool read-only T=2",
                                   "pool T=8 VK f32 (tensor cores)", "pool T=9 VK bf16 null_slot_zero (tensor cores)",
                                   "pool T=1 KV bf16, odd slot padding", "pool T=1 KV bf16 (value column pairs)"}[v];
        s.N = 5;
        s.T = v == 4 ? 3 : v == 5 ? 2 : v == 6 ? 8 : v == 7 ? 9 : 1;
        s.P = 9;
        s.idx[0][0] = 5;
        s.idx[1][0] = 2;
        s.idx[2][0] = -1; /* PAD_SLOT_ID: skipped */
        s.idx[3][0] = 0;  /* live, unless null_slot_zero */
        s.idx[4][0] = 9;  /* >= P: a device index the host cannot check; skipped */
        s.null_slot_zero = v == 3 || v == 7;
        s.inplace = v != 5;
        s.with_final = v != 1 && v != 7;
        s.with_steps = v == 4 || v == 5 || v == 9;
        s.layout = v == 2 || v >= 8 ? GDN_STATE_KV : GDN_STATE_VK;
        s.state_dtype = v == 1 || v == 7 || v >= 8 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        /* 6: VK slots not 16-byte aligned (the element-wise generic path); 3: odd KV slot padding */
        s.pad = v == 4 ? 6 : v == 8 ? 3 : 40;
        run_pool(&s, v == 2 ? 64 : 128, seed + (uint64_t)v, kind);
    }
}

static int test_pool_decode(void)
{
    if (!need_gpu())
        return TU_SKIP;
    pool_decode_cases(GDN_GATE_GDN, g_seed + 4000);
    return TU_PASS;
}

static void pool_spec_verify_cases(gdn_gate_kind kind, uint64_t seed)
{
    static const int32_t idx[6][4] = {
        {1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, -1, 12}, /* a negative per-step slot skips one write */
        {13, 14, 15, 16}, {17, -1, 19, 20}, {21, 22, 99, 23}, /* 99 >= P skips one write */
    };
    static const int32_t nat[6] = {1, 3, 2, 0, 2, 4}; /* seq 3: 0 accepted: skipped; seq 4 starts at -1 */
    for (int v = 0; v < 6; v++) {
        tu_pool_spec s;
        memset(&s, 0, sizeof s);
        s.label = (const char *[]){"verify 2-D + num_accepted VK f32", "verify 2-D + num_accepted VK bf16",
                                   "verify 2-D + num_accepted KV f32", "verify 2-D without num_accepted",
                                   "2-D + num_accepted T=1 VK f32", "2-D + num_accepted T=1 VK bf16"}[v];
        s.N = 6;
        s.T = v < 4 ? 4 : 1;
        s.cols = 4;
        s.P = 24;
        s.rank2 = 1;
        for (int n = 0; n < 6; n++)
            memcpy(s.idx[n], idx[n], sizeof idx[n]);
        memcpy(s.nat, nat, sizeof nat);
        s.use_nat = v < 3 || v >= 4;
        s.inplace = 1;
        s.with_final = 1;
        s.with_steps = v != 1 && v != 5;
        s.layout = v == 2 ? GDN_STATE_KV : GDN_STATE_VK;
        s.state_dtype = v == 1 || v == 5 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        s.pad = 32;
        run_pool(&s, 128, seed + (uint64_t)v, kind);
    }
}

static int test_pool_spec_verify(void)
{
    if (!need_gpu())
        return TU_SKIP;
    pool_spec_verify_cases(GDN_GATE_GDN, g_seed + 5000);
    return TU_PASS;
}

/* A 2-D pool with num_accepted_tokens, skipped writes and a skipped sequence, on 3 x 1024
 * (sequence, value head) pairs: several waves of CTAs. */
static int test_pool_verify_many_heads(void)
{
    if (!need_gpu())
        return TU_SKIP;
    for (int v = 0; v < 2; v++) {
        tu_pool_spec s;
        memset(&s, 0, sizeof s);
        s.label = v ? "verify 2-D, 1024 heads, bf16" : "verify 2-D, 1024 heads, f32";
        s.N = 3;
        s.T = 3;
        s.cols = 3;
        s.P = 10;
        s.rank2 = 1;
        static const int32_t idx[3][3] = {{1, 2, 3}, {4, -1, 5}, {6, 7, 99}}; /* seq 2 reads 99 >= P: skipped */
        static const int32_t nat[3] = {2, 1, 3};
        for (int n = 0; n < 3; n++)
            memcpy(s.idx[n], idx[n], sizeof idx[n]);
        memcpy(s.nat, nat, sizeof nat);
        s.use_nat = 1;
        s.inplace = 1;
        s.with_final = 1;
        s.with_steps = 1;
        s.layout = GDN_STATE_VK;
        s.state_dtype = v ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        s.pad = 16;
        tu_case_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.H = 2, cfg.HV = 1024, cfg.K = 64, cfg.V = 64;
        cfg.dtype = GDN_DTYPE_BF16, cfg.beta_dtype = GDN_DTYPE_F32;
        cfg.l2norm = 1, cfg.raw_gates = 1;
        tu_pool_run(&s, &cfg, g_seed + 5500 + (uint64_t)v, run_cuda, tol_o(cfg.dtype), tol_state(s.state_dtype));
    }
    return TU_PASS;
}

/* Device index tensors the host cannot check: cu_seqlens out of order and out of range, huge
 * and negative slots. The call must stay in bounds (compute-sanitizer runs this test). */
static void bad_device_indices_case(gdn_gate_kind kind, uint64_t seed)
{
    int32_t lens[4] = {2, 3, 1, 2};
    tu_case_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.kind = kind;
    cfg.nseq = 4;
    memcpy(cfg.seqlens, lens, sizeof lens);
    cfg.H = 2, cfg.HV = 4, cfg.K = 128, cfg.V = 128;
    cfg.dtype = GDN_DTYPE_BF16, cfg.beta_dtype = GDN_DTYPE_F32, cfg.state_dtype = GDN_DTYPE_F32;
    cfg.layout = GDN_STATE_VK, cfg.initial_state = 1, cfg.l2norm = 1, cfg.raw_gates = 1, cfg.seed = seed;
    tu_case c;
    tu_case_init(&c, &cfg);
    int32_t bad_cu[5] = {0, 7, 3, -5, 1000};
    int32_t idx[4][2] = {{1, 2}, {2147483647, 0}, {-2147483647 - 1, 3}, {3, 1}};
    int32_t nat[4] = {2, 1, 1, 7};
    int64_t P = 4;
    size_t slot_elems = (size_t)(cfg.HV * cfg.K * cfg.V);
    float *pool = tu_alloc((size_t)P * slot_elems * sizeof(float));
    for (size_t i = 0; i < (size_t)P * slot_elems; i++)
        pool[i] = 0.01f * (float)(i % 97);
    gdn_recurrent_fwd_args a = tu_case_recurrent_args(&c);
    a.cu_seqlens = TU_TENSOR(bad_cu, GDN_DTYPE_I32, 5);
    a.state = TU_TENSOR(pool, GDN_DTYPE_F32, P, cfg.HV, cfg.V, cfg.K);
    a.state_indices = TU_TENSOR(idx, GDN_DTYPE_I32, 4, 2);
    a.num_accepted_tokens = TU_TENSOR(nat, GDN_DTYPE_I32, 4);
    a.inplace_state = 1;
    tu_expect(run_cuda(a) == GDN_OK, "%sgarbage device indices: the call must still succeed",
              kind == GDN_GATE_KDA ? "KDA " : "");
    free(pool);
    tu_case_free(&c);
}

static int test_bad_device_indices(void)
{
    if (!need_gpu())
        return TU_SKIP;
    bad_device_indices_case(GDN_GATE_GDN, g_seed + 6000);
    return TU_PASS;
}

/* The call captured in a CUDA graph (no allocation, no sync), replayed on fresh inputs: replays
 * read the current contents of the captured buffers. T = 2 and T = 1 (a small grid: launched with
 * programmatic stream serialization). */
static int test_graph_capture(void)
{
    if (!need_gpu())
        return TU_SKIP;
    tu_case_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.B = 8, cfg.T = 2, cfg.H = 2, cfg.HV = 4, cfg.K = 128, cfg.V = 128;
    cfg.dtype = GDN_DTYPE_BF16, cfg.beta_dtype = GDN_DTYPE_F32, cfg.state_dtype = GDN_DTYPE_F32;
    cfg.layout = GDN_STATE_VK, cfg.initial_state = 1, cfg.l2norm = 1, cfg.raw_gates = 1;
    for (int round = 0; round < 2; round++) {
        cfg.seed = g_seed + 7000 + (uint64_t)round;
        cfg.T = round ? 1 : 2;
        tu_case c;
        tu_case_init(&c, &cfg);
        size_t n_o = (size_t)(cfg.B * cfg.T * cfg.HV * cfg.V);
        double *o_ref = tu_alloc(n_o * sizeof(double)), *ht_ref = tu_alloc((size_t)c.state_numel * sizeof(double));
        tu_case_naive(&c, o_ref, ht_ref, NULL);
        gdn_recurrent_fwd_args a = tu_case_recurrent_args(&c);
        tu_mirror m = {0};
        mirror_args(&m, &a);
        cudaStream_t stream;
        TU_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        a.stream = stream;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        TU_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        gdn_status st = gdn_recurrent_fwd(&a);
        TU_CUDA_OK(cudaStreamEndCapture(stream, &graph));
        if (tu_expect(st == GDN_OK, "capture: %s (%s)", gdn_status_string(st), gdn_last_error())) {
            TU_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
            TU_CUDA_OK(cudaGraphLaunch(exec, stream));
            TU_CUDA_OK(cudaStreamSynchronize(stream));
            TU_CUDA_OK(cudaGraphExecDestroy(exec));
        }
        TU_CUDA_OK(cudaGraphDestroy(graph));
        TU_CUDA_OK(cudaStreamDestroy(stream));
        tu_mirror_back(&m);
        tu_check("graph replay: o", tu_compare(c.o, cfg.dtype, o_ref, GDN_DTYPE_F64, n_o), tol_o(cfg.dtype));
        tu_check("graph replay: final_state",
                 tu_compare(c.ht, cfg.state_dtype, ht_ref, GDN_DTYPE_F64, (size_t)c.state_numel), 2e-5);
        free(o_ref);
        free(ht_ref);
        tu_case_free(&c);
    }
    return TU_PASS;
}

/* ------------------------------------------------------------------------------------------ */
/* KDA gates (a log decay per key channel): both CUDA-core paths and the tensor-core path       */

/* The gate options of KDA case v: precomputed g and beta, in-kernel softplus gate with beta from
 * logits, or FLA's safe gate (lower_bound -5 or -1). */
static void kda_gates(opts *o, int v)
{
    o->kind = GDN_GATE_KDA;
    o->raw_gates = v % 3 != 0;
    o->lower_bound = v % 3 == 2 ? (v % 2 ? -1.0f : -5.0f) : 0.0f;
}

/* The head counts of KDA models and their tensor-parallel shards (Kimi Linear 32, Kimi K3 96 and
 * TP8's 12, 64, 4), GVA ratios 1 to 4, K = V = 128 and 64, T = 1, 2, 4, 8 and 19 (three chunks of
 * staged tokens), both layouts and state dtypes. */
static int test_kda_heads(void)
{
    if (!need_gpu())
        return TU_SKIP;
    uint64_t seed = g_seed + 9000;
    static const int64_t hv_h[][2] = {{4, 1}, {12, 4}, {32, 16}, {64, 64}, {96, 32}};
    static const int64_t Ts[] = {1, 2, 4, 8, 19};
    for (int ki = 0; ki < 2; ki++) {
        for (int hi = 0; hi < 5; hi++) {
            opts o = base_opts();
            o.B = 2;
            o.K = o.V = ki ? 64 : 128;
            o.HV = hv_h[hi][0], o.H = hv_h[hi][1];
            o.T = Ts[(hi + ki) % 5];
            kda_gates(&o, hi + 2 * ki);
            o.layout = (hi + ki) % 2 ? GDN_STATE_KV : GDN_STATE_VK;
            o.state_dtype = hi == 3 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
            run_case(&o, seed++);
        }
    }
    return TU_PASS;
}

/* Every token count of speculative verify and a longer call on HV = 32, each gate option, both
 * layouts and state dtypes, per-step states on half of them (without, on VK states from 4 tokens
 * on: the tensor-core path, T = 19 in three chunks); K = 64 with V = 128 (two row passes). */
static int test_kda_tokens(void)
{
    if (!need_gpu())
        return TU_SKIP;
    uint64_t seed = g_seed + 9100;
    static const int64_t Ts[] = {1, 2, 3, 4, 8, 19};
    for (int li = 0; li < 2; li++) {
        for (int si = 0; si < 2; si++) {
            for (int ti = 0; ti < 6; ti++) {
                opts o = base_opts();
                o.H = 16, o.HV = 32;
                o.T = Ts[ti];
                kda_gates(&o, ti + li);
                o.layout = li ? GDN_STATE_KV : GDN_STATE_VK;
                o.state_dtype = si ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
                o.steps = (ti + si) % 2 == 1;
                if (ti == 5 && si == 0)
                    o.K = 64;
                run_case(&o, seed++);
            }
        }
    }
    return TU_PASS;
}

/* The wide tensor-core tile (KDA with an f32 state at K = 128, calls of at least 8 tokens per
 * sequence): each gate option (precomputed, softplus, safe gate) at T = 8 and 19 (three chunks, the
 * state kept in the tile between them), with and without an initial state; varlen sequences of 9
 * tokens on average (an empty one among them); V = 64 (the wide instance launched at 64 rows and 4
 * warps) and V = 256 (two CTAs per value head). */
static int test_kda_wide(void)
{
    if (!need_gpu())
        return TU_SKIP;
    uint64_t seed = g_seed + 9800;
    for (int v = 0; v < 6; v++) {
        opts o = base_opts();
        o.T = v < 3 ? 8 : 19;
        kda_gates(&o, v);
        o.initial_state = v != 1;
        run_case(&o, seed++);
    }
    for (int v = 0; v < 3; v++) {
        opts o = base_opts();
        o.nseq = 6;
        memcpy(o.seqlens, MMA_VARLEN_LENS, sizeof MMA_VARLEN_LENS);
        kda_gates(&o, v);
        run_case(&o, seed++);
    }
    for (int v = 0; v < 2; v++) {
        opts o = base_opts();
        o.T = 8;
        o.V = v ? 256 : 64;
        kda_gates(&o, v + 1);
        run_case(&o, seed++);
    }
    return TU_PASS;
}

/* The tensor-core path's short chunks (KDA calls of at most 4 tokens per sequence that take the
 * path: 4 tokens on at least 128 (sequence, value head) pairs, 3 with a bf16 state on 256): each gate
 * option at T = 4 and at T = 3 (bf16), both state dtypes, with and without an initial state (the
 * bf16 cases in 128-row tiles, two row passes); K = 64 in 64-row tiles and, at 1024 and 2048 pairs,
 * in 128-row tiles (two passes, f32 and bf16); V = 256 (four CTAs per value head); decays of 0 and 1
 * (extreme gates); f16 and f32 inputs without L2 norm, a scale, bf16 beta and negative eigenvalues;
 * varlen calls of 3-4 tokens per sequence on average whose sequences take 0 to 3 chunks (the state
 * kept in the tile between them). */
static int test_kda_short(void)
{
    if (!need_gpu())
        return TU_SKIP;
    uint64_t seed = g_seed + 9900;
    for (int v = 0; v < 9; v++) {
        opts o = base_opts();
        kda_gates(&o, v);
        o.H = 16, o.HV = 32;
        o.state_dtype = v % 2 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        o.T = v < 6 ? 4 : 3;
        if (v >= 6)
            o.state_dtype = GDN_DTYPE_BF16;
        o.B = o.state_dtype == GDN_DTYPE_BF16 ? 64 : 4;
        o.initial_state = v % 4 != 1;
        run_case(&o, seed++);
    }
    for (int v = 0; v < 7; v++) {
        opts o = base_opts();
        kda_gates(&o, v);
        o.H = 16, o.HV = 32, o.B = 4, o.T = 4;
        if (v == 0) {
            o.K = o.V = 64;
        } else if (v == 1 || v == 2) { /* 128-row tiles of K = 64 */
            o.K = 64;
            o.B = v == 1 ? 32 : 64;
            o.state_dtype = v == 1 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
        } else if (v == 3) {
            o.V = 256;
        } else if (v == 4) {
            o.raw_gates = 0, o.lower_bound = 0.0f, o.extreme_gates = 1;
        } else {
            o.dtype = v == 5 ? GDN_DTYPE_F16 : GDN_DTYPE_F32;
            o.l2norm = 0;
            o.scale = 0.3f;
            o.beta_dtype = GDN_DTYPE_BF16;
            o.allow_neg_eigval = o.raw_gates;
        }
        run_case(&o, seed++);
    }
    static const int32_t lens[] = {9, 0, 1, 6, 12, 4, 0, 0, 3, 2, 4, 5, 1, 0, 8, 5};
    for (int v = 0; v < 3; v++) {
        opts o = base_opts();
        kda_gates(&o, v);
        o.H = 16, o.HV = 32;
        o.nseq = 8;
        if (v == 1) /* bf16 in 128-row tiles: 2048 pairs */
            o.H = 32, o.HV = 128, o.nseq = 16, o.state_dtype = GDN_DTYPE_BF16;
        memcpy(o.seqlens, lens, sizeof lens);
        run_case(&o, seed++);
    }
    return TU_PASS;
}

/* Norm, scale, initial state, beta dtype, input dtype and neg-eigval options, K = 256, varlen
 * calls with empty sequences and with T <= N. */
static int test_kda_options(void)
{
    if (!need_gpu())
        return TU_SKIP;
    uint64_t seed = g_seed + 9200;
    static const gdn_dtype dts[] = {GDN_DTYPE_BF16, GDN_DTYPE_F16, GDN_DTYPE_F32};
    for (int v = 0; v < 12; v++) {
        opts o = base_opts();
        kda_gates(&o, v);
        o.T = 1 + v % 5;
        o.l2norm = v % 2;
        o.allow_neg_eigval = o.raw_gates && v % 4 == 1;
        o.initial_state = v % 3 != 1;
        o.beta_dtype = v % 5 == 0 ? GDN_DTYPE_BF16 : v % 5 == 1 ? GDN_DTYPE_F16 : GDN_DTYPE_F32;
        o.dtype = dts[v % 3];
        o.scale = v % 7 == 0 ? 0.3f : 0.0f;
        o.layout = v & 4 || v == 11 ? GDN_STATE_KV : GDN_STATE_VK;
        o.state_dtype = v % 6 == 5 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        if (v >= 10) /* K = 256 in both layouts */
            o.K = o.V = 256;
        run_case(&o, seed++);
    }
    static const int32_t lens[][6] = {{3, 0, 5, 1, 8, 2}, {17, 4, 0, 0, 9, 1}, {1, 1, 0, 1, 1, 1}};
    for (int v = 0; v < 6; v++) {
        opts o = base_opts();
        kda_gates(&o, v);
        o.nseq = 6;
        memcpy(o.seqlens, lens[v % 3], sizeof lens[0]);
        o.layout = v < 3 ? GDN_STATE_VK : GDN_STATE_KV;
        o.state_dtype = v % 2 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        o.steps = v % 3 == 1;
        run_case(&o, seed++);
    }
    return TU_PASS;
}

/* Decays of 0 (g = -inf, -1e4), 1 (g = 0) and between, per key, over several chunks of tokens:
 * finite and accurate with the state's keys wiped and kept side by side. */
static int test_kda_extreme_gates(void)
{
    if (!need_gpu())
        return TU_SKIP;
    extreme_gates_cases(GDN_GATE_KDA, g_seed + 9300);
    return TU_PASS;
}

/* Grids of many CTAs (launched with and without programmatic dependent launch): 64 x 32 and
 * 160 x 32 (sequence, value head) pairs at T = 1, 40 x 32 at T = 4 and 8, both state dtypes. The
 * T = 1 grids (4096-8192 CTAs) are past one_token_bounded's three waves: the register-bounded
 * instance; the smaller cases of this file take the unbounded one. */
static int test_kda_many_pairs(void)
{
    if (!need_gpu())
        return TU_SKIP;
    uint64_t seed = g_seed + 9400;
    for (int v = 0; v < 6; v++) {
        opts o = base_opts();
        kda_gates(&o, v);
        o.H = 16, o.HV = 32;
        o.B = v < 2 ? 64 : v < 4 ? 160 : 40;
        o.T = v < 4 ? 1 : v == 4 ? 4 : 8;
        if (v == 2 || v == 3)
            o.K = o.V = 64;
        o.state_dtype = v % 2 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        run_case(&o, seed++);
    }
    return TU_PASS;
}

/* State pools with KDA gates: the decode and verify cases of the GDN pool tests (slots, padding,
 * null slot, num_accepted_tokens, per-step slots, in place). */
static int test_kda_pools(void)
{
    if (!need_gpu())
        return TU_SKIP;
    pool_decode_cases(GDN_GATE_KDA, g_seed + 9500);
    pool_spec_verify_cases(GDN_GATE_KDA, g_seed + 9600);
    bad_device_indices_case(GDN_GATE_KDA, g_seed + 9700);
    return TU_PASS;
}

/* ------------------------------------------------------------------------------------------ */
/* Gating op                                                                                   */

static int test_gating(void)
{
    if (!need_gpu())
        return TU_SKIP;
    tu_rng r = tu_rng_make(g_seed + 8000);
    for (int v = 0; v < 8; v++) {
        gdn_gate_kind kind = v < 4 ? GDN_GATE_GDN : GDN_GATE_KDA;
        int64_t B = 3, T = 5, HV = 6, K = kind == GDN_GATE_KDA ? 64 : 1;
        float lower = kind == GDN_GATE_KDA && (v & 1) ? -3.0f : 0.0f;
        gdn_dtype adt = v % 3 == 0 ? GDN_DTYPE_BF16 : v % 3 == 1 ? GDN_DTYPE_F16 : GDN_DTYPE_F32;
        gdn_dtype bdt = v % 2 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        int neg = v == 2 || v == 5;
        int with_dt = v != 1;
        size_t ng = (size_t)(B * T * HV * K), nb = (size_t)(B * T * HV);
        float *a32 = tu_alloc(ng * sizeof(float)), *b32 = tu_alloc(nb * sizeof(float));
        float *A_log = tu_alloc((size_t)HV * sizeof(float)), *dt = tu_alloc((size_t)(HV * K) * sizeof(float));
        tu_fill_normal(a32, ng, &r, 0.0f, 3.0f);
        a32[0] = 30.0f; /* above the softplus threshold */
        tu_fill_normal(b32, nb, &r, 0.0f, 2.0f);
        tu_fill_uniform(A_log, (size_t)HV, &r, -1.0f, 1.5f);
        tu_fill_normal(dt, (size_t)(HV * K), &r, 0.0f, 1.0f);
        tu_round_array(a32, ng, adt);
        tu_round_array(b32, nb, bdt);
        void *a = tu_alloc_elems(adt, ng), *b = tu_alloc_elems(bdt, nb);
        tu_store_f32(a, adt, a32, ng);
        tu_store_f32(b, bdt, b32, nb);
        float *g = tu_alloc(ng * sizeof(float));
        void *beta = tu_alloc_elems(bdt, nb);
        tu_poison(g, GDN_DTYPE_F32, ng);
        tu_poison(beta, bdt, nb);

        gdn_gating_args ga;
        memset(&ga, 0, sizeof ga);
        ga.kind = kind;
        ga.a = kind == GDN_GATE_KDA ? TU_TENSOR(a, adt, B, T, HV, K) : TU_TENSOR(a, adt, B, T, HV);
        ga.A_log = TU_TENSOR(A_log, GDN_DTYPE_F32, HV);
        if (with_dt)
            ga.dt_bias = kind == GDN_GATE_KDA ? TU_TENSOR(dt, GDN_DTYPE_F32, HV, K) : TU_TENSOR(dt, GDN_DTYPE_F32, HV);
        ga.lower_bound = lower;
        ga.g_out = kind == GDN_GATE_KDA ? TU_TENSOR(g, GDN_DTYPE_F32, B, T, HV, K) : TU_TENSOR(g, GDN_DTYPE_F32, B, T, HV);
        ga.b = TU_TENSOR(b, bdt, B, T, HV);
        ga.allow_neg_eigval = neg;
        ga.beta_out = TU_TENSOR(beta, bdt, B, T, HV);
        tu_mirror m = {0};
        gdn_tensor *ts[] = {&ga.a, &ga.A_log, &ga.dt_bias, &ga.g_out, &ga.b, &ga.beta_out};
        for (int i = 0; i < 6; i++)
            tu_mirror_tensor(&m, ts[i]);
        gdn_status st = gdn_gating(&ga);
        tu_mirror_back(&m);
        char what[80];
        snprintf(what, sizeof what, "gating %s a %s beta %s%s%s", kind == GDN_GATE_KDA ? "KDA" : "GDN", dtn(adt),
                 dtn(bdt), lower < 0 ? " lower_bound" : "", neg ? " neg_eigval" : "");
        if (tu_expect(st == GDN_OK, "%s: %s (%s)", what, gdn_status_string(st), gdn_last_error())) {
            double *g_ref = tu_alloc(ng * sizeof(double)), *beta_ref = tu_alloc(nb * sizeof(double));
            for (size_t i = 0; i < ng; i++) {
                size_t j = (i / (size_t)K) % (size_t)HV, rr = i % (size_t)K;
                g_ref[i] = tu_gate_value(kind, a32[i], A_log[j], with_dt ? dt[j * (size_t)K + rr] : 0.0, lower, 0, 0);
            }
            for (size_t i = 0; i < nb; i++)
                beta_ref[i] = tu_beta_value(b32[i], neg);
            char w[120];
            snprintf(w, sizeof w, "%s: g", what);
            tu_check(w, tu_compare(g, GDN_DTYPE_F32, g_ref, GDN_DTYPE_F64, ng), 1e-6);
            snprintf(w, sizeof w, "%s: beta", what);
            tu_check(w, tu_compare(beta, bdt, beta_ref, GDN_DTYPE_F64, nb), bdt == GDN_DTYPE_BF16 ? 4e-3 : 1e-6);
            free(g_ref);
            free(beta_ref);
        }
        free(a32), free(b32), free(A_log), free(dt), free(a), free(b), free(g), free(beta);
    }
    return TU_PASS;
}

int main(int argc, char **argv)
{
    const char *env = getenv("GDN_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    printf("test_cuda_recurrent: seed %llu (GDN_TEST_SEED replays)\n", (unsigned long long)g_seed);
    static const tu_test tests[] = {
        {"matrix", test_matrix},
        {"options", test_options},
        {"extreme_gates", test_extreme_gates},
        {"varlen_and_batch", test_varlen_and_batch},
        {"single_token_paths", test_single_token_paths},
        {"multi_token_paths", test_multi_token_paths},
        {"strided_inputs", test_strided_inputs},
        {"pool_decode", test_pool_decode},
        {"pool_spec_verify", test_pool_spec_verify},
        {"pool_verify_many_heads", test_pool_verify_many_heads},
        {"bad_device_indices", test_bad_device_indices},
        {"graph_capture", test_graph_capture},
        {"gating", test_gating},
        {"kda_heads", test_kda_heads},
        {"kda_tokens", test_kda_tokens},
        {"kda_wide", test_kda_wide},
        {"kda_short", test_kda_short},
        {"kda_options", test_kda_options},
        {"kda_extreme_gates", test_kda_extreme_gates},
        {"kda_many_pairs", test_kda_many_pairs},
        {"kda_pools", test_kda_pools},
    };
    const char *why = tu_cuda_unavailable();
    if (why) {
        printf("SKIP all %d tests: %s\n", TU_COUNT(tests), why);
        return TU_EXIT_SKIPPED;
    }
    return tu_main(tests, TU_COUNT(tests), argc, argv);
}
