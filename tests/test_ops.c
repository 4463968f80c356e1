/*
 * test_ops.c - gdn_chunk_fwd and gdn_recurrent_fwd on the CPU against the float64 oracle
 * (gdn_recurrent_fwd on f64 tensors holding the same rounded inputs), and against each other.
 *
 * Each axis is swept with the others at defaults (B = 2, T = 100, H = 2, HV = 4, K = V = 64, f32,
 * KV state in f32, initial state, in-kernel l2norm, precomputed GDN gates), plus random
 * combinations. Outputs are poisoned before every run, so unwritten elements fail as NaN.
 * f32 / bf16 / f16 inputs take the backend's f32 paths and f64 inputs its double reference, so
 * every comparison here checks an f32 path against the reference; ops_fast_* add the decode
 * shapes, every instruction-set instance ($GDN_CPU_ISA) and concurrent callers.
 *   build/tests/test_ops [name-substring ...]
 */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static tu_case_config defaults(uint64_t seed)
{
    tu_case_config c;
    memset(&c, 0, sizeof c);
    c.B = 2;
    c.T = 100;
    c.H = 2;
    c.HV = 4;
    c.K = 64;
    c.V = 64;
    c.dtype = GDN_DTYPE_F32;
    c.beta_dtype = GDN_DTYPE_F32;
    c.state_dtype = GDN_DTYPE_F32;
    c.layout = GDN_STATE_KV;
    c.kind = GDN_GATE_GDN;
    c.initial_state = 1;
    c.l2norm = 1;
    c.seed = seed;
    return c;
}

static const char *dtype_str(gdn_dtype d)
{
    switch (d) {
    case GDN_DTYPE_F32: return "f32";
    case GDN_DTYPE_BF16: return "bf16";
    case GDN_DTYPE_F16: return "f16";
    case GDN_DTYPE_F64: return "f64";
    case GDN_DTYPE_I32: return "i32";
    }
    return "?";
}

/* Relative RMS tolerances from GDN_MATH.md "Accuracy": the oracle sees the same rounded inputs,
 * so what remains is f32 arithmetic plus the rounding of the stored outputs. */
static double tol_out(gdn_dtype dtype)
{
    switch (dtype) {
    case GDN_DTYPE_BF16: return 5e-3; /* storing o in bf16 alone costs ~1.1e-3 */
    case GDN_DTYPE_F16: return 1e-3;  /* ~2.8e-4 */
    default: return 1e-5;
    }
}

static double tol_state(gdn_dtype state_dtype)
{
    return state_dtype == GDN_DTYPE_BF16 ? 1e-2 : 2e-5;
}

static void describe(const tu_case_config *c, char *buf, size_t n)
{
    char lens[96] = "";
    if (c->nseq > 0) {
        size_t at = 0;
        for (int i = 0; i < c->nseq && at + 8 < sizeof lens; i++)
            at += (size_t)snprintf(lens + at, sizeof lens - at, "%s%d", i ? "," : "lens=", (int)c->seqlens[i]);
    }
    snprintf(buf, n, "%s B%lld T%lld H%lld HV%lld K%lld V%lld %s st=%s/%s %s%s%s%s%s lb=%g",
             lens, (long long)c->B, (long long)c->T, (long long)c->H, (long long)c->HV, (long long)c->K,
             (long long)c->V, dtype_str(c->dtype), c->layout == GDN_STATE_VK ? "VK" : "KV",
             dtype_str(c->state_dtype), c->kind == GDN_GATE_KDA ? "kda" : "gdn", c->initial_state ? " h0" : "",
             c->l2norm ? " l2" : "", c->raw_gates ? " raw" : "", c->allow_neg_eigval ? " neg" : "",
             (double)c->lower_bound);
}

