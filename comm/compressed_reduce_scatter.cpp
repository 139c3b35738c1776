// The 1-bit compressed reduce-scatter (docs/COMMUNICATOR.md, section 2b):
// the worker phase and the all-to-all of the compressed allreduce, then each
// rank's average of the W messages of its chunk, uncompressed, into the
// caller's output. Host tensors only; the argument agreement and the
// non-finite rules are the allreduce's.
#include <cmath>
#include <string>

#include "communicator_impl.hpp"
#include "core/error.hpp"
#include "host_kernels.hpp"

namespace lowbit {

using onebit::Buffers;
using onebit::Layout;

void Communicator::reduce_scatter_chunk(int64_t n, int64_t* offset, int64_t* count) const {
  LOWBIT_REQUIRE(n > 0 && n <= onebit::kMaxNumel, LOWBIT_ERROR_INVALID_ARGUMENT, "numel is ", n,
                 " (must be > 0 and at most 2^55 = ", onebit::kMaxNumel, ")");
  const Layout L = Layout::make(n, world(), rank());
  if (offset) *offset = int64_t(rank()) * L.chunk;
  if (count) *count = L.server_numel();
}

namespace {

// The output of a reduce-scatter of `a`: this rank's chunk, fp32, on the host.
float* check_chunk_out(const lowbit_tensor_t* out, const CommArg& a, const Layout& L) {
  LOWBIT_REQUIRE(out != nullptr, LOWBIT_ERROR_NULL_POINTER, "out is NULL");
  const int64_t want = L.server_numel();
  LOWBIT_REQUIRE(out->numel == want, LOWBIT_ERROR_INVALID_ARGUMENT, "out.numel is ", out->numel, ", but rank ",
                 L.rank, "'s chunk of a reduce-scatter of ", a.n, " elements over ", L.world, " ranks has ", want,
                 " (lowbit_comm_reduce_scatter_chunk)");
  LOWBIT_REQUIRE(out->dtype == LOWBIT_DTYPE_FLOAT32, LOWBIT_ERROR_INVALID_ARGUMENT, "out.dtype is ",
                 int(out->dtype), " (the communicator takes LOWBIT_DTYPE_FLOAT32 only)");
  LOWBIT_REQUIRE(out->device == LOWBIT_DEVICE_CPU, LOWBIT_ERROR_INVALID_ARGUMENT, "out.device is ",
                 comm_device_name(out->device), " (the tensor is on LOWBIT_DEVICE_CPU: out must be too)");
  if (want == 0) return nullptr;  // an empty chunk: nothing is written, out.data may be NULL
  LOWBIT_REQUIRE(out->data != nullptr, LOWBIT_ERROR_NULL_POINTER, "out.data is NULL");
  LOWBIT_REQUIRE(reinterpret_cast<uintptr_t>(out->data) % alignof(float) == 0, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "out.data (", out->data, ") is not aligned to 4 bytes");
  return static_cast<float*>(out->data);
}

}  // namespace

bool Communicator::compressed_reduce_scatter(const lowbit_tensor_t* tensor, const lowbit_tensor_t* out,
                                             void* stream, const CollectiveCaller& who) {
  Impl& I = *impl_;
  Transport& T = *I.t;
  CommArg a;
  float* dst = nullptr;
  double sumsq = 0.0;
  bool nonfinite = false;
  Failure f;
  try {
    a = I.check_tensor(tensor);
    LOWBIT_REQUIRE(a.device == LOWBIT_DEVICE_CPU, LOWBIT_ERROR_UNSUPPORTED,
                   "tensor.device is LOWBIT_DEVICE_CUDA: lowbit_comm_compressed_reduce_scatter takes host "
                   "(LOWBIT_DEVICE_CPU) tensors only");
    dst = check_chunk_out(out, a, Layout::make(a.n, world(), rank()));
    I.prepare(a, stream);
    // x = tensor + the errors this call will use into the workspace, its
    // signs into the messages, the sum of x^2: before the agreement, nothing
    // live written (as the allreduce).
    sumsq = I.host_worker_pass(a, I.buf.send.as<uint8_t>());
    nonfinite = !std::isfinite(sumsq);
  } catch (...) {
    f = current_failure("out of host memory (communicator error buffers / workspaces)");
  }
  const int bad_rank = I.agree(f.status, f.message, kOpCompressedReduceScatter, a.n,
                               tensor ? tensor->dtype : LOWBIT_DTYPE_FLOAT32, who, nonfinite);
  I.last_was_device = false;
  if (bad_rank >= 0) {
    I.last_nonfinite = true;
    I.nonfinite_message = concat("tensor: the input (tensor + worker error) of rank ", bad_rank,
                                 " holds a NaN or an Inf; nothing was updated on any rank");
    return false;
  }
  I.activate(a, stream);
  Buffers& B = I.buf;
  const Layout& L = B.layout;
  I.worker_phase(a, sumsq, B.send.as<uint8_t>(), stream);
  T.alltoall(B.send.as(), B.recv.as(), L.msg, stream);
  I.stats.compressed_calls += 1;
  I.stats.compressed_elements += a.n;
  I.stats.compressed_bytes_sent += int64_t(L.world - 1) * L.msg;
  // Every rank received the same W scales (each rank writes its one scale
  // into all its messages), so every rank reaches the same verdict here.
  if (!std::isfinite(onebit::host_received_scale_sum(B.recv.as<uint8_t>(), L))) {
    I.last_nonfinite = true;
    I.nonfinite_message =
        "tensor: the sum of the ranks' scales overflowed (the average may not be finite); nothing was updated on "
        "any rank";
    return false;
  }
  if (I.compact()) {
    // The worker error in place from the tensor, before out (which may
    // overlap it) is written.
    onebit::host_worker_commit_compact(a.data, I.error_format, B.err.as<uint8_t>(), B.call_scale, L);
    if (dst) onebit::host_server_average(B.recv.as<uint8_t>(), L, dst);
    I.last_nonfinite = false;
    return true;
  }
  if (dst) onebit::host_server_average(B.recv.as<uint8_t>(), L, dst);
  // Commit the worker error; the server error is left as it is. ws_err holds
  // this call's x: kept as the lazy error when the buffers are lazy (the
  // server error keeps its own scale), else stored as x - scale * sign(x).
  if (B.lazy) {
    B.err.swap(B.ws_err);
    B.err_scale = B.call_scale;
  } else {
    onebit::host_errors_from(B.ws_err.as<float>(), B.call_scale, a.n, B.ws_err.as<float>());
    B.err.swap(B.ws_err);
  }
  I.last_nonfinite = false;
  return true;
}

}  // namespace lowbit
