/* One compressed allreduce against the float64 simulation (comm_harness.h),
 * over MPI_COMM_WORLD and over a communicator with the ranks in reverse order
 * (created from its Fortran handle), each run three ways (comm_transports.h):
 * the built-in MPI call, the codec stages with the messages moved by
 * MPI_Alltoall / MPI_Allgather, and a callback transport; for odd sizes, sizes below the world
 * size and the padding boundaries 8W-1, 8W, 8W+1. Each size runs a few calls
 * in a row; before each, the simulation takes the library's errors of every
 * rank, so each call is checked on its own, the error updates included.
 *
 * Per call:
 *  - the output equals the simulation within 1e-5 of the chunk's scale; on
 *    "ambiguous" elements (|y| within the fp32 error of 0) it must be
 *    +-S_r;
 *  - the output is bit-identical on every rank;
 *  - the worker and server errors equal the simulation's (same tolerances);
 *  - nothing past numel is written (guard values);
 *  - the bytes counter grows by exactly 2 (W-1) (4 + C/8);
 *  - lowbit_comm_get_info reports the padding N = ceil(n / 8W) 8W. */
#include <math.h>
#include <string.h>

#include "comm_harness.h"
#include "comm_transports.h"

static int64_t g_ambiguous = 0, g_checked = 0;
/* How run_case calls the allreduce, and the MPI communicator the stages use. */
static via_t g_via = VIA_BUILTIN;
static MPI_Comm g_mpi;

