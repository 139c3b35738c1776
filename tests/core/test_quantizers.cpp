// The quantizers against brute force: maps vs the golden file, nearest-code
// search vs an exhaustive search in double (ties, zeros, denormals, huge and
// tiny scales), block encoding (absmax, codes, 4-bit packing), e4m3 and the
// 16-bit conversions vs exhaustive nearest-value searches; the exact shortcuts
// of the GPU paths (the reciprocal division, Lion's lr * sign) vs their definitions.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
}

#include "core/codec.hpp"
#include "core/float16.hpp"
#include "core/qmaps.hpp"
#include "core/quant.hpp"
#include "core/update_rules.hpp"
#include "qmaps_golden.h"
#include "../common/test_seed.h"

using namespace lowbit;

namespace {

std::mt19937_64 rng;  // seeded in main()

float from_bits(uint32_t u) { return bits_float(u); }

// Index of the map value nearest to x; exact ties go to the lower index.
int brute_nearest(const QMap& map, float x) {
  int best = 0;
  double best_d = std::fabs(double(x) - double(map.values[0]));
  for (int k = 1; k < map.n; ++k) {
    double d = std::fabs(double(x) - double(map.values[k]));
    if (d < best_d) best = k, best_d = d;
  }
  return best;
}

void check_map(MapId id, const uint32_t* golden, int n) {
  const QMap& map = qmap(id);
  assert_int_equal(map.n, n);
  for (int i = 0; i < n; ++i) assert_int_equal(float_bits(map.values[i]), golden[i]);
}

void test_maps_match_golden(void**) {
  check_map(MapId::SignedDynamic8, golden_signed_dynamic_8bit, 256);
  check_map(MapId::UnsignedDynamic8, golden_unsigned_dynamic_8bit, 256);
  check_map(MapId::SignedDynamic4, golden_signed_dynamic_4bit, 16);
  check_map(MapId::UnsignedLinear4, golden_unsigned_linear_nozero_4bit, 16);
  check_map(MapId::UnsignedDynamic4, golden_unsigned_dynamic_4bit, 16);
}

std::vector<float> interesting_inputs(const QMap& map) {
  std::vector<float> xs = {0.f, -0.f, 1.f, -1.f, 1e-38f, -1e-38f, 1e-45f, -1e-45f, 2.f, -2.f};  // inputs are x / absmax, so |x| <= 1 in use
  for (int k = 0; k < map.n; ++k) {
    float v = map.values[k];
    xs.insert(xs.end(), {v, std::nextafter(v, 2.f), std::nextafter(v, -2.f)});
    if (k + 1 < map.n) {
      // Exact float midpoints (when representable) are ties; their neighbours are not.
      double mid = (double(map.values[k]) + double(map.values[k + 1])) / 2;
      float f = float(mid);
      xs.insert(xs.end(), {f, std::nextafter(f, 2.f), std::nextafter(f, -2.f)});
    }
  }
  std::uniform_real_distribution<float> u(-1.05f, 1.05f);
  std::normal_distribution<float> nd(0.f, 0.01f);
  for (int i = 0; i < 20000; ++i) xs.push_back(u(rng));
  for (int i = 0; i < 20000; ++i) xs.push_back(nd(rng));
  return xs;
}

void test_nearest_code_is_brute_force(void**) {
  for (int id = 0; id < kNumMaps; ++id) {
    const QMap& map = qmap(MapId(id));
    int ties = 0;
    for (float x : interesting_inputs(map)) {
      int got = nearest_code(map, x), want = brute_nearest(map, x), fast = bucket_code(map, x);
      if (got != want) fail_msg("map %d: x = %.9g -> code %d, brute force %d", id, double(x), got, want);
      if (fast != want) fail_msg("map %d: x = %.9g -> bucket code %d, brute force %d", id, double(x), fast, want);
      if (bucket_code_finite(map, x) != want) fail_msg("map %d: x = %.9g: bucket_code_finite", id, double(x));
      if (map.values[0] >= 0.f && bucket_code_unsigned(map, x) != want)
        fail_msg("map %d: x = %.9g: bucket_code_unsigned", id, double(x));
      if (map.linear16 && std::fabs(x) <= 1.f && linear16_code(x) != want)
        fail_msg("map %d: x = %.9g: linear16_code", id, double(x));
      if (got + 1 < map.n &&
          std::fabs(double(x) - map.values[got]) == std::fabs(double(x) - map.values[got + 1]))
        ++ties;
    }
    assert_true(ties > 0);  // the tie rule was exercised
  }
}

// Random blocks at scales from 1e-30 to 1e30, with zeros and denormals.
std::vector<float> random_block(int n, int kind) {
  std::vector<float> x(static_cast<size_t>(n), 0.f);
  if (kind == 0) return x;  // all zero
  std::normal_distribution<float> nd(0.f, 1.f);
  float scale = std::pow(10.f, float(int(rng() % 61) - 30));
  for (float& v : x) v = nd(rng) * scale;
  if (kind == 2)
    for (size_t i = 0; i < x.size(); i += 3) x[i] = 0.f;
  if (kind == 3)
    for (float& v : x) v = from_bits(uint32_t(rng() % 0x007FFFFFu)) * (rng() & 1 ? 1.f : -1.f);  // denormals
  return x;
}

// The bucket search equals the binary search on every float of each bucket's
// edges and on random bit patterns (NaN included).
void test_bucket_search_everywhere(void**) {
  std::uniform_int_distribution<uint32_t> bits;
  for (int id = 0; id < kNumMaps; ++id) {
    const QMap& map = qmap(MapId(id));
    for (int i = 0; i < 2000000; ++i) {
      float x = from_bits(bits(rng));
      if (std::isnan(x)) {
        assert_int_equal(bucket_code(map, x), 0);
        continue;
      }
      const int want = nearest_code(map, x);
      if (bucket_code(map, x) != want) fail_msg("map %d x %.9g", id, double(x));
      if (bucket_code_finite(map, x) != want) fail_msg("map %d x %.9g: bucket_code_finite", id, double(x));
      if (map.values[0] >= 0.f && bucket_code_unsigned(map, x) != want)
        fail_msg("map %d x %.9g: bucket_code_unsigned", id, double(x));
      if (map.linear16 && std::fabs(x) <= 1.f && linear16_code(x) != want)
        fail_msg("map %d x %.9g: linear16_code", id, double(x));
    }
    if (map.linear16) assert_int_equal(linear16_code(NAN), 0);
    for (int b = 0; b < kQBuckets; ++b)
      for (int d = -2; d <= 2; ++d) {
        uint32_t edge = uint32_t(b + (kQMinExp << kQMantBits)) << (23 - kQMantBits);
        for (uint32_t sign : {0u, 0x80000000u}) {
          float x = from_bits((edge + uint32_t(d)) | sign);
          if (std::isnan(x)) continue;
          if (bucket_code(map, x) != nearest_code(map, x)) fail_msg("map %d edge x %.9g", id, double(x));
          if (bucket_code_finite(map, x) != nearest_code(map, x))
            fail_msg("map %d edge x %.9g: bucket_code_finite", id, double(x));
          if (map.values[0] >= 0.f && bucket_code_unsigned(map, x) != nearest_code(map, x))
            fail_msg("map %d edge x %.9g: bucket_code_unsigned", id, double(x));
        }
      }
  }
}

// floor_positive_fast (the map's zero_code) is floor_positive, for every code
// and sign; zero_code is the index of the value 0.
void test_floor_positive_fast(void**) {
  for (int id = 0; id < kNumMaps; ++id) {
    const QMap& map = qmap(MapId(id));
    int zeros = 0;
    for (int c = 0; c < map.n; ++c) {
      zeros += map.values[c] == 0.f;
      if (map.values[c] == 0.f) assert_int_equal(map.zero_code, c);
      for (float x : {-1.f, -0.f, 0.f, 1e-30f, 0.5f})
        assert_int_equal(floor_positive_fast(map, c, x), floor_positive(map, c, x));
    }
    if (zeros == 0) assert_int_equal(map.zero_code, -1);
    assert_int_equal(map.linear16, MapId(id) == MapId::UnsignedLinear4);
    if (map.linear16) assert_int_equal(map.zero_code, -1);  // the CUDA fast loops skip its floor (floors())
    assert_true(std::isinf(map.midpoints[256]));  // bucket_code_finite reads one past the last code
  }
}

// divide(block_divisor(d), x) is the IEEE quotient x / d wherever
// divides_exactly() says so (random d over the whole range it accepts, x
// random below d and at the edges of the accepted range), gives the code of
// -0 for x = -0, and the range check refuses what it must.
void test_block_divisor_is_ieee(void**) {
  std::uniform_int_distribution<uint32_t> mant(0, 0x7FFFFFu);
  long exact = 0, refused = 0;
  for (int i = 0; i < 400000; ++i) {
    const int de = int(rng() % 128) - 100;  // d in [2^-100, 2^28)
    const float d = std::ldexp(1.f + float(mant(rng)) * 0x1p-23f, de);
    const BlockDivisor b = block_divisor(d);
    assert_true(b.ok == (d <= 0x1p27f));
    if (!b.ok) {
      ++refused;
      continue;
    }
    for (int k = 0; k < 8; ++k) {
      float x;
      switch (k) {
        case 0: x = d; break;
        case 1: x = -std::nextafter(d, 0.f); break;
        case 2: x = b.lo; break;
        case 3: x = -std::nextafter(b.lo, 1.f); break;
        case 4: x = std::nextafter(b.lo, 0.f); break;  // below the range: refused unless 0
        default: {  // |x| <= d, exponents down to 2^-126 below d
          const float m = 1.f + float(mant(rng)) * 0x1p-23f;
          x = std::fmin(d, std::ldexp(m, de - int(rng() % 127))) * (rng() & 1 ? 1.f : -1.f);
        }
      }
      if (!divides_exactly(b, x)) {
        assert_true(std::fabs(x) < b.lo && x != 0.f);
        ++refused;
        continue;
      }
      const float want = x / d, got = divide(b, x);
      if (x == 0.f ? got != 0.f : float_bits(want) != float_bits(got))  // -0: +0 (checked below)
        fail_msg("x %a / d %a: IEEE %a, reciprocal form %a", double(x), double(d), double(want), double(got));
      ++exact;
    }
  }
  for (float d : {0x1p-101f, 0x1.fffffep27f, INFINITY, NAN, -1.f}) assert_false(block_divisor(d).ok);
  const BlockDivisor zero = block_divisor(0.f);  // an all-zero block
  assert_true(zero.ok && divides_exactly(zero, 0.f) && divides_exactly(zero, -0.f));
  assert_int_equal(float_bits(divide(zero, 0.f)), float_bits(normalize(0.f, 0.f)));
  assert_int_equal(float_bits(divide(zero, -0.f)), float_bits(normalize(-0.f, 0.f)));
  const BlockDivisor one = block_divisor(1.f);
  assert_true(divides_exactly(one, -0.f) && divides_exactly(one, 0.f));
  assert_int_equal(float_bits(divide(one, 0.f)), 0u);
  for (int id = 0; id < kNumMaps; ++id)  // +0 for -0: the same code
    assert_int_equal(bucket_code(qmap(MapId(id)), divide(one, -0.f)), bucket_code(qmap(MapId(id)), -0.f));
  print_message("block divisor: %ld quotients exact, %ld refused\n", exact, refused);
  assert_true(exact > 2000000);
}

void test_block_encoding_is_brute_force(void**) {
  const lowbit_state_format_t formats[] = {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT};
  for (lowbit_state_format_t format : formats)
    for (int moment = 0; moment < 2; ++moment)
      for (int n : {1, 7, 128, 129, 255, 256, 257, 1000, 4097}) {
        const QMap& map = *adam_moment_map(format, moment);
        int block = int(block_size(format));
        for (int kind = 0; kind < 4; ++kind) {
          std::vector<float> x = random_block(n, kind);
          if (moment == 1)
            for (float& v : x) v = std::fabs(v);
          std::vector<uint8_t> data(size_t(moment_data_bytes(format, n)), 0xAB);
          std::vector<float> scales(size_t(num_blocks(format, n)), -1.f);
          MomentView mv = adam_moment_view(format, moment, data.data(), scales.data());
          encode_moment(mv, n, x.data());
          for (int b = 0; b * block < n; ++b) {
            float absmax = 0.f;
            for (int i = b * block; i < n && i < (b + 1) * block; ++i) absmax = std::fmax(absmax, std::fabs(x[i]));
            assert_int_equal(float_bits(scales[size_t(b)]), float_bits(absmax));
            for (int i = b * block; i < n && i < (b + 1) * block; ++i) {
              int code = format == LOWBIT_STATE_8BIT ? data[size_t(i)] : (data[size_t(i / 2)] >> (4 * (i & 1))) & 0xF;
              float xn = absmax > 0.f ? x[i] / absmax : 0.f;
              int want = brute_nearest(map, xn);
              if (moment == 1 && map.values[want] == 0.f && xn > 0.f) ++want;  // second moments: no positive -> 0
              if (code != want) fail_msg("format %d moment %d n %d i %d: code %d, brute force %d", format, moment, n, i, code, want);
            }
          }
          if (format == LOWBIT_STATE_4BIT && n % 2) assert_int_equal(data.back() >> 4, 0);  // unused high nibble
          std::vector<float> back(static_cast<size_t>(n));
          decode_moment(mv, n, back.data());
          if (kind == 0)
            for (float v : back) assert_true(v == 0.f);  // all-zero blocks survive exactly
          if (kind == 2 && moment == 0)
            for (int i = 0; i < n; i += 3) assert_true(back[size_t(i)] == 0.f);  // exact zeros survive (signed maps hold 0)
        }
      }
}

// With skip_nonfinite = 0 a NaN reaches the state: its block's scale becomes
// NaN and the whole block decodes as NaN (it propagates, as in fp32 state),
// rather than the block silently turning into zeros.
void test_nan_poisons_its_block(void**) {
  for (lowbit_state_format_t format : {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT, LOWBIT_STATE_FP8})
    for (int moment = 0; moment < 2; ++moment) {
      const int n = 600;
      std::vector<float> x(n, 0.5f), back(n);
      x[300] = NAN;
      std::vector<uint8_t> data(size_t(moment_data_bytes(format, n)));
      std::vector<float> scales(size_t(num_blocks(format, n)));
      MomentView mv = adam_moment_view(format, moment, data.data(), scales.data());
      encode_moment(mv, n, x.data());
      decode_moment(mv, n, back.data());
      int block = int(block_size(format));
      for (int i = 0; i < n; ++i) {
        bool poisoned = i / block == 300 / block;
        if (poisoned != bool(std::isnan(back[size_t(i)])))
          fail_msg("format %d moment %d element %d: %g", format, moment, i, double(back[size_t(i)]));
      }
    }
}

// Nearest e4m3 value by exhaustive search; ties to the even code; saturating.
uint8_t brute_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  double ax = std::fabs(double(x));
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c <= 0x7E; ++c) {
    double d = std::fabs(ax - double(e4m3_to_float(uint8_t(c))));
    if (d < best_d || (d == best_d && (c & 1) == 0)) best = c, best_d = d;
  }
  if (ax >= 448.0) best = 0x7E;
  return uint8_t(best | (std::signbit(x) ? 0x80 : 0));
}

