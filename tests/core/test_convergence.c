/* Convergence on a real small problem: a 2-layer MLP (32 -> 64 -> 8, tanh)
 * classifying a generated Gaussian-mixture data set with 20% label noise (so
 * the loss has a floor to converge to), trained with AdamW for 600
 * mini-batch steps with a cosine learning-rate schedule. 8-bit, 4-bit and FP8 state must end within 2% of the
 * fp32-state run's final loss (all runs see the same batches and init). Issue 15: the two lpmm presets
 * (the weight matrices registered with their 2-D shapes) as well, and the rank-1 v no farther from
 * fp32's final loss than the 4-bit block v (plus 0.5%). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowbit.h"

#define IN 32
#define HID 64
#define OUT 8
#define N 4096
#define BATCH 128
#define STEPS 600

#define CHECK(c, ...)                                              \
  do {                                                             \
    if (!(c)) {                                                    \
      fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);              \
      fprintf(stderr, __VA_ARGS__);                                \
      fprintf(stderr, "\n");                                       \
      exit(1);                                                     \
    }                                                              \
  } while (0)

static float X[N][IN];
static int Y[N];

static unsigned lcg(unsigned* s) { return *s = *s * 1664525u + 1013904223u; }
static float unif(unsigned* s) { return (lcg(s) >> 8) / 16777216.0f; }
static float gauss(unsigned* s) {
  float u = unif(s) + 1e-7f, v = unif(s);
  return sqrtf(-2.f * logf(u)) * cosf(6.2831853f * v);
}

static void make_data(void) {
  unsigned s = 12345;
  float centers[OUT][IN];
  for (int c = 0; c < OUT; ++c)
    for (int i = 0; i < IN; ++i) centers[c][i] = gauss(&s) * 0.6f;
  for (int n = 0; n < N; ++n) {
    Y[n] = (int)(lcg(&s) % OUT);
    for (int i = 0; i < IN; ++i) X[n][i] = centers[Y[n]][i] + gauss(&s);
    if (lcg(&s) % 5 == 0) Y[n] = (int)(lcg(&s) % OUT);
  }
}

typedef struct {
  float w1[IN * HID], b1[HID], w2[HID * OUT], b2[OUT];
  float g1[IN * HID], gb1[HID], g2[HID * OUT], gb2[OUT];
} Model;

/* Mean cross-entropy over samples idx[0..count); gradients if g != 0. */
static double forward_backward(Model* m, const int* idx, int count, int grads) {
  double loss = 0;
  if (grads) memset(m->g1, 0, sizeof m->g1), memset(m->gb1, 0, sizeof m->gb1), memset(m->g2, 0, sizeof m->g2),
      memset(m->gb2, 0, sizeof m->gb2);
  for (int k = 0; k < count; ++k) {
    const float* x = X[idx[k]];
    float h[HID], z[OUT], mx = -1e30f, sum = 0.f;
    for (int j = 0; j < HID; ++j) {
      float a = m->b1[j];
      for (int i = 0; i < IN; ++i) a += x[i] * m->w1[i * HID + j];
      h[j] = tanhf(a);
    }
    for (int c = 0; c < OUT; ++c) {
      z[c] = m->b2[c];
      for (int j = 0; j < HID; ++j) z[c] += h[j] * m->w2[j * OUT + c];
      mx = z[c] > mx ? z[c] : mx;
    }
    for (int c = 0; c < OUT; ++c) sum += (z[c] = expf(z[c] - mx));
    loss -= log(z[Y[idx[k]]] / sum);
    if (!grads) continue;
    float dz[OUT], dh[HID];
    for (int c = 0; c < OUT; ++c) dz[c] = (z[c] / sum - (c == Y[idx[k]])) / count;
    for (int j = 0; j < HID; ++j) {
      dh[j] = 0.f;
      for (int c = 0; c < OUT; ++c) {
        m->g2[j * OUT + c] += h[j] * dz[c];
        dh[j] += m->w2[j * OUT + c] * dz[c];
      }
      dh[j] *= 1.f - h[j] * h[j];
      m->gb1[j] += dh[j];
      for (int i = 0; i < IN; ++i) m->g1[i * HID + j] += x[i] * dh[j];
    }
    for (int c = 0; c < OUT; ++c) m->gb2[c] += dz[c];
  }
  return loss / count;
}

