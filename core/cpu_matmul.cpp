#include "cpu_matmul.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

#ifdef LOWBIT_HAVE_CBLAS
#include <cblas.h>
#include <dlfcn.h>
#endif
#ifdef LOWBIT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#if DNNL_VERSION_MAJOR == 2
#define LOWBIT_DNNL_BF16 1
#endif
#endif

#include "cpu_gemm.hpp"
#include "error.hpp"
#include "float16.hpp"

namespace lowbit {
namespace {

enum class Choice { Auto, Blas, Builtin };
enum class Backend { Blas, Builtin, Dnnl };

// ---- what this process has: probed once

struct BlasFound {
  bool linked = false;
  bool reference = false;  // the reference (netlib) CBLAS: slower than lowbit's own product
  std::string name;        // "OpenBLAS 0.3.21 ... (/path)"
};

const BlasFound& blas_found() {
  static const BlasFound found = [] {
    BlasFound f;
#ifdef LOWBIT_HAVE_CBLAS
    f.linked = true;
    Dl_info where{};
    std::string path = "?";
    void* lib = nullptr;
    if (dladdr(reinterpret_cast<void*>(&cblas_sgemm), &where) && where.dli_fname) {
      path = where.dli_fname;
      lib = dlopen(where.dli_fname, RTLD_LAZY | RTLD_NOLOAD);  // the library and its dependencies
    }
    using Text = const char* (*)();
    const auto text = [&](const char* symbol) -> const char* {
      void* s = lib ? dlsym(lib, symbol) : nullptr;
      return s ? reinterpret_cast<Text>(s)() : nullptr;
    };
    if (const char* config = text("openblas_get_config")) {
      f.name = config;
    } else if (lib && dlsym(lib, "MKL_Get_Version_String")) {
      f.name = "Intel MKL";
    } else if (const char* blis = text("bli_info_get_version_str")) {
      f.name = std::string("BLIS ") + blis;
    } else if (lib && dlsym(lib, "CBLAS_CallFromC")) {  // netlib CBLAS's own global
      f.name = "the reference BLAS";
      f.reference = true;
    } else {
      f.name = "a CBLAS";
    }
    f.name += " (" + path + ")";
    if (lib) dlclose(lib);
#endif
    return f;
  }();
  return found;
}

#ifdef LOWBIT_DNNL_BF16
std::string dnnl_name() {
  const dnnl_version_t* v = dnnl_version();
  return concat("oneDNN ", v->major, ".", v->minor, ".", v->patch);
}

// Whether oneDNN makes a bf16 matmul on this CPU (oneDNN 2.6 has none
// without AVX-512; DNNL_MAX_CPU_ISA=AVX2 makes it behave so here).
bool dnnl_bf16_runs() {
  static const bool runs = [] {
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      using dims = dnnl::memory::dims;
      const dnnl::memory::desc a({16, 16}, dnnl::memory::data_type::bf16, dims{16, 1});
      const dnnl::memory::desc c({16, 16}, dnnl::memory::data_type::f32, dims{16, 1});
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return runs;
}
#else
bool dnnl_bf16_runs() { return false; }
#endif

const char* kChoiceVariable = "LOWBIT_MATMUL";

Choice read_choice() {
  const char* v = std::getenv(kChoiceVariable);
  if (!v || !*v || std::strcmp(v, "auto") == 0) return Choice::Auto;
  if (std::strcmp(v, "builtin") == 0) return Choice::Builtin;
  if (std::strcmp(v, "blas") == 0) {
    LOWBIT_REQUIRE(blas_found().linked, LOWBIT_ERROR_INVALID_ARGUMENT,
                   "LOWBIT_MATMUL = blas, but this build of lowbit has no CBLAS (auto or builtin: its own product)");
    return Choice::Blas;
  }
  fail(LOWBIT_ERROR_INVALID_ARGUMENT, "LOWBIT_MATMUL = '", v,
       "' is not auto, blas or builtin (which implementation runs Muon's CPU matrix products)");
}

Backend fp32_backend(Choice c) {
  if (c == Choice::Builtin) return Backend::Builtin;
  if (c == Choice::Blas) return Backend::Blas;
  return blas_found().linked && !blas_found().reference ? Backend::Blas : Backend::Builtin;
}

Backend planned_backend(const Matmul& mm, Choice c) {
  if (mm.bf16 && c == Choice::Auto && dnnl_bf16_runs()) return Backend::Dnnl;
  return fp32_backend(c);
}

#ifdef LOWBIT_HAVE_CBLAS
void gemm_blas(const Matmul& mm, const float* a, const float* b, float* c) {
  if (mm.symmetric && mm.m == mm.n) {
    // op(A) op(A)^T: the upper triangle by syrk (half a product's flops), mirrored.
    const int n = int(mm.m), k = int(mm.k);
    cblas_ssyrk(CblasRowMajor, CblasUpper, mm.trans_a ? CblasTrans : CblasNoTrans, n, k, mm.alpha, a,
                mm.trans_a ? n : k, mm.beta, c, n);
    for (int i = 1; i < n; ++i)
      for (int j = 0; j < i; ++j) c[int64_t(i) * n + j] = c[int64_t(j) * n + i];
    return;
  }
  cblas_sgemm(CblasRowMajor, mm.trans_a ? CblasTrans : CblasNoTrans, mm.trans_b ? CblasTrans : CblasNoTrans,
              int(mm.m), int(mm.n), int(mm.k), mm.alpha, a, int(mm.trans_a ? mm.m : mm.k), b,
              int(mm.trans_b ? mm.k : mm.n), mm.beta, c, int(mm.n));
}
#endif

GemmShape gemm_shape(const Matmul& mm) {
  GemmShape s;
  s.m = mm.m, s.n = mm.n, s.k = mm.k;
  s.trans_a = mm.trans_a, s.trans_b = mm.trans_b;
  s.symmetric = mm.symmetric;
  return s;
}

// ---- oneDNN's bf16 matmul (the one PyTorch's CPU bf16 matmul uses): the
// inputs copied to bf16 (exact: they hold bf16 values), the sum in fp32.
#ifdef LOWBIT_DNNL_BF16
class DnnlBf16 {
 public:
  DnnlBf16() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  struct Entry;
  // This product's primitive, made when first asked for (nullptr: oneDNN has
  // none for it on this CPU), and the buffers sized for it; marked as one of
  // the current reserve's.
  const Entry* prepare(const Matmul& mm) {
    Entry& e = entry(mm);
    e.used = true;
    if (!e.made) return nullptr;
    const int64_t na = mm.m * mm.k, nb = mm.k * mm.n;
    try {
      if (size_t(na) > abuf_.size()) abuf_.resize(size_t(na));
      if (size_t(nb) > bbuf_.size()) bbuf_.resize(size_t(nb));
      if (e.scratch.get_size() > scratch_.size()) scratch_.resize(e.scratch.get_size());
    } catch (const std::bad_alloc&) {
      fail(LOWBIT_ERROR_OUT_OF_MEMORY, "could not allocate the bf16 copies of a ", mm.m, " x ", mm.k, " by ", mm.k,
           " x ", mm.n, " product");
    }
    return &e;
  }
  // The end of a reserve: drops the primitives none of its products asked for.
  void end_reserve() {
    drop_unused();
    for (Entry& e : cache_) e.used = false;
  }
  // C = alpha op(A) op(B) + beta C for one matrix of the batch, through a
  // prepared entry; false when oneDNN failed (C may then be partly written).
  bool gemm(const Matmul& mm, const Entry& e, const float* a, const float* b, float* c) noexcept {
    try {
      to_bf16(a, abuf_.data(), mm.m * mm.k);
      to_bf16(b, bbuf_.data(), mm.k * mm.n);
      const Descs d(mm);
      dnnl::memory am(d.a, engine_, abuf_.data()), bm(d.b, engine_, bbuf_.data()), cm(d.c, engine_, c);
      dnnl::memory sm(e.scratch, engine_, scratch_.data());
      e.primitive.execute(stream_,
                          {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
      stream_.wait();
      return true;
    } catch (...) {
      return false;
    }
  }

 private:
  struct Key {
    int64_t m, n, k;
    bool ta, tb;
    float alpha, beta;
    bool operator==(const Key& o) const {
      return m == o.m && n == o.n && k == o.k && ta == o.ta && tb == o.tb &&
             std::memcmp(&alpha, &o.alpha, 4) == 0 && std::memcmp(&beta, &o.beta, 4) == 0;
    }
  };

 public:
  struct Entry {
    Key key;
    bool made = false;  // oneDNN made the primitive (else it has none for this product here)
    bool used = false;
    dnnl::matmul primitive;
    dnnl::memory::desc scratch;
  };

 private:
  static void to_bf16(const float* in, uint16_t* out, int64_t n) {
#pragma omp parallel for if (n >= (1 << 18))
    for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
  }
  // op(A) is m x k: A stored m x k (strides k, 1) or k x m (strides 1, m);
  // likewise op(B) k x n; C m x n fp32.
  struct Descs {
    dnnl::memory::desc a, b, c;
    explicit Descs(const Matmul& mm)
        : a({mm.m, mm.k}, dnnl::memory::data_type::bf16,
            mm.trans_a ? dnnl::memory::dims{1, mm.m} : dnnl::memory::dims{mm.k, 1}),
          b({mm.k, mm.n}, dnnl::memory::data_type::bf16,
            mm.trans_b ? dnnl::memory::dims{1, mm.k} : dnnl::memory::dims{mm.n, 1}),
          c({mm.m, mm.n}, dnnl::memory::data_type::f32, dnnl::memory::dims{mm.n, 1}) {}
  };
  void drop_unused() {
    cache_.erase(std::remove_if(cache_.begin(), cache_.end(), [](const Entry& e) { return !e.used; }), cache_.end());
  }
  Entry& entry(const Matmul& mm) {
    const Key key{mm.m, mm.n, mm.k, mm.trans_a, mm.trans_b, mm.alpha, mm.beta};
    for (Entry& e : cache_)
      if (e.key == key) return e;
    if (cache_.size() >= 256) drop_unused();
    Entry e;
    e.key = key;
    try {
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // no allocation when it runs
      if (mm.alpha != 1.f) attr.set_output_scales(0, {mm.alpha});
      if (mm.beta != 0.f) {
        dnnl::post_ops ops;
        ops.append_sum(mm.beta);
        attr.set_post_ops(ops);
      }
      const Descs d(mm);
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(d.a, d.b, d.c), attr, engine_);
      e.scratch = pd.scratchpad_desc();
      e.primitive = dnnl::matmul(pd);
      e.made = true;
    } catch (const dnnl::error&) {
      e.made = false;  // the fp32 products of the same values run it
    }
    cache_.push_back(std::move(e));
    return cache_.back();
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::vector<Entry> cache_;
  std::vector<uint16_t> abuf_, bbuf_;  // keep their capacity: no allocation once a step has run
  std::vector<uint8_t> scratch_;
};
#endif

}  // namespace

struct CpuMatmul::Impl {
  int threads = 1;
  Choice choice = Choice::Auto;  // of the last reserve
  BuiltinGemm builtin;
  int64_t reserved_products = 0;  // for the test hook
#ifdef LOWBIT_DNNL_BF16
  std::unique_ptr<DnnlBf16> dnnl;
#endif

  void reserve_one(const Matmul& mm) {
    ++reserved_products;
    if (const char* n = std::getenv("LOWBIT_TEST_MATMUL_FAIL_AFTER")) {
      const long long after = std::atoll(n);
      LOWBIT_REQUIRE(reserved_products <= after, LOWBIT_ERROR_INTERNAL, "LOWBIT_TEST_MATMUL_FAIL_AFTER = ", after,
                     ": product ", reserved_products, " (", mm.m, " x ", mm.k, " by ", mm.k, " x ", mm.n,
                     ") fails, as the test hook asks");
    }
    // The built-in product's scratch is reserved for every product: it also
    // stands in for a oneDNN product that fails when it runs.
    builtin.reserve(threads);
#ifdef LOWBIT_DNNL_BF16
    if (planned_backend(mm, choice) == Backend::Dnnl) {
      if (!dnnl) dnnl = std::make_unique<DnnlBf16>();
      dnnl->prepare(mm);
    }
#endif
  }

  void run_one(const Matmul& mm, Backend backend, const float* a, const float* b, float* c) {
    switch (backend) {
#ifdef LOWBIT_HAVE_CBLAS
      case Backend::Blas: gemm_blas(mm, a, b, c); return;
#endif
      default: builtin.run(gemm_shape(mm), a, b, c, mm.alpha, mm.beta, threads); return;
    }
  }
};

CpuMatmul::CpuMatmul(int num_threads) : impl_(std::make_unique<Impl>()) { impl_->threads = std::max(1, num_threads); }
CpuMatmul::~CpuMatmul() = default;

void CpuMatmul::reserve(const Matmul* products, int64_t count) {
  Impl& m = *impl_;
  m.choice = read_choice();
  for (int64_t i = 0; i < count; ++i) m.reserve_one(products[i]);
#ifdef LOWBIT_DNNL_BF16
  if (m.dnnl) m.dnnl->end_reserve();
#endif
}

void CpuMatmul::run(const Matmul& mm) {
  Impl& m = *impl_;
  Backend backend = planned_backend(mm, m.choice);
#ifdef LOWBIT_DNNL_BF16
  const DnnlBf16::Entry* primitive = nullptr;
  if (backend == Backend::Dnnl) {
    if (!m.dnnl) m.reserve_one(mm);
    primitive = m.dnnl->prepare(mm);  // reserved: found in the cache
    if (!primitive) backend = fp32_backend(m.choice);
  }
#endif
  const int64_t cn = mm.m * mm.n;
  for (int64_t i = 0; i < mm.batch; ++i) {
    float* c = mm.c + i * mm.stride_c;
    const float* a = mm.a + i * mm.stride_a;
    const float* b = mm.b + i * mm.stride_b;
    const float* d = mm.d + i * mm.stride_c;
    if (mm.beta != 0.f && mm.d != mm.c) std::memcpy(c, d, size_t(cn) * sizeof(float));
#ifdef LOWBIT_DNNL_BF16
    if (backend == Backend::Dnnl && !m.dnnl->gemm(mm, *primitive, a, b, c)) {
      // oneDNN failed as it ran: the same product by lowbit's own, from D again.
      LOWBIT_REQUIRE(mm.beta == 0.f || mm.d != mm.c, LOWBIT_ERROR_INTERNAL,
                     "oneDNN's bf16 matmul failed as it ran, and C (= D) was overwritten");
      if (mm.beta != 0.f) std::memcpy(c, d, size_t(cn) * sizeof(float));
      m.run_one(mm, Backend::Builtin, a, b, c);
    } else if (backend != Backend::Dnnl) {
      m.run_one(mm, backend, a, b, c);
    }
#else
    m.run_one(mm, backend, a, b, c);
#endif
    if (mm.bf16) {
#pragma omp parallel for num_threads(m.threads) if (cn >= (1 << 18))
      for (int64_t e = 0; e < cn; ++e) c[e] = round_bf16(c[e]);
    }
  }
}

void cpu_matmul(const Matmul& mm, int num_threads) {
  thread_local CpuMatmul m(num_threads);
  m.reserve(&mm, 1);
  m.run(mm);
}

MatmulReport cpu_matmul_report() noexcept {
  struct Texts {
    std::string fp32[3], bf16[3];
  };
  static const Texts* texts = []() -> const Texts* {
    try {
      auto* t = new Texts;
      const std::string isa = gemm_isa_best() == GemmIsa::Avx512 ? "AVX-512"
                              : gemm_isa_best() == GemmIsa::Avx2 ? "AVX2"
                                                                 : "portable";
      const std::string builtin = "lowbit's blocked product (" + isa + ")";
      const BlasFound& blas = blas_found();
      const std::string auto_fp32 =
          fp32_backend(Choice::Auto) == Backend::Blas ? blas.name
          : blas.linked ? builtin + "; the CBLAS linked is " + blas.name + ", slower"
                        : builtin + "; this build has no CBLAS";
      t->fp32[int(Choice::Auto)] = auto_fp32;
      t->fp32[int(Choice::Blas)] = blas.name + " (LOWBIT_MATMUL=blas)";
      t->fp32[int(Choice::Builtin)] = builtin + " (LOWBIT_MATMUL=builtin)";
#ifdef LOWBIT_DNNL_BF16
      const std::string no_dnnl = dnnl_name() + " has no bf16 matmul on this CPU";
      t->bf16[int(Choice::Auto)] =
          dnnl_bf16_runs() ? dnnl_name() + " bf16 matmul" : auto_fp32 + ", rounded to bf16 (" + no_dnnl + ")";
#else
      t->bf16[int(Choice::Auto)] = auto_fp32 + ", rounded to bf16 (no oneDNN in this build)";
#endif
      t->bf16[int(Choice::Blas)] = t->fp32[int(Choice::Blas)] + ", rounded to bf16";
      t->bf16[int(Choice::Builtin)] = t->fp32[int(Choice::Builtin)] + ", rounded to bf16";
      return t;
    } catch (...) {
      return nullptr;
    }
  }();
  static const char* const unknown = "unknown (out of memory)";
  static const char* const refused =
      "none: LOWBIT_MATMUL is not auto, blas or builtin (or blas without a CBLAS), so Muon refuses to step";
  if (!texts) return {unknown, unknown};
  try {
    const Choice c = read_choice();
    return {texts->fp32[int(c)].c_str(), texts->bf16[int(c)].c_str()};
  } catch (...) {
    return {refused, refused};
  }
}

}  // namespace lowbit
