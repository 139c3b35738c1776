// The per-element arithmetic of the 1-bit allreduce's host passes
// (host_kernels.cpp), once per instruction set: portable C++ loops (also
// compiled for AVX2) and AVX-512 intrinsics for the same operations (every
// fp32 and fp64 operation identical and in the same order, see
// host_kernels.hpp and sumsq.hpp). Sources give the value a pass works on,
// sinks take the sign bits. Included by host_kernels.cpp only.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12 flags the intrinsics' own "undefined" self-initialisations under
// target attributes (-Wuninitialized, GCC PR 105593): not ours, hidden here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#define LOWBIT_COMM_X86 1
#define LOWBIT_AVX512_FN __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
#define LOWBIT_AVX2_FN __attribute__((target("avx2")))
#else
#define LOWBIT_COMM_X86 0
#endif
// The portable loops are inlined into AVX2 copies of themselves (struct Avx2).
#if defined(__GNUC__) || defined(__clang__)
#define LOWBIT_INLINE inline __attribute__((always_inline))
#else
#define LOWBIT_INLINE inline
#endif

#include "host_kernels.hpp"
#include "sumsq.hpp"

namespace lowbit {
namespace onebit {
namespace {

using sumsq::kLanes;
using sumsq::kRounds;
using sumsq::kSegment;
using sumsq::kTree;

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Sign bits of elements i .. i+cnt-1 (cnt <= 16) from the bytes at p (bit k
// of byte b = element 8b + k); reads only the bytes those elements use.
inline unsigned load_bits16(const uint8_t* p, int cnt) {
  return cnt > 8 ? unsigned(p[0]) | (unsigned(p[1]) << 8) : unsigned(p[0]);
}

LOWBIT_INLINE uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// kFlip.v[b][k]: the sign bit to flip for element k of a byte b of sign bits
// (0 where the bit is set, 0x80000000 where it is not): bits(s) ^ flip is
// the bits of (bit ? s : -s), a table lookup and an xor that SSE2 vectorises.
struct FlipTable {
  alignas(64) uint32_t v[256][8];
  FlipTable() {
    for (int b = 0; b < 256; ++b)
      for (int k = 0; k < 8; ++k) v[b][k] = ((b >> k) & 1) ? 0u : 0x80000000u;
  }
};
const FlipTable kFlip;

// out[k] = bit k of b ? s : -s, sb = the bits of s.
LOWBIT_INLINE void pm8(uint32_t sb, unsigned b, float* out) {
  uint32_t u[8];
  for (int k = 0; k < 8; ++k) u[k] = sb ^ kFlip.v[b][k];
  std::memcpy(out, u, sizeof u);
}

#if LOWBIT_COMM_X86
// Prefetch into L2 of the 64 floats (4 lines) from p; never faults.
LOWBIT_AVX512_FN inline void prefetch64(const float* p) {
  for (int q = 0; q < 4; ++q) _mm_prefetch(reinterpret_cast<const char*>(p + 16 * q), _MM_HINT_T1);
}
#endif

// ---- sources: element i of a pass, in scalar form (at), the 8 elements
// from i (load8, plain loops the compiler vectorises) and, for AVX-512, the
// 64 elements from i (load4: four vectors) or the first v <= 16 of the 16
// elements from i, the rest zero (load_n).

struct SrcX {  // stored values
  const float* x;
  float at(int64_t i) const { return x[i]; }
  LOWBIT_INLINE void load8(int64_t i, float* v) const {
    for (int k = 0; k < 8; ++k) v[k] = x[i + k];
  }
#if LOWBIT_COMM_X86
  LOWBIT_AVX512_FN void load4(int64_t i, __m512* v) const {
    for (int q = 0; q < 4; ++q) v[q] = _mm512_loadu_ps(x + i + 16 * q);
  }
  LOWBIT_AVX512_FN __m512 load_n(__mmask16 m, int64_t i, int) const { return _mm512_maskz_loadu_ps(m, x + i); }
  LOWBIT_AVX512_FN void prefetch(int64_t i) const { prefetch64(x + i); }
#endif
};

// An error buffer as a pass reads it: stored (ErrStored), or rebuilt from the
// value x of the call that made it and that call's scale s (ErrLazy): e = x -
// (x >= 0 ? s : -s), the operation the pack stores, so the same bits. The
// 16-lane loads give 0 in the lanes outside m.
struct ErrStored {
  const float* e;
  float at(int64_t i) const { return e[i]; }
  LOWBIT_INLINE void load8(int64_t i, float* v) const {
    for (int k = 0; k < 8; ++k) v[k] = e[i + k];
  }
#if LOWBIT_COMM_X86
  LOWBIT_AVX512_FN __m512 load16(int64_t i) const { return _mm512_loadu_ps(e + i); }
  LOWBIT_AVX512_FN __m512 load_n(__mmask16 m, int64_t i) const { return _mm512_maskz_loadu_ps(m, e + i); }
  LOWBIT_AVX512_FN void prefetch(int64_t i) const { prefetch64(e + i); }
#endif
};

struct ErrLazy {
  const float* x;
  float s;
  float at(int64_t i) const { return x[i] - signed_scale(sign_bit(x[i]), s); }
  LOWBIT_INLINE void load8(int64_t i, float* v) const {
    for (int k = 0; k < 8; ++k) v[k] = at(i + k);
  }
#if LOWBIT_COMM_X86
  LOWBIT_AVX512_FN __m512 load16(int64_t i) const {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __mmask16 k = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GE_OQ);
    return _mm512_sub_ps(v, _mm512_mask_blend_ps(k, _mm512_set1_ps(-s), _mm512_set1_ps(s)));
  }
  LOWBIT_AVX512_FN __m512 load_n(__mmask16 m, int64_t i) const {
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    const __mmask16 k = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GE_OQ);
    return _mm512_maskz_sub_ps(m, v, _mm512_mask_blend_ps(k, _mm512_set1_ps(-s), _mm512_set1_ps(s)));
  }
  LOWBIT_AVX512_FN void prefetch(int64_t i) const { prefetch64(x + i); }
#endif
};

// No error: the compressed reduce-scatter's server, whose value is the
// average alone (y = a + 0, the bits of a: the sum starts at +0 and never
// comes out as -0, so a is never -0 either).
struct ErrZero {
  float at(int64_t) const { return 0.0f; }
  LOWBIT_INLINE void load8(int64_t, float* v) const {
    for (int k = 0; k < 8; ++k) v[k] = 0.0f;
  }
#if LOWBIT_COMM_X86
  LOWBIT_AVX512_FN __m512 load16(int64_t) const { return _mm512_setzero_ps(); }
  LOWBIT_AVX512_FN __m512 load_n(__mmask16, int64_t) const { return _mm512_setzero_ps(); }
  LOWBIT_AVX512_FN void prefetch(int64_t) const {}
#endif
};

template <class E>
struct SrcTE {  // x = t + e
  const float* t;
  E e;
  float at(int64_t i) const { return t[i] + e.at(i); }
  LOWBIT_INLINE void load8(int64_t i, float* v) const {
    float q[8];
    e.load8(i, q);
    for (int k = 0; k < 8; ++k) v[k] = t[i + k] + q[k];
  }
#if LOWBIT_COMM_X86
  LOWBIT_AVX512_FN void load4(int64_t i, __m512* v) const {
    for (int q = 0; q < 4; ++q) v[q] = _mm512_add_ps(_mm512_loadu_ps(t + i + 16 * q), e.load16(i + 16 * q));
  }
  LOWBIT_AVX512_FN __m512 load_n(__mmask16 m, int64_t i, int) const {
    return _mm512_add_ps(_mm512_maskz_loadu_ps(m, t + i), e.load_n(m, i));
  }
  LOWBIT_AVX512_FN void prefetch(int64_t i) const { prefetch64(t + i), e.prefetch(i); }
#endif
};

struct SrcT0 {  // x = t + 0 (no error yet; as the device, which adds its zeroed error)
  const float* t;
  float at(int64_t i) const { return t[i] + 0.0f; }
  LOWBIT_INLINE void load8(int64_t i, float* v) const {
    for (int k = 0; k < 8; ++k) v[k] = t[i + k] + 0.0f;
  }
#if LOWBIT_COMM_X86
  LOWBIT_AVX512_FN void load4(int64_t i, __m512* v) const {
    for (int q = 0; q < 4; ++q) v[q] = _mm512_add_ps(_mm512_loadu_ps(t + i + 16 * q), _mm512_setzero_ps());
  }
  LOWBIT_AVX512_FN __m512 load_n(__mmask16 m, int64_t i, int) const {
    return _mm512_add_ps(_mm512_maskz_loadu_ps(m, t + i), _mm512_setzero_ps());
  }
  LOWBIT_AVX512_FN void prefetch(int64_t i) const { prefetch64(t + i); }
#endif
};

// y = (sum over ranks j in rank order of +-scale_j) / W + z, element i of
// this rank's chunk (message j, from rank j, holds this rank's chunk: its
// sign bits at recv + j * msg + 4).
template <class E>
struct SrcServer {
  const uint8_t* bits;  // recv + 4
  int64_t msg;
  int32_t world;
  const float* pos;  // scale_j
  const float* neg;  // -scale_j
  float fw;
  float inv_fw;  // 1 / W when W is a power of two (exact), else 0
  E z;
  float at(int64_t i) const {
    float acc = 0.0f;
    for (int32_t j = 0; j < world; ++j) acc += ((bits[j * msg + i / 8] >> (i & 7)) & 1u) ? pos[j] : neg[j];
    return acc / fw + z.at(i);
  }
  LOWBIT_INLINE void load8(int64_t i, float* v) const {  // i a multiple of 8: one byte per message
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const uint8_t* p = bits + uint64_t(i) / 8;
    for (int32_t j = 0; j < world; ++j, p += msg) {
      float q[8];
      pm8(float_bits(pos[j]), *p, q);
      for (int k = 0; k < 8; ++k) acc[k] += q[k];
    }
    float zk[8];
    z.load8(i, zk);
    for (int k = 0; k < 8; ++k) v[k] = acc[k] / fw + zk[k];
  }
#if LOWBIT_COMM_X86
  // Elements i .. i+63 (i a multiple of 8): one 8-byte load per message.
  LOWBIT_AVX512_FN void load4(int64_t i, __m512* v) const {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    const uint8_t* p = bits + uint64_t(i) / 8;
    for (int32_t j = 0; j < world; ++j, p += msg) {
      uint64_t m;
      std::memcpy(&m, p, 8);
      const __m512 sp = _mm512_set1_ps(pos[j]), sn = _mm512_set1_ps(neg[j]);
      for (int q = 0; q < 4; ++q) acc[q] = _mm512_add_ps(acc[q], _mm512_mask_blend_ps(__mmask16(m >> (16 * q)), sn, sp));
    }
    if (inv_fw != 0.0f) {  // W a power of two: acc * (1/W) is acc / W exactly rounded, as the division
      const __m512 w = _mm512_set1_ps(inv_fw);
      for (int q = 0; q < 4; ++q) v[q] = _mm512_add_ps(_mm512_mul_ps(acc[q], w), z.load16(i + 16 * q));
    } else {
      const __m512 w = _mm512_set1_ps(fw);
      for (int q = 0; q < 4; ++q) v[q] = _mm512_add_ps(_mm512_div_ps(acc[q], w), z.load16(i + 16 * q));
    }
  }
  // The first v <= 16 elements from i, reading only their bytes.
  LOWBIT_AVX512_FN __m512 load_n(__mmask16 m, int64_t i, int v) const {
    __m512 acc = _mm512_setzero_ps();
    const uint8_t* p = bits + uint64_t(i) / 8;
    for (int32_t j = 0; j < world; ++j, p += msg)
      acc = _mm512_add_ps(acc, _mm512_mask_blend_ps(__mmask16(load_bits16(p, v)), _mm512_set1_ps(neg[j]),
                                                    _mm512_set1_ps(pos[j])));
    return _mm512_add_ps(_mm512_div_ps(acc, _mm512_set1_ps(fw)), z.load_n(m, i));
  }
  LOWBIT_AVX512_FN void prefetch(int64_t i) const { z.prefetch(i); }
#endif
};

// ---- sign sinks: where a sum-of-squares pass writes the sign bits of what it
// reads, for the elements of its full segments (i a multiple of 8; put64: of
// 64). NoSink: nowhere (the sum alone). MsgSink: into the sign bytes of W
// messages of `msg` bytes, chunk r (elements r * chunk ..) after the 4-byte
// scale of message r.

struct NoSink {
  static constexpr bool kActive = false;
  void put8(int64_t, unsigned) const {}
  void put64(int64_t, uint64_t) const {}
};

struct MsgSink {
  static constexpr bool kActive = true;
  uint8_t* msgs;
  int64_t msg;
  int64_t chunk;
  double inv_chunk;  // 1 / chunk, for the chunk of an element without a division
  MsgSink(uint8_t* m, int64_t msg_bytes, int64_t chunk_elems)
      : msgs(m), msg(msg_bytes), chunk(chunk_elems), inv_chunk(1.0 / double(chunk_elems)) {}
  int64_t chunk_of(int64_t i) const {
    int64_t r = int64_t(double(i) * inv_chunk);
    if (r * chunk > i) --r;
    if ((r + 1) * chunk <= i) ++r;
    return r;
  }
  uint8_t* byte_of(int64_t r, int64_t i) const { return msgs + r * msg + 4 + (i - r * chunk) / 8; }
  void put8(int64_t i, unsigned b) const { *byte_of(chunk_of(i), i) = uint8_t(b); }
  void put64(int64_t i, uint64_t m) const {
    const int64_t r = chunk_of(i);
    if (i + 64 <= (r + 1) * chunk) {
      std::memcpy(byte_of(r, i), &m, 8);
    } else {  // the group crosses into the next chunk's message
      for (int k = 0; k < 8; ++k) put8(i + 8 * k, unsigned(m >> (8 * k)) & 0xFFu);
    }
  }
};

// ---- portable kernels (also the partial last segment of every ISA)

// Sum of squares of the `len` <= kSegment elements from s0 (one segment of
// sumsq.hpp), storing each value to out[i] when out is given.
template <class Src>
double segment_scalar(const Src& src, int64_t s0, int64_t len, float* out) {
  double t[kTree];
  for (int c = 0; c < kTree; ++c) {
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int r = 0; r < kRounds; ++r) {
      const int64_t base = int64_t(r) * kLanes + 8 * c;
      if (base >= len) break;
      const int m = len - base < 8 ? int(len - base) : 8;
      for (int k = 0; k < m; ++k) {
        const int64_t i = s0 + base + k;
        const float v = src.at(i);
        if (out) out[i] = v;
        a[k] += double(v) * double(v);
      }
    }
    t[c] = sumsq::fold8(a);
  }
  return sumsq::tree256(t);
}

struct Portable {
  static constexpr bool kStreams = false;
  // One full segment: "thread" c's lanes 8c .. 8c+7, one load8 per round;
  // each 8 values' sign bits to `sink`. (Stream: AVX-512 only.)
  template <class Src, bool Store, class Sink = NoSink, bool Stream = false>
  LOWBIT_INLINE static double segment(const Src& src, int64_t s0, float* out, const Sink& sink = {}) {
    double t[kTree];
    for (int c = 0; c < kTree; ++c) {
      double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int r = 0; r < kRounds; ++r) {
        const int64_t i = s0 + int64_t(r) * kLanes + 8 * c;
        float v[8];
        src.load8(i, v);
        if (Store)
          for (int k = 0; k < 8; ++k) out[i + k] = v[k];
        if (Sink::kActive) {
          unsigned byte = 0;
          for (int k = 0; k < 8; ++k) byte |= unsigned(sign_bit(v[k])) << k;
          sink.put8(i, byte);
        }
        for (int k = 0; k < 8; ++k) a[k] += double(v[k]) * double(v[k]);
      }
      t[c] = sumsq::fold8(a);
    }
    return sumsq::tree256(t);
  }

