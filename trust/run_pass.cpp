// The CPU side of the rules of trust_rules.hpp: run_pass (core/engine.hpp)
// for each of them, in a file with cpu_engine.cpp's flags. The CUDA side is
// passes.cu.
#include "core/cpu_pass.hpp"
#include "trust/trust_rules.hpp"

namespace lowbit {

#define LOWBIT_INSTANTIATE_TRUST_RUN_PASS(Rule) \
  template void run_pass<Rule>(Engine&, const Rule&, const PassStep&, void*);
LOWBIT_TRUST_RULES(LOWBIT_INSTANTIATE_TRUST_RUN_PASS)

}  // namespace lowbit
