/* Ranks that make different collective calls fail on every rank instead of
 * deadlocking (the argument agreement covers the operation, not only numel):
 *  - rank 0 in lowbit_comm_compressed_allreduce, the others in
 *    lowbit_comm_allreduce_mean, same numel, with the communicator unbound
 *    and bound: every rank returns INVALID_ARGUMENT naming both calls, and
 *    nothing changed (tensor, errors, counters);
 *  - one rank with bad arguments: the others name it and say why (its
 *    message travels to them);
 *  - a callback transport whose ranks declare different world sizes (issue
 *    32, defect 10): every rank fails naming world_size, nothing changed
 *    (before the fix the ranks laid the messages out differently and the
 *    exchange failed or hung);
 * Afterwards the communicator still works. Before the fix the first case
 * deadlocked (CTest TIMEOUT bounds it). Needs 2 or more ranks. */
#include <stdlib.h>
#include <string.h>

#include "comm_harness.h"
#include "comm_transports.h"

static unsigned char* save(lowbit_comm_t comm, int64_t* size) {
  CHECK_OK(comm, lowbit_comm_save_errors(comm, NULL, 0, size, NULL));
  unsigned char* b = (unsigned char*)xmalloc((size_t)*size);
  CHECK_OK(comm, lowbit_comm_save_errors(comm, b, *size, size, NULL));
  return b;
}

static lowbit_comm_stats_t stats_of(lowbit_comm_t comm) {
  lowbit_comm_stats_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  CHECK_OK(comm, lowbit_comm_get_stats(comm, &s));
  return s;
}

/* Rank 0 calls compressed_allreduce, the others allreduce_mean (or the
 * reverse): every rank must fail, naming both calls, with nothing changed. */
static void mixed_ops(lowbit_comm_t comm, float* x, int64_t n, int reverse) {
  int64_t s0 = 0, s1 = 0;
  unsigned char* before = save(comm, &s0);
  float* copy = (float*)xmalloc(sizeof(float) * (size_t)n);
  memcpy(copy, x, sizeof(float) * (size_t)n);
  const lowbit_comm_stats_t st0 = stats_of(comm);
  lowbit_tensor_t t = host_tensor(x, n);
  const int compressed = (g_rank == 0) != reverse;
  const lowbit_status_t got =
      compressed ? lowbit_comm_compressed_allreduce(comm, &t, NULL) : lowbit_comm_allreduce_mean(comm, &t, NULL);
  check_status_impl(__FILE__, __LINE__, compressed ? "compressed_allreduce" : "allreduce_mean", got,
                    LOWBIT_ERROR_INVALID_ARGUMENT, comm, "lowbit_comm_compressed_allreduce");
  CHECK(strstr(lowbit_comm_last_error(comm), "lowbit_comm_allreduce_mean") != NULL,
        "the message does not name the other call: %s", lowbit_comm_last_error(comm));
  CHECK(strstr(lowbit_comm_last_error(comm), "Nothing was done on any rank") != NULL,
        "the message does not say that nothing was done: %s", lowbit_comm_last_error(comm));
  static int shown = 0;
  if (!shown++) printf("rank %d: %s\n", g_rank, lowbit_comm_last_error(comm));
  unsigned char* after = save(comm, &s1);
  CHECK(s0 == s1 && memcmp(before, after, (size_t)s0) == 0, "mismatched calls changed the errors");
  CHECK(memcmp(copy, x, sizeof(float) * (size_t)n) == 0, "mismatched calls changed the tensor");
  const lowbit_comm_stats_t st1 = stats_of(comm);
  CHECK(st1.compressed_calls == st0.compressed_calls && st1.mean_calls == st0.mean_calls,
        "mismatched calls were counted");
  free(before);
  free(after);
  free(copy);
}

int main(int argc, char** argv) {
  harness_init(&argc, &argv);
  const int W = g_world;
  if (W < 2) {
    if (g_rank == 0) printf("needs 2 or more ranks\n");
    harness_finish();
    return 77;
  }
  const int64_t n = 257;
  float* x = (float*)xmalloc(sizeof(float) * (size_t)n);
  fill_normal(x, n, harness_seed(), (uint64_t)g_rank, 1.0);
  lowbit_comm_t comm = make_world_comm();

  /* Unbound, then bound to n. */
  mixed_ops(comm, x, n, 0);
  mixed_ops(comm, x, n, 1);
  lowbit_tensor_t t = host_tensor(x, n);
  CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &t, NULL));
  mixed_ops(comm, x, n, 0);
  mixed_ops(comm, x, n, 1);

  /* One rank's bad arguments: the others learn which rank and why. */
  {
    const int culprit = W - 1;
    lowbit_tensor_t bad = host_tensor(x, n);
    if (g_rank == culprit) bad.dtype = LOWBIT_DTYPE_FLOAT16;
    char needle[64];
    snprintf(needle, sizeof needle, "rank %d rejected its arguments", culprit);
    CHECK_STATUS(comm, lowbit_comm_compressed_allreduce(comm, &bad, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                 g_rank == culprit ? "tensor.dtype is LOWBIT_DTYPE_FLOAT16" : needle);
    if (g_rank == 0) printf("rank 0: %s\n", lowbit_comm_last_error(comm));
    CHECK(strstr(lowbit_comm_last_error(comm), "LOWBIT_DTYPE_FLOAT16") != NULL,
          "the reason did not reach every rank: %s", lowbit_comm_last_error(comm));
  }

  /* A callback transport whose last rank declares one rank more: refused by
   * every rank before anything is exchanged, for both collectives. */
  {
    lowbit_comm_t cb = make_callback_comm_declaring(MPI_COMM_WORLD, 1, g_rank == W - 1 ? W + 1 : W);
    for (int mean = 0; mean < 2; ++mean) {
      float* copy = (float*)xmalloc(sizeof(float) * (size_t)n);
      memcpy(copy, x, sizeof(float) * (size_t)n);
      lowbit_tensor_t tw = host_tensor(x, n);
      CHECK_STATUS(cb, mean ? lowbit_comm_allreduce_mean(cb, &tw, NULL) : lowbit_comm_compressed_allreduce(cb, &tw, NULL),
                   LOWBIT_ERROR_INVALID_ARGUMENT, "world_size");
      if (g_rank == 0 && !mean) printf("rank 0: %s\n", lowbit_comm_last_error(cb));
      CHECK(memcmp(copy, x, sizeof(float) * (size_t)n) == 0, "a refused call changed the tensor");
      free(copy);
    }
    destroy_callback_comm(cb);
  }

  /* Still usable: the same call everywhere works, and mixed calls under a
   * timeout are refused just the same. */
  CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &t, NULL));
  CHECK_OK(comm, lowbit_comm_allreduce_mean(comm, &t, NULL));
  CHECK_OK(comm, lowbit_comm_destroy(comm));
  setenv("LOWBIT_COMM_TIMEOUT_MS", "60000", 1);
  comm = make_world_comm();
  unsetenv("LOWBIT_COMM_TIMEOUT_MS");
  mixed_ops(comm, x, n, 0);
  CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &t, NULL));
  CHECK_OK(comm, lowbit_comm_allreduce_mean(comm, &t, NULL));
  CHECK_OK(comm, lowbit_comm_destroy(comm));
  free(x);
  if (g_rank == 0) printf("mismatched calls refused on every rank\n");
  return harness_finish();
}
