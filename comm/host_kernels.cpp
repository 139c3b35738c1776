// Host kernels of the 1-bit allreduce: portable C++ loops (also compiled for
// AVX2) and AVX-512 intrinsics for the same per-element arithmetic (every
// fp32 and fp64 operation identical and in the same order, see
// host_kernels.hpp and sumsq.hpp), the best the CPU has chosen at run time,
// and the drivers that cut the work over OpenMP threads.
//
// The passes (a "source" gives the value v of element i the pass works on:
// x = t + e or t + 0 for the worker, y = mean_j(+-scale_j) + z for the server,
// or a stored x / y):
//   sum of squares  v*v widened to double in the lanes, rounds and segments
//                   of sumsq.hpp; segments run in parallel, their sums are
//                   added in segment order afterwards (same bits for any
//                   number of threads); v optionally stored;
//   pack            bit = v >= 0, error = v - (bit ? scale : -scale), the bits
//                   of 64 elements from four 16-lane compare masks;
//   decode          out = bit ? scale : -scale.
#include "host_kernels.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif
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

#include "core/simd.hpp"
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

float scale_from_sumsq(double sumsq, int64_t count) {
  if (!std::isfinite(sumsq)) return NAN;
  if (count <= 0) return 0.0f;
  return float(std::sqrt(sumsq / double(count)));
}

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

// ---- instruction set

bool cpu_has(HostIsa isa) {
#if LOWBIT_COMM_X86
  __builtin_cpu_init();
  if (isa == HostIsa::Avx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (isa == HostIsa::Avx2) return __builtin_cpu_supports("avx2");
#endif
  return isa == HostIsa::Portable;
}

// LOWBIT_CPU_KERNELS=generic (as for the CPU engine's codecs) keeps the
// portable loops.
HostIsa& current_isa() {
  static HostIsa isa = [] {
    if (generic_cpu_kernels_requested()) return HostIsa::Portable;
    return cpu_has(HostIsa::Avx512) ? HostIsa::Avx512 : cpu_has(HostIsa::Avx2) ? HostIsa::Avx2 : HostIsa::Portable;
  }();
  return isa;
}

// Runs f(Isa{}) with the kernels of the current instruction set.
template <class F>
auto with_isa(F&& f) {
#if LOWBIT_COMM_X86
  if (current_isa() == HostIsa::Avx512) return f(Avx512{});
  if (current_isa() == HostIsa::Avx2) return f(Avx2{});
#endif
  return f(Portable{});
}

// ---- drivers

// Threads for a pass over `elements` elements (1 under kParallelMin, or when
// called from inside a parallel region).
int threads_for(int64_t elements) {
#ifdef _OPENMP
  if (elements < kParallelMin || omp_in_parallel()) return 1;
  const int64_t most = elements / (kParallelMin / 2);
  const int64_t nt = omp_get_max_threads();
  return int(nt < most ? nt : most);
#else
  (void)elements;
  return 1;
#endif
}

// f(k) for k = 0 .. count-1 on nt threads, handed out one at a time as the
// threads free up (a thread that shares its core with another process does
// less of the work instead of holding the others up), or in order on this
// thread when nt == 1.
template <class F>
void for_each_block(int64_t count, int nt, F&& f) {
#ifdef _OPENMP
  if (nt > 1) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t k = 0; k < count; ++k) f(k);
    return;
  }
#endif
  (void)nt;
  for (int64_t k = 0; k < count; ++k) f(k);
}

// Sum of squares (sumsq.hpp) of elements [0, count) of src, storing them to
// out[i] if Store. The segments' sums are computed in any order (in parallel,
// blocks of kBlockSegments) into seg[], then added to the accumulators in
// segment order, batch by batch.
template <class Isa, bool Store, class Src, class Sink = NoSink, bool Stream = false>
double sumsq_pass(const Src& src, int64_t count, float* out, const Sink& sink = {}) {
  constexpr int64_t kBatch = 2048;  // segments (16 M elements) per batch
  constexpr int64_t kBlockSegments = 4;
  double acc[kTree] = {};
  const int64_t nseg = sumsq::segments(count);
  const int64_t full = count / kSegment;  // full segments; a partial one after them
  double seg[kBatch];
  for (int64_t b0 = 0; b0 < nseg; b0 += kBatch) {
    const int64_t b1 = min64(nseg, b0 + kBatch);
    const int64_t blocks = (b1 - b0 + kBlockSegments - 1) / kBlockSegments;
    for_each_block(blocks, threads_for((b1 - b0) * kSegment), [&](int64_t k) {
      const int64_t lo = b0 + k * kBlockSegments, hi = min64(b1, lo + kBlockSegments);
      for (int64_t s = lo; s < hi; ++s)
        seg[s - b0] = s < full ? Isa::template segment<Src, Store, Sink, Stream>(src, s * kSegment, out, sink)
                               : segment_scalar(src, s * kSegment, count - s * kSegment, Store ? out : nullptr);
    });
    for (int64_t s = b0; s < b1; ++s) acc[s % kTree] += seg[s - b0];
  }
  return sumsq::tree256(acc);
}

