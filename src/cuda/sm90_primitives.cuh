/*
 * sm90_primitives.cuh - the one home of the Hopper building blocks that the CUDA kernels share:
 * shared-memory addresses, mbarriers, bulk copies (cp.async.bulk), proxy fences, programmatic
 * dependent launch, register-budget moves, the 3xTF32 split and its mma.sync m16n8k8, mma.sync
 * m16n8k16 on bf16 / f16 with ldmatrix / stmatrix, cp.async and the tile swizzle, and the
 * warpgroup MMA (wgmma) pieces: shared-memory matrix descriptors for 128-byte-swizzled tiles,
 * m64n64k16 products with A in shared memory (SS) or registers (RS) for bf16 and f16, their
 * ordering fences and the accumulator fragment map. tests/test_cuda_primitives.cu checks them on
 * the GPU against float64.
 *
 * Naming in src/cuda: types in PascalCase (Tf32Pair, ChunkParams, RecurrentParams); functions and
 * variables in snake_case; compile-time constants in UPPER_CASE (BOX_BYTES, TOKEN_CHUNK); type
 * traits in snake_case as the standard library's (is_f16); C entry points gdn_cuda_*.
 *
 * Tile convention: a "box" is 64 rows x 64 elements of 2 bytes (128 bytes a row, 8 KB), 1024-byte
 * aligned, with the 16-byte chunk c of row r stored at chunk c ^ (r % 8): the layout of TMA's
 * 128-byte swizzle, and of swz<8> below. A 64 x 128 tile is two boxes, columns
 * [0, 64) then [64, 128), 8 KB apart.
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace gdn_sm90 {

constexpr int BOX_BYTES = 64 * 64 * 2;

template <typename T> struct is_f16 { static constexpr bool value = false; };
template <> struct is_f16<__half> { static constexpr bool value = true; };

/* Byte offset of element (r, c), c < 64, inside a box. */
__host__ __device__ __forceinline__ uint32_t box_offset(uint32_t r, uint32_t c)
{
    return r * 128u + ((((c >> 3) ^ r) & 7u) << 4) + ((c & 7u) << 1);
}

/* Byte offset of element (r, c) in a tile of `rows` rows stored as stripes of 64 columns, each
 * `rows` x 128 bytes with the 128-byte swizzle (a 64-row tile: boxes side by side). */
__host__ __device__ __forceinline__ uint32_t tile_off(uint32_t rows, uint32_t r, uint32_t c)
{
    return (c >> 6) * rows * 128u + box_offset(r, c & 63u);
}

/* Descriptor (PTX ISA "Matrix Descriptor Format"): start address >> 4 in bits 0-13, leading byte
 * offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, 128-byte swizzle (1) in 62-63. */
__device__ __forceinline__ uint64_t desc_encode(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | (uint64_t)((lbo >> 4) & 0x3FFFu) << 16 |
           (uint64_t)((sbo >> 4) & 0x3FFFu) << 32 | (uint64_t)1 << 62;
}

/* Descriptors are built once from a base address and moved by adding (bytes >> 4) to the start
 * address field (no carry out while addresses stay below 256 KB): the per-product arithmetic is
 * then one add, off the wgmma issue path.
 * K-major tile (rows M or N, K contiguous, boxes of 64 K side by side): k16 step j is +32 bytes
 * inside a box, +8 KB to the next box; 1024 bytes between 8-row groups.
 * MN-major B of one box (rows K, 64 N contiguous): k16 step j is 16 rows, +2048 bytes. */
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t addr) { return desc_encode(addr, 16, 1024); }
__device__ __forceinline__ uint64_t desc_mnmajor(uint32_t addr) { return desc_encode(addr, BOX_BYTES, 1024); }
/* K-major tile of `rows` rows (stripes of 64 columns, each `rows` x 128 bytes, side by side): k16
 * step j; kmajor_step is that of a 64-row tile (one box a stripe). */
