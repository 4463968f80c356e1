/*
 * test_harness.c - checks the test harness itself: bf16 / f16 rounding against hand-worked
 * values and exhaustive round trips, the random streams, poison detection and the error metric.
 * If these are wrong, every other test's verdict is meaningless.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"

static int test_bf16_rounding(void)
{
    /* 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even (1). */
    tu_expect(tu_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80, "bf16(1 + 2^-8) tie must round to even 1.0");
    tu_expect(tu_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81, "bf16 just above the tie rounds up");
    tu_expect(tu_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82, "bf16 tie with odd lower neighbour rounds up");
    tu_expect(tu_f32_to_bf16(-2.0f) == 0xc000, "bf16(-2)");
    tu_expect(tu_f32_to_bf16(3.4e38f) == 0x7f80, "bf16 overflow to +Inf");
    tu_expect(isnan(tu_bf16_to_f32(tu_f32_to_bf16(NAN))), "bf16 NaN stays NaN");
    /* every bf16 bit pattern that is not NaN survives the round trip */
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = tu_bf16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        if (tu_f32_to_bf16(f) != h && !tu_expect(0, "bf16 round trip of 0x%04x", h))
            return TU_FAIL;
    }
    return TU_PASS;
}

static int test_f16_rounding(void)
{
    tu_expect(tu_f32_to_f16(1.0f) == 0x3c00, "f16(1)");
    tu_expect(tu_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "f16 tie to even (down)");
    tu_expect(tu_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02, "f16 tie to even (up)");
    tu_expect(tu_f32_to_f16(65504.0f) == 0x7bff, "f16 max");
    tu_expect(tu_f32_to_f16(65519.0f) == 0x7bff, "f16 just under the overflow tie");
    tu_expect(tu_f32_to_f16(65520.0f) == 0x7c00, "f16 overflow tie goes to Inf");
    tu_expect(tu_f32_to_f16(0x1p-24f) == 0x0001, "f16 smallest subnormal");
    tu_expect(tu_f32_to_f16(0x1p-25f) == 0x0000, "f16 half the smallest subnormal ties to 0");
    tu_expect(tu_f32_to_f16(0x1.8p-24f) == 0x0002, "f16 1.5 ulp subnormal ties to even 2");
    tu_expect(tu_f32_to_f16(-0x1p-14f) == 0x8400, "f16 -smallest normal");
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = tu_f16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        if (tu_f32_to_f16(f) != h && !tu_expect(0, "f16 round trip of 0x%04x", h))
            return TU_FAIL;
    }
    return TU_PASS;
}

static int test_rng(void)
{
    tu_rng a = tu_rng_make(1), b = tu_rng_make(1), c = tu_rng_make(2);
    tu_expect(tu_rng_u64(&a) == tu_rng_u64(&b), "the same seed gives the same stream");
    tu_expect(tu_rng_u64(&a) != tu_rng_u64(&c), "different seeds give different streams");
    enum { N = 200000 };
    static float x[N];
    tu_fill_normal(x, N, &a, 0.0f, 1.0f);
    double m = 0, v = 0;
    for (int i = 0; i < N; i++)
        m += x[i];
    m /= N;
    for (int i = 0; i < N; i++)
        v += (x[i] - m) * (x[i] - m);
    v /= N;
    tu_expect(fabs(m) < 0.01 && fabs(v - 1) < 0.02, "normal fill: mean %.4f var %.4f", m, v);
    tu_fill_logsigmoid_normal(x, N, &a);
    int ok = 1;
    for (int i = 0; i < N; i++)
        ok &= x[i] < 0 && isfinite(x[i]);
    tu_expect(ok, "logsigmoid(randn) must be finite and negative");
    return TU_PASS;
}

static int test_poison_and_compare(void)
{
    float ref[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8];
    tu_poison(out, GDN_DTYPE_F32, 8);
    tu_expect(tu_count_poison(out, GDN_DTYPE_F32, 8) == 8, "poisoned f32 is detected");
    tu_err e = tu_compare(out, GDN_DTYPE_F32, ref, GDN_DTYPE_F32, 8);
    tu_expect(e.nonfinite == 8, "poisoned output counts as non-finite (%zu)", e.nonfinite);
    memcpy(out, ref, sizeof out);
    out[5] += 0.5f;
    e = tu_compare(out, GDN_DTYPE_F32, ref, GDN_DTYPE_F32, 8);
    double want = 0.5 / sqrt(204.0);
    tu_expect(e.worst == 5 && fabs(e.rel - want) < 1e-12, "worst index %zu rel %.6g want 5 %.6g", e.worst,
              e.rel, want);
    uint16_t bf[4];
    tu_poison(bf, GDN_DTYPE_BF16, 4);
    tu_expect(bf[0] == 0x7fc0 && isnan(tu_bf16_to_f32(bf[3])), "bf16 poison is 0x7fc0");
    double d[3] = {0, 0, 0};
    float z[3] = {0, 0, 0};
    e = tu_compare(z, GDN_DTYPE_F32, d, GDN_DTYPE_F64, 3);
    tu_check("zeros vs zeros", e, 0.0);
    return TU_PASS;
}

int main(int argc, char **argv)
{
    static const tu_test tests[] = {
        {"harness_bf16_rounding", test_bf16_rounding},
        {"harness_f16_rounding", test_f16_rounding},
        {"harness_rng", test_rng},
        {"harness_poison_and_compare", test_poison_and_compare},
    };
    return tu_main(tests, TU_COUNT(tests), argc, argv);
}
