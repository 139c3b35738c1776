#include "hparams.hpp"

#include <cmath>
#include <cstddef>
#include <cstring>

#include "algorithms.hpp"
#include "defaults.hpp"
#include "error.hpp"
#include "hparam_visitors.hpp"
#include "validation.hpp"

namespace lowbit {
namespace {

std::string bounds_text(const RealBounds& b) {
  if (b.upper == kRealMax && b.upper_in) return concat("must be finite and ", b.lower_in ? ">= " : "> ", b.lower);
  if (b.lower == -kRealMax && b.lower_in) return "must be finite";
  return concat("must be in ", b.lower_in ? "[" : "(", b.lower, ", ", b.upper, b.upper_in ? "]" : ")");
}

const char* rule_message(HparamRule r) {
  switch (r) {
    case HparamRule::NesterovNeedsMomentum: return "nesterov = 1 requires momentum > 0 and dampening = 0";
    case HparamRule::NoBiasCorrection: return "bias_correction = 1";
    case HparamRule::CenteredOrMomentum: return "centered = 1 with momentum != 0";
  }
  return "";
}

// Throws naming the first field out of its bounds.
struct CheckVisitor {
  const lowbit_hparams_t& h;
  lowbit_algorithm_t algorithm;
  void real(const char* name, float lowbit_hparams_t::*f, float, const RealBounds& b, const char*, int) {
    LOWBIT_REQUIRE(in_bounds(h.*f, b), LOWBIT_ERROR_INVALID_ARGUMENT, name, " = ", h.*f, " ", bounds_text(b));
  }
  void flag(const char* name, int32_t lowbit_hparams_t::*f, int, const char*, int) { check_flag(h.*f, name, false); }
  void integer(const char* name, int32_t lowbit_hparams_t::*f, int, int lo, int hi, const char* meaning, int) {
    LOWBIT_REQUIRE(h.*f >= lo && h.*f <= hi, LOWBIT_ERROR_INVALID_ARGUMENT, name, " = ", h.*f, " must be in ", lo,
                   "..", hi, " (", meaning, ")");
  }
  template <class E>
  void enumeration(const char* name, E lowbit_hparams_t::*f, int, int lo, int hi, const char* type, const char*, int) {
    LOWBIT_REQUIRE(int(h.*f) >= lo && int(h.*f) <= hi, LOWBIT_ERROR_INVALID_ARGUMENT, name, " = ", int(h.*f),
                   " is not a ", type, " value");
  }
  void reals3(const char* name, float (lowbit_hparams_t::*f)[3], float, float, float, const char*, int) {
    for (int k = 0; k < 3; ++k)
      LOWBIT_REQUIRE(std::isfinite((h.*f)[k]), LOWBIT_ERROR_INVALID_ARGUMENT, name, "[", k, "] = ", (h.*f)[k],
                     " must be finite");
  }
  void rule(HparamRule r) {
    if (r == HparamRule::CenteredOrMomentum)
      LOWBIT_REQUIRE(rule_holds(r, h), LOWBIT_ERROR_UNSUPPORTED, "centered = 1 with momentum = ", h.momentum,
                     ": RMSprop would keep three moments (square_avg, grad_avg, momentum_buffer) and this library "
                     "keeps at most two per parameter; use centered with momentum 0, or momentum uncentered");
    else if (r == HparamRule::NoBiasCorrection)
      LOWBIT_REQUIRE(rule_holds(r, h), LOWBIT_ERROR_INVALID_ARGUMENT, "bias_correction = 1: ",
                     describe(algorithm).title,
                     " has no bias correction (its variance is updated on a schedule, as DeepSpeed's); set it to 0");
    else
      LOWBIT_REQUIRE(rule_holds(r, h), LOWBIT_ERROR_INVALID_ARGUMENT, rule_message(r), " (got momentum = ", h.momentum,
                     ", dampening = ", h.dampening, ")");
  }
};

template <class T>
size_t offset_of(T lowbit_hparams_t::*f) {
  static const lowbit_hparams_t probe{};
  return size_t(reinterpret_cast<const char*>(&(probe.*f)) - reinterpret_cast<const char*>(&probe));
}

// Collects the C descriptors.
struct InfoVisitor {
  std::vector<lowbit_hparam_info_t> out;
  lowbit_hparam_info_t& add(const char* name, const char* meaning, lowbit_hparam_type_t type, size_t offset,
                            int since) {
    lowbit_hparam_info_t i{};
    i.struct_size = sizeof i;
    i.name = name;
    i.meaning = meaning;
    i.type = type;
    i.count = 1;
    i.offset = offset;
    i.since = since;
    i.lower_inclusive = i.upper_inclusive = 1;
    out.push_back(i);
    return out.back();
  }
  void real(const char* name, float lowbit_hparams_t::*f, float d, const RealBounds& b, const char* meaning,
            int since) {
    auto& i = add(name, meaning, LOWBIT_HPARAM_REAL, offset_of(f), since);
    i.default_value[0] = d;
    i.lower = b.lower;
    i.upper = b.upper;
    i.lower_inclusive = b.lower_in;
    i.upper_inclusive = b.upper_in;
  }
  void flag(const char* name, int32_t lowbit_hparams_t::*f, int d, const char* meaning, int since) {
    auto& i = add(name, meaning, LOWBIT_HPARAM_FLAG, offset_of(f), since);
    i.default_value[0] = d;
    i.upper = 1;
  }
  void integer(const char* name, int32_t lowbit_hparams_t::*f, int d, int lo, int hi, const char* meaning,
               int since) {
    auto& i = add(name, meaning, LOWBIT_HPARAM_INT, offset_of(f), since);
    i.default_value[0] = d;
    i.lower = lo;
    i.upper = hi;
  }
  template <class E>
  void enumeration(const char* name, E lowbit_hparams_t::*f, int d, int lo, int hi, const char*, const char* meaning,
                   int since) {
    auto& i = add(name, meaning, LOWBIT_HPARAM_ENUM, offset_of(f), since);
    i.default_value[0] = d;
    i.lower = lo;
    i.upper = hi;
  }
  void reals3(const char* name, float (lowbit_hparams_t::*f)[3], float a, float b, float c, const char* meaning,
              int since) {
    auto& i = add(name, meaning, LOWBIT_HPARAM_REAL, offset_of(f), since);
    i.count = 3;
    i.default_value[0] = a;
    i.default_value[1] = b;
    i.default_value[2] = c;
    i.lower = -kRealMax;
    i.upper = kRealMax;
  }
  // A rule that pins one field shows in its bounds.
  void rule(HparamRule r) {
    if (r != HparamRule::NoBiasCorrection) return;
    for (lowbit_hparam_info_t& i : out)
      if (std::strcmp(i.name, "bias_correction") == 0) i.upper = 0;
  }
};

}  // namespace

lowbit_hparams_t default_hparams(lowbit_algorithm_t algorithm) {
  lowbit_hparams_t h;
  std::memset(&h, 0, sizeof h);
  h.struct_size = sizeof h;
  // The fields an algorithm does not read keep these (as every release has
  // written them): Adam's, and Muon's Newton-Schulz options.
  h.lr = 1e-3f;
  h.beta1 = 0.9f;
  h.beta2 = 0.999f;
  h.eps = 1e-8f;
  h.bias_correction = 1;
  h.ns_steps = 5;
  h.ns_coefficients[0] = 3.4445f;
  h.ns_coefficients[1] = -4.7750f;
  h.ns_coefficients[2] = 2.0315f;
  h.adjust_lr = LOWBIT_MUON_LR_ORIGINAL;
  h.ns_precision = LOWBIT_NS_PRECISION_DEFAULT;
  h.alpha = 0.99f;
  DefaultsVisitor v{h};
  walk_hparams(algorithm, v);
  h.algorithm = algorithm;
  return h;
}

void check_algorithm(lowbit_algorithm_t a) {
  LOWBIT_REQUIRE(is_algorithm(a), LOWBIT_ERROR_INVALID_ARGUMENT, "algorithm = ", int(a),
                 " is not a lowbit_algorithm_t value");
}

void check_hparams(const lowbit_hparams_t& h, lowbit_algorithm_t optimizer_algorithm) {
  const lowbit_algorithm_t algorithm = group_algorithm(h, optimizer_algorithm);
  if (algorithm != optimizer_algorithm) {
    check_algorithm(h.algorithm);
    LOWBIT_REQUIRE(optimizer_algorithm == LOWBIT_ALGORITHM_MUON && describe(algorithm).hybrid_group,
                   LOWBIT_ERROR_INVALID_ARGUMENT, "algorithm = ", int(h.algorithm),
                   ": only a Muon optimizer's groups may take another algorithm (AdamW, Adam, Lion, SGD, RMSprop or "
                   "Adagrad; the optimizer's algorithm is ",
                   int(optimizer_algorithm), ")");
  }
  CheckVisitor v{h, algorithm};
  walk_hparams(algorithm, v);
}

const std::vector<lowbit_algorithm_t>& all_algorithms() {
  static const std::vector<lowbit_algorithm_t> all = [] {
    std::vector<lowbit_algorithm_t> out;
    for (int a = 1; a <= 64; ++a)
      if (is_algorithm(lowbit_algorithm_t(a))) out.push_back(lowbit_algorithm_t(a));
    return out;
  }();
  return all;
}

lowbit_algorithm_info_t algorithm_info(lowbit_algorithm_t algorithm) {
  check_algorithm(algorithm);
  const AlgorithmDesc d = describe(algorithm);
  lowbit_algorithm_info_t i{};
  i.struct_size = sizeof i;
  i.algorithm = algorithm;
  i.num_hparams = int32_t(hparam_infos(algorithm).size());
  i.name = d.name;
  i.title = d.title;
  i.max_moments = d.num_slots;
  with_rule(d.rule, [&](auto r) { i.reads_param = kMomentsReadParam<decltype(r)::value>; });
  for (int k = 0; k < LOWBIT_MAX_MOMENTS; ++k) {
    i.moment_names[k] = k < d.num_slots ? d.slot[k].name : "";
    i.moment_kinds[k] = k < d.num_slots ? d.slot[k].kind : lowbit_moment_kind_t(0);
  }
  i.bias_correction = d.bias_correction;
  i.factored_second = d.factored_second;
  i.distributed = d.distributed;
  i.hybrid_group = d.hybrid_group;
  i.matrices = d.matrices;
  return i;
}

std::vector<lowbit_hparam_info_t> hparam_infos(lowbit_algorithm_t algorithm) {
  check_algorithm(algorithm);
  InfoVisitor v;
  walk_hparams(algorithm, v);
  return v.out;
}

}  // namespace lowbit
