/*
 * sm90_chunk_bwd.cuh - the kernels of the chunked backward (GDN gates), mma.sync on 16-bit tiles
 * (sm90_mma_tiles.cuh), f32 accumulators. Notation and equations: dev/backward/README.md, section
 * 1. Per chunk and value head, with Gam the chunk-local cumsum of the (floored) log decays,
 * gam = exp(Gam), gu = exp(Gam_C - Gam), rk / rq the norm factors and T = (I + A)^-1:
 *
 *   forward:   X = V - diag(ck) K S     Vn = T diag(beta) X     S' = gC S + K^T diag(cu) Vn
 *   reverse:   dVn = Pm^T dO + diag(cu) K dS'     dU = T^T dVn     dX = diag(beta) dU (= dv)
 *              dS = gC dS' + Q^T diag(cq) dO - K^T diag(ck) dX
 *
 * (ck = rk gam, cq = scale rq gam, cu = rk gu). The passes (one stream; no atomics, fixed orders):
 *   bwd_prep   per (chunk slot, value head): gates, cumsum, norms, K K^T, Q K^T, T (prep_inverse),
 *              Pm; the record (BwdRec) to the workspace.
 *   bwd_chain  per (sequence, value head, CHAIN_VS value columns), in two roles of one grid: the forward
 *              chain stores S entering every chunk; the reverse chain stores dS' leaving every chunk,
 *              writes dv and dh0. Both are independent given the records, so they run side by side.
 *   bwd_grad   per (chunk slot, key head), over the group's value heads in turn: everything
 *              else of the chunk from S, dS' and the record: dg or da, dbeta, the gate-parameter
 *              partials per value head; dq and dk summed over the group in registers, then
 *              through the L2-norm backward to the outputs.
 *   bwd_gate   per value head: dA_log and ddt_bias from the partials, in slot order.
 */
#ifndef GDN_SM90_CHUNK_BWD_CUH
#define GDN_SM90_CHUNK_BWD_CUH

#include "sm90_chunk_common.cuh"
#include "sm90_chunk_prep.cuh"
#include "sm90_mma_tiles.cuh"

namespace gdn_bwd {

using namespace gdn_tiles;
using gdn_chunk::C;
using gdn_chunk::G_FLOOR;

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
    gdn_view h0, dht, dh0;    /* s = {n, hv, k, v}; may be absent */
    gdn_view dq, dk, dv;
    gdn_view dg, da, dbeta;
    gdn_view dA_log, ddt_bias;
    /* Workspace, [HV][slots] of each. */
    unsigned char *rec;       /* BwdRec */
    void *S;                  /* [K][V] 16-bit: the state entering the chunk */
    void *dS;                 /* [2][K][V] 16-bit: the gradient of the state leaving it, as hi + lo */
    float2 *gpart;            /* the chunk's sum of dg g and of da (dA_log, ddt_bias) */
};

/* The record of one (chunk, value head): T and Pm ([C][C], 16-bit, zero above the diagonal), then
 * the per-token rows below (f32). Rows past the end of a sequence hold g = 0, beta = 0, k = q = 0. */
enum BwdRow { R_CK, R_CQ, R_CU, R_GAM, R_BETA, R_RK, R_RQ, R_GLOG, R_LIVE, R_GU, R_GC, R_COUNT };
constexpr int REC_BYTES = 2 * C * C * 2 + R_COUNT * C * 4;
static_assert(REC_BYTES % 16 == 0, "record: whole 16-byte copies");

/* Chunk slot -> sequence, chunk, first token, live rows (cl = 0: a padding slot). */
struct Loc {
    int64_t n, row, t0;
    int c, cl;
};

__device__ __forceinline__ int64_t clamp_tok(const BwdParams &p, int32_t x)
{
    return x < 0 ? 0 : (x > p.T ? p.T : (int64_t)x);
}

/* Sequence n: batch row, first token, length, first slot (as the forward's sequence()). */
__device__ __forceinline__ void seq_info(const BwdParams &p, int64_t n, int64_t &row, int64_t &bos, int64_t &len,
                                         int64_t &slot0)
{
    if (p.cu) {
        const int64_t a = clamp_tok(p, p.cu[n]), b = clamp_tok(p, p.cu[n + 1]);
        row = 0;
        bos = a;
        len = b > a ? b - a : 0;
        slot0 = a / C + n;
    } else {
        row = n;
        bos = 0;
        len = p.T;
        slot0 = n * p.cps;
    }
}

__device__ __forceinline__ Loc locate(const BwdParams &p, int64_t slot)
{
    int64_t n;
    if (p.cu) {
        /* The first slots of the sequences increase strictly: the last one at or before slot. */
        int64_t lo = 0, hi = p.N - 1;
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            if (clamp_tok(p, p.cu[mid]) / C + mid <= slot)
                lo = mid;
            else
                hi = mid - 1;
        }
        n = lo;
    } else {
        n = slot / p.cps;
    }
    Loc l;
    int64_t bos, len, slot0;
    seq_info(p, n, l.row, bos, len, slot0);
    l.n = n;
    l.c = (int)(slot - slot0);
    const int64_t rest = len - (int64_t)l.c * C;
    /* c < 0 only with cu_seqlens that are not monotone (unchecked on the device): no chunk there,
     * as in the forward's prep_locate. */
    l.cl = l.c < 0 || rest <= 0 ? 0 : (rest < C ? (int)rest : C);
    l.t0 = bos + (int64_t)l.c * C;
    return l;
}

/* exp(x) for x <= 0 (a decay between two tokens of a chunk) in one MUFU.EX2: relative error about
 * 2^-22, far below the 16-bit operands it meets. */
__device__ __forceinline__ float decay(float x) { return gdn_chunk::fast_exp2(x * gdn_chunk::LOG2E); }

__device__ __forceinline__ unsigned char *rec_of(const BwdParams &p, int64_t hv, int64_t slot)
{
    return p.rec + ((size_t)hv * p.slots + (size_t)slot) * REC_BYTES;
}

/* The loads below issue cp.async copies (16 bytes each) where the source allows, so that all of a
 * tile's copies are in flight at once; the caller commits, waits (cp_async_wait) and synchronizes.
 * Rows past cl are zero-filled; strided or misaligned rows are read element by element. */

