/* CPU step benchmark: per algorithm x state format, ns/param and the fraction
 * of the machine's memcpy bandwidth the step achieves, where
 *   bytes a step must move = param (read + write) + grad (read)
 *                          + each moment's data and scales (read + write)
 *                          + error-correction bytes (read + write),
 * and memcpy bandwidth = 2 x bytes copied / time (read + write) with the same
 * number of threads, measured in the same run. Usage: bench_cpu_step [numel_millions] [threads]. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>

#include "lowbit.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return v[n / 2];
}

/* memcpy with the same threads as the step, each copying its own slice. */
static double memcpy_bandwidth(size_t bytes, int threads) {
  char* a = malloc(bytes);
  char* b = malloc(bytes);
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  double t[7];
  for (int i = 0; i < 7; ++i) {
    double t0 = now();
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
    {
      size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
      size_t lo = bytes * id / nt, hi = bytes * (id + 1) / nt;
      memcpy((i & 1 ? a : b) + lo, (i & 1 ? b : a) + lo, hi - lo);
    }
    t[i] = now() - t0;
  }
  free(a), free(b);
  return 2.0 * (double)bytes / median(t, 7);
}

static double moment_bytes(lowbit_state_format_t f) {
  switch (f) {
    case LOWBIT_STATE_FP32: return 4;
    case LOWBIT_STATE_BF16: return 2;
    case LOWBIT_STATE_8BIT:
    case LOWBIT_STATE_FP8: return 1 + 4.0 / 256;
    case LOWBIT_STATE_4BIT: return 0.5 + 4.0 / 128;
    default: return 0;
  }
}

int main(int argc, char** argv) {
  int64_t n = (int64_t)((argc > 1 ? atof(argv[1]) : 32.0) * 1e6);
  int threads = argc > 2 ? atoi(argv[2]) : 0;
  double bw = memcpy_bandwidth((size_t)n * 4, threads);
  printf("lowbit CPU step benchmark: %lld params in 16 tensors, threads %s, memcpy bandwidth %.2f GB/s\n",
         (long long)n, threads ? argv[2] : "all", bw / 1e9);
  printf("%-6s %-6s %-6s %-5s %10s %9s %10s %8s\n", "algo", "state", "param", "ecc", "ms/step", "ns/param", "bytes/par",
         "of bw");
  struct {
    lowbit_algorithm_t algo;
    const char* name;
    lowbit_state_format_t fmt;
    lowbit_dtype_t dtype;
    int ecc;
  } cases[] = {
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_FP32, LOWBIT_DTYPE_FLOAT32, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_BF16, LOWBIT_DTYPE_BFLOAT16, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_FLOAT32, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 1},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_4BIT, LOWBIT_DTYPE_BFLOAT16, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_FP8, LOWBIT_DTYPE_BFLOAT16, 0},
      {LOWBIT_ALGORITHM_LION, "lion", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0},
      {LOWBIT_ALGORITHM_SGD, "sgd", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0},
  };
  const char* fmt_names[] = {"", "fp32", "bf16", "8bit", "4bit", "fp8"};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
    lowbit_optimizer_config_t c;
    lowbit_hparams_t h;
    lowbit_optimizer_config_init(&c, cases[k].algo);
    lowbit_hparams_init(&h, cases[k].algo);
    if (cases[k].algo == LOWBIT_ALGORITHM_SGD) h.momentum = 0.9f;
    c.state_format = cases[k].fmt;
    c.error_correction = cases[k].ecc;
    c.num_threads = threads;
    c.skip_nonfinite = 0; /* the found-inf pre-pass is measured separately below */
    lowbit_optimizer_t opt;
    if (lowbit_optimizer_create(&opt, &c, &h)) return fprintf(stderr, "%s\n", lowbit_last_error()), 1;
    size_t es = cases[k].dtype == LOWBIT_DTYPE_FLOAT32 ? 4 : 2;
    char* p = malloc((size_t)n * es);
    char* g = malloc((size_t)n * es);
    for (int64_t i = 0; i < n; ++i) {
      if (es == 4) ((float*)p)[i] = 0.01f * (float)(i % 100), ((float*)g)[i] = 1e-3f * (float)(i % 37) - 0.018f;
      else ((uint16_t*)p)[i] = (uint16_t)(0x3C00 + i % 512), ((uint16_t*)g)[i] = (uint16_t)(0x3A00 + i % 512) ^ (uint16_t)((i & 1) << 15);
    }
    for (int t = 0; t < 16; ++t) {
      lowbit_param_config_t pc;
      lowbit_param_config_init(&pc);
      pc.param = (lowbit_tensor_t){p + (size_t)(t * (n / 16)) * es, n / 16, cases[k].dtype, LOWBIT_DEVICE_CPU, 0};
      pc.grad = (lowbit_tensor_t){g + (size_t)(t * (n / 16)) * es, n / 16, cases[k].dtype, LOWBIT_DEVICE_CPU, 0};
      int64_t id;
      if (lowbit_optimizer_add_param(opt, &pc, &id)) return fprintf(stderr, "%s\n", lowbit_optimizer_last_error(opt)), 1;
    }
    double times[9];
    lowbit_optimizer_step(opt, NULL);
    for (int r = 0; r < 9; ++r) {
      double t0 = now();
      lowbit_optimizer_step(opt, NULL);
      times[r] = now() - t0;
    }
    double ms = median(times, 9) * 1e3;
    int moments = cases[k].algo == LOWBIT_ALGORITHM_ADAMW ? 2 : 1;
    double bytes_per = 3.0 * (double)es + 2.0 * moments * moment_bytes(cases[k].fmt) + 2.0 * cases[k].ecc;
    double frac = bytes_per * (double)n / (ms * 1e-3) / bw;
    printf("%-6s %-6s %-6s %-5s %10.2f %9.3f %10.3f %7.1f%%\n", cases[k].name, fmt_names[cases[k].fmt],
           es == 4 ? "fp32" : "bf16", cases[k].ecc ? "yes" : "no", ms, ms * 1e6 / (double)n, bytes_per, 100 * frac);
    lowbit_optimizer_destroy(opt);
    free(p), free(g);
  }
  return 0;
}
