/*
 * test_cuda_chunk.c - gdn_chunk_fwd on CUDA tensors against the float64 recurrence
 * (tu_case_naive), through the public API: option matrix (GVA, head dims, L2 norm, gates, beta
 * logits, states, layouts, dtypes), odd lengths, varlen with empty and length-1 sequences,
 * determinism and poisoned outputs, head counts that select each tile shape, long sequences with
 * few heads that take context parallelism (errors printed, to compare with a build without it).
 * Without a usable GPU it exits with TU_EXIT_SKIPPED (ctest: skipped).
 *
 *   build/tests/test_cuda_chunk            all tests
 *   build/tests/test_cuda_chunk varlen     tests whose name contains "varlen"
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "gdn.h"
#include "test_util.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            tu_expect(0, "%s: %s", #x, cudaGetErrorString(e_));                                   \
            return TU_FAIL;                                                                        \
        }                                                                                          \
    } while (0)

static size_t tensor_bytes(const gdn_tensor *t) { return tu_numel(t) * gdn_dtype_size(t->dtype); }

/* Replaces a present host tensor by a device copy (contiguous). */
static int to_device(gdn_tensor *t, void **owned)
{
    *owned = NULL;
    if (!t->data)
        return 1;
    size_t bytes = tensor_bytes(t);
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess)
        return 0;
    if (bytes && cudaMemcpy(d, t->data, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(d);
        return 0;
    }
    t->data = d;
    t->device = GDN_DEVICE_CUDA;
    t->device_ordinal = 0;
    *owned = d;
    return 1;
}

enum { NBUF = 12 };

typedef struct dev_args {
    gdn_chunk_fwd_args a;
    void *bufs[NBUF];
    void *ws;
} dev_args;

static void dev_free(dev_args *d)
{
    for (int i = 0; i < NBUF; i++)
        cudaFree(d->bufs[i]);
    cudaFree(d->ws);
    memset(d, 0, sizeof *d);
}

/* Device copies of every tensor of the host args (outputs carry their poison along). */
/* The call's tensors copied to the device, no workspace. */
static int dev_upload(dev_args *d, const gdn_chunk_fwd_args *host)
{
    memset(d, 0, sizeof *d);
    d->a = *host;
    gdn_tensor *ts[NBUF] = {&d->a.q, &d->a.k, &d->a.v, &d->a.o, &d->a.gate.g, &d->a.gate.a, &d->a.gate.A_log,
                            &d->a.gate.dt_bias, &d->a.gate.beta, &d->a.cu_seqlens, &d->a.initial_state,
                            &d->a.final_state};
    for (int i = 0; i < NBUF; i++)
        if (!to_device(ts[i], &d->bufs[i]))
            return 0;
    return 1;
}

/* dev_upload, and the workspace of the query. */
static int dev_make(dev_args *d, const gdn_chunk_fwd_args *host)
{
    if (!dev_upload(d, host))
        return 0;
    size_t ws = 0;
    if (gdn_chunk_fwd_workspace_size(&d->a, &ws) != GDN_OK)
        return 0;
    if (ws && cudaMalloc(&d->ws, ws) != cudaSuccess)
        return 0;
    d->a.workspace = d->ws;
    d->a.workspace_bytes = ws;
    return 1;
}

typedef struct opts {
    int no_final;
    int check_determinism;
    double tol;
    int report;      /* print the relative errors of o and the final state */
    int alias_state; /* final state written over the initial state (same buffer) */
    int extreme_gates;  /* tu_case_set_extreme_gates: g = -inf and other extremes */
    int zero_run[2];    /* tu_case_set_zero_gates over these time steps, when they differ */
    int ws_least;       /* give the call a workspace 256 bytes short of the query's answer */
    int graph;          /* capture the call in a CUDA graph on its own stream, then launch that */
} opts;

/* The call captured in a CUDA graph on a non-blocking stream (so it may not allocate, synchronize
 * or read device data on the host), then the graph launched once. */
static gdn_status run_captured(gdn_chunk_fwd_args *a)
{
    cudaStream_t stream;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
        return GDN_ERR_CUDA;
    a->stream = stream;
    cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
    gdn_status st = e == cudaSuccess ? gdn_chunk_fwd(a) : GDN_ERR_CUDA;
    if (e == cudaSuccess && (e = cudaStreamEndCapture(stream, &graph)) == cudaSuccess) {
        if (st == GDN_OK) {
            if ((e = cudaGraphInstantiate(&exec, graph, 0)) == cudaSuccess) {
                if ((e = cudaGraphLaunch(exec, stream)) == cudaSuccess)
                    e = cudaStreamSynchronize(stream);
                cudaGraphExecDestroy(exec);
            }
        }
        cudaGraphDestroy(graph);
    }
    cudaStreamDestroy(stream);
    a->stream = NULL;
    tu_expect(e == cudaSuccess, "graph capture / replay: %s", cudaGetErrorString(e));
    return st == GDN_OK && e != cudaSuccess ? GDN_ERR_CUDA : st;
}

static int run_case(const char *name, tu_case_config cfg, opts op)
{
    if (tu_cuda_device_count() == 0) {
        tu_skip_reason("no CUDA device");
        return TU_SKIP;
    }
    tu_case c;
    tu_case_init(&c, &cfg);
    if (op.extreme_gates)
        tu_case_set_extreme_gates(&c);
    if (op.zero_run[1] > op.zero_run[0])
        tu_case_set_zero_gates(&c, op.zero_run[0], op.zero_run[1]);
    tu_case_naive(&c, c.o_ref, c.ht_ref, NULL);
    gdn_chunk_fwd_args host = tu_case_chunk_args(&c);
    if (op.no_final)
        memset(&host.final_state, 0, sizeof host.final_state);
    dev_args d;
    int ok = dev_make(&d, &host);
    if (!tu_expect(ok, "%s: device setup failed", name)) {
        dev_free(&d);
        tu_case_free(&c);
        return TU_FAIL;
    }
    if (op.alias_state)
        d.a.final_state.data = d.a.initial_state.data;
    if (op.ws_least)
        d.a.workspace_bytes -= 256; /* less than the context-parallel path asks: the plain path runs */
    gdn_status st = op.graph ? run_captured(&d.a) : gdn_chunk_fwd(&d.a);
    if (!tu_expect(st == GDN_OK, "%s: gdn_chunk_fwd: %s (%s)", name, gdn_status_string(st), gdn_last_error())) {
        dev_free(&d);
        tu_case_free(&c);
        return TU_FAIL;
    }
    CK(cudaDeviceSynchronize());
    size_t no = (size_t)(c.c.B * c.c.T * c.c.HV * c.c.V), ns = (size_t)c.state_numel;
    size_t ob = no * gdn_dtype_size(c.c.dtype), sb = ns * gdn_dtype_size(c.c.state_dtype);
    CK(cudaMemcpy(c.o, d.a.o.data, ob, cudaMemcpyDeviceToHost));
    char what[160];
    snprintf(what, sizeof what, "%s o", name);
    tu_expect(tu_count_poison(c.o, c.c.dtype, no) == 0, "%s: %zu elements never written", what,
              tu_count_poison(c.o, c.c.dtype, no));
    const tu_err eo = tu_compare(c.o, c.c.dtype, c.o_ref, GDN_DTYPE_F64, no);
    tu_check(what, eo, op.tol);
    if (!op.no_final) {
        CK(cudaMemcpy(c.ht, d.a.final_state.data, sb, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "%s state", name);
        tu_expect(tu_count_poison(c.ht, c.c.state_dtype, ns) == 0, "%s: elements never written", what);
        const tu_err es = tu_compare(c.ht, c.c.state_dtype, c.ht_ref, GDN_DTYPE_F64, ns);
        tu_check(what, es, op.tol);
        if (op.report)
            printf("    %s: o rel %.4e, state rel %.4e\n", name, eo.rel, es.rel);
    }
    if (op.check_determinism) {
        void *o1 = tu_snapshot(c.o, ob);
        void *h1 = op.no_final ? NULL : tu_snapshot(c.ht, sb);
        st = gdn_chunk_fwd(&d.a);
        tu_expect(st == GDN_OK, "%s: second run: %s", name, gdn_last_error());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(c.o, d.a.o.data, ob, cudaMemcpyDeviceToHost));
        tu_expect(tu_same_bytes(o1, c.o, ob), "%s: o differs between two runs", name);
        if (h1) {
            CK(cudaMemcpy(c.ht, d.a.final_state.data, sb, cudaMemcpyDeviceToHost));
            tu_expect(tu_same_bytes(h1, c.ht, sb), "%s: final state differs between two runs", name);
        }
        free(o1);
        free(h1);
    }
    dev_free(&d);
    tu_case_free(&c);
    return TU_PASS;
}

