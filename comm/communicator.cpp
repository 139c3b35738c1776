// Communicator: argument checks and agreement, binding of the error buffers
// and workspaces, the host and device pipelines of the 1-bit compressed
// allreduce, the uncompressed mean, and error save/restore.
#include "communicator.hpp"

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.hpp"
#include "host_kernels.hpp"
#include "layout.hpp"
#include "transport.hpp"
#ifdef LOWBIT_COMM_WITH_CUDA
#include "device.hpp"
#endif

namespace lowbit {

using onebit::Layout;

namespace {

enum class MemKind { None, Host, Device, Pinned, Mapped };

// One owned allocation (host, device, pinned or mapped host memory).
class Mem {
 public:
  Mem() = default;
  Mem(MemKind kind, size_t bytes) : kind_(kind), bytes_(bytes) {
    switch (kind) {
      case MemKind::Host:
        p_ = std::calloc(bytes ? bytes : 1, 1);
        if (!p_) throw std::bad_alloc();
        break;
#ifdef LOWBIT_COMM_WITH_CUDA
      case MemKind::Device: p_ = onebit::dev::alloc(bytes); break;
      case MemKind::Pinned: p_ = onebit::dev::alloc_pinned(bytes); break;
      case MemKind::Mapped: p_ = onebit::dev::alloc_mapped(bytes, &alias_); break;
#endif
      default: fail(LOWBIT_ERROR_INTERNAL, "communicator: memory kind not built in");
    }
  }
  ~Mem() { reset(); }
  Mem(Mem&& o) noexcept { swap(o); }
  Mem& operator=(Mem&& o) noexcept {
    Mem(std::move(o)).swap(*this);
    return *this;
  }
  void swap(Mem& o) noexcept {
    std::swap(kind_, o.kind_);
    std::swap(p_, o.p_);
    std::swap(alias_, o.alias_);
    std::swap(bytes_, o.bytes_);
  }
  void reset() noexcept {
    switch (kind_) {
      case MemKind::Host: std::free(p_); break;
#ifdef LOWBIT_COMM_WITH_CUDA
      case MemKind::Device: onebit::dev::release(p_); break;
      case MemKind::Pinned:
      case MemKind::Mapped: onebit::dev::release_pinned(p_); break;
#endif
      default: break;
    }
    kind_ = MemKind::None;
    p_ = alias_ = nullptr;
    bytes_ = 0;
  }
  template <class T = void>
  T* as() const {
    return static_cast<T*>(p_);
  }
  template <class T = void>
  T* alias() const {
    return static_cast<T*>(alias_);
  }
  size_t bytes() const { return bytes_; }

