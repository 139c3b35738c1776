/* GPU engine against the CPU engine, through the C API.
 *
 * For every algorithm (AdamW, Adam, Lion, SGD with momentum / Nesterov /
 * plain) x state format (fp32, bf16, 8-bit, 4-bit, FP8, the mixed pairs
 * 8-bit m + 4-bit v, FP8 m + bf16 v, and 4BIT_SR: m 4BIT_SR + v 4-bit, the
 * recommended preset, and both moments 4BIT_SR) x param/grad dtype and rounding (fp32,
 * bf16 and fp16 params with fp32/bf16/fp16 grads; nearest, stochastic
 * rounding, error-correction bytes), two optimizers, one per engine, take the
 * same 22 steps on fresh random inputs and are compared element by element.
 * The parameters cover: two chunks with a partial tile (70001 elements), a
 * parameter whose base is NOT 16-byte aligned on the GPU (scalar load path),
 * a 4-bit tensor whose second block has one element (129), and a single
 * element; two groups with different lr / weight decay; a parameter that gets
 * no gradient on some steps (so step counts and scalars differ between
 * parameters); gradient buffers that change between steps; registered
 * gradients vs step_with_grads; skip_nonfinite on and off; a NaN gradient on
 * step 11 (both engines must skip the step).
 *
 * The CUDA kernels perform the CPU engine's operations in the same order
 * without FMA contraction, so the expected outcome is bit-identical params,
 * codes, scales and error-correction bytes. The assertions allow, per case:
 *   - params (with their error-correction byte): at most 0.1% of elements not
 *     bit-identical, each within 2 * steps * lr + 2 ulps of its dtype;
 *   - codes: at most 0.1% differ, each by at most one code (8-bit / 4-bit
 *     index, FP8 / bf16 neighbouring value; fp32 moments: 4 ulps);
 *   - scales (absmax, FP8 absmax / 448): every one within 1 ulp;
 *   - step counts: identical.
 * Totals of what was not bit-identical are printed at the end of each test.
 *
 * LAMB (test_lamb): params, codes and scales as above, its trust ratio's
 * per-tensor sums in the same order on both engines.
 *
 * Muon (test_muon): the momentum's codes and scales (run_muon_case says why
 * not the params).
 *
 * Each algorithm is one cmocka test with its own random stream (from the run's
 * seed), so the tests can run alone (`test_cuda_vs_cpu test_lion`,
 * tests/common/test_select.h): CTest runs them as separate entries. */
#include "cuda_test_util.h"
#include "../common/test_select.h"

#define NPARAMS 4
#define STEPS 22
#define NAN_STEP 11
static const int64_t SIZES[NPARAMS] = {70001, 5003, 129, 1};
static const int UNALIGNED[NPARAMS] = {0, 1, 0, 0};
static const int32_t GROUP[NPARAMS] = {0, 1, 0, 1};
#define SOMETIMES_NO_GRAD 2 /* param 2 has no gradient on steps s % 5 == 3 */

typedef struct {
  const char* name;
  lowbit_algorithm_t algo;
  float lr, wd, momentum, dampening;
  int nesterov;
} acase_t;

typedef struct {
  const char* name;
  lowbit_dtype_t p, g;
  int sr, ecc;
} dcase_t;

typedef struct {
  lowbit_state_format_t m, v;
} fcase_t;

