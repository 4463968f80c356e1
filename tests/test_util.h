/*
 * test_util.h - the small harness every libgdn C test links (CPU tests and tests/test_cuda_*.c).
 *
 *   - seeded random numbers (splitmix64 seeding a xorshift64*): uniform and normal fills
 *   - "round an f32 array through a dtype" (the library's gdn_f32_to_bf16 ...), typed element get/set so one buffer can hold f32, bf16, f16, f64 or i32
 *   - gdn_tensor descriptors for host buffers (contiguous or with explicit strides)
 *   - poison fills (NaN bit patterns) and byte-exact "was this buffer touched" checks
 *   - relative RMS error ||out - ref|| / ||ref|| with NaN/Inf detection and the worst element
 *   - a tiny runner: each test returns TU_PASS / TU_FAIL / TU_SKIP and gets one output line with
 *     its name and worst relative error; the last line is "N passed, N failed[, N skipped]"
 *   - a random GDN / KDA problem (tu_case) with its float64 oracle and args builders, and a state-pool
 *     call of gdn_recurrent_fwd checked slot by slot (tu_pool_run: the CPU and CUDA pool tests)
 *
 * A test records each comparison with tu_check(); the runner prints the one with the largest
 * error-to-tolerance ratio. Arguments to a test binary are substrings that select tests by name.
 */
#ifndef GDN_TEST_UTIL_H
#define GDN_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "gdn.h"

/* ------------------------------------------------------------------------------------------ */
/* Random numbers                                                                              */

typedef struct tu_rng {
    uint64_t s;
} tu_rng;

/* Seeds through splitmix64, so nearby seeds give unrelated streams. */
tu_rng tu_rng_make(uint64_t seed);
uint64_t tu_rng_u64(tu_rng *r);
/* Uniform in [0, 1). */
double tu_rng_uniform(tu_rng *r);
/* Standard normal (Box-Muller). */
double tu_rng_normal(tu_rng *r);
/* Uniform integer in [lo, hi]. */
int64_t tu_rng_int(tu_rng *r, int64_t lo, int64_t hi);

void tu_fill_uniform(float *x, size_t n, tu_rng *r, float lo, float hi);
void tu_fill_normal(float *x, size_t n, tu_rng *r, float mean, float std);
/* log(sigmoid(randn)): realistic GDN log decays, all < 0. */
void tu_fill_logsigmoid_normal(float *x, size_t n, tu_rng *r);

/* ------------------------------------------------------------------------------------------ */
/* Floating-point formats                                                                      */

/* x rounded to the nearest value representable in dtype (identity for f32 / f64). */
float tu_round(gdn_dtype dtype, float x);
/* Rounds every element of x in place through dtype. */
void tu_round_array(float *x, size_t n, gdn_dtype dtype);

/* Element i of a contiguous buffer of dtype, as double (i32 converted too). */
double tu_get(const void *p, gdn_dtype dtype, size_t i);
/* Stores x into element i (rounding to nearest even for bf16 / f16). */
void tu_set(void *p, gdn_dtype dtype, size_t i, double x);
/* dst[i] = src[i] converted to dtype, for n elements. */
void tu_store_f32(void *dst, gdn_dtype dtype, const float *src, size_t n);
/* dst[i] = (double)src[i] read as dtype. */
void tu_load_f64(double *dst, const void *src, gdn_dtype dtype, size_t n);

/* ------------------------------------------------------------------------------------------ */
/* Host buffers and tensor descriptors                                                         */

/* malloc that aborts the test program on failure (tests have nothing useful to do without it). */
void *tu_alloc(size_t bytes);
/* n elements of dtype, zeroed. */
void *tu_alloc_elems(gdn_dtype dtype, size_t n);

/* Contiguous host tensor of `rank` dims; TU_TENSOR(data, dtype, d0, d1, ...) counts them. */
gdn_tensor tu_tensor(void *data, gdn_dtype dtype, int rank, const int64_t *shape);
gdn_tensor tu_tensor_strided(void *data, gdn_dtype dtype, int rank, const int64_t *shape,
                             const int64_t *stride);
