/* The 1-bit optimizers' CPU step by param dtype: 1-bit Adam, 0/1 Adam and
 * 1-bit LAMB over host tensors, fp32 params against bf16 and fp16 params
 * with stochastic rounding or error correction, same run.
 *
 *   mpiexec -n 1 ./bench_onebit_step [millions of params [steps [freeze_step]]]
 *   (default 16M params in 16 tensors, 12 steps, freeze_step 4)
 *
 * Each rank steps its own copy (grads differ per rank); a step includes the
 * communicator's exchange (at world size 1 its compression still runs).
 * Per optimizer and dtype: median ms of the warm-up steps (before
 * freeze_step: the uncompressed average and the full update) and of the
 * steps after it (the 1-bit phase; for 0/1 Adam a mix of variance, 1-bit,
 * synchronisation and local steps, as its schedule gives them), the slowest
 * rank's. The fp32 row is the reference the other dtypes' passes are held
 * to: a bf16 or fp16 param moves fewer bytes. Threads: OMP_NUM_THREADS per
 * rank. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lowbit_comm.h"

#define NT 16

static void die(const char* what, lowbit_optimizer_t o) {
  fprintf(stderr, "%s failed: %s\n", what, o ? lowbit_optimizer_last_error(o) : lowbit_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  if (n == 0) return 0.0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* bf16 / fp16 bits of values near 1 (params) or 2^-10 (grads), varied per element and seed. */
static void fill(void* out, lowbit_dtype_t d, int64_t n, int grad, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const float u = (float)(s >> 40) / 16777216.f - 0.5f; /* [-0.5, 0.5) */
    const float x = grad ? u * (1.f / 512.f) : 1.f + u;
    if (d == LOWBIT_DTYPE_FLOAT32) {
      ((float*)out)[i] = x;
    } else {
      uint32_t b;
      memcpy(&b, &x, 4);
      if (d == LOWBIT_DTYPE_BFLOAT16) {
        ((uint16_t*)out)[i] = (uint16_t)(b >> 16);
      } else { /* fp16 of |x| < 2: rebias the exponent, keep 10 mantissa bits */
        const uint32_t sign = (b >> 16) & 0x8000u, e = (b >> 23) & 0xFFu, m = (b >> 13) & 0x3FFu;
        ((uint16_t*)out)[i] = (uint16_t)(e < 113 ? sign : sign | ((e - 112u) << 10) | m);
      }
    }
  }
}

typedef struct {
  const char* name;
  lowbit_dtype_t dtype;
  int stochastic, ecc;
} kind_t;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int64_t numel = (int64_t)((argc > 1 ? atof(argv[1]) : 16.0) * 1e6) / NT * NT, per = numel / NT;
  const int steps = argc > 2 ? atoi(argv[2]) : 12, freeze = argc > 3 ? atoi(argv[3]) : 4;
  if (numel <= 0 || steps <= freeze || freeze < 1) {
    if (rank == 0) fprintf(stderr, "usage: %s [millions of params [steps [freeze_step (< steps)]]]\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  const lowbit_algorithm_t algos[3] = {LOWBIT_ALGORITHM_ONEBIT_ADAM, LOWBIT_ALGORITHM_ZEROONE_ADAM,
                                       LOWBIT_ALGORITHM_ONEBIT_LAMB};
  const char* algo_names[3] = {"1-bit Adam", "0/1 Adam", "1-bit LAMB"};
  enum { NK = 5 };
  const kind_t kinds[NK] = {{"fp32", LOWBIT_DTYPE_FLOAT32, 0, 0},
                            {"bf16 stochastic", LOWBIT_DTYPE_BFLOAT16, 1, 0},
                            {"bf16 error-corr.", LOWBIT_DTYPE_BFLOAT16, 0, 1},
                            {"fp16 stochastic", LOWBIT_DTYPE_FLOAT16, 1, 0},
                            {"fp16 error-corr.", LOWBIT_DTYPE_FLOAT16, 0, 1}};
  if (rank == 0)
    printf("%lld params in %d tensors, %d ranks, %d steps, freeze_step %d; median ms per step (slowest rank)\n",
           (long long)numel, NT, world, steps, freeze);
  if (rank == 0) printf("%-12s %-17s %10s %10s\n", "optimizer", "params", "warm-up", "1-bit");
  double* t = malloc(sizeof(double) * (size_t)steps);
  for (int a = 0; a < 3; ++a)
    for (int k = 0; k < NK; ++k) {
      const size_t bytes = (size_t)numel * (kinds[k].dtype == LOWBIT_DTYPE_FLOAT32 ? 4 : 2);
      char* param = malloc(bytes);
      char* grad = malloc(bytes);
      fill(param, kinds[k].dtype, numel, 0, 1);
      MPI_Comm mc = MPI_COMM_WORLD;
      lowbit_comm_t comm;
      if (lowbit_comm_create_mpi(&comm, &mc, NULL)) die("lowbit_comm_create_mpi", NULL);
      lowbit_optimizer_config_t c;
      lowbit_hparams_t h;
      lowbit_optimizer_config_init(&c, algos[a]);
      lowbit_hparams_init(&h, algos[a]);
      c.freeze_step = freeze;
      c.skip_nonfinite = 0;
      h.lr = 1e-3f;
      h.weight_decay = 0.01f;
      lowbit_optimizer_t opt;
      if (lowbit_optimizer_create(&opt, &c, &h)) die("lowbit_optimizer_create", NULL);
      if (lowbit_optimizer_set_comm(opt, comm)) die("lowbit_optimizer_set_comm", opt);
      const size_t eb = kinds[k].dtype == LOWBIT_DTYPE_FLOAT32 ? 4 : 2;
      for (int i = 0; i < NT; ++i) {
        lowbit_param_config_t pc;
        lowbit_param_config_init(&pc);
        pc.param = (lowbit_tensor_t){param + (size_t)i * per * eb, per, kinds[k].dtype, LOWBIT_DEVICE_CPU, 0};
        pc.grad = (lowbit_tensor_t){grad + (size_t)i * per * eb, per, kinds[k].dtype, LOWBIT_DEVICE_CPU, 0};
        pc.stochastic_rounding = kinds[k].stochastic;
        pc.error_correction = kinds[k].ecc;
        int64_t id;
        if (lowbit_optimizer_add_param(opt, &pc, &id)) die("lowbit_optimizer_add_param", opt);
      }
      for (int s = 0; s < steps; ++s) {
        fill(grad, kinds[k].dtype, numel, 1, 100u + (uint64_t)s * 7919u + (uint64_t)rank * 104729u);
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = now();
        if (lowbit_optimizer_step(opt, NULL)) die("lowbit_optimizer_step", opt);
        double d = now() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &d, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        t[s] = 1e3 * d;
      }
      /* Step 0 allocates the communicator's buffers: the warm-up median starts at step 1. */
      const double warm = median(t + 1, freeze - 1 > 0 ? freeze - 1 : 0), onebit = median(t + freeze, steps - freeze);
      if (rank == 0) printf("%-12s %-17s %10.2f %10.2f\n", algo_names[a], kinds[k].name, warm, onebit);
      lowbit_optimizer_destroy(opt);
      lowbit_comm_destroy(comm);
      free(param);
      free(grad);
    }
  free(t);
  MPI_Finalize();
  return 0;
}
