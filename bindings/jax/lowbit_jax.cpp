// XLA FFI handlers of lowbit for JAX (CPU). Loaded by bindings/lowbit/jax/_module.py,
// which registers them with jax.ffi.register_ffi_target:
//   LowbitStepCpu    "lowbit_step"            the fused optimizer step
//   LowbitDecodeCpu  "lowbit_decode_moment"   a moment, dequantized to fp32
// Both call liblowbit through its public header only (the functional step,
// lowbit_decode_moment): the same CPU engine, codecs and per-element update
// rules as lowbit_optimizer_step, so a JAX step and a handle step give the
// same bits for the same inputs.
#include <cstring>
#include <memory>

#include "bindings/jax/step_common.hpp"

#define LOWBIT_JAX_EXPORT extern "C" __attribute__((visibility("default")))

LOWBIT_JAX_EXPORT XLA_FFI_Error* LowbitStepCpu(XLA_FFI_CallFrame* call_frame);
LOWBIT_JAX_EXPORT XLA_FFI_Error* LowbitDecodeCpu(XLA_FFI_CallFrame* call_frame);
LOWBIT_JAX_EXPORT int32_t lowbit_jax_protocol_version(void);
LOWBIT_JAX_EXPORT int32_t lowbit_jax_has_cuda(void);
// The int32 columns of a row of the JAX state's layout (LOWBIT_STATE_RECORD_INT32).
LOWBIT_JAX_EXPORT int32_t lowbit_jax_layout_columns(void);

