#include "codec_avx512.hpp"

#include "cpu_features.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "codec_tables.hpp"
#include "qmaps.hpp"
#include "quant.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(LOWBIT_NO_CLONES)
#include <immintrin.h>

#include "codec_avx512_pack4.hpp"
#define LOWBIT_AVX512_CODEC 1
#endif

namespace lowbit {

#ifndef LOWBIT_AVX512_CODEC

bool avx512_codec_supported() { return false; }
bool avx512_direct8_active() { return false; }
bool avx512_decode_tile(const MomentView&, int64_t, float*) { return false; }
bool avx512_encode_tile(const MomentView&, int64_t, const float*) { return false; }
int avx512_decode_rank1(const MomentView&, int64_t, int, const float*, float*) { return 0; }
int avx512_encode_rank1(const MomentView&, int64_t, int, const float*, const float*) { return 0; }

#else

using simd_tables::BytePlanes;
using simd_tables::Direct8;
using simd_tables::kDirectMargin;
using simd_tables::kFirstBinade;
using simd_tables::Search4;
using simd_tables::Search8;
using simd_tables::Tables;
using simd_tables::map_index;
using simd_tables::tables;

bool avx512_codec_supported() { return cpu_features().avx512vbmi; }

bool avx512_direct8_active() { return avx512_codec_supported() && tables().direct8[0].usable && tables().direct8[1].usable; }

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")
// GCC 12 warns inside its own intrinsics headers (_mm512_undefined_*).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

// A BytePlanes table in registers: the 16 plane quarters and the order.
struct PlaneRegs {
  __m512i p[4][4];
  __m512i order;
  explicit PlaneRegs(const BytePlanes& bp) {
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 4; ++j) p[k][j] = _mm512_load_si512(bp.plane[k] + 64 * j);
    order = _mm512_load_si512(bp.order);
  }
};

// 64 codes -> table[code], in input order: v[r] holds codes 16 r .. 16 r + 15.
inline void lookup64(const PlaneRegs& r, const uint8_t* codes, __m512 (&v)[4]) {
  const __m512i idx = _mm512_permutexvar_epi8(r.order, _mm512_loadu_si512(codes));
  const __mmask64 high = _mm512_movepi8_mask(idx);  // code >= 128: the second half of the table
  __m512i b[4];
  for (int k = 0; k < 4; ++k)
    b[k] = _mm512_mask_blend_epi8(high, _mm512_permutex2var_epi8(r.p[k][0], idx, r.p[k][1]),
                                  _mm512_permutex2var_epi8(r.p[k][2], idx, r.p[k][3]));
  const __m512i lo01 = _mm512_unpacklo_epi8(b[0], b[1]), hi01 = _mm512_unpackhi_epi8(b[0], b[1]);
  const __m512i lo23 = _mm512_unpacklo_epi8(b[2], b[3]), hi23 = _mm512_unpackhi_epi8(b[2], b[3]);
  v[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(lo01, lo23));
  v[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(lo01, lo23));
  v[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(hi01, hi23));
  v[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(hi01, hi23));
}

// 256 codes -> table[code] * scale, 64 at a time.
void decode_planes(const BytePlanes& bp, const uint8_t* codes, float scale, float* out) {
  const PlaneRegs r(bp);
  const __m512 s = _mm512_set1_ps(scale);
  for (int i = 0; i < kTile; i += 64) {
    __m512 v[4];
    lookup64(r, codes + i, v);
    for (int q = 0; q < 4; ++q) _mm512_storeu_ps(out + i + 16 * q, _mm512_mul_ps(v[q], s));
  }
}

// max |x| over n (a multiple of 16) elements, on the bits (as block_absmax).
float absmax_bits(const float* x, int n) {
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i a = _mm512_setzero_si512();
  for (int i = 0; i < n; i += 16) a = _mm512_max_epu32(a, _mm512_and_si512(_mm512_loadu_si512(x + i), magnitude));
  return bits_float(_mm512_reduce_max_epu32(a));
}

// normalize(): x / absmax, or 0 for every element when absmax is not > 0.
inline __m512 normalized(const float* x, float absmax) {
  return absmax > 0.f ? _mm512_div_ps(_mm512_loadu_ps(x), _mm512_set1_ps(absmax)) : _mm512_setzero_ps();
}

