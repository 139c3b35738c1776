#include "codec_avx2.hpp"

#include <cmath>

#include "codec_tables.hpp"
#include "cpu_features.hpp"
#include "quant.hpp"
#include "rounding.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(LOWBIT_NO_CLONES)
// GCC 12 warns inside its own intrinsics headers under target pragmas (PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#define LOWBIT_AVX2_CODEC 1
#endif

namespace lowbit {

#ifndef LOWBIT_AVX2_CODEC

bool avx2_bucket8_active() { return false; }
bool avx2_decode_tile(const MomentView&, int64_t, float*) { return false; }
bool avx2_encode_tile(const MomentView&, int64_t, const float*) { return false; }
bool avx2_encode_tile_sr(const MomentView&, int64_t, const float*, uint64_t) { return false; }
int avx2_decode_rank1(const MomentView&, int64_t, int, const float*, float*) { return 0; }
int avx2_encode_rank1(const MomentView&, int64_t, int, const float*, const float*) { return 0; }

#else

using simd_tables::Bucket8;
using simd_tables::Direct8;
using simd_tables::kBucket8FirstExp;
using simd_tables::kDirectMargin;
using simd_tables::kFirstBinade;
using simd_tables::Search4;
using simd_tables::Tables;
using simd_tables::map_index;
using simd_tables::tables;

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

using V = __m256;
using I = __m256i;

inline I set1(int v) { return _mm256_set1_epi32(v); }
inline V set1f(float v) { return _mm256_set1_ps(v); }
inline I as_int(V v) { return _mm256_castps_si256(v); }
inline V as_float(I v) { return _mm256_castsi256_ps(v); }
// 2 t + mask: one level of a binary search's path kept as t = -(pos >> shift).
inline I twice_plus(I t, I mask) { return _mm256_add_epi32(_mm256_add_epi32(t, t), mask); }
// mask ? b : a, the mask a vector of all-ones / all-zeros lanes.
inline I select(I mask, I a, I b) { return _mm256_blendv_epi8(a, b, mask); }
inline V select(V mask, V a, V b) { return _mm256_blendv_ps(a, b, mask); }

// table[idx] for a 16-entry table in two registers (idx in [0, 15]).
inline V lookup16(V lo, V hi, I idx) {
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx), _mm256_permutevar8x32_ps(hi, idx),
                          as_float(_mm256_slli_epi32(idx, 28)));  // bit 3 into the sign: the blend's mask
}
inline I lookup16i(I lo, I hi, I idx) { return as_int(lookup16(as_float(lo), as_float(hi), idx)); }
// max |x| over n (a multiple of 8) elements, on the bits (as block_absmax).
inline float absmax_bits(const float* x, int n) {
  const I magnitude = set1(0x7FFFFFFF);
  I a = _mm256_setzero_si256();
  for (int i = 0; i < n; i += 8)
    a = _mm256_max_epu32(a, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), magnitude));
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
  return bits_float(uint32_t(_mm_cvtsi128_si32(m)));
}

// normalize(): x / absmax, or 0 for every element when absmax is not > 0.
inline V normalized(const float* x, float absmax) {
  return absmax > 0.f ? _mm256_div_ps(_mm256_loadu_ps(x), set1f(absmax)) : _mm256_setzero_ps();
}
// The same with a scale per element (rank-1): 0 where the scale is not > 0.
inline V normalized_each(const float* x, const float* scale) {
  const V s = _mm256_loadu_ps(scale);
  return _mm256_and_ps(_mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_GT_OQ), _mm256_div_ps(_mm256_loadu_ps(x), s));
}

// floor_positive() (floor_positive_e4m3 with zero code 0): a positive x never
// takes the code of 0; such an x has a code >= zero_code, so it is a max.
inline I floor_positive8(I c, V x, int zero_code) {
  if (zero_code < 0) return c;
  const I gt = as_int(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ));
  return select(gt, c, _mm256_max_epi32(c, set1(zero_code + 1)));
}

