// CUDA kernels of the 1-bit compressed allreduce: the same arithmetic as
// host_kernels.cpp (every fp32 and fp64 operation identical and in the same
// order, the sums of squares included: sumsq.hpp), with every scale kept in
// device memory, so a device call gives the bits of a host call. Device code
// plus the geometry of every launch (enqueue_*), shared by the nvcc launchers
// (cuda_kernels.cu, built with --fmad=false: no contraction into FMA) and
// the host emulation (tests/cuda/emu/emu.hpp, emu_comm_kernels.cpp).
#pragma once
#ifndef LOWBIT_CUDA_EMULATION  // tests/cuda/emu: the same kernel code run on the host
#include <cuda_runtime.h>
// Dynamic shared memory (the third launch parameter) as an array `name` of T.
#define LOWBIT_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
// A pointer used for vector (float4) accesses; the emulation checks its alignment.
#define LOWBIT_VECTOR_PTR(p) (p)
#endif

#include <cstddef>
#include <cstdint>

#include "comm/device.hpp"
#include "comm/layout.hpp"
#include "comm/sumsq.hpp"
#include "core/error.hpp"

namespace lowbit {
namespace onebit {
namespace dev {

constexpr int kThreads = 256;
// Dynamic shared memory for the W scales of a message set.
constexpr int64_t kMaxSharedScales = 10240;

__device__ __forceinline__ float load_scale(const uint8_t* m) {
  const uint32_t u = uint32_t(m[0]) | (uint32_t(m[1]) << 8) | (uint32_t(m[2]) << 16) | (uint32_t(m[3]) << 24);
  return __uint_as_float(u);
}

__device__ __forceinline__ void store_scale(uint8_t* m, float s) {
  const uint32_t u = __float_as_uint(s);
  m[0] = uint8_t(u);
  m[1] = uint8_t(u >> 8);
  m[2] = uint8_t(u >> 16);
  m[3] = uint8_t(u >> 24);
}

// b / cb (the message a packed byte belongs to) in 32 bits where both fit:
// a 64-bit division is tens of instructions per byte.
__device__ __forceinline__ int64_t message_of(int64_t b, int64_t cb) {
  if (b <= INT32_MAX && cb <= INT32_MAX) return int64_t(uint32_t(b) / uint32_t(cb));
  return b / cb;
}

// tree256 of sumsq.hpp over the block (blockDim.x == kThreads == 256): all
// threads get the result.
__device__ double block_sum(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

// seg[s] = sum of (t + e)^2 over segment s (sumsq.hpp), for the segments
// s = blockIdx.x, blockIdx.x + gridDim.x, ...: thread c owns lanes 8c .. 8c+7.
__global__ void k_worker_sumsq(const float* __restrict__ t, const float* __restrict__ e, int64_t n, bool vec,
                               double* __restrict__ seg, int64_t nseg) {
  __shared__ double sh[kThreads];
  for (int64_t sg = blockIdx.x; sg < nseg; sg += gridDim.x) {
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int r = 0; r < sumsq::kRounds; ++r) {
      const int64_t base = sg * sumsq::kSegment + int64_t(r) * sumsq::kLanes + int64_t(threadIdx.x) * 8;
      if (vec && base + 8 <= n) {
        const float4* t4 = LOWBIT_VECTOR_PTR(reinterpret_cast<const float4*>(t + base));
        const float4* e4 = LOWBIT_VECTOR_PTR(reinterpret_cast<const float4*>(e + base));
        const float4 ta = t4[0], tb = t4[1], ea = e4[0], eb = e4[1];
        const float x[8] = {ta.x + ea.x, ta.y + ea.y, ta.z + ea.z, ta.w + ea.w,
                            tb.x + eb.x, tb.y + eb.y, tb.z + eb.z, tb.w + eb.w};
#pragma unroll
        for (int k = 0; k < 8; ++k) a[k] += double(x[k]) * double(x[k]);
      } else {
        for (int k = 0; k < 8 && base + k < n; ++k) {
          const float x = t[base + k] + e[base + k];
          a[k] += double(x) * double(x);
        }
      }
    }
    const double s = block_sum(sumsq::fold8(a), sh);
    if (threadIdx.x == 0) seg[sg] = s;
  }
}

// scal[slot] = sqrt(total / count) (0 if count == 0), NaN if the total or one
// of the W scales at recv (when given) is not finite. The total of the
// segment sums seg[0 .. nseg) as sumsq.hpp: thread c owns accumulator c.
__global__ void k_finish_scale(const double* __restrict__ seg, int64_t nseg, int64_t count, float* scal, int slot,
                               const uint8_t* recv, int world, int64_t msg) {
  __shared__ double sh[kThreads];
  double acc = 0.0;
  for (int64_t p = threadIdx.x; p < nseg; p += kThreads) acc += seg[p];
  const double sum = block_sum(acc, sh);
  __shared__ int bad;
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  if (recv)
    for (int j = threadIdx.x; j < world; j += kThreads)
      if (!isfinite(load_scale(recv + int64_t(j) * msg))) bad = 1;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s;
    if (bad || !isfinite(sum))
      s = __int_as_float(0x7fc00000);
    else if (count <= 0)
      s = 0.0f;
    else
      s = float(sqrt(sum / double(count)));
    scal[slot] = s;
  }
}

__global__ void k_worker_pack(const float* __restrict__ t, const float* __restrict__ e, float* __restrict__ ws,
                              int64_t n, int64_t nbytes, int64_t cb, int64_t msg, int world, bool vec,
                              const float* __restrict__ scal, uint8_t* __restrict__ send) {
  const float s = scal[0];
  if (blockIdx.x == 0)
    for (int r = threadIdx.x; r < world; r += blockDim.x) store_scale(send + int64_t(r) * msg, s);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < nbytes; b += stride) {
    const int64_t base = b * 8;
    unsigned byte = 0;
    if (vec && base + 8 <= n) {
      const float4* t4 = LOWBIT_VECTOR_PTR(reinterpret_cast<const float4*>(t + base));
      const float4* e4 = LOWBIT_VECTOR_PTR(reinterpret_cast<const float4*>(e + base));
      const float4 ta = t4[0], tb = t4[1], ea = e4[0], eb = e4[1];
      float x[8] = {ta.x + ea.x, ta.y + ea.y, ta.z + ea.z, ta.w + ea.w,
                    tb.x + eb.x, tb.y + eb.y, tb.z + eb.z, tb.w + eb.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const bool bit = sign_bit(x[k]);
        x[k] = x[k] - signed_scale(bit, s);
        byte |= unsigned(bit) << k;
      }
      float4* w4 = LOWBIT_VECTOR_PTR(reinterpret_cast<float4*>(ws + base));
      w4[0] = make_float4(x[0], x[1], x[2], x[3]);
      w4[1] = make_float4(x[4], x[5], x[6], x[7]);
    } else {
      for (int k = 0; k < 8 && base + k < n; ++k) {
        const float x = t[base + k] + e[base + k];
        const bool bit = sign_bit(x);
        ws[base + k] = x - signed_scale(bit, s);
        byte |= unsigned(bit) << k;
      }
    }
    const int64_t r = message_of(b, cb);
    send[r * msg + 4 + (b - r * cb)] = uint8_t(byte);
  }
}

// y = mean_j(q_j) + z into ws_z, and seg[s] = sum of y^2 over segment s
// (sumsq.hpp) of this rank's chunk (c elements): thread c owns lanes
// 8c .. 8c+7, the elements of one byte of each message per round.
__global__ void k_server_sum(const uint8_t* __restrict__ recv, int world, int64_t msg, const float* __restrict__ z,
                             float* __restrict__ ws_z, int64_t c, bool vec, double* __restrict__ seg, int64_t nseg) {
  LOWBIT_DYNAMIC_SHARED(float, sc);
  __shared__ double sh[kThreads];
  for (int j = threadIdx.x; j < world; j += blockDim.x) sc[j] = load_scale(recv + int64_t(j) * msg);
  __syncthreads();
  const float fw = float(world);
  for (int64_t sg = blockIdx.x; sg < nseg; sg += gridDim.x) {
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int r = 0; r < sumsq::kRounds; ++r) {
      const int64_t base = sg * sumsq::kSegment + int64_t(r) * sumsq::kLanes + int64_t(threadIdx.x) * 8;
      if (base >= c) break;
      const int64_t b = base / 8;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int j = 0; j < world; ++j) {
        const unsigned byte = recv[int64_t(j) * msg + 4 + b];
        const float s = sc[j];
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] += signed_scale((byte >> k) & 1u, s);
      }
      if (vec && base + 8 <= c) {  // two 16-byte loads and stores per lane instead of 8 strided ones
        const float4* z4 = LOWBIT_VECTOR_PTR(reinterpret_cast<const float4*>(z + base));
        const float4 za = z4[0], zb = z4[1];
        const float zk[8] = {za.x, za.y, za.z, za.w, zb.x, zb.y, zb.z, zb.w};
        float y[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          y[k] = acc[k] / fw + zk[k];
          a[k] += double(y[k]) * double(y[k]);
        }
        float4* w4 = LOWBIT_VECTOR_PTR(reinterpret_cast<float4*>(ws_z + base));
        w4[0] = make_float4(y[0], y[1], y[2], y[3]);
        w4[1] = make_float4(y[4], y[5], y[6], y[7]);
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          if (base + k < c) {
            const float y = acc[k] / fw + z[base + k];
            ws_z[base + k] = y;
            a[k] += double(y) * double(y);
          }
        }
      }
    }
    const double s = block_sum(sumsq::fold8(a), sh);
    if (threadIdx.x == 0) seg[sg] = s;
  }
}

