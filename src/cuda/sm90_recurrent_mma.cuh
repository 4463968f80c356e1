/*
 * sm90_recurrent_mma.cuh - the multi-token recurrent forward on tensor cores (speculative verify,
 * multi-token prediction), GDN and KDA gates, VK state rows with K contiguous, K = 64 or 128.
 * Launched by sm90_recurrent_fwd.cu for calls of at least 8 tokens per sequence, or 4 on at least 128
 * (sequence, value head) pairs (3 on 256 with a bf16 state), that write no per-step states
 * (use_mma_path).
 *
 * The chunk form of the delta rule over up to 8 tokens t of one (sequence, value head), state S
 * with rows r (values) and columns keys, S0 the state before the chunk:
 *   e_t = exp(g_t), Gam_t = e_0 ... e_t, D[t][j] = e_{j+1} ... e_t (j <= t, D[t][t] = 1)
 *   S_t = Gam_t S0 + sum_{j <= t} D[t][j] u_j k_j^T                       (WY form)
 *   u_t = beta_t (v_t - e_t S_{t-1} k_t)
 *       = x_t - sum_{j < t} A[t][j] u_j,  x_t = beta_t (v_t - Gam_t S0 k_t),
 *         A[t][j] = beta_t D[t][j] (k_t . k_j)
 *   so that, for all rows at once, U = X M^T with M = (I + A)^-1 (unit lower triangular);
 *   o_t = S_t q_t = Gam_t S0 q_t + sum_{j <= t} D[t][j] (q_t . k_j) u_j
 *   S_8 = Gam_7 S0 + sum_j D[7][j] u_j k_j^T
 * The decay products are taken directly (no division by Gam), so decays of 0 are exact. Tokens
 * past the end of a chunk are staged as e = 1, beta = 0, q = k = v = 0: they change nothing, so
 * every chunk is computed as 8 tokens; longer calls run chunk after chunk, the state staying in
 * the tile between them (a bf16 state rounded there, as in the CUDA-core paths). KDA calls of at
 * most 4 tokens per sequence take chunks of 4 (TC = 4, use_mma_short): the stage then holds q, k,
 * v, the decays and khat of 4 tokens, and the products read tokens 4..7 as 0 (stage_tok).
 *
 * Work per CTA (64 or 128 rows of one (sequence, value head), 4 warps, or 8 in KDA's wide tile):
 * the state tile arrives by bulk copies as in the CUDA-core fast path (recurrent_fwd_tma_kernel)
 * while warps 1.. stage the tokens (see MmaStage); then each warp takes strips of 16 rows and runs,
 * on mma.sync m16n8k8
 * TF32:
 *   1. [S0 k | S0 q] for its 16 rows (16 x 16, K deep), its A fragments read straight from the
 *      tile, and on its first strip of a chunk, on the same operands, the chunk's q_t . k_j and
 *      k_t . k_j (16 x 8): every warp has its own copy, no reduction and no barrier;
 *   2. on its first strip, M by forward substitution across the quad lanes (7 steps of shuffles)
 *      and Bm[t][j] = D[t][j] (q_t . k_j), kept for its other strips (chunk_solve); X,
 *      U = X M^T, O = Gam Pq + U Bm^T: three 16 x 8 x 8 products;
 *   3. the update S = Gam_7 S + (U D[7]) K^T, 16 x K x 8, streamed 16 keys at a time from the
 *      tile through registers to global memory (or back to the tile when more chunks follow).
 * The strip is never held in registers as a whole: at 64 more registers per thread the path
 * spilled. Every product is split into TF32 parts (x = hi + lo, three products
 * hi*hi + hi*lo + lo*hi), which keeps f32 accuracy; a bf16 state is exact in TF32, so its
 * products with the state skip lo.
 *
 * KDA (a decay e_t[key] per key; recurrent_fwd_mma_kernel<.., KDA = true>): the same products with
 * the decays moved into the staged vectors, all formed as direct products (no division by Gam):
 *   product 1 reads Gam_t o k_t and Gam_t o q_t (o: per key), the update reads D[7][j] o k_j and
 *   decays S0 by Gam_7 per key, and A and Bm take the dots k_t . (D[t][j] o k_j) and
 *   q_t . (D[t][j] o k_j), summed over the keys on CUDA cores (mma_kda_prep_chunk: a warp per
 *   pair of token rows); the scalar e is staged as 1, so D and Gam of the GDN form are 0 / 1 and
 *   chunk_solve and the solve are shared unchanged.
 *
 * Fragment layout (g = lane / 4, c = lane % 4): the accumulator of a 16 x 8 tile holds rows g
 * (0, 1) and g + 8 (2, 3), columns 2c, 2c + 1. Over the state's keys, n-tile j column 2c + e is
 * key kmap(j, c, e) = 16 (j / 2) + 4 c + 2 (j % 2) + e, chosen so that (a) a lane's four keys of
 * n-tiles 2m and 2m + 1 are contiguous (16-byte loads and stores of the state), (b) the same
 * values, reordered, are the A fragment of k-step j of product 1 (its B operand loads q and k
 * at the same keys). Likewise the token columns of products 2 and 3 come out as 2c, 2c + 1 and
 * are used as the A fragment with logical columns (c, c + 4) standing for tokens (2c, 2c + 1);
 * the B operands are loaded in that order.
 */
