/*
 * consumer.c - a program built against an installed libgdn (tests/test_install.sh builds it with
 * find_package, pkg-config and a static link): the header and the library agree on the version,
 * a bf16 round trip, and one gating op on the CPU checked against its formula.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <gdn.h>

int main(void)
{
    if (gdn_version_number() != GDN_VERSION_NUMBER) {
        fprintf(stderr, "consumer: library version %d, header %d\n", gdn_version_number(), GDN_VERSION_NUMBER);
        return 1;
    }
    float x[2] = {1.5f, -0.3f}, y[2];
    uint16_t h[2];
    gdn_f32_to_bf16(x, h, 2);
    gdn_bf16_to_f32(h, y, 2);
    if (h[0] != 0x3fc0 || fabsf(y[1] - x[1]) > 1e-3f) {
        fprintf(stderr, "consumer: bf16 round trip 0x%04x %g\n", h[0], y[1]);
        return 1;
    }

    /* g = -exp(A_log) * softplus(a + dt_bias) for B = 1, T = 2, HV = 2 */
    float a[4] = {0.5f, -1.0f, 2.0f, 0.0f}, A_log[2] = {0.0f, 0.7f}, dt_bias[2] = {0.1f, -0.2f}, g[4];
    gdn_gating_args args;
    memset(&args, 0, sizeof args);
    args.kind = GDN_GATE_GDN;
    args.a = gdn_tensor_make(a, GDN_DTYPE_F32, GDN_DEVICE_CPU, 0, 3, (int64_t[]){1, 2, 2});
    args.A_log = gdn_tensor_make(A_log, GDN_DTYPE_F32, GDN_DEVICE_CPU, 0, 1, (int64_t[]){2});
    args.dt_bias = gdn_tensor_make(dt_bias, GDN_DTYPE_F32, GDN_DEVICE_CPU, 0, 1, (int64_t[]){2});
    args.g_out = gdn_tensor_make(g, GDN_DTYPE_F32, GDN_DEVICE_CPU, 0, 3, (int64_t[]){1, 2, 2});
    gdn_status st = gdn_gating(&args);
    if (st != GDN_OK) {
        fprintf(stderr, "consumer: gdn_gating: %s (%s)\n", gdn_status_string(st), gdn_last_error());
        return 1;
    }
    for (int i = 0; i < 4; i++) {
        int j = i % 2;
        double want = -exp(A_log[j]) * log1p(exp(a[i] + dt_bias[j]));
        if (fabs(g[i] - want) > 1e-5 * fabs(want)) {
            fprintf(stderr, "consumer: g[%d] = %.7g, want %.7g\n", i, g[i], want);
            return 1;
        }
    }
    printf("consumer: libgdn %s (CUDA backend: %s) ok\n", gdn_version_string(), gdn_has_cuda() ? "yes" : "no");
    return 0;
}
