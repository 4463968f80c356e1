/*
 * sm90_recurrent_stream.cuh - the persistent, double-buffered form of the bulk-copy fast path, for
 * multi-token calls (speculative verify) with many (sequence, value head) pairs. Launched by
 * sm90_recurrent_fwd.cu; bench/bench_decode.cu includes it as well.
 *
 * In recurrent_fwd_tma_kernel a CTA loads its tile, then runs the token loop, then stores: at
 * T = 4..8 the token loop is compute (about 6 instructions per state element and token) and the
 * SM's resident CTAs end up computing at the same time, with no tile on its way (measured: each
 * extra token past the second costs the same whether the state moves or not). Here a grid of
 * about two CTAs per SM walks the work items (row block, value head, sequence) in order, and
 * warp 0 issues the bulk copy of a CTA's next tile into the second buffer before the CTA starts
 * the token loop of the current one, so every SM keeps a tile in flight while it computes.
 * Per item: warp 0 looks up the next slot and issues its copies; the CTA stages the current
 * item's tokens (stage_tokens), waits for its tile and runs chunks of kTokenChunk tokens as the
 * fast path does (token_step, per-step and final stores straight from registers, the tile as
 * scratch between chunks); a barrier closes the item before its buffer is refilled.
 */
#ifndef GDN_SM90_RECURRENT_STREAM_CUH
#define GDN_SM90_RECURRENT_STREAM_CUH

#include "sm90_recurrent_kernel.cuh"

