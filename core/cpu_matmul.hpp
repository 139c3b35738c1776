// The CPU engine's matrix products (Engine::matmul) through the CBLAS found at
// build time.
#pragma once
#include "engine.hpp"

namespace lowbit {

void cpu_matmul(const Matmul& mm, int num_threads);

}  // namespace lowbit
