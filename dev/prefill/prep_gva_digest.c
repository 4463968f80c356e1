/*
 * prep_gva_digest.c - bitwise comparison of two libgdn builds' chunked forward on the GPU: runs
 * gdn_chunk_fwd on fixed-seed inputs (tests/test_util.c's cases) and prints an FNV-1a digest of o
 * and of the final state per case. check-prep-gva.sh builds it against main and against main with
 * chunk-prep-gva.patch (heuristic and forced head groups) and diffs the lines: the patch changes
 * which CTA computes what, not the arithmetic, so every digest must match. No float64 oracle
 * here (test_cuda_chunk checks accuracy); the two large cases take the grouped path without the
 * dev cap (H100: 132 SMs).
 *   prep_gva_digest > digests.txt
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "gdn.h"
#include "test_util.h"

static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static size_t tensor_bytes(const gdn_tensor *t) { return tu_numel(t) * gdn_dtype_size(t->dtype); }

/* Replaces a present host tensor by a device copy; returns the device pointer (NULL: absent). */
static void *to_device(gdn_tensor *t, int *ok)
{
    if (!t->data)
        return NULL;
    size_t bytes = tensor_bytes(t);
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess ||
        (bytes && cudaMemcpy(d, t->data, bytes, cudaMemcpyHostToDevice) != cudaSuccess)) {
        *ok = 0;
        return d;
    }
    t->data = d;
    t->device = GDN_DEVICE_CUDA;
    t->device_ordinal = 0;
    return d;
}

static int run(const char *name, tu_case_config cfg)
{
    tu_case c;
    tu_case_init(&c, &cfg);
    gdn_chunk_fwd_args a = tu_case_chunk_args(&c);
    gdn_tensor *ts[12] = {&a.q, &a.k, &a.v, &a.o, &a.gate.g, &a.gate.a, &a.gate.A_log, &a.gate.dt_bias,
                          &a.gate.beta, &a.cu_seqlens, &a.initial_state, &a.final_state};
    void *bufs[12] = {0}, *ws = NULL;
    int ok = 1;
    for (int i = 0; i < 12; i++)
        bufs[i] = to_device(ts[i], &ok);
    size_t wsb = 0;
    if (ok && gdn_chunk_fwd_workspace_size(&a, &wsb) == GDN_OK && wsb && cudaMalloc(&ws, wsb) != cudaSuccess)
        ok = 0;
    a.workspace = ws;
    a.workspace_bytes = wsb;
    gdn_status st = ok ? gdn_chunk_fwd(&a) : GDN_ERR_CUDA;
    size_t no = (size_t)(c.c.B * c.c.T * c.c.HV * c.c.V) * gdn_dtype_size(c.c.dtype);
    size_t ns = (size_t)c.state_numel * gdn_dtype_size(c.c.state_dtype);
    if (st == GDN_OK && cudaDeviceSynchronize() == cudaSuccess &&
        cudaMemcpy(c.o, a.o.data, no, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(c.ht, a.final_state.data, ns, cudaMemcpyDeviceToHost) == cudaSuccess)
        printf("%-28s o %016llx state %016llx\n", name, (unsigned long long)fnv1a(c.o, no),
               (unsigned long long)fnv1a(c.ht, ns));
    else {
        printf("%-28s FAILED: %s %s\n", name, gdn_status_string(st), gdn_last_error());
        ok = 0;
    }
    for (int i = 0; i < 12; i++)
        cudaFree(bufs[i]);
    cudaFree(ws);
    tu_case_free(&c);
    return ok;
}

static tu_case_config base(int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V, uint64_t seed)
{
    tu_case_config c;
    memset(&c, 0, sizeof c);
    c.B = 1;
    c.T = T;
    c.H = H;
    c.HV = HV;
    c.K = K;
    c.V = V;
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

int main(void)
{
    if (tu_cuda_device_count() == 0) {
        printf("no CUDA device\n");
        return 0;
    }
    int ok = 1;
    ok &= run("G=1 T=300", base(300, 4, 4, 128, 128, 1));
    ok &= run("G=2 T=300", base(300, 2, 4, 128, 128, 2));
    ok &= run("G=4 T=200", base(200, 2, 8, 128, 128, 3));
    ok &= run("G=3 K=64 V=128 T=333", base(333, 2, 6, 64, 128, 4));
    tu_case_config c = base(257, 4, 16, 128, 128, 5); /* G = 4: raw gates, beta logits, f16, no norm */
    c.raw_gates = 1;
    c.allow_neg_eigval = 1;
    c.l2norm = 0;
    c.dtype = GDN_DTYPE_F16;
    ok &= run("G=4 raw f16 T=257", c);
    c = base(0, 2, 8, 128, 128, 6);
    static const int32_t lens[6] = {70, 0, 129, 1, 64, 200};
    c.nseq = 6;
    memcpy(c.seqlens, lens, sizeof lens);
    ok &= run("G=4 varlen", c);
    c = base(130, 4, 12, 128, 128, 7);
    c.B = 2;
    ok &= run("G=3 B=2 T=130", c);
    ok &= run("G=4 T=32768 (nh 2)", base(32768, 2, 8, 128, 128, 8));
    ok &= run("G=8 K=64 T=49152 (nh 4)", base(49152, 1, 8, 64, 64, 9));
    return ok ? 0 : 1;
}
