// 1-bit Adam (Tang et al. 2021) on top of the compressed communicator, as
// engine operations (CPU or CUDA):
//  - warm-up (step count < freeze_step): the gradients are gathered into the
//    flat fp32 bucket, averaged uncompressed over the ranks, and a normal
//    AdamW step runs on the average (non-finite check included);
//  - compressed stage: the variance is frozen; each rank forms its local
//    momentum m = b1 m + (1 - b1) g in the bucket, the momenta are averaged
//    with the 1-bit compressed allreduce (error feedback inside the
//    communicator), and the update uses the averaged momentum. A non-finite
//    momentum on any rank changes nothing on any rank.
// All parameters share the bucket, so a step is one collective. The stage
// follows from the step count (which checkpoints save), identical on every
// parameter and every rank. Over MPI the collective starts with an agreement
// on who calls it (1-bit Adam, its stage and freeze_step, the number of
// params, numel), which this rank's own checks join when they fail: a bad
// step on one rank fails on every rank with nothing changed.
#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "comm/communicator.hpp"
#include "error.hpp"
#include "optimizer.hpp"
#include "validation.hpp"

namespace lowbit {

// Registration: the bucket grows to every parameter's elements.
void Optimizer::layout_onebit() {
  OneBitState& s = *onebit_;
  int64_t total = 0;
  std::vector<int64_t> offsets(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) offsets[i] = total, total += params_[i].param.numel;
  if (total != s.numel) {
    StateBuffer bucket;
    s.bucket = StateBuffer();  // release first: never two buckets at once
    s.numel = 0;
    bucket = StateBuffer(engine_.get(), size_t(total) * 4, false);
    s.bucket = std::move(bucket);
    s.numel = total;
  }
  s.offsets = std::move(offsets);
  s.masks.resize(params_.size());
  bind_onebit();
  refresh_onebit_steps(nullptr);
  if (config_.algorithm != LOWBIT_ALGORITHM_ONEBIT_ADAM) layout_onebit_ext();
}

namespace {
// A buffer of `bytes` in engine memory that keeps the first bytes of `old`
// (parameters append) and fills the rest from `fill` (repeated pattern).
StateBuffer regrow(Engine* engine, const StateBuffer& old, size_t bytes, const void* fill, size_t fill_bytes) {
  std::vector<uint8_t> host(bytes, 0);
  const size_t keep = std::min(bytes, old.bytes());
  if (keep) engine->copy_to_host(host.data(), old.data(), keep, nullptr);
  if (fill)
    for (size_t at = keep; at + fill_bytes <= bytes; at += fill_bytes) std::memcpy(host.data() + at, fill, fill_bytes);
  StateBuffer out(engine, bytes);
  if (bytes) engine->copy_from_host(out.data(), host.data(), bytes, nullptr);
  return out;
}
}  // namespace

// 0/1 Adam's p_sync or LAMB's v_fresh (flat like the bucket), the LAMB
// scalars, the partials of a pass per chunk, the flag and the per-group lr sums.
void Optimizer::layout_onebit_ext() {
  OneBitState& s = *onebit_;
  StateBuffer aux = regrow(engine_.get(), s.aux, size_t(s.numel) * 4, nullptr, 0);
  const LambScalars fresh{0.f, 1.f, 0.f, 0.f};
  StateBuffer scalars = regrow(engine_.get(), s.lamb_scalars, params_.size() * sizeof(LambScalars), &fresh, sizeof fresh);
  StateBuffer partials(engine_.get(), std::max<size_t>(chunks_.size(), 1) * sizeof(LambPartial));
  StateBuffer flag = s.flag.bytes() ? std::move(s.flag) : StateBuffer(engine_.get(), sizeof(float));
  s.aux = std::move(aux);
  s.lamb_scalars = std::move(scalars);
  s.partials = std::move(partials);
  s.flag = std::move(flag);
}

void Optimizer::bind_onebit() {
  const OneBitState& s = *onebit_;
  std::vector<const uint8_t*> masks(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) masks[i] = static_cast<const uint8_t*>(s.masks[i].data());
  engine_->bind_onebit(s.offsets.data(), masks.data(), int64_t(params_.size()));
  engine_->wait(nullptr);
}

// The host learns the exact step count again (blocking): after registration,
// checkpoint loads and set_step, and when the stage is in doubt.
void Optimizer::refresh_onebit_steps(void* stream) {
  OneBitState& s = *onebit_;
  const std::vector<int64_t> st = steps(stream);
  s.steps_differ = std::any_of(st.begin(), st.end(), [&](int64_t v) { return v != st[0]; });
  s.known_steps = st.empty() ? 0 : st[0];
  s.issued = 0;
}

void Optimizer::set_comm(Communicator& comm) {
  LOWBIT_REQUIRE(onebit_ != nullptr, LOWBIT_ERROR_INVALID_STATE,
                 "set_comm: only a 1-bit Adam optimizer uses a communicator");
  onebit_->comm = &comm;
}

void Optimizer::set_onebit_warmup_average(bool average) {
  LOWBIT_REQUIRE(onebit_ != nullptr, LOWBIT_ERROR_INVALID_STATE,
                 "set_onebit_warmup_average: only a 1-bit Adam optimizer has a warm-up");
  onebit_->average_warmup = average;
}

void Optimizer::set_momentum_mask(int64_t id, const uint8_t* mask, int64_t numel) {
  const ParamState& p = param(id);
  LOWBIT_REQUIRE(onebit_ != nullptr, LOWBIT_ERROR_INVALID_STATE,
                 "set_momentum_mask: only a 1-bit Adam optimizer takes a momentum mask");
  StateBuffer buffer;
  if (mask) {
    LOWBIT_REQUIRE(numel == p.param.numel, LOWBIT_ERROR_INVALID_ARGUMENT, "numel = ", numel,
                   " does not match the param's numel ", p.param.numel);
    buffer = StateBuffer(engine_.get(), size_t(numel), false);
    engine_->copy_from_host(buffer.data(), mask, size_t(numel), nullptr);
  }
  engine_->wait(nullptr);  // no step may still read the old mask
  onebit_->masks[size_t(id)] = std::move(buffer);
  bind_onebit();
}

// Whether this step is in the compressed stage. Every skipped step leaves the
// count where it was; on CUDA the host does not know which issued steps were
// skipped, so near freeze_step it asks the engine (one wait per run, more
// only after skipped steps).
bool Optimizer::onebit_compressed_stage(void* stream) {
  OneBitState& s = *onebit_;
  const int64_t freeze = config_.freeze_step;
  if (s.known_steps >= freeze) return true;
  if (s.known_steps + s.issued < freeze) return false;
  refresh_onebit_steps(stream);
  return s.known_steps >= freeze;
}

void Optimizer::onebit_checks(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream,
                              const CollectiveCaller& who, const std::function<void()>& more) {
  OneBitState& s = *onebit_;
  const char* name = onebit_algorithm_name(config_.algorithm);
  // Without a communicator this rank has no way to tell the others, which
  // wait in this step's agreement (forever, or until their communicator's
  // timeout): it can only fail here, first, having changed nothing.
  LOWBIT_REQUIRE(s.comm != nullptr, LOWBIT_ERROR_INVALID_STATE, "step: a ", name,
                 " optimizer needs a communicator (lowbit_optimizer_set_comm); the other ranks wait for this one in "
                 "their step");
  // Every local check runs before any collective, and a failure joins the
  // agreement the other ranks start their collective with: every rank fails,
  // none waits, nothing changes anywhere.
  lowbit_status_t status = LOWBIT_SUCCESS;
  std::string message;
  try {
    prepare_grads(grads, num_grads, explicit_grads);
    for (size_t i = 0; i < params_.size(); ++i)
      LOWBIT_REQUIRE(grads_[i].data != nullptr, LOWBIT_ERROR_INVALID_ARGUMENT, "grad of param ", i, " is missing: ",
                     name, " communicates every parameter at every step");
    if (s.steps_differ) {
      const std::vector<int64_t> st = steps(stream);
      fail(LOWBIT_ERROR_INVALID_STATE, name, ": params have different step counts (", st.front(), " and ",
           *std::find_if(st.begin(), st.end(), [&](int64_t v) { return v != st.front(); }),
           "); set them equal with lowbit_optimizer_set_step");
    }
    more();
  } catch (const Error& e) {
    status = e.status();
    message = e.what();
  } catch (const std::bad_alloc&) {
    status = LOWBIT_ERROR_OUT_OF_MEMORY;
    message = "step: out of host memory";
  }
  if (status != LOWBIT_SUCCESS) s.comm->fail_collective(status, message, who);
}

void Optimizer::onebit_average_grads(const CollectiveCaller& who, void* stream) {
  OneBitState& s = *onebit_;
  if (!s.average_warmup) {
    s.comm->agree_only(who);  // the caller averaged the gradients: the step runs on them
    return;
  }
  float* bucket = static_cast<float*>(s.bucket.data());
  engine_->onebit_gather(grads_.data(), bucket, stream);
  s.comm->allreduce_mean(bucket, s.numel, config_.device, config_.device == LOWBIT_DEVICE_CUDA ? config_.device_index : 0,
                         stream, who);
  for (size_t i = 0; i < params_.size(); ++i)  // the step runs on the average
    grads_[i] = GradView{bucket + s.offsets[i], LOWBIT_DTYPE_FLOAT32};
}

void Optimizer::onebit_averaged_step(const CollectiveCaller& who, void* stream) {
  onebit_average_grads(who, stream);
  StepControl ctl;
  ctl.check_nonfinite = config_.skip_nonfinite != 0;  // every rank holds the same average: all skip alike
  ctl.seed = config_.seed;
  engine_->step(algo_, grads_.data(), num_params(), ctl, stream);
  engine_->onebit_mask(stream);
}

void Optimizer::step_onebit(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream) {
  OneBitState& s = *onebit_;
  CollectiveCaller who;
  who.kind = CollectiveCaller::kOneBitAdam;
  who.freeze_step = config_.freeze_step;
  who.num_params = num_params();
  bool compressed = false;
  onebit_checks(grads, num_grads, explicit_grads, stream, who,
                [&] { compressed = onebit_compressed_stage(stream); });
  Communicator& comm = *s.comm;
  who.stage = compressed ? CollectiveCaller::kCompressed : CollectiveCaller::kWarmup;
  // Exact on CPU; on CUDA the host does not know which issued steps were skipped.
  if (config_.device == LOWBIT_DEVICE_CPU) who.step = s.known_steps;
  float* bucket = static_cast<float*>(s.bucket.data());
  const lowbit_device_t device = config_.device;
  const int32_t index = config_.device == LOWBIT_DEVICE_CUDA ? config_.device_index : 0;

  if (!compressed) {
    onebit_averaged_step(who, stream);
  } else {
    engine_->onebit_momentum(grads_.data(), bucket, stream);
    OneBitApply a;
    a.bucket = bucket;
    a.freeze_step = config_.freeze_step;
    a.seed = config_.seed;
    a.skip = !comm.compressed_allreduce(bucket, s.numel, device, index, stream, who);
    if (device == LOWBIT_DEVICE_CUDA) a.device_skip = comm.device_nonfinite_flag();
    engine_->onebit_apply(a, stream);
  }
  if (device == LOWBIT_DEVICE_CUDA)
    ++s.issued;
  else if (!engine_->last_step_skipped())
    ++s.known_steps;
}

// ---- shared by 0/1 Adam and 1-bit LAMB

bool Optimizer::onebit_applied(void* stream) {
  engine_->wait(stream);
  const bool applied = !engine_->last_step_skipped();
  if (applied) ++onebit_->known_steps;
  return applied;
}

// Whether the next step runs on gradients averaged uncompressed.
bool Optimizer::onebit_next_full_average() const {
  const OneBitState& s = *onebit_;
  const int64_t t = s.known_steps + 1;
  switch (config_.algorithm) {
    case LOWBIT_ALGORITHM_ZEROONE_ADAM: return t <= config_.freeze_step && t % s.var_interval == 0;
    default: return t <= config_.freeze_step;  // 1-bit Adam and LAMB: the warm-up
  }
}

void Optimizer::set_onebit_options(const lowbit_onebit_options_t& o) {
  LOWBIT_REQUIRE(config_.algorithm == LOWBIT_ALGORITHM_ZEROONE_ADAM || config_.algorithm == LOWBIT_ALGORITHM_ONEBIT_LAMB,
                 LOWBIT_ERROR_INVALID_STATE, "set_onebit_options: only 0/1 Adam and 1-bit LAMB take these options");
  check_onebit_options(o);
  onebit_->options = o;
}

lowbit_onebit_status_t Optimizer::onebit_status(void* stream) {
  LOWBIT_REQUIRE(onebit_ != nullptr, LOWBIT_ERROR_INVALID_STATE,
                 "onebit_status: only 1-bit Adam, 0/1 Adam and 1-bit LAMB have a 1-bit status");
  OneBitState& s = *onebit_;
  if (config_.algorithm == LOWBIT_ALGORITHM_ONEBIT_ADAM) refresh_onebit_steps(stream);
  lowbit_onebit_status_t out{};
  out.struct_size = sizeof out;
  out.step = s.known_steps;
  out.phase = s.known_steps + 1 > config_.freeze_step ? 1 : 0;
  out.next_full_average = onebit_next_full_average() ? 1 : 0;
  out.var_interval = s.var_interval;
  out.var_counter = s.var_counter;
  out.local_step_interval = s.local_interval;
  out.local_step_counter = s.local_counter;
  if (out.next_full_average)
    out.next_exchange = s.average_warmup ? 1 : 0;
  else if (config_.algorithm == LOWBIT_ALGORITHM_ZEROONE_ADAM && out.phase == 1)
    out.next_exchange = (s.known_steps + 1) % s.local_interval == 0 ? 2 : 0;
  else
    out.next_exchange = 2;
  return out;
}

}  // namespace lowbit
