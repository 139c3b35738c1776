#include "codec_neon.hpp"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "codec_tables.hpp"
#include "qmaps.hpp"
#include "quant.hpp"
#include "rounding.hpp"

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(LOWBIT_NO_CLONES)
#include <arm_neon.h>
#define LOWBIT_NEON_CODEC 1
#endif

namespace lowbit {

#ifndef LOWBIT_NEON_CODEC

bool neon_codec_supported() { return false; }
bool neon_direct8_active() { return false; }
bool neon_decode_tile(const MomentView&, int64_t, float*) { return false; }
bool neon_encode_tile(const MomentView&, int64_t, const float*) { return false; }
bool neon_encode_tile_sr(const MomentView&, int64_t, const float*, uint64_t) { return false; }
int neon_decode_rank1(const MomentView&, int64_t, int, const float*, float*) { return 0; }
int neon_encode_rank1(const MomentView&, int64_t, int, const float*, const float*) { return 0; }

#else

using simd_tables::BytePlanes;
using simd_tables::Direct8;
using simd_tables::kDirectMargin;
using simd_tables::kFirstBinade;
using simd_tables::Search4;
using simd_tables::Tables;
using simd_tables::map_index;
using simd_tables::tables;

bool neon_codec_supported() { return true; }

namespace {

// ---- the NEON forms of the shared tables -------------------------------------

// Direct8's small integer tables as bytes (one tbl reads them into the low
// byte of each 32-bit lane), its level-0 line and top in the floored form
// (level 0 counts 1: floor_positive() of an unsigned map for every y > 0),
// and its boundaries by level instead of by binade: a binade holds at most one
// boundary, the one at index level_at (the count of boundaries below the
// binade), so bound_by_level[level_at[i]] is bound[i] where that is finite and
// lies above the binade where it is not (+Inf there), and y > either gives the
// same level: a 16-entry table (four registers) instead of a 32-entry one.
struct Direct8Bytes {
  uint8_t level_at[32];
  uint8_t top[2][16];  // [floored]
  float c[2][16];      // [floored]
  float bound_by_level[16];
  bool usable;  // Direct8::usable, and the tables above check out
};

struct NeonTables {
  Direct8Bytes direct8[2];
  bool e4m3_high_only;  // bytes 0 and 1 of every e4m3 value are 0: two planes decode it
};

NeonTables build_neon_tables() {
  const Tables& t = tables();
  NeonTables n{};
  for (int m = 0; m < 2; ++m) {
    const Direct8& d = t.direct8[m];
    Direct8Bytes& b = n.direct8[m];
    bool ok = d.usable;
    for (int l = 0; l < 16; ++l) b.bound_by_level[l] = INFINITY;
    for (int i = 0; i < 32; ++i) {
      ok = ok && d.level_at[i] >= 0 && d.level_at[i] < 16;
      b.level_at[i] = uint8_t(d.level_at[i] & 15);
      if (std::isfinite(d.bound[i])) b.bound_by_level[b.level_at[i]] = d.bound[i];
    }
    for (int i = 0; i < 32; ++i) {  // the same level for every y of binade i as bound[i] gives
      const float hi = bits_float(uint32_t(kFirstBinade + i + 1) << 23);
      const float by_level = b.bound_by_level[b.level_at[i]];
      ok = ok && (std::isfinite(d.bound[i]) ? by_level == d.bound[i] : !(by_level < hi));
    }
    for (int f = 0; f < 2; ++f)
      for (int l = 0; l < 16; ++l) {
        ok = ok && d.top[l] >= 0 && d.top[l] <= 255;
        b.top[f][l] = uint8_t(d.top[l]);
        b.c[f][l] = d.c[l];
      }
    b.top[1][0] = 1;
    b.c[1][0] = 0.5f;
    b.usable = ok;
  }
  bool high_only = true;
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 256; ++i) high_only = high_only && t.e4m3.plane[k][i] == 0;
  n.e4m3_high_only = high_only;
  return n;
}

const NeonTables& neon_tables() {
  static const NeonTables n = build_neon_tables();
  return n;
}

// ---- table lookups -------------------------------------------------------------

// Indices into the tables below travel replicated: the same byte in all four
// bytes of a 32-bit lane (idx * 0x01010101). A byte table read with such an
// index gives its entry replicated again; masks (all ones per lane) add and
// subtract on the bytes as on the lanes.
inline uint8x16_t replicated(uint32x4_t idx) { return vreinterpretq_u8_u32(vmulq_u32(idx, vdupq_n_u32(0x01010101u))); }
inline uint32x4_t low_of(uint8x16_t rep) { return vandq_u32(vreinterpretq_u32_u8(rep), vdupq_n_u32(0xFF)); }
// The byte indices that read byte entry rep of a byte table into the low
// byte of each lane and 0 into the others (index 0xFF is out of every table).
inline uint8x16_t low_byte(uint8x16_t rep) { return vorrq_u8(rep, vreinterpretq_u8_u32(vdupq_n_u32(0xFFFFFF00u))); }

inline uint8x16x4_t load_table(const void* p) { return vld1q_u8_x4(static_cast<const uint8_t*>(p)); }

// 16 floats in four registers byte-transposed (register j holds byte j of
// every entry: vld4q_u8 de-interleaves them so): entry rep of each lane is
// bytes rep + 16 j, one orr and one tbl from the replicated index.
inline uint8x16x4_t load_entries16(const float* p) { return vld4q_u8(reinterpret_cast<const uint8_t*>(p)); }
inline uint8x16_t entry_bytes(uint8x16_t rep) { return vorrq_u8(rep, vreinterpretq_u8_u32(vdupq_n_u32(0x30201000u))); }
inline float32x4_t lookup16(const uint8x16x4_t& t, uint8x16_t rep) {
  return vreinterpretq_f32_u8(vqtbl4q_u8(t, entry_bytes(rep)));
}

// ---- decoding ------------------------------------------------------------------

// table[code] for 16 NV codes (NV = 1..4 vectors of 16) from a BytePlanes
// table, in input order: v[4 q + r] holds codes 16 q + 4 r .. 16 q + 4 r + 3.
// Each plane is four 64-byte quarters: tbl on the first, tbx on the others
// with the codes moved down by 64 per quarter (codes of other quarters fall
// out of range and keep their byte). kHighOnly: bytes 0 and 1 of every entry
// are 0 (e4m3), so only planes 2 and 3 are read.
template <int NV, bool kHighOnly>
inline void lookup_planes(const BytePlanes& bp, const uint8_t* codes, float32x4_t (&v)[4 * NV]) {
  constexpr int k0 = kHighOnly ? 2 : 0;
  uint8x16_t c[NV], b[4][NV];
#pragma GCC unroll 4
  for (int q = 0; q < NV; ++q) c[q] = vld1q_u8(codes + 16 * q);
#pragma GCC unroll 4
  for (int k = k0; k < 4; ++k) {
    const uint8x16x4_t t = load_table(bp.plane[k]);
#pragma GCC unroll 4
    for (int q = 0; q < NV; ++q) b[k][q] = vqtbl4q_u8(t, c[q]);
  }
#pragma GCC unroll 4
  for (int quarter = 1; quarter < 4; ++quarter) {
    uint8x16_t idx[NV];
#pragma GCC unroll 4
    for (int q = 0; q < NV; ++q) idx[q] = vsubq_u8(c[q], vdupq_n_u8(uint8_t(64 * quarter)));
#pragma GCC unroll 4
    for (int k = k0; k < 4; ++k) {
      const uint8x16x4_t t = load_table(bp.plane[k] + 64 * quarter);
#pragma GCC unroll 4
      for (int q = 0; q < NV; ++q) b[k][q] = vqtbx4q_u8(b[k][q], t, idx[q]);
    }
  }
#pragma GCC unroll 4
  for (int q = 0; q < NV; ++q) {
    if (kHighOnly) {  // the two high bytes as halfwords, shifted into the top of each lane
      const uint16x8_t lo = vreinterpretq_u16_u8(vzip1q_u8(b[2][q], b[3][q]));
      const uint16x8_t hi = vreinterpretq_u16_u8(vzip2q_u8(b[2][q], b[3][q]));
      v[4 * q + 0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(lo), 16));
      v[4 * q + 1] = vreinterpretq_f32_u32(vshll_high_n_u16(lo, 16));
      v[4 * q + 2] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(hi), 16));
      v[4 * q + 3] = vreinterpretq_f32_u32(vshll_high_n_u16(hi, 16));
    } else {  // bytes 0, 1 and 2, 3 into halfwords, halfwords into words
      const uint16x8_t lo01 = vreinterpretq_u16_u8(vzip1q_u8(b[0][q], b[1][q]));
      const uint16x8_t hi01 = vreinterpretq_u16_u8(vzip2q_u8(b[0][q], b[1][q]));
      const uint16x8_t lo23 = vreinterpretq_u16_u8(vzip1q_u8(b[2][q], b[3][q]));
      const uint16x8_t hi23 = vreinterpretq_u16_u8(vzip2q_u8(b[2][q], b[3][q]));
      v[4 * q + 0] = vreinterpretq_f32_u16(vzip1q_u16(lo01, lo23));
      v[4 * q + 1] = vreinterpretq_f32_u16(vzip2q_u16(lo01, lo23));
      v[4 * q + 2] = vreinterpretq_f32_u16(vzip1q_u16(hi01, hi23));
      v[4 * q + 3] = vreinterpretq_f32_u16(vzip2q_u16(hi01, hi23));
    }
  }
}

