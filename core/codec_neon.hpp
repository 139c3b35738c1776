// Arm NEON (AArch64 Advanced SIMD) forms of the moment codec for whole
// 256-element tiles, the interface of codec_avx512.hpp with the neon_ prefix.
// They give the portable path's bits: the same IEEE divisions and products,
// the 8-bit maps' codes from their direct form (simd_tables::Direct8) with
// the lanes it defers to nearest_code(), the 4-bit search over the
// midpoints, e4m3 rounding in integer arithmetic; table lookups are tbl /
// tbx byte permutes over up to four registers (64 bytes). Compiled to
// stubs elsewhere: every function returns false or 0 there.
#pragma once
#include <cstdint>

#include "state.hpp"

namespace lowbit {

// Whether this build and CPU run the NEON codec: true on every AArch64 CPU
// (Advanced SIMD is part of the architecture), false on other targets.
// Choosing it (LOWBIT_CPU_KERNELS) is core/cpu_features' business.
bool neon_codec_supported();

// Whether the 8-bit dynamic maps' direct form is usable (checked against
// every midpoint when the tables are built). Without it the 8-bit encoders
// return false / 0 and the portable code search serves.
bool neon_direct8_active();

// One 256-element tile starting at `base` (a multiple of 256). False when the
// format has no NEON form (FP32, BF16): the caller takes the portable path.
bool neon_decode_tile(const MomentView& mv, int64_t base, float* out);
bool neon_encode_tile(const MomentView& mv, int64_t base, const float* in);
// A step's 4BIT_SR encoding of one tile (codec.cpp
// encode_moment_tile_stochastic, the same bits); false for other formats and
// for a tile with a block whose absmax is not finite (nothing written then).
bool neon_encode_tile_sr(const MomentView& mv, int64_t base, const float* in, uint64_t key);

// Rank-1 tiles (8BIT / 4BIT, any base and n): elements [base, base + n) with
// a scale per element, as rank1_code() and the portable decode give them.
// They handle a prefix (whole groups of 16 elements, 64 for the 8-bit
// decode; nothing for a 4BIT tile at an odd base) and return its length:
// the caller does the rest.
int neon_decode_rank1(const MomentView& mv, int64_t base, int n, const float* scale, float* out);
int neon_encode_rank1(const MomentView& mv, int64_t base, int n, const float* scale, const float* in);

}  // namespace lowbit
