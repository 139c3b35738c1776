// An engine runs steps on one device: it owns how state memory is allocated
// and how the per-element math of update_rules.hpp is swept over the
// parameters. The CPU engine is always built; the CUDA engine (cuda/) when
// the toolkit is found.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "state.hpp"

namespace lowbit {

// A range of one parameter's elements; `begin` is a multiple of kTile so
// chunks never split a quantization block.
struct Chunk {
  int32_t param;
  int64_t begin, end;
};

constexpr int64_t kChunkElements = 64 * 1024;

class Engine {
 public:
  virtual ~Engine() = default;
  virtual lowbit_device_t device() const = 0;
  // Zero-filled memory for optimizer state; throws lowbit::Error on failure.
  virtual void* allocate_zeroed(size_t bytes) = 0;
  virtual void release(void* ptr) noexcept = 0;
  // Blocking copies between engine memory and the host (checkpoints, reads).
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  // True if any gradient element of a parameter with a gradient is NaN/Inf.
  virtual bool any_nonfinite(const ParamView* params, const Chunk* chunks, int64_t num_chunks, void* stream) = 0;
  // One step of `algo` over every chunk whose parameter has a gradient.
  virtual void step(Algo algo, const ParamView* params, const Chunk* chunks, int64_t num_chunks, void* stream) = 0;
};

std::unique_ptr<Engine> make_cpu_engine(int num_threads);
// Throws LOWBIT_ERROR_UNSUPPORTED when the library was built without CUDA.
std::unique_ptr<Engine> make_cuda_engine(int device_index);

// Appends the chunks of a parameter of `numel` elements.
template <class Vec>
void append_chunks(Vec& chunks, int32_t param, int64_t numel) {
  for (int64_t b = 0; b < numel; b += kChunkElements)
    chunks.push_back(Chunk{param, b, b + kChunkElements < numel ? b + kChunkElements : numel});
}

}  // namespace lowbit
