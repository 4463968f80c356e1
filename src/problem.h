/*
 * problem.h - the validated, resolved form of an op's arguments, shared by all backends.
 *
 * src/api.c checks every gdn_*_args field on the host, then fills one of these structs: sizes as
 * int64, every tensor reduced to (pointer, dtype, strides in elements) with its dimensions in a
 * fixed order, layouts resolved into K / V strides, defaults applied. Backends read only this,
 * never the public args, and may assume everything documented here holds.
 * Compiled as C and as CUDA C++.
 */
#ifndef GDN_PROBLEM_H
#define GDN_PROBLEM_H

#include "gdn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor reduced to what a kernel needs. data == NULL: absent. */
typedef struct gdn_view {
    void *data;
    gdn_dtype dtype;
    int64_t s[4]; /* strides in elements, in the dimension order documented at each use */
} gdn_view;

/* Chunk and recurrent forward. */
typedef struct gdn_problem {
    gdn_device_type device;
    int device_ordinal;
    void *stream;               /* cudaStream_t */

    int64_t B, T, H, HV, K, V;  /* as in the header; G = HV / H */
    int64_t G;
    int64_t N;                  /* number of sequences: B, or cu_seqlens length - 1 */
    /* [N + 1] on the op's device, or NULL: sequence n is batch row n, tokens [0, T).
     * With cu_seqlens, B == 1 and sequence n is tokens [cu[n], cu[n+1]) of row 0.
     * On the host the values are validated (monotone, 0 .. T); on CUDA they are not readable
     * by the host, so kernels clamp them into [0, T] themselves. */
    const int32_t *cu_seqlens;

    gdn_view q, k;              /* s = {b, t, h, d}; dtype f32 / bf16 / f16 (f64 on CPU) */
    gdn_view v, o;              /* s = {b, t, hv, d}; same dtype as q */

    /* Gates. Exactly one of g and a is present. */
    gdn_gate_kind gate_kind;
    gdn_view g;                 /* f32 (f64 in CPU oracle mode); s = {b, t, hv, r} (r: KDA key channel) */
    gdn_view a;                 /* raw; s = {b, t, hv, r}; f32 / bf16 / f16 (f64 in CPU oracle mode) */
    const float *A_log;         /* [HV] contiguous; present iff a is */
    gdn_view dt_bias;           /* f32; s = {hv, r}; may be absent */
    float lower_bound;          /* KDA: 0 = off */
    float softplus_beta;        /* defaults applied: 1 */
    float softplus_threshold;   /* defaults applied: 20 */
    gdn_view beta;              /* s = {b, t, hv}; f32 / bf16 / f16 (f64 on CPU) */
    int beta_from_logits;
    int allow_neg_eigval;

    double scale;               /* resolved: the caller's value, or K^-0.5 (in double: the float64
                                 * path's; the f32 and CUDA paths round it) when the caller passed 0 */
    int use_qk_l2norm;

    /* States. Strides are given per index meaning, whatever the layout:
     * s = {slot or sequence, hv, k, v}. KV layout has s[3] == 1 when contiguous, VK s[2] == 1. */
    gdn_state_layout state_layout;
    gdn_dtype state_dtype;      /* f32 or bf16 (f64 on CPU); the dtype of every state below */
    gdn_view state_in;          /* chunk: initial_state [N, ...]; recurrent: state or pool; may be absent */
    int64_t num_slots;          /* recurrent with indices: pool size P; else N */
    gdn_view final_state;       /* [N, ...]; may be absent; may alias state_in */
    gdn_view step_states;       /* recurrent: [B*T, ...], row = packed token index; may be absent */

    /* Pools. Recurrent: [N] or [N, T_max] indices with the options below. Chunk: [N] indices
     * (idx_cols 1) with inplace_state set, has_initial_state and checkpoints. */
    const int32_t *state_indices; /* [N] or [N, T_max]; may be NULL */
    int64_t idx_stride_n, idx_stride_t;
    int64_t idx_cols;           /* T_max (1 for 1-D indices) */
    const int32_t *num_accepted_tokens; /* [N] stride 1; may be NULL */
    int inplace_state;
    int null_slot_zero;
    const int32_t *has_initial_state;   /* chunk: [N] stride has_init_stride, or NULL (all read) */
    int64_t has_init_stride;
    int64_t checkpoint_interval;        /* chunk: M > 0, a multiple of 64; 0 = no checkpoints */
    const int32_t *checkpoint_indices;  /* [N, ckpt_cols] */
    int64_t ckpt_stride_n, ckpt_stride_j, ckpt_cols;
    /* Chunk forward: written, chunk backward: read (gdn_chunk_saved_states_size); NULL: none. */
    void *saved_states;

    void *workspace;
    size_t workspace_bytes;
} gdn_problem;

/* Chunk backward: the forward's problem (o and final_state absent, state_in = initial_state)
 * plus the gradients. Token views use the forward's dimension order; states s = {n, hv, k, v}. */
