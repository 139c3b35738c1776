// 0/1 Adam's and 1-bit LAMB's passes (distributed/passes.hpp through
// Engine::run_pass) on the CUDA engine under the host emulation
// (tests/cuda/emu: the kernel source of cuda/pass_launch.cuh) against the
// CPU engine (core/cpu_pass.hpp), bit for bit, on fresh random inputs
// (tests/common/test_seed.h).
//
// Both engines run the same sequence of passes as the optimizers drive
// them, with a deterministic stand-in for the exchanges (a world of one rank
// whose collective changes the bucket the same way on both sides):
//  - 0/1 Adam: phase-1 variance steps (a plain AdamW step, masks), phase-1
//    1-bit gradient steps (gather, the blended update), then phase 2: the
//    snapshot, local steps (local momentum with the non-finite flag, the
//    update skipped if it is positive) and synchronisations (pack, apply);
//    skips: a NaN gradient in a variance step and in a local step, an
//    exchange that reports a non-finite value in a 1-bit step and in a
//    synchronisation.
//  - 1-bit LAMB: warm-up steps (one skipped by a NaN gradient, the last one
//    seeding v_fresh), the scaling at the first compression step, compression
//    steps (momentum, norms and update; one skipped by the exchange).
// Parameters: fp32, bf16 (stochastic rounding) and fp16 (error correction,
// bf16 gradients) params; sizes 70001 and 131073 (two and three chunks, the
// last one of a single element), 129 and 1; two groups; momentum masks on
// two params. After every step: params, error-correction bytes, m, v, the
// bucket, sync params / v_fresh, the LAMB scalars (trust ratios included)
// and rms, the non-finite flag, the step counts and the skip flags must be
// identical, and the CUDA engine's passes must neither wait for the device
// nor allocate (the emulation's counters).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "core/engine.hpp"
#include "core/error.hpp"  // before cmocka.h, whose fail() macro would clash
#include "core/state.hpp"
#include "distributed/passes.hpp"
#define CT_ENGINE_ONLY 1
#include "cuda_test_util.h"
#include "emu_counters.h"

using namespace lowbit;
using namespace lowbit::distributed;

namespace {

uint64_t g_rng;

struct DtypeCase {
  const char* name;
  lowbit_dtype_t p, g;
  WeightRounding r;
};

const DtypeCase kDtypes[] = {
    {"f32/f32", LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_FLOAT32, WeightRounding::Nearest},
    {"bf16/bf16 sr", LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_BFLOAT16, WeightRounding::Stochastic},
    {"f16/bf16 ecc", LOWBIT_DTYPE_FLOAT16, LOWBIT_DTYPE_BFLOAT16, WeightRounding::ErrorCorrection},
};

struct Spec {
  int64_t numel;
  int32_t group;
  bool mask;
};
const Spec kSpecs[] = {{70001, 0, true}, {129, 1, false}, {131073, 1, true}, {1, 0, false}};
constexpr int kNumParams = int(sizeof kSpecs / sizeof kSpecs[0]);

// One engine and everything it works on (engine memory: host for the CPU
// engine, cudaMalloc for CUDA, which the emulation serves from host memory,
// so the test reads and writes both directly).
struct Side {
  std::unique_ptr<Engine> eng;
  bool gpu = false;
  std::vector<ParamView> views;
  std::vector<void*> grads;
  std::vector<void*> state, buffers;
  float* bucket = nullptr;
  float* extra = nullptr;  // 0/1 Adam: sync params; LAMB: v_fresh
  float* flag = nullptr;   // the local steps' non-finite flag
  float* inv_lrs = nullptr;
  int32_t* device_skip = nullptr;
  LambScalars* scalars = nullptr;
  double* rms = nullptr;
  int64_t total = 0, num_chunks = 0;

