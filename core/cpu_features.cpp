#include "cpu_features.hpp"

#include <cstdlib>
#include <cstring>

namespace lowbit {

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures x;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    x.avx2 = __builtin_cpu_supports("avx2");
    x.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    x.avx512vbmi = x.avx512 && __builtin_cpu_supports("avx512vbmi");
#endif
    const char* env = std::getenv("LOWBIT_CPU_KERNELS");
    x.generic = env && std::strcmp(env, "generic") == 0;
    return x;
  }();
  return f;
}

}  // namespace lowbit
