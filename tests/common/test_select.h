/* Running part of a cmocka suite from the command line, so that CTest can
 * split a long suite into entries that run in parallel (tests/cuda and
 * tests/core CMakeLists.txt):
 *
 *   suite                        every test of the suite
 *   suite PATTERN...             the tests whose names match one of the patterns
 *   suite --skip PATTERN...      every test except those
 *
 * Patterns are shell wildcards (fnmatch) over the whole test name, e.g.
 * test_adamw or 'test_every_float*'. A pattern that matches no test is an
 * error (exit 2), so that a renamed test cannot silently drop out of CTest.
 * Include after <cmocka.h>:
 *
 *   return LOWBIT_RUN_SELECTED(tests, argc, argv, NULL, NULL);
 */
#ifndef LOWBIT_TEST_SELECT_H
#define LOWBIT_TEST_SELECT_H

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline int lowbit_run_selected(const char* group, const struct CMUnitTest* tests, size_t n, int argc,
                                      char** argv, CMFixtureFunction setup, CMFixtureFunction teardown) {
  int skip = argc > 1 && strcmp(argv[1], "--skip") == 0;
  const int first = skip ? 2 : 1;
  if (argc <= first) {
    if (skip) {
      fprintf(stderr, "%s: --skip needs at least one pattern\n", argv[0]);
      return 2;
    }
    return _cmocka_run_group_tests(group, tests, n, setup, teardown);
  }
  for (int a = first; a < argc; ++a) {
    size_t hits = 0;
    for (size_t i = 0; i < n; ++i) hits += fnmatch(argv[a], tests[i].name, 0) == 0;
    if (hits == 0) {
      fprintf(stderr, "%s: no test matches '%s'; the tests are:", argv[0], argv[a]);
      for (size_t i = 0; i < n; ++i) fprintf(stderr, " %s", tests[i].name);
      fprintf(stderr, "\n");
      return 2;
    }
  }
  struct CMUnitTest* chosen = (struct CMUnitTest*)malloc(n * sizeof *chosen);
  if (!chosen) return 2;
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    int match = 0;
    for (int a = first; a < argc && !match; ++a) match = fnmatch(argv[a], tests[i].name, 0) == 0;
    if (match != skip) chosen[k++] = tests[i];
  }
  int failed = 2;
  if (k == 0)
    fprintf(stderr, "%s: every test is skipped\n", argv[0]);
  else
    failed = _cmocka_run_group_tests(group, chosen, k, setup, teardown);
  free(chosen);
  return failed;
}

#define LOWBIT_RUN_SELECTED(tests, argc, argv, setup, teardown) \
  lowbit_run_selected(#tests, tests, sizeof(tests) / sizeof((tests)[0]), argc, argv, setup, teardown)

#endif /* LOWBIT_TEST_SELECT_H */
