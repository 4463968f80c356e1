/*
 * test_cuda_primitives.cu - the Hopper building blocks of src/cuda/sm90_primitives.cuh and the
 * gate formulas of src/cuda/cuda_gate.cuh, each in a small kernel against a host reference:
 *   bulk_copy  mbarrier + cp.async.bulk of 4 KB into shared memory, read back exactly
 *   mbarrier   four phases of 128 arrivals, each waited for with its parity
 *   tf32       3xTF32 (tf32_split, mma_tf32) of a 16 x 8 x 8 product against float64
 *   mma16      m16n8k16 bf16 mma.sync (Mma16) on tiles brought by cp_async16 (with zero fill) into
 *              the swz<2> layout and read by ldsm_x4; the bf16 result through Mma16::pack and
 *              stsm_x4, against float64 and the host's rounding
 *   wgmma      m64n64k16 bf16 wgmma, A and B in 128-byte-swizzled boxes through descriptors, and
 *              the accumulator fragment map, against float64
 *   gate       gate_log_decay / gate_beta bitwise equal to the gating op (gdn_gating on CUDA)
 * Skips (and passes) without a GPU.
 *   build/tests/test_cuda_primitives [name substring ...]
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_gate.cuh"
#include "cuda/sm90_primitives.cuh"
extern "C" {
#include "test_util.h"
}

using namespace gdn_sm90;

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            tu_expect(0, "%s: %s", #call, cudaGetErrorString(e_));                                 \
            return TU_FAIL;                                                                        \
        }                                                                                          \
    } while (0)

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (tu_cuda_device_count() == 0) {                                                         \
            tu_skip_reason("no CUDA device");                                                      \
            return TU_SKIP;                                                                        \
        }                                                                                          \
    } while (0)

/* ------------------------------------------------------------------------------------------ */

constexpr int COPY_BYTES = 4096;

__global__ void bulk_copy_kernel(const uint32_t *src, uint32_t *dst)
{
    __shared__ __align__(128) uint32_t buf[COPY_BYTES / 4];
    __shared__ __align__(8) uint64_t bar;
    if (threadIdx.x == 0) {
        mbar_init(&bar, 1);
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_expect_tx(&bar, COPY_BYTES);
        bulk_load(buf, src, COPY_BYTES, &bar);
    }
    mbar_wait(&bar, 0);
    for (int i = threadIdx.x; i < COPY_BYTES / 4; i += blockDim.x)
        dst[i] = buf[COPY_BYTES / 4 - 1 - i]; /* reversed: the data went through shared memory */
}

static int test_bulk_copy(void)
{
    NEED_GPU();
    uint32_t h[COPY_BYTES / 4], out[COPY_BYTES / 4];
    tu_rng r = tu_rng_make(1);
    for (int i = 0; i < COPY_BYTES / 4; i++)
        h[i] = (uint32_t)tu_rng_u64(&r);
    uint32_t *ds, *dd;
    CK(cudaMalloc(&ds, COPY_BYTES));
    CK(cudaMalloc(&dd, COPY_BYTES));
    CK(cudaMemcpy(ds, h, COPY_BYTES, cudaMemcpyHostToDevice));
    CK(cudaMemset(dd, 0xff, COPY_BYTES));
    bulk_copy_kernel<<<1, 128>>>(ds, dd);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, dd, COPY_BYTES, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < COPY_BYTES / 4; i++)
        bad += out[i] != h[COPY_BYTES / 4 - 1 - i];
    tu_expect(bad == 0, "bulk_copy: %d of %d words differ", bad, COPY_BYTES / 4);
    cudaFree(ds);
    cudaFree(dd);
    return TU_PASS;
}

/* ------------------------------------------------------------------------------------------ */

constexpr int PHASES = 4;

/* Each phase: every thread adds to its slot, arrives, waits for the phase; then thread t checks
 * that every thread's slot of this phase is written (an early wait would see a stale slot). */
__global__ void mbarrier_kernel(int *errors)
{
    __shared__ __align__(8) uint64_t bar;
    __shared__ int slot[128];
    if (threadIdx.x == 0) {
        mbar_init(&bar, blockDim.x);
        mbar_fence_init();
    }
    slot[threadIdx.x] = -1;
    __syncthreads();
    for (int k = 0; k < PHASES; k++) {
        slot[threadIdx.x] = k;
        mbar_arrive(&bar);
        mbar_wait(&bar, k & 1);
        const int other = slot[(threadIdx.x + 37) % blockDim.x];
        if (other < k)
            atomicAdd(errors, 1);
        __syncthreads(); /* nobody writes phase k + 1 before everyone read phase k */
    }
}