#define TU_TENSOR(data, dtype, ...)                                                               \
    tu_tensor((data), (dtype), (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),          \
              (int64_t[]){__VA_ARGS__})

/* Product of the shape. */
size_t tu_numel(const gdn_tensor *t);

/* ------------------------------------------------------------------------------------------ */
/* Poison                                                                                      */

/* Fills n elements with a NaN bit pattern (f32 0x7fc00bad, bf16 0x7fc0, f16 0x7e00, f64 quiet
 * NaN), or 0x7fc00bad for i32, so that any element an op forgets to write shows up. */
void tu_poison(void *p, gdn_dtype dtype, size_t n);
/* Count of elements still holding the exact poison pattern. */
size_t tu_count_poison(const void *p, gdn_dtype dtype, size_t n);

/* Owned copy of `bytes` bytes; with tu_same_bytes, checks that an op on error wrote nothing. */
void *tu_snapshot(const void *p, size_t bytes);
/* 1 if the first `bytes` bytes are identical. */
int tu_same_bytes(const void *a, const void *b, size_t bytes);

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */

typedef struct tu_err {
    double rel;          /* ||out - ref|| / ||ref||; ||out - ref|| when ref is all zeros */
    double max_abs;      /* largest |out - ref| over finite pairs */
    size_t worst;        /* index of the largest |out - ref| (or of the first bad element) */
    double worst_out, worst_ref;
    size_t nonfinite;    /* elements where out and ref disagree on being finite (always a failure) */
    size_t n;
} tu_err;

/* Compares n contiguous elements of out (any float dtype) with ref (any float dtype). */
tu_err tu_compare(const void *out, gdn_dtype out_dtype, const void *ref, gdn_dtype ref_dtype, size_t n);

/* Records one comparison into the running test: passes when err.nonfinite == 0 and
 * err.rel <= tol; on failure prints what, the error, and the worst element. Returns 1 if ok. */
