// The CUDA engine (cuda/cuda_engine.cpp with the kernel source of
// cuda/step_kernel.cuh and cuda/aux_kernels.cuh) run under the host emulation
// of tests/cuda/emu against the CPU engine: runs in CI, without a GPU.
//
// Every algorithm (AdamW, Adam, Lion, SGD with momentum / Nesterov / plain) x
// state format (fp32, bf16, 8-bit, 4-bit, FP8, 8-bit m + 4-bit v, FP8 m +
// bf16 v, 4BIT_SR, 4BIT_SR m + 4-bit v: the fast loops' stochastic codes) x
// param/grad dtype and rounding (10 cases: fp32/bf16/fp16 params,
// fp32/bf16/fp16 grads, nearest / stochastic rounding / error correction)
// takes 3 steps on fresh random inputs on both engines, through the engine
// interface exactly as Optimizer drives it (bind, set_hparams, step: the
// scalars, rounding keys and step counts are the engines' own, on the device
// for CUDA). Parameters cover an unaligned base (scalar load path), a 4-bit
// tensor whose second block has one element (129), a single element, a 4-bit
// block boundary inside a partial tile (4100), two groups, a parameter
// without a gradient on step 2, and a NaN gradient (step skipped by both,
// step counts included). A larger set adds three chunks with a partial last
// tile (140001) and an all-zero block. The emulation computes with the
// host's arithmetic, so the result must be bit-identical: params,
// error-correction bytes, codes, scales and step counts.
//
// Muon's momentum step (Algo::Muon: its result to a flat fp32 output, the
// param untouched) is compared the same way, the output included.
//
// The JAX form of a step (one shared count read and written by the engine,
// lr from engine memory, the recorded layout checked by the engine) and the
// 1-bit Adam passes are checked the same way.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "core/algorithms.hpp"
#include "core/engine.hpp"
#include "core/error.hpp"  // before cmocka.h, whose fail() macro would clash
#include "core/state.hpp"
#include "cuda/cuda_engine.hpp"
#include "distributed/passes.hpp"
#include "../common/test_seed.h"

extern "C" {
#include <cmocka.h>
}

using namespace lowbit;
constexpr uintptr_t kCapturingStream = 0xCA9u;  // tests/cuda/emu/emu.hpp: reported as capturing

