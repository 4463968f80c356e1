/*
 * test_validation.c - every argument error the public API documents. For each case: the status
 * (GDN_ERR_INVALID_ARGUMENT, GDN_ERR_UNSUPPORTED, ...), a non-empty gdn_last_error() that names
 * the argument, and not one byte written to any output (all are poisoned and snapshotted first).
 * A valid baseline runs before the cases, and the allowed exact alias (final_state written over
 * the initial state) must succeed.
 *   build/tests/test_validation [name-substring ...]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { B = 2, T = 5, H = 2, HV = 4, K = 64, V = 64, P = 4 };
#define BIG (1u << 17) /* elements per buffer: room for every reshaped variant below */

/* Every buffer any case may point at. Outputs (o, ht, pool, steps, big, g_out, beta_out) are
 * poisoned and snapshotted around each failing call. */
typedef struct ctx {
    float *q, *k, *v, *o, *g, *beta, *a, *A_log, *dt_bias, *h0, *ht, *pool, *steps, *big, *g_out, *beta_out;
    int32_t cu[8], idx[16], nat[4];
} ctx;

/* The fields chunk and recurrent share, so one mutation serves both ops. */
typedef struct fields {
    gdn_tensor *q, *k, *v, *o, *cu, *h0, *ht;
    gdn_gate_params *gate;
    float *scale;
    gdn_state_layout *layout;
} fields;

static ctx X;

static gdn_tensor t4(float *p, int64_t a, int64_t b, int64_t c, int64_t d) { return TU_TENSOR(p, GDN_DTYPE_F32, a, b, c, d); }
static gdn_tensor t3(float *p, int64_t a, int64_t b, int64_t c) { return TU_TENSOR(p, GDN_DTYPE_F32, a, b, c); }

static gdn_chunk_fwd_args base_chunk(void)
{
    gdn_chunk_fwd_args a;
    memset(&a, 0, sizeof a);
    a.q = t4(X.q, B, T, H, K);
    a.k = t4(X.k, B, T, H, K);
    a.v = t4(X.v, B, T, HV, V);
    a.o = t4(X.o, B, T, HV, V);
    a.gate.kind = GDN_GATE_GDN;
    a.gate.g = t3(X.g, B, T, HV);
    a.gate.beta = t3(X.beta, B, T, HV);
    a.use_qk_l2norm = 1;
    a.state_layout = GDN_STATE_KV;
    a.initial_state = t4(X.h0, B, HV, K, V);
    a.final_state = t4(X.ht, B, HV, K, V);
    return a;
}

static gdn_recurrent_fwd_args base_recurrent(void)
{
    gdn_chunk_fwd_args c = base_chunk();
    gdn_recurrent_fwd_args a;
    memset(&a, 0, sizeof a);
    a.q = c.q, a.k = c.k, a.v = c.v, a.o = c.o, a.gate = c.gate;
    a.use_qk_l2norm = 1;
    a.state_layout = GDN_STATE_KV;
    a.state = c.initial_state;
    a.final_state = c.final_state;
    return a;
}

/* A pool of P slots with 1-D indices, written in place. */
static gdn_recurrent_fwd_args base_pool(void)
{
    gdn_recurrent_fwd_args a = base_recurrent();
    a.state = t4(X.pool, P, HV, K, V);
    X.idx[0] = 3;
    X.idx[1] = 1;
    a.state_indices = TU_TENSOR(X.idx, GDN_DTYPE_I32, B);
    a.inplace_state = 1;
    memset(&a.final_state, 0, sizeof a.final_state);
    return a;
}

/* Packed varlen: B = 1, T = 10 tokens in two sequences (4 + 6). */
static void make_varlen(fields *f)
{
    *f->q = t4(X.q, 1, 2 * T, H, K);
    *f->k = t4(X.k, 1, 2 * T, H, K);
    *f->v = t4(X.v, 1, 2 * T, HV, V);
    *f->o = t4(X.o, 1, 2 * T, HV, V);
    f->gate->g = t3(X.g, 1, 2 * T, HV);
    f->gate->beta = t3(X.beta, 1, 2 * T, HV);
    X.cu[0] = 0, X.cu[1] = 4, X.cu[2] = 2 * T;
    *f->cu = TU_TENSOR(X.cu, GDN_DTYPE_I32, 3);
}

static void use_raw_gates(fields *f)
{
    memset(&f->gate->g, 0, sizeof f->gate->g);
    f->gate->a = t3(X.a, B, T, HV);
    f->gate->A_log = TU_TENSOR(X.A_log, GDN_DTYPE_F32, HV);
    f->gate->beta_from_logits = 1;
}

static void use_kda_raw(fields *f)
{
    memset(&f->gate->g, 0, sizeof f->gate->g);
    f->gate->kind = GDN_GATE_KDA;
    f->gate->a = t4(X.a, B, T, HV, K);
    f->gate->A_log = TU_TENSOR(X.A_log, GDN_DTYPE_F32, HV);
    f->gate->dt_bias = TU_TENSOR(X.dt_bias, GDN_DTYPE_F32, HV, K);
}

/* ------------------------------------------------------------------------------------------ */
/* Mutations shared by both forward ops                                                        */

typedef struct common_case {
    const char *name;
    void (*mutate)(fields *f);
    gdn_status want;
    const char *names; /* substring gdn_last_error() must contain */
} common_case;