// Stores the low bytes of 4 x 8 dword codes (each in [0, 255]) to out[0, 32)
// in order: the in-lane packs leave dword j of 128-bit lane h holding codes
// 4 j + 32 h' ... of vector j, which one dword permute puts in place.
inline I pack_bytes32(const I (&c)[4]) {
  const I w01 = _mm256_packus_epi32(c[0], c[1]), w23 = _mm256_packus_epi32(c[2], c[3]);
  return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(w01, w23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
inline void store_bytes32(const I (&c)[4], uint8_t* out) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), pack_bytes32(c));
}

// 8 x 8 dword codes (each in [0, 15]) packed two per byte, even element in
// the low nibble, into out[0, 32).
inline void store_nibbles64(const I (&c)[8], uint8_t* out) {
  I half[2];
  for (int h = 0; h < 2; ++h) {
    const I bytes = pack_bytes32({c[4 * h], c[4 * h + 1], c[4 * h + 2], c[4 * h + 3]});  // 32 codes in order
    // word w = b0 | b1 << 8: its low byte b0 | b1 << 4 after or-ing in w >> 4
    half[h] = _mm256_and_si256(_mm256_or_si256(bytes, _mm256_srli_epi16(bytes, 4)), _mm256_set1_epi16(0xFF));
  }
  // in-lane pack: lane 0 = half0[0:8] half1[0:8], lane 1 = half0[8:16] half1[8:16]
  const I packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(half[0], half[1]), 0xD8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), packed);
}

// 16 codes of a 4-bit block (8 packed bytes, even element in the low
// nibble) as two vectors of dword codes.
inline void nibbles16(const uint8_t* packed, I& first, I& second) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed));
  const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F)), hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
  const __m128i codes = _mm_unpacklo_epi8(lo, hi);
  first = _mm256_cvtepu8_epi32(codes);
  second = _mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8));
}

inline I load_codes8(const uint8_t* c) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)));
}

// ---- 8-bit codes: the direct form (codec_tables.hpp Direct8) -------------

// A map's direct form for 8 lanes. The level of y = |q| is the count of the
// level boundaries below it (as Direct8's per-binade tables give it), found by
// compares, not table lookups (permutes are scarce: one port, and two cycles
// each on Zen 3). The maps have 7 levels, so 8 boundaries, and levels 1..8
// are indexed by level - 1 in one 8-entry permute; level 0 (y at or below
// the first boundary) counts 0, or 1 in the floored form (unsigned map,
// second moment: floor_positive built in).
struct Direct8Regs {
  V b[8];      // boundary l in every lane
  V a, c;      // the line of level idx + 1
  I top;
  V next;      // [idx] = boundary idx + 1 (the one above level idx + 1), NaN at 7
  I level0;    // the count of level 0
  Direct8Regs(const Direct8& d, bool floored) {
    for (int l = 0; l < 8; ++l) b[l] = set1f(d.boundary[l]);
    alignas(32) float nx[8];
    for (int j = 0; j < 8; ++j) nx[j] = j < 7 ? d.boundary[j + 1] : NAN;
    a = _mm256_loadu_ps(d.a + 1), c = _mm256_loadu_ps(d.c + 1);
    top = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d.top + 1));
    next = _mm256_load_ps(nx);
    level0 = set1(floored ? 1 : 0);
  }
};

// Whether the 8-lane direct form covers this map (seven levels).
inline bool direct8_fits(const Direct8& d) { return d.usable && d.num_boundaries == 8; }

// The deferred lanes of an 8-bit code vector, by the reference search
// (nearest_code), floor_positive() included for a second moment.
__attribute__((noinline, cold)) I search_deferred(const QMap& map, bool second, int defer_mask, V xn, I c) {
  alignas(32) float x[8];
  alignas(32) int32_t code[8];
  _mm256_store_ps(x, xn);
  _mm256_store_si256(reinterpret_cast<__m256i*>(code), c);
  for (int m = defer_mask; m; m &= m - 1) {
    const int l = __builtin_ctz(unsigned(m));
    const int k = nearest_code(map, x[l]);
    code[l] = second ? floor_positive_fast(map, k, x[l]) : k;
  }
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(code));
}

enum class Form8 { Signed, Unsigned, Floored };

