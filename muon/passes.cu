// The CUDA side of the rules of muon_rules.hpp: cuda/pass_launch.cuh's
// launcher for each (compiled with the CUDA engine's exact-math flags).
#include "cuda/pass_launch.cuh"
#include "muon/muon_rules.hpp"

LOWBIT_MUON_RULES(LOWBIT_INSTANTIATE_CUDA_PASS)
