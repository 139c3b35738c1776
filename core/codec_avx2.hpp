// AVX2 (with FMA and F16C) forms of the moment codec, the interface of
// codec_avx512.hpp: whole 256-element tiles and rank-1 runs, the portable
// rule's bits. Lookups of the 8-bit and FP8 values are gathers from the
// 256-entry tables; the 8-bit codes are one gather from the bucket table
// (codec_tables.hpp Bucket8), or for rank-1 runs and blocks whose absmax is
// 0 or not finite, the 8-bit maps' direct form
// (codec_tables.hpp) with the binary search for the lanes it defers, and
// 8-entry register permutes for the 4-bit maps.
#pragma once
#include <cstdint>

#include "state.hpp"

namespace lowbit {

// Whether the 8-bit encoder takes the gather form (codec_tables.hpp Bucket8)
// for both dynamic maps: the tests check that it is the form they test.
bool avx2_bucket8_active();
bool avx2_decode_tile(const MomentView& mv, int64_t base, float* out);
bool avx2_encode_tile(const MomentView& mv, int64_t base, const float* in);
bool avx2_encode_tile_sr(const MomentView& mv, int64_t base, const float* in, uint64_t key);
int avx2_decode_rank1(const MomentView& mv, int64_t base, int n, const float* scale, float* out);
int avx2_encode_rank1(const MomentView& mv, int64_t base, int n, const float* scale, const float* in);

}  // namespace lowbit
