// Every hand-written moment codec (core/codec_avx2.cpp, codec_avx512.cpp,
// codec_neon.cpp: the levels of core/cpu_features.hpp) against the portable
// one (core/codec_tiles.hpp): the same codes, scales and decoded floats, bit for bit,
// for every quantized format and both moments, on random tiles spread over
// many decades and on the edge cases (zeros, signed zeros, denormals,
// infinities, NaN, all-zero tiles, values on and next to every midpoint),
// and every float of the input range where an encoder computes codes
// instead of searching for them (FP8, the linear 4-bit map, the 8-bit maps'
// direct form).
// Each test runs once per level; a level this CPU cannot run is skipped (the
// Arm build runs the NEON level under qemu: scripts/test_arm.sh).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
}

#include "core/codec.hpp"
#include "core/codec_avx2.hpp"
#include "core/codec_avx512.hpp"
#include "core/cpu_features.hpp"
#include "core/float16.hpp"
#include "core/quant.hpp"
#include "core/shape.hpp"
#include "core/state.hpp"
#include "../common/test_seed.h"
#include "../common/test_select.h"

using namespace lowbit;

namespace {

std::mt19937_64 rng;  // seeded in main()
CpuIsa level = CpuIsa::Portable;  // the level under test (set_level)
const char* level_name() { return cpu_isa_name(level); }

// f() with the portable codec, then the level under test's.
template <class F>
void portable_then_level(F&& f) {
  set_cpu_isa(CpuIsa::Portable);
  f(false);
  set_cpu_isa(level);
  f(true);
}

constexpr int kTiles = 64;
constexpr int64_t kNumel = int64_t(kTiles) * kTile;

struct Moment {
  std::vector<uint8_t> data;
  std::vector<float> scales;
  MomentView view;
  Moment(lowbit_state_format_t f, int moment)
      : data(size_t(moment_data_bytes(f, kNumel)), 0xA5), scales(size_t(num_blocks(f, kNumel)), -1.f) {
    view = adam_moment_view(f, moment, data.data(), scales.data());
  }
};

float random_value(std::uniform_real_distribution<float>& u) {
  const float mag = std::pow(10.f, u(rng) * 12.f - 9.f);  // 1e-9 .. 1e3
  return (rng() & 1 ? -mag : mag) * u(rng);
}

// One tile of input: a pattern chosen by `kind`.
void fill_tile(int kind, const QMap* map, float* x) {
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::normal_distribution<float> normal(0.f, 1.f);
  const float scale = std::pow(10.f, u(rng) * 60.f - 30.f);
  for (int i = 0; i < kTile; ++i) x[i] = normal(rng) * scale;
  switch (kind % 8) {
    case 0: break;
    case 1:
      for (int i = 0; i < kTile; ++i) x[i] = random_value(u);
      break;
    case 2:
      for (int i = 0; i < kTile; ++i) x[i] = (i & 1) ? 0.f : -0.f;
      break;
    case 3:  // x / absmax lands on, and next to, the map's midpoints (FP8: the e4m3 rounding ties)
      if (!map) {
        x[0] = kFp8Max;  // scale 1: x / scale is x
        for (int i = 1; i < kTile; ++i) {
          const uint8_t c = uint8_t(rng() % 0x7E);
          const float tie = (e4m3_to_float(c) + e4m3_to_float(uint8_t(c + 1))) / 2;  // exact: 4 significant bits
          x[i] = bits_float(float_bits(tie) + uint32_t(int(rng() % 3) - 1)) * (rng() & 1 ? -1.f : 1.f);
        }
      } else {
        x[0] = 1.f;
        for (int i = 1; i < kTile; ++i) {
          const float mid = map->midpoints[size_t(rng() % size_t(map->n - 1))];
          const uint32_t b = float_bits(mid);
          x[i] = bits_float(b + uint32_t(int(rng() % 3) - 1));
        }
      }
      break;
    case 4: {  // denormals and the smallest normals, or only denormals of at most 2^-136: an FP8
               // scale absmax / 448 then keeps a few bits, and x / scale passes 448 (code 0x7E)
      const uint32_t top = rng() & 1 ? 0x01000000u : 1u << (4 + rng() % 10);
      for (int i = 0; i < kTile; ++i) x[i] = bits_float(uint32_t(rng() % top) | (rng() & 1 ? 0x80000000u : 0u));
      break;
    }
    case 5:  // infinities
      x[rng() % kTile] = INFINITY;
      x[rng() % kTile] = -INFINITY;
      break;
    case 6:  // a NaN poisons its block
      x[rng() % kTile] = NAN;
      break;
    case 7:  // positive only (a second moment) with exact zeros
      for (int i = 0; i < kTile; ++i) x[i] = (i % 5 == 0) ? 0.f : std::fabs(x[i]);
      break;
  }
}

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, size_t(n) * sizeof(float)) == 0; }

