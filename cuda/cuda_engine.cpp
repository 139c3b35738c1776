#include "cuda/cuda_engine.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "core/pass.hpp"
#include "core/qmaps.hpp"
#include "core/state.hpp"
#include "cuda/runtime.hpp"

namespace lowbit {
namespace cuda {
namespace {

template <class T>
void device_alloc(T** out, size_t count, const char* what) {
  void* p = nullptr;
  if (count == 0) count = 1;
  check(cudaMalloc(&p, count * sizeof(T)), what);
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
  for (int id = 0; id < kNumMaps; ++id)
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
    d.coding[k] = uint8_t((m.second ? kCodeSecond : 0) | (m.stochastic ? kCodeStochastic : 0));
    d.norm[k] = uint8_t(m.norm);
    if (m.norm != Norm::Block) {
      LOWBIT_REQUIRE(v.shape.ndim >= 2, LOWBIT_ERROR_INTERNAL, "param ", id, ": a ", norm_name(m.norm),
                     " moment without a shape");
      d.shape = v.shape;
    }
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
    for (int id = 0; id < kNumMaps; ++id) host_maps->map[id] = qmap(MapId(id));
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
                  static_cast<void*>(flat_), static_cast<void*>(chunks_), static_cast<void*>(hparams_),
                  static_cast<void*>(items_), static_cast<void*>(shaped_), static_cast<void*>(partials_),
                  static_cast<void*>(pass_partials_)})
    device_free(p);
  if (host_flag_) cudaFreeHost(host_flag_);
  if (restore) cudaSetDevice(prev);
}


void* CudaEngine::allocate_zeroed(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = allocate_scratch(bytes);
  cudaError_t e = cudaMemset(p, 0, bytes);
  if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy);
  if (e != cudaSuccess) {
    cudaFree(p);
    throw_cuda_error(e, "zeroing optimizer state");
  }
  return p;
}

void* CudaEngine::allocate_scratch(size_t bytes) {
  if (bytes == 0) return nullptr;
  DeviceGuard guard(device_);
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(e == cudaErrorMemoryAllocation ? LOWBIT_ERROR_OUT_OF_MEMORY : LOWBIT_ERROR_CUDA, "could not allocate ", bytes,
         " bytes of optimizer state on CUDA device ", device_, ": ", cudaGetErrorString(e));
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

void CudaEngine::copy_to_host(void* dst, const void* src, size_t bytes, void* stream) {
  if (!bytes) return;
  DeviceGuard guard(device_);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "copying optimizer state to the host");
  check(cudaStreamSynchronize(s), "waiting for the copy of optimizer state to the host");
}

void CudaEngine::copy_from_host(void* dst, const void* src, size_t bytes, void* stream) {
  if (!bytes) return;
  DeviceGuard guard(device_);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s), "copying optimizer state to the device");
  check(cudaStreamSynchronize(s), "waiting for the copy of optimizer state to the device");
}

void CudaEngine::wait(void* stream) {
  DeviceGuard guard(device_);
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "waiting for the stream");
}

void CudaEngine::check_count(int64_t num_params, const char* what) const {
  LOWBIT_REQUIRE(num_params == int64_t(bound_params_.size()), LOWBIT_ERROR_INTERNAL, what, ": ", num_params,
                 " params given, ", bound_params_.size(), " bound");
}

