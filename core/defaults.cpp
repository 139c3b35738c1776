#include "defaults.hpp"

#include <cstring>

namespace lowbit {

lowbit_hparams_t default_hparams(lowbit_algorithm_t algorithm) {
  lowbit_hparams_t h;
  std::memset(&h, 0, sizeof h);
  h.struct_size = sizeof h;
  h.lr = 1e-3f;
  h.beta1 = 0.9f;
  h.beta2 = 0.999f;
  h.eps = 1e-8f;
  h.weight_decay = algorithm == LOWBIT_ALGORITHM_ADAMW ? 0.01f : 0.f;
  // The 1-bit optimizers follow DeepSpeed's, which have no bias correction.
  h.bias_correction = algorithm == LOWBIT_ALGORITHM_ONEBIT_ADAM || algorithm == LOWBIT_ALGORITHM_ZEROONE_ADAM ||
                              algorithm == LOWBIT_ALGORITHM_ONEBIT_LAMB
                          ? 0
                          : 1;
  if (algorithm == LOWBIT_ALGORITHM_LION) {
    h.lr = 1e-4f;
    h.beta2 = 0.99f;
  } else if (algorithm == LOWBIT_ALGORITHM_SGD) {
    h.lr = 1e-2f;
  } else if (algorithm == LOWBIT_ALGORITHM_MUON) {  // torch.optim.Muon's
    h.weight_decay = 0.1f;
    h.momentum = 0.95f;
    h.nesterov = 1;
    h.eps = 1e-7f;
  }
  h.algorithm = algorithm;
  h.ns_steps = 5;
  h.ns_coefficients[0] = 3.4445f;
  h.ns_coefficients[1] = -4.7750f;
  h.ns_coefficients[2] = 2.0315f;
  h.adjust_lr = LOWBIT_MUON_LR_ORIGINAL;
  h.ns_precision = LOWBIT_NS_PRECISION_DEFAULT;
  return h;
}

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
