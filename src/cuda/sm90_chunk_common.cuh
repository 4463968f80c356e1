/*
 * sm90_chunk_common.cuh - what every pass of the chunked forward shares: the chunk length, the
 * workspace record format (tri_chunk), the launch parameters (ChunkParams) and the sequence map.
 */
#ifndef GDN_SM90_CHUNK_COMMON_CUH
#define GDN_SM90_CHUNK_COMMON_CUH

#include <cuda.h>

#include "cuda_common.cuh"
#include "cuda_gate.cuh"
#include "sm90_primitives.cuh"
#include "sm90_chunk_tuning.cuh"

namespace gdn_chunk {

using gdn_sm90::cp_async16;
using gdn_sm90::cp_async_commit;
using gdn_sm90::cp_async_wait;
using gdn_sm90::ldsm_x4;
using gdn_sm90::ldsm_x4_t;
using gdn_sm90::Mma16;
using gdn_sm90::mma_tf32;
using gdn_sm90::smem_u32;
using gdn_sm90::stsm_x4;
using gdn_sm90::stsm_x4_t;
using gdn_sm90::swz;
using gdn_sm90::tf32_split;
using gdn_sm90::Tf32Pair;

constexpr int C = 64;                                    /* chunk length */
constexpr int TILE_BYTES = C * C * 2;                    /* one 64 x 64 bf16 / f16 tile in shared memory */
constexpr int TRI_BYTES = 16 * (2 + 4 + 6 + 8) * 16;     /* its 16 x 16 blocks on and below the diagonal */
constexpr int COEF_BETA = 3 * C + 4;                     /* beta's row in the coefficients */
constexpr int COEF_FLOATS = COEF_BETA + C;                /* ck, cq, cu [64] each, gC, padding, beta [64] */
constexpr int WS_CHUNK = 2 * TRI_BYTES + COEF_FLOATS * 4;  /* workspace: Tb, Pm, coefficients: 11280 B */
static_assert(WS_CHUNK % 16 == 0 && (COEF_FLOATS * 4) % 16 == 0, "workspace: whole 16-byte copies");
constexpr int WS_COPIES = WS_CHUNK / 16;                   /* 705 */
constexpr int WS_MAP_BYTES = (WS_COPIES * 2 + 15) / 16 * 16; /* shared-memory offset of each copy */

/* KDA's chunk record (kda_prep, sm90_kda_prep.cuh): the decay differs per key, so it sits inside
 * the products and no row factor carries it. The record holds Tb and Pm as GDN's, then the chunk's
 * decay exp(Gam_C) per key and beta per token (f32), then three bf16 / f16 images of 64 x K tiles in chunk_wg's
 * shared-memory layout (K / 64 swizzled boxes each), copied there as they are:
 *   Q~ = scale rq exp(Gam) o Q     (O^T's inter-chunk product; replaces Q)
 *   K~ = rk exp(Gam) o K           (Y^T = S^T K~^T; replaces K)
 *   K^ = rk exp(Gam_C - Gam) o K   (the update S^T += Vn^T K^)
 * Every exponent is <= 0. */
template <int K> struct KdaRec {
    static constexpr int GC = 2 * TRI_BYTES;        /* exp(Gam_C) [K], f32 */
    static constexpr int BETA = GC + K * 4;         /* beta [C], f32 */
    static constexpr int IMG = BETA + C * 4;        /* Q~, K~, K^ */
    static constexpr int TILE = C * K * 2;
    static constexpr int BYTES = IMG + 3 * TILE;
    static constexpr int COPIES = IMG / 16;         /* Tb, Pm, exp(Gam_C), beta: through chunk_wg's copy map */
    static_assert(COPIES <= WS_COPIES, "KDA record: chunk_wg's copy map holds GDN's count");
};

/* The backward's record of one (chunk, value head): the forward's chunk_prep writes it into the
 * saved states (saved_rec_offset). T = (I + A)^-1 and Pm ([C][C],
 * 16-bit, zero above the diagonal), then the per-token rows below (f32). Rows past the end of a
 * sequence hold g = 0, beta = 0, k = q = 0. */
namespace gdn_rec {
enum BwdRow { R_CK, R_CQ, R_CU, R_GAM, R_BETA, R_RK, R_RQ, R_GLOG, R_LIVE, R_GU, R_GC, R_COUNT };
constexpr int REC_ROWS = 2 * C * C * 2; /* byte offset of the rows */
constexpr int REC_BYTES = REC_ROWS + R_COUNT * C * 4;
static_assert(REC_BYTES % 16 == 0, "record: whole 16-byte copies");
} /* namespace gdn_rec */
using namespace gdn_rec;

/* Tb and Pm are lower triangular: the workspace keeps only their 16 x 16 blocks on and below the
 * diagonal (chunk_wg zeroes the others once in shared memory): row i holds its first 2 (i / 16 + 1) 16-byte chunks
 * (logical, unswizzled order), rows packed one after another. Index of chunk ch of row i. */
__device__ __forceinline__ int tri_chunk(int i, int ch)
{
    const int b = i >> 4;
    return 16 * b * (b + 1) + (i & 15) * 2 * (b + 1) + ch;
}

/* Index of (value head hv, chunk slot) in the [HV][slots] buffers that the forward and the backward
 * share: the workspace records, the backward's records, the saved states, dS' tiles and gate
 * partials. */
__device__ __forceinline__ size_t hv_slot(int64_t hv, int64_t slots, int64_t slot)
{
    return (size_t)hv * (size_t)slots + (size_t)slot;
}

struct ChunkParams {
    int64_t T, N, HV, G, V;
    int64_t cps;               /* chunks per sequence without cu_seqlens */
    int64_t slots;             /* workspace chunk slots per value head */
    int64_t prep_heads;        /* value heads per chunk_prep CTA (divides G; prep_heads_for) */
    int *ready;                /* [HV][flag_blocks(slots)] records written, or NULL (launch_coop) */
    int64_t coop_main;         /* launch_coop: CTAs of the main pass; the rest run chunk_prep */
    int64_t coop_first;        /* launch_coop: prep items done before the grid (KDA), in coop_item's order */
    const int32_t *cu;         /* [N + 1] or NULL */
    const void *q, *k, *v;     /* [B, T, H, K] / [B, T, HV, V] */
    int tma;                   /* the CP pre pass's K, V tiles of whole chunks by TMA (gdn_cuda_tma_rows) */
    CUtensorMap tm_k, tm_v;
    void *o;
    int64_t q_b, q_t, q_h, k_b, k_t, k_h, v_b, v_t, v_h, o_b, o_t, o_h;
    const float *g;            /* [B, T, HV] (KDA [B, T, HV, K]) or NULL */
    int64_t g_b, g_t, g_h, g_r;
    const void *a;             /* raw gate [B, T, HV] (KDA [B, T, HV, K]) or NULL */
    gdn_dtype a_dtype;
    int64_t a_b, a_t, a_h, a_r;
    const float *A_log;        /* [HV] */
    const float *dt_bias;      /* [HV] (KDA [HV, K]); may be NULL */
    int64_t dt_h, dt_r;
    float lower_bound;         /* KDA: 0 = off */
    float sp_beta, sp_threshold;
    const void *beta;          /* [B, T, HV] */
    gdn_dtype beta_dtype;
    int64_t be_b, be_t, be_h;
    int beta_from_logits, allow_neg_eigval;
    float scale;
    int l2norm;
    const void *h0;            /* may be NULL */
    void *ht;                  /* may be NULL */
    gdn_dtype state_dtype;
    int64_t h0_s[4], ht_s[4];  /* {seq or pool slot, hv, k, v} */
    int ht_pairs;              /* ht has unit key stride and (key, key + 1) pairs aligned for one store */
    unsigned char *ws;
    /* Context parallelism (fixed-length sequences only): each sequence is split into nseg
     * segments of seg_chunks chunks; seg_chunks = 0: off. cp_pre holds, per (sequence, value
     * head, segment), the segment's affine map as the final S^T of the chain over V + K virtual
     * value columns: rows 0 .. V - 1 are N^T (real v, zero start), rows V .. V + K - 1 are M^T
     * (v = 0, identity start), f32, row pitch K. cp_start holds the state entering each segment
     * (S^T, V x K, f32), written by the scan. */
    int64_t seg_chunks, nseg;
    float *cp_pre, *cp_start;
    /* State pool (gdn.h): h0 and ht are then both the pool, and sequence n's row is its slot
     * pool_idx[n] (state_row); has_init [N] may keep a sequence from reading it; checkpoints go
     * to the pool slots ckpt[n, j] (ckpt_slot). */
    const int32_t *pool_idx;   /* [N] or NULL: row n of h0 / ht */
    int64_t pool_idx_s, pool_slots;
    int pool_slot_min;         /* 1 with null_slot_zero, else 0 */
    const int32_t *has_init;   /* [N] or NULL */
    int64_t has_init_s;
    int64_t ckpt_every;        /* checkpoint interval in tokens, a multiple of C; 0: none */
    const int32_t *ckpt;       /* [N, ckpt_cols] */
    int64_t ckpt_n, ckpt_j, ckpt_cols;
    /* Training (GDN gates): the state entering every chunk, S^T rounded to the input type, for
     * the backward (gdn_bwd::BwdParams::S, same layout: [HV][slots][V][K]); or NULL. */
    void *states_out;
    /* Training: the backward's record of every (chunk, value head) ([HV][slots] of REC_BYTES),
     * written by chunk_prep beside its own; or NULL. */
    unsigned char *bwd_rec;
    /* [N]: the main pass's sequences, longest first (order_sequence), or NULL: index order. */
    int *order;
};

/* Sequence n: batch row, first token, length, first workspace slot. */
struct SeqInfo {
    int64_t row, bos, len, slot0;
};

__host__ __device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Chunk slots per value head, the map below on the host: fixed length N ceil(T / C); varlen
 * floor(T / C) + N + 1, as sequence n starts at slot floor(cu[n] / C) + n (the host needs no
 * lengths). The forward's records and the backward's tiles are laid out [HV][slots]. */
static inline int64_t slots_per_head(const gdn_problem *p)
{
    if (p->cu_seqlens)
        return p->T / C + p->N + 1;
    return p->N * ((p->T + C - 1) / C);
}

/* The saved states of training (gdn_chunk_fwd_args.saved_states, for the backward): the state
 * entering every chunk slot ([HV][slots][V][K] in the input type, as S^T), then from
 * saved_rec_offset the backward's records ([HV][slots] of REC_BYTES). */
static inline size_t saved_tiles_bytes(const gdn_problem *p)
{
    return (size_t)slots_per_head(p) * (size_t)(p->HV * p->K * p->V) * 2;
}
static inline size_t saved_rec_offset(const gdn_problem *p) { return (saved_tiles_bytes(p) + 255) / 256 * 256; }
static inline size_t saved_bytes(const gdn_problem *p)
{
    return saved_rec_offset(p) + (size_t)slots_per_head(p) * (size_t)p->HV * REC_BYTES;
}

/* The SM count of the problem's device (a cached driver attribute, no sync), which sizes the tiles,
 * the context-parallel segments and the backward chain's column blocks; the workspace query and
 * the call see the same value. */
static inline int sm_count(const gdn_problem *p)
{
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p->device_ordinal) != cudaSuccess || sms <= 0) {
        (void)cudaGetLastError();
        sms = 132;
    }
    return sms;
}

