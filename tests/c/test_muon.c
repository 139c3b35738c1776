/* Muon (LOWBIT_ALGORITHM_MUON) against a float64 reference of
 * torch.optim.Muon's rules: the momentum (buf.lerp_(grad, 1 - momentum)),
 * Nesterov, Newton-Schulz (quintic, ns_steps, eps), decoupled decay and the
 * lr adjustments, on square, tall, wide, 1 x N and 3-D params, fp32 products;
 * each step is checked from the library's own params and momentum (lockstep).
 * Then: quantized momentum (8bit, 4bit, 4bit rank-1, FP8, bf16) and bf16
 * weights with stochastic rounding keep the reference's momentum within the
 * format's error; the hybrid (an AdamW group in a Muon optimizer) gives its
 * params the bits of a plain AdamW optimizer; step_params equals a full
 * step; a checkpoint resumes to the same bits; state bytes per param of a
 * 4096 x 4096 matrix; bad input (a 1-D param in a Muon group, ns_steps 0, a
 * group algorithm outside Muon, NaN gradients) gets a status or a skipped
 * step that changes nothing.
 *
 * Built for the CPU engine; with LOWBIT_TEST_CUDA and LOWBIT_TEST_EMULATED
 * for the CUDA engine under the host emulation (tests/cuda); with
 * LOWBIT_TEST_CUDA alone against liblowbit on a GPU (exits 77 without one).
 * Seed: LOWBIT_TEST_SEED. */
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

#include "test_device.h"

static uint64_t rng_state;
static double uniform(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}
static float randn(void) {
  double u = uniform() + 1e-300, v = uniform();
  return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static float bf16_value(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static lowbit_tensor_t tensor(void* data, int64_t n, lowbit_dtype_t dt) {
  lowbit_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.numel = n;
  t.dtype = dt;
  t.device = DEVICE;
  return t;
}

/* A device copy of n host elements of `bytes` each. */
static void* on_dev(const void* host, int64_t n, size_t bytes) {
  void* d = dev_alloc((size_t)n * bytes);
  to_dev(d, host, (size_t)n * bytes);
  return d;
}

static lowbit_optimizer_t make_muon(lowbit_state_format_t fmt, lowbit_normalization_t norm, lowbit_hparams_t* h) {
  lowbit_optimizer_config_t c;
  lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_MUON);
  c.algorithm = LOWBIT_ALGORITHM_MUON;
  c.device = DEVICE;
  c.state_format = fmt;
  c.min_quantized_numel = 0;
  c.first_normalization = norm;
  c.seed = 7;
  lowbit_hparams_init(h, LOWBIT_ALGORITHM_MUON);
  h->lr = 0.02f;
  h->ns_precision = LOWBIT_NS_PRECISION_FP32;
  lowbit_optimizer_t opt = NULL;
  CHECK_OPT(opt, lowbit_optimizer_create(&opt, &c, h));
  return opt;
}

static int64_t add_matrix(lowbit_optimizer_t opt, void* p, lowbit_dtype_t dt, int ndim, const int64_t* shape,
                          int32_t group) {
  lowbit_param_config_t pc;
  lowbit_param_config_init(&pc);
  int64_t n = 1;
  for (int k = 0; k < ndim; ++k) n *= shape[k], pc.shape[k] = shape[k];
  pc.ndim = ndim;
  pc.param = tensor(p, n, dt);
  pc.group = group;
  int64_t id = -1;
  CHECK_OPT(opt, lowbit_optimizer_add_param(opt, &pc, &id));
  return id;
}

/* ---- float64 reference of one Muon step on a rows x cols matrix */

static void matmul_d(const double* a, int ta, const double* b, int tb, double* c, int64_t m, int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t q = 0; q < k; ++q) s += (ta ? a[q * m + i] : a[i * k + q]) * (tb ? b[j * k + q] : b[q * n + j]);
      c[i * n + j] = s;
    }
}

/* O = NS(u) in double, as torch: transposed when rows > cols. */
static void newton_schulz_d(const double* u, double* out, int64_t rows, int64_t cols, const lowbit_hparams_t* h) {
  const int tall = rows > cols;
  const int64_t r = tall ? cols : rows, c = tall ? rows : cols, n = rows * cols;
  double* x = malloc(sizeof(double) * (size_t)n);
  double* x2 = malloc(sizeof(double) * (size_t)n);
  double* a = malloc(sizeof(double) * (size_t)(r * r));
  double* aa = malloc(sizeof(double) * (size_t)(r * r));
  double norm = 0;
  for (int64_t i = 0; i < n; ++i) norm += u[i] * u[i];
  norm = sqrt(norm);
  if (norm < h->eps) norm = h->eps;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) x[tall ? j * rows + i : i * cols + j] = u[i * cols + j] / norm;
  for (int s = 0; s < h->ns_steps; ++s) {
    matmul_d(x, 0, x, 1, a, r, r, c);
    matmul_d(a, 0, a, 0, aa, r, r, r);
    for (int64_t i = 0; i < r * r; ++i) aa[i] = h->ns_coefficients[1] * a[i] + h->ns_coefficients[2] * aa[i];
    matmul_d(aa, 0, x, 0, x2, r, c, r);
    for (int64_t i = 0; i < n; ++i) x[i] = h->ns_coefficients[0] * x[i] + x2[i];
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = x[tall ? j * rows + i : i * cols + j];
  free(x), free(x2), free(a), free(aa);
}

