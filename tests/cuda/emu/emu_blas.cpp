// cuda/blas.hpp under the emulation: the products on the host (device memory
// is host memory here), through the CPU engine's CBLAS path, in stream order
// like every emulated launch.
#include "emu.hpp"

#include "core/cpu_matmul.hpp"
#include "cuda/blas.hpp"

namespace lowbit {
namespace cuda {

struct Blas::Impl {};

Blas::Blas(int) : impl_(new Impl) {}
Blas::~Blas() { release(); }
void Blas::release() noexcept {
  delete impl_;
  impl_ = nullptr;
}

void Blas::gemm(const Matmul& mm, void* stream) {
  emu::launch(1, 1, [mm] { cpu_matmul(mm, 1); }, stream);
}

}  // namespace cuda
}  // namespace lowbit