#define MUT(fn) static void fn(fields *f)
MUT(m_q_absent) { f->q->data = NULL; }
MUT(m_k_absent) { f->k->data = NULL; }
MUT(m_v_absent) { f->v->data = NULL; }
MUT(m_o_absent) { f->o->data = NULL; }
MUT(m_beta_absent) { f->gate->beta.data = NULL; }
MUT(m_g_and_a) { f->gate->a = t3(X.a, B, T, HV); f->gate->A_log = TU_TENSOR(X.A_log, GDN_DTYPE_F32, HV); }
MUT(m_no_gate) { f->gate->g.data = NULL; }
MUT(m_a_no_A_log) { use_raw_gates(f); f->gate->A_log.data = NULL; }
MUT(m_A_log_shape) { use_raw_gates(f); f->gate->A_log.shape[0] = HV + 1; }
MUT(m_dt_bias_shape) { use_raw_gates(f); f->gate->dt_bias = TU_TENSOR(X.dt_bias, GDN_DTYPE_F32, HV, K); }
MUT(m_q_dtype_i32) { f->q->dtype = GDN_DTYPE_I32; }
MUT(m_q_dtype_bad) { f->q->dtype = (gdn_dtype)9; }
MUT(m_k_dtype) { f->k->dtype = GDN_DTYPE_BF16; }
MUT(m_v_dtype) { f->v->dtype = GDN_DTYPE_F16; }
MUT(m_o_dtype) { f->o->dtype = GDN_DTYPE_BF16; }
MUT(m_g_dtype) { f->gate->g.dtype = GDN_DTYPE_BF16; }
MUT(m_beta_dtype) { f->gate->beta.dtype = GDN_DTYPE_I32; }
MUT(m_f64_mixed) { f->k->dtype = GDN_DTYPE_F64; }
MUT(m_q_rank3) { *f->q = t3(X.q, B, T, H * K); }
MUT(m_q_rank0) { f->q->rank = 0; }
MUT(m_q_rank5) { f->q->rank = 5; }
MUT(m_k_heads) { *f->k = t4(X.k, B, T, H + 1, K); }
MUT(m_k_dim) { *f->k = t4(X.k, B, T, H, 128); }
MUT(m_v_T) { *f->v = t4(X.v, B, T + 1, HV, V); }
MUT(m_v_B) { *f->v = t4(X.v, B + 1, T, HV, V); }
MUT(m_o_V) { *f->o = t4(X.o, B, T, HV, 128); }
MUT(m_o_HV) { *f->o = t4(X.o, B, T, HV / 2, V); }
MUT(m_g_shape) { f->gate->g = t3(X.g, B, T, HV + 1); }
MUT(m_g_rank_kda) { f->gate->kind = GDN_GATE_KDA; }
MUT(m_beta_shape) { f->gate->beta = t3(X.beta, B, T + 1, HV); }
MUT(m_hv_not_multiple) { *f->q = t4(X.q, B, T, 3, K); *f->k = t4(X.k, B, T, 3, K); }
MUT(m_cu_start) { make_varlen(f); X.cu[0] = 1; }
MUT(m_cu_decreasing) { make_varlen(f); X.cu[1] = 11; }
MUT(m_cu_end) { make_varlen(f); X.cu[2] = 2 * T - 1; }
MUT(m_cu_B2) { X.cu[0] = 0, X.cu[1] = 2, X.cu[2] = T; *f->cu = TU_TENSOR(X.cu, GDN_DTYPE_I32, 3); }
MUT(m_cu_dtype) { make_varlen(f); f->cu->dtype = GDN_DTYPE_F32; }
MUT(m_cu_short) { make_varlen(f); f->cu->shape[0] = 1; }
MUT(m_state_heads) { *f->h0 = t4(X.h0, B, HV + 1, K, V); }
MUT(m_final_rows) { *f->ht = t4(X.ht, B + 1, HV, K, V); }
MUT(m_state_layout_shape) { *f->h0 = t4(X.h0, B, HV, K, 128); *f->ht = t4(X.ht, B, HV, K, 128); }
MUT(m_state_dtype_f16) { f->h0->dtype = GDN_DTYPE_F16; f->ht->dtype = GDN_DTYPE_F16; }
MUT(m_state_dtype_mixed) { f->ht->dtype = GDN_DTYPE_BF16; }
MUT(m_state_layout_enum) { *f->layout = (gdn_state_layout)5; }
MUT(m_o_overlaps_q) { memcpy(X.big, X.q, (size_t)(B * T * H * K) * sizeof(float)); *f->q = t4(X.big, B, T, H, K);
                      *f->o = t4(X.big + 100, B, T, HV, V); }
MUT(m_o_overlaps_v) { *f->o = *f->v; }
MUT(m_final_overlaps_o) { *f->ht = t4(X.o, B, HV, K, V); }
MUT(m_final_partial_h0) { *f->h0 = t4(X.big, B, HV, K, V); *f->ht = t4(X.big + HV * K * V, B, HV, K, V); }
MUT(m_final_alias_other_strides) { *f->h0 = t4(X.big, B, HV, K, V); *f->ht = t4(X.big, B, HV, K, V);
                                   f->ht->stride[0] = 2 * HV * K * V; }
MUT(m_k_cuda) { f->k->device = GDN_DEVICE_CUDA; }
MUT(m_o_cuda1) { f->o->device = GDN_DEVICE_CUDA; f->o->device_ordinal = 1; }
MUT(m_cpu_ordinal) { f->v->device_ordinal = 2; }
MUT(m_negative_stride) { f->q->stride[1] = -(H * K); }
MUT(m_negative_shape) { f->q->shape[1] = -1; }
MUT(m_misaligned) { f->v->data = (char *)X.v + 2; }
MUT(m_kind_enum) { f->gate->kind = (gdn_gate_kind)7; }
MUT(m_lb_gdn) { use_raw_gates(f); f->gate->lower_bound = -1.0f; }
MUT(m_lb_low) { use_kda_raw(f); f->gate->lower_bound = -6.0f; }
MUT(m_lb_pos) { use_kda_raw(f); f->gate->lower_bound = 0.5f; }
MUT(m_lb_precomputed) { f->gate->kind = GDN_GATE_KDA; f->gate->g = t4(X.g, B, T, HV, K); f->gate->lower_bound = -1.0f; }
MUT(m_A_log_with_g) { f->gate->A_log = TU_TENSOR(X.A_log, GDN_DTYPE_F32, HV); }
MUT(m_scale_nan) { *f->scale = NAN; }
MUT(m_softplus_beta) { use_raw_gates(f); f->gate->softplus_beta = -1.0f; }
MUT(m_softplus_threshold) { use_raw_gates(f); f->gate->softplus_threshold = INFINITY; }
MUT(m_a_dtype_i32) { use_raw_gates(f); f->gate->a.dtype = GDN_DTYPE_I32; }
MUT(m_zero_heads) { *f->q = t4(X.q, B, T, 0, K); *f->k = t4(X.k, B, T, 0, K); }

