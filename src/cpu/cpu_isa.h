/*
 * cpu_isa.h - runtime choice of the instruction set for the CPU backend's f32 kernels.
 *
 * A kernel file keeps its ISA-dependent code in a `.inc` body whose functions are named through
 * GDN_ISA(name). It defines GDN_CPU_KERNELS as that body's file name and includes
 * cpu_isa_instances.h, which compiles the body once per ISA: for x86-64 with GCC an AVX-512
 * instance (512-bit vectors) and an AVX2 + FMA instance, through `#pragma GCC target`, and
 * everywhere a portable instance with the compiler's default flags. The file then calls
 * gdn_cpu_isa() and picks name_avx512, name_avx2 or name_base. Plain C loops over fixed lane
 * counts are written so that the compiler vectorises them for each target; no intrinsics.
 *
 * $GDN_CPU_ISA = base | avx2 | avx512 caps the choice (tests run every instance this way).
 */
#ifndef GDN_CPU_ISA_H
#define GDN_CPU_ISA_H

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define GDN_CPU_X86_DISPATCH 1
#include <immintrin.h> /* declares every intrinsic; the target pragmas enable them per instance */
#else
#define GDN_CPU_X86_DISPATCH 0
#endif

/* Inlined whatever the compiler's estimate: kernels specialised on constant head dims. */
#if defined(__GNUC__)
#define GDN_CPU_INLINE inline __attribute__((always_inline))
#else
#define GDN_CPU_INLINE inline
#endif

/* Keeps the loop that follows rolled (GCC unrolls register-tiled loops into spills). */
#if defined(__GNUC__) && !defined(__clang__)
#define GDN_CPU_NO_UNROLL _Pragma("GCC unroll 1")
#else
#define GDN_CPU_NO_UNROLL
#endif

typedef enum gdn_cpu_isa_kind { GDN_CPU_ISA_BASE = 0, GDN_CPU_ISA_AVX2 = 1, GDN_CPU_ISA_AVX512 = 2 } gdn_cpu_isa_kind;

/* The best instance this CPU runs, capped by $GDN_CPU_ISA (read on every call). */
gdn_cpu_isa_kind gdn_cpu_isa(void);

#endif /* GDN_CPU_ISA_H */
