// An engine runs steps on one device: it owns how state memory is allocated,
// where the hyper-parameters and per-parameter step counts live, and how the
// per-element math of update_rules.hpp is swept over the parameters. The CPU
// engine is always built; the CUDA engine (cuda/) when the toolkit is found.
//
// Life cycle: bind() at registration (and whenever the parameters' storage
// changes: a checkpoint load, the JAX handlers' buffers) may allocate and
// wait; set_hparams() only records; step() only enqueues: the scalars of a
// step (bias corrections, rounding keys) come from the engine's hparams and
// step counts, the non-finite check and the skip decision are made on the
// engine's device, so a CUDA step never waits for the GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "layout_record.hpp"
#include "onebit_rules.hpp"
#include "state.hpp"

namespace lowbit {

// A range of one parameter's elements; `begin` is a multiple of kTile so
// chunks never split a quantization block.
struct Chunk {
  int32_t param;
  int64_t begin, end;
};

constexpr int64_t kChunkElements = 64 * 1024;

// The gradient of one parameter for one step (data == nullptr: the
// parameter is not updated by this step).
struct GradView {
  const void* data = nullptr;
  lowbit_dtype_t dtype = LOWBIT_DTYPE_FLOAT32;
};

// How one step takes its scalars. Pointers are engine memory (host memory for
// the CPU engine, device memory for CUDA) and are read in stream order.
struct StepControl {
  bool check_nonfinite = false;  // a NaN/Inf gradient element makes the step change nothing
  uint64_t seed = 0;             // stochastic rounding
  // One step count for every parameter (the JAX state's count) instead of the
  // engine's per-parameter counts; *count_out = *count + 1 unless the step
  // was skipped (count_out may alias count).
  const int32_t* shared_count = nullptr;
  int32_t* shared_count_out = nullptr;
  const float* lr = nullptr;  // when set, replaces hparams.lr of every group
  // When set: N x kLayoutColumns int32 recorded with the state
  // (core/layout_record.hpp); a parameter whose entry differs from how it is bound
  // makes the step change nothing.
  const int32_t* layout = nullptr;
};

// 1-bit Adam's compressed stage, after the momentum exchange.
struct OneBitApply {
  const float* bucket = nullptr;  // the averaged momentum, flat (bind_onebit offsets)
  int64_t freeze_step = 0;        // the variance is frozen since this step (its bias correction too)
  uint64_t seed = 0;
  bool skip = false;                        // CPU: the exchange found a non-finite value
  const int32_t* device_skip = nullptr;     // CUDA: the same, written in stream order by the exchange
  // Engine memory, read in stream order: > 0 skips the step like `skip`
  // (0/1 Adam's local steps: the mean over the ranks of nonfinite_flag).
  const float* skip_if_positive = nullptr;
  // false: m <- bucket (1-bit Adam, 0/1 Adam's local steps); true:
  // m <- beta1 m + (1 - beta1) bucket (0/1 Adam's 1-bit gradient steps:
  // the bucket holds the exchanged gradient).
  bool blend = false;
};

// 0/1 Adam's synchronisation, after the exchange of zeroone_sync_pack's bucket.
struct ZeroOneSync {
  const float* bucket = nullptr;          // the averaged (p_sync - p') * D
  float* sync_params = nullptr;           // flat fp32 (bind_onebit offsets): the params at the last sync
  const float* group_inv_lrs = nullptr;   // engine memory, one per group: 1 / (sum of lr since the last sync)
  uint64_t seed = 0;
  bool skip = false;
  const int32_t* device_skip = nullptr;
};

// One 1-bit LAMB step after its exchange (or a warm-up step).
struct LambStep {
  const float* bucket = nullptr;   // compression stage: the exchanged scaled momentum
  LambScalars* scalars = nullptr;  // engine memory, one per param
  LambPartial* partials = nullptr; // engine memory, one per bound chunk (scratch)
  float* fresh_v = nullptr;        // flat fp32 (bind_onebit offsets): v_fresh
  LambOptions options;
  bool seed_fresh_v = false;       // the last warm-up step (t == freeze_step): v_fresh <- the new v
  bool check_nonfinite = false;    // warm-up: a non-finite gradient skips the step
  uint64_t seed = 0;
  bool skip = false;                     // compression stage: the exchange found a non-finite value (CPU)
  const int32_t* device_skip = nullptr;  // CUDA: the same
};

class Engine {
 public:
  [[noreturn]] static void not_built(const char* op);  // TEMP
  virtual ~Engine() = default;
  virtual lowbit_device_t device() const = 0;

