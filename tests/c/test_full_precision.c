/* Issue 2: full-precision optimizers (fp32 and bf16 state) against an
 * independent float64 reference.
 *
 * Every algorithm (AdamW, Adam, Lion, SGD with momentum, SGD Nesterov, plain
 * SGD) x state {FP32, BF16} x param dtype {fp32, bf16, fp16}, with grads of
 * the same and of another dtype, sizes 1, 7, 4097 (and 2^20+3 for a few
 * steps), two parameter groups with different hyper-parameters (one without
 * bias correction), an lr schedule (set_lr every step), new betas / decay /
 * momentum half way (set_hparams), registered grads alternating with
 * step_with_grads, and param_info / state_bytes / num_params after every step.
 *
 * Tolerances (see refmath.h and harness.h for the derivation):
 *  - lockstep, fp32 values: |lib - ref| <= 16 * 2^-24 * (sum of |terms|), i.e.
 *    ~1e-6 relative to the magnitudes the fp32 computation combined;
 *  - lockstep, 16-bit params and bf16 moments: bit-identical to the float64
 *    value rounded to nearest even, except the neighbouring value when the
 *    float64 value is within that same fp32 bound of the rounding midpoint
 *    (the library rounds its fp32 result, the reference the exact one);
 *  - free-running over all steps: fp32 params + fp32 state must stay within
 *    the accumulated bound on every element (no discrete events exist there,
 *    except a Lion sign at c ~ 0); with 16-bit params or bf16 state a flip at
 *    one step persists and changes what follows, so at most 2% of elements
 *    may end beyond the fp32 bound (observed < 0.7%), each within 2 ulps of
 *    the param dtype + 0.25 x its path length (sum of attempted update sizes;
 *    observed < 0.07), and the mean drift stays below 1e-3 of the distance
 *    travelled (observed < 1e-4).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>

#include "harness.h"

typedef struct {
  const char* name;
  lowbit_algorithm_t algo;
  float momentum; /* SGD variants: < 0 random */
  int nesterov;
} algo_variant_t;

static const algo_variant_t kAlgos[] = {
    {"adamw", LOWBIT_ALGORITHM_ADAMW, 0, 0},      {"adam", LOWBIT_ALGORITHM_ADAM, 0, 0},
    {"lion", LOWBIT_ALGORITHM_LION, 0, 0},        {"sgd_momentum", LOWBIT_ALGORITHM_SGD, -1.f, 0},
    {"sgd_nesterov", LOWBIT_ALGORITHM_SGD, -1.f, 1}, {"sgd_plain", LOWBIT_ALGORITHM_SGD, 0.f, 0},
};
#define NUM_ALGOS 6
static const lowbit_state_format_t kStates[2] = {LOWBIT_STATE_FP32, LOWBIT_STATE_BF16};
static const lowbit_dtype_t kDtypes[3] = {LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_FLOAT16};

static lowbit_dtype_t other_dtype(lowbit_dtype_t d) {
  return d == LOWBIT_DTYPE_FLOAT32 ? LOWBIT_DTYPE_BFLOAT16 : LOWBIT_DTYPE_FLOAT32;
}

static void variant_hparams(const algo_variant_t* a, rng_t* r, lowbit_hparams_t* h, int group) {
  random_hparams(a->algo, r, h);
  if (a->algo == LOWBIT_ALGORITHM_SGD) {
    h->momentum = a->momentum < 0 ? (float)rng_range(r, 0.5, 0.95) : a->momentum;
    h->nesterov = a->nesterov;
    if (a->nesterov || h->momentum == 0.f) h->dampening = 0.f;
  }
  if (group == 1 && (a->algo == LOWBIT_ALGORITHM_ADAMW || a->algo == LOWBIT_ALGORITHM_ADAM))
    h->bias_correction = 0;
  if (group == 1) h->lr *= 2.f;
}

