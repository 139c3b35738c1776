// bf16 / fp16 <-> fp32 conversions on raw bits, identical on host and device.
// Round to nearest, ties to even; NaN stays NaN; fp16 overflow goes to Inf.
#pragma once
#include <cstdint>
#include <cstring>

#include "hd.hpp"

namespace lowbit {

LOWBIT_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

LOWBIT_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

LOWBIT_HD bool is_finite_bits(uint32_t u) { return (u & 0x7F800000u) != 0x7F800000u; }

LOWBIT_HD float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

// Branch-free (a select for NaN) so conversion loops vectorise.
LOWBIT_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return uint16_t((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

LOWBIT_HD float fp16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    float mag = float(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
    return bits_float(float_bits(mag) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7F800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

LOWBIT_HD uint16_t float_to_fp16(float f) {
  uint32_t x = float_bits(f);
  uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) return uint16_t(sign | (x > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (x >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // >= 65520 rounds to Inf
  if (x >= 0x38800000u) {                                // normal fp16 (>= 2^-14)
    x += 0xC8000FFFu + ((x >> 13) & 1u);                 // rebias exponent, round to even
    return uint16_t(sign | (x >> 13));
  }
  if (x < 0x33000000u) return sign;  // below half the smallest subnormal
  uint32_t e = x >> 23;
  uint32_t m = (x & 0x7FFFFFu) | 0x800000u;
  uint32_t shift = 126u - e;  // result in units of 2^-24
  uint32_t r = m >> shift;
  uint32_t rem = m & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return uint16_t(sign | r);
}

}  // namespace lowbit
