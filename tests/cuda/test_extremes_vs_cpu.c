/* Huge finite gradients (issue 32, defect 7) on the GPU engine against the
 * CPU engine, through the C API: AdamW and Adam in every state format and
 * normalisation, fp32 and bf16, shaped params, gradients mostly ordinary with an eighth of
 * the elements at 2^60 .. 2^128 (up to 3.4e38), scattered; and, with beta2 =
 * 0, in whole columns (every 8th, and every 8th + 1 in even rows), so that
 * factored columns saturate and v^ = row / mean * col overflows. The second
 * moments, the factored statistics and v^ saturate at the largest bf16 on
 * both engines alike: params and the compressed checkpoint (codes, scales,
 * rank-1 vectors, factored accumulators, step counts) must be the same bits,
 * and every param finite.
 * Built twice: on the host emulation of the kernels (cuda.extremes_emulated)
 * and against a GPU (cuda.extremes, skipped without one). */
#include "cuda_test_util.h"
#include "../common/state_cases.h"

#define NPARAMS 6
#define STEPS 4
/* The last three have rows a multiple of 8 long: the rank-1 moments' one-read
 * pass 1 (2-D and 3-D) and their fast pass 2 (2-D, whole tiles; 264 columns
 * leave an item with one lane group). */
static const int kNdim[NPARAMS] = {2, 3, 0, 2, 2, 3};
static const int64_t kDims[NPARAMS][3] = {{7, 129, 0}, {3, 5, 257}, {1000, 0, 0},
                                          {24, 512, 0}, {40, 264, 0}, {4, 6, 64}};

static uint64_t g_rng;

static int64_t numel_of(int i) {
  int64_t n = 1;
  for (int k = 0; k < (kNdim[i] ? kNdim[i] : 1); ++k) n *= kDims[i][k];
  return n;
}

static uint8_t* save(lowbit_optimizer_t opt, void* stream, int64_t* size) {
  assert_int_equal(lowbit_optimizer_save(opt, LOWBIT_CHECKPOINT_COMPRESSED, NULL, 0, size, stream), LOWBIT_SUCCESS);
  uint8_t* buf = (uint8_t*)malloc((size_t)*size);
  int64_t got = -1;
  assert_int_equal(lowbit_optimizer_save(opt, LOWBIT_CHECKPOINT_COMPRESSED, buf, *size, &got, stream), LOWBIT_SUCCESS);
  assert_int_equal(got, *size);
  return buf;
}