/* Limits on the free-running comparison (header comment). */
static void check_free(const hcfg_t* cfg, const hres_t* res, int bf16state) {
  int64_t n32 = res->elements - res->elements16;
  /* fp32 params with fp32 state: no discrete event, every element within the
   * accumulated bound (Lion: the sign of c ~ 0 may come out differently) */
  int64_t allowed = cfg->algo == LOWBIT_ALGORITHM_LION ? 2 + res->elements / 1000 : 0;
  if (!bf16state && res->free_beyond > allowed)
    fail_msg("%s: %lld fp32 elements beyond the accumulated fp32 bound (max ratio %.3g)", cfg->name,
             (long long)res->free_beyond, res->free_max_ratio);
  if ((double)res->free_beyond > 0.02 * (double)n32 + 2)
    fail_msg("%s: %lld of %lld fp32 elements beyond the bound", cfg->name, (long long)res->free_beyond,
             (long long)n32);
  if ((double)res->free_beyond16 > 0.02 * (double)res->elements16 + 2)
    fail_msg("%s: %lld of %lld 16-bit elements differ", cfg->name, (long long)res->free_beyond16,
             (long long)res->elements16);
  if (res->free_violations > allowed)
    fail_msg("%s: %lld elements beyond the per-element bound", cfg->name, (long long)res->free_violations);
  if (res->free_mean_rel > 1e-3)
    fail_msg("%s: free-running drift %.3g of the distance travelled", cfg->name, res->free_mean_rel);
}

/* ------------------------------------------------------------------ the matrix */

static void test_matrix(void** state) {
  int idx = (int)(intptr_t)*state;
  int ai = idx / 6, si = (idx / 3) % 2, di = idx % 3;
  const algo_variant_t* a = &kAlgos[ai];
  char name[128];
  snprintf(name, sizeof name, "%s/%s-state/%s-params", a->name, format_name(kStates[si]), dtype_name(kDtypes[di]));
  rng_t r = test_rng(name);
  lowbit_dtype_t pd = kDtypes[di], od = other_dtype(pd);
  double ps = pd == LOWBIT_DTYPE_FLOAT32 ? 1.0 : 0.05; /* 16-bit: small weights so steps move them */
  pspec_t params[5] = {
      {1, pd, pd, 0, LOWBIT_STATE_DEFAULT, LOWBIT_STATE_DEFAULT, ps, 1.0, 0},
      {7, pd, od, 1, LOWBIT_STATE_DEFAULT, LOWBIT_STATE_DEFAULT, ps, 0.5, 0},
      {4097, pd, pd, 0, LOWBIT_STATE_DEFAULT, LOWBIT_STATE_DEFAULT, ps, 1.0, 0},
      {4097, pd, od, 1, LOWBIT_STATE_DEFAULT, LOWBIT_STATE_DEFAULT, ps, 2.0, 0},
      {300, pd, od, 0, LOWBIT_STATE_DEFAULT, LOWBIT_STATE_DEFAULT, ps, 1e-3, 0},
  };
  hcfg_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.name = name;
  cfg.algo = a->algo;
  cfg.fmt = kStates[si];
  cfg.min_quantized_numel = -1;
  cfg.ngroups = 2;
  variant_hparams(a, &r, &cfg.groups[0], 0);
  variant_hparams(a, &r, &cfg.groups[1], 1);
  cfg.nparams = 5;
  cfg.params = params;
  cfg.steps = 50;
  cfg.schedule = 1;
  cfg.change_hparams = 1;
  cfg.grad_mode = 2;
  cfg.verbose = 1;
  cfg.state_drift = 0.25;
  hres_t res;
  harness_run(&cfg, rng_next(&r), &res);
  check_free(&cfg, &res, kStates[si] == LOWBIT_STATE_BF16);
}

/* 2^20 + 3 elements (not a multiple of any tile or block), two steps (the
 * first-step and the general path of every rule), each algorithm once with
 * state and param dtype rotating: (fp32, fp32), (bf16, bf16), (fp32, fp16),
 * (bf16, fp32), (fp32, bf16), (bf16, fp16). */
static void test_large(void** state) {
  int ai = (int)(intptr_t)*state, si = ai % 2;
  const algo_variant_t* a = &kAlgos[ai];
  lowbit_dtype_t pd = kDtypes[ai % 3];
  char name[128];
  snprintf(name, sizeof name, "large/%s/%s-state/%s-params", a->name, format_name(kStates[si]), dtype_name(pd));
  rng_t r = test_rng(name);
  pspec_t params[1] = {{(1 << 20) + 3, pd, other_dtype(pd), 0, LOWBIT_STATE_DEFAULT, LOWBIT_STATE_DEFAULT,
                        pd == LOWBIT_DTYPE_FLOAT32 ? 1.0 : 0.05, 1.0, 0}};
  hcfg_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.name = name;
  cfg.algo = a->algo;
  cfg.fmt = kStates[si];
  cfg.min_quantized_numel = -1;
  cfg.ngroups = 1;
  variant_hparams(a, &r, &cfg.groups[0], 0);
  cfg.nparams = 1;
  cfg.params = params;
  cfg.steps = 2;
  cfg.grad_mode = 2;
  cfg.verbose = 1;
  cfg.state_drift = 0.25;
  hres_t res;
  harness_run(&cfg, rng_next(&r), &res);
  check_free(&cfg, &res, kStates[si] == LOWBIT_STATE_BF16);
}