// floor_positive() (and floor_positive_e4m3(), with zero code 0): a positive
// second moment never takes the code of 0. A positive x has a code >=
// zero_code, so bumping zero_code to zero_code + 1 is a max.
inline __m512i floor_positive16(__m512i c, __m512 x, int zero_code) {
  if (zero_code < 0) return c;
  return _mm512_mask_max_epi32(c, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ), c, _mm512_set1_epi32(zero_code + 1));
}

struct Search8Regs {
  __m512 t64, t32, t16, t8, t4[2], t2[4], t1[8], m127;
  explicit Search8Regs(const Search8& s) {
    t64 = _mm512_load_ps(s.t64), t32 = _mm512_load_ps(s.t32), t16 = _mm512_load_ps(s.t16), t8 = _mm512_load_ps(s.t8);
    for (int k = 0; k < 2; ++k) t4[k] = _mm512_load_ps(s.t4 + 16 * k);
    for (int k = 0; k < 4; ++k) t2[k] = _mm512_load_ps(s.t2 + 16 * k);
    for (int k = 0; k < 8; ++k) t1[k] = _mm512_load_ps(s.t1 + 16 * k);
    m127 = _mm512_set1_ps(s.m127);
  }
};

// nearest_code() on kLanes x 16 lanes: the binary search, each level's
// candidates picked by permutes. x > mid is an ordered compare, so NaN lanes
// get 0. The levels of one vector form a chain of dependent permutes and
// compares; kLanes independent vectors in lockstep keep the units busy.
constexpr int kLanes = 8;

inline __m512 level1_candidates(const Search8Regs& r, __m512i idx) {
  const __mmask16 b5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32));
  const __mmask16 b6 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(64));
  const __m512 a = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(r.t1[0], idx, r.t1[1]),
                                        _mm512_permutex2var_ps(r.t1[2], idx, r.t1[3]));
  const __m512 b = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(r.t1[4], idx, r.t1[5]),
                                        _mm512_permutex2var_ps(r.t1[6], idx, r.t1[7]));
  return _mm512_mask_blend_ps(b6, a, b);
}

inline __m512 level2_candidates(const Search8Regs& r, __m512i idx) {
  const __mmask16 b5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32));
  return _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(r.t2[0], idx, r.t2[1]),
                              _mm512_permutex2var_ps(r.t2[2], idx, r.t2[3]));
}

template <int L>
inline void search8(const Search8Regs& r, const __m512 (&x)[L], __m512i (&pos)[L]) {
  for (int k = 0; k < L; ++k)
    pos[k] = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(x[k], r.m127, _CMP_GT_OQ), _mm512_set1_epi32(128));
  auto advance = [&](int k, int step, __m512 candidate) {
    pos[k] = _mm512_mask_add_epi32(pos[k], _mm512_cmp_ps_mask(x[k], candidate, _CMP_GT_OQ), pos[k], _mm512_set1_epi32(step));
  };
  for (int k = 0; k < L; ++k) advance(k, 64, _mm512_permutexvar_ps(_mm512_srli_epi32(pos[k], 7), r.t64));
  for (int k = 0; k < L; ++k) advance(k, 32, _mm512_permutexvar_ps(_mm512_srli_epi32(pos[k], 6), r.t32));
  for (int k = 0; k < L; ++k) advance(k, 16, _mm512_permutexvar_ps(_mm512_srli_epi32(pos[k], 5), r.t16));
  for (int k = 0; k < L; ++k) advance(k, 8, _mm512_permutexvar_ps(_mm512_srli_epi32(pos[k], 4), r.t8));
  for (int k = 0; k < L; ++k) advance(k, 4, _mm512_permutex2var_ps(r.t4[0], _mm512_srli_epi32(pos[k], 3), r.t4[1]));
  for (int k = 0; k < L; ++k) advance(k, 2, level2_candidates(r, _mm512_srli_epi32(pos[k], 2)));
  for (int k = 0; k < L; ++k) advance(k, 1, level1_candidates(r, _mm512_srli_epi32(pos[k], 1)));
}

