// The CPU engine: OpenMP over ~64K-element chunks; inside a chunk, tiles of
// kTile elements are decoded into fp32 stack arrays (fp32 tensors are used
// where they lie), updated by a loop the compiler vectorises, and encoded
// back. Hyper-parameters and step counts are host memory; a step computes
// each parameter's scalars, checks the gradients, sweeps the chunks and
// advances the counts, on the calling thread's schedule (the stream argument
// is ignored). No heap allocation per step: everything a step touches is
// sized by bind().
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "codec.hpp"
#include "engine.hpp"
#include "error.hpp"
#include "onebit_rules.hpp"
#include "rounding.hpp"
#include "simd.hpp"
#include "step_scalars.hpp"
#include "validation.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace lowbit {
namespace {

template <Algo A>
LOWBIT_VECTOR_CLONES void update_tile(const StepScalars& s, int n, float* __restrict p, const float* __restrict g,
                                      float* __restrict m, float* __restrict v) {
  for (int i = 0; i < n; ++i) update_element<A>(s, p[i], g[i], m[i], v[i]);
}

template <Algo A>
LOWBIT_VECTOR_CLONES void update_tile_factored(const StepScalars& s, int n, float* __restrict p,
                                               const float* __restrict g, float* __restrict m,
                                               const float* __restrict v) {
  if constexpr (A == Algo::AdamW || A == Algo::Adam)
    for (int i = 0; i < n; ++i) update_element_factored<A>(s, p[i], g[i], m[i], v[i]);
}

// 1-bit LAMB's compressed pass over len <= kLambLanes consecutive elements
// (the param's values in fp32): element l feeds lane l of the chunk's reducer (a, b) and of
// the ratio maxima (mx). The per-element rule and the order of every sum are
// LambReducer's; the form lets the compiler vectorise it.
template <bool kMasked>
LOWBIT_VECTOR_CLONES void lamb_compressed_lanes(const StepScalars& s, int len, const uint8_t* __restrict mask,
                                                const float* __restrict avg, float scaling, float* __restrict m,
                                                const float* __restrict v, float* __restrict fresh,
                                                const float* __restrict p, double* __restrict a,
                                                double* __restrict b, float* __restrict mx) {
  for (int l = 0; l < len; ++l) {
    float pre, u;
    const float ratio =
        lamb_compressed_element(s, kMasked && !mask[l], avg[l], scaling, m[l], v[l], fresh[l], p[l], pre, u);
    mx[l] = std::max(mx[l], ratio);
    a[l] += double(pre) * pre;
    b[l] += double(u) * u;
  }
}

// 1-bit Adam's apply over n elements (the param's values in fp32: its own
// memory, or a tile of a bf16 / fp16 one, see param_spans): m = 0 where
// masked, else the averaged momentum (kBlend: blended into the local one),
// then the update with the frozen v; onebit_rules.hpp's rule, vectorisable.
template <bool kMasked, bool kBlend>
LOWBIT_VECTOR_CLONES void onebit_apply_fp32(const StepScalars& s, int64_t n, const uint8_t* __restrict mask,
                                            const float* __restrict avg, float* __restrict m,
                                            const float* __restrict v, float* __restrict p) {
  for (int64_t k = 0; k < n; ++k) {
    const float mk = kMasked && !mask[k] ? 0.f : (kBlend ? onebit_local_momentum(s, m[k], avg[k]) : avg[k]);
    m[k] = mk;
    onebit_apply(s, p[k], mk, v[k]);
  }
}

// The local momentum of n grads (fp32 values), times `scaling` (1-bit LAMB's; 1 for
// 1-bit Adam, which leaves every value as it is), into out (0 where masked).
template <bool kMasked>
LOWBIT_VECTOR_CLONES void local_momentum_fp32(const StepScalars& s, float scaling, int64_t n,
                                              const uint8_t* __restrict mask, const float* __restrict m,
                                              const float* __restrict g, float* __restrict out) {
  for (int64_t k = 0; k < n; ++k)
    out[k] = kMasked && !mask[k] ? 0.f : onebit_local_momentum(s, m[k], g[k]) * scaling;
}

// 0/1 Adam's synchronisation over n elements (param and grad values in
// fp32): the deltas to average (0 where masked), then, after the exchange,
// the new momentum, param and sync param; onebit_rules.hpp's rules.
template <bool kMasked>
LOWBIT_VECTOR_CLONES void zeroone_delta_fp32(const StepScalars& s, int64_t n, const uint8_t* __restrict mask,
                                             const float* __restrict m, const float* __restrict g,
                                             const float* __restrict v, const float* __restrict ps,
                                             const float* __restrict p, float* __restrict out) {
  for (int64_t k = 0; k < n; ++k)
    out[k] = kMasked && !mask[k] ? 0.f : zeroone_sync_delta(s, m[k], g[k], v[k], ps[k], p[k]);
}

template <bool kMasked>
LOWBIT_VECTOR_CLONES void zeroone_sync_fp32(int64_t n, float eps, float inv_lrs, const uint8_t* __restrict mask,
                                            const float* __restrict d, const float* __restrict v, float* __restrict m,
                                            float* __restrict ps, float* __restrict p) {
  for (int64_t k = 0; k < n; ++k) {
    m[k] = kMasked && !mask[k] ? 0.f : d[k] * inv_lrs;
    const float x = zeroone_sync_param(ps[k], d[k], v[k], eps);
    p[k] = x;
    ps[k] = x;
  }
}

// p -= step * lamb_update(m, v, p) over n params (fp32 values).
LOWBIT_VECTOR_CLONES void lamb_apply_fp32(int64_t n, float step, float eps, float weight_decay,
                                          const float* __restrict m, const float* __restrict v, float* __restrict p) {
  for (int64_t i = 0; i < n; ++i) p[i] -= step * lamb_update(m[i], v[i], p[i], eps, weight_decay);
}

// 1-bit LAMB's warm-up, its first pass over len <= kLambLanes consecutive
// elements (fp32 values of the param and grad): element l feeds lane l of the
// chunk's reducer with p^2 and the update's u^2; `bad` collects a non-finite
// grad. The moments are not written (the second pass does).
LOWBIT_VECTOR_CLONES void lamb_warmup_lanes(const StepScalars& s, int len, const float* __restrict g,
                                            const float* __restrict p, const float* __restrict m,
                                            const float* __restrict v, double* __restrict a, double* __restrict b,
                                            int32_t& bad) {
  int32_t found = 0;
  for (int l = 0; l < len; ++l) {
    found |= !std::isfinite(g[l]);
    float mk = m[l], vk = v[l];
    lamb_moments(s, g[l], mk, vk);
    const float u = lamb_update(mk, vk, p[l], s.eps, s.weight_decay);
    a[l] += double(p[l]) * p[l];
    b[l] += double(u) * u;
  }
  bad |= found;
}

// Its second pass over n elements: the moments (m = 0 where masked; v also
// into fresh when kFresh) and p -= step * lamb_update.
template <bool kMasked, bool kFresh>
LOWBIT_VECTOR_CLONES void lamb_warmup_apply(const StepScalars& s, float step, int64_t n, const uint8_t* __restrict mask,
                                            const float* __restrict g, float* __restrict m, float* __restrict v,
                                            float* __restrict fresh, float* __restrict p) {
  for (int64_t k = 0; k < n; ++k) {
    float mk = m[k], vk = v[k];
    lamb_moments(s, g[k], mk, vk);
    p[k] -= step * lamb_update(mk, vk, p[k], s.eps, s.weight_decay);
    m[k] = kMasked && !mask[k] ? 0.f : mk;
    v[k] = vk;
    if (kFresh) fresh[k] = vk;
  }
}

// body(b, n, p) over elements [c.begin, c.end) of a param as fp32, p the
// values of elements b .. b + n - 1: when `direct` (an fp32 param) the whole
// chunk at once on the param's own memory; otherwise tile by tile on a copy
// (load_param_tile), stored back with the param's rounding and `key` when
// kStore. The 1-bit passes run their fp32 loops on bf16 and fp16 params this
// way, with the same per-element rules and rounding as the step's tiles.
template <bool kStore, class Body>
void param_spans(const ParamView& pv, uint64_t key, const Chunk& c, bool direct, const Body& body) {
  if (direct) {
    body(c.begin, c.end - c.begin, static_cast<float*>(pv.param) + c.begin);
    return;
  }
  alignas(64) float p[kTile];
  for (int64_t b = c.begin; b < c.end; b += kTile) {
    const int n = int(std::min<int64_t>(kTile, c.end - b));
    load_param_tile(pv, b, n, p);
    body(b, int64_t(n), p);
    if (kStore) store_param_tile(pv, key, b, n, p);
  }
}

// A chunk of a param as fp32 (load_param_tile's values), into out[c.begin,
// c.end).
void load_param_chunk(const ParamView& pv, const Chunk& c, float* out) {
  for (int64_t b = c.begin; b < c.end; b += kTile)
    load_param_tile(pv, b, int(std::min<int64_t>(kTile, c.end - b)), out + b);
}

// Whether a grad's memory is apart from its param's (a grad may share it).
bool grad_apart(const ParamView& pv, const GradView& grad) {
  const char* gp = static_cast<const char*>(grad.data);
  const char* pp = static_cast<const char*>(pv.param);
  return gp + dtype_bytes(grad.dtype) * pv.numel <= pp || pp + dtype_bytes(pv.param_dtype) * pv.numel <= gp;
}

// Elements [b, b + n) of a grad as fp32: its own memory, or (n <= kTile) a
// copy in tmp.
const float* grad_span(const GradView& g, int64_t b, int64_t n, float* tmp) {
  if (g.dtype == LOWBIT_DTYPE_FLOAT32) return static_cast<const float*>(g.data) + b;
  load_tensor_tile(g.data, g.dtype, b, int(n), tmp);
  return tmp;
}

struct alignas(64) Tile {
  float p[kTile], g[kTile], m[kTile], v[kTile];
};

bool shaped_moment(const ParamView& pv, int k) { return k < pv.num_moments && pv.moment[k].norm != Norm::Block; }

// Moment k's data if it is stored as fp32 (updated where it lies), else null.
float* fp32_moment(const ParamView& pv, int k) {
  const bool fp32 = k < pv.num_moments && pv.moment[k].format == LOWBIT_STATE_FP32 && pv.moment[k].norm == Norm::Block;
  return fp32 ? static_cast<float*>(pv.moment[k].data) : nullptr;
}

// Software prefetch of the tile kPrefetchTiles ahead in every stream a tile
// reads (param, its error-correction bytes, grad, per-element moment data).
// The quantized steps spend long enough per tile in the codec that the
// hardware prefetcher falls behind, and their first loads of a tile stall
// (issue 14: 4-bit AdamW 8-12% faster, 8-bit and FP8 4-8%, at 2 threads).
constexpr int kPrefetchTiles = 2;

class TilePrefetch {
 public:
  TilePrefetch(const ParamView& pv, const GradView& grad) {
    add(pv.param, 8 * int(dtype_bytes(pv.param_dtype)));
    if (pv.param_dtype != LOWBIT_DTYPE_FLOAT32 && pv.rounding == WeightRounding::ErrorCorrection) add(pv.ecc, 8);
    add(grad.data, 8 * int(dtype_bytes(grad.dtype)));
    for (int k = 0; k < pv.num_moments; ++k)
      if (pv.moment[k].norm != Norm::Factored)
        add(pv.moment[k].data, int(8 * moment_data_bytes(pv.moment[k].format, kTile) / kTile));
  }
  // Elements [base, base + kTile) of every stream, if below end. Always
  // inlined: GCC counts prefetches as no effect, so where it does not inline
  // this (a larger caller) it deletes the call and the prefetches with it.
  __attribute__((always_inline)) void tile(int64_t base, int64_t end) const {
    if (base >= end) return;
    for (int k = 0; k < n_; ++k) {
      const char* p = data_[k] + base * bits_[k] / 8;
      for (int o = 0; o < kTile * bits_[k] / 8; o += 64) __builtin_prefetch(p + o);
    }
  }

