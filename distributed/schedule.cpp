#include "distributed/schedule.hpp"

#include <algorithm>

namespace lowbit {
namespace distributed {

StepKind Schedule::kind(int64_t done) const {
  const int64_t t = done + 1;
  const bool later = t > freeze_step_;  // compression stage / phase 2
  if (algorithm_ != LOWBIT_ALGORITHM_ZEROONE_ADAM) return later ? StepKind::CompressedMomentum : StepKind::Averaged;
  if (!later) return t % var_interval == 0 ? StepKind::Averaged : StepKind::CompressedGrad;
  // Entering phase 2 synchronises (the interval restarts at 1 there).
  return enters_phase2(done) || t % local_interval == 0 ? StepKind::Sync : StepKind::Local;
}

int32_t Schedule::exchange(int64_t done, bool average_warmup) const {
  switch (kind(done)) {
    case StepKind::Averaged: return average_warmup ? 1 : 0;
    case StepKind::Local: return 0;
    default: return 2;
  }
}

void Schedule::enter_phase2() {
  local_interval = 1;
  local_counter = 0;
}

void Schedule::applied(StepKind kind, const lowbit_onebit_options_t& o) {
  if (algorithm_ != LOWBIT_ALGORITHM_ZEROONE_ADAM) return;
  if (kind == StepKind::Averaged) {
    if (++var_counter == o.var_update_scaler) {
      var_counter = 0;
      var_interval *= 2;
    }
  } else if (kind == StepKind::Local || kind == StepKind::Sync) {
    if (++local_counter == o.local_step_scaler) {
      local_counter = 0;
      local_interval = std::min(o.local_step_clipper, 2 * local_interval);
    }
  }
}

}  // namespace distributed
}  // namespace lowbit
