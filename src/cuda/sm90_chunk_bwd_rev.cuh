/*
 * sm90_chunk_bwd_rev.cuh - bwd_rev: the reverse state chain of the backward on warpgroup MMA
 * (wgmma), the forward's chain (chunk_wg, sm90_chunk_wg.cuh) run backwards over the chunks. In the
 * transposed form that chunk_wg uses (dS^T: value rows, key columns), per chunk from the last:
 *
 *   Z^T = dS'^T K^T      dVn^T = Z^T diag(cu) + dO^T Pm      dU^T = dVn^T T      dX^T = dU^T diag(beta)
 *   dS^T = gC dS'^T - (dX^T diag(ck)) K + (dO^T diag(cq)) Q
 *
 * which is chunk_wg's step with dO^T Pm in V^T's place, T for Tb^T and one more product into the
 * state. dv = dX; bwd_grad reads dS' (hi + lo tiles) of every chunk; dh0 is the last dS.
 *
 * One CTA per (sequence, value head, 64 value rows v0 .. v0 + 63), three warpgroups:
 *   warps 0-3 (chain)  dS^T (64 x K, f32) in wgmma accumulators across chunks. Per chunk: dS'^T as
 *                      bf16 A fragments; Z^T (RS, K as K-major B); under it, dS' as hi and lo tiles
 *                      ([key][value], stmatrix.trans) for the aux warpgroup to store; dVn^T from Z^T and
 *                      the aux warpgroup's P^T (f32), rounded once; dU^T (RS, T as MN-major B);
 *                      dX^T to the dv staging tile; the state update: (-ck dX^T) K (RS) and
 *                      (cq dO^T) Q (SS, A from the aux warpgroup's tile), both as MN-major B.
 *   warps 4-7 (aux)    off the chain, per chunk: the stores of dS' (hi, lo) as soon as the chain
 *                      has written them, which frees the tiles for the chain's next chunk (by TMA
 *                      where BwdParams::tma, else 16-byte stores); then P^T = dO^T Pm (RS, dO^T
 *                      fragments by ldmatrix.trans) and the A tile cq dO^T of the next chunk, into
 *                      one of two buffers; then the store of dv (TMA for whole chunks where
 *                      BwdParams::tma_dv, else the valid rows). In that order the chain waits on
 *                      neither the next chunk's copies nor P^T to reuse its dS' tiles.
 *   warps 8-11 (copy)  Q, K, dO tiles and the record's T, Pm and rows of the next chunk into a
 *                      two-stage ring: by TMA where the chunk is whole and the inputs allow it
 *                      (BwdParams::tma), else by cp.async, rows past the sequence end zero-filled.
 *                      cp.async alone could not keep the chain fed (dev/backward/README.md,
 *                      section 15).
 * Rounding points are those of the mma.sync chain it replaced: dS' to the operand type, dVn once,
 * -ck dX once, cq dO once; f32 accumulation and f32 state.
 *
 * Hand-offs between chain and aux run on mbarriers of 128 arrivals (every producing thread arrives
 * after its own writes, which the arrival releases): P^T and cq dO^T ready and consumed (one pair
 * per buffer), dS' tiles written and stored, dv tile written and stored.
 */
#ifndef GDN_SM90_CHUNK_BWD_REV_CUH
#define GDN_SM90_CHUNK_BWD_REV_CUH

#include "sm90_chunk_bwd_common.cuh"
#include "sm90_chunk_scan.cuh"
#include "sm90_primitives.cuh"

