// lowbit's own matrix product (core/cpu_gemm.hpp) and the CPU engine's
// choice of implementation (core/cpu_matmul.hpp):
// * the built-in product gives the bits of its scalar rule (s = sum over q
//   in order, a product then a sum; c = alpha s + beta c) on shapes that
//   cross every blocking edge (the register tile, the 96-row and 192-column
//   tiles, the 256-deep slices, the small-product path), every
//   transposition, alpha and beta, symmetric products, for every ISA form
//   this CPU runs and 1, 2 and 3 threads; and that rule is the product
//   (within k ulps of the float64 one);
// * through CpuMatmul, with LOWBIT_MATMUL = builtin, blas and auto, bf16
//   products (bf16 operands, the result rounded to bf16) and fp32 products
//   agree: builtin is its rule to the bit, the others sum in another order,
//   so each element is within a few ulps of the float64 sum before the
//   rounding; and a batched product with D != C;
// * LOWBIT_MATMUL with another value and the test hook
//   LOWBIT_TEST_MATMUL_FAIL_AFTER fail reserve() with their messages.
// Seed: LOWBIT_TEST_SEED.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_gemm.hpp"
#include "core/cpu_matmul.hpp"
#include "core/error.hpp"
#include "core/float16.hpp"

// cmocka after the core headers: its fail() macro would rename lowbit::fail
extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
}

#include "../common/test_seed.h"

using namespace lowbit;

namespace {

std::mt19937_64 rng;

std::vector<float> random_values(int64_t n, bool bf16) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = bf16 ? round_bf16(d(rng)) : d(rng);
  return v;
}

float at_a(const GemmShape& s, const float* a, int64_t i, int64_t q) {
  return s.trans_a ? a[q * s.m + i] : a[i * s.k + q];
}
float at_b(const GemmShape& s, const float* b, int64_t q, int64_t j) {
  return s.trans_b ? b[j * s.k + q] : b[q * s.n + j];
}

// The rule, one element at a time (this file is built with -ffp-contract=off).
std::vector<float> rule(const GemmShape& s, const float* a, const float* b, const float* c0, float alpha,
                        float beta) {
  std::vector<float> c(size_t(s.m * s.n));
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      float sum = 0.f;
      for (int64_t q = 0; q < s.k; ++q) {
        const float p = at_a(s, a, i, q) * at_b(s, b, q, j);
        sum = sum + p;
      }
      const float scaled = alpha * sum;
      c[size_t(i * s.n + j)] = beta == 0.f ? scaled : scaled + beta * c0[i * s.n + j];
    }
  return c;
}

// |c - exact| <= (k + 2) ulp-sized errors of the terms, in float64.
void expect_near_float64(const GemmShape& s, const float* a, const float* b, const float* c0, float alpha,
                         float beta, const float* c, const char* what) {
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double exact = 0, size = 0;
      for (int64_t q = 0; q < s.k; ++q) {
        const double p = double(at_a(s, a, i, q)) * double(at_b(s, b, q, j));
        exact += p, size += std::fabs(p);
      }
      const double d = beta == 0.f ? 0.0 : double(beta) * double(c0[i * s.n + j]);
      exact = double(alpha) * exact + d;
      const double bound = (double(s.k) + 2) * 6e-8 * (std::fabs(double(alpha)) * size + std::fabs(d)) + 1e-30;
      if (!(std::fabs(double(c[i * s.n + j]) - exact) <= bound))
        fail_msg("%s: %lld x %lld x %lld, c[%lld][%lld] = %.9g, float64 %.9g (bound %.3g)", what,
                 (long long)s.m, (long long)s.n, (long long)s.k, (long long)i, (long long)j,
                 double(c[i * s.n + j]), exact, bound);
    }
}

