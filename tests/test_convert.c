/*
 * test_convert.c - the public bf16 / f16 conversions of gdn.h (gdn_f32_to_bf16 ...), exhaustively
 * where that is cheap: every one of the 65536 bit patterns widens to the value its format defines
 * and narrows back to itself; the midpoint between every pair of neighbouring values (and the
 * overflow threshold above the largest) rounds to the even neighbour, and one f32 ulp either side
 * rounds down or up; NaN stays NaN with its sign; random f32 values match a binary-search oracle.
 * The test harness and the CPU backend use these same conversions, so this is their test too.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"

enum { NPAT = 0x10000 };

typedef struct format {
    const char *name;
    gdn_dtype dtype;
    uint16_t inf;    /* +Inf; the positive finite patterns are 0 .. inf - 1, increasing */
    uint16_t quiet;  /* the quiet bit of a NaN */
} format;

static const format BF16 = {"bf16", GDN_DTYPE_BF16, 0x7f80, 0x0040};
static const format F16 = {"f16", GDN_DTYPE_F16, 0x7c00, 0x0200};

static void narrow(const format *f, const float *src, uint16_t *dst, size_t n)
{
    if (f->dtype == GDN_DTYPE_BF16)
        gdn_f32_to_bf16(src, dst, n);
    else
        gdn_f32_to_f16(src, dst, n);
}

static void widen(const format *f, const uint16_t *src, float *dst, size_t n)
{
    if (f->dtype == GDN_DTYPE_BF16)
        gdn_bf16_to_f32(src, dst, n);
    else
        gdn_f16_to_f32(src, dst, n);
}

static uint16_t narrow1(const format *f, float x)
{
    uint16_t h;
    narrow(f, &x, &h, 1);
    return h;
}

static uint32_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The value a bit pattern stands for, from the format's definition (sign, biased exponent,
 * fraction), in double. */
static double defined_value(const format *f, uint16_t h)
{
    int mbits = f->dtype == GDN_DTYPE_BF16 ? 7 : 10, ebits = 15 - mbits, bias = (1 << (ebits - 1)) - 1;
    int e = (h >> mbits) & ((1 << ebits) - 1), m = h & ((1 << mbits) - 1);
    double sign = h & 0x8000 ? -1.0 : 1.0;
    if (e == (1 << ebits) - 1)
        return m ? NAN : sign * INFINITY;
    if (e == 0)
        return sign * ldexp(m, 1 - bias - mbits);
    return sign * ldexp((1 << mbits) + m, e - bias - mbits);
}

static int test_every_pattern(const format *f)
{
    static uint16_t pat[NPAT], back[NPAT];
    static float wide[NPAT];
    for (uint32_t h = 0; h < NPAT; h++)
        pat[h] = (uint16_t)h;
    widen(f, pat, wide, NPAT);
    narrow(f, wide, back, NPAT);
    for (uint32_t h = 0; h < NPAT; h++) {
        double want = defined_value(f, (uint16_t)h);
        if (isnan(want)) {
            /* a NaN widens to a NaN, keeps its sign, and comes back a quiet NaN */
            int ok = isnan(wide[h]) && (bits(wide[h]) >> 31) == (h >> 15) && (back[h] & 0x7fffu) > f->inf &&
                     (back[h] & f->quiet) && (back[h] & 0x8000u) == (h & 0x8000u);
            if (!tu_expect(ok, "%s NaN 0x%04x: widened 0x%08x, back 0x%04x", f->name, h, bits(wide[h]), back[h]))
                return TU_FAIL;
            if ((h & f->quiet) && !tu_expect(back[h] == h, "%s quiet NaN 0x%04x comes back 0x%04x", f->name, h,
                                             back[h]))
                return TU_FAIL;
            continue;
        }
        if (!tu_expect((double)wide[h] == want && !signbit(wide[h]) == !signbit(want),
                       "%s 0x%04x widens to %.9g, want %.9g", f->name, h, wide[h], want))
            return TU_FAIL;
        if (!tu_expect(back[h] == h, "%s 0x%04x round trip gives 0x%04x", f->name, h, back[h]))
            return TU_FAIL;
    }
    return TU_PASS;
}

/* For every pair of neighbours lo < hi among the finite patterns (hi = Inf above the largest, its
 * "midpoint" being the overflow threshold), of both signs: the midpoint rounds to the even one of
 * the two, one f32 ulp below it to lo, one above to hi. */
