/* Muon's refused calls and edge cases (issue 45, items 3, 4, 6, 7 and 10), on
 * the CPU engine:
 * - an SGD group of a Muon optimizer registered without momentum refuses a
 *   momentum later, as a plain SGD optimizer does (its params have no
 *   momentum buffer); its params then step as a plain SGD optimizer's, bit
 *   for bit (CTest c.muon_edges_memcheck runs this one under valgrind: no
 *   uninitialised read);
 * - a step whose products fail (the test hook LOWBIT_TEST_MATMUL_FAIL_AFTER,
 *   the first batch's products readied, the second's refused) changes
 *   nothing: the state bytes (a compressed checkpoint), the params, the step
 *   counts; the handle's and the functional step's alike; the next step
 *   gives the bits of an optimizer that never failed;
 * - a functional step in which no param has a grad writes count + 1 and
 *   reports "not skipped", as the other algorithms do;
 * - a 0.2-sized (48-byte) hparams struct in a Muon functional step gets
 *   Muon's defaults for the fields added since, as optimizer_create gives
 *   them: the bits of the current struct holding those defaults;
 * - ns_steps: 1..100 (the header's range) are accepted, 0 and 101 refused.
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

/* ---- item 4: a step whose products fail changes nothing */

typedef struct {
  lowbit_optimizer_t opt;
  float a[24 * 40], b[40 * 24], bias[24];
  float ga[24 * 40], gb[40 * 24], gbias[24];
} twin_t;

/* Muon (8-bit momentum, bf16 products) over a 24 x 40 and a 40 x 24 matrix
 * (two batches), and an AdamW group's bias stepped first. */
static void twin_make(twin_t* x) {
  lowbit_optimizer_config_t c = muon_config(LOWBIT_STATE_8BIT);
  lowbit_hparams_t h, ha;
  lowbit_hparams_init(&h, LOWBIT_ALGORITHM_MUON);
  h.lr = 0.02f;
  h.ns_precision = LOWBIT_NS_PRECISION_BF16;
  OK(NULL, lowbit_optimizer_create(&x->opt, &c, &h));
  lowbit_hparams_init(&ha, LOWBIT_ALGORITHM_ADAMW);
  ha.algorithm = LOWBIT_ALGORITHM_ADAMW;
  int32_t group = -1;
  OK(x->opt, lowbit_optimizer_add_group(x->opt, &ha, &group));
  rng_state = 77;
  fill(x->a, 960, 0.1f), fill(x->b, 960, 0.1f), fill(x->bias, 24, 0.1f);
  add(x->opt, x->bias, x->gbias, 1, 24, 0, group);
  add(x->opt, x->a, x->ga, 2, 24, 40, 0);
  add(x->opt, x->b, x->gb, 2, 40, 24, 0);
}
static void twin_grads(twin_t* x, uint64_t seed) {
  rng_state = seed;
  fill(x->ga, 960, 1.f), fill(x->gb, 960, 1.f), fill(x->gbias, 24, 1.f);
}
/* Everything a step can change: a compressed checkpoint (codes, scales, step
 * counts, hyper-parameters) and the params. */
static unsigned char* twin_snapshot(const twin_t* x, int64_t* size) {
  OK(x->opt, lowbit_optimizer_save(x->opt, LOWBIT_CHECKPOINT_COMPRESSED, NULL, 0, size, NULL));
  const int64_t params = (int64_t)(sizeof x->a + sizeof x->b + sizeof x->bias);
  unsigned char* s = malloc((size_t)(*size + params));
  int64_t written = 0;
  OK(x->opt, lowbit_optimizer_save(x->opt, LOWBIT_CHECKPOINT_COMPRESSED, s, *size, &written, NULL));
  memcpy(s + *size, x->a, sizeof x->a);
  memcpy(s + *size + sizeof x->a, x->b, sizeof x->b);
  memcpy(s + *size + sizeof x->a + sizeof x->b, x->bias, sizeof x->bias);
  *size += params;
  return s;
}

