/* A step captured in a CUDA graph through the C API, replayed.
 *
 * The step counts, hyper-parameters and the non-finite check of a CUDA
 * optimizer live on the device, so a captured lowbit_optimizer_step with the
 * default settings (skip_nonfinite = 1, bias correction, stochastic rounding
 * or error correction) is a whole step: each replay reads the gradient
 * buffers, the device step counts (bias corrections, rounding keys) and the
 * device hyper-parameters of the moment it runs. The test replays 10 times
 * with new gradient values written into the captured buffers before each
 * replay, a NaN gradient in one replay (skipped: nothing changes, step
 * counts included) and an lr schedule written through
 * lowbit_optimizer_device_hparams, and compares with the CPU engine taking
 * the same 10 steps (bit-identical expected; tolerances of
 * cuda_test_util.h), step counts included. The application links the shared
 * libcudart while liblowbit carries its own static runtime: the capture
 * crosses the two, as with PyTorch. */
#include "cuda_test_util.h"

#define NP 2
#define REPLAYS 10
static const int64_t SIZES[NP] = {70001, 4099};

static uint64_t g_rng;

typedef struct {
  lowbit_optimizer_t opt[2];
  void* hp[NP];
  void* hg[NP];
  void* dp[NP];
  void* dg[NP];
  lowbit_dtype_t dt;
} pair_t;

static void make_pair(pair_t* p, int ecc, lowbit_state_format_t fmt) {
  memset(p, 0, sizeof *p);
  p->dt = LOWBIT_DTYPE_BFLOAT16;
  lowbit_optimizer_config_t cfg;
  lowbit_hparams_t h;
  assert_int_equal(lowbit_optimizer_config_init(&cfg, LOWBIT_ALGORITHM_ADAMW), LOWBIT_SUCCESS);
  assert_int_equal(lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW), LOWBIT_SUCCESS);
  cfg.state_format = fmt;
  cfg.error_correction = ecc;
  cfg.stochastic_rounding = !ecc;
  cfg.seed = ct_next(&g_rng);
  h.lr = 1e-3f;
  h.weight_decay = 0.01f;
  for (int e = 0; e < 2; ++e) {
    cfg.device = e ? LOWBIT_DEVICE_CUDA : LOWBIT_DEVICE_CPU;
    if (lowbit_optimizer_create(&p->opt[e], &cfg, &h) != LOWBIT_SUCCESS) fail_msg("create: %s", lowbit_last_error());
  }
  for (int i = 0; i < NP; ++i) {
    const size_t bytes = (size_t)SIZES[i] * 2;
    p->hp[i] = malloc(bytes);
    p->hg[i] = malloc(bytes);
    ct_fill(p->hp[i], p->dt, SIZES[i], -4, 0, &g_rng);
    CT_CUDA(cudaMalloc(&p->dp[i], bytes));
    CT_CUDA(cudaMalloc(&p->dg[i], bytes));
    CT_CUDA(cudaMemcpy(p->dp[i], p->hp[i], bytes, cudaMemcpyHostToDevice));
    for (int e = 0; e < 2; ++e) {
      lowbit_param_config_t pc;
      lowbit_param_config_init(&pc);
      lowbit_device_t dev = e ? LOWBIT_DEVICE_CUDA : LOWBIT_DEVICE_CPU;
      pc.param = (lowbit_tensor_t){e ? p->dp[i] : p->hp[i], SIZES[i], p->dt, dev, 0};
      pc.grad = (lowbit_tensor_t){e ? p->dg[i] : p->hg[i], SIZES[i], p->dt, dev, 0};
      int64_t id;
      if (lowbit_optimizer_add_param(p->opt[e], &pc, &id) != LOWBIT_SUCCESS)
        fail_msg("add_param: %s", lowbit_optimizer_last_error(p->opt[e]));
    }
  }
}

static void new_grads(pair_t* p, int nan) {
  for (int i = 0; i < NP; ++i) {
    ct_fill(p->hg[i], p->dt, SIZES[i], -12, 0, &g_rng);
    if (nan && i == 1) ct_set_nan(p->hg[i], p->dt, 77);
    CT_CUDA(cudaMemcpy(p->dg[i], p->hg[i], (size_t)SIZES[i] * 2, cudaMemcpyHostToDevice));
  }
}

static void free_pair(pair_t* p) {
  for (int e = 0; e < 2; ++e) lowbit_optimizer_destroy(p->opt[e]);
  for (int i = 0; i < NP; ++i) {
    free(p->hp[i]);
    free(p->hg[i]);
    cudaFree(p->dp[i]);
    cudaFree(p->dg[i]);
  }
}

