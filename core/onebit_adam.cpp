// 1-bit Adam step driver (warm-up with averaged gradients, then frozen variance
// and compressed momentum). Implemented together with the communicator.
#include "error.hpp"
#include "optimizer.hpp"

namespace lowbit {

void Optimizer::step_onebit(void*) {
  fail(LOWBIT_ERROR_UNSUPPORTED, "algorithm: 1-bit Adam needs the communicator, which is not built yet");
}

}  // namespace lowbit