void CudaEngine::grow(int64_t num_params, int64_t num_chunks) {
  if (num_params > param_cap_) {
    const int64_t cap = std::max<int64_t>(num_params, param_cap_ * 2);
    DevParam* p = nullptr;
    DevDyn* d = nullptr;
    StepScalars* s = nullptr;
    int64_t* t = nullptr;
    DevFlat* o = nullptr;
    try {
      device_alloc(&p, size_t(cap), "allocating the parameter table");
      device_alloc(&d, size_t(cap), "allocating the per-step table");
      device_alloc(&s, size_t(cap), "allocating the scalar table");
      device_alloc(&t, size_t(cap), "allocating the step counts");
      device_alloc(&o, size_t(cap), "allocating the flat-buffer table");
      check(cudaMemset(t, 0, size_t(cap) * sizeof(int64_t)), "cudaMemset");
      check(cudaMemset(o, 0, size_t(cap) * sizeof(DevFlat)), "cudaMemset");
      if (param_cap_ > 0) {
        // Tables of the bound parameters carry over (the static ones are re-uploaded by bind()).
        check(cudaMemcpy(t, steps_, size_t(param_cap_) * sizeof(int64_t), cudaMemcpyDeviceToDevice),
              "copying the step counts");
        check(cudaMemcpy(p, params_, size_t(param_cap_) * sizeof(DevParam), cudaMemcpyDeviceToDevice),
              "copying the parameter table");
        check(cudaMemcpy(o, flat_, size_t(param_cap_) * sizeof(DevFlat), cudaMemcpyDeviceToDevice),
              "copying the flat-buffer table");
      }
    } catch (...) {
      for (void* q : {static_cast<void*>(p), static_cast<void*>(d), static_cast<void*>(s), static_cast<void*>(t),
                      static_cast<void*>(o)})
        device_free(q);
      throw;
    }
    for (void* q : {static_cast<void*>(params_), static_cast<void*>(dyn_), static_cast<void*>(scalars_),
                    static_cast<void*>(steps_), static_cast<void*>(flat_)})
      device_free(q);
    params_ = p;
    dyn_ = d;
    scalars_ = s;
    steps_ = t;
    flat_ = o;
    param_cap_ = cap;
  }
  if (num_chunks > chunk_cap_) {
    const int64_t cap = std::max<int64_t>(num_chunks, chunk_cap_ * 2);
    DevChunk* c = nullptr;
    PassPartial* partials = nullptr;
    try {
      device_alloc(&c, size_t(cap), "allocating the chunk table");
      device_alloc(&partials, size_t(cap), "allocating the pass partials");
      if (chunk_cap_ > 0)
        check(cudaMemcpy(c, chunks_, size_t(chunk_cap_) * sizeof(DevChunk), cudaMemcpyDeviceToDevice),
              "copying the chunk table");
    } catch (...) {
      device_free(c);
      device_free(partials);
      throw;
    }
    device_free(chunks_);
    device_free(pass_partials_);
    chunks_ = c;
    pass_partials_ = partials;
    chunk_cap_ = cap;
  }
  check(cudaDeviceSynchronize(), "growing the parameter tables");
}

