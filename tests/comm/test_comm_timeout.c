/* LOWBIT_COMM_TIMEOUT_MS: a collective whose peers do not come returns
 * LOWBIT_ERROR_COMMUNICATION after the timeout instead of waiting forever.
 *  - The ranks agree on it at creation: different values, or a bad one on
 *    one rank, fail the creation on every rank.
 *  - lowbit_comm_config_t.timeout_ms sets it too (lowbit_comm_get_info
 *    reports the value in effect), the same agreement applies, and the
 *    environment variable, where set and not empty, overrides the field.
 *  - Under a timeout (no rank late) the results are bit-identical to the
 *    blocking mode, for both collectives.
 *  - The last rank sleeps 10 timeouts before its call: the others return
 *    COMMUNICATION ("timed out") after about one timeout, with the tensor and
 *    the errors unchanged; the late rank times out too (its peers have left).
 *    Then every call on that communicator fails at once ("unusable") on
 *    every rank, local queries still work, and destroying it succeeds.
 *  - The same for lowbit_comm_allreduce_mean on a second communicator.
 * Needs 2 or more ranks; CTest's TIMEOUT bounds a regression. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_harness.h"

#define TIMEOUT_MS 400

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static unsigned char* save(lowbit_comm_t comm, int64_t* size) {
  CHECK_OK(comm, lowbit_comm_save_errors(comm, NULL, 0, size, NULL));
  unsigned char* b = (unsigned char*)xmalloc((size_t)*size);
  CHECK_OK(comm, lowbit_comm_save_errors(comm, b, *size, size, NULL));
  return b;
}

static lowbit_comm_t timed_comm(void) {
  char v[32];
  snprintf(v, sizeof v, "%d", TIMEOUT_MS);
  setenv("LOWBIT_COMM_TIMEOUT_MS", v, 1);
  lowbit_comm_t c = make_world_comm();
  unsetenv("LOWBIT_COMM_TIMEOUT_MS");
  return c;
}

/* Creation with LOWBIT_COMM_TIMEOUT_MS = value (NULL: unset) on this rank
 * must fail on every rank with `needle`. */
