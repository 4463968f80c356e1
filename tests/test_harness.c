/*
 * test_harness.c - checks the test harness itself: the random streams, poison detection and the
 * error metric (the bf16 / f16 rounding it uses is the library's, tested by test_convert.c).
 * If these are wrong, every other test's verdict is meaningless.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"

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
    tu_expect(bf[0] == 0x7fc0 && isnan(tu_get(bf, GDN_DTYPE_BF16, 3)), "bf16 poison is 0x7fc0");
    double d[3] = {0, 0, 0};
    float z[3] = {0, 0, 0};
    e = tu_compare(z, GDN_DTYPE_F32, d, GDN_DTYPE_F64, 3);
    tu_check("zeros vs zeros", e, 0.0);
    return TU_PASS;
}

int main(int argc, char **argv)
{
    static const tu_test tests[] = {
        {"harness_rng", test_rng},
        {"harness_poison_and_compare", test_poison_and_compare},
    };
    return tu_main(tests, TU_COUNT(tests), argc, argv);
}
