// The communicator's CUDA kernels (comm/cuda_kernels.cuh, run on the CUDA
// emulation of tests/cuda/emu, linked through lowbit_emulated) against its
// host code (comm/host_kernels.cpp), bit for bit: the worker phase (scale,
// new worker error, messages), the server phase (scale, new server error,
// gathered message), the decode and its non-finite rule, and the division of
// allreduce_mean. The sizes cross the lanes, rounds and segments of the sums
// of squares (comm/sumsq.hpp), including more than 256 segments; world sizes
// 1 to 8, the first and last rank, aligned and unaligned buffers (the vector
// and scalar paths), zero and non-zero errors, non-finite inputs and scales.
// The sums of squares are compared in double (the device's segment sums, added
// up in the documented order). Every phase only enqueues: no host synchronisation, allocation or free
// (tests/cuda/emu/emu_counters.h).
//
// Arithmetic is the host's in both (the emulation), so this checks that the
// kernels do the same operations in the same order as the host code; the
// GPU suite (test_comm_cuda) checks the same bits on a device.
#include <cuda_runtime_api.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "comm/device.hpp"
#include "comm/host_kernels.hpp"
#include "comm/layout.hpp"
#include "comm/sumsq.hpp"
#include "emu_counters.h"
#include "tests/comm/kernel_checks.hpp"

namespace ob = lowbit::onebit;
namespace dev = lowbit::onebit::dev;

namespace {

#define CUDA_OK(call) CHECK((call) == cudaSuccess, "%s failed", #call)

bool same_scale(float a, float b) { return std::isnan(a) ? std::isnan(b) : bits(a) == bits(b); }

// Device (emulated) memory with room for `offset` floats in front.
struct DevBuf {
  void* base = nullptr;
  DevBuf(size_t bytes) { CUDA_OK(cudaMalloc(&base, bytes ? bytes : 1)); }
  ~DevBuf() { cudaFree(base); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class T>
  T* as(size_t offset_bytes = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(base) + offset_bytes);
  }
};

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  void normal(float* out, int64_t n, double sigma) {
    std::normal_distribution<double> d(0.0, sigma);
    for (int64_t i = 0; i < n; ++i) out[i] = float(d(g));
  }
  void bytes(uint8_t* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = uint8_t(g());
  }
};

// The total of the device's segment sums (the partials workspace) in the
// order of comm/sumsq.hpp: segment s into accumulator s % 256, then tree256.
double device_total(const double* seg, int64_t count) {
  double acc[ob::sumsq::kTree] = {};
  for (int64_t s = 0; s < ob::sumsq::segments(count); ++s) acc[s % ob::sumsq::kTree] += seg[s];
  return ob::sumsq::tree256(acc);
}

bool same_double(double a, double b) { return std::isnan(a) ? std::isnan(b) : std::memcmp(&a, &b, 8) == 0; }

void expect_no_host_work(const char* phase) {
  CHECK(lowbit_emu_host_syncs() == 0 && lowbit_emu_allocations() == 0 && lowbit_emu_frees() == 0 &&
            lowbit_emu_pageable_copies() == 0,
        "%s: %" PRId64 " host syncs, %" PRId64 " allocations, %" PRId64 " frees, %" PRId64
        " pageable copies (expected none)",
        phase, lowbit_emu_host_syncs(), lowbit_emu_allocations(), lowbit_emu_frees(), lowbit_emu_pageable_copies());
}

struct Case {
  int64_t n;
  int32_t world, rank;
  bool unaligned;  // the tensor, the worker error and the server error one float off 16-byte alignment: scalar paths
  bool error;      // a non-zero worker error (else the host runs its no-error branch, the device adds zeros)
  bool nan_input;  // a NaN in the tensor: the worker scale is NaN on both
  bool bad_recv;   // a received scale is +Inf: the server scale is NaN on both
  bool bad_gather; // a gathered scale is NaN: finalize keeps the old errors and the output
};

