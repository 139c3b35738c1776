// The fused multi-tensor step kernel. One launch covers every parameter: CUDA
// block b works on part b % kSplit of chunk b / kSplit of the chunk table
// (chunks are <= 64K elements of one parameter, begin a multiple of 64K).
// Inside a block each warp takes whole tiles of 256 elements, 8 consecutive
// elements per lane, so
//   - a tile is exactly one 8-bit / FP8 block or two 4-bit blocks (lanes
//     0-15 and 16-31): block absmax is a warp (or half-warp) shuffle max;
//   - a 16-bit tensor moves as one 16-byte load per lane, an fp32 one as two,
//     8-bit codes as 8 bytes, 4-bit codes as 4 bytes, always aligned for the
//     state (cudaMalloc) and for params/grads whose base is 16-byte aligned;
//     other bases and the partial last 8 elements of a parameter take a
//     scalar path into the same register layout.
// The quantization maps (values, midpoints, bucket tables of the code search)
// are copied to shared memory per block; block-normalised codes come from
// bucket_code() of core/quant.hpp (identical to nearest_code(), the reference).
// The per-element math is core/update_rules.hpp, the codec is core/codec.cpp
// step for step (same operations in the same order, no FMA contraction: the
// CUDA sources are built with --fmad=false), so results match the CPU engine
// bit for bit. Each lane first issues all loads of a tile, then decodes, so
// the loads of one tile are in flight together.
#pragma once
#ifndef LOWBIT_CUDA_EMULATION  // tests/cuda/emu: the same kernel code run on the host
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#endif

#include "core/float16.hpp"
#include "core/quant.hpp"
#include "core/rounding.hpp"
#include "core/update_rules.hpp"
#include "cuda/lane_io.cuh"
#include "cuda/shaped_kernels.cuh"
#include "cuda/sr_codes.cuh"
#include "cuda/tables.hpp"

namespace lowbit {
namespace cuda {

// float_to_bf16 of x[j] in halfword j of w: on the GPU one paired conversion
// (cvt.rn.bf16x2.f32, round to nearest even) per two values unless one is a
// NaN, whose bf16 that conversion makes canonical where float_to_bf16 keeps
// its sign and payload.
__device__ __forceinline__ void pack_bf16(const float (&x)[8], uint32_t* w) {
#if defined(__CUDA_ARCH__)
  bool nan = false;
#pragma unroll
  for (int j = 0; j < 8; ++j) nan |= x[j] != x[j];
  if (!nan) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(x[2 * k], x[2 * k + 1]);
      w[k] = *reinterpret_cast<const uint32_t*>(&h);
    }
    return;
  }
#endif
#pragma unroll
  for (int k = 0; k < 4; ++k) w[k] = uint32_t(float_to_bf16(x[2 * k])) | uint32_t(float_to_bf16(x[2 * k + 1])) << 16;
}

// ---- moments ----------------------------------------------------------------

struct MomentRef {
  uint8_t format;  // 0: none
  void* data;
  float* scales;
};

__device__ __forceinline__ void load_moment(Raw& r, float& scale, const MomentRef& mr, int64_t e0, int64_t tile_off,
                                            int n, int lane) {
  zero(r);
  scale = 0.f;
  if (n == 0) return;
  switch (mr.format) {
    case LOWBIT_STATE_FP32: load_elems(r, mr.data, true, e0, n, true); break;
    case LOWBIT_STATE_BF16: load_elems(r, mr.data, false, e0, n, true); break;
    case LOWBIT_STATE_8BIT:
    case LOWBIT_STATE_FP8:
      load_bytes(r, static_cast<const uint8_t*>(mr.data) + e0, n, 8);
      scale = mr.scales ? __ldcs(mr.scales + tile_off / kBlock8) : 1.f;  // no scales: rank-1 (per element)
      break;
    case LOWBIT_STATE_4BIT:
      load_bytes(r, static_cast<const uint8_t*>(mr.data) + e0 / 2, (n + 1) / 2, 4);
      scale = mr.scales ? __ldcs(mr.scales + tile_off / kBlock4 + (lane >> 4)) : 1.f;
      break;
    default: break;
  }
}

__device__ __forceinline__ void decode_moment(float (&x)[8], uint8_t format, const Raw& r, float scale,
                                              const QMap& sm) {
  switch (format) {
    case LOWBIT_STATE_FP32:
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = bits_float(r.w[j]);
      break;
    case LOWBIT_STATE_BF16:
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = bf16_to_float(uint16_t(half_at(r, j)));
      break;
    case LOWBIT_STATE_8BIT:
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = sm.values[byte_at(r, j)] * scale;
      break;
    case LOWBIT_STATE_4BIT:
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = sm.values[(r.w[0] >> (4 * j)) & 0xFu] * scale;
      break;
    case LOWBIT_STATE_FP8:  // sm.values: the 256 e4m3 values (step_kernel's prologue)
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = sm.values[byte_at(r, j)] * scale;
      break;
    default:
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = 0.f;
      break;
  }
}

// Max of |x[j]| over the valid elements of the lanes of one block: the whole
// warp (first_offset 16) or each half-warp (first_offset 8). Every lane of
// the warp must call it. As block_absmax() in core/codec.cpp: the maximum of
// the bits of |x| as integers (the float order for non-NaN values; exact, so
// the reduction order does not matter), and 0 when that maximum is a NaN.
__device__ __forceinline__ float block_absmax(const float (&x)[8], int n, int first_offset) {
  uint32_t a = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t u = float_bits(x[j]) & 0x7FFFFFFFu;
    if (j < n) a = u > a ? u : a;
  }
  for (int off = first_offset; off > 0; off >>= 1) {
    uint32_t v = __shfl_xor_sync(0xFFFFFFFFu, a, off);
    a = v > a ? v : a;
  }
  return bits_float(a);  // a NaN wins (its bits are the largest): the block decodes as NaN, as on the CPU
}

