// The passes of the trust-ratio step (core/pass.hpp) after the fused step
// wrote each param's direction to the workspace X (update_element of the
// algorithm's rule: LAMB's m^ / (sqrt(v^) + eps)), one file for the CPU and
// CUDA engines. As optax's scale_by_trust_ratio: the update u = direction +
// weight_decay p, scaled by ||p|| / ||u|| (1 where either norm is 0), then
// by -lr. The scalars (lr, weight decay) are those the fused step computed.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/pass.hpp"

namespace lowbit {
namespace trust {

// X <- u = direction + weight_decay p; ratio[param] = ||p|| / ||u|| (sums of
// squares in double, in the passes' fixed order).
struct NormRule : PassRuleBase {
  static constexpr uint32_t kReads = kIoParam | kIoX, kWrites = kIoX, kReduce = kSumA | kSumB;
  static constexpr bool kFinish = true;
  float* ratio = nullptr;  // engine memory, one per param
  struct Ctx {
    float weight_decay;
  };
  LOWBIT_HD Ctx param(const PassParam& p) const { return Ctx{p.scalars->weight_decay}; }
  LOWBIT_HD void element(const Ctx& c, PassElement& e) const {
    e.x = e.x + c.weight_decay * e.p;
    e.ra = double(e.p) * double(e.p);
    e.rb = double(e.x) * double(e.x);
  }
  LOWBIT_HD void finish(const PassParam& p, const PassSums& s) const {
    const double param_norm = sqrt(s.a), update_norm = sqrt(s.b);
    // (NaN norms give 1 too: the update itself carries the NaN to the param)
    ratio[p.index] = param_norm > 0.0 && update_norm > 0.0 ? float(param_norm / update_norm) : 1.f;
  }
};

// p <- p - lr (u ratio), with the param's rounding.
struct ApplyRule : PassRuleBase {
  static constexpr uint32_t kReads = kIoParam | kIoX, kWrites = kIoParam;
  const float* ratio = nullptr;
  struct Ctx {
    float lr, ratio;
  };
  LOWBIT_HD Ctx param(const PassParam& p) const { return Ctx{p.scalars->lr, ratio[p.index]}; }
  LOWBIT_HD void element(const Ctx& c, PassElement& e) const { e.p = e.p - c.lr * (e.x * c.ratio); }
};

#define LOWBIT_TRUST_RULES(X) X(::lowbit::trust::NormRule) X(::lowbit::trust::ApplyRule)

}  // namespace trust
}  // namespace lowbit
