// AVX-512 forms of the moment codec for whole 256-element tiles (codec_simd.hpp
// dispatches to them; partial tiles take the portable path). They give the
// portable path's bits: the same code search (the count of midpoints below
// x / absmax), the same IEEE divisions and products, no gathers (slow on the
// CPUs that have AVX-512): table lookups are register permutes.
#pragma once
#include <cstdint>

#include "state.hpp"

namespace lowbit {

// Whether this CPU has what the AVX-512 codec needs (AVX512F/BW/VL/DQ and
// VBMI); it runs at the avx512 level (simd_codec()).
bool avx512_codec_supported();

// Whether the 8-bit dynamic maps' codes come from their direct form (a line
// per level, checked against every midpoint when the tables are built)
// rather than the binary search; both give the same codes.
bool avx512_direct8_active();

// One 256-element tile starting at `base` (a multiple of 256). False when the
// format has no AVX-512 form (FP32, BF16): the caller takes the portable path.
bool avx512_decode_tile(const MomentView& mv, int64_t base, float* out);
bool avx512_encode_tile(const MomentView& mv, int64_t base, const float* in);
// A step's 4BIT_SR encoding of one tile (codec.cpp
// encode_moment_tile_stochastic, the same bits); false for other formats.
bool avx512_encode_tile_sr(const MomentView& mv, int64_t base, const float* in, uint64_t key);

// Rank-1 tiles (8BIT / 4BIT, any base and n): elements [base, base + n) with
// a scale per element, as rank1_code() and the portable decode give them.
// They handle a prefix (whole groups of 16 or 64 elements; nothing for a
// 4BIT tile at an odd base) and return its length: the caller does the rest.
int avx512_decode_rank1(const MomentView& mv, int64_t base, int n, const float* scale, float* out);
int avx512_encode_rank1(const MomentView& mv, int64_t base, int n, const float* scale, const float* in);

}  // namespace lowbit
