/*
 * decode_sweeps.cu - the decode tile and path sweeps behind the launch rules of
 * src/cuda/sm90_recurrent_launch.cuh: kernel templates launched directly with tiles and options
 * the launcher does not pick, on bench_decode's shape (bench/bench_decode_common.cuh), cold (and
 * hot) us per call under graph replay.
 *   --variants  fast-path tiles (rows x warps) and the register path at six (B, T)
 *   --pdl       the launcher's fast-path tile with and without programmatic dependent launch
 *               (the data behind tma_use_pdl)
 *   --regs      the register path: rows per lane and warps
 *   --tiles     fast-path tiles and the register path
 *   --t1        T = 1: the one-token instances' tiles against the chunk-of-8 instance
 *   --mma       the tensor-core path's tiles against the CUDA-core fast path's launcher tile (the
 *               data behind use_mma_path and mma_tile)
 *   --T LIST, --B LIST  token counts and batches of --pdl, --regs, --tiles, --mma
 *   --kda       KDA gates (bench_decode --kda's inputs): every sweep times the kernels' KDA
 *               instances, the data behind KDA's launch rules
 * Build (links the library, includes its private headers):
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DGDN_WITH_CUDA \
 *        -Iinclude -Isrc -Ibench dev/decode/decode_sweeps.cu build/libgdn_static.a -o decode_sweeps
 * or scripts/device_decode.sh with DECODE_VARIANTS=1.
 */
#include "bench_decode_common.cuh"
#include "cuda/sm90_recurrent_launch.cuh"

/* ------------------------------------------------------------------------------------------ */
/* Tile variants, launched directly (state pool VK, in place, shape of the issue)              */

static RecurrentParams variant_params(const Set &s)
{
    RecurrentParams p;
    memset(&p, 0, sizeof p);
    p.T = s.T, p.HV = HV, p.G = HV / H, p.V = V, p.N = s.B;
    p.q = s.q, p.k = s.k, p.v = s.v, p.o = s.o;
    int64_t qk[4] = {s.T * H * K, H * K, K, 1}, vo[4] = {s.T * HV * V, HV * V, V, 1};
    memcpy(p.q_s, qk, sizeof qk), memcpy(p.k_s, qk, sizeof qk);
    memcpy(p.v_s, vo, sizeof vo), memcpy(p.o_s, vo, sizeof vo);
    p.a = s.a, p.a_dtype = GDN_DTYPE_F32;
    int64_t gs[3] = {s.T * HV, HV, 1};
    memcpy(p.a_s, gs, sizeof gs), memcpy(p.beta_s, gs, sizeof gs);
    p.A_log = s.A_log, p.dt_bias = s.dt_bias, p.dt_s = 1;
    if (g_kind == GDN_GATE_KDA) { /* a [B, T, HV, K], dt_bias [HV, K] */
        int64_t as[3] = {s.T * HV * K, HV * K, K};
        memcpy(p.a_s, as, sizeof as);
        p.a_sr = 1, p.dt_s = K, p.dt_sr = 1;
    }
    p.softplus_beta = 1.0f, p.softplus_threshold = 20.0f;
    p.beta = s.b, p.beta_dtype = GDN_DTYPE_F32, p.beta_from_logits = 1;
    p.scale = 1.0f / sqrtf((float)K), p.use_qk_l2norm = 1;
    p.state_in = s.pool;
    p.st_in = StateStrides{HV * V * K, V * K, 1, K};
    p.num_slots = s.B;
    p.state_indices = s.idx, p.idx_s_n = 1, p.idx_cols = 1;
    p.inplace_state = 1;
    return p;
}

/* Time per call (cold; *hot too when given) of the kernel `launch(stream, params)` on the issue's
 * shape. */
