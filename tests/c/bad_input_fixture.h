/* The fixture of the bad-input suites (test_bad_input.c,
 * test_bad_input_params.c; see test_bad_input.c's header): a populated
 * optimizer, its snapshot, the check of a refused call, and the final good
 * step against a twin and the float64 reference. */
#ifndef LOWBIT_TESTS_BAD_INPUT_FIXTURE_H
#define LOWBIT_TESTS_BAD_INPUT_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

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

#endif