/* Rows r < cl of x[row, t0 + r, head, d0 .. d0 + D) into a [C][LD] tile (zeros past cl), by NTHR threads. */
template <typename T, int D, int LD, int NTHR>
__device__ __forceinline__ void load_tile(T *dst, const gdn_view &x, int64_t row, int64_t t0, int64_t head, int cl,
                                          int d0, int tid)
{
    constexpr int CPR = D / 8, RSTEP = NTHR / CPR; /* 16-byte chunks a row; rows a pass */
    static_assert(NTHR % CPR == 0 && C % RSTEP == 0, "load_tile: whole rows a pass");
    const T *base = static_cast<const T *>(x.data) + row * x.s[0] + t0 * x.s[1] + head * x.s[2] + d0 * x.s[3];
    if (x.s[3] == 1 && ((uintptr_t)base & 15) == 0 && (x.s[1] & 7) == 0) {
        /* Every row 16-byte aligned: one cp.async a chunk, rows past cl zero-filled (src_bytes 0). */
        const int r0 = tid / CPR, c8 = (tid % CPR) * 8;
        const T *src = base + r0 * x.s[1] + c8;
        const int64_t step = (int64_t)RSTEP * x.s[1];
#pragma unroll
        for (int j = 0; j < C / RSTEP; ++j) {
            const int r = r0 + j * RSTEP;
            gdn_sm90::cp_async16(dst + r * LD + c8, r < cl ? src + j * step : base, r < cl ? 16 : 0);
        }
        return;
    }
    for (int idx = tid; idx < C * CPR; idx += NTHR) {
        const int r = idx / CPR, c8 = (idx % CPR) * 8;
        T *d = dst + r * LD + c8;
        const T *src = base + r * x.s[1] + c8 * x.s[3];
        if (r >= cl) {
            *reinterpret_cast<uint4 *>(d) = make_uint4(0, 0, 0, 0);
        } else if (x.s[3] == 1 && ((uintptr_t)src & 15) == 0) {
            gdn_sm90::cp_async16(d, src, 16);
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j)
                d[j] = src[j * x.s[3]];
        }
    }
}

/* Columns c0 .. c0 + W of a contiguous [R][SRC_COLS] 16-bit matrix into a [R][LD] tile. */
template <int R, int W, int SRC_COLS, int LD, typename T>
__device__ __forceinline__ void load_mat(T *dst, const T *src, int c0, int tid, int nthr)
{
    for (int idx = tid; idx < R * W / 8; idx += nthr) {
        const int r = idx / (W / 8), c8 = (idx % (W / 8)) * 8;
        gdn_sm90::cp_async16(dst + r * LD + c8, src + r * SRC_COLS + c0 + c8, 16);
    }
}

/* n floats (a multiple of 4, 16-byte aligned at both ends). */
__device__ __forceinline__ void load_f32(float *dst, const void *src, int n, int tid, int nthr)
{
    for (int idx = tid; idx < n / 4; idx += nthr)
        gdn_sm90::cp_async16(dst + 4 * idx, static_cast<const float *>(src) + 4 * idx, 16);
}

__device__ __forceinline__ void loads_done()
{
    gdn_sm90::cp_async_commit();
    gdn_sm90::cp_async_wait<0>();
}

