// The instruction set of the communicator's host kernels (host_kernels.hpp):
// the CPU level that runs (core/cpu_features.hpp, one choice for the whole
// library): AVX-512 F/BW/DQ/VL at avx512, AVX2 at avx2, else portable C++
// (the NEON level runs the portable loops, which aarch64 compilers vectorise).
#include "core/cpu_features.hpp"
#include "host_kernels.hpp"

namespace lowbit {
namespace onebit {
namespace {

CpuIsa cpu_level(HostIsa isa) {
  return isa == HostIsa::Avx512 ? CpuIsa::Avx512 : isa == HostIsa::Avx2 ? CpuIsa::Avx2 : CpuIsa::Portable;
}

}  // namespace

HostIsa host_isa() {
  switch (cpu_isa()) {
    case CpuIsa::Avx512: return HostIsa::Avx512;
    case CpuIsa::Avx2: return HostIsa::Avx2;
    case CpuIsa::Portable:
    case CpuIsa::Neon: break;
  }
  return HostIsa::Portable;
}

bool host_set_isa(HostIsa isa) {
#if defined(__aarch64__)
  if (isa == HostIsa::Portable) return true;  // the portable kernels are what every aarch64 level runs
#endif
  return set_cpu_isa(cpu_level(isa));
}

const char* host_isa_name(HostIsa isa) {
  return isa == HostIsa::Avx512 ? "avx512" : isa == HostIsa::Avx2 ? "avx2" : "portable";
}

}  // namespace onebit
}  // namespace lowbit
