#include "codec_tables.hpp"

#include <algorithm>
#include <cmath>

#include "quant.hpp"

namespace lowbit {
namespace simd_tables {
namespace {

// The count of positive midpoints below y as the vector code computes it,
// or -1 where it defers to the search.
int direct8_count(const Direct8& d, float y) {
  const uint32_t e = float_bits(y) >> 23;  // clamped to the 32 binades below 2
  const int i = int(e < uint32_t(kFirstBinade) ? 0u : (e > 127u ? 31u : e - uint32_t(kFirstBinade)));
  const int level = d.level_at[i] + int(y > d.bound[i]);
  const float t = std::fma(y, d.a[level], d.c[level]);
  if (!(std::fabs(t - std::nearbyint(t)) >= kDirectMargin) || y == d.bound[i]) return -1;
  const int c = int(std::ceil(t));
  return c < d.top[level] ? c : d.top[level];
}

void build_direct8(const QMap& q, DynamicMapSpec spec, int zero_code, Direct8& d) {
  d = Direct8{};
  const int levels = spec.levels;
  if (zero_code < 0 || levels + 2 > 16) return;
  const float* pos = q.midpoints + zero_code;  // positive midpoints, ascending
  const int n_pos = q.n - 1 - zero_code;
  int n[16], base[16], sum = 0;
  for (int l = 0; l < levels; ++l) base[l] = sum, n[l] = 1 << (l + spec.extra_bits), sum += n[l];
  if (n_pos != sum + 1) return;
  // Boundary l (l = 0..levels) is pos[base of level l] (the last one: pos[sum]).
  float boundary[17];
  for (int l = 0; l <= levels; ++l) boundary[l] = pos[l < levels ? base[l] : sum];
  for (int l = 0; l <= levels; ++l) d.boundary[l] = boundary[l];
  d.num_boundaries = levels + 1;
  d.a[0] = 0.f, d.c[0] = -0.5f, d.top[0] = 0;
  for (int l = 0; l < levels; ++l) {
    const double scale = std::pow(10.0, l - levels + 1);
    d.a[l + 1] = float(n[l] / (0.9 * scale));
    d.c[l + 1] = float(base[l] - 0.1 * n[l] / 0.9);
    d.top[l + 1] = base[l] + n[l];
  }
  d.a[levels + 1] = 0.f, d.c[levels + 1] = float(n_pos) - 0.5f, d.top[levels + 1] = n_pos;
  for (int i = 0; i < 32; ++i) {
    const float lo = i == 0 ? 0.f : bits_float(uint32_t(kFirstBinade + i) << 23);
    const float hi = bits_float(uint32_t(kFirstBinade + i + 1) << 23);
    int below = 0, inside = 0;
    d.bound[i] = INFINITY;
    for (int l = 0; l <= levels; ++l) {
      below += boundary[l] < lo;
      if (boundary[l] >= lo && boundary[l] < hi) d.bound[i] = boundary[l], ++inside;
    }
    if (inside > 1) return;
    d.level_at[i] = below;
  }
  // Every midpoint, and the floats next to it, must be counted right or deferred.
  for (int j = 0; j < n_pos; ++j)
    for (float y : {std::nextafter(pos[j], 0.f), pos[j], std::nextafter(pos[j], 2.f)}) {
      const int want = int(std::upper_bound(pos, pos + n_pos, y, [](float v, float m) { return v <= m; }) - pos);
      const int got = direct8_count(d, y);
      if (got >= 0 && got != want) return;
    }
  // Interior midpoints sit within half the margin of their integer, so a lane
  // the margin does not defer lies strictly between two midpoints' lines.
  for (int l = 0; l < levels; ++l) {
    for (int k = 1; k < n[l]; ++k) {
      const float t = std::fma(pos[base[l] + k], d.a[l + 1], d.c[l + 1]);
      if (!(std::fabs(t - float(base[l] + k)) < kDirectMargin / 2)) return;
    }
    if (!(std::fma(std::nextafter(boundary[l], 2.f), d.a[l + 1], d.c[l + 1]) > float(base[l]) + kDirectMargin)) return;
  }
  // The negative midpoints mirror the positive ones up to the rounding of
  // the midpoints (down for both signs), so |m| <= y and m < y agree off a tie.
  for (int i = 0; i < zero_code; ++i) {
    const float m = -q.midpoints[zero_code - 1 - i];
    if (m != pos[i] && m != std::nextafter(pos[i], 2.f)) return;
  }
  if (q.values[zero_code] != 0.f) return;
  d.usable = true;
}

// The code bucket8_code() gives |q| <= 1 (bits of a float), or -1 where
// the entry it reads would not decide it.
int bucket8_code(const Bucket8& b, float x) {
  const uint32_t u = float_bits(x), a = u & 0x7FFFFFFFu;
  const int low_bits = 23 - b.mant_bits, hi = int(a >> low_bits) - (kBucket8FirstExp << b.mant_bits);
  const int i = (hi < 0 ? 0 : hi) + ((u >> 31) && b.is_signed ? b.per_sign : 0);
  if (i >= (b.is_signed ? 2 : 1) * b.per_sign) return -1;
  const int32_t e = b.entry[i];
  const int below = int(a & ((1u << low_bits) - 1)) < (e & ((1 << (low_bits + 1)) - 1));
  const int base = e >> (low_bits + 1);
  if (!(u >> 31)) return base - below;
  return b.is_signed ? base + below : 0;
}

void build_bucket8(const QMap& q, bool is_signed, Bucket8& b) {
  b = Bucket8{};
  b.mant_bits = is_signed ? 6 : 7;
  b.per_sign = (24 << b.mant_bits) + 1;
  b.is_signed = is_signed;
  const int low_bits = 23 - b.mant_bits;
  const uint32_t width = 1u << low_bits;
  const float* mid = q.midpoints;
  const int n_mid = q.n - 1;
  auto count_below = [&](float x) {  // #{mid < x}: the reference code of x
    return int(std::lower_bound(mid, mid + n_mid, x) - mid);
  };
  if (!is_signed && mid[0] < 0.f) return;
  for (int sign = 0; sign < (is_signed ? 2 : 1); ++sign)
    for (int i = 0; i < b.per_sign; ++i) {
      const uint32_t lo = uint32_t((kBucket8FirstExp << b.mant_bits) + i) << low_bits;
      const float edge = sign ? -bits_float(lo) : bits_float(lo);  // the small-magnitude end
      int inside = 0;
      uint32_t t = width;
      for (int k = 0; k < n_mid; ++k) {
        const uint32_t m = float_bits(mid[k]);
        if (bool(m >> 31) != bool(sign) || (m & 0x7FFFFFFFu) < (i == 0 ? 0u : lo) || (m & 0x7FFFFFFFu) >= lo + width)
          continue;
        if (mid[k] == 0.f || i == 0) return;  // bucket 0 takes every smaller |q|: no midpoint may sit there
        ++inside;
        const uint32_t j = (m & 0x7FFFFFFFu) - lo;
        t = sign ? (j > 0 ? j : width) : j + 1;
      }
      if (inside > 1) return;
      const int count = count_below(edge);
      b.entry[sign * b.per_sign + i] = int32_t(uint32_t(sign ? count - 1 : count + 1) << (low_bits + 1)) | int32_t(t);
    }
  // Every midpoint's neighbourhood, both zeros and the ends must agree with the reference.
  // (an unsigned map has no negative midpoint, checked above: its negative x count 0, as bucket8_code gives)
  auto agrees = [&](float x) { return std::fabs(x) > 1.f || bucket8_code(b, x) == count_below(x); };
  for (int k = 0; k < n_mid; ++k)
    for (float x : {std::nextafter(mid[k], -2.f), mid[k], std::nextafter(mid[k], 2.f)})
      if (!agrees(x) || !agrees(-x)) return;
  for (float x : {0.f, -0.f, 1.f, -1.f, 1e-30f, -1e-30f, 1e-45f, -1e-45f})
    if (!agrees(x)) return;
  b.usable = true;
}

void fill_planes(const float* table, BytePlanes& bp) {
  for (int i = 0; i < 256; ++i) {
    uint32_t u = float_bits(table[i]);
    for (int k = 0; k < 4; ++k) bp.plane[k][i] = uint8_t(u >> (8 * k));
  }
  // Output vector r (r = 0..3) of a 64-code group holds, in 128-bit lane l,
  // dwords made by unpack{lo,hi}_epi8 then unpack{lo,hi}_epi16 of source
  // bytes 16l + 8(r / 2) + 4(r % 2) + j, j = 0..3.
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < 16; ++j)
      bp.order[16 * (j / 4) + 8 * (r / 2) + 4 * (r % 2) + j % 4] = uint8_t(16 * r + j);
}

}  // namespace

Tables build_tables() {
  Tables x{};
  const MapId ids[kNumMaps] = {MapId::SignedDynamic8, MapId::UnsignedDynamic8, MapId::SignedDynamic4,
                              MapId::UnsignedLinear4, MapId::UnsignedDynamic4};
  for (int m = 0; m < 2; ++m) {
    const QMap& q = qmap(ids[m]);
    fill_planes(q.values, x.values8[m]);
    Search8& s = x.search8[m];
    float* levels[7] = {s.t64, s.t32, s.t16, s.t8, s.t4, s.t2, s.t1};
    for (int lv = 0; lv < 7; ++lv) {
      const int step = 64 >> lv, count = 128 / step;
      for (int j = 0; j < count; ++j) levels[lv][j] = q.midpoints[j * 2 * step + step - 1];
      for (int j = count; j < 16; ++j) levels[lv][j] = INFINITY;  // never indexed
    }
    s.m127 = q.midpoints[127];
    build_direct8(q, dynamic_spec(ids[m]), qmap_wide(q).zero_code, x.direct8[m]);
    build_bucket8(q, dynamic_spec(ids[m]).is_signed, x.bucket8[m]);
  }
  for (int m = 0; m < 3; ++m) {
    const QMap& q = qmap(ids[2 + m]);
    for (int i = 0; i < 16; ++i) x.map4[m].mid[i] = q.midpoints[i], x.map4[m].values[i] = q.values[i];
    for (int lv = 0; lv < 4; ++lv)
      for (int i = 0; i < 16; ++i) x.map4[m].at_step[lv][i] = q.midpoints[std::min(i + (8 >> lv) - 1, 15)];
    bool linear = q.n == 16;
    for (int k = 1; k <= 15; ++k) linear = linear && q.midpoints[k - 1] == float(2 * k + 1) / 32.f;
    x.map4[m].linear = linear;
  }
  float e4m3[256];
  for (int c = 0; c < 256; ++c) e4m3[c] = x.e4m3_values[c] = e4m3_to_float(uint8_t(c));
  fill_planes(e4m3, x.e4m3);
  for (int m = 0; m < kNumMaps; ++m) x.zero_code[m] = qmap_wide(qmap(ids[m])).zero_code;
  x.first_map = &qmap(MapId::SignedDynamic8);
  return x;
}

}  // namespace simd_tables
}  // namespace lowbit
