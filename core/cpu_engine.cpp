// The CPU engine: OpenMP over ~64K-element chunks. Hyper-parameters and step
// counts are host memory; a step computes each parameter's scalars, checks
// the gradients, runs the shaped parameters' pass 1 (cpu_shaped.cpp), sweeps
// the chunks (cpu_step.cpp) and advances the counts, on the calling thread's
// schedule (the stream argument is ignored). Passes (core/pass.hpp) run
// through cpu_pass.hpp. No heap allocation per step: everything a step
// touches is sized by bind().
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "cpu_matmul.hpp"
#include "cpu_pass.hpp"
#include "cpu_shaped.hpp"
#include "cpu_step.hpp"
#include "engine.hpp"
#include "error.hpp"
#include "rounding.hpp"
#include "step_scalars.hpp"
#include "validation.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace lowbit {
namespace {

// Below this many elements a step runs on the calling thread: waking a team
// costs more than it saves, and it would compete with the caller's own
// threads (BLAS, data loading) between steps.
constexpr int64_t kParallelMinElements = 1 << 18;

class CpuEngine final : public Engine {
 public:
  explicit CpuEngine(int num_threads) : num_threads_(num_threads) {
    check_num_threads(num_threads);  // every way in (optimizer config, JAX handlers)
#ifdef _OPENMP
    if (num_threads_ <= 0) num_threads_ = omp_get_max_threads();
#else
    num_threads_ = 1;
#endif
  }

  lowbit_device_t device() const override { return LOWBIT_DEVICE_CPU; }

