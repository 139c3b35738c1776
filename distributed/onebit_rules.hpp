// The math of 1-bit Adam, 0/1 Adam and 1-bit LAMB that their passes
// (passes.hpp) run on every engine: per element, and per parameter from the
// reductions of a pass (whose fixed order, core/pass.hpp, gives every rank
// the same trust ratio). 0/1 Adam and 1-bit LAMB have no bias correction (as
// DeepSpeed's ZeroOneAdam and OnebitLamb); D = sqrt(v) + eps throughout.
#pragma once
#include <cmath>

#include "core/hd.hpp"
#include "core/update_rules.hpp"

namespace lowbit {

// 1-bit Adam, compressed stage (variance frozen): the local momentum that is
// communicated, then the update from the averaged momentum. Decoupled decay
// and the Adam denominator as in AdamW.
LOWBIT_HD float onebit_local_momentum(const StepScalars& s, float m, float g) { return adam_first_moment(s, m, g); }
LOWBIT_HD void onebit_apply(const StepScalars& s, float& p, float m, float v) {
  p *= s.decay_factor;
  p -= s.step_size * m / (sqrtf(v) * s.inv_sqrt_bc2 + s.eps);
}

// Whether x is finite (x - x is 0 exactly for finite x, NaN otherwise; a
// form every engine and compiler keeps as it is, and vectorises).
LOWBIT_HD bool finite(float x) { return x - x == 0.f; }

// 1-bit LAMB's options (lowbit_onebit_options_t, DeepSpeed's names).
struct LambOptions {
  float max_coeff = 10.f, min_coeff = 0.01f, coeff_beta = 0.9f;
  float factor_max = 4.f, factor_min = 0.5f, factor_threshold = 0.1f;
};

// Per-parameter scalars of 1-bit LAMB, in engine memory (checkpointed).
struct LambScalars {
  float coeff_freeze;  // EMA of the warm-up trust ratio (starts at 0)
  float last_factor;   // the last compression-stage factor (starts at 1)
  float scaling;       // momentum scaling of the compression stage (0: not yet computed)
  float trust;         // this step's coefficient (scratch)
};

LOWBIT_HD float lamb_update(float m, float v, float p, float eps, float wd) {
  return m / (sqrtf(v) + eps) + wd * p;
}

// Warm-up trust ratio from ||p||^2 and ||update||^2; updates the EMA as
// DeepSpeed does (only when the ratio is not exactly 1, no bias correction).
LOWBIT_HD float lamb_warmup_trust(double sum_p2, double sum_u2, const LambOptions& o, float& coeff_freeze) {
  const float w = float(sqrt(sum_p2)), r = float(sqrt(sum_u2));
  float c = 1.f;
  if (w != 0.f && r != 0.f) c = fminf(fmaxf(w / r, o.min_coeff), o.max_coeff);
  if (c != 1.f) coeff_freeze = o.coeff_beta * coeff_freeze + (1.f - o.coeff_beta) * c;
  return c;
}

// Compression-stage coefficient: the frozen trust ratio times the factor
// (max of the frozen over the fresh denominator, blended toward 1 by the
// weight decay's share of the update, clipped absolutely and relative to the
// last factor, which it replaces).
LOWBIT_HD float lamb_compressed_trust(float max_ratio, double sum_pre2, double sum_u2, float wd, const LambOptions& o,
                                      float coeff_freeze, float& last_factor) {
  float f = max_ratio;
  if (wd > 0.f) {
    const float r = float(sqrt(sum_u2));
    const float rho = r != 0.f ? fminf(1.f, float(sqrt(sum_pre2)) / r) : 1.f;
    f = f * rho + (1.f - rho);
  }
  f = fminf(fmaxf(f, o.factor_min), o.factor_max);
  f = fminf(fmaxf(f, last_factor * (1.f - o.factor_threshold)), last_factor * (1.f + o.factor_threshold));
  last_factor = f;
  return coeff_freeze * f;
}

// The scaling that equalises the tensors' momentum RMS before the one fused
// compression: S / rms_p with S the mean of the rms over the parameters
// (1 where rms_p is 0: DeepSpeed would divide by zero).
LOWBIT_HD float lamb_scaling(double rms_p, double mean_rms) {
  return rms_p > 0.0 ? float(mean_rms / rms_p) : 1.f;
}

// ---- per element (StepScalars of make_frozen_scalars: step_size = lr)

// 0/1 Adam, a synchronising step's local part: (p_sync - p') D with p' the
// param after the local update (onebit_apply with m' = beta1 m + (1 - beta1) g).
LOWBIT_HD float zeroone_sync_delta(const StepScalars& s, float m, float g, float v, float p_sync, float p) {
  onebit_apply(s, p, onebit_local_momentum(s, m, g), v);
  return (p_sync - p) * (sqrtf(v) + s.eps);
}

// 0/1 Adam after the exchange: the param from the last sync's and the
// averaged delta.
LOWBIT_HD float zeroone_sync_param(float p_sync, float d, float v, float eps) { return p_sync - d / (sqrtf(v) + eps); }

LOWBIT_HD void lamb_moments(const StepScalars& s, float g, float& m, float& v) {
  m = adam_first_moment(s, m, g);
  v = adam_second_moment(s, v, g);
}

// LAMB compression stage, pass A for one element: m <- the exchanged
// momentum unscaled (0 where masked), fresh_v from the reconstructed
// gradient; pre = m / D, u = pre + wd p. Returns D / (sqrt(fresh_v) + eps).
LOWBIT_HD float lamb_compressed_element(const StepScalars& s, bool masked, float avg, float scaling, float& m, float v,
                                        float& fresh_v, float p, float& pre, float& u) {
  const float mk = masked ? 0.f : avg / scaling;
  const float g = (mk - s.beta1 * m) / (1.f - s.beta1);
  fresh_v = s.beta2 * fresh_v + (1.f - s.beta2) * g * g;
  m = mk;
  const float d = sqrtf(v) + s.eps;
  pre = mk / d;
  u = pre + s.weight_decay * p;
  return d / (sqrtf(fresh_v) + s.eps);
}

}  // namespace lowbit