static const dcase_t DTYPES[] = {
    {"f32/f32", LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_FLOAT32, 0, 0},
    {"f32/bf16", LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_BFLOAT16, 0, 0},
    {"bf16/bf16 rne", LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_BFLOAT16, 0, 0},
    {"bf16/bf16 sr", LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_BFLOAT16, 1, 0},
    {"bf16/bf16 ecc", LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_BFLOAT16, 0, 1},
    {"bf16/f32 sr", LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_FLOAT32, 1, 0},
    {"f16/f16 rne", LOWBIT_DTYPE_FLOAT16, LOWBIT_DTYPE_FLOAT16, 0, 0},
    {"f16/f16 sr", LOWBIT_DTYPE_FLOAT16, LOWBIT_DTYPE_FLOAT16, 1, 0},
    {"f16/f16 ecc", LOWBIT_DTYPE_FLOAT16, LOWBIT_DTYPE_FLOAT16, 0, 1},
    {"f16/bf16 ecc", LOWBIT_DTYPE_FLOAT16, LOWBIT_DTYPE_BFLOAT16, 0, 1},
};
#define NDTYPES (int)(sizeof DTYPES / sizeof DTYPES[0])

static const fcase_t FORMATS[] = {
    {LOWBIT_STATE_FP32, LOWBIT_STATE_FP32}, {LOWBIT_STATE_BF16, LOWBIT_STATE_BF16},
    {LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT}, {LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT},
    {LOWBIT_STATE_FP8, LOWBIT_STATE_FP8},   {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT},
    {LOWBIT_STATE_FP8, LOWBIT_STATE_BF16},  {LOWBIT_STATE_4BIT_SR, LOWBIT_STATE_4BIT},
    {LOWBIT_STATE_4BIT_SR, LOWBIT_STATE_4BIT_SR}, {LOWBIT_STATE_4BIT_SR, LOWBIT_STATE_4BIT_DYN},
};
#define NFORMATS (int)(sizeof FORMATS / sizeof FORMATS[0])

static const char* fmt_name(lowbit_state_format_t f) {
  switch (f) {
    case LOWBIT_STATE_FP32: return "fp32";
    case LOWBIT_STATE_BF16: return "bf16";
    case LOWBIT_STATE_8BIT: return "8bit";
    case LOWBIT_STATE_4BIT: return "4bit";
    case LOWBIT_STATE_FP8: return "fp8";
    case LOWBIT_STATE_4BIT_SR: return "4bit-sr";
    case LOWBIT_STATE_4BIT_DYN: return "4bit-dyn";
    default: return "?";
  }
}

static uint64_t g_seed, g_rng;
static cudaStream_t g_stream;

