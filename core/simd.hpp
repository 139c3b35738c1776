// Hot CPU loops are compiled three times, for baseline x86-64, for
// Haswell-class CPUs (AVX2, with gather-friendly tuning so the code-search
// table lookups vectorise) and for AVX-512 CPUs (x86-64-v4), and the loader
// picks one (GCC/Clang function multi-versioning). The code search and decode
// of whole tiles have hand-written AVX-512 forms (codec_avx512.hpp).
// The core is built with -ffp-contract=off, so no clone fuses a multiply-add
// and every clone gives the same bits.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(LOWBIT_NO_CLONES)
#define LOWBIT_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define LOWBIT_VECTOR_CLONES
#endif
