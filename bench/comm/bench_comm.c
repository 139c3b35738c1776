/* Compressed allreduce vs MPI_Allreduce of the same fp32 buffer, same run.
 *
 *   mpiexec -n 2 ./bench_comm [max_numel [min_numel [iters]]]   (default 64M = 67108864, 1M)
 *   mpiexec -n 4 --oversubscribe ./bench_comm
 *
 * Sizes min_numel, 4 min_numel, ... up to max_numel (default 1M, 4M, 16M,
 * 64M). Per size: one warm-up call of each (the first compressed call
 * allocates the error buffers and workspaces), then `iters` timed calls
 * (default 20 at 1M, 10 at 4M, 4 at 16M, 2 above); the time is the slowest
 * rank's mean. Host buffers (the CPU path); the host kernels use
 * OMP_NUM_THREADS threads per rank (give each rank its own cores).
 * The host pack / unpack alone, against the copy bandwidth: bench_comm_pack.
 * Over a rate-limited link: shaped_link.sh.
 *
 * Columns:
 *   comp ms / mpi ms   time per call: lowbit_comm_compressed_allreduce vs
 *                      MPI_Allreduce(MPI_IN_PLACE, MPI_FLOAT, MPI_SUM)
 *   sent B/el (1bit)   bytes this rank sent per element, measured by the
 *                      communicator's counter: 2 (W-1) (4 + C/8) / n
 *   sent B/el (fp32)   bytes a bandwidth-optimal (ring) fp32 allreduce sends
 *                      per element: 2 (W-1)/W * 4
 *   wire B/el          encoded size of one rank's buffer per element:
 *                      W (4 + C/8) / n = 1/8 + 4W/n (+ padding <= 8W-1 el.)
 *                      against 4 for fp32. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowbit_comm.h"

static void die(const char* what, lowbit_comm_t c) {
  fprintf(stderr, "%s failed: %s\n", what, c ? lowbit_comm_last_error(c) : lowbit_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int64_t max_n = argc > 1 ? atoll(argv[1]) : ((int64_t)64 << 20);
  const int64_t min_n = argc > 2 ? atoll(argv[2]) : ((int64_t)1 << 20);
  const int iters_arg = argc > 3 ? atoi(argv[3]) : 0;
  if (max_n <= 0 || min_n <= 0 || iters_arg < 0) {
    if (rank == 0) fprintf(stderr, "usage: %s [max_numel > 0 [min_numel > 0 [iters >= 0]]]\n", argv[0]);
    MPI_Finalize();
    return 2;
  }

  MPI_Comm w = MPI_COMM_WORLD;
  lowbit_comm_t comm = NULL;
  if (lowbit_comm_create_mpi(&comm, &w, NULL) != LOWBIT_SUCCESS) die("lowbit_comm_create_mpi", NULL);

  if (rank == 0) {
    printf("compressed allreduce vs MPI_Allreduce, %d ranks, host fp32 buffers\n", world);
    printf("%10s %6s %10s %10s %8s %16s %16s %10s\n", "numel", "iters", "comp ms", "mpi ms", "speedup",
           "sent B/el (1bit)", "sent B/el (fp32)", "wire B/el");
  }
  for (int64_t n = min_n; n <= max_n; n *= 4) {
    const int iters = iters_arg > 0 ? iters_arg
                      : n <= ((int64_t)1 << 20) ? 20
                      : n <= ((int64_t)4 << 20) ? 10
                      : n <= ((int64_t)16 << 20) ? 4
                                                  : 2;
    float* x = (float*)malloc(sizeof(float) * (size_t)n);
    float* y = (float*)malloc(sizeof(float) * (size_t)n);
    if (!x || !y) die("malloc", NULL);
    unsigned long long s = 0x9E3779B97F4A7C15ull * (unsigned long long)(rank + 1);
    for (int64_t i = 0; i < n; ++i) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      x[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    memcpy(y, x, sizeof(float) * (size_t)n);
    lowbit_tensor_t t;
    memset(&t, 0, sizeof t);
    t.data = x;
    t.numel = n;
    t.dtype = LOWBIT_DTYPE_FLOAT32;
    t.device = LOWBIT_DEVICE_CPU;

    if (lowbit_comm_reset_errors(comm, NULL) != LOWBIT_SUCCESS) die("reset_errors", comm);
    if (lowbit_comm_compressed_allreduce(comm, &t, NULL) != LOWBIT_SUCCESS) die("compressed_allreduce", comm);
    MPI_Allreduce(MPI_IN_PLACE, y, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    memcpy(y, x, sizeof(float) * (size_t)n);

    lowbit_comm_stats_t s0, s1;
    s0.struct_size = s1.struct_size = sizeof s0;
    lowbit_comm_get_stats(comm, &s0);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int k = 0; k < iters; ++k)
      if (lowbit_comm_compressed_allreduce(comm, &t, NULL) != LOWBIT_SUCCESS) die("compressed_allreduce", comm);
    double tc = (MPI_Wtime() - t0) / iters;
    lowbit_comm_get_stats(comm, &s1);

    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int k = 0; k < iters; ++k) MPI_Allreduce(MPI_IN_PLACE, y, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double tm = (MPI_Wtime() - t0) / iters;
    MPI_Allreduce(MPI_IN_PLACE, &tc, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &tm, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

    lowbit_comm_info_t info;
    info.struct_size = sizeof info;
    lowbit_comm_get_info(comm, &info);
    const double sent_1bit = (double)(s1.compressed_bytes_sent - s0.compressed_bytes_sent) / iters / (double)n;
    const double sent_fp32 = 2.0 * (world - 1) / world * 4.0;
    const double wire = (double)world * (4.0 + (double)info.chunk_numel / 8.0) / (double)n;
    if (rank == 0)
      printf("%10lld %6d %10.2f %10.2f %7.2fx %16.4f %16.4f %10.6f\n", (long long)n, iters, tc * 1e3, tm * 1e3, tm / tc,
             sent_1bit, sent_fp32, wire);
    fflush(stdout);
    free(x);
    free(y);
  }
  lowbit_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
