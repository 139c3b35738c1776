/* CHECK / OK for the C tests that run under mpirun: a failed check prints
 * the rank, file and line and aborts every rank (no rank is left waiting in
 * a collective). */
#pragma once
#include <mpi.h>
#include <stdio.h>

#include "lowbit.h"

#define CHECK(cond, ...)                                                \
  do {                                                                  \
    if (!(cond)) {                                                      \
      int check_rank_ = -1;                                             \
      MPI_Comm_rank(MPI_COMM_WORLD, &check_rank_);                      \
      fprintf(stderr, "rank %d: %s:%d: ", check_rank_, __FILE__,        \
              __LINE__);                                                \
      fprintf(stderr, __VA_ARGS__);                                     \
      fprintf(stderr, "\n");                                            \
      MPI_Abort(MPI_COMM_WORLD, 1);                                     \
    }                                                                   \
  } while (0)
#define OK(call) CHECK((call) == LOWBIT_SUCCESS, "%s failed: %s", #call, lowbit_last_error())
