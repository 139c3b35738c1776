// Shaped parameters: rank-1 normalisation and the factored second moment
// (capi/lowbit.h, "Shaped parameters"). The per-element and per-row
// arithmetic shared by the CPU engine and the CUDA kernels, so both give the
// same bits:
//   - positions: element e of a param of shape (..., R, C) is at row
//     q = e / C (over all leading dims) and column c = e % C; for the factored
//     moment the rows are grouped in B batches of R rows (b = q / R);
//   - RANK1 scales: vectors r_k (k < d) back to back; the scale of element e
//     is min over k of r_k[i_k], compared as float bits (non-negative values,
//     exact, a NaN loses unless every entry is NaN);
//   - the canonical reductions of the FACTORED statistics (all in double,
//     from the fp32 values, rounded once to float):
//       row sum over a row of C values: 32 lane partials, lane l summing
//         c = l, l + 32, ... in order, then combined pairwise (offsets 16, 8,
//         4, 2, 1: p[i] += p[i + off]), as a warp's xor butterfly does;
//       column sum over R rows: partials over chunks of kColChunkRows rows
//         (each sequential in r), then the partials in chunk order;
//       row mean of a batch: the lane-strided form over its R row values.
#pragma once
#include <cstdint>

#include "float16.hpp"
#include "hd.hpp"
#include "quant.hpp"
#include "update_rules.hpp"

namespace lowbit {

constexpr int kMaxDims = 8;
constexpr int64_t kColChunkRows = 256;  // rows per column-sum partial

// How a moment is normalised (values of lowbit_normalization_t - 1).
enum class Norm : uint8_t { Block = 0, Rank1 = 1, Factored = 2 };

// A parameter's shape as the engines see it (ndim 0: flat). No implicit
// padding: CUDA tables are compared bytewise. Trivial (value-initialise it:
// Shape s{}).
struct Shape {
  int32_t ndim;
  int32_t pad_;
  int64_t dim[kMaxDims];
};

LOWBIT_HD int64_t shape_cols(const Shape& s) { return s.dim[s.ndim - 1]; }
LOWBIT_HD int64_t shape_rows(const Shape& s, int64_t numel) { return numel / s.dim[s.ndim - 1]; }
// Rows per batch (the second-to-last dim) and batches of the factored form.
LOWBIT_HD int64_t shape_batch_rows(const Shape& s) { return s.dim[s.ndim - 2]; }
LOWBIT_HD int64_t shape_batches(const Shape& s, int64_t numel) {
  return numel / (s.dim[s.ndim - 1] * s.dim[s.ndim - 2]);
}
// The product of dims[0, ndim) (each >= 1), or -1 when it does not fit in
// int64 (a caller's shape; the checks compare it with numel).
inline int64_t checked_dims_product(int ndim, const int64_t* dims) {
  int64_t product = 1;
  for (int k = 0; k < ndim; ++k) {
    if (product > INT64_MAX / dims[k]) return -1;
    product *= dims[k];
  }
  return product;
}
// Sum of the dims: the floats of one set of rank-1 vectors.
LOWBIT_HD int64_t shape_dim_sum(const Shape& s) {
  int64_t t = 0;
  for (int k = 0; k < s.ndim; ++k) t += s.dim[k];
  return t;
}
// Floats of the factored accumulators: row[B*R] col[B*C] mean[B].
LOWBIT_HD int64_t factored_floats(const Shape& s, int64_t numel) {
  const int64_t b = shape_batches(s, numel);
  return shape_rows(s, numel) + b * shape_cols(s) + b;
}
LOWBIT_HD int64_t col_chunks(int64_t rows) { return (rows + kColChunkRows - 1) / kColChunkRows; }

LOWBIT_HD uint32_t umin(uint32_t a, uint32_t b) { return a < b ? a : b; }
LOWBIT_HD uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }

// The entries r_k[i_k(q)], k < d-1, of row q (the dims before the last): at(j)
// for each, j its index in the vectors laid back to back (k = d-2 down to 0).
template <class At>
LOWBIT_HD void rank1_row_entries(const Shape& s, int64_t q, const At& at) {
  if (s.ndim == 2) {  // the one leading dim: i_0 = q (no division)
    at(q);
    return;
  }
  int64_t off = 0;
  for (int k = 0; k < s.ndim - 1; ++k) off += s.dim[k];
  for (int k = s.ndim - 2; k >= 0; --k) {
    off -= s.dim[k];
    const int64_t i = q % s.dim[k];
    q /= s.dim[k];
    at(off + i);
  }
}

