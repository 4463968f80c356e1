/*
 * test_blocks.cu - unit test of sm90_blocks.cuh on one Hopper GPU, against a float64 CPU
 * reference on random bf16 data, outputs poisoned with NaN before every launch.
 *   (a) TMA: 64 x 128 bf16 tiles (two SW128 boxes) into shared memory, read back through
 *       sw128_offset; one tile in bounds, one that runs past the rows and columns (zero fill).
 *   (b) SS wgmma: C[64x64] = A[64x128] B^T, A and B K-major, then B MN-major (transpose bit);
 *       operands written with ordinary stores through sw128_offset, and once more by TMA.
 *   (c) RS wgmma: A from registers (fragment layout), B K-major and MN-major.
 *   (d) Chain: C1 = A B1^T (SS), C1 -> bf16 A fragments, C2 = bf16(C1) B2^T (RS, K = 64),
 *       B2 K-major and MN-major; the reference rounds C1 to bf16 too.
 * One warpgroup (128 threads) per launch. Prints PASS/FAIL per case, the relative RMS error vs
 * float64 and the worst element; a summary line last. Exit 0 when all pass or when there is no
 * sm_90 GPU ("SKIP: ..."), 1 on any failure.
 *
 * Build: nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
 *            test_blocks.cu -o test_blocks       (no -lcuda: the tensor-map encoder is fetched
 *                                                 through cudaGetDriverEntryPointByVersion)
 */
#include "sm90_blocks.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { M = 64, N = 64, K = 128, THREADS = 128 };

/* ---------------------------------------------------------------- device side (test kernels) */

/* Bounded wait (about 2 s): a wrong expect_tx byte count would otherwise hang the test. */
static __device__ void wait_or_flag(uint64_t *bar, uint32_t parity, int *err)
{
    long long t0 = clock64();
    while (!mbar_try_wait(bar, parity))
        if (clock64() - t0 > 4000000000ll) {
            atomicExch(err, 1);
            return;
        }
}

static __device__ char *align1024(char *p)
{
    return (char *)(((uintptr_t)p + 1023) & ~(uintptr_t)1023);
}

/* Copy a row-major bf16 matrix [rows][64 * boxes] into K-major SW128 boxes (box b = columns
   [64 b, 64 b + 64), 8 KB apart) with ordinary stores. For an MN-major [K][N = 64] tile the same
   call with boxes = 1 and rows = K gives row k at k * 128 bytes, as TMA would. */
static __device__ void fill_sw128(char *tile, const uint16_t *g, int rows, int boxes)
{
    for (int e = threadIdx.x; e < rows * 64 * boxes; e += blockDim.x) {
        int r = e / (64 * boxes), c = e % (64 * boxes);
        *(uint16_t *)(tile + (c >> 6) * (rows * 128) + sw128_offset(r, c & 63)) = g[e];
    }
}

static __device__ void store_acc(const float (&d)[32], float *c)
{
#pragma unroll
    for (int i = 0; i < 32; i++)
        c[acc_row(threadIdx.x, i) * N + acc_col(threadIdx.x, i)] = d[i];
}

/* (a) TMA round trip of the 64 x 128 tile at (row0, col0). */
__global__ void __launch_bounds__(THREADS) k_tma_tile(const __grid_constant__ CUtensorMap map,
                                                      int row0, int col0, uint16_t *out, int *err)
{
    extern __shared__ char smem_raw[];
    __shared__ uint64_t bar;
    char *tile = align1024(smem_raw);
    for (int e = threadIdx.x; e < M * K; e += THREADS)
        ((uint16_t *)tile)[e] = 0x7FC1; /* NaN poison: any byte TMA does not write shows up */
    if (threadIdx.x == 0) {
        mbar_init(&bar, 1);
        mbar_fence_init();
    }
    fence_proxy_async_smem(); /* the poison stores precede TMA's writes */
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(&bar, 2 * 8192);
        tma_load_2d(tile, &map, &bar, col0, row0);
        tma_load_2d(tile + 8192, &map, &bar, col0 + 64, row0);
    }
    wait_or_flag(&bar, 0, err);
    for (int e = threadIdx.x; e < M * K; e += THREADS) {
        int r = e / K, c = e % K;
        out[e] = *(const uint16_t *)(tile + (c >> 6) * 8192 + sw128_offset(r, c & 63));
    }
}