namespace gdn_bwd {

constexpr int REV_THREADS = 384, REV_COPY = 128, REV_STAGES = 2;

/* A stage: Q and K tiles (K / 64 boxes each), dO (one box of 64 value columns), T and Pm (one box
 * each), the record's rows; then the hand-off tiles. */
template <int K> struct RevSmem {
    static constexpr int B = gdn_sm90::BOX_BYTES, KB = K / 64;
    static constexpr int Q = 0, KT = Q + KB * B, DO = KT + KB * B, TM = DO + B, PM = TM + B, ROWS = PM + B;
    static constexpr int ROW_BYTES = R_COUNT * C * 4;
    static constexpr int STAGE = (ROWS + ROW_BYTES + 1023) / 1024 * 1024;
    static constexpr int TX = ROWS + ROW_BYTES; /* a stage's bytes, as TMA counts them */
    static constexpr int PBUF = REV_STAGES * STAGE;  /* two buffers of P^T, f32, in accumulator order */
    static constexpr int A2 = PBUF + 2 * C * C * 4;  /* two of cq dO^T, [value][token] (K-major A) */
    static constexpr int DSHI = A2 + 2 * B, DSLO = DSHI + KB * B; /* dS' as [key][value] boxes */
    static constexpr int DV = DSLO + KB * B;         /* dX as [token][value] */
    static constexpr int BARS = DV + B;              /* mbarriers: full[S], empty[S], then the hand-offs */
    enum { P_READY = 2 * REV_STAGES, P_FREE = P_READY + 2, DS_READY = P_FREE + 2, DS_FREE, DV_READY, DV_FREE, NBARS };
    static constexpr int BYTES = BARS + NBARS * 8 + 1024; /* + slack to align the base to 1024 */
};

template <typename T, int K, bool PRE>
__global__ void __launch_bounds__(REV_THREADS, 1) bwd_rev_kernel(const __grid_constant__ BwdParams p)
{
    using namespace gdn_sm90;
    using L = RevSmem<K>;
    constexpr int KB = K / 64, BV = 64;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    const uint32_t sb = smem_u32(smem);
    const uint64_t dk = desc_kmajor(sb), dm = desc_mnmajor(sb);
    /* The warp index through a shuffle: role branches are then warp-uniform to the compiler. */
    const int tid = threadIdx.x, lane = tid & 31, warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
    const int t = tid & 127, w = warp & 3, mi = lane >> 3, r8 = lane & 7;
    /* CTA -> (row block, value head, sequence, segment); PRE: segments 1 .. nseg - 1 over V + K rows,
     * the last K of them virtual (v0 >= V: no dO, the identity to start from). */
    const int64_t rblocks = (PRE ? p.V + K : p.V) / BV;
    const int64_t vb = blockIdx.x % rblocks, hv = (blockIdx.x / rblocks) % p.HV;
    const int64_t n = (blockIdx.x / rblocks / p.HV) % p.N, seg = blockIdx.x / rblocks / p.HV / p.N + (PRE ? 1 : 0);
    const int64_t v0 = vb * BV, h = hv / p.G;
    const bool virt = PRE && v0 >= p.V;
    const gdn_chunk::SeqInfo sq = gdn_chunk::sequence(p, n);
    /* The segment's chunks [ce - nc, ce), walked from the last; rseg: its index in reverse. */
    const int nall = (int)((sq.len + C - 1) / C);
    const int cb = p.seg_chunks > 0 ? (int)gdn_chunk::min64(nall, seg * p.seg_chunks) : 0;
    const int ce = p.seg_chunks > 0 ? (int)gdn_chunk::min64(nall, cb + p.seg_chunks) : nall;
    const int nc = ce - cb;
    const int64_t rseg = p.nseg - 1 - seg, pr = (n * p.HV + hv) * p.nseg + rseg;

    uint64_t *bars = reinterpret_cast<uint64_t *>(smem + L::BARS), *full = bars, *empty = bars + REV_STAGES;
    uint64_t *p_ready = bars + L::P_READY, *p_free = bars + L::P_FREE;
    uint64_t *ds_ready = bars + L::DS_READY, *ds_free = bars + L::DS_FREE;
    uint64_t *dv_ready = bars + L::DV_READY, *dv_free = bars + L::DV_FREE;
    if (tid == 0) {
        for (int i = 0; i < REV_STAGES; ++i) {
            mbar_init(&full[i], REV_COPY);
            mbar_init(&empty[i], 256); /* chain and aux warpgroups */
        }
        for (int i = L::P_READY; i < L::NBARS; ++i)
            mbar_init(&bars[i], 128);
        mbar_fence_init();
    }
    __syncthreads();

    if (warp >= (REV_THREADS - REV_COPY) / 32) {
        /* Copy warpgroup: step k holds chunk ce - 1 - k. */
        regs_dec<112>();
        const int pt = tid % REV_COPY;
        /* Whole chunks of real rows by TMA (one thread issues, the stage's barrier counts the bytes;
         * the other threads arrive at once); the rest by cp.async, all threads arriving once their
         * copies have landed (zero fill past the sequence's end, and the virtual rows' dO). Returns
         * whether the step's copies are cp.async ones still to wait for. */
        auto load_step = [&](int k, int stage) -> bool {
            const int64_t c = ce - 1 - k, t0 = sq.bos + c * C;
            const int cl = (int)gdn_chunk::min64(C, sq.len - c * C);
            unsigned char *base = smem + stage * L::STAGE;
            const int64_t unit = unit_of(p, hv, sq.slot0 + c);
            const unsigned char *rec = rec_of(p, unit);
            if (p.tma && cl == C && !virt) {
                if (pt == 0) {
                    mbar_expect_tx(&full[stage], L::TX);
                    const int rr = rec_map_row(unit);
#pragma unroll
                    for (int b = 0; b < KB; ++b) {
                        tma_load_4d(base + L::Q + b * L::B, &p.tm_q, 64 * b, (int)h, (int)t0, (int)sq.row, &full[stage]);
                        tma_load_4d(base + L::KT + b * L::B, &p.tm_k, 64 * b, (int)h, (int)t0, (int)sq.row, &full[stage]);
                    }
                    tma_load_4d(base + L::DO, &p.tm_do, (int)v0, (int)hv, (int)t0, (int)sq.row, &full[stage]);
                    tma_load_2d(base + L::TM, &p.tm_rec, 0, rr, &full[stage]);
                    tma_load_2d(base + L::PM, &p.tm_rec, 0, rr + C, &full[stage]);
                    bulk_load(base + L::ROWS, rec + REC_ROWS, L::ROW_BYTES, &full[stage]);
                } else {
                    mbar_arrive(&full[stage]);
                }
                return false;
            }
            load_boxes<T, K, REV_COPY>(base + L::Q, p.q, sq.row, t0, h, cl, 0, pt);
            load_boxes<T, K, REV_COPY>(base + L::KT, p.k, sq.row, t0, h, cl, 0, pt);
            load_boxes<T, BV, REV_COPY>(base + L::DO, p.d_o, sq.row, t0, hv, virt ? 0 : cl, virt ? 0 : v0, pt);
            /* T and Pm ([C][C], 128-byte rows) into their boxes, then the rows as they are. */
            for (int u = pt; u < 2 * C * 8; u += REV_COPY) {
                const int tile = u >> 9, r = (u >> 3) & 63, ch = u & 7;
                cp_async16(base + L::TM + tile * L::B + box_offset(r, 8 * ch), rec + 16 * u, 16);
            }
            for (int u = pt; u < L::ROW_BYTES / 16; u += REV_COPY)
                cp_async16(base + L::ROWS + 16 * u, rec + REC_ROWS + 16 * u, 16);
            return true;
        };
        bool pending = nc > 0 && load_step(0, 0);
        cp_async_commit();
        int stage = 0;
#pragma unroll 1
        for (int k = 0; k < nc; ++k, stage ^= 1) {
            if (pending) {
                cp_async_wait<0>();
                fence_proxy_async();
                mbar_arrive(&full[stage]);
            }
            pending = false;
            if (k + 1 < nc) {
                /* The other stage last held step k - 1. */
                if (k >= 1)
                    mbar_wait(&empty[stage ^ 1], (uint32_t)((k - 1) / REV_STAGES) & 1u);
                pending = load_step(k + 1, stage ^ 1);
            }
            cp_async_commit();
        }
        cp_async_wait<0>();
        return;
    }
    regs_inc<192>();

    if (warp < 4) {
        /* Chain warpgroup. s[b][i] = dS^T[v0 + acc_row(t, i)][64 b + acc_col(t, i)], from dht (the
         * last segment), the scan's start (the others) or, in PRE, zeros and the identity. */
        float s[KB][32];
#pragma unroll
        for (int b = 0; b < KB; ++b)
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                const int64_t vv = v0 + acc_row(t, i), d = 64 * b + acc_col(t, i);
                if (virt)
                    s[b][i] = vv - p.V == d ? 1.f : 0.f;
                else if (rseg == 0)
                    s[b][i] = dht_at(p, n, hv, (int)d, (int)vv);
                else
                    s[b][i] = PRE ? 0.f : p.cp_start[(pr * p.V + vv) * K + d];
            }
        int stage = 0;
        uint32_t phase = 0;
#pragma unroll 1
        for (int k = 0; k < nc; ++k) {
            mbar_wait(&full[stage], phase);
            const uint32_t so = stage * L::STAGE;
            const uint64_t dks = desc_add(dk, so), dms = desc_add(dm, so);
            const float *rows = reinterpret_cast<const float *>(smem + so + L::ROWS);

            /* dS'^T as A fragments, then Z^T = dS'^T K^T (M = 64 value rows, N = 64 tokens, k = keys);
             * while Z^T runs, the hi / lo tiles of dS' for bwd_grad, once the aux warpgroup has
             * stored the previous chunk's (the wait sits under the product, not before it). */
            uint32_t sa[K / 16][4];
#pragma unroll
            for (int j = 0; j < K / 16; ++j)
                pack_frag<T>(s[j >> 2], j & 3, sa[j]);
            float z[32];
            fence();
#pragma unroll
            for (int j = 0; j < K / 16; ++j)
                mma_rs<T, 0>(z, sa[j], desc_add(dks, L::KT + kmajor_step(j)), j > 0);
            commit();
            if (k > 0)
                mbar_wait(ds_free, (uint32_t)(k - 1) & 1u); /* dS' of the previous chunk stored */
#pragma unroll
            for (int j = 0; j < K / 16; ++j) {
                const int b = j >> 2, jj = j & 3;
                uint32_t lo[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float2 hi = Mma16<T>::unpack(sa[j][e]);
                    lo[e] = Mma16<T>::pack(s[b][8 * jj + 2 * e] - hi.x, s[b][8 * jj + 2 * e + 1] - hi.y);
                }
                const uint32_t off = b * L::B + box_offset(16 * jj + (mi >> 1) * 8 + r8, 16 * w + (mi & 1) * 8);
                stsm_x4_t(sb + L::DSHI + off, sa[j]);
                stsm_x4_t(sb + L::DSLO + off, lo);
            }
            fence_proxy_async(); /* the aux warpgroup may store the tiles by TMA */
            mbar_arrive(ds_ready);

            /* Meanwhile: dS^T decays by gC; cu. */
            scale_acc(s, rows[R_GC * C]);
            float2 u0[4], u1[4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                col_pairs(rows + R_CU * C, j, t, u0[j], u1[j]);
            const int pb = k & 1;
            mbar_wait(&p_ready[pb], (uint32_t)(k >> 1) & 1u); /* P^T and cq dO^T of this chunk */
            const float4 *pbuf = reinterpret_cast<const float4 *>(smem + L::PBUF + pb * C * C * 4);
            wait<0>();
            acc_fence(z);

            /* dVn^T = Z^T cu + P^T in f32, rounded once into A fragments (k = tokens). */
            uint32_t da[4][4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float4 pa = pbuf[(2 * j) * 128 + t], pb = pbuf[(2 * j + 1) * 128 + t];
                const float *zj = z + 8 * j;
                da[j][0] = Mma16<T>::pack(u0[j].x * zj[0] + pa.x, u0[j].y * zj[1] + pa.y);
                da[j][1] = Mma16<T>::pack(u0[j].x * zj[2] + pa.z, u0[j].y * zj[3] + pa.w);
                da[j][2] = Mma16<T>::pack(u1[j].x * zj[4] + pb.x, u1[j].y * zj[5] + pb.y);
                da[j][3] = Mma16<T>::pack(u1[j].x * zj[6] + pb.z, u1[j].y * zj[7] + pb.w);
            }

            /* dU^T = dVn^T T (T stored [i][j]: MN-major B); then the cq dO^T Q part of the state
             * update, which needs nothing of this chunk's chain and runs while dX is formed. */
            float du[32];
            fence();
#pragma unroll
            for (int j = 0; j < 4; ++j)
                mma_rs<T, 1>(du, da[j], desc_add(dms, L::TM + mnmajor_step(j)), j > 0);
            commit();
#pragma unroll
            for (int b = 0; b < KB; ++b)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    mma_ss<T, 1>(s[b], desc_add(dk, L::A2 + pb * L::B + kmajor_step(j)),
                                 desc_add(dms, L::Q + b * L::B + mnmajor_step(j)), 1);
            commit();
            float2 b0[4], b1[4], c0[4], c1[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                col_pairs(rows + R_BETA * C, j, t, b0[j], b1[j]);
                col_pairs(rows + R_CK * C, j, t, c0[j], c1[j]);
            }
            wait<1>();
            acc_fence(du);

            /* dX^T = dU^T beta: to the dv staging tile ([token][value]); U^T = -ck dX^T, rounded once. */
            uint32_t ua[4][4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float *dj = du + 8 * j;
                dj[0] *= b0[j].x, dj[1] *= b0[j].y, dj[2] *= b0[j].x, dj[3] *= b0[j].y;
                dj[4] *= b1[j].x, dj[5] *= b1[j].y, dj[6] *= b1[j].x, dj[7] *= b1[j].y;
                ua[j][0] = Mma16<T>::pack(-c0[j].x * dj[0], -c0[j].y * dj[1]);
                ua[j][1] = Mma16<T>::pack(-c0[j].x * dj[2], -c0[j].y * dj[3]);
                ua[j][2] = Mma16<T>::pack(-c1[j].x * dj[4], -c1[j].y * dj[5]);
                ua[j][3] = Mma16<T>::pack(-c1[j].x * dj[6], -c1[j].y * dj[7]);
            }
            /* dS^T += U^T K (per box of 64 keys; K as MN-major B), behind the Q part. */
            fence();
            mma_rs_boxes<T, KB>(s, ua, desc_add(dms, L::KT));
            commit();
            /* Meanwhile: dX to the staging tile. */
            if (k > 0)
                mbar_wait(dv_free, (uint32_t)(k - 1) & 1u);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                uint32_t xv[4];
                pack_frag<T>(du, j, xv);
                stsm_x4_t(sb + L::DV + box_offset(16 * j + (mi >> 1) * 8 + r8, 16 * w + (mi & 1) * 8), xv);
            }
            fence_proxy_async();
            mbar_arrive(dv_ready);
            wait<0>();
#pragma unroll
            for (int b = 0; b < KB; ++b)
                acc_fence(s[b]);
            mbar_arrive(&p_free[pb]); /* cq dO^T read by the Q part */
            mbar_arrive(&empty[stage]);
            stage ^= 1;
            phase ^= (uint32_t)(stage == 0);
        }
        if (PRE) /* the segment's map: the local part (real rows), its transfer (virtual rows) */
#pragma unroll
            for (int b = 0; b < KB; ++b)
#pragma unroll
                for (int i = 0; i < 32; i += 2) {
                    const int64_t vv = v0 + acc_row(t, i), d = 64 * b + acc_col(t, i);
                    *reinterpret_cast<float2 *>(p.cp_pre + (pr * (p.V + K) + vv) * K + d) = make_float2(s[b][i], s[b][i + 1]);
                }
        else if (p.dh0.data && seg == 0)
#pragma unroll
            for (int b = 0; b < KB; ++b)
#pragma unroll
                for (int i = 0; i < 32; ++i) {
                    const int64_t vv = v0 + acc_row(t, i), d = 64 * b + acc_col(t, i);
                    store_elem(p.dh0.data, p.state_dtype, state_off(p.dh0, n, hv, (int)d, (int)vv), s[b][i]);
                }
        return;
    }

