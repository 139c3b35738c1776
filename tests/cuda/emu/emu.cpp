// The fiber scheduler behind emu.hpp, and the CUDA runtime functions the
// engine calls, over host memory. Single-threaded: one emulated launch at a
// time.
#include "emu.hpp"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

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

void run_kernel(unsigned grid, unsigned block, const std::function<void()>& body);

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
  submit(stream, [grid, block, body] { run_kernel(grid, block, body); });
}

namespace {

void run_kernel(unsigned grid, unsigned block, const std::function<void()>& body) {
  Scheduler& s = S();
  if (s.running) die("nested launch");
  if (block == 0 || block > kMaxThreads) die("bad block size");
  s.running = true;
  s.body = &body;
  s.bdim = Idx{block, 1, 1};
  s.gdim = Idx{grid, 1, 1};
  for (unsigned b = 0; b < grid; ++b) {
    s.block = Idx{b, 0, 0};
    run_block();
  }
  s.running = false;
}

}  // namespace

}  // namespace emu
}  // namespace cuda
}  // namespace lowbit

// ---- CUDA runtime over host memory ----------------------------------------------

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
  // Exactly `bytes` (no rounding up), so that AddressSanitizer builds of the
  // emulation catch any access past the end.
  *p = nullptr;
  return posix_memalign(p, 256, bytes ? bytes : 1) == 0 ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
cudaError_t cudaMemset(void* p, int v, size_t bytes) {
  std::memset(p, v, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t stream) {
  lowbit::cuda::emu::submit(stream, [p, v, bytes] { std::memset(p, v, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t stream) {
  lowbit::cuda::emu::submit(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
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
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
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
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated CUDA error"; }
const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated"; }

}  // extern "C"
