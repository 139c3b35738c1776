#include "validation.hpp"

#include <cmath>

#include "algorithms.hpp"
#include "defaults.hpp"
#include "error.hpp"
#include "state.hpp"

namespace lowbit {

void check_normalization(lowbit_normalization_t n, const char* field, bool allow_factored) {
  LOWBIT_REQUIRE(n >= LOWBIT_NORMALIZATION_DEFAULT && n <= LOWBIT_NORMALIZATION_FACTORED,
                 LOWBIT_ERROR_INVALID_ARGUMENT, field, " = ", int(n), " is not a lowbit_normalization_t value");
  LOWBIT_REQUIRE(allow_factored || n != LOWBIT_NORMALIZATION_FACTORED, LOWBIT_ERROR_INVALID_ARGUMENT, field,
                 " = factored: only the second moment can be factored");
}

void check_struct_size(size_t got, size_t expected, const char* what) {
  LOWBIT_REQUIRE(got == expected, LOWBIT_ERROR_INVALID_ARGUMENT, what, ".struct_size = ", got,
                 " is not a size this library knows (expected ", expected, "; use the *_init() helpers)");
}

namespace {
void check_unit_interval(float x, const char* field) {
  LOWBIT_REQUIRE(x >= 0.f && x < 1.f, LOWBIT_ERROR_INVALID_ARGUMENT, field, " = ", x, " must be in [0, 1)");
}
}  // namespace

lowbit_algorithm_t group_algorithm(const lowbit_hparams_t& h, lowbit_algorithm_t optimizer_algorithm) {
  return h.algorithm != 0 ? h.algorithm : optimizer_algorithm;
}

void check_state_format(lowbit_state_format_t f, const char* field, bool allow_default) {
  bool known = (f >= LOWBIT_STATE_FP32 && f <= kLastStateFormat) || (allow_default && f == LOWBIT_STATE_DEFAULT);
  LOWBIT_REQUIRE(known, LOWBIT_ERROR_INVALID_ARGUMENT, field, " = ", int(f), " is not a lowbit_state_format_t value");
}

void check_flag(int32_t value, const char* field, bool allow_default) {
  LOWBIT_REQUIRE(value == 0 || value == 1 || (allow_default && value == -1), LOWBIT_ERROR_INVALID_ARGUMENT, field,
                 " = ", value, allow_default ? " must be -1, 0 or 1" : " must be 0 or 1");
}

void check_num_threads(int32_t num_threads) {
  LOWBIT_REQUIRE(num_threads >= 0 && num_threads <= kMaxNumThreads, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "num_threads = ", num_threads, " must be in [0, ", kMaxNumThreads, "] (0: all OpenMP threads)");
}

void check_config(const lowbit_optimizer_config_t& c) {
  check_algorithm(c.algorithm);
  LOWBIT_REQUIRE(c.device == LOWBIT_DEVICE_CPU || c.device == LOWBIT_DEVICE_CUDA, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "device = ", int(c.device), " is not a lowbit_device_t value");
  LOWBIT_REQUIRE(c.device_index >= 0, LOWBIT_ERROR_INVALID_ARGUMENT, "device_index = ", c.device_index,
                 " must be >= 0");
  check_state_format(c.state_format, "state_format", true);
  check_state_format(c.second_state_format, "second_state_format", true);
  LOWBIT_REQUIRE(c.min_quantized_numel >= 0, LOWBIT_ERROR_INVALID_ARGUMENT, "min_quantized_numel = ",
                 c.min_quantized_numel, " must be >= 0");
  check_flag(c.stochastic_rounding, "stochastic_rounding", false);
  check_flag(c.error_correction, "error_correction", false);
  check_flag(c.skip_nonfinite, "skip_nonfinite", false);
  check_num_threads(c.num_threads);
  LOWBIT_REQUIRE(c.freeze_step >= 0, LOWBIT_ERROR_INVALID_ARGUMENT, "freeze_step = ", c.freeze_step,
                 " must be >= 0");
  check_normalization(c.first_normalization, "first_normalization", false);
  check_normalization(c.second_normalization, "second_normalization", true);
  LOWBIT_REQUIRE(c.second_normalization != LOWBIT_NORMALIZATION_FACTORED || describe(c.algorithm).factored_second,
                 LOWBIT_ERROR_INVALID_ARGUMENT, "second_normalization = factored needs AdamW or Adam (algorithm = ",
                 describe(c.algorithm).title, ")");
  if (is_onebit_algorithm(c.algorithm))
    LOWBIT_REQUIRE(c.first_normalization <= LOWBIT_NORMALIZATION_BLOCK &&
                       c.second_normalization <= LOWBIT_NORMALIZATION_BLOCK,
                   LOWBIT_ERROR_UNSUPPORTED, "first_normalization / second_normalization: ",
                   onebit_algorithm_name(c.algorithm), " keeps fp32 state");
  LOWBIT_REQUIRE(c.algorithm != LOWBIT_ALGORITHM_ONEBIT_LAMB || c.freeze_step >= 1, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "freeze_step = 0: 1-bit LAMB needs at least one warm-up step (its frozen trust ratio and variance "
                 "come from the warm-up)");
  LOWBIT_REQUIRE(c.algorithm != LOWBIT_ALGORITHM_ONEBIT_ADAM || c.freeze_step >= 1, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "freeze_step = 0: 1-bit Adam needs at least one warm-up step (its frozen variance comes from the "
                 "warm-up; without one every update divides by eps)");
  const lowbit_state_format_t second = c.second_state_format != LOWBIT_STATE_DEFAULT ? c.second_state_format : c.state_format;
  const auto rank1_ok = [](lowbit_state_format_t f) { return !is_quantized(f) || rank1_format(f); };
  LOWBIT_REQUIRE(c.first_normalization != LOWBIT_NORMALIZATION_RANK1 || rank1_ok(c.state_format),
                 LOWBIT_ERROR_UNSUPPORTED, "first_normalization = rank1 needs the 8bit or 4bit format (state_format = ",
                 format_name(c.state_format), ")");
  LOWBIT_REQUIRE(c.second_normalization != LOWBIT_NORMALIZATION_RANK1 || rank1_ok(second),
                 LOWBIT_ERROR_UNSUPPORTED, "second_normalization = rank1 needs the 8bit or 4bit format (",
                 format_name(second), ")");
}

void check_tensor_bytes(int64_t numel, lowbit_dtype_t dtype, const char* what) {
  const int64_t elem = dtype == LOWBIT_DTYPE_FLOAT32 ? 4 : 2;
  int64_t bytes = 0;
  LOWBIT_REQUIRE(!__builtin_mul_overflow(numel, elem, &bytes), LOWBIT_ERROR_INVALID_ARGUMENT, what, ".numel = ",
                 numel, " is too large: ", numel, " elements of ", elem, " bytes take more than INT64_MAX bytes");
}

void check_tensor(const lowbit_tensor_t& t, const char* what, lowbit_device_t device, int32_t device_index) {
  LOWBIT_REQUIRE(t.data != nullptr, LOWBIT_ERROR_NULL_POINTER, what, ".data is NULL");
  LOWBIT_REQUIRE(t.numel > 0, LOWBIT_ERROR_INVALID_ARGUMENT, what, ".numel = ", t.numel, " must be > 0");
  LOWBIT_REQUIRE(t.dtype >= LOWBIT_DTYPE_FLOAT32 && t.dtype <= LOWBIT_DTYPE_FLOAT16, LOWBIT_ERROR_INVALID_ARGUMENT,
                 what, ".dtype = ", int(t.dtype), " is not a lowbit_dtype_t value");
  LOWBIT_REQUIRE(t.device == LOWBIT_DEVICE_CPU || t.device == LOWBIT_DEVICE_CUDA, LOWBIT_ERROR_INVALID_ARGUMENT, what,
                 ".device = ", int(t.device), " is not a lowbit_device_t value");
  LOWBIT_REQUIRE(t.device == device && (device == LOWBIT_DEVICE_CPU || t.device_index == device_index),
                 LOWBIT_ERROR_INVALID_ARGUMENT, what, " is on device ", int(t.device), ":", t.device_index,
                 " but the optimizer is on device ", int(device), ":", device_index);
  check_tensor_bytes(t.numel, t.dtype, what);
  int64_t align = t.dtype == LOWBIT_DTYPE_FLOAT32 ? 4 : 2;
  LOWBIT_REQUIRE(reinterpret_cast<uintptr_t>(t.data) % align == 0, LOWBIT_ERROR_INVALID_ARGUMENT, what,
                 ".data is not aligned to its element size ", align);
}

}  // namespace lowbit