// The codes of a block's values x[j] (j < n) with this absmax, as
// nearest_code(x / absmax) (floor_positive for a second moment): the division
// as divide() of core/quant.hpp and bucket_code_finite() when every value
// allows it (absmax finite and in range, no tiny nonzero value), else
// codes_any(). The same codes either way.
__device__ __forceinline__ void codes_any(const QMap& sm, bool second, const float (&x)[8], float absmax,
                                       uint32_t (&c)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float xn = normalize(x[j], absmax);
    const int code = bucket_code(sm, xn);
    c[j] = uint32_t(second ? floor_positive(sm, code, xn) : code);
  }
}

// What a fast loop knows of a moment's map: nothing (bucket_code_finite), that
// its values are all >= 0 (bucket_code_unsigned), or that it is the 4-bit
// linear map (linear16_code, no search).
enum MapKind { kAnyMap = 0, kUnsignedMap = 1, kLinear16Map = 2 };

// Whether a code may need floor_positive: a second moment's, unless its map is
// the 4-bit linear one, which has no 0 to move a positive value off.
__device__ __forceinline__ bool floors(int kind, bool second) { return second && kind != kLinear16Map; }

__device__ __forceinline__ int fast_code(int kind, const QMap& sm, float xn) {
  return kind == kLinear16Map ? linear16_code(xn)
                              : (kind == kUnsignedMap ? bucket_code_unsigned(sm, xn) : bucket_code_finite(sm, xn));
}

// Whether divide(b, .) is the quotient for each of the lane's n values.
__device__ __forceinline__ bool divides_lane_exactly(const BlockDivisor& b, const float (&x)[8], int n) {
  bool exact = b.ok;
#pragma unroll
  for (int j = 0; j < 8; ++j)
    if (j < n) exact &= divides_exactly(b, x[j]);
  return exact;
}

template <int kMap>
__device__ __forceinline__ void block_codes(const QMap& sm, bool second, const float (&x)[8], int n, float absmax,
                                            uint32_t (&c)[8]) {
  const BlockDivisor b = block_divisor(absmax);
  if (!divides_lane_exactly(b, x, n)) {
    codes_any(sm, second, x, absmax, c);
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float xn = divide(b, x[j]);
    const int code = fast_code(kMap, sm, xn);
    c[j] = uint32_t(floors(kMap, second) ? floor_positive_fast(sm, code, xn) : code);
  }
}

// FP8 codes of a block's values with scale s (absmax / 448): float_to_e4m3(x / s),
// the division as block_codes() takes it.
__device__ __forceinline__ void fp8_codes_any(bool second, const float (&x)[8], float s, uint32_t (&c)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint8_t code = s > 0.f ? float_to_e4m3(x[j] / s) : uint8_t(0);
    c[j] = second ? floor_positive_e4m3(code, x[j]) : code;
  }
}

// float_to_e4m3(lo) | float_to_e4m3(hi) << 8 for two values that are not NaN:
// on sm_89 and later one hardware conversion (cvt.rn.satfinite.e4m3x2.f32:
// round to nearest even, +-448 past the range), about 11 instructions fewer
// per value. Its rounding is CUDA's reference conversion (cuda_fp8.hpp's
// host path), which tests/cuda/test_fp8_conversion.cpp compares with
// float_to_e4m3 on every float: they differ on negative NaNs only (the
// hardware's NaN is 0x7F), which never reach here.
__device__ __forceinline__ uint32_t e4m3x2_not_nan(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
  return pair;
#else
  return uint32_t(float_to_e4m3(lo)) | uint32_t(float_to_e4m3(hi)) << 8;
#endif
}

__device__ __forceinline__ void fp8_codes(bool second, const float (&x)[8], int n, float s, uint32_t (&c)[8]) {
  const BlockDivisor b = block_divisor(s);
  if (!divides_lane_exactly(b, x, n)) {  // also every NaN: its block's scale is NaN
    fp8_codes_any(second, x, s, c);
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    const uint32_t pair = e4m3x2_not_nan(divide(b, x[j]), divide(b, x[j + 1]));
    c[j] = second ? floor_positive_e4m3(uint8_t(pair), x[j]) : pair & 0xFFu;
    c[j + 1] = second ? floor_positive_e4m3(uint8_t(pair >> 8), x[j + 1]) : pair >> 8;
  }
}

// The codes c[j] of elements e0 .. e0 + n - 1 (n <= 8) of a moment stored: a
// byte each (8BIT, FP8) or a nibble each (4BIT, `four`; past the end of the
// tensor the high nibble of the last byte is 0).
__device__ __forceinline__ void store_codes(void* data, bool four, int64_t e0, int n, const uint32_t (&c)[8]) {
  if (n <= 0) return;
  Raw r;
  zero(r);
  if (four) {
#pragma unroll
    for (int j = 0; j < 8; ++j) r.w[0] |= (j < n ? c[j] : 0u) << (4 * j);
    store_bytes(static_cast<uint8_t*>(data) + e0 / 2, (n + 1) / 2, 4, r);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) r.w[j >> 2] |= c[j] << (8 * (j & 3));
    store_bytes(static_cast<uint8_t*>(data) + e0, n, 8, r);
  }
}

