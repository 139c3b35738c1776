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

// The 8-bit maps' codes by one 32-bit gather per 8 lanes (the AVX2 codec).
// |q| picks a bucket from its exponent and top mant_bits mantissa bits
// (binades kBucket8FirstExp..127: the value 1 is the last bucket; smaller |q|
// clamp into bucket 0, which no midpoint reaches). A bucket holds at most one
// midpoint, so the code is the count at the bucket's small-magnitude end,
// moved by one where the low 23 - mant_bits bits of |q| reach that
// midpoint's threshold t:
//   entry = base << (24 - mant_bits) | t
//   x >= 0: base = count + 1, code = base - (low < t)
//   x <  0: base = count - 1, code = base + (low < t)
// (t = 2^(23 - mant_bits), never reached, where the bucket holds none).
// Entries [0, per_sign) serve x >= 0 and, for a signed map, [per_sign,
// 2 per_sign) serve x < 0; an unsigned map has no negative midpoint, so its
// negative lanes take code 0. Only for |q| <= 1 (a block with a finite,
// positive absmax); build_bucket8 checks every midpoint against it.
constexpr int kBucket8FirstExp = 103;
constexpr int kBucket8MaxEntries = 2 * ((24 << 6) + 1);  // the signed map (6 bits); the unsigned: (24 << 7) + 1
struct alignas(64) Bucket8 {
  int32_t entry[kBucket8MaxEntries];
  int32_t mant_bits;  // 6 (signed map) or 7 (unsigned)
  int32_t per_sign;   // (24 << mant_bits) + 1
  bool is_signed;
  bool usable;
};

constexpr int kFirstBinade = 96;


struct Tables {
  BytePlanes values8[2];  // SignedDynamic8, UnsignedDynamic8
  Direct8 direct8[2];
  Bucket8 bucket8[2];
  Search8 search8[2];
  Search4 map4[3];        // SignedDynamic4, UnsignedLinear4, UnsignedDynamic4 (map4[map_index - 2])
  BytePlanes e4m3;
  alignas(64) float e4m3_values[256];  // e4m3_to_float of every code (the AVX2 codec's gathers)
  int zero_code[kNumMaps];
  const QMap* first_map;  // &qmap(SignedDynamic8): map_index() without a call per tile
};

Tables build_tables();
// Built once; inline, so the per-tile callers pay only the guard's check.
inline const Tables& tables() {
  static const Tables t = build_tables();
  return t;
}

// Which of the maps (the order of MapId).
inline int map_index(const Tables& t, const QMap* map) { return int(map - t.first_map); }

}  // namespace simd_tables
}  // namespace lowbit
