// A transport of the caller's functions (lowbit_comm_transport_t): the
// communicator's exchanges and argument agreement through callbacks, e.g.
// torch.distributed collectives called back from Python.
#include <cstddef>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "transport.hpp"

namespace lowbit {
namespace {

class CallbackTransport final : public Transport {
 public:
  explicit CallbackTransport(const lowbit_comm_transport_t& t) : t_(t) {}

  lowbit_comm_backend_t backend() const override { return LOWBIT_COMM_BACKEND_CALLBACKS; }
  int32_t rank() const override { return t_.rank; }
  int32_t world() const override { return t_.world_size; }
  bool supports_host() const override { return t_.host_buffers != 0; }
  bool device_direct() const override { return t_.device_buffers != 0; }
  bool stream_ordered() const override { return t_.stream_ordered != 0; }
  int32_t device_index() const override { return t_.device_index; }

  bool in_callback() const override { return depth_ > 0; }

  bool agree_max(int64_t* v, int k) override {
    if (!t_.allreduce_max_i64) return false;
    check(call(t_.allreduce_max_i64, v, k), "allreduce_max_i64 (argument agreement)");
    return true;
  }
  // Over the agreement function (called only after agree_max succeeded):
  // 4 bytes per int64 word, -1 from every rank but the root, so the maximum
  // is the root's.
  void broadcast(void* data, int64_t m, int root) override {
    LOWBIT_REQUIRE(t_.allreduce_max_i64 != nullptr, LOWBIT_ERROR_INTERNAL,
                   "transport: broadcast without allreduce_max_i64");
    std::vector<int64_t> w(size_t((m + 3) / 4), -1);
    uint8_t* bytes = static_cast<uint8_t*>(data);
    if (rank() == root)
      for (int64_t i = 0; i < m; i += 4) {
        uint32_t u = 0;
        std::memcpy(&u, bytes + i, size_t(m - i < 4 ? m - i : 4));
        w[size_t(i / 4)] = int64_t(u);
      }
    check(call(t_.allreduce_max_i64, w.data(), int32_t(w.size())), "allreduce_max_i64 (broadcast)");
    if (rank() != root)
      for (int64_t i = 0; i < m; i += 4) {
        const uint32_t u = uint32_t(w[size_t(i / 4)]);
        std::memcpy(bytes + i, &u, size_t(m - i < 4 ? m - i : 4));
      }
  }
  void alltoall(const void* send, void* recv, int64_t m, void* stream) override {
    check(call(t_.alltoall, send, recv, m, stream), "alltoall");
  }
  void allgather(const void* send, void* recv, int64_t m, void* stream) override {
    check(call(t_.allgather, send, recv, m, stream), "allgather");
  }
  bool allreduce_f32(float* data, int64_t n, void* stream) override {
    check(call(t_.allreduce_sum_f32, data, n, stream), "allreduce_sum_f32");
    return false;
  }

 private:
  // One of the caller's functions, counted as running while it runs.
  template <class Fn, class... Args>
  int32_t call(Fn* fn, Args... args) {
    struct Depth {
      int& d;
      explicit Depth(int& x) : d(x) { ++d; }
      ~Depth() { --d; }
    } depth(depth_);
    return fn(t_.user_data, args...);
  }
  static void check(int32_t rc, const char* what) {
    LOWBIT_REQUIRE(rc == 0, LOWBIT_ERROR_COMMUNICATION, "transport.", what, " returned ", rc,
                   " (the caller's transport failed; treat the group as broken)");
  }
  lowbit_comm_transport_t t_;
  int depth_ = 0;  // the caller's functions running now (nested through another communicator)
};

}  // namespace

std::unique_ptr<Transport> make_callback_transport(const lowbit_comm_transport_t* t) {
  LOWBIT_REQUIRE(t != nullptr, LOWBIT_ERROR_NULL_POINTER, "transport is NULL");
  LOWBIT_REQUIRE(t->world_size >= 1, LOWBIT_ERROR_INVALID_ARGUMENT, "transport.world_size is ", t->world_size,
                 " (must be >= 1)");
  LOWBIT_REQUIRE(t->rank >= 0 && t->rank < t->world_size, LOWBIT_ERROR_INVALID_ARGUMENT, "transport.rank is ",
                 t->rank, " (must be in [0, world_size = ", t->world_size, "))");
  LOWBIT_REQUIRE(t->host_buffers == 0 || t->host_buffers == 1, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "transport.host_buffers is ", t->host_buffers, " (expected 0 or 1)");
  LOWBIT_REQUIRE(t->device_buffers == 0 || t->device_buffers == 1, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "transport.device_buffers is ", t->device_buffers, " (expected 0 or 1)");
  LOWBIT_REQUIRE(t->stream_ordered == 0 || t->stream_ordered == 1, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "transport.stream_ordered is ", t->stream_ordered, " (expected 0 or 1)");
  LOWBIT_REQUIRE(t->host_buffers || t->device_buffers, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "transport.host_buffers and transport.device_buffers are both 0 (it must move some memory)");
  LOWBIT_REQUIRE(!t->stream_ordered || t->device_buffers, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "transport.stream_ordered is 1 but transport.device_buffers is 0 (only device exchanges can be "
                 "stream-ordered)");
  LOWBIT_REQUIRE(t->device_index >= -1, LOWBIT_ERROR_INVALID_ARGUMENT, "transport.device_index is ",
                 t->device_index, " (a CUDA device index, or -1 for any)");
  LOWBIT_REQUIRE(t->alltoall != nullptr, LOWBIT_ERROR_NULL_POINTER, "transport.alltoall is NULL");
  LOWBIT_REQUIRE(t->allgather != nullptr, LOWBIT_ERROR_NULL_POINTER, "transport.allgather is NULL");
  LOWBIT_REQUIRE(t->allreduce_sum_f32 != nullptr, LOWBIT_ERROR_NULL_POINTER, "transport.allreduce_sum_f32 is NULL");
  return std::make_unique<CallbackTransport>(*t);
}

}  // namespace lowbit
