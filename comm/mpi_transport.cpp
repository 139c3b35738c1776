// MPI transport: a duplicate of the caller's communicator with
// MPI_ERRORS_RETURN, so MPI failures become LOWBIT_ERROR_COMMUNICATION.
// With a timeout (config.timeout_ms / LOWBIT_COMM_TIMEOUT_MS) every exchange is a nonblocking collective
// polled with MPI_Test until it completes or the timeout expires.
#include "transport.hpp"

#include "core/error.hpp"

#ifdef LOWBIT_HAVE_MPI
// The C API of MPI only (no C++ bindings to link).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif
#endif

namespace lowbit {

#ifdef LOWBIT_HAVE_MPI
namespace {

std::string mpi_error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, size_t(len));
}

void check_mpi(int code, const char* what) {
  if (code != MPI_SUCCESS) fail(LOWBIT_ERROR_COMMUNICATION, what, " failed: ", mpi_error_text(code));
}

// Runtime CUDA-awareness of the MPI library (Open MPI's extension; MPICH 4's
// MPIX_GPU_query_support).
bool mpi_is_cuda_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  return MPIX_Query_cuda_support() == 1;
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  int is = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &is) != MPI_SUCCESS) return false;
  return is != 0;
#else
  return false;
#endif
}

// Checks that `c` is a usable intra-communicator without letting MPI abort
// the job: an invalid communicator raises the error handler of
// MPI_COMM_WORLD (Open MPI 4, MPICH), which is MPI_ERRORS_ARE_FATAL unless the
// caller changed it, so MPI_ERRORS_RETURN is set on MPI_COMM_WORLD for the
// two probing calls and the caller's handler put back after them.
void probe_comm(MPI_Comm c, const char* name, const std::string& shown) {
  MPI_Errhandler saved = MPI_ERRHANDLER_NULL;
  const bool swapped = MPI_Comm_get_errhandler(MPI_COMM_WORLD, &saved) == MPI_SUCCESS &&
                       MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN) == MPI_SUCCESS;
  int inter = 0, size = 0;
  int rc = MPI_Comm_test_inter(c, &inter);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(c, &size);
  if (swapped) MPI_Comm_set_errhandler(MPI_COMM_WORLD, saved);
  if (saved != MPI_ERRHANDLER_NULL) MPI_Errhandler_free(&saved);
  LOWBIT_REQUIRE(rc == MPI_SUCCESS, LOWBIT_ERROR_INVALID_ARGUMENT, name, " is ", shown,
                 ", not a valid MPI communicator (", mpi_error_text(rc), ")");
  LOWBIT_REQUIRE(!inter, LOWBIT_ERROR_INVALID_ARGUMENT, name, " is ", shown,
                 ", an inter-communicator (need an intra-communicator)");
}

class MpiTransport final : public Transport {
 public:
  // `name` and `shown` name the caller's argument in messages.
  MpiTransport(MPI_Comm user, int32_t cuda_aware, const char* name, const std::string& shown) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    LOWBIT_REQUIRE(initialized && !finalized, LOWBIT_ERROR_INVALID_STATE, name, ": MPI is ",
                   finalized ? "already finalized" : "not initialized (call MPI_Init first)");
    LOWBIT_REQUIRE(user != MPI_COMM_NULL, LOWBIT_ERROR_INVALID_ARGUMENT, name, " is MPI_COMM_NULL");
    LOWBIT_REQUIRE(cuda_aware >= -1 && cuda_aware <= 1, LOWBIT_ERROR_INVALID_ARGUMENT,
                   "config.cuda_aware_mpi is ", cuda_aware, " (expected -1 auto, 0 never, 1 always)");
    probe_comm(user, name, shown);
    check_mpi(MPI_Comm_dup(user, &comm_), concat("MPI_Comm_dup(", name, ")").c_str());
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_);
    agree_buf_.resize(64);
#ifdef LOWBIT_HAVE_CUDA
    direct_ = cuda_aware == 1 || (cuda_aware == -1 && mpi_is_cuda_aware());
#else
    (void)cuda_aware;
    direct_ = false;
