/*
 * sm90_blocks.cuh - Hopper (sm_90a) building blocks for the fused chunked prefill: mbarriers, TMA
 * 2-D tile loads with 128-byte swizzle, wgmma shared-memory descriptors, m64n64k16 bf16 wgmma in
 * SS and RS form, and the f32 accumulator -> bf16 A-operand conversion that chains products
 * through registers (prefill-design.md §4). Device code only, plus one host helper that encodes
 * a CUtensorMap through the driver entry point (no -lcuda).
 *
 * Tile convention everywhere: a "SW128 box" is 64 rows x 64 bf16 (128 bytes a row, 8 KB),
 * 1024-byte aligned, written by TMA with CU_TENSOR_MAP_SWIZZLE_128B: inside each 1024-byte group
 * of 8 rows the 16-byte chunk c of row r sits at chunk c ^ (r % 8) (sw128_offset below). A
 * 64 x 128 tile is two boxes, columns [0, 64) then [64, 128), 8 KB apart.
 *
 * Build: nvcc -gencode=arch=compute_90a,code=sm_90a (wgmma needs the "a" target).
 * Tested by test_blocks.cu beside this file; see README.md for the bit fields and sources.
 */
#pragma once

#include <cuda.h>  /* CUtensorMap and its enums: header only, nothing is linked */
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* ---------------------------------------------------------------------------------------------
 * Host: tensor map for a row-major bf16 matrix [rows, cols] (row stride row_elems elements),
 * loaded as 64 x 64 boxes with 128-byte swizzle. Out-of-bounds box elements are filled with 0.
 * Returns 0 on success, -1 when the driver entry point is missing, else the CUresult.
 * --------------------------------------------------------------------------------------------- */
static inline int sm90_make_tmap_bf16_sw128(CUtensorMap *map, const void *base, uint64_t rows,
                                            uint64_t cols, uint64_t row_elems)
{
    static PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    if (!encode) {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q;
        /* ByVersion: cudaGetDriverEntryPoint is deprecated in CUDA 13; 12000 = the ABI of the
           _v12000 prototype above. */
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !fn)
            return -1;
        encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    }
    cuuint64_t dim[2] = {cols, rows};                      /* innermost first */
    cuuint64_t stride[1] = {row_elems * 2};                /* bytes, multiple of 16 */
    cuuint32_t box[2] = {64, 64};                          /* 64 bf16 = 128 B = the swizzle span */
    cuuint32_t estride[2] = {1, 1};
    CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dim, stride, box,
                        estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return (int)r;
}

/* Byte offset of element (r, c), c < 64, inside a SW128 box (box base 1024-byte aligned). */
static __host__ __device__ __forceinline__ uint32_t sw128_offset(uint32_t r, uint32_t c)
{
    return r * 128u + ((((c >> 3) ^ r) & 7u) << 4) + ((c & 7u) << 1);
}

static __device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* ---------------------------------------------------------------------------------------------
 * mbarrier (PTX ISA §9.7.13.15). One 8-byte word in shared memory. Phase parity starts at 0:
 * the k-th completion of the barrier (k = 0, 1, ...) is waited for with parity k & 1.
 * --------------------------------------------------------------------------------------------- */
static __device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t arrivals)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(arrivals)
                 : "memory");
}

/* Make the initialised barrier visible to the async proxy (TMA) and to the cluster; follow it
   with a __syncthreads() before any thread uses the barrier. */
static __device__ __forceinline__ void mbar_fence_init(void)
{
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* One arrival that also announces tx_bytes still to come from TMA (complete_tx). */
static __device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t tx_bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
                 "r"(tx_bytes)
                 : "memory");
}

static __device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

/* True once the phase with the given parity has completed. try_wait suspends the thread for a
   hardware-chosen time before it returns false, so a loop on it is not a hot spin. */
static __device__ __forceinline__ bool mbar_try_wait(uint64_t *bar, uint32_t parity)
{
    uint32_t done;
    asm volatile("{\n\t.reg .pred p;\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
    return done != 0;
}

static __device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
    while (!mbar_try_wait(bar, parity)) {
    }
}