namespace {

uint64_t g_rng;

uint64_t next(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

size_t dbytes(lowbit_dtype_t d) { return d == LOWBIT_DTYPE_FLOAT32 ? 4 : 2; }

// Random values of about 2^emin .. 2^emax, written as bits of the dtype.
void fill(void* out, lowbit_dtype_t d, int64_t n, int emin, int emax) {
  for (int64_t i = 0; i < n; ++i) {
    uint64_t r = next(g_rng);
    int e = emin + int(r % uint64_t(emax - emin + 1));
    uint32_t sign = uint32_t(r >> 63), mant = uint32_t(r >> 8);
    if (d == LOWBIT_DTYPE_FLOAT32) {
      uint32_t u = (sign << 31) | (uint32_t(e + 127) << 23) | (mant & 0x7FFFFFu);
      std::memcpy(static_cast<char*>(out) + 4 * i, &u, 4);
    } else if (d == LOWBIT_DTYPE_BFLOAT16) {
      uint16_t h = uint16_t((sign << 15) | (uint32_t(e + 127) << 7) | (mant & 0x7Fu));
      std::memcpy(static_cast<char*>(out) + 2 * i, &h, 2);
    } else {
      uint16_t h = uint16_t((sign << 15) | (uint32_t(e + 15) << 10) | (mant & 0x3FFu));
      std::memcpy(static_cast<char*>(out) + 2 * i, &h, 2);
    }
  }
}

struct AlgoCase {
  const char* name;
  Algo algo;
  float lr, wd, momentum, dampening;
  int nesterov;
  float alpha = 0.f, lr_decay = 0.f, initial_sum = 0.f;  // RMSprop, Adagrad
  int centered = 0;
};

struct DtypeCase {
  const char* name;
  lowbit_dtype_t p, g;
  WeightRounding r;
};

const DtypeCase kDtypes[] = {
    {"f32/f32", LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_FLOAT32, WeightRounding::Nearest},
    {"f32/bf16", LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_BFLOAT16, WeightRounding::Nearest},
    {"bf16/bf16 rne", LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_BFLOAT16, WeightRounding::Nearest},
    {"bf16/bf16 sr", LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_BFLOAT16, WeightRounding::Stochastic},
    {"bf16/bf16 ecc", LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_BFLOAT16, WeightRounding::ErrorCorrection},
    {"bf16/f32 sr", LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_FLOAT32, WeightRounding::Stochastic},
    {"f16/f16 rne", LOWBIT_DTYPE_FLOAT16, LOWBIT_DTYPE_FLOAT16, WeightRounding::Nearest},
    {"f16/f16 sr", LOWBIT_DTYPE_FLOAT16, LOWBIT_DTYPE_FLOAT16, WeightRounding::Stochastic},
    {"f16/f16 ecc", LOWBIT_DTYPE_FLOAT16, LOWBIT_DTYPE_FLOAT16, WeightRounding::ErrorCorrection},
    {"f16/bf16 ecc", LOWBIT_DTYPE_FLOAT16, LOWBIT_DTYPE_BFLOAT16, WeightRounding::ErrorCorrection},
};

const lowbit_state_format_t kFormats[][2] = {
    {LOWBIT_STATE_FP32, LOWBIT_STATE_FP32}, {LOWBIT_STATE_BF16, LOWBIT_STATE_BF16},
    {LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT}, {LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT},
    {LOWBIT_STATE_FP8, LOWBIT_STATE_FP8},   {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT},
    {LOWBIT_STATE_FP8, LOWBIT_STATE_BF16},  {LOWBIT_STATE_4BIT_SR, LOWBIT_STATE_4BIT_SR},
    {LOWBIT_STATE_4BIT_SR, LOWBIT_STATE_4BIT},  // LOWBIT_PRESET_ADAMW_4BIT_SR
    {LOWBIT_STATE_4BIT_SR, LOWBIT_STATE_4BIT_DYN}, {LOWBIT_STATE_4BIT_DYN, LOWBIT_STATE_4BIT_DYN},
};

struct ParamSpec {
  int64_t numel;
  int unaligned;  // GPU side: base one element past a 256-byte boundary
  int32_t group;
  int ndim = 0;  // shaped parameters (test_shaped): 0 none
  int64_t dim[3] = {0, 0, 0};
};

// The normalisation of each moment for params with >= 2 dims (test_shaped).
Norm g_norm[2] = {Norm::Block, Norm::Block};

// Everything one engine works on. GPU side memory comes from cudaMalloc, which
// the emulation serves from host memory.
struct Side {
  Engine* eng = nullptr;
  bool gpu = false;
  std::vector<ParamView> views;
  std::vector<void*> state;   // engine allocations
  std::vector<void*> buffers; // params / grads
  std::vector<void*> grads;   // grad of each param (views[i].grad is set per step)

  void* alloc_state(size_t bytes) {
    if (!bytes) return nullptr;
    void* p = eng->allocate_zeroed(bytes);
    state.push_back(p);
    return p;
  }
  void* buffer(size_t bytes, size_t offset) {
    void* p = nullptr;
    if (gpu) {
      if (cudaMalloc(&p, bytes + offset) != cudaSuccess) fail_msg("cudaMalloc");
    } else {
      p = std::malloc(bytes + offset);
    }
    buffers.push_back(p);
    return static_cast<char*>(p) + offset;
  }
  ~Side() {
    for (void* p : state) eng->release(p);
    for (void* p : buffers) gpu ? (void)cudaFree(p) : std::free(p);
  }
};

void build(Side& s, Algo algo, int moments, const lowbit_state_format_t fmt[2], const DtypeCase& d,
           const std::vector<ParamSpec>& specs, const std::vector<std::vector<uint8_t>>& init) {
  s.views.assign(specs.size(), ParamView{});
  s.grads.assign(specs.size(), nullptr);
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& sp = specs[i];
    ParamView& v = s.views[i];
    v.numel = sp.numel;
    v.param_dtype = d.p;
    v.rounding = d.p == LOWBIT_DTYPE_FLOAT32 ? WeightRounding::Nearest : d.r;
    const size_t off_p = s.gpu && sp.unaligned ? dbytes(d.p) : 0, off_g = s.gpu && sp.unaligned ? dbytes(d.g) : 0;
    v.param = s.buffer(size_t(sp.numel) * dbytes(d.p), off_p);
    std::memcpy(v.param, init[i].data(), init[i].size());
    s.grads[i] = s.buffer(size_t(sp.numel) * dbytes(d.g), off_g);
    v.num_moments = moments;
    v.shape = Shape{};
    v.shape.ndim = sp.ndim;
    for (int k = 0; k < sp.ndim; ++k) v.shape.dim[k] = sp.dim[k];
    for (int k = 0; k < moments; ++k) {
      const Norm norm = sp.ndim >= 2 ? g_norm[k] : Norm::Block;
      const lowbit_state_format_t f = norm == Norm::Factored ? LOWBIT_STATE_FP32 : fmt[k];
      void* data = s.alloc_state(size_t(moment_data_bytes(f, norm, v.shape, sp.numel)));
      float* scales = static_cast<float*>(s.alloc_state(size_t(moment_scale_bytes(f, norm, v.shape, sp.numel))));
      // as Optimizer builds them: the map and floor of the algorithm's kind for the slot
      v.moment[k] = moment_view(f, moment_kind(describe(rule_algorithm(algo)), k), data, scales);
      v.moment[k].norm = norm;
    }
    if (v.rounding == WeightRounding::ErrorCorrection) v.ecc = static_cast<uint8_t*>(s.alloc_state(size_t(sp.numel)));
  }
}

void expect_same(const std::string& label, const char* what, size_t i, const void* a, const void* b, size_t bytes) {
  if (bytes == 0 || std::memcmp(a, b, bytes) == 0) return;
  const uint8_t* x = static_cast<const uint8_t*>(a);
  const uint8_t* y = static_cast<const uint8_t*>(b);
  size_t k = 0;
  while (x[k] == y[k]) ++k;
  fail_msg("%s: param %zu %s differs first at byte %zu (CPU %02x, GPU %02x)", label.c_str(), i, what, k, x[k], y[k]);
}

void compare(const std::string& label, const Side& c, const Side& g) {
  for (size_t i = 0; i < c.views.size(); ++i) {
    const ParamView& a = c.views[i];
    const ParamView& b = g.views[i];
    if (a.ecc) expect_same(label, "error-correction bytes", i, a.ecc, b.ecc, size_t(a.numel));
    for (int k = 0; k < a.num_moments; ++k) {
      const lowbit_state_format_t f = a.moment[k].format;
      const Norm nm = a.moment[k].norm;
      expect_same(label, k ? "moment 1 scales" : "moment 0 scales", i, a.moment[k].scales, b.moment[k].scales,
                  size_t(moment_scale_bytes(f, nm, a.shape, a.numel)));
      expect_same(label, k ? "moment 1 data" : "moment 0 data", i, a.moment[k].data, b.moment[k].data,
                  size_t(moment_data_bytes(f, nm, a.shape, a.numel)));
    }
    expect_same(label, "param", i, a.param, b.param, size_t(a.numel) * dbytes(a.param_dtype));
  }
}

// One case through the Engine interface as Optimizer drives it.
void run_case(const AlgoCase& a, const lowbit_state_format_t fmt[2], const DtypeCase& d,
              const std::vector<ParamSpec>& specs, int steps, int nan_step, int64_t* cases, int num_groups = 2,
              bool move_params = false, bool capture_after_first = false) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s %s+%s %s%s%s", a.name, format_name(fmt[0]), format_name(fmt[1]), d.name,
                g_norm[0] != Norm::Block || g_norm[1] != Norm::Block ? " norms " : "",
                g_norm[0] != Norm::Block || g_norm[1] != Norm::Block
                    ? (std::string(norm_name(g_norm[0])) + "/" + norm_name(g_norm[1])).c_str()
                    : "");
  const std::string label = buf;
  std::vector<lowbit_hparams_t> hp(static_cast<size_t>(num_groups));
  std::memset(hp.data(), 0, hp.size() * sizeof(lowbit_hparams_t));
  hp[0].struct_size = sizeof(lowbit_hparams_t);
  hp[0].lr = a.lr;
  hp[0].beta1 = 0.9f;
  hp[0].beta2 = a.algo == Algo::Lion ? 0.99f : 0.999f;
  hp[0].eps = 1e-8f;
  hp[0].weight_decay = a.wd;
  hp[0].momentum = a.momentum;
  hp[0].dampening = a.dampening;
  hp[0].nesterov = a.nesterov;
  hp[0].bias_correction = 1;
  hp[0].alpha = a.alpha;
  hp[0].centered = a.centered;
  hp[0].lr_decay = a.lr_decay;
  hp[0].initial_accumulator_value = a.initial_sum;
  const int moments = moments_in_use(describe(rule_algorithm(a.algo)), hp[0]);
  const bool muon = a.algo == Algo::Muon;
  for (int k = 1; k < num_groups; ++k) {
    hp[size_t(k)] = hp[0];
    hp[size_t(k)].lr = a.lr / float(k + 1);
    hp[size_t(k)].weight_decay = a.wd * float(k + 1);
  }
  const uint64_t seed = next(g_rng);

  std::vector<std::vector<uint8_t>> init(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    init[i].resize(size_t(specs[i].numel) * dbytes(d.p));
    fill(init[i].data(), d.p, specs[i].numel, -4, 0);
  }
  std::unique_ptr<Engine> cpu_engine = make_cpu_engine(1);
  std::unique_ptr<Engine> gpu_engine = make_cuda_engine(0);
  Side cpu, gpu;
  cpu.eng = cpu_engine.get();
  gpu.eng = gpu_engine.get();
  gpu.gpu = true;
  build(cpu, a.algo, moments, fmt, d, specs, init);
  build(gpu, a.algo, moments, fmt, d, specs, init);
  std::vector<Chunk> chunks;
  std::vector<int32_t> groups;
  for (size_t i = 0; i < specs.size(); ++i) {
    append_chunks(chunks, int32_t(i), specs[i].numel);
    groups.push_back(specs[i].group);
  }
  const int64_t np = int64_t(specs.size()), nc = int64_t(chunks.size());
  for (Side* side : {&cpu, &gpu}) {
    side->eng->bind(side->views.data(), np, chunks.data(), nc, groups.data(), 0, nullptr);
    side->eng->set_hparams(hp.data(), num_groups);
  }
  // Muon's step writes each param's fp32 result to out + its flat offset:
  // 16-byte aligned offsets but for param 1's (one float past).
  std::vector<int64_t> offsets;
  int64_t out_floats = 0;
  float* out[2] = {nullptr, nullptr};
  if (muon) {
    for (size_t i = 0; i < specs.size(); ++i) {
      offsets.push_back((out_floats + 3) / 4 * 4 + (i == 1 ? 1 : 0));
      out_floats = offsets.back() + specs[i].numel;
    }
    const std::vector<const uint8_t*> masks(specs.size(), nullptr);
    Side* sides[2] = {&cpu, &gpu};
    for (int k = 0; k < 2; ++k) {
      out[k] = static_cast<float*>(sides[k]->alloc_state(size_t(out_floats) * 4));
      sides[k]->eng->bind_flat(offsets.data(), masks.data(), np);
    }
  }
  std::vector<int64_t> t(specs.size(), 0);
  StepControl ctl;
  ctl.check_nonfinite = true;
  ctl.seed = seed;
  StepControl gctl = ctl;
  ctl.flat_out = out[0];
  gctl.flat_out = out[1];

  for (int s = 1; s <= steps; ++s) {
    std::vector<GradView> cg(specs.size()), gg(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      const size_t gb = size_t(specs[i].numel) * dbytes(d.g);
      fill(cpu.grads[i], d.g, specs[i].numel, -12, 0);
      if (specs[i].numel > 1024) std::memset(static_cast<char*>(cpu.grads[i]) + 512 * dbytes(d.g), 0, 256 * dbytes(d.g));
      if (s == nan_step && i == 0) {
        if (d.g == LOWBIT_DTYPE_FLOAT32) {
          uint32_t nan = 0x7FC00000u;
          std::memcpy(static_cast<char*>(cpu.grads[i]) + 4 * 7, &nan, 4);
        } else {
          uint16_t inf = d.g == LOWBIT_DTYPE_BFLOAT16 ? 0x7F80u : 0x7C00u;
          std::memcpy(static_cast<char*>(cpu.grads[i]) + 2 * 7, &inf, 2);
        }
      }
      std::memcpy(gpu.grads[i], cpu.grads[i], gb);
      const bool no_grad = i == 1 && s == 2;
      cg[i] = GradView{no_grad ? nullptr : cpu.grads[i], d.g};
      gg[i] = GradView{no_grad ? nullptr : gpu.grads[i], d.g};
    }
    // Steps after the first on a stream "under capture" (emulated): small
    // upload batches, and nothing in a step may refuse to be captured.
    void* gstream = capture_after_first && s > 1 ? reinterpret_cast<void*>(kCapturingStream) : nullptr;
    if (s == 3 && move_params) {
      // New param buffers (as XLA hands out): the engine's parameter table changes between steps.
      for (Side* side : {&cpu, &gpu}) {
        ParamView& v = side->views[0];
        const size_t bytes = size_t(v.numel) * dbytes(v.param_dtype);
        void* fresh = side->buffer(bytes, 0);
        std::memcpy(fresh, v.param, bytes);
        v.param = fresh;
        side->eng->bind(side->views.data(), np, chunks.data(), nc, groups.data(), 0, side == &gpu ? gstream : nullptr);
      }
    }
    if (s == 3) {
      // A new lr for group 0: the device reads it at the next step.
      hp[0].lr *= 0.5f;
      for (Side* side : {&cpu, &gpu}) side->eng->set_hparams(hp.data(), num_groups);
    }
    cpu_engine->step(a.algo, cg.data(), np, ctl, nullptr);
    gpu_engine->step(a.algo, gg.data(), np, gctl, gstream);
    const bool skip_c = cpu_engine->last_step_skipped(), skip_g = gpu_engine->last_step_skipped();
    if (skip_c != (s == nan_step) || skip_g != skip_c)
      fail_msg("%s step %d: skipped CPU %d GPU %d, expected %d", label.c_str(), s, int(skip_c), int(skip_g),
               int(s == nan_step));
    if (!skip_c)
      for (size_t i = 0; i < specs.size(); ++i) t[i] += cg[i].data ? 1 : 0;
    compare(label + " step " + std::to_string(s), cpu, gpu);
    if (muon) expect_same(label + " step " + std::to_string(s), "flat output", 0, out[0], out[1], size_t(out_floats) * 4);
    std::vector<int64_t> tc(specs.size()), tg(specs.size());
    cpu_engine->read_steps(tc.data(), np, nullptr);
    gpu_engine->read_steps(tg.data(), np, nullptr);
    for (size_t i = 0; i < specs.size(); ++i)
      if (tc[i] != t[i] || tg[i] != t[i])
        fail_msg("%s step %d: param %zu step count CPU %lld GPU %lld, expected %lld", label.c_str(), s, i,
                 (long long)tc[i], (long long)tg[i], (long long)t[i]);
  }
  ++*cases;
}

