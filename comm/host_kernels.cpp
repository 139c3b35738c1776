#include "host_kernels.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include "sumsq.hpp"

namespace lowbit {
namespace onebit {

void put_scale(uint8_t* msg, float scale) {
  uint32_t u;
  std::memcpy(&u, &scale, 4);
  msg[0] = uint8_t(u);
  msg[1] = uint8_t(u >> 8);
  msg[2] = uint8_t(u >> 16);
  msg[3] = uint8_t(u >> 24);
}

float get_scale(const uint8_t* msg) {
  uint32_t u = uint32_t(msg[0]) | (uint32_t(msg[1]) << 8) | (uint32_t(msg[2]) << 16) | (uint32_t(msg[3]) << 24);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace {

using sumsq::kLanes;
using sumsq::kRounds;
using sumsq::kSegment;
using sumsq::kTree;

// The sum of squares in the order of sumsq.hpp, segment by segment; a
// segment is computed as the device's block computes it: "thread" c
// accumulates lanes 8c .. 8c+7 over the rounds (in registers) and folds
// them, then tree256 over the threads.
//   lanes(base, m, a): adds the squares of the m <= 8 elements from `base`
//   to a[0 .. m) (and does the element-wise work that goes with them).
class SumOfSquares {
 public:
  template <class Lanes>
  void add_segment(int64_t s0, int64_t s1, Lanes&& lanes) {
    double t[kTree];
    if (s1 - s0 == kSegment) {
      for (int c = 0; c < kTree; ++c) {
        double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int r = 0; r < kRounds; ++r) lanes(s0 + int64_t(r) * kLanes + 8 * c, 8, a);
        t[c] = sumsq::fold8(a);
      }
    } else {
      for (int c = 0; c < kTree; ++c) {
        double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int r = 0; r < kRounds; ++r) {
          const int64_t base = s0 + int64_t(r) * kLanes + 8 * c;
          if (base >= s1) break;
          lanes(base, s1 - base < 8 ? int(s1 - base) : 8, a);
        }
        t[c] = sumsq::fold8(a);
      }
    }
    acc_[segment_++ % kTree] += sumsq::tree256(t);
  }
  double total() {
    double t[kTree];
    for (int i = 0; i < kTree; ++i) t[i] = acc_[i];
    return sumsq::tree256(t);
  }

 private:
  double acc_[kTree] = {};
  int64_t segment_ = 0;
};

}  // namespace

double host_worker_sum(const float* t, const float* e, float* x_out, int64_t n) {
  SumOfSquares sum;
  for (int64_t s0 = 0; s0 < n; s0 += kSegment) {
    const int64_t s1 = n - s0 < kSegment ? n : s0 + kSegment;
    if (e) {
      sum.add_segment(s0, s1, [&](int64_t base, int m, double* a) {
        if (m == 8) {
          for (int k = 0; k < 8; ++k) {
            const float x = t[base + k] + e[base + k];
            x_out[base + k] = x;
            a[k] += double(x) * double(x);
          }
        } else {
          for (int k = 0; k < m; ++k) {
            const float x = t[base + k] + e[base + k];
            x_out[base + k] = x;
            a[k] += double(x) * double(x);
          }
        }
      });
    } else {
      // No error yet: x = t + 0 (as the device, which adds its zeroed error).
      sum.add_segment(s0, s1, [&](int64_t base, int m, double* a) {
        for (int k = 0; k < m; ++k) {
          const float x = t[base + k] + 0.0f;
          x_out[base + k] = x;
          a[k] += double(x) * double(x);
        }
      });
    }
  }
  return sum.total();
}

float scale_from_sumsq(double sumsq, int64_t count) {
  if (!std::isfinite(sumsq)) return NAN;
  if (count <= 0) return 0.0f;
  return float(std::sqrt(sumsq / double(count)));
}

namespace {

// kSign[byte][k] = +1 if bit k of byte is set, else -1: a branch-free,
// vectorisable decode (scale * +-1 is exact, so this equals signed_scale()).
struct SignTable {
  alignas(64) float v[256][8];
  SignTable() {
    for (int b = 0; b < 256; ++b)
      for (int k = 0; k < 8; ++k) v[b][k] = ((b >> k) & 1) ? 1.0f : -1.0f;
  }
};
const SignTable kSign;

// Signs of 8 values (bit k = sign_bit(x[k])).
inline unsigned pack8(const float* x) {
  unsigned byte = 0;
  for (int k = 0; k < 8; ++k) byte |= unsigned(x[k] >= 0.0f) << k;
  return byte;
}

}  // namespace

void host_worker_pack(float* x, float scale, const Layout& l, uint8_t* send) {
  const int64_t n = l.n;
  for (int32_t r = 0; r < l.world; ++r) {
    uint8_t* dst = send + int64_t(r) * l.msg;
    put_scale(dst, scale);
    dst += 4;
    const int64_t begin = int64_t(r) * l.chunk;
    for (int64_t b = 0; b < l.chunk_bytes; ++b) {
      const int64_t base = begin + b * 8;
      if (base + 8 <= n) {
        float* v = x + base;
        const unsigned byte = pack8(v);
        const float* sg = kSign.v[byte];
        for (int k = 0; k < 8; ++k) v[k] = v[k] - sg[k] * scale;
        dst[b] = uint8_t(byte);
      } else {
        unsigned byte = 0;
        for (int k = 0; k < 8 && base + k < n; ++k) {
          const float v = x[base + k];
          const bool bit = sign_bit(v);
          x[base + k] = v - signed_scale(bit, scale);
          byte |= unsigned(bit) << k;
        }
        dst[b] = uint8_t(byte);
      }
    }
  }
}

double host_server_sum(const uint8_t* recv, const float* z, float* y_out, const Layout& l) {
  const int64_t c = l.server_numel();
  const int32_t W = l.world;
  std::vector<float> sc(static_cast<size_t>(W));
  bool finite = true;
  for (int32_t j = 0; j < W; ++j) {
    sc[size_t(j)] = get_scale(recv + int64_t(j) * l.msg);
    if (!std::isfinite(sc[size_t(j)])) finite = false;
  }
  const float fw = float(W);
  SumOfSquares sum;
  for (int64_t s0 = 0; s0 < c; s0 += kSegment) {
    const int64_t s1 = c - s0 < kSegment ? c : s0 + kSegment;
    // The 8 elements from `base` come from one byte of every message.
    sum.add_segment(s0, s1, [&](int64_t base, int m, double* a) {
      const int64_t b = base / 8;
      // Sum over ranks in rank order, as the CUDA kernel does.
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int32_t j = 0; j < W; ++j) {
        const float* sg = kSign.v[recv[int64_t(j) * l.msg + 4 + b]];
        const float s = sc[size_t(j)];
        for (int k = 0; k < 8; ++k) acc[k] += sg[k] * s;
      }
      if (m == 8) {
        for (int k = 0; k < 8; ++k) {
          const float y = acc[k] / fw + z[base + k];
          y_out[base + k] = y;
          a[k] += double(y) * double(y);
        }
      } else {
        for (int k = 0; k < m; ++k) {
          const float y = acc[k] / fw + z[base + k];
          y_out[base + k] = y;
          a[k] += double(y) * double(y);
        }
      }
    });
  }
  if (!finite) return NAN;
  return sum.total();
}

