/* lowbit_optimizer_step_params (a step of some params only) against full
 * steps: stepping every param through subsets (random order and sizes,
 * registered or explicit gradients) gives the bits of full steps, params and
 * checkpoint bytes, for every algorithm x state format x normalisation
 * (blocks, rank-1, factored) x param dtype and rounding. A non-finite
 * gradient skips its call's params only. Bad input (an id twice, out of
 * range, without a gradient, no ids) gets a status and changes nothing; the
 * 1-bit optimizers refuse.
 *
 * Built for the CPU engine; with LOWBIT_TEST_CUDA and LOWBIT_TEST_EMULATED
 * for the CUDA engine under the host emulation (tests/cuda); with
 * LOWBIT_TEST_CUDA alone against liblowbit on a GPU (exits 77 without one).
 * Seed: LOWBIT_TEST_SEED. */
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

#include "test_device.h"

#define NP 5
static const int64_t kShape[NP][2] = {{1000, 0}, {48, 40}, {7, 0}, {300, 0}, {16, 20}};

static uint64_t rng_state;
static uint32_t next_u32(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 32);
}
static int64_t numel_of(int i) { return kShape[i][0] * (kShape[i][1] ? kShape[i][1] : 1); }
static size_t dsize(lowbit_dtype_t d) { return d == LOWBIT_DTYPE_FLOAT32 ? 4 : 2; }

static void fill(void* out, lowbit_dtype_t d, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    float x = (float)((double)next_u32() / 2147483648.0 - 1.0) * scale;
    uint32_t u;
    memcpy(&u, &x, 4);
    if (d == LOWBIT_DTYPE_FLOAT32)
      ((float*)out)[i] = x;
    else if (d == LOWBIT_DTYPE_BFLOAT16)
      ((uint16_t*)out)[i] = (uint16_t)(u >> 16);
    else
      ((uint16_t*)out)[i] = (uint16_t)(((next_u32() & 1u) << 15) | ((5u + next_u32() % 10u) << 10) | (next_u32() & 0x3FFu));
  }
}

typedef struct {
  lowbit_algorithm_t algo;
  float momentum;
  lowbit_state_format_t f0, f1;
  lowbit_normalization_t n0, n1;
  lowbit_dtype_t pdt;
  int32_t sr, ecc;
} case_t;

/* Two optimizers over equal params: A takes full steps, B subset steps. */
typedef struct {
  case_t c;
  lowbit_optimizer_t opt[2];
  void* param[2][NP];
  void* grad[NP]; /* shared: both read the same gradients */
  void* grad2[NP]; /* a copy, for B's explicit gradients */
} pair_t;

static void setup(pair_t* p, const case_t* c) {
  memset(p, 0, sizeof *p);
  p->c = *c;
  lowbit_optimizer_config_t cfg;
  lowbit_optimizer_config_init(&cfg, c->algo);
  cfg.device = DEVICE;
  cfg.state_format = c->f0;
  cfg.second_state_format = c->f1;
  cfg.first_normalization = c->n0;
  cfg.second_normalization = c->n1;
  cfg.min_quantized_numel = 0;
  cfg.seed = 99;
  cfg.stochastic_rounding = c->sr;
  cfg.error_correction = c->ecc;
  cfg.num_threads = 2;
  lowbit_hparams_t h;
  lowbit_hparams_init(&h, c->algo);
  h.lr = 1e-2f;
  h.weight_decay = 0.05f;
  h.momentum = c->momentum;
  for (int o = 0; o < 2; ++o) CHECK_OPT(NULL, lowbit_optimizer_create(&p->opt[o], &cfg, &h));
  for (int i = 0; i < NP; ++i) {
    const int64_t n = numel_of(i);
    const size_t pb = (size_t)n * dsize(c->pdt), gb = (size_t)n * 4;
    void* init = malloc(pb);
    fill(init, c->pdt, n, 1.f);
    p->grad[i] = dev_alloc(gb);
    p->grad2[i] = dev_alloc(gb);
    for (int o = 0; o < 2; ++o) {
      p->param[o][i] = dev_alloc(pb);
      to_dev(p->param[o][i], init, pb);
      lowbit_param_config_t pc;
      lowbit_param_config_init(&pc);
      pc.param = (lowbit_tensor_t){p->param[o][i], n, c->pdt, DEVICE, 0};
      pc.grad = (lowbit_tensor_t){p->grad[i], n, LOWBIT_DTYPE_FLOAT32, DEVICE, 0};
      pc.ndim = kShape[i][1] ? 2 : 0;
      pc.shape[0] = kShape[i][0];
      pc.shape[1] = kShape[i][1];
      int64_t id;
      CHECK_OPT(p->opt[o], lowbit_optimizer_add_param(p->opt[o], &pc, &id));
    }
    free(init);
  }
}

