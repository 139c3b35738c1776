// The three phases of the 1-bit compressed allreduce (worker, server,
// finish), shared by the built-in call (compressed_allreduce.cpp) and the
// codec stages (docs/COMMUNICATOR.md, section 7), which run them on the
// caller's message buffers: a transport built from the stages gives the
// built-in bits. Error updates stay in the ws_* buffers until finish commits
// them.
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

namespace {

// A message buffer argument: not NULL, large enough, on the stage's device.
void check_buffer(const void* p, int64_t bytes, int64_t need, const char* name, const CommArg& a) {
  LOWBIT_REQUIRE(p != nullptr, LOWBIT_ERROR_NULL_POINTER, name, " is NULL");
  LOWBIT_REQUIRE(bytes >= need, LOWBIT_ERROR_BUFFER_TOO_SMALL, name, "_bytes is ", bytes, ", the stage needs ",
                 need, " (lowbit_comm_stage_message_bytes x ", need, " / message bytes)");
  if (a.device == LOWBIT_DEVICE_CUDA) {
#ifdef LOWBIT_HAVE_CUDA
    const std::string why = onebit::dev::check_device_pointer(p, a.index);
    LOWBIT_REQUIRE(why.empty(), LOWBIT_ERROR_INVALID_ARGUMENT, name, " ", why,
                   " (the stage's tensor is on LOWBIT_DEVICE_CUDA)");
#endif
  }
}

}  // namespace

int64_t Communicator::stage_message_bytes(int64_t n) const {
  LOWBIT_REQUIRE(n > 0 && n <= onebit::kMaxNumel, LOWBIT_ERROR_INVALID_ARGUMENT, "numel is ", n,
                 " (must be > 0 and at most 2^55 = ", onebit::kMaxNumel, ")");
  return Layout::make(n, world(), rank()).msg;
}

void Communicator::stage_compress(const lowbit_tensor_t* tensor, void* send, int64_t send_bytes, void* stream) {
  Impl& I = *impl_;
  I.stage = Impl::Stage::Idle;
  LOWBIT_REQUIRE(!I.compact(), LOWBIT_ERROR_UNSUPPORTED,
                 "the codec stages keep fp32 errors only, and this communicator keeps them in ",
                 I.error_format == LOWBIT_COMM_ERROR_BF16 ? "bf16" : "8-bit blocks",
                 " (lowbit_comm_config_t.error_format); use lowbit_comm_compressed_allreduce");
  const CommArg a = I.check_tensor(tensor);
  const Layout L = Layout::make(a.n, world(), rank());
  check_buffer(send, send_bytes, int64_t(L.world) * L.msg, "send", a);
  I.prepare(a, stream);
  I.activate(a, stream);
  const double sumsq = a.device == LOWBIT_DEVICE_CPU ? I.host_worker_pass(a, static_cast<uint8_t*>(send)) : 0.0;
  I.worker_phase(a, sumsq, static_cast<uint8_t*>(send), stream);
  I.stage_arg = a;
  I.stage = Impl::Stage::Compressed;
}

void Communicator::stage_reduce(const void* recv, int64_t recv_bytes, void* gsend, int64_t gsend_bytes,
                                void* stream) {
  Impl& I = *impl_;
  LOWBIT_REQUIRE(I.stage == Impl::Stage::Compressed && I.bound, LOWBIT_ERROR_INVALID_STATE,
                 "lowbit_comm_stage_reduce needs a lowbit_comm_stage_compress before it (and no other compressed "
                 "call, reduce or error load in between)");
  const CommArg& a = I.stage_arg;
  Buffers& B = I.buf;
  const Layout& L = B.layout;
  check_buffer(recv, recv_bytes, int64_t(L.world) * L.msg, "recv", a);
  check_buffer(gsend, gsend_bytes, L.msg, "gsend", a);
  I.server_phase(a, static_cast<const uint8_t*>(recv), static_cast<uint8_t*>(gsend), stream);
  I.stage = Impl::Stage::Reduced;
}

bool Communicator::stage_decode(const void* grecv, int64_t grecv_bytes, const lowbit_tensor_t* out, void* stream) {
  Impl& I = *impl_;
  LOWBIT_REQUIRE(I.stage == Impl::Stage::Reduced && I.bound, LOWBIT_ERROR_INVALID_STATE,
                 "lowbit_comm_stage_decode needs a lowbit_comm_stage_reduce before it (and no other compressed "
                 "call or error load in between)");
  const CommArg& a = I.stage_arg;
  Buffers& B = I.buf;
  const Layout& L = B.layout;
  check_buffer(grecv, grecv_bytes, int64_t(L.world) * L.msg, "grecv", a);
  const CommArg o = I.check_tensor(out);
  LOWBIT_REQUIRE(o.n == a.n, LOWBIT_ERROR_INVALID_ARGUMENT, "out.numel is ", o.n, ", but the compress stage had ",
                 a.n);
  LOWBIT_REQUIRE(o.device == a.device && o.index == a.index, LOWBIT_ERROR_INVALID_ARGUMENT, "out.device is ",
                 comm_device_name(o.device), ":", o.index, ", but the compress stage ran on ",
                 comm_device_name(a.device), ":", a.index);
  I.stage = Impl::Stage::Idle;
  return I.finish_phase(a, static_cast<const uint8_t*>(grecv), o.data,
                        "grecv: a gathered scale is not finite (some rank's input held a NaN or an Inf, or the "
                        "server average overflowed); nothing was updated",
                        stream);
}