/* 50 tensors of random sizes, dtypes, groups and per-param state formats in
 * one optimizer, one step call per step; some params get no grad on some
 * steps (registered grad removed, or a NULL entry in step_with_grads) and
 * must be left alone, their step count included. */
static void test_many_tensors(void** state) {
  int ai = (int)(intptr_t)*state;
  const algo_variant_t* a = &kAlgos[ai];
  char name[128];
  snprintf(name, sizeof name, "many/%s", a->name);
  rng_t r = test_rng(name);
  pspec_t params[50];
  int bf16 = 0;
  for (int i = 0; i < 50; ++i) {
    pspec_t* p = &params[i];
    memset(p, 0, sizeof *p);
    p->numel = rng_uniform(&r) < 0.2 ? rng_int(&r, 1, 16) : rng_int(&r, 17, 3000);
    p->pdt = kDtypes[rng_int(&r, 0, 2)];
    p->gdt = rng_uniform(&r) < 0.5 ? p->pdt : kDtypes[rng_int(&r, 0, 2)];
    p->group = (int32_t)rng_int(&r, 0, 2);
    p->fmt = rng_uniform(&r) < 0.5 ? LOWBIT_STATE_DEFAULT : kStates[rng_int(&r, 0, 1)];
    p->fmt2 = rng_uniform(&r) < 0.7 ? LOWBIT_STATE_DEFAULT : kStates[rng_int(&r, 0, 1)];
    p->p_scale = p->pdt == LOWBIT_DTYPE_FLOAT32 ? 1.0 : 0.05;
    p->g_scale = pow(10.0, rng_range(&r, -2, 1));
    bf16 |= p->fmt == LOWBIT_STATE_BF16 || p->fmt2 == LOWBIT_STATE_BF16;
  }
  hcfg_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.name = name;
  cfg.algo = a->algo;
  cfg.fmt = LOWBIT_STATE_FP32;
  cfg.min_quantized_numel = -1;
  cfg.ngroups = 3;
  for (int g = 0; g < 3; ++g) variant_hparams(a, &r, &cfg.groups[g], g);
  cfg.nparams = 50;
  cfg.params = params;
  cfg.steps = 50;
  cfg.schedule = 1;
  cfg.change_hparams = 1;
  cfg.grad_mode = 2;
  cfg.skip_params = 1;
  cfg.verbose = 1;
  cfg.state_drift = 0.25;
  hres_t res;
  harness_run(&cfg, rng_next(&r), &res);
  check_free(&cfg, &res, bf16);
}

/* ------------------------------------------------------------------ non-finite grads */

typedef struct {
  lowbit_optimizer_t opt;
  int n;
  int64_t numel[3];
  lowbit_dtype_t pdt[3], gdt[3];
  void *p[3], *g[3];
} nf_fixture_t;

static void nf_create(nf_fixture_t* f, int skip_nonfinite, const lowbit_hparams_t* h, void* const* p_init) {
  static const int64_t numel[3] = {1000, 513, 300};
  static const lowbit_dtype_t pdt[3] = {LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_FLOAT16};
  static const lowbit_dtype_t gdt[3] = {LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_FLOAT16};
  lowbit_optimizer_config_t oc;
  CHECK_OK(NULL, lowbit_optimizer_config_init(&oc, LOWBIT_ALGORITHM_ADAMW));
  oc.skip_nonfinite = skip_nonfinite;
  f->opt = NULL;
  CHECK_OK(NULL, lowbit_optimizer_create(&f->opt, &oc, h));
  f->n = 3;
  for (int i = 0; i < 3; ++i) {
    f->numel[i] = numel[i];
    f->pdt[i] = pdt[i];
    f->gdt[i] = gdt[i];
    f->p[i] = calloc((size_t)numel[i], dtype_size(pdt[i]));
    f->g[i] = calloc((size_t)numel[i], dtype_size(gdt[i]));
    memcpy(f->p[i], p_init[i], (size_t)numel[i] * dtype_size(pdt[i]));
    lowbit_param_config_t pc;
    CHECK_OK(f->opt, lowbit_param_config_init(&pc));
    pc.param = make_tensor(f->p[i], numel[i], pdt[i]);
    pc.grad = make_tensor(f->g[i], numel[i], gdt[i]);
    int64_t id = -1;
    CHECK_OK(f->opt, lowbit_optimizer_add_param(f->opt, &pc, &id));
    assert_int_equal(id, i);
  }
}

