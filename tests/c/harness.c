#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

qmap_t g_qmaps[NUM_QMAPS];
double g_e4m3[127];
double g_e4m3_mid[128];

/* Builds the reference tables once (the maps are checked against the golden
 * values by test_quantized's first test). */
static void ref_tables_init(void) {
  static int ready;
  if (ready) return;
  qmaps_init();
  e4m3_init();
  ready = 1;
}

/* ------------------------------------------------------------------ helpers */

int hparams_equal(const lowbit_hparams_t* a, const lowbit_hparams_t* b) {
  return a->struct_size == b->struct_size && a->lr == b->lr && a->beta1 == b->beta1 && a->beta2 == b->beta2 &&
         a->eps == b->eps && a->weight_decay == b->weight_decay && a->momentum == b->momentum &&
         a->dampening == b->dampening && a->nesterov == b->nesterov && a->bias_correction == b->bias_correction &&
         a->alpha == b->alpha && a->centered == b->centered && a->lr_decay == b->lr_decay &&
         a->initial_accumulator_value == b->initial_accumulator_value;
}

static void* xcalloc(size_t n, size_t sz) {
  void* p = calloc(n ? n : 1, sz);
  if (!p) fail_msg("out of memory (%zu x %zu)", n, sz);
  return p;
}

void random_hparams(lowbit_algorithm_t algo, rng_t* r, lowbit_hparams_t* h) {
  assert_int_equal(lowbit_hparams_init(h, algo), LOWBIT_SUCCESS);
  switch (algo) {
    case LOWBIT_ALGORITHM_ADAMW:
    case LOWBIT_ALGORITHM_ADAM:
      h->lr = (float)rng_range(r, 1e-3, 1e-2);
      h->beta1 = (float)rng_range(r, 0.8, 0.95);
      h->beta2 = (float)rng_range(r, 0.95, 0.999);
      h->eps = rng_uniform(r) < 0.5 ? 1e-8f : 1e-6f;
      h->weight_decay = (float)rng_range(r, 0.0, 0.1);
      h->bias_correction = 1;
      break;
    case LOWBIT_ALGORITHM_LION:
      h->lr = (float)rng_range(r, 1e-4, 1e-3);
      h->beta1 = (float)rng_range(r, 0.85, 0.95);
      h->beta2 = (float)rng_range(r, 0.95, 0.995);
      h->weight_decay = (float)rng_range(r, 0.0, 0.1);
      break;
    case LOWBIT_ALGORITHM_SGD:
      h->lr = (float)rng_range(r, 1e-3, 1e-2);
      h->momentum = (float)rng_range(r, 0.5, 0.95);
      h->dampening = (float)rng_range(r, 0.0, 0.5);
      h->nesterov = 0;
      h->weight_decay = (float)rng_range(r, 0.0, 0.05);
      break;
    case LOWBIT_ALGORITHM_RMSPROP:
      h->lr = (float)rng_range(r, 1e-4, 1e-3);
      h->alpha = (float)rng_range(r, 0.9, 0.99);
      h->eps = rng_uniform(r) < 0.5 ? 1e-8f : 1e-6f;
      h->weight_decay = (float)rng_range(r, 0.0, 0.05);
      break;
    case LOWBIT_ALGORITHM_ADAGRAD:
      h->lr = (float)rng_range(r, 1e-3, 1e-2);
      h->lr_decay = (float)rng_range(r, 0.0, 0.01);
      h->initial_accumulator_value = rng_uniform(r) < 0.5 ? 0.f : (float)rng_range(r, 0.0, 0.1);
      h->eps = 1e-10f;
      h->weight_decay = (float)rng_range(r, 0.0, 0.05);
      break;
    default: break;
  }
}

lowbit_state_format_t expected_format(const hcfg_t* cfg, const pspec_t* ps, int moment) {
  int64_t thr = cfg->min_quantized_numel < 0 ? 4096 : cfg->min_quantized_numel;
  lowbit_state_format_t opt_first = cfg->fmt == LOWBIT_STATE_DEFAULT ? LOWBIT_STATE_FP32 : cfg->fmt;
  lowbit_state_format_t opt_second = cfg->fmt2 == LOWBIT_STATE_DEFAULT ? opt_first : cfg->fmt2;
  if (moment == 0) {
    if (ps->fmt != LOWBIT_STATE_DEFAULT) return ps->fmt;
    return format_is_quantized(opt_first) && ps->numel < thr ? LOWBIT_STATE_FP32 : opt_first;
  }
  if (ps->fmt2 != LOWBIT_STATE_DEFAULT) return ps->fmt2;
  if (ps->fmt != LOWBIT_STATE_DEFAULT) return ps->fmt;
  return format_is_quantized(opt_second) && ps->numel < thr ? LOWBIT_STATE_FP32 : opt_second;
}