// The codes of 8 normalised values (direct8_count of codec_tables.cpp, then
// the sign): zero_code + count for q >= 0, zero_code - min(count, zero_code)
// for q < 0 (signed maps); an unsigned map gives q < 0 the code 0, and its
// floored form gives 0 to every q that is not > 0. Lanes near a midpoint
// (the line within kDirectMargin of an integer), on a boundary (signed maps)
// or NaN take the search.
template <Form8 F>
inline I direct_codes8(const Direct8Regs& r, const QMap& map, int zero_code, bool second, V xn) {
  const I bits = as_int(xn);
  const V y = _mm256_and_ps(xn, as_float(set1(0x7FFFFFFF)));
  auto gt = [&](int l) { return as_int(_mm256_cmp_ps(y, r.b[l], _CMP_GT_OQ)); };
  const I above0 = gt(0);  // level >= 1 (NaN: no)
  // idx = level - 1 above the first boundary (else 0): the other boundaries below y
  const I below = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(gt(1), gt(2)), _mm256_add_epi32(gt(3), gt(4))),
                                   _mm256_add_epi32(_mm256_add_epi32(gt(5), gt(6)), gt(7)));
  const I idx = _mm256_sub_epi32(_mm256_setzero_si256(), below);
  const V t = _mm256_fmadd_ps(y, _mm256_permutevar8x32_ps(r.a, idx), _mm256_permutevar8x32_ps(r.c, idx));
  I count = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_round_ps(t, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC)),
                             _mm256_permutevar8x32_epi32(r.top, idx));
  count = select(above0, r.level0, count);
  const V frac = _mm256_sub_ps(t, _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const V near = _mm256_cmp_ps(_mm256_and_ps(frac, as_float(set1(0x7FFFFFFF))), set1f(kDirectMargin), _CMP_NGE_UQ);
  // level 0 is exact (no line); NaN lanes are not at or below the boundary, and defer
  V defer = _mm256_andnot_ps(_mm256_cmp_ps(y, r.b[0], _CMP_LE_OQ), near);
  I c;
  if constexpr (F == Form8::Signed) {
    const V tie = _mm256_or_ps(_mm256_cmp_ps(y, _mm256_permutevar8x32_ps(r.next, idx), _CMP_EQ_OQ),
                               _mm256_cmp_ps(y, r.b[0], _CMP_EQ_OQ));
    defer = _mm256_or_ps(defer, tie);
    const I zc = set1(zero_code);
    c = select(_mm256_srai_epi32(bits, 31), _mm256_add_epi32(zc, count), _mm256_sub_epi32(zc, _mm256_min_epi32(count, zc)));
  } else if constexpr (F == Form8::Floored) {
    c = _mm256_and_si256(as_int(_mm256_cmp_ps(xn, _mm256_setzero_ps(), _CMP_GT_OQ)), count);
  } else {
    c = _mm256_andnot_si256(_mm256_srai_epi32(bits, 31), count);
  }
  if (F != Form8::Floored && second) c = floor_positive8(c, xn, zero_code);
  const int d = _mm256_movemask_ps(defer);
  return d ? search_deferred(map, second, d, xn, c) : c;
}

inline Form8 form8(int zero_code, bool second) {
  return zero_code > 0 ? Form8::Signed : second ? Form8::Floored : Form8::Unsigned;
}

// 32 normalised values' codes into codes[0, 32).
template <Form8 F>
inline void store_codes8(const Direct8Regs& r, const QMap& map, int zero_code, bool second, const V (&xn)[4],
                         uint8_t* codes) {
  I c[4];
  for (int k = 0; k < 4; ++k) c[k] = direct_codes8<F>(r, map, zero_code, second, xn[k]);
  store_bytes32(c, codes);
}

// ---- 8-bit codes: one gather per 8 lanes (codec_tables.hpp Bucket8) --------

