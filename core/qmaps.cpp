#include "qmaps.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace lowbit {
namespace {

// Dynamic-exponent map (Dettmers et al.): exponent level i of `levels` holds
// the midpoints of n_i evenly spaced points in [0.1, 1], scaled by
// 10^(i - levels + 1), and their negatives for a signed map; plus 0 and 1.
std::vector<double> dynamic_map(DynamicMapSpec spec) {
  const int levels = spec.levels, extra_bits = spec.extra_bits;
  const bool is_signed = spec.is_signed;
  std::vector<double> values{0.0, 1.0};
  for (int i = 0; i < levels; ++i) {
    int n = (1 << (i + extra_bits)) + 1;
    double scale = std::pow(10.0, i - levels + 1);
    for (int k = 0; k + 1 < n; ++k) {
      double a = 0.1 + (1.0 - 0.1) * k / (n - 1), b = 0.1 + (1.0 - 0.1) * (k + 1) / (n - 1);
      double v = scale * (a + b) / 2;
      values.push_back(v);
      if (is_signed) values.push_back(-v);
    }
  }
  return values;
}

float bucket_lower(int b) {
  return b == 0 ? 0.f : bits_float(uint32_t(b + (kQMinExp << kQMantBits)) << (23 - kQMantBits));
}
float bucket_upper(int b) {
  return b == kQBuckets - 1 ? INFINITY : bits_float(uint32_t(b + 1 + (kQMinExp << kQMantBits)) << (23 - kQMantBits));
}

void build_bucket_tables(QMap& map) {
  const int nm = map.n - 1;
  for (int b = 0; b < kQBuckets; ++b) {
    float lo = bucket_lower(b), hi = bucket_upper(b);
    int below_lo = 0, at_or_below_neg_hi = 0, in_pos = 0, in_neg = 0;
    for (int j = 0; j < nm; ++j) {
      float d = map.midpoints[j];
      below_lo += d < lo;
      at_or_below_neg_hi += d <= -hi;
      in_pos += d >= lo && d < hi;
      in_neg += d > -hi && d <= -lo;
    }
    if (in_pos > kQMaxScan || in_neg > kQMaxScan || below_lo > 255 || at_or_below_neg_hi > 255)
      throw std::logic_error("quantization map too dense for the bucket search");
    map.below[0][b] = uint8_t(below_lo);
    map.below[1][b] = uint8_t(at_or_below_neg_hi);
  }
}

QMap make_map(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  QMap map{};
  map.n = int(values.size());
  for (int i = 0; i < map.n; ++i) map.values[i] = float(values[i]);
  for (int i = 0; i + 1 < map.n; ++i) {
    // Midpoint of the float values, rounded down so `x > mid` is exact.
    double mid = (double(map.values[i]) + double(map.values[i + 1])) / 2;
    float f = float(mid);
    if (double(f) > mid) f = std::nextafter(f, -INFINITY);
    map.midpoints[i] = f;
  }
  for (int i = map.n - 1; i < 257; ++i) map.midpoints[i] = INFINITY;
  map.linear16 = map.n == 16;
  for (int i = 0; i < map.n; ++i) map.linear16 &= map.values[i] == float(i + 1) / 16.f;
  map.zero_code = -1;
  for (int i = 0; i < map.n; ++i)
    if (map.values[i] == 0.f) map.zero_code = i;
  build_bucket_tables(map);
  return map;
}

std::vector<double> linear_nozero_4bit() {
  std::vector<double> values;
  for (int k = 1; k <= 16; ++k) values.push_back(k / 16.0);
  return values;
}

}  // namespace

DynamicMapSpec dynamic_spec(MapId id) {
  switch (id) {
    case MapId::SignedDynamic8: return {7, true, 0};
    case MapId::UnsignedDynamic8: return {7, false, 1};
    case MapId::SignedDynamic4: return {3, true, 0};
    case MapId::UnsignedDynamic4: return {3, false, 1};
    default: throw std::logic_error("not a dynamic-exponent map");
  }
}

const QMap& qmap(MapId id) {
  static const QMap maps[kNumMaps] = {
      make_map(dynamic_map(dynamic_spec(MapId::SignedDynamic8))),
      make_map(dynamic_map(dynamic_spec(MapId::UnsignedDynamic8))),
      make_map(dynamic_map(dynamic_spec(MapId::SignedDynamic4))),
      make_map(linear_nozero_4bit()),
      make_map(dynamic_map(dynamic_spec(MapId::UnsignedDynamic4))),
  };
  return maps[int(id)];
}

const QMapWide& qmap_wide(const QMap& map) {
  static const auto wide = [] {
    std::vector<QMapWide> w(kNumMaps);
    for (int m = 0; m < kNumMaps; ++m) {
      const QMap& q = qmap(MapId(m));
      QMapWide& t = w[size_t(m)];
      for (int s = 0; s < 2; ++s)
        for (int b = 0; b < kQBuckets; ++b) {
          int c = q.below[s][b];
          t.below[s][b] = c;
          t.mid0[s][b] = q.midpoints[c];
          t.mid1[s][b] = q.midpoints[c + 1];  // midpoints[n - 1..256] are +Inf
        }
      t.zero_code = q.zero_code;
    }
    return w;
  }();
  return wide[size_t(&map - &qmap(MapId::SignedDynamic8))];
}

}  // namespace lowbit
