#include "muon/muon_optimizer.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/error.hpp"
#include "core/step_scalars.hpp"
#include "core/validation.hpp"
#include "muon/muon_rules.hpp"
#include "muon/run_pass.hpp"

namespace lowbit {
namespace muon {
namespace {

// A batch's matrices take at most this many elements, or one matrix where a
// single one is larger: the workspace is two such updates in fp32 plus the
// batch's Gram matrices (torch.optim.Muon holds one matrix's at a time).
constexpr int64_t kBatchElements = int64_t(1) << 24;

bool use_bf16(const lowbit_hparams_t& h, lowbit_device_t device) {
  return h.ns_precision == LOWBIT_NS_PRECISION_BF16 ||
         (h.ns_precision == LOWBIT_NS_PRECISION_DEFAULT && device == LOWBIT_DEVICE_CUDA);
}

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const lowbit_optimizer_config_t& config, const lowbit_hparams_t& hparams) {
  auto opt = std::make_unique<Optimizer>(config, hparams);
  if (config.algorithm == LOWBIT_ALGORITHM_MUON) opt->set_extension(std::make_unique<MuonOptimizer>(*opt));
  return opt;
}

void MuonOptimizer::params_changed() {
  const int64_t n = opt_.num_params();
  Engine& e = opt_.engine();
  std::vector<Batch> batches;
  std::vector<lowbit_algorithm_t> algos(static_cast<size_t>(n));
  std::vector<int64_t> offsets(size_t(n), 0), dims(size_t(2 * n), 1);
  std::map<std::tuple<int32_t, int64_t, int64_t>, size_t> open;  // (group, rows, cols) -> its last batch
  int64_t x_floats = 0, gram_floats = 0;
  for (int64_t i = 0; i < n; ++i) {
    const ParamState& p = opt_.param(i);
    algos[size_t(i)] = group_algorithm(opt_.hparams(p.group), LOWBIT_ALGORITHM_MUON);
    if (algos[size_t(i)] != LOWBIT_ALGORITHM_MUON) continue;
    const int64_t numel = p.param.numel, rows = p.shape.dim[0], cols = numel / rows;
    dims[size_t(2 * i)] = rows, dims[size_t(2 * i + 1)] = cols;
    const auto key = std::make_tuple(p.group, rows, cols);
    auto it = open.find(key);
    if (it == open.end() || int64_t(batches[it->second].params.size() + 1) * numel > std::max(kBatchElements, numel)) {
      batches.push_back(Batch{p.group, rows, cols, {}});
      it = open.insert_or_assign(key, batches.size() - 1).first;
    }
    Batch& b = batches[it->second];
    offsets[size_t(i)] = int64_t(b.params.size()) * numel;
    b.params.push_back(i);
    const int64_t k = std::min(rows, cols), count = int64_t(b.params.size());
    x_floats = std::max(x_floats, count * numel);
    gram_floats = std::max(gram_floats, count * k * k);
  }
  if (x_floats > x_floats_) {
    x_ = StateBuffer(&e, size_t(x_floats) * 4, false);
    x2_ = StateBuffer(&e, size_t(x_floats) * 4, false);
    x_floats_ = x_floats;
  }
  if (gram_floats > gram_floats_) {
    a_ = StateBuffer(&e, size_t(gram_floats) * 4, false);
    b_ = StateBuffer(&e, size_t(gram_floats) * 4, false);
    gram_floats_ = gram_floats;
  }
  if (n > 0) {
    StateBuffer norm(&e, size_t(n) * 4), dev_dims(&e, size_t(2 * n) * 8);
    e.copy_from_host(dev_dims.data(), dims.data(), size_t(2 * n) * 8, nullptr);
    const std::vector<const uint8_t*> masks(size_t(n), nullptr);
    e.bind_flat(offsets.data(), masks.data(), n);
    if (!batches.empty()) e.reserve_matmul();
    norm_ = std::move(norm);
    dims_ = std::move(dev_dims);
  }
  batches_ = std::move(batches);
  algorithm_of_ = std::move(algos);
  table_.assign(size_t(n), GradView{});
}

int64_t MuonOptimizer::workspace_bytes() const {
  return int64_t(x_.bytes() + x2_.bytes() + a_.bytes() + b_.bytes() + norm_.bytes() + dims_.bytes());
}

void MuonOptimizer::step(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream) {
  run(opt_.prepare_grads(grads, num_grads, explicit_grads), stream);
}

void MuonOptimizer::step_subset(const GradView* grads, void* stream) { run(grads, stream); }

void MuonOptimizer::run(const GradView* grads, void* stream) {
  Engine& e = opt_.engine();
  const int64_t n = opt_.num_params();
  e.begin_step(grads, n, opt_.config().skip_nonfinite != 0, stream);
  StepControl ctl;
  ctl.seed = opt_.config().seed;
  ctl.continue_step = true;
  // The other algorithms' params (the hybrid's AdamW), one fused step each.
  for (int a = LOWBIT_ALGORITHM_ADAMW; a <= LOWBIT_ALGORITHM_SGD; ++a) {
    bool any = false;
    for (int64_t i = 0; i < n; ++i) {
      const bool mine = algorithm_of_[size_t(i)] == lowbit_algorithm_t(a) && grads[i].data;
      table_[size_t(i)] = mine ? grads[i] : GradView{};
      any |= mine;
    }
    if (any) e.step(engine_algo(lowbit_algorithm_t(a)), table_.data(), n, ctl, stream);
  }
  for (const Batch& b : batches_) {
    std::fill(table_.begin(), table_.end(), GradView{});
    bool any = false;
    for (int64_t i : b.params) {
      table_[size_t(i)] = grads[i];
      any |= grads[i].data != nullptr;
    }
    if (!any) continue;
    StepControl momentum = ctl;
    momentum.flat_out = static_cast<float*>(x_.data());
    e.step(Algo::Muon, table_.data(), n, momentum, stream);
    orthogonalise(b, opt_.hparams(b.group), stream);
  }
}

// The batch's updates in x_ (written by its momentum step) become O, then
// the params take it. Passes skip params not stepped and a skipped step.
void MuonOptimizer::orthogonalise(const Batch& b, const lowbit_hparams_t& h, void* stream) {
  Engine& e = opt_.engine();
  PassStep in_step;
  in_step.honor_skip = true;
  in_step.stepped_only = true;
  const bool bf16 = use_bf16(h, opt_.config().device);
  float* norm = static_cast<float*>(norm_.data());
  NormRule nr;
  nr.x = static_cast<float*>(x_.data());
  nr.norm = norm;
  nr.bf16 = bf16;
  run_pass(e, nr, in_step, stream);
  ScaleRule sr;
  sr.x = nr.x;
  sr.norm = norm;
  sr.bf16 = bf16;
  run_pass(e, sr, in_step, stream);

  const bool tall = b.rows > b.cols;
  const int64_t numel = b.rows * b.cols, k = std::min(b.rows, b.cols), count = int64_t(b.params.size());
  float* x = static_cast<float*>(x_.data());
  float* x2 = static_cast<float*>(x2_.data());
  float* gram = static_cast<float*>(a_.data());
  float* poly = static_cast<float*>(b_.data());
  const float ca = h.ns_coefficients[0], cb = h.ns_coefficients[1], cc = h.ns_coefficients[2];
  for (int32_t it = 0; it < h.ns_steps; ++it) {
    Matmul g;  // A = X X^T (wide) or X^T X (tall): k x k
    g.m = k, g.n = k, g.k = tall ? b.rows : b.cols, g.batch = count;
    g.trans_a = tall, g.trans_b = !tall;
    g.a = x, g.b = x, g.c = gram;
    g.stride_a = numel, g.stride_b = numel, g.stride_c = k * k;
    g.bf16 = bf16;
    e.matmul(g, stream);
    Matmul p;  // B = b A + c A A
    p.m = k, p.n = k, p.k = k, p.batch = count;
    p.a = gram, p.b = gram, p.d = gram, p.c = poly;
    p.stride_a = k * k, p.stride_b = k * k, p.stride_c = k * k;
    p.alpha = cc, p.beta = cb;
    p.bf16 = bf16;
    e.matmul(p, stream);
    Matmul u;  // X' = a X + B X (wide) or a X + X B^T (tall)
    u.m = b.rows, u.n = b.cols, u.k = k, u.batch = count;
    u.a = tall ? x : poly, u.b = tall ? poly : x;
    u.trans_b = tall;
    u.stride_a = tall ? numel : k * k, u.stride_b = tall ? k * k : numel;
    u.d = x, u.c = x2, u.stride_c = numel;
    u.alpha = 1.f, u.beta = ca;
    u.bf16 = bf16;
    e.matmul(u, stream);
    std::swap(x, x2);
  }
  ApplyRule ar;
  ar.x = x;
  ar.dims = static_cast<const int64_t*>(dims_.data());
  run_pass(e, ar, in_step, stream);
}

}  // namespace muon
}  // namespace lowbit
