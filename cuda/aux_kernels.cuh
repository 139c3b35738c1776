// Device code of the small kernels around a step: table uploads (values travel
// as kernel parameters), the per-parameter scalars from the device hparams and
// step counts, the non-finite gradient check, and the step-count update.
// Launched from aux_kernels.cu.
#pragma once
#ifndef LOWBIT_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include "core/layout_record.hpp"
#include "core/rounding.hpp"
#include "core/step_scalars.hpp"
#include "cuda/tables.hpp"

namespace lowbit {
namespace cuda {

template <class Batch>
__global__ void __launch_bounds__(kThreads) upload_kernel(const __grid_constant__ Batch b) {
  const int stride = int(gridDim.x * blockDim.x);
  for (int s = 0; s < b.num_segments; ++s) {
    const UploadSegment seg = b.seg[s];
    for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < seg.words; i += stride)
      seg.dst[i] = b.payload[seg.first_word + i];
  }
}

__device__ __forceinline__ uint32_t nonfinite16(uint32_t w, uint32_t mask) {
  return uint32_t((w & mask) == mask) | uint32_t(((w >> 16) & mask) == mask);
}

__device__ __forceinline__ uint32_t nonfinite_words(const uint4& v, bool wide, uint32_t mask) {
  if (wide) {
    return uint32_t((v.x & 0x7F800000u) == 0x7F800000u) | uint32_t((v.y & 0x7F800000u) == 0x7F800000u) |
           uint32_t((v.z & 0x7F800000u) == 0x7F800000u) | uint32_t((v.w & 0x7F800000u) == 0x7F800000u);
  }
  return nonfinite16(v.x, mask) | nonfinite16(v.y, mask) | nonfinite16(v.z, mask) | nonfinite16(v.w, mask);
}

// Block b scans part b % kSplit of chunk b / kSplit: 16-byte loads when the
// gradient base is 16-byte aligned, element loads for the rest.
__global__ void __launch_bounds__(kThreads) check_kernel(const CheckArgs a) {
  const DevChunk ch = a.chunks[blockIdx.x / kSplit];
  const int part = int(blockIdx.x % kSplit);
  const DevDyn dyn = a.dyn[ch.param];
  if (dyn.grad == nullptr) return;
  const int64_t len = ch.end - ch.begin;
  const int64_t per = ((len + kSplit - 1) / kSplit + 7) / 8 * 8;
  const int64_t b = ch.begin + per * part;
  const int64_t e = b + per < ch.end ? b + per : ch.end;
  const bool wide = dyn.gdtype == kF32;
  const uint32_t mask16 = dyn.gdtype == kBF16 ? 0x7F80u : 0x7C00u;
  uint32_t bad = 0;
  int64_t scalar_from = b;
  if (dyn.grad_al16 && b < e) {
    // b is a multiple of 8 elements, so b and every 8th element after it are 16-byte aligned.
    const int64_t groups = (e - b) / 8;
    if (wide) {
      const uint4* g = reinterpret_cast<const uint4*>(static_cast<const float*>(dyn.grad) + b);
      for (int64_t k = threadIdx.x; k < groups; k += kThreads)
        bad |= nonfinite_words(__ldg(g + 2 * k), true, 0) | nonfinite_words(__ldg(g + 2 * k + 1), true, 0);
    } else {
      const uint4* g = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(dyn.grad) + b);
      for (int64_t k = threadIdx.x; k < groups; k += kThreads) bad |= nonfinite_words(__ldg(g + k), false, mask16);
    }
    scalar_from = b + groups * 8;
  }
  for (int64_t i = scalar_from + threadIdx.x; i < e; i += kThreads) {
    if (wide)
      bad |= uint32_t((static_cast<const uint32_t*>(dyn.grad)[i] & 0x7F800000u) == 0x7F800000u);
    else
      bad |= uint32_t((static_cast<const uint16_t*>(dyn.grad)[i] & mask16) == mask16);
  }
  if (__syncthreads_or(int(bad)) && threadIdx.x == 0) *a.flag = 1;
}

// core/step_scalars.hpp on the device: the same IEEE double operations as
// the CPU engine, so the same bits. One thread per parameter.
__global__ void __launch_bounds__(kThreads) prepare_kernel(const PrepareArgs a) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= a.num_params || a.dyn[i].grad == nullptr) return;
  const DevParam P = a.params[i];
  lowbit_hparams_t h = a.hparams[P.group];
  if (a.lr) h.lr = *a.lr;
  if (a.validate_hparams && !hparams_valid(h, Algo(a.algo), int(P.num_moments))) *a.flag = 1;
  const int64_t step = a.shared_count ? int64_t(*a.shared_count) : a.host_count >= 0 ? a.host_count : a.steps[i];
  // Values the host could not check (JAX buffers): a bad one skips the step.
  if (!(h.lr >= 0.f && h.lr <= 3.40282347e38f) || step < 0) *a.flag = 1;
  if (a.shared_count && a.host_count >= 0 && step != a.host_count) *a.flag = 1;
  a.scalars[i] = a.frozen_step >= 0 ? make_frozen_scalars(h, step, a.frozen_step)
                                    : make_step_scalars(h, Algo(a.algo), step);
  a.dyn[i].key = rounding_key(a.seed, uint64_t(i), uint64_t(step + 1));
  a.dyn[i].scalar_idx = int32_t(i);
  if (a.layout) {
    const int32_t formats[2] = {public_format(P, 0), public_format(P, 1)};
    const int32_t norms[2] = {int32_t(P.norm[0]), int32_t(P.norm[1])};
    if (!layout_matches(a.layout + int64_t(kLayoutColumns) * i, int(P.num_moments), formats, norms,
                        int32_t(P.rounding), P.shape))
      *a.flag = 1;
  }
}

// A pass's PassSkip::if_positive (0/1 Adam's local steps: the agreed mean
// of the ranks' non-finite flags).
__global__ void __launch_bounds__(kThreads) round_bf16_kernel(float* x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
    x[i] = round_bf16(x[i]);
}

__global__ void skip_if_positive_kernel(const float* value, int32_t* flag) {
  if (*value > 0.f) *flag = 1;
}

__global__ void __launch_bounds__(kThreads) finalize_kernel(const FinalizeArgs a) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const bool skipped = *a.skip_flag != 0;
  if (a.shared_count || a.host_count >= 0) {
    if (i == 0 && a.shared_count_out)
      *a.shared_count_out = (a.shared_count ? *a.shared_count : int32_t(a.host_count)) + (skipped ? 0 : 1);
    return;
  }
  if (i >= a.num_params || skipped) return;
  if (a.dyn[i].grad != nullptr) a.steps[i] += 1;
}

}  // namespace cuda
}  // namespace lowbit
