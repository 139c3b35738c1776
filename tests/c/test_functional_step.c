/* The functional step (lowbit.h, "functional step") against the handle API:
 * the same bits for every algorithm x state format x normalisation x
 * param/grad dtype and rounding, over 3 steps on fresh random inputs (the
 * count given as a host value, as engine memory, or both), a non-finite
 * gradient skipped by both, and bad input that gets a status and changes
 * nothing: a state buffer one byte short, a plan of another format (the state
 * record), a misaligned buffer, a step count that differs from the state's.
 *
 * Built three times: for the CPU engine (liblowbit); with LOWBIT_TEST_CUDA
 * and LOWBIT_TEST_EMULATED for the CUDA engine under the host emulation
 * (tests/cuda; it also counts host waits and allocations); with
 * LOWBIT_TEST_CUDA alone against liblowbit on a GPU (exits 77 without one).
 * On CUDA the buffers are device memory, and the record and count checks are
 * the device's (a mismatch skips the step). Seed: LOWBIT_TEST_SEED
 * (tests/common/test_seed.h).
 */
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
#ifdef LOWBIT_TEST_EMULATED
#include "emu_counters.h"
#endif

#define NP 3
#define STEPS 3
static const int64_t kShape[NP][2] = {{1000, 0}, {48, 40}, {7, 0}};

static uint64_t rng_state;
static uint32_t next_u32(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 32);
}
static float uniform_pm1(void) { return (float)((double)next_u32() / 2147483648.0 - 1.0); }

static size_t dtype_size(lowbit_dtype_t d) { return d == LOWBIT_DTYPE_FLOAT32 ? 4 : 2; }

/* fp32 -> bf16 / fp16 by truncation of random values: any bits will do. */
static void fill_random(void* out, lowbit_dtype_t d, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    float x = uniform_pm1() * scale;
    if (d == LOWBIT_DTYPE_FLOAT32) {
      ((float*)out)[i] = x;
    } else if (d == LOWBIT_DTYPE_BFLOAT16) {
      uint32_t u;
      memcpy(&u, &x, 4);
      ((uint16_t*)out)[i] = (uint16_t)(u >> 16);
    } else {
      /* a random fp16 in about [-1, 1]: sign, exponent 5..15, mantissa */
      uint16_t h = (uint16_t)(((next_u32() & 1u) << 15) | ((5u + next_u32() % 10u) << 10) | (next_u32() & 0x3FFu));
      ((uint16_t*)out)[i] = h;
    }
  }
}

typedef struct {
  lowbit_algorithm_t algo;
  float momentum;
  int32_t nesterov;
  lowbit_state_format_t f0, f1;
  lowbit_normalization_t n0, n1;
  lowbit_dtype_t pdt, gdt;
  int32_t sr, ecc;
} case_t;

/* One param's functional state. */
typedef struct {
  lowbit_state_plan_t plan;
  lowbit_param_buffers_t b;
  void* param;
  void* grad;
} fstate_t;

typedef struct {
  case_t c;
  lowbit_optimizer_config_t config;
  lowbit_hparams_t hparams;
  lowbit_optimizer_t opt;
  void* hparam[NP];
  void* hgrad[NP];
  fstate_t f[NP];
  int32_t* records;
  int32_t* count; /* engine memory: in, out */
  lowbit_hparams_t* engine_hparams; /* engine memory: a copy of hparams */
  lowbit_step_context_t ctx;
} run_t;

static int64_t numel_of(int i) { return kShape[i][0] * (kShape[i][1] ? kShape[i][1] : 1); }

