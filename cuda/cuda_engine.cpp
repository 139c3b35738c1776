#include "cuda/cuda_engine.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "core/qmaps.hpp"
#include "core/state.hpp"

namespace lowbit {
namespace cuda {
namespace {

[[noreturn]] void fail_cuda(cudaError_t e, const char* what) {
  lowbit_status_t status = e == cudaErrorMemoryAllocation ? LOWBIT_ERROR_OUT_OF_MEMORY : LOWBIT_ERROR_CUDA;
  fail(status, what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_cuda(e, what);
}

// Makes `device` current for the lifetime of the guard.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device_) check(cudaSetDevice(device_), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (prev_ != device_) cudaSetDevice(prev_);
  }

 private:
  int device_;
  int prev_ = 0;
};

template <class T>
void device_alloc(T** out, size_t count, const char* what) {
  void* p = nullptr;
  if (count == 0) count = 1;
  cudaError_t e = cudaMalloc(&p, count * sizeof(T));
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it so later launches do not report it
    fail_cuda(e, what);
  }
  *out = static_cast<T*>(p);
}

void device_free(void* p) noexcept {
  if (p) cudaFree(p);
}

uint8_t dtype_code(lowbit_dtype_t d, const char* what) {
  switch (d) {
    case LOWBIT_DTYPE_FLOAT32: return kF32;
    case LOWBIT_DTYPE_BFLOAT16: return kBF16;
    case LOWBIT_DTYPE_FLOAT16: return kF16;
    default: break;
  }
  fail(LOWBIT_ERROR_INVALID_ARGUMENT, what, " dtype = ", int(d), " is not a lowbit_dtype_t value");
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

uint8_t map_code(const QMap* map, lowbit_state_format_t format, int64_t param) {
  for (int id = 0; id < 4; ++id)
    if (map == &qmap(MapId(id))) {
      const int want = format == LOWBIT_STATE_8BIT ? 256 : 16;
      LOWBIT_REQUIRE(map->n == want, LOWBIT_ERROR_INTERNAL, "param ", param, ": a ", format_name(format),
                     " moment needs a ", want, "-code map, got ", map->n);
      return uint8_t(id);
    }
  fail(LOWBIT_ERROR_INTERNAL, "param ", param, ": the ", format_name(format),
       " moment's map is not one of the built-in quantization maps");
}

DevParam describe(const ParamView& v, int64_t id, int32_t group) {
  DevParam d;
  std::memset(&d, 0, sizeof d);  // padding too: tables are compared with memcmp
  d.param = v.param;
  d.ecc = v.ecc;
  d.numel = v.numel;
  d.group = group;
  d.pdtype = dtype_code(v.param_dtype, "param");
  d.rounding = uint8_t(v.rounding);
  d.num_moments = uint8_t(v.num_moments);
  d.param_al16 = aligned16(v.param);
  LOWBIT_REQUIRE(v.param != nullptr && v.numel > 0, LOWBIT_ERROR_INTERNAL, "param ", id, ": no data");
  LOWBIT_REQUIRE(v.num_moments >= 0 && v.num_moments <= 2, LOWBIT_ERROR_INTERNAL, "param ", id, ": ",
                 v.num_moments, " moments");
  LOWBIT_REQUIRE(v.param_dtype == LOWBIT_DTYPE_FLOAT32 || v.rounding != WeightRounding::ErrorCorrection ||
                     v.ecc != nullptr,
                 LOWBIT_ERROR_INTERNAL, "param ", id, ": error correction without error-correction bytes");
  d.map[0] = d.map[1] = kNoMap;
  for (int k = 0; k < v.num_moments; ++k) {
    const MomentView& m = v.moment[k];
    LOWBIT_REQUIRE(m.format >= LOWBIT_STATE_FP32 && m.format <= LOWBIT_STATE_FP8 && m.data != nullptr,
                   LOWBIT_ERROR_INTERNAL, "param ", id, ": moment ", k, " has format ", int(m.format),
                   m.data ? "" : " and no data");
    d.format[k] = uint8_t(m.format);
    d.second[k] = m.second ? 1 : 0;
    d.mdata[k] = m.data;
    d.mscale[k] = m.scales;
    if (is_quantized(m.format))
      LOWBIT_REQUIRE(m.scales != nullptr, LOWBIT_ERROR_INTERNAL, "param ", id, ": moment ", k, " has no scales");
    if (m.format == LOWBIT_STATE_8BIT || m.format == LOWBIT_STATE_4BIT) d.map[k] = map_code(m.map, m.format, id);
  }
  return d;
}

// Collects host ranges bound for device tables into upload batches (kernel
// parameters) and launches one upload kernel per full batch; small batches
// while the stream is being captured into a CUDA graph.
class Uploader {
 public:
  Uploader(UploadBatch& large, UploadBatchSmall& small, void* stream) : large_(large), small_(small), stream_(stream) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture), "cudaStreamIsCapturing");
    use_small_ = capture != cudaStreamCaptureStatusNone;
    reset();
  }
  void add(void* dst, const void* src, size_t bytes) {
    if (use_small_)
      add(small_, dst, src, bytes);
    else
      add(large_, dst, src, bytes);
  }
  void flush() {
    if (use_small_)
      flush(small_);
    else
      flush(large_);
  }

 private:
  void reset() {
    large_.num_segments = small_.num_segments = 0;
    large_.total_words = small_.total_words = 0;
  }
  template <class Batch>
  void add(Batch& b, void* dst, const void* src, size_t bytes) {
    uint32_t* d = static_cast<uint32_t*>(dst);
    const uint32_t* s = static_cast<const uint32_t*>(src);
    size_t words = bytes / 4;  // every table entry is a whole number of 32-bit words
    while (words > 0) {
      if (b.num_segments == kUploadSegments || b.total_words == Batch::kWords) flush(b);
      const size_t take = std::min(words, size_t(Batch::kWords - b.total_words));
      UploadSegment& seg = b.seg[b.num_segments++];
      seg.dst = d;
      seg.first_word = b.total_words;
      seg.words = int32_t(take);
      std::memcpy(b.payload + b.total_words, s, take * 4);
      b.total_words += int32_t(take);
      d += take;
      s += take;
      words -= take;
    }
  }
  template <class Batch>
  void flush(Batch& b) {
    if (b.num_segments > 0) {
      launch_upload(b, stream_);
      check(cudaGetLastError(), "launching a table upload");
    }
    b.num_segments = 0;
    b.total_words = 0;
  }

  UploadBatch& large_;
  UploadBatchSmall& small_;
  void* stream_;
  bool use_small_ = false;
};

}  // namespace

