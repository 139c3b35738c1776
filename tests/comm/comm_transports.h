/* The compressed allreduce over transports the tests build themselves:
 *  - from the codec stages (lowbit_comm_stage_*), the messages moved with
 *    MPI_Alltoall / MPI_Allgather;
 *  - through a communicator over lowbit_comm_create_transport whose
 *    functions run MPI collectives.
 * Both must give the bits of the built-in MPI communicator. */
#ifndef LOWBIT_COMM_TRANSPORTS_H
#define LOWBIT_COMM_TRANSPORTS_H

#include <mpi.h>

#include "lowbit_comm.h"

/* How a test runs the compressed allreduce. */
typedef enum { VIA_BUILTIN = 0, VIA_STAGES = 1, VIA_CALLBACKS = 2 } via_t;
const char* via_name(via_t via);

/* compress -> MPI_Alltoall over `mpi` -> reduce -> MPI_Allgather -> decode,
 * in place on t (host tensor). Returns the first status that is not
 * LOWBIT_SUCCESS (later stages are then skipped on this rank only: use it
 * only where every rank fails alike, or after the exchanges). */
lowbit_status_t stages_allreduce(lowbit_comm_t comm, MPI_Comm mpi, const lowbit_tensor_t* t);

/* lowbit_comm_compressed_allreduce for VIA_BUILTIN and VIA_CALLBACKS,
 * stages_allreduce over `mpi` for VIA_STAGES. */
lowbit_status_t via_allreduce(via_t via, lowbit_comm_t comm, MPI_Comm mpi, const lowbit_tensor_t* t);

/* A communicator over lowbit_comm_create_transport with host buffers whose
 * functions run MPI collectives on a duplicate of `mpi`; with `agreement`,
 * allreduce_max_i64 is given too. Destroy with destroy_callback_comm. */
lowbit_comm_t make_callback_comm(MPI_Comm mpi, int agreement);
/* The same with the transport declaring `world_size` (not the MPI group's). */
lowbit_comm_t make_callback_comm_declaring(MPI_Comm mpi, int agreement, int32_t world_size);
/* The same with a config (error_format, ...); world_size the MPI communicator's. */
lowbit_comm_t make_callback_comm_config(MPI_Comm mpi, int agreement, const lowbit_comm_config_t* config);
void destroy_callback_comm(lowbit_comm_t comm);

/* Makes the k-th next function call of this callback communicator's
 * transport (k >= 1; 0: never) return -7 without communicating. */
void callback_comm_fail_at(lowbit_comm_t comm, int k);
/* Calls of its transport's functions so far. */
long callback_comm_calls(lowbit_comm_t comm);

#endif
