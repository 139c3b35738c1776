// 1-bit Adam (Tang et al. 2021) on the compressed communicator:
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
#include "core/engine.hpp"
#include "distributed/onebit_optimizer.hpp"
#include "distributed/passes.hpp"

namespace lowbit {
namespace distributed {

// Whether this step is in the compressed stage. Every skipped step leaves the
// count where it was; on CUDA the host does not know which issued steps were
// skipped, so near freeze_step it asks the engine (one wait per run, more
// only after skipped steps).
bool OneBitOptimizer::compressed_stage(void* stream) {
  const int64_t freeze = schedule_.freeze_step();
  if (known_steps_ >= freeze) return true;
  if (known_steps_ + issued_ < freeze) return false;
  refresh_steps(stream);
  return schedule_.kind(known_steps_) == StepKind::CompressedMomentum;
}

void OneBitOptimizer::step_onebit_adam(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads,
                                       void* stream) {
  CollectiveCaller who = caller(kCallerOneBitAdam, StepKind::Averaged);
  bool compressed = false;
  GradView* g = checks(grads, num_grads, explicit_grads, stream, who, [&] { compressed = compressed_stage(stream); });
  const bool cuda = config().device == LOWBIT_DEVICE_CUDA;
  who = caller(kCallerOneBitAdam, compressed ? StepKind::CompressedMomentum : StepKind::Averaged);
  if (!cuda) who.step = known_steps_;  // on CUDA the host does not know which issued steps were skipped

  if (!compressed) {
    averaged_step(who, g, stream);
  } else {
    LocalMomentum<false> momentum;
    momentum.x = bucket();
    PassStep gather;
    gather.grads = g;
    run_pass(engine(), momentum, gather, stream);
    const bool finite = comm_->compressed_allreduce(bucket(), numel_, config().device, cuda ? config().device_index : 0,
                                                    stream, who);
    OneBitUpdate<false> update;
    update.x = bucket();
    PassStep apply;
    apply.begin = true;
    apply.skip = exchange(finite);
    apply.frozen_step = schedule_.freeze_step();
    apply.seed = config().seed;
    apply.honor_skip = true;
    apply.end = true;
    run_pass(engine(), update, apply, stream);
  }
  if (cuda)
    ++issued_;
  else if (!engine().last_step_skipped())
    ++known_steps_;
}

}  // namespace distributed
}  // namespace lowbit
