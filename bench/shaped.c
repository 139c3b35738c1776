/* Issue 15 measurements (not a test): the second-moment undershoot of 4-bit
 * state against float64 AdamW, and the state bytes per parameter of the two
 * lpmm presets on a 4096 x 4096 matrix.
 *
 * Undershoot: 2-D params (512 x 384, p0 = 0, weight decay 0, lr 1e-3,
 * betas 0.9 / 0.999) see 50 steps of gradients spread over D = 1 and
 * D = 4 decades, in two profiles:
 *   rows/cols: g[r, c] = N(0, 1) * 10^(-D (r / R + c / C) / 2), a smooth
 *              row-and-column profile (a rank-1 magnitude);
 *   per element: g[r, c] = N(0, 1) * 10^(-D u[r, c]), u uniform in [0, 1)
 *              fixed per element (outliers anywhere);
 *   outlier columns: g[r, c] = N(0, 1) * 10^(-D r / (2R)) * (10^(D/2) on
 *              every 64th column) (the pattern rank-1 scales are made for).
 * Each format's mean |update|
 * per step is divided by that of float64 AdamW fed the same gradients, over
 * all elements and over the quarter with the smallest true second moment,
 * averaged over the 50 steps. 1.00 is exact; below 1 is the undershoot (a
 * second moment rounded up shrinks the step).
 *
 *   ./build/bench/bench_shaped */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowbit.h"

#define R 512
#define C 384
#define N (R * C)
#define STEPS 50

static uint64_t rng = 0x1234567u;
static double unif(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng >> 11) * 0x1p-53;
}
static double normal(void) {
  double u = unif() + 1e-300, v = unif();
  return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}
static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

enum { BLOCKS, LPMM, FACTOR, NKIND };
static const char* kNames[NKIND] = {"4-bit blocks (m, v: 128)", "4-bit rank-1 v (lpmm AdamW)", "4-bit Factor (v factored)"};

