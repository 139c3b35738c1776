// The instruction set of the communicator's host kernels (host_kernels.hpp):
// AVX-512 F/BW/DQ/VL where the CPU has them, else AVX2, else portable C++
// (core/cpu_features.hpp's probe; LOWBIT_CPU_KERNELS=generic: portable).
#include "core/cpu_features.hpp"
#include "host_kernels.hpp"

namespace lowbit {
namespace onebit {
namespace {

bool cpu_has(HostIsa isa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (isa == HostIsa::Avx512) return cpu_features().avx512;
  if (isa == HostIsa::Avx2) return cpu_features().avx2;
#endif
  return isa == HostIsa::Portable;
}

HostIsa& current_isa() {
  static HostIsa isa = [] {
    if (cpu_features().generic) return HostIsa::Portable;
    return cpu_has(HostIsa::Avx512) ? HostIsa::Avx512 : cpu_has(HostIsa::Avx2) ? HostIsa::Avx2 : HostIsa::Portable;
  }();
  return isa;
}

}  // namespace

HostIsa host_isa() { return current_isa(); }

bool host_set_isa(HostIsa isa) {
  if (!cpu_has(isa)) return false;
  current_isa() = isa;
  return true;
}

const char* host_isa_name(HostIsa isa) {
  return isa == HostIsa::Avx512 ? "avx512" : isa == HostIsa::Avx2 ? "avx2" : "portable";
}

}  // namespace onebit
}  // namespace lowbit