static void nf_destroy(nf_fixture_t* f) {
  CHECK_OK(f->opt, lowbit_optimizer_destroy(f->opt));
  for (int i = 0; i < f->n; ++i) {
    free(f->p[i]);
    free(f->g[i]);
  }
}

static void nf_fill_grads(nf_fixture_t* f, rng_t* r) {
  for (int i = 0; i < f->n; ++i)
    for (int64_t e = 0; e < f->numel[i]; ++e) tensor_set(f->g[i], f->gdt[i], e, rng_normal(r));
}

/* params, both moments and step counters of every param, bit for bit */
static int nf_same_state(nf_fixture_t* a, nf_fixture_t* b) {
  for (int i = 0; i < a->n; ++i) {
    if (memcmp(a->p[i], b->p[i], (size_t)a->numel[i] * dtype_size(a->pdt[i]))) return 0;
    float* x = calloc((size_t)a->numel[i], 4);
    float* y = calloc((size_t)a->numel[i], 4);
    for (int m = 0; m < 2; ++m) {
      CHECK_OK(a->opt, lowbit_optimizer_read_moment(a->opt, i, m, x, a->numel[i], NULL));
      CHECK_OK(b->opt, lowbit_optimizer_read_moment(b->opt, i, m, y, a->numel[i], NULL));
      if (memcmp(x, y, (size_t)a->numel[i] * 4)) {
        free(x);
        free(y);
        return 0;
      }
    }
    free(x);
    free(y);
    lowbit_param_info_t ia, ib;
    memset(&ia, 0, sizeof ia);
    memset(&ib, 0, sizeof ib);
    ia.struct_size = ib.struct_size = sizeof ia;
    CHECK_OK(a->opt, lowbit_optimizer_param_info(a->opt, i, &ia));
    CHECK_OK(b->opt, lowbit_optimizer_param_info(b->opt, i, &ib));
    if (ia.step != ib.step) return 0;
  }
  return 1;
}

static void nf_copy_grads(nf_fixture_t* dst, const nf_fixture_t* src) {
  for (int i = 0; i < src->n; ++i) memcpy(dst->g[i], src->g[i], (size_t)src->numel[i] * dtype_size(src->gdt[i]));
}

static void nonfinite_value(lowbit_dtype_t dt, void* g, int64_t e, int kind) {
  double v = kind == 0 ? NAN : kind == 1 ? INFINITY : -INFINITY;
  tensor_set(g, dt, e, v);
}

/* A NaN / +Inf / -Inf in any grad (fp32, bf16 or fp16) skips the whole step:
 * params, state and step counters unchanged, status SUCCESS, skipped flag 1;
 * the next finite step clears the flag and continues as if the bad step never
 * happened (compared bit for bit with a twin optimizer that never saw it). */