static const common_case COMMON[] = {
    {"q absent", m_q_absent, GDN_ERR_INVALID_ARGUMENT, "q"},
    {"k absent", m_k_absent, GDN_ERR_INVALID_ARGUMENT, "k"},
    {"v absent", m_v_absent, GDN_ERR_INVALID_ARGUMENT, "v"},
    {"o absent", m_o_absent, GDN_ERR_INVALID_ARGUMENT, "o"},
    {"beta absent", m_beta_absent, GDN_ERR_INVALID_ARGUMENT, "beta"},
    {"g and a both given", m_g_and_a, GDN_ERR_INVALID_ARGUMENT, "gate.a"},
    {"neither g nor a", m_no_gate, GDN_ERR_INVALID_ARGUMENT, "gate.g"},
    {"a without A_log", m_a_no_A_log, GDN_ERR_INVALID_ARGUMENT, "A_log"},
    {"A_log shape", m_A_log_shape, GDN_ERR_INVALID_ARGUMENT, "A_log"},
    {"dt_bias KDA shape on GDN", m_dt_bias_shape, GDN_ERR_INVALID_ARGUMENT, "dt_bias"},
    {"q dtype i32", m_q_dtype_i32, GDN_ERR_INVALID_ARGUMENT, "q"},
    {"q dtype not an enum", m_q_dtype_bad, GDN_ERR_INVALID_ARGUMENT, "q"},
    {"k dtype differs from q", m_k_dtype, GDN_ERR_INVALID_ARGUMENT, "k"},
    {"v dtype differs from q", m_v_dtype, GDN_ERR_INVALID_ARGUMENT, "v"},
    {"o dtype differs from q", m_o_dtype, GDN_ERR_INVALID_ARGUMENT, "o"},
    {"g dtype bf16", m_g_dtype, GDN_ERR_INVALID_ARGUMENT, "g"},
    {"beta dtype i32", m_beta_dtype, GDN_ERR_INVALID_ARGUMENT, "beta"},
    {"f64 k with f32 q", m_f64_mixed, GDN_ERR_INVALID_ARGUMENT, "k"},
    {"q rank 3", m_q_rank3, GDN_ERR_INVALID_ARGUMENT, "q"},
    {"q rank 0", m_q_rank0, GDN_ERR_INVALID_ARGUMENT, "q"},
    {"q rank 5", m_q_rank5, GDN_ERR_INVALID_ARGUMENT, "q"},
    {"k heads differ from q", m_k_heads, GDN_ERR_INVALID_ARGUMENT, "k"},
    {"k head dim differs from q", m_k_dim, GDN_ERR_INVALID_ARGUMENT, "k"},
    {"v T differs", m_v_T, GDN_ERR_INVALID_ARGUMENT, "v"},
    {"v B differs", m_v_B, GDN_ERR_INVALID_ARGUMENT, "v"},
    {"o V differs from v", m_o_V, GDN_ERR_INVALID_ARGUMENT, "o"},
    {"o HV differs from v", m_o_HV, GDN_ERR_INVALID_ARGUMENT, "o"},
    {"g shape", m_g_shape, GDN_ERR_INVALID_ARGUMENT, "g"},
    {"KDA kind with GDN-shaped g", m_g_rank_kda, GDN_ERR_INVALID_ARGUMENT, "g"},
    {"beta shape", m_beta_shape, GDN_ERR_INVALID_ARGUMENT, "beta"},
    {"HV % H != 0", m_hv_not_multiple, GDN_ERR_INVALID_ARGUMENT, "HV"},
    {"H = 0", m_zero_heads, GDN_ERR_INVALID_ARGUMENT, "H"},
    {"cu_seqlens[0] != 0", m_cu_start, GDN_ERR_INVALID_ARGUMENT, "cu_seqlens"},
    {"cu_seqlens decreasing", m_cu_decreasing, GDN_ERR_INVALID_ARGUMENT, "cu_seqlens"},
    {"cu_seqlens not ending at T", m_cu_end, GDN_ERR_INVALID_ARGUMENT, "cu_seqlens"},
    {"cu_seqlens with B != 1", m_cu_B2, GDN_ERR_INVALID_ARGUMENT, "cu_seqlens"},
    {"cu_seqlens dtype f32", m_cu_dtype, GDN_ERR_INVALID_ARGUMENT, "cu_seqlens"},
    {"cu_seqlens one entry", m_cu_short, GDN_ERR_INVALID_ARGUMENT, "cu_seqlens"},
    {"state HV mismatch", m_state_heads, GDN_ERR_INVALID_ARGUMENT, "state"},
    {"final_state rows != N", m_final_rows, GDN_ERR_INVALID_ARGUMENT, "final_state"},
    {"state V mismatch", m_state_layout_shape, GDN_ERR_INVALID_ARGUMENT, "state"},
    {"state dtype f16", m_state_dtype_f16, GDN_ERR_INVALID_ARGUMENT, "state"},
    {"state dtypes differ", m_state_dtype_mixed, GDN_ERR_INVALID_ARGUMENT, "final_state"},
    {"state_layout not an enum", m_state_layout_enum, GDN_ERR_INVALID_ARGUMENT, "state_layout"},
    {"o overlaps q", m_o_overlaps_q, GDN_ERR_INVALID_ARGUMENT, "o"},
    {"o is v", m_o_overlaps_v, GDN_ERR_INVALID_ARGUMENT, "o"},
    {"final_state overlaps o", m_final_overlaps_o, GDN_ERR_INVALID_ARGUMENT, "final_state"},
    {"final_state partially overlaps initial", m_final_partial_h0, GDN_ERR_INVALID_ARGUMENT, "final_state"},
    {"final_state same pointer, other strides", m_final_alias_other_strides, GDN_ERR_INVALID_ARGUMENT, "final_state"},
    {"k on CUDA, q on CPU", m_k_cuda, GDN_ERR_INVALID_ARGUMENT, "k"},
    {"o on cuda:1", m_o_cuda1, GDN_ERR_INVALID_ARGUMENT, "o"},
    {"CPU tensor with ordinal 2", m_cpu_ordinal, GDN_ERR_INVALID_ARGUMENT, "v"},
    {"negative stride", m_negative_stride, GDN_ERR_INVALID_ARGUMENT, "q"},
    {"negative shape", m_negative_shape, GDN_ERR_INVALID_ARGUMENT, "q"},
    {"misaligned v", m_misaligned, GDN_ERR_INVALID_ARGUMENT, "v"},
    {"gate kind not an enum", m_kind_enum, GDN_ERR_INVALID_ARGUMENT, "kind"},
    {"lower_bound on GDN", m_lb_gdn, GDN_ERR_INVALID_ARGUMENT, "lower_bound"},
    {"KDA lower_bound -6", m_lb_low, GDN_ERR_INVALID_ARGUMENT, "lower_bound"},
    {"KDA lower_bound 0.5", m_lb_pos, GDN_ERR_INVALID_ARGUMENT, "lower_bound"},
    {"lower_bound with precomputed g", m_lb_precomputed, GDN_ERR_INVALID_ARGUMENT, "lower_bound"},
    {"A_log with precomputed g", m_A_log_with_g, GDN_ERR_INVALID_ARGUMENT, "A_log"},
    {"scale NaN", m_scale_nan, GDN_ERR_INVALID_ARGUMENT, "scale"},
    {"softplus_beta < 0", m_softplus_beta, GDN_ERR_INVALID_ARGUMENT, "softplus_beta"},
    {"softplus_threshold Inf", m_softplus_threshold, GDN_ERR_INVALID_ARGUMENT, "softplus_threshold"},
    {"a dtype i32", m_a_dtype_i32, GDN_ERR_INVALID_ARGUMENT, "a"},
};