namespace lowbit {

bool is_onebit_algorithm(lowbit_algorithm_t a) { return describe(a).distributed; }

const char* onebit_algorithm_name(lowbit_algorithm_t a) {
  switch (a) {
    case LOWBIT_ALGORITHM_ONEBIT_ADAM: return "1-bit Adam";
    case LOWBIT_ALGORITHM_ZEROONE_ADAM: return "0/1 Adam";
    case LOWBIT_ALGORITHM_ONEBIT_LAMB: return "1-bit LAMB";
    case LOWBIT_ALGORITHM_MUON: return "Muon";
    default: return "this algorithm";
  }
}

void check_onebit_options(const lowbit_onebit_options_t& o) {
  LOWBIT_REQUIRE(o.var_update_scaler >= 1, LOWBIT_ERROR_INVALID_ARGUMENT, "var_update_scaler = ", o.var_update_scaler,
                 " must be >= 1");
  LOWBIT_REQUIRE(o.local_step_scaler >= 1, LOWBIT_ERROR_INVALID_ARGUMENT, "local_step_scaler = ", o.local_step_scaler,
                 " must be >= 1");
  LOWBIT_REQUIRE(o.local_step_clipper >= 1 && o.local_step_clipper <= (int64_t(1) << 40), LOWBIT_ERROR_INVALID_ARGUMENT,
                 "local_step_clipper = ", o.local_step_clipper, " must be in [1, 2^40]");
  LOWBIT_REQUIRE(std::isfinite(o.min_coeff) && o.min_coeff > 0.f, LOWBIT_ERROR_INVALID_ARGUMENT, "min_coeff = ",
                 o.min_coeff, " must be finite and > 0");
  LOWBIT_REQUIRE(std::isfinite(o.max_coeff) && o.max_coeff >= o.min_coeff, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "max_coeff = ", o.max_coeff, " must be finite and >= min_coeff = ", o.min_coeff);
  check_unit_interval(o.coeff_beta, "coeff_beta");
  LOWBIT_REQUIRE(std::isfinite(o.factor_min) && o.factor_min > 0.f, LOWBIT_ERROR_INVALID_ARGUMENT, "factor_min = ",
                 o.factor_min, " must be finite and > 0");
  LOWBIT_REQUIRE(std::isfinite(o.factor_max) && o.factor_max >= o.factor_min, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "factor_max = ", o.factor_max, " must be finite and >= factor_min = ", o.factor_min);
  check_unit_interval(o.factor_threshold, "factor_threshold");
}

}  // namespace lowbit
