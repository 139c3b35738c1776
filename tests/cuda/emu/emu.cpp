// The fiber scheduler behind emu.hpp, and the CUDA runtime functions the
// library calls, over host memory. Single-threaded: one emulated launch at a
// time.
#include "emu.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "emu_counters.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace lowbit {
namespace cuda {
namespace emu {
namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "CUDA emulation: %s\n", what);
  std::abort();
}

#if defined(__x86_64__)
// Minimal context switch: saves the callee-saved registers on the current
// stack, stores its stack pointer in *save, continues on `next`.
extern "C" void lowbit_emu_switch(void** save, void* next);
asm(R"(
.text
.globl lowbit_emu_switch
.type lowbit_emu_switch,@function
lowbit_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size lowbit_emu_switch,.-lowbit_emu_switch
)");
#endif

enum State { kRun, kWaitBlock, kWaitWarp, kDone };
constexpr size_t kStackBytes = 256 * 1024;
constexpr unsigned kMaxThreads = 1024;

struct Fiber {
  State state = kDone;
  unsigned tid = 0;
  unsigned or_calls = 0;
  std::vector<char> stack;
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t ctx;
#endif
};

struct Scheduler {
  std::vector<Fiber> fibers{kMaxThreads};
  int current = -1;
  Idx block{0, 0, 0}, bdim{1, 1, 1}, gdim{1, 1, 1};
  const std::function<void()>* body = nullptr;
  size_t shared_bytes = 0;
  std::unique_ptr<unsigned char[]> shared;  // exactly shared_bytes (AddressSanitizer sees overruns)
  uint32_t slots[kMaxThreads / 32][32];
  int or_acc[2] = {0, 0};
  bool running = false;
#if defined(__x86_64__)
  void* main_sp = nullptr;
#else
  ucontext_t main_ctx;
#endif
};

Scheduler& S() {
  static Scheduler s;
  return s;
}

void to_main() {
  Scheduler& s = S();
  Fiber& f = s.fibers[size_t(s.current)];
#if defined(__x86_64__)
  lowbit_emu_switch(&f.sp, s.main_sp);
#else
  swapcontext(&f.ctx, &s.main_ctx);
#endif
}

void resume(int i) {
  Scheduler& s = S();
  s.current = i;
#if defined(__x86_64__)
  lowbit_emu_switch(&s.main_sp, s.fibers[size_t(i)].sp);
#else
  swapcontext(&s.main_ctx, &s.fibers[size_t(i)].ctx);
#endif
  s.current = -1;
}

[[noreturn]] void fiber_entry() {
  Scheduler& s = S();
  (*s.body)();
  s.fibers[size_t(s.current)].state = kDone;
  to_main();
  die("a finished fiber was resumed");
}

#if !defined(__x86_64__)
void fiber_entry_uc() { fiber_entry(); }
#endif

void start(Fiber& f) {
  if (f.stack.empty()) f.stack.resize(kStackBytes);
#if defined(__x86_64__)
  uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack.data()) + f.stack.size()) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                                   // fake return address of fiber_entry (never used)
  *--sp = reinterpret_cast<void*>(&fiber_entry);     // where the first switch "returns" to
  for (int r = 0; r < 6; ++r) *--sp = nullptr;       // rbp rbx r12 r13 r14 r15
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack.data();
  f.ctx.uc_stack.ss_size = f.stack.size();
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, fiber_entry_uc, 0);
#endif
}

void run_block() {
  Scheduler& s = S();
  const unsigned n = s.bdim.x;
  s.or_acc[0] = s.or_acc[1] = 0;
  // Dynamic shared memory starts undefined on the GPU: NaN bytes here.
  if (s.shared_bytes) std::memset(s.shared.get(), 0xFF, s.shared_bytes);
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = s.fibers[i];
    f.state = kRun;
    f.tid = i;
    f.or_calls = 0;
    start(f);
  }
  for (;;) {
    bool any_run = false;
    for (unsigned i = 0; i < n; ++i)
      if (s.fibers[i].state == kRun) {
        resume(int(i));
        any_run = true;
      }
    if (any_run) continue;
    // Nobody can run: release complete barriers.
    unsigned alive = 0, at_block = 0;
    for (unsigned i = 0; i < n; ++i) {
      alive += s.fibers[i].state != kDone;
      at_block += s.fibers[i].state == kWaitBlock;
    }
    if (alive == 0) return;
    bool released = false;
    if (at_block == alive) {
      for (unsigned i = 0; i < n; ++i)
        if (s.fibers[i].state == kWaitBlock) s.fibers[i].state = kRun;
      released = true;
    }
    for (unsigned w = 0; w * 32 < n; ++w) {
      unsigned lanes = 0, waiting = 0;
      for (unsigned l = w * 32; l < n && l < w * 32 + 32; ++l) {
        ++lanes;
        waiting += s.fibers[l].state == kWaitWarp;
      }
      if (waiting == lanes) {
        for (unsigned l = w * 32; l < n && l < w * 32 + 32; ++l) s.fibers[l].state = kRun;
        released = true;
      }
    }
    if (!released) die("deadlock: threads wait at barriers that can never complete (divergent shuffle/__syncthreads?)");
  }
}

}  // namespace

