/* CPU step benchmark: per algorithm x state format, ms/step, ns/param and the
 * fraction of the machine's copy bandwidth the step achieves.
 *
 *   bytes a step must move = param (read + write) + grad (read)
 *                          + optimizer state (read + write: moment data,
 *                            scales, error-correction bytes; the library's
 *                            lowbit_optimizer_state_bytes)
 *
 * Copy reference (measured in the same run, same thread count as the step,
 * each thread working on its own contiguous slice, counted the way STREAM
 * counts: bytes read + bytes written, no write-allocate traffic):
 *   copy    b[i] = a[i]            (doubles, 16 B per element)
 *   triad   a[i] = b[i] + s * c[i] (doubles, 24 B per element)
 *   memcpy  memcpy of each thread's slice (2 x bytes)
 *   update  a[i] = a[i] + s * b[i] (doubles, 24 B per element)
 * on arrays of max(4 x LLC, 128 MiB) each, pages touched first by the same
 * threads, one untimed pass, then the BEST of 10 timed passes of each kernel
 * (STREAM's convention), the four kernels interleaved. The reference is the
 * MAXIMUM of the four rates, so the fraction never flatters the step: copy
 * and triad pay a write-allocate read of their destination that they are not
 * credited for, a large memcpy may use streaming stores that avoid it, and
 * `update` reads and writes the same array, as an optimizer step does with
 * its params and state (no write-allocate either): an in-place step could
 * otherwise beat "100%" of a copy reference by up to 1.5x.
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

#include "lowbit.h"

enum { kStepReps = 9, kCopyReps = 10 };

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

static double best(const double* v, int n) {
  double m = v[0];
  for (int i = 1; i < n; ++i) m = v[i] < m ? v[i] : m;
  return m;
}

/* Last-level cache size in bytes: sysfs first (glibc's sysconf derives it
 * from cpuid, which a VM may misreport), then sysconf, else 32 MiB. */
static size_t llc_bytes(void) {
  size_t largest = 0;
  for (int idx = 0; idx < 8; ++idx) {
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
    FILE* f = fopen(path, "r");
    if (!f) continue;
    unsigned long kb = 0;
    char unit = 'K';
    int got = fscanf(f, "%lu%c", &kb, &unit);
    fclose(f);
    size_t b = got >= 1 ? (size_t)kb * (unit == 'M' ? 1024 * 1024 : 1024) : 0;
    largest = b > largest ? b : largest;
  }
  if (largest) return largest;
  long v = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
  v = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  return v > 0 ? (size_t)v : (size_t)32 << 20;
}

/* The copy and triad loops must stay loops of loads and stores: keep the
 * compiler from turning the copy into a memcpy call (measured separately). */
#if defined(__clang__)
#define LOWBIT_NO_MEMCPY_IDIOM __attribute__((no_builtin("memcpy")))
#elif defined(__GNUC__)
#define LOWBIT_NO_MEMCPY_IDIOM __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define LOWBIT_NO_MEMCPY_IDIOM
#endif

typedef struct {
  double copy, triad, memcpy_, update, ref; /* bytes per second */
  size_t array_bytes;
} copy_reference_t;

LOWBIT_NO_MEMCPY_IDIOM static void copy_kernel(double* restrict b, const double* restrict a, int64_t n, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) b[i] = a[i];
}

LOWBIT_NO_MEMCPY_IDIOM static void triad_kernel(double* restrict a, const double* restrict b,
                                                const double* restrict c, double s, int64_t n, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

LOWBIT_NO_MEMCPY_IDIOM static void update_kernel(double* restrict a, const double* restrict b, double s, int64_t n,
                                                 int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) a[i] = a[i] + s * b[i];
}

static void memcpy_kernel(char* b, const char* a, size_t bytes, int threads) {
#pragma omp parallel num_threads(threads)
  {
    /* the slices of schedule(static) above: contiguous, one per thread */
    size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
    size_t lo = bytes / 8 * id / nt * 8, hi = id + 1 == nt ? bytes : bytes / 8 * (id + 1) / nt * 8;
    memcpy(b + lo, a + lo, hi - lo);
  }
}

