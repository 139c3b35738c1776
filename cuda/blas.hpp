// The CUDA engine's matrix products (Engine::matmul) through cuBLAS, which is
// loaded when a Muon optimizer first needs it (dlopen of libcublas.so.<major
// of the toolkit>): liblowbit itself keeps loading where cuBLAS is absent, and
// only Muon on CUDA fails there, with a message saying what is missing. The
// host emulation (tests/cuda/emu) has its own definition, a host loop.
#pragma once
#include "core/engine.hpp"

namespace lowbit {
namespace cuda {

class Blas {
 public:
  explicit Blas(int device);  // loads cuBLAS, creates a handle and its workspace (throws on failure)
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  // C = alpha op(A) op(B) + beta C (D copied into C first when D != C and
  // beta != 0), then C rounded to bf16 when mm.bf16; enqueued on `stream`.
  void gemm(const Matmul& mm, void* stream);

 private:
  void release() noexcept;
  struct Impl;
  Impl* impl_;
};

}  // namespace cuda
}  // namespace lowbit