/* Runs both ops on one configuration and records every comparison. */
static void run_case(const tu_case_config *cfg)
{
    char name[320], what[400];
    tu_case c;
    tu_case_init(&c, cfg);
    describe(&c.c, name, sizeof name);
    if (tu_case_reference(&c) != GDN_OK) {
        tu_expect(0, "%s: the float64 oracle failed: %s", name, gdn_last_error());
        tu_case_free(&c);
        return;
    }
    size_t n_o = (size_t)(c.c.B * c.c.T * c.c.HV * c.c.V), n_s = (size_t)c.state_numel;
    size_t o_bytes = n_o * gdn_dtype_size(c.c.dtype);
    void *o_chunk = tu_alloc(o_bytes ? o_bytes : 1);

    for (int op = 0; op < 2; op++) {
        const char *opname = op == 0 ? "chunk" : "recurrent";
        tu_case_poison(&c);
        gdn_recurrent_fwd_args a = tu_case_recurrent_args(&c);
        gdn_status st = tu_fwd(op, &a);
        if (!tu_expect(st == GDN_OK, "%s %s: %s (%s)", opname, name, gdn_status_string(st), gdn_last_error()))
            continue;
        size_t left_o = tu_count_poison(c.o, c.c.dtype, n_o), left_s = tu_count_poison(c.ht, c.c.state_dtype, n_s);
        tu_expect(left_o == 0 && left_s == 0, "%s %s: %zu of %zu o and %zu of %zu final-state elements unwritten",
                  opname, name, left_o, n_o, left_s, n_s);
        snprintf(what, sizeof what, "%s o %s", opname, name);
        tu_check(what, tu_compare(c.o, c.c.dtype, c.o_ref, GDN_DTYPE_F64, n_o), tol_out(c.c.dtype));
        snprintf(what, sizeof what, "%s ht %s", opname, name);
        tu_check(what, tu_compare(c.ht, c.c.state_dtype, c.ht_ref, GDN_DTYPE_F64, n_s), tol_state(c.c.state_dtype));
        if (op == 0)
            memcpy(o_chunk, c.o, o_bytes);
        else {
            snprintf(what, sizeof what, "chunk-vs-recurrent o %s", name);
            tu_check(what, tu_compare(o_chunk, c.c.dtype, c.o, c.c.dtype, n_o), tol_out(c.c.dtype));
        }
    }
    free(o_chunk);
    tu_case_free(&c);
}

/* The oracle itself against the naive double recurrence written in the harness. */
static int test_oracle_vs_naive(void)
{
    tu_case_config cfgs[4];
    cfgs[0] = defaults(11);
    cfgs[1] = defaults(12);
    cfgs[1].kind = GDN_GATE_KDA;
    cfgs[1].layout = GDN_STATE_VK;
    cfgs[1].l2norm = 0;
    cfgs[2] = defaults(13);
    cfgs[2].nseq = 4;
    memcpy(cfgs[2].seqlens, (int32_t[]){0, 1, 70, 5}, 4 * sizeof(int32_t));
    cfgs[2].HV = 8;
    cfgs[2].raw_gates = 1;
    cfgs[3] = defaults(14);
    cfgs[3].kind = GDN_GATE_KDA;
    cfgs[3].raw_gates = 1;
    cfgs[3].lower_bound = -5.0f;
    cfgs[3].initial_state = 0;
    for (int i = 0; i < 4; i++) {
        tu_case c;
        tu_case_init(&c, &cfgs[i]);
        if (!tu_expect(tu_case_reference(&c) == GDN_OK, "oracle case %d: %s", i, gdn_last_error())) {
            tu_case_free(&c);
            continue;
        }
        size_t n_o = (size_t)(c.c.B * c.c.T * c.c.HV * c.c.V), n_s = (size_t)c.state_numel;
        double *o = tu_alloc(n_o * sizeof(double)), *ht = tu_alloc(n_s * sizeof(double));
        tu_case_naive(&c, o, ht, NULL);
        char what[64];
        snprintf(what, sizeof what, "oracle o case %d", i);
        tu_check(what, tu_compare(c.o_ref, GDN_DTYPE_F64, o, GDN_DTYPE_F64, n_o), 1e-12);
        snprintf(what, sizeof what, "oracle ht case %d", i);
        tu_check(what, tu_compare(c.ht_ref, GDN_DTYPE_F64, ht, GDN_DTYPE_F64, n_s), 1e-12);
        free(o);
        free(ht);
        tu_case_free(&c);
    }
    return TU_PASS;
}

static int test_sweep_T(void)
{
    const int64_t Ts[] = {1, 2, 63, 64, 65, 200};
    for (int i = 0; i < 6; i++) {
        tu_case_config c = defaults(100 + (uint64_t)i);
        c.T = Ts[i];
        run_case(&c);
    }
    return TU_PASS;
}