static copy_reference_t copy_reference(int threads) {
  copy_reference_t r;
  size_t bytes = 4 * llc_bytes();
  if (bytes < ((size_t)128 << 20)) bytes = (size_t)128 << 20;
  const int64_t n = (int64_t)(bytes / sizeof(double));
  r.array_bytes = (size_t)n * sizeof(double);
  double* a = malloc(r.array_bytes);
  double* b = malloc(r.array_bytes);
  double* c = malloc(r.array_bytes);
  if (!a || !b || !c) {
    fprintf(stderr, "copy reference: out of memory\n");
    exit(1);
  }
  /* first touch by the threads that will use each page */
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) a[i] = 1.0, b[i] = 2.0, c[i] = 0.5;
  double tc[kCopyReps], tt[kCopyReps], tm[kCopyReps], tu[kCopyReps];
  copy_kernel(b, a, n, threads); /* untimed passes */
  triad_kernel(a, b, c, 3.0, n, threads);
  memcpy_kernel((char*)b, (const char*)a, r.array_bytes, threads);
  update_kernel(b, c, 1e-3, n, threads);
  for (int k = 0; k < kCopyReps; ++k) { /* interleaved, so drifts hit all four alike */
    double t0 = now();
    copy_kernel(b, a, n, threads);
    double t1 = now();
    triad_kernel(a, b, c, 3.0, n, threads);
    double t2 = now();
    memcpy_kernel((char*)c, (const char*)b, r.array_bytes, threads);
    double t3 = now();
    update_kernel(b, c, 1e-3, n, threads);
    double t4 = now();
    tc[k] = t1 - t0, tt[k] = t2 - t1, tm[k] = t3 - t2, tu[k] = t4 - t3;
  }
  volatile double sink = a[n / 3] + b[n / 2] + c[n - 1];
  (void)sink;
  free(a), free(b), free(c);
  r.copy = 2.0 * (double)r.array_bytes / best(tc, kCopyReps);
  r.triad = 3.0 * (double)r.array_bytes / best(tt, kCopyReps);
  r.memcpy_ = 2.0 * (double)r.array_bytes / best(tm, kCopyReps);
  r.update = 3.0 * (double)r.array_bytes / best(tu, kCopyReps);
  r.ref = r.copy > r.triad ? r.copy : r.triad;
  r.ref = r.ref > r.memcpy_ ? r.ref : r.memcpy_;
  r.ref = r.ref > r.update ? r.ref : r.update;
  return r;
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
  } cases[] = {
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_FP32, LOWBIT_DTYPE_FLOAT32, 0, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_BF16, LOWBIT_DTYPE_BFLOAT16, 0, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 1},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_FLOAT32, 0, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 1, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_4BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0},
      {LOWBIT_ALGORITHM_ADAMW, "adamw", LOWBIT_STATE_FP8, LOWBIT_DTYPE_BFLOAT16, 0, 0},
      {LOWBIT_ALGORITHM_LION, "lion", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0},
      {LOWBIT_ALGORITHM_SGD, "sgd", LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0},
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
    /* the found-inf pre-pass reads the grads once more */
    const double bytes = (3.0 + cases[k].check) * (double)es * (double)n + 2.0 * (double)state;
    const double frac = bytes / (ms * 1e-3) / bw.ref;
    printf("%-6s %-6s %-6s %-5s %-4s %10.2f %9.3f %10.3f %7.1f%%\n", cases[k].name, fmt_names[cases[k].fmt],
           es == 4 ? "fp32" : "bf16", cases[k].ecc ? "yes" : "no", cases[k].check ? "yes" : "no", ms,
           ms * 1e6 / (double)n, bytes / (double)n, 100 * frac);
    lowbit_optimizer_destroy(opt);
    free(p), free(g);
  }
  return 0;
}
