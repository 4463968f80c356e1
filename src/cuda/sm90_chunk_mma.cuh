/*
 * sm90_chunk_mma.cuh - warp-level tensor-core and copy primitives of the chunked forward:
 * mma.sync m16n8k16 (bf16 / f16 operands, f32 accumulators), ldmatrix / stmatrix, cp.async with
 * zero fill, and the XOR swizzle of the shared-memory tiles.
 *
 * Fragment layouts (g = lane / 4, t = lane % 4), PTX ISA "mma.m16n8k16":
 *   A 16x16 row-major: a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
 *   B 16x8  col-major: b[0] = (2t..2t+1, g), b[1] = (2t+8..2t+9, g)
 *   C 16x8:            c[0..1] = (g, 2t..2t+1), c[2..3] = (g+8, 2t..2t+1)
 * so the accumulators of n-tiles 2j and 2j+1 are, packed in pairs, the A fragment of k-slice j:
 * products chain through registers without shuffles.
 */
#ifndef GDN_SM90_CHUNK_MMA_CUH
#define GDN_SM90_CHUNK_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace gdn_chunk {

/* Operand type traits: bf16 inputs use bf16 tensor-core operands, f16 inputs f16 ones. */
template <typename T> struct op;
template <> struct op<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t x)
    {
        return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&x));
    }
    static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct op<__half> {
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

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

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

} /* namespace gdn_chunk */

#endif /* GDN_SM90_CHUNK_MMA_CUH */