// The codes of 8 values q with |q| <= 1 (a block with a finite positive
// absmax): the bucket's entry, then the one threshold compare. A signed map
// reads the second half for q < 0 and moves the other way; an unsigned map
// gives q < 0 the code 0, and its floored form every q that is not > 0 (and
// at least 1 to q > 0).
template <Form8 F>
inline I bucket_codes8(const Bucket8& b, int zero_code, bool second, V xn) {
  constexpr int kMant = F == Form8::Signed ? 6 : 7, kLow = 23 - kMant;
  const I bits = as_int(xn);
  const I a = _mm256_and_si256(bits, set1(0x7FFFFFFF));
  const I s = _mm256_srai_epi32(bits, 31);
  // the bucket: (|q| >> kLow) - first, 0 below it (16-bit saturation: both fit)
  I idx = _mm256_subs_epu16(_mm256_srli_epi32(a, kLow), set1(kBucket8FirstExp << kMant));
  if constexpr (F == Form8::Signed) idx = _mm256_add_epi32(idx, _mm256_and_si256(s, set1(b.per_sign)));
  const I e = _mm256_i32gather_epi32(b.entry, idx, 4);
  const I below = _mm256_cmpgt_epi32(_mm256_and_si256(e, set1((2 << kLow) - 1)),
                                     _mm256_and_si256(a, set1((1 << kLow) - 1)));  // -1 where low < t
  const I base = _mm256_srai_epi32(e, kLow + 1);
  if constexpr (F == Form8::Signed) {
    const I c = _mm256_add_epi32(base, _mm256_sub_epi32(_mm256_xor_si256(below, s), s));  // q < 0: base - below
    return second ? floor_positive8(c, xn, zero_code) : c;
  } else if constexpr (F == Form8::Floored) {
    return _mm256_and_si256(as_int(_mm256_cmp_ps(xn, _mm256_setzero_ps(), _CMP_GT_OQ)),
                            _mm256_max_epi32(_mm256_add_epi32(base, below), set1(1)));
  } else {
    const I c = _mm256_andnot_si256(s, _mm256_add_epi32(base, below));
    return second ? floor_positive8(c, xn, zero_code) : c;
  }
}

// Whether the gather form serves this map in form F.
template <Form8 F>
inline bool bucket8_fits(const Bucket8& b) {
  return b.usable && b.is_signed == (F == Form8::Signed) && b.mant_bits == (F == Form8::Signed ? 6 : 7);
}

template <Form8 F>
void encode8_block(const Direct8& direct, const Bucket8& bucket, const QMap& map, int zero_code, bool second,
                   const float* x, uint8_t* codes, float* scale) {
  const float absmax = absmax_bits(x, kBlock8);
  *scale = absmax;
  if (absmax > 0.f && absmax < INFINITY && bucket8_fits<F>(bucket)) {  // then every |x / absmax| <= 1
    const V am = set1f(absmax);
    for (int i = 0; i < kBlock8; i += 32) {
      I c[4];
      for (int k = 0; k < 4; ++k) c[k] = bucket_codes8<F>(bucket, zero_code, second, _mm256_div_ps(_mm256_loadu_ps(x + i + 8 * k), am));
      store_bytes32(c, codes + i);
    }
    return;
  }
  const Direct8Regs r(direct, F == Form8::Floored);
  for (int i = 0; i < kBlock8; i += 32) {
    V xn[4];
    for (int k = 0; k < 4; ++k) xn[k] = normalized(x + i + 8 * k, absmax);
    store_codes8<F>(r, map, zero_code, second, xn, codes + i);
  }
}

template <class Fn>
inline void with_form8(Form8 f, Fn&& fn) {
  switch (f) {
    case Form8::Signed: return fn(std::integral_constant<Form8, Form8::Signed>{});
    case Form8::Unsigned: return fn(std::integral_constant<Form8, Form8::Unsigned>{});
    case Form8::Floored: return fn(std::integral_constant<Form8, Form8::Floored>{});
  }
}

// ---- FP8 e4m3 --------------------------------------------------------------

