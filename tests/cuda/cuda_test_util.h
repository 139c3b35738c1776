/* Helpers of the GPU suites (define CT_ENGINE_ONLY in tests that do not link
 * liblowbit): device detection (exit 77 = CTest SKIP when no
 * GPU), a seeded generator for raw tensor bits, and a reader of the
 * compressed checkpoint (the layout written at the top of core/checkpoint.cpp)
 * that exposes the stored codes, scales, error-correction bytes and step
 * counts of every parameter. */
#ifndef LOWBIT_CUDA_TEST_UTIL_H
#define LOWBIT_CUDA_TEST_UTIL_H

#include <cuda_runtime.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif
#include <cmocka.h>
#ifdef __cplusplus
}
#endif

#include "lowbit.h"
#include "../common/test_seed.h"

#define CT_SKIP 77

/* 1 if a CUDA device of compute capability >= 8.0 can be used; else prints why. */
static inline int ct_gpu_available(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    printf("no usable CUDA device (%s): skipping\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 0;
  }
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess || major < 8) {
    printf("CUDA device 0 is older than compute capability 8.0: skipping\n");
    return 0;
  }
#ifndef CT_ENGINE_ONLY
  if (!lowbit_has_cuda()) {
    printf("liblowbit was built without CUDA: skipping\n");
    return 0;
  }
#endif
  return 1;
}