static int test_mbarrier(void)
{
    NEED_GPU();
    int *d, h = -1;
    CK(cudaMalloc(&d, sizeof(int)));
    CK(cudaMemset(d, 0, sizeof(int)));
    mbarrier_kernel<<<1, 128>>>(d);
    CK(cudaGetLastError());
    CK(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost));
    tu_expect(h == 0, "mbarrier: %d reads of a slot before its phase completed", h);
    cudaFree(d);
    return TU_PASS;
}

/* ------------------------------------------------------------------------------------------ */

/* D (16 x 8) = A (16 x 8) B (8 x 8), row-major f32, one warp, 3xTF32 in the fragment layout of
 * mma_tf32's comment. */
__global__ void tf32_kernel(const float *A, const float *B, float *D)
{
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    const Tf32Pair a0 = tf32_split(A[g * 8 + t]), a1 = tf32_split(A[(g + 8) * 8 + t]);
    const Tf32Pair a2 = tf32_split(A[g * 8 + t + 4]), a3 = tf32_split(A[(g + 8) * 8 + t + 4]);
    const Tf32Pair b0 = tf32_split(B[t * 8 + g]), b1 = tf32_split(B[(t + 4) * 8 + g]);
    const uint32_t ah[4] = {a0.hi, a1.hi, a2.hi, a3.hi}, al[4] = {a0.lo, a1.lo, a2.lo, a3.lo};
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    mma_tf32(d, al, b0.hi, b1.hi);
    mma_tf32(d, ah, b0.lo, b1.lo);
    mma_tf32(d, ah, b0.hi, b1.hi);
    /* C fragment: c0, c1 = (g, 2t .. 2t + 1), c2, c3 = (g + 8, 2t .. 2t + 1) */
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2];
    D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

static int test_tf32(void)
{
    NEED_GPU();
    float hA[128], hB[64], hD[128];
    double ref[128];
    tu_rng r = tu_rng_make(2);
    tu_fill_normal(hA, 128, &r, 0.f, 1.f);
    tu_fill_normal(hB, 64, &r, 0.f, 1.f);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            double s = 0;
            for (int k = 0; k < 8; k++)
                s += (double)hA[i * 8 + k] * hB[k * 8 + j];
            ref[i * 8 + j] = s;
        }
    float *dA, *dB, *dD;
    CK(cudaMalloc(&dA, sizeof hA));
    CK(cudaMalloc(&dB, sizeof hB));
    CK(cudaMalloc(&dD, sizeof hD));
    CK(cudaMemcpy(dA, hA, sizeof hA, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, hB, sizeof hB, cudaMemcpyHostToDevice));
    tf32_kernel<<<1, 32>>>(dA, dB, dD);
    CK(cudaGetLastError());
    CK(cudaMemcpy(hD, dD, sizeof hD, cudaMemcpyDeviceToHost));
    /* one TF32 product alone is off by ~1e-3 relative; three reach f32-class accuracy */
    tu_check("3xTF32 16x8x8", tu_compare(hD, GDN_DTYPE_F32, ref, GDN_DTYPE_F64, 128), 1e-5);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dD);
    return TU_PASS;
}

/* ------------------------------------------------------------------------------------------ */

/* D (64 x 64) = A (64 x 16) B^T, B stored [64 n][16 k]: one warpgroup, both operands K-major in
 * one swizzled box each (columns 16 .. 63 zero), one m64n64k16 wgmma, D through acc_row / acc_col. */
__global__ void wgmma_kernel(const __nv_bfloat16 *A, const __nv_bfloat16 *B, float *D)
{
    __shared__ __align__(1024) unsigned char sa[BOX_BYTES];
    __shared__ __align__(1024) unsigned char sb[BOX_BYTES];
    const int t = threadIdx.x;
    for (int i = t; i < 64 * 64; i += 128) {
        const int row = i / 64, col = i % 64;
        const __nv_bfloat16 zero = __float2bfloat16(0.f);
        *reinterpret_cast<__nv_bfloat16 *>(sa + box_offset(row, col)) = col < 16 ? A[row * 16 + col] : zero;
        *reinterpret_cast<__nv_bfloat16 *>(sb + box_offset(row, col)) = col < 16 ? B[row * 16 + col] : zero;
    }
    fence_proxy_async();
    __syncthreads();
    float d[32];
#pragma unroll
    for (int i = 0; i < 32; i++)
        d[i] = 0.f;
    fence();
    mma_ss<__nv_bfloat16, 0>(d, desc_kmajor(smem_u32(sa)), desc_kmajor(smem_u32(sb)), 0);
    commit();
    wait<0>();
    acc_fence(d);
#pragma unroll
    for (int i = 0; i < 32; i++)
        D[acc_row(t, i) * 64 + acc_col(t, i)] = d[i];
}