/* ---------------------------------------------------------------------------------------------
 * TMA (PTX ISA §9.7.9.25.5.1 cp.async.bulk.tensor). Loads the box whose first element is
 * (row, col) of the tensor map into smem_dst (1024-byte aligned for SW128) and signals
 * complete_tx on bar with the box's full byte count (out-of-bounds parts included, zero filled).
 * The map must be a __grid_constant__ kernel parameter (or in const/global memory).
 * --------------------------------------------------------------------------------------------- */
static __device__ __forceinline__ void tma_load_2d(void *smem_dst, const CUtensorMap *map,
                                                   uint64_t *bar, int32_t col, int32_t row)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_u32(smem_dst)),
                 "l"((uint64_t)map), "r"(col), "r"(row), "r"(smem_u32(bar))
                 : "memory");
}

/* Ordinary shared-memory stores (st.shared, stmatrix) that wgmma or TMA read next must be made
   visible to the async proxy: each writing thread runs this, then a barrier. */
static __device__ __forceinline__ void fence_proxy_async_smem(void)
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* ---------------------------------------------------------------------------------------------
 * wgmma shared-memory matrix descriptor (PTX ISA §9.7.15.5.1, "Matrix Descriptor Format"):
 *   bits  0-13  start address >> 4         bits 16-29  leading byte offset (LBO) >> 4
 *   bits 32-45  stride byte offset (SBO) >> 4   bits 49-51 base offset (0: atoms 1024-B aligned)
 *   bits 62-63  swizzle: 0 none, 1 = 128 B, 2 = 64 B, 3 = 32 B
 * For 128-byte swizzle, an 8-row x 128-byte "swizzle atom" is the unit; SBO is the distance
 * between consecutive 8-row groups (1024 B for our packed boxes).
 *
 * K-major (imm-trans 0): rows are M (or N), 64 bf16 of K per 128-byte row. A k16 step is
 *   +32 B on the start address inside a box (the hardware applies the swizzle to the absolute
 *   address, which is why boxes are 1024-B aligned and base offset stays 0), +8 KB to the next
 *   64-column box. LBO is unused for swizzled K-major layouts (set to 1, as CUTLASS does).
 * MN-major (imm-trans 1, B only here): rows are K, 64 bf16 of N per 128-byte row. A k16 step is
 *   16 rows = +2048 B. SBO = 1024 B between 8-row groups of K; LBO = the distance between
 *   64-wide N blocks, unused when N = 64 (set to 8 KB, what a second box would be).
 * --------------------------------------------------------------------------------------------- */
static __host__ __device__ __forceinline__ uint64_t wgmma_desc_encode(uint32_t smem_addr,
                                                                      uint32_t lbo_bytes,
                                                                      uint32_t sbo_bytes)
{
    uint64_t d = 0;
    d |= (uint64_t)((smem_addr & 0x3FFFFu) >> 4);
    d |= (uint64_t)((lbo_bytes >> 4) & 0x3FFFu) << 16;
    d |= (uint64_t)((sbo_bytes >> 4) & 0x3FFFu) << 32;
    d |= (uint64_t)1 << 62; /* 128-byte swizzle; base offset (bits 49-51) 0 */
    return d;
}

static __device__ __forceinline__ uint64_t wgmma_desc_sw128(const void *smem, uint32_t lbo_bytes,
                                                             uint32_t sbo_bytes)
{
    return wgmma_desc_encode(smem_u32(smem), lbo_bytes, sbo_bytes);
}

/* K-major 64 x K tile made of SW128 boxes (8 KB each, contiguous): descriptor of k16 step j. */
static __device__ __forceinline__ uint64_t wgmma_desc_kmajor(const void *tile, int j)
{
    const char *p = (const char *)tile + (j >> 2) * 8192 + (j & 3) * 32;
    return wgmma_desc_sw128(p, 16, 1024);
}

/* MN-major K x 64 tile (row k = 128 bytes of N, boxes of 64 k-rows contiguous): k16 step j. */
static __device__ __forceinline__ uint64_t wgmma_desc_mnmajor(const void *tile, int j)
{
    return wgmma_desc_sw128((const char *)tile + j * 2048, 8192, 1024);
}

/* Descriptor arithmetic without rebuilding: adding bytes >> 4 to the low 14 bits moves the start
   address (no carry out as long as the address stays below 256 KB). */
static __host__ __device__ __forceinline__ uint64_t wgmma_desc_advance(uint64_t desc, uint32_t bytes)
{
    return desc + (uint64_t)(bytes >> 4);
}

