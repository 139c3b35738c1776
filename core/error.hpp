// Internal error type: thrown inside the library, caught at the C boundary
// (capi/boundary.hpp) and turned into a lowbit_status_t plus a message.
#pragma once
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>

#include "lowbit.h"

namespace lowbit {

class Error : public std::runtime_error {
 public:
  Error(lowbit_status_t status, const std::string& message) : std::runtime_error(message), status_(status) {}
  lowbit_status_t status() const noexcept { return status_; }

 private:
  lowbit_status_t status_;
};

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

template <class... Parts>
[[noreturn]] void fail(lowbit_status_t status, const Parts&... parts) {
  throw Error(status, concat(parts...));
}

// How a body failed: what the C boundary returns, and what a collective's
// agreement tells the other ranks.
struct Failure {
  lowbit_status_t status = LOWBIT_SUCCESS;
  std::string message;
  bool failed() const { return status != LOWBIT_SUCCESS; }
};

// Inside a catch block: the exception being handled, as a lowbit::Error's
// status and message, running out of host memory as
// LOWBIT_ERROR_OUT_OF_MEMORY with `out_of_memory`, anything else as
// LOWBIT_ERROR_INTERNAL.
inline Failure current_failure(const char* out_of_memory = "out of host memory") noexcept {
  Failure f;
  try {
    throw;
  } catch (const Error& e) {
    f.status = e.status();
    f.message = e.what();
  } catch (const std::bad_alloc&) {
    f.status = LOWBIT_ERROR_OUT_OF_MEMORY;
    f.message = out_of_memory;
  } catch (const std::exception& e) {
    f.status = LOWBIT_ERROR_INTERNAL;
    f.message = std::string("internal error: ") + e.what();
  } catch (...) {
    f.status = LOWBIT_ERROR_INTERNAL;
    f.message = "internal error: unknown exception";
  }
  return f;
}

// Runs body and returns how it failed (current_failure), if it did.
template <class Body>
Failure catch_failure(Body&& body, const char* out_of_memory = "out of host memory") noexcept {
  try {
    body();
  } catch (...) {
    return current_failure(out_of_memory);
  }
  return Failure();
}

#define LOWBIT_REQUIRE(cond, status, ...) \
  do {                                    \
    if (!(cond)) ::lowbit::fail(status, __VA_ARGS__); \
  } while (0)

}  // namespace lowbit
