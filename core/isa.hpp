// The CPU loops compiled once per instruction-set level (core/cpu_features.hpp):
// a loop's body is written once, as portable C++, and each level gets a
// flattened copy of it (every call inside inlined, then vectorised for the
// level's target); the caller picks the copy of the running level once per
// chunk or pass (LOWBIT_ISA_PICK). What a body calls but cannot inline runs
// at the baseline target, so no level executes instructions its CPU lacks.
// The hand-written codecs (codec_avx2.cpp, codec_avx512*.cpp, codec_neon.cpp)
// are chosen per tile by simd_codec().
// The core is built with -ffp-contract=off, so no level fuses a multiply-add
// and every level gives the same bits.
#pragma once

#include "cpu_features.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(LOWBIT_NO_CLONES)
#define LOWBIT_ISA_X86 1
#define LOWBIT_TARGET_AVX2 __attribute__((target("arch=x86-64-v3"), flatten))
#define LOWBIT_TARGET_AVX512 __attribute__((target("arch=x86-64-v4"), flatten))
#endif
#if defined(__GNUC__) || defined(__clang__)
#define LOWBIT_TARGET_PORTABLE __attribute__((flatten))
#else
#define LOWBIT_TARGET_PORTABLE
#endif

#define LOWBIT_ISA_UNPAREN(...) __VA_ARGS__

// LOWBIT_PER_ISA(ret, name, (params), call) defines `ret name##_<level>
// (params)` returning `call` (the body, an inline function, called with the
// parameters) for each level compiled here; LOWBIT_PER_ISA_TEMPLATE takes a
// parenthesised template parameter list first.
#define LOWBIT_ISA_COPY(attr, ret, name, params, call) \
  attr ret name params { return call; }
#ifdef LOWBIT_ISA_X86
#define LOWBIT_PER_ISA(ret, name, params, call)                              \
  LOWBIT_ISA_COPY(LOWBIT_TARGET_PORTABLE, ret, name##_portable, params, call) \
  LOWBIT_ISA_COPY(LOWBIT_TARGET_AVX2, ret, name##_avx2, params, call)         \
  LOWBIT_ISA_COPY(LOWBIT_TARGET_AVX512, ret, name##_avx512, params, call)
#define LOWBIT_PER_ISA_TEMPLATE(tparams, ret, name, params, call)                                             \
  template <LOWBIT_ISA_UNPAREN tparams> LOWBIT_ISA_COPY(LOWBIT_TARGET_PORTABLE, ret, name##_portable, params, call) \
  template <LOWBIT_ISA_UNPAREN tparams> LOWBIT_ISA_COPY(LOWBIT_TARGET_AVX2, ret, name##_avx2, params, call)         \
  template <LOWBIT_ISA_UNPAREN tparams> LOWBIT_ISA_COPY(LOWBIT_TARGET_AVX512, ret, name##_avx512, params, call)
// &name##_<level> targs for the running level (targs: <...> or nothing).
#define LOWBIT_ISA_PICK(name, ...)                                                \
  (::lowbit::cpu_isa() == ::lowbit::CpuIsa::Avx512 ? &name##_avx512 __VA_ARGS__  \
   : ::lowbit::cpu_isa() == ::lowbit::CpuIsa::Avx2 ? &name##_avx2 __VA_ARGS__     \
                                                    : &name##_portable __VA_ARGS__)
#else
// One copy: the portable and NEON levels share the baseline target (NEON is
// part of aarch64's); they differ in the hand-written codec.
#define LOWBIT_PER_ISA(ret, name, params, call) \
  LOWBIT_ISA_COPY(LOWBIT_TARGET_PORTABLE, ret, name##_portable, params, call)
#define LOWBIT_PER_ISA_TEMPLATE(tparams, ret, name, params, call) \
  template <LOWBIT_ISA_UNPAREN tparams> LOWBIT_ISA_COPY(LOWBIT_TARGET_PORTABLE, ret, name##_portable, params, call)
#define LOWBIT_ISA_PICK(name, ...) (&name##_portable __VA_ARGS__)
#endif