static void run_case(const acase_t* a, const fcase_t* f, const dcase_t* d, int registered, int skip_nonfinite,
                     int inject_nan, ct_stats_t* st) {
  char label[160];
  snprintf(label, sizeof label, "%s %s+%s %s%s%s", a->name, fmt_name(f->m), fmt_name(f->v), d->name,
           registered ? " registered-grads" : " step_with_grads", skip_nonfinite ? "" : " no-check");
  const size_t pb = ct_dtype_bytes(d->p), gb = ct_dtype_bytes(d->g);

  lowbit_optimizer_config_t cfg;
  lowbit_hparams_t h0, h1;
  assert_int_equal(lowbit_optimizer_config_init(&cfg, a->algo), LOWBIT_SUCCESS);
  assert_int_equal(lowbit_hparams_init(&h0, a->algo), LOWBIT_SUCCESS);
  cfg.state_format = f->m;
  cfg.second_state_format = f->v;
  cfg.min_quantized_numel = 0;
  cfg.seed = ct_next(&g_rng);
  cfg.stochastic_rounding = d->sr;
  cfg.error_correction = d->ecc;
  cfg.skip_nonfinite = skip_nonfinite;
  h0.lr = a->lr;
  h0.weight_decay = a->wd;
  h0.momentum = a->momentum;
  h0.dampening = a->dampening;
  h0.nesterov = a->nesterov;
  h1 = h0;
  h1.lr = a->lr * 0.5f;
  h1.weight_decay = a->wd * 2.f;

  lowbit_optimizer_t opt[2] = {NULL, NULL}; /* 0: CPU, 1: GPU */
  for (int e = 0; e < 2; ++e) {
    cfg.device = e ? LOWBIT_DEVICE_CUDA : LOWBIT_DEVICE_CPU;
    if (lowbit_optimizer_create(&opt[e], &cfg, &h0) != LOWBIT_SUCCESS)
      fail_msg("%s: create on %s: %s", label, e ? "GPU" : "CPU", lowbit_last_error());
    int32_t grp = -1;
    assert_int_equal(lowbit_optimizer_add_group(opt[e], &h1, &grp), LOWBIT_SUCCESS);
    assert_int_equal(grp, 1);
  }

  void* hp[NPARAMS];   /* CPU params */
  void* hg[NPARAMS];   /* CPU grads */
  char* dbase[NPARAMS];
  void* dp[NPARAMS];   /* GPU params (inside dbase) */
  char* dgbase[NPARAMS][2];
  void* dg[NPARAMS][2];
  void* check_buf = NULL;
  size_t check_bytes = 0;
  for (int i = 0; i < NPARAMS; ++i) {
    const int64_t n = SIZES[i];
    hp[i] = malloc((size_t)n * pb);
    hg[i] = malloc((size_t)n * gb);
    assert_non_null(hp[i]);
    assert_non_null(hg[i]);
    if ((size_t)n * pb > check_bytes) check_bytes = (size_t)n * pb;
    ct_fill(hp[i], d->p, n, -4, 0, &g_rng);
    const size_t off = UNALIGNED[i] ? 1 : 0;
    CT_CUDA(cudaMalloc((void**)&dbase[i], (size_t)(n + 8) * pb));
    dp[i] = dbase[i] + off * pb;
    CT_CUDA(cudaMemcpy(dp[i], hp[i], (size_t)n * pb, cudaMemcpyHostToDevice));
    for (int b = 0; b < 2; ++b) {
      CT_CUDA(cudaMalloc((void**)&dgbase[i][b], (size_t)(n + 8) * gb));
      dg[i][b] = dgbase[i][b] + off * gb;
    }
    for (int e = 0; e < 2; ++e) {
      lowbit_param_config_t pc;
      assert_int_equal(lowbit_param_config_init(&pc), LOWBIT_SUCCESS);
      pc.param = (lowbit_tensor_t){e ? dp[i] : hp[i], n, d->p, e ? LOWBIT_DEVICE_CUDA : LOWBIT_DEVICE_CPU, 0};
      if (registered) pc.grad = (lowbit_tensor_t){e ? dg[i][0] : hg[i], n, d->g, e ? LOWBIT_DEVICE_CUDA : LOWBIT_DEVICE_CPU, 0};
      pc.group = GROUP[i];
      int64_t id = -1;
      if (lowbit_optimizer_add_param(opt[e], &pc, &id) != LOWBIT_SUCCESS)
        fail_msg("%s: add_param %d: %s", label, i, lowbit_optimizer_last_error(opt[e]));
      assert_int_equal(id, i);
    }
  }
  check_buf = malloc(check_bytes);
  assert_non_null(check_buf);

  for (int s = 1; s <= STEPS; ++s) {
    const int buf = registered ? 0 : (s & 1);
    CT_CUDA(cudaStreamSynchronize(g_stream)); /* the previous step may still read the grad buffers */
    lowbit_tensor_t grads[2][NPARAMS];
    for (int i = 0; i < NPARAMS; ++i) {
      const int64_t n = SIZES[i];
      ct_fill(hg[i], d->g, n, -12, 0, &g_rng);
      if (i == 0) memset((char*)hg[i] + 256 * gb, 0, 256 * gb); /* an all-zero block: absmax 0 */
      if (inject_nan && s == NAN_STEP && i == 1) ct_set_nan(hg[i], d->g, 17);
      CT_CUDA(cudaMemcpy(dg[i][buf], hg[i], (size_t)n * gb, cudaMemcpyHostToDevice));
      const int no_grad = i == SOMETIMES_NO_GRAD && s % 5 == 3;
      for (int e = 0; e < 2; ++e) {
        lowbit_tensor_t t = {e ? dg[i][buf] : hg[i], n, d->g, e ? LOWBIT_DEVICE_CUDA : LOWBIT_DEVICE_CPU, 0};
        grads[e][i] = t;
        if (no_grad) grads[e][i].data = NULL;
        if (registered && i == SOMETIMES_NO_GRAD)
          assert_int_equal(lowbit_optimizer_set_grad(opt[e], i, no_grad ? NULL : &t), LOWBIT_SUCCESS);
      }
    }
    for (int e = 0; e < 2; ++e) {
      void* stream = e ? (void*)g_stream : NULL;
      lowbit_status_t stat = registered ? lowbit_optimizer_step(opt[e], stream)
                                        : lowbit_optimizer_step_with_grads(opt[e], grads[e], NPARAMS, stream);
      if (stat != LOWBIT_SUCCESS)
        fail_msg("%s: step %d on %s: %s", label, s, e ? "GPU" : "CPU", lowbit_optimizer_last_error(opt[e]));
    }
    CT_CUDA(cudaStreamSynchronize(g_stream));
    for (int e = 0; e < 2; ++e) {
      int32_t skipped = -1;
      assert_int_equal(lowbit_optimizer_last_step_skipped(opt[e], &skipped), LOWBIT_SUCCESS);
      int expect = inject_nan && s == NAN_STEP;
      if (skipped != expect)
        fail_msg("%s: step %d on %s: last_step_skipped = %d, expected %d", label, s, e ? "GPU" : "CPU", skipped, expect);
    }
  }
  CT_CUDA(cudaStreamSynchronize(g_stream));

  ct_ckpt_t ck[2];
  for (int e = 0; e < 2; ++e)
    if (!ct_ckpt_read(opt[e], &ck[e])) fail_msg("%s: could not read the %s checkpoint", label, e ? "GPU" : "CPU");
  ct_compare_checkpoints(label, &ck[0], &ck[1], 1, st);

  /* Params (with their error-correction bytes). */
  for (int i = 0; i < NPARAMS; ++i) {
    CT_CUDA(cudaMemcpy(check_buf, dp[i], (size_t)SIZES[i] * pb, cudaMemcpyDeviceToHost));
    const int has_ecc = ck[0].params[i].ecc_bytes != 0;
    ct_compare_params(label, i, d->p, SIZES[i], hp[i], check_buf, has_ecc ? ck[0].params[i].ecc : NULL,
                      has_ecc ? ck[1].params[i].ecc : NULL, 2.0 * STEPS * a->lr, st);
  }
  st->cases++;

  for (int e = 0; e < 2; ++e) {
    ct_ckpt_free(&ck[e]);
    lowbit_optimizer_destroy(opt[e]);
  }
  for (int i = 0; i < NPARAMS; ++i) {
    free(hp[i]);
    free(hg[i]);
    cudaFree(dbase[i]);
    cudaFree(dgbase[i][0]);
    cudaFree(dgbase[i][1]);
  }
  free(check_buf);
}