[[noreturn]] void misaligned(const void* p, unsigned bytes) {
  std::fprintf(stderr, "CUDA emulation: %u-byte vector access at misaligned address %p\n", bytes, p);
  std::abort();
}

Idx thread_idx() { return Idx{S().fibers[size_t(S().current)].tid, 0, 0}; }
Idx block_idx() { return S().block; }
Idx block_dim() { return S().bdim; }
Idx grid_dim() { return S().gdim; }

void* dynamic_shared() {
  Scheduler& s = S();
  if (!s.running || s.current < 0) die("dynamic shared memory used outside a kernel");
  if (!s.shared_bytes) die("dynamic shared memory used by a kernel launched without shared bytes");
  return s.shared.get();
}

void sync_block() {
  Scheduler& s = S();
  s.fibers[size_t(s.current)].state = kWaitBlock;
  to_main();
}

uint32_t warp_exchange(uint32_t value, unsigned src_lane) {
  Scheduler& s = S();
  const unsigned tid = s.fibers[size_t(s.current)].tid;
  uint32_t* slot = s.slots[tid / 32];
  slot[tid % 32] = value;
  s.fibers[size_t(s.current)].state = kWaitWarp;
  to_main();
  uint32_t r = slot[src_lane & 31u];
  s.fibers[size_t(s.current)].state = kWaitWarp;  // nobody overwrites a slot before every lane has read
  to_main();
  return r;
}

int block_or(int pred) {
  Scheduler& s = S();
  Fiber& f = s.fibers[size_t(s.current)];
  const unsigned k = f.or_calls++ & 1u;
  if (pred) s.or_acc[k] = 1;
  sync_block();
  const int r = s.or_acc[k];
  if (s.fibers[size_t(s.current)].tid == 0) s.or_acc[k ^ 1u] = 0;
  sync_block();
  return r;
}

namespace {

using Work = std::function<void()>;
using Recording = std::vector<Work>;

std::map<const void*, Recording>& captures() {
  static std::map<const void*, Recording> c;
  return c;
}

void run_kernel(unsigned grid, unsigned block, size_t shared_bytes, const std::function<void()>& body);

}  // namespace

bool capturing(const void* stream) {
  return stream == reinterpret_cast<const void*>(kCapturingStream) || captures().count(stream) != 0;
}

// Runs `work` now, or records it into the graph being captured on `stream`.
void submit(const void* stream, Work work) {
  auto it = captures().find(stream);
  if (it != captures().end())
    it->second.push_back(std::move(work));
  else
    work();
}

void launch(unsigned grid, unsigned block, std::function<void()> body, void* stream) {
  launch(grid, block, 0, std::move(body), stream);
}

void launch(unsigned grid, unsigned block, size_t shared_bytes, std::function<void()> body, void* stream) {
  if (shared_bytes > 48 * 1024) die("more than 48 KiB of dynamic shared memory (needs an opt-in attribute)");
  submit(stream, [grid, block, shared_bytes, body] { run_kernel(grid, block, shared_bytes, body); });
}

namespace {

void run_kernel(unsigned grid, unsigned block, size_t shared_bytes, const std::function<void()>& body) {
  Scheduler& s = S();
  if (s.running) die("nested launch");
  if (block == 0 || block > kMaxThreads) die("bad block size");
  if (grid == 0) die("empty grid");
  s.running = true;
  s.body = &body;
  s.shared_bytes = shared_bytes;
  s.shared.reset(shared_bytes ? new unsigned char[shared_bytes] : nullptr);
  s.bdim = Idx{block, 1, 1};
  s.gdim = Idx{grid, 1, 1};
  for (unsigned b = 0; b < grid; ++b) {
    s.block = Idx{b, 0, 0};
    run_block();
  }
  s.shared.reset();
  s.shared_bytes = 0;
  s.running = false;
}

}  // namespace

}  // namespace emu
}  // namespace cuda
}  // namespace lowbit

// ---- memory tracking and counters --------------------------------------------------