#ifndef GDN_SM90_RECURRENT_MMA_CUH
#define GDN_SM90_RECURRENT_MMA_CUH

#include "sm90_recurrent_kernel.cuh"

/* Internal linkage: the library and the benchmark each compile their own copy. */
namespace {

constexpr int MMA_ROWS = 16; /* state rows per warp strip: the mma's M */

/* Shared staging of one chunk for the tensor-core path: the CUDA-core paths' TokenStage (q, k, v,
 * e, beta, kq; stage_token writes q and k through this path's stage_put_qk), plus the decay
 * products that mma_prep_chunk derives; mma_stage_chunk pads the chunk to 8 tokens. q and k are
 * kept as f32 (split into TF32 parts where they are read: kept split, they took 8 KB more, and
 * the tile then fitted four CTAs per SM, not five), key pairs swizzled per token (qk_off) so that
 * product 1's 8-byte reads and the update's 4-byte reads are free of bank conflicts. */
template <int K, int ROWS, int TC = TOKEN_CHUNK> struct MmaStage : TokenStage<K, ROWS, TC> {
    alignas(16) float d[TOKEN_CHUNK][TOKEN_CHUNK]; /* D[t][j], 0 above the diagonal */
    alignas(16) float gam[TOKEN_CHUNK];            /* Gam_t */
};

/* Float offset of `key` of token t in MmaStage::q / k: key pair P = key / 2 goes to pair
 * P ^ s(t), s(t) flipping bit 0 by t0 ^ t2 and bit 3 by t1. Product 1's 8-byte reads (a half
 * warp: 4 tokens g times 4 lanes c, pairs 8m + 2c + hh) then hit 16 distinct bank pairs, and the
 * update's 4-byte reads (token 2c or 2c + 1 times pairs of g / 2, element g % 2) 32 distinct
 * banks. */
__device__ __forceinline__ int qk_off(int t, int key)
{
    const int s = ((t ^ (t >> 2)) & 1) | ((t & 2) << 2);
    return (((key >> 1) ^ s) << 1) | (key & 1);
}

/* KDA's stage: MmaStage (q and k there become Gam_t o q_t and Gam_t o k_t, e is 1) plus the
 * decays, D[7][j] o k_j (khat, swizzled as k), Gam_7 per key and the chunk's dots (lower triangle
 * t >= j, index t (t + 1) / 2 + j; [0]: q_t . D k_j, [1]: k_t . D k_j). */
constexpr int CHUNK_PAIRS = TOKEN_CHUNK * (TOKEN_CHUNK + 1) / 2;
template <int K, int ROWS, int TC = TOKEN_CHUNK> struct MmaKdaStage : MmaStage<K, ROWS, TC> {
    alignas(16) float ek[TC][K];
    alignas(16) float khat[TC][K];
    alignas(16) float gam_last[K];
    float dots[2][CHUNK_PAIRS];
};

template <int K, int ROWS, int TC> struct is_kda_stage<MmaKdaStage<K, ROWS, TC>> : std::true_type {};

template <int K, int ROWS, bool KDA, int TC = TOKEN_CHUNK>
using MmaStageOf = typename std::conditional<KDA, MmaKdaStage<K, ROWS, TC>, MmaStage<K, ROWS, TC>>::type;

/* Stage array M's token j at off .. off + W as the products read it, j one of the mma's 8 token
 * columns: 0 past the stage's TC tokens (a short-chunk stage has no room for the padding tokens
 * there; those within TC are staged as zeros). In chunks of 8 it is the plain shared-memory read. */
template <int W, auto M, typename Stage> __device__ __forceinline__ float2 stage_tok(const Stage &st, int j, int off)
{
    static_assert(W == 1 || W == 2, "one or two floats");
    if (Stage::TOKENS < TOKEN_CHUNK && j >= Stage::TOKENS)
        return make_float2(0.0f, 0.0f);
    const float *const x = &(st.*M)[j][off];
    return W == 2 ? *reinterpret_cast<const float2 *>(x) : make_float2(x[0], 0.0f);
}

/* The keys the state update reads (stage_tok's member): KDA's khat (k decayed to the chunk's end),
 * GDN's k. */
template <typename Stage> struct update_keys {
    static constexpr auto member = &Stage::k;
};
template <int K, int ROWS, int TC> struct update_keys<MmaKdaStage<K, ROWS, TC>> {
    static constexpr auto member = &MmaKdaStage<K, ROWS, TC>::khat;
};

/* The path's tile: tile_rows() (32 KB of state, 4 warps). KDA with an f32 state at K = 128 has a
 * wide instance as well (WIDE): 128 rows (64 KB), a whole value head at V = 128, and 8 warps.
 * KDA's stage (the tokens, their decays per key and the chunk's dots) is the same for every row
 * of a (sequence, value head), and 64-row tiles prepare it once per half; two wide CTAs per SM keep
 * the 16 warps of four 64-row ones but overlap loads and compute in coarser steps, which pays
 * where the stage is largest (the launcher's use_mma_wide). */
template <int K, typename StateT, bool KDA> __host__ __device__ constexpr bool mma_has_wide()
{
    return KDA && K == 128 && sizeof(StateT) == 4;
}

/* The tile's rows (the third parameter is WIDE, not KDA as in tile_rows: KDA's narrow tile is
 * GDN's). */
template <int K, typename StateT, bool WIDE = false> __host__ __device__ constexpr int mma_tile_rows()
{
    return WIDE ? 128 : tile_rows<K, StateT>();
}

/* Warps per CTA at most (one per 16-row strip of a pass), and for a CTA of `rows` rows. */
template <bool WIDE = false> __host__ __device__ constexpr int mma_max_warps() { return WIDE ? 8 : 4; }

template <bool WIDE = false> __host__ __device__ constexpr int mma_warps(int rows)
{
    return rows / MMA_ROWS < mma_max_warps<WIDE>() ? rows / MMA_ROWS : mma_max_warps<WIDE>();
}

template <int K, typename StateT, bool KDA = false, bool WIDE = false, int TC = TOKEN_CHUNK>
__host__ __device__ constexpr size_t mma_smem_bytes()
{
    constexpr int ROWS = mma_tile_rows<K, StateT, WIDE>();
    return (size_t)ROWS * K * sizeof(StateT) + sizeof(MmaStageOf<K, ROWS, KDA, TC>);
}

template <int K, int ROWS, int TC>
__device__ __forceinline__ void stage_put_qk(MmaStage<K, ROWS, TC> &st, int j, int key, float q, float k)
{
    const int off = qk_off(j, key);
    st.q[j][off] = q;
    st.k[j][off] = k;
}

/* An A fragment (a0..a3) split into TF32 parts; EXACT: the values are TF32 already (bf16 state). */
struct FragA {
    uint32_t hi[4], lo[4];
};

template <bool EXACT> __device__ __forceinline__ FragA frag_a(float a0, float a1, float a2, float a3)
{
    const float a[4] = {a0, a1, a2, a3};
    FragA f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (EXACT) {
            f.hi[i] = __float_as_uint(a[i]);
            f.lo[i] = 0u;
        } else {
            const Tf32Pair s = tf32_split(a[i]);
            f.hi[i] = s.hi;
            f.lo[i] = s.lo;
        }
    }
    return f;
}

