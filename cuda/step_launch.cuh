// The launcher of the fused step kernel, instantiated per algorithm by
// step_adam.cu and step_lion_sgd.cu (two translation units that compile in
// parallel).
#pragma once
#include "cuda/step_kernel.cuh"

namespace lowbit {
namespace cuda {

template <Algo A>
void launch_step(const StepArgs& args, int64_t num_chunks, void* stream) {
  if (num_chunks <= 0) return;
  step_kernel<A><<<dim3(unsigned(num_chunks * kSplit)), dim3(kThreads), 0, static_cast<cudaStream_t>(stream)>>>(args);
}

template <Algo A>
void launch_stats(const ShapedArgs& args, int64_t num_items, void* stream) {
  if (num_items <= 0) return;
  stats_kernel<A><<<dim3(unsigned(num_items)), dim3(kThreads), 0, static_cast<cudaStream_t>(stream)>>>(
      args, args.maps);
}

}  // namespace cuda
}  // namespace lowbit