typedef struct {
  pspec_t spec;
  void *p, *g, *g2;
  double *fp, *fm, *fv, *tolacc, *p0, *pmax, *path;
  int64_t t;
  int nm;
  lowbit_state_format_t f[2];
  int active;
} hparam_t;

/* Scratch of the lockstep check, sized for the largest param. */
typedef struct {
  double *gd, *lp, *lm, *lv, *ep, *em, *ev, *sp, *sm, *sv, *lion_base, *sqm, *sqv;
  uint8_t* amb;
  float *rd, *am, *av;
} scratch_t;

static double lr_schedule(int s, int steps) {
  double warm = (s + 1) / 5.0;
  if (warm > 1) warm = 1;
  return warm * (0.55 + 0.45 * cos(3.141592653589793 * s / steps));
}

/* Accepts a rounded result L (16-bit param or bf16 moment) for the float64
 * value x whose fp32 computation may be off by tol: L must be what rounding
 * some value within [x - tol, x + tol] gives (rounding is monotone, so the
 * interval's end points bound it). *flipped: L is not round(x) itself. */
static int rounded_match(double L, double x, double tol, lowbit_dtype_t dt, int* flipped) {
  double R = dtype_round(dt, x);
  *flipped = 0;
  if (L == R) return 1;
  if (!(L >= dtype_round(dt, x - tol) && L <= dtype_round(dt, x + tol))) return 0;
  *flipped = 1;
  return 1;
}

static int param_match(double L, double x, double scale, lowbit_dtype_t dt, int* flipped) {
  double tol = REF_K * REF_U * scale + 1e-45;
  if (dt == LOWBIT_DTYPE_FLOAT32) {
    *flipped = 0;
    return fabs(L - x) <= tol;
  }
  return rounded_match(L, x, tol, dt, flipped);
}

/* Compares a moment read back from the library with the reference of this
 * step (x: float64 moments, sc: their error scales, am: the reference block
 * scales). Returns the number of failures; counts flips. */
static int64_t compare_moment(const char* what, int pi, lowbit_state_format_t fmt, const float* lib,
                              const double* x, const double* stored, const double* sc, const float* am, int64_t n,
                              int64_t* flips, const scratch_t* S, int moment) {
  int64_t bad = 0;
  int block = format_block(fmt);
  for (int64_t b = 0; b < n; b += block) {
    int64_t end = b + block < n ? b + block : n;
    double scmax = 0;
    for (int64_t i = b; i < end; ++i) scmax = fmax(scmax, sc[i]);
    for (int64_t i = b; i < end; ++i) {
      double L = lib[i];
      int ok = 0, fl = 0;
      double tol = REF_K * REF_U * sc[i] + 1e-45;
      double q = x[i], lo = x[i], hi = x[i];
      if (fmt == LOWBIT_STATE_FP32) {
        ok = fabs(L - x[i]) <= tol;
      } else if (fmt == LOWBIT_STATE_BF16) {
        ok = rounded_match(L, x[i], tol, LOWBIT_DTYPE_BFLOAT16, &fl);
        q = round_bf16(x[i]);
      } else {
        /* The library's block scale may differ from ours by the fp32 error of
         * the block's largest element (<= 16 u scmax); that moves every
         * decoded value by at most that much, and every code input x/absmax
         * by at most 16 u (sc + scmax) + 4 u absmax in input units. */
        double a = am[i];
        double dec_tol = REF_K * REF_U * scmax + 4 * REF_U * a + 1e-45;
        double in_tol = REF_K * REF_U * (sc[i] + scmax) + 4 * REF_U * a;
        q = stored[i];
        if (fabs(L - q) <= dec_tol) {
          ok = 1;
        } else {
          lo = ref_quant_value(fmt, moment, am[i], x[i] - in_tol);
          hi = ref_quant_value(fmt, moment, am[i], x[i] + in_tol);
          ok = L >= lo - dec_tol && L <= hi + dec_tol;
          fl = ok;
        }
      }
      *flips += fl;
      if (!ok) {
        if (bad < 5)
          print_error("  %s moment %d of param %d elem %lld (%s): lib %.9g, ref %.9g stored as %.9g (accepted "
                      "[%.9g, %.9g]), block absmax %.9g, error scale %.3g; step input p %.9g g %.9g m %.9g v %.9g\n",
                      what, moment, pi, (long long)i, format_name(fmt), L, x[i], q, lo, hi, (double)am[i], sc[i],
                      S->lp[i], S->gd[i], S->lm[i], S->lv[i]);
        ++bad;
      }
    }
  }
  return bad;
}

