#include "optimizer.hpp"

#include "algorithms.hpp"

#include <cmath>
#include <cstring>

#include "codec.hpp"
#include "defaults.hpp"
#include "error.hpp"
#include "step_scalars.hpp"
#include "validation.hpp"

namespace lowbit {

namespace {

bool overlaps(const lowbit_tensor_t& a, const lowbit_tensor_t& b) {
  auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  auto a1 = a0 + uintptr_t(a.numel * dtype_bytes(a.dtype)), b1 = b0 + uintptr_t(b.numel * dtype_bytes(b.dtype));
  return a.device == b.device && a.device_index == b.device_index && a0 < b1 && b0 < a1;
}

}  // namespace

Optimizer::Optimizer(const lowbit_optimizer_config_t& config, const lowbit_hparams_t& hparams)
    : config_(config), algo_(engine_algo(config.algorithm)) {
  check_config(config);
  check_hparams(hparams, config.algorithm);
  engine_ = config.device == LOWBIT_DEVICE_CUDA ? make_cuda_engine(config.device_index)
                                                : make_cpu_engine(config.num_threads);
  groups_.push_back(hparams);
  push_hparams();
}

void Optimizer::push_hparams() { engine_->set_hparams(groups_.data(), int32_t(groups_.size())); }

int32_t Optimizer::add_group(const lowbit_hparams_t& hparams) {
  check_hparams(hparams, config_.algorithm);
  groups_.push_back(hparams);
  try {
    push_hparams();
  } catch (...) {
    groups_.pop_back();
    throw;
  }
  return int32_t(groups_.size() - 1);
}

void Optimizer::set_hparams(int32_t group, const lowbit_hparams_t& h) {
  hparams(group);  // validates the index
  check_hparams(h, config_.algorithm);
  // SGD keeps a momentum buffer only when it was registered with momentum:
  // a plain SGD optimizer's groups and a Muon optimizer's SGD groups alike.
  // RMSprop's second moment likewise, and what a slot holds (the momentum
  // buffer or the centred average: desc.fixed_at_registration) stays what it
  // was registered as.
  const AlgorithmDesc desc = describe(group_algorithm(h, config_.algorithm));
  const lowbit_hparams_t& old = groups_[size_t(group)];
  for (const ParamState& p : params_) {
    if (p.group != group) continue;
    const bool optional_second = desc.num_slots == 2 && desc.slot[1].when != SlotWhen::Always;
    LOWBIT_REQUIRE(moments_in_use(desc, h) <= p.num_moments, LOWBIT_ERROR_INVALID_ARGUMENT, "momentum = ",
                   h.momentum, desc.fixed_at_registration ? concat(", ", desc.fixed_name, " = ", h.*desc.fixed_at_registration).c_str() : "",
                   ": group ", group, " was registered without ",
                   optional_second ? concat("them, so its params have no ", desc.slot[1].name).c_str()
                                   : "momentum, so its params have no momentum buffer");
    if (desc.fixed_at_registration && p.num_moments > 0) {
      const auto f = desc.fixed_at_registration;
      const bool same_algorithm = group_algorithm(old, config_.algorithm) == desc.id;
      LOWBIT_REQUIRE(!same_algorithm || (h.*f != 0) == (old.*f != 0), LOWBIT_ERROR_INVALID_ARGUMENT,
                     desc.fixed_name, " = ", h.*f, ": group ", group, "'s params were registered with ", desc.fixed_name,
                     " = ", old.*f,
                     ", which fixed what their moments hold");
    }
  }
  if (group_algorithm(h, config_.algorithm) != group_algorithm(groups_[size_t(group)], config_.algorithm))
    for (const ParamState& p : params_)
      LOWBIT_REQUIRE(p.group != group, LOWBIT_ERROR_INVALID_ARGUMENT, "algorithm = ", int(h.algorithm), ": group ",
                     group, " has params, whose state was laid out for its algorithm at registration");
  groups_[size_t(group)] = h;
  push_hparams();
}

const lowbit_hparams_t& Optimizer::hparams(int32_t group) const {
  LOWBIT_REQUIRE(group >= 0 && size_t(group) < groups_.size(), LOWBIT_ERROR_INVALID_ARGUMENT, "group = ", group,
                 " does not exist (there are ", groups_.size(), " groups)");
  return groups_[size_t(group)];
}

void Optimizer::set_lr(int32_t group, float lr) {
  lowbit_hparams_t h = hparams(group);
  h.lr = lr;
  set_hparams(group, h);
}

lowbit_hparams_t* Optimizer::device_hparams(int32_t group) {
  hparams(group);
  return engine_->hparams_memory(group);
}

int64_t Optimizer::add_param(const lowbit_param_config_t& c) {
  check_struct_size(c.struct_size, sizeof(lowbit_param_config_t), "param_config");
  check_tensor(c.param, "param", config_.device, config_.device_index);
  const lowbit_hparams_t& h = hparams(c.group);
  const StatePlan plan = plan_param_state(config_, h, c);
  for (size_t i = 0; i < params_.size(); ++i)
    LOWBIT_REQUIRE(!overlaps(c.param, params_[i].param), LOWBIT_ERROR_INVALID_ARGUMENT, "param.data = ", c.param.data,
                   " (", c.param.numel, " elements) overlaps param ", i, " registered at ", params_[i].param.data);
  ParamState p;
  p.param = c.param;
  p.group = c.group;
  if (c.grad.data) {
    check_grad(c.grad, p, "grad");
    p.grad = c.grad;
  }
  p.num_moments = plan.num_moments;
  p.shape = plan.shape;
  for (int m = 0; m < p.num_moments; ++m) {
    p.moment[m].format = plan.format[m];
    p.moment[m].norm = plan.norm[m];
    p.moment[m].kind = plan.kind[m];
    p.moment[m].data = StateBuffer(engine_.get(), size_t(plan.data_bytes(m, c.param.numel)));
    p.moment[m].scales = StateBuffer(engine_.get(), size_t(plan.scale_bytes(m, c.param.numel)));
  }
  p.rounding = plan.rounding;
  if (plan.ecc_bytes(c.param.numel)) p.ecc = StateBuffer(engine_.get(), size_t(plan.ecc_bytes(c.param.numel)));

  const int32_t id = int32_t(params_.size());
  const size_t old_chunks = chunks_.size();
  chunks_.reserve(chunks_.size() + size_t(c.param.numel / kChunkElements + 1));
  views_.reserve(params_.size() + 1);
  param_groups_.reserve(params_.size() + 1);
  grads_.reserve(params_.size() + 1);
  params_.push_back(std::move(p));
  append_chunks(chunks_, id, c.param.numel);
  views_.push_back(param_view(params_.back()));
  param_groups_.push_back(c.group);
  grads_.push_back(GradView{});
  try {
    bind(id);
    if (extension_) extension_->params_changed();
  } catch (...) {
    params_.pop_back();
    chunks_.resize(old_chunks);
    views_.pop_back();
    param_groups_.pop_back();
    grads_.pop_back();
    try {
      bind(id);
      if (extension_) extension_->params_changed();
    } catch (...) {
    }
    throw;
  }
  return id;
}

void Optimizer::bind(int64_t first_changed) {
  engine_->bind(views_.data(), int64_t(views_.size()), chunks_.data(), int64_t(chunks_.size()), param_groups_.data(),
                first_changed, nullptr);
  engine_->wait(nullptr);
}

void Optimizer::check_grad(const lowbit_tensor_t& grad, const ParamState& p, const char* what) const {
  check_tensor(grad, what, config_.device, config_.device_index);
  LOWBIT_REQUIRE(grad.numel == p.param.numel, LOWBIT_ERROR_INVALID_ARGUMENT, what, ".numel = ", grad.numel,
                 " does not match the param's numel ", p.param.numel);
}

const ParamState& Optimizer::param(int64_t id) const {
  LOWBIT_REQUIRE(id >= 0 && id < num_params(), LOWBIT_ERROR_INVALID_ARGUMENT, "param_id = ", id,
                 " does not exist (", num_params(), " params registered)");
  return params_[size_t(id)];
}

void Optimizer::set_grad(int64_t id, const lowbit_tensor_t* grad) {
  const ParamState& p = param(id);
  if (grad && grad->data) check_grad(*grad, p, "grad");
  params_[size_t(id)].grad = grad && grad->data ? *grad : lowbit_tensor_t{};
}

MomentView Optimizer::moment_view(const ParamState& p, int m) const {
  MomentView v = lowbit::moment_view(p.moment[m].format, p.moment[m].kind, p.moment[m].data.data(),
                                     static_cast<float*>(p.moment[m].scales.data()));
  v.norm = p.moment[m].norm;
  return v;
}

ParamView Optimizer::param_view(const ParamState& p) const {
  ParamView v;
  v.param = p.param.data;
  v.param_dtype = p.param.dtype;
  v.numel = p.param.numel;
  v.num_moments = p.num_moments;
  for (int m = 0; m < p.num_moments; ++m) v.moment[m] = moment_view(p, m);
  v.ecc = static_cast<uint8_t*>(p.ecc.data());
  v.rounding = p.rounding;
  v.shape = p.shape;
  return v;
}

GradView* Optimizer::prepare_grads(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads) {
  LOWBIT_REQUIRE(grads || !explicit_grads, LOWBIT_ERROR_NULL_POINTER, "grads is NULL");
  LOWBIT_REQUIRE(!params_.empty(), LOWBIT_ERROR_INVALID_STATE, "step: no parameters are registered");
  if (grads) {
    LOWBIT_REQUIRE(num_grads == num_params(), LOWBIT_ERROR_INVALID_ARGUMENT, "num_grads = ", num_grads,
                   " must equal the number of registered params ", num_params());
    for (size_t i = 0; i < params_.size(); ++i)
      if (grads[i].data) check_grad(grads[i], params_[i], concat("grads[", i, "]").c_str());
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const lowbit_tensor_t& g = grads ? grads[i] : params_[i].grad;
    grads_[i] = GradView{g.data, g.dtype};
  }
  return grads_.data();
}

void Optimizer::step(const lowbit_tensor_t* grads, int64_t num_grads, void* stream, bool explicit_grads) {
  if (extension_) {
    extension_->step(grads, num_grads, explicit_grads, stream);
    return;
  }
  prepare_grads(grads, num_grads, explicit_grads);
  StepControl ctl;
  ctl.check_nonfinite = config_.skip_nonfinite != 0;
  ctl.seed = config_.seed;
  engine_->step(algo_, grads_.data(), num_params(), ctl, stream);
}

void Optimizer::step_params(const int64_t* ids, int64_t n, const lowbit_tensor_t* grads, void* stream) {
  LOWBIT_REQUIRE(ids != nullptr, LOWBIT_ERROR_NULL_POINTER, "ids is NULL");
  LOWBIT_REQUIRE(n >= 1 && n <= num_params(), LOWBIT_ERROR_INVALID_ARGUMENT, "num_ids = ", n, " must be in [1, ",
                 num_params(), "] (the registered params)");
  for (GradView& g : grads_) g = GradView{};
  for (int64_t k = 0; k < n; ++k) {
    const int64_t id = ids[k];
    LOWBIT_REQUIRE(id >= 0 && id < num_params(), LOWBIT_ERROR_INVALID_ARGUMENT, "ids[", k, "] = ", id,
                   " does not exist (", num_params(), " params registered)");
    GradView& g = grads_[size_t(id)];
    LOWBIT_REQUIRE(g.data == nullptr, LOWBIT_ERROR_INVALID_ARGUMENT, "ids[", k, "] = ", id,
                   " appears twice (a param takes one step per call)");
    const lowbit_tensor_t& t = grads ? grads[k] : params_[size_t(id)].grad;
    LOWBIT_REQUIRE(t.data != nullptr, LOWBIT_ERROR_INVALID_ARGUMENT, "ids[", k, "] = ", id,
                   grads ? concat(": grads[", k, "].data is NULL")
                         : std::string(" has no registered gradient (lowbit_optimizer_set_grad)"));
    if (grads) check_grad(t, params_[size_t(id)], concat("grads[", k, "]").c_str());
    g = GradView{t.data, t.dtype};
  }
  if (extension_) {
    extension_->step_subset(grads_.data(), stream);
    return;
  }
  StepControl ctl;
  ctl.check_nonfinite = config_.skip_nonfinite != 0;
  ctl.seed = config_.seed;
  engine_->step(algo_, grads_.data(), num_params(), ctl, stream);
}

std::vector<int64_t> Optimizer::steps(void* stream) const {
  std::vector<int64_t> s(params_.size());
  if (!s.empty()) engine_->read_steps(s.data(), int64_t(s.size()), stream);
  return s;
}

lowbit_param_info_t Optimizer::info(int64_t id) const {
  const ParamState& p = param(id);
  lowbit_param_info_t out{};
  out.struct_size = sizeof(out);
  out.numel = p.param.numel;
  out.step = steps(nullptr)[size_t(id)];
  out.group = p.group;
  out.param_dtype = p.param.dtype;
  out.state_format = p.num_moments > 0 ? p.moment[0].format : LOWBIT_STATE_DEFAULT;
  out.second_state_format = p.num_moments > 1 ? p.moment[1].format : LOWBIT_STATE_DEFAULT;
  out.stochastic_rounding = p.rounding == WeightRounding::Stochastic;
  out.error_correction = p.rounding == WeightRounding::ErrorCorrection;
  out.state_bytes = state_bytes(id);
  out.first_normalization = p.num_moments > 0 ? to_c_norm(p.moment[0].norm) : LOWBIT_NORMALIZATION_DEFAULT;
  out.second_normalization = p.num_moments > 1 ? to_c_norm(p.moment[1].norm) : LOWBIT_NORMALIZATION_DEFAULT;
  out.ndim = p.shape.ndim;
  return out;
}

int64_t Optimizer::state_bytes(int64_t id) const {
  if (id == -1) {
    int64_t total = extension_ ? extension_->state_bytes() : 0;
    for (int64_t i = 0; i < num_params(); ++i) total += state_bytes(i);
    return total;
  }
  const ParamState& p = param(id);
  int64_t bytes = int64_t(p.ecc.bytes());
  for (int m = 0; m < p.num_moments; ++m) bytes += int64_t(p.moment[m].data.bytes() + p.moment[m].scales.bytes());
  return bytes;
}

const MomentState& Optimizer::moment_state(int64_t id, int moment) const {
  const ParamState& p = param(id);
  LOWBIT_REQUIRE(moment >= 0 && moment < p.num_moments, LOWBIT_ERROR_INVALID_ARGUMENT, "moment = ", moment,
                 " does not exist (this param keeps ", p.num_moments, " moments)");
  return p.moment[moment];
}

void Optimizer::read_moment(int64_t id, int moment, float* out, int64_t numel, void* stream) const {
  const MomentState& ms = moment_state(id, moment);
  const ParamState& p = params_[size_t(id)];
  LOWBIT_REQUIRE(out != nullptr, LOWBIT_ERROR_NULL_POINTER, "out is NULL");
  LOWBIT_REQUIRE(numel == p.param.numel, LOWBIT_ERROR_INVALID_ARGUMENT, "numel = ", numel,
                 " does not match the param's numel ", p.param.numel);
  std::vector<uint8_t> data(ms.data.bytes()), scales(ms.scales.bytes());
  engine_->copy_to_host(data.data(), ms.data.data(), data.size(), stream);
  engine_->copy_to_host(scales.data(), ms.scales.data(), scales.size(), stream);
  MomentView host = moment_view(p, moment);
  host.data = data.data();
  host.scales = reinterpret_cast<float*>(scales.data());
  decode_moment(host, p.shape, numel, out);
}

void Optimizer::write_moment(int64_t id, int moment, const float* values, int64_t numel, void* stream) {
  const MomentState& ms = moment_state(id, moment);
  const ParamState& p = params_[size_t(id)];
  LOWBIT_REQUIRE(values != nullptr, LOWBIT_ERROR_NULL_POINTER, "values is NULL");
  LOWBIT_REQUIRE(numel == p.param.numel, LOWBIT_ERROR_INVALID_ARGUMENT, "numel = ", numel,
                 " does not match the numel ", p.param.numel, " of param ", id);
  // An unsigned moment (a second moment, a sum of squares) is a variance.
  const bool variance = p.moment[moment].kind == LOWBIT_MOMENT_UNSIGNED;
  for (int64_t i = 0; i < numel; ++i) {
    LOWBIT_REQUIRE(std::isfinite(values[i]), LOWBIT_ERROR_NONFINITE, "values[", i, "] = ", values[i],
                   " is not finite (param ", id, ", moment ", moment, ")");
    LOWBIT_REQUIRE(!variance || values[i] >= 0.f, LOWBIT_ERROR_INVALID_ARGUMENT, "values[", i, "] = ", values[i],
                   " is negative, but moment ", moment, " of param ", id, " is non-negative (a second moment)");
  }
  std::vector<uint8_t> data(ms.data.bytes()), scales(ms.scales.bytes());
  MomentView host = moment_view(p, moment);
  host.data = data.data();
  host.scales = reinterpret_cast<float*>(scales.data());
  reencode_moment(host, p.shape, numel, values);  // the same encoding as loading a materialised checkpoint
  engine_->copy_from_host(ms.data.data(), data.data(), data.size(), stream);
  engine_->copy_from_host(ms.scales.data(), scales.data(), scales.size(), stream);
}

void Optimizer::set_step(int64_t id, int64_t step, void* stream) {
  LOWBIT_REQUIRE(id == -1 || (id >= 0 && id < num_params()), LOWBIT_ERROR_INVALID_ARGUMENT, "param_id = ", id,
                 " does not exist (", num_params(), " params registered; -1 sets them all)");
  LOWBIT_REQUIRE(step >= 0 && step <= kMaxSetStep, LOWBIT_ERROR_INVALID_ARGUMENT, "step = ", step,
                 " is outside 0 .. 2^53 = ", kMaxSetStep);
  if (params_.empty()) return;
  std::vector<int64_t> s = steps(stream);
  if (id == -1)
    std::fill(s.begin(), s.end(), step);
  else
    s[size_t(id)] = step;
  engine_->write_steps(s.data(), int64_t(s.size()), stream);
  if (extension_) extension_->steps_changed(stream);
}

}  // namespace lowbit
