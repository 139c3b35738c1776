// The AVX-512 form of a step's 4BIT_SR encoding (codec.cpp
// encode_moment_tile_stochastic) for whole 256-element tiles: the portable
// rule's bits (quant.hpp stochastic_code16, rounding.hpp state_bits) with the
// count of decoded values <= x found by a branch-free binary search over a
// register of the 16 decoded values and the neighbours by permutes, instead
// of 32 compares and selects per element. A tile with a block whose absmax is
// not finite (its decoded values are not sorted) is left to the portable rule.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "codec_avx512.hpp"
#include "quant.hpp"
#include "rounding.hpp"

namespace lowbit {

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

// state_bits(key, first + j) for 16 consecutive elements (first + 16 <= a
// multiple of 2^32 boundary never crossed inside a tile).
inline __m512i bits16(uint64_t key, int64_t first) {
  const uint32_t lo = uint32_t(uint64_t(first)), hi = uint32_t(uint64_t(first) >> 32);
  __m512i i = _mm512_add_epi32(_mm512_set1_epi32(int(lo)), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                                                              13, 14, 15));
  __m512i h = _mm512_add_epi32(_mm512_mullo_epi32(i, _mm512_set1_epi32(int(0x9E3779B1u))),
                               _mm512_set1_epi32(int(uint32_t(key) + hi * 0x85EBCA77u)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(int(0x85EBCA6Bu)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(int(0xC2B2AE35u)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  return _mm512_xor_si512(h, _mm512_set1_epi32(int(uint32_t(key >> 32))));
}

// One block with a finite absmax.
void encode_block_sr(const QMap& map, bool second, const float* x, float absmax, uint8_t* packed, float* scale,
                     uint64_t key, int64_t first) {
  *scale = absmax;
  float decoded[16];
  decoded_values16(map, absmax, decoded);
  const int zero = floor_positive_code(map, second);
  const __m512 dec = _mm512_loadu_ps(decoded);
  const __m512i one = _mm512_set1_epi32(1), fifteen = _mm512_set1_epi32(15);
#pragma GCC unroll 8  // eight independent chains of dependent permutes
  for (int v = 0; v < 8; ++v) {
    const __m512 xv = _mm512_loadu_ps(x + 16 * v);
    // count of decoded values <= x: the upper bound by binary search, then the last one
    __m512i pos = _mm512_setzero_si512();
    for (int step = 8; step >= 1; step >>= 1) {
      const __m512 cand = _mm512_permutexvar_ps(_mm512_add_epi32(pos, _mm512_set1_epi32(step - 1)), dec);
      pos = _mm512_mask_add_epi32(pos, _mm512_cmp_ps_mask(cand, xv, _CMP_LE_OQ), pos, _mm512_set1_epi32(step));
    }
    const __m512i count =
        _mm512_mask_add_epi32(pos, _mm512_cmp_ps_mask(_mm512_permutexvar_ps(pos, dec), xv, _CMP_LE_OQ), pos, one);
    const __mmask16 inside =
        _mm512_cmpgt_epi32_mask(count, _mm512_setzero_si512()) & _mm512_cmplt_epi32_mask(count, _mm512_set1_epi32(16));
    const __m512i lo = _mm512_max_epi32(_mm512_sub_epi32(count, one), _mm512_setzero_si512());
    const __m512 a = _mm512_permutexvar_ps(lo, dec);
    const __m512 b = _mm512_permutexvar_ps(_mm512_min_epi32(_mm512_add_epi32(lo, one), fifteen), dec);
    const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(bits16(key, first + 16 * v), 8)),
                                   _mm512_set1_ps(5.9604644775390625e-8f));
    const __mmask16 up = inside & _mm512_cmp_ps_mask(_mm512_mul_ps(u, _mm512_sub_ps(b, a)), _mm512_sub_ps(xv, a),
                                                     _CMP_LT_OQ);
    __m512i code = _mm512_mask_add_epi32(lo, up, lo, one);
    const __mmask16 number = _mm512_cmple_epu32_mask(_mm512_and_si512(_mm512_castps_si512(xv),
                                                                       _mm512_set1_epi32(0x7FFFFFFF)),
                                                     _mm512_set1_epi32(0x7F800000));
    code = _mm512_maskz_mov_epi32(number, code);
    const __mmask16 floor = _mm512_cmpeq_epi32_mask(code, _mm512_set1_epi32(zero)) &
                            _mm512_cmp_ps_mask(xv, _mm512_setzero_ps(), _CMP_GT_OQ);
    code = _mm512_mask_add_epi32(code, floor, code, one);
    // pairs: the odd lane's code into bits 4..7 of the even lane's byte
    const __m512i pairs = _mm512_or_si512(code, _mm512_srli_epi64(code, 28));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(packed + 8 * v), _mm512_cvtepi64_epi8(pairs));
  }
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
  for (int k = 0; k < kTile / kBlock4; ++k) {
    const int b = k * kBlock4;
    encode_block_sr(*mv.map, mv.second, in + b, absmax[k], c + b / 2, &mv.scales[(base + b) / kBlock4], key, base + b);
  }
  return true;
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace lowbit