static void check_info(lowbit_optimizer_t opt, const hcfg_t* cfg, const hparam_t* P, int64_t id) {
  lowbit_param_info_t info;
  memset(&info, 0xAB, sizeof info);
  info.struct_size = sizeof info;
  CHECK_OK(opt, lowbit_optimizer_param_info(opt, id, &info));
  if (info.numel != P->spec.numel || info.step != P->t || info.group != P->spec.group ||
      info.param_dtype != P->spec.pdt)
    fail_msg("%s: param_info of param %lld: numel %lld step %lld group %d dtype %d, expected %lld %lld %d %d",
             cfg->name, (long long)id, (long long)info.numel, (long long)info.step, info.group,
             (int)info.param_dtype, (long long)P->spec.numel, (long long)P->t, P->spec.group, (int)P->spec.pdt);
  int64_t want_bytes = 0;
  for (int m = 0; m < P->nm; ++m) want_bytes += format_bytes(P->f[m], P->spec.numel);
  if (P->nm >= 1 && info.state_format != P->f[0])
    fail_msg("%s: param %lld state_format %s, expected %s", cfg->name, (long long)id, format_name(info.state_format),
             format_name(P->f[0]));
  if (P->nm == 2 && info.second_state_format != P->f[1])
    fail_msg("%s: param %lld second_state_format %s, expected %s", cfg->name, (long long)id,
             format_name(info.second_state_format), format_name(P->f[1]));
  if (P->nm == 1 && info.second_state_format != LOWBIT_STATE_DEFAULT)
    fail_msg("%s: param %lld has one moment but second_state_format %s", cfg->name, (long long)id,
             format_name(info.second_state_format));
  if (info.stochastic_rounding != 0 || info.error_correction != 0)
    fail_msg("%s: param %lld: stochastic_rounding %d error_correction %d, expected 0 0", cfg->name, (long long)id,
             info.stochastic_rounding, info.error_correction);
  if (info.state_bytes != want_bytes)
    fail_msg("%s: param %lld (%lld elements, %s/%s): state_bytes %lld, expected %lld", cfg->name, (long long)id,
             (long long)P->spec.numel, format_name(P->f[0]), format_name(P->f[1]), (long long)info.state_bytes,
             (long long)want_bytes);
  int64_t sb = -1;
  CHECK_OK(opt, lowbit_optimizer_state_bytes(opt, id, &sb));
  assert_int_equal(sb, want_bytes);
}

static double update_factor(const ref_hp_t* h, int64_t t) {
  switch (h->algo) {
    case LOWBIT_ALGORITHM_ADAMW:
    case LOWBIT_ALGORITHM_ADAM: return 2.0 + 1.0 / (1.0 - h->b1) + (double)t;
    case LOWBIT_ALGORITHM_SGD: return 2.0 + (h->mom != 0 ? 1.0 / (1.0 - h->mom) : 0.0);
    case LOWBIT_ALGORITHM_RMSPROP: return 2.0 + 1.0 / (1.0 - h->alpha) + (h->mom != 0 ? 1.0 / (1.0 - h->mom) : 0.0);
    case LOWBIT_ALGORITHM_ADAGRAD: return 2.0 + (double)t;
    default: return 1.0;
  }
}

/* ------------------------------------------------------------------ the run */

