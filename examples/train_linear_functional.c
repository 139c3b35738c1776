/*
 * train_linear_functional: a linear regression trained through the
 * functional step of the lowbit C API (lowbit.h, "functional step").
 *
 * Here the caller owns everything: the params, the grads, each param's
 * optimizer state (planned by lowbit_plan_param_state, allocated zero-filled
 * here, with its state record) and the step count. Every step passes them
 * all to lowbit_functional_step.
 *
 * Data: 512 samples of 64 features, uniform in [-1, 1) from a xorshift64*
 * generator written below, y = X w* + b* + a little noise, with w* and b* a
 * fixed formula. Model: y^ = X w + b, loss 0.5 * mean((y^ - y)^2), full-batch
 * gradients. Optimizer: AdamW, two groups (the weight with weight decay, the
 * bias without); the weight (shape 1 x 64) has 8-bit state
 * (min_quantized_numel = 0 so that a param this small is quantized too), the
 * bias fp32 state. The step count is passed both ways: as the host value
 * args.step and as a count the step reads and writes (args.count /
 * args.count_out; host memory on a CPU context).
 *
 * At the end it prints `final-bits <hex>`: a 64-bit FNV-1a hash of the final
 * params and state buffers. bindings/rust/examples/train_linear.rs does
 * exactly the same training and must print the same line
 * (bindings/rust/run_test.sh, CTest rust.train_linear).
 *
 * Exits non-zero if a call fails or the loss did not go down by 10x.
 * Plain C11, no dependency besides liblowbit.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowbit.h"

#define N 512   /* samples */
#define D 64    /* features */
#define STEPS 50
#define NPARAMS 2 /* the weight and the bias */

static lowbit_step_context_t ctx; /* NULL until created: errors then come from lowbit_last_error() */

#define CHECK(call)                                                                                        \
  do {                                                                                                     \
    lowbit_status_t st_ = (call);                                                                          \
    if (st_ != LOWBIT_SUCCESS) {                                                                           \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call, lowbit_status_string(st_), \
              lowbit_step_context_last_error(ctx));                                                        \
      exit(1);                                                                                             \
    }                                                                                                      \
  } while (0)

