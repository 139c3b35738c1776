// The four quantization maps of DESIGN.md, built once in double precision and
// rounded to float (bit-identical to shared/golden/qmaps.json), and the
// unsigned dynamic 4-bit map of 4BIT_DYN (0.8), made by the same rule.
#pragma once
#include "quant.hpp"

namespace lowbit {

enum class MapId { SignedDynamic8, UnsignedDynamic8, SignedDynamic4, UnsignedLinear4, UnsignedDynamic4 };
constexpr int kNumMaps = 5;

const QMap& qmap(MapId id);

// How a dynamic-exponent map is made (Dettmers et al.): level L = 0..levels-1
// holds n_L = 2^(L + extra_bits) values, the midpoints of n_L + 1 evenly
// spaced points in [0.1, 1] scaled by 10^(L - levels + 1) (and their
// negatives for a signed map), plus 0 and 1. Fast code searches derive their
// tables from this and check them against the map's midpoints.
struct DynamicMapSpec {
  int levels;
  bool is_signed;
  int extra_bits;
};
// The spec of SignedDynamic8, UnsignedDynamic8, SignedDynamic4 or UnsignedDynamic4.
DynamicMapSpec dynamic_spec(MapId id);

// The CPU form of a map's bucket search, built for 32-bit gathers that do
// not depend on each other: per [sign][bucket] the count of midpoints below
// the bucket and the next two midpoints, so that
//   code = below + (mid0 < x) + (mid1 < x)
// equals bucket_code(map, x) (the midpoints are sorted). zero_code is the
// index of the value 0 (-1 if the map has none).
struct QMapWide {
  int32_t below[2][kQBuckets];
  float mid0[2][kQBuckets];
  float mid1[2][kQBuckets];
  int32_t zero_code;
};
const QMapWide& qmap_wide(const QMap& map);

}  // namespace lowbit
