/* Non-finite input: a NaN or an Inf on any one rank (each rank in turn; all
 * ranks at once; an Inf that only appears in tensor + worker error) makes
 * every rank return LOWBIT_ERROR_NONFINITE naming the first rank at fault,
 * with the tensor, the worker and server errors (compared byte for byte
 * through lowbit_comm_save_errors) and the counters unchanged, and
 * lowbit_comm_last_nonfinite() = 1. Nobody hangs (the test finishes), and the
 * next finite call works and matches the float64 simulation. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "comm_harness.h"

static unsigned char* save_blob(lowbit_comm_t comm, int64_t* size) {
  CHECK_OK(comm, lowbit_comm_save_errors(comm, NULL, 0, size, NULL));
  unsigned char* b = (unsigned char*)xmalloc((size_t)*size);
  int64_t got = 0;
  CHECK_OK(comm, lowbit_comm_save_errors(comm, b, *size, &got, NULL));
  CHECK(got == *size, "save_errors wrote %lld bytes, announced %lld", (long long)got, (long long)*size);
  return b;
}

static void expect_nonfinite(lowbit_comm_t comm, float* data, int64_t n, int bad_rank, const char* what,
                             const char* needle_override) {
  int64_t size0 = 0, size1 = 0;
  unsigned char* before = save_blob(comm, &size0);
  float* copy = (float*)xmalloc(sizeof(float) * (size_t)n);
  memcpy(copy, data, sizeof(float) * (size_t)n);
  lowbit_comm_stats_t s0, s1;
  s0.struct_size = s1.struct_size = sizeof s0;
  CHECK_OK(comm, lowbit_comm_get_stats(comm, &s0));

  lowbit_tensor_t t = host_tensor(data, n);
  char needle[64];
  snprintf(needle, sizeof needle, "%s", needle_override ? needle_override : "");
  if (!needle_override) snprintf(needle, sizeof needle, "of rank %d", bad_rank);
  CHECK_STATUS(comm, lowbit_comm_compressed_allreduce(comm, &t, NULL), LOWBIT_ERROR_NONFINITE, needle);

  CHECK(memcmp(copy, data, sizeof(float) * (size_t)n) == 0, "%s: the tensor was changed", what);
  unsigned char* after = save_blob(comm, &size1);
  CHECK(size0 == size1 && memcmp(before, after, (size_t)size0) == 0, "%s: the error buffers were changed", what);
  CHECK_OK(comm, lowbit_comm_get_stats(comm, &s1));
  if (!needle_override) {
    /* caught by the argument agreement: nothing was exchanged */
    CHECK(s1.compressed_calls == s0.compressed_calls && s1.compressed_bytes_sent == s0.compressed_bytes_sent,
          "%s: counters changed", what);
  } else {
    /* caught in band: the exchange happened and is counted */
    const sim_layout_t l = sim_layout(n, g_world);
    CHECK(s1.compressed_calls == s0.compressed_calls + 1 &&
              s1.compressed_bytes_sent - s0.compressed_bytes_sent == 2 * (int64_t)(g_world - 1) * (4 + l.chunk / 8),
          "%s: counters did not count the exchange", what);
  }
  int32_t nf = 0;
  CHECK_OK(comm, lowbit_comm_last_nonfinite(comm, &nf));
  CHECK(nf == 1, "%s: last_nonfinite is %d", what, nf);
  free(before);
  free(after);
  free(copy);
}

static void fill_rank(float* x, int64_t n, int rank, uint64_t tag) {
  fill_normal(x, n, harness_seed(), tag * 131 + (uint64_t)rank, 1.0);
}

