/*
 * test_backward.c - gdn_chunk_bwd on the CPU: the float64 oracle against central finite
 * differences of L = sum(d_o * o) + sum(dht * final_state) computed by the f64 forward, along
 * random directions of every input (and element by element for A_log / dt_bias), for each option:
 * l2 norm, in-kernel gate (with and without dt_bias, softplus options), beta logits, allow_neg_eigval, GVA, varlen
 * with an empty sequence, initial state in both layouts, dht present and absent, extreme gates
 * (g = -1e4 and 0), T from 1 to 70 (chunk boundaries crossed). Then f32 and bf16 inputs (f32 and
 * bf16 states) against the oracle on the same rounded values, bitwise repeatability across thread
 * counts, strided q / k / v and gradients, and the validation rules (bad
 * shapes, aliasing, missing outputs and workspace: clear errors, outputs untouched).
 *   build/tests/test_backward [name-substring ...]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#ifdef GDN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

typedef struct bw_cfg {
    int64_t B, T, H, HV, K, V;
    int nseq;              /* > 0: varlen (B = 1, T = sum of seqlens) */
    int32_t seqlens[8];
    int raw;               /* in-kernel gate: a, A_log (and dt_bias) */
    int dt_bias;           /* with raw */
    int logits, neg_eig;   /* beta_from_logits, allow_neg_eigval */
    int l2norm, h0, dht;
    gdn_state_layout layout;
    int extreme;           /* g cycles through -1e4, 0 and draws */
    float softplus_beta, softplus_threshold; /* raw gates; 0: defaults */
    uint64_t seed;
} bw_cfg;

/* A problem's inputs in double (already rounded to the dtype under test), its gradients' buffers. */
typedef struct bw_case {
    bw_cfg c;
    int64_t N, nqk, nv, ng, ns;  /* sequences; elements of q, v, g, one state tensor */
    int32_t cu[9];
    double *q, *k, *v, *gate, *beta, *h0, *d_o, *dht; /* gate: g or a */
    float A_log[8], dt_bias[8];
} bw_case;

static double *randn(tu_rng *r, int64_t n, double std)
{
    double *x = tu_alloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++)
        x[i] = std * tu_rng_normal(r);
    return x;
}

static void case_init(bw_case *cs, const bw_cfg *cfg)
{
    memset(cs, 0, sizeof *cs);
    cs->c = *cfg;
    bw_cfg *c = &cs->c;
    tu_rng r = tu_rng_make(c->seed);
    cs->N = c->B;
    if (c->nseq > 0) {
        c->B = 1;
        c->T = 0;
        cs->cu[0] = 0;
        for (int n = 0; n < c->nseq; n++) {
            c->T += c->seqlens[n];
            cs->cu[n + 1] = (int32_t)c->T;
        }
        cs->N = c->nseq;
    }
    cs->nqk = c->B * c->T * c->H * c->K;
    cs->nv = c->B * c->T * c->HV * c->V;
    cs->ng = c->B * c->T * c->HV;
    cs->ns = cs->N * c->HV * c->K * c->V;
    cs->q = randn(&r, cs->nqk, 1.0);
    cs->k = randn(&r, cs->nqk, 1.0);
    if (!c->l2norm) /* keep the recurrence stable: unit keys */
        for (int64_t t = 0; t < cs->nqk / c->K; t++) {
            double ss = 0.0;
            for (int64_t i = 0; i < c->K; i++)
                ss += cs->k[t * c->K + i] * cs->k[t * c->K + i];
            for (int64_t i = 0; i < c->K; i++)
                cs->k[t * c->K + i] /= sqrt(ss);
        }
    cs->v = randn(&r, cs->nv, 1.0);
    cs->d_o = randn(&r, cs->nv, 1.0);
    cs->gate = tu_alloc((size_t)cs->ng * sizeof(double));
    cs->beta = tu_alloc((size_t)cs->ng * sizeof(double));
    for (int64_t i = 0; i < cs->ng; i++) {
        double x = tu_rng_normal(&r);
        if (c->raw)
            cs->gate[i] = x; /* raw a */
        else if (c->extreme)
            cs->gate[i] = i % 3 == 0 ? -1e4 : i % 3 == 1 ? 0.0 : -log1p(exp(-(x + 2.0)));
        else
            cs->gate[i] = -log1p(exp(-(x + 2.0))); /* logsigmoid(x + 2) */
        cs->beta[i] = c->logits ? 2.0 * tu_rng_normal(&r) : tu_rng_uniform(&r);
    }
    for (int64_t j = 0; j < c->HV; j++) {
        cs->A_log[j] = (float)log(0.5 + 2.0 * tu_rng_uniform(&r));
        cs->dt_bias[j] = (float)tu_rng_normal(&r);
    }
    if (c->h0)
        cs->h0 = randn(&r, cs->ns, 0.5);
    if (c->dht)
        cs->dht = randn(&r, cs->ns, 1.0);
}

static void case_free(bw_case *cs)
{
    free(cs->q); free(cs->k); free(cs->v); free(cs->gate); free(cs->beta);
    free(cs->h0); free(cs->d_o); free(cs->dht);
}

/* A tensor of `src` converted to dtype (a new buffer; NULL src gives an absent tensor). */
static gdn_tensor make(const double *src, gdn_dtype dt, int rank, const int64_t *shape, int64_t n)
{
    if (!src) {
        gdn_tensor t;
        memset(&t, 0, sizeof t);
        return t;
    }
    void *d = tu_alloc_elems(dt, (size_t)n);
    for (int64_t i = 0; i < n; i++)
        tu_set(d, dt, (size_t)i, src[i]);
    return tu_tensor(d, dt, rank, shape);
}

static gdn_tensor out_like(gdn_tensor in)
{
    size_t n = tu_numel(&in);
    void *d = tu_alloc_elems(in.dtype, n);
    tu_poison(d, in.dtype, n);
    return tu_tensor(d, in.dtype, in.rank, in.shape);
}

/* All tensors of one backward (or forward) call in the given dtypes. */
typedef struct bw_call {
    gdn_chunk_bwd_args a;
    gdn_tensor o, ht;
    void *ws;
} bw_call;

