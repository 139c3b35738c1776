#include "memory.hpp"

#include <cstdint>
#include <cstdlib>
#include <new>

#include "core/error.hpp"
#ifdef LOWBIT_HAVE_CUDA
#include "device.hpp"
#endif

namespace lowbit {
namespace onebit {

Mem::Mem(MemKind kind, size_t bytes) : kind_(kind), bytes_(bytes) {
  switch (kind) {
    case MemKind::Host: {
      // Zeroed, and 64-byte aligned (calloc gives 16) so that the host
      // kernels' vector and streaming stores line up with cache lines.
      base_ = std::calloc(bytes + 64, 1);
      if (!base_) throw std::bad_alloc();
      const uintptr_t a = reinterpret_cast<uintptr_t>(base_);
      p_ = static_cast<char*>(base_) + ((64 - a % 64) % 64);
      break;
    }
#ifdef LOWBIT_HAVE_CUDA
    case MemKind::Device: p_ = dev::alloc(bytes); break;
    case MemKind::Pinned: p_ = dev::alloc_pinned(bytes); break;
    case MemKind::Mapped: p_ = dev::alloc_mapped(bytes, &alias_); break;
#endif
    default: fail(LOWBIT_ERROR_INTERNAL, "communicator: memory kind not built in");
  }
}

void Mem::reset() noexcept {
  switch (kind_) {
    case MemKind::Host: std::free(base_); break;
#ifdef LOWBIT_HAVE_CUDA
    case MemKind::Device: dev::release(p_); break;
    case MemKind::Pinned:
    case MemKind::Mapped: dev::release_pinned(p_); break;
#endif
    default: break;
  }
  kind_ = MemKind::None;
  p_ = alias_ = base_ = nullptr;
  bytes_ = 0;
}

}  // namespace onebit
}  // namespace lowbit