void test_e4m3(void**) {
  // Decoding: every code against the e4m3 definition.
  for (int c = 0; c < 256; ++c) {
    int e = (c >> 3) & 0xF, m = c & 7;
    double want = e == 0 ? m * std::ldexp(1.0, -9) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
    if (c & 0x80) want = -want;
    if ((c & 0x7F) == 0x7F) assert_true(std::isnan(e4m3_to_float(uint8_t(c))));
    else assert_true(double(e4m3_to_float(uint8_t(c))) == want);
  }
  std::vector<float> xs = {0.f, -0.f, 448.f, 449.f, 1e6f, -1e6f, 464.f, 1e-20f, 0.0009765625f, 0.00097656251f};
  for (int c = 0; c < 0x7F; ++c) {
    float v = e4m3_to_float(uint8_t(c)), w = e4m3_to_float(uint8_t(c + 1 < 0x7F ? c + 1 : c));
    float mid = (v + w) / 2;  // exact in float
    xs.insert(xs.end(), {v, -v, mid, -mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e9f)});
  }
  std::uniform_real_distribution<float> u(-500.f, 500.f);
  for (int i = 0; i < 50000; ++i) xs.push_back(u(rng) * std::pow(2.f, -float(rng() % 12)));
  for (float x : xs) {
    uint8_t got = float_to_e4m3(x), want = brute_e4m3(x);
    if (got != want && !(x == 0.f)) fail_msg("e4m3(%.9g) = 0x%02x, brute force 0x%02x", double(x), got, want);
  }
}