static void call_init(bw_call *k, const bw_case *cs, gdn_dtype dt, gdn_dtype state_dt, gdn_dtype beta_dt)
{
    const bw_cfg *c = &cs->c;
    memset(k, 0, sizeof *k);
    gdn_chunk_bwd_args *a = &k->a;
    int64_t sqk[4] = {c->B, c->T, c->H, c->K}, sv[4] = {c->B, c->T, c->HV, c->V}, sg[3] = {c->B, c->T, c->HV};
    int64_t sst[4] = {cs->N, c->HV, c->layout == GDN_STATE_KV ? c->K : c->V, c->layout == GDN_STATE_KV ? c->V : c->K};
    int64_t shv[1] = {c->HV}, scu[1] = {cs->N + 1};
    gdn_dtype gdt = dt == GDN_DTYPE_F64 ? GDN_DTYPE_F64 : GDN_DTYPE_F32;
    a->q = make(cs->q, dt, 4, sqk, cs->nqk);
    a->k = make(cs->k, dt, 4, sqk, cs->nqk);
    a->v = make(cs->v, dt, 4, sv, cs->nv);
    a->gate.kind = GDN_GATE_GDN;
    if (c->raw) {
        a->gate.a = make(cs->gate, dt, 3, sg, cs->ng);
        a->gate.A_log = tu_tensor((void *)cs->A_log, GDN_DTYPE_F32, 1, shv);
        if (c->dt_bias)
            a->gate.dt_bias = tu_tensor((void *)cs->dt_bias, GDN_DTYPE_F32, 1, shv);
    } else {
        a->gate.g = make(cs->gate, gdt, 3, sg, cs->ng);
    }
    a->gate.beta = make(cs->beta, beta_dt, 3, sg, cs->ng);
    a->gate.softplus_beta = c->softplus_beta;
    a->gate.softplus_threshold = c->softplus_threshold;
    a->gate.beta_from_logits = c->logits;
    a->gate.allow_neg_eigval = c->neg_eig;
    a->use_qk_l2norm = c->l2norm;
    if (c->nseq > 0)
        a->cu_seqlens = tu_tensor((void *)cs->cu, GDN_DTYPE_I32, 1, scu);
    a->state_layout = c->layout;
    a->initial_state = make(cs->h0, state_dt, 4, sst, cs->ns);
    a->d_o = make(cs->d_o, dt, 4, sv, cs->nv);
    a->dht = make(cs->dht, state_dt, 4, sst, cs->ns);
    a->dq = out_like(a->q);
    a->dk = out_like(a->k);
    a->dv = out_like(a->v);
    if (c->raw) {
        a->da = out_like(a->gate.a);
        a->dA_log = out_like(a->gate.A_log);
        if (c->dt_bias)
            a->ddt_bias = out_like(a->gate.dt_bias);
    } else {
        a->dg = out_like(a->gate.g);
    }
    a->dbeta = out_like(a->gate.beta);
    if (c->h0)
        a->dh0 = out_like(a->initial_state);
    k->o = out_like(a->v);
    k->ht = tu_tensor(tu_alloc_elems(state_dt, (size_t)cs->ns), state_dt, 4, sst);
}