void CudaEngine::bind(const ParamView* params, int64_t num_params, const Chunk* chunks, int64_t num_chunks,
                      const int32_t* param_group, int64_t first_changed, void* stream) {
  DeviceGuard guard(device_);
  LOWBIT_REQUIRE(num_params >= 0 && num_chunks >= 0 && (params || !num_params) && (chunks || !num_chunks) &&
                     (param_group || !num_params),
                 LOWBIT_ERROR_INTERNAL, "bind: bad table sizes");
  LOWBIT_REQUIRE(num_params < (int64_t(1) << 31) && num_chunks * kSplit < (int64_t(1) << 31),
                 LOWBIT_ERROR_UNSUPPORTED, "bind: ", num_params, " params in ", num_chunks,
                 " chunks exceed the launch limits");
  const int64_t old_params = int64_t(bound_params_.size());
  const int64_t first = std::max<int64_t>(0, std::min({first_changed, num_params, old_params}));
  // Chunks are in parameter order: those of the parameters before `first` are unchanged.
  const int64_t first_chunk = std::lower_bound(chunks, chunks + num_chunks, first,
                                               [](const Chunk& c, int64_t p) { return c.param < p; }) -
                              chunks;

  std::vector<DevParam> ps(size_t(num_params - first));
  for (int64_t i = first; i < num_params; ++i) ps[size_t(i - first)] = describe(params[i], i, param_group[i]);
  std::vector<DevChunk> cs(size_t(num_chunks - first_chunk));
  for (int64_t k = first_chunk; k < num_chunks; ++k) {
    const Chunk& c = chunks[k];
    LOWBIT_REQUIRE(c.param >= 0 && c.param < num_params && c.begin >= 0 && c.begin < c.end &&
                       c.end <= params[c.param].numel && c.begin % kTile == 0 &&
                       (k == 0 || chunks[k - 1].param <= c.param),
                   LOWBIT_ERROR_INTERNAL, "bind: chunk ", k, " [", c.begin, ", ", c.end, ") of param ", c.param,
                   " is not a tile-aligned range of a registered parameter in parameter order");
    DevChunk d;
    std::memset(&d, 0, sizeof d);
    d.begin = c.begin;
    d.end = c.end;
    d.param = c.param;
    cs[size_t(k - first_chunk)] = d;
  }
  // The first entries that differ from what the device holds.
  int64_t p_diff = first;
  while (p_diff < std::min(num_params, old_params) &&
         std::memcmp(&ps[size_t(p_diff - first)], &bound_params_[size_t(p_diff)], sizeof(DevParam)) == 0)
    ++p_diff;
  const int64_t old_chunks = int64_t(bound_chunks_.size());
  int64_t c_diff = first_chunk;
  while (c_diff < std::min(num_chunks, old_chunks) &&
         std::memcmp(&cs[size_t(c_diff - first_chunk)], &bound_chunks_[size_t(c_diff)], sizeof(DevChunk)) == 0)
    ++c_diff;
  const bool params_changed = p_diff < num_params, chunks_changed = c_diff < num_chunks;

  if (num_params > param_cap_ || num_chunks > chunk_cap_) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture), "cudaStreamIsCapturing");
    LOWBIT_REQUIRE(capture == cudaStreamCaptureStatusNone, LOWBIT_ERROR_INVALID_STATE,
                   "stream: the parameter tables must grow, which a CUDA graph capture does not allow; take one "
                   "step with these parameters outside the capture first");
    // Reallocation: steps in flight may still read the old tables.
    check(cudaDeviceSynchronize(), "waiting for the device before growing the parameter tables");
    grow(num_params, num_chunks);
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (num_params > old_params) {
    check(cudaMemsetAsync(steps_ + old_params, 0, size_t(num_params - old_params) * sizeof(int64_t), s),
          "cudaMemsetAsync");
    check(cudaMemsetAsync(flat_ + old_params, 0, size_t(num_params - old_params) * sizeof(DevFlat), s),
          "cudaMemsetAsync");
  }
  Uploader up(*batch_, *small_batch_, stream);
  if (params_changed)
    up.add(params_ + p_diff, &ps[size_t(p_diff - first)], size_t(num_params - p_diff) * sizeof(DevParam));
  if (chunks_changed)
    up.add(chunks_ + c_diff, &cs[size_t(c_diff - first_chunk)], size_t(num_chunks - c_diff) * sizeof(DevChunk));
  up.flush();
  bound_params_.resize(size_t(first));
  bound_params_.insert(bound_params_.end(), ps.begin(), ps.end());
  bound_chunks_.resize(size_t(first_chunk));
  bound_chunks_.insert(bound_chunks_.end(), cs.begin(), cs.end());
  dyn_host_.resize(size_t(num_params));
  bind_shaped(params, num_params);
}