/* ---------------------------------------------------------------------------------------------
 * wgmma ordering (PTX ISA §9.7.15.6/7). wgmma_fence() before the first wgmma of a batch and
 * whenever the accumulator or A registers were written by ordinary instructions; commit() closes
 * a group; wait<N>() waits until at most N groups are pending. acc_fence() is a compiler-only
 * fence (CUTLASS warpgroup_fence_operand): it pins the accumulator registers so the compiler
 * does not move reads/writes of them across the async wgmma, which is what otherwise triggers
 * ptxas's "wgmma serialized" fallbacks (C7515/C7511) or wrong results.
 * --------------------------------------------------------------------------------------------- */
static __device__ __forceinline__ void wgmma_fence(void)
{
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
static __device__ __forceinline__ void wgmma_commit(void)
{
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> static __device__ __forceinline__ void wgmma_wait(void)
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
static __device__ __forceinline__ void acc_fence(float (&d)[32])
{
#pragma unroll
    for (int i = 0; i < 32; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}
static __device__ __forceinline__ void areg_fence(uint32_t (&a)[4])
{
#pragma unroll
    for (int i = 0; i < 4; i++)
        asm volatile("" : "+r"(a[i])::"memory");
}

/* ---------------------------------------------------------------------------------------------
 * Accumulator layout of m64nNk16 (f32; PTX ISA §9.7.15.5.1.1, "Register fragments"): thread t of
 * the warpgroup, w = t / 32, l = t % 32, holds for i = 0 .. N/2 - 1
 *   d[i] = D[16 w + l / 4 + 8 ((i >> 1) & 1)][8 (i >> 2) + 2 (l % 4) + (i & 1)]
 * = D[acc_row(t, i)][acc_col(t, i)].
 * A from registers (bf16, m64k16): a[0..3] each a bf16x2 (low half = lower column)
 *   a0 = A[16w + l/4][2(l%4) + {0,1}]      a1 = A[16w + l/4 + 8][2(l%4) + {0,1}]
 *   a2 = A[16w + l/4][8 + 2(l%4) + {0,1}]  a3 = A[16w + l/4 + 8][8 + 2(l%4) + {0,1}]
 * --------------------------------------------------------------------------------------------- */
static __host__ __device__ __forceinline__ int acc_row(int t, int i)
{
    return 16 * ((t & 127) >> 5) + ((t & 31) >> 2) + 8 * ((i >> 1) & 1);
}
static __host__ __device__ __forceinline__ int acc_col(int t, int i)
{
    return 8 * (i >> 2) + 2 * (t & 3) + (i & 1);
}

/* D[64x64] (+)= A[64x16] B[16x64] with A and B in shared memory. scale_d = 0 overwrites D.
   TRANS_B = 0: B is K-major (stored [N][K]); 1: B is MN-major (stored [K][N]). */
template <int TRANS_B>
static __device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a,
                                                          uint64_t desc_b, int scale_d)
{
    asm volatile("{\n\t.reg .pred p;\n\t"
                 "setp.ne.b32 p, %34, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, 0, %35;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

/* D[64x64] (+)= A[64x16] B[16x64] with A in registers (K-major by definition, layout above). */
template <int TRANS_B>
static __device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4],
                                                          uint64_t desc_b, int scale_d)
{
    asm volatile("{\n\t.reg .pred p;\n\t"
                 "setp.ne.b32 p, %37, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d),
                   "n"(TRANS_B));
}

/* Pack two f32 into bf16x2, round to nearest even; lo goes to the low half (lower column). */
static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* Chaining through registers (prefill-design.md §4): the 8 accumulators of columns
   [16 j, 16 j + 16) are, pairwise rounded, the A fragment of k-slice j of the next product
   (d[8j..8j+7] = rows {r, r+8} x columns {16j + 2q, +1, 16j + 8 + 2q, +1}). No shuffles. */
static __device__ __forceinline__ void acc_to_a_bf16(const float (&d)[32], int j, uint32_t (&a)[4])
{
    a[0] = pack_bf16x2(d[8 * j + 0], d[8 * j + 1]);
    a[1] = pack_bf16x2(d[8 * j + 2], d[8 * j + 3]);
    a[2] = pack_bf16x2(d[8 * j + 4], d[8 * j + 5]);
    a[3] = pack_bf16x2(d[8 * j + 6], d[8 * j + 7]);
}