// floored: level 0 (0 < y <= the first positive midpoint) counts 1 instead of
// 0 (its line t = 0.5, top 1), which is floor_positive() of an unsigned map
// for every y > 0; direct_codes8 zeroes the lanes that are not > 0.
struct Direct8Regs {
  __m512 bound_lo, bound_hi, a, c;
  __m512i level_lo, level_hi, top;
  Direct8Regs(const Direct8& d, bool floored) {
    bound_lo = _mm512_load_ps(d.bound), bound_hi = _mm512_load_ps(d.bound + 16);
    level_lo = _mm512_load_si512(d.level_at), level_hi = _mm512_load_si512(d.level_at + 16);
    a = _mm512_load_ps(d.a), c = _mm512_load_ps(d.c), top = _mm512_load_si512(d.top);
    if (floored) {
      c = _mm512_mask_mov_ps(c, 1, _mm512_set1_ps(0.5f));
      top = _mm512_mask_mov_epi32(top, 1, _mm512_set1_epi32(1));
    }
  }
};

// direct8_count() on L vectors, as codes: zero_code + count for q >= 0,
// zero_code - min(count, zero_code) for q < 0 (the negative midpoints mirror
// the positive ones). Lanes it defers (near a midpoint, on a boundary, NaN)
// take the search, whole vectors at a time, rarely. An unsigned map
// (zero_code 0) gives every q < 0 the code 0, so its boundaries need no tie
// check (q > midpoint is exact). kFloored (unsigned only, with floored
// registers): the codes of a second moment, floor_positive() included.
template <int L, bool kSigned, bool kFloored = false>
inline void direct_codes8(const Direct8Regs& r, const Search8& search, int zero_code, const __m512 (&xn)[L], __m512i (&c)[L]) {
  static_assert(!(kSigned && kFloored), "the floored form is for unsigned maps");
  const __m512i zc = _mm512_set1_epi32(zero_code);
  __mmask16 defer[L];
  for (int k = 0; k < L; ++k) {
    const __m512i bits = _mm512_castps_si512(xn[k]);
    const __m512i ybits = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
    const __m512 y = _mm512_castsi512_ps(ybits);
    // The binade's table index: exponent - 96, or 0 below (a saturating
    // subtract on the low halfword, where the exponent sits). y <= 1 or NaN,
    // so the exponent never passes 127 but for NaN, whose lanes defer.
    const __m512i binade = _mm512_subs_epu16(_mm512_srli_epi32(ybits, 23), _mm512_set1_epi32(kFirstBinade));
    const __m512 bound = _mm512_permutex2var_ps(r.bound_lo, binade, r.bound_hi);
    const __m512i level0 = _mm512_permutex2var_epi32(r.level_lo, binade, r.level_hi);
    const __m512i level = _mm512_mask_add_epi32(level0, _mm512_cmp_ps_mask(y, bound, _CMP_GT_OQ), level0, _mm512_set1_epi32(1));
    const __m512 t = _mm512_fmadd_ps(y, _mm512_permutexvar_ps(level, r.a), _mm512_permutexvar_ps(level, r.c));
    const __m512i count = _mm512_min_epi32(_mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC),
                                           _mm512_permutexvar_epi32(level, r.top));
    const __m512 frac = _mm512_reduce_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);  // t - nearest integer
    defer[k] = _mm512_cmp_ps_mask(_mm512_abs_ps(frac), _mm512_set1_ps(kDirectMargin), _CMP_NGE_UQ);
    if (kSigned) {
      defer[k] |= _mm512_cmp_ps_mask(y, bound, _CMP_EQ_OQ);
      c[k] = _mm512_mask_sub_epi32(_mm512_add_epi32(zc, count), _mm512_movepi32_mask(bits), zc, _mm512_min_epi32(count, zc));
    } else if (kFloored) {
      c[k] = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(xn[k], _mm512_setzero_ps(), _CMP_GT_OQ), count);
    } else {
      c[k] = _mm512_maskz_mov_epi32(_mm512_testn_epi32_mask(bits, _mm512_set1_epi32(int(0x80000000u))), count);
    }
  }
  for (int k = 0; k < L; ++k)
    if (defer[k]) {
      const Search8Regs sr(search);
      __m512i exact[1];
      search8<1>(sr, {xn[k]}, exact);
      if (kFloored) exact[0] = floor_positive16(exact[0], xn[k], zero_code);
      c[k] = _mm512_mask_blend_epi32(defer[k], c[k], exact[0]);
    }
}

