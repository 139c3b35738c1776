// 1-bit LAMB (Li et al. 2021; DeepSpeed's OnebitLamb) on the compressed
// communicator, as engine operations (CPU or CUDA); the algorithm is
// specified in lowbit.h ("0/1 Adam and 1-bit LAMB"). Each step is one
// collective over the flat bucket of all parameters:
//  - warm-up (t <= freeze_step): LAMB on the averaged gradients (built-in
//    uncompressed average, or the caller's), recording an EMA of each
//    parameter's trust ratio; the last warm-up step seeds v_fresh;
//  - compression stage: v and the trust ratio frozen; the local momenta,
//    scaled per parameter to equal RMS, go through one 1-bit allreduce; the
//    averaged momentum yields a reconstructed gradient for v_fresh, whose
//    ratio to the frozen v adapts the frozen trust ratio.
// The per-parameter reductions (norms, maxima) run on the engine in a fixed
// order (core/onebit_rules.hpp), so every rank computes the same ratios.
#include "comm/communicator.hpp"
#include "error.hpp"
#include "optimizer.hpp"

namespace lowbit {

void Optimizer::step_lamb(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream) {
  OneBitState& s = *onebit_;
  const int64_t t = s.known_steps + 1;
  const bool warmup = t <= config_.freeze_step;
  CollectiveCaller who;
  who.kind = CollectiveCaller::kOneBitLamb;
  who.freeze_step = config_.freeze_step;
  who.num_params = num_params();
  who.step = s.known_steps;
  who.stage = warmup ? CollectiveCaller::kWarmup : CollectiveCaller::kCompressed;
  onebit_checks(grads, num_grads, explicit_grads, stream, who, [] {});
  Communicator& comm = *s.comm;
  float* bucket = static_cast<float*>(s.bucket.data());
  const lowbit_device_t device = config_.device;
  const int32_t index = device == LOWBIT_DEVICE_CUDA ? config_.device_index : 0;

  LambStep a;
  a.scalars = static_cast<LambScalars*>(s.lamb_scalars.data());
  a.partials = static_cast<LambPartial*>(s.partials.data());
  a.fresh_v = static_cast<float*>(s.aux.data());
  const lowbit_onebit_options_t& o = s.options;
  a.options = LambOptions{o.max_coeff, o.min_coeff, o.coeff_beta, o.factor_max, o.factor_min, o.factor_threshold};
  a.seed = config_.seed;
  if (warmup) {
    onebit_average_grads(who, stream);
    a.seed_fresh_v = t == config_.freeze_step;
    a.check_nonfinite = config_.skip_nonfinite != 0;  // every rank holds the same average: all skip alike
    engine_->lamb_warmup(grads_.data(), a, stream);
    onebit_applied(stream);
    return;
  }
  if (!s.lamb_scaled) {  // the first compression step: from the warm-up's final (averaged) momenta
    engine_->lamb_scaling(a.scalars, a.partials, stream);
    s.lamb_scaled = true;
  }
  engine_->lamb_momentum(grads_.data(), a.scalars, bucket, stream);
  a.bucket = bucket;
  a.skip = !comm.compressed_allreduce(bucket, s.numel, device, index, stream, who);
  if (device == LOWBIT_DEVICE_CUDA) a.device_skip = comm.device_nonfinite_flag();
  engine_->lamb_compressed(a, stream);
  onebit_applied(stream);
}

}  // namespace lowbit
