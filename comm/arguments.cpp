// Argument checks of the collective calls, and their agreement over ranks.
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "communicator_impl.hpp"
#include "core/error.hpp"
#ifdef LOWBIT_HAVE_CUDA
#include "device.hpp"
#endif

namespace lowbit {

const char* comm_device_name(lowbit_device_t d) {
  switch (d) {
    case LOWBIT_DEVICE_CPU: return "LOWBIT_DEVICE_CPU";
    case LOWBIT_DEVICE_CUDA: return "LOWBIT_DEVICE_CUDA";
    default: break;
  }
  return "an unknown device";
}

namespace {

std::string dtype_name(lowbit_dtype_t d) {
  switch (d) {
    case LOWBIT_DTYPE_FLOAT32: return "LOWBIT_DTYPE_FLOAT32";
    case LOWBIT_DTYPE_BFLOAT16: return "LOWBIT_DTYPE_BFLOAT16";
    case LOWBIT_DTYPE_FLOAT16: return "LOWBIT_DTYPE_FLOAT16";
    default: break;
  }
  return concat(int(d), " (unknown)");
}

}  // namespace

CommArg Communicator::Impl::check_tensor(const lowbit_tensor_t* tensor) const {
  LOWBIT_REQUIRE(tensor != nullptr, LOWBIT_ERROR_NULL_POINTER, "tensor is NULL");
  LOWBIT_REQUIRE(tensor->data != nullptr, LOWBIT_ERROR_NULL_POINTER, "tensor.data is NULL");
  LOWBIT_REQUIRE(tensor->numel > 0, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.numel is ", tensor->numel,
                 " (must be > 0)");
  LOWBIT_REQUIRE(tensor->numel <= onebit::kMaxNumel, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.numel is ",
                 tensor->numel, " (too large: at most 2^55 = ", onebit::kMaxNumel, ")");
  LOWBIT_REQUIRE(tensor->dtype == LOWBIT_DTYPE_FLOAT32, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.dtype is ",
                 dtype_name(tensor->dtype), " (the communicator takes LOWBIT_DTYPE_FLOAT32 only)");
  LOWBIT_REQUIRE(reinterpret_cast<uintptr_t>(tensor->data) % alignof(float) == 0, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "tensor.data (", tensor->data, ") is not aligned to 4 bytes");
  CommArg a;
  a.data = static_cast<float*>(tensor->data);
  a.n = tensor->numel;
  a.device = tensor->device;
  a.index = tensor->device_index;
  const bool callbacks = t->backend() == LOWBIT_COMM_BACKEND_CALLBACKS;
  if (tensor->device == LOWBIT_DEVICE_CPU) {
    LOWBIT_REQUIRE(t->supports_host(), LOWBIT_ERROR_UNSUPPORTED, "tensor.device is LOWBIT_DEVICE_CPU, but ",
                   callbacks ? "this callback transport takes device memory only (lowbit_comm_transport_t."
                               "host_buffers = 0)"
                             : "an NCCL communicator moves CUDA tensors only");
    a.index = 0;
  } else if (tensor->device == LOWBIT_DEVICE_CUDA) {
#ifdef LOWBIT_HAVE_CUDA
    const int count = onebit::dev::device_count();
    LOWBIT_REQUIRE(count > 0, LOWBIT_ERROR_UNSUPPORTED,
                   "tensor.device is LOWBIT_DEVICE_CUDA, but no CUDA device is available to this process");
    LOWBIT_REQUIRE(a.index >= 0 && a.index < count, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.device_index is ",
                   a.index, " (this process sees ", count, " CUDA device(s))");
    LOWBIT_REQUIRE(t->device_index() < 0 || t->device_index() == a.index, LOWBIT_ERROR_INVALID_ARGUMENT,
                   "tensor.device_index is ", a.index, ", but ",
                   callbacks ? "this callback transport serves CUDA device " : "this NCCL communicator runs on CUDA device ",
                   t->device_index(), callbacks ? " (lowbit_comm_transport_t.device_index)" : "");
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

namespace {

const char* status_name(lowbit_status_t s) {
  switch (s) {
    case LOWBIT_ERROR_INVALID_ARGUMENT: return "LOWBIT_ERROR_INVALID_ARGUMENT";
    case LOWBIT_ERROR_NULL_POINTER: return "LOWBIT_ERROR_NULL_POINTER";
    case LOWBIT_ERROR_UNSUPPORTED: return "LOWBIT_ERROR_UNSUPPORTED";
    case LOWBIT_ERROR_OUT_OF_MEMORY: return "LOWBIT_ERROR_OUT_OF_MEMORY";
    case LOWBIT_ERROR_INVALID_STATE: return "LOWBIT_ERROR_INVALID_STATE";
    case LOWBIT_ERROR_CUDA: return "LOWBIT_ERROR_CUDA";
    case LOWBIT_ERROR_NONFINITE: return "LOWBIT_ERROR_NONFINITE";
    case LOWBIT_ERROR_COMMUNICATION: return "LOWBIT_ERROR_COMMUNICATION";
    default: break;
  }
  return "error";
}

const char* error_format_name(int32_t f) {
  switch (f) {
    case LOWBIT_COMM_ERROR_FP32: return "LOWBIT_COMM_ERROR_FP32";
    case LOWBIT_COMM_ERROR_BF16: return "LOWBIT_COMM_ERROR_BF16";
    case LOWBIT_COMM_ERROR_INT8: return "LOWBIT_COMM_ERROR_INT8";
    default: break;
  }
  return "an unknown error format";
}

const char* op_name(int64_t op) {
  switch (op) {
    case kOpCompressedAllreduce: return "lowbit_comm_compressed_allreduce";
    case kOpAllreduceMean: return "lowbit_comm_allreduce_mean";
    case kOpSetTimeout: return "the timeout agreement of lowbit_comm_create_mpi*";
    case kOpAgreeOnly: return "a step's argument agreement (no exchange)";
    case kOpCompressedReduceScatter: return "lowbit_comm_compressed_reduce_scatter";
    case kOpSetErrorFormat: return "the error-format agreement of lowbit_comm_create_mpi*";
    default: break;
  }
  return "an unknown collective";
}

// The names of a caller that gave none.
const char* generic_kind(int32_t kind) { return kind == 0 ? "directly" : "from a caller of another kind"; }
const char* generic_subject(int32_t) { return "the caller"; }
const char* generic_stage(int32_t) { return "another stage"; }
const CallerNames kGenericNames{generic_kind, generic_subject, generic_stage, "stage boundary", "parts"};

// The value of `other` in [lo, hi] that is not `mine` (the two ends of the
// range over ranks; some rank holds each).
int64_t other_end(int64_t mine, int64_t lo, int64_t hi) { return mine == lo ? hi : lo; }

constexpr int kFields = 9;  // caller kind, boundary, stage, parts, op, numel, dtype, step, world
constexpr int kWorldField = 8;
constexpr int kAgreeWords = 2 + 2 * kFields;
constexpr size_t kMessageBytes = 512;

}  // namespace

// Over MPI, every rank learns every other rank's verdict on its arguments
// (kAgreeWords int64, MPI_MAX) before anything is exchanged or updated:
//   v[0]  W - (this rank) if its local checks failed, else 0 (max: the lowest failed rank)
//   v[1]  W - (this rank) if its input is not finite, else 0
//   v[2 + 2i], v[3 + 2i]  field i and its negation (max of both: the range over
//                         the ranks that did not fail; a failed rank sends INT64_MIN,
//                         and so does a caller that does not know its step count,
//                         which the host does not know without waiting)
// The fields are everything that decides the sequence of exchanges (the
// operation, the caller's stage and what fixes it, numel, which fixes the
// padding and chunking, dtype), the caller (its kind, stage, stage
// boundary, number of parts and, where known, step count) and the world size
// this rank's transport declares (every rank has a say in it, a failed one
// too: a callback transport's world_size is the caller's word, and ranks that
// disagree on it would lay the messages out differently). When some rank
// failed, its message (and status) follows in one 512-byte broadcast from
// the lowest failed rank, so every rank can say why.
int Communicator::Impl::agree(lowbit_status_t status, const std::string& message, CommOp op, int64_t n,
                              lowbit_dtype_t dtype, const CollectiveCaller& who, bool nonfinite) {
  const int32_t W = world(), R = rank();
  const bool failed = status != LOWBIT_SUCCESS;
  // The dtype field carries the error format above its low 8 bits (0 for
  // fp32: the words of earlier releases).
  const int64_t dtype_field = int64_t(dtype) + (int64_t(error_format) << 8);
  const int64_t fields[kFields] = {who.kind, who.boundary, who.stage, who.parts, op, n, dtype_field, who.step, W};
  int64_t v[kAgreeWords];
  v[0] = failed ? W - R : 0;
  v[1] = (!failed && nonfinite) ? W - R : 0;
  for (int i = 0; i < kFields; ++i) {
    const int64_t f = fields[i] == INT64_MIN ? INT64_MIN + 1 : fields[i];
    // A failed rank, and a rank that does not know its step count, have no say.
    const bool neutral = i != kWorldField && (failed || (i == 7 && who.step < 0));
    v[2 + 2 * i] = neutral ? INT64_MIN : f;
    v[3 + 2 * i] = neutral ? INT64_MIN : -f;
  }
  if (!t->agree_max(v, kAgreeWords)) {  // NCCL: no agreement
    if (failed) throw Error(status, message);
    return nonfinite ? R : -1;
  }
  // Every rank reads the same reduced v, so every rank reaches the same
  // verdict below (a field no rank had a say in is INT64_MIN in both words).
  auto lo = [&](int i) { return v[3 + 2 * i] == INT64_MIN ? INT64_MIN : -v[3 + 2 * i]; };
  auto hi = [&](int i) { return v[2 + 2 * i]; };
  auto differs = [&](int i) { return lo(i) != hi(i); };
  const char* nothing = ". Nothing was done on any rank";
  // First, as the ranks of a failed one below are counted from the world size.
  if (differs(kWorldField)) {
    if (failed) throw Error(status, message);
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, "the transport's world_size is ", W, " on this rank (", R,
         "), but the ranks declare world_size from ", lo(kWorldField), " to ", hi(kWorldField),
         "; every rank must declare the same world_size (lowbit_comm_transport_t.world_size)", nothing);
  }
  if (v[0] != 0) {
    // The lowest failed rank tells every rank why.
    const int root = int(W - v[0]);
    char why[kMessageBytes] = {};
    if (R == root) {
      const std::string text = concat(message, " [", status_name(status), "]");
      std::memcpy(why, text.data(), std::min(text.size(), kMessageBytes - 1));
    }
    t->broadcast(why, int64_t(kMessageBytes), root);
    why[kMessageBytes - 1] = '\0';
    if (failed) throw Error(status, message);
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, "rank ", root, " rejected its arguments: ", why,
         "; nothing was done on any rank");
  }
  const CallerNames& names = who.names ? *who.names : kGenericNames;
  const char* subject = names.subject(who.kind);
  if (differs(0))
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, "this rank (", R, ") calls ", op_name(op), " ", names.kind(who.kind),
         ", but some rank calls it ", names.kind(int32_t(other_end(who.kind, lo(0), hi(0)))),
         ": every rank must make the same collective calls in the same order", nothing);
  if (differs(1))
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, subject, ": ", names.boundary, " is ", who.boundary, " on this rank (", R,
         "), but the ranks have ", names.boundary, " from ", lo(1), " to ", hi(1), "; every rank must use the same ",
         names.boundary, " (or the ranks change stage at different steps)", nothing);
  if (differs(2))
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, subject, ": this rank (", R, ") is in ", names.stage(who.stage),
         ", but some rank is in ", names.stage(int32_t(other_end(who.stage, lo(2), hi(2)))),
         "; the ranks hold different step counts (restore the same checkpoint on every rank, or set the same "
         "step with lowbit_optimizer_set_step)", nothing);
  if (differs(7))
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, subject, ": this rank (", R, ") is at step ",
         who.step >= 0 ? std::to_string(who.step) : std::string("? (CUDA: not known to the host)"),
         ", but the ranks are at steps ", lo(7), " to ", hi(7),
         "; every rank must be at the same step (restore the same checkpoint on every rank, or set the same "
         "step with lowbit_optimizer_set_step)", nothing);
  if (differs(3))
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, subject, ": ", who.parts, " ", names.parts, " are registered on this rank (",
         R, "), but the ranks have from ", lo(3), " to ", hi(3), "; every rank must register the same ", names.parts,
         nothing);
  if (differs(4))
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, "this rank (", R, ") calls ", op_name(op), ", but some rank calls ",
         op_name(other_end(op, lo(4), hi(4))), ": every rank must make the same collective calls in the same order",
         nothing);
  if (differs(5) && op == kOpSetTimeout)
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, "the communicator timeout is ", n, " ms on this rank (", R,
         "), but the ranks asked for ", lo(5), " to ", hi(5),
         " ms; every rank must use the same (config.timeout_ms, or the environment variable "
         "LOWBIT_COMM_TIMEOUT_MS, which overrides it; they must all wait the same way)");
  if (differs(5) && op == kOpSetErrorFormat)
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, "config.error_format is ", error_format_name(int32_t(n)), " on this rank (",
         R, "), but the ranks asked for ", error_format_name(int32_t(lo(5))), " to ",
         error_format_name(int32_t(hi(5))), "; every rank must keep its errors in the same format", nothing);
  if (differs(6) && (lo(6) >> 8) != (hi(6) >> 8))
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, "this rank (", R, ") keeps its errors in ", error_format_name(error_format),
         ", but some rank keeps them in ",
         error_format_name(int32_t(other_end(dtype_field, lo(6), hi(6)) >> 8)),
         " (lowbit_comm_config_t.error_format); every rank must use the same format", nothing);
  if (differs(5))
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.numel is ", n, " here, but the ranks passed numel from ", lo(5),
         " to ", hi(5), "; every rank must pass the same numel", nothing);
  if (differs(6))
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.dtype is ", dtype_name(dtype), " here, but the ranks passed dtype ",
         dtype_name(lowbit_dtype_t(other_end(dtype_field, lo(6), hi(6)) & 0xFF)), "; every rank must pass the same dtype",
         nothing);
  return v[1] != 0 ? int(W - v[1]) : -1;
}