// `second`: a second moment, whose positive values never encode to 0 (floor_positive in core/quant.hpp).
// `stochastic`: a 4BIT_SR moment: codes rounded stochastically with the
// bits of state_rounding_key `sr_key` (core/codec.cpp encode_moment_tile_stochastic).
template <int kMap = kAnyMap>
__device__ __forceinline__ void encode_store_moment(const MomentRef& mr, const QMap& sm, bool second,
                                                    const float (&x)[8], int64_t e0, int64_t tile_off, int n,
                                                    int lane, bool stochastic = false, uint64_t sr_key = 0) {
  Raw r;
  zero(r);
  switch (mr.format) {
    case LOWBIT_STATE_FP32:
#pragma unroll
      for (int j = 0; j < 8; ++j) r.w[j] = float_bits(x[j]);
      store_elems(mr.data, true, e0, n, true, r);
      break;
    case LOWBIT_STATE_BF16:
      pack_bf16(x, r.w);
      store_elems(mr.data, false, e0, n, true, r);
      break;
    case LOWBIT_STATE_8BIT: {
      float absmax = block_absmax(x, n, 16);
      if (lane == 0) mr.scales[tile_off / kBlock8] = absmax;
      uint32_t c[8];
      block_codes<kMap>(sm, second, x, n, absmax, c);
      store_codes(mr.data, false, e0, n, c);
      break;
    }
    case LOWBIT_STATE_4BIT: {
      float absmax = block_absmax(x, n, 8);
      if ((lane & 15) == 0 && n > 0) mr.scales[tile_off / kBlock4 + (lane >> 4)] = absmax;
      uint32_t c[8];
      if (stochastic) {
        float decoded[16];
        decoded_values16(sm, absmax, decoded);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int code = stochastic_code16(decoded, x[j], state_bits(sr_key, uint64_t(e0 + j)));
          c[j] = uint32_t(second ? floor_positive(sm, code, x[j]) : code);
        }
      } else {
        block_codes<kMap>(sm, second, x, n, absmax, c);
      }
      store_codes(mr.data, true, e0, n, c);
      break;
    }
    case LOWBIT_STATE_FP8: {
      float s = block_absmax(x, n, 16) / kFp8Max;
      if (lane == 0) mr.scales[tile_off / kBlock8] = s;
      uint32_t c[8];
      fp8_codes(second, x, n, s, c);
      store_codes(mr.data, false, e0, n, c);
      break;
    }
    default: break;
  }
}

// A 4BIT_SR first moment of a whole tile stored (every lane of the warp: 8
// elements each): the generic loop's stochastic codes, by sr_codes.
__device__ __forceinline__ void encode_store_sr(const MomentRef& mr, const QMap& sm, const float (&x)[8], int64_t e0,
                                                int64_t tile_off, int lane, int warp, uint64_t sr_key) {
  const float absmax = block_absmax(x, 8, 8);
  if ((lane & 15) == 0) mr.scales[tile_off / kBlock4 + (lane >> 4)] = absmax;
  Raw r;
  zero(r);
  r.w[0] = sr_codes(sm, x, absmax, sr_key, e0, lane, warp);
  store_bytes(static_cast<uint8_t*>(mr.data) + e0 / 2, 4, 4, r);
}

// The codes of a rank-1 moment's values x[j] with their own scales: rank1_code
// of core/shape.hpp (its nearest_code as the bucket search or, for the 4-bit
// linear map, linear16_code: the same code).
template <int kMap>
__device__ __forceinline__ void rank1_codes(const QMap& sm, bool second, const float (&x)[8], const float (&sc)[8],
                                            uint32_t (&c)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float xn = normalize(x[j], sc[j]);
    const int code = fast_code(kMap, sm, xn);
    c[j] = xn != xn ? 0u : uint32_t(floors(kMap, second) ? floor_positive_fast(sm, code, xn) : code);  // NaN: code 0
  }
}

// A rank-1 moment (8BIT / 4BIT) of the generic loop stored.
__device__ __forceinline__ void encode_store_rank1(const MomentRef& mr, const QMap& sm, bool second,
                                                   const float (&x)[8], const float (&sc)[8], int64_t e0, int n) {
  uint32_t c[8];
  rank1_codes<kAnyMap>(sm, second, x, sc, c);
  store_codes(mr.data, mr.format == LOWBIT_STATE_4BIT, e0, n, c);
}

template <Algo A>
__device__ __forceinline__ void factored_update(const StepScalars& s, float& p, float g, float& m, float vhat) {
  if constexpr (A == Algo::AdamW || A == Algo::Adam) update_element_factored<A>(s, p, g, m, vhat);
}

// ---- params -------------------------------------------------------------------

__device__ __forceinline__ void param_to_float(float (&p)[8], uint8_t dtype, bool ecc, const Raw& r, const Raw& e) {
  if (dtype == kF32) {
#pragma unroll
    for (int j = 0; j < 8; ++j) p[j] = bits_float(r.w[j]);
  } else if (dtype == kBF16) {
    if (ecc) {
#pragma unroll
      for (int j = 0; j < 8; ++j) p[j] = bf16_ecc_to_float(uint16_t(half_at(r, j)), uint8_t(byte_at(e, j)));
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) p[j] = bf16_to_float(uint16_t(half_at(r, j)));
    }
  } else {
    if (ecc) {
#pragma unroll
      for (int j = 0; j < 8; ++j) p[j] = fp16_ecc_to_float(uint16_t(half_at(r, j)), uint8_t(byte_at(e, j)));
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) p[j] = fp16_to_float(uint16_t(half_at(r, j)));
    }
  }
}