CudaEngine::CudaEngine(int device_index)
    : device_(device_index), batch_(new UploadBatch), small_batch_(new UploadBatchSmall) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(LOWBIT_ERROR_CUDA, "device: no usable CUDA device (cudaGetDeviceCount: ", cudaGetErrorName(e), ", ",
         cudaGetErrorString(e), ")");
  }
  LOWBIT_REQUIRE(device_index >= 0 && device_index < count, LOWBIT_ERROR_INVALID_ARGUMENT, "device_index = ",
                 device_index, " but ", count, " CUDA device(s) are visible");
  int major = 0, minor = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index), "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index), "cudaDeviceGetAttribute");
  LOWBIT_REQUIRE(major >= 8, LOWBIT_ERROR_UNSUPPORTED, "device_index = ", device_index, ": compute capability ",
                 major, ".", minor, " is below 8.0, the oldest this build has kernels for");

  DeviceGuard guard(device_);
  try {
    auto host_maps = std::make_unique<DevMaps>();
    std::memset(host_maps.get(), 0, sizeof(DevMaps));
    for (int id = 0; id < 4; ++id) host_maps->map[id] = qmap(MapId(id));
    device_alloc(&maps_, 1, "allocating the quantization maps");
    check(cudaMemcpy(maps_, host_maps.get(), sizeof(DevMaps), cudaMemcpyHostToDevice), "uploading the quantization maps");
    device_alloc(&flag_, 1, "allocating the step flag");
    check(cudaMemset(flag_, 0, sizeof(int32_t)), "cudaMemset");
    void* pinned = nullptr;
    check(cudaHostAlloc(&pinned, sizeof(int32_t), cudaHostAllocDefault), "cudaHostAlloc");
    host_flag_ = static_cast<int32_t*>(pinned);
    *host_flag_ = 0;
    check(cudaDeviceSynchronize(), "initialising the CUDA engine");
  } catch (...) {
    device_free(maps_);
    device_free(flag_);
    if (host_flag_) cudaFreeHost(host_flag_);
    throw;
  }
}