static int test_ties(const format *f)
{
    for (uint32_t s = 0; s <= 0x8000u; s += 0x8000u)
        for (uint32_t lo = 0; lo < f->inf; lo++) {
            uint32_t hi = lo + 1;
            double a = defined_value(f, (uint16_t)lo), b = hi == f->inf ? 2 * a - defined_value(f, (uint16_t)(lo - 1))
                                                                        : defined_value(f, (uint16_t)hi);
            float mid = (float)(0.5 * (a + b)); /* exact: the formats have at most 11 significant bits */
            if (!tu_expect((double)mid == 0.5 * (a + b), "%s midpoint of 0x%04x not exact in f32", f->name, lo))
                return TU_FAIL;
            if (s)
                mid = -mid;
            uint32_t even = (lo & 1u) ? hi : lo;
            uint16_t got = narrow1(f, mid);
            uint16_t below = narrow1(f, from_bits(bits(mid) - 1)), above = narrow1(f, from_bits(bits(mid) + 1));
            int ok = got == (s | even) && below == (s | lo) && above == (s | hi);
            if (!tu_expect(ok, "%s %smidpoint of 0x%04x and 0x%04x: got 0x%04x (want 0x%04x), one ulp below 0x%04x, "
                           "above 0x%04x", f->name, s ? "negative " : "", lo, hi, got, s | even, below, above))
                return TU_FAIL;
        }
    return TU_PASS;
}

/* Nearest pattern to |x| by binary search over the increasing finite patterns, ties to even,
 * Inf from the overflow threshold on: an oracle that shares no code with the library. */
static uint16_t oracle(const format *f, float x)
{
    double ax = fabs((double)x);
    uint32_t lo = 0, hi = f->inf; /* value(lo) <= ax < value(hi), value(inf) = threshold's twin */
    double top = 2 * defined_value(f, (uint16_t)(f->inf - 1)) - defined_value(f, (uint16_t)(f->inf - 2));
    if (ax >= top)
        lo = f->inf;
    else
        while (hi - lo > 1) {
            uint32_t m = (lo + hi) / 2;
            if (defined_value(f, (uint16_t)m) <= ax)
                lo = m;
            else
                hi = m;
        }
    uint32_t h = lo;
    if (lo < f->inf) {
        double a = defined_value(f, (uint16_t)lo), b = hi == f->inf ? top : defined_value(f, (uint16_t)hi);
        if (ax - a > b - ax || (ax - a == b - ax && (lo & 1u)))
            h = hi;
    }
    return (uint16_t)(h | (signbit(x) ? 0x8000u : 0u));
}

static int test_random(const format *f)
{
    enum { N = 1 << 18 };
    static float x[N];
    static uint16_t got[N];
    tu_rng r = tu_rng_make(7);
    for (size_t i = 0; i < N; i++) {
        /* random bit patterns, half of them steered into the format's finite range */
        uint32_t u = (uint32_t)tu_rng_u64(&r);
        if (i & 1)
            u = (u & 0x83ffffffu) | (uint32_t)(tu_rng_int(&r, f->dtype == GDN_DTYPE_BF16 ? 0 : 96, 143) << 23);
        x[i] = from_bits(u);
    }
    narrow(f, x, got, N);
    for (size_t i = 0; i < N; i++) {
        if (isnan(x[i])) {
            if (!tu_expect((got[i] & 0x7fffu) > f->inf && (got[i] >> 15) == (bits(x[i]) >> 31),
                           "%s of NaN 0x%08x gives 0x%04x", f->name, bits(x[i]), got[i]))
                return TU_FAIL;
            continue;
        }
        uint16_t want = oracle(f, x[i]);
        if (!tu_expect(got[i] == want, "%s(%.9g = 0x%08x) = 0x%04x, want 0x%04x", f->name, x[i], bits(x[i]),
                       got[i], want))
            return TU_FAIL;
    }
    return TU_PASS;
}

static int test_bf16_patterns(void) { return test_every_pattern(&BF16); }
static int test_f16_patterns(void) { return test_every_pattern(&F16); }
static int test_bf16_ties(void) { return test_ties(&BF16); }
static int test_f16_ties(void) { return test_ties(&F16); }
static int test_bf16_random(void) { return test_random(&BF16); }
static int test_f16_random(void) { return test_random(&F16); }

