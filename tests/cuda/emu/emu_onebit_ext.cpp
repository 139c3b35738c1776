// The launchers of cuda/onebit_ext_kernels.cu, running the same kernel source
// and launch geometry (cuda/onebit_ext_kernels.cuh) under emu.hpp.
#include "emu.hpp"

#include "cuda/onebit_ext_kernels.cuh"

namespace lowbit {
namespace cuda {

void launch_nonfinite(const float* data, int64_t n, float* flag, void* stream) {
  if (n <= 0) return;
  const int64_t blocks = (n + 8 * kThreads - 1) / (8 * kThreads);
  emu::launch(unsigned(blocks < 4096 ? blocks : 4096), kThreads, [=] { nonfinite_kernel(data, n, flag); }, stream);
}

void launch_skip_if_positive(const float* value, int32_t* flag, void* stream) {
  emu::launch(1, 1, [=] { skip_if_positive_kernel(value, flag); }, stream);
}

void launch_onebit_ext(const OneBitExtArgs& args, void* stream) {
  if (args.num_chunks <= 0 || args.num_params <= 0) return;
  if (args.op <= kLambCompressedB)
    emu::launch(unsigned(args.num_chunks * kSplit), kThreads, [args] { onebit_ext_kernel(args); }, stream);
  else if (args.op <= kLambScalingA)
    emu::launch(unsigned(args.num_chunks), kThreads, [args] { onebit_ext_reduce_kernel(args); }, stream);
  else
    emu::launch(1, kThreads, [args] { onebit_ext_param_kernel(args); }, stream);
}

}  // namespace cuda
}  // namespace lowbit