// 256 codes -> table[code] * scale, 64 at a time.
template <bool kHighOnly>
void decode_planes(const BytePlanes& bp, const uint8_t* codes, float scale, float* out) {
  const float32x4_t s = vdupq_n_f32(scale);
  for (int i = 0; i < kTile; i += 64) {
    float32x4_t v[16];
    lookup_planes<4, kHighOnly>(bp, codes + i, v);
    for (int r = 0; r < 16; ++r) vst1q_f32(out + i + 4 * r, vmulq_f32(v[r], s));
  }
}

// The 16 codes of 8 packed bytes (even element in the low nibble), in order:
// byte j widened to halfword j, its high nibble shifted into the high byte.
inline uint8x16_t nibbles16(const uint8_t* packed) {
  const uint16x8_t w = vmovl_u8(vld1_u8(packed));
  return vreinterpretq_u8_u16(vandq_u16(vsliq_n_u16(w, w, 4), vdupq_n_u16(0x0F0F)));
}

// table[code] of 16 codes (< 16) from a 16-float table: each output vector
// spreads its 4 codes over their lanes' bytes (4 code + 0..3) and reads them.
inline void lookup_nibbles(const uint8x16x4_t& table, uint8x16_t codes, float32x4_t (&v)[4]) {
  static const uint8_t kSpread[4][16] = {{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
                                         {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7},
                                         {8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11},
                                         {12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15}};
  const uint8x16_t times4 = vshlq_n_u8(codes, 2);
  const uint8x16_t byte_in_lane = vreinterpretq_u8_u32(vdupq_n_u32(0x03020100u));
  for (int r = 0; r < 4; ++r)
    v[r] = vreinterpretq_f32_u8(vqtbl4q_u8(table, vorrq_u8(vqtbl1q_u8(times4, vld1q_u8(kSpread[r])), byte_in_lane)));
}

// A 4-bit tile: per block, the 16 values times the block's absmax (the
// products the portable decode computes per element), then lookups.
void decode4(const Search4& map, const uint8_t* packed, const float* scales, float* out) {
  for (int b = 0; b < kTile / kBlock4; ++b) {
    const float32x4_t s = vdupq_n_f32(scales[b]);
    uint8x16x4_t scaled;
    scaled.val[0] = vreinterpretq_u8_f32(vmulq_f32(vld1q_f32(map.values + 0), s));
    scaled.val[1] = vreinterpretq_u8_f32(vmulq_f32(vld1q_f32(map.values + 4), s));
    scaled.val[2] = vreinterpretq_u8_f32(vmulq_f32(vld1q_f32(map.values + 8), s));
    scaled.val[3] = vreinterpretq_u8_f32(vmulq_f32(vld1q_f32(map.values + 12), s));
    for (int i = 0; i < kBlock4; i += 16) {
      float32x4_t v[4];
      lookup_nibbles(scaled, nibbles16(packed + (kBlock4 * b + i) / 2), v);
      for (int r = 0; r < 4; ++r) vst1q_f32(out + kBlock4 * b + i + 4 * r, v[r]);
    }
  }
}

// ---- encoding: shared steps ----------------------------------------------------

// max |x| over n (a multiple of 16) elements, on the bits (as block_absmax:
// a NaN wins).
float absmax_bits(const float* x, int n) {
  const uint32x4_t magnitude = vdupq_n_u32(0x7FFFFFFFu);
  uint32x4_t a[4] = {vdupq_n_u32(0), vdupq_n_u32(0), vdupq_n_u32(0), vdupq_n_u32(0)};
  for (int i = 0; i < n; i += 16)
    for (int k = 0; k < 4; ++k)
      a[k] = vmaxq_u32(a[k], vandq_u32(vld1q_u32(reinterpret_cast<const uint32_t*>(x + i + 4 * k)), magnitude));
  return bits_float(vmaxvq_u32(vmaxq_u32(vmaxq_u32(a[0], a[1]), vmaxq_u32(a[2], a[3]))));
}

// normalize(): x / absmax, or +0 for every element when absmax is not > 0.
inline float32x4_t normalized(const float* x, float absmax) {
  return absmax > 0.f ? vdivq_f32(vld1q_f32(x), vdupq_n_f32(absmax)) : vdupq_n_f32(0.f);
}
// normalize() per element: x / scale, or +0 where scale is not > 0.
inline float32x4_t normalized_each(const float* x, const float* scale) {
  const float32x4_t s = vld1q_f32(scale);
  return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(vdivq_f32(vld1q_f32(x), s)), vcgtzq_f32(s)));
}

