/*
 * gdn.h - libgdn public C API: Gated Delta Net (GDN) and Kimi Delta Attention (KDA) kernels.
 *
 * The math is the recurrence of GDN_MATH.md (shipped as docs/GDN_MATH.md): for each sequence and
 * value head j (key head i = j / (HV / H)), with state S (K x V, f32 in registers):
 *
 *     q_t, k_t <- l2norm(q_t), l2norm(k_t)        only if use_qk_l2norm
 *     S   <- exp(g_t) * S                         GDN: one scalar; KDA: row r times exp(g_t[r])
 *     u   <- beta_t * (v_t - S^T k_t)
 *     S   <- S + k_t u^T
 *     o_t <- S^T (scale * q_t)
 *
 * Conventions
 *   - Tensors are described by gdn_tensor: a data pointer, dtype, device, rank, shape and strides
 *     in elements. Strides may be anything non-negative (q/k/v sliced from a fused projection);
 *     a path that needs contiguity reports GDN_ERR_UNSUPPORTED instead of computing garbage.
 *   - An "absent" tensor has data == NULL; every argument documented as "may be absent" can be
 *     left zero-initialised. Zero-initialise every args struct ({0}) and fill what you use.
 *     A present tensor with no elements still needs a non-NULL (aligned) data pointer.
 *   - Token-major layout: q, k [B, T, H, K]; v, o [B, T, HV, V]. Varlen: B = 1 and cu_seqlens
 *     [N + 1] int32 marks N packed sequences.
 *   - State layouts: GDN_STATE_KV = [N, HV, K, V] (FLA default), GDN_STATE_VK = [N, HV, V, K]
 *     (K contiguous; vLLM / SGLang / FlashInfer state pools, FLA's state_v_first=True).
 *   - All tensors of one call live on one device. CPU tensors run on the CPU backend, CUDA
 *     tensors on the CUDA backend (on `stream`, a cudaStream_t, NULL for the legacy stream).
 *   - Each backend has its own limits; arguments outside them give GDN_ERR_UNSUPPORTED, from the
 *     workspace query as from the call. CPU: head dims K and V each 1 .. 256, every option.
 *     CUDA chunk op: GDN and KDA gates, bf16 / f16 inputs, K = 64 / 128, V = 64 / 128 / 256. CUDA
 *     recurrent op: GDN and KDA gates, K and V = 64 / 128 / 256. Both: f32 or bf16 states.
 *   - Every call validates all arguments on the host before any work. On error nothing is
 *     written, the status says what kind of error, and gdn_last_error() names the argument and
 *     the reason. No call allocates: scratch memory comes from a caller workspace sized by the
 *     matching *_workspace_size() query, on CPU and CUDA alike. CUDA calls never synchronise or
 *     read device memory from the host, so they can be captured in CUDA graphs.
 *
 * Build: cmake -S . -B build && cmake --build build   (CUDA backend when nvcc is found)
 */
#ifndef GDN_H
#define GDN_H

#include <stddef.h>
#include <stdint.h>

#define GDN_VERSION_MAJOR 0
#define GDN_VERSION_MINOR 1
#define GDN_VERSION_PATCH 0
#define GDN_VERSION_NUMBER (GDN_VERSION_MAJOR * 10000 + GDN_VERSION_MINOR * 100 + GDN_VERSION_PATCH)

#if defined(_WIN32)
#  if defined(GDN_BUILDING_LIBRARY)
#    define GDN_API __declspec(dllexport)
#  else
#    define GDN_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__)
#  define GDN_API __attribute__((visibility("default")))
#else
#  define GDN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Version, status, errors                                                                     */

/* GDN_VERSION_NUMBER of the library actually linked. */
GDN_API int gdn_version_number(void);
/* "MAJOR.MINOR.PATCH" */
GDN_API const char *gdn_version_string(void);

typedef enum gdn_status {
    GDN_OK = 0,
    GDN_ERR_INVALID_ARGUMENT = 1, /* a bad pointer, dtype, shape, stride, index or option */
    GDN_ERR_UNSUPPORTED = 2,      /* valid, but this backend does not handle it (head dim ...) */
    GDN_ERR_NOT_IMPLEMENTED = 3,  /* the op has no implementation on this backend yet */
    GDN_ERR_NO_BACKEND = 4,       /* CUDA tensors given, but the library was built without CUDA */
    GDN_ERR_WORKSPACE = 5,        /* workspace absent or smaller than *_workspace_size() says */
    GDN_ERR_CUDA = 6,             /* a CUDA runtime error (message in gdn_last_error) */
    GDN_ERR_OUT_OF_MEMORY = 7,    /* host allocation failed (CPU backend scratch) */
    GDN_ERR_INTERNAL = 8
} gdn_status;

