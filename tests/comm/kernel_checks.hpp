// Non-fatal checks for the comm kernel tests (test_comm_host_kernels,
// test_comm_kernels_emulated): a failed CHECK prints file, line, the current
// case (g_case, set with set_case) and a message, and counts; the 21st
// failure exits. Bit comparisons of floats.
#pragma once
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

int g_failures = 0;
char g_case[512] = "";

#define CHECK(cond, ...)                                                         \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "FAILED %s:%d [%s]: ", __FILE__, __LINE__, g_case); \
      std::fprintf(stderr, __VA_ARGS__);                                         \
      std::fprintf(stderr, "\n");                                                \
      if (++g_failures > 20) std::exit(1);                                       \
    }                                                                            \
  } while (0)

__attribute__((format(printf, 1, 2))) void set_case(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(g_case, sizeof g_case, fmt, args);
  va_end(args);
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// First index where two float arrays differ in bits, or -1.
int64_t first_diff(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (bits(a[i]) != bits(b[i])) return i;
  return -1;
}

// main()'s ending: 1 if any check failed, else 0 after printing `summary`.
int report(int cases, const char* summary) {
  if (g_failures) {
    std::fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("%d cases: %s\n", cases, summary);
  return 0;
}

}  // namespace
