// How an fp32 result is written back to a 16-bit weight:
//  - round to nearest even,
//  - stochastic rounding with counter-based bits: hash(seed, param id, step, i),
//    so any threading / launch shape / resumed run gives the same bits,
//  - error correction: the 16-bit weight plus one signed byte per element that
//    stores the rounding residual in units of ulp/256, so (weight, byte) is a
//    master weight with 8 more significand bits.
#pragma once
#include <cmath>
#include <cstdint>

#include "float16.hpp"
#include "hd.hpp"

namespace lowbit {

LOWBIT_HD uint64_t mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z;
}

// Key for one (seed, param, step); element bits are then mixed with i.
LOWBIT_HD uint64_t rounding_key(uint64_t seed, uint64_t param_id, uint64_t step) {
  return mix64(seed ^ mix64(param_id * 0x9E3779B97F4A7C15ull ^ mix64(step + 0x632BE59BD9B4E019ull)));
}

// The key of a step's state-code rounding (4BIT_SR) of moment 0 or 1, apart
// from the weights' bits of the same step (`key`: rounding_key()).
LOWBIT_HD uint64_t state_rounding_key(uint64_t key, int moment) {
  return mix64(key ^ (0x243F6A8885A308D3ull + uint64_t(moment)));
}

LOWBIT_HD uint32_t random_bits(uint64_t key, uint64_t i) {
  return uint32_t(mix64(key + (i + 1) * 0xD1B54A32D192ED03ull) >> 32);
}

// The bits of element i of a step's state-code rounding (4BIT_SR; `key`:
// state_rounding_key): murmur3's 32-bit finaliser of the element index
// spread by an odd constant plus the key's low half, then its high half
// xored in. Only 32-bit multiplies, so vector units take 16 lanes at a time
// (random_bits' 64-bit ones cost the encoder more than the rest of it).
LOWBIT_HD uint32_t state_bits(uint64_t key, uint64_t i) {
  uint32_t h = uint32_t(i) * 0x9E3779B1u + uint32_t(key) + uint32_t(i >> 32) * 0x85EBCA77u;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h ^ uint32_t(key >> 32);
}

// state_bits(key, first + j) for j = 0 .. N - 1, where first is a multiple of
// N (N a power of two), so first + j keeps first's high word: the first sum
// once, then j times the low word's multiplier added (the CUDA fast loops'
// 8 elements a lane; tests/core/test_stochastic_codes.cpp checks it against
// state_bits).
template <int N>
LOWBIT_HD void state_bits_run(uint64_t key, uint64_t first, uint32_t (&bits)[N]) {
  static_assert(N > 0 && (N & (N - 1)) == 0, "a power of two");
  const uint32_t h0 = uint32_t(first) * 0x9E3779B1u + uint32_t(key) + uint32_t(first >> 32) * 0x85EBCA77u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < N; ++j) {
    uint32_t h = h0 + uint32_t(j) * 0x9E3779B1u;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    bits[j] = h ^ uint32_t(key >> 32);
  }
}

// bf16 stochastic rounding: P(round away from zero) = dropped bits / 2^16.
// Selects, no early return, so loops over it vectorise.
LOWBIT_HD uint16_t float_to_bf16_sr(float f, uint32_t bits) {
  const uint32_t u = float_bits(f);
  const uint32_t r = u + (bits & 0xFFFFu);
  const uint16_t rounded = uint16_t((is_finite_bits(r) ? r : u) >> 16);  // would overflow to Inf: truncate
  return is_finite_bits(u) ? rounded : float_to_bf16(f);
}

// fp16 stochastic rounding between the two neighbouring fp16 values. Both
// candidates are computed and one selected (no early return), so loops over
// it vectorise; a value that is exact or not finite keeps its nearest.
LOWBIT_HD uint16_t float_to_fp16_sr(float f, uint32_t bits) {
  const uint16_t h = float_to_fp16(f);
  const float hf = fp16_to_float(h);
  const bool down = std::fabs(hf) > std::fabs(f);  // then lo is one step down in magnitude
  const uint16_t lo = down ? uint16_t(h - 1) : h, hi = down ? h : uint16_t(h + 1);
  const float lof = std::fabs(fp16_to_float(lo)), hif = std::fabs(fp16_to_float(hi));
  const float frac = (std::fabs(f) - lof) / (hif - lof);
  const float u = float(bits >> 8) * 5.9604644775390625e-8f;  // [0, 1) on 24 bits
  const uint16_t rounded = u < frac ? hi : lo;
  return hf == f || !is_finite_bits(float_bits(f)) ? h : rounded;
}

// log2 of one ulp of the 16-bit value with this exponent field.
LOWBIT_HD int bf16_ulp_log2(uint16_t w) {
  int e = (w >> 7) & 0xFF;
  return (e > 1 ? e : 1) - 134;
}
LOWBIT_HD int fp16_ulp_log2(uint16_t w) {
  int e = (w >> 10) & 0x1F;
  return (e > 1 ? e : 1) - 25;
}

// 2^k for k in [-126, 127], from the bits.
LOWBIT_HD float pow2i(int k) { return bits_float(uint32_t(k + 127) << 23); }

// x * 2^k for k in [-252, 254] with a single rounding (as ldexpf): the first
// factor keeps |x| >= 2^-126 when scaling a value >= 1 down, so only the
// second multiply can round. Used instead of ldexpf so the loops vectorise.
LOWBIT_HD float scale_pow2(float x, int k) {
  int half = k / 2;
  return x * pow2i(half) * pow2i(k - half);
}

// Round to nearest even for |x| < 2^22 (the default rounding mode does it).
LOWBIT_HD float round_small(float x) {
  const float magic = 12582912.f;  // 1.5 * 2^23
  return x >= 0.f ? (x + magic) - magic : (x - magic) + magic;
}

LOWBIT_HD uint8_t residual_byte(float exact, float rounded, int ulp_log2) {
  if (!is_finite_bits(float_bits(exact)) || !is_finite_bits(float_bits(rounded))) return 0;
  float q = round_small(scale_pow2(exact - rounded, 8 - ulp_log2));  // exact - rounded is exact (Sterbenz)
  q = q > 127.f ? 127.f : (q < -128.f ? -128.f : q);
  return uint8_t(int8_t(q));
}

LOWBIT_HD float bf16_ecc_to_float(uint16_t w, uint8_t e) {
  return bf16_to_float(w) + scale_pow2(float(int8_t(e)), bf16_ulp_log2(w) - 8);
}
LOWBIT_HD float fp16_ecc_to_float(uint16_t w, uint8_t e) {
  return fp16_to_float(w) + scale_pow2(float(int8_t(e)), fp16_ulp_log2(w) - 8);
}

LOWBIT_HD void float_to_bf16_ecc(float f, uint16_t& w, uint8_t& e) {
  w = float_to_bf16(f);
  e = residual_byte(f, bf16_to_float(w), bf16_ulp_log2(w));
}
LOWBIT_HD void float_to_fp16_ecc(float f, uint16_t& w, uint8_t& e) {
  w = float_to_fp16(f);
  e = residual_byte(f, fp16_to_float(w), fp16_ulp_log2(w));
}

}  // namespace lowbit
