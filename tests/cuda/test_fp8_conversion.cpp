// float_to_e4m3 (core/quant.hpp) against CUDA's own float -> e4m3 conversion,
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) from cuda_fp8.hpp. On the
// host that header computes the conversion in software; on sm_89 and later the
// same call is the instruction cvt.rn.satfinite.e4m3x2.f32, which the CUDA
// step kernel uses for its FP8 codes (step_kernel.cuh, e4m3x2_not_nan). The two
// must agree on every value that can reach that instruction: every float but
// NaN. On NaN they differ by design (CUDA's NaN is 0x7F whatever the sign;
// float_to_e4m3 keeps the sign), which this checks too.
//
//   test_fp8_conversion           every float near a rounding edge of e4m3 and
//                                 2^24 random ones (about 1 s)
//   test_fp8_conversion all       all 2^32 floats (exhaustive label, 2 threads)
// LOWBIT_TEST_SEED picks other random floats.
#include <cuda_fp8.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "core/quant.hpp"

namespace {

uint8_t cuda_e4m3(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

uint8_t lowbit_e4m3(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return lowbit::float_to_e4m3(x);
}

bool is_nan(uint32_t bits) { return (bits & 0x7FFFFFFFu) > 0x7F800000u; }

struct Tally {
  std::atomic<uint64_t> checked{0}, differ{0}, nan_differ{0};
  std::atomic<uint32_t> first_bad{0};
  std::atomic<bool> any_bad{false};
};

// Compares one float; a NaN must give CUDA's 0x7F and lowbit's sign | 0x7F.
void check(uint32_t bits, Tally& t, uint64_t& checked, uint64_t& differ, uint64_t& nan_differ) {
  const uint8_t c = cuda_e4m3(bits), l = lowbit_e4m3(bits);
  ++checked;
  if (is_nan(bits)) {
    const uint8_t want_l = uint8_t(((bits >> 24) & 0x80u) | 0x7Fu);
    if (c != 0x7F || l != want_l) {
      ++differ;
      if (!t.any_bad.exchange(true)) t.first_bad = bits;
    } else if (c != l) {
      ++nan_differ;
    }
    return;
  }
  if (c != l) {
    ++differ;
    if (!t.any_bad.exchange(true)) t.first_bad = bits;
  }
}

void flush(Tally& t, uint64_t checked, uint64_t differ, uint64_t nan_differ) {
  t.checked += checked;
  t.differ += differ;
  t.nan_differ += nan_differ;
}

// Every float whose bits below e4m3's mantissa (the low 20 for normal
// e4m3 values, more for its subnormals) sit at or next to a rounding edge:
// each sign, exponent and top 12 mantissa bits with the low 11 bits at
// 0, 1, half - 1, half, half + 1 and all ones; plus all floats in [2^-11, 2^-8]
// (e4m3's subnormal steps, whose edges fall elsewhere) and around 448..480.
void edges(Tally& t) {
  uint64_t checked = 0, differ = 0, nan_differ = 0;
  const uint32_t lows[] = {0u, 1u, 0x3FFu, 0x400u, 0x401u, 0x7FFu};
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t high = 0; high < (1u << 20); ++high)  // exponent (8 bits) and top 12 mantissa bits
      for (uint32_t low : lows) check(sign << 31 | high << 11 | low, t, checked, differ, nan_differ);
  const uint32_t sub_lo = 0x3A000000u, sub_hi = 0x3B800000u;  // 2^-11 .. 2^-8
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t b = sub_lo; b <= sub_hi; ++b) check(sign << 31 | b, t, checked, differ, nan_differ);
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t b = 0x43DF0000u; b <= 0x43F10000u; ++b) check(sign << 31 | b, t, checked, differ, nan_differ);
  flush(t, checked, differ, nan_differ);
}

void randoms(Tally& t, uint64_t seed) {
  uint64_t checked = 0, differ = 0, nan_differ = 0;
  std::mt19937_64 rng(seed);
  for (int i = 0; i < (1 << 24); ++i) {
    const uint64_t r = rng();
    // Half of them uniform over all bits, half with |x| in [2^-12, 2^10).
    const uint32_t bits = (i & 1) ? uint32_t(r)
                                  : uint32_t(r & 0x807FFFFFu) | ((uint32_t(115 + (r >> 40) % 22)) << 23);
    check(bits, t, checked, differ, nan_differ);
  }
  flush(t, checked, differ, nan_differ);
}

void all_floats(Tally& t) {
  const unsigned threads = std::max(1u, std::min(2u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned k = 0; k < threads; ++k)
    pool.emplace_back([&t, k, threads] {
      uint64_t checked = 0, differ = 0, nan_differ = 0;
      for (uint64_t b = k; b <= 0xFFFFFFFFull; b += threads) check(uint32_t(b), t, checked, differ, nan_differ);
      flush(t, checked, differ, nan_differ);
    });
  for (auto& th : pool) th.join();
}

}  // namespace

int main(int argc, char** argv) {
  Tally t;
  const bool all = argc > 1 && std::strcmp(argv[1], "all") == 0;
  if (all) {
    all_floats(t);
  } else {
    const char* env = std::getenv("LOWBIT_TEST_SEED");
    const uint64_t seed = env ? std::strtoull(env, nullptr, 10) : 20261128u;
    edges(t);
    randoms(t, seed);
  }
  std::printf("fp8 conversion: %llu floats, %llu differ (%llu negative NaNs differ as designed)\n",
              (unsigned long long)t.checked.load(), (unsigned long long)t.differ.load(),
              (unsigned long long)t.nan_differ.load());
  if (t.differ.load() != 0) {
    const uint32_t b = t.first_bad.load();
    std::printf("first difference: bits 0x%08X: cuda 0x%02X, float_to_e4m3 0x%02X\n", b, cuda_e4m3(b), lowbit_e4m3(b));
    return 1;
  }
  if (all && t.nan_differ.load() != (1ull << 23) - 1) {
    std::printf("expected every negative NaN (2^23 - 1) to differ\n");
    return 1;
  }
  return 0;
}