/* ------------------------------------------------------------------------------------------ */
/* Checking one failing call                                                                   */

typedef struct snap {
    float *buf;
    size_t n;
    void *copy;
} snap;

static snap SNAPS[8];
static int N_SNAPS;

static void poison_outputs(void)
{
    float *outs[] = {X.o, X.ht, X.pool, X.steps, X.big, X.g_out, X.beta_out};
    N_SNAPS = 0;
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
        tu_poison(outs[i], GDN_DTYPE_F32, BIG);
        SNAPS[N_SNAPS].buf = outs[i];
        SNAPS[N_SNAPS].n = BIG * sizeof(float);
        SNAPS[N_SNAPS].copy = tu_snapshot(outs[i], BIG * sizeof(float));
        N_SNAPS++;
    }
}

/* Whether nothing changed, freeing the snapshots. Inputs placed in `big` by a mutation are
 * copied there before poison_outputs runs, so big is compared as well. */
static int outputs_untouched(void)
{
    int same = 1;
    for (int i = 0; i < N_SNAPS; i++) {
        same &= tu_same_bytes(SNAPS[i].buf, SNAPS[i].copy, SNAPS[i].n);
        free(SNAPS[i].copy);
    }
    N_SNAPS = 0;
    return same;
}

static void expect_error(const char *op, const char *name, gdn_status st, gdn_status want, const char *names)
{
    const char *msg = gdn_last_error();
    int untouched = outputs_untouched();
    tu_expect(st == want, "%s / %s: status %s, expected %s (message: \"%s\")", op, name, gdn_status_string(st),
              gdn_status_string(want), msg);
    tu_expect(msg && msg[0] != 0, "%s / %s: gdn_last_error() is empty", op, name);
    tu_expect(msg && strstr(msg, names) != NULL, "%s / %s: message \"%s\" does not name \"%s\"", op, name, msg,
              names);
    tu_expect(untouched, "%s / %s: an output was written although the call failed", op, name);
}

static void fields_of_chunk(gdn_chunk_fwd_args *a, fields *f)
{
    f->q = &a->q, f->k = &a->k, f->v = &a->v, f->o = &a->o, f->cu = &a->cu_seqlens;
    f->h0 = &a->initial_state, f->ht = &a->final_state, f->gate = &a->gate, f->scale = &a->scale;
    f->layout = &a->state_layout;
}

static void fields_of_recurrent(gdn_recurrent_fwd_args *a, fields *f)
{
    f->q = &a->q, f->k = &a->k, f->v = &a->v, f->o = &a->o, f->cu = &a->cu_seqlens;
    f->h0 = &a->state, f->ht = &a->final_state, f->gate = &a->gate, f->scale = &a->scale;
    f->layout = &a->state_layout;
}

/* ------------------------------------------------------------------------------------------ */
/* Tests                                                                                       */

