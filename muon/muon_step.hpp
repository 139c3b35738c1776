// One Muon step over an engine's bound params, for the handle optimizer
// (muon_optimizer.hpp) and the functional step alike: the momentum in any
// state format through the fused step (update_element<Algo::Muon>, its
// output written to the workspace), the Newton-Schulz iterations as batched
// products (Engine::matmul) over the matrices of one shape and group, and the
// param update as a pass (muon_rules.hpp). Params whose group takes another
// algorithm (the hybrid's AdamW) get that algorithm's fused step in the same
// step. The skip decision is made once, before any of it
// (Engine::begin_step); every call after it continues that step.
#pragma once
#include <cstdint>
#include <vector>

#include "core/engine.hpp"
#include "core/optimizer.hpp"

namespace lowbit {
namespace muon {

// What the step needs of a bound param: its group's algorithm, its group,
// and for Muon its matrix (rows = dim 0, cols = the rest).
struct MuonParam {
  lowbit_algorithm_t algorithm;
  int32_t group;
  int64_t rows, cols;
  bool operator==(const MuonParam& o) const {
    return algorithm == o.algorithm && group == o.group && rows == o.rows && cols == o.cols;
  }
};

class MuonSteps {
 public:
  // Batches, flat offsets (Engine::bind_flat) and the workspace for these
  // params, after the engine's bind(); nothing is done when they are those of
  // the last call. May allocate and wait (registration time).
  void layout(Engine& e, const std::vector<MuonParam>& params);
  // One step. `groups`: the groups' hparams on the host. `base`: the seed,
  // and a shared count, lr, state records as StepControl takes them (its
  // shared_count_out is written by the step's last call only).
  void step(Engine& e, const GradView* grads, const lowbit_hparams_t* groups, lowbit_device_t device,
            bool check_nonfinite, const StepControl& base, void* stream);
  int64_t workspace_bytes() const {
    return int64_t(x_.bytes() + x2_.bytes() + a_.bytes() + b_.bytes() + norm_.bytes() + dims_.bytes());
  }

 private:
  // Matrices of one shape and group, stepped together: their updates lie
  // back to back in the workspace.
  struct Batch {
    int32_t group;
    int64_t rows, cols;
    std::vector<int64_t> params;
  };
  void orthogonalise(Engine& e, const Batch& b, const lowbit_hparams_t& h, bool bf16, void* stream);

  std::vector<MuonParam> params_;
  bool laid_out_ = false;
  std::vector<Batch> batches_;
  std::vector<GradView> table_;  // one call's grads
  std::vector<Matmul> products_;  // one step's products, readied before it writes
  StateBuffer x_, x2_, a_, b_;   // workspace: updates (twice), Gram matrices, their polynomial
  StateBuffer norm_, dims_;      // per param: the update's norm; rows, cols
  int64_t x_floats_ = 0, gram_floats_ = 0;
};

}  // namespace muon
}  // namespace lowbit