static void test_failed_products_change_nothing(void** state) {
  (void)state;
  static twin_t x, ref;
  twin_make(&x);
  twin_make(&ref);
  twin_grads(&x, 1), twin_grads(&ref, 1);
  OK(x.opt, lowbit_optimizer_step(x.opt, NULL)); /* products 1-6: two batches x three */
  OK(ref.opt, lowbit_optimizer_step(ref.opt, NULL));
  int64_t n0 = 0, n1 = 0;
  unsigned char* before = twin_snapshot(&x, &n0);
  unsigned char* again = twin_snapshot(&x, &n1);
  assert_true(n0 == n1 && memcmp(before, again, (size_t)n0) == 0); /* a snapshot is deterministic */
  free(again);

  /* The next step: the first batch's three products are readied, the
   * second's first is refused, before anything is written. */
  setenv("LOWBIT_TEST_MATMUL_FAIL_AFTER", "9", 1);
  twin_grads(&x, 2);
  assert_int_equal(lowbit_optimizer_step(x.opt, NULL), LOWBIT_ERROR_INTERNAL);
  printf("  the refused step: %s\n", lowbit_optimizer_last_error(x.opt));
  assert_non_null(strstr(lowbit_optimizer_last_error(x.opt), "LOWBIT_TEST_MATMUL_FAIL_AFTER = 9: product 10"));
  unsetenv("LOWBIT_TEST_MATMUL_FAIL_AFTER");
  unsigned char* after = twin_snapshot(&x, &n1);
  assert_int_equal(n0, n1);
  if (memcmp(before, after, (size_t)n0) != 0) {
    size_t first = 0;
    while (before[first] == after[first]) ++first;
    fail_msg("the failed step changed byte %zu of %lld of the state and params", first, (long long)n0);
  }
  free(after);
  free(before);

  /* Then the same step goes through and gives the bits of one that never failed. */
  twin_grads(&x, 2), twin_grads(&ref, 2);
  OK(x.opt, lowbit_optimizer_step(x.opt, NULL));
  OK(ref.opt, lowbit_optimizer_step(ref.opt, NULL));
  unsigned char* mine = twin_snapshot(&x, &n0);
  unsigned char* theirs = twin_snapshot(&ref, &n1);
  assert_true(n0 == n1 && memcmp(mine, theirs, (size_t)n0) == 0);
  free(mine), free(theirs);
  lowbit_optimizer_destroy(x.opt);
  lowbit_optimizer_destroy(ref.opt);
}

/* ---- the functional step: a context and its params' buffers */

#define FMAX 3
typedef struct {
  lowbit_step_context_t ctx;
  int n;
  float* p[FMAX];
  float* g[FMAX];
  int64_t numel[FMAX];
  lowbit_state_plan_t plan[FMAX];
  lowbit_param_buffers_t b[FMAX];
  int32_t records[FMAX * LOWBIT_STATE_RECORD_INT32];
  int32_t count;
} functional_t;

/* Matrices rows[i] x cols[i] (cols 0: a 1-D param) in groups group[i], state
 * planned with `hp` (the groups' current-size hparams). */