CudaEngine::~CudaEngine() {
  int prev = 0;
  bool restore = cudaGetDevice(&prev) == cudaSuccess && prev != device_;
  cudaSetDevice(device_);
  cudaDeviceSynchronize();
  for (void* p : {static_cast<void*>(maps_), static_cast<void*>(flag_), static_cast<void*>(params_),
                  static_cast<void*>(dyn_), static_cast<void*>(scalars_), static_cast<void*>(steps_),
                  static_cast<void*>(chunks_)})
    device_free(p);
  if (host_flag_) cudaFreeHost(host_flag_);
  if (restore) cudaSetDevice(prev);
}

void* CudaEngine::allocate_zeroed(size_t bytes) {
  if (bytes == 0) return nullptr;
  DeviceGuard guard(device_);
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(e == cudaErrorMemoryAllocation ? LOWBIT_ERROR_OUT_OF_MEMORY : LOWBIT_ERROR_CUDA, "could not allocate ", bytes,
         " bytes of optimizer state on CUDA device ", device_, ": ", cudaGetErrorString(e));
  }
  e = cudaMemset(p, 0, bytes);
  if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy);
  if (e != cudaSuccess) {
    cudaFree(p);
    fail_cuda(e, "zeroing optimizer state");
  }
  return p;
}

void CudaEngine::release(void* ptr) noexcept {
  if (!ptr) return;
  int prev = 0;
  bool restore = cudaGetDevice(&prev) == cudaSuccess && prev != device_;
  cudaSetDevice(device_);
  cudaDeviceSynchronize();  // no step may still use it
  cudaFree(ptr);
  if (restore) cudaSetDevice(prev);
}

void CudaEngine::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  DeviceGuard guard(device_);
  check(cudaDeviceSynchronize(), "waiting for the device before reading optimizer state");
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copying optimizer state to the host");
}

void CudaEngine::copy_from_host(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  DeviceGuard guard(device_);
  check(cudaDeviceSynchronize(), "waiting for the device before writing optimizer state");
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "copying optimizer state to the device");
}

void CudaEngine::grow(int64_t num_params, int64_t num_chunks) {
  if (num_params > param_cap_) {
    int64_t cap = std::max<int64_t>(num_params, param_cap_ * 2);
    DevParam* p = nullptr;
    DevDyn* d = nullptr;
    StepScalars* s = nullptr;
    int64_t* t = nullptr;
    try {
      device_alloc(&p, size_t(cap), "allocating the parameter table");
      device_alloc(&d, size_t(cap), "allocating the per-step table");
      device_alloc(&s, size_t(cap), "allocating the scalar table");
      device_alloc(&t, size_t(cap), "allocating the step counts");
      check(cudaMemset(t, 0, size_t(cap) * sizeof(int64_t)), "cudaMemset");
      if (steps_ && param_cap_ > 0)
        check(cudaMemcpy(t, steps_, size_t(param_cap_) * sizeof(int64_t), cudaMemcpyDeviceToDevice),
              "copying the step counts");
    } catch (...) {
      device_free(p);
      device_free(d);
      device_free(s);
      device_free(t);
      throw;
    }
    device_free(params_);
    device_free(dyn_);
    device_free(scalars_);
    device_free(steps_);
    params_ = p;
    dyn_ = d;
    scalars_ = s;
    steps_ = t;
    param_cap_ = cap;
  }
  if (num_chunks > chunk_cap_) {
    int64_t cap = std::max<int64_t>(num_chunks, chunk_cap_ * 2);
    DevChunk* c = nullptr;
    device_alloc(&c, size_t(cap), "allocating the chunk table");
    device_free(chunks_);
    chunks_ = c;
    chunk_cap_ = cap;
  }
  check(cudaDeviceSynchronize(), "growing the parameter tables");
}

