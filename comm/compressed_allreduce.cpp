// The 1-bit compressed allreduce: argument agreement, the phases of
// stages.cpp with the transport's exchanges between them, and the outcome of
// the last call.
#include <cmath>
#include <new>
#include <optional>
#include <string>

#include "communicator_impl.hpp"
#include "core/error.hpp"
#include "host_kernels.hpp"
#ifdef LOWBIT_HAVE_CUDA
#include "cuda/runtime.hpp"
#include "device.hpp"
#endif

namespace lowbit {

using onebit::Buffers;
using onebit::Layout;

void Communicator::Impl::exchange(bool gather, const uint8_t* dsend, uint8_t* drecv, uint8_t* hsend, uint8_t* hrecv,
                                  void* stream) {
  const int64_t m = buf.layout.msg;
  auto op = [&](const void* s, void* r) {
    if (gather)
      t->allgather(s, r, m, stream);
    else
      t->alltoall(s, r, m, stream);
  };
#ifdef LOWBIT_HAVE_CUDA
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

bool Communicator::compressed_allreduce(float* data, int64_t n, lowbit_device_t device, int32_t device_index,
                                        void* stream, const CollectiveCaller& who) {
  const lowbit_tensor_t t = comm_tensor(data, n, device, device_index);
  return compressed_allreduce(&t, stream, who);
}

bool Communicator::compressed_allreduce(const lowbit_tensor_t* tensor, void* stream, const CollectiveCaller& who) {
  Impl& I = *impl_;
  Transport& T = *I.t;
  CommArg a;
  double sumsq = 0.0;
  bool nonfinite = false;
  Failure f;
  try {
    a = I.check_tensor(tensor);
    LOWBIT_REQUIRE(a.device == LOWBIT_DEVICE_CPU || !I.compact(), LOWBIT_ERROR_UNSUPPORTED,
                   "tensor.device is LOWBIT_DEVICE_CUDA, but this communicator keeps its errors in ",
                   I.error_format == LOWBIT_COMM_ERROR_BF16 ? "bf16" : "8-bit blocks",
                   " (lowbit_comm_config_t.error_format): CUDA tensors take LOWBIT_COMM_ERROR_FP32 only");
    I.prepare(a, stream);
    if (a.device == LOWBIT_DEVICE_CPU) {
      // x = tensor + the errors this call will use (bound, pending or
      // zero) into the workspace, its signs into the messages, the sum of
      // x^2 for the scale: one pass, before the agreement (nothing live is
      // written).
      sumsq = I.host_worker_pass(a, I.buf.send.as<uint8_t>());
      nonfinite = !std::isfinite(sumsq);
    }
  } catch (...) {
    f = current_failure("out of host memory (communicator error buffers / workspaces)");
  }
  const int bad_rank =
      I.agree(f.status, f.message, kOpCompressedAllreduce, a.n, tensor ? tensor->dtype : LOWBIT_DTYPE_FLOAT32, who, nonfinite);
  if (bad_rank >= 0) {
    I.last_nonfinite = true;
    I.last_was_device = false;
    I.nonfinite_message = concat("tensor: the input (tensor + worker error) of rank ", bad_rank,
                                 " holds a NaN or an Inf; nothing was updated on any rank");
    return false;
  }
  I.activate(a, stream);
#ifdef LOWBIT_HAVE_CUDA
  std::optional<cuda::DeviceGuard> guard;  // the exchanges' copies and syncs too
  if (a.device == LOWBIT_DEVICE_CUDA) guard.emplace(a.index);
#endif
  Buffers& B = I.buf;
  const Layout& L = B.layout;
  // activate() has put the errors the pass used into B.err (the pending ones,
  // or zeros: x = t + 0 either way).
  I.worker_phase(a, sumsq, B.send.as<uint8_t>(), stream);
  if (a.device == LOWBIT_DEVICE_CPU)
    T.alltoall(B.send.as(), B.recv.as(), L.msg, stream);
  else
    I.exchange(false, B.send.as<uint8_t>(), B.recv.as<uint8_t>(), B.hsend.as<uint8_t>(), B.hrecv.as<uint8_t>(),
               stream);
  I.server_phase(a, B.recv.as<uint8_t>(), B.gsend.as<uint8_t>(), stream);
  if (a.device == LOWBIT_DEVICE_CPU)
    T.allgather(B.gsend.as(), B.grecv.as(), L.msg, stream);
  else
    I.exchange(true, B.gsend.as<uint8_t>(), B.grecv.as<uint8_t>(), B.hgsend.as<uint8_t>(), B.hgrecv.as<uint8_t>(),
               stream);
  return I.finish_phase(a, B.grecv.as<uint8_t>(), a.data,
                        "tensor: the server average overflowed to a non-finite value on some rank; nothing was "
                        "updated on any rank",
                        stream);
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

}  // namespace lowbit
