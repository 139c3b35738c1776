// Owners of the communicator's memory: one allocation (Mem) and the set of
// buffers one binding (numel, device) needs (Buffers).
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>

#include "layout.hpp"
#include "lowbit.h"

namespace lowbit {
namespace onebit {

enum class MemKind { None, Host, Device, Pinned, Mapped };

// One owned allocation: host (calloc'ed, 64-byte aligned), device
// (cudaMalloc), pinned host (cudaMallocHost) or mapped pinned host memory
// (cudaHostAlloc, with its device alias). Throws lowbit::Error (or std::bad_alloc for host memory)
// when the allocation fails; the CUDA kinds need LOWBIT_HAVE_CUDA.
class Mem {
 public:
  Mem() = default;
  Mem(MemKind kind, size_t bytes);
  ~Mem() { reset(); }
  Mem(Mem&& o) noexcept { swap(o); }
  Mem& operator=(Mem&& o) noexcept {
    Mem(std::move(o)).swap(*this);
    return *this;
  }
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;

  void swap(Mem& o) noexcept {
    std::swap(kind_, o.kind_);
    std::swap(p_, o.p_);
    std::swap(alias_, o.alias_);
    std::swap(base_, o.base_);
    std::swap(bytes_, o.bytes_);
  }
  void reset() noexcept;

  template <class T = void>
  T* as() const {
    return static_cast<T*>(p_);
  }
  // Device address of mapped memory (nullptr for the other kinds).
  template <class T = void>
  T* alias() const {
    return static_cast<T*>(alias_);
  }
  size_t bytes() const { return bytes_; }

 private:
  MemKind kind_ = MemKind::None;
  void* p_ = nullptr;
  void* alias_ = nullptr;
  void* base_ = nullptr;  // what calloc returned (host)
  size_t bytes_ = 0;
};

// Everything one binding (numel, device) needs, allocated together.
struct Buffers {
  bool valid = false;
  int64_t n = 0;
  lowbit_device_t device = LOWBIT_DEVICE_CPU;
  int32_t device_index = 0;
  Layout layout;
  Mem err, ws_err, serr, ws_serr;       // worker (n) and server (chunk) errors, double-buffered
  // Host bindings, after a call: err / serr hold that call's x / y, and the
  // errors are rebuilt from them and its scales (host_kernels.hpp, ErrorsIn)
  // as the next call reads them. false: err / serr hold the errors (zero,
  // loaded, or on a device).
  bool lazy = false;
  float err_scale = 0.0f, serr_scale = 0.0f;
  float call_scale = 0.0f, call_sscale = 0.0f;  // the worker / server scales of the host call in flight
  Mem send, recv, gsend, grecv;         // packed messages
  Mem partials, scal, flag, host_flag;  // device only
  Mem hsend, hrecv, hgsend, hgrecv;     // pinned staging (device data over non-CUDA-aware MPI)
};

}  // namespace onebit
}  // namespace lowbit