void CudaEngine::bind_shaped(const ParamView* params, int64_t num_params) {
  std::vector<DevStatItem> items;
  std::vector<DevShaped> shaped;
  int64_t partials = 0;
  for (int64_t i = 0; i < num_params; ++i) {
    const ParamView& pv = params[i];
    const bool r1[2] = {pv.num_moments > 0 && pv.moment[0].norm == Norm::Rank1,
                        pv.num_moments > 1 && pv.moment[1].norm == Norm::Rank1};
    const bool fac = pv.num_moments > 1 && pv.moment[1].norm == Norm::Factored;
    if (!r1[0] && !r1[1] && !fac) continue;
    const Shape& sh = pv.shape;
    const int64_t C = shape_cols(sh), rows = shape_rows(sh, pv.numel);
    if (!fac && C % 8 == 0) {  // rank-1 only: both maxima in one read
      for (int64_t k = 0; k < col_chunks(rows); ++k)
        for (int64_t c = 0; c < C; c += kTile) items.push_back({int32_t(i), 2, c, std::min(C, c + kTile), 0, k, 0});
      shaped.push_back({int32_t(i), 0, partials});
      continue;
    }
    const int64_t per = std::max<int64_t>(kWarps, 8192 / C);
    for (int64_t q = 0; q < rows; q += per) items.push_back({int32_t(i), 0, q, std::min(rows, q + per), 0, 0, 0});
    const int64_t R = fac ? shape_batch_rows(sh) : rows, B = rows / R;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t k = 0; k < col_chunks(R); ++k)
        for (int64_t c = 0; c < C; c += kThreads)
          items.push_back({int32_t(i), 1, c, std::min(C, c + kThreads), b, k, partials});
    shaped.push_back({int32_t(i), 0, partials});
    if (fac) partials += B * col_chunks(R) * C;
  }
  LOWBIT_REQUIRE(int64_t(items.size()) < (int64_t(1) << 31), LOWBIT_ERROR_UNSUPPORTED, "bind: ", items.size(),
                 " pass-1 work items exceed the launch limits");
  auto same = [](const auto& a, const auto& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
  };
  if (same(items, items_host_) && same(shaped, shaped_host_) && partials == partials_count_) return;
  // The shaped set changed (registration or a checkpoint load: waiting is allowed).
  check(cudaDeviceSynchronize(), "waiting for the device before rebuilding the shaped-parameter tables");
  device_free(items_);
  device_free(shaped_);
  device_free(partials_);
  items_ = nullptr, shaped_ = nullptr, partials_ = nullptr;
  items_host_.clear(), shaped_host_.clear(), partials_count_ = 0;
  if (!items.empty()) {
    device_alloc(&items_, items.size(), "allocating the pass-1 table");
    device_alloc(&shaped_, shaped.size(), "allocating the shaped-parameter table");
    device_alloc(&partials_, size_t(partials), "allocating the factored partials");
    check(cudaMemcpy(items_, items.data(), items.size() * sizeof(DevStatItem), cudaMemcpyHostToDevice),
          "uploading the pass-1 table");
    check(cudaMemcpy(shaped_, shaped.data(), shaped.size() * sizeof(DevShaped), cudaMemcpyHostToDevice),
          "uploading the shaped-parameter table");
  }
  items_host_ = std::move(items);
  shaped_host_ = std::move(shaped);
  partials_count_ = partials;
}

// phase 0: pass 1 then the pass between; phase 1: after pass 2.
void CudaEngine::launch_shaped(Algo algo, int phase, void* stream) {
  if (items_host_.empty()) return;
  ShapedArgs a;
  std::memset(&a, 0, sizeof a);
  a.params = params_;
  a.dyn = dyn_;
  a.scalars = scalars_;
  a.items = items_;
  a.shaped = shaped_;
  a.partials = partials_;
  a.skip_flag = flag_;
  a.maps = reinterpret_cast<const QMap*>(maps_);  // DevMaps is the maps back to back
  const int64_t ni = int64_t(items_host_.size()), ns = int64_t(shaped_host_.size());
  if (phase == 0) {
    with_rule(algo, [&](auto rule) { launch_stats<decltype(rule)::value>(a, ni, stream); });
    check(cudaGetLastError(), "launching pass 1 of the shaped parameters");
    launch_shaped_mid(a, ns, stream);
  } else {
    launch_shaped_finish(a, ns, stream);
  }
  check(cudaGetLastError(), "launching a shaped-parameter pass");
}

void CudaEngine::set_hparams(const lowbit_hparams_t* groups, int32_t num_groups) {
  DeviceGuard guard(device_);
  if (num_groups > group_cap_) {
    // A new group (registration time): waiting is allowed.
    const int32_t cap = std::max<int32_t>(num_groups, group_cap_ * 2);
    lowbit_hparams_t* h = nullptr;
    device_alloc(&h, size_t(cap), "allocating the group hyper-parameters");
    check(cudaDeviceSynchronize(), "waiting for the device before growing the group table");
    device_free(hparams_);
    hparams_ = h;
    group_cap_ = cap;
  }
  hparams_host_.assign(groups, groups + num_groups);
  hparams_dirty_ = true;
}