int tu_check(const char *what, tu_err err, double tol);
/* Records a plain condition; on failure prints what (printf-style). Returns cond != 0. */
int tu_expect(int cond, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ------------------------------------------------------------------------------------------ */
/* Runner                                                                                      */

enum { TU_PASS = 0, TU_FAIL = 1, TU_SKIP = 2 };
/* Exit code of a test binary whose selected tests all skipped (the CUDA tests without a GPU);
 * tests/CMakeLists.txt gives it to ctest as SKIP_RETURN_CODE, so ctest reports them skipped. */
enum { TU_EXIT_SKIPPED = 77 };

typedef int (*tu_test_fn)(void);
typedef struct tu_test {
    const char *name;
    tu_test_fn fn;
} tu_test;

/* Runs the tests whose name contains any argv[1..] substring (all without arguments). A test
 * fails if it returns TU_FAIL or if any tu_check / tu_expect inside it failed. Prints one line per
 * test, then "N passed, N failed", with ", N skipped" when tests skipped (no GPU, say).
 * Returns the process exit code: 1 when a test failed, TU_EXIT_SKIPPED when every test that ran
 * skipped, else 0. */
int tu_main(const tu_test *tests, int count, int argc, char **argv);
#define TU_COUNT(arr) ((int)(sizeof(arr) / sizeof((arr)[0])))

/* Set by a test to explain a TU_SKIP (printed on its line). */
void tu_skip_reason(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Number of CUDA devices usable from this process; 0 without a GPU, a driver, or a CUDA build. */
int tu_cuda_device_count(void);

/* A CUDA runtime call that must succeed: on an error, print it with its call site and exit (for
 * files that include the CUDA runtime). */
#define TU_CUDA_OK(call)                                                                                           \
    do {                                                                                                           \
        cudaError_t err_ = (call);                                                                                 \
        if (err_ != cudaSuccess) {                                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_));              \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

/* Host tensors mirrored on the device (CUDA builds): tu_mirror_tensor replaces t's host pointer by a
 * device copy of its whole extent (strides and padding included; a host buffer seen before maps
 * to the same device buffer, so aliases stay aliases); tu_mirror_back copies every buffer back to
 * its host buffer and frees the device copies. Exits on a CUDA error. */
#define TU_MAX_MIRROR 24
typedef struct tu_mirror {
    int count;
    void *host[TU_MAX_MIRROR];
    void *dev[TU_MAX_MIRROR];
    size_t bytes[TU_MAX_MIRROR];
} tu_mirror;
void tu_mirror_tensor(tu_mirror *m, gdn_tensor *t);
void tu_mirror_back(tu_mirror *m);
/* Why no CUDA device can be used ("libgdn built without CUDA", "no CUDA device", or the runtime's
 * error), or NULL when one can. */
const char *tu_cuda_unavailable(void);

/* ------------------------------------------------------------------------------------------ */
/* A random GDN / KDA problem on the host, its float64 oracle, and args builders                */

#define TU_MAX_SEQS 16

typedef struct tu_case_config {
    int64_t B, T, H, HV, K, V;   /* with nseq > 0, B is 1 and T the sum of seqlens (filled in) */
    int nseq;                    /* > 0: varlen with cu_seqlens built from seqlens */
    int32_t seqlens[TU_MAX_SEQS];
    gdn_dtype dtype;             /* q, k, v, o */
    gdn_dtype beta_dtype;        /* beta (and raw b) */
    gdn_dtype state_dtype;       /* initial and final states: f32 or bf16 */
    gdn_state_layout layout;
    gdn_gate_kind kind;
    int initial_state;           /* draw an initial state (else absent: zeros) */
    int l2norm;                  /* use_qk_l2norm; when off, k is drawn already unit-norm */
    int raw_gates;               /* pass raw a + A_log + dt_bias and beta logits b */
    float lower_bound;           /* KDA raw gates only */
    int allow_neg_eigval;        /* raw gates only */
    float scale;                 /* 0: K^-0.5 */
    uint64_t seed;
    /* precomputed gates: g = logsigmoid(gate_mean + gate_std * randn), gate_std 0 meaning 1;
     * gate_mean 6 gives long memory (g ~ -0.0025), gate_std 8 a mix of ~0 and -20 */
    float gate_mean, gate_std;
} tu_case_config;

/* All buffers contiguous. Inputs exist in their call dtype and as float64 copies of the very same
 * (already rounded) values; the oracle's gates g64 / beta64 are the closed forms in double of the
 * raw inputs when raw_gates is set. */
typedef struct tu_case {
    tu_case_config c;
    int64_t N;                   /* sequences */
    int64_t gate_numel;          /* B*T*HV (GDN) or B*T*HV*K (KDA) */
    int64_t state_numel;         /* N*HV*K*V */
    int32_t *cu;                 /* [N + 1] or NULL */
    void *q, *k, *v;             /* dtype */
    double *q64, *k64, *v64;
    float *g;                    /* precomputed log decays, f32 */
    float *a, *A_log, *dt_bias;  /* raw gates: a like g, A_log [HV], dt_bias [HV] or [HV, K] */
    void *beta;                  /* beta_dtype: beta in [0, 1], or logits b with raw_gates */
    double *g64, *beta64;        /* what the oracle uses */
    void *h0;                    /* state_dtype [N, HV, K, V] / [N, HV, V, K], or NULL */
    double *h064;
    void *o, *ht;                /* outputs of the op under test (dtype / state_dtype) */
    double *o_ref, *ht_ref;      /* oracle outputs */
} tu_case;

void tu_case_init(tu_case *c, const tu_case_config *cfg);
/* Overwrites the precomputed gates (raw_gates = 0) with extreme patterns: per value head, hv % 4 == 0
 * cycles g = -inf, -60, -15, -3, -0.5, -1e-4, 0; 1 and 2 hold -3 and -1.5; 3 keeps its draw. KDA: per
 * key channel, the cycle shifted by the key and holding -1e4 too. */
void tu_case_set_extreme_gates(tu_case *c);
/* Overwrites the precomputed gates (raw_gates = 0) with g = 0, no decay at all, at time steps
 * [t0, t1) of every batch row, head and key: the state then keeps every token of the run. */
void tu_case_set_zero_gates(tu_case *c, int64_t t0, int64_t t1);
void tu_case_free(tu_case *c);
/* Poisons c->o and c->ht. */
void tu_case_poison(tu_case *c);
/* Descriptors of the case's tensors (contiguous, CPU). */
gdn_tensor tu_case_qk(const tu_case *c, void *data, gdn_dtype dtype);  /* [B, T, H, K] */
gdn_tensor tu_case_vo(const tu_case *c, void *data, gdn_dtype dtype);  /* [B, T, HV, V] */
gdn_tensor tu_case_state(const tu_case *c, void *data, gdn_dtype dtype, int64_t rows);
gdn_tensor tu_case_gate(const tu_case *c, void *data, gdn_dtype dtype); /* [B, T, HV(, K)] */
gdn_tensor tu_case_beta(const tu_case *c, void *data, gdn_dtype dtype); /* [B, T, HV] */
/* Gate params as configured (raw or precomputed), reading the case's buffers. */
gdn_gate_params tu_case_gate_params(const tu_case *c);
/* Args for the op under test: inputs, initial state (if any), outputs c->o and c->ht. */
gdn_chunk_fwd_args tu_case_chunk_args(const tu_case *c);
gdn_recurrent_fwd_args tu_case_recurrent_args(const tu_case *c);
/* The chunk form of recurrent args without a pool (no state_indices, step_states): the same
 * inputs, gate, options, outputs and stream, a->state as the initial state. */
gdn_chunk_fwd_args tu_chunk_args(const gdn_recurrent_fwd_args *a);
/* For tests that run both forward ops on the same arguments: TU_CHUNK runs gdn_chunk_fwd on
 * tu_chunk_args(a), TU_RECURRENT runs gdn_recurrent_fwd on a. */
enum { TU_CHUNK = 0, TU_RECURRENT = 1 };
gdn_status tu_fwd(int op, const gdn_recurrent_fwd_args *a);

/* gdn_chunk_fwd / gdn_recurrent_fwd as a caller makes them: with the workspace of the query
 * (host memory, 256-byte aligned) when the args carry none; args with a workspace, and NULL, are
 * passed through. For host tensors (the CUDA tests manage their device workspaces themselves). */
gdn_status tu_chunk_fwd(const gdn_chunk_fwd_args *a);
gdn_status tu_recurrent_fwd(const gdn_recurrent_fwd_args *a);
/* The case's q, k and v copied into one fused projection, per token [q | k | v] of ds*H*K, ds*H*K
 * and HV*V elements, q and k with element stride ds (>= 1; the gaps poisoned). Sets the three
 * slices' descriptors and returns the buffer (the caller frees it). */
unsigned char *tu_case_fused_qkv(const tu_case *c, int64_t ds, gdn_tensor *q, gdn_tensor *k, gdn_tensor *v);
/* Runs the float64 oracle (gdn_recurrent_fwd on f64 CPU tensors) into o_ref / ht_ref. */
gdn_status tu_case_reference(tu_case *c);
/* The recurrence of GDN_MATH.md written out naively in double, independent of the library:
 * o [B*T*HV*V], ht [N*HV*K*V] in the case's state layout, steps (may be NULL) [B*T, HV, ..]. */
void tu_case_naive(const tu_case *c, double *o, double *ht, double *steps);
/* Sequence n's token range [*start, *end) in packed (b*T + t) numbering. */
void tu_case_seq(const tu_case *c, int64_t n, int64_t *start, int64_t *end);
/* Closed forms in double: softplus with beta / threshold (0 -> 1 / 20), GDN / KDA gate, beta. */
double tu_softplus(double x, double beta, double threshold);
double tu_gate_value(gdn_gate_kind kind, double a, double A_log, double dt_bias, double lower_bound,
                     double sp_beta, double sp_threshold);
double tu_beta_value(double b, int allow_neg_eigval);

/* ------------------------------------------------------------------------------------------ */
/* gdn_recurrent_fwd with a state pool, checked slot by slot                                   */

#define TU_POOL_MAXN 8  /* sequences */
#define TU_POOL_MAXT 6  /* columns of 2-D state_indices */
#define TU_POOL_MAXP 64 /* slots */
#define TU_POOL_MAXC 8  /* checkpoint columns (chunk op) */

/* How a pool test runs gdn_chunk_fwd on host args (NULL: on the host). */
typedef gdn_status (*tu_chunk_fn)(gdn_chunk_fwd_args a);

typedef struct tu_pool_spec {
    const char *label;
    int N, T, P;                /* sequences, tokens per sequence (unless varlen), pool slots */
    int varlen;                 /* packed sequences of lens[n] tokens (cu_seqlens) */
    int32_t lens[TU_POOL_MAXN];
    int rank2;                  /* 2-D state_indices [N, T_max] */
    int cols;                   /* T_max (>= T when per-step writes happen) */
    int32_t idx[TU_POOL_MAXN][TU_POOL_MAXT]; /* rank 1 uses idx[n][0] */
    int use_nat;
    int32_t nat[TU_POOL_MAXN];
    int null_slot_zero;
    int inplace;
    int with_final, with_steps;
    gdn_state_layout layout;
    gdn_dtype state_dtype;
    int64_t pad;                /* extra elements per pool slot */
    /* The chunk op instead (gdn_chunk_fwd's pool: rank-1 idx, always in place, no final_state or
     * step_states), with its options: */
    int chunk;
    tu_chunk_fn run_chunk;
    int use_has;
    int32_t has[TU_POOL_MAXN];  /* has_initial_state: 0 starts sequence n from zeros */
    int64_t M;                  /* checkpoint_interval, 0: none */
    int ck_cols;
    int32_t ck[TU_POOL_MAXN][TU_POOL_MAXC];
} tu_pool_spec;

/* How a pool test runs gdn_recurrent_fwd on host args: NULL runs it on the host; the CUDA tests
 * pass a device round trip. */
typedef gdn_status (*tu_recurrent_fn)(gdn_recurrent_fwd_args a);

/* Runs one pool call of spec s on a case of base's heads, dimensions, dtypes and gating (B, T or
 * seqlens, state dtype, layout, initial state and seed come from s and seed). The pool holds random
 * values everywhere, padding included, with each live sequence's start slot set to the case's
 * initial state, so that the naive double recurrence gives the expected values. Checks every slot
 * written (tol_state) against it, that padding and all other slots are byte-identical, o (tol_o),
 * final_state and step_states (tol_state), and zeros for skipped sequences. Slots >= P count as
 * invalid, as for device-resident indices. With s->chunk, runs gdn_chunk_fwd with the pool, its
 * has_initial_state (a sequence without one starts from zeros, and its slot's old values must not
 * leak in) and checkpoints (each checked against the reference state after that many tokens). */
/* The chunk-op pool specs (variant 0 .. TU_CHUNK_POOL_SPECS - 1) that the CPU and CUDA tests share
 * (tests/test_state_pool.c). */
#define TU_CHUNK_POOL_SPECS 3
void tu_chunk_pool_specs(int variant, tu_pool_spec *s);

void tu_pool_run(const tu_pool_spec *s, const tu_case_config *base, uint64_t seed, tu_recurrent_fn run,
                 double tol_o, double tol_state);

#endif /* GDN_TEST_UTIL_H */
