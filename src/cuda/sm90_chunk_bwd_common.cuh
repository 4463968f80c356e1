/*
 * sm90_chunk_bwd_common.cuh - what the backward's passes share (sm90_chunk_bwd.cuh lists them):
 * the launch struct, the record's layout, the chunk-slot map and the tile copies.
 */
#ifndef GDN_SM90_CHUNK_BWD_COMMON_CUH
#define GDN_SM90_CHUNK_BWD_COMMON_CUH

#include <cuda.h>

#include "sm90_chunk_common.cuh"
#include "sm90_primitives.cuh"

namespace gdn_bwd {

using gdn_chunk::C;
using gdn_chunk::saved_rec_offset;
using gdn_chunk::saved_bytes;
using gdn_chunk::slots_per_head;
using gdn_sm90::Mma16;

struct BwdParams {
    int64_t T, N, H, HV, G, V;
    int64_t cps;              /* chunks per sequence without cu_seqlens */
    int64_t slots;            /* chunk slots per value head (the forward's map) */
    const int32_t *cu;        /* [N + 1] or NULL */
    gdn_view q, k, v, d_o;    /* s = {b, t, h, d} */
    gdn_view g, a, beta;      /* s = {b, t, hv} */
    const float *A_log;
    const float *dt_bias;
    int64_t dt_h;
    float sp_beta, sp_threshold;
    int beta_from_logits, allow_neg_eigval;
    float scale;
    int l2norm;
    gdn_dtype state_dtype;
    gdn_view dht, dh0;        /* s = {n, hv, k, v}; may be absent */
    gdn_view dq, dk, dv;
    gdn_view dg, da, dbeta;
    gdn_view dA_log, ddt_bias;
    unsigned char *rec;       /* [HV][slots] records (gdn_rec), saved by the forward's chunk_prep */
    void *S;                  /* [HV][slots][V][K] 16-bit: the state entering each chunk, as S^T, saved
                               * by the forward's chunk_wg */
    void *dS;                 /* workspace, [HV][slots][2][K][V] 16-bit: the gradient of the state
                               * leaving each chunk, as hi + lo */
    float2 *gpart;            /* workspace, [HV][slots]: the chunk's sum of dg g and of da (dA_log,
                               * ddt_bias) */
    /* Context parallelism (seg_chunks > 0; sm90_chunk_bwd_rev.cuh, at bwd_scan_kernel): segments
     * of seg_chunks chunks, indexed in reverse (rseg = nseg - 1 - segment); per (sequence, value
     * head) and rseg, cp_pre [V + K][K] and cp_start [V][K] f32 (workspace). */
    int64_t nseg, seg_chunks;
    float *cp_pre, *cp_start;
    /* TMA maps for bwd_rev's and bwd_grad's copies of whole chunks (gdn_cuda_tma_rows, gdn_cuda_tma_mat). tma:
     * the loads of q, k {d, h, t, b}, d_o {v, hv, t, b} and the records' T and Pm (as
     * [HV * slots * REC_BYTES / 128][64]), and the stores of dS' (as [HV * slots * 2 K][V]); tma_dv:
     * the stores of dv {v, hv, t, b}. tma_grad: bwd_grad's loads, with also v {v, hv, t, b} and
     * the saved S^T (as [HV * slots * V][K]); tma_dqk: bwd_grad's stores of dq, dk {d, h, t, b}.
     * Matrix maps take boxes of 64 x 64. */
    int tma, tma_dv, tma_grad, tma_dqk;
    CUtensorMap tm_q, tm_k, tm_do, tm_rec, tm_ds, tm_dv, tm_v, tm_s, tm_dq, tm_dk;
};

/* Element (key r, value col) of state n, head hv in a state view (s = {n, hv, k, v}). */
__device__ __forceinline__ int64_t state_off(const gdn_view &s, int64_t n, int64_t hv, int r, int col)
{
    return n * s.s[0] + hv * s.s[1] + r * s.s[2] + col * s.s[3];
}

/* dht[n, hv, key r, value col], or 0 without dht: the gradient leaving a sequence's last chunk. */
__device__ __forceinline__ float dht_at(const BwdParams &p, int64_t n, int64_t hv, int r, int col)
{
    return p.dht.data ? load_elem(p.dht.data, p.state_dtype, state_off(p.dht, n, hv, r, col)) : 0.f;
}

/* The record of one (chunk, value head): gdn_chunk::gdn_rec (sm90_chunk_common.cuh). */
using namespace gdn_chunk::gdn_rec;

/* Chunk slot -> batch row, first token, live rows (cl = 0: a padding slot). */
struct Loc {
    int64_t row, t0;
    int cl;
};

/* Through the forward's slot map (slot_sequence, sequence), so that both passes see the same chunks. */
__device__ __forceinline__ Loc locate(const BwdParams &p, int64_t slot)
{
    int64_t c;
    const gdn_chunk::SeqInfo sq = gdn_chunk::sequence(p, gdn_chunk::slot_sequence(p, slot, c));
    Loc l;
    l.row = sq.row;
    const int ci = (int)c;
    const int64_t rest = sq.len - (int64_t)ci * C;
    /* c < 0 only with cu_seqlens that are not monotone (unchecked on the device): no chunk there,
     * as in the forward's prep_locate. */
    l.cl = ci < 0 || rest <= 0 ? 0 : (rest < C ? (int)rest : C);
    l.t0 = sq.bos + (int64_t)ci * C;
    return l;
}

/* exp(x) for x <= 0 (a decay between two tokens of a chunk) in one MUFU.EX2: relative error about
 * 2^-22, far below the 16-bit operands it meets. */
__device__ __forceinline__ float decay(float x) { return fast_exp2(x * LOG2E); }

/* (value head, slot) -> the index of its unit in the [HV][slots] buffers (gdn_chunk::hv_slot). */
__device__ __forceinline__ int64_t unit_of(const BwdParams &p, int64_t hv, int64_t slot)
{
    return (int64_t)gdn_chunk::hv_slot(hv, p.slots, slot);
}

/* The record of a unit (unit_of). */
__device__ __forceinline__ unsigned char *rec_of(const BwdParams &p, int64_t unit) { return p.rec + (size_t)unit * REC_BYTES; }

/* A unit's first row in the matrix maps (BwdParams): tm_rec (T, then Pm C rows on), tm_ds (hi,
 * then lo K rows on). */
__device__ __forceinline__ int rec_map_row(int64_t unit) { return (int)(unit * (REC_BYTES / 128)); }
template <int K> __device__ __forceinline__ int ds_map_row(int64_t unit) { return (int)(unit * 2 * K); }

/* The loads below issue cp.async copies (16 bytes each) where the source allows, so that all of a
 * tile's copies are in flight at once; the caller commits, waits (cp_async_wait) and synchronizes.
 * Rows past cl are zero-filled; strided or misaligned rows are read element by element. Tiles are
 * swizzled (gdn_sm90::tile_off), as wgmma reads them. */

/* Rows r < cl of x[row, t0 + r, head, d0 .. d0 + D) into D / 64 swizzled boxes at dst (zeros past
 * cl), by NTHR threads: cp.async where every row is 16-byte aligned, element loads otherwise. */
template <typename T, int D, int NTHR>
__device__ __forceinline__ void load_boxes(unsigned char *dst, const gdn_view &x, int64_t row, int64_t t0,
                                           int64_t head, int cl, int64_t d0, int pt)
{
    constexpr int CPR = D / 8, RSTEP = NTHR / CPR;
    static_assert(NTHR % CPR == 0 && C % RSTEP == 0, "load_boxes: whole rows a pass");
    const T *base = static_cast<const T *>(x.data) + row * x.s[0] + t0 * x.s[1] + head * x.s[2] + d0 * x.s[3];
    const int ch = pt % CPR, r0 = pt / CPR;
    unsigned char *d = dst + (ch >> 3) * gdn_sm90::BOX_BYTES;
    if (x.s[3] == 1 && ((uintptr_t)base & 15) == 0 && (x.s[1] & 7) == 0) {
        const T *src = base + r0 * x.s[1] + ch * 8;
        const int64_t step = (int64_t)RSTEP * x.s[1];
#pragma unroll
        for (int j = 0; j < C / RSTEP; ++j) {
            const int r = r0 + j * RSTEP;
            gdn_sm90::cp_async16(d + gdn_sm90::box_offset(r, (ch & 7) * 8), r < cl ? src + j * step : base,
                                 r < cl ? 16 : 0);
        }
        return;
    }
    for (int j = 0; j < C / RSTEP; ++j) {
        const int r = r0 + j * RSTEP;
        uint4 w = make_uint4(0, 0, 0, 0);
        if (r < cl) {
            T *e = reinterpret_cast<T *>(&w);
            const T *src = base + r * x.s[1] + ch * 8 * x.s[3];
#pragma unroll
            for (int i = 0; i < 8; ++i)
                e[i] = src[i * x.s[3]];
        }
        *reinterpret_cast<uint4 *>(d + gdn_sm90::box_offset(r, (ch & 7) * 8)) = w;
    }
}

/* A contiguous [R][W] 16-bit matrix into W / 64 swizzled stripes of R rows (tile_off), by NTHR
 * threads: a thread keeps one 16-byte column chunk and moves by a multiple of 8 rows, so its
 * swizzled offset is computed once. */
template <int R, int W, int NTHR>
__device__ __forceinline__ void load_mat_boxes(unsigned char *dst, const void *src, int tid)
{
    constexpr int CPR = W / 8, RSTEP = NTHR / CPR;
    static_assert(NTHR % CPR == 0 && RSTEP % 8 == 0 && R % RSTEP == 0, "load_mat_boxes: whole 8-row groups a pass");
    unsigned char *d = dst + gdn_sm90::tile_off(R, tid / CPR, (tid % CPR) * 8);
    const unsigned char *s = static_cast<const unsigned char *>(src) + 16 * tid;
#pragma unroll
    for (int j = 0; j < R / RSTEP; ++j)
        gdn_sm90::cp_async16(d + j * RSTEP * 128, s + j * NTHR * 16, 16);
}

/* n floats (a multiple of 4, 16-byte aligned at both ends). */
__device__ __forceinline__ void load_f32(float *dst, const void *src, int n, int tid, int nthr)
{
    for (int idx = tid; idx < n / 4; idx += nthr)
        gdn_sm90::cp_async16(dst + 4 * idx, static_cast<const float *>(src) + 4 * idx, 16);
}

} /* namespace gdn_bwd */

#endif /* GDN_SM90_CHUNK_BWD_COMMON_CUH */
