// Device code of 0/1 Adam (core/zeroone_adam.cpp) and 1-bit LAMB
// (core/onebit_lamb.cpp): the non-finite flag of a flat buffer, the
// element-wise passes, LAMB's reduction passes A and its per-parameter
// passes. The math is core/update_rules.hpp, core/onebit_rules.hpp and
// core/param_io.hpp, as in the CPU engine, and the reductions follow the
// fixed order of core/onebit_rules.hpp (one block of kLambLanes threads per
// chunk, lane l sums in double the elements begin + l, begin + l +
// kLambLanes, ... in index order, then the pairwise tree; a parameter's
// chunks add up in chunk order), so both engines give the same bits.
// Launched from onebit_ext_kernels.cu (tests/cuda/emu: emu_onebit_ext.cpp).
#pragma once
#ifndef LOWBIT_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include "core/onebit_rules.hpp"
#include "core/param_io.hpp"
#include "core/update_rules.hpp"
#include "cuda/onebit_device.cuh"
#include "cuda/tables.hpp"

namespace lowbit {
namespace cuda {

static_assert(kLambLanes == kThreads, "a LAMB reduction block is one CUDA block of kThreads");

// Grid-stride scan; flag was zeroed in stream order before the launch.
__global__ void __launch_bounds__(kThreads) nonfinite_kernel(const float* data, int64_t n, float* flag) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const uint32_t* w = reinterpret_cast<const uint32_t*>(data);
  uint32_t bad = 0;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride)
    bad |= uint32_t((w[i] & 0x7F800000u) == 0x7F800000u);
  if (__syncthreads_or(int(bad)) && threadIdx.x == 0) *flag = 1.f;
}

// 0/1 Adam's local steps: the agreed mean of the ranks' non-finite flags.
__global__ void skip_if_positive_kernel(const float* value, int32_t* flag) {
  if (*value > 0.f) *flag = 1;
}

// Element-wise passes: block b works on part b % kSplit of chunk b / kSplit.
__global__ void __launch_bounds__(kThreads) onebit_ext_kernel(const OneBitExtArgs a) {
  const bool changes_state = a.op == kZeroOneSyncApply || a.op == kLambWarmupB || a.op == kLambCompressedB;
  if (changes_state && skip_flag_set(a.skip_flag)) return;
  const ChunkPart cp = chunk_part(a.chunks, blockIdx.x);
  const DevChunk ch = cp.chunk;
  const int64_t begin = cp.begin, end = cp.end;
  const DevParam P = a.params[ch.param];
  const DevOneBit ob = a.onebit[ch.param];
  const DevDyn dyn = a.dyn[ch.param];
  const lowbit_dtype_t pd = to_lowbit_dtype(P.pdtype);
  const int32_t r = int32_t(P.rounding);
  float* m = static_cast<float*>(P.mdata[0]);
  float* v = static_cast<float*>(P.mdata[1]);
  switch (a.op) {
    case kZeroOneSnapshot: {
      float* sync = a.sync + ob.offset;
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) sync[i] = load_param_element(P.param, pd, r, P.ecc, i);
      return;
    }
    case kZeroOneSyncPack: {
      const StepScalars s = a.scalars[dyn.scalar_idx];
      const lowbit_dtype_t gd = to_lowbit_dtype(dyn.gdtype);
      const float* sync = a.sync + ob.offset;
      float* out = a.out + ob.offset;
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads)
        out[i] = ob.mask && !ob.mask[i]
                     ? 0.f
                     : zeroone_sync_delta(s, m[i], load_element(dyn.grad, gd, i), v[i], sync[i],
                                          load_param_element(P.param, pd, r, P.ecc, i));
      return;
    }
    case kZeroOneSyncApply: {
      const float eps = a.scalars[dyn.scalar_idx].eps;
      const float inv_lr = a.group_inv_lrs[P.group];
      const float* bucket = a.bucket + ob.offset;
      float* sync = a.sync + ob.offset;
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
        const float d = bucket[i];
        m[i] = ob.mask && !ob.mask[i] ? 0.f : d * inv_lr;
        const float p = zeroone_sync_param(sync[i], d, v[i], eps);
        store_param_element(P.param, pd, r, P.ecc, dyn.key, i, p);
        sync[i] = load_param_element(P.param, pd, r, P.ecc, i);
      }
      return;
    }
    case kLambMomentum: {
      StepScalars s{};
      s.beta1 = a.hparams[P.group].beta1;
      const float scaling = a.lamb[ch.param].scaling;
      const lowbit_dtype_t gd = to_lowbit_dtype(dyn.gdtype);
      float* out = a.out + ob.offset;
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
        const float g = load_element(dyn.grad, gd, i);
        out[i] = ob.mask && !ob.mask[i] ? 0.f : onebit_local_momentum(s, m[i], g) * scaling;
      }
      return;
    }
    case kLambWarmupB: {
      const StepScalars s = a.scalars[dyn.scalar_idx];
      const float step = s.lr * a.lamb[ch.param].trust;
      const lowbit_dtype_t gd = to_lowbit_dtype(dyn.gdtype);
      float* fresh = a.fresh_v + ob.offset;
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
        const float g = load_element(dyn.grad, gd, i);
        float p = load_param_element(P.param, pd, r, P.ecc, i);
        float mk = m[i], vk = v[i];
        lamb_moments(s, g, mk, vk);
        p -= step * lamb_update(mk, vk, p, s.eps, s.weight_decay);
        m[i] = ob.mask && !ob.mask[i] ? 0.f : mk;
        v[i] = vk;
        if (a.seed_fresh_v) fresh[i] = vk;
        store_param_element(P.param, pd, r, P.ecc, dyn.key, i, p);
      }
      return;
    }
    case kLambCompressedB: {
      const StepScalars s = a.scalars[dyn.scalar_idx];
      const float step = s.lr * a.lamb[ch.param].trust;
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
        float p = load_param_element(P.param, pd, r, P.ecc, i);
        p -= step * lamb_update(m[i], v[i], p, s.eps, s.weight_decay);
        store_param_element(P.param, pd, r, P.ecc, dyn.key, i, p);
      }
      return;
    }
    default: return;
  }
}

