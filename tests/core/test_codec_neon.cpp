// The NEON moment codec (core/codec_neon.cpp, called directly) against the
// portable one (core/codec.cpp at the portable level, set_cpu_isa(CpuIsa::Portable)): the same codes,
// scales and decoded floats, bit for bit, for every quantized format and both
// moments, the 4BIT_SR codes with their keys, and the rank-1 tiles against
// rank1_code(); on random tiles spread over many decades and on the edge
// cases (zeros, signed zeros, denormals, infinities, NaN, all-zero tiles,
// every midpoint of every map and the floats next to it, the direct form's
// binade edges and boundaries), and every float of the input range where an
// encoder computes codes instead of searching for them (FP8, the linear 4-bit
// map, the 8-bit maps' direct form; test_every_float*, the exhaustive entry).
// Runs on AArch64 (natively or under qemu-user: scripts/test_arm.sh); skipped
// elsewhere, where the NEON codec is compiled to stubs.
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
#include "core/cpu_features.hpp"
#include "core/codec_neon.hpp"
#include "core/codec_tables.hpp"
#include "core/float16.hpp"
#include "core/quant.hpp"
#include "core/shape.hpp"
#include "core/state.hpp"
#include "../common/test_seed.h"
#include "../common/test_select.h"

using namespace lowbit;

namespace {

std::mt19937_64 rng;  // seeded in main()

constexpr int kTiles = 64;
constexpr int64_t kNumel = int64_t(kTiles) * kTile;
constexpr int kKinds = 10;

struct Moment {
  std::vector<uint8_t> data;
  std::vector<float> scales;
  MomentView view;
  Moment(lowbit_state_format_t f, int moment, int64_t numel = kNumel)
      : data(size_t(moment_data_bytes(f, numel)), 0xA5), scales(size_t(num_blocks(f, numel)), -1.f) {
    view = adam_moment_view(f, moment, data.data(), scales.data());
  }
};

float random_value(std::uniform_real_distribution<float>& u) {
  const float mag = std::pow(10.f, u(rng) * 12.f - 9.f);  // 1e-9 .. 1e3
  return (rng() & 1 ? -mag : mag) * u(rng);
}

float neighbour(float v, int d) { return bits_float(float_bits(v) + uint32_t(d)); }

// One tile of input: a pattern chosen by `kind` (kKinds of them); `tile`
// walks the deterministic patterns (every midpoint, every boundary).
void fill_tile(int kind, int tile, const QMap* map, float* x) {
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::normal_distribution<float> normal(0.f, 1.f);
  const float scale = std::pow(10.f, u(rng) * 60.f - 30.f);
  for (int i = 0; i < kTile; ++i) x[i] = normal(rng) * scale;
  switch (kind % kKinds) {
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
          x[i] = neighbour(tie, int(rng() % 3) - 1) * (rng() & 1 ? -1.f : 1.f);
        }
      } else {
        x[0] = 1.f;
        for (int i = 1; i < kTile; ++i)
          x[i] = neighbour(map->midpoints[size_t(rng() % size_t(map->n - 1))], int(rng() % 3) - 1);
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
    case 8: {  // every midpoint in turn, each with both neighbours and both signs (scale 1)
      const float first = map ? 1.f : kFp8Max;
      const int blocks = kTile / (map && map->n == 16 ? kBlock4 : kBlock8);
      const int per_block = kTile / blocks;
      for (int b = 0; b < blocks; ++b) x[b * per_block] = first;
      const int count = map ? map->n - 1 : 0x7E;
      int j = (tile * 42) % (count > 0 ? count : 1);
      for (int i = 0; i < kTile; ++i) {
        if (i % per_block == 0) continue;
        const float mid = map ? map->midpoints[j] : (e4m3_to_float(uint8_t(j)) + e4m3_to_float(uint8_t(j + 1))) / 2;
        const int d = (i % 3) - 1;
        x[i] = neighbour(mid, d) * ((i / 3) & 1 ? -1.f : 1.f);
        if (i % 6 == 5) j = (j + 1) % count;
      }
      break;
    }
    case 9: {  // powers of two (binade edges) and the 8-bit direct form's boundaries, with neighbours
      const simd_tables::Tables& t = simd_tables::tables();
      const int m = map ? simd_tables::map_index(t, map) : -1;
      x[0] = map ? 1.f : kFp8Max;
      for (int i = 1; i < kTile; ++i) {
        float v = std::ldexp(1.f, -int(rng() % 64));
        if (m >= 0 && m < 2 && (rng() & 1)) {
          const float b = t.direct8[m].bound[rng() % 32];
          if (std::isfinite(b)) v = b;
        }
        x[i] = neighbour(v, int(rng() % 3) - 1) * (rng() & 1 ? -1.f : 1.f);
      }
      break;
    }
  }
}

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, size_t(n) * sizeof(float)) == 0; }

