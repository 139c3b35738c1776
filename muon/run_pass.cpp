// The CPU side of the rules of muon_rules.hpp (core/cpu_pass.hpp's runner;
// this file has cpu_engine.cpp's flags) and their type-erased passes. The
// CUDA side is passes.cu.
#include "muon/run_pass.hpp"

#include "core/cpu_pass.hpp"
#include "muon/muon_rules.hpp"

namespace lowbit {
namespace muon {

template <class Rule>
void run_pass(Engine& engine, const Rule& rule, const PassStep& step, void* stream) {
  const RulePass<Rule> pass(rule, step);
  engine.run_pass(pass, stream);
}

#define LOWBIT_INSTANTIATE_MUON_RUN_PASS(Rule) \
  template void run_pass<Rule>(Engine&, const Rule&, const PassStep&, void*);
LOWBIT_MUON_RULES(LOWBIT_INSTANTIATE_MUON_RUN_PASS)

}  // namespace muon
}  // namespace lowbit
