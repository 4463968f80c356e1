/*
 * api.c - the public entry points: version, status strings, the thread-local error, tensor
 * helpers, and for each op the host-side validation of every argument, its resolution into a
 * gdn_problem (src/problem.h) and the dispatch to the CPU or CUDA backend.
 *
 * Nothing here touches tensor data except index tensors that live on the host (cu_seqlens,
 * state_indices), whose values are checked; device-resident indices are never read here.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "gdn.h"
#include "problem.h"

/* ------------------------------------------------------------------------------------------ */
/* Version, status, errors                                                                     */

int gdn_version_number(void) { return GDN_VERSION_NUMBER; }

#define GDN_STR2(x) #x
#define GDN_STR(x) GDN_STR2(x)
const char *gdn_version_string(void)
{
    return GDN_STR(GDN_VERSION_MAJOR) "." GDN_STR(GDN_VERSION_MINOR) "." GDN_STR(GDN_VERSION_PATCH);
}

const char *gdn_status_string(gdn_status status)
{
    switch (status) {
    case GDN_OK: return "GDN_OK: success";
    case GDN_ERR_INVALID_ARGUMENT: return "GDN_ERR_INVALID_ARGUMENT: invalid argument";
    case GDN_ERR_UNSUPPORTED: return "GDN_ERR_UNSUPPORTED: valid but unsupported by this backend";
    case GDN_ERR_NOT_IMPLEMENTED: return "GDN_ERR_NOT_IMPLEMENTED: not implemented on this backend";
    case GDN_ERR_NO_BACKEND: return "GDN_ERR_NO_BACKEND: library built without the CUDA backend";
    case GDN_ERR_WORKSPACE: return "GDN_ERR_WORKSPACE: workspace missing or too small";
    case GDN_ERR_CUDA: return "GDN_ERR_CUDA: CUDA runtime error";
    case GDN_ERR_OUT_OF_MEMORY: return "GDN_ERR_OUT_OF_MEMORY: host allocation failed";
    case GDN_ERR_INTERNAL: return "GDN_ERR_INTERNAL: internal error";
    }
    return "unknown gdn_status";
}

static _Thread_local char g_last_error[512];

const char *gdn_last_error(void) { return g_last_error; }

gdn_status gdn_set_error(gdn_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    return status;
}

static void clear_error(void) { g_last_error[0] = '\0'; }

int gdn_has_cuda(void)
{
#ifdef GDN_WITH_CUDA
    return 1;
#else
    return 0;
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* Tensors                                                                                     */

size_t gdn_dtype_size(gdn_dtype dtype)
{
    switch (dtype) {
    case GDN_DTYPE_F32: return 4;
    case GDN_DTYPE_BF16: return 2;
    case GDN_DTYPE_F16: return 2;
    case GDN_DTYPE_I32: return 4;
    case GDN_DTYPE_F64: return 8;
    }
    return 0;
}

gdn_tensor gdn_tensor_make(void *data, gdn_dtype dtype, gdn_device_type device, int device_ordinal, int rank,
                           const int64_t *shape)
{
    gdn_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.device = device;
    t.device_ordinal = device_ordinal;
    t.rank = rank;
    if (rank < 1 || rank > GDN_MAX_RANK || !shape)
        return t;
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.stride[d] = stride;
        stride *= shape[d] > 0 ? shape[d] : 1;
    }
    return t;
}

static const char *dtype_name(gdn_dtype dtype)
{
    switch (dtype) {
    case GDN_DTYPE_F32: return "f32";
    case GDN_DTYPE_BF16: return "bf16";
    case GDN_DTYPE_F16: return "f16";
    case GDN_DTYPE_I32: return "i32";
    case GDN_DTYPE_F64: return "f64";
    }
    return "unknown";
}

static int present(const gdn_tensor *t) { return t->data != NULL; }

/* Dtype sets accepted by an argument. */
enum {
    DT_F32 = 1 << GDN_DTYPE_F32,
    DT_BF16 = 1 << GDN_DTYPE_BF16,
    DT_F16 = 1 << GDN_DTYPE_F16,
    DT_I32 = 1 << GDN_DTYPE_I32,
    DT_F64 = 1 << GDN_DTYPE_F64,
    DT_FLOATS = DT_F32 | DT_BF16 | DT_F16,
    DT_STATE = DT_F32 | DT_BF16
};

/* Which device the call runs on: set by the first present tensor, checked against the rest. */
typedef struct device_ctx {
    int set;
    gdn_device_type type;
    int ordinal;
    const char *first; /* name of the tensor that fixed it */
    int f64_ok;        /* CPU float64 oracle mode */
} device_ctx;

/* Check one present tensor: descriptor sanity, dtype, device, rank, shape (-1 = any), strides,
 * alignment. `name` appears in every message. DT_F64 in `dtypes` counts only in the CPU float64
 * oracle mode (q is f64 on the CPU). */
static gdn_status check_tensor(device_ctx *dev, const gdn_tensor *t, const char *name, unsigned dtypes, int rank,
                               const int64_t *want)
{
    if (!dev->f64_ok)
        dtypes &= ~(unsigned)DT_F64;
    if ((unsigned)t->dtype > GDN_DTYPE_F64 || !((1u << t->dtype) & dtypes))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s: dtype %s is not accepted here", name,
                             (unsigned)t->dtype > GDN_DTYPE_F64 ? "(invalid)" : dtype_name(t->dtype));
    if (t->device != GDN_DEVICE_CPU && t->device != GDN_DEVICE_CUDA)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s: invalid device type %d", name, (int)t->device);
    if (t->device_ordinal < 0 || (t->device == GDN_DEVICE_CPU && t->device_ordinal != 0))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s: invalid device ordinal %d", name, t->device_ordinal);
    if (!dev->set) {
        dev->set = 1;
        dev->type = t->device;
        dev->ordinal = t->device_ordinal;
        dev->first = name;
    } else if (t->device != dev->type || t->device_ordinal != dev->ordinal) {
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s is on %s:%d but %s is on %s:%d", name,
                             t->device == GDN_DEVICE_CPU ? "cpu" : "cuda", t->device_ordinal, dev->first,
                             dev->type == GDN_DEVICE_CPU ? "cpu" : "cuda", dev->ordinal);
    }
    if (t->dtype == GDN_DTYPE_F64 && t->device != GDN_DEVICE_CPU)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s: f64 tensors are accepted on the CPU only", name);
    if (t->rank != rank)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s: rank %d, expected %d", name, t->rank, rank);
    for (int d = 0; d < rank; d++) {
        if (t->shape[d] < 0)
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s: shape[%d] = %lld is negative", name, d,
                                 (long long)t->shape[d]);
        if (want && want[d] >= 0 && t->shape[d] != want[d])
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s: shape[%d] = %lld, expected %lld", name, d,
                                 (long long)t->shape[d], (long long)want[d]);
        if (t->stride[d] < 0)
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s: stride[%d] = %lld is negative", name, d,
                                 (long long)t->stride[d]);
    }
    if ((uintptr_t)t->data % gdn_dtype_size(t->dtype) != 0)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s: data pointer is not aligned to its %zu-byte elements",
                             name, gdn_dtype_size(t->dtype));
    return GDN_OK;
}

