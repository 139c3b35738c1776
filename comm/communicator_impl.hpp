// Communicator::Impl: the state behind a Communicator, shared by the files
// that implement it:
//   communicator.cpp          construction, queries, info and stats
//   arguments.cpp             argument checks and their agreement over ranks
//   binding.cpp               binding of the error buffers and workspaces
//   compressed_allreduce.cpp  the host and device pipelines of the 1-bit allreduce
//   compressed_reduce_scatter.cpp  its reduce-scatter half (host tensors)
//   allreduce_mean.cpp        the uncompressed mean
//   error_blob.cpp            error save / load / reset / read
//   stages.cpp                the phases of one compressed allreduce, and the codec
//                             stages over them (the caller moves the bytes)
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "communicator.hpp"
#include "layout.hpp"
#include "memory.hpp"
#include "transport.hpp"

namespace lowbit {

// A checked tensor argument.
struct CommArg {
  float* data = nullptr;
  int64_t n = 0;
  lowbit_device_t device = LOWBIT_DEVICE_CPU;
  int32_t index = 0;
};

// The collective operations, as they enter the argument agreement.
enum CommOp : int32_t {
  kOpNone = 0,
  kOpCompressedAllreduce = 1,
  kOpAllreduceMean = 2,
  kOpSetTimeout = 3,
  kOpAgreeOnly = 4,  // a step with no exchange agrees with the others (agree_only)
  kOpCompressedReduceScatter = 5,
  kOpSetErrorFormat = 6  // the error-format agreement of lowbit_comm_create_mpi* (n: the format)
};

struct Communicator::Impl {
  std::unique_ptr<Transport> t;
  onebit::Buffers buf;
  bool bound = false;  // buf holds the live errors
  int32_t error_format = LOWBIT_COMM_ERROR_FP32;  // lowbit_comm_error_format_t
  // BF16 / INT8: buf.err and buf.serr hold the errors in that format (not
  // lazy, no workspaces), pending_raw a loaded worker then server error.
  bool compact() const { return error_format != LOWBIT_COMM_ERROR_FP32; }
  std::vector<uint8_t> pending_raw;
  bool has_pending = false;
  int64_t pending_n = 0;
  std::vector<float> pending_worker, pending_server;
  onebit::Mem mean_stage;
  std::vector<float> host_stage;  // allreduce_mean of host tensors under a timeout
  bool last_nonfinite = false;
  bool last_was_device = false;
  std::string nonfinite_message;
  lowbit_comm_stats_t stats{};
  // Where a sequence of codec stages stands; anything that rebinds or
  // replaces the errors (prepare, load, reset) abandons it.
  enum class Stage { Idle, Compressed, Reduced } stage = Stage::Idle;
  CommArg stage_arg;  // the compress stage's tensor

  int32_t world() const { return t->world(); }
  int32_t rank() const { return t->rank(); }

  // arguments.cpp
  CommArg check_tensor(const lowbit_tensor_t* tensor) const;
  // The argument agreement (MPI): every rank learns whether some rank failed
  // its local checks (then every rank throws: its own error, or one naming
  // the lowest failed rank and quoting its message) and whether the ranks
  // run the same collective (op, caller, its stage and stage boundary, numel,
  // dtype; otherwise every rank throws). Returns the lowest rank whose input
  // was not finite, or -1. Over NCCL only a local failure is thrown.
  // (For kOpSetTimeout, n is the timeout.)
  // The agreement of a timeout, then the change (status: a local failure).
  void set_timeout(int64_t ms, lowbit_status_t status, const std::string& message);
  int agree(lowbit_status_t status, const std::string& message, CommOp op, int64_t n, lowbit_dtype_t dtype,
            const CollectiveCaller& who, bool nonfinite);

  // binding.cpp
  // Checks that `a` fits the binding and allocates what it needs; changes no
  // observable state (errors, pending errors, binding).
  void prepare(const CommArg& a, void* stream);
  // Binds: the errors become the pending ones, or zero. After prepare(a).
  void activate(const CommArg& a, void* stream);
  int64_t error_numel() const { return bound ? buf.n : (has_pending ? pending_n : 0); }
  // Host tensors, after prepare(a): the worker's one pass over the tensor and
  // the errors the call will use (bound, pending or zero): x into buf.ws_err,
  // the sign bits into the W messages at `send`; returns the sum of x^2.
  double host_worker_pass(const CommArg& a, uint8_t* send);
  // The live (or pending) errors into host or device memory (nullptr: skipped).
  void copy_errors_out(float* worker, float* server, void* stream) const;

  // The three phases of one compressed allreduce on the bound buffers and the
  // given messages (stages.cpp), shared by compressed_allreduce and the codec
  // stages. worker_phase: `sumsq` is what host_worker_pass returned for
  // `send` (host tensors: the bits are packed, the phase writes the scales;
  // unused on CUDA). finish_phase counts the call,
  // decodes into `out` and commits both errors; false (host tensors, nothing
  // changed) when a gathered scale is not finite, with `nonfinite` as the
  // reason.
  void worker_phase(const CommArg& a, double sumsq, uint8_t* send, void* stream);
  void server_phase(const CommArg& a, const uint8_t* recv, uint8_t* gsend, void* stream);
  bool finish_phase(const CommArg& a, const uint8_t* grecv, float* out, const char* nonfinite, void* stream);

  // compressed_allreduce.cpp
  // One exchange of the device pipeline (alltoall, or allgather if `gather`),
  // stream-ordered, device-direct, or staged through hsend / hrecv.
  void exchange(bool gather, const uint8_t* dsend, uint8_t* drecv, uint8_t* hsend, uint8_t* hrecv, void* stream);
};

// "LOWBIT_DEVICE_CPU", "LOWBIT_DEVICE_CUDA" or "an unknown device".
const char* comm_device_name(lowbit_device_t d);

// The descriptor of an fp32 tensor.
inline lowbit_tensor_t comm_tensor(float* data, int64_t n, lowbit_device_t device, int32_t device_index) {
  lowbit_tensor_t t{};
  t.data = data;
  t.numel = n;
  t.dtype = LOWBIT_DTYPE_FLOAT32;
  t.device = device;
  t.device_index = device_index;
  return t;
}

}  // namespace lowbit
