// The four quantization maps of DESIGN.md, built once in double precision and
// rounded to float (bit-identical to shared/golden/qmaps.json).
#pragma once
#include "quant.hpp"

namespace lowbit {

enum class MapId { SignedDynamic8, UnsignedDynamic8, SignedDynamic4, UnsignedLinear4 };

const QMap& qmap(MapId id);

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
