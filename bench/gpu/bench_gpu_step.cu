// GPU step benchmark over the two layouts of DESIGN.md:
//   llama1b    TinyLlama-1.1B: embed, 22 x (q, k, v, o, gate, up, down, 2 norms),
//              final norm, lm head: 201 tensors, 1,100,048,384 params;
//   many_small 2000 tensors of 128 x 256.
// For each configuration it prints the median ms/step (CUDA events around each
// lowbit_optimizer_step), the wall-clock ms/step of back-to-back steps (host
// work and launches included), the host's ms/step to enqueue them (before the
// final synchronisation), the bytes the step must move, and the fraction
// of the device's copy bandwidth that is, where
//   bytes = params (read + write) + grads (read) + each moment's codes and
//           scales (read + write) + error-correction bytes (read + write)
//           [+ grads read once more by the non-finite check when skip_nonfinite = 1]
// (tensors under min_quantized_numel keep fp32 state, as the library does),
// and copy bandwidth = 2 x bytes / time of a 1 GiB device-to-device copy (read +
// write; the better median of cudaMemcpyAsync and a 16-byte-per-thread copy
// kernel, 10 each), measured in the same run.
// The Muon configurations step llama1b's 154 block matrices (q, k, v, o, gate,
// up, down of the 22 layers; torch.optim.Muon's recipe leaves the embedding,
// head and norms to AdamW) with their 2-D shapes: each step is the momentum
// pass and the Newton-Schulz products (cuBLAS, bf16 by default on CUDA), so
// besides the bytes of the element-wise passes (grads read, momentum read +
// written, params read + written, the fp32 update written twice and read three
// times) it
// prints the products' nominal rate (ns_steps x (4 m^2 n + 2 m^3) flops per m x n
// matrix, m <= n).
// Not a test: prints a table, asserts nothing.
//
// Usage: bench_gpu_step [layout|all] [config[,config...]|all] [iters]
//   configs: adamw8 adamw4 adamw4_sr lion8 lion4_sr adamw32 adamw8_sr adamw8_ecc adamwfp8 adamw8_check
//            adamw4_rank1 adamw4_factor muon32 muon8 muon4 muon4_sr (Muon: llama1b only)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "lowbit.h"