template <typename F>
static double time_kernel(cudaStream_t stream, int64_t B, int64_t T, gdn_dtype sd, size_t l2, F launch,
                          double *hot = NULL)
{
    double set_bytes = call_bytes(B, T, sd);
    int nsets = std::max(1, (int)ceil(3.0 * (double)l2 / set_bytes));
    std::vector<Set> sets;
    std::vector<RecurrentParams> prm;
    for (int i = 0; i < nsets; i++) {
        sets.push_back(make_set(B, T, sd, 2000 + (uint64_t)i));
        prm.push_back(variant_params(sets.back()));
    }
    CK(cudaDeviceSynchronize());
    int n = std::max(launches_for(est_us(B, T, sd)), std::min(nsets, 400));
    double us = time_graph(stream, n, 7, [&](int i) {
        launch(stream, prm[(size_t)(i % nsets)]);
        CK(cudaGetLastError());
    });
    if (hot)
        *hot = time_graph(stream, launches_for(est_us(B, T, sd)), 7, [&](int) {
            launch(stream, prm[0]);
            CK(cudaGetLastError());
        });
    for (Set &s : sets)
        free_set(s);
    return us;
}

/* Launches a bulk-copy kernel (kernel(p, rows): either fast path) with programmatic stream
 * serialization (pdl) or plainly. */
template <typename Kernel>
static void launch_rows(Kernel kernel, cudaStream_t st, dim3 grid, int warps, size_t smem, bool pdl,
                        const RecurrentParams &p, int rows)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3((unsigned)(32 * warps));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, kernel, p, rows));
}

/* The fast path's largest tile, bf16 state when sdi: its static shared memory holds tile_rows()
 * rows, half of them with KDA's stage at a bf16 state (a 128-row bf16 tile wrote past the
 * shared memory of the KDA instance: memcheck, session 7 call 11). */
static int tma_max_rows(int sdi)
{
    const bool kda = g_kind == GDN_GATE_KDA;
    return sdi ? (kda ? tile_rows<128, __nv_bfloat16, true>() : tile_rows<128, __nv_bfloat16>())
               : (kda ? tile_rows<128, float, true>() : tile_rows<128, float>());
}

/* The fast path with a tile of `rows` rows and `warps` warps per CTA, launched with programmatic
 * stream serialization (pdl) or plainly: the instance of the gate kind (KDA). */
template <typename StateT, bool KDA>
static double time_tma_instance(cudaStream_t stream, int64_t B, int64_t T, int rows, int warps, size_t l2, bool pdl,
                                double *hot)
{
    gdn_dtype sd = sizeof(StateT) == 4 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
    constexpr int RPL = default_rows_per_lane<128, StateT>();
    const dim3 grid((unsigned)((V + rows - 1) / rows), (unsigned)HV, (unsigned)B);
    CK((prefer_shared_tma_kernel<128, StateT, __nv_bfloat16, RPL, KDA>()));
    return time_kernel(
        stream, B, T, sd, l2,
        [&](cudaStream_t st, const RecurrentParams &p) {
            launch_rows(recurrent_fwd_tma_kernel<128, StateT, __nv_bfloat16, RPL, KDA>, st, grid, warps, 0, pdl, p,
                        rows);
        },
        hot);
}

template <typename StateT>
static double time_tma(cudaStream_t stream, int64_t B, int64_t T, int rows, int warps, size_t l2, bool pdl = false,
                       double *hot = NULL)
{
    return g_kind == GDN_GATE_KDA ? time_tma_instance<StateT, true>(stream, B, T, rows, warps, l2, pdl, hot)
                                  : time_tma_instance<StateT, false>(stream, B, T, rows, warps, l2, pdl, hot);
}

/* The fast path's launcher tile (tma_tile of the gate kind's instance), bf16 state when sdi. */
static TmaTile launcher_tma_tile(int sdi, int64_t B, int64_t T)
{
    const bool kda = g_kind == GDN_GATE_KDA;
    return sdi ? (kda ? tma_tile<128, __nv_bfloat16, true>(B, HV, V, T, false)
                      : tma_tile<128, __nv_bfloat16>(B, HV, V, T, false))
               : (kda ? tma_tile<128, float, true>(B, HV, V, T, false) : tma_tile<128, float>(B, HV, V, T, false));
}

/* The fast path's launcher tile (sm90_recurrent_fwd.cu, launch_tma) with and without programmatic
 * dependent launch, for each T and B: hot / cold us and the CTAs of the grid. */
