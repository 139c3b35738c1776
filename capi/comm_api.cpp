// The C boundary of the compressed communicator (capi/lowbit_comm.h).
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "boundary.hpp"
#include "comm/communicator.hpp"
#include "comm/transport.hpp"
#include "comm_handle.hpp"
#include "distributed/onebit_optimizer.hpp"
#include "lowbit_comm.h"
#include "struct_abi.hpp"

struct lowbit_comm {
  std::unique_ptr<lowbit::Communicator> impl;
  std::string last_error;
};

namespace lowbit {

Communicator& communicator_from_handle(lowbit_comm_t comm) {
  LOWBIT_REQUIRE(comm != nullptr, LOWBIT_ERROR_NULL_POINTER, "comm is NULL");
  return *comm->impl;
}

namespace {

lowbit_comm_config_t default_comm_config() {
  lowbit_comm_config_t c{};
  c.struct_size = sizeof c;
  c.cuda_aware_mpi = LOWBIT_COMM_CUDA_AWARE_AUTO;
  return c;
}

lowbit_comm_transport_t default_transport() {
  lowbit_comm_transport_t t{};
  t.struct_size = sizeof t;
  t.world_size = 1;
  t.host_buffers = 1;
  t.device_index = -1;
  return t;
}

// The caller's config (NULL: the defaults) as a current one. A timeout is
// checked here only where the backend has none (`backend` NCCL or
// callbacks: it must be 0); MPI agrees on it over the ranks at creation.
lowbit_comm_config_t resolve_config(const lowbit_comm_config_t* config, lowbit_comm_backend_t backend) {
  const lowbit_comm_config_t c = config ? abi::read_struct(config, default_comm_config(), "config")
                                        : default_comm_config();
  LOWBIT_REQUIRE(c.cuda_aware_mpi >= -1 && c.cuda_aware_mpi <= 1, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "config.cuda_aware_mpi is ", c.cuda_aware_mpi, " (expected -1 auto, 0 never, 1 always)");
  if (backend != LOWBIT_COMM_BACKEND_MPI) check_no_timeout(c.timeout_ms, backend);
  // MPI: checked in the agreement of the creation (a bad value on one rank
  // fails every rank); the others here.
  if (backend != LOWBIT_COMM_BACKEND_MPI) Communicator::check_error_format(c.error_format);
  LOWBIT_REQUIRE(backend != LOWBIT_COMM_BACKEND_NCCL || c.error_format == LOWBIT_COMM_ERROR_FP32,
                 LOWBIT_ERROR_UNSUPPORTED, "config.error_format is ", c.error_format,
                 ": NCCL communicators (CUDA tensors) keep their errors in fp32 only (LOWBIT_COMM_ERROR_FP32)");
  return c;
}

// `mpi_timeout_ms`: an MPI communicator, whose ranks then agree on its
// timeout (collective, like the creation itself; LOWBIT_COMM_TIMEOUT_MS
// overrides the config's).
lowbit_status_t create(lowbit_comm_t* out, const std::function<std::unique_ptr<Transport>()>& make,
                       const int64_t* mpi_timeout_ms = nullptr, const int32_t* error_format = nullptr) {
  if (out) *out = nullptr;
  return guarded(nullptr, [&] {
    LOWBIT_REQUIRE_PTR(out, "out");
    auto h = std::make_unique<lowbit_comm>();
    h->impl = std::make_unique<Communicator>(make());
    if (mpi_timeout_ms) h->impl->set_timeout_from(*mpi_timeout_ms);
    if (error_format && mpi_timeout_ms)
      h->impl->agree_error_format(*error_format);
    else if (error_format)
      h->impl->set_error_format(*error_format);
    *out = h.release();
  });
}

template <class Body>
lowbit_status_t on_comm(lowbit_comm_t comm, Body&& body) noexcept {
  return on_handle(comm, "comm", std::forward<Body>(body));
}

}  // namespace
}  // namespace lowbit

using lowbit::Communicator;
using lowbit::guarded;