static double lr_ratio(const lowbit_hparams_t* h, double rows, double cols) {
  switch (h->adjust_lr) {
    case LOWBIT_MUON_LR_ORIGINAL: return sqrt(rows / cols > 1 ? rows / cols : 1);
    case LOWBIT_MUON_LR_MATCH_RMS_ADAMW: return 0.2 * sqrt(rows > cols ? rows : cols);
    case LOWBIT_MUON_LR_SPECTRAL_UNCLAMPED: return sqrt(rows / cols);
    default: return 1;
  }
}

/* One step from (p, m, g): new m in m_out, new p in p_out. */
static void muon_ref(const lowbit_hparams_t* h, const float* p, const float* m, const float* g, int64_t rows,
                     int64_t cols, double* p_out, double* m_out) {
  const int64_t n = rows * cols;
  double* u = malloc(sizeof(double) * (size_t)n);
  double* o = malloc(sizeof(double) * (size_t)n);
  const double mu = h->momentum;
  for (int64_t i = 0; i < n; ++i) {
    m_out[i] = mu * m[i] + (1 - mu) * g[i];
    u[i] = h->nesterov ? (1 - mu) * g[i] + mu * m_out[i] : m_out[i];
  }
  newton_schulz_d(u, o, rows, cols, h);
  const double lr = h->lr, adj = lr * lr_ratio(h, (double)rows, (double)cols);
  for (int64_t i = 0; i < n; ++i) p_out[i] = p[i] * (1 - lr * h->weight_decay) - adj * o[i];
  free(u), free(o);
}

/* ---- lockstep against the reference, fp32 everything */

typedef struct {
  int ndim;
  int64_t shape[3];
} shape_t;
static const shape_t kShapes[] = {{2, {32, 32}}, {2, {48, 20}}, {2, {20, 48}}, {2, {1, 64}}, {3, {6, 4, 10}}};
#define NSHAPES (int)(sizeof kShapes / sizeof kShapes[0])

static int64_t numel_of(const shape_t* s) {
  int64_t n = 1;
  for (int k = 0; k < s->ndim; ++k) n *= s->shape[k];
  return n;
}

static void run_reference(int nesterov, lowbit_muon_lr_adjust_t adjust, int steps) {
  lowbit_hparams_t h;
  lowbit_optimizer_t opt = make_muon(LOWBIT_STATE_FP32, LOWBIT_NORMALIZATION_BLOCK, &h);
  h.nesterov = nesterov;
  h.adjust_lr = adjust;
  CHECK_OPT(opt, lowbit_optimizer_set_hparams(opt, 0, &h));
  float* p[NSHAPES];
  float* g[NSHAPES];
  void* pd[NSHAPES];
  void* gd[NSHAPES];
  for (int s = 0; s < NSHAPES; ++s) {
    const int64_t n = numel_of(&kShapes[s]);
    p[s] = malloc(4 * (size_t)n), g[s] = malloc(4 * (size_t)n);
    for (int64_t i = 0; i < n; ++i) p[s][i] = randn();
    pd[s] = on_dev(p[s], n, 4), gd[s] = dev_alloc(4 * (size_t)n);
    add_matrix(opt, pd[s], LOWBIT_DTYPE_FLOAT32, kShapes[s].ndim, kShapes[s].shape, 0);
  }
  lowbit_tensor_t grads[NSHAPES];
  double worst_p = 0, worst_m = 0;
  for (int t = 0; t < steps; ++t) {
    float* p0[NSHAPES];
    float* m0[NSHAPES];
    for (int s = 0; s < NSHAPES; ++s) {
      const int64_t n = numel_of(&kShapes[s]);
      for (int64_t i = 0; i < n; ++i) g[s][i] = randn();
      to_dev(gd[s], g[s], 4 * (size_t)n);
      grads[s] = tensor(gd[s], n, LOWBIT_DTYPE_FLOAT32);
      p0[s] = malloc(4 * (size_t)n), m0[s] = malloc(4 * (size_t)n);
      memcpy(p0[s], p[s], 4 * (size_t)n);
      CHECK_OPT(opt, lowbit_optimizer_read_moment(opt, s, 0, m0[s], n, NULL));
    }
    CHECK_OPT(opt, lowbit_optimizer_step_with_grads(opt, grads, NSHAPES, NULL));
    sync_all();
    for (int s = 0; s < NSHAPES; ++s) {
      const int64_t n = numel_of(&kShapes[s]), rows = kShapes[s].shape[0], cols = n / rows;
      to_host(p[s], pd[s], 4 * (size_t)n);
      double* pr = malloc(sizeof(double) * (size_t)n);
      double* mr = malloc(sizeof(double) * (size_t)n);
      float* m1 = malloc(4 * (size_t)n);
      CHECK_OPT(opt, lowbit_optimizer_read_moment(opt, s, 0, m1, n, NULL));
      muon_ref(&h, p0[s], m0[s], g[s], rows, cols, pr, mr);
      /* The update's scale: lr_adjusted times the largest |O| (an orthogonal
       * matrix's entries are at most 1 in size); fp32 products over 5
       * iterations keep O within ~1e-5 of it. */
      const double scale = h.lr * lr_ratio(&h, (double)rows, (double)cols);
      for (int64_t i = 0; i < n; ++i) {
        const double ep = fabs(p[s][i] - pr[i]) / (scale * 1e-4 + 4 * 6e-8 * fabs(pr[i]));
        const double em = fabs(m1[i] - mr[i]) / (2 * 6e-8 * (fabs(m0[s][i]) + fabs(g[s][i])) + 1e-30);
        if (ep > worst_p) worst_p = ep;
        if (em > worst_m) worst_m = em;
        if (ep > 1 || em > 1)
          fail_msg("shape %d step %d elem %lld: p %.9g ref %.9g, m %.9g ref %.9g", s, t, (long long)i, p[s][i], pr[i],
                   m1[i], mr[i]);
      }
      free(pr), free(mr), free(m1), free(p0[s]), free(m0[s]);
    }
  }
  printf("muon reference (nesterov %d, adjust %d): worst param error %.3f of the bound, momentum %.3f\n", nesterov,
         (int)adjust, worst_p, worst_m);
  for (int s = 0; s < NSHAPES; ++s) free(p[s]), free(g[s]), dev_free(pd[s]), dev_free(gd[s]);
  lowbit_optimizer_destroy(opt);
}

