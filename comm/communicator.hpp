// The communicator behind a lowbit_comm_t, for the optimizer core (1-bit
// Adam) and the C boundary (capi/comm_api.cpp). The algorithm, its padding,
// sign and non-finite rules are specified in capi/lowbit_comm.h.
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
  void allreduce_mean(float* data, int64_t n, lowbit_device_t device, int32_t device_index, void* stream);

  // Collective: data (n fp32 on `device`) <- the 1-bit compressed average,
  // updating this rank's worker and server errors. Returns false when some
  // rank's input (data + worker error) was not finite: then nothing changed on
  // any rank. For CUDA data the check is on the device: the call returns true
  // once enqueued and device_nonfinite_flag() tells the outcome.
  bool compressed_allreduce(float* data, int64_t n, lowbit_device_t device, int32_t device_index, void* stream);

  // Device int32, 1 if the last CUDA compressed_allreduce found a non-finite
  // input (nothing changed), 0 if it was applied; written in stream order by
  // that call, so kernels enqueued after it can read it (1-bit Adam's update
  // on CUDA skips on it). nullptr until the communicator is bound to a CUDA
  // buffer.
  const int32_t* device_nonfinite_flag() const;

  // Error buffers (local; see lowbit_comm.h for the blob format).
  int64_t worker_error_numel() const;
  int64_t server_error_numel() const;
  std::vector<uint8_t> save_errors(void* stream) const;
  void load_errors(const uint8_t* data, int64_t size, void* stream);
  void reset_errors(void* stream);

  // --- used by the C boundary
  // Tensor-descriptor forms (tensor may be nullptr: reported, and over MPI
  // still agreed on, so no rank is left waiting).
  void allreduce_mean(const lowbit_tensor_t* tensor, void* stream);
  bool compressed_allreduce(const lowbit_tensor_t* tensor, void* stream);
  // Why the last compressed_allreduce returned false.
  const std::string& nonfinite_message() const;
  bool last_nonfinite() const;
  void read_errors(float* worker, int64_t worker_numel, float* server, int64_t server_numel, void* stream) const;
  lowbit_comm_info_t info() const;

  // The codec stages (stages.cpp; lowbit_comm.h, "any transport"): local,
  // the caller moves the messages. stage_decode returns false when a
  // gathered scale was not finite (host tensors): nothing changed.
  int64_t stage_message_bytes(int64_t n) const;
  void stage_compress(const lowbit_tensor_t* tensor, void* send, int64_t send_bytes, void* stream);
  void stage_reduce(const void* recv, int64_t recv_bytes, void* gsend, int64_t gsend_bytes, void* stream);
  bool stage_decode(const void* grecv, int64_t grecv_bytes, const lowbit_tensor_t* out, void* stream);
  lowbit_comm_stats_t stats() const;
  void reset_stats();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lowbit
