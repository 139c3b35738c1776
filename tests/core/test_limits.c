/* Issue 32, defects 6 and 7: the bounds of step counts and of gradients.
 *
 * Step counts: lowbit_optimizer_set_step takes 0 .. 2^53 and a checkpoint
 * may carry counts up to 2^62; anything larger is refused with a message
 * naming the value, and nothing changes. Steps from the largest accepted
 * counts keep params finite (an INT64_MAX count used to wrap and make them
 * NaN).
 *
 * Gradients: every finite gradient, however large, leaves params and
 * moments finite in every state format and normalisation: the second moments
 * saturate at 3.3895e38 (the largest bf16). A factored second moment used to
 * overflow g^2 above ~1.8e19 and turn the whole param NaN; 8-bit and FP8
 * second moments, blocks and rank-1, went NaN once (1 - beta2) g^2 passed
 * 3.4e38 (0 * Inf in the decode); fp32 and bf16 ones went Inf.
 */
#include "state_util.h"
#include "../common/state_cases.h"

#define MAX_SET_STEP ((int64_t)1 << 53)
#define MAX_CHECKPOINT_STEP ((int64_t)1 << 62)

static uint64_t g_seed;

static uint32_t crc32_of(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return ~c;
}

static int take(const uint8_t** p, const uint8_t* end, void* out, size_t n) {
  if ((size_t)(end - *p) < n) return 0;
  if (out) memcpy(out, *p, n);
  *p += n;
  return 1;
}

/* Rewrites the step count of param `which` in a version-2 checkpoint and both
 * checksums over it, so that only the count is wrong. */
static void patch_step(uint8_t* buf, int64_t size, uint64_t which, int64_t step) {
  const uint8_t* p = buf + 20;
  const uint8_t* end = buf + size;
  uint32_t num_groups;
  uint64_t num_params;
  memcpy(&num_groups, buf + 16, 4);
  memcpy(&num_params, buf + 32, 8);
  p = buf + 56 + (size_t)num_groups * 36;
  assert_true(which < num_params);
  for (uint64_t i = 0; i <= which; ++i) {
    const uint8_t* record = p;
    uint32_t ndim, num_moments;
    assert_true(take(&p, end, NULL, 8) && take(&p, end, &ndim, 4) && take(&p, end, NULL, (size_t)ndim * 8 + 8));
    uint8_t* at = (uint8_t*)p;
    assert_true(take(&p, end, NULL, 12) && take(&p, end, &num_moments, 4));
    for (uint32_t m = 0; m < num_moments; ++m) {
      uint64_t data_bytes, scale_bytes;
      assert_true(take(&p, end, NULL, 12) && take(&p, end, &data_bytes, 8) && take(&p, end, &scale_bytes, 8));
      assert_true(take(&p, end, NULL, (size_t)(data_bytes + scale_bytes)));
    }
    uint64_t ecc_bytes;
    assert_true(take(&p, end, &ecc_bytes, 8) && take(&p, end, NULL, (size_t)ecc_bytes));
    if (i == which) {
      memcpy(at, &step, 8);
      const uint32_t crc = crc32_of(record, (size_t)(p - record));
      memcpy((uint8_t*)p, &crc, 4);
    }
    assert_true(take(&p, end, NULL, 4));
  }
  const uint32_t crc = crc32_of(buf, (size_t)size - 4);
  memcpy(buf + size - 4, &crc, 4);
}

static int all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!isfinite(x[i])) return 0;
  return 1;
}

static const su_shape_t kShapes[2] = {{2, {7, 129}}, {3, {3, 5, 257}}};

/* set_step refuses counts above 2^53 (and below 0) naming the value; the
 * counts stay; steps from 2^53 keep params finite, and their checkpoint
 * (count 2^53 + 2) loads. */
