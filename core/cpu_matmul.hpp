// The CPU engine's matrix products (Engine::matmul, Muon's Newton-Schulz
// iterations) and which implementation runs each one:
//   fp32 products: the CBLAS linked at build time when it is an optimized one
//     (OpenBLAS, MKL, BLIS, any CBLAS that is not the reference BLAS), else
//     lowbit's own blocked product (core/cpu_gemm.hpp);
//   bf16 products (Matmul::bf16): oneDNN's bf16 matmul where the build has
//     oneDNN and it has a bf16 matmul for this CPU (AVX-512), else the fp32
//     products above of the same bf16 values (exact in fp32, the sum in fp32:
//     the same rounding contract), rounded to bf16 after the sum.
// LOWBIT_MATMUL in the environment, read at every step (reserve), changes it:
//   auto (or unset)  as above;
//   blas             every product through the linked CBLAS (refused where the build has none);
//   builtin          every product through lowbit's own.
// Any other value is refused (LOWBIT_ERROR_INVALID_ARGUMENT) when a Muon
// optimizer reserves its products.
//
// A test hook: LOWBIT_TEST_MATMUL_FAIL_AFTER=N makes every product reserved
// after the first N of a CpuMatmul fail (LOWBIT_ERROR_INTERNAL), as a
// product whose kernel or memory cannot be had fails.
#pragma once
#include <cstdint>
#include <memory>

#include "engine.hpp"

namespace lowbit {

class CpuMatmul {
 public:
  explicit CpuMatmul(int num_threads);
  ~CpuMatmul();
  CpuMatmul(const CpuMatmul&) = delete;
  CpuMatmul& operator=(const CpuMatmul&) = delete;

  // Readies these products (their shapes, transpositions, alpha, beta,
  // precision; not their pointers): chooses their implementation, makes
  // oneDNN's primitives and sizes every buffer. Throws what a product would
  // fail for (a bad LOWBIT_MATMUL, no memory, the test hook). After it, run()
  // of these products allocates nothing and does not fail.
  void reserve(const Matmul* products, int64_t count);
  // One batched product (reserve()d before; else it is reserved here).
  void run(const Matmul& mm);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One product without an engine (the CUDA emulation's stand-in for cuBLAS):
// through a CpuMatmul of the calling thread.
void cpu_matmul(const Matmul& mm, int num_threads);

// What runs Muon's fp32 and bf16 products on the CPU in this process with
// LOWBIT_MATMUL as it is now (lowbit_build_info): static strings.
struct MatmulReport {
  const char* fp32;
  const char* bf16;
};
MatmulReport cpu_matmul_report() noexcept;

}  // namespace lowbit
