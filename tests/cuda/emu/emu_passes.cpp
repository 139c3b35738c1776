// The launcher of cuda/pass_launch.cuh for the rules of distributed/passes.hpp,
// running the same kernel source and launch geometry under emu.hpp.
#include "emu.hpp"

#include "cuda/pass_launch.cuh"
#include "distributed/passes.hpp"

LOWBIT_DISTRIBUTED_RULES(LOWBIT_INSTANTIATE_CUDA_PASS)