void CudaEngine::upload_step_tables(const GradView* grads, void* stream) {
  const int64_t n = int64_t(bound_params_.size());
  for (int64_t i = 0; i < n; ++i) {
    DevDyn d;
    std::memset(&d, 0, sizeof d);
    if (grads[i].data) {
      d.grad = grads[i].data;
      d.gdtype = dtype_code(grads[i].dtype, "grad");
      d.grad_al16 = aligned16(grads[i].data);
    }
    d.scalar_idx = int32_t(i);
    dyn_host_[size_t(i)] = d;
  }
  Uploader up(*batch_, *small_batch_, stream);
  if (hparams_dirty_ && !hparams_host_.empty())
    up.add(hparams_, hparams_host_.data(), hparams_host_.size() * sizeof(lowbit_hparams_t));
  up.add(dyn_, dyn_host_.data(), dyn_host_.size() * sizeof(DevDyn));
  up.flush();
  hparams_dirty_ = false;
}

void CudaEngine::prepare(Algo algo, const StepControl& ctl, int64_t frozen_step, void* stream) {
  PrepareArgs p;
  std::memset(&p, 0, sizeof p);
  p.params = params_;
  p.dyn = dyn_;
  p.scalars = scalars_;
  p.hparams = ctl.hparams ? ctl.hparams : hparams_;
  p.validate_hparams = ctl.hparams != nullptr;
  p.algo = int32_t(algo);
  p.steps = steps_;
  p.shared_count = ctl.shared_count;
  p.host_count = ctl.host_count;
  p.lr = ctl.lr;
  p.layout = ctl.layout;
  p.flag = flag_;
  p.seed = ctl.seed;
  p.num_params = int64_t(bound_params_.size());
  p.frozen_step = frozen_step;
  launch_prepare(p, stream);
  check(cudaGetLastError(), "launching the scalar computation");
}

void CudaEngine::finalize(const StepControl& ctl, void* stream) {
  launch_finalize(FinalizeArgs{dyn_, steps_, flag_, ctl.shared_count, ctl.shared_count_out, ctl.host_count,
                               int64_t(bound_params_.size())},
                  stream);
  check(cudaGetLastError(), "launching the step-count update");
  check(cudaMemcpyAsync(host_flag_, flag_, sizeof(int32_t), cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)),
        "copying the skip flag");
}

void CudaEngine::step(Algo algo, const GradView* grads, int64_t num_params, const StepControl& ctl, void* stream) {
  DeviceGuard guard(device_);
  check_count(num_params, "step");
  LOWBIT_REQUIRE(group_cap_ > 0, LOWBIT_ERROR_INTERNAL, "step: no hyper-parameters were set");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  upload_step_tables(grads, stream);
  if (!ctl.continue_step) check(cudaMemsetAsync(flag_, 0, sizeof(int32_t), s), "cudaMemsetAsync");
  prepare(algo, ctl, -1, stream);
  const int64_t num_chunks = int64_t(bound_chunks_.size());
  if (ctl.check_nonfinite) {
    launch_check(CheckArgs{params_, dyn_, chunks_, flag_}, num_chunks, stream);
    check(cudaGetLastError(), "launching the non-finite check");
  }
  StepArgs a;
  std::memset(&a, 0, sizeof a);
  a.params = params_;
  a.dyn = dyn_;
  a.scalars = scalars_;
  a.chunks = chunks_;
  a.maps = maps_;
  a.skip_flag = flag_;
  a.out = ctl.flat_out;
  a.flat = flat_;
  bool flat_out_rule = false;
  with_rule(algo, [&](auto rule) { flat_out_rule = kFlatOut<decltype(rule)::value>; });
  LOWBIT_REQUIRE(flat_out_rule == (ctl.flat_out != nullptr), LOWBIT_ERROR_INTERNAL,
                 "step: flat_out is for the rules that write to it (Muon's, LAMB's), and they need it");
  launch_shaped(algo, 0, stream);
  with_rule(algo, [&](auto rule) { launch_step<decltype(rule)::value>(a, num_chunks, stream); });
  check(cudaGetLastError(), "launching the step kernel");
  launch_shaped(algo, 1, stream);
  finalize(ctl, stream);
}

void CudaEngine::read_steps(int64_t* out, int64_t num_params, void* stream) {
  check_count(num_params, "read_steps");
  if (!num_params) return;
  DeviceGuard guard(device_);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  check(cudaMemcpyAsync(out, steps_, size_t(num_params) * sizeof(int64_t), cudaMemcpyDeviceToHost, s),
        "reading step counts");
  check(cudaStreamSynchronize(s), "waiting for the step counts");
}