/* Byte range [lo, hi) a tensor can touch; lo == hi when it has no elements. */
typedef struct extent {
    uintptr_t lo, hi;
    const char *name;
    const gdn_tensor *t;
} extent;

static extent extent_of(const gdn_tensor *t, const char *name)
{
    extent e = {0, 0, name, t};
    if (!present(t))
        return e;
    uint64_t last = 0;
    for (int d = 0; d < t->rank; d++) {
        if (t->shape[d] == 0)
            return e;
        last += (uint64_t)(t->shape[d] - 1) * (uint64_t)t->stride[d];
    }
    e.lo = (uintptr_t)t->data;
    e.hi = e.lo + (uintptr_t)((last + 1) * gdn_dtype_size(t->dtype));
    return e;
}

static int same_view(const gdn_tensor *a, const gdn_tensor *b)
{
    if (a->data != b->data || a->dtype != b->dtype || a->rank != b->rank)
        return 0;
    for (int d = 0; d < a->rank; d++)
        if (a->shape[d] != b->shape[d] || a->stride[d] != b->stride[d])
            return 0;
    return 1;
}

static int overlaps(const extent *a, const extent *b)
{
    return a->lo < a->hi && b->lo < b->hi && a->lo < b->hi && b->lo < a->hi;
}

/* Every output must be disjoint from every input and from the other outputs, except the pairs
 * the caller allows as exact aliases (final state written over the initial state). */
typedef struct alias_set {
    extent in[16], out[12];
    int n_in, n_out;
    const gdn_tensor *alias_in, *alias_out; /* an allowed exact alias pair, or NULL */
} alias_set;

static void add_in(alias_set *s, const gdn_tensor *t, const char *name)
{
    if (present(t))
        s->in[s->n_in++] = extent_of(t, name);
}

static void add_out(alias_set *s, const gdn_tensor *t, const char *name)
{
    if (present(t))
        s->out[s->n_out++] = extent_of(t, name);
}

/* A raw buffer of n bytes (saved_states) as an input or an output extent. */
static void add_bytes(alias_set *s, int out, const void *data, size_t n, const char *name)
{
    if (!data || n == 0)
        return;
    extent e = {(uintptr_t)data, (uintptr_t)data + n, name, NULL};
    if (out)
        s->out[s->n_out++] = e;
    else
        s->in[s->n_in++] = e;
}

static gdn_status check_aliasing(const alias_set *s)
{
    for (int i = 0; i < s->n_out; i++) {
        for (int j = 0; j < s->n_in; j++) {
            if (!overlaps(&s->out[i], &s->in[j]))
                continue;
            if (s->out[i].t == s->alias_out && s->in[j].t == s->alias_in && same_view(s->alias_out, s->alias_in))
                continue;
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s overlaps the input %s in memory%s", s->out[i].name,
                                 s->in[j].name,
                                 s->out[i].t == s->alias_out && s->in[j].t == s->alias_in
                                     ? " (only an exact alias, same pointer, shape and strides, is allowed)"
                                     : "");
        }
        for (int j = 0; j < i; j++)
            if (overlaps(&s->out[i], &s->out[j]))
                return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "outputs %s and %s overlap in memory",
                                     s->out[i].name, s->out[j].name);
    }
    return GDN_OK;
}

static gdn_view view_of(const gdn_tensor *t)
{
    gdn_view v;
    memset(&v, 0, sizeof v);
    if (!present(t))
        return v;
    v.data = t->data;
    v.dtype = t->dtype;
    for (int d = 0; d < t->rank && d < 4; d++)
        v.s[d] = t->stride[d];
    return v;
}

#define TRY(expr)                                                                                                  \
    do {                                                                                                           \
        gdn_status st_ = (expr);                                                                                   \
        if (st_ != GDN_OK)                                                                                         \
            return st_;                                                                                            \
    } while (0)

/* The backend of the call's device must be built in. Device selection is the backend's own: each
 * CUDA entry makes the problem's device current for its duration. */
static gdn_status check_backend(const device_ctx *dev)
{
    if (dev->type == GDN_DEVICE_CUDA && !gdn_has_cuda())
        return gdn_set_error(GDN_ERR_NO_BACKEND, "%s is a CUDA tensor but libgdn was built without the CUDA backend",
                             dev->first);
    return GDN_OK;
}

/* Softplus parameters: 0 selects vLLM's defaults. */
static gdn_status resolve_softplus(float sp_beta, float sp_threshold, float *beta_out, float *threshold_out)
{
    *beta_out = sp_beta == 0.0f ? 1.0f : sp_beta;
    *threshold_out = sp_threshold == 0.0f ? 20.0f : sp_threshold;
    if (!(*beta_out > 0.0f) || !isfinite(*beta_out))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "softplus_beta = %g must be finite and > 0", (double)sp_beta);
    if (!(*threshold_out > 0.0f) || !isfinite(*threshold_out))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "softplus_threshold = %g must be finite and > 0",
                             (double)sp_threshold);
    return GDN_OK;
}

static gdn_status check_lower_bound(gdn_gate_kind kind, float lower_bound)
{
    if (lower_bound == 0.0f)
        return GDN_OK;
    if (kind != GDN_GATE_KDA)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "lower_bound = %g is a KDA option (gate kind is GDN)",
                             (double)lower_bound);
    if (!(lower_bound >= -5.0f && lower_bound < 0.0f))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "lower_bound = %g must be in [-5, 0) (0 = off)",
                             (double)lower_bound);
    return GDN_OK;
}

/* A_log [HV] contiguous f32; dt_bias GDN [HV] / KDA [HV, K] f32, may be absent. */
static gdn_status check_gate_params(device_ctx *dev, gdn_gate_kind kind, const gdn_tensor *A_log,
                                    const gdn_tensor *dt_bias, int64_t HV, int64_t K, const char *A_log_name,
                                    const char *dt_bias_name)
{
    if (!present(A_log))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s is required with raw a (in-kernel gating)", A_log_name);
    int64_t want_hv[1] = {HV};
    TRY(check_tensor(dev, A_log, A_log_name, DT_F32, 1, want_hv));
    if (HV > 1 && A_log->stride[0] != 1)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "%s: stride[0] = %lld, must be contiguous", A_log_name,
                             (long long)A_log->stride[0]);
    if (present(dt_bias)) {
        int64_t want_kda[2] = {HV, K};
        TRY(check_tensor(dev, dt_bias, dt_bias_name, DT_F32, kind == GDN_GATE_KDA ? 2 : 1,
                         kind == GDN_GATE_KDA ? want_kda : want_hv));
    }
    return GDN_OK;
}

