/* Issue 46: the algorithm descriptors through the C API, and the algorithms
 * added through them (RMSprop, Adagrad).
 *
 * - The descriptors: every algorithm is listed; every hyper-parameter's
 *   default is what lowbit_hparams_init writes; every bound is the check's
 *   (just inside passes lowbit_hparams_check, just outside fails naming the
 *   field); moment kinds are what lowbit_plan_param_state reports.
 * - RMSprop (plain, with momentum, centred) and Adagrad (lr_decay, an initial
 *   accumulator) against the float64 reference of refmath.h through the
 *   harness (lockstep: codes exact but for ties), in fp32, bf16, 8-bit,
 *   4-bit and FP8 state, with fp32 and bf16 params: their only moment or
 *   their first one is a second moment (unsigned map and floor).
 * - Bad input: centred with momentum (three moments), a factored moment,
 *   momentum or centring a group was not registered with, a checkpoint of
 *   another algorithm; a clear error, nothing changed.
 * Seed: LOWBIT_TEST_SEED. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

#define EXPECT_STATUS(call, want, needle)                                                                    \
  do {                                                                                                       \
    lowbit_status_t st_ = (call);                                                                            \
    if (st_ != (want)) fail_msg("%s -> %d, expected %d: %s", #call, (int)st_, (int)(want), lowbit_last_error()); \
    if ((needle) && !strstr(lowbit_last_error(), (needle)))                                                  \
      fail_msg("%s: message \"%s\" does not name \"%s\"", #call, lowbit_last_error(), (const char*)(needle));  \
  } while (0)

/* ---------------------------------------------------------------- descriptors */

static double read_field(const lowbit_hparams_t* h, const lowbit_hparam_info_t* i, int k) {
  const char* base = (const char*)h + i->offset;
  if (i->type == LOWBIT_HPARAM_REAL) {
    float f;
    memcpy(&f, base + 4 * k, 4);
    return f;
  }
  int32_t v;
  memcpy(&v, base, 4);
  return v;
}

static void write_field(lowbit_hparams_t* h, const lowbit_hparam_info_t* i, int k, double x) {
  char* base = (char*)h + i->offset;
  if (i->type == LOWBIT_HPARAM_REAL) {
    float f = (float)x;
    memcpy(base + 4 * k, &f, 4);
  } else {
    int32_t v = (int32_t)x;
    memcpy(base, &v, 4);
  }
}

