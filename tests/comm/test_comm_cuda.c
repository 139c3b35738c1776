/* The CUDA paths of the communicator (skipped, exit 77, without a GPU):
 *  - MPI with CUDA tensors, both CUDA-aware (when the MPI is) and staged
 *    through pinned host memory: every call against the float64 simulation
 *    (as test_comm_sim, with the library's errors read back each call) and
 *    against the host path on the same inputs, whose output and errors it
 *    must equal bit for bit (the same operations in the same order, sums of
 *    squares included: comm/sumsq.hpp); outputs bit-identical across ranks;
 *    a user stream;
 *  - non-finite input on one rank: the call returns LOWBIT_SUCCESS (the check
 *    is on the device), and after the stream is synchronised
 *    lowbit_comm_last_nonfinite() is 1 on every rank with the tensor and the
 *    errors unchanged; the next finite call is applied;
 *  - allreduce_mean of CUDA tensors against the exact mean;
 *  - device mismatch (bound to CUDA, called with a host tensor; host memory
 *    labelled CUDA) is refused with a message;
 *  - the same simulation and host-twin checks through the codec stages with
 *    device message buffers (the test moves the messages: device -> host ->
 *    MPI -> device), and through a callback transport with host buffers
 *    (lowbit stages CUDA tensors through pinned memory);
 *  - NCCL (when built and loadable, and with one GPU per rank): the same
 *    simulation check, with the unique id broadcast over MPI. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <string.h>

#include "comm_harness.h"
#include "comm_transports.h"

#define CUDA_OK(call)                                                                              \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    CHECK(e_ == cudaSuccess, "%s failed: %s", #call, cudaGetErrorString(e_));                      \
  } while (0)

static int g_device = 0;
static cudaStream_t g_stream = NULL;

static unsigned char* save(lowbit_comm_t comm, int64_t* size);

/* sim_check's calls: the built-in call, or the codec stages on device buffers. */
static int g_use_stages = 0;

/* One MPI exchange of device messages through host copies. */
static void dev_exchange(int gather, const void* dsend, void* drecv, int64_t m) {
  const size_t sb = (size_t)(gather ? m : m * g_world), rb = (size_t)(m * g_world);
  unsigned char* hs = (unsigned char*)xmalloc(sb);
  unsigned char* hr = (unsigned char*)xmalloc(rb);
  CUDA_OK(cudaMemcpyAsync(hs, dsend, sb, cudaMemcpyDeviceToHost, g_stream));
  CUDA_OK(cudaStreamSynchronize(g_stream));
  if (gather)
    CHECK(MPI_Allgather(hs, (int)m, MPI_BYTE, hr, (int)m, MPI_BYTE, MPI_COMM_WORLD) == MPI_SUCCESS, "allgather");
  else
    CHECK(MPI_Alltoall(hs, (int)m, MPI_BYTE, hr, (int)m, MPI_BYTE, MPI_COMM_WORLD) == MPI_SUCCESS, "alltoall");
  CUDA_OK(cudaMemcpyAsync(drecv, hr, rb, cudaMemcpyHostToDevice, g_stream));
  CUDA_OK(cudaStreamSynchronize(g_stream));
  free(hs);
  free(hr);
}

static lowbit_status_t dev_stages_allreduce(lowbit_comm_t comm, const lowbit_tensor_t* t) {
  int64_t m = 0;
  CHECK_OK(comm, lowbit_comm_stage_message_bytes(comm, t->numel, &m));
  const int64_t W = g_world;
  unsigned char *send = NULL, *recv = NULL, *gsend = NULL, *grecv = NULL;
  CUDA_OK(cudaMalloc((void**)&send, (size_t)(W * m)));
  CUDA_OK(cudaMalloc((void**)&recv, (size_t)(W * m)));
  CUDA_OK(cudaMalloc((void**)&gsend, (size_t)m));
  CUDA_OK(cudaMalloc((void**)&grecv, (size_t)(W * m)));
  CHECK_OK(comm, lowbit_comm_stage_compress(comm, t, send, W * m, g_stream));
  dev_exchange(0, send, recv, m);
  CHECK_OK(comm, lowbit_comm_stage_reduce(comm, recv, W * m, gsend, m, g_stream));
  dev_exchange(1, gsend, grecv, m);
  const lowbit_status_t st = lowbit_comm_stage_decode(comm, grecv, W * m, t, g_stream);
  CUDA_OK(cudaStreamSynchronize(g_stream));
  CUDA_OK(cudaFree(send));
  CUDA_OK(cudaFree(recv));
  CUDA_OK(cudaFree(gsend));
  CUDA_OK(cudaFree(grecv));
  return st;
}

