// CPU implementation of the per-element work of the 1-bit compressed
// allreduce (the CUDA twin is in cuda_kernels.cu). All norms are accumulated
// in double; every value that travels or is stored is fp32.
#pragma once
#include <cstdint>

#include "layout.hpp"

namespace lowbit {
namespace onebit {

// Little-endian fp32 scale at the head of a message.
void put_scale(uint8_t* msg, float scale);
float get_scale(const uint8_t* msg);

// x = t + e into x_out (n floats; e == nullptr: zero error); returns sum of
// x^2 (non-finite iff some x is).
double host_worker_sum(const float* t, const float* e, float* x_out, int64_t n);

// Scale from a sum of squares over `count` elements: sqrt(sumsq / count)
// rounded to fp32; 0 when count == 0; NaN when sumsq is not finite.
float scale_from_sumsq(double sumsq, int64_t count);

// Packs the signs of x (n floats, overwritten with the new worker error
// x - scale * sign(x)) into W messages of `send` (W * msg bytes), and writes
// the scale at the head of each.
void host_worker_pack(float* x, float scale, const Layout& l, uint8_t* send);

// Server average over the W received messages (recv, W * msg bytes) for this
// rank's chunk: y = mean_j(scale_j * sign_j) + z, into y_out (server_numel
// floats). Returns sum of y^2, or NaN if a received scale is not finite.
double host_server_sum(const uint8_t* recv, const float* z, float* y_out, const Layout& l);

// Packs the signs of y (overwritten with the new server error) into one
// message `gsend` (msg bytes) with `scale` at its head.
void host_server_pack(float* y, float scale, const Layout& l, uint8_t* gsend);

// True if every gathered scale (grecv, W * msg bytes) is finite.
bool host_gathered_finite(const uint8_t* grecv, const Layout& l);

// Decodes the gathered chunks into out (n floats).
void host_decode(const uint8_t* grecv, const Layout& l, float* out);

}  // namespace onebit
}  // namespace lowbit