void CudaEngine::bind(const ParamView* params, int64_t num_params, const Chunk* chunks, int64_t num_chunks,
                      const int32_t* param_group, void* stream) {
  DeviceGuard guard(device_);
  update_tables(params, num_params, chunks, num_chunks, param_group, stream);
}

void CudaEngine::update_tables(const ParamView* params, int64_t num_params, const Chunk* chunks, int64_t num_chunks,
                               const int32_t* param_group, void* stream) {
  LOWBIT_REQUIRE(num_params >= 0 && num_chunks >= 0 && (params || !num_params) && (chunks || !num_chunks),
                 LOWBIT_ERROR_INTERNAL, "bind: bad table sizes");
  LOWBIT_REQUIRE(num_params < (int64_t(1) << 31) && num_chunks * kSplit < (int64_t(1) << 31),
                 LOWBIT_ERROR_UNSUPPORTED, "bind: ", num_params, " params in ", num_chunks,
                 " chunks exceed the launch limits");
  std::vector<DevParam>& ps = params_host_;
  ps.resize(size_t(num_params));
  if (param_group) bound_groups_.assign(param_group, param_group + num_params);
  for (int64_t i = 0; i < num_params; ++i)
    ps[size_t(i)] = describe(params[i], i, i < int64_t(bound_groups_.size()) ? bound_groups_[size_t(i)] : 0);
  bool same_chunks = num_chunks == int64_t(bound_chunks_.size());
  for (int64_t k = 0; same_chunks && k < num_chunks; ++k) {
    const DevChunk& b = bound_chunks_[size_t(k)];
    same_chunks = b.begin == chunks[k].begin && b.end == chunks[k].end && b.param == chunks[k].param;
  }
  std::vector<DevChunk>& cs = chunks_host_;
  if (!same_chunks) {
    cs.resize(size_t(num_chunks));
    for (int64_t k = 0; k < num_chunks; ++k) {
      const Chunk& c = chunks[k];
      LOWBIT_REQUIRE(c.param >= 0 && c.param < num_params && c.begin >= 0 && c.begin < c.end &&
                         c.end <= params[c.param].numel && c.begin % kTile == 0,
                     LOWBIT_ERROR_INTERNAL, "bind: chunk ", k, " [", c.begin, ", ", c.end, ") of param ", c.param,
                     " is not a tile-aligned range of a registered parameter");
      DevChunk d;
      std::memset(&d, 0, sizeof d);
      d.begin = c.begin;
      d.end = c.end;
      d.param = c.param;
      cs[size_t(k)] = d;
    }
  }
  const bool same_params =
      ps.size() == bound_params_.size() &&
      (ps.empty() || std::memcmp(ps.data(), bound_params_.data(), ps.size() * sizeof(DevParam)) == 0);
  if (same_params && same_chunks) return;
  const int64_t old_params = int64_t(bound_params_.size());
  if (num_params > param_cap_ || num_chunks > chunk_cap_) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture), "cudaStreamIsCapturing");
    LOWBIT_REQUIRE(capture == cudaStreamCaptureStatusNone, LOWBIT_ERROR_INVALID_STATE,
                   "stream: parameters were registered since the last step, and the tables they need cannot be "
                   "allocated during a CUDA graph capture; take one step outside the capture first");
    // Reallocation: steps in flight may still read the old tables.
    check(cudaDeviceSynchronize(), "waiting for the device before growing the parameter tables");
    grow(num_params, num_chunks);  // new step counts are zero
  } else if (num_params > old_params) {
    check(cudaMemsetAsync(steps_ + old_params, 0, size_t(num_params - old_params) * sizeof(int64_t),
                          static_cast<cudaStream_t>(stream)),
          "cudaMemsetAsync");
  }
  // The new tables follow the work already on the stream.
  Uploader up(*batch_, *small_batch_, stream);
  if (!same_params) up.add(params_, ps.data(), ps.size() * sizeof(DevParam));
  if (!same_chunks) up.add(chunks_, cs.data(), cs.size() * sizeof(DevChunk));
  up.flush();
  if (!same_params) bound_params_.swap(ps);
  if (!same_chunks) bound_chunks_.swap(cs);
}

