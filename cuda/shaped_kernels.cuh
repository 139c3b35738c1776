// Shaped parameters on CUDA (core/shape.hpp): pass 1 (the new rank-1 maxima,
// the factored row and column statistics), the pass between (factored column
// sums from their chunk partials, row means), the pass after (rank-1 vectors
// move in), and the per-element helpers of pass 2 (step_kernel.cuh). The
// arithmetic is the CPU engine's (core/cpu_engine.cpp, stat_item and
// factored_mid) in the same order: lane-strided double partials combined by
// a xor butterfly (= lane_tree), column sums sequential within a chunk,
// maxima as integer maxima of float bits (exact in any order).
#pragma once
#ifndef LOWBIT_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include "core/param_io.hpp"
#include "core/shape.hpp"
#include "core/step_scalars.hpp"
#include "cuda/lane_io.cuh"
#include "cuda/tables.hpp"

namespace lowbit {
namespace cuda {

__device__ __forceinline__ double warp_sum(double x) {
  for (int off = 16; off > 0; off >>= 1) x = x + __shfl_xor_sync(0xFFFFFFFFu, x, off);
  return x;
}
__device__ __forceinline__ uint32_t warp_umax(uint32_t x) {
  for (int off = 16; off > 0; off >>= 1) x = umax(x, __shfl_xor_sync(0xFFFFFFFFu, x, off));
  return x;
}
__device__ __forceinline__ void atomic_umax(float* where, uint32_t bits) {
  atomicMax(reinterpret_cast<unsigned int*>(where), bits);
}

// The current rank-1 scale of element (q, c) of moment k: vectors `vecs`.
__device__ __forceinline__ float rank1_scale_at(const Shape& s, const float* vecs, uint32_t row_bits, int64_t c) {
  return bits_float(umin(row_bits, float_bits(vecs[rank1_last_offset(s) + c])));
}

// One element of pass 1, as the CPU's stat_segment: g, p (Adam, SGD), the
// rank-1 moments decoded with their current vectors, then this step's new
// moments alone (update_moments; factored: g^2 in v, and m's update).
template <Algo A>
__device__ __forceinline__ void stat_element(const DevParam& P, const DevDyn& dyn, const StepScalars& s,
                                             const QMap* maps, int64_t e, const uint32_t row_bits[2], int64_t c,
                                             float& m, float& v) {
  const float g = load_element(dyn.grad, lowbit_dtype_t(dyn.gdtype + 1), e);
  float p = kMomentsReadParam<A>
                ? load_param_element(P.param, lowbit_dtype_t(P.pdtype + 1), P.rounding, P.ecc, e)
                : 0.f;
  float x[2] = {0.f, 0.f};
  for (int k = 0; k < 2; ++k)
    if (k < P.num_moments && P.norm[k] == uint8_t(Norm::Rank1)) {
      const uint32_t code = load_code(P.mdata[k], P.format[k] == LOWBIT_STATE_4BIT, e);
      x[k] = maps[P.map[k]].values[code] * rank1_scale_at(P.shape, P.mscale[k], row_bits[k], c);
    }
  m = x[0];
  v = x[1];
  if (P.num_moments > 1 && P.norm[1] == uint8_t(Norm::Factored)) {
    v = factored_g2<A>(s, p, g);
    update_moments<A, true, false>(s, p, g, m, v);
    return;
  }
  update_moments<A, true, true>(s, p, g, m, v);
}

// Pass 1 of a param whose only shaped moment is a factored v (lpmm's 4-bit
// Factor: m per block): the sums of g^2 (factored_g2, what stat_element gives
// v), element by element in the generic kinds' order (a row's 32 lanes
// strided, sequential in each lane; a column's rows in order), without their
// per-element rank-1 work, 64-bit index products and dtype switches.
template <Algo A, uint8_t GD>
__device__ __forceinline__ float factored_g2_at(const DevParam& P, const void* grad, const StepScalars& s,
                                                int64_t e) {
  const float g = load_element(grad, lowbit_dtype_t(GD + 1), e);  // GD constant: no switch
  const float p = A == Algo::Adam
                      ? load_param_element(P.param, lowbit_dtype_t(P.pdtype + 1), P.rounding, P.ecc, e)
                      : 0.f;
  return factored_g2<A>(s, p, g);
}

template <Algo A, uint8_t GD>
__device__ __forceinline__ void factored_stats_item(const DevStatItem& it, const DevParam& P, const void* grad,
                                                    const StepScalars& s, double* partials) {
  const Shape& sh = P.shape;
  const int64_t C = shape_cols(sh);
  const int lane = int(threadIdx.x & 31u), warp = int(threadIdx.x >> 5);
  if (it.kind == 0) {  // rows [a, b), a warp each: the row's EMA
    float* row = static_cast<float*>(P.mdata[1]);
    for (int64_t q = it.a + warp; q < it.b; q += kWarps) {
      const int64_t base = q * C;
      double part = 0.0;
#pragma unroll 4
      for (int64_t c = lane; c < C; c += 32) part += double(factored_g2_at<A, GD>(P, grad, s, base + c));
      const double sum = warp_sum(part);
      if (lane == 0) row[q] = factored_ema(s, row[q], sum, C);
    }
    return;
  }
  // Column a + thread over the rows of chunk `chunk` of batch `batch`: its partial sum.
  const int64_t R = shape_batch_rows(sh);
  const int64_t r0 = it.chunk * kColChunkRows, r1e = r0 + kColChunkRows < R ? r0 + kColChunkRows : R;
  const int64_t c = it.a + threadIdx.x;
  if (c >= it.b) return;
  double acc = 0.0;
  int64_t e = (it.batch * R + r0) * C + c;
#pragma unroll 4
  for (int64_t r = r0; r < r1e; ++r, e += C) acc += double(factored_g2_at<A, GD>(P, grad, s, e));
  partials[it.partial_off + (it.batch * col_chunks(R) + it.chunk) * C + c] = acc;
}

// Rows [r0, r1e) of a kind-2 item (below), warp by warp: the row maxima go
// to the next vectors, the column maxima of the lane's 8 columns into cmax.
// kFast: a 2-D param with bf16 grads at a 16-byte aligned base and 8 valid
// columns in every lane (no scalar loads, no division for the row's entries).
template <Algo A, bool kFast>
__device__ __forceinline__ void rank1_stats_rows(const DevParam& P, const DevDyn& dyn, const StepScalars& s,
                                                 const float (&values)[2][256], const bool (&r1)[2], int64_t c0, int n,
                                                 int64_t r0, int64_t r1e, const uint32_t (&colbits)[2][8],
                                                 uint32_t (&cmax)[2][8]) {
  const Shape& sh = P.shape;
  const int64_t C = shape_cols(sh), S = shape_dim_sum(sh);
  const int lane = int(threadIdx.x & 31u), warp = int(threadIdx.x >> 5);
  if (kFast) n = 8;
  for (int64_t q = r0 + warp; q < r1e; q += kWarps) {
    const int64_t e0 = q * C + c0;
    float g[8], p[8], x[2][8];
    if (kFast)
      load_floats8(dyn.grad, kBF16, e0, 8, true, g);
    else
      load_floats8(dyn.grad, dyn.gdtype, e0, n, dyn.grad_al16 != 0, g);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      p[j] = kMomentsReadParam<A> && j < n
                 ? load_param_element(P.param, lowbit_dtype_t(P.pdtype + 1), P.rounding, P.ecc, e0 + j)
                 : 0.f;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      uint32_t code[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
      uint32_t rb = 0u;
      if (r1[k]) {
        rb = kFast ? float_bits(P.mscale[k][q]) : rank1_row_bits(sh, P.mscale[k], q);
        load_codes8(P.mdata[k], P.format[k] == LOWBIT_STATE_4BIT, e0, n, code);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j)
        x[k][j] = r1[k] && j < n ? values[k][code[j]] * bits_float(umin(rb, colbits[k][j])) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) update_moments<A, true, true>(s, p[j], g[j], x[0][j], x[1][j]);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (!r1[k]) continue;
      uint32_t rmax = 0u;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t b = j < n ? float_bits(x[k][j]) & 0x7FFFFFFFu : 0u;
        rmax = umax(rmax, b);
        cmax[k][j] = umax(cmax[k][j], b);
      }
      rmax = warp_umax(rmax);
      float* next = P.mscale[k] + S;
      if (lane == 0) {
        if (kFast)
          atomic_umax(next + q, rmax);
        else
          rank1_scatter_row(sh, q, rmax, [&](int64_t j, uint32_t bits) { atomic_umax(next + j, bits); });
      }
    }
  }
}

