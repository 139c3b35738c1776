// 0/1 Adam (Lu et al. 2022; DeepSpeed's ZeroOneAdam) on the compressed
// communicator (docs/ALGORITHMS.md). Each step is one collective over the
// flat bucket of all parameters; the schedule (schedule.hpp) says which:
//  - phase 1 (t <= var_freeze_step): a variance step averages the gradients
//    uncompressed (or runs on the caller's average) and takes an ordinary
//    AdamW step without bias correction; any other step exchanges the
//    gradient with the 1-bit allreduce and blends it into m (v unchanged);
//  - phase 2: local steps exchange one float (whether some rank's gradient
//    was not finite, so that every rank skips alike); a synchronising step
//    exchanges (p_sync - p') D compressed and restarts every rank from
//    p_sync - avg / D, so the replicas stay identical.
// The host waits for each step's outcome, which advances the schedule.
#include <algorithm>
#include <vector>

#include "core/engine.hpp"
#include "distributed/onebit_optimizer.hpp"
#include "distributed/passes.hpp"

namespace lowbit {
namespace distributed {

void OneBitOptimizer::step_zeroone(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads,
                                   void* stream) {
  const StepKind kind = schedule_.kind(known_steps_);
  CollectiveCaller who = caller(kCallerZeroOneAdam, kind);
  who.step = known_steps_;
  GradView* g = checks(grads, num_grads, explicit_grads, stream, who, [] {});
  const lowbit_device_t device = config().device;
  const int32_t index = device == LOWBIT_DEVICE_CUDA ? config().device_index : 0;
  PassStep apply;  // the pass that applies the step's exchange
  apply.begin = true;
  apply.seed = config().seed;
  apply.honor_skip = true;
  apply.end = true;

  if (kind == StepKind::Averaged) {
    averaged_step(who, g, stream);
    if (applied(stream)) schedule_.applied(kind, options_);
    return;
  }
  if (kind == StepKind::CompressedGrad) {  // the gradient, compressed, into the momentum
    GatherGrads gather;
    gather.x = bucket();
    PassStep with_grads;
    with_grads.grads = g;
    run_pass(engine(), gather, with_grads, stream);
    apply.skip = exchange(comm_->compressed_allreduce(bucket(), numel_, device, index, stream, who));
    OneBitUpdate<true> update;
    update.x = bucket();
    run_pass(engine(), update, apply, stream);
    applied(stream);
    return;
  }

  const std::vector<lowbit_hparams_t>& groups = core_.groups();
  if (schedule_.enters_phase2(known_steps_)) {  // p_sync = p, fresh errors, schedule from 1
    Snapshot snapshot;
    snapshot.x = aux();
    run_pass(engine(), snapshot, PassStep(), stream);
    comm_->reset_errors(stream);
    schedule_.enter_phase2();
    lrs_.assign(groups.size(), 0.0);
  }
  lrs_.resize(groups.size(), 0.0);
  std::vector<double> lrs = lrs_;  // committed only if the step applies
  for (size_t k = 0; k < groups.size(); ++k) lrs[k] += double(groups[k].lr);
  if (kind == StepKind::Sync) {
    SyncPack pack;
    pack.x = bucket();
    pack.y = aux();
    PassStep local;  // this step's scalars, for the local update it undoes
    local.grads = g;
    local.begin = true;
    run_pass(engine(), pack, local, stream);
    std::vector<float> inv(groups.size());
    for (size_t k = 0; k < groups.size(); ++k) inv[k] = lrs[k] > 0.0 ? float(1.0 / lrs[k]) : 0.f;
    if (inv_lrs_.bytes() != inv.size() * sizeof(float)) inv_lrs_ = StateBuffer(&engine(), inv.size() * sizeof(float));
    engine().copy_from_host(inv_lrs_.data(), inv.data(), inv.size() * sizeof(float), stream);
    apply.skip = exchange(comm_->compressed_allreduce(bucket(), numel_, device, index, stream, who));
    SyncApply sync;
    sync.x = bucket();
    sync.y = aux();
    sync.group_inv_lrs = static_cast<const float*>(inv_lrs_.data());
    run_pass(engine(), sync, apply, stream);
    if (!applied(stream)) return;
    lrs.assign(groups.size(), 0.0);
  } else {
    LocalMomentum<true> momentum;  // and the flag of a non-finite value
    momentum.x = bucket();
    momentum.flag = static_cast<float*>(flag_.data());
    PassStep local;
    local.grads = g;
    run_pass(engine(), momentum, local, stream);
    comm_->allreduce_mean(momentum.flag, 1, device, index, stream, who);
    if (config().skip_nonfinite) apply.skip.if_positive = momentum.flag;
    OneBitUpdate<false> update;
    update.x = bucket();
    run_pass(engine(), update, apply, stream);
    if (!applied(stream)) return;
  }
  lrs_ = std::move(lrs);
  schedule_.applied(kind, options_);
}

}  // namespace distributed
}  // namespace lowbit
