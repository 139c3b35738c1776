// Encoding fp32 values that came out of a stored moment (a materialised
// checkpoint, another format or layout, read_moment) so that decoding and
// encoding again is a fixed point: reencode_moment (state.hpp).
//  - Blocks: one pass; a block's scale is fitted to its extreme (fitted_scale).
//    BF16 saturates at its largest value rather than round to Inf.
//  - Rank-1: each vector entry is fitted to both extremes of its slice, then
//    the codes. An entry can still drop once more when its slice's extremes
//    sit in elements whose scales other dims' entries set.
//  - Factored: the accumulators are means of the values, and v^ = (row / mean)
//    * col rounds, so a cycle may move them by an ulp.
// For these two the encoded state is cycled (decode, encode) until a cycle
// reproduces it: rank-1 entries only ever decrease and settle within a cycle
// or two; the factored accumulators wander by ulps for up to a few dozen
// cycles (each one pass over the values). The state returned is one that a
// cycle leaves unchanged; should the cycles repeat a set of states instead,
// it is the set's member of least hash, whichever member the cycling starts
// from, so that loading it again returns it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "codec.hpp"
#include "float16.hpp"
#include "quant.hpp"
#include "state.hpp"

namespace lowbit {
namespace {

// min { t >= 0 : fl(v t) >= a }, for a >= 0 and 0 < v: the smallest scale
// whose map value v decodes (v * scale, in float, as the codecs do) to at
// least a. a / v is within an ulp or two of it; the loops settle the rest.
float fit_scale(float a, float v) {
  if (!(a > 0.f)) return 0.f;
  float t = a / v;
  if (!std::isfinite(t)) return t;
  while (v * t < a) t = std::nextafter(t, INFINITY);
  for (float d = std::nextafter(t, 0.f); t > 0.f && v * d >= a; d = std::nextafter(t, 0.f)) t = d;
  return t;
}

// fitted_scale of the values x[0, n).
float fitted_block_scale(const float* x, int n, float vmax, float vmin, float absmax_divisor = 1.f) {
  uint32_t extreme[2] = {0u, 0u};  // the largest |x| bits with the sign bit clear, set
  for (int i = 0; i < n; ++i) {
    const uint32_t u = float_bits(x[i]);
    extreme[u >> 31] = umax(extreme[u >> 31], u & 0x7FFFFFFFu);
  }
  return fitted_scale(extreme[0], extreme[1], vmax, vmin, absmax_divisor, true);
}

void reencode_blocks(const MomentView& mv, int64_t numel, const float* values) {
  if (mv.format == LOWBIT_STATE_8BIT || mv.format == LOWBIT_STATE_4BIT) {
    const QMap& map = *mv.map;
    const int block = int(block_size(mv.format));
    const float vmax = map.values[map.n - 1], vmin = map.values[0];
    uint8_t* out = static_cast<uint8_t*>(mv.data);
    for (int64_t b = 0; b < numel; b += block) {
      const int n = int(std::min<int64_t>(block, numel - b));
      const float scale = fitted_block_scale(values + b, n, vmax, vmin);
      mv.scales[b / block] = scale;
      for (int i = 0; i < n; ++i) {  // the code search of the codecs, given the scale
        const float xn = normalize(values[b + i], scale);
        int c = bucket_code(map, xn);
        if (mv.second) c = floor_positive(map, c, xn);
        if (mv.format == LOWBIT_STATE_8BIT) {
          out[b + i] = uint8_t(c);
        } else {
          const int64_t e = b + i;
          uint8_t& byte = out[e / 2];
          byte = (e & 1) ? uint8_t((byte & 0x0F) | (c << 4)) : uint8_t((byte & 0xF0) | c);
        }
      }
      if (mv.format == LOWBIT_STATE_4BIT && (n & 1)) out[(b + n) / 2] &= 0x0F;  // odd tail: high nibble 0
    }
    return;
  }
  if (mv.format == LOWBIT_STATE_FP8) {
    uint8_t* out = static_cast<uint8_t*>(mv.data);
    for (int64_t b = 0; b < numel; b += kBlock8) {
      const int n = int(std::min<int64_t>(kBlock8, numel - b));
      // 448 (either sign) is the extreme code: fitted, 448 s reaches the
      // block's largest |x|; a non-finite block keeps the codec's absmax / 448.
      const float s = fitted_block_scale(values + b, n, kFp8Max, -kFp8Max, kFp8Max);
      mv.scales[b / kBlock8] = s;
      for (int i = 0; i < n; ++i) {
        uint8_t c = s > 0.f ? float_to_e4m3(values[b + i] / s) : uint8_t(0);
        out[b + i] = mv.second ? floor_positive_e4m3(c, values[b + i]) : c;
      }
    }
    return;
  }
  if (mv.format == LOWBIT_STATE_BF16) {  // round to nearest; beyond bf16's range its largest, never Inf
    uint16_t* out = static_cast<uint16_t*>(mv.data);
    for (int64_t i = 0; i < numel; ++i) out[i] = float_to_bf16_saturate(values[i]);
    return;
  }
  encode_moment(mv, numel, values);  // fp32: exact
}

// The stored bytes of a rank-1 or factored moment: codes or accumulators, then
// the rank-1 vectors (and their workspace half).
struct ShapedBytes {
  std::vector<uint8_t> data;
  std::vector<float> scales;
  ShapedBytes(size_t data_bytes, size_t scale_bytes) : data(data_bytes, 0), scales(scale_bytes / 4, 0.f) {}
  MomentView view(const MomentView& like) {
    MomentView v = like;
    v.data = data.data();
    v.scales = scales.data();
    return v;
  }
};

bool same_bytes(const MomentView& a, const MomentView& b, size_t data_bytes, size_t scale_bytes) {
  return std::memcmp(a.data, b.data, data_bytes) == 0 &&
         (scale_bytes == 0 || std::memcmp(a.scales, b.scales, scale_bytes) == 0);  // factored: no scales
}

// FNV-1a over a state's bytes: tells the states of a repeating cycle apart.
uint64_t state_hash(const MomentView& v, size_t data_bytes, size_t scale_bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  auto add = [&](const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001B3ull;
  };
  add(v.data, data_bytes);
  add(v.scales, scale_bytes);
  return h;
}

constexpr int kMaxCycles = 128;

void reencode_shaped(const MomentView& mv, const Shape& shape, int64_t numel, const float* values, bool via_bf16) {
  auto encode = [&](const MomentView& to, const float* x) {
    if (mv.norm == Norm::Rank1)
      encode_rank1_moment(to, shape, numel, x, true);
    else
      encode_moment(to, shape, numel, x);
  };
  encode(mv, values);
  const size_t data_bytes = size_t(moment_data_bytes(mv.format, mv.norm, shape, numel));
  const size_t scale_bytes = size_t(moment_scale_bytes(mv.format, mv.norm, shape, numel));
  ShapedBytes spare(data_bytes, scale_bytes);
  const MomentView next = spare.view(mv);
  std::vector<float> decoded(static_cast<size_t>(numel));
  // mv <- encode(decode(mv)); true when that changed nothing.
  auto cycle = [&] {
    decode_moment(mv, shape, numel, decoded.data());
    if (via_bf16)  // the values pass through a bf16 checkpoint: the fixed point is that cycle's
      for (float& x : decoded) x = bf16_to_float(float_to_bf16_saturate(x));
    encode(next, decoded.data());
    if (same_bytes(next, mv, data_bytes, scale_bytes)) return true;
    std::memcpy(mv.data, next.data, data_bytes);
    if (scale_bytes) std::memcpy(mv.scales, next.scales, scale_bytes);
    return false;
  };
  std::vector<uint64_t> seen{state_hash(mv, data_bytes, scale_bytes)};
  for (int k = 0; k < kMaxCycles; ++k) {
    if (cycle()) return;
    const uint64_t h = state_hash(mv, data_bytes, scale_bytes);
    const auto again = std::find(seen.begin(), seen.end(), h);
    if (again != seen.end()) {  // a repeating cycle: stop at its member of least hash
      const uint64_t least = *std::min_element(again, seen.end());
      for (uint64_t at = h, left = seen.size(); at != least && left > 0; --left) {
        if (cycle()) return;
        at = state_hash(mv, data_bytes, scale_bytes);
      }
      return;
    }
    seen.push_back(h);
  }
}

}  // namespace

float fitted_scale(uint32_t pos_bits, uint32_t neg_bits, float vmax, float vmin, float absmax_divisor,
                   bool largest_decides) {
  const float absmax = bits_float(umax(pos_bits, neg_bits));
  if (!std::isfinite(absmax)) return absmax / absmax_divisor;
  const float pos = bits_float(pos_bits), neg = bits_float(neg_bits);
  // A block whose largest magnitude is positive keeps the step's scale (its
  // extreme decodes exactly with the map's largest value 1). Otherwise the
  // negative extreme, ties included, sets it: e.g. a bf16 checkpoint rounds
  // a positive vmax-coded value and a negative vmin-coded one apart, and a
  // rule that looked at both would let that rounding move the scale again
  // at the next cycle. A rank-1 slice's positive extreme may decode below
  // its entry (another dim's smaller entry set its scale), so the entry
  // reaches both extremes; its cycles absorb such rounding.
  const float both = std::max(fit_scale(pos, vmax), vmin < 0.f ? fit_scale(neg, -vmin) : neg);
  const float s = largest_decides && pos > neg ? fit_scale(pos, vmax) : both;
  return std::isfinite(s) ? s : absmax / absmax_divisor;
}

void reencode_moment(const MomentView& mv, const Shape& shape, int64_t numel, const float* values, bool via_bf16) {
  if (mv.norm == Norm::Block)
    reencode_blocks(mv, numel, values);
  else
    reencode_shaped(mv, shape, numel, values, via_bf16);
}

}  // namespace lowbit