const AlgoCase kAlgos[] = {
    {"adamw", Algo::AdamW, 1e-3f, 0.01f, 0.f, 0.f, 0},
    {"adam", Algo::Adam, 1e-3f, 0.01f, 0.f, 0.f, 0},
    {"lion", Algo::Lion, 1e-4f, 0.1f, 0.f, 0.f, 0},
    {"sgd momentum", Algo::Sgd, 1e-2f, 1e-3f, 0.9f, 0.1f, 0},
    {"sgd nesterov", Algo::Sgd, 1e-2f, 1e-3f, 0.9f, 0.f, 1},
    {"sgd plain", Algo::Sgd, 1e-2f, 1e-3f, 0.f, 0.f, 0},
    {"rmsprop", Algo::RmsProp, 1e-3f, 1e-3f, 0.f, 0.f, 0, 0.99f},
    {"rmsprop momentum", Algo::RmsProp, 1e-3f, 1e-3f, 0.9f, 0.f, 0, 0.95f},
    {"rmsprop centered", Algo::RmsProp, 1e-3f, 0.f, 0.f, 0.f, 0, 0.9f, 0.f, 0.f, 1},
    {"adagrad", Algo::Adagrad, 1e-2f, 1e-3f, 0.f, 0.f, 0, 0.f, 1e-3f, 0.1f},
};

