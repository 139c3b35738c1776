/* Issue 32, defect 8: a bf16 moment stores a finite value beyond bf16's
 * range as the largest bf16 of its sign (3.3895e38), never Inf:
 * write_moment, materialised bf16 checkpoints. */
#include "state_util.h"

static uint64_t g_seed;

static float bf16_max(int negative) {
  const uint32_t u = negative ? 0xFF7F0000u : 0x7F7F0000u;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* Defect 8: bf16 moments saturate at +-3.3895e38; Inf is never stored for a
 * finite value (write_moment, materialised bf16 checkpoints), ordinary
 * values round to nearest as before. */
static void test_bf16_saturates(void** state) {
  (void)state;
  const su_shape_t shape = {2, {4, 8}};
  const float big[] = {3.4028235e38f, 3.3961e38f, 3.3895314e38f, 1e38f, 1.f, 0.f};
  const float want[] = {bf16_max(0), bf16_max(0), bf16_max(0), 9.9999e37f, 1.f, 0.f};
  for (int layout = 0; layout < 2; ++layout) {
    su_fixture_t f; /* layout 0: bf16 state; 1: fp32 state, materialised bf16 */
    const lowbit_state_format_t fmt = layout ? LOWBIT_STATE_FP32 : LOWBIT_STATE_BF16;
    su_make(&f, LOWBIT_ALGORITHM_ADAMW, fmt, fmt, LOWBIT_NORMALIZATION_BLOCK, LOWBIT_NORMALIZATION_BLOCK, &shape, 1,
            g_seed);
    float x[32], back[32];
    for (int m = 0; m < 2; ++m) {
      for (int e = 0; e < 32; ++e) x[e] = (m == 0 && e % 2 ? -1.f : 1.f) * big[e % 6];
      SU_CHECK(f.opt, lowbit_optimizer_write_moment(f.opt, 0, m, x, 32, NULL));
    }
    if (layout) {
      int64_t size;
      uint8_t* buf = su_save(f.opt, LOWBIT_CHECKPOINT_MATERIALIZED_BF16, &size);
      SU_CHECK(f.opt, lowbit_optimizer_load(f.opt, buf, size, NULL));
      free(buf);
    }
    for (int m = 0; m < 2; ++m) {
      SU_CHECK(f.opt, lowbit_optimizer_read_moment(f.opt, 0, m, back, 32, NULL));
      for (int e = 0; e < 32; ++e) {
        const float w = (m == 0 && e % 2 ? -1.f : 1.f) * want[e % 6];
        const int exact = e % 6 != 3;
        if (!isfinite(back[e]) || (exact ? back[e] != w : fabsf(back[e] - w) > 1e-2f * fabsf(w)))
          fail_msg("layout %d moment %d: %.9g stored as %.9g, expected %.9g", layout, m, (double)x[e], (double)back[e],
                   (double)w);
      }
      /* and they round-trip */
      SU_CHECK(f.opt, lowbit_optimizer_write_moment(f.opt, 0, m, back, 32, NULL));
      SU_CHECK(f.opt, lowbit_optimizer_read_moment(f.opt, 0, m, x, 32, NULL));
      assert_memory_equal(x, back, sizeof x);
    }
    su_destroy(&f);
  }
}

int main(void) {
  g_seed = lowbit_test_seed("test_round_trip");
  if (getenv("LOWBIT_TEST_FILTER")) cmocka_set_test_filter(getenv("LOWBIT_TEST_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16_saturates),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
