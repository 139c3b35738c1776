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

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "error_format.hpp"
#include "host_simd.hpp"

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

// Runs f(Isa{}) with the kernels of the current instruction set (host_isa.cpp).
template <class F>
auto with_isa(F&& f) {
#if LOWBIT_COMM_X86
  if (host_isa() == HostIsa::Avx512) return f(Avx512{});
  if (host_isa() == HostIsa::Avx2) return f(Avx2{});
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

void host_set_streaming(HostStreaming mode) { g_streaming = mode; }

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

void host_server_average(const uint8_t* recv, const Layout& l, float* out) {
  bool finite = true;
  const auto src = server_source(recv, ErrZero{}, l, &finite);
  with_isa([&](auto isa) { return sumsq_pass<decltype(isa), true>(src, l.server_numel(), out); });
}

float host_received_scale_sum(const uint8_t* recv, const Layout& l) {
  float sum = 0.0f;
  for (int32_t j = 0; j < l.world; ++j) sum += get_scale(recv + int64_t(j) * l.msg);
  return sum;
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

// ---- compact errors (error_format.hpp)

namespace {

LOWBIT_INLINE float bf16_value(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// fp32 -> bf16, round to nearest even; a finite value that rounds past the
// largest bf16 keeps the largest (+-0x7F7F) instead of becoming an Inf.
LOWBIT_INLINE uint16_t bf16_encode(float f) {
  const uint32_t u = float_bits(f);
  uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  if ((r & 0x7F80u) == 0x7F80u) r = (u >> 16 & 0x8000u) | 0x7F7Fu;
  return uint16_t(r);
}

// The stored errors as a pass reads them (at, load8: Portable kernels only).
struct ErrBf16 {
  const uint8_t* e;  // count uint16
  float at(int64_t i) const {
    uint16_t h;
    std::memcpy(&h, e + 2 * i, 2);
    return bf16_value(h);
  }
  LOWBIT_INLINE void load8(int64_t i, float* v) const {
    for (int k = 0; k < 8; ++k) v[k] = at(i + k);
  }
};

struct ErrQ8 {
  const uint8_t* scales;  // blocks fp32 absmax
  const int8_t* codes;    // count int8
  static ErrQ8 over(const uint8_t* p, int64_t count) {
    return ErrQ8{p, reinterpret_cast<const int8_t*>(p + 4 * error_blocks(count))};
  }
  LOWBIT_INLINE float scale(int64_t b) const {
    float m;
    std::memcpy(&m, scales + 4 * b, 4);
    return m;
  }
  float at(int64_t i) const { return (float(codes[i]) * scale(i / kErrorBlock)) / 127.0f; }
  LOWBIT_INLINE void load8(int64_t i, float* v) const {
    for (int k = 0; k < 8; ++k) v[k] = at(i + k);
  }
};

// Encodes e[0 .. len) (len <= kErrorBlock) as block b of `count` errors.
LOWBIT_INLINE void encode_block(int32_t format, const float* e, int64_t len, int64_t b, int64_t count,
                                uint8_t* errors) {
  const int64_t i0 = b * kErrorBlock;
  if (format == kErrorBf16) {
    for (int64_t k = 0; k < len; ++k) {
      const uint16_t h = bf16_encode(e[k]);
      std::memcpy(errors + 2 * (i0 + k), &h, 2);
    }
    return;
  }
  float m = 0.0f;
  for (int64_t k = 0; k < len; ++k) m = std::fabs(e[k]) > m ? std::fabs(e[k]) : m;
  std::memcpy(errors + 4 * b, &m, 4);
  int8_t* codes = reinterpret_cast<int8_t*>(errors + 4 * error_blocks(count)) + i0;
  if (!(m > 0.0f)) {
    std::memset(codes, 0, size_t(len));
    return;
  }
  // Round to nearest even of |r| <= 127 by adding and subtracting 1.5 * 2^23
  // (exact in the default rounding mode; the library never changes it):
  // nearbyint's bits without its library call.
  constexpr float kRne = 12582912.0f;
  for (int64_t k = 0; k < len; ++k) {
    const float r = (e[k] / m) * 127.0f;
    codes[k] = int8_t(int((r + kRne) - kRne));
  }
}

// f(E) with the error source of `format` over `count` errors at `errors`.
template <class F>
auto with_errors(int32_t format, const uint8_t* errors, int64_t count, F&& f) {
  if (format == kErrorBf16) return f(ErrBf16{errors});
  return f(ErrQ8::over(errors, count));
}

// Sum of squares of src over [0, count) (sumsq.hpp), its sign bits into the
// sink up to `padded` (bit 0 for the padding); nothing stored.
template <class Src>
double sum_bits_pass(const Src& src, int64_t count, int64_t padded, const MsgSink& sink) {
  // The portable loops, compiled for AVX2 where the CPU has it (the same
  // operations: AVX2 brings no FMA into them).
#if LOWBIT_COMM_X86
  const double sum = host_isa() != HostIsa::Portable ? sumsq_pass<Avx2, false, Src, MsgSink>(src, count, nullptr, sink)
                                                     : sumsq_pass<Portable, false, Src, MsgSink>(src, count, nullptr, sink);
#else
  const double sum = sumsq_pass<Portable, false, Src, MsgSink>(src, count, nullptr, sink);
#endif
  for (int64_t i = count / kSegment * kSegment; i < padded; i += 8) {
    unsigned byte = 0;
    for (int k = 0; k < 8 && i + k < count; ++k) byte |= unsigned(sign_bit(src.at(i + k))) << k;
    sink.put8(i, byte);
  }
  return sum;
}

// The new errors of block b: e[j] = v - (v >= 0 ? scale : -scale), v =
// src's element 256 b + j, encoded in place (the block read before it is
// written).
template <class Src>
LOWBIT_INLINE void commit_block(const Src& src, int32_t format, uint8_t* errors, float scale, int64_t count,
                                int64_t b) {
      float e[kErrorBlock];
      const int64_t i0 = b * kErrorBlock, len = min64(count, i0 + kErrorBlock) - i0;
      int64_t j = 0;
      for (; j + 8 <= len; j += 8) {  // i0 + j a multiple of 8: the sources' 8-wide loads
        float v[8];
        src.load8(i0 + j, v);
        for (int k = 0; k < 8; ++k) e[j + k] = v[k] - signed_scale(sign_bit(v[k]), scale);
      }
      for (; j < len; ++j) {
        const float v = src.at(i0 + j);
        e[j] = v - signed_scale(sign_bit(v), scale);
      }
      encode_block(format, e, len, b, count, errors);
}

#if LOWBIT_COMM_X86
template <class Src>
LOWBIT_AVX2_FN void commit_block_avx2(const Src& src, int32_t format, uint8_t* errors, float scale, int64_t count,
                                      int64_t b) {
  commit_block(src, format, errors, scale, count, b);
}
#endif

// errors <- encode(v - (v >= 0 ? scale : -scale)) with v = src's element i
// over [0, count), block by block.
template <class Src>
void commit_pass(const Src& src, int32_t format, uint8_t* errors, float scale, int64_t count) {
  constexpr int64_t kTask = 64;  // blocks per task
  const int64_t blocks = error_blocks(count), tasks = (blocks + kTask - 1) / kTask;
#if LOWBIT_COMM_X86
  const bool avx2 = host_isa() != HostIsa::Portable;
#endif
  for_each_block(tasks, threads_for(count), [&](int64_t k) {
    for (int64_t b = k * kTask; b < min64(blocks, (k + 1) * kTask); ++b) {
#if LOWBIT_COMM_X86
      if (avx2) {
        commit_block_avx2(src, format, errors, scale, count, b);
        continue;
      }
#endif
      commit_block(src, format, errors, scale, count, b);
    }
  });
}

}  // namespace

double host_worker_sum_pack_compact(const float* t, int32_t format, const uint8_t* errors, const Layout& l,
                                    uint8_t* send) {
  const MsgSink sink(send, l.msg, l.chunk);
  if (!errors) return sum_bits_pass(SrcT0{t}, l.n, l.padded, sink);
  return with_errors(format, errors, l.n, [&](auto e) {
    return sum_bits_pass(SrcTE<decltype(e)>{t, e}, l.n, l.padded, sink);
  });
}

void host_worker_commit_compact(const float* t, int32_t format, uint8_t* errors, float scale, const Layout& l) {
  with_errors(format, errors, l.n, [&](auto e) {
    commit_pass(SrcTE<decltype(e)>{t, e}, format, errors, scale, l.n);
    return 0;
  });
}

double host_server_sum_pack_compact(const uint8_t* recv, int32_t format, const uint8_t* errors, const Layout& l,
                                    uint8_t* gsend) {
  const MsgSink sink(gsend, l.msg, l.chunk);
  bool finite = true;
  const double sum = with_errors(format, errors, l.server_numel(), [&](auto e) {
    return sum_bits_pass(server_source(recv, e, l, &finite), l.server_numel(), l.chunk, sink);
  });
  return finite ? sum : NAN;
}

void host_server_commit_compact(const uint8_t* recv, int32_t format, uint8_t* errors, float scale, const Layout& l) {
  bool finite = true;
  with_errors(format, errors, l.server_numel(), [&](auto e) {
    commit_pass(server_source(recv, e, l, &finite), format, errors, scale, l.server_numel());
    return 0;
  });
}

void host_errors_decode(int32_t format, const uint8_t* errors, int64_t count, float* out) {
  with_errors(format, errors, count, [&](auto e) {
    for (int64_t i = 0; i < count; ++i) out[i] = e.at(i);
    return 0;
  });
}

bool host_errors_valid(int32_t format, const uint8_t* errors, int64_t count, int64_t* bad) {
  if (format == kErrorBf16) {
    for (int64_t i = 0; i < count; ++i)
      if (!std::isfinite(ErrBf16{errors}.at(i))) return *bad = i, false;
    return true;
  }
  const ErrQ8 q = ErrQ8::over(errors, count);
  for (int64_t b = 0; b < error_blocks(count); ++b) {
    const float m = q.scale(b);
    if (!std::isfinite(m) || !(m >= 0.0f)) return *bad = b, false;
  }
  for (int64_t i = 0; i < count; ++i)
    if (q.codes[i] == -128) return *bad = i, false;
  return true;
}

}  // namespace onebit
}  // namespace lowbit