// Bits equal, or both NaN: which operand's payload NaN * NaN keeps (an FP8
// NaN code times a NaN scale) follows the compiler's operand order, not IEEE.
bool same_decoded(float a, float b) { return float_bits(a) == float_bits(b) || (std::isnan(a) && std::isnan(b)); }

// The same moment decoded by the portable codec (into a) and the level under test's (b).
void decode_both(const MomentView& mv, std::vector<float>& a, std::vector<float>& b) {
  a.assign(size_t(kNumel), 0.f);
  b.assign(size_t(kNumel), 0.f);
  portable_then_level([&](bool simd) { decode_moment(mv, kNumel, (simd ? b : a).data()); });
}

void check_format(lowbit_state_format_t format, int moment) {
  Moment portable(format, moment), simd(format, moment);
  std::vector<float> x(static_cast<size_t>(kNumel));
  for (int round = 0; round < 8; ++round) {
    for (int t = 0; t < kTiles; ++t) fill_tile(round * kTiles + t, portable.view.map, x.data() + int64_t(t) * kTile);
    portable_then_level([&](bool s) { encode_moment((s ? simd : portable).view, kNumel, x.data()); });
    for (size_t i = 0; i < portable.data.size(); ++i)
      if (portable.data[i] != simd.data[i]) {
        const int per_byte = storage_format(format) == LOWBIT_STATE_4BIT ? 2 : 1;
        const int64_t e = int64_t(i) * per_byte;
        fail_msg("%s moment %d: code byte %zu differs (portable 0x%02x, %s 0x%02x), input element %lld = %a",
                 format_name(format), moment, i, portable.data[i], level_name(), simd.data[i], (long long)e,
                 double(x[size_t(e)]));
      }
    assert_true(same_bits(portable.scales.data(), simd.scales.data(), int64_t(portable.scales.size())));

    std::vector<float> a, b;
    decode_both(portable.view, a, b);
    for (int64_t i = 0; i < kNumel; ++i)
      if (!same_decoded(a[size_t(i)], b[size_t(i)]))
        fail_msg("%s moment %d: decoded element %lld differs (portable %a, %s %a)", format_name(format), moment,
                 (long long)i, double(a[size_t(i)]), level_name(), double(b[size_t(i)]));
  }
}

// Every code of every map through the decoder (random scales, NaN scale too).
void check_every_code(lowbit_state_format_t format, int moment) {
  Moment m(format, moment);
  for (size_t i = 0; i < m.data.size(); ++i) m.data[i] = uint8_t(i * 37 + i / 256);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (size_t k = 0; k < m.scales.size(); ++k) m.scales[k] = k == 3 ? NAN : (k == 5 ? 0.f : std::pow(10.f, u(rng) * 20 - 10));
  std::vector<float> a, b;
  decode_both(m.view, a, b);
  for (int64_t i = 0; i < kNumel; ++i)
    if (!same_decoded(a[size_t(i)], b[size_t(i)]))
      fail_msg("%s moment %d: code 0x%02x, scale %a decodes to %08x (portable) and %08x (%s)", format_name(format),
               moment, m.data[size_t(storage_format(format) == LOWBIT_STATE_4BIT ? i / 2 : i)], double(m.scales[size_t(i / block_size(format))]),
               float_bits(a[size_t(i)]), float_bits(b[size_t(i)]), level_name());
}

// The level of this test (its cmocka state); skipped where the CPU cannot run it.
void set_level(void** state) {
  level = *static_cast<const CpuIsa*>(*state);
  if (!cpu_isa_supported(level)) {
    std::printf("skipped: this CPU cannot run the %s level\n", level_name());
    skip();
  }
}