/* LOWBIT_TEST_QUICK=1 (for compute-sanitizer runs): the quantized formats
 * (of 4BIT_SR the preset's pair) and three dtype cases only. */
static int quick_skip(int fi, int di) {
  if (!getenv("LOWBIT_TEST_QUICK")) return 0;
  const lowbit_state_format_t m = FORMATS[fi].m;
  const int quantized = m == LOWBIT_STATE_8BIT || m == LOWBIT_STATE_4BIT || m == LOWBIT_STATE_FP8 || fi == 0 ||
                        (m == LOWBIT_STATE_4BIT_SR && FORMATS[fi].v != LOWBIT_STATE_4BIT_SR);
  return !quantized || !(di == 1 || di == 3 || di == 8);
}

static void run_algo(const acase_t* a, int all_formats) {
  g_rng = g_seed; /* the same inputs whether this test runs alone or after the others */
  ct_stats_t st;
  memset(&st, 0, sizeof st);
  for (int fi = 0; fi < (all_formats ? NFORMATS : 1); ++fi) {
    if (a->algo != LOWBIT_ALGORITHM_ADAMW && a->algo != LOWBIT_ALGORITHM_ADAM && a->algo != LOWBIT_ALGORITHM_RMSPROP &&
        a->algo != LOWBIT_ALGORITHM_LAMB && FORMATS[fi].v != FORMATS[fi].m)
      continue; /* one-moment algorithms: the mixed pairs add nothing */
    for (int di = 0; di < NDTYPES; ++di) {
      if (quick_skip(fi, di)) continue;
      const int registered = (fi + di) % 3 == 0;
      const int skip_nonfinite = di % 2 == 0;
      const int inject_nan = skip_nonfinite && (di == 2 || di == 6);
      run_case(a, &FORMATS[fi], &DTYPES[di], registered, skip_nonfinite, inject_nan, &st);
    }
  }
  ct_print_stats(a->name, &st);
}