static int test_wgmma(void)
{
    NEED_GPU();
    int major = 0;
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    if (major != 9) {
        tu_skip_reason("wgmma needs sm_90");
        return TU_SKIP;
    }
    float fa[64 * 16], fb[64 * 16], hD[64 * 64];
    uint16_t ha[64 * 16], hb[64 * 16];
    double ref[64 * 64];
    tu_rng r = tu_rng_make(3);
    tu_fill_normal(fa, 64 * 16, &r, 0.f, 1.f);
    tu_fill_normal(fb, 64 * 16, &r, 0.f, 1.f);
    float ra[64 * 16], rb[64 * 16]; /* the bf16 values as f32 */
    gdn_f32_to_bf16(fa, ha, 64 * 16);
    gdn_f32_to_bf16(fb, hb, 64 * 16);
    gdn_bf16_to_f32(ha, ra, 64 * 16);
    gdn_bf16_to_f32(hb, rb, 64 * 16);
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < 64; n++) {
            double s = 0;
            for (int k = 0; k < 16; k++)
                s += (double)ra[m * 16 + k] * rb[n * 16 + k];
            ref[m * 64 + n] = s;
        }
    __nv_bfloat16 *dA, *dB;
    float *dD;
    CK(cudaMalloc(&dA, sizeof ha));
    CK(cudaMalloc(&dB, sizeof hb));
    CK(cudaMalloc(&dD, sizeof hD));
    CK(cudaMemcpy(dA, ha, sizeof ha, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, hb, sizeof hb, cudaMemcpyHostToDevice));
    CK(cudaMemset(dD, 0xff, sizeof hD)); /* NaN: an element the fragment map misses fails */
    wgmma_kernel<<<1, 128>>>(dA, dB, dD);
    CK(cudaGetLastError());
    CK(cudaMemcpy(hD, dD, sizeof hD, cudaMemcpyDeviceToHost));
    /* bf16 products are exact in f32: only the f32 sums of 16 round */
    tu_check("wgmma m64n64k16 bf16", tu_compare(hD, GDN_DTYPE_F32, ref, GDN_DTYPE_F64, 64 * 64), 1e-6);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dD);
    return TU_PASS;
}

/* ------------------------------------------------------------------------------------------ */

/* D (16 x 16) = A (16 x 16) B^T with B stored [16 n][16 k], one warp, bf16: cp_async16 brings A and
 * B into swizzled tiles (swz<2>), a 17th row of B with src_bytes = 0 must arrive as zeros;
 * ldsm_x4 loads the fragments, two Mma16 products give D's two 8-column halves. D goes out in f32,
 * and its bf16 rounding through Mma16::pack and stsm_x4 (the C fragments of n-tiles 0 and 1 are an
 * A fragment), which must equal the host's rounding of the f32 D bitwise. */
