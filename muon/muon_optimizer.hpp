// Muon's step over an Optimizer (core/optimizer_extension.hpp): the momentum
// in any state format through the engine's fused step (update_element<
// Algo::Muon>, whose output is the matrix to orthogonalise, written to a
// workspace), the Newton-Schulz iterations as batched matrix products
// (Engine::matmul) over matrices of one shape at a time, and the param update
// as a pass (muon_rules.hpp). Params of groups with another algorithm (the
// hybrid's AdamW) take that algorithm's fused step in the same step. The
// step's skip decision is made once, before any of it (Engine::begin_step).
#pragma once
#include <memory>
#include <vector>

#include "core/optimizer.hpp"

namespace lowbit {
namespace muon {

// An Optimizer for `config` (any algorithm: a Muon one gets the extension).
std::unique_ptr<Optimizer> make_optimizer(const lowbit_optimizer_config_t& config, const lowbit_hparams_t& hparams);

class MuonOptimizer final : public OptimizerExtension {
 public:
  explicit MuonOptimizer(Optimizer& opt) : opt_(opt) {}

  void params_changed() override;
  void step(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream) override;
  void step_subset(const GradView* grads, void* stream) override;
  void steps_changed(void*) override {}
  int64_t state_bytes() const override { return 0; }
  int64_t workspace_bytes() const override;

  bool has_checkpoint_section() const override { return false; }
  uint64_t max_section_bytes(uint64_t) const override { return 0; }
  void save_section(CheckpointWriter&, void*) const override {}
  std::function<void(void*)> load_section(CheckpointReader&, uint32_t) const override {
    return [](void*) {};
  }

 private:
  // Matrices of one shape and group, stepped together: their updates lie
  // back to back in the workspace.
  struct Batch {
    int32_t group;
    int64_t rows, cols;
    std::vector<int64_t> params;
  };
  void run(const GradView* grads, void* stream);
  void orthogonalise(const Batch& b, const lowbit_hparams_t& h, void* stream);

  Optimizer& opt_;
  std::vector<Batch> batches_;
  std::vector<lowbit_algorithm_t> algorithm_of_;  // per param: its group's (at registration)
  std::vector<GradView> table_;                    // one step call's grads
  StateBuffer x_, x2_, a_, b_;                     // workspace: updates (twice), Gram matrices, their polynomial
  StateBuffer norm_, dims_;                        // per param: the update's norm; rows, cols
  int64_t x_floats_ = 0, gram_floats_ = 0;
};

}  // namespace muon
}  // namespace lowbit
