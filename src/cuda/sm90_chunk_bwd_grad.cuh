/*
 * sm90_chunk_bwd_grad.cuh - bwd_grad: every chunk's gradients; bwd_gate: the gate parameters' sums.
 */
#ifndef GDN_SM90_CHUNK_BWD_GRAD_CUH
#define GDN_SM90_CHUNK_BWD_GRAD_CUH

#include "sm90_chunk_bwd_common.cuh"

namespace gdn_bwd {

template <int NT> __device__ __forceinline__ void zero_acc(float (&acc)[NT][4])
{
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
}

/* Sums a value over the four lanes of a fragment row (t = 0 .. 3): the row's full total in each. */
__device__ __forceinline__ float row_sum4(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* Byte offset of (r, c) in a swizzled tile of C rows (tile_off) for a fragment element: r % 8 == g
 * (the lane's row in its 8-row group), so the swizzle takes only the column and the row's part is
 * shared by rows r and r + 8. */
__device__ __forceinline__ uint32_t frag_off(int r, int c, int g)
{
    return (uint32_t)((c >> 6) * (C * 128) + r * 128 + ((((c >> 3) ^ g) & 7) << 4) + (c & 7) * 2);
}

/* Elements (r, c), (r, c + 1) of a swizzled tile of C rows, r % 8 == g, c even. */
template <typename T> __device__ __forceinline__ float2 ld_pair(const unsigned char *tile, int r, int c, int g)
{
    return Mma16<T>::unpack(*reinterpret_cast<const uint32_t *>(tile + frag_off(r, c, g)));
}
template <typename T> __device__ __forceinline__ void st_pair(unsigned char *tile, int r, int c, int g, float a, float b)
{
    *reinterpret_cast<uint32_t *>(tile + frag_off(r, c, g)) = Mma16<T>::pack(a, b);
}

/* A warp's accumulator (rows m0 .. m0 + 15, row m0 + g scaled by s0 and m0 + g + 8 by s1; columns
 * c0 .. c0 + 8 NT) into a swizzled tile of C rows, 16 columns an stmatrix.x4 (the register order of
 * pack_frag: matrix lane / 8 is rows + 8 (lane / 8 % 2), columns + 8 (lane / 16)). */
template <typename T, int NT>
__device__ __forceinline__ void store_acc_sw(unsigned char *tile, const float (&acc)[NT][4], int m0, int c0, int lane,
                                             float s0, float s1)
{
    const int mi = lane >> 3, r8 = lane & 7;
    const uint32_t base = gdn_sm90::smem_u32(tile);
#pragma unroll
    for (int j = 0; j < NT / 2; ++j) {
        const uint32_t a[4] = {Mma16<T>::pack(s0 * acc[2 * j][0], s0 * acc[2 * j][1]),
                               Mma16<T>::pack(s1 * acc[2 * j][2], s1 * acc[2 * j][3]),
                               Mma16<T>::pack(s0 * acc[2 * j + 1][0], s0 * acc[2 * j + 1][1]),
                               Mma16<T>::pack(s1 * acc[2 * j + 1][2], s1 * acc[2 * j + 1][3])};
        gdn_sm90::stsm_x4(base + frag_off(m0 + 8 * (mi & 1) + r8, c0 + 16 * j + 8 * (mi >> 1), r8), a);
    }
}

/* acc (+)= A B on the warpgroup over KSTEPS k16 steps, both operands in shared memory at the
 * addresses a and b: TA / TB = 1 for an MN-major operand, else K-major with RA / RB rows in its
 * tile. Issues only: the caller fences, commits and waits. */
template <typename T, int TA, int TB, int RA, int RB, int KSTEPS, int NT>
__device__ __forceinline__ void wg_mm(float (&acc)[NT][4], uint32_t a, uint32_t b, bool add)
{
    using namespace gdn_sm90;
    const uint64_t da = TA ? desc_mnmajor(a) : desc_kmajor(a), db = TB ? desc_mnmajor(b) : desc_kmajor(b);
#pragma unroll
    for (int j = 0; j < KSTEPS; ++j)
        mma_ss_n<T, TA, TB, NT>(acc, desc_add(da, TA ? mnmajor_step(j) : kstep(RA, j)),
                                desc_add(db, TB ? mnmajor_step(j) : kstep(RB, j)), add || j > 0);
}

/* The warpgroup's products in flight done, their accumulators readable. */
template <int N> __device__ __forceinline__ void wg_wait() { gdn_sm90::commit(); gdn_sm90::wait<N>(); }

/* dq or dk from its gradient in the normalised space (summed over the group): dx = r (dxn - xn
 * (xn . dxn)) with xn = r x (r = 1 without the L2 norm), on the warp's key columns cc .. cc + K / 2
 * of rows i0, i1 (x in the swizzled tile xs); the row dots over both column halves meet in dotp
 * ([2][C]), summed in a fixed order. Every thread of the CTA calls it (one or two barriers).
 * With a map (whole chunks), dx replaces x in xs, each thread its own elements, and one thread
 * stores the tile by TMA: the threads' 4-byte global stores (16 bytes of a row per warp
 * instruction) are far more requests than the tile's 128-byte lines, and they sit at the CTA's
 * end, where nothing else runs on the SM. That thread waits for the store's reads of xs later
 * (bulk_wait_read), before the CTA exits. */
template <typename T, int NKH>
__device__ __forceinline__ void grad_l2_store(const float (&gx)[NKH][4], unsigned char *xs, const float *r,
                                              float *dotp, int half, int cc, int i0, int i1, int t, int cl,
                                              const gdn_view &dx, int64_t row, int64_t t0, int64_t head, bool l2norm,
                                              const CUtensorMap *map)
{
    const int g = i0 & 7;
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < NKH; ++nt) {
        const int d = cc + 8 * nt + 2 * t;
        const float2 x0 = ld_pair<T>(xs, i0, d, g), x1 = ld_pair<T>(xs, i1, d, g);
        s0 += x0.x * gx[nt][0] + x0.y * gx[nt][1];
        s1 += x1.x * gx[nt][2] + x1.y * gx[nt][3];
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
            const float2 xv = ld_pair<T>(xs, i, d, g);
            const float a = ri * (gx[nt][2 * hr] - xv.x * pi);
            const float b = ri * (gx[nt][2 * hr + 1] - xv.y * pi);
            if (map) {
                st_pair<T>(xs, i, d, g, a, b);
                continue;
            }
            T *dst = base + i * dx.s[1] + d * dx.s[3];
            if (dx.s[3] == 1 && ((uintptr_t)dst & 3) == 0) {
                *reinterpret_cast<uint32_t *>(dst) = Mma16<T>::pack(a, b);
            } else {
                dst[0] = gdn_from_f32<T>(a);
                dst[dx.s[3]] = gdn_from_f32<T>(b);
            }
        }
    }
    if (map) {
        gdn_sm90::fence_proxy_async(); /* the tile's generic writes, before the async proxy reads them */
        __syncthreads();
        if (threadIdx.x == 0) {
#pragma unroll
            for (int b = 0; b < NKH / 4; ++b)
                gdn_sm90::tma_store_4d(map, 64 * b, (int)head, (int)t0, (int)row, xs + b * gdn_sm90::BOX_BYTES);
            gdn_sm90::bulk_commit();
        }
    }
}

/* Byte offsets of the tiles, all swizzled (tile_off) and 1024-byte aligned: Q, K [C][K]; dO, Wb
 * (v, then W, then dVn hi, then dU), Vn [C][V]; S^T [V][K]; dS' hi [K][V]; T, Pm [C][C]; then one
 * region holding in turn dS' lo [K][V], dVn lo [C][V], then Eq, Ek, F1, F2 [C][C]. f32 after it:
 * rows, column partials [4][C], row partials [2][3][C] (one set per column half), reduction [8],
 * the L2-norm row dots of q and k [2][2][C]. */
template <typename T, int K, int V> struct GradSmem {
    static constexpr int B = gdn_sm90::BOX_BYTES;
    static constexpr int QS = 0, KS = QS + C * K * 2, DO = KS + C * K * 2, WB = DO + C * V * 2, VN = WB + C * V * 2;
    static constexpr int SS = VN + C * V * 2, DS = SS + V * K * 2, TM = DS + K * V * 2, PM = TM + B, LO = PM + B;
    static constexpr int EQ = LO, EK = LO + B, F1 = LO + 2 * B, F2 = LO + 3 * B;
    static constexpr int F32 = LO + (K * V * 2 > 4 * B ? K * V * 2 : 4 * B);
    static constexpr int BARS = F32 + (R_COUNT * C + 4 * C + 6 * C + 8 + 4 * C) * 4; /* four mbarriers (TMA) */
    static constexpr int BYTES = BARS + 4 * 8 + 1024;                                /* + base alignment */
    /* Bytes of the four copy groups as TMA counts them (K and Q only with the group's first head). */
    static constexpr uint32_t TX0 = V * K * 2, TX_K = C * K * 2, TX1 = C * V * 2 + R_COUNT * C * 4 + C * C * 2;
    static constexpr uint32_t TX2 = 2 * K * V * 2 + C * C * 2 + C * V * 2;
};

constexpr int GRAD_THREADS = 256;

/* The instance that runs two CTAs per SM: only at K = V = 64 do two CTAs' shared memory fit an SM
 * (GradSmem), and its threads then get 128 registers, so its products run leaner (LEAN in the kernel). */
template <int K, int V> constexpr bool grad_two_ctas() { return K == 64 && V == 64; }

/* bwd_grad's copies of one value head without TMA (partial chunks, strided views), by cp.async from
 * every thread in bwd_grad's four groups, each committed. Out of line where bwd_grad runs at two
 * CTAs per SM: inlined, its address arithmetic would spill the registers of the products. The
 * one-CTA instances keep these copies inline in the kernel, on the tile pointers it holds: through
 * this function (inlined or not) ptxas allocates their registers differently (more spill at
 * K = V = 128), for copies that only partial chunks and strided views take. */
template <typename T, int K, int V, int NTH>
__device__ __noinline__ void grad_load_cp(unsigned char *sm, const BwdParams &p, const Loc &L, int64_t h, int64_t hv,
                                          int64_t unit, bool first, int tid)
{
    using SM = GradSmem<T, K, V>;
    const unsigned char *rec = rec_of(p, unit);
    const T *dS_ws = static_cast<const T *>(p.dS) + 2 * (size_t)unit * K * V;
    if (first)
        load_boxes<T, K, NTH>(sm + SM::KS, p.k, L.row, L.t0, h, L.cl, 0, tid);
    load_mat_boxes<V, K, NTH>(sm + SM::SS, static_cast<const T *>(p.S) + (size_t)unit * K * V, tid);
    gdn_sm90::cp_async_commit();
    load_boxes<T, V, NTH>(sm + SM::WB, p.v, L.row, L.t0, hv, L.cl, 0, tid);
    load_f32(reinterpret_cast<float *>(sm + SM::F32), rec + REC_ROWS, R_COUNT * C, tid, NTH);
    load_mat_boxes<C, C, NTH>(sm + SM::TM, rec, tid);
    gdn_sm90::cp_async_commit();
    load_mat_boxes<K, V, NTH>(sm + SM::DS, dS_ws, tid);
    load_mat_boxes<K, V, NTH>(sm + SM::LO, dS_ws + K * V, tid);
    load_mat_boxes<C, C, NTH>(sm + SM::PM, rec + C * C * sizeof(T), tid);
    load_boxes<T, V, NTH>(sm + SM::DO, p.d_o, L.row, L.t0, hv, L.cl, 0, tid);
    gdn_sm90::cp_async_commit();
    if (first)
        load_boxes<T, K, NTH>(sm + SM::QS, p.q, L.row, L.t0, h, L.cl, 0, tid);
    gdn_sm90::cp_async_commit();
}

/* Two warpgroups: warpgroup h owns half of the columns of every result (value columns h V / 2, key
 * columns h K / 2, chunk columns 32 h) over all 64 rows, and computes it with wgmma (m64n64 or
 * m64n32, both operands in shared memory); warp w of a warpgroup holds rows 16 w .. 16 w + 15, in
 * the fragment layout of mma.sync tiles. Results that a later product contracts over (W, Vn, dVn,
 * dU, Eq, Ek, F1, F2) go through shared memory, whole, since each warpgroup holds only half of
 * their columns. One CTA per (chunk slot, key head) walks the G value heads of the group: q and k
 * are loaded once, and dq, dk are summed in registers instead of through a workspace pass. */
template <typename T, int K, int V>
__global__ void __launch_bounds__(GRAD_THREADS, grad_two_ctas<K, V>() ? 2 : 1)
    bwd_grad_kernel(const __grid_constant__ BwdParams p)
{
    using namespace gdn_sm90;
    using SM = GradSmem<T, K, V>;
    constexpr int NTH = GRAD_THREADS;
    constexpr int NVH = V / 16, NKH = K / 16, NJH = C / 16; /* n8 tiles of a warpgroup's column half */
    /* Two CTAs per SM (128 registers a thread): products whose accumulators would all be live at
     * once run in turn instead, each sum in the same order. */
    constexpr bool LEAN = grad_two_ctas<K, V>();
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    const uint32_t sb = smem_u32(sm);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int64_t h = blockIdx.x % p.H, slot = blockIdx.x / p.H;
    const Loc L = locate(p, slot);
    if (L.cl == 0) {
        for (int64_t j = tid; j < p.G; j += NTH) /* a padding slot adds nothing to any head's sums */
            p.gpart[unit_of(p, h * p.G + j, slot)] = make_float2(0.f, 0.f);
        return;
    }
    unsigned char *Qs = sm + SM::QS, *Ks = sm + SM::KS, *Wb = sm + SM::WB, *Lo = sm + SM::LO;
    /* Whole chunks come in by TMA (one thread issues each group against its barrier), the others
     * by cp.async from every thread (zero fill past the sequence's end). */
    const bool tma = p.tma_grad && L.cl == C;
    uint64_t *bars = reinterpret_cast<uint64_t *>(sm + SM::BARS);
    if (tma) {
        if (tid == 0) {
            for (int i = 0; i < 4; ++i)
                mbar_init(&bars[i], 1);
            mbar_fence_init();
        }
        __syncthreads();
    }
    float *rows = reinterpret_cast<float *>(sm + SM::F32);
    float *colp = rows + R_COUNT * C; /* [4][C] */
    float *rres = colp + 4 * C;       /* [2][3][C]: dGam row terms, dbeta, S'-term of dGam_C */
    float *red = rres + 6 * C;
    float *dotq = red + 8, *dotk = dotq + 2 * C;

    const int rgrp = warp & 3, half = warp >> 2;
    const int m0 = 16 * rgrp, i0 = m0 + g, i1 = i0 + 8;
    const int cv = half * (V / 2), ckc = half * (K / 2), cj = half * (C / 2);
    const float *ck = rows + R_CK * C, *cu = rows + R_CU * C, *gam = rows + R_GAM * C, *bet = rows + R_BETA * C;
    const float *rk = rows + R_RK * C, *rq = rows + R_RQ * C, *glog = rows + R_GLOG * C, *gu = rows + R_GU * C;
    /* Operands by address: B of a column half (MN-major: the half's columns; K-major: its rows). */
    const uint32_t aQ = sb + SM::QS, aK = sb + SM::KS, aDO = sb + SM::DO, aW = sb + SM::WB, aVN = sb + SM::VN;
    const uint32_t aT = sb + SM::TM, aP = sb + SM::PM, aLO = sb + SM::LO;
    const uint32_t bS_v = sb + SM::SS + cv * 128, bS_k = sb + SM::SS + tile_off(V, 0, ckc);
    const uint32_t bDS_v = sb + SM::DS + tile_off(K, 0, cv), bLO_v = aLO + tile_off(K, 0, cv), bDS_k = sb + SM::DS + ckc * 128;
    const uint32_t bW_v = aW + tile_off(C, 0, cv), bDO_v = aDO + tile_off(C, 0, cv), bDVL_v = aLO + tile_off(C, 0, cv);
    const uint32_t bVN_j = aVN + cj * 128, bK_j = aK + cj * 128, bK_k = aK + tile_off(C, 0, ckc), bQ_k = aQ + tile_off(C, 0, ckc);
    /* dq, dk in the normalised space, summed over the group's value heads (the warpgroup's key columns). */
    float dqs[NKH][4], dks[NKH][4];
    zero_acc(dqs);
    zero_acc(dks);

    for (int64_t hv = h * p.G; hv < (h + 1) * p.G; ++hv) {
        const bool first = hv == h * p.G;
        const int64_t unit = unit_of(p, hv, slot);
        float2 *gpart = p.gpart + unit;
        const unsigned char *rec = rec_of(p, unit);
        const size_t tile = (size_t)unit * K * V;
        const T *dS_ws = static_cast<const T *>(p.dS) + 2 * tile;
        /* Four copy groups in the order of first use, so that the products start while the later
         * tiles are still in flight (one CTA per SM: nothing else hides the copies): K (first head
         * only) and S; v, the rows and T; dS' (hi, lo), Pm and dO; Q (first head only). */
        const uint32_t par = (uint32_t)(hv - h * p.G) & 1u; /* each barrier completes once a head */
        if (tma) {
            if (tid == 0) {
                const int tok = (int)L.t0, brow = (int)L.row;
                const int srow = (int)(unit * V), drow = ds_map_row<K>(unit), rrow = rec_map_row(unit);
                mbar_expect_tx(&bars[0], SM::TX0 + (first ? SM::TX_K : 0u));
                if (first)
                    for (int b = 0; b < K / 64; ++b)
                        tma_load_4d(Ks + b * BOX_BYTES, &p.tm_k, 64 * b, (int)h, tok, brow, &bars[0]);
                for (int b = 0; b < K / 64; ++b) /* S^T [V][K]: stripes of 64 keys, V rows each */
                    for (int r = 0; r < V / 64; ++r)
                        tma_load_2d(sm + SM::SS + tile_off(V, 64 * r, 64 * b), &p.tm_s, 64 * b, srow + 64 * r, &bars[0]);
                mbar_expect_tx(&bars[1], SM::TX1);
                for (int b = 0; b < V / 64; ++b)
                    tma_load_4d(Wb + b * BOX_BYTES, &p.tm_v, 64 * b, (int)hv, tok, brow, &bars[1]);
                bulk_load(rows, rec + REC_ROWS, R_COUNT * C * 4, &bars[1]);
                tma_load_2d(sm + SM::TM, &p.tm_rec, 0, rrow, &bars[1]);
                mbar_expect_tx(&bars[2], SM::TX2);
                for (int b = 0; b < V / 64; ++b) /* dS' hi, lo [K][V]: stripes of 64 values, K rows each */
                    for (int r = 0; r < K / 64; ++r) {
                        tma_load_2d(sm + SM::DS + tile_off(K, 64 * r, 64 * b), &p.tm_ds, 64 * b, drow + 64 * r, &bars[2]);
                        tma_load_2d(Lo + tile_off(K, 64 * r, 64 * b), &p.tm_ds, 64 * b, drow + K + 64 * r, &bars[2]);
                    }
                tma_load_2d(sm + SM::PM, &p.tm_rec, 0, rrow + C, &bars[2]);
                for (int b = 0; b < V / 64; ++b)
                    tma_load_4d(sm + SM::DO + b * BOX_BYTES, &p.tm_do, 64 * b, (int)hv, tok, brow, &bars[2]);
                if (first) {
                    mbar_expect_tx(&bars[3], SM::TX_K);
                    for (int b = 0; b < K / 64; ++b)
                        tma_load_4d(Qs + b * BOX_BYTES, &p.tm_q, 64 * b, (int)h, tok, brow, &bars[3]);
                }
            }
        } else if constexpr (LEAN) {
            grad_load_cp<T, K, V, NTH>(sm, p, L, h, hv, unit, first, tid);
        } else {
            if (first)
                load_boxes<T, K, NTH>(Ks, p.k, L.row, L.t0, h, L.cl, 0, tid);
            load_mat_boxes<V, K, NTH>(sm + SM::SS, static_cast<const T *>(p.S) + tile, tid);
            cp_async_commit();
            load_boxes<T, V, NTH>(Wb, p.v, L.row, L.t0, hv, L.cl, 0, tid);
            load_f32(rows, rec + REC_ROWS, R_COUNT * C, tid, NTH);
            load_mat_boxes<C, C, NTH>(sm + SM::TM, rec, tid);
            cp_async_commit();
            load_mat_boxes<K, V, NTH>(sm + SM::DS, dS_ws, tid);
            load_mat_boxes<K, V, NTH>(Lo, dS_ws + K * V, tid);
            load_mat_boxes<C, C, NTH>(sm + SM::PM, rec + C * C * sizeof(T), tid);
            load_boxes<T, V, NTH>(sm + SM::DO, p.d_o, L.row, L.t0, hv, L.cl, 0, tid);
            cp_async_commit();
            if (first)
                load_boxes<T, K, NTH>(Qs, p.q, L.row, L.t0, h, L.cl, 0, tid);
            cp_async_commit();
        }
        if (tma)
            mbar_wait(&bars[0], par); /* K, S */
        else
            cp_async_wait<3>();
        fence_proxy_async(); /* this thread's copies and stores, before any warpgroup's wgmma reads them */
        __syncthreads();

        /* X = V - ck (K S), kept in registers; W = beta X in Wb (each thread its own elements). */
        float x[NVH][4];
        fence();
        wg_mm<T, 0, 0, C, V, K / 16>(x, aK, bS_v, false);
        commit();
        if (tma)
            mbar_wait(&bars[1], par); /* v, rows, T */
        else
            cp_async_wait<2>();
        fence_proxy_async();
        __syncthreads();
        const float gC = rows[R_GC * C];
        float rg0 = 0.f, rg1 = 0.f; /* this thread's share of dGam of rows i0, i1 */
        wait<0>();
        acc_fence(x);
#pragma unroll
        for (int nt = 0; nt < NVH; ++nt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int i = hr ? i1 : i0;
                const float2 vv = ld_pair<T>(Wb, i, cv + 8 * nt + 2 * t, g);
                x[nt][2 * hr] = vv.x - ck[i] * x[nt][2 * hr];
                x[nt][2 * hr + 1] = vv.y - ck[i] * x[nt][2 * hr + 1];
            }
        store_acc_sw<T>(Wb, x, m0, cv, lane, bet[i0], bet[i1]);
        fence_proxy_async();
        __syncthreads(); /* W whole */
        float acc[NVH][4];
        fence();
        wg_mm<T, 0, 1, C, 0, C / 16>(acc, aT, bW_v, false); /* Vn = T W */
        wg_wait<0>();
        acc_fence(acc);
        store_acc_sw<T>(sm + SM::VN, acc, m0, cv, lane, 1.f, 1.f);
        if (tma)
            mbar_wait(&bars[2], par); /* dS', Pm, dO */
        else
            cp_async_wait<1>();
        fence_proxy_async();
        __syncthreads();
        /* K dS' and dU = T^T dVn take the hi + lo parts of dS' and dVn: their bf16 rounding would
         * otherwise dominate the error of dbeta (the two terms below cancel in part). */
        fence();
        wg_mm<T, 0, 1, C, 0, K / 16>(acc, aK, bDS_v, false); /* K dS' */
        wg_mm<T, 0, 1, C, 0, K / 16>(acc, aK, bLO_v, true);
        wg_wait<0>();
        acc_fence(acc);
#pragma unroll
        for (int nt = 0; nt < NVH; ++nt) {
            acc[nt][0] *= cu[i0];
            acc[nt][1] *= cu[i0];
            acc[nt][2] *= cu[i1];
            acc[nt][3] *= cu[i1];
        }
        fence();
        wg_mm<T, 1, 1, 0, 0, C / 16>(acc, aP, bDO_v, true); /* dVn = cu K dS' + Pm^T dO */
        wg_wait<0>();
        acc_fence(acc);
        __syncthreads(); /* W and dS' lo read by both warpgroups */
#pragma unroll
        for (int nt = 0; nt < NVH; ++nt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int r = m0 + g + 8 * hr, col = cv + 8 * nt + 2 * t;
                const uint32_t hi = Mma16<T>::pack(acc[nt][2 * hr], acc[nt][2 * hr + 1]);
                const float2 hf = Mma16<T>::unpack(hi);
                *reinterpret_cast<uint32_t *>(Wb + frag_off(r, col, g)) = hi;
                st_pair<T>(Lo, r, col, g, acc[nt][2 * hr] - hf.x, acc[nt][2 * hr + 1] - hf.y);
            }
        fence_proxy_async();
        __syncthreads();
        fence();
        wg_mm<T, 1, 1, 0, 0, C / 16>(acc, aT, bW_v, false); /* dU = T^T dVn */
        wg_mm<T, 1, 1, 0, 0, C / 16>(acc, aT, bDVL_v, true);
        wg_wait<0>();
        acc_fence(acc);
        float db0 = 0.f, db1 = 0.f; /* dbeta: dU . X, then sum_j dA_ij B_ij */
#pragma unroll
        for (int nt = 0; nt < NVH; ++nt) {
            db0 += acc[nt][0] * x[nt][0] + acc[nt][1] * x[nt][1];
            db1 += acc[nt][2] * x[nt][2] + acc[nt][3] * x[nt][3];
        }
        __syncthreads(); /* dVn (hi in Wb, lo in Lo) read by both before dU, Eq, Ek, F1, F2 take their place */
        store_acc_sw<T>(Wb, acc, m0, cv, lane, 1.f, 1.f);
        if (!tma)
            cp_async_wait<0>(); /* Q */
        else if (first)
            mbar_wait(&bars[3], 0);
        fence_proxy_async();
        __syncthreads();

        /* The 64 x 64 terms on the warpgroup's chunk columns: dP = dO Vn^T with Q K^T (Pm's part),
         * dA = -(dU Vn^T) with K K^T (A's part); the second pair runs while the first's terms form,
         * except at two CTAs per SM (LEAN), where it starts after them. */
        float colc[NJH][2]; /* this thread's column shares of dGam (columns cj + 8 nt + 2 t + e) */
        {
            float dp[NJH][4], qk[NJH][4], da[NJH][4], kk[NJH][4];
            fence();
            wg_mm<T, 0, 0, C, C, V / 16>(dp, aDO, bVN_j, false);
            wg_mm<T, 0, 0, C, C, K / 16>(qk, aQ, bK_j, false);
            commit();
            if constexpr (!LEAN) {
                wg_mm<T, 0, 0, C, C, V / 16>(da, aW, bVN_j, false);
                wg_mm<T, 0, 0, C, C, K / 16>(kk, aK, bK_j, false);
            }
            wg_wait<LEAN ? 0 : 1>();
            acc_fence(dp);
            acc_fence(qk);
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
            store_acc_sw<T>(sm + SM::EQ, qk, m0, cj, lane, 1.f, 1.f);
            store_acc_sw<T>(sm + SM::EK, dp, m0, cj, lane, 1.f, 1.f);
            if constexpr (LEAN) {
                fence();
                wg_mm<T, 0, 0, C, C, V / 16>(da, aW, bVN_j, false);
                wg_mm<T, 0, 0, C, C, K / 16>(kk, aK, bK_j, false);
                commit();
            }
            wait<0>();
            acc_fence(da);
            acc_fence(kk);
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
            store_acc_sw<T>(sm + SM::F1, kk, m0, cj, lane, 1.f, 1.f);
            store_acc_sw<T>(sm + SM::F2, da, m0, cj, lane, 1.f, 1.f);
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

        /* dQn = scale gam (dO S^T) + Eq K and dKn = gu (Vn dS'^T) - gam beta (dU S^T) + F1 K + F2^T K
         * + Ek^T Q, on the warpgroup's key columns. The products that need only the loaded tiles
         * start before the barrier that publishes Eq, Ek, F1, F2 (LEAN: q1 only, then k1 and k2 in
         * turn after it). dGam takes Kn . dKn of the first
         * two terms of dKn apart: the X term adds to dGam_i, the S' term subtracts from it and adds
         * to dGam_C. The products of Eq, Ek, F1, F2 accumulate straight into the group's sums. */
        float q1[NKH][4], k1[NKH][4], k2[NKH][4];
        fence();
        wg_mm<T, 0, 1, C, 0, V / 16>(q1, aDO, bS_k, false);
        commit();
        if constexpr (!LEAN) {
            wg_mm<T, 0, 0, C, K, V / 16>(k1, aVN, bDS_k, false);
            wg_mm<T, 0, 1, C, 0, V / 16>(k2, aW, bS_k, false);
            commit();
        }
        fence_proxy_async();
        __syncthreads(); /* Eq, Ek, F1, F2 whole */
        wait<LEAN ? 0 : 1>();
        acc_fence(q1);
        {
            const float s0 = p.scale * gam[i0], s1 = p.scale * gam[i1];
#pragma unroll
            for (int nt = 0; nt < NKH; ++nt) {
                const int d = ckc + 8 * nt + 2 * t;
                const float2 qa = ld_pair<T>(Qs, i0, d, g), qb = ld_pair<T>(Qs, i1, d, g);
                rg0 += s0 * rq[i0] * (qa.x * q1[nt][0] + qa.y * q1[nt][1]);
                rg1 += s1 * rq[i1] * (qb.x * q1[nt][2] + qb.y * q1[nt][3]);
                dqs[nt][0] += s0 * q1[nt][0];
                dqs[nt][1] += s0 * q1[nt][1];
                dqs[nt][2] += s1 * q1[nt][2];
                dqs[nt][3] += s1 * q1[nt][3];
            }
        }
        fence();
        wg_mm<T, 0, 1, C, 0, C / 16>(dqs, sb + SM::EQ, bK_k, true);
        commit();
        float gc0 = 0.f, gc1 = 0.f; /* dGam_C's share from the S' term */
        if constexpr (LEAN) {
            /* k1, then k2, each scaled and dotted with K on its own; their sum as below. */
            const float x0 = -gam[i0] * bet[i0], x1 = -gam[i1] * bet[i1];
            float d10 = 0.f, d11 = 0.f, d20 = 0.f, d21 = 0.f;
            /* acc's rows i0, i1 times s0, s1, and their dots with K's rows into d0, d1; with `first`
             * (k1, when acc is k2), dks += first + acc, in the one pass over the columns. */
            auto scale_dot = [&](float (&acc)[NKH][4], float s0, float s1, float &d0, float &d1,
                                 const float (*first)[4]) {
#pragma unroll
                for (int nt = 0; nt < NKH; ++nt) {
                    const int d = ckc + 8 * nt + 2 * t;
                    const float2 ka = ld_pair<T>(Ks, i0, d, g), kc = ld_pair<T>(Ks, i1, d, g);
                    acc[nt][0] *= s0;
                    acc[nt][1] *= s0;
                    acc[nt][2] *= s1;
                    acc[nt][3] *= s1;
                    d0 += ka.x * acc[nt][0] + ka.y * acc[nt][1];
                    d1 += kc.x * acc[nt][2] + kc.y * acc[nt][3];
                    if (first) {
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            dks[nt][e] += first[nt][e] + acc[nt][e];
                    }
                }
            };
            wg_mm<T, 0, 0, C, K, V / 16>(k1, aVN, bDS_k, false);
            wg_wait<0>();
            acc_fence(k1);
            scale_dot(k1, gu[i0], gu[i1], d10, d11, nullptr);
            fence();
            wg_mm<T, 0, 1, C, 0, V / 16>(k2, aW, bS_k, false);
            wg_wait<0>();
            acc_fence(k2);
            scale_dot(k2, x0, x1, d20, d21, k1);
            rg0 += rk[i0] * (d20 - d10);
            rg1 += rk[i1] * (d21 - d11);
            gc0 += rk[i0] * d10;
            gc1 += rk[i1] * d11;
        } else {
            wait<1>();
            acc_fence(k1);
            acc_fence(k2);
            const float x0 = -gam[i0] * bet[i0], x1 = -gam[i1] * bet[i1];
            float d10 = 0.f, d11 = 0.f, d20 = 0.f, d21 = 0.f;
#pragma unroll
            for (int nt = 0; nt < NKH; ++nt) {
                const int d = ckc + 8 * nt + 2 * t;
                const float2 ka = ld_pair<T>(Ks, i0, d, g), kc = ld_pair<T>(Ks, i1, d, g);
                k1[nt][0] *= gu[i0];
                k1[nt][1] *= gu[i0];
                k1[nt][2] *= gu[i1];
                k1[nt][3] *= gu[i1];
                k2[nt][0] *= x0;
                k2[nt][1] *= x0;
                k2[nt][2] *= x1;
                k2[nt][3] *= x1;
                d10 += ka.x * k1[nt][0] + ka.y * k1[nt][1];
                d11 += kc.x * k1[nt][2] + kc.y * k1[nt][3];
                d20 += ka.x * k2[nt][0] + ka.y * k2[nt][1];
                d21 += kc.x * k2[nt][2] + kc.y * k2[nt][3];
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dks[nt][e] += k1[nt][e] + k2[nt][e];
            }
            /* Kn . dKn = rk K . dKn */
            rg0 += rk[i0] * (d20 - d10);
            rg1 += rk[i1] * (d21 - d11);
            gc0 += rk[i0] * d10;
            gc1 += rk[i1] * d11;
        }
        fence();
        wg_mm<T, 0, 1, C, 0, C / 16>(dks, sb + SM::F1, bK_k, true);
        wg_mm<T, 1, 1, 0, 0, C / 16>(dks, sb + SM::F2, bK_k, true);
        wg_mm<T, 1, 1, 0, 0, C / 16>(dks, sb + SM::EK, bQ_k, true);
        commit();
        /* Row totals of the warp's columns (the four lanes of a row), then <dS', S> over the CTA in a
         * fixed order, while the last products run. */
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
        /* <S, dS'> from S^T and dS' by 8 x 8 blocks: ldmatrix gives a lane the same elements of a
         * block of S^T and (transposing) of dS'^T, four blocks an instruction, conflict-free. */
        float dot = 0.f;
        for (int it = warp; it < (V / 8) * (K / 8) / 4; it += NTH / 32) {
            const int bi = 4 * it + (lane >> 3), vb = bi % (V / 8), db = bi / (V / 8), r = lane & 7;
            uint32_t sa[4], sd[4];
            ldsm_x4(sa, sb + SM::SS + tile_off(V, vb * 8 + r, db * 8));
            ldsm_x4_t(sd, sb + SM::DS + tile_off(K, db * 8 + r, vb * 8));
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                const float2 a = Mma16<T>::unpack(sa[m]), b = Mma16<T>::unpack(sd[m]);
                dot += a.x * b.x + a.y * b.y;
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            dot += __shfl_xor_sync(0xffffffffu, dot, off);
        if (lane == 0)
            red[warp] = dot;
        wait<0>();
        acc_fence(dqs);
        acc_fence(dks);
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
            /* The S'-terms of dGam_C: two rows a lane, then a butterfly (a fixed tree, every lane the total). */
            float gsum = (r0[2 * C + 2 * lane] + r1[2 * C + 2 * lane]) + (r0[2 * C + 2 * lane + 1] + r1[2 * C + 2 * lane + 1]);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                gsum += __shfl_xor_sync(0xffffffffu, gsum, off);
            if (lane == 31)
                dgam[1] += gC * (((red[0] + red[1]) + (red[2] + red[3])) + ((red[4] + red[5]) + (red[6] + red[7]))) + gsum;
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
                if (p.beta_from_logits)
                    dbt *= gate_beta_grad(load_elem(p.beta.data, p.beta.dtype, bo), p.allow_neg_eigval);
                store_elem(p.dbeta.data, p.dbeta.dtype, L.row * p.dbeta.s[0] + tok * p.dbeta.s[1] + hv * p.dbeta.s[2], dbt);
                if (p.g.data) {
                    static_cast<float *>(p.dg.data)[L.row * p.dg.s[0] + tok * p.dg.s[1] + hv * p.dg.s[2]] = dgt;
                } else {
                    /* g = -exp(A_log) softplus(x): dg/dx = -exp(A_log) softplus'(x). */
                    const float xin = load_elem(p.a.data, p.a.dtype, L.row * p.a.s[0] + tok * p.a.s[1] + hv * p.a.s[2]) +
                                      (p.dt_bias ? p.dt_bias[hv * p.dt_h] : 0.f);
                    const float slope = gate_softplus_slope(xin, p.sp_beta, p.sp_threshold);
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
        fence_proxy_async(); /* this thread's stores to the tiles before the next head's TMA writes */
        __syncthreads(); /* every read of this head's tiles done before the next head's copies */
    } /* value heads of the group */
    const bool tma_dqk = p.tma_dqk && L.cl == C;
    grad_l2_store<T, NKH>(dqs, Qs, rq, dotq, half, ckc, i0, i1, t, L.cl, p.dq, L.row, L.t0, h, p.l2norm,
                          tma_dqk ? &p.tm_dq : nullptr);
    grad_l2_store<T, NKH>(dks, Ks, rk, dotk, half, ckc, i0, i1, t, L.cl, p.dk, L.row, L.t0, h, p.l2norm,
                          tma_dqk ? &p.tm_dk : nullptr);
    if (tma_dqk && tid == 0)
        bulk_wait_read<0>();
}

/* dA_log[hv], ddt_bias[hv]: the slots' partials in a fixed order (strided shares, then a fixed tree). */
__global__ void __launch_bounds__(256) bwd_gate_kernel(const BwdParams p)
{
    __shared__ float sa[256], sb[256];
    const int64_t hv = blockIdx.x;
    float a = 0.f, b = 0.f;
    for (int64_t s = threadIdx.x; s < p.slots; s += 256) {
        const float2 v = p.gpart[unit_of(p, hv, s)];
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

#endif /* GDN_SM90_CHUNK_BWD_GRAD_CUH */