// Last-level cache size in bytes (sysfs, else sysconf, else 32 MiB).
int64_t llc_bytes() {
  static const int64_t bytes = [] {
    int64_t largest = 0;
    for (int idx = 0; idx < 8; ++idx) {
      char path[96];
      std::snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
      FILE* f = std::fopen(path, "r");
      if (!f) continue;
      unsigned long kb = 0;
      char unit = 'K';
      const int got = std::fscanf(f, "%lu%c", &kb, &unit);
      std::fclose(f);
      const int64_t v = got >= 1 ? int64_t(kb) * (unit == 'M' ? 1024 * 1024 : 1024) : 0;
      largest = v > largest ? v : largest;
    }
#ifdef _SC_LEVEL3_CACHE_SIZE
    if (largest <= 0) largest = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    return largest > 0 ? largest : int64_t(32) << 20;
  }();
  return bytes;
}

// Streaming (non-temporal) stores for the outputs of a pass over `elements`
// elements when a call's working set (about 12 bytes per element: input,
// error, output) is larger than the last-level cache: they would be evicted
// before their next use anyway, and streaming saves the read for ownership.
HostStreaming g_streaming = HostStreaming::Auto;
bool streaming(int64_t elements) {
  if (g_streaming != HostStreaming::Auto) return g_streaming == HostStreaming::Always;
  return elements * 12 > llc_bytes();
}

// Bytes of sign bits (x 8 elements) per block of the pack and decode passes.
constexpr int64_t kBlockBytes = 4096;

// f(b0, b1) for the byte range [b0, b1) of the message layout (chunks of cb
// bytes, b0 .. b1 within one block) cut at the chunk boundaries: f(r, rb, re)
// for bytes [rb, re) of chunk r.
template <class F>
void chunk_pieces(int64_t b0, int64_t b1, int64_t cb, F&& f) {
  while (b0 < b1) {
    const int64_t r = b0 / cb, rb = b0 - r * cb, re = min64(b1, (r + 1) * cb) - r * cb;
    f(r, rb, re);
    b0 += re - rb;
  }
}

// Packs `chunks` chunks of `chunk` elements (element r * chunk + k of src is
// element k of chunk r; elements >= valid are padding) into the messages at
// msgs + r * msg (sign bits after the 4-byte scale, which is not written),
// the new errors into err. Blocks are taken from the end: the pass before
// (the sum of squares) went forwards and left the end in the caches.
template <class Isa, class Src>
void pack_pass(const Src& src, float* err, float scale, int64_t chunk, int64_t chunks, int64_t valid, uint8_t* msgs,
               int64_t msg) {
  const int64_t cb = chunk / 8, total = chunks * cb;
  const bool stream = streaming(chunks * chunk);
  const int64_t blocks = (total + kBlockBytes - 1) / kBlockBytes;
  for_each_block(blocks, threads_for(chunks * chunk), [&](int64_t k) {
    const int64_t b0 = (blocks - 1 - k) * kBlockBytes;
    chunk_pieces(b0, min64(total, b0 + kBlockBytes), cb, [&](int64_t r, int64_t rb, int64_t re) {
      Isa::pack(src, err, scale, r * chunk + rb * 8, r * chunk + re * 8, valid, msgs + r * msg + 4 + rb, stream);
    });
  });
}