// Nearest 16-bit value by exhaustive search over the neighbours, ties to even.
template <class ToFloat>
uint16_t brute_16(float x, uint16_t guess, ToFloat to_float) {
  uint16_t best = guess;
  double best_d = INFINITY;
  for (int d = -2; d <= 2; ++d) {
    uint16_t c = uint16_t(guess + d);
    float v = to_float(c);
    if (std::isnan(v) || std::signbit(v) != std::signbit(x)) continue;
    double dist = std::fabs(double(x) - double(v));
    if (dist < best_d || (dist == best_d && (c & 1) == 0)) best = c, best_d = dist;
  }
  return best;
}

void test_16bit_rounding(void**) {
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    float x = from_bits(bits(rng));
    if (!std::isfinite(x)) continue;
    uint16_t b = float_to_bf16(x);
    if (std::isfinite(bf16_to_float(b)))
      assert_int_equal(b, brute_16(x, uint16_t(float_bits(x) >> 16), bf16_to_float));
    float y = x * 1e-30f * float(1 << (rng() % 24));  // bring into fp16 range
    if (std::fabs(y) < 65504.f) {
      uint16_t h = float_to_fp16(y);
      assert_int_equal(h, brute_16(y, h, fp16_to_float));
    }
  }
  assert_int_equal(float_to_fp16(65520.f), 0x7C00);  // rounds to Inf like IEEE
  assert_int_equal(float_to_fp16(65519.f), 0x7BFF);
}