/* Static string naming a status ("GDN_ERR_INVALID_ARGUMENT: invalid argument"). */
GDN_API const char *gdn_status_string(gdn_status status);
/* Thread-local message of the last failed call on this thread ("" if none), for example
 * "cu_seqlens[3] = 70 < cu_seqlens[2] = 80". Valid until the next call on this thread. */
GDN_API const char *gdn_last_error(void);

/* ------------------------------------------------------------------------------------------ */
/* Tensors                                                                                     */

typedef enum gdn_dtype {
    GDN_DTYPE_F32 = 0,
    GDN_DTYPE_BF16 = 1,
    GDN_DTYPE_F16 = 2,
    GDN_DTYPE_I32 = 3, /* indices and cu_seqlens */
    GDN_DTYPE_F64 = 4  /* CPU backend only: the float64 oracle path */
} gdn_dtype;

typedef enum gdn_device_type { GDN_DEVICE_CPU = 0, GDN_DEVICE_CUDA = 1 } gdn_device_type;

#define GDN_MAX_RANK 4

typedef struct gdn_tensor {
    void *data;                     /* NULL: the tensor is absent */
    gdn_dtype dtype;
    gdn_device_type device;
    int device_ordinal;             /* CUDA device index; 0 for CPU */
    int rank;                       /* 1 .. GDN_MAX_RANK */
    int64_t shape[GDN_MAX_RANK];
    int64_t stride[GDN_MAX_RANK];   /* in elements, >= 0 */
} gdn_tensor;

/* A contiguous (row-major) tensor descriptor; shape has `rank` entries. */
GDN_API gdn_tensor gdn_tensor_make(void *data, gdn_dtype dtype, gdn_device_type device, int device_ordinal,
                                   int rank, const int64_t *shape);
/* Size in bytes of one element of dtype (0 for an unknown dtype). */
GDN_API size_t gdn_dtype_size(gdn_dtype dtype);

typedef enum gdn_state_layout {
    GDN_STATE_KV = 0, /* [.., HV, K, V]: V contiguous (FLA default) */
    GDN_STATE_VK = 1  /* [.., HV, V, K]: K contiguous (serving state pools) */
} gdn_state_layout;

typedef enum gdn_gate_kind {
    GDN_GATE_GDN = 0, /* one log decay per token and value head: g [B, T, HV] */
    GDN_GATE_KDA = 1  /* one log decay per key channel:          g [B, T, HV, K] */
} gdn_gate_kind;

/* ------------------------------------------------------------------------------------------ */
/* Gates: how g and beta reach a kernel (shared by every op)                                   */

typedef struct gdn_gate_params {
    gdn_gate_kind kind;

    /* Either precomputed log decays g (f32, <= 0), or raw a with A_log (and dt_bias), from which
     * the kernel computes
     *   GDN:  g = -exp(A_log[j]) * softplus(a + dt_bias[j])
     *   KDA:  g[r] = -exp(A_log[j]) * softplus(a[r] + dt_bias[j, r])
     *         or, with lower_bound L < 0, g[r] = L * sigmoid(exp(A_log[j]) * (a[r] + dt_bias[j, r]))
     * Exactly one of g and a is present. */
    gdn_tensor g;         /* GDN [B, T, HV], KDA [B, T, HV, K]; f32 */
    gdn_tensor a;         /* same shape as g; f32 / bf16 / f16 */
    gdn_tensor A_log;     /* [HV] f32; required with a */
    gdn_tensor dt_bias;   /* GDN [HV], KDA [HV, K]; f32; may be absent (zero bias) */
    float lower_bound;    /* KDA only: 0 = off; else -5 <= L < 0 (FLA's safe gate) */
    /* softplus(x) = x if beta_sp * x > threshold, else log(1 + exp(beta_sp * x)) / beta_sp.
     * 0 selects the defaults beta_sp = 1, threshold = 20 (vLLM). */
    float softplus_beta;
    float softplus_threshold;

    /* beta [B, T, HV] f32 / bf16 / f16: the write strength, or, with beta_from_logits, raw b from
     * which beta = sigmoid(b) (times 2 with allow_neg_eigval) is computed in-kernel. Required. */
    gdn_tensor beta;
    int beta_from_logits;
    int allow_neg_eigval;
} gdn_gate_params;

