/*
 * sm90_chunk_bwd_chain.cuh - bwd_chain: the forward state chain, where the forward did not save the
 * states (gdn_chunk_fwd_args.saved_states): S entering every chunk, as S^T, for bwd_grad. The
 * reverse chain is bwd_rev (sm90_chunk_bwd_rev.cuh).
 */
#ifndef GDN_SM90_CHUNK_BWD_CHAIN_CUH
#define GDN_SM90_CHUNK_BWD_CHAIN_CUH

#include "sm90_chunk_bwd_common.cuh"

namespace gdn_bwd {

/* Value columns per chain CTA (VS): 32 halves each step's products (the chain's latency) against
 * 64, for the same tile copies per step; 16 halves them again where the 32-column CTAs would leave
 * most SMs idle (few sequences and heads: BwdParams::chain_vs), at twice the tile copies per
 * column. */
template <typename T, int K, int VS> struct ChainSmem {
    static constexpr int LDK = Pitch<K>::LD, LD64 = Pitch<64>::LD, LDS = Pitch<VS>::LD;
    /* Two stages (the next chunk's copies fly during this chunk's products) of Ks [C][LDK], Xs (v
     * columns) [C][LDS], Tm [C][LD64] and the rows; then W, U [C][LDS] and Sb [K][LDS]. */
    static constexpr int STAGE = (C * LDK + C * LDS + C * LD64) * 2 + R_COUNT * C * 4;
    static constexpr int BYTES = 2 * STAGE + (2 * C * LDS + K * LDS) * 2;
};

__device__ __forceinline__ int64_t state_off(const gdn_view &s, int64_t n, int64_t hv, int r, int col)
{
    return n * s.s[0] + hv * s.s[1] + r * s.s[2] + col * s.s[3];
}

constexpr int CHAIN_THREADS = 256;

/* Eight warps: in the 64-row products warp w takes rows 16 (w % 4) and value columns 16 (w / 4);
 * in the state (K rows) it takes m16 tile w (K = 128: all VS columns) or tile w % 4 and columns
 * 16 (w / 4) (K = 64). Two warps per scheduler hide each other's fixed latencies. With VS = 16
 * warps 4-7 sit out the 64-row products (and at K = 64 the state's). */
template <typename T, int K, int VS>
__global__ void __launch_bounds__(CHAIN_THREADS, 1) bwd_chain_kernel(const BwdParams p)
{
    using SM = ChainSmem<T, K, VS>;
    constexpr int LDK = SM::LDK, LD64 = SM::LD64, LDS = SM::LDS, NTH = CHAIN_THREADS;
    static_assert(VS == 16 || VS == 32, "bwd_chain: one or two 16-column halves");
    constexpr int SNT = K == 128 ? VS / 8 : 2; /* n8 tiles of the warp's state slice */
    constexpr int XTH = C * VS / 8 < NTH ? C * VS / 8 : NTH; /* threads copying the VS-column tile */
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int mr = 16 * (warp & 3), nc0 = 16 * (warp >> 2); /* the warp's block of the 64-row products */
    const int sr = K == 128 ? 16 * warp : 16 * (warp & 3), sc = K == 128 ? 0 : 16 * (warp >> 2); /* its state block */
    /* The warp's share of the 64-row products (nc0 < VS), of the state (sc < VS). */
    const bool prod = VS == 32 || warp < 4, sw = K == 128 || VS == 32 || warp < 4;
    const int64_t vblocks = p.V / VS;
    const int64_t vb = blockIdx.x % vblocks, hv = (blockIdx.x / vblocks) % p.HV, n = blockIdx.x / vblocks / p.HV;
    const int v0 = (int)vb * VS;
    const int64_t h = hv / p.G;
    const gdn_chunk::SeqInfo sq = gdn_chunk::sequence(p, n);
    const int64_t row = sq.row, bos = sq.bos, len = sq.len, slot0 = sq.slot0;
    const int64_t nc = (len + C - 1) / C;

    T *W = reinterpret_cast<T *>(smem + 2 * SM::STAGE);
    T *U = W + C * LDS;
    T *Sb = U + C * LDS;
    /* Stage b's copies of chunk c (none past the last). */
    auto issue = [&](int64_t c, int b) {
        if (c >= nc)
            return;
        const int cl = (int)gdn_chunk::min64(C, len - c * C);
        T *Ks = reinterpret_cast<T *>(smem + b * SM::STAGE);
        T *Xs = Ks + C * LDK, *Tm = Xs + C * LDS;
        const unsigned char *rec = rec_of(p, hv, slot0 + c);
        load_tile<T, K, LDK, NTH>(Ks, p.k, row, bos + c * C, h, cl, 0, tid);
        if (tid < XTH)
            load_tile<T, VS, LDS, XTH>(Xs, p.v, row, bos + c * C, hv, cl, v0, tid);
        load_mat<C, C, C, LD64>(Tm, reinterpret_cast<const T *>(rec), 0, tid, NTH);
        load_f32(reinterpret_cast<float *>(Tm + C * LD64), rec + REC_ROWS, R_COUNT * C, tid, NTH);
        gdn_sm90::cp_async_commit();
    };
    issue(0, 0);

    /* The running state block, f32 in registers. */
    float st[SNT][4];
#pragma unroll
    for (int nt = 0; nt < SNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = sr + g + 8 * (e >> 1), col = v0 + sc + 8 * nt + 2 * t + (e & 1);
            st[nt][e] = sw && p.h0.data ? load_elem(p.h0.data, p.state_dtype, state_off(p.h0, n, hv, r, col)) : 0.f;
        }

    for (int64_t c = 0; c < nc; ++c) {
        const int64_t slot = slot0 + c;
        T *Ks = reinterpret_cast<T *>(smem + (c & 1) * SM::STAGE);
        T *Xs = Ks + C * LDK, *Tm = Xs + C * LDS;
        const float *rows = reinterpret_cast<const float *>(Tm + C * LD64);
        /* S (rounded to the operands' type) to Sb, and as S^T to the workspace. */
        if (sw)
            store_acc<T, SNT, LDS>(Sb + sc, st, sr, lane, 1.f, 1.f);
        gdn_sm90::cp_async_wait<0>(); /* this chunk's stage (the only copies in flight) */
        __syncthreads();
        store_mat_t<K, VS, LDS>(static_cast<T *>(p.S) + (((size_t)hv * p.slots + slot) * p.V + v0) * K, Sb, tid, NTH);
        if (c == nc - 1)
            break; /* the final state is not needed */
        /* The other stage was last read in the previous step, which ended with a barrier. */
        issue(c + 1, (int)((c + 1) & 1));
        const int i0 = mr + g, i1 = i0 + 8;
        const float gC = rows[R_GC * C];
        float acc[2][4];
        zero_acc(acc);
        if (prod) {
            warp_mm<T, 2, K, false, false, LDK, LDS>(acc, Ks, mr, Sb, nc0, lane); /* Y = K S */
            /* W = beta (V - ck Y) */
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e < 2 ? i0 : i1, col = nc0 + 8 * nt + 2 * t + (e & 1);
                    acc[nt][e] = rows[R_BETA * C + i] * (gdn_to_f32(Xs[i * LDS + col]) - rows[R_CK * C + i] * acc[nt][e]);
                }
            store_acc<T, 2, LDS>(W + nc0, acc, mr, lane, 1.f, 1.f);
        }
        __syncthreads();
        if (prod) {
            zero_acc(acc);
            warp_mm<T, 2, C, false, false, LD64, LDS>(acc, Tm, mr, W, nc0, lane); /* Vn = T W */
            store_acc<T, 2, LDS>(U + nc0, acc, mr, lane, rows[R_CU * C + i0], rows[R_CU * C + i1]);
        }
        /* S' = gC S + K^T U (U = cu Vn). */
        __syncthreads();
#pragma unroll
        for (int nt = 0; nt < SNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                st[nt][e] *= gC;
        if (sw)
            warp_mm<T, SNT, C, true, false, LDK, LDS>(st, Ks, sr, U, sc, lane);
        __syncthreads(); /* the tiles and Sb are rewritten next step */
    }
}

} /* namespace gdn_bwd */

#endif /* GDN_SM90_CHUNK_BWD_CHAIN_CUH */