/* `columns`: beta2 = 0 and the huge elements in whole columns. */
static void run_case(lowbit_algorithm_t algo, const state_case_t* x, int columns, lowbit_dtype_t dt,
                     const char* label) {
  const size_t eb = ct_dtype_bytes(dt);
  lowbit_optimizer_config_t cfg;
  lowbit_hparams_t h;
  assert_int_equal(lowbit_optimizer_config_init(&cfg, algo), LOWBIT_SUCCESS);
  assert_int_equal(lowbit_hparams_init(&h, algo), LOWBIT_SUCCESS);
  cfg.state_format = x->fm;
  cfg.second_state_format = x->fv;
  cfg.first_normalization = x->nm;
  cfg.second_normalization = x->nv;
  cfg.min_quantized_numel = 0;
  h.lr = 1e-2f;
  h.weight_decay = 0.01f;
  if (columns) h.beta2 = 0.f;
  lowbit_optimizer_t opt[2]; /* 0: CPU, 1: GPU */
  uint8_t* hp[NPARAMS];
  uint8_t* hg[NPARAMS];
  void* dp[NPARAMS];
  void* dg[NPARAMS];
  for (int e = 0; e < 2; ++e) {
    cfg.device = e ? LOWBIT_DEVICE_CUDA : LOWBIT_DEVICE_CPU;
    if (lowbit_optimizer_create(&opt[e], &cfg, &h) != LOWBIT_SUCCESS)
      fail_msg("%s: create on %s: %s", label, e ? "GPU" : "CPU", lowbit_last_error());
  }
  for (int i = 0; i < NPARAMS; ++i) {
    const int64_t n = numel_of(i);
    hp[i] = (uint8_t*)malloc((size_t)n * eb);
    hg[i] = (uint8_t*)malloc((size_t)n * eb);
    ct_fill(hp[i], dt, n, -4, 0, &g_rng);
    CT_CUDA(cudaMalloc(&dp[i], (size_t)n * eb));
    CT_CUDA(cudaMalloc(&dg[i], (size_t)n * eb));
    CT_CUDA(cudaMemcpy(dp[i], hp[i], (size_t)n * eb, cudaMemcpyHostToDevice));
    for (int e = 0; e < 2; ++e) {
      lowbit_param_config_t pc;
      assert_int_equal(lowbit_param_config_init(&pc), LOWBIT_SUCCESS);
      const lowbit_device_t dev = e ? LOWBIT_DEVICE_CUDA : LOWBIT_DEVICE_CPU;
      pc.param = (lowbit_tensor_t){e ? dp[i] : (void*)hp[i], n, dt, dev, 0};
      pc.grad = (lowbit_tensor_t){e ? dg[i] : (void*)hg[i], n, dt, dev, 0};
      pc.ndim = kNdim[i];
      for (int k = 0; k < kNdim[i]; ++k) pc.shape[k] = kDims[i][k];
      int64_t id = -1;
      if (lowbit_optimizer_add_param(opt[e], &pc, &id) != LOWBIT_SUCCESS)
        fail_msg("%s: add_param %d: %s", label, i, lowbit_optimizer_last_error(opt[e]));
    }
  }
  for (int s = 0; s < STEPS; ++s) {
    for (int i = 0; i < NPARAMS; ++i) {
      const int64_t n = numel_of(i);
      ct_fill(hg[i], dt, n, -12, 0, &g_rng);
      const int64_t C = kNdim[i] ? kDims[i][kNdim[i] - 1] : n;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t q = k / C, c = k % C;
        const int huge = columns ? c % 8 == 0 || (c % 8 == 1 && q % 2 == 0) : k % 8 == (s + i) % 8;
        if (huge) ct_fill(hg[i] + k * (int64_t)eb, dt, 1, 60, 127, &g_rng);
      }
      CT_CUDA(cudaMemcpy(dg[i], hg[i], (size_t)n * eb, cudaMemcpyHostToDevice));
    }
    for (int e = 0; e < 2; ++e)
      if (lowbit_optimizer_step(opt[e], NULL) != LOWBIT_SUCCESS)
        fail_msg("%s: step %d on %s: %s", label, s, e ? "GPU" : "CPU", lowbit_optimizer_last_error(opt[e]));
  }
  CT_CUDA(cudaDeviceSynchronize());
  int64_t size[2];
  uint8_t* ck[2];
  for (int e = 0; e < 2; ++e) ck[e] = save(opt[e], NULL, &size[e]);
  assert_int_equal(size[0], size[1]);
  for (int64_t b = 0; b < size[0]; ++b)
    if (ck[0][b] != ck[1][b])
      fail_msg("%s: the checkpoints differ first at byte %lld of %lld (CPU %02x, GPU %02x)", label, (long long)b,
               (long long)size[0], ck[0][b], ck[1][b]);
  for (int i = 0; i < NPARAMS; ++i) {
    const int64_t n = numel_of(i);
    uint8_t* back = (uint8_t*)malloc((size_t)n * eb);
    CT_CUDA(cudaMemcpy(back, dp[i], (size_t)n * eb, cudaMemcpyDeviceToHost));
    for (int64_t k = 0; k < n; ++k) {
      const double cpu = ct_elem_value(hp[i], dt, k), gpu = ct_elem_value(back, dt, k);
      if (!isfinite(cpu)) fail_msg("%s: param %d element %lld is %g on the CPU", label, i, (long long)k, cpu);
      if (memcmp(hp[i] + k * (int64_t)eb, back + k * (int64_t)eb, eb))
        fail_msg("%s: param %d element %lld: CPU %.9g, GPU %.9g", label, i, (long long)k, cpu, gpu);
    }
    free(back);
  }
  for (int e = 0; e < 2; ++e) free(ck[e]), lowbit_optimizer_destroy(opt[e]);
  for (int i = 0; i < NPARAMS; ++i) {
    free(hp[i]), free(hg[i]);
    cudaFree(dp[i]), cudaFree(dg[i]);
  }
}

static void test_huge_gradients(void** state) {
  (void)state;
  const lowbit_algorithm_t algos[2] = {LOWBIT_ALGORITHM_ADAMW, LOWBIT_ALGORITHM_ADAM};
  const lowbit_dtype_t dtypes[2] = {LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_BFLOAT16};
  for (int d = 0; d < 2; ++d)
    for (int columns = 0; columns < 2; ++columns)
      for (int a = 0; a < 2; ++a)
        for (int c = 0; c < NUM_STATE_CASES; ++c) {
          char label[160];
          snprintf(label, sizeof label, "%s %s formats %d/%d normalisations %d/%d%s", a ? "adam" : "adamw",
                   d ? "bf16" : "fp32", (int)kStateCases[c].fm, (int)kStateCases[c].fv, (int)kStateCases[c].nm,
                   (int)kStateCases[c].nv, columns ? " columns, beta2 0" : "");
          run_case(algos[a], &kStateCases[c], columns, dtypes[d], label);
        }
  printf("huge gradients: %d cases bit-identical\n", 8 * NUM_STATE_CASES);
}

int main(void) {
  if (!ct_gpu_available()) return CT_SKIP;
  g_rng = ct_seed();
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_huge_gradients)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