static void teardown(pair_t* p) {
  for (int o = 0; o < 2; ++o) lowbit_optimizer_destroy(p->opt[o]);
  for (int i = 0; i < NP; ++i) {
    dev_free(p->grad[i]);
    dev_free(p->grad2[i]);
    for (int o = 0; o < 2; ++o) dev_free(p->param[o][i]);
  }
}

static void new_grads(pair_t* p, int nan_param) {
  for (int i = 0; i < NP; ++i) {
    const int64_t n = numel_of(i);
    float* g = malloc(sizeof(float) * (size_t)n);
    fill(g, LOWBIT_DTYPE_FLOAT32, n, 0.5f);
    if (i == nan_param) g[3] = 0.f / 0.f;
    to_dev(p->grad[i], g, sizeof(float) * (size_t)n);
    to_dev(p->grad2[i], g, sizeof(float) * (size_t)n);
    free(g);
  }
}

/* The checkpoint (compressed: codes, scales, step counts) and params of optimizer o. */
static uint8_t* snapshot(pair_t* p, int o, size_t* size) {
  int64_t ck = 0;
  CHECK_OPT(p->opt[o], lowbit_optimizer_save(p->opt[o], LOWBIT_CHECKPOINT_COMPRESSED, NULL, 0, &ck, NULL));
  size_t total = (size_t)ck;
  for (int i = 0; i < NP; ++i) total += (size_t)numel_of(i) * dsize(p->c.pdt);
  uint8_t* out = malloc(total);
  CHECK_OPT(p->opt[o], lowbit_optimizer_save(p->opt[o], LOWBIT_CHECKPOINT_COMPRESSED, out, ck, &ck, NULL));
  size_t at = (size_t)ck;
  for (int i = 0; i < NP; ++i) {
    const size_t b = (size_t)numel_of(i) * dsize(p->c.pdt);
    to_host(out + at, p->param[o][i], b);
    at += b;
  }
  *size = total;
  return out;
}

static void expect_equal(pair_t* p, const char* when) {
  size_t a, b;
  uint8_t* x = snapshot(p, 0, &a);
  uint8_t* y = snapshot(p, 1, &b);
  if (a != b || memcmp(x, y, a) != 0) fail_msg("%s: the subset steps differ from full steps", when);
  free(x);
  free(y);
}

