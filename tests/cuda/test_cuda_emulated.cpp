// The CUDA engine (cuda/cuda_engine.cpp with the kernel source of
// cuda/step_kernel.cuh and cuda/aux_kernels.cuh) run under the host emulation
// of tests/cuda/emu against the CPU engine: runs in CI, without a GPU.
//
// Every algorithm (AdamW, Adam, Lion, SGD with momentum / Nesterov / plain) x
// state format (fp32, bf16, 8-bit, 4-bit, FP8, 8-bit m + 4-bit v, FP8 m +
// bf16 v) x param/grad dtype and rounding (10 cases: fp32/bf16/fp16 params,
// fp32/bf16/fp16 grads, nearest / stochastic rounding / error correction)
// takes 3 steps on fresh random inputs on both engines, through the engine
// interface exactly as Optimizer drives it (any_nonfinite, then step, with
// the per-parameter scalars and rounding keys Optimizer computes). Parameters
// cover an unaligned base (scalar load path), a 4-bit tensor whose second
// block has one element (129), a single element, a 4-bit block boundary
// inside a partial tile (4100), two groups, a parameter without a gradient
// on step 2, and a NaN gradient (step skipped by both). A larger set adds
// three chunks with a partial last tile (140001) and an all-zero block.
// The emulation computes with the host's arithmetic, so the result must be
// bit-identical: params, error-correction bytes, codes and scales.
//
// The device-scalar mode (enqueue_step: scalars from device hparams and
// device step counts, check and skip decided on the device) is checked the
// same way, including the step counts, an lr change and a skipped step.
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

#include "core/engine.hpp"
#include "core/error.hpp"  // before cmocka.h, whose fail() macro would clash
#include "core/rounding.hpp"
#include "core/state.hpp"
#include "core/step_scalars.hpp"
#include "cuda/cuda_engine.hpp"

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
    {LOWBIT_STATE_FP8, LOWBIT_STATE_BF16},
};

struct ParamSpec {
  int64_t numel;
  int unaligned;  // GPU side: base one element past a 256-byte boundary
  int32_t group;
};

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
    v.grad_dtype = d.g;
    v.rounding = d.p == LOWBIT_DTYPE_FLOAT32 ? WeightRounding::Nearest : d.r;
    const size_t off_p = s.gpu && sp.unaligned ? dbytes(d.p) : 0, off_g = s.gpu && sp.unaligned ? dbytes(d.g) : 0;
    v.param = s.buffer(size_t(sp.numel) * dbytes(d.p), off_p);
    std::memcpy(v.param, init[i].data(), init[i].size());
    s.grads[i] = s.buffer(size_t(sp.numel) * dbytes(d.g), off_g);
    v.num_moments = moments;
    for (int k = 0; k < moments; ++k) {
      void* data = s.alloc_state(size_t(moment_data_bytes(fmt[k], sp.numel)));
      float* scales = static_cast<float*>(s.alloc_state(size_t(moment_scale_bytes(fmt[k], sp.numel))));
      v.moment[k] = moment_view(fmt[k], k, data, scales);  // as Optimizer builds them
    }
    if (v.rounding == WeightRounding::ErrorCorrection) v.ecc = static_cast<uint8_t*>(s.alloc_state(size_t(sp.numel)));
  }
  (void)algo;
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
    expect_same(label, "param", i, a.param, b.param, size_t(a.numel) * dbytes(a.param_dtype));
    if (a.ecc) expect_same(label, "error-correction bytes", i, a.ecc, b.ecc, size_t(a.numel));
    for (int k = 0; k < a.num_moments; ++k) {
      const lowbit_state_format_t f = a.moment[k].format;
      expect_same(label, k ? "moment 1 data" : "moment 0 data", i, a.moment[k].data, b.moment[k].data,
                  size_t(moment_data_bytes(f, a.numel)));
      expect_same(label, k ? "moment 1 scales" : "moment 0 scales", i, a.moment[k].scales, b.moment[k].scales,
                  size_t(moment_scale_bytes(f, a.numel)));
    }
  }
}

