// The launcher of cuda/pass_launch.cuh for the rules of trust/trust_rules.hpp,
// running the same kernel source and launch geometry under emu.hpp.
#include "emu.hpp"

#include "cuda/pass_launch.cuh"
#include "trust/trust_rules.hpp"

LOWBIT_TRUST_RULES(LOWBIT_INSTANTIATE_CUDA_PASS)