static void test_reference_nesterov(void** state) {
  (void)state;
  run_reference(1, LOWBIT_MUON_LR_ORIGINAL, 4);
}
static void test_reference_plain_adjusts(void** state) {
  (void)state;
  run_reference(0, LOWBIT_MUON_LR_MATCH_RMS_ADAMW, 2);
  run_reference(1, LOWBIT_MUON_LR_SPECTRAL_UNCLAMPED, 2);
  run_reference(1, LOWBIT_MUON_LR_NONE, 2);
}

/* ---- quantized momentum and 16-bit weights: the momentum stays within the
 * format's error of the float64 one, and the params keep moving like the
 * fp32 run's. */
static void test_formats(void** state) {
  (void)state;
  const struct {
    lowbit_state_format_t fmt;
    lowbit_normalization_t norm;
    lowbit_dtype_t dt;
    double tol; /* of the RMS of m: the RMS of the error */
  } cases[] = {
      {LOWBIT_STATE_BF16, LOWBIT_NORMALIZATION_BLOCK, LOWBIT_DTYPE_FLOAT32, 0.005},
      {LOWBIT_STATE_8BIT, LOWBIT_NORMALIZATION_BLOCK, LOWBIT_DTYPE_FLOAT32, 0.03},
      {LOWBIT_STATE_8BIT, LOWBIT_NORMALIZATION_RANK1, LOWBIT_DTYPE_BFLOAT16, 0.05},
      {LOWBIT_STATE_FP8, LOWBIT_NORMALIZATION_BLOCK, LOWBIT_DTYPE_FLOAT32, 0.06},
      {LOWBIT_STATE_4BIT, LOWBIT_NORMALIZATION_BLOCK, LOWBIT_DTYPE_BFLOAT16, 0.35},
      {LOWBIT_STATE_4BIT, LOWBIT_NORMALIZATION_RANK1, LOWBIT_DTYPE_FLOAT32, 0.35},
      {LOWBIT_STATE_4BIT_SR, LOWBIT_NORMALIZATION_BLOCK, LOWBIT_DTYPE_FLOAT32, 0.5},
  };
  const int64_t shape[2] = {64, 96}, n = 64 * 96;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
    lowbit_hparams_t h;
    lowbit_optimizer_t opt = make_muon(cases[c].fmt, cases[c].norm, &h);
    float* p32 = malloc(4 * (size_t)n);
    uint16_t* p16 = malloc(2 * (size_t)n);
    float* g = malloc(4 * (size_t)n);
    float* m = malloc(4 * (size_t)n);
    double* mref = calloc((size_t)n, sizeof(double));
    for (int64_t i = 0; i < n; ++i) {
      p32[i] = randn();
      uint32_t u;
      memcpy(&u, &p32[i], 4);
      p16[i] = (uint16_t)(u >> 16);
      if (cases[c].dt == LOWBIT_DTYPE_BFLOAT16) u &= 0xFFFF0000u, memcpy(&p32[i], &u, 4);
    }
    const int f32 = cases[c].dt == LOWBIT_DTYPE_FLOAT32;
    void* pd = f32 ? on_dev(p32, n, 4) : on_dev(p16, n, 2);
    void* gd = dev_alloc(4 * (size_t)n);
    add_matrix(opt, pd, cases[c].dt, 2, shape, 0);
    for (int t = 0; t < 6; ++t) {
      for (int64_t i = 0; i < n; ++i) g[i] = randn() * (1 + (i % 7));
      to_dev(gd, g, 4 * (size_t)n);
      lowbit_tensor_t gt = tensor(gd, n, LOWBIT_DTYPE_FLOAT32);
      CHECK_OPT(opt, lowbit_optimizer_step_with_grads(opt, &gt, 1, NULL));
      for (int64_t i = 0; i < n; ++i) mref[i] = 0.95 * mref[i] + 0.05 * g[i];
    }
    sync_all();
    if (f32)
      to_host(p32, pd, 4 * (size_t)n);
    else
      to_host(p16, pd, 2 * (size_t)n);
    dev_free(pd), dev_free(gd);
    CHECK_OPT(opt, lowbit_optimizer_read_moment(opt, 0, 0, m, n, NULL));
    double m2 = 0, e2 = 0, along = 0, moved = 0;
    for (int64_t i = 0; i < n; ++i) {
      m2 += mref[i] * mref[i];
      along += (m[i] - mref[i]) * mref[i];
      e2 += (m[i] - mref[i]) * (m[i] - mref[i]);
      const float now = cases[c].dt == LOWBIT_DTYPE_FLOAT32 ? p32[i] : bf16_value(p16[i]);
      assert_true(isfinite(now));
      if (cases[c].dt != LOWBIT_DTYPE_FLOAT32) moved += fabs(now - p32[i]);
    }
    if (cases[c].dt != LOWBIT_DTYPE_FLOAT32) assert_true(moved > 0);
    const double rel = sqrt(e2 / m2);
    printf("muon %s norm %d dtype %d: momentum RMS error %.4f of its RMS\n", lowbit_state_format_name(cases[c].fmt),
           (int)cases[c].norm, (int)cases[c].dt, rel);
    if (!(rel <= cases[c].tol)) fail_msg("case %zu: momentum RMS error %g > %g", c, rel, cases[c].tol);
    /* Stochastic codes: larger errors, but no bias along m (nearest 4-bit codes hold m too small). */
    if (cases[c].fmt == LOWBIT_STATE_4BIT_SR) assert_true(fabs(along / m2) < 0.03);
    free(p32), free(p16), free(g), free(m), free(mref);
    lowbit_optimizer_destroy(opt);
  }
}