void Communicator::Impl::set_timeout(int64_t ms, lowbit_status_t status, const std::string& message) {
  agree(status, message, kOpSetTimeout, ms, LOWBIT_DTYPE_FLOAT32, CollectiveCaller(), false);
  t->set_timeout_ms(ms);
}

void Communicator::set_timeout(int64_t ms) {
  if (ms < 0 || ms > INT32_MAX)
    impl_->set_timeout(0, LOWBIT_ERROR_INVALID_ARGUMENT,
                       concat("timeout_ms is ", ms, " (expected 0 = wait forever, or 1 to ", INT32_MAX, " ms)"));
  else
    impl_->set_timeout(ms, LOWBIT_SUCCESS, std::string());
}

void Communicator::set_timeout_from(int64_t config_ms) {
  const char* env = std::getenv("LOWBIT_COMM_TIMEOUT_MS");
  if (!env || !*env) {
    if (config_ms < 0 || config_ms > INT32_MAX)
      impl_->set_timeout(0, LOWBIT_ERROR_INVALID_ARGUMENT,
                         concat("config.timeout_ms is ", config_ms, " (expected 0 = wait forever, or 1 to ", INT32_MAX,
                                " ms)"));
    else
      impl_->set_timeout(config_ms, LOWBIT_SUCCESS, std::string());
    return;
  }
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(env, &end, 10);
  if (errno == 0 && end != env && *end == '\0' && v >= 0 && v <= INT32_MAX)
    impl_->set_timeout(int64_t(v), LOWBIT_SUCCESS, std::string());
  else
    impl_->set_timeout(0, LOWBIT_ERROR_INVALID_ARGUMENT,
                       concat("the environment variable LOWBIT_COMM_TIMEOUT_MS is \"", env,
                              "\" (expected milliseconds: 0 = wait forever, or 1 to ", INT32_MAX, ")"));
}

