// 4BIT_SR's stochastic codes (core/quant.hpp stochastic_code16) against a
// float64 reference: the code is one of the two decoded values around x, the
// reference's choice except at a tie of u * (b - a) with x - a; the decoded
// value is unbiased; the block encoder uses the element's own bits, and a
// 4BIT_SR moment is laid out as 4BIT.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
}

#include "core/codec.hpp"
#include "core/cpu_features.hpp"
#include "core/qmaps.hpp"
#include "core/quant.hpp"
#include "core/rounding.hpp"
#include "core/state.hpp"
#include "../common/test_seed.h"

using namespace lowbit;

namespace {

std::mt19937_64 rng;  // seeded in main()

// The code of x in a block with this absmax (the library's form).
int code_in_block(const QMap& map, float absmax, float x, uint32_t bits) {
  float decoded[16];
  decoded_values16(map, absmax, decoded);
  return stochastic_code16(decoded, x, bits);
}
int stochastic_code(const QMap& map, float x, uint32_t bits) { return code_in_block(map, 1.f, x, bits); }

const QMap* maps[2] = {nullptr, nullptr};  // the 4-bit first and second moment maps

// The reference: lo = the largest index with values[lo] <= x (0 if none),
// hi = lo + 1 (lo at the top); hi iff values[hi] > values[lo] and
// u * (b - a) < x - a, in double (u has 24 bits and b - a is a float: the
// product is exact; x - a is exact for the x drawn here). `tie`: the two
// sides are within the float rounding of either (2^-22 of their sum), where
// the library's float compare may decide either way.
int lower_index(const QMap& map, double x, float absmax = 1.f) {
  int lo = 0;
  for (int k = 1; k < map.n; ++k)
    if (double(map.values[k] * absmax) <= x) lo = k;
  return lo;
}

// The decoded values are map.values[k] * absmax in float (as decoding computes them).
int reference_code(const QMap& map, double x, uint32_t bits, bool* tie, float absmax = 1.f) {
  const int lo = lower_index(map, x, absmax);
  const int hi = lo + (lo < map.n - 1 ? 1 : 0);
  const double a = map.values[lo] * absmax, gap = double(map.values[hi] * absmax) - a;
  const double u = double(bits >> 8) * 0x1p-24;
  *tie = gap > 0 && std::fabs(u * gap - (x - a)) <= 0x1p-22 * (u * gap + std::fabs(x - a));
  return gap > 0 && u * gap < x - a ? hi : lo;
}

float draw_x(std::mt19937_64& g, const QMap& map) {
  std::uniform_int_distribution<int> kind(0, 4), code(0, map.n - 1);
  std::uniform_real_distribution<float> u(-1.1f, 1.1f);
  switch (kind(g)) {
    case 0: return map.values[code(g)];                                           // exactly a code
    case 1: return std::nextafter(map.values[code(g)], 2.f);                      // just above one
    case 2: return std::ldexp(u(g), -int(g() % 40));                              // tiny
    default: return u(g);
  }
}

void test_code_is_the_float64_reference(void**) {
  for (const QMap* map : maps) {
    long ties = 0, checked = 0;
    for (int i = 0; i < 400000; ++i) {
      // half of the draws in a block of absmax 1, half of a random absmax
      const float absmax = i & 1 ? std::ldexp(1.f + float(rng() % 1000) / 1000.f, int(rng() % 60) - 30) : 1.f;
      const float x = draw_x(rng, *map) * absmax;
      const uint32_t bits = uint32_t(rng());
      bool tie = false;
      const int want = reference_code(*map, double(x), bits, &tie, absmax);
      const int got = code_in_block(*map, absmax, x, bits);
      assert_true(got >= 0 && got < map->n);
      if (tie) {
        ++ties;
        continue;
      }
      ++checked;
      if (got != want)
        fail_msg("x = %a, bits %08x: code %d, the float64 reference %d", double(x), bits, got, want);
    }
    std::printf("  map of %s: %ld codes equal to the reference, %ld ties skipped\n",
                map == maps[0] ? "m" : "v", checked, ties);
    assert_true(ties < 400);  // 0.1% of the draws
  }
  // Outside the map and NaN.
  const QMap& m = *maps[0];
  assert_int_equal(stochastic_code(m, -1.f, 0xFFFFFFFFu), 0);
  assert_int_equal(stochastic_code(m, 1.f, 0u), 15);
  assert_int_equal(stochastic_code(m, 2.f, 0u), 15);
  assert_int_equal(stochastic_code(m, std::nanf(""), 0u), 0);
  assert_int_equal(stochastic_code(*maps[1], 0.01f, 0u), 0);  // below the v map's 1/16: its smallest code
}

// Mean of the decoded value over n draws of the element bits (state_bits of
// one key, elements 0..n-1) against x: within 6 standard errors.
void test_codes_are_unbiased(void**) {
  const int n = 1 << 16;
  for (const QMap* map : maps)
    for (int t = 0; t < 60; ++t) {
      float x = t < 50 ? std::uniform_real_distribution<float>(map->values[0], 1.f)(rng) : map->values[t - 50];
      if (t == 55) x = 0.5f * (map->values[3] + map->values[4]);  // a midpoint: nearest codes would round it down
      const uint64_t key = rng();
      double sum = 0;
      for (int i = 0; i < n; ++i) sum += map->values[stochastic_code(*map, x, state_bits(key, uint64_t(i)))];
      const double mean = sum / n;
      const int lo = lower_index(*map, double(x));
      const double a = map->values[lo], b = lo + 1 < map->n ? map->values[lo + 1] : a;
      const double p = b > a ? (double(x) - a) / (b - a) : 0;
      const double se = (b - a) * std::sqrt(p * (1 - p) / n);
      if (std::fabs(mean - x) > 6 * se + 1e-7)
        fail_msg("x = %.9g: mean of %d stochastic codes %.9g (standard error %.3g)", double(x), n, mean, se);
    }
}

// The block encoder: each element's code is stochastic_code of x / absmax
// with the bits of its index in the tensor; the scale is absmax; an odd
// tail's last high nibble is 0; and over many keys the decoded block is x.
void test_block_encoder(void**) {
  const int n = 250;  // one full block and a partial one with an odd tail
  const int64_t base = 256 * 7;
  std::vector<float> x(n);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float& v : x) v = normal(rng) * std::exp(normal(rng));
  std::vector<uint8_t> codes(base / 2 + n / 2 + 1);
  std::vector<float> scales(base / kBlock4 + 2), sum(n, 0.f), out(n);
  std::vector<double> mean(n, 0.0);
  const MomentView mv = adam_moment_view(LOWBIT_STATE_4BIT_SR, 0, codes.data(), scales.data());
  assert_int_equal(mv.format, LOWBIT_STATE_4BIT);
  assert_true(mv.stochastic);
  const int keys = 4000;
  for (int k = 0; k < keys; ++k) {
    const uint64_t key = state_rounding_key(rounding_key(7, 3, uint64_t(k + 1)), 0);
    encode_moment_tile_stochastic(mv, base, n, x.data(), key);
    if (k == 0) {
      for (int b = 0; b < n; b += kBlock4) {
        float absmax = 0.f;
        for (int i = b; i < n && i < b + kBlock4; ++i) absmax = std::fmax(absmax, std::fabs(x[i]));
        assert_true(scales[(base + b) / kBlock4] == absmax);
        for (int i = b; i < n && i < b + kBlock4; ++i) {
          const int want = code_in_block(*mv.map, absmax, x[i], state_bits(key, uint64_t(base + i)));
          const int got = (codes[(base + i) / 2] >> (4 * (i & 1))) & 0xF;
          if (got != want) fail_msg("element %d: code %d, stochastic_code %d", i, got, want);
        }
      }
      assert_int_equal(codes[(base + n) / 2] >> 4, 0);
    }
    decode_moment_tile(mv, base, n, out.data());
    for (int i = 0; i < n; ++i) mean[i] += out[i];
  }
  for (int i = 0; i < n; ++i) {
    const float absmax = scales[(base + (i / kBlock4) * kBlock4) / kBlock4];
    const double err = std::fabs(mean[i] / keys - x[i]);
    // The largest gap of the map is 0.225 * absmax: the standard error is at most 0.1125 absmax / sqrt(keys).
    if (err > 6 * 0.1125 * absmax / std::sqrt(double(keys)) + 1e-6 * absmax &&
        x[i] > -0.8875f * absmax)  // below the map's smallest value the code is the smallest: not unbiased
      fail_msg("element %d: x = %g, mean decoded %g over %d keys", i, double(x[i]), mean[i] / keys, keys);
  }
}