 private:
  void add(const void* data, int bits) {
    if (data) data_[n_] = static_cast<const char*>(data), bits_[n_++] = bits;
  }
  const char* data_[5] = {};
  int bits_[5] = {};
  int n_ = 0;
};

// fp32 tensors are updated where they lie; the others go through the tile's
// fp32 arrays (decoded or loaded before the update, encoded or stored after).
void step_chunk(Algo algo, const ParamView& pv, const GradView& grad, const StepScalars& s, uint64_t key,
                const Chunk& c) {
  Tile t;
  // A grad that shares memory with its param goes through the tile
  // (update_tile's arrays are __restrict, and the param is written in place).
  float* const p_fp32 = pv.param_dtype == LOWBIT_DTYPE_FLOAT32 ? static_cast<float*>(pv.param) : nullptr;
  const float* const g_fp32 =
      grad.dtype == LOWBIT_DTYPE_FLOAT32 && grad_apart(pv, grad) ? static_cast<const float*>(grad.data) : nullptr;
  float* const m_fp32 = fp32_moment(pv, 0);
  float* const v_fp32 = fp32_moment(pv, 1);
  const bool code_m = pv.num_moments > 0 && !m_fp32, code_v = pv.num_moments > 1 && !v_fp32;
  const bool shaped_m = shaped_moment(pv, 0), shaped_v = shaped_moment(pv, 1);
  const bool factored = shaped_v && pv.moment[1].norm == Norm::Factored;
  const TilePrefetch prefetch(pv, grad);
  for (int64_t base = c.begin; base < c.end; base += kTile) {
    int n = int(c.end - base < kTile ? c.end - base : kTile);
    prefetch.tile(base + kPrefetchTiles * kTile, c.end);
    float* p = p_fp32 ? p_fp32 + base : t.p;
    const float* g = g_fp32 ? g_fp32 + base : t.g;
    float* m = m_fp32 ? m_fp32 + base : t.m;
    float* v = v_fp32 ? v_fp32 + base : t.v;
    if (!g_fp32) load_tensor_tile(grad.data, grad.dtype, base, n, t.g);
    if (!p_fp32) load_param_tile(pv, base, n, t.p);
    if (code_m) {
      if (shaped_m)
        decode_shaped_tile(pv.moment[0], pv.shape, pv.numel, base, n, t.m);
      else
        decode_moment_tile(pv.moment[0], base, n, t.m);
    }
    if (code_v) {
      if (shaped_v)
        decode_shaped_tile(pv.moment[1], pv.shape, pv.numel, base, n, t.v);
      else
        decode_moment_tile(pv.moment[1], base, n, t.v);
    }
    if (factored) {
      if (algo == Algo::Adam)
        update_tile_factored<Algo::Adam>(s, n, p, g, m, v);
      else
        update_tile_factored<Algo::AdamW>(s, n, p, g, m, v);
    } else switch (algo) {
      case Algo::AdamW: update_tile<Algo::AdamW>(s, n, p, g, m, v); break;
      case Algo::Adam: update_tile<Algo::Adam>(s, n, p, g, m, v); break;
      case Algo::Lion: update_tile<Algo::Lion>(s, n, p, g, m, v); break;
      case Algo::Sgd: update_tile<Algo::Sgd>(s, n, p, g, m, v); break;
    }
    if (code_m) {
      if (shaped_m)
        encode_rank1_tile(pv.moment[0], pv.shape, base, n, t.m);
      else
        encode_moment_tile(pv.moment[0], base, n, t.m);
    }
    if (code_v && !factored) {
      if (shaped_v)
        encode_rank1_tile(pv.moment[1], pv.shape, base, n, t.v);
      else
        encode_moment_tile(pv.moment[1], base, n, t.v);
    }
    if (!p_fp32) store_param_tile(pv, key, base, n, t.p);
  }
}

// ---- shaped parameters: pass 1 (core/shape.hpp) -----------------------------

// Work of pass 1: rows [a, b) of a parameter (kind 0), or columns [c0, c1) of
// batch `batch` over the rows of column chunk `chunk` (kind 1). A parameter
// without a factored moment has row items only (they also take the rank-1
// column maxima); with one, the column items take the rank-1 first moment's
// column maxima too.
struct StatItem {
  int32_t param, kind;
  int64_t a, b, batch, chunk;
};

void atomic_umax(float* where, uint32_t bits) {
  uint32_t* w = reinterpret_cast<uint32_t*>(where);
  uint32_t cur = __atomic_load_n(w, __ATOMIC_RELAXED);
  while (bits > cur && !__atomic_compare_exchange_n(w, &cur, bits, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

// The new moments of a tile (update_moments), the param read only where L2
// decay feeds it into the grad.
template <Algo A, bool kFirst, bool kSecond>
LOWBIT_VECTOR_CLONES void moments_tile(const StepScalars& s, int n, const float* __restrict p,
                                       const float* __restrict g, float* __restrict m, float* __restrict v) {
  for (int i = 0; i < n; ++i)
    update_moments<A, kFirst, kSecond>(s, kMomentsReadParam<A> ? p[i] : 0.f, g[i], m[i], v[i]);
}

template <Algo A>
LOWBIT_VECTOR_CLONES void factored_g2_tile(const StepScalars& s, int n, const float* __restrict p,
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
void stat_segment(const ParamView& pv, const GradView& grad, const StepScalars& s, int64_t e, int n, Tile& t) {
  load_tensor_tile(grad.data, grad.dtype, e, n, t.g);
  if (kMomentsReadParam<A>) load_param_tile(pv, e, n, t.p);
  const bool r1[2] = {pv.num_moments > 0 && pv.moment[0].norm == Norm::Rank1,
                      pv.num_moments > 1 && pv.moment[1].norm == Norm::Rank1};
  for (int k = 0; k < 2; ++k)
    if (r1[k]) decode_shaped_tile(pv.moment[k], pv.shape, pv.numel, e, n, k ? t.v : t.m);
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
LOWBIT_VECTOR_CLONES uint32_t umax_abs(uint32_t init, const float* x, int n) {
  for (int i = 0; i < n; ++i) init = umax(init, float_bits(x[i]) & 0x7FFFFFFFu);
  return init;
}

// part[l] += x[i] for the i with i % 32 == l, in order: a row sum's 32 lanes
// (core/shape.hpp) over a segment that starts on a multiple of 32.
static_assert(kTile % 32 == 0, "a row's tiles start on lane 0");
LOWBIT_VECTOR_CLONES void add_lanes32(double* __restrict part, const float* __restrict x, int n) {
  int i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 32; ++l) part[l] += double(x[i + l]);
  for (int l = 0; i + l < n; ++l) part[l] += double(x[i + l]);
}

// acc[i] += x[i] in double (a column sum's next row).
LOWBIT_VECTOR_CLONES void add_doubles(double* __restrict acc, const float* __restrict x, int n) {
  for (int i = 0; i < n; ++i) acc[i] += double(x[i]);
}

// mx[i] = max(mx[i], |x[i]| bits).
LOWBIT_VECTOR_CLONES void umax_abs_each(uint32_t* __restrict mx, const float* __restrict x, int n) {
  for (int i = 0; i < n; ++i) mx[i] = umax(mx[i], float_bits(x[i]) & 0x7FFFFFFFu);
}

template <Algo A>
void stat_item(const ParamView& pv, const GradView& grad, const StepScalars& s, const StatItem& it, double* partials,
               uint32_t* colmax) {
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

LOWBIT_VECTOR_CLONES
bool chunk_has_nonfinite(const GradView& grad, const Chunk& c) {
  if (grad.dtype == LOWBIT_DTYPE_FLOAT32) {
    const uint32_t* g = static_cast<const uint32_t*>(grad.data);
    uint32_t bad = 0;
    for (int64_t i = c.begin; i < c.end; ++i) bad |= uint32_t((g[i] & 0x7F800000u) == 0x7F800000u);
    return bad != 0;
  }
  const uint16_t* g = static_cast<const uint16_t*>(grad.data);
  uint16_t exp_mask = grad.dtype == LOWBIT_DTYPE_BFLOAT16 ? 0x7F80u : 0x7C00u;
  uint32_t bad = 0;
  for (int64_t i = c.begin; i < c.end; ++i) bad |= uint32_t((g[i] & exp_mask) == exp_mask);
  return bad != 0;
}

// Below this many elements a step runs on the calling thread: waking a team
// costs more than it saves, and it would compete with the caller's own
// threads (BLAS, data loading) between steps.
constexpr int64_t kParallelMinElements = 1 << 18;

class CpuEngine final : public Engine {
 public:
  explicit CpuEngine(int num_threads) : num_threads_(num_threads) {
    check_num_threads(num_threads);  // every way in (optimizer config, JAX handlers)
#ifdef _OPENMP
    if (num_threads_ <= 0) num_threads_ = omp_get_max_threads();
#else
    num_threads_ = 1;
#endif
  }

  lowbit_device_t device() const override { return LOWBIT_DEVICE_CPU; }

  void* allocate_zeroed(size_t bytes) override {
    void* p = std::calloc(bytes ? bytes : 1, 1);
    if (!p) fail(LOWBIT_ERROR_OUT_OF_MEMORY, "could not allocate ", bytes, " bytes of optimizer state");
    return p;
  }
  void* allocate_scratch(size_t bytes) override {
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) fail(LOWBIT_ERROR_OUT_OF_MEMORY, "could not allocate ", bytes, " bytes of optimizer workspace");
    return p;
  }
  void release(void* ptr) noexcept override { std::free(ptr); }
  void copy_to_host(void* dst, const void* src, size_t bytes, void*) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes, void*) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void wait(void*) override {}

  void bind(const ParamView* params, int64_t num_params, const Chunk* chunks, int64_t num_chunks,
            const int32_t* param_group, int64_t first_changed, void*) override {
    // Registration appends: copy only what may have changed.
    const size_t keep = size_t(std::min<int64_t>(first_changed, std::min<int64_t>(num_params, int64_t(params_.size()))));
    size_t keep_chunks = 0;
    while (keep_chunks < chunks_.size() && keep_chunks < size_t(num_chunks) && size_t(chunks_[keep_chunks].param) < keep)
      ++keep_chunks;
    params_.resize(keep);
    params_.insert(params_.end(), params + keep, params + num_params);
    chunks_.resize(keep_chunks);
    chunks_.insert(chunks_.end(), chunks + keep_chunks, chunks + num_chunks);
    groups_.resize(keep);
    groups_.insert(groups_.end(), param_group + keep, param_group + num_params);
    steps_.resize(size_t(num_params), 0);
    scalars_.resize(size_t(num_params));
    keys_.resize(size_t(num_params));
    grads_.resize(size_t(num_params));
    offsets_.resize(size_t(num_params), 0);
    masks_.resize(size_t(num_params), nullptr);
    total_ = 0;
    for (const Chunk& c : chunks_) total_ += c.end - c.begin;
    build_stat_items();
  }

  void set_hparams(const lowbit_hparams_t* groups, int32_t num_groups) override {
    hparams_.assign(groups, groups + num_groups);
  }
  lowbit_hparams_t* hparams_memory(int32_t group) override { return &hparams_[size_t(group)]; }

  void step(Algo algo, const GradView* grads, int64_t num_params, const StepControl& ctl, void*) override {
    check_count(num_params, "step");
    const int64_t shared = ctl.shared_count ? int64_t(*ctl.shared_count) : -1;
    bool skip = false;
    for (size_t i = 0; i < params_.size(); ++i) {
      grads_[i] = grads[i];
      if (!grads[i].data) continue;
      lowbit_hparams_t h = hparams_[size_t(groups_[i])];
      if (ctl.lr) h.lr = *ctl.lr;
      const int64_t t = shared >= 0 ? shared : steps_[i];
      scalars_[i] = make_step_scalars(h, algo != Algo::Lion, t);
      keys_[i] = rounding_key(ctl.seed, uint64_t(i), uint64_t(t + 1));
      if (ctl.layout) {
        const ParamView& v = params_[i];
        const int32_t formats[2] = {int32_t(v.moment[0].format), int32_t(v.moment[1].format)};
        const int32_t norms[2] = {int32_t(v.moment[0].norm), int32_t(v.moment[1].norm)};
        skip |= !layout_matches(ctl.layout + int64_t(kLayoutColumns) * int64_t(i), v.num_moments, formats, norms,
                                int32_t(v.rounding), v.shape);
      }
    }
    if (!skip && ctl.check_nonfinite) skip = any_nonfinite();
    if (!skip && !stat_items_.empty()) pass1(algo);
    if (!skip) {
      const int64_t n = int64_t(chunks_.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads_) if (parallel())
      for (int64_t k = 0; k < n; ++k) {
        const Chunk& c = chunks_[size_t(k)];
        const size_t i = size_t(c.param);
        if (grads_[i].data) step_chunk(algo, params_[i], grads_[i], scalars_[i], keys_[i], c);
      }
      for (size_t i : shaped_)
        if (grads_[i].data) rank1_finish(params_[i]);
      if (shared < 0)
        for (size_t i = 0; i < params_.size(); ++i) steps_[i] += grads_[i].data ? 1 : 0;
    }
    if (ctl.shared_count_out) *ctl.shared_count_out = int32_t(shared + (skip ? 0 : 1));
    skipped_ = skip;
  }

  bool last_step_skipped() const override { return skipped_; }

  void read_steps(int64_t* out, int64_t num_params, void*) override {
    check_count(num_params, "read_steps");
    std::memcpy(out, steps_.data(), size_t(num_params) * sizeof(int64_t));
  }
  void write_steps(const int64_t* in, int64_t num_params, void*) override {
    check_count(num_params, "write_steps");
    std::memcpy(steps_.data(), in, size_t(num_params) * sizeof(int64_t));
  }

  // ---- 1-bit Adam
  void bind_onebit(const int64_t* offsets, const uint8_t* const* masks, int64_t num_params) override {
    check_count(num_params, "bind_onebit");
    offsets_.assign(offsets, offsets + num_params);
    masks_.assign(masks, masks + num_params);
  }

  void onebit_gather(const GradView* grads, float* bucket, void*) override {
    for_chunks([&](const Chunk& c) {
      const size_t i = size_t(c.param);
      float* out = bucket + offsets_[i];
      for (int64_t b = c.begin; b < c.end; b += kTile)
        load_tensor_tile(grads[i].data, grads[i].dtype, b, int(std::min<int64_t>(kTile, c.end - b)), out + b);
    });
  }

  void onebit_mask(void*) override {
    if (skipped_) return;
    for_chunks([&](const Chunk& c) {
      const size_t i = size_t(c.param);
      if (!masks_[i]) return;
      float* m = static_cast<float*>(params_[i].moment[0].data);
      for (int64_t k = c.begin; k < c.end; ++k)
        if (!masks_[i][k]) m[k] = 0.f;
    });
  }

  void onebit_momentum(const GradView* grads, float* bucket, void*) override {
    local_momentum(grads, nullptr, bucket);
  }

  void onebit_apply(const OneBitApply& a, void*) override {
    skipped_ = a.skip || (a.skip_if_positive && *a.skip_if_positive > 0.f);
    if (skipped_) return;
    prepare_onebit_scalars(a.freeze_step, a.seed);
    for_chunks([&](const Chunk& c) {
      const size_t i = size_t(c.param);
      const ParamView& pv = params_[i];
      const StepScalars& s = scalars_[i];
      float* m = static_cast<float*>(pv.moment[0].data);
      const float* v = static_cast<const float*>(pv.moment[1].data);
      const float* avg = a.bucket + offsets_[i];
      const uint8_t* mask = masks_[i];
      param_spans<true>(pv, keys_[i], c, pv.param_dtype == LOWBIT_DTYPE_FLOAT32, [&](int64_t b, int64_t n, float* p) {
        const uint8_t* mb = mask ? mask + b : nullptr;
        if (mask && a.blend)
          onebit_apply_fp32<true, true>(s, n, mb, avg + b, m + b, v + b, p);
        else if (mask)
          onebit_apply_fp32<true, false>(s, n, mb, avg + b, m + b, v + b, p);
        else if (a.blend)
          onebit_apply_fp32<false, true>(s, n, mb, avg + b, m + b, v + b, p);
        else
          onebit_apply_fp32<false, false>(s, n, mb, avg + b, m + b, v + b, p);
      });
    });
    for (int64_t& t : steps_) ++t;
  }

  void nonfinite_flag(const float* data, int64_t n, float* flag, void*) override {
    bool bad = false;
#pragma omp parallel for reduction(|| : bad) num_threads(num_threads_) if (n >= kParallelMinElements)
    for (int64_t k = 0; k < n; ++k) bad = bad || !std::isfinite(data[k]);
    *flag = bad ? 1.f : 0.f;
  }

  // ---- 0/1 Adam
  void zeroone_snapshot(float* sync_params, void*) override {
    for_chunks([&](const Chunk& c) {
      load_param_chunk(params_[size_t(c.param)], c, sync_params + offsets_[size_t(c.param)]);
    });
  }

  void zeroone_sync_pack(const GradView* grads, const float* sync_params, float* bucket, void*) override {
    prepare_onebit_scalars(0, 0);
    for_chunks([&](const Chunk& c) {
      const size_t i = size_t(c.param);
      const ParamView& pv = params_[i];
      const StepScalars& s = scalars_[i];
      const float* m = static_cast<const float*>(pv.moment[0].data);
      const float* v = static_cast<const float*>(pv.moment[1].data);
      const float* ps = sync_params + offsets_[i];
      const uint8_t* mask = masks_[i];
      float* out = bucket + offsets_[i];
      const bool direct = grads[i].dtype == LOWBIT_DTYPE_FLOAT32 && pv.param_dtype == LOWBIT_DTYPE_FLOAT32;
      param_spans<false>(pv, 0, c, direct, [&](int64_t b, int64_t n, const float* p) {
        alignas(64) float tg[kTile];
        const float* g = grad_span(grads[i], b, n, tg);
        if (mask)
          zeroone_delta_fp32<true>(s, n, mask + b, m + b, g, v + b, ps + b, p, out + b);
        else
          zeroone_delta_fp32<false>(s, n, nullptr, m + b, g, v + b, ps + b, p, out + b);
      });
    });
  }

  void zeroone_sync_apply(const ZeroOneSync& a, void*) override {
    skipped_ = a.skip;
    if (skipped_) return;
    prepare_onebit_scalars(0, a.seed);
    for_chunks([&](const Chunk& c) {
      const size_t i = size_t(c.param);
      const ParamView& pv = params_[i];
      const float eps = scalars_[i].eps;
      const float inv_lrs = a.group_inv_lrs[groups_[i]];
      float* m = static_cast<float*>(pv.moment[0].data);
      const float* v = static_cast<const float*>(pv.moment[1].data);
      const float* d = a.bucket + offsets_[i];
      float* ps = a.sync_params + offsets_[i];
      const uint8_t* mask = masks_[i];
      const bool direct = pv.param_dtype == LOWBIT_DTYPE_FLOAT32;
      param_spans<true>(pv, keys_[i], c, direct, [&](int64_t b, int64_t n, float* p) {
        if (mask)
          zeroone_sync_fp32<true>(n, eps, inv_lrs, mask + b, d + b, v + b, m + b, ps + b, p);
        else
          zeroone_sync_fp32<false>(n, eps, inv_lrs, nullptr, d + b, v + b, m + b, ps + b, p);
      });
      // The sync params are the params as stored (rounded), as the next
      // synchronisation reads them back.
      if (!direct) load_param_chunk(pv, c, ps);
    });
    for (int64_t& t : steps_) ++t;
  }

  // ---- 1-bit LAMB
  void lamb_warmup(const GradView* grads, const LambStep& a, void*) override {
    prepare_onebit_scalars(0, a.seed);
    for_chunk_indices([&](size_t ci, const Chunk& c) {
      const size_t i = size_t(c.param);
      const ParamView& pv = params_[i];
      const StepScalars& s = scalars_[i];
      const float* m = static_cast<const float*>(pv.moment[0].data);
      const float* v = static_cast<const float*>(pv.moment[1].data);
      const GradView& gv = grads[i];
      LambReducer red;
      int32_t bad = 0;
      const bool direct = pv.param_dtype == LOWBIT_DTYPE_FLOAT32 && gv.dtype == LOWBIT_DTYPE_FLOAT32;
      param_spans<false>(pv, 0, c, direct, [&](int64_t b, int64_t n, const float* p) {
        alignas(64) float tg[kTile];
        for (int64_t k = 0; k < n; k += kLambLanes) {  // b - c.begin is a multiple of kLambLanes
          const int len = int(std::min<int64_t>(kLambLanes, n - k));
          const float* g = grad_span(gv, b + k, len, tg);
          lamb_warmup_lanes(s, len, g, p + k, m + b + k, v + b + k, red.a, red.b, bad);
        }
      });
      a.partials[ci] = red.result(0.f, bad);
    });
    bool bad = false;
    for (size_t ci = 0; ci < chunks_.size(); ++ci) bad = bad || a.partials[ci].nonfinite;
    skipped_ = a.check_nonfinite && bad;
    if (skipped_) return;
    per_param_sums(a.partials, [&](size_t i, double sa, double sb, float) {
      a.scalars[i].trust = lamb_warmup_trust(sa, sb, a.options, a.scalars[i].coeff_freeze);
    });
    for_chunks([&](const Chunk& c) {
      const size_t i = size_t(c.param);
      const ParamView& pv = params_[i];
      const StepScalars& s = scalars_[i];
      const float step = s.lr * a.scalars[i].trust;
      float* m = static_cast<float*>(pv.moment[0].data);
      float* v = static_cast<float*>(pv.moment[1].data);
      float* fresh = a.fresh_v + offsets_[i];
      const GradView& gv = grads[i];
      const uint8_t* mask = masks_[i];
      // A param whose grad shares its memory goes through tiles: each tile's
      // grads are read before the tile is stored.
      const bool direct =
          pv.param_dtype == LOWBIT_DTYPE_FLOAT32 && gv.dtype == LOWBIT_DTYPE_FLOAT32 && grad_apart(pv, gv);
      param_spans<true>(pv, keys_[i], c, direct, [&](int64_t b, int64_t n, float* p) {
        alignas(64) float tg[kTile];
        const float* g = grad_span(gv, b, n, tg);
        const uint8_t* mb = mask ? mask + b : nullptr;
        if (mask && a.seed_fresh_v)
          lamb_warmup_apply<true, true>(s, step, n, mb, g, m + b, v + b, fresh + b, p);
        else if (mask)
          lamb_warmup_apply<true, false>(s, step, n, mb, g, m + b, v + b, fresh + b, p);
        else if (a.seed_fresh_v)
          lamb_warmup_apply<false, true>(s, step, n, mb, g, m + b, v + b, fresh + b, p);
        else
          lamb_warmup_apply<false, false>(s, step, n, mb, g, m + b, v + b, fresh + b, p);
      });
    });
    for (int64_t& t : steps_) ++t;
  }

  void lamb_scaling(LambScalars* scalars, LambPartial* partials, void*) override {
    for_chunk_indices([&](size_t ci, const Chunk& c) {
      const float* m = static_cast<const float*>(params_[size_t(c.param)].moment[0].data);
      LambReducer red;
      for (int64_t k = c.begin; k < c.end; ++k) red.add(k - c.begin, double(m[k]) * m[k], 0.0);
      partials[ci] = red.result(0.f, 0);
    });
    std::vector<double> rms(params_.size(), 0.0);
    per_param_sums(partials, [&](size_t i, double sa, double, float) {
      rms[i] = params_[i].numel ? std::sqrt(sa / double(params_[i].numel)) : 0.0;
    });
    double mean = 0.0;
    int64_t counted = 0;  // empty params do not count (DeepSpeed drops them)
    for (size_t i = 0; i < rms.size(); ++i)
      if (params_[i].numel) mean += rms[i], ++counted;
    mean = counted ? mean / double(counted) : 0.0;
    for (size_t i = 0; i < rms.size(); ++i) scalars[i].scaling = lowbit::lamb_scaling(rms[i], mean);
  }

  void lamb_momentum(const GradView* grads, const LambScalars* scalars, float* bucket, void*) override {
    local_momentum(grads, scalars, bucket);
  }

  void lamb_compressed(const LambStep& a, void*) override {
    skipped_ = a.skip;
    if (skipped_) return;
    prepare_onebit_scalars(0, a.seed);
    for_chunk_indices([&](size_t ci, const Chunk& c) {
      const size_t i = size_t(c.param);
      const ParamView& pv = params_[i];
      const StepScalars& s = scalars_[i];
      float* m = static_cast<float*>(pv.moment[0].data);
      const float* v = static_cast<const float*>(pv.moment[1].data);
      float* fresh = a.fresh_v + offsets_[i];
      const float* avg = a.bucket + offsets_[i];
      const uint8_t* mask = masks_[i];
      const float sc = a.scalars[i].scaling;
      LambReducer red;
      float mx[kLambLanes] = {};
      param_spans<false>(pv, 0, c, pv.param_dtype == LOWBIT_DTYPE_FLOAT32, [&](int64_t b, int64_t n, const float* p) {
        for (int64_t k = 0; k < n; k += kLambLanes) {  // b - c.begin is a multiple of kLambLanes
          const int64_t e = b + k;
          const int len = int(std::min<int64_t>(kLambLanes, n - k));
          if (mask)
            lamb_compressed_lanes<true>(s, len, mask + e, avg + e, sc, m + e, v + e, fresh + e, p + k, red.a, red.b,
                                        mx);
          else
            lamb_compressed_lanes<false>(s, len, nullptr, avg + e, sc, m + e, v + e, fresh + e, p + k, red.a,
                                         red.b, mx);
        }
      });
      float max_ratio = 0.f;
      for (float x : mx) max_ratio = std::max(max_ratio, x);  // every lane's maximum, as one running one
      a.partials[ci] = red.result(max_ratio, 0);
    });
    per_param_sums(a.partials, [&](size_t i, double sa, double sb, float mx) {
      a.scalars[i].trust = lamb_compressed_trust(mx, sa, sb, scalars_[i].weight_decay, a.options,
                                                 a.scalars[i].coeff_freeze, a.scalars[i].last_factor);
    });
    for_chunks([&](const Chunk& c) {
      const size_t i = size_t(c.param);
      const ParamView& pv = params_[i];
      const StepScalars& s = scalars_[i];
      const float step = s.lr * a.scalars[i].trust;
      const float* m = static_cast<const float*>(pv.moment[0].data);
      const float* v = static_cast<const float*>(pv.moment[1].data);
      param_spans<true>(pv, keys_[i], c, pv.param_dtype == LOWBIT_DTYPE_FLOAT32, [&](int64_t b, int64_t n, float* p) {
        lamb_apply_fp32(n, step, s.eps, s.weight_decay, m + b, v + b, p);
      });
    });
    for (int64_t& t : steps_) ++t;
  }

 private:
  void check_count(int64_t n, const char* what) const {
    LOWBIT_REQUIRE(n == int64_t(params_.size()), LOWBIT_ERROR_INTERNAL, what, ": ", n, " params given, ",
                   params_.size(), " bound");
  }
  bool parallel() const { return total_ >= kParallelMinElements; }

  // Every param's local momentum of its grads into the bucket (0 where
  // masked), times 1-bit LAMB's scaling (scalars; nullptr: 1-bit Adam's, times
  // 1, which leaves every value as it is).
  void local_momentum(const GradView* grads, const LambScalars* scalars, float* bucket) {
    for_chunks([&](const Chunk& c) {
      const size_t i = size_t(c.param);
      StepScalars s{};
      s.beta1 = hparams_[size_t(groups_[i])].beta1;
      const float sc = scalars ? scalars[i].scaling : 1.f;
      const float* m = static_cast<const float*>(params_[i].moment[0].data);
      const uint8_t* mask = masks_[i];
      float* out = bucket + offsets_[i];
      const bool direct = grads[i].dtype == LOWBIT_DTYPE_FLOAT32;
      const int64_t span = direct ? c.end - c.begin : kTile;
      alignas(64) float tg[kTile];
      for (int64_t b = c.begin; b < c.end; b += span) {
        const int64_t n = std::min<int64_t>(span, c.end - b);
        const float* g = grad_span(grads[i], b, n, tg);
        if (mask)
          local_momentum_fp32<true>(s, sc, n, mask + b, m + b, g, out + b);
        else
          local_momentum_fp32<false>(s, sc, n, nullptr, m + b, g, out + b);
      }
    });
  }

  // 1-bit passes: every parameter's scalars (no bias correction past
  // freeze_step) and rounding key for the step that follows its count.
  void prepare_onebit_scalars(int64_t freeze_step, uint64_t seed) {
    for (size_t i = 0; i < params_.size(); ++i) {
      scalars_[i] = make_onebit_scalars(hparams_[size_t(groups_[i])], steps_[i], freeze_step);
      keys_[i] = rounding_key(seed, uint64_t(i), uint64_t(steps_[i] + 1));
    }
  }

  template <class Body>
  void for_chunk_indices(const Body& body) const {
    const int64_t n = int64_t(chunks_.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads_) if (parallel())
    for (int64_t k = 0; k < n; ++k) body(size_t(k), chunks_[size_t(k)]);
  }

  // Per parameter, its chunks' partials added in chunk order.
  template <class Body>
  void per_param_sums(const LambPartial* partials, const Body& body) const {
    size_t ci = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      double sa = 0.0, sb = 0.0;
      float mx = 0.f;
      for (; ci < chunks_.size() && size_t(chunks_[ci].param) == i; ++ci) {
        sa += partials[ci].sum_a;
        sb += partials[ci].sum_b;
        mx = std::max(mx, partials[ci].max_ratio);
      }
      body(i, sa, sb, mx);
    }
  }

  // The pass-1 work of the shaped parameters (rows in groups; with a factored
  // moment, column strips of kTile by chunks of kColChunkRows rows) and the
  // factored partials.
  void build_stat_items() {
    stat_items_.clear();
    shaped_.clear();
    colmax_cols_ = 0;
    partial_off_.assign(params_.size(), 0);
    int64_t partials = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      const ParamView& pv = params_[i];
      if (!shaped_moment(pv, 0) && !shaped_moment(pv, 1)) continue;
      shaped_.push_back(i);
      const Shape& sh = pv.shape;
      const int64_t C = shape_cols(sh), rows = shape_rows(sh, pv.numel);
      const bool fac = shaped_moment(pv, 1) && pv.moment[1].norm == Norm::Factored;
      // Rank-1 only: the row items take the column maxima as well (larger
      // items: their C atomics per moment are spread over more rows).
      const int64_t per = std::max<int64_t>(1, (fac ? 8192 : 32768) / C);
      for (int64_t q = 0; q < rows; q += per) stat_items_.push_back({int32_t(i), 0, q, std::min(rows, q + per), 0, 0});
      if (!fac) {
        colmax_cols_ = std::max(colmax_cols_, C);
        continue;
      }
      const int64_t R = shape_batch_rows(sh), B = rows / R;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t k = 0; k < col_chunks(R); ++k)
          for (int64_t c = 0; c < C; c += kTile)
            stat_items_.push_back({int32_t(i), 1, c, std::min(C, c + kTile), b, k});
      partial_off_[i] = partials;
      partials += B * col_chunks(R) * C;
    }
    partials_.assign(size_t(partials), 0.0);
    colmax_.assign(size_t(std::max(1, num_threads_)) * size_t(2 * colmax_cols_), 0u);
  }

  void pass1(Algo algo) {
    const int64_t n = int64_t(stat_items_.size());
    const bool par = parallel();
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads_) if (par)
    for (int64_t k = 0; k < n; ++k) {
      const StatItem& it = stat_items_[size_t(k)];
      const size_t i = size_t(it.param);
      if (!grads_[i].data) continue;
      double* part = partials_.data() + partial_off_[i];
      const bool fac = shaped_moment(params_[i], 1) && params_[i].moment[1].norm == Norm::Factored;
#ifdef _OPENMP
      const size_t thread = size_t(omp_get_thread_num());
#else
      const size_t thread = 0;
#endif
      uint32_t* colmax = fac ? nullptr : colmax_.data() + thread * size_t(2 * colmax_cols_);
      switch (algo) {
        case Algo::AdamW: stat_item<Algo::AdamW>(params_[i], grads_[i], scalars_[i], it, part, colmax); break;
        case Algo::Adam: stat_item<Algo::Adam>(params_[i], grads_[i], scalars_[i], it, part, colmax); break;
        case Algo::Lion: stat_item<Algo::Lion>(params_[i], grads_[i], scalars_[i], it, part, colmax); break;
        case Algo::Sgd: stat_item<Algo::Sgd>(params_[i], grads_[i], scalars_[i], it, part, colmax); break;
      }
    }
    for (size_t i : shaped_)
      if (grads_[i].data && shaped_moment(params_[i], 1) && params_[i].moment[1].norm == Norm::Factored)
        factored_mid(params_[i], scalars_[i], partials_.data() + partial_off_[i]);
  }