static lowbit_tensor_t dev_tensor(float* d, int64_t n) {
  lowbit_tensor_t t = host_tensor(d, n);
  t.device = LOWBIT_DEVICE_CUDA;
  t.device_index = g_device;
  return t;
}

/* calls on `comm` with CUDA tensors, each checked against the simulation */
static void sim_check(lowbit_comm_t comm, int64_t n, int calls, uint64_t tag, lowbit_comm_t host_twin) {
  int32_t crank = 0, W = 0;
  CHECK_OK(comm, lowbit_comm_rank(comm, &crank));
  CHECK_OK(comm, lowbit_comm_world_size(comm, &W));
  CHECK_OK(comm, lowbit_comm_reset_errors(comm, g_stream));
  if (host_twin) CHECK_OK(host_twin, lowbit_comm_reset_errors(host_twin, NULL));
  const sim_layout_t l = sim_layout(n, W);
  float** in = (float**)xmalloc(sizeof(float*) * (size_t)W);
  double** werr = (double**)xmalloc(sizeof(double*) * (size_t)W);
  double** serr = (double**)xmalloc(sizeof(double*) * (size_t)W);
  for (int j = 0; j < W; ++j) {
    in[j] = (float*)xmalloc(sizeof(float) * (size_t)n);
    werr[j] = (double*)xmalloc(sizeof(double) * (size_t)n);
    serr[j] = (double*)xmalloc(sizeof(double) * (size_t)(l.chunk + 1));
    memset(werr[j], 0, sizeof(double) * (size_t)n);
    memset(serr[j], 0, sizeof(double) * (size_t)(l.chunk + 1));
  }
  float* d = NULL;
  CUDA_OK(cudaMalloc((void**)&d, sizeof(float) * (size_t)n));
  float* got = (float*)xmalloc(sizeof(float) * (size_t)n);
  float* twin = (float*)xmalloc(sizeof(float) * (size_t)n);
  double* out = (double*)xmalloc(sizeof(double) * (size_t)n);
  unsigned char* amb = (unsigned char*)xmalloc((size_t)n);
  double* S = (double*)xmalloc(sizeof(double) * (size_t)W);
  for (int k = 0; k < calls; ++k) {
    for (int j = 0; j < W; ++j) fill_normal(in[j], n, harness_seed(), tag * 977 + (uint64_t)k * 16 + (uint64_t)j, 1.0 + j);
    if (k > 0) gather_errors(comm, &l, werr, serr);
    CUDA_OK(cudaMemcpyAsync(d, in[crank], sizeof(float) * (size_t)n, cudaMemcpyHostToDevice, g_stream));
    lowbit_tensor_t t = dev_tensor(d, n);
    if (g_use_stages)
      CHECK_OK(comm, dev_stages_allreduce(comm, &t));
    else
      CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &t, g_stream));
    CUDA_OK(cudaMemcpyAsync(got, d, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost, g_stream));
    CUDA_OK(cudaStreamSynchronize(g_stream));
    int32_t nf = -1;
    CHECK_OK(comm, lowbit_comm_last_nonfinite(comm, &nf));
    CHECK(nf == 0, "CUDA: last_nonfinite %d after a finite call", nf);
    sim_step(&l, in, werr, serr, out, amb, S, NULL);
    for (int64_t i = 0; i < n; ++i) {
      const double s = S[i / l.chunk];
      if (amb[i])
        CHECK(fabs(fabs((double)got[i]) - s) <= 1e-5 * s, "CUDA n %lld call %d: ambiguous element %lld is %g", (long long)n,
              k, (long long)i, (double)got[i]);
      else
        CHECK(fabs((double)got[i] - out[i]) <= 1e-5 * s + 1e-30, "CUDA n %lld call %d: element %lld is %.9g, simulation %.9g",
              (long long)n, k, (long long)i, (double)got[i], out[i]);
    }
    check_same_on_all_ranks(fnv64(got, sizeof(float) * (size_t)n), "the CUDA output");
    if (host_twin) {
      memcpy(twin, in[crank], sizeof(float) * (size_t)n);
      lowbit_tensor_t h = host_tensor(twin, n);
      CHECK_OK(host_twin, lowbit_comm_compressed_allreduce(host_twin, &h, NULL));
      for (int64_t i = 0; i < n; ++i)
        CHECK(memcmp(&twin[i], &got[i], sizeof(float)) == 0,
              "CUDA vs host n %lld call %d: element %lld %.9g vs %.9g (not the same bits)", (long long)n, k,
              (long long)i, (double)got[i], (double)twin[i]);
      int64_t sd = 0, sh = 0;
      unsigned char* ed = save(comm, &sd);
      unsigned char* eh = save(host_twin, &sh);
      CHECK(sd == sh && memcmp(ed, eh, (size_t)sd) == 0,
            "CUDA vs host n %lld call %d: the worker and server errors are not the same bits", (long long)n, k);
      free(ed);
      free(eh);
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
  free(got);
  free(twin);
  free(out);
  free(amb);
  free(S);
  CUDA_OK(cudaFree(d));
}

