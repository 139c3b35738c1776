/* The seed of a test suite: fixed by default, so CI runs are deterministic;
 * LOWBIT_TEST_SEED=N repeats seed N, LOWBIT_TEST_SEED=random draws a fresh
 * one (printed, to repeat a failure). The same convention as the Python
 * tests (tests/python/conftest.py). */
#ifndef LOWBIT_TEST_SEED_H
#define LOWBIT_TEST_SEED_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOWBIT_TEST_DEFAULT_SEED 20261123ull

static inline uint64_t lowbit_test_seed(const char* suite) {
  const char* env = getenv("LOWBIT_TEST_SEED");
  uint64_t seed = LOWBIT_TEST_DEFAULT_SEED;
  if (env && strcmp(env, "random") == 0)
    seed = (uint64_t)time(NULL) * 1000003ull ^ (uint64_t)clock() * 0x9E3779B97F4A7C15ull;
  else if (env && *env)
    seed = strtoull(env, NULL, 0);
  printf("%s: seed %llu (LOWBIT_TEST_SEED=%llu repeats it, LOWBIT_TEST_SEED=random explores)\n", suite,
         (unsigned long long)seed, (unsigned long long)seed);
  return seed;
}

#endif /* LOWBIT_TEST_SEED_H */
