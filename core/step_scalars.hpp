// From a group's hyper-parameters and a parameter's step count to what the
// per-element math needs (bias corrections depend on the parameter's own step
// count). One definition for the CPU engine and the CUDA kernels: double
// arithmetic with only IEEE-exact operations (integer powers by repeated
// squaring, not pow()), rounded once to float, so every device computes the
// same bits.
#pragma once
#include <cmath>
#include <cstdint>

#include "hd.hpp"
#include "lowbit.h"
#include "algorithms.hpp"
#include "hparam_visitors.hpp"
#include "update_rules.hpp"

namespace lowbit {

// Whether a group's hyper-parameters are valid for the element-wise rule
// `algo` with this many moments: the specs of core/hparam_specs.hpp (whose
// host check, check_hparams, names the field at fault), for values only the
// device sees (a functional step's hyper-parameters in device memory: a bad
// one skips the step). Comparisons are false for NaN, so NaN is invalid
// everywhere.
LOWBIT_HD bool hparams_valid(const lowbit_hparams_t& h, Algo algo, int num_moments) {
  const lowbit_algorithm_t a = rule_algorithm(algo);
  ValidVisitor v{h};
  walk_hparams(a, v);
  return v.ok && moments_in_use(describe(a), h) == num_moments;
}

// 1 / sqrt(1 - beta2^t): Adam's second-moment bias correction.
LOWBIT_HD float inv_sqrt_bias_correction(float beta2, int64_t t) {
  return float(1.0 / sqrt(1.0 - powi(double(beta2), t)));
}

// Scalars for the step of rule `rule` that follows `step` completed steps
// (only a rule with Adam's bias correction applies hparams.bias_correction).
LOWBIT_HD StepScalars make_step_scalars(const lowbit_hparams_t& h, Algo rule, int64_t step) {
  const bool allow_bias_correction = rule_bias_correction(rule);
  const int64_t t = step + 1;
  StepScalars s{};
  s.lr = h.lr;
  s.beta1 = h.beta1;
  s.beta2 = h.beta2;
  s.eps = h.eps;
  s.weight_decay = h.weight_decay;
  s.decay_factor = float(1.0 - double(h.lr) * double(h.weight_decay));
  const bool bc = h.bias_correction && allow_bias_correction;
  s.step_size = float(bc ? double(h.lr) / (1.0 - powi(double(h.beta1), t)) : double(h.lr));
  s.inv_sqrt_bc2 = bc ? inv_sqrt_bias_correction(h.beta2, t) : 1.f;
  s.momentum = h.momentum;
  s.dampening = h.dampening;
  s.nesterov = h.nesterov;
  s.first_step = step == 0;
  switch (rule) {
#define LOWBIT_RULE_SCALARS(r, algorithm) \
  case Algo::r: rule_scalars<Algo::r>(h, t, s); break;
    LOWBIT_RULES(LOWBIT_RULE_SCALARS)
#undef LOWBIT_RULE_SCALARS
  }
  return s;
}

// The scalars of a pass's step (core/pass.hpp) with the variance frozen at
// step `freeze_step` (1-bit Adam's compressed stage), and with it its bias
// correction; freeze_step 0: none frozen.
LOWBIT_HD StepScalars make_frozen_scalars(const lowbit_hparams_t& h, int64_t step, int64_t freeze_step) {
  StepScalars s = make_step_scalars(h, Algo::AdamW, step);
  if (h.bias_correction && freeze_step > 0) s.inv_sqrt_bc2 = inv_sqrt_bias_correction(h.beta2, freeze_step);
  return s;
}

}  // namespace lowbit