static int test_varlen(void)
{
    static const int32_t lens[][8] = {
        {0, 1, 65, 0, 130, 1, 64, 0}, {1}, {0, 0, 3, 0}, {63, 64, 65}, {200}, {0, 129, 2, 0, 0, 17},
    };
    static const int counts[] = {8, 1, 4, 3, 1, 6};
    for (int i = 0; i < 6; i++) {
        for (int h0 = 0; h0 < 2; h0++) {
            tu_case_config c = defaults(200 + (uint64_t)(2 * i + h0));
            c.nseq = counts[i];
            memcpy(c.seqlens, lens[i], (size_t)counts[i] * sizeof(int32_t));
            c.initial_state = h0;
            c.layout = i % 2 ? GDN_STATE_VK : GDN_STATE_KV;
            run_case(&c);
        }
    }
    return TU_PASS;
}

static int test_gva(void)
{
    const int64_t ratios[] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        tu_case_config c = defaults(300 + (uint64_t)i);
        c.H = 2;
        c.HV = 2 * ratios[i];
        run_case(&c);
    }
    tu_case_config c = defaults(310);
    c.H = 1;
    c.HV = 4;
    run_case(&c);
    return TU_PASS;
}

/* The CPU backend takes any head dims from 1 to GDN_CPU_MAX_HEAD_DIM, including ones no SIMD
 * width divides; past the limit the query and the call both refuse, naming the dims. */
static int test_head_dims(void)
{
    const int64_t dims[][2] = {{64, 64}, {128, 128}, {64, 128}, {128, 64}, {1, 1}, {5, 3}, {96, 48}, {256, 24}};
    for (int i = 0; i < 8; i++) {
        tu_case_config c = defaults(400 + (uint64_t)i);
        c.K = dims[i][0];
        c.V = dims[i][1];
        c.layout = i % 2 ? GDN_STATE_VK : GDN_STATE_KV;
        run_case(&c);
    }
    tu_case_config c = defaults(410);
    c.K = 257;
    c.V = 8;
    tu_case tc;
    tu_case_init(&tc, &c);
    const size_t n_o = (size_t)(c.B * c.T * c.HV * c.V);
    for (int op = 0; op < 2; op++) {
        tu_case_poison(&tc);
        gdn_recurrent_fwd_args a = tu_case_recurrent_args(&tc);
        gdn_status st = tu_fwd(op, &a);
        tu_expect(st == GDN_ERR_UNSUPPORTED && strstr(gdn_last_error(), "K = 257"), "op %d with K = 257: %s (%s)", op,
                  gdn_status_string(st), gdn_last_error());
        tu_expect(tu_count_poison(tc.o, c.dtype, n_o) == n_o, "op %d with K = 257 wrote o", op);
        size_t bytes = 0;
        gdn_chunk_fwd_args ca = tu_chunk_args(&a);
        st = op == TU_RECURRENT ? gdn_recurrent_fwd_workspace_size(&a, &bytes)
                                : gdn_chunk_fwd_workspace_size(&ca, &bytes);
        tu_expect(st == GDN_ERR_UNSUPPORTED, "op %d workspace query with K = 257: %s", op, gdn_status_string(st));
    }
    tu_case_free(&tc);
    return TU_PASS;
}

static int test_input_dtypes(void)
{
    const gdn_dtype dts[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16, GDN_DTYPE_F16};
    for (int i = 0; i < 3; i++) {
        tu_case_config c = defaults(500 + (uint64_t)i);
        c.dtype = dts[i];
        c.beta_dtype = dts[i];
        c.T = 130;
        run_case(&c);
    }
    return TU_PASS;
}

static int test_state_layout_dtype(void)
{
    for (int layout = 0; layout < 2; layout++) {
        for (int sd = 0; sd < 2; sd++) {
            tu_case_config c = defaults(600 + (uint64_t)(2 * layout + sd));
            c.layout = layout ? GDN_STATE_VK : GDN_STATE_KV;
            c.state_dtype = sd ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
            run_case(&c);
        }
    }
    return TU_PASS;
}