static void test_descriptors(void** state) {
  (void)state;
  int32_t count = -1;
  assert_int_equal(lowbit_algorithms(NULL, 0, &count), LOWBIT_SUCCESS);
  assert_true(count >= 10);
  lowbit_algorithm_t all[64];
  assert_int_equal(lowbit_algorithms(all, 64, &count), LOWBIT_SUCCESS);
  EXPECT_STATUS(lowbit_algorithms(NULL, 3, &count), LOWBIT_ERROR_NULL_POINTER, "out");
  int saw_rmsprop = 0, saw_adagrad = 0;
  for (int a = 0; a < count; ++a) {
    lowbit_algorithm_info_t info;
    assert_int_equal(lowbit_algorithm_info_init(&info), LOWBIT_SUCCESS);
    assert_int_equal(lowbit_algorithm_info(all[a], &info), LOWBIT_SUCCESS);
    assert_int_equal(info.algorithm, all[a]);
    assert_true(strlen(info.name) > 0 && strlen(info.title) > 0);
    assert_true(info.max_moments >= 0 && info.max_moments <= 2);
    saw_rmsprop |= strcmp(info.name, "rmsprop") == 0;
    saw_adagrad |= strcmp(info.name, "adagrad") == 0;
    for (int k = 0; k < info.max_moments; ++k)
      assert_true(info.moment_kinds[k] == LOWBIT_MOMENT_SIGNED || info.moment_kinds[k] == LOWBIT_MOMENT_UNSIGNED);
    lowbit_hparams_t dflt;
    assert_int_equal(lowbit_hparams_init(&dflt, all[a]), LOWBIT_SUCCESS);
    assert_int_equal(lowbit_hparams_check(&dflt, all[a]), LOWBIT_SUCCESS);
    /* the bounds below are probed from a base where the conditions over several fields hold for every value
     * of one field (SGD's nesterov = 1 needs momentum) */
    lowbit_hparams_t base = dflt;
    if (all[a] == LOWBIT_ALGORITHM_SGD) base.momentum = 0.5f;
    for (int32_t j = 0; j < info.num_hparams; ++j) {
      lowbit_hparam_info_t hi;
      assert_int_equal(lowbit_hparam_info_init(&hi), LOWBIT_SUCCESS);
      assert_int_equal(lowbit_hparam_info(all[a], j, &hi), LOWBIT_SUCCESS);
      assert_true(hi.offset + 4u * (unsigned)hi.count <= sizeof(lowbit_hparams_t));
      assert_true(hi.since >= 200 && hi.since <= LOWBIT_VERSION);
      for (int k = 0; k < hi.count; ++k)
        if (read_field(&dflt, &hi, k) != (double)(float)hi.default_value[k])
          fail_msg("%s.%s[%d]: lowbit_hparams_init gives %g, the descriptor %g", info.name, hi.name, k,
                   read_field(&dflt, &hi, k), hi.default_value[k]);
      /* the bounds are the check's: just inside passes, just outside fails naming the field */
      for (int side = 0; side < 2; ++side) {
        const double edge = side ? hi.upper : hi.lower;
        const int incl = side ? hi.upper_inclusive : hi.lower_inclusive;
        if (hi.type == LOWBIT_HPARAM_REAL && fabs(edge) >= 3.0e38) continue; /* finite: tested below */
        const double step = hi.type == LOWBIT_HPARAM_REAL ? fmax(fabs(edge) * 1e-6, 1e-30) : 1.0;
        const double inside = incl ? edge : (side ? edge - step : edge + step);
        const double outside = incl ? (side ? edge + step : edge - step) : edge;
        lowbit_hparams_t h = base;
        write_field(&h, &hi, 0, inside);
        if (lowbit_hparams_check(&h, all[a]) != LOWBIT_SUCCESS)
          fail_msg("%s.%s = %g (inside its bounds) refused: %s", info.name, hi.name, inside, lowbit_last_error());
        h = base;
        write_field(&h, &hi, 0, outside);
        EXPECT_STATUS(lowbit_hparams_check(&h, all[a]), LOWBIT_ERROR_INVALID_ARGUMENT, hi.name);
      }
      if (hi.type == LOWBIT_HPARAM_REAL) {
        lowbit_hparams_t h = dflt;
        write_field(&h, &hi, 0, NAN);
        EXPECT_STATUS(lowbit_hparams_check(&h, all[a]), LOWBIT_ERROR_INVALID_ARGUMENT, hi.name);
        write_field(&h, &hi, 0, INFINITY);
        EXPECT_STATUS(lowbit_hparams_check(&h, all[a]), LOWBIT_ERROR_INVALID_ARGUMENT, hi.name);
      }
    }
    lowbit_hparam_info_t hi;
    hi.struct_size = sizeof hi;
    EXPECT_STATUS(lowbit_hparam_info(all[a], info.num_hparams, &hi), LOWBIT_ERROR_INVALID_ARGUMENT, "index");
  }
  assert_true(saw_rmsprop && saw_adagrad);
  lowbit_algorithm_info_t info;
  info.struct_size = sizeof info;
  EXPECT_STATUS(lowbit_algorithm_info((lowbit_algorithm_t)99, &info), LOWBIT_ERROR_INVALID_ARGUMENT, "algorithm");
  EXPECT_STATUS(lowbit_algorithm_info(LOWBIT_ALGORITHM_ADAMW, NULL), LOWBIT_ERROR_NULL_POINTER, "out");
}

