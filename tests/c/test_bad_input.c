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
 * (Params, grads, steps, queries and the error's thread:
 * test_bad_input_params.c.) Every test ends with a good step on the abused optimizer and on a twin that
 * never saw a bad call: both must be bit-identical, and the step must match
 * the float64 reference (proving nothing was corrupted).
 */
#include <pthread.h>

#include "bad_input_fixture.h"

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
    CASE_C(oc.state_format = (lowbit_state_format_t)8, LOWBIT_ERROR_INVALID_ARGUMENT, "state_format");  /* past 4BIT_DYN */
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
  };
  return cmocka_run_group_tests_name("bad_input", tests, NULL, NULL);
}
