// NEON forms of the moment codec (aarch64), the interface of codec_avx512.hpp;
// elsewhere every call returns false / 0 and the portable rule runs.
#pragma once
#include <cstdint>

#include "state.hpp"

namespace lowbit {

bool neon_decode_tile(const MomentView& mv, int64_t base, float* out);
bool neon_encode_tile(const MomentView& mv, int64_t base, const float* in);
bool neon_encode_tile_sr(const MomentView& mv, int64_t base, const float* in, uint64_t key);
int neon_decode_rank1(const MomentView& mv, int64_t base, int n, const float* scale, float* out);
int neon_encode_rank1(const MomentView& mv, int64_t base, int n, const float* scale, const float* in);

}  // namespace lowbit