static void add(lowbit_optimizer_t opt, float* p, float* g, int64_t n, int64_t rows) {
  lowbit_param_config_t pc;
  lowbit_param_config_init(&pc);
  if (rows > 1) { /* a weight matrix: its shape (rows, n / rows) */
    pc.ndim = 2;
    pc.shape[0] = rows;
    pc.shape[1] = n / rows;
  }
  pc.param = (lowbit_tensor_t){p, n, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  pc.grad = (lowbit_tensor_t){g, n, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  int64_t id;
  CHECK(lowbit_optimizer_add_param(opt, &pc, &id) == LOWBIT_SUCCESS, "%s", lowbit_optimizer_last_error(opt));
}

static double train(lowbit_state_format_t fmt, int preset, double* state_bytes_per_param) {
  static Model m;
  unsigned s = 99;
  for (int i = 0; i < IN * HID; ++i) m.w1[i] = gauss(&s) / sqrtf(IN);
  for (int i = 0; i < HID * OUT; ++i) m.w2[i] = gauss(&s) / sqrtf(HID);
  memset(m.b1, 0, sizeof m.b1), memset(m.b2, 0, sizeof m.b2);
  lowbit_optimizer_config_t c;
  lowbit_hparams_t h;
  lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_ADAMW);
  lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW);
  c.state_format = fmt;
  if (preset) lowbit_optimizer_config_preset(&c, (lowbit_preset_t)preset);
  c.min_quantized_numel = 512; /* quantize both weight matrices (2048 and 512 elements) */
  h.lr = 3e-3f;
  lowbit_optimizer_t opt;
  CHECK(lowbit_optimizer_create(&opt, &c, &h) == LOWBIT_SUCCESS, "%s", lowbit_last_error());
  add(opt, m.w1, m.g1, IN * HID, IN);
  add(opt, m.b1, m.gb1, HID, 1);
  add(opt, m.w2, m.g2, HID * OUT, HID);
  add(opt, m.b2, m.gb2, OUT, 1);
  int idx[BATCH];
  unsigned bs = 7;
  for (int t = 0; t < STEPS; ++t) {
    for (int k = 0; k < BATCH; ++k) idx[k] = (int)(lcg(&bs) % N);
    /* Cosine schedule to zero, so every run ends settled rather than mid-descent. */
    CHECK(lowbit_optimizer_set_lr(opt, 0, 3e-3f * 0.5f * (1.f + cosf(3.14159265f * t / STEPS))) == LOWBIT_SUCCESS,
          "%s", lowbit_optimizer_last_error(opt));
    forward_backward(&m, idx, BATCH, 1);
    CHECK(lowbit_optimizer_step(opt, NULL) == LOWBIT_SUCCESS, "%s", lowbit_optimizer_last_error(opt));
  }
  int64_t bytes;
  lowbit_optimizer_state_bytes(opt, -1, &bytes);
  *state_bytes_per_param = (double)bytes / (IN * HID + HID + HID * OUT + OUT);
  lowbit_optimizer_destroy(opt);
  static int all[N];
  for (int n = 0; n < N; ++n) all[n] = n;
  return forward_backward(&m, all, N, 0);
}

int main(void) {
  make_data();
  const lowbit_state_format_t fmts[] = {LOWBIT_STATE_FP32, LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT, LOWBIT_STATE_FP8,
                                        LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT};
  const int presets[] = {0, 0, 0, 0, LOWBIT_PRESET_LPMM_ADAMW_4BIT, LOWBIT_PRESET_ADAMW_4BIT_FACTOR};
  const char* names[] = {"fp32", "8bit", "4bit", "fp8", "4bit rank-1 v (lpmm)", "4bit Factor"};
  double base = 0, loss4 = 0;
  for (int f = 0; f < 6; ++f) {
    double bpp, loss = train(fmts[f], presets[f], &bpp);
    if (f == 0) base = loss;
    if (f == 2) loss4 = loss;
    printf("AdamW %-20s state: final loss %.5f (%+.2f%% vs fp32), %.3f state bytes/param\n", names[f], loss,
           100 * (loss - base) / base, bpp);
    CHECK(loss <= base * 1.02, "%s final loss %.5f is not within 2%% of fp32's %.5f", names[f], loss, base);
    /* "Not worse than the 4-bit block v" as a distance to fp32 AdamW: here the 4-bit block run ends
     * below fp32's loss (its rounded-up small second moments change the trajectory), so the raw loss
     * would reward the bias this format removes. */
    if (presets[f] == LOWBIT_PRESET_LPMM_ADAMW_4BIT)
      CHECK(fabs(loss - base) <= fabs(loss4 - base) + 0.005 * base,
            "rank-1 v final loss %.5f is farther from fp32's %.5f than the 4-bit block v's %.5f", loss, base, loss4);
  }
  CHECK(base < 0.7 * log(OUT), "the fp32 run did not train (loss %.4f)", base);
  return 0;
}
