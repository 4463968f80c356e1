/*
 * cpu_bench.c - libgdn's CPU backend at the shapes of ggml's GATED_DELTA_NET perf cases
 * (tests/test-backend-ops.cpp of ggml), for bench/cpu_vs_ggml.sh.
 *
 * Cases (f32, H = HV, K = V = head size, q / k l2-normalised in-kernel as ggml's graph does,
 * g drawn like ggml's, uniform in [-20, -1e-4], beta in [0, 1]):
 *   decode   gdn_recurrent_fwd, B = 1, T = 1, state updated in place through a one-slot pool
 *            (1-D state_indices), in KV and VK layout;
 *   prefill  gdn_chunk_fwd, one sequence of T tokens with initial and final state (KV layout).
 * Each case is checked against the float64 path (f64 tensors, the reference) before timing: at
 * most 128 tokens, relative RMS of o and the state <= 1e-5. A sample is the mean time per call
 * over calls filling at least --min-time seconds, after warm-up; --samples samples per case.
 *
 * Output, one line per case and sample:  case=<name> us=<microseconds per call>
 * where name is h<H>_d<K>_t<T>_<gdn|kda>_<KV|VK>, the keys the script matches with ggml's.
 *
 * Build: cc -O2 -Iinclude bench/cpu_bench.c <build>/libgdn_static.a -lpthread -lm
 *   cpu_bench [--threads N] [--samples N] [--min-time S] [name-substring ...]
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gdn.h"

typedef struct bcase {
    int H, D, T, kda, prefill;
    gdn_state_layout layout;
} bcase;

static const bcase cases[] = {
    {32, 128, 1, 0, 0, GDN_STATE_KV},    {32, 128, 1, 0, 0, GDN_STATE_VK},    {16, 64, 1, 0, 0, GDN_STATE_KV},
    {16, 64, 1, 0, 0, GDN_STATE_VK},     {32, 128, 1, 1, 0, GDN_STATE_KV},    {32, 128, 1, 1, 0, GDN_STATE_VK},
    {32, 128, 64, 0, 1, GDN_STATE_KV},   {32, 128, 256, 0, 1, GDN_STATE_KV},  {32, 128, 512, 0, 1, GDN_STATE_KV},
    {32, 128, 1024, 0, 1, GDN_STATE_KV}, {4, 128, 1024, 0, 1, GDN_STATE_KV},  {32, 128, 64, 1, 1, GDN_STATE_KV},
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(double lo, double hi)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return lo + (hi - lo) * (double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

/* One problem's buffers in a dtype (f32 timed, f64 for the reference). */
typedef struct bufs {
    gdn_dtype dt;
    void *q, *k, *v, *g, *beta, *state, *o, *final;
    int32_t idx;
    void *ws; /* the calls' workspace, queried once per case and length (ws_case, ws_T) */
    size_t ws_bytes;
    const void *ws_case;
    int ws_T;
} bufs;

/* The workspace of the call for (c, T): queried on the first call, outside the timed loop's steady
 * state, and kept. */
static gdn_status workspace_for(bufs *b, const void *c, int T, gdn_status st, size_t bytes)
{
    if (st != GDN_OK)
        return st;
    b->ws_case = c;
    b->ws_T = T;
    if (bytes <= b->ws_bytes)
        return GDN_OK;
    free(b->ws);
    b->ws = aligned_alloc(256, (bytes + 255) / 256 * 256);
    b->ws_bytes = b->ws ? bytes : 0;
    return b->ws ? GDN_OK : GDN_ERR_OUT_OF_MEMORY;
}

