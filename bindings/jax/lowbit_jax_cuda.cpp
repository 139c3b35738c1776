// XLA FFI handler of the fused step on CUDA ("lowbit_step" on platform CUDA).
// Built only when the library has a CUDA engine (LOWBIT_JAX_CUDA): the
// buffers are device memory and the work is enqueued on XLA's stream. lr,
// count and the recorded layout stay on the device: the functional step reads
// them in stream order (a bad lr, count or layout makes the step change
// nothing, count included), so the handler never waits for the GPU.
#ifdef LOWBIT_JAX_CUDA
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <vector>

#include "bindings/jax/step_common.hpp"

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* LowbitStepCuda(XLA_FFI_CallFrame* call_frame);

namespace lowbit {
namespace jaxffi {
namespace {

void cuda_check(cudaError_t e, const char* what) {
  LOWBIT_REQUIRE(e == cudaSuccess, LOWBIT_ERROR_CUDA, what, ": ", cudaGetErrorString(e));
}

ffi::Error StepCuda(cudaStream_t stream, ffi::AnyBuffer lr, ffi::AnyBuffer count, ffi::AnyBuffer layout,
                    ffi::RemainingArgs args, ffi::Result<ffi::AnyBuffer> count_out, ffi::RemainingRets rets,
                    int32_t algorithm, std::string_view hparam_names, ffi::Span<const double> hparam_values,
                    ffi::Span<const float> weight_decay, ffi::Span<const int32_t> formats,
                    ffi::Span<const int32_t> rounding, ffi::Span<const int32_t> normalizations,
                    ffi::Span<const int32_t> parts, uint64_t seed, int32_t skip_nonfinite, int32_t /*num_threads*/,
                    std::string_view names) {
  return guarded("step", [&] {
    check_leading(lr, count, layout, *count_out);
    StepAttrs a{algorithm, hparam_names, hparam_values, weight_decay, formats, rounding, normalizations,
                parts,     seed,         skip_nonfinite, names};
    int device = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    thread_local PreparedStep prep;
    StepDecoder decoder(a, args, rets);
    decoder.prepare(nullptr, nullptr, nullptr, layout.dimensions(), LOWBIT_DEVICE_CUDA, device, prep);
    lowbit_step_context_t ctx = step_context(algorithm, seed, skip_nonfinite, LOWBIT_DEVICE_CUDA, device, 0);
    for (const PreparedStep::Copy& c : prep.copies)
      cuda_check(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, stream), "copying state");
    run_step(ctx, prep, static_cast<const float*>(lr.untyped_data()), static_cast<const int32_t*>(count.untyped_data()),
             static_cast<int32_t*>(count_out->untyped_data()), static_cast<const int32_t*>(layout.untyped_data()),
             stream);
  });
}

}  // namespace
}  // namespace jaxffi
}  // namespace lowbit

namespace ffi = ::xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(LowbitStepCuda, lowbit::jaxffi::StepCuda,
                              lowbit::jaxffi::bind_step_signature(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()));

#endif  // LOWBIT_JAX_CUDA