__device__ __forceinline__ void store_param(uint8_t pdtype, uint8_t rounding, void* param, uint8_t* ecc_bytes,
                                            bool al16, const float (&p)[8], int64_t e0, int n, uint64_t key) {
  Raw r;
  zero(r);
  if (pdtype == kF32) {
#pragma unroll
    for (int j = 0; j < 8; ++j) r.w[j] = float_bits(p[j]);
    store_elems(param, true, e0, n, al16, r);
    return;
  }
  const bool bf16 = pdtype == kBF16;
  if (rounding == kEcc) {
    Raw e;
    zero(e);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint16_t h;
      uint8_t b;
      if (bf16)
        float_to_bf16_ecc(p[j], h, b);
      else
        float_to_fp16_ecc(p[j], h, b);
      r.w[j >> 1] |= uint32_t(h) << (16 * (j & 1));
      e.w[j >> 2] |= uint32_t(b) << (8 * (j & 3));
    }
    store_elems(param, false, e0, n, al16, r);
    if (n > 0) store_bytes(ecc_bytes + e0, n, 8, e);
    return;
  }
  if (rounding == kStochastic) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t bits = random_bits(key, uint64_t(e0 + j));
      uint16_t h = bf16 ? float_to_bf16_sr(p[j], bits) : float_to_fp16_sr(p[j], bits);
      r.w[j >> 1] |= uint32_t(h) << (16 * (j & 1));
    }
  } else if (bf16) {
    pack_bf16(p, r.w);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) r.w[j >> 1] |= uint32_t(float_to_fp16(p[j])) << (16 * (j & 1));
  }
  store_elems(param, false, e0, n, al16, r);
}

__device__ __forceinline__ void store_param(const DevParam& P, const float (&p)[8], int64_t e0, int n, uint64_t key) {
  store_param(P.pdtype, P.rounding, P.param, P.ecc, P.param_al16 != 0, p, e0, n, key);
}

// ---- the fast path ---------------------------------------------------------------

// Moments an algorithm keeps when it keeps any (SGD without momentum keeps
// none and takes the generic loop).
template <Algo A>
constexpr int kFastMoments = (A == Algo::AdamW || A == Algo::Adam) ? 2 : 1;

// Whole tiles [t_from, t_to) of a parameter whose moments are all of format F
// and normalised per block, with params and grads of dtype PD at 16-byte
// aligned bases: the generic loop's helpers with compile-time dtype and
// format, so their switches fold away, no tail handling remains and the
// parameter's fields stay in registers. The same operations in the same
// order as the generic loop: the same bits. kSR: the first moment is
// 4BIT_SR (F is 4BIT), its codes stochastic (encode_store_sr). Muon reads no
// param and writes its result to `out` (fp32, 16-byte aligned when out_al16).
template <Algo A, uint8_t PD, uint8_t F, bool kSR = false>
__device__ __forceinline__ void fast_tiles(const DevParam& P, const void* grad, const StepScalars& s, uint64_t key,
                                           const QMap (&smap)[2], int64_t begin, int64_t t_from, int64_t t_to,
                                           int lane, int warp, float* out = nullptr, bool out_al16 = false) {
  static_assert(!kSR || F == LOWBIT_STATE_4BIT, "4BIT_SR is laid out as 4BIT");
  constexpr int NM = kFastMoments<A>;
  constexpr bool wide = PD == kF32;
  constexpr bool muon = A == Algo::Muon;
  void* const param = P.param;
  uint8_t* const ecc_bytes = P.ecc;
  const uint8_t rounding = P.rounding;
  const bool ecc = !muon && !wide && rounding == kEcc;
  const bool second0 = (P.coding[0] & kCodeSecond) != 0, second1 = (P.coding[1] & kCodeSecond) != 0;
  const MomentRef mom0{F, P.mdata[0], P.mscale[0]};
  const MomentRef mom1{NM > 1 ? F : uint8_t(0), P.mdata[1], P.mscale[1]};
  uint64_t sr_key = kSR ? state_rounding_key(key, 0) : 0;
#if defined(__CUDA_ARCH__)
  if constexpr (kSR) asm volatile("" : "+l"(sr_key));  // once: not recomputed in each tile (29 instructions)
#endif
  for (int64_t t = t_from + warp; t < t_to; t += kWarps) {
    const int64_t tile_off = begin + t * kTile;
    const int64_t e0 = tile_off + lane * kElemsPerThread;
    Raw graw, praw, eraw, mraw, vraw;
    float mscale, vscale;
    zero(eraw);
    load_elems(graw, grad, wide, e0, 8, true);
    if constexpr (!muon) load_elems(praw, param, wide, e0, 8, true);
    if (ecc) load_bytes(eraw, ecc_bytes + e0, 8, 8);
    load_moment(mraw, mscale, mom0, e0, tile_off, 8, lane);
    load_moment(vraw, vscale, mom1, e0, tile_off, 8, lane);

    float g[8], p[8] = {}, m[8], v[8];
    tensor_to_float(PD, graw, g);
    if constexpr (!muon) param_to_float(p, PD, ecc, praw, eraw);
    decode_moment(m, F, mraw, mscale, smap[0]);
    decode_moment(v, mom1.format, vraw, vscale, smap[1]);
#pragma unroll
    for (int j = 0; j < 8; ++j) update_element<A>(s, p[j], g[j], m[j], v[j]);
    if constexpr (kSR)
      encode_store_sr(mom0, smap[0], m, e0, tile_off, lane, warp, sr_key);
    else
      encode_store_moment(mom0, smap[0], second0, m, e0, tile_off, 8, lane);
    // v: an unsigned map, for 4-bit the linear one (dispatch_fast checks)
    encode_store_moment<F == LOWBIT_STATE_4BIT ? kLinear16Map : kUnsignedMap>(mom1, smap[1], second1, v, e0, tile_off,
                                                                              8, lane);
    if constexpr (muon) {
      Raw r;
#pragma unroll
      for (int j = 0; j < 8; ++j) r.w[j] = float_bits(p[j]);
      store_elems(out, true, e0, 8, out_al16, r);
    } else {
      store_param(PD, rounding, param, ecc_bytes, true, p, e0, 8, key);
    }
  }
}

// The row of element e of a 2-D param with C columns, by a 32-bit division
// where every element index of the loop and C fit in 32 bits.
struct RowOf {
  int64_t C;
  bool narrow;
  __device__ __forceinline__ RowOf(int64_t cols, int64_t end)
      : C(cols), narrow(end <= int64_t(0xFFFFFFFFu) && cols <= int64_t(0xFFFFFFFFu)) {}
  __device__ __forceinline__ int64_t operator()(int64_t e) const {
    return narrow ? int64_t(uint32_t(e) / uint32_t(C)) : e / C;
  }
};