__host__ __device__ constexpr uint32_t kstep(int rows, int j) { return (uint32_t)(j >> 2) * (uint32_t)rows * 128u + (uint32_t)(j & 3) * 32u; }
__host__ __device__ constexpr uint32_t kmajor_step(int j) { return kstep(64, j); }
__host__ __device__ constexpr uint32_t mnmajor_step(int j) { return (uint32_t)j * 2048u; }
__device__ __forceinline__ uint64_t desc_add(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }

/* Compiler-only fence on accumulators: keeps ordinary reads and writes of them from moving across
 * the asynchronous wgmma (what otherwise makes ptxas serialize wgmma, warnings C7515 / C7511). */
template <int N> __device__ __forceinline__ void acc_fence(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}
template <int NT> __device__ __forceinline__ void acc_fence(float (&d)[NT][4])
{
#pragma unroll
    for (int i = 0; i < NT; i++)
        acc_fence(d[i]);
}

/* Shared-memory address (32-bit) of a generic pointer into shared memory. */
__device__ __forceinline__ uint32_t smem_u32(const void *ptr) { return (uint32_t)__cvta_generic_to_shared(ptr); }

/* mbarrier (PTX ISA "mbarrier"): one 8-byte word in shared memory; its k-th phase completion
 * (k = 0, 1, ...) is waited for with parity k & 1. Arrivals release, a completed wait acquires. */
__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t arrivals)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
/* After the inits, before the __syncthreads that publishes them. */
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
/* One arrival that also expects `bytes` of bulk copies to complete on bar. */
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
/* Expects `bytes` more of bulk copies to complete on bar, without an arrival. */
__device__ __forceinline__ void mbar_expect_bytes(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
/* try_wait suspends the thread for a hardware-chosen time before it fails, so the loop does not spin hot. */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(smem_u32(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}

/* bytes (a multiple of 16) from 16-byte aligned global src to shared dst, completing on bar. */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

/* One box of a TMA tensor map (map: the generic address of a __grid_constant__ parameter's map)
 * to shared dst, at coordinates {c0, c1, c2, c3} (2-D: {c0, c1}), completing on bar. */
__device__ __forceinline__ void tma_load_4d(void *dst, const void *map, int c0, int c1, int c2, int c3, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(
                     smem_u32(dst)),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void tma_load_2d(void *dst, const void *map, int c0, int c1, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
                     smem_u32(dst)),
                 "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar))
                 : "memory");
}

/* Shared src (a box in the map's layout) to the box of a 2-D TMA map at {c0, c1}, in this thread's
 * current bulk group; bulk_commit closes the group, bulk_wait_read waits until at most N of the
 * thread's groups still read shared memory (their global writes may still be in flight). */
__device__ __forceinline__ void tma_store_2d(const void *map, int c0, int c1, const void *src)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(map), "r"(c0), "r"(c1),
                 "r"(smem_u32(src))
                 : "memory");
}
__device__ __forceinline__ void tma_store_4d(const void *map, int c0, int c1, int c2, int c3, const void *src)
{
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];" ::"l"(map), "r"(c0),
                 "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(src))
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory"); }

/* Programmatic dependent launch: the launcher lets a kernel start while the previous grid in the
 * stream is still running; the kernel waits for that grid (and its memory) before its first
 * global access, and lets its own dependents launch at once (they wait for its completion the
 * same way). No-ops without such a launch. */
__device__ __forceinline__ void grid_dependency_sync()
{
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
}

/* Register budget per warpgroup (all four warps execute it): a producer that needs few registers
 * gives them back so that the math warpgroups can grow past the launch's even share. */
template <int N> __device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N> __device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }

/* Orders this thread's generic-proxy shared-memory accesses (st.shared, stmatrix, cp.async) with
 * later async-proxy ones (wgmma reads, bulk copies into the same bytes): each thread fences, then a
 * barrier orders the others. */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* 3xTF32: x ~ hi + lo with hi = x truncated to TF32 (low 13 mantissa bits cleared, |x - hi| <
 * 2^-10 |x|) and lo = x - hi, exact in f32; a b ~ a_hi b_hi + a_hi b_lo + a_lo b_hi with f32
 * accumulation reaches f32-class accuracy. Truncation rather than cvt.rna.tf32.f32, which sm_90
 * runs as a multi-instruction sequence; lo makes the rounding of hi irrelevant. TRUNC_LO clears
 * lo's low bits as well (the tensor cores read only its top 19 bits either way). */
struct Tf32Pair {
    uint32_t hi, lo;
};
template <bool TRUNC_LO = false> __device__ __forceinline__ Tf32Pair tf32_split(float x)
{
    const uint32_t hi = __float_as_uint(x) & 0xffffe000u;
    const uint32_t lo = __float_as_uint(x - __uint_as_float(hi));
    return Tf32Pair{hi, TRUNC_LO ? lo & 0xffffe000u : lo};
}

/* d += A B, m16n8k8 TF32 (g = lane / 4, t = lane % 4): A a0 = (g, t), a1 = (g + 8, t), a2 = (g, t + 4),
 * a3 = (g + 8, t + 4); B b0 = (t, g), b1 = (t + 4, g); d as the m16n8 f32 accumulator.
 * IN_ORDER issues the product as a volatile asm: the compiler keeps the products in program order
 * and loads their operands beside them instead of holding them in registers across products
 * (chunk_prep's inverse, which runs near its register limit). */
template <bool IN_ORDER = false>
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    if constexpr (IN_ORDER)
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ---------------------------------------------------------------------------------------------- */
/* Warp-level 16-bit MMA, ldmatrix / stmatrix, cp.async with zero fill, and the XOR swizzle of
 * shared-memory tiles that they read.
 *
 * Fragment layouts (g = lane / 4, t = lane % 4), PTX ISA "mma.m16n8k16":
 *   A 16x16 row-major: a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
 *   B 16x8  col-major: b[0] = (2t..2t+1, g), b[1] = (2t+8..2t+9, g)
 *   C 16x8:            c[0..1] = (g, 2t..2t+1), c[2..3] = (g+8, 2t..2t+1)
 * so the accumulators of n-tiles 2j and 2j+1 are, packed in pairs, the A fragment of k-slice j:
 * products chain through registers without shuffles.
 */

/* m16n8k16 on 16-bit operands: bf16 inputs use bf16 tensor-core operands, f16 inputs f16 ones;
 * pack / unpack convert an f32 pair to and from one operand register. */
