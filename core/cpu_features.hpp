// The CPU's instruction-set level, chosen once per process for every hand
// written or per-level compiled CPU kernel: the moment codecs, the fused step
// and pass loops (core/isa.hpp), and the communicator's host kernels
// (comm/host_isa.cpp). Every level gives the portable rule's bits.
//
// The level that runs is the best this CPU and build have, or the one
// LOWBIT_CPU_KERNELS names (portable | avx2 | avx512 | neon; "generic" is
// portable): a level above what the CPU has runs the best it has instead, and
// an unknown name is ignored; both say so once on stderr and in
// cpu_kernels_note(). Tests and benchmarks switch levels with set_cpu_isa().
#pragma once

namespace lowbit {

// portable: the C++ rule, compiled for the baseline ISA (x86-64: SSE2;
// aarch64: NEON, which the baseline has); avx2: x86-64-v3 (AVX2, FMA, F16C,
// BMI2) with the AVX2 codec; avx512: x86-64-v4 (AVX-512 F/BW/CD/DQ/VL) with
// the AVX-512 codec where the CPU has VBMI too, else the AVX2 one; neon:
// aarch64 with the NEON codec.
enum class CpuIsa : int { Portable = 0, Avx2 = 1, Avx512 = 2, Neon = 3 };
constexpr int kCpuIsaCount = 4;

struct CpuFeatures {
  bool avx2 = false;        // AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE (x86-64-v3)
  bool avx512 = false;      // F, BW, CD, DQ, VL (x86-64-v4)
  bool avx512vbmi = false;  // with avx512: the AVX-512 codec's byte permutes
  bool neon = false;        // aarch64 Advanced SIMD
  CpuIsa best = CpuIsa::Portable;  // the best level this CPU and build can run
};

const CpuFeatures& cpu_features();

// Whether this CPU (and this build) can run `isa`.
bool cpu_isa_supported(CpuIsa isa);
// The level that runs now.
CpuIsa cpu_isa();
// Tests and benchmarks: run `isa` from now on; false (nothing changed) where
// it is not supported. Not thread-safe against running kernels.
bool set_cpu_isa(CpuIsa isa);
const char* cpu_isa_name(CpuIsa isa);
// Every level cpu_isa_supported(), comma-separated ("portable,avx2,...").
const char* cpu_isas_available();
// What became of LOWBIT_CPU_KERNELS ("" when it is unset or was honoured).
const char* cpu_kernels_note();

// The hand-written moment codec the running level uses (none at portable).
enum class SimdCodec : int { None = 0, Avx2 = 1, Avx512 = 2, Neon = 3 };
SimdCodec simd_codec();
const char* simd_codec_name(SimdCodec codec);

}  // namespace lowbit