int64_t Communicator::timeout_ms() const { return impl_->t->timeout_ms(); }

void Communicator::check_error_format(int32_t format) {
  LOWBIT_REQUIRE(format >= LOWBIT_COMM_ERROR_FP32 && format <= LOWBIT_COMM_ERROR_INT8, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "config.error_format is ", format,
                 " (expected 0 LOWBIT_COMM_ERROR_FP32, 1 LOWBIT_COMM_ERROR_BF16 or 2 LOWBIT_COMM_ERROR_INT8)");
}

void Communicator::set_error_format(int32_t format) {
  check_error_format(format);
  Impl& I = *impl_;
  LOWBIT_REQUIRE(format == I.error_format || (!I.bound && !I.has_pending), LOWBIT_ERROR_INVALID_STATE,
                 "the error format cannot change once the communicator holds errors");
  if (format != I.error_format) I.buf = onebit::Buffers();  // workspaces of the old format's sizes
  I.error_format = format;
}

void Communicator::agree_error_format(int32_t format) {
  Impl& I = *impl_;
  std::string why;
  try {
    check_error_format(format);
  } catch (const Error& e) {
    why = e.what();
  }
  I.agree(why.empty() ? LOWBIT_SUCCESS : LOWBIT_ERROR_INVALID_ARGUMENT, why, kOpSetErrorFormat,
          why.empty() ? format : 0, LOWBIT_DTYPE_FLOAT32, CollectiveCaller(), false);
  set_error_format(format);
}

int32_t Communicator::error_format() const { return impl_->error_format; }

void Communicator::agree_only(const CollectiveCaller& who) {
  impl_->agree(LOWBIT_SUCCESS, std::string(), kOpAgreeOnly, 0, LOWBIT_DTYPE_FLOAT32, who, false);
}

void Communicator::fail_collective(lowbit_status_t status, const std::string& message, const CollectiveCaller& who) {
  if (status == LOWBIT_SUCCESS) status = LOWBIT_ERROR_INTERNAL;
  impl_->agree(status, message, kOpNone, 0, LOWBIT_DTYPE_FLOAT32, who, false);
  throw Error(status, message);  // not reached: agree throws for a failed rank
}

}  // namespace lowbit
