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
#include "pass.hpp"
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

// Whether a grad's memory is apart from its param's (a grad may share it).
inline bool grad_apart(const ParamView& pv, const GradView& grad) {
  const char* gp = static_cast<const char*>(grad.data);
  const char* pp = static_cast<const char*>(pv.param);
  return gp + dtype_bytes(grad.dtype) * pv.numel <= pp || pp + dtype_bytes(pv.param_dtype) * pv.numel <= gp;
}

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
  // The shared count as a host value (>= 0) instead of, or besides,
  // shared_count: with both, a step whose *shared_count differs changes
  // nothing (a state restored from another step). *shared_count_out =
  // host_count + 1 when only the value is given.
  int64_t host_count = -1;
  const float* lr = nullptr;  // when set, replaces hparams.lr of every group
  // When set: the groups' hyper-parameters in engine memory, instead of
  // set_hparams' (checked with hparams_valid where the step reads them: a bad
  // group skips the step).
  const lowbit_hparams_t* hparams = nullptr;
  // When set: N x kLayoutColumns int32 recorded with the state
  // (core/layout_record.hpp); a parameter whose entry differs from how it is bound
  // makes the step change nothing.
  const int32_t* layout = nullptr;
  // When set: the step writes each stepped param's new value, in fp32, to
  // flat_out + its flat offset (bind_flat) instead of the param, which it
  // neither reads nor changes (Muon's momentum step, whose output is the
  // matrix Newton-Schulz orthogonalises).
  float* flat_out = nullptr;
  // This call continues a step opened by begin_step(): it takes that step's
  // skip decision (and its own checks add to it) instead of making a new one.
  bool continue_step = false;
};

// C = alpha op(A) op(B) + beta D for `batch` row-major fp32 matrices in engine
// memory, each contiguous (C, D: m x n; op(A): m x k; op(B): k x n), matrix i
// at base + i * stride. D may be C; beta 0 ignores D. bf16: A and B hold
// bf16 values (the products may use bf16 arithmetic: they are exact) and C
// is rounded to bf16 (to nearest even) after the sum.
struct Matmul {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool trans_a = false, trans_b = false;
  const float* a = nullptr;
  const float* b = nullptr;
  const float* d = nullptr;
  float* c = nullptr;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // D has C's stride
  float alpha = 1.f, beta = 0.f;
  bool bf16 = false;
  // op(B) = op(A)^T (so C, D symmetric: X X^T, X^T X, or A A of a symmetric
  // A): an engine may compute one triangle and mirror it.
  bool symmetric = false;
};

class Engine {
 public:
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
  // Whether the last step (or the last step of passes) was skipped. CUDA: valid once the
  // stream has passed it; never waits.
  virtual bool last_step_skipped() const = 0;
  // The engine's per-parameter step counts (blocking, after `stream`).
  virtual void read_steps(int64_t* out, int64_t num_params, void* stream) = 0;
  virtual void write_steps(const int64_t* in, int64_t num_params, void* stream) = 0;

  // Opens a step that runs as several calls (steps with
  // StepControl::continue_step, passes that honour the skip flag): the skip
  // flag is set when check_nonfinite and a gradient given holds NaN or Inf,
  // else cleared. Only enqueues.
  virtual void begin_step(const GradView* grads, int64_t num_params, bool check_nonfinite, void* stream) = 0;

  // ---- matrix products (Muon's Newton-Schulz iterations)
  // Readies the products a step is about to run (their shapes, precision,
  // alpha and beta; the pointers are not read), or with none the BLAS alone
  // (registration). Throws what they would fail for (no kernel, no memory);
  // a step calls it before it writes anything, so that after it matmul of
  // these products does not fail. May allocate and wait.
  virtual void reserve_matmul(const Matmul* products, int64_t count) = 0;
  // Enqueues one batched product (after reserve_matmul). A product runs even
  // in a skipped step; what it writes is the caller's workspace.
  virtual void matmul(const Matmul& mm, void* stream) = 0;

  // ---- passes (core/pass.hpp): the operations of the algorithms above the
  // fused step (distributed/).
  // Where each parameter sits in the flat fp32 buffers of passes (offsets[i])
  // and its element mask (masks[i]: engine memory, numel bytes, 0: masked;
  // or nullptr). After bind(); may wait for the device.
  virtual void bind_flat(const int64_t* offsets, const uint8_t* const* masks, int64_t num_params) = 0;
  // Runs one pass over every bound parameter (its step's skip decision,
  // scalars and step counts as PassStep says). Only enqueues.
  virtual void run_pass(const Pass& pass, void* stream) = 0;
};

// Runs `rule` on every bound parameter of the engine (Engine::run_pass of a
// RulePass). Defined in core/cpu_pass.hpp; each family of rules instantiates it
// in a file built with cpu_engine.cpp's flags (distributed/run_pass.cpp,
// muon/run_pass.cpp), the CUDA side of the same rules being their passes.cu.
template <class Rule>
void run_pass(Engine& engine, const Rule& rule, const PassStep& step, void* stream);

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
