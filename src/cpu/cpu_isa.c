/*
 * cpu_isa.c - which instruction set the CPU backend's f32 kernels use (cpu_isa.h).
 */
#include <stdlib.h>
#include <string.h>

#include "cpu_isa.h"

static gdn_cpu_isa_kind detected(void)
{
#if GDN_CPU_X86_DISPATCH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma"))
        return GDN_CPU_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return GDN_CPU_ISA_AVX2;
#endif
    return GDN_CPU_ISA_BASE;
}

gdn_cpu_isa_kind gdn_cpu_isa(void)
{
    gdn_cpu_isa_kind isa = detected();
    const char *cap = getenv("GDN_CPU_ISA");
    if (cap && strcmp(cap, "base") == 0)
        return GDN_CPU_ISA_BASE;
    if (cap && strcmp(cap, "avx2") == 0 && isa > GDN_CPU_ISA_AVX2)
        return GDN_CPU_ISA_AVX2;
    return isa;
}
