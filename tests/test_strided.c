/*
 * test_strided.c - non-contiguous tensors give the same result as contiguous ones: q, k, v as
 * slices of one fused [B, T, 2*H*K + HV*V] projection, beta / g as slices of wider buffers, o and
 * the states with padded strides (padding must stay untouched). Both ops, fixed and varlen.
 *   build/tests/test_strided [name-substring ...]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static double tol_out(gdn_dtype d) { return d == GDN_DTYPE_F32 ? 1e-6 : 4e-3; }

static void run_strided(const tu_case_config *cfg, const char *label)
{
    tu_case c;
    tu_case_init(&c, cfg);
    const tu_case_config *k = &c.c;
    gdn_dtype dt = k->dtype, sd = k->state_dtype;
    size_t esz = gdn_dtype_size(dt), ssz = gdn_dtype_size(sd);
    int64_t B = k->B, T = k->T, HV = k->HV, K = k->K, V = k->V;
    size_t ntok = (size_t)(B * T), n_o = ntok * (size_t)(HV * V), n_s = (size_t)c.state_numel;
    int kda = k->kind == GDN_GATE_KDA;
    int64_t gK = kda ? K : 1;

    /* fused qkv: token p holds [q (H*K) | k (H*K) | v (HV*V)] */
    gdn_tensor q_t, k_t, v_t;
    unsigned char *qkv = tu_case_fused_qkv(&c, 1, &q_t, &k_t, &v_t);
    int64_t v_shape[4] = {B, T, HV, V};

    /* o with a padded row per token */
    int64_t o_row = HV * V + 24;
    void *o_pad = tu_alloc_elems(dt, ntok * (size_t)o_row);
    int64_t o_stride[4] = {T * o_row, o_row, V, 1};
    gdn_tensor o_t = tu_tensor_strided(o_pad, dt, 4, v_shape, o_stride);

    /* beta as the second half of a [B, T, 2*HV] buffer; g with a padded token row */
    gdn_dtype bdt = k->beta_dtype;
    void *beta2 = tu_alloc_elems(bdt, ntok * 2 * (size_t)HV);
    for (size_t p = 0; p < ntok; p++)
        for (int64_t j = 0; j < HV; j++)
            tu_set(beta2, bdt, p * 2 * (size_t)HV + (size_t)(HV + j), tu_get(c.beta, bdt, p * (size_t)HV + (size_t)j));
    int64_t b_shape[3] = {B, T, HV}, b_stride[3] = {T * 2 * HV, 2 * HV, 1};
    gdn_tensor beta_t = tu_tensor_strided((char *)beta2 + (size_t)HV * gdn_dtype_size(bdt), bdt, 3, b_shape, b_stride);
    int64_t g_row = HV * gK + 8;
    float *g_pad = tu_alloc(ntok * (size_t)g_row * sizeof(float));
    for (size_t p = 0; p < ntok; p++)
        memcpy(g_pad + p * (size_t)g_row, c.g + p * (size_t)(HV * gK), (size_t)(HV * gK) * sizeof(float));
    int64_t g_shape[4] = {B, T, HV, gK}, g_stride[4] = {T * g_row, g_row, gK, 1};
    gdn_tensor g_t = tu_tensor_strided(g_pad, GDN_DTYPE_F32, kda ? 4 : 3, g_shape, g_stride);

    /* states with a padded slot stride */
    int64_t slot = HV * K * V, slot_stride = slot + 16;
    int64_t s_shape[4] = {c.N, HV, k->layout == GDN_STATE_VK ? V : K, k->layout == GDN_STATE_VK ? K : V};
    int64_t s_stride[4] = {slot_stride, s_shape[2] * s_shape[3], s_shape[3], 1};
    void *h0_pad = tu_alloc_elems(sd, (size_t)(c.N * slot_stride)), *ht_pad = tu_alloc_elems(sd, (size_t)(c.N * slot_stride));
    for (int64_t n = 0; n < c.N; n++)
        memcpy((char *)h0_pad + (size_t)(n * slot_stride) * ssz, (char *)c.h0 + (size_t)(n * slot) * ssz,
               (size_t)slot * ssz);

    void *o_contig = tu_alloc(n_o * esz), *o_got = tu_alloc(n_o * esz), *ht_contig = tu_alloc(n_s * ssz);
    void *ht_got = tu_alloc(n_s * ssz);
    char what[200];
    for (int op = 0; op < 2; op++) {
        const char *opname = op ? "recurrent" : "chunk";
        tu_case_poison(&c);
        gdn_recurrent_fwd_args a = tu_case_recurrent_args(&c);
        gdn_status st = tu_fwd(op, &a);
        if (!tu_expect(st == GDN_OK, "%s %s contiguous: %s", label, opname, gdn_last_error()))
            continue;
        memcpy(o_contig, c.o, n_o * esz);
        memcpy(ht_contig, c.ht, n_s * ssz);

        tu_poison(o_pad, dt, ntok * (size_t)o_row);
        tu_poison(ht_pad, sd, (size_t)(c.N * slot_stride));
        /* the same call on the strided copies */
        a.q = q_t, a.k = k_t, a.v = v_t, a.o = o_t;
        a.gate.beta = beta_t;
        if (!k->raw_gates)
            a.gate.g = g_t;
        a.state = tu_tensor_strided(h0_pad, sd, 4, s_shape, s_stride);
        a.final_state = tu_tensor_strided(ht_pad, sd, 4, s_shape, s_stride);
        st = tu_fwd(op, &a);
        if (st == GDN_ERR_UNSUPPORTED) {
            /* the header allows a path to refuse strides it cannot handle; say so, do not fail */
            printf("    note: %s %s strided: unsupported: %s\n", label, opname, gdn_last_error());
            continue;
        }
        if (!tu_expect(st == GDN_OK, "%s %s strided: %s (%s)", label, opname, gdn_status_string(st), gdn_last_error()))
            continue;
        size_t pad_o = 0, pad_s = 0;
        for (size_t p = 0; p < ntok; p++) {
            memcpy((char *)o_got + p * (size_t)(HV * V) * esz, (char *)o_pad + p * (size_t)o_row * esz,
                   (size_t)(HV * V) * esz);
            pad_o += tu_count_poison((char *)o_pad + (p * (size_t)o_row + (size_t)(HV * V)) * esz, dt,
                                     (size_t)(o_row - HV * V));
        }
        for (int64_t n = 0; n < c.N; n++) {
            memcpy((char *)ht_got + (size_t)(n * slot) * ssz, (char *)ht_pad + (size_t)(n * slot_stride) * ssz,
                   (size_t)slot * ssz);
            pad_s += tu_count_poison((char *)ht_pad + (size_t)(n * slot_stride + slot) * ssz, sd,
                                     (size_t)(slot_stride - slot));
        }
        tu_expect(pad_o == ntok * (size_t)(o_row - HV * V), "%s %s: o padding written", label, opname);
        tu_expect(pad_s == (size_t)(c.N * (slot_stride - slot)), "%s %s: final_state padding written", label, opname);
        snprintf(what, sizeof what, "%s %s strided vs contiguous o", label, opname);
        tu_check(what, tu_compare(o_got, dt, o_contig, dt, n_o), tol_out(dt));
        snprintf(what, sizeof what, "%s %s strided vs contiguous ht", label, opname);
        tu_check(what, tu_compare(ht_got, sd, ht_contig, sd, n_s), sd == GDN_DTYPE_F32 ? 1e-6 : 1e-2);
    }
    free(qkv);
    free(o_pad);
    free(beta2);
    free(g_pad);
    free(h0_pad);
    free(ht_pad);
    free(o_contig);
    free(o_got);
    free(ht_contig);
    free(ht_got);
    tu_case_free(&c);
}

