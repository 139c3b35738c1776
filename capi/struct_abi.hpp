// The one ABI rule of every struct of lowbit.h and lowbit_comm.h (lowbit.h,
// "ABI rules"; docs/ABI.md): it starts with `size_t struct_size`, only grows
// at the end, and the library knows every size it has shipped with. This is
// the one place that knows those sizes (struct_abi.cpp: a table of struct,
// release, size); every entry point reads, writes and initialises structs
// through it:
//   read_struct   a struct the caller passes in: the caller's bytes over the
//                 defaults, so an older (smaller) struct gets the defaults of
//                 the fields added since; the result has the current size;
//   write_struct  a struct the library fills (info, status, stats): exactly
//                 the caller's struct_size bytes, struct_size left as it is;
//   init_struct   a sized init: `size` bytes of the defaults, struct_size =
//                 size.
// Any struct_size that is not a released size (smaller than the first,
// larger than this library knows, or in between) throws
// LOWBIT_ERROR_INVALID_ARGUMENT naming the argument, the struct and the size,
// before anything is written. Core and comm only ever see current-size
// structs.
#pragma once
#include <cstddef>
#include <cstring>

#include "boundary.hpp"
#include "core/error.hpp"
#include "lowbit_comm.h"

namespace lowbit {
namespace abi {

// One size a struct has shipped with.
struct Release {
  int version;        // the release that shipped it, as LOWBIT_VERSION (0.2: 200)
  size_t size;        // sizeof the struct in that release: the struct_size its callers pass
  size_t data_bytes;  // the caller's fields: `size`, or less where the next release's first
                      // field starts inside this one's tail padding
};

struct StructAbi {
  const char* type;  // "lowbit_hparams_t"
  const char* init;  // "lowbit_hparams_init", named in messages
  const Release* releases;  // oldest first; the last is sizeof(type)
  int count;
};

// One specialisation per struct of the public headers, defined with its
// releases in struct_abi.cpp. (lowbit_tensor_t, a fixed-layout descriptor
// without struct_size, is not versioned: lowbit.h.)
template <class T>
const StructAbi& abi_of();
#define LOWBIT_ABI_STRUCTS(X)                                                                    \
  X(lowbit_build_info_t) X(lowbit_hparams_t) X(lowbit_optimizer_config_t) X(lowbit_param_config_t) \
  X(lowbit_onebit_options_t) X(lowbit_onebit_status_t) X(lowbit_param_info_t) X(lowbit_state_plan_t) \
  X(lowbit_param_buffers_t) X(lowbit_step_args_t) X(lowbit_comm_config_t) X(lowbit_comm_info_t)               \
  X(lowbit_comm_stats_t) X(lowbit_comm_transport_t)
#define LOWBIT_ABI_DECLARE(T) \
  template <>               \
  const StructAbi& abi_of<T>();
LOWBIT_ABI_STRUCTS(LOWBIT_ABI_DECLARE)
#undef LOWBIT_ABI_DECLARE

// The release whose size is `struct_size`; throws (naming `arg`, the struct
// and the size) for any other value.
const Release& find_release(const StructAbi& s, size_t struct_size, const char* arg);
// The size of the struct in release `version` (the newest release at or
// before it): what the plain-named init of that release writes.
size_t size_in(const StructAbi& s, int version);

// Type-erased forms of the templates below (`full` holds the defaults, or the
// values to write, at the current size).
void read_bytes(const StructAbi& s, const void* in, void* full, const char* arg);
// Bytes [sizeof(size_t), size) of `full` into `out` (struct_size not written).
void write_bytes(void* out, const void* full, size_t size);
size_t struct_size_of(const void* p);

template <class T>
T read_struct(const T* in, const T& defaults, const char* arg) {
  LOWBIT_REQUIRE(in != nullptr, LOWBIT_ERROR_NULL_POINTER, arg, " is NULL");
  T full = defaults;
  read_bytes(abi_of<T>(), in, &full, arg);
  return full;
}

// A caller's hyper-parameters, wherever they come in (optimizer_create,
// add_group, set_hparams, the functional step, hparams_check): an older
// struct gets the defaults of `algorithm` (the optimizer's, or the step
// context's) for the fields added since, so a 0.2 struct in a Muon
// optimizer or context gets Muon's Newton-Schulz defaults.
lowbit_hparams_t read_hparams(const lowbit_hparams_t* in, lowbit_algorithm_t algorithm, const char* arg);

// An out-struct checked before any work: not NULL, a released size.
template <class T>
void check_out(const T* out, const char* arg) {
  LOWBIT_REQUIRE(out != nullptr, LOWBIT_ERROR_NULL_POINTER, arg, " is NULL");
  find_release(abi_of<T>(), struct_size_of(out), arg);
}

template <class T>
void write_struct(T* out, const T& full, const char* arg) {
  check_out(out, arg);
  write_bytes(out, &full, struct_size_of(out));
}

// For the two calls that did not read struct_size before 0.4
// (lowbit_optimizer_get_hparams, lowbit_optimizer_onebit_status): a value
// that is not a released size is taken as the first release's, the struct
// these calls always wrote, so callers that never set it keep working.
template <class T>
void write_struct_unchecked(T* out, const T& full, const char* arg) {
  LOWBIT_REQUIRE(out != nullptr, LOWBIT_ERROR_NULL_POINTER, arg, " is NULL");
  const StructAbi& s = abi_of<T>();
  size_t size = s.releases[0].size;
  for (int i = 0; i < s.count; ++i)
    if (s.releases[i].size == struct_size_of(out)) size = s.releases[i].size;
  write_bytes(out, &full, size);
  std::memcpy(static_cast<void*>(out), &size, sizeof size);
}

template <class T>
void init_struct(T* out, size_t size, const T& defaults, const char* arg) {
  LOWBIT_REQUIRE(out != nullptr, LOWBIT_ERROR_NULL_POINTER, arg, " is NULL");
  write_bytes(out, &defaults, find_release(abi_of<T>(), size, arg).size);
  std::memcpy(static_cast<void*>(out), &size, sizeof size);
}

// The body of an init entry point: the sized init (since == 0: `size`
// bytes) or the plain-named init of release `since` (the struct as it was
// then), over the defaults `make()` returns (called after the NULL check;
// it may throw on a bad argument).
template <class T, class Make>
lowbit_status_t init_entry(T* p, size_t size, int since, const char* arg, Make&& make) noexcept {
  return guarded(nullptr, [&] {
    LOWBIT_REQUIRE(p != nullptr, LOWBIT_ERROR_NULL_POINTER, arg, " is NULL");
    init_struct(p, since ? size_in(abi_of<T>(), since) : size, make(), arg);
  });
}

}  // namespace abi
}  // namespace lowbit

// Defines NAME##_sized(T*, size_t), the sized init of T over `defaults`, and
// the exported function of the plain name, which fills the struct of release
// `since` (LOWBIT_VERSION form) for the binaries of that release and callers
// that cannot use the header's macro. `arg` names the pointer in messages.
// Use at file scope inside extern "C".
#define LOWBIT_DEFINE_STRUCT_INIT(T, NAME, since, arg, defaults)                              \
  LOWBIT_API lowbit_status_t NAME##_sized(T* p, size_t size) {                                \
    return ::lowbit::abi::init_entry(p, size, 0, arg, [] { return defaults; });               \
  }                                                                                           \
  LOWBIT_API lowbit_status_t(NAME)(T * p) {                                                   \
    return ::lowbit::abi::init_entry(p, 0, since, arg, [] { return defaults; });              \
  }
