/* lowbit_optimizer_step on CUDA never makes the host wait, checked on the
 * CUDA emulation (linked with lowbit_emulated, whose runtime counts the calls
 * that wait: stream/device/event synchronisations and blocking copies and
 * sets; and allocations, frees and copies from pageable host memory).
 *
 * For every algorithm (AdamW, Adam, Lion, SGD with and without momentum) x
 * state format (fp32, bf16, 8-bit, 4-bit, FP8, 8-bit m + 4-bit v) x
 * skip_nonfinite 0 and 1, an optimizer with fp32 params, bf16 params with
 * stochastic rounding and fp16 params with error correction in two groups
 * takes steps with registered gradients and with step_with_grads, on a
 * created stream and on the legacy default stream, after an lr change: every
 * call inside lowbit_optimizer_step counts 0 of each kind, the first step
 * after registration included. Muon (fp32, 8-bit, 4-bit rank-1 momentum,
 * bf16 params with SR, an AdamW group beside it) likewise: its momentum,
 * norm, scale and update passes and its products stay on the stream.
 *
 * With skip_nonfinite = 1 a NaN gradient still skips the whole step: once the
 * stream is synchronised, lowbit_optimizer_last_step_skipped() is 1 and the
 * params, the state and the step counts are what they were (the checkpoint is
 * byte for byte the same).
 *
 * A default-settings step captured in a graph (cudaStreamBeginCapture on the
 * emulation records the work; cudaGraphLaunch replays it) equals, replay for
 * replay, an uncaptured optimizer taking the same steps. */
#include "cuda_test_util.h"
#include "emu_counters.h"

#define NP 3
static const int64_t SIZES[NP] = {70001, 5003, 129};
static const lowbit_dtype_t PDT[NP] = {LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_FLOAT16};
static const int SR[NP] = {0, 1, 0};
static const int ECC[NP] = {0, 0, 1};

static uint64_t g_rng;

static uint64_t next_u64(void) { return ct_next(&g_rng); }

typedef struct {
  lowbit_optimizer_t opt;
  void* param[NP];
  void* grad[NP];
} fixture_t;

static void setup(fixture_t* f, lowbit_algorithm_t algo, float momentum, lowbit_state_format_t m,
                  lowbit_state_format_t v, int skip_nonfinite) {
  memset(f, 0, sizeof *f);
  lowbit_optimizer_config_t cfg;
  lowbit_hparams_t h;
  assert_int_equal(lowbit_optimizer_config_init(&cfg, algo), LOWBIT_SUCCESS);
  assert_int_equal(lowbit_hparams_init(&h, algo), LOWBIT_SUCCESS);
  cfg.device = LOWBIT_DEVICE_CUDA;
  cfg.state_format = m;
  cfg.second_state_format = v;
  cfg.min_quantized_numel = 0;
  cfg.skip_nonfinite = skip_nonfinite;
  cfg.seed = next_u64();
  h.momentum = momentum;
  if (lowbit_optimizer_create(&f->opt, &cfg, &h) != LOWBIT_SUCCESS) fail_msg("create: %s", lowbit_last_error());
  int32_t g1;
  h.lr *= 0.5f;
  assert_int_equal(lowbit_optimizer_add_group(f->opt, &h, &g1), LOWBIT_SUCCESS);
  for (int i = 0; i < NP; ++i) {
    const size_t bytes = (size_t)SIZES[i] * ct_dtype_bytes(PDT[i]);
    CT_CUDA(cudaMalloc(&f->param[i], bytes));
    CT_CUDA(cudaMalloc(&f->grad[i], bytes));
    ct_fill(f->param[i], PDT[i], SIZES[i], -4, 0, &g_rng); /* emulated device memory is host memory */
    lowbit_param_config_t pc;
    lowbit_param_config_init(&pc);
    pc.param = (lowbit_tensor_t){f->param[i], SIZES[i], PDT[i], LOWBIT_DEVICE_CUDA, 0};
    pc.grad = (lowbit_tensor_t){f->grad[i], SIZES[i], PDT[i], LOWBIT_DEVICE_CUDA, 0};
    pc.group = i % 2;
    pc.stochastic_rounding = SR[i];
    pc.error_correction = ECC[i];
    int64_t id;
    if (lowbit_optimizer_add_param(f->opt, &pc, &id) != LOWBIT_SUCCESS)
      fail_msg("add_param: %s", lowbit_optimizer_last_error(f->opt));
  }
}