__global__ void k_server_pack(float* __restrict__ ws_z, int64_t c, int64_t cb, bool vec,
                              const float* __restrict__ scal, uint8_t* __restrict__ gsend) {
  const float s = scal[1];
  if (blockIdx.x == 0 && threadIdx.x == 0) store_scale(gsend, s);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < cb; b += stride) {
    const int64_t base = b * 8;
    unsigned byte = 0;
    if (vec && base + 8 <= c) {
      float4* w4 = LOWBIT_VECTOR_PTR(reinterpret_cast<float4*>(ws_z + base));
      const float4 ya = w4[0], yb = w4[1];
      float y[8] = {ya.x, ya.y, ya.z, ya.w, yb.x, yb.y, yb.z, yb.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const bool bit = sign_bit(y[k]);
        y[k] = y[k] - signed_scale(bit, s);
        byte |= unsigned(bit) << k;
      }
      w4[0] = make_float4(y[0], y[1], y[2], y[3]);
      w4[1] = make_float4(y[4], y[5], y[6], y[7]);
    } else {
      for (int k = 0; k < 8 && base + k < c; ++k) {
        const float y = ws_z[base + k];
        const bool bit = sign_bit(y);
        ws_z[base + k] = y - signed_scale(bit, s);
        byte |= unsigned(bit) << k;
      }
    }
    gsend[4 + b] = uint8_t(byte);
  }
}

