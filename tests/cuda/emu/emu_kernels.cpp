// The launchers of cuda/*.cu, running the same kernel source under emu.hpp.
#include "emu.hpp"

#include "cuda/aux_kernels.cuh"
#include "cuda/onebit_kernels.cuh"
#include "cuda/step_kernel.cuh"

namespace lowbit {
namespace cuda {

template <Algo A>
void launch_step(const StepArgs& args, int64_t num_chunks, void* stream) {
  if (num_chunks <= 0) return;
  emu::launch(unsigned(num_chunks * kSplit), kThreads, [args] { step_kernel<A>(args); }, stream);
}
template void launch_step<Algo::AdamW>(const StepArgs&, int64_t, void*);
template void launch_step<Algo::Adam>(const StepArgs&, int64_t, void*);
template void launch_step<Algo::Lion>(const StepArgs&, int64_t, void*);
template void launch_step<Algo::Sgd>(const StepArgs&, int64_t, void*);

template <class Batch>
void launch_upload(const Batch& batch, void* stream) {
  if (batch.num_segments <= 0 || batch.total_words <= 0) return;
  const int blocks = (batch.total_words + kThreads - 1) / kThreads;
  emu::launch(unsigned(blocks < 32 ? blocks : 32), kThreads, [batch] { upload_kernel(batch); }, stream);
}
template void launch_upload<UploadBatch>(const UploadBatch&, void*);
template void launch_upload<UploadBatchSmall>(const UploadBatchSmall&, void*);

void launch_check(const CheckArgs& args, int64_t num_chunks, void* stream) {
  if (num_chunks <= 0) return;
  emu::launch(unsigned(num_chunks * kSplit), kThreads, [args] { check_kernel(args); }, stream);
}

void launch_prepare(const PrepareArgs& args, void* stream) {
  if (args.num_params <= 0) return;
  emu::launch(unsigned((args.num_params + kThreads - 1) / kThreads), kThreads, [args] { prepare_kernel(args); }, stream);
}

void launch_finalize(const FinalizeArgs& args, void* stream) {
  if (args.num_params <= 0) return;
  emu::launch(unsigned((args.num_params + kThreads - 1) / kThreads), kThreads, [args] { finalize_kernel(args); }, stream);
}

void launch_onebit(const OneBitArgs& args, int64_t num_chunks, void* stream) {
  if (num_chunks <= 0) return;
  emu::launch(unsigned(num_chunks * kSplit), kThreads, [args] { onebit_kernel(args); }, stream);
}

}  // namespace cuda
}  // namespace lowbit