__global__ void mma16_kernel(const __nv_bfloat16 *A, const __nv_bfloat16 *B, float *D, __nv_bfloat16 *Dh,
                             uint32_t *zero_row)
{
    __shared__ __align__(128) __nv_bfloat16 As[16 * 16], Bs[17 * 16], Ds[16 * 16];
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4, m = lane / 8, r8 = lane % 8;
    for (int i = 0; i < 17 * 16; i++)
        if (i % 32 == lane)
            Bs[i] = __float2bfloat16(-1.f); /* poison: the zero-filled row must overwrite it */
    __syncwarp();
    {
        const int row = lane / 2, col = (lane % 2) * 8;
        cp_async16(As + swz<2>(row, col), A + row * 16 + col, 16);
        cp_async16(Bs + swz<2>(row, col), B + row * 16 + col, 16);
        if (lane < 2)
            cp_async16(Bs + 16 * 16 + swz<2>(0, col), B, 0);
        cp_async_commit();
        cp_async_wait<0>();
    }
    __syncwarp();
    uint32_t a[4], b[4];
    ldsm_x4(a, smem_u32(As + swz<2>((m & 1) * 8 + r8, (m >> 1) * 8)));
    ldsm_x4(b, smem_u32(Bs + swz<2>((m >> 1) * 8 + r8, (m & 1) * 8)));
    float c0[4] = {0.f, 0.f, 0.f, 0.f}, c1[4] = {0.f, 0.f, 0.f, 0.f};
    Mma16<__nv_bfloat16>::mma(c0, a, b[0], b[1]);
    Mma16<__nv_bfloat16>::mma(c1, a, b[2], b[3]);
    const float *c[2] = {c0, c1};
    for (int h = 0; h < 2; h++) {
        D[g * 16 + 8 * h + 2 * t] = c[h][0];
        D[g * 16 + 8 * h + 2 * t + 1] = c[h][1];
        D[(g + 8) * 16 + 8 * h + 2 * t] = c[h][2];
        D[(g + 8) * 16 + 8 * h + 2 * t + 1] = c[h][3];
    }
    const uint32_t d16[4] = {Mma16<__nv_bfloat16>::pack(c0[0], c0[1]), Mma16<__nv_bfloat16>::pack(c0[2], c0[3]),
                             Mma16<__nv_bfloat16>::pack(c1[0], c1[1]), Mma16<__nv_bfloat16>::pack(c1[2], c1[3])};
    stsm_x4(smem_u32(Ds + swz<2>((m & 1) * 8 + r8, (m >> 1) * 8)), d16);
    __syncwarp();
    for (int i = lane; i < 256; i += 32)
        Dh[i] = Ds[swz<2>(i / 16, i % 16)];
    if (lane < 8)
        zero_row[lane] = reinterpret_cast<const uint32_t *>(Bs + 16 * 16)[lane];
}

static int test_mma16(void)
{
    NEED_GPU();
    float fa[256], fb[256], ra[256], rb[256], hD[256];
    uint16_t ha[256], hb[256], hDh[256], want[256];
    uint32_t zero_row[8];
    double ref[256];
    tu_rng r = tu_rng_make(4);
    tu_fill_normal(fa, 256, &r, 0.f, 1.f);
    tu_fill_normal(fb, 256, &r, 0.f, 1.f);
    gdn_f32_to_bf16(fa, ha, 256);
    gdn_f32_to_bf16(fb, hb, 256);
    gdn_bf16_to_f32(ha, ra, 256);
    gdn_bf16_to_f32(hb, rb, 256);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            double s = 0;
            for (int k = 0; k < 16; k++)
                s += (double)ra[i * 16 + k] * rb[j * 16 + k];
            ref[i * 16 + j] = s;
        }
    __nv_bfloat16 *dA, *dB, *dDh;
    float *dD;
    uint32_t *dz;
    CK(cudaMalloc(&dA, sizeof ha));
    CK(cudaMalloc(&dB, sizeof hb));
    CK(cudaMalloc(&dD, sizeof hD));
    CK(cudaMalloc(&dDh, sizeof hDh));
    CK(cudaMalloc(&dz, sizeof zero_row));
    CK(cudaMemcpy(dA, ha, sizeof ha, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, hb, sizeof hb, cudaMemcpyHostToDevice));
    CK(cudaMemset(dD, 0xff, sizeof hD));
    CK(cudaMemset(dDh, 0xff, sizeof hDh));
    CK(cudaMemset(dz, 0xff, sizeof zero_row));
    mma16_kernel<<<1, 32>>>(dA, dB, dD, dDh, dz);
    CK(cudaGetLastError());
    CK(cudaMemcpy(hD, dD, sizeof hD, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hDh, dDh, sizeof hDh, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(zero_row, dz, sizeof zero_row, cudaMemcpyDeviceToHost));
    tu_check("mma.sync m16n8k16 bf16 (cp.async, ldmatrix)", tu_compare(hD, GDN_DTYPE_F32, ref, GDN_DTYPE_F64, 256),
             1e-6);
    gdn_f32_to_bf16(hD, want, 256);
    tu_expect(tu_same_bytes(hDh, want, sizeof want), "Mma16::pack + stmatrix: D in bf16 differs from its rounding");
    int zeros = 1;
    for (int i = 0; i < 8; i++)
        zeros &= zero_row[i] == 0u;
    tu_expect(zeros, "cp_async16 with src_bytes = 0 did not zero-fill its 16 bytes");
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dD);
    cudaFree(dDh);
    cudaFree(dz);
    return TU_PASS;
}