// Pass 1 of a param whose shaped moments are all rank-1, with C % 8 == 0
// (kind 2): one read of the elements gives both the row and the column
// maxima. The item is columns [a, b) (<= 256: 8 per lane) of the rows of
// chunk `chunk`; warp w takes rows w, w + kWarps, ... of it. A row's maximum
// over the item's columns is the warp's (one atomic per row and item), the
// columns' over the item's rows are combined over the warps in shared memory.
// Maxima are exact in any order: the same vectors as the CPU's.
template <Algo A>
__device__ __forceinline__ void rank1_stats_item(const DevStatItem& it, const DevParam& P, const DevDyn& dyn,
                                                 const StepScalars& s, const QMap* maps, const bool (&r1)[2]) {
  __shared__ uint32_t colmax[2][kWarps][kTile];
  __shared__ float values[2][256];  // the rank-1 moments' map values
#pragma unroll
  for (int k = 0; k < 2; ++k)
    if (r1[k]) {
      const QMap& map = maps[P.map[k]];
      for (int i = int(threadIdx.x); i < map.n; i += kThreads) values[k][i] = map.values[i];
    }
  __syncthreads();
  const Shape& sh = P.shape;
  const int64_t S = shape_dim_sum(sh), last = rank1_last_offset(sh);
  const int64_t rows = shape_rows(sh, P.numel);
  const int lane = int(threadIdx.x & 31u), warp = int(threadIdx.x >> 5);
  const int64_t c0 = it.a + lane * 8;
  const int n = it.b - c0 >= 8 ? 8 : (it.b > c0 ? int(it.b - c0) : 0);
  const int64_t r0 = it.chunk * kColChunkRows, r1e = r0 + kColChunkRows < rows ? r0 + kColChunkRows : rows;
  uint32_t colbits[2][8], cmax[2][8];
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      colbits[k][j] = r1[k] && j < n ? float_bits(P.mscale[k][last + c0 + j]) : 0u;
      cmax[k][j] = 0u;
    }
  if (sh.ndim == 2 && it.b - it.a == kTile && dyn.gdtype == kBF16 && dyn.grad_al16)
    rank1_stats_rows<A, true>(P, dyn, s, values, r1, c0, n, r0, r1e, colbits, cmax);
  else
    rank1_stats_rows<A, false>(P, dyn, s, values, r1, c0, n, r0, r1e, colbits, cmax);
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int j = 0; j < 8; ++j) colmax[k][warp][lane * 8 + j] = cmax[k][j];
  __syncthreads();
  const int64_t c = it.a + threadIdx.x;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (!r1[k] || c >= it.b) continue;
    uint32_t best = 0u;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) best = umax(best, colmax[k][w][threadIdx.x]);
    atomic_umax(P.mscale[k] + S + last + c, best);
  }
}