// floor_positive(): a positive x never keeps the code of 0 (zero_code), it
// takes the next one.
inline uint32x4_t floor_positive4(uint32x4_t c, float32x4_t x, int zero_code) {
  return vsubq_u32(c, vandq_u32(vceqq_u32(c, vdupq_n_u32(uint32_t(zero_code))), vcgtzq_f32(x)));
}

// The low bytes of 4 x 4 word codes, in order.
inline uint8x16_t narrow16(const uint32x4_t (&c)[4]) {
  const uint16x8_t lo = vuzp1q_u16(vreinterpretq_u16_u32(c[0]), vreinterpretq_u16_u32(c[1]));
  const uint16x8_t hi = vuzp1q_u16(vreinterpretq_u16_u32(c[2]), vreinterpretq_u16_u32(c[3]));
  return vuzp1q_u8(vreinterpretq_u8_u16(lo), vreinterpretq_u8_u16(hi));
}

// 16 codes (each < 16) two per byte, even element in the low nibble: each
// halfword c0 | c1 << 8 plus itself shifted right by 4 has c0 | c1 << 4 in
// its low byte.
inline uint8x8_t pack_nibbles(const uint32x4_t (&c)[4]) {
  const uint16x8_t w = vreinterpretq_u16_u8(narrow16(c));
  return vmovn_u16(vsraq_n_u16(w, w, 4));
}

