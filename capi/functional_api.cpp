// The functional step's entry points (lowbit.h, "functional step"): callers'
// structs of any released size read into current ones, then
// lowbit::FunctionalStepper.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "boundary.hpp"
#include "core/codec.hpp"
#include "core/defaults.hpp"
#include "core/functional_step.hpp"
#include "core/state.hpp"
#include "core/validation.hpp"
#include "muon/muon_functional.hpp"
#include "trust/trust_optimizer.hpp"
#include "struct_abi.hpp"

struct lowbit_step_context {
  std::unique_ptr<lowbit::FunctionalStepper> impl;
  std::string last_error;
  // The current-size copies of a call's structs (kept: no allocation once
  // they have the capacity).
  std::vector<lowbit_param_buffers_t> params;
  std::vector<lowbit_state_plan_t> plans;
  std::vector<lowbit_hparams_t> hparams;
};

using lowbit::guarded;
namespace abi = lowbit::abi;

namespace {

// A plan of 0.2 (no normalisations) has blocks.
lowbit_state_plan_t default_plan() {
  lowbit_state_plan_t p{};
  p.normalization[0] = p.normalization[1] = LOWBIT_NORMALIZATION_BLOCK;
  return p;
}

lowbit_step_args_t default_step_args() {
  lowbit_step_args_t a{};
  a.struct_size = sizeof(a);
  a.step = -1;
  return a;
}

// The shape of a param as its caller planned it (ndim 0: flat).
lowbit::Shape read_shape(int32_t ndim, const int64_t* shape) {
  LOWBIT_REQUIRE(ndim >= 0 && ndim <= LOWBIT_MAX_DIMS, LOWBIT_ERROR_INVALID_ARGUMENT, "ndim = ", ndim,
                 " must be in 0..", LOWBIT_MAX_DIMS);
  lowbit::Shape s{};
  if (ndim == 0) return s;
  LOWBIT_REQUIRE_PTR(shape, "shape");
  s.ndim = ndim;
  for (int k = 0; k < ndim; ++k) {
    LOWBIT_REQUIRE(shape[k] >= 1 && shape[k] <= INT32_MAX, LOWBIT_ERROR_INVALID_ARGUMENT, "shape[", k, "] = ",
                   shape[k], " must be in [1, 2^31)");
    s.dim[k] = shape[k];
  }
  return s;
}

// abi::read_struct of element `index` of the caller's array `array`; a
// refusal names the element ("params[3].plan"). The name is only built for
// the message: a step reads every param's structs at every call.
template <class T>
T read_element(const T* in, const T& defaults, const char* array, int64_t index, const char* field) {
  try {
    return abi::read_struct(in, defaults, array);
  } catch (const lowbit::Error&) {
    const std::string name = lowbit::concat(array, "[", index, "]", field);
    return abi::read_struct(in, defaults, name.c_str());  // throws again, naming the element
  }
}

// A moment's normalisation as the plans give it (lowbit_plan_param_state):
// RANK1 only for 8- and 4-bit codes, FACTORED only for an fp32 second moment.
lowbit::Norm planned_norm(const lowbit_state_plan_t& p, int32_t moment) {
  const lowbit_normalization_t n = p.normalization[moment];
  const lowbit_state_format_t f = p.format[moment];
  LOWBIT_REQUIRE(n == LOWBIT_NORMALIZATION_BLOCK || n == LOWBIT_NORMALIZATION_RANK1 ||
                     n == LOWBIT_NORMALIZATION_FACTORED,
                 LOWBIT_ERROR_INVALID_ARGUMENT, "plan->normalization[", moment, "] = ", int(n),
                 " is not the normalisation of a planned moment (LOWBIT_NORMALIZATION_BLOCK, RANK1 or FACTORED)");
  LOWBIT_REQUIRE(n != LOWBIT_NORMALIZATION_RANK1 || lowbit::rank1_format(f),
                 LOWBIT_ERROR_INVALID_ARGUMENT, "plan->normalization[", moment, "] = RANK1 but the moment is ",
                 lowbit::format_name(f), " (rank-1 scales are for 8bit, 4bit and 4bit-dyn codes)");
  LOWBIT_REQUIRE(n != LOWBIT_NORMALIZATION_FACTORED || (moment == 1 && f == LOWBIT_STATE_FP32),
                 LOWBIT_ERROR_INVALID_ARGUMENT, "plan->normalization[", moment, "] = FACTORED but the moment is ",
                 lowbit::format_name(f), " moment ", moment, " (only an fp32 second moment is factored)");
  return lowbit::from_c_norm(n);
}

}  // namespace