static int test_baseline_valid(void)
{
    gdn_chunk_fwd_args c = base_chunk();
    gdn_status st = tu_chunk_fwd(&c);
    tu_expect(st == GDN_OK, "baseline chunk: %s (%s)", gdn_status_string(st), gdn_last_error());
    tu_expect(gdn_last_error()[0] == 0, "gdn_last_error() after success: \"%s\"", gdn_last_error());
    gdn_recurrent_fwd_args r = base_recurrent();
    st = tu_recurrent_fwd(&r);
    tu_expect(st == GDN_OK, "baseline recurrent: %s (%s)", gdn_status_string(st), gdn_last_error());
    r = base_pool();
    st = tu_recurrent_fwd(&r);
    tu_expect(st == GDN_OK, "baseline pool: %s (%s)", gdn_status_string(st), gdn_last_error());
    /* every varlen / raw-gate / KDA helper used by the cases is valid on its own */
    for (int which = 0; which < 3; which++) {
        c = base_chunk();
        fields f;
        fields_of_chunk(&c, &f);
        if (which == 0)
            make_varlen(&f);
        else if (which == 1)
            use_raw_gates(&f);
        else
            use_kda_raw(&f);
        st = tu_chunk_fwd(&c);
        tu_expect(st == GDN_OK, "baseline chunk variant %d: %s (%s)", which, gdn_status_string(st), gdn_last_error());
    }
    /* The CPU ops take their scratch from the caller's workspace too: without it they refuse
     * (naming the workspace and the size the query gives) and write nothing. */
    size_t bytes = 0;
    c = base_chunk();
    st = gdn_chunk_fwd_workspace_size(&c, &bytes);
    tu_expect(st == GDN_OK && bytes > 0, "CPU chunk workspace: %s, %zu bytes", gdn_status_string(st), bytes);
    poison_outputs();
    st = gdn_chunk_fwd(&c);
    expect_error("chunk", "CPU call without a workspace", st, GDN_ERR_WORKSPACE, "workspace");
    r = base_recurrent();
    st = gdn_recurrent_fwd(&r);
    expect_error("recurrent", "CPU call without a workspace", st, GDN_ERR_WORKSPACE, "workspace");
    return TU_PASS;
}

static int test_common_errors_chunk(void)
{
    for (size_t i = 0; i < sizeof COMMON / sizeof COMMON[0]; i++) {
        gdn_chunk_fwd_args a = base_chunk();
        fields f;
        fields_of_chunk(&a, &f);
        COMMON[i].mutate(&f);
        poison_outputs();
        gdn_status st = tu_chunk_fwd(&a);
        expect_error("chunk", COMMON[i].name, st, COMMON[i].want, COMMON[i].names);
        /* the workspace query validates the same way */
        size_t bytes = 12345;
        poison_outputs();
        st = gdn_chunk_fwd_workspace_size(&a, &bytes);
        expect_error("chunk_workspace_size", COMMON[i].name, st, COMMON[i].want, COMMON[i].names);
    }
    return TU_PASS;
}

static int test_common_errors_recurrent(void)
{
    for (size_t i = 0; i < sizeof COMMON / sizeof COMMON[0]; i++) {
        gdn_recurrent_fwd_args a = base_recurrent();
        fields f;
        fields_of_recurrent(&a, &f);
        COMMON[i].mutate(&f);
        poison_outputs();
        gdn_status st = tu_recurrent_fwd(&a);
        expect_error("recurrent", COMMON[i].name, st, COMMON[i].want, COMMON[i].names);
    }
    return TU_PASS;
}

typedef struct rec_case {
    const char *name;
    void (*mutate)(gdn_recurrent_fwd_args *a);
    gdn_status want;
    const char *names;
} rec_case;

#define RMUT(fn) static void fn(gdn_recurrent_fwd_args *a)
RMUT(r_idx_out_of_range) { X.idx[1] = P; }
RMUT(r_idx_2d_out_of_range) { for (int i = 0; i < 2 * T; i++) X.idx[i] = i % P; X.idx[7] = P + 3;
                              a->state_indices = TU_TENSOR(X.idx, GDN_DTYPE_I32, B, T); }
RMUT(r_nat_1d) { X.nat[0] = X.nat[1] = 1; a->num_accepted_tokens = TU_TENSOR(X.nat, GDN_DTYPE_I32, B); }
RMUT(r_nat_no_idx) { memset(&a->state_indices, 0, sizeof a->state_indices); a->inplace_state = 0;
                     a->state = t4(X.h0, B, HV, K, V);
                     a->num_accepted_tokens = TU_TENSOR(X.nat, GDN_DTYPE_I32, B); }
RMUT(r_nat_shape) { for (int i = 0; i < 2 * T; i++) X.idx[i] = i % P;
                    a->state_indices = TU_TENSOR(X.idx, GDN_DTYPE_I32, B, T);
                    a->num_accepted_tokens = TU_TENSOR(X.nat, GDN_DTYPE_I32, B + 1); }
RMUT(r_inplace_no_idx) { memset(&a->state_indices, 0, sizeof a->state_indices);
                         a->state = t4(X.h0, B, HV, K, V); }
RMUT(r_null_slot_no_idx) { memset(&a->state_indices, 0, sizeof a->state_indices); a->inplace_state = 0;
                           a->state = t4(X.h0, B, HV, K, V); a->null_slot_zero = 1; }
RMUT(r_idx_no_state) { memset(&a->state, 0, sizeof a->state); }
RMUT(r_idx_dtype) { a->state_indices.dtype = GDN_DTYPE_F32; }
RMUT(r_idx_rows) { a->state_indices.shape[0] = B + 1; }
RMUT(r_idx_rank3) { a->state_indices = TU_TENSOR(X.idx, GDN_DTYPE_I32, B, 1, 1); }
RMUT(r_idx_cols_lt_T) { for (int i = 0; i < 2 * T; i++) X.idx[i] = i % P;
                        a->state_indices = TU_TENSOR(X.idx, GDN_DTYPE_I32, B, T - 2); }
