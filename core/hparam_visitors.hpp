// Visitors of walk_hparams (core/hparam_specs.hpp) that both sides use: the
// defaults, and the predicate a device evaluates on hyper-parameters it
// alone sees. The host check that names the field and the descriptors are
// core/hparams.cpp's.
#pragma once
#include "hparam_specs.hpp"

namespace lowbit {

// Writes every visited field's default into h.
struct DefaultsVisitor {
  lowbit_hparams_t& h;
  LOWBIT_HD void real(const char*, float lowbit_hparams_t::*f, float d, const RealBounds&, const char*, int) {
    h.*f = d;
  }
  LOWBIT_HD void flag(const char*, int32_t lowbit_hparams_t::*f, int d, const char*, int) { h.*f = d; }
  LOWBIT_HD void integer(const char*, int32_t lowbit_hparams_t::*f, int d, int, int, const char*, int) { h.*f = d; }
  template <class E>
  LOWBIT_HD void enumeration(const char*, E lowbit_hparams_t::*f, int d, int, int, const char*, const char*, int) {
    h.*f = E(d);
  }
  LOWBIT_HD void reals3(const char*, float (lowbit_hparams_t::*f)[3], float a, float b, float c, const char*, int) {
    (h.*f)[0] = a;
    (h.*f)[1] = b;
    (h.*f)[2] = c;
  }
  LOWBIT_HD void rule(HparamRule) {}
};

// ok &= every visited field within its bounds and every rule holding.
// Comparisons are false for NaN, so NaN is invalid everywhere.
struct ValidVisitor {
  const lowbit_hparams_t& h;
  bool ok = true;
  LOWBIT_HD void real(const char*, float lowbit_hparams_t::*f, float, const RealBounds& b, const char*, int) {
    ok = ok && in_bounds(h.*f, b);
  }
  LOWBIT_HD void flag(const char*, int32_t lowbit_hparams_t::*f, int, const char*, int) {
    ok = ok && (h.*f == 0 || h.*f == 1);
  }
  LOWBIT_HD void integer(const char*, int32_t lowbit_hparams_t::*f, int, int lo, int hi, const char*, int) {
    ok = ok && h.*f >= lo && h.*f <= hi;
  }
  template <class E>
  LOWBIT_HD void enumeration(const char*, E lowbit_hparams_t::*f, int, int lo, int hi, const char*, const char*,
                             int) {
    ok = ok && int(h.*f) >= lo && int(h.*f) <= hi;
  }
  LOWBIT_HD void reals3(const char*, float (lowbit_hparams_t::*f)[3], float, float, float, const char*, int) {
    for (int k = 0; k < 3; ++k) ok = ok && in_bounds((h.*f)[k], finite());
  }
  LOWBIT_HD void rule(HparamRule r) { ok = ok && rule_holds(r, h); }
};

}  // namespace lowbit