/* Context parallelism (the forward's chain, and the backward's reverse chain alike: both run a CTA
 * per (sequence, value head, 64 value rows)): with few (sequence, head) pairs, the serial chunk
 * chain of each pair would run on a few SMs. Splitting every sequence into segments costs about
 * three times the chain work (the M columns of the first pass double it), so it pays only when
 * the wide tiles of 64 value columns fill at most an eighth of the SMs: then about SMs / tiles
 * segments give one wave of the main pass. Fixed-length sequences only (the segment grid comes from T on the
 * host); varlen takes the plain path. */
constexpr int CP_MIN_SEGS = 8, CP_MIN_SEG_CHUNKS = 4;

struct CpPlan {
    int64_t nseg, seg_chunks; /* seg_chunks = 0: off */
};

static inline CpPlan plan_cp(const gdn_problem *p)
{
    CpPlan cp = {1, 0};
    if (TUNE_NO_CP)
        return cp;
    if (p->cu_seqlens || p->T <= 0 || p->N <= 0 || p->HV <= 0 || p->V % 64 != 0 || p->K % 64 != 0 ||
        p->V % SCAN_ROWS != 0)
        return cp;
    const int64_t cps = (p->T + C - 1) / C, tiles = p->N * p->HV * (p->V / 64);
    int64_t nseg = min64(sm_count(p) / tiles, cps / CP_MIN_SEG_CHUNKS);
    if (nseg < CP_MIN_SEGS)
        return cp;
    if (TUNE_SEGS != 0)
        nseg = min64(TUNE_SEGS > 2 ? TUNE_SEGS : 2, cps); /* CP needs two segments or more */
    cp.seg_chunks = (cps + nseg - 1) / nseg;
    cp.nseg = (cps + cp.seg_chunks - 1) / cp.seg_chunks;
    return cp;
}