RMUT(r_pool_dtype) { a->state.dtype = GDN_DTYPE_F16; }
RMUT(r_pool_shape) { a->state = t4(X.pool, P, HV, V, V / 2); }
RMUT(r_pool_final_dtype) { a->final_state = t4(X.ht, B, HV, K, V); a->final_state.dtype = GDN_DTYPE_BF16; }
RMUT(r_steps_rows) { a->step_states = t4(X.steps, B * T - 1, HV, K, V); }
RMUT(r_steps_overlap_final) { a->final_state = t4(X.ht, B, HV, K, V);
                              a->step_states = t4(X.ht + 7, B * T, HV, K, V); }
RMUT(r_o_overlaps_pool) { a->o = t4(X.pool + 64, B, T, HV, V); }
RMUT(r_final_overlaps_pool) { a->final_state = t4(X.pool, B, HV, K, V); }
RMUT(r_final_partial_state) { memset(&a->state_indices, 0, sizeof a->state_indices); a->inplace_state = 0;
                              a->state = t4(X.big, B, HV, K, V); a->final_state = t4(X.big + 64, B, HV, K, V); }

static const rec_case RECURRENT[] = {
    {"state_indices >= P", r_idx_out_of_range, GDN_ERR_INVALID_ARGUMENT, "state_indices"},
    {"2-D state_indices >= P", r_idx_2d_out_of_range, GDN_ERR_INVALID_ARGUMENT, "state_indices"},
    {"num_accepted_tokens with 1-D indices", r_nat_1d, GDN_ERR_INVALID_ARGUMENT, "num_accepted_tokens"},
    {"num_accepted_tokens without indices", r_nat_no_idx, GDN_ERR_INVALID_ARGUMENT, "num_accepted_tokens"},
    {"num_accepted_tokens shape", r_nat_shape, GDN_ERR_INVALID_ARGUMENT, "num_accepted_tokens"},
    {"inplace_state without indices", r_inplace_no_idx, GDN_ERR_INVALID_ARGUMENT, "inplace_state"},
    {"null_slot_zero without indices", r_null_slot_no_idx, GDN_ERR_INVALID_ARGUMENT, "null_slot_zero"},
    {"state_indices without a pool", r_idx_no_state, GDN_ERR_INVALID_ARGUMENT, "state"},
    {"state_indices dtype f32", r_idx_dtype, GDN_ERR_INVALID_ARGUMENT, "state_indices"},
    {"state_indices rows != N", r_idx_rows, GDN_ERR_INVALID_ARGUMENT, "state_indices"},
    {"state_indices rank 3", r_idx_rank3, GDN_ERR_INVALID_ARGUMENT, "state_indices"},
    {"2-D indices narrower than T (in place)", r_idx_cols_lt_T, GDN_ERR_INVALID_ARGUMENT, "state_indices"},
    {"pool dtype f16", r_pool_dtype, GDN_ERR_INVALID_ARGUMENT, "state"},
    {"pool shape", r_pool_shape, GDN_ERR_INVALID_ARGUMENT, "state"},
    {"final_state dtype differs from pool", r_pool_final_dtype, GDN_ERR_INVALID_ARGUMENT, "final_state"},
    {"step_states rows != B*T", r_steps_rows, GDN_ERR_INVALID_ARGUMENT, "step_states"},
    {"step_states overlaps final_state", r_steps_overlap_final, GDN_ERR_INVALID_ARGUMENT, "step_states"},
    {"o overlaps the in-place pool", r_o_overlaps_pool, GDN_ERR_INVALID_ARGUMENT, "o"},
    {"final_state overlaps the in-place pool", r_final_overlaps_pool, GDN_ERR_INVALID_ARGUMENT, "final_state"},
    {"final_state partially overlaps state", r_final_partial_state, GDN_ERR_INVALID_ARGUMENT, "final_state"},
};

static int test_recurrent_errors(void)
{
    for (size_t i = 0; i < sizeof RECURRENT / sizeof RECURRENT[0]; i++) {
        gdn_recurrent_fwd_args a = base_pool();
        RECURRENT[i].mutate(&a);
        poison_outputs();
        gdn_status st = tu_recurrent_fwd(&a);
        expect_error("recurrent", RECURRENT[i].name, st, RECURRENT[i].want, RECURRENT[i].names);
        size_t bytes = 12345;
        poison_outputs();
        st = gdn_recurrent_fwd_workspace_size(&a, &bytes);
        expect_error("recurrent_workspace_size", RECURRENT[i].name, st, RECURRENT[i].want, RECURRENT[i].names);
    }
    return TU_PASS;
}

static int test_null_args(void)
{
    gdn_status st = gdn_chunk_fwd(NULL);
    tu_expect(st == GDN_ERR_INVALID_ARGUMENT && strstr(gdn_last_error(), "args"), "chunk(NULL): %s \"%s\"",
              gdn_status_string(st), gdn_last_error());
    st = gdn_recurrent_fwd(NULL);
    tu_expect(st == GDN_ERR_INVALID_ARGUMENT && strstr(gdn_last_error(), "args"), "recurrent(NULL): %s \"%s\"",
              gdn_status_string(st), gdn_last_error());
    st = gdn_gating(NULL);
    tu_expect(st == GDN_ERR_INVALID_ARGUMENT && strstr(gdn_last_error(), "args"), "gating(NULL): %s \"%s\"",
              gdn_status_string(st), gdn_last_error());
    gdn_chunk_fwd_args c = base_chunk();
    st = gdn_chunk_fwd_workspace_size(&c, NULL);
    tu_expect(st == GDN_ERR_INVALID_ARGUMENT && strstr(gdn_last_error(), "bytes"), "chunk workspace(bytes NULL): %s",
              gdn_status_string(st));
    gdn_recurrent_fwd_args r = base_recurrent();
    st = gdn_recurrent_fwd_workspace_size(&r, NULL);
    tu_expect(st == GDN_ERR_INVALID_ARGUMENT && strstr(gdn_last_error(), "bytes"),
              "recurrent workspace(bytes NULL): %s", gdn_status_string(st));
    return TU_PASS;
}