static tu_case_config base(int64_t T, int64_t H, int64_t HV, int64_t K, uint64_t seed)
{
    tu_case_config c;
    memset(&c, 0, sizeof c);
    c.B = 1;
    c.T = T;
    c.H = H;
    c.HV = HV;
    c.K = K;
    c.V = K;
    c.dtype = GDN_DTYPE_BF16;
    c.beta_dtype = GDN_DTYPE_F32;
    c.state_dtype = GDN_DTYPE_F32;
    c.layout = GDN_STATE_KV;
    c.kind = GDN_GATE_GDN;
    c.initial_state = 1;
    c.l2norm = 1;
    c.seed = seed;
    return c;
}

static const opts DEF = {.tol = 1e-2};

/* Result of a test made of several cases: any failure fails it, else any skip (no GPU) skips it. */
static int combine(int rc, int r)
{
    if (rc == TU_FAIL || r == TU_FAIL)
        return TU_FAIL;
    return r == TU_SKIP ? TU_SKIP : rc;
}

/* Option matrix */

static int test_basic(void)
{
    return run_case("basic", base(300, 2, 4, 128, 1), (opts){.check_determinism = 1, .tol = 1e-2});
}

static int test_gva(void)
{
    int rc = TU_PASS;
    static const int g[3] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        tu_case_config c = base(200, 2, 2 * g[i], 128, 10 + (uint64_t)i);
        char name[32];
        snprintf(name, sizeof name, "gva%d", g[i]);
        rc = combine(rc, run_case(name, c, DEF));
    }
    return rc;
}

static int test_head_dim_64(void)
{
    tu_case_config c = base(333, 2, 4, 64, 20);
    int rc = run_case("K=V=64", c, DEF);
    c.B = 2;
    c.seed = 21;
    rc = combine(rc, run_case("K=V=64 B=2", c, DEF));
    return rc;
}

static int test_no_l2norm(void)
{
    tu_case_config c = base(260, 1, 2, 128, 30);
    c.l2norm = 0;
    return run_case("no l2norm", c, DEF);
}

static int test_raw_gates(void)
{
    tu_case_config c = base(250, 2, 4, 128, 40);
    c.raw_gates = 1;
    int rc = run_case("raw gates", c, DEF);
    c.allow_neg_eigval = 1;
    c.seed = 41;
    rc = combine(rc, run_case("raw gates neg eigval", c, DEF));
    return rc;
}

static int test_beta_dtype(void)
{
    tu_case_config c = base(130, 1, 2, 128, 50);
    c.beta_dtype = GDN_DTYPE_BF16;
    return run_case("beta bf16", c, DEF);
}

static int test_states(void)
{
    int rc = TU_PASS;
    tu_case_config c = base(190, 2, 4, 128, 60);
    c.initial_state = 0;
    rc = combine(rc, run_case("no initial state", c, DEF));
    c = base(190, 2, 4, 128, 61);
    rc = combine(rc, run_case("no final state", c, (opts){.no_final = 1, .tol = 1e-2}));
    c.layout = GDN_STATE_VK;
    c.seed = 62;
    rc = combine(rc, run_case("VK layout", c, DEF));
    c.state_dtype = GDN_DTYPE_BF16;
    c.seed = 63;
    rc = combine(rc, run_case("VK bf16 state", c, DEF));
    c.layout = GDN_STATE_KV;
    c.seed = 64;
    rc = combine(rc, run_case("KV bf16 state", c, DEF));
    return rc;
}

static int test_f16(void)
{
    tu_case_config c = base(300, 2, 4, 128, 70);
    c.dtype = GDN_DTYPE_F16;
    c.beta_dtype = GDN_DTYPE_F16;
    return run_case("f16", c, (opts){.tol = 5e-3});
}

static int test_f32_unsupported(void)
{
    if (tu_cuda_device_count() == 0) {
        tu_skip_reason("no CUDA device");
        return TU_SKIP;
    }
    tu_case_config cfg = base(64, 1, 1, 128, 80);
    cfg.dtype = GDN_DTYPE_F32;
    tu_case c;
    tu_case_init(&c, &cfg);
    gdn_chunk_fwd_args host = tu_case_chunk_args(&c);
    dev_args d;
    /* The CUDA backend's limits refuse the query and the call alike, before the workspace is looked at. */
    int ok = dev_upload(&d, &host);
    size_t bytes = 0;
    gdn_status st = ok ? gdn_chunk_fwd_workspace_size(&d.a, &bytes) : GDN_ERR_INTERNAL;
    tu_expect(st == GDN_ERR_UNSUPPORTED && strstr(gdn_last_error(), "bf16 or f16"),
              "f32 inputs, workspace query: got %s (%s), want GDN_ERR_UNSUPPORTED", gdn_status_string(st),
              gdn_last_error());
    st = ok ? gdn_chunk_fwd(&d.a) : GDN_ERR_INTERNAL;
    tu_expect(st == GDN_ERR_UNSUPPORTED && strstr(gdn_last_error(), "bf16 or f16"),
              "f32 inputs: got %s (%s), want GDN_ERR_UNSUPPORTED", gdn_status_string(st), gdn_last_error());
    dev_free(&d);
    tu_case_free(&c);
    return TU_PASS;
}

/* Strided inputs and outputs: views that the kernels cannot bulk-copy in place are packed into the
 * workspace (and o copied out), so every valid stride pattern runs on the chunk kernels. */

/* A 16-bit [B, T, H, D] view inside a larger buffer: strides {b, t, h, d} and an element offset. */
typedef struct view_layout {
    int64_t s[4];
    int64_t off;
} view_layout;

static size_t layout_span(const gdn_tensor *t, view_layout L)
{
    size_t span = (size_t)L.off + 1;
    for (int d = 0; d < 4; d++)
        span += (size_t)((t->shape[d] - 1) * L.s[d]);
    return span;
}

