/* Shared helpers of the communicator tests (run under mpiexec).
 *
 * A failed check prints the rank, the place and why, then calls MPI_Abort so
 * that no rank is left waiting in a collective. Random inputs come from a seed
 * chosen by rank 0 (tests/common/test_seed.h: fixed, unless LOWBIT_TEST_SEED=N
 * or =random) and broadcast, so every rank can regenerate every other rank's
 * input and simulate the whole world.
 *
 * The float64 simulation (comm_sim_step) is the algorithm of lowbit_comm.h
 * written independently in double precision: x = t + e, s = ||x||/sqrt(n),
 * e <- x - s sign(x), y = mean_j(s_j sign(x_j)) + z over each server chunk,
 * S = ||y||/sqrt(c_r), z <- y - S sign(y), out = S sign(y). sign(v) = +1 for
 * v >= 0. It flags the elements whose y lies so close to 0 that fp32 and
 * float64 may pick different signs ("ambiguous"; the only place where they
 * can disagree, since the worker signs of t + e are exact in both). */
#ifndef LOWBIT_COMM_HARNESS_H
#define LOWBIT_COMM_HARNESS_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "lowbit_comm.h"

extern int g_rank, g_world;

void harness_init(int* argc, char*** argv);
int harness_finish(void); /* MPI_Finalize; returns 0 */

/* Aborts all ranks with a message. */
void harness_fail(const char* file, int line, const char* fmt, ...);

#define CHECK(cond, ...)                                    \
  do {                                                      \
    if (!(cond)) harness_fail(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

/* Checks a status and, on failure, shows the status string and the message. */
#define CHECK_OK(comm, call)                                                                                  \
  do {                                                                                                        \
    lowbit_status_t st_ = (call);                                                                             \
    if (st_ != LOWBIT_SUCCESS)                                                                                \
      harness_fail(__FILE__, __LINE__, "%s returned %s: %s", #call, lowbit_status_string(st_),                \
                   lowbit_comm_last_error(comm));                                                             \
  } while (0)

/* Checks that `call` returns `expected` and that the thread-local message
 * (and the handle's, when comm is not NULL) contains `needle`. */
#define CHECK_STATUS(comm, call, expected, needle) \
  check_status_impl(__FILE__, __LINE__, #call, (call), (expected), (comm), (needle))
void check_status_impl(const char* file, int line, const char* what, lowbit_status_t got, lowbit_status_t expected,
                       lowbit_comm_t comm, const char* needle);

/* --- random numbers (splitmix64) */
uint64_t harness_seed(void); /* shared by all ranks */
uint64_t mix64(uint64_t x);
/* Standard normal values, deterministic in (seed, stream, index). */
void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, double sigma);
double uniform01(uint64_t* state);

/* A host tensor descriptor. */
lowbit_tensor_t host_tensor(float* data, int64_t n);

/* Creates a communicator over MPI_COMM_WORLD. */
lowbit_comm_t make_world_comm(void);

/* --- layout of the simulation */
typedef struct {
  int world;
  int64_t n, padded, chunk;
} sim_layout_t;
sim_layout_t sim_layout(int64_t n, int world);
int64_t sim_real_in_chunk(const sim_layout_t* l, int r);

/* One call of the algorithm over all ranks. in[j] (n floats) is rank j's
 * tensor; werr[j] (n doubles) and serr[r] (real_in_chunk(r) doubles) are
 * updated in place; out (n doubles) gets the result; amb (n bytes, may be
 * NULL) marks ambiguous elements; server_scales / worker_scales (world
 * doubles each, may be NULL) get S_r and s_j. */
void sim_step(const sim_layout_t* l, float* const* in, double* const* werr, double* const* serr, double* out,
              unsigned char* amb, double* server_scales, double* worker_scales);

/* Gathers every rank's errors from `comm` (read through
 * lowbit_comm_read_errors) as doubles: werr[j] (n), serr[r] (real in chunk r).
 * Arrays must be allocated by the caller with those sizes. */
void gather_errors(lowbit_comm_t comm, const sim_layout_t* l, double* const* werr, double* const* serr);

/* FNV-1a of bytes, to compare buffers across ranks. */
uint64_t fnv64(const void* p, size_t n);
/* The checksum of a communicator error blob (version 2: FNV-1a-64 of the
 * whole blob, its bytes 48..55 read as 0), and rewriting it in place after a
 * test edited the blob. */
uint64_t error_blob_checksum(const unsigned char* blob, int64_t size);
void error_blob_fix_checksum(unsigned char* blob, int64_t size);
/* Checks that `value` is the same on every rank of MPI_COMM_WORLD. */
void check_same_on_all_ranks(uint64_t value, const char* what);

void* xmalloc(size_t bytes);

#endif