static void teardown(fixture_t* f) {
  lowbit_optimizer_destroy(f->opt);
  for (int i = 0; i < NP; ++i) {
    cudaFree(f->param[i]);
    cudaFree(f->grad[i]);
  }
}

static void new_grads(fixture_t* f) {
  for (int i = 0; i < NP; ++i) ct_fill(f->grad[i], PDT[i], SIZES[i], -12, 0, &g_rng);
}

/* A call that must neither wait nor allocate. */
#define NO_WAIT(label, call)                                                                                      \
  do {                                                                                                            \
    lowbit_emu_reset_counters();                                                                                  \
    lowbit_status_t st_ = (call);                                                                                 \
    if (st_ != LOWBIT_SUCCESS) fail_msg("%s: %s", label, lowbit_optimizer_last_error(f.opt));                     \
    if (lowbit_emu_host_syncs() || lowbit_emu_allocations() || lowbit_emu_frees() || lowbit_emu_pageable_copies()) \
      fail_msg("%s: %s: %lld host syncs, %lld allocations, %lld frees, %lld pageable copies", label, #call,        \
               (long long)lowbit_emu_host_syncs(), (long long)lowbit_emu_allocations(),                            \
               (long long)lowbit_emu_frees(), (long long)lowbit_emu_pageable_copies());                          \
    ++g_checked;                                                                                                  \
  } while (0)

static int64_t g_checked;

typedef struct {
  const char* name;
  lowbit_algorithm_t algo;
  float momentum;
} acase_t;

static const acase_t ALGOS[] = {
    {"adamw", LOWBIT_ALGORITHM_ADAMW, 0.f}, {"adam", LOWBIT_ALGORITHM_ADAM, 0.f},
    {"lion", LOWBIT_ALGORITHM_LION, 0.f},   {"sgd momentum", LOWBIT_ALGORITHM_SGD, 0.9f},
    {"sgd", LOWBIT_ALGORITHM_SGD, 0.f},
};
static const lowbit_state_format_t FORMATS[][2] = {
    {LOWBIT_STATE_FP32, LOWBIT_STATE_FP32}, {LOWBIT_STATE_BF16, LOWBIT_STATE_BF16},
    {LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT}, {LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT},
    {LOWBIT_STATE_FP8, LOWBIT_STATE_FP8},   {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT},
};

static uint8_t* save(lowbit_optimizer_t opt, int64_t* size) {
  assert_int_equal(lowbit_optimizer_save(opt, LOWBIT_CHECKPOINT_COMPRESSED, NULL, 0, size, NULL), LOWBIT_SUCCESS);
  uint8_t* b = malloc((size_t)*size);
  assert_int_equal(lowbit_optimizer_save(opt, LOWBIT_CHECKPOINT_COMPRESSED, b, *size, size, NULL), LOWBIT_SUCCESS);
  return b;
}

/* Once `s` has run them: the last step was not skipped, and param 1 (which
 * sat one step out) has taken `steps` steps. */
static void expect_stepped(lowbit_optimizer_t opt, cudaStream_t s, int64_t steps) {
  CT_CUDA(cudaStreamSynchronize(s));
  int32_t skipped = -1;
  assert_int_equal(lowbit_optimizer_last_step_skipped(opt, &skipped), LOWBIT_SUCCESS);
  assert_int_equal(skipped, 0);
  lowbit_param_info_t info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  assert_int_equal(lowbit_optimizer_param_info(opt, 1, &info), LOWBIT_SUCCESS);
  assert_int_equal(info.step, steps);
}