/* ---- the hybrid: an AdamW group inside a Muon optimizer gives its params
 * the bits of a plain AdamW optimizer; step_params (any subsets) equals the
 * full step; a checkpoint resumes to the same bits. */
typedef struct {
  lowbit_optimizer_t opt;
  float w0[960], w1[256], bias[24]; /* host copies (hybrid_fetch) */
  void* dev[3];                     /* Muon: 40 x 24 and 16 x 16; the AdamW group's 24 */
} hybrid_t;

static void hybrid_make(hybrid_t* x, uint64_t seed, lowbit_state_format_t fmt) {
  lowbit_hparams_t h, ha;
  x->opt = make_muon(fmt, LOWBIT_NORMALIZATION_BLOCK, &h);
  lowbit_hparams_init(&ha, LOWBIT_ALGORITHM_ADAMW);
  ha.lr = 0.003f;
  ha.algorithm = LOWBIT_ALGORITHM_ADAMW;
  int32_t group = -1;
  CHECK_OPT(x->opt, lowbit_optimizer_add_group(x->opt, &ha, &group));
  assert_int_equal(group, 1);
  rng_state = seed;
  const int64_t s0[2] = {40, 24}, s1[2] = {16, 16}, one[1] = {24};
  for (int i = 0; i < 960; ++i) x->w0[i] = randn();
  for (int i = 0; i < 256; ++i) x->w1[i] = randn();
  for (int i = 0; i < 24; ++i) x->bias[i] = randn();
  x->dev[0] = on_dev(x->w0, 960, 4), x->dev[1] = on_dev(x->bias, 24, 4), x->dev[2] = on_dev(x->w1, 256, 4);
  add_matrix(x->opt, x->dev[0], LOWBIT_DTYPE_FLOAT32, 2, s0, 0);
  add_matrix(x->opt, x->dev[1], LOWBIT_DTYPE_FLOAT32, 1, one, 1);
  add_matrix(x->opt, x->dev[2], LOWBIT_DTYPE_FLOAT32, 2, s1, 0);
}
static void hybrid_fetch(hybrid_t* x) {
  sync_all();
  to_host(x->w0, x->dev[0], sizeof x->w0), to_host(x->bias, x->dev[1], sizeof x->bias);
  to_host(x->w1, x->dev[2], sizeof x->w1);
}
static void hybrid_set(hybrid_t* x, const hybrid_t* from) {
  to_dev(x->dev[0], from->w0, sizeof x->w0), to_dev(x->dev[1], from->bias, sizeof x->bias);
  to_dev(x->dev[2], from->w1, sizeof x->w1);
}
static void hybrid_free(hybrid_t* x) {
  for (int k = 0; k < 3; ++k) dev_free(x->dev[k]);
  lowbit_optimizer_destroy(x->opt);
}