// How a map's 8-bit codes are computed: the search, or the direct form for a
// signed map, an unsigned one, or an unsigned one with floor_positive() built
// in (a second moment).
enum class Form8 { Search, Signed, Unsigned, Floored };

inline Form8 form8(const Direct8& direct, int zero_code, bool second) {
  if (!direct.usable) return Form8::Search;
  if (zero_code > 0) return Form8::Signed;
  return second ? Form8::Floored : Form8::Unsigned;
}

// f(form) with the form as a compile-time constant (std::integral_constant).
template <class Fn>
inline void with_form8(Form8 form, Fn&& f) {
  switch (form) {
    case Form8::Search: return f(std::integral_constant<Form8, Form8::Search>{});
    case Form8::Signed: return f(std::integral_constant<Form8, Form8::Signed>{});
    case Form8::Unsigned: return f(std::integral_constant<Form8, Form8::Unsigned>{});
    case Form8::Floored: return f(std::integral_constant<Form8, Form8::Floored>{});
  }
}

// The 8-bit codes of L vectors of normalised values, floor_positive for a
// second moment, into codes[0, 16 L).
template <int L, Form8 F>
inline void store8(const Direct8& direct, const Search8& search, int zero_code, bool second, const __m512 (&xn)[L],
                   uint8_t* codes) {
  __m512i c[L];
  if (F == Form8::Search)
    search8<L>(Search8Regs(search), xn, c);
  else
    direct_codes8<L, F == Form8::Signed, F == Form8::Floored>(Direct8Regs(direct, F == Form8::Floored), search,
                                                               zero_code, xn, c);
  for (int k = 0; k < L; ++k) {
    if (second && F != Form8::Floored) c[k] = floor_positive16(c[k], xn[k], zero_code);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 16 * k), _mm512_cvtepi32_epi8(c[k]));
  }
}

template <int L>
inline void search_store8(const Direct8& direct, const Search8& search, int zero_code, bool second, const __m512 (&xn)[L],
                          uint8_t* codes) {
  with_form8(form8(direct, zero_code, second),
             [&](auto form) { store8<L, form()>(direct, search, zero_code, second, xn, codes); });
}

// L vectors at a time: the search's levels form long dependency chains that
// 8 vectors in lockstep hide; the direct form has short ones, and 4 keep its
// temporaries in registers.
template <int L, Form8 F>
void encode8_groups(const Search8& search, const Direct8& direct, int zero_code, bool second, const float* x, float absmax,
                    uint8_t* codes) {
  for (int i = 0; i < kBlock8; i += 16 * L) {
    __m512 xn[L];
    for (int k = 0; k < L; ++k) xn[k] = normalized(x + i + 16 * k, absmax);
    store8<L, F>(direct, search, zero_code, second, xn, codes + i);
  }
}

void encode8(const Search8& search, const Direct8& direct, int zero_code, bool second, const float* x, uint8_t* codes,
             float* scale) {
  const float absmax = absmax_bits(x, kBlock8);
  *scale = absmax;
  with_form8(form8(direct, zero_code, second), [&](auto form) {
    constexpr int kGroup = form() == Form8::Search ? kLanes : 4;
    encode8_groups<kGroup, form()>(search, direct, zero_code, second, x, absmax, codes);
  });
}

// float_to_e4m3() on 16 lanes, the same codes with fewer steps: the integer
// rounding of the normal range already saturates at 0x7E for every |q| >=
// 448 up to Inf (the sum wraps to >= 0x7E << 20), the odd bit's round-to-even
// is a masked add, and RNE conversion of |q| * 512 (written over the lanes
// below 2^-6) is the portable magic-number rounding of the subnormal range.
// kFinite: no lane is NaN (the block's scale is finite, so x / scale is).
template <bool kFinite>
inline __m512i e4m3_codes16(__m512 q) {
  const __m512i bits = _mm512_castps_si512(q);
  const __m512i a = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 odd = _mm512_test_epi32_mask(a, _mm512_set1_epi32(1 << 20));
  const __m512i rounded = _mm512_add_epi32(a, _mm512_set1_epi32(int(0xC407FFFFu)));
  __m512i code = _mm512_min_epu32(_mm512_srli_epi32(_mm512_mask_add_epi32(rounded, odd, rounded, _mm512_set1_epi32(1)), 20),
                                  _mm512_set1_epi32(0x7E));
  code = _mm512_mask_cvt_roundps_epi32(code, _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(0x3C800000)),
                                       _mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.f)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  if (!kFinite)
    code = _mm512_mask_blend_epi32(_mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000)), code, _mm512_set1_epi32(0x7F));
  return _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80), 0xF8);  // code | (b & c)
}

