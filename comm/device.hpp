// CUDA side of the communicator, built with LOWBIT_HAVE_CUDA. Plain C++
// declarations: streams are void* (cudaStream_t), failures throw
// lowbit::Error (LOWBIT_ERROR_CUDA / LOWBIT_ERROR_OUT_OF_MEMORY).
//   device_runtime.cpp  memory, copies and device queries (CUDA runtime API)
//   cuda_kernels.cu     the launchers of the kernels of cuda_kernels.cuh
//                       (tests/cuda/emu/emu_comm_kernels.cpp: the same
//                       launches under the host emulation)
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "layout.hpp"
#include "sumsq.hpp"

namespace lowbit {
namespace onebit {
namespace dev {

void* alloc(size_t bytes);             // device memory (cudaMalloc)
void release(void* p) noexcept;
void* alloc_pinned(size_t bytes);      // page-locked host memory
void release_pinned(void* p) noexcept;
// Mapped page-locked host memory; *device_alias receives its device address.
void* alloc_mapped(size_t bytes, void** device_alias);

void copy_async(void* dst, const void* src, size_t bytes, void* stream);  // any direction
void zero_async(void* dst, size_t bytes, void* stream);
void sync(void* stream);

int device_count() noexcept;  // 0 when there is no usable device
// "" if p is device (or managed) memory usable on device `index`, else why not.
std::string check_device_pointer(const void* p, int index);

// Doubles of the `partials` workspace of worker() and server() for a tensor
// of n elements: one per segment of the sums of squares (sumsq.hpp).
inline int64_t partials_count(int64_t n) {
  const int64_t s = sumsq::segments(n);
  return s < 1 ? 1 : s;
}

// Worker phase: x = t + e; scal[0] = scale of x (NaN if not finite); the new
// worker error x - q into ws_err; the W messages into send.
void worker(const float* t, const float* e, float* ws_err, const Layout& l, uint8_t* send, double* partials,
            float* scal, void* stream);
// Server phase: y = mean_j(q_j) + z over this rank's chunk; scal[1] = scale
// of y (NaN if not finite or if a received scale is not); the new server
// error into ws_z; the gathered message into gsend.
void server(const uint8_t* recv, const float* z, float* ws_z, const Layout& l, uint8_t* gsend, double* partials,
            float* scal, void* stream);
// If every gathered scale is finite: out <- decoded result, *flag = 0. Else:
// out untouched, ws_err <- err and ws_z <- z (so the caller's unconditional
// swap keeps the old errors), *flag = 1. host_flag (device alias of mapped
// host memory, may be NULL) gets the same value.
void finalize(const uint8_t* grecv, const Layout& l, float* out, const float* err, float* ws_err, const float* z,
              float* ws_z, int32_t* flag, int32_t* host_flag, void* stream);
// d[i] = d[i] / divisor.
void divide(float* d, int64_t n, float divisor, void* stream);

}  // namespace dev
}  // namespace onebit
}  // namespace lowbit
