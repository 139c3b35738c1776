// A pass: one rule applied to every element of every bound parameter, over
// the engine's chunks (core/engine.hpp), with optional per-chunk reductions
// in a fixed order and a per-parameter finish. Algorithms above the fused
// step (the distributed optimizers of distributed/) are written as passes:
// a rule from a shared rules file plus a PassStep, run by Engine::run_pass;
// the CPU engine runs the rule with OpenMP over chunks (core/cpu_pass.hpp),
// the CUDA engine with one launcher (cuda/pass_launch.cuh).
//
// A rule is a copyable struct (it is a CUDA kernel argument), derived from
// PassRuleBase, with:
//   static constexpr uint32_t kReads, kWrites;  // PassIo bits
//   static constexpr uint32_t kReduce;          // PassReduce bits (0: none)
//   static constexpr bool kFinish, kFinishAll, kMaskedOnly;
//   float* x; float* y;       // flat fp32 buffers (engine memory) that kIoX /
//                             // kIoY name, indexed by a param's flat offset
//                             // (Engine::bind_flat) plus the element index
//   struct Ctx;               // what element() needs of one parameter
//   LOWBIT_HD Ctx param(const PassParam&) const;
//   LOWBIT_HD void element(const Ctx&, PassElement&) const;  // pure: only its arguments
//   LOWBIT_HD void finish(const PassParam&, const PassSums&) const;      // kFinish
//   template <class P> LOWBIT_HD void finish_all(const P& params, bool any_bad) const;  // kFinishAll
// element() sees and changes only its PassElement: the engines load what
// kReads names, store what kWrites names, and add its contributions to the
// reductions. finish() runs per parameter (in parallel over parameters)
// after the reductions, with its chunks' partials added in chunk order;
// finish_all() once after that (params.size(), params.numel(i)).
//
// Reductions: per chunk, lane l in [0, kPassLanes) sums in double, in index
// order, the elements begin + l, begin + l + kPassLanes, ...; the lane sums
// combine by a pairwise tree (lane l += lane l + h for h = 128, 64, ..., 1);
// maxima and the `bad` flag are order-free. Every engine follows this order,
// so CPU and CUDA agree bit for bit.
#pragma once
#include <cstdint>

#include "hd.hpp"
#include "lowbit.h"
#include "update_rules.hpp"

