// The functional step (lowbit.h, "functional step"): one step over parameter
// and state buffers the caller owns and passes at every call. Each call's
// buffers are checked against their plans (every check before anything is
// written), bound to an engine as the handle optimizer binds its own state,
// and stepped with one shared step count, as the JAX state keeps it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine.hpp"
#include "lowbit.h"

namespace lowbit {

// The int32 columns of a state record: the layout record of the engine's
// check (layout_record.hpp).
constexpr int kStateRecordColumns = kLayoutColumns;

// The shape a parameter planned as `plan` with `shape` is bound with: its
// own when a moment is RANK1 or FACTORED (the only moments that read it),
// flat otherwise.
Shape bound_shape(const lowbit_state_plan_t& plan, const Shape& shape);

// The state record of such a parameter (kStateRecordColumns values).
void make_state_record(const lowbit_state_plan_t& plan, const Shape& shape, int32_t* out);

// A caller's step count and where the result goes (lowbit_step_args_t).
struct FunctionalCount {
  int64_t step = -1;                // host value, -1: not given
  const int32_t* count = nullptr;   // engine memory
  int32_t* count_out = nullptr;     // engine memory
};

class FunctionalStepper {
 public:
  // `config`: algorithm, device, seed, skip_nonfinite, num_threads.
  explicit FunctionalStepper(const lowbit_optimizer_config_t& config);

  // Structs of the current size (the C boundary reads callers' structs):
  // params[i] with plans[i] (params[i].plan is not read); the groups'
  // hyper-parameters in host memory (`hparams`) or engine memory
  // (`engine_hparams`), one of them set. Checks everything the host can,
  // then enqueues the step.
  void step(const lowbit_param_buffers_t* params, const lowbit_state_plan_t* plans, int64_t num_params,
            const lowbit_hparams_t* hparams, const lowbit_hparams_t* engine_hparams, int32_t num_groups,
            const float* lr, const FunctionalCount& count, const int32_t* records, void* stream);

  bool last_step_skipped() const { return engine_->last_step_skipped(); }

  // The step of Muon (muon/) or of a trust-ratio algorithm (trust/), which
  // is not one fused call: run on the engine once the call's buffers are
  // checked and bound, with the call's params, their grads, the groups' host
  // hparams (nullptr when they are in engine memory; Muon refuses that) and
  // the StepControl a fused step would take. A Muon stepper without one
  // refuses to step.
  using StepDriver = std::function<void(Engine&, const lowbit_param_buffers_t*, const GradView*, int64_t,
                                        const lowbit_hparams_t*, const StepControl&, void*)>;
  void set_step_driver(StepDriver driver) { driver_ = std::move(driver); }
  lowbit_device_t device() const { return config_.device; }
  lowbit_algorithm_t algorithm() const { return config_.algorithm; }

 private:
  // `hparams`: the groups' values when the host can read them, else nullptr.
  void check_param(int64_t i, const lowbit_param_buffers_t& p, const lowbit_state_plan_t& plan,
                   const lowbit_hparams_t* hparams, int32_t num_groups, ParamView& view, GradView& grad) const;

  lowbit_optimizer_config_t config_;
  std::unique_ptr<Engine> engine_;
  // Kept between calls: no allocation once they have the capacity.
  std::vector<ParamView> views_;
  std::vector<GradView> grads_;
  std::vector<Chunk> chunks_;
  std::vector<int32_t> groups_;
  int32_t engine_groups_ = 0;  // groups the engine's own table has (set_hparams)
  StepDriver driver_;
};

}  // namespace lowbit
