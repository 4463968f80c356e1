/*
 * sm90_chunk_scan.cuh - cp_scan, the context-parallel pass that chains the segments' affine maps
 * into the state entering each segment; scan_rows, its body, also serves the backward (bwd_scan).
 */
#ifndef GDN_SM90_CHUNK_SCAN_CUH
#define GDN_SM90_CHUNK_SCAN_CUH

#include "sm90_chunk_common.cuh"

namespace gdn_chunk {
/* ------------------------------------------------------------------------------------------ */
/* cp_scan: the states entering each segment, S_j+1 = M_j S_j + N_j, in f32 (as S^T:            */
/* S^T_j+1 = S^T_j M_j^T + N_j^T). One CTA per (sequence, value head, SCAN_ROWS value rows of   */
/* S^T), the segments in order; M_j^T is staged in shared memory (the next one is already       */
/* loading into registers while this one is applied), S^T stays there between segments. Each   */
/* thread owns 4 adjacent d of one row: a float4 of M^T per step of the sum, no bank conflicts. */
/* Every CTA of a pair reads all of each M_j; more rows a CTA would read less but gather the    */
/* FMAs of a step on fewer SMs, which costs more (SCAN_ROWS, sm90_chunk_tuning.cuh).            */

static_assert(SCAN_ROWS * 128 / 4 <= 1024 && 64 % SCAN_ROWS == 0, "cp_scan: 1024 threads at K = 128, V = 64 tiles");

template <int K> constexpr int scan_threads() { return SCAN_ROWS * K / 4; }
template <int K> constexpr int scan_smem_bytes() { return (K * K + SCAN_ROWS * K) * 4; }

/* One CTA's rows c0 .. c0 + SCAN_ROWS of the scan over nseg segments: pre holds per segment its
 * map's N^T rows (V) then M^T rows (K), f32 [K] each; start[j] ([V][K]) receives the state entering
 * segment j: start[0] from init(vv, d), start[1] = N_0^T (segment 0's chain began from start[0]),
 * then S^T_j+1 = S^T_j M_j^T + N_j^T. Also the backward's (bwd_scan): its segments in reverse. */
template <int K, typename Init>
__device__ __forceinline__ void scan_rows(const float *pre, float *start, int64_t V, int64_t nseg, int64_t c0,
                                          Init init)
{
    constexpr int D4 = K / 4, THREADS = scan_threads<K>(), ML = K * K / 4 / THREADS;
    extern __shared__ __align__(128) unsigned char smem[];
    float4 *Ms = reinterpret_cast<float4 *>(smem);   /* M_j^T, K x K */
    float *Ss = reinterpret_cast<float *>(Ms + K * D4); /* S^T rows c0 .. c0 + 7, 8 x K */
    const int tid = threadIdx.x, d4 = tid % D4, row = tid / D4;
    float4 mr[ML];
    auto fetch_m = [&](int64_t j) {
        const float4 *src = reinterpret_cast<const float4 *>(pre + ((size_t)j * (V + K) + V) * K);
#pragma unroll
        for (int i = 0; i < ML; ++i)
            mr[i] = src[tid + i * THREADS];
    };
    if (nseg > 2)
        fetch_m(1);

    /* Segment 0 starts from init (the main pass reads it from here, so a final state aliasing the
     * initial one is written only after every read); segment 1 from the end of segment 0's
     * chain, which PRE started from the same state. */
    for (int i = tid; i < SCAN_ROWS * K; i += THREADS) {
        const int r = i / K, d = i % K;
        const int64_t vv = c0 + r;
        start[vv * K + d] = init(vv, d);
        const float x = pre[vv * K + d];
        Ss[r * K + d] = x;
        start[(V + vv) * K + d] = x;
    }
#pragma unroll 1
    for (int64_t j = 1; j + 1 < nseg; ++j) {
        const float *pj = pre + (size_t)j * (V + K) * K;
        float4 acc = *reinterpret_cast<const float4 *>(pj + (c0 + row) * K + 4 * d4);
        __syncthreads(); /* the previous segment's reads of Ms and writes of Ss are done */
#pragma unroll
        for (int i = 0; i < ML; ++i)
            Ms[tid + i * THREADS] = mr[i];
        __syncthreads();
        if (j + 2 < nseg)
            fetch_m(j + 1);
        /* Four partial sums over e mod 4: four dependent FMA chains of K / 4 instead of one of K. */
        float4 part[4] = {acc, make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f),
                          make_float4(0.f, 0.f, 0.f, 0.f)};
#pragma unroll 2
        for (int e = 0; e < K; e += 4) {
            const float4 sv = *reinterpret_cast<const float4 *>(Ss + row * K + e);
            const float s4[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const float4 mv = Ms[(e + u) * D4 + d4];
                part[u].x += s4[u] * mv.x;
                part[u].y += s4[u] * mv.y;
                part[u].z += s4[u] * mv.z;
                part[u].w += s4[u] * mv.w;
            }
        }
        acc = make_float4((part[0].x + part[1].x) + (part[2].x + part[3].x), (part[0].y + part[1].y) + (part[2].y + part[3].y),
                          (part[0].z + part[1].z) + (part[2].z + part[3].z), (part[0].w + part[1].w) + (part[2].w + part[3].w));
        __syncthreads();
        *reinterpret_cast<float4 *>(Ss + row * K + 4 * d4) = acc;
        *reinterpret_cast<float4 *>(start + ((size_t)(j + 1) * V + c0 + row) * K + 4 * d4) = acc;
    }
}

template <int K>
__global__ void __launch_bounds__(scan_threads<K>()) cp_scan_kernel(const ChunkParams p)
{
    const unsigned tiles = (unsigned)(p.V / SCAN_ROWS), pair = blockIdx.x / tiles;
    const int64_t n = pair / (unsigned)p.HV, hv = pair % (unsigned)p.HV;
    const int64_t c0 = (int64_t)(blockIdx.x % tiles) * SCAN_ROWS;
    const int64_t hrow = state_row(p, n);
    const bool read_h0 = hrow >= 0 && reads_h0(p, n);
    scan_rows<K>(p.cp_pre + (size_t)pair * p.nseg * (p.V + K) * K, p.cp_start + (size_t)pair * p.nseg * p.V * K, p.V,
                 p.nseg, c0, [&](int64_t vv, int d) {
                     return read_h0 ? load_state(p, p.h0, hrow * p.h0_s[0] + hv * p.h0_s[1] + d * p.h0_s[2] + vv * p.h0_s[3])
                                    : 0.f;
                 });
}

} /* namespace gdn_chunk */

#endif /* GDN_SM90_CHUNK_SCAN_CUH */
