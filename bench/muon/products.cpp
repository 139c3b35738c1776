// Muon's CPU products (core/cpu_matmul.hpp) one at a time, by implementation:
// LOWBIT_MATMUL=builtin (lowbit's own blocked product) against =blas (the
// CBLAS this build links, whichever library the loader gives it: run with
// LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/blas for Debian's reference
// BLAS under a build configured with -DBLA_VENDOR=Generic), and =auto for
// the bf16 products (oneDNN where this CPU has its bf16 matmul).
//
//   bench_muon_products [threads]     (default 1; the demo's optimizer runs 1)
//
// Shapes: the products of one Newton-Schulz iteration of the demo's MLP
// (examples/demo.py: 128 x 2, 128 x 128 twice, 4 x 128; the Gram matrix,
// b A + c A A, the update), then square ones. Times are the process's CPU
// time (all its threads; the best of the repeats), so other processes on a
// busy machine do not count; the median of wall times is printed too.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_matmul.hpp"
#include "core/float16.hpp"

using namespace lowbit;

namespace {

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Product {
  const char* what;
  int64_t m, n, k;
  bool ta, tb, symmetric;
  float alpha, beta;
};

// The demo's Newton-Schulz products (tall 128 x 2: X^T X; wide 4 x 128: X X^T).
const Product kProducts[] = {
    {"128x128 Gram X X^T", 128, 128, 128, false, true, true, 1.f, 0.f},
    {"128x128 b A + c A A", 128, 128, 128, false, false, true, 2.0315f, -4.775f},
    {"128x128 a X + B X", 128, 128, 128, false, false, false, 1.f, 3.4445f},
    {"128x2 Gram X^T X", 2, 2, 128, true, false, true, 1.f, 0.f},
    {"128x2 b A + c A A", 2, 2, 2, false, false, true, 2.0315f, -4.775f},
    {"128x2 a X + X B^T", 128, 2, 2, false, true, false, 1.f, 3.4445f},
    {"4x128 Gram X X^T", 4, 4, 128, false, true, true, 1.f, 0.f},
    {"4x128 b A + c A A", 4, 4, 4, false, false, true, 2.0315f, -4.775f},
    {"4x128 a X + B X", 4, 128, 4, false, false, false, 1.f, 3.4445f},
    {"256^3", 256, 256, 256, false, false, false, 1.f, 0.f},
    {"512^3", 512, 512, 512, false, false, false, 1.f, 0.f},
    {"1024^3", 1024, 1024, 1024, false, false, false, 1.f, 0.f},
};

struct Timing {
  double cpu_us, wall_us;
};

Timing time_product(const char* choice, const Product& s, bool bf16, int threads, const std::vector<float>& a,
                    const std::vector<float>& b, std::vector<float>& c) {
  setenv("LOWBIT_MATMUL", choice, 1);
  Matmul mm;
  mm.m = s.m, mm.n = s.n, mm.k = s.k;
  mm.trans_a = s.ta, mm.trans_b = s.tb, mm.symmetric = s.symmetric;
  mm.a = a.data(), mm.b = s.symmetric ? a.data() : b.data(), mm.c = c.data(), mm.d = c.data();
  mm.stride_a = s.m * s.k, mm.stride_b = s.k * s.n, mm.stride_c = s.m * s.n;
  mm.alpha = s.alpha, mm.beta = s.beta, mm.bf16 = bf16;
  CpuMatmul product(threads);
  product.reserve(&mm, 1);
  product.run(mm);  // warm
  const double flops = double(s.m) * double(s.n) * double(s.k);
  const int repeats = flops > 1e8 ? 3 : flops > 1e6 ? 30 : 300;
  double best = 1e30;
  std::vector<double> walls;
  for (int r = 0; r < repeats; ++r) {
    const double c0 = cpu_seconds(), w0 = wall_seconds();
    product.run(mm);
    best = std::min(best, cpu_seconds() - c0);
    walls.push_back(wall_seconds() - w0);
  }
  std::sort(walls.begin(), walls.end());
  return {best * 1e6, walls[walls.size() / 2] * 1e6};
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  std::printf("threads %d; fp32: %s\n", threads, cpu_matmul_report().fp32);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 0.1f);
  std::printf("%-22s %5s %12s %12s %12s   (CPU us, best; wall us, median)\n", "product", "prec", "builtin", "blas",
              "auto");
  for (const Product& s : kProducts)
    for (int bf16 = 0; bf16 < 2; ++bf16) {
      if (bf16 && s.m > 128) continue;
      std::vector<float> a(size_t(s.m * s.k > s.k * s.n ? s.m * s.k : s.k * s.n) + size_t(s.m * s.m));
      std::vector<float> b(a.size()), c(size_t(s.m * s.n));
      for (float& x : a) x = bf16 ? round_bf16(normal(rng)) : normal(rng);
      for (float& x : b) x = bf16 ? round_bf16(normal(rng)) : normal(rng);
      const Timing tb = time_product("builtin", s, bf16, threads, a, b, c);
      const Timing tl = time_product("blas", s, bf16, threads, a, b, c);
      const Timing ta = time_product("auto", s, bf16, threads, a, b, c);
      std::printf("%-22s %5s %7.1f/%-6.0f %7.1f/%-6.0f %7.1f/%-6.0f\n", s.what, bf16 ? "bf16" : "fp32", tb.cpu_us,
                  tb.wall_us, tl.cpu_us, tl.wall_us, ta.cpu_us, ta.wall_us);
    }
  unsetenv("LOWBIT_MATMUL");
  return 0;
}
