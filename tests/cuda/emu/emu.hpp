// Host emulation of the CUDA features the lowbit kernels use, so the kernel
// source (cuda/step_kernel.cuh, cuda/aux_kernels.cuh, comm/cuda_kernels.cuh),
// the engine (cuda/cuda_engine.cpp) and the communicator's device path run
// and are checked on a machine without a GPU.
//
// A launch runs its blocks one after another; the threads of a block are
// fibers on one OS thread, switched only at barriers, so every interleaving
// the kernels' synchronisation allows is a valid schedule here too.
// __syncthreads waits for all threads of the block that have not exited;
// __shfl_xor_sync is a warp exchange between two barriers of the 32 lanes
// (all lanes must take part, as on the GPU: a deadlock aborts with a message),
// and __syncwarp is one too;
// __shared__ variables are function statics, shared by the fibers of the
// running block; dynamic shared memory (LOWBIT_DYNAMIC_SHARED, the
// shared-bytes argument of launch) is a buffer of exactly that size, filled
// with 0xFF bytes (NaN floats) at the start of every block. Memory is host
// memory: the runtime functions the library calls (cudaMalloc, cudaMemcpy,
// cudaHostAlloc, cudaPointerGetAttributes, ...) are implemented in emu.cpp
// over malloc/memcpy, with cudaMalloc'ed and page-locked ranges tracked; work
// runs at launch, except on a stream under capture, where launches and async
// copies are recorded and run by cudaGraphLaunch (so kernel arguments are the
// values of capture time, as on the GPU). The host synchronisations and
// allocations the runtime functions would make on a GPU are counted
// (emu_counters.h).
//
// Arithmetic is the host compiler's: this checks the kernels' logic (tiles,
// chunks, tails, alignment paths, packing, block reductions, tables), not the
// device's floating point, which the GPU suites check against the CPU engine.
#pragma once
#define LOWBIT_CUDA_EMULATION 1

#include <cuda_runtime.h>  // types (uint4, cudaStream_t, ...) and the runtime API declarations

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

namespace lowbit {
namespace cuda {
namespace emu {

// A stream handle that the emulated runtime reports as being captured.
constexpr uintptr_t kCapturingStream = 0xCA9u;

struct Idx {
  unsigned x, y, z;
};
Idx thread_idx();
Idx block_idx();
Idx block_dim();
Idx grid_dim();
void sync_block();
uint32_t warp_exchange(uint32_t value, unsigned src_lane);
int block_or(int pred);
// Runs body once per thread of every block, now, or, when `stream` is being
// captured (cudaStreamBeginCapture), as a node of the graph being recorded.
void launch(unsigned grid, unsigned block, std::function<void()> body, void* stream);
// The same with `shared_bytes` of dynamic shared memory per block (at most
// 48 KiB, the limit without an opt-in attribute).
void launch(unsigned grid, unsigned block, size_t shared_bytes, std::function<void()> body, void* stream);
// The dynamic shared memory of the running block.
void* dynamic_shared();

}  // namespace emu
}  // namespace cuda
}  // namespace lowbit

#undef __global__
#undef __device__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#undef __grid_constant__
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __grid_constant__
#define threadIdx (::lowbit::cuda::emu::thread_idx())
#define blockIdx (::lowbit::cuda::emu::block_idx())
#define blockDim (::lowbit::cuda::emu::block_dim())
#define gridDim (::lowbit::cuda::emu::grid_dim())

// Dynamic shared memory as an array `name` of T (nvcc: extern __shared__ T name[]).
#define LOWBIT_DYNAMIC_SHARED(T, name) T* const name = static_cast<T*>(::lowbit::cuda::emu::dynamic_shared())
// A pointer used for vector accesses: checked for alignment to its pointee's size.
#define LOWBIT_VECTOR_PTR(p) ::lowbit::cuda::emu::aligned(p)

inline void __syncthreads() { ::lowbit::cuda::emu::sync_block(); }
inline int __syncthreads_or(int pred) { return ::lowbit::cuda::emu::block_or(pred); }

template <class T>
inline T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- and 64-bit shuffles only");
  if (mask != 0xFFFFFFFFu) __builtin_trap();  // the kernels only shuffle full warps
  uint32_t u[2] = {0u, 0u}, r[2];
  std::memcpy(u, &value, sizeof(T));
  for (unsigned k = 0; k < sizeof(T) / 4; ++k)  // a 64-bit shuffle is two 32-bit ones, as on the GPU
    r[k] = ::lowbit::cuda::emu::warp_exchange(u[k], (threadIdx.x & 31u) ^ unsigned(lane_mask));
  T out;
  std::memcpy(&out, r, sizeof(T));
  return out;
}

// A barrier of the 32 lanes (all must take part): what each wrote to shared
// memory before it, every lane reads after it.
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) {
  if (mask != 0xFFFFFFFFu) __builtin_trap();  // the kernels only synchronise full warps
  (void)::lowbit::cuda::emu::warp_exchange(0u, threadIdx.x & 31u);
}

// Threads are fibers switched only at barriers: a read-modify-write is atomic.
inline unsigned int atomicMax(unsigned int* p, unsigned int v) {
  const unsigned int old = *p;
  if (v > old) *p = v;
  return old;
}

namespace lowbit {
namespace cuda {
namespace emu {
[[noreturn]] void misaligned(const void* p, unsigned bytes);
template <class T>
inline const T* aligned(const T* p) {
  // A vector access must be aligned to its size on the GPU (else it faults).
  if (reinterpret_cast<uintptr_t>(p) % sizeof(T) != 0) misaligned(p, unsigned(sizeof(T)));
  return p;
}
template <class T>
inline T* aligned(T* p) {
  if (reinterpret_cast<uintptr_t>(p) % sizeof(T) != 0) misaligned(p, unsigned(sizeof(T)));
  return p;
}
}  // namespace emu
}  // namespace cuda
}  // namespace lowbit

template <class T>
inline T __ldcs(const T* p) {
  return *::lowbit::cuda::emu::aligned(p);
}
template <class T>
inline T __ldg(const T* p) {
  return *::lowbit::cuda::emu::aligned(p);
}
template <class T>
inline void __stcs(T* p, T v) {
  *const_cast<T*>(::lowbit::cuda::emu::aligned(p)) = v;
}

// Reinterpreting intrinsics and the math functions the kernels call unqualified.
inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, 4);
  return i;
}
using std::isfinite;
using std::sqrt;