static void test_skip_nonfinite(void** state) {
  (void)state;
  rng_t r = test_rng("skip_nonfinite");
  lowbit_hparams_t h;
  random_hparams(LOWBIT_ALGORITHM_ADAMW, &r, &h);
  void* init[3];
  int64_t numel[3] = {1000, 513, 300};
  lowbit_dtype_t pdt[3] = {LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_FLOAT16};
  for (int i = 0; i < 3; ++i) {
    init[i] = calloc((size_t)numel[i], dtype_size(pdt[i]));
    for (int64_t e = 0; e < numel[i]; ++e) tensor_set(init[i], pdt[i], e, 0.1 * rng_normal(&r));
  }
  nf_fixture_t a, b;
  nf_create(&a, 1, &h, init);
  nf_create(&b, 1, &h, init);
  for (int round = 0; round < 9; ++round) {
    /* a good step on both */
    nf_fill_grads(&a, &r);
    nf_copy_grads(&b, &a);
    CHECK_OK(a.opt, lowbit_optimizer_step(a.opt, NULL));
    CHECK_OK(b.opt, lowbit_optimizer_step(b.opt, NULL));
    int32_t sk = -1;
    CHECK_OK(a.opt, lowbit_optimizer_last_step_skipped(a.opt, &sk));
    assert_int_equal(sk, 0);
    assert_true(nf_same_state(&a, &b));
    /* a bad step on a only: param round % 3, kind NaN / +Inf / -Inf */
    nf_fill_grads(&a, &r);
    int which = round % 3, kind = (round / 3) % 3;
    int64_t e = rng_int(&r, 0, a.numel[which] - 1);
    nonfinite_value(a.gdt[which], a.g[which], e, kind);
    lowbit_status_t st;
    if (round % 2) {
      lowbit_tensor_t gt[3];
      for (int i = 0; i < 3; ++i) gt[i] = make_tensor(a.g[i], a.numel[i], a.gdt[i]);
      st = lowbit_optimizer_step_with_grads(a.opt, gt, 3, NULL);
    } else {
      st = lowbit_optimizer_step(a.opt, NULL);
    }
    if (st != LOWBIT_SUCCESS) fail_msg("step with a non-finite grad: %s", lowbit_optimizer_last_error(a.opt));
    CHECK_OK(a.opt, lowbit_optimizer_last_step_skipped(a.opt, &sk));
    if (sk != 1) fail_msg("round %d: non-finite grad (param %d elem %lld kind %d) not reported as skipped", round,
                          which, (long long)e, kind);
    if (!nf_same_state(&a, &b))
      fail_msg("round %d: a skipped step changed params, state or step counters (param %d elem %lld kind %d)", round,
               which, (long long)e, kind);
  }
  /* and a final good step clears the flag */
  nf_fill_grads(&a, &r);
  nf_copy_grads(&b, &a);
  CHECK_OK(a.opt, lowbit_optimizer_step(a.opt, NULL));
  CHECK_OK(b.opt, lowbit_optimizer_step(b.opt, NULL));
  int32_t sk = -1;
  CHECK_OK(a.opt, lowbit_optimizer_last_step_skipped(a.opt, &sk));
  assert_int_equal(sk, 0);
  assert_true(nf_same_state(&a, &b));
  lowbit_param_info_t info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK_OK(a.opt, lowbit_optimizer_param_info(a.opt, 0, &info));
  assert_int_equal(info.step, 10);
  nf_destroy(&a);
  nf_destroy(&b);
  for (int i = 0; i < 3; ++i) free(init[i]);
}

/* skip_nonfinite = 0: no check; the NaN lands in that element's param and
 * moments (as in PyTorch) and every other element is updated exactly like a
 * twin optimizer whose grad has a finite value there. */
