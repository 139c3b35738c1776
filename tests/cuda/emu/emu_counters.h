/* Counters of the CUDA emulation (tests/cuda/emu/emu.cpp), for tests that
 * assert what a call does to the host: e.g. that an optimizer step on CUDA
 * issues no host synchronisation and no allocation. Only in programs linked
 * with the emulation (CMake target lowbit_emulated). C and C++. */
#ifndef LOWBIT_EMU_COUNTERS_H
#define LOWBIT_EMU_COUNTERS_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Calls that make the host wait for the device: cudaStreamSynchronize,
 * cudaDeviceSynchronize, cudaEventSynchronize, and the blocking cudaMemcpy
 * and cudaMemset. */
int64_t lowbit_emu_host_syncs(void);
/* Allocations: cudaMalloc, cudaMallocHost, cudaHostAlloc. */
int64_t lowbit_emu_allocations(void);
/* Releases: cudaFree, cudaFreeHost (on a GPU these also wait for the device). */
int64_t lowbit_emu_frees(void);
/* cudaMemcpyAsync calls with a source or destination in pageable (not
 * page-locked, not device) host memory: on a GPU they may wait for the
 * stream, and they cannot be captured in a graph. */
int64_t lowbit_emu_pageable_copies(void);
/* Sets every counter to 0. */
void lowbit_emu_reset_counters(void);

/* LOWBIT_EMU_TRACE=1 in the environment prints each counted call on stderr. */

#ifdef __cplusplus
}
#endif
#endif
