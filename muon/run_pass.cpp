// The CPU side of the rules of muon_rules.hpp: run_pass (core/engine.hpp) for
// each of them, in a file with cpu_engine.cpp's flags. The CUDA side is
// passes.cu.
#include "core/cpu_pass.hpp"
#include "muon/muon_rules.hpp"

namespace lowbit {

#define LOWBIT_INSTANTIATE_MUON_RUN_PASS(Rule) \
  template void run_pass<Rule>(Engine&, const Rule&, const PassStep&, void*);
LOWBIT_MUON_RULES(LOWBIT_INSTANTIATE_MUON_RUN_PASS)

}  // namespace lowbit