static void test_adamw(void** state) {
  (void)state;
  acase_t a = {"adamw", LOWBIT_ALGORITHM_ADAMW, 1e-3f, 0.01f, 0.f, 0.f, 0};
  run_algo(&a, 1);
}
static void test_adam(void** state) {
  (void)state;
  acase_t a = {"adam", LOWBIT_ALGORITHM_ADAM, 1e-3f, 0.01f, 0.f, 0.f, 0};
  run_algo(&a, 1);
}
static void test_lion(void** state) {
  (void)state;
  acase_t a = {"lion", LOWBIT_ALGORITHM_LION, 1e-4f, 0.1f, 0.f, 0.f, 0};
  run_algo(&a, 1);
}
static void test_sgd_momentum(void** state) {
  (void)state;
  acase_t a = {"sgd momentum", LOWBIT_ALGORITHM_SGD, 1e-2f, 1e-3f, 0.9f, 0.1f, 0};
  run_algo(&a, 1);
}
static void test_sgd_nesterov(void** state) {
  (void)state;
  acase_t a = {"sgd nesterov", LOWBIT_ALGORITHM_SGD, 1e-2f, 1e-3f, 0.9f, 0.f, 1};
  run_algo(&a, 1);
}
static void test_sgd_plain(void** state) {
  (void)state;
  acase_t a = {"sgd plain", LOWBIT_ALGORITHM_SGD, 1e-2f, 1e-3f, 0.f, 0.f, 0};
  run_algo(&a, 0); /* no state: one format entry */
}
/* The algorithms of the descriptors (issue 46): an unsigned first moment. */
static void test_rmsprop_momentum(void** state) {
  (void)state;
  acase_t a = {"rmsprop momentum", LOWBIT_ALGORITHM_RMSPROP, 1e-3f, 1e-3f, 0.9f, 0.f, 0};
  run_algo(&a, 1);
}
static void test_adagrad(void** state) {
  (void)state;
  acase_t a = {"adagrad", LOWBIT_ALGORITHM_ADAGRAD, 1e-2f, 1e-3f, 0.f, 0.f, 0};
  run_algo(&a, 1);
}

/* LAMB: the fused step to a workspace, then the trust ratio's passes (their
 * per-tensor sums in the passes' fixed order on both engines). */
static void test_lamb(void** state) {
  (void)state;
  acase_t a = {"lamb", LOWBIT_ALGORITHM_LAMB, 1e-3f, 0.01f, 0.f, 0.f, 0};
  run_algo(&a, 1);
}