// The current and new rank-1 scales of a lane's 8 elements (q, c0 .. c0 + 7)
// of a 2-D param: as shaped_lane (the row's entry of r_0, 8 entries of r_1).
__device__ __forceinline__ void rank1_scales_2d(const float* vc, int64_t S, int64_t last, int64_t q, int64_t c0,
                                                float (&cur)[8], float (&nxt)[8]) {
  const float* vn = vc + S;
  const uint32_t rc = float_bits(vc[q]), rn = float_bits(vn[q]);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    cur[j] = bits_float(umin(rc, float_bits(vc[last + c0 + j])));
    nxt[j] = bits_float(umin(rn, float_bits(vn[last + c0 + j])));
  }
}

// Whole tiles of a 2-D param with rows a multiple of 8 long whose two moments
// are both of format F, each per block or rank-1 (at least one rank-1), with
// params and grads of dtype PD at 16-byte aligned bases (Adam, AdamW): a
// lane's 8 elements lie in one row. The generic loop's operations in the same
// order: the same bits.
template <Algo A, uint8_t PD, uint8_t F>
__device__ __forceinline__ void fast_rank1_tiles(const DevParam& P, const void* grad, const StepScalars& s,
                                                 uint64_t key, const QMap (&smap)[2], int64_t begin, int64_t t_from,
                                                 int64_t t_to, int lane, int warp) {
  constexpr bool wide = PD == kF32;
  const bool r1[2] = {P.norm[0] == uint8_t(Norm::Rank1), P.norm[1] == uint8_t(Norm::Rank1)};
  const bool ecc = !wide && P.rounding == kEcc;
  const bool second[2] = {(P.coding[0] & kCodeSecond) != 0, (P.coding[1] & kCodeSecond) != 0};
  const MomentRef mom[2] = {{F, P.mdata[0], r1[0] ? nullptr : P.mscale[0]},
                            {F, P.mdata[1], r1[1] ? nullptr : P.mscale[1]}};
  const int64_t C = P.shape.dim[1], last = P.shape.dim[0], S = last + C;
  const RowOf row_of(C, begin + t_to * kTile);
  for (int64_t t = t_from + warp; t < t_to; t += kWarps) {
    const int64_t tile_off = begin + t * kTile;
    const int64_t e0 = tile_off + lane * kElemsPerThread;
    Raw graw, praw, eraw, raw[2];
    float scale[2];
    zero(eraw);
    load_elems(graw, grad, wide, e0, 8, true);
    load_elems(praw, P.param, wide, e0, 8, true);
    if (ecc) load_bytes(eraw, P.ecc + e0, 8, 8);
#pragma unroll
    for (int k = 0; k < 2; ++k) load_moment(raw[k], scale[k], mom[k], e0, tile_off, 8, lane);
    const int64_t q = row_of(e0), c0 = e0 - q * C;

    float g[8], p[8], x[2][8], cur[2][8], nxt[2][8];
    tensor_to_float(PD, graw, g);
    param_to_float(p, PD, ecc, praw, eraw);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      decode_moment(x[k], F, raw[k], scale[k], smap[k]);
      if (r1[k]) {
        rank1_scales_2d(P.mscale[k], S, last, q, c0, cur[k], nxt[k]);
#pragma unroll
        for (int j = 0; j < 8; ++j) x[k][j] *= cur[k][j];
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) update_element<A>(s, p[j], g[j], x[0][j], x[1][j]);
    uint32_t c[8];
    if (r1[0]) {  // a rank-1 first moment
      rank1_codes<kAnyMap>(smap[0], second[0], x[0], nxt[0], c);
      store_codes(P.mdata[0], F == LOWBIT_STATE_4BIT, e0, 8, c);
    } else {
      encode_store_moment(mom[0], smap[0], second[0], x[0], e0, tile_off, 8, lane);
    }
    if (r1[1]) {
      rank1_codes<F == LOWBIT_STATE_4BIT ? kLinear16Map : kUnsignedMap>(smap[1], second[1], x[1], nxt[1], c);
      store_codes(P.mdata[1], F == LOWBIT_STATE_4BIT, e0, 8, c);
    } else {
      encode_store_moment<F == LOWBIT_STATE_4BIT ? kLinear16Map : kUnsignedMap>(mom[1], smap[1], second[1], x[1], e0,
                                                                                  tile_off, 8, lane);
    }
    store_param(PD, P.rounding, P.param, P.ecc, true, p, e0, 8, key);
  }
}