// The low bytes of 4 x 16 dword codes (each in [0, 255]) into out[0, 64), in
// order: two in-lane saturating packs (the values pass unchanged) leave lane j
// of vector k at dword 4 j + k; one permute puts it at 4 k + j.
inline void store_codes64(const __m512i (&c)[4], uint8_t* out) {
  const __m512i packed = _mm512_packus_epi16(_mm512_packus_epi32(c[0], c[1]), _mm512_packus_epi32(c[2], c[3]));
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  _mm512_storeu_si512(out, _mm512_permutexvar_epi32(order, packed));
}

template <bool kFinite>
void fp8_codes_block(bool second, const float* x, float s, uint8_t* codes) {
  const __m512 sv = _mm512_set1_ps(s);
  for (int i = 0; i < kBlock8; i += 64) {
    __m512i c[4];
    for (int k = 0; k < 4; ++k) {
      const __m512 xi = _mm512_loadu_ps(x + i + 16 * k);
      c[k] = e4m3_codes16<kFinite>(_mm512_div_ps(xi, sv));
      if (second) c[k] = floor_positive16(c[k], xi, 0);  // floor_positive_e4m3: +0 is code 0
    }
    store_codes64(c, codes + i);
  }
}

// encode_fp8() of one 256-element block: scale absmax / 448, codes of x / scale
// (all 0 when the scale is not > 0), floor_positive_e4m3 (floor_positive16
// with zero code 0) for a second moment.
void encode_fp8_block(bool second, const float* x, uint8_t* codes, float* scale) {
  const float s = absmax_bits(x, kBlock8) / kFp8Max;
  *scale = s;
  if (!(s > 0.f)) {  // 0 or NaN
    for (int i = 0; i < kBlock8; i += 64) {
      __m512i c[4];
      for (int k = 0; k < 4; ++k)
        c[k] = second ? floor_positive16(_mm512_setzero_si512(), _mm512_loadu_ps(x + i + 16 * k), 0) : _mm512_setzero_si512();
      store_codes64(c, codes + i);
    }
  } else if (s < INFINITY) {
    fp8_codes_block<true>(second, x, s, codes);
  } else {
    fp8_codes_block<false>(second, x, s, codes);
  }
}

// The 4-bit linear map (k / 16, k = 1..16) without a search: its midpoints
// (2k + 1) / 32 (k = 1..15) are exact floats, and midpoint k < q exactly
// when k < 16 q - 1.5. That difference is exact wherever it is >= -0.75
// (the product is exact; Sterbenz for 16 q in [0.75, 3], and 1.5 is a
// multiple of the ulp of 16 q above), so the count of midpoints below q is
// ceil(16 q - 1.5) clamped to [0, 15] for every q in [-1, 1]; NaN counts none.
inline __m512i linear4_codes16(__m512 q) {
  const __m512 t = _mm512_fmadd_ps(q, _mm512_set1_ps(16.f), _mm512_set1_ps(-1.5f));
  const __m512 c = _mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(t, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC), _mm512_setzero_ps()),
                                 _mm512_set1_ps(15.f));  // max(NaN, 0) is 0
  return _mm512_cvttps_epi32(c);
}

// 16 elements of a 4-bit tile (8 packed bytes, even element in the low
// nibble) as dword lanes whose low 4 bits are the codes (what vpermps reads):
// byte j / 2 into lane j, shifted right by 4 in the odd lanes.
inline __m512i nibbles(const uint8_t* packed) {
  const __m512i bytes = _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed)));
  const __m512i spread = _mm512_maskz_permutexvar_epi8(0x1111111111111111ull,
                                                       _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0), bytes);
  return _mm512_srlv_epi32(spread, _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0));
}