__global__ void k_finalize(const uint8_t* __restrict__ grecv, int world, int64_t msg, int64_t cb, int64_t n,
                           bool vec, float* __restrict__ out, const float* __restrict__ err,
                           float* __restrict__ ws_err, const float* __restrict__ z, float* __restrict__ ws_z,
                           int64_t cz, int32_t* flag, int32_t* host_flag) {
  LOWBIT_DYNAMIC_SHARED(float, sc);
  __shared__ int bad_sh;
  if (threadIdx.x == 0) bad_sh = 0;
  __syncthreads();
  for (int j = threadIdx.x; j < world; j += blockDim.x) {
    sc[j] = load_scale(grecv + int64_t(j) * msg);
    if (!isfinite(sc[j])) bad_sh = 1;
  }
  __syncthreads();
  const int bad = bad_sh;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *flag = bad;
    if (host_flag) *reinterpret_cast<volatile int32_t*>(host_flag) = bad;
  }
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (!bad) {
    const int64_t nbytes = (n + 7) / 8;
    for (int64_t b = tid; b < nbytes; b += stride) {
      const int64_t r = message_of(b, cb);
      const unsigned byte = grecv[r * msg + 4 + (b - r * cb)];
      const float s = sc[r];
      const int64_t base = b * 8;
      if (vec && base + 8 <= n) {
        float4* o4 = LOWBIT_VECTOR_PTR(reinterpret_cast<float4*>(out + base));
        o4[0] = make_float4(signed_scale(byte & 1u, s), signed_scale((byte >> 1) & 1u, s),
                            signed_scale((byte >> 2) & 1u, s), signed_scale((byte >> 3) & 1u, s));
        o4[1] = make_float4(signed_scale((byte >> 4) & 1u, s), signed_scale((byte >> 5) & 1u, s),
                            signed_scale((byte >> 6) & 1u, s), signed_scale((byte >> 7) & 1u, s));
      } else {
        for (int k = 0; k < 8 && base + k < n; ++k) out[base + k] = signed_scale((byte >> k) & 1u, s);
      }
    }
  } else {
    for (int64_t i = tid; i < n; i += stride) ws_err[i] = err[i];
    for (int64_t i = tid; i < cz; i += stride) ws_z[i] = z[i];
  }
}