/* The kinds a plan reports, and the maps they pick: RMSprop's and Adagrad's
 * first moment is a second moment. */
static void test_plan_kinds(void** state) {
  (void)state;
  struct {
    lowbit_algorithm_t algo;
    float momentum;
    int centered;
    int nm;
    lowbit_moment_kind_t k0, k1;
  } cases[] = {
      {LOWBIT_ALGORITHM_ADAMW, 0.f, 0, 2, LOWBIT_MOMENT_SIGNED, LOWBIT_MOMENT_UNSIGNED},
      {LOWBIT_ALGORITHM_LION, 0.f, 0, 1, LOWBIT_MOMENT_SIGNED, 0},
      {LOWBIT_ALGORITHM_SGD, 0.f, 0, 0, 0, 0},
      {LOWBIT_ALGORITHM_RMSPROP, 0.f, 0, 1, LOWBIT_MOMENT_UNSIGNED, 0},
      {LOWBIT_ALGORITHM_RMSPROP, 0.9f, 0, 2, LOWBIT_MOMENT_UNSIGNED, LOWBIT_MOMENT_SIGNED},
      {LOWBIT_ALGORITHM_RMSPROP, 0.f, 1, 2, LOWBIT_MOMENT_UNSIGNED, LOWBIT_MOMENT_SIGNED},
      {LOWBIT_ALGORITHM_ADAGRAD, 0.f, 0, 1, LOWBIT_MOMENT_UNSIGNED, 0},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
    lowbit_optimizer_config_t oc;
    assert_int_equal(lowbit_optimizer_config_init(&oc, cases[c].algo), LOWBIT_SUCCESS);
    oc.state_format = LOWBIT_STATE_8BIT;
    lowbit_hparams_t h;
    assert_int_equal(lowbit_hparams_init(&h, cases[c].algo), LOWBIT_SUCCESS);
    h.momentum = cases[c].momentum;
    h.centered = cases[c].centered;
    lowbit_param_config_t pc;
    assert_int_equal(lowbit_param_config_init(&pc), LOWBIT_SUCCESS);
    pc.param.numel = 8192;
    pc.param.dtype = LOWBIT_DTYPE_FLOAT32;
    lowbit_state_plan_t plan;
    assert_int_equal(lowbit_state_plan_init(&plan), LOWBIT_SUCCESS);
    assert_int_equal(lowbit_plan_param_state(&oc, &h, &pc, &plan), LOWBIT_SUCCESS);
    assert_int_equal(plan.num_moments, cases[c].nm);
    assert_int_equal(plan.kind[0], cases[c].k0);
    assert_int_equal(plan.kind[1], cases[c].k1);
  }
}

/* ---------------------------------------------------------------- against float64 */

typedef struct {
  const char* name;
  lowbit_algorithm_t algo;
  float momentum;
  int centered;
} acase_t;

static const acase_t kCases[] = {
    {"rmsprop", LOWBIT_ALGORITHM_RMSPROP, 0.f, 0},
    {"rmsprop_momentum", LOWBIT_ALGORITHM_RMSPROP, 0.9f, 0},
    {"rmsprop_centered", LOWBIT_ALGORITHM_RMSPROP, 0.f, 1},
    {"adagrad", LOWBIT_ALGORITHM_ADAGRAD, 0.f, 0},
};

static const struct {
  const char* name;
  lowbit_state_format_t fmt;
} kStateFormats[] = {
    {"fp32", LOWBIT_STATE_FP32}, {"bf16", LOWBIT_STATE_BF16}, {"8bit", LOWBIT_STATE_8BIT},
    {"4bit", LOWBIT_STATE_4BIT}, {"fp8", LOWBIT_STATE_FP8}, {"4bit-dyn", LOWBIT_STATE_4BIT_DYN},
};

