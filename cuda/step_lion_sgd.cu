// Step kernels of Lion and SGD. Split from the Adam ones so the two
// translation units compile in parallel.
#include "cuda/step_kernel.cuh"

namespace lowbit {
namespace cuda {

template <Algo A>
void launch_step(const StepArgs& args, int64_t num_chunks, void* stream) {
  if (num_chunks <= 0) return;
  step_kernel<A><<<dim3(unsigned(num_chunks * kSplit)), dim3(kThreads), 0, static_cast<cudaStream_t>(stream)>>>(args);
}

template void launch_step<Algo::Lion>(const StepArgs&, int64_t, void*);
template void launch_step<Algo::Sgd>(const StepArgs&, int64_t, void*);

}  // namespace cuda
}  // namespace lowbit