static void test_every_step_is_wait_free(void** state) {
  (void)state;
  cudaStream_t s;
  CT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (size_t a = 0; a < sizeof ALGOS / sizeof ALGOS[0]; ++a)
    for (size_t fi = 0; fi < sizeof FORMATS / sizeof FORMATS[0]; ++fi) {
      const int two = ALGOS[a].algo == LOWBIT_ALGORITHM_ADAMW || ALGOS[a].algo == LOWBIT_ALGORITHM_ADAM;
      if (!two && FORMATS[fi][0] != FORMATS[fi][1]) continue;
      if (ALGOS[a].momentum == 0.f && ALGOS[a].algo == LOWBIT_ALGORITHM_SGD && fi > 0) continue;
      for (int skip = 0; skip <= 1; ++skip) {
        char label[128];
        snprintf(label, sizeof label, "%s %d+%d skip_nonfinite=%d", ALGOS[a].name, FORMATS[fi][0], FORMATS[fi][1],
                 skip);
        fixture_t f;
        setup(&f, ALGOS[a].algo, ALGOS[a].momentum, FORMATS[fi][0], FORMATS[fi][1], skip);
        new_grads(&f);
        NO_WAIT(label, lowbit_optimizer_step(f.opt, s)); /* the first step after registration */
        new_grads(&f);
        NO_WAIT(label, lowbit_optimizer_step(f.opt, NULL));
        assert_int_equal(lowbit_optimizer_set_lr(f.opt, 1, 1e-4f), LOWBIT_SUCCESS);
        lowbit_tensor_t grads[NP];
        for (int i = 0; i < NP; ++i) grads[i] = (lowbit_tensor_t){f.grad[i], SIZES[i], PDT[i], LOWBIT_DEVICE_CUDA, 0};
        grads[1].data = NULL; /* param 1 sits this step out */
        NO_WAIT(label, lowbit_optimizer_step_with_grads(f.opt, grads, NP, s));
        NO_WAIT(label, lowbit_optimizer_step(f.opt, s));
        expect_stepped(f.opt, s, 3);
        teardown(&f);
      }
    }
  cudaStreamDestroy(s);
  printf("%lld step calls: no host wait, no allocation\n", (long long)g_checked);
}


/* Muon (a momentum step per batch of equal matrices, passes and cuBLAS
 * products on the stream) with an AdamW group beside it: the same, from the
 * first step after registration, in fp32, 8-bit and 4-bit rank-1. */
