/* The uncompressed allreduce_mean against the exact mean (float64 sum of
 * every rank's fp32 input, divided by W): |lib - exact| <= (W + 1) * 2^-24 *
 * mean_j |x_j| + the rounding of the result itself, on sizes 1, 7, 1000 and
 * 2^20 + 3; the result is bit-identical on every rank; NaN propagates (no
 * error, by design: the optimizer's own non-finite check sees it on every
 * rank); the counters grow by the nominal ring-allreduce bytes. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "comm_harness.h"

int main(int argc, char** argv) {
  harness_init(&argc, &argv);
  const int W = g_world;
  lowbit_comm_t comm = make_world_comm();
  const int64_t sizes[] = {1, 7, 1000, (1 << 20) + 3};
  for (int s = 0; s < 4; ++s) {
    const int64_t n = sizes[s];
    float* x = (float*)xmalloc(sizeof(float) * (size_t)n);
    float* other = (float*)xmalloc(sizeof(float) * (size_t)n);
    double* exact = (double*)xmalloc(sizeof(double) * (size_t)n);
    double* absmean = (double*)xmalloc(sizeof(double) * (size_t)n);
    memset(exact, 0, sizeof(double) * (size_t)n);
    memset(absmean, 0, sizeof(double) * (size_t)n);
    for (int j = 0; j < W; ++j) {
      fill_normal(other, n, harness_seed(), (uint64_t)s * 64 + (uint64_t)j, 1.0 + j);
      for (int64_t i = 0; i < n; ++i) {
        exact[i] += (double)other[i];
        absmean[i] += fabs((double)other[i]) / W;
      }
    }
    fill_normal(x, n, harness_seed(), (uint64_t)s * 64 + (uint64_t)g_rank, 1.0 + g_rank);
    lowbit_comm_stats_t s0, s1;
    s0.struct_size = s1.struct_size = sizeof s0;
    CHECK_OK(comm, lowbit_comm_get_stats(comm, &s0));
    lowbit_tensor_t t = host_tensor(x, n);
    CHECK_OK(comm, lowbit_comm_allreduce_mean(comm, &t, NULL));
    CHECK_OK(comm, lowbit_comm_get_stats(comm, &s1));
    CHECK(s1.mean_calls == s0.mean_calls + 1 && s1.mean_elements == s0.mean_elements + n &&
              s1.mean_bytes_sent - s0.mean_bytes_sent == 2 * (int64_t)(W - 1) * 4 * n / W,
          "mean counters");
    double worst = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double e = exact[i] / W;
      const double tol = (W + 1) * ldexp(1.0, -24) * absmean[i] + ldexp(1.0, -24) * fabs(e) + 1e-37;
      CHECK(fabs((double)x[i] - e) <= tol, "n %lld: element %lld is %.9g, exact mean %.9g", (long long)n, (long long)i,
            (double)x[i], e);
      if (absmean[i] > 0) worst = fmax(worst, fabs((double)x[i] - e) / absmean[i]);
    }
    check_same_on_all_ranks(fnv64(x, sizeof(float) * (size_t)n), "the mean");
    if (g_rank == 0) printf("  n %8lld: max |mean - exact| / mean|x| = %.3g\n", (long long)n, worst);
    free(x);
    free(other);
    free(exact);
    free(absmean);
  }
  /* NaN on the last rank propagates to every rank's element 2. */
  float y[5] = {1, 2, 3, 4, 5};
  if (g_rank == W - 1) y[2] = NAN;
  lowbit_tensor_t t = host_tensor(y, 5);
  CHECK_OK(comm, lowbit_comm_allreduce_mean(comm, &t, NULL));
  CHECK(isnan(y[2]) && y[0] == 1.0f && y[4] == 5.0f, "NaN did not propagate as expected (%g %g %g)", (double)y[0],
        (double)y[2], (double)y[4]);
  CHECK_OK(comm, lowbit_comm_destroy(comm));
  return harness_finish();
}
