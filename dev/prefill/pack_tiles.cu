/*
 * pack_tiles.cu - tile shapes for the strided-view copy of src/cuda/cuda_pack.cu, timed on the views
 * the chunk op packs: transformers' v (a channel slice of a transposed [B, C, T] projection, unit
 * stride on the tokens) into a contiguous buffer, and a contiguous o out to a transposed view.
 * Each variant is checked element by element first; GB/s counts bytes read plus written, next to a
 * device-to-device cudaMemcpy of the same bytes.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc \
 *        dev/prefill/pack_tiles.cu -o /tmp/pack_tiles && /tmp/pack_tiles
 */
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/cuda_pack.cu"

gdn_status gdn_set_error(gdn_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return status;
}

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                              \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef gdn_status (*pack_fn)(const void *, const int64_t *, void *, const int64_t *, int64_t, int64_t, int64_t,
                              int64_t, cudaStream_t);

struct variant {
    const char *name;
    pack_fn fn;
};

static float time_ms(pack_fn fn, const void *src, const int64_t *ss, void *dst, const int64_t *ds, int64_t B,
                     int64_t T, int64_t H, int64_t D)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int r = 0; r < 12; ++r) {
        CK(cudaEventRecord(a));
        if (fn(src, ss, dst, ds, B, T, H, D, 0) != GDN_OK)
            exit(1);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main()
{
    const variant vs[] = {
        {"64x64", gdn_pack::launch_pack<64, 64>},   {"64x128", gdn_pack::launch_pack<64, 128>},
        {"128x64", gdn_pack::launch_pack<128, 64>}, {"128x128", gdn_pack::launch_pack<128, 128>},
        {"256x64", gdn_pack::launch_pack<256, 64>}, {"64x256", gdn_pack::launch_pack<64, 256>},
    };
    const int64_t B = 1, T = 32768, H = 32, D = 128, C = 2 * 16 * 128 + H * D;
    const size_t n = (size_t)(B * T * H * D), big = (size_t)(B * C * T);
    uint16_t *buf, *pk;
    CK(cudaMalloc(&buf, big * 2));
    CK(cudaMalloc(&pk, n * 2));
    std::vector<uint16_t> h(big);
    for (size_t i = 0; i < big; ++i)
        h[i] = (uint16_t)(i * 2654435761u >> 7);
    CK(cudaMemcpy(buf, h.data(), big * 2, cudaMemcpyHostToDevice));
    const int64_t off = 2 * 16 * 128 * T; /* v's first channel */
    const int64_t vs_s[4] = {C * T, 1, D * T, T}, pk_s[4] = {T * H * D, H * D, D, 1};
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a));
    CK(cudaMemcpyAsync(pk, buf, n * 2, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float mc;
    CK(cudaEventElapsedTime(&mc, a, b));
    printf("v [1, 32768, 32, 128] bf16, %.0f MB each way; cudaMemcpy D2D %.3f ms (%.0f GB/s)\n", n * 2 / 1e6, mc,
           2 * n * 2 / mc / 1e6);
    printf("%-8s %14s %14s\n", "tile", "pack (GB/s)", "unpack (GB/s)");
    std::vector<uint16_t> back(n);
    /* Each tile on the aligned view (32-bit accesses), then 64x64 on a view one element off
     * (16-bit accesses). */
    for (int k = 0; k <= (int)(sizeof vs / sizeof vs[0]); ++k) {
        const variant v = k < (int)(sizeof vs / sizeof vs[0]) ? vs[k] : variant{"64x64+1", vs[0].fn};
        const int64_t o = k < (int)(sizeof vs / sizeof vs[0]) ? off : off + 1;
        CK(cudaMemset(pk, 0xff, n * 2));
        if (v.fn(buf + o, vs_s, pk, pk_s, B, T, H, D, 0) != GDN_OK)
            return 1;
        CK(cudaMemcpy(back.data(), pk, n * 2, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (int64_t t = 0; t < T; t += 7)
            for (int64_t hh = 0; hh < H; ++hh)
                for (int64_t d = 0; d < D; ++d)
                    bad += back[(size_t)(t * H * D + hh * D + d)] != h[(size_t)(o + hh * D * T + d * T + t)];
        if (bad) {
            printf("%s: %zu elements wrong\n", v.name, bad);
            return 1;
        }
        const float tp = time_ms(v.fn, buf + o, vs_s, pk, pk_s, B, T, H, D);
        const float tu = time_ms(v.fn, pk, pk_s, buf + o, vs_s, B, T, H, D);
        printf("%-8s %7.3f (%4.0f) %7.3f (%4.0f)\n", v.name, tp, 2 * n * 2 / tp / 1e6, tu, 2 * n * 2 / tu / 1e6);
    }
    return 0;
}
