/* Issue 2: bad input gets a clear status and a message naming the argument,
 * and changes nothing.
 *
 * Each case runs against a populated optimizer (three params in two groups:
 * fp32 params with fp32 state, bf16 params with bf16 state, fp32 params with
 * 8-bit state; three steps already taken). Before the bad call the test takes
 * a snapshot (param bytes, every moment via read_moment, param_info of every
 * param, num_params, state_bytes, every group's hparams, last_step_skipped);
 * after it, it asserts the status, that the message (per handle, or the
 * thread-local one for a NULL handle / failed create) contains the name of
 * the argument at fault, and that the snapshot is bit-for-bit unchanged.
 * Every test ends with a good step on the abused optimizer and on a twin that
 * never saw a bad call: both must be bit-identical, and the step must match
 * the float64 reference (proving nothing was corrupted).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>

#include "harness.h"

#define NP 3
static const int64_t kNumel[NP] = {1000, 5000, 4096};
static const lowbit_dtype_t kPdt[NP] = {LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_FLOAT32};
static const lowbit_dtype_t kGdt[NP] = {LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_BFLOAT16};
static const int32_t kGroup[NP] = {0, 1, 0};
static const lowbit_state_format_t kFmt[NP] = {LOWBIT_STATE_FP32, LOWBIT_STATE_BF16, LOWBIT_STATE_8BIT};

typedef struct {
  lowbit_optimizer_t opt;
  void* p[NP];
  void* g[NP];
  lowbit_hparams_t h[2];
} fixture_t;

typedef struct {
  void* p[NP];
  float* m[NP][2];
  lowbit_param_info_t info[NP];
  int64_t num_params, bytes;
  lowbit_hparams_t h[2];
  int32_t skipped;
} snapshot_t;

static rng_t g_rng;

static void fill_grads(fixture_t* f, uint64_t seed) {
  rng_t r = {seed};
  for (int i = 0; i < NP; ++i)
    for (int64_t e = 0; e < kNumel[i]; ++e) tensor_set(f->g[i], kGdt[i], e, rng_normal(&r));
}

static void fixture_init(fixture_t* f, uint64_t seed) {
  rng_t r = {seed};
  memset(f, 0, sizeof *f);
  lowbit_optimizer_config_t oc;
  CHECK_OK(NULL, lowbit_optimizer_config_init(&oc, LOWBIT_ALGORITHM_ADAMW));
  random_hparams(LOWBIT_ALGORITHM_ADAMW, &r, &f->h[0]);
  random_hparams(LOWBIT_ALGORITHM_ADAMW, &r, &f->h[1]);
  f->h[1].bias_correction = 0;
  CHECK_OK(NULL, lowbit_optimizer_create(&f->opt, &oc, &f->h[0]));
  int32_t gid = -1;
  CHECK_OK(f->opt, lowbit_optimizer_add_group(f->opt, &f->h[1], &gid));
  assert_int_equal(gid, 1);
  for (int i = 0; i < NP; ++i) {
    f->p[i] = calloc((size_t)kNumel[i], dtype_size(kPdt[i]));
    f->g[i] = calloc((size_t)kNumel[i], dtype_size(kGdt[i]));
    for (int64_t e = 0; e < kNumel[i]; ++e) tensor_set(f->p[i], kPdt[i], e, 0.1 * rng_normal(&r));
    lowbit_param_config_t pc;
    CHECK_OK(f->opt, lowbit_param_config_init(&pc));
    pc.param = make_tensor(f->p[i], kNumel[i], kPdt[i]);
    pc.grad = make_tensor(f->g[i], kNumel[i], kGdt[i]);
    pc.group = kGroup[i];
    pc.state_format = kFmt[i];
    int64_t id = -1;
    CHECK_OK(f->opt, lowbit_optimizer_add_param(f->opt, &pc, &id));
    assert_int_equal(id, i);
  }
  for (int s = 0; s < 3; ++s) {
    fill_grads(f, seed + 100 + (uint64_t)s);
    CHECK_OK(f->opt, lowbit_optimizer_step(f->opt, NULL));
  }
}

static void fixture_free(fixture_t* f) {
  CHECK_OK(f->opt, lowbit_optimizer_destroy(f->opt));
  for (int i = 0; i < NP; ++i) {
    free(f->p[i]);
    free(f->g[i]);
  }
}

static void snap_take(const fixture_t* f, snapshot_t* s) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < NP; ++i) {
    size_t bytes = (size_t)kNumel[i] * dtype_size(kPdt[i]);
    s->p[i] = malloc(bytes);
    memcpy(s->p[i], f->p[i], bytes);
    for (int m = 0; m < 2; ++m) {
      s->m[i][m] = calloc((size_t)kNumel[i], 4);
      CHECK_OK(f->opt, lowbit_optimizer_read_moment(f->opt, i, m, s->m[i][m], kNumel[i], NULL));
    }
    s->info[i].struct_size = sizeof s->info[i];
    CHECK_OK(f->opt, lowbit_optimizer_param_info(f->opt, i, &s->info[i]));
  }
  CHECK_OK(f->opt, lowbit_optimizer_num_params(f->opt, &s->num_params));
  CHECK_OK(f->opt, lowbit_optimizer_state_bytes(f->opt, -1, &s->bytes));
  for (int gi = 0; gi < 2; ++gi) {
    s->h[gi].struct_size = sizeof s->h[gi];
    CHECK_OK(f->opt, lowbit_optimizer_get_hparams(f->opt, gi, &s->h[gi]));
  }
  CHECK_OK(f->opt, lowbit_optimizer_last_step_skipped(f->opt, &s->skipped));
}

static void snap_free(snapshot_t* s) {
  for (int i = 0; i < NP; ++i) {
    free(s->p[i]);
    free(s->m[i][0]);
    free(s->m[i][1]);
  }
}

static int info_equal(const lowbit_param_info_t* a, const lowbit_param_info_t* b) {
  return a->numel == b->numel && a->step == b->step && a->group == b->group && a->param_dtype == b->param_dtype &&
         a->state_format == b->state_format && a->second_state_format == b->second_state_format &&
         a->stochastic_rounding == b->stochastic_rounding && a->error_correction == b->error_correction &&
         a->state_bytes == b->state_bytes;
}

/* Fails the test (naming the case) if anything observable changed. */
static void snap_check(const fixture_t* f, const snapshot_t* before, const char* what) {
  snapshot_t now;
  snap_take(f, &now);
  for (int i = 0; i < NP; ++i) {
    if (memcmp(before->p[i], f->p[i], (size_t)kNumel[i] * dtype_size(kPdt[i])))
      fail_msg("%s: param %d changed", what, i);
    for (int m = 0; m < 2; ++m)
      if (memcmp(before->m[i][m], now.m[i][m], (size_t)kNumel[i] * 4)) fail_msg("%s: moment %d of param %d changed", what, m, i);
    if (!info_equal(&before->info[i], &now.info[i])) fail_msg("%s: param_info of param %d changed", what, i);
  }
  if (before->num_params != now.num_params) fail_msg("%s: num_params changed", what);
  if (before->bytes != now.bytes) fail_msg("%s: state_bytes changed", what);
  for (int gi = 0; gi < 2; ++gi)
    if (!hparams_equal(&before->h[gi], &now.h[gi])) fail_msg("%s: hparams of group %d changed", what, gi);
  if (before->skipped != now.skipped) fail_msg("%s: last_step_skipped changed", what);
  snap_free(&now);
}

/* Status and message of one bad call. `msg` is the message the call left:
 * lowbit_optimizer_last_error(opt), or lowbit_last_error() for a NULL handle
 * or a failed create. Each of the '|'-separated alternatives in `names` is
 * accepted. */
