/* Error buffers as checkpoint state: save / restore / reset.
 *  - Saving after 3 calls and restoring (into the same communicator, bound,
 *    and into a fresh one, unbound: the errors wait for the first call)
 *    replays the next 3 calls bit for bit.
 *  - Reset gives the outputs of a fresh communicator, bit for bit, and lets
 *    the next call use another numel.
 *  - Sizes: error numel 0/0 unbound, n / real-in-chunk when bound; save with
 *    buffer NULL gives the size; a short buffer is BUFFER_TOO_SMALL.
 *  - Bad blobs are rejected with nothing changed: truncated, bad magic,
 *    checksum, version, another rank's blob, another world size, trailing
 *    bytes, a non-finite value (with a valid checksum), non-zero reserved
 *    bytes (each of the 8, with or without a matching checksum).
 *  - The checksum covers the whole blob (header included, its own 8 bytes
 *    read as 0); a version-1 blob (checksum of the payload only) still loads.
 *  - Loading a blob of another numel unbinds: a call with the old numel is
 *    then INVALID_ARGUMENT on every rank, one with the blob's numel works. */
#include <math.h>
#include <string.h>

#include "comm_harness.h"

static const int64_t N1 = 777, N2 = 130;

static unsigned char* save(lowbit_comm_t comm, int64_t* size) {
  CHECK_OK(comm, lowbit_comm_save_errors(comm, NULL, 0, size, NULL));
  unsigned char* b = (unsigned char*)xmalloc((size_t)*size);
  int64_t got = -1;
  CHECK_OK(comm, lowbit_comm_save_errors(comm, b, *size, &got, NULL));
  CHECK(got == *size, "save wrote %lld, announced %lld", (long long)got, (long long)*size);
  return b;
}

/* Runs `calls` calls with inputs (tag, k) and returns all outputs. */
static float* run_calls(lowbit_comm_t comm, int64_t n, int calls, uint64_t tag) {
  float* outs = (float*)xmalloc(sizeof(float) * (size_t)(n * calls));
  for (int k = 0; k < calls; ++k) {
    float* x = outs + (int64_t)k * n;
    fill_normal(x, n, harness_seed(), tag * 1000 + (uint64_t)k * 16 + (uint64_t)g_rank, 1.0 + g_rank);
    lowbit_tensor_t t = host_tensor(x, n);
    CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &t, NULL));
  }
  return outs;
}

static void expect_load_fails(lowbit_comm_t comm, const unsigned char* blob, int64_t size, lowbit_status_t want,
                              const char* needle) {
  int64_t s0 = 0, s1 = 0;
  unsigned char* before = save(comm, &s0);
  CHECK_STATUS(comm, lowbit_comm_load_errors(comm, blob, size, NULL), want, needle);
  unsigned char* after = save(comm, &s1);
  CHECK(s0 == s1 && memcmp(before, after, (size_t)s0) == 0, "a rejected load (%s) changed the errors", needle);
  free(before);
  free(after);
}

