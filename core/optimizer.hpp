// The optimizer behind a lowbit_optimizer_t: parameter groups, registered
// parameters and their state, and the step driver. Every public method either
// succeeds or throws lowbit::Error having changed nothing.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine.hpp"
#include "lowbit.h"
#include "state.hpp"

namespace lowbit {

class Communicator;

// Engine-owned memory, released with its owner.
class StateBuffer {
 public:
  StateBuffer() = default;
  StateBuffer(Engine* engine, size_t bytes) : engine_(engine), bytes_(bytes) {
    if (bytes) ptr_ = engine->allocate_zeroed(bytes);
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
  int64_t step = 0;
  std::vector<uint8_t> momentum_mask;  // 1-bit Adam; empty: none
  int64_t bucket_offset = 0;           // 1-bit Adam: offset in the flat buffers
};

class Optimizer {
 public:
  Optimizer(const lowbit_optimizer_config_t& config, const lowbit_hparams_t& hparams);

  int32_t add_group(const lowbit_hparams_t& hparams);
  void set_hparams(int32_t group, const lowbit_hparams_t& hparams);
  const lowbit_hparams_t& hparams(int32_t group) const;
  void set_lr(int32_t group, float lr);

  int64_t add_param(const lowbit_param_config_t& config);
  void set_grad(int64_t id, const lowbit_tensor_t* grad);
  // grads == nullptr: the registered gradients.
  void step(const lowbit_tensor_t* grads, int64_t num_grads, void* stream);
  bool last_step_skipped() const { return last_step_skipped_; }

  int64_t num_params() const { return int64_t(params_.size()); }
  lowbit_param_info_t info(int64_t id) const;
  int64_t state_bytes(int64_t id) const;
  void read_moment(int64_t id, int moment, float* out, int64_t numel) const;

  void set_comm(lowbit_comm_t comm);
  void set_momentum_mask(int64_t id, const uint8_t* mask, int64_t numel);

  // Checkpoints (checkpoint.cpp).
  std::vector<uint8_t> save(lowbit_checkpoint_mode_t mode) const;
  void load(const uint8_t* data, int64_t size);

  const lowbit_optimizer_config_t& config() const { return config_; }

 private:
  const ParamState& param(int64_t id) const;
  MomentView moment_view(const ParamState& p, int m) const;
  ParamView param_view(const ParamState& p, int64_t id, const lowbit_tensor_t& grad) const;
  StepScalars step_scalars(const ParamState& p) const;
  lowbit_state_format_t resolve_format(lowbit_state_format_t requested, lowbit_state_format_t fallback,
                                       int64_t numel) const;
  void check_grad(const lowbit_tensor_t& grad, const ParamState& p, const char* what) const;
  void step_onebit(void* stream);

  lowbit_optimizer_config_t config_;
  Algo algo_;
  std::unique_ptr<Engine> engine_;
  std::vector<lowbit_hparams_t> groups_;
  std::vector<ParamState> params_;
  std::vector<Chunk> chunks_;
  std::vector<ParamView> views_;  // rebuilt each step, sized at registration
  bool last_step_skipped_ = false;

  // 1-bit Adam
  lowbit_comm_t comm_ = nullptr;
  StateBuffer bucket_;  // flat fp32 gradients (warm-up) / momentum (compressed stage)
  int64_t bucket_numel_ = 0;
};

}  // namespace lowbit
