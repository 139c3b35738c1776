// lowbit's own fp32 matrix product, for Muon's Newton-Schulz products where
// no optimized BLAS is linked (none, or only the reference BLAS) and for the
// bf16 products where oneDNN cannot make its bf16 matmul on this CPU.
//
// C = alpha op(A) op(B) + beta C, row-major (the Matmul layout of one matrix
// of a batch). Each element of C is
//   s = 0; for q = 0 .. k-1: s = s + a(i, q) * b(q, j)   (a product, then a sum: no FMA)
//   c = alpha s + beta c                                  (beta 0: c = alpha s; alpha 1: s itself)
// in that order, whatever the blocking, the thread count and the ISA the
// kernel was compiled for: the bits are those of that scalar loop. With bf16
// operands every product is exact in fp32, so only the order of the sums
// differs from oneDNN's or a BLAS's (the same rounding contract: bf16
// operands, fp32 accumulation).
#pragma once
#include <cstdint>
#include <vector>

namespace lowbit {

// The instruction sets the kernel is compiled for (the same bits in each).
enum class GemmIsa { Portable, Avx2, Avx512 };
bool gemm_isa_runs(GemmIsa isa);  // this CPU can run it
GemmIsa gemm_isa_best();           // the running CPU level's (core/cpu_features.hpp)

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;  // A stored k x m, B stored n x k
  bool symmetric = false;                 // m == n and C symmetric: the tiles below the diagonal are mirrored
};

class BuiltinGemm {
 public:
  // Scratch for `num_threads` threads (a fixed size per thread: the blocking
  // does not depend on the shapes). May throw LOWBIT_ERROR_OUT_OF_MEMORY;
  // after it, run() allocates nothing.
  void reserve(int num_threads);
  // C (m x n, row stride n) = alpha op(A) op(B) + beta C on up to
  // `num_threads` OpenMP threads (reserve()d before, else reserved here).
  void run(const GemmShape& s, const float* a, const float* b, float* c, float alpha, float beta, int num_threads,
           GemmIsa isa = gemm_isa_best());

 private:
  std::vector<float> scratch_;
  int threads_ = 0;
};

}  // namespace lowbit