/* Step t's gradients, on the device: [0] 40 x 24, [1] the bias, [2] 16 x 16. */
static void grads_for(int t, void* const* gd, lowbit_tensor_t* gs) {
  static float g0[960], gb[24], g1[256];
  rng_state = 1000 + (uint64_t)t;
  for (int i = 0; i < 960; ++i) g0[i] = randn();
  for (int i = 0; i < 24; ++i) gb[i] = randn();
  for (int i = 0; i < 256; ++i) g1[i] = randn();
  to_dev(gd[0], g0, sizeof g0), to_dev(gd[1], gb, sizeof gb), to_dev(gd[2], g1, sizeof g1);
  gs[0] = tensor(gd[0], 960, LOWBIT_DTYPE_FLOAT32);
  gs[1] = tensor(gd[1], 24, LOWBIT_DTYPE_FLOAT32);
  gs[2] = tensor(gd[2], 256, LOWBIT_DTYPE_FLOAT32);
}

static void test_hybrid_subsets_checkpoint(void** state) {
  (void)state;
  void* gd[3] = {dev_alloc(4 * 960), dev_alloc(4 * 24), dev_alloc(4 * 256)};
  lowbit_tensor_t gs[3];
  const lowbit_state_format_t fmts[2] = {LOWBIT_STATE_FP32, LOWBIT_STATE_8BIT};
  static hybrid_t a, b, r;
  for (int f = 0; f < 2; ++f) {
    hybrid_make(&a, 5, fmts[f]);
    hybrid_make(&b, 5, fmts[f]);
    /* The AdamW group's param against a plain AdamW optimizer. */
    lowbit_optimizer_config_t c;
    lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_ADAMW);
    c.device = DEVICE;
    c.state_format = fmts[f];
    c.min_quantized_numel = 0;
    c.seed = 7;
    lowbit_hparams_t ha;
    lowbit_hparams_init(&ha, LOWBIT_ALGORITHM_ADAMW);
    ha.lr = 0.003f;
    lowbit_optimizer_t plain = NULL;
    CHECK_OPT(plain, lowbit_optimizer_create(&plain, &c, &ha));
    float bias[24];
    void* bias_d = on_dev(a.bias, 24, 4);
    lowbit_param_config_t pc;
    lowbit_param_config_init(&pc);
    pc.param = tensor(bias_d, 24, LOWBIT_DTYPE_FLOAT32);
    int64_t id;
    CHECK_OPT(plain, lowbit_optimizer_add_param(plain, &pc, &id));
    for (int t = 0; t < 5; ++t) {
      grads_for(t, gd, gs);
      CHECK_OPT(a.opt, lowbit_optimizer_step_with_grads(a.opt, gs, 3, NULL));
      /* b: the same step as two calls of step_params, in another order. */
      const int64_t first[2] = {2, 1}, second[1] = {0};
      const lowbit_tensor_t g_first[2] = {gs[2], gs[1]};
      CHECK_OPT(b.opt, lowbit_optimizer_step_params(b.opt, first, 2, g_first, NULL));
      CHECK_OPT(b.opt, lowbit_optimizer_step_params(b.opt, second, 1, &gs[0], NULL));
      CHECK_OPT(plain, lowbit_optimizer_step_with_grads(plain, &gs[1], 1, NULL));
      sync_all();
    }
    hybrid_fetch(&a);
    hybrid_fetch(&b);
    to_host(bias, bias_d, sizeof bias);
    assert_memory_equal(a.bias, bias, sizeof bias);
    assert_memory_equal(a.w0, b.w0, sizeof a.w0);
    assert_memory_equal(a.w1, b.w1, sizeof a.w1);
    assert_memory_equal(a.bias, b.bias, sizeof a.bias);
    lowbit_param_info_t info;
    info.struct_size = sizeof info;
    CHECK_OPT(a.opt, lowbit_optimizer_param_info(a.opt, 0, &info));
    assert_int_equal(info.step, 5);

    /* Checkpoint of a, loaded into r (given a's params' values), then one more step each. */
    int64_t size = 0;
    CHECK_OPT(a.opt, lowbit_optimizer_save(a.opt, LOWBIT_CHECKPOINT_COMPRESSED, NULL, 0, &size, NULL));
    void* buf = malloc((size_t)size);
    CHECK_OPT(a.opt, lowbit_optimizer_save(a.opt, LOWBIT_CHECKPOINT_COMPRESSED, buf, size, &size, NULL));
    hybrid_make(&r, 5, fmts[f]);
    hybrid_set(&r, &a);
    CHECK_OPT(r.opt, lowbit_optimizer_load(r.opt, buf, size, NULL));
    grads_for(9, gd, gs);
    CHECK_OPT(a.opt, lowbit_optimizer_step_with_grads(a.opt, gs, 3, NULL));
    CHECK_OPT(r.opt, lowbit_optimizer_step_with_grads(r.opt, gs, 3, NULL));
    hybrid_fetch(&a);
    hybrid_fetch(&r);
    assert_memory_equal(a.w0, r.w0, sizeof a.w0);
    assert_memory_equal(a.w1, r.w1, sizeof a.w1);
    assert_memory_equal(a.bias, r.bias, sizeof a.bias);
    int64_t ws = 0;
    CHECK_OPT(a.opt, lowbit_optimizer_workspace_bytes(a.opt, &ws));
    assert_true(ws >= 2 * 4 * 960);
    free(buf);
    dev_free(bias_d);
    hybrid_free(&r);
    hybrid_free(&a);
    hybrid_free(&b);
    lowbit_optimizer_destroy(plain);
  }
  for (int k = 0; k < 3; ++k) dev_free(gd[k]);
}