template <typename T> struct Mma16;
template <> struct Mma16<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    /* bf16 is the top half of an f32: a shift and a mask (__bfloat1622float2 spends a byte
     * permute and a shift on the high half). */
    static __device__ __forceinline__ float2 unpack(uint32_t x)
    {
        return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
    }
    static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct Mma16<__half> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t x)
    {
        return __half22float2(*reinterpret_cast<__half2 *>(&x));
    }
    static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void stsm_x4(uint32_t addr, const uint32_t (&r)[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n"
                 :
                 : "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

__device__ __forceinline__ void stsm_x4_t(uint32_t addr, const uint32_t (&r)[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n"
                 :
                 : "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

/* 16-byte global -> shared copy; src_bytes = 0 fills the destination with zeros (rows past the
 * end of a sequence) without reading src, which must still be a valid address. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :
                 : "r"(smem_u32(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Element offset of (row, col) in a tile of 16-byte chunks, ROW_CHUNKS chunks per row, with the
 * chunk index XORed by the row so that ldmatrix / stmatrix over 8 consecutive rows at one column
 * touch 8 different bank groups. col must be a multiple of 8 or lie inside one chunk. */
template <int ROW_CHUNKS> __device__ __forceinline__ int swz(int row, int col)
{
    static_assert(ROW_CHUNKS == 2 || ROW_CHUNKS == 4 || ROW_CHUNKS >= 8, "row width");
    constexpr int SHIFT = ROW_CHUNKS >= 8 ? 0 : (ROW_CHUNKS == 4 ? 1 : 2);
    constexpr int MASK = ROW_CHUNKS >= 8 ? 7 : ROW_CHUNKS - 1;
    const int chunk = (col >> 3) ^ ((row >> SHIFT) & MASK);
    return row * ROW_CHUNKS * 8 + chunk * 8 + (col & 7);
}

/* Accumulator of m64n64k16 (f32): thread t of the warpgroup holds d[i] = D[row][col] with
 * row = 16 (t / 32) + (t % 32) / 4 + 8 ((i >> 1) & 1), col = 8 (i >> 2) + 2 (t % 4) + (i & 1).
 * The 8 accumulators of columns [16 j, 16 j + 16), pairwise rounded, are the A fragment of k-slice
 * j of the next product (a[0..3] = rows {r, r + 8} x columns {16 j + 2q, 16 j + 8 + 2q}). */
__device__ __forceinline__ int acc_row(int t, int i) { return 16 * ((t & 127) >> 5) + ((t & 31) >> 2) + 8 * ((i >> 1) & 1); }
__device__ __forceinline__ int acc_col(int t, int i) { return 8 * (i >> 2) + 2 * (t & 3) + (i & 1); }

/* The 8 accumulators of columns [16 j, 16 j + 16), pairwise rounded to T: the A fragment of
 * k-slice j of the next product, and the register order of stmatrix.x4. */
template <typename T> __device__ __forceinline__ void pack_frag(const float (&d)[32], int j, uint32_t (&a)[4])
{
    a[0] = Mma16<T>::pack(d[8 * j + 0], d[8 * j + 1]);
    a[1] = Mma16<T>::pack(d[8 * j + 2], d[8 * j + 3]);
    a[2] = Mma16<T>::pack(d[8 * j + 4], d[8 * j + 5]);
    a[3] = Mma16<T>::pack(d[8 * j + 6], d[8 * j + 7]);
}

/* Of a per-column vector v (a factor per token or key), the pairs that thread t's accumulators
 * 8 j .. 8 j + 3 (lo: columns 16 j + 2 (t % 4) + {0, 1}) and 8 j + 4 .. 8 j + 7 (hi: 8 columns on)
 * multiply; v 8-byte aligned. */
__device__ __forceinline__ void col_pairs(const float *v, int j, int t, float2 &lo, float2 &hi)
{
    lo = *reinterpret_cast<const float2 *>(v + 16 * j + 2 * (t & 3));
    hi = *reinterpret_cast<const float2 *>(v + 16 * j + 8 + 2 * (t & 3));
}

/* Every accumulator of KB products (a state of KB boxes of 64 columns) times g. */
template <int KB> __device__ __forceinline__ void scale_acc(float (&d)[KB][32], float g)
{
#pragma unroll
    for (int b = 0; b < KB; ++b)
#pragma unroll
        for (int i = 0; i < 32; ++i)
            d[b][i] *= g;
}

#define GDN_WGMMA_ROW(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#define GDN_WGMMA_D16 GDN_WGMMA_ROW(0), GDN_WGMMA_ROW(1), GDN_WGMMA_ROW(2), GDN_WGMMA_ROW(3)
#define GDN_WGMMA_D32 GDN_WGMMA_D16, GDN_WGMMA_ROW(4), GDN_WGMMA_ROW(5), GDN_WGMMA_ROW(6), GDN_WGMMA_ROW(7)
#define GDN_WGMMA_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define GDN_WGMMA_R32                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "   \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
/* instr: shape and types; regs, dlist: the accumulators; a, b, sc, ta, tb: the operand numbers of
 * A, B, scale_d and the two transpose flags. */
#define GDN_WGMMA_SS(instr, regs, dlist, a, b, sc, ta, tb)                                                         \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " sc ", 0;\nwgmma.mma_async.sync.aligned." instr " " regs ", " a \
                 ", " b ", p, 1, 1, " ta ", " tb ";\n}"                                                            \
                 : dlist                                                                                           \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B))

/* D[64 x 8 NT] (+)= A[64 x 16] B[16 x 8 NT], f32 accumulation, for NT = 4 (n32) or 8 (n64), with
 * d[nt][e] accumulator 4 nt + e of the map above (the layout of NT m16n8 tiles of a warp's 16 rows);
 * scale_d = 0 overwrites D. TRANS_A / TRANS_B = 0: the operand is stored K-major (A [M][K],
 * B [N][K]); 1: MN-major ([K][M], [K][N]). Both operands in shared memory. */
template <typename T, int TRANS_A, int TRANS_B, int NT>
__device__ __forceinline__ void mma_ss_n(float (&d)[NT][4], uint64_t desc_a, uint64_t desc_b, int scale_d)
{
    static_assert(NT == 4 || NT == 8, "mma_ss_n: n32 or n64");
    if constexpr (NT == 8) {
        if constexpr (is_f16<T>::value)
            GDN_WGMMA_SS("m64n64k16.f32.f16.f16", GDN_WGMMA_R32, GDN_WGMMA_D32, "%32", "%33", "%34", "%35", "%36");
        else
            GDN_WGMMA_SS("m64n64k16.f32.bf16.bf16", GDN_WGMMA_R32, GDN_WGMMA_D32, "%32", "%33", "%34", "%35", "%36");
    } else {
        if constexpr (is_f16<T>::value)
            GDN_WGMMA_SS("m64n32k16.f32.f16.f16", GDN_WGMMA_R16, GDN_WGMMA_D16, "%16", "%17", "%18", "%19", "%20");
        else
            GDN_WGMMA_SS("m64n32k16.f32.bf16.bf16", GDN_WGMMA_R16, GDN_WGMMA_D16, "%16", "%17", "%18", "%19", "%20");
    }
}

/* D[64 x 64] (+)= A[64 x 16] B[16 x 64] on d[i] = accumulator i, A K-major in shared memory. */
template <typename T, int TRANS_B>
__device__ __forceinline__ void mma_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d)
{
    mma_ss_n<T, 0, TRANS_B, 8>(reinterpret_cast<float (&)[8][4]>(d), desc_a, desc_b, scale_d);
}

/* The same with A in registers (the fragment layout above). */
template <typename T, int TRANS_B>
__device__ __forceinline__ void mma_rs(float (&dd)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d)
{
    float(&d)[8][4] = reinterpret_cast<float (&)[8][4]>(dd);
    if constexpr (is_f16<T>::value)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " GDN_WGMMA_R32
                     ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}"
                     : GDN_WGMMA_D32
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " GDN_WGMMA_R32
                     ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}"
                     : GDN_WGMMA_D32
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

/* A state of KB boxes of 64 columns (+)= A B over 64 tokens: a[j] the register A fragments of
 * k-slices j = 0 .. 3, B KB MN-major boxes from desc_b, one a box of state columns. */
template <typename T, int KB>
__device__ __forceinline__ void mma_rs_boxes(float (&s)[KB][32], const uint32_t (&a)[4][4], uint64_t desc_b)
{
#pragma unroll
    for (int b = 0; b < KB; ++b)
#pragma unroll
        for (int j = 0; j < 4; ++j)
            mma_rs<T, 1>(s[b], a[j], desc_add(desc_b, b * BOX_BYTES + mnmajor_step(j)), 1);
}

#undef GDN_WGMMA_SS
#undef GDN_WGMMA_ROW
#undef GDN_WGMMA_D16
#undef GDN_WGMMA_R16
#undef GDN_WGMMA_R32
#undef GDN_WGMMA_D32

} /* namespace gdn_sm90 */