static void creation_fails(const char* value, const char* needle) {
  if (value)
    setenv("LOWBIT_COMM_TIMEOUT_MS", value, 1);
  else
    unsetenv("LOWBIT_COMM_TIMEOUT_MS");
  MPI_Comm world = MPI_COMM_WORLD;
  lowbit_comm_t c = (lowbit_comm_t)&world;
  CHECK_STATUS(NULL, lowbit_comm_create_mpi(&c, &world, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, needle);
  CHECK(c == NULL, "out not NULL after a failed creation");
  if (g_rank == 0) printf("LOWBIT_COMM_TIMEOUT_MS=%s on rank 0: %s\n", value ? value : "(unset)", lowbit_last_error());
  unsetenv("LOWBIT_COMM_TIMEOUT_MS");
}

/* A communicator over MPI_COMM_WORLD with config.timeout_ms = config_ms and
 * LOWBIT_COMM_TIMEOUT_MS = env (NULL: unset): its timeout in effect. */
static int64_t timeout_in_effect(int64_t config_ms, const char* env) {
  if (env)
    setenv("LOWBIT_COMM_TIMEOUT_MS", env, 1);
  lowbit_comm_config_t cfg;
  CHECK_OK(NULL, lowbit_comm_config_init(&cfg));
  cfg.timeout_ms = config_ms;
  MPI_Comm world = MPI_COMM_WORLD;
  lowbit_comm_t c = NULL;
  CHECK_OK(NULL, lowbit_comm_create_mpi(&c, &world, &cfg));
  unsetenv("LOWBIT_COMM_TIMEOUT_MS");
  lowbit_comm_info_t info;
  CHECK_OK(c, lowbit_comm_info_init(&info));
  CHECK_OK(c, lowbit_comm_get_info(c, &info));
  CHECK_OK(c, lowbit_comm_destroy(c));
  return info.timeout_ms;
}

/* config.timeout_ms = config_ms on this rank must fail the creation on every
 * rank with `needle`. */
static void config_creation_fails(int64_t config_ms, const char* needle) {
  lowbit_comm_config_t cfg;
  CHECK_OK(NULL, lowbit_comm_config_init(&cfg));
  cfg.timeout_ms = config_ms;
  MPI_Comm world = MPI_COMM_WORLD;
  lowbit_comm_t c = (lowbit_comm_t)&world;
  CHECK_STATUS(NULL, lowbit_comm_create_mpi(&c, &world, &cfg), LOWBIT_ERROR_INVALID_ARGUMENT, needle);
  CHECK(c == NULL, "out not NULL after a failed creation");
  if (g_rank == 0) printf("config.timeout_ms=%lld on rank 0: %s\n", (long long)config_ms, lowbit_last_error());
}

static void config_field(void) {
  CHECK(timeout_in_effect(0, NULL) == 0, "no timeout by default");
  CHECK(timeout_in_effect(250, NULL) == 250, "config.timeout_ms = 250 not in effect");
  CHECK(timeout_in_effect(250, "500") == 500, "LOWBIT_COMM_TIMEOUT_MS = 500 did not override config.timeout_ms");
  CHECK(timeout_in_effect(250, "0") == 0, "LOWBIT_COMM_TIMEOUT_MS = 0 did not override config.timeout_ms");
  CHECK(timeout_in_effect(250, "") == 250, "an empty LOWBIT_COMM_TIMEOUT_MS is unset");
  /* Ranks whose fields differ agree once the variable overrides them all. */
  CHECK(timeout_in_effect(1000 + g_rank, "700") == 700, "the variable overrides every rank's field");
  config_creation_fails(1000 + g_rank, "every rank must use the same");
  const int culprit = g_world - 1;
  char needle[64];
  snprintf(needle, sizeof needle, "rank %d rejected its arguments", culprit);
  config_creation_fails(g_rank == culprit ? -1 : 500, g_rank == culprit ? "config.timeout_ms is -1" : needle);
  config_creation_fails(g_rank == culprit ? (int64_t)1 << 31 : 500,
                        g_rank == culprit ? "config.timeout_ms is 2147483648" : needle);
  /* A 0.2 struct has no field: no timeout, whatever follows it in memory. */
  unsigned char buf[sizeof(lowbit_comm_config_t)];
  memset(buf, 0x7F, sizeof buf);
  CHECK_OK(NULL, lowbit_comm_config_init_sized((lowbit_comm_config_t*)buf, offsetof(lowbit_comm_config_t, timeout_ms)));
  MPI_Comm world = MPI_COMM_WORLD;
  lowbit_comm_t c = NULL;
  CHECK_OK(NULL, lowbit_comm_create_mpi(&c, &world, (const lowbit_comm_config_t*)buf));
  lowbit_comm_info_t info;
  CHECK_OK(c, lowbit_comm_info_init(&info));
  CHECK_OK(c, lowbit_comm_get_info(c, &info));
  CHECK(info.timeout_ms == 0, "a 0.2 config got timeout %lld", (long long)info.timeout_ms);
  CHECK_OK(c, lowbit_comm_destroy(c));
}

/* The last rank arrives late; every rank must time out, changing nothing. */
static void late_rank(lowbit_comm_t comm, float* x, int64_t n, int mean) {
  const int late = g_rank == g_world - 1;
  int64_t s0 = 0, s1 = 0;
  unsigned char* before = save(comm, &s0);
  float* copy = (float*)xmalloc(sizeof(float) * (size_t)n);
  memcpy(copy, x, sizeof(float) * (size_t)n);
  if (late) sleep_ms(10 * TIMEOUT_MS);
  lowbit_tensor_t t = host_tensor(x, n);
  const double t0 = MPI_Wtime();
  const lowbit_status_t got =
      mean ? lowbit_comm_allreduce_mean(comm, &t, NULL) : lowbit_comm_compressed_allreduce(comm, &t, NULL);
  const double waited = MPI_Wtime() - t0;
  check_status_impl(__FILE__, __LINE__, mean ? "allreduce_mean" : "compressed_allreduce", got,
                    LOWBIT_ERROR_COMMUNICATION, comm, "timed out");
  if (g_rank == 0) printf("rank 0 after %.3f s: %s\n", waited, lowbit_comm_last_error(comm));
  if (!late)
    CHECK(waited >= 0.9 * TIMEOUT_MS / 1000.0 && waited < 8.0 * TIMEOUT_MS / 1000.0,
          "timed out after %.3f s, the timeout is %d ms", waited, TIMEOUT_MS);
  CHECK(memcmp(copy, x, sizeof(float) * (size_t)n) == 0, "a timed-out call changed the tensor");
  unsigned char* after = save(comm, &s1);
  CHECK(s0 == s1 && memcmp(before, after, (size_t)s0) == 0, "a timed-out call changed the errors");
  /* Unusable now: every collective fails at once, on every rank. */
  const double t1 = MPI_Wtime();
  CHECK_STATUS(comm, lowbit_comm_compressed_allreduce(comm, &t, NULL), LOWBIT_ERROR_COMMUNICATION, "unusable");
  CHECK_STATUS(comm, lowbit_comm_allreduce_mean(comm, &t, NULL), LOWBIT_ERROR_COMMUNICATION, "unusable");
  if (g_rank == 0) printf("rank 0 then: %s\n", lowbit_comm_last_error(comm));
  CHECK(MPI_Wtime() - t1 < 0.5 * TIMEOUT_MS / 1000.0, "calls on an unusable communicator waited");
  int32_t r = -1;
  CHECK_OK(comm, lowbit_comm_rank(comm, &r));
  CHECK(r == g_rank, "rank");
  CHECK_OK(comm, lowbit_comm_destroy(comm));
  free(before);
  free(after);
  free(copy);
  /* Line the ranks up again (the late rank left its call last). */
  MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char** argv) {
  harness_init(&argc, &argv);
  if (g_world < 2) {
    if (g_rank == 0) printf("needs 2 or more ranks\n");
    harness_finish();
    return 77;
  }
  const int64_t n = 1001;
  float* a = (float*)xmalloc(sizeof(float) * (size_t)n);
  float* b = (float*)xmalloc(sizeof(float) * (size_t)n);

  /* The value must be the same on every rank, and a number. */
  {
    char v[32], needle[96];
    snprintf(v, sizeof v, "%d", 1000 + g_rank);
    creation_fails(v, "every rank must use the same");
    creation_fails(g_rank == 0 ? "500" : NULL, "every rank must use the same");
    const int culprit = g_world - 1;
    snprintf(needle, sizeof needle, "rank %d rejected its arguments", culprit);
    creation_fails(g_rank == culprit ? "abc" : "500", g_rank == culprit ? "LOWBIT_COMM_TIMEOUT_MS is \"abc\"" : needle);
    creation_fails(g_rank == culprit ? "-3" : "500", g_rank == culprit ? "LOWBIT_COMM_TIMEOUT_MS is \"-3\"" : needle);
    creation_fails(g_rank == culprit ? "10ms" : "500", g_rank == culprit ? "LOWBIT_COMM_TIMEOUT_MS is \"10ms\"" : "LOWBIT_COMM_TIMEOUT_MS");
    /* Empty is unset. */
    setenv("LOWBIT_COMM_TIMEOUT_MS", "", 1);
    lowbit_comm_t e = make_world_comm();
    unsetenv("LOWBIT_COMM_TIMEOUT_MS");
    CHECK_OK(e, lowbit_comm_destroy(e));
  }

  config_field();

  /* Under a timeout, the same bits as the blocking mode. */
  {
    lowbit_comm_t plain = make_world_comm(), timed = timed_comm();
    for (int k = 0; k < 3; ++k) {
      fill_normal(a, n, harness_seed(), (uint64_t)(g_rank * 10 + k), 1.0);
      memcpy(b, a, sizeof(float) * (size_t)n);
      lowbit_tensor_t ta = host_tensor(a, n), tb = host_tensor(b, n);
      if (k == 2) {
        CHECK_OK(plain, lowbit_comm_allreduce_mean(plain, &ta, NULL));
        CHECK_OK(timed, lowbit_comm_allreduce_mean(timed, &tb, NULL));
      } else {
        CHECK_OK(plain, lowbit_comm_compressed_allreduce(plain, &ta, NULL));
        CHECK_OK(timed, lowbit_comm_compressed_allreduce(timed, &tb, NULL));
      }
      CHECK(memcmp(a, b, sizeof(float) * (size_t)n) == 0, "call %d: the timeout changed the result", k);
    }
    CHECK_OK(plain, lowbit_comm_destroy(plain));
    CHECK_OK(timed, lowbit_comm_destroy(timed));
  }

  /* A late rank: compressed allreduce (bound), then the mean. */
  {
    lowbit_comm_t c = timed_comm();
    fill_normal(a, n, harness_seed(), (uint64_t)g_rank + 100, 1.0);
    lowbit_tensor_t ta = host_tensor(a, n);
    CHECK_OK(c, lowbit_comm_compressed_allreduce(c, &ta, NULL));
    late_rank(c, a, n, 0);
  }
  {
    lowbit_comm_t c = timed_comm();
    fill_normal(a, n, harness_seed(), (uint64_t)g_rank + 200, 1.0);
    late_rank(c, a, n, 1);
  }
  free(a);
  free(b);
  if (g_rank == 0) printf("timeouts: every rank returned, nothing changed\n");
  return harness_finish();
}