const std::vector<ParamSpec> kSmall = {{5003, 1, 0}, {129, 0, 1}, {1, 0, 1}, {4100, 0, 0}};
const std::vector<ParamSpec> kLarge = {{140001, 0, 0}, {129, 1, 1}, {70000, 1, 1}};

void run_algo(const AlgoCase& a) {
  int64_t cases = 0;
  lowbit_hparams_t h{};
  h.momentum = a.momentum;
  h.centered = a.centered;
  const bool two = moments_in_use(describe(rule_algorithm(a.algo)), h) == 2;
  const int nformats = a.momentum == 0.f && a.algo == Algo::Sgd ? 1 : int(sizeof kFormats / sizeof kFormats[0]);
  for (int f = 0; f < nformats; ++f) {
    if (!two && kFormats[f][0] != kFormats[f][1]) continue;
    for (size_t di = 0; di < sizeof kDtypes / sizeof kDtypes[0]; ++di)
      run_case(a, kFormats[f], kDtypes[di], kSmall, 3, di == 2 ? 2 : 0, &cases);
  }
  std::printf("%s: %lld cases bit-identical\n", a.name, (long long)cases);
}

// Shaped parameters (issue 15): rank-1 moments and the factored second
// moment, pass 1 (statistics), the pass between, pass 2 and the pass after,
// against the CPU engine bit for bit: 1 x n, n x 1, 7 x 129, 3 x 5 x 257, a
// 1-D param (blocks), 300 x 500 (three chunks, rows across chunks), and
// 24 x 64 (rows a multiple of 8: the rank-1 and Factor fast loops),
// several algorithms and dtypes, a NaN step and a param without a gradient.
void test_shaped(void**) {
  int64_t cases = 0;
  const std::vector<ParamSpec> specs = {{300, 1, 0, 2, {1, 300}},   {300, 0, 1, 2, {300, 1}},
                                        {903, 0, 0, 2, {7, 129}},   {3855, 1, 1, 3, {3, 5, 257}},
                                        {1000, 0, 0, 0, {0, 0, 0}}, {150000, 0, 1, 2, {300, 500}},
                                        {1536, 0, 0, 2, {24, 64}}};
  struct ShapedCase {
    int algo;
    Norm m, v;
    lowbit_state_format_t fm, fv;
  };
  const ShapedCase shaped_cases[] = {
      {0, Norm::Block, Norm::Rank1, LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT},     // lpmm 4-bit AdamW
      {0, Norm::Block, Norm::Factored, LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT},  // 4-bit Factor
      {1, Norm::Rank1, Norm::Rank1, LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT},     // Adam (L2): p in pass 1
      {1, Norm::Rank1, Norm::Factored, LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT},
      {2, Norm::Rank1, Norm::Block, LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT},     // Lion
      {3, Norm::Rank1, Norm::Block, LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT},     // SGD momentum
      {7, Norm::Rank1, Norm::Rank1, LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT},     // RMSprop momentum: an unsigned slot 0
      {9, Norm::Rank1, Norm::Block, LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT},     // Adagrad
      {0, Norm::Block, Norm::Rank1, LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT_DYN},  // rank-1 v on the dynamic map
  };
  for (const ShapedCase& c : shaped_cases) {
    g_norm[0] = c.m;
    g_norm[1] = c.v;
    const lowbit_state_format_t fmt[2] = {c.fm, c.fv};
    for (int di : {0, 3, 8}) run_case(kAlgos[c.algo], fmt, kDtypes[di], specs, 3, di == 3 ? 2 : 0, &cases);
  }
  g_norm[0] = g_norm[1] = Norm::Block;
  std::printf("shaped: %lld cases bit-identical\n", (long long)cases);
}

