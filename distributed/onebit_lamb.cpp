// 1-bit LAMB (Li et al. 2021; DeepSpeed's OnebitLamb) on the compressed
// communicator (docs/ALGORITHMS.md). Each step is one collective over the
// flat bucket of all parameters:
//  - warm-up (t <= freeze_step): LAMB on the averaged gradients (built-in
//    uncompressed average, or the caller's), recording an EMA of each
//    parameter's trust ratio; the last warm-up step seeds v_fresh;
//  - compression stage: v and the trust ratio frozen; the local momenta,
//    scaled per parameter to equal RMS, go through one 1-bit allreduce; the
//    averaged momentum yields a reconstructed gradient for v_fresh, whose
//    ratio to the frozen v adapts the frozen trust ratio.
// The per-parameter reductions (norms, maxima) run in the fixed order of
// core/pass.hpp, so every rank computes the same ratios.
#include "core/engine.hpp"
#include "distributed/onebit_optimizer.hpp"
#include "distributed/passes.hpp"

namespace lowbit {
namespace distributed {

void OneBitOptimizer::step_lamb(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream) {
  const StepKind kind = schedule_.kind(known_steps_);
  CollectiveCaller who = caller(kCallerOneBitLamb, kind);
  who.step = known_steps_;
  GradView* g = checks(grads, num_grads, explicit_grads, stream, who, [] {});
  const lowbit_onebit_options_t& o = options_;
  const LambOptions options{o.max_coeff, o.min_coeff, o.coeff_beta, o.factor_max, o.factor_min, o.factor_threshold};
  PassStep norms;  // pass A opens the step
  norms.begin = true;
  norms.seed = config().seed;
  norms.honor_skip = true;
  PassStep update;  // pass B closes it
  update.honor_skip = true;
  update.end = true;

  if (kind == StepKind::Averaged) {
    average_grads(who, g, stream);
    norms.grads = g;
    norms.skip_on_bad = config().skip_nonfinite != 0;  // every rank holds the same average: all skip alike
    LambWarmupNorms a;
    a.lamb = lamb();
    a.options = options;
    run_pass(engine(), a, norms, stream);
    if (schedule_.last_warmup(known_steps_)) {
      LambWarmupUpdate<true> b;  // and v_fresh <- v
      b.x = aux();
      b.lamb = lamb();
      run_pass(engine(), b, update, stream);
    } else {
      LambWarmupUpdate<false> b;
      b.lamb = lamb();
      run_pass(engine(), b, update, stream);
    }
    applied(stream);
    return;
  }
  if (!lamb_scaled_) {  // the first compression step: from the warm-up's final (averaged) momenta
    LambScaling scaling;
    scaling.lamb = lamb();
    scaling.rms = static_cast<double*>(rms_.data());
    run_pass(engine(), scaling, PassStep(), stream);
    lamb_scaled_ = true;
  }
  LocalMomentum<false> momentum;
  momentum.x = bucket();
  momentum.lamb = lamb();
  PassStep local;
  local.grads = g;
  run_pass(engine(), momentum, local, stream);
  const lowbit_device_t device = config().device;
  norms.skip = exchange(comm_->compressed_allreduce(bucket(), numel_, device,
                                                    device == LOWBIT_DEVICE_CUDA ? config().device_index : 0, stream,
                                                    who));
  LambCompressedNorms a;
  a.x = bucket();
  a.y = aux();
  a.lamb = lamb();
  a.options = options;
  run_pass(engine(), a, norms, stream);
  LambCompressedUpdate b;
  b.lamb = lamb();
  run_pass(engine(), b, update, stream);
  applied(stream);
}

}  // namespace distributed
}  // namespace lowbit
