// The CPU engine's pass 1 of the shaped parameters (rank-1 and factored
// moments, core/shape.hpp): work items of rows (with a factored moment, also
// column strips; each item compiled once per instruction-set level,
// core/isa.hpp), the factored partials between the passes, and the rank-1
// vectors moved in after pass 2.
#include "cpu_shaped.hpp"

#include <algorithm>
#include <cstring>

#include "codec_tiles.hpp"
#include "cpu_step.hpp"
#include "isa.hpp"
#include "shaped_tiles.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace lowbit {
namespace {

void atomic_umax(float* where, uint32_t bits) {
  uint32_t* w = reinterpret_cast<uint32_t*>(where);
  uint32_t cur = __atomic_load_n(w, __ATOMIC_RELAXED);
  while (bits > cur && !__atomic_compare_exchange_n(w, &cur, bits, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

// The new moments of a tile (update_moments), the param read only where L2
// decay feeds it into the grad.
template <Algo A, bool kFirst, bool kSecond>
inline void moments_tile(const StepScalars& s, int n, const float* __restrict p,
                                       const float* __restrict g, float* __restrict m, float* __restrict v) {
  for (int i = 0; i < n; ++i)
    update_moments<A, kFirst, kSecond>(s, kMomentsReadParam<A> ? p[i] : 0.f, g[i], m[i], v[i]);
}

template <Algo A>
inline void factored_g2_tile(const StepScalars& s, int n, const float* __restrict p,
                                           const float* __restrict g, float* __restrict g2) {
  for (int i = 0; i < n; ++i) g2[i] = factored_g2<A>(s, kMomentsReadParam<A> ? p[i] : 0.f, g[i]);
}

// Loads elements [e, e + n) of the grad (and the param where L2 decay needs
// it) and the rank-1 moments into t, and computes this step's new values of
// the moments pass 1 gathers statistics of: the rank-1 moments in t.m / t.v,
// or the factored moment's squared grads in t.v. Pass 2 recomputes exactly
// these values in its full update (update_moments shares its expressions);
// the param update itself is left to pass 2.
template <Algo A>
inline void stat_segment(const ParamView& pv, const GradView& grad, const StepScalars& s, int64_t e, int n, Tile& t) {
  tiles::load_tensor_tile(grad.data, grad.dtype, e, n, t.g);
  if (kMomentsReadParam<A>) tiles::load_param_tile(pv, e, n, t.p);
  const bool r1[2] = {pv.num_moments > 0 && pv.moment[0].norm == Norm::Rank1,
                      pv.num_moments > 1 && pv.moment[1].norm == Norm::Rank1};
  for (int k = 0; k < 2; ++k)
    if (r1[k]) tiles::decode_shaped_tile(pv.moment[k], pv.shape, pv.numel, e, n, k ? t.v : t.m);
  if (shaped_moment(pv, 1) && pv.moment[1].norm == Norm::Factored) {
    factored_g2_tile<A>(s, n, t.p, t.g, t.v);
    if (r1[0]) moments_tile<A, true, false>(s, n, t.p, t.g, t.m, t.v);
  } else if (r1[0] && r1[1]) {
    moments_tile<A, true, true>(s, n, t.p, t.g, t.m, t.v);
  } else if (r1[0]) {
    moments_tile<A, true, false>(s, n, t.p, t.g, t.m, t.v);
  } else if (r1[1]) {
    moments_tile<A, false, true>(s, n, t.p, t.g, t.m, t.v);
  }
}

// max of the |x| bits over x[0, n), from `init` (order-free: a max of bits).
inline uint32_t umax_abs(uint32_t init, const float* x, int n) {
  for (int i = 0; i < n; ++i) init = umax(init, float_bits(x[i]) & 0x7FFFFFFFu);
  return init;
}

// part[l] += x[i] for the i with i % 32 == l, in order: a row sum's 32 lanes
// (core/shape.hpp) over a segment that starts on a multiple of 32.
static_assert(kTile % 32 == 0, "a row's tiles start on lane 0");
inline void add_lanes32(double* __restrict part, const float* __restrict x, int n) {
  int i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 32; ++l) part[l] += double(x[i + l]);
  for (int l = 0; i + l < n; ++l) part[l] += double(x[i + l]);
}

// acc[i] += x[i] in double (a column sum's next row).
inline void add_doubles(double* __restrict acc, const float* __restrict x, int n) {
  for (int i = 0; i < n; ++i) acc[i] += double(x[i]);
}

// mx[i] = max(mx[i], |x[i]| bits).
inline void umax_abs_each(uint32_t* __restrict mx, const float* __restrict x, int n) {
  for (int i = 0; i < n; ++i) mx[i] = umax(mx[i], float_bits(x[i]) & 0x7FFFFFFFu);
}

template <Algo A>
inline void stat_item_body(const ParamView& pv, const GradView& grad, const StepScalars& s, const StatItem& it,
                           double* partials, uint32_t* colmax) {
  const Shape& sh = pv.shape;
  const int64_t C = shape_cols(sh);
  const bool r1[2] = {pv.num_moments > 0 && pv.moment[0].norm == Norm::Rank1,
                      pv.num_moments > 1 && pv.moment[1].norm == Norm::Rank1};
  const bool fac = pv.num_moments > 1 && pv.moment[1].norm == Norm::Factored;
  const int64_t S = shape_dim_sum(sh);
  Tile t;
  if (it.kind == 0) {
    // colmax (a rank-1 param without a factored moment): the rows' column
    // maxima too, C per moment, so that no column strips run.
    if (colmax) std::memset(colmax, 0, sizeof(uint32_t) * size_t(2 * C));
    for (int64_t q = it.a; q < it.b; ++q) {
      uint32_t mx[2] = {0u, 0u};
      double part[32] = {};
      for (int64_t c0 = 0; c0 < C; c0 += kTile) {
        const int n = int(C - c0 < kTile ? C - c0 : kTile);
        stat_segment<A>(pv, grad, s, q * C + c0, n, t);
        for (int k = 0; k < 2; ++k)
          if (r1[k]) {
            mx[k] = umax_abs(mx[k], k ? t.v : t.m, n);
            if (colmax) umax_abs_each(colmax + k * C + c0, k ? t.v : t.m, n);
          }
        if (fac) add_lanes32(part, t.v, n);  // c0 is a multiple of 32
      }
      for (int k = 0; k < 2; ++k)
        if (r1[k]) {
          float* next = pv.moment[k].scales + S;
          rank1_scatter_row(sh, q, mx[k], [&](int64_t j, uint32_t bits) { atomic_umax(next + j, bits); });
        }
      if (fac) {
        float* row = static_cast<float*>(pv.moment[1].data);
        row[q] = factored_ema(s, row[q], lane_tree(part), C);
      }
    }
    if (colmax)
      for (int k = 0; k < 2; ++k)
        if (r1[k]) {
          float* last = pv.moment[k].scales + S + rank1_last_offset(sh);
          for (int64_t c = 0; c < C; ++c) atomic_umax(last + c, colmax[k * C + c]);
        }
    return;
  }
  // Columns [a, b) over the rows of one chunk.
  const int64_t R = fac ? shape_batch_rows(sh) : shape_rows(sh, pv.numel);
  const int64_t r0 = it.chunk * kColChunkRows, r1_ = r0 + kColChunkRows < R ? r0 + kColChunkRows : R;
  const int n = int(it.b - it.a);
  uint32_t mx[2][kTile] = {};
  double acc[kTile] = {};
  for (int64_t r = r0; r < r1_; ++r) {
    const int64_t q = it.batch * R + r;
    stat_segment<A>(pv, grad, s, q * C + it.a, n, t);
    for (int k = 0; k < 2; ++k)
      if (r1[k]) {
        umax_abs_each(mx[k], k ? t.v : t.m, n);
      }
    if (fac) add_doubles(acc, t.v, n);
  }
  for (int k = 0; k < 2; ++k)
    if (r1[k]) {
      float* last = pv.moment[k].scales + S + rank1_last_offset(sh);
      for (int i = 0; i < n; ++i) atomic_umax(last + it.a + i, mx[k][i]);
    }
  if (fac) {
    double* out = partials + (it.batch * col_chunks(R) + it.chunk) * C + it.a;
    for (int i = 0; i < n; ++i) out[i] = acc[i];
  }
}

LOWBIT_PER_ISA_TEMPLATE((Algo A), void, stat_item,
                        (const ParamView& pv, const GradView& grad, const StepScalars& s, const StatItem& it,
                         double* partials, uint32_t* colmax),
                        stat_item_body<A>(pv, grad, s, it, partials, colmax))

// Between the passes: the factored column accumulators from the chunk
// partials, then the row means. After pass 2: the rank-1 vectors move in.
void factored_mid(const ParamView& pv, const StepScalars& s, const double* partials) {
  const Shape& sh = pv.shape;
  const int64_t C = shape_cols(sh), R = shape_batch_rows(sh), rows = shape_rows(sh, pv.numel), B = rows / R;
  const int64_t nch = col_chunks(R);
  float* f = static_cast<float*>(pv.moment[1].data);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0;
      for (int64_t k = 0; k < nch; ++k) sum += partials[(b * nch + k) * C + c];
      f[rows + b * C + c] = factored_ema(s, f[rows + b * C + c], sum, R);
    }
  for (int64_t b = 0; b < B; ++b) {
    double part[32] = {};
    for (int64_t r = 0; r < R; ++r) part[r % 32] += double(f[b * R + r]);
    f[rows + B * C + b] = float(lane_tree(part) / double(R));
  }
}

void rank1_finish(const ParamView& pv) {
  for (int k = 0; k < pv.num_moments; ++k)
    if (pv.moment[k].norm == Norm::Rank1) {
      const int64_t S = shape_dim_sum(pv.shape);
      float* v = pv.moment[k].scales;
      std::memcpy(v, v + S, sizeof(float) * size_t(S));
      std::memset(v + S, 0, sizeof(float) * size_t(S));
    }
}

}  // namespace

// The pass-1 work of the shaped parameters (rows in groups; with a factored
// moment, column strips of kTile by chunks of kColChunkRows rows) and the
// factored partials.
void CpuShapedPass::build(const std::vector<ParamView>& params, int num_threads) {
  items_.clear();
  shaped_.clear();
  colmax_cols_ = 0;
  partial_off_.assign(params.size(), 0);
  int64_t partials = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamView& pv = params[i];
    if (!shaped_moment(pv, 0) && !shaped_moment(pv, 1)) continue;
    shaped_.push_back(i);
    const Shape& sh = pv.shape;
    const int64_t C = shape_cols(sh), rows = shape_rows(sh, pv.numel);
    const bool fac = shaped_moment(pv, 1) && pv.moment[1].norm == Norm::Factored;
    // Rank-1 only: the row items take the column maxima as well (larger
    // items: their C atomics per moment are spread over more rows).
    const int64_t per = std::max<int64_t>(1, (fac ? 8192 : 32768) / C);
    for (int64_t q = 0; q < rows; q += per) items_.push_back({int32_t(i), 0, q, std::min(rows, q + per), 0, 0});
    if (!fac) {
      colmax_cols_ = std::max(colmax_cols_, C);
      continue;
    }
    const int64_t R = shape_batch_rows(sh), B = rows / R;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t k = 0; k < col_chunks(R); ++k)
        for (int64_t c = 0; c < C; c += kTile) items_.push_back({int32_t(i), 1, c, std::min(C, c + kTile), b, k});
    partial_off_[i] = partials;
    partials += B * col_chunks(R) * C;
  }
  partials_.assign(size_t(partials), 0.0);
  colmax_.assign(size_t(std::max(1, num_threads)) * size_t(2 * colmax_cols_), 0u);
}

