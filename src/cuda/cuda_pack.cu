/*
 * cuda_pack.cu - copies between a [B, T, H, D] view with any strides and a contiguous buffer, for
 * ops whose fast kernels need unit stride on the head dim and 16-byte aligned rows.
 *
 * One CTA moves a 64 x 64 (token, channel) tile of one (b, h) through shared memory, so both the
 * reads and the writes run along whichever of the two dims has the smaller stride on their side:
 * a v sliced from a transposed [B, C, T] projection (unit stride on the tokens) is read along the
 * tokens and written along the channels, both coalesced.
 */
#include "cuda_pack.cuh"

#include <cudaTypedefs.h>

namespace gdn_pack {

constexpr int THREADS_X = 32, THREADS_Y = 8;

struct PackParams {
    const uint16_t *src;
    uint16_t *dst;
    int64_t src_s[4], dst_s[4]; /* {b, t, h, d} */
    int64_t T, H, D;
    int64_t t_tiles;            /* ceil(T / TT) */
    int src_mode, dst_mode;     /* access_mode() of each side */
};

/* Pair e of a thread's share of a tile whose fast dim has F elements: lane l takes elements 2l and
 * 2l + 1 of a strip of 64 along the fast dim; strips, then rows THREADS_Y apart, follow. */
template <int F>
__device__ __forceinline__ void tile_pair(int e, int &fast, int &slow)
{
    const int lin = 2 * threadIdx.x + 64 * e;
    fast = lin % F;
    slow = threadIdx.y + THREADS_Y * (lin / F);
}

/* Global -> shared, reading along the tokens (T_FAST) or the channels; VEC: the fast dim has unit
 * stride and every pair is 4-byte aligned, so a pair is one 32-bit load. Every load is issued
 * before the first store to shared memory, so each thread keeps all of its loads in flight. */
template <int TT, int TD, bool T_FAST, bool VEC>
__device__ __forceinline__ void load_tile(uint16_t *tile, const uint16_t *src, const int64_t *s, int64_t nt,
                                          int64_t nd)
{
    constexpr int PAIRS = TT * TD / (2 * THREADS_X * THREADS_Y);
    const int64_t sf = T_FAST ? s[1] : s[3], sw = T_FAST ? s[3] : s[1]; /* fast, slow strides */
    const int64_t nf = T_FAST ? nt : nd, nw = T_FAST ? nd : nt;
    uint32_t x[PAIRS];
#pragma unroll
    for (int e = 0; e < PAIRS; ++e) {
        int f, w;
        tile_pair<T_FAST ? TT : TD>(e, f, w);
        const uint16_t *at = src + f * sf + w * sw;
        x[e] = 0;
        if (w < nw) {
            if (VEC && f + 1 < nf)
                x[e] = *reinterpret_cast<const uint32_t *>(at);
            else
                x[e] = (f < nf ? at[0] : 0u) | (f + 1 < nf ? (uint32_t)at[sf] << 16 : 0u);
        }
    }
#pragma unroll
    for (int e = 0; e < PAIRS; ++e) {
        int f, w;
        tile_pair<T_FAST ? TT : TD>(e, f, w);
        const int i = T_FAST ? f : w, j = T_FAST ? w : f; /* token, channel of the pair's first */
        tile[i * (TD + 1) + j] = (uint16_t)x[e];
        tile[(i + T_FAST) * (TD + 1) + j + !T_FAST] = (uint16_t)(x[e] >> 16);
    }
}

template <int TT, int TD, bool T_FAST, bool VEC>
__device__ __forceinline__ void store_tile(const uint16_t *tile, uint16_t *dst, const int64_t *s, int64_t nt,
                                           int64_t nd)
{
    constexpr int PAIRS = TT * TD / (2 * THREADS_X * THREADS_Y);
    const int64_t sf = T_FAST ? s[1] : s[3], sw = T_FAST ? s[3] : s[1];
    const int64_t nf = T_FAST ? nt : nd, nw = T_FAST ? nd : nt;
#pragma unroll
    for (int e = 0; e < PAIRS; ++e) {
        int f, w;
        tile_pair<T_FAST ? TT : TD>(e, f, w);
        if (w >= nw || f >= nf)
            continue;
        const int i = T_FAST ? f : w, j = T_FAST ? w : f;
        const uint16_t lo = tile[i * (TD + 1) + j], hi = tile[(i + T_FAST) * (TD + 1) + j + !T_FAST];
        uint16_t *at = dst + f * sf + w * sw;
        if (VEC && f + 1 < nf) {
            *reinterpret_cast<uint32_t *>(at) = lo | (uint32_t)hi << 16;
        } else {
            at[0] = lo;
            if (f + 1 < nf)
                at[sf] = hi;
        }
    }
}

/* A TT x TD (token, channel) tile per CTA; blockIdx.x: (b, h, token tile), blockIdx.y: channel tile.
 * Elements move as 16-bit words: the ops only pack bf16 / f16 tensors. The tile's row pitch TD + 1
 * is odd, so a column (one channel) spreads over all 32 banks. */
template <int TT, int TD>
__global__ void __launch_bounds__(THREADS_X * THREADS_Y) pack_kernel(const PackParams p)
{
    static_assert(TT % 64 == 0 && TD % 64 == 0, "a warp covers 64 elements of either dim");
    __shared__ uint16_t tile[TT * (TD + 1)]; /* [token][channel] */
    const int64_t tt = blockIdx.x % p.t_tiles, bh = blockIdx.x / p.t_tiles;
    const int64_t h = bh % p.H, b = bh / p.H;
    const int64_t t0 = tt * TT, d0 = (int64_t)blockIdx.y * TD;
    const int64_t nt = p.T - t0, nd = p.D - d0; /* the tile's valid extent (may exceed it) */
    const uint16_t *src = p.src + b * p.src_s[0] + h * p.src_s[2] + t0 * p.src_s[1] + d0 * p.src_s[3];
    uint16_t *dst = p.dst + b * p.dst_s[0] + h * p.dst_s[2] + t0 * p.dst_s[1] + d0 * p.dst_s[3];
    switch (p.src_mode) {
    case 0: load_tile<TT, TD, false, false>(tile, src, p.src_s, nt, nd); break;
    case 1: load_tile<TT, TD, false, true>(tile, src, p.src_s, nt, nd); break;
    case 2: load_tile<TT, TD, true, false>(tile, src, p.src_s, nt, nd); break;
    default: load_tile<TT, TD, true, true>(tile, src, p.src_s, nt, nd); break;
    }
    __syncthreads();
    switch (p.dst_mode) {
    case 0: store_tile<TT, TD, false, false>(tile, dst, p.dst_s, nt, nd); break;
    case 1: store_tile<TT, TD, false, true>(tile, dst, p.dst_s, nt, nd); break;
    case 2: store_tile<TT, TD, true, false>(tile, dst, p.dst_s, nt, nd); break;
    default: store_tile<TT, TD, true, true>(tile, dst, p.dst_s, nt, nd); break;
    }
}

/* How a side is walked: bit 1 set when along the tokens (the token stride is the smaller of the
 * two), bit 0 when a pair along that dim is one aligned 32-bit access (unit stride, and every pair's
 * address 4-byte aligned: an aligned base and even strides elsewhere; tile origins are even). */
static int access_mode(const void *base, const int64_t s[4])
{
    const bool t_fast = s[1] < s[3];
    const int64_t slow = t_fast ? s[3] : s[1];
    const bool vec = (t_fast ? s[1] : s[3]) == 1 && (uintptr_t)base % 4 == 0 && s[0] % 2 == 0 && s[2] % 2 == 0 &&
                     slow % 2 == 0;
    return 2 * t_fast + vec;
}

template <int TT, int TD>
gdn_status launch_pack(const void *src, const int64_t src_s[4], void *dst, const int64_t dst_s[4], int64_t B,
                       int64_t T, int64_t H, int64_t D, cudaStream_t stream)
{
    PackParams p;
    p.src = static_cast<const uint16_t *>(src);
    p.dst = static_cast<uint16_t *>(dst);
    for (int i = 0; i < 4; ++i) {
        p.src_s[i] = src_s[i];
        p.dst_s[i] = dst_s[i];
    }
    p.T = T;
    p.H = H;
    p.D = D;
    p.t_tiles = (T + TT - 1) / TT;
    p.src_mode = access_mode(src, src_s);
    p.dst_mode = access_mode(dst, dst_s);
    const int64_t bx = B * H * p.t_tiles, by = (D + TD - 1) / TD;
    if (bx > INT32_MAX || by > 65535)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "packing a [%lld, %lld, %lld, %lld] view: grid too large",
                             (long long)B, (long long)T, (long long)H, (long long)D);
    pack_kernel<TT, TD><<<dim3((unsigned)bx, (unsigned)by), dim3(THREADS_X, THREADS_Y), 0, stream>>>(p);
    return gdn_cuda_check(cudaGetLastError(), "pack_kernel launch");
}

} /* namespace gdn_pack */

