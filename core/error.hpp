// Internal error type: thrown inside the library, caught at the C boundary
// (capi/boundary.hpp) and turned into a lowbit_status_t plus a message.
#pragma once
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

#define LOWBIT_REQUIRE(cond, status, ...) \
  do {                                    \
    if (!(cond)) ::lowbit::fail(status, __VA_ARGS__); \
  } while (0)

}  // namespace lowbit