static void expect_error(lowbit_status_t got, lowbit_status_t want, const char* msg, const char* names,
                         const char* what) {
  if (got != want)
    fail_msg("%s: status %d (%s), expected %d (%s); message: \"%s\"", what, (int)got, lowbit_status_string(got),
             (int)want, lowbit_status_string(want), msg ? msg : "(null)");
  if (!msg || !*msg) fail_msg("%s: no error message", what);
  char buf[256];
  snprintf(buf, sizeof buf, "%s", names);
  int found = 0;
  for (char* tok = strtok(buf, "|"); tok && !found; tok = strtok(NULL, "|")) found = strstr(msg, tok) != NULL;
  if (!found) fail_msg("%s: message \"%s\" does not name %s", what, msg, names);
}

#define BAD(fx, snap, call, want, names)                                                    \
  do {                                                                                      \
    lowbit_status_t st_ = (call);                                                           \
    expect_error(st_, (want), lowbit_optimizer_last_error((fx)->opt), (names), #call);      \
    snap_check((fx), (snap), #call);                                                        \
  } while (0)
#define BAD_TLS(fx, snap, call, want, names)                                  \
  do {                                                                        \
    lowbit_status_t st_ = (call);                                             \
    expect_error(st_, (want), lowbit_last_error(), (names), #call);           \
    if (fx) snap_check((fx), (snap), #call);                                  \
  } while (0)

/* For direct calls: the status first, then the message (argument
 * evaluation order is unspecified, and the message buffer may be replaced by
 * the call). */
#define EXPECT(call, want, msgexpr, names, what) \
  do {                                           \
    lowbit_status_t st_ = (call);                \
    expect_error(st_, (want), (msgexpr), (names), (what)); \
  } while (0)

/* The good step that ends every test: the abused optimizer and a twin built
 * from the same seed must agree bit for bit, and the fp32 param of group 0
 * must match one float64 step from its state before the step. */
static void final_good_step(fixture_t* f, uint64_t seed) {
  fixture_t twin;
  fixture_init(&twin, seed);
  for (int i = 0; i < NP; ++i)
    if (memcmp(twin.p[i], f->p[i], (size_t)kNumel[i] * dtype_size(kPdt[i])))
      fail_msg("param %d differs from the twin before the final step", i);
  float* m0 = calloc((size_t)kNumel[0], 4);
  float* v0 = calloc((size_t)kNumel[0], 4);
  double* p0 = calloc((size_t)kNumel[0], 8);
  CHECK_OK(f->opt, lowbit_optimizer_read_moment(f->opt, 0, 0, m0, kNumel[0], NULL));
  CHECK_OK(f->opt, lowbit_optimizer_read_moment(f->opt, 0, 1, v0, kNumel[0], NULL));
  for (int64_t e = 0; e < kNumel[0]; ++e) p0[e] = ((float*)f->p[0])[e];
  fill_grads(f, seed + 999);
  fill_grads(&twin, seed + 999);
  /* every param must be registered again after the set_grad abuse */
  for (int i = 0; i < NP; ++i) {
    lowbit_tensor_t t = make_tensor(f->g[i], kNumel[i], kGdt[i]);
    CHECK_OK(f->opt, lowbit_optimizer_set_grad(f->opt, i, &t));
  }
  CHECK_OK(f->opt, lowbit_optimizer_step(f->opt, NULL));
  CHECK_OK(twin.opt, lowbit_optimizer_step(twin.opt, NULL));
  for (int i = 0; i < NP; ++i) {
    if (memcmp(twin.p[i], f->p[i], (size_t)kNumel[i] * dtype_size(kPdt[i])))
      fail_msg("param %d differs from the twin after the final step", i);
    float* a = calloc((size_t)kNumel[i], 4);
    float* b = calloc((size_t)kNumel[i], 4);
    for (int m = 0; m < 2; ++m) {
      CHECK_OK(f->opt, lowbit_optimizer_read_moment(f->opt, i, m, a, kNumel[i], NULL));
      CHECK_OK(twin.opt, lowbit_optimizer_read_moment(twin.opt, i, m, b, kNumel[i], NULL));
      if (memcmp(a, b, (size_t)kNumel[i] * 4)) fail_msg("moment %d of param %d differs from the twin", m, i);
    }
    free(a);
    free(b);
    lowbit_param_info_t ia, ib;
    ia.struct_size = ib.struct_size = sizeof ia;
    CHECK_OK(f->opt, lowbit_optimizer_param_info(f->opt, i, &ia));
    CHECK_OK(twin.opt, lowbit_optimizer_param_info(twin.opt, i, &ib));
    assert_true(info_equal(&ia, &ib));
    assert_int_equal(ia.step, 4);
  }
  ref_hp_t hp = ref_hp_from(LOWBIT_ALGORITHM_ADAMW, &f->h[0]);
  ref_step_t kc = ref_step_consts(&hp, 4);
  for (int64_t e = 0; e < kNumel[0]; ++e) {
    double p = p0[e], m = m0[e], v = v0[e];
    ref_scale_t sc;
    ref_update(&hp, &kc, &p, ((float*)f->g[0])[e], &m, &v, &sc);
    double got = ((float*)f->p[0])[e];
    if (fabs(got - p) > REF_K * REF_U * sc.p) fail_msg("final step: element %lld: %.9g vs reference %.9g", (long long)e, got, p);
  }
  free(m0);
  free(v0);
  free(p0);
  fixture_free(&twin);
}

static uint64_t case_seed(const char* name) {
  rng_t r = test_rng(name);
  return rng_next(&r);
}

/* ------------------------------------------------------------------ global functions */

static void test_status_strings_and_version(void** state) {
  (void)state;
  const char* seen[15];
  for (int s = 0; s <= 14; ++s) {
    const char* str = lowbit_status_string((lowbit_status_t)s);
    assert_non_null(str);
    assert_true(strlen(str) > 0);
    assert_null(strstr(str, "unknown"));
    for (int k = 0; k < s; ++k)
      if (strcmp(seen[k], str) == 0) fail_msg("status %d and %d share the string \"%s\"", k, s, str);
    seen[s] = str;
  }
  const int unknown[] = {15, 99, -1, 1000000};
  for (size_t k = 0; k < sizeof unknown / sizeof unknown[0]; ++k) {
    const char* str = lowbit_status_string((lowbit_status_t)unknown[k]);
    assert_non_null(str);
    assert_non_null(strstr(str, "unknown"));
  }
  /* explicit, never-reused values */
  assert_int_equal(LOWBIT_SUCCESS, 0);
  assert_int_equal(LOWBIT_ERROR_INVALID_ARGUMENT, 1);
  assert_int_equal(LOWBIT_ERROR_NULL_POINTER, 2);
  assert_int_equal(LOWBIT_ERROR_UNSUPPORTED, 3);
  assert_int_equal(LOWBIT_ERROR_INVALID_STATE, 5);
  assert_int_equal(LOWBIT_ERROR_INTERNAL, 14);
  assert_int_equal(lowbit_version(), LOWBIT_VERSION);
  assert_int_equal(LOWBIT_VERSION,
                   LOWBIT_VERSION_MAJOR * 10000 + LOWBIT_VERSION_MINOR * 100 + LOWBIT_VERSION_PATCH);
  assert_int_equal(lowbit_version() / 10000, LOWBIT_VERSION_MAJOR);
  assert_int_equal(lowbit_version() / 100 % 100, LOWBIT_VERSION_MINOR);
  assert_int_equal(lowbit_version() % 100, LOWBIT_VERSION_PATCH);
  int c = lowbit_has_cuda(), m = lowbit_has_mpi(), n = lowbit_has_nccl();
  assert_true(c == 0 || c == 1);
  assert_true(m == 0 || m == 1);
  assert_true(n == 0 || n == 1);
  printf("  lowbit %d.%d.%d: cuda %d mpi %d nccl %d\n", LOWBIT_VERSION_MAJOR, LOWBIT_VERSION_MINOR,
         LOWBIT_VERSION_PATCH, c, m, n);
}

static void test_destroy_null_and_null_handles(void** state) {
  (void)state;
  assert_int_equal(lowbit_optimizer_destroy(NULL), LOWBIT_SUCCESS);
  assert_non_null(lowbit_optimizer_last_error(NULL));
  lowbit_hparams_t h;
  CHECK_OK(NULL, lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW));
  int64_t i64;
  int32_t i32;
  float buf[4];
  lowbit_param_info_t info;
  info.struct_size = sizeof info;
  lowbit_param_config_t pc;
  CHECK_OK(NULL, lowbit_param_config_init(&pc));
  lowbit_tensor_t t = make_tensor(buf, 4, LOWBIT_DTYPE_FLOAT32);
  /* every entry point with a NULL handle: NULL_POINTER and a thread-local
   * message naming the handle */
  BAD_TLS(NULL, NULL, lowbit_optimizer_step(NULL, NULL), LOWBIT_ERROR_NULL_POINTER, "opt|handle");
  BAD_TLS(NULL, NULL, lowbit_optimizer_step_with_grads(NULL, &t, 1, NULL), LOWBIT_ERROR_NULL_POINTER, "opt|handle");
  BAD_TLS(NULL, NULL, lowbit_optimizer_add_group(NULL, &h, &i32), LOWBIT_ERROR_NULL_POINTER, "opt|handle");
  BAD_TLS(NULL, NULL, lowbit_optimizer_set_hparams(NULL, 0, &h), LOWBIT_ERROR_NULL_POINTER, "opt|handle");
  BAD_TLS(NULL, NULL, lowbit_optimizer_get_hparams(NULL, 0, &h), LOWBIT_ERROR_NULL_POINTER, "opt|handle");
  BAD_TLS(NULL, NULL, lowbit_optimizer_set_lr(NULL, 0, 1e-3f), LOWBIT_ERROR_NULL_POINTER, "opt|handle");
  BAD_TLS(NULL, NULL, lowbit_optimizer_add_param(NULL, &pc, &i64), LOWBIT_ERROR_NULL_POINTER, "opt|handle");
  BAD_TLS(NULL, NULL, lowbit_optimizer_set_grad(NULL, 0, &t), LOWBIT_ERROR_NULL_POINTER, "opt|handle");
  BAD_TLS(NULL, NULL, lowbit_optimizer_last_step_skipped(NULL, &i32), LOWBIT_ERROR_NULL_POINTER, "opt|handle");
  BAD_TLS(NULL, NULL, lowbit_optimizer_num_params(NULL, &i64), LOWBIT_ERROR_NULL_POINTER, "opt|handle");
  BAD_TLS(NULL, NULL, lowbit_optimizer_param_info(NULL, 0, &info), LOWBIT_ERROR_NULL_POINTER, "opt|handle");
  BAD_TLS(NULL, NULL, lowbit_optimizer_state_bytes(NULL, 0, &i64), LOWBIT_ERROR_NULL_POINTER, "opt|handle");
  BAD_TLS(NULL, NULL, lowbit_optimizer_read_moment(NULL, 0, 0, buf, 4, NULL), LOWBIT_ERROR_NULL_POINTER, "opt|handle");
  /* the init helpers */
  BAD_TLS(NULL, NULL, lowbit_hparams_init(NULL, LOWBIT_ALGORITHM_ADAMW), LOWBIT_ERROR_NULL_POINTER, "hparams");
  BAD_TLS(NULL, NULL, lowbit_hparams_init(&h, (lowbit_algorithm_t)0), LOWBIT_ERROR_INVALID_ARGUMENT, "algorithm");
  BAD_TLS(NULL, NULL, lowbit_hparams_init(&h, (lowbit_algorithm_t)77), LOWBIT_ERROR_INVALID_ARGUMENT, "algorithm");
  BAD_TLS(NULL, NULL, lowbit_optimizer_config_init(NULL, LOWBIT_ALGORITHM_ADAMW), LOWBIT_ERROR_NULL_POINTER, "config");
  lowbit_optimizer_config_t oc;
  BAD_TLS(NULL, NULL, lowbit_optimizer_config_init(&oc, (lowbit_algorithm_t)-3), LOWBIT_ERROR_INVALID_ARGUMENT,
          "algorithm");
  BAD_TLS(NULL, NULL, lowbit_param_config_init(NULL), LOWBIT_ERROR_NULL_POINTER, "config");
}

/* ------------------------------------------------------------------ create */

static void try_create(lowbit_optimizer_config_t oc, lowbit_hparams_t h, lowbit_status_t want, const char* names,
                       const char* what) {
  lowbit_optimizer_t out = (lowbit_optimizer_t)(uintptr_t)0x1234; /* garbage: must become NULL */
  lowbit_status_t st = lowbit_optimizer_create(&out, &oc, &h);
  expect_error(st, want, lowbit_last_error(), names, what);
  if (out != NULL) fail_msg("%s: failed create left *out = %p, expected NULL", what, (void*)out);
}

static void test_create(void** state) {
  (void)state;
  const lowbit_algorithm_t algos[4] = {LOWBIT_ALGORITHM_ADAMW, LOWBIT_ALGORITHM_ADAM, LOWBIT_ALGORITHM_LION,
                                       LOWBIT_ALGORITHM_SGD};
  for (int a = 0; a < 4; ++a) {
    lowbit_optimizer_config_t oc0;
    lowbit_hparams_t h0;
    CHECK_OK(NULL, lowbit_optimizer_config_init(&oc0, algos[a]));
    CHECK_OK(NULL, lowbit_hparams_init(&h0, algos[a]));
    lowbit_optimizer_config_t oc;
    lowbit_hparams_t h;
#define CASE_C(mod, want, names) \
  do {                           \
    oc = oc0;                    \
    h = h0;                      \
    mod;                         \
    try_create(oc, h, want, names, #mod); \
  } while (0)
    CASE_C(oc.struct_size = 0, LOWBIT_ERROR_INVALID_ARGUMENT, "struct_size");
    CASE_C(oc.struct_size = sizeof oc - 4, LOWBIT_ERROR_INVALID_ARGUMENT, "struct_size"); /* (sizeof - 8 is the 0.2 size) */
    CASE_C(oc.struct_size = sizeof oc + 8, LOWBIT_ERROR_INVALID_ARGUMENT, "struct_size");
    CASE_C(h.struct_size = 3, LOWBIT_ERROR_INVALID_ARGUMENT, "struct_size");
    CASE_C(h.struct_size = sizeof h + 64, LOWBIT_ERROR_INVALID_ARGUMENT, "struct_size");
    CASE_C(oc.algorithm = (lowbit_algorithm_t)0, LOWBIT_ERROR_INVALID_ARGUMENT, "algorithm");
    CASE_C(oc.algorithm = (lowbit_algorithm_t)42, LOWBIT_ERROR_INVALID_ARGUMENT, "algorithm");
    CASE_C(oc.device = (lowbit_device_t)0, LOWBIT_ERROR_INVALID_ARGUMENT, "device");
    CASE_C(oc.device = (lowbit_device_t)9, LOWBIT_ERROR_INVALID_ARGUMENT, "device");
    CASE_C(oc.state_format = (lowbit_state_format_t)6, LOWBIT_ERROR_INVALID_ARGUMENT, "state_format");
    CASE_C(oc.state_format = (lowbit_state_format_t)-1, LOWBIT_ERROR_INVALID_ARGUMENT, "state_format");
    CASE_C(oc.second_state_format = (lowbit_state_format_t)99, LOWBIT_ERROR_INVALID_ARGUMENT, "state_format");
    CASE_C(h.lr = -1e-3f, LOWBIT_ERROR_INVALID_ARGUMENT, "lr");
    CASE_C(h.lr = NAN, LOWBIT_ERROR_INVALID_ARGUMENT, "lr");
    CASE_C(h.lr = INFINITY, LOWBIT_ERROR_INVALID_ARGUMENT, "lr");
    CASE_C(h.weight_decay = -0.01f, LOWBIT_ERROR_INVALID_ARGUMENT, "weight_decay");
    CASE_C(h.weight_decay = NAN, LOWBIT_ERROR_INVALID_ARGUMENT, "weight_decay");
    if (algos[a] != LOWBIT_ALGORITHM_SGD) {
      CASE_C(h.beta1 = 1.0f, LOWBIT_ERROR_INVALID_ARGUMENT, "beta1");
      CASE_C(h.beta1 = -0.1f, LOWBIT_ERROR_INVALID_ARGUMENT, "beta1");
      CASE_C(h.beta1 = NAN, LOWBIT_ERROR_INVALID_ARGUMENT, "beta1");
      CASE_C(h.beta2 = 1.0f, LOWBIT_ERROR_INVALID_ARGUMENT, "beta2");
      CASE_C(h.beta2 = 1.5f, LOWBIT_ERROR_INVALID_ARGUMENT, "beta2");
      CASE_C(h.beta2 = -INFINITY, LOWBIT_ERROR_INVALID_ARGUMENT, "beta2");
    }
    if (algos[a] == LOWBIT_ALGORITHM_ADAMW || algos[a] == LOWBIT_ALGORITHM_ADAM) {
      CASE_C(h.eps = 0.f, LOWBIT_ERROR_INVALID_ARGUMENT, "eps");
      CASE_C(h.eps = -1e-8f, LOWBIT_ERROR_INVALID_ARGUMENT, "eps");
      CASE_C(h.eps = NAN, LOWBIT_ERROR_INVALID_ARGUMENT, "eps");
    }
    if (algos[a] == LOWBIT_ALGORITHM_SGD) {
      CASE_C(h.momentum = 1.0f, LOWBIT_ERROR_INVALID_ARGUMENT, "momentum");
      CASE_C(h.momentum = -0.5f, LOWBIT_ERROR_INVALID_ARGUMENT, "momentum");
      CASE_C((h.momentum = 0.9f, h.dampening = 1.5f), LOWBIT_ERROR_INVALID_ARGUMENT, "dampening");
      CASE_C((h.momentum = 0.f, h.nesterov = 1), LOWBIT_ERROR_INVALID_ARGUMENT, "nesterov");
      CASE_C((h.momentum = 0.9f, h.dampening = 0.1f, h.nesterov = 1), LOWBIT_ERROR_INVALID_ARGUMENT, "nesterov");
    }
#undef CASE_C
  }
  /* NULL arguments */
  lowbit_optimizer_config_t oc;
  lowbit_hparams_t h;
  CHECK_OK(NULL, lowbit_optimizer_config_init(&oc, LOWBIT_ALGORITHM_ADAMW));
  CHECK_OK(NULL, lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW));
  lowbit_optimizer_t out = (lowbit_optimizer_t)(uintptr_t)0x1234;
  EXPECT(lowbit_optimizer_create(NULL, &oc, &h), LOWBIT_ERROR_NULL_POINTER, lowbit_last_error(), "out",
               "create(NULL, ...)");
  EXPECT(lowbit_optimizer_create(&out, NULL, &h), LOWBIT_ERROR_NULL_POINTER, lowbit_last_error(), "config",
               "create(&out, NULL, ...)");
  assert_null(out);
  out = (lowbit_optimizer_t)(uintptr_t)0x1234;
  EXPECT(lowbit_optimizer_create(&out, &oc, NULL), LOWBIT_ERROR_NULL_POINTER, lowbit_last_error(), "hparams",
               "create(&out, &config, NULL)");
  assert_null(out);
  /* a CUDA optimizer: UNSUPPORTED without a CUDA build; with one, either it
   * works (a GPU is there) or it fails cleanly */
  oc.device = LOWBIT_DEVICE_CUDA;
  out = (lowbit_optimizer_t)(uintptr_t)0x1234;
  lowbit_status_t st = lowbit_optimizer_create(&out, &oc, &h);
  if (!lowbit_has_cuda()) {
    expect_error(st, LOWBIT_ERROR_UNSUPPORTED, lowbit_last_error(), "CUDA|cuda|device", "create on CUDA");
    assert_null(out);
  } else if (st == LOWBIT_SUCCESS) {
    assert_non_null(out);
    lowbit_optimizer_destroy(out);
  } else {
    assert_true(st == LOWBIT_ERROR_CUDA || st == LOWBIT_ERROR_UNSUPPORTED);
    assert_null(out);
    assert_true(strlen(lowbit_last_error()) > 0);
  }
  /* a successful call after the failures still works and leaves a handle */
  oc.device = LOWBIT_DEVICE_CPU;
  out = NULL;
  CHECK_OK(NULL, lowbit_optimizer_create(&out, &oc, &h));
  assert_non_null(out);
  assert_string_equal(lowbit_optimizer_last_error(out), "");
  lowbit_optimizer_destroy(out);
}

/* ------------------------------------------------------------------ num_threads */

/* Issue 17 (4): num_threads is bounded (0..1024, lowbit.h): above it, create
 * and lowbit_plan_param_state fail with INVALID_ARGUMENT naming num_threads
 * and the value (before, 100000 crashed inside OpenMP at the first parallel
 * step and INT32_MAX made OpenMP exit(1)); the bound itself is accepted. */
static void test_num_threads_bound(void** state) {
  (void)state;
  const int32_t bad[] = {-1, 1025, 100000, INT32_MAX, INT32_MIN};
  lowbit_optimizer_config_t oc;
  lowbit_hparams_t h;
  CHECK_OK(NULL, lowbit_optimizer_config_init(&oc, LOWBIT_ALGORITHM_ADAMW));
  CHECK_OK(NULL, lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW));
  lowbit_param_config_t pc;
  CHECK_OK(NULL, lowbit_param_config_init(&pc));
  pc.param.numel = 1 << 20;
  pc.param.dtype = LOWBIT_DTYPE_FLOAT32;
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; ++k) {
    char what[64], value[32];
    snprintf(what, sizeof what, "create with num_threads = %d", (int)bad[k]);
    snprintf(value, sizeof value, "num_threads = %d", (int)bad[k]);
    oc.num_threads = bad[k];
    lowbit_optimizer_t out = (lowbit_optimizer_t)(uintptr_t)0x1234;
    EXPECT(lowbit_optimizer_create(&out, &oc, &h), LOWBIT_ERROR_INVALID_ARGUMENT, lowbit_last_error(), value, what);
    assert_null(out);
    lowbit_state_plan_t plan;
    memset(&plan, 0, sizeof plan);
    plan.struct_size = sizeof plan;
    EXPECT(lowbit_plan_param_state(&oc, &h, &pc, &plan), LOWBIT_ERROR_INVALID_ARGUMENT, lowbit_last_error(), value,
           "plan_param_state");
  }
  /* 1024 is allowed, and steps (a small param: the step stays on the calling
   * thread, so the test does not depend on the machine's thread limits) */
  oc.num_threads = 1024;
  lowbit_optimizer_t opt = NULL;
  CHECK_OK(NULL, lowbit_optimizer_create(&opt, &oc, &h));
  float p[64] = {0}, g[64];
  for (int i = 0; i < 64; ++i) g[i] = 0.01f * (float)(i - 32);
  pc.param = make_tensor(p, 64, LOWBIT_DTYPE_FLOAT32);
  pc.grad = make_tensor(g, 64, LOWBIT_DTYPE_FLOAT32);
  int64_t id = -1;
  CHECK_OK(opt, lowbit_optimizer_add_param(opt, &pc, &id));
  CHECK_OK(opt, lowbit_optimizer_step(opt, NULL));
  assert_true(p[0] != 0.f);
  lowbit_optimizer_destroy(opt);
}

/* ------------------------------------------------------------------ huge numel */

/* Issue 17 (6): sizes computed from numel are checked, never wrapped (before,
 * a numel of 2^62 planned an fp32 state of 0 bytes, and UBSan reported the
 * signed overflow in core/state.cpp). A numel whose param or state cannot be
 * sized in int64 is INVALID_ARGUMENT naming numel and its value; a legal but
 * impossible size is OUT_OF_MEMORY at registration; nothing changes. */
typedef struct {
  int64_t numel;
  lowbit_dtype_t dtype;
  lowbit_state_format_t fmt;
  int ecc;
  lowbit_status_t want;
  int64_t state_bytes; /* when want == SUCCESS */
} huge_case_t;

static void test_huge_numel(void** state) {
  (void)state;
  const int64_t P62 = (int64_t)1 << 62, P61 = (int64_t)1 << 61;
  const huge_case_t cases[] = {
      {INT64_MAX, LOWBIT_DTYPE_FLOAT32, LOWBIT_STATE_FP32, 0, LOWBIT_ERROR_INVALID_ARGUMENT, 0},
      {INT64_MAX, LOWBIT_DTYPE_BFLOAT16, LOWBIT_STATE_4BIT, 0, LOWBIT_ERROR_INVALID_ARGUMENT, 0},
      {INT64_MAX - 1, LOWBIT_DTYPE_FLOAT16, LOWBIT_STATE_8BIT, 0, LOWBIT_ERROR_INVALID_ARGUMENT, 0},
      {P62, LOWBIT_DTYPE_FLOAT32, LOWBIT_STATE_FP32, 0, LOWBIT_ERROR_INVALID_ARGUMENT, 0}, /* was: 0 bytes */
      {P62, LOWBIT_DTYPE_BFLOAT16, LOWBIT_STATE_8BIT, 0, LOWBIT_ERROR_INVALID_ARGUMENT, 0}, /* 2^63 param bytes */
      {P62 - 1, LOWBIT_DTYPE_BFLOAT16, LOWBIT_STATE_FP32, 0, LOWBIT_ERROR_INVALID_ARGUMENT, 0},
      {P61, LOWBIT_DTYPE_BFLOAT16, LOWBIT_STATE_BF16, 0, LOWBIT_ERROR_INVALID_ARGUMENT, 0}, /* 2 x 2^62 */
      {P61, LOWBIT_DTYPE_BFLOAT16, LOWBIT_STATE_FP32, 0, LOWBIT_ERROR_INVALID_ARGUMENT, 0},
      /* 2 x (2^61 + 2^56) + 2^62 error-correction bytes > INT64_MAX */
      {P62 - 1, LOWBIT_DTYPE_BFLOAT16, LOWBIT_STATE_4BIT, 1, LOWBIT_ERROR_INVALID_ARGUMENT, 0},
      /* representable: planned exactly */
      {P62 - 1, LOWBIT_DTYPE_BFLOAT16, LOWBIT_STATE_4BIT, 0, LOWBIT_SUCCESS, 2 * (((int64_t)1 << 61) + ((int64_t)1 << 57))},
      {P61, LOWBIT_DTYPE_BFLOAT16, LOWBIT_STATE_8BIT, 1, LOWBIT_SUCCESS, 2 * (P61 + ((int64_t)1 << 55)) + P61},
      {(int64_t)1 << 60, LOWBIT_DTYPE_FLOAT32, LOWBIT_STATE_BF16, 0, LOWBIT_SUCCESS, (int64_t)1 << 62},
  };
  lowbit_optimizer_config_t oc;
  lowbit_hparams_t h;
  CHECK_OK(NULL, lowbit_optimizer_config_init(&oc, LOWBIT_ALGORITHM_ADAMW));
  CHECK_OK(NULL, lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW));
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
    const huge_case_t* c = &cases[k];
    lowbit_param_config_t pc;
    CHECK_OK(NULL, lowbit_param_config_init(&pc));
    pc.param.numel = c->numel;
    pc.param.dtype = c->dtype;
    pc.state_format = c->fmt;
    pc.error_correction = c->ecc;
    lowbit_state_plan_t plan;
    memset(&plan, 0x5A, sizeof plan);
    plan.struct_size = sizeof plan;
    char what[96], value[64];
    snprintf(what, sizeof what, "plan of numel %lld (case %d)", (long long)c->numel, (int)k);
    snprintf(value, sizeof value, "numel = %lld", (long long)c->numel);
    lowbit_status_t st = lowbit_plan_param_state(&oc, &h, &pc, &plan);
    if (c->want != LOWBIT_SUCCESS) {
      expect_error(st, c->want, lowbit_last_error(), value, what);
      continue;
    }
    if (st != LOWBIT_SUCCESS) fail_msg("%s: %d (%s)", what, (int)st, lowbit_last_error());
    if (plan.state_bytes != c->state_bytes)
      fail_msg("%s: state_bytes %lld, expected %lld", what, (long long)plan.state_bytes, (long long)c->state_bytes);
    for (int m = 0; m < 2; ++m) assert_true(plan.data_bytes[m] > 0 && plan.scale_count[m] >= 0);
  }

  /* Through add_param on an optimizer with one param: too large to size is
   * INVALID_ARGUMENT, a representable but impossible state (2^56 bytes, over
   * any address space) OUT_OF_MEMORY; the optimizer is unchanged and works. */
  lowbit_optimizer_t opt = NULL;
  CHECK_OK(NULL, lowbit_optimizer_create(&opt, &oc, &h));
  float p[256], g[256];
  for (int i = 0; i < 256; ++i) p[i] = 0.f, g[i] = 0.01f * (float)(i % 9 - 4);
  lowbit_param_config_t pc;
  CHECK_OK(NULL, lowbit_param_config_init(&pc));
  pc.param = make_tensor(p, 256, LOWBIT_DTYPE_FLOAT32);
  pc.grad = make_tensor(g, 256, LOWBIT_DTYPE_FLOAT32);
  int64_t id = -1;
  float big[8];
  lowbit_param_config_t hc;
  CHECK_OK(NULL, lowbit_param_config_init(&hc));
  /* first, with no other param whose memory its range could overlap */
  hc.param = make_tensor(big, (int64_t)1 << 56, LOWBIT_DTYPE_BFLOAT16);
  hc.state_format = LOWBIT_STATE_8BIT;
  EXPECT(lowbit_optimizer_add_param(opt, &hc, &id), LOWBIT_ERROR_OUT_OF_MEMORY, lowbit_optimizer_last_error(opt),
         "bytes|memory", "add_param of 2^56 elements");
  CHECK_OK(opt, lowbit_optimizer_add_param(opt, &pc, &id));
  assert_int_equal(id, 0);
  const int64_t bad_numel[] = {P62, INT64_MAX, P61 + 1};
  for (int k = 0; k < 3; ++k) {
    hc.param = make_tensor(big, bad_numel[k], LOWBIT_DTYPE_FLOAT32);
    hc.state_format = k == 2 ? LOWBIT_STATE_FP32 : LOWBIT_STATE_DEFAULT;
    char value[64];
    snprintf(value, sizeof value, "numel = %lld", (long long)bad_numel[k]);
    EXPECT(lowbit_optimizer_add_param(opt, &hc, &id), LOWBIT_ERROR_INVALID_ARGUMENT, lowbit_optimizer_last_error(opt),
           value, "add_param with a huge numel");
  }
  int64_t n = -1, bytes = -1;
  CHECK_OK(opt, lowbit_optimizer_num_params(opt, &n));
  assert_int_equal(n, 1);
  CHECK_OK(opt, lowbit_optimizer_state_bytes(opt, -1, &bytes));
  assert_int_equal(bytes, 2 * 256 * 4);
  CHECK_OK(opt, lowbit_optimizer_step(opt, NULL));
  assert_true(p[0] != 0.f);
  lowbit_optimizer_destroy(opt);
}

