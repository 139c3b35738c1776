// The four quantization maps of DESIGN.md, built once in double precision and
// rounded to float (bit-identical to shared/golden/qmaps.json).
#pragma once
#include "quant.hpp"

namespace lowbit {

enum class MapId { SignedDynamic8, UnsignedDynamic8, SignedDynamic4, UnsignedLinear4 };

const QMap& qmap(MapId id);

// The bucket tables of a map widened to int32, so the CPU code search can use
// 32-bit gathers and vectorise: [sign][bucket], as QMap::below.
struct QMapWide {
  int32_t below[2][kQBuckets];
};
const QMapWide& qmap_wide(const QMap& map);

}  // namespace lowbit
