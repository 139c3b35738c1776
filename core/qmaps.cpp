#include "qmaps.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace lowbit {
namespace {

// Dynamic-exponent map (Dettmers et al.): exponent level i of `levels` holds
// the midpoints of n_i evenly spaced points in [0.1, 1], scaled by
// 10^(i - levels + 1), and their negatives for a signed map; plus 0 and 1.
std::vector<double> dynamic_map(int levels, bool is_signed, int extra_bits) {
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
  return map;
}

std::vector<double> linear_nozero_4bit() {
  std::vector<double> values;
  for (int k = 1; k <= 16; ++k) values.push_back(k / 16.0);
  return values;
}

}  // namespace

const QMap& qmap(MapId id) {
  static const QMap maps[4] = {
      make_map(dynamic_map(7, true, 0)),
      make_map(dynamic_map(7, false, 1)),
      make_map(dynamic_map(3, true, 0)),
      make_map(linear_nozero_4bit()),
  };
  return maps[int(id)];
}

}  // namespace lowbit