    /* Aux warpgroup: the dS' stores of chunk step k, P^T and cq dO^T of step k + 1 (the chain needs
     * them half-way through its step k + 1), then the dv store of step k. */
    T *dv = static_cast<T *>(p.dv.data) + sq.row * p.dv.s[0] + hv * p.dv.s[2] + v0 * p.dv.s[3];
    const bool dv_fast = p.dv.s[3] == 1 && ((uintptr_t)dv & 15) == 0 && (p.dv.s[1] & 7) == 0;
    auto produce_p = [&](int k) {
        const int stage = k & 1, pb = k & 1;
        mbar_wait(&full[stage], (uint32_t)(k >> 1) & 1u);
        const uint32_t so = stage * L::STAGE, st = sb + so;
        const float *cq = reinterpret_cast<const float *>(smem + so + L::ROWS) + R_CQ * C;
        /* P^T = dO^T Pm (Pm stored [j][i]: MN-major B); dO^T fragments are also cq dO^T's. */
        uint32_t dof[4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
            ldsm_x4_t(dof[j], st + L::DO + box_offset(16 * j + (mi >> 1) * 8 + r8, 16 * w + (mi & 1) * 8));
        float pacc[32];
        fence();
#pragma unroll
        for (int j = 0; j < 4; ++j)
            mma_rs<T, 1>(pacc, dof[j], desc_add(dm, so + L::PM + mnmajor_step(j)), j > 0);
        commit();
        uint32_t a2[4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float2 q0, q1;
            col_pairs(cq, j, t, q0, q1);
            const float2 x0 = Mma16<T>::unpack(dof[j][0]), x1 = Mma16<T>::unpack(dof[j][1]);
            const float2 x2 = Mma16<T>::unpack(dof[j][2]), x3 = Mma16<T>::unpack(dof[j][3]);
            a2[j][0] = Mma16<T>::pack(q0.x * x0.x, q0.y * x0.y);
            a2[j][1] = Mma16<T>::pack(q0.x * x1.x, q0.y * x1.y);
            a2[j][2] = Mma16<T>::pack(q1.x * x2.x, q1.y * x2.y);
            a2[j][3] = Mma16<T>::pack(q1.x * x3.x, q1.y * x3.y);
        }
        wait<0>();
        acc_fence(pacc);
        mbar_arrive(&empty[stage]); /* dO, Pm and cq read */
        if (k >= 2)
            mbar_wait(&p_free[pb], (uint32_t)((k - 2) >> 1) & 1u); /* the chain is done with step k - 2's */
        float4 *pbuf = reinterpret_cast<float4 *>(smem + L::PBUF + pb * C * C * 4);
#pragma unroll
        for (int q4 = 0; q4 < 8; ++q4)
            pbuf[q4 * 128 + t] = make_float4(pacc[4 * q4], pacc[4 * q4 + 1], pacc[4 * q4 + 2], pacc[4 * q4 + 3]);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            stsm_x4(sb + L::A2 + pb * L::B + box_offset(16 * w + (mi & 1) * 8 + r8, 16 * j + (mi >> 1) * 8), a2[j]);
        fence_proxy_async(); /* the A tile is read by wgmma */
        mbar_arrive(&p_ready[pb]);
    };
    if (nc > 0)
        produce_p(0);
#pragma unroll 1
    for (int k = 0; k < nc; ++k) {
        const int64_t c = ce - 1 - k;
        const int cl = PRE ? 0 : (int)gdn_chunk::min64(C, sq.len - c * C); /* PRE stores nothing */

        /* dS' leaving chunk c: hi and lo, [key][value] rows of 64 values; by TMA, one thread, which
         * frees the tiles once they are read. */
        mbar_wait(ds_ready, (uint32_t)k & 1u);
        if (p.tma && !PRE) {
            if (t == 0) {
                const int r0 = ds_map_row<K>(unit_of(p, hv, sq.slot0 + c));
#pragma unroll
                for (int b = 0; b < 2 * KB; ++b)
                    tma_store_2d(&p.tm_ds, (int)v0, r0 + 64 * b, smem + (b < KB ? L::DSHI : L::DSLO) + (b % KB) * L::B);
                bulk_commit();
                bulk_wait_read<0>();
            }
        } else {
            T *dst = static_cast<T *>(p.dS) + (size_t)unit_of(p, hv, sq.slot0 + c) * 2 * K * p.V + v0;
#pragma unroll 4
            for (int u = t; u < (PRE ? 0 : 2 * K * 8); u += 128) {
                const int tile = u / (K * 8), rr = (u >> 3) % K, ch = u & 7;
                *reinterpret_cast<uint4 *>(dst + (size_t)tile * K * p.V + (size_t)rr * p.V + 8 * ch) =
                    *reinterpret_cast<const uint4 *>(smem + (tile ? L::DSLO : L::DSHI) + (rr >> 6) * L::B +
                                                     box_offset(rr & 63, 8 * ch));
            }
        }
        mbar_arrive(ds_free);
        /* Then the next chunk's P^T: the chain's next chunk waits for the dS' tiles, and the TMA
         * stores leave the warpgroup free at once. */
        if (k + 1 < nc)
            produce_p(k + 1);

        /* dv of the chunk's valid rows: a whole chunk by TMA where dv allows it. */
        mbar_wait(dv_ready, (uint32_t)k & 1u);
        if (p.tma_dv && cl == C) {
            if (t == 0) {
                tma_store_4d(&p.tm_dv, (int)v0, (int)hv, (int)(sq.bos + c * C), (int)sq.row, smem + L::DV);
                bulk_commit();
                bulk_wait_read<0>();
            }
            mbar_arrive(dv_free);
            continue;
        }
        T *dvc = dv + (sq.bos + c * C) * p.dv.s[1];
#pragma unroll
        for (int it = 0; it < 4; ++it) {
            const int r = (t >> 3) + 16 * it, ch = t & 7;
            if (r >= cl)
                continue;
            const uint4 x = *reinterpret_cast<const uint4 *>(smem + L::DV + box_offset(r, 8 * ch));
            if (dv_fast) {
                *reinterpret_cast<uint4 *>(dvc + r * p.dv.s[1] + 8 * ch) = x;
            } else {
                const T *e = reinterpret_cast<const T *>(&x);
#pragma unroll
                for (int i = 0; i < 8; ++i)
                    dvc[r * p.dv.s[1] + (8 * ch + i) * p.dv.s[3]] = e[i];
            }
        }
        mbar_arrive(dv_free);
    }
}

/* Context parallelism for few (sequence, value head) pairs (plan in sm90_chunk_bwd.cu): the
 * reverse chain is affine in the gradient D of the state leaving a chunk, D_c-1 = A_c D_c + b_c
 * (A_c = F_c^T, the forward map's transpose), so a segment's chunks map the D leaving its last
 * chunk to the D entering its first: D^T_in = D^T_out X + L^T. bwd_rev<PRE> finds X and L^T for
 * every segment but the first (the chain over V + K rows: the real ones from zeros, or dht for
 * the last segment, give L^T; K virtual rows with no dO, from the identity, give X); bwd_scan
 * chains them from the last segment (gdn_chunk::scan_rows, the forward's scan, over the segments
 * in reverse); then bwd_rev runs every segment from its D. */
template <int K>
__global__ void __launch_bounds__(gdn_chunk::scan_threads<K>()) bwd_scan_kernel(const BwdParams p)
{
    const int64_t tiles = p.V / gdn_chunk::SCAN_ROWS, pair = blockIdx.x / tiles;
    const int64_t n = pair / p.HV, hv = pair % p.HV, c0 = (blockIdx.x % tiles) * gdn_chunk::SCAN_ROWS;
    gdn_chunk::scan_rows<K>(p.cp_pre + (size_t)pair * p.nseg * (p.V + K) * K, p.cp_start + (size_t)pair * p.nseg * p.V * K,
                            p.V, p.nseg, c0, [&](int64_t vv, int d) { return dht_at(p, n, hv, d, (int)vv); });
}

} /* namespace gdn_bwd */

#endif /* GDN_SM90_CHUNK_BWD_REV_CUH */