/* Calls f(view index, contiguous index) for every element of t under L. */
#define FOR_VIEW(t, L, EXPR)                                                                       \
    do {                                                                                           \
        size_t ci_ = 0;                                                                            \
        for (int64_t b_ = 0; b_ < (t)->shape[0]; b_++)                                             \
            for (int64_t t_ = 0; t_ < (t)->shape[1]; t_++)                                         \
                for (int64_t h_ = 0; h_ < (t)->shape[2]; h_++)                                     \
                    for (int64_t d_ = 0; d_ < (t)->shape[3]; d_++, ci_++) {                        \
                        const size_t vi_ = (size_t)((L).off + b_ * (L).s[0] + t_ * (L).s[1] +        \
                                                    h_ * (L).s[2] + d_ * (L).s[3]);                \
                        EXPR;                                                                      \
                    }                                                                              \
    } while (0)

/* Replaces the device tensor *t (contiguous, holding `host`'s values) by a view under L into a new,
 * poisoned device buffer *owned of span elements. */
static int restride(gdn_tensor *t, const void *host, view_layout L, void **owned, size_t *span)
{
    *span = layout_span(t, L);
    uint16_t *img = malloc(*span * 2);
    if (!img)
        return 0;
    tu_poison(img, t->dtype, *span);
    const uint16_t *src = host;
    FOR_VIEW(t, L, img[vi_] = src[ci_]);
    int ok = cudaMalloc(owned, *span * 2) == cudaSuccess &&
             cudaMemcpy(*owned, img, *span * 2, cudaMemcpyHostToDevice) == cudaSuccess;
    free(img);
    if (!ok)
        return 0;
    t->data = (uint16_t *)*owned + L.off;
    memcpy(t->stride, L.s, sizeof L.s);
    return 1;
}

/* The case's q, k, v and o under the given layouts (NULL: contiguous), checked against the float64
 * recurrence; o's buffer outside the view must keep its poison. */
static int run_strided(const char *name, tu_case_config cfg, const view_layout *lay[4])
{
    if (tu_cuda_device_count() == 0) {
        tu_skip_reason("no CUDA device");
        return TU_SKIP;
    }
    tu_case c;
    tu_case_init(&c, &cfg);
    tu_case_naive(&c, c.o_ref, c.ht_ref, NULL);
    gdn_chunk_fwd_args host = tu_case_chunk_args(&c);
    dev_args d;
    void *views[4] = {NULL, NULL, NULL, NULL};
    size_t span[4] = {0, 0, 0, 0};
    gdn_tensor *ts[4] = {&d.a.q, &d.a.k, &d.a.v, &d.a.o};
    const void *src[4] = {c.q, c.k, c.v, c.o};
    int ok = dev_make(&d, &host);
    for (int i = 0; ok && i < 4; i++)
        if (lay[i])
            ok = restride(ts[i], src[i], *lay[i], &views[i], &span[i]);
    size_t ws = 0;
    ok = ok && gdn_chunk_fwd_workspace_size(&d.a, &ws) == GDN_OK;
    cudaFree(d.ws);
    d.ws = NULL;
    ok = ok && (ws == 0 || cudaMalloc(&d.ws, ws) == cudaSuccess);
    d.a.workspace = d.ws;
    d.a.workspace_bytes = ws;
    int rc = TU_FAIL;
    if (!tu_expect(ok, "%s: device setup failed", name))
        goto done;
    gdn_status st = gdn_chunk_fwd(&d.a);
    if (!tu_expect(st == GDN_OK, "%s: gdn_chunk_fwd: %s (%s)", name, gdn_status_string(st), gdn_last_error()))
        goto done;
    if (!tu_expect(cudaDeviceSynchronize() == cudaSuccess, "%s: kernel failed", name))
        goto done;
    const size_t no = (size_t)(c.c.B * c.c.T * c.c.HV * c.c.V);
    if (lay[3]) {
        uint16_t *img = malloc(span[3] * 2), *o = c.o;
        ok = img && cudaMemcpy(img, views[3], span[3] * 2, cudaMemcpyDeviceToHost) == cudaSuccess;
        if (ok) {
            FOR_VIEW(&d.a.o, *lay[3], o[ci_] = img[vi_]; img[vi_] = 0);
            tu_expect(tu_count_poison(img, c.c.dtype, span[3]) == span[3] - no,
                      "%s: o's buffer written outside the view", name);
        }
        free(img);
    } else {
        ok = cudaMemcpy(c.o, d.a.o.data, no * gdn_dtype_size(c.c.dtype), cudaMemcpyDeviceToHost) == cudaSuccess;
    }
    if (!tu_expect(ok, "%s: copy back failed", name))
        goto done;
    char what[160];
    snprintf(what, sizeof what, "%s o", name);
    tu_expect(tu_count_poison(c.o, c.c.dtype, no) == 0, "%s: elements never written", what);
    tu_check(what, tu_compare(c.o, c.c.dtype, c.o_ref, GDN_DTYPE_F64, no), 1e-2);
    const size_t ns = (size_t)c.state_numel;
    if (cudaMemcpy(c.ht, d.a.final_state.data, ns * gdn_dtype_size(c.c.state_dtype), cudaMemcpyDeviceToHost) ==
        cudaSuccess) {
        snprintf(what, sizeof what, "%s state", name);
        tu_check(what, tu_compare(c.ht, c.c.state_dtype, c.ht_ref, GDN_DTYPE_F64, ns), 1e-2);
    }
    rc = TU_PASS;
done:
    for (int i = 0; i < 4; i++)
        cudaFree(views[i]);
    dev_free(&d);
    tu_case_free(&c);
    return rc;
}

static int test_strided(void)
{
    int rc = TU_PASS;
    /* transformers' Qwen3-Next: v is a channel slice of a transposed [B, C, T] convolution output
     * (unit stride on the tokens); q and k from a fused projection with a gap between heads. */
    {
        tu_case_config c = base(200, 2, 4, 128, 600);
        c.B = 2;
        const int64_t T = c.T, C = 2 * 2 * 128 + 4 * 128 + 8;
        const view_layout v = {{C * T, 1, 128 * T, T}, (2 * 2 * 128 + 3) * T};
        const view_layout q = {{T * 2 * 136, 2 * 136, 136, 1}, 0};
        const view_layout k = {{T * 2 * 136, 2 * 136, 136, 1}, 8};
        const view_layout *lay[4] = {&q, &k, &v, NULL};
        rc = combine(rc, run_strided("transposed v, gapped q k", c, lay));
    }
    /* Element strides on the head dim, a misaligned pointer, and an o with an odd token stride. */
    {
        tu_case_config c = base(130, 1, 2, 64, 601);
        const int64_t T = c.T;
        const view_layout q = {{T * 64 * 2, 64 * 2, 64 * 2, 2}, 0};
        const view_layout k = {{T * 64, 64, 64, 1}, 1};
        const view_layout o = {{T * (2 * 64 + 3), 2 * 64 + 3, 64, 1}, 5};
        const view_layout *lay[4] = {&q, &k, NULL, &o};
        rc = combine(rc, run_strided("element stride q, misaligned k, odd o", c, lay));
    }
    /* Varlen, with o and v transposed (unit stride on the tokens) and a long sequence for the
     * cooperative and context-parallel paths. */
    {
        tu_case_config c = base(0, 1, 2, 128, 602);
        static const int32_t lens[4] = {3000, 0, 65, 1};
        c.nseq = 4;
        memcpy(c.seqlens, lens, sizeof lens);
        const int64_t T = 3066;
        const view_layout vo = {{2 * 128 * T, 1, 128 * T, T}, 0};
        const view_layout *lay[4] = {NULL, NULL, &vo, &vo};
        rc = combine(rc, run_strided("varlen transposed v and o", c, lay));
        c = base(4096, 1, 2, 128, 603);
        const view_layout vt = {{2 * 128 * 4096, 1, 128 * 4096, 4096}, 0};
        const view_layout *lay2[4] = {NULL, NULL, &vt, NULL};
        rc = combine(rc, run_strided("T=4096 transposed v (CP)", c, lay2));
    }
    return rc;
}

