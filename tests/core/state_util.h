/* Helpers of the state suites (test_round_trip.c, test_limits.c): a seeded
 * generator, an optimizer with shaped fp32 params, checkpoints in memory, the
 * step counts, and status checks that print the library's message. */
#ifndef LOWBIT_TEST_STATE_UTIL_H
#define LOWBIT_TEST_STATE_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowbit.h"
#include "../common/test_seed.h"

/* The suite's seed (LOWBIT_TEST_SEED), and LOWBIT_TEST_FILTER as cmocka's test filter. */
static uint64_t su_init(const char* suite) {
  if (getenv("LOWBIT_TEST_FILTER")) cmocka_set_test_filter(getenv("LOWBIT_TEST_FILTER"));
  return lowbit_test_seed(suite);
}

static uint64_t su_next(uint64_t* s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/* uniform in [-1, 1) */
static float su_uniform(uint64_t* s) { return (float)((double)(su_next(s) >> 11) * 0x1p-52 - 1.0); }

#define SU_MAX_PARAMS 4

typedef struct {
  lowbit_optimizer_t opt;
  int n;
  int64_t numel[SU_MAX_PARAMS];
  float* p[SU_MAX_PARAMS];
  float* g[SU_MAX_PARAMS];
} su_fixture_t;

typedef struct {
  int ndim;
  int64_t dim[3];
} su_shape_t;

#define SU_CHECK(opt, call)                                                                                       \
  do {                                                                                                            \
    lowbit_status_t st_ = (call);                                                                                 \
    if (st_ != LOWBIT_SUCCESS)                                                                                    \
      fail_msg("%s:%d: %s -> %d: %s", __FILE__, __LINE__, #call, (int)st_,                                        \
               (opt) ? lowbit_optimizer_last_error(opt) : lowbit_last_error());                                   \
  } while (0)

/* An optimizer (every param quantized whatever its size) with one fp32 param
 * per shape, params uniform in [-1, 1). */
static void su_make(su_fixture_t* f, lowbit_algorithm_t algo, lowbit_state_format_t fm, lowbit_state_format_t fv,
                    lowbit_normalization_t nm, lowbit_normalization_t nv, const su_shape_t* shapes, int n,
                    uint64_t seed) {
  lowbit_optimizer_config_t c;
  lowbit_hparams_t h;
  SU_CHECK(NULL, lowbit_optimizer_config_init(&c, algo));
  SU_CHECK(NULL, lowbit_hparams_init(&h, algo));
  c.state_format = fm;
  c.second_state_format = fv;
  c.first_normalization = nm;
  c.second_normalization = nv;
  c.min_quantized_numel = 0;
  c.seed = seed;
  h.lr = 1e-2f;
  SU_CHECK(NULL, lowbit_optimizer_create(&f->opt, &c, &h));
  f->n = n;
  for (int i = 0; i < n; ++i) {
    int64_t numel = 1;
    for (int k = 0; k < shapes[i].ndim; ++k) numel *= shapes[i].dim[k];
    f->numel[i] = numel;
    f->p[i] = (float*)malloc((size_t)numel * 4);
    f->g[i] = (float*)calloc((size_t)numel, 4);
    for (int64_t e = 0; e < numel; ++e) f->p[i][e] = su_uniform(&seed);
    lowbit_param_config_t pc;
    SU_CHECK(NULL, lowbit_param_config_init(&pc));
    pc.param = (lowbit_tensor_t){f->p[i], numel, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
    pc.grad = (lowbit_tensor_t){f->g[i], numel, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
    pc.ndim = shapes[i].ndim;
    for (int k = 0; k < shapes[i].ndim; ++k) pc.shape[k] = shapes[i].dim[k];
    int64_t id = -1;
    SU_CHECK(f->opt, lowbit_optimizer_add_param(f->opt, &pc, &id));
    assert_int_equal(id, i);
  }
}

static void su_destroy(su_fixture_t* f) {
  lowbit_optimizer_destroy(f->opt);
  for (int i = 0; i < f->n; ++i) free(f->p[i]), free(f->g[i]);
  memset(f, 0, sizeof *f);
}

/* `steps` steps with grads scale * uniform, every 7th element 0. */
static void su_steps(su_fixture_t* f, int steps, float scale, uint64_t* rng) {
  for (int t = 0; t < steps; ++t) {
    for (int i = 0; i < f->n; ++i)
      for (int64_t e = 0; e < f->numel[i]; ++e) f->g[i][e] = e % 7 == 3 ? 0.f : scale * su_uniform(rng);
    SU_CHECK(f->opt, lowbit_optimizer_step(f->opt, NULL));
  }
}

static uint8_t* su_save(lowbit_optimizer_t opt, lowbit_checkpoint_mode_t mode, int64_t* size) {
  SU_CHECK(opt, lowbit_optimizer_save(opt, mode, NULL, 0, size, NULL));
  uint8_t* buf = (uint8_t*)malloc((size_t)*size);
  int64_t written = -1;
  SU_CHECK(opt, lowbit_optimizer_save(opt, mode, buf, *size, &written, NULL));
  assert_int_equal(written, *size);
  return buf;
}

static int64_t su_step_count(lowbit_optimizer_t opt, int64_t id) {
  lowbit_param_info_t info;
  info.struct_size = sizeof info;
  SU_CHECK(opt, lowbit_optimizer_param_info(opt, id, &info));
  return info.step;
}

/* `got` is `want` and the handle's message contains every needle (NULL ends). */
static void su_expect_error(lowbit_optimizer_t opt, lowbit_status_t got, lowbit_status_t want, ...) {
  const char* msg = lowbit_optimizer_last_error(opt);
  if (got != want) fail_msg("status %d, expected %d (message: %s)", (int)got, (int)want, msg);
  va_list ap;
  va_start(ap, want);
  for (const char* needle = va_arg(ap, const char*); needle; needle = va_arg(ap, const char*))
    if (!strstr(msg, needle)) fail_msg("the message \"%s\" does not name \"%s\"", msg, needle);
  va_end(ap);
}

#endif
