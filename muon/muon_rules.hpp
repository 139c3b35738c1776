// The passes of Muon's step (core/pass.hpp) around its Newton-Schulz
// products, one file for the CPU and CUDA engines. X is the workspace holding
// each matrix of a batch at its flat offset: the momentum step's output
// (update_element<Algo::Muon>), then the orthogonalised update.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/float16.hpp"
#include "core/pass.hpp"

namespace lowbit {
namespace muon {

// Each matrix's Frobenius norm, clamped below at eps: norm[param]. In bf16
// (torch.optim.Muon's precision) the update is first rounded to bf16 and the
// norm is rounded too, as torch's bf16 tensor.norm() returns it.
struct NormRule : PassRuleBase {
  static constexpr uint32_t kReads = kIoX, kWrites = kIoX, kReduce = kSumA;
  static constexpr bool kFinish = true;
  float* norm = nullptr;  // engine memory, one per param
  int32_t bf16 = 0;
  struct Ctx {};
  LOWBIT_HD Ctx param(const PassParam&) const { return {}; }
  LOWBIT_HD void element(const Ctx&, PassElement& e) const {
    if (bf16) e.x = round_bf16(e.x);
    e.ra = double(e.x) * double(e.x);
  }
  LOWBIT_HD void finish(const PassParam& p, const PassSums& s) const {
    float n = float(sqrt(s.a));
    if (bf16) n = round_bf16(n);
    const float eps = bf16 ? round_bf16(p.hparams->eps) : p.hparams->eps;
    norm[p.index] = n > eps ? n : eps;  // a NaN norm stays NaN (a skipped step never reaches the param)
  }
};

// X / norm (rounded to bf16 in bf16).
struct ScaleRule : PassRuleBase {
  static constexpr uint32_t kReads = kIoX, kWrites = kIoX;
  const float* norm = nullptr;
  int32_t bf16 = 0;
  struct Ctx {
    float norm;
  };
  LOWBIT_HD Ctx param(const PassParam& p) const { return Ctx{norm[p.index]}; }
  LOWBIT_HD void element(const Ctx& c, PassElement& e) const {
    e.x = e.x / c.norm;
    if (bf16) e.x = round_bf16(e.x);
  }
};

// The shape factor of torch.optim.Muon's lr adjustment (adjust_lr_fn) for a
// rows x cols matrix.
LOWBIT_HD double lr_ratio(lowbit_muon_lr_adjust_t mode, double rows, double cols) {
  switch (mode) {
    case LOWBIT_MUON_LR_ORIGINAL: return sqrt(rows / cols > 1.0 ? rows / cols : 1.0);
    case LOWBIT_MUON_LR_MATCH_RMS_ADAMW: return 0.2 * sqrt(rows > cols ? rows : cols);
    case LOWBIT_MUON_LR_SPECTRAL_UNCLAMPED: return sqrt(rows / cols);
    default: return 1.0;
  }
}

// p <- p (1 - lr wd) - lr_adjusted O, with the param's rounding; the step's
// scalars (lr, decay) are those the momentum step of this batch computed.
struct ApplyRule : PassRuleBase {
  static constexpr uint32_t kReads = kIoParam | kIoX, kWrites = kIoParam;
  const int64_t* dims = nullptr;  // engine memory: rows, cols of each param
  struct Ctx {
    float decay, lr;
  };
  LOWBIT_HD Ctx param(const PassParam& p) const {
    const double ratio = lr_ratio(p.hparams->adjust_lr, double(dims[2 * p.index]), double(dims[2 * p.index + 1]));
    return Ctx{p.scalars->decay_factor, float(double(p.scalars->lr) * ratio)};
  }
  LOWBIT_HD void element(const Ctx& c, PassElement& e) const {
    const float decayed = e.p * c.decay;
    e.p = decayed - c.lr * e.x;
  }
};

#define LOWBIT_MUON_RULES(X) X(::lowbit::muon::NormRule) X(::lowbit::muon::ScaleRule) X(::lowbit::muon::ApplyRule)

}  // namespace muon
}  // namespace lowbit