/* Lengths */

static int test_odd_lengths(void)
{
    int rc = TU_PASS;
    static const int64_t T[6] = {1, 63, 64, 65, 200, 1000};
    for (int i = 0; i < 6; i++) {
        tu_case_config c = base(T[i], 2, 4, 128, 100 + (uint64_t)i);
        c.B = 2;
        char name[32];
        snprintf(name, sizeof name, "B=2 T=%lld", (long long)T[i]);
        rc = combine(rc, run_case(name, c, DEF));
    }
    return rc;
}

static int test_varlen(void)
{
    tu_case_config c = base(0, 2, 4, 128, 200);
    static const int32_t lens[10] = {0, 1, 63, 64, 65, 200, 0, 1000, 3, 1};
    c.nseq = 10;
    memcpy(c.seqlens, lens, sizeof lens);
    return run_case("varlen mixed", c, (opts){.check_determinism = 1, .tol = 1e-2});
}

static int test_varlen_long_short(void)
{
    tu_case_config c = base(0, 1, 4, 128, 210);
    static const int32_t lens[6] = {2000, 1, 5, 64, 0, 129};
    c.nseq = 6;
    memcpy(c.seqlens, lens, sizeof lens);
    c.raw_gates = 1;
    c.layout = GDN_STATE_VK;
    return run_case("varlen long+short", c, DEF);
}

static int test_varlen_empty_ends(void)
{
    tu_case_config c = base(0, 1, 2, 64, 220);
    static const int32_t lens[3] = {0, 7, 0};
    c.nseq = 3;
    memcpy(c.seqlens, lens, sizeof lens);
    return run_case("varlen empty ends", c, DEF);
}

/* Head counts that pick each tile shape of the CUDA kernel (with 132 SMs): few (sequence, head)
 * pairs take one slab of 16 value columns per CTA with the key dimension split between two chain
 * warps (the other tests; context parallelism for long sequences, test_cp), a middle range two
 * slabs, many pairs the wide tiles of 64 columns. */
static int test_mid_heads(void)
{
    tu_case_config c = base(130, 4, 12, 128, 410);
    c.B = 2;
    int rc = run_case("B=2 H=4 HV=12", c, (opts){.check_determinism = 1, .tol = 1e-2});
    c = base(100, 8, 40, 64, 411);
    if (run_case("K=V=64 H=8 HV=40", c, DEF) == TU_FAIL)
        rc = TU_FAIL;
    return rc;
}

static int test_many_heads(void)
{
    tu_case_config c = base(150, 16, 48, 128, 400);
    int rc = run_case("H=16 HV=48", c, (opts){.check_determinism = 1, .tol = 1e-2});
    c = base(130, 8, 72, 64, 401);
    rc = combine(rc, run_case("K=V=64 H=8 HV=72", c, DEF));
    c = base(0, 8, 24, 128, 402);
    static const int32_t lens[4] = {70, 0, 129, 1};
    c.nseq = 4;
    memcpy(c.seqlens, lens, sizeof lens);
    return combine(rc, run_case("varlen H=8 HV=24", c, DEF));
}

static int test_long(void)
{
    tu_case_config c = base(4096, 1, 2, 128, 300);
    return run_case("T=4096", c, (opts){.check_determinism = 1, .tol = 1e-2});
}

/* Context parallelism: with few (sequence, head) pairs and long sequences the CUDA path splits
 * each sequence into segments (affine map per segment, scan, main pass). Long-memory gates
 * (g ~ -0.0025) so that each segment's state carries into the next (with logsigmoid(randn)
 * gates it is forgotten within a chunk and M ~ 0); lengths that are not multiples of 64 nor of
 * the segment length, initial and final states (also aliased), GVA, K = V = 64, bf16 state,
 * raw gates. */
static tu_case_config cp_case(int64_t T, int64_t H, int64_t HV, int64_t K, uint64_t seed)
{
    tu_case_config c = base(T, H, HV, K, seed);
    c.gate_mean = 6.f;
    return c;
}

static int test_cp(void)
{
    int rc = TU_PASS;
    tu_case_config c = cp_case(3000, 2, 4, 128, 500);
    rc = combine(rc, run_case("cp T=3000 H=2 HV=4", c, (opts){.check_determinism = 1, .tol = 1e-2, .report = 1}));
    c = cp_case(2500, 1, 2, 128, 501);
    c.B = 2;
    c.layout = GDN_STATE_VK;
    rc = combine(rc, run_case("cp B=2 T=2500 VK aliased", c, (opts){.tol = 1e-2, .report = 1, .alias_state = 1}));
    c = cp_case(2113, 1, 1, 64, 502);
    rc = combine(rc, run_case("cp K=V=64 T=2113", c, (opts){.tol = 1e-2, .report = 1}));
    c = base(2113, 1, 2, 128, 503);
    c.raw_gates = 1;
    rc = combine(rc, run_case("cp T=2113 raw gates", c, (opts){.tol = 1e-2, .report = 1}));
    c = cp_case(4097, 1, 4, 128, 504);
    c.state_dtype = GDN_DTYPE_BF16;
    rc = combine(rc, run_case("cp T=4097 bf16 state", c, (opts){.tol = 1e-2, .report = 1}));
    c = cp_case(2200, 1, 1, 128, 505);
    c.initial_state = 0;
    rc = combine(rc, run_case("cp no initial state", c, (opts){.tol = 1e-2, .report = 1}));
    c = cp_case(2200, 1, 2, 128, 506);
    rc = combine(rc, run_case("cp no final state", c, (opts){.no_final = 1, .tol = 1e-2}));
    return rc;
}

/* The smallest CP case (8 segments of 4 chunks, one head, K = V = 64), for racecheck. */
static int test_cp_small(void)
{
    return run_case("cp small", cp_case(1990, 1, 1, 64, 520), (opts){.check_determinism = 1, .tol = 1e-2, .report = 1});
}

/* g = -inf (a full reset) and other extreme log decays, in short chunks, across chunks and across
 * the segments of the CP path: no NaN, the reference's values. */
static int test_extreme_gates(void)
{
    tu_case_config c = base(300, 2, 8, 128, 530);
    int rc = run_case("extreme gates", c, (opts){.tol = 1e-2, .report = 1, .extreme_gates = 1});
    c = base(4100, 1, 4, 128, 531);
    c.state_dtype = GDN_DTYPE_BF16;
    rc = combine(rc, run_case("extreme gates cp", c, (opts){.tol = 1e-2, .report = 1, .extreme_gates = 1}));
    return rc;
}