// LAMB's passes A: one block per chunk, the fixed reduction order (lane l
// is thread l; core/onebit_rules.hpp's LambReducer on the host). Maxima:
// fmaxf, which like the host's std::max(max, x) passes over a NaN x.
__global__ void __launch_bounds__(kThreads) onebit_ext_reduce_kernel(const OneBitExtArgs a) {
  __shared__ double lane_a[kLambLanes], lane_b[kLambLanes];
  __shared__ float lane_max[kLambLanes];
  // kLambScalingA runs outside any step; the others belong to one.
  if (a.op != kLambScalingA && skip_flag_set(a.skip_flag)) return;
  const int64_t k = blockIdx.x;
  const DevChunk ch = a.chunks[k];
  const DevParam P = a.params[ch.param];
  const DevOneBit ob = a.onebit[ch.param];
  const DevDyn dyn = a.dyn[ch.param];
  const lowbit_dtype_t pd = to_lowbit_dtype(P.pdtype);
  const int32_t r = int32_t(P.rounding);
  float* m = static_cast<float*>(P.mdata[0]);
  const float* v = static_cast<const float*>(P.mdata[1]);
  const int l = int(threadIdx.x);
  double sa = 0.0, sb = 0.0;
  float mx = 0.f;
  int bad = 0;
  switch (a.op) {
    case kLambWarmupA: {
      const StepScalars s = a.scalars[dyn.scalar_idx];
      const lowbit_dtype_t gd = to_lowbit_dtype(dyn.gdtype);
      for (int64_t i = ch.begin + l; i < ch.end; i += kLambLanes) {
        const float g = load_element(dyn.grad, gd, i);
        bad |= int(!isfinite(g));
        const float p = load_param_element(P.param, pd, r, P.ecc, i);
        float mk = m[i], vk = v[i];
        lamb_moments(s, g, mk, vk);
        const float u = lamb_update(mk, vk, p, s.eps, s.weight_decay);
        sa += double(p) * double(p);
        sb += double(u) * double(u);
      }
      break;
    }
    case kLambCompressedA: {
      const StepScalars s = a.scalars[dyn.scalar_idx];
      const float scaling = a.lamb[ch.param].scaling;
      const float* bucket = a.bucket + ob.offset;
      float* fresh = a.fresh_v + ob.offset;
      for (int64_t i = ch.begin + l; i < ch.end; i += kLambLanes) {
        const float p = load_param_element(P.param, pd, r, P.ecc, i);
        float pre, u;
        const float ratio =
            lamb_compressed_element(s, ob.mask && !ob.mask[i], bucket[i], scaling, m[i], v[i], fresh[i], p, pre, u);
        mx = fmaxf(mx, ratio);
        sa += double(pre) * double(pre);
        sb += double(u) * double(u);
      }
      break;
    }
    case kLambScalingA: {
      for (int64_t i = ch.begin + l; i < ch.end; i += kLambLanes) sa += double(m[i]) * double(m[i]);
      break;
    }
    default: break;
  }
  lane_a[l] = sa;
  lane_b[l] = sb;
  lane_max[l] = mx;
  __syncthreads();
  for (int h = kLambLanes / 2; h > 0; h >>= 1) {
    if (l < h) {
      lane_a[l] += lane_a[l + h];
      lane_b[l] += lane_b[l + h];
      lane_max[l] = fmaxf(lane_max[l], lane_max[l + h]);
    }
    __syncthreads();
  }
  bad = __syncthreads_or(bad);
  if (l == 0) {
    LambPartial out;
    out.sum_a = lane_a[0];
    out.sum_b = lane_b[0];
    out.max_ratio = lane_max[0];
    out.nonfinite = bad ? 1 : 0;
    a.partials[k] = out;
  }
}

