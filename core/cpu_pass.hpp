// The CPU engine's runner of passes (core/pass.hpp): OpenMP over the bound
// chunks; inside a chunk the rule runs over spans of fp32 values, an fp32
// param or grad where it lies, a 16-bit one through tiles of kTile elements
// loaded (and stored with the param's rounding) around the span, in loops
// the compiler vectorises, compiled once per instruction-set level
// (core/isa.hpp). Included by the translation units that instantiate
// passes (the layer that owns the rules); they must be compiled with the
// flags of core/cpu_engine.cpp (-O3 -ffp-contract=off -fno-math-errno
// -fno-trapping-math), which keep every clone at the same bits.
#pragma once
#include <algorithm>
#include <cstdint>

#include "codec_tiles.hpp"
#include "engine.hpp"
#include "isa.hpp"
#include "pass.hpp"

namespace lowbit {

// What a CPU pass reads of the engine (all host memory; sized by bind()).
struct CpuPassTables {
  const ParamView* params;
  const Chunk* chunks;
  int64_t num_params, num_chunks;
  const int32_t* groups;
  const StepScalars* scalars;
  const uint64_t* keys;
  const GradView* grads;
  const lowbit_hparams_t* hparams;
  const int64_t* flat_offsets;
  const uint8_t* const* masks;
  PassPartial* partials;  // one per chunk
  bool* skipped;          // the step's skip flag
  bool stepped_only;      // PassStep::stepped_only
  int num_threads;
  bool parallel;  // enough elements to wake the OpenMP team
};

namespace cpu_pass {

// The fp32 spans of one run of n elements (n <= one chunk).
struct Span {
  float* p;
  const float* g;
  float* m;
  float* v;
  float* x;
  float* y;
  const uint8_t* mask;
};

template <class Rule>
constexpr uint32_t kTouches = Rule::kReads | Rule::kWrites;

// Loads what the rule reads of element i, runs it, stores what it writes.
template <class Rule, bool kMasked>
__attribute__((always_inline)) inline PassElement apply(const Rule& rule, const typename Rule::Ctx& c, const Span& s,
                                                        int64_t i) {
  PassElement e{};
  e.keep = true;
  constexpr uint32_t R = Rule::kReads, W = Rule::kWrites;
  if (R & kIoParam) e.p = s.p[i];
  if (R & kIoGrad) e.g = s.g[i];
  if (R & kIoM) e.m = s.m[i];
  if (R & kIoV) e.v = s.v[i];
  if (R & kIoX) e.x = s.x[i];
  if (R & kIoY) e.y = s.y[i];
  if (kMasked) e.keep = s.mask[i] != 0;
  rule.element(c, e);
  if (W & kIoParam) s.p[i] = e.p;
  if (W & kIoM) s.m[i] = e.m;
  if (W & kIoV) s.v[i] = e.v;
  if (W & kIoX) s.x[i] = e.x;
  if ((W & kIoY) && !(W & kIoYStoredParam)) s.y[i] = e.y;
  return e;
}

template <class Rule, bool kMasked>
inline void elements(const Rule& rule, const typename Rule::Ctx c, int64_t n, float* __restrict p,
                                   const float* __restrict g, float* __restrict m, float* __restrict v,
                                   float* __restrict x, float* __restrict y, const uint8_t* __restrict mask) {
  const Span s{p, g, m, v, x, y, mask};
  for (int64_t i = 0; i < n; ++i) apply<Rule, kMasked>(rule, c, s, i);
}

// len <= kPassLanes consecutive elements from a multiple of kPassLanes into
// the chunk: element l feeds lane l.
template <class Rule, bool kMasked>
inline void lanes(const Rule& rule, const typename Rule::Ctx c, int len, float* __restrict p,
                                const float* __restrict g, float* __restrict m, float* __restrict v,
                                float* __restrict x, float* __restrict y, const uint8_t* __restrict mask,
                                double* __restrict a, double* __restrict b, float* __restrict mx, int32_t& bad) {
  const Span s{p, g, m, v, x, y, mask};
  int32_t found = 0;
  for (int l = 0; l < len; ++l) {
    const PassElement e = apply<Rule, kMasked>(rule, c, s, l);
    if (Rule::kReduce & kSumA) a[l] += e.ra;
    if (Rule::kReduce & kSumB) b[l] += e.rb;
    if (Rule::kReduce & kMax) mx[l] = std::max(mx[l], e.rmax);
    if (Rule::kReduce & kBad) found |= int32_t(e.bad);
  }
  bad |= found;
}

// The rule over chunk c of param i: runs of whole chunks where every tensor
// the rule touches is fp32 where it lies, else tiles of kTile.
template <class Rule>
inline void chunk_body(const CpuPassTables& t, const Rule& rule, int64_t k) {
  constexpr uint32_t T = kTouches<Rule>;
  const Chunk& c = t.chunks[k];
  const size_t i = size_t(c.param);
  const ParamView& pv = t.params[i];
  const GradView& gv = t.grads[i];
  const PassParam pp{int64_t(i), pv.numel, t.groups[i], &t.scalars[i], &t.hparams[t.groups[i]]};
  const typename Rule::Ctx ctx = rule.param(pp);
  const uint64_t key = t.keys[i];
  const int64_t off = t.flat_offsets[i];
  const uint8_t* mask = (T & kIoMask) ? t.masks[i] : nullptr;
  if ((Rule::kMaskedOnly && !mask) || (t.stepped_only && !gv.data)) return;
  float* m = (T & kIoM) ? static_cast<float*>(pv.moment[0].data) : nullptr;
  float* v = (T & kIoV) ? static_cast<float*>(pv.moment[1].data) : nullptr;
  float* x = (T & kIoX) ? rule.x + off : nullptr;
  float* y = (T & kIoY) ? rule.y + off : nullptr;
  const bool p_fp32 = !(T & kIoParam) || pv.param_dtype == LOWBIT_DTYPE_FLOAT32;
  // A grad that shares memory with a param the rule writes goes through tiles
  // (the spans are __restrict).
  const bool g_fp32 = !(T & kIoGrad) || (gv.dtype == LOWBIT_DTYPE_FLOAT32 &&
                                         (!(Rule::kWrites & kIoParam) || grad_apart(pv, gv)));
  const bool direct = p_fp32 && g_fp32;
  const int64_t span = direct ? c.end - c.begin : kTile;
  alignas(64) float tp[kTile], tg[kTile];
  PassLanes red;
  int32_t bad = 0;
  if (Rule::kReduce) std::fill(red.a, red.a + kPassLanes, 0.0), std::fill(red.b, red.b + kPassLanes, 0.0),
                     std::fill(red.max, red.max + kPassLanes, 0.f);
  for (int64_t b = c.begin; b < c.end; b += span) {
    const int64_t n = std::min<int64_t>(span, c.end - b);
    float* p = nullptr;
    const float* g = nullptr;
    if (T & kIoParam) {
      if (pv.param_dtype == LOWBIT_DTYPE_FLOAT32) {
        p = static_cast<float*>(pv.param) + b;
      } else {
        tiles::load_param_tile(pv, b, int(n), tp);
        p = tp;
      }
    }
    if (T & kIoGrad) {
      if (g_fp32) {
        g = static_cast<const float*>(gv.data) + b;
      } else {
        tiles::load_tensor_tile(gv.data, gv.dtype, b, int(n), tg);
        g = tg;
      }
    }
    float* mb = m ? m + b : nullptr;
    float* vb = v ? v + b : nullptr;
    float* xb = x ? x + b : nullptr;
    float* yb = y ? y + b : nullptr;
    const uint8_t* kb = mask ? mask + b : nullptr;
    if (Rule::kReduce) {
      for (int64_t q = 0; q < n; q += kPassLanes) {  // b - c.begin is a multiple of kPassLanes
        const int len = int(std::min<int64_t>(kPassLanes, n - q));
        auto at = [q](auto* ptr) { return ptr ? ptr + q : ptr; };
        if (kb)
          lanes<Rule, true>(rule, ctx, len, at(p), at(g), at(mb), at(vb), at(xb), at(yb), kb + q, red.a, red.b,
                            red.max, bad);
        else
          lanes<Rule, false>(rule, ctx, len, at(p), at(g), at(mb), at(vb), at(xb), at(yb), nullptr, red.a, red.b,
                             red.max, bad);
      }
    } else if (kb) {
      elements<Rule, true>(rule, ctx, n, p, g, mb, vb, xb, yb, kb);
    } else {
      elements<Rule, false>(rule, ctx, n, p, g, mb, vb, xb, yb, nullptr);
    }
    if ((Rule::kWrites & kIoParam) && pv.param_dtype != LOWBIT_DTYPE_FLOAT32) tiles::store_param_tile(pv, key, b, int(n), tp);
    if (Rule::kWrites & kIoYStoredParam) {
      if (pv.param_dtype == LOWBIT_DTYPE_FLOAT32)
        std::copy(p, p + n, yb);
      else
        tiles::load_param_tile(pv, b, int(n), yb);
    }
  }
  if (Rule::kReduce) t.partials[k] = finish_lanes(red, bad);
}

// chunk_<level>: chunk_body compiled for each instruction-set level.
LOWBIT_PER_ISA_TEMPLATE((class Rule), void, chunk, (const CpuPassTables& t, const Rule& rule, int64_t k),
                        chunk_body(t, rule, k))

// The parameters as finish_all() sees them.
struct Params {
  const CpuPassTables* t;
  int64_t size() const { return t->num_params; }
  int64_t numel(int64_t i) const { return t->params[i].numel; }
};

}  // namespace cpu_pass

template <class Rule>
void run_cpu_pass(const CpuPassTables& t, const Rule& rule, const PassStep& step) {
  const int64_t n = t.num_chunks;
  void (*const chunk)(const CpuPassTables&, const Rule&, int64_t) = LOWBIT_ISA_PICK(cpu_pass::chunk, <Rule>);
#pragma omp parallel for schedule(dynamic, 1) num_threads(t.num_threads) if (t.parallel)
  for (int64_t k = 0; k < n; ++k) chunk(t, rule, k);
  bool any_bad = false;
  if (Rule::kReduce & kBad)
    for (int64_t k = 0; k < n; ++k) any_bad = any_bad || t.partials[k].bad != 0;
  if (step.skip_on_bad && any_bad) {
    *t.skipped = true;
    return;
  }
  if constexpr (Rule::kFinish) {
    int64_t k = 0;
    for (int64_t i = 0; i < t.num_params; ++i) {
      PassSums s{0.0, 0.0, 0.f};
      for (; k < n && t.chunks[k].param == i; ++k) {
        s.a += t.partials[k].a;
        s.b += t.partials[k].b;
        s.max = std::max(s.max, t.partials[k].max);
      }
      if (t.stepped_only && !t.grads[i].data) continue;
      const int32_t g = t.groups[i];
      rule.finish(PassParam{i, t.params[i].numel, g, &t.scalars[i], &t.hparams[g]}, s);
    }
  }
  if constexpr (Rule::kFinishAll) rule.finish_all(cpu_pass::Params{&t}, any_bad);
}

template <class Rule>
void run_pass(Engine& engine, const Rule& rule, const PassStep& step, void* stream) {
  const RulePass<Rule> pass(rule, step);
  engine.run_pass(pass, stream);
}

}  // namespace lowbit
