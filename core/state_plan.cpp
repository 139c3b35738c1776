#include "state_plan.hpp"

#include "error.hpp"
#include "algorithms.hpp"
#include "validation.hpp"

#include <cstdint>
#include <string>

namespace lowbit {
namespace {

// A format the caller left to the optimizer: its default, but fp32 for a
// quantized format under the size threshold. An explicit choice wins over
// the threshold.
lowbit_state_format_t resolve(lowbit_state_format_t requested, lowbit_state_format_t fallback, int64_t numel,
                              int64_t min_quantized_numel) {
  if (requested != LOWBIT_STATE_DEFAULT) return requested;
  const lowbit_state_format_t f = fallback == LOWBIT_STATE_DEFAULT ? LOWBIT_STATE_FP32 : fallback;
  return is_quantized(f) && numel < min_quantized_numel ? LOWBIT_STATE_FP32 : f;
}

std::string shape_string(const lowbit_param_config_t& c) {
  std::string out = "(";
  for (int k = 0; k < c.ndim; ++k) out += (k ? ", " : "") + std::to_string(c.shape[k]);
  return out + ")";
}

}  // namespace

int64_t StatePlan::state_bytes(int64_t numel) const {
  int64_t bytes = ecc_bytes(numel);
  for (int m = 0; m < num_moments; ++m)
    bytes = checked_add_bytes(bytes, checked_add_bytes(data_bytes(m, numel), scale_bytes(m, numel), numel), numel);
  return bytes;
}

StatePlan plan_param_state(const lowbit_optimizer_config_t& config, const lowbit_hparams_t& hparams,
                           const lowbit_param_config_t& c) {
  check_state_format(c.state_format, "state_format", true);
  check_state_format(c.second_state_format, "second_state_format", true);
  check_flag(c.stochastic_rounding, "stochastic_rounding", true);
  check_flag(c.error_correction, "error_correction", true);
  const int64_t numel = c.param.numel;
  // A parameter with no elements (a JAX leaf) plans an empty state; add_param
  // requires elements.
  LOWBIT_REQUIRE(numel >= 0, LOWBIT_ERROR_INVALID_ARGUMENT, "param.numel = ", numel, " must be >= 0");
  LOWBIT_REQUIRE(c.param.dtype >= LOWBIT_DTYPE_FLOAT32 && c.param.dtype <= LOWBIT_DTYPE_FLOAT16,
                 LOWBIT_ERROR_INVALID_ARGUMENT, "param.dtype = ", int(c.param.dtype), " is not a lowbit_dtype_t value");
  check_tensor_bytes(numel, c.param.dtype, "param");

  StatePlan plan;
  const lowbit_algorithm_t algorithm = group_algorithm(hparams, config.algorithm);
  const AlgorithmDesc desc = describe(algorithm);
  plan.num_moments = moments_in_use(desc, hparams);
  for (int m = 0; m < plan.num_moments; ++m) plan.kind[m] = desc.slot[m].kind;
  const lowbit_state_format_t first =
      resolve(c.state_format, config.state_format, numel, config.min_quantized_numel);
  // The second moment follows, in order: its own override, the param's
  // first-moment override, the optimizer's second format, its first format.
  const lowbit_state_format_t second_default =
      config.second_state_format != LOWBIT_STATE_DEFAULT ? config.second_state_format : config.state_format;
  const lowbit_state_format_t second =
      c.second_state_format != LOWBIT_STATE_DEFAULT
          ? c.second_state_format
          : (c.state_format != LOWBIT_STATE_DEFAULT
                 ? c.state_format
                 : resolve(LOWBIT_STATE_DEFAULT, second_default, numel, config.min_quantized_numel));
  if (is_onebit_algorithm(config.algorithm))
    LOWBIT_REQUIRE(first == LOWBIT_STATE_FP32 && second == LOWBIT_STATE_FP32, LOWBIT_ERROR_UNSUPPORTED,
                   "state_format: ", onebit_algorithm_name(config.algorithm),
                   " keeps fp32 state (its momentum is what is communicated)");
  const lowbit_state_format_t formats[2] = {first, second};
  for (int m = 0; m < plan.num_moments; ++m)  // 4BIT_DYN changes only an unsigned moment's map
    plan.format[m] = formats[m] == LOWBIT_STATE_4BIT_DYN && plan.kind[m] != LOWBIT_MOMENT_UNSIGNED ? LOWBIT_STATE_4BIT
                                                                                                   : formats[m];

  // Shape and normalisations.
  LOWBIT_REQUIRE(c.ndim >= 0 && c.ndim <= LOWBIT_MAX_DIMS, LOWBIT_ERROR_INVALID_ARGUMENT, "ndim = ", c.ndim,
                 " must be in 0..", LOWBIT_MAX_DIMS, " (0: a 1-D parameter of numel elements)");
  if (c.ndim > 0) {
    int64_t product = 1;
    bool overflow = false;
    for (int k = 0; k < c.ndim; ++k) {
      LOWBIT_REQUIRE(c.shape[k] >= 1, LOWBIT_ERROR_INVALID_ARGUMENT, "shape[", k, "] = ", c.shape[k],
                     " must be >= 1");
      overflow |= product > INT64_MAX / c.shape[k];
      if (!overflow) product *= c.shape[k];
    }
    LOWBIT_REQUIRE(!overflow && product == numel, LOWBIT_ERROR_INVALID_ARGUMENT, "shape ", shape_string(c),
                   overflow ? " overflows int64" : concat(" has ", product, " elements").c_str(),
                   " but param.numel = ", numel);
    plan.shape.ndim = c.ndim;
    for (int k = 0; k < c.ndim; ++k) plan.shape.dim[k] = c.shape[k];
  }
  check_normalization(c.first_normalization, "first_normalization", false);
  check_normalization(c.second_normalization, "second_normalization", true);
  LOWBIT_REQUIRE(c.second_normalization != LOWBIT_NORMALIZATION_FACTORED || desc.factored_second,
                 LOWBIT_ERROR_INVALID_ARGUMENT, "second_normalization = factored needs AdamW or Adam (algorithm = ",
                 desc.title, ")");
  const bool shaped = c.ndim >= 2;
  LOWBIT_REQUIRE(!desc.matrices || shaped, LOWBIT_ERROR_INVALID_ARGUMENT, "ndim = ", c.ndim,
                 ": Muon orthogonalises matrices, so a param of its group needs a shape of at least 2 dims; put "
                 "1-D params (biases, norms) in a group whose hparams.algorithm is LOWBIT_ALGORITHM_ADAMW");
  const lowbit_normalization_t own[2] = {c.first_normalization, c.second_normalization};
  const lowbit_normalization_t dflt[2] = {config.first_normalization, config.second_normalization};
  const char* field[2] = {"first_normalization", "second_normalization"};
  for (int m = 0; m < plan.num_moments; ++m) {
    const lowbit_normalization_t want = own[m] != LOWBIT_NORMALIZATION_DEFAULT ? own[m] : dflt[m];
    if (is_onebit_algorithm(config.algorithm))
      LOWBIT_REQUIRE(want == LOWBIT_NORMALIZATION_DEFAULT || want == LOWBIT_NORMALIZATION_BLOCK,
                     LOWBIT_ERROR_UNSUPPORTED, field[m], " = ", int(want), ": ",
                     onebit_algorithm_name(config.algorithm), " keeps fp32 state (no rank-1 or factored moments)");
    if (want == LOWBIT_NORMALIZATION_FACTORED && !(m == 1 && desc.factored_second)) {
      // The optimizer's default is factored (a Muon optimizer's hybrid group of another algorithm, say): its
      // blocks. Asked of this param: refused.
      LOWBIT_REQUIRE(own[m] != LOWBIT_NORMALIZATION_FACTORED, LOWBIT_ERROR_INVALID_ARGUMENT, field[m],
                     " = factored: ", desc.title, "'s moment ", m, " (", desc.slot[m].name, ") cannot be factored");
    } else if (want == LOWBIT_NORMALIZATION_FACTORED) {
      LOWBIT_REQUIRE(shaped || own[m] != LOWBIT_NORMALIZATION_FACTORED, LOWBIT_ERROR_INVALID_ARGUMENT, field[m],
                     " = factored needs a parameter of at least 2 dims (ndim = ", c.ndim, ")");
      if (shaped) {
        plan.norm[m] = Norm::Factored;
        plan.format[m] = LOWBIT_STATE_FP32;  // the accumulators
      }
    } else if (want == LOWBIT_NORMALIZATION_RANK1 && shaped && is_quantized(plan.format[m])) {
      LOWBIT_REQUIRE(rank1_format(plan.format[m]),
                     LOWBIT_ERROR_UNSUPPORTED, field[m], " = rank1 needs the 8bit or 4bit format (moment ", m, " is ",
                     format_name(plan.format[m]), ")");
      plan.norm[m] = Norm::Rank1;
    }
  }

  check_rule_norms(algorithm, hparams, plan.num_moments, plan.norm, "second_normalization");

  if (c.param.dtype != LOWBIT_DTYPE_FLOAT32) {
    const int32_t ecc = c.error_correction >= 0 ? c.error_correction : config.error_correction;
    const int32_t sr = c.stochastic_rounding >= 0 ? c.stochastic_rounding : config.stochastic_rounding;
    if (ecc)
      plan.rounding = WeightRounding::ErrorCorrection;
    else if (sr)
      plan.rounding = WeightRounding::Stochastic;
  }
  plan.state_bytes(numel);  // sizes every part in checked arithmetic: a state too large to size fails here
  return plan;
}

void check_rule_norms(lowbit_algorithm_t algorithm, const lowbit_hparams_t& hparams, int num_moments,
                      const Norm norm[2], const char* what) {
  const AlgorithmDesc desc = describe(algorithm);
  LOWBIT_REQUIRE(!(desc.momentum_reads_first && num_moments == 2 && hparams.momentum != 0.f &&
                   norm[1] == Norm::Rank1 && norm[0] != Norm::Rank1),
                 LOWBIT_ERROR_UNSUPPORTED, what, " = rank1 for ", desc.title, "'s ", desc.slot[1].name, " needs a rank-1 ",
                 desc.slot[0].name, " too (first_normalization = rank1): its update reads the new ", desc.slot[0].name);
}

lowbit_state_plan_t to_c_plan(const StatePlan& plan, int64_t numel) {
  lowbit_state_plan_t out{};
  out.struct_size = sizeof(out);
  out.num_moments = plan.num_moments;
  for (int m = 0; m < 2; ++m) {
    out.format[m] = plan.format[m];
    out.block_size[m] = m < plan.num_moments && is_quantized(plan.format[m]) && plan.norm[m] == Norm::Block
                            ? block_size(plan.format[m])
                            : 0;
    out.normalization[m] = m < plan.num_moments ? to_c_norm(plan.norm[m]) : LOWBIT_NORMALIZATION_DEFAULT;
    out.kind[m] = m < plan.num_moments ? plan.kind[m] : lowbit_moment_kind_t(0);
    out.data_bytes[m] = plan.data_bytes(m, numel);
    out.scale_count[m] = plan.scale_bytes(m, numel) / 4;
  }
  out.rounding = lowbit_rounding_t(plan.rounding);
  out.ecc_bytes = plan.ecc_bytes(numel);
  out.state_bytes = plan.state_bytes(numel);
  return out;
}

}  // namespace lowbit
