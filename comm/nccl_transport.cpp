// NCCL transport. libnccl is opened at run time (dlopen), so the library
// never needs it to load; nccl.h is used for the types only.
#include "transport.hpp"

#include "core/error.hpp"

#ifdef LOWBIT_HAVE_NCCL
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "cuda/runtime.hpp"
#endif

namespace lowbit {

#ifdef LOWBIT_HAVE_NCCL
namespace {

struct NcclApi {
  bool loaded = false;
  std::string error;
  int version = 0;
  ncclResult_t (*GetVersion)(int*) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommCount)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*CommUserRank)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*CommCuDevice)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
};

template <class F>
bool load_symbol(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn) {
    error = std::string("symbol ") + name + " not found in libnccl";
    return false;
  }
  return true;
}

const NcclApi& nccl() {
  static NcclApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("LOWBIT_NCCL_LIBRARY");
    const char* names[] = {env && *env ? env : "libnccl.so.2", "libnccl.so"};
    void* lib = nullptr;
    std::string errors;
    for (const char* name : names) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
      const char* e = dlerror();
      errors += std::string(errors.empty() ? "" : "; ") + (e ? e : name);
      if (env && *env) break;  // an explicit path is not second-guessed
    }
    if (!lib) {
      api.error = "libnccl could not be loaded (" + errors + "); set LOWBIT_NCCL_LIBRARY to its path";
      return;
    }
    std::string& e = api.error;
    bool ok = load_symbol(lib, "ncclGetVersion", api.GetVersion, e) &&
              load_symbol(lib, "ncclGetUniqueId", api.GetUniqueId, e) &&
              load_symbol(lib, "ncclCommInitRank", api.CommInitRank, e) &&
              load_symbol(lib, "ncclCommDestroy", api.CommDestroy, e) &&
              load_symbol(lib, "ncclCommCount", api.CommCount, e) &&
              load_symbol(lib, "ncclCommUserRank", api.CommUserRank, e) &&
              load_symbol(lib, "ncclCommCuDevice", api.CommCuDevice, e) &&
              load_symbol(lib, "ncclAllReduce", api.AllReduce, e) &&
              load_symbol(lib, "ncclAllGather", api.AllGather, e) && load_symbol(lib, "ncclSend", api.Send, e) &&
              load_symbol(lib, "ncclRecv", api.Recv, e) && load_symbol(lib, "ncclGroupStart", api.GroupStart, e) &&
              load_symbol(lib, "ncclGroupEnd", api.GroupEnd, e) &&
              load_symbol(lib, "ncclGetErrorString", api.GetErrorString, e);
    if (!ok) return;  // the library stays open: harmless
    if (api.GetVersion(&api.version) != ncclSuccess) {
      api.error = "ncclGetVersion failed";
      return;
    }
    if (api.version < 20700) {
      api.error = "libnccl version " + std::to_string(api.version) + " is too old (need >= 2.7 for send/recv)";
      return;
    }
    api.loaded = true;
  });
  LOWBIT_REQUIRE(api.loaded, LOWBIT_ERROR_UNSUPPORTED, "NCCL: ", api.error);
  return api;
}

void check_nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  fail(LOWBIT_ERROR_COMMUNICATION, what, " failed: ", nccl().GetErrorString(r));
}

class NcclTransport final : public Transport {
 public:
  NcclTransport(ncclComm_t comm, bool owned) : comm_(comm), owned_(owned) {
    const NcclApi& api = nccl();
    check_nccl(api.CommUserRank(comm_, &rank_), "ncclCommUserRank");
    check_nccl(api.CommCount(comm_, &world_), "ncclCommCount");
    check_nccl(api.CommCuDevice(comm_, &device_), "ncclCommCuDevice");
  }
  ~NcclTransport() override {
    if (owned_ && comm_) nccl().CommDestroy(comm_);
  }
  lowbit_comm_backend_t backend() const override { return LOWBIT_COMM_BACKEND_NCCL; }
  int32_t rank() const override { return rank_; }
  int32_t world() const override { return world_; }
  bool supports_host() const override { return false; }
  bool device_direct() const override { return true; }
  bool stream_ordered() const override { return true; }
  int32_t device_index() const override { return device_; }
  bool agree_max(int64_t*, int) override { return false; }
  void broadcast(void*, int64_t, int) override {
    fail(LOWBIT_ERROR_INTERNAL, "communicator: no host broadcast over NCCL");
  }

