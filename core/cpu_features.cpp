#include "cpu_features.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace lowbit {
namespace {

CpuFeatures probe() {
  CpuFeatures x;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  x.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") &&
           __builtin_cpu_supports("bmi") && __builtin_cpu_supports("f16c");
  x.avx512 = x.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512cd");
  x.avx512vbmi = x.avx512 && __builtin_cpu_supports("avx512vbmi");
  x.best = x.avx512 ? CpuIsa::Avx512 : x.avx2 ? CpuIsa::Avx2 : CpuIsa::Portable;
#elif defined(__aarch64__)
  x.neon = true;  // Advanced SIMD is part of the aarch64 baseline
  x.best = CpuIsa::Neon;
#endif
  return x;
}

struct Choice {
  CpuIsa isa;
  std::string note;
};

bool parse_level(const char* s, CpuIsa& out) {
  static const struct {
    const char* name;
    CpuIsa isa;
  } names[] = {{"portable", CpuIsa::Portable}, {"generic", CpuIsa::Portable}, {"avx2", CpuIsa::Avx2},
               {"avx512", CpuIsa::Avx512},     {"neon", CpuIsa::Neon}};
  for (const auto& n : names)
    if (std::strcmp(s, n.name) == 0) return out = n.isa, true;
  return false;
}

Choice choose(const CpuFeatures& f) {
  Choice c{f.best, ""};
  const char* env = std::getenv("LOWBIT_CPU_KERNELS");
  if (!env || !*env) return c;
  CpuIsa wanted;
  if (!parse_level(env, wanted)) {
    c.note = std::string("LOWBIT_CPU_KERNELS=") + env +
             " is not a level (portable, avx2, avx512, neon): running " + cpu_isa_name(f.best);
  } else if (!cpu_isa_supported(wanted)) {
    c.note = std::string("LOWBIT_CPU_KERNELS=") + env + ": this CPU or build cannot run " + cpu_isa_name(wanted) +
             ": running " + cpu_isa_name(f.best);
  } else {
    c.isa = wanted;
  }
  if (!c.note.empty()) std::fprintf(stderr, "lowbit: %s\n", c.note.c_str());
  return c;
}

const Choice& initial() {
  static const Choice c = choose(cpu_features());
  return c;
}

std::atomic<int>& current() {
  static std::atomic<int> isa{int(initial().isa)};
  return isa;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = probe();
  return f;
}

bool cpu_isa_supported(CpuIsa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case CpuIsa::Portable: return true;
    case CpuIsa::Avx2: return f.avx2;
    case CpuIsa::Avx512: return f.avx512;
    case CpuIsa::Neon: return f.neon;
  }
  return false;
}

CpuIsa cpu_isa() { return CpuIsa(current().load(std::memory_order_relaxed)); }

bool set_cpu_isa(CpuIsa isa) {
  if (!cpu_isa_supported(isa)) return false;
  current().store(int(isa), std::memory_order_relaxed);
  return true;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Portable: return "portable";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Neon: return "neon";
  }
  return "unknown";
}

const char* cpu_kernels_note() { return initial().note.c_str(); }

const char* cpu_isas_available() {
  static const std::string names = [] {
    std::string s;
    for (int i = 0; i < kCpuIsaCount; ++i)
      if (cpu_isa_supported(CpuIsa(i))) s += (s.empty() ? "" : ",") + std::string(cpu_isa_name(CpuIsa(i)));
    return s;
  }();
  return names.c_str();
}

SimdCodec simd_codec() {
  switch (cpu_isa()) {
    case CpuIsa::Avx512: return cpu_features().avx512vbmi ? SimdCodec::Avx512 : SimdCodec::Avx2;
    case CpuIsa::Avx2: return SimdCodec::Avx2;
    case CpuIsa::Neon: return SimdCodec::Neon;
    case CpuIsa::Portable: break;
  }
  return SimdCodec::None;
}

const char* simd_codec_name(SimdCodec codec) {
  switch (codec) {
    case SimdCodec::None: return "portable";
    case SimdCodec::Avx2: return "AVX2";
    case SimdCodec::Avx512: return "AVX-512";
    case SimdCodec::Neon: return "NEON";
  }
  return "unknown";
}

}  // namespace lowbit
