// Status strings, versions, capabilities and the thread-local error message.
#include <string>

#include "boundary.hpp"

namespace lowbit {
namespace {
thread_local std::string thread_error_message;
}
void set_thread_error(const std::string& message) { thread_error_message = message; }
const char* thread_error() { return thread_error_message.c_str(); }
}  // namespace lowbit

extern "C" {

LOWBIT_API const char* lowbit_status_string(lowbit_status_t status) {
  switch (status) {
    case LOWBIT_SUCCESS: return "success";
    case LOWBIT_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case LOWBIT_ERROR_NULL_POINTER: return "null pointer";
    case LOWBIT_ERROR_UNSUPPORTED: return "unsupported";
    case LOWBIT_ERROR_OUT_OF_MEMORY: return "out of memory";
    case LOWBIT_ERROR_INVALID_STATE: return "invalid state";
    case LOWBIT_ERROR_CUDA: return "CUDA error";
    case LOWBIT_ERROR_IO: return "I/O error";
    case LOWBIT_ERROR_CORRUPT_DATA: return "corrupt data";
    case LOWBIT_ERROR_VERSION_MISMATCH: return "version mismatch";
    case LOWBIT_ERROR_STATE_MISMATCH: return "state mismatch";
    case LOWBIT_ERROR_BUFFER_TOO_SMALL: return "buffer too small";
    case LOWBIT_ERROR_NONFINITE: return "non-finite value";
    case LOWBIT_ERROR_COMMUNICATION: return "communication error";
    case LOWBIT_ERROR_INTERNAL: return "internal error";
    default: return "unknown status";
  }
}

LOWBIT_API const char* lowbit_last_error(void) { return lowbit::thread_error(); }

LOWBIT_API int lowbit_version(void) { return LOWBIT_VERSION; }

LOWBIT_API int lowbit_has_cuda(void) {
#ifdef LOWBIT_HAVE_CUDA
  return 1;
#else
  return 0;
#endif
}

LOWBIT_API int lowbit_has_mpi(void) {
#ifdef LOWBIT_HAVE_MPI
  return 1;
#else
  return 0;
#endif
}

LOWBIT_API int lowbit_has_nccl(void) {
#ifdef LOWBIT_HAVE_NCCL
  return 1;
#else
  return 0;
#endif
}

}  // extern "C"