template <Algo A>
__global__ void __launch_bounds__(kThreads) stats_kernel(const ShapedArgs a, const QMap* maps) {
  if (a.skip_flag && *static_cast<const volatile int32_t*>(a.skip_flag) != 0) return;
  const DevStatItem it = a.items[blockIdx.x];
  const DevDyn dyn = a.dyn[it.param];
  if (dyn.grad == nullptr) return;
  const DevParam& P = a.params[it.param];  // a copy would live in local memory (dims indexed at run time)
  const StepScalars s = a.scalars[dyn.scalar_idx];
  const Shape& sh = P.shape;
  const int64_t C = shape_cols(sh), S = shape_dim_sum(sh);
  const bool r1[2] = {P.num_moments > 0 && P.norm[0] == uint8_t(Norm::Rank1),
                      P.num_moments > 1 && P.norm[1] == uint8_t(Norm::Rank1)};
  const bool fac = P.num_moments > 1 && P.norm[1] == uint8_t(Norm::Factored);
  const int lane = int(threadIdx.x & 31u), warp = int(threadIdx.x >> 5);
  if (it.kind == 2) {
    rank1_stats_item<A>(it, P, dyn, s, maps, r1);
    return;
  }
  if (fac && !r1[0]) {  // v factored, m per block (or none)
    if (dyn.gdtype == kBF16)
      factored_stats_item<A, kBF16>(it, P, dyn.grad, s, a.partials);
    else if (dyn.gdtype == kF32)
      factored_stats_item<A, kF32>(it, P, dyn.grad, s, a.partials);
    else
      factored_stats_item<A, kF16>(it, P, dyn.grad, s, a.partials);
    return;
  }
  if (it.kind == 0) {
    for (int64_t q = it.a + warp; q < it.b; q += kWarps) {
      uint32_t rb[2] = {0u, 0u};
      for (int k = 0; k < 2; ++k)
        if (r1[k]) rb[k] = rank1_row_bits(sh, P.mscale[k], q);
      uint32_t mx[2] = {0u, 0u};
      double part = 0.0;
      for (int64_t c = lane; c < C; c += 32) {
        float m, v;
        stat_element<A>(P, dyn, s, maps, q * C + c, rb, c, m, v);
        if (r1[0]) mx[0] = umax(mx[0], float_bits(m) & 0x7FFFFFFFu);
        if (r1[1]) mx[1] = umax(mx[1], float_bits(v) & 0x7FFFFFFFu);
        if (fac) part += double(v);
      }
      for (int k = 0; k < 2; ++k)
        if (r1[k]) {
          const uint32_t best = warp_umax(mx[k]);
          float* next = P.mscale[k] + S;
          if (lane == 0) rank1_scatter_row(sh, q, best, [&](int64_t j, uint32_t bits) { atomic_umax(next + j, bits); });
        }
      if (fac) {
        const double sum = warp_sum(part);
        float* row = static_cast<float*>(P.mdata[1]);
        if (lane == 0) row[q] = factored_ema(s, row[q], sum, C);
      }
    }
    return;
  }
  const int64_t R = fac ? shape_batch_rows(sh) : shape_rows(sh, P.numel);
  const int64_t r0 = it.chunk * kColChunkRows, r1e = r0 + kColChunkRows < R ? r0 + kColChunkRows : R;
  const int64_t c = it.a + threadIdx.x;
  if (c >= it.b) return;  // no barrier below
  uint32_t mx[2] = {0u, 0u};
  double acc = 0.0;
  for (int64_t r = r0; r < r1e; ++r) {
    const int64_t q = it.batch * R + r;
    uint32_t rb[2] = {0u, 0u};
    for (int k = 0; k < 2; ++k)
      if (r1[k]) rb[k] = rank1_row_bits(sh, P.mscale[k], q);
    float m, v;
    stat_element<A>(P, dyn, s, maps, q * C + c, rb, c, m, v);
    if (r1[0]) mx[0] = umax(mx[0], float_bits(m) & 0x7FFFFFFFu);
    if (r1[1]) mx[1] = umax(mx[1], float_bits(v) & 0x7FFFFFFFu);
    if (fac) acc += double(v);
  }
  for (int k = 0; k < 2; ++k)
    if (r1[k]) atomic_umax(P.mscale[k] + S + rank1_last_offset(sh) + c, mx[k]);
  if (fac) a.partials[it.partial_off + (it.batch * col_chunks(R) + it.chunk) * C + c] = acc;
}