/* Muon: its momentum step runs on the engines' element-wise loops (on CUDA
 * the fast loops for whole tiles of 8-bit, 4-bit and 4BIT_SR momentum with
 * bf16 or fp32 grads); its Newton-Schulz products run on different BLAS
 * (cuBLAS, the CPU's), so the params are not compared, but the momentum
 * depends on the grads only: its codes and scales must be the CPU's, step
 * counts too. Matrices of 64 x 128 (whole tiles), 33 x 129 (a partial tile)
 * and 96 x 96 at an unaligned base, 6 steps, a NaN gradient on step 4. */
static void run_muon_case(lowbit_state_format_t fmt, const dcase_t* d, int nesterov, ct_stats_t* st) {
  enum { NM = 3, MSTEPS = 6, MNAN_STEP = 4 };
  static const int64_t rows[NM] = {64, 33, 96}, cols[NM] = {128, 129, 96};
  static const int unaligned[NM] = {0, 0, 1};
  char label[160];
  snprintf(label, sizeof label, "muon %s %s%s", fmt_name(fmt), d->name, nesterov ? " nesterov" : "");
  const size_t pb = ct_dtype_bytes(d->p), gb = ct_dtype_bytes(d->g);
  lowbit_optimizer_config_t cfg;
  lowbit_hparams_t h;
  assert_int_equal(lowbit_optimizer_config_init(&cfg, LOWBIT_ALGORITHM_MUON), LOWBIT_SUCCESS);
  assert_int_equal(lowbit_hparams_init(&h, LOWBIT_ALGORITHM_MUON), LOWBIT_SUCCESS);
  cfg.state_format = fmt;
  cfg.min_quantized_numel = 0;
  cfg.seed = ct_next(&g_rng);
  cfg.stochastic_rounding = d->sr;
  cfg.skip_nonfinite = 1;
  h.nesterov = nesterov;
  lowbit_optimizer_t opt[2] = {NULL, NULL}; /* 0: CPU, 1: GPU */
  void *hp[NM], *hg[NM], *dp[NM], *dg[NM];
  char *dpbase[NM], *dgbase[NM];
  for (int e = 0; e < 2; ++e) {
    cfg.device = e ? LOWBIT_DEVICE_CUDA : LOWBIT_DEVICE_CPU;
    if (lowbit_optimizer_create(&opt[e], &cfg, &h) != LOWBIT_SUCCESS)
      fail_msg("%s: create on %s: %s", label, e ? "GPU" : "CPU", lowbit_last_error());
  }
  for (int i = 0; i < NM; ++i) {
    const int64_t n = rows[i] * cols[i];
    const size_t off = unaligned[i] ? 1 : 0;
    hp[i] = malloc((size_t)n * pb);
    hg[i] = malloc((size_t)n * gb);
    assert_non_null(hp[i]);
    assert_non_null(hg[i]);
    ct_fill(hp[i], d->p, n, -4, 0, &g_rng);
    CT_CUDA(cudaMalloc((void**)&dpbase[i], (size_t)(n + 8) * pb));
    CT_CUDA(cudaMalloc((void**)&dgbase[i], (size_t)(n + 8) * gb));
    dp[i] = dpbase[i] + off * pb;
    dg[i] = dgbase[i] + off * gb;
    CT_CUDA(cudaMemcpy(dp[i], hp[i], (size_t)n * pb, cudaMemcpyHostToDevice));
    for (int e = 0; e < 2; ++e) {
      lowbit_param_config_t pc;
      assert_int_equal(lowbit_param_config_init(&pc), LOWBIT_SUCCESS);
      pc.param = (lowbit_tensor_t){e ? dp[i] : hp[i], n, d->p, e ? LOWBIT_DEVICE_CUDA : LOWBIT_DEVICE_CPU, 0};
      pc.ndim = 2;
      pc.shape[0] = rows[i];
      pc.shape[1] = cols[i];
      int64_t id = -1;
      if (lowbit_optimizer_add_param(opt[e], &pc, &id) != LOWBIT_SUCCESS)
        fail_msg("%s: add_param %d: %s", label, i, lowbit_optimizer_last_error(opt[e]));
    }
  }
  for (int s = 1; s <= MSTEPS; ++s) {
    CT_CUDA(cudaStreamSynchronize(g_stream));
    lowbit_tensor_t grads[2][NM];
    for (int i = 0; i < NM; ++i) {
      const int64_t n = rows[i] * cols[i];
      ct_fill(hg[i], d->g, n, -12, 0, &g_rng);
      if (s == MNAN_STEP && i == 1) ct_set_nan(hg[i], d->g, 17);
      CT_CUDA(cudaMemcpy(dg[i], hg[i], (size_t)n * gb, cudaMemcpyHostToDevice));
      for (int e = 0; e < 2; ++e)
        grads[e][i] = (lowbit_tensor_t){e ? dg[i] : hg[i], n, d->g, e ? LOWBIT_DEVICE_CUDA : LOWBIT_DEVICE_CPU, 0};
    }
    for (int e = 0; e < 2; ++e)
      if (lowbit_optimizer_step_with_grads(opt[e], grads[e], NM, e ? (void*)g_stream : NULL) != LOWBIT_SUCCESS)
        fail_msg("%s: step %d on %s: %s", label, s, e ? "GPU" : "CPU", lowbit_optimizer_last_error(opt[e]));
    CT_CUDA(cudaStreamSynchronize(g_stream));
    for (int e = 0; e < 2; ++e) {
      int32_t skipped = -1;
      assert_int_equal(lowbit_optimizer_last_step_skipped(opt[e], &skipped), LOWBIT_SUCCESS);
      if (skipped != (s == MNAN_STEP))
        fail_msg("%s: step %d on %s: last_step_skipped = %d", label, s, e ? "GPU" : "CPU", skipped);
    }
  }
  ct_ckpt_t ck[2];
  for (int e = 0; e < 2; ++e)
    if (!ct_ckpt_read(opt[e], &ck[e])) fail_msg("%s: could not read the %s checkpoint", label, e ? "GPU" : "CPU");
  ct_compare_checkpoints(label, &ck[0], &ck[1], 1, st);
  st->cases++;
  for (int e = 0; e < 2; ++e) {
    ct_ckpt_free(&ck[e]);
    lowbit_optimizer_destroy(opt[e]);
  }
  for (int i = 0; i < NM; ++i) {
    free(hp[i]);
    free(hg[i]);
    cudaFree(dpbase[i]);
    cudaFree(dgbase[i]);
  }
}