/* ---------------------------------------------------------------- random */

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rng_next(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1Dull;
}
/* Uniform in [-1, 1): the top 24 bits, exactly representable as floats. */
static float rng_uniform(void) { return (float)(rng_next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }

/* ---------------------------------------------------------------- data and model */

static float X[N][D], Y[N];
static float W[D], B[1];   /* the params */
static float GW[D], GB[1]; /* their grads */

static void make_data(void) {
  float w_true[D];
  for (int j = 0; j < D; ++j) w_true[j] = (float)((j * 37) % 17 - 8) / 16.0f;
  const float b_true = 0.75f;
  for (int i = 0; i < N; ++i) {
    for (int j = 0; j < D; ++j) X[i][j] = rng_uniform();
    float y = b_true;
    for (int j = 0; j < D; ++j) y += X[i][j] * w_true[j];
    Y[i] = y + 0.01f * rng_uniform();
  }
  for (int j = 0; j < D; ++j) W[j] = 0.1f * rng_uniform();
  B[0] = 0.0f;
}

/* The loss at the current params; with grads != 0 also writes GW and GB. */
static double loss_and_grads(int grads) {
  double loss = 0.0;
  if (grads) {
    memset(GW, 0, sizeof GW);
    GB[0] = 0.0f;
  }
  for (int i = 0; i < N; ++i) {
    float pred = B[0];
    for (int j = 0; j < D; ++j) pred += X[i][j] * W[j];
    const float r = pred - Y[i];
    loss += (double)r * (double)r;
    if (grads) {
      for (int j = 0; j < D; ++j) GW[j] += r * X[i][j];
      GB[0] += r;
    }
  }
  if (grads) {
    for (int j = 0; j < D; ++j) GW[j] *= 1.0f / N;
    GB[0] *= 1.0f / N;
  }
  return 0.5 * loss / N;
}

/* ---------------------------------------------------------------- hash */

static uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const unsigned char* p = (const unsigned char*)data;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

/* ---------------------------------------------------------------- state */

/* One param's state, as the functional step wants it: the buffers of its plan. */
typedef struct param_state {
  lowbit_state_plan_t plan;
  int32_t ndim;
  int64_t shape[LOWBIT_MAX_DIMS];
  void* moment[2];
  float* scales[2];
  uint8_t* ecc;
} param_state_t;

static void* zeroed(int64_t bytes) {
  if (bytes == 0) return NULL;
  void* p = calloc((size_t)bytes, 1); /* malloc's alignment covers fp32 / bf16 moments and scales */
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  return p;
}

static void plan_state(param_state_t* s, const lowbit_optimizer_config_t* cfg, const lowbit_hparams_t* hp,
                       lowbit_param_config_t* pc, int32_t* record) {
  CHECK(lowbit_state_plan_init(&s->plan));
  CHECK(lowbit_plan_param_state(cfg, hp, pc, &s->plan));
  s->ndim = pc->ndim;
  memcpy(s->shape, pc->shape, sizeof s->shape);
  for (int m = 0; m < 2; ++m) {
    s->moment[m] = zeroed(s->plan.data_bytes[m]);
    s->scales[m] = (float*)zeroed(s->plan.scale_count[m] * (int64_t)sizeof(float));
  }
  s->ecc = (uint8_t*)zeroed(s->plan.ecc_bytes);
  CHECK(lowbit_state_record(&s->plan, s->ndim, s->shape, record, LOWBIT_STATE_RECORD_INT32));
}

static void fill_buffers(lowbit_param_buffers_t* b, param_state_t* s, float* param, float* grad, int64_t numel,
                         int32_t group) {
  CHECK(lowbit_param_buffers_init(b));
  b->param = (lowbit_tensor_t){param, numel, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  b->grad = (lowbit_tensor_t){grad, numel, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  b->group = group;
  b->ndim = s->ndim;
  memcpy(b->shape, s->shape, sizeof b->shape);
  b->plan = &s->plan;
  for (int m = 0; m < 2; ++m) {
    b->moment[m] = s->moment[m];
    b->moment_bytes[m] = s->plan.data_bytes[m];
    b->scales[m] = s->scales[m];
    b->scale_count[m] = s->plan.scale_count[m];
  }
  b->ecc = s->ecc;
  b->ecc_bytes = s->plan.ecc_bytes;
}

static uint64_t hash_state(uint64_t h, const param_state_t* s) {
  for (int m = 0; m < 2; ++m) {
    if (s->plan.data_bytes[m]) h = fnv1a(h, s->moment[m], (size_t)s->plan.data_bytes[m]);
    if (s->plan.scale_count[m]) h = fnv1a(h, s->scales[m], (size_t)s->plan.scale_count[m] * sizeof(float));
  }
  if (s->plan.ecc_bytes) h = fnv1a(h, s->ecc, (size_t)s->plan.ecc_bytes);
  return h;
}

/* ---------------------------------------------------------------- main */

int main(void) {
  make_data();

  /* The optimizer: AdamW, 8-bit state for every param, however small. */
  lowbit_optimizer_config_t cfg;
  CHECK(lowbit_optimizer_config_init(&cfg, LOWBIT_ALGORITHM_ADAMW));
  cfg.state_format = LOWBIT_STATE_8BIT;
  cfg.min_quantized_numel = 0;
  lowbit_hparams_t hp[2]; /* group 0: the weight; group 1: the bias, no weight decay */
  CHECK(lowbit_hparams_init(&hp[0], LOWBIT_ALGORITHM_ADAMW));
  hp[0].lr = 0.05f;
  hp[0].weight_decay = 0.01f;
  hp[1] = hp[0];
  hp[1].weight_decay = 0.0f;
  for (int g = 0; g < 2; ++g) CHECK(lowbit_hparams_check(&hp[g], LOWBIT_ALGORITHM_ADAMW));

  /* Plans: the weight a 1 x 64 matrix with the config's 8-bit state, the
   * bias fp32 state (a per-param override). */
  param_state_t state[NPARAMS];
  int32_t records[NPARAMS][LOWBIT_STATE_RECORD_INT32];
  lowbit_param_config_t pc;
  CHECK(lowbit_param_config_init(&pc));
  pc.param = (lowbit_tensor_t){NULL, D, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  pc.group = 0;
  pc.ndim = 2;
  pc.shape[0] = 1;
  pc.shape[1] = D;
  plan_state(&state[0], &cfg, &hp[0], &pc, records[0]);
  CHECK(lowbit_param_config_init(&pc));
  pc.param = (lowbit_tensor_t){NULL, 1, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  pc.group = 1;
  pc.state_format = LOWBIT_STATE_FP32;
  pc.second_state_format = LOWBIT_STATE_FP32;
  plan_state(&state[1], &cfg, &hp[1], &pc, records[1]);
  for (int i = 0; i < NPARAMS; ++i)
    printf("%s: state %s / %s, %" PRId64 " bytes\n", i == 0 ? "weight" : "bias",
           lowbit_state_format_name(state[i].plan.format[0]), lowbit_state_format_name(state[i].plan.format[1]),
           state[i].plan.state_bytes);

  CHECK(lowbit_step_context_create(&ctx, &cfg));
  lowbit_param_buffers_t params[NPARAMS];
  fill_buffers(&params[0], &state[0], W, GW, D, 0);
  fill_buffers(&params[1], &state[1], B, GB, 1, 1);

  int32_t count = 0; /* the state's count of steps applied (host memory: a CPU context) */
  lowbit_step_args_t args;
  CHECK(lowbit_step_args_init(&args));
  args.hparams = hp;
  args.num_groups = 2;
  args.count = &count;
  args.count_out = &count;
  args.records = &records[0][0];

  const double loss0 = loss_and_grads(0);
  printf("step %3d  loss %.6f\n", 0, loss0);
  for (int t = 0; t < STEPS; ++t) {
    const double loss = loss_and_grads(1);
    if ((t + 1) % 10 == 0) printf("step %3d  loss %.6f\n", t + 1, loss);
    args.step = t; /* steps applied so far; must agree with count */
    CHECK(lowbit_functional_step(ctx, params, NPARAMS, &args, NULL));
    int32_t skipped = -1;
    CHECK(lowbit_step_context_last_step_skipped(ctx, &skipped));
    if (skipped != 0) {
      fprintf(stderr, "step %d was skipped\n", t);
      return 1;
    }
  }
  const double loss1 = loss_and_grads(0);
  printf("final loss %.6f (from %.6f, %.1fx lower), count %d\n", loss1, loss0, loss0 / loss1, (int)count);

  uint64_t h = 0xCBF29CE484222325ull;
  h = fnv1a(h, W, sizeof W);
  h = fnv1a(h, B, sizeof B);
  for (int i = 0; i < NPARAMS; ++i) h = hash_state(h, &state[i]);
  printf("final-bits %016" PRIx64 "\n", h);

  int ok = 1;
  if (count != STEPS) {
    fprintf(stderr, "the count is %d after %d steps\n", (int)count, STEPS);
    ok = 0;
  }
  if (!(loss1 * 10.0 <= loss0)) {
    fprintf(stderr, "the loss went from %f to %f: not 10x lower\n", loss0, loss1);
    ok = 0;
  }
  CHECK(lowbit_step_context_destroy(ctx));
  for (int i = 0; i < NPARAMS; ++i) {
    for (int m = 0; m < 2; ++m) {
      free(state[i].moment[m]);
      free(state[i].scales[m]);
    }
    free(state[i].ecc);
  }
  return ok ? 0 : 1;
}
