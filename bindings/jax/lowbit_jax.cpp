// XLA FFI handlers of lowbit for JAX (CPU). Loaded by bindings/lowbit/jax/_module.py,
// which registers them with jax.ffi.register_ffi_target:
//   LowbitStepCpu    "lowbit_step"            the fused optimizer step
//   LowbitDecodeCpu  "lowbit_decode_moment"   a moment, dequantized to fp32
// Both run lowbit_core, the code behind the C API: the same CPU engine, codecs
// and per-element update rules, so a JAX step and lowbit_optimizer_step give
// the same bits for the same inputs.
#include <algorithm>
#include <memory>

#include "bindings/jax/step_common.hpp"
#include "core/codec.hpp"

#define LOWBIT_JAX_EXPORT extern "C" __attribute__((visibility("default")))

LOWBIT_JAX_EXPORT XLA_FFI_Error* LowbitStepCpu(XLA_FFI_CallFrame* call_frame);
LOWBIT_JAX_EXPORT XLA_FFI_Error* LowbitDecodeCpu(XLA_FFI_CallFrame* call_frame);
LOWBIT_JAX_EXPORT int32_t lowbit_jax_protocol_version(void);
LOWBIT_JAX_EXPORT int32_t lowbit_jax_has_cuda(void);
// The int32 columns of a row of the JAX state's layout (core/layout_record.hpp).
LOWBIT_JAX_EXPORT int32_t lowbit_jax_layout_columns(void);
// Validates hyper-parameters with the library's own checks (so that Python
// can reject them when the optimizer is built, with the C API's message).
// Returns 0 or a lowbit_status_t, the message in `message` (NUL-terminated).
LOWBIT_JAX_EXPORT int32_t lowbit_jax_check_hparams(int32_t algorithm, float lr, float beta1, float beta2, float eps,
                                                   float weight_decay, float momentum, float dampening,
                                                   int32_t nesterov, int32_t bias_correction, char* message,
                                                   int64_t capacity);