/* ------------------------------------------------------------------------------------------ */

/* g and beta of n tokens of one head from the shared formulas, as chunk_prep and the recurrent
 * kernels call them. */
__global__ void gate_kernel(const float *a, const float *b, float A_log, float dt_bias, float beta_sp, float thr,
                            int neg, int n, float *g, float *beta)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        g[i] = gate_log_decay(a[i], dt_bias, A_log, beta_sp, thr);
        beta[i] = gate_beta(b[i], neg);
    }
}

static int test_gate(void)
{
    NEED_GPU();
    enum { N = 4096 };
    static float ha[N], hb[N], g_op[N], b_op[N], g_f[N], b_f[N];
    tu_rng r = tu_rng_make(4);
    tu_fill_normal(ha, N, &r, 0.f, 8.f); /* both softplus branches: beta_sp x above and below 20 */
    tu_fill_normal(hb, N, &r, 0.f, 4.f);
    ha[0] = 30.f, ha[1] = -30.f, hb[0] = 100.f, hb[1] = -100.f;
    for (int neg = 0; neg < 2; neg++) {
        const float A_log = 0.37f, dt = -0.25f, beta_sp = 1.5f, thr = 20.f;
        float *d, *dA_log, *ddt;
        CK(cudaMalloc(&d, 6 * N * sizeof(float)));
        CK(cudaMalloc(&dA_log, sizeof(float)));
        CK(cudaMalloc(&ddt, sizeof(float)));
        float *da = d, *db = d + N, *dg = d + 2 * N, *dbeta = d + 3 * N, *dg2 = d + 4 * N, *dbeta2 = d + 5 * N;
        CK(cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dA_log, &A_log, sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(ddt, &dt, sizeof(float), cudaMemcpyHostToDevice));

        const int64_t shape[3] = {1, N, 1}, hshape[1] = {1};
        gdn_gating_args x;
        memset(&x, 0, sizeof x);
        x.kind = GDN_GATE_GDN;
        x.a = tu_tensor(da, GDN_DTYPE_F32, 3, shape);
        x.A_log = tu_tensor(dA_log, GDN_DTYPE_F32, 1, hshape);
        x.dt_bias = tu_tensor(ddt, GDN_DTYPE_F32, 1, hshape);
        x.softplus_beta = beta_sp;
        x.softplus_threshold = thr;
        x.g_out = tu_tensor(dg, GDN_DTYPE_F32, 3, shape);
        x.b = tu_tensor(db, GDN_DTYPE_F32, 3, shape);
        x.allow_neg_eigval = neg;
        x.beta_out = tu_tensor(dbeta, GDN_DTYPE_F32, 3, shape);
        x.a.device = x.A_log.device = x.dt_bias.device = x.g_out.device = GDN_DEVICE_CUDA;
        x.b.device = x.beta_out.device = GDN_DEVICE_CUDA;
        const gdn_status st = gdn_gating(&x);
        tu_expect(st == GDN_OK, "gdn_gating: %s", gdn_last_error());
        gate_kernel<<<8, 256>>>(da, db, A_log, dt, beta_sp, thr, neg, N, dg2, dbeta2);
        CK(cudaGetLastError());
        CK(cudaMemcpy(g_op, dg, sizeof g_op, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b_op, dbeta, sizeof b_op, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(g_f, dg2, sizeof g_f, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b_f, dbeta2, sizeof b_f, cudaMemcpyDeviceToHost));
        tu_expect(tu_same_bytes(g_op, g_f, sizeof g_op), "g: gating op and gate_log_decay differ (neg %d)", neg);
        tu_expect(tu_same_bytes(b_op, b_f, sizeof b_op), "beta: gating op and gate_beta differ (neg %d)", neg);
        cudaFree(d);
        cudaFree(dA_log);
        cudaFree(ddt);
    }
    return TU_PASS;
}

int main(int argc, char **argv)
{
    static const tu_test tests[] = {
        {"bulk_copy", test_bulk_copy}, {"mbarrier", test_mbarrier}, {"tf32", test_tf32},
        {"wgmma", test_wgmma},         {"mma16", test_mma16},       {"gate", test_gate},
    };
    return tu_main(tests, TU_COUNT(tests), argc, argv);
}
