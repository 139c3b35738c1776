/* Issue 15: shaped parameters, rank-1 normalisation and the factored second
 * moment, against the float64 reference of refmath.h ("shaped parameters").
 *
 * Lockstep runs (100 steps, and single steps: the first step of each run):
 * before every step the library's params and (dequantized) moments are read;
 * one float64 AdamW step is applied to them; the new moments are quantized
 * by the reference (rank-1: the vectors are maxima of the fp32-rounded new
 * values, scale = min over dims, nearest code; blocks: absmax of 128) and
 * compared code by code with the library's. A code may differ only by one,
 * where the reference's x / scale lies within the fp32 error bound of the
 * decision boundary (REF_K u relative to the terms, plus the relative error
 * of the scale); such flips are counted and printed. Params must agree within
 * REF_K u of their terms (refmath.h).
 *
 * The factored moment: the reference keeps its own accumulators row / col in
 * double (free-running: the library's are not readable) and the library's
 * reconstruction v^ (read_moment) must stay within 2e-3 relative of it (an
 * fp32 EMA with beta2 = 0.999 carries up to ~1/(1-beta2) u = 6e-5 of
 * accumulated rounding; the bound is a definition check, any other formula
 * errs by O(1)); params within their terms' bound plus that relative error of
 * the update.
 *
 * Shapes: 1 x n, n x 1, 7 x 129, 3 x 5 x 257 and a 1-D tensor (which falls
 * back to blocks). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "harness.h"

typedef struct {
  int ndim;
  int64_t dim[3];
} shp_t;

static const shp_t kShapes[] = {{2, {1, 300}}, {2, {300, 1}}, {2, {7, 129}}, {3, {3, 5, 257}}, {0, {1000}}};
#define NSHAPES 5

static int64_t shp_numel(const shp_t* s) {
  if (s->ndim == 0) return s->dim[0];
  int64_t n = 1;
  for (int k = 0; k < s->ndim; ++k) n *= s->dim[k];
  return n;
}

typedef struct {
  const char* name;
  lowbit_state_format_t fm, fv;
  lowbit_normalization_t nm, nv;
  int algo_adam; /* Adam (L2) instead of AdamW */
} shaped_case_t;

typedef struct {
  int64_t checked, m_flips, v_flips, p_checked;
  double max_v_rel, max_p_ratio;
} shaped_res_t;

static const qmap_t* map_of(lowbit_state_format_t f, int second) {
  return ref_map(f, second);
}

/* Checks the library's stored moment `lib` (dequantized) against the
 * reference quantization of the float64 values `ref` with error scales
 * `terms`. `rank1`: vectors over `shape`; else 128-blocks. Returns flips. */
static int64_t check_codes(const char* what, lowbit_state_format_t fmt, int second, int rank1, const ref_shape_t* shape,
                           const double* ref, const double* terms, const float* lib, int64_t n) {
  const qmap_t* map = map_of(fmt, second);
  float* f = malloc(sizeof(float) * (size_t)n);
  float* scale = malloc(sizeof(float) * (size_t)n);
  double* tol_abs = malloc(sizeof(double) * (size_t)n);
  for (int64_t e = 0; e < n; ++e) {
    f[e] = (float)ref[e];
    tol_abs[e] = REF_K * REF_U * terms[e];
  }
  /* the relative error of each scale: that of the element that sets it */
  double scale_rel = 0;
  if (rank1) {
    float* vec = calloc((size_t)ref_dim_sum(shape), sizeof(float));
    ref_rank1_vectors(shape, f, n, vec);
    for (int64_t e = 0; e < n; ++e) scale[e] = ref_rank1_scale(shape, vec, e);
    free(vec);
  } else {
    const int64_t block = format_block(fmt);
    for (int64_t b = 0; b < n; b += block) {
      int64_t end = b + block < n ? b + block : n;
      float a = 0.f;
      for (int64_t e = b; e < end; ++e) a = fabsf(f[e]) > a ? fabsf(f[e]) : a;
      for (int64_t e = b; e < end; ++e) scale[e] = a;
    }
  }
  for (int64_t e = 0; e < n; ++e)
    if (scale[e] > 0.f && tol_abs[e] / scale[e] > scale_rel) scale_rel = fmin(tol_abs[e] / scale[e], 1e-3);
  int64_t flips = 0;
  for (int64_t e = 0; e < n; ++e) {
    double dist;
    int kr = ref_code(map, second, f[e], scale[e], &dist);
    /* the library's code: its value over the reference scale, nearest map value */
    int kl = scale[e] > 0.f ? qmap_nearest(map, (double)lib[e] / scale[e], NULL) : kr;
    if (scale[e] > 0.f && second && map->v[kl] == 0.0 && lib[e] > 0.f) ++kl;
    if (kl == kr) continue;
    double x = scale[e] > 0.f ? (double)f[e] / scale[e] : 0.0;
    double tol = (tol_abs[e] / (scale[e] > 0.f ? scale[e] : 1.f)) + 2 * scale_rel * fabs(x) + 4 * REF_U;
    if (abs(kl - kr) == 1 && dist <= tol) {
      ++flips;
      continue;
    }
    fail_msg("%s element %lld: library code %d (value %.9g), reference %d (x = %.9g, scale %.9g, %.3g from a "
             "boundary, tolerance %.3g)",
             what, (long long)e, kl, lib[e], kr, x, scale[e], dist, tol);
  }
  free(f);
  free(scale);
  free(tol_abs);
  return flips;
}