// float -> fp16 case by case, as IEEE specifies it (the library's form is
// branch-free and rounds the subnormal range with a float add).
uint16_t fp16_by_cases(uint32_t x) {  // x: the bits of a non-negative float
  if (x > 0x7F800000u) return 0x7E00u;
  if (x >= 0x477FF000u) return 0x7C00u;  // 65520 and above, Inf
  if (x >= 0x38800000u) {                // normal: drop 13 bits, ties to even
    const uint32_t kept = x >> 13, rest = x & 0x1FFFu;
    const uint32_t r = kept + (rest > 0x1000u || (rest == 0x1000u && (kept & 1u)));
    return uint16_t(r - (112u << 10));
  }
  if (x < 0x33000000u) return 0;  // at most half the smallest subnormal's value: 0
  const uint32_t m = (x & 0x7FFFFFu) | 0x800000u, shift = 126u - (x >> 23);  // in units of 2^-24
  const uint32_t r = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  return uint16_t(r + (rest > half || (rest == half && (r & 1u))));
}

void test_fp16_every_float(void**) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {  // fp16 -> float: every code
    const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    const float mag = e == 0 ? std::ldexp(float(m), -24) : std::ldexp(float(1024u + m), int(e) - 25);
    const uint32_t want = e == 31 ? (0x7F800000u | (m << 13)) : float_bits(mag);
    if (float_bits(fp16_to_float(uint16_t(h))) != (want | (h & 0x8000u) << 16))
      fail_msg("fp16_to_float(0x%04x) = bits 0x%08x, want 0x%08x", unsigned(h), float_bits(fp16_to_float(uint16_t(h))),
               want | (h & 0x8000u) << 16);
  }
  for (uint64_t x = 0; x <= 0x7FFFFFFFu; ++x) {
    const uint16_t want = fp16_by_cases(uint32_t(x));
    const uint16_t pos = float_to_fp16(from_bits(uint32_t(x))), neg = float_to_fp16(from_bits(uint32_t(x) | 0x80000000u));
    if (pos != want || neg != (want | 0x8000u))
      fail_msg("float_to_fp16(bits 0x%08x) = 0x%04x (negative: 0x%04x), want 0x%04x", unsigned(x), pos, neg, want);
  }
}

}  // namespace

