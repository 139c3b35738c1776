// lowbit's own product (cpu_gemm.hpp): tiles of C (at most kMC x kNC) are
// shared out to the threads; a tile packs kKC-deep slices of op(A) and op(B)
// into register-tile panels and keeps its running sums in the thread's
// scratch, so every element is summed over q in order whatever the blocking.
// The register tile is kMR rows by two vectors (AVX-512: 6 x 32, AVX2: 6 x 16,
// the portable form: 6 x 8 in 16-byte vectors, which SSE2 and NEON have);
// products and sums are separate instructions (this file is built with
// -ffp-contract=off), so every form gives the bits of the scalar loop.
#include "cpu_gemm.hpp"

#include <algorithm>
#include <cstring>
#include <new>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu_features.hpp"
#include "error.hpp"

namespace lowbit {
namespace {

constexpr int64_t kMR = 6;
constexpr int64_t kKC = 256;
constexpr int64_t kMC = 96;   // a multiple of kMR
constexpr int64_t kNC = 192;  // a multiple of every form's tile width (8, 16, 32)
constexpr int64_t kScratchFloats = kMC * kKC + kKC * kNC + kMC * kNC;  // A slice, B slice, the tile's sums
// Below this many multiply-adds the product runs on the calling thread; at
// most this many, and at most kNC columns, it skips the tiles' packing.
constexpr int64_t kParallelMinWork = int64_t(1) << 18;
constexpr int64_t kSmallWork = int64_t(1) << 15;

struct Operands {
  const float* a;
  const float* b;
  float* c;
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
};

#define LOWBIT_GEMM_INLINE __attribute__((always_inline)) inline

// kMR-row panels of op(A) rows [i0, i0 + mc), depth [q0, q0 + kc):
// panel p holds a(i0 + p kMR + r, q0 + q) at p kc kMR + q kMR + r, 0 past m.
LOWBIT_GEMM_INLINE void pack_a(const Operands& o, int64_t i0, int64_t mc, int64_t q0, int64_t kc, float* ap) {
  for (int64_t p = 0; p * kMR < mc; ++p) {
    float* dst = ap + p * kc * kMR;
    for (int64_t r = 0; r < kMR; ++r) {
      const int64_t i = i0 + p * kMR + r;
      if (p * kMR + r >= mc) {
        for (int64_t q = 0; q < kc; ++q) dst[q * kMR + r] = 0.f;
      } else if (o.ta) {
        const float* src = o.a + q0 * o.m + i;
        for (int64_t q = 0; q < kc; ++q) dst[q * kMR + r] = src[q * o.m];
      } else {
        const float* src = o.a + i * o.k + q0;
        for (int64_t q = 0; q < kc; ++q) dst[q * kMR + r] = src[q];
      }
    }
  }
}

// nr-column panels of op(B) columns [j0, j0 + nc): panel p holds
// b(q0 + q, j0 + p nr + s) at p kc nr + q nr + s, 0 past n.
template <int64_t nr>
LOWBIT_GEMM_INLINE void pack_b(const Operands& o, int64_t j0, int64_t nc, int64_t q0, int64_t kc, float* bp) {
  for (int64_t p = 0; p * nr < nc; ++p) {
    float* dst = bp + p * kc * nr;
    const int64_t width = std::min(nr, nc - p * nr), j = j0 + p * nr;
    if (o.tb) {
      for (int64_t s = 0; s < nr; ++s) {
        if (s >= width) {
          for (int64_t q = 0; q < kc; ++q) dst[q * nr + s] = 0.f;
          continue;
        }
        const float* src = o.b + (j + s) * o.k + q0;
        for (int64_t q = 0; q < kc; ++q) dst[q * nr + s] = src[q];
      }
    } else {
      for (int64_t q = 0; q < kc; ++q) {
        const float* src = o.b + (q0 + q) * o.n + j;
        for (int64_t s = 0; s < width; ++s) dst[q * nr + s] = src[s];
        for (int64_t s = width; s < nr; ++s) dst[q * nr + s] = 0.f;
      }
    }
  }
}

// sums[r][s] += sum over q of ap[q][r] * bp[q][s], q in order, for a
// kMR x (2 lanes) register tile; `sums` has row stride ld.
template <int lanes>
LOWBIT_GEMM_INLINE void micro_tile(int64_t kc, const float* __restrict ap, const float* __restrict bp,
                                   float* __restrict sums, int64_t ld) {
  typedef float V __attribute__((vector_size(4 * lanes)));
  V lo[kMR], hi[kMR];
  for (int64_t r = 0; r < kMR; ++r) {
    std::memcpy(&lo[r], sums + r * ld, sizeof(V));
    std::memcpy(&hi[r], sums + r * ld + lanes, sizeof(V));
  }
  for (int64_t q = 0; q < kc; ++q) {
    V b0, b1;
    std::memcpy(&b0, bp + q * 2 * lanes, sizeof(V));
    std::memcpy(&b1, bp + q * 2 * lanes + lanes, sizeof(V));
    for (int64_t r = 0; r < kMR; ++r) {
      const float x = ap[q * kMR + r];
      lo[r] += b0 * x;
      hi[r] += b1 * x;
    }
  }
  for (int64_t r = 0; r < kMR; ++r) {
    std::memcpy(sums + r * ld, &lo[r], sizeof(V));
    std::memcpy(sums + r * ld + lanes, &hi[r], sizeof(V));
  }
}

// The tile C[i0 .. i0 + mc) x [j0 .. j0 + nc) (mc <= kMC, nc <= kNC).
template <int lanes>
LOWBIT_GEMM_INLINE void tile(const Operands& o, int64_t i0, int64_t mc, int64_t j0, int64_t nc, float* scratch) {
  constexpr int64_t nr = 2 * lanes;
  const int64_t row_panels = (mc + kMR - 1) / kMR, col_panels = (nc + nr - 1) / nr, ld = col_panels * nr;
  float* ap = scratch;
  float* bp = ap + kMC * kKC;
  float* sums = bp + kKC * kNC;
  std::fill(sums, sums + row_panels * kMR * ld, 0.f);
  for (int64_t q0 = 0; q0 < o.k; q0 += kKC) {
    const int64_t kc = std::min(kKC, o.k - q0);
    pack_a(o, i0, mc, q0, kc, ap);
    pack_b<nr>(o, j0, nc, q0, kc, bp);
    for (int64_t jp = 0; jp < col_panels; ++jp)
      for (int64_t ip = 0; ip < row_panels; ++ip)
        micro_tile<lanes>(kc, ap + ip * kc * kMR, bp + jp * kc * nr, sums + ip * kMR * ld + jp * nr, ld);
  }
  for (int64_t r = 0; r < mc; ++r) {
    float* c = o.c + (i0 + r) * o.n + j0;
    const float* s = sums + r * ld;
    if (o.beta == 0.f)
      for (int64_t j = 0; j < nc; ++j) c[j] = o.alpha * s[j];
    else
      for (int64_t j = 0; j < nc; ++j) c[j] = o.alpha * s[j] + o.beta * c[j];
  }
}

// A product too small for the tiles' packing to pay: row by row, each row's
// sums in `sums` (n floats), q in order (the same bits as the tiles).
void small_product(const Operands& o, float* sums) {
  for (int64_t i = 0; i < o.m; ++i) {
    std::fill(sums, sums + o.n, 0.f);
    for (int64_t q = 0; q < o.k; ++q) {
      const float x = o.ta ? o.a[q * o.m + i] : o.a[i * o.k + q];
      if (o.tb)
        for (int64_t j = 0; j < o.n; ++j) sums[j] += x * o.b[j * o.k + q];
      else
        for (int64_t j = 0; j < o.n; ++j) sums[j] += x * o.b[q * o.n + j];
    }
    float* c = o.c + i * o.n;
    if (o.beta == 0.f)
      for (int64_t j = 0; j < o.n; ++j) c[j] = o.alpha * sums[j];
    else
      for (int64_t j = 0; j < o.n; ++j) c[j] = o.alpha * sums[j] + o.beta * c[j];
  }
}

using TileFn = void (*)(const Operands&, int64_t, int64_t, int64_t, int64_t, float*);

void tile_portable(const Operands& o, int64_t i0, int64_t mc, int64_t j0, int64_t nc, float* scratch) {
  tile<4>(o, i0, mc, j0, nc, scratch);
}
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOWBIT_GEMM_X86 1
__attribute__((target("avx2"))) void tile_avx2(const Operands& o, int64_t i0, int64_t mc, int64_t j0, int64_t nc,
                                               float* scratch) {
  tile<8>(o, i0, mc, j0, nc, scratch);
}
__attribute__((target("avx512f"))) void tile_avx512(const Operands& o, int64_t i0, int64_t mc, int64_t j0,
                                                    int64_t nc, float* scratch) {
  tile<16>(o, i0, mc, j0, nc, scratch);
}
#endif

TileFn tile_for(GemmIsa isa) {
#ifdef LOWBIT_GEMM_X86
  if (isa == GemmIsa::Avx512) return tile_avx512;
  if (isa == GemmIsa::Avx2) return tile_avx2;
#endif
  (void)isa;
  return tile_portable;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

bool gemm_isa_runs(GemmIsa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case GemmIsa::Portable: return true;
#ifdef LOWBIT_GEMM_X86
    case GemmIsa::Avx2: return f.avx2;
    case GemmIsa::Avx512: return f.avx512;
#endif
    default: return false;
  }
}

GemmIsa gemm_isa_best() {  // the CPU level that runs (core/cpu_features.hpp)
  switch (cpu_isa()) {
    case CpuIsa::Avx512: return gemm_isa_runs(GemmIsa::Avx512) ? GemmIsa::Avx512 : GemmIsa::Portable;
    case CpuIsa::Avx2: return gemm_isa_runs(GemmIsa::Avx2) ? GemmIsa::Avx2 : GemmIsa::Portable;
    case CpuIsa::Portable:
    case CpuIsa::Neon: break;
  }
  return GemmIsa::Portable;
}

void BuiltinGemm::reserve(int num_threads) {
  const int threads = std::max(1, num_threads);
  if (threads <= threads_) return;
  try {
    scratch_.resize(size_t(threads) * size_t(kScratchFloats));
  } catch (const std::bad_alloc&) {
    fail(LOWBIT_ERROR_OUT_OF_MEMORY, "could not allocate ", size_t(threads) * size_t(kScratchFloats) * 4,
         " bytes of scratch for Muon's matrix products");
  }
  threads_ = threads;
}

void BuiltinGemm::run(const GemmShape& s, const float* a, const float* b, float* c, float alpha, float beta,
                      int num_threads, GemmIsa isa) {
  if (s.m <= 0 || s.n <= 0) return;
  const Operands o{a, b, c, s.m, s.n, s.k, s.trans_a, s.trans_b, alpha, beta};
  const bool parallel = num_threads > 1 && s.m * s.n * std::max<int64_t>(s.k, 1) >= kParallelMinWork;
  const int threads = parallel ? num_threads : 1;
  reserve(threads);
  if (s.m * s.n * s.k <= kSmallWork && s.n <= kNC) {
    small_product(o, scratch_.data());
    return;
  }
  // Tiles of at most kMC rows: more of them (down to kMR rows) when there
  // are too few to keep every thread busy. The bits do not depend on it.
  const int64_t col_blocks = ceil_div(s.n, kNC);
  int64_t row_blocks = ceil_div(s.m, kMC);
  if (row_blocks * col_blocks < 2 * threads)
    row_blocks = std::min(ceil_div(s.m, kMR), ceil_div(2 * threads, col_blocks));
  const int64_t mc = ceil_div(ceil_div(s.m, row_blocks), kMR) * kMR;
  row_blocks = ceil_div(s.m, mc);
  const int64_t nc = ceil_div(ceil_div(s.n, col_blocks), 8) * 8;
  const TileFn run_tile = tile_for(isa);
  const bool mirror = s.symmetric && s.m == s.n;
  float* scratch = scratch_.data();
  const int64_t tiles = row_blocks * col_blocks;
#pragma omp parallel for schedule(dynamic) num_threads(threads) if (parallel)
  for (int64_t t = 0; t < tiles; ++t) {
    // Down the columns of tiles: a thread's next tile packs the same columns
    // of op(B) again, which are still in its cache.
    const int64_t i0 = (t % row_blocks) * mc, j0 = (t / row_blocks) * nc;
    const int64_t rows = std::min(mc, s.m - i0), cols = std::min(nc, s.n - j0);
    if (cols <= 0 || (mirror && j0 + cols <= i0)) continue;  // below the diagonal: mirrored
#ifdef _OPENMP
    float* mine = scratch + int64_t(omp_get_thread_num()) * kScratchFloats;
#else
    float* mine = scratch;
#endif
    run_tile(o, i0, rows, j0, cols, mine);
  }
  if (mirror) {
    // Every element below the diagonal from its mirror image (the same bits:
    // the same products summed in the same order).
#pragma omp parallel for num_threads(threads) if (parallel)
    for (int64_t i = 1; i < s.m; ++i)
      for (int64_t j = 0; j < i; ++j) c[i * s.n + j] = c[j * s.n + i];
  }
}

}  // namespace lowbit