static lowbit_optimizer_t make(int kind, float* p, float* g) {
  lowbit_optimizer_config_t c;
  if (kind == BLOCKS) {
    lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_ADAMW);
    c.state_format = LOWBIT_STATE_4BIT;
  } else {
    lowbit_optimizer_config_preset(&c, kind == LPMM ? LOWBIT_PRESET_LPMM_ADAMW_4BIT : LOWBIT_PRESET_ADAMW_4BIT_FACTOR);
  }
  c.num_threads = 1;
  lowbit_hparams_t h;
  lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW);
  h.weight_decay = 0.f;
  lowbit_optimizer_t opt;
  if (lowbit_optimizer_create(&opt, &c, &h)) {
    fprintf(stderr, "%s\n", lowbit_last_error());
    exit(1);
  }
  lowbit_param_config_t pc;
  lowbit_param_config_init(&pc);
  pc.param = (lowbit_tensor_t){p, N, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  pc.grad = (lowbit_tensor_t){g, N, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  pc.ndim = 2;
  pc.shape[0] = R;
  pc.shape[1] = C;
  int64_t id;
  if (lowbit_optimizer_add_param(opt, &pc, &id)) {
    fprintf(stderr, "%s\n", lowbit_optimizer_last_error(opt));
    exit(1);
  }
  return opt;
}

int main(void) {
  static float g[N], p[NKIND][N], before[N];
  static double m[N], v[N], upd[N], vsort[N];
  printf("Undershoot vs float64 AdamW: mean |update| / float64's, averaged over %d steps, %d x %d params\n", STEPS, R, C);
  static double u[N];
  for (int i = 0; i < N; ++i) u[i] = unif();
  for (int profile = 0; profile < 3; ++profile) {
  printf("\n%s profile\n%-30s %14s %14s %14s %14s\n",
         profile == 2 ? "outlier-column" : profile ? "per-element" : "rows/cols", "format", "1 dec: all",
         "1 dec: small v", "4 dec: all", "4 dec: small v");
  double table[NKIND][4];
  for (int di = 0; di < 2; ++di) {
    const double D = di ? 4.0 : 1.0;
    lowbit_optimizer_t opt[NKIND];
    for (int k = 0; k < NKIND; ++k) {
      memset(p[k], 0, sizeof p[k]);
      opt[k] = make(k, p[k], g);
    }
    memset(m, 0, sizeof m), memset(v, 0, sizeof v);
    double sum_all[NKIND] = {0}, sum_small[NKIND] = {0};
    rng = 0x1234567u + (uint64_t)di;
    for (int t = 1; t <= STEPS; ++t) {
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c)
          g[r * C + c] = (float)(normal() * pow(10.0, profile == 2   ? -D * (double)r / (2.0 * R) + (c % 64 == 0 ? D / 2 : 0.0)
                                                      : profile == 1 ? -D * u[r * C + c]
                                                                     : -D * ((double)r / R + (double)c / C) / 2));
      /* float64 AdamW */
      const double b1 = 0.9, b2 = 0.999, lr = 1e-3, eps = 1e-8;
      for (int i = 0; i < N; ++i) {
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * (double)g[i] * g[i];
        upd[i] = fabs(lr / (1 - pow(b1, t)) * m[i] / (sqrt(v[i] / (1 - pow(b2, t))) + eps));
        vsort[i] = v[i];
      }
      qsort(vsort, N, sizeof(double), cmp);
      const double q25 = vsort[N / 4];
      double ref_all = 0, ref_small = 0;
      for (int i = 0; i < N; ++i) {
        ref_all += upd[i];
        if (v[i] <= q25) ref_small += upd[i];
      }
      for (int k = 0; k < NKIND; ++k) {
        memcpy(before, p[k], sizeof before);
        if (lowbit_optimizer_step(opt[k], NULL)) return fprintf(stderr, "%s\n", lowbit_optimizer_last_error(opt[k])), 1;
        double all = 0, small = 0;
        for (int i = 0; i < N; ++i) {
          const double d = fabs((double)p[k][i] - before[i]);
          all += d;
          if (v[i] <= q25) small += d;
        }
        sum_all[k] += all / ref_all;
        sum_small[k] += small / ref_small;
      }
    }
    for (int k = 0; k < NKIND; ++k) {
      table[k][2 * di] = sum_all[k] / STEPS;
      table[k][2 * di + 1] = sum_small[k] / STEPS;
      lowbit_optimizer_destroy(opt[k]);
    }
  }
  for (int k = 0; k < NKIND; ++k)
    printf("%-30s %14.3f %14.3f %14.3f %14.3f\n", kNames[k], table[k][0], table[k][1], table[k][2], table[k][3]);
  }

  printf("\nState bytes per parameter, 4096 x 4096 (lowbit_plan_param_state, bf16 params):\n");
  for (int k = 0; k < NKIND; ++k) {
    lowbit_optimizer_config_t c;
    if (k == BLOCKS) {
      lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_ADAMW);
      c.state_format = LOWBIT_STATE_4BIT;
    } else {
      lowbit_optimizer_config_preset(&c, k == LPMM ? LOWBIT_PRESET_LPMM_ADAMW_4BIT : LOWBIT_PRESET_ADAMW_4BIT_FACTOR);
    }
    lowbit_hparams_t h;
    lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW);
    lowbit_param_config_t pc;
    lowbit_param_config_init(&pc);
    pc.param = (lowbit_tensor_t){NULL, 4096 * 4096, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DEVICE_CPU, 0};
    pc.ndim = 2;
    pc.shape[0] = pc.shape[1] = 4096;
    lowbit_state_plan_t plan;
    plan.struct_size = sizeof plan;
    if (lowbit_plan_param_state(&c, &h, &pc, &plan)) return fprintf(stderr, "%s\n", lowbit_last_error()), 1;
    printf("  %-30s %.4f B/param (m %lld + %lld scales, v %lld + %lld scales)\n", kNames[k],
           (double)plan.state_bytes / (4096.0 * 4096.0), (long long)plan.data_bytes[0], (long long)plan.scale_count[0],
           (long long)plan.data_bytes[1], (long long)plan.scale_count[1]);
  }
  return 0;
}