// The first chunk of parameter p (chunks are in parameter order, every
// parameter has at least one).
__device__ __forceinline__ int64_t first_chunk(const DevChunk* chunks, int64_t num_chunks, int64_t p) {
  int64_t lo = 0, hi = num_chunks;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (chunks[mid].param < p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// LAMB's per-parameter passes: one block.
__global__ void __launch_bounds__(kThreads) onebit_ext_param_kernel(const OneBitExtArgs a) {
  __shared__ double mean_rms;
  const int l = int(threadIdx.x);
  if (a.op == kLambScalingFinish) {
    // rms of every parameter (kept in its first chunk's sum_b), their mean in
    // parameter order, then the scalings.
    for (int64_t p = l; p < a.num_params; p += kThreads) {
      const int64_t k0 = first_chunk(a.chunks, a.num_chunks, p);
      double sum = 0.0;
      for (int64_t k = k0; k < a.num_chunks && a.chunks[k].param == p; ++k) sum += a.partials[k].sum_a;
      a.partials[k0].sum_b = sqrt(sum / double(a.params[p].numel));  // bound params have numel > 0
    }
    __syncthreads();
    if (l == 0) {
      double total = 0.0;
      for (int64_t p = 0; p < a.num_params; ++p) total += a.partials[first_chunk(a.chunks, a.num_chunks, p)].sum_b;
      mean_rms = a.num_params > 0 ? total / double(a.num_params) : 0.0;
    }
    __syncthreads();
    for (int64_t p = l; p < a.num_params; p += kThreads)
      a.lamb[p].scaling = lamb_scaling(a.partials[first_chunk(a.chunks, a.num_chunks, p)].sum_b, mean_rms);
    return;
  }
  // A step skipped before (the exchange, a bad lr) or, in the warm-up, a
  // non-finite gradient anywhere: nothing changes, the flag says so.
  int skip = skip_flag_set(a.skip_flag) ? 1 : 0;
  if (a.op == kLambWarmupTrust && a.check_nonfinite)
    for (int64_t k = l; k < a.num_chunks; k += kThreads) skip |= a.partials[k].nonfinite != 0 ? 1 : 0;
  if (__syncthreads_or(skip)) {
    if (l == 0) *a.skip_flag = 1;
    return;
  }
  for (int64_t p = l; p < a.num_params; p += kThreads) {
    const int64_t k0 = first_chunk(a.chunks, a.num_chunks, p);
    double sa = 0.0, sb = 0.0;
    float mx = 0.f;
    for (int64_t k = k0; k < a.num_chunks && a.chunks[k].param == p; ++k) {
      sa += a.partials[k].sum_a;
      sb += a.partials[k].sum_b;
      mx = fmaxf(mx, a.partials[k].max_ratio);
    }
    LambScalars sc = a.lamb[p];
    if (a.op == kLambWarmupTrust) {
      sc.trust = lamb_warmup_trust(sa, sb, a.options, sc.coeff_freeze);
    } else {
      const float wd = a.scalars[a.dyn[p].scalar_idx].weight_decay;
      sc.trust = lamb_compressed_trust(mx, sa, sb, wd, a.options, sc.coeff_freeze, sc.last_factor);
    }
    a.lamb[p] = sc;
  }
}

}  // namespace cuda
}  // namespace lowbit