// Bits equal, or both NaN: which operand's payload NaN * NaN keeps (an FP8
// NaN code times a NaN scale) follows the compiler's operand order, not IEEE.
bool same_decoded(float a, float b) { return float_bits(a) == float_bits(b) || (std::isnan(a) && std::isnan(b)); }

void neon_encode(const MomentView& mv, int64_t numel, const float* x) {
  for (int64_t base = 0; base < numel; base += kTile)
    if (!neon_encode_tile(mv, base, x + base)) fail_msg("%s: neon_encode_tile returned false at %lld", format_name(mv.format), (long long)base);
}

void neon_decode(const MomentView& mv, int64_t numel, float* out) {
  for (int64_t base = 0; base < numel; base += kTile)
    if (!neon_decode_tile(mv, base, out + base)) fail_msg("%s: neon_decode_tile returned false at %lld", format_name(mv.format), (long long)base);
}

// The same moment decoded by the portable codec (into a) and the NEON one (b).
void decode_both(const MomentView& mv, std::vector<float>& a, std::vector<float>& b) {
  a.assign(size_t(kNumel), 0.f);
  b.assign(size_t(kNumel), 0.f);
  decode_moment(mv, kNumel, a.data());
  neon_decode(mv, kNumel, b.data());
}

void compare_decoded(const MomentView& mv, int moment) {
  std::vector<float> a, b;
  decode_both(mv, a, b);
  for (int64_t i = 0; i < kNumel; ++i)
    if (!same_decoded(a[size_t(i)], b[size_t(i)]))
      fail_msg("%s moment %d: decoded element %lld differs (portable %a, NEON %a)", format_name(mv.format), moment,
               (long long)i, double(a[size_t(i)]), double(b[size_t(i)]));
}

void compare_codes(const Moment& portable, const Moment& neon, const float* x, lowbit_state_format_t format, int moment) {
  for (size_t i = 0; i < portable.data.size(); ++i)
    if (portable.data[i] != neon.data[i]) {
      const int64_t e = int64_t(i) * (storage_format(format) == LOWBIT_STATE_4BIT ? 2 : 1);
      fail_msg("%s moment %d: code byte %zu differs (portable 0x%02x, NEON 0x%02x), input element %lld = %a (next %a)",
               format_name(format), moment, i, portable.data[i], neon.data[i], (long long)e, double(x[size_t(e)]),
               double(x[size_t(e + 1)]));
    }
  for (size_t k = 0; k < portable.scales.size(); ++k)
    if (float_bits(portable.scales[k]) != float_bits(neon.scales[k]))
      fail_msg("%s moment %d: scale %zu differs (portable %a, NEON %a)", format_name(format), moment, k,
               double(portable.scales[k]), double(neon.scales[k]));
}

void check_format(lowbit_state_format_t format, int moment) {
  Moment portable(format, moment), neon(format, moment);
  std::vector<float> x(static_cast<size_t>(kNumel));
  for (int round = 0; round < 2 * kKinds; ++round) {
    for (int t = 0; t < kTiles; ++t)
      fill_tile(round * kTiles + t, round * kTiles + t, portable.view.map, x.data() + int64_t(t) * kTile);
    encode_moment(portable.view, kNumel, x.data());
    neon_encode(neon.view, kNumel, x.data());
    compare_codes(portable, neon, x.data(), format, moment);
    compare_decoded(portable.view, moment);
  }
}

// Every code of every map through the decoder (random scales, NaN and 0 too).
void check_every_code(lowbit_state_format_t format, int moment) {
  Moment m(format, moment);
  for (size_t i = 0; i < m.data.size(); ++i) m.data[i] = uint8_t(i * 37 + i / 256);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (size_t k = 0; k < m.scales.size(); ++k)
    m.scales[k] = k == 3 ? NAN : (k == 5 ? 0.f : (k == 7 ? INFINITY : std::pow(10.f, u(rng) * 20 - 10)));
  compare_decoded(m.view, moment);
}

void skip_without_neon() {
  if (!neon_codec_supported()) {
    std::printf("skipped: no NEON codec in this build (not AArch64)\n");
    skip();
  }
}

void test_8bit(void**) {
  skip_without_neon();
  assert_true(neon_direct8_active());
  check_format(LOWBIT_STATE_8BIT, 0);
  check_format(LOWBIT_STATE_8BIT, 1);
  check_every_code(LOWBIT_STATE_8BIT, 0);
  check_every_code(LOWBIT_STATE_8BIT, 1);
}

