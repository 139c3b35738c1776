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

  void bind_onebit(const int64_t* offsets, const uint8_t* const* masks, int64_t num_params) override;
  void onebit_gather(const GradView* grads, float* bucket, void* stream) override;
  void onebit_mask(void* stream) override;
  void onebit_momentum(const GradView* grads, float* bucket, void* stream) override;
  void onebit_apply(const OneBitApply& a, void* stream) override;
  void nonfinite_flag(const float* data, int64_t n, float* flag, void* stream) override;

  // 0/1 Adam and 1-bit LAMB (cuda/onebit_ext_kernels.cuh): enqueue only, like
  // a step; the skip decisions are made on the device (the engine's step
  // flag). zeroone_sync_apply and lamb_compressed use the gradient table of
  // the zeroone_sync_pack / lamb_momentum before them (the same step).
  void zeroone_snapshot(float* sync_params, void* stream) override;
  void zeroone_sync_pack(const GradView* grads, const float* sync_params, float* bucket, void* stream) override;
  void zeroone_sync_apply(const ZeroOneSync& a, void* stream) override;

  void lamb_warmup(const GradView* grads, const LambStep& a, void* stream) override;
  void lamb_scaling(LambScalars* scalars, LambPartial* partials, void* stream) override;
  void lamb_momentum(const GradView* grads, const LambScalars* scalars, float* bucket, void* stream) override;
  void lamb_compressed(const LambStep& a, void* stream) override;

  int device_index() const { return device_; }

 private:
  void check_count(int64_t num_params, const char* what) const;
  void grow(int64_t num_params, int64_t num_chunks);
  // Enqueues the upload of this step's gradients (and of changed hparams).
  void upload_step_tables(const GradView* grads, void* stream);
  void prepare(Algo algo, const StepControl& ctl, int64_t frozen_step, void* stream);
  // prepare() for the 1-bit passes: AdamW's scalars as make_onebit_scalars
  // gives them (the variance's bias correction frozen at frozen_step; 0/1
  // Adam and LAMB pass 0 and run without bias correction), this rounding
  // seed; returns the control finalize() takes.
  StepControl prepare_onebit(uint64_t seed, int64_t frozen_step, void* stream);
  void finalize(const StepControl& ctl, void* stream);
  void launch_onebit_op(int32_t op, float* bucket, void* stream, bool blend = false);
  // The step flag in stream order: *device_skip when set, else `skip`.
  void set_skip_flag(const int32_t* device_skip, bool skip, void* stream);
  // 0/1 Adam and 1-bit LAMB passes (cuda/onebit_ext_kernels.cuh): the
  // engine's tables filled in, the rest from the caller.
  OneBitExtArgs ext_args(int32_t op) const;
  void launch_ext(const OneBitExtArgs& a, void* stream);
  // A LAMB step's three passes: `a` (pass A, l's scalars, partials, v_fresh
  // and options filled in here), then trust_op and b_op with the same args.
  void launch_lamb_passes(OneBitExtArgs a, const LambStep& l, OneBitExtOp trust_op, OneBitExtOp b_op, void* stream);
  // The passes that follow an upload of this step's gradients need every
  // parameter's (1-bit algorithms communicate every parameter).
  void require_all_grads(const char* what) const;

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
  DevMaps* maps_ = nullptr;       // device
  int32_t* flag_ = nullptr;       // device: 1 when the current step is skipped
  int32_t* host_flag_ = nullptr;  // pinned copy of the last step's flag
  DevParam* params_ = nullptr;    // device tables, capacity param_cap_
  DevDyn* dyn_ = nullptr;
  StepScalars* scalars_ = nullptr;
  int64_t* steps_ = nullptr;
  DevOneBit* onebit_ = nullptr;
  int64_t param_cap_ = 0;
  DevChunk* chunks_ = nullptr;  // capacity chunk_cap_
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