/* ---- the functional step (caller-owned state, one shared count): a hybrid
 * Muon + AdamW step gives the handle optimizer's bits, with the count as a
 * host value or in engine memory (count_out aliasing it), 8-bit
 * momentum; host hparams are required; a 1-D param in the Muon group is
 * refused and nothing changes. */
typedef struct {
  lowbit_state_plan_t plan;
  lowbit_param_buffers_t b;
} fparam_t;

static void test_functional(void** state) {
  (void)state;
  hybrid_t h;
  lowbit_optimizer_config_t c;
  lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_MUON);
  c.device = DEVICE;
  c.state_format = LOWBIT_STATE_8BIT;
  c.min_quantized_numel = 0;
  c.seed = 7;
  hybrid_make(&h, 11, LOWBIT_STATE_8BIT);
  lowbit_hparams_t groups[2];
  groups[0].struct_size = groups[1].struct_size = sizeof groups[0];
  CHECK_OPT(h.opt, lowbit_optimizer_get_hparams(h.opt, 0, &groups[0]));
  CHECK_OPT(h.opt, lowbit_optimizer_get_hparams(h.opt, 1, &groups[1]));
  lowbit_step_context_t ctx = NULL;
  assert_int_equal(lowbit_step_context_create(&ctx, &c), LOWBIT_SUCCESS);
  static const int64_t rows[3] = {40, 24, 16}, cols[3] = {24, 0, 16}, numel[3] = {960, 24, 256};
  static const int32_t group_of[3] = {0, 1, 0};
  fparam_t f[3];
  lowbit_param_buffers_t bufs[3];
  int32_t records[3 * LOWBIT_STATE_RECORD_INT32];
  int32_t* records_d = dev_alloc(sizeof records);
  int32_t* count_d = dev_alloc(sizeof(int32_t));
  const float* init[3] = {h.w0, h.bias, h.w1};
  for (int i = 0; i < 3; ++i) {
    lowbit_param_config_t pc;
    lowbit_param_config_init(&pc);
    pc.param = tensor(on_dev(init[i], numel[i], 4), numel[i], LOWBIT_DTYPE_FLOAT32);
    pc.group = group_of[i];
    pc.ndim = cols[i] ? 2 : 1;
    pc.shape[0] = rows[i];
    pc.shape[1] = cols[i];
    lowbit_state_plan_init(&f[i].plan);
    CHECK_OPT(NULL, lowbit_plan_param_state(&c, &groups[group_of[i]], &pc, &f[i].plan));
    lowbit_param_buffers_init(&f[i].b);
    f[i].b.param = pc.param;
    f[i].b.grad = tensor(dev_alloc(4 * (size_t)numel[i]), numel[i], LOWBIT_DTYPE_FLOAT32);
    f[i].b.group = pc.group;
    f[i].b.plan = &f[i].plan;
    f[i].b.ndim = pc.ndim;
    f[i].b.shape[0] = pc.shape[0], f[i].b.shape[1] = pc.shape[1];
    for (int m = 0; m < 2; ++m) {
      f[i].b.moment[m] = dev_alloc((size_t)f[i].plan.data_bytes[m]);
      f[i].b.moment_bytes[m] = f[i].plan.data_bytes[m];
      f[i].b.scales[m] = dev_alloc(4 * (size_t)f[i].plan.scale_count[m]);
      f[i].b.scale_count[m] = f[i].plan.scale_count[m];
    }
    CHECK_OPT(NULL, lowbit_state_record(&f[i].plan, pc.ndim, pc.shape, records + LOWBIT_STATE_RECORD_INT32 * i,
                                    LOWBIT_STATE_RECORD_INT32));
    bufs[i] = f[i].b;
  }
  to_dev(records_d, records, sizeof records);
  void* gd[3] = {dev_alloc(4 * 960), dev_alloc(4 * 24), dev_alloc(4 * 256)};
  lowbit_tensor_t gs[3];
  for (int t = 0; t < 4; ++t) {
    grads_for(t, gd, gs);
    CHECK_OPT(h.opt, lowbit_optimizer_step_with_grads(h.opt, gs, 3, NULL));
    for (int i = 0; i < 3; ++i) bufs[i].grad = gs[i];
    lowbit_step_args_t a;
    lowbit_step_args_init(&a);
    a.hparams = groups;
    a.num_groups = 2;
    a.records = records_d;
    if (t % 2) {
      const int32_t count = t;
      to_dev(count_d, &count, sizeof count);
      a.count = count_d;
      a.count_out = count_d;
    } else {
      a.step = t;
    }
    if (lowbit_functional_step(ctx, bufs, 3, &a, NULL) != LOWBIT_SUCCESS)
      fail_msg("functional step %d: %s", t, lowbit_step_context_last_error(ctx));
    if (t % 2) {
      int32_t count = 0;
      sync_all();
      to_host(&count, count_d, sizeof count);
      assert_int_equal(count, t + 1);
    }
  }
  hybrid_fetch(&h);
  float got[960];
  to_host(got, bufs[0].param.data, 4 * 960);
  assert_memory_equal(got, h.w0, 4 * 960);
  to_host(got, bufs[1].param.data, 4 * 24);
  assert_memory_equal(got, h.bias, 4 * 24);
  to_host(got, bufs[2].param.data, 4 * 256);
  assert_memory_equal(got, h.w1, 4 * 256);

  /* engine_hparams instead of host values: refused for Muon, nothing changes. */
  lowbit_step_args_t a;
  lowbit_step_args_init(&a);
  a.engine_hparams = groups;
  a.num_groups = 2;
  a.records = records_d;
  a.step = 4;
  assert_int_not_equal(lowbit_functional_step(ctx, bufs, 3, &a, NULL), LOWBIT_SUCCESS);
  assert_non_null(strstr(lowbit_step_context_last_error(ctx), "hparams"));
  /* A 1-D param in the Muon group. */
  a.engine_hparams = NULL;
  a.hparams = groups;
  bufs[1].group = 0;
  assert_int_equal(lowbit_functional_step(ctx, bufs, 3, &a, NULL), LOWBIT_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(lowbit_step_context_last_error(ctx), "Muon"));
  to_host(got, bufs[0].param.data, 4 * 960);
  assert_memory_equal(got, h.w0, 4 * 960);

  for (int i = 0; i < 3; ++i) {
    dev_free(f[i].b.param.data), dev_free(f[i].b.grad.data);
    for (int m = 0; m < 2; ++m) dev_free(f[i].b.moment[m]), dev_free(f[i].b.scales[m]);
    dev_free(gd[i]);
  }
  dev_free(records_d), dev_free(count_d);
  lowbit_step_context_destroy(ctx);
  hybrid_free(&h);
}