static void run_lockstep(const shaped_case_t* c, int steps, uint64_t seed, shaped_res_t* res) {
  rng_t r = {seed};
  lowbit_algorithm_t algo = c->algo_adam ? LOWBIT_ALGORITHM_ADAM : LOWBIT_ALGORITHM_ADAMW;
  lowbit_optimizer_config_t oc;
  CHECK_OK(NULL, lowbit_optimizer_config_init(&oc, algo));
  oc.state_format = c->fm;
  oc.second_state_format = c->fv;
  oc.first_normalization = c->nm;
  oc.second_normalization = c->nv;
  oc.min_quantized_numel = 0;
  lowbit_hparams_t h;
  CHECK_OK(NULL, lowbit_hparams_init(&h, algo));
  h.lr = 1e-2f;
  h.weight_decay = c->algo_adam ? 0.05f : 0.1f;
  ref_hp_t hp = ref_hp_from(algo, &h);
  lowbit_optimizer_t opt = NULL;
  CHECK_OK(NULL, lowbit_optimizer_create(&opt, &oc, &h));
  float* p[NSHAPES];
  float* g[NSHAPES];
  double *row[NSHAPES], *col[NSHAPES];
  int factored[NSHAPES];
  ref_shape_t rs[NSHAPES];
  for (int i = 0; i < NSHAPES; ++i) {
    const shp_t* s = &kShapes[i];
    int64_t n = shp_numel(s);
    p[i] = malloc(4 * (size_t)n);
    g[i] = malloc(4 * (size_t)n);
    for (int64_t e = 0; e < n; ++e) p[i][e] = (float)rng_normal(&r);
    lowbit_param_config_t pc;
    CHECK_OK(opt, lowbit_param_config_init(&pc));
    pc.param = make_tensor(p[i], n, LOWBIT_DTYPE_FLOAT32);
    pc.grad = make_tensor(g[i], n, LOWBIT_DTYPE_FLOAT32);
    pc.ndim = s->ndim;
    for (int k = 0; k < s->ndim; ++k) pc.shape[k] = s->dim[k];
    rs[i].ndim = s->ndim;
    for (int k = 0; k < s->ndim; ++k) rs[i].dim[k] = s->dim[k];
    int64_t id;
    CHECK_OK(opt, lowbit_optimizer_add_param(opt, &pc, &id));
    lowbit_param_info_t info;
    info.struct_size = sizeof info;
    CHECK_OK(opt, lowbit_optimizer_param_info(opt, id, &info));
    factored[i] = info.second_normalization == LOWBIT_NORMALIZATION_FACTORED;
    assert_int_equal(factored[i], c->nv == LOWBIT_NORMALIZATION_FACTORED && s->ndim >= 2);
    assert_int_equal(info.second_normalization == LOWBIT_NORMALIZATION_RANK1,
                     c->nv == LOWBIT_NORMALIZATION_RANK1 && s->ndim >= 2);
    row[i] = calloc((size_t)n, sizeof(double));
    col[i] = calloc((size_t)n, sizeof(double));
  }
  for (int t = 1; t <= steps; ++t) {
    for (int i = 0; i < NSHAPES; ++i) {
      const shp_t* s = &kShapes[i];
      int64_t n = shp_numel(s), C = s->ndim ? s->dim[s->ndim - 1] : n;
      /* gradients spread over columns and rows (2 decades), some exact zeros */
      for (int64_t e = 0; e < n; ++e)
        g[i][e] = (float)(rng_normal(&r) * pow(10.0, -2.0 * (double)(e % C) / (double)C) *
                          (e % 97 == 5 ? 0.0 : 1.0));
    }
    double *p0[NSHAPES], *m0[NSHAPES], *v0[NSHAPES], *pr[NSHAPES], *mr[NSHAPES], *vr[NSHAPES];
    double *ps[NSHAPES], *ms[NSHAPES], *vs[NSHAPES];
    for (int i = 0; i < NSHAPES; ++i) {
      int64_t n = shp_numel(&kShapes[i]);
      float* buf = malloc(4 * (size_t)n);
      p0[i] = malloc(8 * (size_t)n), m0[i] = malloc(8 * (size_t)n), v0[i] = malloc(8 * (size_t)n);
      pr[i] = malloc(8 * (size_t)n), mr[i] = malloc(8 * (size_t)n), vr[i] = malloc(8 * (size_t)n);
      ps[i] = malloc(8 * (size_t)n), ms[i] = malloc(8 * (size_t)n), vs[i] = malloc(8 * (size_t)n);
      CHECK_OK(opt, lowbit_optimizer_read_moment(opt, i, 0, buf, n, NULL));
      for (int64_t e = 0; e < n; ++e) m0[i][e] = buf[e];
      CHECK_OK(opt, lowbit_optimizer_read_moment(opt, i, 1, buf, n, NULL));
      for (int64_t e = 0; e < n; ++e) v0[i][e] = buf[e];
      for (int64_t e = 0; e < n; ++e) p0[i][e] = p[i][e];
      free(buf);
      ref_step_t k = ref_step_consts(&hp, t);
      if (factored[i]) {
        double* g2 = malloc(8 * (size_t)n);
        for (int64_t e = 0; e < n; ++e) {
          double ge = g[i][e] + (c->algo_adam ? (double)(float)(hp.wd * p0[i][e]) : 0.0);
          g2[e] = c->algo_adam ? (double)(float)((float)ge * (float)ge) : (double)g[i][e] * g[i][e];
        }
        ref_factored_update(&rs[i], n, hp.b2, g2, row[i], col[i]);
        free(g2);
      }
      for (int64_t e = 0; e < n; ++e) {
        double pp = p0[i][e], mm = m0[i][e], vv = v0[i][e];
        ref_scale_t sc;
        if (factored[i]) {
          /* Adam's step with v^ (the reference's own accumulators) */
          double vh = ref_factored_v(&rs[i], n, row[i], col[i], e), ge = g[i][e], pd = pp;
          if (c->algo_adam)
            ge += hp.wd * pp;
          else
            pd = pp * (1.0 - hp.lr * hp.wd);
          mm = hp.b1 * mm + (1 - hp.b1) * ge;
          double denom = sqrt(vh) * k.ib + hp.eps, upd = k.ss * mm / denom;
          pp = pd - upd;
          sc.m = hp.b1 * fabs(m0[i][e]) + (1 - hp.b1) * fabs(ge);
          sc.p = fabs(pd) + 2 * fabs(upd) + k.ss * sc.m / denom;
          sc.v = vh;
          vv = vh;
          sc.lion_base = fabs(upd); /* reused: the update size */
        } else {
          ref_update(&hp, &k, &pp, g[i][e], &mm, &vv, &sc);
        }
        pr[i][e] = pp, mr[i][e] = mm, vr[i][e] = vv;
        ps[i][e] = factored[i] ? sc.p + 2e-3 * sc.lion_base / REF_K / REF_U : sc.p;
        ms[i][e] = sc.m, vs[i][e] = sc.v;
      }
    }
    CHECK_OK(opt, lowbit_optimizer_step(opt, NULL));
    for (int i = 0; i < NSHAPES; ++i) {
      const shp_t* s = &kShapes[i];
      int64_t n = shp_numel(s);
      char what[160];
      float* lm = malloc(4 * (size_t)n);
      float* lv = malloc(4 * (size_t)n);
      CHECK_OK(opt, lowbit_optimizer_read_moment(opt, i, 0, lm, n, NULL));
      CHECK_OK(opt, lowbit_optimizer_read_moment(opt, i, 1, lv, n, NULL));
      for (int64_t e = 0; e < n; ++e) {
        double d = fabs(p[i][e] - pr[i][e]), b = REF_K * REF_U * ps[i][e];
        if (d > b)
          fail_msg("%s step %d param %d element %lld: p %.9g, reference %.9g (bound %.3g)", c->name, t, i,
                   (long long)e, p[i][e], pr[i][e], b);
        if (b > 0 && d / b > res->max_p_ratio) res->max_p_ratio = d / b;
      }
      res->p_checked += n;
      int shaped = s->ndim >= 2;
      snprintf(what, sizeof what, "%s step %d param %d m", c->name, t, i);
      res->m_flips += check_codes(what, c->fm, 0, shaped && c->nm == LOWBIT_NORMALIZATION_RANK1, &rs[i], mr[i], ms[i],
                                  lm, n);
      if (factored[i]) {
        for (int64_t e = 0; e < n; ++e) {
          double rel = fabs(lv[e] - vr[i][e]) / (vr[i][e] > 0 ? vr[i][e] : 1.0);
          if (vr[i][e] == 0.0 && lv[e] != 0.f) rel = INFINITY;
          if (rel > res->max_v_rel) res->max_v_rel = rel;
          if (rel > 2e-3)
            fail_msg("%s step %d param %d element %lld: factored v %.9g, reference %.9g", c->name, t, i,
                     (long long)e, lv[e], vr[i][e]);
        }
      } else {
        snprintf(what, sizeof what, "%s step %d param %d v", c->name, t, i);
        res->v_flips += check_codes(what, c->fv, 1, shaped && c->nv == LOWBIT_NORMALIZATION_RANK1, &rs[i], vr[i],
                                    vs[i], lv, n);
      }
      res->checked += n;
      free(lm);
      free(lv);
      free(p0[i]), free(m0[i]), free(v0[i]), free(pr[i]), free(mr[i]), free(vr[i]), free(ps[i]), free(ms[i]),
          free(vs[i]);
    }
  }
  for (int i = 0; i < NSHAPES; ++i) free(p[i]), free(g[i]), free(row[i]), free(col[i]);
  CHECK_OK(opt, lowbit_optimizer_destroy(opt));
}

