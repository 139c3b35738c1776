#include "muon/muon_optimizer.hpp"

#include "core/validation.hpp"

namespace lowbit {
namespace muon {

std::unique_ptr<Optimizer> make_optimizer(const lowbit_optimizer_config_t& config, const lowbit_hparams_t& hparams) {
  auto opt = std::make_unique<Optimizer>(config, hparams);
  if (config.algorithm == LOWBIT_ALGORITHM_MUON) opt->set_extension(std::make_unique<MuonOptimizer>(*opt));
  return opt;
}

MuonParam muon_param(const lowbit_hparams_t& group, lowbit_algorithm_t algorithm, int32_t group_index,
                     const Shape& shape, int64_t numel) {
  MuonParam p{group_algorithm(group, algorithm), group_index, 1, numel};
  if (p.algorithm == LOWBIT_ALGORITHM_MUON) p.rows = shape.dim[0], p.cols = numel / shape.dim[0];
  return p;
}

void MuonOptimizer::params_changed() {
  std::vector<MuonParam> params(static_cast<size_t>(opt_.num_params()));
  for (int64_t i = 0; i < opt_.num_params(); ++i) {
    const ParamState& p = opt_.param(i);
    params[size_t(i)] = muon_param(opt_.hparams(p.group), LOWBIT_ALGORITHM_MUON, p.group, p.shape, p.param.numel);
  }
  steps_.layout(opt_.engine(), params);
}

void MuonOptimizer::step(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream) {
  run(opt_.prepare_grads(grads, num_grads, explicit_grads), stream);
}

void MuonOptimizer::run(const GradView* grads, void* stream) {
  StepControl base;
  base.seed = opt_.config().seed;
  steps_.step(opt_.engine(), grads, opt_.groups().data(), opt_.config().device, opt_.config().skip_nonfinite != 0,
              base, stream);
}

}  // namespace muon
}  // namespace lowbit
