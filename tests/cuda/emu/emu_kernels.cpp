// The launchers of cuda/*.cu, running the same kernel source under emu.hpp.
#include "emu.hpp"

#include "cuda/aux_kernels.cuh"
#define LOWBIT_SHAPED_AUX_KERNELS 1
#include "cuda/shaped_kernels.cuh"
#include "cuda/step_kernel.cuh"

namespace lowbit {
namespace cuda {

template <Algo A>
void launch_step(const StepArgs& args, int64_t num_chunks, void* stream) {
  if (num_chunks <= 0) return;
  emu::launch(unsigned(num_chunks * kSplit), kThreads, [args] { step_kernel<A>(args); }, stream);
}
#define LOWBIT_EMU_STEP(rule, algorithm) template void launch_step<Algo::rule>(const StepArgs&, int64_t, void*);
LOWBIT_RULES(LOWBIT_EMU_STEP)
#undef LOWBIT_EMU_STEP

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

template <Algo A>
void launch_stats(const ShapedArgs& args, int64_t num_items, void* stream) {
  if (num_items <= 0) return;
  emu::launch(unsigned(num_items), kThreads, [args] { stats_kernel<A>(args, args.maps); }, stream);
}
#define LOWBIT_EMU_STATS(rule, algorithm) template void launch_stats<Algo::rule>(const ShapedArgs&, int64_t, void*);
LOWBIT_RULES(LOWBIT_EMU_STATS)
#undef LOWBIT_EMU_STATS

void launch_shaped_mid(const ShapedArgs& args, int64_t num_shaped, void* stream) {
  if (num_shaped <= 0) return;
  emu::launch(unsigned(num_shaped), kThreads, [args] { shaped_mid_kernel(args); }, stream);
}

void launch_shaped_finish(const ShapedArgs& args, int64_t num_shaped, void* stream) {
  if (num_shaped <= 0) return;
  emu::launch(unsigned(num_shaped), kThreads, [args] { shaped_finish_kernel(args); }, stream);
}

void launch_round_bf16(float* x, int64_t n, void* stream) {
  if (n <= 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  emu::launch(unsigned(blocks < 4096 ? blocks : 4096), kThreads, [=] { round_bf16_kernel(x, n); }, stream);
}

void launch_skip_if_positive(const float* value, int32_t* flag, void* stream) {
  emu::launch(1, 1, [=] { skip_if_positive_kernel(value, flag); }, stream);
}

}  // namespace cuda
}  // namespace lowbit