// ---- 8-bit codes: the direct form ----------------------------------------------

// How a map's 8-bit codes come out of the direct form: a signed map, an
// unsigned one, or an unsigned one with floor_positive() built in.
enum class Form8 { Signed, Unsigned, Floored };

struct Direct8Regs {
  uint8x16x4_t bound, a, c;
  uint8x16x2_t level_at;
  uint8x16_t top;
  Direct8Regs(const Direct8& d, const Direct8Bytes& b, bool floored)
      : bound(load_entries16(b.bound_by_level)), a(load_entries16(d.a)), c(load_entries16(b.c[floored])),
        level_at(vld1q_u8_x2(b.level_at)), top(vld1q_u8(b.top[floored])) {}
};

// The codes of 4 normalised values by the direct form (codec_tables.hpp
// Direct8): per binade of y = |q| the level at its low end (level0) plus one
// above its boundary (bound_by_level[level0]), the level's line t = y a + c,
// count = min(ceil(t), top). Lanes
// within kDirectMargin of an integer t, on a signed map's boundary, or NaN
// (whose t is NaN) are marked in `defer` for nearest_code(). As codes: zero
// code + count for q >= 0, zero code - min(count, zero code) for q < 0 (the
// negative midpoints mirror the positive ones); an unsigned map gives every
// q < 0 (and, floored, every q <= 0) the code 0.
template <Form8 F>
inline uint32x4_t direct_codes4(const Direct8Regs& r, int32x4_t zc, float32x4_t xn, uint32x4_t& defer) {
  const uint32x4_t bits = vreinterpretq_u32_f32(xn);
  const uint32x4_t ybits = vandq_u32(bits, vdupq_n_u32(0x7FFFFFFFu));
  const float32x4_t y = vreinterpretq_f32_u32(ybits);
  // The binade's index: exponent - 96, 0 below and 31 above (as direct8_count).
  const uint32x4_t binade =
      vminq_u32(vqsubq_u32(vshrq_n_u32(ybits, 23), vdupq_n_u32(uint32_t(kFirstBinade))), vdupq_n_u32(31));
  const uint8x16_t level0 = vqtbl2q_u8(r.level_at, replicated(binade));
  const float32x4_t bound = lookup16(r.bound, level0);
  const uint32x4_t above = vcgtq_f32(y, bound);  // all ones: the level above the boundary
  const uint8x16_t level = vsubq_u8(level0, vreinterpretq_u8_u32(above));
  const uint8x16_t lb = entry_bytes(level);
  const float32x4_t t = vfmaq_f32(vreinterpretq_f32_u8(vqtbl4q_u8(r.c, lb)), y, vreinterpretq_f32_u8(vqtbl4q_u8(r.a, lb)));
  const int32x4_t top = vreinterpretq_s32_u8(vqtbl1q_u8(r.top, low_byte(level)));
  const int32x4_t count = vminq_s32(vcvtpq_s32_f32(t), top);
  // t - nearest integer is exact; |t - n| >= margin fails for NaN too.
  defer = vornq_u32(defer, vcageq_f32(vsubq_f32(t, vrndnq_f32(t)), vdupq_n_f32(kDirectMargin)));
  if (F == Form8::Signed) {
    defer = vorrq_u32(defer, vceqq_f32(y, bound));
    const int32x4_t pos = vaddq_s32(zc, count), neg = vsubq_s32(zc, vminq_s32(count, zc));
    return vreinterpretq_u32_s32(vbslq_s32(vcltzq_s32(vreinterpretq_s32_u32(bits)), neg, pos));
  } else if (F == Form8::Floored) {
    return vandq_u32(vreinterpretq_u32_s32(count), vcgtzq_f32(xn));
  } else {
    return vandq_u32(vreinterpretq_u32_s32(count), vcgezq_s32(vreinterpretq_s32_u32(bits)));
  }
}

// 16 lanes by value (an argument or result in registers: the caller's
// vectors stay in registers on the path that does not call).
struct Lanes16 {
  uint32x4_t v[4];
};

// The lanes the direct form deferred, by the reference search (floored:
// floor_positive() included, as the floored form's codes); rare.
template <Form8 F>
__attribute__((noinline, cold)) Lanes16 patch_deferred(const QMap& map, Lanes16 xn, Lanes16 defer, Lanes16 c) {
  uint32_t x[16], code[16], d[16];
  for (int k = 0; k < 4; ++k) vst1q_u32(x + 4 * k, xn.v[k]), vst1q_u32(code + 4 * k, c.v[k]), vst1q_u32(d + 4 * k, defer.v[k]);
  for (int i = 0; i < 16; ++i)
    if (d[i]) {
      const float xi = bits_float(x[i]);
      const int exact = nearest_code(map, xi);
      code[i] = uint32_t(F == Form8::Floored ? floor_positive_fast(map, exact, xi) : exact);
    }
  for (int k = 0; k < 4; ++k) c.v[k] = vld1q_u32(code + 4 * k);
  return c;
}

