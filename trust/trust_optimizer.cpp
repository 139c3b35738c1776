#include "trust/trust_optimizer.hpp"

#include <vector>

#include "core/algorithms.hpp"

namespace lowbit {
namespace trust {

std::unique_ptr<Optimizer> make_optimizer(const lowbit_optimizer_config_t& config, const lowbit_hparams_t& hparams) {
  if (!describe(config.algorithm).trust_ratio) return nullptr;
  auto opt = std::make_unique<Optimizer>(config, hparams);
  opt->set_extension(std::make_unique<TrustOptimizer>(*opt));
  return opt;
}

void install_functional_driver(FunctionalStepper& stepper, const lowbit_optimizer_config_t& config) {
  if (!describe(config.algorithm).trust_ratio) return;
  auto steps = std::make_shared<TrustSteps>();
  auto numels = std::make_shared<std::vector<int64_t>>();
  const Algo rule = engine_algo(config.algorithm);
  stepper.set_step_driver([steps, numels, rule](Engine& e, const lowbit_param_buffers_t* buffers,
                                                const GradView* grads, int64_t n, const lowbit_hparams_t*,
                                                const StepControl& ctl, void* stream) {
    numels->resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) (*numels)[size_t(i)] = buffers[i].param.numel;
    steps->layout(e, *numels);
    steps->step(e, rule, grads, ctl.check_nonfinite, ctl, stream);
  });
}

void TrustOptimizer::params_changed() {
  std::vector<int64_t> numels(size_t(opt_.num_params()));
  for (int64_t i = 0; i < opt_.num_params(); ++i) numels[size_t(i)] = opt_.param(i).param.numel;
  steps_.layout(opt_.engine(), numels);
}

void TrustOptimizer::step(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream) {
  run(opt_.prepare_grads(grads, num_grads, explicit_grads), stream);
}

void TrustOptimizer::run(const GradView* grads, void* stream) {
  StepControl base;
  base.seed = opt_.config().seed;
  steps_.step(opt_.engine(), engine_algo(opt_.config().algorithm), grads, opt_.config().skip_nonfinite != 0, base,
              stream);
}

}  // namespace trust
}  // namespace lowbit
