// The CPU engine: OpenMP over ~64K-element chunks; inside a chunk, tiles of
// kTile elements are decoded into fp32 stack arrays, updated by a loop the
// compiler vectorises, and encoded back. No heap allocation per step; extra
// memory is O(threads x tile).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "codec.hpp"
#include "engine.hpp"
#include "error.hpp"
#include "simd.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace lowbit {
namespace {

template <Algo A>
LOWBIT_VECTOR_CLONES void update_tile(const StepScalars& s, int n, float* __restrict p, const float* __restrict g, float* __restrict m,
                 float* __restrict v) {
  for (int i = 0; i < n; ++i) update_element<A>(s, p[i], g[i], m[i], v[i]);
}

struct alignas(64) Tile {
  float p[kTile], g[kTile], m[kTile], v[kTile];
};

void step_chunk(Algo algo, const ParamView& pv, const Chunk& c) {
  Tile t;
  for (int64_t base = c.begin; base < c.end; base += kTile) {
    int n = int(c.end - base < kTile ? c.end - base : kTile);
    load_tensor_tile(pv.grad, pv.grad_dtype, base, n, t.g);
    load_param_tile(pv, base, n, t.p);
    if (pv.num_moments > 0) decode_moment_tile(pv.moment[0], base, n, t.m);
    if (pv.num_moments > 1) decode_moment_tile(pv.moment[1], base, n, t.v);
    switch (algo) {
      case Algo::AdamW: update_tile<Algo::AdamW>(pv.scalars, n, t.p, t.g, t.m, t.v); break;
      case Algo::Adam: update_tile<Algo::Adam>(pv.scalars, n, t.p, t.g, t.m, t.v); break;
      case Algo::Lion: update_tile<Algo::Lion>(pv.scalars, n, t.p, t.g, t.m, t.v); break;
      case Algo::Sgd: update_tile<Algo::Sgd>(pv.scalars, n, t.p, t.g, t.m, t.v); break;
    }
    if (pv.num_moments > 0) encode_moment_tile(pv.moment[0], base, n, t.m);
    if (pv.num_moments > 1) encode_moment_tile(pv.moment[1], base, n, t.v);
    store_param_tile(pv, base, n, t.p);
  }
}

LOWBIT_VECTOR_CLONES
bool chunk_has_nonfinite(const ParamView& pv, const Chunk& c) {
  if (pv.grad_dtype == LOWBIT_DTYPE_FLOAT32) {
    const uint32_t* g = static_cast<const uint32_t*>(pv.grad);
    uint32_t bad = 0;
    for (int64_t i = c.begin; i < c.end; ++i) bad |= uint32_t((g[i] & 0x7F800000u) == 0x7F800000u);
    return bad != 0;
  }
  const uint16_t* g = static_cast<const uint16_t*>(pv.grad);
  uint16_t exp_mask = pv.grad_dtype == LOWBIT_DTYPE_BFLOAT16 ? 0x7F80u : 0x7C00u;
  uint32_t bad = 0;
  for (int64_t i = c.begin; i < c.end; ++i) bad |= uint32_t((g[i] & exp_mask) == exp_mask);
  return bad != 0;
}

// Below this many elements a step runs on the calling thread: waking a team
// costs more than it saves, and it would compete with the caller's own
// threads (BLAS, data loading) between steps.
constexpr int64_t kParallelMinElements = 1 << 18;

int64_t total_elements(const Chunk* chunks, int64_t num_chunks) {
  int64_t total = 0;
  for (int64_t k = 0; k < num_chunks; ++k) total += chunks[k].end - chunks[k].begin;
  return total;
}

class CpuEngine final : public Engine {
 public:
  explicit CpuEngine(int num_threads) : num_threads_(num_threads) {
#ifdef _OPENMP
    if (num_threads_ <= 0) num_threads_ = omp_get_max_threads();
#else
    num_threads_ = 1;
#endif
  }

  lowbit_device_t device() const override { return LOWBIT_DEVICE_CPU; }

  void* allocate_zeroed(size_t bytes) override {
    void* p = std::calloc(bytes ? bytes : 1, 1);
    if (!p) fail(LOWBIT_ERROR_OUT_OF_MEMORY, "could not allocate ", bytes, " bytes of optimizer state");
    return p;
  }
  void release(void* ptr) noexcept override { std::free(ptr); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }

  bool any_nonfinite(const ParamView* params, const Chunk* chunks, int64_t num_chunks, void*) override {
    int found = 0;
    const bool parallel = total_elements(chunks, num_chunks) >= kParallelMinElements;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads_) reduction(| : found) if (parallel)
    for (int64_t k = 0; k < num_chunks; ++k) {
      const ParamView& pv = params[chunks[k].param];
      if (pv.grad && chunk_has_nonfinite(pv, chunks[k])) found |= 1;
    }
    return found != 0;
  }

  void step(Algo algo, const ParamView* params, const Chunk* chunks, int64_t num_chunks, void*) override {
    const bool parallel = total_elements(chunks, num_chunks) >= kParallelMinElements;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads_) if (parallel)
    for (int64_t k = 0; k < num_chunks; ++k) {
      const ParamView& pv = params[chunks[k].param];
      if (pv.grad) step_chunk(algo, pv, chunks[k]);
    }
  }

 private:
  int num_threads_;
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(int num_threads) { return std::make_unique<CpuEngine>(num_threads); }

#ifndef LOWBIT_CUDA_ENGINE
std::unique_ptr<Engine> make_cuda_engine(int) {
  fail(LOWBIT_ERROR_UNSUPPORTED, "device: this lowbit library was built without CUDA support");
}
#endif

}  // namespace lowbit