/* ------------------------------------------------------------------------------------------ */
/* Gating op: raw a, b -> g (f32) and beta                                                     */

typedef struct gdn_gating_args {
    gdn_gate_kind kind;
    gdn_tensor a;           /* GDN [B, T, HV], KDA [B, T, HV, K]; f32 / bf16 / f16 */
    gdn_tensor A_log;       /* [HV] f32 */
    gdn_tensor dt_bias;     /* GDN [HV], KDA [HV, K]; f32; may be absent */
    float lower_bound;      /* KDA only, as in gdn_gate_params */
    float softplus_beta;    /* 0 -> 1 */
    float softplus_threshold; /* 0 -> 20 */
    gdn_tensor g_out;       /* same shape as a; f32 */

    gdn_tensor b;           /* [B, T, HV]; may be absent (then beta_out must be absent) */
    int allow_neg_eigval;   /* beta = 2 * sigmoid(b) */
    gdn_tensor beta_out;    /* [B, T, HV]; f32 / bf16 / f16 */

    void *stream;           /* cudaStream_t for CUDA tensors */
} gdn_gating_args;

GDN_API gdn_status gdn_gating(const gdn_gating_args *args);

/* ------------------------------------------------------------------------------------------ */
/* Chunked forward (prefill)                                                                   */

typedef struct gdn_chunk_fwd_args {
    gdn_tensor q;            /* [B, T, H, K]  f32 / bf16 / f16 */
    gdn_tensor k;            /* [B, T, H, K]  same dtype as q */
    gdn_tensor v;            /* [B, T, HV, V] same dtype as q; HV % H == 0 */
    gdn_gate_params gate;    /* g or raw a, and beta */
    float scale;             /* 0 selects K^-0.5 */
    int use_qk_l2norm;       /* l2-normalise q and k per token and head in-kernel */

    gdn_tensor cu_seqlens;   /* [N + 1] int32; may be absent (then N = B, each of length T) */

    /* States, layout state_layout, dtype f32 or bf16 (both the same dtype when both present). */
    gdn_state_layout state_layout;
    gdn_tensor initial_state; /* [N, HV, K, V] (KV) or [N, HV, V, K] (VK); may be absent (zeros).
                               * With state_indices: the state pool [P, HV, ...] (below) */
    gdn_tensor final_state;   /* same shape; may be absent; may alias initial_state exactly.
                               * Must be absent with state_indices */

    /* State pool (serving engines), optional. With state_indices, initial_state is a pool
     * [P, HV, K, V] / [P, HV, V, K] (the slot stride may be padded) that the call reads and writes
     * in place: sequence n starts from slot state_indices[n] (from zeros where has_initial_state[n]
     * == 0, as for a new request) and its final state is written back to that slot. A slot < 0, or
     * 0 with null_slot_zero, skips sequence n: nothing is read from or written to the pool and its
     * rows of o are zeroed. Host-resident indices must be < P; device-resident ones >= P count as
     * invalid. The valid slots of one call (state_indices and checkpoint_indices together) must be
     * distinct. */
    gdn_tensor state_indices;     /* [N] int32; may be absent (no pool) */
    gdn_tensor has_initial_state; /* [N] int32, 0 or not; may be absent (every sequence reads its slot) */
    int null_slot_zero;
    /* Prefix-cache checkpoints (needs state_indices): with checkpoint_interval M > 0, a multiple of
     * 64, the state after the first (j + 1) * M tokens of sequence n (counted from its first token
     * in this call) is also written to pool slot checkpoint_indices[n, j], for every j <
     * min(length(n) / M, J); a slot < 0 (or 0 with null_slot_zero) skips that write only. */
    int64_t checkpoint_interval;
    gdn_tensor checkpoint_indices; /* [N, J] int32; required with checkpoint_interval > 0 */

    gdn_tensor o;            /* [B, T, HV, V] same dtype as q; B >= 1; must not overlap any input */

    void *workspace;         /* gdn_chunk_fwd_workspace_size() bytes, 256-byte aligned (as cudaMalloc
                              * returns); checked once, before any work. CPU: the threads' scratch (the
                              * call runs on as many threads as it covers, one at least) */
    size_t workspace_bytes;
    void *stream;            /* cudaStream_t for CUDA tensors */

    /* Training: the states that gdn_chunk_bwd reads instead of recomputing them (pass the same
     * buffer as gdn_chunk_bwd_args.saved_states, with the same inputs), gdn_chunk_saved_states_size()
     * bytes, 16-byte aligned, on the tensors' device; may be absent. Not with state_indices.
     * Ignored where the size is 0 (the CPU backend, KDA gates, shapes the CUDA backward does not
     * take): that backward recomputes them. */
    void *saved_states;
    size_t saved_states_bytes;
} gdn_chunk_fwd_args;