// Whole tiles take the SIMD form of every level the CPU runs (AVX2, AVX-512,
// NEON: core/cpu_features.hpp): the same bytes and scales as the portable rule, for ordinary blocks and for blocks with zeros
// only, a NaN, an Inf, denormal magnitudes, a negative extreme, negative
// values under the unsigned map, elements exactly on decoded values or one
// ulp either side of them, and element indices on both sides of a multiple
// of 2^32.
void check_simd_tiles(CpuIsa level) {
  std::normal_distribution<float> normal(0.f, 1.f);
  constexpr int kCases = 9;
  for (int moment = 0; moment < 2; ++moment)
    for (int t = 0; t < 30 * kCases; ++t) {
      std::vector<float> x(kTile);
      for (float& v : x) v = normal(rng) * std::exp(3.f * normal(rng));
      if (moment == 1)
        for (float& v : x) v = std::fabs(v);
      switch (t % kCases) {
        case 1: std::fill(x.begin(), x.begin() + kBlock4, 0.f); break;
        case 2: x[5] = std::nanf(""); break;
        case 3: x[200] = -INFINITY; break;
        case 4: for (float& v : x) v *= 1e-41f; break;
        case 5: x[17] = moment == 0 ? -1e4f : 1e4f; break;
        case 6:
          for (int i = 0; i < kTile; i += 3) x[size_t(i)] = -x[size_t(i)];
          break;
        case 7:
        case 8: {
          const QMap& map = *adam_moment_view(LOWBIT_STATE_4BIT_SR, moment, nullptr, nullptr).map;
          for (int b = 0; b < kTile; b += kBlock4) {
            float absmax = 0.f;
            for (int i = b; i < b + kBlock4; ++i) absmax = std::max(absmax, std::fabs(x[size_t(i)]));
            float decoded[16];
            decoded_values16(map, absmax, decoded);
            for (int i = b; i < b + kBlock4; i += 2) {
              float v = decoded[rng() % 16];
              if (t % kCases == 8 && std::fabs(v) < absmax)  // the block's absmax stays its largest |x|
                v = std::nextafter(v, rng() % 2 ? INFINITY : -INFINITY);
              x[size_t(i)] = v;
            }
          }
          break;
        }
        default: break;
      }
      // a tile near a multiple of 2^32 every fourth time: the views point
      // `base` elements before small buffers, so only the tile is touched
      const int64_t base = t % 4 == 3 ? (int64_t(1 + t % 3) << 32) + kTile * (int64_t(rng() % 5) - 2)
                                      : kTile * int64_t(rng() % 1000);
      std::vector<uint8_t> a(kTile / 2), b(kTile / 2);
      std::vector<float> sa(2), sb(2);
      const uint64_t key = rng();
      const auto view = [&](std::vector<uint8_t>& codes, std::vector<float>& scales) {
        return adam_moment_view(LOWBIT_STATE_4BIT_SR, moment, codes.data() - base / 2, scales.data() - base / kBlock4);
      };
      set_cpu_isa(CpuIsa::Portable);
      encode_moment_tile_stochastic(view(a, sa), base, kTile, x.data(), key);
      set_cpu_isa(level);
      encode_moment_tile_stochastic(view(b, sb), base, kTile, x.data(), key);
      for (int i = 0; i < kTile / 2; ++i)
        if (a[size_t(i)] != b[size_t(i)])
          fail_msg("moment %d case %d base %lld byte %d: portable %02x, %s %02x", moment, t % kCases,
                   (long long)base, i, a[size_t(i)], cpu_isa_name(level), b[size_t(i)]);
      assert_memory_equal(sa.data(), sb.data(), 2 * sizeof(float));
    }
}

