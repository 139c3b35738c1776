#include "core/engine.hpp"
#include "muon/muon_step.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/hparams.hpp"
#include "core/step_scalars.hpp"
#include "muon/muon_rules.hpp"

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

// The three products of one Newton-Schulz iteration over `count` rows x cols
// matrices (k = min(rows, cols)): the iterate X in x, the next one to x2,
// the k x k Gram matrices A in gram and B = b A + c A A in poly.
struct NsProducts {
  Matmul gram, poly, update;
};
NsProducts ns_products(int64_t rows, int64_t cols, int64_t count, const lowbit_hparams_t& h, bool bf16,
                       const float* x, float* x2, float* gram, float* poly) {
  const bool tall = rows > cols;
  const int64_t numel = rows * cols, k = std::min(rows, cols);
  NsProducts p;
  Matmul& g = p.gram;  // A = X X^T (wide) or X^T X (tall): k x k
  g.m = k, g.n = k, g.k = tall ? rows : cols, g.batch = count;
  g.trans_a = tall, g.trans_b = !tall;
  g.a = x, g.b = x, g.c = gram;
  g.stride_a = numel, g.stride_b = numel, g.stride_c = k * k;
  g.bf16 = bf16;
  g.symmetric = true;
  Matmul& q = p.poly;  // B = b A + c A A
  q.m = k, q.n = k, q.k = k, q.batch = count;
  q.a = gram, q.b = gram, q.d = gram, q.c = poly;
  q.stride_a = k * k, q.stride_b = k * k, q.stride_c = k * k;
  q.alpha = h.ns_coefficients[2], q.beta = h.ns_coefficients[1];
  q.bf16 = bf16;
  q.symmetric = true;  // A is symmetric (mirrored or exactly so)
  Matmul& u = p.update;  // X' = a X + B X (wide) or a X + X B^T (tall)
  u.m = rows, u.n = cols, u.k = k, u.batch = count;
  u.a = tall ? x : poly, u.b = tall ? poly : x;
  u.trans_b = tall;
  u.stride_a = tall ? numel : k * k, u.stride_b = tall ? k * k : numel;
  u.d = x, u.c = x2, u.stride_c = numel;
  u.alpha = 1.f, u.beta = h.ns_coefficients[0];
  u.bf16 = bf16;
  return p;
}

}  // namespace

void MuonSteps::layout(Engine& e, const std::vector<MuonParam>& params) {
  if (laid_out_ && params == params_) return;
  const int64_t n = int64_t(params.size());
  std::vector<Batch> batches;
  std::vector<int64_t> offsets(static_cast<size_t>(n), 0), dims(static_cast<size_t>(2 * n), 1);
  std::map<std::tuple<int32_t, int64_t, int64_t>, size_t> open;  // (group, rows, cols) -> its last batch
  int64_t x_floats = 0, gram_floats = 0;
  for (int64_t i = 0; i < n; ++i) {
    const MuonParam& p = params[size_t(i)];
    if (p.algorithm != LOWBIT_ALGORITHM_MUON) continue;
    const int64_t numel = p.rows * p.cols;
    dims[size_t(2 * i)] = p.rows, dims[size_t(2 * i + 1)] = p.cols;
    const auto key = std::make_tuple(p.group, p.rows, p.cols);
    auto it = open.find(key);
    if (it == open.end() || int64_t(batches[it->second].params.size() + 1) * numel > std::max(kBatchElements, numel)) {
      batches.push_back(Batch{p.group, p.rows, p.cols, {}});
      it = open.insert_or_assign(key, batches.size() - 1).first;
    }
    Batch& b = batches[it->second];
    offsets[size_t(i)] = int64_t(b.params.size()) * numel;
    b.params.push_back(i);
    const int64_t k = std::min(p.rows, p.cols), count = int64_t(b.params.size());
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
    const std::vector<const uint8_t*> masks(static_cast<size_t>(n), nullptr);
    e.bind_flat(offsets.data(), masks.data(), n);
    if (!batches.empty()) e.reserve_matmul(nullptr, 0);
    norm_ = std::move(norm);
    dims_ = std::move(dev_dims);
  }
  batches_ = std::move(batches);
  params_ = params;
  laid_out_ = true;
  table_.assign(static_cast<size_t>(n), GradView{});
}

