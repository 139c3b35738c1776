// The C boundary: runs a body, turns every exception into a status and a
// message (thread-local, and on the handle when there is one). Every entry
// point goes through guarded() or, for a handle, on_handle().
#pragma once
#include <string>
#include <utility>

#include "core/error.hpp"
#include "lowbit.h"

namespace lowbit {

void set_thread_error(const std::string& message);
const char* thread_error();

template <class Body>
lowbit_status_t guarded(std::string* handle_error, Body&& body) noexcept {
  const Failure f = catch_failure(std::forward<Body>(body));
  if (!f.failed()) return LOWBIT_SUCCESS;
  try {
    set_thread_error(f.message);
    if (handle_error) *handle_error = f.message;
  } catch (...) {
  }
  return f.status;
}

// Runs `body(*handle->impl)` on a non-NULL handle (a struct with `impl` and
// `last_error`), recording a failure on the handle and the thread; `name`
// names the handle argument in the NULL message.
template <class Handle, class Body>
lowbit_status_t on_handle(Handle* handle, const char* name, Body&& body) noexcept {
  if (!handle) return guarded(nullptr, [&] { fail(LOWBIT_ERROR_NULL_POINTER, name, " is NULL"); });
  return guarded(&handle->last_error, [&] { body(*handle->impl); });
}

// The message of the last failed call on a handle; for NULL, the thread's.
template <class Handle>
const char* last_error_of(const Handle* handle) noexcept {
  return handle ? handle->last_error.c_str() : thread_error();
}

#define LOWBIT_REQUIRE_PTR(p, name) LOWBIT_REQUIRE((p) != nullptr, LOWBIT_ERROR_NULL_POINTER, name " is NULL")

}  // namespace lowbit
