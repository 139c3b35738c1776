// Launchers of the small kernels of aux_kernels.cuh.
#include "cuda/aux_kernels.cuh"
#define LOWBIT_SHAPED_AUX_KERNELS 1
#include "cuda/shaped_kernels.cuh"

namespace lowbit {
namespace cuda {

template <class Batch>
void launch_upload(const Batch& batch, void* stream) {
  if (batch.num_segments <= 0 || batch.total_words <= 0) return;
  const int blocks = (batch.total_words + kThreads - 1) / kThreads;
  upload_kernel<Batch><<<dim3(unsigned(blocks < 32 ? blocks : 32)), dim3(kThreads), 0,
                         static_cast<cudaStream_t>(stream)>>>(batch);
}
template void launch_upload<UploadBatch>(const UploadBatch&, void*);
template void launch_upload<UploadBatchSmall>(const UploadBatchSmall&, void*);

void launch_check(const CheckArgs& args, int64_t num_chunks, void* stream) {
  if (num_chunks <= 0) return;
  check_kernel<<<dim3(unsigned(num_chunks * kSplit)), dim3(kThreads), 0, static_cast<cudaStream_t>(stream)>>>(args);
}

void launch_prepare(const PrepareArgs& args, void* stream) {
  if (args.num_params <= 0) return;
  prepare_kernel<<<dim3(unsigned((args.num_params + kThreads - 1) / kThreads)), dim3(kThreads), 0,
                   static_cast<cudaStream_t>(stream)>>>(args);
}

void launch_finalize(const FinalizeArgs& args, void* stream) {
  const int64_t n = args.num_params;
  if (n <= 0) return;
  finalize_kernel<<<dim3(unsigned((n + kThreads - 1) / kThreads)), dim3(kThreads), 0,
                    static_cast<cudaStream_t>(stream)>>>(args);
}

void launch_round_bf16(float* x, int64_t n, void* stream) {
  if (n <= 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  round_bf16_kernel<<<dim3(unsigned(blocks < 4096 ? blocks : 4096)), dim3(kThreads), 0,
                      static_cast<cudaStream_t>(stream)>>>(x, n);
}

void launch_skip_if_positive(const float* value, int32_t* flag, void* stream) {
  skip_if_positive_kernel<<<dim3(1), dim3(1), 0, static_cast<cudaStream_t>(stream)>>>(value, flag);
}

void launch_shaped_mid(const ShapedArgs& args, int64_t num_shaped, void* stream) {
  if (num_shaped <= 0) return;
  shaped_mid_kernel<<<dim3(unsigned(num_shaped)), dim3(kThreads), 0, static_cast<cudaStream_t>(stream)>>>(args);
}

void launch_shaped_finish(const ShapedArgs& args, int64_t num_shaped, void* stream) {
  if (num_shaped <= 0) return;
  shaped_finish_kernel<<<dim3(unsigned(num_shaped)), dim3(kThreads), 0, static_cast<cudaStream_t>(stream)>>>(args);
}

}  // namespace cuda
}  // namespace lowbit