static void *alloc_fill(gdn_dtype dt, size_t n, const double *src)
{
    size_t es = gdn_dtype_size(dt);
    void *p = malloc(n * es > 0 ? n * es : 1);
    if (!p) {
        fprintf(stderr, "cpu_bench: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        if (dt == GDN_DTYPE_F64)
            ((double *)p)[i] = src ? src[i] : 0.0;
        else
            ((float *)p)[i] = src ? (float)src[i] : 0.0f;
    }
    return p;
}

typedef struct host {
    size_t nqk, nv, ng, nb, ns;
    double *q, *k, *v, *g, *beta, *state; /* f32-representable values */
} host;

static double rep32(double x) { return (double)(float)x; }

static host make_host(const bcase *c, int T)
{
    host h;
    h.nqk = (size_t)T * c->H * c->D;
    h.nv = h.nqk;
    h.ng = (size_t)T * c->H * (c->kda ? c->D : 1);
    h.nb = (size_t)T * c->H;
    h.ns = (size_t)c->H * c->D * c->D;
    double **arrs[] = {&h.q, &h.k, &h.v, &h.g, &h.beta, &h.state};
    size_t ns[] = {h.nqk, h.nqk, h.nv, h.ng, h.nb, h.ns};
    for (int a = 0; a < 6; a++) {
        *arrs[a] = malloc(ns[a] * sizeof(double));
        for (size_t i = 0; i < ns[a]; i++) {
            double x = a == 2 ? uniform(-0.3, 5.0) : a == 3 ? uniform(-20.0, -1e-4) : a == 4 ? uniform(0, 1)
                                                                                             : uniform(-1, 1);
            (*arrs[a])[i] = rep32(a == 5 ? 0.1 * x : x);
        }
    }
    return h;
}

static void free_host(host *h)
{
    free(h->q), free(h->k), free(h->v), free(h->g), free(h->beta), free(h->state);
}

static bufs make_bufs(const host *h, gdn_dtype dt)
{
    bufs b;
    memset(&b, 0, sizeof b);
    b.dt = dt;
    b.q = alloc_fill(dt, h->nqk, h->q);
    b.k = alloc_fill(dt, h->nqk, h->k);
    b.v = alloc_fill(dt, h->nv, h->v);
    b.g = alloc_fill(dt, h->ng, h->g);
    b.beta = alloc_fill(dt, h->nb, h->beta);
    b.state = alloc_fill(dt, h->ns, h->state);
    b.o = alloc_fill(dt, h->nv, NULL);
    b.final = alloc_fill(dt, h->ns, NULL);
    b.idx = 0;
    return b;
}

static void free_bufs(bufs *b)
{
    free(b->q), free(b->k), free(b->v), free(b->g), free(b->beta), free(b->state), free(b->o), free(b->final);
    free(b->ws);
    b->ws = NULL, b->ws_bytes = 0, b->ws_case = NULL;
}

static gdn_status run(const bcase *c, int T, bufs *b)
{
    const int64_t H = c->H, D = c->D;
    gdn_tensor q = gdn_tensor_make(b->q, b->dt, GDN_DEVICE_CPU, 0, 4, (int64_t[]){1, T, H, D});
    gdn_tensor k = gdn_tensor_make(b->k, b->dt, GDN_DEVICE_CPU, 0, 4, (int64_t[]){1, T, H, D});
    gdn_tensor v = gdn_tensor_make(b->v, b->dt, GDN_DEVICE_CPU, 0, 4, (int64_t[]){1, T, H, D});
    gdn_tensor o = gdn_tensor_make(b->o, b->dt, GDN_DEVICE_CPU, 0, 4, (int64_t[]){1, T, H, D});
    gdn_gate_params gate;
    memset(&gate, 0, sizeof gate);
    gate.kind = c->kda ? GDN_GATE_KDA : GDN_GATE_GDN;
    gate.g = c->kda ? gdn_tensor_make(b->g, b->dt, GDN_DEVICE_CPU, 0, 4, (int64_t[]){1, T, H, D})
                    : gdn_tensor_make(b->g, b->dt, GDN_DEVICE_CPU, 0, 3, (int64_t[]){1, T, H});
    gate.beta = gdn_tensor_make(b->beta, b->dt, GDN_DEVICE_CPU, 0, 3, (int64_t[]){1, T, H});
    gdn_tensor st = gdn_tensor_make(b->state, b->dt, GDN_DEVICE_CPU, 0, 4, (int64_t[]){1, H, D, D});
    if (c->prefill) {
        gdn_chunk_fwd_args a;
        memset(&a, 0, sizeof a);
        a.q = q, a.k = k, a.v = v, a.o = o, a.gate = gate, a.use_qk_l2norm = 1, a.state_layout = c->layout;
        a.initial_state = st;
        a.final_state = gdn_tensor_make(b->final, b->dt, GDN_DEVICE_CPU, 0, 4, (int64_t[]){1, H, D, D});
        if (b->ws_case != c || b->ws_T != T) {
            size_t bytes = 0;
            gdn_status s = gdn_chunk_fwd_workspace_size(&a, &bytes);
            if ((s = workspace_for(b, c, T, s, bytes)) != GDN_OK)
                return s;
        }
        a.workspace = b->ws, a.workspace_bytes = b->ws_bytes;
        return gdn_chunk_fwd(&a);
    }
    gdn_recurrent_fwd_args a;
    memset(&a, 0, sizeof a);
    a.q = q, a.k = k, a.v = v, a.o = o, a.gate = gate, a.use_qk_l2norm = 1, a.state_layout = c->layout;
    a.state = st;
    a.state_indices = gdn_tensor_make(&b->idx, GDN_DTYPE_I32, GDN_DEVICE_CPU, 0, 1, (int64_t[]){1});
    a.inplace_state = 1;
    if (b->ws_case != c || b->ws_T != T) {
        size_t bytes = 0;
        gdn_status s = gdn_recurrent_fwd_workspace_size(&a, &bytes);
        if ((s = workspace_for(b, c, T, s, bytes)) != GDN_OK)
            return s;
    }
    a.workspace = b->ws, a.workspace_bytes = b->ws_bytes;
    return gdn_recurrent_fwd(&a);
}

static double rel_rms(const float *x, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The f32 path against the f64 one on the first min(T, 128) tokens. */
static int check(const bcase *c)
{
    const int T = c->T < 128 ? c->T : 128;
    host h = make_host(c, T);
    bufs b32 = make_bufs(&h, GDN_DTYPE_F32), b64 = make_bufs(&h, GDN_DTYPE_F64);
    int ok = run(c, T, &b32) == GDN_OK && run(c, T, &b64) == GDN_OK;
    if (ok) {
        double eo = rel_rms(b32.o, b64.o, h.nv);
        double es = c->prefill ? rel_rms(b32.final, b64.final, h.ns) : rel_rms(b32.state, b64.state, h.ns);
        ok = eo <= 1e-5 && es <= 1e-5;
        if (!ok)
            fprintf(stderr, "cpu_bench: check failed, o %.2e, state %.2e\n", eo, es);
    } else {
        fprintf(stderr, "cpu_bench: %s\n", gdn_last_error());
    }
    free_bufs(&b32), free_bufs(&b64), free_host(&h);
    return ok;
}

int main(int argc, char **argv)
{
    int threads = 2, samples = 1;
    double min_time = 0.5;
    const char *filters[16];
    int nfilters = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--samples") && i + 1 < argc)
            samples = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-time") && i + 1 < argc)
            min_time = atof(argv[++i]);
        else if (nfilters < 16)
            filters[nfilters++] = argv[i];
    }
    gdn_set_num_threads(threads);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const bcase *c = &cases[ci];
        char name[64];
        snprintf(name, sizeof name, "h%d_d%d_t%d_%s_%s", c->H, c->D, c->T, c->kda ? "kda" : "gdn",
                 c->layout == GDN_STATE_VK ? "VK" : "KV");
        int take = nfilters == 0;
        for (int f = 0; f < nfilters; f++)
            take |= strstr(name, filters[f]) != NULL;
        if (!take)
            continue;
        if (!check(c)) {
            printf("case=%s FAILED\n", name);
            return 1;
        }
        host h = make_host(c, c->T);
        bufs b = make_bufs(&h, GDN_DTYPE_F32);
        for (int s = 0; s < samples; s++) {
            int calls = 0;
            double t0 = now_s(), t1 = t0;
            for (int w = 0; w < 3; w++)
                run(c, c->T, &b);
            t0 = now_s();
            while ((t1 = now_s()) - t0 < min_time || calls < 3) {
                run(c, c->T, &b);
                calls++;
            }
            printf("case=%s us=%.2f\n", name, 1e6 * (t1 - t0) / calls);
            fflush(stdout);
        }
        free_bufs(&b), free_host(&h);
    }
    return 0;
}