void CudaEngine::sync_tables(const ParamView* params, const Chunk* chunks, int64_t num_chunks, void* stream) {
  int64_t num_params = 0;
  for (int64_t k = 0; k < num_chunks; ++k) num_params = std::max<int64_t>(num_params, int64_t(chunks[k].param) + 1);
  update_tables(params, num_params, chunks, num_chunks, nullptr, stream);
}

void CudaEngine::set_device_scalars(const lowbit_hparams_t* device_hparams, uint64_t seed) {
  device_hparams_ = device_hparams;
  seed_ = seed;
}

void CudaEngine::upload_dyn(const ParamView* params, int64_t num_params, bool host_scalars, void* stream,
                            bool reuse_pending) {
  LOWBIT_REQUIRE(num_params == int64_t(bound_params_.size()), LOWBIT_ERROR_INTERNAL, "step: ", num_params,
                 " params given but ", bound_params_.size(), " bound");
  dyn_host_.resize(size_t(num_params));
  scalars_host_.clear();
  for (int64_t i = 0; i < num_params; ++i) {
    const ParamView& v = params[i];
    DevDyn d;
    std::memset(&d, 0, sizeof d);
    if (v.grad) {
      d.grad = v.grad;
      d.gdtype = dtype_code(v.grad_dtype, "grad");
      d.grad_al16 = aligned16(v.grad);
      if (host_scalars) {
        d.key = v.rounding_key;
        // Parameters of one group at the same step share their scalars:
        // reuse the last few entries before appending.
        int32_t idx = -1;
        const int32_t n = int32_t(scalars_host_.size());
        for (int32_t k = n - 1; k >= 0 && k >= n - 8; --k)
          if (std::memcmp(&scalars_host_[size_t(k)], &v.scalars, sizeof(StepScalars)) == 0) {
            idx = k;
            break;
          }
        if (idx < 0) {
          idx = n;
          scalars_host_.push_back(v.scalars);
        }
        d.scalar_idx = idx;
      }
    }
    dyn_host_[size_t(i)] = d;
  }
  // Reuse is only safe for the upload enqueued by any_nonfinite() just before
  // step() in the same Optimizer::step: otherwise a replayed CUDA graph may
  // have rewritten the device tables since.
  const bool pending = dyn_pending_;
  dyn_pending_ = false;
  if (reuse_pending && pending && dyn_host_.size() == dyn_uploaded_.size() && scalars_host_.size() == scalars_uploaded_.size() &&
      (dyn_host_.empty() ||
       std::memcmp(dyn_host_.data(), dyn_uploaded_.data(), dyn_host_.size() * sizeof(DevDyn)) == 0) &&
      (scalars_host_.empty() || std::memcmp(scalars_host_.data(), scalars_uploaded_.data(),
                                            scalars_host_.size() * sizeof(StepScalars)) == 0))
    return;  // the check just enqueued uploaded exactly these tables
  Uploader up(*batch_, *small_batch_, stream);
  up.add(dyn_, dyn_host_.data(), dyn_host_.size() * sizeof(DevDyn));
  up.add(scalars_, scalars_host_.data(), scalars_host_.size() * sizeof(StepScalars));
  up.flush();
  dyn_uploaded_.swap(dyn_host_);
  scalars_uploaded_.swap(scalars_host_);
}

