/*
 * cpu_isa_instances.h - compiles the kernel body named by GDN_CPU_KERNELS once per instruction
 * set (see cpu_isa.h). Included by a kernel file after its shared declarations; no include guard
 * on purpose.
 */
#include "cpu_isa.h"

#ifndef GDN_CPU_KERNELS
#error "define GDN_CPU_KERNELS as the kernel body to instantiate"
#endif

/* ISO C mode turns off the contraction of a * b + c into fused multiply-adds; the kernels want
 * them (one rounding instead of two, twice the arithmetic per instruction). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")
#define GDN_CPU_CONTRACT_PUSHED 1
#endif

#if GDN_CPU_X86_DISPATCH
#pragma GCC push_options
#pragma GCC target("avx512f", "avx512vl", "avx512bw", "avx512dq", "avx2", "fma", "f16c", "prefer-vector-width=512")
#define GDN_ISA(name) name##_avx512
#include GDN_CPU_KERNELS
#undef GDN_ISA
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2", "fma", "f16c")
#define GDN_ISA(name) name##_avx2
#include GDN_CPU_KERNELS
#undef GDN_ISA
#pragma GCC pop_options
#endif

#define GDN_ISA(name) name##_base
#include GDN_CPU_KERNELS
#undef GDN_ISA

#ifdef GDN_CPU_CONTRACT_PUSHED
#pragma GCC pop_options
#undef GDN_CPU_CONTRACT_PUSHED
#endif

/* fn_avx512 / fn_avx2 / fn_base for the ISA in effect (the x86 ones only where compiled). */
#if GDN_CPU_X86_DISPATCH
#define GDN_CPU_PICK(isa, fn)                                                                                      \
    ((isa) == GDN_CPU_ISA_AVX512 ? fn##_avx512 : (isa) == GDN_CPU_ISA_AVX2 ? fn##_avx2 : fn##_base)
#else
#define GDN_CPU_PICK(isa, fn) ((void)(isa), fn##_base)
#endif