static void replay_case(lowbit_state_format_t fmt, int ecc) {
  char label[64];
  snprintf(label, sizeof label, "graph replay %s%s", fmt == LOWBIT_STATE_8BIT ? "8bit" : "4bit", ecc ? " ecc" : "");
  pair_t p;
  make_pair(&p, ecc, fmt);
  cudaStream_t s;
  CT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  lowbit_hparams_t* dev_hp = NULL;
  assert_int_equal(lowbit_optimizer_device_hparams(p.opt[1], 0, &dev_hp), LOWBIT_SUCCESS);

  /* One ordinary step first (tables and hparams on the device). */
  new_grads(&p, 0);
  assert_int_equal(lowbit_optimizer_step(p.opt[0], NULL), LOWBIT_SUCCESS);
  assert_int_equal(lowbit_optimizer_step(p.opt[1], s), LOWBIT_SUCCESS);
  CT_CUDA(cudaStreamSynchronize(s));

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  lowbit_status_t st = lowbit_optimizer_step(p.opt[1], s);
  CT_CUDA(cudaStreamEndCapture(s, &graph));
  if (st != LOWBIT_SUCCESS) fail_msg("%s: step under capture: %s", label, lowbit_optimizer_last_error(p.opt[1]));
  size_t nodes = 0;
  CT_CUDA(cudaGraphGetNodes(graph, NULL, &nodes));
  assert_true(nodes >= 1);
  CT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  float lr = 1e-3f;
  for (int r = 0; r < REPLAYS; ++r) {
    CT_CUDA(cudaStreamSynchronize(s));
    const int nan = r == 6;
    new_grads(&p, nan);
    if (r >= 3) {
      /* An lr schedule under replay: written into the device hparams. */
      lr *= 0.8f;
      CT_CUDA(cudaMemcpyAsync(&dev_hp->lr, &lr, sizeof lr, cudaMemcpyHostToDevice, s));
      assert_int_equal(lowbit_optimizer_set_lr(p.opt[0], 0, lr), LOWBIT_SUCCESS);
    }
    CT_CUDA(cudaGraphLaunch(exec, s));
    assert_int_equal(lowbit_optimizer_step(p.opt[0], NULL), LOWBIT_SUCCESS);
    CT_CUDA(cudaStreamSynchronize(s));
    int32_t skipped[2] = {-1, -1};
    for (int e = 0; e < 2; ++e) assert_int_equal(lowbit_optimizer_last_step_skipped(p.opt[e], &skipped[e]), LOWBIT_SUCCESS);
    if (skipped[0] != nan || skipped[1] != nan)
      fail_msg("%s replay %d: skipped CPU %d GPU %d, expected %d", label, r, skipped[0], skipped[1], nan);
  }
  CT_CUDA(cudaStreamSynchronize(s));

  ct_stats_t stats;
  memset(&stats, 0, sizeof stats);
  ct_ckpt_t ck[2];
  for (int e = 0; e < 2; ++e) assert_true(ct_ckpt_read(p.opt[e], &ck[e]));
  /* Replays advance the device step counts: both took 1 + REPLAYS - 1 steps. */
  ct_compare_checkpoints(label, &ck[0], &ck[1], 1, &stats);
  void* back = malloc((size_t)SIZES[0] * 2);
  for (int i = 0; i < NP; ++i) {
    CT_CUDA(cudaMemcpy(back, p.dp[i], (size_t)SIZES[i] * 2, cudaMemcpyDeviceToHost));
    ct_compare_params(label, i, p.dt, SIZES[i], p.hp[i], back, ck[0].params[i].ecc_bytes ? ck[0].params[i].ecc : NULL,
                      ck[1].params[i].ecc_bytes ? ck[1].params[i].ecc : NULL, 2.0 * (REPLAYS + 1) * 1e-3, &stats);
  }
  stats.cases = 1;
  ct_print_stats(label, &stats);
  free(back);
  for (int e = 0; e < 2; ++e) ct_ckpt_free(&ck[e]);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  free_pair(&p);
}

static void test_replay_8bit(void** state) {
  (void)state;
  replay_case(LOWBIT_STATE_8BIT, 0);
}

static void test_replay_4bit_ecc(void** state) {
  (void)state;
  replay_case(LOWBIT_STATE_4BIT, 1);
}

int main(void) {
  if (!ct_gpu_available()) return CT_SKIP;
  g_rng = ct_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_replay_8bit),
      cmocka_unit_test(test_replay_4bit_ecc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