// Whole tiles of a 2-D param with rows a multiple of 8 long, m of format F
// per block and v factored (lpmm's 4-bit Factor), params and grads of dtype
// PD at 16-byte aligned bases (Adam, AdamW): a lane's 8 elements lie in one
// row, so v^ is one row factor times 8 column accumulators. The generic
// loop's operations in the same order: the same bits.
template <Algo A, uint8_t PD, uint8_t F>
__device__ __forceinline__ void fast_factored_tiles(const DevParam& P, const void* grad, const StepScalars& s,
                                                    uint64_t key, const QMap (&smap)[2], int64_t begin,
                                                    int64_t t_from, int64_t t_to, int lane, int warp) {
  constexpr bool wide = PD == kF32;
  const bool ecc = !wide && P.rounding == kEcc;
  const bool second0 = (P.coding[0] & kCodeSecond) != 0;
  const MomentRef mom0{F, P.mdata[0], P.mscale[0]};
  const int64_t C = P.shape.dim[1], rows = P.shape.dim[0];
  const float* f = static_cast<const float*>(P.mdata[1]);  // rows row accumulators, C columns, the mean
  const float mean = f[rows + C];
  const RowOf row_of(C, begin + t_to * kTile);
  for (int64_t t = t_from + warp; t < t_to; t += kWarps) {
    const int64_t tile_off = begin + t * kTile;
    const int64_t e0 = tile_off + lane * kElemsPerThread;
    Raw graw, praw, eraw, mraw;
    float mscale;
    zero(eraw);
    load_elems(graw, grad, wide, e0, 8, true);
    load_elems(praw, P.param, wide, e0, 8, true);
    if (ecc) load_bytes(eraw, P.ecc + e0, 8, 8);
    load_moment(mraw, mscale, mom0, e0, tile_off, 8, lane);
    const int64_t q = row_of(e0), c0 = e0 - q * C;

    float g[8], p[8], m[8], v[8];
    tensor_to_float(PD, graw, g);
    param_to_float(p, PD, ecc, praw, eraw);
    decode_moment(m, F, mraw, mscale, smap[0]);
    const float rf = mean > 0.f ? f[q] / mean : 0.f;  // factored_row_factor of a 2-D param
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = factored_v(rf, f[rows + c0 + j]);
#pragma unroll
    for (int j = 0; j < 8; ++j) factored_update<A>(s, p[j], g[j], m[j], v[j]);
    encode_store_moment(mom0, smap[0], second0, m, e0, tile_off, 8, lane);
    store_param(PD, P.rounding, P.param, P.ecc, true, p, e0, 8, key);
  }
}

// The fast loop for this parameter's dtype and format, if there is one; false
// when the generic loop must take the tiles.
template <Algo A>
__device__ __forceinline__ bool dispatch_fast(const DevParam& P, const DevDyn& dyn,
                                              const StepScalars& s, uint64_t key, const QMap (&smap)[2],
                                              int64_t begin, int64_t t_from, int64_t t_to, int lane, int warp) {
  constexpr int NM = kFastMoments<A>;
  if (P.num_moments != NM || !P.param_al16 || !dyn.grad_al16 || dyn.gdtype != P.pdtype) return false;
  // 4BIT_SR: a stochastic first moment in blocks has fast loops; a stochastic second moment takes the generic loop.
  const bool sr = (P.coding[0] & kCodeStochastic) != 0;
  if (NM > 1 && (P.coding[1] & kCodeStochastic)) return false;
  if (sr && (P.coding[0] & kCodeSecond)) return false;  // never: moment 0 is a first moment (sr_codes has no floor)
#define LOWBIT_FAST_CASE(loop, pd, f)                                                  \
  case (pd) * 8 + (f):                                                                 \
    loop<A, (pd), (f)>(P, dyn.grad, s, key, smap, begin, t_from, t_to, lane, warp);  \
    return true;
#define LOWBIT_FAST_SR_CASE(pd)                                                                           \
  case (pd) * 8 + LOWBIT_STATE_4BIT:                                                                      \
    fast_tiles<A, (pd), LOWBIT_STATE_4BIT, true>(P, dyn.grad, s, key, smap, begin, t_from, t_to, lane, warp); \
    return true;
  if constexpr (NM == 2) {
    const bool shaped = P.norm[0] != uint8_t(Norm::Block) || P.norm[1] != uint8_t(Norm::Block);
    if (shaped && sr) return false;  // m 4BIT_SR with a factored v: the generic loop
    if (shaped && (P.shape.ndim != 2 || P.shape.dim[1] % 8 != 0)) return false;
    if (P.norm[0] == uint8_t(Norm::Block) && P.norm[1] == uint8_t(Norm::Factored)) {  // lpmm's Factor
      switch (P.pdtype * 8 + P.format[0]) {
        LOWBIT_FAST_CASE(fast_factored_tiles, kBF16, LOWBIT_STATE_4BIT)
        LOWBIT_FAST_CASE(fast_factored_tiles, kBF16, LOWBIT_STATE_8BIT)
        LOWBIT_FAST_CASE(fast_factored_tiles, kF32, LOWBIT_STATE_4BIT)
        LOWBIT_FAST_CASE(fast_factored_tiles, kF32, LOWBIT_STATE_8BIT)
        default: return false;
      }
    }
    if (shaped) {  // rank-1 moments (lpmm's 4-bit v)
      if (P.norm[0] == uint8_t(Norm::Factored) || P.norm[1] == uint8_t(Norm::Factored) ||
          P.format[0] != LOWBIT_STATE_4BIT || P.format[1] != LOWBIT_STATE_4BIT || !smap[1].linear16)
        return false;
      switch (P.pdtype * 8 + LOWBIT_STATE_4BIT) {
        LOWBIT_FAST_CASE(fast_rank1_tiles, kBF16, LOWBIT_STATE_4BIT)
        LOWBIT_FAST_CASE(fast_rank1_tiles, kF32, LOWBIT_STATE_4BIT)
        default: return false;
      }
    }
  }
  if (P.norm[0] != uint8_t(Norm::Block)) return false;
  if (NM > 1 && (P.norm[1] != uint8_t(Norm::Block) || P.format[1] != P.format[0])) return false;
  // The second moment's codes take bucket_code_unsigned (its map has no negative value) or, 4-bit, linear16_code.
  if (NM > 1 && P.format[1] == LOWBIT_STATE_8BIT && !(smap[1].values[0] >= 0.f)) return false;
  if (NM > 1 && P.format[1] == LOWBIT_STATE_4BIT && !smap[1].linear16) return false;
  if (sr) {
    switch (P.pdtype * 8 + P.format[0]) {
      LOWBIT_FAST_SR_CASE(kBF16)
      LOWBIT_FAST_SR_CASE(kF32)
      default: return false;
    }
  }
  switch (P.pdtype * 8 + P.format[0]) {
    LOWBIT_FAST_CASE(fast_tiles, kBF16, LOWBIT_STATE_8BIT)
    LOWBIT_FAST_CASE(fast_tiles, kBF16, LOWBIT_STATE_4BIT)
    LOWBIT_FAST_CASE(fast_tiles, kBF16, LOWBIT_STATE_FP8)
    LOWBIT_FAST_CASE(fast_tiles, kBF16, LOWBIT_STATE_BF16)
    LOWBIT_FAST_CASE(fast_tiles, kBF16, LOWBIT_STATE_FP32)
    LOWBIT_FAST_CASE(fast_tiles, kF32, LOWBIT_STATE_8BIT)
    LOWBIT_FAST_CASE(fast_tiles, kF32, LOWBIT_STATE_4BIT)
    LOWBIT_FAST_CASE(fast_tiles, kF32, LOWBIT_STATE_FP32)
    default: return false;
  }
#undef LOWBIT_FAST_SR_CASE
#undef LOWBIT_FAST_CASE
}