static void test_set_step_bound(void** state) {
  (void)state;
  uint64_t rng = g_seed;
  su_fixture_t f;
  su_make(&f, LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT, LOWBIT_NORMALIZATION_BLOCK,
          LOWBIT_NORMALIZATION_BLOCK, kShapes, 2, g_seed);
  su_steps(&f, 2, 1.f, &rng);
  const int64_t bad[] = {MAX_SET_STEP + 1, INT64_MAX, MAX_CHECKPOINT_STEP, -1, INT64_MIN};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; ++k)
    for (int64_t id = -1; id < 2; ++id) {
      char value[32];
      snprintf(value, sizeof value, "%lld", (long long)bad[k]);
      su_expect_error(f.opt, lowbit_optimizer_set_step(f.opt, id, bad[k], NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                      "step", value, (const char*)NULL);
      assert_int_equal(su_step_count(f.opt, 0), 2);
      assert_int_equal(su_step_count(f.opt, 1), 2);
    }
  SU_CHECK(f.opt, lowbit_optimizer_set_step(f.opt, -1, MAX_SET_STEP, NULL));
  su_steps(&f, 2, 1.f, &rng);
  for (int i = 0; i < 2; ++i) {
    assert_int_equal(su_step_count(f.opt, i), MAX_SET_STEP + 2);
    assert_true(all_finite(f.p[i], f.numel[i]));
  }
  int64_t size;
  uint8_t* buf = su_save(f.opt, LOWBIT_CHECKPOINT_COMPRESSED, &size);
  SU_CHECK(f.opt, lowbit_optimizer_set_step(f.opt, -1, 0, NULL));
  SU_CHECK(f.opt, lowbit_optimizer_load(f.opt, buf, size, NULL));
  assert_int_equal(su_step_count(f.opt, 1), MAX_SET_STEP + 2);
  free(buf);
  su_destroy(&f);
}

/* A checkpoint whose count is above 2^62 (checksums valid) is CORRUPT_DATA
 * naming the param and the count, and the optimizer keeps its state; 2^62
 * itself loads and steps on with finite params. */
static void test_checkpoint_step_bound(void** state) {
  (void)state;
  uint64_t rng = g_seed ^ 1;
  su_fixture_t f;
  su_make(&f, LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT, LOWBIT_NORMALIZATION_RANK1,
          LOWBIT_NORMALIZATION_FACTORED, kShapes, 2, g_seed);
  su_steps(&f, 3, 1.f, &rng);
  int64_t size, before_size, after_size;
  uint8_t* good = su_save(f.opt, LOWBIT_CHECKPOINT_COMPRESSED, &size);
  uint8_t* before = su_save(f.opt, LOWBIT_CHECKPOINT_MATERIALIZED_FP32, &before_size);
  const int64_t bad[] = {MAX_CHECKPOINT_STEP + 1, INT64_MAX};
  for (size_t k = 0; k < 2; ++k)
    for (uint64_t which = 0; which < 2; ++which) {
      uint8_t* buf = malloc((size_t)size);
      memcpy(buf, good, (size_t)size);
      patch_step(buf, size, which, bad[k]);
      char value[32], param[32];
      snprintf(value, sizeof value, "%lld", (long long)bad[k]);
      snprintf(param, sizeof param, "param %llu", (unsigned long long)which);
      su_expect_error(f.opt, lowbit_optimizer_load(f.opt, buf, size, NULL), LOWBIT_ERROR_CORRUPT_DATA, param, "step",
                      value, (const char*)NULL);
      uint8_t* after = su_save(f.opt, LOWBIT_CHECKPOINT_MATERIALIZED_FP32, &after_size);
      assert_int_equal(after_size, before_size);
      assert_memory_equal(after, before, (size_t)before_size);
      free(after), free(buf);
    }
  patch_step(good, size, 1, MAX_CHECKPOINT_STEP);
  SU_CHECK(f.opt, lowbit_optimizer_load(f.opt, good, size, NULL));
  assert_int_equal(su_step_count(f.opt, 0), 3);
  assert_int_equal(su_step_count(f.opt, 1), MAX_CHECKPOINT_STEP);
  su_steps(&f, 2, 1.f, &rng);
  assert_int_equal(su_step_count(f.opt, 1), MAX_CHECKPOINT_STEP + 2);
  for (int i = 0; i < 2; ++i) assert_true(all_finite(f.p[i], f.numel[i]));
  free(good), free(before);
  su_destroy(&f);
}

