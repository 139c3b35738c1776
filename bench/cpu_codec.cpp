// The moment codec on one thread, per format and moment: ns per element to
// encode (absmax, x / absmax, code search, pack) and to decode a tile-aligned
// buffer that stays in L2, for the portable path and the AVX-512 one
// (core/codec_avx512.hpp) in the same run. Best of 30 repetitions (the least
// disturbed by other work on the machine). Usage: bench_cpu_codec
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/codec.hpp"
#include "core/codec_avx512.hpp"
#include "core/quant.hpp"
#include "core/state.hpp"

using namespace lowbit;

namespace {

constexpr int64_t kElements = 64 * 1024;  // 256 KiB of fp32: L2-resident

template <class F>
double best_ns_per_element(F&& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < 30; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < 10; ++k) f();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 10;
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
  const bool simd = avx512_codec_supported();
  std::printf("moment codec, 1 thread, %lld elements (L2), ns/element, best of 30; AVX-512 codec %s\n",
              (long long)kElements, simd ? "available" : "not available on this CPU (or LOWBIT_CPU_KERNELS=generic)");
  std::printf("%-6s %-7s %12s %12s %12s %12s\n", "format", "moment", "enc portable", "enc avx512", "dec portable", "dec avx512");
  const lowbit_state_format_t formats[] = {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT, LOWBIT_STATE_FP8, LOWBIT_STATE_BF16};
  for (lowbit_state_format_t f : formats)
    for (int moment = 0; moment < 2; ++moment) {
      std::vector<uint8_t> data(size_t(moment_data_bytes(f, kElements)));
      std::vector<float> scales(size_t(std::max<int64_t>(1, num_blocks(f, kElements))));
      const MomentView mv = moment_view(f, moment, data.data(), scales.data());
      const float* x = moment ? v.data() : m.data();
      double t[4] = {NAN, NAN, NAN, NAN};
      for (int path = 0; path < (simd ? 2 : 1); ++path) {
        use_portable_codec(path == 0);
        t[path] = best_ns_per_element([&] { encode_moment(mv, kElements, x); });
        t[2 + path] = best_ns_per_element([&] { decode_moment(mv, kElements, out.data()); });
      }
      use_portable_codec(false);
      std::printf("%-6s %-7s %12.3f %12.3f %12.3f %12.3f\n", format_name(f), moment ? "second" : "first", t[0], t[1], t[2], t[3]);
    }
  // 4BIT_SR: a step's tile-by-tile stochastic encoding (decoding is 4BIT's)
  for (int moment = 0; moment < 2; ++moment) {
    std::vector<uint8_t> data(size_t(moment_data_bytes(LOWBIT_STATE_4BIT_SR, kElements)));
    std::vector<float> scales(size_t(num_blocks(LOWBIT_STATE_4BIT_SR, kElements)));
    const MomentView mv = moment_view(LOWBIT_STATE_4BIT_SR, moment, data.data(), scales.data());
    const float* x = moment ? v.data() : m.data();
    double t[2] = {NAN, NAN};
    for (int path = 0; path < (simd ? 2 : 1); ++path) {
      use_portable_codec(path == 0);
      t[path] = best_ns_per_element([&] {
        for (int64_t b = 0; b < kElements; b += kTile) encode_moment_tile_stochastic(mv, b, kTile, x + b, 0x1234567u);
      });
    }
    use_portable_codec(false);
    std::printf("%-6s %-7s %12.3f %12.3f\n", "4b-sr", moment ? "second" : "first", t[0], t[1]);
  }
  return 0;
}