void CudaEngine::enqueue_check(void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  check(cudaMemsetAsync(flag_, 0, sizeof(int32_t), s), "cudaMemsetAsync");
  launch_check(CheckArgs{params_, dyn_, chunks_, flag_}, int64_t(bound_chunks_.size()), stream);
  check(cudaGetLastError(), "launching the non-finite check");
  check(cudaMemcpyAsync(host_flag_, flag_, sizeof(int32_t), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
}

void CudaEngine::launch_all(Algo algo, bool check_nonfinite, bool device_scalars, void* stream) {
  const int64_t num_chunks = int64_t(bound_chunks_.size());
  const int64_t num_params = int64_t(bound_params_.size());
  if (device_scalars) {
    PrepareArgs p;
    std::memset(&p, 0, sizeof p);
    p.params = params_;
    p.dyn = dyn_;
    p.scalars = scalars_;
    p.hparams = device_hparams_;
    p.steps = steps_;
    p.seed = seed_;
    p.num_params = num_params;
    p.bias_correction_allowed = algo != Algo::Lion;
    launch_prepare(p, stream);
    check(cudaGetLastError(), "launching the scalar computation");
  }
  if (check_nonfinite) enqueue_check(stream);
  StepArgs a;
  std::memset(&a, 0, sizeof a);
  a.params = params_;
  a.dyn = dyn_;
  a.scalars = scalars_;
  a.chunks = chunks_;
  a.maps = maps_;
  a.skip_flag = check_nonfinite ? flag_ : nullptr;
  switch (algo) {
    case Algo::AdamW: launch_step<Algo::AdamW>(a, num_chunks, stream); break;
    case Algo::Adam: launch_step<Algo::Adam>(a, num_chunks, stream); break;
    case Algo::Lion: launch_step<Algo::Lion>(a, num_chunks, stream); break;
    case Algo::Sgd: launch_step<Algo::Sgd>(a, num_chunks, stream); break;
  }
  check(cudaGetLastError(), "launching the step kernel");
  if (device_scalars) {
    launch_finalize(FinalizeArgs{dyn_, steps_, a.skip_flag, num_params}, stream);
    check(cudaGetLastError(), "launching the step-count update");
  }
}

bool CudaEngine::any_nonfinite(const ParamView* params, const Chunk* chunks, int64_t num_chunks, void* stream) {
  DeviceGuard guard(device_);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture), "cudaStreamIsCapturing");
  LOWBIT_REQUIRE(capture == cudaStreamCaptureStatusNone, LOWBIT_ERROR_UNSUPPORTED,
                 "stream: with skip_nonfinite = 1 a step waits for the non-finite check on the host, which a CUDA "
                 "graph capture does not allow; capture with skip_nonfinite = 0");
  sync_tables(params, chunks, num_chunks, stream);
  upload_dyn(params, int64_t(bound_params_.size()), true, stream, false);
  enqueue_check(stream);
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "waiting for the non-finite check");
  dyn_pending_ = true;  // step() may reuse these tables
  return *host_flag_ != 0;
}

void CudaEngine::step(Algo algo, const ParamView* params, const Chunk* chunks, int64_t num_chunks, void* stream) {
  DeviceGuard guard(device_);
  sync_tables(params, chunks, num_chunks, stream);
  upload_dyn(params, int64_t(bound_params_.size()), true, stream, true);
  launch_all(algo, false, false, stream);
}

void CudaEngine::enqueue_step(Algo algo, const ParamView* params, int64_t num_params, bool check_nonfinite,
                              void* stream) {
  DeviceGuard guard(device_);
  const bool device_scalars = device_hparams_ != nullptr;
  upload_dyn(params, num_params, !device_scalars, stream, false);
  launch_all(algo, check_nonfinite, device_scalars, stream);
}

void CudaEngine::read_steps(int64_t* out, int64_t num_params) {
  LOWBIT_REQUIRE(num_params == int64_t(bound_params_.size()), LOWBIT_ERROR_INTERNAL, "read_steps: ", num_params,
                 " params asked, ", bound_params_.size(), " bound");
  if (!num_params) return;
  DeviceGuard guard(device_);
  check(cudaDeviceSynchronize(), "waiting for the device before reading step counts");
  check(cudaMemcpy(out, steps_, size_t(num_params) * sizeof(int64_t), cudaMemcpyDeviceToHost), "reading step counts");
}

void CudaEngine::write_steps(const int64_t* in, int64_t num_params) {
  LOWBIT_REQUIRE(num_params == int64_t(bound_params_.size()), LOWBIT_ERROR_INTERNAL, "write_steps: ", num_params,
                 " params given, ", bound_params_.size(), " bound");
  if (!num_params) return;
  DeviceGuard guard(device_);
  check(cudaDeviceSynchronize(), "waiting for the device before writing step counts");
  check(cudaMemcpy(steps_, in, size_t(num_params) * sizeof(int64_t), cudaMemcpyHostToDevice), "writing step counts");
}

}  // namespace cuda

std::unique_ptr<Engine> make_cuda_engine(int device_index) {
  return std::make_unique<cuda::CudaEngine>(device_index);
}

}  // namespace lowbit
