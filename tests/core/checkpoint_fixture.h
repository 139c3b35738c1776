/* The fixture of the checkpoint suites (test_checkpoint.c,
 * test_checkpoint_files.c): an optimizer over NP params of kSizes elements,
 * its steps on generated grads, and saving. */
#ifndef LOWBIT_TESTS_CHECKPOINT_FIXTURE_H
#define LOWBIT_TESTS_CHECKPOINT_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "lowbit.h"

#define NP 3
static const int64_t kSizes[NP] = {5000, 257, 9001}; /* 257 stays fp32 under the threshold */
static unsigned g_seed;

static float frand(unsigned* s) {
  *s = *s * 1664525u + 1013904223u;
  return ((*s >> 8) / 16777216.0f) * 2.f - 1.f;
}

typedef struct {
  lowbit_optimizer_t opt;
  lowbit_dtype_t dtype;
  void* params[NP];
  void* grads[NP];
} Fixture;

static size_t esize(lowbit_dtype_t d) { return d == LOWBIT_DTYPE_FLOAT32 ? 4 : 2; }

static void make(Fixture* f, lowbit_algorithm_t algo, lowbit_state_format_t fmt, lowbit_dtype_t dtype, int sr,
                 int ecc) {
  lowbit_optimizer_config_t c;
  lowbit_hparams_t h;
  assert_int_equal(lowbit_optimizer_config_init(&c, algo), LOWBIT_SUCCESS);
  assert_int_equal(lowbit_hparams_init(&h, algo), LOWBIT_SUCCESS);
  c.state_format = fmt;
  c.seed = 1234;
  c.stochastic_rounding = sr;
  c.error_correction = ecc;
  if (algo == LOWBIT_ALGORITHM_SGD) h.momentum = 0.9f;
  h.lr = 1e-2f;
  assert_int_equal(lowbit_optimizer_create(&f->opt, &c, &h), LOWBIT_SUCCESS);
  f->dtype = dtype;
  unsigned s = g_seed;
  for (int i = 0; i < NP; ++i) {
    f->params[i] = malloc(kSizes[i] * esize(dtype));
    f->grads[i] = malloc(kSizes[i] * 4);
    for (int64_t k = 0; k < kSizes[i]; ++k) {
      float v = frand(&s);
      if (dtype == LOWBIT_DTYPE_FLOAT32) ((float*)f->params[i])[k] = v;
      else ((uint16_t*)f->params[i])[k] = (uint16_t)(dtype == LOWBIT_DTYPE_BFLOAT16 ? 0x3F00 : 0x3800) + (k % 64);
    }
    lowbit_param_config_t pc;
    lowbit_param_config_init(&pc);
    pc.param = (lowbit_tensor_t){f->params[i], kSizes[i], dtype, LOWBIT_DEVICE_CPU, 0};
    pc.grad = (lowbit_tensor_t){f->grads[i], kSizes[i], LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
    int64_t id;
    assert_int_equal(lowbit_optimizer_add_param(f->opt, &pc, &id), LOWBIT_SUCCESS);
    assert_int_equal(id, i);
  }
}

static void copy_params(Fixture* dst, const Fixture* src) {
  for (int i = 0; i < NP; ++i) memcpy(dst->params[i], src->params[i], kSizes[i] * esize(src->dtype));
}

static void run_steps(Fixture* f, int first, int count) {
  for (int t = first; t < first + count; ++t) {
    for (int i = 0; i < NP; ++i) {
      unsigned s = g_seed * 31u + (unsigned)(t * 977 + i);
      for (int64_t k = 0; k < kSizes[i]; ++k) ((float*)f->grads[i])[k] = frand(&s) * (k % 7 == 0 ? 0.f : 1.f);
    }
    assert_int_equal(lowbit_optimizer_step(f->opt, NULL), LOWBIT_SUCCESS);
  }
}

static void destroy(Fixture* f) {
  lowbit_optimizer_destroy(f->opt);
  for (int i = 0; i < NP; ++i) free(f->params[i]), free(f->grads[i]);
}

static uint8_t* save(lowbit_optimizer_t opt, lowbit_checkpoint_mode_t mode, int64_t* size) {
  assert_int_equal(lowbit_optimizer_save(opt, mode, NULL, 0, size, NULL), LOWBIT_SUCCESS);
  uint8_t* buf = malloc((size_t)*size);
  int64_t written;
  assert_int_equal(lowbit_optimizer_save(opt, mode, buf, *size, &written, NULL), LOWBIT_SUCCESS);
  assert_int_equal(written, *size);
  return buf;
}

static void assert_same_params(const Fixture* a, const Fixture* b) {
  for (int i = 0; i < NP; ++i) assert_memory_equal(a->params[i], b->params[i], kSizes[i] * esize(a->dtype));
}
/* The state as a compressed checkpoint (compared before and after a refused load). */
static uint8_t* snapshot(lowbit_optimizer_t opt, int64_t* size) { return save(opt, LOWBIT_CHECKPOINT_COMPRESSED, size); }

#endif