// ---- the phases, shared with compressed_allreduce ---------------------------

void Communicator::Impl::worker_phase(const CommArg& a, double sumsq, uint8_t* send, void* stream) {
  Buffers& B = buf;
  if (a.device == LOWBIT_DEVICE_CPU) {
    B.call_scale = onebit::scale_from_sumsq(sumsq, a.n);
    onebit::put_scales(send, B.layout.world, B.layout.msg, B.call_scale);
    return;
  }
#ifdef LOWBIT_HAVE_CUDA
  cuda::DeviceGuard guard(a.index);
  onebit::dev::worker(a.data, B.err.as<float>(), B.ws_err.as<float>(), B.layout, send, B.partials.as<double>(),
                      B.scal.as<float>(), stream);
#else
  (void)stream;
  fail(LOWBIT_ERROR_INTERNAL, "communicator: CUDA tensor without CUDA");
#endif
}

void Communicator::Impl::server_phase(const CommArg& a, const uint8_t* recv, uint8_t* gsend, void* stream) {
  Buffers& B = buf;
  if (a.device == LOWBIT_DEVICE_CPU && compact()) {
    const double sumsq =
        onebit::host_server_sum_pack_compact(recv, error_format, B.serr.as<uint8_t>(), B.layout, gsend);
    B.call_sscale = onebit::scale_from_sumsq(sumsq, B.layout.server_numel());
    onebit::put_scale(gsend, B.call_sscale);
    return;
  }
  if (a.device == LOWBIT_DEVICE_CPU) {
    const onebit::ErrorsIn z{B.serr.as<float>(), B.serr_scale, B.lazy};
    const double sumsq = onebit::host_server_sum_pack(recv, z, B.layout, B.ws_serr.as<float>(), gsend);
    B.call_sscale = onebit::scale_from_sumsq(sumsq, B.layout.server_numel());
    onebit::put_scale(gsend, B.call_sscale);
    return;
  }
#ifdef LOWBIT_HAVE_CUDA
  cuda::DeviceGuard guard(a.index);
  onebit::dev::server(recv, B.serr.as<float>(), B.ws_serr.as<float>(), B.layout, gsend, B.partials.as<double>(),
                      B.scal.as<float>(), stream);
#else
  (void)stream;
  fail(LOWBIT_ERROR_INTERNAL, "communicator: CUDA tensor without CUDA");
#endif
}

bool Communicator::Impl::finish_phase(const CommArg& a, const uint8_t* grecv, float* out, const char* nonfinite,
                                      void* stream) {
  Buffers& B = buf;
  const Layout& L = B.layout;
  stats.compressed_calls += 1;
  stats.compressed_elements += a.n;
  stats.compressed_bytes_sent += 2 * int64_t(L.world - 1) * L.msg;
  if (a.device == LOWBIT_DEVICE_CPU) {
    last_was_device = false;
    if (!onebit::host_gathered_finite(grecv, L)) {
      last_nonfinite = true;
      nonfinite_message = nonfinite;
      return false;
    }
    if (compact()) {
      // The call succeeded: both errors in place from what the call read
      // (the tensor, before the decode may overwrite it, and its recv
      // messages: compressed_allreduce only, the stages refuse compact
      // errors), then the result.
      onebit::host_worker_commit_compact(a.data, error_format, B.err.as<uint8_t>(), B.call_scale, L);
      onebit::host_server_commit_compact(B.recv.as<uint8_t>(), error_format, B.serr.as<uint8_t>(), B.call_sscale, L);
      onebit::host_decode(grecv, L, out);
      last_nonfinite = false;
      return true;
    }
    onebit::host_decode(grecv, L, out);
  } else {
#ifdef LOWBIT_HAVE_CUDA
    cuda::DeviceGuard guard(a.index);
    onebit::dev::finalize(grecv, L, out, B.err.as<float>(), B.ws_err.as<float>(), B.serr.as<float>(),
                          B.ws_serr.as<float>(), B.flag.as<int32_t>(), B.host_flag.alias<int32_t>(), stream);
    last_was_device = true;
#else
    (void)stream;
    fail(LOWBIT_ERROR_INTERNAL, "communicator: CUDA tensor without CUDA");
#endif
  }
  // On CUDA, finalize put the old errors back into ws_* when a scale was not
  // finite, so the swap is right either way.
  B.err.swap(B.ws_err);
  B.serr.swap(B.ws_serr);
  if (a.device == LOWBIT_DEVICE_CPU) {  // the workspaces held x and y: the errors of this call, lazily
    B.lazy = true;
    B.err_scale = B.call_scale;
    B.serr_scale = B.call_sscale;
  }
  last_nonfinite = false;
  return true;
}

}  // namespace lowbit
