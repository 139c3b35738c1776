// The communicator behind a lowbit_comm_t, for the layers above it (the
// distributed optimizers of distributed/, the C boundary capi/comm_api.cpp).
// The algorithm, its padding, sign and non-finite rules are specified in
// docs/COMMUNICATOR.md.
//
// Every method either succeeds or throws lowbit::Error having changed nothing
// (errors, output and binding as they were). Collective methods must be
// called by every rank of the group in the same order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lowbit_comm.h"

namespace lowbit {

class Transport;

// How a caller above the communicator names its collective calls in the
// messages of a failed argument agreement: its kinds, its stages and the
// fields it adds (the communicator names none of its own).
struct CallerNames {
  const char* (*kind)(int32_t kind);     // how a call of `kind` is named ("directly" for 0)
  const char* (*subject)(int32_t kind);  // what messages about its fields start with
  const char* (*stage)(int32_t stage);
  const char* boundary;                  // the name of CollectiveCaller::boundary
  const char* parts;                     // what CollectiveCaller::parts counts
};

// Who runs a collective. It joins the argument agreement of the MPI
// transport (with the operation, numel and dtype), so that ranks at
// different places of a training loop fail on every rank instead of
// deadlocking. Kind 0 is a direct call; the other fields belong to the
// caller (`names` says what they mean).
struct CollectiveCaller {
  int32_t kind = 0;
  int32_t stage = 0;         // the stage of the caller's schedule this call belongs to
  int64_t boundary = 0;      // what fixes when the caller's stages change
  int64_t parts = 0;         // how many tensors share the exchanged buffer
  int64_t step = -1;         // the caller's step count before this call; -1: not known exactly here
  const CallerNames* names = nullptr;  // nullptr: generic names
};

class Communicator {
 public:
  explicit Communicator(std::unique_ptr<Transport> transport);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int32_t rank() const;
  int32_t world() const;
  lowbit_comm_backend_t backend() const;

  // Collective, uncompressed: data (n fp32 on `device`) <- sum over ranks / world.
  void allreduce_mean(float* data, int64_t n, lowbit_device_t device, int32_t device_index, void* stream,
                      const CollectiveCaller& who = CollectiveCaller());

  // Collective: data (n fp32 on `device`) <- the 1-bit compressed average,
  // updating this rank's worker and server errors. Returns false when some
  // rank's input (data + worker error) was not finite: then nothing changed on
  // any rank. For CUDA data the check is on the device: the call returns true
  // once enqueued and device_nonfinite_flag() tells the outcome.
  bool compressed_allreduce(float* data, int64_t n, lowbit_device_t device, int32_t device_index, void* stream,
                            const CollectiveCaller& who = CollectiveCaller());

  // Collective: the reduce-scatter half of compressed_allreduce
  // (docs/COMMUNICATOR.md, section 2b). Every rank runs the worker rule on
  // `tensor` (n fp32, read only) with its worker error and sends message r
  // to rank r; `out` (reduce_scatter_chunk(n) elements of this rank's chunk,
  // fp32, may overlap tensor) gets the average of the W decoded messages.
  // The server error is neither read nor changed. Host tensors only. Returns
  // false when some rank's input (tensor + worker error) was not finite or
  // the received scales' sum overflowed: then nothing changed on any rank.
  bool compressed_reduce_scatter(const lowbit_tensor_t* tensor, const lowbit_tensor_t* out, void* stream,
                                 const CollectiveCaller& who = CollectiveCaller());
  // Local: this rank's chunk of a compressed reduce-scatter of n elements,
  // [offset, offset + count) (count 0 where the chunk is all padding).
  void reduce_scatter_chunk(int64_t n, int64_t* offset, int64_t* count) const;

  // Collective (MPI): every later exchange waits at most `ms` milliseconds
  // for the other ranks (0: forever); see docs/COMMUNICATOR.md, section 4. Agreed
  // like a call's arguments: a bad or differing value fails on every rank,
  // the timeout unchanged.
  void set_timeout(int64_t ms);
  // The same with the timeout of lowbit_comm_create_mpi*: the environment
  // variable LOWBIT_COMM_TIMEOUT_MS where it is set and not empty (it
  // overrides the config), else config_ms (lowbit_comm_config_t.timeout_ms).
  void set_timeout_from(int64_t config_ms);
  int64_t timeout_ms() const;