/* ---- state bytes per param of a 4096 x 4096 matrix: one scale per 256 or
 * 128 codes costs 1/64 or 1/32 B/param, rank-1 scales (a vector per dim) a
 * 2000th of that, which is what meets 8-bit <= 1.01 and 4-bit <= 0.52. */
static void test_state_bytes(void** state) {
  (void)state;
  const int64_t shape[2] = {4096, 4096}, n = 4096 * 4096;
  void* p = dev_alloc((size_t)n * 2);
  const lowbit_state_format_t fmts[2] = {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT};
  const double limit[2] = {1.01, 0.52}, block_expected[2] = {1 + 4.0 / 256, 0.5 + 4.0 / 128};
  for (int f = 0; f < 2; ++f)
    for (int norm = LOWBIT_NORMALIZATION_BLOCK; norm <= LOWBIT_NORMALIZATION_RANK1; ++norm) {
      lowbit_hparams_t h;
      lowbit_optimizer_t opt = make_muon(fmts[f], (lowbit_normalization_t)norm, &h);
      add_matrix(opt, p, LOWBIT_DTYPE_BFLOAT16, 2, shape, 0);
      int64_t bytes = 0;
      CHECK_OPT(opt, lowbit_optimizer_state_bytes(opt, -1, &bytes));
      const double per = (double)bytes / (double)n;
      printf("muon %s %s: %.4f state bytes per param (4096 x 4096)\n", lowbit_state_format_name(fmts[f]),
             norm == LOWBIT_NORMALIZATION_RANK1 ? "rank-1" : "blocks", per);
      if (norm == LOWBIT_NORMALIZATION_RANK1)
        assert_true(per <= limit[f]);
      else
        assert_true(fabs(per - block_expected[f]) < 1e-9);
      lowbit_optimizer_destroy(opt);
    }
  dev_free(p);
}

