/*
 * train_softmax: trains a small real model through the lowbit C API.
 *
 * Data: three interleaved 2-D spirals (10,000 points, a fixed formula plus
 * Gaussian noise from a seeded generator), a classic non-linear
 * classification problem. Model: an MLP 2 -> 64 -> 64 -> 3 with tanh and a
 * softmax cross-entropy loss, forward and backward written out in plain C.
 * The same model (same initial weights, same batches) is trained with
 * AdamW (fp32 and 8-bit state), Lion (8-bit state) and Muon (fp32, 8-bit and
 * 4-bit momentum): Muon steps the weight matrices, registered with their
 * shapes, and an AdamW group of the same optimizer steps the biases (the
 * usual hybrid). The optimizer updates the weights in place from gradient
 * buffers registered once, so each training step is one
 * lowbit_optimizer_step().
 *
 * Plain C11, no dependency besides liblowbit and libm.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lowbit.h"

#define N_POINTS 10000
#define N_CLASSES 3
#define IN 2
#define H 64
#define BATCH 100
#define EPOCHS 12

#define CHECK(opt, call)                                                                                   \
  do {                                                                                                     \
    lowbit_status_t st_ = (call);                                                                          \
    if (st_ != LOWBIT_SUCCESS) {                                                                           \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call, lowbit_status_string(st_), \
              (opt) ? lowbit_optimizer_last_error(opt) : lowbit_last_error());                             \
      exit(1);                                                                                             \
    }                                                                                                      \
  } while (0)

/* ---------------------------------------------------------------- random */

