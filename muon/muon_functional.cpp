#include "muon/muon_functional.hpp"

#include <memory>
#include <vector>

#include "muon/muon_optimizer.hpp"
#include "muon/muon_step.hpp"

namespace lowbit {
namespace muon {

void install_functional_driver(FunctionalStepper& stepper, const lowbit_optimizer_config_t& config) {
  auto steps = std::make_shared<MuonSteps>();
  auto params = std::make_shared<std::vector<MuonParam>>();
  const lowbit_device_t device = config.device;
  stepper.set_step_driver([steps, params, device](Engine& e, const lowbit_param_buffers_t* buffers,
                                                  const GradView* grads, int64_t n, const lowbit_hparams_t* hparams,
                                                  const StepControl& ctl, void* stream) {
    params->resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) {
      const lowbit_param_buffers_t& b = buffers[i];
      Shape shape{};
      shape.ndim = b.ndim;
      for (int k = 0; k < b.ndim; ++k) shape.dim[k] = b.shape[k];
      (*params)[size_t(i)] = muon_param(hparams[b.group], LOWBIT_ALGORITHM_MUON, b.group, shape, b.param.numel);
    }
    steps->layout(e, *params);
    steps->step(e, grads, hparams, device, ctl.check_nonfinite, ctl, stream);
  });
}

}  // namespace muon
}  // namespace lowbit