static const shaped_case_t kCases[] = {
    {"lpmm 4-bit adamw (m 4bit blocks, v 4bit rank1)", LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT, LOWBIT_NORMALIZATION_BLOCK,
     LOWBIT_NORMALIZATION_RANK1, 0},
    {"rank1 m and v, 4bit", LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT, LOWBIT_NORMALIZATION_RANK1, LOWBIT_NORMALIZATION_RANK1,
     0},
    {"rank1 m and v, 8bit, adam l2", LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT, LOWBIT_NORMALIZATION_RANK1,
     LOWBIT_NORMALIZATION_RANK1, 1},
    {"4-bit factor (m 4bit blocks, v factored)", LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT, LOWBIT_NORMALIZATION_BLOCK,
     LOWBIT_NORMALIZATION_FACTORED, 0},
    {"factored v, rank1 4bit m, adam l2", LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT, LOWBIT_NORMALIZATION_RANK1,
     LOWBIT_NORMALIZATION_FACTORED, 1},
};

static void test_lockstep(void** state) {
  int idx = (int)(intptr_t)*state;
  const shaped_case_t* c = &kCases[idx];
  rng_t r = test_rng(c->name);
  shaped_res_t single = {0}, res = {0};
  run_lockstep(c, 1, rng_next(&r), &single);
  run_lockstep(c, 100, rng_next(&r), &res);
  printf("  %-48s single step: %lld elements, %lld+%lld flips; 100 steps: %lld element-steps, m flips %lld, "
         "v flips %lld, max p error / bound %.3f, max factored v rel %.2e\n",
         c->name, (long long)single.checked, (long long)single.m_flips, (long long)single.v_flips,
         (long long)res.checked, (long long)res.m_flips, (long long)res.v_flips, res.max_p_ratio, res.max_v_rel);
  /* flips are boundary cases only: a handful per 10^5 element-steps */
  assert_true(res.m_flips + res.v_flips <= 1 + res.checked / 2000);
}

