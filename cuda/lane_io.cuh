// A lane's 8 consecutive elements in registers: loads and stores of 16-bit
// and fp32 tensors and of 8-bit / 4-bit codes, 16 or 8 bytes at a time when
// whole and aligned, element by element otherwise, into one register layout
// (Raw). Shared by the step kernel and the shaped passes.
#pragma once
#ifndef LOWBIT_CUDA_EMULATION  // tests/cuda/emu: the same kernel code run on the host
#include <cuda_runtime.h>
#endif

#include <cstdint>

#include "core/float16.hpp"
#include "cuda/tables.hpp"

namespace lowbit {
namespace cuda {

// Raw storage of the 8 elements of one lane (at most 32 bytes).
struct Raw {
  uint32_t w[8];
};

__device__ __forceinline__ void zero(Raw& r) {
#pragma unroll
  for (int i = 0; i < 8; ++i) r.w[i] = 0u;
}

__device__ __forceinline__ void ld16(uint32_t* w, const void* p) {
  uint4 v = __ldcs(static_cast<const uint4*>(p));
  w[0] = v.x;
  w[1] = v.y;
  w[2] = v.z;
  w[3] = v.w;
}

__device__ __forceinline__ void st16(void* p, const uint32_t* w) {
  __stcs(static_cast<uint4*>(p), make_uint4(w[0], w[1], w[2], w[3]));
}

// Elements [e0, e0 + n) (n <= 8) of a tensor of 4-byte (`wide`) or 2-byte
// elements into r: element j in word j (wide) or halfword j.
__device__ __forceinline__ void load_elems(Raw& r, const void* base, bool wide, int64_t e0, int n, bool vec) {
  if (n == 8 && vec) {
    if (wide) {
      const uint32_t* p = static_cast<const uint32_t*>(base) + e0;
      ld16(r.w, p);
      ld16(r.w + 4, p + 4);
    } else {
      ld16(r.w, static_cast<const uint16_t*>(base) + e0);
    }
  } else if (n > 0) {
    if (wide) {
      const uint32_t* p = static_cast<const uint32_t*>(base) + e0;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (j < n) r.w[j] = p[j];
    } else {
      const uint16_t* p = static_cast<const uint16_t*>(base) + e0;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (j < n) r.w[j >> 1] |= uint32_t(p[j]) << (16 * (j & 1));
    }
  }
}

__device__ __forceinline__ void store_elems(void* base, bool wide, int64_t e0, int n, bool vec, const Raw& r) {
  if (n == 8 && vec) {
    if (wide) {
      uint32_t* p = static_cast<uint32_t*>(base) + e0;
      st16(p, r.w);
      st16(p + 4, r.w + 4);
    } else {
      st16(static_cast<uint16_t*>(base) + e0, r.w);
    }
  } else if (n > 0) {
    if (wide) {
      uint32_t* p = static_cast<uint32_t*>(base) + e0;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (j < n) p[j] = r.w[j];
    } else {
      uint16_t* p = static_cast<uint16_t*>(base) + e0;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (j < n) p[j] = uint16_t(r.w[j >> 1] >> (16 * (j & 1)));
    }
  }
}

// `nbytes` bytes at p into r.w[0..1]; `full` (8 or 4) bytes are one aligned load.
__device__ __forceinline__ void load_bytes(Raw& r, const uint8_t* p, int nbytes, int full) {
  if (nbytes == full) {
    if (full == 8) {
      uint2 v = __ldcs(reinterpret_cast<const uint2*>(p));
      r.w[0] = v.x;
      r.w[1] = v.y;
    } else {
      r.w[0] = __ldcs(reinterpret_cast<const unsigned int*>(p));
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (j < nbytes) r.w[j >> 2] |= uint32_t(p[j]) << (8 * (j & 3));
  }
}

__device__ __forceinline__ void store_bytes(uint8_t* p, int nbytes, int full, const Raw& r) {
  if (nbytes == full) {
    if (full == 8)
      __stcs(reinterpret_cast<uint2*>(p), make_uint2(r.w[0], r.w[1]));
    else
      __stcs(reinterpret_cast<unsigned int*>(p), r.w[0]);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (j < nbytes) p[j] = uint8_t(r.w[j >> 2] >> (8 * (j & 3)));
  }
}

__device__ __forceinline__ uint32_t half_at(const Raw& r, int j) { return (r.w[j >> 1] >> (16 * (j & 1))) & 0xFFFFu; }
__device__ __forceinline__ uint32_t byte_at(const Raw& r, int j) { return (r.w[j >> 2] >> (8 * (j & 3))) & 0xFFu; }

__device__ __forceinline__ void tensor_to_float(uint8_t dtype, const Raw& r, float (&x)[8]) {
  if (dtype == kF32) {
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = bits_float(r.w[j]);
  } else if (dtype == kBF16) {
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = bf16_to_float(uint16_t(half_at(r, j)));
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = fp16_to_float(uint16_t(half_at(r, j)));
  }
}

// Elements e0 .. e0 + 7 (n of them valid, the rest 0) of a 16-bit or fp32
// tensor as floats; vec: the base is 16-byte aligned.
__device__ __forceinline__ void load_floats8(const void* data, uint8_t dtype, int64_t e0, int n, bool vec,
                                             float (&x)[8]) {
  Raw r;
  zero(r);
  load_elems(r, data, dtype == kF32, e0, n, vec);
  tensor_to_float(dtype, r, x);
}

// The codes of elements e0 .. e0 + 7 (e0 a multiple of 8; n valid).
__device__ __forceinline__ void load_codes8(const void* data, bool four, int64_t e0, int n, uint32_t (&c)[8]) {
  const uint8_t* b = static_cast<const uint8_t*>(data);
  Raw r;
  zero(r);
  if (four) {
    load_bytes(r, b + e0 / 2, (n + 1) / 2, 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) c[j] = (r.w[0] >> (4 * j)) & 0xFu;
  } else {
    load_bytes(r, b + e0, n, 8);
#pragma unroll
    for (int j = 0; j < 8; ++j) c[j] = byte_at(r, j);
  }
}

}  // namespace cuda
}  // namespace lowbit
