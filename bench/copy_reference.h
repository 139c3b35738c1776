/* The copy bandwidth every CPU benchmark divides by, measured the way STREAM
 * counts it, in the benchmark's own run and with its thread count (each
 * thread working on its own contiguous slice; bytes read + bytes written, no
 * write-allocate traffic):
 *   copy    b[i] = a[i]            (doubles, 16 B per element)
 *   triad   a[i] = b[i] + s * c[i] (doubles, 24 B per element)
 *   memcpy  memcpy of each thread's slice (2 x bytes)
 *   update  a[i] = a[i] + s * b[i] (doubles, 24 B per element)
 * on arrays of max(4 x LLC, 128 MiB) each, pages touched first by the same
 * threads, one untimed pass, then the BEST of kCopyReps timed passes of each
 * kernel (STREAM's convention), the four kernels interleaved. The reference is
 * the MAXIMUM of the four rates, so a fraction of it never flatters: copy and
 * triad pay a write-allocate read of their destination that they are not
 * credited for, a large memcpy may use streaming stores that avoid it, and
 * `update` reads and writes the same array, as an optimizer step (params,
 * state) and the communicator's error feedback do: an in-place pass could
 * otherwise beat "100%" of a copy reference by up to 1.5x.
 * Header-only, for the C and C++ benchmarks (bench_cpu_step, bench_comm_pack). */
#ifndef LOWBIT_BENCH_COPY_REFERENCE_H
#define LOWBIT_BENCH_COPY_REFERENCE_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <omp.h>

#ifdef __cplusplus
#define LOWBIT_RESTRICT __restrict
#else
#define LOWBIT_RESTRICT restrict
#endif

enum { kCopyReps = 10 };

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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

LOWBIT_NO_MEMCPY_IDIOM static void copy_kernel(double* LOWBIT_RESTRICT b, const double* LOWBIT_RESTRICT a, int64_t n,
                                               int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) b[i] = a[i];
}

LOWBIT_NO_MEMCPY_IDIOM static void triad_kernel(double* LOWBIT_RESTRICT a, const double* LOWBIT_RESTRICT b,
                                                const double* LOWBIT_RESTRICT c, double s, int64_t n,
                                                int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

LOWBIT_NO_MEMCPY_IDIOM static void update_kernel(double* LOWBIT_RESTRICT a, const double* LOWBIT_RESTRICT b, double s,
                                                 int64_t n,
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
  double* a = (double*)malloc(r.array_bytes);
  double* b = (double*)malloc(r.array_bytes);
  double* c = (double*)malloc(r.array_bytes);
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

#endif
