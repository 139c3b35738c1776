// The checkpoint section of 0/1 Adam and 1-bit LAMB (format version 3, after
// the parameter records, before the final checksum; core/checkpoint.cpp):
//   i64 var_interval var_counter local_interval local_counter  u32 lamb_scaled
//   u32 num_groups  f64 lrs[num_groups]
//   u64 aux_bytes  aux (fp32 per element of every param, in param order:
//                       0/1 Adam p_sync, LAMB v_fresh)
//   u64 scalar_bytes  per param f32 coeff_freeze last_factor scaling
// 1-bit Adam writes none (its state is the params' and the step count).
#include <cmath>
#include <cstring>

#include "distributed/onebit_optimizer.hpp"

namespace lowbit {
namespace distributed {

bool OneBitOptimizer::has_checkpoint_section() const { return config().algorithm != LOWBIT_ALGORITHM_ONEBIT_ADAM; }

uint64_t OneBitOptimizer::max_section_bytes(uint64_t num_groups) const {
  auto add = [](uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; };
  auto mul = [](uint64_t a, uint64_t b) { return b && a > UINT64_MAX / b ? UINT64_MAX : a * b; };
  return add(add(56, mul(8, num_groups)), add(mul(4, uint64_t(numel_)), mul(12, uint64_t(num_params()))));
}

void OneBitOptimizer::save_section(CheckpointWriter& w, void* stream) const {
  for (int64_t v : {schedule_.var_interval, schedule_.var_counter, schedule_.local_interval, schedule_.local_counter})
    w.put<int64_t>(v);
  w.put<uint32_t>(lamb_scaled_ ? 1u : 0u);
  const size_t num_groups = core_.groups().size();
  w.put<uint32_t>(uint32_t(num_groups));
  for (size_t g = 0; g < num_groups; ++g) w.put<double>(g < lrs_.size() ? lrs_[g] : 0.0);
  std::vector<uint8_t> host(aux_.bytes());
  if (!host.empty()) engine().copy_to_host(host.data(), aux_.data(), host.size(), stream);
  w.put<uint64_t>(host.size());
  w.append(host.data(), host.size());
  std::vector<LambScalars> scalars(static_cast<size_t>(num_params()));
  if (!scalars.empty())
    engine().copy_to_host(scalars.data(), lamb_scalars_.data(), scalars.size() * sizeof(LambScalars), stream);
  w.put<uint64_t>(scalars.size() * 12);
  for (const LambScalars& x : scalars)
    for (float f : {x.coeff_freeze, x.last_factor, x.scaling}) w.put<float>(f);
}

std::function<void(void*)> OneBitOptimizer::load_section(CheckpointReader& r, uint32_t num_groups) const {
  struct Section {
    int64_t var_interval, var_counter, local_interval, local_counter;
    bool lamb_scaled;
    std::vector<double> lrs;
    std::vector<uint8_t> aux;
    std::vector<LambScalars> scalars;
  };
  auto ext = std::make_shared<Section>();
  ext->var_interval = r.get<int64_t>("var_interval");
  ext->var_counter = r.get<int64_t>("var_counter");
  ext->local_interval = r.get<int64_t>("local_interval");
  ext->local_counter = r.get<int64_t>("local_counter");
  const uint32_t scaled = r.get<uint32_t>("lamb_scaled");
  const uint32_t lrs_groups = r.get<uint32_t>("lrs groups");
  LOWBIT_REQUIRE(ext->var_interval >= 1 && ext->var_interval <= (int64_t(1) << 62) && ext->var_counter >= 0 &&
                     ext->local_interval >= 1 && ext->local_interval <= (int64_t(1) << 40) &&
                     ext->local_counter >= 0 && scaled <= 1 && lrs_groups == num_groups,
                 LOWBIT_ERROR_CORRUPT_DATA, "checkpoint 1-bit schedule is impossible (var_interval ", ext->var_interval,
                 ", var_counter ", ext->var_counter, ", local_interval ", ext->local_interval, ", local_counter ",
                 ext->local_counter, ", lamb_scaled ", scaled, ", ", lrs_groups, " lr sums for ", num_groups,
                 " groups)");
  ext->lamb_scaled = scaled != 0;
  ext->lrs.resize(lrs_groups);
  for (double& x : ext->lrs) {
    x = r.get<double>("lr sums");
    LOWBIT_REQUIRE(std::isfinite(x) && x >= 0.0, LOWBIT_ERROR_CORRUPT_DATA, "checkpoint lr sum ", x, " is impossible");
  }
  const uint64_t aux_bytes = r.get<uint64_t>("aux_bytes");
  LOWBIT_REQUIRE(aux_bytes == uint64_t(numel_) * 4, LOWBIT_ERROR_STATE_MISMATCH, "checkpoint holds ", aux_bytes,
                 " bytes of 1-bit per-element state, this optimizer's params need ", uint64_t(numel_) * 4);
  const uint8_t* aux = r.take(aux_bytes, "1-bit per-element state");
  ext->aux.assign(aux, aux + aux_bytes);
  const uint64_t scalar_bytes = r.get<uint64_t>("scalar_bytes");
  LOWBIT_REQUIRE(scalar_bytes == uint64_t(num_params()) * 12, LOWBIT_ERROR_CORRUPT_DATA, "checkpoint holds ",
                 scalar_bytes, " bytes of LAMB scalars for ", num_params(), " params");
  ext->scalars.resize(size_t(num_params()));
  for (LambScalars& x : ext->scalars) {
    x.coeff_freeze = r.get<float>("coeff_freeze");
    x.last_factor = r.get<float>("last_factor");
    x.scaling = r.get<float>("scaling");
    x.trust = 0.f;
  }
  auto* self = const_cast<OneBitOptimizer*>(this);
  return [self, ext](void* stream) {
    Schedule& s = self->schedule_;
    s.var_interval = ext->var_interval;
    s.var_counter = ext->var_counter;
    s.local_interval = ext->local_interval;
    s.local_counter = ext->local_counter;
    self->lamb_scaled_ = ext->lamb_scaled;
    self->lrs_ = std::move(ext->lrs);
    Engine& e = self->engine();
    if (!ext->aux.empty()) e.copy_from_host(self->aux_.data(), ext->aux.data(), ext->aux.size(), stream);
    if (!ext->scalars.empty())
      e.copy_from_host(self->lamb_scalars_.data(), ext->scalars.data(), ext->scalars.size() * sizeof(LambScalars),
                       stream);
  };
}

}  // namespace distributed
}  // namespace lowbit
