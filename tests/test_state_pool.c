/*
 * test_state_pool.c - gdn_recurrent_fwd with a state pool, as serving engines call it: in-place
 * final states into a pool whose slot stride is padded, 2-D indices with num_accepted_tokens
 * and per-step writes (speculative verify), skipped sequences (negative slots, null_slot_zero,
 * num_accepted_tokens out of range) whose pool slots stay untouched and whose outputs are zeroed,
 * negative per-step slots that skip one write, final_state and step_states next to the pool.
 *
 * Expected values come from the naive double recurrence of the harness started from the slot
 * each sequence should read; untouched pool bytes (other slots, the padding) must be identical.
 *   build/tests/test_state_pool [name-substring ...]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define MAXN 8
#define MAXT 6

typedef struct pool_spec {
    const char *label;
    int N, T, P;                /* T: tokens per sequence, unless varlen */
    int varlen;                 /* packed sequences of lens[n] tokens (cu_seqlens) */
    int32_t lens[MAXN];
    int rank2;                  /* 2-D state_indices [N, T_max] */
    int cols;                   /* T_max (>= T when per-step writes happen) */
    int32_t idx[MAXN][MAXT];    /* rank 1 uses idx[n][0] */
    int use_nat;
    int32_t nat[MAXN];
    int null_slot_zero;
    int inplace;
    int with_final, with_steps;
    gdn_state_layout layout;
    gdn_dtype state_dtype;
    int64_t pad;                /* extra elements per pool slot */
} pool_spec;

static double tol_state(gdn_dtype sd) { return sd == GDN_DTYPE_BF16 ? 1e-2 : 2e-5; }

/* The slot sequence n starts from, or -1 if the sequence is skipped. */
static int start_slot(const pool_spec *s, int n)
{
    int32_t slot;
    if (s->rank2 && s->use_nat) {
        if (s->nat[n] < 1 || s->nat[n] > s->cols)
            return -1;
        slot = s->idx[n][s->nat[n] - 1];
    } else {
        slot = s->idx[n][0];
    }
    if (slot < 0 || (s->null_slot_zero && slot == 0))
        return -1;
    return slot;
}

static size_t count_nonzero(const void *p, gdn_dtype dtype, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += tu_get(p, dtype, i) != 0.0;
    return c;
}