static void test_against_float64(void** state) {
  (void)state;
  rng_t r = test_rng("against_float64");
  for (size_t c = 0; c < sizeof kCases / sizeof kCases[0]; ++c) {
    for (size_t f = 0; f < sizeof kStateFormats / sizeof kStateFormats[0]; ++f) {
      /* blocks of both formats, a partial last block, a bf16 param with SR,
       * a small param under the threshold (fp32 state) */
      const pspec_t params[4] = {
          {5000, LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_FLOAT32, 0, LOWBIT_STATE_DEFAULT, LOWBIT_STATE_DEFAULT, 1, 1, 0},
          {4099, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_BFLOAT16, 0, LOWBIT_STATE_DEFAULT, LOWBIT_STATE_DEFAULT, 1, 1,
           0},
          {4096, LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_BFLOAT16, 0, LOWBIT_STATE_DEFAULT, LOWBIT_STATE_DEFAULT, 0.1, 3,
           1},
          {300, LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_FLOAT32, 0, LOWBIT_STATE_DEFAULT, LOWBIT_STATE_DEFAULT, 1, 1, 0},
      };
      char name[96];
      snprintf(name, sizeof name, "%s/%s", kCases[c].name, kStateFormats[f].name);
      hcfg_t cfg;
      memset(&cfg, 0, sizeof cfg);
      cfg.name = name;
      cfg.algo = kCases[c].algo;
      cfg.fmt = kStateFormats[f].fmt;
      cfg.fmt2 = LOWBIT_STATE_DEFAULT;
      cfg.min_quantized_numel = -1;
      cfg.ngroups = 1;
      random_hparams(cfg.algo, &r, &cfg.groups[0]);
      cfg.groups[0].momentum = kCases[c].momentum;
      cfg.groups[0].centered = kCases[c].centered;
      cfg.nparams = 4;
      cfg.params = params;
      cfg.steps = 12;
      cfg.schedule = 1;
      cfg.grad_mode = 2;
      cfg.skip_params = 1;
      cfg.state_drift = kStateFormats[f].fmt == LOWBIT_STATE_FP32 ? 0.0 : 1.0;
      cfg.verbose = 1;
      hres_t res;
      harness_run(&cfg, rng_next(&r), &res);
      if (kStateFormats[f].fmt == LOWBIT_STATE_FP32) assert_int_equal(res.free_violations, 0);
    }
  }
}

/* ---------------------------------------------------------------- bad input */

static lowbit_optimizer_t make_opt(lowbit_algorithm_t algo, const lowbit_hparams_t* h, float* p, float* g,
                                   int64_t n) {
  lowbit_optimizer_config_t oc;
  assert_int_equal(lowbit_optimizer_config_init(&oc, algo), LOWBIT_SUCCESS);
  oc.state_format = LOWBIT_STATE_8BIT;
  lowbit_optimizer_t opt = NULL;
  CHECK_OK(NULL, lowbit_optimizer_create(&opt, &oc, h));
  lowbit_param_config_t pc;
  CHECK_OK(opt, lowbit_param_config_init(&pc));
  pc.param = make_tensor(p, n, LOWBIT_DTYPE_FLOAT32);
  pc.grad = make_tensor(g, n, LOWBIT_DTYPE_FLOAT32);
  pc.ndim = 2;
  pc.shape[0] = 64;
  pc.shape[1] = n / 64;
  int64_t id = -1;
  CHECK_OK(opt, lowbit_optimizer_add_param(opt, &pc, &id));
  return opt;
}