typedef struct gdn_bwd_problem {
    gdn_problem fwd;
    gdn_view d_o;               /* s = {b, t, hv, d}; dtype of q */
    gdn_view dht;               /* state; may be absent */
    gdn_view dq, dk;            /* s = {b, t, h, d}; dtype of q */
    gdn_view dv;                /* s = {b, t, hv, d}; dtype of q */
    gdn_view dg;                /* s = {b, t, hv}; present iff fwd.g is */
    gdn_view da;                /* s = {b, t, hv}; present iff fwd.a is */
    gdn_view dA_log;            /* s = {hv}; present iff fwd.a is */
    gdn_view ddt_bias;          /* s = {hv}; present iff fwd.dt_bias is */
    gdn_view dbeta;             /* s = {b, t, hv}; dtype of beta */
    gdn_view dh0;               /* state; present iff fwd.state_in is */
    int64_t max_len;            /* longest sequence (T without cu_seqlens; T for device cu_seqlens) */
} gdn_bwd_problem;

/* Gating op. */
typedef struct gdn_gating_problem {
    gdn_device_type device;
    int device_ordinal;
    void *stream;
    int64_t B, T, HV, K;        /* K = 1 for GDN */
    gdn_gate_kind kind;
    gdn_view a;                 /* s = {b, t, hv, r} */
    const float *A_log;         /* [HV] contiguous */
    gdn_view dt_bias;           /* s = {hv, r}; may be absent */
    float lower_bound, softplus_beta, softplus_threshold;
    gdn_view g_out;             /* f32, s = {b, t, hv, r} */
    gdn_view b;                 /* s = {b, t, hv}; may be absent */
    int allow_neg_eigval;
    gdn_view beta_out;          /* s = {b, t, hv} */
} gdn_gating_problem;

/* Error reporting (src/api.c). Sets the thread-local message and returns status. */
gdn_status gdn_set_error(gdn_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Each backend states its own limits: gdn_*_check accepts a resolved problem that the backend runs
 * and otherwise returns GDN_ERR_UNSUPPORTED with a message naming the limit. The API calls the
 * check of the problem's backend before a workspace query answers and before a call runs, so the
 * op entries below may assume it passed. */

/* CPU backend (src/cpu/). */
gdn_status gdn_cpu_gating(const gdn_gating_problem *p);
gdn_status gdn_cpu_chunk_fwd_check(const gdn_problem *p);
gdn_status gdn_cpu_recurrent_fwd_check(const gdn_problem *p);
/* Scratch of the CPU forward ops, from the caller's workspace: least = one thread's share (the
 * call runs on as many threads as the workspace covers), else the current thread count's. */
size_t gdn_cpu_chunk_fwd_workspace(const gdn_problem *p, int least);
size_t gdn_cpu_recurrent_fwd_workspace(const gdn_problem *p, int least);
gdn_status gdn_cpu_chunk_fwd(const gdn_problem *p);
gdn_status gdn_cpu_recurrent_fwd(const gdn_problem *p);
/* threads: the thread count the size is for; 0 the count the call would use (the query's answer). */
gdn_status gdn_cpu_chunk_bwd_check(const gdn_bwd_problem *p);
size_t gdn_cpu_chunk_bwd_workspace_size(const gdn_bwd_problem *p, int threads);
gdn_status gdn_cpu_chunk_bwd(const gdn_bwd_problem *p);

/* CUDA backend (src/cuda/; src/no_cuda.c when it is not built, whose entries are never reached:
 * the API refuses CUDA tensors first). Each entry that runs work makes p->device_ordinal the
 * current device for its duration. */
gdn_status gdn_cuda_gating(const gdn_gating_problem *p);
gdn_status gdn_cuda_chunk_fwd_check(const gdn_problem *p);
gdn_status gdn_cuda_recurrent_fwd_check(const gdn_problem *p);
size_t gdn_cuda_chunk_fwd_workspace_size(const gdn_problem *p);
size_t gdn_cuda_chunk_fwd_workspace_min(const gdn_problem *p); /* the least the call accepts */
gdn_status gdn_cuda_chunk_fwd(const gdn_problem *p);
size_t gdn_cuda_recurrent_fwd_workspace_size(const gdn_problem *p);
gdn_status gdn_cuda_recurrent_fwd(const gdn_problem *p);
gdn_status gdn_cuda_chunk_bwd_check(const gdn_bwd_problem *p);
size_t gdn_cuda_chunk_bwd_workspace_size(const gdn_bwd_problem *p);
size_t gdn_cuda_chunk_saved_states_size(const gdn_problem *p); /* 0: the backward reads none */
gdn_status gdn_cuda_chunk_bwd(const gdn_bwd_problem *p);

#ifdef __cplusplus
}
#endif

#endif /* GDN_PROBLEM_H */