/* ------------------------------------------------------------------ hyper-parameters on a live optimizer */

static void test_hparams_on_live_optimizer(void** state) {
  (void)state;
  uint64_t seed = case_seed("hparams_live");
  fixture_t f;
  fixture_init(&f, seed);
  snapshot_t s;
  snap_take(&f, &s);
  lowbit_hparams_t h = f.h[0];
  int32_t gid = -1;
#define CASE_H(mod, names)                                                                           \
  do {                                                                                               \
    h = f.h[0];                                                                                      \
    mod;                                                                                             \
    BAD(&f, &s, lowbit_optimizer_set_hparams(f.opt, 0, &h), LOWBIT_ERROR_INVALID_ARGUMENT, names);   \
    BAD(&f, &s, lowbit_optimizer_add_group(f.opt, &h, &gid), LOWBIT_ERROR_INVALID_ARGUMENT, names);  \
  } while (0)
  CASE_H(h.struct_size = 0, "struct_size");
  CASE_H(h.struct_size = sizeof h * 2, "struct_size");
  CASE_H(h.lr = -1.f, "lr");
  CASE_H(h.lr = NAN, "lr");
  CASE_H(h.lr = -INFINITY, "lr");
  CASE_H(h.beta1 = 1.f, "beta1");
  CASE_H(h.beta1 = NAN, "beta1");
  CASE_H(h.beta2 = -0.001f, "beta2");
  CASE_H(h.eps = 0.f, "eps");
  CASE_H(h.weight_decay = -1.f, "weight_decay");
#undef CASE_H
  assert_int_equal(gid, -1);
  BAD(&f, &s, lowbit_optimizer_set_hparams(f.opt, 2, &f.h[0]), LOWBIT_ERROR_INVALID_ARGUMENT, "group");
  BAD(&f, &s, lowbit_optimizer_set_hparams(f.opt, -1, &f.h[0]), LOWBIT_ERROR_INVALID_ARGUMENT, "group");
  BAD(&f, &s, lowbit_optimizer_set_hparams(f.opt, 0, NULL), LOWBIT_ERROR_NULL_POINTER, "hparams");
  BAD(&f, &s, lowbit_optimizer_add_group(f.opt, NULL, &gid), LOWBIT_ERROR_NULL_POINTER, "hparams");
  BAD(&f, &s, lowbit_optimizer_get_hparams(f.opt, 7, &h), LOWBIT_ERROR_INVALID_ARGUMENT, "group");
  BAD(&f, &s, lowbit_optimizer_get_hparams(f.opt, 0, NULL), LOWBIT_ERROR_NULL_POINTER, "out");
  BAD(&f, &s, lowbit_optimizer_set_lr(f.opt, 0, -1e-3f), LOWBIT_ERROR_INVALID_ARGUMENT, "lr");
  BAD(&f, &s, lowbit_optimizer_set_lr(f.opt, 1, NAN), LOWBIT_ERROR_INVALID_ARGUMENT, "lr");
  BAD(&f, &s, lowbit_optimizer_set_lr(f.opt, 0, INFINITY), LOWBIT_ERROR_INVALID_ARGUMENT, "lr");
  BAD(&f, &s, lowbit_optimizer_set_lr(f.opt, 5, 1e-3f), LOWBIT_ERROR_INVALID_ARGUMENT, "group");
  snap_free(&s);
  final_good_step(&f, seed);
  fixture_free(&f);
}

