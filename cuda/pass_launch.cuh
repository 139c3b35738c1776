// The CUDA engine's launcher of passes (core/pass.hpp), one for every rule:
//  - element sweeps: block b works on part b % kSplit of chunk b / kSplit,
//    threads stride over its elements (one load per tensor the rule reads,
//    one store per tensor it writes: these passes run next to collectives,
//    not at the step's rate);
//  - reductions: one block of kPassLanes threads per chunk, thread l is
//    lane l (elements begin + l, begin + l + kPassLanes, ... in order), the
//    lanes combined by the pairwise tree, into the engine's partials;
//  - the finish: one block; thread l takes the params l, l + kThreads, ...
//    and adds each one's chunk partials in chunk order; finish_all on
//    thread 0 after them.
// A pass of a skipped step (honor_skip) returns at once in every kernel. The
// element math is the rule's, with core/param_io.hpp's loads and stores, so
// the CPU engine (core/cpu_pass.hpp) gives the same bits. Instantiated by
// the layer owning the rules (a .cu file; tests/cuda/emu for the host
// emulation, which defines LOWBIT_CUDA_EMULATION).
#pragma once
#ifndef LOWBIT_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include "core/param_io.hpp"
#include "core/pass.hpp"
#include "cuda/tables.hpp"

namespace lowbit {
namespace cuda {

static_assert(kPassLanes == kThreads, "a reduction is one CUDA block of kThreads");

__device__ __forceinline__ lowbit_dtype_t to_lowbit_dtype(uint8_t d) {
  return d == kF32 ? LOWBIT_DTYPE_FLOAT32 : (d == kBF16 ? LOWBIT_DTYPE_BFLOAT16 : LOWBIT_DTYPE_FLOAT16);
}

__device__ __forceinline__ bool skip_flag_set(const int32_t* flag) {
  return *static_cast<const volatile int32_t*>(flag) != 0;
}

// What the rule sees of parameter p.
__device__ __forceinline__ PassParam pass_param(const PassTables& t, int64_t p) {
  const DevParam& P = t.params[p];
  return PassParam{p, P.numel, P.group, &t.scalars[p], &t.hparams[P.group]};
}

// Element i of parameter p through the rule: loads, element(), stores.
template <class Rule>
__device__ __forceinline__ PassElement pass_element(const Rule& rule, const typename Rule::Ctx& c, const DevParam& P,
                                                     const DevDyn& dyn, const DevFlat& flat, int64_t i) {
  constexpr uint32_t R = Rule::kReads, W = Rule::kWrites;
  const lowbit_dtype_t pd = to_lowbit_dtype(P.pdtype);
  const int32_t r = int32_t(P.rounding);
  float* m = static_cast<float*>(P.mdata[0]);
  float* v = static_cast<float*>(P.mdata[1]);
  PassElement e{};
  e.keep = true;
  if (R & kIoParam) e.p = load_param_element(P.param, pd, r, P.ecc, i);
  if (R & kIoGrad) e.g = load_element(dyn.grad, to_lowbit_dtype(dyn.gdtype), i);
  if (R & kIoM) e.m = m[i];
  if (R & kIoV) e.v = v[i];
  if (R & kIoX) e.x = rule.x[flat.offset + i];
  if (R & kIoY) e.y = rule.y[flat.offset + i];
  if (R & kIoMask) e.keep = !flat.mask || flat.mask[i] != 0;
  rule.element(c, e);
  if (W & kIoParam) store_param_element(P.param, pd, r, P.ecc, dyn.key, i, e.p);
  if (W & kIoM) m[i] = e.m;
  if (W & kIoV) v[i] = e.v;
  if (W & kIoX) rule.x[flat.offset + i] = e.x;
  if (W & kIoYStoredParam)
    rule.y[flat.offset + i] = load_param_element(P.param, pd, r, P.ecc, i);
  else if (W & kIoY)
    rule.y[flat.offset + i] = e.y;
  return e;
}

template <class Rule>
__global__ void __launch_bounds__(kThreads) pass_sweep_kernel(const PassTables t, const Rule rule, int32_t honor_skip,
                                                               int32_t stepped_only) {
  if (honor_skip && skip_flag_set(t.skip_flag)) return;
  const DevChunk ch = t.chunks[blockIdx.x / kSplit];
  const DevFlat flat = t.flat[ch.param];
  if (Rule::kMaskedOnly && !flat.mask) return;
  if (stepped_only && t.dyn[ch.param].grad == nullptr) return;
  const int64_t per = (ch.end - ch.begin + kSplit - 1) / kSplit;
  const int64_t begin = ch.begin + per * int64_t(blockIdx.x % kSplit);
  const int64_t end = begin + per < ch.end ? begin + per : ch.end;
  const DevParam P = t.params[ch.param];
  const DevDyn dyn = t.dyn[ch.param];
  const typename Rule::Ctx c = rule.param(pass_param(t, ch.param));
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) pass_element(rule, c, P, dyn, flat, i);
}

template <class Rule>
__global__ void __launch_bounds__(kThreads) pass_reduce_kernel(const PassTables t, const Rule rule, int32_t honor_skip,
                                                                int32_t stepped_only) {
  __shared__ double lane_a[kPassLanes], lane_b[kPassLanes];
  __shared__ float lane_max[kPassLanes];
  if (honor_skip && skip_flag_set(t.skip_flag)) return;
  const int64_t k = blockIdx.x;
  const DevChunk ch = t.chunks[k];
  const DevParam P = t.params[ch.param];
  const DevDyn dyn = t.dyn[ch.param];
  const DevFlat flat = t.flat[ch.param];
  const int l = int(threadIdx.x);
  double sa = 0.0, sb = 0.0;
  float mx = 0.f;
  int bad = 0;
  if (!(Rule::kMaskedOnly && !flat.mask) && !(stepped_only && dyn.grad == nullptr)) {
    const typename Rule::Ctx c = rule.param(pass_param(t, ch.param));
    for (int64_t i = ch.begin + l; i < ch.end; i += kPassLanes) {
      const PassElement e = pass_element(rule, c, P, dyn, flat, i);
      if (Rule::kReduce & kSumA) sa += e.ra;
      if (Rule::kReduce & kSumB) sb += e.rb;
      if (Rule::kReduce & kMax) mx = fmaxf(mx, e.rmax);  // passes over a NaN, as the host's std::max(mx, x)
      if (Rule::kReduce & kBad) bad |= int(e.bad);
    }
  }
  lane_a[l] = sa;
  lane_b[l] = sb;
  lane_max[l] = mx;
  __syncthreads();
  for (int h = kPassLanes / 2; h > 0; h >>= 1) {
    if (l < h) {
      lane_a[l] += lane_a[l + h];
      lane_b[l] += lane_b[l + h];
      lane_max[l] = fmaxf(lane_max[l], lane_max[l + h]);
    }
    __syncthreads();
  }
  bad = __syncthreads_or(bad);
  if (l == 0) t.partials[k] = PassPartial{lane_a[0], lane_b[0], lane_max[0], bad ? 1 : 0};
}

// The first chunk of parameter p (chunks are in parameter order, every
// bound parameter has at least one).
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

// The parameters as finish_all() sees them.
struct DevPassParams {
  const PassTables* t;
  __device__ int64_t size() const { return t->num_params; }
  __device__ int64_t numel(int64_t i) const { return t->params[i].numel; }
};

template <class Rule>
__global__ void __launch_bounds__(kThreads) pass_finish_kernel(const PassTables t, const Rule rule, int32_t honor_skip,
                                                                int32_t skip_on_bad, int32_t stepped_only) {
  const int l = int(threadIdx.x);
  int skip = honor_skip && skip_flag_set(t.skip_flag) ? 1 : 0;
  if (__syncthreads_or(skip)) return;
  int bad = 0;
  if (Rule::kReduce & kBad)
    for (int64_t k = l; k < t.num_chunks; k += kThreads) bad |= t.partials[k].bad != 0 ? 1 : 0;
  bad = __syncthreads_or(bad);
  if (skip_on_bad && bad) {
    if (l == 0) *t.skip_flag = 1;
    return;
  }
  if (Rule::kFinish)
    for (int64_t p = l; p < t.num_params; p += kThreads) {
      if (stepped_only && t.dyn[p].grad == nullptr) continue;
      PassSums s{0.0, 0.0, 0.f};
      for (int64_t k = first_chunk(t.chunks, t.num_chunks, p); k < t.num_chunks && t.chunks[k].param == p; ++k) {
        s.a += t.partials[k].a;
        s.b += t.partials[k].b;
        s.max = fmaxf(s.max, t.partials[k].max);
      }
      rule.finish(pass_param(t, p), s);
    }
  if (Rule::kFinishAll) {
    __syncthreads();
    if (l == 0) rule.finish_all(DevPassParams{&t}, bad != 0);
  }
}

template <class Rule>
void launch_pass(const PassTables& t, const Rule& rule, const PassStep& step, void* stream) {
  if (t.num_chunks <= 0 || t.num_params <= 0) return;
  const int32_t honor = step.honor_skip ? 1 : 0, on_bad = step.skip_on_bad ? 1 : 0, only = step.stepped_only ? 1 : 0;
  const bool finish = Rule::kFinish || Rule::kFinishAll || (step.skip_on_bad && (Rule::kReduce & kBad));
#ifdef LOWBIT_CUDA_EMULATION
  if (Rule::kReduce)
    emu::launch(unsigned(t.num_chunks), kThreads, [=] { pass_reduce_kernel<Rule>(t, rule, honor, only); }, stream);
  else
    emu::launch(unsigned(t.num_chunks * kSplit), kThreads, [=] { pass_sweep_kernel<Rule>(t, rule, honor, only); }, stream);
  if (finish) emu::launch(1, kThreads, [=] { pass_finish_kernel<Rule>(t, rule, honor, on_bad, only); }, stream);
#else
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (Rule::kReduce)
    pass_reduce_kernel<Rule><<<dim3(unsigned(t.num_chunks)), dim3(kThreads), 0, s>>>(t, rule, honor, only);
  else
    pass_sweep_kernel<Rule><<<dim3(unsigned(t.num_chunks * kSplit)), dim3(kThreads), 0, s>>>(t, rule, honor, only);
  if (finish) pass_finish_kernel<Rule><<<dim3(1), dim3(kThreads), 0, s>>>(t, rule, honor, on_bad, only);
#endif
}

}  // namespace cuda
}  // namespace lowbit

// Explicit instantiation of launch_pass for one rule (X of LOWBIT_DISTRIBUTED_RULES).
#define LOWBIT_INSTANTIATE_CUDA_PASS(Rule)                                                                         \
  template void lowbit::cuda::launch_pass<Rule>(const ::lowbit::cuda::PassTables&, const Rule&, \
                                                 const ::lowbit::PassStep&, void*);
