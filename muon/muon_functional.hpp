// Muon in the functional step (lowbit.h, "functional step"): the step driver
// core's FunctionalStepper runs for a Muon context, MuonSteps over the call's
// buffers (laid out again only when the params' shapes or groups change).
#pragma once
#include "core/functional_step.hpp"

namespace lowbit {
namespace muon {

void install_functional_driver(FunctionalStepper& stepper, const lowbit_optimizer_config_t& config);

}  // namespace muon
}  // namespace lowbit