static void test_muon_steps_are_wait_free(void** state) {
  (void)state;
  static const int64_t ROWS[NP] = {300, 61, 129}, COLS[NP] = {233, 82, 1};
  const lowbit_state_format_t fmts[3] = {LOWBIT_STATE_FP32, LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT};
  cudaStream_t s;
  CT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int fi = 0; fi < 3; ++fi)
    for (int skip = 0; skip <= 1; ++skip) {
      char label[96];
      snprintf(label, sizeof label, "muon format %d skip_nonfinite=%d", (int)fmts[fi], skip);
      fixture_t f;
      memset(&f, 0, sizeof f);
      lowbit_optimizer_config_t cfg;
      lowbit_hparams_t h, ha;
      assert_int_equal(lowbit_optimizer_config_init(&cfg, LOWBIT_ALGORITHM_MUON), LOWBIT_SUCCESS);
      assert_int_equal(lowbit_hparams_init(&h, LOWBIT_ALGORITHM_MUON), LOWBIT_SUCCESS);
      assert_int_equal(lowbit_hparams_init(&ha, LOWBIT_ALGORITHM_ADAMW), LOWBIT_SUCCESS);
      cfg.device = LOWBIT_DEVICE_CUDA;
      cfg.state_format = fmts[fi];
      cfg.first_normalization = fmts[fi] == LOWBIT_STATE_4BIT ? LOWBIT_NORMALIZATION_RANK1 : LOWBIT_NORMALIZATION_BLOCK;
      cfg.min_quantized_numel = 0;
      cfg.skip_nonfinite = skip;
      cfg.seed = next_u64();
      if (lowbit_optimizer_create(&f.opt, &cfg, &h) != LOWBIT_SUCCESS) fail_msg("create: %s", lowbit_last_error());
      int32_t g1;
      assert_int_equal(lowbit_optimizer_add_group(f.opt, &ha, &g1), LOWBIT_SUCCESS);
      for (int i = 0; i < NP; ++i) {
        const int64_t n = ROWS[i] * COLS[i];
        CT_CUDA(cudaMalloc(&f.param[i], (size_t)n * ct_dtype_bytes(PDT[i])));
        CT_CUDA(cudaMalloc(&f.grad[i], (size_t)n * ct_dtype_bytes(PDT[i])));
        ct_fill(f.param[i], PDT[i], n, -4, 0, &g_rng);
        lowbit_param_config_t pc;
        lowbit_param_config_init(&pc);
        pc.param = (lowbit_tensor_t){f.param[i], n, PDT[i], LOWBIT_DEVICE_CUDA, 0};
        pc.grad = (lowbit_tensor_t){f.grad[i], n, PDT[i], LOWBIT_DEVICE_CUDA, 0};
        pc.stochastic_rounding = SR[i];
        pc.error_correction = ECC[i];
        if (COLS[i] > 1) {
          pc.ndim = 2, pc.shape[0] = ROWS[i], pc.shape[1] = COLS[i];
        } else {
          pc.group = g1;  /* the AdamW group */
        }
        int64_t id;
        if (lowbit_optimizer_add_param(f.opt, &pc, &id) != LOWBIT_SUCCESS)
          fail_msg("add_param: %s", lowbit_optimizer_last_error(f.opt));
      }
      for (int i = 0; i < NP; ++i) ct_fill(f.grad[i], PDT[i], ROWS[i] * COLS[i], -12, 0, &g_rng);
      NO_WAIT(label, lowbit_optimizer_step(f.opt, s)); /* the first step after registration */
      NO_WAIT(label, lowbit_optimizer_step(f.opt, NULL));
      assert_int_equal(lowbit_optimizer_set_lr(f.opt, 0, 1e-4f), LOWBIT_SUCCESS);
      lowbit_tensor_t grads[NP];
      for (int i = 0; i < NP; ++i)
        grads[i] = (lowbit_tensor_t){f.grad[i], ROWS[i] * COLS[i], PDT[i], LOWBIT_DEVICE_CUDA, 0};
      grads[1].data = NULL; /* param 1 sits this step out */
      NO_WAIT(label, lowbit_optimizer_step_with_grads(f.opt, grads, NP, s));
      expect_stepped(f.opt, s, 2);
      teardown(&f);
    }
  cudaStreamDestroy(s);
}

