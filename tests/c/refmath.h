/* Independent float64 reference of lowbit's math, for the cmocka suites.
 *
 * Nothing here comes from the library: the rounding helpers work on doubles
 * (frexp / ldexp / nearbyint), the quantization maps are rebuilt from the
 * formula of DESIGN.md and checked against the golden float32 patterns, and
 * the optimizer updates are written from the PyTorch definitions in double.
 *
 * Error model used by the tolerances of every suite: the library computes each
 * element in fp32, so each of its results differs from the float64 value by a
 * few roundings of relative size u = 2^-24 of the magnitudes of the terms that
 * were added (not of the result, which may cancel). ref_update() therefore
 * returns, next to each new value, the sum of the absolute values of the terms
 * that produced it ("scale"); a library value is accepted when it is within
 * REF_K * u * scale of the float64 value. REF_K = 16 covers the at most ~8
 * roundings of the longest chain (decay, moment, sqrt, scale, +eps, divide,
 * multiply, subtract) with a factor 2 of margin; it is a bound, not a fit.
 *
 * Gradual underflow: a product, quotient or square root whose result falls
 * below the smallest normal float FLT_MIN = 2^-126 is a subnormal, rounded to
 * a multiple of 2^-149: its error is up to u * FLT_MIN = 2^-150 absolute, not
 * u relative (IEEE 754 with subnormals; the library runs without flush-to-
 * zero). So each such operation adds REF_TINY (= FLT_MIN) to the scale of its
 * result, and the scale carries it on like any other term: e.g. the product
 * step_size * m of a subnormal m is divided by the Adam denominator, which
 * can turn its 2^-150 into a visible error of a normal-sized result (issue
 * 17: adam/4bit/bf16-params, step 90, a bf16 weight near 2^-124; the library
 * was the exact fp32 evaluation, the reference's bound missed the term).
 * Sums and differences of subnormals are exact and add nothing.
 */
#ifndef LOWBIT_TEST_REFMATH_H
#define LOWBIT_TEST_REFMATH_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lowbit.h"
#include "qmaps_golden.h"
#include "../common/test_seed.h"

#define REF_U (0x1p-24)
#define REF_K 16.0
#define REF_TINY (0x1p-126) /* FLT_MIN: REF_U * REF_TINY bounds the error of a subnormal result */

/* ------------------------------------------------------------------ rng */

typedef struct {
  uint64_t s;
} rng_t;

