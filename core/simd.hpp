// Hot CPU loops are compiled twice, for baseline x86-64 and for AVX2, and the
// loader picks one (GCC/Clang function multi-versioning). AVX2 without FMA:
// no contraction, so both clones give the same bits.
#pragma once
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(LOWBIT_NO_CLONES)
#define LOWBIT_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LOWBIT_VECTOR_CLONES
#endif