void test_4bit(void**) {
  skip_without_neon();
  check_format(LOWBIT_STATE_4BIT, 0);
  check_format(LOWBIT_STATE_4BIT, 1);
  check_every_code(LOWBIT_STATE_4BIT, 0);
  check_every_code(LOWBIT_STATE_4BIT, 1);
  check_format(LOWBIT_STATE_4BIT_DYN, 1);  // v on the unsigned dynamic map (its search, zero code and floor)
  check_every_code(LOWBIT_STATE_4BIT_DYN, 1);
}

void test_fp8(void**) {
  skip_without_neon();
  check_format(LOWBIT_STATE_FP8, 0);
  check_format(LOWBIT_STATE_FP8, 1);
  check_every_code(LOWBIT_STATE_FP8, 0);
}

// FP32 and BF16 have no NEON form: the caller keeps the portable path.
void test_unquantized_declined(void**) {
  skip_without_neon();
  for (lowbit_state_format_t f : {LOWBIT_STATE_FP32, LOWBIT_STATE_BF16}) {
    Moment m(f, 0);
    std::vector<float> x(size_t(kTile), 1.f);
    assert_false(neon_encode_tile(m.view, 0, x.data()));
    assert_false(neon_decode_tile(m.view, 0, x.data()));
    assert_true(m.data[0] == 0xA5);
  }
  Moment m8(LOWBIT_STATE_8BIT, 0);
  std::vector<float> x(size_t(kTile), 1.f);
  assert_false(neon_encode_tile_sr(m8.view, 0, x.data(), 1));
}

// 4BIT_SR: the step's stochastic codes, tile by tile with a fresh key, at
// indices past 2^32 too (the index's high half enters state_bits). A tile
// with a non-finite block is declined and left untouched.
void check_sr(int moment, uint64_t first_index) {
  Moment portable(LOWBIT_STATE_4BIT_SR, moment), neon(LOWBIT_STATE_4BIT_SR, moment);
  // Views whose element `first_index` is the buffers' first (the codecs
  // index data + base / 2 and scales + base / 128 only).
  const auto shifted = [&](Moment& m) {
    MomentView v = m.view;
    v.data = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(m.data.data()) - uintptr_t(first_index / 2));
    v.scales = reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(m.scales.data()) -
                                        uintptr_t(first_index / kBlock4 * sizeof(float)));
    return v;
  };
  const MomentView pv = shifted(portable), nv = shifted(neon);
  std::vector<float> x(static_cast<size_t>(kNumel));
  int declined = 0;
  for (int round = 0; round < 2 * kKinds; ++round) {
    for (int t = 0; t < kTiles; ++t)
      fill_tile(round * kTiles + t, round * kTiles + t, portable.view.map, x.data() + int64_t(t) * kTile);
    for (int t = 0; t < kTiles; ++t) {
      const int64_t base = int64_t(first_index) + int64_t(t) * kTile;
      const float* in = x.data() + int64_t(t) * kTile;
      const uint64_t key = rng();
      bool finite = true;
      for (int b = 0; b < kTile; b += kBlock4) {
        uint32_t a = 0;
        for (int i = 0; i < kBlock4; ++i) a = std::max(a, float_bits(in[b + i]) & 0x7FFFFFFFu);
        finite = finite && a < 0x7F800000u;
      }
      encode_moment_tile_stochastic(pv, base, kTile, in, key);
      const std::vector<uint8_t> before(neon.data.begin() + t * kTile / 2, neon.data.begin() + (t + 1) * kTile / 2);
      const bool taken = neon_encode_tile_sr(nv, base, in, key);
      if (taken != finite) fail_msg("4BIT_SR moment %d: tile %d taken %d, finite blocks %d", moment, t, int(taken), int(finite));
      if (!taken) {
        ++declined;
        assert_true(std::equal(before.begin(), before.end(), neon.data.begin() + t * kTile / 2));
        encode_moment_tile_stochastic(nv, base, kTile, in, key);  // the caller's portable path
      }
    }
    compare_codes(portable, neon, x.data(), LOWBIT_STATE_4BIT, moment);
  }
  assert_true(declined > 0);  // the infinity and NaN tiles
}

void test_4bit_sr(void**) {
  skip_without_neon();
  check_sr(0, 0);
  check_sr(1, 0);
  check_sr(0, (uint64_t(3) << 32) + 7 * uint64_t(kTile));
  check_sr(1, (uint64_t(1) << 33) + 1024);
}

// ---- rank-1 tiles ----------------------------------------------------------------

