// The fast loops' 4BIT_SR encoder (cuda/step_kernel.cuh encode_store_sr,
// cuda/sr_codes.cuh), one warp under the host emulation, against the CPU
// engine's encoder of the same tile (core/codec.cpp
// encode_moment_tile_stochastic), bit for bit: codes and scales of both
// moments' maps on tiles the engine suites rarely draw: values exactly on a
// block's decoded values and one float either side of them, an all-zero
// block, a NaN or an Inf (stochastic_code16 itself), subnormal blocks and
// blocks at the fast search's smallest absmax, an outlier, mixed signs;
// element indices on both sides of a multiple of 2^32.
#include "emu.hpp"

#include "cuda/step_kernel.cuh"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "core/codec.hpp"
#include "core/state.hpp"
#include "../common/test_seed.h"

extern "C" {
#include <cmocka.h>
}

using namespace lowbit;

namespace {

std::mt19937_64 rng;  // seeded in main()

// One tile of a 4BIT_SR moment encoded by one emulated warp.
void encode_on_warp(const QMap& map, const std::vector<float>& x, int64_t base, uint64_t key, uint8_t* codes,
                    float* scales) {
  cuda::emu::launch(
      1, 32,
      [&] {
        const int lane = int(threadIdx.x & 31u);
        float v[8];
        for (int j = 0; j < 8; ++j) v[j] = x[size_t(lane * 8 + j)];
        const cuda::MomentRef mr{LOWBIT_STATE_4BIT, codes - base / 2, scales - base / kBlock4};
        cuda::encode_store_sr(mr, map, v, base + lane * 8, base, lane, 0, key);
      },
      nullptr);
}

// A tile of kind `kind` (0-9) for a moment (1: values >= 0).
std::vector<float> draw_tile(int kind, int moment, const QMap& map) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(kTile);
  const float scale = std::ldexp(1.f, int(rng() % 60) - 40);
  for (float& v : x) v = normal(rng) * scale * std::exp(normal(rng));
  switch (kind) {
    case 1: std::fill(x.begin(), x.begin() + kBlock4, 0.f); break;
    case 2: x[5] = std::nanf(""); break;
    case 3: x[200] = moment == 0 ? -INFINITY : INFINITY; break;
    case 4:
      for (float& v : x) v *= 1e-41f / scale;  // subnormal blocks
      break;
    case 5: x[17] = moment == 0 ? -1e4f * scale : 1e4f * scale; break;
    case 9: {
      // absmax at the fast search's bound (cuda/sr_codes.cuh kSrMinAbsmax) and one float below it
      for (int b = 0; b < kTile; b += kBlock4) {
        float absmax = 0.f;
        for (int i = b; i < b + kBlock4; ++i) absmax = std::max(absmax, std::fabs(x[size_t(i)]));
        const float target = b ? std::nextafter(cuda::kSrMinAbsmax, 0.f) : cuda::kSrMinAbsmax;
        for (int i = b; i < b + kBlock4; ++i) x[size_t(i)] = x[size_t(i)] / absmax * target;
        x[size_t(b + 3)] = target;
      }
      break;
    }
    case 6:
    case 7:
    case 8: {
      // on the decoded values of the block's absmax, or one float either side
      for (int b = 0; b < kTile; b += kBlock4) {
        float absmax = 0.f;
        for (int i = b; i < b + kBlock4; ++i) absmax = std::max(absmax, std::fabs(x[size_t(i)]));
        float decoded[16];
        decoded_values16(map, absmax, decoded);
        for (int i = b; i < b + kBlock4; ++i) {
          if (i % 2 == 0 && std::fabs(x[size_t(i)]) < absmax) {
            const float d = decoded[rng() % 16];
            x[size_t(i)] = kind == 6 ? d : std::nextafter(d, kind == 7 ? INFINITY : -INFINITY);
            if (std::fabs(x[size_t(i)]) > absmax) x[size_t(i)] = d;  // the block keeps its absmax
          }
        }
      }
      break;
    }
    default: break;
  }
  if (moment == 1)
    for (float& v : x) v = std::fabs(v);
  return x;
}

void test_fast_encoder_equals_the_cpu_engine(void**) {
  constexpr int kKinds = 10;
  long tiles = 0;
  for (int moment = 0; moment < 2; ++moment) {
    const MomentView probe = adam_moment_view(LOWBIT_STATE_4BIT_SR, moment, nullptr, nullptr);
    const QMap& map = *probe.map;
    // the fast encoder has no floor_positive: the second moment's map must have no zero to move off
    assert_true(!probe.second || floor_positive_code(map, true) == -1);
    for (int t = 0; t < 40 * kKinds; ++t) {
      const int kind = t % kKinds;
      const std::vector<float> x = draw_tile(kind, moment, map);
      // a tile near a multiple of 2^32 every third time: the pointers are
      // offset by `base`, so only the tile's bytes are touched
      const int64_t base = t % 3 == 2 ? (int64_t(1 + t % 5) << 32) + kTile * (int64_t(rng() % 5) - 2)
                                      : kTile * int64_t(rng() % 100000);
      const uint64_t key = rng();
      std::vector<uint8_t> a(kTile / 2), b(kTile / 2);
      std::vector<float> sa(2), sb(2);
      const MomentView cpu = adam_moment_view(LOWBIT_STATE_4BIT_SR, moment, a.data() - base / 2, sa.data() - base / kBlock4);
      encode_moment_tile_stochastic(cpu, base, kTile, x.data(), key);
      encode_on_warp(map, x, base, key, b.data(), sb.data());
      for (int i = 0; i < kTile / 2; ++i)
        if (a[size_t(i)] != b[size_t(i)])
          fail_msg("moment %d kind %d base %lld byte %d: CPU %02x, CUDA fast loop %02x", moment, kind,
                   (long long)base, i, a[size_t(i)], b[size_t(i)]);
      assert_memory_equal(sa.data(), sb.data(), 2 * sizeof(float));
      ++tiles;
    }
  }
  std::printf("  %ld tiles bit-identical\n", tiles);
}

// The fast search's exactness bound (cuda/sr_codes.cuh) holds for the 4-bit
// maps: their sorted values are at least 2^-8 apart.
void test_map_values_are_apart(void**) {
  for (int moment = 0; moment < 2; ++moment) {
    const QMap& map = *adam_moment_map(LOWBIT_STATE_4BIT_SR, moment);
    assert_int_equal(map.n, 16);
    for (int k = 0; k + 1 < map.n; ++k)
      if (!(map.values[k + 1] - map.values[k] >= 0x1p-8f))
        fail_msg("moment %d: values[%d] = %a and values[%d] = %a are closer than 2^-8", moment, k,
                 double(map.values[k]), k + 1, double(map.values[k + 1]));
  }
}

}  // namespace

int main(void) {
  rng.seed(lowbit_test_seed("test_sr_codes_emulated"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_map_values_are_apart),
      cmocka_unit_test(test_fast_encoder_equals_the_cpu_engine),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