  // Elements [i0, i1) (i0, i1 multiples of 8; elements >= valid are padding:
  // bit 0, nothing stored): bits into bits[0 .. (i1 - i0) / 8), new errors
  // into err[i]. err may be the source's own buffer (element-wise in place).
  template <class Src>
  LOWBIT_INLINE static void pack(const Src& src, float* err, float scale, int64_t i0, int64_t i1, int64_t valid,
                                 uint8_t* bits, bool /*stream*/) {
    const float pos = scale, neg = -scale;
    const uint32_t sb = float_bits(scale);
    int64_t base = i0;
    for (const int64_t full = min64(i1, valid); base + 8 <= full; base += 8) {
      float v[8], q[8];
      src.load8(base, v);
      unsigned byte = 0;
      for (int k = 0; k < 8; ++k) byte |= unsigned(sign_bit(v[k])) << k;
      pm8(sb, byte, q);
      for (int k = 0; k < 8; ++k) err[base + k] = v[k] - q[k];
      *bits++ = uint8_t(byte);
    }
    for (; base < i1; base += 8) {
      const int m = base < valid ? int(min64(8, valid - base)) : 0;
      unsigned byte = 0;
      for (int k = 0; k < m; ++k) {
        const float v = src.at(base + k);
        const bool bit = sign_bit(v);
        err[base + k] = v - (bit ? pos : neg);
        byte |= unsigned(bit) << k;
      }
      *bits++ = uint8_t(byte);
    }
  }