template <class Isa>
void decode_pass(const uint8_t* grecv, const Layout& l, float* out) {
  const int64_t cb = l.chunk_bytes, total = l.world * cb;
  const bool stream = streaming(l.n);
  const int64_t blocks = (total + kBlockBytes - 1) / kBlockBytes;
  for_each_block(blocks, threads_for(l.n), [&](int64_t k) {
    const int64_t b0 = k * kBlockBytes;
    chunk_pieces(b0, min64(total, b0 + kBlockBytes), cb, [&](int64_t r, int64_t rb, int64_t re) {
      const uint8_t* m = grecv + r * l.msg;
      const int64_t i0 = r * l.chunk + rb * 8, i1 = min64(r * l.chunk + re * 8, l.n);
      if (i0 < i1) Isa::decode(m + 4 + rb, get_scale(m), out, i0, i1, stream);
    });
  });
}

// The server's source over this rank's chunk, with the W scales and their
// negations (2W floats) in a per-thread buffer that keeps its capacity, so a
// call allocates nothing after the first (lowbit_comm.h); valid until the
// calling thread's next server_source. finite is false if a scale is not.
template <class E>
SrcServer<E> server_source(const uint8_t* recv, E z, const Layout& l, bool* finite) {
  static thread_local std::vector<float> sc;
  const int32_t W = l.world;
  sc.resize(size_t(2 * W));
  *finite = true;
  for (int32_t j = 0; j < W; ++j) {
    const float s = get_scale(recv + int64_t(j) * l.msg);
    sc[size_t(j)] = s;
    sc[size_t(W + j)] = -s;
    if (!std::isfinite(s)) *finite = false;
  }
  const float inv = (W & (W - 1)) == 0 ? 1.0f / float(W) : 0.0f;
  return SrcServer<E>{recv + 4, l.msg, W, sc.data(), sc.data() + W, float(W), inv, z};
}

// Sum of squares of src over [0, count) as sumsq_pass, each value stored to
// out[i] (streamed past the caches when the call is larger than them) and its
// sign bit into `sink`: the full segments' in the pass, the rest from out[]
// afterwards, and bit 0 for the padding up to `padded`.
template <class Isa, class Src>
double sum_pack_pass(const Src& src, int64_t count, int64_t padded, float* out, const MsgSink& sink) {
  double sum;
  if constexpr (Isa::kStreams) {
    if (streaming(count) && reinterpret_cast<uintptr_t>(out) % 64 == 0)
      sum = sumsq_pass<Isa, true, Src, MsgSink, true>(src, count, out, sink);
    else
      sum = sumsq_pass<Isa, true, Src, MsgSink, false>(src, count, out, sink);
  } else {
    sum = sumsq_pass<Isa, true, Src, MsgSink, false>(src, count, out, sink);
  }
  for (int64_t i = count / kSegment * kSegment; i < padded; i += 8) {
    unsigned byte = 0;
    for (int k = 0; k < 8 && i + k < count; ++k) byte |= unsigned(sign_bit(out[i + k])) << k;
    sink.put8(i, byte);
  }
  return sum;
}

}  // namespace

void put_scales(uint8_t* msgs, int64_t count, int64_t msg, float scale) {
  for (int64_t r = 0; r < count; ++r) put_scale(msgs + r * msg, scale);
}

HostIsa host_isa() { return current_isa(); }

bool host_set_isa(HostIsa isa) {
  if (!cpu_has(isa)) return false;
  current_isa() = isa;
  return true;
}

void host_set_streaming(HostStreaming mode) { g_streaming = mode; }

const char* host_isa_name(HostIsa isa) {
  return isa == HostIsa::Avx512 ? "avx512" : isa == HostIsa::Avx2 ? "avx2" : "portable";
}

double host_worker_sum(const float* t, const float* e, float* x_out, int64_t n) {
  return with_isa([&](auto isa) {
    using Isa = decltype(isa);
    return e ? sumsq_pass<Isa, true>(SrcTE<ErrStored>{t, {e}}, n, x_out) : sumsq_pass<Isa, true>(SrcT0{t}, n, x_out);
  });
}

double host_worker_sumsq(const float* t, const float* e, int64_t n) {
  return with_isa([&](auto isa) {
    using Isa = decltype(isa);
    return e ? sumsq_pass<Isa, false>(SrcTE<ErrStored>{t, {e}}, n, nullptr)
             : sumsq_pass<Isa, false>(SrcT0{t}, n, nullptr);
  });
}

void host_worker_pack(float* x, float scale, const Layout& l, uint8_t* send) {
  put_scales(send, l.world, l.msg, scale);
  with_isa([&](auto isa) {
    pack_pass<decltype(isa)>(SrcX{x}, x, scale, l.chunk, l.world, l.n, send, l.msg);
  });
}