/* The gates shared by chunk and recurrent forward. Fills the gate fields of p. */
static gdn_status resolve_gate(device_ctx *dev, const gdn_gate_params *gp, gdn_problem *p, alias_set *aliases)
{
    if (gp->kind != GDN_GATE_GDN && gp->kind != GDN_GATE_KDA)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "gate.kind = %d is not a gdn_gate_kind", (int)gp->kind);
    int kda = gp->kind == GDN_GATE_KDA;
    int64_t want[4] = {p->B, p->T, p->HV, p->K};
    int rank = kda ? 4 : 3;

    if (present(&gp->g) == present(&gp->a))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, present(&gp->g)
                                                           ? "gate.g and gate.a are both given; pass exactly one"
                                                           : "gate.g and gate.a are both absent; pass exactly one");
    if (present(&gp->g)) {
        TRY(check_tensor(dev, &gp->g, "gate.g", DT_F32 | DT_F64, rank, want));
        if (present(&gp->A_log) || present(&gp->dt_bias))
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT,
                                 "gate.A_log / gate.dt_bias apply to raw gate.a, not to precomputed gate.g");
        if (gp->lower_bound != 0.0f)
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT,
                                 "gate.lower_bound applies to raw gate.a, not to precomputed gate.g");
    } else {
        TRY(check_tensor(dev, &gp->a, "gate.a", DT_FLOATS | DT_F64, rank, want));
        TRY(check_gate_params(dev, gp->kind, &gp->A_log, &gp->dt_bias, p->HV, p->K, "gate.A_log", "gate.dt_bias"));
        TRY(check_lower_bound(gp->kind, gp->lower_bound));
    }
    TRY(resolve_softplus(gp->softplus_beta, gp->softplus_threshold, &p->softplus_beta, &p->softplus_threshold));

    if (!present(&gp->beta))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "gate.beta is required (beta, or raw b with beta_from_logits)");
    TRY(check_tensor(dev, &gp->beta, "gate.beta", DT_FLOATS | DT_F64, 3, want));

    p->gate_kind = gp->kind;
    p->g = view_of(&gp->g);
    p->a = view_of(&gp->a);
    p->A_log = (const float *)gp->A_log.data;
    p->dt_bias = view_of(&gp->dt_bias);
    p->lower_bound = gp->lower_bound;
    p->beta = view_of(&gp->beta);
    p->beta_from_logits = gp->beta_from_logits != 0;
    p->allow_neg_eigval = gp->allow_neg_eigval != 0;
    add_in(aliases, &gp->g, "gate.g");
    add_in(aliases, &gp->a, "gate.a");
    add_in(aliases, &gp->A_log, "gate.A_log");
    add_in(aliases, &gp->dt_bias, "gate.dt_bias");
    add_in(aliases, &gp->beta, "gate.beta");
    return GDN_OK;
}

/* q, k, v, o, scale, l2norm, cu_seqlens: the token tensors shared by every op. o == NULL (the
 * backward, which has no o) skips o. */
static gdn_status resolve_tokens(device_ctx *dev, const gdn_tensor *q, const gdn_tensor *k, const gdn_tensor *v,
                                 const gdn_tensor *o, float scale, int use_qk_l2norm, const gdn_tensor *cu_seqlens,
                                 gdn_problem *p, alias_set *aliases)
{
    if (!present(q))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "q is required");
    if (!present(k))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "k is required");
    if (!present(v))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "v is required");
    if (o && !present(o))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "o (the output) is required");

    dev->f64_ok = q->device == GDN_DEVICE_CPU && q->dtype == GDN_DTYPE_F64;
    TRY(check_tensor(dev, q, "q", DT_FLOATS | DT_F64, 4, NULL));
    p->B = q->shape[0];
    p->T = q->shape[1];
    p->H = q->shape[2];
    p->K = q->shape[3];
    TRY(check_tensor(dev, k, "k", 1u << q->dtype, 4, q->shape));
    int64_t want_v[4] = {p->B, p->T, -1, -1};
    TRY(check_tensor(dev, v, "v", 1u << q->dtype, 4, want_v));
    p->HV = v->shape[2];
    p->V = v->shape[3];
    if (o)
        TRY(check_tensor(dev, o, "o", 1u << q->dtype, 4, v->shape));

    if (p->B < 1)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "q: batch size B = %lld must be >= 1", (long long)p->B);
    if (p->H < 1 || p->HV < 1)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "head counts H = %lld, HV = %lld must be >= 1",
                             (long long)p->H, (long long)p->HV);
    if (p->HV % p->H != 0)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT,
                             "v has HV = %lld value heads, not a multiple of q's H = %lld key heads",
                             (long long)p->HV, (long long)p->H);
    p->G = p->HV / p->H;

    if (!isfinite(scale))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "scale = %g is not finite", (double)scale);
    p->scale = scale != 0.0f ? (double)scale : 1.0 / sqrt((double)p->K);
    p->use_qk_l2norm = use_qk_l2norm != 0;

    p->N = p->B;
    p->cu_seqlens = NULL;
    if (present(cu_seqlens)) {
        TRY(check_tensor(dev, cu_seqlens, "cu_seqlens", DT_I32, 1, NULL));
        int64_t entries = cu_seqlens->shape[0];
        if (entries < 2)
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "cu_seqlens has %lld entries, needs N + 1 >= 2",
                                 (long long)entries);
        if (cu_seqlens->stride[0] != 1)
            return gdn_set_error(GDN_ERR_UNSUPPORTED, "cu_seqlens: stride[0] = %lld, must be contiguous",
                                 (long long)cu_seqlens->stride[0]);
        if (p->B != 1)
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "cu_seqlens given but q has batch size B = %lld, must be 1",
                                 (long long)p->B);
        if (p->T > INT32_MAX)
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "q: T = %lld exceeds the int32 range of cu_seqlens",
                                 (long long)p->T);
        const int32_t *cu = (const int32_t *)cu_seqlens->data;
        if (cu_seqlens->device == GDN_DEVICE_CPU) {
            if (cu[0] != 0)
                return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "cu_seqlens[0] = %d, must be 0", (int)cu[0]);
            for (int64_t n = 1; n < entries; n++)
                if (cu[n] < cu[n - 1])
                    return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "cu_seqlens[%lld] = %d < cu_seqlens[%lld] = %d",
                                         (long long)n, (int)cu[n], (long long)(n - 1), (int)cu[n - 1]);
            if (cu[entries - 1] != p->T)
                return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "cu_seqlens[%lld] = %d, must equal T = %lld",
                                     (long long)(entries - 1), (int)cu[entries - 1], (long long)p->T);
        }
        p->N = entries - 1;
        p->cu_seqlens = cu;
        add_in(aliases, cu_seqlens, "cu_seqlens");
    }

    p->q = view_of(q);
    p->k = view_of(k);
    p->v = view_of(v);
    add_in(aliases, q, "q");
    add_in(aliases, k, "k");
    add_in(aliases, v, "v");
    if (o) {
        p->o = view_of(o);
        add_out(aliases, o, "o");
    }
    return GDN_OK;
}