/* The reverse: a [R][LD] tile to columns 0 .. W of a matrix with row pitch dst_cols. */
template <int R, int W, int LD, typename T>
__device__ __forceinline__ void store_mat(T *dst, int64_t dst_cols, const T *src, int tid, int nthr)
{
    for (int idx = tid; idx < R * W / 8; idx += nthr) {
        const int r = idx / (W / 8), c8 = (idx % (W / 8)) * 8;
        *reinterpret_cast<uint4 *>(dst + r * dst_cols + c8) = *reinterpret_cast<const uint4 *>(src + r * LD + c8);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* bwd_prep                                                                                    */

template <typename T, int K> struct PrepBwdSmem {
    static constexpr int LDK = Pitch<K>::LD;
    static constexpr int LDF = C + 4; /* prep_inverse's f32 pitch */
    static constexpr int BYTES = 2 * C * LDK * 2 + 2 * C * LDF * 4 + 4 * C * 4;
};

template <typename T, int K>
__global__ void __launch_bounds__(128) bwd_prep_kernel(const BwdParams p)
{
    using S = PrepBwdSmem<T, K>;
    constexpr int LDK = S::LDK, LDF = S::LDF;
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int64_t hv = blockIdx.x % p.HV, slot = blockIdx.x / p.HV;
    const Loc L = locate(p, slot);
    if (L.cl == 0)
        return;
    const int64_t h = hv / p.G;
    T *Qs = reinterpret_cast<T *>(smem);
    T *Ks = Qs + C * LDK;
    float *As = reinterpret_cast<float *>(Ks + C * LDK);
    float *Ts = As + C * LDF;
    float *glog = Ts + C * LDF, *bet = glog + C, *rk = bet + C, *rq = rk + C;

    load_tile<T, K, LDK, 128>(Qs, p.q, L.row, L.t0, h, L.cl, 0, tid);
    load_tile<T, K, LDK, 128>(Ks, p.k, L.row, L.t0, h, L.cl, 0, tid);
    unsigned char *rec = rec_of(p, hv, slot);
    float *rows = reinterpret_cast<float *>(rec + 2 * C * C * 2);
    if (tid < C) {
        float gv = 0.f, bv = 0.f, live = 1.f;
        if (tid < L.cl) {
            const int64_t tok = L.t0 + tid;
            if (p.g.data) {
                gv = static_cast<const float *>(p.g.data)[L.row * p.g.s[0] + tok * p.g.s[1] + hv * p.g.s[2]];
            } else {
                const float a = load_elem(p.a.data, p.a.dtype, L.row * p.a.s[0] + tok * p.a.s[1] + hv * p.a.s[2]);
                gv = gate_log_decay(a, p.dt_bias ? p.dt_bias[hv * p.dt_h] : 0.f, p.A_log[hv], p.sp_beta,
                                    p.sp_threshold);
            }
            /* The forward's floor (chunk_prep): below it the decay is a reset, and its derivative is 0. */
            if (gv < G_FLOOR) {
                gv = G_FLOOR;
                live = 0.f;
            }
            bv = load_elem(p.beta.data, p.beta.dtype, L.row * p.beta.s[0] + tok * p.beta.s[1] + hv * p.beta.s[2]);
            if (p.beta_from_logits)
                bv = gate_beta(bv, p.allow_neg_eigval);
        }
        glog[tid] = gv;
        bet[tid] = bv;
        rows[R_LIVE * C + tid] = live;
        rows[R_BETA * C + tid] = bv;
    }
    loads_done();
    __syncthreads();
    /* Norm factors, a warp per row; the cumsum by warp 0 after. */
    for (int r = warp; r < C; r += 4) {
        float sq = 0.f, sk = 0.f;
        for (int d = lane; d < K; d += 32) {
            const float qv = gdn_to_f32(Qs[r * LDK + d]), kv = gdn_to_f32(Ks[r * LDK + d]);
            sq += qv * qv;
            sk += kv * kv;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            sq += __shfl_xor_sync(0xffffffffu, sq, off);
            sk += __shfl_xor_sync(0xffffffffu, sk, off);
        }
        if (lane == 0) {
            /* chunk_prep's expression, so that forward and backward normalise identically */
            rq[r] = p.l2norm ? 1.f / sqrtf(sq + 1e-6f) : 1.f;
            rk[r] = p.l2norm ? 1.f / sqrtf(sk + 1e-6f) : 1.f;
        }
    }
    if (warp == 0) {
        const float2 cs = gdn_chunk::warp_cumsum_pairs(glog[2 * lane], glog[2 * lane + 1], lane);
        __syncwarp();
        glog[2 * lane] = cs.x;
        glog[2 * lane + 1] = cs.y;
    }
    __syncthreads();
    if (tid < C) {
        const float G_i = glog[tid], G_c = glog[C - 1];
        const float gam = expf(G_i), gu = expf(G_c - G_i);
        rows[R_CK * C + tid] = rk[tid] * gam;
        rows[R_CQ * C + tid] = p.scale * rq[tid] * gam;
        rows[R_CU * C + tid] = rk[tid] * gu;
        rows[R_GAM * C + tid] = gam;
        rows[R_RK * C + tid] = rk[tid];
        rows[R_RQ * C + tid] = rq[tid];
        rows[R_GLOG * C + tid] = G_i;
        rows[R_GU * C + tid] = gu;
        rows[R_GC * C + tid] = expf(G_c);
    }

    /* A (strictly lower) and Pm (lower, with the diagonal) from K K^T and Q K^T, warp w rows 16 w... */
    float kk[8][4], qk[8][4];
    zero_acc(kk);
    zero_acc(qk);
    warp_mm<T, 8, K, false, true, LDK, LDK>(kk, Ks, 16 * warp, Ks, 0, lane);
    warp_mm<T, 8, K, false, true, LDK, LDK>(qk, Qs, 16 * warp, Ks, 0, lane);
    T *pm = reinterpret_cast<T *>(rec) + C * C;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int i = 16 * warp + g + 8 * hr, j = 8 * nt + 2 * t;
            float av[2], pv[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int jj = j + e;
                const float D = jj <= i ? decay(glog[i] - glog[jj]) : 0.f;
                av[e] = jj < i ? bet[i] * rk[i] * rk[jj] * kk[nt][2 * hr + e] * D : 0.f;
                pv[e] = p.scale * rq[i] * rk[jj] * qk[nt][2 * hr + e] * D;
            }
            *reinterpret_cast<float2 *>(As + i * LDF + j) = make_float2(av[0], av[1]);
            *reinterpret_cast<uint32_t *>(pm + i * C + j) = Mma16<T>::pack(pv[0], pv[1]);
        }
    gdn_chunk::prep_inverse<LDF>(As, Ts, tid, 0);
    T *tm = reinterpret_cast<T *>(rec);
    for (int idx = tid; idx < C * C / 2; idx += 128) {
        const int i = idx / (C / 2), j = 2 * (idx % (C / 2));
        *reinterpret_cast<uint32_t *>(tm + i * C + j) =
            Mma16<T>::pack(j <= i ? Ts[i * LDF + j] : 0.f, j + 1 <= i ? Ts[i * LDF + j + 1] : 0.f);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* bwd_chain                                                                                   */

/* Value columns per chain CTA: 32 halves each step's products (the chain's latency) against 64,
 * for the same tile copies per step. */
constexpr int CHAIN_VS = 32;

template <typename T, int K> struct ChainSmem {
    static constexpr int LDK = Pitch<K>::LD, LD64 = Pitch<64>::LD, LDS = Pitch<CHAIN_VS>::LD;
    /* Two stages (the next chunk's copies fly during this chunk's products) of Ks, Qs [C][LDK], Xs
     * (v or dO columns) [C][LDS], Tm, Pm [C][LD64] and the rows; then W, U, O2 [C][LDS] and Sb [K][LDS]. */
    static constexpr int STAGE = (2 * C * LDK + C * LDS + 2 * C * LD64) * 2 + R_COUNT * C * 4;
    static constexpr int BYTES = 2 * STAGE + (3 * C * LDS + K * LDS) * 2;
};

__device__ __forceinline__ int64_t state_off(const gdn_view &s, int64_t n, int64_t hv, int r, int col)
{
    return n * s.s[0] + hv * s.s[1] + r * s.s[2] + col * s.s[3];
}

constexpr int CHAIN_THREADS = 256;

/* Eight warps: in the 64-row products warp w takes rows 16 (w % 4) and value columns 16 (w / 4);
 * in the state (K rows) it takes m16 tile w (K = 128: all CHAIN_VS columns) or tile w % 4 and
 * columns 16 (w / 4) (K = 64). Two warps per scheduler hide each other's fixed latencies. */
template <typename T, int K>
__global__ void __launch_bounds__(CHAIN_THREADS) bwd_chain_kernel(const BwdParams p)
{
    using SM = ChainSmem<T, K>;
    constexpr int LDK = SM::LDK, LD64 = SM::LD64, LDS = SM::LDS, VS = CHAIN_VS, NTH = CHAIN_THREADS;
    static_assert(VS == 32, "bwd_chain: two 16-column halves");
    constexpr int SNT = K == 128 ? VS / 8 : VS / 16; /* n8 tiles of the warp's state slice */
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int mr = 16 * (warp & 3), nc0 = 16 * (warp >> 2); /* the warp's block of the 64-row products */
    const int sr = K == 128 ? 16 * warp : 16 * (warp & 3), sc = K == 128 ? 0 : 16 * (warp >> 2); /* its state block */
    const int64_t vblocks = p.V / VS;
    const int64_t vb = blockIdx.x % vblocks, hv = (blockIdx.x / vblocks) % p.HV, n = blockIdx.x / vblocks / p.HV;
    const bool rev = blockIdx.y != 0;
    const int v0 = (int)vb * VS;
    const int64_t h = hv / p.G;
    int64_t row, bos, len, slot0;
    seq_info(p, n, row, bos, len, slot0);
    const int64_t nc = (len + C - 1) / C;

    T *W = reinterpret_cast<T *>(smem + 2 * SM::STAGE);
    T *U = W + C * LDS;
    T *O2 = U + C * LDS;
    T *Sb = O2 + C * LDS;
    /* Stage b's copies of the chunk of step `step` (none past the last). */
    auto issue = [&](int64_t step, int b) {
        if (step >= nc)
            return;
        const int64_t c = rev ? nc - 1 - step : step;
        const int cl = (int)gdn_chunk::min64(C, len - c * C);
        T *Ks = reinterpret_cast<T *>(smem + b * SM::STAGE);
        T *Qs = Ks + C * LDK, *Xs = Qs + C * LDK, *Tm = Xs + C * LDS, *Pm = Tm + C * LD64;
        const unsigned char *rec = rec_of(p, hv, slot0 + c);
        load_tile<T, K, LDK, NTH>(Ks, p.k, row, bos + c * C, h, cl, 0, tid);
        load_tile<T, VS, LDS, NTH>(Xs, rev ? p.d_o : p.v, row, bos + c * C, hv, cl, v0, tid);
        load_mat<C, C, C, LD64>(Tm, reinterpret_cast<const T *>(rec), 0, tid, NTH);
        if (rev) {
            load_tile<T, K, LDK, NTH>(Qs, p.q, row, bos + c * C, h, cl, 0, tid);
            load_mat<C, C, C, LD64>(Pm, reinterpret_cast<const T *>(rec) + C * C, 0, tid, NTH);
        }
        load_f32(reinterpret_cast<float *>(Pm + C * LD64), rec + 2 * C * C * 2, R_COUNT * C, tid, NTH);
        gdn_sm90::cp_async_commit();
    };
    issue(0, 0);

    /* The running state (or its gradient) block, f32 in registers. */
    float st[SNT][4];
    const gdn_view &init = rev ? p.dht : p.h0;
#pragma unroll
    for (int nt = 0; nt < SNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = sr + g + 8 * (e >> 1), col = v0 + sc + 8 * nt + 2 * t + (e & 1);
            st[nt][e] = init.data ? load_elem(init.data, p.state_dtype, state_off(init, n, hv, r, col)) : 0.f;
        }

    T *ws_tiles = static_cast<T *>(rev ? p.dS : p.S);
    const int64_t tiles = rev ? 2 : 1; /* dS' keeps its rounding error as a second tile (bwd_grad) */
    for (int64_t step = 0; step < nc; ++step) {
        const int64_t c = rev ? nc - 1 - step : step;
        const int64_t slot = slot0 + c;
        const int cl = (int)gdn_chunk::min64(C, len - c * C);
        T *Ks = reinterpret_cast<T *>(smem + (step & 1) * SM::STAGE);
        T *Qs = Ks + C * LDK, *Xs = Qs + C * LDK, *Tm = Xs + C * LDS, *Pm = Tm + C * LD64;
        const float *rows = reinterpret_cast<const float *>(Pm + C * LD64);
        /* The state (rounded to the operands' type) to Sb and to the workspace; for dS' also the
         * rounding error, as a second tile. */
        store_acc<T, SNT, LDS>(Sb + sc, st, sr, lane, 1.f, 1.f);
        T *dst = ws_tiles + ((size_t)hv * p.slots + slot) * tiles * K * p.V + v0;
        if (rev) {
#pragma unroll
            for (int nt = 0; nt < SNT; ++nt)
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    const int r = sr + g + 8 * hr, col = sc + 8 * nt + 2 * t;
                    const float a0 = st[nt][2 * hr], a1 = st[nt][2 * hr + 1];
                    const float2 hi = Mma16<T>::unpack(Mma16<T>::pack(a0, a1));
                    *reinterpret_cast<uint32_t *>(dst + K * p.V + r * p.V + col) = Mma16<T>::pack(a0 - hi.x, a1 - hi.y);
                }
        }
        gdn_sm90::cp_async_wait<0>(); /* this step's stage (the only copies in flight) */
        __syncthreads();
        store_mat<K, VS, LDS>(dst, p.V, Sb, tid, NTH);
        if (!rev && step == nc - 1)
            break; /* the final state is not needed */
        /* The other stage was last read in the previous step, which ended with a barrier. */
        issue(step + 1, (int)((step + 1) & 1));
        const int i0 = mr + g, i1 = i0 + 8;
        const float gC = rows[R_GC * C];
        float acc[2][4];
        zero_acc(acc);
        /* Y = K S (forward) or Z = K dS' (reverse). */
        warp_mm<T, 2, K, false, false, LDK, LDS>(acc, Ks, mr, Sb, nc0, lane);
        if (!rev) {
            /* W = beta (V - ck Y) */
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e < 2 ? i0 : i1, col = nc0 + 8 * nt + 2 * t + (e & 1);
                    acc[nt][e] = rows[R_BETA * C + i] *
                                 (gdn_to_f32(Xs[i * LDS + col]) - rows[R_CK * C + i] * acc[nt][e]);
                }
            store_acc<T, 2, LDS>(W + nc0, acc, mr, lane, 1.f, 1.f);
            __syncthreads();
            zero_acc(acc);
            warp_mm<T, 2, C, false, false, LD64, LDS>(acc, Tm, mr, W, nc0, lane); /* Vn = T W */
            store_acc<T, 2, LDS>(U + nc0, acc, mr, lane, rows[R_CU * C + i0], rows[R_CU * C + i1]);
        } else {
            /* dVn = cu Z + Pm^T dO */
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                acc[nt][0] *= rows[R_CU * C + i0];
                acc[nt][1] *= rows[R_CU * C + i0];
                acc[nt][2] *= rows[R_CU * C + i1];
                acc[nt][3] *= rows[R_CU * C + i1];
            }
            warp_mm<T, 2, C, true, false, LD64, LDS>(acc, Pm, mr, Xs, nc0, lane);
            store_acc<T, 2, LDS>(W + nc0, acc, mr, lane, 1.f, 1.f);
            /* O2 = cq dO, 8 columns a thread */
            for (int idx = tid; idx < C * VS / 8; idx += NTH) {
                const int i = idx / (VS / 8), c8 = (idx % (VS / 8)) * 8;
                const float cq = rows[R_CQ * C + i];
                uint4 w = *reinterpret_cast<const uint4 *>(Xs + i * LDS + c8);
                uint32_t *x = reinterpret_cast<uint32_t *>(&w);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float2 f = Mma16<T>::unpack(x[e]);
                    x[e] = Mma16<T>::pack(cq * f.x, cq * f.y);
                }
                *reinterpret_cast<uint4 *>(O2 + i * LDS + c8) = w;
            }
            __syncthreads();
            zero_acc(acc);
            warp_mm<T, 2, C, true, false, LD64, LDS>(acc, Tm, mr, W, nc0, lane); /* dU = T^T dVn */
            /* dv = dX = beta dU (live rows); U = -ck dX. */
            const float b0 = rows[R_BETA * C + i0], b1 = rows[R_BETA * C + i1];
            T *dv = static_cast<T *>(p.dv.data) + row * p.dv.s[0] + (bos + c * C) * p.dv.s[1] + hv * p.dv.s[2];
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e < 2 ? i0 : i1, col = v0 + nc0 + 8 * nt + 2 * t + (e & 1);
                    acc[nt][e] *= e < 2 ? b0 : b1;
                    if (i < cl)
                        dv[i * p.dv.s[1] + col * p.dv.s[3]] = gdn_from_f32<T>(acc[nt][e]);
                }
            store_acc<T, 2, LDS>(U + nc0, acc, mr, lane, -rows[R_CK * C + i0], -rows[R_CK * C + i1]);
        }
        /* S' = gC S + K^T U (U = cu Vn), or dS = gC dS' + Q^T O2 + K^T U (U = -ck dX, O2 = cq dO). */
        __syncthreads();