namespace {

#define CK(call)                                                                                        \
  do {                                                                                                  \
    cudaError_t e_ = (call);                                                                            \
    if (e_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));        \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

#define LB(call)                                                                                        \
  do {                                                                                                  \
    lowbit_status_t s_ = (call);                                                                        \
    if (s_ != LOWBIT_SUCCESS) {                                                                         \
      std::fprintf(stderr, "%s:%d %s: %s (%s)\n", __FILE__, __LINE__, #call, lowbit_status_string(s_), \
                   lowbit_last_error());                                                                \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

// llama1b's block matrices (rows, cols), as torch's nn.Linear weights: q, k, v, o, gate, up, down per layer.
std::vector<std::pair<int64_t, int64_t>> llama1b_matrices() {
  const int64_t h = 2048, inter = 5632, kv = 256;
  std::vector<std::pair<int64_t, int64_t>> m;
  for (int l = 0; l < 22; ++l)
    m.insert(m.end(), {{h, h}, {kv, h}, {kv, h}, {h, h}, {inter, h}, {inter, h}, {h, inter}});
  return m;
}

std::vector<int64_t> layout(const std::string& name) {
  std::vector<int64_t> t;
  if (name == "llama1b") {
    const int64_t h = 2048, inter = 5632, kv = 256, vocab = 32000;
    t.push_back(vocab * h);
    for (int l = 0; l < 22; ++l) {
      t.insert(t.end(), {h * h, kv * h, kv * h, h * h, inter * h, inter * h, h * inter, h, h});
    }
    t.push_back(h);
    t.push_back(vocab * h);
  } else if (name == "many_small") {
    t.assign(2000, 128 * 256);
  }
  return t;
}

struct Config {
  const char* name;
  lowbit_algorithm_t algo;
  lowbit_state_format_t format;
  lowbit_dtype_t dtype;
  int sr, ecc, skip_nonfinite;
  int preset = 0;  // a lowbit_preset_t; the shaped ones (rank-1, factor): tensors of >= 1M elements get a 2-D
                   // shape (rows = largest divisor <= sqrt)
};

bool shaped_preset(const Config& c) {
  return c.preset == LOWBIT_PRESET_LPMM_ADAMW_4BIT || c.preset == LOWBIT_PRESET_ADAMW_4BIT_FACTOR;
}

const Config kConfigs[] = {
    {"adamw8", LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0},
    {"adamw4", LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_4BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0},
    // the recommended 4-bit preset: m 4BIT_SR (stochastic codes), v 4BIT
    {"adamw4_sr", LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_4BIT_SR, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0,
     LOWBIT_PRESET_ADAMW_4BIT_SR},
    {"lion8", LOWBIT_ALGORITHM_LION, LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0},
    {"lion4_sr", LOWBIT_ALGORITHM_LION, LOWBIT_STATE_4BIT_SR, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0},
    {"adamw32", LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_FP32, LOWBIT_DTYPE_FLOAT32, 0, 0, 0},
    {"adamw8_sr", LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 1, 0, 0},
    {"adamw8_ecc", LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 1, 0},
    {"adamwfp8", LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_FP8, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0},
    {"adamw8_check", LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0, 1},
    {"adamw4_rank1", LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_4BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0,
     LOWBIT_PRESET_LPMM_ADAMW_4BIT},
    {"adamw4_factor", LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_4BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0,
     LOWBIT_PRESET_ADAMW_4BIT_FACTOR},
    {"muon32", LOWBIT_ALGORITHM_MUON, LOWBIT_STATE_FP32, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0},
    {"muon8", LOWBIT_ALGORITHM_MUON, LOWBIT_STATE_8BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0},
    {"muon4", LOWBIT_ALGORITHM_MUON, LOWBIT_STATE_4BIT, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0},
    {"muon4_sr", LOWBIT_ALGORITHM_MUON, LOWBIT_STATE_4BIT_SR, LOWBIT_DTYPE_BFLOAT16, 0, 0, 0},
};

// Deterministic pseudo-random values of about `scale`, stored as fp32 or bf16.
__global__ void fill(void* out, int64_t n, int wide, float scale, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 29)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 32;
    float v = (float(uint32_t(z) >> 8) * (1.f / 16777216.f) - 0.5f) * 2.f * scale;
    if (wide) {
      static_cast<float*>(out)[i] = v;
    } else {
      uint32_t u = __float_as_uint(v);
      u += 0x7FFFu + ((u >> 16) & 1u);
      static_cast<uint16_t*>(out)[i] = uint16_t(u >> 16);
    }
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A plain 16-byte-per-thread copy: the reference is the better of this and
// cudaMemcpyAsync, so that a slow memcpy cannot flatter the step.
__global__ void copy_kernel(const int4* __restrict__ in, int4* __restrict__ out, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = in[i];
}

double copy_bandwidth(cudaStream_t s) {
  const size_t bytes = size_t(1) << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < 23; ++i) {
    CK(cudaEventRecord(e0, s));
    if (i & 2) {
      CK(cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, s));
    } else {
      copy_kernel<<<4 * 132 * 8, 256, 0, s>>>(static_cast<const int4*>(i & 1 ? b : a), static_cast<int4*>(i & 1 ? a : b),
                                             bytes / sizeof(int4));
      CK(cudaGetLastError());
    }
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 3) t.push_back(ms * 1e-3);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(a));
  CK(cudaFree(b));
  // best of each kind's median: cudaMemcpyAsync (i & 2) and the copy kernel
  std::vector<double> mc, ck;
  for (size_t j = 0; j < t.size(); ++j) ((j + 3) & 2 ? mc : ck).push_back(t[j]);
  return 2.0 * double(bytes) / std::min(median(mc), median(ck));
}

double moment_bytes(lowbit_state_format_t f, int64_t n) {
  switch (f) {
    case LOWBIT_STATE_FP32: return 4.0 * n;
    case LOWBIT_STATE_BF16: return 2.0 * n;
    case LOWBIT_STATE_8BIT:
    case LOWBIT_STATE_FP8: return double(n) + 4.0 * double((n + 255) / 256);
    case LOWBIT_STATE_4BIT:
    case LOWBIT_STATE_4BIT_SR: return double((n + 1) / 2) + 4.0 * double((n + 127) / 128);
    default: return 0;
  }
}

