// A step of the CUDA engine captured once in a CUDA graph and replayed 12
// times.
//
// The graph holds: the per-step table upload, the scalars from the device
// hparams and step counts, the non-finite check, the step kernel, the
// step-count update and the copy of the skip flag. Between replays only
// device memory changes: new gradient values in the captured buffers, a new
// lr for group 0 written into the engine's device hparams (replay 5), a NaN
// gradient (replay 8, which must change nothing, step counts included, and
// raise the skipped flag). Each replay must match the CPU engine stepping
// with its own hparams and step counts (bias corrections, SGD's first step,
// the stochastic-rounding key): bias corrections change every replay, so a
// graph with baked-in scalars would fail this. Parameters cover 8-bit, 4-bit,
// FP8 and bf16 state, fp32/bf16/fp16 params with nearest, stochastic and
// error-correction rounding, an unaligned param, two groups, and one
// parameter without a gradient (never updated, step count stays 0).
//
// Expected: bit-identical (both engines compute the scalars with the same
// IEEE double operations, core/step_scalars.hpp), checked with the
// tolerances of cuda_test_util.h.
#define CT_ENGINE_ONLY
#include "cuda_test_util.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/engine.hpp"
#include "core/state.hpp"
#include "cuda/cuda_engine.hpp"

using namespace lowbit;

namespace {

uint64_t g_rng;

struct Spec {
  int64_t numel;
  lowbit_dtype_t pdt, gdt;
  lowbit_state_format_t m, v;
  WeightRounding rounding;
  int unaligned;
  int32_t group;
  int has_grad;
};

const Spec kSpecs[] = {
    {70001, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_BFLOAT16, LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT,
     WeightRounding::Stochastic, 0, 0, 1},
    {5003, LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_BFLOAT16, LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT, WeightRounding::Nearest,
     1, 1, 1},
    {4099, LOWBIT_DTYPE_FLOAT16, LOWBIT_DTYPE_FLOAT32, LOWBIT_STATE_FP8, LOWBIT_STATE_BF16,
     WeightRounding::ErrorCorrection, 0, 0, 1},
    {129, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_BFLOAT16, LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT,
     WeightRounding::ErrorCorrection, 1, 1, 1},
    {3000, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_BFLOAT16, LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT, WeightRounding::Nearest,
     0, 0, 0},
};
constexpr int kNP = int(sizeof kSpecs / sizeof kSpecs[0]);
constexpr int kReplays = 12;
constexpr int kLrChange = 5;
constexpr int kNanReplay = 8;

// State, params and grads of all parameters on one engine.
struct Side {
  Engine* eng = nullptr;
  bool gpu = false;
  std::vector<ParamView> views;
  std::vector<GradView> grads;
  std::vector<void*> owned;        // engine allocations
  std::vector<void*> dev_buffers;  // cudaMalloc'ed params/grads (GPU side)
  std::vector<std::vector<uint8_t>> host_param, host_grad;

