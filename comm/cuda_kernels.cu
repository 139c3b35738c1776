// Launchers of the communicator's CUDA kernels (cuda_kernels.cuh). Built by
// nvcc with --fmad=false, so the fp32 and fp64 arithmetic rounds as the host
// code's (host_kernels.cpp).
#include "comm/cuda_kernels.cuh"
#include "cuda/runtime.hpp"

namespace lowbit {
namespace onebit {
namespace dev {

namespace {

// kernel<<<blocks, kThreads, shared_bytes, stream>>>(args...)
struct Launch {
  cudaStream_t stream;
  template <class... Params, class... Args>
  void operator()(void (*kernel)(Params...), int blocks, size_t shared_bytes, Args... args) const {
    kernel<<<blocks, kThreads, shared_bytes, stream>>>(args...);
  }
};

Launch on(void* stream) { return Launch{static_cast<cudaStream_t>(stream)}; }

}  // namespace

void worker(const float* t, const float* e, float* ws_err, const Layout& l, uint8_t* send, double* partials,
            float* scal, void* stream) {
  enqueue_worker(on(stream), t, e, ws_err, l, send, partials, scal);
  cuda::check(cudaGetLastError(), "worker kernels");
}

void server(const uint8_t* recv, const float* z, float* ws_z, const Layout& l, uint8_t* gsend, double* partials,
            float* scal, void* stream) {
  enqueue_server(on(stream), recv, z, ws_z, l, gsend, partials, scal);
  cuda::check(cudaGetLastError(), "server kernels");
}

void finalize(const uint8_t* grecv, const Layout& l, float* out, const float* err, float* ws_err, const float* z,
              float* ws_z, int32_t* flag, int32_t* host_flag, void* stream) {
  enqueue_finalize(on(stream), grecv, l, out, err, ws_err, z, ws_z, flag, host_flag);
  cuda::check(cudaGetLastError(), "finalize kernel");
}

void divide(float* d, int64_t n, float divisor, void* stream) {
  enqueue_divide(on(stream), d, n, divisor);
  cuda::check(cudaGetLastError(), "divide kernel");
}

}  // namespace dev
}  // namespace onebit
}  // namespace lowbit