/* ------------------------------------------------------------------ layouts and plans */

static void test_plan_and_bytes(void** state) {
  (void)state;
  const int64_t R = 4096, C = 4096, n = R * C;
  for (int preset = LOWBIT_PRESET_LPMM_ADAMW_4BIT; preset <= LOWBIT_PRESET_ADAMW_4BIT_FACTOR; ++preset) {
    lowbit_optimizer_config_t oc;
    CHECK_OK(NULL, lowbit_optimizer_config_preset(&oc, (lowbit_preset_t)preset));
    lowbit_hparams_t h;
    CHECK_OK(NULL, lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW));
    lowbit_param_config_t pc;
    CHECK_OK(NULL, lowbit_param_config_init(&pc));
    pc.param = make_tensor(NULL, n, LOWBIT_DTYPE_BFLOAT16);
    pc.ndim = 2;
    pc.shape[0] = R;
    pc.shape[1] = C;
    lowbit_state_plan_t plan;
    plan.struct_size = sizeof plan;
    CHECK_OK(NULL, lowbit_plan_param_state(&oc, &h, &pc, &plan));
    assert_int_equal(plan.num_moments, 2);
    assert_int_equal(plan.format[0], LOWBIT_STATE_4BIT);
    assert_int_equal(plan.normalization[0], LOWBIT_NORMALIZATION_BLOCK);
    assert_int_equal(plan.block_size[0], 128);
    assert_int_equal(plan.data_bytes[0], n / 2);
    assert_int_equal(plan.scale_count[0], n / 128);
    if (preset == LOWBIT_PRESET_LPMM_ADAMW_4BIT) {
      assert_int_equal(plan.normalization[1], LOWBIT_NORMALIZATION_RANK1);
      assert_int_equal(plan.format[1], LOWBIT_STATE_4BIT);
      assert_int_equal(plan.block_size[1], 0);
      assert_int_equal(plan.data_bytes[1], n / 2);
      assert_int_equal(plan.scale_count[1], 2 * (R + C));
    } else {
      assert_int_equal(plan.normalization[1], LOWBIT_NORMALIZATION_FACTORED);
      assert_int_equal(plan.format[1], LOWBIT_STATE_FP32);
      assert_int_equal(plan.data_bytes[1], 4 * (R + C + 1));
      assert_int_equal(plan.scale_count[1], 0);
    }
    double bpp = (double)plan.state_bytes / (double)n;
    printf("  %s, 4096 x 4096: %.4f state bytes/param\n",
           preset == LOWBIT_PRESET_LPMM_ADAMW_4BIT ? "lpmm 4-bit AdamW" : "4-bit Factor", bpp);
    if (preset == LOWBIT_PRESET_ADAMW_4BIT_FACTOR) assert_true(bpp < 0.6);
    /* a 1-D param of the same size falls back to 4-bit blocks */
    pc.ndim = 0;
    CHECK_OK(NULL, lowbit_plan_param_state(&oc, &h, &pc, &plan));
    assert_int_equal(plan.normalization[1], LOWBIT_NORMALIZATION_BLOCK);
    assert_int_equal(plan.format[1], LOWBIT_STATE_4BIT);
    assert_int_equal(plan.block_size[1], 128);
    /* a 0.2 caller's plan struct gets the fields it knows */
    lowbit_state_plan_t old;
    memset(&old, 0xAB, sizeof old);
    old.struct_size = offsetof(lowbit_state_plan_t, normalization);
    CHECK_OK(NULL, lowbit_plan_param_state(&oc, &h, &pc, &old));
    assert_int_equal(old.state_bytes, plan.state_bytes);
    assert_int_equal(((const unsigned char*)&old)[offsetof(lowbit_state_plan_t, normalization)], 0xAB);
  }
  /* the optimizer allocates what the plan says */
  lowbit_optimizer_config_t oc;
  CHECK_OK(NULL, lowbit_optimizer_config_preset(&oc, LOWBIT_PRESET_LPMM_ADAMW_4BIT));
  lowbit_hparams_t h;
  CHECK_OK(NULL, lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW));
  lowbit_optimizer_t opt;
  CHECK_OK(NULL, lowbit_optimizer_create(&opt, &oc, &h));
  float* p = calloc(3 * 5 * 257, 4);
  lowbit_param_config_t pc;
  CHECK_OK(NULL, lowbit_param_config_init(&pc));
  pc.param = make_tensor(p, 3 * 5 * 257, LOWBIT_DTYPE_FLOAT32);
  pc.ndim = 3;
  pc.shape[0] = 3, pc.shape[1] = 5, pc.shape[2] = 257;
  int64_t id, bytes;
  CHECK_OK(opt, lowbit_optimizer_add_param(opt, &pc, &id));
  lowbit_state_plan_t plan;
  plan.struct_size = sizeof plan;
  CHECK_OK(NULL, lowbit_plan_param_state(&oc, &h, &pc, &plan));
  CHECK_OK(opt, lowbit_optimizer_state_bytes(opt, id, &bytes));
  assert_int_equal(bytes, plan.state_bytes);
  CHECK_OK(opt, lowbit_optimizer_destroy(opt));
  free(p);
}

