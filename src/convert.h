/*
 * convert.h - bf16 and f16 to and from f32, one element at a time: the one home of these
 * conversions. The CPU backend's loads and stores inline them; convert.c wraps them as the public
 * array functions of gdn.h (gdn_f32_to_bf16 ...).
 *
 * f32 -> bf16 / f16 rounds to nearest, ties to even, as IEEE 754 and the GPU's cvt.rn do: NaN stays
 * NaN (quiet, sign and top payload bits kept), overflow goes to Inf, f16 keeps its subnormals.
 * bf16 / f16 -> f32 is exact. Plain C11: no half-precision types, no compiler extensions.
 */
#ifndef GDN_CONVERT_H
#define GDN_CONVERT_H

#include <stdint.h>
#include <string.h>

static inline uint32_t gdn_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float gdn_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float gdn_bf16_to_f32_one(uint16_t h) { return gdn_f32_from_bits((uint32_t)h << 16); }

static inline uint16_t gdn_f32_to_bf16_one(float f)
{
    uint32_t u = gdn_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* NaN stays NaN (quiet) */
    u += 0x7fffu + ((u >> 16) & 1u);            /* round to nearest even; a carry into Inf is right */
    return (uint16_t)(u >> 16);
}

static inline float gdn_f16_to_f32_one(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in f32 */
        float mag = (float)man * (1.0f / 16777216.0f);
        return gdn_f32_from_bits(sign | gdn_f32_bits(mag));
    }
    if (exp == 31)
        return gdn_f32_from_bits(sign | 0x7f800000u | (man << 13));
    return gdn_f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t gdn_f32_to_f16_one(float f)
{
    uint32_t u = gdn_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u >= 0x7f800000u) /* Inf, or NaN kept quiet with its top payload bits */
        return (uint16_t)(sign | 0x7c00u | (u > 0x7f800000u ? 0x0200u | ((u >> 13) & 0x3ffu) : 0u));
    if (u >= 0x477ff000u) /* >= 65520: rounds to Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (u < 0x38800000u) { /* below the smallest normal 2^-14: subnormal in units of 2^-24 */
        if (u <= 0x33000000u) /* <= 2^-25: ties to even give 0 */
            return sign;
        uint32_t e = u >> 23, m = (u & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14 .. 24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++; /* 0x400 after a carry is the smallest normal, which is right */
        return (uint16_t)(sign | r);
    }
    uint32_t h = (((u >> 23) - 112u) << 10) | ((u >> 13) & 0x3ffu);
    uint32_t rem = u & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the correct rounding */
    return (uint16_t)(sign | h);
}

#endif /* GDN_CONVERT_H */
