// From a group's hyper-parameters to what the per-element math needs: the
// engine algorithm and the per-step scalars (bias corrections depend on the
// parameter's own step count; host double arithmetic, rounded once). Shared
// by the optimizer and the JAX handlers so both take the same steps.
#pragma once
#include <cmath>
#include <cstdint>

#include "hd.hpp"
#include "lowbit.h"
#include "update_rules.hpp"

namespace lowbit {

inline Algo engine_algo(lowbit_algorithm_t a) {
  switch (a) {
    case LOWBIT_ALGORITHM_ADAM: return Algo::Adam;
    case LOWBIT_ALGORITHM_LION: return Algo::Lion;
    case LOWBIT_ALGORITHM_SGD: return Algo::Sgd;
    default: return Algo::AdamW;  // AdamW, and 1-bit Adam's decoupled decay as in DeepSpeed
  }
}

// Scalars for the step that follows `step` completed steps. Host and device
// (the CUDA engine's device-scalar mode computes them on the GPU).
LOWBIT_HD StepScalars make_step_scalars(const lowbit_hparams_t& h, bool allow_bias_correction, int64_t step) {
  double t = double(step + 1);
  StepScalars s{};
  s.lr = h.lr;
  s.beta1 = h.beta1;
  s.beta2 = h.beta2;
  s.eps = h.eps;
  s.weight_decay = h.weight_decay;
  s.decay_factor = float(1.0 - double(h.lr) * double(h.weight_decay));
  bool bc = h.bias_correction && allow_bias_correction;
  s.step_size = float(bc ? double(h.lr) / (1.0 - pow(double(h.beta1), t)) : double(h.lr));
  s.inv_sqrt_bc2 = float(bc ? 1.0 / sqrt(1.0 - pow(double(h.beta2), t)) : 1.0);
  s.momentum = h.momentum;
  s.dampening = h.dampening;
  s.nesterov = h.nesterov;
  s.first_step = step == 0;
  return s;
}

// Lion has no bias correction.
inline StepScalars make_step_scalars(const lowbit_hparams_t& h, lowbit_algorithm_t algorithm, int64_t step) {
  return make_step_scalars(h, algorithm != LOWBIT_ALGORITHM_LION, step);
}

}  // namespace lowbit
