// Tile-wise conversion between stored tensors and fp32 working arrays on the
// CPU, at the running instruction-set level (the per-level loops call the
// bodies of codec_tiles.hpp and shaped_tiles.hpp directly). A tile is kTile elements starting at a multiple of kTile (the last one
// may be shorter), so every quantization block lies inside one tile.
#pragma once
#include <cstdint>

#include "state.hpp"

namespace lowbit {

void decode_moment_tile(const MomentView& mv, int64_t base, int n, float* out);
void encode_moment_tile(const MomentView& mv, int64_t base, int n, const float* in);
// A step's encoding of a 4BIT_SR moment (mv.stochastic, Block): codes rounded
// stochastically with state_rounding_key `key` (rounding.hpp) and the
// elements' indices in the tensor. Everything else encodes to nearest codes
// (encode_moment_tile: values given as fp32, checkpoints).
void encode_moment_tile_stochastic(const MomentView& mv, int64_t base, int n, const float* in, uint64_t key);

void load_tensor_tile(const void* data, lowbit_dtype_t dtype, int64_t base, int n, float* out);
// Param value as the optimizer sees it: the 16-bit weight plus its
// error-correction byte when error correction is on.
void load_param_tile(const ParamView& pv, int64_t base, int n, float* out);
// `key`: the stochastic-rounding key of this step (rounding_key()).
void store_param_tile(const ParamView& pv, uint64_t key, int64_t base, int n, const float* in);

// Whole-moment helpers (checkpoints, read_moment): tile loops over numel.
void decode_moment(const MomentView& mv, int64_t numel, float* out);
void encode_moment(const MomentView& mv, int64_t numel, const float* in);

// Rank-1 and factored moments (shaped_codec.cpp). decode_shaped_tile: a
// Rank1 moment with its current vectors, or the factored v^; any base.
// encode_rank1_tile: codes with the new vectors (the workspace half). The
// whole-moment forms take every normalisation (Block: as above); encoding
// computes the vectors or accumulators from the values.
void decode_shaped_tile(const MomentView& mv, const Shape& s, int64_t numel, int64_t base, int n, float* out);
void encode_rank1_tile(const MomentView& mv, const Shape& s, int64_t base, int n, const float* in);
void decode_moment(const MomentView& mv, const Shape& s, int64_t numel, float* out);
void encode_moment(const MomentView& mv, const Shape& s, int64_t numel, const float* in);
// A whole rank-1 moment: the vectors from the values, then the codes. Each
// vector entry is, from the largest |x| bits of its slice's values with the
// sign bit clear (pos) and set (neg): `fitted` ? fitted_scale(pos, neg, the
// map's largest and smallest values, both extremes) : the largest |x| (the
// step's rule).
void encode_rank1_moment(const MomentView& mv, const Shape& s, int64_t numel, const float* in, bool fitted);

// The scale that reencode_moment (state.hpp) gives a block or a rank-1 slice
// whose largest |x| bits are `pos_bits` among its values >= 0 (sign bit clear)
// and `neg_bits` among the others, for a map from `vmin` (>= 0: no negative
// values) to `vmax`: the smallest with which the extreme of the larger
// magnitude (`largest_decides`: blocks) or both extremes (rank-1 slices)
// decode to themselves or beyond; non-finite extremes keep the step's largest
// |x| / `absmax_divisor`.
float fitted_scale(uint32_t pos_bits, uint32_t neg_bits, float vmax, float vmin, float absmax_divisor,
                   bool largest_decides);

// Whether a hand-written codec (codec_simd.hpp) runs at the current level
// (core/cpu_features.hpp: every level but portable has one).
bool simd_codec_active();

}  // namespace lowbit