void harness_run(const hcfg_t* cfg, uint64_t seed, hres_t* res) {
  ref_tables_init();
  rng_t r = {seed};
  rng_next(&r);
  memset(res, 0, sizeof *res);

  lowbit_optimizer_config_t oc;
  CHECK_OK(NULL, lowbit_optimizer_config_init(&oc, cfg->algo));
  oc.state_format = cfg->fmt;
  oc.second_state_format = cfg->fmt2;
  if (cfg->min_quantized_numel >= 0) oc.min_quantized_numel = cfg->min_quantized_numel;
  oc.num_threads = cfg->num_threads;
  oc.seed = seed;
  lowbit_optimizer_t opt = NULL;
  CHECK_OK(NULL, lowbit_optimizer_create(&opt, &oc, &cfg->groups[0]));
  assert_non_null(opt);

  ref_hp_t hp[4];
  lowbit_hparams_t cur[4];
  for (int gi = 0; gi < cfg->ngroups; ++gi) {
    cur[gi] = cfg->groups[gi];
    if (gi > 0) {
      int32_t gid = -1;
      CHECK_OK(opt, lowbit_optimizer_add_group(opt, &cfg->groups[gi], &gid));
      assert_int_equal(gid, gi);
    }
    hp[gi] = ref_hp_from(cfg->algo, &cur[gi]);
  }

  hparam_t* P = xcalloc((size_t)cfg->nparams, sizeof *P);
  int64_t maxn = 1;
  for (int i = 0; i < cfg->nparams; ++i) {
    hparam_t* q = &P[i];
    q->spec = cfg->params[i];
    if (q->spec.p_scale == 0) q->spec.p_scale = 1.0;
    if (q->spec.g_scale == 0) q->spec.g_scale = 1.0;
    int64_t n = q->spec.numel;
    if (n > maxn) maxn = n;
    res->elements += n;
    if (q->spec.pdt != LOWBIT_DTYPE_FLOAT32) res->elements16 += n;
    q->p = xcalloc((size_t)n, dtype_size(q->spec.pdt));
    q->g = xcalloc((size_t)n, dtype_size(q->spec.gdt));
    q->g2 = xcalloc((size_t)n, dtype_size(q->spec.gdt));
    q->fp = xcalloc((size_t)n, sizeof(double));
    q->fm = xcalloc((size_t)n, sizeof(double));
    q->fv = xcalloc((size_t)n, sizeof(double));
    q->tolacc = xcalloc((size_t)n, sizeof(double));
    q->p0 = xcalloc((size_t)n, sizeof(double));
    q->pmax = xcalloc((size_t)n, sizeof(double));
    q->path = xcalloc((size_t)n, sizeof(double));
    for (int64_t e = 0; e < n; ++e) {
      tensor_set(q->p, q->spec.pdt, e, q->spec.p_scale * rng_normal(&r));
      q->fp[e] = q->p0[e] = tensor_get(q->p, q->spec.pdt, e);
      q->pmax[e] = fabs(q->p0[e]);
    }
    q->nm = ref_num_moments(&hp[q->spec.group]);
    q->f[0] = expected_format(cfg, &q->spec, 0);
    q->f[1] = expected_format(cfg, &q->spec, 1);
    for (int m = 0; m < 2; ++m) /* 4BIT_DYN changes only an unsigned moment's map: a signed one is planned 4BIT */
      if (q->f[m] == LOWBIT_STATE_4BIT_DYN && !ref_moment_second(&hp[q->spec.group], m)) q->f[m] = LOWBIT_STATE_4BIT;
    lowbit_param_config_t pc;
    CHECK_OK(opt, lowbit_param_config_init(&pc));
    pc.param = make_tensor(q->p, n, q->spec.pdt);
    if (i % 2 == 0) pc.grad = make_tensor(q->g, n, q->spec.gdt); /* half registered up front */
    pc.group = q->spec.group;
    pc.state_format = q->spec.fmt;
    pc.second_state_format = q->spec.fmt2;
    int64_t id = -1;
    CHECK_OK(opt, lowbit_optimizer_add_param(opt, &pc, &id));
    assert_int_equal(id, i);
    check_info(opt, cfg, q, i);
  }
  int64_t np = -1;
  CHECK_OK(opt, lowbit_optimizer_num_params(opt, &np));
  assert_int_equal(np, cfg->nparams);

  scratch_t S;
  S.gd = xcalloc((size_t)maxn, sizeof(double));
  S.lp = xcalloc((size_t)maxn, sizeof(double));
  S.lm = xcalloc((size_t)maxn, sizeof(double));
  S.lv = xcalloc((size_t)maxn, sizeof(double));
  S.ep = xcalloc((size_t)maxn, sizeof(double));
  S.em = xcalloc((size_t)maxn, sizeof(double));
  S.ev = xcalloc((size_t)maxn, sizeof(double));
  S.sp = xcalloc((size_t)maxn, sizeof(double));
  S.sm = xcalloc((size_t)maxn, sizeof(double));
  S.sv = xcalloc((size_t)maxn, sizeof(double));
  S.lion_base = xcalloc((size_t)maxn, sizeof(double));
  S.sqm = xcalloc((size_t)maxn, sizeof(double));
  S.sqv = xcalloc((size_t)maxn, sizeof(double));
  S.amb = xcalloc((size_t)maxn, 1);
  S.rd = xcalloc((size_t)maxn, sizeof(float));
  S.am = xcalloc((size_t)maxn, sizeof(float));
  S.av = xcalloc((size_t)maxn, sizeof(float));
  /* all the gradient values of one step, per param (for the free-running model) */
  double** gall = xcalloc((size_t)cfg->nparams, sizeof(double*));
  for (int i = 0; i < cfg->nparams; ++i) gall[i] = xcalloc((size_t)P[i].spec.numel, sizeof(double));
  lowbit_tensor_t* gt = xcalloc((size_t)cfg->nparams, sizeof(lowbit_tensor_t));

  for (int s = 0; s < cfg->steps; ++s) {
    /* hyper-parameter changes */
    if (cfg->change_hparams && s == cfg->steps / 2 && s > 0) {
      for (int gi = 0; gi < cfg->ngroups; ++gi) {
        lowbit_hparams_t h = cur[gi];
        h.beta1 = (float)(h.beta1 * 0.97);
        h.beta2 = (float)(1.0 - (1.0 - h.beta2) * 1.5);
        h.weight_decay = (float)(h.weight_decay * 0.5 + 0.01);
        h.eps = h.eps * 2.f;
        if (cfg->algo == LOWBIT_ALGORITHM_ADAMW || cfg->algo == LOWBIT_ALGORITHM_ADAM)
          h.bias_correction = !h.bias_correction;
        if (cfg->algo == LOWBIT_ALGORITHM_SGD && h.momentum != 0.f) {
          h.momentum = (float)(h.momentum * 0.9);
          if (!h.nesterov) h.dampening = (float)(h.dampening * 0.5);
        }
        CHECK_OK(opt, lowbit_optimizer_set_hparams(opt, gi, &h));
        lowbit_hparams_t back;
        memset(&back, 0, sizeof back);
        back.struct_size = sizeof back;
        CHECK_OK(opt, lowbit_optimizer_get_hparams(opt, gi, &back));
        if (!hparams_equal(&back, &h)) fail_msg("%s: get_hparams does not return what set_hparams set", cfg->name);
        cur[gi] = h;
        hp[gi] = ref_hp_from(cfg->algo, &h);
      }
    }
    if (cfg->schedule) {
      for (int gi = 0; gi < cfg->ngroups; ++gi) {
        float lr = (float)(cfg->groups[gi].lr * lr_schedule(s, cfg->steps));
        CHECK_OK(opt, lowbit_optimizer_set_lr(opt, gi, lr));
        cur[gi].lr = lr;
        hp[gi].lr = lr;
      }
    }

    /* gradients */
    int with_grads = cfg->grad_mode == 1 || (cfg->grad_mode == 2 && (s & 1));
    for (int i = 0; i < cfg->nparams; ++i) {
      hparam_t* q = &P[i];
      int64_t n = q->spec.numel;
      q->active = !(cfg->skip_params && rng_uniform(&r) < 0.25);
      if (!with_grads && !(s == 0 && i % 2 == 0)) {
        /* registered mode: (re-)register every step; no grad = left alone */
        if (q->active) {
          lowbit_tensor_t t = make_tensor(q->g, n, q->spec.gdt);
          CHECK_OK(opt, lowbit_optimizer_set_grad(opt, i, &t));
        } else {
          CHECK_OK(opt, lowbit_optimizer_set_grad(opt, i, NULL));
        }
      } else if (!with_grads && s == 0 && i % 2 == 0) {
        q->active = 1; /* registered at add_param */
      }
      void* buf = with_grads ? q->g2 : q->g;
      gt[i] = make_tensor(q->active ? q->g2 : NULL, n, q->spec.gdt);
      if (!q->active) continue;
      for (int64_t e = 0; e < n; ++e) {
        double gv = q->spec.g_scale * rng_normal(&r);
        if (rng_uniform(&r) < 0.01) gv = 0.0;
        if (q->spec.zero_blocks && ((e / 256) % 2 == 0)) gv = 0.0;
        tensor_set(buf, q->spec.gdt, e, gv);
        gall[i][e] = tensor_get(buf, q->spec.gdt, e);
      }
    }

    /* lockstep expectations are computed param by param after the step, from
     * snapshots taken now */
    double** snap_p = xcalloc((size_t)cfg->nparams, sizeof(double*));
    float** snap_m = xcalloc((size_t)cfg->nparams, sizeof(float*));
    float** snap_v = xcalloc((size_t)cfg->nparams, sizeof(float*));
    if (!cfg->no_lockstep) {
      for (int i = 0; i < cfg->nparams; ++i) {
        hparam_t* q = &P[i];
        int64_t n = q->spec.numel;
        snap_p[i] = xcalloc((size_t)n, sizeof(double));
        for (int64_t e = 0; e < n; ++e) snap_p[i][e] = tensor_get(q->p, q->spec.pdt, e);
        if (q->nm >= 1) {
          snap_m[i] = xcalloc((size_t)n, sizeof(float));
          CHECK_OK(opt, lowbit_optimizer_read_moment(opt, i, 0, snap_m[i], n, NULL));
        }
        if (q->nm >= 2) {
          snap_v[i] = xcalloc((size_t)n, sizeof(float));
          CHECK_OK(opt, lowbit_optimizer_read_moment(opt, i, 1, snap_v[i], n, NULL));
        }
      }
    }

    if (with_grads)
      CHECK_OK(opt, lowbit_optimizer_step_with_grads(opt, gt, cfg->nparams, NULL));
    else
      CHECK_OK(opt, lowbit_optimizer_step(opt, NULL));
    int32_t skipped = -1;
    CHECK_OK(opt, lowbit_optimizer_last_step_skipped(opt, &skipped));
    assert_int_equal(skipped, 0);

    for (int i = 0; i < cfg->nparams; ++i) {
      hparam_t* q = &P[i];
      int64_t n = q->spec.numel;
      const ref_hp_t* h = &hp[q->spec.group];
      if (!q->active) {
        /* untouched: params and state bit for bit */
        if (!cfg->no_lockstep) {
          for (int64_t e = 0; e < n; ++e)
            if (tensor_get(q->p, q->spec.pdt, e) != snap_p[i][e] &&
                !(isnan(snap_p[i][e]) && isnan(tensor_get(q->p, q->spec.pdt, e))))
              fail_msg("%s step %d: param %d had no grad but element %lld changed", cfg->name, s, i, (long long)e);
          for (int m = 0; m < q->nm; ++m) {
            CHECK_OK(opt, lowbit_optimizer_read_moment(opt, i, m, S.rd, n, NULL));
            if (memcmp(S.rd, m ? snap_v[i] : snap_m[i], (size_t)n * sizeof(float)) != 0)
              fail_msg("%s step %d: param %d had no grad but moment %d changed", cfg->name, s, i, m);
          }
        }
        check_info(opt, cfg, q, i);
        continue;
      }
      q->t += 1;
      /* ---- lockstep */
      ref_step_t kc = ref_step_consts(h, q->t);
      if (!cfg->no_lockstep) {
        for (int64_t e = 0; e < n; ++e) {
          S.gd[e] = gall[i][e];
          S.lp[e] = snap_p[i][e];
          S.lm[e] = q->nm >= 1 ? snap_m[i][e] : 0.0;
          S.lv[e] = q->nm >= 2 ? snap_v[i][e] : 0.0;
          double p = S.lp[e], m = S.lm[e], v = S.lv[e];
          ref_scale_t sc;
          ref_update(h, &kc, &p, S.gd[e], &m, &v, &sc);
          S.ep[e] = p;
          S.em[e] = m;
          S.ev[e] = v;
          S.sp[e] = sc.p;
          S.sm[e] = sc.m;
          S.sv[e] = sc.v;
          S.amb[e] = (uint8_t)sc.sign_ambiguous;
          S.lion_base[e] = sc.lion_base;
        }
        int64_t bad = 0;
        for (int64_t e = 0; e < n; ++e) {
          double L = tensor_get(q->p, q->spec.pdt, e);
          int fl = 0, ok = param_match(L, S.ep[e], S.sp[e], q->spec.pdt, &fl);
          if (!ok && S.amb[e]) {
            for (int sg = -1; sg <= 1 && !ok; ++sg)
              ok = param_match(L, S.lion_base[e] - h->lr * sg, S.sp[e], q->spec.pdt, &fl);
            if (ok) res->lion_ambiguous++;
          }
          res->p_flips += fl;
          if (!ok) {
            if (bad < 5)
              print_error("  %s step %d: param %d (%s, %lld elements) elem %lld: lib %.9g, ref %.9g (rounded "
                          "%.9g), error scale %.3g; input p %.9g g %.9g m %.9g v %.9g, t %lld\n",
                          cfg->name, s, i, dtype_name(q->spec.pdt), (long long)n, (long long)e, L, S.ep[e],
                          dtype_round(q->spec.pdt, S.ep[e]), S.sp[e], S.lp[e], S.gd[e], S.lm[e], S.lv[e],
                          (long long)q->t);
            ++bad;
          }
        }
        if (q->nm >= 1) {
          ref_store_moment(q->f[0], ref_moment_second(h, 0), S.em, S.sqm, S.am, n);
          CHECK_OK(opt, lowbit_optimizer_read_moment(opt, i, 0, S.rd, n, NULL));
          bad += compare_moment(cfg->name, i, q->f[0], S.rd, S.em, S.sqm, S.sm, S.am, n, &res->m_flips, &S,
                                ref_moment_second(h, 0));
        }
        if (q->nm >= 2) {
          ref_store_moment(q->f[1], ref_moment_second(h, 1), S.ev, S.sqv, S.av, n);
          CHECK_OK(opt, lowbit_optimizer_read_moment(opt, i, 1, S.rd, n, NULL));
          bad += compare_moment(cfg->name, i, q->f[1], S.rd, S.ev, S.sqv, S.sv, S.av, n, &res->v_flips, &S,
                                ref_moment_second(h, 1));
        }
        if (bad) fail_msg("%s: step %d, param %d: %lld lockstep mismatches (seed %llu)", cfg->name, s, i,
                          (long long)bad, (unsigned long long)seed);
        res->checked += n;
      }
      /* ---- free-running model */
      double F = update_factor(h, q->t);
      for (int64_t e = 0; e < n; ++e) {
        ref_scale_t sc;
        double p = q->fp[e];
        ref_update(h, &kc, &q->fp[e], gall[i][e], &q->fm[e], &q->fv[e], &sc);
        q->tolacc[e] += REF_K * REF_U * (fabs(p) + F * fmax(sc.p - fabs(p), 0.0));
        q->path[e] += fabs(q->fp[e] - p); /* the attempted update, before any rounding */
        if (q->spec.pdt != LOWBIT_DTYPE_FLOAT32) q->fp[e] = dtype_round(q->spec.pdt, q->fp[e]);
        if (fabs(q->fp[e]) > q->pmax[e]) q->pmax[e] = fabs(q->fp[e]);
      }
      if (q->nm >= 1) ref_store_moment(q->f[0], ref_moment_second(h, 0), q->fm, q->fm, NULL, n);
      if (q->nm >= 2) ref_store_moment(q->f[1], ref_moment_second(h, 1), q->fv, q->fv, NULL, n);
      check_info(opt, cfg, q, i);
    }
    for (int i = 0; i < cfg->nparams; ++i) {
      free(snap_p[i]);
      free(snap_m[i]);
      free(snap_v[i]);
    }
    free(snap_p);
    free(snap_m);
    free(snap_v);
  }

  /* ---- free-running comparison */
  double sum_d = 0, sum_move = 0;
  for (int i = 0; i < cfg->nparams; ++i) {
    hparam_t* q = &P[i];
    for (int64_t e = 0; e < q->spec.numel; ++e) {
      double L = tensor_get(q->p, q->spec.pdt, e), R = q->fp[e];
      double d = fabs(L - R);
      if (!(d == d)) fail_msg("%s: param %d element %lld is NaN (ref %g)", cfg->name, i, (long long)e, R);
      sum_d += d;
      sum_move += fabs(R - q->p0[e]);
      if (d > res->free_max_abs) res->free_max_abs = d;
      /* hard per-element bound: the accumulated fp32 bound, plus, where
       * anything is rounded (16-bit param, bf16 / quantized moment), 2 ulps of
       * a 16-bit param (at the largest |p| it had) and state_drift x the path
       * length (sum of attempted update sizes): once a value flipped, later
       * updates differ in proportion to them (a flipped moment), and a 16-bit
       * param that sits at a different grid point may keep or drop (round
       * away) sub-half-ulp updates that the other run does not */
      int rounded = q->spec.pdt != LOWBIT_DTYPE_FLOAT32;
      for (int m = 0; m < q->nm; ++m) rounded |= q->f[m] != LOWBIT_STATE_FP32;
      double bound = q->tolacc[e] + (rounded ? cfg->state_drift * q->path[e] : 0.0);
      if (q->spec.pdt == LOWBIT_DTYPE_FLOAT32) {
        double ratio = q->tolacc[e] > 0 ? d / q->tolacc[e] : (d > 0 ? INFINITY : 0);
        if (ratio > res->free_max_ratio) res->free_max_ratio = ratio;
        if (d > q->tolacc[e]) res->free_beyond++;
      } else {
        /* a flip is one ulp where it happened: measure at the largest |p| the
         * element had, so a later move to a smaller binade does not inflate it */
        double ulp = dtype_ulp(q->spec.pdt, q->pmax[e]);
        if (d / ulp > res->free_max_ulps) res->free_max_ulps = d / ulp;
        if (d > q->tolacc[e]) res->free_beyond16++;
        bound += 2 * ulp;
      }
      if (rounded && q->path[e] > 0) {
        double excess = (d - q->tolacc[e] - (q->spec.pdt != LOWBIT_DTYPE_FLOAT32 ? 2 * dtype_ulp(q->spec.pdt, q->pmax[e]) : 0)) / q->path[e];
        if (excess > res->free_max_path_ratio) res->free_max_path_ratio = excess;
      }
      if (d > bound) {
        if (res->free_violations < 3)
          print_error("  %s: free-running param %d elem %lld: lib %.9g ref %.9g (p0 %.9g, path %.3g, bound %.3g)\n",
                      cfg->name, i, (long long)e, L, R, q->p0[e], q->path[e], bound);
        res->free_violations++;
      }
    }
  }
  res->free_mean_rel = sum_move > 0 ? sum_d / sum_move : 0;
  CHECK_OK(opt, lowbit_optimizer_state_bytes(opt, -1, &res->state_bytes));
  int64_t want_total = 0;
  for (int i = 0; i < cfg->nparams; ++i)
    for (int m = 0; m < P[i].nm; ++m) want_total += format_bytes(P[i].f[m], P[i].spec.numel);
  assert_int_equal(res->state_bytes, want_total);

  if (cfg->verbose)
    printf("  %-40s %8lld el | lockstep flips p %lld m %lld v %lld lion0 %lld | free: fp32 params beyond %lld "
           "(max/tol %.3g), 16-bit params beyond %lld/%lld (max %.3g ulp), excess/path %.2g, over bound %lld, drift %.2g\n",
           cfg->name, (long long)res->elements, (long long)res->p_flips, (long long)res->m_flips,
           (long long)res->v_flips, (long long)res->lion_ambiguous, (long long)res->free_beyond, res->free_max_ratio,
           (long long)res->free_beyond16, (long long)res->elements16, res->free_max_ulps, res->free_max_path_ratio, (long long)res->free_violations,
           res->free_mean_rel);

  CHECK_OK(opt, lowbit_optimizer_destroy(opt));
  for (int i = 0; i < cfg->nparams; ++i) {
    hparam_t* q = &P[i];
    free(q->p);
    free(q->g);
    free(q->g2);
    free(q->fp);
    free(q->fm);
    free(q->fv);
    free(q->tolacc);
    free(q->p0);
    free(q->pmax);
    free(q->path);
    free(gall[i]);
  }
  free(gall);
  free(gt);
  free(P);
  free(S.gd);
  free(S.lp);
  free(S.lm);
  free(S.lv);
  free(S.ep);
  free(S.em);
  free(S.ev);
  free(S.sp);
  free(S.sm);
  free(S.sv);
  free(S.lion_base);
  free(S.sqm);
  free(S.sqv);
  free(S.amb);
  free(S.rd);
  free(S.am);
  free(S.av);
}
