// The moment codec on one thread, per format and moment: ns per element to
// encode (absmax, x / absmax, code search, pack) and to decode a tile-aligned
// buffer that stays in L2, at every instruction-set level this CPU runs
// (core/cpu_features.hpp: portable, avx2, avx512, neon), in the same run.
// Best of 30 repetitions of the thread's CPU time (robust to other work
// time-sliced onto the same core, not to a shared cache).
// Usage: bench_cpu_codec
#include <time.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/codec.hpp"
#include "core/cpu_features.hpp"
#include "core/quant.hpp"
#include "core/state.hpp"

using namespace lowbit;

namespace {

constexpr int64_t kElements = 64 * 1024;  // 256 KiB of fp32: L2-resident

double thread_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

template <class F>
double best_ns_per_element(F&& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < 30; ++r) {
    const double t0 = thread_seconds();
    for (int k = 0; k < 10; ++k) f();
    const double s = (thread_seconds() - t0) / 10;
    best = s < best ? s : best;
  }
  return best * 1e9 / double(kElements);
}

}  // namespace

int main() {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> m(kElements), v(kElements), out(kElements);
  for (int64_t i = 0; i < kElements; ++i) {
    m[size_t(i)] = normal(rng) * 1e-3f;
    const float g = normal(rng);
    v[size_t(i)] = g * g * 1e-6f;
  }
  std::vector<CpuIsa> levels;
  for (CpuIsa l : {CpuIsa::Portable, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Neon})
    if (cpu_isa_supported(l)) levels.push_back(l);
  const CpuIsa native = cpu_isa();
  std::printf("moment codec, 1 thread, %lld elements (L2), ns/element (thread CPU time), best of 30\n", (long long)kElements);
  std::printf("%-7s %-7s", "format", "moment");
  for (CpuIsa l : levels) std::printf(" %9s %-6s", "enc", cpu_isa_name(l));
  for (CpuIsa l : levels) std::printf(" %9s %-6s", "dec", cpu_isa_name(l));
  std::printf("\n");
  const lowbit_state_format_t formats[] = {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT, LOWBIT_STATE_FP8, LOWBIT_STATE_BF16,
                                           LOWBIT_STATE_4BIT_SR, LOWBIT_STATE_4BIT_DYN};
  for (lowbit_state_format_t f : formats)
    for (int moment = f == LOWBIT_STATE_4BIT_DYN; moment < 2; ++moment) {  // 4BIT_DYN: only v differs from 4BIT
      std::vector<uint8_t> data(size_t(moment_data_bytes(f, kElements)));
      std::vector<float> scales(size_t(std::max<int64_t>(1, num_blocks(f, kElements))));
      const MomentView mv = adam_moment_view(f, moment, data.data(), scales.data());
      const float* x = moment ? v.data() : m.data();
      std::vector<double> enc, dec;
      for (CpuIsa l : levels) {
        set_cpu_isa(l);
        if (f == LOWBIT_STATE_4BIT_SR)  // a step's tile-by-tile stochastic encoding
          enc.push_back(best_ns_per_element([&] {
            for (int64_t b = 0; b < kElements; b += kTile) encode_moment_tile_stochastic(mv, b, kTile, x + b, 0x1234567u);
          }));
        else
          enc.push_back(best_ns_per_element([&] { encode_moment(mv, kElements, x); }));
        dec.push_back(best_ns_per_element([&] { decode_moment(mv, kElements, out.data()); }));
      }
      std::printf("%-7s %-7s", format_name(f), moment ? "second" : "first");
      for (double t : enc) std::printf(" %16.3f", t);
      for (double t : dec) std::printf(" %16.3f", t);
      std::printf("\n");
    }
  set_cpu_isa(native);
  return 0;
}
