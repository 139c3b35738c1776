// The per-element math of every algorithm: the one reference implementation,
// used by the CPU engine and the CUDA kernels alike. Moments come in and go
// out as fp32; storage formats are handled around these functions.
#pragma once
#include <cmath>
#include <cstdint>

#include "float16.hpp"
#include "hd.hpp"
#include "lowbit.h"

namespace lowbit {

// Per-parameter, per-step scalars (bias corrections depend on the param's
// own step count), computed on the host in double and rounded once.
struct StepScalars {
  float lr;
  float beta1, beta2, eps;
  float weight_decay;
  float decay_factor;   // 1 - lr * weight_decay (decoupled decay)
  float step_size;      // Adam: lr / (1 - beta1^t)
  float inv_sqrt_bc2;   // Adam: 1 / sqrt(1 - beta2^t)
  float momentum, dampening;
  int nesterov;
  int first_step;       // SGD: the momentum buffer starts as the gradient; Adagrad: the sum starts
  float alpha;          // RMSprop: the square average's smoothing constant
  int centered;         // RMSprop
  float initial_sum;    // Adagrad: initial_accumulator_value
};

// Every rule, each with the algorithm that names it (core/algorithms.hpp):
// the one list the enum, the engines' dispatch and the instantiations
// (CPU, CUDA, emulation) are generated from.
#define LOWBIT_RULES(X)                    \
  X(AdamW, LOWBIT_ALGORITHM_ADAMW)         \
  X(Adam, LOWBIT_ALGORITHM_ADAM)           \
  X(Lion, LOWBIT_ALGORITHM_LION)           \
  X(Sgd, LOWBIT_ALGORITHM_SGD)             \
  X(Muon, LOWBIT_ALGORITHM_MUON)           \
  X(RmsProp, LOWBIT_ALGORITHM_RMSPROP)     \
  X(Adagrad, LOWBIT_ALGORITHM_ADAGRAD)      \
  X(Lamb, LOWBIT_ALGORITHM_LAMB)

enum class Algo {
#define LOWBIT_RULE_ENUM(rule, algorithm) rule,
  LOWBIT_RULES(LOWBIT_RULE_ENUM)
#undef LOWBIT_RULE_ENUM
};

// f(RuleTag<A>{}) for the rule `a`: the engines' one dispatch.
template <Algo A>
struct RuleTag {
  static constexpr Algo value = A;
};
template <class F>
inline void with_rule(Algo a, F&& f) {
  switch (a) {
#define LOWBIT_RULE_CASE(rule, algorithm) \
  case Algo::rule: f(RuleTag<Algo::rule>{}); return;
    LOWBIT_RULES(LOWBIT_RULE_CASE)
#undef LOWBIT_RULE_CASE
  }
}

// The largest second moment: the largest bf16, 3.3895e38 (bits 0x7F7F0000),
// which every state format holds. A finite gradient whose square would take
// a second moment past it (|g| above ~5.8e20 at beta2 = 0.999; the factored
// g^2 above ~1.8e19) leaves it there, where it used to overflow to Inf, which
// quantized states decode as NaN (0 * Inf) and a factored v^ = row / mean *
// col as Inf / Inf. Results up to kMomentMax keep their bits.
constexpr float kMomentMax = 0x1.FEp+127f;

// min(r, kMomentMax), NaN kept (a NaN gradient still propagates; an
// infinite one leaves kMomentMax in v, and its m and param go non-finite as
// before). One compare and one select: a cost of the step's inner loop.
LOWBIT_HD float saturate_moment(float r) { return r > kMomentMax ? kMomentMax : r; }

// The moments' updates, each written once: the rules below, the 1-bit
// rules and update_moments() (the shaped params' first pass) share them.
LOWBIT_HD float adam_first_moment(const StepScalars& s, float m, float g) { return s.beta1 * m + (1.f - s.beta1) * g; }
LOWBIT_HD float adam_second_moment(const StepScalars& s, float v, float g) {
  return saturate_moment(s.beta2 * v + (1.f - s.beta2) * g * g);
}
LOWBIT_HD float lion_momentum(const StepScalars& s, float m, float g) { return s.beta2 * m + (1.f - s.beta2) * g; }
LOWBIT_HD float sgd_momentum(const StepScalars& s, float m, float g) {
  return s.first_step ? g : s.momentum * m + (1.f - s.dampening) * g;
}
// Muon's momentum as torch.optim.Muon writes it, buf.lerp_(grad, 1 - momentum)
// (torch's lerp for a weight below 0.5: start + weight * (end - start)).
LOWBIT_HD float muon_momentum(const StepScalars& s, float m, float g) { return m + (1.f - s.momentum) * (g - m); }
LOWBIT_HD float l2_decayed_grad(const StepScalars& s, float p, float g) { return g + s.weight_decay * p; }

template <Algo A>
LOWBIT_HD void update_element(const StepScalars& s, float& p, float g, float& m, float& v);

// b^n for n >= 0 by repeated squaring: a fixed sequence of IEEE double
// multiplications (relative error below 2 log2(n) ulps of double).
LOWBIT_HD double powi(double b, int64_t n) {
  double r = 1.0;
  while (n > 0) {
    if (n & 1) r *= b;
    b *= b;
    n >>= 1;
  }
  return r;
}

// A rule's own scalars, beyond make_step_scalars' common ones
// (core/step_scalars.hpp), for the step t = step + 1 of a param: none by
// default. Host arithmetic rules as make_step_scalars': double, rounded once.
template <Algo A>
LOWBIT_HD void rule_scalars(const lowbit_hparams_t&, int64_t, StepScalars&) {}

// AdamW as torch.optim.AdamW: decay p first, then the Adam step.
template <>
LOWBIT_HD void update_element<Algo::AdamW>(const StepScalars& s, float& p, float g, float& m, float& v) {
  p *= s.decay_factor;
  m = adam_first_moment(s, m, g);
  v = adam_second_moment(s, v, g);
  float denom = sqrtf(v) * s.inv_sqrt_bc2 + s.eps;
  p -= s.step_size * m / denom;
}

// Adam with L2 decay: the decay is added to the gradient.
template <>
LOWBIT_HD void update_element<Algo::Adam>(const StepScalars& s, float& p, float g, float& m, float& v) {
  g = l2_decayed_grad(s, p, g);
  m = adam_first_moment(s, m, g);
  v = adam_second_moment(s, v, g);
  float denom = sqrtf(v) * s.inv_sqrt_bc2 + s.eps;
  p -= s.step_size * m / denom;
}

// lr * sign(c) with sign(0) = sign(NaN) = 0: lr * +-1 is exactly lr with c's
// sign bit flipped in, so no multiply and no sign value (5 GPU instructions a
// value fewer than the product of the compare-built sign).
LOWBIT_HD float lr_times_sign(float lr, float c) {
  return (c > 0.f || c < 0.f) ? bits_float(float_bits(lr) ^ (float_bits(c) & 0x80000000u)) : lr * 0.f;
}

// Lion (Chen et al. 2023) with decoupled decay; sign(0) = 0.
template <>
LOWBIT_HD void update_element<Algo::Lion>(const StepScalars& s, float& p, float g, float& m, float&) {
  float c = s.beta1 * m + (1.f - s.beta1) * g;
  p = p * s.decay_factor - lr_times_sign(s.lr, c);
  m = lion_momentum(s, m, g);
}

// SGD as torch.optim.SGD: L2 decay, momentum with dampening, Nesterov.
template <>
LOWBIT_HD void update_element<Algo::Sgd>(const StepScalars& s, float& p, float g, float& m, float&) {
  g = l2_decayed_grad(s, p, g);
  if (s.momentum != 0.f) {
    m = sgd_momentum(s, m, g);
    g = s.nesterov ? g + s.momentum * m : m;
  }
  p -= s.lr * g;
}

// Muon's element-wise part: the momentum, and in p the matrix that
// Newton-Schulz orthogonalises (the param itself is updated after it,
// muon/muon_rules.hpp): grad.lerp(buf, momentum) with Nesterov (torch's lerp
// for a weight of 0.5 or more: end - (end - start) * (1 - weight)), else the
// momentum. The step writes p to a workspace (StepControl::flat_out), never
// to the param.
template <>
LOWBIT_HD void update_element<Algo::Muon>(const StepScalars& s, float& p, float g, float& m, float&) {
  m = muon_momentum(s, m, g);
  p = s.nesterov ? m - (m - g) * (1.f - s.momentum) : m;
}

// RMSprop as torch.optim.RMSprop: sq is the square average; b the momentum
// buffer (momentum != 0) or the centred grad average (centered), never both.
// The centred variance is clamped at 0: quantized averages can leave
// sq < gavg^2, where torch's sqrt would give NaN.
LOWBIT_HD float rmsprop_square_avg(const StepScalars& s, float sq, float g) {
  return saturate_moment(s.alpha * sq + (1.f - s.alpha) * g * g);
}
LOWBIT_HD float rmsprop_grad_avg(const StepScalars& s, float a, float g) { return a + (1.f - s.alpha) * (g - a); }
LOWBIT_HD float rmsprop_denominator(const StepScalars& s, float sq, float gavg) {
  const float var = s.centered ? sq - gavg * gavg : sq;
  return sqrtf(var > 0.f ? var : 0.f) + s.eps;
}
template <>
LOWBIT_HD void rule_scalars<Algo::RmsProp>(const lowbit_hparams_t& h, int64_t, StepScalars& s) {
  s.alpha = h.alpha;
  s.centered = h.centered;
}
template <>
LOWBIT_HD void update_element<Algo::RmsProp>(const StepScalars& s, float& p, float g, float& sq, float& b) {
  g = l2_decayed_grad(s, p, g);
  sq = rmsprop_square_avg(s, sq, g);
  if (s.centered) b = rmsprop_grad_avg(s, b, g);
  const float denom = rmsprop_denominator(s, sq, s.centered ? b : 0.f);
  if (s.momentum != 0.f) {
    b = s.momentum * b + g / denom;
    p -= s.lr * b;
  } else {
    p -= s.lr * (g / denom);
  }
}

// Adagrad as torch.optim.Adagrad: the sum of squares starts at
// initial_accumulator_value (the stored state is zero before the first
// step); step_size is lr / (1 + (t - 1) lr_decay).
LOWBIT_HD float adagrad_sum(const StepScalars& s, float sum, float g) {
  return saturate_moment((s.first_step ? s.initial_sum : sum) + g * g);
}
template <>
LOWBIT_HD void rule_scalars<Algo::Adagrad>(const lowbit_hparams_t& h, int64_t t, StepScalars& s) {
  s.step_size = float(double(h.lr) / (1.0 + double(t - 1) * double(h.lr_decay)));
  s.initial_sum = h.initial_accumulator_value;
}
template <>
LOWBIT_HD void update_element<Algo::Adagrad>(const StepScalars& s, float& p, float g, float& sum, float&) {
  g = l2_decayed_grad(s, p, g);
  sum = adagrad_sum(s, sum, g);
  p -= s.step_size * (g / (sqrtf(sum) + s.eps));
}

// LAMB (You et al. 2020) as optax.lamb: Adam's moments and bias-corrected
// direction m^ / (sqrt(v^) + eps), which the step writes to a workspace
// (StepControl::flat_out) instead of the param; the trust ratio's passes
// (trust/trust_rules.hpp) add the decoupled decay, scale it by
// ||p|| / ||update|| and apply it. step_size is the first moment's bias
// correction alone (no lr: the passes apply it).
template <>
LOWBIT_HD void rule_scalars<Algo::Lamb>(const lowbit_hparams_t& h, int64_t t, StepScalars& s) {
  s.step_size = float(h.bias_correction ? 1.0 / (1.0 - powi(double(h.beta1), t)) : 1.0);
}
template <>
LOWBIT_HD void update_element<Algo::Lamb>(const StepScalars& s, float& p, float g, float& m, float& v) {
  m = adam_first_moment(s, m, g);
  v = adam_second_moment(s, v, g);
  const float denom = sqrtf(v) * s.inv_sqrt_bc2 + s.eps;
  p = s.step_size * m / denom;
}

// Whether A's step writes its result to StepControl::flat_out instead of the
// param, which it neither reads nor changes (the param's update follows in
// passes: Muon's orthogonalisation, LAMB's trust ratio).
template <Algo A>
constexpr bool kFlatOut = A == Algo::Muon || A == Algo::Lamb;

// Whether A's moments depend on the param (L2 decay adds it to the grad).
template <Algo A>
constexpr bool kMomentsReadParam = A == Algo::Adam || A == Algo::Sgd || A == Algo::RmsProp || A == Algo::Adagrad;

// Whether the engines' fast loops (the CUDA kernel's dispatch_fast) serve A:
// they assume a signed first moment in slot 0 and, for two, Adam's slots.
template <Algo A>
constexpr bool kFastLoops = A == Algo::AdamW || A == Algo::Adam || A == Algo::Lion || A == Algo::Sgd;

// The new moments alone, as update_element<A> leaves them (the param is read,
// not updated): what a shaped param's first pass needs for its statistics.
// kFirst / kSecond: which moments to compute (the others are not touched).
template <Algo A, bool kFirst, bool kSecond>
LOWBIT_HD void update_moments(const StepScalars& s, float p, float g, float& m, float& v) {
  if (kMomentsReadParam<A>) g = l2_decayed_grad(s, p, g);
  if (A == Algo::AdamW || A == Algo::Adam || A == Algo::Lamb) {
    if (kFirst) m = adam_first_moment(s, m, g);
    if (kSecond) v = adam_second_moment(s, v, g);
  } else if (A == Algo::Lion) {
    if (kFirst) m = lion_momentum(s, m, g);
  } else if (A == Algo::Sgd) {
    if (kFirst && s.momentum != 0.f) m = sgd_momentum(s, m, g);
  } else if (A == Algo::Muon) {
    if (kFirst) m = muon_momentum(s, m, g);
  } else if (A == Algo::RmsProp) {
    const float sq = rmsprop_square_avg(s, m, g);
    if (kSecond) {
      if (s.centered) {
        v = rmsprop_grad_avg(s, v, g);
      } else if (s.momentum != 0.f) {
        v = s.momentum * v + g / rmsprop_denominator(s, sq, 0.f);
      }
    }
    if (kFirst) m = sq;
  } else if (A == Algo::Adagrad) {
    if (kFirst) m = adagrad_sum(s, m, g);
  }
}

// Adam / AdamW with a factored second moment (core/shape.hpp): v is the
// reconstruction of this step's accumulators and is not stored here; m and p
// as in update_element.
template <Algo A>
LOWBIT_HD void update_element_factored(const StepScalars& s, float& p, float g, float& m, float vhat) {
  if (A == Algo::Adam)
    g = l2_decayed_grad(s, p, g);
  else
    p *= s.decay_factor;
  m = adam_first_moment(s, m, g);
  float denom = sqrtf(vhat) * s.inv_sqrt_bc2 + s.eps;
  p -= s.step_size * m / denom;
}

}  // namespace lowbit
