#include "optimizer.hpp"

#include <cmath>
#include <cstring>

#include "codec.hpp"
#include "error.hpp"
#include "rounding.hpp"
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
  if (config.algorithm == LOWBIT_ALGORITHM_ONEBIT_ADAM) {
    auto fp32 = [](lowbit_state_format_t f) { return f == LOWBIT_STATE_DEFAULT || f == LOWBIT_STATE_FP32; };
    LOWBIT_REQUIRE(fp32(config.state_format) && fp32(config.second_state_format), LOWBIT_ERROR_UNSUPPORTED,
                   "state_format: 1-bit Adam keeps fp32 state (its momentum is what is communicated)");
  }
  engine_ = config.device == LOWBIT_DEVICE_CUDA ? make_cuda_engine(config.device_index)
                                                : make_cpu_engine(config.num_threads);
  groups_.push_back(hparams);
}

int32_t Optimizer::add_group(const lowbit_hparams_t& hparams) {
  check_hparams(hparams, config_.algorithm);
  groups_.push_back(hparams);
  return int32_t(groups_.size() - 1);
}

void Optimizer::set_hparams(int32_t group, const lowbit_hparams_t& h) {
  hparams(group);  // validates the index
  check_hparams(h, config_.algorithm);
  if (config_.algorithm == LOWBIT_ALGORITHM_SGD && h.momentum != 0.f)
    for (const ParamState& p : params_)
      LOWBIT_REQUIRE(p.group != group || p.num_moments == 1, LOWBIT_ERROR_INVALID_ARGUMENT, "momentum = ", h.momentum,
                     ": group ", group, " was registered without momentum, so its params have no momentum buffer");
  groups_[size_t(group)] = h;
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

lowbit_state_format_t Optimizer::resolve_format(lowbit_state_format_t requested, lowbit_state_format_t fallback,
                                                int64_t numel) const {
  if (requested != LOWBIT_STATE_DEFAULT) return requested;  // an explicit choice wins over the threshold
  lowbit_state_format_t f = fallback == LOWBIT_STATE_DEFAULT ? LOWBIT_STATE_FP32 : fallback;
  if (is_quantized(f) && numel < config_.min_quantized_numel) return LOWBIT_STATE_FP32;
  return f;
}

int64_t Optimizer::add_param(const lowbit_param_config_t& c) {
  check_struct_size(c.struct_size, sizeof(lowbit_param_config_t), "param_config");
  check_tensor(c.param, "param", config_.device, config_.device_index);
  const lowbit_hparams_t& h = hparams(c.group);
  check_state_format(c.state_format, "state_format", true);
  check_state_format(c.second_state_format, "second_state_format", true);
  check_flag(c.stochastic_rounding, "stochastic_rounding", true);
  check_flag(c.error_correction, "error_correction", true);
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
  p.num_moments = moment_count(config_.algorithm, h.momentum);
  lowbit_state_format_t first = resolve_format(c.state_format, config_.state_format, c.param.numel);
  lowbit_state_format_t second_fallback =
      config_.second_state_format == LOWBIT_STATE_DEFAULT ? config_.state_format : config_.second_state_format;
  lowbit_state_format_t second = c.second_state_format != LOWBIT_STATE_DEFAULT
                                     ? c.second_state_format
                                     : (c.state_format != LOWBIT_STATE_DEFAULT
                                            ? c.state_format
                                            : resolve_format(LOWBIT_STATE_DEFAULT, second_fallback, c.param.numel));
  if (config_.algorithm == LOWBIT_ALGORITHM_ONEBIT_ADAM)
    LOWBIT_REQUIRE(first == LOWBIT_STATE_FP32 && second == LOWBIT_STATE_FP32, LOWBIT_ERROR_UNSUPPORTED,
                   "state_format: 1-bit Adam keeps fp32 state");
  lowbit_state_format_t formats[2] = {first, second};
  for (int m = 0; m < p.num_moments; ++m) {
    p.moment[m].format = formats[m];
    p.moment[m].data = StateBuffer(engine_.get(), size_t(moment_data_bytes(formats[m], c.param.numel)));
    p.moment[m].scales = StateBuffer(engine_.get(), size_t(moment_scale_bytes(formats[m], c.param.numel)));
  }
  if (c.param.dtype != LOWBIT_DTYPE_FLOAT32) {
    int32_t ecc = c.error_correction >= 0 ? c.error_correction : config_.error_correction;
    int32_t sr = c.stochastic_rounding >= 0 ? c.stochastic_rounding : config_.stochastic_rounding;
    if (ecc) {
      p.rounding = WeightRounding::ErrorCorrection;
      p.ecc = StateBuffer(engine_.get(), size_t(c.param.numel));
    } else if (sr) {
      p.rounding = WeightRounding::Stochastic;
    }
  }
  int32_t id = int32_t(params_.size());
  chunks_.reserve(chunks_.size() + size_t(c.param.numel / kChunkElements + 1));
  views_.reserve(params_.size() + 1);
  params_.push_back(std::move(p));
  append_chunks(chunks_, id, c.param.numel);
  views_.resize(params_.size());
  return id;
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
  return lowbit::moment_view(p.moment[m].format, m, p.moment[m].data.data(),
                             static_cast<float*>(p.moment[m].scales.data()));
}

StepScalars Optimizer::step_scalars(const ParamState& p) const {
  return make_step_scalars(groups_[size_t(p.group)], config_.algorithm, p.step);
}

ParamView Optimizer::param_view(const ParamState& p, int64_t id, const lowbit_tensor_t& grad) const {
  ParamView v;
  v.param = p.param.data;
  v.param_dtype = p.param.dtype;
  v.grad = grad.data;
  v.grad_dtype = grad.dtype;
  v.numel = p.param.numel;
  v.num_moments = p.num_moments;
  for (int m = 0; m < p.num_moments; ++m) v.moment[m] = moment_view(p, m);
  v.ecc = static_cast<uint8_t*>(p.ecc.data());
  v.rounding = p.rounding;
  v.rounding_key = rounding_key(config_.seed, uint64_t(id), uint64_t(p.step + 1));
  v.scalars = step_scalars(p);
  return v;
}

void Optimizer::step(const lowbit_tensor_t* grads, int64_t num_grads, void* stream) {
  LOWBIT_REQUIRE(!params_.empty(), LOWBIT_ERROR_INVALID_STATE, "step: no parameters are registered");
  if (grads) {
    LOWBIT_REQUIRE(num_grads == num_params(), LOWBIT_ERROR_INVALID_ARGUMENT, "num_grads = ", num_grads,
                   " must equal the number of registered params ", num_params());
    for (size_t i = 0; i < params_.size(); ++i)
      if (grads[i].data) check_grad(grads[i], params_[i], concat("grads[", i, "]").c_str());
  }
  for (size_t i = 0; i < params_.size(); ++i)
    views_[i] = param_view(params_[i], int64_t(i), grads ? grads[i] : params_[i].grad);
  if (config_.algorithm == LOWBIT_ALGORITHM_ONEBIT_ADAM) {
    step_onebit(stream);  // its non-finite check must agree across ranks
    return;
  }
  const int64_t n = int64_t(chunks_.size());
  if (config_.skip_nonfinite && engine_->any_nonfinite(views_.data(), chunks_.data(), n, stream)) {
    last_step_skipped_ = true;
    return;
  }
  last_step_skipped_ = false;
  engine_->step(algo_, views_.data(), chunks_.data(), n, stream);
  for (size_t i = 0; i < params_.size(); ++i)
    if (views_[i].grad) ++params_[i].step;
}

lowbit_param_info_t Optimizer::info(int64_t id) const {
  const ParamState& p = param(id);
  lowbit_param_info_t out{};
  out.struct_size = sizeof(out);
  out.numel = p.param.numel;
  out.step = p.step;
  out.group = p.group;
  out.param_dtype = p.param.dtype;
  out.state_format = p.num_moments > 0 ? p.moment[0].format : LOWBIT_STATE_DEFAULT;
  out.second_state_format = p.num_moments > 1 ? p.moment[1].format : LOWBIT_STATE_DEFAULT;
  out.stochastic_rounding = p.rounding == WeightRounding::Stochastic;
  out.error_correction = p.rounding == WeightRounding::ErrorCorrection;
  out.state_bytes = state_bytes(id);
  return out;
}

int64_t Optimizer::state_bytes(int64_t id) const {
  if (id == -1) {
    int64_t total = int64_t(bucket_.bytes());
    for (int64_t i = 0; i < num_params(); ++i) total += state_bytes(i);
    return total;
  }
  const ParamState& p = param(id);
  int64_t bytes = int64_t(p.ecc.bytes());
  for (int m = 0; m < p.num_moments; ++m) bytes += int64_t(p.moment[m].data.bytes() + p.moment[m].scales.bytes());
  return bytes;
}

void Optimizer::read_moment(int64_t id, int moment, float* out, int64_t numel) const {
  const ParamState& p = param(id);
  LOWBIT_REQUIRE(out != nullptr, LOWBIT_ERROR_NULL_POINTER, "out is NULL");
  LOWBIT_REQUIRE(moment >= 0 && moment < p.num_moments, LOWBIT_ERROR_INVALID_ARGUMENT, "moment = ", moment,
                 " does not exist (this param keeps ", p.num_moments, " moments)");
  LOWBIT_REQUIRE(numel == p.param.numel, LOWBIT_ERROR_INVALID_ARGUMENT, "numel = ", numel,
                 " does not match the param's numel ", p.param.numel);
  const MomentState& ms = p.moment[moment];
  std::vector<uint8_t> data(ms.data.bytes()), scales(ms.scales.bytes());
  engine_->copy_to_host(data.data(), ms.data.data(), data.size());
  engine_->copy_to_host(scales.data(), ms.scales.data(), scales.size());
  MomentView host = moment_view(p, moment);
  host.data = data.data();
  host.scales = reinterpret_cast<float*>(scales.data());
  decode_moment(host, numel, out);
}

void Optimizer::set_comm(lowbit_comm_t comm) {
  LOWBIT_REQUIRE(config_.algorithm == LOWBIT_ALGORITHM_ONEBIT_ADAM, LOWBIT_ERROR_INVALID_STATE,
                 "set_comm: only a 1-bit Adam optimizer uses a communicator");
  comm_ = comm;
}

void Optimizer::set_momentum_mask(int64_t id, const uint8_t* mask, int64_t numel) {
  const ParamState& p = param(id);
  LOWBIT_REQUIRE(config_.algorithm == LOWBIT_ALGORITHM_ONEBIT_ADAM, LOWBIT_ERROR_INVALID_STATE,
                 "set_momentum_mask: only a 1-bit Adam optimizer takes a momentum mask");
  if (!mask) {
    params_[size_t(id)].momentum_mask.clear();
    return;
  }
  LOWBIT_REQUIRE(numel == p.param.numel, LOWBIT_ERROR_INVALID_ARGUMENT, "numel = ", numel,
                 " does not match the param's numel ", p.param.numel);
  params_[size_t(id)].momentum_mask.assign(mask, mask + numel);
}

}  // namespace lowbit
