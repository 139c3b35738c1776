// CUDA kernels of the 1-bit compressed allreduce: the same arithmetic as
// host_kernels.cpp (the fp32 operations are identical and in the same order;
// only the double sums of squares are accumulated in another order), with
// every scale kept in device memory.
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.hpp"
#include "device.hpp"

namespace lowbit {
namespace onebit {
namespace dev {

namespace {

constexpr int kThreads = 256;
// Dynamic shared memory for the W scales of a message set.
constexpr int64_t kMaxSharedScales = 10240;

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  if (e == cudaErrorMemoryAllocation) fail(LOWBIT_ERROR_OUT_OF_MEMORY, what, ": ", cudaGetErrorString(e));
  fail(LOWBIT_ERROR_CUDA, what, ": ", cudaGetErrorString(e));
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

int blocks_for(int64_t work, int64_t cap) {
  int64_t b = (work + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > cap) b = cap;
  return int(b);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

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

// Fixed-order block sum (blockDim.x == kThreads, a power of two); all threads
// get the result.
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

__global__ void k_worker_sumsq(const float* __restrict__ t, const float* __restrict__ e, int64_t n, bool vec,
                               double* __restrict__ partials) {
  __shared__ double sh[kThreads];
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  double acc = 0.0;
  int64_t start = 0;
  if (vec) {
    const int64_t n4 = n / 4;
    const float4* t4 = reinterpret_cast<const float4*>(t);
    const float4* e4 = reinterpret_cast<const float4*>(e);
    for (int64_t i = tid; i < n4; i += stride) {
      const float4 a = t4[i], b = e4[i];
      const float x0 = a.x + b.x, x1 = a.y + b.y, x2 = a.z + b.z, x3 = a.w + b.w;
      acc += double(x0) * x0 + double(x1) * x1 + double(x2) * x2 + double(x3) * x3;
    }
    start = n4 * 4;
  }
  for (int64_t i = start + tid; i < n; i += stride) {
    const float x = t[i] + e[i];
    acc += double(x) * x;
  }
  const double s = block_sum(acc, sh);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// scal[slot] = sqrt(sum(partials) / count) (0 if count == 0), NaN if the sum
// or one of the W scales at recv (when given) is not finite.
__global__ void k_finish_scale(const double* __restrict__ partials, int nparts, int64_t count, float* scal, int slot,
                               const uint8_t* recv, int world, int64_t msg) {
  __shared__ double sh[kThreads];
  double acc = 0.0;
  for (int p = threadIdx.x; p < nparts; p += kThreads) acc += partials[p];
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
      const float4* t4 = reinterpret_cast<const float4*>(t + base);
      const float4* e4 = reinterpret_cast<const float4*>(e + base);
      const float4 ta = t4[0], tb = t4[1], ea = e4[0], eb = e4[1];
      float x[8] = {ta.x + ea.x, ta.y + ea.y, ta.z + ea.z, ta.w + ea.w,
                    tb.x + eb.x, tb.y + eb.y, tb.z + eb.z, tb.w + eb.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const bool bit = sign_bit(x[k]);
        x[k] = x[k] - signed_scale(bit, s);
        byte |= unsigned(bit) << k;
      }
      float4* w4 = reinterpret_cast<float4*>(ws + base);
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
    const int64_t r = b / cb;
    send[r * msg + 4 + (b - r * cb)] = uint8_t(byte);
  }
}

__global__ void k_server_sum(const uint8_t* __restrict__ recv, int world, int64_t msg, const float* __restrict__ z,
                             float* __restrict__ ws_z, int64_t c, double* __restrict__ partials) {
  extern __shared__ float sc[];
  __shared__ double sh[kThreads];
  for (int j = threadIdx.x; j < world; j += blockDim.x) sc[j] = load_scale(recv + int64_t(j) * msg);
  __syncthreads();
  const float fw = float(world);
  const int64_t nb = (c + 7) / 8;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  double acc2 = 0.0;
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < nb; b += stride) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < world; ++j) {
      const unsigned byte = recv[int64_t(j) * msg + 4 + b];
      const float s = sc[j];
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += signed_scale((byte >> k) & 1u, s);
    }
    const int64_t base = b * 8;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (base + k < c) {
        const float y = acc[k] / fw + z[base + k];
        ws_z[base + k] = y;
        acc2 += double(y) * y;
      }
    }
  }
  const double s = block_sum(acc2, sh);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void k_server_pack(float* __restrict__ ws_z, int64_t c, int64_t cb, const float* __restrict__ scal,
                              uint8_t* __restrict__ gsend) {
  const float s = scal[1];
  if (blockIdx.x == 0 && threadIdx.x == 0) store_scale(gsend, s);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < cb; b += stride) {
    const int64_t base = b * 8;
    unsigned byte = 0;
    for (int k = 0; k < 8 && base + k < c; ++k) {
      const float y = ws_z[base + k];
      const bool bit = sign_bit(y);
      ws_z[base + k] = y - signed_scale(bit, s);
      byte |= unsigned(bit) << k;
    }
    gsend[4 + b] = uint8_t(byte);
  }
}

__global__ void k_finalize(const uint8_t* __restrict__ grecv, int world, int64_t msg, int64_t cb, int64_t n,
                           bool vec, float* __restrict__ out, const float* __restrict__ err,
                           float* __restrict__ ws_err, const float* __restrict__ z, float* __restrict__ ws_z,
                           int64_t cz, int32_t* flag, int32_t* host_flag) {
  extern __shared__ float sc[];
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
      const int64_t r = b / cb;
      const unsigned byte = grecv[r * msg + 4 + (b - r * cb)];
      const float s = sc[r];
      const int64_t base = b * 8;
      if (vec && base + 8 <= n) {
        float4* o4 = reinterpret_cast<float4*>(out + base);
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

size_t scales_smem(int world) {
  LOWBIT_REQUIRE(world <= kMaxSharedScales, LOWBIT_ERROR_UNSUPPORTED, "world size ", world,
                 " exceeds the CUDA path's limit of ", kMaxSharedScales, " ranks");
  return size_t(world) * sizeof(float);
}

}  // namespace

void* alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc (communicator workspace)");
  return p;
}
void release(void* p) noexcept {
  if (p) cudaFree(p);
}
void* alloc_pinned(size_t bytes) {
  void* p = nullptr;
  check(cudaMallocHost(&p, bytes ? bytes : 1), "cudaMallocHost (communicator staging buffer)");
  return p;
}
void release_pinned(void* p) noexcept {
  if (p) cudaFreeHost(p);
}
void* alloc_mapped(size_t bytes, void** device_alias) {
  void* p = nullptr;
  check(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocMapped), "cudaHostAlloc (communicator flag)");
  cudaError_t e = cudaHostGetDevicePointer(device_alias, p, 0);
  if (e != cudaSuccess) {
    cudaFreeHost(p);
    check(e, "cudaHostGetDevicePointer (communicator flag)");
  }
  return p;
}