static void functional_make(functional_t* f, const lowbit_optimizer_config_t* c, const lowbit_hparams_t* hp,
                            int n, const int64_t* rows, const int64_t* cols, const int32_t* group, uint64_t seed) {
  memset(f, 0, sizeof *f);
  f->n = n;
  OK(NULL, lowbit_step_context_create(&f->ctx, c));
  rng_state = seed;
  for (int i = 0; i < n; ++i) {
    lowbit_param_config_t pc;
    lowbit_param_config_init(&pc);
    f->numel[i] = cols[i] ? rows[i] * cols[i] : rows[i];
    f->p[i] = malloc(4 * (size_t)f->numel[i]);
    f->g[i] = malloc(4 * (size_t)f->numel[i]);
    fill(f->p[i], f->numel[i], 0.1f);
    pc.param = host_tensor(f->p[i], f->numel[i]);
    pc.group = group[i];
    pc.ndim = cols[i] ? 2 : 1;
    pc.shape[0] = rows[i];
    pc.shape[1] = cols[i];
    lowbit_state_plan_init(&f->plan[i]);
    OK(NULL, lowbit_plan_param_state(c, &hp[group[i]], &pc, &f->plan[i]));
    lowbit_param_buffers_init(&f->b[i]);
    f->b[i].param = pc.param;
    f->b[i].grad = host_tensor(f->g[i], f->numel[i]);
    f->b[i].group = group[i];
    f->b[i].plan = &f->plan[i];
    f->b[i].ndim = pc.ndim;
    f->b[i].shape[0] = pc.shape[0];
    f->b[i].shape[1] = pc.shape[1];
    for (int m = 0; m < 2; ++m) {
      f->b[i].moment[m] = calloc(1, (size_t)f->plan[i].data_bytes[m] + 1);
      f->b[i].moment_bytes[m] = f->plan[i].data_bytes[m];
      f->b[i].scales[m] = calloc(1, 4 * (size_t)f->plan[i].scale_count[m] + 4);
      f->b[i].scale_count[m] = f->plan[i].scale_count[m];
    }
    OK(NULL, lowbit_state_record(&f->plan[i], pc.ndim, pc.shape, f->records + LOWBIT_STATE_RECORD_INT32 * i,
                                 LOWBIT_STATE_RECORD_INT32));
  }
}
static void functional_free(functional_t* f) {
  for (int i = 0; i < f->n; ++i) {
    free(f->p[i]), free(f->g[i]);
    for (int m = 0; m < 2; ++m) free(f->b[i].moment[m]), free(f->b[i].scales[m]);
  }
  lowbit_step_context_destroy(f->ctx);
}
static void functional_grads(functional_t* f, uint64_t seed) {
  rng_state = seed;
  for (int i = 0; i < f->n; ++i) fill(f->g[i], f->numel[i], 1.f);
}
/* One step with the count in engine (host) memory, count_out aliasing it. */
static lowbit_status_t functional_step(functional_t* f, const lowbit_hparams_t* hparams, int num_groups) {
  lowbit_step_args_t a;
  lowbit_step_args_init(&a);
  a.hparams = hparams;
  a.num_groups = num_groups;
  a.records = f->records;
  a.count = &f->count;
  a.count_out = &f->count;
  return lowbit_functional_step(f->ctx, f->b, f->n, &a, NULL);
}
/* The params and every state buffer, back to back. */
static unsigned char* functional_snapshot(const functional_t* f, size_t* size) {
  size_t n = sizeof f->count;
  for (int i = 0; i < f->n; ++i) {
    n += 4 * (size_t)f->numel[i];
    for (int m = 0; m < 2; ++m) n += (size_t)f->b[i].moment_bytes[m] + 4 * (size_t)f->b[i].scale_count[m];
  }
  unsigned char* s = malloc(n);
  unsigned char* w = s;
  memcpy(w, &f->count, sizeof f->count), w += sizeof f->count;
  for (int i = 0; i < f->n; ++i) {
    memcpy(w, f->p[i], 4 * (size_t)f->numel[i]), w += 4 * (size_t)f->numel[i];
    for (int m = 0; m < 2; ++m) {
      memcpy(w, f->b[i].moment[m], (size_t)f->b[i].moment_bytes[m]), w += f->b[i].moment_bytes[m];
      memcpy(w, f->b[i].scales[m], 4 * (size_t)f->b[i].scale_count[m]), w += 4 * f->b[i].scale_count[m];
    }
  }
  *size = n;
  return s;
}

static void muon_groups(lowbit_hparams_t* hp) {
  lowbit_hparams_init(&hp[0], LOWBIT_ALGORITHM_MUON);
  hp[0].lr = 0.02f;
  hp[0].ns_precision = LOWBIT_NS_PRECISION_BF16;
  lowbit_hparams_init(&hp[1], LOWBIT_ALGORITHM_ADAMW);
  hp[1].algorithm = LOWBIT_ALGORITHM_ADAMW;
}

