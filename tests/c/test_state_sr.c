/* The 4BIT_SR state format through the C API (issue 37): a step stores each
 * first-moment code as one of the two 4-bit map values around m / absmax
 * (the float64 value of m after one step from zero state), chosen by the seed
 * (the same seed gives the same codes, another seed others); the state is laid
 * out and reported as 4BIT's with format 4BIT_SR; a compressed checkpoint
 * resumes bit for bit; rank-1 normalisation is refused by name. The codes'
 * unbiasedness and the float64 reference of the code choice are
 * tests/core/test_stochastic_codes.cpp. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "qmaps_golden.h"

#define N 1000 /* 7 full blocks of 128 and a partial one */


static float golden(const uint32_t* map, int k) {
  float f;
  memcpy(&f, &map[k], 4);
  return f;
}

static lowbit_optimizer_t make(uint64_t seed, lowbit_state_format_t fmt, float* p, float* g) {
  lowbit_optimizer_config_t cfg;
  lowbit_optimizer_config_init(&cfg, LOWBIT_ALGORITHM_ADAMW);
  cfg.state_format = fmt;
  cfg.second_state_format = LOWBIT_STATE_4BIT;
  cfg.seed = seed;
  cfg.num_threads = 1;
  cfg.min_quantized_numel = 1; /* N is under the default threshold */
  lowbit_hparams_t hp;
  lowbit_hparams_init(&hp, LOWBIT_ALGORITHM_ADAMW);
  lowbit_optimizer_t opt = NULL;
  assert_int_equal(lowbit_optimizer_create(&opt, &cfg, &hp), LOWBIT_SUCCESS);
  lowbit_param_config_t pc;
  lowbit_param_config_init(&pc);
  pc.param.data = p;
  pc.param.numel = N;
  pc.param.dtype = LOWBIT_DTYPE_FLOAT32;
  pc.grad.data = g;
  pc.grad.numel = N;
  pc.grad.dtype = LOWBIT_DTYPE_FLOAT32;
  pc.param.device = pc.grad.device = LOWBIT_DEVICE_CPU;
  int64_t id = -1;
  const lowbit_status_t st = lowbit_optimizer_add_param(opt, &pc, &id);
  if (st != LOWBIT_SUCCESS) fail_msg("add_param: %s", lowbit_optimizer_last_error(opt));
  return opt;
}