// One case through the Engine interface as Optimizer drives it.
void run_case(const AlgoCase& a, const lowbit_state_format_t fmt[2], const DtypeCase& d,
              const std::vector<ParamSpec>& specs, int steps, int nan_step, int64_t* cases, int num_groups = 2,
              bool move_params = false, bool capture_after_first = false) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s %s+%s %s", a.name, format_name(fmt[0]), format_name(fmt[1]), d.name);
  const std::string label = buf;
  const int moments = a.algo == Algo::AdamW || a.algo == Algo::Adam
                          ? 2
                          : (a.algo == Algo::Lion || a.momentum != 0.f ? 1 : 0);  // as moment_count()
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
  for (size_t i = 0; i < specs.size(); ++i) append_chunks(chunks, int32_t(i), specs[i].numel);
  std::vector<int64_t> t(specs.size(), 0);

  for (int s = 1; s <= steps; ++s) {
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
      for (Side* side : {&cpu, &gpu}) {
        ParamView& v = side->views[i];
        v.grad = no_grad ? nullptr : side->grads[i];
        v.scalars = make_step_scalars(hp[size_t(specs[i].group)], a.algo != Algo::Lion, t[i]);
        v.rounding_key = rounding_key(seed, uint64_t(i), uint64_t(t[i] + 1));
      }
    }
    if (s == 3 && move_params) {
      // New param buffers (as XLA hands out): the engine's parameter table changes between steps.
      for (Side* side : {&cpu, &gpu}) {
        ParamView& v = side->views[0];
        const size_t bytes = size_t(v.numel) * dbytes(v.param_dtype);
        void* fresh = side->buffer(bytes, 0);
        std::memcpy(fresh, v.param, bytes);
        v.param = fresh;
      }
    }
    const int64_t nc = int64_t(chunks.size());
    // Steps after the first on a stream "under capture" (emulated): small
    // upload batches; the host-side non-finite check must refuse to run.
    void* gstream = capture_after_first && s > 1 ? reinterpret_cast<void*>(kCapturingStream) : nullptr;
    const bool skip_c = cpu_engine->any_nonfinite(cpu.views.data(), chunks.data(), nc, nullptr);
    bool skip_g = skip_c;
    if (gstream) {
      bool refused = false;
      try {
        gpu_engine->any_nonfinite(gpu.views.data(), chunks.data(), nc, gstream);
      } catch (const Error& e) {
        refused = e.status() == LOWBIT_ERROR_UNSUPPORTED && std::strstr(e.what(), "stream") != nullptr;
      }
      if (!refused) fail_msg("%s: any_nonfinite under capture did not refuse with UNSUPPORTED", label.c_str());
    } else {
      skip_g = gpu_engine->any_nonfinite(gpu.views.data(), chunks.data(), nc, nullptr);
    }
    if (skip_c != (s == nan_step) || skip_g != skip_c)
      fail_msg("%s step %d: non-finite check CPU %d GPU %d, expected %d", label.c_str(), s, int(skip_c), int(skip_g),
               int(s == nan_step));
    if (skip_c) continue;
    cpu_engine->step(a.algo, cpu.views.data(), chunks.data(), nc, nullptr);
    gpu_engine->step(a.algo, gpu.views.data(), chunks.data(), nc, gstream);
    for (size_t i = 0; i < specs.size(); ++i)
      if (cpu.views[i].grad) ++t[i];
    compare(label + " step " + std::to_string(s), cpu, gpu);
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
};

const std::vector<ParamSpec> kSmall = {{5003, 1, 0}, {129, 0, 1}, {1, 0, 1}, {4100, 0, 0}};
const std::vector<ParamSpec> kLarge = {{140001, 0, 0}, {129, 1, 1}, {70000, 1, 1}};

void run_algo(const AlgoCase& a) {
  int64_t cases = 0;
  const bool two = a.algo == Algo::AdamW || a.algo == Algo::Adam;
  const int nformats = a.momentum == 0.f && a.algo == Algo::Sgd ? 1 : int(sizeof kFormats / sizeof kFormats[0]);
  for (int f = 0; f < nformats; ++f) {
    if (!two && kFormats[f][0] != kFormats[f][1]) continue;
    for (size_t di = 0; di < sizeof kDtypes / sizeof kDtypes[0]; ++di)
      run_case(a, kFormats[f], kDtypes[di], kSmall, 3, di == 2 ? 2 : 0, &cases);
  }
  std::printf("%s: %lld cases bit-identical\n", a.name, (long long)cases);
}

void test_adamw(void**) { run_algo(kAlgos[0]); }
void test_adam(void**) { run_algo(kAlgos[1]); }
void test_lion(void**) { run_algo(kAlgos[2]); }
void test_sgd_momentum(void**) { run_algo(kAlgos[3]); }
void test_sgd_nesterov(void**) { run_algo(kAlgos[4]); }
void test_sgd_plain(void**) { run_algo(kAlgos[5]); }

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

