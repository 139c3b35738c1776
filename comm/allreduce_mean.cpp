// The uncompressed mean over ranks (host tensors, and device tensors
// stream-ordered, device-direct or staged through pinned memory).
#include <string>

#include "communicator_impl.hpp"
#include "core/error.hpp"
#ifdef LOWBIT_HAVE_CUDA
#include "cuda/runtime.hpp"
#include "device.hpp"
#endif

namespace lowbit {

void Communicator::allreduce_mean(float* data, int64_t n, lowbit_device_t device, int32_t device_index,
                                  void* stream) {
  const lowbit_tensor_t t = comm_tensor(data, n, device, device_index);
  allreduce_mean(&t, stream);
}

void Communicator::allreduce_mean(const lowbit_tensor_t* tensor, void* stream) {
  Impl& I = *impl_;
  Transport& T = *I.t;
  lowbit_status_t st = LOWBIT_SUCCESS;
  std::string msg;
  CommArg a;
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
#ifdef LOWBIT_HAVE_CUDA
    cuda::DeviceGuard guard(a.index);
    bool averaged;
    if (T.stream_ordered()) {
      averaged = T.allreduce_f32(a.data, a.n, stream);
    } else if (T.device_direct()) {
      onebit::dev::sync(stream);
      averaged = T.allreduce_f32(a.data, a.n, stream);
    } else {
      const size_t bytes = size_t(a.n) * 4;
      if (I.mean_stage.bytes() < bytes) {
        I.mean_stage = onebit::Mem();
        I.mean_stage = onebit::Mem(onebit::MemKind::Pinned, bytes);
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

}  // namespace lowbit