static void run_pdl(cudaStream_t stream, size_t l2, const std::vector<int64_t> &Ts, const std::vector<int64_t> &Bs)
{
    printf("\nfast path, launcher tile, without / with programmatic dependent launch (us hot / cold)\n");
    for (int sdi = 0; sdi < 2; sdi++) {
        for (int64_t T : Ts) {
            for (int64_t B : Bs) {
                const TmaTile tile = launcher_tma_tile(sdi, B, T);
                const int rows = tile.rows, warps = tile.warps;
                double h0, c0, h1, c1;
                c0 = sdi ? time_tma<__nv_bfloat16>(stream, B, T, rows, warps, l2, false, &h0)
                         : time_tma<float>(stream, B, T, rows, warps, l2, false, &h0);
                c1 = sdi ? time_tma<__nv_bfloat16>(stream, B, T, rows, warps, l2, true, &h1)
                         : time_tma<float>(stream, B, T, rows, warps, l2, true, &h1);
                printf("pdl %s T=%lld B=%lld tile %dx%d, %lld CTAs | plain %.2f / %.2f | pdl %.2f / %.2f\n",
                       sdi ? "bf16" : "f32", (long long)T, (long long)B, rows, warps,
                       (long long)(B * HV * ((V + rows - 1) / rows)), h0, c0, h1, c1);
                fflush(stdout);
            }
        }
    }
}

/* One-token calls: the fast path's instance with a one-token stage (TC = 1) and a static tile of
 * TILE rows, `warps` warps per CTA, programmatic launch by the launcher's rule (cold us). */
template <typename StateT, bool KDA, int TILE>
static double time_t1_instance(cudaStream_t stream, int64_t B, int warps, size_t l2, int sms)
{
    const gdn_dtype sd = sizeof(StateT) == 4 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
    constexpr int RPL = default_rows_per_lane<128, StateT>();
    const dim3 grid((unsigned)((V + TILE - 1) / TILE), (unsigned)HV, (unsigned)B);
    const bool pdl = tma_use_pdl((int64_t)grid.x * grid.y * grid.z, sms);
    CK((prefer_shared_tma_kernel<128, StateT, __nv_bfloat16, RPL, KDA, TILE, 1>()));
    return time_kernel(stream, B, 1, sd, l2, [&](cudaStream_t st, const RecurrentParams &p) {
        launch_rows(recurrent_fwd_tma_kernel<128, StateT, __nv_bfloat16, RPL, KDA, TILE, 1>, st, grid, warps, 0, pdl, p,
                    TILE);
    });
}

template <typename StateT, int TILE>
static double time_t1(cudaStream_t stream, int64_t B, int warps, size_t l2, int sms)
{
    return g_kind == GDN_GATE_KDA ? time_t1_instance<StateT, true, TILE>(stream, B, warps, l2, sms)
                                  : time_t1_instance<StateT, false, TILE>(stream, B, warps, l2, sms);
}

/* T = 1 for the B of --B: the chunk-of-8 instance at tma_tile's rows and warps (base; one-token
 * calls get 2 warps there, as the one-token instance does) against the
 * one-token instances at tiles of 32 KB and 16 KB of state with 2 and 4 warps, 8 KB with 1 and 2,
 * and 16 KB with 1 (cold us, % of copy): the data behind one_token_tile_rows. */
static void run_t1(cudaStream_t stream, size_t l2, double copy, const std::vector<int64_t> &Bs, int sms)
{
    printf("\none-token instances (T = 1; cold us, %% of copy)\n");
    for (int sdi = 0; sdi < 2; sdi++) {
        for (int64_t B : Bs) {
            const double bytes = call_bytes(B, 1, sdi ? GDN_DTYPE_BF16 : GDN_DTYPE_F32);
            const TmaTile base = launcher_tma_tile(sdi, B, 1);
            const bool pdl = tma_use_pdl(B * HV * ((V + base.rows - 1) / base.rows), sms);
            double us = sdi ? time_tma<__nv_bfloat16>(stream, B, 1, base.rows, base.warps, l2, pdl)
                            : time_tma<float>(stream, B, 1, base.rows, base.warps, l2, pdl);
            printf("t1 %s B=%lld | base %dx%d %.2f (%.1f%%) |", sdi ? "bf16" : "f32", (long long)B, base.rows, base.warps,
                   us, pct_copy(bytes, us, copy));
            for (int w : {2, 4}) {
                double a = sdi ? time_t1<__nv_bfloat16, 128>(stream, B, w, l2, sms) : time_t1<float, 64>(stream, B, w, l2, sms);
                double b = sdi ? time_t1<__nv_bfloat16, 64>(stream, B, w, l2, sms) : time_t1<float, 32>(stream, B, w, l2, sms);
                printf(" %dx%d %.2f (%.1f%%) %dx%d %.2f (%.1f%%)", sdi ? 128 : 64, w, a, pct_copy(bytes, a, copy),
                       sdi ? 64 : 32, w, b, pct_copy(bytes, b, copy));
            }
            for (int w : {1, 2}) {
                double c = sdi ? time_t1<__nv_bfloat16, 32>(stream, B, w, l2, sms) : time_t1<float, 16>(stream, B, w, l2, sms);
                printf(" %dx%d %.2f (%.1f%%)", sdi ? 32 : 16, w, c, pct_copy(bytes, c, copy));
            }
            double d = sdi ? time_t1<__nv_bfloat16, 64>(stream, B, 1, l2, sms) : time_t1<float, 32>(stream, B, 1, l2, sms);
            printf(" %dx1 %.2f (%.1f%%)\n", sdi ? 64 : 32, d, pct_copy(bytes, d, copy));
            fflush(stdout);
        }
    }
}

