/*
 * sm90_mma_tiles.cuh - warp products on 16-bit tiles in shared memory with mma.sync m16n8k16 (f32
 * accumulators), for kernels whose operands change roles from product to product (the chunked
 * backward): one warp owns 16 rows of every result, and any tile can be read as A or B, in either
 * orientation, by ldmatrix (.trans for the transposed reads).
 *
 * Tiles are row-major with a row pitch LD (elements) of an odd number of 16-byte chunks: the
 * eight 16-byte rows of each ldmatrix read then fall in distinct bank groups. An accumulator acc[nt][e] of a warp holds
 * row m0 + g + 8 (e >> 1), column n0 + 8 nt + 2 t + (e & 1), with g = lane / 4, t = lane % 4.
 */
#ifndef GDN_SM90_MMA_TILES_CUH
#define GDN_SM90_MMA_TILES_CUH

#include "sm90_primitives.cuh"

namespace gdn_tiles {

using gdn_sm90::ldsm_x4;
using gdn_sm90::ldsm_x4_t;
using gdn_sm90::Mma16;
using gdn_sm90::smem_u32;

/* The pitch of a tile of `cols` 16-bit columns: 8 more (16 bytes), see above. */
template <int COLS> struct Pitch {
    static constexpr int LD = COLS + 8;
    static_assert((LD * 2) % 32 == 16, "pitch: an odd number of 16-byte chunks");
};

/* A fragment (16 x 16) at rows m0, columns k0 of A stored [m][k] (AT = false) or [k][m] (AT). */
template <typename T, int LD, bool AT>
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], const T *A, int m0, int k0, int lane)
{
    if (AT)
        ldsm_x4_t(a, smem_u32(A + (k0 + (lane & 7) + (lane >> 4) * 8) * LD + m0 + ((lane >> 3) & 1) * 8));
    else
        ldsm_x4(a, smem_u32(A + (m0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + k0 + (lane >> 4) * 8));
}

/* B fragments of two n8 tiles (n0 and n0 + 8; b[0..1] and b[2..3]) over k0 .. k0 + 15, of B
 * stored [n][k] (BNK) or [k][n]. */
template <typename T, int LD, bool BNK>
__device__ __forceinline__ void frag_b(uint32_t (&b)[4], const T *B, int n0, int k0, int lane)
{
    if (BNK)
        ldsm_x4(b, smem_u32(B + (n0 + (lane & 7) + (lane >> 4) * 8) * LD + k0 + ((lane >> 3) & 1) * 8));
    else
        ldsm_x4_t(b, smem_u32(B + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n0 + (lane >> 4) * 8));
}

/* acc += A[m0 .. m0 + 15][0 .. KD) B[0 .. KD)[n0 .. n0 + 8 NT). */
template <typename T, int NT, int KD, bool AT, bool BNK, int LDA, int LDB>
__device__ __forceinline__ void warp_mm(float (&acc)[NT][4], const T *A, int m0, const T *B, int n0, int lane)
{
    static_assert(NT % 2 == 0 && KD % 16 == 0, "warp_mm: n in pairs of n8 tiles, k in k16 steps");
#pragma unroll 2
    for (int k0 = 0; k0 < KD; k0 += 16) {
        uint32_t a[4];
        frag_a<T, LDA, AT>(a, A, m0, k0, lane);
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
            uint32_t b[4];
            frag_b<T, LDB, BNK>(b, B, n0 + 8 * nt, k0, lane);
            Mma16<T>::mma(acc[nt], a, b[0], b[1]);
            Mma16<T>::mma(acc[nt + 1], a, b[2], b[3]);
        }
    }
}

/* The same with A in registers: af[j] is the A fragment of k-slice j (to_afrag). */
template <typename T, int NT, int KD, bool BNK, int LDB>
__device__ __forceinline__ void warp_mm_r(float (&acc)[NT][4], const uint32_t (&af)[KD / 16][4], const T *B, int n0,
                                          int lane)
{
#pragma unroll
    for (int kk = 0; kk < KD / 16; ++kk)
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
            uint32_t b[4];
            frag_b<T, LDB, BNK>(b, B, n0 + 8 * nt, 16 * kk, lane);
            Mma16<T>::mma(acc[nt], af[kk], b[0], b[1]);
            Mma16<T>::mma(acc[nt + 1], af[kk], b[2], b[3]);
        }
}

/* An accumulator (16 x 8 NT) as the A operand of a product over its columns, the rows scaled by
 * s0 (row g) and s1 (row g + 8): n8 tiles 2j and 2j + 1 are k-slice j (no data movement). */
template <typename T, int NT>
__device__ __forceinline__ void to_afrag(uint32_t (&af)[NT / 2][4], const float (&acc)[NT][4], float s0, float s1)
{
#pragma unroll
    for (int j = 0; j < NT / 2; ++j) {
        af[j][0] = Mma16<T>::pack(s0 * acc[2 * j][0], s0 * acc[2 * j][1]);
        af[j][1] = Mma16<T>::pack(s1 * acc[2 * j][2], s1 * acc[2 * j][3]);
        af[j][2] = Mma16<T>::pack(s0 * acc[2 * j + 1][0], s0 * acc[2 * j + 1][1]);
        af[j][3] = Mma16<T>::pack(s1 * acc[2 * j + 1][2], s1 * acc[2 * j + 1][3]);
    }
}

/* Stores an accumulator to a 16-bit tile (rows m0 + g, m0 + g + 8 scaled by s0, s1). */
template <typename T, int NT, int LD>
__device__ __forceinline__ void store_acc(T *dst, const float (&acc)[NT][4], int m0, int lane, float s0, float s1)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        *reinterpret_cast<uint32_t *>(dst + (m0 + g) * LD + 8 * nt + 2 * t) =
            Mma16<T>::pack(s0 * acc[nt][0], s0 * acc[nt][1]);
        *reinterpret_cast<uint32_t *>(dst + (m0 + g + 8) * LD + 8 * nt + 2 * t) =
            Mma16<T>::pack(s1 * acc[nt][2], s1 * acc[nt][3]);
    }
}

template <int NT> __device__ __forceinline__ void zero_acc(float (&acc)[NT][4])
{
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
}

/* Sums a value over the four lanes of a row (t = 0 .. 3): the row's full total in each. */
__device__ __forceinline__ float row_sum4(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

} /* namespace gdn_tiles */

#endif /* GDN_SM90_MMA_TILES_CUH */
