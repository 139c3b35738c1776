// Host pack / unpack throughput of the 1-bit compressed allreduce (the CPU
// path's compression work, without any communication), against the copy
// bandwidth measured in the same run. Not a test: prints a table.
//
//   bench_comm_pack [numel] [threads] [world...]
//     numel    elements of the tensor (default 16M = 16777216)
//     threads  OpenMP threads for the kernels and the copy reference
//              (0 = all, the default; the table is printed for 1 thread and,
//              when more are available, for all of them)
//     world    the ranks the layout is cut for (default 2 4); the kernels run
//              on one process as rank 0 would
//
// The stages, as Communicator::compressed_allreduce runs them on the host,
// and the bytes each must move (counted the way STREAM counts: each byte the
// stage must read once plus each byte it must write once; n elements, chunk
// c = n / W, W ranks):
//   worker pack    x = t + e, scale = sqrt(sum x^2 / n), signs of x, new
//                  error x - scale * sign(x): reads t and e (8 B/el), writes
//                  the error (4) and the sign bits (1/8)   -> 12.125 B/el of n
//   server pack    y = mean_j(scale_j * sign_j) + z over this rank's chunk,
//                  scale, signs, new error: reads W sign bits (W/8) and z (4),
//                  writes the error (4) and the sign bits (1/8)
//                                                  -> W/8 + 8.125 B/el of c
//   unpack         the gathered signs into the output: reads 1/8, writes 4
//                                                  -> 4.125 B/el of n
//   all            the three, per element of n
// ns/el is per element of n (per element of c for the server stage) and the
// fraction is (bytes / time) / copy bandwidth.
//
// Copy reference: bench/copy_reference.h, the one bench_cpu_step uses (same
// run, same thread count, STREAM counting, the fastest of copy, triad, memcpy
// and an in-place update; the error feedback updates its error in place).
// Stage times are the median of 9 calls after one untimed call.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/copy_reference.h"
#include "comm/host_kernels.hpp"

namespace ob = lowbit::onebit;

