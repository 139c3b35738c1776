// hparams_valid (core/step_scalars.hpp: the check a device makes of
// hyper-parameters it reads from memory) against check_hparams
// (core/validation.cpp: the host's, with messages): the same verdict for
// every element-wise algorithm on edge values (0, 1, negatives, NaN, Inf,
// flags out of range, Nesterov's conditions) and random combinations.
// Seed: LOWBIT_TEST_SEED.
#include <cmath>
#include <cstdio>
#include <random>

#include "core/error.hpp"
#include "core/step_scalars.hpp"
#include "core/algorithms.hpp"
#include "core/update_rules.hpp"
#include "core/validation.hpp"

// cmocka after the core headers: its fail() macro would rename lowbit::fail
extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
}

#include "../common/test_seed.h"

using namespace lowbit;

namespace {

std::mt19937_64 rng;

float pick(std::mt19937_64& g) {
  static const float kValues[] = {0.f, 1.f, -1.f, 0.5f, 0.9f, 0.999f, 1e-8f, -0.f, 1.5f, 2.f, 1e38f,
                                  INFINITY, -INFINITY, NAN, 3.4e38f, 0.99999994f};
  return kValues[g() % (sizeof kValues / sizeof kValues[0])];
}

int32_t pick_flag(std::mt19937_64& g) {
  static const int32_t kFlags[] = {0, 1, 0, 1, -1, 2};
  return kFlags[g() % 6];
}

void test_same_verdict(void**) {
  // Every element-wise algorithm with a rule of its own (the 1-bit ones
  // run AdamW's).
  const lowbit_algorithm_t algos[] = {LOWBIT_ALGORITHM_ADAMW, LOWBIT_ALGORITHM_ADAM,    LOWBIT_ALGORITHM_LION,
                                      LOWBIT_ALGORITHM_SGD,   LOWBIT_ALGORITHM_RMSPROP, LOWBIT_ALGORITHM_ADAGRAD};
  const int num_algos = int(sizeof algos / sizeof algos[0]);
  int valid = 0, invalid = 0;
  for (int n = 0; n < 300000; ++n) {
    const lowbit_algorithm_t a = algos[rng() % num_algos];
    lowbit_hparams_t h{};
    h.struct_size = sizeof h;
    h.lr = pick(rng), h.beta1 = pick(rng), h.beta2 = pick(rng), h.eps = pick(rng);
    h.weight_decay = pick(rng), h.momentum = pick(rng), h.dampening = pick(rng);
    h.nesterov = pick_flag(rng), h.bias_correction = pick_flag(rng);
    h.alpha = pick(rng), h.centered = pick_flag(rng), h.lr_decay = pick(rng);
    h.initial_accumulator_value = pick(rng);
    bool host = true;
    try {
      check_hparams(h, a);
    } catch (const Error&) {
      host = false;
    }
    const int moments = moments_in_use(describe(a), h);
    const bool device = hparams_valid(h, engine_algo(a), moments);
    if (host != device)
      fail_msg("algorithm %d lr %g b1 %g b2 %g eps %g wd %g mom %g damp %g nesterov %d bc %d: host %d, device %d",
               int(a), double(h.lr), double(h.beta1), double(h.beta2), double(h.eps), double(h.weight_decay),
               double(h.momentum), double(h.dampening), h.nesterov, h.bias_correction, host, device);
    (host ? valid : invalid) += 1;
    // a plan's moment count that the momentum does not give is invalid on the device
    if (a == LOWBIT_ALGORITHM_SGD && device) assert_false(hparams_valid(h, Algo::Sgd, 1 - moments));
    if (a == LOWBIT_ALGORITHM_RMSPROP && device) assert_false(hparams_valid(h, Algo::RmsProp, 3 - moments));
  }
  std::printf("  %d valid, %d invalid combinations: the same verdict\n", valid, invalid);
  assert_true(valid > 1000 && invalid > 1000);
}

}  // namespace

int main(void) {
  rng.seed(lowbit_test_seed("test_hparams_valid"));
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_same_verdict)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