void run(const Case& k, Rng& rng) {
  set_case("n %" PRId64 " world %d rank %d%s%s%s%s%s", k.n, k.world, k.rank,
           k.unaligned ? " unaligned" : "", k.error ? " error" : "", k.nan_input ? " nan-input" : "",
           k.bad_recv ? " bad-recv" : "", k.bad_gather ? " bad-gather" : "");
  const ob::Layout L = ob::Layout::make(k.n, k.world, k.rank);
  const int64_t n = L.n, c = L.server_numel(), W = L.world, all = W * L.msg;
  const size_t off = k.unaligned ? 4 : 0;
  const size_t un = size_t(n), uc = size_t(c > 0 ? c : 1), ua = size_t(all);
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreate(&stream));

  // ---- worker
  std::vector<float> t(un), e(un, 0.0f), x(un);
  rng.normal(t.data(), n, 1.5);
  if (k.error) rng.normal(e.data(), n, 0.3);
  if (k.nan_input) t[size_t(n / 2)] = NAN;
  std::vector<uint8_t> hsend(ua);
  const double hsum = ob::host_worker_sum(t.data(), k.error ? e.data() : nullptr, x.data(), n);
  const float hscale = ob::scale_from_sumsq(hsum, n);
  if (std::isfinite(hscale)) ob::host_worker_pack(x.data(), hscale, L, hsend.data());

  DevBuf dt(size_t(n) * 4 + off), de(size_t(n) * 4 + off), dws(size_t(n) * 4 + off), dsend(ua);
  DevBuf partials(sizeof(double) * size_t(dev::partials_count(n))), scal(4 * sizeof(float));
  CUDA_OK(cudaMemcpy(dt.as<float>(off), t.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(de.as<float>(off), e.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
  lowbit_emu_reset_counters();
  dev::worker(dt.as<float>(off), de.as<float>(off), dws.as<float>(off), L, dsend.as<uint8_t>(),
              partials.as<double>(), scal.as<float>(), stream);
  expect_no_host_work("worker");
  CUDA_OK(cudaStreamSynchronize(stream));
  const double dsum = device_total(partials.as<double>(), n);
  CHECK(same_double(dsum, hsum), "worker sum of squares %.17g on the device, %.17g on the host", dsum, hsum);
  const float dscale = scal.as<float>()[0];
  CHECK(same_scale(dscale, hscale), "worker scale %.9g (0x%08x) on the device, %.9g (0x%08x) on the host", dscale,
        bits(dscale), hscale, bits(hscale));
  CHECK(!k.nan_input || std::isnan(dscale), "worker scale %.9g with a NaN input", dscale);
  if (std::isfinite(hscale)) {
    const int64_t i = first_diff(dws.as<float>(off), x.data(), n);
    CHECK(i < 0, "new worker error element %" PRId64 ": %.9g on the device, %.9g on the host", i,
          i < 0 ? 0.0 : double(dws.as<float>(off)[i]), i < 0 ? 0.0 : double(x[size_t(i)]));
    CHECK(std::memcmp(dsend.as<uint8_t>(), hsend.data(), ua) == 0, "worker messages differ");
  }

  // ---- server: W received messages for this rank's chunk
  std::vector<uint8_t> recv(ua);
  rng.bytes(recv.data(), all);
  for (int64_t j = 0; j < W; ++j) ob::put_scale(recv.data() + j * L.msg, float(0.25 + 0.5 * double(j)) * 1.37f);
  if (k.bad_recv) ob::put_scale(recv.data() + (W - 1) * L.msg, INFINITY);
  std::vector<float> z(uc), y(uc);
  rng.normal(z.data(), c, 0.1);
  std::vector<uint8_t> hg(size_t(L.msg));
  const double hsum2 = ob::host_server_sum(recv.data(), z.data(), y.data(), L);
  const float hscale2 = ob::scale_from_sumsq(hsum2, c);
  ob::host_server_pack(y.data(), hscale2, L, hg.data());

  DevBuf drecv(ua), dz(size_t(c) * 4 + 4), dwz(size_t(c) * 4 + 4), dg(size_t(L.msg));
  CUDA_OK(cudaMemcpy(drecv.as<uint8_t>(), recv.data(), ua, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dz.as<float>(off), z.data(), size_t(c) * 4, cudaMemcpyHostToDevice));
  lowbit_emu_reset_counters();
  dev::server(drecv.as<uint8_t>(), dz.as<float>(off), dwz.as<float>(off), L, dg.as<uint8_t>(), partials.as<double>(),
              scal.as<float>(), stream);
  expect_no_host_work("server");
  CUDA_OK(cudaStreamSynchronize(stream));
  if (!k.bad_recv) {
    const double dsum2 = device_total(partials.as<double>(), c);
    CHECK(same_double(dsum2, hsum2), "server sum of squares %.17g on the device, %.17g on the host", dsum2, hsum2);
  }
  const float dscale2 = scal.as<float>()[1];
  CHECK(same_scale(dscale2, hscale2), "server scale %.9g (0x%08x) on the device, %.9g (0x%08x) on the host", dscale2,
        bits(dscale2), hscale2, bits(hscale2));
  CHECK(!k.bad_recv || std::isnan(dscale2), "server scale %.9g with a non-finite received scale", dscale2);
  if (std::isfinite(hscale2)) {
    const int64_t i = first_diff(dwz.as<float>(off), y.data(), c);
    CHECK(i < 0, "new server error element %" PRId64 ": %.9g on the device, %.9g on the host", i,
          i < 0 ? 0.0 : double(dwz.as<float>(off)[i]), i < 0 ? 0.0 : double(y[size_t(i)]));
    CHECK(std::memcmp(dg.as<uint8_t>(), hg.data(), size_t(L.msg)) == 0, "gathered message differs");
  }

  // ---- finalize: decode the W gathered messages, or keep everything on a non-finite scale
  std::vector<uint8_t> grecv(ua);
  rng.bytes(grecv.data(), all);
  for (int64_t j = 0; j < W; ++j) ob::put_scale(grecv.data() + j * L.msg, float(0.5 + double(j)) * 0.731f);
  if (k.bad_gather) ob::put_scale(grecv.data() + (W / 2) * L.msg, NAN);
  std::vector<float> before(un), hout(un), err(un), zz(uc);
  rng.normal(before.data(), n, 1.0);
  rng.normal(err.data(), n, 0.2);
  rng.normal(zz.data(), c, 0.2);
  hout = before;
  const bool finite = ob::host_gathered_finite(grecv.data(), L);
  CHECK(finite == !k.bad_gather, "host_gathered_finite is %d", int(finite));
  if (finite) ob::host_decode(grecv.data(), L, hout.data());

  DevBuf dgrecv(ua), dout(size_t(n) * 4 + off), derr(size_t(n) * 4), dwe(size_t(n) * 4);
  DevBuf dzz(size_t(c) * 4 + 4), dwzz(size_t(c) * 4 + 4), flag(sizeof(int32_t));
  int32_t* host_flag = nullptr;
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&host_flag), sizeof(int32_t), cudaHostAllocMapped));
  int32_t* host_flag_dev = nullptr;
  CUDA_OK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_flag_dev), host_flag, 0));
  *host_flag = -1;
  CUDA_OK(cudaMemcpy(dgrecv.as<uint8_t>(), grecv.data(), ua, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dout.as<float>(off), before.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(derr.as<float>(), err.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dzz.as<float>(), zz.data(), size_t(c) * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dwe.as<float>(), 0x7F, size_t(n) * 4));
  CUDA_OK(cudaMemset(dwzz.as<float>(), 0x7F, size_t(c) * 4));
  lowbit_emu_reset_counters();
  dev::finalize(dgrecv.as<uint8_t>(), L, dout.as<float>(off), derr.as<float>(), dwe.as<float>(), dzz.as<float>(),
                dwzz.as<float>(), flag.as<int32_t>(), host_flag_dev, stream);
  expect_no_host_work("finalize");
  CUDA_OK(cudaStreamSynchronize(stream));
  CHECK(*flag.as<int32_t>() == (finite ? 0 : 1) && *host_flag == *flag.as<int32_t>(), "flag %d, host flag %d",
        *flag.as<int32_t>(), *host_flag);
  {
    const int64_t i = first_diff(dout.as<float>(off), hout.data(), n);
    CHECK(i < 0, "output element %" PRId64 ": %.9g on the device, %.9g on the host", i,
          i < 0 ? 0.0 : double(dout.as<float>(off)[i]), i < 0 ? 0.0 : double(hout[size_t(i)]));
  }
  if (!finite) {
    CHECK(first_diff(dwe.as<float>(), err.data(), n) < 0, "non-finite gather: the worker error was not kept");
    CHECK(first_diff(dwzz.as<float>(), zz.data(), c) < 0, "non-finite gather: the server error was not kept");
  }
  cudaFreeHost(host_flag);

  // ---- divide (allreduce_mean over a transport that sums)
  std::vector<float> d(un);
  rng.normal(d.data(), n, 3.0);
  CUDA_OK(cudaMemcpy(dout.as<float>(off), d.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
  lowbit_emu_reset_counters();
  dev::divide(dout.as<float>(off), n, float(W), stream);
  expect_no_host_work("divide");
  for (auto& v : d) v = v / float(W);
  CHECK(first_diff(dout.as<float>(off), d.data(), n) < 0, "divide differs");
  CUDA_OK(cudaStreamDestroy(stream));
}

}  // namespace

int main() {
  const char* env = std::getenv("LOWBIT_TEST_SEED");
  const uint64_t seed = env && *env ? std::strtoull(env, nullptr, 10) : 20261123u;
  std::printf("test_comm_kernels_emulated: seed %" PRIu64 " (LOWBIT_TEST_SEED repeats or changes it)\n", seed);
  Rng rng(seed);
  const int64_t seg = ob::sumsq::kSegment, lanes = ob::sumsq::kLanes;
  const int64_t sizes[] = {1, 7, 8, 9, 1001, lanes - 1, lanes, lanes + 1, seg - 1, seg, seg + 1, 3 * seg + 13};
  int cases = 0;
  for (int64_t n : sizes)
    for (int32_t W : {1, 2, 3, 8})
      for (int32_t r : {0, W - 1}) {
        if (r == W - 1 && W == 1) continue;
        for (int variant = 0; variant < 2; ++variant) {
          Case k{n, W, r, variant == 1, variant == 1 || n % 2 == 1, false, false, false};
          run(k, rng);
          ++cases;
        }
      }
  // More than 256 segments (the accumulators of the total wrap), in the
  // worker (world 1) and in a server chunk (world 2, rank 1).
  run(Case{256 * seg + 3 * lanes + 5, 1, 0, false, true, false, false, false}, rng);
  run(Case{2 * (256 * seg + 77), 2, 1, true, true, false, false, false}, rng);
  cases += 2;
  // Non-finite inputs, received and gathered scales.
  for (int32_t W : {1, 3}) {
    run(Case{4099, W, 0, false, true, true, false, false}, rng);
    run(Case{4099, W, W - 1, false, true, false, true, false}, rng);
    run(Case{4099, W, 0, true, true, false, false, true}, rng);
    cases += 3;
  }
  return report(cases, "the emulated kernels give the host code's bits");
}
