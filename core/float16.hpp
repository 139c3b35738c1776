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

// f rounded to the nearest bf16 (even on ties), as an fp32 value.
LOWBIT_HD float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// Moments given as fp32 values (write_moment, checkpoints) stored as bf16: as
// float_to_bf16, except that a finite f beyond bf16's range (|f| >= 3.3961e38,
// which rounds to Inf) saturates to the largest bf16 of its sign (+-3.3895e38);
// Inf and NaN stay. (A step's second moments never pass 3.3895e38:
// kMomentMax in update_rules.hpp.)
LOWBIT_HD uint16_t float_to_bf16_saturate(float f) {
  const uint16_t h = float_to_bf16(f);
  return uint16_t(h - uint16_t(((h & 0x7FFFu) == 0x7F80u) & is_finite_bits(float_bits(f))));
}

LOWBIT_HD float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  const float subnormal = float(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
  const uint32_t other = exp == 31 ? 0x7F800000u | (mant << 13) : ((exp + 112u) << 23) | (mant << 13);
  return bits_float(sign | (exp == 0 ? float_bits(subnormal) : other));
}

// Branch-free (selects) so conversion loops vectorise. The subnormal range
// (|f| < 2^-14) is the float sum |f| + 0.5, whose ulp is 2^-24, the fp16
// subnormal step: the add rounds to nearest even (the default rounding mode,
// as round_small in rounding.hpp) and its low bits are the fp16 code, up to
// 0x400 (the smallest normal) where |f| rounds up into it.
LOWBIT_HD uint16_t float_to_fp16(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t x = u & 0x7FFFFFFFu;
  const uint32_t normal = (x + 0xC8000FFFu + ((x >> 13) & 1u)) >> 13;  // rebias the exponent, round to even
  const uint32_t subnormal = float_bits(bits_float(x) + 0.5f) - 0x3F000000u;
  uint32_t h = x >= 0x38800000u ? normal : subnormal;  // normal fp16 from 2^-14
  h = x >= 0x477FF000u ? 0x7C00u : h;                   // >= 65520 rounds to Inf, Inf stays Inf
  h = x > 0x7F800000u ? 0x7E00u : h;                    // NaN
  return uint16_t(sign | h);
}

}  // namespace lowbit