/* The last step of every op's resolve: where and how the validated problem runs. */
static gdn_status set_call(gdn_problem *p, const device_ctx *dev, void *stream, void *workspace, size_t workspace_bytes)
{
    p->device = dev->type;
    p->device_ordinal = dev->ordinal;
    p->stream = stream;
    p->workspace = workspace;
    p->workspace_bytes = workspace_bytes;
    return GDN_OK;
}

/* A state tensor: [rows, HV, K, V] (KV) or [rows, HV, V, K] (VK); rows = -1 accepts any. All
 * states of one call share a dtype: the first one checked fixes *state_dtype. */
#define STATE_DTYPE_UNSET ((gdn_dtype)-1)
static gdn_status check_state(device_ctx *dev, const gdn_tensor *t, const char *name, const gdn_problem *p,
                              int64_t rows, gdn_dtype *state_dtype)
{
    if (*state_dtype != STATE_DTYPE_UNSET && t->dtype != *state_dtype)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s: dtype %s differs from the other states' %s", name,
                             dtype_name(t->dtype), dtype_name(*state_dtype));
    int64_t want[4] = {rows, p->HV, p->state_layout == GDN_STATE_KV ? p->K : p->V,
                       p->state_layout == GDN_STATE_KV ? p->V : p->K};
    TRY(check_tensor(dev, t, name, DT_STATE | DT_F64, 4, want));
    *state_dtype = t->dtype;
    return GDN_OK;
}

/* Resolve a state's strides into {n, hv, k, v} order. */
static gdn_view state_view(const gdn_tensor *t, gdn_state_layout layout)
{
    gdn_view v = view_of(t);
    if (present(t) && layout == GDN_STATE_VK) {
        int64_t sv = v.s[2];
        v.s[2] = v.s[3];
        v.s[3] = sv;
    }
    return v;
}

static gdn_status check_layout(gdn_state_layout layout)
{
    if (layout != GDN_STATE_KV && layout != GDN_STATE_VK)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "state_layout = %d is not a gdn_state_layout", (int)layout);
    return GDN_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Gating                                                                                      */

static gdn_status resolve_gating(const gdn_gating_args *args, gdn_gating_problem *p, device_ctx *dev)
{
    if (!args)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "args is NULL");
    memset(p, 0, sizeof *p);
    if (args->kind != GDN_GATE_GDN && args->kind != GDN_GATE_KDA)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "kind = %d is not a gdn_gate_kind", (int)args->kind);
    int kda = args->kind == GDN_GATE_KDA;
    if (!present(&args->a))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "a is required");
    if (!present(&args->g_out))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "g_out is required");
    TRY(check_tensor(dev, &args->a, "a", DT_FLOATS, kda ? 4 : 3, NULL));
    p->B = args->a.shape[0];
    p->T = args->a.shape[1];
    p->HV = args->a.shape[2];
    p->K = kda ? args->a.shape[3] : 1;
    if (p->HV < 1)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "a: HV = %lld must be >= 1", (long long)p->HV);
    TRY(check_tensor(dev, &args->g_out, "g_out", DT_F32, kda ? 4 : 3, args->a.shape));
    TRY(check_gate_params(dev, args->kind, &args->A_log, &args->dt_bias, p->HV, p->K, "A_log", "dt_bias"));
    TRY(check_lower_bound(args->kind, args->lower_bound));
    TRY(resolve_softplus(args->softplus_beta, args->softplus_threshold, &p->softplus_beta, &p->softplus_threshold));

    if (present(&args->b) != present(&args->beta_out))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT,
                             present(&args->b) ? "b is given but beta_out is absent" : "beta_out is given but b is absent");
    int64_t want_b[3] = {p->B, p->T, p->HV};
    if (present(&args->b)) {
        TRY(check_tensor(dev, &args->b, "b", DT_FLOATS, 3, want_b));
        TRY(check_tensor(dev, &args->beta_out, "beta_out", DT_FLOATS, 3, want_b));
    }

    alias_set aliases;
    memset(&aliases, 0, sizeof aliases);
    add_in(&aliases, &args->a, "a");
    add_in(&aliases, &args->A_log, "A_log");
    add_in(&aliases, &args->dt_bias, "dt_bias");
    add_in(&aliases, &args->b, "b");
    add_out(&aliases, &args->g_out, "g_out");
    add_out(&aliases, &args->beta_out, "beta_out");
    TRY(check_aliasing(&aliases));

    p->device = dev->type;
    p->device_ordinal = dev->ordinal;
    p->stream = args->stream;
    p->kind = args->kind;
    p->a = view_of(&args->a);
    p->A_log = (const float *)args->A_log.data;
    p->dt_bias = view_of(&args->dt_bias);
    p->lower_bound = args->lower_bound;
    p->g_out = view_of(&args->g_out);
    p->b = view_of(&args->b);
    p->allow_neg_eigval = args->allow_neg_eigval != 0;
    p->beta_out = view_of(&args->beta_out);
    return GDN_OK;
}

gdn_status gdn_gating(const gdn_gating_args *args)
{
    clear_error();
    gdn_gating_problem p;
    device_ctx dev = {0};
    TRY(resolve_gating(args, &p, &dev));
    TRY(check_backend(&dev));
    return p.device == GDN_DEVICE_CUDA ? gdn_cuda_gating(&p) : gdn_cpu_gating(&p);
}

/* ------------------------------------------------------------------------------------------ */
/* Chunk forward                                                                               */

/* Row r of a host-resident int32 index table (cols entries, row stride sr, column stride sc): every
 * slot < P (negative ones mean "skip"). The message names entry [r][c], or [r] without two_d. */