static tu_case_config defaults(uint64_t seed)
{
    tu_case_config c;
    memset(&c, 0, sizeof c);
    c.B = 2;
    c.T = 90;
    c.H = 2;
    c.HV = 4;
    c.K = 64;
    c.V = 64;
    c.initial_state = 1;
    c.l2norm = 1;
    c.seed = seed;
    return c;
}

static int test_fused_qkv(void)
{
    tu_case_config c = defaults(1);
    run_strided(&c, "f32 KV");
    c = defaults(2);
    c.dtype = GDN_DTYPE_BF16;
    c.beta_dtype = GDN_DTYPE_BF16;
    c.layout = GDN_STATE_VK;
    c.HV = 8;
    run_strided(&c, "bf16 VK GVA4");
    c = defaults(3);
    c.K = 128;
    c.V = 128;
    c.raw_gates = 1;
    run_strided(&c, "K=V=128 raw gates");
    return TU_PASS;
}

static int test_fused_varlen_kda(void)
{
    tu_case_config c = defaults(10);
    c.nseq = 4;
    memcpy(c.seqlens, (int32_t[]){33, 0, 100, 1}, 4 * sizeof(int32_t));
    run_strided(&c, "varlen");
    c = defaults(11);
    c.kind = GDN_GATE_KDA;
    run_strided(&c, "kda");
    c = defaults(12);
    c.state_dtype = GDN_DTYPE_BF16;
    c.l2norm = 0;
    run_strided(&c, "bf16 state no l2norm");
    return TU_PASS;
}

int main(int argc, char **argv)
{
    static const tu_test tests[] = {
        {"strided_fused_qkv", test_fused_qkv},
        {"strided_fused_varlen_kda", test_fused_varlen_kda},
    };
    return tu_main(tests, TU_COUNT(tests), argc, argv);
}