  void* alloc_state(size_t bytes) {
    if (!bytes) return nullptr;
    void* p = eng->allocate_zeroed(bytes);
    owned.push_back(p);
    return p;
  }
  void release_all() {
    for (void* p : owned) eng->release(p);
    for (void* p : dev_buffers) cudaFree(p);
    owned.clear();
    dev_buffers.clear();
  }
};

void* device_tensor(Side& s, int64_t n, lowbit_dtype_t d, int unaligned) {
  char* base = nullptr;
  CT_CUDA(cudaMalloc(reinterpret_cast<void**>(&base), size_t(n + 8) * ct_dtype_bytes(d)));
  s.dev_buffers.push_back(base);
  return base + (unaligned ? ct_dtype_bytes(d) : 0);
}

void build(Side& s, Algo algo, const std::vector<std::vector<uint8_t>>& init) {
  s.views.resize(kNP);
  s.grads.resize(kNP);
  s.host_param.resize(kNP);
  s.host_grad.resize(kNP);
  const int nm = algo == Algo::AdamW || algo == Algo::Adam ? 2 : 1;
  for (int i = 0; i < kNP; ++i) {
    const Spec& sp = kSpecs[i];
    ParamView& v = s.views[size_t(i)];
    v = ParamView{};
    v.numel = sp.numel;
    v.param_dtype = sp.pdt;
    s.grads[size_t(i)].dtype = sp.gdt;
    v.rounding = sp.pdt == LOWBIT_DTYPE_FLOAT32 ? WeightRounding::Nearest : sp.rounding;
    const size_t pbytes = size_t(sp.numel) * ct_dtype_bytes(sp.pdt), gbytes = size_t(sp.numel) * ct_dtype_bytes(sp.gdt);
    if (s.gpu) {
      v.param = device_tensor(s, sp.numel, sp.pdt, sp.unaligned);
      CT_CUDA(cudaMemcpy(v.param, init[size_t(i)].data(), pbytes, cudaMemcpyHostToDevice));
      s.grads[size_t(i)].data = sp.has_grad ? device_tensor(s, sp.numel, sp.gdt, sp.unaligned) : nullptr;
    } else {
      s.host_param[size_t(i)] = init[size_t(i)];
      s.host_grad[size_t(i)].resize(gbytes);
      v.param = s.host_param[size_t(i)].data();
      s.grads[size_t(i)].data = sp.has_grad ? s.host_grad[size_t(i)].data() : nullptr;
    }
    v.num_moments = nm;
    const lowbit_state_format_t f[2] = {sp.m, sp.v};
    for (int k = 0; k < nm; ++k) {
      void* data = s.alloc_state(size_t(moment_data_bytes(f[k], sp.numel)));
      float* scales = static_cast<float*>(s.alloc_state(size_t(moment_scale_bytes(f[k], sp.numel))));
      v.moment[k] = adam_moment_view(f[k], k, data, scales);  // as Optimizer builds them
    }
    if (v.rounding == WeightRounding::ErrorCorrection) v.ecc = static_cast<uint8_t*>(s.alloc_state(size_t(sp.numel)));
  }
}

void run(Algo algo, const char* name) {
  const uint64_t seed = ct_next(&g_rng);
  lowbit_hparams_t hp[2];
  std::memset(hp, 0, sizeof hp);
  hp[0].struct_size = sizeof(lowbit_hparams_t);
  hp[0].bias_correction = 1;
  if (algo == Algo::AdamW) {
    hp[0].lr = 1e-3f;
    hp[0].beta1 = 0.9f;
    hp[0].beta2 = 0.999f;
    hp[0].eps = 1e-8f;
    hp[0].weight_decay = 0.01f;
  } else {
    hp[0].lr = 1e-2f;
    hp[0].momentum = 0.9f;
    hp[0].dampening = 0.1f;
    hp[0].weight_decay = 1e-3f;
  }
  hp[1] = hp[0];
  hp[1].lr = hp[0].lr * 0.25f;
  hp[1].weight_decay = 0.05f;

  std::vector<std::vector<uint8_t>> init(kNP);
  for (int i = 0; i < kNP; ++i) {
    init[size_t(i)].resize(size_t(kSpecs[i].numel) * ct_dtype_bytes(kSpecs[i].pdt));
    ct_fill(init[size_t(i)].data(), kSpecs[i].pdt, kSpecs[i].numel, -4, 0, &g_rng);
  }
  std::unique_ptr<Engine> cpu_engine = make_cpu_engine(0);
  std::unique_ptr<cuda::CudaEngine> gpu_engine(new cuda::CudaEngine(0));
  Side cpu, gpu;
  cpu.eng = cpu_engine.get();
  gpu.eng = gpu_engine.get();
  gpu.gpu = true;
  build(cpu, algo, init);
  build(gpu, algo, init);

  std::vector<Chunk> chunks;
  std::vector<int32_t> groups;
  for (int i = 0; i < kNP; ++i) {
    append_chunks(chunks, i, kSpecs[i].numel);
    groups.push_back(kSpecs[i].group);
  }
  cudaStream_t s;
  CT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cpu_engine->bind(cpu.views.data(), kNP, chunks.data(), int64_t(chunks.size()), groups.data(), 0, nullptr);
  cpu_engine->set_hparams(hp, 2);
  gpu_engine->bind(gpu.views.data(), kNP, chunks.data(), int64_t(chunks.size()), groups.data(), 0, s);
  gpu_engine->set_hparams(hp, 2);
  StepControl ctl;
  ctl.check_nonfinite = true;
  ctl.seed = seed;
  // One step outside the capture uploads the hparams, so the graph itself
  // reads them from device memory at every replay.
  std::vector<GradView> none(kNP);
  gpu_engine->step(algo, none.data(), kNP, ctl, s);
  cpu_engine->step(algo, none.data(), kNP, ctl, nullptr);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  gpu_engine->step(algo, gpu.grads.data(), kNP, ctl, s);
  CT_CUDA(cudaStreamEndCapture(s, &graph));
  CT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  std::vector<int64_t> steps(kNP, 0);
  for (int r = 1; r <= kReplays; ++r) {
    for (int i = 0; i < kNP; ++i) {
      if (!kSpecs[i].has_grad) continue;
      std::vector<uint8_t>& g = cpu.host_grad[size_t(i)];
      ct_fill(g.data(), kSpecs[i].gdt, kSpecs[i].numel, -12, 0, &g_rng);
      if (r == kNanReplay && i == 1) ct_set_nan(g.data(), kSpecs[i].gdt, 4000);
      CT_CUDA(cudaMemcpy(const_cast<void*>(gpu.grads[size_t(i)].data), g.data(), g.size(), cudaMemcpyHostToDevice));
    }
    if (r == kLrChange) {
      hp[0].lr *= 0.5f;
      CT_CUDA(cudaMemcpy(&gpu_engine->hparams_memory(0)->lr, &hp[0].lr, sizeof(float), cudaMemcpyHostToDevice));
      cpu_engine->set_hparams(hp, 2);
    }
    CT_CUDA(cudaGraphLaunch(exec, s));
    CT_CUDA(cudaStreamSynchronize(s));
    const int expect_skip = r == kNanReplay;
    if (int(gpu_engine->last_step_skipped()) != expect_skip)
      fail_msg("%s replay %d: skipped flag %d, expected %d", name, r, int(gpu_engine->last_step_skipped()), expect_skip);
    // Reference.
    cpu_engine->step(algo, cpu.grads.data(), kNP, ctl, nullptr);
    assert_int_equal(int(cpu_engine->last_step_skipped()), expect_skip);
    if (expect_skip) continue;
    for (int i = 0; i < kNP; ++i)
      if (kSpecs[i].has_grad) ++steps[size_t(i)];
  }

  std::vector<int64_t> dsteps(kNP, -1);
  gpu_engine->read_steps(dsteps.data(), kNP, nullptr);
  for (int i = 0; i < kNP; ++i)
    if (dsteps[size_t(i)] != steps[size_t(i)])
      fail_msg("%s: param %d: device step count %lld, expected %lld", name, i, (long long)dsteps[size_t(i)],
               (long long)steps[size_t(i)]);
  assert_int_equal(steps[0], kReplays - 1);
  assert_int_equal(steps[kNP - 1], 0);

  ct_stats_t st;
  std::memset(&st, 0, sizeof st);
  for (int i = 0; i < kNP; ++i) {
    const Spec& sp = kSpecs[i];
    const ParamView& c = cpu.views[size_t(i)];
    const ParamView& g = gpu.views[size_t(i)];
    for (int k = 0; k < c.num_moments; ++k) {
      const lowbit_state_format_t f = c.moment[k].format;
      std::vector<uint8_t> data(size_t(moment_data_bytes(f, sp.numel))), scales(size_t(moment_scale_bytes(f, sp.numel)));
      gpu_engine->copy_to_host(data.data(), g.moment[k].data, data.size(), nullptr);
      gpu_engine->copy_to_host(scales.data(), g.moment[k].scales, scales.size(), nullptr);
      ct_compare_moment(name, i, k, uint32_t(f), sp.numel, static_cast<const uint8_t*>(c.moment[k].data), data.data(),
                        reinterpret_cast<const uint8_t*>(c.moment[k].scales), scales.data(),
                        int64_t(scales.size() / 4), &st);
    }
    std::vector<uint8_t> p(size_t(sp.numel) * ct_dtype_bytes(sp.pdt)), e;
    gpu_engine->copy_to_host(p.data(), g.param, p.size(), nullptr);
    if (g.ecc) {
      e.resize(size_t(sp.numel));
      gpu_engine->copy_to_host(e.data(), g.ecc, e.size(), nullptr);
    }
    ct_compare_params(name, i, sp.pdt, sp.numel, c.param, p.data(), c.ecc, g.ecc ? e.data() : nullptr,
                      2.0 * kReplays * hp[0].lr * 2, &st);
    if (!sp.has_grad) assert_memory_equal(p.data(), init[size_t(i)].data(), p.size());
  }
  st.cases = 1;
  ct_print_stats(name, &st);

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  cpu.release_all();
  gpu.release_all();
}

void test_adamw_graph(void**) { run(Algo::AdamW, "adamw device-scalar graph"); }
void test_sgd_graph(void**) { run(Algo::Sgd, "sgd device-scalar graph"); }

}  // namespace

int main() {
  if (!ct_gpu_available()) return CT_SKIP;
  g_rng = ct_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adamw_graph),
      cmocka_unit_test(test_sgd_graph),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
