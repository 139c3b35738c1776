// Nearest-code search for the 256-entry maps in a few table lookups instead of
// an 8-step binary search, with exactly the result of nearest_code() in
// core/quant.hpp for every float input (ties to the lower code, NaN -> 0).
//
// nearest_code(map, x) is the number of midpoints strictly below x. Here |x|
// picks a bucket from its exponent and top kQMantBits mantissa bits; a table
// holds, per bucket and sign, how many midpoints lie entirely below the
// bucket, and at most kQMaxScan further midpoints can fall inside one bucket,
// so a fixed scan of kQMaxScan compares finishes the count. The builder checks
// that bound for the map it is given and refuses a map that breaks it.
#pragma once
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "core/float16.hpp"
#include "core/hd.hpp"
#include "core/quant.hpp"

namespace lowbit {
namespace cuda {

constexpr int kQMantBits = 6;
constexpr int kQMinExp = 103;  // biased exponent of bucket 1's octave: |x| < 2^-24 all share bucket 0
constexpr int kQMaxExp = 127;  // [1, 2) is the last octave; anything larger clamps into the last bucket
constexpr int kQBuckets = (kQMaxExp - kQMinExp + 1) << kQMantBits;
constexpr int kQMaxScan = 2;

struct QBucketTable {
  uint8_t below_pos[kQBuckets];  // x >= 0 in bucket b: #{midpoints < lower edge of b}
  uint8_t below_neg[kQBuckets];  // x <  0 in bucket b: #{midpoints <= -upper edge of b}
};

LOWBIT_HD int q_bucket(uint32_t abs_bits) {
  int b = int(abs_bits >> (23 - kQMantBits)) - (kQMinExp << kQMantBits);
  return b < 0 ? 0 : (b >= kQBuckets ? kQBuckets - 1 : b);
}

// nearest_code() for a map of n codes with midpoints `mids` (n - 1 of them)
// and `table` built by build_bucket_table() for the same map.
LOWBIT_HD int bucket_code(const float* mids, int n, const uint8_t* below_pos, const uint8_t* below_neg, float x) {
  uint32_t u = float_bits(x);
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0;  // NaN: no midpoint compares below it
  int b = q_bucket(a);
  int c = (u >> 31) ? below_neg[b] : below_pos[b];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < kQMaxScan; ++k) {
    int cc = c < n - 1 ? c : n - 2;
    c += (c < n - 1 && mids[cc] < x) ? 1 : 0;
  }
  return c;
}

// Lower and upper edge of bucket b (the first bucket starts at 0, the last
// one is unbounded above).
inline float q_bucket_lower(int b) {
  return b == 0 ? 0.f : bits_float(uint32_t(b + (kQMinExp << kQMantBits)) << (23 - kQMantBits));
}
inline float q_bucket_upper(int b) {
  return b == kQBuckets - 1 ? INFINITY : bits_float(uint32_t(b + 1 + (kQMinExp << kQMantBits)) << (23 - kQMantBits));
}

// Builds the table of `map`; throws std::logic_error if a bucket holds more
// than kQMaxScan midpoints (the scan would then be too short).
inline QBucketTable build_bucket_table(const QMap& map) {
  QBucketTable t{};
  const int nm = map.n - 1;
  for (int b = 0; b < kQBuckets; ++b) {
    float lo = q_bucket_lower(b), hi = q_bucket_upper(b);
    int below_lo = 0, at_or_below_neg_hi = 0, in_pos = 0, in_neg = 0;
    for (int j = 0; j < nm; ++j) {
      float d = map.midpoints[j];
      if (d < lo) ++below_lo;
      if (d <= -hi) ++at_or_below_neg_hi;
      if (d >= lo && d < hi) ++in_pos;
      if (d > -hi && d <= -lo) ++in_neg;
    }
    if (in_pos > kQMaxScan || in_neg > kQMaxScan || below_lo > 255 || at_or_below_neg_hi > 255)
      throw std::logic_error("quantization map too dense for the bucket search");
    t.below_pos[b] = uint8_t(below_lo);
    t.below_neg[b] = uint8_t(at_or_below_neg_hi);
  }
  return t;
}

}  // namespace cuda
}  // namespace lowbit
