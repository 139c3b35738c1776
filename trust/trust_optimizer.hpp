// The handle optimizer of a trust-ratio algorithm (LAMB): an
// OptimizerExtension (core/optimizer_extension.hpp) that lays out TrustSteps
// (trust_step.hpp) when params are registered and runs it for
// lowbit_optimizer_step and lowbit_optimizer_step_params; and the step driver
// of its functional step.
#pragma once
#include <memory>

#include "core/functional_step.hpp"
#include "core/optimizer.hpp"
#include "trust/trust_step.hpp"

namespace lowbit {
namespace trust {

// An Optimizer for `config` when its algorithm is a trust-ratio one (else null).
std::unique_ptr<Optimizer> make_optimizer(const lowbit_optimizer_config_t& config, const lowbit_hparams_t& hparams);

// Installs the functional step's driver when config's algorithm is a
// trust-ratio one.
void install_functional_driver(FunctionalStepper& stepper, const lowbit_optimizer_config_t& config);

class TrustOptimizer final : public StepOnlyExtension {
 public:
  explicit TrustOptimizer(Optimizer& opt) : opt_(opt) {}

  void params_changed() override;
  void step(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream) override;
  void step_subset(const GradView* grads, void* stream) override { run(grads, stream); }
  int64_t workspace_bytes() const override { return steps_.workspace_bytes(); }

 private:
  void run(const GradView* grads, void* stream);

  Optimizer& opt_;
  TrustSteps steps_;
};

}  // namespace trust
}  // namespace lowbit
