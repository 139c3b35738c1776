/* CPU step benchmark: per algorithm x state format, ms/step, ns/param and the
 * fraction of the machine's copy bandwidth the step achieves.
 *
 *   bytes a step must move = param (read + write) + grad (read)
 *                          + optimizer state (read + write: moment data,
 *                            scales, error-correction bytes; the library's
 *                            lowbit_optimizer_state_bytes)
 *
 * Copy reference: copy_reference.h (STREAM counting, the step's thread count,
 * the maximum of copy, triad, memcpy and an in-place update).
 *
 * The step time is the MEDIAN of 9 timed steps after one untimed step.
 *
 * Usage: bench_cpu_step [layout] [threads]
 *   layout   default     32M params in 16 tensors of 2M (default)
 *            many_small  2000 tensors of 4096 (issue 14's many-small layout)
 *            N           N million params in 16 tensors (a number)
 *   threads  0 = all OpenMP threads (default); the step and the copy
 *            reference use the same count. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <omp.h>

#include "copy_reference.h"
#include "lowbit.h"

enum { kStepReps = 9 };

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return v[n / 2];
}

typedef struct {
  const char* name;
  int num_tensors;
  int64_t tensor_numel;
} layout_t;

static int parse_layout(const char* arg, layout_t* out) {
  if (!arg || !strcmp(arg, "default")) {
    *out = (layout_t){"32M params in 16 tensors", 16, 2 * 1000 * 1000};
    return 0;
  }
  if (!strcmp(arg, "many_small")) {
    *out = (layout_t){"many_small: 2000 tensors of 4096", 2000, 4096};
    return 0;
  }
  char* end = NULL;
  double m = strtod(arg, &end);
  if (end == arg || *end || !(m > 0)) return -1;
  static char name[64];
  int64_t total = (int64_t)(m * 1e6);
  snprintf(name, sizeof name, "%lld params in 16 tensors", (long long)(total / 16 * 16));
  *out = (layout_t){name, 16, total / 16};
  return out->tensor_numel > 0 ? 0 : -1;
}

int main(int argc, char** argv) {
  layout_t layout;
  if (parse_layout(argc > 1 ? argv[1] : NULL, &layout)) {
    fprintf(stderr, "usage: %s [default | many_small | <millions of params in 16 tensors>] [threads]\n", argv[0]);
    return 2;
  }
  const int threads_arg = argc > 2 ? atoi(argv[2]) : 0;
  if (threads_arg < 0) return fprintf(stderr, "threads must be >= 0\n"), 2;
  const int threads = threads_arg > 0 ? threads_arg : omp_get_max_threads();
  const int64_t per = layout.tensor_numel, nt = layout.num_tensors, n = per * nt;

  copy_reference_t bw = copy_reference(threads);
  printf("lowbit CPU step benchmark: %s (%lld params), %d thread%s\n", layout.name, (long long)n, threads,
         threads == 1 ? "" : "s");
  printf("copy reference %.2f GB/s = max of copy %.2f, triad %.2f, memcpy %.2f, update %.2f GB/s (bytes read + "
         "written, best of %d, %zu MiB arrays)\n",
         bw.ref / 1e9, bw.copy / 1e9, bw.triad / 1e9, bw.memcpy_ / 1e9, bw.update / 1e9, kCopyReps,
         bw.array_bytes >> 20);
  FILE* la = fopen("/proc/loadavg", "r");
  double load1 = -1;
  if (la) {
    if (fscanf(la, "%lf", &load1) != 1) load1 = -1;
    fclose(la);
  }
  if (load1 >= 0) printf("load average (1 min) at start: %.2f (other work on the machine skews every number)\n", load1);
  printf("step: median of %d steps; skip_nonfinite 0 unless the 'chk' column says yes (+1 read of the grads)\n",
         kStepReps);
  printf("%-6s %-6s %-6s %-5s %-4s %10s %9s %10s %8s\n", "algo", "state", "param", "ecc", "chk", "ms/step",
         "ns/param", "bytes/par", "of bw");
  struct {
    lowbit_algorithm_t algo;
    const char* name;
    lowbit_state_format_t fmt;
    lowbit_dtype_t dtype;
    int ecc;
    int check;
    int preset; /* 0, or a lowbit_preset_t: tensors get a 2-D shape */
    lowbit_state_format_t fmt2; /* the second moment's format (DEFAULT: fmt) */
  } cases[] = {
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_FP32, LOWBIT_DTYPE_FLOAT32, 0, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_BF16, LOWBIT_DTYPE_BFLOAT16, 0, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 1},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_FLOAT32, 0, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 1, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_4BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_4BIT_SR, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0, LOWBIT_STATE_4BIT},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_4BIT_SR, LOWBIT_DTYPE_BFLOAT16, 0, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_4BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0, LOWBIT_STATE_4BIT_DYN},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_4BIT_SR, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0, LOWBIT_STATE_4BIT_DYN},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_FP8, LOWBIT_DTYPE_BFLOAT16, 0, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_4BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0, LOWBIT_PRESET_LPMM_ADAMW_4BIT},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_4BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0, LOWBIT_PRESET_ADAMW_4BIT_FACTOR},
      {LOWBIT_ALGORITHM_LION, "lion", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0},
      {LOWBIT_ALGORITHM_SGD, "sgd", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0},
      {LOWBIT_ALGORITHM_RMSPROP, "rmsp", LOWBIT_STATE_FP32, LOWBIT_DTYPE_FLOAT32, 0, 0},
      {LOWBIT_ALGORITHM_RMSPROP, "rmsp", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0},
      {LOWBIT_ALGORITHM_ADAGRAD, "adagr", LOWBIT_STATE_FP32, LOWBIT_DTYPE_FLOAT32, 0, 0},
      {LOWBIT_ALGORITHM_ADAGRAD, "adagr", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0},
      {LOWBIT_ALGORITHM_LAMB, "lamb", LOWBIT_STATE_FP32, LOWBIT_DTYPE_FLOAT32, 0, 0},
      {LOWBIT_ALGORITHM_LAMB, "lamb", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0},
  };
  const char* fmt_names[] = {"", "fp32", "bf16", "8bit", "4bit", "fp8", "4b-sr2"};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
    lowbit_optimizer_config_t c;
    lowbit_hparams_t h;
    lowbit_optimizer_config_init(&c, cases[k].algo);
    if (cases[k].preset) lowbit_optimizer_config_preset(&c, (lowbit_preset_t)cases[k].preset);
    lowbit_hparams_init(&h, cases[k].algo);
    if (cases[k].algo == LOWBIT_ALGORITHM_SGD) h.momentum = 0.9f;
    c.state_format = cases[k].fmt;
    c.second_state_format = cases[k].fmt2;  /* 4b-sr: m 4BIT_SR, v 4BIT; 4b-sr2: both 4BIT_SR; 4b-dyn / 4b-srd: m 4BIT /
                                               4BIT_SR, v 4BIT_DYN */
    c.error_correction = cases[k].ecc;
    c.num_threads = threads;
    c.skip_nonfinite = cases[k].check;
    lowbit_optimizer_t opt;
    if (lowbit_optimizer_create(&opt, &c, &h)) return fprintf(stderr, "%s\n", lowbit_last_error()), 1;
    const size_t es = cases[k].dtype == LOWBIT_DTYPE_FLOAT32 ? 4 : 2;
    char* p = malloc((size_t)n * es);
    char* g = malloc((size_t)n * es);
    if (!p || !g) return fprintf(stderr, "out of memory\n"), 1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) {
      if (es == 4) ((float*)p)[i] = 0.01f * (float)(i % 100), ((float*)g)[i] = 1e-3f * (float)(i % 37) - 0.018f;
      else ((uint16_t*)p)[i] = (uint16_t)(0x3C00 + i % 512), ((uint16_t*)g)[i] = (uint16_t)(0x3A00 + i % 512) ^ (uint16_t)((i & 1) << 15);
    }
    for (int64_t t = 0; t < nt; ++t) {
      lowbit_param_config_t pc;
      lowbit_param_config_init(&pc);
      pc.param = (lowbit_tensor_t){p + (size_t)(t * per) * es, per, cases[k].dtype, LOWBIT_DEVICE_CPU, 0};
      pc.grad = (lowbit_tensor_t){g + (size_t)(t * per) * es, per, cases[k].dtype, LOWBIT_DEVICE_CPU, 0};
      if (cases[k].preset) { /* rows x cols with rows the largest divisor <= sqrt(per) */
        int64_t rows = 1;
        for (int64_t d = 1; d * d <= per; ++d)
          if (per % d == 0) rows = d;
        pc.ndim = 2;
        pc.shape[0] = rows;
        pc.shape[1] = per / rows;
      }
      int64_t id;
      if (lowbit_optimizer_add_param(opt, &pc, &id)) return fprintf(stderr, "%s\n", lowbit_optimizer_last_error(opt)), 1;
    }
    int64_t state = 0;
    if (lowbit_optimizer_state_bytes(opt, -1, &state)) return fprintf(stderr, "%s\n", lowbit_optimizer_last_error(opt)), 1;
    double times[kStepReps];
    lowbit_optimizer_step(opt, NULL);
    for (int r = 0; r < kStepReps; ++r) {
      double t0 = now();
      lowbit_optimizer_step(opt, NULL);
      times[r] = now() - t0;
    }
    const double ms = median(times, kStepReps) * 1e3;
    /* the found-inf pre-pass reads the grads once more; shaped params' pass 1
     * reads them once more for rank-1 (rows only), with the rank-1 v's 4-bit
     * codes, and twice more for factored (rows, then column strips) */
    const double pass1 = cases[k].preset == LOWBIT_PRESET_LPMM_ADAMW_4BIT ? (double)es * (double)n + 0.5 * (double)n
                         : cases[k].preset                               ? 2.0 * (double)es * (double)n
                                                                         : 0.0;
    const double bytes = (3.0 + cases[k].check) * (double)es * (double)n + 2.0 * (double)state + pass1;
    const double frac = bytes / (ms * 1e-3) / bw.ref;
    printf("%-6s %-6s %-6s %-5s %-4s %10.2f %9.3f %10.3f %7.1f%%\n", cases[k].name,
           cases[k].preset == LOWBIT_PRESET_LPMM_ADAMW_4BIT ? "4b-r1"
           : cases[k].preset                               ? "4b-fac"
           : cases[k].fmt2 == LOWBIT_STATE_4BIT_DYN        ? (cases[k].fmt == LOWBIT_STATE_4BIT_SR ? "4b-srd" : "4b-dyn")
           : cases[k].fmt2                                 ? "4b-sr"
                                                           : fmt_names[cases[k].fmt],
           es == 4 ? "fp32" : "bf16", cases[k].ecc ? "yes" : "no", cases[k].check ? "yes" : "no", ms,
           ms * 1e6 / (double)n, bytes / (double)n, 100 * frac);
    lowbit_optimizer_destroy(opt);
    free(p), free(g);
  }
  return 0;
}