/* A workspace smaller than the query's answer but enough for the plain path: a context-parallel
 * shape then runs the plain path, with the same results (the workspace query sizes the fastest
 * path; an engine sizing once for its largest batch must be able to run smaller ones). */
static int test_workspace_least(void)
{
    return run_case("cp shape, plain workspace", cp_case(1990, 1, 1, 64, 540),
                    (opts){.check_determinism = 1, .tol = 1e-2, .report = 1, .ws_least = 1});
}

/* V != K: K = 64 with V = 128, K = 128 with V = 256 (208 KB of shared memory per CTA), on the
 * plain tiles, varlen, and the CP path. */
static int test_head_dims_mixed(void)
{
    tu_case_config c = base(300, 2, 4, 64, 550);
    c.V = 128;
    int rc = run_case("K=64 V=128", c, DEF);
    c = base(200, 1, 2, 128, 551);
    c.V = 256;
    rc = combine(rc, run_case("K=128 V=256", c, DEF));
    c = base(0, 2, 4, 64, 552);
    c.V = 128;
    static const int32_t lens[4] = {65, 0, 130, 7};
    c.nseq = 4;
    memcpy(c.seqlens, lens, sizeof lens);
    rc = combine(rc, run_case("varlen K=64 V=128", c, DEF));
    c = cp_case(2113, 1, 1, 64, 553);
    c.V = 128;
    rc = combine(rc, run_case("cp K=64 V=128", c, (opts){.check_determinism = 1, .tol = 1e-2, .report = 1}));
    c = cp_case(2500, 1, 1, 128, 554);
    c.V = 256;
    rc = combine(rc, run_case("cp K=128 V=256", c, (opts){.tol = 1e-2, .report = 1}));
    return rc;
}

/* The call captured in a CUDA graph: varlen with cu_seqlens on the device, the CP path, and few
 * (sequence, head) pairs without CP (chunk_prep and the main pass in one cooperative grid). */
static int test_graph_capture(void)
{
    tu_case_config c = base(0, 2, 4, 128, 560);
    static const int32_t lens[5] = {200, 0, 65, 1000, 3};
    c.nseq = 5;
    memcpy(c.seqlens, lens, sizeof lens);
    int rc = run_case("graph varlen", c, (opts){.check_determinism = 1, .tol = 1e-2, .graph = 1});
    rc = combine(rc, run_case("graph cp", cp_case(1990, 1, 1, 64, 561),
                              (opts){.check_determinism = 1, .tol = 1e-2, .graph = 1}));
    rc = combine(rc, run_case("graph few pairs", base(700, 2, 4, 128, 562),
                              (opts){.check_determinism = 1, .tol = 1e-2, .graph = 1}));
    return rc;
}

/* Long sequences, few heads (the CP path): errors printed, to compare with a build without CP. */
static int test_cp_long(void)
{
    int rc = TU_PASS;
    tu_case_config c = base(8192, 2, 8, 128, 510);
    c.initial_state = 0;
    rc = combine(rc, run_case("cp T=8192 H=2 HV=8", c, (opts){.tol = 1e-2, .report = 1}));
    c = base(16384, 1, 4, 128, 511);
    c.initial_state = 0;
    rc = combine(rc, run_case("cp T=16384 H=1 HV=4", c, (opts){.tol = 1e-2, .report = 1}));
    c = cp_case(20000, 1, 2, 128, 512);
    rc = combine(rc, run_case("cp T=20000 long memory", c, (opts){.tol = 1e-2, .report = 1}));
    c = cp_case(8192, 2, 8, 128, 513);
    rc = combine(rc, run_case("cp T=8192 H=2 HV=8 long memory", c, (opts){.tol = 1e-2, .report = 1}));
    return rc;
}

/* cu_seqlens lives on the device and the call never reads device memory on the host, so it cannot
 * validate it: a decreasing cu_seqlens, or one past T or below 0, must still give a call that ends
 * without a fault (its output is then unspecified). On the cooperative path (few (sequence, head)
 * pairs: chunk_prep and the main pass wait on each other inside one grid) and on the two-kernel
 * path; compute-sanitizer runs this test too. */
static int malformed_cu_case(const char *name, tu_case_config cfg)
{
    static const int32_t lens[4] = {300, 200, 500, 100}; /* T = 1100 */
    static const int32_t bad[3][5] = {
        {0, 300, 100, 700, 1100},     /* decreasing */
        {0, 500, 400, 2000000, 1100}, /* past T */
        {0, -64, 300, 1000, 900},     /* negative, and a last entry short of T */
    };
    if (tu_cuda_device_count() == 0) {
        tu_skip_reason("no CUDA device");
        return TU_SKIP;
    }
    cfg.nseq = 4;
    memcpy(cfg.seqlens, lens, sizeof lens);
    tu_case c;
    tu_case_init(&c, &cfg);
    gdn_chunk_fwd_args host = tu_case_chunk_args(&c);
    dev_args d;
    int rc = TU_PASS;
    if (!tu_expect(dev_make(&d, &host), "%s: device setup failed", name))
        rc = TU_FAIL;
    for (int i = 0; i < 3 && rc == TU_PASS; i++) {
        if (!tu_expect(cudaMemcpy(d.a.cu_seqlens.data, bad[i], sizeof bad[i], cudaMemcpyHostToDevice) == cudaSuccess,
                       "%s: cu_seqlens copy failed", name)) {
            rc = TU_FAIL;
            break;
        }
        const gdn_status st = gdn_chunk_fwd(&d.a);
        const cudaError_t e = cudaDeviceSynchronize();
        if (!tu_expect(st == GDN_OK && e == cudaSuccess, "%s, cu_seqlens %d: %s / %s", name, i, gdn_status_string(st),
                       cudaGetErrorString(e)))
            rc = TU_FAIL;
    }
    dev_free(&d);
    tu_case_free(&c);
    return rc;
}

static int test_malformed_cu(void)
{
    int rc = malformed_cu_case("few pairs (cooperative)", base(0, 2, 4, 128, 570));
    rc = combine(rc, malformed_cu_case("few pairs, K = 64 (cooperative)", base(0, 2, 4, 64, 571)));
    return combine(rc, malformed_cu_case("many pairs (two kernels)", base(0, 4, 32, 128, 572)));
}

/* ------------------------------------------------------------------------------------------ */
/* State pool and checkpoints (the specs test_state_pool.c runs on the CPU, plus a long sequence
 * that takes the context-parallel path, with checkpoints inside and across its segments). */

static gdn_status run_chunk_cuda(gdn_chunk_fwd_args a)
{
    tu_mirror m = {0};
    gdn_tensor *ts[] = {&a.q, &a.k, &a.v, &a.o, &a.gate.g, &a.gate.a, &a.gate.A_log, &a.gate.dt_bias, &a.gate.beta,
                        &a.cu_seqlens, &a.initial_state, &a.final_state, &a.state_indices, &a.has_initial_state,
                        &a.checkpoint_indices};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        tu_mirror_tensor(&m, ts[i]);
    size_t ws = 0;
    void *dws = NULL;
    gdn_status st = gdn_chunk_fwd_workspace_size(&a, &ws);
    if (st == GDN_OK && ws && cudaMalloc(&dws, ws) != cudaSuccess)
        st = GDN_ERR_OUT_OF_MEMORY;
    a.workspace = dws;
    a.workspace_bytes = ws;
    if (st == GDN_OK)
        st = gdn_chunk_fwd(&a);
    if (st != GDN_OK)
        printf("    gdn_chunk_fwd: %s (%s)\n", gdn_status_string(st), gdn_last_error());
    tu_mirror_back(&m);
    cudaFree(dws);
    return st;
}