// The device-scalar mode: bind, device hparams and step counts, enqueue_step
// with the on-device check; lr of group 0 changes on step 3; a NaN on step 4.
void test_device_scalars(void**) {
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
    hp[0].lr = a.lr;
    hp[0].beta1 = 0.9f;
    hp[0].beta2 = 0.999f;
    hp[0].eps = 1e-8f;
    hp[0].weight_decay = a.wd;
    hp[0].momentum = a.momentum;
    hp[0].dampening = a.dampening;
    hp[0].bias_correction = 1;
    hp[1] = hp[0];
    hp[1].lr = a.lr * 0.25f;
    const uint64_t seed = next(g_rng);
    std::vector<std::vector<uint8_t>> init(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      init[i].resize(size_t(specs[i].numel) * dbytes(d.p));
      fill(init[i].data(), d.p, specs[i].numel, -4, 0);
    }
    std::unique_ptr<Engine> cpu_engine = make_cpu_engine(1);
    std::unique_ptr<cuda::CudaEngine> gpu_engine(new cuda::CudaEngine(0));
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
    lowbit_hparams_t* dhp = nullptr;
    assert_int_equal(cudaMalloc(reinterpret_cast<void**>(&dhp), sizeof hp), cudaSuccess);
    std::memcpy(dhp, hp, sizeof hp);
    for (size_t i = 0; i < specs.size(); ++i) gpu.views[i].grad = gpu.grads[i];
    gpu_engine->bind(gpu.views.data(), int64_t(specs.size()), chunks.data(), int64_t(chunks.size()), groups.data(),
                     nullptr);
    gpu_engine->set_device_scalars(dhp, seed);
    std::vector<int64_t> t(specs.size(), 0);
    for (int s = 1; s <= 5; ++s) {
      if (s == 3) dhp[0].lr = hp[0].lr = hp[0].lr * 0.5f;
      for (size_t i = 0; i < specs.size(); ++i) {
        fill(cpu.grads[i], d.g, specs[i].numel, -12, 0);
        if (s == 4 && i == 3) {
          uint32_t nan = 0x7FC00000u;
          uint16_t nan16 = d.g == LOWBIT_DTYPE_BFLOAT16 ? 0x7FC0u : 0x7E00u;
          if (d.g == LOWBIT_DTYPE_FLOAT32)
            std::memcpy(static_cast<char*>(cpu.grads[i]) + 4 * 4099, &nan, 4);
          else
            std::memcpy(static_cast<char*>(cpu.grads[i]) + 2 * 4099, &nan16, 2);
        }
        std::memcpy(gpu.grads[i], cpu.grads[i], size_t(specs[i].numel) * dbytes(d.g));
        cpu.views[i].grad = cpu.grads[i];
        cpu.views[i].scalars = make_step_scalars(hp[specs[i].group], a.algo != Algo::Lion, t[i]);
        cpu.views[i].rounding_key = rounding_key(seed, uint64_t(i), uint64_t(t[i] + 1));
      }
      gpu_engine->enqueue_step(a.algo, gpu.views.data(), int64_t(specs.size()), true, nullptr);
      const bool skip = cpu_engine->any_nonfinite(cpu.views.data(), chunks.data(), int64_t(chunks.size()), nullptr);
      assert_int_equal(int(skip), int(s == 4));
      assert_int_equal(*gpu_engine->skipped_flag_host(), int(skip));
      if (!skip) {
        cpu_engine->step(a.algo, cpu.views.data(), chunks.data(), int64_t(chunks.size()), nullptr);
        for (int64_t& x : t) ++x;
      }
      compare(std::string("device scalars ") + a.name + " step " + std::to_string(s), cpu, gpu);
    }
    std::vector<int64_t> dt(specs.size(), -1);
    gpu_engine->read_steps(dt.data(), int64_t(dt.size()));
    for (size_t i = 0; i < specs.size(); ++i) assert_int_equal(dt[i], t[i]);
    assert_int_equal(t[0], 4);
    cudaFree(dhp);
  }
}

}  // namespace

int main() {
  const char* s = std::getenv("LOWBIT_TEST_SEED");
  g_rng = s ? std::strtoull(s, nullptr, 0) : uint64_t(std::time(nullptr));
  std::printf("seed %llu (set LOWBIT_TEST_SEED to repeat)\n", (unsigned long long)g_rng);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adamw),        cmocka_unit_test(test_adam),         cmocka_unit_test(test_lion),
      cmocka_unit_test(test_sgd_momentum), cmocka_unit_test(test_sgd_nesterov), cmocka_unit_test(test_sgd_plain),
      cmocka_unit_test(test_large),        cmocka_unit_test(test_many_params),  cmocka_unit_test(test_device_scalars),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
