// The communicator's host kernels (comm/host_kernels.cpp, compiled in) bit
// for bit against a plain reference written here from the documented rules
// (the layout of layout.hpp, the sign rule, error = v - (+-scale), and the
// summation order of sumsq.hpp), for every instruction set the CPU has
// (AVX-512, AVX2 and portable), 1, 2 and 3 OpenMP threads, plain and streaming
// (non-temporal) stores at 64-, 32- and 4-byte alignment, and both forms of the
// worker and server phases (two passes that store x / y and pack in place,
// the fused form that recomputes them: host_*_pack_from), and the one-pass forms the communicator runs
// (host_*_sum_pack) with stored, zero and lazy errors (rebuilt from the last
// call's values and scale: host_errors_from). Sizes cross the
// 8-, 16- and 64-element blocks, the lanes, rounds and segments of the sums
// and the parallel threshold; world sizes 1 to 8, first and last rank,
// unaligned buffers, zero and non-zero errors, signed zeros with a zero scale,
// non-finite inputs.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "comm/host_kernels.hpp"
#include "comm/layout.hpp"
#include "comm/sumsq.hpp"
#include "tests/comm/kernel_checks.hpp"
#include "tests/common/test_seed.h"

namespace ob = lowbit::onebit;
namespace sq = lowbit::onebit::sumsq;