#pragma unroll
        for (int nt = 0; nt < SNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                st[nt][e] *= gC;
        if (rev)
            warp_mm<T, SNT, C, true, false, LDK, LDS>(st, Qs, sr, O2, sc, lane);
        warp_mm<T, SNT, C, true, false, LDK, LDS>(st, Ks, sr, U, sc, lane);
        __syncthreads(); /* the tiles and Sb are rewritten next step */
    }
    if (rev && p.dh0.data) {
#pragma unroll
        for (int nt = 0; nt < SNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = sr + g + 8 * (e >> 1), col = v0 + sc + 8 * nt + 2 * t + (e & 1);
                store_elem(p.dh0.data, p.state_dtype, state_off(p.dh0, n, hv, r, col), st[nt][e]);
            }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* bwd_grad                                                                                    */

/* dq or dk from its gradient in the normalised space (summed over the group): dx = r (dxn - xn
 * (xn . dxn)) with xn = r x (r = 1 without the L2 norm), on the warp's key columns cc .. cc + K / 2
 * of rows i0, i1; the row dots over both column halves meet in dotp ([2][C]), summed in a fixed
 * order. Every thread of the CTA calls it (one barrier). */
template <typename T, int NKH, int LDK>
__device__ __forceinline__ void grad_l2_store(const float (&gx)[NKH][4], const T *Xs, const float *r, float *dotp,
                                              int half, int cc, int i0, int i1, int t, int cl, const gdn_view &dx,
                                              int64_t row, int64_t t0, int64_t head, bool l2norm)
{
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < NKH; ++nt) {
        const int d = cc + 8 * nt + 2 * t;
        s0 += gdn_to_f32(Xs[i0 * LDK + d]) * gx[nt][0] + gdn_to_f32(Xs[i0 * LDK + d + 1]) * gx[nt][1];
        s1 += gdn_to_f32(Xs[i1 * LDK + d]) * gx[nt][2] + gdn_to_f32(Xs[i1 * LDK + d + 1]) * gx[nt][3];
    }
    s0 = row_sum4(s0);
    s1 = row_sum4(s1);
    if (t == 0) {
        dotp[half * C + i0] = s0;
        dotp[half * C + i1] = s1;
    }
    __syncthreads();
    const float r0 = r[i0], r1 = r[i1];
    const float p0 = l2norm ? r0 * r0 * (dotp[i0] + dotp[C + i0]) : 0.f;
    const float p1 = l2norm ? r1 * r1 * (dotp[i1] + dotp[C + i1]) : 0.f;
    T *base = static_cast<T *>(dx.data) + row * dx.s[0] + t0 * dx.s[1] + head * dx.s[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int i = hr ? i1 : i0;
        if (i >= cl)
            continue;
        const float ri = hr ? r1 : r0, pi = hr ? p1 : p0;
#pragma unroll
        for (int nt = 0; nt < NKH; ++nt) {
            const int d = cc + 8 * nt + 2 * t;
            const float a = ri * (gx[nt][2 * hr] - gdn_to_f32(Xs[i * LDK + d]) * pi);
            const float b = ri * (gx[nt][2 * hr + 1] - gdn_to_f32(Xs[i * LDK + d + 1]) * pi);
            T *dst = base + i * dx.s[1] + d * dx.s[3];
            if (dx.s[3] == 1 && ((uintptr_t)dst & 3) == 0) {
                *reinterpret_cast<uint32_t *>(dst) = Mma16<T>::pack(a, b);
            } else {
                dst[0] = gdn_from_f32<T>(a);
                dst[dx.s[3]] = gdn_from_f32<T>(b);
            }
        }
    }
}

