/* The C API's contract on bad input: every rejected call returns the right
 * status, sets lowbit_last_error() and lowbit_comm_last_error() to a message
 * naming the argument, and changes nothing (tensor and errors compared byte
 * for byte). Collective calls with bad arguments on one rank fail on every
 * rank (the argument agreement), so nobody waits forever. */
#include <string.h>

#include "comm_harness.h"

static unsigned char* save(lowbit_comm_t comm, int64_t* size) {
  CHECK_OK(comm, lowbit_comm_save_errors(comm, NULL, 0, size, NULL));
  unsigned char* b = (unsigned char*)xmalloc((size_t)*size);
  CHECK_OK(comm, lowbit_comm_save_errors(comm, b, *size, size, NULL));
  return b;
}

/* Calls compressed_allreduce with `t` (NULL allowed) on every rank, expects
 * `want` + `needle`, and checks that the errors and x are unchanged. */
static void reject(lowbit_comm_t comm, const lowbit_tensor_t* t, float* x, int64_t n, lowbit_status_t want,
                   const char* needle, int mean) {
  int64_t s0 = 0, s1 = 0;
  unsigned char* before = save(comm, &s0);
  float* copy = (float*)xmalloc(sizeof(float) * (size_t)n);
  memcpy(copy, x, sizeof(float) * (size_t)n);
  if ((int)want == -1) {
    /* CUDA built: UNSUPPORTED without a GPU, INVALID_ARGUMENT (host memory
     * labelled CUDA) with one. */
    const lowbit_status_t got =
        mean ? lowbit_comm_allreduce_mean(comm, t, NULL) : lowbit_comm_compressed_allreduce(comm, t, NULL);
    want = got == LOWBIT_ERROR_UNSUPPORTED ? LOWBIT_ERROR_UNSUPPORTED : LOWBIT_ERROR_INVALID_ARGUMENT;
    check_status_impl(__FILE__, __LINE__, "CUDA-labelled host tensor", got, want, comm, needle);
  } else if (mean)
    CHECK_STATUS(comm, lowbit_comm_allreduce_mean(comm, t, NULL), want, needle);
  else
    CHECK_STATUS(comm, lowbit_comm_compressed_allreduce(comm, t, NULL), want, needle);
  unsigned char* after = save(comm, &s1);
  CHECK(s0 == s1 && memcmp(before, after, (size_t)s0) == 0, "rejected call (%s) changed the errors", needle);
  CHECK(memcmp(copy, x, sizeof(float) * (size_t)n) == 0, "rejected call (%s) changed the tensor", needle);
  free(before);
  free(after);
  free(copy);
}