static void test_muon(void** state) {
  (void)state;
  g_rng = g_seed ^ 0x6D756F6Eu;
  ct_stats_t st;
  memset(&st, 0, sizeof st);
  const lowbit_state_format_t fmts[] = {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT_SR, LOWBIT_STATE_FP32};
  const int dts[] = {0, 1, 2, 6};
  const int quick = getenv("LOWBIT_TEST_QUICK") != NULL;
  for (int f = 0; f < 4; ++f)
    for (int k = 0; k < 4; ++k) {
      if (quick && (f == 3 || k == 3)) continue;
      run_muon_case(fmts[f], &DTYPES[dts[k]], (f + k) % 2, &st);
    }
  ct_print_stats("muon (momentum)", &st);
}

int main(int argc, char** argv) {
  if (!ct_gpu_available()) return CT_SKIP;
  g_seed = ct_seed();
  if (cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adamw),        cmocka_unit_test(test_adam),         cmocka_unit_test(test_lion),
      cmocka_unit_test(test_sgd_momentum), cmocka_unit_test(test_sgd_nesterov), cmocka_unit_test(test_sgd_plain),
      cmocka_unit_test(test_rmsprop_momentum), cmocka_unit_test(test_adagrad), cmocka_unit_test(test_lamb),
      cmocka_unit_test(test_muon),
  };
  int failed = LOWBIT_RUN_SELECTED(tests, argc, argv, NULL, NULL);
  cudaStreamDestroy(g_stream);
  return failed;
}
