// Argument checks of the collective calls, and their agreement over ranks.
#include <climits>
#include <cstdint>
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
  LOWBIT_REQUIRE(tensor->numel <= (INT64_MAX >> 8), LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.numel is ", tensor->numel,
                 " (too large)");
  LOWBIT_REQUIRE(tensor->dtype == LOWBIT_DTYPE_FLOAT32, LOWBIT_ERROR_INVALID_ARGUMENT, "tensor.dtype is ",
                 dtype_name(tensor->dtype), " (the communicator takes LOWBIT_DTYPE_FLOAT32 only)");
  LOWBIT_REQUIRE(reinterpret_cast<uintptr_t>(tensor->data) % alignof(float) == 0, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "tensor.data (", tensor->data, ") is not aligned to 4 bytes");
  CommArg a;
  a.data = static_cast<float*>(tensor->data);
  a.n = tensor->numel;
  a.device = tensor->device;
  a.index = tensor->device_index;
  if (tensor->device == LOWBIT_DEVICE_CPU) {
    LOWBIT_REQUIRE(t->supports_host(), LOWBIT_ERROR_UNSUPPORTED,
                   "tensor.device is LOWBIT_DEVICE_CPU, but an NCCL communicator moves CUDA tensors only");
    a.index = 0;
  } else if (tensor->device == LOWBIT_DEVICE_CUDA) {
#ifdef LOWBIT_HAVE_CUDA
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

}  // namespace lowbit