void CpuShapedPass::before_step(Algo algo, const std::vector<ParamView>& params, const std::vector<GradView>& grads,
                                const std::vector<StepScalars>& scalars, int num_threads, bool parallel) {
  const int64_t n = int64_t(items_.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (parallel)
  for (int64_t k = 0; k < n; ++k) {
    const StatItem& it = items_[size_t(k)];
    const size_t i = size_t(it.param);
    if (!grads[i].data) continue;
    double* part = partials_.data() + partial_off_[i];
    const bool fac = shaped_moment(params[i], 1) && params[i].moment[1].norm == Norm::Factored;
#ifdef _OPENMP
    const size_t thread = size_t(omp_get_thread_num());
#else
    const size_t thread = 0;
#endif
    uint32_t* colmax = fac ? nullptr : colmax_.data() + thread * size_t(2 * colmax_cols_);
    with_rule(algo, [&](auto rule) {
      constexpr Algo A = decltype(rule)::value;
      LOWBIT_ISA_PICK(stat_item, <A>)(params[i], grads[i], scalars[i], it, part, colmax);
    });
  }
  for (size_t i : shaped_)
    if (grads[i].data && shaped_moment(params[i], 1) && params[i].moment[1].norm == Norm::Factored)
      factored_mid(params[i], scalars[i], partials_.data() + partial_off_[i]);
}

void CpuShapedPass::after_step(const std::vector<ParamView>& params, const std::vector<GradView>& grads) const {
  for (size_t i : shaped_)
    if (grads[i].data) rank1_finish(params[i]);
}

}  // namespace lowbit