static void run_pool(const pool_spec *s, uint64_t seed)
{
    tu_case_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.B = s->N;
    cfg.T = s->T;
    if (s->varlen) {
        cfg.nseq = s->N;
        memcpy(cfg.seqlens, s->lens, (size_t)s->N * sizeof(int32_t));
    }
    cfg.H = 2;
    cfg.HV = 4;
    cfg.K = 64;
    cfg.V = 64;
    cfg.state_dtype = s->state_dtype;
    cfg.layout = s->layout;
    cfg.initial_state = 1;
    cfg.l2norm = 1;
    cfg.seed = seed;
    tu_case c;
    tu_case_init(&c, &cfg);

    gdn_dtype sd = s->state_dtype;
    size_t esz = gdn_dtype_size(sd);
    int64_t slot_elems = cfg.HV * cfg.K * cfg.V, slot_stride = slot_elems + s->pad;
    size_t pool_bytes = (size_t)(s->P * slot_stride) * esz;

    /* Pool: random values everywhere (padding included), then each live sequence's start state
     * copied from the case's initial state, so the naive reference starts from the same values. */
    unsigned char *pool = tu_alloc(pool_bytes);
    {
        tu_rng r = tu_rng_make(seed ^ 0xabcdef);
        for (int64_t i = 0; i < s->P * slot_stride; i++)
            tu_set(pool, sd, (size_t)i, 0.5 * tu_rng_normal(&r));
    }
    int start[MAXN];
    for (int n = 0; n < s->N; n++) {
        start[n] = start_slot(s, n);
        if (start[n] >= 0)
            memcpy(pool + (size_t)(start[n] * slot_stride) * esz, (char *)c.h0 + (size_t)(n * slot_elems) * esz,
                   (size_t)slot_elems * esz);
    }
    unsigned char *before = tu_snapshot(pool, pool_bytes);

    int64_t ntok = c.c.B * c.c.T, tok_o = cfg.HV * cfg.V; /* packed tokens; o elements per token */
    size_t n_o = (size_t)(ntok * tok_o), n_steps = (size_t)(ntok * slot_elems);
    double *o_ref = tu_alloc(n_o * sizeof(double)), *ht_ref = tu_alloc((size_t)c.state_numel * sizeof(double));
    double *steps_ref = tu_alloc(n_steps * sizeof(double));
    tu_case_naive(&c, o_ref, ht_ref, steps_ref);

    void *steps = tu_alloc_elems(sd, n_steps);
    tu_poison(steps, sd, n_steps);
    tu_case_poison(&c);

    int32_t idx_flat[MAXN * MAXT], nat[MAXN];
    int cols = s->rank2 ? s->cols : 1;
    for (int n = 0; n < s->N; n++) {
        for (int t = 0; t < cols; t++)
            idx_flat[n * cols + t] = s->idx[n][t];
        nat[n] = s->nat[n];
    }
    int64_t pool_shape[4] = {s->P, cfg.HV, s->layout == GDN_STATE_VK ? cfg.V : cfg.K,
                             s->layout == GDN_STATE_VK ? cfg.K : cfg.V};
    int64_t pool_stride[4] = {slot_stride, pool_shape[2] * pool_shape[3], pool_shape[3], 1};

    gdn_recurrent_fwd_args a = tu_case_recurrent_args(&c);
    a.state = tu_tensor_strided(pool, sd, 4, pool_shape, pool_stride);
    a.state_indices = s->rank2 ? TU_TENSOR(idx_flat, GDN_DTYPE_I32, s->N, cols) : TU_TENSOR(idx_flat, GDN_DTYPE_I32, s->N);
    if (s->use_nat)
        a.num_accepted_tokens = TU_TENSOR(nat, GDN_DTYPE_I32, s->N);
    a.inplace_state = s->inplace;
    a.null_slot_zero = s->null_slot_zero;
    if (!s->with_final)
        memset(&a.final_state, 0, sizeof a.final_state);
    if (s->with_steps)
        a.step_states = tu_case_state(&c, steps, sd, ntok);

    gdn_status st = gdn_recurrent_fwd(&a);
    if (!tu_expect(st == GDN_OK, "%s: %s (%s)", s->label, gdn_status_string(st), gdn_last_error()))
        goto done;

    /* Which slot receives which reference state. */
    const double *expect[64] = {0};
    for (int n = 0; n < s->N; n++) {
        if (start[n] < 0 || !s->inplace)
            continue;
        if (!s->rank2) {
            expect[start[n]] = ht_ref + (size_t)(n * slot_elems);
        } else {
            int64_t p0, p1;
            tu_case_seq(&c, n, &p0, &p1);
            for (int64_t t = 0; t < p1 - p0; t++)
                if (s->idx[n][t] >= 0)
                    expect[s->idx[n][t]] = steps_ref + (size_t)((p0 + t) * slot_elems);
        }
    }
    char what[160];
    for (int p = 0; p < s->P; p++) {
        unsigned char *slot = pool + (size_t)(p * slot_stride) * esz, *old = before + (size_t)(p * slot_stride) * esz;
        if (expect[p]) {
            snprintf(what, sizeof what, "%s pool slot %d", s->label, p);
            tu_check(what, tu_compare(slot, sd, expect[p], GDN_DTYPE_F64, (size_t)slot_elems), tol_state(sd));
            tu_expect(tu_same_bytes(slot + (size_t)slot_elems * esz, old + (size_t)slot_elems * esz,
                                    (size_t)s->pad * esz),
                      "%s: padding after pool slot %d was written", s->label, p);
        } else {
            tu_expect(tu_same_bytes(slot, old, (size_t)slot_stride * esz), "%s: pool slot %d should be untouched",
                      s->label, p);
        }
    }
    for (int n = 0; n < s->N; n++) {
        int64_t p0, p1;
        tu_case_seq(&c, n, &p0, &p1);
        size_t per_seq_o = (size_t)((p1 - p0) * tok_o), per_seq_steps = (size_t)((p1 - p0) * slot_elems);
        void *o_n = (char *)c.o + (size_t)(p0 * tok_o) * gdn_dtype_size(cfg.dtype);
        void *ht_n = (char *)c.ht + (size_t)(n * slot_elems) * esz;
        void *steps_n = (char *)steps + (size_t)(p0 * slot_elems) * esz;
        if (start[n] < 0) {
            tu_expect(count_nonzero(o_n, cfg.dtype, per_seq_o) == 0, "%s: skipped sequence %d: o not zeroed",
                      s->label, n);
            if (s->with_final)
                tu_expect(count_nonzero(ht_n, sd, (size_t)slot_elems) == 0,
                          "%s: skipped sequence %d: final_state not zeroed", s->label, n);
            if (s->with_steps)
                tu_expect(count_nonzero(steps_n, sd, per_seq_steps) == 0,
                          "%s: skipped sequence %d: step_states not zeroed", s->label, n);
            continue;
        }
        snprintf(what, sizeof what, "%s o seq %d", s->label, n);
        tu_check(what, tu_compare(o_n, cfg.dtype, o_ref + p0 * tok_o, GDN_DTYPE_F64, per_seq_o), 1e-5);
        if (s->with_final) {
            snprintf(what, sizeof what, "%s final_state seq %d", s->label, n);
            tu_check(what, tu_compare(ht_n, sd, ht_ref + (size_t)(n * slot_elems), GDN_DTYPE_F64, (size_t)slot_elems),
                     tol_state(sd));
        }
        if (s->with_steps) {
            snprintf(what, sizeof what, "%s step_states seq %d", s->label, n);
            tu_check(what,
                     tu_compare(steps_n, sd, steps_ref + p0 * slot_elems, GDN_DTYPE_F64, per_seq_steps),
                     tol_state(sd));
        }
    }
done:
    free(pool);
    free(before);
    free(o_ref);
    free(ht_ref);
    free(steps_ref);
    free(steps);
    tu_case_free(&c);
}