namespace lowbit {
namespace cuda {
namespace emu {
namespace {

enum class Kind { Device, PageLocked };

struct Range {
  size_t bytes;
  Kind kind;
};

struct Memory {
  std::mutex mu;
  std::map<uintptr_t, Range> ranges;  // by base address
};

Memory& memory() {
  static Memory m;
  return m;
}

// The tracked allocation holding p, or nullptr.
const Range* find_range(const void* p, uintptr_t* base) {
  Memory& m = memory();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = m.ranges.upper_bound(a);
  if (it == m.ranges.begin()) return nullptr;
  --it;
  if (a >= it->first + (it->second.bytes ? it->second.bytes : 1)) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

cudaError_t allocate(void** p, size_t bytes, Kind kind) {
  // Exactly `bytes` (no rounding up), so that AddressSanitizer builds of the
  // emulation catch any access past the end.
  *p = nullptr;
  if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) {
    *p = nullptr;
    return cudaErrorMemoryAllocation;
  }
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  m.ranges[reinterpret_cast<uintptr_t>(*p)] = Range{bytes, kind};
  return cudaSuccess;
}

cudaError_t release(void* p, Kind kind, const char* fn) {
  if (!p) return cudaSuccess;
  {
    Memory& m = memory();
    std::lock_guard<std::mutex> lock(m.mu);
    auto it = m.ranges.find(reinterpret_cast<uintptr_t>(p));
    if (it == m.ranges.end() || it->second.kind != kind) {
      std::fprintf(stderr, "CUDA emulation: %s(%p): not a pointer that %s returned\n", fn, p,
                   kind == Kind::Device ? "cudaMalloc" : "cudaMallocHost / cudaHostAlloc");
      std::abort();
    }
    m.ranges.erase(it);
  }
  std::free(p);
  return cudaSuccess;
}

// True for host memory that is not page-locked (a copy from or to it may
// synchronise the host on a GPU).
bool pageable(const void* p) {
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  return find_range(p, nullptr) == nullptr;
}

struct Counters {
  std::atomic<int64_t> host_syncs{0}, allocations{0}, frees{0}, pageable_copies{0};
  bool trace = std::getenv("LOWBIT_EMU_TRACE") != nullptr;
};

Counters& counters() {
  static Counters c;
  return c;
}

void count(std::atomic<int64_t> Counters::*which, const char* what) {
  Counters& c = counters();
  (c.*which).fetch_add(1, std::memory_order_relaxed);
  if (c.trace) std::fprintf(stderr, "CUDA emulation: %s\n", what);
}

}  // namespace
}  // namespace emu
}  // namespace cuda
}  // namespace lowbit

extern "C" {

int64_t lowbit_emu_host_syncs(void) { return lowbit::cuda::emu::counters().host_syncs.load(); }
int64_t lowbit_emu_allocations(void) { return lowbit::cuda::emu::counters().allocations.load(); }
int64_t lowbit_emu_frees(void) { return lowbit::cuda::emu::counters().frees.load(); }
int64_t lowbit_emu_pageable_copies(void) { return lowbit::cuda::emu::counters().pageable_copies.load(); }
void lowbit_emu_reset_counters(void) {
  auto& c = lowbit::cuda::emu::counters();
  c.host_syncs = 0;
  c.allocations = 0;
  c.frees = 0;
  c.pageable_copies = 0;
}

}  // extern "C"

// ---- CUDA runtime over host memory ----------------------------------------------

