// The uncompressed mean over ranks (host tensors, and device tensors
// stream-ordered, device-direct or staged through pinned memory).
#include <cstring>
#include <string>

#include "communicator_impl.hpp"
#include "core/error.hpp"
#ifdef LOWBIT_HAVE_CUDA
#include "cuda/runtime.hpp"
#include "device.hpp"
#endif

namespace lowbit {

void Communicator::allreduce_mean(float* data, int64_t n, lowbit_device_t device, int32_t device_index,
                                  void* stream, const CollectiveCaller& who) {
  const lowbit_tensor_t t = comm_tensor(data, n, device, device_index);
  allreduce_mean(&t, stream, who);
}

void Communicator::allreduce_mean(const lowbit_tensor_t* tensor, void* stream, const CollectiveCaller& who) {
  Impl& I = *impl_;
  Transport& T = *I.t;
  CommArg a;
  // Under a timeout, MPI works on buffers of ours only: a timed-out
  // operation may still complete later, and must not touch the tensor then.
  const bool own_buffers = T.timeout_ms() > 0;
  Failure f;
  try {
    a = I.check_tensor(tensor);
    // Staging buffers are grown before the agreement: a rank that cannot
    // allocate one fails there, with the others, not in the middle.
    if (own_buffers && a.device == LOWBIT_DEVICE_CPU && I.host_stage.size() < size_t(a.n))
      I.host_stage.resize(size_t(a.n));
#ifdef LOWBIT_HAVE_CUDA
    const size_t bytes = size_t(a.n) * 4;
    if (a.device == LOWBIT_DEVICE_CUDA && !T.stream_ordered() && (!T.device_direct() || own_buffers) &&
        I.mean_stage.bytes() < bytes) {
      cuda::DeviceGuard guard(a.index);
      I.mean_stage = onebit::Mem();
      I.mean_stage = onebit::Mem(onebit::MemKind::Pinned, bytes);
    }
#endif
  } catch (...) {
    f = current_failure("out of host memory (the staging buffer of allreduce_mean)");
  }
  I.agree(f.status, f.message, kOpAllreduceMean, a.n, tensor ? tensor->dtype : LOWBIT_DTYPE_FLOAT32, who, false);
  const int32_t W = I.world();
  const float fw = float(W);
  if (a.device == LOWBIT_DEVICE_CPU) {
    if (own_buffers) {
      float* h = I.host_stage.data();
      std::memcpy(h, a.data, size_t(a.n) * 4);
      const bool averaged = T.allreduce_f32(h, a.n, stream);
      for (int64_t i = 0; i < a.n; ++i) a.data[i] = averaged ? h[i] : h[i] / fw;
    } else if (!T.allreduce_f32(a.data, a.n, stream)) {
      for (int64_t i = 0; i < a.n; ++i) a.data[i] = a.data[i] / fw;
    }
  } else {
#ifdef LOWBIT_HAVE_CUDA
    cuda::DeviceGuard guard(a.index);
    bool averaged;
    if (T.stream_ordered()) {
      averaged = T.allreduce_f32(a.data, a.n, stream);
    } else if (T.device_direct() && !own_buffers) {
      onebit::dev::sync(stream);
      averaged = T.allreduce_f32(a.data, a.n, stream);
    } else {
      const size_t bytes = size_t(a.n) * 4;
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

}  // namespace lowbit
