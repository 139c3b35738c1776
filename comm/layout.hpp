// Buffer layout of the 1-bit compressed allreduce (see docs/COMMUNICATOR.md):
// n real elements padded to N (a multiple of 8 * world), W chunks of C = N / W
// elements, one message per chunk = a 4-byte fp32 scale followed by C / 8
// bytes of sign bits (bit k of byte b = element 8b + k of the chunk, 1 = +1).
#pragma once
#include <cstdint>

#include "core/hd.hpp"

namespace lowbit {
namespace onebit {

// The most elements a compressed allreduce takes: 2^55 (its bytes, the
// padding and the error blob stay far from INT64_MAX).
constexpr int64_t kMaxNumel = int64_t(1) << 55;

struct Layout {
  int64_t n = 0;       // real elements
  int64_t padded = 0;  // N
  int64_t chunk = 0;   // C = N / world
  int64_t chunk_bytes = 0;  // C / 8
  int64_t msg = 0;     // 4 + C / 8
  int32_t world = 1;
  int32_t rank = 0;

  static Layout make(int64_t n, int32_t world, int32_t rank) {
    Layout l;
    const int64_t unit = int64_t(8) * world;
    l.n = n;
    l.padded = (n + unit - 1) / unit * unit;
    l.chunk = l.padded / world;
    l.chunk_bytes = l.chunk / 8;
    l.msg = 4 + l.chunk_bytes;
    l.world = world;
    l.rank = rank;
    return l;
  }
  // Real elements of chunk r: min(max(n - r*C, 0), C).
  int64_t real_in_chunk(int32_t r) const {
    int64_t v = n - int64_t(r) * chunk;
    return v < 0 ? 0 : (v > chunk ? chunk : v);
  }
  int64_t server_numel() const { return real_in_chunk(rank); }
};

// The sign rule: +1 for v >= 0 (both zeros), -1 otherwise.
LOWBIT_HD bool sign_bit(float v) { return v >= 0.0f; }
LOWBIT_HD float signed_scale(bool bit, float scale) { return bit ? scale : -scale; }

}  // namespace onebit
}  // namespace lowbit