static void call_free(bw_call *k)
{
    gdn_chunk_bwd_args *a = &k->a;
    void *bufs[] = {a->q.data, a->k.data, a->v.data, a->gate.a.data, a->gate.g.data, a->gate.beta.data,
                    a->initial_state.data, a->d_o.data, a->dht.data, a->dq.data, a->dk.data, a->dv.data,
                    a->dg.data, a->da.data, a->dA_log.data, a->ddt_bias.data, a->dbeta.data, a->dh0.data,
                    k->o.data, k->ht.data, k->ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
}

static gdn_status run_bwd(bw_call *k)
{
    size_t bytes = 0;
    gdn_status st = gdn_chunk_bwd_workspace_size(&k->a, &bytes);
    if (st != GDN_OK)
        return st;
    free(k->ws);
    k->ws = aligned_alloc(256, (bytes + 255) / 256 * 256);
    k->a.workspace = k->ws;
    k->a.workspace_bytes = bytes;
    return gdn_chunk_bwd(&k->a);
}

/* The forward's arguments of a backward call: its inputs (o, states out and workspace left to the
 * caller). */
static gdn_chunk_fwd_args fwd_of(const gdn_chunk_bwd_args *a)
{
    gdn_chunk_fwd_args f;
    memset(&f, 0, sizeof f);
    f.q = a->q;
    f.k = a->k;
    f.v = a->v;
    f.gate = a->gate;
    f.scale = a->scale;
    f.use_qk_l2norm = a->use_qk_l2norm;
    f.cu_seqlens = a->cu_seqlens;
    f.state_layout = a->state_layout;
    f.initial_state = a->initial_state;
    return f;
}

#ifdef GDN_WITH_CUDA
/* The forward on the device tensors of a (o into a fresh buffer, copied to the host o_host),
 * with saved_states (may be NULL) given. */
static gdn_status fwd_cuda(const gdn_chunk_bwd_args *a, void *o_host, const gdn_tensor *o_like, void *saved,
                           size_t saved_bytes)
{
    gdn_chunk_fwd_args f = fwd_of(a);
    f.o = *o_like;
    f.o.device = a->v.device;
    f.o.device_ordinal = a->v.device_ordinal;
    f.saved_states = saved;
    f.saved_states_bytes = saved_bytes;
    const size_t ob = tu_numel(o_like) * gdn_dtype_size(o_like->dtype);
    TU_CUDA_OK(cudaMalloc(&f.o.data, ob));
    size_t bytes = 0;
    void *ws = NULL;
    gdn_status st = gdn_chunk_fwd_workspace_size(&f, &bytes);
    if (st == GDN_OK) {
        TU_CUDA_OK(cudaMalloc(&ws, bytes ? bytes : 1));
        f.workspace = ws;
        f.workspace_bytes = bytes;
        st = gdn_chunk_fwd(&f);
    }
    TU_CUDA_OK(cudaMemcpy(o_host, f.o.data, ob, cudaMemcpyDeviceToHost));
    TU_CUDA_OK(cudaFree(f.o.data));
    TU_CUDA_OK(cudaFree(ws));
    return st;
}
#endif

/* The call on CUDA: every tensor mirrored to the device, the workspace there (poisoned with 0xff
 * bytes), the outputs copied back to the host buffers. graph: the call is captured in a CUDA graph
 * on a non-blocking stream (so it may not allocate, synchronize or read device data on the host),
 * then the graph is launched. saved: the backward reads the states that the forward saved
 * (gdn_chunk_fwd_args.saved_states, a buffer poisoned with 0xff first; 2: the backward is told
 * 16 bytes fewer than the query's); the forward's o must keep the bits of a forward that saves
 * nothing. */
static gdn_status run_bwd_cuda_mode(bw_call *k, int graph, int saved)
{
#ifdef GDN_WITH_CUDA
    gdn_chunk_bwd_args a = k->a;
    tu_mirror m = {0};
    gdn_tensor *ts[] = {&a.q, &a.k, &a.v, &a.gate.g, &a.gate.a, &a.gate.A_log, &a.gate.dt_bias, &a.gate.beta,
                        &a.cu_seqlens, &a.initial_state, &a.d_o, &a.dht, &a.dq, &a.dk, &a.dv, &a.dg, &a.da,
                        &a.dA_log, &a.ddt_bias, &a.dbeta, &a.dh0};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        tu_mirror_tensor(&m, ts[i]);
    size_t bytes = 0;
    void *ws = NULL, *sv = NULL;
    gdn_status st = GDN_OK;
    if (saved) {
        gdn_chunk_fwd_args f = fwd_of(&a);
        f.o = a.dv; /* a device tensor of o's shape for the query's checks; nothing is written */
        size_t sb = 0;
        st = gdn_chunk_saved_states_size(&f, &sb);
        tu_expect(st == GDN_OK && sb > 0, "gdn_chunk_saved_states_size: %zu bytes (%s)", sb, gdn_last_error());
        if (st == GDN_OK && sb > 0) {
            TU_CUDA_OK(cudaMalloc(&sv, sb));
            TU_CUDA_OK(cudaMemset(sv, 0xff, sb));
            const size_t ob = tu_numel(&k->o) * gdn_dtype_size(k->o.dtype);
            unsigned char *o1 = malloc(ob), *o2 = malloc(ob);
            st = fwd_cuda(&a, o1, &k->o, NULL, 0);
            if (st == GDN_OK)
                st = fwd_cuda(&a, o2, &k->o, sv, sb);
            if (st == GDN_OK)
                tu_expect(tu_same_bytes(o1, o2, ob), "the forward's o changes when it saves the states");
            free(o1);
            free(o2);
            a.saved_states = sv;
            a.saved_states_bytes = saved == 2 ? sb - 16 : sb;
        }
    }
    if (st == GDN_OK)
        st = gdn_chunk_bwd_workspace_size(&a, &bytes);
    if (st == GDN_OK) {
        TU_CUDA_OK(cudaMalloc(&ws, bytes ? bytes : 1));
        TU_CUDA_OK(cudaMemset(ws, 0xff, bytes));
        a.workspace = ws;
        a.workspace_bytes = bytes;
        if (!graph) {
            st = gdn_chunk_bwd(&a);
        } else {
            cudaStream_t stream;
            cudaGraph_t g;
            cudaGraphExec_t exec;
            TU_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
            a.stream = stream;
            TU_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            st = gdn_chunk_bwd(&a);
            TU_CUDA_OK(cudaStreamEndCapture(stream, &g));
            if (st == GDN_OK) {
                TU_CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
                TU_CUDA_OK(cudaGraphLaunch(exec, stream));
                TU_CUDA_OK(cudaStreamSynchronize(stream));
                TU_CUDA_OK(cudaGraphExecDestroy(exec));
            }
            TU_CUDA_OK(cudaGraphDestroy(g));
            TU_CUDA_OK(cudaStreamDestroy(stream));
        }
    }
    if (st != GDN_OK)
        printf("    gdn_chunk_bwd (CUDA): %s (%s)\n", gdn_status_string(st), gdn_last_error());
    tu_mirror_back(&m);
    TU_CUDA_OK(cudaFree(ws));
    TU_CUDA_OK(cudaFree(sv));
    return st;
#else
    (void)k;
    (void)graph;
    (void)saved;
    return GDN_ERR_UNSUPPORTED;
#endif
}

static gdn_status run_bwd_cuda(bw_call *k) { return run_bwd_cuda_mode(k, 0, 0); }

/* L = sum(d_o * o) + sum(dht * ht) by the forward on the call's inputs. */
static double loss(bw_call *k)
{
    gdn_chunk_fwd_args f = fwd_of(&k->a);
    f.final_state = k->ht;
    f.o = k->o;
    gdn_status st = tu_chunk_fwd(&f);
    if (st != GDN_OK) {
        tu_expect(0, "forward: %s", gdn_last_error());
        return NAN;
    }
    double L = 0.0;
    size_t no = tu_numel(&k->o), nh = tu_numel(&k->ht);
    for (size_t i = 0; i < no; i++)
        L += tu_get(k->a.d_o.data, k->a.d_o.dtype, i) * tu_get(k->o.data, k->o.dtype, i);
    if (k->a.dht.data)
        for (size_t i = 0; i < nh; i++)
            L += tu_get(k->a.dht.data, k->a.dht.dtype, i) * tu_get(k->ht.data, k->ht.dtype, i);
    return L;
}

/* Central difference of L along a random direction of the f64 input x, against <grad, dir>. */
static void fd_direction(bw_call *k, const char *what, gdn_tensor *x, const gdn_tensor *grad, tu_rng *r)
{
    const size_t n = tu_numel(x);
    double *x0 = tu_alloc(n * sizeof(double)), *dir = tu_alloc(n * sizeof(double));
    memcpy(x0, x->data, n * sizeof(double));
    double pred = 0.0, eps = 1e-5;
    for (size_t i = 0; i < n; i++) {
        dir[i] = tu_rng_normal(r);
        pred += dir[i] * tu_get(grad->data, grad->dtype, i);
    }
    double *xd = (double *)x->data;
    for (size_t i = 0; i < n; i++)
        xd[i] = x0[i] + eps * dir[i];
    double lp = loss(k);
    for (size_t i = 0; i < n; i++)
        xd[i] = x0[i] - eps * dir[i];
    double lm = loss(k);
    memcpy(x->data, x0, n * sizeof(double));
    double fd = (lp - lm) / (2.0 * eps);
    double err = fabs(fd - pred) / fmax(fabs(fd), 1e-3);
    tu_expect(err < 1e-6, "%s: finite difference %.10e, gradient %.10e (rel %.2e)", what, fd, pred, err);
    free(x0);
    free(dir);
}

/* Element by element for an f32 parameter vector (A_log, dt_bias): a step that f32 represents. */
static void fd_elements_f32(bw_call *k, const char *what, gdn_tensor *x, const gdn_tensor *grad)
{
    float *xd = (float *)x->data;
    for (size_t i = 0; i < tu_numel(x); i++) {
        const float x0 = xd[i];
        const float xp = x0 + 1e-3f, xm = x0 - 1e-3f;
        xd[i] = xp;
        double lp = loss(k);
        xd[i] = xm;
        double lm = loss(k);
        xd[i] = x0;
        double fd = (lp - lm) / ((double)xp - (double)xm), g = tu_get(grad->data, grad->dtype, i);
        double err = fabs(fd - g) / fmax(fabs(fd), 1e-2);
        tu_expect(err < 1e-4, "%s[%zu]: finite difference %.8e, gradient %.8e (rel %.2e)", what, i, fd, g, err);
    }
}

static void no_poison(const char *what, const gdn_tensor *t)
{
    if (t->data)
        tu_expect(tu_count_poison(t->data, t->dtype, tu_numel(t)) == 0, "%s: elements left unwritten", what);
}

static void check_fd(const bw_cfg *cfg)
{
    bw_case cs;
    case_init(&cs, cfg);
    bw_call k;
    call_init(&k, &cs, GDN_DTYPE_F64, GDN_DTYPE_F64, GDN_DTYPE_F64);
    gdn_status st = run_bwd(&k);
    if (!tu_expect(st == GDN_OK, "gdn_chunk_bwd: %s: %s", gdn_status_string(st), gdn_last_error())) {
        call_free(&k);
        case_free(&cs);
        return;
    }
    gdn_chunk_bwd_args *a = &k.a;
    const gdn_tensor *outs[] = {&a->dq, &a->dk, &a->dv, &a->dg, &a->da, &a->dA_log, &a->ddt_bias, &a->dbeta, &a->dh0};
    const char *names[] = {"dq", "dk", "dv", "dg", "da", "dA_log", "ddt_bias", "dbeta", "dh0"};
    for (int i = 0; i < 9; i++)
        no_poison(names[i], outs[i]);
    tu_rng r = tu_rng_make(cfg->seed ^ 0xfdull);
    for (int rep = 0; rep < 2; rep++) {
        fd_direction(&k, "dq", &a->q, &a->dq, &r);
        fd_direction(&k, "dk", &a->k, &a->dk, &r);
        fd_direction(&k, "dv", &a->v, &a->dv, &r);
        fd_direction(&k, "dbeta", &a->gate.beta, &a->dbeta, &r);
        if (cfg->raw)
            fd_direction(&k, "da", &a->gate.a, &a->da, &r);
        else if (!cfg->extreme) /* g = 0 and -1e4 are kinks of nothing, but a step past 0 leaves the contract */
            fd_direction(&k, "dg", &a->gate.g, &a->dg, &r);
        if (cfg->h0)
            fd_direction(&k, "dh0", &a->initial_state, &a->dh0, &r);
    }
    if (cfg->extreme) {
        /* dg element by element where g is finite and not at the boundary 0 (one-sided there). */
        double *g = (double *)a->gate.g.data;
        for (int64_t i = 0; i < cs.ng; i += 7) {
            const double g0 = g[i], step = g0 == 0.0 ? -1e-5 : 1e-5;
            g[i] = g0 + step;
            double lp = loss(&k);
            g[i] = g0 - step;
            double lm = loss(&k);
            g[i] = g0;
            double fd = (lp - lm) / (2.0 * step), dg = tu_get(a->dg.data, a->dg.dtype, (size_t)i);
            tu_expect(fabs(fd - dg) <= 1e-6 * fmax(1.0, fabs(fd)), "dg[%lld] (g = %g): fd %.10e, gradient %.10e",
                      (long long)i, g0, fd, dg);
            if (g0 == -1e4)
                tu_expect(dg == 0.0, "dg[%lld] at g = -1e4 is %g, expected 0", (long long)i, dg);
        }
    }
    if (cfg->raw) {
        fd_elements_f32(&k, "dA_log", &a->gate.A_log, &a->dA_log);
        if (cfg->dt_bias)
            fd_elements_f32(&k, "ddt_bias", &a->gate.dt_bias, &a->ddt_bias);
    }
    call_free(&k);
    case_free(&cs);
}

static bw_cfg base(int64_t B, int64_t T, int64_t H, int64_t HV, uint64_t seed)
{
    bw_cfg c;
    memset(&c, 0, sizeof c);
    c.B = B;
    c.T = T;
    c.H = H;
    c.HV = HV;
    c.K = 64;
    c.V = 64;
    c.seed = seed;
    return c;
}

static int test_fd_plain(void)
{
    int64_t Ts[] = {1, 63, 64, 70};
    for (int i = 0; i < 4; i++) {
        bw_cfg c = base(2, Ts[i], 1, 1, 100 + (uint64_t)i);
        check_fd(&c);
    }
    return TU_PASS;
}

static int test_fd_l2norm_gva_states(void)
{
    for (int layout = 0; layout < 2; layout++) {
        bw_cfg c = base(2, 70, 2, 4, 200 + (uint64_t)layout);
        c.l2norm = 1;
        c.h0 = 1;
        c.dht = 1;
        c.layout = layout ? GDN_STATE_VK : GDN_STATE_KV;
        check_fd(&c);
    }
    bw_cfg c = base(1, 65, 1, 2, 210); /* dht without an initial state */
    c.dht = 1;
    c.l2norm = 1;
    check_fd(&c);
    return TU_PASS;
}

static int test_fd_in_kernel_gate(void)
{
    for (int v = 0; v < 3; v++) {
        bw_cfg c = base(1, 70, 1, 2, 300 + (uint64_t)v);
        c.raw = 1;
        c.dt_bias = v != 1;
        c.logits = 1;
        c.neg_eig = v == 2;
        c.l2norm = v == 2;
        c.h0 = v != 0;
        c.layout = v == 2 ? GDN_STATE_VK : GDN_STATE_KV;
        check_fd(&c);
    }
    bw_cfg sp = base(1, 30, 1, 2, 305); /* softplus options: a + dt_bias on both branches */
    sp.raw = 1;
    sp.dt_bias = 1;
    sp.softplus_beta = 2.0f;
    sp.softplus_threshold = 0.5f;
    check_fd(&sp);
    bw_cfg c = base(1, 40, 1, 1, 310); /* logits with a precomputed g */
    c.logits = 1;
    c.neg_eig = 1;
    check_fd(&c);
    return TU_PASS;
}

static int test_fd_varlen(void)
{
    bw_cfg c = base(1, 0, 1, 2, 400);
    c.nseq = 5;
    int32_t lens[5] = {5, 0, 66, 1, 0};
    memcpy(c.seqlens, lens, sizeof lens);
    c.h0 = 1;
    c.dht = 1;
    c.l2norm = 1;
    check_fd(&c);
    c.raw = 1;
    c.dt_bias = 1;
    c.logits = 1;
    c.seed = 401;
    c.layout = GDN_STATE_VK;
    check_fd(&c);
    return TU_PASS;
}

static int test_fd_extreme_gates(void)
{
    bw_cfg c = base(1, 70, 1, 2, 500);
    c.extreme = 1;
    c.h0 = 1;
    c.dht = 1;
    check_fd(&c);
    return TU_PASS;
}

/* Empty sequences: dh0 = dht (or zero); nothing else to write. */
static int test_empty_sequences(void)
{
    bw_cfg cfg = base(1, 0, 1, 2, 600);
    cfg.nseq = 3;
    cfg.h0 = 1;
    cfg.dht = 1;
    bw_case cs;
    case_init(&cs, &cfg);
    bw_call k;
    call_init(&k, &cs, GDN_DTYPE_F32, GDN_DTYPE_F32, GDN_DTYPE_F32);
    gdn_status st = run_bwd(&k);
    tu_expect(st == GDN_OK, "gdn_chunk_bwd: %s", gdn_last_error());
    tu_check("dh0 = dht", tu_compare(k.a.dh0.data, GDN_DTYPE_F32, cs.dht, GDN_DTYPE_F64, (size_t)cs.ns), 1e-7);
    call_free(&k);
    case_free(&cs);
    return TU_PASS;
}

/* The backend's gradients in dtype dt against the float64 oracle on the same rounded inputs; cuda:
 * 1 the call runs on the GPU, 2 there from the states that the GPU forward saved. */
static void check_grads(const bw_cfg *cfg, gdn_dtype dt, gdn_dtype state_dt, double tol, double tol_gate, int cuda)
{
    bw_case cs;
    case_init(&cs, cfg);
    /* Round the inputs to dt so that both runs see the same values. */
    double *arrs[] = {cs.q, cs.k, cs.v, cs.gate, cs.beta, cs.d_o};
    int64_t lens[] = {cs.nqk, cs.nqk, cs.nv, cs.ng, cs.ng, cs.nv};
    for (int i = 0; i < 6; i++)
        for (int64_t j = 0; j < lens[i]; j++)
            arrs[i][j] = tu_round(i == 3 && !cfg->raw ? GDN_DTYPE_F32 : dt, (float)arrs[i][j]);
    double *sts[] = {cs.h0, cs.dht};
    for (int i = 0; i < 2; i++)
        if (sts[i])
            for (int64_t j = 0; j < cs.ns; j++)
                sts[i][j] = tu_round(state_dt, (float)sts[i][j]);
    bw_call ref, k;
    call_init(&ref, &cs, GDN_DTYPE_F64, GDN_DTYPE_F64, GDN_DTYPE_F64);
    call_init(&k, &cs, dt, state_dt, dt);
    gdn_status s1 = run_bwd(&ref), s2 = cuda ? run_bwd_cuda_mode(&k, 0, cuda == 2) : run_bwd(&k);
    if (tu_expect(s1 == GDN_OK && s2 == GDN_OK, "gdn_chunk_bwd: %s", gdn_last_error())) {
        const gdn_tensor *o[] = {&k.a.dq, &k.a.dk, &k.a.dv, &k.a.dg, &k.a.da, &k.a.dA_log, &k.a.ddt_bias,
                                 &k.a.dbeta, &k.a.dh0};
        const gdn_tensor *r[] = {&ref.a.dq, &ref.a.dk, &ref.a.dv, &ref.a.dg, &ref.a.da, &ref.a.dA_log,
                                 &ref.a.ddt_bias, &ref.a.dbeta, &ref.a.dh0};
        const char *names[] = {"dq", "dk", "dv", "dg", "da", "dA_log", "ddt_bias", "dbeta", "dh0"};
        for (int i = 0; i < 9; i++) {
            if (!o[i]->data)
                continue;
            char what[64];
            snprintf(what, sizeof what, "%s%s (%s)", cuda == 2 ? "cuda saved " : cuda ? "cuda " : "", names[i],
                     dt == GDN_DTYPE_BF16 ? "bf16" : dt == GDN_DTYPE_F16 ? "f16" : "f32");
            const int gate_grad = i >= 3 && i <= 6;
            no_poison(what, o[i]);
            const tu_err e = tu_compare(o[i]->data, o[i]->dtype, r[i]->data, r[i]->dtype, tu_numel(o[i]));
            if (cuda) /* the record of each bar's margin */
                printf("    %-20s rel %.2e\n", what, e.rel);
            tu_check(what, e, gate_grad ? tol_gate : tol);
        }
    }
    call_free(&ref);
    call_free(&k);
    case_free(&cs);
}

static int test_dtypes(void)
{
    for (int v = 0; v < 2; v++) {
        bw_cfg c = base(1, 150, 2, 4, 700 + (uint64_t)v);
        c.l2norm = 1;
        c.h0 = 1;
        c.dht = 1;
        c.raw = v;
        c.dt_bias = v;
        c.logits = v;
        c.layout = v ? GDN_STATE_VK : GDN_STATE_KV;
        check_grads(&c, GDN_DTYPE_F32, GDN_DTYPE_F32, 1e-5, 1e-5, 0);
        check_grads(&c, GDN_DTYPE_BF16, GDN_DTYPE_F32, 5e-3, 1e-2, 0);
        check_grads(&c, GDN_DTYPE_BF16, GDN_DTYPE_BF16, 5e-3, 1e-2, 0);
    }
    bw_cfg c = base(1, 130, 1, 2, 710); /* extreme gates: g = -1e4 and 0 among the draws */
    c.extreme = 1;
    c.h0 = 1;
    c.dht = 1;
    c.l2norm = 1;
    check_grads(&c, GDN_DTYPE_F32, GDN_DTYPE_F32, 1e-5, 1e-5, 0);
    check_grads(&c, GDN_DTYPE_BF16, GDN_DTYPE_F32, 5e-3, 1e-2, 0);
    return TU_PASS;
}

/* Every gradient of two calls on the same inputs has the same bits. */
static void expect_same_grads(const bw_call *x, const bw_call *y, const char *between)
{
    const gdn_tensor *a[] = {&x->a.dq, &x->a.dk, &x->a.dv, &x->a.dg, &x->a.da, &x->a.dA_log, &x->a.ddt_bias,
                             &x->a.dbeta, &x->a.dh0};
    const gdn_tensor *b[] = {&y->a.dq, &y->a.dk, &y->a.dv, &y->a.dg, &y->a.da, &y->a.dA_log, &y->a.ddt_bias,
                             &y->a.dbeta, &y->a.dh0};
    for (int i = 0; i < 9; i++)
        if (a[i]->data) /* absent where its input is */
            tu_expect(tu_same_bytes(a[i]->data, b[i]->data, tu_numel(a[i]) * gdn_dtype_size(a[i]->dtype)),
                      "output %d differs between %s", i, between);
}

static int need_gpu(void)
{
    const char *why = tu_cuda_unavailable();
    if (!why)
        return 1;
    tu_skip_reason("%s", why);
    return 0;
}

/* Both CUDA modes, recomputed and saved states, within the bars. */
static void check_grads_cuda(const bw_cfg *cfg, gdn_dtype dt, gdn_dtype state_dt)
{
    for (int mode = 1; mode <= 2; mode++)
        check_grads(cfg, dt, state_dt, 5e-3, 1e-2, mode);
}

/* The CUDA backward against the float64 oracle: head dims, GVA (2x, 3x), L2 norm, both state dtypes
 * and layouts, dht, precomputed and in-kernel gates with beta logits, varlen with empty and short
 * sequences, extreme gates, f16. The bars are the issue's: 5e-3 for dq, dk, dv, dbeta, dh0; 1e-2 for
 * the gate gradients. */
static int test_cuda_grads(void)
{
    if (!need_gpu())
        return TU_SKIP;
    const int64_t dims[4][2] = {{64, 64}, {128, 128}, {64, 128}, {128, 64}};
    for (int d = 0; d < 4; d++) {
        /* GVA 2x for the first two, none for the others */
        bw_cfg c = base(2, 150, d < 2 ? 2 : 4, 4, 900 + (uint64_t)d);
        c.K = dims[d][0];
        c.V = dims[d][1];
        c.l2norm = 1;
        c.h0 = 1;
        c.dht = 1;
        check_grads_cuda(&c, GDN_DTYPE_BF16, GDN_DTYPE_F32);
    }
    {
        bw_cfg c = base(1, 200, 1, 3, 910); /* in-kernel gate, logits, V-first bf16 states, HV = 3H */
        c.K = c.V = 128;
        c.l2norm = 1;
        c.raw = 1;
        c.dt_bias = 1;
        c.logits = 1;
        c.neg_eig = 1;
        c.h0 = 1;
        c.dht = 1;
        c.layout = GDN_STATE_VK;
        check_grads_cuda(&c, GDN_DTYPE_BF16, GDN_DTYPE_BF16);
    }
    {
        bw_cfg c = base(1, 0, 2, 2, 920); /* varlen: empty, one token, chunk edges */
        c.K = c.V = 128;
        c.nseq = 6;
        int32_t lens[6] = {100, 0, 1, 64, 129, 7};
        memcpy(c.seqlens, lens, sizeof lens);
        c.l2norm = 1;
        c.h0 = 1;
        c.dht = 1;
        c.raw = 1;
        check_grads_cuda(&c, GDN_DTYPE_BF16, GDN_DTYPE_F32);
    }
    {
        bw_cfg c = base(1, 300, 1, 2, 930); /* extreme gates: g = -1e4 and 0 among the draws */
        c.K = c.V = 128;
        c.extreme = 1;
        c.h0 = 1;
        c.dht = 1;
        c.l2norm = 1;
        check_grads_cuda(&c, GDN_DTYPE_BF16, GDN_DTYPE_F32);
    }
    for (int d = 0; d < 2; d++) {
        /* Many (sequence, value head) chains of uneven lengths side by side (several chain
         * CTAs per SM), GVA 4x and 3x, K = V = 128 and 64. */
        bw_cfg c = base(1, 0, d ? 3 : 2, d ? 9 : 8, 945 + (uint64_t)d);
        c.K = c.V = d ? 64 : 128;
        c.nseq = 4;
        int32_t lens[4] = {130, 64, 1, 200};
        memcpy(c.seqlens, lens, sizeof lens);
        c.l2norm = 1;
        c.h0 = 1;
        c.dht = 1;
        check_grads_cuda(&c, GDN_DTYPE_BF16, GDN_DTYPE_F32);
    }
    {
        /* Many (sequence, value head) chains, more CTAs of the chains than one wave when the
         * forward runs without context parallelism; bf16 states. */
        bw_cfg c = base(9, 70, 2, 4, 947);
        c.K = c.V = 128;
        c.l2norm = 1;
        c.h0 = 1;
        c.dht = 1;
        check_grads_cuda(&c, GDN_DTYPE_BF16, GDN_DTYPE_BF16);
    }
    for (int d = 0; d < 2; d++) {
        /* Long sequences of few (sequence, value head) pairs: the reverse chain runs context
         * parallel (plan_cp: on a GPU of 32 SMs or more, 7 or 8 segments of 5 or 4 chunks), dht
         * entering the last segment, dh0 leaving the first; K = V = 128 with GVA, and K = V = 64
         * with the in-kernel gate, beta logits and bf16 V-first states. */
        bw_cfg c = base(d ? 2 : 1, d ? 2000 : 2100, 1, d ? 1 : 2, 960 + (uint64_t)d);
        c.K = c.V = d ? 64 : 128;
        c.l2norm = 1;
        c.h0 = 1;
        c.dht = 1;
        c.raw = d;
        c.logits = d;
        c.layout = d ? GDN_STATE_VK : GDN_STATE_KV;
        check_grads_cuda(&c, GDN_DTYPE_BF16, d ? GDN_DTYPE_BF16 : GDN_DTYPE_F32);
    }
    {
        bw_cfg c = base(2, 130, 1, 1, 940); /* f16, no l2 norm (unit keys), no states */
        c.K = c.V = 64;
        check_grads_cuda(&c, GDN_DTYPE_F16, GDN_DTYPE_F32);
    }
    return TU_PASS;
}

/* The same CUDA call twice gives the same bits, the second captured in a CUDA graph and replayed;
 * a call without saved states gives the bits of one reading them (it runs the same forward). */
static int test_cuda_deterministic(void)
{
    if (!need_gpu())
        return TU_SKIP;
    bw_cfg c = base(1, 0, 2, 4, 950);
    c.K = c.V = 128;
    c.nseq = 3;
    int32_t lens[3] = {300, 7, 130};
    memcpy(c.seqlens, lens, sizeof lens);
    c.raw = 1;
    c.dt_bias = 1;
    c.h0 = 1;
    c.l2norm = 1;
    bw_case cs;
    case_init(&cs, &c);
    bw_call k1, k2;
    call_init(&k1, &cs, GDN_DTYPE_BF16, GDN_DTYPE_F32, GDN_DTYPE_BF16);
    call_init(&k2, &cs, GDN_DTYPE_BF16, GDN_DTYPE_F32, GDN_DTYPE_BF16);
    tu_expect(run_bwd_cuda(&k1) == GDN_OK && run_bwd_cuda_mode(&k2, 1, 0) == GDN_OK, "gdn_chunk_bwd: %s",
              gdn_last_error());
    expect_same_grads(&k1, &k2, "an eager and a graph-replayed CUDA call");
    bw_call k3, k4;
    call_init(&k3, &cs, GDN_DTYPE_BF16, GDN_DTYPE_F32, GDN_DTYPE_BF16);
    call_init(&k4, &cs, GDN_DTYPE_BF16, GDN_DTYPE_F32, GDN_DTYPE_BF16);
    tu_expect(run_bwd_cuda_mode(&k3, 0, 1) == GDN_OK && run_bwd_cuda_mode(&k4, 1, 1) == GDN_OK, "gdn_chunk_bwd: %s",
              gdn_last_error());
    expect_same_grads(&k3, &k4, "an eager and a graph-replayed CUDA call from saved states");
    expect_same_grads(&k1, &k3, "a CUDA call recomputing the states and one reading the saved ones");
    call_free(&k1);
    call_free(&k2);
    call_free(&k3);
    call_free(&k4);
    case_free(&cs);
    return TU_PASS;
}

/* q, k, v read from one fused [B, T, 2 H K + HV V + pad] projection, and dq, dk, dv written with
 * that projection's strides (each into a buffer of its own: outputs must not share an address
 * range), give the bits of the contiguous call. f32 on the CPU; bf16 on CUDA (cuda), where pad 0
 * keeps every row 16-byte aligned (the copy fast path) and pad 1 misaligns them (element-wise loads
 * and stores). HV = 2 (GVA: dq and dk sum two value heads) or 1. */
static void check_strided(gdn_dtype dt, int cuda, int pad, int64_t HV, uint64_t seed)
{
    bw_cfg c = base(2, 70, 1, HV, seed);
    c.l2norm = 1;
    c.raw = 1;
    c.logits = 1;
    c.h0 = 1;
    bw_case cs;
    case_init(&cs, &c);
    bw_call k;
    call_init(&k, &cs, dt, GDN_DTYPE_F32, dt);
    gdn_status (*run)(bw_call *) = cuda ? run_bwd_cuda : run_bwd;
    tu_expect(run(&k) == GDN_OK, "contiguous: %s", gdn_last_error());
    const size_t e = gdn_dtype_size(dt);
    const int64_t HK = c.H * c.K, HVV = c.HV * c.V, W = 2 * HK + HVV + pad, rows = c.B * c.T;
    unsigned char *in = tu_alloc((size_t)(rows * W) * e), *out[3];
    for (int i = 0; i < 3; i++) {
        out[i] = tu_alloc((size_t)(rows * W) * e);
        tu_poison(out[i], dt, (size_t)(rows * W));
    }
    for (int64_t r = 0; r < rows; r++) {
        memcpy(in + (r * W) * e, (unsigned char *)k.a.q.data + (r * HK) * e, (size_t)HK * e);
        memcpy(in + (r * W + HK) * e, (unsigned char *)k.a.k.data + (r * HK) * e, (size_t)HK * e);
        memcpy(in + (r * W + 2 * HK) * e, (unsigned char *)k.a.v.data + (r * HVV) * e, (size_t)HVV * e);
    }
    bw_call f = k;
    f.ws = NULL; /* run_bwd frees and replaces the call's workspace: f gets its own */
    int64_t sqk[4] = {c.B, c.T, c.H, c.K}, sv[4] = {c.B, c.T, c.HV, c.V};
    int64_t st_qk[4] = {c.T * W, W, c.K, 1}, st_v[4] = {c.T * W, W, c.V, 1};
    f.a.q = tu_tensor_strided(in, dt, 4, sqk, st_qk);
    f.a.k = tu_tensor_strided(in + HK * e, dt, 4, sqk, st_qk);
    f.a.v = tu_tensor_strided(in + 2 * HK * e, dt, 4, sv, st_v);
    f.a.dq = tu_tensor_strided(out[0], dt, 4, sqk, st_qk);
    f.a.dk = tu_tensor_strided(out[1] + HK * e, dt, 4, sqk, st_qk);
    f.a.dv = tu_tensor_strided(out[2] + 2 * HK * e, dt, 4, sv, st_v);
    f.a.da = out_like(k.a.da);
    f.a.dA_log = out_like(k.a.dA_log);
    f.a.dbeta = out_like(k.a.dbeta);
    f.a.dh0 = out_like(k.a.dh0);
    tu_expect(run(&f) == GDN_OK, "strided: %s", gdn_last_error());
    int same = 1;
    for (int64_t r = 0; r < rows; r++) {
        same &= tu_same_bytes(out[0] + (r * W) * e, (unsigned char *)k.a.dq.data + (r * HK) * e, (size_t)HK * e);
        same &= tu_same_bytes(out[1] + (r * W + HK) * e, (unsigned char *)k.a.dk.data + (r * HK) * e, (size_t)HK * e);
        same &= tu_same_bytes(out[2] + (r * W + 2 * HK) * e, (unsigned char *)k.a.dv.data + (r * HVV) * e,
                              (size_t)HVV * e);
    }
    tu_expect(same, "pad %d: strided dq / dk / dv differ from the contiguous call", pad);
    tu_expect(tu_same_bytes(f.a.da.data, k.a.da.data, (size_t)cs.ng * e) &&
                  tu_same_bytes(f.a.dbeta.data, k.a.dbeta.data, (size_t)cs.ng * e) &&
                  tu_same_bytes(f.a.dh0.data, k.a.dh0.data, (size_t)cs.ns * sizeof(float)),
              "pad %d: strided da / dbeta / dh0 differ", pad);
    free(f.a.da.data);
    free(f.a.dA_log.data);
    free(f.a.dbeta.data);
    free(f.a.dh0.data);
    free(f.ws);
    free(in);
    for (int i = 0; i < 3; i++)
        free(out[i]);
    call_free(&k);
    case_free(&cs);
}

static int test_strided(void)
{
    check_strided(GDN_DTYPE_F32, 0, 0, 2, 850);
    return TU_PASS;
}

static int test_cuda_strided(void)
{
    if (!need_gpu())
        return TU_SKIP;
    for (int hv = 1; hv <= 2; hv++) {
        check_strided(GDN_DTYPE_BF16, 1, 0, hv, 970 + 2 * (uint64_t)hv);
        check_strided(GDN_DTYPE_BF16, 1, 1, hv, 971 + 2 * (uint64_t)hv);
    }
    return TU_PASS;
}

/* Outside the CUDA backward's limits: a clear GDN_ERR_UNSUPPORTED, outputs untouched. */
static int test_cuda_limits(void)
{
    if (!need_gpu())
        return TU_SKIP;
    bw_cfg c = base(1, 70, 1, 1, 960);
    bw_case cs;
    case_init(&cs, &c);
    bw_call k;
    call_init(&k, &cs, GDN_DTYPE_F32, GDN_DTYPE_F32, GDN_DTYPE_F32);
    gdn_status st = run_bwd_cuda(&k);
    tu_expect(st == GDN_ERR_UNSUPPORTED && strstr(gdn_last_error(), "bf16 or f16"), "f32 inputs: %s (%s)",
              gdn_status_string(st), gdn_last_error());
    tu_expect(tu_count_poison(k.a.dq.data, k.a.dq.dtype, tu_numel(&k.a.dq)) == tu_numel(&k.a.dq),
              "dq written by a refused call");
    call_free(&k);
    /* saved_states shorter than the query's size: refused before any work. */
    call_init(&k, &cs, GDN_DTYPE_BF16, GDN_DTYPE_F32, GDN_DTYPE_BF16);
    st = run_bwd_cuda_mode(&k, 0, 2);
    tu_expect(st == GDN_ERR_INVALID_ARGUMENT && strstr(gdn_last_error(), "saved_states"), "short saved_states: %s (%s)",
              gdn_status_string(st), gdn_last_error());
    tu_expect(tu_count_poison(k.a.dq.data, k.a.dq.dtype, tu_numel(&k.a.dq)) == tu_numel(&k.a.dq),
              "dq written by a refused call");
    call_free(&k);
    case_free(&cs);
    return TU_PASS;
}

/* The same call twice gives the same bits, whatever the thread count. */
static int test_deterministic(void)
{
    bw_cfg c = base(1, 0, 2, 4, 800);
    c.nseq = 3;
    int32_t lens[3] = {100, 7, 130};
    memcpy(c.seqlens, lens, sizeof lens);
    c.raw = 1;
    c.dt_bias = 1;
    c.h0 = 1;
    bw_case cs;
    case_init(&cs, &c);
    bw_call k1, k2;
    call_init(&k1, &cs, GDN_DTYPE_F32, GDN_DTYPE_F32, GDN_DTYPE_F32);
    call_init(&k2, &cs, GDN_DTYPE_F32, GDN_DTYPE_F32, GDN_DTYPE_F32);
    int threads = gdn_get_num_threads();
    gdn_set_num_threads(1);
    tu_expect(run_bwd(&k1) == GDN_OK, "1 thread: %s", gdn_last_error());
    gdn_set_num_threads(4);
    tu_expect(run_bwd(&k2) == GDN_OK, "4 threads: %s", gdn_last_error());
    gdn_set_num_threads(threads);
    expect_same_grads(&k1, &k2, "1 and 4 threads");
    call_free(&k1);
    call_free(&k2);
    case_free(&cs);
    return TU_PASS;
}

/* The CPU backend saves no states: the size query gives 0, a buffer given to the forward stays as
 * it was and the backward's bits do not depend on one. A state pool with saved states is refused
 * on every backend (the backward takes no pool). */
static int test_saved_states_cpu(void)
{
    bw_cfg c = base(1, 70, 1, 2, 990);
    c.h0 = 1;
    bw_case cs;
    case_init(&cs, &c);
    bw_call k1, k2;
    call_init(&k1, &cs, GDN_DTYPE_F32, GDN_DTYPE_F32, GDN_DTYPE_F32);
    call_init(&k2, &cs, GDN_DTYPE_F32, GDN_DTYPE_F32, GDN_DTYPE_F32);
    gdn_chunk_fwd_args f = fwd_of(&k1.a);
    f.o = k1.o;
    size_t sb = 1;
    tu_expect(gdn_chunk_saved_states_size(&f, &sb) == GDN_OK && sb == 0, "CPU saved states: %zu bytes (%s)", sb,
              gdn_last_error());
    unsigned char buf[256], want[256];
    memset(buf, 0xab, sizeof buf);
    memcpy(want, buf, sizeof buf);
    f.saved_states = buf;
    f.saved_states_bytes = sizeof buf;
    tu_expect(tu_chunk_fwd(&f) == GDN_OK, "forward with saved_states: %s", gdn_last_error());
    tu_expect(tu_same_bytes(buf, want, sizeof buf), "the CPU forward wrote to saved_states");
    k2.a.saved_states = buf;
    k2.a.saved_states_bytes = sizeof buf;
    tu_expect(run_bwd(&k1) == GDN_OK && run_bwd(&k2) == GDN_OK, "gdn_chunk_bwd: %s", gdn_last_error());
    expect_same_grads(&k1, &k2, "CPU calls with and without saved_states");

    int32_t slot = 0;
    int64_t one[1] = {1};
    f.state_indices = tu_tensor(&slot, GDN_DTYPE_I32, 1, one);
    const gdn_status st = gdn_chunk_fwd(&f);
    tu_expect(st == GDN_ERR_INVALID_ARGUMENT && strstr(gdn_last_error(), "saved_states"),
              "a state pool with saved_states: %s (%s)", gdn_status_string(st), gdn_last_error());
    call_free(&k1);
    call_free(&k2);
    case_free(&cs);
    return TU_PASS;
}

static void expect_error(const gdn_chunk_bwd_args *k, gdn_status st, gdn_status want, const char *needle,
                         const char *label)
{
    const char *msg = gdn_last_error();
    tu_expect(st == want && strstr(msg, needle) != NULL, "%s: got %s \"%s\", expected %s mentioning \"%s\"", label,
              gdn_status_string(st), msg, gdn_status_string(want), needle);
    const gdn_tensor *outs[] = {&k->dq, &k->dk, &k->dv, &k->dg, &k->da, &k->dbeta, &k->dh0};
    for (int i = 0; i < 7; i++)
        if (outs[i]->data)
            tu_expect(tu_count_poison(outs[i]->data, outs[i]->dtype, tu_numel(outs[i])) == tu_numel(outs[i]),
                      "%s: an output was written", label);
}

static int test_validation(void)
{
    bw_cfg c = base(1, 20, 1, 2, 900);
    c.h0 = 1;
    c.dht = 1;
    bw_case cs;
    case_init(&cs, &c);
    bw_call k;
    call_init(&k, &cs, GDN_DTYPE_F32, GDN_DTYPE_F32, GDN_DTYPE_F32);
    size_t bytes = 0;
    tu_expect(gdn_chunk_bwd_workspace_size(&k.a, &bytes) == GDN_OK && bytes > 0, "query: %s", gdn_last_error());

    gdn_chunk_bwd_args saved = k.a;
    expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_WORKSPACE, "workspace", "no workspace");
    k.ws = aligned_alloc(256, (bytes + 511) / 256 * 256);
    k.a.workspace = k.ws;
    k.a.workspace_bytes = 100;
    expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_WORKSPACE, "workspace", "small workspace");
    saved.workspace = k.ws;
    saved.workspace_bytes = bytes;

    k.a = saved;
    k.a.dq.shape[3] = 32;
    expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_INVALID_ARGUMENT, "dq", "dq shape");
    k.a = saved;
    k.a.dv.dtype = GDN_DTYPE_BF16;
    expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_INVALID_ARGUMENT, "dv", "dv dtype");
    k.a = saved;
    k.a.dq = k.a.q;
    expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_INVALID_ARGUMENT, "dq overlaps the input q", "dq aliases q");
    k.a = saved;
    k.a.dk = k.a.dq;
    expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_INVALID_ARGUMENT, "overlap", "dk aliases dq");
    k.a = saved;
    k.a.dh0 = k.a.initial_state;
    expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_INVALID_ARGUMENT, "dh0 overlaps", "dh0 aliases initial_state");
    k.a = saved;
    memset(&k.a.dh0, 0, sizeof k.a.dh0);
    expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_INVALID_ARGUMENT, "dh0 is required", "dh0 missing");
    k.a = saved;
    memset(&k.a.dg, 0, sizeof k.a.dg);
    expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_INVALID_ARGUMENT, "dg is required", "dg missing");
    k.a = saved;
    k.a.da = k.a.dg;
    memset(&k.a.dg, 0, sizeof k.a.dg);
    expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_INVALID_ARGUMENT, "dg is required", "da instead of dg");
    k.a = saved;
    memset(&k.a.d_o, 0, sizeof k.a.d_o);
    expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_INVALID_ARGUMENT, "d_o", "d_o missing");
    k.a = saved;
    k.a.dht.dtype = GDN_DTYPE_BF16;
    expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_INVALID_ARGUMENT, "dht", "dht dtype differs");
    k.a = saved;
    k.a.gate.kind = GDN_GATE_KDA;
    int64_t kda_shape[4] = {c.B, c.T, c.HV, c.K};
    float *kda_g = tu_alloc_elems(GDN_DTYPE_F32, (size_t)(c.B * c.T * c.HV * c.K));
    k.a.gate.g = tu_tensor(kda_g, GDN_DTYPE_F32, 4, kda_shape);
    expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_UNSUPPORTED, "GDN gates only", "KDA gate");
    free(kda_g);
    k.a = saved;
    k.a.workspace = (char *)k.ws + 64;
    expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_INVALID_ARGUMENT, "256-byte", "misaligned workspace");
    k.a = saved;
    tu_expect(gdn_chunk_bwd(NULL) == GDN_ERR_INVALID_ARGUMENT, "NULL args accepted");
    tu_expect(gdn_chunk_bwd_workspace_size(&k.a, NULL) == GDN_ERR_INVALID_ARGUMENT, "NULL bytes accepted");
    /* Every tensor described as CUDA-resident (no device memory is touched: the CUDA entry refuses
     * before any work): the build without CUDA says so, the CUDA build refuses these f32 inputs. */
    gdn_tensor *all[] = {&k.a.q, &k.a.k, &k.a.v, &k.a.gate.g, &k.a.gate.beta, &k.a.initial_state, &k.a.d_o,
                         &k.a.dht, &k.a.dq, &k.a.dk, &k.a.dv, &k.a.dg, &k.a.dbeta, &k.a.dh0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        all[i]->device = GDN_DEVICE_CUDA;
    if (gdn_has_cuda())
        expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_UNSUPPORTED, "bf16 or f16", "CUDA tensors");
    else
        expect_error(&saved, gdn_chunk_bwd(&k.a), GDN_ERR_NO_BACKEND, "without the CUDA backend", "CUDA tensors");
    k.a = saved;
    tu_expect(gdn_chunk_bwd(&k.a) == GDN_OK, "the valid call: %s", gdn_last_error());
    /* The call runs on one thread when the workspace covers only that. */
    k.a.workspace_bytes = bytes / 2;
    gdn_status st = gdn_chunk_bwd(&k.a);
    tu_expect(st == GDN_OK || st == GDN_ERR_WORKSPACE, "half the workspace: %s", gdn_last_error());
    call_free(&k);
    case_free(&cs);
    return TU_PASS;
}

int main(int argc, char **argv)
{
    static const tu_test tests[] = {
        {"fd_plain", test_fd_plain},
        {"fd_l2norm_gva_states", test_fd_l2norm_gva_states},
        {"fd_in_kernel_gate", test_fd_in_kernel_gate},
        {"fd_varlen", test_fd_varlen},
        {"fd_extreme_gates", test_fd_extreme_gates},
        {"empty_sequences", test_empty_sequences},
        {"dtypes", test_dtypes},
        {"deterministic", test_deterministic},
        {"strided", test_strided},
        {"validation", test_validation},
        {"saved_states_cpu", test_saved_states_cpu},
        {"cuda_grads", test_cuda_grads},
        {"cuda_deterministic", test_cuda_deterministic},
        {"cuda_strided", test_cuda_strided},
        {"cuda_limits", test_cuda_limits},
    };
    return tu_main(tests, TU_COUNT(tests), argc, argv);
}