/* tu_pool_run's chunk specs (state pool, has_initial_state, null slots, checkpoints) with the
 * gates of `kind`, H key and HV value heads, K = V = KV (run_pool_specs: H = 2, HV = 4); cfg returns
 * the configuration for further cases. */
static void run_pool_specs_heads(gdn_gate_kind kind, uint64_t seed, int64_t KV, int64_t H, int64_t HV, tu_case_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->dtype = GDN_DTYPE_BF16;
    cfg->l2norm = 1;
    cfg->kind = kind;
    cfg->H = H;
    cfg->HV = HV;
    cfg->K = KV;
    cfg->V = KV;
    for (int v = 0; v < TU_CHUNK_POOL_SPECS; v++) {
        tu_pool_spec s;
        tu_chunk_pool_specs(v, &s);
        s.run_chunk = run_chunk_cuda;
        tu_pool_run(&s, cfg, seed + (uint64_t)v, NULL, 6e-3, s.state_dtype == GDN_DTYPE_BF16 ? 1e-2 : 6e-3);
    }
}

static void run_pool_specs(gdn_gate_kind kind, uint64_t seed, int64_t KV, tu_case_config *cfg)
{
    run_pool_specs_heads(kind, seed, KV, 2, 4, cfg);
}

static int test_pool(void)
{
    if (tu_cuda_device_count() == 0) {
        tu_skip_reason("no CUDA device");
        return TU_SKIP;
    }
    tu_case_config cfg;
    run_pool_specs(GDN_GATE_GDN, 9150, 128, &cfg);
    run_pool_specs(GDN_GATE_GDN, 9100, 64, &cfg);
    /* An odd slot stride: the VK states leave the chain one element at a time instead of in key
     * pairs (ChunkParams::ht_pairs). */
    tu_pool_spec s;
    tu_chunk_pool_specs(1, &s);
    s.label = "chunk pool VK f32 varlen, checkpoints M=128, odd slot stride";
    s.state_dtype = GDN_DTYPE_F32;
    s.pad = 27;
    s.run_chunk = run_chunk_cuda;
    tu_pool_run(&s, &cfg, 9170, NULL, 6e-3, 6e-3);
    /* One sequence of 2048 tokens on 2 value heads: 8 context-parallel segments of 4 chunks;
     * checkpoints every 128 tokens (two per segment) for the 8 columns of the first 1024 tokens, one
     * skipped; the later ones have no column. */
    memset(&s, 0, sizeof s);
    s.label = "chunk pool, context parallel, checkpoints M=128";
    s.chunk = 1;
    s.inplace = 1;
    s.run_chunk = run_chunk_cuda;
    s.N = 1;
    s.T = 2048;
    s.P = 20;
    s.pad = 8;
    s.idx[0][0] = 19;
    s.M = 128;
    s.ck_cols = TU_POOL_MAXC;
    for (int j = 0; j < TU_POOL_MAXC; j++)
        s.ck[0][j] = j == 3 ? -1 : 2 * j + 1;
    s.layout = GDN_STATE_VK;
    s.state_dtype = GDN_DTYPE_F32;
    cfg.H = 1;
    cfg.HV = 2;
    tu_pool_run(&s, &cfg, 9200, NULL, 6e-3, 6e-3);
    return TU_PASS;
}

/* KDA gates (one log decay per key channel): kda_prep's records and chunk_wg<KDA>. The bar is
 * issue 16's, 5e-3 relative to the float64 recurrence. Gates logsigmoid(randn) keep the diagonal
 * blocks' decay small enough for tensor cores; gate_std 8 (a mix of ~0 and -20 per key) and the
 * extreme patterns send them to the CUDA-core path. */
static const opts KDA_OPTS = {.tol = 5e-3, .report = 1};

static tu_case_config kda_case(int64_t T, int64_t H, int64_t HV, int64_t K, uint64_t seed)
{
    tu_case_config c = base(T, H, HV, K, seed);
    c.kind = GDN_GATE_KDA;
    return c;
}

/* Varlen batches of more than a wave of main-pass CTAs: with GDN gates chunk_prep orders the
 * sequences longest first for the main pass (order_sequence); every sequence must still be
 * computed once, empty ones and ties included: DUAL (V = 128) and one-chain CTAs (V = 64); KDA
 * gates keep the index order. */
static int test_varlen_order(void)
{
    static const int32_t lens[16] = {5, 0, 64, 1, 700, 130, 0, 33, 1200, 65, 2, 0, 257, 9, 400, 63};
    tu_case_config c = base(0, 4, 16, 128, 230);
    c.nseq = 16;
    memcpy(c.seqlens, lens, sizeof lens);
    int rc = run_case("varlen 16 seqs HV=16 (DUAL)", c, (opts){.check_determinism = 1, .tol = 1e-2});
    c = base(0, 4, 24, 64, 231);
    c.nseq = 16;
    memcpy(c.seqlens, lens, sizeof lens);
    c.layout = GDN_STATE_VK;
    rc = combine(rc, run_case("varlen 16 seqs K=V=64 HV=24 (one chain)", c, (opts){.check_determinism = 1, .tol = 1e-2}));
    c = kda_case(0, 4, 16, 128, 232);
    c.nseq = 16;
    memcpy(c.seqlens, lens, sizeof lens);
    return combine(rc, run_case("kda varlen 16 seqs HV=16", c, (opts){.check_determinism = 1, .tol = 5e-3, .report = 1}));
}

static int test_kda_basic(void)
{
    int rc = run_case("kda basic", kda_case(300, 2, 4, 128, 1600), (opts){.check_determinism = 1, .tol = 5e-3, .report = 1});
    tu_case_config c = kda_case(333, 2, 4, 64, 1601);
    c.B = 2;
    rc = combine(rc, run_case("kda K=V=64 B=2", c, KDA_OPTS));
    c = kda_case(260, 1, 2, 128, 1602);
    c.l2norm = 0;
    rc = combine(rc, run_case("kda no l2norm", c, KDA_OPTS));
    c = kda_case(200, 2, 4, 64, 1603);
    c.V = 128;
    rc = combine(rc, run_case("kda K=64 V=128", c, KDA_OPTS));
    c = kda_case(150, 1, 2, 128, 1604);
    c.V = 256;
    rc = combine(rc, run_case("kda K=128 V=256", c, KDA_OPTS));
    static const int64_t T[5] = {1, 63, 64, 65, 1000};
    for (int i = 0; i < 5; i++) {
        c = kda_case(T[i], 1, 2, 128, 1610 + (uint64_t)i);
        char name[32];
        snprintf(name, sizeof name, "kda T=%lld", (long long)T[i]);
        rc = combine(rc, run_case(name, c, KDA_OPTS));
    }
    return rc;
}