/* Item 4 in the functional step: the caller's buffers and count are left as they were. */
static void test_failed_products_change_nothing_functional(void** state) {
  (void)state;
  const lowbit_optimizer_config_t c = muon_config(LOWBIT_STATE_8BIT);
  lowbit_hparams_t hp[2];
  muon_groups(hp);
  static const int64_t rows[3] = {24, 40, 24}, cols[3] = {0, 24, 40};
  static const int32_t group[3] = {1, 0, 0};
  functional_t f;
  functional_make(&f, &c, hp, 3, rows, cols, group, 5);
  functional_grads(&f, 1);
  OK(NULL, functional_step(&f, hp, 2));
  assert_int_equal(f.count, 1);
  size_t n0 = 0, n1 = 0;
  unsigned char* before = functional_snapshot(&f, &n0);
  functional_grads(&f, 2);
  setenv("LOWBIT_TEST_MATMUL_FAIL_AFTER", "9", 1);
  assert_int_equal(functional_step(&f, hp, 2), LOWBIT_ERROR_INTERNAL);
  unsetenv("LOWBIT_TEST_MATMUL_FAIL_AFTER");
  printf("  the refused functional step: %s\n", lowbit_step_context_last_error(f.ctx));
  assert_non_null(strstr(lowbit_step_context_last_error(f.ctx), "LOWBIT_TEST_MATMUL_FAIL_AFTER = 9: product 10"));
  unsigned char* after = functional_snapshot(&f, &n1);
  assert_true(n0 == n1 && memcmp(before, after, n0) == 0);
  free(before), free(after);
  OK(NULL, functional_step(&f, hp, 2));
  assert_int_equal(f.count, 2);
  functional_free(&f);
}

/* ---- item 6: no grad at all writes count + 1, not skipped, as AdamW's step does */

static void test_functional_step_without_grads_counts(void** state) {
  (void)state;
  lowbit_hparams_t hp[2];
  muon_groups(hp);
  static const int64_t rows[3] = {24, 40, 24}, cols[3] = {0, 24, 40};
  static const int32_t group[3] = {1, 0, 0};
  lowbit_optimizer_config_t cm = muon_config(LOWBIT_STATE_FP32), ca = cm;
  ca.algorithm = LOWBIT_ALGORITHM_ADAMW;
  lowbit_hparams_t ha[1];
  lowbit_hparams_init(&ha[0], LOWBIT_ALGORITHM_ADAMW);
  static const int32_t group0[1] = {0};
  functional_t fm, fa;
  functional_make(&fm, &cm, hp, 3, rows, cols, group, 9);
  functional_make(&fa, &ca, ha, 1, rows, cols, group0, 9);
  functional_grads(&fm, 3), functional_grads(&fa, 3);
  OK(NULL, functional_step(&fm, hp, 2));
  OK(NULL, functional_step(&fa, ha, 1));
  for (int i = 0; i < 3; ++i) fm.b[i].grad.data = NULL;
  fa.b[0].grad.data = NULL;
  size_t n0 = 0, n1 = 0;
  unsigned char* before = functional_snapshot(&fm, &n0);
  OK(NULL, functional_step(&fm, hp, 2));
  OK(NULL, functional_step(&fa, ha, 1));
  assert_int_equal(fa.count, 2);
  assert_int_equal(fm.count, 2);
  int32_t skipped = -1;
  OK(NULL, lowbit_step_context_last_step_skipped(fm.ctx, &skipped));
  assert_int_equal(skipped, 0);
  unsigned char* after = functional_snapshot(&fm, &n1);
  /* Only the count moved. */
  assert_true(n0 == n1 && memcmp(before + sizeof(int32_t), after + sizeof(int32_t), n0 - sizeof(int32_t)) == 0);
  free(before), free(after);
  functional_free(&fm);
  functional_free(&fa);
}

/* ---- item 7: a 48-byte (0.2) hparams struct in a Muon functional step */