/* Exact aliasing of final_state over the initial state is allowed and gives the same result. */
static int test_exact_alias_allowed(void)
{
    size_t n_s = (size_t)(B * HV * K * V);
    tu_rng r = tu_rng_make(5);
    tu_fill_normal(X.h0, n_s, &r, 0.0f, 0.5f);
    gdn_chunk_fwd_args c = base_chunk();
    gdn_status st = tu_chunk_fwd(&c);
    tu_expect(st == GDN_OK, "chunk separate states: %s", gdn_last_error());
    float *want_o = tu_snapshot(X.o, (size_t)(B * T * HV * V) * sizeof(float));
    memcpy(X.big, X.h0, n_s * sizeof(float));
    c.initial_state = t4(X.big, B, HV, K, V);
    c.final_state = c.initial_state;
    st = tu_chunk_fwd(&c);
    tu_expect(st == GDN_OK, "chunk final_state == initial_state: %s (%s)", gdn_status_string(st), gdn_last_error());
    tu_check("chunk alias final state", tu_compare(X.big, GDN_DTYPE_F32, X.ht, GDN_DTYPE_F32, n_s), 0.0);
    tu_check("chunk alias o", tu_compare(X.o, GDN_DTYPE_F32, want_o, GDN_DTYPE_F32, (size_t)(B * T * HV * V)), 0.0);

    gdn_recurrent_fwd_args a = base_recurrent();
    memcpy(X.big, X.h0, n_s * sizeof(float));
    a.state = t4(X.big, B, HV, K, V);
    a.final_state = a.state;
    st = tu_recurrent_fwd(&a);
    tu_expect(st == GDN_OK, "recurrent final_state == state: %s (%s)", gdn_status_string(st), gdn_last_error());
    a = base_recurrent();
    st = tu_recurrent_fwd(&a);
    tu_check("recurrent alias final state", tu_compare(X.big, GDN_DTYPE_F32, X.ht, GDN_DTYPE_F32, n_s), 1e-6);
    free(want_o);
    return TU_PASS;
}

/* CUDA tensors in a library built without CUDA: GDN_ERR_NO_BACKEND (skipped in CUDA builds,
 * where these host pointers would reach a kernel). */
static int test_no_backend(void)
{
    if (gdn_has_cuda()) {
        tu_skip_reason("library built with CUDA");
        return TU_SKIP;
    }
    gdn_chunk_fwd_args c = base_chunk();
    gdn_tensor *ts[] = {&c.q, &c.k, &c.v, &c.o, &c.gate.g, &c.gate.beta, &c.initial_state, &c.final_state};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        ts[i]->device = GDN_DEVICE_CUDA;
    poison_outputs();
    gdn_status st = tu_chunk_fwd(&c);
    expect_error("chunk", "all tensors on CUDA without the CUDA backend", st, GDN_ERR_NO_BACKEND, "q");
    return TU_PASS;
}

typedef struct gating_case {
    const char *name;
    void (*mutate)(gdn_gating_args *a);
    gdn_status want;
    const char *names;
} gating_case;

#define GMUT(fn) static void fn(gdn_gating_args *a)
GMUT(gm_a_absent) { a->a.data = NULL; }
GMUT(gm_g_out_absent) { a->g_out.data = NULL; }
GMUT(gm_A_log_absent) { a->A_log.data = NULL; }
GMUT(gm_g_out_shape) { a->g_out = t3(X.g_out, B, T, HV + 1); }
GMUT(gm_g_out_dtype) { a->g_out.dtype = GDN_DTYPE_BF16; }
GMUT(gm_b_no_beta_out) { a->beta_out.data = NULL; }
GMUT(gm_beta_out_no_b) { a->b.data = NULL; }
GMUT(gm_b_shape) { a->b = t3(X.beta, B, T + 1, HV); }
GMUT(gm_lb_gdn) { a->lower_bound = -1.0f; }
GMUT(gm_lb_kda_low) { a->kind = GDN_GATE_KDA; a->a = t4(X.a, B, T, HV, K); a->g_out = t4(X.g_out, B, T, HV, K);
                      a->dt_bias.data = NULL; a->lower_bound = -5.5f; }
GMUT(gm_dt_bias_kda_shape) { a->kind = GDN_GATE_KDA; a->a = t4(X.a, B, T, HV, K); a->g_out = t4(X.g_out, B, T, HV, K); }
GMUT(gm_overlap) { a->g_out = t3(X.a, B, T, HV); }
GMUT(gm_outputs_overlap) { a->beta_out = t3(X.g_out, B, T, HV); }
GMUT(gm_kind) { a->kind = (gdn_gate_kind)3; }
GMUT(gm_softplus) { a->softplus_beta = NAN; }
GMUT(gm_mixed_device) { a->b.device = GDN_DEVICE_CUDA; }

static const gating_case GATING[] = {
    {"a absent", gm_a_absent, GDN_ERR_INVALID_ARGUMENT, "a"},
    {"g_out absent", gm_g_out_absent, GDN_ERR_INVALID_ARGUMENT, "g_out"},
    {"A_log absent", gm_A_log_absent, GDN_ERR_INVALID_ARGUMENT, "A_log"},
    {"g_out shape", gm_g_out_shape, GDN_ERR_INVALID_ARGUMENT, "g_out"},
    {"g_out dtype bf16", gm_g_out_dtype, GDN_ERR_INVALID_ARGUMENT, "g_out"},
    {"b without beta_out", gm_b_no_beta_out, GDN_ERR_INVALID_ARGUMENT, "beta_out"},
    {"beta_out without b", gm_beta_out_no_b, GDN_ERR_INVALID_ARGUMENT, "b"},
    {"b shape", gm_b_shape, GDN_ERR_INVALID_ARGUMENT, "b"},
    {"lower_bound on GDN", gm_lb_gdn, GDN_ERR_INVALID_ARGUMENT, "lower_bound"},
    {"KDA lower_bound -5.5", gm_lb_kda_low, GDN_ERR_INVALID_ARGUMENT, "lower_bound"},
    {"KDA with GDN-shaped dt_bias", gm_dt_bias_kda_shape, GDN_ERR_INVALID_ARGUMENT, "dt_bias"},
    {"g_out overlaps a", gm_overlap, GDN_ERR_INVALID_ARGUMENT, "g_out"},
    {"beta_out overlaps g_out", gm_outputs_overlap, GDN_ERR_INVALID_ARGUMENT, "beta_out"},
    {"kind not an enum", gm_kind, GDN_ERR_INVALID_ARGUMENT, "kind"},
    {"softplus_beta NaN", gm_softplus, GDN_ERR_INVALID_ARGUMENT, "softplus_beta"},
    {"b on CUDA, a on CPU", gm_mixed_device, GDN_ERR_INVALID_ARGUMENT, "b"},
};