static uint64_t rng_state;
static uint64_t rng_next(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double rng_uniform(void) { return (double)(rng_next() >> 11) * (1.0 / 9007199254740992.0); }
static double rng_normal(void) {
  double u1 = rng_uniform(), u2 = rng_uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---------------------------------------------------------------- data */

static float X[N_POINTS][IN];
static int Y[N_POINTS];

static void make_spirals(void) {
  rng_state = 12345;
  const int per_class = N_POINTS / N_CLASSES;
  for (int i = 0; i < N_POINTS; ++i) {
    int c = i % N_CLASSES;
    int k = i / N_CLASSES;
    double r = (double)(k + 1) / (double)(per_class + 1);        /* radius 0..1 */
    double t = c * (2.0 * 3.141592653589793 / N_CLASSES) + 6.0 * r + 0.2 * rng_normal(); /* angle */
    X[i][0] = (float)(r * sin(t));
    X[i][1] = (float)(r * cos(t));
    Y[i] = c;
  }
}

/* ---------------------------------------------------------------- model */

enum { W1, B1, W2, B2, W3, B3, NP };
static const int64_t SIZES[NP] = {H * IN, H, H * H, H, N_CLASSES * H, N_CLASSES};
static const char* NAMES[NP] = {"W1", "b1", "W2", "b2", "W3", "b3"};
static const int64_t ROWS[NP] = {H, 0, H, 0, N_CLASSES, 0}; /* matrices: rows x SIZES / rows; 0: a bias */

typedef struct {
  float* p[NP];
  float* g[NP];
} model_t;

static void model_init(model_t* m, uint64_t seed) {
  rng_state = seed;
  for (int i = 0; i < NP; ++i) {
    m->p[i] = calloc((size_t)SIZES[i], sizeof(float));
    m->g[i] = calloc((size_t)SIZES[i], sizeof(float));
    if (!m->p[i] || !m->g[i]) {
      fprintf(stderr, "out of memory\n");
      exit(1);
    }
  }
  const int fan_in[NP] = {IN, 0, H, 0, H, 0};
  for (int i = 0; i < NP; ++i) {
    if (!fan_in[i]) continue; /* biases start at 0 */
    double bound = sqrt(6.0 / fan_in[i]) * 0.8;
    for (int64_t j = 0; j < SIZES[i]; ++j) m->p[i][j] = (float)((2.0 * rng_uniform() - 1.0) * bound);
  }
}

static void model_copy(model_t* dst, const model_t* src) {
  for (int i = 0; i < NP; ++i) memcpy(dst->p[i], src->p[i], (size_t)SIZES[i] * sizeof(float));
}

static void model_free(model_t* m) {
  for (int i = 0; i < NP; ++i) {
    free(m->p[i]);
    free(m->g[i]);
  }
}

/* Forward (and backward when `train`) over samples idx[0..n); returns the
 * mean cross-entropy, adds gradients of the mean loss to m->g, counts hits. */
static double forward_backward(model_t* m, const int* idx, int n, int train, int* correct) {
  float h1[H], h2[H], logits[N_CLASSES], d2[H], d1[H];
  const float *w1 = m->p[W1], *b1 = m->p[B1], *w2 = m->p[W2], *b2 = m->p[B2], *w3 = m->p[W3], *b3 = m->p[B3];
  double loss = 0.0;
  const float inv_n = 1.0f / (float)n;
  for (int s = 0; s < n; ++s) {
    const float* x = X[idx[s]];
    const int y = Y[idx[s]];
    for (int j = 0; j < H; ++j) h1[j] = tanhf(b1[j] + w1[j * IN] * x[0] + w1[j * IN + 1] * x[1]);
    for (int j = 0; j < H; ++j) {
      float a = b2[j];
      for (int k = 0; k < H; ++k) a += w2[j * H + k] * h1[k];
      h2[j] = tanhf(a);
    }
    float mx = -INFINITY;
    for (int c = 0; c < N_CLASSES; ++c) {
      float a = b3[c];
      for (int k = 0; k < H; ++k) a += w3[c * H + k] * h2[k];
      logits[c] = a;
      if (a > mx) mx = a;
    }
    double z = 0.0;
    int arg = 0;
    for (int c = 0; c < N_CLASSES; ++c) {
      z += exp((double)(logits[c] - mx));
      if (logits[c] > logits[arg]) arg = c;
    }
    loss += log(z) - (double)(logits[y] - mx);
    if (correct) *correct += (arg == y);
    if (!train) continue;

    /* backward: dlogits = softmax - onehot, scaled by 1/n (mean loss) */
    float dl[N_CLASSES];
    for (int c = 0; c < N_CLASSES; ++c)
      dl[c] = ((float)(exp((double)(logits[c] - mx)) / z) - (c == y ? 1.0f : 0.0f)) * inv_n;
    for (int k = 0; k < H; ++k) d2[k] = 0.0f;
    for (int c = 0; c < N_CLASSES; ++c) {
      m->g[B3][c] += dl[c];
      for (int k = 0; k < H; ++k) {
        m->g[W3][c * H + k] += dl[c] * h2[k];
        d2[k] += dl[c] * w3[c * H + k];
      }
    }
    for (int j = 0; j < H; ++j) d2[j] *= 1.0f - h2[j] * h2[j];
    for (int k = 0; k < H; ++k) d1[k] = 0.0f;
    for (int j = 0; j < H; ++j) {
      m->g[B2][j] += d2[j];
      for (int k = 0; k < H; ++k) {
        m->g[W2][j * H + k] += d2[j] * h1[k];
        d1[k] += d2[j] * w2[j * H + k];
      }
    }
    for (int k = 0; k < H; ++k) {
      float d = d1[k] * (1.0f - h1[k] * h1[k]);
      m->g[B1][k] += d;
      m->g[W1][k * IN] += d * x[0];
      m->g[W1][k * IN + 1] += d * x[1];
    }
  }
  return loss / n;
}

static double now_s(void) {
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- training */

typedef struct {
  const char* name;
  lowbit_algorithm_t algorithm;
  lowbit_state_format_t state;
  float lr;
  float weight_decay;
  double final_loss, final_acc, seconds;
  int64_t state_bytes;
} run_t;

static void train(run_t* run, const model_t* init, int* all_idx) {
  model_t m;
  model_init(&m, 1); /* allocate; weights overwritten below */
  model_copy(&m, init);

  lowbit_optimizer_config_t cfg;
  lowbit_hparams_t hp;
  lowbit_optimizer_t opt = NULL;
  CHECK(NULL, lowbit_optimizer_config_init(&cfg, run->algorithm));
  cfg.state_format = run->state;
  CHECK(NULL, lowbit_hparams_init(&hp, run->algorithm));
  hp.lr = run->lr;
  hp.weight_decay = run->weight_decay;
  CHECK(NULL, lowbit_optimizer_create(&opt, &cfg, &hp));
  /* Muon: the biases go to an AdamW group of the same optimizer. */
  int32_t bias_group = 0;
  if (run->algorithm == LOWBIT_ALGORITHM_MUON) {
    lowbit_hparams_t adamw;
    CHECK(opt, lowbit_hparams_init(&adamw, LOWBIT_ALGORITHM_ADAMW));
    adamw.lr = 1e-2f;
    adamw.weight_decay = 1e-4f;
    CHECK(opt, lowbit_optimizer_add_group(opt, &adamw, &bias_group));
  }

  for (int i = 0; i < NP; ++i) {
    lowbit_param_config_t pc;
    int64_t id = -1;
    CHECK(opt, lowbit_param_config_init(&pc));
    if (run->algorithm == LOWBIT_ALGORITHM_MUON) {
      if (ROWS[i]) {
        pc.ndim = 2;
        pc.shape[0] = ROWS[i];
        pc.shape[1] = SIZES[i] / ROWS[i];
      } else {
        pc.group = bias_group;
      }
    }
    pc.param = (lowbit_tensor_t){m.p[i], SIZES[i], LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
    pc.grad = (lowbit_tensor_t){m.g[i], SIZES[i], LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
    CHECK(opt, lowbit_optimizer_add_param(opt, &pc, &id));
  }
  CHECK(opt, lowbit_optimizer_state_bytes(opt, -1, &run->state_bytes));

  static const char* fmt_names[] = {"default", "fp32", "bf16", "8-bit", "4-bit", "fp8", "4-bit-sr"};
  printf("\n%s (lr %g, weight decay %g): optimizer state per tensor:", run->name, (double)run->lr,
         (double)run->weight_decay);
  for (int i = 0; i < NP; ++i) {
    lowbit_param_info_t info;
    info.struct_size = sizeof info;
    CHECK(opt, lowbit_optimizer_param_info(opt, i, &info));
    printf(" %s %s", NAMES[i], fmt_names[info.state_format]);
  }
  printf("\n");

  int idx[N_POINTS];
  int correct = 0;
  double loss = forward_backward(&m, all_idx, N_POINTS, 0, &correct);
  printf("  epoch %2d  loss %.4f  accuracy %5.1f%%\n", 0, loss, 100.0 * correct / N_POINTS);

  rng_state = 777; /* the same batch order for every run */
  const double t0 = now_s();
  double opt_seconds = 0.0;
  for (int epoch = 1; epoch <= EPOCHS; ++epoch) {
    for (int i = 0; i < N_POINTS; ++i) idx[i] = i;
    for (int i = N_POINTS - 1; i > 0; --i) {
      int j = (int)(rng_next() % (uint64_t)(i + 1));
      int t = idx[i];
      idx[i] = idx[j];
      idx[j] = t;
    }
    for (int b = 0; b < N_POINTS; b += BATCH) {
      for (int i = 0; i < NP; ++i) memset(m.g[i], 0, (size_t)SIZES[i] * sizeof(float));
      forward_backward(&m, idx + b, BATCH, 1, NULL);
      const double s0 = now_s();
      CHECK(opt, lowbit_optimizer_step(opt, NULL));
      opt_seconds += now_s() - s0;
    }
    /* a simple schedule: cosine decay of the learning rate, set once per
     * epoch through lowbit_optimizer_set_lr (group 0) */
    const float lr = run->lr * 0.5f * (1.0f + cosf(3.14159265f * (float)epoch / (float)EPOCHS));
    CHECK(opt, lowbit_optimizer_set_lr(opt, 0, lr > 1e-6f * run->lr ? lr : 0.0f));
    correct = 0;
    loss = forward_backward(&m, all_idx, N_POINTS, 0, &correct);
    printf("  epoch %2d  loss %.4f  accuracy %5.1f%%\n", epoch, loss, 100.0 * correct / N_POINTS);
    fflush(stdout);
  }
  run->seconds = now_s() - t0;
  run->final_loss = loss;
  run->final_acc = 100.0 * correct / N_POINTS;
  const int steps = EPOCHS * (N_POINTS / BATCH);
  printf("  %d steps in %.2f s (optimizer step %.1f us)\n", steps, run->seconds, 1e6 * opt_seconds / steps);

  CHECK(opt, lowbit_optimizer_destroy(opt));
  model_free(&m);
}

int main(void) {
  const int v = lowbit_version();
  printf("lowbit %d.%d.%d: 3-class spirals, %d points, MLP %d-%d-%d-%d with tanh, batch %d, %d epochs\n",
         v / 10000, v / 100 % 100, v % 100, N_POINTS, IN, H, H, N_CLASSES, BATCH, EPOCHS);
  make_spirals();
  int64_t nparams = 0;
  for (int i = 0; i < NP; ++i) nparams += SIZES[i];

  model_t init;
  model_init(&init, 2024);
  static int all_idx[N_POINTS];
  for (int i = 0; i < N_POINTS; ++i) all_idx[i] = i;

  run_t runs[] = {
      {"AdamW, fp32 state", LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_FP32, 1e-2f, 1e-4f, 0, 0, 0, 0},
      {"AdamW, 8-bit state", LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_8BIT, 1e-2f, 1e-4f, 0, 0, 0, 0},
      {"Lion, 8-bit state", LOWBIT_ALGORITHM_LION, LOWBIT_STATE_8BIT, 1e-3f, 1e-3f, 0, 0, 0, 0},
      {"Muon, fp32 state", LOWBIT_ALGORITHM_MUON, LOWBIT_STATE_FP32, 2e-2f, 1e-4f, 0, 0, 0, 0},
      {"Muon, 8-bit state", LOWBIT_ALGORITHM_MUON, LOWBIT_STATE_8BIT, 2e-2f, 1e-4f, 0, 0, 0, 0},
      {"Muon, 4-bit state", LOWBIT_ALGORITHM_MUON, LOWBIT_STATE_4BIT, 2e-2f, 1e-4f, 0, 0, 0, 0},
  };
  const int nruns = (int)(sizeof runs / sizeof runs[0]);
  for (int r = 0; r < nruns; ++r) train(&runs[r], &init, all_idx);

  printf("\n%-20s %10s %9s %14s %12s\n", "optimizer", "final loss", "accuracy", "state bytes", "bytes/param");
  for (int r = 0; r < nruns; ++r)
    printf("%-20s %10.4f %8.1f%% %14lld %12.2f\n", runs[r].name, runs[r].final_loss, runs[r].final_acc,
           (long long)runs[r].state_bytes, (double)runs[r].state_bytes / (double)nparams);
  printf("(%lld parameters; tensors under 4096 elements keep fp32 state by default)\n", (long long)nparams);
  model_free(&init);

  /* the loss must have fallen for every run: a failed training is an error */
  for (int r = 0; r < nruns; ++r)
    if (!(runs[r].final_loss < 0.5)) {
      fprintf(stderr, "%s did not train (final loss %.4f)\n", runs[r].name, runs[r].final_loss);
      return 1;
    }
  return 0;
}