// The 8-bit codes of 16 normalised values, floor_positive() for a second
// moment, into codes[0, 16).
template <Form8 F>
inline void store_codes8(const Direct8Regs& r, const QMap& map, int zero_code, bool second, const float32x4_t (&xn)[4],
                         uint8_t* codes) {
  const int32x4_t zc = vdupq_n_s32(zero_code);
  Lanes16 c, defer;
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    defer.v[k] = vdupq_n_u32(0);
    c.v[k] = direct_codes4<F>(r, zc, xn[k], defer.v[k]);
  }
  if (__builtin_expect(vmaxvq_u32(vorrq_u32(vorrq_u32(defer.v[0], defer.v[1]), vorrq_u32(defer.v[2], defer.v[3]))) != 0, 0)) {
    Lanes16 x;
    for (int k = 0; k < 4; ++k) x.v[k] = vreinterpretq_u32_f32(xn[k]);
    c = patch_deferred<F>(map, x, defer, c);
  }
  if (F != Form8::Floored && second && zero_code >= 0)
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) c.v[k] = floor_positive4(c.v[k], xn[k], zero_code);
  vst1q_u8(codes, narrow16(c.v));
}

// The form of a map's codes; false where the direct form is not usable (the
// caller leaves the tile to the portable path).
inline bool form8(const Direct8Bytes& direct, int zero_code, bool second, Form8& form) {
  if (!direct.usable || zero_code < 0) return false;
  form = zero_code > 0 ? Form8::Signed : (second ? Form8::Floored : Form8::Unsigned);
  return true;
}

// f(form) with the form as a compile-time constant.
template <class Fn>
inline void with_form8(Form8 form, Fn&& f) {
  switch (form) {
    case Form8::Signed: return f(std::integral_constant<Form8, Form8::Signed>{});
    case Form8::Unsigned: return f(std::integral_constant<Form8, Form8::Unsigned>{});
    case Form8::Floored: return f(std::integral_constant<Form8, Form8::Floored>{});
  }
}

template <Form8 F>
void encode8(const Direct8Regs& r, const QMap& map, int zero_code, bool second, const float* x, uint8_t* codes,
             float* scale) {
  const float absmax = absmax_bits(x, kBlock8);
  *scale = absmax;
  for (int i = 0; i < kBlock8; i += 16) {
    float32x4_t xn[4];
    for (int k = 0; k < 4; ++k) xn[k] = normalized(x + i + 4 * k, absmax);
    store_codes8<F>(r, map, zero_code, second, xn, codes + i);
  }
}

// ---- 4-bit codes ---------------------------------------------------------------

struct Search4Regs {
  float32x4_t mid7;
  uint8x16x4_t at_step[4];
  bool linear;
  explicit Search4Regs(const Search4& s) : mid7(vdupq_n_f32(s.mid[7])), linear(s.linear) {
    for (int lv = 1; lv < 4; ++lv) at_step[lv] = load_entries16(s.at_step[lv]);
  }
};

// The nearest 4-bit codes of 4 normalised values. The linear map (k / 16):
// ceil(16 q - 1.5) clamped to [0, 15] (codec_avx512.cpp linear4_codes16
// gives the argument; the conversion gives NaN the code 0). Otherwise the
// binary search over the midpoints, mid[pos + step - 1] read from the level's
// table (x > mid is false for NaN: code 0).
inline uint32x4_t codes4(const Search4Regs& r, float32x4_t xn) {
  if (r.linear) {
    const int32x4_t c = vcvtpq_s32_f32(vfmaq_f32(vdupq_n_f32(-1.5f), xn, vdupq_n_f32(16.f)));
    return vreinterpretq_u32_s32(vminq_s32(vmaxq_s32(c, vdupq_n_s32(0)), vdupq_n_s32(15)));
  }
  uint8x16_t pos = vandq_u8(vreinterpretq_u8_u32(vcgtq_f32(xn, r.mid7)), vdupq_n_u8(8));  // replicated
#pragma GCC unroll 3
  for (int lv = 1; lv < 4; ++lv)
    pos = vaddq_u8(pos, vandq_u8(vreinterpretq_u8_u32(vcgtq_f32(xn, lookup16(r.at_step[lv], pos))), vdupq_n_u8(uint8_t(8 >> lv))));
  return low_of(pos);
}

// 16 normalised values: codes, floor_positive() for a second moment, packed
// into packed[0, 8).
inline void store_codes4(const Search4Regs& r, int zero_code, bool second, const float32x4_t (&xn)[4], uint8_t* packed) {
  uint32x4_t c[4];
  for (int k = 0; k < 4; ++k) {
    c[k] = codes4(r, xn[k]);
    if (second && zero_code >= 0) c[k] = floor_positive4(c[k], xn[k], zero_code);
  }
  vst1_u8(packed, pack_nibbles(c));
}

void encode4(const Search4Regs& r, int zero_code, bool second, const float* x, uint8_t* packed, float* scale) {
  const float absmax = absmax_bits(x, kBlock4);
  *scale = absmax;
  for (int i = 0; i < kBlock4; i += 16) {
    float32x4_t xn[4];
    for (int k = 0; k < 4; ++k) xn[k] = normalized(x + i + 4 * k, absmax);
    store_codes4(r, zero_code, second, xn, packed + i / 2);
  }
}

