// The one home of the state layout rules: which formats a parameter's moments
// get (the optimizer default, per-parameter overrides, the size threshold),
// how many moments the algorithm keeps, how its 16-bit weight is rounded
// (error correction over stochastic rounding), and the bytes all of that
// takes. Used by Optimizer::add_param and exported through
// lowbit_plan_param_state for callers that keep the state themselves (JAX).
#pragma once
#include <cstdint>

#include "lowbit.h"
#include "state.hpp"

namespace lowbit {

struct StatePlan {
  int num_moments = 0;
  lowbit_state_format_t format[2] = {LOWBIT_STATE_DEFAULT, LOWBIT_STATE_DEFAULT};
  lowbit_moment_kind_t kind[2] = {lowbit_moment_kind_t(0), lowbit_moment_kind_t(0)};  // the algorithm's
  Norm norm[2] = {Norm::Block, Norm::Block};  // resolved (Rank1 / Factored only for >= 2 dims)
  Shape shape{};                              // as registered (ndim 0: none)
  WeightRounding rounding = WeightRounding::Nearest;

  int64_t data_bytes(int m, int64_t numel) const {
    return m < num_moments ? moment_data_bytes(format[m], norm[m], shape, numel) : 0;
  }
  int64_t scale_bytes(int m, int64_t numel) const {
    return m < num_moments ? moment_scale_bytes(format[m], norm[m], shape, numel) : 0;
  }
  int64_t ecc_bytes(int64_t numel) const { return rounding == WeightRounding::ErrorCorrection ? numel : 0; }
  int64_t state_bytes(int64_t numel) const;
};

// Checks the per-parameter fields of `param` that the plan reads (formats,
// normalisations, shape, rounding flags, numel >= 0, dtype) and plans its state in an optimizer with
// `config` whose group has `hparams`. Throws lowbit::Error naming the field.
StatePlan plan_param_state(const lowbit_optimizer_config_t& config, const lowbit_hparams_t& hparams,
                           const lowbit_param_config_t& param);

// The normalisations a rule's first pass can serve: RMSprop's momentum
// buffer (slot 1) reads the new square average (slot 0), which a shaped
// param's statistics pass decodes only when it is rank-1 too. Throws
// LOWBIT_ERROR_UNSUPPORTED naming `what` otherwise.
void check_rule_norms(lowbit_algorithm_t algorithm, const lowbit_hparams_t& hparams, int num_moments,
                      const Norm norm[2], const char* what);

// The C view of a plan.
lowbit_state_plan_t to_c_plan(const StatePlan& plan, int64_t numel);

}  // namespace lowbit