void decode4(const Search4& map, const uint8_t* packed, const float* scales, float* out) {
  const __m512 values = _mm512_load_ps(map.values);
  for (int b = 0; b < kTile / kBlock4; ++b) {
    const __m512 s = _mm512_set1_ps(scales[b]);
    for (int i = 0; i < kBlock4; i += 16)
      _mm512_storeu_ps(out + kBlock4 * b + i,
                       _mm512_mul_ps(_mm512_permutexvar_ps(nibbles(packed + (kBlock4 * b + i) / 2), values), s));
  }
}

// The 4-bit code search of L vectors of normalised values in lockstep (x >
// mid is an ordered compare: NaN lanes get 0), floor_positive for a second
// moment, packed two codes per byte into packed[0, 8 L).
template <int L>
inline void search_pack4(const Search4& map, int zero_code, bool second, const __m512 (&xn)[L], uint8_t* packed) {
  __m512i pos[L];
  if (map.linear) {
    for (int k = 0; k < L; ++k) pos[k] = linear4_codes16(xn[k]);
  } else {
    const __m512 first = _mm512_set1_ps(map.mid[7]);
    for (int k = 0; k < L; ++k) pos[k] = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(xn[k], first, _CMP_GT_OQ), _mm512_set1_epi32(8));
    for (int lv = 1; lv < 4; ++lv) {
      const __m512 at_step = _mm512_load_ps(map.at_step[lv]);
      for (int k = 0; k < L; ++k) {
        const __m512 candidate = _mm512_permutexvar_ps(pos[k], at_step);  // mid[pos + step - 1]
        pos[k] = _mm512_mask_add_epi32(pos[k], _mm512_cmp_ps_mask(xn[k], candidate, _CMP_GT_OQ), pos[k], _mm512_set1_epi32(8 >> lv));
      }
    }
  }
  for (int k = 0; k < L; ++k)
    if (second) pos[k] = floor_positive16(pos[k], xn[k], zero_code);
  if constexpr (L == 8) {
    avx512::store_packed4_block(pos, packed);
  } else {
    for (int k = 0; k < L; ++k) {
      // qword lane j = code[2j] | code[2j + 1] << 32 (codes < 16): its low byte
      // after or-ing in itself shifted right by 28 is code[2j] | code[2j + 1] << 4
      const __m512i pairs = _mm512_or_si512(pos[k], _mm512_srli_epi64(pos[k], 28));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(packed + 8 * k), _mm512_cvtepi64_epi8(pairs));
    }
  }
}

void encode4(const Search4& map, int zero_code, bool second, const float* x, uint8_t* packed, float* scale) {
  const float absmax = absmax_bits(x, kBlock4);
  *scale = absmax;
  static_assert(kBlock4 == 16 * kLanes, "one 4-bit block is one lockstep group");
  __m512 xn[kLanes];
  for (int k = 0; k < kLanes; ++k) xn[k] = normalized(x + 16 * k, absmax);
  search_pack4<kLanes>(map, zero_code, second, xn, packed);
}

// ---- rank-1 tiles: a scale per element ---------------------------------------

// normalize() per element: x / scale, or 0 where scale is not > 0.
inline __m512 normalized_each(const float* x, const float* scale) {
  const __m512 s = _mm512_loadu_ps(scale);
  return _mm512_maskz_div_ps(_mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_loadu_ps(x), s);
}

// 16 * L elements (even first element): codes as encode4's, packed.
template <int L>
inline void encode4_each(const Search4& map, int zero_code, bool second, const float* x, const float* scale,
                         uint8_t* packed) {
  __m512 xn[L];
  for (int k = 0; k < L; ++k) xn[k] = normalized_each(x + 16 * k, scale + 16 * k);
  search_pack4<L>(map, zero_code, second, xn, packed);
}

template <int L>
inline void encode8_each(const Direct8& direct, const Search8& search, int zero_code, bool second,
                         const float* x, const float* scale,
                         uint8_t* codes) {
  __m512 xn[L];
  for (int k = 0; k < L; ++k) xn[k] = normalized_each(x + 16 * k, scale + 16 * k);
  search_store8<L>(direct, search, zero_code, second, xn, codes);
}

}  // namespace