/* (b), (c) C = A B^T with K = 128. A_REG: A from registers (RS) instead of smem (SS).
   TRANS_B: B given as Bt [K][N] (MN-major) instead of B [N][K]. USE_TMA: operands by TMA. */
template <int A_REG, int TRANS_B, int USE_TMA>
__global__ void __launch_bounds__(THREADS)
    k_gemm(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
           const uint16_t *a, const uint16_t *b, float *c, int *err)
{
    extern __shared__ char smem_raw[];
    __shared__ uint64_t bar;
    char *ta = align1024(smem_raw);
    char *tb = ta + M * K * 2;
    if (USE_TMA) {
        if (threadIdx.x == 0) {
            mbar_init(&bar, 1);
            mbar_fence_init();
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            mbar_arrive_expect_tx(&bar, (A_REG ? 2 : 4) * 8192);
            if (!A_REG) {
                tma_load_2d(ta, &map_a, &bar, 0, 0);
                tma_load_2d(ta + 8192, &map_a, &bar, 64, 0);
            }
            if (TRANS_B) { /* Bt [128][64]: boxes of 64 k-rows */
                tma_load_2d(tb, &map_b, &bar, 0, 0);
                tma_load_2d(tb + 8192, &map_b, &bar, 0, 64);
            } else {
                tma_load_2d(tb, &map_b, &bar, 0, 0);
                tma_load_2d(tb + 8192, &map_b, &bar, 64, 0);
            }
        }
        wait_or_flag(&bar, 0, err);
    } else {
        if (!A_REG)
            fill_sw128(ta, a, M, 2);
        if (TRANS_B)
            fill_sw128(tb, b, K, 1);
        else
            fill_sw128(tb, b, N, 2);
        fence_proxy_async_smem(); /* generic-proxy stores, async-proxy (wgmma) reads */
        __syncthreads();
    }

    float d[32];
#pragma unroll
    for (int i = 0; i < 32; i++)
        d[i] = 0.f;
    uint32_t ar[K / 16][4];
    if (A_REG) {
        int t = threadIdx.x, r = 16 * (t >> 5) + ((t & 31) >> 2), q = t & 3;
#pragma unroll
        for (int j = 0; j < K / 16; j++) {
            ar[j][0] = *(const uint32_t *)(a + r * K + 16 * j + 2 * q);
            ar[j][1] = *(const uint32_t *)(a + (r + 8) * K + 16 * j + 2 * q);
            ar[j][2] = *(const uint32_t *)(a + r * K + 16 * j + 8 + 2 * q);
            ar[j][3] = *(const uint32_t *)(a + (r + 8) * K + 16 * j + 8 + 2 * q);
        }
#pragma unroll
        for (int j = 0; j < K / 16; j++)
            areg_fence(ar[j]);
    }
    acc_fence(d);
    wgmma_fence();
    const uint64_t da0 = wgmma_desc_kmajor(ta, 0);
#pragma unroll
    for (int j = 0; j < K / 16; j++) {
        /* K-major B through descriptor arithmetic, MN-major B through the step helper */
        uint64_t db = TRANS_B ? wgmma_desc_mnmajor(tb, j)
                              : wgmma_desc_advance(wgmma_desc_kmajor(tb, 0), (j >> 2) * 8192 + (j & 3) * 32);
        if (A_REG)
            wgmma_m64n64k16_rs<TRANS_B>(d, ar[j], db, 1);
        else
            wgmma_m64n64k16_ss<TRANS_B>(d, wgmma_desc_advance(da0, (j >> 2) * 8192 + (j & 3) * 32),
                                        db, 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    acc_fence(d);
    store_acc(d, c);
}

/* (d) C1 = A B1^T (SS, K = 128, first step with scale_d = 0, no zeroing), then
   C2 = bf16(C1) B2^T (RS, K = 64) with B2 [N][64] or, TRANS_B2, B2t [64][N]. */
template <int TRANS_B2>
__global__ void __launch_bounds__(THREADS)
    k_chain(const uint16_t *a, const uint16_t *b1, const uint16_t *b2, float *c2)
{
    extern __shared__ char smem_raw[];
    char *ta = align1024(smem_raw);
    char *tb1 = ta + M * K * 2;
    char *tb2 = tb1 + N * K * 2;
    fill_sw128(ta, a, M, 2);
    fill_sw128(tb1, b1, N, 2);
    fill_sw128(tb2, b2, 64, 1); /* [N][64] K-major or [64][N] MN-major: one box either way */
    fence_proxy_async_smem();
    __syncthreads();

    float d1[32], d2[32];
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < K / 16; j++)
        wgmma_m64n64k16_ss<0>(d1, wgmma_desc_kmajor(ta, j), wgmma_desc_kmajor(tb1, j), j > 0);
    wgmma_commit();
    wgmma_wait<0>();
    acc_fence(d1);

    uint32_t ar[4][4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        acc_to_a_bf16(d1, j, ar[j]);
        areg_fence(ar[j]);
    }
    wgmma_fence(); /* A registers were written by ordinary instructions */
#pragma unroll
    for (int j = 0; j < 4; j++)
        wgmma_m64n64k16_rs<TRANS_B2>(d2, ar[j], TRANS_B2 ? wgmma_desc_mnmajor(tb2, j)
                                                         : wgmma_desc_kmajor(tb2, j), j > 0);
    wgmma_commit();
    wgmma_wait<0>();
    acc_fence(d2);
    store_acc(d2, c2);
}

/* ---------------------------------------------------------------- host side */

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float urand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (2.0 / 16777216.0) - 1.0);
}
static uint16_t f2bf(double x) /* round to nearest even (no NaN inputs here) */
{
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static double bf2f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void fill_rand(uint16_t *x, int n)
{
    for (int i = 0; i < n; i++)
        x[i] = f2bf(urand());
}

static int n_pass, n_fail;

/* Relative RMS error of got vs ref (float64), the worst element and its coordinates. */
static void report(const char *name, const float *got, const double *ref, int rows, int cols,
                   double tol, int dev_err)
{
    double se = 0, sr = 0, worst = -1;
    int wi = 0, bad = 0;
    for (int i = 0; i < rows * cols; i++) {
        double g = got[i], e = fabs(g - ref[i]);
        if (!isfinite(g)) {
            bad++;
            e = INFINITY;
        }
        if (e > worst) {
            worst = e;
            wi = i;
        }
        se += isfinite(e) ? e * e : 0;
        sr += ref[i] * ref[i];
    }
    double rel = sr > 0 ? sqrt(se / sr) : sqrt(se);
    int ok = !bad && !dev_err && rel <= tol;
    printf("%-4s %-40s rel_rms %.2e (tol %.0e)  worst |err| %.3e at [%d][%d] (got %.6g ref %.6g)%s%s\n",
           ok ? "PASS" : "FAIL", name, rel, tol, worst, wi / cols, wi % cols, got[wi], ref[wi],
           bad ? "  non-finite outputs (unwritten poison?)" : "", dev_err ? "  mbarrier wait timed out" : "");
    ok ? n_pass++ : n_fail++;
}

static int h_err(int *d_err)
{
    int e;
    CK(cudaMemcpy(&e, d_err, sizeof e, cudaMemcpyDeviceToHost));
    CK(cudaMemset(d_err, 0, sizeof e));
    return e;
}

/* C[m][n] = sum_k A[m][k] B[n][k] in float64 (B logical [N][kk]). */
static void ref_gemm(const double *a, const double *b, double *c, int kk)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < kk; k++)
                s += a[m * kk + k] * b[n * kk + k];
            c[m * N + n] = s;
        }
}