static int test_pool_decode_inplace(void)
{
    for (int variant = 0; variant < 4; variant++) {
        pool_spec s;
        memset(&s, 0, sizeof s);
        s.label = (const char *[]){"decode T=1 KV f32", "decode T=1 VK bf16", "multi-token T=3 VK f32",
                                   "decode T=1 null_slot_zero"}[variant];
        s.N = 4;
        s.T = variant == 2 ? 3 : 1;
        s.P = 7;
        s.idx[0][0] = 5;
        s.idx[1][0] = 2;
        s.idx[2][0] = -1; /* PAD_SLOT_ID: skipped */
        s.idx[3][0] = 0;  /* live, unless null_slot_zero */
        s.null_slot_zero = variant == 3;
        s.inplace = 1;
        s.with_final = variant != 1;
        s.with_steps = variant >= 2;
        s.layout = variant == 0 || variant == 3 ? GDN_STATE_KV : GDN_STATE_VK;
        s.state_dtype = variant == 1 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        s.pad = 40;
        run_pool(&s, 100 + (uint64_t)variant);
    }
    return TU_PASS;
}

static int test_pool_not_inplace(void)
{
    pool_spec s;
    memset(&s, 0, sizeof s);
    s.label = "pool read-only, final_state out";
    s.N = 3;
    s.T = 2;
    s.P = 5;
    s.idx[0][0] = 4;
    s.idx[1][0] = -1;
    s.idx[2][0] = 1;
    s.with_final = 1;
    s.with_steps = 1;
    s.pad = 8;
    run_pool(&s, 200);
    return TU_PASS;
}

