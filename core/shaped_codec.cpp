// The CPU forms of the rank-1 and factored layouts (core/shape.hpp): tiles
// for callers outside the per-level loops (their bodies: shaped_tiles.hpp),
// whole moments for read_moment / write_moment and checkpoints.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "codec.hpp"
#include "isa.hpp"
#include "shape.hpp"
#include "shaped_tiles.hpp"

namespace lowbit {
namespace {

LOWBIT_PER_ISA(void, decode_shaped, (const MomentView& mv, const Shape& s, int64_t numel, int64_t base, int n, float* out),
               tiles::decode_shaped_tile(mv, s, numel, base, n, out))
LOWBIT_PER_ISA(void, encode_rank1, (const MomentView& mv, const Shape& s, int64_t base, int n, const float* in),
               tiles::encode_rank1_tile(mv, s, base, n, in))

// Mean of n values v(0..n) in the canonical lane order (core/shape.hpp).
template <class Value>
float lane_mean(int64_t n, const Value& v) {
  double part[32] = {};
  for (int64_t i = 0; i < n; ++i) part[i % 32] += double(v(i));
  return float(lane_tree(part) / double(n));
}

}  // namespace

void decode_shaped_tile(const MomentView& mv, const Shape& s, int64_t numel, int64_t base, int n, float* out) {
  LOWBIT_ISA_PICK(decode_shaped)(mv, s, numel, base, n, out);
}

void encode_rank1_tile(const MomentView& mv, const Shape& s, int64_t base, int n, const float* in) {
  LOWBIT_ISA_PICK(encode_rank1)(mv, s, base, n, in);
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