/* The register path with 16-byte state pieces (RPL rows per lane, `warps` warps per CTA). */
template <typename StateT, int RPL>
static double time_regs(cudaStream_t stream, int64_t B, int64_t T, int warps, size_t l2)
{
    gdn_dtype sd = sizeof(StateT) == 4 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
    const int rows = 4 * RPL * warps;
    const dim3 grid((unsigned)((V + rows - 1) / rows), (unsigned)HV, (unsigned)B);
    return time_kernel(stream, B, T, sd, l2, [&](cudaStream_t st, const RecurrentParams &p) {
        if (g_kind == GDN_GATE_KDA)
            recurrent_fwd_kernel<128, StateT, __nv_bfloat16, RPL, true, true><<<grid, 32 * warps, 0, st>>>(p);
        else
            recurrent_fwd_kernel<128, StateT, __nv_bfloat16, RPL, true><<<grid, 32 * warps, 0, st>>>(p);
    });
}

/* The register path (16-byte state pieces straight to registers; cold us, % of copy) for the T and
 * B of --T / --B: RPL 2 and 4 rows per lane, 1, 2 and 4 warps (the main table times the launcher). */
static void run_regs(cudaStream_t stream, size_t l2, double copy, const std::vector<int64_t> &Ts,
                     const std::vector<int64_t> &Bs)
{
    printf("\nregister path (cold us, %% of copy)\n");
    for (int sdi = 0; sdi < 2; sdi++) {
        for (int64_t T : Ts) {
            for (int64_t B : Bs) {
                const gdn_dtype sd = sdi ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
                const double bytes = call_bytes(B, T, sd);
                printf("regs %s T=%lld B=%lld |", sdi ? "bf16" : "f32", (long long)T, (long long)B);
                for (int w : {1, 2, 4}) {
                    double u2 = sdi ? time_regs<__nv_bfloat16, 2>(stream, B, T, w, l2) : time_regs<float, 2>(stream, B, T, w, l2);
                    double u4 = sdi ? time_regs<__nv_bfloat16, 4>(stream, B, T, w, l2) : time_regs<float, 4>(stream, B, T, w, l2);
                    printf(" 2x%d %.2f (%.1f%%) 4x%d %.2f (%.1f%%)", w, u2, pct_copy(bytes, u2, copy), w, u4,
                           pct_copy(bytes, u4, copy));
                }
                printf("\n");
                fflush(stdout);
            }
        }
    }
}

/* Fast-path tiles (rows x warps) and the register path (4 rows per lane x 4 warps) for the T and B
 * of --T / --B (cold us, % of copy): the data behind the launcher's tile choice. */