#define CHECK(call)                                                                                         \
  do {                                                                                                      \
    lowbit_status_t st_ = (call);                                                                           \
    if (st_ != LOWBIT_SUCCESS) fail_msg("%s: %s: %s", #call, lowbit_status_string(st_), lowbit_last_error()); \
  } while (0)

static void setup_run(run_t* r, const case_t* c) {
  memset(r, 0, sizeof *r);
  r->c = *c;
  lowbit_optimizer_config_init(&r->config, c->algo);
  r->config.device = DEVICE;
  r->config.state_format = c->f0;
  r->config.second_state_format = c->f1;
  r->config.first_normalization = c->n0;
  r->config.second_normalization = c->n1;
  r->config.min_quantized_numel = 0;
  r->config.seed = 1234;
  r->config.stochastic_rounding = c->sr;
  r->config.error_correction = c->ecc;
  r->config.num_threads = 2;
  lowbit_hparams_init(&r->hparams, c->algo);
  r->hparams.lr = 1e-2f;
  r->hparams.weight_decay = 0.05f;
  r->hparams.momentum = c->momentum;
  r->hparams.nesterov = c->nesterov;
  CHECK(lowbit_optimizer_create(&r->opt, &r->config, &r->hparams));
  CHECK(lowbit_step_context_create(&r->ctx, &r->config));
  r->records = dev_alloc(sizeof(int32_t) * LOWBIT_STATE_RECORD_INT32 * NP);
  r->count = dev_alloc(2 * sizeof(int32_t));
  r->engine_hparams = dev_alloc(sizeof(lowbit_hparams_t));
  to_dev(r->engine_hparams, &r->hparams, sizeof(lowbit_hparams_t));
  int32_t host_records[LOWBIT_STATE_RECORD_INT32 * NP];
  for (int i = 0; i < NP; ++i) {
    const int64_t n = numel_of(i);
    const size_t pbytes = (size_t)n * dtype_size(c->pdt), gbytes = (size_t)n * dtype_size(c->gdt);
    void* init = malloc(pbytes);
    fill_random(init, c->pdt, n, 1.f);
    r->hparam[i] = dev_alloc(pbytes);
    r->hgrad[i] = dev_alloc(gbytes);
    to_dev(r->hparam[i], init, pbytes);
    fstate_t* f = &r->f[i];
    f->param = dev_alloc(pbytes);
    f->grad = dev_alloc(gbytes);
    to_dev(f->param, init, pbytes);
    free(init);

    lowbit_param_config_t pc;
    lowbit_param_config_init(&pc);
    pc.param = (lowbit_tensor_t){r->hparam[i], n, c->pdt, DEVICE, 0};
    pc.grad = (lowbit_tensor_t){r->hgrad[i], n, c->gdt, DEVICE, 0};
    pc.ndim = kShape[i][1] ? 2 : 0;
    pc.shape[0] = kShape[i][0];
    pc.shape[1] = kShape[i][1];
    int64_t id;
    CHECK(lowbit_optimizer_add_param(r->opt, &pc, &id));
    assert_int_equal(id, i);

    lowbit_state_plan_init(&f->plan);
    CHECK(lowbit_plan_param_state(&r->config, &r->hparams, &pc, &f->plan));
    lowbit_param_buffers_init(&f->b);
    f->b.param = (lowbit_tensor_t){f->param, n, c->pdt, DEVICE, 0};
    f->b.grad = (lowbit_tensor_t){f->grad, n, c->gdt, DEVICE, 0};
    f->b.plan = &f->plan;
    f->b.ndim = pc.ndim;
    f->b.shape[0] = pc.shape[0];
    f->b.shape[1] = pc.shape[1];
    for (int m = 0; m < 2; ++m) {
      f->b.moment[m] = dev_alloc((size_t)f->plan.data_bytes[m]);
      f->b.moment_bytes[m] = f->plan.data_bytes[m];
      f->b.scales[m] = dev_alloc(sizeof(float) * (size_t)f->plan.scale_count[m]);
      f->b.scale_count[m] = f->plan.scale_count[m];
    }
    f->b.ecc = dev_alloc((size_t)f->plan.ecc_bytes);
    f->b.ecc_bytes = f->plan.ecc_bytes;
    CHECK(lowbit_state_record(&f->plan, pc.ndim, pc.shape, host_records + LOWBIT_STATE_RECORD_INT32 * i,
                              LOWBIT_STATE_RECORD_INT32));
  }
  to_dev(r->records, host_records, sizeof host_records);
}

static void teardown_run(run_t* r) {
  lowbit_optimizer_destroy(r->opt);
  lowbit_step_context_destroy(r->ctx);
  for (int i = 0; i < NP; ++i) {
    dev_free(r->hparam[i]);
    dev_free(r->hgrad[i]);
    dev_free(r->f[i].param);
    dev_free(r->f[i].grad);
    for (int m = 0; m < 2; ++m) {
      dev_free(r->f[i].b.moment[m]);
      dev_free(r->f[i].b.scales[m]);
    }
    dev_free(r->f[i].b.ecc);
  }
  dev_free(r->records);
  dev_free(r->count);
  dev_free(r->engine_hparams);
}

static lowbit_param_buffers_t buffers[NP];

/* The functional step of step `t` (steps applied so far); how the count
 * travels depends on t: host value, engine memory, or both; the
 * hyper-parameters are host values on even t, engine memory on odd t. */
static lowbit_status_t functional_step(run_t* r, int64_t t, lowbit_param_buffers_t* b) {
  lowbit_step_args_t a;
  lowbit_step_args_init(&a);
  if (t % 2)
    a.engine_hparams = r->engine_hparams;
  else
    a.hparams = &r->hparams;
  a.num_groups = 1;
  a.records = r->records;
  int32_t host_count[2] = {(int32_t)t, -7};
  to_dev(r->count, host_count, sizeof host_count);
  switch (t % 3) {
    case 0: a.step = t; break;
    case 1: a.count = r->count; a.count_out = r->count + 1; break;
    default: a.step = t; a.count = r->count; a.count_out = r->count; break;
  }
  return lowbit_functional_step(r->ctx, b, NP, &a, NULL);
}

static void new_grads(run_t* r, int nonfinite) {
  for (int i = 0; i < NP; ++i) {
    const int64_t n = numel_of(i);
    const size_t bytes = (size_t)n * dtype_size(r->c.gdt);
    void* g = malloc(bytes);
    fill_random(g, r->c.gdt, n, 0.5f);
    if (nonfinite && i == 1) {
      if (r->c.gdt == LOWBIT_DTYPE_FLOAT32)
        ((float*)g)[5] = 0.f / 0.f;
      else
        ((uint16_t*)g)[5] = r->c.gdt == LOWBIT_DTYPE_BFLOAT16 ? 0x7FC0 : 0x7E00;
    }
    to_dev(r->hgrad[i], g, bytes);
    to_dev(r->f[i].grad, g, bytes);
    free(g);
  }
}

static void expect_same_bits(run_t* r, const char* when) {
  sync_all();
  for (int i = 0; i < NP; ++i) {
    const int64_t n = numel_of(i);
    const size_t pbytes = (size_t)n * dtype_size(r->c.pdt);
    uint8_t* a = malloc(pbytes);
    uint8_t* b = malloc(pbytes);
    to_host(a, r->hparam[i], pbytes);
    to_host(b, r->f[i].param, pbytes);
    if (memcmp(a, b, pbytes) != 0) fail_msg("%s: param %d differs", when, i);
    free(a);
    free(b);
    const lowbit_state_plan_t* plan = &r->f[i].plan;
    float* ha = malloc(sizeof(float) * (size_t)n);
    float* hb = malloc(sizeof(float) * (size_t)n);
    for (int m = 0; m < plan->num_moments; ++m) {
      CHECK(lowbit_optimizer_read_moment(r->opt, i, m, ha, n, NULL));
      const size_t db = (size_t)plan->data_bytes[m], sc = (size_t)plan->scale_count[m];
      void* data = malloc(db ? db : 1);
      float* scales = malloc(sizeof(float) * (sc ? sc : 1));
      to_host(data, r->f[i].b.moment[m], db);
      to_host(scales, r->f[i].b.scales[m], sizeof(float) * sc);
      CHECK(lowbit_decode_moment(plan, m, r->f[i].b.ndim, r->f[i].b.shape, data, (int64_t)db, scales, (int64_t)sc,
                                 hb, n));
      if (memcmp(ha, hb, sizeof(float) * (size_t)n) != 0) fail_msg("%s: param %d moment %d differs", when, i, m);
      free(data);
      free(scales);
    }
    free(ha);
    free(hb);
    /* error-correction bytes are not readable through the handle: each
     * further step's params depend on them */
  }
}

static void run_case(const case_t* c) {
  run_t r;
  setup_run(&r, c);
  for (int i = 0; i < NP; ++i) buffers[i] = r.f[i].b;
  int64_t t = 0;
  for (int s = 0; s < STEPS + 1; ++s) {
    const int nonfinite = s == 1;
    new_grads(&r, nonfinite);
    CHECK(lowbit_optimizer_step(r.opt, NULL));
    CHECK(functional_step(&r, t, buffers));
    sync_all();
    int32_t skipped = -1, hskipped = -1, count[2];
    CHECK(lowbit_step_context_last_step_skipped(r.ctx, &skipped));
    CHECK(lowbit_optimizer_last_step_skipped(r.opt, &hskipped));
    assert_int_equal(skipped, nonfinite);
    assert_int_equal(hskipped, nonfinite);
    to_host(count, r.count, sizeof count);
    if (t % 3 == 1) assert_int_equal(count[1], t + (nonfinite ? 0 : 1));
    if (t % 3 == 2) assert_int_equal(count[0], t + (nonfinite ? 0 : 1));
    if (!nonfinite) ++t;
    char when[64];
    snprintf(when, sizeof when, "after step call %d", s);
    expect_same_bits(&r, when);
  }
  teardown_run(&r);
}

/* ---- the sweep */

static const lowbit_state_format_t kFormats[][2] = {
    {LOWBIT_STATE_FP32, LOWBIT_STATE_FP32}, {LOWBIT_STATE_BF16, LOWBIT_STATE_BF16},
    {LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT}, {LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT},
    {LOWBIT_STATE_FP8, LOWBIT_STATE_FP8},   {LOWBIT_STATE_4BIT_SR, LOWBIT_STATE_4BIT},
    {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT}, {LOWBIT_STATE_4BIT_DYN, LOWBIT_STATE_4BIT_DYN},
    {LOWBIT_STATE_4BIT_SR, LOWBIT_STATE_4BIT_DYN},
};
static const struct {
  lowbit_dtype_t pdt, gdt;
  int32_t sr, ecc;
} kDtypes[] = {
    {LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_FLOAT32, 0, 0},
    {LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_BFLOAT16, 1, 0},
    {LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_FLOAT32, 0, 1},
    {LOWBIT_DTYPE_FLOAT16, LOWBIT_DTYPE_FLOAT16, 0, 0},
};

static void sweep(lowbit_algorithm_t algo, float momentum, int32_t nesterov) {
  const int two = algo == LOWBIT_ALGORITHM_ADAMW || algo == LOWBIT_ALGORITHM_ADAM;
  int cases = 0;
  for (size_t f = 0; f < sizeof kFormats / sizeof kFormats[0]; ++f) {
    if (!two && kFormats[f][1] != kFormats[f][0] &&
        (kFormats[f][0] != LOWBIT_STATE_4BIT_SR || kFormats[f][1] != LOWBIT_STATE_4BIT))
      continue;
    for (int norm = 0; norm < 3; ++norm) {
      /* norm 1: rank-1 for every 8BIT / 4BIT moment; 2: factored v (AdamW / Adam) */
      lowbit_normalization_t n0 = LOWBIT_NORMALIZATION_BLOCK, n1 = LOWBIT_NORMALIZATION_BLOCK;
      if (norm == 1) {
        const int q0 = kFormats[f][0] == LOWBIT_STATE_8BIT || kFormats[f][0] == LOWBIT_STATE_4BIT ||
                       kFormats[f][0] == LOWBIT_STATE_4BIT_DYN;
        const int q1 = kFormats[f][1] == LOWBIT_STATE_8BIT || kFormats[f][1] == LOWBIT_STATE_4BIT ||
                       kFormats[f][1] == LOWBIT_STATE_4BIT_DYN;
        if (!q0 && !(two && q1)) continue;
        n0 = q0 ? LOWBIT_NORMALIZATION_RANK1 : n0;
        n1 = q1 ? LOWBIT_NORMALIZATION_RANK1 : n1;
      }
      if (norm == 2) {
        if (!two) continue;
        n1 = LOWBIT_NORMALIZATION_FACTORED;
      }
      for (size_t d = 0; d < sizeof kDtypes / sizeof kDtypes[0]; ++d) {
        const case_t c = {algo, momentum, nesterov, kFormats[f][0], kFormats[f][1], n0, n1,
                          kDtypes[d].pdt, kDtypes[d].gdt, kDtypes[d].sr, kDtypes[d].ecc};
        run_case(&c);
        ++cases;
      }
    }
  }
  printf("  %d cases: the functional step gives the handle's bits\n", cases);
}

static void test_adamw(void** s) { (void)s; sweep(LOWBIT_ALGORITHM_ADAMW, 0.f, 0); }
static void test_adam(void** s) { (void)s; sweep(LOWBIT_ALGORITHM_ADAM, 0.f, 0); }
static void test_lion(void** s) { (void)s; sweep(LOWBIT_ALGORITHM_LION, 0.f, 0); }
static void test_sgd_momentum(void** s) { (void)s; sweep(LOWBIT_ALGORITHM_SGD, 0.9f, 0); }
static void test_sgd_nesterov(void** s) { (void)s; sweep(LOWBIT_ALGORITHM_SGD, 0.9f, 1); }
static void test_sgd_plain(void** s) { (void)s; sweep(LOWBIT_ALGORITHM_SGD, 0.f, 0); }

/* ---- bad input: a status (CPU) or a skipped step (CUDA), nothing changed */

typedef struct {
  uint8_t* bytes[NP][6]; /* param, moment 0/1, scales 0/1, ecc */
  size_t size[NP][6];
  int32_t count[2];
} snapshot_t;

static void snapshot(run_t* r, snapshot_t* s) {
  sync_all();
  for (int i = 0; i < NP; ++i) {
    const fstate_t* f = &r->f[i];
    const void* src[6] = {f->param, f->b.moment[0], f->b.moment[1], f->b.scales[0], f->b.scales[1], f->b.ecc};
    const size_t size[6] = {(size_t)numel_of(i) * dtype_size(r->c.pdt), (size_t)f->plan.data_bytes[0],
                            (size_t)f->plan.data_bytes[1], 4 * (size_t)f->plan.scale_count[0],
                            4 * (size_t)f->plan.scale_count[1], (size_t)f->plan.ecc_bytes};
    for (int k = 0; k < 6; ++k) {
      s->size[i][k] = size[k];
      s->bytes[i][k] = malloc(size[k] ? size[k] : 1);
      to_host(s->bytes[i][k], src[k], size[k]);
    }
  }
  to_host(s->count, r->count, sizeof s->count);
}

static void expect_unchanged(run_t* r, snapshot_t* before, const char* what) {
  snapshot_t after;
  snapshot(r, &after);
  for (int i = 0; i < NP; ++i)
    for (int k = 0; k < 6; ++k) {
      if (memcmp(before->bytes[i][k], after.bytes[i][k], before->size[i][k]) != 0)
        fail_msg("%s: param %d part %d changed", what, i, k);
      free(before->bytes[i][k]);
      free(after.bytes[i][k]);
    }
  if (memcmp(before->count, after.count, sizeof before->count) != 0) fail_msg("%s: the count changed", what);
}

/* One bad call: on the CPU its status and message; on CUDA, where the device
 * makes the check, success and a skipped step (device_checked). */
static void expect_refused(run_t* r, lowbit_param_buffers_t* b, const lowbit_step_args_t* a, lowbit_status_t status,
                           const char* message_part, int device_checked, const char* what) {
  snapshot_t before;
  snapshot(r, &before);
  const lowbit_status_t st = lowbit_functional_step(r->ctx, b, NP, a, NULL);
#ifdef LOWBIT_TEST_CUDA
  if (device_checked) {
    assert_int_equal(st, LOWBIT_SUCCESS);
    sync_all();
    int32_t skipped = 0;
    CHECK(lowbit_step_context_last_step_skipped(r->ctx, &skipped));
    if (!skipped) fail_msg("%s: the step was not skipped", what);
    expect_unchanged(r, &before, what);
    return;
  }
#else
  (void)device_checked;
#endif
  if (st != status) fail_msg("%s: status %s, expected %s (%s)", what, lowbit_status_string(st), lowbit_status_string(status),
                             lowbit_step_context_last_error(r->ctx));
  if (!strstr(lowbit_step_context_last_error(r->ctx), message_part))
    fail_msg("%s: message \"%s\" does not name \"%s\"", what, lowbit_step_context_last_error(r->ctx), message_part);
  expect_unchanged(r, &before, what);
}

static void test_bad_input(void** s) {
  (void)s;
  const case_t c = {LOWBIT_ALGORITHM_ADAMW, 0.f, 0, LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT, LOWBIT_NORMALIZATION_BLOCK,
                    LOWBIT_NORMALIZATION_BLOCK, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_BFLOAT16, 0, 1};
  run_t r;
  setup_run(&r, &c);
  new_grads(&r, 0);
  for (int i = 0; i < NP; ++i) buffers[i] = r.f[i].b;
  CHECK(functional_step(&r, 0, buffers)); /* a state with something in it */
  new_grads(&r, 0);
  int32_t count[2] = {1, 1};
  to_dev(r.count, count, sizeof count);

  lowbit_step_args_t a;
  lowbit_step_args_init(&a);
  a.hparams = &r.hparams;
  a.num_groups = 1;
  a.records = r.records;
  a.count = r.count;
  a.count_out = r.count;

  /* a state buffer one byte short */
  buffers[1].moment_bytes[1] -= 1;
  expect_refused(&r, buffers, &a, LOWBIT_ERROR_BUFFER_TOO_SMALL, "params[1].moment[1]", 0, "one byte short");
  buffers[1] = r.f[1].b;
  buffers[2].ecc_bytes -= 1;
  expect_refused(&r, buffers, &a, LOWBIT_ERROR_BUFFER_TOO_SMALL, "params[2].ecc", 0, "ecc one byte short");
  buffers[2] = r.f[2].b;

  /* a plan of another format: FP8 has 8BIT's sizes, the record tells them apart */
  lowbit_state_plan_t other = r.f[0].plan;
  other.format[0] = LOWBIT_STATE_FP8;
  buffers[0].plan = &other;
  expect_refused(&r, buffers, &a, LOWBIT_ERROR_STATE_MISMATCH, "the state was made for", 1, "plan of another format");
  buffers[0] = r.f[0].b;
  /* and a plan whose sizes are another format's */
  other = r.f[0].plan;
  other.format[1] = LOWBIT_STATE_4BIT;
  buffers[0].plan = &other;
  expect_refused(&r, buffers, &a, LOWBIT_ERROR_INVALID_ARGUMENT, "params[0].plan gives moment 1", 0,
                 "plan with another format's sizes");
  buffers[0] = r.f[0].b;

  /* a misaligned buffer */
  buffers[1].scales[0] = (float*)((char*)buffers[1].scales[0] + 1);
  expect_refused(&r, buffers, &a, LOWBIT_ERROR_INVALID_ARGUMENT, "params[1].scales[0] is not aligned", 0,
                 "misaligned scales");
  buffers[1] = r.f[1].b;
  buffers[0].param.data = (char*)buffers[0].param.data + 1;
  expect_refused(&r, buffers, &a, LOWBIT_ERROR_INVALID_ARGUMENT, "params[0].param.data is not aligned", 0,
                 "misaligned param");
  buffers[0] = r.f[0].b;

  /* hyper-parameters: a bad one in engine memory, none, both */
  lowbit_hparams_t bad = r.hparams;
  bad.beta1 = 1.5f;
  to_dev(r.engine_hparams, &bad, sizeof bad);
  a.hparams = NULL;
  a.engine_hparams = r.engine_hparams;
  expect_refused(&r, buffers, &a, LOWBIT_ERROR_INVALID_ARGUMENT, "args.engine_hparams[0]: beta1 = 1.5", 1,
                 "bad engine hparams");
  to_dev(r.engine_hparams, &r.hparams, sizeof bad);
  a.engine_hparams = NULL;
  expect_refused(&r, buffers, &a, LOWBIT_ERROR_INVALID_ARGUMENT, "neither args.hparams nor args.engine_hparams", 0,
                 "no hparams");
  a.hparams = &r.hparams;
  a.engine_hparams = r.engine_hparams;
  expect_refused(&r, buffers, &a, LOWBIT_ERROR_INVALID_ARGUMENT, "both set", 0, "both hparams");
  a.engine_hparams = NULL;

  /* a step count that is not the state's */
  a.step = 5;
  expect_refused(&r, buffers, &a, LOWBIT_ERROR_STATE_MISMATCH, "args.step = 5", 1, "step count mismatch");
  a.step = -1;

  /* Issue 45 (8): an 8-D shape whose dims' product overflows int64
   * (65536^8 = 2^128 wrapped to 0) on a param of 0 elements is refused, not
   * taken for 0 elements (the call then stepped the other params) */
  {
    lowbit_param_config_t pc;
    lowbit_param_config_init(&pc);
    pc.param = (lowbit_tensor_t){NULL, 0, c.pdt, DEVICE, 0};
    pc.grad = (lowbit_tensor_t){NULL, 0, c.gdt, DEVICE, 0};
    lowbit_state_plan_t empty;
    lowbit_state_plan_init(&empty);
    CHECK(lowbit_plan_param_state(&r.config, &r.hparams, &pc, &empty));
    int32_t saved[NP * LOWBIT_STATE_RECORD_INT32], rec[NP * LOWBIT_STATE_RECORD_INT32];
    to_host(saved, r.records, sizeof saved);
    memcpy(rec, saved, sizeof rec);
    CHECK(lowbit_state_record(&empty, 0, NULL, rec + 2 * LOWBIT_STATE_RECORD_INT32, LOWBIT_STATE_RECORD_INT32));
    to_dev(r.records, rec, sizeof rec);
    lowbit_param_buffers_init(&buffers[2]);
    buffers[2].param = (lowbit_tensor_t){r.f[2].param, 0, c.pdt, DEVICE, 0};
    buffers[2].grad = (lowbit_tensor_t){r.f[2].grad, 0, c.gdt, DEVICE, 0};
    buffers[2].plan = &empty;
    buffers[2].ndim = 8;
    for (int k = 0; k < 8; ++k) buffers[2].shape[k] = 65536;
    expect_refused(&r, buffers, &a, LOWBIT_ERROR_INVALID_ARGUMENT, "params[2]: shape (65536, 65536", 0,
                   "8-D shape overflowing int64");
    if (!strstr(lowbit_step_context_last_error(r.ctx), "more elements than int64 holds"))
      fail_msg("8-D shape: \"%s\" does not say it overflows", lowbit_step_context_last_error(r.ctx));
    to_dev(r.records, saved, sizeof saved);
    buffers[2] = r.f[2].b;
  }

  /* Issue 45 (13): args.reserved0 must be 0; a refused struct is named by
   * its index, not "params[i]" */
  a.reserved0 = 1;
  expect_refused(&r, buffers, &a, LOWBIT_ERROR_INVALID_ARGUMENT, "args.reserved0 = 1 must be 0", 0, "reserved0");
  a.reserved0 = 0;
  buffers[1].struct_size = 8;
  buffers[0].struct_size = sizeof(lowbit_param_buffers_t);
  expect_refused(&r, buffers, &a, LOWBIT_ERROR_INVALID_ARGUMENT, "params[1].struct_size = 8", 0,
                 "params[1] of a size never released");
  buffers[1] = r.f[1].b;
  {
    lowbit_state_plan_t bad_plan = *buffers[2].plan;
    bad_plan.struct_size = 12;
    buffers[2].plan = &bad_plan;
    expect_refused(&r, buffers, &a, LOWBIT_ERROR_INVALID_ARGUMENT, "params[2].plan.struct_size = 12", 0,
                   "params[2].plan of a size never released");
    buffers[2] = r.f[2].b;
    lowbit_hparams_t two[2] = {r.hparams, r.hparams};
    two[1].struct_size = 20;
    a.hparams = two;
    a.num_groups = 2;
    expect_refused(&r, buffers, &a, LOWBIT_ERROR_INVALID_ARGUMENT, "args.hparams[1].struct_size = 20", 0,
                   "args.hparams[1] of a size never released");
    a.hparams = &r.hparams;
    a.num_groups = 1;
  }

  /* and the good call still works, from the same state */
  CHECK(lowbit_functional_step(r.ctx, buffers, NP, &a, NULL));
  sync_all();
  to_host(count, r.count, sizeof count);
  assert_int_equal(count[0], 2);
  teardown_run(&r);
}

/* lowbit_decode_moment refuses a plan or shape it cannot decode and writes
 * nothing: issue 45 (9) a normalisation that is no lowbit_normalization_t
 * (7 was decoded as blocks) or one the plans never give for the moment's
 * format; (8) an 8-D shape whose product overflows int64 (reported as a
 * wrapped element count). */
static void test_decode_moment_refuses_bad_plans(void** s) {
  (void)s;
  lowbit_optimizer_config_t cfg;
  lowbit_optimizer_config_init(&cfg, LOWBIT_ALGORITHM_ADAMW);
  cfg.state_format = LOWBIT_STATE_8BIT;
  cfg.min_quantized_numel = 0;
  lowbit_hparams_t hp;
  lowbit_hparams_init(&hp, LOWBIT_ALGORITHM_ADAMW);
  enum { N = 48 * 40 };
  lowbit_param_config_t pc;
  lowbit_param_config_init(&pc);
  pc.param = (lowbit_tensor_t){NULL, N, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  pc.ndim = 2;
  pc.shape[0] = 48;
  pc.shape[1] = 40;
  lowbit_state_plan_t plan;
  lowbit_state_plan_init(&plan);
  CHECK(lowbit_plan_param_state(&cfg, &hp, &pc, &plan));
  assert_int_equal(plan.normalization[0], LOWBIT_NORMALIZATION_BLOCK);
  uint8_t codes[N];
  float scales[N / 256 + 1];
  for (int i = 0; i < N; ++i) codes[i] = (uint8_t)next_u32();
  for (size_t i = 0; i < sizeof scales / sizeof scales[0]; ++i) scales[i] = 1.f + (float)i;
  static float out[N];
  CHECK(lowbit_decode_moment(&plan, 0, 2, pc.shape, codes, N, scales, plan.scale_count[0], out, N));

  struct {
    lowbit_normalization_t n0, n1;
    int32_t moment, ndim;
    int64_t dim;
    const char* message;
  } bad[] = {
      {(lowbit_normalization_t)7, LOWBIT_NORMALIZATION_BLOCK, 0, 2, 0, "plan->normalization[0] = 7"},
      {(lowbit_normalization_t)-1, LOWBIT_NORMALIZATION_BLOCK, 0, 2, 0, "plan->normalization[0] = -1"},
      {LOWBIT_NORMALIZATION_DEFAULT, LOWBIT_NORMALIZATION_BLOCK, 0, 2, 0, "plan->normalization[0] = 0"},
      {LOWBIT_NORMALIZATION_FACTORED, LOWBIT_NORMALIZATION_BLOCK, 0, 2, 0, "FACTORED but the moment is 8bit moment 0"},
      {LOWBIT_NORMALIZATION_BLOCK, LOWBIT_NORMALIZATION_FACTORED, 1, 2, 0, "FACTORED but the moment is 8bit moment 1"},
      {LOWBIT_NORMALIZATION_RANK1, LOWBIT_NORMALIZATION_BLOCK, 0, 8, 65536, "more elements than int64 holds"},
      {LOWBIT_NORMALIZATION_RANK1, LOWBIT_NORMALIZATION_BLOCK, 0, 8, 2147483647, "more elements than int64 holds"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; ++k) {
    lowbit_state_plan_t p = plan;
    p.normalization[0] = bad[k].n0;
    p.normalization[1] = bad[k].n1;
    int64_t shape[8] = {48, 40};
    if (bad[k].dim)
      for (int d = 0; d < 8; ++d) shape[d] = bad[k].dim;
    for (int i = 0; i < N; ++i) out[i] = -7.f;
    const lowbit_status_t st =
        lowbit_decode_moment(&p, bad[k].moment, bad[k].ndim, shape, codes, N, scales, plan.scale_count[0], out, N);
    if (st != LOWBIT_ERROR_INVALID_ARGUMENT || !strstr(lowbit_last_error(), bad[k].message))
      fail_msg("case %d: %s \"%s\", expected INVALID_ARGUMENT naming \"%s\"", (int)k, lowbit_status_string(st),
               lowbit_last_error(), bad[k].message);
    for (int i = 0; i < N; ++i)
      if (out[i] != -7.f) fail_msg("case %d: out[%d] was written", (int)k, i);
  }
  /* a rank-1 fp32 moment: refused (rank-1 scales are for codes) */
  lowbit_state_plan_t p = plan;
  p.format[0] = LOWBIT_STATE_FP32;
  p.normalization[0] = LOWBIT_NORMALIZATION_RANK1;
  assert_int_equal(lowbit_decode_moment(&p, 0, 2, pc.shape, codes, N, scales, plan.scale_count[0], out, N),
                   LOWBIT_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(lowbit_last_error(), "RANK1 but the moment is fp32"));
}

#ifdef LOWBIT_TEST_EMULATED
/* On CUDA a functional step only enqueues: after the first call with a given
 * number of params, no host wait, no allocation or free, no copy from
 * pageable memory (the emulation's counters), for every way of passing the
 * count and the hyper-parameters, and a skipped (NaN) step too. */
static void test_no_host_wait(void** s) {
  (void)s;
  const case_t c = {LOWBIT_ALGORITHM_ADAMW, 0.f, 0, LOWBIT_STATE_4BIT_SR, LOWBIT_STATE_4BIT, LOWBIT_NORMALIZATION_BLOCK,
                    LOWBIT_NORMALIZATION_RANK1, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_BFLOAT16, 1, 0};
  run_t r;
  setup_run(&r, &c);
  for (int i = 0; i < NP; ++i) buffers[i] = r.f[i].b;
  new_grads(&r, 0);
  cudaStream_t stream;
  assert_int_equal(cudaStreamCreate(&stream), cudaSuccess);
  lowbit_step_args_t a;
  lowbit_step_args_init(&a);
  a.hparams = &r.hparams;
  a.num_groups = 1;
  a.records = r.records;
  a.step = 0;
  CHECK(lowbit_functional_step(r.ctx, buffers, NP, &a, stream)); /* the first call may allocate */
  sync_all();
  for (int k = 1; k < 7; ++k) {
    if (k == 5) new_grads(&r, 1);
    lowbit_step_args_init(&a);
    a.num_groups = 1;
    a.records = r.records;
    if (k % 2)
      a.engine_hparams = r.engine_hparams;
    else
      a.hparams = &r.hparams;
    if (k % 3 == 0) {
      a.step = k;
    } else {
      a.count = r.count;
      a.count_out = r.count;
    }
    lowbit_emu_reset_counters();
    CHECK(lowbit_functional_step(r.ctx, buffers, NP, &a, k % 2 ? stream : NULL));
    if (lowbit_emu_host_syncs() || lowbit_emu_allocations() || lowbit_emu_frees() || lowbit_emu_pageable_copies())
      fail_msg("step %d: %lld host waits, %lld allocations, %lld frees, %lld pageable copies", k,
               (long long)lowbit_emu_host_syncs(), (long long)lowbit_emu_allocations(), (long long)lowbit_emu_frees(),
               (long long)lowbit_emu_pageable_copies());
    sync_all();
  }
  int32_t skipped = 0;
  CHECK(lowbit_step_context_last_step_skipped(r.ctx, &skipped));
  assert_int_equal(skipped, 1); /* the last steps had a NaN gradient */
  cudaStreamDestroy(stream);
  teardown_run(&r);
}
#endif

int main(int argc, char** argv) {
  rng_state = lowbit_test_seed("test_functional_step") | 1u;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_input),    cmocka_unit_test(test_adamw),        cmocka_unit_test(test_adam),
      cmocka_unit_test(test_lion),         cmocka_unit_test(test_sgd_momentum), cmocka_unit_test(test_sgd_nesterov),
      cmocka_unit_test(test_sgd_plain),    cmocka_unit_test(test_decode_moment_refuses_bad_plans),
#ifdef LOWBIT_TEST_EMULATED
      cmocka_unit_test(test_no_host_wait),
#endif
  };
  (void)argc;
  (void)argv;
  if (skip_without_gpu()) return 77;
  return cmocka_run_group_tests(tests, NULL, NULL);
}