/* GVA (HV = 3 H, 4 H) and the head counts of Kimi Linear / K3 and their TP shards. */
static int test_kda_heads(void)
{
    int rc = TU_PASS;
    static const int64_t hk[7][2] = {{2, 6}, {1, 4}, {4, 4}, {12, 12}, {32, 32}, {96, 96}, {64, 64}};
    for (int i = 0; i < 7; i++) {
        tu_case_config c = kda_case(i < 3 ? 200 : 70, hk[i][0], hk[i][1], i == 4 ? 64 : 128, 1620 + (uint64_t)i);
        char name[40];
        snprintf(name, sizeof name, "kda H=%lld HV=%lld K=%lld", (long long)hk[i][0], (long long)hk[i][1],
                 (long long)c.K);
        rc = combine(rc, run_case(name, c, KDA_OPTS));
    }
    return rc;
}

/* The gate computed in the kernel from raw inputs: FLA's safe gate (lower_bound -5) and the plain
 * softplus gate, beta from logits, negative eigenvalues. */
static int test_kda_raw_gates(void)
{
    tu_case_config c = kda_case(250, 2, 4, 128, 1630);
    c.raw_gates = 1;
    c.lower_bound = -5.f;
    int rc = run_case("kda raw gates lower_bound -5", c, KDA_OPTS);
    c.lower_bound = 0.f;
    c.seed = 1631;
    rc = combine(rc, run_case("kda raw gates softplus", c, KDA_OPTS));
    c.allow_neg_eigval = 1;
    c.lower_bound = -5.f;
    c.seed = 1632;
    rc = combine(rc, run_case("kda raw gates neg eigval", c, KDA_OPTS));
    return rc;
}

/* Wide per-key gates (the CUDA-core diagonal blocks) and the extreme patterns (g = -inf, -1e4,
 * ... 0 per key), also across the segments of the CP path and in f16 (whose diagonal blocks
 * always take the CUDA-core path). */
static int test_kda_extreme(void)
{
    tu_case_config c = kda_case(300, 2, 4, 128, 1640);
    c.gate_std = 8.f;
    int rc = run_case("kda wide gates", c, (opts){.check_determinism = 1, .tol = 5e-3, .report = 1});
    c = kda_case(300, 2, 8, 128, 1641);
    rc = combine(rc, run_case("kda extreme gates", c, (opts){.tol = 5e-3, .report = 1, .extreme_gates = 1}));
    c = kda_case(4100, 1, 4, 128, 1642);
    c.state_dtype = GDN_DTYPE_BF16;
    rc = combine(rc, run_case("kda extreme gates cp", c, (opts){.tol = 1e-2, .report = 1, .extreme_gates = 1}));
    /* No decay for hundreds of tokens: within chunks on tensor cores, across chunks, and across
     * the CP segments (T = 3000 at H = 2 takes the CP path, as kda_cp). The state then holds the
     * whole run and o is mostly q S, whose bf16 S^T operand sets most of the error. */
    c = kda_case(1000, 2, 4, 128, 1644);
    rc = combine(rc, run_case("kda zero gates 800 tokens", c, (opts){.tol = 5e-3, .report = 1, .zero_run = {100, 900}}));
    c = kda_case(3000, 2, 4, 128, 1645);
    rc = combine(rc, run_case("kda zero gates cp", c, (opts){.tol = 5e-3, .report = 1, .zero_run = {200, 2800}}));
    c = kda_case(300, 2, 4, 128, 1643);
    c.dtype = GDN_DTYPE_F16;
    c.beta_dtype = GDN_DTYPE_F16;
    rc = combine(rc, run_case("kda f16", c, KDA_OPTS));
    return rc;
}

static int test_kda_states(void)
{
    tu_case_config c = kda_case(190, 2, 4, 128, 1650);
    c.initial_state = 0;
    int rc = run_case("kda no initial state", c, KDA_OPTS);
    c = kda_case(190, 2, 4, 128, 1651);
    rc = combine(rc, run_case("kda no final state", c, (opts){.no_final = 1, .tol = 5e-3}));
    c.layout = GDN_STATE_VK;
    c.state_dtype = GDN_DTYPE_BF16;
    c.seed = 1652;
    rc = combine(rc, run_case("kda VK bf16 state", c, (opts){.tol = 1e-2, .report = 1}));
    c = kda_case(190, 2, 4, 128, 1653);
    rc = combine(rc, run_case("kda aliased state", c, (opts){.tol = 5e-3, .report = 1, .alias_state = 1}));
    return rc;
}

static int test_kda_varlen(void)
{
    tu_case_config c = kda_case(0, 2, 4, 128, 1660);
    static const int32_t lens[10] = {0, 1, 63, 64, 65, 200, 0, 1000, 3, 1};
    c.nseq = 10;
    memcpy(c.seqlens, lens, sizeof lens);
    int rc = run_case("kda varlen mixed", c, (opts){.check_determinism = 1, .tol = 5e-3, .report = 1});
    c = kda_case(0, 1, 4, 64, 1661);
    static const int32_t lens2[4] = {129, 0, 7, 640};
    c.nseq = 4;
    memcpy(c.seqlens, lens2, sizeof lens2);
    c.raw_gates = 1;
    c.lower_bound = -5.f;
    c.layout = GDN_STATE_VK;
    rc = combine(rc, run_case("kda varlen raw gates K=64", c, KDA_OPTS));
    return combine(rc, run_case("kda varlen graph", c, (opts){.tol = 5e-3, .graph = 1}));
}

/* Context parallelism with KDA gates: long-memory gates (g ~ -0.0025) so that segments carry
 * state. There the state sums thousands of tokens and each chunk's bf16 roundings (S^T, X^T,
 * Vn^T and KDA's decayed K tiles) add up: these are the largest KDA errors, still under issue
 * 16's 5e-3. */
static int test_kda_cp(void)
{
    tu_case_config c = cp_case(3000, 2, 4, 128, 1670);
    c.kind = GDN_GATE_KDA;
    int rc = run_case("kda cp T=3000", c, (opts){.check_determinism = 1, .tol = 5e-3, .report = 1});
    c = cp_case(2113, 1, 1, 64, 1671);
    c.kind = GDN_GATE_KDA;
    c.layout = GDN_STATE_VK;
    rc = combine(rc, run_case("kda cp K=V=64 VK", c, (opts){.tol = 5e-3, .report = 1, .graph = 1}));
    c = base(2500, 1, 2, 128, 1672);
    c.kind = GDN_GATE_KDA;
    c.raw_gates = 1;
    c.lower_bound = -5.f;
    rc = combine(rc, run_case("kda cp raw gates", c, KDA_OPTS));
    c = cp_case(1990, 1, 1, 64, 1673);
    c.kind = GDN_GATE_KDA;
    rc = combine(rc, run_case("kda cp, plain workspace", c, (opts){.tol = 5e-3, .report = 1, .ws_least = 1}));
    return rc;
}

/* Few (sequence, head) pairs without CP, fixed length: the first chunks' records before the
 * cooperative grid (kda_coop_first), the rest by kda_prep units beside the main pass (launch_coop).
 * On 132 SMs: 24 main-pass CTAs (12 heads) and 12, 16 take no prefix; 64 (B = 2, 16 heads) 25 % of
 * the chunks on an H100, 40 % on an H200; 48 (K = 64, 48 value heads) 38 % / 51 %. */
