// The defaults behind the lowbit_*_init() helpers of the C API, for the
// places inside the library that need them too (checkpoint loading).
#pragma once
#include "lowbit.h"

namespace lowbit {

// AdamW: lr 1e-3, betas 0.9/0.999, eps 1e-8, wd 0.01; Adam: wd 0; 1-bit
// Adam: no bias correction; Lion: lr 1e-4, betas 0.9/0.99, wd 0; SGD: lr
// 1e-2, no momentum.
lowbit_hparams_t default_hparams(lowbit_algorithm_t algorithm);
// CPU, fp32 state, threshold 4096, seed 0, no SR, no error correction,
// skip_nonfinite 1, all threads, freeze_step 100.
lowbit_optimizer_config_t default_config(lowbit_algorithm_t algorithm);
// Group 0, formats DEFAULT, rounding flags -1 (the optimizer's).
lowbit_param_config_t default_param_config();
lowbit_onebit_options_t default_onebit_options();

}  // namespace lowbit