#ifdef LOWBIT_SHAPED_AUX_KERNELS  // defined by the one translation unit that launches them (aux_kernels.cu)
// Between the passes, one CUDA block per shaped parameter: the factored
// column accumulators from their chunk partials (one thread per column) and
// the row means (one warp per batch).
__global__ void __launch_bounds__(kThreads) shaped_mid_kernel(const ShapedArgs a) {
  if (a.skip_flag && *static_cast<const volatile int32_t*>(a.skip_flag) != 0) return;
  const DevShaped sp = a.shaped[blockIdx.x];
  const DevDyn dyn = a.dyn[sp.param];
  const DevParam P = a.params[sp.param];
  if (dyn.grad == nullptr || P.num_moments < 2 || P.norm[1] != uint8_t(Norm::Factored)) return;
  const StepScalars s = a.scalars[dyn.scalar_idx];
  const Shape& sh = P.shape;
  const int64_t C = shape_cols(sh), R = shape_batch_rows(sh), rows = shape_rows(sh, P.numel), B = rows / R;
  const int64_t nch = col_chunks(R);
  float* f = static_cast<float*>(P.mdata[1]);
  const double* part = a.partials + sp.partial_off;
  for (int64_t i = threadIdx.x; i < B * C; i += kThreads) {
    const int64_t b = i / C, c = i - b * C;
    double sum = 0.0;
    for (int64_t k = 0; k < nch; ++k) sum += part[(b * nch + k) * C + c];
    f[rows + i] = factored_ema(s, f[rows + i], sum, R);
  }
  const int lane = int(threadIdx.x & 31u), warp = int(threadIdx.x >> 5);
  for (int64_t b = warp; b < B; b += kWarps) {
    double x = 0.0;
    for (int64_t r = lane; r < R; r += 32) x += double(f[b * R + r]);
    const double sum = warp_sum(x);
    if (lane == 0) f[rows + B * C + b] = float(sum / double(R));
  }
}