  void* alloc_state(size_t bytes) {
    void* p = eng->allocate_zeroed(bytes);
    state.push_back(p);
    return p;
  }
  void* buffer(size_t bytes) {
    void* p = nullptr;
    if (gpu) {
      if (cudaMalloc(&p, bytes) != cudaSuccess) fail_msg("cudaMalloc");
    } else {
      p = std::malloc(bytes);
    }
    buffers.push_back(p);
    return p;
  }
  ~Side() {
    for (void* p : state) eng->release(p);
    for (void* p : buffers) gpu ? (void)cudaFree(p) : std::free(p);
  }
};

size_t dbytes(lowbit_dtype_t d) { return d == LOWBIT_DTYPE_FLOAT32 ? 4 : 2; }

void setup(Side& s, bool gpu, const DtypeCase& d, const std::vector<std::vector<uint8_t>>& init,
           const std::vector<std::vector<uint8_t>>& masks, const lowbit_hparams_t* hp) {
  s.gpu = gpu;
  s.eng = gpu ? make_cuda_engine(0) : make_cpu_engine(2);
  s.views.assign(kNumParams, ParamView{});
  s.grads.assign(kNumParams, nullptr);
  std::vector<Chunk> chunks;
  std::vector<int32_t> groups;
  std::vector<int64_t> offsets;
  std::vector<const uint8_t*> mask_ptrs;
  for (int i = 0; i < kNumParams; ++i) {
    const Spec& sp = kSpecs[i];
    ParamView& v = s.views[size_t(i)];
    v.numel = sp.numel;
    v.param_dtype = d.p;
    v.rounding = d.p == LOWBIT_DTYPE_FLOAT32 ? WeightRounding::Nearest : d.r;
    v.param = s.buffer(init[size_t(i)].size());
    std::memcpy(v.param, init[size_t(i)].data(), init[size_t(i)].size());
    s.grads[size_t(i)] = s.buffer(size_t(sp.numel) * dbytes(d.g));
    v.num_moments = 2;
    for (int k = 0; k < 2; ++k)
      v.moment[k] = adam_moment_view(LOWBIT_STATE_FP32, k, s.alloc_state(size_t(sp.numel) * 4), nullptr);
    if (v.rounding == WeightRounding::ErrorCorrection) v.ecc = static_cast<uint8_t*>(s.alloc_state(size_t(sp.numel)));
    append_chunks(chunks, int32_t(i), sp.numel);
    groups.push_back(sp.group);
    offsets.push_back(s.total);
    s.total += sp.numel;
    uint8_t* m = nullptr;
    if (sp.mask) {
      m = static_cast<uint8_t*>(s.alloc_state(size_t(sp.numel)));
      std::memcpy(m, masks[size_t(i)].data(), size_t(sp.numel));
    }
    mask_ptrs.push_back(m);
  }
  s.num_chunks = int64_t(chunks.size());
  s.eng->bind(s.views.data(), kNumParams, chunks.data(), s.num_chunks, groups.data(), 0, nullptr);
  s.eng->set_hparams(hp, 2);
  s.eng->bind_flat(offsets.data(), mask_ptrs.data(), kNumParams);
  s.bucket = static_cast<float*>(s.alloc_state(size_t(s.total) * 4));
  s.extra = static_cast<float*>(s.alloc_state(size_t(s.total) * 4));
  s.flag = static_cast<float*>(s.alloc_state(4));
  s.inv_lrs = static_cast<float*>(s.alloc_state(2 * 4));
  s.device_skip = static_cast<int32_t*>(s.alloc_state(4));
  s.scalars = static_cast<LambScalars*>(s.alloc_state(kNumParams * sizeof(LambScalars)));
  s.rms = static_cast<double*>(s.alloc_state(kNumParams * sizeof(double)));
  for (int i = 0; i < kNumParams; ++i) s.scalars[i] = LambScalars{0.f, 1.f, 0.f, 0.f};
}

void expect_same(const std::string& label, const char* what, const void* a, const void* b, size_t bytes) {
  if (bytes == 0 || std::memcmp(a, b, bytes) == 0) return;
  const uint8_t* x = static_cast<const uint8_t*>(a);
  const uint8_t* y = static_cast<const uint8_t*>(b);
  size_t k = 0;
  while (x[k] == y[k]) ++k;
  fail_msg("%s: %s differs first at byte %zu of %zu (CPU %02x, CUDA %02x)", label.c_str(), what, k, bytes, x[k], y[k]);
}

void compare(const std::string& label, const Side& c, const Side& g) {
  for (int i = 0; i < kNumParams; ++i) {
    const ParamView& a = c.views[size_t(i)];
    const ParamView& b = g.views[size_t(i)];
    const std::string l = label + " param " + std::to_string(i);
    expect_same(l, "param", a.param, b.param, size_t(a.numel) * dbytes(a.param_dtype));
    if (a.ecc) expect_same(l, "error-correction bytes", a.ecc, b.ecc, size_t(a.numel));
    expect_same(l, "m", a.moment[0].data, b.moment[0].data, size_t(a.numel) * 4);
    expect_same(l, "v", a.moment[1].data, b.moment[1].data, size_t(a.numel) * 4);
  }
  expect_same(label, "bucket", c.bucket, g.bucket, size_t(c.total) * 4);
  expect_same(label, "sync params / v_fresh", c.extra, g.extra, size_t(c.total) * 4);
  expect_same(label, "LAMB scalars", c.scalars, g.scalars, kNumParams * sizeof(LambScalars));
  expect_same(label, "LAMB rms", c.rms, g.rms, kNumParams * sizeof(double));
  std::vector<int64_t> tc(kNumParams), tg(kNumParams);
  c.eng->read_steps(tc.data(), kNumParams, nullptr);
  g.eng->read_steps(tg.data(), kNumParams, nullptr);
  for (int i = 0; i < kNumParams; ++i)
    if (tc[size_t(i)] != tg[size_t(i)])
      fail_msg("%s: param %d step count CPU %lld CUDA %lld", label.c_str(), i, (long long)tc[size_t(i)],
               (long long)tg[size_t(i)]);
}

// Fresh gradients on both sides; a NaN in param 2's last chunk when `nan`.
void new_grads(Side& c, Side& g, const DtypeCase& d, bool nan, std::vector<GradView> (&views)[2]) {
  for (int i = 0; i < kNumParams; ++i) {
    const int64_t n = kSpecs[i].numel;
    ct_fill(c.grads[size_t(i)], d.g, n, -12, 0, &g_rng);
    if (nan && i == 2) {
      const int64_t at = n - 5;
      if (d.g == LOWBIT_DTYPE_FLOAT32) {
        const uint32_t x = 0x7FC00000u;
        std::memcpy(static_cast<char*>(c.grads[size_t(i)]) + 4 * at, &x, 4);
      } else {
        const uint16_t x = 0x7FC0u;
        std::memcpy(static_cast<char*>(c.grads[size_t(i)]) + 2 * at, &x, 2);
      }
    }
    std::memcpy(g.grads[size_t(i)], c.grads[size_t(i)], size_t(n) * dbytes(d.g));
  }
  for (int k = 0; k < 2; ++k) {
    Side& s = k ? g : c;
    views[k].assign(kNumParams, GradView{});
    for (int i = 0; i < kNumParams; ++i) views[k][size_t(i)] = GradView{s.grads[size_t(i)], d.g};
  }
}

// The stand-in for an exchange of a world of one rank: a deterministic change.
void exchange(Side& s) {
  for (int64_t j = 0; j < s.total; ++j) s.bucket[j] = s.bucket[j] * 0.5f + (j % 3 == 0 ? 1e-4f : -1e-4f);
}

void hparams(lowbit_hparams_t* hp) {
  std::memset(hp, 0, 2 * sizeof(lowbit_hparams_t));
  hp[0].struct_size = sizeof(lowbit_hparams_t);
  hp[0].lr = 1e-3f;
  hp[0].beta1 = 0.9f;
  hp[0].beta2 = 0.999f;
  hp[0].eps = 1e-8f;
  hp[0].weight_decay = 0.01f;
  hp[0].bias_correction = 0;  // 0/1 Adam and 1-bit LAMB have none
  hp[1] = hp[0];
  hp[1].lr = 5e-4f;
  hp[1].beta1 = 0.8f;
  hp[1].weight_decay = 0.02f;
}

void inputs(const DtypeCase& d, std::vector<std::vector<uint8_t>>& init, std::vector<std::vector<uint8_t>>& masks) {
  init.assign(kNumParams, {});
  masks.assign(kNumParams, {});
  for (int i = 0; i < kNumParams; ++i) {
    init[size_t(i)].resize(size_t(kSpecs[i].numel) * dbytes(d.p));
    ct_fill(init[size_t(i)].data(), d.p, kSpecs[i].numel, -4, 0, &g_rng);
    masks[size_t(i)].resize(size_t(kSpecs[i].numel));
    for (auto& b : masks[size_t(i)]) b = uint8_t(ct_next(&g_rng) % 4 != 0);
  }
  masks[2][size_t(kSpecs[2].numel - 5)] = 1;  // where new_grads puts its NaN
}

void expect_skipped(const std::string& label, const Side& c, const Side& g, bool expect) {
  const bool sc = c.eng->last_step_skipped(), sg = g.eng->last_step_skipped();
  if (sc != expect || sg != expect)
    fail_msg("%s: skipped CPU %d CUDA %d, expected %d", label.c_str(), int(sc), int(sg), int(expect));
}

// The pass that applies an exchange: opens the step with its skip decision
// (the CPU engine takes it from the host, CUDA from device memory), closes it.
PassStep applying(Side& s, bool exchange_skip, uint64_t seed) {
  PassStep st;
  st.begin = true;
  st.seed = seed;
  st.honor_skip = true;
  st.end = true;
  if (s.gpu) {
    *s.device_skip = exchange_skip ? 1 : 0;
    st.skip.device = s.device_skip;
  } else {
    st.skip.host = exchange_skip;
  }
  return st;
}

PassStep with_grads(const std::vector<GradView>& g) {
  PassStep st;
  st.grads = g.data();
  return st;
}

// What the CUDA engine's operations of one step did to the host: nothing.
void expect_no_host_work(const std::string& label) {
  if (lowbit_emu_host_syncs() || lowbit_emu_allocations() || lowbit_emu_pageable_copies())
    fail_msg("%s: the CUDA engine's operations made %lld host synchronisations, %lld allocations, %lld pageable copies",
             label.c_str(), (long long)lowbit_emu_host_syncs(), (long long)lowbit_emu_allocations(),
             (long long)lowbit_emu_pageable_copies());
}

// ---- 0/1 Adam

enum ZoKind { kVariance, kOneBit, kLocal, kSync };
struct ZoStep {
  ZoKind kind;
  bool nan, exchange_skip, snapshot;
};

// The CPU engine (c) and the emulated CUDA engine (g), set up from the same
// inputs and hparams for one dtype case, and the rounding seed of the run.
struct Pair {
  lowbit_hparams_t hp[2];
  uint64_t seed;
  Side c, g;
  explicit Pair(const DtypeCase& d) {
    hparams(hp);
    std::vector<std::vector<uint8_t>> init, masks;
    inputs(d, init, masks);
    seed = ct_next(&g_rng);
    setup(c, false, d, init, masks, hp);
    setup(g, true, d, init, masks, hp);
  }
};

void test_zeroone(void**) {
  const ZoStep steps[] = {
      {kVariance, false, false, false}, {kOneBit, false, false, false}, {kVariance, true, false, false},
      {kOneBit, false, true, false},    {kOneBit, false, false, false}, {kVariance, false, false, false},
      {kLocal, false, false, true},     {kSync, false, false, false},   {kLocal, true, false, false},
      {kLocal, false, false, false},    {kSync, false, true, false},    {kLocal, false, false, false},
      {kSync, false, false, false},
  };
  for (const DtypeCase& d : kDtypes) {
    Pair pair(d);
    Side &c = pair.c, &g = pair.g;
    const lowbit_hparams_t* hp = pair.hp;
    const uint64_t seed = pair.seed;
    for (Side* s : {&c, &g}) {
      s->inv_lrs[0] = 1.f / (3.f * hp[0].lr);
      s->inv_lrs[1] = 1.f / (2.f * hp[1].lr);
    }
    int n = 0;
    for (const ZoStep& st : steps) {
      ++n;
      const std::string label = std::string("0/1 Adam ") + d.name + " step " + std::to_string(n);
      std::vector<GradView> gv[2];
      new_grads(c, g, d, st.nan, gv);
      bool skip = st.nan || st.exchange_skip;
      for (int k = 0; k < 2; ++k) {
        Side& s = k ? g : c;
        Engine& e = *s.eng;
        lowbit_emu_reset_counters();
        switch (st.kind) {
          case kVariance: {
            GatherGrads gather;
            gather.x = s.bucket;
            run_pass(e, gather, with_grads(gv[k]), nullptr);
            exchange(s);
            std::vector<GradView> avg(kNumParams);
            int64_t off = 0;
            for (int i = 0; i < kNumParams; ++i) {
              avg[size_t(i)] = GradView{s.bucket + off, LOWBIT_DTYPE_FLOAT32};
              off += kSpecs[i].numel;
            }
            StepControl ctl;
            ctl.check_nonfinite = true;
            ctl.seed = seed;
            e.step(Algo::AdamW, avg.data(), kNumParams, ctl, nullptr);
            PassStep mask;
            mask.honor_skip = true;
            run_pass(e, ZeroMasked{}, mask, nullptr);
            break;
          }
          case kOneBit: {
            GatherGrads gather;
            gather.x = s.bucket;
            run_pass(e, gather, with_grads(gv[k]), nullptr);
            exchange(s);
            OneBitUpdate<true> update;
            update.x = s.bucket;
            run_pass(e, update, applying(s, st.exchange_skip, seed), nullptr);
            break;
          }
          case kLocal: {
            if (st.snapshot) {
              Snapshot snapshot;
              snapshot.x = s.extra;
              run_pass(e, snapshot, PassStep(), nullptr);
            }
            LocalMomentum<true> momentum;
            momentum.x = s.bucket;
            momentum.flag = s.flag;
            *s.flag = -1.f;  // the pass writes 0 or 1
            run_pass(e, momentum, with_grads(gv[k]), nullptr);
            OneBitUpdate<false> update;
            update.x = s.bucket;
            PassStep apply = applying(s, false, seed);
            apply.skip = PassSkip();
            apply.skip.if_positive = s.flag;  // the mean over one rank
            run_pass(e, update, apply, nullptr);
            break;
          }
          case kSync: {
            SyncPack pack;
            pack.x = s.bucket;
            pack.y = s.extra;
            PassStep local = with_grads(gv[k]);
            local.begin = true;
            run_pass(e, pack, local, nullptr);
            exchange(s);
            SyncApply sync;
            sync.x = s.bucket;
            sync.y = s.extra;
            sync.group_inv_lrs = s.inv_lrs;
            run_pass(e, sync, applying(s, st.exchange_skip, seed), nullptr);
            break;
          }
        }
        if (s.gpu) expect_no_host_work(label);
      }
      c.eng->wait(nullptr);
      g.eng->wait(nullptr);
      if (st.kind == kLocal) {
        if (*c.flag != (st.nan ? 1.f : 0.f) || *g.flag != *c.flag)
          fail_msg("%s: non-finite flag CPU %g CUDA %g, expected %d", label.c_str(), double(*c.flag), double(*g.flag),
                   int(st.nan));
      }
      expect_skipped(label, c, g, skip);
      compare(label, c, g);
    }
    std::vector<int64_t> t(kNumParams);
    g.eng->read_steps(t.data(), kNumParams, nullptr);
    assert_int_equal(t[0], 13 - 4);
    std::printf("0/1 Adam %s: %d steps bit-identical\n", d.name, n);
  }
}

// ---- 1-bit LAMB

void test_lamb(void**) {
  constexpr int kSteps = 9;
  constexpr int kFreezeAt = 4;  // the step whose count becomes freeze_step (3: step 2 is skipped)
  for (const DtypeCase& d : kDtypes) {
    Pair pair(d);
    Side &c = pair.c, &g = pair.g;
    const uint64_t seed = pair.seed;
    LambOptions opt;
    opt.factor_threshold = 0.05f;
    for (int n = 1; n <= kSteps; ++n) {
      const std::string label = std::string("1-bit LAMB ") + d.name + " step " + std::to_string(n);
      const bool nan = n == 2, exchange_skip = n == 6;
      std::vector<GradView> gv[2];
      new_grads(c, g, d, nan, gv);
      for (int k = 0; k < 2; ++k) {
        Side& s = k ? g : c;
        Engine& e = *s.eng;
        lowbit_emu_reset_counters();
        PassStep norms;
        norms.begin = true;
        norms.seed = seed;
        norms.honor_skip = true;
        PassStep update;
        update.honor_skip = true;
        update.end = true;
        if (n <= kFreezeAt) {
          norms.grads = gv[k].data();
          norms.skip_on_bad = true;
          LambWarmupNorms a;
          a.lamb = s.scalars;
          a.options = opt;
          run_pass(e, a, norms, nullptr);
          if (n == kFreezeAt) {
            LambWarmupUpdate<true> b;
            b.x = s.extra;
            b.lamb = s.scalars;
            run_pass(e, b, update, nullptr);
          } else {
            LambWarmupUpdate<false> b;
            b.lamb = s.scalars;
            run_pass(e, b, update, nullptr);
          }
          if (s.gpu) expect_no_host_work(label);
          continue;
        }
        if (n == kFreezeAt + 1) {
          LambScaling scaling;
          scaling.lamb = s.scalars;
          scaling.rms = s.rms;
          run_pass(e, scaling, PassStep(), nullptr);
        }
        LocalMomentum<false> momentum;
        momentum.x = s.bucket;
        momentum.lamb = s.scalars;
        run_pass(e, momentum, with_grads(gv[k]), nullptr);
        exchange(s);
        const PassStep opened = applying(s, exchange_skip, seed);
        norms.skip = opened.skip;
        LambCompressedNorms a;
        a.x = s.bucket;
        a.y = s.extra;
        a.lamb = s.scalars;
        a.options = opt;
        run_pass(e, a, norms, nullptr);
        LambCompressedUpdate b;
        b.lamb = s.scalars;
        run_pass(e, b, update, nullptr);
        if (s.gpu) expect_no_host_work(label);
      }
      c.eng->wait(nullptr);
      g.eng->wait(nullptr);
      expect_skipped(label, c, g, nan || exchange_skip);
      compare(label, c, g);
    }
    std::vector<int64_t> t(kNumParams);
    g.eng->read_steps(t.data(), kNumParams, nullptr);
    assert_int_equal(t[3], kSteps - 2);
    for (int i = 0; i < kNumParams; ++i)
      if (!(g.scalars[i].scaling > 0.f) || !(g.scalars[i].coeff_freeze > 0.f))
        fail_msg("1-bit LAMB %s: param %d scalars not set (scaling %g, coeff_freeze %g)", d.name, i,
                 double(g.scalars[i].scaling), double(g.scalars[i].coeff_freeze));
    std::printf("1-bit LAMB %s: %d steps bit-identical\n", d.name, kSteps);
  }
}

// The local momentum's non-finite flag alone: a NaN or an Inf gradient at
// the first element, the last, or in the middle of a param of each size
// (one element, chunk boundaries), on both engines.
void test_nonfinite_flag(void**) {
  for (int64_t n : {int64_t(1), int64_t(2047), int64_t(65536), int64_t(65537), int64_t(300001)}) {
    for (int where = -1; where < 3; ++where) {
      for (int k = 0; k < 2; ++k) {
        std::unique_ptr<Engine> e = k ? make_cuda_engine(0) : make_cpu_engine(1);
        float* p = static_cast<float*>(e->allocate_zeroed(size_t(n) * 4));
        float* g = static_cast<float*>(e->allocate_zeroed(size_t(n) * 4));
        float* m = static_cast<float*>(e->allocate_zeroed(size_t(n) * 4));
        float* bucket = static_cast<float*>(e->allocate_zeroed(size_t(n) * 4));
        float* flag = static_cast<float*>(e->allocate_zeroed(4));
        for (int64_t j = 0; j < n; ++j) g[j] = float(j % 7) - 3.f;
        const float bad[3] = {NAN, INFINITY, -INFINITY};
        if (where >= 0) g[where == 0 ? 0 : n - 1 - (where == 2 ? n / 2 : 0)] = bad[where];
        ParamView v;
        v.param = p;
        v.numel = n;
        v.num_moments = 1;
        v.moment[0] = adam_moment_view(LOWBIT_STATE_FP32, 0, m, nullptr);
        std::vector<Chunk> chunks;
        append_chunks(chunks, 0, n);
        const int32_t group = 0;
        lowbit_hparams_t hp[2];
        hparams(hp);
        e->bind(&v, 1, chunks.data(), int64_t(chunks.size()), &group, 0, nullptr);
        e->set_hparams(hp, 1);
        const int64_t offset = 0;
        const uint8_t* no_mask = nullptr;
        e->bind_flat(&offset, &no_mask, 1);
        const GradView gv{g, LOWBIT_DTYPE_FLOAT32};
        PassStep st;
        st.grads = &gv;
        LocalMomentum<true> momentum;
        momentum.x = bucket;
        momentum.flag = flag;
        *flag = 0.5f;
        run_pass(*e, momentum, st, nullptr);
        e->wait(nullptr);
        if (*flag != (where >= 0 ? 1.f : 0.f))
          fail_msg("non-finite flag (%s) n %lld case %d: %g", k ? "CUDA" : "CPU", (long long)n, where, double(*flag));
        for (float* q : {p, g, m, bucket, flag}) e->release(q);
      }
    }
  }
}

}  // namespace

int main() {
  g_rng = lowbit_test_seed("test_onebit_ext_emulated");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nonfinite_flag),
      cmocka_unit_test(test_zeroone),
      cmocka_unit_test(test_lamb),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
