// GPU side of the communicator (needs a GPU; exits 77 without one):
//  1. the pack/unpack kernels' achieved bandwidth as a fraction of the
//     device's measured copy bandwidth (cudaMemcpy device to device, counted
//     as read + write). Bytes per phase are the ones the phase must move:
//       worker   (norm pass + pack pass): read t, e twice, write e', n/8 bits
//                = 20 n + n/8 bytes
//       server   (average + repack, chunk C, W messages): W C/8 bits, read z,
//                write y, read y, write z', C/8 bits = 16 C + (W+1) C/8
//       finalize (decode): read n/8 bits, write 4 n
//  2. the NCCL path at world size 1 through the public API: compressed
//     allreduce vs allreduce_mean (ncclAllReduce) of the same buffer.
//
//   ./bench_comm_cuda [numel]   (default 64M)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/device.hpp"
#include "comm/layout.hpp"
#include "lowbit_comm.h"

using lowbit::onebit::Layout;
namespace dev = lowbit::onebit::dev;

#define CK(call)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));             \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

template <class F>
static float time_ms(cudaStream_t s, int iters, F&& f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  f();  // warm-up
  cudaEventRecord(a, s);
  for (int i = 0; i < iters; ++i) f();
  cudaEventRecord(b, s);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

__global__ void fill(float* x, int64_t n, unsigned seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = float(h & 0xFFFFFF) / 16777216.0f - 0.5f;
  }
}

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: nothing to measure\n");
    return 77;
  }
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (int64_t(64) << 20);
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  float *t, *e, *ws, *z, *wz, *out;
  uint8_t *send, *recv, *gsend, *grecv;
  double* partials;
  float* scal;
  int32_t* flag;
  const int Wmax = 8;
  const Layout big = Layout::make(n, Wmax, 0);
  CK(cudaMalloc(&t, n * 4));
  CK(cudaMalloc(&e, n * 4));
  CK(cudaMalloc(&ws, n * 4));
  CK(cudaMalloc(&out, n * 4));
  CK(cudaMalloc(&z, (n + 64) * 4));
  CK(cudaMalloc(&wz, (n + 64) * 4));
  CK(cudaMalloc(&send, size_t(Wmax) * size_t(big.msg) + n / 8 + 64));
  CK(cudaMalloc(&recv, size_t(Wmax) * size_t(big.msg) + n / 8 + 64));
  CK(cudaMalloc(&gsend, n / 8 + 64));
  CK(cudaMalloc(&grecv, size_t(Wmax) * size_t(big.msg) + n / 8 + 64));
  CK(cudaMalloc(&partials, sizeof(double) * dev::partials_count(n)));
  CK(cudaMalloc(&scal, 16));
  CK(cudaMalloc(&flag, 4));
  fill<<<1024, 256, 0, s>>>(t, n, 1);
  fill<<<1024, 256, 0, s>>>(e, n, 2);
  fill<<<1024, 256, 0, s>>>(z, n + 64, 3);
  CK(cudaMemsetAsync(recv, 0x5A, size_t(Wmax) * size_t(big.msg), s));
  CK(cudaMemsetAsync(grecv, 0x3C, size_t(Wmax) * size_t(big.msg), s));
  CK(cudaStreamSynchronize(s));

  const int iters = 20;
  const float copy_ms = time_ms(s, iters, [&] { cudaMemcpyAsync(ws, t, n * 4, cudaMemcpyDeviceToDevice, s); });
  const double copy_bw = 2.0 * n * 4 / (copy_ms * 1e-3);
  std::printf("%s, numel %lld: cudaMemcpy D2D %.3f ms = %.1f GB/s (read + write)\n", prop.name, (long long)n, copy_ms,
              copy_bw / 1e9);
  std::printf("%-28s %10s %12s %10s\n", "phase", "ms", "GB/s", "of copy");
  for (int W : {1, 4, 8}) {
    const Layout L = Layout::make(n, W, 0);
    // Fill the received scales with a finite value so the server/finalize run the normal path.
    std::vector<uint8_t> hdr(size_t(W) * size_t(L.msg), 0x55);
    for (int r = 0; r < W; ++r) {
      const float one = 1.0f;
      std::memcpy(hdr.data() + size_t(r) * L.msg, &one, 4);
    }
    CK(cudaMemcpy(recv, hdr.data(), hdr.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(grecv, hdr.data(), hdr.size(), cudaMemcpyHostToDevice));
    const float wk = time_ms(s, iters, [&] { dev::worker(t, e, ws, L, send, partials, scal, s); });
    const float sv = time_ms(s, iters, [&] { dev::server(recv, z, wz, L, gsend, partials, scal, s); });
    const float fn = time_ms(s, iters, [&] { dev::finalize(grecv, L, out, e, ws, z, wz, flag, nullptr, s); });
    const double C = double(L.chunk);
    const double wb = 20.0 * n + n / 8.0, sb = 16.0 * C + (W + 1) * C / 8.0, fb = 4.0 * n + n / 8.0;
    char name[64];
    std::snprintf(name, sizeof name, "worker (W=%d)", W);
    std::printf("%-28s %10.3f %12.1f %9.1f%%\n", name, wk, wb / (wk * 1e-3) / 1e9, 100.0 * wb / (wk * 1e-3) / copy_bw);
    std::snprintf(name, sizeof name, "server (W=%d, chunk %lld)", W, (long long)L.chunk);
    std::printf("%-28s %10.3f %12.1f %9.1f%%\n", name, sv, sb / (sv * 1e-3) / 1e9, 100.0 * sb / (sv * 1e-3) / copy_bw);
    std::snprintf(name, sizeof name, "finalize (W=%d)", W);
    std::printf("%-28s %10.3f %12.1f %9.1f%%\n", name, fn, fb / (fn * 1e-3) / 1e9, 100.0 * fb / (fn * 1e-3) / copy_bw);
  }
  CK(cudaGetLastError());

  // NCCL at world size 1, through the public API.
  unsigned char id[LOWBIT_NCCL_UNIQUE_ID_BYTES];
  lowbit_comm_t comm = nullptr;
  if (lowbit_comm_nccl_unique_id(id, sizeof id) != LOWBIT_SUCCESS ||
      lowbit_comm_create_nccl(&comm, id, 0, 1, 0, nullptr) != LOWBIT_SUCCESS) {
    std::printf("NCCL: not measured (%s)\n", lowbit_last_error());
  } else {
    lowbit_tensor_t x{};
    x.data = t;
    x.numel = n;
    x.dtype = LOWBIT_DTYPE_FLOAT32;
    x.device = LOWBIT_DEVICE_CUDA;
    x.device_index = 0;
    int bad = 0;
    const float c_ms = time_ms(s, iters, [&] { bad |= lowbit_comm_compressed_allreduce(comm, &x, s) != 0; });
    const float m_ms = time_ms(s, iters, [&] { bad |= lowbit_comm_allreduce_mean(comm, &x, s) != 0; });
    if (bad) std::printf("NCCL call failed: %s\n", lowbit_comm_last_error(comm));
    std::printf("NCCL world 1, numel %lld: compressed allreduce %.3f ms, allreduce_mean (ncclAllReduce) %.3f ms\n",
                (long long)n, c_ms, m_ms);
    lowbit_comm_destroy(comm);
  }
  cudaFree(t);
  cudaFree(e);
  cudaFree(ws);
  cudaFree(out);
  cudaFree(z);
  cudaFree(wz);
  cudaFree(send);
  cudaFree(recv);
  cudaFree(gsend);
  cudaFree(grecv);
  cudaFree(partials);
  cudaFree(scal);
  cudaFree(flag);
  cudaStreamDestroy(s);
  return 0;
}