static int test_initial_state_and_l2norm(void)
{
    for (int h0 = 0; h0 < 2; h0++) {
        for (int l2 = 0; l2 < 2; l2++) {
            tu_case_config c = defaults(700 + (uint64_t)(2 * h0 + l2));
            c.initial_state = h0;
            c.l2norm = l2;
            run_case(&c);
        }
    }
    tu_case_config c = defaults(710);
    c.scale = 0.3f;
    run_case(&c);
    return TU_PASS;
}

static int test_kda(void)
{
    for (int i = 0; i < 6; i++) {
        tu_case_config c = defaults(800 + (uint64_t)i);
        c.kind = GDN_GATE_KDA;
        c.T = 130;
        c.raw_gates = i >= 2;
        c.lower_bound = i == 3 ? -5.0f : i == 4 ? -1.0f : 0.0f;
        c.layout = i % 2 ? GDN_STATE_VK : GDN_STATE_KV;
        if (i == 5) {
            c.dtype = GDN_DTYPE_BF16;
            c.beta_dtype = GDN_DTYPE_BF16;
            c.state_dtype = GDN_DTYPE_BF16;
            c.nseq = 3;
            memcpy(c.seqlens, (int32_t[]){70, 0, 90}, 3 * sizeof(int32_t));
        }
        run_case(&c);
    }
    return TU_PASS;
}

/* In-kernel gating (raw a, A_log, dt_bias, beta logits) against gdn_gating followed by the op on
 * the precomputed g and beta: the same result. Both against the oracle too (run_case). */
static int test_gating_in_kernel_vs_precomputed(void)
{
    for (int i = 0; i < 4; i++) {
        tu_case_config cfg = defaults(900 + (uint64_t)i);
        cfg.raw_gates = 1;
        cfg.kind = i >= 2 ? GDN_GATE_KDA : GDN_GATE_GDN;
        cfg.lower_bound = i == 3 ? -3.0f : 0.0f;
        cfg.allow_neg_eigval = i == 1;
        run_case(&cfg);

        tu_case c;
        tu_case_init(&c, &cfg);
        size_t n_o = (size_t)(c.c.B * c.c.T * c.c.HV * c.c.V), n_s = (size_t)c.state_numel;
        size_t nb = (size_t)(c.c.B * c.c.T * c.c.HV);
        float *g = tu_alloc((size_t)c.gate_numel * sizeof(float)), *beta = tu_alloc(nb * sizeof(float));
        gdn_gate_params raw = tu_case_gate_params(&c);
        gdn_gating_args ga;
        memset(&ga, 0, sizeof ga);
        ga.kind = raw.kind;
        ga.a = raw.a;
        ga.A_log = raw.A_log;
        ga.dt_bias = raw.dt_bias;
        ga.lower_bound = raw.lower_bound;
        ga.g_out = tu_case_gate(&c, g, GDN_DTYPE_F32);
        ga.b = raw.beta;
        ga.allow_neg_eigval = raw.allow_neg_eigval;
        ga.beta_out = tu_case_beta(&c, beta, GDN_DTYPE_F32);
        gdn_status st = gdn_gating(&ga);
        if (!tu_expect(st == GDN_OK, "gdn_gating: %s (%s)", gdn_status_string(st), gdn_last_error()))
            goto done;
        for (int op = 0; op < 2; op++) {
            void *o_raw = tu_alloc(n_o * sizeof(float)), *ht_raw = tu_alloc(n_s * sizeof(float));
            gdn_gate_params pre;
            memset(&pre, 0, sizeof pre);
            pre.kind = raw.kind;
            pre.g = ga.g_out;
            pre.beta = ga.beta_out;
            for (int pass = 0; pass < 2; pass++) {
                tu_case_poison(&c);
                gdn_recurrent_fwd_args a = tu_case_recurrent_args(&c);
                if (pass)
                    a.gate = pre;
                st = tu_fwd(op, &a);
                tu_expect(st == GDN_OK, "%s pass %d: %s", op ? "recurrent" : "chunk", pass, gdn_last_error());
                if (pass == 0) {
                    memcpy(o_raw, c.o, n_o * sizeof(float));
                    memcpy(ht_raw, c.ht, n_s * sizeof(float));
                }
            }
            char what[96];
            snprintf(what, sizeof what, "%s in-kernel vs gdn_gating o (case %d)", op ? "recurrent" : "chunk", i);
            tu_check(what, tu_compare(o_raw, GDN_DTYPE_F32, c.o, GDN_DTYPE_F32, n_o), 2e-6);
            snprintf(what, sizeof what, "%s in-kernel vs gdn_gating ht (case %d)", op ? "recurrent" : "chunk", i);
            tu_check(what, tu_compare(ht_raw, GDN_DTYPE_F32, c.ht, GDN_DTYPE_F32, n_s), 2e-6);
            free(o_raw);
            free(ht_raw);
        }
    done:
        free(g);
        free(beta);
        tu_case_free(&c);
    }
    return TU_PASS;
}

