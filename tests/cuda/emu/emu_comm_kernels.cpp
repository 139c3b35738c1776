// The launchers of comm/cuda_kernels.cu, running the same kernel source and
// launch geometry (comm/cuda_kernels.cuh) under emu.hpp.
#include "emu.hpp"

#include "comm/cuda_kernels.cuh"

namespace lowbit {
namespace onebit {
namespace dev {

namespace {

// emu::launch of kernel(args...) on `blocks` x kThreads threads.
struct Launch {
  void* stream;
  template <class... Params, class... Args>
  void operator()(void (*kernel)(Params...), int blocks, size_t shared_bytes, Args... args) const {
    cuda::emu::launch(unsigned(blocks), unsigned(kThreads), shared_bytes, [=] { kernel(args...); }, stream);
  }
};

}  // namespace

void worker(const float* t, const float* e, float* ws_err, const Layout& l, uint8_t* send, double* partials,
            float* scal, void* stream) {
  enqueue_worker(Launch{stream}, t, e, ws_err, l, send, partials, scal);
}

void server(const uint8_t* recv, const float* z, float* ws_z, const Layout& l, uint8_t* gsend, double* partials,
            float* scal, void* stream) {
  enqueue_server(Launch{stream}, recv, z, ws_z, l, gsend, partials, scal);
}

void finalize(const uint8_t* grecv, const Layout& l, float* out, const float* err, float* ws_err, const float* z,
              float* ws_z, int32_t* flag, int32_t* host_flag, void* stream) {
  enqueue_finalize(Launch{stream}, grecv, l, out, err, ws_err, z, ws_z, flag, host_flag);
}

void divide(float* d, int64_t n, float divisor, void* stream) { enqueue_divide(Launch{stream}, d, n, divisor); }

}  // namespace dev
}  // namespace onebit
}  // namespace lowbit
