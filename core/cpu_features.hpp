// What this x86-64 CPU can run, probed once per process: the CPU engine's
// AVX-512 codecs (core/codec_avx512.cpp) and the communicator's host kernels
// (comm/host_isa.cpp) ask the same probe. LOWBIT_CPU_KERNELS=generic in the
// environment keeps every hand-written SIMD kernel off (generic()).
#pragma once

namespace lowbit {

struct CpuFeatures {
  bool avx2 = false;
  bool avx512 = false;      // F, BW, DQ and VL
  bool avx512vbmi = false;  // with avx512: the codecs' byte permutes
  bool generic = false;     // LOWBIT_CPU_KERNELS=generic: the portable loops only
};

const CpuFeatures& cpu_features();

}  // namespace lowbit