static int test_kda_coop(void)
{
    tu_case_config c = kda_case(3000, 12, 12, 128, 1680);
    int rc = run_case("kda coop T=3000 H=12", c, (opts){.check_determinism = 1, .tol = 5e-3, .report = 1});
    c = kda_case(2000, 16, 16, 128, 1681);
    c.B = 2;
    c.raw_gates = 1;
    c.lower_bound = -5.f;
    rc = combine(rc, run_case("kda coop B=2 H=16 raw gates", c, (opts){.check_determinism = 1, .tol = 5e-3, .report = 1}));
    c = kda_case(1500, 4, 12, 64, 1682);
    c.layout = GDN_STATE_VK;
    c.state_dtype = GDN_DTYPE_BF16;
    rc = combine(rc, run_case("kda coop GVA K=64 bf16 VK graph", c, (opts){.tol = 1e-2, .report = 1, .graph = 1}));
    c = kda_case(65, 2, 8, 128, 1683);
    rc = combine(rc, run_case("kda coop T=65", c, KDA_OPTS));
    c = kda_case(2000, 4, 48, 64, 1684);
    c.dtype = GDN_DTYPE_F16;
    rc = combine(rc, run_case("kda coop prefix K=64 f16 graph", c, (opts){.check_determinism = 1, .tol = 5e-3, .report = 1, .graph = 1}));
    return rc;
}

/* More main-pass CTAs than half the SMs, without CP: kda_prep over all chunks, then the main pass
 * (launch_two), fixed length with many heads and varlen at any head count. On 132 SMs: 192 and 120
 * main-pass CTAs. */
static int test_kda_many(void)
{
    tu_case_config c = kda_case(700, 48, 48, 128, 1690);
    c.B = 2;
    int rc = run_case("kda many B=2 H=48 graph", c, (opts){.check_determinism = 1, .tol = 5e-3, .report = 1, .graph = 1});
    c = kda_case(400, 8, 40, 64, 1691);
    c.B = 3;
    c.raw_gates = 1;
    c.lower_bound = -5.f;
    c.layout = GDN_STATE_VK;
    c.state_dtype = GDN_DTYPE_BF16;
    rc = combine(rc, run_case("kda many B=3 GVA K=64 raw gates bf16 VK", c, (opts){.tol = 1e-2, .report = 1}));
    c = kda_case(0, 16, 32, 128, 1692);
    static const int32_t lens[5] = {300, 0, 1, 900, 64};
    c.nseq = 5;
    memcpy(c.seqlens, lens, sizeof lens);
    rc = combine(rc, run_case("kda many varlen H=32", c, (opts){.check_determinism = 1, .tol = 5e-3, .report = 1}));
    return rc;
}

/* Two chains a CTA: with at least twice an SM's worth of 64-row value tiles the launcher takes
 * chunk_wg's DUAL instance (dual_fits; H = HV = SMs / 2 at B = 2 gives two waves of one-chain CTAs
 * against one of DUAL's). Initial state, odd lengths, GVA, varlen with an empty sequence, bf16
 * states in the VK layout, KDA gates, the state pool and checkpoints. */
static int test_dual(void)
{
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess || sms < 2) {
        printf("  no SM count\n");
        return TU_FAIL;
    }
    const int64_t hv = sms / 2;
    tu_case_config c = base(130, hv, hv, 128, 420);
    c.B = 2;
    int rc = run_case("B=2 H=HV=SMs/2", c, (opts){.check_determinism = 1, .tol = 1e-2});
    c = base(0, hv, 2 * hv, 128, 421);
    static const int32_t lens[3] = {200, 0, 65};
    c.nseq = 3;
    memcpy(c.seqlens, lens, sizeof lens);
    c.state_dtype = GDN_DTYPE_BF16;
    c.layout = GDN_STATE_VK;
    rc = combine(rc, run_case("varlen H=SMs/2 HV=SMs, bf16 VK states", c, DEF));
    c = kda_case(130, hv, hv, 128, 422);
    c.B = 2;
    c.raw_gates = 1;
    c.lower_bound = -5.f;
    rc = combine(rc, run_case("kda B=2 H=HV=SMs/2 raw gates", c, (opts){.check_determinism = 1, .tol = 5e-3, .report = 1}));
    /* The serving instances: the chunk pool specs (4 sequences: checkpoints, skipped sequences,
     * has_initial_state, bf16 VK pools) on H = HV = SMs / 2, four waves of one-chain CTAs. */
    tu_case_config cfg;
    run_pool_specs_heads(GDN_GATE_GDN, 9400, 128, hv, hv, &cfg);
    run_pool_specs_heads(GDN_GATE_KDA, 9410, 128, hv, hv, &cfg);
    return rc;
}

/* The state pool and checkpoints with KDA gates (tu_pool_run's chunk specs). */
static int test_kda_pool(void)
{
    if (tu_cuda_device_count() == 0) {
        tu_skip_reason("no CUDA device");
        return TU_SKIP;
    }
    tu_case_config cfg;
    run_pool_specs(GDN_GATE_KDA, 9300, 64, &cfg);
    run_pool_specs(GDN_GATE_KDA, 9350, 128, &cfg);
    return TU_PASS;
}

int main(int argc, char **argv)
{
    static const tu_test tests[] = {
        {"basic", test_basic},
        {"gva", test_gva},
        {"head_dim_64", test_head_dim_64},
        {"no_l2norm", test_no_l2norm},
        {"raw_gates", test_raw_gates},
        {"beta_dtype", test_beta_dtype},
        {"states", test_states},
        {"f16", test_f16},
        {"f32_unsupported", test_f32_unsupported},
        {"strided", test_strided},
        {"odd_lengths", test_odd_lengths},
        {"varlen", test_varlen},
        {"varlen_long_short", test_varlen_long_short},
        {"varlen_empty_ends", test_varlen_empty_ends},
        {"varlen_order", test_varlen_order},
        {"mid_heads", test_mid_heads},
        {"many_heads", test_many_heads},
        {"dual", test_dual},
        {"long", test_long},
        {"cp_cases", test_cp},
        {"cp_small", test_cp_small},
        {"cp_long", test_cp_long},
        {"extreme_gates", test_extreme_gates},
        {"workspace_least", test_workspace_least},
        {"head_dims_mixed", test_head_dims_mixed},
        {"graph_capture", test_graph_capture},
        {"malformed_cu", test_malformed_cu},
        {"pool", test_pool},
        {"kda_basic", test_kda_basic},
        {"kda_heads", test_kda_heads},
        {"kda_raw_gates", test_kda_raw_gates},
        {"kda_extreme", test_kda_extreme},
        {"kda_states", test_kda_states},
        {"kda_varlen", test_kda_varlen},
        {"kda_cp", test_kda_cp},
        {"kda_coop", test_kda_coop},
        {"kda_many", test_kda_many},
        {"kda_pool", test_kda_pool},
    };
    const char *why = tu_cuda_unavailable();
    if (why) {
        printf("SKIP all %d tests: %s\n", TU_COUNT(tests), why);
        return TU_EXIT_SKIPPED;
    }
    return tu_main(tests, TU_COUNT(tests), argc, argv);
}
