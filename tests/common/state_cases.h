/* The state formats and normalisations of Adam's two moments that the
 * issue-32 suites sweep (tests/core/test_limits.c, tests/cuda/
 * test_extremes_vs_cpu.c): every block format, rank-1 for both moments, and
 * the factored second moment under block and rank-1 first moments. */
#ifndef LOWBIT_TEST_STATE_CASES_H
#define LOWBIT_TEST_STATE_CASES_H

#include "lowbit.h"

typedef struct {
  lowbit_state_format_t fm, fv;
  lowbit_normalization_t nm, nv;
} state_case_t;

#define SC_BLOCK(f) {f, f, LOWBIT_NORMALIZATION_BLOCK, LOWBIT_NORMALIZATION_BLOCK}
static const state_case_t kStateCases[] = {
    SC_BLOCK(LOWBIT_STATE_FP32), SC_BLOCK(LOWBIT_STATE_BF16), SC_BLOCK(LOWBIT_STATE_8BIT),
    SC_BLOCK(LOWBIT_STATE_4BIT), SC_BLOCK(LOWBIT_STATE_FP8),
    {LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT, LOWBIT_NORMALIZATION_RANK1, LOWBIT_NORMALIZATION_RANK1},
    {LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT, LOWBIT_NORMALIZATION_RANK1, LOWBIT_NORMALIZATION_RANK1},
    {LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT, LOWBIT_NORMALIZATION_BLOCK, LOWBIT_NORMALIZATION_FACTORED},
    {LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT, LOWBIT_NORMALIZATION_BLOCK, LOWBIT_NORMALIZATION_FACTORED},
    {LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT, LOWBIT_NORMALIZATION_RANK1, LOWBIT_NORMALIZATION_FACTORED},
    {LOWBIT_STATE_FP32, LOWBIT_STATE_FP32, LOWBIT_NORMALIZATION_BLOCK, LOWBIT_NORMALIZATION_FACTORED},
};
#undef SC_BLOCK
#define NUM_STATE_CASES (int)(sizeof kStateCases / sizeof kStateCases[0])

#endif