void test_8bit(void** state) {
  set_level(state);
  check_format(LOWBIT_STATE_8BIT, 0);
  check_format(LOWBIT_STATE_8BIT, 1);
  check_every_code(LOWBIT_STATE_8BIT, 0);
  check_every_code(LOWBIT_STATE_8BIT, 1);
}

void test_4bit(void** state) {
  set_level(state);
  check_format(LOWBIT_STATE_4BIT, 0);
  check_format(LOWBIT_STATE_4BIT, 1);
  check_every_code(LOWBIT_STATE_4BIT, 0);
  check_every_code(LOWBIT_STATE_4BIT, 1);
  check_format(LOWBIT_STATE_4BIT_DYN, 1);  // v on the unsigned dynamic map (its search, zero code and floor)
  check_every_code(LOWBIT_STATE_4BIT_DYN, 1);
}

// Every float of magnitude <= `top` (bits, sign alternating) as element 1..
// of a block whose element 0 is `top` itself (scale exact: x / absmax is x
// for the 4-bit linear map, x / 1 for FP8), through both encoders.
void check_every_float(lowbit_state_format_t format, int moment, uint32_t top, uint32_t negative_parity = 1) {
  constexpr int kSweepTiles = 4096;
  constexpr int64_t n = int64_t(kSweepTiles) * kTile;
  const int block = block_size(format);
  std::vector<uint8_t> a(size_t(moment_data_bytes(format, n))), b(a.size());
  std::vector<float> sa(size_t(num_blocks(format, n))), sb(sa.size());
  std::vector<float> x(static_cast<size_t>(n));
  const MomentView va = adam_moment_view(format, moment, a.data(), sa.data()), vb = adam_moment_view(format, moment, b.data(), sb.data());
  uint64_t next = 0;
  while (next <= top) {
    for (int64_t i = 0; i < n; ++i) {
      if (i % block == 0) {
        x[size_t(i)] = bits_float(top);
        continue;
      }
      const uint32_t bits = next <= top ? uint32_t(next++) : 0u;
      x[size_t(i)] = bits_float(bits | ((uint32_t(i) & 1u) == negative_parity ? 0x80000000u : 0u));
    }
    portable_then_level([&](bool simd) { encode_moment(simd ? vb : va, n, x.data()); });
    if (a != b)
      for (size_t i = 0; i < a.size(); ++i)
        if (a[i] != b[i])
          fail_msg("%s moment %d: code byte %zu differs (portable 0x%02x, %s 0x%02x), input %a", format_name(format),
                   moment, i, a[i], level_name(), b[i], double(x[storage_format(format) == LOWBIT_STATE_4BIT ? 2 * i : i]));
  }
}

void test_every_float(void** state) {
  set_level(state);
  check_every_float(LOWBIT_STATE_FP8, 1, float_bits(kFp8Max));
  check_every_float(LOWBIT_STATE_4BIT, 1, float_bits(1.f));  // the linear map
  check_every_float(LOWBIT_STATE_4BIT, 0, float_bits(1.f));  // the signed map's search by per-step tables
  check_every_float(LOWBIT_STATE_4BIT_DYN, 1, float_bits(1.f));  // the unsigned dynamic map
}

// The direct form of the 8-bit codes (a line per level, no search) on every
// float in [-1, 1]: the signed map with each magnitude under both signs.
void test_every_float_8bit(void** state) {
  set_level(state);
  if (level == CpuIsa::Avx512) assert_true(avx512_direct8_active());
  if (level == CpuIsa::Avx2) assert_true(avx2_bucket8_active());
  check_every_float(LOWBIT_STATE_8BIT, 0, float_bits(1.f), 1);
  check_every_float(LOWBIT_STATE_8BIT, 0, float_bits(1.f), 0);
  check_every_float(LOWBIT_STATE_8BIT, 1, float_bits(1.f));
}

void test_fp8(void** state) {
  set_level(state);
  check_format(LOWBIT_STATE_FP8, 0);
  check_format(LOWBIT_STATE_FP8, 1);
  check_every_code(LOWBIT_STATE_FP8, 0);
}