static void test_bad_input(void** state) {
  (void)state;
  enum { N = 64 * 80 };
  float* p = calloc(N, sizeof(float));
  float* g = calloc(N, sizeof(float));
  for (int i = 0; i < N; ++i) p[i] = 0.01f * (float)(i % 97), g[i] = 0.001f * (float)(i % 13) - 0.006f;

  lowbit_hparams_t h;
  assert_int_equal(lowbit_hparams_init(&h, LOWBIT_ALGORITHM_RMSPROP), LOWBIT_SUCCESS);
  h.centered = 1;
  h.momentum = 0.9f;
  EXPECT_STATUS(lowbit_hparams_check(&h, LOWBIT_ALGORITHM_RMSPROP), LOWBIT_ERROR_UNSUPPORTED, "three moments");
  lowbit_optimizer_config_t oc;
  assert_int_equal(lowbit_optimizer_config_init(&oc, LOWBIT_ALGORITHM_RMSPROP), LOWBIT_SUCCESS);
  lowbit_optimizer_t bad = NULL;
  EXPECT_STATUS(lowbit_optimizer_create(&bad, &oc, &h), LOWBIT_ERROR_UNSUPPORTED, "centered");
  assert_null(bad);
  oc.second_normalization = LOWBIT_NORMALIZATION_FACTORED;
  h.centered = 0;
  EXPECT_STATUS(lowbit_optimizer_create(&bad, &oc, &h), LOWBIT_ERROR_INVALID_ARGUMENT, "factored");

  /* a group registered without momentum cannot take it; one with it cannot switch to centring */
  assert_int_equal(lowbit_hparams_init(&h, LOWBIT_ALGORITHM_RMSPROP), LOWBIT_SUCCESS);
  lowbit_optimizer_t opt = make_opt(LOWBIT_ALGORITHM_RMSPROP, &h, p, g, N);
  CHECK_OK(opt, lowbit_optimizer_step(opt, NULL));
  float before[N];
  memcpy(before, p, sizeof before);
  lowbit_hparams_t h2 = h;
  h2.momentum = 0.5f;
  EXPECT_STATUS(lowbit_optimizer_set_hparams(opt, 0, &h2), LOWBIT_ERROR_INVALID_ARGUMENT, "momentum");
  lowbit_hparams_t back;
  back.struct_size = sizeof back;
  CHECK_OK(opt, lowbit_optimizer_get_hparams(opt, 0, &back));
  assert_true(hparams_equal(&back, &h));
  /* a checkpoint of another algorithm */
  int64_t size = 0;
  CHECK_OK(opt, lowbit_optimizer_save(opt, LOWBIT_CHECKPOINT_COMPRESSED, NULL, 0, &size, NULL));
  uint8_t* buf = malloc((size_t)size);
  int64_t written = 0;
  CHECK_OK(opt, lowbit_optimizer_save(opt, LOWBIT_CHECKPOINT_COMPRESSED, buf, size, &written, NULL));
  lowbit_hparams_t ha;
  assert_int_equal(lowbit_hparams_init(&ha, LOWBIT_ALGORITHM_ADAGRAD), LOWBIT_SUCCESS);
  lowbit_optimizer_t other = make_opt(LOWBIT_ALGORITHM_ADAGRAD, &ha, p, g, N);
  EXPECT_STATUS(lowbit_optimizer_load(other, buf, written, NULL), LOWBIT_ERROR_STATE_MISMATCH, "algorithm");
  /* and its own loads back, the 0.8 fields included */
  lowbit_hparams_t hm = h;
  hm.alpha = 0.95f;
  CHECK_OK(opt, lowbit_optimizer_set_hparams(opt, 0, &hm));
  CHECK_OK(opt, lowbit_optimizer_save(opt, LOWBIT_CHECKPOINT_COMPRESSED, buf, size, &written, NULL));
  CHECK_OK(opt, lowbit_optimizer_set_hparams(opt, 0, &h));
  CHECK_OK(opt, lowbit_optimizer_load(opt, buf, written, NULL));
  CHECK_OK(opt, lowbit_optimizer_get_hparams(opt, 0, &back));
  assert_true(back.alpha == 0.95f);
  assert_memory_equal(p, before, sizeof before);
  free(buf);
  CHECK_OK(other, lowbit_optimizer_destroy(other));
  CHECK_OK(opt, lowbit_optimizer_destroy(opt));
  free(p);
  free(g);
}

int main(void) {
  test_seed_init("test_algorithms");
  qmaps_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_descriptors),
      cmocka_unit_test(test_plan_kinds),
      cmocka_unit_test(test_against_float64),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