/* Decays from ~0 (long memory: the state keeps growing) to -20 (forget at once), and a chunked
 * path's cumulative decays over whole chunks down to ~-1300. */
static int test_extreme_gates(void)
{
    const float means[] = {6.0f, 0.0f, -3.0f}, stds[] = {1.0f, 8.0f, 1.0f};
    for (int i = 0; i < 3; i++) {
        for (int kda = 0; kda < 2; kda++) {
            tu_case_config c = defaults(1100 + (uint64_t)(2 * i + kda));
            c.T = 200;
            c.gate_mean = means[i];
            c.gate_std = stds[i];
            c.kind = kda ? GDN_GATE_KDA : GDN_GATE_GDN;
            run_case(&c);
        }
    }
    return TU_PASS;
}

static int test_long_and_wide(void)
{
    tu_case_config c = defaults(1200);
    c.B = 1;
    c.T = 1000;
    c.HV = 2;
    c.H = 1;
    run_case(&c);
    c = defaults(1201);
    c.nseq = 3;
    memcpy(c.seqlens, (int32_t[]){700, 1, 300}, 3 * sizeof(int32_t));
    c.H = 1;
    c.HV = 2;
    c.layout = GDN_STATE_VK;
    c.gate_mean = 4.0f;
    run_case(&c);
    c = defaults(1202);
    c.K = 256;
    c.V = 256;
    c.T = 130;
    c.B = 1;
    run_case(&c);
    c = defaults(1203);
    c.K = 256;
    c.V = 128;
    c.T = 70;
    c.B = 1;
    c.kind = GDN_GATE_KDA;
    c.dtype = GDN_DTYPE_BF16;
    run_case(&c);
    return TU_PASS;
}

/* Zero tokens in total: o is empty and every final state equals its initial state. */
static int test_empty_batch(void)
{
    for (int h0 = 0; h0 < 2; h0++) {
        tu_case_config c = defaults(1300 + (uint64_t)h0);
        c.nseq = 3;
        c.initial_state = h0;
        run_case(&c);
    }
    return TU_PASS;
}