/* big + small += A B to f32 accuracy: the small products (into small) first; lo * lo is below
 * f32 rounding. Two accumulators make a long sum over k-steps two dependency chains, not one three
 * times as long (product 1: K / 8 k-steps); mma_3xtf32 is the one-accumulator form. */
template <bool A_EXACT>
__device__ __forceinline__ void mma_3xtf32_2acc(float (&big)[4], float (&small)[4], const FragA &a, Tf32Pair b0,
                                                Tf32Pair b1)
{
    if constexpr (!A_EXACT)
        mma_tf32(small, a.lo, b0.hi, b1.hi);
    mma_tf32(small, a.hi, b0.lo, b1.lo);
    mma_tf32(big, a.hi, b0.hi, b1.hi);
}

template <bool A_EXACT>
__device__ __forceinline__ void mma_3xtf32(float (&d)[4], const FragA &a, Tf32Pair b0, Tf32Pair b1)
{
    mma_3xtf32_2acc<A_EXACT>(d, d, a, b0, b1);
}

/* Four consecutive state elements as f32, and back (global stores spelled in PTX: see
 * st_global_16). */
template <typename StateT> __device__ __forceinline__ float4 ld_state4(const StateT *ptr)
{
    if constexpr (sizeof(StateT) == 4) {
        return *reinterpret_cast<const float4 *>(ptr);
    } else {
        const uint2 w = *reinterpret_cast<const uint2 *>(ptr);
        return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u), __uint_as_float(w.y << 16),
                           __uint_as_float(w.y & 0xffff0000u));
    }
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t w;
    memcpy(&w, &v, 4);
    return w;
}

template <typename StateT, bool GLOBAL> __device__ __forceinline__ void st_state4(StateT *ptr, float4 x)
{
    if constexpr (sizeof(StateT) == 4) {
        if constexpr (GLOBAL)
            st_global_16(ptr, make_uint4(__float_as_uint(x.x), __float_as_uint(x.y), __float_as_uint(x.z),
                                         __float_as_uint(x.w)));
        else
            *reinterpret_cast<float4 *>(ptr) = x;
    } else {
        const uint2 w = make_uint2(pack_bf16x2(x.x, x.y), pack_bf16x2(x.z, x.w));
        if constexpr (GLOBAL)
            asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(ptr), "r"(w.x), "r"(w.y) : "memory");
        else
            *reinterpret_cast<uint2 *>(ptr) = w;
    }
}

/* Keys key .. key + 3 of rows `row` and `row` + 8 (y0, y1) to rows0 (row stride sv), rows past
 * cta_rows skipped: global memory (GLOBAL) or the tile. */
template <typename StateT, bool GLOBAL>
__device__ __forceinline__ void st_rows_pair(StateT *rows0, int64_t sv, int row, int cta_rows, int key, float4 y0,
                                             float4 y1)
{
    if (row < cta_rows)
        st_state4<StateT, GLOBAL>(rows0 + row * sv + key, y0);
    if (row + 8 < cta_rows)
        st_state4<StateT, GLOBAL>(rows0 + (row + 8) * sv + key, y1);
}

