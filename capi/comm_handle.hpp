// The communicator behind a lowbit_comm_t handle, for the other C entry
// points (lowbit_optimizer_set_comm hands it to the optimizer).
#pragma once
#include "lowbit.h"

namespace lowbit {

class Communicator;

// Throws LOWBIT_ERROR_NULL_POINTER ("comm is NULL") for NULL.
Communicator& communicator_from_handle(lowbit_comm_t comm);

}  // namespace lowbit
