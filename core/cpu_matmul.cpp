#include "cpu_matmul.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#ifdef LOWBIT_HAVE_CBLAS
#include <cblas.h>
#endif
#ifdef LOWBIT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "error.hpp"
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

void gemm_fp32(const Matmul& mm, const float* a, const float* b, float* c, int num_threads) {
#ifdef LOWBIT_HAVE_CBLAS
  (void)num_threads;
  if (mm.symmetric && mm.m == mm.n) {
    // op(A) op(A)^T: the upper triangle by syrk (half a product's flops), mirrored.
    const int n = int(mm.m), k = int(mm.k);
    cblas_ssyrk(CblasRowMajor, CblasUpper, mm.trans_a ? CblasTrans : CblasNoTrans, n, k, mm.alpha, a,
                mm.trans_a ? n : k, mm.beta, c, n);
    for (int i = 1; i < n; ++i)
      for (int j = 0; j < i; ++j) c[int64_t(i) * n + j] = c[int64_t(j) * n + i];
    return;
  }
  cblas_sgemm(CblasRowMajor, mm.trans_a ? CblasTrans : CblasNoTrans, mm.trans_b ? CblasTrans : CblasNoTrans,
              int(mm.m), int(mm.n), int(mm.k), mm.alpha, a, int(mm.trans_a ? mm.m : mm.k), b,
              int(mm.trans_b ? mm.k : mm.n), mm.beta, c, int(mm.n));
#else
  gemm_loop(mm, a, b, c, num_threads);
#endif
}

#if defined(LOWBIT_HAVE_DNNL) && DNNL_VERSION_MAJOR == 2
// Products of bf16 values (Matmul::bf16) through oneDNN's bf16 matmul (the
// one PyTorch's CPU bf16 matmul uses): the inputs are copied to bf16 (exact:
// they hold bf16 values), the sum is fp32. Primitives are made once per
// shape, transposition, alpha and beta (a Newton-Schulz run uses a handful).
class DnnlBf16 {
 public:
  static DnnlBf16& get() {
    static DnnlBf16 d;
    return d;
  }
  void gemm(const Matmul& mm, const float* a, const float* b, float* c) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t na = mm.m * mm.k, nb = mm.k * mm.n;
    abuf_.resize(size_t(na));
    bbuf_.resize(size_t(nb));
    to_bf16(a, abuf_.data(), na);
    to_bf16(b, bbuf_.data(), nb);
    const Descs d(mm);
    dnnl::memory am(d.a, engine_, abuf_.data()), bm(d.b, engine_, bbuf_.data()), cm(d.c, engine_, c);
    primitive(mm, d).execute(stream_, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream_.wait();
  }

 private:
  DnnlBf16() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}
  static void to_bf16(const float* in, uint16_t* out, int64_t n) {
#pragma omp parallel for if (n >= (1 << 18))
    for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
  }
  // op(A) is m x k: A stored m x k (strides k, 1) or k x m (strides 1, m);
  // likewise op(B) k x n; C m x n fp32.
  struct Descs {
    dnnl::memory::desc a, b, c;
    explicit Descs(const Matmul& mm)
        : a({mm.m, mm.k}, dnnl::memory::data_type::bf16,
            mm.trans_a ? dnnl::memory::dims{1, mm.m} : dnnl::memory::dims{mm.k, 1}),
          b({mm.k, mm.n}, dnnl::memory::data_type::bf16,
            mm.trans_b ? dnnl::memory::dims{1, mm.k} : dnnl::memory::dims{mm.n, 1}),
          c({mm.m, mm.n}, dnnl::memory::data_type::f32, dnnl::memory::dims{mm.n, 1}) {}
  };
  struct Key {
    int64_t m, n, k;
    bool ta, tb;
    float alpha, beta;
    bool operator==(const Key& o) const {
      return m == o.m && n == o.n && k == o.k && ta == o.ta && tb == o.tb &&
             std::memcmp(&alpha, &o.alpha, 4) == 0 && std::memcmp(&beta, &o.beta, 4) == 0;
    }
  };
  dnnl::matmul& primitive(const Matmul& mm, const Descs& d) {
    const Key key{mm.m, mm.n, mm.k, mm.trans_a, mm.trans_b, mm.alpha, mm.beta};
    for (auto& e : cache_)
      if (e.first == key) return e.second;
    dnnl::primitive_attr attr;
    if (mm.alpha != 1.f) attr.set_output_scales(0, {mm.alpha});
    if (mm.beta != 0.f) {
      dnnl::post_ops ops;
      ops.append_sum(mm.beta);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(d.a, d.b, d.c), attr, engine_);
    if (cache_.size() >= 64) cache_.clear();
    cache_.emplace_back(key, dnnl::matmul(pd));
    return cache_.back().second;
  }

  std::mutex mu_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::vector<std::pair<Key, dnnl::matmul>> cache_;
  std::vector<uint16_t> abuf_, bbuf_;  // keep their capacity: no allocation once a step has run
};
#define LOWBIT_DNNL_BF16 1
#endif

}  // namespace

void cpu_matmul(const Matmul& mm, int num_threads) {
  const int64_t cn = mm.m * mm.n;
  for (int64_t i = 0; i < mm.batch; ++i) {
    float* c = mm.c + i * mm.stride_c;
    const float* a = mm.a + i * mm.stride_a;
    const float* b = mm.b + i * mm.stride_b;
    if (mm.beta != 0.f && mm.d != mm.c) std::memcpy(c, mm.d + i * mm.stride_c, size_t(cn) * sizeof(float));
#ifdef LOWBIT_DNNL_BF16
    if (mm.bf16) {
      try {
        DnnlBf16::get().gemm(mm, a, b, c);
      } catch (const dnnl::error& e) {
        fail(LOWBIT_ERROR_INTERNAL, "oneDNN's bf16 matmul failed: ", e.what());
      }
    } else {
      gemm_fp32(mm, a, b, c, num_threads);
    }
#else
    gemm_fp32(mm, a, b, c, num_threads);
#endif
    if (mm.bf16) {
#pragma omp parallel for num_threads(num_threads) if (cn >= (1 << 18))
      for (int64_t e = 0; e < cn; ++e) c[e] = round_bf16(c[e]);
    }
  }
}

}  // namespace lowbit