// Muon's momentum step (its result to the flat output, the param untouched),
// with and without Nesterov: the fast loops (8-bit, 4-bit and 4BIT_SR moments,
// fp32 and bf16 grads, the output aligned or not) and the generic loop's
// formats and dtypes, bit for bit.
void test_muon_momentum(void**) {
  int64_t cases = 0;
  const AlgoCase muons[] = {{"muon nesterov", Algo::Muon, 0.02f, 0.01f, 0.95f, 0.f, 1},
                            {"muon", Algo::Muon, 0.02f, 0.01f, 0.9f, 0.f, 0}};
  const std::vector<ParamSpec> specs = {{4100, 0, 0}, {8192, 0, 1}, {129, 0, 1}, {1000, 1, 0}, {70000, 0, 0}};
  const lowbit_state_format_t formats[] = {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT_SR,
                                           LOWBIT_STATE_FP32, LOWBIT_STATE_BF16, LOWBIT_STATE_FP8};
  for (const AlgoCase& a : muons)
    for (lowbit_state_format_t f : formats) {
      const lowbit_state_format_t fmt[2] = {f, f};
      for (int di : {0, 1, 2, 6}) run_case(a, fmt, kDtypes[di], specs, 3, di == 2 ? 2 : 0, &cases);
    }
  std::printf("muon: %lld cases bit-identical\n", (long long)cases);
}

void test_adamw(void**) { run_algo(kAlgos[0]); }
void test_adam(void**) { run_algo(kAlgos[1]); }
void test_lion(void**) { run_algo(kAlgos[2]); }
void test_sgd_momentum(void**) { run_algo(kAlgos[3]); }
void test_sgd_nesterov(void**) { run_algo(kAlgos[4]); }
void test_sgd_plain(void**) { run_algo(kAlgos[5]); }
void test_rmsprop(void**) { run_algo(kAlgos[6]); }
void test_rmsprop_momentum(void**) { run_algo(kAlgos[7]); }
void test_rmsprop_centered(void**) { run_algo(kAlgos[8]); }
void test_adagrad(void**) { run_algo(kAlgos[9]); }

