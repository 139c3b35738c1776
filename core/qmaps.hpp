// The four quantization maps of DESIGN.md, built once in double precision and
// rounded to float (bit-identical to shared/golden/qmaps.json).
#pragma once
#include "quant.hpp"

namespace lowbit {

enum class MapId { SignedDynamic8, UnsignedDynamic8, SignedDynamic4, UnsignedLinear4 };

const QMap& qmap(MapId id);

}  // namespace lowbit