namespace lowbit {
namespace jaxffi {
namespace {

ffi::Error StepCpu(ffi::AnyBuffer lr, ffi::AnyBuffer count, ffi::AnyBuffer layout, ffi::RemainingArgs args,
                   ffi::Result<ffi::AnyBuffer> count_out, ffi::RemainingRets rets, int32_t algorithm,
                   std::string_view hparam_names, ffi::Span<const double> hparam_values,
                   ffi::Span<const float> weight_decay, ffi::Span<const int32_t> formats,
                   ffi::Span<const int32_t> rounding, ffi::Span<const int32_t> normalizations,
                   ffi::Span<const int32_t> parts, uint64_t seed, int32_t skip_nonfinite, int32_t num_threads,
                   std::string_view names) {
  return guarded("step", [&] {
    check_leading(lr, count, layout, *count_out);
    LOWBIT_REQUIRE(num_threads >= 0, LOWBIT_ERROR_INVALID_ARGUMENT, "num_threads = ", num_threads, " must be >= 0");
    StepAttrs a{algorithm, hparam_names, hparam_values, weight_decay, formats, rounding, normalizations,
                parts,     seed,         skip_nonfinite, names};
    thread_local PreparedStep prep;  // keeps its capacity and plans from step to step
    StepDecoder decoder(a, args, rets);
    const float* host_lr = static_cast<const float*>(lr.untyped_data());
    const int32_t* host_count = static_cast<const int32_t*>(count.untyped_data());
    const int32_t* host_layout = static_cast<const int32_t*>(layout.untyped_data());
    decoder.prepare(host_lr, host_count, host_layout, layout.dimensions(), LOWBIT_DEVICE_CPU, 0, prep);
    lowbit_step_context_t ctx = step_context(algorithm, seed, skip_nonfinite, LOWBIT_DEVICE_CPU, 0, num_threads);
    // Nothing is written before this point.
    for (const PreparedStep::Copy& c : prep.copies) std::memcpy(c.dst, c.src, c.bytes);
    run_step(ctx, prep, host_lr, host_count, static_cast<int32_t*>(count_out->untyped_data()), host_layout, nullptr);
  });
}

ffi::Error DecodeCpu(ffi::AnyBuffer data, ffi::AnyBuffer scales, ffi::Result<ffi::AnyBuffer> out, int32_t format,
                     int32_t moment, int32_t normalization, int32_t algorithm) {
  return guarded("decode_moment", [&] {
    // The moment's kind (its maps) is the one the algorithm's descriptor
    // gives its slot.
    const Described& described = describe(algorithm);
    LOWBIT_REQUIRE(format >= LOWBIT_STATE_FP32 && format <= kLastStateFormat, LOWBIT_ERROR_INVALID_ARGUMENT,
                   "format = ", format, " is not a lowbit_state_format_t value");
    LOWBIT_REQUIRE((moment == 0 || moment == 1) && moment < described.info.max_moments, LOWBIT_ERROR_INVALID_ARGUMENT,
                   "moment = ", moment, " must be 0 or 1 and a moment slot of ", described.info.name, " (it has ",
                   described.info.max_moments, ")");
    LOWBIT_REQUIRE(normalization >= LOWBIT_NORMALIZATION_BLOCK && normalization <= LOWBIT_NORMALIZATION_FACTORED,
                   LOWBIT_ERROR_INVALID_ARGUMENT, "normalization = ", normalization,
                   " is not block (1), rank1 (2) or factored (3)");
    LOWBIT_REQUIRE(out->element_type() == ffi::DataType::F32, LOWBIT_ERROR_INVALID_ARGUMENT,
                   "the output must be float32");
    const int64_t numel = int64_t(out->element_count());
    // The sizes of an AdamW param whose moment `moment` has this format and
    // normalisation (a rank-1 or factored moment is decoded with the shape of
    // the output, the param's), with the kind of `algorithm`'s slot.
    PlanKey k{};
    k.algorithm = LOWBIT_ALGORITHM_ADAMW;
    k.f[0] = k.f[1] = format;
    k.nz[moment] = normalization;
    k.dtype = LOWBIT_DTYPE_FLOAT32;
    k.numel = numel;
    if (normalization != LOWBIT_NORMALIZATION_BLOCK) {
      const auto dims = out->dimensions();
      LOWBIT_REQUIRE(dims.size() >= 2 && dims.size() <= size_t(kMaxDims) && numel > 0,
                     LOWBIT_ERROR_INVALID_ARGUMENT, "a ", norm_value_name(normalization),
                     " moment needs an output of 2 to ", kMaxDims, " non-zero dims, got ", shape_string(dims));
      k.ndim = int32_t(dims.size());
      for (size_t d = 0; d < dims.size(); ++d) k.dims[d] = dims[d];
      LOWBIT_REQUIRE(normalization != LOWBIT_NORMALIZATION_RANK1 || format == LOWBIT_STATE_8BIT ||
                         format == LOWBIT_STATE_4BIT,
                     LOWBIT_ERROR_INVALID_ARGUMENT, "a rank1 moment needs the 8bit or 4bit format");
      LOWBIT_REQUIRE(normalization != LOWBIT_NORMALIZATION_FACTORED || (format == LOWBIT_STATE_FP32 && moment == 1),
                     LOWBIT_ERROR_INVALID_ARGUMENT, "a factored moment is the second one, in fp32 accumulators");
    }
    lowbit_hparams_t adamw;
    lowbit_hparams_init(&adamw, LOWBIT_ALGORITHM_ADAMW);
    lowbit_state_plan_t plan = plan_leaf(k, adamw);
    plan.kind[moment] = described.info.moment_kinds[moment];
    const ffi::DataType ddt = moment_data_dtype(lowbit_state_format_t(format));
    const int64_t data_bytes = plan.data_bytes[moment];
    const int64_t scale_count = plan.scale_count[moment];
    const char* norm = norm_value_name(normalization);
    LOWBIT_REQUIRE(data.element_type() == ddt && int64_t(data.size_bytes()) == data_bytes,
                   LOWBIT_ERROR_INVALID_ARGUMENT, "moment data is ", ffi_dtype_name(data.element_type()),
                   shape_string(data.dimensions()), " but the ", format_name(format), " ", norm, " format of ", numel,
                   " elements needs ", data_bytes, " bytes of ", ffi_dtype_name(ddt));
    LOWBIT_REQUIRE(scales.element_type() == ffi::DataType::F32 && int64_t(scales.element_count()) == scale_count,
                   LOWBIT_ERROR_INVALID_ARGUMENT, "moment scales are ", ffi_dtype_name(scales.element_type()),
                   shape_string(scales.dimensions()), " but the ", format_name(format), " ", norm, " format of ",
                   numel, " elements needs ", scale_count, " float32 scales");
    check_status(lowbit_decode_moment(&plan, moment, k.ndim, k.dims, data.untyped_data(), data_bytes,
                                      static_cast<const float*>(scales.untyped_data()), scale_count,
                                      static_cast<float*>(out->untyped_data()), numel),
                 lowbit_last_error());
  });
}

}  // namespace
}  // namespace jaxffi
}  // namespace lowbit

namespace ffi = ::xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(LowbitStepCpu, lowbit::jaxffi::StepCpu,
                              lowbit::jaxffi::bind_step_signature(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LowbitDecodeCpu, lowbit::jaxffi::DecodeCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // data
                                  .Arg<ffi::AnyBuffer>()  // scales
                                  .Ret<ffi::AnyBuffer>()  // fp32 moment
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("moment")
                                  .Attr<int32_t>("normalization")
                                  .Attr<int32_t>("algorithm"));

int32_t lowbit_jax_protocol_version(void) { return lowbit::jaxffi::kProtocolVersion; }

int32_t lowbit_jax_layout_columns(void) { return LOWBIT_STATE_RECORD_INT32; }

int32_t lowbit_jax_has_cuda(void) {
#ifdef LOWBIT_JAX_CUDA
  return lowbit_has_cuda();
#else
  return 0;
#endif
}