// min over k < d-1 of r_k[i_k(q)] as float bits, for row q, vectors at `vecs`.
LOWBIT_HD uint32_t rank1_row_bits(const Shape& s, const float* vecs, int64_t q) {
  uint32_t m = 0xFFFFFFFFu;
  rank1_row_entries(s, q, [&](int64_t j) { m = umin(m, float_bits(vecs[j])); });
  return m;
}

// The offset of the last dim's vector r_{d-1}.
LOWBIT_HD int64_t rank1_last_offset(const Shape& s) { return shape_dim_sum(s) - s.dim[s.ndim - 1]; }

// Walks the elements of a param from `e` on, keeping the row quantities.
struct ShapeCursor {
  int64_t q, c, C;
  LOWBIT_HD void start(const Shape& s, int64_t e) {
    C = shape_cols(s);
    q = e / C;
    c = e - q * C;
  }
  // true when the row changed
  LOWBIT_HD bool next() {
    if (++c < C) return false;
    c = 0;
    ++q;
    return true;
  }
};

// r_k[i_k] for k < d-1 of the rows [q0, q1) into the per-dim vectors as
// float bits with max(): the per-row part of a rank-1 reduction. `store` is
// called with (vector index, bits).
template <class Store>
LOWBIT_HD void rank1_scatter_row(const Shape& s, int64_t q, uint32_t bits, const Store& store) {
  rank1_row_entries(s, q, [&](int64_t j) { store(j, bits); });
}

// The factored v of element (q, c): (row[q] / mean[b]) * col[b, c], 0 where
// the mean is 0. `f`: the accumulators row[B*R] col[B*C] mean[B].
LOWBIT_HD float factored_row_factor(const Shape& s, const float* f, int64_t numel, int64_t q) {
  const int64_t rows = shape_rows(s, numel);
  const int64_t b = q / shape_batch_rows(s);
  const float mean = f[rows + shape_batches(s, numel) * shape_cols(s) + b];
  return mean > 0.f ? f[q] / mean : 0.f;
}
LOWBIT_HD const float* factored_col(const Shape& s, const float* f, int64_t numel, int64_t q) {
  const int64_t b = q / shape_batch_rows(s);
  return f + shape_rows(s, numel) + b * shape_cols(s);
}

// The squared gradient the factored statistics average (Adam: after L2 decay).
// It, the accumulators' EMAs and v^ saturate at kMomentMax (update_rules.hpp):
// a finite gradient leaves the statistics and v^ finite.
template <Algo A>
LOWBIT_HD float factored_g2(const StepScalars& s, float p, float g) {
  if (A == Algo::Adam) g = l2_decayed_grad(s, p, g);
  return saturate_moment(g * g);
}

// An EMA of a mean (the accumulators' update), in float as the moments are.
LOWBIT_HD float factored_ema(const StepScalars& s, float acc, double sum, int64_t count) {
  const float mean = float(sum / double(count));
  return saturate_moment(s.beta2 * acc + (1.f - s.beta2) * mean);
}

// v^ of one element from its row factor and column accumulator.
LOWBIT_HD float factored_v(float row_factor, float col) { return saturate_moment(row_factor * col); }

// The CPU form of the warp reduction: part[0..32) combined pairwise.
inline double lane_tree(double* part) {
  for (int off = 16; off > 0; off >>= 1)
    for (int i = 0; i < off; ++i) part[i] = part[i] + part[i + off];
  return part[0];
}

// Codes of the map-based formats, element e (4BIT: element 2i in the low
// nibble of byte i).
LOWBIT_HD uint32_t load_code(const void* data, bool four_bit, int64_t e) {
  const uint8_t* d = static_cast<const uint8_t*>(data);
  return four_bit ? (uint32_t(d[e >> 1]) >> (4 * (e & 1))) & 0xFu : uint32_t(d[e]);
}

// The code of x with a rank-1 scale: as a block's (nearest map value to
// x / scale, ties to the lower code, a positive second moment never 0).
LOWBIT_HD int rank1_code(const QMap& map, bool second, float x, float scale) {
  const float xn = normalize(x, scale);
  const int code = nearest_code(map, xn);
  return second ? floor_positive(map, code, xn) : code;
}

}  // namespace lowbit
