// Device code of 1-bit Adam's element-wise passes (core/onebit_adam.cpp):
// gathering the gradients into the flat bucket, zeroing masked momentum after
// a warm-up step, the local momentum of the compressed stage, and its update
// from the exchanged momentum (or, blended into m, from the exchanged
// gradient: 0/1 Adam's 1-bit steps). The per-element math is core/update_rules.hpp
// and core/param_io.hpp, as in the CPU engine, so both give the same bits.
// Block b works on part b % kSplit of chunk b / kSplit; threads stride over
// the elements (scalar loads: these passes run once per step next to a
// collective). Launched from onebit_kernels.cu.
#pragma once
#ifndef LOWBIT_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include "core/param_io.hpp"
#include "core/update_rules.hpp"
#include "cuda/onebit_device.cuh"
#include "cuda/tables.hpp"

namespace lowbit {
namespace cuda {

__global__ void __launch_bounds__(kThreads) onebit_kernel(const OneBitArgs a) {
  if ((a.op == kOneBitMask || a.op == kOneBitApply) && skip_flag_set(a.skip_flag)) return;
  const ChunkPart cp = chunk_part(a.chunks, blockIdx.x);
  const DevChunk ch = cp.chunk;
  const int64_t begin = cp.begin, end = cp.end;
  const DevParam P = a.params[ch.param];
  const DevOneBit ob = a.onebit[ch.param];
  const DevDyn dyn = a.dyn[ch.param];
  float* m = static_cast<float*>(P.mdata[0]);
  float* bucket = a.bucket + ob.offset;
  switch (a.op) {
    case kOneBitGather: {
      const lowbit_dtype_t gd = to_lowbit_dtype(dyn.gdtype);
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) bucket[i] = load_element(dyn.grad, gd, i);
      return;
    }
    case kOneBitMask: {
      if (!ob.mask) return;
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads)
        if (!ob.mask[i]) m[i] = 0.f;
      return;
    }
    case kOneBitMomentum: {
      const lowbit_dtype_t gd = to_lowbit_dtype(dyn.gdtype);
      StepScalars s{};
      s.beta1 = a.hparams[P.group].beta1;
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
        const float g = load_element(dyn.grad, gd, i);
        bucket[i] = ob.mask && !ob.mask[i] ? 0.f : onebit_local_momentum(s, m[i], g);
      }
      return;
    }
    case kOneBitApply: {
      const StepScalars s = a.scalars[dyn.scalar_idx];
      const lowbit_dtype_t pd = to_lowbit_dtype(P.pdtype);
      const float* v = static_cast<const float*>(P.mdata[1]);
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
        // blend (0/1 Adam's 1-bit gradient steps): the bucket holds the averaged gradient.
        const float mk = ob.mask && !ob.mask[i] ? 0.f : (a.blend ? onebit_local_momentum(s, m[i], bucket[i]) : bucket[i]);
        m[i] = mk;
        float p = load_param_element(P.param, pd, P.rounding, P.ecc, i);
        onebit_apply(s, p, mk, v[i]);
        store_param_element(P.param, pd, P.rounding, P.ecc, dyn.key, i, p);
      }
      return;
    }
    default: return;
  }
}

}  // namespace cuda
}  // namespace lowbit
