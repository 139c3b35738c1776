// The CPU engine's fused step over one chunk: tiles of kTile elements are
// decoded into fp32 stack arrays (fp32 tensors are used where they lie),
// updated by a loop the compiler vectorises (update_rules.hpp), and encoded
// back; and the non-finite check of a chunk's gradient. Both are compiled
// once per instruction-set level (core/isa.hpp).
#include "cpu_step.hpp"

#include <cmath>

#include "codec_tiles.hpp"
#include "isa.hpp"
#include "rounding.hpp"
#include "shaped_tiles.hpp"

namespace lowbit {
namespace {

template <Algo A>
inline void update_tile(const StepScalars& s, int n, float* __restrict p, const float* __restrict g,
                                      float* __restrict m, float* __restrict v) {
  for (int i = 0; i < n; ++i) update_element<A>(s, p[i], g[i], m[i], v[i]);
}

template <Algo A>
inline void update_tile_factored(const StepScalars& s, int n, float* __restrict p,
                                               const float* __restrict g, float* __restrict m,
                                               const float* __restrict v) {
  if constexpr (A == Algo::AdamW || A == Algo::Adam)
    for (int i = 0; i < n; ++i) update_element_factored<A>(s, p[i], g[i], m[i], v[i]);
}

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
inline void step_chunk_body(Algo algo, const ParamView& pv, const GradView& grad, const StepScalars& s, uint64_t key,
                            const Chunk& c, float* out) {
  Tile t;
  // A grad that shares memory with its param goes through the tile
  // (update_tile's arrays are __restrict, and the param is written in place).
  float* const p_fp32 = out ? out : pv.param_dtype == LOWBIT_DTYPE_FLOAT32 ? static_cast<float*>(pv.param) : nullptr;
  const float* const g_fp32 = grad.dtype == LOWBIT_DTYPE_FLOAT32 && (out || grad_apart(pv, grad))
                                  ? static_cast<const float*>(grad.data)
                                  : nullptr;
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
    if (!g_fp32) tiles::load_tensor_tile(grad.data, grad.dtype, base, n, t.g);
    if (!p_fp32) tiles::load_param_tile(pv, base, n, t.p);
    if (code_m) {
      if (shaped_m)
        tiles::decode_shaped_tile(pv.moment[0], pv.shape, pv.numel, base, n, t.m);
      else
        tiles::decode_moment_tile(pv.moment[0], base, n, t.m);
    }
    if (code_v) {
      if (shaped_v)
        tiles::decode_shaped_tile(pv.moment[1], pv.shape, pv.numel, base, n, t.v);
      else
        tiles::decode_moment_tile(pv.moment[1], base, n, t.v);
    }
    if (factored) {
      if (algo == Algo::Adam)
        update_tile_factored<Algo::Adam>(s, n, p, g, m, v);
      else
        update_tile_factored<Algo::AdamW>(s, n, p, g, m, v);
    } else {
      with_rule(algo, [&](auto rule) { update_tile<decltype(rule)::value>(s, n, p, g, m, v); });
    }
    if (code_m) {
      if (shaped_m)
        tiles::encode_rank1_tile(pv.moment[0], pv.shape, base, n, t.m);
      else if (pv.moment[0].stochastic)
        tiles::encode_moment_tile_stochastic(pv.moment[0], base, n, t.m, state_rounding_key(key, 0));
      else
        tiles::encode_moment_tile(pv.moment[0], base, n, t.m);
    }
    if (code_v && !factored) {
      if (shaped_v)
        tiles::encode_rank1_tile(pv.moment[1], pv.shape, base, n, t.v);
      else if (pv.moment[1].stochastic)
        tiles::encode_moment_tile_stochastic(pv.moment[1], base, n, t.v, state_rounding_key(key, 1));
      else
        tiles::encode_moment_tile(pv.moment[1], base, n, t.v);
    }
    if (!p_fp32) tiles::store_param_tile(pv, key, base, n, t.p);
  }
}

inline bool nonfinite_body(const GradView& grad, const Chunk& c) {
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

LOWBIT_PER_ISA(void, step_chunk, (Algo algo, const ParamView& pv, const GradView& grad, const StepScalars& s,
                                  uint64_t key, const Chunk& c, float* out),
               step_chunk_body(algo, pv, grad, s, key, c, out))
LOWBIT_PER_ISA(bool, nonfinite, (const GradView& grad, const Chunk& c), nonfinite_body(grad, c))

}  // namespace

void step_chunk(Algo algo, const ParamView& pv, const GradView& grad, const StepScalars& s, uint64_t key,
                const Chunk& c, float* out) {
  LOWBIT_ISA_PICK(step_chunk)(algo, pv, grad, s, key, c, out);
}

bool chunk_has_nonfinite(const GradView& grad, const Chunk& c) { return LOWBIT_ISA_PICK(nonfinite)(grad, c); }

}  // namespace lowbit