static void test_nan_skips_and_changes_nothing(void** state) {
  (void)state;
  for (size_t a = 0; a < sizeof ALGOS / sizeof ALGOS[0]; ++a) {
    const lowbit_state_format_t* fmt = FORMATS[2 + a % 3];
    fixture_t f;
    setup(&f, ALGOS[a].algo, ALGOS[a].momentum, fmt[0], fmt[0], 1);
    cudaStream_t s;
    CT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    new_grads(&f);
    NO_WAIT(ALGOS[a].name, lowbit_optimizer_step(f.opt, s));
    CT_CUDA(cudaStreamSynchronize(s));
    int64_t n0, n1;
    uint8_t* before = save(f.opt, &n0);
    void* params[NP];
    for (int i = 0; i < NP; ++i) {
      params[i] = malloc((size_t)SIZES[i] * ct_dtype_bytes(PDT[i]));
      memcpy(params[i], f.param[i], (size_t)SIZES[i] * ct_dtype_bytes(PDT[i]));
    }
    new_grads(&f);
    ct_set_nan(f.grad[2], PDT[2], 100);
    NO_WAIT(ALGOS[a].name, lowbit_optimizer_step(f.opt, s));
    CT_CUDA(cudaStreamSynchronize(s));
    int32_t skipped = 0;
    assert_int_equal(lowbit_optimizer_last_step_skipped(f.opt, &skipped), LOWBIT_SUCCESS);
    assert_int_equal(skipped, 1);
    uint8_t* after = save(f.opt, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, (size_t)n0); /* state and step counts */
    for (int i = 0; i < NP; ++i) {
      assert_memory_equal(params[i], f.param[i], (size_t)SIZES[i] * ct_dtype_bytes(PDT[i]));
      free(params[i]);
    }
    free(before);
    free(after);
    /* The next finite step is applied. */
    new_grads(&f);
    NO_WAIT(ALGOS[a].name, lowbit_optimizer_step(f.opt, s));
    CT_CUDA(cudaStreamSynchronize(s));
    assert_int_equal(lowbit_optimizer_last_step_skipped(f.opt, &skipped), LOWBIT_SUCCESS);
    assert_int_equal(skipped, 0);
    cudaStreamDestroy(s);
    teardown(&f);
  }
}

/* A default-settings step (skip_nonfinite = 1, bias correction, SR and ECC)
 * in a graph, replayed; against an optimizer stepping without the graph. */
static void test_default_step_in_a_graph(void** state) {
  (void)state;
  const uint64_t seed = g_rng;
  fixture_t f, ref;
  g_rng = seed;
  setup(&f, LOWBIT_ALGORITHM_ADAMW, 0.f, LOWBIT_STATE_8BIT, LOWBIT_STATE_DEFAULT, 1);
  g_rng = seed;
  setup(&ref, LOWBIT_ALGORITHM_ADAMW, 0.f, LOWBIT_STATE_8BIT, LOWBIT_STATE_DEFAULT, 1);
  cudaStream_t s;
  CT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  NO_WAIT("capture", lowbit_optimizer_step(f.opt, s));
  CT_CUDA(cudaStreamEndCapture(s, &graph));
  CT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < 6; ++r) {
    new_grads(&f);
    for (int i = 0; i < NP; ++i) memcpy(ref.grad[i], f.grad[i], (size_t)SIZES[i] * ct_dtype_bytes(PDT[i]));
    if (r == 3) {
      const uint16_t inf = 0x7F80u;
      memcpy((char*)f.grad[1] + 2 * 7, &inf, 2);
      memcpy((char*)ref.grad[1] + 2 * 7, &inf, 2);
    }
    CT_CUDA(cudaGraphLaunch(exec, s));
    assert_int_equal(lowbit_optimizer_step(ref.opt, NULL), LOWBIT_SUCCESS);
    CT_CUDA(cudaStreamSynchronize(s));
    int32_t a = -1, b = -1;
    lowbit_optimizer_last_step_skipped(f.opt, &a);
    lowbit_optimizer_last_step_skipped(ref.opt, &b);
    assert_int_equal(a, r == 3);
    assert_int_equal(b, r == 3);
    int64_t n0, n1;
    uint8_t* x = save(f.opt, &n0);
    uint8_t* y = save(ref.opt, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(x, y, (size_t)n0);
    for (int i = 0; i < NP; ++i) assert_memory_equal(f.param[i], ref.param[i], (size_t)SIZES[i] * ct_dtype_bytes(PDT[i]));
    free(x);
    free(y);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  teardown(&f);
  teardown(&ref);
}

int main(void) {
  g_rng = lowbit_test_seed("test_step_no_host_wait");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_step_is_wait_free),
      cmocka_unit_test(test_muon_steps_are_wait_free),
      cmocka_unit_test(test_nan_skips_and_changes_nothing),
      cmocka_unit_test(test_default_step_in_a_graph),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