void MuonSteps::step(Engine& e, const GradView* grads, const lowbit_hparams_t* groups, lowbit_device_t device,
                     bool check_nonfinite, const StepControl& base, void* stream) {
  const int64_t n = int64_t(params_.size());
  // The fused calls of this step: (algorithm, batch or -1); the last one writes the shared count.
  std::vector<std::pair<lowbit_algorithm_t, int64_t>> calls;
  for (lowbit_algorithm_t a : all_algorithms()) {
    if (!describe(a).hybrid_group) continue;  // the algorithms a Muon group may take instead
    for (int64_t i = 0; i < n; ++i)
      if (params_[size_t(i)].algorithm == a && grads[i].data) {
        calls.emplace_back(a, -1);
        break;
      }
  }
  for (size_t b = 0; b < batches_.size(); ++b)
    for (int64_t i : batches_[b].params)
      if (grads[i].data) {
        calls.emplace_back(LOWBIT_ALGORITHM_MUON, int64_t(b));
        break;
      }
  // No param has a grad: one call all the same, which steps nothing and
  // writes the shared count (count + 1, as every algorithm's step does).
  if (calls.empty()) calls.emplace_back(LOWBIT_ALGORITHM_ADAMW, -1);
  // Every product this step runs is readied before anything is written: a
  // product that cannot run fails the step here, with nothing changed.
  products_.clear();
  for (const auto& call : calls) {
    if (call.second < 0) continue;
    const Batch& b = batches_[size_t(call.second)];
    const lowbit_hparams_t& h = groups[b.group];
    const NsProducts p = ns_products(b.rows, b.cols, int64_t(b.params.size()), h, use_bf16(h, device), nullptr,
                                     nullptr, nullptr, nullptr);
    products_.insert(products_.end(), {p.gram, p.poly, p.update});
  }
  if (!products_.empty()) e.reserve_matmul(products_.data(), int64_t(products_.size()));
  e.begin_step(grads, n, check_nonfinite, stream);
  for (size_t c = 0; c < calls.size(); ++c) {
    StepControl ctl = base;
    ctl.continue_step = true;
    ctl.check_nonfinite = false;
    if (c + 1 < calls.size()) ctl.shared_count_out = nullptr;
    std::fill(table_.begin(), table_.end(), GradView{});
    if (calls[c].second < 0) {
      for (int64_t i = 0; i < n; ++i)
        if (params_[size_t(i)].algorithm == calls[c].first) table_[size_t(i)] = grads[i];
      e.step(engine_algo(calls[c].first), table_.data(), n, ctl, stream);
      continue;
    }
    const Batch& b = batches_[size_t(calls[c].second)];
    for (int64_t i : b.params) table_[size_t(i)] = grads[i];
    ctl.flat_out = static_cast<float*>(x_.data());
    e.step(Algo::Muon, table_.data(), n, ctl, stream);
    const lowbit_hparams_t& h = groups[b.group];
    orthogonalise(e, b, h, use_bf16(h, device), stream);
  }
}

// The batch's updates in x_ (written by its momentum step) become O, then
// the params take it. Passes skip params not stepped and a skipped step.
void MuonSteps::orthogonalise(Engine& e, const Batch& b, const lowbit_hparams_t& h, bool bf16, void* stream) {
  PassStep in_step;
  in_step.honor_skip = true;
  in_step.stepped_only = true;
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

  const int64_t count = int64_t(b.params.size());
  float* x = static_cast<float*>(x_.data());
  float* x2 = static_cast<float*>(x2_.data());
  float* gram = static_cast<float*>(a_.data());
  float* poly = static_cast<float*>(b_.data());
  for (int32_t it = 0; it < h.ns_steps; ++it) {
    const NsProducts p = ns_products(b.rows, b.cols, count, h, bf16, x, x2, gram, poly);
    e.matmul(p.gram, stream);
    e.matmul(p.poly, stream);
    e.matmul(p.update, stream);
    std::swap(x, x2);
  }
  ApplyRule ar;
  ar.x = x;
  ar.dims = static_cast<const int64_t*>(dims_.data());
  run_pass(e, ar, in_step, stream);
}

}  // namespace muon
}  // namespace lowbit