static void run_tiles(cudaStream_t stream, size_t l2, double copy, const std::vector<int64_t> &Ts,
                      const std::vector<int64_t> &Bs)
{
    printf("\nfast-path tiles and the register path (cold us, %% of copy)\n");
    for (int sdi = 0; sdi < 2; sdi++) {
        for (int64_t T : Ts) {
            for (int64_t B : Bs) {
                const double bytes = call_bytes(B, T, sdi ? GDN_DTYPE_BF16 : GDN_DTYPE_F32);
                printf("tiles %s T=%lld B=%lld |", sdi ? "bf16" : "f32", (long long)T, (long long)B);
                const int shapes[][2] = {{128, 4}, {64, 4}, {64, 2}, {32, 4}, {32, 2}, {16, 2}};
                for (const auto &sh : shapes) {
                    if (sh[0] > tma_max_rows(sdi))
                        continue;
                    const double us = sdi ? time_tma<__nv_bfloat16>(stream, B, T, sh[0], sh[1], l2, true)
                                          : time_tma<float>(stream, B, T, sh[0], sh[1], l2, true);
                    printf(" %dx%d %.2f (%.1f%%)", sh[0], sh[1], us, pct_copy(bytes, us, copy));
                }
                const double us = sdi ? time_regs<__nv_bfloat16, 4>(stream, B, T, 4, l2) : time_regs<float, 4>(stream, B, T, 4, l2);
                printf(" | regs 4x4 %.2f (%.1f%%)\n", us, pct_copy(bytes, us, copy));
                fflush(stdout);
            }
        }
    }
}

/* The tensor-core path with a tile of `rows` rows and `warps` warps per CTA (programmatic launch
 * by the launcher's rule, tma_use_pdl): the instance of the gate kind (KDA) and tile (WIDE). */
template <typename StateT, bool KDA, bool WIDE>
static double time_mma_instance(cudaStream_t stream, int64_t B, int64_t T, int rows, int warps, size_t l2, int sms)
{
    gdn_dtype sd = sizeof(StateT) == 4 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
    const dim3 grid((unsigned)((V + rows - 1) / rows), (unsigned)HV, (unsigned)B);
    const bool pdl = tma_use_pdl((int64_t)grid.x * grid.y * grid.z, sms);
    CK((prepare_mma_kernel<128, StateT, __nv_bfloat16, KDA, WIDE>()));
    return time_kernel(stream, B, T, sd, l2, [&](cudaStream_t st, const RecurrentParams &p) {
        launch_rows(recurrent_fwd_mma_kernel<128, StateT, __nv_bfloat16, KDA, WIDE>, st, grid, warps,
                    mma_smem_bytes<128, StateT, KDA, WIDE>(), pdl, p, rows);
    });
}

/* Rows past the narrow tile take KDA's wide instance (f32 state). */
template <typename StateT>
static double time_mma(cudaStream_t stream, int64_t B, int64_t T, int rows, int warps, size_t l2, int sms)
{
    constexpr bool HAS_WIDE = mma_has_wide<128, StateT, true>();
    if (g_kind != GDN_GATE_KDA)
        return time_mma_instance<StateT, false, false>(stream, B, T, rows, warps, l2, sms);
    if (HAS_WIDE && rows > mma_tile_rows<128, StateT>())
        return time_mma_instance<StateT, true, HAS_WIDE>(stream, B, T, rows, warps, l2, sms);
    return time_mma_instance<StateT, true, false>(stream, B, T, rows, warps, l2, sms);
}

/* The tensor-core path's tiles (rows x warps) against the CUDA-core fast path's launcher tile for
 * the T and B of --T / --B (cold us): the data behind the launcher's choice of path and tile. */
static void run_mma(cudaStream_t stream, size_t l2, const std::vector<int64_t> &Ts, const std::vector<int64_t> &Bs,
                    int sms)
{
    printf("\ntensor-core path tiles against the CUDA-core launcher tile (cold us)\n");
    for (int sdi = 0; sdi < 2; sdi++) {
        for (int64_t T : Ts) {
            for (int64_t B : Bs) {
                const bool kda = g_kind == GDN_GATE_KDA;
                const TmaTile t = launcher_tma_tile(sdi, B, T);
                const double base = sdi ? time_tma<__nv_bfloat16>(stream, B, T, t.rows, t.warps, l2, true)
                                        : time_tma<float>(stream, B, T, t.rows, t.warps, l2, true);
                printf("mma %s T=%lld B=%lld | cuda-core %dx%d %.2f |", sdi ? "bf16" : "f32", (long long)T, (long long)B,
                       t.rows, t.warps, base);
                const bool wide = !sdi && kda && mma_has_wide<128, float, true>(); /* both tiles */
                const int max_rows = sdi ? mma_tile_rows<128, __nv_bfloat16>()
                                         : wide ? mma_tile_rows<128, float, true>() : mma_tile_rows<128, float>();
                for (int rows = 16; rows <= max_rows; rows *= 2) {
                    const int warps = wide && rows > mma_tile_rows<128, float>() ? mma_warps<true>(rows)
                                                                                 : mma_warps<false>(rows);
                    const double us = sdi ? time_mma<__nv_bfloat16>(stream, B, T, rows, warps, l2, sms)
                                          : time_mma<float>(stream, B, T, rows, warps, l2, sms);
                    printf(" %dx%d %.2f", rows, warps, us);
                }
                printf("\n");
                fflush(stdout);
            }
        }
    }
}

