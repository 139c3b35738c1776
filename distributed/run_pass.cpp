// The CPU side of the rules of passes.hpp: run_pass (core/engine.hpp) for each
// of them, in a file with cpu_engine.cpp's flags. The CUDA side is passes.cu.
#include "core/cpu_pass.hpp"
#include "distributed/passes.hpp"

namespace lowbit {

#define LOWBIT_INSTANTIATE_RUN_PASS(Rule) template void run_pass<Rule>(Engine&, const Rule&, const PassStep&, void*);
LOWBIT_DISTRIBUTED_RULES(LOWBIT_INSTANTIATE_RUN_PASS)

}  // namespace lowbit
