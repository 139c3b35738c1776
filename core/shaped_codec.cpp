// The CPU forms of the rank-1 and factored layouts (core/shape.hpp): tiles
// for the engine's second pass, whole moments for read_moment / write_moment
// and checkpoints.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "codec.hpp"
#include "codec_avx512.hpp"
#include "simd.hpp"
#include "shape.hpp"

namespace lowbit {
namespace {

LOWBIT_VECTOR_CLONES
void min_row(uint32_t row, const float* __restrict last, int n, float* __restrict out) {
  for (int i = 0; i < n; ++i) out[i] = bits_float(umin(row, float_bits(last[i])));
}

LOWBIT_VECTOR_CLONES
void scale_row(float factor, const float* __restrict col, int n, float* __restrict out) {
  for (int i = 0; i < n; ++i) out[i] = factored_v(factor, col[i]);
}

// Elements [base, base + n) row by row: row_fn(q, c, i, len) for the len
// elements of row q from column c on, which are elements i.. of the range.
template <class RowFn>
void for_each_row_segment(const Shape& s, int64_t base, int n, const RowFn& row_fn) {
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
void rank1_scales(const Shape& s, const float* vecs, int64_t base, int n, float* out) {
  const float* last = vecs + rank1_last_offset(s);
  for_each_row_segment(s, base, n, [&](int64_t q, int64_t c, int i, int len) {
    min_row(rank1_row_bits(s, vecs, q), last + c, len, out + i);
  });
}

void set_code(void* data, bool four_bit, int64_t e, uint32_t code) {
  uint8_t* d = static_cast<uint8_t*>(data);
  if (!four_bit) {
    d[e] = uint8_t(code);
    return;
  }
  const int shift = 4 * int(e & 1);
  d[e >> 1] = uint8_t((d[e >> 1] & ~(0xFu << shift)) | (code << shift));
}

// Mean of n values v(0..n) in the canonical lane order (core/shape.hpp).
template <class Value>
float lane_mean(int64_t n, const Value& v) {
  double part[32] = {};
  for (int64_t i = 0; i < n; ++i) part[i % 32] += double(v(i));
  return float(lane_tree(part) / double(n));
}

}  // namespace

void decode_shaped_tile(const MomentView& mv, const Shape& s, int64_t numel, int64_t base, int n, float* out) {
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
  if (simd_codec_active()) {
    if (four && (base & 1) && n > 0) {  // the odd first element, then whole bytes
      out[0] = mv.map->values[load_code(mv.data, four, base)] * scale[0];
      i = 1;
    }
    i += avx512_decode_rank1(mv, base + i, n - i, scale + i, out + i);
  }
  for (; i < n; ++i) out[i] = mv.map->values[load_code(mv.data, four, base + i)] * scale[i];
}

void encode_rank1_tile(const MomentView& mv, const Shape& s, int64_t base, int n, const float* in) {
  float scale[kTile];
  rank1_scales(s, mv.scales + shape_dim_sum(s), base, n, scale);  // the new vectors
  const bool four = mv.format == LOWBIT_STATE_4BIT;
  int i = 0;
  if (simd_codec_active()) {
    if (four && (base & 1) && n > 0) {  // the odd first element, then whole bytes
      set_code(mv.data, four, base, uint32_t(rank1_code(*mv.map, mv.second, in[0], scale[0])));
      i = 1;
    }
    i += avx512_encode_rank1(mv, base + i, n - i, scale + i, in + i);
  }
  for (; i < n; ++i) set_code(mv.data, four, base + i, uint32_t(rank1_code(*mv.map, mv.second, in[i], scale[i])));
}

void decode_moment(const MomentView& mv, const Shape& s, int64_t numel, float* out) {
  if (mv.norm == Norm::Block) {
    decode_moment(mv, numel, out);
    return;
  }
  for (int64_t base = 0; base < numel; base += kTile)
    decode_shaped_tile(mv, s, numel, base, int(numel - base < kTile ? numel - base : kTile), out + base);
}

void encode_moment(const MomentView& mv, const Shape& s, int64_t numel, const float* in) {
  if (mv.norm == Norm::Block) {
    encode_moment(mv, numel, in);
    return;
  }
  const int64_t C = shape_cols(s), rows = numel / C;
  if (mv.norm == Norm::Factored) {
    // The accumulators whose reconstruction is closest in Adafactor's sense:
    // row = mean over the columns, col = mean over the rows of each batch
    // (exact for a non-negative rank-1 v; otherwise v^ keeps only the row and
    // column profiles of v).
    const int64_t R = shape_batch_rows(s), B = rows / R;
    float* f = static_cast<float*>(mv.data);
    for (int64_t q = 0; q < rows; ++q) f[q] = lane_mean(C, [&](int64_t c) { return in[q * C + c]; });
    std::vector<double> sum(static_cast<size_t>(C));  // each column's sum in row order, a row at a time
    for (int64_t b = 0; b < B; ++b) {
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) sum[size_t(c)] += double(in[(b * R + r) * C + c]);
      for (int64_t c = 0; c < C; ++c) f[rows + b * C + c] = float(sum[size_t(c)] / double(R));
    }
    for (int64_t b = 0; b < B; ++b)
      f[rows + B * C + b] = lane_mean(R, [&](int64_t r) { return f[b * R + r]; });
    return;
  }
  encode_rank1_moment(mv, s, numel, in, false);
}

void encode_rank1_moment(const MomentView& mv, const Shape& s, int64_t numel, const float* in, bool fitted) {
  const int64_t C = shape_cols(s), rows = numel / C, S = shape_dim_sum(s), last = rank1_last_offset(s);
  std::vector<uint32_t> extreme[2] = {std::vector<uint32_t>(size_t(S), 0u), std::vector<uint32_t>(size_t(S), 0u)};
  for (int64_t q = 0; q < rows; ++q) {
    uint32_t row[2] = {0u, 0u};  // the row's largest |x| bits by sign
    for (int64_t c = 0; c < C; ++c) {
      const uint32_t u = float_bits(in[q * C + c]), a = u & 0x7FFFFFFFu, neg = u >> 31;
      row[neg] = umax(row[neg], a);
      extreme[neg][size_t(last + c)] = umax(extreme[neg][size_t(last + c)], a);
    }
    rank1_row_entries(s, q, [&](int64_t j) {
      for (int k = 0; k < 2; ++k) extreme[k][size_t(j)] = umax(extreme[k][size_t(j)], row[k]);
    });
  }
  const float vmax = mv.map->values[mv.map->n - 1], vmin = mv.map->values[0];
  for (int64_t k = 0; k < S; ++k) {  // the new vectors, as a step leaves them before moving them
    const uint32_t pos = extreme[0][size_t(k)], neg = extreme[1][size_t(k)];
    mv.scales[S + k] = fitted ? fitted_scale(pos, neg, vmax, vmin, 1.f, false) : bits_float(umax(pos, neg));
    mv.scales[k] = 0.f;
  }
  for (int64_t base = 0; base < numel; base += kTile)
    encode_rank1_tile(mv, s, base, int(numel - base < kTile ? numel - base : kTile), in + base);
  for (int64_t k = 0; k < S; ++k) {
    mv.scales[k] = mv.scales[S + k];
    mv.scales[S + k] = 0.f;
  }
}

}  // namespace lowbit
