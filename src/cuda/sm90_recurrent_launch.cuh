/*
 * sm90_recurrent_launch.cuh - the host-side launch rules of the recurrent forward kernels: the
 * tile (rows and warps per CTA) of each bulk-copy path by problem size, when to launch with
 * programmatic dependent launch, and the kernels' shared-memory attributes. Used by the launcher
 * (sm90_recurrent_fwd.cu) and by the tile sweeps in dev/decode, which time the alternatives the
 * rules choose between; the measurements behind each rule are in dev/decode/README.md.
 */
#ifndef GDN_SM90_RECURRENT_LAUNCH_CUH
#define GDN_SM90_RECURRENT_LAUNCH_CUH

#include "sm90_recurrent_mma.cuh"

namespace {

/* The fast path wants several state tiles per SM: ask for the largest shared-memory carveout
 * once per instance (a function attribute, not a stream operation: safe under graph capture). */
template <int K, typename StateT, typename InT, int RPL, bool KDA = false, int TILE = tile_rows<K, StateT, KDA>(),
          int TC = TOKEN_CHUNK, bool BOUNDED = false>
cudaError_t prefer_shared_tma_kernel()
{
    static const cudaError_t err =
        cudaFuncSetAttribute(recurrent_fwd_tma_kernel<K, StateT, InT, RPL, KDA, TILE, TC, BOUNDED>,
                             cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared);
    return err;
}

/* The fast path's launch shape: tile rows per CTA (at most max_rows, the instance's static tile)
 * and warps per CTA. The largest tile that still gives about two CTAs per SM. Two warps per CTA
 * for one-token calls (more CTAs fit per SM; their instance's tile is half the size), four
 * otherwise (the token loop is compute; bf16 tiles hold twice the rows). */
struct TmaTile {
    int rows, warps;
};

/* Calls of one token per sequence (varlen: at most one on average). */
inline bool one_token(int64_t N, int64_t T, bool varlen) { return varlen ? T <= N : T == 1; }

template <int K, typename StateT, bool KDA = false>
TmaTile tma_tile(int64_t N, int64_t HV, int64_t V, int64_t T, bool varlen, int max_rows = tile_rows<K, StateT, KDA>())
{
    constexpr int ROWS_PER_WARP = 4 * default_rows_per_lane<K, StateT>();
    int rows = max_rows;
    /* bf16 state, two tokens: from 2048 (sequence, head) pairs on, half the tile spreads the
     * token loops over more CTAs */
    if (sizeof(StateT) == 2 && !varlen && T == 2 && N * HV >= 2048)
        rows /= 2;
    while (rows > ROWS_PER_WARP && N * HV * ((V + rows - 1) / rows) < 256)
        rows /= 2;
    const int64_t v_rounded = (V + ROWS_PER_WARP - 1) / ROWS_PER_WARP * ROWS_PER_WARP;
    if (rows > v_rounded)
        rows = (int)v_rounded;
    int warps = one_token(N, T, varlen) ? 2 : 4;
    if (warps > rows / ROWS_PER_WARP)
        warps = rows / ROWS_PER_WARP;
    return TmaTile{rows, warps};
}

/* KDA's one-token calls take the register-bounded instance (ten CTAs an SM instead of eight) once
 * their grid of `ctas` is more than three waves at eight: there it keeps more state bytes in flight
 * an SM, while on smaller grids the cap only lengthens each CTA's token loop (and the bf16-state
 * instance spills under it); the measurements behind the boundary are in dev/decode/README.md. */
inline bool one_token_bounded(int64_t ctas, int sms) { return ctas > 24 * (int64_t)sms; }

/* Programmatic dependent launch (the kernel's launch overlaps the end of the previous kernel in
 * the stream; grid_dependency_sync) for a fast-path grid of `ctas` CTAs on `sms` SMs: it pays for
 * grids of at most two CTAs per SM and for grids of more than one wave; in between the next call's
 * CTAs take the free places early and end up spread unevenly. */
inline bool tma_use_pdl(int64_t ctas, int sms)
{
    return ctas <= 2 * (int64_t)sms || ctas > 6 * (int64_t)sms;
}

/* Launch shape of the tensor-core path: rows per CTA and warps (one per 16 rows, at most
 * mma_max_warps). 4 warps of 64 rows for f32 at every batch (the stage and the chunk's small
 * products are paid per CTA, so smaller tiles cost more); bf16 takes 128 rows (two passes per
 * warp) from 1024 (sequence, head) pairs on, 64 below; the wide instance 8 warps of 128 rows at
 * every batch (it holds two CTAs per SM whatever their rows). */
template <int K, typename StateT, bool WIDE = false> TmaTile mma_tile(int64_t N, int64_t HV, int64_t V)
{
    int rows = mma_tile_rows<K, StateT, WIDE>();
    if (!WIDE && N * HV < 1024 && rows > 64)
        rows = 64;
    const int64_t v_rounded = (V + MMA_ROWS - 1) / MMA_ROWS * MMA_ROWS;
    if (rows > v_rounded)
        rows = (int)v_rounded;
    return TmaTile{rows, mma_warps<WIDE>(rows)};
}

/* The path's shared memory is dynamic (over 48 KB): raise the limit and ask for the largest
 * carveout (function attributes: safe under graph capture); prepare_mma_kernel does it once per
 * instance. */
template <int K, typename StateT, typename InT, bool KDA = false, bool WIDE = false, int TC = TOKEN_CHUNK>
cudaError_t set_mma_kernel_attributes()
{
    const cudaError_t e = cudaFuncSetAttribute(recurrent_fwd_mma_kernel<K, StateT, InT, KDA, WIDE, TC>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)mma_smem_bytes<K, StateT, KDA, WIDE, TC>());
    if (e != cudaSuccess)
        return e;
    return cudaFuncSetAttribute(recurrent_fwd_mma_kernel<K, StateT, InT, KDA, WIDE, TC>,
                                cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared);
}

template <int K, typename StateT, typename InT, bool KDA = false, bool WIDE = false, int TC = TOKEN_CHUNK>
cudaError_t prepare_mma_kernel()
{
    static const cudaError_t err = set_mma_kernel_attributes<K, StateT, InT, KDA, WIDE, TC>();
    return err;
}

} /* namespace */

#endif /* GDN_SM90_RECURRENT_LAUNCH_CUH */