  // How the worker and server errors are kept (lowbit_comm_error_format_t;
  // docs/COMMUNICATOR.md, section 5b). check_error_format throws
  // LOWBIT_ERROR_INVALID_ARGUMENT for an unknown value. set_error_format is
  // local (before the first compressed call); agree_error_format is
  // collective (MPI creation): a bad value on one rank, or different values,
  // fail every rank, nothing changed. Every compressed collective agrees on
  // it again (with the dtype).
  static void check_error_format(int32_t format);
  void set_error_format(int32_t format);
  void agree_error_format(int32_t format);
  int32_t error_format() const;
  // True while one of a callback transport's functions runs: a call on this
  // communicator is in progress further up the stack, so it must not be
  // destroyed (lowbit_comm_destroy refuses).
  bool in_transport_callback() const;

  // For a caller whose own checks failed before it could start its
  // collective (a missing grad, differing step counts): joins
  // the argument agreement that the other ranks run at the start of theirs,
  // as a rank that rejected its arguments, so that every rank fails and none
  // waits. Always throws: Error(status, message) here; on the other ranks
  // their collective throws LOWBIT_ERROR_INVALID_ARGUMENT naming this rank
  // and quoting `message`. Over NCCL (no agreement) it only throws here.
  // Collective: only the argument agreement of `who` (a step on gradients
  // the caller averaged exchanges nothing else), so a
  // mismatch or a failing rank is still reported on every rank.
  void agree_only(const CollectiveCaller& who);

  [[noreturn]] void fail_collective(lowbit_status_t status, const std::string& message,
                                    const CollectiveCaller& who);

  // Device int32, 1 if the last CUDA compressed_allreduce found a non-finite
  // input (nothing changed), 0 if it was applied; written in stream order by
  // that call, so kernels enqueued after it can read it (an update on CUDA
  // skips on it). nullptr until the communicator is bound to a CUDA
  // buffer.
  const int32_t* device_nonfinite_flag() const;

  // Error buffers (local; the blob format is in docs/COMMUNICATOR.md).
  int64_t worker_error_numel() const;
  int64_t server_error_numel() const;
  std::vector<uint8_t> save_errors(void* stream) const;
  int64_t error_blob_bytes() const;  // the size of save_errors' blob
  void load_errors(const uint8_t* data, int64_t size, void* stream);
  // load_errors of a version-3 blob (compact errors), after its header's
  // first checks.
  void load_compact(const uint8_t* data, int64_t size, void* stream);
  void reset_errors(void* stream);

  // --- used by the C boundary
  // Tensor-descriptor forms (tensor may be nullptr: reported, and over MPI
  // still agreed on, so no rank is left waiting).
  void allreduce_mean(const lowbit_tensor_t* tensor, void* stream, const CollectiveCaller& who = CollectiveCaller());
  bool compressed_allreduce(const lowbit_tensor_t* tensor, void* stream,
                            const CollectiveCaller& who = CollectiveCaller());
  // Why the last compressed_allreduce returned false.
  const std::string& nonfinite_message() const;
  bool last_nonfinite() const;
  void read_errors(float* worker, int64_t worker_numel, float* server, int64_t server_numel, void* stream) const;
  lowbit_comm_info_t info() const;

  // The codec stages (stages.cpp; docs/COMMUNICATOR.md, section 7): local,
  // the caller moves the messages. stage_decode returns false when a
  // gathered scale was not finite (host tensors): nothing changed.
  int64_t stage_message_bytes(int64_t n) const;
  void stage_compress(const lowbit_tensor_t* tensor, void* send, int64_t send_bytes, void* stream);
  void stage_reduce(const void* recv, int64_t recv_bytes, void* gsend, int64_t gsend_bytes, void* stream);
  bool stage_decode(const void* grecv, int64_t grecv_bytes, const lowbit_tensor_t* out, void* stream);
  lowbit_comm_stats_t stats() const;
  void reset_stats();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace lowbit