gdn_status gdn_cuda_copy_view(const void *src, const int64_t src_s[4], void *dst, const int64_t dst_s[4], int64_t B,
                              int64_t T, int64_t H, int64_t D, cudaStream_t stream)
{
    if (B == 0 || T == 0 || H == 0 || D == 0)
        return GDN_OK;
    return gdn_pack::launch_pack<64, 64>(src, src_s, dst, dst_s, B, T, H, D, stream);
}

bool gdn_cuda_rows_aligned16(const gdn_view *v)
{
    if (v->s[3] != 1 || (uintptr_t)v->data % 16 != 0)
        return false;
    for (int i = 0; i < 3; ++i)
        if (v->s[i] % 8 != 0)
            return false;
    return true;
}

/* cuTensorMapEncodeTiled through the runtime's driver entry point (the library links no libcuda);
 * NULL where the driver has none. */
static PFN_cuTensorMapEncodeTiled_v12000 tma_encoder()
{
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            f = nullptr;
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    }();
    return fn;
}

static bool tma_encode(CUtensorMap *m, gdn_dtype dtype, void *base, int rank, const cuuint64_t *dims,
                       const cuuint64_t *strides, const cuuint32_t *box)
{
    const PFN_cuTensorMapEncodeTiled_v12000 enc = tma_encoder();
    if (!enc || (dtype != GDN_DTYPE_BF16 && dtype != GDN_DTYPE_F16))
        return false;
    const cuuint32_t ones[4] = {1, 1, 1, 1};
    return enc(m, dtype == GDN_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, rank, base,
               dims, strides, box, ones, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool gdn_cuda_tma_rows(CUtensorMap *m, const gdn_view *v, int64_t B, int64_t T, int64_t H, int64_t D)
{
    /* The driver takes nonzero strides that are 16-byte multiples below 2^40; box coordinates are
     * signed 32-bit. */
    if (!gdn_cuda_rows_aligned16(v) || D % 64 != 0 || B < 1 || T < 1 || H < 1 || B > INT32_MAX || T > INT32_MAX ||
        H > INT32_MAX || D > INT32_MAX)
        return false;
    /* A dim of one element takes any legal stride: that of the contiguous layout. */
    const int64_t st[3] = {H > 1 ? v->s[2] : D, T > 1 ? v->s[1] : H * D, B > 1 ? v->s[0] : T * H * D};
    cuuint64_t strides[3];
    for (int i = 0; i < 3; ++i) {
        if (st[i] <= 0 || st[i] * 2 >= ((int64_t)1 << 40))
            return false;
        strides[i] = (cuuint64_t)(st[i] * 2);
    }
    const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)H, (cuuint64_t)T, (cuuint64_t)B};
    const cuuint32_t box[4] = {64, 1, 64, 1};
    return tma_encode(m, v->dtype, v->data, 4, dims, strides, box);
}

bool gdn_cuda_tma_mat(CUtensorMap *m, const void *base, gdn_dtype dtype, int64_t rows, int64_t cols)
{
    if ((uintptr_t)base % 16 != 0 || rows < 1 || rows > INT32_MAX || cols < 64 || cols % 64 != 0 || cols > INT32_MAX)
        return false;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)cols * 2};
    const cuuint32_t box[2] = {64, 64};
    return tma_encode(m, dtype, const_cast<void *>(base), 2, dims, strides, box);
}