/* Workspace of the segments' maps and starting states. */
static inline size_t cp_ws_bytes(const gdn_problem *p, const CpPlan &cp)
{
    if (cp.seg_chunks == 0)
        return 0;
    return (size_t)(p->N * p->HV * cp.nseg) * (size_t)p->K * (size_t)(2 * p->V + p->K) * sizeof(float);
}

/* The chunk-slot map, shared by the forward (ChunkParams) and the backward (gdn_bwd::BwdParams):
 * any P with T, N, cps and cu. A cu_seqlens entry clamped to [0, T] (cu is not checked on the
 * device). */
template <typename P> __device__ __forceinline__ int64_t clamp_t(const P &p, int32_t x)
{
    return x < 0 ? 0 : (x > p.T ? p.T : (int64_t)x);
}

/* The row of h0 / ht that sequence n reads and writes: n, or its pool slot; -1 when an invalid
 * slot skips the sequence (its outputs are then zeros). */
__device__ __forceinline__ int64_t state_row(const ChunkParams &p, int64_t n)
{
    if (!p.pool_idx)
        return n;
    const int64_t s = p.pool_idx[n * p.pool_idx_s];
    return s >= p.pool_slot_min && s < p.pool_slots ? s : -1;
}

/* Whether sequence n (not skipped) starts from h0 rather than from zeros. */
__device__ __forceinline__ bool reads_h0(const ChunkParams &p, int64_t n)
{
    return p.h0 && (!p.has_init || p.has_init[n * p.has_init_s] != 0);
}