void CudaEngine::write_steps(const int64_t* in, int64_t num_params, void* stream) {
  check_count(num_params, "write_steps");
  if (!num_params) return;
  DeviceGuard guard(device_);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  check(cudaMemcpyAsync(steps_, in, size_t(num_params) * sizeof(int64_t), cudaMemcpyHostToDevice, s),
        "writing step counts");
  check(cudaStreamSynchronize(s), "waiting for the step counts");
}

void CudaEngine::begin_step(const GradView* grads, int64_t num_params, bool check_nonfinite, void* stream) {
  DeviceGuard guard(device_);
  check_count(num_params, "begin_step");
  upload_step_tables(grads, stream);
  check(cudaMemsetAsync(flag_, 0, sizeof(int32_t), static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
  if (check_nonfinite) {
    launch_check(CheckArgs{params_, dyn_, chunks_, flag_}, int64_t(bound_chunks_.size()), stream);
    check(cudaGetLastError(), "launching the non-finite check");
  }
}

// cuBLAS's products take their workspace from the handle: loading it is all
// there is to ready.
void CudaEngine::reserve_matmul(const Matmul*, int64_t) {
  DeviceGuard guard(device_);
  if (!blas_) blas_ = std::make_unique<Blas>(device_);
}

void CudaEngine::matmul(const Matmul& mm, void* stream) {
  DeviceGuard guard(device_);
  LOWBIT_REQUIRE(blas_ != nullptr, LOWBIT_ERROR_INTERNAL, "matmul before reserve_matmul");
  blas_->gemm(mm, stream);
}

// ---- passes

void CudaEngine::bind_flat(const int64_t* offsets, const uint8_t* const* masks, int64_t num_params) {
  check_count(num_params, "bind_flat");
  if (!num_params) return;
  DeviceGuard guard(device_);
  std::vector<DevFlat> t(static_cast<size_t>(num_params));
  for (int64_t i = 0; i < num_params; ++i) t[size_t(i)] = DevFlat{offsets[i], masks[i]};
  Uploader up(*batch_, *small_batch_, nullptr);
  up.add(flat_, t.data(), t.size() * sizeof(DevFlat));
  up.flush();
  check(cudaStreamSynchronize(cudaStreamLegacy), "uploading the flat-buffer table");
}

// The step flag in stream order from a pass's PassSkip (zero when none is set).
void CudaEngine::set_skip_flag(const PassSkip& skip, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (skip.device)
    check(cudaMemcpyAsync(flag_, skip.device, sizeof(int32_t), cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  else
    check(cudaMemsetAsync(flag_, skip.host ? 1 : 0, sizeof(int32_t), s), "cudaMemsetAsync");
  if (skip.if_positive) {
    launch_skip_if_positive(skip.if_positive, flag_, stream);
    check(cudaGetLastError(), "launching the skip decision");
  }
}

void CudaEngine::run_pass(const Pass& pass, void* stream) {
  DeviceGuard guard(device_);
  const PassStep& st = pass.step;
  if (st.grads) upload_step_tables(st.grads, stream);
  StepControl ctl;
  ctl.seed = st.seed;
  if (st.begin) {
    for (size_t i = 0; i < dyn_host_.size(); ++i)
      LOWBIT_REQUIRE(dyn_host_[i].grad != nullptr, LOWBIT_ERROR_INTERNAL, "run_pass: param ", i,
                     " has no gradient in the step this pass opens");
    set_skip_flag(st.skip, stream);
    prepare(Algo::AdamW, ctl, st.frozen_step, stream);
  }
  const PassTables t{params_, dyn_, scalars_, chunks_, flat_, hparams_, pass_partials_, flag_,
                     int64_t(bound_params_.size()), int64_t(bound_chunks_.size())};
  pass.run_cuda(t, stream);
  check(cudaGetLastError(), "launching a pass");
  if (st.end) finalize(ctl, stream);
}

}  // namespace cuda

std::unique_ptr<Engine> make_cuda_engine(int device_index) {
  return std::make_unique<cuda::CudaEngine>(device_index);
}

}  // namespace lowbit