/* SGD: a group registered without momentum has no momentum buffer, so
 * turning momentum on later is refused (naming momentum) and changes nothing. */
static void test_sgd_momentum_change(void** state) {
  (void)state;
  lowbit_optimizer_config_t oc;
  CHECK_OK(NULL, lowbit_optimizer_config_init(&oc, LOWBIT_ALGORITHM_SGD));
  lowbit_hparams_t h;
  CHECK_OK(NULL, lowbit_hparams_init(&h, LOWBIT_ALGORITHM_SGD));
  lowbit_optimizer_t opt = NULL;
  CHECK_OK(NULL, lowbit_optimizer_create(&opt, &oc, &h));
  float p[64] = {0}, g[64];
  for (int i = 0; i < 64; ++i) g[i] = (float)i;
  lowbit_param_config_t pc;
  CHECK_OK(opt, lowbit_param_config_init(&pc));
  pc.param = make_tensor(p, 64, LOWBIT_DTYPE_FLOAT32);
  pc.grad = make_tensor(g, 64, LOWBIT_DTYPE_FLOAT32);
  int64_t id;
  CHECK_OK(opt, lowbit_optimizer_add_param(opt, &pc, &id));
  int64_t bytes = -1;
  CHECK_OK(opt, lowbit_optimizer_state_bytes(opt, -1, &bytes));
  assert_int_equal(bytes, 0);
  lowbit_hparams_t h2 = h;
  h2.momentum = 0.9f;
  lowbit_status_t st = lowbit_optimizer_set_hparams(opt, 0, &h2);
  expect_error(st, LOWBIT_ERROR_INVALID_ARGUMENT, lowbit_optimizer_last_error(opt), "momentum", "momentum on later");
  lowbit_hparams_t back;
  back.struct_size = sizeof back;
  CHECK_OK(opt, lowbit_optimizer_get_hparams(opt, 0, &back));
  assert_true(hparams_equal(&back, &h));
  CHECK_OK(opt, lowbit_optimizer_step(opt, NULL));
  for (int i = 0; i < 64; ++i) assert_true(p[i] == -h.lr * (float)i);
  lowbit_optimizer_destroy(opt);
}