static void run_case(lowbit_comm_t comm, int64_t n, int calls, uint64_t tag) {
  int32_t crank = 0, W = 0;
  CHECK_OK(comm, lowbit_comm_rank(comm, &crank));
  CHECK_OK(comm, lowbit_comm_world_size(comm, &W));
  const sim_layout_t l = sim_layout(n, W);
  CHECK_OK(comm, lowbit_comm_reset_errors(comm, NULL));

  float** in = (float**)xmalloc(sizeof(float*) * (size_t)W);
  double** werr = (double**)xmalloc(sizeof(double*) * (size_t)W);
  double** serr = (double**)xmalloc(sizeof(double*) * (size_t)W);
  for (int j = 0; j < W; ++j) {
    in[j] = (float*)xmalloc(sizeof(float) * (size_t)n);
    werr[j] = (double*)xmalloc(sizeof(double) * (size_t)n);
    serr[j] = (double*)xmalloc(sizeof(double) * (size_t)(sim_real_in_chunk(&l, j) + 1));
    memset(werr[j], 0, sizeof(double) * (size_t)n);
    memset(serr[j], 0, sizeof(double) * (size_t)(sim_real_in_chunk(&l, j) + 1));
  }
  const int64_t guard = 16;
  float* mine = (float*)xmalloc(sizeof(float) * (size_t)(n + guard));
  double* out = (double*)xmalloc(sizeof(double) * (size_t)n);
  unsigned char* amb = (unsigned char*)xmalloc((size_t)n);
  double* S = (double*)xmalloc(sizeof(double) * (size_t)W);
  double* s = (double*)xmalloc(sizeof(double) * (size_t)W);
  const int64_t my_c = sim_real_in_chunk(&l, crank);
  float* lib_w = (float*)xmalloc(sizeof(float) * (size_t)n);
  float* lib_s = (float*)xmalloc(sizeof(float) * (size_t)(my_c + 1));
  double* old_w = (double*)xmalloc(sizeof(double) * (size_t)n);

  for (int k = 0; k < calls; ++k) {
    for (int j = 0; j < W; ++j) {
      fill_normal(in[j], n, harness_seed(), tag * 1000003ull + (uint64_t)k * 64 + (uint64_t)j, 1.0 + 0.5 * j);
      /* exact zeros of both signs (sign(0) = +1) */
      if (n > 3) {
        in[j][n / 3] = 0.0f;
        in[j][n / 2] = -0.0f;
      }
    }
    if (k == 0) {
      /* after a reset, before binding: no errors */
      int64_t wn = -1, sn = -1;
      CHECK_OK(comm, lowbit_comm_error_numel(comm, &wn, &sn));
      CHECK(wn == 0 && sn == 0, "unbound communicator reports error numel %lld/%lld", (long long)wn, (long long)sn);
    } else {
      gather_errors(comm, &l, werr, serr);
    }
    for (int64_t i = 0; i < n; ++i) old_w[i] = werr[crank][i];
    memcpy(mine, in[crank], sizeof(float) * (size_t)n);
    for (int64_t g = 0; g < guard; ++g) mine[n + g] = 12345.0f + (float)g;

    lowbit_comm_stats_t st0, st1;
    st0.struct_size = st1.struct_size = sizeof(lowbit_comm_stats_t);
    CHECK_OK(comm, lowbit_comm_get_stats(comm, &st0));
    lowbit_tensor_t t = host_tensor(mine, n);
    CHECK_OK(comm, via_allreduce(g_via, comm, g_mpi, &t));
    CHECK_OK(comm, lowbit_comm_get_stats(comm, &st1));
    const int64_t msg = 4 + l.chunk / 8;
    CHECK(st1.compressed_calls == st0.compressed_calls + 1, "compressed_calls did not grow by 1");
    CHECK(st1.compressed_elements == st0.compressed_elements + n, "compressed_elements did not grow by n");
    CHECK(st1.compressed_bytes_sent - st0.compressed_bytes_sent == 2 * (int64_t)(W - 1) * msg,
          "bytes sent %lld, expected 2*(W-1)*(4+C/8) = %lld", (long long)(st1.compressed_bytes_sent - st0.compressed_bytes_sent),
          (long long)(2 * (int64_t)(W - 1) * msg));
    int32_t nf = -1;
    CHECK_OK(comm, lowbit_comm_last_nonfinite(comm, &nf));
    CHECK(nf == 0, "last_nonfinite is %d after a finite call", nf);
    for (int64_t g = 0; g < guard; ++g)
      CHECK(mine[n + g] == 12345.0f + (float)g, "element %lld past numel %lld was written", (long long)(n + g), (long long)n);

    lowbit_comm_info_t info;
    info.struct_size = sizeof info;
    CHECK_OK(comm, lowbit_comm_get_info(comm, &info));
    CHECK(info.bound_numel == n && info.padded_numel == l.padded && info.chunk_numel == l.chunk &&
              info.bound_device == LOWBIT_DEVICE_CPU && info.rank == crank && info.world_size == W &&
              info.backend == (g_via == VIA_CALLBACKS ? LOWBIT_COMM_BACKEND_CALLBACKS : LOWBIT_COMM_BACKEND_MPI),
          "info: bound %lld padded %lld chunk %lld (expected %lld %lld %lld)", (long long)info.bound_numel,
          (long long)info.padded_numel, (long long)info.chunk_numel, (long long)n, (long long)l.padded,
          (long long)l.chunk);

    sim_step(&l, in, werr, serr, out, amb, S, s);

    for (int r = 0; r < W; ++r) {
      const int64_t c = sim_real_in_chunk(&l, r);
      for (int64_t i = 0; i < c; ++i) {
        const int64_t e = (int64_t)r * l.chunk + i;
        const double tol = 1e-5 * S[r] + 1e-30;
        ++g_checked;
        if (amb[e]) {
          ++g_ambiguous;
          CHECK(fabs(fabs((double)mine[e]) - S[r]) <= tol, "n %lld call %d: ambiguous element %lld is %.9g, expected +-%.9g",
                (long long)n, k, (long long)e, (double)mine[e], S[r]);
        } else {
          CHECK(fabs((double)mine[e] - out[e]) <= tol, "n %lld call %d: element %lld is %.9g, simulation %.9g (S_%d %.9g)",
                (long long)n, k, (long long)e, (double)mine[e], out[e], r, S[r]);
        }
      }
    }
    check_same_on_all_ranks(fnv64(mine, sizeof(float) * (size_t)n), "the output");

    CHECK_OK(comm, lowbit_comm_read_errors(comm, lib_w, n, lib_s, my_c, NULL));
    for (int64_t i = 0; i < n; ++i) {
      const double x = (double)in[crank][i] + old_w[i];
      const double tol = 1e-5 * (fabs(x) + s[crank]) + 1e-30;
      CHECK(fabs((double)lib_w[i] - werr[crank][i]) <= tol, "n %lld call %d: worker error %lld is %.9g, simulation %.9g",
            (long long)n, k, (long long)i, (double)lib_w[i], werr[crank][i]);
    }
    for (int64_t i = 0; i < my_c; ++i) {
      const int64_t e = (int64_t)crank * l.chunk + i;
      const double y = serr[crank][i] + out[e]; /* the simulation's y */
      double smax = 0.0;
      for (int j = 0; j < W; ++j) smax = s[j] > smax ? s[j] : smax;
      const double tol = 1e-5 * (fabs(y) + S[crank] + smax) + 1e-30;
      if (amb[e]) {
        const double a = y - S[crank], b = y + S[crank];
        CHECK(fabs((double)lib_s[i] - a) <= tol || fabs((double)lib_s[i] - b) <= tol,
              "n %lld call %d: ambiguous server error %lld is %.9g, expected %.9g or %.9g", (long long)n, k,
              (long long)i, (double)lib_s[i], a, b);
      } else {
        CHECK(fabs((double)lib_s[i] - serr[crank][i]) <= tol, "n %lld call %d: server error %lld is %.9g, simulation %.9g",
              (long long)n, k, (long long)i, (double)lib_s[i], serr[crank][i]);
      }
    }
  }
  for (int j = 0; j < W; ++j) {
    free(in[j]);
    free(werr[j]);
    free(serr[j]);
  }
  free(in);
  free(werr);
  free(serr);
  free(mine);
  free(out);
  free(amb);
  free(S);
  free(s);
  free(lib_w);
  free(lib_s);
  free(old_w);
}