static inline uint64_t rng_next(rng_t* r) {
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static inline double rng_uniform(rng_t* r) { return (double)(rng_next(r) >> 11) * 0x1p-53; }
static inline double rng_range(rng_t* r, double lo, double hi) { return lo + (hi - lo) * rng_uniform(r); }
static inline int64_t rng_int(rng_t* r, int64_t lo, int64_t hi) { /* inclusive */
  return lo + (int64_t)(rng_next(r) % (uint64_t)(hi - lo + 1));
}
/* Marsaglia's polar method; uses one of the pair (keeps the stream simple). */
static inline double rng_normal(rng_t* r) {
  for (;;) {
    double a = 2.0 * rng_uniform(r) - 1.0, b = 2.0 * rng_uniform(r) - 1.0, q = a * a + b * b;
    if (q > 0.0 && q < 1.0) return a * sqrt(-2.0 * log(q) / q);
  }
}

/* The suite seed (tests/common/test_seed.h: fixed unless LOWBIT_TEST_SEED
 * says otherwise), printed so any failure can be replayed exactly. Each test
 * derives its own stream from it and its name, so a single test replays
 * whatever ran before it. */
static uint64_t g_test_seed;
static inline void test_seed_init(const char* suite) {
  g_test_seed = lowbit_test_seed(suite);
  fflush(stdout);
}
static inline rng_t test_rng(const char* name) {
  uint64_t h = 1469598103934665603ull;
  for (const char* c = name; *c; ++c) h = (h ^ (uint8_t)*c) * 1099511628211ull;
  rng_t r = {g_test_seed ^ h};
  rng_next(&r);
  return r;
}

/* ------------------------------------------------------------------ rounding
 * Round a double to a binary format with p significand bits (implicit bit
 * included), minimum normal exponent emin and largest finite value maxf;
 * round to nearest, ties to even (the default rounding mode of nearbyint);
 * values that round past maxf become infinite. */
static inline double round_to_format(double x, int p, int emin, double maxf) {
  if (x == 0.0 || !isfinite(x)) return x;
  double ax = fabs(x);
  int e;
  frexp(ax, &e); /* ax in [2^(e-1), 2^e) */
  int lead = e - 1 < emin ? emin : e - 1;
  int q = lead - (p - 1); /* exponent of one ulp */
  double r = ldexp(nearbyint(ldexp(ax, -q)), q);
  if (r > maxf) r = INFINITY;
  return copysign(r, x);
}
/* The same rounding on the bits of the double, for speed where the result is
 * a normal number of the format: add half an ulp minus one (plus the kept
 * lsb, for ties to even) at bit 52 - (p - 1) and clear the dropped bits; a
 * carry into the exponent is the correct rounding up to the next binade.
 * Everything else (zero, subnormal results, overflow, NaN) takes the generic
 * path. */
static inline double round_bits_fast(double x, int p, double min_normal, double maxf) {
  double ax = fabs(x);
  if (!(ax >= min_normal) || !(ax <= maxf)) return round_to_format(x, p, min_normal == 0x1p-14 ? -14 : -126, maxf);
  uint64_t u;
  memcpy(&u, &x, 8);
  int drop = 53 - p;
  uint64_t half = (1ull << (drop - 1)) - 1 + ((u >> drop) & 1);
  u = (u + half) & ~((1ull << drop) - 1);
  double r;
  memcpy(&r, &u, 8);
  if (fabs(r) > maxf) r = copysign(INFINITY, x);
  return r;
}
#define BF16_MAXF ((2.0 - 0x1p-7) * 0x1p127)
#define FP32_MAXF ((2.0 - 0x1p-23) * 0x1p127)
static inline double round_bf16(double x) { return round_bits_fast(x, 8, 0x1p-126, BF16_MAXF); }
static inline double round_fp16(double x) { return round_bits_fast(x, 11, 0x1p-14, 65504.0); }
static inline double round_f32(double x) { return (double)(float)x; /* C conversion: IEEE round to nearest even */ }

/* One ulp of the format at the magnitude of x (x itself representable or not). */
static inline double ulp_of_format(double x, int p, int emin) {
  double ax = fabs(x);
  int e = emin + 1;
  if (ax > 0 && isfinite(ax)) frexp(ax, &e);
  int lead = e - 1 < emin ? emin : e - 1;
  return ldexp(1.0, lead - (p - 1));
}

static inline uint16_t bf16_bits(double representable) {
  float f = (float)representable; /* exact: a bf16 value is a float */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}
static inline double bf16_value(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t fp16_bits(double representable) {
  uint16_t s = signbit(representable) ? 0x8000u : 0u;
  double a = fabs(representable);
  if (isnan(a)) return 0x7E00u;
  if (isinf(a)) return (uint16_t)(s | 0x7C00u);
  if (a == 0.0) return s;
  if (a < 0x1p-14) return (uint16_t)(s | (uint16_t)(a * 0x1p24));
  int e;
  frexp(a, &e);
  int E = e - 1;
  uint16_t mant = (uint16_t)((ldexp(a, -E) - 1.0) * 1024.0);
  return (uint16_t)(s | (uint16_t)((E + 15) << 10) | mant);
}
static inline double fp16_value(uint16_t h) {
  double s = (h & 0x8000u) ? -1.0 : 1.0;
  int exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  if (exp == 0) return s * ldexp(mant, -24);
  if (exp == 31) return mant ? NAN : s * INFINITY;
  return s * ldexp(1024 + mant, exp - 25);
}

/* ------------------------------------------------------------------ tensors */

static inline size_t dtype_size(lowbit_dtype_t dt) { return dt == LOWBIT_DTYPE_FLOAT32 ? 4 : 2; }
static inline const char* dtype_name(lowbit_dtype_t dt) {
  return dt == LOWBIT_DTYPE_FLOAT32 ? "fp32" : dt == LOWBIT_DTYPE_BFLOAT16 ? "bf16" : "fp16";
}
static inline double dtype_round(lowbit_dtype_t dt, double x) {
  switch (dt) {
    case LOWBIT_DTYPE_BFLOAT16: return round_bf16(x);
    case LOWBIT_DTYPE_FLOAT16: return round_fp16(x);
    default: return round_f32(x);
  }
}
static inline double dtype_ulp(lowbit_dtype_t dt, double x) {
  switch (dt) {
    case LOWBIT_DTYPE_BFLOAT16: return ulp_of_format(x, 8, -126);
    case LOWBIT_DTYPE_FLOAT16: return ulp_of_format(x, 11, -14);
    default: return ulp_of_format(x, 24, -126);
  }
}
static inline double tensor_get(const void* data, lowbit_dtype_t dt, int64_t i) {
  switch (dt) {
    case LOWBIT_DTYPE_BFLOAT16: return bf16_value(((const uint16_t*)data)[i]);
    case LOWBIT_DTYPE_FLOAT16: return fp16_value(((const uint16_t*)data)[i]);
    default: return ((const float*)data)[i];
  }
}
/* Stores x rounded to nearest even in the tensor's dtype. */
static inline void tensor_set(void* data, lowbit_dtype_t dt, int64_t i, double x) {
  double r = dtype_round(dt, x);
  switch (dt) {
    case LOWBIT_DTYPE_BFLOAT16: ((uint16_t*)data)[i] = bf16_bits(r); break;
    case LOWBIT_DTYPE_FLOAT16: ((uint16_t*)data)[i] = fp16_bits(r); break;
    default: ((float*)data)[i] = (float)r; break;
  }
}
static inline lowbit_tensor_t make_tensor(void* data, int64_t numel, lowbit_dtype_t dt) {
  lowbit_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.numel = numel;
  t.dtype = dt;
  t.device = LOWBIT_DEVICE_CPU;
  t.device_index = 0;
  return t;
}

/* ------------------------------------------------------------------ quantization maps */

typedef struct {
  int n;
  double v[256];   /* float32 values, ascending */
  double mid[256]; /* midpoints between neighbours (exact in double), +inf padded */
} qmap_t;

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* DESIGN.md / qmaps.json: for exponent i in 0..E-1, the midpoints of
 * linspace(0.1, 1, n_i) scaled by 10^(i-E+1), their negatives for signed
 * maps, plus 0 and 1; n_i = 2^i + 1 (signed) or 2^(i+1) + 1 (unsigned). */
static inline void qmap_build_dynamic(qmap_t* m, int E, int is_signed) {
  int n = 0;
  for (int i = 0; i < E; ++i) {
    int ni = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
    double scale = pow(10.0, i - E + 1);
    for (int k = 0; k + 1 < ni; ++k) {
      double a = 0.1 + 0.9 * k / (ni - 1), b = 0.1 + 0.9 * (k + 1) / (ni - 1);
      double mid = (a + b) / 2 * scale;
      m->v[n++] = mid;
      if (is_signed) m->v[n++] = -mid;
    }
  }
  m->v[n++] = 0.0;
  m->v[n++] = 1.0;
  for (int i = 0; i < n; ++i) m->v[i] = (double)(float)m->v[i];
  qsort(m->v, (size_t)n, sizeof(double), cmp_double);
  m->n = n;
}
static inline void qmap_build_linear_nozero4(qmap_t* m) {
  m->n = 16;
  for (int k = 1; k <= 16; ++k) m->v[k - 1] = k / 16.0;
}
static inline void qmap_build_mids(qmap_t* m) {
  for (int k = 0; k < 256; ++k) m->mid[k] = k + 1 < m->n ? 0.5 * (m->v[k] + m->v[k + 1]) : INFINITY;
}

enum { QMAP_S8 = 0, QMAP_U8 = 1, QMAP_S4 = 2, QMAP_U4 = 3, QMAP_U4D = 4, NUM_QMAPS = 5 };
/* Defined once in harness.c; built by ref_tables_init(). */
extern qmap_t g_qmaps[NUM_QMAPS];
extern double g_e4m3[127];
extern double g_e4m3_mid[128];

/* The map of an 8BIT, 4BIT or 4BIT_DYN moment (second: of the unsigned kind). */
static inline const qmap_t* ref_map(lowbit_state_format_t f, int second) {
  if (f == LOWBIT_STATE_8BIT) return &g_qmaps[second ? QMAP_U8 : QMAP_S8];
  return &g_qmaps[second ? (f == LOWBIT_STATE_4BIT_DYN ? QMAP_U4D : QMAP_U4) : QMAP_S4];
}

/* Builds the maps; returns the number of values that differ from the
 * golden float32 patterns (must be 0). */
static inline int qmaps_init(void) {
  qmap_build_dynamic(&g_qmaps[QMAP_S8], 7, 1);
  qmap_build_dynamic(&g_qmaps[QMAP_U8], 7, 0);
  qmap_build_dynamic(&g_qmaps[QMAP_S4], 3, 1);
  qmap_build_linear_nozero4(&g_qmaps[QMAP_U4]);
  qmap_build_dynamic(&g_qmaps[QMAP_U4D], 3, 0);
  for (int k = 0; k < NUM_QMAPS; ++k) qmap_build_mids(&g_qmaps[k]);
  const uint32_t* gold[NUM_QMAPS] = {golden_signed_dynamic_8bit, golden_unsigned_dynamic_8bit,
                                     golden_signed_dynamic_4bit, golden_unsigned_linear_nozero_4bit,
                                     golden_unsigned_dynamic_4bit};
  int want_n[NUM_QMAPS] = {256, 256, 16, 16, 16}, bad = 0;
  for (int k = 0; k < NUM_QMAPS; ++k) {
    if (g_qmaps[k].n != want_n[k]) {
      printf("qmap %d: %d values, expected %d\n", k, g_qmaps[k].n, want_n[k]);
      ++bad;
      continue;
    }
    for (int i = 0; i < want_n[k]; ++i) {
      float f = (float)g_qmaps[k].v[i];
      uint32_t u;
      memcpy(&u, &f, 4);
      if (u != gold[k][i]) {
        printf("qmap %d value %d: built 0x%08x, golden 0x%08x\n", k, i, u, gold[k][i]);
        ++bad;
      }
    }
  }
  return bad;
}

/* e4m3 (finite, max 448): the 127 non-negative values, by code. */
static inline void e4m3_init(void) {
  for (int c = 0; c < 127; ++c) {
    int e = c >> 3, mant = c & 7;
    g_e4m3[c] = e == 0 ? ldexp(mant, -9) : ldexp(8 + mant, e - 10);
  }
  for (int c = 0; c < 128; ++c) g_e4m3_mid[c] = c < 126 ? 0.5 * (g_e4m3[c] + g_e4m3[c + 1]) : INFINITY;
}
/* Fast e4m3 code of |x| (RNE, saturating): midpoints strictly below, then an
 * exact tie moves to the even code. */
static inline int e4m3_code_fast(double x) {
  double a = fabs(x);
  int pos = 0;
  for (int step = 64; step >= 1; step >>= 1) pos += (a > g_e4m3_mid[pos + step - 1]) ? step : 0;
  if (pos < 126 && a == g_e4m3_mid[pos] && (pos & 1)) pos += 1;
  return pos;
}

/* Nearest value index of x in a sorted map; exact ties go to the lower value.
 * *dist: distance from x to the nearest decision boundary (midpoint). */
static inline int qmap_nearest(const qmap_t* m, double x, double* dist) {
  int lo = 0, hi = m->n; /* first index with v >= x */
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (m->v[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  int k;
  if (lo == 0)
    k = 0;
  else if (lo == m->n)
    k = m->n - 1;
  else {
    double midp = 0.5 * (m->v[lo - 1] + m->v[lo]); /* exact in double */
    k = x > midp ? lo : lo - 1;
  }
  double d = INFINITY;
  if (k > 0) d = fmin(d, fabs(x - 0.5 * (m->v[k - 1] + m->v[k])));
  if (k + 1 < m->n) d = fmin(d, fabs(x - 0.5 * (m->v[k] + m->v[k + 1])));
  if (dist) *dist = d;
  return k;
}

/* The same nearest index, fast: the number of midpoints strictly below x
 * (so a tie stays on the lower value), by a branchless binary search over
 * the +inf-padded midpoints. Checked against qmap_nearest by the quantizer
 * test. */
static inline int qmap_nearest_fast(const qmap_t* m, double x) {
  int pos = 0;
  for (int step = m->n >> 1; step >= 1; step >>= 1) pos += (x > m->mid[pos + step - 1]) ? step : 0;
  return pos;
}

/* e4m3 round to nearest even with saturation at 448: the code of |x| (0..126),
 * *dist: distance from |x| to the nearest decision boundary. */
static inline int e4m3_round_code(double x, double* dist) {
  double a = fabs(x);
  int lo = 0, hi = 127;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (g_e4m3[mid] < a)
      lo = mid + 1;
    else
      hi = mid;
  }
  int c;
  if (lo == 0)
    c = 0;
  else if (lo == 127)
    c = 126;
  else {
    double midp = 0.5 * (g_e4m3[lo - 1] + g_e4m3[lo]);
    c = a > midp ? lo : a < midp ? lo - 1 : ((lo & 1) ? lo - 1 : lo);
  }
  double d = INFINITY;
  if (c > 0) d = fmin(d, fabs(a - 0.5 * (g_e4m3[c - 1] + g_e4m3[c])));
  if (c < 126) d = fmin(d, fabs(a - 0.5 * (g_e4m3[c] + g_e4m3[c + 1])));
  if (c == 0) d = fmin(d, a + 0.5 * g_e4m3[1]); /* boundary with -2^-9 */
  if (dist) *dist = d;
  return c;
}

static inline int format_block(lowbit_state_format_t f) {
  return f == LOWBIT_STATE_4BIT || f == LOWBIT_STATE_4BIT_DYN ? 128
         : (f == LOWBIT_STATE_8BIT || f == LOWBIT_STATE_FP8) ? 256
                                                            : 1;
}
static inline int format_is_quantized(lowbit_state_format_t f) {
  return f == LOWBIT_STATE_8BIT || f == LOWBIT_STATE_4BIT || f == LOWBIT_STATE_FP8 || f == LOWBIT_STATE_4BIT_DYN;
}
static inline const char* format_name(lowbit_state_format_t f) {
  switch (f) {
    case LOWBIT_STATE_FP32: return "fp32";
    case LOWBIT_STATE_BF16: return "bf16";
    case LOWBIT_STATE_8BIT: return "8bit";
    case LOWBIT_STATE_4BIT: return "4bit";
    case LOWBIT_STATE_FP8: return "fp8";
    case LOWBIT_STATE_4BIT_DYN: return "4bit-dyn";
    default: return "default";
  }
}

/* The stored value of one element in a format, given its block's scale
 * (absmax as the library computes it: the largest |fp32 value| of the
 * block). `second`: 0 for a first moment (signed map), 1 for a second moment
 * (unsigned map of the 8/4-bit formats; in 8-bit and FP8 a positive value
 * takes the smallest positive code rather than 0). FP32 keeps the float64 value (the
 * reference stays in double), BF16 rounds to nearest even. */
static inline double ref_quant_value(lowbit_state_format_t fmt, int second, float absmax, double in) {
  switch (fmt) {
    case LOWBIT_STATE_FP32: return in;
    case LOWBIT_STATE_BF16: return round_bf16(in);
    case LOWBIT_STATE_8BIT:
    case LOWBIT_STATE_4BIT:
    case LOWBIT_STATE_4BIT_DYN: {
      if (absmax == 0.f) return 0.0;
      const qmap_t* map = ref_map(fmt, second);
      float x = (float)in / absmax;
      int k = qmap_nearest_fast(map, x);
      if (second && map->v[k] == 0.0 && x > 0.f) ++k; /* a positive second moment never stores as 0 */
      return (double)((float)map->v[k] * absmax);
    }
    case LOWBIT_STATE_FP8: {
      float scale = absmax / 448.f;
      if (!(scale > 0.f)) return 0.0;
      float x = (float)in / scale;
      int c = e4m3_code_fast(x);
      if (second && c == 0 && x > 0.f) c = 1; /* a positive second moment never stores as 0 */
      return (double)((float)(signbit(x) ? -g_e4m3[c] : g_e4m3[c]) * scale);
    }
    default: return NAN;
  }
}

/* Block scale of in[0..n) as the library computes it. */
static inline float ref_block_absmax(const double* in, int64_t n) {
  float a = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    float f = fabsf((float)in[i]);
    if (f > a) a = f;
  }
  return a;
}

/* Stores in[0..n) as the library would in `fmt`; out may alias in;
 * absmax_out (optional) gets each element's block scale. */
static inline void ref_store_moment(lowbit_state_format_t fmt, int second, const double* in, double* out,
                                    float* absmax_out, int64_t n) {
  int block = format_block(fmt);
  for (int64_t b = 0; b < n; b += block) {
    int64_t end = b + block < n ? b + block : n;
    float absmax = format_is_quantized(fmt) ? ref_block_absmax(in + b, end - b) : 0.f;
    for (int64_t i = b; i < end; ++i) {
      out[i] = ref_quant_value(fmt, second, absmax, in[i]);
      if (absmax_out) absmax_out[i] = absmax;
    }
  }
}

/* Bytes of state one moment of n elements takes in a format. */
static inline int64_t format_bytes(lowbit_state_format_t f, int64_t n) {
  switch (f) {
    case LOWBIT_STATE_FP32: return 4 * n;
    case LOWBIT_STATE_BF16: return 2 * n;
    case LOWBIT_STATE_8BIT:
    case LOWBIT_STATE_FP8: return n + 4 * ((n + 255) / 256);
    case LOWBIT_STATE_4BIT:
    case LOWBIT_STATE_4BIT_DYN: return (n + 1) / 2 + 4 * ((n + 127) / 128);
    default: return 0;
  }
}

/* ------------------------------------------------------------------ optimizer math */

typedef struct {
  lowbit_algorithm_t algo;
  double lr, b1, b2, eps, wd, mom, damp;
  int nesterov, bc;
  double alpha, lr_decay, init; /* RMSprop, Adagrad (0.8) */
  int centered;
} ref_hp_t;

/* The float hyper-parameters the library was given, exactly, as doubles. */
static inline ref_hp_t ref_hp_from(lowbit_algorithm_t algo, const lowbit_hparams_t* h) {
  ref_hp_t r;
  r.algo = algo;
  r.lr = h->lr;
  r.b1 = h->beta1;
  r.b2 = h->beta2;
  r.eps = h->eps;
  r.wd = h->weight_decay;
  r.mom = h->momentum;
  r.damp = h->dampening;
  r.nesterov = h->nesterov;
  r.bc = h->bias_correction;
  r.alpha = h->alpha;
  r.centered = h->centered;
  r.lr_decay = h->lr_decay;
  r.init = h->initial_accumulator_value;
  return r;
}

static inline int ref_num_moments(const ref_hp_t* h) {
  switch (h->algo) {
    case LOWBIT_ALGORITHM_ADAMW:
    case LOWBIT_ALGORITHM_ADAM: return 2;
    case LOWBIT_ALGORITHM_LION: return 1;
    case LOWBIT_ALGORITHM_SGD: return h->mom != 0.0 ? 1 : 0;
    case LOWBIT_ALGORITHM_RMSPROP: return h->mom != 0.0 || h->centered ? 2 : 1;
    case LOWBIT_ALGORITHM_ADAGRAD: return 1;
    default: return 0;
  }
}

/* Whether moment k is a second moment (an unsigned map, and the floor that
 * keeps a positive value off 0): lowbit.h's moment kinds. */
static inline int ref_moment_second(const ref_hp_t* h, int k) {
  switch (h->algo) {
    case LOWBIT_ALGORITHM_RMSPROP:
    case LOWBIT_ALGORITHM_ADAGRAD: return k == 0;
    default: return k == 1;
  }
}

/* Error scales of one element's update (see the header comment). */
typedef struct {
  double p, m, v;
  int sign_ambiguous; /* Lion: c so close to 0 that fp32 may see the other sign */
  double lion_base;   /* Lion: p * (1 - lr wd), to rebuild the other candidates */
} ref_scale_t;

/* Per-(param, step) constants: bias corrections of step t (the param's step
 * count including this step, 1 on its first step). */
typedef struct {
  int64_t t;
  double ss, ib;
} ref_step_t;
static inline ref_step_t ref_step_consts(const ref_hp_t* h, int64_t t) {
  ref_step_t c;
  c.t = t;
  c.ss = h->lr;
  c.ib = 1.0;
  if (h->bc && (h->algo == LOWBIT_ALGORITHM_ADAMW || h->algo == LOWBIT_ALGORITHM_ADAM)) {
    c.ss = h->lr / (1.0 - pow(h->b1, (double)t));
    c.ib = 1.0 / sqrt(1.0 - pow(h->b2, (double)t));
  }
  if (h->algo == LOWBIT_ALGORITHM_ADAGRAD) c.ss = h->lr / (1.0 + (double)(t - 1) * h->lr_decay);
  return c;
}

/* One step of one element in float64. */
static inline void ref_update(const ref_hp_t* h, const ref_step_t* k, double* p, double g, double* m, double* v,
                              ref_scale_t* s) {
  int64_t t = k->t;
  double p0 = *p;
  s->p = s->m = s->v = 0;
  s->sign_ambiguous = 0;
  s->lion_base = 0;
  switch (h->algo) {
    case LOWBIT_ALGORITHM_ADAMW:
    case LOWBIT_ALGORITHM_ADAM: {
      const double T = REF_TINY;
      double gs = fabs(g), pd = p0, ps = 0;
      if (h->algo == LOWBIT_ALGORITHM_ADAM) {
        g += h->wd * p0;
        gs += h->wd * fabs(p0) + T; /* the product wd p */
      } else {
        pd = p0 * (1.0 - h->lr * h->wd);
        ps += T; /* the product p (1 - lr wd) */
      }
      double ms = h->b1 * fabs(*m) + (1 - h->b1) * gs + 2 * T;           /* b1 m, (1 - b1) g */
      double vs = h->b2 * fabs(*v) + (1 - h->b2) * gs * gs + 3 * T;      /* g g, (1 - b2) g^2, b2 v */
      *m = h->b1 * *m + (1 - h->b1) * g;
      *v = h->b2 * *v + (1 - h->b2) * g * g;
      double ss = k->ss, ib = k->ib;
      double denom = sqrt(*v) * ib + h->eps;
      double upd = ss * *m / denom;
      *p = pd - upd;
      s->m = ms;
      s->v = vs;
      /* the underflow of v (3 u T absolute) moves sqrt(v) by at most
       * min(3 u T / (2 sqrt v), sqrt(3 u T)), and the update in proportion */
      double dv = 3 * REF_U * T, sv = sqrt(*v);
      double dsqrt = sv > 0 ? fmin(dv / (2 * sv), sqrt(dv)) : sqrt(dv);
      s->p = fabs(pd) + ss * ms / denom + fabs(upd) + ps
             + T / denom                                     /* the product step_size m, then divided */
             + T                                             /* the quotient */
             + fabs(upd) * ib * dsqrt / (denom * REF_U);     /* v's underflow through the denominator */
      break;
    }
    case LOWBIT_ALGORITHM_LION: {
      const double T = REF_TINY;
      double c = h->b1 * *m + (1 - h->b1) * g;
      double cs = h->b1 * fabs(*m) + (1 - h->b1) * fabs(g) + 2 * T;
      double sg = c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0;
      s->sign_ambiguous = fabs(c) <= REF_K * REF_U * cs;
      s->lion_base = p0 * (1.0 - h->lr * h->wd);
      *p = s->lion_base - h->lr * sg;
      s->m = h->b2 * fabs(*m) + (1 - h->b2) * fabs(g) + 2 * T;
      *m = h->b2 * *m + (1 - h->b2) * g;
      s->v = 0;
      s->p = fabs(p0) + h->lr + T; /* the decay product */
      break;
    }
    case LOWBIT_ALGORITHM_SGD: {
      const double T = REF_TINY;
      double gs = fabs(g) + h->wd * fabs(p0) + T; /* the product wd p */
      g += h->wd * p0;
      double us = gs;
      s->m = 0;
      if (h->mom != 0.0) {
        double bs;
        if (t == 1) {
          *m = g;
          bs = gs;
        } else {
          bs = h->mom * fabs(*m) + (1 - h->damp) * gs + 2 * T; /* momentum m, (1 - dampening) g */
          *m = h->mom * *m + (1 - h->damp) * g;
        }
        s->m = bs;
        if (h->nesterov) {
          g = g + h->mom * *m;
          us = gs + h->mom * bs + T; /* momentum m */
        } else {
          g = *m;
          us = bs;
        }
      }
      *p = p0 - h->lr * g;
      s->v = 0;
      s->p = fabs(p0) + h->lr * us + T; /* the product lr g */
      break;
    }
    case LOWBIT_ALGORITHM_RMSPROP:
    case LOWBIT_ALGORITHM_ADAGRAD: {
      /* m: the square average (RMSprop) or the sum of squares (Adagrad); v:
       * RMSprop's momentum buffer or centred grad average */
      const double T = REF_TINY;
      double gs = fabs(g) + h->wd * fabs(p0) + T; /* the product wd p */
      g += h->wd * p0;
      const int rms = h->algo == LOWBIT_ALGORITHM_RMSPROP;
      double qs, var, vars;
      if (rms) {
        qs = h->alpha * fabs(*m) + (1 - h->alpha) * gs * gs + 3 * T; /* g g, (1 - alpha) g^2, alpha sq */
        *m = h->alpha * *m + (1 - h->alpha) * g * g;
      } else {
        const double start = t == 1 ? h->init : *m;
        qs = fabs(start) + gs * gs + 2 * T; /* g g, the sum */
        *m = start + g * g;
      }
      var = *m;
      vars = qs;
      if (rms && h->centered) {
        double as = fabs(*v) + (1 - h->alpha) * (gs + fabs(*v)) + 2 * T; /* g - a, (1 - alpha) (g - a) */
        *v = *v + (1 - h->alpha) * (g - *v);
        s->v = as;
        vars = qs + 2 * fabs(*v) * as + fabs(*v) * fabs(*v) + T; /* a a, sq - a^2 */
        var = *m - *v * *v;
      }
      if (var < 0) var = 0;
      double sv = sqrt(var), denom = sv + h->eps;
      /* var's rounding (vars u) moves sqrt(var) by at most min(dv / (2 sqrt var), sqrt(dv)) */
      double dv = REF_K * REF_U * vars, dsqrt = sv > 0 ? fmin(dv / (2 * sv), sqrt(dv)) : sqrt(dv);
      double q = g / denom, qsc = gs / denom + fabs(q) + T + fabs(q) * dsqrt / (denom * REF_U * REF_K);
      double step = rms ? h->lr : k->ss;
      if (rms && h->mom != 0.0) {
        double bs = h->mom * fabs(*v) + qsc + fabs(q) + 2 * T; /* momentum b, + q */
        *v = h->mom * *v + q;
        s->v = bs;
        *p = p0 - step * *v;
        s->p = fabs(p0) + step * bs + fabs(step * *v) + T;
      } else {
        *p = p0 - step * q;
        s->p = fabs(p0) + step * qsc + fabs(step * q) + T;
      }
      s->m = qs;
      break;
    }
    default: break;
  }
}

/* ------------------------------------------------------------------ shaped parameters
 * Rank-1 normalisation and the factored second moment, from the definitions
 * of lowbit.h ("Shaped parameters"), in double except where the library's
 * stored values are fp32 (the rank-1 maxima are maxima of fp32 values). */

typedef struct {
  int ndim;
  int64_t dim[8];
} ref_shape_t;

/* Index of element e in dim k (row-major). */
static inline int64_t ref_index(const ref_shape_t* s, int64_t e, int k) {
  for (int j = s->ndim - 1; j > k; --j) e /= s->dim[j];
  return e % s->dim[k];
}
static inline int64_t ref_dim_sum(const ref_shape_t* s) {
  int64_t t = 0;
  for (int k = 0; k < s->ndim; ++k) t += s->dim[k];
  return t;
}
/* r_k[i] = max |f| over the elements with index i in dim k, f the fp32 values. */
static inline void ref_rank1_vectors(const ref_shape_t* s, const float* f, int64_t n, float* vec) {
  memset(vec, 0, sizeof(float) * (size_t)ref_dim_sum(s));
  for (int64_t e = 0; e < n; ++e) {
    int64_t off = 0;
    for (int k = 0; k < s->ndim; ++k) {
      float* r = &vec[off + ref_index(s, e, k)];
      if (fabsf(f[e]) > *r) *r = fabsf(f[e]);
      off += s->dim[k];
    }
  }
}
/* min over k of r_k[i_k(e)]. */
static inline float ref_rank1_scale(const ref_shape_t* s, const float* vec, int64_t e) {
  float m = INFINITY;
  int64_t off = 0;
  for (int k = 0; k < s->ndim; ++k) {
    float r = vec[off + ref_index(s, e, k)];
    if (r < m) m = r;
    off += s->dim[k];
  }
  return m;
}
/* Code of fp32 value f with `scale` on a map (ties to the lower code; a
 * positive second moment never codes to 0); *dist: distance of f / scale to
 * the nearest decision boundary. */
static inline int ref_code(const qmap_t* map, int second, float f, float scale, double* dist) {
  if (!(scale > 0.f)) {
    if (dist) *dist = INFINITY;
    return qmap_nearest(map, 0.0, NULL);
  }
  float x = f / scale;
  int k = qmap_nearest(map, x, dist);
  if (second && map->v[k] == 0.0 && x > 0.f) ++k;
  return k;
}

/* Factored accumulators of shape (B, R, C): row[B*R], col[B*C]; one EMA with
 * the fp32 squared gradients g2 (double means). */
static inline void ref_factored_update(const ref_shape_t* s, int64_t n, double b2, const double* g2, double* row,
                                       double* col) {
  int64_t C = s->dim[s->ndim - 1], R = s->dim[s->ndim - 2], rows = n / C, B = rows / R;
  for (int64_t q = 0; q < rows; ++q) {
    double sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += g2[q * C + c];
    row[q] = b2 * row[q] + (1 - b2) * sum / (double)C;
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0;
      for (int64_t r = 0; r < R; ++r) sum += g2[(b * R + r) * C + c];
      col[b * C + c] = b2 * col[b * C + c] + (1 - b2) * sum / (double)R;
    }
}
/* v^[e] = row[q] / mean_r row[b, r] * col[b, c] (0 where the mean is 0). */
static inline double ref_factored_v(const ref_shape_t* s, int64_t n, const double* row, const double* col, int64_t e) {
  int64_t C = s->dim[s->ndim - 1], R = s->dim[s->ndim - 2], q = e / C, c = e % C, b = q / R;
  double mean = 0;
  for (int64_t r = 0; r < R; ++r) mean += row[b * R + r];
  mean /= (double)R;
  (void)n;
  return mean > 0 ? row[q] / mean * col[b * C + c] : 0.0;
}

#endif