  void alltoall(const void* send, void* recv, int64_t m, void* stream) override {
    const NcclApi& api = nccl();
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    check_nccl(api.GroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    for (int p = 0; p < world_ && r == ncclSuccess; ++p) {
      r = api.Send(static_cast<const uint8_t*>(send) + int64_t(p) * m, size_t(m), ncclUint8, p, comm_, s);
      if (r == ncclSuccess)
        r = api.Recv(static_cast<uint8_t*>(recv) + int64_t(p) * m, size_t(m), ncclUint8, p, comm_, s);
    }
    const ncclResult_t e = api.GroupEnd();
    check_nccl(r, "ncclSend/ncclRecv (all-to-all)");
    check_nccl(e, "ncclGroupEnd (all-to-all)");
  }
  void allgather(const void* send, void* recv, int64_t m, void* stream) override {
    check_nccl(nccl().AllGather(send, recv, size_t(m), ncclUint8, comm_, static_cast<cudaStream_t>(stream)),
               "ncclAllGather");
  }
  bool allreduce_f32(float* data, int64_t n, void* stream) override {
    const NcclApi& api = nccl();
    const bool avg = api.version >= 21000;  // ncclAvg since 2.10
    check_nccl(api.AllReduce(data, data, size_t(n), ncclFloat32, avg ? ncclAvg : ncclSum, comm_,
                             static_cast<cudaStream_t>(stream)),
               "ncclAllReduce");
    return avg;
  }

 private:
  ncclComm_t comm_ = nullptr;
  bool owned_ = false;
  int rank_ = 0, world_ = 1, device_ = 0;
};

}  // namespace

void nccl_unique_id(void* out128) {
  LOWBIT_REQUIRE(out128 != nullptr, LOWBIT_ERROR_NULL_POINTER, "out_id is NULL");
  ncclUniqueId id;
  check_nccl(nccl().GetUniqueId(&id), "ncclGetUniqueId");
  std::memcpy(out128, &id, sizeof(id));
}

std::unique_ptr<Transport> make_nccl_transport(const void* unique_id, int32_t rank, int32_t world,
                                               int32_t device_index) {
  static_assert(sizeof(ncclUniqueId) == LOWBIT_NCCL_UNIQUE_ID_BYTES, "ncclUniqueId size");
  LOWBIT_REQUIRE(unique_id != nullptr, LOWBIT_ERROR_NULL_POINTER, "unique_id is NULL");
  LOWBIT_REQUIRE(world >= 1, LOWBIT_ERROR_INVALID_ARGUMENT, "world is ", world, " (must be >= 1)");
  LOWBIT_REQUIRE(rank >= 0 && rank < world, LOWBIT_ERROR_INVALID_ARGUMENT, "rank is ", rank, " (must be in [0, ",
                 world, "))");
  const NcclApi& api = nccl();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  LOWBIT_REQUIRE(count > 0, LOWBIT_ERROR_UNSUPPORTED, "NCCL needs a CUDA device, and this process sees none");
  LOWBIT_REQUIRE(device_index >= 0 && device_index < count, LOWBIT_ERROR_INVALID_ARGUMENT, "device_index is ",
                 device_index, " (this process sees ", count, " CUDA device(s))");
  ncclUniqueId id;
  std::memcpy(&id, unique_id, sizeof(id));
  ncclComm_t comm = nullptr;
  ncclResult_t r;
  {
    cuda::DeviceGuard guard(device_index);  // NCCL binds the communicator to the current device
    r = api.CommInitRank(&comm, world, id, rank);
  }
  check_nccl(r, "ncclCommInitRank");
  try {
    return std::make_unique<NcclTransport>(comm, true);
  } catch (...) {
    api.CommDestroy(comm);
    throw;
  }
}

std::unique_ptr<Transport> make_nccl_transport_from_comm(void* nccl_comm) {
  LOWBIT_REQUIRE(nccl_comm != nullptr, LOWBIT_ERROR_NULL_POINTER, "nccl_comm is NULL");
  return std::make_unique<NcclTransport>(static_cast<ncclComm_t>(nccl_comm), false);
}

#else  // !LOWBIT_HAVE_NCCL

namespace {
[[noreturn]] void no_nccl(const char* fn) {
  fail(LOWBIT_ERROR_UNSUPPORTED, fn,
       ": this lowbit was built without NCCL support (needs CUDA and nccl.h at configure time)");
}
}  // namespace

void nccl_unique_id(void*) { no_nccl("lowbit_comm_nccl_unique_id"); }
std::unique_ptr<Transport> make_nccl_transport(const void*, int32_t, int32_t, int32_t) {
  no_nccl("lowbit_comm_create_nccl");
}
std::unique_ptr<Transport> make_nccl_transport_from_comm(void*) { no_nccl("lowbit_comm_create_nccl_comm"); }

#endif

}  // namespace lowbit
