// Runs one of the rules of muon_rules.hpp on an engine (Engine::run_pass);
// instantiated for every rule of LOWBIT_MUON_RULES in run_pass.cpp.
#pragma once
#include "core/engine.hpp"

namespace lowbit {
namespace muon {

template <class Rule>
void run_pass(Engine& engine, const Rule& rule, const PassStep& step, void* stream);

}  // namespace muon
}  // namespace lowbit
