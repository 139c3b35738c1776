/* A training-loop harness shared by the cmocka suites: it drives one lowbit
 * optimizer through many steps on fresh random gradients and checks it
 * against the float64 reference of refmath.h in two ways.
 *
 * 1. Lockstep (exact per-step check). Before every step the harness reads the
 *    library's params and (dequantized) moments, applies one float64 step to
 *    those, stores the result the way the format does (bf16 RNE, block
 *    quantization, ...) and compares with what the library produced:
 *      - fp32 values: within REF_K * 2^-24 * scale (refmath.h);
 *      - 16-bit params, bf16 moments, quantized codes: identical, except that
 *        a value may land on the neighbouring representable value / code when
 *        the float64 input lies within the fp32 error bound of the decision
 *        boundary (a "flip"). A neighbour farther from the boundary, or any
 *        other value, is a failure. Flips are counted and printed.
 *    Lion: where c = b1 m + (1-b1) g is within the fp32 error bound of 0 the
 *    sign is ambiguous and any of the three outcomes is accepted (counted).
 * 2. Free-running. A second float64 model runs the whole schedule on its own
 *    (fp32 state kept in double, bf16/quantized state rounded/quantized like
 *    the library each step, 16-bit params rounded to their dtype each step).
 *    At the end every element is compared with an accumulated bound
 *    tolacc = sum over steps of REF_K u (|p| + F * update scale), F = 1/(1-beta)
 *    + t covering how moment errors persist through the moving averages. The
 *    harness reports how many elements end beyond it (caused by flips that
 *    happened at different places in the two runs) and how far; each suite
 *    asserts limits stated next to its cases.
 */
#ifndef LOWBIT_TEST_HARNESS_H
#define LOWBIT_TEST_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "lowbit.h"
#include "refmath.h"

typedef struct {
  int64_t numel;
  lowbit_dtype_t pdt, gdt;
  int32_t group;
  lowbit_state_format_t fmt, fmt2; /* per-param override (DEFAULT: optimizer's) */
  double p_scale;                  /* params ~ N(0, p_scale^2) (0: 1.0) */
  double g_scale;                  /* grads ~ N(0, g_scale^2) (0: 1.0) */
  int zero_blocks;                 /* grads are exactly 0 on every other 256-element block */
} pspec_t;

typedef struct {
  const char* name;
  lowbit_algorithm_t algo;
  lowbit_state_format_t fmt, fmt2;
  int64_t min_quantized_numel; /* < 0: library default */
  int ngroups;
  lowbit_hparams_t groups[4];
  int nparams;
  const pspec_t* params;
  int steps;
  int schedule;       /* set_lr every step: warm-up then cosine, per group */
  int change_hparams; /* at steps/2 every group gets new betas / wd / momentum */
  int grad_mode;      /* 0: registered grads, 1: step_with_grads, 2: alternate */
  int skip_params;    /* some params get no grad on some steps */
  int num_threads;    /* 0: library default */
  int no_lockstep;    /* skip the lockstep check (free-running only) */
  double state_drift; /* free-running allowance x path length for rounded / quantized state */
  int verbose;
} hcfg_t;

typedef struct {
  int64_t elements;   /* params' elements */
  int64_t elements16; /* ... of them in 16-bit params */
  int64_t checked;    /* element-steps checked in lockstep */
  int64_t p_flips, m_flips, v_flips, lion_ambiguous;
  /* free-running, at the end */
  int64_t free_beyond;   /* fp32-param elements beyond the accumulated bound */
  double free_max_ratio; /* max |lib - ref| / bound over fp32-param elements */
  int64_t free_beyond16; /* 16-bit-param elements that differ */
  double free_max_ulps;  /* max |lib - ref| in ulps of the param dtype at the largest |p| seen */
  double free_max_abs;   /* max |lib - ref| */
  int64_t free_violations; /* elements beyond the hard per-element bound (harness.c) */
  double free_max_path_ratio; /* max (|lib - ref| - fp32 bound - 2 ulps) / path length */
  double free_mean_rel;  /* sum |lib - ref| / sum |ref - p0|: drift relative to the distance travelled */
  int64_t state_bytes;   /* total reported */
} hres_t;

/* Runs the configuration; fails the current cmocka test on any lockstep
 * mismatch, API error or param_info / state_bytes inconsistency. */
void harness_run(const hcfg_t* cfg, uint64_t seed, hres_t* res);

/* Expected resolved state format of a moment (the library's documented rule). */
lowbit_state_format_t expected_format(const hcfg_t* cfg, const pspec_t* ps, int moment);

/* Field-wise equality (the structs have padding). */
int hparams_equal(const lowbit_hparams_t* a, const lowbit_hparams_t* b);

/* Fills h with defaults for the algorithm and random but sane values. */
void random_hparams(lowbit_algorithm_t algo, rng_t* r, lowbit_hparams_t* h);

/* Asserts a status, printing the library's message on mismatch. */
#define CHECK_OK(opt, call)                                                                                        \
  do {                                                                                                             \
    lowbit_status_t st_ = (call);                                                                                  \
    if (st_ != LOWBIT_SUCCESS)                                                                                     \
      fail_msg("%s:%d: %s -> %d (%s): %s", __FILE__, __LINE__, #call, (int)st_, lowbit_status_string(st_),         \
               (opt) ? lowbit_optimizer_last_error(opt) : lowbit_last_error());                                    \
  } while (0)

#endif