static gdn_status check_slot_row(const int32_t *ids, int64_t r, int64_t cols, int64_t sr, int64_t sc, int two_d,
                                 const char *name, int64_t P)
{
    for (int64_t c = 0; c < cols; c++) {
        const int32_t slot = ids[r * sr + c * sc];
        if (slot >= P && two_d)
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s[%lld][%lld] = %d is out of range for a pool of %lld slots",
                                 name, (long long)r, (long long)c, (int)slot, (long long)P);
        if (slot >= P)
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "%s[%lld] = %d is out of range for a pool of %lld slots",
                                 name, (long long)r, (int)slot, (long long)P);
    }
    return GDN_OK;
}

/* A host-resident [rows] or [rows, cols] int32 index tensor: check_slot_row on every row. */
static gdn_status check_host_slots(const gdn_tensor *t, const char *name, int64_t P)
{
    if (t->device != GDN_DEVICE_CPU)
        return GDN_OK;
    const int two_d = t->rank == 2;
    for (int64_t r = 0; r < t->shape[0]; r++)
        TRY(check_slot_row((const int32_t *)t->data, r, two_d ? t->shape[1] : 1, t->stride[0], two_d ? t->stride[1] : 0,
                           two_d, name, P));
    return GDN_OK;
}

/* The chunk op's state pool and checkpoints (gdn.h): initial_state is the pool, read and written
 * in place through state_indices. */
static gdn_status resolve_chunk_pool(device_ctx *dev, const gdn_chunk_fwd_args *args, gdn_problem *p,
                                     alias_set *aliases)
{
    const gdn_tensor *idx = &args->state_indices, *has = &args->has_initial_state, *ck = &args->checkpoint_indices;
    if (!present(idx)) {
        if (present(has))
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "has_initial_state needs state_indices (a state pool)");
        if (args->null_slot_zero)
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "null_slot_zero needs state_indices (a state pool)");
        if (args->checkpoint_interval != 0 || present(ck))
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT,
                                 "checkpoint_interval / checkpoint_indices need state_indices (a state pool)");
        return GDN_OK;
    }
    if (!present(&args->initial_state))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "state_indices given but the state pool (initial_state) is absent");
    if (present(&args->final_state))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT,
                             "final_state must be absent with state_indices: final states go back to the pool");
    p->num_slots = args->initial_state.shape[0];
    if (p->num_slots < 1)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "initial_state: the pool has no slots");
    const int64_t want_n[1] = {p->N};
    TRY(check_tensor(dev, idx, "state_indices", DT_I32, 1, want_n));
    p->state_indices = (const int32_t *)idx->data;
    p->idx_stride_n = idx->stride[0];
    p->idx_cols = 1;
    p->idx_stride_t = 0;
    p->inplace_state = 1;
    p->null_slot_zero = args->null_slot_zero != 0;
    add_in(aliases, idx, "state_indices");
    if (present(has)) {
        TRY(check_tensor(dev, has, "has_initial_state", DT_I32, 1, want_n));
        p->has_initial_state = (const int32_t *)has->data;
        p->has_init_stride = has->stride[0];
        add_in(aliases, has, "has_initial_state");
    }
    const int64_t M = args->checkpoint_interval;
    if (M < 0 || M % 64 != 0)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "checkpoint_interval = %lld must be a multiple of 64 (0: none)",
                             (long long)M);
    if (M > 0) {
        if (!present(ck))
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "checkpoint_indices is required with checkpoint_interval > 0");
        const int64_t want_ck[2] = {p->N, -1};
        TRY(check_tensor(dev, ck, "checkpoint_indices", DT_I32, 2, want_ck));
        p->checkpoint_interval = M;
        p->checkpoint_indices = (const int32_t *)ck->data;
        p->ckpt_stride_n = ck->stride[0];
        p->ckpt_stride_j = ck->stride[1];
        p->ckpt_cols = ck->shape[1];
        add_in(aliases, ck, "checkpoint_indices");
        TRY(check_host_slots(ck, "checkpoint_indices", p->num_slots));
    } else if (present(ck)) {
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "checkpoint_indices given but checkpoint_interval is 0");
    }
    return check_host_slots(idx, "state_indices", p->num_slots);
}

/* The states the forward saves for the backward (gdn.h, gdn_chunk_saved_states_size): kept where
 * the backend saves any, checked for size and alignment; ignored (NULL) where it saves none. */
static gdn_status resolve_saved_states(gdn_problem *p, const device_ctx *dev, void *buf, size_t bytes)
{
    p->saved_states = NULL;
    const size_t need = dev->type == GDN_DEVICE_CUDA ? gdn_cuda_chunk_saved_states_size(p) : 0;
    if (!buf || need == 0)
        return GDN_OK;
    if (bytes < need)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT,
                             "saved_states: %zu bytes given, %zu needed (gdn_chunk_saved_states_size)", bytes, need);
    if ((uintptr_t)buf % 16 != 0)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "saved_states: pointer must be 16-byte aligned");
    p->saved_states = buf;
    return GDN_OK;
}

static gdn_status resolve_chunk(const gdn_chunk_fwd_args *args, gdn_problem *p, device_ctx *dev)
{
    if (!args)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "args is NULL");
    memset(p, 0, sizeof *p);
    alias_set aliases;
    memset(&aliases, 0, sizeof aliases);
    TRY(resolve_tokens(dev, &args->q, &args->k, &args->v, &args->o, args->scale, args->use_qk_l2norm,
                       &args->cu_seqlens, p, &aliases));
    TRY(resolve_gate(dev, &args->gate, p, &aliases));

    TRY(check_layout(args->state_layout));
    p->state_layout = args->state_layout;
    const int pooled = present(&args->state_indices);
    gdn_dtype state_dtype = STATE_DTYPE_UNSET;
    if (present(&args->initial_state))
        TRY(check_state(dev, &args->initial_state, "initial_state", p, pooled ? -1 : p->N, &state_dtype));
    p->num_slots = p->N;
    TRY(resolve_chunk_pool(dev, args, p, &aliases));
    if (present(&args->final_state))
        TRY(check_state(dev, &args->final_state, "final_state", p, p->N, &state_dtype));
    p->state_dtype = state_dtype == STATE_DTYPE_UNSET ? GDN_DTYPE_F32 : state_dtype;
    p->state_in = state_view(&args->initial_state, p->state_layout);
    p->final_state = state_view(&args->final_state, p->state_layout);

    if (pooled) {
        add_out(&aliases, &args->initial_state, "initial_state (pool, written in place)");
    } else {
        add_in(&aliases, &args->initial_state, "initial_state");
        aliases.alias_in = &args->initial_state;
        aliases.alias_out = &args->final_state;
    }
    add_out(&aliases, &args->final_state, "final_state");
    if (args->saved_states && pooled)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "saved_states: not with a state pool (state_indices); the "
                                                       "backward takes initial states, not a pool");
    TRY(resolve_saved_states(p, dev, args->saved_states, args->saved_states_bytes));
    add_bytes(&aliases, 1, p->saved_states, args->saved_states_bytes, "saved_states");
    TRY(check_aliasing(&aliases));

    return set_call(p, dev, args->stream, args->workspace, args->workspace_bytes);
}