/* ---- bad input */
static void test_bad_input(void** state) {
  (void)state;
  lowbit_hparams_t h;
  lowbit_optimizer_t opt = make_muon(LOWBIT_STATE_8BIT, LOWBIT_NORMALIZATION_BLOCK, &h);
  float v[64], w[64 * 8];
  for (int i = 0; i < 64; ++i) v[i] = 1.f;
  for (int i = 0; i < 512; ++i) w[i] = randn();
  void* vd = on_dev(v, 64, 4);
  void* wd = on_dev(w, 512, 4);
  void* gd = dev_alloc(4 * 512);
  /* A 1-D param in the Muon group. */
  lowbit_param_config_t pc;
  lowbit_param_config_init(&pc);
  pc.param = tensor(vd, 64, LOWBIT_DTYPE_FLOAT32);
  int64_t id = -1;
  assert_int_equal(lowbit_optimizer_add_param(opt, &pc, &id), LOWBIT_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(lowbit_optimizer_last_error(opt), "Muon"));
  /* ns_steps 0, a bad adjust, non-finite coefficients. */
  lowbit_hparams_t bad = h;
  bad.ns_steps = 0;
  assert_int_equal(lowbit_optimizer_set_hparams(opt, 0, &bad), LOWBIT_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(lowbit_optimizer_last_error(opt), "ns_steps"));
  bad = h;
  bad.ns_coefficients[1] = NAN;
  assert_int_equal(lowbit_optimizer_set_hparams(opt, 0, &bad), LOWBIT_ERROR_INVALID_ARGUMENT);
  bad = h;
  bad.adjust_lr = (lowbit_muon_lr_adjust_t)9;
  assert_int_equal(lowbit_optimizer_set_hparams(opt, 0, &bad), LOWBIT_ERROR_INVALID_ARGUMENT);
  /* NaN gradient: the step changes nothing (param, momentum, step count). */
  const int64_t shape[2] = {64, 8};
  add_matrix(opt, wd, LOWBIT_DTYPE_FLOAT32, 2, shape, 0);
  float g[512], before[512], m0[512], m1[512];
  for (int i = 0; i < 512; ++i) g[i] = randn();
  to_dev(gd, g, sizeof g);
  lowbit_tensor_t gt = tensor(gd, 512, LOWBIT_DTYPE_FLOAT32);
  CHECK_OPT(opt, lowbit_optimizer_step_with_grads(opt, &gt, 1, NULL));
  sync_all();
  to_host(before, wd, sizeof before);
  CHECK_OPT(opt, lowbit_optimizer_read_moment(opt, 0, 0, m0, 512, NULL));
  g[300] = NAN;
  to_dev(gd, g, sizeof g);
  CHECK_OPT(opt, lowbit_optimizer_step_with_grads(opt, &gt, 1, NULL));
  sync_all();
  to_host(w, wd, sizeof w);
  int32_t skipped = 0;
  CHECK_OPT(opt, lowbit_optimizer_last_step_skipped(opt, &skipped));
  assert_int_equal(skipped, 1);
  CHECK_OPT(opt, lowbit_optimizer_read_moment(opt, 0, 0, m1, 512, NULL));
  assert_memory_equal(before, w, sizeof before);
  assert_memory_equal(m0, m1, sizeof m0);
  lowbit_param_info_t info;
  info.struct_size = sizeof info;
  CHECK_OPT(opt, lowbit_optimizer_param_info(opt, 0, &info));
  assert_int_equal(info.step, 1);
  /* An AdamW group may not turn into Muon once it has params... */
  lowbit_hparams_t ha;
  lowbit_hparams_init(&ha, LOWBIT_ALGORITHM_ADAMW);
  int32_t group = -1;
  CHECK_OPT(opt, lowbit_optimizer_add_group(opt, &ha, &group));
  pc.group = group;
  CHECK_OPT(opt, lowbit_optimizer_add_param(opt, &pc, &id));
  ha.algorithm = LOWBIT_ALGORITHM_MUON;
  assert_int_equal(lowbit_optimizer_set_hparams(opt, group, &ha), LOWBIT_ERROR_INVALID_ARGUMENT);
  lowbit_optimizer_destroy(opt);
  /* ... and only a Muon optimizer's groups take another algorithm. */
  lowbit_optimizer_config_t c;
  lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_ADAMW);
  lowbit_hparams_init(&ha, LOWBIT_ALGORITHM_LION);
  opt = NULL;
  assert_int_equal(lowbit_optimizer_create(&opt, &c, &ha), LOWBIT_ERROR_INVALID_ARGUMENT);
  assert_null(opt);
  dev_free(vd), dev_free(wd), dev_free(gd);
}

int main(void) {
  if (skip_without_gpu()) return 77;
  rng_state = lowbit_test_seed("test_muon") | 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_nesterov), cmocka_unit_test(test_reference_plain_adjusts),
      cmocka_unit_test(test_formats),            cmocka_unit_test(test_hybrid_subsets_checkpoint),
      cmocka_unit_test(test_functional),         cmocka_unit_test(test_state_bytes),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
