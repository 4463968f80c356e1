/*
 * convert.c - the public bf16 / f16 array conversions of gdn.h, over the scalar ones of convert.h.
 */
#include "gdn.h"
#include "convert.h"

void gdn_f32_to_bf16(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = gdn_f32_to_bf16_one(src[i]);
}

void gdn_bf16_to_f32(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = gdn_bf16_to_f32_one(src[i]);
}

void gdn_f32_to_f16(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = gdn_f32_to_f16_one(src[i]);
}

void gdn_f16_to_f32(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = gdn_f16_to_f32_one(src[i]);
}