int main(int argc, char** argv) {
  harness_init(&argc, &argv);
  const int W = g_world;
  MPI_Comm world = MPI_COMM_WORLD;

  /* --- creation */
  lowbit_comm_t c = (lowbit_comm_t)&world; /* garbage: must become NULL on failure */
  CHECK_STATUS(NULL, lowbit_comm_create_mpi(NULL, &world, NULL), LOWBIT_ERROR_NULL_POINTER, "out");
  CHECK_STATUS(NULL, lowbit_comm_create_mpi(&c, NULL, NULL), LOWBIT_ERROR_NULL_POINTER, "mpi_comm");
  CHECK(c == NULL, "out not set to NULL on failure");
  MPI_Comm null_comm = MPI_COMM_NULL;
  CHECK_STATUS(NULL, lowbit_comm_create_mpi(&c, &null_comm, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "MPI_COMM_NULL");
  lowbit_comm_config_t cfg;
  CHECK_OK(NULL, lowbit_comm_config_init(&cfg));
  CHECK(cfg.struct_size == sizeof cfg && cfg.cuda_aware_mpi == LOWBIT_COMM_CUDA_AWARE_AUTO, "config defaults");
  CHECK_STATUS(NULL, lowbit_comm_config_init(NULL), LOWBIT_ERROR_NULL_POINTER, "config");
  cfg.struct_size = 3;
  CHECK_STATUS(NULL, lowbit_comm_create_mpi(&c, &world, &cfg), LOWBIT_ERROR_INVALID_ARGUMENT, "config.struct_size");
  CHECK_OK(NULL, lowbit_comm_config_init(&cfg));
  cfg.cuda_aware_mpi = 7;
  CHECK_STATUS(NULL, lowbit_comm_create_mpi(&c, &world, &cfg), LOWBIT_ERROR_INVALID_ARGUMENT, "cuda_aware_mpi");
  CHECK_STATUS(NULL, lowbit_comm_create_mpi_fortran(&c, (int64_t)1 << 40, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
               "mpi_fortran_comm");
  /* Fortran handles that are no communicator: an error naming the handle,
   * not an abort of the whole job by MPI's error handler; and
   * MPI_COMM_WORLD's handler is the caller's again afterwards. */
  {
    CHECK_STATUS(NULL, lowbit_comm_create_mpi_fortran(&c, 12345, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                 "mpi_fortran_comm is 12345");
    CHECK_STATUS(NULL, lowbit_comm_create_mpi_fortran(&c, -7, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                 "mpi_fortran_comm is -7");
    const int64_t fnull = (int64_t)MPI_Comm_c2f(MPI_COMM_NULL);
    CHECK_STATUS(NULL, lowbit_comm_create_mpi_fortran(&c, fnull, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                 "MPI_COMM_NULL");
    MPI_Comm freed;
    MPI_Comm_dup(MPI_COMM_WORLD, &freed);
    const int64_t ffreed = (int64_t)MPI_Comm_c2f(freed);
    MPI_Comm_free(&freed);
    CHECK_STATUS(NULL, lowbit_comm_create_mpi_fortran(&c, ffreed, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                 "mpi_fortran_comm is");
#if defined(OPEN_MPI) && OPEN_MPI
    /* A zeroed MPI_Comm (a NULL pointer in Open MPI) through the C entry
     * point: probed with MPI_ERRORS_RETURN, refused. */
    MPI_Comm zero;
    memset(&zero, 0, sizeof zero);
    CHECK_STATUS(NULL, lowbit_comm_create_mpi(&c, &zero, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                 "not a valid MPI communicator");
#endif
    CHECK(c == NULL, "out not NULL after failed Fortran creations");
    MPI_Errhandler eh;
    MPI_Comm_get_errhandler(MPI_COMM_WORLD, &eh);
    CHECK(eh == MPI_ERRORS_ARE_FATAL, "MPI_COMM_WORLD's error handler was changed");
    MPI_Errhandler_free(&eh);
    /* A valid one still works. */
    CHECK_OK(c, lowbit_comm_create_mpi_fortran(&c, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD), NULL));
    CHECK_OK(c, lowbit_comm_destroy(c));
    c = NULL;
  }
  /* NCCL entry points: UNSUPPORTED without NCCL, argument errors with it. */
  unsigned char id[LOWBIT_NCCL_UNIQUE_ID_BYTES];
  CHECK_STATUS(NULL, lowbit_comm_nccl_unique_id(NULL, 128), LOWBIT_ERROR_NULL_POINTER, "out_id");
  CHECK_STATUS(NULL, lowbit_comm_nccl_unique_id(id, 16), LOWBIT_ERROR_BUFFER_TOO_SMALL, "capacity");
  if (lowbit_has_nccl()) {
    CHECK_STATUS(NULL, lowbit_comm_create_nccl(&c, NULL, 0, 1, 0, NULL), LOWBIT_ERROR_NULL_POINTER, "unique_id");
    memset(id, 0, sizeof id);
    CHECK_STATUS(NULL, lowbit_comm_create_nccl(&c, id, 0, 0, 0, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "world");
    CHECK_STATUS(NULL, lowbit_comm_create_nccl(&c, id, 3, 2, 0, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "rank");
    CHECK_STATUS(NULL, lowbit_comm_create_nccl_comm(&c, NULL, NULL), LOWBIT_ERROR_NULL_POINTER, "nccl_comm");
  } else {
    CHECK_STATUS(NULL, lowbit_comm_create_nccl(&c, id, 0, 1, 0, NULL), LOWBIT_ERROR_UNSUPPORTED, "NCCL");
    CHECK_STATUS(NULL, lowbit_comm_create_nccl_comm(&c, id, NULL), LOWBIT_ERROR_UNSUPPORTED, "NCCL");
  }
  CHECK(c == NULL, "out not NULL after failed creations");
  CHECK_OK(NULL, lowbit_comm_destroy(NULL));

  /* --- NULL handles */
  int32_t r32 = 0;
  int64_t i64 = 0;
  CHECK_STATUS(NULL, lowbit_comm_rank(NULL, &r32), LOWBIT_ERROR_NULL_POINTER, "comm is NULL");
  CHECK_STATUS(NULL, lowbit_comm_world_size(NULL, &r32), LOWBIT_ERROR_NULL_POINTER, "comm is NULL");
  CHECK_STATUS(NULL, lowbit_comm_compressed_allreduce(NULL, NULL, NULL), LOWBIT_ERROR_NULL_POINTER, "comm is NULL");
  CHECK_STATUS(NULL, lowbit_comm_allreduce_mean(NULL, NULL, NULL), LOWBIT_ERROR_NULL_POINTER, "comm is NULL");
  CHECK_STATUS(NULL, lowbit_comm_error_numel(NULL, &i64, &i64), LOWBIT_ERROR_NULL_POINTER, "comm is NULL");
  CHECK_STATUS(NULL, lowbit_comm_reset_errors(NULL, NULL), LOWBIT_ERROR_NULL_POINTER, "comm is NULL");
  /* NULL handle: the thread's last error, as lowbit_optimizer_last_error(NULL). */
  CHECK(strcmp(lowbit_comm_last_error(NULL), "comm is NULL") == 0, "lowbit_comm_last_error(NULL)");
  CHECK_STATUS(NULL, lowbit_comm_config_init(NULL), LOWBIT_ERROR_NULL_POINTER, "config is NULL");
  CHECK(strcmp(lowbit_comm_last_error(NULL), lowbit_last_error()) == 0 &&
            strcmp(lowbit_optimizer_last_error(NULL), lowbit_last_error()) == 0,
        "lowbit_comm_last_error(NULL) and lowbit_optimizer_last_error(NULL) are the thread's last error");

  lowbit_comm_t comm = make_world_comm();
  CHECK(strcmp(lowbit_comm_last_error(comm), "") == 0, "fresh handle has an error message");
  CHECK_OK(comm, lowbit_comm_rank(comm, &r32));
  CHECK(r32 == g_rank, "rank %d, expected %d", r32, g_rank);
  CHECK_OK(comm, lowbit_comm_world_size(comm, &r32));
  CHECK(r32 == W, "world %d, expected %d", r32, W);
  CHECK_STATUS(comm, lowbit_comm_rank(comm, NULL), LOWBIT_ERROR_NULL_POINTER, "out");
  lowbit_comm_info_t info;
  info.struct_size = 8;
  CHECK_STATUS(comm, lowbit_comm_get_info(comm, &info), LOWBIT_ERROR_INVALID_ARGUMENT, "struct_size");
  lowbit_comm_stats_t stats;
  stats.struct_size = sizeof stats + 8;
  CHECK_STATUS(comm, lowbit_comm_get_stats(comm, &stats), LOWBIT_ERROR_INVALID_ARGUMENT, "struct_size");
  CHECK_STATUS(comm, lowbit_comm_get_stats(comm, NULL), LOWBIT_ERROR_NULL_POINTER, "out");
  info.struct_size = sizeof info;
  CHECK_OK(comm, lowbit_comm_get_info(comm, &info));
  CHECK(info.bound_numel == 0 && info.backend == LOWBIT_COMM_BACKEND_MPI && info.cuda_aware_mpi == 0 &&
            info.device_index == -1,
        "info of a fresh MPI communicator");

  /* --- bad tensors, the same on every rank */
  const int64_t n = 100;
  float* x = (float*)xmalloc(sizeof(float) * (size_t)(n + 1));
  fill_normal(x, n + 1, harness_seed(), (uint64_t)g_rank, 1.0);
  lowbit_tensor_t good = host_tensor(x, n);
  CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &good, NULL)); /* binds numel 100 */
  for (int mean = 0; mean < 2; ++mean) {
    lowbit_tensor_t t = good;
    reject(comm, NULL, x, n, LOWBIT_ERROR_NULL_POINTER, "tensor is NULL", mean);
    t = good;
    t.data = NULL;
    reject(comm, &t, x, n, LOWBIT_ERROR_NULL_POINTER, "tensor.data", mean);
    t = good;
    t.numel = 0;
    reject(comm, &t, x, n, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.numel is 0", mean);
    t.numel = -5;
    reject(comm, &t, x, n, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.numel is -5", mean);
    t = good;
    t.dtype = LOWBIT_DTYPE_BFLOAT16;
    reject(comm, &t, x, n, LOWBIT_ERROR_INVALID_ARGUMENT, "LOWBIT_DTYPE_BFLOAT16", mean);
    t.dtype = (lowbit_dtype_t)99;
    reject(comm, &t, x, n, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.dtype is 99", mean);
    t = good;
    t.device = (lowbit_device_t)7;
    reject(comm, &t, x, n, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.device is 7", mean);
    t = good;
    t.data = (char*)x + 1;
    reject(comm, &t, x, n, LOWBIT_ERROR_INVALID_ARGUMENT, "aligned", mean);
    t = good;
    t.device = LOWBIT_DEVICE_CUDA;
    /* no CUDA build, or no GPU here, or host memory labelled CUDA */
    reject(comm, &t, x, n, lowbit_has_cuda() ? (lowbit_status_t)-1 : LOWBIT_ERROR_UNSUPPORTED, "tensor.", mean);
  }
  /* The bound numel / device: another numel is refused, on every rank. */
  {
    lowbit_tensor_t t = good;
    t.numel = n + 1;
    reject(comm, &t, x, n + 1, LOWBIT_ERROR_INVALID_ARGUMENT, "bound to numel 100", 0);
  }
  /* One rank with bad arguments: it names its argument, the others name it. */
  if (W > 1) {
    const int culprit = W - 1;
    lowbit_tensor_t t = good;
    if (g_rank == culprit) t.numel = 0;
    char needle[64];
    snprintf(needle, sizeof needle, "rank %d rejected its arguments", culprit);
    reject(comm, &t, x, n, LOWBIT_ERROR_INVALID_ARGUMENT, g_rank == culprit ? "tensor.numel is 0" : needle, 0);
    reject(comm, &t, x, n, LOWBIT_ERROR_INVALID_ARGUMENT, g_rank == culprit ? "tensor.numel is 0" : needle, 1);
    /* Different numel on different ranks (all valid locally): refused by all. */
    lowbit_comm_t fresh = make_world_comm();
    t = good;
    t.numel = n - g_rank;
    reject(fresh, &t, x, n, LOWBIT_ERROR_INVALID_ARGUMENT, "every rank must pass the same numel", 0);
    reject(fresh, &t, x, n, LOWBIT_ERROR_INVALID_ARGUMENT, "every rank must pass the same numel", 1);
    CHECK_OK(fresh, lowbit_comm_destroy(fresh));
  }
  /* read_errors sizes */
  {
    float w[100], s[100];
    int64_t wn = 0, sn = 0;
    CHECK_OK(comm, lowbit_comm_error_numel(comm, &wn, &sn));
    CHECK_STATUS(comm, lowbit_comm_read_errors(comm, w, wn + 1, NULL, 0, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                 "worker_numel");
    CHECK_STATUS(comm, lowbit_comm_read_errors(comm, NULL, 0, s, sn + 1, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                 "server_numel");
    CHECK_STATUS(comm, lowbit_comm_error_numel(comm, NULL, NULL), LOWBIT_ERROR_NULL_POINTER, "out_worker_numel");
    CHECK_STATUS(comm, lowbit_comm_save_errors(comm, NULL, 0, NULL, NULL), LOWBIT_ERROR_NULL_POINTER, "out_size");
  }
  /* After all that, the communicator still works. */
  CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &good, NULL));
  CHECK_OK(comm, lowbit_comm_destroy(comm));
  free(x);
  if (g_rank == 0) printf("bad-input checks passed\n");
  return harness_finish();
}