void host_server_pack(float* y, float scale, const Layout& l, uint8_t* gsend) {
  const int64_t c = l.server_numel();
  put_scale(gsend, scale);
  for (int64_t b = 0; b < l.chunk_bytes; ++b) {
    const int64_t base = b * 8;
    if (base + 8 <= c) {
      float* v = y + base;
      const unsigned byte = pack8(v);
      const float* sg = kSign.v[byte];
      for (int k = 0; k < 8; ++k) v[k] = v[k] - sg[k] * scale;
      gsend[4 + b] = uint8_t(byte);
    } else {
      unsigned byte = 0;
      for (int k = 0; k < 8 && base + k < c; ++k) {
        const float v = y[base + k];
        const bool bit = sign_bit(v);
        y[base + k] = v - signed_scale(bit, scale);
        byte |= unsigned(bit) << k;
      }
      gsend[4 + b] = uint8_t(byte);
    }
  }
}

bool host_gathered_finite(const uint8_t* grecv, const Layout& l) {
  for (int32_t r = 0; r < l.world; ++r)
    if (!std::isfinite(get_scale(grecv + int64_t(r) * l.msg))) return false;
  return true;
}

void host_decode(const uint8_t* grecv, const Layout& l, float* out) {
  for (int32_t r = 0; r < l.world; ++r) {
    const uint8_t* m = grecv + int64_t(r) * l.msg;
    const float s = get_scale(m);
    const int64_t c = l.real_in_chunk(r);
    float* o = out + int64_t(r) * l.chunk;
    int64_t i = 0;
    for (; i + 8 <= c; i += 8) {
      const float* sg = kSign.v[m[4 + i / 8]];
      for (int k = 0; k < 8; ++k) o[i + k] = sg[k] * s;
    }
    for (; i < c; ++i) o[i] = signed_scale((m[4 + i / 8] >> (i & 7)) & 1u, s);
  }
}

}  // namespace onebit
}  // namespace lowbit
