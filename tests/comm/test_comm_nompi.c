/* Built only when lowbit has no MPI: creating an MPI communicator must fail
 * with LOWBIT_ERROR_UNSUPPORTED and a message that says why, and the other
 * entry points must still behave (NULL handles, config init). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowbit_comm.h"

static int failures = 0;
#define EXPECT(cond, ...)                                   \
  do {                                                      \
    if (!(cond)) {                                          \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                         \
      fprintf(stderr, "\n");                                \
      ++failures;                                           \
    }                                                       \
  } while (0)

int main(void) {
  EXPECT(lowbit_has_mpi() == 0, "lowbit_has_mpi() is %d in a build without MPI", lowbit_has_mpi());
  int dummy_comm = 0; /* stands in for an MPI_Comm: never dereferenced */
  lowbit_comm_t c = (lowbit_comm_t)&dummy_comm;
  lowbit_status_t st = lowbit_comm_create_mpi(&c, &dummy_comm, NULL);
  EXPECT(st == LOWBIT_ERROR_UNSUPPORTED, "lowbit_comm_create_mpi returned %s", lowbit_status_string(st));
  EXPECT(c == NULL, "out not set to NULL on failure");
  EXPECT(strstr(lowbit_last_error(), "without MPI") != NULL, "message \"%s\" does not say MPI is not built in",
         lowbit_last_error());
  st = lowbit_comm_create_mpi_fortran(&c, 0, NULL);
  EXPECT(st == LOWBIT_ERROR_UNSUPPORTED, "lowbit_comm_create_mpi_fortran returned %s", lowbit_status_string(st));
  EXPECT(strstr(lowbit_last_error(), "without MPI") != NULL, "message \"%s\"", lowbit_last_error());

  lowbit_comm_config_t cfg;
  EXPECT(lowbit_comm_config_init(&cfg) == LOWBIT_SUCCESS, "config_init failed");
  EXPECT(cfg.struct_size == sizeof cfg && cfg.cuda_aware_mpi == LOWBIT_COMM_CUDA_AWARE_AUTO, "config defaults");
  EXPECT(lowbit_comm_destroy(NULL) == LOWBIT_SUCCESS, "destroy(NULL)");
  int32_t r = 0;
  EXPECT(lowbit_comm_rank(NULL, &r) == LOWBIT_ERROR_NULL_POINTER, "rank(NULL)");
  EXPECT(strstr(lowbit_last_error(), "comm is NULL") != NULL, "message \"%s\"", lowbit_last_error());
  if (failures) return 1;
  printf("all checks passed\n");
  return 0;
}