namespace {

template <class F>
double median_time(F&& f) {
  f();
  double t[9];
  for (double& v : t) {
    const double t0 = now();
    f();
    v = now() - t0;
  }
  std::sort(t, t + 9);
  return t[4];
}

// 64-byte aligned floats (as the communicator allocates its buffers), first
// touched by the threads that will work on them (static slices).
struct Floats {
  float* p = nullptr;
  explicit Floats(int64_t n) {
    p = static_cast<float*>(std::aligned_alloc(64, (size_t(n > 0 ? n : 1) * 4 + 63) / 64 * 64));
    if (!p) {
      std::fprintf(stderr, "out of memory\n");
      std::exit(1);
    }
  }
  ~Floats() { std::free(p); }
  Floats(const Floats&) = delete;
  Floats& operator=(const Floats&) = delete;
  float* data() const { return p; }
};

void fill(Floats& v, int64_t n, uint64_t seed, double sd, int threads) {
  float* p = v.p;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) {
    uint64_t s = (uint64_t(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    s ^= s >> 31, s *= 0xBF58476D1CE4E5B9ull, s ^= s >> 29;
    p[i] = float(sd * (double(s >> 11) / 9007199254740992.0 - 0.5));
  }
}

std::vector<uint8_t> messages(const ob::Layout& L, uint64_t seed) {
  std::vector<uint8_t> m(size_t(L.world * L.msg));
  uint64_t s = seed | 1;
  for (auto& b : m) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    b = uint8_t(s >> 24);
  }
  for (int32_t j = 0; j < L.world; ++j) ob::put_scale(m.data() + int64_t(j) * L.msg, 0.01f * float(j + 1));
  return m;
}

struct Stage {
  const char* name;
  double bytes_per_el;  // per element of `per`
  int64_t per;          // elements the ns/el are counted over
  double seconds;
};

void print(const Stage& s, double ref) {
  const double gbs = s.bytes_per_el * double(s.per) / s.seconds;
  std::printf("  %-13s %8.3f %9.3f %9.2f %9.1f %7.1f%%\n", s.name, s.bytes_per_el, s.seconds * 1e9 / double(s.per),
              s.seconds * 1e3, gbs / 1e9, 100.0 * gbs / ref);
}

void run(int64_t n, int32_t world, int threads, double ref) {
  const ob::Layout L = ob::Layout::make(n, world, 0);
  const int64_t c = L.server_numel();
  Floats t(n), e(n), x(n), z(c), y(c), out(n);
  fill(t, n, 1, 2.0, threads), fill(e, n, 2, 0.2, threads), fill(x, n, 3, 0, threads);
  fill(z, c, 4, 0.1, threads), fill(y, c, 5, 0, threads), fill(out, n, 6, 0, threads);
  std::vector<uint8_t> send(size_t(L.world * L.msg)), gsend(size_t(L.msg));
  const std::vector<uint8_t> recv = messages(L, 7), grecv = messages(L, 8);

  // The worker and server stages as the allreduce runs them: one pass each
  // (host_*_sum_pack) reading the errors lazily (the last call's x / y and
  // its scale), writing x / y and the sign bits; the scales after it.
  Stage w{"worker pack", 12.125, n, 0};
  w.seconds = median_time([&] {
    const double s2 = ob::host_worker_sum_pack(t.data(), ob::ErrorsIn{e.data(), 0.3f, true}, L, x.data(), send.data());
    ob::put_scales(send.data(), L.world, L.msg, ob::scale_from_sumsq(s2, n));
  });
  Stage s{"server pack", double(world) / 8.0 + 8.125, c, 0};
  s.seconds = median_time([&] {
    const double q = ob::host_server_sum_pack(recv.data(), ob::ErrorsIn{z.data(), 0.05f, true}, L, y.data(),
                                              gsend.data());
    ob::put_scale(gsend.data(), ob::scale_from_sumsq(q, c));
  });
  Stage u{"unpack", 4.125, n, 0};
  u.seconds = median_time([&] { ob::host_decode(grecv.data(), L, out.data()); });
  const double all_bytes = (w.bytes_per_el * double(n) + s.bytes_per_el * double(c) + u.bytes_per_el * double(n));
  Stage a{"all", all_bytes / double(n), n, w.seconds + s.seconds + u.seconds};
  // The two-pass forms the allreduce ran before the one-pass ones, with the
  // errors stored: a sum of squares, then a pass that recomputes x and packs
  // (host_*_sumsq + host_*_pack_from).
  Stage w0{"worker 2-pass", 12.125, n, 0};
  w0.seconds = median_time([&] {
    const double s2 = ob::host_worker_sumsq(t.data(), e.data(), n);
    ob::host_worker_pack_from(t.data(), e.data(), ob::scale_from_sumsq(s2, n), L, x.data(), send.data());
  });
  Stage s0{"server 2-pass", s.bytes_per_el, c, 0};
  s0.seconds = median_time([&] {
    const double q = ob::host_server_sumsq(recv.data(), z.data(), L);
    ob::host_server_pack_from(recv.data(), z.data(), ob::scale_from_sumsq(q, c), L, y.data(), gsend.data());
  });
  // The forms that store x (y) in the first pass and pack them in place
  // (host_worker_sum + host_worker_pack, host_server_sum + host_server_pack).
  Stage w2{"worker (x)", 12.125, n, 0};
  w2.seconds = median_time([&] {
    const double s2 = ob::host_worker_sum(t.data(), e.data(), x.data(), n);
    ob::host_worker_pack(x.data(), ob::scale_from_sumsq(s2, n), L, send.data());
  });
  Stage s2{"server (y)", s.bytes_per_el, c, 0};
  s2.seconds = median_time([&] {
    const double q = ob::host_server_sum(recv.data(), z.data(), y.data(), L);
    ob::host_server_pack(y.data(), ob::scale_from_sumsq(q, c), L, gsend.data());
  });
  Stage ws{"worker sumsq", 8, n, 0};
  ws.seconds = median_time([&] { (void)ob::host_worker_sumsq(t.data(), e.data(), n); });

  std::printf(" world %d (chunk %lld), %d thread%s:\n", world, (long long)c, threads, threads == 1 ? "" : "s");
  std::printf("  %-13s %8s %9s %9s %9s %8s\n", "stage", "B/el", "ns/el", "ms", "GB/s", "of copy");
  print(w, ref);
  print(s, ref);
  print(u, ref);
  print(a, ref);
  print(w0, ref);
  print(s0, ref);
  print(w2, ref);
  print(s2, ref);
  print(ws, ref);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (int64_t(16) << 20);
  const int threads_arg = argc > 2 ? std::atoi(argv[2]) : 0;
  if (n <= 0 || threads_arg < 0) {
    std::fprintf(stderr, "usage: %s [numel > 0] [threads >= 0] [world...]\n", argv[0]);
    return 2;
  }
  std::vector<int32_t> worlds;
  for (int i = 3; i < argc; ++i) worlds.push_back(int32_t(std::atoi(argv[i])));
  if (worlds.empty()) worlds = {2, 4};
  const int all = omp_get_max_threads();
  std::vector<int> counts;
  if (threads_arg > 0) {
    counts.push_back(threads_arg);
  } else {
    counts.push_back(1);
    if (all > 1) counts.push_back(all);
  }
  const char* isa = std::getenv("LOWBIT_BENCH_ISA");  // portable | avx2 | avx512 (default: the best the CPU has)
  if (isa && !ob::host_set_isa(std::strcmp(isa, "portable") == 0 ? ob::HostIsa::Portable
                               : std::strcmp(isa, "avx2") == 0   ? ob::HostIsa::Avx2
                                                                 : ob::HostIsa::Avx512)) {
    std::fprintf(stderr, "LOWBIT_BENCH_ISA=%s: not available on this CPU\n", isa);
    return 2;
  }
  std::printf("1-bit allreduce host pack/unpack, %lld elements, %s kernels\n", (long long)n,
              ob::host_isa_name(ob::host_isa()));
  for (int th : counts) {
    omp_set_num_threads(th);
    const copy_reference_t r = copy_reference(th);
    std::printf("\ncopy reference (bench/copy_reference.h), %d thread%s: copy %.1f, triad %.1f, memcpy %.1f, update %.1f"
                " -> %.1f GB/s\n",
                th, th == 1 ? "" : "s", r.copy / 1e9, r.triad / 1e9, r.memcpy_ / 1e9, r.update / 1e9, r.ref / 1e9);
    for (int32_t W : worlds) run(n, W, th, r.ref);
  }
  return 0;
}