// Lion's lr * sign(c) by the sign bit (update_rules.hpp) against the product it
// replaces, bit for bit: every lr the library accepts (finite, >= 0) and c over
// zeros, denormals, infinities, NaNs and random bit patterns.
void test_lr_times_sign(void**) {
  const float lrs[] = {0.f, 1e-45f, 1e-38f, 1e-4f, 0.3f, 1.f, 3e38f};
  std::vector<float> cs = {0.f, -0.f, 1e-45f, -1e-45f, 1.f, -1.f, INFINITY, -INFINITY, NAN, -NAN};
  for (int i = 0; i < 1 << 20; ++i) cs.push_back(from_bits(uint32_t(rng())));
  for (float lr : lrs)
    for (float c : cs) {
      const float sign = c > 0.f ? 1.f : (c < 0.f ? -1.f : 0.f);
      if (float_bits(lr_times_sign(lr, c)) != float_bits(lr * sign))
        fail_msg("lr %a, c bits 0x%08x: %a, the product %a", lr, float_bits(c), lr_times_sign(lr, c), lr * sign);
    }
}

int main(void) {
  rng.seed(lowbit_test_seed("test_quantizers"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_maps_match_golden),
      cmocka_unit_test(test_nearest_code_is_brute_force),
      cmocka_unit_test(test_bucket_search_everywhere),
      cmocka_unit_test(test_floor_positive_fast),
      cmocka_unit_test(test_block_divisor_is_ieee),
      cmocka_unit_test(test_lr_times_sign),
      cmocka_unit_test(test_block_encoding_is_brute_force),
      cmocka_unit_test(test_nan_poisons_its_block),
      cmocka_unit_test(test_e4m3),
      cmocka_unit_test(test_16bit_rounding),
      cmocka_unit_test(test_fp16_every_float),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