  void* allocate_zeroed(size_t bytes) override {
    void* p = std::calloc(bytes ? bytes : 1, 1);
    if (!p) fail(LOWBIT_ERROR_OUT_OF_MEMORY, "could not allocate ", bytes, " bytes of optimizer state");
    return p;
  }
  void* allocate_scratch(size_t bytes) override {
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) fail(LOWBIT_ERROR_OUT_OF_MEMORY, "could not allocate ", bytes, " bytes of optimizer workspace");
    return p;
  }
  void release(void* ptr) noexcept override { std::free(ptr); }
  void copy_to_host(void* dst, const void* src, size_t bytes, void*) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes, void*) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void wait(void*) override {}

  void bind(const ParamView* params, int64_t num_params, const Chunk* chunks, int64_t num_chunks,
            const int32_t* param_group, int64_t first_changed, void*) override {
    // Registration appends: copy only what may have changed.
    const size_t keep = size_t(std::min<int64_t>(first_changed, std::min<int64_t>(num_params, int64_t(params_.size()))));
    size_t keep_chunks = 0;
    while (keep_chunks < chunks_.size() && keep_chunks < size_t(num_chunks) && size_t(chunks_[keep_chunks].param) < keep)
      ++keep_chunks;
    params_.resize(keep);
    params_.insert(params_.end(), params + keep, params + num_params);
    chunks_.resize(keep_chunks);
    chunks_.insert(chunks_.end(), chunks + keep_chunks, chunks + num_chunks);
    groups_.resize(keep);
    groups_.insert(groups_.end(), param_group + keep, param_group + num_params);
    steps_.resize(size_t(num_params), 0);
    scalars_.resize(size_t(num_params));
    keys_.resize(size_t(num_params));
    grads_.resize(size_t(num_params));
    offsets_.resize(size_t(num_params), 0);
    masks_.resize(size_t(num_params), nullptr);
    partials_.resize(chunks_.size());
    total_ = 0;
    for (const Chunk& c : chunks_) total_ += c.end - c.begin;
    shaped_.build(params_, num_threads_);
  }

  void set_hparams(const lowbit_hparams_t* groups, int32_t num_groups) override {
    hparams_.assign(groups, groups + num_groups);
  }
  lowbit_hparams_t* hparams_memory(int32_t group) override { return &hparams_[size_t(group)]; }

  void step(Algo algo, const GradView* grads, int64_t num_params, const StepControl& ctl, void*) override {
    check_count(num_params, "step");
    const int64_t shared = ctl.shared_count ? int64_t(*ctl.shared_count) : ctl.host_count;
    bool skip = ctl.shared_count && ctl.host_count >= 0 && int64_t(*ctl.shared_count) != ctl.host_count;
    skip |= ctl.continue_step && skipped_;
    for (size_t i = 0; i < params_.size(); ++i) {
      grads_[i] = grads[i];
      if (!grads[i].data) continue;
      lowbit_hparams_t h = ctl.hparams ? ctl.hparams[groups_[i]] : hparams_[size_t(groups_[i])];
      if (ctl.lr) h.lr = *ctl.lr;
      if (ctl.hparams) skip |= !hparams_valid(h, algo, params_[i].num_moments);
      const int64_t t = shared >= 0 ? shared : steps_[i];
      scalars_[i] = make_step_scalars(h, algo, t);
      keys_[i] = rounding_key(ctl.seed, uint64_t(i), uint64_t(t + 1));
      if (ctl.layout) {
        const ParamView& v = params_[i];
        const int32_t formats[2] = {int32_t(public_format(v.moment[0])), int32_t(public_format(v.moment[1]))};
        const int32_t norms[2] = {int32_t(v.moment[0].norm), int32_t(v.moment[1].norm)};
        skip |= !layout_matches(ctl.layout + int64_t(kLayoutColumns) * int64_t(i), v.num_moments, formats, norms,
                                int32_t(v.rounding), v.shape);
      }
    }
    if (!skip && ctl.check_nonfinite) skip = any_nonfinite();
    if (!skip && !shaped_.empty()) shaped_.before_step(algo, params_, grads_, scalars_, num_threads_, parallel());
    if (!skip) {
      const int64_t n = int64_t(chunks_.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads_) if (parallel())
      for (int64_t k = 0; k < n; ++k) {
        const Chunk& c = chunks_[size_t(k)];
        const size_t i = size_t(c.param);
        if (grads_[i].data)
          step_chunk(algo, params_[i], grads_[i], scalars_[i], keys_[i], c,
                     ctl.flat_out ? ctl.flat_out + offsets_[i] : nullptr);
      }
      shaped_.after_step(params_, grads_);
      if (shared < 0)
        for (size_t i = 0; i < params_.size(); ++i) steps_[i] += grads_[i].data ? 1 : 0;
    }
    if (ctl.shared_count_out) *ctl.shared_count_out = int32_t(shared + (skip ? 0 : 1));
    skipped_ = skip;
  }

  bool last_step_skipped() const override { return skipped_; }

  void begin_step(const GradView* grads, int64_t num_params, bool check_nonfinite, void*) override {
    check_count(num_params, "begin_step");
    std::copy(grads, grads + num_params, grads_.begin());
    skipped_ = check_nonfinite && any_nonfinite();
  }

  void reserve_matmul(const Matmul* products, int64_t count) override {
    if (!matmul_) matmul_ = std::make_unique<CpuMatmul>(num_threads_);
    matmul_->reserve(products, count);
  }
  void matmul(const Matmul& mm, void*) override {
    LOWBIT_REQUIRE(matmul_ != nullptr, LOWBIT_ERROR_INTERNAL, "matmul before reserve_matmul");
    matmul_->run(mm);
  }

  void read_steps(int64_t* out, int64_t num_params, void*) override {
    check_count(num_params, "read_steps");
    std::memcpy(out, steps_.data(), size_t(num_params) * sizeof(int64_t));
  }
  void write_steps(const int64_t* in, int64_t num_params, void*) override {
    check_count(num_params, "write_steps");
    std::memcpy(steps_.data(), in, size_t(num_params) * sizeof(int64_t));
  }

  void bind_flat(const int64_t* offsets, const uint8_t* const* masks, int64_t num_params) override {
    check_count(num_params, "bind_flat");
    offsets_.assign(offsets, offsets + num_params);
    masks_.assign(masks, masks + num_params);
  }

  void run_pass(const Pass& pass, void*) override {
    const PassStep& st = pass.step;
    if (st.grads) std::copy(st.grads, st.grads + params_.size(), grads_.begin());
    if (st.begin) {
      skipped_ = st.skip.host || (st.skip.device && *st.skip.device != 0) ||
                 (st.skip.if_positive && *st.skip.if_positive > 0.f);
      for (size_t i = 0; i < params_.size(); ++i) {
        scalars_[i] = make_frozen_scalars(hparams_[size_t(groups_[i])], steps_[i], st.frozen_step);
        keys_[i] = rounding_key(st.seed, uint64_t(i), uint64_t(steps_[i] + 1));
      }
    }
    if (!(st.honor_skip && skipped_)) {
      const CpuPassTables t{params_.data(), chunks_.data(),  int64_t(params_.size()), int64_t(chunks_.size()),
                            groups_.data(), scalars_.data(), keys_.data(),            grads_.data(),
                            hparams_.data(), offsets_.data(), masks_.data(),          partials_.data(),
                            &skipped_,      st.stepped_only, num_threads_,                  parallel()};
      pass.run_cpu(t);
    }
    if (st.end && !skipped_)
      for (int64_t& t : steps_) ++t;
  }

 private:
  void check_count(int64_t n, const char* what) const {
    LOWBIT_REQUIRE(n == int64_t(params_.size()), LOWBIT_ERROR_INTERNAL, what, ": ", n, " params given, ",
                   params_.size(), " bound");
  }
  bool parallel() const { return total_ >= kParallelMinElements; }

  bool any_nonfinite() const {
    int found = 0;
    const int64_t n = int64_t(chunks_.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads_) reduction(| : found) if (parallel())
    for (int64_t k = 0; k < n; ++k) {
      const Chunk& c = chunks_[size_t(k)];
      const GradView& g = grads_[size_t(c.param)];
      if (g.data && chunk_has_nonfinite(g, c)) found |= 1;
    }
    return found != 0;
  }

  int num_threads_;
  std::vector<ParamView> params_;
  std::vector<Chunk> chunks_;
  std::vector<int32_t> groups_;
  std::vector<lowbit_hparams_t> hparams_;
  std::vector<int64_t> steps_;
  std::vector<StepScalars> scalars_;
  std::vector<uint64_t> keys_;
  std::vector<GradView> grads_;
  std::vector<int64_t> offsets_;
  std::vector<const uint8_t*> masks_;
  std::vector<PassPartial> partials_;
  int64_t total_ = 0;
  bool skipped_ = false;
  CpuShapedPass shaped_;
  std::unique_ptr<CpuMatmul> matmul_;  // Muon's products: made at the first reserve_matmul
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(int num_threads) { return std::make_unique<CpuEngine>(num_threads); }

#ifndef LOWBIT_HAVE_CUDA
std::unique_ptr<Engine> make_cuda_engine(int) {
  fail(LOWBIT_ERROR_UNSUPPORTED, "device: this lowbit library was built without CUDA support");
}
void cuda_pass_unsupported() { fail(LOWBIT_ERROR_UNSUPPORTED, "this lowbit library was built without CUDA support"); }
#endif

}  // namespace lowbit
