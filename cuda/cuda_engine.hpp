// The CUDA engine: same math and state formats as the CPU engine, bit for bit,
// as fused multi-tensor kernels (cuda/step_kernel.cuh).
//
// Two ways to drive it:
//  - the Engine interface of core/engine.hpp (what Optimizer calls today):
//    step() only enqueues; any_nonfinite() has to return a bool, so it waits
//    for the check on the stream (the one host synchronisation of a step, and
//    only with skip_nonfinite = 1). The per-step scalars come from the host.
//  - the device-resident interface below (bind / set_device_scalars /
//    enqueue_step), proposed as the next Engine interface: step counts live
//    in device memory and advance on the device, hyper-parameters are read
//    from device memory, the non-finite check decides on the device, and
//    nothing waits for the GPU, so a step can be captured in a CUDA graph and
//    replayed.
//
// Memory: optimizer state comes from allocate_zeroed() at registration; the
// engine's own tables (per-parameter descriptors, chunk map, step counts) are
// (re)allocated only when more parameters are registered, never by a step
// over an unchanged set. Table contents reach the device as kernel parameters
// of a small upload kernel on the caller's stream (cuda/tables.hpp).
//
// A captured graph refers to the tables of the parameters registered at
// capture time: capture again after registering more parameters.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/engine.hpp"
#include "cuda/tables.hpp"

namespace lowbit {
namespace cuda {

class CudaEngine final : public Engine {
 public:
  explicit CudaEngine(int device_index);
  ~CudaEngine() override;
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  // ---- core/engine.hpp -------------------------------------------------------
  lowbit_device_t device() const override { return LOWBIT_DEVICE_CUDA; }
  void* allocate_zeroed(size_t bytes) override;
  void release(void* ptr) noexcept override;
  // Blocking; wait for all work on the device first (these calls take no stream).
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void copy_from_host(void* dst, const void* src, size_t bytes) override;
  // Enqueues the check on `stream` and waits for its result.
  bool any_nonfinite(const ParamView* params, const Chunk* chunks, int64_t num_chunks, void* stream) override;
  // Enqueues the step on `stream` (scalars and rounding keys from `params`).
  void step(Algo algo, const ParamView* params, const Chunk* chunks, int64_t num_chunks, void* stream) override;

  // ---- device-resident interface ------------------------------------------------
  // Describes the registered parameters (views: static fields; grads and
  // scalars are ignored) and their chunks. param_group (host array, may be
  // null: keep the last one given, or 0) is the group of each parameter for
  // the device-scalar mode. Does nothing when nothing changed; otherwise
  // enqueues the new tables on `stream`, and when they outgrow their
  // allocation, waits for the device and reallocates. New parameters start
  // with step count 0.
  void bind(const ParamView* params, int64_t num_params, const Chunk* chunks, int64_t num_chunks,
            const int32_t* param_group, void* stream);
  // device_hparams: device memory holding one lowbit_hparams_t per group, read
  // by every following enqueue_step (nullptr: back to host scalars).
  void set_device_scalars(const lowbit_hparams_t* device_hparams, uint64_t seed);
  // One step over the bound parameters: params[i].grad (and, in host-scalar
  // mode, params[i].scalars / rounding_key) of this step. With
  // check_nonfinite, a NaN/Inf in any gradient makes the step change nothing
  // (device step counts included); skipped_flag_host() holds the outcome once
  // the stream has passed the step. Only enqueues: no host synchronisation,
  // no allocation, capturable in a CUDA graph.
  void enqueue_step(Algo algo, const ParamView* params, int64_t num_params, bool check_nonfinite, void* stream);
  // Pinned host memory: 1 if the last enqueue_step with check_nonfinite was
  // skipped; valid after the stream has reached the end of that step.
  const volatile int32_t* skipped_flag_host() const { return host_flag_; }
  // Device step counts of the bound parameters (blocking).
  void read_steps(int64_t* out, int64_t num_params);
  void write_steps(const int64_t* in, int64_t num_params);
  int device_index() const { return device_; }

 private:
  void update_tables(const ParamView* params, int64_t num_params, const Chunk* chunks, int64_t num_chunks,
                     const int32_t* param_group, void* stream);
  void sync_tables(const ParamView* params, const Chunk* chunks, int64_t num_chunks, void* stream);
  void upload_dyn(const ParamView* params, int64_t num_params, bool host_scalars, void* stream, bool reuse_pending);
  void enqueue_check(void* stream);
  void launch_all(Algo algo, bool check_nonfinite, bool device_scalars, void* stream);
  void grow(int64_t num_params, int64_t num_chunks);

  int device_;
  DevMaps* maps_ = nullptr;          // device
  int32_t* flag_ = nullptr;          // device: non-finite flag of the current step
  int32_t* host_flag_ = nullptr;     // pinned host copy
  DevParam* params_ = nullptr;       // device tables, capacity param_cap_
  DevDyn* dyn_ = nullptr;
  StepScalars* scalars_ = nullptr;
  int64_t* steps_ = nullptr;
  int64_t param_cap_ = 0;
  DevChunk* chunks_ = nullptr;       // capacity chunk_cap_
  int64_t chunk_cap_ = 0;

  // Host mirrors of what the device tables hold.
  std::vector<DevParam> bound_params_, params_host_;
  std::vector<DevChunk> bound_chunks_, chunks_host_;
  std::vector<int32_t> bound_groups_;
  std::vector<DevDyn> dyn_host_, dyn_uploaded_;
  std::vector<StepScalars> scalars_host_, scalars_uploaded_;
  bool dyn_pending_ = false;  // any_nonfinite() just uploaded dyn_uploaded_ / scalars_uploaded_
  std::unique_ptr<UploadBatch> batch_;
  std::unique_ptr<UploadBatchSmall> small_batch_;

  const lowbit_hparams_t* device_hparams_ = nullptr;
  uint64_t seed_ = 0;
};

}  // namespace cuda
}  // namespace lowbit