/* Bytes of workspace for these arguments (validated as by the call itself; the workspace fields
 * are ignored): the size for the fastest path. On CUDA the call accepts less, down to what the
 * plain (not context-parallel) path needs, and then takes that path; that least size never grows
 * when B, T or HV shrink, so a workspace sized by this query for the largest batch serves every
 * smaller one with the same stride pattern. On CUDA, q, k, v and o take any strides: a tensor
 * whose head dim is not contiguous, whose other strides are not 16-byte multiples or whose pointer
 * is not 16-byte aligned is copied through the workspace (q, k, v before the kernels, o after), and
 * the query counts that space, so query with the tensors of the call (pointers included).
 * Results are bitwise reproducible for identical calls on the same GPU model with the
 * same workspace size; the batch, the head count and the workspace size may change the order of
 * the floating-point sums (tile and path choice). */
GDN_API gdn_status gdn_chunk_fwd_workspace_size(const gdn_chunk_fwd_args *args, size_t *bytes);
GDN_API gdn_status gdn_chunk_fwd(const gdn_chunk_fwd_args *args);

/* Bytes of saved_states for these arguments (validated as by gdn_chunk_fwd): on CUDA with GDN gates,
 * bf16 / f16 inputs and K, V of 64 or 128, per 64-token chunk and value head the state entering
 * the chunk in the input dtype (K * V * 2 bytes) and the backward's record of the chunk (T, Pm and
 * per-token factors, 19200 bytes): 812 B per token and value head at K = V = 128; else 0. */
GDN_API gdn_status gdn_chunk_saved_states_size(const gdn_chunk_fwd_args *args, size_t *bytes);

/* ------------------------------------------------------------------------------------------ */
/* Chunked backward (training)                                                                 */

/* Gradients of L = sum(d_o * o) + sum(dht * final_state) through the chunked forward with the
 * same inputs. GDN gates only (a KDA gate gives GDN_ERR_UNSUPPORTED).
 *
 * Storage: the backward needs the state entering every 64-token chunk and per chunk the matrices
 * T = (I + A)^-1 and Pm. The CUDA forward saves them where the caller gives it saved_states
 * (gdn_chunk_saved_states_size); the backward reads them from the same buffer, else runs that
 * forward itself first, saving into its workspace (the same bits; the saved path skips that
 * forward's time). The CPU backward always recomputes: it keeps a
 * checkpoint of the state every 64 tokens of a sequence and recomputes the states inside each
 * 64-token chunk from its checkpoint while walking the tokens in reverse.
 *   CPU: the checkpoints are double: 8 * K * V / 64 bytes per token and value head of the
 *   sequences in flight (one sequence and key-head group per thread at a time), plus per thread
 *   the 65 states of one chunk (65 * 8 * K * V bytes) and the adjoint states of a group; all of it
 *   in the caller's workspace (the op allocates nothing), sized by the query for the current
 *   thread count (gdn_set_num_threads). The call runs on as many threads as the workspace covers,
 *   one at least.
 *   CUDA (bf16 / f16 inputs, K and V of 64 or 128, f32 / bf16 states): per 64-token chunk and
 *   value head, the workspace holds the gradient of the state leaving it (2 K V 16-bit values: hi
 *   and lo parts), 1024 B per token and value head at K = V = 128; without saved_states also what
 *   the forward would have saved (gdn_chunk_saved_states_size: 812 B per token and value head), a
 *   scratch o (V 16-bit values per token and value head) and the forward's own workspace
 *   (gdn_chunk_fwd_workspace_size); with few (sequence, value head) pairs of fixed length, where
 *   the reverse chain runs context parallel as the forward does, K (2 V + K) floats per
 *   (sequence, value head, segment). No allocation, no host sync, graph-capturable; bitwise
 *   repeatable.
 *
 * Gradients w.r.t. the tensors given: with use_qk_l2norm dq and dk are w.r.t. the raw q and k
 * (through the normalisation); with beta_from_logits dbeta is w.r.t. the logits; with raw a, da,
 * dA_log and ddt_bias replace dg. GVA: dq and dk sum over the G value heads of a key head.
 * dA_log and ddt_bias sum over all tokens and sequences. Every element of every output is written.
 * The CPU backend is bitwise repeatable whatever the thread count; the CUDA backend for identical
 * calls on the same GPU model. */
