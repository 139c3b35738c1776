// One step of a trust-ratio algorithm (LAMB: AlgorithmDesc::trust_ratio) over
// an engine's bound params, for the handle optimizer (trust_optimizer.hpp)
// and the functional step alike: the moments in any state format through the
// fused step, its direction written to an fp32 workspace (StepControl::
// flat_out), then the per-tensor trust ratio and the param update as two
// passes (trust_rules.hpp). The skip decision is made once, before any of it
// (Engine::begin_step).
#pragma once
#include <cstdint>
#include <vector>

#include "core/engine.hpp"
#include "core/optimizer.hpp"

namespace lowbit {
namespace trust {

class TrustSteps {
 public:
  // Flat offsets (Engine::bind_flat) and the workspace for params of these
  // sizes, after the engine's bind(); nothing is done when they are those of
  // the last call. May allocate and wait (registration time).
  void layout(Engine& e, const std::vector<int64_t>& numels);
  // One step of `rule` (the algorithm's). `base`: the seed, and a shared
  // count, lr, hparams in engine memory, state records as StepControl takes
  // them.
  void step(Engine& e, Algo rule, const GradView* grads, bool check_nonfinite, const StepControl& base,
            void* stream);
  int64_t workspace_bytes() const { return int64_t(x_.bytes() + ratio_.bytes()); }

 private:
  std::vector<int64_t> numels_;
  bool laid_out_ = false;
  StateBuffer x_;      // the params' directions, then updates, back to back
  StateBuffer ratio_;  // per param: its trust ratio
  int64_t x_floats_ = 0;
};

}  // namespace trust
}  // namespace lowbit