  // ---- memory
  // Zero-filled memory for optimizer state; throws lowbit::Error on failure.
  virtual void* allocate_zeroed(size_t bytes) = 0;
  // Uninitialised scratch memory (1-bit Adam's exchange bucket).
  virtual void* allocate_scratch(size_t bytes) = 0;
  virtual void release(void* ptr) noexcept = 0;
  // Copies between engine memory and the host after the work on `stream`;
  // they return when the copy is done.
  virtual void copy_to_host(void* dst, const void* src, size_t bytes, void* stream) = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t bytes, void* stream) = 0;
  // Waits for the work enqueued on `stream`.
  virtual void wait(void* stream) = 0;

  // ---- registration
  // The parameters (their static fields: param, dtype, numel, moments, ecc,
  // rounding), their chunks (in parameter order) and the group of each.
  // Parameters are matched by index: those past the previous count start
  // with step count 0, the others keep theirs. Parameters before
  // `first_changed` (and their chunks and groups) are the same as in the
  // previous bind (registration appends). Changes reach the engine's tables
  // in `stream` order; may allocate (and then wait for the device).
  virtual void bind(const ParamView* params, int64_t num_params, const Chunk* chunks, int64_t num_chunks,
                    const int32_t* param_group, int64_t first_changed, void* stream) = 0;
  // The hyper-parameters of every group, as the next step reads them.
  virtual void set_hparams(const lowbit_hparams_t* groups, int32_t num_groups) = 0;
  // Engine memory holding group g's hparams as steps read them (valid until
  // set_hparams changes the number of groups).
  virtual lowbit_hparams_t* hparams_memory(int32_t group) = 0;

  // ---- steps
  // One step of `algo` over every bound parameter whose grads[i].data is
  // set (num_params == the bound count). Only enqueues.
  virtual void step(Algo algo, const GradView* grads, int64_t num_params, const StepControl& ctl, void* stream) = 0;
  // Whether the last step (or 1-bit apply) was skipped. CUDA: valid once the
  // stream has passed it; never waits.
  virtual bool last_step_skipped() const = 0;
  // The engine's per-parameter step counts (blocking, after `stream`).
  virtual void read_steps(int64_t* out, int64_t num_params, void* stream) = 0;
  virtual void write_steps(const int64_t* in, int64_t num_params, void* stream) = 0;

  // ---- 1-bit Adam (core/onebit_adam.cpp): every parameter has fp32
  // moments and a place in one flat fp32 bucket.
  // offsets[i]: where parameter i starts in the bucket; masks[i]: engine
  // memory, numel bytes (0: momentum kept at zero), or nullptr. After bind().
  virtual void bind_onebit(const int64_t* offsets, const uint8_t* const* masks, int64_t num_params) = 0;
  // Warm-up: bucket <- the gradients as fp32.
  virtual void onebit_gather(const GradView* grads, float* bucket, void* stream) = 0;
  // After a warm-up step: masked momentum elements back to zero, unless the
  // step was skipped.
  virtual void onebit_mask(void* stream) = 0;
  // Compressed stage: bucket <- beta1 m + (1 - beta1) g (0 where masked).
  virtual void onebit_momentum(const GradView* grads, float* bucket, void* stream) = 0;
  // Compressed stage, after the exchange of the bucket from onebit_momentum
  // of the same step: m <- bucket (0 where masked), the frozen-variance
  // update, step counts + 1; nothing changes when the exchange was not finite.
  virtual void onebit_apply(const OneBitApply& a, void* stream) = 0;
  // flag (engine memory, one float) <- 1 if data[0..n) holds a non-finite
  // value, else 0.
  virtual void nonfinite_flag(const float* data, int64_t n, float* flag, void* stream) { not_built("nonfinite_flag"); }  // TEMP until the CUDA engine implements it