static void test_tma(int *d_err)
{
    const int rows = 200, cols = 136, pitch = 192; /* pitch * 2 bytes: multiple of 16 */
    uint16_t *h = (uint16_t *)malloc(rows * pitch * 2), *hout = (uint16_t *)malloc(M * K * 2);
    fill_rand(h, rows * pitch);
    for (int r = 0; r < rows; r++)
        for (int c = cols; c < pitch; c++)
            h[r * pitch + c] = f2bf(1e30); /* padding: must never be loaded */
    uint16_t *dx, *dout;
    CK(cudaMalloc(&dx, rows * pitch * 2));
    CK(cudaMalloc(&dout, M * K * 2));
    CK(cudaMemcpy(dx, h, rows * pitch * 2, cudaMemcpyHostToDevice));
    CUtensorMap map;
    int rc = sm90_make_tmap_bf16_sw128(&map, dx, rows, cols, pitch);
    const int at[2][2] = {{8, 0}, {160, 64}}; /* second: rows 200.., columns 136.. zero filled */
    if (rc) {
        printf("FAIL tma: cuTensorMapEncodeTiled returned %d\n", rc);
        n_fail += 2;
    }
    for (int t = 0; t < 2 && !rc; t++) {
        CK(cudaMemset(dout, 0xFF, M * K * 2));
        k_tma_tile<<<1, THREADS, M * K * 2 + 1024>>>(map, at[t][0], at[t][1], dout, d_err);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hout, dout, M * K * 2, cudaMemcpyDeviceToHost));
        int mism = 0, first = -1;
        for (int i = 0; i < M * K; i++) {
            int r = at[t][0] + i / K, c = at[t][1] + i % K;
            uint16_t want = (r < rows && c < cols) ? h[r * pitch + c] : 0;
            if (hout[i] != want) {
                mism++;
                if (first < 0)
                    first = i;
            }
        }
        int e = h_err(d_err);
        char name[80];
        snprintf(name, sizeof name, "tma 64x128 tile at (%d, %d)%s", at[t][0], at[t][1],
                 t ? " past the edges" : "");
        if (!mism && !e) {
            printf("PASS %-40s bit-exact\n", name);
            n_pass++;
        } else {
            printf("FAIL %-40s %d of %d elements differ%s", name, mism, M * K,
                   e ? ", mbarrier wait timed out" : "");
            if (first >= 0)
                printf("; first [%d][%d] got 0x%04x want 0x%04x", first / K, first % K, hout[first],
                       (at[t][0] + first / K < rows && at[t][1] + first % K < cols)
                           ? h[(at[t][0] + first / K) * pitch + at[t][1] + first % K]
                           : 0);
            printf("\n");
            n_fail++;
        }
    }
    CK(cudaFree(dx));
    CK(cudaFree(dout));
    free(h);
    free(hout);
}

