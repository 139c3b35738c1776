// The error state of a communicator: sizes, read-back, and the versioned
// blob of save_errors / load_errors (format in docs/COMMUNICATOR.md), and
// reset_errors.
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "communicator_impl.hpp"
#include "core/error.hpp"
#include "error_format.hpp"
#include "host_kernels.hpp"
#ifdef LOWBIT_HAVE_CUDA
#include "cuda/runtime.hpp"
#include "device.hpp"
#endif

namespace lowbit {

using onebit::Layout;

namespace {

constexpr uint64_t kFnvBasis = 1469598103934665603ull;

uint64_t fnv1a64(const uint8_t* p, size_t n, uint64_t h = kFnvBasis) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

constexpr char kMagic[8] = {'L', 'B', 'C', 'O', 'M', 'M', 'E', 'R'};
// Version 2 checksums the whole blob (header included); version 1, still
// read, checksummed the payload only.
constexpr uint32_t kBlobVersion = 2;
// Version 3: compact errors (BF16 / INT8): bytes 56..59 hold the format,
// 60..63 zero, the payload the errors in that format (error_format.hpp).
constexpr uint32_t kCompactVersion = 3;

const char* format_name(int32_t f) {
  switch (f) {
    case LOWBIT_COMM_ERROR_FP32: return "LOWBIT_COMM_ERROR_FP32";
    case LOWBIT_COMM_ERROR_BF16: return "LOWBIT_COMM_ERROR_BF16";
    case LOWBIT_COMM_ERROR_INT8: return "LOWBIT_COMM_ERROR_INT8";
    default: break;
  }
  return "an unknown format";
}
constexpr int64_t kHeaderBytes = 64;
constexpr int64_t kChecksumAt = 48, kReservedAt = 56;

// Version 2: FNV-1a-64 of every byte of the blob, the 8 checksum bytes read as 0.
uint64_t blob_checksum(const uint8_t* blob, size_t size) {
  static const uint8_t zero[8] = {};
  uint64_t h = fnv1a64(blob, size_t(kChecksumAt));
  h = fnv1a64(zero, 8, h);
  return fnv1a64(blob + kReservedAt, size - size_t(kReservedAt), h);
}

template <class T>
void put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <class T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// The header's world size and rank (this communicator's) and its element
// counts (consistent with the layout of n elements): the worker error's n
// and the server error's c.
void blob_counts(const uint8_t* data, int32_t world, int32_t rank, int64_t& n, int64_t& c) {
  const int32_t w = get<int32_t>(data + 16), r = get<int32_t>(data + 20);
  LOWBIT_REQUIRE(w == world, LOWBIT_ERROR_STATE_MISMATCH, "buffer was saved with world size ", w,
                 ", this communicator has ", world);
  LOWBIT_REQUIRE(r == rank, LOWBIT_ERROR_STATE_MISMATCH, "buffer was saved by rank ", r, ", this is rank ", rank,
                 " (each rank restores its own errors)");
  n = get<int64_t>(data + 24);
  const int64_t chunk = get<int64_t>(data + 32);
  c = get<int64_t>(data + 40);
  LOWBIT_REQUIRE(n >= 0 && n <= onebit::kMaxNumel, LOWBIT_ERROR_CORRUPT_DATA, "buffer holds numel ", n);
  const Layout L = Layout::make(n, world, rank);
  LOWBIT_REQUIRE(chunk == (n ? L.chunk : 0) && c == (n ? L.server_numel() : 0), LOWBIT_ERROR_CORRUPT_DATA,
                 "buffer header is inconsistent (numel ", n, ", chunk ", chunk, ", server numel ", c, ")");
}

}  // namespace

int64_t Communicator::worker_error_numel() const { return impl_->error_numel(); }

int64_t Communicator::server_error_numel() const {
  const int64_t n = impl_->error_numel();
  return n ? Layout::make(n, world(), rank()).server_numel() : 0;
}

void Communicator::read_errors(float* worker, int64_t worker_numel, float* server, int64_t server_numel,
                               void* stream) const {
  const int64_t wn = worker_error_numel(), sn = server_error_numel();
  LOWBIT_REQUIRE(!worker || worker_numel == wn, LOWBIT_ERROR_INVALID_ARGUMENT, "worker_numel is ", worker_numel,
                 ", but this rank's worker error has ", wn, " elements");
  LOWBIT_REQUIRE(!server || server_numel == sn, LOWBIT_ERROR_INVALID_ARGUMENT, "server_numel is ", server_numel,
                 ", but this rank's server error has ", sn, " elements");
  impl_->copy_errors_out(worker, server, stream);
}

namespace {

// The blob of compact errors (version 3).
std::vector<uint8_t> save_compact(const Communicator::Impl& I, int32_t world, int32_t rank) {
  const int32_t f = I.error_format;
  const int64_t n = I.error_numel();
  const Layout L = Layout::make(n, world, rank);
  const int64_t c = n ? L.server_numel() : 0;
  const int64_t wb = n ? onebit::error_bytes(f, n) : 0, sb = n ? onebit::error_bytes(f, c) : 0;
  std::vector<uint8_t> out(size_t(kHeaderBytes + wb + sb), 0);
  uint8_t* h = out.data();
  std::memcpy(h, kMagic, 8);
  put<uint32_t>(h + 8, kCompactVersion);
  put<uint32_t>(h + 12, uint32_t(kHeaderBytes));
  put<int32_t>(h + 16, world);
  put<int32_t>(h + 20, rank);
  put<int64_t>(h + 24, n);
  put<int64_t>(h + 32, n ? L.chunk : 0);
  put<int64_t>(h + 40, c);
  put<uint32_t>(h + kReservedAt, uint32_t(f));
  put<uint32_t>(h + kReservedAt + 4, 0);
  if (n && I.bound) {
    std::memcpy(h + kHeaderBytes, I.buf.err.as(), size_t(wb));
    if (sb) std::memcpy(h + kHeaderBytes + wb, I.buf.serr.as(), size_t(sb));
  } else if (n) {
    std::memcpy(h + kHeaderBytes, I.pending_raw.data(), size_t(wb + sb));
  }
  put<uint64_t>(h + kChecksumAt, blob_checksum(out.data(), out.size()));
  return out;
}

}  // namespace

int64_t Communicator::error_blob_bytes() const {
  const int32_t f = impl_->error_format;
  const int64_t n = worker_error_numel(), c = server_error_numel();
  return kHeaderBytes + (n ? onebit::error_bytes(f, n) + onebit::error_bytes(f, c) : 0);
}

std::vector<uint8_t> Communicator::save_errors(void* stream) const {
  const Impl& I = *impl_;
  if (I.compact()) return save_compact(I, world(), rank());
  const int64_t n = I.error_numel();
  const Layout L = Layout::make(n, world(), rank());
  const int64_t c = n ? L.server_numel() : 0;
  std::vector<uint8_t> out(size_t(kHeaderBytes + 4 * (n + c)), 0);
  uint8_t* h = out.data();
  std::memcpy(h, kMagic, 8);
  put<uint32_t>(h + 8, kBlobVersion);
  put<uint32_t>(h + 12, uint32_t(kHeaderBytes));
  put<int32_t>(h + 16, world());
  put<int32_t>(h + 20, rank());
  put<int64_t>(h + 24, n);
  put<int64_t>(h + 32, n ? L.chunk : 0);
  put<int64_t>(h + 40, c);
  uint8_t* payload = h + kHeaderBytes;
  if (n) {
    // The payload is fp32, possibly unaligned in a byte vector: go through
    // aligned temporaries.
    std::vector<float> w(static_cast<size_t>(n)), s(static_cast<size_t>(c));
    I.copy_errors_out(w.data(), c ? s.data() : nullptr, stream);
    std::memcpy(payload, w.data(), size_t(n) * 4);
    if (c) std::memcpy(payload + n * 4, s.data(), size_t(c) * 4);
  }
  put<uint64_t>(h + kReservedAt, 0);
  put<uint64_t>(h + kChecksumAt, blob_checksum(out.data(), out.size()));
  return out;
}

void Communicator::load_errors(const uint8_t* data, int64_t size, void* stream) {
  Impl& I = *impl_;
  LOWBIT_REQUIRE(data != nullptr, LOWBIT_ERROR_NULL_POINTER, "buffer is NULL");
  LOWBIT_REQUIRE(size >= kHeaderBytes, LOWBIT_ERROR_CORRUPT_DATA, "size is ", size, " bytes, smaller than the ",
                 kHeaderBytes, "-byte header of a communicator error blob (truncated)");
  LOWBIT_REQUIRE(std::memcmp(data, kMagic, 8) == 0, LOWBIT_ERROR_CORRUPT_DATA,
                 "buffer does not start with \"LBCOMMER\" (not a communicator error blob)");
  const uint32_t version = get<uint32_t>(data + 8);
  LOWBIT_REQUIRE(version == 1 || version == kBlobVersion || version == kCompactVersion,
                 LOWBIT_ERROR_VERSION_MISMATCH, "buffer has format version ", version,
                 " (this library reads versions 1, ", kBlobVersion, " and ", kCompactVersion, ")");
  LOWBIT_REQUIRE(get<uint32_t>(data + 12) == uint32_t(kHeaderBytes), LOWBIT_ERROR_CORRUPT_DATA,
                 "buffer header size is ", get<uint32_t>(data + 12), " (expected ", kHeaderBytes, ")");
  if (version == kCompactVersion) {
    const uint32_t f = get<uint32_t>(data + kReservedAt), zero = get<uint32_t>(data + kReservedAt + 4);
    LOWBIT_REQUIRE((f == LOWBIT_COMM_ERROR_BF16 || f == LOWBIT_COMM_ERROR_INT8) && zero == 0,
                   LOWBIT_ERROR_CORRUPT_DATA, "buffer header bytes ", kReservedAt, "..", kReservedAt + 7,
                   " (error format, 0) hold ", f, ", ", zero, " (expected 1 bf16 or 2 int8, then 0)");
    LOWBIT_REQUIRE(int32_t(f) == I.error_format, LOWBIT_ERROR_STATE_MISMATCH, "buffer holds errors in ",
                   format_name(int32_t(f)), ", but this communicator keeps them in ", format_name(I.error_format),
                   " (lowbit_comm_config_t.error_format: restore into a communicator of the same format)");
    load_compact(data, size, stream);
    return;
  }
  LOWBIT_REQUIRE(!I.compact(), LOWBIT_ERROR_STATE_MISMATCH,
                 "buffer holds errors in LOWBIT_COMM_ERROR_FP32 (version ", version,
                 "), but this communicator keeps them in ", format_name(I.error_format),
                 " (lowbit_comm_config_t.error_format: restore into a communicator of the same format)");
  const uint64_t reserved = get<uint64_t>(data + kReservedAt);
  LOWBIT_REQUIRE(reserved == 0, LOWBIT_ERROR_CORRUPT_DATA, "buffer header bytes ", kReservedAt, "..",
                 kReservedAt + 7, " (reserved) hold 0x", std::hex, reserved, std::dec,
                 "; they must be 0 (corrupted, or written by a newer format this library does not know)");
  int64_t n = 0, c = 0;
  blob_counts(data, world(), rank(), n, c);
  const int64_t expected = kHeaderBytes + 4 * (n + c);
  LOWBIT_REQUIRE(size >= expected, LOWBIT_ERROR_CORRUPT_DATA, "size is ", size, " bytes, but the blob needs ",
                 expected, " (truncated)");
  LOWBIT_REQUIRE(size == expected, LOWBIT_ERROR_CORRUPT_DATA, "size is ", size, " bytes, ", size - expected,
                 " more than the blob's ", expected);
  const uint8_t* payload = data + kHeaderBytes;
  const uint64_t sum = version == 1 ? fnv1a64(payload, size_t(4 * (n + c))) : blob_checksum(data, size_t(size));
  LOWBIT_REQUIRE(sum == get<uint64_t>(data + kChecksumAt), LOWBIT_ERROR_CORRUPT_DATA,
                 "buffer checksum mismatch (corrupted)");
  std::vector<float> wv(static_cast<size_t>(n)), sv(static_cast<size_t>(c));
  if (n) std::memcpy(wv.data(), payload, size_t(n) * 4);
  if (c) std::memcpy(sv.data(), payload + n * 4, size_t(c) * 4);
  for (int64_t i = 0; i < n; ++i)
    LOWBIT_REQUIRE(std::isfinite(wv[size_t(i)]), LOWBIT_ERROR_CORRUPT_DATA, "buffer: worker error element ", i,
                   " is not finite");
  for (int64_t i = 0; i < c; ++i)
    LOWBIT_REQUIRE(std::isfinite(sv[size_t(i)]), LOWBIT_ERROR_CORRUPT_DATA, "buffer: server error element ", i,
                   " is not finite");
  I.stage = Impl::Stage::Idle;
  if (n == 0) {
    reset_errors(stream);
    return;
  }
  if (I.bound && I.buf.n == n) {
    const size_t wb = size_t(n) * 4, sb = size_t(c) * 4;
    if (I.buf.device == LOWBIT_DEVICE_CPU) {
      I.buf.lazy = false;
      std::memcpy(I.buf.err.as(), wv.data(), wb);
      if (sb) std::memcpy(I.buf.serr.as(), sv.data(), sb);
    } else {
#ifdef LOWBIT_HAVE_CUDA
      cuda::DeviceGuard guard(I.buf.device_index);
      onebit::dev::copy_async(I.buf.err.as(), wv.data(), wb, stream);
      onebit::dev::copy_async(I.buf.serr.as(), sv.data(), sb, stream);
      onebit::dev::sync(stream);
#endif
    }
    return;
  }
  I.bound = false;
  I.has_pending = true;
  I.pending_n = n;
  I.pending_worker.swap(wv);
  I.pending_server.swap(sv);
}

void Communicator::load_compact(const uint8_t* data, int64_t size, void* stream) {
  Impl& I = *impl_;
  const int32_t f = I.error_format;
  int64_t n = 0, c = 0;
  blob_counts(data, world(), rank(), n, c);
  const int64_t wb = n ? onebit::error_bytes(f, n) : 0, sb = n ? onebit::error_bytes(f, c) : 0;
  const int64_t expected = kHeaderBytes + wb + sb;
  LOWBIT_REQUIRE(size >= expected, LOWBIT_ERROR_CORRUPT_DATA, "size is ", size, " bytes, but the blob needs ",
                 expected, " (truncated)");
  LOWBIT_REQUIRE(size == expected, LOWBIT_ERROR_CORRUPT_DATA, "size is ", size, " bytes, ", size - expected,
                 " more than the blob's ", expected);
  LOWBIT_REQUIRE(blob_checksum(data, size_t(size)) == get<uint64_t>(data + kChecksumAt), LOWBIT_ERROR_CORRUPT_DATA,
                 "buffer checksum mismatch (corrupted)");
  const uint8_t* payload = data + kHeaderBytes;
  int64_t bad = 0;
  const char* what = f == LOWBIT_COMM_ERROR_INT8 ? "element or block" : "element";
  LOWBIT_REQUIRE(!n || onebit::host_errors_valid(f, payload, n, &bad), LOWBIT_ERROR_CORRUPT_DATA,
                 "buffer: worker error ", what, " ", bad, " is not finite or not a valid code");
  LOWBIT_REQUIRE(!c || onebit::host_errors_valid(f, payload + wb, c, &bad), LOWBIT_ERROR_CORRUPT_DATA,
                 "buffer: server error ", what, " ", bad, " is not finite or not a valid code");
  I.stage = Impl::Stage::Idle;
  if (n == 0) {
    reset_errors(stream);
    return;
  }
  if (I.bound && I.buf.n == n) {
    std::memcpy(I.buf.err.as(), payload, size_t(wb));
    if (sb) std::memcpy(I.buf.serr.as(), payload + wb, size_t(sb));
    return;
  }
  std::vector<uint8_t> raw(payload, payload + wb + sb);
  I.bound = false;
  I.has_pending = true;
  I.pending_n = n;
  I.pending_raw.swap(raw);
}

void Communicator::reset_errors(void* stream) {
  (void)stream;
  Impl& I = *impl_;
  I.stage = Impl::Stage::Idle;
  I.bound = false;
  I.has_pending = false;
  I.pending_n = 0;
  std::vector<float>().swap(I.pending_worker);
  std::vector<float>().swap(I.pending_server);
  std::vector<uint8_t>().swap(I.pending_raw);
}

}  // namespace lowbit
