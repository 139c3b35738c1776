// Hot CPU loops are compiled twice, for baseline x86-64 and for Haswell-class
// CPUs (AVX2, with gather-friendly tuning so the code-search table lookups
// vectorise), and the loader picks one (GCC/Clang function multi-versioning).
// The core is built with -ffp-contract=off, so no clone fuses a multiply-add
// and every clone gives the same bits.
#pragma once
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(LOWBIT_NO_CLONES)
#define LOWBIT_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LOWBIT_VECTOR_CLONES
#endif
