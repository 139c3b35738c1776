// Block quantization of optimizer moments, shared by the CPU engine and the
// CUDA kernels. A code is the nearest map value to x / absmax: the number of
// midpoints between adjacent codes that lie below x. The midpoints are
// rounded down to float so that `x > mid` in float is exactly `x > true
// midpoint`: ties go to the lower code.
#pragma once
#include <cstdint>

#include "float16.hpp"
#include "hd.hpp"

namespace lowbit {

constexpr int kBlock8 = 256;   // 8-bit and FP8 block
constexpr int kBlock4 = 128;   // 4-bit block
constexpr int kTile = 256;     // engine tile: a multiple of every block
constexpr float kFp8Max = 448.f;

// Bucket search: |x| picks a bucket from its exponent and top kQMantBits
// mantissa bits; per bucket and sign a table holds how many midpoints lie
// entirely below it, and at most kQMaxScan more fall inside one bucket, so a
// fixed scan of kQMaxScan compares finishes the count. qmaps.cpp builds the
// tables and checks that bound for every map.
constexpr int kQMantBits = 6;
constexpr int kQMinExp = 103;  // biased exponent of bucket 1's octave: |x| < 2^-24 all share bucket 0
constexpr int kQMaxExp = 127;  // [1, 2) is the last octave; anything larger clamps into the last bucket
constexpr int kQBuckets = (kQMaxExp - kQMinExp + 1) << kQMantBits;
constexpr int kQMaxScan = 2;

// One quantization map: n sorted values, the n-1 midpoints between them, and
// the bucket tables of the fast search.
struct QMap {
  int n;
  float values[256];
  float midpoints[256];  // n - 1 midpoints, then +Inf
  uint8_t below[2][kQBuckets];  // [0]: x >= 0 in bucket b: #{midpoints < lower edge of b}
                                // [1]: x <  0 in bucket b: #{midpoints <= -upper edge of b}
};

// Index of the nearest code for x (already divided by absmax): the number of
// midpoints strictly below x, by binary search. The reference definition.
LOWBIT_HD int nearest_code(const QMap& map, float x) {
  int pos = 0;
  for (int step = map.n >> 1; step >= 1; step >>= 1)
    if (x > map.midpoints[pos + step - 1]) pos += step;
  return pos;
}

LOWBIT_HD int q_bucket(uint32_t abs_bits) {
  int b = int(abs_bits >> (23 - kQMantBits)) - (kQMinExp << kQMantBits);
  return b < 0 ? 0 : (b >= kQBuckets ? kQBuckets - 1 : b);
}

// Same result as nearest_code() for every float (NaN -> 0), in two table
// lookups and kQMaxScan compares. `below` is map.below or a widened copy.
template <class Int>
LOWBIT_HD int bucket_code(const QMap& map, const Int (&below)[2][kQBuckets], float x) {
  uint32_t u = float_bits(x);
  uint32_t a = u & 0x7FFFFFFFu;
  int c = (&below[0][0])[int(u >> 31) * kQBuckets + q_bucket(a)];  // flat index: one gather
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < kQMaxScan; ++k) c += map.midpoints[c] < x;  // midpoints[n - 1] = +Inf stops the scan
  return c & -int(a <= 0x7F800000u);  // NaN: no midpoint is below it (branch-free for vectorisation)
}

LOWBIT_HD int bucket_code(const QMap& map, float x) { return bucket_code(map, map.below, x); }

