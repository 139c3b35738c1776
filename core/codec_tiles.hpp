// The bodies of the CPU codec's tile functions (codec.hpp), inline so that
// the per-level loops that call them (core/isa.hpp: the fused step, the
// passes, pass 1 of the shaped params) compile them for their level. Whole
// tiles of the quantized formats go to the running level's hand-written codec
// (codec_simd.hpp) where it has one; everything else is the portable rule.
#pragma once
#include <cstdint>
#include <cstring>

#include "codec_simd.hpp"
#include "float16.hpp"
#include "quant.hpp"
#include "rounding.hpp"
#include "state.hpp"

namespace lowbit {
namespace tiles {

// max |x| over the block; compares the bits of |x| as integers (the same
// order for non-NaN floats), which vectorises where a float max reduction
// does not.
inline float block_absmax(const float* x, int n) {
  uint32_t a = 0;
  for (int i = 0; i < n; ++i) {
    uint32_t u = float_bits(x[i]) & 0x7FFFFFFFu;
    a = u > a ? u : a;
  }
  return bits_float(a);  // a NaN wins (its bits are the largest): the block decodes as NaN
}

// The code of x (already divided by absmax) from the CPU tables: three
// independent lookups by bucket; the same code as bucket_code().
inline int wide_code(const QMapWide& w, float x) {
  uint32_t u = float_bits(x);
  uint32_t a = u & 0x7FFFFFFFu;
  int k = int(u >> 31) * kQBuckets + q_bucket(a);
  int c = (&w.below[0][0])[k] + int((&w.mid0[0][0])[k] < x) + int((&w.mid1[0][0])[k] < x);
  return c & -int(a <= 0x7F800000u);  // NaN: no midpoint is below it
}

// Codes of a block: x / absmax into a local array, then the code search over
// it with int32 codes (byte-narrowed arithmetic keeps GCC from vectorising).
template <int kMax>
inline void block_codes(const QMap& map, bool second, const float* x, int n, float absmax, int32_t* c) {
  const QMapWide& wide = qmap_wide(map);
  float xn[kMax];
  for (int i = 0; i < n; ++i) xn[i] = normalize(x[i], absmax);
  for (int i = 0; i < n; ++i) c[i] = wide_code(wide, xn[i]);
  if (second)  // floor_positive(): a positive second moment never takes the code of 0
    for (int i = 0; i < n; ++i) c[i] += int((c[i] == wide.zero_code) & (xn[i] > 0.f));
}

inline void encode_codes8(const QMap& map, bool second, const float* x, int n, uint8_t* codes, float* scale) {
  float absmax = block_absmax(x, n);
  *scale = absmax;
  int32_t c[kBlock8];
  block_codes<kBlock8>(map, second, x, n, absmax, c);
  for (int i = 0; i < n; ++i) codes[i] = uint8_t(c[i]);
}

// Codes of elements [first, first + n) of a 4-bit block; `first` is even.
inline void encode_codes4(const QMap& map, bool second, const float* x, int n, uint8_t* packed, float* scale) {
  float absmax = block_absmax(x, n);
  *scale = absmax;
  int32_t c[kBlock4 + 1];
  block_codes<kBlock4>(map, second, x, n, absmax, c);
  c[n] = 0;  // an odd tail leaves the last high nibble zero
  for (int i = 0; i < n; i += 2) packed[i / 2] = uint8_t(c[i] | (c[i + 1] << 4));
}

// 4BIT_SR: the codes of a 4-bit block rounded stochastically (quant.hpp
// stochastic_code16 against the block's decoded values) with the bits of
// elements first .. first + n - 1: the bits, then the codes, in loops the
// compiler vectorises. The SIMD codecs' whole tiles give the same bits.
inline void encode_codes4_sr(const QMap& map, bool second, const float* x, int n, uint8_t* packed, float* scale,
                             uint64_t key, int64_t first) {
  const float absmax = block_absmax(x, n);
  *scale = absmax;
  float decoded[16];
  decoded_values16(map, absmax, decoded);
  const int zero = floor_positive_code(map, second);
  uint32_t bits[kBlock4];
  uint8_t c[kBlock4 + 2];
  for (int i = 0; i < n; ++i) bits[i] = state_bits(key, uint64_t(first + i));
  for (int i = 0; i < n; ++i) {
    const int code = stochastic_code16(decoded, x[i], bits[i]);
    c[i] = uint8_t(code + int((code == zero) & (x[i] > 0.f)));
  }
  c[n] = 0;  // an odd tail leaves the last high nibble zero
  for (int j = 0; j < (n + 1) / 2; ++j) {  // pairs as 16-bit words: contiguous loads, a loop that vectorises
    uint16_t w;
    std::memcpy(&w, c + 2 * j, 2);
    packed[j] = uint8_t((w & 0xFu) | ((w >> 4) & 0xF0u));
  }
}

inline void encode_fp8(bool second, const float* x, int n, uint8_t* codes, float* scale) {
  float s = block_absmax(x, n) / kFp8Max;
  *scale = s;
  for (int i = 0; i < n; ++i) codes[i] = s > 0.f ? float_to_e4m3(x[i] / s) : uint8_t(0);
  if (second)
    for (int i = 0; i < n; ++i) codes[i] = floor_positive_e4m3(codes[i], x[i]);
}

inline void decode_moment_tile(const MomentView& mv, int64_t base, int n, float* out) {
  if (n == kTile && simd_decode_tile(simd_codec(), mv, base, out)) return;
  switch (mv.format) {
    case LOWBIT_STATE_FP32: std::memcpy(out, static_cast<const float*>(mv.data) + base, sizeof(float) * n); return;
    case LOWBIT_STATE_BF16: {
      const uint16_t* d = static_cast<const uint16_t*>(mv.data) + base;
      for (int i = 0; i < n; ++i) out[i] = bf16_to_float(d[i]);
      return;
    }
    case LOWBIT_STATE_8BIT: {
      const uint8_t* c = static_cast<const uint8_t*>(mv.data) + base;
      for (int b = 0; b < n; b += kBlock8) {
        float absmax = mv.scales[(base + b) / kBlock8];
        int end = n < b + kBlock8 ? n : b + kBlock8;
        for (int i = b; i < end; ++i) out[i] = mv.map->values[c[i]] * absmax;
      }
      return;
    }
    case LOWBIT_STATE_4BIT: {
      const uint8_t* c = static_cast<const uint8_t*>(mv.data) + base / 2;
      for (int b = 0; b < n; b += kBlock4) {
        float absmax = mv.scales[(base + b) / kBlock4];
        int end = n < b + kBlock4 ? n : b + kBlock4;
        for (int i = b; i < end; ++i) out[i] = mv.map->values[(c[i / 2] >> (4 * (i & 1))) & 0xF] * absmax;
      }
      return;
    }
    case LOWBIT_STATE_FP8: {
      const uint8_t* c = static_cast<const uint8_t*>(mv.data) + base;
      for (int b = 0; b < n; b += kBlock8) {
        float s = mv.scales[(base + b) / kBlock8];
        int end = n < b + kBlock8 ? n : b + kBlock8;
        for (int i = b; i < end; ++i) out[i] = e4m3_to_float(c[i]) * s;
      }
      return;
    }
    default: return;
  }
}

inline void encode_moment_tile(const MomentView& mv, int64_t base, int n, const float* in) {
  if (n == kTile && simd_encode_tile(simd_codec(), mv, base, in)) return;
  switch (mv.format) {
    case LOWBIT_STATE_FP32: std::memcpy(static_cast<float*>(mv.data) + base, in, sizeof(float) * n); return;
    case LOWBIT_STATE_BF16: {
      uint16_t* d = static_cast<uint16_t*>(mv.data) + base;
      for (int i = 0; i < n; ++i) d[i] = float_to_bf16(in[i]);
      return;
    }
    case LOWBIT_STATE_8BIT: {
      uint8_t* c = static_cast<uint8_t*>(mv.data) + base;
      for (int b = 0; b < n; b += kBlock8)
        encode_codes8(*mv.map, mv.second, in + b, (n - b < kBlock8 ? n - b : kBlock8), c + b,
                      &mv.scales[(base + b) / kBlock8]);
      return;
    }
    case LOWBIT_STATE_4BIT: {
      uint8_t* c = static_cast<uint8_t*>(mv.data) + base / 2;
      for (int b = 0; b < n; b += kBlock4)
        encode_codes4(*mv.map, mv.second, in + b, (n - b < kBlock4 ? n - b : kBlock4), c + b / 2,
                      &mv.scales[(base + b) / kBlock4]);
      return;
    }
    case LOWBIT_STATE_FP8: {
      uint8_t* c = static_cast<uint8_t*>(mv.data) + base;
      for (int b = 0; b < n; b += kBlock8)
        encode_fp8(mv.second, in + b, (n - b < kBlock8 ? n - b : kBlock8), c + b, &mv.scales[(base + b) / kBlock8]);
      return;
    }
    default: return;
  }
}

inline void encode_moment_tile_stochastic(const MomentView& mv, int64_t base, int n, const float* in, uint64_t key) {
  if (n == kTile && simd_encode_tile_sr(simd_codec(), mv, base, in, key)) return;
  uint8_t* c = static_cast<uint8_t*>(mv.data) + base / 2;
  for (int b = 0; b < n; b += kBlock4)
    encode_codes4_sr(*mv.map, mv.second, in + b, (n - b < kBlock4 ? n - b : kBlock4), c + b / 2,
                     &mv.scales[(base + b) / kBlock4], key, base + b);
}

inline void load_tensor_tile(const void* data, lowbit_dtype_t dtype, int64_t base, int n, float* out) {
  if (dtype == LOWBIT_DTYPE_FLOAT32) {
    std::memcpy(out, static_cast<const float*>(data) + base, sizeof(float) * n);
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(data) + base;
  if (dtype == LOWBIT_DTYPE_BFLOAT16)
    for (int i = 0; i < n; ++i) out[i] = bf16_to_float(h[i]);
  else
    for (int i = 0; i < n; ++i) out[i] = fp16_to_float(h[i]);
}

inline void load_param_tile(const ParamView& pv, int64_t base, int n, float* out) {
  if (pv.rounding != WeightRounding::ErrorCorrection || pv.param_dtype == LOWBIT_DTYPE_FLOAT32) {
    load_tensor_tile(pv.param, pv.param_dtype, base, n, out);
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(pv.param) + base;
  const uint8_t* e = pv.ecc + base;
  if (pv.param_dtype == LOWBIT_DTYPE_BFLOAT16)
    for (int i = 0; i < n; ++i) out[i] = bf16_ecc_to_float(h[i], e[i]);
  else
    for (int i = 0; i < n; ++i) out[i] = fp16_ecc_to_float(h[i], e[i]);
}

inline void store_param_tile(const ParamView& pv, uint64_t key, int64_t base, int n, const float* in) {
  if (pv.param_dtype == LOWBIT_DTYPE_FLOAT32) {
    std::memcpy(static_cast<float*>(pv.param) + base, in, sizeof(float) * n);
    return;
  }
  uint16_t* h = static_cast<uint16_t*>(pv.param) + base;
  bool bf16 = pv.param_dtype == LOWBIT_DTYPE_BFLOAT16;
  switch (pv.rounding) {
    case WeightRounding::Nearest:
      if (bf16)
        for (int i = 0; i < n; ++i) h[i] = float_to_bf16(in[i]);
      else
        for (int i = 0; i < n; ++i) h[i] = float_to_fp16(in[i]);
      return;
    case WeightRounding::Stochastic:
      if (bf16)
        for (int i = 0; i < n; ++i) h[i] = float_to_bf16_sr(in[i], random_bits(key, uint64_t(base + i)));
      else
        for (int i = 0; i < n; ++i) h[i] = float_to_fp16_sr(in[i], random_bits(key, uint64_t(base + i)));
      return;
    case WeightRounding::ErrorCorrection: {
      uint8_t* e = pv.ecc + base;
      if (bf16)
        for (int i = 0; i < n; ++i) float_to_bf16_ecc(in[i], h[i], e[i]);
      else
        for (int i = 0; i < n; ++i) float_to_fp16_ecc(in[i], h[i], e[i]);
      return;
    }
  }
}

}  // namespace tiles
}  // namespace lowbit
