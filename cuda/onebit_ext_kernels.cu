// Launchers of 0/1 Adam's and 1-bit LAMB's kernels (onebit_ext_kernels.cuh).
#include "cuda/onebit_ext_kernels.cuh"

namespace lowbit {
namespace cuda {

void launch_nonfinite(const float* data, int64_t n, float* flag, void* stream) {
  if (n <= 0) return;
  // About 8 elements per thread, at most 4096 blocks (grid-stride beyond).
  const int64_t blocks = (n + 8 * kThreads - 1) / (8 * kThreads);
  nonfinite_kernel<<<dim3(unsigned(blocks < 4096 ? blocks : 4096)), dim3(kThreads), 0,
                     static_cast<cudaStream_t>(stream)>>>(data, n, flag);
}

void launch_skip_if_positive(const float* value, int32_t* flag, void* stream) {
  skip_if_positive_kernel<<<dim3(1), dim3(1), 0, static_cast<cudaStream_t>(stream)>>>(value, flag);
}

void launch_onebit_ext(const OneBitExtArgs& args, void* stream) {
  if (args.num_chunks <= 0 || args.num_params <= 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (args.op <= kLambCompressedB)
    onebit_ext_kernel<<<dim3(unsigned(args.num_chunks * kSplit)), dim3(kThreads), 0, s>>>(args);
  else if (args.op <= kLambScalingA)
    onebit_ext_reduce_kernel<<<dim3(unsigned(args.num_chunks)), dim3(kThreads), 0, s>>>(args);
  else
    onebit_ext_param_kernel<<<dim3(1), dim3(kThreads), 0, s>>>(args);
}

}  // namespace cuda
}  // namespace lowbit
