// What 1-bit Adam, 0/1 Adam and 1-bit LAMB share: their state's layout, the
// C API's settings and status, and the parts of a step common to them (the
// local checks agreed on with the other ranks, the warm-up's average).
#include "core/engine.hpp"
#include "distributed/onebit_optimizer.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/defaults.hpp"
#include "core/error.hpp"
#include "core/validation.hpp"
#include "distributed/passes.hpp"

namespace lowbit {
namespace distributed {

std::unique_ptr<Optimizer> make_optimizer(const lowbit_optimizer_config_t& config, const lowbit_hparams_t& hparams) {
  if (!is_onebit_algorithm(config.algorithm)) return std::make_unique<Optimizer>(config, hparams);
  check_config(config);
  check_hparams(hparams, config.algorithm);
  auto fp32 = [](lowbit_state_format_t f) { return f == LOWBIT_STATE_DEFAULT || f == LOWBIT_STATE_FP32; };
  LOWBIT_REQUIRE(fp32(config.state_format) && fp32(config.second_state_format), LOWBIT_ERROR_UNSUPPORTED,
                 "state_format: ", onebit_algorithm_name(config.algorithm),
                 " keeps fp32 state (its momentum is what is communicated)");
  auto opt = std::make_unique<Optimizer>(config, hparams);
  opt->set_extension(std::make_unique<OneBitOptimizer>(*opt));
  return opt;
}

OneBitOptimizer& onebit(Optimizer& o, const char* message) {
  auto* ext = dynamic_cast<OneBitOptimizer*>(o.extension());
  LOWBIT_REQUIRE(ext != nullptr, LOWBIT_ERROR_INVALID_STATE, message);
  return *ext;
}

OneBitOptimizer::OneBitOptimizer(Optimizer& core)
    : core_(core), schedule_(core.config().algorithm, core.config().freeze_step), options_(default_onebit_options()) {}

namespace {
// A buffer of `bytes` in engine memory that keeps the first bytes of `old`
// (parameters append) and fills the rest from `fill` (repeated pattern).
StateBuffer regrow(Engine& engine, const StateBuffer& old, size_t bytes, const void* fill, size_t fill_bytes) {
  std::vector<uint8_t> host(bytes, 0);
  const size_t keep = std::min(bytes, old.bytes());
  if (keep) engine.copy_to_host(host.data(), old.data(), keep, nullptr);
  if (fill)
    for (size_t at = keep; at + fill_bytes <= bytes; at += fill_bytes) std::memcpy(host.data() + at, fill, fill_bytes);
  StateBuffer out(&engine, bytes);
  if (bytes) engine.copy_from_host(out.data(), host.data(), bytes, nullptr);
  return out;
}
}  // namespace

// Registration: the bucket grows to every parameter's elements; 0/1 Adam's
// p_sync or LAMB's v_fresh (flat like the bucket), the LAMB scalars, the
// flag and the per-group lr sums follow.
void OneBitOptimizer::params_changed() {
  const int64_t n = num_params();
  int64_t total = 0;
  std::vector<int64_t> offsets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) offsets[size_t(i)] = total, total += core_.param(i).param.numel;
  if (total != numel_) {
    bucket_ = StateBuffer();  // release first: never two buckets at once
    numel_ = 0;
    bucket_ = StateBuffer(&engine(), size_t(total) * 4, false);
    numel_ = total;
  }
  offsets_ = std::move(offsets);
  masks_.resize(size_t(n));
  bind_flat();
  refresh_steps(nullptr);
  if (config().algorithm == LOWBIT_ALGORITHM_ONEBIT_ADAM) return;
  StateBuffer aux = regrow(engine(), aux_, size_t(numel_) * 4, nullptr, 0);
  const LambScalars fresh{0.f, 1.f, 0.f, 0.f};
  StateBuffer scalars = regrow(engine(), lamb_scalars_, size_t(n) * sizeof(LambScalars), &fresh, sizeof fresh);
  StateBuffer rms(&engine(), std::max<size_t>(size_t(n), 1) * sizeof(double));
  StateBuffer flag = flag_.bytes() ? std::move(flag_) : StateBuffer(&engine(), sizeof(float));
  aux_ = std::move(aux);
  lamb_scalars_ = std::move(scalars);
  rms_ = std::move(rms);
  flag_ = std::move(flag);
}

void OneBitOptimizer::bind_flat() {
  std::vector<const uint8_t*> masks(masks_.size());
  for (size_t i = 0; i < masks_.size(); ++i) masks[i] = static_cast<const uint8_t*>(masks_[i].data());
  engine().bind_flat(offsets_.data(), masks.data(), int64_t(masks.size()));
  engine().wait(nullptr);
}

void OneBitOptimizer::refresh_steps(void* stream) {
  const std::vector<int64_t> st = core_.steps(stream);
  steps_differ_ = std::any_of(st.begin(), st.end(), [&](int64_t v) { return v != st[0]; });
  known_steps_ = st.empty() ? 0 : st[0];
  issued_ = 0;
}

void OneBitOptimizer::steps_changed(void* stream) {
  schedule_.set_freeze_step(config().freeze_step);
  refresh_steps(stream);
}

void OneBitOptimizer::set_momentum_mask(int64_t id, const uint8_t* mask, int64_t numel) {
  const ParamState& p = core_.param(id);
  StateBuffer buffer;
  if (mask) {
    LOWBIT_REQUIRE(numel == p.param.numel, LOWBIT_ERROR_INVALID_ARGUMENT, "numel = ", numel,
                   " does not match the param's numel ", p.param.numel);
    buffer = StateBuffer(&engine(), size_t(numel), false);
    engine().copy_from_host(buffer.data(), mask, size_t(numel), nullptr);
  }
  engine().wait(nullptr);  // no step may still read the old mask
  masks_[size_t(id)] = std::move(buffer);
  bind_flat();
}

void OneBitOptimizer::set_options(const lowbit_onebit_options_t& o) {
  LOWBIT_REQUIRE(config().algorithm != LOWBIT_ALGORITHM_ONEBIT_ADAM, LOWBIT_ERROR_INVALID_STATE,
                 "set_onebit_options: only 0/1 Adam and 1-bit LAMB take these options");
  check_onebit_options(o);
  options_ = o;
}

lowbit_onebit_status_t OneBitOptimizer::status(void* stream) {
  if (config().algorithm == LOWBIT_ALGORITHM_ONEBIT_ADAM) refresh_steps(stream);
  lowbit_onebit_status_t out{};
  out.struct_size = sizeof out;
  out.step = known_steps_;
  out.phase = schedule_.phase(known_steps_);
  out.next_full_average = schedule_.kind(known_steps_) == StepKind::Averaged ? 1 : 0;
  out.var_interval = schedule_.var_interval;
  out.var_counter = schedule_.var_counter;
  out.local_step_interval = schedule_.local_interval;
  out.local_step_counter = schedule_.local_counter;
  out.next_exchange = schedule_.exchange(known_steps_, average_warmup_);
  return out;
}

void OneBitOptimizer::step(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream) {
  switch (config().algorithm) {
    case LOWBIT_ALGORITHM_ZEROONE_ADAM: step_zeroone(grads, num_grads, explicit_grads, stream); break;
    case LOWBIT_ALGORITHM_ONEBIT_LAMB: step_lamb(grads, num_grads, explicit_grads, stream); break;
    default: step_onebit_adam(grads, num_grads, explicit_grads, stream); break;
  }
}

GradView* OneBitOptimizer::checks(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream,
                                  const CollectiveCaller& who, const std::function<void()>& more) {
  const char* name = onebit_algorithm_name(config().algorithm);
  // Without a communicator this rank has no way to tell the others, which
  // wait in this step's agreement (forever, or until their communicator's
  // timeout): it can only fail here, first, having changed nothing.
  LOWBIT_REQUIRE(comm_ != nullptr, LOWBIT_ERROR_INVALID_STATE, "step: a ", name,
                 " optimizer needs a communicator (lowbit_optimizer_set_comm); the other ranks wait for this one in "
                 "their step");
  // Every local check runs before any collective, and a failure joins the
  // agreement the other ranks start their collective with: every rank fails,
  // none waits, nothing changes anywhere.
  GradView* g = nullptr;
  const Failure f = catch_failure(
      [&] {
        g = core_.prepare_grads(grads, num_grads, explicit_grads);
        for (int64_t i = 0; i < num_params(); ++i)
          LOWBIT_REQUIRE(g[i].data != nullptr, LOWBIT_ERROR_INVALID_ARGUMENT, "grad of param ", i, " is missing: ",
                         name, " communicates every parameter at every step");
        if (steps_differ_) {
          const std::vector<int64_t> st = core_.steps(stream);
          fail(LOWBIT_ERROR_INVALID_STATE, name, ": params have different step counts (", st.front(), " and ",
               *std::find_if(st.begin(), st.end(), [&](int64_t v) { return v != st.front(); }),
               "); set them equal with lowbit_optimizer_set_step");
        }
        more();
      },
      "step: out of host memory");
  if (f.failed()) comm_->fail_collective(f.status, f.message, who);
  return g;
}

CollectiveCaller OneBitOptimizer::caller(int32_t kind, StepKind step_kind) const {
  CollectiveCaller who;
  who.kind = kind;
  who.boundary = config().freeze_step;
  who.parts = num_params();
  who.names = &caller_names();
  switch (step_kind) {
    case StepKind::Averaged: who.stage = kStageWarmup; break;
    case StepKind::Local: who.stage = kStageLocal; break;
    case StepKind::Sync: who.stage = kStageSync; break;
    default: who.stage = kStageCompressed; break;
  }
  return who;
}

void OneBitOptimizer::average_grads(const CollectiveCaller& who, GradView* g, void* stream) {
  if (!average_warmup_) {
    comm_->agree_only(who);  // the caller averaged the gradients: the step runs on them
    return;
  }
  GatherGrads rule;
  rule.x = bucket();
  PassStep gather;
  gather.grads = g;
  run_pass(engine(), rule, gather, stream);
  comm_->allreduce_mean(bucket(), numel_, config().device,
                        config().device == LOWBIT_DEVICE_CUDA ? config().device_index : 0, stream, who);
  for (int64_t i = 0; i < num_params(); ++i)  // the step runs on the average
    g[i] = GradView{bucket() + offsets_[size_t(i)], LOWBIT_DTYPE_FLOAT32};
}

void OneBitOptimizer::averaged_step(const CollectiveCaller& who, GradView* g, void* stream) {
  average_grads(who, g, stream);
  StepControl ctl;
  ctl.check_nonfinite = config().skip_nonfinite != 0;  // every rank holds the same average: all skip alike
  ctl.seed = config().seed;
  engine().step(Algo::AdamW, g, num_params(), ctl, stream);
  PassStep mask;
  mask.honor_skip = true;
  run_pass(engine(), ZeroMasked{}, mask, stream);
}

bool OneBitOptimizer::applied(void* stream) {
  engine().wait(stream);
  const bool ok = !engine().last_step_skipped();
  if (ok) ++known_steps_;
  return ok;
}

PassSkip OneBitOptimizer::exchange(bool finite) const {
  PassSkip skip;
  skip.host = !finite;
  if (config().device == LOWBIT_DEVICE_CUDA) skip.device = comm_->device_nonfinite_flag();
  return skip;
}

}  // namespace distributed
}  // namespace lowbit