/* The pool slot of sequence n's checkpoint after its first `tokens` tokens (a multiple of C), or
 * -1: none due there, past the last column, or an invalid slot (that write is skipped). */
__device__ __forceinline__ int64_t ckpt_slot(const ChunkParams &p, int64_t n, int64_t tokens)
{
    if (p.ckpt_every <= 0 || tokens % p.ckpt_every != 0 || tokens / p.ckpt_every > p.ckpt_cols)
        return -1;
    const int64_t s = p.ckpt[n * p.ckpt_n + (tokens / p.ckpt_every - 1) * p.ckpt_j];
    return s >= p.pool_slot_min && s < p.pool_slots ? s : -1;
}

template <typename P> __device__ __forceinline__ SeqInfo sequence(const P &p, int64_t n)
{
    SeqInfo s;
    if (p.cu) {
        const int64_t a = clamp_t(p, p.cu[n]), b = clamp_t(p, p.cu[n + 1]);
        s.row = 0;
        s.bos = a;
        s.len = b > a ? b - a : 0;
        s.slot0 = a / C + n;
    } else {
        s.row = n;
        s.bos = 0;
        s.len = p.T;
        s.slot0 = n * p.cps;
    }
    return s;
}

/* Varlen batches of more than a wave: the main pass takes its sequences longest first (most chunks;
 * ties by index), so that the CTAs that start last hold the shortest chains, not a long one that
 * the other SMs would wait for. chunk_prep's CTA n < N ranks sequence n (all 128 threads, a
 * barrier per 128 sequences) and writes n at that rank: a permutation of 0 .. N - 1 whatever the
 * lengths, as the order is total. It only schedules: each (sequence, head) is computed the same. */
__device__ __forceinline__ void order_sequence(const ChunkParams &p, int64_t n, int tid)
{
    const int64_t cn = (sequence(p, n).len + C - 1) / C;
    int rank = 0;
    for (int64_t m0 = 0; m0 < p.N; m0 += 128) {
        const int64_t m = m0 + tid;
        bool before = false;
        if (m < p.N) {
            const int64_t cm = (sequence(p, m).len + C - 1) / C;
            before = cm > cn || (cm == cn && m < n);
        }
        rank += __syncthreads_count(before);
    }
    if (tid == 0)
        p.order[rank] = (int)n;
}

/* The sequence of chunk slot `slot` and the chunk's index c in it (c < 0 only where cu_seqlens
 * decreases: no chunk there). Varlen: sequence n starts at slot floor(cu[n] / 64) + n, so the
 * owner is the largest n with that at or before the slot. */
template <typename P> __device__ __forceinline__ int64_t slot_sequence(const P &p, int64_t slot, int64_t &c)
{
    int64_t n;
    if (!p.cu) {
        n = slot / p.cps;
        c = slot % p.cps;
    } else {
        int64_t lo = 0, hi = p.N - 1;
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            if (clamp_t(p, p.cu[mid]) / C + mid <= slot)
                lo = mid;
            else
                hi = mid - 1;
        }
        n = lo;
        c = slot - (clamp_t(p, p.cu[n]) / C + n);
    }
    return n;
}


__device__ __forceinline__ float load_state(const ChunkParams &p, const void *base, int64_t i)
{
    return p.state_dtype == GDN_DTYPE_BF16 ? __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[i])
                                           : static_cast<const float *>(base)[i];
}

} /* namespace gdn_chunk */

#endif /* GDN_SM90_CHUNK_COMMON_CUH */
