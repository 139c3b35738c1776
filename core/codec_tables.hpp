// The tables of the hand-written SIMD codecs (codec_avx512.cpp, codec_avx2.cpp,
// codec_neon.cpp), built once from the quantization maps: each 8-bit map's
// values as byte planes, its midpoints per level of a binary search and its
// direct (search-free) form, the 4-bit maps' midpoints, and the e4m3 values.
// Only built where a SIMD codec runs.
#pragma once
#include <cstdint>

#include "qmaps.hpp"

namespace lowbit {
namespace simd_tables {

// A 256-entry float table as four byte planes (plane k: byte k of every
// entry): 64 lookups are then 2 byte permutes and a blend per plane, and the
// planes interleave back into floats. `order` permutes 64 codes so that the
// interleave (which works within 128-bit lanes) lands them in input order.
struct alignas(64) BytePlanes {
  uint8_t plane[4][256];
  uint8_t order[64];
};

// The 255 midpoints of an 8-bit map laid out per level of a binary search:
// level s (s = 64, 32, ..., 1) compares with mid[pos + s - 1], pos a multiple
// of 2s, so its table holds mid[j * 2s + s - 1] at j = pos / 2s.
struct alignas(64) Search8 {
  float t64[16], t32[16], t16[16], t8[16], t4[32], t2[64], t1[128];
  float m127;
};

struct alignas(64) Search4 {
  float mid[16];
  float at_step[4][16];  // [s] for step 8 >> s: mid[i + step - 1] at i (read where i is a multiple of 2 step)
  float values[16];
  bool linear;  // the midpoints are (2k + 1) / 32: linear4_codes16 replaces the search
};

// The 8-bit dynamic maps' codes without a search. Per binade of y = |q|
// (exponents 96..127; others clamp to the nearest) the level at its low end and
// the one level boundary inside it (or +Inf); per level (0: below the first
// boundary; 1..levels: the map's levels; levels + 1: the value 1) a line
// t = y a + c on which the level's interior midpoints sit at integers, and
// the count of positive midpoints at the level's top. The count of positive
// midpoints below y is then min(ceil(t), top) except within kDirectMargin
// of an integer (a midpoint's neighbourhood, where the float line and the
// rounded midpoints may disagree) and on a boundary: those lanes take the
// search. build_direct8 checks every midpoint of the map against this.
struct alignas(64) Direct8 {
  float bound[32];
  int32_t level_at[32];
  float a[16], c[16];
  int32_t top[16];
  // The level boundaries in order (boundary l: the first midpoint of level
  // l; the last: the one below the value 1): the level of y is the count of
  // them below it, as level_at and bound give it per binade.
  float boundary[16];
  int32_t num_boundaries;
  bool usable;
};
constexpr float kDirectMargin = 1.f / 8192;
constexpr int kFirstBinade = 96;


struct Tables {
  BytePlanes values8[2];  // SignedDynamic8, UnsignedDynamic8
  Direct8 direct8[2];
  Search8 search8[2];
  Search4 map4[2];        // SignedDynamic4, UnsignedLinear4
  BytePlanes e4m3;
  alignas(64) float e4m3_values[256];  // e4m3_to_float of every code (the AVX2 codec's gathers)
  int zero_code[4];
  const QMap* first_map;  // &qmap(SignedDynamic8): map_index() without a call per tile
};

Tables build_tables();
// Built once; inline, so the per-tile callers pay only the guard's check.
inline const Tables& tables() {
  static const Tables t = build_tables();
  return t;
}

// Which of the four maps (the order of MapId).
inline int map_index(const Tables& t, const QMap* map) { return int(map - t.first_map); }

}  // namespace simd_tables
}  // namespace lowbit