 private:
  MemKind kind_ = MemKind::None;
  void* p_ = nullptr;
  void* alias_ = nullptr;
  size_t bytes_ = 0;
};

// Everything one binding (numel, device) needs, allocated together.
struct Buffers {
  bool valid = false;
  int64_t n = 0;
  lowbit_device_t device = LOWBIT_DEVICE_CPU;
  int32_t device_index = 0;
  Layout layout;
  Mem err, ws_err, serr, ws_serr;      // worker (n) and server (chunk) errors, double-buffered
  Mem send, recv, gsend, grecv;        // packed messages
  Mem partials, scal, flag, host_flag;  // device only
  Mem hsend, hrecv, hgsend, hgrecv;    // pinned staging (device data over non-CUDA-aware MPI)
};

struct Arg {
  float* data = nullptr;
  int64_t n = 0;
  lowbit_device_t device = LOWBIT_DEVICE_CPU;
  int32_t index = 0;
};

const char* device_name(lowbit_device_t d) {
  switch (d) {
    case LOWBIT_DEVICE_CPU: return "LOWBIT_DEVICE_CPU";
    case LOWBIT_DEVICE_CUDA: return "LOWBIT_DEVICE_CUDA";
    default: break;
  }
  return "an unknown device";
}

std::string dtype_name(lowbit_dtype_t d) {
  switch (d) {
    case LOWBIT_DTYPE_FLOAT32: return "LOWBIT_DTYPE_FLOAT32";
    case LOWBIT_DTYPE_BFLOAT16: return "LOWBIT_DTYPE_BFLOAT16";
    case LOWBIT_DTYPE_FLOAT16: return "LOWBIT_DTYPE_FLOAT16";
    default: break;
  }
  return concat(int(d), " (unknown)");
}

uint64_t fnv1a64(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

constexpr char kMagic[8] = {'L', 'B', 'C', 'O', 'M', 'M', 'E', 'R'};
constexpr uint32_t kBlobVersion = 1;
constexpr int64_t kHeaderBytes = 64;

template <class T>
void put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <class T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

struct Communicator::Impl {
  std::unique_ptr<Transport> t;
  Buffers buf;
  bool bound = false;  // buf holds the live errors
  bool has_pending = false;
  int64_t pending_n = 0;
  std::vector<float> pending_worker, pending_server;
  Mem mean_stage;
  bool last_nonfinite = false;
  bool last_was_device = false;
  std::string nonfinite_message;
  lowbit_comm_stats_t stats{};

  int32_t world() const { return t->world(); }
  int32_t rank() const { return t->rank(); }

  Arg check_tensor(const lowbit_tensor_t* tensor) const;
  int agree(lowbit_status_t status, const std::string& message, int64_t n, bool nonfinite);
  // Checks that `a` fits the binding and allocates what it needs; changes no
  // observable state (errors, pending errors, binding).
  void prepare(const Arg& a, void* stream);
  // Binds: the errors become the pending ones, or zero. After prepare(a).
  void activate(const Arg& a, void* stream);
  void exchange(bool gather, const uint8_t* dsend, uint8_t* drecv, uint8_t* hsend, uint8_t* hrecv, void* stream);
  int64_t error_numel() const { return bound ? buf.n : (has_pending ? pending_n : 0); }
  void copy_errors_out(float* worker, float* server, void* stream) const;
};

Arg Communicator::Impl::check_tensor(const lowbit_tensor_t* tensor) const {
  LOWBIT_REQUIRE(tensor != nullptr, LOWBIT_ERROR_NULL_POINTER, "tensor is NULL");
  LOWBIT_REQUIRE(tensor->data != nullptr, LOWBIT_ERROR_NULL_POINTER, "tensor.data is NULL");
  LOWBIT_REQUIRE(tensor->numel > 0, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.numel is ", tensor->numel,
                 " (must be > 0)");
  LOWBIT_REQUIRE(tensor->numel <= (INT64_MAX >> 8), LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.numel is ", tensor->numel,
                 " (too large)");
  LOWBIT_REQUIRE(tensor->dtype == LOWBIT_DTYPE_FLOAT32, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.dtype is ",
                 dtype_name(tensor->dtype), " (the communicator takes LOWBIT_DTYPE_FLOAT32 only)");
  LOWBIT_REQUIRE(reinterpret_cast<uintptr_t>(tensor->data) % alignof(float) == 0, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "tensor.data (", tensor->data, ") is not aligned to 4 bytes");
  Arg a;
  a.data = static_cast<float*>(tensor->data);
  a.n = tensor->numel;
  a.device = tensor->device;
  a.index = tensor->device_index;
  if (tensor->device == LOWBIT_DEVICE_CPU) {
    LOWBIT_REQUIRE(t->supports_host(), LOWBIT_ERROR_UNSUPPORTED,
                   "tensor.device is LOWBIT_DEVICE_CPU, but an NCCL communicator moves CUDA tensors only");
    a.index = 0;
  } else if (tensor->device == LOWBIT_DEVICE_CUDA) {
#ifdef LOWBIT_COMM_WITH_CUDA
    const int count = onebit::dev::device_count();
    LOWBIT_REQUIRE(count > 0, LOWBIT_ERROR_UNSUPPORTED,
                   "tensor.device is LOWBIT_DEVICE_CUDA, but no CUDA device is available to this process");
    LOWBIT_REQUIRE(a.index >= 0 && a.index < count, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.device_index is ",
                   a.index, " (this process sees ", count, " CUDA device(s))");
    LOWBIT_REQUIRE(t->device_index() < 0 || t->device_index() == a.index, LOWBIT_ERROR_INVALID_ARGUMENT,
                   "tensor.device_index is ", a.index, ", but this NCCL communicator runs on CUDA device ",
                   t->device_index());
    const std::string why = onebit::dev::check_device_pointer(a.data, a.index);
    LOWBIT_REQUIRE(why.empty(), LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.data ", why,
                   " (tensor.device is LOWBIT_DEVICE_CUDA)");
#else
    fail(LOWBIT_ERROR_UNSUPPORTED, "tensor.device is LOWBIT_DEVICE_CUDA, but this lowbit was built without CUDA");
#endif
  } else {
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.device is ", int(tensor->device),
         " (expected LOWBIT_DEVICE_CPU or LOWBIT_DEVICE_CUDA)");
  }
  return a;
}

// Over MPI, every rank learns every other rank's verdict on its arguments
// (32 bytes, MPI_MAX) before anything is exchanged or updated. Throws on
// every rank if some rank failed; returns the lowest rank whose input was
// not finite, or -1.
int Communicator::Impl::agree(lowbit_status_t status, const std::string& message, int64_t n, bool nonfinite) {
  const int32_t W = world(), R = rank();
  const bool failed = status != LOWBIT_SUCCESS;
  int64_t v[4] = {failed ? W - R : 0, (!failed && nonfinite) ? W - R : 0, failed ? INT64_MIN : n,
                  failed ? INT64_MIN : -n};
  const bool agreed = t->agree_max(v, 4);
  if (failed) throw Error(status, message);
  if (!agreed) return nonfinite ? R : -1;
  if (v[0] != 0)
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, "rank ", W - v[0],
         " rejected its arguments (its own error message says why); nothing was done on any rank");
  if (v[2] != -v[3])
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.numel is ", n, " here, but the ranks passed numel from ", -v[3],
         " to ", v[2], "; every rank must pass the same numel. Nothing was done on any rank");
  return v[1] != 0 ? int(W - v[1]) : -1;
}