static void test_gemms(int *d_err)
{
    static uint16_t ha[M * K], hb[N * K], hbt[K * N];
    static double ra[M * K], rb[N * K], ref[M * N];
    static float got[M * N];
    fill_rand(ha, M * K);
    fill_rand(hb, N * K);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            hbt[k * N + n] = hb[n * K + k];
    for (int i = 0; i < M * K; i++)
        ra[i] = bf2f(ha[i]);
    for (int i = 0; i < N * K; i++)
        rb[i] = bf2f(hb[i]);
    ref_gemm(ra, rb, ref, K);

    uint16_t *da, *db, *dbt;
    float *dc;
    CK(cudaMalloc(&da, sizeof ha));
    CK(cudaMalloc(&db, sizeof hb));
    CK(cudaMalloc(&dbt, sizeof hbt));
    CK(cudaMalloc(&dc, sizeof got));
    CK(cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dbt, hbt, sizeof hbt, cudaMemcpyHostToDevice));
    CUtensorMap ma, mb, mbt;
    int rc = sm90_make_tmap_bf16_sw128(&ma, da, M, K, K) | sm90_make_tmap_bf16_sw128(&mb, db, N, K, K) |
             sm90_make_tmap_bf16_sw128(&mbt, dbt, K, N, N);
    if (rc)
        printf("note: tensor map encoding failed (%d); the TMA-fed case will fail\n", rc);

    const size_t smem = 2 * M * K * 2 + 1024;
    const double tol = 1e-4; /* bf16 products are exact in f32; only f32 summation error remains */
    struct {
        const char *name;
        void (*k)(CUtensorMap, CUtensorMap, const uint16_t *, const uint16_t *, float *, int *);
        int trans;
    } cs[] = {
        {"ss  A K-major, B K-major", k_gemm<0, 0, 0>, 0},
        {"ss  A K-major, B MN-major (trans-b)", k_gemm<0, 1, 0>, 1},
        {"ss  A, B K-major, both loaded by TMA", k_gemm<0, 0, 1>, 0},
        {"ss  B MN-major loaded by TMA", k_gemm<0, 1, 1>, 1},
        {"rs  A regs, B K-major", k_gemm<1, 0, 0>, 0},
        {"rs  A regs, B MN-major (trans-b)", k_gemm<1, 1, 0>, 1},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        CK(cudaMemset(dc, 0xFF, sizeof got));
        cs[i].k<<<1, THREADS, smem>>>(ma, cs[i].trans ? mbt : mb, da, cs[i].trans ? dbt : db, dc,
                                      d_err);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got, dc, sizeof got, cudaMemcpyDeviceToHost));
        report(cs[i].name, got, ref, M, N, tol, h_err(d_err));
    }
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dbt));
    CK(cudaFree(dc));
}