int main(int argc, char** argv) {
  harness_init(&argc, &argv);
  const int W = g_world;
  const int64_t n = 1003;
  lowbit_comm_t comm = make_world_comm();
  float* x = (float*)xmalloc(sizeof(float) * (size_t)n);

  /* Some history, so the errors are not zero. */
  for (int k = 0; k < 2; ++k) {
    fill_rank(x, n, g_rank, 100 + (uint64_t)k);
    lowbit_tensor_t t = host_tensor(x, n);
    CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &t, NULL));
  }

  const float bad_values[3] = {NAN, INFINITY, -INFINITY};
  const char* bad_names[3] = {"NaN", "+Inf", "-Inf"};
  uint64_t st = mix64(harness_seed() ^ 77);
  for (int bad = 0; bad < W; ++bad) {
    for (int v = 0; v < 3; ++v) {
      fill_rank(x, n, g_rank, 200 + (uint64_t)(bad * 3 + v));
      const int64_t at = (int64_t)(uniform01(&st) * (double)n); /* same draw on every rank */
      if (g_rank == bad) x[at] = bad_values[v];
      char what[96];
      snprintf(what, sizeof what, "%s at element %lld of rank %d", bad_names[v], (long long)at, bad);
      expect_nonfinite(comm, x, n, bad, what, NULL);
    }
  }
  /* Every rank at once: the first rank is named. */
  fill_rank(x, n, g_rank, 300);
  x[n - 1] = NAN;
  expect_nonfinite(comm, x, n, 0, "NaN on every rank", NULL);

  /* Finite tensor whose sum with the worker error overflows: FLT_MAX on the
   * last rank leaves a worker error of about FLT_MAX (1 - 1/sqrt(n)) there,
   * and the same tensor again makes t + e = +Inf. */
  CHECK_OK(comm, lowbit_comm_reset_errors(comm, NULL));
  fill_rank(x, n, g_rank, 400);
  if (g_rank == W - 1) x[5] = FLT_MAX;
  lowbit_tensor_t t = host_tensor(x, n);
  CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &t, NULL));
  fill_rank(x, n, g_rank, 400);
  if (g_rank == W - 1) x[5] = FLT_MAX;
  expect_nonfinite(comm, x, n, W - 1, "tensor + worker error overflowing to +Inf", NULL);

  /* Overflow on the server side (the in-band path: a NaN scale travels with
   * the gathered bits): a server error of FLT_MAX (restored from a blob) plus
   * a positive average of about 1e35 is +Inf (the worker errors are small). */
  {
    CHECK_OK(comm, lowbit_comm_reset_errors(comm, NULL));
    fill_rank(x, n, g_rank, 450);
    t = host_tensor(x, n);
    CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &t, NULL));
    int64_t size = 0;
    unsigned char* blob = save_blob(comm, &size);
    int64_t wn = 0, sn = 0;
    CHECK_OK(comm, lowbit_comm_error_numel(comm, &wn, &sn));
    CHECK(sn > 0, "every rank serves some of 1003 elements");
    const float big = FLT_MAX;
    memcpy(blob + 64 + 4 * wn, &big, 4);
    error_blob_fix_checksum(blob, size);
    CHECK_OK(comm, lowbit_comm_load_errors(comm, blob, size, NULL));
    for (int64_t i = 0; i < n; ++i) x[i] = 1e35f;
    expect_nonfinite(comm, x, n, -1, "server average overflowing to +Inf", "server average overflowed");
    free(blob);
  }

  /* Recovery: from zero errors, the next call matches the simulation. */
  CHECK_OK(comm, lowbit_comm_reset_errors(comm, NULL));
  const sim_layout_t l = sim_layout(n, W);
  float** in = (float**)xmalloc(sizeof(float*) * (size_t)W);
  double** werr = (double**)xmalloc(sizeof(double*) * (size_t)W);
  double** serr = (double**)xmalloc(sizeof(double*) * (size_t)W);
  for (int j = 0; j < W; ++j) {
    in[j] = (float*)xmalloc(sizeof(float) * (size_t)n);
    fill_rank(in[j], n, j, 500);
    werr[j] = (double*)xmalloc(sizeof(double) * (size_t)n);
    serr[j] = (double*)xmalloc(sizeof(double) * (size_t)(l.chunk + 1));
    memset(werr[j], 0, sizeof(double) * (size_t)n);
    memset(serr[j], 0, sizeof(double) * (size_t)(l.chunk + 1));
  }
  memcpy(x, in[g_rank], sizeof(float) * (size_t)n);
  t = host_tensor(x, n);
  CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &t, NULL));
  int32_t nf = -1;
  CHECK_OK(comm, lowbit_comm_last_nonfinite(comm, &nf));
  CHECK(nf == 0, "last_nonfinite is %d after a finite call", nf);
  double* out = (double*)xmalloc(sizeof(double) * (size_t)n);
  unsigned char* amb = (unsigned char*)xmalloc((size_t)n);
  double* S = (double*)xmalloc(sizeof(double) * (size_t)W);
  sim_step(&l, in, werr, serr, out, amb, S, NULL);
  for (int64_t i = 0; i < n; ++i) {
    const double s = S[i / l.chunk];
    if (amb[i])
      CHECK(fabs(fabs((double)x[i]) - s) <= 1e-5 * s, "after recovery: ambiguous element %lld is %g", (long long)i,
            (double)x[i]);
    else
      CHECK(fabs((double)x[i] - out[i]) <= 1e-5 * s, "after recovery: element %lld is %.9g, simulation %.9g",
            (long long)i, (double)x[i], out[i]);
  }
  check_same_on_all_ranks(fnv64(x, sizeof(float) * (size_t)n), "the output after recovery");
  if (g_rank == 0) printf("NaN/+Inf/-Inf on each of %d ranks, on all ranks, and an overflow: all rejected cleanly\n", W);

  for (int j = 0; j < W; ++j) {
    free(in[j]);
    free(werr[j]);
    free(serr[j]);
  }
  free(in);
  free(werr);
  free(serr);
  free(out);
  free(amb);
  free(S);
  free(x);
  CHECK_OK(comm, lowbit_comm_destroy(comm));
  return harness_finish();
}