/* The CPU backend splits work over threads; the result must not depend on how many. */
static int test_thread_count_invariance(void)
{
    tu_case_config cfg = defaults(1400);
    cfg.nseq = 5;
    memcpy(cfg.seqlens, (int32_t[]){64, 3, 130, 0, 77}, 5 * sizeof(int32_t));
    cfg.kind = GDN_GATE_KDA;
    tu_case c;
    tu_case_init(&c, &cfg);
    size_t n_o = (size_t)(c.c.B * c.c.T * c.c.HV * c.c.V), n_s = (size_t)c.state_numel;
    float *o1 = tu_alloc(n_o * sizeof(float)), *s1 = tu_alloc(n_s * sizeof(float));
    int before = gdn_get_num_threads();
    const int counts[] = {1, 3, 8};
    for (int op = 0; op < 2; op++) {
        for (int i = 0; i < 3; i++) {
            gdn_set_num_threads(counts[i]);
            tu_expect(gdn_get_num_threads() == counts[i], "gdn_get_num_threads() = %d after setting %d",
                      gdn_get_num_threads(), counts[i]);
            tu_case_poison(&c);
            gdn_recurrent_fwd_args a = tu_case_recurrent_args(&c);
            gdn_status st = tu_fwd(op, &a);
            tu_expect(st == GDN_OK, "threads %d: %s", counts[i], gdn_last_error());
            if (i == 0) {
                memcpy(o1, c.o, n_o * sizeof(float));
                memcpy(s1, c.ht, n_s * sizeof(float));
                continue;
            }
            char what[96];
            snprintf(what, sizeof what, "%s o, %d threads vs 1", op ? "recurrent" : "chunk", counts[i]);
            tu_check(what, tu_compare(c.o, GDN_DTYPE_F32, o1, GDN_DTYPE_F32, n_o), 0.0);
            snprintf(what, sizeof what, "%s ht, %d threads vs 1", op ? "recurrent" : "chunk", counts[i]);
            tu_check(what, tu_compare(c.ht, GDN_DTYPE_F32, s1, GDN_DTYPE_F32, n_s), 0.0);
        }
        /* 8 threads wanted, a workspace sized for 1: the call runs on the threads it covers. */
        gdn_set_num_threads(1);
        gdn_recurrent_fwd_args a = tu_case_recurrent_args(&c);
        gdn_chunk_fwd_args ca = tu_chunk_args(&a);
        size_t one = 0;
        gdn_status st = op ? gdn_recurrent_fwd_workspace_size(&a, &one) : gdn_chunk_fwd_workspace_size(&ca, &one);
        gdn_set_num_threads(8);
        size_t eight = 0;
        st = st == GDN_OK ? (op ? gdn_recurrent_fwd_workspace_size(&a, &eight) : gdn_chunk_fwd_workspace_size(&ca, &eight))
                          : st;
        tu_expect(st == GDN_OK && one > 0 && eight > one, "%s workspace: %zu bytes for 1 thread, %zu for 8",
                  op ? "recurrent" : "chunk", one, eight);
        void *ws = aligned_alloc(256, (one + 255) / 256 * 256);
        tu_case_poison(&c);
        a.workspace = ca.workspace = ws;
        a.workspace_bytes = ca.workspace_bytes = one;
        st = op ? gdn_recurrent_fwd(&a) : gdn_chunk_fwd(&ca);
        tu_expect(st == GDN_OK, "%s with one thread's workspace: %s", op ? "recurrent" : "chunk", gdn_last_error());
        char what[96];
        snprintf(what, sizeof what, "%s o, one thread's workspace vs 1 thread", op ? "recurrent" : "chunk");
        tu_check(what, tu_compare(c.o, GDN_DTYPE_F32, o1, GDN_DTYPE_F32, n_o), 0.0);
        free(ws);
    }
    gdn_set_num_threads(0);
    tu_expect(gdn_get_num_threads() >= 1, "gdn_set_num_threads(0) resets to a positive default");
    gdn_set_num_threads(before);
    free(o1);
    free(s1);
    tu_case_free(&c);
    return TU_PASS;
}

/* One sequence of one head: the CPU chunk op plans its smallest head group, and the workspace the
 * query gives must still be what the call takes, whatever the thread count. */
static int test_single_item_workspace(void)
{
    const int before = gdn_get_num_threads();
    const int counts[] = {1, 8};
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int i = 0; i < 2; i++)
        for (int d = 0; d < 2; d++) {
            gdn_set_num_threads(counts[i]);
            tu_case_config cfg = defaults(1500 + (uint64_t)(2 * i + d));
            cfg.B = 1;
            cfg.T = 64;
            cfg.H = cfg.HV = 1;
            cfg.dtype = cfg.beta_dtype = dtypes[d];
            run_case(&cfg);
        }
    gdn_set_num_threads(before);
    return TU_PASS;
}

