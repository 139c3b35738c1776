// 0/1 Adam (Lu et al. 2022; DeepSpeed's ZeroOneAdam) on the compressed
// communicator, as engine operations (CPU or CUDA); the algorithm is
// specified in lowbit.h ("0/1 Adam and 1-bit LAMB"). Each step is one
// collective over the flat bucket of all parameters:
//  - phase 1 (t <= var_freeze_step): a variance step averages the gradients
//    uncompressed (or runs on the caller's average) and takes an ordinary
//    AdamW step without bias correction; any other step exchanges the
//    gradient with the 1-bit allreduce and blends it into m (v unchanged);
//  - phase 2: local steps exchange one float (whether some rank's gradient
//    was not finite, so that every rank skips alike); a synchronising step
//    exchanges (p_sync - p') D compressed and restarts every rank from
//    p_sync - avg / D, so the replicas stay identical.
// The schedules live on the host, which waits for each step's outcome.
#include <algorithm>
#include <string>

#include "comm/communicator.hpp"
#include "error.hpp"
#include "optimizer.hpp"

namespace lowbit {

void Optimizer::step_zeroone(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream) {
  OneBitState& s = *onebit_;
  const int64_t t = s.known_steps + 1;
  const int64_t var_freeze = config_.freeze_step;
  const bool phase2 = t > var_freeze;
  const bool variance = !phase2 && t % s.var_interval == 0;
  const bool sync = phase2 && (t == var_freeze + 1 || t % s.local_interval == 0);
  CollectiveCaller who;
  who.kind = CollectiveCaller::kZeroOneAdam;
  who.freeze_step = var_freeze;
  who.num_params = num_params();
  who.step = s.known_steps;
  who.stage = variance ? CollectiveCaller::kWarmup
              : !phase2 ? CollectiveCaller::kCompressed
              : sync    ? CollectiveCaller::kSync
                        : CollectiveCaller::kLocal;
  onebit_checks(grads, num_grads, explicit_grads, stream, who, [] {});
  Communicator& comm = *s.comm;
  float* bucket = static_cast<float*>(s.bucket.data());
  const lowbit_device_t device = config_.device;
  const int32_t index = device == LOWBIT_DEVICE_CUDA ? config_.device_index : 0;

  if (variance) {
    onebit_averaged_step(who, stream);
    if (onebit_applied(stream) && ++s.var_counter == s.options.var_update_scaler) {
      s.var_counter = 0;
      s.var_interval *= 2;
    }
    return;
  }
  if (!phase2) {  // the gradient, compressed, into the momentum
    engine_->onebit_gather(grads_.data(), bucket, stream);
    OneBitApply a;
    a.bucket = bucket;
    a.seed = config_.seed;
    a.blend = true;
    a.skip = !comm.compressed_allreduce(bucket, s.numel, device, index, stream, who);
    if (device == LOWBIT_DEVICE_CUDA) a.device_skip = comm.device_nonfinite_flag();
    engine_->onebit_apply(a, stream);
    onebit_applied(stream);
    return;
  }

  if (t == var_freeze + 1) {  // entering phase 2: p_sync = p, fresh errors, schedule from 1
    engine_->zeroone_snapshot(static_cast<float*>(s.aux.data()), stream);
    comm.reset_errors(stream);
    s.local_interval = 1;
    s.local_counter = 0;
    s.lrs.assign(groups_.size(), 0.0);
  }
  s.lrs.resize(groups_.size(), 0.0);
  std::vector<double> lrs = s.lrs;  // committed only if the step applies
  for (size_t g = 0; g < groups_.size(); ++g) lrs[g] += double(groups_[g].lr);
  if (sync) {
    engine_->zeroone_sync_pack(grads_.data(), static_cast<const float*>(s.aux.data()), bucket, stream);
    std::vector<float> inv(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) inv[g] = lrs[g] > 0.0 ? float(1.0 / lrs[g]) : 0.f;
    if (s.inv_lrs.bytes() != inv.size() * sizeof(float)) s.inv_lrs = StateBuffer(engine_.get(), inv.size() * sizeof(float));
    engine_->copy_from_host(s.inv_lrs.data(), inv.data(), inv.size() * sizeof(float), stream);
    ZeroOneSync a;
    a.bucket = bucket;
    a.sync_params = static_cast<float*>(s.aux.data());
    a.group_inv_lrs = static_cast<const float*>(s.inv_lrs.data());
    a.seed = config_.seed;
    a.skip = !comm.compressed_allreduce(bucket, s.numel, device, index, stream, who);
    if (device == LOWBIT_DEVICE_CUDA) a.device_skip = comm.device_nonfinite_flag();
    engine_->zeroone_sync_apply(a, stream);
    if (onebit_applied(stream)) lrs.assign(groups_.size(), 0.0);
    else return;
  } else {
    engine_->onebit_momentum(grads_.data(), bucket, stream);
    float* flag = static_cast<float*>(s.flag.data());
    engine_->nonfinite_flag(bucket, s.numel, flag, stream);
    comm.allreduce_mean(flag, 1, device, index, stream, who);
    OneBitApply a;
    a.bucket = bucket;
    a.seed = config_.seed;
    if (config_.skip_nonfinite) a.skip_if_positive = flag;
    engine_->onebit_apply(a, stream);
    if (!onebit_applied(stream)) return;
  }
  s.lrs = std::move(lrs);
  if (++s.local_counter == s.options.local_step_scaler) {
    s.local_counter = 0;
    s.local_interval = std::min(s.options.local_step_clipper, 2 * s.local_interval);
  }
}

}  // namespace lowbit
