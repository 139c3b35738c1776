#include "defaults.hpp"

#include <cstring>

namespace lowbit {

lowbit_optimizer_config_t default_config(lowbit_algorithm_t algorithm) {
  lowbit_optimizer_config_t c;
  std::memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.algorithm = algorithm;
  c.device = LOWBIT_DEVICE_CPU;
  c.state_format = LOWBIT_STATE_FP32;
  c.second_state_format = LOWBIT_STATE_DEFAULT;
  c.min_quantized_numel = 4096;
  c.skip_nonfinite = 1;
  c.freeze_step = 100;
  c.first_normalization = LOWBIT_NORMALIZATION_BLOCK;
  c.second_normalization = LOWBIT_NORMALIZATION_BLOCK;
  return c;
}

lowbit_onebit_options_t default_onebit_options() {
  lowbit_onebit_options_t o;
  std::memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.var_update_scaler = 16;
  o.local_step_scaler = 32678;  // DeepSpeed's default (sic)
  o.local_step_clipper = 16;
  o.max_coeff = 10.f;
  o.min_coeff = 0.01f;
  o.coeff_beta = 0.9f;
  o.factor_max = 4.f;
  o.factor_min = 0.5f;
  o.factor_threshold = 0.1f;
  return o;
}

lowbit_param_config_t default_param_config() {
  lowbit_param_config_t c;
  std::memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.stochastic_rounding = -1;
  c.error_correction = -1;
  return c;
}

}  // namespace lowbit
