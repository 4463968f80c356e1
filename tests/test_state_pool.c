/*
 * test_state_pool.c - gdn_recurrent_fwd with a state pool, as serving engines call it: in-place
 * final states into a pool whose slot stride is padded, 2-D indices with num_accepted_tokens
 * and per-step writes (speculative verify), skipped sequences (negative slots, null_slot_zero,
 * num_accepted_tokens out of range) whose pool slots stay untouched and whose outputs are zeroed,
 * negative per-step slots that skip one write, final_state and step_states next to the pool.
 *
 * Expected values come from the naive double recurrence of the harness started from the slot
 * each sequence should read; untouched pool bytes (other slots, the padding) must be identical
 * (tu_pool_run in test_util.c, which tests/test_cuda_recurrent.c runs on the device too).
 *   build/tests/test_state_pool [name-substring ...]
 */
#include <string.h>

#include "test_util.h"

static double tol_state(gdn_dtype sd) { return sd == GDN_DTYPE_BF16 ? 1e-2 : 2e-5; }

/* One pool call on f32 inputs, H = 2, HV = 4, K = V = 64, precomputed gates of `kind`. */
static void run_pool_gates(const tu_pool_spec *s, uint64_t seed, gdn_gate_kind kind)
{
    tu_case_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.H = 2;
    cfg.HV = 4;
    cfg.K = 64;
    cfg.V = 64;
    cfg.l2norm = 1;
    cfg.kind = kind;
    tu_pool_run(s, &cfg, seed, NULL, 1e-5, tol_state(s->state_dtype));
}

static void run_pool(const tu_pool_spec *s, uint64_t seed) { run_pool_gates(s, seed, GDN_GATE_GDN); }

static int test_pool_decode_inplace(void)
{
    for (int variant = 0; variant < 4; variant++) {
        tu_pool_spec s;
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
    tu_pool_spec s;
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
        tu_pool_spec s;
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
    tu_pool_spec s;
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
        tu_pool_spec s;
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
    tu_pool_spec s;
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

/* In-place decode with the pool as the only destination (no final_state, no step_states) and
 * f32 states: the f32 recurrence updates each slot where it lies, in both layouts, for GDN and
 * KDA, next to skipped sequences and a padded slot stride. */
/* gdn_chunk_fwd reading and writing the pool (tu_chunk_pool_specs in test_util.c). */
static int test_chunk_pool(void)
{
    for (int v = 0; v < TU_CHUNK_POOL_SPECS; v++) {
        tu_pool_spec s;
        tu_chunk_pool_specs(v, &s);
        run_pool(&s, 700 + (uint64_t)v);
    }
    /* f64 inputs: the float64 oracle's own pool and checkpoint handling (cpu_recurrent.c). */
    tu_pool_spec s;
    tu_chunk_pool_specs(0, &s);
    s.label = "chunk pool, f64 oracle, has_initial_state, checkpoints M=64";
    tu_case_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.H = 1;
    cfg.HV = 2;
    cfg.K = 16;
    cfg.V = 8;
    cfg.dtype = GDN_DTYPE_F64;
    tu_pool_run(&s, &cfg, 710, NULL, 1e-12, 1e-7); /* the pool is f32 */
    return TU_PASS;
}

static int test_pool_decode_in_place_direct(void)
{
    for (int variant = 0; variant < 4; variant++) {
        tu_pool_spec s;
        memset(&s, 0, sizeof s);
        s.label = (const char *[]){"direct decode KV gdn", "direct decode VK gdn", "direct decode KV kda",
                                   "direct T=2 VK kda"}[variant];
        s.N = 4;
        s.T = variant == 3 ? 2 : 1;
        s.P = 6;
        s.idx[0][0] = 3;
        s.idx[1][0] = 0;
        s.idx[2][0] = -1;
        s.idx[3][0] = 5;
        s.null_slot_zero = variant == 2;
        s.inplace = 1;
        s.layout = variant % 2 ? GDN_STATE_VK : GDN_STATE_KV;
        s.state_dtype = GDN_DTYPE_F32;
        s.pad = variant * 16;
        run_pool_gates(&s, 300 + (uint64_t)variant, variant >= 2 ? GDN_GATE_KDA : GDN_GATE_GDN);
    }
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
        {"pool_decode_in_place_direct", test_pool_decode_in_place_direct},
        {"chunk_pool", test_chunk_pool},
    };
    return tu_main(tests, TU_COUNT(tests), argc, argv);
}
