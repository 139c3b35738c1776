#include "cpu_matmul.hpp"

#include <algorithm>
#include <cstring>

#ifdef LOWBIT_HAVE_CBLAS
#include <cblas.h>
#endif

#include "float16.hpp"

namespace lowbit {
namespace {

#ifndef LOWBIT_HAVE_CBLAS
// C = alpha op(A) op(B) + beta C without a BLAS: rows of C in parallel, k
// outer so the inner loop streams a row of op(B) (correct; a BLAS is several
// times faster).
void gemm_loop(const Matmul& mm, const float* a, const float* b, float* c, int num_threads) {
  const int64_t m = mm.m, n = mm.n, k = mm.k;
#pragma omp parallel for num_threads(num_threads) if (m * n * k >= (1 << 20))
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * n;
    if (mm.beta == 0.f)
      std::fill(ci, ci + n, 0.f);
    else
      for (int64_t j = 0; j < n; ++j) ci[j] *= mm.beta;
    for (int64_t q = 0; q < k; ++q) {
      const float aiq = mm.alpha * (mm.trans_a ? a[q * m + i] : a[i * k + q]);
      if (mm.trans_b)
        for (int64_t j = 0; j < n; ++j) ci[j] += aiq * b[j * k + q];
      else
        for (int64_t j = 0; j < n; ++j) ci[j] += aiq * b[q * n + j];
    }
  }
}
#endif

}  // namespace

void cpu_matmul(const Matmul& mm, int num_threads) {
  const int64_t cn = mm.m * mm.n;
  for (int64_t i = 0; i < mm.batch; ++i) {
    float* c = mm.c + i * mm.stride_c;
    if (mm.beta != 0.f && mm.d != mm.c) std::memcpy(c, mm.d + i * mm.stride_c, size_t(cn) * sizeof(float));
#ifdef LOWBIT_HAVE_CBLAS
    cblas_sgemm(CblasRowMajor, mm.trans_a ? CblasTrans : CblasNoTrans, mm.trans_b ? CblasTrans : CblasNoTrans,
                int(mm.m), int(mm.n), int(mm.k), mm.alpha, mm.a + i * mm.stride_a, int(mm.trans_a ? mm.m : mm.k),
                mm.b + i * mm.stride_b, int(mm.trans_b ? mm.k : mm.n), mm.beta, c, int(mm.n));
#else
    gemm_loop(mm, mm.a + i * mm.stride_a, mm.b + i * mm.stride_b, c, num_threads);
#endif
    if (mm.bf16) {
#pragma omp parallel for num_threads(num_threads) if (cn >= (1 << 18))
      for (int64_t e = 0; e < cn; ++e) c[e] = bf16_to_float(float_to_bf16(c[e]));
    }
  }
}

}  // namespace lowbit
