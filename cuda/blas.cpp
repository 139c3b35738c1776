#include "cuda/blas.hpp"

#include <cublas_api.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <string>

#include "core/error.hpp"
#include "cuda/tables.hpp"

namespace lowbit {
namespace cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's own recommendation for Hopper

using CreateFn = cublasStatus_t (*)(cublasHandle_t*);
using DestroyFn = cublasStatus_t (*)(cublasHandle_t);
using SetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
using SetWorkspaceFn = cublasStatus_t (*)(cublasHandle_t, void*, size_t);
using GemmFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                  const void*, cudaDataType, int, long long, const void*, cudaDataType, int, long long,
                                  const void*, void*, cudaDataType, int, long long, int, cublasComputeType_t,
                                  cublasGemmAlgo_t);

void check_cublas(cublasStatus_t s, const char* what) {
  LOWBIT_REQUIRE(s == CUBLAS_STATUS_SUCCESS, LOWBIT_ERROR_CUDA, what, " failed (cuBLAS status ", int(s), ")");
}
void check_cuda(cudaError_t e, const char* what) {
  LOWBIT_REQUIRE(e == cudaSuccess, LOWBIT_ERROR_CUDA, what, ": ", cudaGetErrorString(e));
}

}  // namespace

struct Blas::Impl {
  void* lib = nullptr;
  CreateFn create = nullptr;
  DestroyFn destroy = nullptr;
  SetStreamFn set_stream = nullptr;
  SetWorkspaceFn set_workspace = nullptr;
  GemmFn gemm = nullptr;
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
};

Blas::Blas(int device) : impl_(new Impl) {
  Impl& b = *impl_;
  try {
    const std::string name = "libcublas.so." + std::to_string(CUDART_VERSION / 1000);
    b.lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!b.lib) b.lib = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
    LOWBIT_REQUIRE(b.lib != nullptr, LOWBIT_ERROR_UNSUPPORTED, "Muon on CUDA needs cuBLAS: could not load ", name,
                   " (", dlerror(), "); install the CUDA toolkit's cuBLAS or add its directory to LD_LIBRARY_PATH");
    auto sym = [&](const char* s) {
      void* f = dlsym(b.lib, s);
      LOWBIT_REQUIRE(f != nullptr, LOWBIT_ERROR_UNSUPPORTED, "the loaded cuBLAS has no ", s);
      return f;
    };
    b.create = reinterpret_cast<CreateFn>(sym("cublasCreate_v2"));
    b.destroy = reinterpret_cast<DestroyFn>(sym("cublasDestroy_v2"));
    b.set_stream = reinterpret_cast<SetStreamFn>(sym("cublasSetStream_v2"));
    b.set_workspace = reinterpret_cast<SetWorkspaceFn>(sym("cublasSetWorkspace_v2"));
    b.gemm = reinterpret_cast<GemmFn>(sym("cublasGemmStridedBatchedEx"));
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    check_cublas(b.create(&b.handle), "cublasCreate");
    check_cuda(cudaMalloc(&b.workspace, kWorkspaceBytes), "allocating the cuBLAS workspace");
    check_cublas(b.set_workspace(b.handle, b.workspace, kWorkspaceBytes), "cublasSetWorkspace");
  } catch (...) {
    release();
    throw;
  }
}

Blas::~Blas() { release(); }

void Blas::release() noexcept {
  if (!impl_) return;
  if (impl_->handle) impl_->destroy(impl_->handle);
  if (impl_->workspace) cudaFree(impl_->workspace);
  if (impl_->lib) dlclose(impl_->lib);
  delete impl_;
  impl_ = nullptr;
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS
// gets B first, with the dims swapped.
void Blas::gemm(const Matmul& mm, void* stream) {
  Impl& b = *impl_;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (mm.beta != 0.f && mm.d != mm.c)
    check_cuda(cudaMemcpy2DAsync(mm.c, size_t(mm.stride_c) * 4, mm.d, size_t(mm.stride_c) * 4,
                                 size_t(mm.m * mm.n) * 4, size_t(mm.batch), cudaMemcpyDeviceToDevice, s),
               "copying the addend of a product");
  check_cublas(b.set_stream(b.handle, s), "cublasSetStream");
  const cublasComputeType_t compute = mm.bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  check_cublas(b.gemm(b.handle, mm.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, mm.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                      int(mm.n), int(mm.m), int(mm.k), &mm.alpha, mm.b, CUDA_R_32F, int(mm.trans_b ? mm.k : mm.n),
                      mm.stride_b, mm.a, CUDA_R_32F, int(mm.trans_a ? mm.m : mm.k), mm.stride_a, &mm.beta, mm.c,
                      CUDA_R_32F, int(mm.n), mm.stride_c, int(mm.batch), compute, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx");
  if (mm.bf16) {
    const int64_t cn = mm.m * mm.n;
    if (mm.stride_c == cn)  // the batch's results back to back: one launch
      launch_round_bf16(mm.c, mm.batch * cn, stream);
    else
      for (int64_t i = 0; i < mm.batch; ++i) launch_round_bf16(mm.c + i * mm.stride_c, cn, stream);
    check_cuda(cudaGetLastError(), "launching the bf16 rounding of a product");
  }
}

}  // namespace cuda
}  // namespace lowbit
