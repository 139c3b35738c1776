#include "host_kernels.hpp"

#include <cmath>
#include <cstring>
#include <vector>

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

double host_worker_sum(const float* t, const float* e, float* x_out, int64_t n) {
  if (!e) {
    // No error yet: x = t + 0 (the same lanes and order as below).
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i < n; ++i) {
      const float x = t[i] + 0.0f;
      x_out[i] = x;
      acc[i & 7] += double(x) * double(x);
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
  // Eight independent lanes (a fixed order, so the result is reproducible).
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) {
      float x = t[i + k] + e[i + k];
      x_out[i + k] = x;
      acc[k] += double(x) * double(x);
    }
  }
  for (; i < n; ++i) {
    float x = t[i] + e[i];
    x_out[i] = x;
    acc[i & 7] += double(x) * double(x);
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
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
  double acc2[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const float fw = float(W);
  const int64_t used_bytes = (c + 7) / 8;
  for (int64_t b = 0; b < used_bytes; ++b) {
    // Sum over ranks in rank order, as the CUDA kernel does.
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int32_t j = 0; j < W; ++j) {
      const float* sg = kSign.v[recv[int64_t(j) * l.msg + 4 + b]];
      const float s = sc[size_t(j)];
      for (int k = 0; k < 8; ++k) acc[k] += sg[k] * s;
    }
    const int64_t base = b * 8;
    if (base + 8 <= c) {
      for (int k = 0; k < 8; ++k) {
        const float y = acc[k] / fw + z[base + k];
        y_out[base + k] = y;
        acc2[k] += double(y) * double(y);
      }
    } else {
      for (int k = 0; k < 8 && base + k < c; ++k) {
        const float y = acc[k] / fw + z[base + k];
        y_out[base + k] = y;
        acc2[k] += double(y) * double(y);
      }
    }
  }
  if (!finite) return NAN;
  return ((acc2[0] + acc2[1]) + (acc2[2] + acc2[3])) + ((acc2[4] + acc2[5]) + (acc2[6] + acc2[7]));
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