// ---- FP8 e4m3 ------------------------------------------------------------------

// float_to_e4m3() on 4 lanes, the portable integer steps: the normal range's
// rounding already saturates at 0x7E for every |q| >= 448 up to Inf, the
// subnormal range is |q| * 512 converted to nearest even (the portable
// magic-number rounding). kFinite: no lane is NaN.
template <bool kFinite>
inline uint32x4_t e4m3_codes4(float32x4_t q) {
  const uint32x4_t bits = vreinterpretq_u32_f32(q);
  const uint32x4_t a = vandq_u32(bits, vdupq_n_u32(0x7FFFFFFFu));
  const uint32x4_t odd = vandq_u32(vshrq_n_u32(a, 20), vdupq_n_u32(1));
  const uint32x4_t normal =
      vminq_u32(vshrq_n_u32(vaddq_u32(vaddq_u32(a, vdupq_n_u32(0xC407FFFFu)), odd), 20), vdupq_n_u32(0x7E));
  const uint32x4_t sub = vreinterpretq_u32_s32(vcvtnq_s32_f32(vmulq_f32(vreinterpretq_f32_u32(a), vdupq_n_f32(512.f))));
  uint32x4_t code = vbslq_u32(vcgeq_u32(a, vdupq_n_u32(0x3C800000u)), normal, sub);
  if (!kFinite) code = vbslq_u32(vcgtq_u32(a, vdupq_n_u32(0x7F800000u)), vdupq_n_u32(0x7F), code);
  return vorrq_u32(code, vandq_u32(vshrq_n_u32(bits, 24), vdupq_n_u32(0x80)));
}

// floor_positive_e4m3(): +0 (code 0) becomes code 1 for a positive x.
inline uint32x4_t floor_positive_e4m3_4(uint32x4_t c, float32x4_t x) {
  return vorrq_u32(c, vandq_u32(vandq_u32(vceqzq_u32(c), vcgtzq_f32(x)), vdupq_n_u32(1)));
}

template <bool kFinite>
void fp8_codes_block(bool second, const float* x, float s, uint8_t* codes) {
  const float32x4_t sv = vdupq_n_f32(s);
  for (int i = 0; i < kBlock8; i += 16) {
    uint32x4_t c[4];
    for (int k = 0; k < 4; ++k) {
      const float32x4_t xi = vld1q_f32(x + i + 4 * k);
      c[k] = e4m3_codes4<kFinite>(vdivq_f32(xi, sv));
      if (second) c[k] = floor_positive_e4m3_4(c[k], xi);
    }
    vst1q_u8(codes + i, narrow16(c));
  }
}

// encode_fp8() of one block: scale absmax / 448, codes of x / scale (all 0
// when the scale is not > 0), floor_positive_e4m3 for a second moment.
void encode_fp8_block(bool second, const float* x, uint8_t* codes, float* scale) {
  const float s = absmax_bits(x, kBlock8) / kFp8Max;
  *scale = s;
  if (!(s > 0.f)) {  // 0 or NaN
    for (int i = 0; i < kBlock8; i += 16) {
      uint32x4_t c[4];
      for (int k = 0; k < 4; ++k)
        c[k] = second ? floor_positive_e4m3_4(vdupq_n_u32(0), vld1q_f32(x + i + 4 * k)) : vdupq_n_u32(0);
      vst1q_u8(codes + i, narrow16(c));
    }
  } else if (s < INFINITY) {
    fp8_codes_block<true>(second, x, s, codes);
  } else {
    fp8_codes_block<false>(second, x, s, codes);
  }
}

// ---- 4BIT_SR -------------------------------------------------------------------

// state_bits(key, first + j) >> 8 for j = 4 v + lane of a block whose first
// element is `first` (no multiple of 2^32 lies inside a tile, so the index's
// high half is the block's): the first sum is linear in the lane, then
// murmur3's finaliser.
struct StateBits4 {
  uint32x4_t start;
  uint32x4_t high;  // the key's high half >> 8
  StateBits4(uint64_t key, int64_t first) {
    const uint32_t lo = uint32_t(uint64_t(first)), hi = uint32_t(uint64_t(first) >> 32);
    static const uint32_t kLane[4] = {0, 1, 2, 3};
    start = vmlaq_u32(vdupq_n_u32(lo * 0x9E3779B1u + uint32_t(key) + hi * 0x85EBCA77u), vld1q_u32(kLane),
                      vdupq_n_u32(0x9E3779B1u));
    high = vdupq_n_u32(uint32_t(key >> 32) >> 8);
  }
  uint32x4_t top24(int v) const {
    uint32x4_t h = vaddq_u32(start, vdupq_n_u32(uint32_t(4 * v) * 0x9E3779B1u));
    h = veorq_u32(h, vshrq_n_u32(h, 16));
    h = vmulq_u32(h, vdupq_n_u32(0x85EBCA6Bu));
    h = veorq_u32(h, vshrq_n_u32(h, 13));
    h = vmulq_u32(h, vdupq_n_u32(0xC2B2AE35u));
    // ((h ^ h >> 16) ^ key_hi) >> 8 = h >> 8 ^ h >> 24 ^ key_hi >> 8
    return veorq_u32(veorq_u32(vshrq_n_u32(h, 8), vshrq_n_u32(h, 24)), high);
  }
};