/* ------------------------------------------------------------------ bad input */

static void expect_error(lowbit_optimizer_t opt, lowbit_param_config_t* pc, lowbit_status_t want, const char* needle) {
  int64_t before, after, id = -7;
  CHECK_OK(opt, lowbit_optimizer_num_params(opt, &before));
  lowbit_status_t st = lowbit_optimizer_add_param(opt, pc, &id);
  CHECK_OK(opt, lowbit_optimizer_num_params(opt, &after));
  const char* msg = lowbit_optimizer_last_error(opt);
  if (st != want || !strstr(msg, needle) || after != before || id != -7)
    fail_msg("expected status %d naming \"%s\", got %d: \"%s\" (params %lld -> %lld)", (int)want, needle, (int)st, msg,
             (long long)before, (long long)after);
  lowbit_state_plan_t plan;
  plan.struct_size = sizeof plan;
  (void)plan;
}

static void test_bad_input(void** state) {
  (void)state;
  lowbit_optimizer_config_t oc;
  CHECK_OK(NULL, lowbit_optimizer_config_preset(&oc, LOWBIT_PRESET_ADAMW_4BIT_FACTOR));
  lowbit_hparams_t h;
  CHECK_OK(NULL, lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW));
  lowbit_optimizer_t opt;
  CHECK_OK(NULL, lowbit_optimizer_create(&opt, &oc, &h));
  float* p = calloc(1000, 4);
  lowbit_param_config_t pc, base;
  CHECK_OK(NULL, lowbit_param_config_init(&base));
  base.param = make_tensor(p, 1000, LOWBIT_DTYPE_FLOAT32);
  pc = base, pc.ndim = 2, pc.shape[0] = 10, pc.shape[1] = 99;
  expect_error(opt, &pc, LOWBIT_ERROR_INVALID_ARGUMENT, "shape (10, 99) has 990 elements but param.numel = 1000");
  pc = base, pc.ndim = 9;
  expect_error(opt, &pc, LOWBIT_ERROR_INVALID_ARGUMENT, "ndim = 9");
  pc = base, pc.ndim = -1;
  expect_error(opt, &pc, LOWBIT_ERROR_INVALID_ARGUMENT, "ndim = -1");
  pc = base, pc.ndim = 3, pc.shape[0] = 10, pc.shape[1] = 0, pc.shape[2] = 100;
  expect_error(opt, &pc, LOWBIT_ERROR_INVALID_ARGUMENT, "shape[1] = 0");
  pc = base, pc.ndim = 2, pc.shape[0] = INT64_MAX / 2, pc.shape[1] = 4;
  expect_error(opt, &pc, LOWBIT_ERROR_INVALID_ARGUMENT, "overflows");
  pc = base, pc.second_normalization = LOWBIT_NORMALIZATION_FACTORED;
  expect_error(opt, &pc, LOWBIT_ERROR_INVALID_ARGUMENT, "second_normalization = factored needs a parameter of at least 2");
  pc = base, pc.ndim = 1, pc.shape[0] = 1000, pc.second_normalization = LOWBIT_NORMALIZATION_FACTORED;
  expect_error(opt, &pc, LOWBIT_ERROR_INVALID_ARGUMENT, "(ndim = 1)");
  pc = base, pc.first_normalization = LOWBIT_NORMALIZATION_FACTORED;
  expect_error(opt, &pc, LOWBIT_ERROR_INVALID_ARGUMENT, "first_normalization = factored");
  pc = base, pc.second_normalization = (lowbit_normalization_t)7;
  expect_error(opt, &pc, LOWBIT_ERROR_INVALID_ARGUMENT, "second_normalization = 7");
  pc = base, pc.ndim = 2, pc.shape[0] = 10, pc.shape[1] = 100, pc.second_state_format = LOWBIT_STATE_FP8,
  pc.second_normalization = LOWBIT_NORMALIZATION_RANK1;
  expect_error(opt, &pc, LOWBIT_ERROR_UNSUPPORTED, "second_normalization = rank1 needs the 8bit or 4bit");
  /* the default factored on a 1-D param is not an error: blocks */
  pc = base;
  int64_t id;
  CHECK_OK(opt, lowbit_optimizer_add_param(opt, &pc, &id));
  CHECK_OK(opt, lowbit_optimizer_destroy(opt));

  /* configs */
  lowbit_optimizer_config_t bad;
  CHECK_OK(NULL, lowbit_optimizer_config_init(&bad, LOWBIT_ALGORITHM_LION));
  bad.second_normalization = LOWBIT_NORMALIZATION_FACTORED;
  assert_int_equal(lowbit_optimizer_create(&opt, &bad, &h), LOWBIT_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(lowbit_last_error(), "second_normalization = factored needs AdamW or Adam"));
  assert_null(opt);
  CHECK_OK(NULL, lowbit_optimizer_config_init(&bad, LOWBIT_ALGORITHM_ADAMW));
  bad.state_format = LOWBIT_STATE_FP8;
  bad.first_normalization = LOWBIT_NORMALIZATION_RANK1;
  assert_int_equal(lowbit_optimizer_create(&opt, &bad, &h), LOWBIT_ERROR_UNSUPPORTED);
  assert_non_null(strstr(lowbit_last_error(), "first_normalization = rank1"));
  assert_int_equal(lowbit_optimizer_config_preset(&bad, (lowbit_preset_t)9), LOWBIT_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(lowbit_last_error(), "preset = 9"));
  CHECK_OK(NULL, lowbit_optimizer_config_init(&bad, LOWBIT_ALGORITHM_ADAMW));
  bad.struct_size = 24;
  assert_int_equal(lowbit_optimizer_create(&opt, &bad, &h), LOWBIT_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(lowbit_last_error(), "config.struct_size = 24"));
  free(p);
}

