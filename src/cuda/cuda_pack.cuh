/*
 * cuda_pack.cuh - strided views to and from contiguous workspace buffers (cuda_pack.cu).
 */
#ifndef GDN_CUDA_PACK_CUH
#define GDN_CUDA_PACK_CUH

#include <cuda.h>

#include "cuda_common.cuh"

/* Whether a 16-bit [B, T, H, D] view (s = {b, t, h, d}) has what bulk copies of its rows need: unit
 * stride on the head dim, the other strides whole 16-byte multiples, a 16-byte aligned pointer. */
bool gdn_cuda_rows_aligned16(const gdn_view *v);

/* A TMA tensor map over a 16-bit [B, T, H, D] view (s = {b, t, h, d}) whose box is 64 tokens of 64
 * head-dim channels of one (b, h), written with the 128-byte swizzle (box_offset's layout, wgmma's
 * operand layout): coordinates {d, h, t, b}, rows past T read as zeros. false, with nothing
 * reported, where the view does not allow one (gdn_cuda_rows_aligned16, coordinates past int32)
 * or the driver refuses it: the kernel then copies with cp.async. */
bool gdn_cuda_tma_rows(CUtensorMap *m, const gdn_view *v, int64_t B, int64_t T, int64_t H, int64_t D);

/* The same over a contiguous [rows][cols] 16-bit matrix at base (16-byte aligned, cols a multiple
 * of 64): box of 64 rows of 64 columns, coordinates {col, row}. */
bool gdn_cuda_tma_mat(CUtensorMap *m, const void *base, gdn_dtype dtype, int64_t rows, int64_t cols);

/* The strides of a contiguous [B, T, H, D] buffer. */
static inline void contiguous_strides(int64_t T, int64_t H, int64_t D, int64_t s[4])
{
    s[3] = 1;
    s[2] = D;
    s[1] = H * D;
    s[0] = T * H * D;
}

/* Copies the [B, T, H, D] 16-bit elements of src (strides src_s, {b, t, h, d}, in elements) to dst
 * (strides dst_s), on stream. Either side may have any strides; the two must not overlap. */
gdn_status gdn_cuda_copy_view(const void *src, const int64_t src_s[4], void *dst, const int64_t dst_s[4], int64_t B,
                              int64_t T, int64_t H, int64_t D, cudaStream_t stream);

#endif /* GDN_CUDA_PACK_CUH */