// Multi-chunk tensors (three chunks, both halves of each chunk's blocks).
void test_large(void**) {
  int64_t cases = 0;
  const lowbit_state_format_t f8[2] = {LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT};
  const lowbit_state_format_t f4[2] = {LOWBIT_STATE_4BIT, LOWBIT_STATE_FP8};
  run_case(kAlgos[0], f8, kDtypes[3], kLarge, 2, 0, &cases);
  run_case(kAlgos[2], f4, kDtypes[8], kLarge, 2, 0, &cases);
  run_case(kAlgos[0], f4, kDtypes[0], kLarge, 2, 0, &cases);
  std::printf("large: %lld cases bit-identical\n", (long long)cases);
}

// Many parameters in many groups: the per-step tables take several upload
// batches (1024 parameter entries, 64 distinct scalar sets per batch), and a
// parameter buffer that moves between steps changes the parameter table.
void test_many_params(void**) {
  int64_t cases = 0;
  std::vector<ParamSpec> many;
  for (int i = 0; i < 2500; ++i) many.push_back({33 + (i % 7) * 50, i % 5 == 0, int32_t(i % 150)});
  const lowbit_state_format_t f8[2] = {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT};
  run_case(kAlgos[0], f8, kDtypes[3], many, 3, 0, &cases, 150, true);
  run_case(kAlgos[3], f8, kDtypes[4], kSmall, 4, 0, &cases, 2, true);
  run_case(kAlgos[0], f8, kDtypes[6], many, 3, 0, &cases, 150, true, true);  // small batches while "capturing"
  std::printf("many params: %lld cases bit-identical\n", (long long)cases);
}

// The JAX form of a step: one shared count (read and advanced by the
// engine), lr from engine memory, the recorded layout checked by the engine
// (a mismatch, like a NaN, skips the step: nothing changes, count included).
void test_shared_count(void**) {
  struct Mode {
    AlgoCase a;
    int f, d;
  };
  const Mode modes[] = {{kAlgos[0], 2, 3}, {kAlgos[3], 3, 8}, {kAlgos[2], 4, 5}, {kAlgos[1], 5, 0}};
  for (const Mode& m : modes) {
    const AlgoCase& a = m.a;
    const DtypeCase& d = kDtypes[m.d];
    const lowbit_state_format_t* fmt = kFormats[m.f];
    const std::vector<ParamSpec>& specs = kSmall;
    const int moments = a.algo == Algo::AdamW || a.algo == Algo::Adam ? 2 : 1;
    lowbit_hparams_t hp[2];
    std::memset(hp, 0, sizeof hp);
    hp[0].struct_size = sizeof(lowbit_hparams_t);
    hp[0].lr = 0.f;  // replaced by the lr in engine memory
    hp[0].beta1 = 0.9f;
    hp[0].beta2 = 0.999f;
    hp[0].eps = 1e-8f;
    hp[0].weight_decay = a.wd;
    hp[0].momentum = a.momentum;
    hp[0].dampening = a.dampening;
    hp[0].bias_correction = 1;
    hp[1] = hp[0];
    hp[1].weight_decay = a.wd * 3.f;
    const uint64_t seed = next(g_rng);
    std::vector<std::vector<uint8_t>> init(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      init[i].resize(size_t(specs[i].numel) * dbytes(d.p));
      fill(init[i].data(), d.p, specs[i].numel, -4, 0);
    }
    std::unique_ptr<Engine> cpu_engine = make_cpu_engine(1);
    std::unique_ptr<Engine> gpu_engine = make_cuda_engine(0);
    Side cpu, gpu;
    cpu.eng = cpu_engine.get();
    gpu.eng = gpu_engine.get();
    gpu.gpu = true;
    build(cpu, a.algo, moments, fmt, d, specs, init);
    build(gpu, a.algo, moments, fmt, d, specs, init);
    std::vector<Chunk> chunks;
    std::vector<int32_t> groups;
    std::vector<int32_t> layout;
    for (size_t i = 0; i < specs.size(); ++i) {
      append_chunks(chunks, int32_t(i), specs[i].numel);
      groups.push_back(specs[i].group);
      const ParamView& v = cpu.views[i];
      // core/layout_record.hpp: formats, rounding, block normalisations, no bound shape
      const int32_t rec[kLayoutColumns] = {int32_t(fmt[0]), moments > 1 ? int32_t(fmt[1]) : 0, int32_t(v.rounding),
                                           LOWBIT_NORMALIZATION_BLOCK, moments > 1 ? LOWBIT_NORMALIZATION_BLOCK : 0};
      layout.insert(layout.end(), rec, rec + kLayoutColumns);
    }
    const int64_t np = int64_t(specs.size()), nc = int64_t(chunks.size());
    // Engine memory for the count, lr and layout (device memory on the GPU side).
    struct Mem {
      int32_t* count;
      float* lr;
      int32_t* layout;
    } mem[2];
    for (int k = 0; k < 2; ++k) {
      void* p = nullptr;
      assert_int_equal(cudaMalloc(&p, 8 + layout.size() * 4), cudaSuccess);
      mem[k].count = static_cast<int32_t*>(p);
      mem[k].lr = reinterpret_cast<float*>(static_cast<char*>(p) + 4);
      mem[k].layout = reinterpret_cast<int32_t*>(static_cast<char*>(p) + 8);
      *mem[k].count = 0;
      *mem[k].lr = a.lr;
      std::memcpy(mem[k].layout, layout.data(), layout.size() * 4);
    }
    Engine* engines[2] = {cpu_engine.get(), gpu_engine.get()};
    Side* sides[2] = {&cpu, &gpu};
    int32_t expect = 0;
    for (int s = 1; s <= 6; ++s) {
      if (s == 3) *mem[0].lr = *mem[1].lr = a.lr * 0.5f;
      const bool nan = s == 4, bad_layout = s == 5 || s == 6;
      std::vector<GradView> g[2] = {std::vector<GradView>(specs.size()), std::vector<GradView>(specs.size())};
      for (size_t i = 0; i < specs.size(); ++i) {
        fill(cpu.grads[i], d.g, specs[i].numel, -12, 0);
        if (nan && i == 3) {
          uint32_t nan32 = 0x7FC00000u;
          uint16_t nan16 = d.g == LOWBIT_DTYPE_BFLOAT16 ? 0x7FC0u : 0x7E00u;
          if (d.g == LOWBIT_DTYPE_FLOAT32)
            std::memcpy(static_cast<char*>(cpu.grads[i]) + 4 * 4099, &nan32, 4);
          else
            std::memcpy(static_cast<char*>(cpu.grads[i]) + 2 * 4099, &nan16, 2);
        }
        std::memcpy(gpu.grads[i], cpu.grads[i], size_t(specs[i].numel) * dbytes(d.g));
        g[0][i] = GradView{cpu.grads[i], d.g};
        g[1][i] = GradView{gpu.grads[i], d.g};
      }
      for (int k = 0; k < 2; ++k) {
        // step 5: param 1's format of moment 1 (0 for one-moment algorithms)
        // differs from how it is bound; step 6: param 2's bound shape
        const size_t bad = s == 5 ? size_t(kLayoutColumns) + 1 : size_t(2 * kLayoutColumns + 5);
        mem[k].layout[kLayoutColumns + 1] = layout[kLayoutColumns + 1];
        mem[k].layout[2 * kLayoutColumns + 5] = layout[2 * kLayoutColumns + 5];
        if (bad_layout) mem[k].layout[bad] = 99;
        StepControl ctl;
        ctl.check_nonfinite = true;
        ctl.seed = seed;
        ctl.shared_count = mem[k].count;
        ctl.shared_count_out = mem[k].count;  // aliased, as XLA does
        ctl.lr = mem[k].lr;
        ctl.layout = mem[k].layout;
        engines[k]->bind(sides[k]->views.data(), np, chunks.data(), nc, groups.data(), 0, nullptr);
        engines[k]->set_hparams(hp, 2);
        engines[k]->step(a.algo, g[k].data(), np, ctl, nullptr);
      }
      const bool skip = nan || bad_layout;
      expect += skip ? 0 : 1;
      assert_int_equal(int(cpu_engine->last_step_skipped()), int(skip));
      assert_int_equal(int(gpu_engine->last_step_skipped()), int(skip));
      assert_int_equal(*mem[0].count, expect);
      assert_int_equal(*mem[1].count, expect);
      compare(std::string("shared count ") + a.name + " step " + std::to_string(s), cpu, gpu);
    }
    for (auto& k : mem) cudaFree(k.count);
  }
}