/* Keys key .. key + 3 of tile row `row` as f32 (0 for rows >= cta_rows: past V, unfilled). */
template <typename StateT>
__device__ __forceinline__ float4 tile_piece(const StateT *tile, int K, int row, int cta_rows, int key)
{
    return row < cta_rows ? ld_state4(tile + row * K + key) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

/* Stages tokens [tok0, tok0 + tc) (stage_tokens) and pads the chunk with tokens that change
 * nothing: q, k and v to the stage's TC tokens, e and beta to 8. Run by the whole CTA. Stage is the
 * kernel's own stage type (MmaStage or MmaKdaStage): stage_tokens reads the gate kind from it, so
 * it must not be passed as the base. A staging warp has two tokens in flight in chunks of 8, one
 * in chunks of 4 (two made the KDA instances spill at the 96 registers of five CTAs per SM). */
template <int K, typename InT, int ROWS, typename Stage>
__device__ __forceinline__ void mma_stage_chunk(const RecurrentParams &p, Stage &st, int64_t b,
                                                int64_t tok0, int tc, int h, int hv, int row_base, int cta_rows)
{
    constexpr int TC = Stage::TOKENS;
    static_assert(std::is_base_of<MmaStage<K, ROWS, TC>, Stage>::value, "a tensor-core stage");
    constexpr int TPW = TC < TOKEN_CHUNK ? 1 : 2;
    stage_tokens<K, InT, TPW, (ROWS + 127) / 128, true>(p, st, b, tok0, tc, h, hv, row_base, cta_rows);
    for (int i = threadIdx.x; i < (TC - tc) * K; i += blockDim.x) {
        const int j = tc + i / K, d = i % K;
        st.q[j][d] = 0.0f;
        st.k[j][d] = 0.0f;
    }
    for (int j = tc; j < TC; j++)
        for (int rr = threadIdx.x; rr < ROWS; rr += blockDim.x)
            st.v[j][rr] = 0.0f;
    if ((int)threadIdx.x < TOKEN_CHUNK - tc) {
        st.e[tc + threadIdx.x] = 1.0f;
        st.beta[tc + threadIdx.x] = 0.0f;
    }
}

/* KDA: the padding tokens' decays are 1 as well. */
template <int K, int ROWS, int TC>
__device__ __forceinline__ void mma_pad_decays(MmaKdaStage<K, ROWS, TC> &st, int tc)
{
    for (int i = threadIdx.x; i < (TC - tc) * K; i += blockDim.x)
        st.ek[tc + i / K][i % K] = 1.0f;
}

/* KDA, after the stage (and mma_pad_decays), tokens tc.. being padding: the dots
 * q_t . (D[t][j] o k_j) and k_t . (D[t][j] o k_j) (j <= t < tc; 0 for padding rows t < TC), per key
 * D[t][j] = e_{j+1} .. e_t as direct products; then khat = D[7][j] o k_j, gam_last = Gam_7 and, in
 * place, q and k become Gam_t o q_t and Gam_t o k_t (tokens past TC have decays of 1: D[7][j] and
 * Gam_7 are the products over the staged tokens). Run by the whole CTA; read after the next
 * barrier. The dots: with TC = 8, warp w sums rows t = r and 7 - r for r = w, w + nwarps, .. < 4
 * (9 (t, j) pairs a row pair), with TC = 4 row t = w; each lane over keys lane, lane + 32, .., then
 * over the warp; each row's sums are final where they are written (no per-warp partials to add).
 * In the wide tile's 8 warps, warps 4..7 skip the dots and half the threads the per-key loop. */
template <int K, int ROWS, int TC>
__device__ __forceinline__ void mma_kda_prep_chunk(MmaKdaStage<K, ROWS, TC> &st, int tc)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int t = 0; t < TC; t++) {
        const int r = TC < TOKEN_CHUNK ? t : t < TC / 2 ? t : TC - 1 - t;
        if (r % nwarps != warp) /* uniform over the warp */
            continue;
        float dq[TC], dk[TC]; /* [0, t] used */
#pragma unroll
        for (int j = 0; j <= t; j++)
            dq[j] = dk[j] = 0.0f;
        if (t < tc) {
#pragma unroll 1
            for (int key = lane; key < K; key += 32) {
                const float qt = st.q[t][qk_off(t, key)], kt = st.k[t][qk_off(t, key)];
                float d = 1.0f; /* D[t][j], j from t down */
#pragma unroll
                for (int j = t; j >= 0; j--) {
                    const float dkj = d * st.k[j][qk_off(j, key)];
                    dq[j] = fmaf(qt, dkj, dq[j]);
                    dk[j] = fmaf(kt, dkj, dk[j]);
                    if (j > 0)
                        d *= st.ek[j][key];
                }
            }
#pragma unroll
            for (int j = 0; j <= t; j++) {
#pragma unroll
                for (int m = 16; m >= 1; m /= 2) {
                    dq[j] += __shfl_xor_sync(0xffffffffu, dq[j], m);
                    dk[j] += __shfl_xor_sync(0xffffffffu, dk[j], m);
                }
            }
        }
#pragma unroll
        for (int j = 0; j <= t; j++) {
            if (lane == j) {
                st.dots[0][t * (t + 1) / 2 + j] = dq[j];
                st.dots[1][t * (t + 1) / 2 + j] = dk[j];
            }
        }
    }
    __syncthreads(); /* the dots read q and k of every key as staged */
    for (int key = threadIdx.x; key < K; key += blockDim.x) {
        float e[TC];
#pragma unroll
        for (int t = 0; t < TC; t++)
            e[t] = st.ek[t][key];
        float d7 = 1.0f;
#pragma unroll
        for (int j = TC - 1; j >= 0; j--) {
            const int off = qk_off(j, key);
            st.khat[j][off] = d7 * st.k[j][off];
            d7 *= e[j];
        }
        st.gam_last[key] = d7;
        float gam = 1.0f;
#pragma unroll
        for (int t = 0; t < TC; t++) {
            const int off = qk_off(t, key);
            gam *= e[t];
            st.q[t][off] *= gam;
            st.k[t][off] *= gam;
        }
    }
}

