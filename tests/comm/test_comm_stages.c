/* The 1-bit scheme over the caller's transports (lowbit_comm.h, "any
 * transport"): the codec stages and the callback transport give the
 * built-in MPI communicator's bits, call after call (outputs, worker and
 * server errors, saved error blobs), and refuse bad input changing nothing.
 * (comm.sim checks all three against the float64 simulation.) */
#include <math.h>
#include <string.h>

#include "comm_harness.h"
#include "comm_transports.h"

static void read_all(lowbit_comm_t c, int64_t n, float* w, float* s, int64_t sn) {
  CHECK_OK(c, lowbit_comm_read_errors(c, w, n, s, sn, NULL));
}

static uint64_t blob_hash(lowbit_comm_t c) {
  int64_t size = 0;
  CHECK_OK(c, lowbit_comm_save_errors(c, NULL, 0, &size, NULL));
  void* b = xmalloc((size_t)size);
  CHECK_OK(c, lowbit_comm_save_errors(c, b, size, &size, NULL));
  const uint64_t h = fnv64(b, (size_t)size);
  free(b);
  return h;
}

/* Three communicators, one per way, fed the same inputs for `calls` calls:
 * outputs, errors and blobs bit-identical after every call. */
static void same_bits(int64_t n, int calls, uint64_t tag) {
  lowbit_comm_t c[3];
  c[VIA_BUILTIN] = make_world_comm();
  c[VIA_STAGES] = make_world_comm();
  c[VIA_CALLBACKS] = make_callback_comm(MPI_COMM_WORLD, 1);
  int64_t sn = 0;
  float* x[3];
  float* w[3];
  float* s[3];
  for (int v = 0; v < 3; ++v) {
    x[v] = (float*)xmalloc(sizeof(float) * (size_t)n);
    w[v] = (float*)xmalloc(sizeof(float) * (size_t)n);
    s[v] = (float*)xmalloc(sizeof(float) * (size_t)n + 4);
  }
  for (int k = 0; k < calls; ++k) {
    fill_normal(x[0], n, harness_seed(), tag * 7919 + (uint64_t)k * 131 + (uint64_t)g_rank, 1.0 + g_rank);
    for (int v = 1; v < 3; ++v) memcpy(x[v], x[0], sizeof(float) * (size_t)n);
    for (int v = 0; v < 3; ++v) {
      lowbit_tensor_t t = host_tensor(x[v], n);
      CHECK_OK(c[v], via_allreduce((via_t)v, c[v], MPI_COMM_WORLD, &t));
    }
    CHECK_OK(c[0], lowbit_comm_error_numel(c[0], NULL, &sn));
    for (int v = 0; v < 3; ++v) read_all(c[v], n, w[v], s[v], sn);
    for (int v = 1; v < 3; ++v) {
      CHECK(memcmp(x[v], x[0], sizeof(float) * (size_t)n) == 0, "n %lld call %d: the output of %s differs from %s",
            (long long)n, k, via_name((via_t)v), via_name(VIA_BUILTIN));
      CHECK(memcmp(w[v], w[0], sizeof(float) * (size_t)n) == 0, "n %lld call %d: worker error of %s differs",
            (long long)n, k, via_name((via_t)v));
      CHECK(memcmp(s[v], s[0], sizeof(float) * (size_t)sn) == 0, "n %lld call %d: server error of %s differs",
            (long long)n, k, via_name((via_t)v));
      CHECK(blob_hash(c[v]) == blob_hash(c[0]), "n %lld call %d: saved errors of %s differ", (long long)n, k,
            via_name((via_t)v));
    }
  }
  /* the counters agree too */
  lowbit_comm_stats_t st[3];
  for (int v = 0; v < 3; ++v) {
    st[v].struct_size = sizeof st[v];
    CHECK_OK(c[v], lowbit_comm_get_stats(c[v], &st[v]));
  }
  for (int v = 1; v < 3; ++v)
    CHECK(st[v].compressed_calls == st[0].compressed_calls && st[v].compressed_bytes_sent == st[0].compressed_bytes_sent,
          "%s counted %lld calls / %lld bytes, built-in %lld / %lld", via_name((via_t)v),
          (long long)st[v].compressed_calls, (long long)st[v].compressed_bytes_sent, (long long)st[0].compressed_calls,
          (long long)st[0].compressed_bytes_sent);

  /* allreduce_mean through the callbacks equals MPI's */
  fill_normal(x[0], n, harness_seed(), tag + 99, 2.0);
  memcpy(x[2], x[0], sizeof(float) * (size_t)n);
  lowbit_tensor_t t0 = host_tensor(x[0], n), t2 = host_tensor(x[2], n);
  CHECK_OK(c[0], lowbit_comm_allreduce_mean(c[0], &t0, NULL));
  CHECK_OK(c[2], lowbit_comm_allreduce_mean(c[2], &t2, NULL));
  CHECK(memcmp(x[0], x[2], sizeof(float) * (size_t)n) == 0, "n %lld: allreduce_mean over callbacks differs",
        (long long)n);

  CHECK_OK(c[0], lowbit_comm_destroy(c[0]));
  CHECK_OK(c[1], lowbit_comm_destroy(c[1]));
  destroy_callback_comm(c[2]);
  for (int v = 0; v < 3; ++v) {
    free(x[v]);
    free(w[v]);
    free(s[v]);
  }
}