void host_worker_pack_from(const float* t, const float* e, float scale, const Layout& l, float* err_out,
                           uint8_t* send) {
  put_scales(send, l.world, l.msg, scale);
  with_isa([&](auto isa) {
    using Isa = decltype(isa);
    if (e)
      pack_pass<Isa>(SrcTE<ErrStored>{t, {e}}, err_out, scale, l.chunk, l.world, l.n, send, l.msg);
    else
      pack_pass<Isa>(SrcT0{t}, err_out, scale, l.chunk, l.world, l.n, send, l.msg);
  });
}

namespace {

// The server's sum of squares, storing y to y_out if Store; NaN if a received
// scale is not finite.
template <bool Store>
double server_sumsq(const uint8_t* recv, const float* z, const Layout& l, float* y_out) {
  bool finite = true;
  const auto src = server_source(recv, ErrStored{z}, l, &finite);
  const double sum =
      with_isa([&](auto isa) { return sumsq_pass<decltype(isa), Store>(src, l.server_numel(), y_out); });
  return finite ? sum : NAN;
}

}  // namespace

double host_server_sum(const uint8_t* recv, const float* z, float* y_out, const Layout& l) {
  return server_sumsq<true>(recv, z, l, y_out);
}

double host_server_sumsq(const uint8_t* recv, const float* z, const Layout& l) {
  return server_sumsq<false>(recv, z, l, nullptr);
}

void host_server_pack(float* y, float scale, const Layout& l, uint8_t* gsend) {
  put_scale(gsend, scale);
  with_isa([&](auto isa) {
    pack_pass<decltype(isa)>(SrcX{y}, y, scale, l.chunk, 1, l.server_numel(), gsend, l.msg);
  });
}

void host_server_pack_from(const uint8_t* recv, const float* z, float scale, const Layout& l, float* err_out,
                           uint8_t* gsend) {
  bool finite = true;
  const auto src = server_source(recv, ErrStored{z}, l, &finite);
  put_scale(gsend, scale);
  with_isa([&](auto isa) {
    pack_pass<decltype(isa)>(src, err_out, scale, l.chunk, 1, l.server_numel(), gsend, l.msg);
  });
}

double host_worker_sum_pack(const float* t, const ErrorsIn& e, const Layout& l, float* x_out, uint8_t* send) {
  const MsgSink sink(send, l.msg, l.chunk);
  return with_isa([&](auto isa) {
    using Isa = decltype(isa);
    if (!e.data) return sum_pack_pass<Isa>(SrcT0{t}, l.n, l.padded, x_out, sink);
    if (e.lazy) return sum_pack_pass<Isa>(SrcTE<ErrLazy>{t, {e.data, e.scale}}, l.n, l.padded, x_out, sink);
    return sum_pack_pass<Isa>(SrcTE<ErrStored>{t, {e.data}}, l.n, l.padded, x_out, sink);
  });
}

double host_server_sum_pack(const uint8_t* recv, const ErrorsIn& z, const Layout& l, float* y_out, uint8_t* gsend) {
  const MsgSink sink(gsend, l.msg, l.chunk);
  bool finite = true;
  const double sum = with_isa([&](auto isa) {
    using Isa = decltype(isa);
    if (z.lazy)
      return sum_pack_pass<Isa>(server_source(recv, ErrLazy{z.data, z.scale}, l, &finite), l.server_numel(), l.chunk,
                                y_out, sink);
    return sum_pack_pass<Isa>(server_source(recv, ErrStored{z.data}, l, &finite), l.server_numel(), l.chunk, y_out,
                              sink);
  });
  return finite ? sum : NAN;
}

void host_errors_from(const float* x, float scale, int64_t n, float* out) {
  const ErrLazy e{x, scale};
  for (int64_t i = 0; i < n; ++i) out[i] = e.at(i);
}

bool host_gathered_finite(const uint8_t* grecv, const Layout& l) {
  for (int32_t r = 0; r < l.world; ++r)
    if (!std::isfinite(get_scale(grecv + int64_t(r) * l.msg))) return false;
  return true;
}

void host_decode(const uint8_t* grecv, const Layout& l, float* out) {
  with_isa([&](auto isa) { decode_pass<decltype(isa)>(grecv, l, out); });
}

}  // namespace onebit
}  // namespace lowbit