static void test_nonfinite_propagates(void** state) {
  (void)state;
  rng_t r = test_rng("nonfinite_propagates");
  lowbit_hparams_t h;
  random_hparams(LOWBIT_ALGORITHM_ADAMW, &r, &h);
  void* init[3];
  int64_t numel[3] = {1000, 513, 300};
  lowbit_dtype_t pdt[3] = {LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_FLOAT16};
  for (int i = 0; i < 3; ++i) {
    init[i] = calloc((size_t)numel[i], dtype_size(pdt[i]));
    for (int64_t e = 0; e < numel[i]; ++e) tensor_set(init[i], pdt[i], e, 0.1 * rng_normal(&r));
  }
  nf_fixture_t a, b;
  nf_create(&a, 0, &h, init);
  nf_create(&b, 1, &h, init);
  nf_fill_grads(&a, &r);
  nf_copy_grads(&b, &a);
  int64_t e = rng_int(&r, 0, 999);
  tensor_set(a.g[0], LOWBIT_DTYPE_FLOAT32, e, NAN);
  tensor_set(b.g[0], LOWBIT_DTYPE_FLOAT32, e, 0.0);
  CHECK_OK(a.opt, lowbit_optimizer_step(a.opt, NULL));
  CHECK_OK(b.opt, lowbit_optimizer_step(b.opt, NULL));
  int32_t sk = -1;
  CHECK_OK(a.opt, lowbit_optimizer_last_step_skipped(a.opt, &sk));
  assert_int_equal(sk, 0);
  float* pa = a.p[0];
  float* pb = b.p[0];
  if (!isnan(pa[e])) fail_msg("skip_nonfinite=0: param element %lld is %g, expected NaN", (long long)e, pa[e]);
  float* ma = calloc(1000, 4);
  float* mb = calloc(1000, 4);
  for (int m = 0; m < 2; ++m) {
    CHECK_OK(a.opt, lowbit_optimizer_read_moment(a.opt, 0, m, ma, 1000, NULL));
    CHECK_OK(b.opt, lowbit_optimizer_read_moment(b.opt, 0, m, mb, 1000, NULL));
    assert_true(isnan(ma[e]));
    for (int64_t i = 0; i < 1000; ++i)
      if (i != e && memcmp(&ma[i], &mb[i], 4)) fail_msg("moment %d element %lld differs from the twin", m, (long long)i);
  }
  for (int64_t i = 0; i < 1000; ++i)
    if (i != e && memcmp(&pa[i], &pb[i], 4)) fail_msg("param element %lld differs from the twin", (long long)i);
  for (int i = 1; i < 3; ++i)
    assert_memory_equal(a.p[i], b.p[i], (size_t)numel[i] * dtype_size(pdt[i]));
  free(ma);
  free(mb);
  nf_destroy(&a);
  nf_destroy(&b);
  for (int i = 0; i < 3; ++i) free(init[i]);
}

/* The CPU engine's result does not depend on its thread count. */
static void test_threads_bit_identical(void** state) {
  (void)state;
  rng_t r = test_rng("threads");
  const int64_t n = 100003;
  float* p0 = calloc((size_t)n, 4);
  for (int64_t e = 0; e < n; ++e) p0[e] = (float)rng_normal(&r);
  float* g = calloc((size_t)n, 4);
  float* out[3];
  int threads[3] = {1, 2, 0};
  lowbit_hparams_t h;
  random_hparams(LOWBIT_ALGORITHM_ADAMW, &r, &h);
  uint64_t gseed = rng_next(&r);
  for (int k = 0; k < 3; ++k) {
    lowbit_optimizer_config_t oc;
    CHECK_OK(NULL, lowbit_optimizer_config_init(&oc, LOWBIT_ALGORITHM_ADAMW));
    oc.num_threads = threads[k];
    oc.state_format = LOWBIT_STATE_BF16;
    lowbit_optimizer_t opt = NULL;
    CHECK_OK(NULL, lowbit_optimizer_create(&opt, &oc, &h));
    out[k] = calloc((size_t)n, 4);
    memcpy(out[k], p0, (size_t)n * 4);
    lowbit_param_config_t pc;
    CHECK_OK(opt, lowbit_param_config_init(&pc));
    pc.param = make_tensor(out[k], n, LOWBIT_DTYPE_FLOAT32);
    pc.grad = make_tensor(g, n, LOWBIT_DTYPE_FLOAT32);
    int64_t id = -1;
    CHECK_OK(opt, lowbit_optimizer_add_param(opt, &pc, &id));
    rng_t gr = {gseed};
    for (int s = 0; s < 5; ++s) {
      for (int64_t e = 0; e < n; ++e) g[e] = (float)rng_normal(&gr);
      CHECK_OK(opt, lowbit_optimizer_step(opt, NULL));
    }
    CHECK_OK(opt, lowbit_optimizer_destroy(opt));
  }
  assert_memory_equal(out[0], out[1], (size_t)n * 4);
  assert_memory_equal(out[0], out[2], (size_t)n * 4);
  for (int k = 0; k < 3; ++k) free(out[k]);
  free(p0);
  free(g);
}

/* Distinct handles are independent and may be used concurrently (header):
 * two optimizers stepped from two threads at once give exactly the bits they
 * give when stepped one after the other. */
typedef struct {
  lowbit_algorithm_t algo;
  lowbit_state_format_t fmt;
  lowbit_dtype_t pdt;
  int64_t n;
  uint64_t seed;
  void* out; /* final params */
} conc_job_t;

