/* The algorithms and quantized formats the quantized-state suites sweep
 * (test_quantized.c, test_quantized_state.c), and their shared checks. */
#ifndef LOWBIT_TESTS_QUANTIZED_CASES_H
#define LOWBIT_TESTS_QUANTIZED_CASES_H

#include "harness.h"

typedef struct {
  const char* name;
  lowbit_algorithm_t algo;
  int nesterov;
} qalgo_t;

static const qalgo_t kAlgos[] = {
    {"adamw", LOWBIT_ALGORITHM_ADAMW, 0},
    {"adam", LOWBIT_ALGORITHM_ADAM, 0},
    {"lion", LOWBIT_ALGORITHM_LION, 0},
    {"sgd_momentum", LOWBIT_ALGORITHM_SGD, 0},
    {"sgd_nesterov", LOWBIT_ALGORITHM_SGD, 1},
};
#define NUM_QALGOS 5

typedef struct {
  const char* name;
  lowbit_state_format_t m, v;
} qformat_t;
static const qformat_t kFormats[] = {
    {"8bit", LOWBIT_STATE_8BIT, LOWBIT_STATE_DEFAULT},
    {"4bit", LOWBIT_STATE_4BIT, LOWBIT_STATE_DEFAULT},
    {"fp8", LOWBIT_STATE_FP8, LOWBIT_STATE_DEFAULT},
    {"8bit-m/4bit-v", LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT},
    {"4bit-dyn", LOWBIT_STATE_4BIT_DYN, LOWBIT_STATE_DEFAULT},
};
#define NUM_QFORMATS 5

static void qalgo_hparams(const qalgo_t* a, rng_t* r, lowbit_hparams_t* h) {
  random_hparams(a->algo, r, h);
  if (a->algo == LOWBIT_ALGORITHM_SGD) {
    h->nesterov = a->nesterov;
    if (a->nesterov) h->dampening = 0.f;
  }
}

static int is_4bit(lowbit_state_format_t f) { return f == LOWBIT_STATE_4BIT || f == LOWBIT_STATE_4BIT_DYN; }
static int has_4bit(const hcfg_t* cfg) { return is_4bit(cfg->fmt) || is_4bit(cfg->fmt2); }

static void check_free_quantized(const hcfg_t* cfg, const hres_t* res) {
  double drift_limit = 1e-2;
  int64_t beyond = res->free_beyond + res->free_beyond16;
  if ((double)beyond > 0.02 * (double)res->elements + 2 * 256)
    fail_msg("%s: %lld of %lld elements differ from the free-running reference", cfg->name, (long long)beyond,
             (long long)res->elements);
  int64_t allowed = cfg->algo == LOWBIT_ALGORITHM_LION ? 2 + res->elements / 200 : 0;
  if (res->free_violations > allowed)
    fail_msg("%s: %lld elements beyond the per-element bound", cfg->name, (long long)res->free_violations);
  if (res->free_mean_rel > drift_limit)
    fail_msg("%s: free-running drift %.3g of the distance travelled (limit %.3g)", cfg->name, res->free_mean_rel,
             drift_limit);
}

#endif
