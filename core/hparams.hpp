// The host side of the algorithm descriptors (core/algorithms.hpp,
// core/hparam_specs.hpp): the check that names the field at fault, and the
// descriptors as the C API exports them. default_hparams is core/defaults.hpp's.
#pragma once
#include <vector>

#include "lowbit.h"

namespace lowbit {

// Every algorithm, in enum order (listed once, on first use).
const std::vector<lowbit_algorithm_t>& all_algorithms();
// The C descriptors (current struct sizes); `algorithm` must be one.
lowbit_algorithm_info_t algorithm_info(lowbit_algorithm_t algorithm);
std::vector<lowbit_hparam_info_t> hparam_infos(lowbit_algorithm_t algorithm);

}  // namespace lowbit