static void* conc_run(void* arg) {
  conc_job_t* j = arg;
  rng_t r = {j->seed};
  lowbit_optimizer_config_t oc;
  lowbit_optimizer_config_init(&oc, j->algo);
  oc.state_format = j->fmt;
  oc.num_threads = 2;
  lowbit_hparams_t h;
  lowbit_hparams_init(&h, j->algo);
  lowbit_optimizer_t opt = NULL;
  if (lowbit_optimizer_create(&opt, &oc, &h) != LOWBIT_SUCCESS) return NULL;
  float* g = calloc((size_t)j->n, 4);
  for (int64_t e = 0; e < j->n; ++e) tensor_set(j->out, j->pdt, e, 0.1 * rng_normal(&r));
  lowbit_param_config_t pc;
  lowbit_param_config_init(&pc);
  pc.param = make_tensor(j->out, j->n, j->pdt);
  pc.grad = make_tensor(g, j->n, LOWBIT_DTYPE_FLOAT32);
  int64_t id;
  lowbit_optimizer_add_param(opt, &pc, &id);
  for (int s = 0; s < 8; ++s) {
    for (int64_t e = 0; e < j->n; ++e) g[e] = (float)rng_normal(&r);
    lowbit_optimizer_step(opt, NULL);
  }
  lowbit_optimizer_destroy(opt);
  free(g);
  return j;
}

static void test_concurrent_handles(void** state) {
  (void)state;
  rng_t r = test_rng("concurrent");
  conc_job_t jobs[2] = {
      {LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_BF16, LOWBIT_DTYPE_BFLOAT16, 300001, rng_next(&r), NULL},
      {LOWBIT_ALGORITHM_LION, LOWBIT_STATE_8BIT, LOWBIT_DTYPE_FLOAT32, 200003, rng_next(&r), NULL},
  };
  void* seq[2];
  for (int k = 0; k < 2; ++k) {
    jobs[k].out = calloc((size_t)jobs[k].n, dtype_size(jobs[k].pdt));
    assert_non_null(conc_run(&jobs[k]));
    seq[k] = jobs[k].out;
    jobs[k].out = calloc((size_t)jobs[k].n, dtype_size(jobs[k].pdt));
  }
  pthread_t th[2];
  for (int k = 0; k < 2; ++k) assert_int_equal(pthread_create(&th[k], NULL, conc_run, &jobs[k]), 0);
  for (int k = 0; k < 2; ++k) {
    void* ret = NULL;
    pthread_join(th[k], &ret);
    assert_non_null(ret);
    assert_memory_equal(seq[k], jobs[k].out, (size_t)jobs[k].n * dtype_size(jobs[k].pdt));
    free(seq[k]);
    free(jobs[k].out);
  }
}

int main(void) {
  test_seed_init("test_full_precision");
  if (getenv("LOWBIT_TEST_FILTER")) cmocka_set_test_filter(getenv("LOWBIT_TEST_FILTER"));
  enum { NMATRIX = NUM_ALGOS * 2 * 3, NLARGE = NUM_ALGOS, NMANY = NUM_ALGOS };
  struct CMUnitTest tests[NMATRIX + NLARGE + NMANY + 4];
  int k = 0;
  for (int i = 0; i < NMATRIX; ++i) {
    struct CMUnitTest t = cmocka_unit_test_prestate(test_matrix, (void*)(intptr_t)i);
    tests[k++] = t;
  }
  for (int i = 0; i < NLARGE; ++i) {
    struct CMUnitTest t = cmocka_unit_test_prestate(test_large, (void*)(intptr_t)i);
    tests[k++] = t;
  }
  for (int i = 0; i < NMANY; ++i) {
    struct CMUnitTest t = cmocka_unit_test_prestate(test_many_tensors, (void*)(intptr_t)i);
    tests[k++] = t;
  }
  {
    struct CMUnitTest t1 = cmocka_unit_test(test_skip_nonfinite);
    struct CMUnitTest t2 = cmocka_unit_test(test_nonfinite_propagates);
    struct CMUnitTest t3 = cmocka_unit_test(test_threads_bit_identical);
    struct CMUnitTest t4 = cmocka_unit_test(test_concurrent_handles);
    tests[k++] = t1;
    tests[k++] = t2;
    tests[k++] = t3;
    tests[k++] = t4;
  }
  return _cmocka_run_group_tests("full_precision", tests, (size_t)k, NULL, NULL);
}
