// One descriptor per algorithm: the single home of its facts outside its
// rule (core/update_rules.hpp) and its hyper-parameters
// (core/hparam_specs.hpp): the rule it runs, its moment slots and their
// kinds, when each slot is kept, bias correction, the engines' fast loops,
// and how it may be grouped. Usable on the host and in CUDA kernels.
// Exported through lowbit_algorithm_info (capi/common_api.cpp).
#pragma once
#include <cstdint>

#include "hd.hpp"
#include "lowbit.h"
#include "update_rules.hpp"

namespace lowbit {

// Moment slots the engines hold per parameter (the ABI's [2] arrays).
constexpr int kMomentSlots = 2;

// When a slot is kept, from the group's hyper-parameters. Slots are kept in
// order: a kept slot's predecessors are kept too.
enum class SlotWhen : uint8_t {
  Always,
  Momentum,            // hparams.momentum != 0
  MomentumOrCentered,  // hparams.momentum != 0 or hparams.centered
};

struct MomentSlot {
  const char* name = "";  // torch's state name
  lowbit_moment_kind_t kind = LOWBIT_MOMENT_SIGNED;
  SlotWhen when = SlotWhen::Always;
};

// A flag field of lowbit_hparams_t.
using HparamFlagField = int32_t lowbit_hparams_t::*;

struct AlgorithmDesc {
  lowbit_algorithm_t id = lowbit_algorithm_t(0);  // 0: no algorithm
  const char* name = "";
  const char* title = "";
  Algo rule = Algo::AdamW;
  int num_slots = 0;
  MomentSlot slot[kMomentSlots] = {};
  bool bias_correction = false;  // Adam's (hparams.bias_correction)
  bool factored_second = false;  // slot 1 may be factored
  bool distributed = false;      // a 1-bit optimizer
  bool hybrid_group = false;     // a Muon optimizer's group may take it
  bool matrices = false;         // Muon: params of >= 2 dims only
  // A flag of the hyper-parameters that picks what a slot holds (RMSprop's
  // centered: slot 1 the centred average, else the momentum buffer): fixed
  // once a group has params.
  HparamFlagField fixed_at_registration = nullptr;
  const char* fixed_name = "";
  // With momentum, slot 1's update reads slot 0's new value (RMSprop's
  // buffer divides by the new square average): a shaped param's first pass
  // can serve a rank-1 slot 1 only with a rank-1 slot 0.
  bool momentum_reads_first = false;
  // Its step is the fused step to a workspace, then the per-tensor trust
  // ratio's passes (trust/): LAMB.
  bool trust_ratio = false;
};

namespace desc {
// (functions, not constants: device code cannot take a namespace-scope object's address)
LOWBIT_HD constexpr MomentSlot exp_avg() { return MomentSlot{"exp_avg", LOWBIT_MOMENT_SIGNED, SlotWhen::Always}; }
LOWBIT_HD constexpr MomentSlot exp_avg_sq() {
  return MomentSlot{"exp_avg_sq", LOWBIT_MOMENT_UNSIGNED, SlotWhen::Always};
}
LOWBIT_HD constexpr AlgorithmDesc adam_like(lowbit_algorithm_t id, const char* name, const char* title, Algo rule,
                                            bool distributed, bool hybrid) {
  AlgorithmDesc d{};
  d.id = id;
  d.name = name;
  d.title = title;
  d.rule = rule;
  d.num_slots = 2;
  d.slot[0] = exp_avg();
  d.slot[1] = exp_avg_sq();
  d.bias_correction = true;
  d.factored_second = !distributed;
  d.distributed = distributed;
  d.hybrid_group = hybrid;
  return d;
}
LOWBIT_HD constexpr AlgorithmDesc with_slots(AlgorithmDesc d, int n, MomentSlot a, MomentSlot b = MomentSlot{}) {
  d.num_slots = n;
  d.slot[0] = a;
  d.slot[1] = b;
  return d;
}
LOWBIT_HD constexpr AlgorithmDesc simple(lowbit_algorithm_t id, const char* name, const char* title, Algo rule,
                                         bool hybrid) {
  AlgorithmDesc d{};
  d.id = id;
  d.name = name;
  d.title = title;
  d.rule = rule;
  d.hybrid_group = hybrid;
  return d;
}
}  // namespace desc

// The table. A value that is no algorithm gives id 0.
LOWBIT_HD constexpr AlgorithmDesc describe(lowbit_algorithm_t a) {
  using namespace desc;
  switch (a) {
    case LOWBIT_ALGORITHM_ADAMW: return adam_like(a, "adamw", "AdamW", Algo::AdamW, false, true);
    case LOWBIT_ALGORITHM_ADAM: return adam_like(a, "adam", "Adam", Algo::Adam, false, true);
    // The 1-bit optimizers step AdamW's rule (DeepSpeed's decoupled decay).
    case LOWBIT_ALGORITHM_ONEBIT_ADAM: return adam_like(a, "onebit_adam", "1-bit Adam", Algo::AdamW, true, false);
    case LOWBIT_ALGORITHM_ZEROONE_ADAM: return adam_like(a, "zeroone_adam", "0/1 Adam", Algo::AdamW, true, false);
    case LOWBIT_ALGORITHM_ONEBIT_LAMB: return adam_like(a, "onebit_lamb", "1-bit LAMB", Algo::AdamW, true, false);
    case LOWBIT_ALGORITHM_LION:
      return with_slots(simple(a, "lion", "Lion", Algo::Lion, true), 1, MomentSlot{"exp_avg"});
    case LOWBIT_ALGORITHM_SGD:
      return with_slots(simple(a, "sgd", "SGD", Algo::Sgd, true), 1,
                        MomentSlot{"momentum_buffer", LOWBIT_MOMENT_SIGNED, SlotWhen::Momentum});
    case LOWBIT_ALGORITHM_MUON: {
      AlgorithmDesc d = with_slots(simple(a, "muon", "Muon", Algo::Muon, false), 1, MomentSlot{"momentum_buffer"});
      d.matrices = true;
      return d;
    }
    // square_avg, then the momentum buffer (momentum != 0) or the centred
    // grad average (centered): not both (three moments; issue 46).
    case LOWBIT_ALGORITHM_RMSPROP: {
      AlgorithmDesc d = with_slots(simple(a, "rmsprop", "RMSprop", Algo::RmsProp, true), 2,
                                   MomentSlot{"square_avg", LOWBIT_MOMENT_UNSIGNED, SlotWhen::Always},
                                   MomentSlot{"momentum_buffer", LOWBIT_MOMENT_SIGNED, SlotWhen::MomentumOrCentered});
      d.fixed_at_registration = &lowbit_hparams_t::centered;
      d.fixed_name = "centered";
      d.momentum_reads_first = true;
      return d;
    }
    case LOWBIT_ALGORITHM_ADAGRAD:
      return with_slots(simple(a, "adagrad", "Adagrad", Algo::Adagrad, true), 1,
                        MomentSlot{"sum", LOWBIT_MOMENT_UNSIGNED, SlotWhen::Always});
    case LOWBIT_ALGORITHM_LAMB: {
      AlgorithmDesc d = adam_like(a, "lamb", "LAMB", Algo::Lamb, false, false);
      d.factored_second = false;
      d.trust_ratio = true;
      return d;
    }
    default: return AlgorithmDesc{};
  }
}

LOWBIT_HD constexpr bool is_algorithm(lowbit_algorithm_t a) { return describe(a).id != 0; }

LOWBIT_HD constexpr bool slot_kept(SlotWhen w, const lowbit_hparams_t& h) {
  return w == SlotWhen::Always || (w == SlotWhen::Momentum && h.momentum != 0.f) ||
         (w == SlotWhen::MomentumOrCentered && (h.momentum != 0.f || h.centered != 0));
}

// The moments a group with these hyper-parameters keeps: slots 0 .. n-1.
LOWBIT_HD constexpr int moments_in_use(const AlgorithmDesc& d, const lowbit_hparams_t& h) {
  int n = 0;
  while (n < d.num_slots && slot_kept(d.slot[n].when, h)) ++n;
  return n;
}

// The kind of a slot's moment; a slot past the algorithm's is signed.
LOWBIT_HD constexpr lowbit_moment_kind_t moment_kind(const AlgorithmDesc& d, int slot) {
  return slot >= 0 && slot < d.num_slots ? d.slot[slot].kind : LOWBIT_MOMENT_SIGNED;
}

// The engines' rule for an algorithm (AdamW for a value that is none).
LOWBIT_HD constexpr Algo engine_algo(lowbit_algorithm_t a) { return describe(a).rule; }

// The algorithm whose rule is r, for what only the rule is known by (a
// device's check of hyper-parameters): the first in the table.
LOWBIT_HD constexpr lowbit_algorithm_t rule_algorithm(Algo r) {
  switch (r) {
#define LOWBIT_RULE_ALGORITHM(rule, algorithm) \
  case Algo::rule: return algorithm;
    LOWBIT_RULES(LOWBIT_RULE_ALGORITHM)
#undef LOWBIT_RULE_ALGORITHM
  }
  return LOWBIT_ALGORITHM_ADAMW;
}

// Whether the rule has Adam's bias correction (the scalars' step size).
LOWBIT_HD constexpr bool rule_bias_correction(Algo r) { return describe(rule_algorithm(r)).bias_correction; }

}  // namespace lowbit
