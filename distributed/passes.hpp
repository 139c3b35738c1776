// The operations of 1-bit Adam, 0/1 Adam and 1-bit LAMB as pass rules
// (core/pass.hpp): each is the per-element rule of onebit_rules.hpp with
// what it reads and writes, and, for LAMB, the per-parameter trust ratios
// from the fixed-order reductions. Every parameter of these algorithms keeps
// fp32 moments (M = m, V = v) and a place in the flat fp32 buffers (X, Y:
// the exchange bucket, 0/1 Adam's p_sync, LAMB's v_fresh). The CPU engine
// runs them from passes_cpu.cpp, the CUDA engine from passes.cu; both
// instantiate the rules of LOWBIT_DISTRIBUTED_RULES.
#pragma once
#include <cmath>

#include "core/pass.hpp"
#include "distributed/onebit_rules.hpp"

namespace lowbit {
namespace distributed {

// x <- the gradient (kFrom = kIoGrad: the warm-up's average is taken on x)
// or the param (kIoParam: 0/1 Adam's p_sync when it enters phase 2) as fp32.
template <uint32_t kFrom>
struct ToFlat : PassRuleBase {
  static constexpr uint32_t kReads = kFrom, kWrites = kIoX;
  struct Ctx {};
  LOWBIT_HD Ctx param(const PassParam&) const { return {}; }
  LOWBIT_HD void element(const Ctx&, PassElement& e) const { e.x = kFrom == kIoGrad ? e.g : e.p; }
};
using GatherGrads = ToFlat<kIoGrad>;
using Snapshot = ToFlat<kIoParam>;

// After a warm-up step (skipped: nothing): masked momentum back to zero.
struct ZeroMasked : PassRuleBase {
  static constexpr uint32_t kReads = kIoM | kIoMask, kWrites = kIoM;
  static constexpr bool kMaskedOnly = true;
  struct Ctx {};
  LOWBIT_HD Ctx param(const PassParam&) const { return {}; }
  LOWBIT_HD void element(const Ctx&, PassElement& e) const { e.m = e.keep ? e.m : 0.f; }
};

// x <- the local momentum beta1 m + (1 - beta1) g (0 where masked), times
// LAMB's scaling of the parameter (lamb; nullptr: 1-bit Adam's, 1). kFlag:
// also *flag <- 1 if some x is not finite, else 0 (0/1 Adam's local steps).
template <bool kFlag>
struct LocalMomentum : PassRuleBase {
  static constexpr uint32_t kReads = kIoM | kIoGrad | kIoMask, kWrites = kIoX;
  static constexpr uint32_t kReduce = kFlag ? kBad : 0u;
  static constexpr bool kFinishAll = kFlag;
  const LambScalars* lamb = nullptr;
  float* flag = nullptr;
  struct Ctx {
    StepScalars s;
    float scaling;
  };
  LOWBIT_HD Ctx param(const PassParam& pp) const {
    Ctx c{};
    c.s.beta1 = pp.hparams->beta1;
    c.scaling = lamb ? lamb[pp.index].scaling : 1.f;
    return c;
  }
  LOWBIT_HD void element(const Ctx& c, PassElement& e) const {
    e.x = e.keep ? onebit_local_momentum(c.s, e.m, e.g) * c.scaling : 0.f;
    if (kFlag) e.bad = !finite(e.x);
  }
  template <class P>
  LOWBIT_HD void finish_all(const P&, bool any_bad) const {
    if (kFlag) *flag = any_bad ? 1.f : 0.f;
  }
};

// 1-bit Adam's update from the exchanged momentum x (kBlend, 0/1 Adam's
// 1-bit gradient steps: x is the exchanged gradient, blended into m), the
// variance frozen: m <- x (0 where masked), p as onebit_apply.
template <bool kBlend>
struct OneBitUpdate : PassRuleBase {
  static constexpr uint32_t kReads = kIoParam | kIoM | kIoV | kIoX | kIoMask, kWrites = kIoParam | kIoM;
  struct Ctx {
    StepScalars s;
  };
  LOWBIT_HD Ctx param(const PassParam& pp) const { return {*pp.scalars}; }
  LOWBIT_HD void element(const Ctx& c, PassElement& e) const {
    const float mk = !e.keep ? 0.f : (kBlend ? onebit_local_momentum(c.s, e.m, e.x) : e.x);
    e.m = mk;
    onebit_apply(c.s, e.p, mk, e.v);
  }
};

// 0/1 Adam, a synchronising step's local part: x (the bucket) <- (y - p') D,
// y = p_sync, p' the param after the local update (not stored); 0 where masked.
struct SyncPack : PassRuleBase {
  static constexpr uint32_t kReads = kIoParam | kIoGrad | kIoM | kIoV | kIoY | kIoMask, kWrites = kIoX;
  struct Ctx {
    StepScalars s;
  };
  LOWBIT_HD Ctx param(const PassParam& pp) const { return {*pp.scalars}; }
  LOWBIT_HD void element(const Ctx& c, PassElement& e) const {
    e.x = e.keep ? zeroone_sync_delta(c.s, e.m, e.g, e.v, e.y, e.p) : 0.f;
  }
};

// 0/1 Adam after the exchange of SyncPack's bucket x, masked (0 where the
// mask is, as DeepSpeed multiplies the synchronised buffer by it, so masked
// elements stay put): m <- x / (the sum of lr since the last sync),
// p <- p_sync - x / D, stored with the param's rounding; y (p_sync) <- p as
// stored.
struct SyncApply : PassRuleBase {
  static constexpr uint32_t kReads = kIoV | kIoX | kIoY | kIoMask, kWrites = kIoParam | kIoM | kIoYStoredParam;
  const float* group_inv_lrs = nullptr;  // engine memory, per group: 1 / (sum of lr since the last sync)
  struct Ctx {
    float eps, inv_lr;
  };
  LOWBIT_HD Ctx param(const PassParam& pp) const { return {pp.scalars->eps, group_inv_lrs[pp.group]}; }
  LOWBIT_HD void element(const Ctx& c, PassElement& e) const {
    const float d = e.keep ? e.x : 0.f;
    e.m = d * c.inv_lr;
    e.p = zeroone_sync_param(e.y, d, e.v, c.eps);
  }
};

// What LAMB's passes A share: a trust ratio per param from their reductions.
struct LambTrustRule : PassRuleBase {
  static constexpr bool kFinish = true;
  LambScalars* lamb = nullptr;
  LambOptions options;
};

// 1-bit LAMB, a warm-up step's pass A (nothing written): ||p||^2, ||u||^2 of
// u = lamb_update with the new moments, non-finite grads; per param the
// trust ratio (and its EMA).
struct LambWarmupNorms : LambTrustRule {
  static constexpr uint32_t kReads = kIoParam | kIoGrad | kIoM | kIoV, kWrites = 0;
  static constexpr uint32_t kReduce = kSumA | kSumB | kBad;
  struct Ctx {
    StepScalars s;
  };
  LOWBIT_HD Ctx param(const PassParam& pp) const { return {*pp.scalars}; }
  LOWBIT_HD void element(const Ctx& c, PassElement& e) const {
    e.bad = !finite(e.g);
    float mk = e.m, vk = e.v;
    lamb_moments(c.s, e.g, mk, vk);
    const float u = lamb_update(mk, vk, e.p, c.s.eps, c.s.weight_decay);
    e.ra = double(e.p) * double(e.p);
    e.rb = double(u) * double(u);
  }
  LOWBIT_HD void finish(const PassParam& pp, const PassSums& s) const {
    LambScalars sc = lamb[pp.index];
    sc.trust = lamb_warmup_trust(s.a, s.b, options, sc.coeff_freeze);
    lamb[pp.index] = sc;
  }
};

// Its pass B: the new moments (m 0 where masked; kFresh, the last warm-up
// step: x = v_fresh <- v), p <- p - lr trust u.
template <bool kFresh>
struct LambWarmupUpdate : PassRuleBase {
  static constexpr uint32_t kReads = kIoParam | kIoGrad | kIoM | kIoV | kIoMask;
  static constexpr uint32_t kWrites = kIoParam | kIoM | kIoV | (kFresh ? kIoX : 0u);
  const LambScalars* lamb = nullptr;
  struct Ctx {
    StepScalars s;
    float step;
  };
  LOWBIT_HD Ctx param(const PassParam& pp) const {
    return {*pp.scalars, pp.scalars->lr * lamb[pp.index].trust};
  }
  LOWBIT_HD void element(const Ctx& c, PassElement& e) const {
    float mk = e.m, vk = e.v;
    lamb_moments(c.s, e.g, mk, vk);
    e.p -= c.step * lamb_update(mk, vk, e.p, c.s.eps, c.s.weight_decay);
    e.m = e.keep ? mk : 0.f;
    e.v = vk;
    if (kFresh) e.x = vk;
  }
};

// The first compression step's scalings: rms of each param's m, S their
// mean over the params with elements (in param order), scaling = S / rms.
struct LambScaling : PassRuleBase {
  static constexpr uint32_t kReads = kIoM, kWrites = 0;
  static constexpr uint32_t kReduce = kSumA;
  static constexpr bool kFinish = true, kFinishAll = true;
  LambScalars* lamb = nullptr;
  double* rms = nullptr;  // engine memory, one per param (scratch)
  struct Ctx {};
  LOWBIT_HD Ctx param(const PassParam&) const { return {}; }
  LOWBIT_HD void element(const Ctx&, PassElement& e) const { e.ra = double(e.m) * double(e.m); }
  LOWBIT_HD void finish(const PassParam& pp, const PassSums& s) const {
    rms[pp.index] = pp.numel ? sqrt(s.a / double(pp.numel)) : 0.0;
  }
  template <class P>
  LOWBIT_HD void finish_all(const P& params, bool) const {
    double mean = 0.0;
    int64_t counted = 0;  // empty params do not count (DeepSpeed drops them)
    for (int64_t i = 0; i < params.size(); ++i)
      if (params.numel(i)) mean += rms[i], ++counted;
    mean = counted ? mean / double(counted) : 0.0;
    for (int64_t i = 0; i < params.size(); ++i) lamb[i].scaling = lamb_scaling(rms[i], mean);
  }
};

// A compression step's pass A after the exchange of the scaled momenta x:
// m <- x / scaling (0 where masked), y = v_fresh from the reconstructed
// gradient; ||m / D||^2, ||u||^2 and max D / D_fresh; per param the trust.
struct LambCompressedNorms : LambTrustRule {
  static constexpr uint32_t kReads = kIoParam | kIoM | kIoV | kIoX | kIoY | kIoMask, kWrites = kIoM | kIoY;
  static constexpr uint32_t kReduce = kSumA | kSumB | kMax;
  struct Ctx {
    StepScalars s;
    float scaling;
  };
  LOWBIT_HD Ctx param(const PassParam& pp) const { return {*pp.scalars, lamb[pp.index].scaling}; }
  LOWBIT_HD void element(const Ctx& c, PassElement& e) const {
    float pre, u;
    e.rmax = lamb_compressed_element(c.s, !e.keep, e.x, c.scaling, e.m, e.v, e.y, e.p, pre, u);
    e.ra = double(pre) * double(pre);
    e.rb = double(u) * double(u);
  }
  LOWBIT_HD void finish(const PassParam& pp, const PassSums& s) const {
    LambScalars sc = lamb[pp.index];
    sc.trust = lamb_compressed_trust(s.max, s.a, s.b, pp.scalars->weight_decay, options, sc.coeff_freeze,
                                     sc.last_factor);
    lamb[pp.index] = sc;
  }
};

// Its pass B: p <- p - lr trust lamb_update(m, v, p).
struct LambCompressedUpdate : PassRuleBase {
  static constexpr uint32_t kReads = kIoParam | kIoM | kIoV, kWrites = kIoParam;
  const LambScalars* lamb = nullptr;
  struct Ctx {
    float step, eps, wd;
  };
  LOWBIT_HD Ctx param(const PassParam& pp) const {
    return {pp.scalars->lr * lamb[pp.index].trust, pp.scalars->eps, pp.scalars->weight_decay};
  }
  LOWBIT_HD void element(const Ctx& c, PassElement& e) const {
    e.p -= c.step * lamb_update(e.m, e.v, e.p, c.eps, c.wd);
  }
};

}  // namespace distributed
}  // namespace lowbit

// Every rule the engines instantiate (X(rule type)).
#define LOWBIT_DISTRIBUTED_RULES(X)                                                                            \
  X(::lowbit::distributed::ToFlat<::lowbit::kIoGrad>)                                                         \
  X(::lowbit::distributed::ZeroMasked)                                                                         \
  X(::lowbit::distributed::LocalMomentum<false>)                                                               \
  X(::lowbit::distributed::LocalMomentum<true>)                                                                \
  X(::lowbit::distributed::OneBitUpdate<false>)                                                                \
  X(::lowbit::distributed::OneBitUpdate<true>)                                                                 \
  X(::lowbit::distributed::ToFlat<::lowbit::kIoParam>)                                                        \
  X(::lowbit::distributed::SyncPack)                                                                           \
  X(::lowbit::distributed::SyncApply)                                                                          \
  X(::lowbit::distributed::LambWarmupNorms)                                                                    \
  X(::lowbit::distributed::LambWarmupUpdate<false>)                                                            \
  X(::lowbit::distributed::LambWarmupUpdate<true>)                                                             \
  X(::lowbit::distributed::LambScaling)                                                                        \
  X(::lowbit::distributed::LambCompressedNorms)                                                                \
  X(::lowbit::distributed::LambCompressedUpdate)
