// The byte-moving layer under a Communicator: MPI (host or CUDA-aware/staged
// device buffers) or NCCL (device buffers, stream-ordered).
#pragma once
#include <cstdint>
#include <memory>

#include "lowbit_comm.h"

namespace lowbit {

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

// The caller's functions (callback_transport.cpp); validates the struct.
std::unique_ptr<Transport> make_callback_transport(const lowbit_comm_transport_t* transport);

}  // namespace lowbit