template <typename T, int K, int V> struct GradSmem {
    static constexpr int LDK = Pitch<K>::LD, LDV = Pitch<V>::LD, LD64 = Pitch<64>::LD;
    /* Qs, Ks [C][LDK]; dOs, Wb, Vnb [C][LDV]; Ss, dSs [K][LDV]; Tm, Pm [C][LD64]; then one region
     * holding in turn dS' lo [K][LDV], dVn lo [C][LDV], then Eq, Ek, F1, F2 [C][LD64]; f32: rows,
     * column partials [4][C], row partials [2][3][C] (one set per column half), reduction [8], the
     * L2-norm row dots of q and k [2][2][C]. */
    static constexpr int LO = K * LDV > 4 * C * LD64 ? K * LDV : 4 * C * LD64;
    static constexpr int HALF = 2 * C * LDK + 3 * C * LDV + 2 * K * LDV + 2 * C * LD64 + LO;
    static constexpr int BYTES = HALF * 2 + (R_COUNT * C + 4 * C + 6 * C + 8 + 4 * C) * 4;
};

constexpr int GRAD_THREADS = 256;

/* Eight warps: warp w owns rows 16 (w % 4) of every result and half of its columns (h = w / 4):
 * value columns h V / 2, key columns h K / 2, chunk columns 32 h. Two warps per scheduler hide
 * each other's latencies. Results that a later product contracts over (dU, Eq, Ek, F1, F2) go
 * through shared memory, whole, since each warp holds only half of their columns. One CTA per
 * (chunk slot, key head) walks the G value heads of the group: q and k are loaded once, and dq, dk
 * are summed in registers instead of through a workspace pass. */