int main(int argc, char** argv) {
  harness_init(&argc, &argv);
  const int W = g_world;
  lowbit_comm_t a = make_world_comm();
  const sim_layout_t l = sim_layout(N1, W);

  int64_t wn = -1, sn = -1, size = 0;
  CHECK_OK(a, lowbit_comm_error_numel(a, &wn, &sn));
  CHECK(wn == 0 && sn == 0, "fresh communicator: error numel %lld/%lld", (long long)wn, (long long)sn);
  unsigned char* empty = save(a, &size);
  CHECK(size == 64, "an unbound communicator saves a bare 64-byte header, got %lld", (long long)size);
  free(empty);

  float* warm = run_calls(a, N1, 3, 1);
  CHECK_OK(a, lowbit_comm_error_numel(a, &wn, &sn));
  CHECK(wn == N1 && sn == sim_real_in_chunk(&l, g_rank), "bound: error numel %lld/%lld", (long long)wn, (long long)sn);
  int64_t blob_size = 0;
  unsigned char* blob = save(a, &blob_size);
  CHECK(blob_size == 64 + 4 * (wn + sn), "blob size %lld", (long long)blob_size);
  {
    unsigned char small[32];
    int64_t got = 0;
    CHECK_STATUS(a, lowbit_comm_save_errors(a, small, sizeof small, &got, NULL), LOWBIT_ERROR_BUFFER_TOO_SMALL,
                 "capacity");
  }
  float* ref = run_calls(a, N1, 3, 2);

  /* Restore into the same (bound) communicator: identical replay. */
  CHECK_OK(a, lowbit_comm_load_errors(a, blob, blob_size, NULL));
  float* again = run_calls(a, N1, 3, 2);
  CHECK(memcmp(ref, again, sizeof(float) * (size_t)(3 * N1)) == 0, "replay after restoring into the same communicator differs");

  /* Restore into a fresh, unbound communicator. */
  lowbit_comm_t b = make_world_comm();
  CHECK_OK(b, lowbit_comm_load_errors(b, blob, blob_size, NULL));
  CHECK_OK(b, lowbit_comm_error_numel(b, &wn, &sn));
  CHECK(wn == N1, "pending errors: worker numel %lld", (long long)wn);
  int64_t size_b = 0;
  unsigned char* blob_b = save(b, &size_b);
  CHECK(size_b == blob_size && memcmp(blob_b, blob, (size_t)size_b) == 0, "pending errors do not save back identically");
  free(blob_b);
  float* fresh = run_calls(b, N1, 3, 2);
  CHECK(memcmp(ref, fresh, sizeof(float) * (size_t)(3 * N1)) == 0, "replay in a fresh communicator differs");

  /* Reset = a fresh communicator; the next call may use another numel. */
  CHECK_OK(a, lowbit_comm_reset_errors(a, NULL));
  CHECK_OK(a, lowbit_comm_error_numel(a, &wn, &sn));
  CHECK(wn == 0 && sn == 0, "after reset: error numel %lld/%lld", (long long)wn, (long long)sn);
  float* after_reset = run_calls(a, N1, 2, 3);
  lowbit_comm_t c = make_world_comm();
  float* from_fresh = run_calls(c, N1, 2, 3);
  CHECK(memcmp(after_reset, from_fresh, sizeof(float) * (size_t)(2 * N1)) == 0, "reset differs from a fresh communicator");
  CHECK_OK(a, lowbit_comm_reset_errors(a, NULL));
  float* other = run_calls(a, N2, 1, 4);
  free(other);
  CHECK_OK(a, lowbit_comm_error_numel(a, &wn, &sn));
  CHECK(wn == N2, "after reset and a call with numel %lld: error numel %lld", (long long)N2, (long long)wn);

  /* Bad blobs (into c, bound to N1). */
  unsigned char* bad = (unsigned char*)xmalloc((size_t)blob_size + 8);
  expect_load_fails(c, blob, 40, LOWBIT_ERROR_CORRUPT_DATA, "header");
  expect_load_fails(c, blob, blob_size - 3, LOWBIT_ERROR_CORRUPT_DATA, "truncated");
  memcpy(bad, blob, (size_t)blob_size);
  bad[blob_size] = 0;
  expect_load_fails(c, bad, blob_size + 1, LOWBIT_ERROR_CORRUPT_DATA, "more than");
  memcpy(bad, blob, (size_t)blob_size);
  bad[0] = 'X';
  expect_load_fails(c, bad, blob_size, LOWBIT_ERROR_CORRUPT_DATA, "LBCOMMER");
  memcpy(bad, blob, (size_t)blob_size);
  bad[64 + 5] ^= 0x10;
  expect_load_fails(c, bad, blob_size, LOWBIT_ERROR_CORRUPT_DATA, "checksum");
  memcpy(bad, blob, (size_t)blob_size);
  bad[8] = 4; /* 3 is the compact errors' version (test_comm_error_format) */
  expect_load_fails(c, bad, blob_size, LOWBIT_ERROR_VERSION_MISMATCH, "version");
  /* The reserved bytes 56..63: any non-zero byte is refused, whether the
   * checksum was left alone or recomputed to match. */
  for (int k = 56; k < 64; ++k) {
    memcpy(bad, blob, (size_t)blob_size);
    bad[k] ^= (unsigned char)(1u << (k % 8));
    expect_load_fails(c, bad, blob_size, LOWBIT_ERROR_CORRUPT_DATA, "reserved");
    error_blob_fix_checksum(bad, blob_size);
    expect_load_fails(c, bad, blob_size, LOWBIT_ERROR_CORRUPT_DATA, "reserved");
  }
  /* Version 2: reserved bytes 0, the checksum over the whole blob. */
  {
    uint32_t version = 0;
    memcpy(&version, blob + 8, 4);
    CHECK(version == 2, "saved blob has version %u", version);
    uint64_t sum = 0, reserved = 1;
    memcpy(&sum, blob + 48, 8);
    memcpy(&reserved, blob + 56, 8);
    CHECK(reserved == 0, "saved blob has reserved bytes 0x%llx", (unsigned long long)reserved);
    CHECK(sum == error_blob_checksum(blob, blob_size), "the checksum does not cover the whole blob");
  }
  /* A flipped checksum byte. */
  memcpy(bad, blob, (size_t)blob_size);
  bad[48] ^= 1;
  expect_load_fails(c, bad, blob_size, LOWBIT_ERROR_CORRUPT_DATA, "checksum");
  /* Version 1 (checksum of the payload only) still loads, and replays the
   * same; with non-zero reserved bytes it is refused too. */
  {
    unsigned char* v1 = (unsigned char*)xmalloc((size_t)blob_size);
    memcpy(v1, blob, (size_t)blob_size);
    const uint32_t one = 1;
    memcpy(v1 + 8, &one, 4);
    const uint64_t h = fnv64(v1 + 64, (size_t)(blob_size - 64));
    memcpy(v1 + 48, &h, 8);
    memcpy(bad, v1, (size_t)blob_size);
    bad[60] = 0x5a;
    expect_load_fails(c, bad, blob_size, LOWBIT_ERROR_CORRUPT_DATA, "reserved");
    lowbit_comm_t e = make_world_comm();
    CHECK_OK(e, lowbit_comm_load_errors(e, v1, blob_size, NULL));
    float* from_v1 = run_calls(e, N1, 3, 2);
    CHECK(memcmp(ref, from_v1, sizeof(float) * (size_t)(3 * N1)) == 0, "replay from a version-1 blob differs");
    free(from_v1);
    free(v1);
    CHECK_OK(e, lowbit_comm_destroy(e));
  }
  memcpy(bad, blob, (size_t)blob_size);
  {
    const float nan = NAN;
    memcpy(bad + 64 + 4 * 3, &nan, 4);
    error_blob_fix_checksum(bad, blob_size);
  }
  expect_load_fails(c, bad, blob_size, LOWBIT_ERROR_CORRUPT_DATA, "not finite");
  expect_load_fails(c, NULL, blob_size, LOWBIT_ERROR_NULL_POINTER, "buffer");
  if (W > 1) {
    /* The next rank's blob (same size only if both serve the same count). */
    const int to = (g_rank + 1) % W, from = (g_rank + W - 1) % W;
    int64_t other_size = 0;
    MPI_Sendrecv(&blob_size, 1, MPI_INT64_T, to, 0, &other_size, 1, MPI_INT64_T, from, 0, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    unsigned char* theirs = (unsigned char*)xmalloc((size_t)other_size);
    MPI_Sendrecv(blob, (int)blob_size, MPI_BYTE, to, 1, theirs, (int)other_size, MPI_BYTE, from, 1, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    expect_load_fails(c, theirs, other_size, LOWBIT_ERROR_STATE_MISMATCH, "saved by rank");
    free(theirs);
    /* A blob from a world of 1 (each rank alone). */
    MPI_Comm self;
    MPI_Comm_split(MPI_COMM_WORLD, g_rank, 0, &self);
    lowbit_comm_t alone = NULL;
    CHECK_OK(alone, lowbit_comm_create_mpi(&alone, &self, NULL));
    float* o = run_calls(alone, N1, 1, 5);
    free(o);
    int64_t s1 = 0;
    unsigned char* b1 = save(alone, &s1);
    expect_load_fails(c, b1, s1, LOWBIT_ERROR_STATE_MISMATCH, "world size");
    free(b1);
    CHECK_OK(alone, lowbit_comm_destroy(alone));
    MPI_Comm_free(&self);
  }

  /* A blob of another numel unbinds c; the old numel is then refused on
   * every rank, the blob's numel accepted. */
  lowbit_comm_t d = make_world_comm();
  float* od = run_calls(d, N2, 2, 6);
  free(od);
  int64_t sd = 0;
  unsigned char* blob_n2 = save(d, &sd);
  CHECK_OK(c, lowbit_comm_load_errors(c, blob_n2, sd, NULL));
  {
    float* x = (float*)xmalloc(sizeof(float) * (size_t)N1);
    fill_normal(x, N1, harness_seed(), 99, 1.0);
    lowbit_tensor_t t = host_tensor(x, N1);
    CHECK_STATUS(c, lowbit_comm_compressed_allreduce(c, &t, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "loaded");
    free(x);
  }
  float* r_c = run_calls(c, N2, 2, 7);
  float* r_d = run_calls(d, N2, 2, 7);
  CHECK(memcmp(r_c, r_d, sizeof(float) * (size_t)(2 * N2)) == 0,
        "a communicator restored from another's blob does not continue like it");

  if (g_rank == 0) printf("save/restore/reset and %d kinds of bad blob checked\n", W > 1 ? 10 : 8);
  free(r_c);
  free(r_d);
  free(blob_n2);
  free(bad);
  free(blob);
  free(warm);
  free(ref);
  free(again);
  free(fresh);
  free(after_reset);
  free(from_fresh);
  CHECK_OK(a, lowbit_comm_destroy(a));
  CHECK_OK(b, lowbit_comm_destroy(b));
  CHECK_OK(c, lowbit_comm_destroy(c));
  CHECK_OK(d, lowbit_comm_destroy(d));
  return harness_finish();
}
