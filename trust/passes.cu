// The CUDA side of the rules of trust_rules.hpp: cuda/pass_launch.cuh's
// launcher for each (compiled with the CUDA engine's exact-math flags).
#include "cuda/pass_launch.cuh"
#include "trust/trust_rules.hpp"

LOWBIT_TRUST_RULES(LOWBIT_INSTANTIATE_CUDA_PASS)