struct Case {
  int64_t m, n, k;
};
// Every blocking edge: the 6-row register tile, 8 / 16 / 32 columns, 96-row
// and 192-column tiles, 256-deep slices, and the small-product path (<= 2^15
// multiply-adds).
const Case kCases[] = {{1, 1, 1},   {2, 2, 128}, {4, 4, 128},   {128, 2, 2},  {5, 7, 3},    {6, 32, 9},
                       {7, 33, 17}, {97, 193, 5}, {96, 192, 256}, {100, 50, 257}, {13, 300, 40}, {130, 130, 130},
                       {64, 8, 600}, {3, 200, 70}, {200, 3, 70},   {31, 31, 0}};

void test_builtin_is_its_rule(void**) {
  BuiltinGemm g;
  const float alphas[] = {1.f, 2.0315f}, betas[] = {0.f, -4.775f};
  int products = 0;
  for (const Case& cs : kCases)
    for (int t = 0; t < 4; ++t)
      for (int ab = 0; ab < 4; ++ab) {
        GemmShape s;
        s.m = cs.m, s.n = cs.n, s.k = cs.k;
        s.trans_a = t & 1, s.trans_b = t & 2;
        const float alpha = alphas[ab & 1], beta = betas[ab >> 1];
        const bool bf16 = (t + ab) % 2 == 0;
        const std::vector<float> a = random_values(s.m * s.k, bf16), b = random_values(s.k * s.n, bf16);
        std::vector<float> c0 = random_values(s.m * s.n, false);
        if (beta == 0.f) c0[0] = NAN;  // beta 0 ignores C
        const std::vector<float> want = rule(s, a.data(), b.data(), c0.data(), alpha, beta);
        expect_near_float64(s, a.data(), b.data(), c0.data(), alpha, beta, want.data(), "the rule");
        for (int isa = 0; isa < 3; ++isa) {
          if (!gemm_isa_runs(GemmIsa(isa))) continue;
          for (int threads = 1; threads <= 3; ++threads) {
            std::vector<float> c = c0;
            g.run(s, a.data(), b.data(), c.data(), alpha, beta, threads, GemmIsa(isa));
            if (std::memcmp(c.data(), want.data(), c.size() * 4) != 0)
              fail_msg("%lld x %lld x %lld, trans %d%d, alpha %g beta %g, isa %d, %d threads: not the rule's bits",
                       (long long)s.m, (long long)s.n, (long long)s.k, int(s.trans_a), int(s.trans_b),
                       double(alpha), double(beta), isa, threads);
            ++products;
          }
        }
      }
  std::printf("  %d products: the rule's bits\n", products);
}

// X X^T, X^T X and A A of a symmetric A: the tiles below the diagonal are
// mirrored, which gives the bits of computing them.
void test_symmetric_products(void**) {
  BuiltinGemm g;
  const int64_t sizes[][2] = {{5, 9}, {100, 40}, {200, 300}, {250, 7}};
  for (const auto& sz : sizes)
    for (int tall = 0; tall < 2; ++tall) {
      const int64_t k = sz[0], other = sz[1];
      const std::vector<float> x = random_values(k * other, true);
      GemmShape s;  // X (k x other): X X^T; stored other x k: X^T X
      s.m = s.n = k, s.k = other;
      s.trans_a = tall, s.trans_b = !tall;
      s.symmetric = true;
      GemmShape full = s;
      full.symmetric = false;
      std::vector<float> gram(size_t(k * k)), want(size_t(k * k));
      g.run(s, x.data(), x.data(), gram.data(), 1.f, 0.f, 2);
      g.run(full, x.data(), x.data(), want.data(), 1.f, 0.f, 2);
      assert_memory_equal(gram.data(), want.data(), gram.size() * 4);
      // B = b A + c A A, A symmetric
      GemmShape aa;
      aa.m = aa.n = aa.k = k;
      aa.symmetric = true;
      std::vector<float> poly = gram, poly_full = gram;
      g.run(aa, gram.data(), gram.data(), poly.data(), 2.0315f, -4.775f, 3);
      aa.symmetric = false;
      g.run(aa, gram.data(), gram.data(), poly_full.data(), 2.0315f, -4.775f, 3);
      assert_memory_equal(poly.data(), poly_full.data(), poly.size() * 4);
    }
}

