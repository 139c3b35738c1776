// Binding: the error buffers and workspaces of one (numel, device), their
// allocation, initial contents (loaded or zero) and read-back.
#include <cstring>
#include <optional>
#include <utility>

#include "communicator_impl.hpp"
#include "core/error.hpp"
#include "error_format.hpp"
#include "host_kernels.hpp"
#ifdef LOWBIT_HAVE_CUDA
#include "cuda/runtime.hpp"
#include "device.hpp"
#endif

namespace lowbit {

using onebit::Buffers;
using onebit::Layout;
using onebit::Mem;
using onebit::MemKind;

void Communicator::Impl::prepare(const CommArg& a, void* stream) {
  (void)stream;
  stage = Stage::Idle;
  if (bound) {
    LOWBIT_REQUIRE(a.n == buf.n, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.numel is ", a.n,
                   ", but this communicator's error buffers are bound to numel ", buf.n,
                   " (lowbit_comm_reset_errors unbinds them)");
    LOWBIT_REQUIRE(a.device == buf.device && (a.device == LOWBIT_DEVICE_CPU || a.index == buf.device_index),
                   LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.device is ", comm_device_name(a.device), ":", a.index,
                   ", but this communicator's error buffers live on ", comm_device_name(buf.device), ":",
                   buf.device_index, " (lowbit_comm_reset_errors unbinds them)");
    return;
  }
  LOWBIT_REQUIRE(!has_pending || pending_n == a.n, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.numel is ", a.n,
                 ", but the error state loaded into this communicator is for numel ", pending_n);
  const bool cuda = a.device == LOWBIT_DEVICE_CUDA;
#ifdef LOWBIT_HAVE_CUDA
  std::optional<cuda::DeviceGuard> guard;
  if (cuda) guard.emplace(a.index);
#endif
  if (buf.valid && buf.n == a.n && buf.device == a.device && buf.device_index == a.index) return;
  Buffers b;
  b.n = a.n;
  b.device = a.device;
  b.device_index = a.index;
  b.layout = Layout::make(a.n, world(), rank());
  const Layout& L = b.layout;
  const MemKind k = cuda ? MemKind::Device : MemKind::Host;
  const size_t c = size_t(L.server_numel() > 0 ? L.server_numel() : 1);
  const size_t all = size_t(L.world) * size_t(L.msg);
  // Release the previous set first (no two full sets alive at once).
  buf = Buffers();
  if (compact()) {  // host only: the errors in their format, updated in place (no workspaces)
    b.err = Mem(k, size_t(onebit::error_bytes(error_format, a.n)));
    b.serr = Mem(k, size_t(onebit::error_bytes(error_format, int64_t(c))));
  } else {
    b.err = Mem(k, size_t(a.n) * 4);
    b.ws_err = Mem(k, size_t(a.n) * 4);
    b.serr = Mem(k, c * 4);
    b.ws_serr = Mem(k, c * 4);
  }
  b.send = Mem(k, all);
  b.recv = Mem(k, all);
  b.gsend = Mem(k, size_t(L.msg));
  b.grecv = Mem(k, all);
#ifdef LOWBIT_HAVE_CUDA
  if (cuda) {
    b.partials = Mem(MemKind::Device, sizeof(double) * size_t(onebit::dev::partials_count(a.n)));
    b.scal = Mem(MemKind::Device, 4 * sizeof(float));
    b.flag = Mem(MemKind::Device, sizeof(int32_t));
    b.host_flag = Mem(MemKind::Mapped, sizeof(int32_t));
    *b.host_flag.as<volatile int32_t>() = 0;
    onebit::dev::zero_async(b.flag.as(), sizeof(int32_t), stream);
    if (!t->stream_ordered() && !t->device_direct()) {
      b.hsend = Mem(MemKind::Pinned, all);
      b.hrecv = Mem(MemKind::Pinned, all);
      b.hgsend = Mem(MemKind::Pinned, size_t(L.msg));
      b.hgrecv = Mem(MemKind::Pinned, all);
    }
  }
#endif
  b.valid = true;
  buf = std::move(b);
}

void Communicator::Impl::activate(const CommArg& a, void* stream) {
  (void)stream;
  if (bound) return;
  const bool cuda = a.device == LOWBIT_DEVICE_CUDA;
  const size_t wbytes = size_t(a.n) * 4;
  const size_t sbytes = size_t(buf.layout.server_numel()) * 4;
  if (!cuda && compact()) {
    buf.lazy = false;
    const size_t wb = size_t(onebit::error_bytes(error_format, a.n));
    if (has_pending) {
      std::memcpy(buf.err.as(), pending_raw.data(), wb);
      if (pending_raw.size() > wb) std::memcpy(buf.serr.as(), pending_raw.data() + wb, pending_raw.size() - wb);
    } else {
      std::memset(buf.err.as(), 0, buf.err.bytes());
      std::memset(buf.serr.as(), 0, buf.serr.bytes());
    }
  } else if (!cuda) {
    buf.lazy = false;
    if (has_pending) {
      std::memcpy(buf.err.as(), pending_worker.data(), wbytes);
      if (sbytes) std::memcpy(buf.serr.as(), pending_server.data(), sbytes);
    } else {
      std::memset(buf.err.as(), 0, wbytes);
      std::memset(buf.serr.as(), 0, buf.serr.bytes());
    }
  } else {
#ifdef LOWBIT_HAVE_CUDA
    cuda::DeviceGuard guard(a.index);
    if (has_pending) {
      onebit::dev::copy_async(buf.err.as(), pending_worker.data(), wbytes, stream);
      onebit::dev::copy_async(buf.serr.as(), pending_server.data(), sbytes, stream);
      onebit::dev::sync(stream);
    } else {
      onebit::dev::zero_async(buf.err.as(), wbytes, stream);
      onebit::dev::zero_async(buf.serr.as(), buf.serr.bytes(), stream);
    }
#endif
  }
  bound = true;
  has_pending = false;
  pending_n = 0;
  std::vector<float>().swap(pending_worker);
  std::vector<float>().swap(pending_server);
  std::vector<uint8_t>().swap(pending_raw);
}

double Communicator::Impl::host_worker_pass(const CommArg& a, uint8_t* send) {
  if (compact()) {
    const uint8_t* e = bound ? buf.err.as<uint8_t>() : (has_pending ? pending_raw.data() : nullptr);
    return onebit::host_worker_sum_pack_compact(a.data, error_format, e, buf.layout, send);
  }
  onebit::ErrorsIn e;
  if (bound)
    e = {buf.err.as<float>(), buf.err_scale, buf.lazy};
  else if (has_pending)
    e = {pending_worker.data(), 0.0f, false};
  return onebit::host_worker_sum_pack(a.data, e, buf.layout, buf.ws_err.as<float>(), send);
}

void Communicator::Impl::copy_errors_out(float* worker, float* server, void* stream) const {
  (void)stream;
  if (compact()) {
    const int64_t n = error_numel();
    if (!n) return;
    const int64_t c = Layout::make(n, world(), rank()).server_numel();
    const uint8_t* w = bound ? buf.err.as<uint8_t>() : pending_raw.data();
    const uint8_t* z = bound ? buf.serr.as<uint8_t>() : pending_raw.data() + onebit::error_bytes(error_format, n);
    if (worker) onebit::host_errors_decode(error_format, w, n, worker);
    if (server && c) onebit::host_errors_decode(error_format, z, c, server);
    return;
  }
  if (bound) {
    const size_t wbytes = size_t(buf.n) * 4, sbytes = size_t(buf.layout.server_numel()) * 4;
    if (buf.device == LOWBIT_DEVICE_CPU && buf.lazy) {
      if (worker) onebit::host_errors_from(buf.err.as<float>(), buf.err_scale, buf.n, worker);
      if (server && sbytes) onebit::host_errors_from(buf.serr.as<float>(), buf.serr_scale, int64_t(sbytes / 4), server);
    } else if (buf.device == LOWBIT_DEVICE_CPU) {
      if (worker) std::memcpy(worker, buf.err.as(), wbytes);
      if (server && sbytes) std::memcpy(server, buf.serr.as(), sbytes);
    } else {
#ifdef LOWBIT_HAVE_CUDA
      cuda::DeviceGuard guard(buf.device_index);
      if (worker) onebit::dev::copy_async(worker, buf.err.as(), wbytes, stream);
      if (server) onebit::dev::copy_async(server, buf.serr.as(), sbytes, stream);
      onebit::dev::sync(stream);
#endif
    }
  } else if (has_pending) {
    if (worker) std::memcpy(worker, pending_worker.data(), pending_worker.size() * 4);
    if (server && !pending_server.empty()) std::memcpy(server, pending_server.data(), pending_server.size() * 4);
  }
}

}  // namespace lowbit