/* Internal linkage: the library and the benchmark each compile their own copy. */
namespace {

/* Shared memory of one CTA of the streaming kernel: two state tiles and one token stage. */
template <int K, typename StateT> struct StreamSmem {
    static constexpr int TILE_ROWS = tile_rows<K, StateT>();
    alignas(128) StateT tile[2][TILE_ROWS * K];
    TokenStage<K, TILE_ROWS> st;
    alignas(8) uint64_t bar[2]; /* one per buffer: the whole tile arrives at once */
    StateT *src[2];             /* the slot looked up for the item in each buffer */
    int live[2];
};

/* Work item i: rows [rb * rows, ..) of value head hv of sequence n, sequence-major so that
 * neighbouring CTAs share q and k in L2. */
struct StreamItem {
    int64_t n;
    int hv, rb;
};

__device__ __forceinline__ StreamItem stream_item(int64_t i, int64_t HV, int nrb)
{
    StreamItem it;
    it.rb = (int)(i % nrb);
    const int64_t nh = i / nrb;
    it.hv = (int)(nh % HV);
    it.n = nh / HV;
    return it;
}

/* What decides where item n's state starts: its slot (the 1-D index, or the 2-D one at
 * num_accepted - 1; -1 when num_accepted is out of range), 0 without indices. Warp 0 loads it one
 * item ahead of stream_issue, so that the load's latency hides behind a token loop. */
__device__ __forceinline__ int64_t stream_slot(const RecurrentParams &p, int64_t n)
{
    if (!p.state_indices)
        return 0;
    int64_t col = 0;
    if (p.num_accepted_tokens) {
        const int64_t na = p.num_accepted_tokens[n];
        if (na < 1 || na > p.idx_cols)
            return -1;
        col = na - 1;
    }
    return p.state_indices[n * p.idx_s_n + col * p.idx_s_t];
}

/* Warp 0: resolves item it's slot as sequence_start does and issues the bulk copies of its rows
 * into buffer `buf`; records the start state (NULL: zeros) and whether the item is live. */
template <int K, typename StateT>
__device__ __forceinline__ void stream_issue(const RecurrentParams &p, StreamSmem<K, StateT> &sm, const StreamItem &it,
                                             int64_t slot, int buf, int rows_per_cta, int lane)
{
    constexpr uint32_t ROW_BYTES = K * sizeof(StateT);
    const int row_base = it.rb * rows_per_cta;
    const int cta_rows = (int)(p.V - row_base < rows_per_cta ? p.V - row_base : rows_per_cta);
    StateT *src = nullptr;
    bool live = true;
    if (p.state_indices) {
        live = slot_valid(p, slot);
        if (live)
            src = (StateT *)p.state_in + slot * p.st_in.s0 + it.hv * p.st_in.s1;
    } else if (p.state_in) {
        src = (StateT *)p.state_in + it.n * p.st_in.s0 + it.hv * p.st_in.s1;
    }
    if (src) {
        if (lane == 0)
            mbar_expect_tx(&sm.bar[buf], (uint32_t)cta_rows * ROW_BYTES);
        __syncwarp();
        for (int i = lane; i < cta_rows; i += 32)
            bulk_load(&sm.tile[buf][i * K], src + (int64_t)(row_base + i) * p.st_in.sv, ROW_BYTES, &sm.bar[buf]);
    }
    if (lane == 0) {
        sm.src[buf] = src;
        sm.live[buf] = live;
    }
}

/* K, StateT, InT, RPL as for recurrent_fwd_tma_kernel; rows_per_cta: rows of a work item (at
 * most the tile), nrb: row blocks per value head, items = N * HV * nrb. Dynamic shared memory:
 * StreamSmem<K, StateT>. */
template <int K, typename StateT, typename InT, int RPL>
__global__ void __launch_bounds__(256) recurrent_fwd_stream_kernel(const RecurrentParams p, int rows_per_cta, int nrb,
                                                                   int64_t items)
{
    constexpr int VE = 16 / sizeof(StateT);
    constexpr int NV = K / (kLanesPerRow * VE);
    constexpr int EPL = NV * VE;
    constexpr int ROWS_PER_WARP = 4 * RPL;
    constexpr int TILE_ROWS = tile_rows<K, StateT>();
    static_assert(NV >= 1 && NV * VE * kLanesPerRow == K, "K must be a multiple of 8 state pieces");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    StreamSmem<K, StateT> &sm = *reinterpret_cast<StreamSmem<K, StateT> *>(smem_raw);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int group = lane / kLanesPerRow, gl = lane % kLanesPerRow;
    const int pass_rows = nwarps * ROWS_PER_WARP;
    const int passes = (rows_per_cta + pass_rows - 1) / pass_rows;
    const bool zero_init = !p.state_indices && !p.state_in;

    if (threadIdx.x < 2)
        mbar_init(&sm.bar[threadIdx.x], 1);
    __syncthreads();
    grid_dependency_sync();
    int64_t next_slot = 0; /* warp 0: the slot of the CTA's next item, loaded one item ahead */
    if (warp == 0 && (int64_t)blockIdx.x < items) {
        const StreamItem first = stream_item(blockIdx.x, p.HV, nrb);
        stream_issue<K, StateT>(p, sm, first, stream_slot(p, first.n), 0, rows_per_cta, lane);
        if ((int64_t)blockIdx.x + gridDim.x < items)
            next_slot = stream_slot(p, stream_item(blockIdx.x + gridDim.x, p.HV, nrb).n);
    }
    uint32_t phase = 0; /* bit b: the parity of buffer b's next completion */

    int buf = 0;
    for (int64_t i = blockIdx.x; i < items; i += gridDim.x, buf ^= 1) {
        const StreamItem it = stream_item(i, p.HV, nrb);
        const int64_t n = it.n;
        const int hv = it.hv, h = hv / (int)p.G;
        const int row_base = it.rb * rows_per_cta;
        const int cta_rows = (int)(p.V - row_base < rows_per_cta ? p.V - row_base : rows_per_cta);
        int64_t b = n, bos = 0, eos = p.T;
        if (p.cu_seqlens) {
            b = 0;
            bos = clamp64(p.cu_seqlens[n], 0, p.T);
            eos = clamp64(p.cu_seqlens[n + 1], bos, p.T);
        }
        const int64_t len = eos - bos;
        const int64_t packed0 = p.cu_seqlens ? bos : n * p.T;

        /* The next item's copies go out first: they overlap this item's whole token loop. The
         * other buffer was released by the barrier that closed the previous item. */
        if (warp == 0 && i + gridDim.x < items) {
            stream_issue<K, StateT>(p, sm, stream_item(i + gridDim.x, p.HV, nrb), next_slot, buf ^ 1, rows_per_cta,
                                    lane);
            if (i + 2 * (int64_t)gridDim.x < items)
                next_slot = stream_slot(p, stream_item(i + 2 * (int64_t)gridDim.x, p.HV, nrb).n);
        }
        StateT *tile = sm.tile[buf];
        if (zero_init) /* no initial state: zeros (no copy was issued into this buffer) */
            for (int e = threadIdx.x; e < cta_rows * K; e += blockDim.x)
                tile[e] = gdn_from_f32<StateT>(0.0f);
        const int tc0 = (int)(len < kTokenChunk ? len : kTokenChunk);
        stage_tokens<K, InT, TILE_ROWS>(p, sm.st, b, bos, tc0, h, hv, row_base, cta_rows);
        __syncthreads();
        StateT *const src = sm.src[buf];
        const bool live = sm.live[buf];
        if (!live) { /* skipped: uniform over the CTA */
            for (int ps = 0; ps < passes; ps++) {
                int rows[RPL];
                bool row_ok[RPL];
#pragma unroll
                for (int r = 0; r < RPL; r++) {
                    const int e = (ps * nwarps + warp) * ROWS_PER_WARP + r * 4 + group;
                    rows[r] = row_base + e;
                    row_ok[r] = e < cta_rows;
                }
                zero_outputs<StateT, InT, RPL, EPL, VE, NV, true>(p, rows, row_ok, gl, b, bos, eos, packed0, n, hv);
            }
        } else {
            if (src) {
                mbar_wait(&sm.bar[buf], (phase >> buf) & 1u);
                phase ^= 1u << buf;
            }
            const int64_t chunks = len > 0 ? (len + kTokenChunk - 1) / kTokenChunk : 1;
            for (int64_t ci = 0; ci < chunks; ci++) {
                const int64_t t0 = ci * kTokenChunk;
                const int tc = (int)(len - t0 < kTokenChunk ? len - t0 : kTokenChunk);
                if (ci > 0) {
                    __syncthreads(); /* the previous chunk's stage and tile write-backs are done */
                    stage_tokens<K, InT, TILE_ROWS>(p, sm.st, b, bos + t0, tc, h, hv, row_base, cta_rows);
                    __syncthreads();
                }
                const bool last = ci == chunks - 1;
                for (int ps = 0; ps < passes; ps++) {
                    int rows[RPL], srow[RPL];
                    bool row_ok[RPL];
#pragma unroll
                    for (int r = 0; r < RPL; r++) {
                        srow[r] = (ps * nwarps + warp) * ROWS_PER_WARP + r * 4 + group;
                        rows[r] = row_base + srow[r];
                        row_ok[r] = srow[r] < cta_rows;
                    }
                    float s[RPL][EPL], c = 1.0f; /* S = c * s */
#pragma unroll
                    for (int r = 0; r < RPL; r++)
#pragma unroll
                        for (int cc = 0; cc < NV; cc++)
                            load_f32<StateT, VE, true>(
                                &tile[(row_ok[r] ? srow[r] : 0) * K + (cc * kLanesPerRow + gl) * VE], 1, &s[r][cc * VE]);
                    InT *o = (InT *)p.o + b * p.o_s[0] + (bos + t0) * p.o_s[1] + hv * p.o_s[2];
                    for (int j = 0; j < tc; j++, o += p.o_s[1])
                        token_step<K, StateT, InT, RPL, EPL, VE, NV, true, TILE_ROWS>(
                            p, sm.st, j, s, c, rows, row_ok, srow, gl, n, hv, t0 + j, o, packed0);
                    if (last) {
                        store_final<StateT, RPL, EPL, VE, NV, true>(p, src, n, hv, rows, row_ok, gl, s, c);
                    } else {
#pragma unroll
                        for (int r = 0; r < RPL; r++)
                            if (row_ok[r])
#pragma unroll
                                for (int cc = 0; cc < NV; cc++)
                                    st_shared_16(smem_u32(&tile[srow[r] * K + (cc * kLanesPerRow + gl) * VE]),
                                                 pack16<StateT, VE>(&s[r][cc * VE], c));
                    }
                }
            }
        }
        /* This buffer and the stage are no longer read; order those generic accesses before the
         * bulk copies that refill the buffer (issued two items from now). */
        fence_proxy_async();
        __syncthreads();
    }
}

/* Dynamic shared memory above 48 KB, asked once per instance (a function attribute, safe under
 * graph capture); then the CTAs per SM it allows with `threads` threads. */
template <int K, typename StateT, typename InT, int RPL> cudaError_t stream_kernel_setup(int threads, int *per_sm)
{
    static const cudaError_t set = cudaFuncSetAttribute(recurrent_fwd_stream_kernel<K, StateT, InT, RPL>,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        (int)sizeof(StreamSmem<K, StateT>));
    if (set != cudaSuccess)
        return set;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, recurrent_fwd_stream_kernel<K, StateT, InT, RPL>,
                                                         threads, sizeof(StreamSmem<K, StateT>));
}

} /* namespace */

#endif /* GDN_SM90_RECURRENT_STREAM_CUH */