/* Callers built against 0.2 (smaller structs, no shape fields): 1-D blocks. */
static void test_old_struct_sizes(void** state) {
  (void)state;
  lowbit_optimizer_config_t oc;
  CHECK_OK(NULL, lowbit_optimizer_config_init(&oc, LOWBIT_ALGORITHM_ADAMW));
  oc.state_format = LOWBIT_STATE_4BIT;
  oc.struct_size = offsetof(lowbit_optimizer_config_t, first_normalization);
  oc.first_normalization = (lowbit_normalization_t)1234; /* beyond the old struct: never read */
  lowbit_hparams_t h;
  CHECK_OK(NULL, lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW));
  lowbit_optimizer_t opt;
  CHECK_OK(NULL, lowbit_optimizer_create(&opt, &oc, &h));
  float* p = calloc(5000, 4);
  lowbit_param_config_t pc;
  CHECK_OK(NULL, lowbit_param_config_init(&pc));
  pc.param = make_tensor(p, 5000, LOWBIT_DTYPE_FLOAT32);
  pc.struct_size = offsetof(lowbit_param_config_t, shape);
  pc.ndim = 77; /* in the old struct's tail padding: not the caller's */
  int64_t id;
  CHECK_OK(opt, lowbit_optimizer_add_param(opt, &pc, &id));
  lowbit_param_info_t info;
  memset(&info, 0xCD, sizeof info);
  info.struct_size = offsetof(lowbit_param_info_t, first_normalization);
  CHECK_OK(opt, lowbit_optimizer_param_info(opt, id, &info));
  assert_int_equal(info.state_format, LOWBIT_STATE_4BIT);
  assert_int_equal(((const unsigned char*)&info)[offsetof(lowbit_param_info_t, first_normalization)], 0xCD);
  info.struct_size = sizeof info;
  CHECK_OK(opt, lowbit_optimizer_param_info(opt, id, &info));
  assert_int_equal(info.ndim, 0);
  assert_int_equal(info.second_normalization, LOWBIT_NORMALIZATION_BLOCK);
  CHECK_OK(opt, lowbit_optimizer_destroy(opt));
  free(p);
}