static int test_gating_errors(void)
{
    for (size_t i = 0; i < sizeof GATING / sizeof GATING[0]; i++) {
        gdn_gating_args a;
        memset(&a, 0, sizeof a);
        a.kind = GDN_GATE_GDN;
        a.a = t3(X.a, B, T, HV);
        a.A_log = TU_TENSOR(X.A_log, GDN_DTYPE_F32, HV);
        a.dt_bias = TU_TENSOR(X.dt_bias, GDN_DTYPE_F32, HV);
        a.g_out = t3(X.g_out, B, T, HV);
        a.b = t3(X.beta, B, T, HV);
        a.beta_out = t3(X.beta_out, B, T, HV);
        if (i == 0) {
            gdn_status ok = gdn_gating(&a);
            tu_expect(ok == GDN_OK, "gating baseline: %s (%s)", gdn_status_string(ok), gdn_last_error());
        }
        GATING[i].mutate(&a);
        poison_outputs();
        gdn_status st = gdn_gating(&a);
        expect_error("gating", GATING[i].name, st, GATING[i].want, GATING[i].names);
    }
    return TU_PASS;
}

/* Version, status strings, dtype sizes, gdn_tensor_make. */
static int test_api_misc(void)
{
    tu_expect(gdn_version_number() == GDN_VERSION_NUMBER, "gdn_version_number() = %d, header says %d",
              gdn_version_number(), GDN_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", GDN_VERSION_MAJOR, GDN_VERSION_MINOR, GDN_VERSION_PATCH);
    tu_expect(strcmp(gdn_version_string(), want) == 0, "gdn_version_string() = \"%s\", want \"%s\"",
              gdn_version_string(), want);
    for (int st = GDN_OK; st <= GDN_ERR_INTERNAL; st++) {
        const char *s = gdn_status_string((gdn_status)st);
        tu_expect(s && s[0], "gdn_status_string(%d) is empty", st);
    }
    tu_expect(strstr(gdn_status_string(GDN_ERR_INVALID_ARGUMENT), "INVALID_ARGUMENT") != NULL,
              "status string of GDN_ERR_INVALID_ARGUMENT: %s", gdn_status_string(GDN_ERR_INVALID_ARGUMENT));
    tu_expect(gdn_status_string((gdn_status)99) != NULL, "gdn_status_string(99) is NULL");
    tu_expect(gdn_dtype_size(GDN_DTYPE_F32) == 4 && gdn_dtype_size(GDN_DTYPE_BF16) == 2 &&
                  gdn_dtype_size(GDN_DTYPE_F16) == 2 && gdn_dtype_size(GDN_DTYPE_I32) == 4 &&
                  gdn_dtype_size(GDN_DTYPE_F64) == 8 && gdn_dtype_size((gdn_dtype)9) == 0,
              "gdn_dtype_size");
    int64_t shape[4] = {2, 3, 4, 5};
    gdn_tensor t = gdn_tensor_make(X.q, GDN_DTYPE_BF16, GDN_DEVICE_CPU, 0, 4, shape);
    tu_expect(t.data == X.q && t.dtype == GDN_DTYPE_BF16 && t.rank == 4 && t.stride[0] == 60 && t.stride[1] == 20 &&
                  t.stride[2] == 5 && t.stride[3] == 1 && t.shape[2] == 4,
              "gdn_tensor_make: rank %d strides %lld %lld %lld %lld", t.rank, (long long)t.stride[0],
              (long long)t.stride[1], (long long)t.stride[2], (long long)t.stride[3]);
    return TU_PASS;
}

int main(int argc, char **argv)
{
    float **bufs[] = {&X.q, &X.k, &X.v, &X.o, &X.g, &X.beta, &X.a, &X.A_log, &X.dt_bias, &X.h0, &X.ht,
                      &X.pool, &X.steps, &X.big, &X.g_out, &X.beta_out};
    tu_rng r = tu_rng_make(1);
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i] = tu_alloc(BIG * sizeof(float));
        tu_fill_normal(*bufs[i], BIG, &r, 0.0f, 0.3f);
    }
    tu_fill_logsigmoid_normal(X.g, BIG, &r);
    tu_fill_uniform(X.beta, BIG, &r, 0.0f, 1.0f);
    static const tu_test tests[] = {
        {"validation_api_misc", test_api_misc},
        {"validation_baseline_valid", test_baseline_valid},
        {"validation_null_args", test_null_args},
        {"validation_common_chunk", test_common_errors_chunk},
        {"validation_common_recurrent", test_common_errors_recurrent},
        {"validation_recurrent_pool", test_recurrent_errors},
        {"validation_gating", test_gating_errors},
        {"validation_exact_alias_allowed", test_exact_alias_allowed},
        {"validation_no_backend", test_no_backend},
    };
    int rc = tu_main(tests, TU_COUNT(tests), argc, argv);
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(*bufs[i]);
    return rc;
}