void run(const std::string& lname, const Config& c, int iters, double copy_bw, cudaStream_t s) {
  const bool muon = c.algo == LOWBIT_ALGORITHM_MUON;
  const std::vector<std::pair<int64_t, int64_t>> mats = muon ? llama1b_matrices() : std::vector<std::pair<int64_t, int64_t>>{};
  std::vector<int64_t> sizes = layout(lname);
  if (muon) {
    sizes.clear();
    for (const auto& m : mats) sizes.push_back(m.first * m.second);
  }
  const int64_t np = int64_t(sizes.size());
  double ns_flops = 0;  // the Newton-Schulz products of one step (nominal)
  lowbit_hparams_t h;
  LB(lowbit_hparams_init(&h, c.algo));
  for (const auto& m : mats) {
    const double a = double(std::min(m.first, m.second)), b = double(std::max(m.first, m.second));
    ns_flops += double(h.ns_steps) * (4.0 * a * a * b + 2.0 * a * a * a);
  }
  const size_t eb = c.dtype == LOWBIT_DTYPE_FLOAT32 ? 4 : 2;
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  char *params = nullptr, *grads = nullptr;
  size_t align = 256;
  size_t padded = 0;
  for (int64_t n : sizes) padded += (size_t(n) * eb + align - 1) / align * align;
  CK(cudaMalloc(&params, padded));
  CK(cudaMalloc(&grads, padded));

  lowbit_optimizer_config_t cfg;
  LB(lowbit_optimizer_config_init(&cfg, c.algo));
  if (c.preset) LB(lowbit_optimizer_config_preset(&cfg, lowbit_preset_t(c.preset)));
  cfg.device = LOWBIT_DEVICE_CUDA;
  cfg.state_format = c.format;
  cfg.stochastic_rounding = c.sr;
  cfg.error_correction = c.ecc;
  cfg.skip_nonfinite = c.skip_nonfinite;
  lowbit_optimizer_t opt;
  LB(lowbit_optimizer_create(&opt, &cfg, &h));
  size_t off = 0;
  double bytes = 0;
  for (int64_t i = 0; i < np; ++i) {
    const int64_t n = sizes[size_t(i)];
    fill<<<1024, 256, 0, s>>>(params + off, n, eb == 4, 0.02f, uint64_t(i) * 7919);
    fill<<<1024, 256, 0, s>>>(grads + off, n, eb == 4, 1e-3f, uint64_t(i) * 104729 + 1);
    lowbit_param_config_t pc;
    LB(lowbit_param_config_init(&pc));
    pc.param = lowbit_tensor_t{params + off, n, c.dtype, LOWBIT_DEVICE_CUDA, 0};
    pc.grad = lowbit_tensor_t{grads + off, n, c.dtype, LOWBIT_DEVICE_CUDA, 0};
    if (muon) {
      pc.ndim = 2;
      pc.shape[0] = mats[size_t(i)].first;
      pc.shape[1] = mats[size_t(i)].second;
    } else if (shaped_preset(c) && n >= (int64_t(1) << 20)) {
      int64_t rows = 1;
      for (int64_t d = 1; d * d <= n; ++d)
        if (n % d == 0) rows = d;
      pc.ndim = 2;
      pc.shape[0] = rows;
      pc.shape[1] = n / rows;
    }
    int64_t id;
    LB(lowbit_optimizer_add_param(opt, &pc, &id));
    lowbit_param_info_t info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    LB(lowbit_optimizer_param_info(opt, id, &info));
    bytes += double(n) * double(3 * eb);  // param read + write, grad read
    if (c.skip_nonfinite) bytes += double(n) * double(eb);
    if (muon) {
      // the fp32 update: written by the momentum pass, read by the norm pass, read and written by the
      // scale pass, read by the last pass (the products' own traffic is not counted)
      bytes += 2 * moment_bytes(info.state_format, n) + 5.0 * 4.0 * double(n);
    } else if (shaped_preset(c)) {
      // shaped: the state as allocated, read and written; pass 1 reads the grads and a rank-1 v's
      // codes once (both maxima in one read, rows a multiple of 8 long), a factored v's grads twice
      // (rows, then columns)
      bytes += 2.0 * double(info.state_bytes);
      if (info.second_normalization == LOWBIT_NORMALIZATION_RANK1 && pc.shape[1] % 8 == 0)
        bytes += double(n) * double(eb) + double(n) / 2;
      else
        bytes += 2.0 * double(n) * double(eb) + (info.second_normalization == LOWBIT_NORMALIZATION_RANK1 ? double(n) : 0.0);
    } else {
      bytes += 2 * moment_bytes(info.state_format, n);
      if (c.algo == LOWBIT_ALGORITHM_ADAMW) bytes += 2 * moment_bytes(info.second_state_format, n);
    }
    if (info.error_correction) bytes += 2.0 * double(n);
    off += (size_t(n) * eb + align - 1) / align * align;
  }
  CK(cudaStreamSynchronize(s));

  for (int i = 0; i < 3; ++i) LB(lowbit_optimizer_step(opt, s));  // warm-up (tables uploaded)
  CK(cudaStreamSynchronize(s));
  std::vector<cudaEvent_t> ev(size_t(2 * iters));
  for (cudaEvent_t& e : ev) CK(cudaEventCreate(&e));
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(ev[size_t(2 * i)], s));
    LB(lowbit_optimizer_step(opt, s));
    CK(cudaEventRecord(ev[size_t(2 * i + 1)], s));
  }
  // Host time to enqueue all steps: with no host wait inside a step it is far
  // below the GPU time (the loop runs ahead of the device).
  const double enqueue = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  CK(cudaStreamSynchronize(s));
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    float ms;
    CK(cudaEventElapsedTime(&ms, ev[size_t(2 * i)], ev[size_t(2 * i + 1)]));
    t.push_back(ms * 1e-3);
  }
  for (cudaEvent_t& e : ev) cudaEventDestroy(e);
  const double med = median(t);
  std::printf("%-11s %-13s %5lld %14lld %10.3f %9.3f %9.3f %9.3f %8.1f %8.1f %7.1f%%", lname.c_str(), c.name,
              (long long)np, (long long)total, bytes / 1e9, med * 1e3, wall * 1e3, enqueue * 1e3, bytes / med / 1e9,
              copy_bw / 1e9, 100.0 * bytes / med / copy_bw);
  if (muon) std::printf("  Newton-Schulz %.1f TFLOP/s (nominal, %d steps)", ns_flops / med / 1e12, int(h.ns_steps));
  std::printf("\n");
  std::fflush(stdout);
  LB(lowbit_optimizer_destroy(opt));
  CK(cudaFree(params));
  CK(cudaFree(grads));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string lsel = argc > 1 ? argv[1] : "all";
  const std::string csel = argc > 2 ? argv[2] : "all";
  const int iters = argc > 3 ? std::atoi(argv[3]) : 30;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double bw = copy_bandwidth(s);
  std::printf("device: %s (%d SMs), copy bandwidth %.1f GB/s (1 GiB D2D copy, read + write)\n", prop.name,
              prop.multiProcessorCount, bw / 1e9);
  std::printf("%-11s %-13s %5s %14s %10s %9s %9s %9s %8s %8s %8s\n", "layout", "config", "tens", "params", "GB/step",
              "ms(med)", "wall ms", "host ms", "GB/s", "copyGB/s", "of copy");
  for (const char* l : {"llama1b", "many_small"}) {
    if (lsel != "all" && lsel != l) continue;
    for (const Config& c : kConfigs) {
      if (csel != "all" && ("," + csel + ",").find("," + std::string(c.name) + ",") == std::string::npos) continue;
      if (c.algo == LOWBIT_ALGORITHM_MUON && std::string(l) != "llama1b") continue;  // llama1b's matrices
      run(l, c, iters, bw, s);
    }
  }
  CK(cudaStreamDestroy(s));
  return 0;
}