namespace lowbit {
namespace jaxffi {
namespace {

Engine& cpu_engine(int32_t num_threads) {
  // The CPU engine holds no state besides its thread count; one per XLA
  // thread keeps concurrent executions independent.
  thread_local std::unique_ptr<Engine> engine;
  thread_local int32_t engine_threads = -1;
  if (!engine || engine_threads != num_threads) {
    engine = make_cpu_engine(num_threads);
    engine_threads = num_threads;
  }
  return *engine;
}

ffi::Error StepCpu(ffi::AnyBuffer lr, ffi::AnyBuffer count, ffi::AnyBuffer layout, ffi::RemainingArgs args,
                   ffi::Result<ffi::AnyBuffer> count_out, ffi::RemainingRets rets, int32_t algorithm, float beta1,
                   float beta2, float eps, float momentum, float dampening, int32_t nesterov,
                   int32_t bias_correction, ffi::Span<const float> weight_decay, ffi::Span<const int32_t> formats,
                   ffi::Span<const int32_t> rounding,
                   ffi::Span<const int32_t> normalizations, ffi::Span<const int32_t> parts, uint64_t seed, int32_t skip_nonfinite, int32_t num_threads,
                   std::string_view names) {
  return guarded("step", [&] {
    check_leading(lr, count, layout, *count_out);
    LOWBIT_REQUIRE(num_threads >= 0, LOWBIT_ERROR_INVALID_ARGUMENT, "num_threads = ", num_threads, " must be >= 0");
    StepAttrs a{algorithm,    beta1,     beta2,    eps,  momentum,       dampening, nesterov, bias_correction,
                weight_decay, formats,   rounding, normalizations, parts, seed, skip_nonfinite, names};
    thread_local PreparedStep prep;  // keeps its capacity from step to step
    StepDecoder decoder(a, args, rets);
    const float* host_lr = static_cast<const float*>(lr.untyped_data());
    const int32_t* host_count = static_cast<const int32_t*>(count.untyped_data());
    decoder.prepare(host_lr, host_count, static_cast<const int32_t*>(layout.untyped_data()), layout.dimensions(),
                    prep);
    // Nothing is written before this point.
    for (const PreparedStep::Copy& c : prep.copies) std::memcpy(c.dst, c.src, c.bytes);
    run_step(cpu_engine(num_threads), prep, a, host_lr, host_count, static_cast<int32_t*>(count_out->untyped_data()),
             nullptr, nullptr);
  });
}

ffi::Error DecodeCpu(ffi::AnyBuffer data, ffi::AnyBuffer scales, ffi::Result<ffi::AnyBuffer> out, int32_t format,
                     int32_t moment, int32_t normalization) {
  return guarded("decode_moment", [&] {
    LOWBIT_REQUIRE(format >= LOWBIT_STATE_FP32 && format <= kLastStateFormat, LOWBIT_ERROR_INVALID_ARGUMENT,
                   "format = ", format, " is not a lowbit_state_format_t value");
    LOWBIT_REQUIRE(moment == 0 || moment == 1, LOWBIT_ERROR_INVALID_ARGUMENT, "moment = ", moment,
                   " must be 0 or 1");
    LOWBIT_REQUIRE(normalization >= LOWBIT_NORMALIZATION_BLOCK && normalization <= LOWBIT_NORMALIZATION_FACTORED,
                   LOWBIT_ERROR_INVALID_ARGUMENT, "normalization = ", normalization,
                   " is not block (1), rank1 (2) or factored (3)");
    LOWBIT_REQUIRE(out->element_type() == ffi::DataType::F32, LOWBIT_ERROR_INVALID_ARGUMENT,
                   "the output must be float32");
    const lowbit_state_format_t f = lowbit_state_format_t(format);
    const Norm norm = from_c_norm(lowbit_normalization_t(normalization));
    const int64_t numel = int64_t(out->element_count());
    // A rank-1 or factored moment is decoded with the shape of the output
    // (the param's).
    Shape shape{};
    if (norm != Norm::Block) {
      const auto dims = out->dimensions();
      LOWBIT_REQUIRE(dims.size() >= 2 && dims.size() <= size_t(kMaxDims) && numel > 0,
                     LOWBIT_ERROR_INVALID_ARGUMENT, "a ", norm_name(norm), " moment needs an output of 2 to ",
                     kMaxDims, " non-zero dims, got ", shape_string(dims));
      shape.ndim = int32_t(dims.size());
      for (size_t k = 0; k < dims.size(); ++k) shape.dim[k] = dims[k];
      LOWBIT_REQUIRE(norm != Norm::Rank1 || f == LOWBIT_STATE_8BIT || f == LOWBIT_STATE_4BIT,
                     LOWBIT_ERROR_INVALID_ARGUMENT, "a rank1 moment needs the 8bit or 4bit format");
      LOWBIT_REQUIRE(norm != Norm::Factored || (f == LOWBIT_STATE_FP32 && moment == 1),
                     LOWBIT_ERROR_INVALID_ARGUMENT, "a factored moment is the second one, in fp32 accumulators");
    }
    const ffi::DataType ddt = moment_data_dtype(f);
    const int64_t data_bytes = moment_data_bytes(f, norm, shape, numel);
    const int64_t scale_bytes = moment_scale_bytes(f, norm, shape, numel);
    LOWBIT_REQUIRE(data.element_type() == ddt && int64_t(data.size_bytes()) == data_bytes,
                   LOWBIT_ERROR_INVALID_ARGUMENT, "moment data is ", ffi_dtype_name(data.element_type()),
                   shape_string(data.dimensions()), " but the ", format_name(f), " ", norm_name(norm), " format of ",
                   numel, " elements needs ", data_bytes, " bytes of ", ffi_dtype_name(ddt));
    LOWBIT_REQUIRE(scales.element_type() == ffi::DataType::F32 && int64_t(scales.size_bytes()) == scale_bytes,
                   LOWBIT_ERROR_INVALID_ARGUMENT, "moment scales are ", ffi_dtype_name(scales.element_type()),
                   shape_string(scales.dimensions()), " but the ", format_name(f), " ", norm_name(norm),
                   " format of ", numel, " elements needs ", scale_bytes / 4, " float32 scales");
    MomentView mv = moment_view(f, moment, data.untyped_data(), static_cast<float*>(scales.untyped_data()));
    mv.norm = norm;
    decode_moment(mv, shape, numel, static_cast<float*>(out->untyped_data()));
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
                                  .Attr<int32_t>("normalization"));

int32_t lowbit_jax_protocol_version(void) { return lowbit::jaxffi::kProtocolVersion; }

int32_t lowbit_jax_layout_columns(void) { return lowbit::kLayoutColumns; }

int32_t lowbit_jax_check_hparams(int32_t algorithm, float lr, float beta1, float beta2, float eps,
                                 float weight_decay, float momentum, float dampening, int32_t nesterov,
                                 int32_t bias_correction, char* message, int64_t capacity) {
  std::string error;
  int32_t status = 0;
  try {
    LOWBIT_REQUIRE(algorithm >= LOWBIT_ALGORITHM_ADAMW && algorithm <= LOWBIT_ALGORITHM_SGD,
                   LOWBIT_ERROR_INVALID_ARGUMENT, "algorithm = ", algorithm,
                   " is not one of adamw (1), adam (2), lion (3), sgd (4)");
    lowbit_hparams_t h{};
    h.struct_size = sizeof(h);
    h.lr = lr;
    h.beta1 = beta1;
    h.beta2 = beta2;
    h.eps = eps;
    h.weight_decay = weight_decay;
    h.momentum = momentum;
    h.dampening = dampening;
    h.nesterov = nesterov;
    h.bias_correction = bias_correction;
    lowbit::check_hparams(h, lowbit_algorithm_t(algorithm));
  } catch (const lowbit::Error& e) {
    status = int32_t(e.status());
    error = e.what();
  } catch (const std::exception& e) {
    status = int32_t(LOWBIT_ERROR_INTERNAL);
    error = e.what();
  }
  if (message && capacity > 0) {
    size_t n = std::min(error.size(), size_t(capacity - 1));
    std::memcpy(message, error.data(), n);
    message[n] = '\0';
  }
  return status;
}

int32_t lowbit_jax_has_cuda(void) {
#ifdef LOWBIT_HAVE_CUDA
  return 1;
#else
  return 0;
#endif
}