/* write_moment / read_moment: rank-1 codes as the reference quantizes them;
 * a non-negative rank-1 v written into factored form reads back (within
 * fp32 rounding). */
static void test_moments_io(void** state) {
  (void)state;
  rng_t r = test_rng("moments_io");
  for (int preset = LOWBIT_PRESET_LPMM_ADAMW_4BIT; preset <= LOWBIT_PRESET_ADAMW_4BIT_FACTOR; ++preset) {
    lowbit_optimizer_config_t oc;
    CHECK_OK(NULL, lowbit_optimizer_config_preset(&oc, (lowbit_preset_t)preset));
    oc.min_quantized_numel = 0;
    lowbit_hparams_t h;
    CHECK_OK(NULL, lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW));
    lowbit_optimizer_t opt;
    CHECK_OK(NULL, lowbit_optimizer_create(&opt, &oc, &h));
    const int64_t n = 3 * 5 * 257;
    ref_shape_t rs = {3, {3, 5, 257}};
    float* p = calloc((size_t)n, 4);
    float* v = calloc((size_t)n, 4);
    float* back = calloc((size_t)n, 4);
    lowbit_param_config_t pc;
    CHECK_OK(NULL, lowbit_param_config_init(&pc));
    pc.param = make_tensor(p, n, LOWBIT_DTYPE_FLOAT32);
    pc.ndim = 3, pc.shape[0] = 3, pc.shape[1] = 5, pc.shape[2] = 257;
    int64_t id;
    CHECK_OK(opt, lowbit_optimizer_add_param(opt, &pc, &id));
    double a[15], b[3 * 257];
    for (int k = 0; k < 15; ++k) a[k] = rng_uniform(&r) + 0.01;
    for (int k = 0; k < 3 * 257; ++k) b[k] = pow(10.0, -4 * rng_uniform(&r));
    for (int64_t e = 0; e < n; ++e) v[e] = (float)(a[e / 257] * b[(e / (5 * 257)) * 257 + e % 257]);
    CHECK_OK(opt, lowbit_optimizer_write_moment(opt, id, 1, v, n, NULL));
    CHECK_OK(opt, lowbit_optimizer_read_moment(opt, id, 1, back, n, NULL));
    if (preset == LOWBIT_PRESET_ADAMW_4BIT_FACTOR) {
      for (int64_t e = 0; e < n; ++e)
        if (fabs(back[e] - v[e]) > 1e-5 * v[e]) fail_msg("factored v[%lld] %.9g read back as %.9g", (long long)e, v[e], back[e]);
    } else {
      float* vec = calloc((size_t)ref_dim_sum(&rs), 4);
      ref_rank1_vectors(&rs, v, n, vec);
      for (int64_t e = 0; e < n; ++e) {
        float sc = ref_rank1_scale(&rs, vec, e);
        int k = ref_code(&g_qmaps[QMAP_U4], 1, v[e], sc, NULL);
        float want = (float)g_qmaps[QMAP_U4].v[k] * sc;
        if (memcmp(&want, &back[e], 4))
          fail_msg("rank-1 v[%lld] %.9g read back as %.9g, reference %.9g", (long long)e, v[e], back[e], want);
      }
      free(vec);
    }
    /* a negative second moment is refused, nothing changes */
    v[5] = -1.f;
    assert_int_equal(lowbit_optimizer_write_moment(opt, id, 1, v, n, NULL), LOWBIT_ERROR_INVALID_ARGUMENT);
    float* again = calloc((size_t)n, 4);
    CHECK_OK(opt, lowbit_optimizer_read_moment(opt, id, 1, again, n, NULL));
    assert_memory_equal(again, back, 4 * (size_t)n);
    CHECK_OK(opt, lowbit_optimizer_destroy(opt));
    free(p), free(v), free(back), free(again);
  }
}

int main(void) {
  test_seed_init("test_shaped");
  if (getenv("LOWBIT_TEST_FILTER")) cmocka_set_test_filter(getenv("LOWBIT_TEST_FILTER"));
  qmaps_init();
  e4m3_init();
  enum { NCASES = sizeof kCases / sizeof kCases[0] };
  struct CMUnitTest tests[NCASES + 4];
  int k = 0;
  for (int i = 0; i < NCASES; ++i) {
    struct CMUnitTest t = cmocka_unit_test_prestate(test_lockstep, (void*)(intptr_t)i);
    tests[k++] = t;
  }
  {
    struct CMUnitTest t1 = cmocka_unit_test(test_plan_and_bytes);
    struct CMUnitTest t2 = cmocka_unit_test(test_bad_input);
    struct CMUnitTest t3 = cmocka_unit_test(test_old_struct_sizes);
    struct CMUnitTest t4 = cmocka_unit_test(test_moments_io);
    tests[k++] = t1;
    tests[k++] = t2;
    tests[k++] = t3;
    tests[k++] = t4;
  }
  return _cmocka_run_group_tests("shaped", tests, (size_t)k, NULL, NULL);
}