/* B steps every param through random subsets in random order. */
static void subset_steps(pair_t* p) {
  int64_t order[NP];
  for (int i = 0; i < NP; ++i) order[i] = i;
  for (int i = NP - 1; i > 0; --i) {
    const int j = (int)(next_u32() % (uint32_t)(i + 1));
    const int64_t t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (int at = 0; at < NP;) {
    const int n = 1 + (int)(next_u32() % (uint32_t)(NP - at));
    lowbit_tensor_t g[NP];
    const int explicit_grads = next_u32() % 2;
    for (int k = 0; k < n; ++k)
      g[k] = (lowbit_tensor_t){p->grad2[order[at + k]], numel_of((int)order[at + k]), LOWBIT_DTYPE_FLOAT32, DEVICE, 0};
    CHECK_OPT(p->opt[1], lowbit_optimizer_step_params(p->opt[1], order + at, n, explicit_grads ? g : NULL, NULL));
    at += n;
  }
}

static void run_case(const case_t* c) {
  pair_t p;
  setup(&p, c);
  for (int s = 0; s < 3; ++s) {
    new_grads(&p, -1);
    CHECK_OPT(p.opt[0], lowbit_optimizer_step(p.opt[0], NULL));
    subset_steps(&p);
    expect_equal(&p, "after a step");
  }
  teardown(&p);
}

static const lowbit_state_format_t kFormats[][2] = {
    {LOWBIT_STATE_FP32, LOWBIT_STATE_FP32}, {LOWBIT_STATE_BF16, LOWBIT_STATE_BF16}, {LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT},
    {LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT}, {LOWBIT_STATE_FP8, LOWBIT_STATE_FP8},   {LOWBIT_STATE_4BIT_SR, LOWBIT_STATE_4BIT},
};

static void sweep(lowbit_algorithm_t algo, float momentum) {
  const int two = algo == LOWBIT_ALGORITHM_ADAMW || algo == LOWBIT_ALGORITHM_ADAM;
  int cases = 0;
  for (size_t f = 0; f < sizeof kFormats / sizeof kFormats[0]; ++f)
    for (int norm = 0; norm < 3; ++norm) {
      lowbit_normalization_t n0 = LOWBIT_NORMALIZATION_BLOCK, n1 = LOWBIT_NORMALIZATION_BLOCK;
      const int q0 = kFormats[f][0] == LOWBIT_STATE_8BIT || kFormats[f][0] == LOWBIT_STATE_4BIT;
      if (norm == 1) {
        if (!q0) continue;
        n0 = n1 = LOWBIT_NORMALIZATION_RANK1;
      }
      if (norm == 2) {
        if (!two) continue;
        n1 = LOWBIT_NORMALIZATION_FACTORED;
      }
      const case_t cs[3] = {
          {algo, momentum, kFormats[f][0], kFormats[f][1], n0, n1, LOWBIT_DTYPE_FLOAT32, 0, 0},
          {algo, momentum, kFormats[f][0], kFormats[f][1], n0, n1, LOWBIT_DTYPE_BFLOAT16, 1, 0},
          {algo, momentum, kFormats[f][0], kFormats[f][1], n0, n1, LOWBIT_DTYPE_FLOAT16, 0, 1},
      };
      for (int d = 0; d < 3; ++d, ++cases) run_case(&cs[d]);
    }
  printf("  %d cases: subset steps give the full steps' bits\n", cases);
}

static void test_adamw(void** s) { (void)s; sweep(LOWBIT_ALGORITHM_ADAMW, 0.f); }
static void test_adam(void** s) { (void)s; sweep(LOWBIT_ALGORITHM_ADAM, 0.f); }
static void test_lion(void** s) { (void)s; sweep(LOWBIT_ALGORITHM_LION, 0.f); }
static void test_sgd(void** s) {
  (void)s;
  sweep(LOWBIT_ALGORITHM_SGD, 0.9f);
  sweep(LOWBIT_ALGORITHM_SGD, 0.f);
}

/* A NaN skips its call's params only: B steps {0, 1} with a NaN in param 1,
 * then {2, 3, 4}; A steps only {2, 3, 4} (through step_params too). */
static void test_nonfinite_skips_the_call(void** s) {
  (void)s;
  const case_t c = {LOWBIT_ALGORITHM_ADAMW, 0.f, LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT, LOWBIT_NORMALIZATION_BLOCK,
                    LOWBIT_NORMALIZATION_RANK1, LOWBIT_DTYPE_BFLOAT16, 1, 0};
  pair_t p;
  setup(&p, &c);
  new_grads(&p, 1);
  const int64_t first[2] = {0, 1}, rest[3] = {2, 3, 4};
  CHECK_OPT(p.opt[1], lowbit_optimizer_step_params(p.opt[1], first, 2, NULL, NULL));
  int32_t skipped = 0;
  CHECK_OPT(p.opt[1], lowbit_optimizer_last_step_skipped(p.opt[1], &skipped));
  assert_int_equal(skipped, 1);
  CHECK_OPT(p.opt[1], lowbit_optimizer_step_params(p.opt[1], rest, 3, NULL, NULL));
  CHECK_OPT(p.opt[1], lowbit_optimizer_last_step_skipped(p.opt[1], &skipped));
  assert_int_equal(skipped, 0);
  CHECK_OPT(p.opt[0], lowbit_optimizer_step_params(p.opt[0], rest, 3, NULL, NULL));
  expect_equal(&p, "after a NaN in another call");
  lowbit_param_info_t info;
  lowbit_param_info_init(&info);
  CHECK_OPT(p.opt[1], lowbit_optimizer_param_info(p.opt[1], 1, &info));
  assert_int_equal(info.step, 0);
  CHECK_OPT(p.opt[1], lowbit_optimizer_param_info(p.opt[1], 3, &info));
  assert_int_equal(info.step, 1);
  teardown(&p);
}

static void expect_refused(pair_t* p, const int64_t* ids, int64_t n, const lowbit_tensor_t* grads,
                           const char* message_part) {
  size_t a, b;
  uint8_t* before = snapshot(p, 1, &a);
  const lowbit_status_t st = lowbit_optimizer_step_params(p->opt[1], ids, n, grads, NULL);
  if (st != LOWBIT_ERROR_INVALID_ARGUMENT && st != LOWBIT_ERROR_NULL_POINTER)
    fail_msg("%s: status %s", message_part, lowbit_status_string(st));
  if (!strstr(lowbit_optimizer_last_error(p->opt[1]), message_part))
    fail_msg("message \"%s\" does not name \"%s\"", lowbit_optimizer_last_error(p->opt[1]), message_part);
  uint8_t* after = snapshot(p, 1, &b);
  if (a != b || memcmp(before, after, a) != 0) fail_msg("%s: the optimizer changed", message_part);
  free(before);
  free(after);
}

static void test_bad_input(void** s) {
  (void)s;
  const case_t c = {LOWBIT_ALGORITHM_ADAMW, 0.f, LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT, LOWBIT_NORMALIZATION_BLOCK,
                    LOWBIT_NORMALIZATION_BLOCK, LOWBIT_DTYPE_FLOAT32, 0, 0};
  pair_t p;
  setup(&p, &c);
  new_grads(&p, -1);
  const int64_t twice[3] = {0, 2, 0}, out_of_range[2] = {1, 5}, negative[1] = {-1}, one[1] = {3};
  expect_refused(&p, twice, 3, NULL, "ids[2] = 0 appears twice");
  expect_refused(&p, out_of_range, 2, NULL, "ids[1] = 5 does not exist");
  expect_refused(&p, negative, 1, NULL, "ids[0] = -1 does not exist");
  expect_refused(&p, one, 0, NULL, "num_ids = 0");
  expect_refused(&p, NULL, 1, NULL, "ids is NULL");
  lowbit_tensor_t wrong = {p.grad2[3], numel_of(3) - 1, LOWBIT_DTYPE_FLOAT32, DEVICE, 0};
  expect_refused(&p, one, 1, &wrong, "does not match the param's numel");
  /* issue 45 (13): the message names the index, not "grads[k]" */
  const int64_t two[2] = {1, 3};
  lowbit_tensor_t pair[2] = {{p.grad2[1], numel_of(1), LOWBIT_DTYPE_FLOAT32, DEVICE, 0},
                             {NULL, numel_of(3), LOWBIT_DTYPE_FLOAT32, DEVICE, 0}};
  expect_refused(&p, two, 2, pair, "ids[1] = 3: grads[1].data is NULL");
  CHECK_OPT(p.opt[1], lowbit_optimizer_set_grad(p.opt[1], 3, NULL));
  expect_refused(&p, one, 1, NULL, "ids[0] = 3 has no registered gradient");
  teardown(&p);

  /* 1-bit Adam steps every param in one exchange */
  lowbit_optimizer_config_t cfg;
  lowbit_optimizer_config_init(&cfg, LOWBIT_ALGORITHM_ONEBIT_ADAM);
  lowbit_hparams_t h;
  lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ONEBIT_ADAM);
  lowbit_optimizer_t opt;
  CHECK_OPT(NULL, lowbit_optimizer_create(&opt, &cfg, &h));
  float w[8] = {0}, g[8] = {0};
  lowbit_param_config_t pc;
  lowbit_param_config_init(&pc);
  pc.param = (lowbit_tensor_t){w, 8, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  pc.grad = (lowbit_tensor_t){g, 8, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  int64_t id;
  CHECK_OPT(opt, lowbit_optimizer_add_param(opt, &pc, &id));
  assert_int_equal(lowbit_optimizer_step_params(opt, &id, 1, NULL, NULL), LOWBIT_ERROR_UNSUPPORTED);
  assert_non_null(strstr(lowbit_optimizer_last_error(opt), "steps every param together"));
  lowbit_optimizer_destroy(opt);
}

int main(void) {
  rng_state = lowbit_test_seed("test_step_params") | 1u;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_input), cmocka_unit_test(test_nonfinite_skips_the_call), cmocka_unit_test(test_adamw),
      cmocka_unit_test(test_adam),      cmocka_unit_test(test_lion),                     cmocka_unit_test(test_sgd),
  };
  if (skip_without_gpu()) return 77;
  return cmocka_run_group_tests(tests, NULL, NULL);
}