extern "C" {

LOWBIT_DEFINE_STRUCT_INIT(lowbit_param_buffers_t, lowbit_param_buffers_init, 600, "p", lowbit_param_buffers_t{})
LOWBIT_DEFINE_STRUCT_INIT(lowbit_step_args_t, lowbit_step_args_init, 600, "args", default_step_args())

LOWBIT_API lowbit_status_t lowbit_step_context_create(lowbit_step_context_t* out,
                                                      const lowbit_optimizer_config_t* config) {
  if (out) *out = nullptr;
  return guarded(nullptr, [&] {
    LOWBIT_REQUIRE_PTR(out, "out");
    const lowbit_optimizer_config_t full =
        abi::read_struct(config, lowbit::default_config(LOWBIT_ALGORITHM_ADAMW), "config");
    auto ctx = std::make_unique<lowbit_step_context>();
    ctx->impl = std::make_unique<lowbit::FunctionalStepper>(full);
    if (full.algorithm == LOWBIT_ALGORITHM_MUON) lowbit::muon::install_functional_driver(*ctx->impl, full);
    lowbit::trust::install_functional_driver(*ctx->impl, full);
    *out = ctx.release();
  });
}

LOWBIT_API lowbit_status_t lowbit_step_context_destroy(lowbit_step_context_t ctx) {
  delete ctx;
  return LOWBIT_SUCCESS;
}

LOWBIT_API const char* lowbit_step_context_last_error(lowbit_step_context_t ctx) { return lowbit::last_error_of(ctx); }

LOWBIT_API lowbit_status_t lowbit_state_record(const lowbit_state_plan_t* plan, int32_t ndim, const int64_t* shape,
                                               int32_t* out, int64_t capacity) {
  return guarded(nullptr, [&] {
    const lowbit_state_plan_t p = abi::read_struct(plan, default_plan(), "plan");
    const lowbit::Shape s = read_shape(ndim, shape);
    LOWBIT_REQUIRE_PTR(out, "out");
    LOWBIT_REQUIRE(capacity >= LOWBIT_STATE_RECORD_INT32, LOWBIT_ERROR_BUFFER_TOO_SMALL, "capacity = ", capacity,
                   " but a state record has ", LOWBIT_STATE_RECORD_INT32, " int32 values");
    lowbit::make_state_record(p, s, out);
  });
}

LOWBIT_API lowbit_status_t lowbit_functional_step(lowbit_step_context_t ctx, const lowbit_param_buffers_t* params,
                                                  int64_t num_params, const lowbit_step_args_t* args, void* stream) {
  return lowbit::on_handle(ctx, "ctx (the step context)", [&](lowbit::FunctionalStepper& f) {
    LOWBIT_REQUIRE_PTR(params, "params");
    const lowbit_step_args_t a = abi::read_struct(args, default_step_args(), "args");
    LOWBIT_REQUIRE(num_params >= 1 && num_params <= INT32_MAX, LOWBIT_ERROR_INVALID_ARGUMENT, "num_params = ",
                   num_params, " must be in [1, 2^31)");
    LOWBIT_REQUIRE(a.num_groups >= 1, LOWBIT_ERROR_INVALID_ARGUMENT, "args.num_groups = ", a.num_groups,
                   " must be >= 1");
    LOWBIT_REQUIRE(a.reserved0 == 0, LOWBIT_ERROR_INVALID_ARGUMENT, "args.reserved0 = ", a.reserved0,
                   " must be 0");
    ctx->hparams.resize(a.hparams ? size_t(a.num_groups) : 0);
    for (int32_t g = 0; a.hparams && g < a.num_groups; ++g) {
      const size_t stride = abi::struct_size_of(a.hparams);  // an array holds one struct type
      const auto* h = reinterpret_cast<const lowbit_hparams_t*>(reinterpret_cast<const char*>(a.hparams) + stride * size_t(g));
      try {
        ctx->hparams[size_t(g)] = abi::read_hparams(h, f.algorithm(), "args.hparams");
      } catch (const lowbit::Error&) {  // again, naming the element (the name is built for the message only)
        const std::string name = lowbit::concat("args.hparams[", g, "]");
        ctx->hparams[size_t(g)] = abi::read_hparams(h, f.algorithm(), name.c_str());
      }
    }
    ctx->params.resize(size_t(num_params));
    ctx->plans.resize(size_t(num_params));
    // Each element of the caller's array has the size of its first (an
    // array holds one struct type).
    const size_t stride = abi::struct_size_of(params);
    const char* base = reinterpret_cast<const char*>(params);
    for (int64_t i = 0; i < num_params; ++i) {
      const auto* p = reinterpret_cast<const lowbit_param_buffers_t*>(base + stride * size_t(i));
      ctx->params[size_t(i)] = read_element(p, lowbit_param_buffers_t{}, "params", i, "");
      ctx->plans[size_t(i)] = read_element(ctx->params[size_t(i)].plan, default_plan(), "params", i, ".plan");
    }
    lowbit::FunctionalCount count;
    count.step = a.step;
    count.count = a.count;
    count.count_out = a.count_out;
    f.step(ctx->params.data(), ctx->plans.data(), num_params, a.hparams ? ctx->hparams.data() : nullptr,
           a.engine_hparams, a.num_groups, a.lr, count, a.records, stream);
  });
}

LOWBIT_API lowbit_status_t lowbit_step_context_last_step_skipped(lowbit_step_context_t ctx, int32_t* out) {
  return lowbit::on_handle(ctx, "ctx (the step context)", [&](lowbit::FunctionalStepper& f) {
    LOWBIT_REQUIRE_PTR(out, "out");
    *out = f.last_step_skipped() ? 1 : 0;
  });
}

LOWBIT_API lowbit_status_t lowbit_hparams_check(const lowbit_hparams_t* hparams, lowbit_algorithm_t algorithm) {
  return guarded(nullptr, [&] {
    lowbit::check_algorithm(algorithm);
    lowbit::check_hparams(abi::read_hparams(hparams, algorithm, "hparams"), algorithm);
  });
}

LOWBIT_API lowbit_status_t lowbit_decode_moment(const lowbit_state_plan_t* plan, int32_t moment, int32_t ndim,
                                                const int64_t* shape, const void* data, int64_t data_bytes,
                                                const float* scales, int64_t scale_count, float* out, int64_t numel) {
  return guarded(nullptr, [&] {
    const lowbit_state_plan_t p = abi::read_struct(plan, default_plan(), "plan");
    LOWBIT_REQUIRE(moment >= 0 && moment < p.num_moments && moment < 2, LOWBIT_ERROR_INVALID_ARGUMENT, "moment = ",
                   moment, " but the plan has ", p.num_moments, " moments");
    LOWBIT_REQUIRE(numel >= 0, LOWBIT_ERROR_INVALID_ARGUMENT, "numel = ", numel, " must be >= 0");
    const lowbit_state_format_t f = p.format[moment];
    lowbit::check_state_format(f, "plan->format[moment]", false);
    LOWBIT_REQUIRE(p.kind[moment] >= 0 && p.kind[moment] <= LOWBIT_MOMENT_UNSIGNED, LOWBIT_ERROR_INVALID_ARGUMENT,
                   "plan->kind[", moment, "] = ", int(p.kind[moment]), " is not a lowbit_moment_kind_t value");
    const lowbit::Norm norm = planned_norm(p, moment);
    const lowbit::Shape s = norm == lowbit::Norm::Block ? lowbit::Shape{} : read_shape(ndim, shape);
    LOWBIT_REQUIRE(norm == lowbit::Norm::Block || s.ndim >= 2, LOWBIT_ERROR_INVALID_ARGUMENT, "a ",
                   lowbit::norm_name(norm), " moment needs the param's shape (ndim >= 2), got ndim = ", ndim);
    const int64_t product = lowbit::checked_dims_product(s.ndim, s.dim);
    LOWBIT_REQUIRE(product >= 0, LOWBIT_ERROR_INVALID_ARGUMENT,
                   "the shape has more elements than int64 holds (numel = ", numel, ")");
    LOWBIT_REQUIRE(s.ndim == 0 || product == numel, LOWBIT_ERROR_INVALID_ARGUMENT, "the shape has ", product,
                   " elements but numel = ", numel);
    const int64_t need_data = lowbit::moment_data_bytes(f, norm, s, numel);
    const int64_t need_scales = lowbit::moment_scale_bytes(f, norm, s, numel) / 4;
    LOWBIT_REQUIRE(need_data == p.data_bytes[moment] && need_scales == p.scale_count[moment],
                   LOWBIT_ERROR_INVALID_ARGUMENT, "the plan gives ", p.data_bytes[moment], " bytes and ",
                   p.scale_count[moment], " scales but ", numel, " elements of its format need ", need_data, " and ",
                   need_scales);
    LOWBIT_REQUIRE(data_bytes >= need_data && scale_count >= need_scales, LOWBIT_ERROR_BUFFER_TOO_SMALL,
                   "the buffers hold ", data_bytes, " bytes and ", scale_count, " scales but the moment needs ",
                   need_data, " and ", need_scales);
    LOWBIT_REQUIRE(need_data == 0 || data, LOWBIT_ERROR_NULL_POINTER, "data is NULL");
    LOWBIT_REQUIRE(need_scales == 0 || scales, LOWBIT_ERROR_NULL_POINTER, "scales is NULL");
    LOWBIT_REQUIRE(numel == 0 || out, LOWBIT_ERROR_NULL_POINTER, "out is NULL");
    lowbit::MomentView mv = lowbit::moment_view(f, lowbit::kind_or_index(p.kind[moment], moment),
                                                const_cast<void*>(data), const_cast<float*>(scales));
    mv.norm = norm;
    lowbit::decode_moment(mv, s, numel, out);
  });
}

LOWBIT_API const char* lowbit_state_format_name(lowbit_state_format_t format) {
  return format == LOWBIT_STATE_DEFAULT ? "unknown" : lowbit::format_name(format);
}

}  // extern "C"
