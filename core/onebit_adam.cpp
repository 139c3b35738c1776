// 1-bit Adam (Tang et al. 2021) on top of the compressed communicator:
//  - warm-up (param step < freeze_step): gradients are averaged uncompressed
//    over the ranks, then a normal AdamW step;
//  - compressed stage: the variance is frozen; each rank forms its local
//    momentum m = b1 m + (1 - b1) g, the momenta are averaged with the 1-bit
//    compressed allreduce (error feedback inside the communicator), and the
//    update uses the averaged momentum.
// All parameters share one flat fp32 bucket, so a step is one collective.
// The stage follows from the step count, which checkpoints save.
#include <cmath>
#include <cstring>

#include "codec.hpp"
#include "comm/communicator.hpp"
#include "error.hpp"
#include "optimizer.hpp"

namespace lowbit {
namespace {

bool all_finite(const float* x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    bad |= uint32_t((u & 0x7F800000u) == 0x7F800000u);
  }
  return bad == 0;
}

}  // namespace

void Optimizer::step_onebit(void* stream) {
  LOWBIT_REQUIRE(comm_ != nullptr, LOWBIT_ERROR_INVALID_STATE,
                 "step: a 1-bit Adam optimizer needs a communicator (lowbit_optimizer_set_comm)");
  LOWBIT_REQUIRE(config_.device == LOWBIT_DEVICE_CPU, LOWBIT_ERROR_UNSUPPORTED,
                 "device: 1-bit Adam runs on the CPU engine only in this version");
  for (size_t i = 0; i < params_.size(); ++i)
    LOWBIT_REQUIRE(views_[i].grad != nullptr, LOWBIT_ERROR_INVALID_ARGUMENT, "grad of param ", i,
                   " is missing: 1-bit Adam communicates every parameter at every step");
  for (size_t i = 1; i < params_.size(); ++i)
    LOWBIT_REQUIRE(params_[i].step == params_[0].step, LOWBIT_ERROR_INVALID_STATE,
                   "1-bit Adam: params have different step counts (", params_[0].step, " and ", params_[i].step, ")");
  Communicator& comm = communicator_from_handle(comm_);

  // The flat bucket is laid out once, on the first step after registration.
  int64_t total = 0;
  for (const ParamState& p : params_) total += p.param.numel;
  if (bucket_numel_ != total) {
    StateBuffer bucket(engine_.get(), size_t(total) * 4);
    int64_t offset = 0;
    for (ParamState& p : params_) p.bucket_offset = offset, offset += p.param.numel;
    bucket_ = std::move(bucket);
    bucket_numel_ = total;
  }
  float* bucket = static_cast<float*>(bucket_.data());
  const bool warmup = params_[0].step < config_.freeze_step;

  if (warmup) {
    for (size_t i = 0; i < params_.size(); ++i) {
      const ParamView& v = views_[i];
      for (int64_t b = 0; b < v.numel; b += kTile)
        load_tensor_tile(v.grad, v.grad_dtype, b, int(std::min<int64_t>(kTile, v.numel - b)),
                         bucket + params_[i].bucket_offset + b);
    }
    comm.allreduce_mean(bucket, total, LOWBIT_DEVICE_CPU, 0, stream);
    // Every rank holds the same average, so every rank skips alike.
    last_step_skipped_ = config_.skip_nonfinite && !all_finite(bucket, total);
    if (last_step_skipped_) return;
    for (size_t i = 0; i < params_.size(); ++i) {
      views_[i].grad = bucket + params_[i].bucket_offset;
      views_[i].grad_dtype = LOWBIT_DTYPE_FLOAT32;
    }
    engine_->step(algo_, views_.data(), chunks_.data(), int64_t(chunks_.size()), stream);
    for (ParamState& p : params_) {
      float* m = static_cast<float*>(p.moment[0].data.data());
      for (size_t k = 0; k < p.momentum_mask.size(); ++k)
        if (!p.momentum_mask[k]) m[k] = 0.f;
      ++p.step;
    }
    return;
  }

  // Compressed stage: local momentum into the bucket, 1-bit average, update.
  float g[kTile];
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamView& v = views_[i];
    const ParamState& p = params_[i];
    const float* m = static_cast<const float*>(p.moment[0].data.data());
    float* out = bucket + p.bucket_offset;
    for (int64_t b = 0; b < v.numel; b += kTile) {
      int n = int(std::min<int64_t>(kTile, v.numel - b));
      load_tensor_tile(v.grad, v.grad_dtype, b, n, g);
      for (int k = 0; k < n; ++k) out[b + k] = onebit_local_momentum(v.scalars, m[b + k], g[k]);
    }
    for (size_t k = 0; k < p.momentum_mask.size(); ++k)
      if (!p.momentum_mask[k]) out[k] = 0.f;
  }
  // A non-finite momentum on any rank: nothing changes on any rank.
  if (!comm.compressed_allreduce(bucket, total, LOWBIT_DEVICE_CPU, 0, stream)) {
    last_step_skipped_ = true;
    return;
  }
  last_step_skipped_ = false;
  float pt[kTile];
  for (size_t i = 0; i < params_.size(); ++i) {
    ParamView v = views_[i];
    ParamState& p = params_[i];
    // The frozen variance keeps the bias correction of the step it froze at.
    if (config_.freeze_step > 0 && groups_[size_t(p.group)].bias_correction) {
      double beta2 = groups_[size_t(p.group)].beta2;
      v.scalars.inv_sqrt_bc2 = float(1.0 / std::sqrt(1.0 - std::pow(beta2, double(config_.freeze_step))));
    }
    float* m = static_cast<float*>(p.moment[0].data.data());
    const float* var = static_cast<const float*>(p.moment[1].data.data());
    const float* avg = bucket + p.bucket_offset;
    for (int64_t b = 0; b < v.numel; b += kTile) {
      int n = int(std::min<int64_t>(kTile, v.numel - b));
      load_param_tile(v, b, n, pt);
      for (int k = 0; k < n; ++k) {
        float mk = p.momentum_mask.empty() || p.momentum_mask[size_t(b + k)] ? avg[b + k] : 0.f;
        m[b + k] = mk;
        onebit_apply(v.scalars, pt[k], mk, var[b + k]);
      }
      store_param_tile(v, b, n, pt);
    }
    ++p.step;
  }
}

}  // namespace lowbit
