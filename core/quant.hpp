// Block quantization of optimizer moments, shared by the CPU engine and the
// CUDA kernels. A code is the nearest map value to x / absmax: the number of
// midpoints between adjacent codes that lie below x. The midpoints are
// rounded down to float so that `x > mid` in float is exactly `x > true
// midpoint`: ties go to the lower code.
#pragma once
#include <cmath>
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
  int zero_code;         // index of the value 0, -1 if the map has none (floor_positive)
  int linear16;          // 1: the values are k / 16, k = 1..16 (linear16_code)
  float values[256];
  float midpoints[257];  // n - 1 midpoints, then +Inf up to index 256 (bucket_code_finite reads c + 1)
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

// c plus the number of midpoints[c], midpoints[c + 1] below x: the bucket
// search's kQMaxScan = 2 compares from one table index, the same count as the
// sequential scan since the midpoints are sorted and +Inf-padded.
LOWBIT_HD int scan2(const QMap& map, int c, float x) {
#if defined(__CUDA_ARCH__)
  // set.lt gives all ones for true, so c - t0 - t1 is one three-input add;
  // 10 instructions fewer per 8-bit AdamW tile than int(m < x) (sass_count.sh).
  int t0, t1;
  asm("set.lt.s32.f32 %0, %1, %2;" : "=r"(t0) : "f"(map.midpoints[c]), "f"(x));
  asm("set.lt.s32.f32 %0, %1, %2;" : "=r"(t1) : "f"(map.midpoints[c + 1]), "f"(x));
  return c - t0 - t1;
#else
  return c + int(map.midpoints[c] < x) + int(map.midpoints[c + 1] < x);
#endif
}

// bucket_code() of a finite x in fewer operations (the CUDA encoders', where
// each integer operation counts): the bucket from |x|'s bits clamped to
// [2^-24, 2) before the shift (the same bucket as q_bucket), scan2, and no NaN
// mask (a NaN gives some code in range instead of 0).
LOWBIT_HD int bucket_code_finite(const QMap& map, float x) {
  constexpr uint32_t lo = uint32_t(kQMinExp) << 23, hi = (uint32_t(kQMaxExp + 1) << 23) - 1u;
  const uint32_t u = float_bits(x);
  uint32_t a = u & 0x7FFFFFFFu;
  a = a < lo ? lo : (a > hi ? hi : a);
  const int b = int(a >> (23 - kQMantBits)) - (kQMinExp << kQMantBits);
  return scan2(map, (&map.below[0][0])[int(u >> 31) * kQBuckets + b], x);
}

// bucket_code_finite() for a map whose values are all >= 0 (the second
// moments'): the bits as a signed integer clamp every negative x (and -0)
// into bucket 0 of the table of x >= 0, whose count and scan give code 0,
// the nearest code of any x <= 0 there. No sign table.
LOWBIT_HD int bucket_code_unsigned(const QMap& map, float x) {
  constexpr int32_t lo = kQMinExp << 23, hi = ((kQMaxExp + 1) << 23) - 1;
  int32_t a = int32_t(float_bits(x));
  a = a < lo ? lo : (a > hi ? hi : a);
  const int b = (a >> (23 - kQMantBits)) - (kQMinExp << kQMantBits);
  return scan2(map, map.below[0][b], x);
}

LOWBIT_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fmaf(a, b, c);
#endif
}

// The code of q in [-1, 1] in the 4-bit linear map (values k / 16, k = 1..16)
// without a search: its midpoints (2k + 1) / 32 are exact floats and
// midpoint k < q exactly when k < 16 q - 1.5, a difference that is exact
// wherever it is >= -0.75 (the CPU codec's linear4_codes16 gives the
// argument), so the code is ceil(16 q - 1.5) clamped to [0, 15]; NaN gives 0.
LOWBIT_HD int linear16_code(float q) {
  const float t = fma_rn(q, 16.f, -1.5f);
#if defined(__CUDA_ARCH__)
  const int c = __float2int_ru(t);  // NaN: 0 or INT_MIN, clamped to 0 below
  return c < 0 ? 0 : (c > 15 ? 15 : c);
#else
  const float c = std::ceil(t);
  return c > 0.f ? (c < 15.f ? int(c) : 15) : 0;
#endif
}

// x / d as the IEEE quotient, from a reciprocal and two FMAs (Markstein's
// theorem): q = RN(x y) with y = RN(1 / d), then q + (x - q d) y. Exact when
// d is in [2^-100, 2^27] (ok) and |x| in [lo, d 2^100], lo = max(2^-100, d 2^-100);
// x = +-0 gives +0, the same code as the quotient -0. For d = 0 (ok too) every
// x gives +0, as normalize(). The CUDA encoders divide
// a block by its absmax (or FP8 scale) this way: an IEEE division there is
// about 10 instructions and a branch, this is 3 (bench/NOTES.md, issue 31).
struct BlockDivisor {
  float d, y, lo;
  bool ok;
};

LOWBIT_HD BlockDivisor block_divisor(float d) {
  BlockDivisor b;
  // d = 0 (an all-zero block): y = 0 gives the +0 that normalize() gives.
  b.ok = (d >= 0x1p-100f && d <= 0x1p27f) || d == 0.f;  // false for NaN
  b.d = d;
  b.y = b.ok && d != 0.f ? 1.f / d : 0.f;
  b.lo = d <= 1.f ? 0x1p-100f : d * 0x1p-100f;
  return b;
}

// Whether divide(b, x) is x / d; |x| <= d * 2^100 is the caller's (a block's
// elements are at most its absmax, 448 times its FP8 scale).
LOWBIT_HD bool divides_exactly(const BlockDivisor& b, float x) {
  const float a = std::fabs(x);
  return a >= b.lo || a == 0.f;
}

LOWBIT_HD float divide(const BlockDivisor& b, float x) {
  const float q = x * b.y;
  return fma_rn(fma_rn(-q, b.d, x), b.y, q);
}

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
// The same without the table load.
LOWBIT_HD int floor_positive_fast(const QMap& map, int code, float x) {
  return code + int((code == map.zero_code) & (x > 0.f));
}
// The code floor_positive() moves a positive value off, as an index a vector
// loop compares each code with (no table load per element): the map's code
// of 0 for a second moment, else -1 (none).
LOWBIT_HD int floor_positive_code(const QMap& map, bool second) { return second ? map.zero_code : -1; }
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