#endif
  }
  ~MpiTransport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // After a timeout an operation on comm_ is still pending: leave it be.
    if (!finalized && comm_ != MPI_COMM_NULL && broken_.empty()) MPI_Comm_free(&comm_);
  }

  lowbit_comm_backend_t backend() const override { return LOWBIT_COMM_BACKEND_MPI; }
  int32_t rank() const override { return rank_; }
  int32_t world() const override { return world_; }
  bool supports_host() const override { return true; }
  bool device_direct() const override { return direct_; }
  bool stream_ordered() const override { return false; }
  int64_t timeout_ms() const override { return timeout_ms_; }
  void set_timeout_ms(int64_t ms) override {
    usable();
    timeout_ms_ = ms;
  }
  bool broken() const override { return !broken_.empty(); }

  bool agree_max(int64_t* v, int k) override {
    usable();
    if (timeout_ms_ <= 0) {
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, v, k, MPI_INT64_T, MPI_MAX, comm_), "MPI_Allreduce (argument agreement)");
      return true;
    }
    const char* what = "MPI_Iallreduce (argument agreement)";
    LOWBIT_REQUIRE(size_t(k) <= agree_buf_.size(), LOWBIT_ERROR_INTERNAL, "communicator: agreement of ", k, " words");
    std::copy(v, v + k, agree_buf_.begin());
    MPI_Request req = MPI_REQUEST_NULL;
    start(MPI_Iallreduce(MPI_IN_PLACE, agree_buf_.data(), k, MPI_INT64_T, MPI_MAX, comm_, &req), what);
    complete(&req, what);
    std::copy(agree_buf_.begin(), agree_buf_.begin() + k, v);
    return true;
  }

  void broadcast(void* data, int64_t m, int root) override {
    usable();
    LOWBIT_REQUIRE(m <= INT_MAX, LOWBIT_ERROR_INTERNAL, "communicator: broadcast of ", m, " bytes");
    if (timeout_ms_ <= 0) {
      check_mpi(MPI_Bcast(data, int(m), MPI_BYTE, root, comm_), "MPI_Bcast (why a rank failed)");
      return;
    }
    const char* what = "MPI_Ibcast (why a rank failed)";
    // A buffer of ours (see timeout_ms); never resized once a call is pending.
    if (bcast_buf_.size() < size_t(m)) bcast_buf_.resize(size_t(m));
    std::memcpy(bcast_buf_.data(), data, size_t(m));
    MPI_Request req = MPI_REQUEST_NULL;
    start(MPI_Ibcast(bcast_buf_.data(), int(m), MPI_BYTE, root, comm_, &req), what);
    complete(&req, what);
    std::memcpy(data, bcast_buf_.data(), size_t(m));
  }

  void alltoall(const void* send, void* recv, int64_t m, void*) override {
    usable();
    LOWBIT_REQUIRE(m <= INT_MAX, LOWBIT_ERROR_UNSUPPORTED, "tensor.numel: a message of ", m,
                   " bytes exceeds one MPI message (INT_MAX)");
    if (timeout_ms_ <= 0) {
      check_mpi(MPI_Alltoall(send, int(m), MPI_BYTE, recv, int(m), MPI_BYTE, comm_), "MPI_Alltoall");
      return;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    start(MPI_Ialltoall(send, int(m), MPI_BYTE, recv, int(m), MPI_BYTE, comm_, &req), "MPI_Ialltoall");
    complete(&req, "MPI_Ialltoall");
  }
  void allgather(const void* send, void* recv, int64_t m, void*) override {
    usable();
    LOWBIT_REQUIRE(m <= INT_MAX, LOWBIT_ERROR_UNSUPPORTED, "tensor.numel: a message of ", m,
                   " bytes exceeds one MPI message (INT_MAX)");
    if (timeout_ms_ <= 0) {
      check_mpi(MPI_Allgather(send, int(m), MPI_BYTE, recv, int(m), MPI_BYTE, comm_), "MPI_Allgather");
      return;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    start(MPI_Iallgather(send, int(m), MPI_BYTE, recv, int(m), MPI_BYTE, comm_, &req), "MPI_Iallgather");
    complete(&req, "MPI_Iallgather");
  }
  bool allreduce_f32(float* data, int64_t n, void*) override {
    usable();
    const int64_t step = int64_t(1) << 30;
    for (int64_t off = 0; off < n; off += step) {
      const int64_t cnt = n - off < step ? n - off : step;
      if (timeout_ms_ <= 0) {
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, data + off, int(cnt), MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce");
        continue;
      }
      MPI_Request req = MPI_REQUEST_NULL;
      start(MPI_Iallreduce(MPI_IN_PLACE, data + off, int(cnt), MPI_FLOAT, MPI_SUM, comm_, &req), "MPI_Iallreduce");
      complete(&req, "MPI_Iallreduce");
    }
    return false;
  }

 private:
  void usable() const {
    if (!broken_.empty())
      fail(LOWBIT_ERROR_COMMUNICATION, "this communicator is unusable since an earlier collective failed (", broken_,
           "); destroy it and create a new one");
  }
  // A nonblocking operation that did not start: nothing is pending, but the
  // ranks that started theirs wait for this one; treat it as a timeout.
  void start(int code, const char* what) {
    if (code == MPI_SUCCESS) return;
    broken_ = concat(what, " failed to start: ", mpi_error_text(code));
    fail(LOWBIT_ERROR_COMMUNICATION, broken_);
  }
  // Waits for `req` for at most timeout_ms_, polling MPI_Test (which also
  // drives MPI's progress): a few yields, then sleeps from 10 us doubling up to
  // 1 ms. On expiry the request stays pending (a collective cannot be
  // cancelled) and the transport is broken.
  void complete(MPI_Request* req, const char* what) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
    std::chrono::microseconds pause(10);
    for (int polls = 0;; ++polls) {
      int done = 0;
      const int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        broken_ = concat(what, " failed: ", mpi_error_text(rc));
        fail(LOWBIT_ERROR_COMMUNICATION, broken_);
      }
      if (done) return;
      if (Clock::now() >= deadline) {
        broken_ = concat(what, " timed out after ", timeout_ms_,
                         " ms (the communicator timeout: config.timeout_ms, or LOWBIT_COMM_TIMEOUT_MS)");
        fail(LOWBIT_ERROR_COMMUNICATION, broken_,
             ": some rank did not join this collective (it failed, is stuck, or makes another call). Nothing was "
             "updated on this rank, but this communicator is now unusable: destroy it (its buffers are not "
             "released, as MPI may still write them) and create a new one, or end the job");
      }
      if (polls < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(pause);
        if (pause < std::chrono::microseconds(1000)) pause *= 2;
      }
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, world_ = 1;
  bool direct_ = false;
  int64_t timeout_ms_ = 0;
  std::string broken_;              // why the transport is unusable; empty: usable
  std::vector<int64_t> agree_buf_;  // under a timeout: the agreement's buffer
  std::vector<char> bcast_buf_;     // under a timeout: the broadcast's buffer
};

std::string describe_pointer_comm(const void* p) {
  std::ostringstream os;
  os << "the MPI_Comm at " << p;
  return os.str();
}

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(const void* mpi_comm, int32_t cuda_aware) {
  LOWBIT_REQUIRE(mpi_comm != nullptr, LOWBIT_ERROR_NULL_POINTER, "mpi_comm is NULL (pass a pointer to an MPI_Comm)");
  return std::make_unique<MpiTransport>(*static_cast<const MPI_Comm*>(mpi_comm), cuda_aware, "mpi_comm",
                                        describe_pointer_comm(mpi_comm));
}

// MPI_Comm_f2c of an arbitrary integer: Open MPI returns a NULL pointer (not
// MPI_COMM_NULL) for an index out of its table or of a freed communicator,
// and otherwise a live communicator, so the NULL test below is complete there.
// Other MPIs (MPICH: a cast) are left to probe_comm, which relies on the MPI
// library checking its arguments (MPICH does unless built without error
// checking).
std::unique_ptr<Transport> make_mpi_transport_fortran(int64_t fortran_comm, int32_t cuda_aware) {
  LOWBIT_REQUIRE(fortran_comm >= INT_MIN && fortran_comm <= INT_MAX, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "mpi_fortran_comm is ", fortran_comm, " (not a Fortran MPI handle)");
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  LOWBIT_REQUIRE(initialized && !finalized, LOWBIT_ERROR_INVALID_STATE, "mpi_fortran_comm: MPI is ",
                 finalized ? "already finalized" : "not initialized (call MPI_Init first)");
  const MPI_Comm c = MPI_Comm_f2c(MPI_Fint(fortran_comm));
#if defined(OPEN_MPI) && OPEN_MPI
  LOWBIT_REQUIRE(static_cast<const void*>(c) != nullptr, LOWBIT_ERROR_INVALID_ARGUMENT, "mpi_fortran_comm is ",
                 fortran_comm, ", not the Fortran handle of a communicator of this process (MPI_Comm_f2c gave none)");
#endif
  LOWBIT_REQUIRE(c != MPI_COMM_NULL, LOWBIT_ERROR_INVALID_ARGUMENT, "mpi_fortran_comm is ", fortran_comm,
                 ", the Fortran handle of MPI_COMM_NULL");
  return std::make_unique<MpiTransport>(c, cuda_aware, "mpi_fortran_comm", std::to_string(fortran_comm));
}

#else  // !LOWBIT_HAVE_MPI

std::unique_ptr<Transport> make_mpi_transport(const void*, int32_t) {
  fail(LOWBIT_ERROR_UNSUPPORTED,
       "lowbit_comm_create_mpi: this lowbit was built without MPI (no MPI found at configure time, or "
       "LOWBIT_WITH_MPI=OFF); rebuild with an MPI installed");
}
std::unique_ptr<Transport> make_mpi_transport_fortran(int64_t, int32_t) {
  fail(LOWBIT_ERROR_UNSUPPORTED,
       "lowbit_comm_create_mpi_fortran: this lowbit was built without MPI (no MPI found at configure time, "
       "or LOWBIT_WITH_MPI=OFF); rebuild with an MPI installed");
}

#endif

void check_no_timeout(int64_t ms, lowbit_comm_backend_t backend) {
  if (ms == 0) return;
  if (backend == LOWBIT_COMM_BACKEND_CALLBACKS)
    fail(LOWBIT_ERROR_UNSUPPORTED, "config.timeout_ms is ", ms,
         ", but lowbit cannot bound a callback transport: it calls the transport's functions synchronously and "
         "cannot interrupt them. Bound them in the functions themselves (a function that gives up returns "
         "non-zero, and the call fails with LOWBIT_ERROR_COMMUNICATION); pass 0");
  fail(LOWBIT_ERROR_UNSUPPORTED, "config.timeout_ms is ", ms,
       ", but an NCCL communicator has no host-side timeout (its collectives run on the stream); pass 0");
}

}  // namespace lowbit