extern "C" {

LOWBIT_DEFINE_STRUCT_INIT(lowbit_comm_config_t, lowbit_comm_config_init, 200, "config", lowbit::default_comm_config())
LOWBIT_DEFINE_STRUCT_INIT(lowbit_comm_info_t, lowbit_comm_info_init, 400, "info", lowbit_comm_info_t{})
LOWBIT_DEFINE_STRUCT_INIT(lowbit_comm_stats_t, lowbit_comm_stats_init, 400, "stats", lowbit_comm_stats_t{})
LOWBIT_DEFINE_STRUCT_INIT(lowbit_comm_transport_t, lowbit_comm_transport_init, 400, "transport",
                          lowbit::default_transport())

LOWBIT_API lowbit_status_t lowbit_comm_create_mpi(lowbit_comm_t* out, const void* mpi_comm,
                                                  const lowbit_comm_config_t* config) {
  int64_t timeout_ms = 0;
  int32_t error_format = 0;
  return lowbit::create(out, [&] {
    const lowbit_comm_config_t c = lowbit::resolve_config(config, LOWBIT_COMM_BACKEND_MPI);
    timeout_ms = c.timeout_ms;
    error_format = c.error_format;
    return lowbit::make_mpi_transport(mpi_comm, c.cuda_aware_mpi);
  }, &timeout_ms, &error_format);
}

LOWBIT_API lowbit_status_t lowbit_comm_create_mpi_fortran(lowbit_comm_t* out, int64_t mpi_fortran_comm,
                                                          const lowbit_comm_config_t* config) {
  int64_t timeout_ms = 0;
  int32_t error_format = 0;
  return lowbit::create(out, [&] {
    const lowbit_comm_config_t c = lowbit::resolve_config(config, LOWBIT_COMM_BACKEND_MPI);
    timeout_ms = c.timeout_ms;
    error_format = c.error_format;
    return lowbit::make_mpi_transport_fortran(mpi_fortran_comm, c.cuda_aware_mpi);
  }, &timeout_ms, &error_format);
}

LOWBIT_API lowbit_status_t lowbit_comm_nccl_unique_id(void* out_id, int64_t capacity) {
  return guarded(nullptr, [&] {
    LOWBIT_REQUIRE_PTR(out_id, "out_id");
    LOWBIT_REQUIRE(capacity >= LOWBIT_NCCL_UNIQUE_ID_BYTES, LOWBIT_ERROR_BUFFER_TOO_SMALL, "capacity is ", capacity,
                   " (an ncclUniqueId needs ", LOWBIT_NCCL_UNIQUE_ID_BYTES, " bytes)");
    lowbit::nccl_unique_id(out_id);
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_create_nccl(lowbit_comm_t* out, const void* unique_id, int32_t rank,
                                                   int32_t world, int32_t device_index,
                                                   const lowbit_comm_config_t* config) {
  return lowbit::create(out, [&] {
    lowbit::resolve_config(config, LOWBIT_COMM_BACKEND_NCCL);
    return lowbit::make_nccl_transport(unique_id, rank, world, device_index);
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_create_nccl_comm(lowbit_comm_t* out, void* nccl_comm,
                                                        const lowbit_comm_config_t* config) {
  return lowbit::create(out, [&] {
    lowbit::resolve_config(config, LOWBIT_COMM_BACKEND_NCCL);
    return lowbit::make_nccl_transport_from_comm(nccl_comm);
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_destroy(lowbit_comm_t comm) {
  if (!comm) return LOWBIT_SUCCESS;
  // From inside one of its own transport functions, a call on this
  // communicator is still running further up the stack: freeing it would
  // pull the communicator from under that call.
  const lowbit_status_t st = lowbit::on_comm(comm, [&](Communicator& c) {
    LOWBIT_REQUIRE(!c.in_transport_callback(), LOWBIT_ERROR_INVALID_STATE,
                   "comm: lowbit_comm_destroy was called from inside one of this communicator's own transport "
                   "functions, while a call on it is still running; destroy it after that call has returned");
  });
  if (st != LOWBIT_SUCCESS) return st;
  return guarded(nullptr, [&] { delete comm; });
}

LOWBIT_API const char* lowbit_comm_last_error(lowbit_comm_t comm) { return lowbit::last_error_of(comm); }

LOWBIT_API lowbit_status_t lowbit_comm_rank(lowbit_comm_t comm, int32_t* out) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    LOWBIT_REQUIRE_PTR(out, "out");
    *out = c.rank();
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_world_size(lowbit_comm_t comm, int32_t* out) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    LOWBIT_REQUIRE_PTR(out, "out");
    *out = c.world();
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_get_info(lowbit_comm_t comm, lowbit_comm_info_t* out) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    lowbit::abi::write_struct(out, c.info(), "out");
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_compressed_allreduce(lowbit_comm_t comm, const lowbit_tensor_t* tensor,
                                                            void* stream) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    if (!c.compressed_allreduce(tensor, stream, lowbit::distributed::direct_caller()))
      lowbit::fail(LOWBIT_ERROR_NONFINITE, c.nonfinite_message());
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_compressed_reduce_scatter(lowbit_comm_t comm, const lowbit_tensor_t* tensor,
                                                                 const lowbit_tensor_t* out, void* stream) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    if (!c.compressed_reduce_scatter(tensor, out, stream, lowbit::distributed::direct_caller()))
      lowbit::fail(LOWBIT_ERROR_NONFINITE, c.nonfinite_message());
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_reduce_scatter_chunk(lowbit_comm_t comm, int64_t numel, int64_t* out_offset,
                                                            int64_t* out_numel) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    LOWBIT_REQUIRE(out_offset || out_numel, LOWBIT_ERROR_NULL_POINTER, "out_offset and out_numel are both NULL");
    int64_t offset = 0, count = 0;
    c.reduce_scatter_chunk(numel, &offset, &count);
    if (out_offset) *out_offset = offset;
    if (out_numel) *out_numel = count;
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_allreduce_mean(lowbit_comm_t comm, const lowbit_tensor_t* tensor,
                                                      void* stream) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    c.allreduce_mean(tensor, stream, lowbit::distributed::direct_caller());
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_last_nonfinite(lowbit_comm_t comm, int32_t* out) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    LOWBIT_REQUIRE_PTR(out, "out");
    *out = c.last_nonfinite() ? 1 : 0;
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_error_numel(lowbit_comm_t comm, int64_t* out_worker_numel,
                                                   int64_t* out_server_numel) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    LOWBIT_REQUIRE(out_worker_numel || out_server_numel, LOWBIT_ERROR_NULL_POINTER,
                   "out_worker_numel and out_server_numel are both NULL");
    if (out_worker_numel) *out_worker_numel = c.worker_error_numel();
    if (out_server_numel) *out_server_numel = c.server_error_numel();
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_read_errors(lowbit_comm_t comm, float* worker, int64_t worker_numel,
                                                   float* server, int64_t server_numel, void* stream) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    c.read_errors(worker, worker_numel, server, server_numel, stream);
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_save_errors(lowbit_comm_t comm, void* buffer, int64_t capacity,
                                                   int64_t* out_size, void* stream) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    LOWBIT_REQUIRE_PTR(out_size, "out_size");
    const int64_t size = c.error_blob_bytes();
    if (!buffer) {
      *out_size = size;
      return;
    }
    LOWBIT_REQUIRE(capacity >= size, LOWBIT_ERROR_BUFFER_TOO_SMALL, "capacity is ", capacity,
                   " bytes, the errors need ", size);
    const std::vector<uint8_t> blob = c.save_errors(stream);
    std::memcpy(buffer, blob.data(), blob.size());
    *out_size = int64_t(blob.size());
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_load_errors(lowbit_comm_t comm, const void* buffer, int64_t size,
                                                   void* stream) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    c.load_errors(static_cast<const uint8_t*>(buffer), size, stream);
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_reset_errors(lowbit_comm_t comm, void* stream) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    c.reset_errors(stream);
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_get_stats(lowbit_comm_t comm, lowbit_comm_stats_t* out) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    lowbit::abi::write_struct(out, c.stats(), "out");
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_reset_stats(lowbit_comm_t comm) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    c.reset_stats();
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_create_transport(lowbit_comm_t* out, const lowbit_comm_transport_t* transport,
                                                        const lowbit_comm_config_t* config) {
  int32_t error_format = 0;
  return lowbit::create(out, [&] {
    error_format = lowbit::resolve_config(config, LOWBIT_COMM_BACKEND_CALLBACKS).error_format;
    LOWBIT_REQUIRE_PTR(transport, "transport");
    const lowbit_comm_transport_t t = lowbit::abi::read_struct(transport, lowbit::default_transport(), "transport");
    return lowbit::make_callback_transport(&t);
  }, nullptr, &error_format);
}

LOWBIT_API lowbit_status_t lowbit_comm_stage_message_bytes(lowbit_comm_t comm, int64_t numel,
                                                           int64_t* out_message_bytes) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    LOWBIT_REQUIRE_PTR(out_message_bytes, "out_message_bytes");
    *out_message_bytes = c.stage_message_bytes(numel);
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_stage_compress(lowbit_comm_t comm, const lowbit_tensor_t* tensor, void* send,
                                                      int64_t send_bytes, void* stream) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    c.stage_compress(tensor, send, send_bytes, stream);
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_stage_reduce(lowbit_comm_t comm, const void* recv, int64_t recv_bytes,
                                                    void* gsend, int64_t gsend_bytes, void* stream) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    c.stage_reduce(recv, recv_bytes, gsend, gsend_bytes, stream);
  });
}

LOWBIT_API lowbit_status_t lowbit_comm_stage_decode(lowbit_comm_t comm, const void* grecv, int64_t grecv_bytes,
                                                    const lowbit_tensor_t* out, void* stream) {
  return lowbit::on_comm(comm, [&](Communicator& c) {
    if (!c.stage_decode(grecv, grecv_bytes, out, stream)) lowbit::fail(LOWBIT_ERROR_NONFINITE, c.nonfinite_message());
  });
}

}  // extern "C"