  bool any_nonfinite() const {
    int found = 0;
    const int64_t n = int64_t(chunks_.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads_) reduction(| : found) if (parallel())
    for (int64_t k = 0; k < n; ++k) {
      const Chunk& c = chunks_[size_t(k)];
      const GradView& g = grads_[size_t(c.param)];
      if (g.data && chunk_has_nonfinite(g, c)) found |= 1;
    }
    return found != 0;
  }

  template <class Body>
  void for_chunks(const Body& body) const {
    const int64_t n = int64_t(chunks_.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads_) if (parallel())
    for (int64_t k = 0; k < n; ++k) body(chunks_[size_t(k)]);
  }

  int num_threads_;
  std::vector<ParamView> params_;
  std::vector<Chunk> chunks_;
  std::vector<int32_t> groups_;
  std::vector<lowbit_hparams_t> hparams_;
  std::vector<int64_t> steps_;
  std::vector<StepScalars> scalars_;
  std::vector<uint64_t> keys_;
  std::vector<GradView> grads_;
  std::vector<int64_t> offsets_;
  std::vector<const uint8_t*> masks_;
  int64_t total_ = 0;
  bool skipped_ = false;
  std::vector<StatItem> stat_items_;
  std::vector<size_t> shaped_;
  std::vector<int64_t> partial_off_;
  std::vector<double> partials_;
  // Per thread, 2 * colmax_cols_ column maxima of a rank-1 row item.
  std::vector<uint32_t> colmax_;
  int64_t colmax_cols_ = 0;
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(int num_threads) { return std::make_unique<CpuEngine>(num_threads); }

#ifndef LOWBIT_HAVE_CUDA
std::unique_ptr<Engine> make_cuda_engine(int) {
  fail(LOWBIT_ERROR_UNSUPPORTED, "device: this lowbit library was built without CUDA support");
}
#endif

}  // namespace lowbit
