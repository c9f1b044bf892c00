// RNNCORE_CLONES: one binary for every x86-64: GCC clones a function's loops for AVX2+FMA and
// AVX-512 and picks one when the library loads. Elsewhere the baseline ISA (NEON on arm64).
// The clones name ISA levels, whose resolver tests CPU features: an "arch=<cpu>" clone is
// picked only on that very CPU model (__builtin_cpu_is), so "arch=haswell" and
// "arch=skylake-avx512" left every other AVX2/AVX-512 machine on the SSE2 loops.
// RNNCORE_NO_TARGET_CLONES: ThreadSanitizer builds (an instrumented ifunc resolver runs
// before the TSan runtime is initialised and crashes).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) && \
    !defined(RNNCORE_NO_TARGET_CLONES)
#if __GNUC__ >= 12
#define RNNCORE_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define RNNCORE_CLONES __attribute__((target_clones("default", "avx2", "avx512f")))
#endif
#else
#define RNNCORE_CLONES
#endif