// ---- CpuMatmul: the implementations LOWBIT_MATMUL chooses

struct Scoped {
  const char* name;
  explicit Scoped(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~Scoped() { unsetenv(name); }
};

Matmul batched(int64_t m, int64_t n, int64_t k, bool ta, bool tb, int64_t batch, const float* a, const float* b,
               const float* d, float* c, float alpha, float beta, bool bf16) {
  Matmul mm;
  mm.m = m, mm.n = n, mm.k = k, mm.batch = batch;
  mm.trans_a = ta, mm.trans_b = tb;
  mm.a = a, mm.b = b, mm.d = d, mm.c = c;
  mm.stride_a = m * k, mm.stride_b = k * n, mm.stride_c = m * n;
  mm.alpha = alpha, mm.beta = beta;
  mm.bf16 = bf16;
  return mm;
}

std::vector<float> run_with(const char* choice, const Matmul& proto, int threads) {
  Scoped env("LOWBIT_MATMUL", choice);
  std::vector<float> c(size_t(proto.batch * proto.m * proto.n), -1.f);
  Matmul mm = proto;
  mm.c = c.data();
  CpuMatmul m(threads);
  m.reserve(&mm, 1);
  m.run(mm);
  return c;
}

void test_choices_agree(void**) {
  const Case cases[] = {{48, 48, 48}, {80, 24, 24}, {24, 80, 24}, {128, 128, 128}, {300, 200, 130}};
  for (const Case& cs : cases)
    for (int bf16 = 0; bf16 < 2; ++bf16)
      for (int t = 0; t < 4; ++t) {
        const int64_t batch = 2;
        const bool ta = t & 1, tb = t & 2;
        const std::vector<float> a = random_values(batch * cs.m * cs.k, bf16), b = random_values(batch * cs.k * cs.n, bf16);
        const std::vector<float> d = random_values(batch * cs.m * cs.n, bf16);
        const float alpha = 2.0315f, beta = -4.775f;
        const Matmul mm = batched(cs.m, cs.n, cs.k, ta, tb, batch, a.data(), b.data(), d.data(), nullptr, alpha,
                                  beta, bf16);
        const std::vector<float> builtin = run_with("builtin", mm, 2), builtin1 = run_with("builtin", mm, 1);
        assert_memory_equal(builtin.data(), builtin1.data(), builtin.size() * 4);  // any thread count
        std::vector<float> rounded;
        for (int64_t i = 0; i < batch; ++i) {
          GemmShape s;
          s.m = cs.m, s.n = cs.n, s.k = cs.k, s.trans_a = ta, s.trans_b = tb;
          const std::vector<float> want = rule(s, a.data() + i * mm.stride_a, b.data() + i * mm.stride_b,
                                               d.data() + i * mm.stride_c, alpha, beta);
          for (float v : want) rounded.push_back(bf16 ? round_bf16(v) : v);
        }
        assert_memory_equal(builtin.data(), rounded.data(), builtin.size() * 4);  // the rule, then the rounding
        // Each element's terms, for the bound of a sum in another order.
        std::vector<double> size;
        for (int64_t i = 0; i < batch; ++i) {
          GemmShape s;
          s.m = cs.m, s.n = cs.n, s.k = cs.k, s.trans_a = ta, s.trans_b = tb;
          const float* ai = a.data() + i * mm.stride_a;
          const float* bi = b.data() + i * mm.stride_b;
          for (int64_t r = 0; r < s.m; ++r)
            for (int64_t j = 0; j < s.n; ++j) {
              double sum = 0;
              for (int64_t q = 0; q < s.k; ++q) sum += std::fabs(double(at_a(s, ai, r, q)) * at_b(s, bi, q, j));
              size.push_back(std::fabs(double(alpha)) * sum + std::fabs(double(beta) * d[size_t(i * mm.stride_c + r * s.n + j)]));
            }
        }
        for (const char* other : {"auto", "blas"}) {
#ifndef LOWBIT_HAVE_CBLAS
          if (std::strcmp(other, "blas") == 0) continue;  // no CBLAS in this build: auto is lowbit's own product
#endif
          const std::vector<float> got = run_with(other, mm, 2);
          // Another order of the same sums: within (k + 2) float32 rounding
          // errors of the terms before the bf16 rounding, which adds at most
          // one bf16 step (2^-7 of the value).
          for (size_t e = 0; e < got.size(); ++e) {
            const double tol = (double(cs.k) + 2) * 1.2e-7 * size[e] +
                               (bf16 ? std::fabs(double(rounded[e])) / 128 : 0.0) + 1e-30;
            if (!(std::fabs(double(got[e]) - double(rounded[e])) <= tol))
              fail_msg("LOWBIT_MATMUL=%s, %lld x %lld x %lld, trans %d%d, bf16 %d: element %zu is %.9g, builtin %.9g",
                       other, (long long)cs.m, (long long)cs.n, (long long)cs.k, int(ta), int(tb), bf16, e,
                       double(got[e]), double(rounded[e]));
          }
        }
      }
}

void expect_reserve_fails(const Matmul& mm, lowbit_status_t status, const char* text) {
  CpuMatmul m(1);
  try {
    m.reserve(&mm, 1);
    fail_msg("reserve succeeded; expected: %s", text);
  } catch (const Error& e) {
    assert_int_equal(e.status(), status);
    if (!std::strstr(e.what(), text)) fail_msg("message '%s' does not name '%s'", e.what(), text);
  }
}

void test_bad_choice_and_hook(void**) {
  std::vector<float> a(64, 1.f), c(64);
  const Matmul mm = batched(8, 8, 8, false, false, 1, a.data(), a.data(), nullptr, c.data(), 1.f, 0.f, true);
  {
    Scoped env("LOWBIT_MATMUL", "fastest");
    expect_reserve_fails(mm, LOWBIT_ERROR_INVALID_ARGUMENT, "'fastest' is not auto, blas or builtin");
    assert_non_null(std::strstr(cpu_matmul_report().fp32, "LOWBIT_MATMUL is not"));
  }
  {
    Scoped env("LOWBIT_TEST_MATMUL_FAIL_AFTER", "2");
    CpuMatmul m(1);
    const Matmul three[3] = {mm, mm, mm};
    m.reserve(three, 2);  // products 1 and 2
    try {
      m.reserve(three, 3);
      fail_msg("the third product was reserved");
    } catch (const Error& e) {
      assert_int_equal(e.status(), LOWBIT_ERROR_INTERNAL);
      assert_non_null(std::strstr(e.what(), "LOWBIT_TEST_MATMUL_FAIL_AFTER = 2: product 3"));
    }
  }
  const MatmulReport builtin = [] {
    Scoped env("LOWBIT_MATMUL", "builtin");
    return cpu_matmul_report();
  }();
  assert_non_null(std::strstr(builtin.fp32, "lowbit's blocked product"));
  assert_non_null(std::strstr(builtin.bf16, "rounded to bf16"));
  std::printf("  auto: fp32 %s; bf16 %s\n", cpu_matmul_report().fp32, cpu_matmul_report().bf16);
}

}  // namespace

int main(void) {
  rng.seed(lowbit_test_seed("test_gemm"));
  unsetenv("LOWBIT_MATMUL");
  unsetenv("LOWBIT_TEST_MATMUL_FAIL_AFTER");
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_builtin_is_its_rule),
                                     cmocka_unit_test(test_symmetric_products), cmocka_unit_test(test_choices_agree),
                                     cmocka_unit_test(test_bad_choice_and_hook)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
