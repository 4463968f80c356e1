/*
 * bench_decode.cu - decode / multi-token verify benchmark of gdn_recurrent_fwd on CUDA.
 *
 * Shape of the issue: H = 16, HV = 32, K = V = 128, bf16 q/k/v, q/k l2 norm in-kernel, gating from
 * raw a / b / A_log / dt_bias in-kernel, a state pool [B, HV, V, K] (VK; --kv: KV) updated in place through
 * 1-D state_indices, as serving engines call it. For state f32 and bf16, T in {1, 2, 4, 8},
 * B in {1, 8, 32, 64, 128, 256, 512}:
 *   - time per call under CUDA graph replay, hot (one buffer set: small states sit in L2) and
 *     cold (rotating buffer sets together larger than 3x L2);
 *   - effective bandwidth over every byte that must move (state read + write, q/k/v/o, a/b,
 *     A_log/dt_bias, indices) and its fraction of the copy ceiling: a 1 GiB device-to-device
 *     copy timed with events outside graph replay (under replay it reads lower and would flatter).
 * Before timing, it checks one small case of each state dtype against the CPU backend.
 * The sweeps of tiles and paths that the launcher does not pick live in dev/decode/decode_sweeps.cu.
 *
 * --kda: KDA gates instead (a [B, T, HV, K] and dt_bias [HV, K], softplus gate in-kernel), for
 * bench/fla_decode.py --kda (FLA's fused_recurrent_kda).
 * --kv: the pool in the KV layout [B, HV, K, V] (FLA's and transformers'), for bench/fla_decode.py --kv.
 * Output: a human table on stdout, and with --tsv FILE one line per measurement
 * (state T B hot_us cold_us bytes) for bench/fla_decode.py to merge with FLA's numbers.
 * --T LIST and --B LIST (comma-separated) time only those token counts and batches.
 * Build: cmake -DGDN_BENCH=ON (target bench_decode), or scripts/device_decode.sh.
 */
#include "bench_decode_common.cuh"

int main(int argc, char **argv)
{
    const char *tsv_path = NULL;
    std::vector<int64_t> Ts = {1, 2, 4, 8}, Bs = {1, 8, 32, 64, 128, 256, 512};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tsv") && i + 1 < argc)
            tsv_path = argv[++i];
        else if (!strcmp(argv[i], "--T") && i + 1 < argc)
            Ts = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "--B") && i + 1 < argc)
            Bs = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "--kda"))
            g_kind = GDN_GATE_KDA;
        else if (!strcmp(argv[i], "--kv"))
            g_layout = GDN_STATE_KV;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    size_t l2 = (size_t)prop.l2CacheSize;
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    printf("device: %s, %d SMs, L2 %.0f MB; %s gates, %s pool\n", prop.name, prop.multiProcessorCount, l2 / 1e6,
           g_kind == GDN_GATE_KDA ? "KDA" : "GDN", g_layout == GDN_STATE_KV ? "KV" : "VK");

    double copy = copy_gbps(stream, false), copy_graph = copy_gbps(stream, true);
    printf("copy ceiling: 1 GiB D2D %.0f GB/s with events (the reference), %.0f GB/s under graph replay\n", copy,
           copy_graph);

    int ok = 1;
    for (gdn_dtype sd : {GDN_DTYPE_F32, GDN_DTYPE_BF16})
        for (int64_t T : {1, 4})
            ok &= check_case(sd, 3, T);
    if (!ok) {
        printf("correctness check failed: not timing\n");
        return 1;
    }

    FILE *tsv = tsv_path ? fopen(tsv_path, "w") : NULL;
    if (tsv)
        fprintf(tsv, "# copy_gbps %.1f copy_graph_gbps %.1f gate %s layout %s\nstate\tT\tB\thot_us\tcold_us\tbytes\n",
                copy, copy_graph, g_kind == GDN_GATE_KDA ? "kda" : "gdn", g_layout == GDN_STATE_KV ? "kv" : "vk");
    printf("\n%-5s %2s %4s %10s %10s %9s %7s\n", "state", "T", "B", "hot us", "cold us", "cold GB/s", "% copy");
    for (gdn_dtype sd : {GDN_DTYPE_F32, GDN_DTYPE_BF16}) {
        for (int64_t T : Ts) {
            for (int64_t B : Bs) {
                double hot, cold;
                time_api(stream, B, T, sd, l2, &hot, &cold);
                double bytes = call_bytes(B, T, sd);
                printf("%-5s %2lld %4lld %10.2f %10.2f %9.0f %6.1f%%\n", sd == GDN_DTYPE_F32 ? "f32" : "bf16",
                       (long long)T, (long long)B, hot, cold, bytes / (cold * 1e3), pct_copy(bytes, cold, copy));
                fflush(stdout);
                if (tsv)
                    fprintf(tsv, "%s\t%lld\t%lld\t%.3f\t%.3f\t%.0f\n", sd == GDN_DTYPE_F32 ? "f32" : "bf16",
                            (long long)T, (long long)B, hot, cold, bytes);
            }
        }
    }
    if (tsv)
        fclose(tsv);
    CK(cudaStreamDestroy(stream));
    return 0;
}