template <typename T, int K, int V>
__global__ void __launch_bounds__(GRAD_THREADS, 1) bwd_grad_kernel(const BwdParams p)
{
    using SM = GradSmem<T, K, V>;
    constexpr int LDK = SM::LDK, LDV = SM::LDV, LD64 = SM::LD64, NTH = GRAD_THREADS;
    constexpr int NVH = V / 16, NKH = K / 16, NJH = C / 16; /* n8 tiles of a warp's column half */
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int64_t h = blockIdx.x % p.H, slot = blockIdx.x / p.H;
    const Loc L = locate(p, slot);
    if (L.cl == 0) {
        if (tid < p.G)
            p.gpart[(h * p.G + tid) * p.slots + slot] = make_float2(0.f, 0.f);
        return;
    }
    T *Qs = reinterpret_cast<T *>(smem);
    T *Ks = Qs + C * LDK;
    T *dOs = Ks + C * LDK;
    T *Wb = dOs + C * LDV; /* W, then dVn hi, then dU */
    T *Vnb = Wb + C * LDV;
    T *Ss = Vnb + C * LDV;
    T *dSs = Ss + K * LDV;
    T *Tm = dSs + K * LDV;
    T *Pm = Tm + C * LD64;
    T *Lo = Pm + C * LD64; /* dS' lo, then dVn lo, then Eq, Ek, F1, F2 */
    T *Eq = Lo, *Ek = Lo + C * LD64, *F1 = Lo + 2 * C * LD64, *F2 = Lo + 3 * C * LD64;
    float *rows = reinterpret_cast<float *>(Lo + SM::LO);
    float *colp = rows + R_COUNT * C; /* [4][C] */
    float *rres = colp + 4 * C;       /* [2][3][C]: dGam row terms, dbeta, S'-term of dGam_C */
    float *red = rres + 6 * C;
    float *dotq = red + 8, *dotk = dotq + 2 * C;

    const int rgrp = warp & 3, half = warp >> 2;
    const int m0 = 16 * rgrp, i0 = m0 + g, i1 = i0 + 8;
    const int cv = half * (V / 2), ckc = half * (K / 2), cj = half * (C / 2);
    const float *ck = rows + R_CK * C, *cu = rows + R_CU * C, *gam = rows + R_GAM * C, *bet = rows + R_BETA * C;
    const float *rk = rows + R_RK * C, *rq = rows + R_RQ * C, *glog = rows + R_GLOG * C, *gu = rows + R_GU * C;
    /* dq, dk in the normalised space, summed over the group's value heads (the warp's key columns). */
    float dqs[NKH][4], dks[NKH][4];
    zero_acc(dqs);
    zero_acc(dks);

    for (int64_t hv = h * p.G; hv < (h + 1) * p.G; ++hv) {
        const bool first = hv == h * p.G;
        float2 *gpart = p.gpart + hv * p.slots + slot;
        const unsigned char *rec = rec_of(p, hv, slot);
        const size_t tile = ((size_t)hv * p.slots + slot) * K * V;
        const T *dS_ws = static_cast<const T *>(p.dS) + 2 * tile;
        /* Four commit groups in the order of first use, so that the products start while the later
         * tiles are still in flight (one CTA per SM: nothing else hides the copies): K (first head
         * only), S, v and the rows; T; dS' (hi, lo), Pm and dO; Q (first head only). */
        if (first)
            load_tile<T, K, LDK, NTH>(Ks, p.k, L.row, L.t0, h, L.cl, 0, tid);
        load_mat<K, V, V, LDV>(Ss, static_cast<const T *>(p.S) + tile, 0, tid, NTH);
        load_tile<T, V, LDV, NTH>(Wb, p.v, L.row, L.t0, hv, L.cl, 0, tid);
        load_f32(rows, rec + 2 * C * C * 2, R_COUNT * C, tid, NTH);
        gdn_sm90::cp_async_commit();
        load_mat<C, C, C, LD64>(Tm, reinterpret_cast<const T *>(rec), 0, tid, NTH);
        gdn_sm90::cp_async_commit();
        load_mat<K, V, V, LDV>(dSs, dS_ws, 0, tid, NTH);
        load_mat<K, V, V, LDV>(Lo, dS_ws + K * V, 0, tid, NTH);
        load_mat<C, C, C, LD64>(Pm, reinterpret_cast<const T *>(rec) + C * C, 0, tid, NTH);
        load_tile<T, V, LDV, NTH>(dOs, p.d_o, L.row, L.t0, hv, L.cl, 0, tid);
        gdn_sm90::cp_async_commit();
        if (first)
            load_tile<T, K, LDK, NTH>(Qs, p.q, L.row, L.t0, h, L.cl, 0, tid);
        gdn_sm90::cp_async_commit();
        gdn_sm90::cp_async_wait<3>();
        __syncthreads();

        const float gC = rows[R_GC * C];
        float rg0 = 0.f, rg1 = 0.f; /* this thread's share of dGam of rows i0, i1 */

        /* X = V - ck (K S), kept in registers; W = beta X in Wb (each thread its own elements). */
        float x[NVH][4];
        zero_acc(x);
        warp_mm<T, NVH, K, false, false, LDK, LDV>(x, Ks, m0, Ss, cv, lane);
#pragma unroll
        for (int nt = 0; nt < NVH; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = e < 2 ? i0 : i1, col = cv + 8 * nt + 2 * t + (e & 1);
                x[nt][e] = gdn_to_f32(Wb[i * LDV + col]) - ck[i] * x[nt][e];
            }
        __syncwarp();
        store_acc<T, NVH, LDV>(Wb + cv, x, m0, lane, bet[i0], bet[i1]);
        gdn_sm90::cp_async_wait<2>(); /* T */
        __syncthreads();
        float acc[NVH][4];
        zero_acc(acc);
        warp_mm<T, NVH, C, false, false, LD64, LDV>(acc, Tm, m0, Wb, cv, lane); /* Vn = T W */
        store_acc<T, NVH, LDV>(Vnb + cv, acc, m0, lane, 1.f, 1.f);
        gdn_sm90::cp_async_wait<1>(); /* dS', Pm, dO */
        __syncthreads();
        /* K dS' and dU = T^T dVn take the hi + lo parts of dS' and dVn: their bf16 rounding would
         * otherwise dominate the error of dbeta (the two terms below cancel in part). */
        zero_acc(acc);
        warp_mm<T, NVH, K, false, false, LDK, LDV>(acc, Ks, m0, dSs, cv, lane); /* K dS' */
        warp_mm<T, NVH, K, false, false, LDK, LDV>(acc, Ks, m0, Lo, cv, lane);
#pragma unroll
        for (int nt = 0; nt < NVH; ++nt) {
            acc[nt][0] *= cu[i0];
            acc[nt][1] *= cu[i0];
            acc[nt][2] *= cu[i1];
            acc[nt][3] *= cu[i1];
        }
        warp_mm<T, NVH, C, true, false, LD64, LDV>(acc, Pm, m0, dOs, cv, lane); /* dVn = cu K dS' + Pm^T dO */
        store_acc<T, NVH, LDV>(Wb + cv, acc, m0, lane, 1.f, 1.f);
        __syncthreads(); /* dS' lo read by all */
#pragma unroll
        for (int nt = 0; nt < NVH; ++nt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int r = m0 + g + 8 * hr, col = cv + 8 * nt + 2 * t;
                const float2 hi = Mma16<T>::unpack(*reinterpret_cast<const uint32_t *>(Wb + r * LDV + col));
                *reinterpret_cast<uint32_t *>(Lo + r * LDV + col) =
                    Mma16<T>::pack(acc[nt][2 * hr] - hi.x, acc[nt][2 * hr + 1] - hi.y);
            }
        __syncthreads();
        zero_acc(acc);
        warp_mm<T, NVH, C, true, false, LD64, LDV>(acc, Tm, m0, Wb, cv, lane); /* dU = T^T dVn */
        warp_mm<T, NVH, C, true, false, LD64, LDV>(acc, Tm, m0, Lo, cv, lane);
        float db0 = 0.f, db1 = 0.f; /* dbeta: dU . X, then sum_j dA_ij B_ij */
#pragma unroll
        for (int nt = 0; nt < NVH; ++nt) {
            db0 += acc[nt][0] * x[nt][0] + acc[nt][1] * x[nt][1];
            db1 += acc[nt][2] * x[nt][2] + acc[nt][3] * x[nt][3];
        }
        __syncthreads(); /* dVn (hi in Wb, lo in Lo) read by all before dU, Eq, Ek, F1, F2 take their place */
        store_acc<T, NVH, LDV>(Wb + cv, acc, m0, lane, 1.f, 1.f);
        gdn_sm90::cp_async_wait<0>(); /* Q */
        __syncthreads();

        /* The 64 x 64 terms on the warp's chunk columns: dP = dO Vn^T with Q K^T (Pm's part),
         * dA = -(dU Vn^T) with K K^T (A's part). */
        float colc[NJH][2]; /* this thread's column shares of dGam (columns cj + 8 nt + 2 t + e) */
        {
            float dp[NJH][4], qk[NJH][4];
            zero_acc(dp);
            zero_acc(qk);
            warp_mm<T, NJH, V, false, true, LDV, LDV>(dp, dOs, m0, Vnb, cj, lane);
            warp_mm<T, NJH, K, false, true, LDK, LDK>(qk, Qs, m0, Ks, cj, lane);
#pragma unroll
            for (int nt = 0; nt < NJH; ++nt) {
                colc[nt][0] = colc[nt][1] = 0.f;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e < 2 ? i0 : i1, j = cj + 8 * nt + 2 * t + (e & 1);
                    const float D = j <= i ? decay(glog[i] - glog[j]) : 0.f;
                    const float em = p.scale * dp[nt][e] * D; /* dL/d(Qn_i . Kn_j) */
                    const float term = em * rq[i] * rk[j] * qk[nt][e]; /* dP_ij Pm_ij */
                    if (e < 2)
                        rg0 += term;
                    else
                        rg1 += term;
                    colc[nt][e & 1] -= term;
                    qk[nt][e] = em * rk[j]; /* Eq */
                    dp[nt][e] = em * rq[i]; /* Ek */
                }
            }
            store_acc<T, NJH, LD64>(Eq + cj, qk, m0, lane, 1.f, 1.f);
            store_acc<T, NJH, LD64>(Ek + cj, dp, m0, lane, 1.f, 1.f);
        }
        {
            float da[NJH][4], kk[NJH][4];
            zero_acc(da);
            zero_acc(kk);
            warp_mm<T, NJH, V, false, true, LDV, LDV>(da, Wb, m0, Vnb, cj, lane);
            warp_mm<T, NJH, K, false, true, LDK, LDK>(kk, Ks, m0, Ks, cj, lane);
#pragma unroll
            for (int nt = 0; nt < NJH; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e < 2 ? i0 : i1, j = cj + 8 * nt + 2 * t + (e & 1);
                    const float D = j < i ? decay(glog[i] - glog[j]) : 0.f;
                    const float dA = -da[nt][e];
                    const float bv = rk[i] * rk[j] * kk[nt][e] * D; /* B_ij */
                    const float term = dA * bet[i] * bv;             /* dA_ij A_ij */
                    if (e < 2) {
                        db0 += dA * bv;
                        rg0 += term;
                    } else {
                        db1 += dA * bv;
                        rg1 += term;
                    }
                    colc[nt][e & 1] -= term;
                    const float f = bet[i] * dA * D; /* dL/d(Kn_i . Kn_j) */
                    kk[nt][e] = f * rk[j];           /* F1 */
                    da[nt][e] = f * rk[i];           /* F2 */
                }
            store_acc<T, NJH, LD64>(F1 + cj, kk, m0, lane, 1.f, 1.f);
            store_acc<T, NJH, LD64>(F2 + cj, da, m0, lane, 1.f, 1.f);
        }
        /* Column shares: sum over the rows of the warp (lanes of equal t), then one row group per warp. */
#pragma unroll
        for (int nt = 0; nt < NJH; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float v = colc[nt][e];
                v += __shfl_xor_sync(0xffffffffu, v, 4);
                v += __shfl_xor_sync(0xffffffffu, v, 8);
                v += __shfl_xor_sync(0xffffffffu, v, 16);
                if (g == 0)
                    colp[rgrp * C + cj + 8 * nt + 2 * t + e] = v;
            }
        __syncthreads(); /* Eq, Ek, F1, F2 whole */

        /* dQn = scale gam (dO S^T) + Eq K, on the warp's key columns. */
        {
            float q1[NKH][4];
            zero_acc(q1);
            warp_mm<T, NKH, V, false, true, LDV, LDV>(q1, dOs, m0, Ss, ckc, lane);
            const float s0 = p.scale * gam[i0], s1 = p.scale * gam[i1];
#pragma unroll
            for (int nt = 0; nt < NKH; ++nt) {
                const int d = ckc + 8 * nt + 2 * t;
                rg0 += s0 * rq[i0] * (gdn_to_f32(Qs[i0 * LDK + d]) * q1[nt][0] + gdn_to_f32(Qs[i0 * LDK + d + 1]) * q1[nt][1]);
                rg1 += s1 * rq[i1] * (gdn_to_f32(Qs[i1 * LDK + d]) * q1[nt][2] + gdn_to_f32(Qs[i1 * LDK + d + 1]) * q1[nt][3]);
                q1[nt][0] *= s0;
                q1[nt][1] *= s0;
                q1[nt][2] *= s1;
                q1[nt][3] *= s1;
            }
            warp_mm<T, NKH, C, false, false, LD64, LDK>(q1, Eq, m0, Ks, ckc, lane);
#pragma unroll
            for (int nt = 0; nt < NKH; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dqs[nt][e] += q1[nt][e];
        }
        /* dKn = gu (Vn dS'^T) - gam beta (dU S^T) + F1 K + F2^T K + Ek^T Q. dGam takes Kn . dKn of the
         * first two terms apart: the X term adds to dGam_i, the S' term subtracts from it and adds to
         * dGam_C. */
        float gc0 = 0.f, gc1 = 0.f; /* dGam_C's share from the S' term */
        {
            float k1[NKH][4], k2[NKH][4];
            zero_acc(k1);
            zero_acc(k2);
            warp_mm<T, NKH, V, false, true, LDV, LDV>(k1, Vnb, m0, dSs, ckc, lane);
            warp_mm<T, NKH, V, false, true, LDV, LDV>(k2, Wb, m0, Ss, ckc, lane);
            const float x0 = -gam[i0] * bet[i0], x1 = -gam[i1] * bet[i1];
            float d10 = 0.f, d11 = 0.f, d20 = 0.f, d21 = 0.f;
#pragma unroll
            for (int nt = 0; nt < NKH; ++nt) {
                const int d = ckc + 8 * nt + 2 * t;
                const float ka = gdn_to_f32(Ks[i0 * LDK + d]), kb = gdn_to_f32(Ks[i0 * LDK + d + 1]);
                const float kc = gdn_to_f32(Ks[i1 * LDK + d]), kd = gdn_to_f32(Ks[i1 * LDK + d + 1]);
                k1[nt][0] *= gu[i0];
                k1[nt][1] *= gu[i0];
                k1[nt][2] *= gu[i1];
                k1[nt][3] *= gu[i1];
                k2[nt][0] *= x0;
                k2[nt][1] *= x0;
                k2[nt][2] *= x1;
                k2[nt][3] *= x1;
                d10 += ka * k1[nt][0] + kb * k1[nt][1];
                d11 += kc * k1[nt][2] + kd * k1[nt][3];
                d20 += ka * k2[nt][0] + kb * k2[nt][1];
                d21 += kc * k2[nt][2] + kd * k2[nt][3];
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    k1[nt][e] += k2[nt][e];
            }
            /* Kn . dKn = rk K . dKn */
            rg0 += rk[i0] * (d20 - d10);
            rg1 += rk[i1] * (d21 - d11);
            gc0 += rk[i0] * d10;
            gc1 += rk[i1] * d11;
            warp_mm<T, NKH, C, false, false, LD64, LDK>(k1, F1, m0, Ks, ckc, lane);
            warp_mm<T, NKH, C, true, false, LD64, LDK>(k1, F2, m0, Ks, ckc, lane);
            warp_mm<T, NKH, C, true, false, LD64, LDK>(k1, Ek, m0, Qs, ckc, lane);
#pragma unroll
            for (int nt = 0; nt < NKH; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dks[nt][e] += k1[nt][e];
        }
        /* Row totals of the warp's columns (the four lanes of a row), then <dS', S> over the CTA in a
         * fixed order. */
        rg0 = row_sum4(rg0);
        rg1 = row_sum4(rg1);
        db0 = row_sum4(db0);
        db1 = row_sum4(db1);
        gc0 = row_sum4(gc0);
        gc1 = row_sum4(gc1);
        if (t == 0) {
            float *rr = rres + half * 3 * C;
            rr[i0] = rg0;
            rr[i1] = rg1;
            rr[C + i0] = db0;
            rr[C + i1] = db1;
            rr[2 * C + i0] = gc0;
            rr[2 * C + i1] = gc1;
        }
        float dot = 0.f;
        for (int idx = tid; idx < K * V / 2; idx += NTH) {
            const int r = idx / (V / 2), c2 = 2 * (idx % (V / 2));
            const float2 a = Mma16<T>::unpack(*reinterpret_cast<const uint32_t *>(Ss + r * LDV + c2));
            const float2 b = Mma16<T>::unpack(*reinterpret_cast<const uint32_t *>(dSs + r * LDV + c2));
            dot += a.x * b.x + a.y * b.y;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            dot += __shfl_xor_sync(0xffffffffu, dot, off);
        if (lane == 0)
            red[warp] = dot;
        __syncthreads();

        /* dGam per row, dg_t = sum over rows i >= t (warp 0, two rows a lane), the gate chain. */
        if (warp == 0) {
            const float *r0 = rres, *r1 = rres + 3 * C;
            float dgam[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = 2 * lane + e;
                dgam[e] = (r0[i] + r1[i]) + ((colp[i] + colp[C + i]) + (colp[2 * C + i] + colp[3 * C + i]));
            }
            if (lane == 31) {
                float gsum = 0.f;
                for (int i = 0; i < C; ++i)
                    gsum += r0[2 * C + i] + r1[2 * C + i];
                dgam[1] += gC * (((red[0] + red[1]) + (red[2] + red[3])) + ((red[4] + red[5]) + (red[6] + red[7]))) + gsum;
            }
            /* Suffix sums: inclusive scan of the pairs from the top lane down. */
            float s = dgam[0] + dgam[1];
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const float u = __shfl_down_sync(0xffffffffu, s, off);
                if (lane + off < 32)
                    s += u;
            }
            const float dgv[2] = {s, s - dgam[0]};
            float pa = 0.f, pb = 0.f;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = 2 * lane + e;
                if (i >= L.cl)
                    continue;
                const int64_t tok = L.t0 + i;
                const float dgt = rows[R_LIVE * C + i] != 0.f ? dgv[e] : 0.f;
                float dbt = r0[C + i] + r1[C + i];
                const int64_t bo = L.row * p.beta.s[0] + tok * p.beta.s[1] + hv * p.beta.s[2];
                if (p.beta_from_logits) {
                    const float sg = gate_sigmoid(load_elem(p.beta.data, p.beta.dtype, bo));
                    dbt *= (p.allow_neg_eigval ? 2.f : 1.f) * sg * (1.f - sg);
                }
                store_elem(p.dbeta.data, p.dbeta.dtype, L.row * p.dbeta.s[0] + tok * p.dbeta.s[1] + hv * p.dbeta.s[2], dbt);
                if (p.g.data) {
                    static_cast<float *>(p.dg.data)[L.row * p.dg.s[0] + tok * p.dg.s[1] + hv * p.dg.s[2]] = dgt;
                } else {
                    /* g = -exp(A_log) softplus(x): dg/dx = -exp(A_log) sigmoid(beta_sp x) (1 past the threshold). */
                    const float xin = load_elem(p.a.data, p.a.dtype, L.row * p.a.s[0] + tok * p.a.s[1] + hv * p.a.s[2]) +
                                      (p.dt_bias ? p.dt_bias[hv * p.dt_h] : 0.f);
                    const float bx = p.sp_beta * xin;
                    const float slope = bx > p.sp_threshold ? 1.f : gate_sigmoid(bx);
                    const float A = expf(p.A_log[hv]);
                    const float dx = dgt * -A * slope;
                    store_elem(p.da.data, p.da.dtype, L.row * p.da.s[0] + tok * p.da.s[1] + hv * p.da.s[2], dx);
                    if (dgt != 0.f) /* a floored token adds nothing, even where g itself overflows to -inf */
                        pa += dgt * gate_log_decay(xin, 0.f, p.A_log[hv], p.sp_beta, p.sp_threshold);
                    pb += dx;
                }
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                pa += __shfl_xor_sync(0xffffffffu, pa, off);
                pb += __shfl_xor_sync(0xffffffffu, pb, off);
            }
            if (lane == 0)
                *gpart = make_float2(pa, pb);
        }
        __syncthreads(); /* every read of this head's tiles done before the next head's copies */
    } /* value heads of the group */
    grad_l2_store<T, NKH, LDK>(dqs, Qs, rq, dotq, half, ckc, i0, i1, t, L.cl, p.dq, L.row, L.t0, h, p.l2norm);
    grad_l2_store<T, NKH, LDK>(dks, Ks, rk, dotk, half, ckc, i0, i1, t, L.cl, p.dk, L.row, L.t0, h, p.l2norm);
}

/* ------------------------------------------------------------------------------------------ */
/* bwd_gate                                                                                    */

/* dA_log[hv], ddt_bias[hv]: the slots' partials in a fixed order (strided shares, then a fixed tree). */
__global__ void __launch_bounds__(256) bwd_gate_kernel(const BwdParams p)
{
    __shared__ float sa[256], sb[256];
    const int64_t hv = blockIdx.x;
    float a = 0.f, b = 0.f;
    for (int64_t s = threadIdx.x; s < p.slots; s += 256) {
        const float2 v = p.gpart[hv * p.slots + s];
        a += v.x;
        b += v.y;
    }
    sa[threadIdx.x] = a;
    sb[threadIdx.x] = b;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w) {
            sa[threadIdx.x] += sa[threadIdx.x + w];
            sb[threadIdx.x] += sb[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (p.dA_log.data)
            store_elem(p.dA_log.data, p.dA_log.dtype, hv * p.dA_log.s[0], sa[0]);
        if (p.ddt_bias.data)
            store_elem(p.ddt_bias.data, p.ddt_bias.dtype, hv * p.ddt_bias.s[0], sb[0]);
    }
}

} /* namespace gdn_bwd */

#endif /* GDN_SM90_CHUNK_BWD_CUH */
