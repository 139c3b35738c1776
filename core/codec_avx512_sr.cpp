// The AVX-512 form of a step's 4BIT_SR encoding (codec.cpp
// encode_moment_tile_stochastic) for whole 256-element tiles: the portable
// rule's bits (quant.hpp stochastic_code16, rounding.hpp state_bits) with the
// count of decoded values <= x found by a branch-free binary search over a
// register of the 16 decoded values and the neighbours by permutes, instead
// of 32 compares and selects per element. A tile with a block whose absmax is
// not finite (its decoded values are not sorted) is left to the portable rule.
#include "codec_avx512.hpp"

#include <cmath>

#include "quant.hpp"
#include "rounding.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(LOWBIT_NO_CLONES)
#include <immintrin.h>

#include "codec_avx512_pack4.hpp"
#define LOWBIT_AVX512_SR 1
#endif

namespace lowbit {

#ifndef LOWBIT_AVX512_SR

bool avx512_encode_tile_sr(const MomentView&, int64_t, const float*, uint64_t) { return false; }

#else

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

// The block's absmax as block_absmax computes it: the largest |x| bits as an
// integer (a NaN wins).
inline float absmax128(const float* x) {
  const __m512i mask = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i m = _mm512_setzero_si512();
  for (int v = 0; v < 8; ++v) m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_loadu_si512(x + 16 * v), mask));
  return bits_float(uint32_t(_mm512_reduce_max_epu32(m)));
}

// state_bits(key, first + j) >> 8 for j = 16 v + lane of a block whose first
// element is `first` (no multiple of 2^32 lies inside a tile): the index's
// product with the odd constant is linear in the lane, so each vector's first
// step is one add, then murmur3's finaliser.
struct BlockBits {
  __m512i start;  // lane j: state_bits' first sum at element first + j
  __m512i high;   // the key's high half >> 8
  BlockBits(uint64_t key, int64_t first) {
    const uint32_t lo = uint32_t(uint64_t(first)), hi = uint32_t(uint64_t(first) >> 32);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    start = _mm512_add_epi32(_mm512_mullo_epi32(lane, _mm512_set1_epi32(int(0x9E3779B1u))),
                             _mm512_set1_epi32(int(lo * 0x9E3779B1u + uint32_t(key) + hi * 0x85EBCA77u)));
    high = _mm512_set1_epi32(int(uint32_t(key >> 32) >> 8));
  }
  __m512i top24(int v) const {
    __m512i h = _mm512_add_epi32(start, _mm512_set1_epi32(int(uint32_t(16 * v) * 0x9E3779B1u)));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32(int(0x85EBCA6Bu)));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32(int(0xC2B2AE35u)));
    // ((h ^ h >> 16) ^ key_hi) >> 8 = h >> 8 ^ h >> 24 ^ key_hi >> 8
    return _mm512_ternarylogic_epi32(_mm512_srli_epi32(h, 8), _mm512_srli_epi32(h, 24), high, 0x96);
  }
};

// One block with a finite absmax (so no NaN element). With q = (count of
// decoded values <= x) - 1, found by a binary search whose tables are the
// decoded values shifted by the level's step (lane 15, read at q = -1, holds
// decoded[step - 1]), the neighbours are a = decoded[q] and b = decoded[q + 1]
// and the code is q + (u (b - a) < x - a): -1 when x is below every decoded
// value, which the pack's unsigned saturation stores as 0, and 15 when x is at
// or above the largest value (the last compare).
template <bool kFloor>
void encode_block_sr(const QMap& map, int zero, const float* x, float absmax, uint8_t* packed, float* scale,
                     uint64_t key, int64_t first) {
  *scale = absmax;
  float decoded[16];
  decoded_values16(map, absmax, decoded);
  const __m512 dec = _mm512_loadu_ps(decoded);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i fifteen = _mm512_set1_epi32(15), one = _mm512_set1_epi32(1);
  // at(s)[j] = decoded[min(j + 1 + s - 1, 15)] with j + 1 taken mod 16 (q = -1 reads lane 15)
  auto shifted = [&](int s) {
    const __m512i next = _mm512_and_si512(_mm512_add_epi32(lane, one), fifteen);
    return _mm512_permutexvar_ps(_mm512_min_epi32(_mm512_add_epi32(next, _mm512_set1_epi32(s - 1)), fifteen), dec);
  };
  const __m512 at4 = shifted(4), at2 = shifted(2), above = shifted(1);
  const __m512 mid = _mm512_set1_ps(decoded[7]);
  const BlockBits bits(key, first);
  __m512i code[8];
#pragma GCC unroll 8  // eight independent chains of dependent permutes
  for (int v = 0; v < 8; ++v) {
    const __m512 xv = _mm512_loadu_ps(x + 16 * v);
    __m512i q = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(mid, xv, _CMP_LE_OQ), _mm512_set1_epi32(-1),
                                        _mm512_set1_epi32(7));
    q = _mm512_mask_add_epi32(q, _mm512_cmp_ps_mask(_mm512_permutexvar_ps(q, at4), xv, _CMP_LE_OQ), q,
                              _mm512_set1_epi32(4));
    q = _mm512_mask_add_epi32(q, _mm512_cmp_ps_mask(_mm512_permutexvar_ps(q, at2), xv, _CMP_LE_OQ), q,
                              _mm512_set1_epi32(2));
    q = _mm512_mask_add_epi32(q, _mm512_cmp_ps_mask(_mm512_permutexvar_ps(q, above), xv, _CMP_LE_OQ), q, one);
    const __m512 b = _mm512_permutexvar_ps(q, above), a = _mm512_permutexvar_ps(q, dec);
    const __mmask16 top = _mm512_cmp_ps_mask(b, xv, _CMP_LE_OQ);  // x >= decoded[15] (q = 14)
    const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(bits.top24(v)), _mm512_set1_ps(5.9604644775390625e-8f));
    const __mmask16 up =
        _mm512_cmp_ps_mask(_mm512_mul_ps(u, _mm512_sub_ps(b, a)), _mm512_sub_ps(xv, a), _CMP_LT_OQ) | top;
    code[v] = _mm512_mask_add_epi32(q, up, q, one);
    if constexpr (kFloor)
      code[v] = _mm512_mask_add_epi32(code[v], _mm512_cmpeq_epi32_mask(code[v], _mm512_set1_epi32(zero)) &
                                                   _mm512_cmp_ps_mask(xv, _mm512_setzero_ps(), _CMP_GT_OQ),
                                      code[v], one);
  }
  avx512::store_packed4_block(code, packed);
}

}  // namespace

bool avx512_encode_tile_sr(const MomentView& mv, int64_t base, const float* in, uint64_t key) {
  if (mv.format != LOWBIT_STATE_4BIT || (base & 1) != 0) return false;
  float absmax[kTile / kBlock4];
  for (int k = 0; k < kTile / kBlock4; ++k) {
    absmax[k] = absmax128(in + k * kBlock4);
    if (!std::isfinite(absmax[k])) return false;
  }
  uint8_t* c = static_cast<uint8_t*>(mv.data) + base / 2;
  const int zero = floor_positive_code(*mv.map, mv.second);
  for (int k = 0; k < kTile / kBlock4; ++k) {
    const int b = k * kBlock4;
    float* scale = &mv.scales[(base + b) / kBlock4];
    if (zero >= 0)
      encode_block_sr<true>(*mv.map, zero, in + b, absmax[k], c + b / 2, scale, key, base + b);
    else
      encode_block_sr<false>(*mv.map, zero, in + b, absmax[k], c + b / 2, scale, key, base + b);
  }
  return true;
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

#endif

}  // namespace lowbit
