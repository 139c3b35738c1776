// 4BIT_SR's stochastic codes (core/quant.hpp stochastic_code) against a
// float64 reference: the code is one of the two map values around x, the
// reference's choice except at a tie of u * (b - a) with x - a; the decoded
// value is unbiased; the block encoder uses the element's own bits, and a
// 4BIT_SR moment is laid out as 4BIT.
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
#include "core/qmaps.hpp"
#include "core/quant.hpp"
#include "core/rounding.hpp"
#include "core/state.hpp"
#include "../common/test_seed.h"

using namespace lowbit;

namespace {

std::mt19937_64 rng;  // seeded in main()

const QMap* maps[2] = {nullptr, nullptr};  // the 4-bit first and second moment maps

// The reference: lo = the largest index with values[lo] <= x (0 if none),
// hi = lo + 1 (lo at the top); hi iff values[hi] > values[lo] and
// u * (b - a) < x - a, in double (u has 24 bits and b - a is a float: the
// product is exact; x - a is exact for the x drawn here). `tie`: the two
// sides are within 2^-40 of each other (where float rounding may decide).
int lower_index(const QMap& map, double x) {
  int lo = 0;
  for (int k = 1; k < map.n; ++k)
    if (double(map.values[k]) <= x) lo = k;
  return lo;
}

int reference_code(const QMap& map, double x, uint32_t bits, bool* tie) {
  const int lo = lower_index(map, x);
  const int hi = lo + (lo < map.n - 1 ? 1 : 0);
  const double a = map.values[lo], gap = double(map.values[hi]) - a;
  const double u = double(bits >> 8) * 0x1p-24;
  *tie = gap > 0 && std::fabs(u * gap - (x - a)) < 0x1p-40;
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
      const float x = draw_x(rng, *map);
      const uint32_t bits = uint32_t(rng());
      bool tie = false;
      const int want = reference_code(*map, double(x), bits, &tie);
      const int got = stochastic_code(*map, x, bits);
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
    assert_true(ties < 100);
  }
  // Outside the map and NaN.
  const QMap& m = *maps[0];
  assert_int_equal(stochastic_code(m, -1.f, 0xFFFFFFFFu), 0);
  assert_int_equal(stochastic_code(m, 1.f, 0u), 15);
  assert_int_equal(stochastic_code(m, 2.f, 0u), 15);
  assert_int_equal(stochastic_code(m, std::nanf(""), 0u), 0);
  assert_int_equal(stochastic_code(*maps[1], 0.01f, 0u), 0);  // below the v map's 1/16: its smallest code
}

// Mean of the decoded value over n draws of the element bits (random_bits of
// one key, elements 0..n-1) against x: within 6 standard errors.
void test_codes_are_unbiased(void**) {
  const int n = 1 << 16;
  for (const QMap* map : maps)
    for (int t = 0; t < 60; ++t) {
      float x = t < 50 ? std::uniform_real_distribution<float>(map->values[0], 1.f)(rng) : map->values[t - 50];
      if (t == 55) x = 0.5f * (map->values[3] + map->values[4]);  // a midpoint: nearest codes would round it down
      const uint64_t key = rng();
      double sum = 0;
      for (int i = 0; i < n; ++i) sum += map->values[stochastic_code(*map, x, random_bits(key, uint64_t(i)))];
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
  const MomentView mv = moment_view(LOWBIT_STATE_4BIT_SR, 0, codes.data(), scales.data());
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
          const int want = stochastic_code(*mv.map, normalize(x[i], absmax), random_bits(key, uint64_t(base + i)));
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

void test_layout_is_4bit(void**) {
  for (int64_t numel : {1, 127, 128, 129, 1000, 4097}) {
    assert_int_equal(moment_data_bytes(LOWBIT_STATE_4BIT_SR, numel), moment_data_bytes(LOWBIT_STATE_4BIT, numel));
    assert_int_equal(moment_scale_bytes(LOWBIT_STATE_4BIT_SR, numel), moment_scale_bytes(LOWBIT_STATE_4BIT, numel));
  }
  assert_true(is_quantized(LOWBIT_STATE_4BIT_SR));
  assert_string_equal(format_name(LOWBIT_STATE_4BIT_SR), "4bit-sr");
  assert_false(moment_view(LOWBIT_STATE_4BIT, 0, nullptr, nullptr).stochastic);
}

}  // namespace

int main(void) {
  rng.seed(lowbit_test_seed("test_stochastic_codes"));
  maps[0] = moment_map(LOWBIT_STATE_4BIT, 0);
  maps[1] = moment_map(LOWBIT_STATE_4BIT, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_code_is_the_float64_reference),
      cmocka_unit_test(test_codes_are_unbiased),
      cmocka_unit_test(test_block_encoder),
      cmocka_unit_test(test_layout_is_4bit),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
