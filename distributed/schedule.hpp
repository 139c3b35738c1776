// The schedule of a 1-bit optimizer: what each step does (whether it
// communicates, and how), when 0/1 Adam updates its variance and
// synchronises, and how its intervals grow. The one place these rules live:
// the steps (onebit_adam.cpp, zeroone_adam.cpp, onebit_lamb.cpp), the
// status (lowbit_optimizer_onebit_status) and the Python layer (through that
// status) all ask it. Steps are numbered by the count of applied steps
// before them (`done`): step t = done + 1.
#pragma once
#include <cstdint>

#include "lowbit.h"

namespace lowbit {
namespace distributed {

enum class StepKind : int32_t {
  // The gradients averaged uncompressed (or by the caller), then a
  // full-precision step on them: 1-bit Adam's and LAMB's warm-up, 0/1
  // Adam's variance steps.
  Averaged,
  // The local momentum through the 1-bit allreduce (1-bit Adam, LAMB).
  CompressedMomentum,
  // 0/1 Adam's phase 1 outside variance steps: the gradient through the
  // 1-bit allreduce, blended into m.
  CompressedGrad,
  // 0/1 Adam's phase 2: a local step (a one-float non-finite agreement).
  Local,
  // 0/1 Adam's phase 2: a synchronisation (the 1-bit allreduce of deltas).
  Sync,
};

class Schedule {
 public:
  Schedule(lowbit_algorithm_t algorithm, int64_t freeze_step) : algorithm_(algorithm), freeze_step_(freeze_step) {}
  void set_freeze_step(int64_t freeze_step) { freeze_step_ = freeze_step; }
  int64_t freeze_step() const { return freeze_step_; }

  StepKind kind(int64_t done) const;
  // 0: warm-up / 0/1 Adam's phase 1; 1: compression / phase 2.
  int32_t phase(int64_t done) const { return done + 1 > freeze_step_ ? 1 : 0; }
  // 0/1 Adam: this step starts phase 2 (p_sync taken, errors and the local
  // interval reset).
  bool enters_phase2(int64_t done) const { return done + 1 == freeze_step_ + 1; }
  // 1-bit LAMB: the last warm-up step, which seeds v_fresh.
  bool last_warmup(int64_t done) const { return done + 1 == freeze_step_; }
  // The exchange of that step: 0 none (a local step), 1 an uncompressed
  // average (0 when the caller averages the warm-up's gradients), 2 1-bit.
  int32_t exchange(int64_t done, bool average_warmup) const;

  // 0/1 Adam's intervals (checkpointed), advanced by the applied steps.
  void enter_phase2();
  void applied(StepKind kind, const lowbit_onebit_options_t& options);
  int64_t var_interval = 1, var_counter = 0, local_interval = 1, local_counter = 0;

 private:
  lowbit_algorithm_t algorithm_;
  int64_t freeze_step_;
};

}  // namespace distributed
}  // namespace lowbit
