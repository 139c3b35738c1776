// The one CUDA error check and device guard of the library (cuda/, comm/):
// plain C++ over the CUDA runtime API, header-only. Failures throw
// lowbit::Error: LOWBIT_ERROR_OUT_OF_MEMORY for cudaErrorMemoryAllocation,
// LOWBIT_ERROR_CUDA otherwise, with the message
//   "<what>: <cudaGetErrorName> (<cudaGetErrorString>)".
#pragma once
#include <cuda_runtime_api.h>

#include "core/error.hpp"

namespace lowbit {
namespace cuda {

// Throws the lowbit::Error for `e` (!= cudaSuccess), after clearing the
// non-sticky error state of the calling thread (cudaGetLastError), so the
// failure is not reported again by the next unrelated check.
[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* what) {
  cudaGetLastError();
  const lowbit_status_t status = e == cudaErrorMemoryAllocation ? LOWBIT_ERROR_OUT_OF_MEMORY : LOWBIT_ERROR_CUDA;
  throw Error(status, concat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

// Throws unless e == cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_cuda_error(e, what);
}

// Makes `device` the calling thread's current device for the lifetime of the
// guard, then restores the device that was current before.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device_) check(cudaSetDevice(device_), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = 0;
};

}  // namespace cuda
}  // namespace lowbit