namespace {

bool same_double(double a, double b) { return std::isnan(a) ? std::isnan(b) : std::memcmp(&a, &b, 8) == 0; }

// ---- the reference

// Sum of v(i)^2, i < count, in the order of sumsq.hpp.
template <class V>
double ref_sumsq(int64_t count, V&& v) {
  double acc[sq::kTree] = {};
  for (int64_t s = 0; s < sq::segments(count); ++s) {
    double lane[sq::kLanes] = {};
    for (int64_t j = 0; j < sq::kSegment; ++j) {
      const int64_t i = s * sq::kSegment + j;
      if (i >= count) break;
      const double d = double(v(i));
      lane[j % sq::kLanes] += d * d;
    }
    double t[sq::kTree];
    for (int c = 0; c < sq::kTree; ++c) t[c] = sq::fold8(lane + 8 * c);
    acc[s % sq::kTree] += sq::tree256(t);
  }
  return sq::tree256(acc);
}

float ref_scale(double s2, int64_t count) {
  if (!std::isfinite(s2)) return NAN;
  if (count <= 0) return 0.0f;
  return float(std::sqrt(s2 / double(count)));
}

float signed_scale(bool bit, float s) { return bit ? s : -s; }

// Packs v(k), k < valid, of one chunk of `chunk` elements at msg + 4 and the
// errors into err[k].
template <class V>
void ref_pack(int64_t chunk, int64_t valid, float scale, V&& v, float* err, uint8_t* msg) {
  ob::put_scale(msg, scale);
  for (int64_t k = 0; k < chunk; ++k) {
    if (k % 8 == 0) msg[4 + k / 8] = 0;
    if (k >= valid) continue;
    const float x = v(k);
    const bool bit = x >= 0.0f;
    err[k] = x - signed_scale(bit, scale);
    msg[4 + k / 8] = uint8_t(msg[4 + k / 8] | (unsigned(bit) << (k % 8)));
  }
}

// ---- buffers one float off 64-byte alignment on request

struct Floats {
  std::vector<float> store;
  float* p;
  Floats(int64_t n, bool unaligned) : store(size_t(n) + 32) {
    uintptr_t a = reinterpret_cast<uintptr_t>(store.data());
    size_t off = ((64 - a % 64) % 64) / 4 + (unaligned ? 1 : 0);
    p = store.data() + off;
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

struct Case {
  int64_t n;
  int32_t world, rank;
  bool unaligned, error;
  int special;  // 0 none, 1 all zeros of both signs (scale 0), 2 NaN input, 3 Inf received scale
};

// The expected results of one case.
struct Expected {
  double wsum;
  float wscale;
  std::vector<float> werr;
  std::vector<uint8_t> send;
  double ssum;
  float sscale;
  std::vector<float> serr;
  std::vector<uint8_t> gsend;
  std::vector<float> out;
};

void run_case(const Case& k, Rng& rng) {
  const ob::Layout L = ob::Layout::make(k.n, k.world, k.rank);
  const int64_t n = L.n, c = L.server_numel(), W = L.world, all = W * L.msg;
  Floats t(n, k.unaligned), e(n, k.unaligned), z(c, k.unaligned);
  rng.normal(t.p, n, 1.5);
  if (k.error) rng.normal(e.p, n, 0.3);
  else std::memset(e.p, 0, sizeof(float) * size_t(n));
  rng.normal(z.p, c, 0.1);
  if (k.special == 1)
    for (int64_t i = 0; i < n; ++i) t.p[i] = (i % 3 == 0) ? -0.0f : 0.0f, e.p[i] = (i % 5 == 0) ? -0.0f : 0.0f;
  if (k.special == 2 && n > 0) t.p[n / 2] = NAN;
  std::vector<uint8_t> recv(static_cast<size_t>(all)), grecv(static_cast<size_t>(all));
  rng.bytes(recv.data(), all);
  rng.bytes(grecv.data(), all);
  for (int64_t j = 0; j < W; ++j) {
    ob::put_scale(recv.data() + j * L.msg, float(0.25 + 0.5 * double(j)) * 1.37f);
    ob::put_scale(grecv.data() + j * L.msg, float(0.5 + 0.25 * double(j)));
  }
  if (k.special == 1) {  // zero received scales: y = 0 + z, z of both signs, zero
    for (int64_t j = 0; j < W; ++j) ob::put_scale(recv.data() + j * L.msg, 0.0f);
    for (int64_t i = 0; i < c; ++i) z.p[i] = (i % 3 == 0) ? -0.0f : 0.0f;
  }
  if (k.special == 3) ob::put_scale(recv.data() + (W - 1) * L.msg, INFINITY);
  // With errors and no special values, e and z are what lazy buffers (the
  // values of a last call, with zeros of both signs, and its scale) stand for.
  const bool lazy = k.error && k.special == 0;
  const float lazy_ws = 0.37f, lazy_ss = 0.011f;
  Floats xprev(n, k.unaligned), yprev(c, k.unaligned);
  if (lazy) {
    rng.normal(xprev.p, n, 0.4);
    rng.normal(yprev.p, c, 0.05);
    for (int64_t i = 0; i < n; i += 17) xprev.p[i] = (i / 17) % 2 ? -0.0f : 0.0f;
    for (int64_t i = 0; i < c; i += 13) yprev.p[i] = (i / 13) % 2 ? -0.0f : 0.0f;
    for (int64_t i = 0; i < n; ++i) e.p[i] = xprev.p[i] - signed_scale(xprev.p[i] >= 0.0f, lazy_ws);
    for (int64_t i = 0; i < c; ++i) z.p[i] = yprev.p[i] - signed_scale(yprev.p[i] >= 0.0f, lazy_ss);
  }
  const float* ep = k.error ? e.p : nullptr;

  // Reference.
  Expected x;
  auto wv = [&](int64_t i) { return ep ? t.p[i] + ep[i] : t.p[i] + 0.0f; };
  x.wsum = ref_sumsq(n, wv);
  x.wscale = ref_scale(x.wsum, n);
  x.werr.assign(size_t(n), 0.0f);
  x.send.assign(size_t(all), 0);
  for (int64_t r = 0; r < W; ++r)
    ref_pack(L.chunk, L.real_in_chunk(int32_t(r)), x.wscale, [&](int64_t q) { return wv(r * L.chunk + q); },
             x.werr.data() + r * L.chunk, x.send.data() + r * L.msg);
  bool finite = true;
  for (int64_t j = 0; j < W; ++j) finite = finite && std::isfinite(ob::get_scale(recv.data() + j * L.msg));
  auto sv = [&](int64_t i) {
    float acc = 0.0f;
    for (int64_t j = 0; j < W; ++j) {
      const uint8_t* m = recv.data() + j * L.msg;
      acc += signed_scale((m[4 + i / 8] >> (i % 8)) & 1u, ob::get_scale(m));
    }
    return acc / float(W) + z.p[i];
  };
  x.ssum = finite ? ref_sumsq(c, sv) : NAN;
  x.sscale = ref_scale(x.ssum, c);
  x.serr.assign(size_t(c), 0.0f);
  x.gsend.assign(size_t(L.msg), 0);
  ref_pack(L.chunk, c, x.sscale, sv, x.serr.data(), x.gsend.data());
  x.out.assign(size_t(n), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = i / L.chunk, q = i - r * L.chunk;
    const uint8_t* m = grecv.data() + r * L.msg;
    x.out[size_t(i)] = signed_scale((m[4 + q / 8] >> (q % 8)) & 1u, ob::get_scale(m));
  }

  const std::string name = g_case;
  for (int isa = 0; isa < 3; ++isa) {
    if (!ob::host_set_isa(ob::HostIsa(isa))) continue;
    for (int threads = 1; threads <= 3; ++threads) {
#ifdef _OPENMP
      omp_set_num_threads(threads);
#else
      if (threads > 1) break;
#endif
      // Plain stores with 1 and 3 threads, streaming stores with 2.
      ob::host_set_streaming(threads == 2 ? ob::HostStreaming::Always : ob::HostStreaming::Never);
      set_case("%s, %s, %d thread(s)%s", name.c_str(), ob::host_isa_name(ob::HostIsa(isa)),
               threads, threads == 2 ? ", streaming stores" : "");
      // Worker, two passes.
      Floats xs(n, k.unaligned);
      std::vector<uint8_t> send(size_t(all), 0xAB);
      const double s1 = ob::host_worker_sum(t.p, ep, xs.p, n);
      CHECK(same_double(s1, x.wsum), "worker sum %.17g, expected %.17g", s1, x.wsum);
      // x itself: t + e (t + 0 without error).
      for (int64_t i = 0; i < n; ++i)
        if (bits(xs.p[i]) != bits(wv(i))) {
          CHECK(false, "stored x[%" PRId64 "] = %.9g, expected %.9g", i, double(xs.p[i]), double(wv(i)));
          break;
        }
      const float sc = ob::scale_from_sumsq(s1, n);
      CHECK(bits(sc) == bits(x.wscale) || (std::isnan(sc) && std::isnan(x.wscale)), "worker scale %.9g vs %.9g",
            double(sc), double(x.wscale));
      if (std::isfinite(sc)) {
        ob::host_worker_pack(xs.p, sc, L, send.data());
        const int64_t d = first_diff(xs.p, x.werr.data(), n);
        CHECK(d < 0, "worker error (in place) element %" PRId64 ": %.9g, expected %.9g", d,
              d < 0 ? 0.0 : double(xs.p[d]), d < 0 ? 0.0 : double(x.werr[size_t(d)]));
        CHECK(send == x.send, "worker messages (in place) differ");
      }
      // Worker, fused.
      const double s1b = ob::host_worker_sumsq(t.p, ep, n);
      CHECK(same_double(s1b, x.wsum), "worker sumsq %.17g, expected %.17g", s1b, x.wsum);
      if (std::isfinite(sc)) {
        Floats we(n, k.unaligned);
        std::vector<uint8_t> send2(size_t(all), 0xCD);
        ob::host_worker_pack_from(t.p, ep, sc, L, we.p, send2.data());
        const int64_t d = first_diff(we.p, x.werr.data(), n);
        CHECK(d < 0, "worker error (fused) element %" PRId64 ": %.9g, expected %.9g", d,
              d < 0 ? 0.0 : double(we.p[d]), d < 0 ? 0.0 : double(x.werr[size_t(d)]));
        CHECK(send2 == x.send, "worker messages (fused) differ");
      }
      // Server, two passes.
      Floats ys(c, k.unaligned);
      const double s2 = ob::host_server_sum(recv.data(), z.p, ys.p, L);
      CHECK(same_double(s2, x.ssum), "server sum %.17g, expected %.17g", s2, x.ssum);
      const float sc2 = ob::scale_from_sumsq(s2, c);
      if (finite)
        for (int64_t i = 0; i < c; ++i)
          if (bits(ys.p[i]) != bits(sv(i))) {
            CHECK(false, "stored y[%" PRId64 "] = %.9g, expected %.9g", i, double(ys.p[i]), double(sv(i)));
            break;
          }
      std::vector<uint8_t> g1(size_t(L.msg), 0xAB), g2(size_t(L.msg), 0xCD);
      ob::host_server_pack(ys.p, sc2, L, g1.data());
      const double s2b = ob::host_server_sumsq(recv.data(), z.p, L);
      CHECK(same_double(s2b, x.ssum), "server sumsq %.17g, expected %.17g", s2b, x.ssum);
      Floats se(c, k.unaligned);
      ob::host_server_pack_from(recv.data(), z.p, sc2, L, se.p, g2.data());
      if (std::isfinite(sc2)) {
        int64_t d = first_diff(ys.p, x.serr.data(), c);
        CHECK(d < 0, "server error (in place) element %" PRId64, d);
        d = first_diff(se.p, x.serr.data(), c);
        CHECK(d < 0, "server error (fused) element %" PRId64, d);
        CHECK(g1 == x.gsend, "server message (in place) differs");
        CHECK(g2 == x.gsend, "server message (fused) differs");
      }
      // The one-pass forms: values stored, sign bits packed, scales left to
      // the caller; errors stored, zero, or lazy.
      for (int form = 0; form < (lazy ? 2 : 1); ++form) {
        const char* what = form ? "lazy" : (ep ? "stored" : "zero");
        if (form) {
          std::vector<float> back(static_cast<size_t>(n)), zback(static_cast<size_t>(c));
          ob::host_errors_from(xprev.p, lazy_ws, n, back.data());
          ob::host_errors_from(yprev.p, lazy_ss, c, zback.data());
          CHECK(first_diff(back.data(), e.p, n) < 0, "host_errors_from (worker) differs");
          CHECK(first_diff(zback.data(), z.p, c) < 0, "host_errors_from (server) differs");
        }
        const ob::ErrorsIn we = form ? ob::ErrorsIn{xprev.p, lazy_ws, true} : ob::ErrorsIn{ep, 0.0f, false};
        const ob::ErrorsIn ze = form ? ob::ErrorsIn{yprev.p, lazy_ss, true} : ob::ErrorsIn{z.p, 0.0f, false};
        Floats xo(n, k.unaligned), yo(c, k.unaligned);
        std::vector<uint8_t> s4(size_t(all), 0x5A), g4(size_t(L.msg), 0xA5);
        const double s5 = ob::host_worker_sum_pack(t.p, we, L, xo.p, s4.data());
        CHECK(same_double(s5, x.wsum), "worker sum_pack (%s errors) sum %.17g, expected %.17g", what, s5, x.wsum);
        for (int64_t i = 0; i < n; ++i)
          if (bits(xo.p[i]) != bits(wv(i))) {
            CHECK(false, "worker sum_pack (%s errors) x[%" PRId64 "] = %.9g, expected %.9g", what, i,
                  double(xo.p[i]), double(wv(i)));
            break;
          }
        ob::put_scales(s4.data(), W, L.msg, ob::scale_from_sumsq(s5, n));
        CHECK(s4 == x.send, "worker sum_pack (%s errors) messages differ", what);
        const double s6 = ob::host_server_sum_pack(recv.data(), ze, L, yo.p, g4.data());
        CHECK(same_double(s6, x.ssum), "server sum_pack (%s errors) sum %.17g, expected %.17g", what, s6, x.ssum);
        if (finite) {
          for (int64_t i = 0; i < c; ++i)
            if (bits(yo.p[i]) != bits(sv(i))) {
              CHECK(false, "server sum_pack (%s errors) y[%" PRId64 "] differs", what, i);
              break;
            }
          ob::put_scale(g4.data(), ob::scale_from_sumsq(s6, c));
          CHECK(g4 == x.gsend, "server sum_pack (%s errors) message differs", what);
        }
      }
      // Decode, with guards past n.
      Floats out(n + 16, k.unaligned);
      for (int64_t i = 0; i < n + 16; ++i) out.p[i] = 12345.0f;
      ob::host_decode(grecv.data(), L, out.p);
      const int64_t d = first_diff(out.p, x.out.data(), n);
      CHECK(d < 0, "decoded element %" PRId64 ": %.9g, expected %.9g", d, d < 0 ? 0.0 : double(out.p[d]),
            d < 0 ? 0.0 : double(x.out[size_t(d)]));
      for (int64_t i = n; i < n + 16; ++i)
        if (out.p[i] != 12345.0f) {
          CHECK(false, "decode wrote element %" PRId64 " past n", i);
          break;
        }
    }
  }
  set_case("%s", name.c_str());
}

}  // namespace

int main() {
  const uint64_t seed = lowbit_test_seed("test_comm_host_kernels");
  Rng rng(seed);
  const ob::HostIsa native = ob::host_isa();
  std::printf("instruction set: %s\n", ob::host_isa_name(native));
  const int64_t seg = sq::kSegment, lanes = sq::kLanes, par = ob::kParallelMin;
  const int64_t sizes[] = {1,         7,         8,           9,       15,      16,      17,      63,
                           64,        65,        127,         129,     1001,    lanes - 1, lanes, lanes + 1,
                           seg - 1,   seg,       seg + 1,     3 * seg + 13, par - 1, par + 8, 2 * par + 77,
                           5 * par + 4321};
  int cases = 0;
  for (int64_t n : sizes)
    for (int32_t W : {1, 2, 3, 4, 8})
      for (int32_t r : {0, W - 1}) {
        if (r == W - 1 && W == 1) continue;
        if (n > 4 * seg && W == 3) continue;  // keep the large sizes quick
        for (int variant = 0; variant < 2; ++variant) {
          Case k{n, W, r, variant == 1, variant == 1 || n % 2 == 1, 0};
          set_case("n %" PRId64 " world %d rank %d%s%s", n, W, r,
                   k.unaligned ? " unaligned" : "", k.error ? " error" : "");
          run_case(k, rng);
          ++cases;
        }
      }
  for (int special = 1; special <= 3; ++special)
    for (int64_t n : {int64_t(1001), 2 * par + 77})
      for (int32_t W : {1, 3}) {
        Case k{n, W, W - 1, special == 2, true, special};
        set_case("n %" PRId64 " world %d special %d", n, W, special);
        run_case(k, rng);
        ++cases;
      }
  ob::host_set_isa(native);
  ob::host_set_streaming(ob::HostStreaming::Auto);
  return report(cases, "the host kernels give the reference's bits (every ISA, 1-3 threads)");
}
