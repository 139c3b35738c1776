/* Error feedback: with a fixed input g_j on rank j, the running mean of the
 * compressed allreduce's outputs converges to the true mean gbar = mean_j g_j.
 *
 * The bound. Write c_j^t = s sign(x_j^t) for what rank j sends at call t and
 * o^t for the output. The update rules give, exactly (in real arithmetic),
 *   c_j^t = g_j + e_j^(t-1) - e_j^t          (worker)
 *   o^t   = mean_j c_j^t + z^(t-1) - z^t     (server, on every chunk)
 * so, summing over t = 1..T from zero errors,
 *   mean_T - gbar = (1/T) sum_t o^t - gbar = -(mean_j e_j^T + z^T) / T,
 * i.e. |mean_T - gbar|_inf <= (max_j |e_j^T|_inf + |z^T|_inf) / T <= B / T,
 * where B bounds the errors over the run. The errors of the scaled-sign
 * compressor stay bounded for a fixed input (they saturate once the scale
 * covers the largest |g_i|, so B grows like sqrt(n) max|g|: in float64
 * simulations of this test's inputs over 1..4 ranks, B / (sqrt(n) max|g|)
 * peaked at 0.86 for n = 1001 and 1.4 for n = 5, 4000 runs).
 *
 * The test runs T = 1024 calls and checks, at T = 16, 64, 256, 1024, with the
 * library's own errors of every rank:
 *  - the identity, to fp32 rounding: |(mean_T - gbar) + (mean_j e_j + z)/T|
 *    <= 32 eps32 (B + max|g|) (each call's rounding is O(eps32 * magnitude)
 *    and the average of T of them does not grow);
 *  - hence the bound |mean_T - gbar|_inf <= B/T + that slack, with
 *    B = sup_t max_j |e_j^t|_inf + sup_t |z^t|_inf (errors read every 16
 *    calls), and
 *  - B <= 4 sqrt(n) max|g| (the errors stay bounded, independently of T). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "comm_harness.h"

static void run(lowbit_comm_t comm, int64_t n, uint64_t tag) {
  int32_t crank = 0, W = 0;
  CHECK_OK(comm, lowbit_comm_rank(comm, &crank));
  CHECK_OK(comm, lowbit_comm_world_size(comm, &W));
  CHECK_OK(comm, lowbit_comm_reset_errors(comm, NULL));
  const sim_layout_t l = sim_layout(n, W);

  double* gbar = (double*)xmalloc(sizeof(double) * (size_t)n);
  float* g = (float*)xmalloc(sizeof(float) * (size_t)n);
  float* mine = (float*)xmalloc(sizeof(float) * (size_t)n);
  double* sum = (double*)xmalloc(sizeof(double) * (size_t)n);
  memset(gbar, 0, sizeof(double) * (size_t)n);
  memset(sum, 0, sizeof(double) * (size_t)n);
  double gmax = 0.0;
  for (int j = 0; j < W; ++j) {
    fill_normal(g, n, harness_seed(), tag * 7919 + (uint64_t)j, 1.0 + 0.5 * j);
    for (int64_t i = 0; i < n; ++i) {
      gbar[i] += (double)g[i] / W;
      if (fabs((double)g[i]) > gmax) gmax = fabs((double)g[i]);
    }
  }
  fill_normal(g, n, harness_seed(), tag * 7919 + (uint64_t)crank, 1.0 + 0.5 * crank);

  double** werr = (double**)xmalloc(sizeof(double*) * (size_t)W);
  double** serr = (double**)xmalloc(sizeof(double*) * (size_t)W);
  for (int j = 0; j < W; ++j) {
    werr[j] = (double*)xmalloc(sizeof(double) * (size_t)n);
    serr[j] = (double*)xmalloc(sizeof(double) * (size_t)(sim_real_in_chunk(&l, j) + 1));
  }
  double Bw = 0.0, Bz = 0.0, B = 0.0; /* sup of max_j |e_j|_inf, of |z|_inf, and their sum */
  const int T = 1024;
  for (int t = 1; t <= T; ++t) {
    memcpy(mine, g, sizeof(float) * (size_t)n);
    lowbit_tensor_t tt = host_tensor(mine, n);
    CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &tt, NULL));
    for (int64_t i = 0; i < n; ++i) sum[i] += mine[i];
    const int checkpoint = (t == 16 || t == 64 || t == 256 || t == 1024);
    if (t % 16 != 0 && !checkpoint) continue;
    gather_errors(comm, &l, werr, serr);
    for (int j = 0; j < W; ++j) {
      for (int64_t i = 0; i < n; ++i) Bw = fmax(Bw, fabs(werr[j][i]));
      for (int64_t i = 0; i < sim_real_in_chunk(&l, j); ++i) Bz = fmax(Bz, fabs(serr[j][i]));
    }
    B = Bw + Bz;
    if (!checkpoint) continue;
    const double slack = 32.0 * FLT_EPSILON * (B + gmax);
    double dev = 0.0, worst_identity = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const int r = (int)(i / l.chunk);
      double ebar = 0.0;
      for (int j = 0; j < W; ++j) ebar += werr[j][i] / W;
      const double z = serr[r][i - (int64_t)r * l.chunk];
      const double d = sum[i] / t - gbar[i];
      const double predicted = -(ebar + z) / t;
      worst_identity = fmax(worst_identity, fabs(d - predicted));
      dev = fmax(dev, fabs(d));
    }
    CHECK(worst_identity <= slack,
          "n %lld T %d: mean_T - gbar differs from -(mean_j e_j + z)/T by %.3g (> slack %.3g)", (long long)n, t,
          worst_identity, slack);
    CHECK(dev <= B / t + slack, "n %lld T %d: |mean_T - gbar| = %.4g exceeds B/T = %.4g", (long long)n, t, dev, B / t);
    CHECK(B <= 4.0 * sqrt((double)n) * gmax, "n %lld T %d: errors reached %.4g > 4 sqrt(n) max|g| = %.4g",
          (long long)n, t, B, 4.0 * sqrt((double)n) * gmax);
    if (g_rank == 0)
      printf("  n %5lld T %4d: |mean_T - gbar|_inf = %.3e  T*dev = %7.3f  B = %7.3f (B/(sqrt(n) max|g|) = %.3f)  "
             "identity residual %.2e\n",
             (long long)n, t, dev, dev * t, B, B / (sqrt((double)n) * gmax), worst_identity);
  }
  for (int j = 0; j < W; ++j) {
    free(werr[j]);
    free(serr[j]);
  }
  free(werr);
  free(serr);
  free(gbar);
  free(g);
  free(mine);
  free(sum);
}

int main(int argc, char** argv) {
  harness_init(&argc, &argv);
  lowbit_comm_t comm = make_world_comm();
  run(comm, 1001, 1);
  run(comm, 5, 2);
  CHECK_OK(comm, lowbit_comm_destroy(comm));
  return harness_finish();
}