void set_code(std::vector<uint8_t>& d, bool four, int64_t e, uint32_t code) {
  if (!four) {
    d[size_t(e)] = uint8_t(code);
    return;
  }
  const int shift = 4 * int(e & 1);
  d[size_t(e >> 1)] = uint8_t((d[size_t(e >> 1)] & ~(0xFu << shift)) | (code << shift));
}

// Elements and their scales: each scale at least the element's magnitude
// (rank-1 scales are slice maxima), sometimes exactly it, 0, negative, NaN
// or infinite (normalize() gives 0 where the scale is not > 0).
void fill_rank1(const QMap* map, int n, float* x, float* s) {
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (int t = 0; t < n; t += kTile) fill_tile(int(rng() % kKinds), int(rng() % 1000), map, x + t);
  for (int i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    switch (rng() % 8) {
      case 0: s[i] = a; break;
      case 1: s[i] = rng() & 1 ? 0.f : -a; break;
      case 2: s[i] = rng() & 1 ? NAN : INFINITY; break;
      default: s[i] = a * (1.f + 3.f * u(rng)); break;
    }
  }
}

void check_rank1(lowbit_state_format_t format, int moment) {
  constexpr int64_t numel = 4 * kTile;
  const bool four = storage_format(format) == LOWBIT_STATE_4BIT;
  const size_t count = static_cast<size_t>(numel);
  std::vector<float> x(count), s(count), a(count), b(count);
  std::vector<uint8_t> ref(size_t(moment_data_bytes(format, numel))), got(ref.size());
  const int bases[] = {0, 1, 2, 17, 64, 256, 301};
  const int lengths[] = {0, 1, 15, 16, 17, 63, 64, 65, 130, 200, 256};
  for (int round = 0; round < 20; ++round)
    for (int base : bases)
      for (int n : lengths) {
        MomentView v = adam_moment_view(format, moment, got.data(), nullptr);
        fill_rank1(v.map, int(numel), x.data(), s.data());
        for (size_t i = 0; i < ref.size(); ++i) ref[i] = got[i] = uint8_t(rng());
        // encode: the prefix the NEON form takes, then what is left unchanged
        const int want = four && (base & 1) ? 0 : n / 16 * 16;
        const int len = neon_encode_rank1(v, base, n, s.data(), x.data());
        if (len != want) fail_msg("%s moment %d rank-1 encode at %d, n %d: took %d, want %d", format_name(format), moment, base, n, len, want);
        for (int i = 0; i < len; ++i) set_code(ref, four, base + i, uint32_t(rank1_code(*v.map, v.second, x[size_t(i)], s[size_t(i)])));
        for (size_t i = 0; i < ref.size(); ++i)
          if (ref[i] != got[i])
            fail_msg("%s moment %d rank-1 encode at %d, n %d: byte %zu is 0x%02x, want 0x%02x", format_name(format), moment,
                     base, n, i, got[i], ref[i]);
        // decode: the codes just written and random ones
        for (int pass = 0; pass < 2; ++pass) {
          if (pass == 1)
            for (size_t i = 0; i < got.size(); ++i) got[i] = uint8_t(rng());
          const int dlen = neon_decode_rank1(v, base, n, s.data(), b.data());
          if (dlen != want) fail_msg("%s rank-1 decode at %d, n %d: took %d, want %d", format_name(format), base, n, dlen, want);
          for (int i = 0; i < dlen; ++i) {
            a[size_t(i)] = v.map->values[load_code(got.data(), four, base + i)] * s[size_t(i)];
            if (!same_decoded(a[size_t(i)], b[size_t(i)]))
              fail_msg("%s moment %d rank-1 decode at %d, element %d: %a, want %a", format_name(format), moment, base, i,
                       double(b[size_t(i)]), double(a[size_t(i)]));
          }
        }
      }
}

void test_rank1(void**) {
  skip_without_neon();
  check_rank1(LOWBIT_STATE_8BIT, 0);
  check_rank1(LOWBIT_STATE_8BIT, 1);
  check_rank1(LOWBIT_STATE_4BIT, 0);
  check_rank1(LOWBIT_STATE_4BIT, 1);
  check_rank1(LOWBIT_STATE_4BIT_DYN, 1);
}

// ---- every float -------------------------------------------------------------------

