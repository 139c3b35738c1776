// The bodies of the rank-1 and factored tile functions (codec.hpp
// decode_shaped_tile, encode_rank1_tile), inline for the per-level loops
// (core/isa.hpp), as codec_tiles.hpp is for the block formats.
#pragma once
#include <cstdint>

#include "codec_simd.hpp"
#include "quant.hpp"
#include "shape.hpp"
#include "state.hpp"

namespace lowbit {
namespace tiles {

inline void min_row(uint32_t row, const float* __restrict last, int n, float* __restrict out) {
  for (int i = 0; i < n; ++i) out[i] = bits_float(umin(row, float_bits(last[i])));
}

inline void scale_row(float factor, const float* __restrict col, int n, float* __restrict out) {
  for (int i = 0; i < n; ++i) out[i] = factored_v(factor, col[i]);
}

// Elements [base, base + n) row by row: row_fn(q, c, i, len) for the len
// elements of row q from column c on, which are elements i.. of the range.
template <class RowFn>
inline void for_each_row_segment(const Shape& s, int64_t base, int n, const RowFn& row_fn) {
  const int64_t C = shape_cols(s);
  int64_t q = base / C, c = base - q * C;
  for (int i = 0; i < n; c = 0, ++q) {
    const int len = int(C - c < int64_t(n - i) ? C - c : int64_t(n - i));
    row_fn(q, c, i, len);
    i += len;
  }
}

// Per-element rank-1 scales of elements [base, base + n) from vectors `vecs`:
// the leading dims give one value per row, min'ed with the last dim's vector
// element-wise.
inline void rank1_scales(const Shape& s, const float* vecs, int64_t base, int n, float* out) {
  const float* last = vecs + rank1_last_offset(s);
  for_each_row_segment(s, base, n, [&](int64_t q, int64_t c, int i, int len) {
    min_row(rank1_row_bits(s, vecs, q), last + c, len, out + i);
  });
}

inline void set_code(void* data, bool four_bit, int64_t e, uint32_t code) {
  uint8_t* d = static_cast<uint8_t*>(data);
  if (!four_bit) {
    d[e] = uint8_t(code);
    return;
  }
  const int shift = 4 * int(e & 1);
  d[e >> 1] = uint8_t((d[e >> 1] & ~(0xFu << shift)) | (code << shift));
}

inline void decode_shaped_tile(const MomentView& mv, const Shape& s, int64_t numel, int64_t base, int n, float* out) {
  if (mv.norm == Norm::Factored) {
    const float* f = static_cast<const float*>(mv.data);
    for_each_row_segment(s, base, n, [&](int64_t q, int64_t c, int i, int len) {
      scale_row(factored_row_factor(s, f, numel, q), factored_col(s, f, numel, q) + c, len, out + i);
    });
    return;
  }
  float scale[kTile];
  rank1_scales(s, mv.scales, base, n, scale);
  const bool four = mv.format == LOWBIT_STATE_4BIT;
  int i = 0;
  const SimdCodec codec = simd_codec();
  if (codec != SimdCodec::None) {
    if (four && (base & 1) && n > 0) {  // the odd first element, then whole bytes
      out[0] = mv.map->values[load_code(mv.data, four, base)] * scale[0];
      i = 1;
    }
    i += simd_decode_rank1(codec, mv, base + i, n - i, scale + i, out + i);
  }
  for (; i < n; ++i) out[i] = mv.map->values[load_code(mv.data, four, base + i)] * scale[i];
}

inline void encode_rank1_tile(const MomentView& mv, const Shape& s, int64_t base, int n, const float* in) {
  float scale[kTile];
  rank1_scales(s, mv.scales + shape_dim_sum(s), base, n, scale);  // the new vectors
  const bool four = mv.format == LOWBIT_STATE_4BIT;
  int i = 0;
  const SimdCodec codec = simd_codec();
  if (codec != SimdCodec::None) {
    if (four && (base & 1) && n > 0) {  // the odd first element, then whole bytes
      set_code(mv.data, four, base, uint32_t(rank1_code(*mv.map, mv.second, in[0], scale[0])));
      i = 1;
    }
    i += simd_encode_rank1(codec, mv, base + i, n - i, scale + i, in + i);
  }
  for (; i < n; ++i) set_code(mv.data, four, base + i, uint32_t(rank1_code(*mv.map, mv.second, in[i], scale[i])));
}

}  // namespace tiles
}  // namespace lowbit