namespace lowbit {

struct GradView;

// What a rule reads (kReads) or writes (kWrites) of an element. M and V are
// the parameter's moments 0 and 1, which must be fp32 blocks; X and Y the
// rule's flat buffers; the mask is the parameter's element mask (bind_flat).
enum PassIo : uint32_t {
  kIoParam = 1u,
  kIoGrad = 2u,
  kIoM = 4u,
  kIoV = 8u,
  kIoX = 16u,
  kIoY = 32u,
  kIoMask = 64u,
  // kWrites only: y <- the param as stored (read back after its rounding).
  kIoYStoredParam = 128u,
};

// Which of an element's contributions a rule reduces (kReduce).
enum PassReduce : uint32_t { kSumA = 1u, kSumB = 2u, kMax = 4u, kBad = 8u };

constexpr int kPassLanes = 256;

// One element as a rule sees it, in fp32.
struct PassElement {
  float p, g, m, v, x, y;
  bool keep;  // false where the parameter's mask is 0 (no mask: true)
  // Contributions to the chunk's reductions.
  double ra, rb;
  float rmax;
  bool bad;
};

// One parameter as a rule's param() and finish() see it. scalars: the step's
// (make_frozen_scalars of its step count; valid in a pass of a step opened
// with PassStep::begin); hparams: its group's, as the engine holds them.
struct PassParam {
  int64_t index;
  int64_t numel;
  int32_t group;
  const StepScalars* scalars;
  const lowbit_hparams_t* hparams;
};

// A parameter's reductions: its chunks' partials added in chunk order.
struct PassSums {
  double a, b;
  float max;
};

// One chunk's reductions (engine memory, one per bound chunk).
struct PassPartial {
  double a, b;
  float max;
  int32_t bad;
};

// How a step's skip decision is taken when a pass opens it: skipped when any
// of these holds.
struct PassSkip {
  bool host = false;                   // the host knows (e.g. a CPU exchange found a non-finite value)
  const int32_t* device = nullptr;     // engine memory, != 0: skip (read in stream order)
  const float* if_positive = nullptr;  // engine memory, > 0: skip
};

// The step a pass belongs to. Passes that open no step (begin false) and do
// not honour the skip flag run outside steps (gathering grads, snapshots).
struct PassStep {
  // This pass's gradients, one per bound param; later passes of the same
  // step read them too. nullptr: those of the last pass that gave some.
  const GradView* grads = nullptr;
  // Opens a step: the skip flag from `skip`, then every param's scalars
  // (make_frozen_scalars(hparams, its count, frozen_step)) and rounding key
  // (seed, param, count + 1).
  bool begin = false;
  PassSkip skip;
  int64_t frozen_step = 0;
  uint64_t seed = 0;
  bool honor_skip = false;   // a skipped step: the pass changes nothing
  bool skip_on_bad = false;  // a reduction that saw `bad` skips the step (before the finish)
  bool end = false;          // closes the step: step counts + 1 unless skipped
  // Sweeps only the params whose gradient in this pass's step is set (a
  // step of some of the params).
  bool stepped_only = false;
};

// What every rule starts from: no flat buffers, no reduction, no finish,
// every parameter swept (kMaskedOnly: only those with a mask).
struct PassRuleBase {
  static constexpr uint32_t kReduce = 0;
  static constexpr bool kFinish = false, kFinishAll = false, kMaskedOnly = false;
  float* x = nullptr;
  float* y = nullptr;
  LOWBIT_HD void finish(const PassParam&, const PassSums&) const {}
  template <class P>
  LOWBIT_HD void finish_all(const P&, bool) const {}
};

// The fixed-order reduction of one chunk on the host (the CUDA kernels
// follow the same order with one thread per lane).
struct PassLanes {
  double a[kPassLanes], b[kPassLanes];
  float max[kPassLanes];
};

inline PassPartial finish_lanes(PassLanes& l, int32_t bad) {
  for (int h = kPassLanes / 2; h >= 1; h /= 2)
    for (int i = 0; i < h; ++i) l.a[i] += l.a[i + h], l.b[i] += l.b[i + h];
  float mx = 0.f;
  for (float x : l.max) mx = x > mx ? x : mx;  // as std::max(mx, x): a NaN lane is passed over
  return PassPartial{l.a[0], l.b[0], mx, bad};
}

struct CpuPassTables;  // core/cpu_pass.hpp
template <class Rule>
void run_cpu_pass(const CpuPassTables& t, const Rule& rule, const PassStep& step);
namespace cuda {
struct PassTables;  // cuda/tables.hpp
// Defined in cuda/pass_launch.cuh, instantiated by the layer that owns the
// rule (a .cu file, or the host emulation of tests/cuda/emu).
template <class Rule>
void launch_pass(const PassTables& t, const Rule& rule, const PassStep& step, void* stream);
}  // namespace cuda

// A rule with its step, as Engine::run_pass takes it.
class Pass {
 public:
  explicit Pass(const PassStep& s) : step(s) {}
  virtual ~Pass() = default;
  virtual void run_cpu(const CpuPassTables& t) const = 0;
  virtual void run_cuda(const cuda::PassTables& t, void* stream) const = 0;
  PassStep step;
};

template <class Rule>
class RulePass final : public Pass {
 public:
  RulePass(const Rule& rule, const PassStep& s) : Pass(s), rule_(rule) {}
  void run_cpu(const CpuPassTables& t) const override { run_cpu_pass(t, rule_, step); }
  void run_cuda(const cuda::PassTables& t, void* stream) const override;

 private:
  Rule rule_;
};

// Throws LOWBIT_ERROR_UNSUPPORTED (a build without CUDA; never reached there,
// as no CUDA engine exists).
[[noreturn]] void cuda_pass_unsupported();

template <class Rule>
void RulePass<Rule>::run_cuda(const cuda::PassTables& t, void* stream) const {
#ifdef LOWBIT_HAVE_CUDA
  cuda::launch_pass(t, rule_, step, stream);
#else
  (void)t, (void)stream;
  cuda_pass_unsupported();
#endif
}

}  // namespace lowbit