// Muon's momentum step (its result to `out`, the param not read): whole tiles
// of an 8-bit, 4-bit or 4BIT_SR moment in blocks, with bf16 or fp32 grads at a
// 16-byte aligned base; false when the generic loop must take them.
__device__ __forceinline__ bool dispatch_fast_muon(const DevParam& P, const DevDyn& dyn, const StepScalars& s,
                                                   uint64_t key, const QMap (&smap)[2], float* out, int64_t begin,
                                                   int64_t t_from, int64_t t_to, int lane, int warp) {
  if (P.num_moments != 1 || !dyn.grad_al16 || P.norm[0] != uint8_t(Norm::Block)) return false;
  const bool al16 = (reinterpret_cast<uintptr_t>(out) & 15u) == 0;
  const int sr = (P.coding[0] & kCodeStochastic) != 0 ? 1 : 0;
  if (P.coding[0] & kCodeSecond) return false;  // never: Muon's momentum is a first moment
#define LOWBIT_MUON_CASE(gd, f, k)                                                                           \
  case (gd) * 16 + (f) * 2 + (k):                                                                            \
    fast_tiles<Algo::Muon, (gd), (f), (k) != 0>(P, dyn.grad, s, key, smap, begin, t_from, t_to, lane, warp, out, \
                                                 al16);                                                      \
    return true;
  switch (dyn.gdtype * 16 + P.format[0] * 2 + sr) {
    LOWBIT_MUON_CASE(kBF16, LOWBIT_STATE_8BIT, 0)
    LOWBIT_MUON_CASE(kBF16, LOWBIT_STATE_4BIT, 0)
    LOWBIT_MUON_CASE(kBF16, LOWBIT_STATE_4BIT, 1)
    LOWBIT_MUON_CASE(kF32, LOWBIT_STATE_8BIT, 0)
    LOWBIT_MUON_CASE(kF32, LOWBIT_STATE_4BIT, 0)
    LOWBIT_MUON_CASE(kF32, LOWBIT_STATE_4BIT, 1)
    default: return false;
  }
#undef LOWBIT_MUON_CASE
}

// ---- the kernel ----------------------------------------------------------------

// Resident blocks per SM the register budget is sized for (3: 80 registers
// per thread). LOWBIT_CUDA_STEP_MIN_BLOCKS (CMake) overrides it for
// benchmarking (bench/NOTES.md, "CUDA kernels").
#ifndef LOWBIT_STEP_MIN_BLOCKS
#define LOWBIT_STEP_MIN_BLOCKS 3
#endif