// After pass 2: the new rank-1 vectors replace the current ones; the
// workspace goes back to zero.
__global__ void __launch_bounds__(kThreads) shaped_finish_kernel(const ShapedArgs a) {
  if (a.skip_flag && *static_cast<const volatile int32_t*>(a.skip_flag) != 0) return;
  const DevShaped sp = a.shaped[blockIdx.x];
  if (a.dyn[sp.param].grad == nullptr) return;
  const DevParam P = a.params[sp.param];
  const int64_t S = shape_dim_sum(P.shape);
  for (int k = 0; k < P.num_moments; ++k)
    if (P.norm[k] == uint8_t(Norm::Rank1))
      for (int64_t i = threadIdx.x; i < S; i += kThreads) {
        P.mscale[k][i] = P.mscale[k][S + i];
        P.mscale[k][S + i] = 0.f;
      }
}

#endif  // LOWBIT_SHAPED_AUX_KERNELS

// ---- pass 2: the per-element scales / factored v of a lane's 8 elements.

// For each of the n elements from e0: the current and new rank-1 scales of
// moment k (Rank1), or the factored v (Factored, in `cur`).
__device__ __forceinline__ void shaped_lane(const DevParam& P, int k, int64_t e0, int n, float (&cur)[8],
                                            float (&nxt)[8]) {
  const Shape& sh = P.shape;
  ShapeCursor pos;
  pos.start(sh, e0);
  if (P.norm[k] == uint8_t(Norm::Factored)) {
    const float* f = static_cast<const float*>(P.mdata[k]);
    float rf = factored_row_factor(sh, f, P.numel, pos.q);
    const float* col = factored_col(sh, f, P.numel, pos.q);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      cur[j] = j < n ? factored_v(rf, col[pos.c]) : 0.f;
      nxt[j] = 0.f;
      if (j < n && pos.next() && j + 1 < n) {
        rf = factored_row_factor(sh, f, P.numel, pos.q);
        col = factored_col(sh, f, P.numel, pos.q);
      }
    }
    return;
  }
  const float* vc = P.mscale[k];
  const float* vn = P.mscale[k] + shape_dim_sum(sh);
  const int64_t last = rank1_last_offset(sh);
  uint32_t rc = rank1_row_bits(sh, vc, pos.q), rn = rank1_row_bits(sh, vn, pos.q);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    cur[j] = j < n ? bits_float(umin(rc, float_bits(vc[last + pos.c]))) : 0.f;
    nxt[j] = j < n ? bits_float(umin(rn, float_bits(vn[last + pos.c]))) : 0.f;
    if (j < n && pos.next() && j + 1 < n) {
      rc = rank1_row_bits(sh, vc, pos.q);
      rn = rank1_row_bits(sh, vn, pos.q);
    }
  }
}

}  // namespace cuda
}  // namespace lowbit
