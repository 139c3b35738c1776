// The CUDA engine: same math and state formats as the CPU engine, bit for bit,
// as fused multi-tensor kernels (cuda/step_kernel.cuh).
//
// Everything a step reads lives on the device: the parameter and chunk tables
// (written by bind()), the group hyper-parameters (written by the step that
// follows set_hparams()), the per-parameter step counts, and the non-finite
// flag. A step enqueues, on the caller's stream: the upload of this step's
// gradient pointers (and of changed hparams), prepare_kernel (scalars and
// rounding keys from the hparams and step counts), the non-finite check,
// the step kernel, finalize_kernel (step counts + 1 unless skipped) and a
// copy of the skip flag to pinned host memory. Nothing waits for the GPU and
// nothing is allocated, so a step can be captured in a CUDA graph.
//
// Table contents reach the device as kernel parameters of a small upload
// kernel on the caller's stream (cuda/tables.hpp); tables are reallocated
// (waiting for the device) only when more parameters or groups are bound than
// they hold.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/engine.hpp"
#include "cuda/blas.hpp"
#include "cuda/tables.hpp"

namespace lowbit {
namespace cuda {

class CudaEngine final : public Engine {
 public:
  explicit CudaEngine(int device_index);
  ~CudaEngine() override;
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  lowbit_device_t device() const override { return LOWBIT_DEVICE_CUDA; }
  void* allocate_zeroed(size_t bytes) override;
  void* allocate_scratch(size_t bytes) override;
  void release(void* ptr) noexcept override;
  void copy_to_host(void* dst, const void* src, size_t bytes, void* stream) override;
  void copy_from_host(void* dst, const void* src, size_t bytes, void* stream) override;
  void wait(void* stream) override;

  void bind(const ParamView* params, int64_t num_params, const Chunk* chunks, int64_t num_chunks,
            const int32_t* param_group, int64_t first_changed, void* stream) override;
  void set_hparams(const lowbit_hparams_t* groups, int32_t num_groups) override;
  lowbit_hparams_t* hparams_memory(int32_t group) override { return hparams_ + group; }

  void step(Algo algo, const GradView* grads, int64_t num_params, const StepControl& ctl, void* stream) override;
  bool last_step_skipped() const override { return *host_flag_ != 0; }
  void read_steps(int64_t* out, int64_t num_params, void* stream) override;
  void write_steps(const int64_t* in, int64_t num_params, void* stream) override;

  void begin_step(const GradView* grads, int64_t num_params, bool check_nonfinite, void* stream) override;
  void reserve_matmul(const Matmul* products, int64_t count) override;
  void matmul(const Matmul& mm, void* stream) override;

  void bind_flat(const int64_t* offsets, const uint8_t* const* masks, int64_t num_params) override;
  // Enqueues only, like a step: the skip decisions are made on the device
  // (the engine's step flag).
  void run_pass(const Pass& pass, void* stream) override;

  int device_index() const { return device_; }

 private:
  void check_count(int64_t num_params, const char* what) const;
  void grow(int64_t num_params, int64_t num_chunks);
  // Enqueues the upload of this step's gradients (and of changed hparams).
  void upload_step_tables(const GradView* grads, void* stream);
  void prepare(Algo algo, const StepControl& ctl, int64_t frozen_step, void* stream);
  void finalize(const StepControl& ctl, void* stream);
  void set_skip_flag(const PassSkip& skip, void* stream);

  // Shaped parameters (rank-1 / factored moments): pass-1 work items, the
  // parameters themselves, the factored column partials; rebuilt by bind()
  // when the set changes.
  void bind_shaped(const ParamView* params, int64_t num_params);
  void launch_shaped(Algo algo, int phase, void* stream);
  std::vector<DevStatItem> items_host_;
  std::vector<DevShaped> shaped_host_;
  DevStatItem* items_ = nullptr;
  DevShaped* shaped_ = nullptr;
  double* partials_ = nullptr;
  int64_t partials_count_ = 0;

  int device_;
  std::unique_ptr<Blas> blas_;    // reserve_matmul
  DevMaps* maps_ = nullptr;       // device
  int32_t* flag_ = nullptr;       // device: 1 when the current step is skipped
  int32_t* host_flag_ = nullptr;  // pinned copy of the last step's flag
  DevParam* params_ = nullptr;    // device tables, capacity param_cap_
  DevDyn* dyn_ = nullptr;
  StepScalars* scalars_ = nullptr;
  int64_t* steps_ = nullptr;
  DevFlat* flat_ = nullptr;
  int64_t param_cap_ = 0;
  DevChunk* chunks_ = nullptr;  // capacity chunk_cap_, as pass_partials_
  PassPartial* pass_partials_ = nullptr;
  int64_t chunk_cap_ = 0;
  lowbit_hparams_t* hparams_ = nullptr;  // capacity group_cap_
  int32_t group_cap_ = 0;

  // Host mirrors of the device tables.
  std::vector<DevParam> bound_params_;
  std::vector<DevChunk> bound_chunks_;
  std::vector<DevDyn> dyn_host_;
  std::vector<lowbit_hparams_t> hparams_host_;
  bool hparams_dirty_ = false;
  std::unique_ptr<UploadBatch> batch_;
  std::unique_ptr<UploadBatchSmall> small_batch_;
};

}  // namespace cuda
}  // namespace lowbit
