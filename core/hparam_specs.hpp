// Every algorithm's hyper-parameters, written once: for each, the field of
// lowbit_hparams_t, its default for that algorithm, its bounds and what it
// means. walk_hparams() calls a visitor on each in turn; the visitors
// (core/hparam_visitors.hpp) make the defaults, the host check that names
// the field at fault, the device predicate of a functional step's
// hyper-parameters in device memory, and the descriptors exported through
// lowbit_hparam_info. A host check and its device predicate are so one
// table and cannot disagree.
#pragma once
#include "hd.hpp"
#include "lowbit.h"

namespace lowbit {

constexpr float kRealMax = 3.40282347e38f;

// A real's interval: lower <= v (lower < v if !lower_in), v <= upper (v <
// upper if !upper_in), and finite.
struct RealBounds {
  float lower, upper;
  bool lower_in, upper_in;
};
// (functions, not constants: device code cannot take a namespace-scope object's address)
LOWBIT_HD constexpr RealBounds non_negative() { return {0.f, kRealMax, true, true}; }
LOWBIT_HD constexpr RealBounds positive() { return {0.f, kRealMax, false, true}; }
LOWBIT_HD constexpr RealBounds unit_open() { return {0.f, 1.f, true, false}; }  // [0, 1)
LOWBIT_HD constexpr RealBounds unit_closed() { return {0.f, 1.f, true, true}; }
LOWBIT_HD constexpr RealBounds finite() { return {-kRealMax, kRealMax, true, true}; }

LOWBIT_HD bool in_bounds(float x, const RealBounds& b) {
  return (b.lower_in ? x >= b.lower : x > b.lower) && (b.upper_in ? x <= b.upper : x < b.upper);
}

// Conditions over more than one field (their host messages: core/hparams.cpp).
enum class HparamRule {
  NesterovNeedsMomentum,  // SGD: nesterov = 1 needs momentum > 0 and dampening = 0
  NoBiasCorrection,       // 0/1 Adam, 1-bit LAMB: bias_correction = 0
  CenteredOrMomentum,     // RMSprop: not both (three moments; the engines keep two)
};

LOWBIT_HD bool rule_holds(HparamRule r, const lowbit_hparams_t& h) {
  switch (r) {
    case HparamRule::NesterovNeedsMomentum: return !h.nesterov || (h.momentum > 0.f && h.dampening == 0.f);
    case HparamRule::NoBiasCorrection: return h.bias_correction == 0;
    case HparamRule::CenteredOrMomentum: return !(h.centered && h.momentum != 0.f);
  }
  return false;
}

// Releases, as LOWBIT_VERSION.
constexpr int kSince02 = 200, kSince07 = 700, kSince08 = 800;

namespace specs {

template <class V>
LOWBIT_HD void lr(V& v, float dflt) {
  v.real("lr", &lowbit_hparams_t::lr, dflt, non_negative(), "learning rate", kSince02);
}
template <class V>
LOWBIT_HD void weight_decay(V& v, float dflt, const char* meaning) {
  v.real("weight_decay", &lowbit_hparams_t::weight_decay, dflt, non_negative(), meaning, kSince02);
}
template <class V>
LOWBIT_HD void betas(V& v, float beta1, float beta2, const char* m1, const char* m2) {
  v.real("beta1", &lowbit_hparams_t::beta1, beta1, unit_open(), m1, kSince02);
  v.real("beta2", &lowbit_hparams_t::beta2, beta2, unit_open(), m2, kSince02);
}
template <class V>
LOWBIT_HD void eps(V& v, float dflt, const char* meaning) {
  v.real("eps", &lowbit_hparams_t::eps, dflt, positive(), meaning, kSince02);
}
template <class V>
LOWBIT_HD void momentum(V& v, float dflt) {
  v.real("momentum", &lowbit_hparams_t::momentum, dflt, unit_open(), "momentum factor (0: none)", kSince02);
}
template <class V>
LOWBIT_HD void nesterov(V& v, int dflt) {
  v.flag("nesterov", &lowbit_hparams_t::nesterov, dflt, "Nesterov momentum", kSince02);
}

// Adam, AdamW and the 1-bit optimizers (AdamW's update in DeepSpeed's form).
template <class V>
LOWBIT_HD void adam(V& v, float wd, int bias_correction) {
  lr(v, 1e-3f);
  betas(v, 0.9f, 0.999f, "first-moment decay", "second-moment decay");
  eps(v, 1e-8f, "added to the denominator's sqrt(v)");
  weight_decay(v, wd, "decoupled (AdamW) or L2 (Adam) weight decay");
  v.flag("bias_correction", &lowbit_hparams_t::bias_correction, bias_correction, "Adam's bias correction", kSince02);
}

}  // namespace specs

// The walk over `algorithm`'s hyper-parameters (none for a value that is no
// algorithm). Order: as lowbit_hparam_info numbers them.
template <class V>
LOWBIT_HD void walk_hparams(lowbit_algorithm_t algorithm, V& v) {
  switch (algorithm) {
    case LOWBIT_ALGORITHM_ADAMW: specs::adam(v, 0.01f, 1); return;
    case LOWBIT_ALGORITHM_ADAM:
    case LOWBIT_ALGORITHM_ONEBIT_ADAM: specs::adam(v, 0.f, algorithm == LOWBIT_ALGORITHM_ADAM); return;
    case LOWBIT_ALGORITHM_ZEROONE_ADAM:
    case LOWBIT_ALGORITHM_ONEBIT_LAMB:
      specs::adam(v, 0.f, 0);
      v.rule(HparamRule::NoBiasCorrection);
      return;
    case LOWBIT_ALGORITHM_LION:
      specs::lr(v, 1e-4f);
      specs::betas(v, 0.9f, 0.99f, "interpolation of the update's sign", "momentum decay");
      specs::weight_decay(v, 0.f, "decoupled weight decay");
      return;
    case LOWBIT_ALGORITHM_SGD:
      specs::lr(v, 1e-2f);
      specs::momentum(v, 0.f);
      v.real("dampening", &lowbit_hparams_t::dampening, 0.f, unit_closed(), "dampening of the momentum", kSince02);
      specs::nesterov(v, 0);
      specs::weight_decay(v, 0.f, "L2 weight decay");
      v.rule(HparamRule::NesterovNeedsMomentum);
      return;
    case LOWBIT_ALGORITHM_MUON:  // torch.optim.Muon's
      specs::lr(v, 1e-3f);
      specs::weight_decay(v, 0.1f, "decoupled weight decay");
      specs::momentum(v, 0.95f);
      specs::nesterov(v, 1);
      specs::eps(v, 1e-7f, "floor of the Frobenius norm the update is divided by");
      v.integer("ns_steps", &lowbit_hparams_t::ns_steps, 5, 1, 100, "Newton-Schulz iterations", kSince07);
      v.reals3("ns_coefficients", &lowbit_hparams_t::ns_coefficients, 3.4445f, -4.7750f, 2.0315f,
               "the quintic's (a, b, c)", kSince07);
      v.enumeration("adjust_lr", &lowbit_hparams_t::adjust_lr, int(LOWBIT_MUON_LR_ORIGINAL),
                    int(LOWBIT_MUON_LR_ORIGINAL), int(LOWBIT_MUON_LR_NONE), "lowbit_muon_lr_adjust_t",
                    "torch.optim.Muon's adjust_lr_fn", kSince07);
      v.enumeration("ns_precision", &lowbit_hparams_t::ns_precision, int(LOWBIT_NS_PRECISION_DEFAULT),
                    int(LOWBIT_NS_PRECISION_DEFAULT), int(LOWBIT_NS_PRECISION_BF16), "lowbit_ns_precision_t",
                    "how the Newton-Schulz products are rounded", kSince07);
      return;
    case LOWBIT_ALGORITHM_RMSPROP:  // torch.optim.RMSprop's
      specs::lr(v, 1e-2f);
      v.real("alpha", &lowbit_hparams_t::alpha, 0.99f, unit_open(), "smoothing constant of the square average",
             kSince08);
      specs::eps(v, 1e-8f, "added to the denominator's sqrt");
      specs::weight_decay(v, 0.f, "L2 weight decay");
      specs::momentum(v, 0.f);
      v.flag("centered", &lowbit_hparams_t::centered, 0, "divide by the variance estimate", kSince08);
      v.rule(HparamRule::CenteredOrMomentum);
      return;
    case LOWBIT_ALGORITHM_ADAGRAD:  // torch.optim.Adagrad's
      specs::lr(v, 1e-2f);
      v.real("lr_decay", &lowbit_hparams_t::lr_decay, 0.f, non_negative(), "lr / (1 + (t - 1) lr_decay)", kSince08);
      specs::weight_decay(v, 0.f, "L2 weight decay");
      v.real("initial_accumulator_value", &lowbit_hparams_t::initial_accumulator_value, 0.f, non_negative(),
             "the sum of squares' start", kSince08);
      specs::eps(v, 1e-10f, "added to the denominator's sqrt");
      return;
    case LOWBIT_ALGORITHM_LAMB:  // optax.lamb's
      specs::lr(v, 1e-3f);
      specs::betas(v, 0.9f, 0.999f, "first-moment decay", "second-moment decay");
      specs::eps(v, 1e-6f, "added to the denominator's sqrt(v)");
      specs::weight_decay(v, 0.f, "decoupled weight decay, inside the trust-ratio update");
      v.flag("bias_correction", &lowbit_hparams_t::bias_correction, 1, "Adam's bias correction", kSince02);
      return;
    default: return;
  }
}

}  // namespace lowbit
