// The byte-moving layer under a Communicator: MPI (host or CUDA-aware/staged
// device buffers) or NCCL (device buffers, stream-ordered).
#pragma once
#include <cstdint>
#include <memory>

#include "lowbit_comm.h"

namespace lowbit {

// Throws LOWBIT_ERROR_UNSUPPORTED (naming config.timeout_ms and why) unless
// ms is 0: for the transports without a host-side timeout (NCCL, callbacks).
void check_no_timeout(int64_t ms, lowbit_comm_backend_t backend);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual lowbit_comm_backend_t backend() const = 0;
  virtual int32_t rank() const = 0;
  virtual int32_t world() const = 0;

  // Host buffers can be exchanged (MPI).
  virtual bool supports_host() const = 0;
  // Device buffers can be exchanged directly (CUDA-aware MPI, NCCL); when
  // false, device data must be staged through host memory.
  virtual bool device_direct() const = 0;
  // Exchanges are ordered on the stream (NCCL); when false they run on the
  // host, and device data must be ready before the call (MPI).
  virtual bool stream_ordered() const = 0;
  // NCCL: the CUDA device of this rank; MPI: -1 (any).
  virtual int32_t device_index() const { return -1; }

  // Host-side argument agreement: replaces v[0..k) by the maximum over ranks.
  // Returns false when the transport has none (NCCL).
  virtual bool agree_max(int64_t* v, int k) = 0;
  // m host bytes from rank `root` to every rank (MPI only: after a
  // successful agree_max).
  virtual void broadcast(void* data, int64_t m, int root) = 0;

  // The host-side timeout of every exchange in ms (MPI: config.timeout_ms
  // or LOWBIT_COMM_TIMEOUT_MS), 0: none. Under a timeout, exchanges must use
  // buffers the communicator owns: one that timed out stays pending in MPI
  // and may still write them. set_timeout is local: the caller agrees on it
  // with the other ranks first (a nonblocking collective never matches a
  // blocking one, so every rank must wait the same way).
  virtual int64_t timeout_ms() const { return 0; }
  virtual void set_timeout_ms(int64_t ms) { check_no_timeout(ms, backend()); }
  // True while one of the caller's transport functions runs (callbacks):
  // the communicator is in the middle of a call and must not be destroyed.
  virtual bool in_callback() const { return false; }
  // True once an exchange has timed out: every later exchange throws, and
  // the buffers it used (and the MPI communicator) must never be released.
  virtual bool broken() const { return false; }

  // Every rank sends bytes [r*m, (r+1)*m) of send to rank r and receives
  // rank r's message at recv + r*m.
  virtual void alltoall(const void* send, void* recv, int64_t m, void* stream) = 0;
  // Every rank's m bytes, in rank order, into recv (world * m bytes).
  virtual void allgather(const void* send, void* recv, int64_t m, void* stream) = 0;
  // In place. Returns true if the result is already divided by world (NCCL
  // ncclAvg), false if it is the sum.
  virtual bool allreduce_f32(float* data, int64_t n, void* stream) = 0;
};

// MPI (mpi_transport.cpp); throws LOWBIT_ERROR_UNSUPPORTED when built without MPI.
std::unique_ptr<Transport> make_mpi_transport(const void* mpi_comm, int32_t cuda_aware);
std::unique_ptr<Transport> make_mpi_transport_fortran(int64_t fortran_comm, int32_t cuda_aware);

// NCCL (nccl_transport.cpp); throws LOWBIT_ERROR_UNSUPPORTED when built
// without NCCL or when libnccl cannot be loaded.
void nccl_unique_id(void* out128);
std::unique_ptr<Transport> make_nccl_transport(const void* unique_id, int32_t rank, int32_t world,
                                               int32_t device_index);
std::unique_ptr<Transport> make_nccl_transport_from_comm(void* nccl_comm);

// The caller's functions (callback_transport.cpp); validates the fields of
// a current-size struct (the C boundary reads the caller's, of any released
// size, into one).
std::unique_ptr<Transport> make_callback_transport(const lowbit_comm_transport_t* transport);

}  // namespace lowbit
