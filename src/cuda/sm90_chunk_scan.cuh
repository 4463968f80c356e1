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
/* loading into registers while this one is applied), S^T stays there between segments. The    */
/* sum over the keys e is split into SCAN_ROWS groups of threads, each taking K / SCAN_ROWS keys  */
/* for every row, a thread 4 adjacent d (a float4 of M^T per key): M^T is read from shared      */
/* memory once a step, where a group per row read it SCAN_ROWS times, and the shared-memory       */
/* traffic of those reads set the step's time. The groups' partial sums meet in M^T's place.     */
/* Every CTA of a pair reads all of each M_j; more rows a CTA would read less but gather the    */
/* FMAs of a step on fewer SMs, which costs more (SCAN_ROWS, sm90_chunk_tuning.cuh).            */

static_assert(SCAN_ROWS * 128 / 4 <= 1024 && 64 % SCAN_ROWS == 0, "cp_scan: 1024 threads at K = 128, V = 64 tiles");
static_assert(SCAN_ROWS * SCAN_ROWS <= 64 && 64 / SCAN_ROWS % 4 == 0,
              "cp_scan: the partial sums fit in M^T's place, and a group's keys come in fours");

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
    constexpr int D4 = K / 4, THREADS = scan_threads<K>(), ML = K * K / 4 / THREADS, EG = K / SCAN_ROWS;
    extern __shared__ __align__(128) unsigned char smem[];
    float4 *Ms = reinterpret_cast<float4 *>(smem);   /* M_j^T, K x K; then the partial sums */
    float *Ss = reinterpret_cast<float *>(Ms + K * D4); /* S^T rows c0 .. c0 + SCAN_ROWS - 1, SCAN_ROWS x K */
    /* d4: this thread's 4 columns; grp: its keys grp EG .. grp EG + EG - 1 in the sum, and the row
     * it adds up and writes. */
    const int tid = threadIdx.x, d4 = tid % D4, grp = tid / D4;
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
        const float4 nv = *reinterpret_cast<const float4 *>(pj + (c0 + grp) * K + 4 * d4);
        __syncthreads(); /* the previous segment's reads of the partial sums and writes of Ss are done */
#pragma unroll
        for (int i = 0; i < ML; ++i)
            Ms[tid + i * THREADS] = mr[i];
        __syncthreads();
        if (j + 2 < nseg)
            fetch_m(j + 1);
        float4 part[SCAN_ROWS];
#pragma unroll
        for (int r = 0; r < SCAN_ROWS; ++r)
            part[r] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int k = 0; k < EG; k += 4) {
            const int e = grp * EG + k;
            float4 mv[4];
#pragma unroll
            for (int u = 0; u < 4; ++u)
                mv[u] = Ms[(e + u) * D4 + d4];
#pragma unroll
            for (int r = 0; r < SCAN_ROWS; ++r) {
                const float4 sv = *reinterpret_cast<const float4 *>(Ss + r * K + e);
                const float s4[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    part[r].x += s4[u] * mv[u].x;
                    part[r].y += s4[u] * mv[u].y;
                    part[r].z += s4[u] * mv[u].z;
                    part[r].w += s4[u] * mv[u].w;
                }
            }
        }
        __syncthreads(); /* every read of M^T and Ss is done: the partial sums take M^T's place */
        float4 *Ps = Ms; /* [group][row][D4] */
#pragma unroll
        for (int r = 0; r < SCAN_ROWS; ++r)
            Ps[(grp * SCAN_ROWS + r) * D4 + d4] = part[r];
        __syncthreads();
        float4 acc = nv;
#pragma unroll
        for (int g = 0; g < SCAN_ROWS; ++g) {
            const float4 x = Ps[(g * SCAN_ROWS + grp) * D4 + d4];
            acc.x += x.x;
            acc.y += x.y;
            acc.z += x.z;
            acc.w += x.w;
        }
        *reinterpret_cast<float4 *>(Ss + grp * K + 4 * d4) = acc;
        *reinterpret_cast<float4 *>(start + ((size_t)(j + 1) * V + c0 + grp) * K + 4 * d4) = acc;
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
