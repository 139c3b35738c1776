#include "functional_step.hpp"

#include <string>

#include "defaults.hpp"
#include "error.hpp"
#include "state.hpp"
#include "state_plan.hpp"
#include "step_scalars.hpp"
#include "update_rules.hpp"
#include "validation.hpp"

namespace lowbit {
namespace {

bool is_shaped(const lowbit_state_plan_t& plan) {
  for (int m = 0; m < plan.num_moments && m < 2; ++m)
    if (plan.normalization[m] == LOWBIT_NORMALIZATION_RANK1 || plan.normalization[m] == LOWBIT_NORMALIZATION_FACTORED)
      return true;
  return false;
}

std::string shape_text(const Shape& s) {
  if (s.ndim == 0) return "flat";
  std::string out = "(";
  for (int k = 0; k < s.ndim; ++k) out += concat(k ? ", " : "", s.dim[k]);
  return out + (s.ndim == 1 ? ",)" : ")");
}

std::string record_text(const int32_t* r) {
  auto name = [](int32_t f) {
    return f == 0 ? "none" : (f >= LOWBIT_STATE_FP32 && f <= kLastStateFormat ? format_name(lowbit_state_format_t(f)) : "?");
  };
  auto norm = [](int32_t n) {
    return n == 0 ? "none" : n == 1 ? "block" : n == 2 ? "rank1" : n == 3 ? "factored" : "?";
  };
  Shape s{};
  s.ndim = r[5] >= 0 && r[5] <= kMaxDims ? r[5] : 0;
  for (int k = 0; k < s.ndim; ++k) s.dim[k] = r[6 + k];
  return concat("(moment 0: ", name(r[0]), " ", norm(r[3]), ", moment 1: ", name(r[1]), " ", norm(r[4]),
                ", rounding: ", r[2], ", shape: ", shape_text(s), ")");
}

int64_t data_alignment(lowbit_state_format_t f) {
  return f == LOWBIT_STATE_FP32 ? 4 : f == LOWBIT_STATE_BF16 ? 2 : 1;
}

bool aligned(const void* p, int64_t a) { return reinterpret_cast<uintptr_t>(p) % uintptr_t(a) == 0; }

// A buffer of the state: at least `need` bytes (or elements), aligned; NULL only when nothing is needed.
void check_buffer(int64_t i, const char* part, const void* data, int64_t have, int64_t need, int64_t align,
                  const char* unit) {
  if (need == 0) return;
  LOWBIT_REQUIRE(data != nullptr, LOWBIT_ERROR_NULL_POINTER, "params[", i, "].", part, " is NULL but the plan needs ",
                 need, " ", unit);
  LOWBIT_REQUIRE(have >= need, LOWBIT_ERROR_BUFFER_TOO_SMALL, "params[", i, "].", part, " holds ", have, " ", unit,
                 " but the plan needs ", need);
  LOWBIT_REQUIRE(aligned(data, align), LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "].", part,
                 " is not aligned to ", align, " bytes");
}

void check_step_tensor(int64_t i, const char* what, const lowbit_tensor_t& t, int64_t numel,
                       const lowbit_optimizer_config_t& c) {
  LOWBIT_REQUIRE(t.dtype >= LOWBIT_DTYPE_FLOAT32 && t.dtype <= LOWBIT_DTYPE_FLOAT16, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "params[", i, "].", what, ".dtype = ", int(t.dtype), " is not a lowbit_dtype_t value");
  LOWBIT_REQUIRE(t.numel == numel, LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "].", what, ".numel = ", t.numel,
                 " but the param has ", numel, " elements");
  if (numel == 0) return;
  LOWBIT_REQUIRE(t.device == c.device && (c.device == LOWBIT_DEVICE_CPU || t.device_index == c.device_index),
                 LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "].", what, " is on device ", int(t.device), ":",
                 t.device_index, " but the step context is on device ", int(c.device), ":", c.device_index);
  LOWBIT_REQUIRE(t.data != nullptr, LOWBIT_ERROR_NULL_POINTER, "params[", i, "].", what, ".data is NULL");
  check_tensor_bytes(numel, t.dtype, what);
  LOWBIT_REQUIRE(aligned(t.data, dtype_bytes(t.dtype)), LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "].", what,
                 ".data is not aligned to its element size ", dtype_bytes(t.dtype));
}

}  // namespace

Shape bound_shape(const lowbit_state_plan_t& plan, const Shape& shape) { return is_shaped(plan) ? shape : Shape{}; }

void make_state_record(const lowbit_state_plan_t& plan, const Shape& shape, int32_t* out) {
  const Shape s = bound_shape(plan, shape);
  for (int k = 0; k < kStateRecordColumns; ++k) out[k] = 0;
  for (int m = 0; m < plan.num_moments && m < 2; ++m) {
    out[m] = int32_t(plan.format[m]);
    out[3 + m] = int32_t(plan.normalization[m]);
  }
  out[2] = int32_t(plan.rounding);
  out[5] = s.ndim;
  for (int k = 0; k < s.ndim; ++k) out[6 + k] = int32_t(s.dim[k]);
}

FunctionalStepper::FunctionalStepper(const lowbit_optimizer_config_t& config) : config_(config) {
  check_config(config);
  LOWBIT_REQUIRE(!is_onebit_algorithm(config.algorithm), LOWBIT_ERROR_UNSUPPORTED, "algorithm = ",
                 int(config.algorithm), ": the functional step runs AdamW, Adam, Lion and SGD (the ",
                 onebit_algorithm_name(config.algorithm), " optimizer needs a handle and a communicator)");
  engine_ = config.device == LOWBIT_DEVICE_CUDA ? make_cuda_engine(config.device_index)
                                                : make_cpu_engine(config.num_threads);
}

void FunctionalStepper::check_param(int64_t i, const lowbit_param_buffers_t& p, const lowbit_state_plan_t& plan,
                                    const lowbit_hparams_t* hparams, int32_t num_groups, ParamView& v,
                                    GradView& g) const {
  LOWBIT_REQUIRE(p.group >= 0 && p.group < num_groups, LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "].group = ",
                 p.group, " but the call has ", num_groups, " groups of hparams");
  const int64_t numel = p.param.numel;
  LOWBIT_REQUIRE(numel >= 0, LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "].param.numel = ", numel,
                 " must be >= 0");
  check_step_tensor(i, "param", p.param, numel, config_);
  const bool stepped = p.grad.data != nullptr;
  if (stepped) check_step_tensor(i, "grad", p.grad, numel, config_);

  // The shape, as planned.
  LOWBIT_REQUIRE(p.ndim >= 0 && p.ndim <= LOWBIT_MAX_DIMS, LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "].ndim = ",
                 p.ndim, " must be in 0..", LOWBIT_MAX_DIMS);
  Shape shape{};
  shape.ndim = p.ndim;
  for (int k = 0; k < p.ndim; ++k) {
    LOWBIT_REQUIRE(p.shape[k] >= 1 && p.shape[k] <= INT32_MAX, LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i,
                   "].shape[", k, "] = ", p.shape[k], " must be in [1, 2^31)");
    shape.dim[k] = p.shape[k];
  }
  const int64_t product = checked_dims_product(p.ndim, shape.dim);
  LOWBIT_REQUIRE(product >= 0, LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "]: shape ", shape_text(shape),
                 " has more elements than int64 holds (param.numel = ", numel, ")");
  LOWBIT_REQUIRE(p.ndim == 0 || product == numel, LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "]: shape ",
                 shape_text(shape), " does not have param.numel = ", numel, " elements");

  // The plan: what this algorithm keeps, in formats and normalisations the
  // engine has, with the sizes the layout rules give.
  const lowbit_algorithm_t algorithm = hparams ? group_algorithm(hparams[p.group], config_.algorithm) : config_.algorithm;
  const AlgorithmDesc desc = describe(algorithm);
  LOWBIT_REQUIRE(!desc.matrices || p.ndim >= 2, LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i,
                 "].ndim = ", p.ndim, ": Muon orthogonalises matrices, so a param of its group needs a shape of at "
                 "least 2 dims (1-D params go to a group whose hparams.algorithm is LOWBIT_ALGORITHM_ADAMW)");
  // SGD keeps a moment only with momentum (RMSprop its second with momentum
  // or centred): where the host cannot read the group's hyper-parameters the
  // device checks the count (hparams_valid).
  const bool count_unknown = !hparams && desc.num_slots > 0 && desc.slot[desc.num_slots - 1].when != SlotWhen::Always;
  // (without hyper-parameters and not unknown, every slot is kept Always)
  const int moments = count_unknown ? plan.num_moments
                      : hparams     ? moments_in_use(desc, hparams[p.group])
                                    : desc.num_slots;
  LOWBIT_REQUIRE(plan.num_moments == moments && (!count_unknown || moments <= desc.num_slots),
                 LOWBIT_ERROR_INVALID_ARGUMENT,
                 "params[", i, "].plan has ", plan.num_moments, " moments but this algorithm keeps ", moments,
                 " (a plan made for another algorithm or momentum?)");
  v = ParamView{};
  v.num_moments = moments;
  v.numel = numel;
  v.param = p.param.data;
  v.param_dtype = p.param.dtype;
  v.shape = bound_shape(plan, shape);
  for (int m = 0; m < moments; ++m) {
    const lowbit_state_format_t f = plan.format[m];
    const lowbit_normalization_t n = plan.normalization[m];
    LOWBIT_REQUIRE(f >= LOWBIT_STATE_FP32 && f <= kLastStateFormat, LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i,
                   "].plan->format[", m, "] = ", int(f), " is not a lowbit_state_format_t value");
    const bool ok = n == LOWBIT_NORMALIZATION_BLOCK ||
                    (n == LOWBIT_NORMALIZATION_RANK1 && rank1_format(f)) ||
                    (n == LOWBIT_NORMALIZATION_FACTORED && m == 1 && desc.factored_second && f == LOWBIT_STATE_FP32);
    LOWBIT_REQUIRE(ok, LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "].plan->normalization[", m, "] = ", int(n),
                   " is not one the plans give for a ", format_name(f), " moment ", m);
    const Norm norm = from_c_norm(n);
    LOWBIT_REQUIRE(norm == Norm::Block || shape.ndim >= 2, LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "]: a ",
                   norm_name(norm), " moment needs the param's shape (ndim >= 2), got ", shape_text(shape));
    const int64_t data = moment_data_bytes(f, norm, v.shape, numel);
    const int64_t scales = moment_scale_bytes(f, norm, v.shape, numel) / 4;
    LOWBIT_REQUIRE(plan.data_bytes[m] == data && plan.scale_count[m] == scales, LOWBIT_ERROR_INVALID_ARGUMENT,
                   "params[", i, "].plan gives moment ", m, " ", plan.data_bytes[m], " bytes and ",
                   plan.scale_count[m], " scales, but its format and shape need ", data, " and ", scales,
                   " (a plan for another param?)");
    static const char* const data_part[2] = {"moment[0]", "moment[1]"};
    static const char* const scale_part[2] = {"scales[0]", "scales[1]"};
    check_buffer(i, data_part[m], p.moment[m], p.moment_bytes[m], data, data_alignment(f), "bytes");
    check_buffer(i, scale_part[m], p.scales[m], p.scale_count[m], scales, 4, "scales");
    const lowbit_moment_kind_t kind = kind_or_index(plan.kind[m], m);
    LOWBIT_REQUIRE(kind == desc.slot[m].kind, LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "].plan->kind[", m,
                   "] = ", int(kind), " but ", desc.title, "'s moment ", m, " (", desc.slot[m].name, ") is ",
                   desc.slot[m].kind == LOWBIT_MOMENT_UNSIGNED ? "unsigned" : "signed",
                   " (a plan made for another algorithm?)");
    v.moment[m] = moment_view(f, kind, p.moment[m], p.scales[m]);
    v.moment[m].norm = norm;
  }
  if (hparams) {
    const Norm norms[2] = {v.moment[0].norm, v.moment[1].norm};
    check_rule_norms(algorithm, hparams[p.group], moments, norms, concat("params[", i, "].plan->normalization[1]").c_str());
  }
  for (int m = moments; m < 2; ++m)
    LOWBIT_REQUIRE(plan.format[m] == LOWBIT_STATE_DEFAULT && plan.data_bytes[m] == 0 && plan.scale_count[m] == 0,
                   LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "].plan describes moment ", m,
                   " but this algorithm keeps ", moments);
  switch (plan.rounding) {
    case LOWBIT_ROUNDING_NEAREST: v.rounding = WeightRounding::Nearest; break;
    case LOWBIT_ROUNDING_STOCHASTIC: v.rounding = WeightRounding::Stochastic; break;
    case LOWBIT_ROUNDING_ERROR_CORRECTION: v.rounding = WeightRounding::ErrorCorrection; break;
    default:
      fail(LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "].plan->rounding = ", int(plan.rounding),
           " is not a lowbit_rounding_t value");
  }
  LOWBIT_REQUIRE(plan.rounding == LOWBIT_ROUNDING_NEAREST || p.param.dtype != LOWBIT_DTYPE_FLOAT32,
                 LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i,
                 "].plan rounds the weight stochastically or with error correction, but the param is float32");
  const int64_t ecc = v.rounding == WeightRounding::ErrorCorrection ? numel : 0;
  LOWBIT_REQUIRE(plan.ecc_bytes == ecc, LOWBIT_ERROR_INVALID_ARGUMENT, "params[", i, "].plan->ecc_bytes = ",
                 plan.ecc_bytes, " but its rounding needs ", ecc);
  check_buffer(i, "ecc", p.ecc, p.ecc_bytes, ecc, 1, "bytes");
  v.ecc = ecc ? p.ecc : nullptr;
  g = GradView{};
  if (stepped && numel > 0) {
    g.data = p.grad.data;
    g.dtype = p.grad.dtype;
  }
}

void FunctionalStepper::step(const lowbit_param_buffers_t* params, const lowbit_state_plan_t* plans,
                             int64_t num_params, const lowbit_hparams_t* hparams,
                             const lowbit_hparams_t* engine_hparams, int32_t num_groups, const float* lr,
                             const FunctionalCount& count, const int32_t* records, void* stream) {
  LOWBIT_REQUIRE(num_params >= 1 && num_params <= INT32_MAX, LOWBIT_ERROR_INVALID_ARGUMENT, "num_params = ",
                 num_params, " must be in [1, 2^31)");
  LOWBIT_REQUIRE(num_groups >= 1, LOWBIT_ERROR_INVALID_ARGUMENT, "args.num_groups = ", num_groups, " must be >= 1");
  LOWBIT_REQUIRE(records != nullptr, LOWBIT_ERROR_NULL_POINTER,
                 "args.records is NULL (the state records, lowbit_state_record)");
  LOWBIT_REQUIRE(count.step >= -1 && count.step < INT32_MAX, LOWBIT_ERROR_INVALID_ARGUMENT, "args.step = ",
                 count.step, " must be in [0, 2^31 - 1), or -1 when args.count gives the count");
  LOWBIT_REQUIRE(count.step >= 0 || count.count != nullptr, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "neither args.step nor args.count gives the count of steps applied");
  LOWBIT_REQUIRE((hparams != nullptr) != (engine_hparams != nullptr), LOWBIT_ERROR_INVALID_ARGUMENT,
                 hparams ? "args.hparams and args.engine_hparams are both set (one of them gives the groups' values)"
                         : "neither args.hparams nor args.engine_hparams gives the groups' hyper-parameters");
  const bool host = config_.device == LOWBIT_DEVICE_CPU;
  // The values the host can read: host ones, or engine memory that is host memory.
  const lowbit_hparams_t* readable = hparams ? hparams : (host ? engine_hparams : nullptr);
  for (int32_t g = 0; readable && g < num_groups; ++g) {
    try {
      check_hparams(readable[g], config_.algorithm);
    } catch (const Error& e) {
      fail(e.status(), hparams ? "args.hparams[" : "args.engine_hparams[", g, "]: ", e.what());
    }
  }
  if (host) {
    // Engine memory is host memory: what the device checks on CUDA is checked here.
    if (lr)
      LOWBIT_REQUIRE(*lr >= 0.f && *lr <= 3.40282347e38f, LOWBIT_ERROR_INVALID_ARGUMENT, "*args.lr = ", *lr,
                     " must be finite and >= 0");
    if (count.count) {
      LOWBIT_REQUIRE(*count.count >= 0 && *count.count < INT32_MAX, LOWBIT_ERROR_INVALID_ARGUMENT,
                     "*args.count = ", *count.count, " must be in [0, 2^31 - 1)");
      LOWBIT_REQUIRE(count.step < 0 || count.step == *count.count, LOWBIT_ERROR_STATE_MISMATCH,
                     "args.step = ", count.step, " but the state's count (*args.count) is ", *count.count,
                     " (a state restored from another step?)");
    }
  }
  views_.resize(size_t(num_params));
  grads_.resize(size_t(num_params));
  groups_.resize(size_t(num_params));
  chunks_.clear();
  for (int64_t i = 0; i < num_params; ++i) {
    check_param(i, params[i], plans[i], readable, num_groups, views_[size_t(i)], grads_[size_t(i)]);
    groups_[size_t(i)] = params[i].group;
    append_chunks(chunks_, int32_t(i), views_[size_t(i)].numel);
    if (host) {
      int32_t expected[kStateRecordColumns];
      make_state_record(plans[i], views_[size_t(i)].shape, expected);
      const int32_t* got = records + int64_t(kStateRecordColumns) * i;
      bool same = true;
      for (int k = 0; k < kStateRecordColumns; ++k) same = same && got[k] == expected[k];
      LOWBIT_REQUIRE(same, LOWBIT_ERROR_STATE_MISMATCH, "params[", i, "]: the state was made for ",
                     record_text(got), " but the plan gives ", record_text(expected));
    }
  }
  // Nothing was written before this point.
  engine_->bind(views_.data(), num_params, chunks_.data(), int64_t(chunks_.size()), groups_.data(), 0, stream);
  if (hparams) {
    engine_->set_hparams(hparams, num_groups);
    engine_groups_ = num_groups;
  } else if (engine_groups_ != num_groups) {
    // The step reads engine_hparams; the engine's own table only needs its size.
    const std::vector<lowbit_hparams_t> unused(size_t(num_groups), default_hparams(config_.algorithm));
    engine_->set_hparams(unused.data(), num_groups);
    engine_groups_ = num_groups;
  }
  StepControl ctl;
  ctl.check_nonfinite = config_.skip_nonfinite != 0;
  ctl.seed = config_.seed;
  ctl.shared_count = count.count;
  ctl.host_count = count.step;
  ctl.shared_count_out = count.count_out;
  ctl.lr = lr;
  ctl.hparams = engine_hparams;
  ctl.layout = records;
  if (config_.algorithm == LOWBIT_ALGORITHM_MUON) {
    LOWBIT_REQUIRE(driver_ && hparams, LOWBIT_ERROR_INVALID_ARGUMENT,
                   "algorithm = Muon: the functional step needs args.hparams in host memory (the Newton-Schulz "
                   "iterations are laid out on the host; args.lr may still be engine memory)");
    driver_(*engine_, params, grads_.data(), num_params, hparams, ctl, stream);
    return;
  }
  if (driver_) {  // a trust-ratio algorithm's (trust/): its passes read the step's scalars, not host hparams
    driver_(*engine_, params, grads_.data(), num_params, hparams, ctl, stream);
    return;
  }
  engine_->step(engine_algo(config_.algorithm), grads_.data(), num_params, ctl, stream);
}

}  // namespace lowbit
