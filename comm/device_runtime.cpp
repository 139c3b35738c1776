// The CUDA runtime side of the communicator (device.hpp): allocations,
// copies, synchronisation and device queries. Plain C++ over the CUDA
// runtime API (the host emulation of tests/cuda/emu runs it too).
#ifdef LOWBIT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <string>

#include "core/error.hpp"
#include "cuda/runtime.hpp"
#include "device.hpp"

namespace lowbit {
namespace onebit {
namespace dev {

namespace {
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
}  // namespace

void* alloc(size_t bytes) {
  void* p = nullptr;
  cuda::check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc (communicator workspace)");
  return p;
}
void release(void* p) noexcept {
  if (p) cudaFree(p);
}
void* alloc_pinned(size_t bytes) {
  void* p = nullptr;
  cuda::check(cudaMallocHost(&p, bytes ? bytes : 1), "cudaMallocHost (communicator staging buffer)");
  return p;
}
void release_pinned(void* p) noexcept {
  if (p) cudaFreeHost(p);
}
void* alloc_mapped(size_t bytes, void** device_alias) {
  void* p = nullptr;
  cuda::check(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocMapped), "cudaHostAlloc (communicator flag)");
  cudaError_t e = cudaHostGetDevicePointer(device_alias, p, 0);
  if (e != cudaSuccess) {
    cudaFreeHost(p);
    cuda::check(e, "cudaHostGetDevicePointer (communicator flag)");
  }
  return p;
}

void copy_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes) cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)), "cudaMemcpyAsync");
}
void zero_async(void* dst, size_t bytes, void* stream) {
  if (bytes) cuda::check(cudaMemsetAsync(dst, 0, bytes, as_stream(stream)), "cudaMemsetAsync");
}
void sync(void* stream) { cuda::check(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize(stream)"); }

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string check_device_pointer(const void* p, int index) {
  cudaPointerAttributes a{};
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("is not CUDA memory (cudaPointerGetAttributes: ") + cudaGetErrorString(e) + ")";
  }
  if (a.type == cudaMemoryTypeManaged) return "";
  if (a.type != cudaMemoryTypeDevice)
    return a.type == cudaMemoryTypeHost ? "is page-locked host memory, not device memory"
                                        : "is host memory, not device memory";
  if (a.device != index)
    return concat("is memory of CUDA device ", a.device, ", not of tensor.device_index ", index);
  return "";
}

}  // namespace dev
}  // namespace onebit
}  // namespace lowbit
#endif  // LOWBIT_HAVE_CUDA