/* KDA: the dots fragment of strip_products (q_g . k_j, k_g . k_j for j = 2c, 2c + 1); 0 above the
 * diagonal (chunk_solve masks those of A, D masks Bm's) and in rows past TC (never written). */
template <int K, int ROWS, int TC>
__device__ __forceinline__ void mma_kda_dots(const MmaKdaStage<K, ROWS, TC> &st, int g, int c, float (&dots)[4])
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int j = 2 * c + h;
        const bool in = j <= g && (TC == TOKEN_CHUNK || g < TC);
        dots[h] = in ? st.dots[0][g * (g + 1) / 2 + j] : 0.0f;
        dots[2 + h] = in ? st.dots[1][g * (g + 1) / 2 + j] : 0.0f;
    }
}

/* After the stage: the decay products D and Gam. Run by the whole CTA; read after the next
 * barrier. */
template <int K, int ROWS, int TC> __device__ __forceinline__ void mma_prep_chunk(MmaStage<K, ROWS, TC> &st)
{
    for (int i = threadIdx.x; i < TOKEN_CHUNK * (TOKEN_CHUNK + 1); i += blockDim.x) {
        const int t = i / (TOKEN_CHUNK + 1), j = i % (TOKEN_CHUNK + 1) - 1; /* j = -1: Gam_t */
        float d = j <= t ? 1.0f : 0.0f;
        for (int m = j + 1; m <= t; m++)
            d *= st.e[m];
        if (j < 0)
            st.gam[t] = d;
        else
            st.d[t][j] = d;
    }
}

/* Product 1 for the strip of tile rows srow .. + 15: pk = S0 k_t and pq = S0 q_t (columns
 * t = 2c, 2c + 1 of rows g, g + 8), and with DOTS (a warp's first strip of the chunk: they do not
 * depend on the state) dots: q_g . k_j (0, 1) and k_g . k_j (2, 3) for j = 2c, 2c + 1. The A
 * fragments come straight from the tile (the strip is never held in registers as a whole: at
 * 64 more registers per thread the path spilled). */
