// Block quantization of optimizer moments, shared by the CPU engine and the
// CUDA kernels. A code is the nearest map value to x / absmax, found by a
// branchless binary search over the midpoints between adjacent codes; the
// midpoints are rounded down to float so that `x > mid` in float is exactly
// `x > true midpoint`: ties go to the lower code.
#pragma once
#include <cstdint>

#include "float16.hpp"
#include "hd.hpp"

namespace lowbit {

constexpr int kBlock8 = 256;   // 8-bit and FP8 block
constexpr int kBlock4 = 128;   // 4-bit block
constexpr int kTile = 256;     // engine tile: a multiple of every block
constexpr float kFp8Max = 448.f;

// One quantization map: n sorted values and the n-1 midpoints between them.
struct QMap {
  int n;
  float values[256];
  float midpoints[255];
};

// Index of the nearest code for x (already divided by absmax).
LOWBIT_HD int nearest_code(const QMap& map, float x) {
  int pos = 0;
  for (int step = map.n >> 1; step >= 1; step >>= 1)
    if (x > map.midpoints[pos + step - 1]) pos += step;
  return pos;
}

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

// Round to nearest even, saturating at +-448.
LOWBIT_HD uint8_t float_to_e4m3(float f) {
  uint32_t x = float_bits(f);
  uint8_t sign = uint8_t((x >> 24) & 0x80u);
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) return uint8_t(sign | 0x7Fu);
  if (x >= 0x43E00000u) return uint8_t(sign | 0x7Eu);  // >= 448 saturates
  if (x >= 0x3C800000u) {                             // normal e4m3 (>= 2^-6)
    x += 0xC407FFFFu + ((x >> 20) & 1u);              // rebias (-120 << 23), round to even
    uint32_t r = x >> 20;
    return uint8_t(sign | (r > 0x7Eu ? 0x7Eu : r));
  }
  if (x <= 0x3A800000u) return sign;  // <= 2^-10 (half the smallest subnormal) rounds to zero
  uint32_t e = x >> 23;
  uint32_t m = (x & 0x7FFFFFu) | 0x800000u;
  uint32_t shift = 141u - e;  // result in units of 2^-9
  uint32_t r = m >> shift;
  uint32_t rem = m & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return uint8_t(sign | r);
}

}  // namespace lowbit