void copy_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)), "cudaMemcpyAsync");
}
void zero_async(void* dst, size_t bytes, void* stream) {
  if (bytes) check(cudaMemsetAsync(dst, 0, bytes, as_stream(stream)), "cudaMemsetAsync");
}
void sync(void* stream) { check(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize(stream)"); }

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string check_device_pointer(const void* p, int index) {
  cudaPointerAttributes a{};
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("is not CUDA memory (cudaPointerGetAttributes: ") + cudaGetErrorString(e) + ")";
  }
  if (a.type == cudaMemoryTypeManaged) return "";
  if (a.type != cudaMemoryTypeDevice)
    return a.type == cudaMemoryTypeHost ? "is page-locked host memory, not device memory"
                                        : "is host memory, not device memory";
  if (a.device != index)
    return concat("is memory of CUDA device ", a.device, ", not of tensor.device_index ", index);
  return "";
}

DeviceGuard::DeviceGuard(int index) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != index) check(cudaSetDevice(index), "cudaSetDevice(tensor.device_index)");
}
DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_ && previous_ >= 0) cudaSetDevice(previous_);
}

void worker(const float* t, const float* e, float* ws_err, const Layout& l, uint8_t* send, double* partials,
            float* scal, void* stream) {
  cudaStream_t s = as_stream(stream);
  const bool vec = aligned16(t) && aligned16(e) && aligned16(ws_err);
  const int nb1 = blocks_for((l.n + 3) / 4, kMaxPartials);
  k_worker_sumsq<<<nb1, kThreads, 0, s>>>(t, e, l.n, vec, partials);
  k_finish_scale<<<1, kThreads, 0, s>>>(partials, nb1, l.n, scal, 0, nullptr, 0, 0);
  const int64_t nbytes = l.padded / 8;
  k_worker_pack<<<blocks_for(nbytes, 1 << 20), kThreads, 0, s>>>(t, e, ws_err, l.n, nbytes, l.chunk_bytes, l.msg,
                                                                  l.world, vec, scal, send);
  check(cudaGetLastError(), "worker kernels");
}

void server(const uint8_t* recv, const float* z, float* ws_z, const Layout& l, uint8_t* gsend, double* partials,
            float* scal, void* stream) {
  cudaStream_t s = as_stream(stream);
  const int64_t c = l.server_numel();
  const int nb1 = blocks_for((c + 7) / 8, kMaxPartials);
  k_server_sum<<<nb1, kThreads, scales_smem(l.world), s>>>(recv, l.world, l.msg, z, ws_z, c, partials);
  k_finish_scale<<<1, kThreads, 0, s>>>(partials, nb1, c, scal, 1, recv, l.world, l.msg);
  k_server_pack<<<blocks_for(l.chunk_bytes, 1 << 20), kThreads, 0, s>>>(ws_z, c, l.chunk_bytes, scal, gsend);
  check(cudaGetLastError(), "server kernels");
}

void finalize(const uint8_t* grecv, const Layout& l, float* out, const float* err, float* ws_err, const float* z,
              float* ws_z, int32_t* flag, int32_t* host_flag, void* stream) {
  const bool vec = aligned16(out);
  k_finalize<<<blocks_for((l.n + 7) / 8, 1 << 20), kThreads, scales_smem(l.world), as_stream(stream)>>>(
      grecv, l.world, l.msg, l.chunk_bytes, l.n, vec, out, err, ws_err, z, ws_z, l.server_numel(), flag,
      host_flag);
  check(cudaGetLastError(), "finalize kernel");
}

void divide(float* d, int64_t n, float divisor, void* stream) {
  k_divide<<<blocks_for(n, 1 << 20), kThreads, 0, as_stream(stream)>>>(d, n, divisor);
  check(cudaGetLastError(), "divide kernel");
}

}  // namespace dev
}  // namespace onebit
}  // namespace lowbit
