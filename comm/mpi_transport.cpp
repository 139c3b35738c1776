// MPI transport: a duplicate of the caller's communicator with
// MPI_ERRORS_RETURN, so MPI failures become LOWBIT_ERROR_COMMUNICATION.
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

#include <climits>
#include <string>
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

class MpiTransport final : public Transport {
 public:
  MpiTransport(MPI_Comm user, int32_t cuda_aware) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    LOWBIT_REQUIRE(initialized && !finalized, LOWBIT_ERROR_INVALID_STATE,
                   "mpi_comm: MPI is ", finalized ? "already finalized" : "not initialized (call MPI_Init first)");
    LOWBIT_REQUIRE(user != MPI_COMM_NULL, LOWBIT_ERROR_INVALID_ARGUMENT, "mpi_comm is MPI_COMM_NULL");
    LOWBIT_REQUIRE(cuda_aware >= -1 && cuda_aware <= 1, LOWBIT_ERROR_INVALID_ARGUMENT,
                   "config.cuda_aware_mpi is ", cuda_aware, " (expected -1 auto, 0 never, 1 always)");
    int inter = 0;
    check_mpi(MPI_Comm_test_inter(user, &inter), "MPI_Comm_test_inter(mpi_comm)");
    LOWBIT_REQUIRE(!inter, LOWBIT_ERROR_INVALID_ARGUMENT, "mpi_comm is an inter-communicator (need an intra-communicator)");
    check_mpi(MPI_Comm_dup(user, &comm_), "MPI_Comm_dup(mpi_comm)");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_);
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
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  lowbit_comm_backend_t backend() const override { return LOWBIT_COMM_BACKEND_MPI; }
  int32_t rank() const override { return rank_; }
  int32_t world() const override { return world_; }
  bool supports_host() const override { return true; }
  bool device_direct() const override { return direct_; }
  bool stream_ordered() const override { return false; }

  bool agree_max(int64_t* v, int k) override {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, v, k, MPI_INT64_T, MPI_MAX, comm_), "MPI_Allreduce (argument agreement)");
    return true;
  }

  void alltoall(const void* send, void* recv, int64_t m, void*) override {
    LOWBIT_REQUIRE(m <= INT_MAX, LOWBIT_ERROR_UNSUPPORTED, "tensor.numel: a message of ", m,
                   " bytes exceeds one MPI message (INT_MAX)");
    check_mpi(MPI_Alltoall(send, int(m), MPI_BYTE, recv, int(m), MPI_BYTE, comm_), "MPI_Alltoall");
  }
  void allgather(const void* send, void* recv, int64_t m, void*) override {
    LOWBIT_REQUIRE(m <= INT_MAX, LOWBIT_ERROR_UNSUPPORTED, "tensor.numel: a message of ", m,
                   " bytes exceeds one MPI message (INT_MAX)");
    check_mpi(MPI_Allgather(send, int(m), MPI_BYTE, recv, int(m), MPI_BYTE, comm_), "MPI_Allgather");
  }
  bool allreduce_f32(float* data, int64_t n, void*) override {
    const int64_t step = int64_t(1) << 30;
    for (int64_t off = 0; off < n; off += step) {
      const int64_t cnt = n - off < step ? n - off : step;
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, data + off, int(cnt), MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce");
    }
    return false;
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, world_ = 1;
  bool direct_ = false;
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(const void* mpi_comm, int32_t cuda_aware) {
  LOWBIT_REQUIRE(mpi_comm != nullptr, LOWBIT_ERROR_NULL_POINTER, "mpi_comm is NULL (pass a pointer to an MPI_Comm)");
  return std::make_unique<MpiTransport>(*static_cast<const MPI_Comm*>(mpi_comm), cuda_aware);
}

std::unique_ptr<Transport> make_mpi_transport_fortran(int64_t fortran_comm, int32_t cuda_aware) {
  LOWBIT_REQUIRE(fortran_comm >= INT_MIN && fortran_comm <= INT_MAX, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "mpi_fortran_comm is ", fortran_comm, " (not a Fortran MPI handle)");
  int initialized = 0;
  MPI_Initialized(&initialized);
  LOWBIT_REQUIRE(initialized, LOWBIT_ERROR_INVALID_STATE, "mpi_fortran_comm: MPI is not initialized (call MPI_Init first)");
  MPI_Comm c = MPI_Comm_f2c(MPI_Fint(fortran_comm));
  return std::make_unique<MpiTransport>(c, cuda_aware);
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

}  // namespace lowbit