static int test_random_combos(void)
{
    tu_rng r = tu_rng_make(1000);
    for (int i = 0; i < 24; i++) {
        tu_case_config c = defaults(1000 + (uint64_t)i);
        c.H = tu_rng_int(&r, 1, 2);
        c.HV = c.H * (int64_t[]){1, 2, 4}[tu_rng_int(&r, 0, 2)];
        c.K = tu_rng_int(&r, 0, 1) ? 128 : 64;
        c.V = tu_rng_int(&r, 0, 1) ? 128 : 64;
        c.dtype = tu_rng_int(&r, 0, 1) ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        c.beta_dtype = tu_rng_int(&r, 0, 1) ? c.dtype : GDN_DTYPE_F32;
        c.state_dtype = tu_rng_int(&r, 0, 3) == 0 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        c.layout = tu_rng_int(&r, 0, 1) ? GDN_STATE_VK : GDN_STATE_KV;
        c.kind = tu_rng_int(&r, 0, 2) == 0 ? GDN_GATE_KDA : GDN_GATE_GDN;
        c.initial_state = (int)tu_rng_int(&r, 0, 1);
        c.l2norm = (int)tu_rng_int(&r, 0, 3) != 0;
        c.raw_gates = (int)tu_rng_int(&r, 0, 1);
        if (c.raw_gates && c.kind == GDN_GATE_KDA && tu_rng_int(&r, 0, 1))
            c.lower_bound = -(float)tu_rng_uniform(&r) * 5.0f;
        if (c.raw_gates)
            c.allow_neg_eigval = tu_rng_int(&r, 0, 3) == 0;
        c.gate_mean = (float)tu_rng_int(&r, -2, 5);
        if (tu_rng_int(&r, 0, 1)) {
            c.nseq = (int)tu_rng_int(&r, 1, 5);
            for (int n = 0; n < c.nseq; n++)
                c.seqlens[n] = (int32_t)tu_rng_int(&r, 0, 150);
            if (c.seqlens[0] + c.seqlens[c.nseq - 1] == 0)
                c.seqlens[0] = 1;
        } else {
            c.B = tu_rng_int(&r, 1, 3);
            c.T = tu_rng_int(&r, 1, 150);
        }
        run_case(&c);
    }
    return TU_PASS;
}

/* Decode shapes of the f32 recurrence (one token, one sequence, many heads) and short verify. */
static const tu_case_config *fast_cases(int *count)
{
    static tu_case_config cs[6];
    for (int i = 0; i < 6; i++) {
        cs[i] = defaults(1600 + (uint64_t)i);
        cs[i].B = 1;
        cs[i].T = i < 4 ? 1 : 5;
        cs[i].K = cs[i].V = i % 3 == 0 ? 128 : 64;
        cs[i].H = 4;
        cs[i].HV = i == 1 ? 16 : 4;
        cs[i].layout = i % 2 ? GDN_STATE_VK : GDN_STATE_KV;
        cs[i].kind = i == 2 || i == 5 ? GDN_GATE_KDA : GDN_GATE_GDN;
        cs[i].state_dtype = i == 3 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
    }
    cs[4].K = 256; /* unequal head dims, the widest tiles */
    cs[4].V = 64;
    cs[5].K = 64;
    cs[5].V = 256;
    cs[5].nseq = 4;
    memcpy(cs[5].seqlens, (int32_t[]){3, 0, 70, 1}, 4 * sizeof(int32_t));
    cs[5].dtype = cs[5].beta_dtype = GDN_DTYPE_F16;
    *count = 6;
    return cs;
}

static int test_fast_decode_shapes(void)
{
    int n;
    const tu_case_config *cs = fast_cases(&n);
    for (int i = 0; i < n; i++)
        run_case(&cs[i]);
    return TU_PASS;
}

/* Every instance the dispatcher may pick on some machine runs here, capped through $GDN_CPU_ISA
 * (instances this CPU lacks fall back to the best it has). */
static int test_fast_isa_instances(void)
{
    static const char *isas[] = {"base", "avx2", "avx512"};
    int n;
    const tu_case_config *cs = fast_cases(&n);
    for (int k = 0; k < 3; k++) {
        setenv("GDN_CPU_ISA", isas[k], 1);
        run_case(&cs[k]);
        run_case(&cs[5]);
        tu_case_config c = defaults(1700 + (uint64_t)k);
        c.kind = k == 1 ? GDN_GATE_KDA : GDN_GATE_GDN;
        c.layout = k == 2 ? GDN_STATE_VK : GDN_STATE_KV;
        c.T = 130;
        run_case(&c);
    }
    unsetenv("GDN_CPU_ISA");
    return TU_PASS;
}

/* Callers on several threads at once share the backend's one helper pool; each result must be
 * what the call gives alone. */
typedef struct concurrent_job {
    tu_case c;
    int op;
    int rounds;
    gdn_status st;
} concurrent_job;

static void *concurrent_main(void *arg)
{
    concurrent_job *j = (concurrent_job *)arg;
    j->st = GDN_OK;
    for (int r = 0; r < j->rounds && j->st == GDN_OK; r++) {
        gdn_recurrent_fwd_args a = tu_case_recurrent_args(&j->c);
        j->st = tu_fwd(j->op, &a);
    }
    return NULL;
}

