/*
 * cuda_pack.cu - copies between a [B, T, H, D] view with any strides and a contiguous buffer, for
 * ops whose fast kernels need unit stride on the head dim and 16-byte aligned rows.
 *
 * One CTA moves a 32 x 32 (token, channel) tile of one (b, h) through shared memory, so both the
 * reads and the writes run along whichever of the two dims has the smaller stride on their side:
 * a v sliced from a transposed [B, C, T] projection (unit stride on the tokens) is read along the
 * tokens and written along the channels, both coalesced.
 */
#include "cuda_pack.cuh"

namespace {

constexpr int TILE = 32;
constexpr int ROWS = 8; /* threadIdx.y extent: each thread moves TILE / ROWS elements per phase */

struct PackParams {
    const uint16_t *src;
    uint16_t *dst;
    int64_t src_s[4], dst_s[4]; /* {b, t, h, d} */
    int64_t T, H, D;
    int64_t t_tiles;            /* ceil(T / TILE) */
    int src_t_fast, dst_t_fast; /* the token stride is the smaller of (token, channel) on that side */
};

/* blockIdx.x: (b, h, token tile), blockIdx.y: channel tile. Elements are moved as 16-bit words: the
 * ops only pack bf16 / f16 tensors. */
__global__ void __launch_bounds__(TILE * ROWS) pack_kernel(const PackParams p)
{
    __shared__ uint16_t tile[TILE][TILE + 1]; /* [token][channel]; the pad keeps columns conflict-free */
    const int64_t tt = blockIdx.x % p.t_tiles, bh = blockIdx.x / p.t_tiles;
    const int64_t h = bh % p.H, b = bh / p.H;
    const int64_t t0 = tt * TILE, d0 = (int64_t)blockIdx.y * TILE;
    const uint16_t *src = p.src + b * p.src_s[0] + h * p.src_s[2];
    uint16_t *dst = p.dst + b * p.dst_s[0] + h * p.dst_s[2];
    for (int r = threadIdx.y; r < TILE; r += ROWS) {
        const int i = p.src_t_fast ? threadIdx.x : r, j = p.src_t_fast ? r : threadIdx.x; /* token, channel */
        if (t0 + i < p.T && d0 + j < p.D)
            tile[i][j] = src[(t0 + i) * p.src_s[1] + (d0 + j) * p.src_s[3]];
    }
    __syncthreads();
    for (int r = threadIdx.y; r < TILE; r += ROWS) {
        const int i = p.dst_t_fast ? threadIdx.x : r, j = p.dst_t_fast ? r : threadIdx.x;
        if (t0 + i < p.T && d0 + j < p.D)
            dst[(t0 + i) * p.dst_s[1] + (d0 + j) * p.dst_s[3]] = tile[i][j];
    }
}

} /* namespace */

gdn_status gdn_cuda_copy_view(const void *src, const int64_t src_s[4], void *dst, const int64_t dst_s[4], int64_t B,
                              int64_t T, int64_t H, int64_t D, cudaStream_t stream)
{
    if (B == 0 || T == 0 || H == 0 || D == 0)
        return GDN_OK;
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
    p.t_tiles = (T + TILE - 1) / TILE;
    p.src_t_fast = src_s[1] < src_s[3];
    p.dst_t_fast = dst_s[1] < dst_s[3];
    const int64_t bx = B * H * p.t_tiles, by = (D + TILE - 1) / TILE;
    if (bx > INT32_MAX || by > 65535)
        return gdn_set_error(GDN_ERR_UNSUPPORTED, "packing a [%lld, %lld, %lld, %lld] view: grid too large",
                             (long long)B, (long long)T, (long long)H, (long long)D);
    pack_kernel<<<dim3((unsigned)bx, (unsigned)by), dim3(TILE, ROWS), 0, stream>>>(p);
    return gdn_cuda_check(cudaGetLastError(), "pack_kernel launch");
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