/* Four steps of one case (a materialised save / load after the second),
 * then params and both moments must be finite. */
static void huge_gradient_case(const state_case_t* fc, lowbit_algorithm_t algo, float huge, int columns, uint64_t rng,
                               const char* label) {
  su_fixture_t f;
  su_make(&f, algo, fc->fm, fc->fv, fc->nm, fc->nv, kShapes, 2, g_seed);
  if (columns) {
    lowbit_hparams_t hp;
    hp.struct_size = sizeof hp;
    SU_CHECK(f.opt, lowbit_optimizer_get_hparams(f.opt, 0, &hp));
    hp.beta2 = 0.f;
    SU_CHECK(f.opt, lowbit_optimizer_set_hparams(f.opt, 0, &hp));
  }
  for (int t = 0; t < 4; ++t) {
    for (int i = 0; i < 2; ++i) {
      const int64_t C = kShapes[i].dim[kShapes[i].ndim - 1];
      for (int64_t e = 0; e < f.numel[i]; ++e) {
        const float u = su_uniform(&rng);
        const int64_t q = e / C, col = e % C;
        /* scattered: a tenth of the elements huge, another twentieth every other step */
        const int at = columns ? col % 10 == 0 || (col % 10 == 1 && q % 2 == 0) : e % 10 == 0;
        f.g[i][e] = at ? (u < 0.f ? -huge : huge) : (!columns && e % 20 == 5 && t % 2) ? huge : u;
      }
    }
    SU_CHECK(f.opt, lowbit_optimizer_step(f.opt, NULL));
    if (t == 1) {
      int64_t size;
      uint8_t* buf = su_save(f.opt, LOWBIT_CHECKPOINT_MATERIALIZED_FP32, &size);
      SU_CHECK(f.opt, lowbit_optimizer_load(f.opt, buf, size, NULL));
      free(buf);
    }
  }
  for (int i = 0; i < 2; ++i) {
    if (!all_finite(f.p[i], f.numel[i])) fail_msg("%s: param %d is not finite", label, i);
    float* x = malloc((size_t)f.numel[i] * 4);
    for (int m = 0; m < 2; ++m) {
      SU_CHECK(f.opt, lowbit_optimizer_read_moment(f.opt, i, m, x, f.numel[i], NULL));
      if (!all_finite(x, f.numel[i])) fail_msg("%s: param %d moment %d is not finite", label, i, m);
    }
    free(x);
  }
  su_destroy(&f);
}

/* Gradients with some elements at 1e19 .. FLT_MAX (either sign), the others
 * ordinary, for AdamW and Adam in every format and normalisation: steps
 * succeed, params and both moments stay finite, and a materialised save /
 * load keeps them so. The huge elements are scattered, or (with beta2 = 0)
 * fill every 10th column and, in even rows, every 10th + 1 too: then factored
 * columns saturate and v^ = row / mean * col overflows unless it saturates. */
static void test_huge_gradients_stay_finite(void** state) {
  (void)state;
  const float huge[] = {1e19f, 2e19f, 1e21f, 1e30f, 3e38f, 3.4028235e38f};
  const lowbit_algorithm_t algos[] = {LOWBIT_ALGORITHM_ADAMW, LOWBIT_ALGORITHM_ADAM};
  for (int columns = 0; columns < 2; ++columns)
    for (int c = 0; c < NUM_STATE_CASES; ++c)
      for (int a = 0; a < 2; ++a)
        for (size_t h = 0; h < sizeof huge / sizeof huge[0]; ++h) {
          char label[96];
          snprintf(label, sizeof label, "case %d algo %d grads %g%s", c, a, (double)huge[h],
                   columns ? " in columns, beta2 0" : "");
          huge_gradient_case(&kStateCases[c], algos[a], huge[h], columns,
                             g_seed + 1000 * (uint64_t)c + 10 * h + (uint64_t)a + 100000 * (uint64_t)columns, label);
        }
}

int main(void) {
  g_seed = su_init("test_limits");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_set_step_bound),
      cmocka_unit_test(test_checkpoint_step_bound),
      cmocka_unit_test(test_huge_gradients_stay_finite),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
