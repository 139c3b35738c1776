/* Creating an MPI communicator before MPI_Init (and after MPI_Finalize) is
 * refused with LOWBIT_ERROR_INVALID_STATE and a message that says so; no
 * abort. Runs as a plain process (no mpiexec). */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "lowbit_comm.h"

static int failures = 0;
static void expect(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAILED: %s (last error: \"%s\")\n", what, lowbit_last_error());
    ++failures;
  }
}

int main(int argc, char** argv) {
  MPI_Comm w = MPI_COMM_WORLD;
  lowbit_comm_t c = NULL;
  expect(lowbit_comm_create_mpi(&c, &w, NULL) == LOWBIT_ERROR_INVALID_STATE, "create before MPI_Init");
  expect(strstr(lowbit_last_error(), "MPI_Init") != NULL, "message names MPI_Init");
  expect(c == NULL, "out is NULL");
  expect(lowbit_comm_create_mpi_fortran(&c, 0, NULL) == LOWBIT_ERROR_INVALID_STATE, "fortran create before MPI_Init");
  MPI_Init(&argc, &argv);
  expect(lowbit_comm_create_mpi(&c, &w, NULL) == LOWBIT_SUCCESS, "create after MPI_Init");
  expect(lowbit_comm_destroy(c) == LOWBIT_SUCCESS, "destroy");
  /* A handle destroyed after MPI_Finalize must not call into MPI. */
  expect(lowbit_comm_create_mpi(&c, &w, NULL) == LOWBIT_SUCCESS, "second create");
  MPI_Finalize();
  expect(lowbit_comm_destroy(c) == LOWBIT_SUCCESS, "destroy after MPI_Finalize");
  expect(lowbit_comm_create_mpi(&c, &w, NULL) == LOWBIT_ERROR_INVALID_STATE, "create after MPI_Finalize");
  expect(strstr(lowbit_last_error(), "finalized") != NULL, "message says finalized");
  if (failures) return 1;
  printf("all checks passed\n");
  return 0;
}