/* Bad arguments and out-of-order stages: a clear error, nothing changed. */
static void stage_errors(void) {
  lowbit_comm_t c = make_world_comm();
  const int64_t n = 1000;
  int64_t m = 0;
  CHECK_OK(c, lowbit_comm_stage_message_bytes(c, n, &m));
  const int64_t unit = 8 * (int64_t)g_world, padded = (n + unit - 1) / unit * unit;
  CHECK(m == 4 + padded / g_world / 8, "message bytes %lld, expected 4 + C/8 = %lld", (long long)m,
        (long long)(4 + padded / g_world / 8));
  CHECK_STATUS(c, lowbit_comm_stage_message_bytes(c, 0, &m), LOWBIT_ERROR_INVALID_ARGUMENT, "numel");
  CHECK_STATUS(c, lowbit_comm_stage_message_bytes(c, n, NULL), LOWBIT_ERROR_NULL_POINTER, "out_message_bytes");

  unsigned char* send = (unsigned char*)xmalloc((size_t)(g_world * m));
  unsigned char* recv = (unsigned char*)xmalloc((size_t)(g_world * m));
  unsigned char* gsend = (unsigned char*)xmalloc((size_t)m);
  unsigned char* grecv = (unsigned char*)xmalloc((size_t)(g_world * m));
  float* x = (float*)xmalloc(sizeof(float) * n);
  fill_normal(x, n, harness_seed(), 5, 1.0);
  lowbit_tensor_t t = host_tensor(x, n);
  const int64_t W = g_world;

  /* out of order: nothing compressed yet */
  CHECK_STATUS(c, lowbit_comm_stage_reduce(c, recv, W * m, gsend, m, NULL), LOWBIT_ERROR_INVALID_STATE,
               "lowbit_comm_stage_compress");
  CHECK_STATUS(c, lowbit_comm_stage_decode(c, grecv, W * m, &t, NULL), LOWBIT_ERROR_INVALID_STATE,
               "lowbit_comm_stage_reduce");
  /* buffers */
  CHECK_STATUS(c, lowbit_comm_stage_compress(c, &t, send, W * m - 1, NULL), LOWBIT_ERROR_BUFFER_TOO_SMALL,
               "send_bytes");
  CHECK_STATUS(c, lowbit_comm_stage_compress(c, &t, NULL, W * m, NULL), LOWBIT_ERROR_NULL_POINTER, "send");
  CHECK_STATUS(c, lowbit_comm_stage_compress(c, NULL, send, W * m, NULL), LOWBIT_ERROR_NULL_POINTER, "tensor");
  lowbit_tensor_t bad = t;
  bad.dtype = LOWBIT_DTYPE_BFLOAT16;
  CHECK_STATUS(c, lowbit_comm_stage_compress(c, &bad, send, W * m, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
               "tensor.dtype");
  lowbit_comm_info_t info;
  info.struct_size = sizeof info;
  CHECK_OK(c, lowbit_comm_get_info(c, &info));
  CHECK(info.bound_numel == 0, "a rejected compress bound the communicator (numel %lld)", (long long)info.bound_numel);

  CHECK_OK(c, lowbit_comm_stage_compress(c, &t, send, W * m, NULL));
  CHECK_STATUS(c, lowbit_comm_stage_decode(c, grecv, W * m, &t, NULL), LOWBIT_ERROR_INVALID_STATE,
               "lowbit_comm_stage_reduce");
  CHECK(MPI_Alltoall(send, (int)m, MPI_BYTE, recv, (int)m, MPI_BYTE, MPI_COMM_WORLD) == MPI_SUCCESS, "alltoall");
  CHECK_STATUS(c, lowbit_comm_stage_reduce(c, recv, W * m, gsend, m - 1, NULL), LOWBIT_ERROR_BUFFER_TOO_SMALL,
               "gsend_bytes");
  CHECK_STATUS(c, lowbit_comm_stage_reduce(c, recv, W * m - 1, gsend, m, NULL), LOWBIT_ERROR_BUFFER_TOO_SMALL,
               "recv_bytes");
  CHECK_OK(c, lowbit_comm_stage_reduce(c, recv, W * m, gsend, m, NULL));
  CHECK(MPI_Allgather(gsend, (int)m, MPI_BYTE, grecv, (int)m, MPI_BYTE, MPI_COMM_WORLD) == MPI_SUCCESS, "allgather");
  float* other = (float*)xmalloc(sizeof(float) * (n + 1));
  lowbit_tensor_t wrong = host_tensor(other, n + 1);
  CHECK_STATUS(c, lowbit_comm_stage_decode(c, grecv, W * m, &wrong, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
               "out.numel");
  /* the errors are still the committed ones (zero) until decode succeeds */
  float* w = (float*)xmalloc(sizeof(float) * n);
  CHECK_OK(c, lowbit_comm_read_errors(c, w, n, NULL, 0, NULL));
  for (int64_t i = 0; i < n; ++i) CHECK(w[i] == 0.0f, "worker error %lld changed before decode", (long long)i);
  /* decode out of place */
  lowbit_tensor_t out = host_tensor(other, n);
  CHECK_OK(c, lowbit_comm_stage_decode(c, grecv, W * m, &out, NULL));
  CHECK_OK(c, lowbit_comm_read_errors(c, w, n, NULL, 0, NULL));
  int nonzero = 0;
  for (int64_t i = 0; i < n; ++i) nonzero += w[i] != 0.0f;
  CHECK(nonzero > 0, "decode did not commit the worker error");
  /* a second decode needs a new sequence */
  CHECK_STATUS(c, lowbit_comm_stage_decode(c, grecv, W * m, &out, NULL), LOWBIT_ERROR_INVALID_STATE,
               "lowbit_comm_stage_reduce");
  /* a reset abandons a sequence */
  CHECK_OK(c, lowbit_comm_stage_compress(c, &t, send, W * m, NULL));
  CHECK_OK(c, lowbit_comm_reset_errors(c, NULL));
  CHECK_STATUS(c, lowbit_comm_stage_reduce(c, recv, W * m, gsend, m, NULL), LOWBIT_ERROR_INVALID_STATE,
               "lowbit_comm_stage_compress");

  CHECK_OK(c, lowbit_comm_destroy(c));
  free(send);
  free(recv);
  free(gsend);
  free(grecv);
  free(x);
  free(other);
  free(w);
}

/* A NaN on the last rank: every rank's decode fails, nothing changes. */
static void stage_nonfinite(void) {
  lowbit_comm_t c = make_world_comm();
  const int64_t n = 777;
  float* x = (float*)xmalloc(sizeof(float) * n);
  float* keep = (float*)xmalloc(sizeof(float) * n);
  float* w0 = (float*)xmalloc(sizeof(float) * n);
  float* w1 = (float*)xmalloc(sizeof(float) * n);
  fill_normal(x, n, harness_seed(), 11, 1.0);
  lowbit_tensor_t t = host_tensor(x, n);
  CHECK_OK(c, stages_allreduce(c, MPI_COMM_WORLD, &t)); /* non-zero errors to keep */
  CHECK_OK(c, lowbit_comm_read_errors(c, w0, n, NULL, 0, NULL));
  const uint64_t before = blob_hash(c);
  fill_normal(x, n, harness_seed(), 12, 1.0);
  if (g_rank == g_world - 1) x[n / 2] = NAN;
  memcpy(keep, x, sizeof(float) * n);
  CHECK_STATUS(c, stages_allreduce(c, MPI_COMM_WORLD, &t), LOWBIT_ERROR_NONFINITE, "not finite");
  int32_t nf = 0;
  CHECK_OK(c, lowbit_comm_last_nonfinite(c, &nf));
  CHECK(nf == 1, "last_nonfinite is %d after a non-finite stage sequence", nf);
  CHECK(memcmp(x, keep, sizeof(float) * n) == 0, "the tensor changed after a non-finite sequence");
  CHECK(blob_hash(c) == before, "the errors changed after a non-finite sequence");
  /* and the next finite call works and matches the built-in from the same errors */
  x[n / 2] = 0.5f;
  CHECK_OK(c, stages_allreduce(c, MPI_COMM_WORLD, &t));
  CHECK_OK(c, lowbit_comm_last_nonfinite(c, &nf));
  CHECK(nf == 0, "last_nonfinite is %d after a finite sequence", nf);
  CHECK_OK(c, lowbit_comm_read_errors(c, w1, n, NULL, 0, NULL));
  CHECK(memcmp(w0, w1, sizeof(float) * n) != 0, "the finite call did not update the errors");
  CHECK_OK(c, lowbit_comm_destroy(c));
  free(x);
  free(keep);
  free(w0);
  free(w1);
}

/* The callback transport: agreement, failures and validation. */
static void callback_checks(void) {
  const int64_t n = 300;
  float* x = (float*)xmalloc(sizeof(float) * (n + 8));
  float* keep = (float*)xmalloc(sizeof(float) * (n + 8));
  lowbit_comm_t c = make_callback_comm(MPI_COMM_WORLD, 1);
  lowbit_comm_info_t info;
  info.struct_size = sizeof info;
  CHECK_OK(c, lowbit_comm_get_info(c, &info));
  CHECK(info.backend == LOWBIT_COMM_BACKEND_CALLBACKS && info.rank == g_rank && info.world_size == g_world,
        "info: backend %d rank %d world %d", (int)info.backend, info.rank, info.world_size);

  /* argument agreement through allreduce_max_i64: another numel on rank 0 */
  if (g_world > 1) {
    fill_normal(x, n + 8, harness_seed(), 21, 1.0);
    lowbit_tensor_t t = host_tensor(x, g_rank == 0 ? n + 8 : n);
    CHECK_STATUS(c, lowbit_comm_compressed_allreduce(c, &t, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "numel");
  }
  /* a local failure on rank 0 (NULL tensor): its reason reaches every rank
   * through the transport's broadcast (built on allreduce_max_i64) */
  if (g_world > 1) {
    fill_normal(x, n, harness_seed(), 23, 1.0);
    lowbit_tensor_t t = host_tensor(x, n);
    if (g_rank == 0)
      CHECK_STATUS(c, lowbit_comm_compressed_allreduce(c, NULL, NULL), LOWBIT_ERROR_NULL_POINTER, "tensor is NULL");
    else
      CHECK_STATUS(c, lowbit_comm_compressed_allreduce(c, &t, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                   "rank 0 rejected its arguments: tensor is NULL");
  }
  /* a failing function: ERROR_COMMUNICATION naming it, tensor and errors kept.
   * Every rank fails its first call (the agreement), so none is left waiting. */
  fill_normal(x, n, harness_seed(), 22, 1.0);
  memcpy(keep, x, sizeof(float) * n);
  lowbit_tensor_t t = host_tensor(x, n);
  callback_comm_fail_at(c, 1);
  CHECK_STATUS(c, lowbit_comm_compressed_allreduce(c, &t, NULL), LOWBIT_ERROR_COMMUNICATION, "allreduce_max_i64");
  CHECK(memcmp(x, keep, sizeof(float) * n) == 0, "the tensor changed after a transport failure");
  callback_comm_fail_at(c, 2); /* the all-to-all, after the agreement */
  CHECK_STATUS(c, lowbit_comm_compressed_allreduce(c, &t, NULL), LOWBIT_ERROR_COMMUNICATION, "alltoall");
  CHECK(memcmp(x, keep, sizeof(float) * n) == 0, "the tensor changed after a failed alltoall");
  float* w = (float*)xmalloc(sizeof(float) * n);
  CHECK_OK(c, lowbit_comm_read_errors(c, w, n, NULL, 0, NULL));
  for (int64_t i = 0; i < n; ++i) CHECK(w[i] == 0.0f, "worker error %lld changed after a failed alltoall", (long long)i);
  /* then it works again */
  const long calls = callback_comm_calls(c);
  CHECK_OK(c, lowbit_comm_compressed_allreduce(c, &t, NULL));
  CHECK(callback_comm_calls(c) == calls + 3, "a compressed allreduce made %ld transport calls, expected 3 "
        "(agreement, all-to-all, all-gather)", callback_comm_calls(c) - calls);
  destroy_callback_comm(c);

  /* without allreduce_max_i64: no agreement, still the same bits (comm.sim) */
  c = make_callback_comm(MPI_COMM_WORLD, 0);
  const long c0 = callback_comm_calls(c);
  CHECK_OK(c, lowbit_comm_compressed_allreduce(c, &t, NULL));
  CHECK(callback_comm_calls(c) == c0 + 2, "without agreement a call made %ld transport calls, expected 2",
        callback_comm_calls(c) - c0);
  destroy_callback_comm(c);

  /* validation of the struct: nothing created */
  lowbit_comm_t out = (lowbit_comm_t)(uintptr_t)1;
  lowbit_comm_transport_t tr;
  memset(&tr, 0, sizeof tr);
  tr.struct_size = sizeof tr;
  CHECK_STATUS(NULL, lowbit_comm_create_transport(&out, NULL, NULL), LOWBIT_ERROR_NULL_POINTER, "transport");
  CHECK(out == NULL, "a failed create left *out non-NULL");
  tr.world_size = 0;
  CHECK_STATUS(NULL, lowbit_comm_create_transport(&out, &tr, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
               "transport.world_size");
  tr.world_size = 2;
  tr.rank = 2;
  CHECK_STATUS(NULL, lowbit_comm_create_transport(&out, &tr, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "transport.rank");
  tr.rank = 1;
  CHECK_STATUS(NULL, lowbit_comm_create_transport(&out, &tr, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
               "transport.host_buffers and transport.device_buffers");
  tr.host_buffers = 1;
  CHECK_STATUS(NULL, lowbit_comm_create_transport(&out, &tr, NULL), LOWBIT_ERROR_NULL_POINTER, "transport.alltoall");
  tr.struct_size = 8;
  CHECK_STATUS(NULL, lowbit_comm_create_transport(&out, &tr, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "transport");
  CHECK(out == NULL, "a failed create left *out non-NULL");
  free(x);
  free(keep);
  free(w);
}

int main(int argc, char** argv) {
  harness_init(&argc, &argv);
  const int64_t u = 8 * (int64_t)g_world;
  const int64_t sizes[] = {1, u - 1, u + 1, 4099, 70001};
  for (int i = 0; i < 5; ++i) same_bits(sizes[i], 4, (uint64_t)i + 1);
  if (g_rank == 0) printf("stages and callbacks give the built-in bits (5 sizes x 4 calls)\n");
  stage_errors();
  stage_nonfinite();
  callback_checks();
  if (g_rank == 0) printf("bad input, non-finite input and transport failures checked\n");
  return harness_finish();
}