int avx512_decode_rank1(const MomentView& mv, int64_t base, int n, const float* scale, float* out) {
  const Tables& t = tables();
  int i = 0;
  if (mv.format == LOWBIT_STATE_4BIT && (base & 1) == 0) {
    const __m512 values = _mm512_load_ps(t.map4[map_index(t, mv.map) - 2].values);
    const uint8_t* packed = static_cast<const uint8_t*>(mv.data) + base / 2;
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_permutexvar_ps(nibbles(packed + i / 2), values), _mm512_loadu_ps(scale + i)));
  } else if (mv.format == LOWBIT_STATE_8BIT) {
    const PlaneRegs r(t.values8[map_index(t, mv.map)]);
    const uint8_t* codes = static_cast<const uint8_t*>(mv.data) + base;
    for (; i + 64 <= n; i += 64) {
      __m512 v[4];
      lookup64(r, codes + i, v);
      for (int q = 0; q < 4; ++q)
        _mm512_storeu_ps(out + i + 16 * q, _mm512_mul_ps(v[q], _mm512_loadu_ps(scale + i + 16 * q)));
    }
  }
  return i;
}

int avx512_encode_rank1(const MomentView& mv, int64_t base, int n, const float* scale, const float* in) {
  const Tables& t = tables();
  const int m = map_index(t, mv.map);
  int i = 0;
  if (mv.format == LOWBIT_STATE_4BIT && (base & 1) == 0) {
    uint8_t* packed = static_cast<uint8_t*>(mv.data) + base / 2;
    for (; i + 16 * kLanes <= n; i += 16 * kLanes)
      encode4_each<kLanes>(t.map4[m - 2], t.zero_code[m], mv.second, in + i, scale + i, packed + i / 2);
    for (; i + 16 <= n; i += 16) encode4_each<1>(t.map4[m - 2], t.zero_code[m], mv.second, in + i, scale + i, packed + i / 2);
  } else if (mv.format == LOWBIT_STATE_8BIT) {
    uint8_t* codes = static_cast<uint8_t*>(mv.data) + base;
    for (; i + 16 * kLanes <= n; i += 16 * kLanes)
      encode8_each<kLanes>(t.direct8[m], t.search8[m], t.zero_code[m], mv.second, in + i, scale + i, codes + i);
    for (; i + 16 <= n; i += 16)
      encode8_each<1>(t.direct8[m], t.search8[m], t.zero_code[m], mv.second, in + i, scale + i, codes + i);
  }
  return i;
}

bool avx512_decode_tile(const MomentView& mv, int64_t base, float* out) {
  const Tables& t = tables();
  switch (mv.format) {
    case LOWBIT_STATE_8BIT:
      decode_planes(t.values8[map_index(t, mv.map)], static_cast<const uint8_t*>(mv.data) + base, mv.scales[base / kBlock8], out);
      return true;
    case LOWBIT_STATE_FP8:
      decode_planes(t.e4m3, static_cast<const uint8_t*>(mv.data) + base, mv.scales[base / kBlock8], out);
      return true;
    case LOWBIT_STATE_4BIT:
      decode4(t.map4[map_index(t, mv.map) - 2], static_cast<const uint8_t*>(mv.data) + base / 2, mv.scales + base / kBlock4, out);
      return true;
    default: return false;
  }
}

bool avx512_encode_tile(const MomentView& mv, int64_t base, const float* in) {
  const Tables& t = tables();
  const int m = mv.map ? map_index(t, mv.map) : -1;
  switch (mv.format) {
    case LOWBIT_STATE_8BIT:
      encode8(t.search8[m], t.direct8[m], t.zero_code[m], mv.second, in, static_cast<uint8_t*>(mv.data) + base, mv.scales + base / kBlock8);
      return true;
    case LOWBIT_STATE_FP8:
      encode_fp8_block(mv.second, in, static_cast<uint8_t*>(mv.data) + base, mv.scales + base / kBlock8);
      return true;
    case LOWBIT_STATE_4BIT:
      for (int b = 0; b < kTile; b += kBlock4)
        encode4(t.map4[m - 2], t.zero_code[m], mv.second, in + b, static_cast<uint8_t*>(mv.data) + (base + b) / 2,
                mv.scales + (base + b) / kBlock4);
      return true;
    default: return false;
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

#endif

}  // namespace lowbit