// float_to_e4m3() on 8 lanes (codec_avx512.cpp e4m3_codes16 explains the
// steps): the normal range's integer rounding (saturating at 0x7E from 448
// up to Inf), the subnormal range by the RNE conversion of |q| * 512, NaN 0x7F.
inline I e4m3_codes8(V q) {
  const I bits = as_int(q);
  const I a = _mm256_and_si256(bits, set1(0x7FFFFFFF));
  const I odd = _mm256_and_si256(_mm256_srli_epi32(a, 20), set1(1));
  const I rounded = _mm256_add_epi32(_mm256_add_epi32(a, set1(int(0xC407FFFFu))), odd);
  I code = _mm256_min_epu32(_mm256_srli_epi32(rounded, 20), set1(0x7E));
  const I sub = _mm256_cvtps_epi32(_mm256_mul_ps(as_float(a), set1f(512.f)));  // MXCSR: round to nearest even
  code = select(_mm256_cmpgt_epi32(set1(0x3C800000), a), code, sub);
  code = select(_mm256_cmpgt_epi32(a, set1(0x7F800000)), code, set1(0x7F));
  return _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi32(bits, 24), set1(0x80)));
}

void encode_fp8_block(bool second, const float* x, uint8_t* codes, float* scale) {
  const float s = absmax_bits(x, kBlock8) / kFp8Max;
  *scale = s;
  const V sv = set1f(s);
  const bool nonzero = s > 0.f;  // false for 0 and NaN: every code 0 (floored: 1 where x > 0)
  for (int i = 0; i < kBlock8; i += 32) {
    I c[4];
    for (int k = 0; k < 4; ++k) {
      const V xi = _mm256_loadu_ps(x + i + 8 * k);
      c[k] = nonzero ? e4m3_codes8(_mm256_div_ps(xi, sv)) : _mm256_setzero_si256();
      if (second) c[k] = floor_positive8(c[k], xi, 0);
    }
    store_bytes32(c, codes + i);
  }
}

// ---- 4-bit codes -------------------------------------------------------------

// A 4-bit binary search's permute tables over 16 sorted values in two
// registers (the 15 midpoints of a map, or a block's decoded values). The
// search keeps its path as t = -(pos >> level shift), each level t = 2 t +
// mask (twice_plus), so t's low 3 bits index a level's table directly: its
// lane L holds the candidate of the path k with (-k) & 7 = L.
struct SearchTables {
  V step4;  // k = 0, 1: s[8 k + 3]
  V step2;  // k < 4: s[4 k + 1]
  V step1;  // k < 8: s[2 k]
  SearchTables(V lo, V hi)
      : step4(lookup16(lo, hi, _mm256_setr_epi32(3, 0, 0, 0, 0, 0, 0, 11))),
        step2(lookup16(lo, hi, _mm256_setr_epi32(1, 0, 0, 0, 0, 13, 9, 5))),
        step1(lookup16(lo, hi, _mm256_setr_epi32(0, 14, 12, 10, 8, 6, 4, 2))) {}
};

// The 4-bit code search in registers: the linear map's computed codes, or a
// binary search (mid[7], then mid[pos + step - 1] at pos a multiple of 2 step).
struct Search4Regs {
  bool linear;
  V first;  // mid[7]
  SearchTables at;
  explicit Search4Regs(const Search4& s)
      : linear(s.linear), first(set1f(s.mid[7])), at(_mm256_loadu_ps(s.mid), _mm256_loadu_ps(s.mid + 8)) {}
};

// linear16_code(): ceil(16 q - 1.5) clamped to [0, 15]; max(NaN, 0) is 0.
inline I linear4_codes8(V q) {
  const V t = _mm256_fmadd_ps(q, set1f(16.f), set1f(-1.5f));
  const V c = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(t, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC), _mm256_setzero_ps()),
                            set1f(15.f));
  return _mm256_cvttps_epi32(c);
}

// The nearest 4-bit codes of 8 normalised values (x > mid is ordered: NaN
// lanes count no midpoint), floor_positive for a second moment.
inline I codes4(const Search4Regs& r, int zero_code, bool second, V xn) {
  I pos;
  if (r.linear) {
    pos = linear4_codes8(xn);
  } else {
    auto gt = [&](V candidate) { return as_int(_mm256_cmp_ps(xn, candidate, _CMP_GT_OQ)); };
    I t = gt(r.first);
    t = twice_plus(t, gt(_mm256_permutevar8x32_ps(r.at.step4, t)));
    t = twice_plus(t, gt(_mm256_permutevar8x32_ps(r.at.step2, t)));
    t = twice_plus(t, gt(_mm256_permutevar8x32_ps(r.at.step1, t)));
    pos = _mm256_sub_epi32(_mm256_setzero_si256(), t);
  }
  return second ? floor_positive8(pos, xn, zero_code) : pos;
}