void test_simd_tiles_equal_the_portable_rule(void**) {
  const CpuIsa native = cpu_isa();
  int levels = 0;
  for (CpuIsa level : {CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Neon}) {
    if (!cpu_isa_supported(level)) {
      std::printf("  this CPU cannot run the %s level: not compared\n", cpu_isa_name(level));
      continue;
    }
    check_simd_tiles(level);
    ++levels;
  }
  set_cpu_isa(native);
  std::printf("  %d SIMD level(s) compared with the portable rule\n", levels);
}

void test_layout_is_4bit(void**) {
  for (int64_t numel : {1, 127, 128, 129, 1000, 4097}) {
    assert_int_equal(moment_data_bytes(LOWBIT_STATE_4BIT_SR, numel), moment_data_bytes(LOWBIT_STATE_4BIT, numel));
    assert_int_equal(moment_scale_bytes(LOWBIT_STATE_4BIT_SR, numel), moment_scale_bytes(LOWBIT_STATE_4BIT, numel));
  }
  assert_true(is_quantized(LOWBIT_STATE_4BIT_SR));
  assert_string_equal(format_name(LOWBIT_STATE_4BIT_SR), "4bit-sr");
  assert_false(adam_moment_view(LOWBIT_STATE_4BIT, 0, nullptr, nullptr).stochastic);
}

// state_bits_run (the CUDA fast loops' 8 elements a lane) gives state_bits of
// each element, runs on both sides of a multiple of 2^32 included.
void test_state_bits_run(void**) {
  for (int t = 0; t < 20000; ++t) {
    const uint64_t key = rng();
    uint64_t first = (rng() >> (t % 3 == 0 ? 0 : 30)) & ~uint64_t(7);
    if (t % 5 == 1) first = (uint64_t(1 + t % 7) << 32) - 8 * (1 + t % 2);
    uint32_t bits[8];
    state_bits_run(key, first, bits);
    for (int j = 0; j < 8; ++j)
      if (bits[j] != state_bits(key, first + uint64_t(j)))
        fail_msg("first %llu j %d: state_bits_run %08x, state_bits %08x", (unsigned long long)first, j, bits[j],
                 state_bits(key, first + uint64_t(j)));
  }
}

}  // namespace

int main(void) {
  rng.seed(lowbit_test_seed("test_stochastic_codes"));
  maps[0] = adam_moment_map(LOWBIT_STATE_4BIT, 0);
  maps[1] = adam_moment_map(LOWBIT_STATE_4BIT, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_code_is_the_float64_reference),
      cmocka_unit_test(test_codes_are_unbiased),
      cmocka_unit_test(test_block_encoder),
      cmocka_unit_test(test_simd_tiles_equal_the_portable_rule),
      cmocka_unit_test(test_state_bits_run),
      cmocka_unit_test(test_layout_is_4bit),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