static void test_chain(int *d_err)
{
    enum { K2 = 64 };
    static uint16_t ha[M * K], hb1[N * K], hb2[N * K2], hb2t[K2 * N];
    static double ra[M * K], rb1[N * K], rb2[N * K2], c1[M * N], p[M * K2], ref[M * N], ref_nr[M * N];
    static float got[M * N];
    fill_rand(ha, M * K);
    fill_rand(hb1, N * K);
    fill_rand(hb2, N * K2);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K2; k++)
            hb2t[k * N + n] = hb2[n * K2 + k];
    for (int i = 0; i < M * K; i++)
        ra[i] = bf2f(ha[i]);
    for (int i = 0; i < N * K; i++)
        rb1[i] = bf2f(hb1[i]);
    for (int i = 0; i < N * K2; i++)
        rb2[i] = bf2f(hb2[i]);
    ref_gemm(ra, rb1, c1, K);
    ref_gemm(c1, rb2, ref_nr, K2); /* no intermediate rounding: shows the tolerance is tight */
    for (int i = 0; i < M * K2; i++)
        p[i] = bf2f(f2bf(c1[i]));
    ref_gemm(p, rb2, ref, K2);
    double se = 0, sr = 0;
    for (int i = 0; i < M * N; i++) {
        se += (ref_nr[i] - ref[i]) * (ref_nr[i] - ref[i]);
        sr += ref[i] * ref[i];
    }
    printf("info chain: skipping the bf16 rounding of C1 would give rel_rms %.2e\n", sqrt(se / sr));

    uint16_t *da, *db1, *db2, *db2t;
    float *dc;
    CK(cudaMalloc(&da, sizeof ha));
    CK(cudaMalloc(&db1, sizeof hb1));
    CK(cudaMalloc(&db2, sizeof hb2));
    CK(cudaMalloc(&db2t, sizeof hb2t));
    CK(cudaMalloc(&dc, sizeof got));
    CK(cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db1, hb1, sizeof hb1, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db2, hb2, sizeof hb2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db2t, hb2t, sizeof hb2t, cudaMemcpyHostToDevice));
    const size_t smem = (M * K + N * K + N * K2) * 2 + 1024;
    /* GPU rounds C1 from f32, the reference from f64: a rare 1-ulp difference in a few P entries */
    const double tol = 5e-4;
    for (int t = 0; t < 2; t++) {
        CK(cudaMemset(dc, 0xFF, sizeof got));
        if (t)
            k_chain<1><<<1, THREADS, smem>>>(da, db1, db2t, dc);
        else
            k_chain<0><<<1, THREADS, smem>>>(da, db1, db2, dc);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got, dc, sizeof got, cudaMemcpyDeviceToHost));
        report(t ? "chain acc->bf16 A regs, B2 MN-major" : "chain acc->bf16 A regs, B2 K-major", got,
               ref, M, N, tol, h_err(d_err));
    }
    CK(cudaFree(da));
    CK(cudaFree(db1));
    CK(cudaFree(db2));
    CK(cudaFree(db2t));
    CK(cudaFree(dc));
}