  // out[i0 .. i1) from the bits at bits[0 ..] (i0 a multiple of 8).
  LOWBIT_INLINE static void decode(const uint8_t* bits, float scale, float* out, int64_t i0, int64_t i1,
                                   bool /*stream*/) {
    const float pos = scale, neg = -scale;
    const uint32_t sb = float_bits(scale);
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) pm8(sb, *bits++, out + i);
    for (int k = 0; i < i1; ++i, ++k) out[i] = ((bits[0] >> k) & 1u) ? pos : neg;
  }
};

#if LOWBIT_COMM_X86
// The portable loops compiled for AVX2 (x86 CPUs without AVX-512): the same
// element-wise operations, vectorised 8 wide by the compiler.
struct Avx2 {
  static constexpr bool kStreams = false;
  template <class Src, bool Store, class Sink = NoSink, bool Stream = false>
  LOWBIT_AVX2_FN static double segment(const Src& src, int64_t s0, float* out, const Sink& sink = {}) {
    return Portable::segment<Src, Store, Sink>(src, s0, out, sink);
  }
  template <class Src>
  LOWBIT_AVX2_FN static void pack(const Src& src, float* err, float scale, int64_t i0, int64_t i1, int64_t valid,
                                  uint8_t* bits, bool stream) {
    Portable::pack(src, err, scale, i0, i1, valid, bits, stream);
  }
  LOWBIT_AVX2_FN static void decode(const uint8_t* bits, float scale, float* out, int64_t i0, int64_t i1,
                                    bool stream) {
    Portable::decode(bits, scale, out, i0, i1, stream);
  }
};
#endif