typedef struct gdn_chunk_bwd_args {
    /* The forward's inputs, as given to gdn_chunk_fwd (same rules). */
    gdn_tensor q;            /* [B, T, H, K]  f32 / bf16 / f16 (f64 on the CPU: the float64 oracle) */
    gdn_tensor k;            /* [B, T, H, K]  same dtype as q */
    gdn_tensor v;            /* [B, T, HV, V] same dtype as q */
    gdn_gate_params gate;    /* GDN: g, or raw a with A_log (and dt_bias); beta or its logits */
    float scale;             /* 0 selects K^-0.5 */
    int use_qk_l2norm;
    gdn_tensor cu_seqlens;   /* [N + 1] int32; may be absent */
    gdn_state_layout state_layout;
    gdn_tensor initial_state; /* [N, HV, K, V] / [N, HV, V, K]; may be absent (zeros) */

    /* Incoming gradients. */
    gdn_tensor d_o;          /* [B, T, HV, V] same dtype as q: dL/do (`do` is a C keyword) */
    gdn_tensor dht;          /* like initial_state: dL/d final_state; may be absent (zero) */
    /* initial_state, dht and dh0 share one state dtype: f32 or bf16 (f64 in the oracle mode). */

    /* Outputs; none may overlap an input or another output (address ranges from first to last element). */
    gdn_tensor dq;           /* [B, T, H, K]  same dtype as q */
    gdn_tensor dk;           /* [B, T, H, K]  same dtype as q */
    gdn_tensor dv;           /* [B, T, HV, V] same dtype as q */
    gdn_tensor dg;           /* [B, T, HV] f32 (f64 in the oracle mode); required with gate.g, else absent */
    gdn_tensor da;           /* [B, T, HV] dtype of gate.a; required with gate.a, else absent */
    gdn_tensor dA_log;       /* [HV] f32 (or f64 in the oracle mode); required with gate.a, else absent */
    gdn_tensor ddt_bias;     /* [HV] f32 (or f64 in the oracle mode); required with gate.dt_bias, else absent */
    gdn_tensor dbeta;        /* [B, T, HV] dtype of gate.beta: dL/d gate.beta (the logits with beta_from_logits) */
    gdn_tensor dh0;          /* like initial_state; required with initial_state, else absent */

    void *workspace;         /* gdn_chunk_bwd_workspace_size() bytes, 256-byte aligned; CPU too */
    size_t workspace_bytes;
    void *stream;            /* cudaStream_t for CUDA tensors */

    /* The states gdn_chunk_fwd saved with the same inputs (gdn_chunk_fwd_args.saved_states), or
     * absent: recomputed. Ignored where gdn_chunk_saved_states_size gives 0. */
    const void *saved_states;
    size_t saved_states_bytes;
} gdn_chunk_bwd_args;

/* Bytes of workspace for these arguments (validated as by the call itself; the workspace fields
 * are ignored). With cu_seqlens on the host the CPU size follows the longest sequence. */
GDN_API gdn_status gdn_chunk_bwd_workspace_size(const gdn_chunk_bwd_args *args, size_t *bytes);
GDN_API gdn_status gdn_chunk_bwd(const gdn_chunk_bwd_args *args);

/* ------------------------------------------------------------------------------------------ */
/* Recurrent forward (decode, multi-token verify), with an optional state pool                  */