void encode4_block(const Search4Regs& r, int zero_code, bool second, const float* x, uint8_t* packed, float* scale) {
  const float absmax = absmax_bits(x, kBlock4);
  *scale = absmax;
  for (int i = 0; i < kBlock4; i += 64) {
    I c[8];
    for (int k = 0; k < 8; ++k) c[k] = codes4(r, zero_code, second, normalized(x + i + 8 * k, absmax));
    store_nibbles64(c, packed + i / 2);
  }
}

// ---- 4BIT_SR -----------------------------------------------------------------

// state_bits(key, first + j) >> 8 for j = 8 v + lane of a block starting at
// element `first` (no multiple of 2^32 lies inside a block): the index's
// product with the odd constant is linear in the lane, then murmur3's
// finaliser (rounding.hpp), then the key's high half.
struct BlockBits {
  I start, high;
  BlockBits(uint64_t key, int64_t first) {
    const uint32_t lo = uint32_t(uint64_t(first)), hi = uint32_t(uint64_t(first) >> 32);
    const I lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    start = _mm256_add_epi32(_mm256_mullo_epi32(lane, set1(int(0x9E3779B1u))),
                             set1(int(lo * 0x9E3779B1u + uint32_t(key) + hi * 0x85EBCA77u)));
    high = set1(int(uint32_t(key >> 32)));
  }
  I top24(int v) const {
    I h = _mm256_add_epi32(start, set1(int(uint32_t(8 * v) * 0x9E3779B1u)));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    h = _mm256_mullo_epi32(h, set1(int(0x85EBCA6Bu)));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
    h = _mm256_mullo_epi32(h, set1(int(0xC2B2AE35u)));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    return _mm256_srli_epi32(_mm256_xor_si256(h, high), 8);
  }
};

// stochastic_code16() of one block with a finite absmax (its decoded values
// d sorted, no NaN or Inf among x). pos = min(count of d <= x, 15) comes from a
// branch-free binary search probing d7, d[pos + 3], d[pos + 1], d[pos]
// (SearchTables over d). x's bracket is the last probe and its neighbour
// on the other side: with v = pos >> 1 before the last level, whose probe is
// d[2v], x >= d[2v] gives a = d[2v], b = d[2v + 1], otherwise a = d[2v - 1],
// b = d[2v]. The code is pos - 1 + (u (b - a) < x - a or b <= x), b <= x only
// past d15 (a count of 16); the -1 of an x below every decoded value is
// stored as code 0 by the pack's unsigned saturation (store_nibbles64).
template <bool kFloor>
void encode4_sr_block(const QMap& map, int zero, const float* x, float absmax, uint8_t* packed, float* scale,
                      uint64_t key, int64_t first) {
  *scale = absmax;
  alignas(32) float decoded[16];
  decoded_values16(map, absmax, decoded);
  const V dec_lo = _mm256_load_ps(decoded), dec_hi = _mm256_load_ps(decoded + 8);
  const SearchTables at(dec_lo, dec_hi);
  // the last probe's neighbours, read at the same t as at.step1 (lane 0: v = 0, lane 7: v = 1 ...)
  const V above = lookup16(dec_lo, dec_hi, _mm256_setr_epi32(1, 15, 13, 11, 9, 7, 5, 3));  // d[2v + 1]
  const V below = lookup16(dec_lo, dec_hi, _mm256_setr_epi32(0, 13, 11, 9, 7, 5, 3, 1));  // d[2v - 1] (v = 0: count 0)
  const V d7 = set1f(decoded[7]);
  const BlockBits bits(key, first);
  for (int i = 0; i < kBlock4; i += 64) {
    I code[8];
#pragma GCC unroll 8  // eight independent chains of dependent permutes
    for (int k = 0; k < 8; ++k) {
      const V xv = _mm256_loadu_ps(x + i + 8 * k);
      auto le = [&](V d) { return _mm256_cmp_ps(d, xv, _CMP_LE_OQ); };
      I t = as_int(le(d7));
      t = twice_plus(t, as_int(le(_mm256_permutevar8x32_ps(at.step4, t))));
      t = twice_plus(t, as_int(le(_mm256_permutevar8x32_ps(at.step2, t))));
      const V probe = _mm256_permutevar8x32_ps(at.step1, t);
      const V last = le(probe);
      const V a = _mm256_blendv_ps(_mm256_permutevar8x32_ps(below, t), probe, last);
      const V b = _mm256_blendv_ps(probe, _mm256_permutevar8x32_ps(above, t), last);
      // pos - 1 = -(2 t + last) - 1 = ~(2 t + last)
      const I lo = _mm256_xor_si256(twice_plus(t, as_int(last)), set1(-1));
      const V u = _mm256_mul_ps(_mm256_cvtepi32_ps(bits.top24(i / 8 + k)), set1f(5.9604644775390625e-8f));
      const V up = _mm256_or_ps(_mm256_cmp_ps(_mm256_mul_ps(u, _mm256_sub_ps(b, a)), _mm256_sub_ps(xv, a), _CMP_LT_OQ),
                                le(b));
      I c = _mm256_sub_epi32(lo, as_int(up));
      if constexpr (kFloor)  // the zero code decodes to 0 <= any x > 0, so such an x never has code -1
        c = _mm256_sub_epi32(c, _mm256_and_si256(_mm256_cmpeq_epi32(c, set1(zero)),
                                                 as_int(_mm256_cmp_ps(xv, _mm256_setzero_ps(), _CMP_GT_OQ))));
      code[k] = c;
    }
    store_nibbles64(code, packed + i / 2);
  }
}

}  // namespace

