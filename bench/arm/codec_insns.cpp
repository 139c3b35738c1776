// One codec function on one 256-element tile, `reps` times after a warm-up
// call, for counting the instructions it executes under an emulator
// (bench/arm/count_insns.sh: qemu-aarch64 -one-insn-per-tb with exec logging,
// the difference of two repetition counts). The portable path (codec.cpp with
// set_cpu_isa(CpuIsa::Portable), shaped_codec.cpp's rank-1 loop) or the NEON one
// (codec_neon.hpp) on typical moments: first moments normal * 1e-3, second
// moments squared normals * 1e-6, rank-1 scales the largest |x| of each 16.
//   bench_codec_insns list                 the case names
//   bench_codec_insns CASE REPS            e.g. neon.encode.8bit.first 10
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/codec.hpp"
#include "core/cpu_features.hpp"
#include "core/codec_neon.hpp"
#include "core/quant.hpp"
#include "core/shape.hpp"
#include "core/state.hpp"

using namespace lowbit;

namespace {

struct Buffers {
  std::vector<float> x, scale, out;
  std::vector<uint8_t> data;
  std::vector<float> scales;
  MomentView mv;
  Buffers(lowbit_state_format_t f, int moment) : x(kTile), scale(kTile), out(kTile), data(kTile), scales(2, 0.f) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (int i = 0; i < kTile; ++i) {
      const float g = normal(rng);
      x[size_t(i)] = moment ? g * g * 1e-6f : g * 1e-3f;
    }
    for (int i = 0; i < kTile; i += 16) {
      float m = 0.f;
      for (int j = 0; j < 16; ++j) m = std::fmax(m, std::fabs(x[size_t(i + j)]));
      for (int j = 0; j < 16; ++j) scale[size_t(i + j)] = m;
    }
    mv = adam_moment_view(f, moment, data.data(), scales.data());
    encode_moment_tile(mv, 0, kTile, x.data());  // codes to decode
  }
};

// The portable rank-1 loops of shaped_codec.cpp (decode_shaped_tile /
// encode_rank1_tile past their scales), element by element.
void portable_decode_rank1(const MomentView& mv, const float* scale, float* out) {
  const bool four = mv.format == LOWBIT_STATE_4BIT;
  for (int i = 0; i < kTile; ++i) out[i] = mv.map->values[load_code(mv.data, four, i)] * scale[i];
}
void portable_encode_rank1(const MomentView& mv, const float* scale, const float* in) {
  const bool four = mv.format == LOWBIT_STATE_4BIT;
  uint8_t* d = static_cast<uint8_t*>(mv.data);
  for (int i = 0; i < kTile; ++i) {
    const uint32_t code = uint32_t(rank1_code(*mv.map, mv.second, in[i], scale[i]));
    if (!four) {
      d[i] = uint8_t(code);
    } else {
      const int shift = 4 * (i & 1);
      d[i >> 1] = uint8_t((d[i >> 1] & ~(0xFu << shift)) | (code << shift));
    }
  }
}

struct Case {
  std::string name;
  lowbit_state_format_t format;
  int moment;
  std::function<void(Buffers&)> run;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"none", LOWBIT_STATE_8BIT, 0, [](Buffers&) {}});  // the harness's own instructions per call
  const struct {
    const char* name;
    lowbit_state_format_t f;
  } formats[] = {{"8bit", LOWBIT_STATE_8BIT}, {"4bit", LOWBIT_STATE_4BIT}, {"fp8", LOWBIT_STATE_FP8}};
  for (auto fm : formats)
    for (int moment = 0; moment < 2; ++moment) {
      const std::string tail = std::string(fm.name) + (moment ? ".second" : ".first");
      c.push_back({"portable.decode." + tail, fm.f, moment, [](Buffers& b) { decode_moment_tile(b.mv, 0, kTile, b.out.data()); }});
      c.push_back({"neon.decode." + tail, fm.f, moment, [](Buffers& b) { neon_decode_tile(b.mv, 0, b.out.data()); }});
      c.push_back({"portable.encode." + tail, fm.f, moment, [](Buffers& b) { encode_moment_tile(b.mv, 0, kTile, b.x.data()); }});
      c.push_back({"neon.encode." + tail, fm.f, moment, [](Buffers& b) { neon_encode_tile(b.mv, 0, b.x.data()); }});
      if (fm.f == LOWBIT_STATE_FP8) continue;
      c.push_back({"portable.decode_rank1." + tail, fm.f, moment,
                   [](Buffers& b) { portable_decode_rank1(b.mv, b.scale.data(), b.out.data()); }});
      c.push_back({"neon.decode_rank1." + tail, fm.f, moment,
                   [](Buffers& b) { neon_decode_rank1(b.mv, 0, kTile, b.scale.data(), b.out.data()); }});
      c.push_back({"portable.encode_rank1." + tail, fm.f, moment,
                   [](Buffers& b) { portable_encode_rank1(b.mv, b.scale.data(), b.x.data()); }});
      c.push_back({"neon.encode_rank1." + tail, fm.f, moment,
                   [](Buffers& b) { neon_encode_rank1(b.mv, 0, kTile, b.scale.data(), b.x.data()); }});
    }
  for (int moment = 0; moment < 2; ++moment) {
    const std::string tail = moment ? "4bit_sr.second" : "4bit_sr.first";
    c.push_back({"portable.encode." + tail, LOWBIT_STATE_4BIT_SR, moment,
                 [](Buffers& b) { encode_moment_tile_stochastic(b.mv, 0, kTile, b.x.data(), 0x243F6A8885A308D3ull); }});
    c.push_back({"neon.encode." + tail, LOWBIT_STATE_4BIT_SR, moment,
                 [](Buffers& b) { neon_encode_tile_sr(b.mv, 0, b.x.data(), 0x243F6A8885A308D3ull); }});
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  set_cpu_isa(CpuIsa::Portable);
  const std::vector<Case> all = cases();
  if (argc == 2 && std::strcmp(argv[1], "list") == 0) {
    for (const Case& c : all) std::printf("%s\n", c.name.c_str());
    return 0;
  }
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s list | CASE REPS\n", argv[0]);
    return 2;
  }
  for (const Case& c : all)
    if (c.name == argv[1]) {
      if (c.name.rfind("neon.", 0) == 0 && !neon_codec_supported()) {
        std::fprintf(stderr, "%s: no NEON codec in this build\n", argv[0]);
        return 2;
      }
      Buffers b(c.format, c.moment);
      c.run(b);  // warm-up: the tables are built once
      const int reps = std::atoi(argv[2]);
      for (int r = 0; r < reps; ++r) c.run(b);
      volatile uint8_t sink = b.data[0];
      (void)sink;
      return 0;
    }
  std::fprintf(stderr, "%s: no case '%s' (list: %s list)\n", argv[0], argv[1], argv[0]);
  return 2;
}