/* Hand-worked values, so that a wrong oracle above cannot hide a wrong library. */
static int test_special_values(void)
{
    tu_expect(narrow1(&BF16, 1.0f + 0x1p-8f) == 0x3f80, "bf16(1 + 2^-8) tie rounds to even 1.0");
    tu_expect(narrow1(&BF16, 1.0f + 3 * 0x1p-8f) == 0x3f82, "bf16 tie with odd lower neighbour rounds up");
    tu_expect(narrow1(&BF16, -2.0f) == 0xc000, "bf16(-2)");
    tu_expect(narrow1(&BF16, 3.4e38f) == 0x7f80, "bf16(3.4e38) overflows to +Inf");
    tu_expect(narrow1(&BF16, -INFINITY) == 0xff80, "bf16(-Inf)");
    tu_expect(narrow1(&BF16, from_bits(0x7f800001u)) == 0x7fc0, "bf16 of a signalling NaN is a quiet NaN");
    tu_expect(narrow1(&BF16, from_bits(0x00000001u)) == 0x0000, "bf16 of the smallest f32 subnormal is 0");
    tu_expect(narrow1(&BF16, -0.0f) == 0x8000, "bf16(-0)");
    tu_expect(narrow1(&F16, 1.0f) == 0x3c00, "f16(1)");
    tu_expect(narrow1(&F16, 1.0f + 0x1p-11f) == 0x3c00, "f16 tie to even (down)");
    tu_expect(narrow1(&F16, 1.0f + 3 * 0x1p-11f) == 0x3c02, "f16 tie to even (up)");
    tu_expect(narrow1(&F16, 65504.0f) == 0x7bff, "f16 max");
    tu_expect(narrow1(&F16, 65519.0f) == 0x7bff, "f16 just under the overflow threshold");
    tu_expect(narrow1(&F16, 65520.0f) == 0x7c00, "f16 overflow threshold goes to Inf");
    tu_expect(narrow1(&F16, -1e10f) == 0xfc00, "f16(-1e10) = -Inf");
    tu_expect(narrow1(&F16, 0x1p-24f) == 0x0001, "f16 smallest subnormal");
    tu_expect(narrow1(&F16, 0x1p-25f) == 0x0000, "f16 half the smallest subnormal ties to 0");
    tu_expect(narrow1(&F16, 0x1.8p-24f) == 0x0002, "f16 1.5 units of 2^-24 tie to even 2");
    tu_expect(narrow1(&F16, 0x1.ffcp-15f) == 0x0400, "f16 largest subnormal + half rounds up to the smallest normal");
    tu_expect(narrow1(&F16, -0x1p-14f) == 0x8400, "f16 -smallest normal");
    tu_expect(narrow1(&F16, from_bits(0xff800001u)) == 0xfe00, "f16 of a negative signalling NaN");
    float w;
    uint16_t h = 0x0001;
    gdn_f16_to_f32(&h, &w, 1);
    tu_expect(w == 0x1p-24f, "f16 0x0001 widens to 2^-24 (%g)", w);
    h = 0x3f80;
    gdn_bf16_to_f32(&h, &w, 1);
    tu_expect(w == 1.0f, "bf16 0x3f80 widens to 1 (%g)", w);
    /* n == 0 touches nothing, NULL allowed */
    gdn_f32_to_bf16(NULL, NULL, 0);
    gdn_bf16_to_f32(NULL, NULL, 0);
    gdn_f32_to_f16(NULL, NULL, 0);
    gdn_f16_to_f32(NULL, NULL, 0);
    /* exactly n elements are written */
    float src[3] = {1, 2, 3};
    uint16_t dst[4] = {0xdead, 0xdead, 0xdead, 0xdead};
    gdn_f32_to_f16(src, dst, 3);
    tu_expect(dst[0] == 0x3c00 && dst[1] == 0x4000 && dst[2] == 0x4200 && dst[3] == 0xdead,
              "f16 array of 3: %04x %04x %04x, guard %04x", dst[0], dst[1], dst[2], dst[3]);
    return TU_PASS;
}

int main(int argc, char **argv)
{
    static const tu_test tests[] = {
        {"convert_special_values", test_special_values},
        {"convert_bf16_every_pattern", test_bf16_patterns},
        {"convert_f16_every_pattern", test_f16_patterns},
        {"convert_bf16_ties", test_bf16_ties},
        {"convert_f16_ties", test_f16_ties},
        {"convert_bf16_random_vs_oracle", test_bf16_random},
        {"convert_f16_random_vs_oracle", test_f16_random},
    };
    return tu_main(tests, TU_COUNT(tests), argc, argv);
}
