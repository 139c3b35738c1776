// 1-bit Adam, 0/1 Adam and 1-bit LAMB: the layer above core (the Optimizer,
// its Engine) and comm (the Communicator). An OneBitOptimizer is the
// OptimizerExtension (core/optimizer_extension.hpp) of an optimizer of one
// of these algorithms: it lays out their state, takes over the step (one
// collective per step over one flat fp32 bucket of every parameter), saves
// its state in the checkpoint's section and answers their status. Their
// operations are passes (passes.hpp), their schedule one object
// (schedule.hpp). The algorithms are specified in docs/ALGORITHMS.md.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "core/optimizer.hpp"
#include "distributed/onebit_rules.hpp"
#include "distributed/schedule.hpp"

namespace lowbit {
namespace distributed {

// The optimizer behind a lowbit_optimizer_t: core's, with a OneBitOptimizer
// attached for the 1-bit algorithms.
std::unique_ptr<Optimizer> make_optimizer(const lowbit_optimizer_config_t& config, const lowbit_hparams_t& hparams);

// The kinds and stages of these algorithms' collective calls (comm's
// CollectiveCaller; the numbers are compared across ranks).
enum : int32_t { kCallerOneBitAdam = 1, kCallerZeroOneAdam = 2, kCallerOneBitLamb = 3 };
enum : int32_t { kStageWarmup = 1, kStageCompressed = 2, kStageLocal = 3, kStageSync = 4 };

// How these algorithms name their collective calls (for the agreement's
// messages), and a direct call of the C API named the same way.
const CallerNames& caller_names();
CollectiveCaller direct_caller();

class OneBitOptimizer final : public OptimizerExtension {
 public:
  explicit OneBitOptimizer(Optimizer& core);

  // ---- the C API (capi/optimizer_api.cpp)
  void set_comm(Communicator& comm) { comm_ = &comm; }
  void set_warmup_average(bool average) { average_warmup_ = average; }
  void set_momentum_mask(int64_t id, const uint8_t* mask, int64_t numel);
  void set_options(const lowbit_onebit_options_t& options);
  lowbit_onebit_status_t status(void* stream);

  // ---- OptimizerExtension
  void params_changed() override;
  void step(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream) override;
  void steps_changed(void* stream) override;
  int64_t state_bytes() const override { return int64_t(bucket_.bytes()); }
  bool has_checkpoint_section() const override;
  uint64_t max_section_bytes(uint64_t num_groups) const override;
  void save_section(CheckpointWriter& w, void* stream) const override;
  std::function<void(void* stream)> load_section(CheckpointReader& r, uint32_t num_groups) const override;

 private:
  const lowbit_optimizer_config_t& config() const { return core_.config(); }
  Engine& engine() const { return core_.engine(); }
  int64_t num_params() const { return core_.num_params(); }
  float* bucket() const { return static_cast<float*>(bucket_.data()); }
  float* aux() const { return static_cast<float*>(aux_.data()); }
  LambScalars* lamb() const { return static_cast<LambScalars*>(lamb_scalars_.data()); }
  void bind_flat();
  // The host learns the exact step count again (blocking).
  void refresh_steps(void* stream);
  CollectiveCaller caller(int32_t kind, StepKind step_kind) const;

  // ---- a step (onebit_optimizer.cpp)
  // The local checks of a 1-bit step (grads, equal step counts, `more`), run
  // before any collective; a failure joins `who`'s agreement on every rank.
  // Returns the step's gradient table.
  GradView* checks(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream,
                   const CollectiveCaller& who, const std::function<void()>& more);
  // The warm-up's exchange of the gradients: averaged into the bucket (g
  // then points into it), or only agreed on when the caller averaged.
  void average_grads(const CollectiveCaller& who, GradView* g, void* stream);
  // A warm-up / variance step: the average, AdamW's full-precision step on
  // it (skipped alike on every rank), then the momentum mask.
  void averaged_step(const CollectiveCaller& who, GradView* g, void* stream);
  // After a step, waits for its outcome (0/1 Adam, LAMB).
  bool applied(void* stream);
  // The exchange's skip decision for the pass that applies it.
  PassSkip exchange(bool finite) const;

  void step_onebit_adam(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream);
  bool compressed_stage(void* stream);
  void step_zeroone(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream);
  void step_lamb(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream);

  Optimizer& core_;
  Communicator* comm_ = nullptr;
  Schedule schedule_;
  lowbit_onebit_options_t options_{};
  // Warm-up steps average the gradients over the communicator; false: the
  // caller gives gradients it averaged (DDP), and warm-up exchanges nothing.
  bool average_warmup_ = true;

  StateBuffer bucket_;  // flat fp32 over every param: the exchanged values
  int64_t numel_ = 0;
  std::vector<int64_t> offsets_;
  std::vector<StateBuffer> masks_;  // engine memory, numel bytes; empty buffer: no mask
  // The step count, which the host tracks without waiting for the device:
  // `known` is exact as of the last check, and `issued` steps went to the
  // engine since (1-bit Adam on CUDA only; each may have been skipped).
  int64_t known_steps_ = 0;
  int64_t issued_ = 0;
  bool steps_differ_ = false;  // registration or set_step left params at different counts

  // ---- 0/1 Adam and 1-bit LAMB: the host knows every step's outcome (it
  // waits for it). Checkpointed with the schedule, except the options.
  StateBuffer aux_;           // flat fp32 like the bucket: 0/1 Adam p_sync, LAMB v_fresh
  StateBuffer flag_;          // one float: 0/1 Adam's local non-finite flag
  StateBuffer lamb_scalars_;  // LambScalars per param
  StateBuffer rms_;           // double per param: LAMB's scaling pass (scratch)
  StateBuffer inv_lrs_;       // one float per group (0/1 Adam sync)
  std::vector<double> lrs_;   // per group: the sum of lr since the last sync
  bool lamb_scaled_ = false;  // the LAMB scalings were computed
};

// The 1-bit side of an optimizer; INVALID_STATE with `message` for others.
OneBitOptimizer& onebit(Optimizer& o, const char* message);

}  // namespace distributed
}  // namespace lowbit