__global__ void k_divide(float* d, int64_t n, float divisor) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) d[i] = d[i] / divisor;
}

// ---- launch geometry (host code) --------------------------------------------------
// Each enqueue_* issues its kernels through `launch(kernel, blocks,
// shared_bytes, args...)`, which runs kernel<<<blocks, kThreads,
// shared_bytes, stream>>>(args...) (or its emulation).

inline int blocks_for(int64_t work, int64_t cap) {
  int64_t b = (work + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > cap) b = cap;
  return int(b);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline size_t scales_smem(int world) {
  LOWBIT_REQUIRE(world <= kMaxSharedScales, LOWBIT_ERROR_UNSUPPORTED, "world size ", world,
                 " exceeds the CUDA path's limit of ", kMaxSharedScales, " ranks");
  return size_t(world) * sizeof(float);
}

// Blocks for the segments of `count` elements (one block per segment, at
// least one block).
inline int blocks_for_segments(int64_t count) {
  const int64_t s = sumsq::segments(count);
  return int(s < 1 ? 1 : (s > (1 << 20) ? (1 << 20) : s));
}

template <class Launch>
void enqueue_worker(const Launch& launch, const float* t, const float* e, float* ws_err, const Layout& l,
                    uint8_t* send, double* partials, float* scal) {
  const bool vec = aligned16(t) && aligned16(e) && aligned16(ws_err);
  const int64_t nseg = sumsq::segments(l.n);
  launch(k_worker_sumsq, blocks_for_segments(l.n), 0, t, e, l.n, vec, partials, nseg);
  launch(k_finish_scale, 1, 0, partials, nseg, l.n, scal, 0, static_cast<const uint8_t*>(nullptr), 0, int64_t(0));
  const int64_t nbytes = l.padded / 8;
  launch(k_worker_pack, blocks_for(nbytes, 1 << 20), 0, t, e, ws_err, l.n, nbytes, l.chunk_bytes, l.msg, l.world,
         vec, scal, send);
}

template <class Launch>
void enqueue_server(const Launch& launch, const uint8_t* recv, const float* z, float* ws_z, const Layout& l,
                    uint8_t* gsend, double* partials, float* scal) {
  const int64_t c = l.server_numel();
  const int64_t nseg = sumsq::segments(c);
  const bool vec = aligned16(z) && aligned16(ws_z);
  launch(k_server_sum, blocks_for_segments(c), scales_smem(l.world), recv, l.world, l.msg, z, ws_z, c, vec, partials,
         nseg);
  launch(k_finish_scale, 1, 0, partials, nseg, c, scal, 1, recv, l.world, l.msg);
  launch(k_server_pack, blocks_for(l.chunk_bytes, 1 << 20), 0, ws_z, c, l.chunk_bytes, vec, scal, gsend);
}

template <class Launch>
void enqueue_finalize(const Launch& launch, const uint8_t* grecv, const Layout& l, float* out, const float* err,
                      float* ws_err, const float* z, float* ws_z, int32_t* flag, int32_t* host_flag) {
  const bool vec = aligned16(out);
  launch(k_finalize, blocks_for((l.n + 7) / 8, 1 << 20), scales_smem(l.world), grecv, l.world, l.msg, l.chunk_bytes,
         l.n, vec, out, err, ws_err, z, ws_z, l.server_numel(), flag, host_flag);
}

template <class Launch>
void enqueue_divide(const Launch& launch, float* d, int64_t n, float divisor) {
  launch(k_divide, blocks_for(n, 1 << 20), 0, d, n, divisor);
}

}  // namespace dev
}  // namespace onebit
}  // namespace lowbit