// ---- AVX-512 kernels

#if LOWBIT_COMM_X86
// sumsq::fold8 of the 8 lanes of a: ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)).
LOWBIT_AVX512_FN inline double fold8(__m512d a) {
  const __m512d p = _mm512_add_pd(a, _mm512_permute_pd(a, 0x55));        // p[2k] = a[2k] + a[2k+1]
  const __m512d q = _mm512_add_pd(p, _mm512_shuffle_f64x2(p, p, 0xB1));  // q[0] = p0 + p2, q[4] = p4 + p6
  return _mm_cvtsd_f64(_mm512_castpd512_pd128(q)) + _mm_cvtsd_f64(_mm512_extractf64x2_pd(q, 2));
}

struct Avx512 {
  static constexpr bool kStreams = true;
  // One full segment: the lanes 8c .. 8c+7 of "thread" c are the low or high
  // half of one of the four vectors of the 64-lane group g = c / 8; lane
  // sums over the rounds in order (the first round's square is the sum
  // itself: +0 + v*v == v*v for v*v >= +0 or NaN), then fold8 per thread.
  // The sign bits of each 64 consecutive values go to `sink`; Stream: the
  // stores bypass the caches (out + s0 64-byte aligned).
  template <class Src, bool Store, class Sink = NoSink, bool Stream = false>
  LOWBIT_AVX512_FN static double segment(const Src& src, int64_t s0, float* out, const Sink& sink = {}) {
    alignas(64) double t[kTree];
    for (int g = 0; g < kLanes / 64; ++g) {  // lanes 64g .. 64g+63: "threads" 8g .. 8g+7
      __m512d a[8];
      for (int r = 0; r < kRounds; ++r) {
        const int64_t i = s0 + int64_t(r) * kLanes + 64 * g;
        // The rounds are 4 streams 8 KiB apart per array: the hardware
        // prefetcher alone leaves reads well short of a plain stream's rate.
        src.prefetch(i + kSegment);
        __m512 v[4];
        src.load4(i, v);
        if (Sink::kActive) {
          uint64_t m = 0;
          for (int q = 0; q < 4; ++q)
            m |= uint64_t(_mm512_cmp_ps_mask(v[q], _mm512_setzero_ps(), _CMP_GE_OQ)) << (16 * q);
          sink.put64(i, m);
        }
        for (int q = 0; q < 4; ++q) {
          if (Store && Stream) _mm512_stream_ps(out + i + 16 * q, v[q]);
          else if (Store) _mm512_storeu_ps(out + i + 16 * q, v[q]);
          const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v[q]));
          const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v[q], 1));
          if (r == 0) {
            a[2 * q] = _mm512_mul_pd(lo, lo);
            a[2 * q + 1] = _mm512_mul_pd(hi, hi);
          } else {
            a[2 * q] = _mm512_add_pd(a[2 * q], _mm512_mul_pd(lo, lo));
            a[2 * q + 1] = _mm512_add_pd(a[2 * q + 1], _mm512_mul_pd(hi, hi));
          }
        }
      }
      for (int k = 0; k < 8; ++k) t[8 * g + k] = fold8(a[k]);
    }
    if (Stream) _mm_sfence();
    return sumsq::tree256(t);
  }

  // Stores of 16 floats at p: plain (kPlain), or streaming (non-temporal,
  // bypassing the caches) as one 64-byte or two 32-byte stores; p's
  // alignment fixes which (pack and decode advance by 64 elements, so it
  // does not change along a run).
  enum { kPlain = 0, kStream32 = 1, kStream64 = 2 };
  template <int S>
  LOWBIT_AVX512_FN static void store16(float* p, __m512 v) {
    if (S == kStream64) {
      _mm512_stream_ps(p, v);
    } else if (S == kStream32) {
      _mm256_stream_ps(p, _mm512_castps512_ps256(v));
      _mm256_stream_ps(p + 8, _mm512_extractf32x8_ps(v, 1));
    } else {
      _mm512_storeu_ps(p, v);
    }
  }
  static int store_kind(const float* p, bool stream) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    return !stream ? kPlain : (a % 64 == 0 ? kStream64 : (a % 32 == 0 ? kStream32 : kPlain));
  }

  template <int S, class Src>
  LOWBIT_AVX512_FN static int64_t pack64(const Src& src, float* err, float scale, int64_t i, int64_t end,
                                         uint8_t* bits) {
    const __m512 zero = _mm512_setzero_ps(), pos = _mm512_set1_ps(scale), neg = _mm512_set1_ps(-scale);
    for (; i + 64 <= end; i += 64, bits += 8) {
      __m512 v[4];
      src.load4(i, v);
      const __m512 v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3];
      const __mmask16 k0 = _mm512_cmp_ps_mask(v0, zero, _CMP_GE_OQ), k1 = _mm512_cmp_ps_mask(v1, zero, _CMP_GE_OQ),
                      k2 = _mm512_cmp_ps_mask(v2, zero, _CMP_GE_OQ), k3 = _mm512_cmp_ps_mask(v3, zero, _CMP_GE_OQ);
      store16<S>(err + i, _mm512_sub_ps(v0, _mm512_mask_blend_ps(k0, neg, pos)));
      store16<S>(err + i + 16, _mm512_sub_ps(v1, _mm512_mask_blend_ps(k1, neg, pos)));
      store16<S>(err + i + 32, _mm512_sub_ps(v2, _mm512_mask_blend_ps(k2, neg, pos)));
      store16<S>(err + i + 48, _mm512_sub_ps(v3, _mm512_mask_blend_ps(k3, neg, pos)));
      const uint64_t m = uint64_t(k0) | (uint64_t(k1) << 16) | (uint64_t(k2) << 32) | (uint64_t(k3) << 48);
      std::memcpy(bits, &m, 8);
    }
    if (S != kPlain) _mm_sfence();
    return i;
  }

  // stream: write the errors with non-temporal stores where aligned.
  template <class Src>
  LOWBIT_AVX512_FN static void pack(const Src& src, float* err, float scale, int64_t i0, int64_t i1, int64_t valid,
                                    uint8_t* bits, bool stream) {
    const int64_t full = min64(i1, valid);
    int64_t i;
    switch (store_kind(err + i0, stream)) {
      case kStream64: i = pack64<kStream64>(src, err, scale, i0, full, bits); break;
      case kStream32: i = pack64<kStream32>(src, err, scale, i0, full, bits); break;
      default: i = pack64<kPlain>(src, err, scale, i0, full, bits); break;
    }
    bits += (i - i0) / 8;
    const __m512 zero = _mm512_setzero_ps(), pos = _mm512_set1_ps(scale), neg = _mm512_set1_ps(-scale);
    for (; i < i1; i += 16) {
      const int cnt = int(min64(16, i1 - i));  // 8 or 16
      const int64_t left = valid - i;
      const int v = left <= 0 ? 0 : (left >= cnt ? cnt : int(left));
      unsigned k = 0;
      if (v > 0) {
        const __mmask16 vm = __mmask16((1u << v) - 1u);
        const __m512 x = src.load_n(vm, i, v);
        const __mmask16 km = _mm512_mask_cmp_ps_mask(vm, x, zero, _CMP_GE_OQ);
        _mm512_mask_storeu_ps(err + i, vm, _mm512_sub_ps(x, _mm512_mask_blend_ps(km, neg, pos)));
        k = km;
      }
      *bits++ = uint8_t(k);
      if (cnt > 8) *bits++ = uint8_t(k >> 8);
    }
  }

  template <int S>
  LOWBIT_AVX512_FN static int64_t decode64(const uint8_t* bits, float scale, float* out, int64_t i, int64_t end) {
    const __m512 pos = _mm512_set1_ps(scale), neg = _mm512_set1_ps(-scale);
    for (; i + 64 <= end; i += 64, bits += 8) {
      uint64_t m;
      std::memcpy(&m, bits, 8);
      store16<S>(out + i, _mm512_mask_blend_ps(__mmask16(m), neg, pos));
      store16<S>(out + i + 16, _mm512_mask_blend_ps(__mmask16(m >> 16), neg, pos));
      store16<S>(out + i + 32, _mm512_mask_blend_ps(__mmask16(m >> 32), neg, pos));
      store16<S>(out + i + 48, _mm512_mask_blend_ps(__mmask16(m >> 48), neg, pos));
    }
    if (S != kPlain) _mm_sfence();
    return i;
  }

  LOWBIT_AVX512_FN static void decode(const uint8_t* bits, float scale, float* out, int64_t i0, int64_t i1,
                                      bool stream) {
    int64_t i;
    switch (store_kind(out + i0, stream)) {
      case kStream64: i = decode64<kStream64>(bits, scale, out, i0, i1); break;
      case kStream32: i = decode64<kStream32>(bits, scale, out, i0, i1); break;
      default: i = decode64<kPlain>(bits, scale, out, i0, i1); break;
    }
    bits += (i - i0) / 8;
    const __m512 pos = _mm512_set1_ps(scale), neg = _mm512_set1_ps(-scale);
    for (; i < i1; i += 16, bits += 2) {
      const int cnt = int(min64(16, i1 - i));
      const __mmask16 vm = __mmask16((1u << cnt) - 1u);
      _mm512_mask_storeu_ps(out + i, vm, _mm512_mask_blend_ps(__mmask16(load_bits16(bits, cnt)), neg, pos));
    }
  }
};
#endif

}  // namespace
}  // namespace onebit
}  // namespace lowbit