bool avx2_bucket8_active() {
  return cpu_isa_supported(CpuIsa::Avx2) && bucket8_fits<Form8::Signed>(tables().bucket8[0]) &&
         bucket8_fits<Form8::Unsigned>(tables().bucket8[1]);
}

bool avx2_decode_tile(const MomentView& mv, int64_t base, float* out) {
  switch (mv.format) {
    case LOWBIT_STATE_8BIT:
    case LOWBIT_STATE_FP8: {
      const float* table = mv.format == LOWBIT_STATE_FP8 ? tables().e4m3_values : mv.map->values;
      const uint8_t* codes = static_cast<const uint8_t*>(mv.data) + base;
      const V s = set1f(mv.scales[base / kBlock8]);
      for (int i = 0; i < kTile; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_i32gather_ps(table, load_codes8(codes + i), 4), s));
      return true;
    }
    case LOWBIT_STATE_4BIT: {
      const V lo = _mm256_loadu_ps(mv.map->values), hi = _mm256_loadu_ps(mv.map->values + 8);
      const uint8_t* packed = static_cast<const uint8_t*>(mv.data) + base / 2;
      for (int b = 0; b < kTile / kBlock4; ++b) {
        const V s = set1f(mv.scales[base / kBlock4 + b]);
        for (int i = kBlock4 * b; i < kBlock4 * (b + 1); i += 16) {
          I c0, c1;
          nibbles16(packed + i / 2, c0, c1);
          _mm256_storeu_ps(out + i, _mm256_mul_ps(lookup16(lo, hi, c0), s));
          _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(lookup16(lo, hi, c1), s));
        }
      }
      return true;
    }
    default: return false;
  }
}

bool avx2_encode_tile(const MomentView& mv, int64_t base, const float* in) {
  const Tables& t = tables();
  switch (mv.format) {
    case LOWBIT_STATE_8BIT: {
      const int m = map_index(t, mv.map);
      if (!direct8_fits(t.direct8[m])) return false;
      const int zc = t.zero_code[m];
      with_form8(form8(zc, mv.second), [&](auto form) {
        encode8_block<form()>(t.direct8[m], t.bucket8[m], *mv.map, zc, mv.second, in,
                              static_cast<uint8_t*>(mv.data) + base, mv.scales + base / kBlock8);
      });
      return true;
    }
    case LOWBIT_STATE_FP8:
      encode_fp8_block(mv.second, in, static_cast<uint8_t*>(mv.data) + base, mv.scales + base / kBlock8);
      return true;
    case LOWBIT_STATE_4BIT: {
      const int m = map_index(t, mv.map);
      const Search4Regs r(t.map4[m - 2]);
      for (int b = 0; b < kTile; b += kBlock4)
        encode4_block(r, t.zero_code[m], mv.second, in + b, static_cast<uint8_t*>(mv.data) + (base + b) / 2,
                      mv.scales + (base + b) / kBlock4);
      return true;
    }
    default: return false;
  }
}