/* ------------------------------------------------------------------------------------------ */
/* Recurrent forward                                                                           */

/* Host-side checks of state_indices / num_accepted_tokens values (CPU tensors only). */
static gdn_status check_host_indices(const gdn_recurrent_fwd_args *args, const gdn_problem *p)
{
    const gdn_tensor *idx = &args->state_indices;
    if (idx->device != GDN_DEVICE_CPU)
        return GDN_OK;
    for (int64_t n = 0; n < p->N; n++) {
        TRY(check_slot_row((const int32_t *)idx->data, n, p->idx_cols, p->idx_stride_n, p->idx_stride_t, 1,
                           "state_indices", p->num_slots));
        if (p->inplace_state && p->idx_cols > 1) {
            int64_t len = p->cu_seqlens ? (int64_t)p->cu_seqlens[n + 1] - p->cu_seqlens[n] : p->T;
            if (len > p->idx_cols)
                return gdn_set_error(GDN_ERR_INVALID_ARGUMENT,
                                     "sequence %lld has %lld tokens but state_indices has %lld columns for its "
                                     "per-step states",
                                     (long long)n, (long long)len, (long long)p->idx_cols);
        }
    }
    return GDN_OK;
}

static gdn_status resolve_recurrent(const gdn_recurrent_fwd_args *args, gdn_problem *p, device_ctx *dev)
{
    if (!args)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "args is NULL");
    memset(p, 0, sizeof *p);
    alias_set aliases;
    memset(&aliases, 0, sizeof aliases);
    TRY(resolve_tokens(dev, &args->q, &args->k, &args->v, &args->o, args->scale, args->use_qk_l2norm,
                       &args->cu_seqlens, p, &aliases));
    TRY(resolve_gate(dev, &args->gate, p, &aliases));

    TRY(check_layout(args->state_layout));
    p->state_layout = args->state_layout;
    const gdn_tensor *state = &args->state, *idx = &args->state_indices, *acc = &args->num_accepted_tokens;
    int pooled = present(idx);
    gdn_dtype state_dtype = STATE_DTYPE_UNSET;

    if (pooled && !present(state))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "state_indices given but the state pool (state) is absent");
    if (present(acc) && !(pooled && idx->rank == 2))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "num_accepted_tokens needs 2-D state_indices [N, T_max]");
    if (args->inplace_state && !pooled)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "inplace_state needs state_indices (a state pool)");
    if (args->null_slot_zero && !pooled)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "null_slot_zero needs state_indices (a state pool)");

    p->num_slots = p->N;
    if (present(state)) {
        TRY(check_state(dev, state, "state", p, pooled ? -1 : p->N, &state_dtype));
        if (pooled) {
            p->num_slots = state->shape[0];
            if (p->num_slots < 1)
                return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "state: the pool has no slots");
        }
    }
    if (pooled) {
        if (idx->rank != 1 && idx->rank != 2)
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "state_indices: rank %d, expected 1 ([N]) or 2 ([N, T_max])",
                                 idx->rank);
        int64_t want_idx[2] = {p->N, -1};
        TRY(check_tensor(dev, idx, "state_indices", DT_I32, idx->rank, want_idx));
        p->state_indices = (const int32_t *)idx->data;
        p->idx_stride_n = idx->stride[0];
        p->idx_cols = idx->rank == 2 ? idx->shape[1] : 1;
        p->idx_stride_t = idx->rank == 2 ? idx->stride[1] : 0;
        if (p->idx_cols < 1)
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "state_indices: T_max = 0 columns");
        if (args->inplace_state && idx->rank == 2 && !p->cu_seqlens && p->T > p->idx_cols)
            return gdn_set_error(GDN_ERR_INVALID_ARGUMENT,
                                 "state_indices has %lld columns but each sequence has T = %lld tokens whose "
                                 "per-step states it must address",
                                 (long long)p->idx_cols, (long long)p->T);
        add_in(&aliases, idx, "state_indices");
        if (present(acc)) {
            int64_t want_acc[1] = {p->N};
            TRY(check_tensor(dev, acc, "num_accepted_tokens", DT_I32, 1, want_acc));
            if (p->N > 1 && acc->stride[0] != 1)
                return gdn_set_error(GDN_ERR_UNSUPPORTED, "num_accepted_tokens: stride[0] = %lld, must be contiguous",
                                     (long long)acc->stride[0]);
            p->num_accepted_tokens = (const int32_t *)acc->data;
            add_in(&aliases, acc, "num_accepted_tokens");
        }
    }
    p->inplace_state = args->inplace_state != 0;
    p->null_slot_zero = args->null_slot_zero != 0;

    if (present(&args->final_state))
        TRY(check_state(dev, &args->final_state, "final_state", p, p->N, &state_dtype));
    if (present(&args->step_states))
        TRY(check_state(dev, &args->step_states, "step_states", p, p->B * p->T, &state_dtype));
    p->state_dtype = state_dtype == STATE_DTYPE_UNSET ? GDN_DTYPE_F32 : state_dtype;
    p->state_in = state_view(state, p->state_layout);
    p->final_state = state_view(&args->final_state, p->state_layout);
    p->step_states = state_view(&args->step_states, p->state_layout);

    /* The pool is an output when written in place, else an input; without indices the final
     * state may be written over the initial state exactly. */
    if (p->inplace_state)
        add_out(&aliases, state, "state (pool, written in place)");
    else
        add_in(&aliases, state, "state");
    add_out(&aliases, &args->final_state, "final_state");
    add_out(&aliases, &args->step_states, "step_states");
    if (!pooled) {
        aliases.alias_in = state;
        aliases.alias_out = &args->final_state;
    }
    TRY(check_aliasing(&aliases));
    if (pooled)
        TRY(check_host_indices(args, p));

    return set_call(p, dev, args->stream, args->workspace, args->workspace_bytes);
}

/* ------------------------------------------------------------------------------------------ */
/* The forward ops' entry points: resolve, then either report the workspace or run the backend.  */

