/* Buffers on the device a C suite runs against, for the suites built once
 * for the CPU engine and again with LOWBIT_TEST_CUDA (test_functional_step.c,
 * test_step_params.c): DEVICE, zero-filled allocations (NULL for 0 bytes),
 * copies both ways, a device-wide wait, and the skip (exit 77) of a real-GPU
 * build on a machine without a usable GPU (LOWBIT_TEST_CUDA without
 * LOWBIT_TEST_EMULATED), and CHECK_OPT for calls that must succeed. Include
 * after cmocka.h. */
#ifndef LOWBIT_TEST_DEVICE_H
#define LOWBIT_TEST_DEVICE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowbit.h"

#ifdef LOWBIT_TEST_CUDA
#include <cuda_runtime.h>
#define DEVICE LOWBIT_DEVICE_CUDA
static void* dev_alloc(size_t bytes) {
  void* p = NULL;
  if (bytes == 0) return NULL;
  assert_int_equal(cudaMalloc(&p, bytes), cudaSuccess);
  assert_int_equal(cudaMemset(p, 0, bytes), cudaSuccess);
  return p;
}
static void dev_free(void* p) { cudaFree(p); }
static void to_dev(void* dst, const void* src, size_t bytes) {
  if (bytes) assert_int_equal(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
}
static void to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) assert_int_equal(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}
static void sync_all(void) { assert_int_equal(cudaDeviceSynchronize(), cudaSuccess); }
#else
#define DEVICE LOWBIT_DEVICE_CPU
static void* dev_alloc(size_t bytes) { return bytes ? calloc(1, bytes) : NULL; }
static void dev_free(void* p) { free(p); }
static void to_dev(void* dst, const void* src, size_t bytes) { if (bytes) memcpy(dst, src, bytes); }
static void to_host(void* dst, const void* src, size_t bytes) { if (bytes) memcpy(dst, src, bytes); }
static void sync_all(void) {}
#endif

/* 1 when this build runs on a real GPU that is not there (the suite then
 * exits 77, CTest's skip). */
static int skip_without_gpu(void) {
#if defined(LOWBIT_TEST_CUDA) && !defined(LOWBIT_TEST_EMULATED)
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0 || !lowbit_has_cuda()) {
    printf("no usable CUDA device or a library without CUDA: skipping\n");
    return 1;
  }
#endif
  return 0;
}

/* A call that must succeed; on failure, the call, its status and opt's last error. */
#define CHECK_OPT(opt, call)                                                                        \
  do {                                                                                              \
    lowbit_status_t st_ = (call);                                                                   \
    if (st_ != LOWBIT_SUCCESS)                                                                      \
      fail_msg("%s: %s: %s", #call, lowbit_status_string(st_), lowbit_optimizer_last_error(opt)); \
  } while (0)

#endif