static void test_old_hparams_size_gets_muons_defaults(void** state) {
  (void)state;
  const lowbit_optimizer_config_t c = muon_config(LOWBIT_STATE_FP32);
  lowbit_hparams_t hp[1];
  lowbit_hparams_init(&hp[0], LOWBIT_ALGORITHM_MUON); /* Muon's defaults, bf16 products aside */
  hp[0].lr = 0.02f;
  hp[0].weight_decay = 0.05f;
  static const int64_t rows[2] = {24, 16}, cols[2] = {40, 16};
  static const int32_t group[2] = {0, 0};
  functional_t now, old;
  functional_make(&now, &c, hp, 2, rows, cols, group, 21);
  functional_make(&old, &c, hp, 2, rows, cols, group, 21);
  /* Two groups of the 0.2 struct, back to back (the array's stride is its struct_size). */
  const size_t old_size = 48;
  unsigned char old_groups[2 * 48];
  for (int g = 0; g < 2; ++g) {
    memcpy(old_groups + g * old_size, &hp[0], old_size);
    memcpy(old_groups + g * old_size, &old_size, sizeof old_size);
  }
  for (int t = 0; t < 3; ++t) {
    functional_grads(&now, 30 + (uint64_t)t), functional_grads(&old, 30 + (uint64_t)t);
    OK(NULL, functional_step(&now, hp, 1));
    lowbit_status_t st = functional_step(&old, (const lowbit_hparams_t*)old_groups, 1);
    if (st != LOWBIT_SUCCESS) fail_msg("the 48-byte hparams: %s", lowbit_step_context_last_error(old.ctx));
  }
  size_t n0 = 0, n1 = 0;
  unsigned char* a = functional_snapshot(&now, &n0);
  unsigned char* b = functional_snapshot(&old, &n1);
  assert_true(n0 == n1 && memcmp(a, b, n0) == 0);
  free(a), free(b);
  /* The same struct creates an optimizer (the rule optimizer_create has always had). */
  lowbit_optimizer_t opt = NULL;
  OK(NULL, lowbit_optimizer_create(&opt, &c, (const lowbit_hparams_t*)old_groups));
  lowbit_hparams_t back;
  back.struct_size = sizeof back;
  OK(opt, lowbit_optimizer_get_hparams(opt, 0, &back));
  assert_int_equal(back.ns_steps, 5);
  lowbit_optimizer_destroy(opt);
  functional_free(&now);
  functional_free(&old);
}

/* ---- item 10: ns_steps 1..100 */

static void test_ns_steps_bounds(void** state) {
  (void)state;
  lowbit_hparams_t h;
  lowbit_hparams_init(&h, LOWBIT_ALGORITHM_MUON);
  const int32_t good[3] = {1, 99, 100}, bad[3] = {0, 101, -1};
  for (int k = 0; k < 3; ++k) {
    h.ns_steps = good[k];
    OK(NULL, lowbit_hparams_check(&h, LOWBIT_ALGORITHM_MUON));
    h.ns_steps = bad[k];
    assert_int_equal(lowbit_hparams_check(&h, LOWBIT_ALGORITHM_MUON), LOWBIT_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(lowbit_last_error(), "1..100"));
  }
  /* 100 iterations run. */
  lowbit_optimizer_config_t c = muon_config(LOWBIT_STATE_FP32);
  h.ns_steps = 100;
  h.ns_precision = LOWBIT_NS_PRECISION_FP32;
  lowbit_optimizer_t opt = NULL;
  OK(NULL, lowbit_optimizer_create(&opt, &c, &h));
  float w[8 * 6], g[8 * 6];
  fill(w, 48, 1.f), fill(g, 48, 1.f);
  add(opt, w, g, 2, 8, 6, 0);
  OK(opt, lowbit_optimizer_step(opt, NULL));
  for (int i = 0; i < 48; ++i) assert_true(isfinite(w[i]));
  lowbit_optimizer_destroy(opt);
}

int main(int argc, char** argv) {
  rng_state = lowbit_test_seed("test_muon_edges") | 1;
  unsetenv("LOWBIT_TEST_MATMUL_FAIL_AFTER");
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd_group_refuses_momentum),
      cmocka_unit_test(test_failed_products_change_nothing),
      cmocka_unit_test(test_failed_products_change_nothing_functional),
      cmocka_unit_test(test_functional_step_without_grads_counts),
      cmocka_unit_test(test_old_hparams_size_gets_muons_defaults),
      cmocka_unit_test(test_ns_steps_bounds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