  // ---- 0/1 Adam (core/zeroone_adam.cpp), after bind_onebit; fp32 m and v.
  // sync_params <- the params as fp32 (as a step loads them).
  virtual void zeroone_snapshot(float* sync_params, void* stream) { not_built("zeroone_snapshot"); }  // TEMP until the CUDA engine implements it
  // A synchronising step's local part, written to the bucket only: with
  // m' = beta1 m + (1 - beta1) g and p' = the param after onebit_apply's
  // update with m' (AdamW, frozen v, no bias correction), in fp32 before
  // rounding to the param's dtype: bucket <- (sync_params - p') * (sqrt(v) +
  // eps), 0 where masked.
  virtual void zeroone_sync_pack(const GradView* grads, const float* sync_params, float* bucket, void* stream) { not_built("zeroone_sync_pack"); }  // TEMP until the CUDA engine implements it
  // After the exchange, unless skipped: m <- bucket * group_inv_lrs[group]
  // (0 where masked); p <- sync_params - bucket / (sqrt(v) + eps), stored as
  // a step stores it (rounding key of the new step count); sync_params <- p
  // as loaded back; step counts + 1.
  virtual void zeroone_sync_apply(const ZeroOneSync& a, void* stream) { not_built("zeroone_sync_apply"); }  // TEMP until the CUDA engine implements it

  // ---- 1-bit LAMB (core/onebit_lamb.cpp), after bind_onebit; fp32 m, v.
  // Warm-up step on `grads` (averaged over the ranks): pass A reduces per
  // chunk ||p||^2 and ||u||^2 with u = lamb_update(m', v', p), m' and v' the
  // new moments, and finds non-finite gradients; per param, unless the step
  // is skipped: trust = lamb_warmup_trust (EMA into coeff_freeze); pass B:
  // m <- m' (0 where masked), v <- v', fresh_v <- v' if seed_fresh_v,
  // p <- p - lr * trust * u; step counts + 1.
  virtual void lamb_warmup(const GradView* grads, const LambStep& a, void* stream) { not_built("lamb_warmup"); }  // TEMP until the CUDA engine implements it
  // First compression step, before lamb_momentum: per param rms_p =
  // sqrt(||m||^2 / numel) (the fixed reduction order), S = their mean (in
  // param order, double), scalars[i].scaling <- lamb_scaling(rms_p, S).
  virtual void lamb_scaling(LambScalars* scalars, LambPartial* partials, void* stream) { not_built("lamb_scaling"); }  // TEMP until the CUDA engine implements it
  // bucket <- (beta1 m + (1 - beta1) g) * scaling (0 where masked).
  virtual void lamb_momentum(const GradView* grads, const LambScalars* scalars, float* bucket, void* stream) { not_built("lamb_momentum"); }  // TEMP until the CUDA engine implements it
  // Compression step after the exchange, unless skipped: pass A: mk =
  // bucket / scaling (0 where masked), g_rec = (mk - beta1 m) / (1 - beta1),
  // fresh_v <- beta2 fresh_v + (1 - beta2) g_rec^2, m <- mk, reducing
  // ||m/D||^2, ||u||^2 (u = lamb_update with the frozen v) and the max of
  // D / (sqrt(fresh_v) + eps); per param trust = lamb_compressed_trust;
  // pass B: p <- p - lr * trust * u; step counts + 1.
  virtual void lamb_compressed(const LambStep& a, void* stream) { not_built("lamb_compressed"); }  // TEMP until the CUDA engine implements it
};

std::unique_ptr<Engine> make_cpu_engine(int num_threads);
// Throws LOWBIT_ERROR_UNSUPPORTED when the library was built without CUDA.
std::unique_ptr<Engine> make_cuda_engine(int device_index);

// Appends the chunks of a parameter of `numel` elements.
template <class Vec>
void append_chunks(Vec& chunks, int32_t param, int64_t numel) {
  for (int64_t b = 0; b < numel; b += kChunkElements)
    chunks.push_back(Chunk{param, b, b + kChunkElements < numel ? b + kChunkElements : numel});
}

}  // namespace lowbit
