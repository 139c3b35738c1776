// Communicator: construction, identity, info and statistics. The work is in
// the files listed in communicator_impl.hpp.
#include "communicator.hpp"

#include "communicator_impl.hpp"

namespace lowbit {

Communicator::Communicator(std::unique_ptr<Transport> transport) : impl_(std::make_unique<Impl>()) {
  impl_->t = std::move(transport);
  impl_->stats.struct_size = sizeof(lowbit_comm_stats_t);
}

Communicator::~Communicator() {
  // After a timeout an MPI operation is still pending on the transport's
  // communicator and on our buffers (it may complete if the missing rank
  // shows up): neither may be released, so the whole state is left behind.
  if (impl_ && impl_->t && impl_->t->broken()) (void)impl_.release();
}

int32_t Communicator::rank() const { return impl_->rank(); }
int32_t Communicator::world() const { return impl_->world(); }
lowbit_comm_backend_t Communicator::backend() const { return impl_->t->backend(); }
bool Communicator::in_transport_callback() const { return impl_->t->in_callback(); }

lowbit_comm_info_t Communicator::info() const {
  const Impl& I = *impl_;
  lowbit_comm_info_t out{};
  out.struct_size = sizeof(out);
  out.backend = backend();
  out.rank = rank();
  out.world_size = world();
  out.cuda_aware_mpi = (I.t->backend() == LOWBIT_COMM_BACKEND_MPI && I.t->device_direct()) ? 1 : 0;
  out.device_index = I.t->device_index();
  out.timeout_ms = I.t->timeout_ms();
  if (I.bound) {
    out.bound_numel = I.buf.n;
    out.bound_device = I.buf.device;
    out.padded_numel = I.buf.layout.padded;
    out.chunk_numel = I.buf.layout.chunk;
  } else {
    out.bound_device = LOWBIT_DEVICE_CPU;
  }
  return out;
}

lowbit_comm_stats_t Communicator::stats() const { return impl_->stats; }

void Communicator::reset_stats() {
  impl_->stats = lowbit_comm_stats_t{};
  impl_->stats.struct_size = sizeof(lowbit_comm_stats_t);
}

}  // namespace lowbit
