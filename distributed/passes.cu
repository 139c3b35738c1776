// The CUDA side of the rules of passes.hpp: cuda/pass_launch.cuh's launcher
// for each (compiled with the CUDA engine's exact-math flags).
#include "cuda/pass_launch.cuh"
#include "distributed/passes.hpp"

LOWBIT_DISTRIBUTED_RULES(LOWBIT_INSTANTIATE_CUDA_PASS)
