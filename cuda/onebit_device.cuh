// Device helpers shared by the 1-bit element-wise kernels (onebit_kernels.cuh,
// onebit_ext_kernels.cuh): the dtype of a table entry, the skip flag read in
// stream order, and the part of a chunk that one block sweeps.
#pragma once
#ifndef LOWBIT_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include "cuda/tables.hpp"

namespace lowbit {
namespace cuda {

__device__ __forceinline__ lowbit_dtype_t to_lowbit_dtype(uint8_t d) {
  return d == kF32 ? LOWBIT_DTYPE_FLOAT32 : (d == kBF16 ? LOWBIT_DTYPE_BFLOAT16 : LOWBIT_DTYPE_FLOAT16);
}

__device__ __forceinline__ bool skip_flag_set(const int32_t* flag) {
  return *static_cast<const volatile int32_t*>(flag) != 0;
}

// Block b sweeps part b % kSplit of chunk b / kSplit: elements [begin, end).
struct ChunkPart {
  DevChunk chunk;
  int64_t begin, end;
};

__device__ __forceinline__ ChunkPart chunk_part(const DevChunk* chunks, unsigned block) {
  ChunkPart c;
  c.chunk = chunks[block / kSplit];
  const int64_t per = (c.chunk.end - c.chunk.begin + kSplit - 1) / kSplit;
  c.begin = c.chunk.begin + per * int64_t(block % kSplit);
  c.end = c.begin + per < c.chunk.end ? c.begin + per : c.chunk.end;
  return c;
}

}  // namespace cuda
}  // namespace lowbit