typedef struct fwd_op {
    gdn_status (*resolve)(const void *args, gdn_problem *p, device_ctx *dev);
    gdn_status (*cpu_check)(const gdn_problem *p);  /* the backends' own limits (problem.h) */
    gdn_status (*cuda_check)(const gdn_problem *p);
    gdn_status (*cpu)(const gdn_problem *p);
    size_t (*cpu_workspace)(const gdn_problem *p, int least);
    size_t (*cuda_workspace)(const gdn_problem *p);     /* the query's answer: the fastest path */
    size_t (*cuda_workspace_min)(const gdn_problem *p); /* the least the call accepts */
    gdn_status (*cuda)(const gdn_problem *p);
} fwd_op;

static size_t fwd_workspace(const fwd_op *op, const gdn_problem *p, int least)
{
    if (p->device == GDN_DEVICE_CUDA)
        return least ? op->cuda_workspace_min(p) : op->cuda_workspace(p);
    return op->cpu_workspace(p, least);
}

/* Arguments valid, backend built in, problem within the backend's limits: what a query and a call
 * both establish before anything else. */
static gdn_status fwd_prepare(const fwd_op *op, const void *args, gdn_problem *p)
{
    device_ctx dev = {0};
    TRY(op->resolve(args, p, &dev));
    TRY(check_backend(&dev));
    return p->device == GDN_DEVICE_CUDA ? op->cuda_check(p) : op->cpu_check(p);
}

static gdn_status fwd_workspace_size(const fwd_op *op, const void *args, size_t *bytes)
{
    clear_error();
    if (!bytes)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "bytes is NULL");
    gdn_problem p;
    TRY(fwd_prepare(op, args, &p));
    *bytes = fwd_workspace(op, &p, 0);
    return GDN_OK;
}

/* The one workspace check of every op (gdn.h): the backend's least workspace, 256-byte aligned (what
 * cudaMalloc returns, and more than any kernel's copies need); the query's (larger) size is only
 * for the message. */
static gdn_status check_workspace_bytes(const gdn_problem *p, size_t need, size_t query)
{
    if (need == 0)
        return GDN_OK;
    if (!p->workspace || p->workspace_bytes < need)
        return gdn_set_error(GDN_ERR_WORKSPACE,
                             "workspace: %zu bytes given%s, at least %zu needed (the workspace query gives %zu)",
                             p->workspace ? p->workspace_bytes : (size_t)0, p->workspace ? "" : " (NULL)", need,
                             query);
    if ((uintptr_t)p->workspace % 256 != 0)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "workspace: pointer must be 256-byte aligned");
    return GDN_OK;
}

static gdn_status check_workspace(const fwd_op *op, const gdn_problem *p)
{
    return check_workspace_bytes(p, fwd_workspace(op, p, 1), fwd_workspace(op, p, 0));
}

static gdn_status fwd_run(const fwd_op *op, const void *args)
{
    clear_error();
    gdn_problem p;
    TRY(fwd_prepare(op, args, &p));
    TRY(check_workspace(op, &p));
    return p.device == GDN_DEVICE_CUDA ? op->cuda(&p) : op->cpu(&p);
}

static gdn_status resolve_chunk_any(const void *args, gdn_problem *p, device_ctx *dev)
{
    return resolve_chunk((const gdn_chunk_fwd_args *)args, p, dev);
}

static gdn_status resolve_recurrent_any(const void *args, gdn_problem *p, device_ctx *dev)
{
    return resolve_recurrent((const gdn_recurrent_fwd_args *)args, p, dev);
}

static const fwd_op chunk_op = {resolve_chunk_any,
                                gdn_cpu_chunk_fwd_check,
                                gdn_cuda_chunk_fwd_check,
                                gdn_cpu_chunk_fwd,
                                gdn_cpu_chunk_fwd_workspace,
                                gdn_cuda_chunk_fwd_workspace_size,
                                gdn_cuda_chunk_fwd_workspace_min,
                                gdn_cuda_chunk_fwd};
static const fwd_op recurrent_op = {resolve_recurrent_any,
                                    gdn_cpu_recurrent_fwd_check,
                                    gdn_cuda_recurrent_fwd_check,
                                    gdn_cpu_recurrent_fwd,
                                    gdn_cpu_recurrent_fwd_workspace,
                                    gdn_cuda_recurrent_fwd_workspace_size,
                                    gdn_cuda_recurrent_fwd_workspace_size,
                                    gdn_cuda_recurrent_fwd};

gdn_status gdn_chunk_fwd_workspace_size(const gdn_chunk_fwd_args *args, size_t *bytes)
{
    return fwd_workspace_size(&chunk_op, args, bytes);
}

gdn_status gdn_chunk_fwd(const gdn_chunk_fwd_args *args) { return fwd_run(&chunk_op, args); }

gdn_status gdn_chunk_saved_states_size(const gdn_chunk_fwd_args *args, size_t *bytes)
{
    clear_error();
    if (!bytes)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "bytes is NULL");
    gdn_problem p;
    TRY(fwd_prepare(&chunk_op, args, &p));
    *bytes = p.device == GDN_DEVICE_CUDA ? gdn_cuda_chunk_saved_states_size(&p) : 0;
    return GDN_OK;
}

gdn_status gdn_recurrent_fwd_workspace_size(const gdn_recurrent_fwd_args *args, size_t *bytes)
{
    return fwd_workspace_size(&recurrent_op, args, bytes);
}

gdn_status gdn_recurrent_fwd(const gdn_recurrent_fwd_args *args) { return fwd_run(&recurrent_op, args); }

/* ------------------------------------------------------------------------------------------ */
/* Chunk backward                                                                              */

/* A gradient output: present exactly when `needed` (`why` says why, in the message), then checked
 * (dtypes, rank, shape) and added to the outputs of the aliasing check. */
static gdn_status check_grad(device_ctx *dev, const gdn_tensor *t, const char *name, int needed, const char *why,
                             unsigned dtypes, int rank, const int64_t *want, alias_set *aliases)
{
    if (present(t) != needed)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, needed ? "%s is required (%s)" : "%s must be absent (%s)", name,
                             why);
    if (!needed)
        return GDN_OK;
    TRY(check_tensor(dev, t, name, dtypes, rank, want));
    add_out(aliases, t, name);
    return GDN_OK;
}