/* ------------------------------------------------------------------ params */

static void test_add_param(void** state) {
  (void)state;
  uint64_t seed = case_seed("add_param");
  fixture_t f;
  fixture_init(&f, seed);
  snapshot_t s;
  snap_take(&f, &s);
  float* fresh = calloc(512, 4);
  float* fresh_g = calloc(512, 4);
  lowbit_param_config_t pc0;
  CHECK_OK(f.opt, lowbit_param_config_init(&pc0));
  pc0.param = make_tensor(fresh, 512, LOWBIT_DTYPE_FLOAT32);
  pc0.grad = make_tensor(fresh_g, 512, LOWBIT_DTYPE_FLOAT32);
  lowbit_param_config_t pc;
  int64_t id = -7;
#define CASE_P(mod, want, names)                                           \
  do {                                                                     \
    pc = pc0;                                                              \
    mod;                                                                   \
    BAD(&f, &s, lowbit_optimizer_add_param(f.opt, &pc, &id), want, names); \
  } while (0)
  CASE_P(pc.struct_size = 0, LOWBIT_ERROR_INVALID_ARGUMENT, "struct_size");
  CASE_P(pc.struct_size = sizeof pc + 4, LOWBIT_ERROR_INVALID_ARGUMENT, "struct_size");
  CASE_P(pc.param.data = NULL, LOWBIT_ERROR_NULL_POINTER, "param");
  CASE_P(pc.param.numel = 0, LOWBIT_ERROR_INVALID_ARGUMENT, "numel");
  CASE_P(pc.param.numel = -5, LOWBIT_ERROR_INVALID_ARGUMENT, "numel");
  CASE_P(pc.param.dtype = (lowbit_dtype_t)0, LOWBIT_ERROR_INVALID_ARGUMENT, "dtype");
  CASE_P(pc.param.dtype = (lowbit_dtype_t)4, LOWBIT_ERROR_INVALID_ARGUMENT, "dtype");
  CASE_P(pc.param.device = (lowbit_device_t)0, LOWBIT_ERROR_INVALID_ARGUMENT, "device");
  CASE_P(pc.param.device = LOWBIT_DEVICE_CUDA, LOWBIT_ERROR_INVALID_ARGUMENT, "device");
  CASE_P(pc.grad.numel = 511, LOWBIT_ERROR_INVALID_ARGUMENT, "grad");
  CASE_P(pc.grad.numel = 513, LOWBIT_ERROR_INVALID_ARGUMENT, "numel");
  CASE_P(pc.grad.dtype = (lowbit_dtype_t)17, LOWBIT_ERROR_INVALID_ARGUMENT, "dtype");
  CASE_P(pc.grad.device = (lowbit_device_t)3, LOWBIT_ERROR_INVALID_ARGUMENT, "device");
  CASE_P(pc.group = 2, LOWBIT_ERROR_INVALID_ARGUMENT, "group");
  CASE_P(pc.group = -1, LOWBIT_ERROR_INVALID_ARGUMENT, "group");
  CASE_P(pc.state_format = (lowbit_state_format_t)8, LOWBIT_ERROR_INVALID_ARGUMENT, "state_format");
  CASE_P(pc.second_state_format = (lowbit_state_format_t)-4, LOWBIT_ERROR_INVALID_ARGUMENT, "state_format");
  CASE_P(pc.stochastic_rounding = 2, LOWBIT_ERROR_INVALID_ARGUMENT, "stochastic_rounding");
  CASE_P(pc.error_correction = -2, LOWBIT_ERROR_INVALID_ARGUMENT, "error_correction");
  /* the same pointer twice, and overlapping ranges */
  CASE_P(pc.param = make_tensor(f.p[0], kNumel[0], kPdt[0]), LOWBIT_ERROR_INVALID_ARGUMENT, "param");
  CASE_P(pc.param = make_tensor(f.p[1], 10, LOWBIT_DTYPE_BFLOAT16), LOWBIT_ERROR_INVALID_ARGUMENT, "param");
  CASE_P(pc.param = make_tensor((float*)f.p[0] + 500, 512, LOWBIT_DTYPE_FLOAT32), LOWBIT_ERROR_INVALID_ARGUMENT,
         "param");
  CASE_P(pc.param = make_tensor((float*)f.p[2] - 100, 512, LOWBIT_DTYPE_FLOAT32), LOWBIT_ERROR_INVALID_ARGUMENT,
         "param");
  CASE_P(pc.param = make_tensor((uint16_t*)f.p[1] + 4999, 1, LOWBIT_DTYPE_BFLOAT16), LOWBIT_ERROR_INVALID_ARGUMENT,
         "param");
  CASE_P(pc.param = make_tensor((char*)f.p[0] - 2 * 512 + 4, 512, LOWBIT_DTYPE_FLOAT16), LOWBIT_ERROR_INVALID_ARGUMENT,
         "param");
#undef CASE_P
  BAD(&f, &s, lowbit_optimizer_add_param(f.opt, NULL, &id), LOWBIT_ERROR_NULL_POINTER, "config");
  assert_int_equal(id, -7);
  /* adjacent (touching, not overlapping) ranges are fine: register one, then
   * it must be usable; done on a separate optimizer to keep the fixture intact */
  {
    lowbit_optimizer_config_t oc;
    CHECK_OK(NULL, lowbit_optimizer_config_init(&oc, LOWBIT_ALGORITHM_ADAMW));
    lowbit_hparams_t h;
    CHECK_OK(NULL, lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW));
    lowbit_optimizer_t o2 = NULL;
    CHECK_OK(NULL, lowbit_optimizer_create(&o2, &oc, &h));
    lowbit_param_config_t a, b;
    CHECK_OK(o2, lowbit_param_config_init(&a));
    CHECK_OK(o2, lowbit_param_config_init(&b));
    a.param = make_tensor(fresh, 256, LOWBIT_DTYPE_FLOAT32);
    b.param = make_tensor(fresh + 256, 256, LOWBIT_DTYPE_FLOAT32);
    int64_t ia, ib;
    CHECK_OK(o2, lowbit_optimizer_add_param(o2, &a, &ia));
    CHECK_OK(o2, lowbit_optimizer_add_param(o2, &b, &ib));
    assert_int_equal(ib, 1);
    lowbit_optimizer_destroy(o2);
  }
  snap_free(&s);
  final_good_step(&f, seed);
  free(fresh);
  free(fresh_g);
  fixture_free(&f);
}