static void run_sizes(lowbit_comm_t comm, int W, uint64_t tag) {
  const int64_t u = 8 * (int64_t)W;
  uint64_t st = mix64(harness_seed() + tag);
  const int64_t random_size = 1 + (int64_t)(uniform01(&st) * 30000.0);
  const int64_t sizes[] = {1, 2, 3, W > 1 ? W - 1 : 5, W, W + 1, 7, u - 1, u, u + 1, 2 * u - 1, 2 * u + 1, 1001,
                           4096, 65537, random_size};
  const int count = (int)(sizeof sizes / sizeof sizes[0]);
  for (int i = 0; i < count; ++i) run_case(comm, sizes[i], sizes[i] > 10000 ? 2 : 3, tag * 100 + (uint64_t)i);
  if (g_rank == 0) printf("  %d sizes (random one: %lld) passed\n", count, (long long)random_size);
}

/* The sizes over `mpi` three ways: the built-in call and the stages on a
 * communicator made by `make`, then a callback communicator. */
static void run_all_ways(MPI_Comm mpi, lowbit_comm_t comm, uint64_t tag) {
  g_mpi = mpi;
  for (int v = VIA_BUILTIN; v <= VIA_STAGES; ++v) {
    g_via = (via_t)v;
    if (g_rank == 0) printf(" %s:\n", via_name(g_via));
    run_sizes(comm, g_world, tag * 10 + (uint64_t)v);
  }
  g_via = VIA_CALLBACKS;
  lowbit_comm_t cb = make_callback_comm(mpi, 1);
  if (g_rank == 0) printf(" %s:\n", via_name(g_via));
  run_sizes(cb, g_world, tag * 10 + (uint64_t)VIA_CALLBACKS);
  destroy_callback_comm(cb);
}

int main(int argc, char** argv) {
  harness_init(&argc, &argv);

  lowbit_comm_t world = make_world_comm();
  if (g_rank == 0) printf("MPI_COMM_WORLD:\n");
  run_all_ways(MPI_COMM_WORLD, world, 1);
  CHECK_OK(world, lowbit_comm_destroy(world));

  /* Ranks in reverse order, through the Fortran handle. */
  MPI_Comm rev;
  MPI_Comm_split(MPI_COMM_WORLD, 0, g_world - g_rank, &rev);
  lowbit_comm_t rc = NULL;
  CHECK_OK(rc, lowbit_comm_create_mpi_fortran(&rc, (int64_t)MPI_Comm_c2f(rev), NULL));
  int32_t r = -1;
  CHECK_OK(rc, lowbit_comm_rank(rc, &r));
  CHECK(r == g_world - 1 - g_rank, "rank in the reversed communicator is %d, expected %d", r, g_world - 1 - g_rank);
  if (g_rank == 0) printf("reversed communicator (Fortran handle):\n");
  run_all_ways(rev, rc, 2);
  CHECK_OK(rc, lowbit_comm_destroy(rc));
  MPI_Comm_free(&rev);

  if (g_rank == 0)
    printf("%lld elements checked, %lld ambiguous (|y| within fp32 error of 0)\n", (long long)g_checked,
           (long long)g_ambiguous);
  return harness_finish();
}
