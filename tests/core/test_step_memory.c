/* Peak extra heap during step() is O(threads x tile), not O(params): malloc,
 * calloc, realloc and free are interposed (glibc) and the live bytes counted. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowbit.h"

extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void __libc_free(void*);

static long long live, peak;

void* malloc(size_t n) {
  void* p = __libc_malloc(n);
  if (p) live += (long long)malloc_usable_size(p), peak = live > peak ? live : peak;
  return p;
}
void* calloc(size_t a, size_t b) {
  void* p = __libc_calloc(a, b);
  if (p) live += (long long)malloc_usable_size(p), peak = live > peak ? live : peak;
  return p;
}
void* realloc(void* q, size_t n) {
  if (q) live -= (long long)malloc_usable_size(q);
  void* p = __libc_realloc(q, n);
  if (p) live += (long long)malloc_usable_size(p), peak = live > peak ? live : peak;
  return p;
}
void free(void* p) {
  if (p) live -= (long long)malloc_usable_size(p);
  __libc_free(p);
}

#define CHECK(c)                                                           \
  do {                                                                     \
    if (!(c)) {                                                            \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
      return 1;                                                            \
    }                                                                      \
  } while (0)

int main(void) {
  const int64_t n = 4 << 20; /* 4M params in 8 tensors */
  const lowbit_state_format_t fmts[] = {LOWBIT_STATE_FP32, LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT, LOWBIT_STATE_FP8};
  for (int f = 0; f < 4; ++f) {
    lowbit_optimizer_config_t c;
    lowbit_hparams_t h;
    lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_ADAMW);
    lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW);
    c.state_format = fmts[f];
    c.num_threads = 2;
    lowbit_optimizer_t opt;
    CHECK(lowbit_optimizer_create(&opt, &c, &h) == LOWBIT_SUCCESS);
    uint16_t* p = calloc((size_t)n, 2);
    uint16_t* g = calloc((size_t)n, 2);
    for (int64_t i = 0; i < n; ++i) p[i] = 0x3F80, g[i] = (uint16_t)(0x3C00 + (i & 0xFF));
    long long before_register = live;
    for (int t = 0; t < 8; ++t) {
      lowbit_param_config_t pc;
      lowbit_param_config_init(&pc);
      pc.param = (lowbit_tensor_t){p + t * (n / 8), n / 8, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DEVICE_CPU, 0};
      pc.grad = (lowbit_tensor_t){g + t * (n / 8), n / 8, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DEVICE_CPU, 0};
      int64_t id;
      CHECK(lowbit_optimizer_add_param(opt, &pc, &id) == LOWBIT_SUCCESS);
    }
    int64_t state_bytes;
    CHECK(lowbit_optimizer_state_bytes(opt, -1, &state_bytes) == LOWBIT_SUCCESS);
    CHECK(live - before_register >= state_bytes); /* the interposition sees the library's allocations */
    CHECK(lowbit_optimizer_step(opt, NULL) == LOWBIT_SUCCESS); /* warm-up: thread pool start-up */
    long long base = live;
    peak = live;
    for (int s = 0; s < 3; ++s) CHECK(lowbit_optimizer_step(opt, NULL) == LOWBIT_SUCCESS);
    long long extra = peak - base, leaked = live - base;
    printf("format %d: peak extra heap during 3 steps over %lld params: %lld bytes\n", (int)fmts[f], (long long)n, extra);
    /* A full fp32 copy of one moment would be 16 MiB; allow 64 KiB per thread. */
    CHECK(extra <= 2 * 65536);
    CHECK(leaked == 0);
    lowbit_optimizer_destroy(opt);
    free(p), free(g);
  }
  return 0;
}