static int test_pool_spec_verify(void)
{
    for (int variant = 0; variant < 3; variant++) {
        pool_spec s;
        memset(&s, 0, sizeof s);
        s.label = (const char *[]){"2-D idx + num_accepted_tokens KV", "2-D idx + num_accepted_tokens VK bf16",
                                   "2-D idx without num_accepted_tokens"}[variant];
        s.N = 5;
        s.T = 4;
        s.cols = 4;
        s.P = 24;
        s.rank2 = 1;
        static const int32_t idx[5][4] = {
            {1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, -1, 12}, /* a negative per-step slot skips one write */
            {13, 14, 15, 16}, {17, -1, 19, 20},
        };
        for (int n = 0; n < 5; n++)
            memcpy(s.idx[n], idx[n], sizeof idx[n]);
        /* seq 3: 0 accepted tokens is out of [1, T_max]: skipped; seq 4 starts from slot -1: skipped */
        static const int32_t nat[5] = {1, 3, 2, 0, 2};
        memcpy(s.nat, nat, sizeof nat);
        s.use_nat = variant < 2;
        s.inplace = 1;
        s.with_final = 1;
        s.with_steps = variant != 1;
        s.layout = variant == 1 ? GDN_STATE_VK : GDN_STATE_KV;
        s.state_dtype = variant == 1 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        s.pad = 24;
        run_pool(&s, 300 + (uint64_t)variant);
    }
    pool_spec s;
    memset(&s, 0, sizeof s);
    s.label = "2-D idx, num_accepted_tokens > T_max skips";
    s.N = 2;
    s.T = 3;
    s.cols = 3;
    s.P = 8;
    s.rank2 = 1;
    s.idx[0][0] = 1, s.idx[0][1] = 2, s.idx[0][2] = 3;
    s.idx[1][0] = 4, s.idx[1][1] = 5, s.idx[1][2] = 6;
    s.use_nat = 1;
    s.nat[0] = 3;
    s.nat[1] = 4;
    s.inplace = 1;
    s.with_final = 1;
    s.pad = 0;
    run_pool(&s, 310);
    return TU_PASS;
}

/* Speculative verify as vLLM calls it: packed sequences of different lengths (cu_seqlens), 2-D
 * indices with T_max columns, writes only for the tokens each sequence has. */
static int test_pool_spec_verify_varlen(void)
{
    for (int variant = 0; variant < 2; variant++) {
        pool_spec s;
        memset(&s, 0, sizeof s);
        s.label = variant ? "varlen 2-D idx, VK, read-only pool" : "varlen 2-D idx + num_accepted_tokens";
        s.N = 5;
        s.varlen = 1;
        static const int32_t lens[5] = {4, 1, 0, 3, 2};
        memcpy(s.lens, lens, sizeof lens);
        s.cols = 4;
        s.P = 24;
        s.rank2 = 1;
        static const int32_t idx[5][4] = {
            {1, 2, 3, 4}, {5, -1, -1, -1}, {6, 7, 8, 9}, {10, -1, 12, 13}, {14, 15, 16, 17},
        };
        for (int n = 0; n < 5; n++)
            memcpy(s.idx[n], idx[n], sizeof idx[n]);
        /* seq 2 is empty: it still starts from (and, with 1 accepted token, writes nothing to) a slot */
        static const int32_t nat[5] = {2, 1, 1, 4, 1};
        memcpy(s.nat, nat, sizeof nat);
        s.use_nat = 1;
        s.inplace = !variant;
        s.with_final = 1;
        s.with_steps = 1;
        s.layout = variant ? GDN_STATE_VK : GDN_STATE_KV;
        s.pad = 8;
        run_pool(&s, 400 + (uint64_t)variant);
    }
    return TU_PASS;
}

/* step_states without a pool, packed sequences: row = packed token index. */
static int test_step_states_varlen(void)
{
    pool_spec s;
    memset(&s, 0, sizeof s);
    s.label = "1-D idx varlen multi-token, step_states";
    s.N = 3;
    s.varlen = 1;
    s.lens[0] = 3, s.lens[1] = 0, s.lens[2] = 5;
    s.P = 6;
    s.idx[0][0] = 4, s.idx[1][0] = 2, s.idx[2][0] = 5;
    s.inplace = 1;
    s.with_final = 1;
    s.with_steps = 1;
    s.layout = GDN_STATE_VK;
    s.pad = 4;
    run_pool(&s, 500);
    return TU_PASS;
}

int main(int argc, char **argv)
{
    static const tu_test tests[] = {
        {"pool_decode_inplace", test_pool_decode_inplace},
        {"pool_not_inplace", test_pool_not_inplace},
        {"pool_spec_verify", test_pool_spec_verify},
        {"pool_spec_verify_varlen", test_pool_spec_verify_varlen},
        {"pool_step_states_varlen", test_step_states_varlen},
    };
    return tu_main(tests, TU_COUNT(tests), argc, argv);
}
