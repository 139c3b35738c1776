// The optimizer behind a lowbit_optimizer_t: parameter groups, registered
// parameters and their state, and the step driver over an Engine. A layer
// above (distributed/) may attach an OptimizerExtension that takes over the
// step. Every public method either succeeds or throws lowbit::Error having
// changed nothing.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine.hpp"
#include "lowbit.h"
#include "optimizer_extension.hpp"
#include "state.hpp"
#include "state_plan.hpp"

namespace lowbit {

// Engine-owned memory, released with its owner.
class StateBuffer {
 public:
  StateBuffer() = default;
  StateBuffer(Engine* engine, size_t bytes, bool zeroed = true) : engine_(engine), bytes_(bytes) {
    if (bytes) ptr_ = zeroed ? engine->allocate_zeroed(bytes) : engine->allocate_scratch(bytes);
  }
  StateBuffer(StateBuffer&& o) noexcept { swap(o); }
  StateBuffer& operator=(StateBuffer&& o) noexcept {
    StateBuffer(std::move(o)).swap(*this);
    return *this;
  }
  ~StateBuffer() {
    if (ptr_) engine_->release(ptr_);
  }
  void swap(StateBuffer& o) noexcept {
    std::swap(engine_, o.engine_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  Engine* engine_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct MomentState {
  lowbit_state_format_t format = LOWBIT_STATE_FP32;
  lowbit_moment_kind_t kind = LOWBIT_MOMENT_SIGNED;  // the algorithm's for this slot
  Norm norm = Norm::Block;
  StateBuffer data, scales;
};

struct ParamState {
  lowbit_tensor_t param{};
  lowbit_tensor_t grad{};  // data == nullptr: no registered gradient
  int32_t group = 0;
  int num_moments = 0;
  MomentState moment[2];
  WeightRounding rounding = WeightRounding::Nearest;
  StateBuffer ecc;
  Shape shape{};  // ndim 0: none
};

class Optimizer {
 public:
  Optimizer(const lowbit_optimizer_config_t& config, const lowbit_hparams_t& hparams);

  int32_t add_group(const lowbit_hparams_t& hparams);
  void set_hparams(int32_t group, const lowbit_hparams_t& hparams);
  const lowbit_hparams_t& hparams(int32_t group) const;
  void set_lr(int32_t group, float lr);
  lowbit_hparams_t* device_hparams(int32_t group);

  int64_t add_param(const lowbit_param_config_t& config);
  void set_grad(int64_t id, const lowbit_tensor_t* grad);
  // grads == nullptr: the registered gradients, unless explicit_grads (the
  // caller passed an array, which must not be NULL).
  void step(const lowbit_tensor_t* grads, int64_t num_grads, void* stream, bool explicit_grads = false);
  // A step of the params ids[0, n) only (distinct ids), with their registered
  // gradients or grads[k] for ids[k]; the others are left alone. Each param
  // gets the bits a full step gives it (its own step count and rounding key).
  void step_params(const int64_t* ids, int64_t n, const lowbit_tensor_t* grads, void* stream);
  bool last_step_skipped() const { return engine_->last_step_skipped(); }

  int64_t num_params() const { return int64_t(params_.size()); }
  lowbit_param_info_t info(int64_t id) const;
  int64_t state_bytes(int64_t id) const;
  void read_moment(int64_t id, int moment, float* out, int64_t numel, void* stream) const;
  void write_moment(int64_t id, int moment, const float* values, int64_t numel, void* stream);
  void set_step(int64_t id, int64_t step, void* stream);

  // Checkpoints (checkpoint.cpp).
  std::vector<uint8_t> save(lowbit_checkpoint_mode_t mode, void* stream) const;
  void load(const uint8_t* data, int64_t size, void* stream);
  // The first kCheckpointHeadBytes bytes of a checkpoint announce its total
  // size: checked (magic, version) and returned when this optimizer could
  // load a checkpoint of that size, else CORRUPT_DATA (so a reader never
  // allocates for a corrupt size).
  static constexpr size_t kCheckpointHeadBytes = 32;
  uint64_t checkpoint_size(const uint8_t* head) const;

  const lowbit_optimizer_config_t& config() const { return config_; }

  // ---- for an extension (the layer above), which builds on these
  void set_extension(std::unique_ptr<OptimizerExtension> extension) { extension_ = std::move(extension); }
  OptimizerExtension* extension() const { return extension_.get(); }
  Engine& engine() const { return *engine_; }
  const std::vector<lowbit_hparams_t>& groups() const { return groups_; }
  // The registered param `id` (INVALID_ARGUMENT naming a bad id).
  const ParamState& param(int64_t id) const;
  // The checks of a step's gradients; returns this step's table, one entry
  // per param (scratch until the next step).
  GradView* prepare_grads(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads);
  // The engine's step counts (blocking, after `stream`).
  std::vector<int64_t> steps(void* stream) const;

 private:
  const MomentState& moment_state(int64_t id, int moment) const;
  MomentView moment_view(const ParamState& p, int m) const;
  ParamView param_view(const ParamState& p) const;
  void check_grad(const lowbit_tensor_t& grad, const ParamState& p, const char* what) const;
  // Hands the parameters from `first_changed` on to the engine and waits.
  void bind(int64_t first_changed);
  void push_hparams();

  lowbit_optimizer_config_t config_;
  Algo algo_;
  std::unique_ptr<Engine> engine_;
  std::vector<lowbit_hparams_t> groups_;
  std::vector<ParamState> params_;
  std::vector<Chunk> chunks_;
  std::vector<ParamView> views_;
  std::vector<int32_t> param_groups_;
  std::vector<GradView> grads_;  // this step's, sized at registration
  std::unique_ptr<OptimizerExtension> extension_;
};

}  // namespace lowbit