template <Algo A>
__global__ void __launch_bounds__(kThreads, LOWBIT_STEP_MIN_BLOCKS) step_kernel(const StepArgs args) {
  __shared__ QMap smap[2];
  __shared__ StepScalars sscalars;
  __shared__ uint64_t skey;
  __shared__ DevParam sparam;

  if (args.skip_flag && *static_cast<const volatile int32_t*>(args.skip_flag) != 0) return;
  const DevChunk ch = args.chunks[blockIdx.x / kSplit];
  const int part = int(blockIdx.x % kSplit);
  const DevDyn dyn = args.dyn[ch.param];
  if (dyn.grad == nullptr) return;
  const int64_t ntiles = (ch.end - ch.begin + kTile - 1) / kTile;
  const int64_t t_begin = ntiles * part / kSplit, t_end = ntiles * (part + 1) / kSplit;
  if (t_begin >= t_end) return;  // all exits so far are uniform over the block
  const DevParam* Pg = args.params + ch.param;
  // The parameter's fields go to shared memory once per block: a copy per
  // thread would live in local memory (it is indexed at run time).
  if (threadIdx.x < sizeof(DevParam) / 4)
    reinterpret_cast<uint32_t*>(&sparam)[threadIdx.x] = __ldg(reinterpret_cast<const uint32_t*>(Pg) + threadIdx.x);

#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const uint8_t id = Pg->map[k];
    if (k < Pg->num_moments && Pg->format[k] == LOWBIT_STATE_FP8) {
      // An FP8 moment decodes through the table of its 256 values (a shared-memory load instead of
      // e4m3_to_float's branches; the same values).
      smap[k].values[threadIdx.x] = e4m3_to_float(uint8_t(threadIdx.x));
      static_assert(kThreads == 256, "one e4m3 code per thread");
      continue;
    }
    if (k >= Pg->num_moments || id == kNoMap) continue;
    const QMap& src = args.maps->map[id];
    const int n = __ldg(&src.n);
    // The code search reads the bucket tables and the midpoints up to index
    // n (+Inf from n - 1 on); decoding reads the n values.
    if (threadIdx.x == 0) {
      smap[k].n = n;
      smap[k].zero_code = __ldg(&src.zero_code);
      smap[k].linear16 = __ldg(&src.linear16);
    }
    for (int i = threadIdx.x; i <= n; i += kThreads) {  // midpoints[n] (+Inf) too: bucket_code_finite
      if (i < n) smap[k].values[i] = __ldg(&src.values[i]);
      smap[k].midpoints[i] = __ldg(&src.midpoints[i]);
    }
    const uint32_t* from = reinterpret_cast<const uint32_t*>(&src.below[0][0]);
    uint32_t* to = reinterpret_cast<uint32_t*>(&smap[k].below[0][0]);
    for (int i = threadIdx.x; i < int(sizeof(src.below) / 4); i += kThreads) to[i] = __ldg(from + i);
  }
  if (threadIdx.x == 0) {
    sscalars = args.scalars[dyn.scalar_idx];
    skey = dyn.key;
  }
  __syncthreads();
  const StepScalars s = sscalars;
  const uint64_t key = skey;
  const DevParam& P = sparam;

  // Rank-1 moments load codes without a block scale; a factored one is not loaded at all.
  const bool r1m = P.num_moments > 0 && P.norm[0] == uint8_t(Norm::Rank1);
  const bool r1v = P.num_moments > 1 && P.norm[1] == uint8_t(Norm::Rank1);
  const bool fac = P.num_moments > 1 && P.norm[1] == uint8_t(Norm::Factored);
  const MomentRef mom0{P.num_moments > 0 ? P.format[0] : uint8_t(0), P.mdata[0], r1m ? nullptr : P.mscale[0]};
  const MomentRef mom1{P.num_moments > 1 && !fac ? P.format[1] : uint8_t(0), P.mdata[1], r1v ? nullptr : P.mscale[1]};
  const bool ecc = P.pdtype != kF32 && P.rounding == kEcc;
  const int lane = int(threadIdx.x & 31u);
  const int warp = int(threadIdx.x >> 5);

  // Whole tiles go to the fast loop where the parameter has one; the rest
  // (a chunk's partial last tile, shaped moments, mixed dtypes or formats,
  // unaligned bases) to the generic loop.
  int64_t t_generic = t_begin;
  const int64_t whole_tiles = (ch.end - ch.begin) / kTile;
  const int64_t t_whole = whole_tiles < t_end ? whole_tiles : t_end;
  if constexpr (A == Algo::Muon) {  // Muon's output is not the param
    if (t_whole > t_begin && dispatch_fast_muon(P, dyn, s, key, smap, args.out + args.flat[ch.param].offset, ch.begin,
                                                t_begin, t_whole, lane, warp))
      t_generic = t_whole;
  } else if constexpr (kFastLoops<A>) {
    if (t_whole > t_begin && dispatch_fast<A>(P, dyn, s, key, smap, ch.begin, t_begin, t_whole, lane, warp))
      t_generic = t_whole;
  }

  for (int64_t t = t_generic + warp; t < t_end; t += kWarps) {
    const int64_t tile_off = ch.begin + t * kTile;
    const int64_t e0 = tile_off + lane * kElemsPerThread;
    const int64_t left = ch.end - e0;
    const int n = left >= 8 ? 8 : (left > 0 ? int(left) : 0);

    // Loads of the whole tile first.
    Raw graw, praw, eraw, mraw, vraw;
    float mscale, vscale;
    zero(graw);
    zero(praw);
    zero(eraw);
    load_elems(graw, dyn.grad, dyn.gdtype == kF32, e0, n, dyn.grad_al16);
    if constexpr (!kFlatOut<A>) {  // Muon's and LAMB's steps read no param (their p is an output)
      load_elems(praw, P.param, P.pdtype == kF32, e0, n, P.param_al16);
      if (ecc && n > 0) load_bytes(eraw, P.ecc + e0, n, 8);
    }
    load_moment(mraw, mscale, mom0, e0, tile_off, n, lane);
    load_moment(vraw, vscale, mom1, e0, tile_off, n, lane);

    float g[8], p[8], m[8], v[8];
    tensor_to_float(dyn.gdtype, graw, g);
    param_to_float(p, P.pdtype, ecc, praw, eraw);
    decode_moment(m, mom0.format, mraw, mscale, smap[0]);
    decode_moment(v, mom1.format, vraw, vscale, smap[1]);

    float mcur[8], mnew[8], vcur[8], vnew[8];
    if (r1m) {
      shaped_lane(P, 0, e0, n, mcur, mnew);
#pragma unroll
      for (int j = 0; j < 8; ++j) m[j] *= mcur[j];
    }
    if (r1v || fac) {
      shaped_lane(P, 1, e0, n, vcur, vnew);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = fac ? vcur[j] : v[j] * vcur[j];
    }

    if (fac) {
#pragma unroll
      for (int j = 0; j < 8; ++j) factored_update<A>(s, p[j], g[j], m[j], v[j]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) update_element<A>(s, p[j], g[j], m[j], v[j]);
    }

    const bool second0 = (P.coding[0] & kCodeSecond) != 0, second1 = (P.coding[1] & kCodeSecond) != 0;
    if (r1m)
      encode_store_rank1(mom0, smap[0], second0, m, mnew, e0, n);
    else
      encode_store_moment(mom0, smap[0], second0, m, e0, tile_off, n, lane, (P.coding[0] & kCodeStochastic) != 0,
                          state_rounding_key(key, 0));
    if (r1v)
      encode_store_rank1(mom1, smap[1], second1, v, vnew, e0, n);
    else
      encode_store_moment(mom1, smap[1], second1, v, e0, tile_off, n, lane, (P.coding[1] & kCodeStochastic) != 0,
                          state_rounding_key(key, 1));
    if constexpr (kFlatOut<A>) {
      float* out = args.out + args.flat[ch.param].offset;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (j < n) out[e0 + j] = p[j];
    } else {
      store_param(P, p, e0, n, key);
    }
  }
}

}  // namespace cuda
}  // namespace lowbit