template <bool DOTS, int K, typename StateT, int ROWS, int TC>
__device__ __forceinline__ void strip_products(const MmaStage<K, ROWS, TC> &st, const StateT *tile, int srow,
                                               int cta_rows, int g, int c, float (&pk)[4], float (&pq)[4],
                                               float (&dots)[4])
{
    constexpr bool A_EXACT = sizeof(StateT) == 2; /* a bf16 state is exact in TF32 */
    float pk2[4], pq2[4], dots2[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        pk[i] = pq[i] = dots[i] = pk2[i] = pq2[i] = dots2[i] = 0.0f;
    /* k-step j = 2m + hh: keys kmap(j, c, 0..1) = 16m + 4c + 2hh + 0..1 */
#pragma unroll 2
    for (int m = 0; m < K / 16; m++) {
        const float4 r0 = tile_piece(tile, K, srow + g, cta_rows, 16 * m + 4 * c);
        const float4 r1 = tile_piece(tile, K, srow + g + 8, cta_rows, 16 * m + 4 * c);
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int off = qk_off(g, 16 * m + 4 * c + 2 * hh);
            const float2 kp = stage_tok<2, &MmaStage<K, ROWS, TC>::k>(st, g, off);
            const float2 qp = stage_tok<2, &MmaStage<K, ROWS, TC>::q>(st, g, off);
            const Tf32Pair kb0 = tf32_split(kp.x), kb1 = tf32_split(kp.y);
            const Tf32Pair qb0 = tf32_split(qp.x), qb1 = tf32_split(qp.y);
            const FragA a = hh ? frag_a<A_EXACT>(r0.z, r1.z, r0.w, r1.w) : frag_a<A_EXACT>(r0.x, r1.x, r0.y, r1.y);
            mma_3xtf32_2acc<A_EXACT>(pk, pk2, a, kb0, kb1);
            mma_3xtf32_2acc<A_EXACT>(pq, pq2, a, qb0, qb1);
            if constexpr (DOTS) {
                FragA qk;
                qk.hi[0] = qb0.hi, qk.hi[1] = kb0.hi, qk.hi[2] = qb1.hi, qk.hi[3] = kb1.hi;
                qk.lo[0] = qb0.lo, qk.lo[1] = kb0.lo, qk.lo[2] = qb1.lo, qk.lo[3] = kb1.lo;
                mma_3xtf32_2acc<false>(dots, dots2, qk, kb0, kb1);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        pk[i] += pk2[i];
        pq[i] += pq2[i];
        dots[i] += dots2[i];
    }
}

/* Where the strip's new state goes: the tile (more chunks follow), else final_state and / or the
 * in-place slot (pointers at the CTA's first row, row strides; NULL: not written). */
template <typename StateT> struct StripDest {
    StateT *fin, *inp;
    int64_t fin_sv, inp_sv;
    bool tile;
};

/* The chunk's token-by-token matrices as lane (g, c) holds them, columns j = 2c, 2c + 1 of
 * row g: M = (I + A)^-1 (m0, m1) and Bm (bm0, bm1). The same for every strip: chunk_solve runs
 * once per chunk and warp, from the dots of its first strip. */
struct ChunkSolve {
    float m0, m1, bm0, bm1;
};

template <int K, int ROWS, int TC>
__device__ __forceinline__ ChunkSolve chunk_solve(const MmaStage<K, ROWS, TC> &st, const float (&dots)[4], int g, int c)
{
    const float2 dg = *reinterpret_cast<const float2 *>(&st.d[g][2 * c]);
    const float bg = st.beta[g];
    /* A[g][j] (strictly lower) and Bm[g][j] (lower; d is 0 above the diagonal), j = 2c, 2c + 1 */
    const float a0 = 2 * c < g ? bg * dg.x * dots[2] : 0.0f;
    const float a1 = 2 * c + 1 < g ? bg * dg.y * dots[3] : 0.0f;
    ChunkSolve cs;
    cs.bm0 = dg.x * dots[0];
    cs.bm1 = dg.y * dots[1];

    /* M = (I + A)^-1, row g, columns 2c, 2c + 1: row i is final before step i uses it */
    float m0 = g == 2 * c ? 1.0f : 0.0f, m1 = g == 2 * c + 1 ? 1.0f : 0.0f;
#pragma unroll
    for (int i = 0; i < TOKEN_CHUNK - 1; i++) {
        const float mi0 = __shfl_sync(0xffffffffu, m0, 4 * i + c);
        const float mi1 = __shfl_sync(0xffffffffu, m1, 4 * i + c);
        const float agi = __shfl_sync(0xffffffffu, (i & 1) ? a1 : a0, 4 * g + i / 2); /* A[g][i] */
        m0 = fmaf(-agi, mi0, m0);
        m1 = fmaf(-agi, mi1, m1);
    }
    cs.m0 = m0;
    cs.m1 = m1;
    return cs;
}

/* Products 2 and 3 for one strip after strip_products: o of the chunk's tokens (written for
 * t < tc and rows < cta_rows), then the state after the chunk, streamed piece by piece from the
 * tile to its destinations. KDA (an MmaKdaStage): the update reads khat and decays S0 by
 * gam_last per key. */
template <int K, typename StateT, typename InT, typename Stage>
__device__ __forceinline__ void strip_solve_update(const RecurrentParams &p, const Stage &st,
                                                   StateT *tile, const float (&pk)[4], const float (&pq)[4],
                                                   const ChunkSolve &cs, int g, int c, int srow, int cta_rows,
                                                   int tc, InT *o, int row_base, const StripDest<StateT> &dst)
{
    const float2 dl = *reinterpret_cast<const float2 *>(&st.d[TOKEN_CHUNK - 1][2 * c]);
    const float2 bc = *reinterpret_cast<const float2 *>(&st.beta[2 * c]);
    const float2 gc = *reinterpret_cast<const float2 *>(&st.gam[2 * c]);
    const float glast = st.gam[TOKEN_CHUNK - 1];

    /* X, then U = X M^T (tokens past the stage's TC: v, khat and k read as 0, beta is 0) */
    const int vr = srow + g; /* and vr + 8 */
    const float x0 = bc.x * (stage_tok<1, &Stage::v>(st, 2 * c, vr).x - gc.x * pk[0]);
    const float x1 = bc.y * (stage_tok<1, &Stage::v>(st, 2 * c + 1, vr).x - gc.y * pk[1]);
    const float x2 = bc.x * (stage_tok<1, &Stage::v>(st, 2 * c, vr + 8).x - gc.x * pk[2]);
    const float x3 = bc.y * (stage_tok<1, &Stage::v>(st, 2 * c + 1, vr + 8).x - gc.y * pk[3]);
    float u[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_3xtf32<false>(u, frag_a<false>(x0, x2, x1, x3), tf32_split(cs.m0), tf32_split(cs.m1));

    /* O = Gam Pq + U Bm^T */
    float ov[4] = {gc.x * pq[0], gc.y * pq[1], gc.x * pq[2], gc.y * pq[3]};
    mma_3xtf32<false>(ov, frag_a<false>(u[0], u[2], u[1], u[3]), tf32_split(cs.bm0), tf32_split(cs.bm1));
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int t = 2 * c + (i & 1), row = vr + (i < 2 ? 0 : 8);
        if (t < tc && row < cta_rows)
            o[t * p.o_s[1] + (int64_t)(row_base + row) * p.o_s[3]] = gdn_from_f32<InT>(ov[i]);
    }

    /* S = Gam_7 S + (U D[7]) K^T: n-tile j's column g is key kmap(j, g / 2, g % 2) */
    constexpr bool KDA = is_kda_stage<Stage>::value;
    const FragA ud = frag_a<false>(u[0] * dl.x, u[2] * dl.x, u[1] * dl.y, u[3] * dl.y);
    constexpr auto KU = update_keys<Stage>::member;
#pragma unroll 2
    for (int m = 0; m < K / 16; m++) {
        /* n-tiles 2m (keys 16m + 4c + 0..1) and 2m + 1 (+ 2..3) of rows g, g + 8; as B operands,
         * their column g is key 16m + 4 (g / 2) + g % 2 (+ 2) */
        const int key = 16 * m + 4 * c, kb = 16 * m + 4 * (g >> 1) + (g & 1);
        const float4 x0 = tile_piece(tile, K, vr, cta_rows, key);
        const float4 x1 = tile_piece(tile, K, vr + 8, cta_rows, key);
        float4 gl = make_float4(glast, glast, glast, glast);
        if constexpr (KDA)
            gl = *reinterpret_cast<const float4 *>(&st.gam_last[key]);
        float s0[4] = {gl.x * x0.x, gl.y * x0.y, gl.x * x1.x, gl.y * x1.y};
        float s1[4] = {gl.z * x0.z, gl.w * x0.w, gl.z * x1.z, gl.w * x1.w};
        mma_3xtf32<false>(s0, ud, tf32_split(stage_tok<1, KU>(st, 2 * c, qk_off(2 * c, kb)).x),
                          tf32_split(stage_tok<1, KU>(st, 2 * c + 1, qk_off(2 * c + 1, kb)).x));
        mma_3xtf32<false>(s1, ud, tf32_split(stage_tok<1, KU>(st, 2 * c, qk_off(2 * c, kb + 2)).x),
                          tf32_split(stage_tok<1, KU>(st, 2 * c + 1, qk_off(2 * c + 1, kb + 2)).x));
        const float4 y0 = make_float4(s0[0], s0[1], s1[0], s1[1]), y1 = make_float4(s0[2], s0[3], s1[2], s1[3]);
        if (dst.tile) {
            st_rows_pair<StateT, false>(tile, K, vr, cta_rows, key, y0, y1);
        } else {
            if (dst.fin)
                st_rows_pair<StateT, true>(dst.fin, dst.fin_sv, vr, cta_rows, key, y0, y1);
            if (dst.inp)
                st_rows_pair<StateT, true>(dst.inp, dst.inp_sv, vr, cta_rows, key, y0, y1);
        }
    }
}

/* CTAs per SM the register budget is set for: at K = 128 five (at most 96 registers; shared
 * memory allows five as well, 43.5 KB f32 / 45.5 KB bf16), at K = 64 four (capped at 96 it
 * spilled up to 60 bytes). KDA at K = 128: four in chunks of 8 (its stage's decays and dots make
 * about 54 KB of shared memory, so four CTAs fit; capped at 96 registers an instance spills),
 * five in chunks of 4 (about 43 KB f32 / 44 KB bf16); wide, two of 8 warps (about 86 KB each),
 * at most 128 registers as well. */
template <int K, bool KDA, bool WIDE, int TC = TOKEN_CHUNK> __host__ __device__ constexpr int mma_min_ctas()
{
    return WIDE ? 2 : K == 128 && (!KDA || TC < TOKEN_CHUNK) ? 5 : 4;
}

/* The tensor-core path: one CTA owns rows_per_cta rows (a multiple of 16, at most mma_tile_rows()) of
 * one (sequence, value head); warps take strips of 16 rows in passes of blockDim / 2 rows. The
 * state tile, the slot lookup, the pass barriers and programmatic launch are those of
 * recurrent_fwd_tma_kernel. Per-step states are not written here (the launcher sends calls with
 * step_states or 2-D in-place pools to the CUDA-core paths). Dynamic shared memory:
 * mma_smem_bytes<K, StateT, KDA, WIDE, TC>(). TC: tokens per chunk (8, or 4 in the short-chunk
 * instances: a stage of half the size, so that KDA's tile fits five CTAs per SM). */
template <int K, typename StateT, typename InT, bool KDA = false, bool WIDE = false, int TC = TOKEN_CHUNK>
__global__ void __launch_bounds__(32 * mma_max_warps<WIDE>(), mma_min_ctas<K, KDA, WIDE, TC>())
    recurrent_fwd_mma_kernel(const RecurrentParams p, int rows_per_cta)
{
    static_assert(K == 64 || K == 128, "the tensor-core path is built for K = 64 and 128");
    static_assert(!WIDE || mma_has_wide<K, StateT, KDA>(), "the wide tile is KDA's, f32 state, K = 128");
    static_assert(TC == TOKEN_CHUNK || (TC == 4 && !WIDE), "chunks of 8 tokens, or 4 in a narrow tile");
    constexpr int TILE_ROWS = mma_tile_rows<K, StateT, WIDE>();
    constexpr int MAX_PASSES = TILE_ROWS / MMA_ROWS;
    using Stage = MmaStageOf<K, TILE_ROWS, KDA, TC>;
    static_assert(is_kda_stage<Stage>::value == KDA, "stage_token and the solve see the gate kind by the stage type");
    extern __shared__ __align__(128) unsigned char mma_smem[];
    StateT *const tile = reinterpret_cast<StateT *>(mma_smem);
    Stage &st = *reinterpret_cast<Stage *>(mma_smem + (size_t)TILE_ROWS * K * sizeof(StateT));
    __shared__ alignas(8) uint64_t bar[MAX_PASSES];
    __shared__ StateT *s_src;
    __shared__ int s_live;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int row_base = blockIdx.x * rows_per_cta;
    const int hv = blockIdx.y;
    const int h = hv / (int)p.G;
    const int cta_rows = (int)(p.V - row_base < rows_per_cta ? p.V - row_base : rows_per_cta);
    const int pass_rows = nwarps * MMA_ROWS;
    const int passes = (rows_per_cta + pass_rows - 1) / pass_rows;

    if (threadIdx.x < passes)
        mbar_init(&bar[threadIdx.x], 1), mbar_fence_init();
    __syncthreads();
    grid_dependency_sync();
    uint32_t phase = 0;

    for (int64_t n = blockIdx.z; n < p.N; n += gridDim.z) {
        const SeqRange sr = sequence_range(p, n);
        const int64_t b = sr.b, bos = sr.bos, len = sr.eos - sr.bos;

        fence_proxy_async();
        __syncthreads();
        if (warp == 0)
            issue_state_tile<K, StateT>(p, n, hv, tile, row_base, cta_rows, pass_rows, passes, bar, &s_src, &s_live);
        if (!p.state_indices && !p.state_in)
            for (int i = threadIdx.x; i < cta_rows * K; i += blockDim.x)
                tile[i] = gdn_from_f32<StateT>(0.0f);
        const int tc0 = (int)(len < TC ? len : TC);
        mma_stage_chunk<K, InT, TILE_ROWS>(p, st, b, bos, tc0, h, hv, row_base, cta_rows);
        if constexpr (KDA)
            mma_pad_decays(st, tc0);
        __syncthreads();
        StateT *const src = s_src;
        if (!s_live) { /* skipped: uniform over the CTA */
            zero_cta_outputs<K, StateT, InT>(p, sr, n, hv, row_base, cta_rows);
            continue;
        }

        const int64_t chunks = len > 0 ? (len + TC - 1) / TC : 1;
        for (int64_t ci = 0; ci < chunks; ci++) {
            const int64_t t0 = ci * TC;
            const int tc = (int)(len - t0 < TC ? len - t0 : TC);
            if (ci > 0) {
                __syncthreads(); /* the previous chunk's stage is no longer read */
                mma_stage_chunk<K, InT, TILE_ROWS>(p, st, b, bos + t0, tc, h, hv, row_base, cta_rows);
                if constexpr (KDA)
                    mma_pad_decays(st, tc);
                __syncthreads();
            }
            mma_prep_chunk(st);
            if constexpr (KDA) {
                mma_kda_prep_chunk(st, tc);
                __syncthreads(); /* product 1 reads the decayed q and k */
            }
            StripDest<StateT> dst;
            dst.tile = ci < chunks - 1;
            dst.fin = p.final_state ? state_at<StateT>(p.final_state, p.st_fin, n, hv) + row_base * p.st_fin.sv
                                    : nullptr;
            dst.fin_sv = p.st_fin.sv;
            dst.inp = p.inplace_state && !p.idx_2d && src ? src + row_base * p.st_in.sv : nullptr;
            dst.inp_sv = p.st_in.sv;
            InT *o = token_o<InT>(p, b, bos + t0, hv);

            ChunkSolve cs;
            for (int ps = 0; ps < passes; ps++) {
                const int srow = (ps * nwarps + warp) * MMA_ROWS;
                if (ci == 0 && src)
                    mbar_wait(&bar[ps], phase);
                float pk[4], pq[4], dots[4];
                if (ps == 0) {
                    strip_products<!KDA, K, StateT>(st, tile, srow, cta_rows, g, c, pk, pq, dots);
                    __syncthreads(); /* mma_prep_chunk's results */
                    if constexpr (KDA)
                        mma_kda_dots(st, g, c, dots);
                    cs = chunk_solve(st, dots, g, c);
                } else {
                    strip_products<false, K, StateT>(st, tile, srow, cta_rows, g, c, pk, pq, dots);
                }
                strip_solve_update<K, StateT, InT>(p, st, tile, pk, pq, cs, g, c, srow, cta_rows, tc, o, row_base,
                                                   dst);
            }
        }
        if (src)
            phase ^= 1;
    }
}

} /* namespace */

#endif /* GDN_SM90_RECURRENT_MMA_CUH */