static void run_variants(cudaStream_t stream, size_t l2, double copy)
{
    printf("\nvariants (cold us, %% of copy): tma rows x warps ..., regs RPL x warps\n");
    const int64_t cases[][2] = {{1, 1}, {8, 1}, {64, 1}, {512, 1}, {256, 4}, {256, 8}};
    for (int sdi = 0; sdi < 2; sdi++) {
        for (const auto &c : cases) {
            int64_t B = c[0], T = c[1];
            gdn_dtype sd = sdi ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
            double bytes = call_bytes(B, T, sd);
            printf("variant %s T=%lld B=%lld |", sdi ? "bf16" : "f32", (long long)T, (long long)B);
            const int max_rows = tma_max_rows(sdi);
            for (int rows = 16; rows <= max_rows; rows *= 2) {
                for (int w : {1, 2, 4}) {
                    if (w * 8 > rows)
                        continue;
                    double us = sdi ? time_tma<__nv_bfloat16>(stream, B, T, rows, w, l2)
                                    : time_tma<float>(stream, B, T, rows, w, l2);
                    printf(" tma %dx%d %.2f (%.0f%%)", rows, w, us, pct_copy(bytes, us, copy));
                }
            }
            double us = sdi ? time_regs<__nv_bfloat16, 4>(stream, B, T, 1, l2) : time_regs<float, 4>(stream, B, T, 1, l2);
            printf(" | regs 4x1 %.2f (%.0f%%)\n", us, pct_copy(bytes, us, copy));
            fflush(stdout);
        }
    }
}

int main(int argc, char **argv)
{
    bool variants = false, pdl = false, regs = false, tiles = false, mma = false, t1 = false;
    std::vector<int64_t> Ts = {1, 2, 4, 8}, Bs = {1, 8, 32, 64, 128, 256, 512};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--variants"))
            variants = true;
        else if (!strcmp(argv[i], "--pdl"))
            pdl = true;
        else if (!strcmp(argv[i], "--regs"))
            regs = true;
        else if (!strcmp(argv[i], "--tiles"))
            tiles = true;
        else if (!strcmp(argv[i], "--mma"))
            mma = true;
        else if (!strcmp(argv[i], "--t1"))
            t1 = true;
        else if (!strcmp(argv[i], "--kda"))
            g_kind = GDN_GATE_KDA;
        else if (!strcmp(argv[i], "--T") && i + 1 < argc)
            Ts = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "--B") && i + 1 < argc)
            Bs = parse_list(argv[++i]);
        else {
            fprintf(stderr, "usage: decode_sweeps [--variants] [--pdl] [--regs] [--tiles] [--mma] [--t1] [--kda] [--T LIST] [--B LIST]\n");
            return 2;
        }
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const size_t l2 = (size_t)prop.l2CacheSize;
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    printf("device: %s, %d SMs, L2 %.0f MB; %s gates\n", prop.name, prop.multiProcessorCount, l2 / 1e6,
           g_kind == GDN_GATE_KDA ? "KDA" : "GDN");
    const double copy = copy_gbps(stream, false);
    printf("copy ceiling: 1 GiB D2D %.0f GB/s with events\n", copy);
    if (variants)
        run_variants(stream, l2, copy);
    if (pdl)
        run_pdl(stream, l2, Ts, Bs);
    if (regs)
        run_regs(stream, l2, copy, Ts, Bs);
    if (tiles)
        run_tiles(stream, l2, copy, Ts, Bs);
    if (mma)
        run_mma(stream, l2, Ts, Bs, prop.multiProcessorCount);
    if (t1)
        run_t1(stream, l2, copy, Bs, prop.multiProcessorCount);
    CK(cudaStreamDestroy(stream));
    return 0;
}