// The code of x rounded stochastically (4BIT_SR), in the decoded domain:
// `decoded` holds the 16 values the codes of x's block decode to (the map's
// sorted values times the block's absmax, in float, as decoding computes
// them). Between the decoded values a <= x < b around x, b is taken with
// probability (x - a) / (b - a), so the decoded value is x in expectation:
// b when u * (b - a) < x - a in float, u the top 24 bits of `bits` (rounding.hpp
// state_bits) over 2^24. x below the smallest decoded value or at the largest
// takes that end's code (a block's negative extreme, below a signed map's
// smallest value, takes it as its nearest code does); NaN gives 0, as
// bucket_code. No division and, with selects only (no branch, no indexed
// load), CPU loops over it vectorise.
LOWBIT_HD int stochastic_code16(const float* decoded, float x, uint32_t bits) {
  int count = 0;  // decoded values <= x
  float a = decoded[0], b = decoded[15];
  for (int k = 0; k < 16; ++k) {
    const bool le = decoded[k] <= x;
    count += int(le);
    a = le ? decoded[k] : a;  // the largest decoded value <= x (sorted)
  }
  for (int k = 15; k >= 0; --k) b = decoded[k] > x ? decoded[k] : b;  // the smallest one > x
  const bool inside = (count > 0) & (count < 16);
  const int lo = count > 0 ? count - 1 : 0;
  const float u = float(bits >> 8) * 5.9604644775390625e-8f;  // 2^-24
  const int c = inside & (u * (b - a) < x - a) ? lo + 1 : lo;
  return c & -int((float_bits(x) & 0x7FFFFFFFu) <= 0x7F800000u);
}

// The 16 values a 4-bit block with this absmax decodes to.
LOWBIT_HD void decoded_values16(const QMap& map, float absmax, float (&out)[16]) {
  for (int k = 0; k < 16; ++k) out[k] = map.values[k] * absmax;
}

// Second moments never store a positive value as zero: it takes the next
// (smallest positive) code instead, so an Adam denominator cannot collapse to
// eps while the first moment of the same element is non-zero.
LOWBIT_HD int floor_positive(const QMap& map, int code, float x) {
  return code + int((map.values[code] == 0.f) & (x > 0.f));
}
// The code floor_positive() moves a positive value off, as an index a vector
// loop compares each code with (no table load per element): the map's code
// of 0 for a second moment, else -1 (none).
LOWBIT_HD int floor_positive_code(const QMap& map, bool second) {
  int zero = -1;
  for (int k = 0; k < map.n; ++k) zero = map.values[k] == 0.f && second ? k : zero;
  return zero;
}
LOWBIT_HD uint8_t floor_positive_e4m3(uint8_t code, float x) { return uint8_t(code | uint8_t((code == 0) & (x > 0.f))); }

// Scaled input of the code search; an all-zero block (absmax 0) maps to 0.
LOWBIT_HD float normalize(float v, float absmax) { return absmax > 0.f ? v / absmax : 0.f; }

// ---- FP8 e4m3 (finite variant: no Inf, max 448, NaN = 0x7F) -------------

LOWBIT_HD float e4m3_to_float(uint8_t c) {
  uint32_t sign = uint32_t(c & 0x80u) << 24;
  uint32_t exp = (c >> 3) & 0xFu;
  uint32_t mant = c & 0x7u;
  if (exp == 0xF && mant == 0x7) return bits_float(sign | 0x7FC00000u);
  if (exp == 0) {
    float mag = float(mant) * 0.001953125f;  // mant * 2^-9
    return bits_float(float_bits(mag) | sign);
  }
  return bits_float(sign | ((exp + 120u) << 23) | (mant << 20));
}

// Round to nearest even, saturating at +-448; NaN -> 0x7F. Branch-free so
// loops vectorise (checked equal to a branching version on all 2^32 floats).
LOWBIT_HD uint8_t float_to_e4m3(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 24) & 0x80u;
  uint32_t a = x & 0x7FFFFFFFu;
  // Normal range (>= 2^-6): round the mantissa to 3 bits, rebias (-120 << 23).
  uint32_t normal = (a + 0xC407FFFFu + ((a >> 20) & 1u)) >> 20;
  normal = normal > 0x7Eu ? 0x7Eu : normal;
  // Subnormals: multiples of 2^-9; |f| * 512 < 8 rounds to even by the magic add.
  float scaled = bits_float(a) * 512.f;
  uint32_t sub = uint32_t((scaled + 12582912.f) - 12582912.f);
  uint32_t code = a >= 0x3C800000u ? normal : sub;
  code = a >= 0x43E00000u ? 0x7Eu : code;
  code = a > 0x7F800000u ? 0x7Fu : code;
  return uint8_t(sign | code);
}

}  // namespace lowbit
