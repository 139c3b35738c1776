/* Muon's refused calls and edge cases (issue 45), on the CPU engine:
 * - an SGD group of a Muon optimizer registered without momentum refuses a
 *   momentum later, as a plain SGD optimizer does (its params have no
 *   momentum buffer); its params then step as a plain SGD optimizer's, bit
 *   for bit (CTest c.muon_edges_memcheck runs this one under valgrind: no
 *   uninitialised read; item 3).
 * Seed: LOWBIT_TEST_SEED. Argument: a cmocka test-name filter. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lowbit.h"
#include "../common/test_seed.h"

static uint64_t rng_state;
static float randn(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  const double u = (double)(rng_state >> 11) / 9007199254740992.0 + 1e-300;
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  const double v = (double)(rng_state >> 11) / 9007199254740992.0;
  return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}
static void fill(float* x, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) x[i] = scale * randn();
}

#define OK(opt, call)                                                                                  \
  do {                                                                                                 \
    lowbit_status_t st_ = (call);                                                                      \
    if (st_ != LOWBIT_SUCCESS)                                                                         \
      fail_msg("%s: %s (%s)", #call, lowbit_status_string(st_), (opt) ? lowbit_optimizer_last_error(opt) \
                                                                       : lowbit_last_error());       \
  } while (0)

static lowbit_tensor_t host_tensor(void* data, int64_t n) {
  lowbit_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.numel = n;
  t.dtype = LOWBIT_DTYPE_FLOAT32;
  t.device = LOWBIT_DEVICE_CPU;
  return t;
}

static lowbit_optimizer_config_t muon_config(lowbit_state_format_t fmt) {
  lowbit_optimizer_config_t c;
  lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_MUON);
  c.state_format = fmt;
  c.min_quantized_numel = 0;
  c.seed = 11;
  c.num_threads = 1;
  return c;
}

static int64_t add(lowbit_optimizer_t opt, float* p, float* g, int ndim, int64_t rows, int64_t cols, int32_t group) {
  lowbit_param_config_t pc;
  lowbit_param_config_init(&pc);
  const int64_t n = ndim == 2 ? rows * cols : rows;
  pc.param = host_tensor(p, n);
  if (g) pc.grad = host_tensor(g, n);
  pc.group = group;
  pc.ndim = ndim;
  pc.shape[0] = rows;
  pc.shape[1] = cols;
  int64_t id = -1;
  OK(opt, lowbit_optimizer_add_param(opt, &pc, &id));
  return id;
}

/* ---- item 3: an SGD group without momentum refuses one later */

static void test_sgd_group_refuses_momentum(void** state) {
  (void)state;
  lowbit_optimizer_config_t c = muon_config(LOWBIT_STATE_FP32);
  lowbit_hparams_t hm, hs;
  lowbit_hparams_init(&hm, LOWBIT_ALGORITHM_MUON);
  hm.ns_precision = LOWBIT_NS_PRECISION_FP32;
  lowbit_hparams_init(&hs, LOWBIT_ALGORITHM_SGD);
  hs.algorithm = LOWBIT_ALGORITHM_SGD;
  hs.lr = 0.05f;
  hs.momentum = 0.f;
  lowbit_optimizer_t muon = NULL, sgd = NULL;
  OK(NULL, lowbit_optimizer_create(&muon, &c, &hm));
  int32_t group = -1;
  OK(muon, lowbit_optimizer_add_group(muon, &hs, &group));
  lowbit_optimizer_config_t cs;
  lowbit_optimizer_config_init(&cs, LOWBIT_ALGORITHM_SGD);
  cs.seed = 11;
  cs.num_threads = 1;
  OK(NULL, lowbit_optimizer_create(&sgd, &cs, &hs));

  float w[16 * 8], gw[16 * 8], b[20], gb[20], b2[20], gb2[20];
  fill(w, 128, 1.f), fill(b, 20, 1.f);
  memcpy(b2, b, sizeof b);
  add(muon, w, gw, 2, 16, 8, 0);
  add(muon, b, gb, 1, 20, 0, group);
  add(sgd, b2, gb2, 1, 20, 0, 0);

  /* The same refusal in both: the group's params have no momentum buffer. */
  lowbit_hparams_t with = hs;
  with.momentum = 0.9f;
  assert_int_equal(lowbit_optimizer_set_hparams(muon, group, &with), LOWBIT_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(lowbit_optimizer_last_error(muon), "registered without momentum"));
  assert_int_equal(lowbit_optimizer_set_hparams(sgd, 0, &with), LOWBIT_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(lowbit_optimizer_last_error(sgd), "registered without momentum"));
  lowbit_hparams_t now;
  now.struct_size = sizeof now;
  OK(muon, lowbit_optimizer_get_hparams(muon, group, &now));
  assert_true(now.momentum == 0.f);
  /* Other changes to the group still go through. */
  lowbit_hparams_t lr = hs;
  lr.lr = 0.03f;
  OK(muon, lowbit_optimizer_set_hparams(muon, group, &lr));
  OK(sgd, lowbit_optimizer_set_hparams(sgd, 0, &lr));

  for (int t = 0; t < 4; ++t) {
    fill(gw, 128, 1.f), fill(gb, 20, 1.f);
    memcpy(gb2, gb, sizeof gb);
    OK(muon, lowbit_optimizer_step(muon, NULL));
    OK(sgd, lowbit_optimizer_step(sgd, NULL));
  }
  assert_memory_equal(b, b2, sizeof b);
  for (int i = 0; i < 20; ++i) assert_true(isfinite(b[i]));
  lowbit_optimizer_destroy(muon);
  lowbit_optimizer_destroy(sgd);
}

int main(int argc, char** argv) {
  rng_state = lowbit_test_seed("test_muon_edges") | 1;
  unsetenv("LOWBIT_TEST_MATMUL_FAIL_AFTER");
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd_group_refuses_momentum),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