// Rank-1 moments (a scale per element from the per-dim vectors): whole
// moments encoded (vectors, then codes tile by tile, at odd bases too) and
// decoded by the portable codec and the level's, on shapes whose rows do not
// fill tiles, with the edge-case tiles of fill_tile.
void check_rank1(lowbit_state_format_t format, int moment) {
  const int64_t shapes[][3] = {{2, 64, 256}, {2, 37, 91}, {3, 5, 7 * 33}, {2, 300, 129}};
  for (const auto& sh : shapes) {
    Shape shape{};
    shape.ndim = int32_t(sh[0]);
    if (sh[0] == 2) shape.dim[0] = sh[1], shape.dim[1] = sh[2];
    else shape.dim[0] = sh[1], shape.dim[1] = 7, shape.dim[2] = 33;
    int64_t numel = 1;
    for (int k = 0; k < shape.ndim; ++k) numel *= shape.dim[k];
    const int64_t padded = (numel + kTile - 1) / kTile * kTile;
    std::vector<float> x(static_cast<size_t>(padded));
    for (int64_t t = 0; t < padded / kTile; ++t)
      fill_tile(int(t), adam_moment_map(format, moment), x.data() + t * kTile);
    for (float& v : x)
      if (!std::isfinite(v)) v = 1.f;  // rank-1 vectors of a non-finite value: the step's concern, not the codec's
    std::vector<uint8_t> d[2];
    std::vector<float> sc[2], out[2];
    MomentView mv[2];
    for (int k = 0; k < 2; ++k) {
      d[k].assign(size_t(moment_data_bytes(format, Norm::Rank1, shape, numel)), 0x5A);
      sc[k].assign(size_t(moment_scale_bytes(format, Norm::Rank1, shape, numel) / 4), 0.f);
      mv[k] = adam_moment_view(format, moment, d[k].data(), sc[k].data());
      mv[k].norm = Norm::Rank1;
      out[k].assign(size_t(numel), 0.f);
    }
    portable_then_level([&](bool simd) {
      encode_moment(mv[simd], shape, numel, x.data());
      decode_moment(mv[0], shape, numel, out[simd].data());  // the same codes, decoded by both
    });
    for (size_t i = 0; i < d[0].size(); ++i)
      if (d[0][i] != d[1][i])
        fail_msg("%s moment %d rank-1 %lldx%lld: code byte %zu differs (portable 0x%02x, %s 0x%02x)",
                 format_name(format), moment, (long long)sh[1], (long long)sh[2], i, d[0][i], level_name(), d[1][i]);
    assert_true(same_bits(sc[0].data(), sc[1].data(), int64_t(sc[0].size())));
    for (int64_t i = 0; i < numel; ++i)
      if (!same_decoded(out[0][size_t(i)], out[1][size_t(i)]))
        fail_msg("%s moment %d rank-1: decoded element %lld differs (portable %a, %s %a)", format_name(format),
                 moment, (long long)i, double(out[0][size_t(i)]), level_name(), double(out[1][size_t(i)]));
  }
}

void test_rank1(void** state) {
  set_level(state);
  for (lowbit_state_format_t f : {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT})
    for (int moment = 0; moment < 2; ++moment) check_rank1(f, moment);
  check_rank1(LOWBIT_STATE_4BIT_DYN, 1);
}

}  // namespace

// `test_codec_simd [--skip] PATTERN...` runs part of the suite (test_select.h):
// CTest runs the every-float sweeps (test_every_float*) as their own entry.
int main(int argc, char** argv) {
  rng.seed(lowbit_test_seed("test_codec_simd"));
  static const CpuIsa avx2 = CpuIsa::Avx2, avx512 = CpuIsa::Avx512, neon = CpuIsa::Neon;
#define LOWBIT_PER_LEVEL(f)                                        \
  {#f "_avx2", f, nullptr, nullptr, const_cast<CpuIsa*>(&avx2)},     \
      {#f "_avx512", f, nullptr, nullptr, const_cast<CpuIsa*>(&avx512)}, \
      {#f "_neon", f, nullptr, nullptr, const_cast<CpuIsa*>(&neon)}
  const struct CMUnitTest tests[] = {
      LOWBIT_PER_LEVEL(test_8bit),       LOWBIT_PER_LEVEL(test_4bit),
      LOWBIT_PER_LEVEL(test_fp8),        LOWBIT_PER_LEVEL(test_every_float),
      LOWBIT_PER_LEVEL(test_every_float_8bit), LOWBIT_PER_LEVEL(test_rank1),
  };
  return LOWBIT_RUN_SELECTED(tests, argc, argv, nullptr, nullptr);
}
