#include "trust/trust_step.hpp"

#include "trust/trust_rules.hpp"

namespace lowbit {
namespace trust {

void TrustSteps::layout(Engine& e, const std::vector<int64_t>& numels) {
  if (laid_out_ && numels == numels_) return;
  const int64_t n = int64_t(numels.size());
  std::vector<int64_t> offsets(size_t(n), 0);
  int64_t floats = 0;
  for (int64_t i = 0; i < n; ++i) offsets[size_t(i)] = floats, floats += numels[size_t(i)];
  if (floats > x_floats_) {
    x_ = StateBuffer(&e, size_t(floats) * 4, false);
    x_floats_ = floats;
  }
  if (n > 0) {
    StateBuffer ratio(&e, size_t(n) * 4);
    const std::vector<const uint8_t*> masks(size_t(n), nullptr);
    e.bind_flat(offsets.data(), masks.data(), n);
    ratio_ = std::move(ratio);
  }
  numels_ = numels;
  laid_out_ = true;
}

void TrustSteps::step(Engine& e, Algo rule, const GradView* grads, bool check_nonfinite, const StepControl& base,
                      void* stream) {
  const int64_t n = int64_t(numels_.size());
  e.begin_step(grads, n, check_nonfinite, stream);
  StepControl ctl = base;
  ctl.continue_step = true;
  ctl.check_nonfinite = false;
  ctl.flat_out = static_cast<float*>(x_.data());
  e.step(rule, grads, n, ctl, stream);
  if (n == 0) return;
  PassStep in_step;
  in_step.honor_skip = true;
  in_step.stepped_only = true;
  NormRule norm;
  norm.x = ctl.flat_out;
  norm.ratio = static_cast<float*>(ratio_.data());
  run_pass(e, norm, in_step, stream);
  ApplyRule apply;
  apply.x = norm.x;
  apply.ratio = norm.ratio;
  run_pass(e, apply, in_step, stream);
}

}  // namespace trust
}  // namespace lowbit