static unsigned char* save(lowbit_comm_t comm, int64_t* size) {
  CHECK_OK(comm, lowbit_comm_save_errors(comm, NULL, 0, size, g_stream));
  unsigned char* b = (unsigned char*)xmalloc((size_t)*size);
  CHECK_OK(comm, lowbit_comm_save_errors(comm, b, *size, size, g_stream));
  return b;
}

static void nonfinite_check(lowbit_comm_t comm, int64_t n) {
  CHECK_OK(comm, lowbit_comm_reset_errors(comm, g_stream)); /* unbinds the numel of the calls before */
  float* d = NULL;
  CUDA_OK(cudaMalloc((void**)&d, sizeof(float) * (size_t)n));
  float* x = (float*)xmalloc(sizeof(float) * (size_t)n);
  float* back = (float*)xmalloc(sizeof(float) * (size_t)n);
  fill_normal(x, n, harness_seed(), 5000 + (uint64_t)g_rank, 1.0);
  CUDA_OK(cudaMemcpy(d, x, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
  lowbit_tensor_t t = dev_tensor(d, n);
  CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &t, g_stream)); /* some history */
  for (int bad = 0; bad < g_world; ++bad) {
    fill_normal(x, n, harness_seed(), 6000 + (uint64_t)(bad * 64 + g_rank), 1.0);
    if (g_rank == bad) x[n / 2] = NAN;
    CUDA_OK(cudaMemcpy(d, x, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    int64_t s0 = 0, s1 = 0;
    unsigned char* before = save(comm, &s0);
    CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &t, g_stream)); /* enqueued */
    CUDA_OK(cudaStreamSynchronize(g_stream));
    int32_t nf = 0;
    CHECK_OK(comm, lowbit_comm_last_nonfinite(comm, &nf));
    CHECK(nf == 1, "CUDA: NaN on rank %d not reported (last_nonfinite %d)", bad, nf);
    CUDA_OK(cudaMemcpy(back, d, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost));
    CHECK(memcmp(back, x, sizeof(float) * (size_t)n) == 0, "CUDA: the tensor changed on a non-finite call");
    unsigned char* after = save(comm, &s1);
    CHECK(s0 == s1 && memcmp(before, after, (size_t)s0) == 0, "CUDA: the errors changed on a non-finite call");
    free(before);
    free(after);
  }
  fill_normal(x, n, harness_seed(), 7000 + (uint64_t)g_rank, 1.0);
  CUDA_OK(cudaMemcpy(d, x, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
  CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &t, g_stream));
  CUDA_OK(cudaStreamSynchronize(g_stream));
  int32_t nf = -1;
  CHECK_OK(comm, lowbit_comm_last_nonfinite(comm, &nf));
  CHECK(nf == 0, "CUDA: finite call after a non-finite one reports %d", nf);
  /* Device mismatch: bound to CUDA, a host tensor is refused (NCCL refuses
   * host tensors altogether). */
  lowbit_comm_info_t info;
  info.struct_size = sizeof info;
  CHECK_OK(comm, lowbit_comm_get_info(comm, &info));
  lowbit_tensor_t h = host_tensor(x, n);
  if (info.backend == LOWBIT_COMM_BACKEND_MPI)
    CHECK_STATUS(comm, lowbit_comm_compressed_allreduce(comm, &h, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, "live on");
  else
    CHECK_STATUS(comm, lowbit_comm_compressed_allreduce(comm, &h, NULL), LOWBIT_ERROR_UNSUPPORTED, "CUDA tensors only");
  /* Host memory labelled CUDA. */
  lowbit_tensor_t lie = dev_tensor(x, n);
  CHECK_STATUS(comm, lowbit_comm_compressed_allreduce(comm, &lie, g_stream), LOWBIT_ERROR_INVALID_ARGUMENT,
               "host memory");
  free(x);
  free(back);
  CUDA_OK(cudaFree(d));
}

static void mean_check(lowbit_comm_t comm, int64_t n) {
  float* x = (float*)xmalloc(sizeof(float) * (size_t)n);
  float* other = (float*)xmalloc(sizeof(float) * (size_t)n);
  double* exact = (double*)xmalloc(sizeof(double) * (size_t)n);
  memset(exact, 0, sizeof(double) * (size_t)n);
  double amax = 0.0;
  for (int j = 0; j < g_world; ++j) {
    fill_normal(other, n, harness_seed(), 8000 + (uint64_t)j, 1.0);
    for (int64_t i = 0; i < n; ++i) {
      exact[i] += (double)other[i] / g_world;
      amax = fmax(amax, fabs((double)other[i]));
    }
  }
  fill_normal(x, n, harness_seed(), 8000 + (uint64_t)g_rank, 1.0);
  float* d = NULL;
  CUDA_OK(cudaMalloc((void**)&d, sizeof(float) * (size_t)n));
  CUDA_OK(cudaMemcpy(d, x, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
  lowbit_tensor_t t = dev_tensor(d, n);
  CHECK_OK(comm, lowbit_comm_allreduce_mean(comm, &t, g_stream));
  CUDA_OK(cudaStreamSynchronize(g_stream));
  CUDA_OK(cudaMemcpy(x, d, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < n; ++i)
    CHECK(fabs((double)x[i] - exact[i]) <= (g_world + 2) * ldexp(1.0, -24) * amax, "CUDA mean: element %lld %.9g vs %.9g",
          (long long)i, (double)x[i], exact[i]);
  check_same_on_all_ranks(fnv64(x, sizeof(float) * (size_t)n), "the CUDA mean");
  free(x);
  free(other);
  free(exact);
  CUDA_OK(cudaFree(d));
}

int main(int argc, char** argv) {
  harness_init(&argc, &argv);
  int count = 0;
  if (!lowbit_has_cuda() || cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    if (g_rank == 0) printf("SKIP: %s\n", lowbit_has_cuda() ? "no CUDA device" : "lowbit built without CUDA");
    MPI_Finalize();
    return 77;
  }
  g_device = g_rank % count;
  CUDA_OK(cudaSetDevice(g_device));
  CUDA_OK(cudaStreamCreate(&g_stream));
  const int64_t u = 8 * (int64_t)g_world;
  const int64_t sizes[] = {1, u - 1, u + 1, 1001, (1 << 20) + 7};

  lowbit_comm_config_t cfg;
  CHECK_OK(NULL, lowbit_comm_config_init(&cfg));
  for (int mode = 0; mode < 2; ++mode) {
    cfg.cuda_aware_mpi = mode == 0 ? LOWBIT_COMM_CUDA_AWARE_AUTO : LOWBIT_COMM_CUDA_AWARE_NEVER;
    MPI_Comm w = MPI_COMM_WORLD;
    lowbit_comm_t comm = NULL, host = NULL;
    CHECK_OK(comm, lowbit_comm_create_mpi(&comm, &w, &cfg));
    CHECK_OK(host, lowbit_comm_create_mpi(&host, &w, NULL));
    lowbit_comm_info_t info;
    info.struct_size = sizeof info;
    CHECK_OK(comm, lowbit_comm_get_info(comm, &info));
    if (g_rank == 0) printf("MPI, CUDA tensors, %s:\n", info.cuda_aware_mpi ? "CUDA-aware" : "staged through pinned memory");
    for (int s = 0; s < 5; ++s) sim_check(comm, sizes[s], 3, (uint64_t)(mode * 10 + s), host);
    nonfinite_check(comm, 4099);
    mean_check(comm, (1 << 16) + 3);
    CHECK_OK(comm, lowbit_comm_destroy(comm));
    CHECK_OK(host, lowbit_comm_destroy(host));
  }

  {
    MPI_Comm w = MPI_COMM_WORLD;
    lowbit_comm_t comm = NULL, host = NULL;
    CHECK_OK(comm, lowbit_comm_create_mpi(&comm, &w, NULL));
    CHECK_OK(host, lowbit_comm_create_mpi(&host, &w, NULL));
    if (g_rank == 0) printf("codec stages, CUDA tensors and device message buffers:\n");
    g_use_stages = 1;
    for (int s = 0; s < 4; ++s) sim_check(comm, sizes[s], 3, (uint64_t)(20 + s), host);
    g_use_stages = 0;
    CHECK_OK(comm, lowbit_comm_destroy(comm));
    lowbit_comm_t cb = make_callback_comm(MPI_COMM_WORLD, 1);
    if (g_rank == 0) printf("callback transport with host buffers, CUDA tensors (staged):\n");
    for (int s = 0; s < 4; ++s) sim_check(cb, sizes[s], 3, (uint64_t)(30 + s), host);
    mean_check(cb, (1 << 16) + 3);
    destroy_callback_comm(cb);
    CHECK_OK(host, lowbit_comm_destroy(host));
  }

  /* Errors in bf16 / 8-bit blocks (config.error_format) are host-only: a
   * CUDA tensor is refused on every rank (UNSUPPORTED), nothing bound, and
   * the host tensors of the same communicator still work; NCCL refuses the
   * formats at creation. */
  for (int f = LOWBIT_COMM_ERROR_BF16; f <= LOWBIT_COMM_ERROR_INT8; ++f) {
    lowbit_comm_config_t cc;
    CHECK_OK(NULL, lowbit_comm_config_init(&cc));
    cc.error_format = f;
    MPI_Comm w = MPI_COMM_WORLD;
    lowbit_comm_t comm = NULL;
    CHECK_OK(comm, lowbit_comm_create_mpi(&comm, &w, &cc));
    float* d = NULL;
    CUDA_OK(cudaMalloc((void**)&d, sizeof(float) * 64));
    CUDA_OK(cudaMemset(d, 0, sizeof(float) * 64));
    lowbit_tensor_t t = dev_tensor(d, 64);
    CHECK_STATUS(comm, lowbit_comm_compressed_allreduce(comm, &t, g_stream), LOWBIT_ERROR_UNSUPPORTED,
                 "CUDA tensors take LOWBIT_COMM_ERROR_FP32 only");
    int64_t wn = -1, sn = -1;
    CHECK_OK(comm, lowbit_comm_error_numel(comm, &wn, &sn));
    CHECK(wn == 0, "a refused CUDA call bound the errors");
    float x[64];
    for (int i = 0; i < 64; ++i) x[i] = (float)(i - 31);
    lowbit_tensor_t h = host_tensor(x, 64);
    CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &h, NULL));
    CUDA_OK(cudaFree(d));
    CHECK_OK(comm, lowbit_comm_destroy(comm));
    lowbit_comm_t nc = (lowbit_comm_t)1;
    unsigned char fake[LOWBIT_NCCL_UNIQUE_ID_BYTES] = {0};
    CHECK_STATUS(NULL, lowbit_comm_create_nccl(&nc, fake, g_rank, g_world, g_device, &cc), LOWBIT_ERROR_UNSUPPORTED,
                 "fp32 only");
    CHECK(nc == NULL, "a refused NCCL creation left a handle");
  }

  /* NCCL: one GPU per rank. */
  unsigned char id[LOWBIT_NCCL_UNIQUE_ID_BYTES];
  int have = 0;
  if (g_rank == 0) have = lowbit_comm_nccl_unique_id(id, sizeof id) == LOWBIT_SUCCESS;
  MPI_Bcast(&have, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!have || count < g_world) {
    if (g_rank == 0)
      printf("NCCL: not tested (%s)\n", !have ? lowbit_last_error() : "fewer GPUs than ranks");
  } else {
    MPI_Bcast(id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    lowbit_comm_t nc = NULL;
    CHECK_OK(nc, lowbit_comm_create_nccl(&nc, id, g_rank, g_world, g_device, NULL));
    int32_t r = -1;
    CHECK_OK(nc, lowbit_comm_rank(nc, &r));
    CHECK(r == g_rank, "NCCL rank %d", r);
    if (g_rank == 0) printf("NCCL, %d rank(s):\n", g_world);
    for (int s = 0; s < 5; ++s) sim_check(nc, sizes[s], 3, (uint64_t)(100 + s), NULL);
    nonfinite_check(nc, 4099);
    mean_check(nc, (1 << 16) + 3);
    float x[4] = {1, 2, 3, 4};
    lowbit_tensor_t h = host_tensor(x, 4);
    CHECK_STATUS(nc, lowbit_comm_allreduce_mean(nc, &h, NULL), LOWBIT_ERROR_UNSUPPORTED, "CUDA tensors only");
    CHECK_OK(nc, lowbit_comm_destroy(nc));
  }
  CUDA_OK(cudaStreamDestroy(g_stream));
  if (g_rank == 0) printf("CUDA checks passed\n");
  return harness_finish();
}