#define CT_CUDA(call)                                                                                   \
  do {                                                                                                  \
    cudaError_t ct_e_ = (call);                                                                         \
    if (ct_e_ != cudaSuccess) fail_msg("%s failed: %s (%s:%d)", #call, cudaGetErrorString(ct_e_), __FILE__, __LINE__); \
  } while (0)

/* ---- random bits ---------------------------------------------------------- */

static inline uint64_t ct_seed(void) { return lowbit_test_seed("CUDA suite"); }

static inline uint64_t ct_next(uint64_t* s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline size_t ct_dtype_bytes(lowbit_dtype_t d) { return d == LOWBIT_DTYPE_FLOAT32 ? 4 : 2; }

/* Random values of magnitude about 2^emin .. 2^emax (binary exponents), random
 * sign, written directly as bits of the dtype (so every value is exactly
 * representable and both engines start from the same bits). */
static inline void ct_fill(void* out, lowbit_dtype_t d, int64_t n, int emin, int emax, uint64_t* rng) {
  for (int64_t i = 0; i < n; ++i) {
    uint64_t r = ct_next(rng);
    int e = emin + (int)(r % (uint64_t)(emax - emin + 1));
    uint32_t sign = (uint32_t)(r >> 63);
    uint32_t mant = (uint32_t)(r >> 8);
    if (d == LOWBIT_DTYPE_FLOAT32) {
      uint32_t u = (sign << 31) | ((uint32_t)(e + 127) << 23) | (mant & 0x7FFFFFu);
      memcpy((char*)out + 4 * i, &u, 4);
    } else if (d == LOWBIT_DTYPE_BFLOAT16) {
      uint16_t h = (uint16_t)((sign << 15) | ((uint32_t)(e + 127) << 7) | (mant & 0x7Fu));
      memcpy((char*)out + 2 * i, &h, 2);
    } else {
      int ef = e + 15;
      if (ef < 1) ef = 1;
      if (ef > 30) ef = 30;
      uint16_t h = (uint16_t)((sign << 15) | ((uint32_t)ef << 10) | (mant & 0x3FFu));
      memcpy((char*)out + 2 * i, &h, 2);
    }
  }
}

static inline void ct_set_nan(void* data, lowbit_dtype_t d, int64_t i) {
  if (d == LOWBIT_DTYPE_FLOAT32) {
    uint32_t u = 0x7FC00000u;
    memcpy((char*)data + 4 * i, &u, 4);
  } else {
    uint16_t h = d == LOWBIT_DTYPE_BFLOAT16 ? 0x7FC0u : 0x7E00u;
    memcpy((char*)data + 2 * i, &h, 2);
  }
}

/* Position of a sign-magnitude value of `bits` bits on the number line, so
 * that neighbouring representable values differ by 1. */
static inline int64_t ct_ordered(uint32_t v, int bits) {
  uint32_t sign = 1u << (bits - 1);
  int64_t mag = (int64_t)(v & (sign - 1u));
  return (v & sign) ? -mag : mag;
}

/* ---- compressed checkpoint ----------------------------------------------------- */

typedef struct {
  uint32_t format, norm, block; /* norm: 0 blocks, 1 rank-1, 2 factored (version 2) */
  const uint8_t* data;
  uint64_t data_bytes;
  const uint8_t* scales;
  uint64_t scale_bytes;
} ct_moment_t;

typedef struct {
  int64_t numel, step;
  uint32_t dtype, rounding, num_moments;
  int32_t group;
  ct_moment_t moment[2];
  const uint8_t* ecc;
  uint64_t ecc_bytes;
} ct_param_t;

typedef struct {
  uint8_t* bytes;
  int64_t size;
  uint64_t num_params;
  ct_param_t* params;
} ct_ckpt_t;

static inline int ct_take(const uint8_t** p, const uint8_t* end, void* out, size_t n) {
  if ((size_t)(end - *p) < n) return 0;
  if (out) memcpy(out, *p, n);
  *p += n;
  return 1;
}

static inline int ct_ckpt_parse(ct_ckpt_t* c, int64_t got);

#ifndef CT_ENGINE_ONLY
/* Saves `opt` compressed and indexes it; returns 0 on any inconsistency. */
static inline int ct_ckpt_read(lowbit_optimizer_t opt, ct_ckpt_t* c) {
  memset(c, 0, sizeof *c);
  if (lowbit_optimizer_save(opt, LOWBIT_CHECKPOINT_COMPRESSED, NULL, 0, &c->size, NULL) != LOWBIT_SUCCESS) return 0;
  c->bytes = (uint8_t*)malloc((size_t)c->size);
  int64_t got = 0;
  if (!c->bytes || lowbit_optimizer_save(opt, LOWBIT_CHECKPOINT_COMPRESSED, c->bytes, c->size, &got, NULL) != LOWBIT_SUCCESS)
    return 0;
  return ct_ckpt_parse(c, got);
}
#endif

/* Indexes c->bytes[0, got). */
static inline int ct_ckpt_parse(ct_ckpt_t* c, int64_t got) {
  const uint8_t* p = c->bytes;
  const uint8_t* end = c->bytes + got;
  uint32_t version = 0, mode = 0, algorithm = 0, num_groups = 0;
  uint64_t total, seed;
  int64_t freeze;
  if (!ct_take(&p, end, NULL, 8) || memcmp(c->bytes, "LOWBITCK", 8) != 0) return 0;
  if (!ct_take(&p, end, &version, 4) || (version != 1 && version != 2 && version != 4)) {
    printf("checkpoint version %u: this reader knows versions 1, 2 and 4\n", version);
    return 0;
  }
  if (!ct_take(&p, end, &mode, 4) || !ct_take(&p, end, &algorithm, 4) || !ct_take(&p, end, &num_groups, 4) ||
      !ct_take(&p, end, &total, 8) || !ct_take(&p, end, &c->num_params, 8) || !ct_take(&p, end, &seed, 8) ||
      !ct_take(&p, end, &freeze, 8))
    return 0;
  /* a group: 36 bytes of hparams, 28 more in a Muon checkpoint, then (version 4) u32 n and n words of the
   * 0.8 fields (core/checkpoint.cpp) */
  const size_t group_bytes = algorithm == (uint32_t)LOWBIT_ALGORITHM_MUON ? 36 + 28 : 36;
  for (uint32_t g = 0; g < num_groups; ++g) {
    if (!ct_take(&p, end, NULL, group_bytes)) return 0;
    uint32_t words = 0;
    if (version == 4 && (!ct_take(&p, end, &words, 4) || !ct_take(&p, end, NULL, (size_t)words * 4))) return 0;
  }
  c->params = (ct_param_t*)calloc((size_t)c->num_params + 1, sizeof(ct_param_t));
  for (uint64_t i = 0; i < c->num_params; ++i) {
    ct_param_t* q = &c->params[i];
    uint32_t ndim = 0;
    if (!ct_take(&p, end, &q->numel, 8) || (version >= 2 && (!ct_take(&p, end, &ndim, 4) || ndim > 8 ||
                                                             !ct_take(&p, end, NULL, (size_t)ndim * 8))))
      return 0;
    if (!ct_take(&p, end, &q->dtype, 4) || !ct_take(&p, end, &q->group, 4) ||
        !ct_take(&p, end, &q->step, 8) || !ct_take(&p, end, &q->rounding, 4) ||
        !ct_take(&p, end, &q->num_moments, 4) || q->num_moments > 2)
      return 0;
    for (uint32_t m = 0; m < q->num_moments; ++m) {
      ct_moment_t* mm = &q->moment[m];
      if (!ct_take(&p, end, &mm->format, 4) || (version >= 2 && !ct_take(&p, end, &mm->norm, 4)) ||
          !ct_take(&p, end, &mm->block, 4) ||
          !ct_take(&p, end, &mm->data_bytes, 8) || !ct_take(&p, end, &mm->scale_bytes, 8))
        return 0;
      mm->data = p;
      if (!ct_take(&p, end, NULL, (size_t)mm->data_bytes)) return 0;
      mm->scales = p;
      if (!ct_take(&p, end, NULL, (size_t)mm->scale_bytes)) return 0;
    }
    if (!ct_take(&p, end, &q->ecc_bytes, 8)) return 0;
    q->ecc = p;
    if (!ct_take(&p, end, NULL, (size_t)q->ecc_bytes) || !ct_take(&p, end, NULL, 4)) return 0;
  }
  return ct_take(&p, end, NULL, 4) && p == end;
}

static inline void ct_ckpt_free(ct_ckpt_t* c) {
  free(c->bytes);
  free(c->params);
  memset(c, 0, sizeof *c);
}

/* ---- comparisons ------------------------------------------------------------ */

/* What was compared and how much of it was not bit-identical. */
typedef struct {
  int64_t cases, elements, param_diff, codes, code_diff, scales, scale_diff;
  double max_param_diff;
} ct_stats_t;

static inline double ct_half_value(uint16_t h, lowbit_dtype_t d) {
  if (d == LOWBIT_DTYPE_BFLOAT16) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v = e == 0 ? ldexp(m, -24) : (e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25));
  return (h & 0x8000) ? -v : v;
}

static inline double ct_elem_value(const void* data, lowbit_dtype_t d, int64_t i) {
  if (d == LOWBIT_DTYPE_FLOAT32) {
    float f;
    memcpy(&f, (const char*)data + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, (const char*)data + 2 * i, 2);
  return ct_half_value(h, d);
}

/* Distance in codes between element i of two stored moments of one format. */
static inline int64_t ct_code_distance(uint32_t format, const uint8_t* a, const uint8_t* b, int64_t i) {
  switch (format) {
    case LOWBIT_STATE_FP32: {
      uint32_t x, y;
      memcpy(&x, a + 4 * i, 4);
      memcpy(&y, b + 4 * i, 4);
      return llabs(ct_ordered(x, 32) - ct_ordered(y, 32));
    }
    case LOWBIT_STATE_BF16: {
      uint16_t x, y;
      memcpy(&x, a + 2 * i, 2);
      memcpy(&y, b + 2 * i, 2);
      return llabs(ct_ordered(x, 16) - ct_ordered(y, 16));
    }
    case LOWBIT_STATE_8BIT: return llabs((int64_t)a[i] - (int64_t)b[i]);
    case LOWBIT_STATE_4BIT:
    case LOWBIT_STATE_4BIT_SR:
    case LOWBIT_STATE_4BIT_DYN: {
      int sh = 4 * (int)(i & 1);
      return llabs((int64_t)((a[i / 2] >> sh) & 0xF) - (int64_t)((b[i / 2] >> sh) & 0xF));
    }
    case LOWBIT_STATE_FP8: return llabs(ct_ordered(a[i], 8) - ct_ordered(b[i], 8));
    default: return 1 << 30;
  }
}

/* One moment of `numel` elements, CPU (a) against GPU (b): at most 0.1% of
 * codes differ, each by at most one code (fp32 moments: 4 ulps); every scale
 * within 1 ulp. */
static inline void ct_compare_moment(const char* label, int64_t param, int moment, uint32_t format, int64_t numel,
                              const uint8_t* a, const uint8_t* b, const uint8_t* sa, const uint8_t* sb,
                              int64_t num_scales, ct_stats_t* st) {
  int64_t diff = 0;
  const int64_t limit = format == LOWBIT_STATE_FP32 ? 4 : 1;
  for (int64_t k = 0; k < numel; ++k) {
    int64_t dist = ct_code_distance(format, a, b, k);
    if (dist > limit)
      fail_msg("%s: param %lld moment %d element %lld: codes %lld apart (limit %lld)", label, (long long)param, moment,
               (long long)k, (long long)dist, (long long)limit);
    diff += dist != 0;
  }
  if (diff * 1000 > numel && !(numel < 1000 && diff <= 1))
    fail_msg("%s: param %lld moment %d: %lld of %lld codes differ (limit 0.1%%)", label, (long long)param, moment,
             (long long)diff, (long long)numel);
  st->codes += numel;
  st->code_diff += diff;
  for (int64_t k = 0; k < num_scales; ++k) {
    uint32_t s1, s2;
    memcpy(&s1, sa + 4 * k, 4);
    memcpy(&s2, sb + 4 * k, 4);
    int64_t dist = llabs(ct_ordered(s1, 32) - ct_ordered(s2, 32));
    if (dist > 1) {
      float f1, f2;
      memcpy(&f1, &s1, 4);
      memcpy(&f2, &s2, 4);
      fail_msg("%s: param %lld moment %d block %lld: scale %a vs %a (%lld ulps)", label, (long long)param, moment,
               (long long)k, (double)f1, (double)f2, (long long)dist);
    }
    st->scales++;
    st->scale_diff += dist != 0;
  }
}

/* All moments of two parsed checkpoints (same registered params). */
static inline void ct_compare_checkpoints(const char* label, const ct_ckpt_t* c, const ct_ckpt_t* g, int same_steps,
                                   ct_stats_t* st) {
  assert_int_equal(c->num_params, g->num_params);
  for (uint64_t i = 0; i < c->num_params; ++i) {
    const ct_param_t* a = &c->params[i];
    const ct_param_t* b = &g->params[i];
    if ((same_steps && a->step != b->step) || a->num_moments != b->num_moments || a->rounding != b->rounding ||
        a->ecc_bytes != b->ecc_bytes || a->numel != b->numel)
      fail_msg("%s: param %llu header differs (step %lld vs %lld, moments %u vs %u)", label, (unsigned long long)i,
               (long long)a->step, (long long)b->step, a->num_moments, b->num_moments);
    for (uint32_t m = 0; m < a->num_moments; ++m) {
      const ct_moment_t* x = &a->moment[m];
      const ct_moment_t* y = &b->moment[m];
      if (x->format != y->format || x->data_bytes != y->data_bytes || x->scale_bytes != y->scale_bytes)
        fail_msg("%s: param %llu moment %u layout differs", label, (unsigned long long)i, m);
      ct_compare_moment(label, (int64_t)i, (int)m, x->format, a->numel, x->data, y->data, x->scales, y->scales,
                        (int64_t)(x->scale_bytes / 4), st);
    }
  }
}

/* Param values (with their error-correction bytes, may be NULL), CPU (a)
 * against GPU (b): at most 0.1% not bit-identical (1 element for tensors under
 * 1000), each within tol + 2 ulps of its dtype. */
static inline void ct_compare_params(const char* label, int64_t param, lowbit_dtype_t d, int64_t n, const void* a,
                              const void* b, const uint8_t* ecc_a, const uint8_t* ecc_b, double tol, ct_stats_t* st) {
  const size_t eb = ct_dtype_bytes(d);
  int64_t diff = 0;
  for (int64_t k = 0; k < n; ++k) {
    if (memcmp((const char*)a + k * eb, (const char*)b + k * eb, eb) == 0 && (!ecc_a || ecc_a[k] == ecc_b[k]))
      continue;
    ++diff;
    double x = ct_elem_value(a, d, k), y = ct_elem_value(b, d, k);
    double ulp = ldexp(fabs(x), d == LOWBIT_DTYPE_FLOAT32 ? -23 : (d == LOWBIT_DTYPE_BFLOAT16 ? -7 : -10));
    double dv = fabs(x - y);
    if (!(dv <= tol + 2 * ulp))
      fail_msg("%s: param %lld element %lld: CPU %.9g GPU %.9g (limit %.3g)", label, (long long)param, (long long)k, x,
               y, tol + 2 * ulp);
    if (dv > st->max_param_diff) st->max_param_diff = dv;
  }
  if (diff * 1000 > n && !(n < 1000 && diff <= 1))
    fail_msg("%s: param %lld: %lld of %lld elements differ (limit 0.1%%)", label, (long long)param, (long long)diff,
             (long long)n);
  st->elements += n;
  st->param_diff += diff;
}

static inline void ct_print_stats(const char* name, const ct_stats_t* st) {
  printf("%s: %lld cases; params not bit-identical %lld of %lld (max |diff| %.3g); codes differing %lld of %lld; "
         "scales differing %lld of %lld\n",
         name, (long long)st->cases, (long long)st->param_diff, (long long)st->elements, st->max_param_diff,
         (long long)st->code_diff, (long long)st->codes, (long long)st->scale_diff, (long long)st->scales);
}

#endif