void Communicator::Impl::prepare(const Arg& a, void* stream) {
  (void)stream;
  if (bound) {
    LOWBIT_REQUIRE(a.n == buf.n, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.numel is ", a.n,
                   ", but this communicator's error buffers are bound to numel ", buf.n,
                   " (lowbit_comm_reset_errors unbinds them)");
    LOWBIT_REQUIRE(a.device == buf.device && (a.device == LOWBIT_DEVICE_CPU || a.index == buf.device_index),
                   LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.device is ", device_name(a.device), ":", a.index,
                   ", but this communicator's error buffers live on ", device_name(buf.device), ":",
                   buf.device_index, " (lowbit_comm_reset_errors unbinds them)");
    return;
  }
  LOWBIT_REQUIRE(!has_pending || pending_n == a.n, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.numel is ", a.n,
                 ", but the error state loaded into this communicator is for numel ", pending_n);
  const bool cuda = a.device == LOWBIT_DEVICE_CUDA;
#ifdef LOWBIT_COMM_WITH_CUDA
  std::unique_ptr<onebit::dev::DeviceGuard> guard;
  if (cuda) guard = std::make_unique<onebit::dev::DeviceGuard>(a.index);
#endif
  if (!(buf.valid && buf.n == a.n && buf.device == a.device && buf.device_index == a.index)) {
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
    b.err = Mem(k, size_t(a.n) * 4);
    b.ws_err = Mem(k, size_t(a.n) * 4);
    b.serr = Mem(k, c * 4);
    b.ws_serr = Mem(k, c * 4);
    b.send = Mem(k, all);
    b.recv = Mem(k, all);
    b.gsend = Mem(k, size_t(L.msg));
    b.grecv = Mem(k, all);
#ifdef LOWBIT_COMM_WITH_CUDA
    if (cuda) {
      b.partials = Mem(MemKind::Device, sizeof(double) * onebit::dev::kMaxPartials);
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
}

void Communicator::Impl::activate(const Arg& a, void* stream) {
  (void)stream;
  if (bound) return;
  const bool cuda = a.device == LOWBIT_DEVICE_CUDA;
#ifdef LOWBIT_COMM_WITH_CUDA
  std::unique_ptr<onebit::dev::DeviceGuard> guard;
  if (cuda) guard = std::make_unique<onebit::dev::DeviceGuard>(a.index);
#endif
  const size_t wbytes = size_t(a.n) * 4;
  const size_t sbytes = size_t(buf.layout.server_numel()) * 4;
  if (!cuda) {
    if (has_pending) {
      std::memcpy(buf.err.as(), pending_worker.data(), wbytes);
      if (sbytes) std::memcpy(buf.serr.as(), pending_server.data(), sbytes);
    } else {
      std::memset(buf.err.as(), 0, wbytes);
      std::memset(buf.serr.as(), 0, buf.serr.bytes());
    }
  } else {
#ifdef LOWBIT_COMM_WITH_CUDA
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
}

void Communicator::Impl::exchange(bool gather, const uint8_t* dsend, uint8_t* drecv, uint8_t* hsend, uint8_t* hrecv,
                                  void* stream) {
  const int64_t m = buf.layout.msg;
  auto op = [&](const void* s, void* r) {
    if (gather)
      t->allgather(s, r, m, stream);
    else
      t->alltoall(s, r, m, stream);
  };
#ifdef LOWBIT_COMM_WITH_CUDA
  if (t->stream_ordered()) {
    op(dsend, drecv);
  } else if (t->device_direct()) {
    onebit::dev::sync(stream);
    op(dsend, drecv);
  } else {
    const size_t send_bytes = size_t(gather ? m : m * world());
    const size_t recv_bytes = size_t(m * world());
    onebit::dev::copy_async(hsend, dsend, send_bytes, stream);
    onebit::dev::sync(stream);
    op(hsend, hrecv);
    onebit::dev::copy_async(drecv, hrecv, recv_bytes, stream);
  }
#else
  (void)op;
  (void)dsend;
  (void)drecv;
  (void)hsend;
  (void)hrecv;
  fail(LOWBIT_ERROR_INTERNAL, "communicator: device exchange without CUDA");
#endif
}

void Communicator::Impl::copy_errors_out(float* worker, float* server, void* stream) const {
  if (bound) {
    const size_t wbytes = size_t(buf.n) * 4, sbytes = size_t(buf.layout.server_numel()) * 4;
    if (buf.device == LOWBIT_DEVICE_CPU) {
      if (worker) std::memcpy(worker, buf.err.as(), wbytes);
      if (server && sbytes) std::memcpy(server, buf.serr.as(), sbytes);
    } else {
#ifdef LOWBIT_COMM_WITH_CUDA
      onebit::dev::DeviceGuard g(buf.device_index);
      if (worker) onebit::dev::copy_async(worker, buf.err.as(), wbytes, stream);
      if (server) onebit::dev::copy_async(server, buf.serr.as(), sbytes, stream);
      onebit::dev::sync(stream);
#endif
    }
  } else if (has_pending) {
    if (worker) std::memcpy(worker, pending_worker.data(), pending_worker.size() * 4);
    if (server && !pending_server.empty()) std::memcpy(server, pending_server.data(), pending_server.size() * 4);
  }
  (void)stream;
}

Communicator::Communicator(std::unique_ptr<Transport> transport) : impl_(std::make_unique<Impl>()) {
  impl_->t = std::move(transport);
  impl_->stats.struct_size = sizeof(lowbit_comm_stats_t);
}

Communicator::~Communicator() = default;

int32_t Communicator::rank() const { return impl_->rank(); }
int32_t Communicator::world() const { return impl_->world(); }
lowbit_comm_backend_t Communicator::backend() const { return impl_->t->backend(); }

static lowbit_tensor_t make_tensor(float* data, int64_t n, lowbit_device_t device, int32_t device_index) {
  lowbit_tensor_t t{};
  t.data = data;
  t.numel = n;
  t.dtype = LOWBIT_DTYPE_FLOAT32;
  t.device = device;
  t.device_index = device_index;
  return t;
}

void Communicator::allreduce_mean(float* data, int64_t n, lowbit_device_t device, int32_t device_index,
                                  void* stream) {
  const lowbit_tensor_t t = make_tensor(data, n, device, device_index);
  allreduce_mean(&t, stream);
}

bool Communicator::compressed_allreduce(float* data, int64_t n, lowbit_device_t device, int32_t device_index,
                                        void* stream) {
  const lowbit_tensor_t t = make_tensor(data, n, device, device_index);
  return compressed_allreduce(&t, stream);
}

void Communicator::allreduce_mean(const lowbit_tensor_t* tensor, void* stream) {
  Impl& I = *impl_;
  Transport& T = *I.t;
  lowbit_status_t st = LOWBIT_SUCCESS;
  std::string msg;
  Arg a;
  try {
    a = I.check_tensor(tensor);
  } catch (const Error& e) {
    st = e.status();
    msg = e.what();
  }
  I.agree(st, msg, a.n, false);
  const int32_t W = I.world();
  const float fw = float(W);
  if (a.device == LOWBIT_DEVICE_CPU) {
    if (!T.allreduce_f32(a.data, a.n, stream))
      for (int64_t i = 0; i < a.n; ++i) a.data[i] = a.data[i] / fw;
  } else {
#ifdef LOWBIT_COMM_WITH_CUDA
    onebit::dev::DeviceGuard g(a.index);
    bool averaged;
    if (T.stream_ordered()) {
      averaged = T.allreduce_f32(a.data, a.n, stream);
    } else if (T.device_direct()) {
      onebit::dev::sync(stream);
      averaged = T.allreduce_f32(a.data, a.n, stream);
    } else {
      const size_t bytes = size_t(a.n) * 4;
      if (I.mean_stage.bytes() < bytes) {
        I.mean_stage = Mem();
        I.mean_stage = Mem(MemKind::Pinned, bytes);
      }
      float* h = I.mean_stage.as<float>();
      onebit::dev::copy_async(h, a.data, bytes, stream);
      onebit::dev::sync(stream);
      if (!T.allreduce_f32(h, a.n, stream))
        for (int64_t i = 0; i < a.n; ++i) h[i] = h[i] / fw;
      onebit::dev::copy_async(a.data, h, bytes, stream);
      averaged = true;
    }
    if (!averaged) onebit::dev::divide(a.data, a.n, fw, stream);
#endif
  }
  I.stats.mean_calls += 1;
  I.stats.mean_elements += a.n;
  I.stats.mean_bytes_sent += 2 * int64_t(W - 1) * 4 * a.n / W;
}

bool Communicator::compressed_allreduce(const lowbit_tensor_t* tensor, void* stream) {
  Impl& I = *impl_;
  Transport& T = *I.t;
  lowbit_status_t st = LOWBIT_SUCCESS;
  std::string msg;
  Arg a;
  double sumsq = 0.0;
  bool nonfinite = false;
  try {
    a = I.check_tensor(tensor);
    I.prepare(a, stream);
    if (a.device == LOWBIT_DEVICE_CPU) {
      // x = tensor + the errors this call will use (bound, pending or zero).
      const float* e = I.bound ? I.buf.err.as<float>() : (I.has_pending ? I.pending_worker.data() : nullptr);
      sumsq = onebit::host_worker_sum(a.data, e, I.buf.ws_err.as<float>(), a.n);
      nonfinite = !std::isfinite(sumsq);
    }
  } catch (const Error& e) {
    st = e.status();
    msg = e.what();
  } catch (const std::bad_alloc&) {
    st = LOWBIT_ERROR_OUT_OF_MEMORY;
    msg = "out of host memory (communicator error buffers / workspaces)";
  }
  const int bad_rank = I.agree(st, msg, a.n, nonfinite);
  const int64_t W = I.world();
  if (bad_rank >= 0) {
    I.last_nonfinite = true;
    I.last_was_device = false;
    I.nonfinite_message = concat("tensor: the input (tensor + worker error) of rank ", bad_rank,
                                 " holds a NaN or an Inf; nothing was updated on any rank");
    return false;
  }
  I.activate(a, stream);
  Buffers& B = I.buf;
  const Layout& L = B.layout;
  if (a.device == LOWBIT_DEVICE_CPU) {
    const float scale = onebit::scale_from_sumsq(sumsq, L.n);
    onebit::host_worker_pack(B.ws_err.as<float>(), scale, L, B.send.as<uint8_t>());
    T.alltoall(B.send.as(), B.recv.as(), L.msg, stream);
    const double s2 = onebit::host_server_sum(B.recv.as<uint8_t>(), B.serr.as<float>(), B.ws_serr.as<float>(), L);
    const float server_scale = onebit::scale_from_sumsq(s2, L.server_numel());
    onebit::host_server_pack(B.ws_serr.as<float>(), server_scale, L, B.gsend.as<uint8_t>());
    T.allgather(B.gsend.as(), B.grecv.as(), L.msg, stream);
    I.stats.compressed_calls += 1;
    I.stats.compressed_elements += a.n;
    I.stats.compressed_bytes_sent += 2 * (W - 1) * L.msg;
    if (!onebit::host_gathered_finite(B.grecv.as<uint8_t>(), L)) {
      I.last_nonfinite = true;
      I.last_was_device = false;
      I.nonfinite_message =
          "tensor: the server average overflowed to a non-finite value on some rank; nothing was updated on any "
          "rank";
      return false;
    }
    onebit::host_decode(B.grecv.as<uint8_t>(), L, a.data);
    B.err.swap(B.ws_err);
    B.serr.swap(B.ws_serr);
    I.last_nonfinite = false;
    I.last_was_device = false;
    return true;
  }
#ifdef LOWBIT_COMM_WITH_CUDA
  onebit::dev::DeviceGuard g(a.index);
  onebit::dev::worker(a.data, B.err.as<float>(), B.ws_err.as<float>(), L, B.send.as<uint8_t>(),
                      B.partials.as<double>(), B.scal.as<float>(), stream);
  I.exchange(false, B.send.as<uint8_t>(), B.recv.as<uint8_t>(), B.hsend.as<uint8_t>(), B.hrecv.as<uint8_t>(), stream);
  onebit::dev::server(B.recv.as<uint8_t>(), B.serr.as<float>(), B.ws_serr.as<float>(), L, B.gsend.as<uint8_t>(),
                      B.partials.as<double>(), B.scal.as<float>(), stream);
  I.exchange(true, B.gsend.as<uint8_t>(), B.grecv.as<uint8_t>(), B.hgsend.as<uint8_t>(), B.hgrecv.as<uint8_t>(),
             stream);
  onebit::dev::finalize(B.grecv.as<uint8_t>(), L, a.data, B.err.as<float>(), B.ws_err.as<float>(),
                        B.serr.as<float>(), B.ws_serr.as<float>(), B.flag.as<int32_t>(),
                        B.host_flag.alias<int32_t>(), stream);
  // finalize left the old errors in ws_* when the input was not finite, so
  // the swap is right either way.
  B.err.swap(B.ws_err);
  B.serr.swap(B.ws_serr);
  I.last_was_device = true;
  I.last_nonfinite = false;
  I.stats.compressed_calls += 1;
  I.stats.compressed_elements += a.n;
  I.stats.compressed_bytes_sent += 2 * (W - 1) * L.msg;
  return true;
#else
  fail(LOWBIT_ERROR_INTERNAL, "communicator: CUDA tensor without CUDA");
#endif
}

const int32_t* Communicator::device_nonfinite_flag() const {
  const Impl& I = *impl_;
  if (!I.buf.valid || I.buf.device != LOWBIT_DEVICE_CUDA) return nullptr;
  return I.buf.flag.as<int32_t>();
}

bool Communicator::last_nonfinite() const {
  const Impl& I = *impl_;
  if (I.last_was_device) {
    if (!I.buf.valid || I.buf.device != LOWBIT_DEVICE_CUDA) return false;
    return *I.buf.host_flag.as<volatile int32_t>() != 0;
  }
  return I.last_nonfinite;
}

const std::string& Communicator::nonfinite_message() const { return impl_->nonfinite_message; }

void Communicator::reserve(int64_t n, lowbit_device_t device, int32_t device_index, void* stream) {
  Impl& I = *impl_;
  LOWBIT_REQUIRE(n > 0, LOWBIT_ERROR_INVALID_ARGUMENT, "numel is ", n, " (must be > 0)");
  Arg a;
  a.n = n;
  a.device = device;
  a.index = device == LOWBIT_DEVICE_CPU ? 0 : device_index;
  if (device == LOWBIT_DEVICE_CPU) {
    LOWBIT_REQUIRE(I.t->supports_host(), LOWBIT_ERROR_UNSUPPORTED,
                   "device is LOWBIT_DEVICE_CPU, but an NCCL communicator moves CUDA tensors only");
  } else {
#ifndef LOWBIT_COMM_WITH_CUDA
    fail(LOWBIT_ERROR_UNSUPPORTED, "device is ", device_name(device), ", but this lowbit was built without CUDA");
#endif
    LOWBIT_REQUIRE(device == LOWBIT_DEVICE_CUDA, LOWBIT_ERROR_INVALID_ARGUMENT, "device is ", int(device));
  }
  I.prepare(a, stream);
  I.activate(a, stream);
}

int64_t Communicator::worker_error_numel() const { return impl_->error_numel(); }

int64_t Communicator::server_error_numel() const {
  const int64_t n = impl_->error_numel();
  return n ? Layout::make(n, world(), rank()).server_numel() : 0;
}

void Communicator::read_errors(float* worker, int64_t worker_numel, float* server, int64_t server_numel,
                               void* stream) const {
  const int64_t wn = worker_error_numel(), sn = server_error_numel();
  LOWBIT_REQUIRE(!worker || worker_numel == wn, LOWBIT_ERROR_INVALID_ARGUMENT, "worker_numel is ", worker_numel,
                 ", but this rank's worker error has ", wn, " elements");
  LOWBIT_REQUIRE(!server || server_numel == sn, LOWBIT_ERROR_INVALID_ARGUMENT, "server_numel is ", server_numel,
                 ", but this rank's server error has ", sn, " elements");
  impl_->copy_errors_out(worker, server, stream);
}

std::vector<uint8_t> Communicator::save_errors(void* stream) const {
  const Impl& I = *impl_;
  const int64_t n = I.error_numel();
  const Layout L = Layout::make(n, world(), rank());
  const int64_t c = n ? L.server_numel() : 0;
  std::vector<uint8_t> out(size_t(kHeaderBytes + 4 * (n + c)), 0);
  uint8_t* h = out.data();
  std::memcpy(h, kMagic, 8);
  put<uint32_t>(h + 8, kBlobVersion);
  put<uint32_t>(h + 12, uint32_t(kHeaderBytes));
  put<int32_t>(h + 16, world());
  put<int32_t>(h + 20, rank());
  put<int64_t>(h + 24, n);
  put<int64_t>(h + 32, n ? L.chunk : 0);
  put<int64_t>(h + 40, c);
  uint8_t* payload = h + kHeaderBytes;
  if (n) {
    // The payload is fp32, possibly unaligned in a byte vector: go through
    // aligned temporaries.
    std::vector<float> w(static_cast<size_t>(n)), s(static_cast<size_t>(c));
    I.copy_errors_out(w.data(), c ? s.data() : nullptr, stream);
    std::memcpy(payload, w.data(), size_t(n) * 4);
    if (c) std::memcpy(payload + n * 4, s.data(), size_t(c) * 4);
  }
  put<uint64_t>(h + 48, fnv1a64(payload, size_t(4 * (n + c))));
  put<uint64_t>(h + 56, 0);
  return out;
}

void Communicator::load_errors(const uint8_t* data, int64_t size, void* stream) {
  Impl& I = *impl_;
  LOWBIT_REQUIRE(data != nullptr, LOWBIT_ERROR_NULL_POINTER, "buffer is NULL");
  LOWBIT_REQUIRE(size >= kHeaderBytes, LOWBIT_ERROR_CORRUPT_DATA, "size is ", size, " bytes, smaller than the ",
                 kHeaderBytes, "-byte header of a communicator error blob (truncated)");
  LOWBIT_REQUIRE(std::memcmp(data, kMagic, 8) == 0, LOWBIT_ERROR_CORRUPT_DATA,
                 "buffer does not start with \"LBCOMMER\" (not a communicator error blob)");
  const uint32_t version = get<uint32_t>(data + 8);
  LOWBIT_REQUIRE(version == kBlobVersion, LOWBIT_ERROR_VERSION_MISMATCH, "buffer has format version ", version,
                 " (this library reads version ", kBlobVersion, ")");
  LOWBIT_REQUIRE(get<uint32_t>(data + 12) == uint32_t(kHeaderBytes), LOWBIT_ERROR_CORRUPT_DATA,
                 "buffer header size is ", get<uint32_t>(data + 12), " (expected ", kHeaderBytes, ")");
  const int32_t w = get<int32_t>(data + 16), r = get<int32_t>(data + 20);
  LOWBIT_REQUIRE(w == world(), LOWBIT_ERROR_STATE_MISMATCH, "buffer was saved with world size ", w,
                 ", this communicator has ", world());
  LOWBIT_REQUIRE(r == rank(), LOWBIT_ERROR_STATE_MISMATCH, "buffer was saved by rank ", r, ", this is rank ", rank(),
                 " (each rank restores its own errors)");
  const int64_t n = get<int64_t>(data + 24), chunk = get<int64_t>(data + 32), c = get<int64_t>(data + 40);
  LOWBIT_REQUIRE(n >= 0 && n <= (INT64_MAX >> 8), LOWBIT_ERROR_CORRUPT_DATA, "buffer holds numel ", n);
  const Layout L = Layout::make(n, world(), rank());
  LOWBIT_REQUIRE(chunk == (n ? L.chunk : 0) && c == (n ? L.server_numel() : 0), LOWBIT_ERROR_CORRUPT_DATA,
                 "buffer header is inconsistent (numel ", n, ", chunk ", chunk, ", server numel ", c, ")");
  const int64_t expected = kHeaderBytes + 4 * (n + c);
  LOWBIT_REQUIRE(size >= expected, LOWBIT_ERROR_CORRUPT_DATA, "size is ", size, " bytes, but the blob needs ",
                 expected, " (truncated)");
  LOWBIT_REQUIRE(size == expected, LOWBIT_ERROR_CORRUPT_DATA, "size is ", size, " bytes, ", size - expected,
                 " more than the blob's ", expected);
  const uint8_t* payload = data + kHeaderBytes;
  LOWBIT_REQUIRE(fnv1a64(payload, size_t(4 * (n + c))) == get<uint64_t>(data + 48), LOWBIT_ERROR_CORRUPT_DATA,
                 "buffer checksum mismatch (corrupted)");
  std::vector<float> wv(static_cast<size_t>(n)), sv(static_cast<size_t>(c));
  if (n) std::memcpy(wv.data(), payload, size_t(n) * 4);
  if (c) std::memcpy(sv.data(), payload + n * 4, size_t(c) * 4);
  for (int64_t i = 0; i < n; ++i)
    LOWBIT_REQUIRE(std::isfinite(wv[size_t(i)]), LOWBIT_ERROR_CORRUPT_DATA, "buffer: worker error element ", i,
                   " is not finite");
  for (int64_t i = 0; i < c; ++i)
    LOWBIT_REQUIRE(std::isfinite(sv[size_t(i)]), LOWBIT_ERROR_CORRUPT_DATA, "buffer: server error element ", i,
                   " is not finite");
  if (n == 0) {
    reset_errors(stream);
    return;
  }
  if (I.bound && I.buf.n == n) {
    const size_t wb = size_t(n) * 4, sb = size_t(c) * 4;
    if (I.buf.device == LOWBIT_DEVICE_CPU) {
      std::memcpy(I.buf.err.as(), wv.data(), wb);
      if (sb) std::memcpy(I.buf.serr.as(), sv.data(), sb);
    } else {
#ifdef LOWBIT_COMM_WITH_CUDA
      onebit::dev::DeviceGuard g(I.buf.device_index);
      onebit::dev::copy_async(I.buf.err.as(), wv.data(), wb, stream);
      onebit::dev::copy_async(I.buf.serr.as(), sv.data(), sb, stream);
      onebit::dev::sync(stream);
#endif
    }
    return;
  }
  I.bound = false;
  I.has_pending = true;
  I.pending_n = n;
  I.pending_worker.swap(wv);
  I.pending_server.swap(sv);
}

void Communicator::reset_errors(void* stream) {
  (void)stream;
  Impl& I = *impl_;
  I.bound = false;
  I.has_pending = false;
  I.pending_n = 0;
  std::vector<float>().swap(I.pending_worker);
  std::vector<float>().swap(I.pending_server);
}

lowbit_comm_info_t Communicator::info() const {
  const Impl& I = *impl_;
  lowbit_comm_info_t out{};
  out.struct_size = sizeof(out);
  out.backend = backend();
  out.rank = rank();
  out.world_size = world();
  out.cuda_aware_mpi = (I.t->backend() == LOWBIT_COMM_BACKEND_MPI && I.t->device_direct()) ? 1 : 0;
  out.device_index = I.t->device_index();
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