// 1-bit Adam's passes (gather, mask, local momentum, apply with the frozen
// variance, a skipped apply) on fp32 moments, bf16 params with stochastic
// rounding and fp16 with error correction, masks on some params.
void test_onebit_passes(void**) {
  const std::vector<ParamSpec> specs = {{5003, 1, 0}, {129, 0, 1}, {70001, 0, 0}};
  const DtypeCase dts[] = {kDtypes[0], kDtypes[3], kDtypes[8]};
  for (const DtypeCase& d : dts) {
    const lowbit_state_format_t fmt[2] = {LOWBIT_STATE_FP32, LOWBIT_STATE_FP32};
    lowbit_hparams_t hp[2];
    std::memset(hp, 0, sizeof hp);
    hp[0].struct_size = sizeof(lowbit_hparams_t);
    hp[0].lr = 1e-3f;
    hp[0].beta1 = 0.9f;
    hp[0].beta2 = 0.999f;
    hp[0].eps = 1e-8f;
    hp[0].weight_decay = 0.01f;
    hp[0].bias_correction = 1;
    hp[1] = hp[0];
    hp[1].beta1 = 0.8f;
    const uint64_t seed = next(g_rng);
    std::vector<std::vector<uint8_t>> init(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      init[i].resize(size_t(specs[i].numel) * dbytes(d.p));
      fill(init[i].data(), d.p, specs[i].numel, -4, 0);
    }
    std::unique_ptr<Engine> cpu_engine = make_cpu_engine(2);
    std::unique_ptr<Engine> gpu_engine = make_cuda_engine(0);
    Side cpu, gpu;
    cpu.eng = cpu_engine.get();
    gpu.eng = gpu_engine.get();
    gpu.gpu = true;
    build(cpu, Algo::AdamW, 2, fmt, d, specs, init);
    build(gpu, Algo::AdamW, 2, fmt, d, specs, init);
    std::vector<Chunk> chunks;
    std::vector<int32_t> groups;
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      append_chunks(chunks, int32_t(i), specs[i].numel);
      groups.push_back(specs[i].group);
      offsets.push_back(total);
      total += specs[i].numel;
    }
    const int64_t np = int64_t(specs.size()), nc = int64_t(chunks.size());
    Side* sides[2] = {&cpu, &gpu};
    float* bucket[2];
    uint8_t* masks[2][3] = {};
    for (int k = 0; k < 2; ++k) {
      Engine* e = sides[k]->eng;
      e->bind(sides[k]->views.data(), np, chunks.data(), nc, groups.data(), 0, nullptr);
      e->set_hparams(hp, 2);
      bucket[k] = static_cast<float*>(sides[k]->alloc_state(size_t(total) * 4));
      for (size_t i : {size_t(0), size_t(2)}) {
        masks[k][i] = static_cast<uint8_t*>(sides[k]->alloc_state(size_t(specs[i].numel)));
        uint64_t r = 7 + i;
        for (int64_t j = 0; j < specs[i].numel; ++j) masks[k][i][j] = uint8_t(next(r) % 4 != 0);
      }
      const uint8_t* mk[3] = {masks[k][0], masks[k][1], masks[k][2]};
      e->bind_flat(offsets.data(), mk, np);
    }
    const int64_t freeze = 2;
    for (int s = 1; s <= 5; ++s) {
      std::vector<GradView> g[2] = {std::vector<GradView>(specs.size()), std::vector<GradView>(specs.size())};
      for (size_t i = 0; i < specs.size(); ++i) {
        fill(cpu.grads[i], d.g, specs[i].numel, -12, 0);
        std::memcpy(gpu.grads[i], cpu.grads[i], size_t(specs[i].numel) * dbytes(d.g));
        g[0][i] = GradView{cpu.grads[i], d.g};
        g[1][i] = GradView{gpu.grads[i], d.g};
      }
      for (int k = 0; k < 2; ++k) {
        Engine* e = sides[k]->eng;
        if (s <= freeze) {
          // Warm-up: gather, a plain AdamW step on the bucket, masks.
          distributed::GatherGrads gather;
          gather.x = bucket[k];
          PassStep with_grads;
          with_grads.grads = g[k].data();
          run_pass(*e, gather, with_grads, nullptr);
          std::vector<GradView> avg(specs.size());
          for (size_t i = 0; i < specs.size(); ++i) avg[i] = GradView{bucket[k] + offsets[i], LOWBIT_DTYPE_FLOAT32};
          StepControl ctl;
          ctl.check_nonfinite = true;
          ctl.seed = seed;
          e->step(Algo::AdamW, avg.data(), np, ctl, nullptr);
          PassStep mask;
          mask.honor_skip = true;
          run_pass(*e, distributed::ZeroMasked{}, mask, nullptr);
        } else {
          distributed::LocalMomentum<false> momentum;
          momentum.x = bucket[k];
          PassStep with_grads;
          with_grads.grads = g[k].data();
          run_pass(*e, momentum, with_grads, nullptr);
          // Stand-in for the exchange: a deterministic change of the bucket.
          for (int64_t j = 0; j < total; ++j) bucket[k][j] = bucket[k][j] * 0.5f + (j % 3 == 0 ? 1e-4f : -1e-4f);
          PassStep ap;
          ap.begin = true;
          ap.frozen_step = freeze;
          ap.seed = seed;
          ap.honor_skip = true;
          ap.end = true;
          int32_t* flag = nullptr;
          if (k == 1) {
            assert_int_equal(cudaMalloc(reinterpret_cast<void**>(&flag), 4), cudaSuccess);
            *flag = s == 4;
            ap.skip.device = flag;
          } else {
            ap.skip.host = s == 4;
          }
          distributed::OneBitUpdate<false> update;
          update.x = bucket[k];
          run_pass(*e, update, ap, nullptr);
          if (flag) cudaFree(flag);
        }
      }
      assert_int_equal(int(cpu_engine->last_step_skipped()), int(s == 4));
      assert_int_equal(int(gpu_engine->last_step_skipped()), int(s == 4));
      compare(std::string("1-bit ") + d.name + " step " + std::to_string(s), cpu, gpu);
      expect_same(std::string("1-bit ") + d.name, "bucket", 0, bucket[0], bucket[1], size_t(total) * 4);
      std::vector<int64_t> tc(specs.size()), tg(specs.size());
      cpu_engine->read_steps(tc.data(), np, nullptr);
      gpu_engine->read_steps(tg.data(), np, nullptr);
      const int64_t expect = s - (s >= 4 ? 1 : 0);
      for (size_t i = 0; i < specs.size(); ++i) {
        assert_int_equal(tc[i], expect);
        assert_int_equal(tg[i], expect);
      }
    }
    // Masked momentum stays exactly zero.
    for (size_t i : {size_t(0), size_t(2)}) {
      const float* m = static_cast<const float*>(cpu.views[i].moment[0].data);
      for (int64_t j = 0; j < specs[i].numel; ++j)
        if (!masks[0][i][j] && m[j] != 0.f) fail_msg("1-bit: masked momentum %zu[%lld] = %g", i, (long long)j, m[j]);
    }
  }
}

}  // namespace

int main() {
  g_rng = lowbit_test_seed("test_cuda_emulated");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adamw),        cmocka_unit_test(test_adam),         cmocka_unit_test(test_lion),
      cmocka_unit_test(test_sgd_momentum), cmocka_unit_test(test_sgd_nesterov), cmocka_unit_test(test_sgd_plain),
      cmocka_unit_test(test_rmsprop),      cmocka_unit_test(test_rmsprop_momentum),
      cmocka_unit_test(test_rmsprop_centered), cmocka_unit_test(test_adagrad),
      cmocka_unit_test(test_large),        cmocka_unit_test(test_many_params),  cmocka_unit_test(test_shared_count),
      cmocka_unit_test(test_onebit_passes), cmocka_unit_test(test_shaped),      cmocka_unit_test(test_muon_momentum),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
