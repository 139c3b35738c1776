// Muon's handle optimizer: an OptimizerExtension (core/optimizer_extension.hpp)
// that lays out MuonSteps (muon_step.hpp) when params are registered and runs
// it for lowbit_optimizer_step and lowbit_optimizer_step_params.
#pragma once
#include <memory>
#include <vector>

#include "core/optimizer.hpp"
#include "muon/muon_step.hpp"

namespace lowbit {
namespace muon {

// An Optimizer for `config` (any algorithm: a Muon one gets the extension).
std::unique_ptr<Optimizer> make_optimizer(const lowbit_optimizer_config_t& config, const lowbit_hparams_t& hparams);

// What MuonSteps needs of a param registered in an optimizer of `algorithm`
// with these groups: its group's algorithm and its matrix.
MuonParam muon_param(const lowbit_hparams_t& group, lowbit_algorithm_t algorithm, int32_t group_index,
                     const Shape& shape, int64_t numel);

class MuonOptimizer final : public StepOnlyExtension {
 public:
  explicit MuonOptimizer(Optimizer& opt) : opt_(opt) {}

  void params_changed() override;
  void step(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream) override;
  void step_subset(const GradView* grads, void* stream) override { run(grads, stream); }
  int64_t workspace_bytes() const override { return steps_.workspace_bytes(); }

 private:
  void run(const GradView* grads, void* stream);

  Optimizer& opt_;
  MuonSteps steps_;
};

}  // namespace muon
}  // namespace lowbit
