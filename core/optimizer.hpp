// The optimizer behind a lowbit_optimizer_t: parameter groups, registered
// parameters and their state, and the step driver over an Engine. Every
// public method either succeeds or throws lowbit::Error having changed
// nothing.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine.hpp"
#include "lowbit.h"
#include "state.hpp"
#include "state_plan.hpp"

namespace lowbit {

class Communicator;
struct CollectiveCaller;

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

// 1-bit Adam (onebit_adam.cpp): all parameters share one flat fp32 bucket
// (warm-up: the averaged gradients; compressed stage: the exchanged
// momentum); masked momentum elements stay zero. The stage follows from the
// step count, which the host tracks without waiting for the device: `known`
// is exact as of the last check, and `issued` steps went to the engine since
// (CUDA only; each may have been skipped).
struct OneBitState {
  Communicator* comm = nullptr;
  StateBuffer bucket;
  int64_t numel = 0;
  std::vector<int64_t> offsets;
  std::vector<StateBuffer> masks;  // engine memory, numel bytes; empty buffer: no mask
  int64_t known_steps = 0;
  int64_t issued = 0;
  bool steps_differ = false;  // registration or set_step left params at different counts
  // Warm-up steps average the gradients over the communicator; false: the
  // caller gives gradients it averaged (DDP), and warm-up exchanges nothing.
  bool average_warmup = true;

  // ---- 0/1 Adam (zeroone_adam.cpp) and 1-bit LAMB (onebit_lamb.cpp): the
  // host knows every step's outcome (it waits for it), so the schedules
  // below are exact. Checkpointed except the options.
  lowbit_onebit_options_t options{};
  StateBuffer aux;           // flat fp32 like the bucket: 0/1 Adam p_sync, LAMB v_fresh
  StateBuffer flag;          // one float: 0/1 Adam's local non-finite flag
  StateBuffer lamb_scalars;  // LambScalars per param
  StateBuffer partials;      // LambPartial per chunk (scratch)
  StateBuffer inv_lrs;       // one float per group (0/1 Adam sync)
  int64_t var_interval = 1, var_counter = 0;
  int64_t local_interval = 1, local_counter = 0;
  std::vector<double> lrs;   // per group: the sum of lr since the last sync
  bool lamb_scaled = false;  // the LAMB scalings were computed
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
  bool last_step_skipped() const { return engine_->last_step_skipped(); }

  int64_t num_params() const { return int64_t(params_.size()); }
  lowbit_param_info_t info(int64_t id) const;
  int64_t state_bytes(int64_t id) const;
  void read_moment(int64_t id, int moment, float* out, int64_t numel, void* stream) const;
  void write_moment(int64_t id, int moment, const float* values, int64_t numel, void* stream);
  void set_step(int64_t id, int64_t step, void* stream);

  void set_comm(Communicator& comm);
  void set_onebit_warmup_average(bool average);
  void set_momentum_mask(int64_t id, const uint8_t* mask, int64_t numel);
  void set_onebit_options(const lowbit_onebit_options_t& options);
  lowbit_onebit_status_t onebit_status(void* stream);

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

 private:
  const ParamState& param(int64_t id) const;
  const MomentState& moment_state(int64_t id, int moment) const;
  MomentView moment_view(const ParamState& p, int m) const;
  ParamView param_view(const ParamState& p) const;
  void check_grad(const lowbit_tensor_t& grad, const ParamState& p, const char* what) const;
  // The checks of a step's gradients; fills grads_ (scratch, nothing else).
  void prepare_grads(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads);
  // Hands the parameters from `first_changed` on to the engine and waits.
  void bind(int64_t first_changed);
  std::vector<int64_t> steps(void* stream) const;
  void push_hparams();
  // 1-bit Adam (onebit_adam.cpp).
  void layout_onebit();
  void bind_onebit();
  void refresh_onebit_steps(void* stream);
  bool onebit_compressed_stage(void* stream);
  void step_onebit(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream);
  // The local checks of a 1-bit step (grads, equal step counts, more), run
  // before any collective; a failure joins `who`'s agreement on every rank.
  void onebit_checks(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream,
                     const CollectiveCaller& who, const std::function<void()>& more);
  // Warm-up-style exchange of the gradients: averaged into the bucket
  // (grads_ then point into it), or only agreed on when the caller averaged.
  void onebit_average_grads(const CollectiveCaller& who, void* stream);
  // The warm-up step: the gradients averaged, the algorithm's full-precision
  // step on the average (skipped alike on every rank), then the 1-bit mask.
  void onebit_averaged_step(const CollectiveCaller& who, void* stream);
  // 0/1 Adam and LAMB: after a step, waits for its outcome.
  bool onebit_applied(void* stream);
  bool onebit_next_full_average() const;
  void step_zeroone(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream);
  void step_lamb(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream);
  void layout_onebit_ext();

  lowbit_optimizer_config_t config_;
  Algo algo_;
  std::unique_ptr<Engine> engine_;
  std::vector<lowbit_hparams_t> groups_;
  std::vector<ParamState> params_;
  std::vector<Chunk> chunks_;
  std::vector<ParamView> views_;
  std::vector<int32_t> param_groups_;
  std::vector<GradView> grads_;  // this step's, sized at registration
  std::unique_ptr<OneBitState> onebit_;
};

}  // namespace lowbit
