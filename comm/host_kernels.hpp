// CPU implementation of the per-element work of the 1-bit compressed
// allreduce (the CUDA twin is in cuda_kernels.cu). All norms are accumulated
// in double; every value that travels or is stored is fp32.
//
// Every function gives the same bits whatever the instruction set it runs
// with (AVX-512 or AVX2 where the CPU has it, else portable C++: host_isa()) and the
// number of OpenMP threads (buffers of at least kParallelMin elements are cut
// over omp_get_max_threads() threads; the sums of squares keep the order of
// sumsq.hpp).
#pragma once
#include <cstdint>

#include "layout.hpp"

namespace lowbit {
namespace onebit {

// Little-endian fp32 scale at the head of a message.
void put_scale(uint8_t* msg, float scale);
float get_scale(const uint8_t* msg);

// The two-pass forms (a sum of squares, then a pack that writes the new
// errors; the structure the device kernels follow): the host reference of
// the device-emulation tests and the benchmark's "2-pass" rows. The
// communicator's host path runs the one-pass forms further below.
//
// x = t + e into x_out (n floats; e == nullptr: zero error); returns sum of
// x^2 (non-finite iff some x is).
double host_worker_sum(const float* t, const float* e, float* x_out, int64_t n);

// The same sum of squares as host_worker_sum, without writing x.
double host_worker_sumsq(const float* t, const float* e, int64_t n);

// Scale from a sum of squares over `count` elements: sqrt(sumsq / count)
// rounded to fp32; 0 when count == 0; NaN when sumsq is not finite.
float scale_from_sumsq(double sumsq, int64_t count);

// Packs the signs of x (n floats, overwritten with the new worker error
// x - scale * sign(x)) into W messages of `send` (W * msg bytes), and writes
// the scale at the head of each.
void host_worker_pack(float* x, float scale, const Layout& l, uint8_t* send);

// host_worker_sum + host_worker_pack in one pass over t and e, x not stored:
// the new worker error (x - scale * sign(x), x = t + e, e == nullptr: zero
// error) into err_out (n floats, distinct from t and e) and the messages into
// `send`. Gives host_worker_sum's then host_worker_pack's bits.
void host_worker_pack_from(const float* t, const float* e, float scale, const Layout& l, float* err_out,
                           uint8_t* send);

// Server average over the W received messages (recv, W * msg bytes) for this
// rank's chunk: y = mean_j(scale_j * sign_j) + z, into y_out (server_numel
// floats). Returns sum of y^2, or NaN if a received scale is not finite.
double host_server_sum(const uint8_t* recv, const float* z, float* y_out, const Layout& l);

// The same sum of squares as host_server_sum, without writing y.
double host_server_sumsq(const uint8_t* recv, const float* z, const Layout& l);

// Packs the signs of y (overwritten with the new server error) into one
// message `gsend` (msg bytes) with `scale` at its head.
void host_server_pack(float* y, float scale, const Layout& l, uint8_t* gsend);

// host_server_sum + host_server_pack in one pass over recv and z, y not
// stored: the new server error into err_out (server_numel floats, distinct
// from z) and the message into `gsend`.
void host_server_pack_from(const uint8_t* recv, const float* z, float scale, const Layout& l, float* err_out,
                           uint8_t* gsend);

// The one-pass forms the communicator runs (one read of each input, one
// write of each output): the errors a call reads are stored (lazy false: e,
// or z, as they are; data nullptr: zero) or rebuilt from the value the last
// call packed and its scale (lazy: e = x - (x >= 0 ? scale : -scale), the
// bits the pack functions above store). Each element's value (x = t + e, or
// y = mean_j(scale_j * sign_j) + z) goes to x_out / y_out, its sign bit into
// the messages (their scales are not written), and the sum of squares (as
// host_worker_sum / host_server_sum; NaN if a received scale is not finite)
// is returned: the caller writes the scales, and keeps x / y with their scale
// as the next call's lazy errors.
struct ErrorsIn {
  const float* data = nullptr;
  float scale = 0.0f;
  bool lazy = false;
};
double host_worker_sum_pack(const float* t, const ErrorsIn& e, const Layout& l, float* x_out, uint8_t* send);
double host_server_sum_pack(const uint8_t* recv, const ErrorsIn& z, const Layout& l, float* y_out, uint8_t* gsend);

// The compressed reduce-scatter's server: the average over the W received
// messages (recv, W * msg bytes) for this rank's chunk, a =
// mean_j(scale_j * sign_j) (the server's y without its error, the same
// operations in the same order), into out (server_numel floats).
void host_server_average(const uint8_t* recv, const Layout& l, float* out);

// The fp32 sum, in rank order from +0, of the W received scales: when it is
// finite no element of the average overflows (|a partial signed sum| never
// exceeds the sum of the magnitudes, rounding being monotone).
float host_received_scale_sum(const uint8_t* recv, const Layout& l);

// The errors a lazy buffer stands for: out = x - (x >= 0 ? scale : -scale),
// n elements (out may be x).
void host_errors_from(const float* x, float scale, int64_t n, float* out);

// Writes `scale` at the head of `count` messages of `msg` bytes.
void put_scales(uint8_t* msgs, int64_t count, int64_t msg, float scale);

// True if every gathered scale (grecv, W * msg bytes) is finite.
bool host_gathered_finite(const uint8_t* grecv, const Layout& l);

// Decodes the gathered chunks into out (n floats).
void host_decode(const uint8_t* grecv, const Layout& l, float* out);

// ---- compact errors (BF16 / INT8, error_format.hpp): the same rules with
// the stored errors decoded as they are read (exactly: a bf16 value widened,
// an int8 code times its block's absmax / 127 in fp32) and the new errors
// encoded as they are written. Portable C++ on every instruction set (the
// same bits as the fp32 path's kernels would give on the decoded values).
// `errors` nullptr: zero errors.
//
// Worker: the signs of x = t + e into the W messages (scales not written),
// returns sum of x^2 (as host_worker_sum); nothing else written.
double host_worker_sum_pack_compact(const float* t, int32_t format, const uint8_t* errors, const Layout& l,
                                    uint8_t* send);
// Worker commit, once the call succeeded (t still unchanged): errors <-
// encode(x - (x >= 0 ? scale : -scale)), x = t + decode(errors), in place.
void host_worker_commit_compact(const float* t, int32_t format, uint8_t* errors, float scale, const Layout& l);
// Server: y = mean_j(scale_j * sign_j) + z over this rank's chunk, its signs
// into gsend (scale not written); returns sum of y^2, NaN if a received
// scale is not finite.
double host_server_sum_pack_compact(const uint8_t* recv, int32_t format, const uint8_t* errors, const Layout& l,
                                    uint8_t* gsend);
// Server commit (recv still the call's): errors <- encode(y - (y >= 0 ? scale : -scale)).
void host_server_commit_compact(const uint8_t* recv, int32_t format, uint8_t* errors, float scale, const Layout& l);
// The fp32 values of `count` compact errors into out.
void host_errors_decode(int32_t format, const uint8_t* errors, int64_t count, float* out);
// True if `count` compact errors are well formed (finite values, finite
// non-negative scales, codes in [-127, 127]); else the first bad element or
// block in *bad.
bool host_errors_valid(int32_t format, const uint8_t* errors, int64_t count, int64_t* bad);

// The instruction set of the kernels above: the library's CPU level
// (core/cpu_features.hpp: AVX-512 F/BW/DQ/VL at avx512, AVX2 at avx2, else
// portable C++; LOWBIT_CPU_KERNELS forces one). host_set_isa (tests,
// benchmarks) sets the library's level (set_cpu_isa); it returns false,
// changing nothing, if the CPU lacks it. Not thread-safe against running
// kernels.
enum class HostIsa { Portable = 0, Avx2 = 1, Avx512 = 2 };
HostIsa host_isa();
bool host_set_isa(HostIsa isa);
const char* host_isa_name(HostIsa isa);

// Non-temporal stores for the errors and the decoded output: Auto (the
// default) uses them when a call's working set (about 12 bytes per element)
// exceeds the last-level cache; tests force them on or off. Same bits either
// way. Not thread-safe against running kernels.
enum class HostStreaming { Auto, Never, Always };
void host_set_streaming(HostStreaming mode);

// Buffers under this many elements run on the calling thread only.
constexpr int64_t kParallelMin = int64_t(1) << 16;

}  // namespace onebit
}  // namespace lowbit