// Every float of magnitude <= `top` (bits, sign by element parity) as element
// 1.. of a block whose element 0 is `top` itself (scale exact: x / absmax is x
// for the 4-bit linear map, x / 1 for FP8), through both encoders. Chunks of
// the range in parallel where OpenMP is there (each thread its own buffers).
void check_every_float(lowbit_state_format_t format, int moment, uint32_t top, uint32_t negative_parity = 1) {
  constexpr int kSweepTiles = 1024;
  constexpr int64_t n = int64_t(kSweepTiles) * kTile;
  const int block = int(block_size(format));
  const int64_t per_chunk = n - n / block;  // the floats one chunk sweeps
  const int64_t chunks = (int64_t(top) + 1 + per_chunk - 1) / per_chunk;
  int64_t bad_chunk = -1;
#if defined(_OPENMP)
#pragma omp parallel
#endif
  {
    Moment pa(format, moment, n), pb(format, moment, n);
    std::vector<float> x(static_cast<size_t>(n));
#if defined(_OPENMP)
#pragma omp for schedule(dynamic, 1)
#endif
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      uint64_t next = uint64_t(chunk) * uint64_t(per_chunk);
      for (int64_t i = 0; i < n; ++i) {
        if (i % block == 0) {
          x[size_t(i)] = bits_float(top);
          continue;
        }
        const uint32_t bits = next <= top ? uint32_t(next++) : 0u;
        x[size_t(i)] = bits_float(bits | ((uint32_t(i) & 1u) == negative_parity ? 0x80000000u : 0u));
      }
      encode_moment(pa.view, n, x.data());
      for (int64_t base = 0; base < n; base += kTile) neon_encode_tile(pb.view, base, x.data() + base);
      if (pa.data != pb.data || pa.scales != pb.scales) {
#if defined(_OPENMP)
#pragma omp critical
#endif
        if (bad_chunk < 0 || chunk < bad_chunk) bad_chunk = chunk;
      }
    }
  }
  if (bad_chunk < 0) return;
  // Report the first difference of the first bad chunk (sequentially).
  Moment pa(format, moment, n), pb(format, moment, n);
  std::vector<float> x(static_cast<size_t>(n));
  uint64_t next = uint64_t(bad_chunk) * uint64_t(per_chunk);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = i % block == 0 ? top : (next <= top ? uint32_t(next++) : 0u);
    x[size_t(i)] = bits_float(bits | (i % block != 0 && (uint32_t(i) & 1u) == negative_parity ? 0x80000000u : 0u));
  }
  encode_moment(pa.view, n, x.data());
  for (int64_t base = 0; base < n; base += kTile) neon_encode_tile(pb.view, base, x.data() + base);
  for (size_t i = 0; i < pa.data.size(); ++i)
    if (pa.data[i] != pb.data[i])
      fail_msg("%s moment %d: code byte %zu differs (portable 0x%02x, NEON 0x%02x), input %a", format_name(format), moment,
               i, pa.data[i], pb.data[i], double(x[storage_format(format) == LOWBIT_STATE_4BIT ? 2 * i : i]));
  fail_msg("%s moment %d: scales differ in chunk %lld", format_name(format), moment, (long long)bad_chunk);
}

void test_every_float(void**) {
  skip_without_neon();
  check_every_float(LOWBIT_STATE_FP8, 1, float_bits(kFp8Max));
  check_every_float(LOWBIT_STATE_4BIT, 1, float_bits(1.f));  // the linear map
  check_every_float(LOWBIT_STATE_4BIT, 0, float_bits(1.f));  // the signed map's search by per-step tables
}

// The direct form of the 8-bit codes on every float in [-1, 1]: the signed
// map with each magnitude under both signs, the unsigned map floored.
void test_every_float_8bit(void**) {
  skip_without_neon();
  assert_true(neon_direct8_active());
  check_every_float(LOWBIT_STATE_8BIT, 0, float_bits(1.f), 1);
  check_every_float(LOWBIT_STATE_8BIT, 0, float_bits(1.f), 0);
  check_every_float(LOWBIT_STATE_8BIT, 1, float_bits(1.f));
}

}  // namespace

// `test_codec_neon [--skip] PATTERN...` runs part of the suite (test_select.h):
// CTest runs the every-float sweeps (test_every_float*) as their own entry.
int main(int argc, char** argv) {
  rng.seed(lowbit_test_seed("test_codec_neon"));
  set_cpu_isa(CpuIsa::Portable);  // encode_moment / decode_moment: the portable rule, whatever the dispatch
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_8bit),        cmocka_unit_test(test_4bit),
      cmocka_unit_test(test_fp8),         cmocka_unit_test(test_4bit_sr),
      cmocka_unit_test(test_rank1),       cmocka_unit_test(test_unquantized_declined),
      cmocka_unit_test(test_every_float), cmocka_unit_test(test_every_float_8bit),
  };
  return LOWBIT_RUN_SELECTED(tests, argc, argv, nullptr, nullptr);
}
