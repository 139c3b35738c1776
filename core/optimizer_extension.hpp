// What a layer above core adds to an Optimizer (the distributed optimizers of
// distributed/): it takes over the step, keeps state of its own next to the
// parameters' (laid out when they change, reported in state_bytes, saved in
// a checkpoint section after the parameter records) and learns when step
// counts change. The Optimizer owns it and calls it; core never names what
// is behind it.
#pragma once
#include <cstdint>
#include <functional>

#include "checkpoint_io.hpp"
#include "error.hpp"
#include "lowbit.h"

namespace lowbit {

class OptimizerExtension {
 public:
  virtual ~OptimizerExtension() = default;
  // The registered parameters changed (add_param, and its rollback).
  virtual void params_changed() = 0;
  // Takes over Optimizer::step (same arguments).
  virtual void step(const lowbit_tensor_t* grads, int64_t num_grads, bool explicit_grads, void* stream) = 0;
  // Takes over Optimizer::step_params: grads[i] set for the params to step.
  virtual void step_subset(const struct GradView* grads, void* stream) {
    (void)grads, (void)stream;
    fail(LOWBIT_ERROR_UNSUPPORTED, "step_params: this algorithm steps every param together (one exchange per "
         "step); use lowbit_optimizer_step");
  }
  // Bytes of step workspace the extension holds (not state: nothing in it
  // outlives a step).
  virtual int64_t workspace_bytes() const { return 0; }
  // set_step or a checkpoint load changed the step counts (or freeze_step).
  virtual void steps_changed(void* stream) = 0;
  // Bytes of state beyond the parameters' own.
  virtual int64_t state_bytes() const = 0;

  // ---- checkpoint section (format version 3 instead of 2 when present)
  virtual bool has_checkpoint_section() const = 0;
  // The most bytes a section of this optimizer's params could take.
  virtual uint64_t max_section_bytes(uint64_t num_groups) const = 0;
  virtual void save_section(CheckpointWriter& w, void* stream) const = 0;
  // Reads and checks the section (throwing, with nothing changed, on bad
  // data); the returned commit installs it and must not fail.
  virtual std::function<void(void* stream)> load_section(CheckpointReader& r, uint32_t num_groups) const = 0;
};

// An extension that only takes over the step (Muon, the trust ratio): no
// state of its own, no checkpoint section, nothing to do when step counts
// change.
class StepOnlyExtension : public OptimizerExtension {
 public:
  void steps_changed(void*) override {}
  int64_t state_bytes() const override { return 0; }
  bool has_checkpoint_section() const override { return false; }
  uint64_t max_section_bytes(uint64_t) const override { return 0; }
  void save_section(CheckpointWriter&, void*) const override {}
  std::function<void(void*)> load_section(CheckpointReader&, uint32_t) const override {
    return [](void*) {};
  }
};

}  // namespace lowbit