/* Host-only checks of the index arithmetic (run with or without a GPU). */
static void test_host_layouts(void)
{
    int bad = 0;
    /* descriptor fields: start >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45, swizzle 62-63 */
    uint64_t d = wgmma_desc_encode(0x1A400u, 16, 1024);
    bad += (d & 0x3FFF) != (0x1A400u >> 4) || ((d >> 16) & 0x3FFF) != 1 || ((d >> 32) & 0x3FFF) != 64 ||
           ((d >> 49) & 7) != 0 || (d >> 62) != 1;
    /* advance == re-encode at the moved address, over every k16 step of a 64 x 128 tile */
    for (int j = 0; j < 8; j++)
        bad += wgmma_desc_advance(d, (j >> 2) * 8192 + (j & 3) * 32) !=
               wgmma_desc_encode(0x1A400u + (j >> 2) * 8192 + (j & 3) * 32, 16, 1024);
    /* sw128_offset: the byte address bits [4,7) XOR bits [7,10), a bijection on a box */
    static unsigned char seen[8192];
    memset(seen, 0, sizeof seen);
    for (int r = 0; r < 64; r++)
        for (int c = 0; c < 64; c++) {
            uint32_t lin = r * 128 + c * 2, o = sw128_offset(r, c);
            bad += o != (lin ^ (((lin >> 7) & 7) << 4));
            bad += o >= 8192 || seen[o]++;
        }
    /* accumulator map covers 64 x 64 once; d[8j..8j+7] of a thread sit exactly where the RS
       A fragment of k-slice j wants them (a_m = rows r, r+8 and columns 2q, 8+2q of the slice) */
    static unsigned char hit[64 * 64];
    memset(hit, 0, sizeof hit);
    for (int t = 0; t < 128; t++)
        for (int i = 0; i < 32; i++) {
            int r = acc_row(t, i), c = acc_col(t, i);
            bad += hit[r * 64 + c]++ != 0;
            int m = (i & 7) >> 1, ar = 16 * (t >> 5) + ((t & 31) >> 2) + 8 * (m & 1),
                ac = 16 * (i >> 3) + 8 * (m >> 1) + 2 * (t & 3) + (i & 1);
            bad += r != ar || c != ac;
        }
    for (int i = 0; i < 64 * 64; i++)
        bad += hit[i] != 1;
    printf("%s host layout checks (descriptor fields and advance, sw128_offset, fragment maps)%s\n",
           bad ? "FAIL" : "PASS", "");
    bad ? n_fail++ : n_pass++;
}

int main(void)
{
    test_host_layouts();
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("SKIP: no GPU\n");
        return n_fail ? 1 : 0;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major != 9 || prop.minor != 0) {
        printf("SKIP: %s is sm_%d%d, these blocks need sm_90a\n", prop.name, prop.major, prop.minor);
        return n_fail ? 1 : 0;
    }
    printf("device: %s\n", prop.name);
    int *d_err;
    CK(cudaMalloc(&d_err, sizeof(int)));
    CK(cudaMemset(d_err, 0, sizeof(int)));
    test_tma(d_err);
    test_gemms(d_err);
    test_chain(d_err);
    CK(cudaFree(d_err));
    printf("summary: %d passed, %d failed%s\n", n_pass, n_fail, n_fail ? "" : " - all blocks OK");
    return n_fail ? 1 : 0;
}