// One block with a finite absmax (its decoded values are sorted, no element is
// NaN). c = min(count of decoded values <= x, 15) by a binary search (steps
// 8, 4, 2, 1 compare with decoded[c + step - 1]); the neighbours are a =
// decoded[c - 1] and b = decoded[c], and the code is c - 1 + (u (b - a) < x -
// a or x >= decoded[15]), clamped to 0 (c = 0: x below every decoded value).
// That is stochastic_code16: for 0 < count < 16 its lo + 1 or lo, for count =
// 16 the code 15, for count = 0 the code 0.
template <bool kFloor>
void encode_block_sr(const QMap& map, int zero, const float* x, float absmax, uint8_t* packed, float* scale, uint64_t key,
                     int64_t first) {
  *scale = absmax;
  float decoded[16], below[16], next[16];
  decoded_values16(map, absmax, decoded);
  for (int c = 0; c < 16; ++c) {
    below[c] = decoded[c > 0 ? c - 1 : 0];
    next[c] = decoded[c < 15 ? c + 1 : 15];
  }
  const uint8x16x4_t at0 = load_entries16(decoded), at1 = load_entries16(next), lower = load_entries16(below);
  const float32x4_t d3 = vdupq_n_f32(decoded[3]), d7 = vdupq_n_f32(decoded[7]), d11 = vdupq_n_f32(decoded[11]);
  const float32x4_t unit = vdupq_n_f32(5.9604644775390625e-8f);  // 2^-24
  const StateBits4 bits(key, first);
  for (int g = 0; g < kBlock4; g += 16) {
    uint32x4_t code[4];
    for (int k = 0; k < 4; ++k) {
      const int v = g / 4 + k;
      const float32x4_t xv = vld1q_f32(x + 4 * v);
      const uint32x4_t m8 = vcgeq_f32(xv, d7);
      uint8x16_t c = vandq_u8(vreinterpretq_u8_u32(m8), vdupq_n_u8(8));  // replicated
      c = vaddq_u8(c, vandq_u8(vreinterpretq_u8_u32(vcgeq_f32(xv, vbslq_f32(m8, d11, d3))), vdupq_n_u8(4)));
      c = vaddq_u8(c, vandq_u8(vreinterpretq_u8_u32(vcgeq_f32(xv, lookup16(at1, c))), vdupq_n_u8(2)));
      c = vaddq_u8(c, vandq_u8(vreinterpretq_u8_u32(vcgeq_f32(xv, lookup16(at0, c))), vdupq_n_u8(1)));
      const uint8x16_t eb = entry_bytes(c);
      const float32x4_t b = vreinterpretq_f32_u8(vqtbl4q_u8(at0, eb)), a = vreinterpretq_f32_u8(vqtbl4q_u8(lower, eb));
      const float32x4_t u = vmulq_f32(vcvtq_f32_u32(bits.top24(v)), unit);
      const uint32x4_t up = vorrq_u32(vcltq_f32(vmulq_f32(u, vsubq_f32(b, a)), vsubq_f32(xv, a)), vcleq_f32(b, xv));
      // c - 1 + up (up is all ones where taken), at least 0
      int32x4_t q = vsubq_s32(vsubq_s32(vreinterpretq_s32_u32(low_of(c)), vdupq_n_s32(1)), vreinterpretq_s32_u32(up));
      q = vmaxq_s32(q, vdupq_n_s32(0));
      code[k] = vreinterpretq_u32_s32(q);
      if (kFloor) code[k] = floor_positive4(code[k], xv, zero);
    }
    vst1_u8(packed + g / 2, pack_nibbles(code));
  }
}

}  // namespace

bool neon_direct8_active() { return neon_tables().direct8[0].usable && neon_tables().direct8[1].usable; }

bool neon_decode_tile(const MomentView& mv, int64_t base, float* out) {
  const Tables& t = tables();
  switch (mv.format) {
    case LOWBIT_STATE_8BIT:
      decode_planes<false>(t.values8[map_index(t, mv.map)], static_cast<const uint8_t*>(mv.data) + base,
                           mv.scales[base / kBlock8], out);
      return true;
    case LOWBIT_STATE_FP8:
      if (neon_tables().e4m3_high_only)
        decode_planes<true>(t.e4m3, static_cast<const uint8_t*>(mv.data) + base, mv.scales[base / kBlock8], out);
      else
        decode_planes<false>(t.e4m3, static_cast<const uint8_t*>(mv.data) + base, mv.scales[base / kBlock8], out);
      return true;
    case LOWBIT_STATE_4BIT:
      decode4(t.map4[map_index(t, mv.map) - 2], static_cast<const uint8_t*>(mv.data) + base / 2, mv.scales + base / kBlock4,
              out);
      return true;
    default: return false;
  }
}