static void fill(float* p, float* g, unsigned seed) {
  srand(seed);
  for (int i = 0; i < N; ++i) {
    p[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    /* magnitudes over 4 decades, so that codes land between every pair of map values */
    g[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * powf(10.f, -4.f * (float)rand() / (float)RAND_MAX);
  }
}

static void read_m(lowbit_optimizer_t opt, float* out) {
  assert_int_equal(lowbit_optimizer_read_moment(opt, 0, 0, out, N, NULL), LOWBIT_SUCCESS);
}

/* One step from zero state: m = (1 - beta1) g in float. Each decoded m is one
 * of the two map values around m / absmax, times absmax. */
static void test_codes_are_a_neighbour_of_m(void** state) {
  (void)state;
  static float p[N], g[N], m[N];
  fill(p, g, 11);
  lowbit_optimizer_t opt = make(5, LOWBIT_STATE_4BIT_SR, p, g);
  assert_int_equal(lowbit_optimizer_step(opt, NULL), LOWBIT_SUCCESS);
  read_m(opt, m);
  int up = 0, down = 0;
  for (int b = 0; b < N; b += 128) {
    const int end = b + 128 < N ? b + 128 : N;
    float absmax = 0.f;
    for (int i = b; i < end; ++i) absmax = fmaxf(absmax, fabsf((1.f - 0.9f) * g[i]));
    for (int i = b; i < end; ++i) {
      const double x = (double)((1.f - 0.9f) * g[i]) / absmax;
      int lo = 0;
      for (int k = 1; k < 16; ++k)
        if (golden(golden_signed_dynamic_4bit, k) <= x) lo = k;
      const double a = golden(golden_signed_dynamic_4bit, lo) * (double)absmax;
      const double c = golden(golden_signed_dynamic_4bit, lo < 15 ? lo + 1 : lo) * (double)absmax;
      if (fabs(m[i] - a) > 1e-6 * absmax && fabs(m[i] - c) > 1e-6 * absmax)
        fail_msg("element %d: m = %g decodes to %g, not %g or %g", i, 0.1 * g[i], (double)m[i], a, c);
      up += fabs(m[i] - c) <= 1e-6 * absmax && a != c;
      down += fabs(m[i] - a) <= 1e-6 * absmax;
    }
  }
  printf("  %d codes rounded up, %d down\n", up, down);
  assert_true(up > N / 10 && down > N / 10);
  lowbit_param_info_t info;
  lowbit_param_info_init(&info);
  assert_int_equal(lowbit_optimizer_param_info(opt, 0, &info), LOWBIT_SUCCESS);
  assert_int_equal(info.state_format, LOWBIT_STATE_4BIT_SR);
  assert_int_equal(info.second_state_format, LOWBIT_STATE_4BIT);
  lowbit_optimizer_t ref = make(5, LOWBIT_STATE_4BIT, p, g);
  lowbit_param_info_t rinfo;
  lowbit_param_info_init(&rinfo);
  assert_int_equal(lowbit_optimizer_param_info(ref, 0, &rinfo), LOWBIT_SUCCESS);
  assert_int_equal(info.state_bytes, rinfo.state_bytes);
  lowbit_optimizer_destroy(ref);
  lowbit_optimizer_destroy(opt);
}

/* The codes follow the seed: the same seed, the same bits; another, others. */
static void test_codes_follow_the_seed(void** state) {
  (void)state;
  static float p0[N], p1[N], p2[N], g[N], m0[N], m1[N], m2[N];
  fill(p0, g, 12);
  memcpy(p1, p0, sizeof p0);
  memcpy(p2, p0, sizeof p0);
  lowbit_optimizer_t a = make(9, LOWBIT_STATE_4BIT_SR, p0, g);
  lowbit_optimizer_t b = make(9, LOWBIT_STATE_4BIT_SR, p1, g);
  lowbit_optimizer_t c = make(10, LOWBIT_STATE_4BIT_SR, p2, g);
  for (int s = 0; s < 3; ++s) {
    assert_int_equal(lowbit_optimizer_step(a, NULL), LOWBIT_SUCCESS);
    assert_int_equal(lowbit_optimizer_step(b, NULL), LOWBIT_SUCCESS);
    assert_int_equal(lowbit_optimizer_step(c, NULL), LOWBIT_SUCCESS);
  }
  read_m(a, m0);
  read_m(b, m1);
  read_m(c, m2);
  assert_memory_equal(m0, m1, sizeof m0);
  assert_memory_equal(p0, p1, sizeof p0);
  int differ = 0;
  for (int i = 0; i < N; ++i) differ += m0[i] != m2[i];
  assert_true(differ > N / 10);
  lowbit_optimizer_destroy(a);
  lowbit_optimizer_destroy(b);
  lowbit_optimizer_destroy(c);
}

/* A compressed checkpoint after 3 steps, loaded into a fresh optimizer:
 * 2 more steps give the same params as 5 uninterrupted ones. */
static void test_checkpoint_resumes_bit_for_bit(void** state) {
  (void)state;
  static float p0[N], p1[N], g[N];
  fill(p0, g, 13);
  memcpy(p1, p0, sizeof p0);
  lowbit_optimizer_t a = make(3, LOWBIT_STATE_4BIT_SR, p0, g);
  for (int s = 0; s < 3; ++s) assert_int_equal(lowbit_optimizer_step(a, NULL), LOWBIT_SUCCESS);
  int64_t size = 0;
  assert_int_equal(lowbit_optimizer_save(a, LOWBIT_CHECKPOINT_COMPRESSED, NULL, 0, &size, NULL), LOWBIT_SUCCESS);
  void* buf = malloc((size_t)size);
  assert_int_equal(lowbit_optimizer_save(a, LOWBIT_CHECKPOINT_COMPRESSED, buf, size, &size, NULL), LOWBIT_SUCCESS);
  memcpy(p1, p0, sizeof p0);
  lowbit_optimizer_t b = make(3, LOWBIT_STATE_4BIT_SR, p1, g);
  assert_int_equal(lowbit_optimizer_load(b, buf, size, NULL), LOWBIT_SUCCESS);
  for (int s = 0; s < 2; ++s) {
    assert_int_equal(lowbit_optimizer_step(a, NULL), LOWBIT_SUCCESS);
    assert_int_equal(lowbit_optimizer_step(b, NULL), LOWBIT_SUCCESS);
  }
  assert_memory_equal(p0, p1, sizeof p0);
  free(buf);
  lowbit_optimizer_destroy(a);
  lowbit_optimizer_destroy(b);
}

static void test_rank1_is_refused(void** state) {
  (void)state;
  lowbit_optimizer_config_t cfg;
  lowbit_optimizer_config_init(&cfg, LOWBIT_ALGORITHM_ADAMW);
  cfg.state_format = LOWBIT_STATE_4BIT_SR;
  cfg.first_normalization = LOWBIT_NORMALIZATION_RANK1;
  lowbit_hparams_t hp;
  lowbit_hparams_init(&hp, LOWBIT_ALGORITHM_ADAMW);
  lowbit_optimizer_t opt = NULL;
  assert_int_equal(lowbit_optimizer_create(&opt, &cfg, &hp), LOWBIT_ERROR_UNSUPPORTED);
  assert_non_null(strstr(lowbit_optimizer_last_error(NULL), "4bit-sr"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_codes_are_a_neighbour_of_m),
      cmocka_unit_test(test_codes_follow_the_seed),
      cmocka_unit_test(test_checkpoint_resumes_bit_for_bit),
      cmocka_unit_test(test_rank1_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