static gdn_status resolve_chunk_bwd(const gdn_chunk_bwd_args *args, gdn_bwd_problem *bp, device_ctx *dev)
{
    if (!args)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "args is NULL");
    memset(bp, 0, sizeof *bp);
    gdn_problem *p = &bp->fwd;
    alias_set aliases;
    memset(&aliases, 0, sizeof aliases);
    TRY(resolve_tokens(dev, &args->q, &args->k, &args->v, NULL, args->scale, args->use_qk_l2norm, &args->cu_seqlens,
                       p, &aliases));
    TRY(resolve_gate(dev, &args->gate, p, &aliases));
    if (p->gate_kind != GDN_GATE_GDN)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "gate.kind: the backward takes GDN gates only (KDA: not yet)");
    TRY(check_layout(args->state_layout));
    p->state_layout = args->state_layout;

    const unsigned q_dt = 1u << args->q.dtype;
    int64_t want_v[4] = {p->B, p->T, p->HV, p->V};
    if (!present(&args->d_o))
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "d_o (the gradient of o) is required");
    TRY(check_tensor(dev, &args->d_o, "d_o", q_dt, 4, want_v));
    add_in(&aliases, &args->d_o, "d_o");

    gdn_dtype state_dtype = STATE_DTYPE_UNSET;
    if (present(&args->initial_state))
        TRY(check_state(dev, &args->initial_state, "initial_state", p, p->N, &state_dtype));
    if (present(&args->dht))
        TRY(check_state(dev, &args->dht, "dht", p, p->N, &state_dtype));
    add_in(&aliases, &args->initial_state, "initial_state");
    add_in(&aliases, &args->dht, "dht");

    const gdn_gate_params *gp = &args->gate;
    const int raw = present(&gp->a);
    int64_t want_q[4] = {p->B, p->T, p->H, p->K};
    int64_t want_g[3] = {p->B, p->T, p->HV};
    int64_t want_hv[1] = {p->HV};
    TRY(check_grad(dev, &args->dq, "dq", 1, "the gradient of q", q_dt, 4, want_q, &aliases));
    TRY(check_grad(dev, &args->dk, "dk", 1, "the gradient of k", q_dt, 4, want_q, &aliases));
    TRY(check_grad(dev, &args->dv, "dv", 1, "the gradient of v", q_dt, 4, want_v, &aliases));
    TRY(check_grad(dev, &args->dg, "dg", !raw, raw ? "the gate is raw gate.a: da replaces dg" : "gate.g is given",
                   DT_F32 | DT_F64, 3, want_g, &aliases));
    TRY(check_grad(dev, &args->da, "da", raw,
                   raw ? "gate.a is given" : "the gate is precomputed gate.g: dg replaces da", 1u << gp->a.dtype, 3,
                   want_g, &aliases));
    TRY(check_grad(dev, &args->dA_log, "dA_log", raw, raw ? "gate.a is given" : "gate.A_log is absent",
                   DT_F32 | DT_F64, 1, want_hv, &aliases));
    TRY(check_grad(dev, &args->ddt_bias, "ddt_bias", present(&gp->dt_bias),
                   present(&gp->dt_bias) ? "gate.dt_bias is given" : "gate.dt_bias is absent", DT_F32 | DT_F64, 1,
                   want_hv, &aliases));
    TRY(check_grad(dev, &args->dbeta, "dbeta", 1, "the gradient of gate.beta", 1u << gp->beta.dtype, 3, want_g,
                   &aliases));
    const int has_h0 = present(&args->initial_state);
    if (present(&args->dh0) != has_h0)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, has_h0 ? "dh0 is required (initial_state is given)"
                                                              : "dh0 must be absent (initial_state is absent)");
    if (has_h0) {
        TRY(check_state(dev, &args->dh0, "dh0", p, p->N, &state_dtype));
        add_out(&aliases, &args->dh0, "dh0");
    }
    TRY(resolve_saved_states(p, dev, (void *)args->saved_states, args->saved_states_bytes));
    add_bytes(&aliases, 0, p->saved_states, args->saved_states_bytes, "saved_states");
    TRY(check_aliasing(&aliases));

    p->state_dtype = state_dtype == STATE_DTYPE_UNSET ? GDN_DTYPE_F32 : state_dtype;
    p->state_in = state_view(&args->initial_state, p->state_layout);
    p->num_slots = p->N;
    bp->d_o = view_of(&args->d_o);
    bp->dht = state_view(&args->dht, p->state_layout);
    bp->dq = view_of(&args->dq);
    bp->dk = view_of(&args->dk);
    bp->dv = view_of(&args->dv);
    bp->dg = view_of(&args->dg);
    bp->da = view_of(&args->da);
    bp->dA_log = view_of(&args->dA_log);
    bp->ddt_bias = view_of(&args->ddt_bias);
    bp->dbeta = view_of(&args->dbeta);
    bp->dh0 = state_view(&args->dh0, p->state_layout);
    bp->max_len = p->T;
    if (p->cu_seqlens && args->cu_seqlens.device == GDN_DEVICE_CPU) {
        bp->max_len = 0;
        for (int64_t n = 0; n < p->N; n++) {
            int64_t len = (int64_t)p->cu_seqlens[n + 1] - p->cu_seqlens[n];
            bp->max_len = len > bp->max_len ? len : bp->max_len;
        }
    }

    return set_call(p, dev, args->stream, args->workspace, args->workspace_bytes);
}

/* least: the size the call accepts (CPU: one thread's share), else the query's answer. */
static size_t bwd_workspace(const gdn_bwd_problem *bp, int least)
{
    if (bp->fwd.device == GDN_DEVICE_CUDA)
        return gdn_cuda_chunk_bwd_workspace_size(bp);
    return gdn_cpu_chunk_bwd_workspace_size(bp, least ? 1 : 0);
}

/* As fwd_prepare: valid arguments, backend built in, within the backend's limits. */
static gdn_status bwd_prepare(const gdn_chunk_bwd_args *args, gdn_bwd_problem *bp)
{
    device_ctx dev = {0};
    TRY(resolve_chunk_bwd(args, bp, &dev));
    TRY(check_backend(&dev));
    return bp->fwd.device == GDN_DEVICE_CUDA ? gdn_cuda_chunk_bwd_check(bp) : gdn_cpu_chunk_bwd_check(bp);
}

gdn_status gdn_chunk_bwd_workspace_size(const gdn_chunk_bwd_args *args, size_t *bytes)
{
    clear_error();
    if (!bytes)
        return gdn_set_error(GDN_ERR_INVALID_ARGUMENT, "bytes is NULL");
    gdn_bwd_problem bp;
    TRY(bwd_prepare(args, &bp));
    *bytes = bwd_workspace(&bp, 0);
    return GDN_OK;
}

gdn_status gdn_chunk_bwd(const gdn_chunk_bwd_args *args)
{
    clear_error();
    gdn_bwd_problem bp;
    TRY(bwd_prepare(args, &bp));
    TRY(check_workspace_bytes(&bp.fwd, bwd_workspace(&bp, 1), bwd_workspace(&bp, 0)));
    return bp.fwd.device == GDN_DEVICE_CUDA ? gdn_cuda_chunk_bwd(&bp) : gdn_cpu_chunk_bwd(&bp);
}