static int test_fast_concurrent_callers(void)
{
    enum { JOBS = 4 };
    concurrent_job jobs[JOBS];
    float *o_alone[JOBS], *s_alone[JOBS];
    int before = gdn_get_num_threads();
    gdn_set_num_threads(2);
    for (int i = 0; i < JOBS; i++) {
        tu_case_config cfg = defaults(1800 + (uint64_t)i);
        cfg.T = i % 2 ? 1 : 70;
        cfg.kind = i == 2 ? GDN_GATE_KDA : GDN_GATE_GDN;
        cfg.layout = i == 3 ? GDN_STATE_VK : GDN_STATE_KV;
        tu_case_init(&jobs[i].c, &cfg);
        jobs[i].op = i % 2 ? TU_RECURRENT : TU_CHUNK;
        jobs[i].rounds = 1;
        concurrent_main(&jobs[i]);
        size_t n_o = (size_t)(cfg.B * cfg.T * cfg.HV * cfg.V), n_s = (size_t)jobs[i].c.state_numel;
        o_alone[i] = tu_snapshot(jobs[i].c.o, n_o * sizeof(float));
        s_alone[i] = tu_snapshot(jobs[i].c.ht, n_s * sizeof(float));
        tu_case_poison(&jobs[i].c);
        jobs[i].rounds = 20;
    }
    pthread_t tids[JOBS];
    int started[JOBS];
    for (int i = 0; i < JOBS; i++) {
        started[i] = pthread_create(&tids[i], NULL, concurrent_main, &jobs[i]) == 0;
        if (!started[i])
            concurrent_main(&jobs[i]);
    }
    for (int i = 0; i < JOBS; i++)
        if (started[i])
            pthread_join(tids[i], NULL);
    for (int i = 0; i < JOBS; i++) {
        const tu_case *c = &jobs[i].c;
        size_t n_o = (size_t)(c->c.B * c->c.T * c->c.HV * c->c.V), n_s = (size_t)c->state_numel;
        tu_expect(jobs[i].st == GDN_OK, "concurrent caller %d: %s", i, gdn_status_string(jobs[i].st));
        char what[64];
        snprintf(what, sizeof what, "caller %d o, concurrent vs alone", i);
        tu_check(what, tu_compare(c->o, GDN_DTYPE_F32, o_alone[i], GDN_DTYPE_F32, n_o), 0.0);
        snprintf(what, sizeof what, "caller %d ht, concurrent vs alone", i);
        tu_check(what, tu_compare(c->ht, GDN_DTYPE_F32, s_alone[i], GDN_DTYPE_F32, n_s), 0.0);
        free(o_alone[i]);
        free(s_alone[i]);
        tu_case_free(&jobs[i].c);
    }
    gdn_set_num_threads(before);
    return TU_PASS;
}

int main(int argc, char **argv)
{
    static const tu_test tests[] = {
        {"ops_oracle_vs_naive", test_oracle_vs_naive},
        {"ops_sweep_T", test_sweep_T},
        {"ops_varlen", test_varlen},
        {"ops_gva", test_gva},
        {"ops_head_dims", test_head_dims},
        {"ops_input_dtypes", test_input_dtypes},
        {"ops_state_layout_dtype", test_state_layout_dtype},
        {"ops_initial_state_l2norm_scale", test_initial_state_and_l2norm},
        {"ops_kda", test_kda},
        {"ops_gating_in_kernel_vs_precomputed", test_gating_in_kernel_vs_precomputed},
        {"ops_extreme_gates", test_extreme_gates},
        {"ops_long_and_wide", test_long_and_wide},
        {"ops_empty_batch", test_empty_batch},
        {"ops_thread_count_invariance", test_thread_count_invariance},
        {"ops_single_item_workspace", test_single_item_workspace},
        {"ops_random_combos", test_random_combos},
        {"ops_fast_decode_shapes", test_fast_decode_shapes},
        {"ops_fast_isa_instances", test_fast_isa_instances},
        {"ops_fast_concurrent_callers", test_fast_concurrent_callers},
    };
    return tu_main(tests, TU_COUNT(tests), argc, argv);
}