typedef struct gdn_recurrent_fwd_args {
    gdn_tensor q;            /* [B, T, H, K]  f32 / bf16 / f16 */
    gdn_tensor k;            /* [B, T, H, K] */
    gdn_tensor v;            /* [B, T, HV, V] */
    gdn_gate_params gate;
    float scale;             /* 0 selects K^-0.5 */
    int use_qk_l2norm;
    gdn_tensor cu_seqlens;   /* [N + 1] int32; may be absent (then N = B, each of length T) */

    gdn_state_layout state_layout;
    /* Initial states: without state_indices, state is [N, HV, K, V] (KV) / [N, HV, V, K] (VK)
     * and sequence n starts from state[n]. With state_indices, state is a pool [P, HV, ...]
     * (the slot stride may be padded) and sequence n starts from slot
     *     state_indices[n, num_accepted_tokens[n] - 1]   (num_accepted_tokens present, 2-D indices)
     *     state_indices[n, 0] / state_indices[n]         (otherwise).
     * May be absent (zeros) only when state_indices is absent. f32 or bf16. */
    gdn_tensor state;
    gdn_tensor state_indices;       /* [N] or [N, T_max] int32; may be absent */
    gdn_tensor num_accepted_tokens; /* [N] int32; needs 2-D state_indices; may be absent */
    /* Write states back into the pool in place (needs state_indices):
     *   1-D indices: the final state goes to the start slot;
     *   2-D indices: the state after token t of sequence n goes to slot state_indices[n, t]
     *                for t < length(n), so every length must be <= T_max; an invalid slot
     *                (below) skips only that write. */
    int inplace_state;
    /* Slot handling: a slot < 0 is invalid (padding, vLLM's PAD_SLOT_ID); with null_slot_zero
     * (needs state_indices) slot 0 is invalid too (vLLM's null block), for start slots and
     * per-step slots alike. An invalid start slot or a num_accepted_tokens[n] outside
     * [1, T_max] skips sequence n: nothing is read, nothing is written to the pool, and its
     * outputs (o, final_state, step_states) are zeroed. Host-resident indices must be < P;
     * device-resident indices >= P are treated as invalid. */
    int null_slot_zero;

    /* [N, HV, K, V] / [N, HV, V, K]; may be absent; same dtype as state. Without state_indices it
     * may alias state exactly (in-place update of per-sequence states). */
    gdn_tensor final_state;
    gdn_tensor step_states;  /* [B * T, HV, K, V] / [B * T, HV, V, K]: the state after every token
                              * (token-major, row = packed token index); may be absent */

    gdn_tensor o;            /* [B, T, HV, V] same dtype as q */

    void *workspace;         /* gdn_recurrent_fwd_workspace_size() bytes, 256-byte aligned (CPU: the
                              * threads' scratch, as for gdn_chunk_fwd; CUDA: 0 bytes today) */
    size_t workspace_bytes;
    void *stream;
} gdn_recurrent_fwd_args;

GDN_API gdn_status gdn_recurrent_fwd_workspace_size(const gdn_recurrent_fwd_args *args, size_t *bytes);
GDN_API gdn_status gdn_recurrent_fwd(const gdn_recurrent_fwd_args *args);

/* ------------------------------------------------------------------------------------------ */
/* Backends and threads                                                                        */

/* 1 if the library was built with the CUDA backend, else 0. */
GDN_API int gdn_has_cuda(void);
/* Threads the CPU backend uses (default: online processors, or $GDN_NUM_THREADS). n <= 0 resets.
 * The count is one budget for the whole process: the backend keeps a pool of at most n - 1
 * helper threads, and a call's caller works alongside the helpers it finds idle, so calls made at
 * once from several threads share the n - 1 helpers instead of each starting its own. */
GDN_API void gdn_set_num_threads(int n);
GDN_API int gdn_get_num_threads(void);

/* ------------------------------------------------------------------------------------------ */
/* bf16 / f16 conversions (host arrays)                                                        */

/* bf16 and f16 values are passed as their bit patterns in uint16_t, as torch.bfloat16 /
 * torch.float16, __nv_bfloat16 / __half and numpy's float16 store them.
 *
 * gdn_f32_to_bf16, gdn_f32_to_f16: dst[i] = src[i] rounded to nearest, ties to even (as IEEE 754
 * and the GPU's conversion instructions round). NaN stays NaN (quiet; sign kept), magnitudes that
 * round beyond the largest finite value (bf16 ~3.39e38, f16 65504) become Inf, f16 results below
 * 2^-14 are subnormal (down to 2^-24, then zero with the sign kept).
 * gdn_bf16_to_f32, gdn_f16_to_f32: exact (every bf16 / f16 value is an f32 value).
 * src and dst hold n elements and must not overlap; with n == 0 they may be NULL. */
GDN_API void gdn_f32_to_bf16(const float *src, uint16_t *dst, size_t n);
GDN_API void gdn_bf16_to_f32(const uint16_t *src, float *dst, size_t n);
GDN_API void gdn_f32_to_f16(const float *src, uint16_t *dst, size_t n);
GDN_API void gdn_f16_to_f32(const uint16_t *src, float *dst, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* GDN_H */