bool avx2_encode_tile_sr(const MomentView& mv, int64_t base, const float* in, uint64_t key) {
  if (mv.format != LOWBIT_STATE_4BIT || (base & 1) != 0) return false;
  float absmax[kTile / kBlock4];
  for (int k = 0; k < kTile / kBlock4; ++k) {
    absmax[k] = absmax_bits(in + k * kBlock4, kBlock4);
    if (!std::isfinite(absmax[k])) return false;  // unsorted decoded values: the portable rule
  }
  uint8_t* c = static_cast<uint8_t*>(mv.data) + base / 2;
  const int zero = floor_positive_code(*mv.map, mv.second);
  for (int k = 0; k < kTile / kBlock4; ++k) {
    const int b = k * kBlock4;
    float* scale = &mv.scales[(base + b) / kBlock4];
    if (zero >= 0)
      encode4_sr_block<true>(*mv.map, zero, in + b, absmax[k], c + b / 2, scale, key, base + b);
    else
      encode4_sr_block<false>(*mv.map, zero, in + b, absmax[k], c + b / 2, scale, key, base + b);
  }
  return true;
}

int avx2_decode_rank1(const MomentView& mv, int64_t base, int n, const float* scale, float* out) {
  int i = 0;
  if (mv.format == LOWBIT_STATE_4BIT && (base & 1) == 0) {
    const V lo = _mm256_loadu_ps(mv.map->values), hi = _mm256_loadu_ps(mv.map->values + 8);
    const uint8_t* packed = static_cast<const uint8_t*>(mv.data) + base / 2;
    for (; i + 16 <= n; i += 16) {
      I c0, c1;
      nibbles16(packed + i / 2, c0, c1);
      _mm256_storeu_ps(out + i, _mm256_mul_ps(lookup16(lo, hi, c0), _mm256_loadu_ps(scale + i)));
      _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(lookup16(lo, hi, c1), _mm256_loadu_ps(scale + i + 8)));
    }
  } else if (mv.format == LOWBIT_STATE_8BIT) {
    const uint8_t* codes = static_cast<const uint8_t*>(mv.data) + base;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_i32gather_ps(mv.map->values, load_codes8(codes + i), 4),
                                              _mm256_loadu_ps(scale + i)));
  }
  return i;
}

int avx2_encode_rank1(const MomentView& mv, int64_t base, int n, const float* scale, const float* in) {
  const Tables& t = tables();
  const int m = map_index(t, mv.map);
  int i = 0;
  if (mv.format == LOWBIT_STATE_4BIT && (base & 1) == 0) {
    const Search4Regs r(t.map4[m - 2]);
    uint8_t* packed = static_cast<uint8_t*>(mv.data) + base / 2;
    for (; i + 64 <= n; i += 64) {
      I c[8];
      for (int k = 0; k < 8; ++k) c[k] = codes4(r, t.zero_code[m], mv.second, normalized_each(in + i + 8 * k, scale + i + 8 * k));
      store_nibbles64(c, packed + i / 2);
    }
  } else if (mv.format == LOWBIT_STATE_8BIT && direct8_fits(t.direct8[m])) {
    uint8_t* codes = static_cast<uint8_t*>(mv.data) + base;
    const int zc = t.zero_code[m];
    with_form8(form8(zc, mv.second), [&](auto form) {
      const Direct8Regs r(t.direct8[m], form() == Form8::Floored);
      for (; i + 32 <= n; i += 32) {
        V xn[4];
        for (int k = 0; k < 4; ++k) xn[k] = normalized_each(in + i + 8 * k, scale + i + 8 * k);
        store_codes8<form()>(r, *mv.map, zc, mv.second, xn, codes + i);
      }
    });
  }
  return i;
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

#endif

}  // namespace lowbit
