/* One AdamW step configuration by process CPU time (robust where other work
 * shares the machine, unlike bench_cpu_step's wall-clock medians): fp32
 * params and grads in 16 tensors, the step run `steps` times after one
 * untimed step; prints CPU ms per step (summed over the step's threads).
 *
 * Usage: bench_cpu_step_cpu_time FORMAT [SECOND_FORMAT] [THREADS] [MILLIONS] [STEPS]
 *   FORMAT, SECOND_FORMAT  lowbit_state_format_t values (3 8BIT, 4 4BIT, 6 4BIT_SR,
 *                          7 4BIT_DYN; SECOND_FORMAT 0: the same as FORMAT)
 *   THREADS 1, MILLIONS 8, STEPS 30 by default.
 * LOWBIT_CPU_KERNELS picks the instruction-set level, as for every lowbit program. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "lowbit.h"

static double cpu_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char** argv) {
  if (argc < 2) return fprintf(stderr, "usage: %s FORMAT [SECOND_FORMAT] [THREADS] [MILLIONS] [STEPS]\n", argv[0]), 2;
  const int fmt = atoi(argv[1]), fmt2 = argc > 2 ? atoi(argv[2]) : 0, threads = argc > 3 ? atoi(argv[3]) : 1;
  const int64_t n = (argc > 4 ? atoll(argv[4]) : 8) * 1000000, nt = 16, per = n / nt;
  const int steps = argc > 5 ? atoi(argv[5]) : 30;
  lowbit_optimizer_config_t c;
  lowbit_hparams_t h;
  lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_ADAMW);
  lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW);
  c.state_format = (lowbit_state_format_t)fmt;
  c.second_state_format = (lowbit_state_format_t)fmt2;
  c.num_threads = threads;
  c.skip_nonfinite = 0;
  lowbit_optimizer_t opt;
  if (lowbit_optimizer_create(&opt, &c, &h)) return fprintf(stderr, "%s\n", lowbit_last_error()), 1;
  float* p = malloc((size_t)n * 4);
  float* g = malloc((size_t)n * 4);
  if (!p || !g) return fprintf(stderr, "out of memory\n"), 1;
  for (int64_t i = 0; i < n; ++i) p[i] = 0.01f * (float)(i % 100), g[i] = 1e-3f * (float)(i % 37) - 0.018f;
  for (int64_t t = 0; t < nt; ++t) {
    lowbit_param_config_t pc;
    lowbit_param_config_init(&pc);
    pc.param = (lowbit_tensor_t){p + t * per, per, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
    pc.grad = (lowbit_tensor_t){g + t * per, per, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
    int64_t id;
    if (lowbit_optimizer_add_param(opt, &pc, &id)) return fprintf(stderr, "%s\n", lowbit_optimizer_last_error(opt)), 1;
  }
  if (lowbit_optimizer_step(opt, NULL)) return fprintf(stderr, "%s\n", lowbit_optimizer_last_error(opt)), 1;
  const double t0 = cpu_seconds();
  for (int s = 0; s < steps; ++s) lowbit_optimizer_step(opt, NULL);
  printf("adamw state %d/%d, %lld fp32 params, %d thread(s): %.3f CPU ms/step\n", fmt, fmt2 ? fmt2 : fmt,
         (long long)n, threads, (cpu_seconds() - t0) * 1e3 / steps);
  lowbit_optimizer_destroy(opt);
  free(p), free(g);
  return 0;
}