/* ------------------------------------------------------------------ grads and steps */

static void test_grads_and_steps(void** state) {
  (void)state;
  uint64_t seed = case_seed("grads_steps");
  fixture_t f;
  fixture_init(&f, seed);
  snapshot_t s;
  snap_take(&f, &s);
  lowbit_tensor_t good[NP];
  for (int i = 0; i < NP; ++i) good[i] = make_tensor(f.g[i], kNumel[i], kGdt[i]);
  lowbit_tensor_t bad_t;
  /* set_grad */
  BAD(&f, &s, lowbit_optimizer_set_grad(f.opt, 3, &good[0]), LOWBIT_ERROR_INVALID_ARGUMENT, "param");
  BAD(&f, &s, lowbit_optimizer_set_grad(f.opt, -1, &good[0]), LOWBIT_ERROR_INVALID_ARGUMENT, "param");
  BAD(&f, &s, lowbit_optimizer_set_grad(f.opt, 1, &good[0]), LOWBIT_ERROR_INVALID_ARGUMENT, "numel");
  bad_t = good[0];
  bad_t.numel = -1;
  BAD(&f, &s, lowbit_optimizer_set_grad(f.opt, 0, &bad_t), LOWBIT_ERROR_INVALID_ARGUMENT, "numel");
  bad_t = good[0];
  bad_t.dtype = (lowbit_dtype_t)5;
  BAD(&f, &s, lowbit_optimizer_set_grad(f.opt, 0, &bad_t), LOWBIT_ERROR_INVALID_ARGUMENT, "dtype");
  bad_t = good[0];
  bad_t.device = LOWBIT_DEVICE_CUDA;
  BAD(&f, &s, lowbit_optimizer_set_grad(f.opt, 0, &bad_t), LOWBIT_ERROR_INVALID_ARGUMENT, "device");
  /* the registered grads are still the good ones: a step now must be the
   * twin's step, checked at the end (nothing above took effect) */

  /* step_with_grads: a bad entry anywhere refuses the whole step */
  lowbit_tensor_t grads[NP];
  for (int k = 0; k < NP; ++k) {
    memcpy(grads, good, sizeof grads);
    grads[k].numel = kNumel[k] + 1;
    BAD(&f, &s, lowbit_optimizer_step_with_grads(f.opt, grads, NP, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "numel");
    memcpy(grads, good, sizeof grads);
    grads[k].dtype = (lowbit_dtype_t)0;
    BAD(&f, &s, lowbit_optimizer_step_with_grads(f.opt, grads, NP, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "dtype");
    memcpy(grads, good, sizeof grads);
    grads[k].device = LOWBIT_DEVICE_CUDA;
    BAD(&f, &s, lowbit_optimizer_step_with_grads(f.opt, grads, NP, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "device");
  }
  BAD(&f, &s, lowbit_optimizer_step_with_grads(f.opt, good, NP - 1, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "num_grads");
  BAD(&f, &s, lowbit_optimizer_step_with_grads(f.opt, good, NP + 1, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "num_grads");
  BAD(&f, &s, lowbit_optimizer_step_with_grads(f.opt, good, -1, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "num_grads");
  BAD(&f, &s, lowbit_optimizer_step_with_grads(f.opt, NULL, NP, NULL), LOWBIT_ERROR_NULL_POINTER, "grads");
  snap_free(&s);
  final_good_step(&f, seed);
  fixture_free(&f);
}

/* A step before any parameter is registered: INVALID_STATE; the optimizer
 * stays usable. */
static void test_step_without_params(void** state) {
  (void)state;
  lowbit_optimizer_config_t oc;
  CHECK_OK(NULL, lowbit_optimizer_config_init(&oc, LOWBIT_ALGORITHM_LION));
  lowbit_hparams_t h;
  CHECK_OK(NULL, lowbit_hparams_init(&h, LOWBIT_ALGORITHM_LION));
  lowbit_optimizer_t opt = NULL;
  CHECK_OK(NULL, lowbit_optimizer_create(&opt, &oc, &h));
  EXPECT(lowbit_optimizer_step(opt, NULL), LOWBIT_ERROR_INVALID_STATE, lowbit_optimizer_last_error(opt),
               "param", "step with no params");
  lowbit_tensor_t none = make_tensor(NULL, 1, LOWBIT_DTYPE_FLOAT32);
  lowbit_status_t st = lowbit_optimizer_step_with_grads(opt, &none, 0, NULL);
  assert_true(st == LOWBIT_ERROR_INVALID_STATE || st == LOWBIT_ERROR_INVALID_ARGUMENT);
  int64_t n = -1, bytes = -1;
  CHECK_OK(opt, lowbit_optimizer_num_params(opt, &n));
  assert_int_equal(n, 0);
  CHECK_OK(opt, lowbit_optimizer_state_bytes(opt, -1, &bytes));
  assert_int_equal(bytes, 0);
  /* then it works */
  float p[3] = {1.f, -2.f, 0.f}, g[3] = {0.5f, 0.5f, -0.5f};
  lowbit_param_config_t pc;
  CHECK_OK(opt, lowbit_param_config_init(&pc));
  pc.param = make_tensor(p, 3, LOWBIT_DTYPE_FLOAT32);
  pc.grad = make_tensor(g, 3, LOWBIT_DTYPE_FLOAT32);
  int64_t id;
  CHECK_OK(opt, lowbit_optimizer_add_param(opt, &pc, &id));
  CHECK_OK(opt, lowbit_optimizer_step(opt, NULL));
  assert_true(p[0] == 1.f - h.lr && p[1] == -2.f - h.lr && p[2] == h.lr);
  /* "the last failed call": still the message of the refused step */
  assert_non_null(strstr(lowbit_optimizer_last_error(opt), "param"));
  lowbit_optimizer_destroy(opt);
}

/* ------------------------------------------------------------------ queries */

static void test_queries(void** state) {
  (void)state;
  uint64_t seed = case_seed("queries");
  fixture_t f;
  fixture_init(&f, seed);
  snapshot_t s;
  snap_take(&f, &s);
  float* buf = calloc(5000, 4);
  lowbit_param_info_t info;
  int64_t i64;
  BAD(&f, &s, lowbit_optimizer_read_moment(f.opt, 3, 0, buf, 1000, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "param");
  BAD(&f, &s, lowbit_optimizer_read_moment(f.opt, -1, 0, buf, 1000, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "param");
  BAD(&f, &s, lowbit_optimizer_read_moment(f.opt, 0, 2, buf, 1000, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "moment");
  BAD(&f, &s, lowbit_optimizer_read_moment(f.opt, 0, -1, buf, 1000, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "moment");
  BAD(&f, &s, lowbit_optimizer_read_moment(f.opt, 0, 0, buf, 999, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "numel");
  BAD(&f, &s, lowbit_optimizer_read_moment(f.opt, 1, 0, buf, 5001, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "numel");
  BAD(&f, &s, lowbit_optimizer_read_moment(f.opt, 0, 0, NULL, 1000, NULL), LOWBIT_ERROR_NULL_POINTER, "out");
  info.struct_size = sizeof info;
  BAD(&f, &s, lowbit_optimizer_param_info(f.opt, 3, &info), LOWBIT_ERROR_INVALID_ARGUMENT, "param");
  BAD(&f, &s, lowbit_optimizer_param_info(f.opt, 0, NULL), LOWBIT_ERROR_NULL_POINTER, "out");
  info.struct_size = 8;
  BAD(&f, &s, lowbit_optimizer_param_info(f.opt, 0, &info), LOWBIT_ERROR_INVALID_ARGUMENT, "struct_size");
  BAD(&f, &s, lowbit_optimizer_state_bytes(f.opt, 3, &i64), LOWBIT_ERROR_INVALID_ARGUMENT, "param");
  BAD(&f, &s, lowbit_optimizer_state_bytes(f.opt, -2, &i64), LOWBIT_ERROR_INVALID_ARGUMENT, "param");
  BAD(&f, &s, lowbit_optimizer_state_bytes(f.opt, 0, NULL), LOWBIT_ERROR_NULL_POINTER, "out");
  BAD(&f, &s, lowbit_optimizer_num_params(f.opt, NULL), LOWBIT_ERROR_NULL_POINTER, "out");
  BAD(&f, &s, lowbit_optimizer_last_step_skipped(f.opt, NULL), LOWBIT_ERROR_NULL_POINTER, "out");
  /* Lion / plain SGD: moments they do not have */
  {
    lowbit_optimizer_config_t oc;
    CHECK_OK(NULL, lowbit_optimizer_config_init(&oc, LOWBIT_ALGORITHM_LION));
    lowbit_hparams_t h;
    CHECK_OK(NULL, lowbit_hparams_init(&h, LOWBIT_ALGORITHM_LION));
    lowbit_optimizer_t o2 = NULL;
    CHECK_OK(NULL, lowbit_optimizer_create(&o2, &oc, &h));
    lowbit_param_config_t pc;
    CHECK_OK(o2, lowbit_param_config_init(&pc));
    pc.param = make_tensor(buf, 100, LOWBIT_DTYPE_FLOAT32);
    int64_t id;
    CHECK_OK(o2, lowbit_optimizer_add_param(o2, &pc, &id));
    float m[100];
    CHECK_OK(o2, lowbit_optimizer_read_moment(o2, 0, 0, m, 100, NULL));
    EXPECT(lowbit_optimizer_read_moment(o2, 0, 1, m, 100, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                 lowbit_optimizer_last_error(o2), "moment", "Lion second moment");
    lowbit_optimizer_destroy(o2);
  }
  /* a successful call after a failure: the per-handle message is about the
   * failure until the next failure (documented: "last failed call") or is
   * cleared; either way it stays a valid string */
  CHECK_OK(f.opt, lowbit_optimizer_num_params(f.opt, &i64));
  assert_non_null(lowbit_optimizer_last_error(f.opt));
  free(buf);
  snap_free(&s);
  final_good_step(&f, seed);
  fixture_free(&f);
}

/* Distinct handles are independent: an error on one leaves the other's
 * message alone; the thread-local message is only for NULL handles and
 * failed creates. */
static void test_error_isolation(void** state) {
  (void)state;
  uint64_t seed = case_seed("isolation");
  fixture_t a, b;
  fixture_init(&a, seed);
  fixture_init(&b, seed + 1);
  EXPECT(lowbit_optimizer_set_lr(a.opt, 9, 1.f), LOWBIT_ERROR_INVALID_ARGUMENT,
               lowbit_optimizer_last_error(a.opt), "group", "set_lr group 9");
  assert_string_equal(lowbit_optimizer_last_error(b.opt), "");
  EXPECT(lowbit_optimizer_set_lr(b.opt, 0, -2.f), LOWBIT_ERROR_INVALID_ARGUMENT,
               lowbit_optimizer_last_error(b.opt), "lr", "set_lr -2");
  assert_non_null(strstr(lowbit_optimizer_last_error(a.opt), "group"));
  fixture_free(&a);
  fixture_free(&b);
}

/* lowbit_last_error() is thread-local: a failure on one thread does not
 * show on another. */
static void* provoke_null_handle_error(void* arg) {
  (void)arg;
  lowbit_status_t st = lowbit_optimizer_step(NULL, NULL);
  static int ok;
  ok = st == LOWBIT_ERROR_NULL_POINTER && strstr(lowbit_last_error(), "opt") != NULL;
  return &ok;
}

static void test_thread_local_error(void** state) {
  (void)state;
  lowbit_hparams_t h;
  EXPECT(lowbit_hparams_init(&h, (lowbit_algorithm_t)123), LOWBIT_ERROR_INVALID_ARGUMENT, lowbit_last_error(),
         "algorithm", "hparams_init(123)");
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, provoke_null_handle_error, NULL), 0);
  void* ret = NULL;
  pthread_join(th, &ret);
  assert_true(*(int*)ret);
  /* this thread still sees its own message */
  assert_non_null(strstr(lowbit_last_error(), "algorithm"));
  assert_null(strstr(lowbit_last_error(), "opt"));
}

int main(void) {
  test_seed_init("test_bad_input");
  if (getenv("LOWBIT_TEST_FILTER")) cmocka_set_test_filter(getenv("LOWBIT_TEST_FILTER"));
  g_rng = test_rng("bad_input");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_strings_and_version),
      cmocka_unit_test(test_destroy_null_and_null_handles),
      cmocka_unit_test(test_create),
      cmocka_unit_test(test_num_threads_bound),
      cmocka_unit_test(test_huge_numel),
      cmocka_unit_test(test_hparams_on_live_optimizer),
      cmocka_unit_test(test_sgd_momentum_change),
      cmocka_unit_test(test_add_param),
      cmocka_unit_test(test_grads_and_steps),
      cmocka_unit_test(test_step_without_params),
      cmocka_unit_test(test_queries),
      cmocka_unit_test(test_error_isolation),
      cmocka_unit_test(test_thread_local_error),
  };
  return cmocka_run_group_tests_name("bad_input", tests, NULL, NULL);
}