namespace {

using lowbit::cuda::emu::Counters;
using lowbit::cuda::emu::count;
using lowbit::cuda::emu::Kind;

void count_async_copy(const void* dst, const void* src) {
  if (lowbit::cuda::emu::pageable(dst) || lowbit::cuda::emu::pageable(src))
    count(&Counters::pageable_copies, "cudaMemcpyAsync from or to pageable host memory");
}

struct Event {
  bool recorded = false;
};

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  *value = attr == cudaDevAttrComputeCapabilityMajor ? 9 : 0;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  count(&Counters::allocations, "cudaMalloc");
  return lowbit::cuda::emu::allocate(p, bytes, Kind::Device);
}
cudaError_t cudaFree(void* p) {
  count(&Counters::frees, "cudaFree");
  return lowbit::cuda::emu::release(p, Kind::Device, "cudaFree");
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  count(&Counters::allocations, "cudaMallocHost");
  return lowbit::cuda::emu::allocate(p, bytes, Kind::PageLocked);
}
// Every flag (default, portable, mapped, write-combined) gives page-locked
// memory whose device address is its host address (unified addressing).
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  count(&Counters::allocations, "cudaHostAlloc");
  return lowbit::cuda::emu::allocate(p, bytes, Kind::PageLocked);
}
cudaError_t cudaFreeHost(void* p) {
  count(&Counters::frees, "cudaFreeHost");
  return lowbit::cuda::emu::release(p, Kind::PageLocked, "cudaFreeHost");
}
cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int flags) {
  if (flags != 0) return cudaErrorInvalidValue;
  auto& m = lowbit::cuda::emu::memory();
  std::lock_guard<std::mutex> lock(m.mu);
  const lowbit::cuda::emu::Range* r = lowbit::cuda::emu::find_range(host, nullptr);
  if (!r || r->kind != Kind::PageLocked) return cudaErrorInvalidValue;
  *device = host;
  return cudaSuccess;
}
// cudaMalloc'ed memory: device memory of device 0; page-locked memory: host
// memory (also mapped at the same address); anything else: unregistered.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  if (!attr) return cudaErrorInvalidValue;
  *attr = cudaPointerAttributes{};
  auto& m = lowbit::cuda::emu::memory();
  std::lock_guard<std::mutex> lock(m.mu);
  const lowbit::cuda::emu::Range* r = lowbit::cuda::emu::find_range(p, nullptr);
  if (!r) {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    attr->hostPointer = const_cast<void*>(p);
  } else if (r->kind == Kind::Device) {
    attr->type = cudaMemoryTypeDevice;
    attr->device = 0;
    attr->devicePointer = const_cast<void*>(p);
  } else {
    attr->type = cudaMemoryTypeHost;
    attr->device = 0;
    attr->devicePointer = const_cast<void*>(p);
    attr->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int v, size_t bytes) {
  count(&Counters::host_syncs, "cudaMemset");
  std::memset(p, v, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t stream) {
  lowbit::cuda::emu::submit(stream, [p, v, bytes] { std::memset(p, v, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  count(&Counters::host_syncs, "cudaMemcpy");
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t stream) {
  count_async_copy(dst, src);
  lowbit::cuda::emu::submit(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  count(&Counters::host_syncs, "cudaDeviceSynchronize");
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  count(&Counters::host_syncs, "cudaStreamSynchronize");
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
// The stream handle lowbit::cuda::emu::kCapturingStream reports an active
// capture (work still runs at once), so tests reach the engine's capture paths.
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  *status = lowbit::cuda::emu::capturing(stream) ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  static uintptr_t next = 0x10000;
  *stream = reinterpret_cast<cudaStream_t>(next += 0x100);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }

// Events: work runs at submission (or replay), so an event is complete once
// recorded (or once the replay that records it has run).
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = reinterpret_cast<cudaEvent_t>(new Event());
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<Event*>(event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Event* e = reinterpret_cast<Event*>(event);
  lowbit::cuda::emu::submit(stream, [e] { e->recorded = true; });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) {
  count(&Counters::host_syncs, "cudaEventSynchronize");
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0.0f;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  if (!stream || lowbit::cuda::emu::capturing(stream)) return cudaErrorIllegalState;
  lowbit::cuda::emu::captures()[stream];
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  auto& c = lowbit::cuda::emu::captures();
  auto it = c.find(stream);
  if (it == c.end()) return cudaErrorIllegalState;
  *graph = reinterpret_cast<cudaGraph_t>(new lowbit::cuda::emu::Recording(std::move(it->second)));
  c.erase(it);
  return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* num_nodes) {
  if (nodes) return cudaErrorNotSupported;
  *num_nodes = reinterpret_cast<lowbit::cuda::emu::Recording*>(graph)->size();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = reinterpret_cast<cudaGraphExec_t>(
      new lowbit::cuda::emu::Recording(*reinterpret_cast<lowbit::cuda::emu::Recording*>(graph)));
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  const auto& nodes = *reinterpret_cast<lowbit::cuda::emu::Recording*>(exec);
  lowbit::cuda::emu::submit(stream, [nodes] {
    for (const auto& work : nodes) work();
  });
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<lowbit::cuda::emu::Recording*>(exec);
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<lowbit::cuda::emu::Recording*>(graph);
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }

#define LOWBIT_EMU_ERRORS(X)                                       \
  X(cudaSuccess, "no error")                                       \
  X(cudaErrorInvalidValue, "invalid argument")                     \
  X(cudaErrorMemoryAllocation, "out of memory")                    \
  X(cudaErrorInvalidDevice, "invalid device ordinal")              \
  X(cudaErrorIllegalState, "the operation cannot be performed in the present state") \
  X(cudaErrorNotSupported, "operation not supported")
const char* cudaGetErrorString(cudaError_t e) {
#define LOWBIT_EMU_CASE(code, text) \
  if (e == code) return text;
  LOWBIT_EMU_ERRORS(LOWBIT_EMU_CASE)
#undef LOWBIT_EMU_CASE
  return "emulated CUDA error";
}
const char* cudaGetErrorName(cudaError_t e) {
#define LOWBIT_EMU_CASE(code, text) \
  if (e == code) return #code;
  LOWBIT_EMU_ERRORS(LOWBIT_EMU_CASE)
#undef LOWBIT_EMU_CASE
  return "cudaErrorEmulated";
}

}  // extern "C"