bool neon_encode_tile(const MomentView& mv, int64_t base, const float* in) {
  const Tables& t = tables();
  const int m = mv.map ? map_index(t, mv.map) : -1;
  switch (mv.format) {
    case LOWBIT_STATE_8BIT: {
      Form8 form;
      if (!form8(neon_tables().direct8[m], t.zero_code[m], mv.second, form)) return false;
      const Direct8Regs r(t.direct8[m], neon_tables().direct8[m], form == Form8::Floored);
      with_form8(form, [&](auto f) {
        encode8<f()>(r, *mv.map, t.zero_code[m], mv.second, in, static_cast<uint8_t*>(mv.data) + base, mv.scales + base / kBlock8);
      });
      return true;
    }
    case LOWBIT_STATE_FP8:
      encode_fp8_block(mv.second, in, static_cast<uint8_t*>(mv.data) + base, mv.scales + base / kBlock8);
      return true;
    case LOWBIT_STATE_4BIT: {
      const Search4Regs r(t.map4[m - 2]);
      for (int b = 0; b < kTile; b += kBlock4)
        encode4(r, t.zero_code[m], mv.second, in + b, static_cast<uint8_t*>(mv.data) + (base + b) / 2,
                mv.scales + (base + b) / kBlock4);
      return true;
    }
    default: return false;
  }
}

bool neon_encode_tile_sr(const MomentView& mv, int64_t base, const float* in, uint64_t key) {
  if (mv.format != LOWBIT_STATE_4BIT || (base & 1) != 0) return false;
  float absmax[kTile / kBlock4];
  for (int k = 0; k < kTile / kBlock4; ++k) {
    absmax[k] = absmax_bits(in + k * kBlock4, kBlock4);
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

int neon_decode_rank1(const MomentView& mv, int64_t base, int n, const float* scale, float* out) {
  const Tables& t = tables();
  int i = 0;
  if (mv.format == LOWBIT_STATE_4BIT && (base & 1) == 0) {
    const uint8x16x4_t values = load_table(t.map4[map_index(t, mv.map) - 2].values);
    const uint8_t* packed = static_cast<const uint8_t*>(mv.data) + base / 2;
    for (; i + 16 <= n; i += 16) {
      float32x4_t v[4];
      lookup_nibbles(values, nibbles16(packed + i / 2), v);
      for (int r = 0; r < 4; ++r) vst1q_f32(out + i + 4 * r, vmulq_f32(v[r], vld1q_f32(scale + i + 4 * r)));
    }
  } else if (mv.format == LOWBIT_STATE_8BIT) {
    const BytePlanes& bp = t.values8[map_index(t, mv.map)];
    const uint8_t* codes = static_cast<const uint8_t*>(mv.data) + base;
    for (; i + 64 <= n; i += 64) {
      float32x4_t v[16];
      lookup_planes<4, false>(bp, codes + i, v);
      for (int r = 0; r < 16; ++r) vst1q_f32(out + i + 4 * r, vmulq_f32(v[r], vld1q_f32(scale + i + 4 * r)));
    }
    for (; i + 16 <= n; i += 16) {
      float32x4_t v[4];
      lookup_planes<1, false>(bp, codes + i, v);
      for (int r = 0; r < 4; ++r) vst1q_f32(out + i + 4 * r, vmulq_f32(v[r], vld1q_f32(scale + i + 4 * r)));
    }
  }
  return i;
}

int neon_encode_rank1(const MomentView& mv, int64_t base, int n, const float* scale, const float* in) {
  const Tables& t = tables();
  if (mv.format != LOWBIT_STATE_4BIT && mv.format != LOWBIT_STATE_8BIT) return 0;
  const int m = map_index(t, mv.map);
  int i = 0;
  if (mv.format == LOWBIT_STATE_4BIT && (base & 1) == 0) {
    const Search4Regs r(t.map4[m - 2]);
    uint8_t* packed = static_cast<uint8_t*>(mv.data) + base / 2;
    for (; i + 16 <= n; i += 16) {
      float32x4_t xn[4];
      for (int k = 0; k < 4; ++k) xn[k] = normalized_each(in + i + 4 * k, scale + i + 4 * k);
      store_codes4(r, t.zero_code[m], mv.second, xn, packed + i / 2);
    }
  } else if (mv.format == LOWBIT_STATE_8BIT) {
    Form8 form;
    if (!form8(neon_tables().direct8[m], t.zero_code[m], mv.second, form)) return 0;
    const Direct8Regs r(t.direct8[m], neon_tables().direct8[m], form == Form8::Floored);
    uint8_t* codes = static_cast<uint8_t*>(mv.data) + base;
    with_form8(form, [&](auto f) {
      for (; i + 16 <= n; i += 16) {
        float32x4_t xn[4];
        for (int k = 0; k < 4; ++k) xn[k] = normalized_each(in + i + 4 * k, scale + i + 4 * k);
        store_codes8<f()>(r, *mv.map, t.zero_code[m], mv.second, xn, codes + i);
      }
    });
  }
  return i;
}

#endif

}  // namespace lowbit
