// The device-independent part of the JAX fused step: decoding the FFI call
// frame into the public C API's lowbit_param_buffers_t over the XLA buffers,
// with every check made before anything is written, then one
// lowbit_functional_step (capi/lowbit.h, "functional step": the same engine
// and per-element code as lowbit_optimizer_step). The step reads lr and count
// from their buffers and writes the new count itself, so on CUDA nothing is
// copied to the host and nothing waits. Only public headers: what any other
// framework's custom call could do.
//
// Call protocol (kept in sync with bindings/lowbit/jax/_module.py, PROTOCOL_VERSION):
//   inputs   0: lr      f32[]          learning rate of this step (a buffer so
//                                      that a schedule can produce it under jit)
//            1: count   s32[]          steps applied so far (t - 1)
//            2: layout  s32[N, 14]     per param, as recorded at init
//                                      (core/layout_record.hpp): formats of
//                                      moments 0 and 1, rounding,
//                                      normalisations of moments 0 and 1, ndim
//                                      and dims of the bound shape
//            3 + ...:                  per param: param, grad, then its
//                                      state parts that have elements, in the
//                                      order mu, mu_scale, nu, nu_scale, ecc
//                                      (an empty part may also travel)
//   outputs  0: count (aliases input 1), +1 unless the step was skipped (on
//            CUDA also when lr is not finite and >= 0, count < 0, or the
//            layout differs from the attributes: then nothing changes)
//            1 + ...:                  per param: param, then the state parts
//                                      that travelled, each aliasing its input
//   attributes: algorithm (s32, lowbit_algorithm_t: any algorithm
//            lowbit_algorithm_info describes that is not a distributed one),
//            hparam_names (string: hyper-parameters of that algorithm, by the
//            lowbit_hparam_info names, separated by '\n'; lr and
//            weight_decay travel elsewhere), hparam_values (f64[]: their
//            values in that order, `count` each as lowbit_hparam_info says;
//            flags, ints and enums as integral values; the others keep the
//            algorithm's defaults), weight_decay (f32[N]), formats (s32[2N]:
//            lowbit_state_format_t of each moment, 0 where the algorithm
//            keeps no such moment: lowbit_moments_in_use),
//            rounding (s32[N]: 0 nearest, 1 stochastic, 2 error correction),
//            normalizations (s32[2N]: lowbit_normalization_t of each moment,
//            resolved as lowbit_plan_param_state reports it, 0 where the
//            algorithm keeps no such moment; a param with a RANK1 or FACTORED
//            moment is bound with the shape of its buffer, others flat; an
//            algorithm whose descriptor says `matrices` (Muon) binds every
//            param with its shape, of 2 or more dims),
//            seed (u64), skip_nonfinite (s32), num_threads (s32),
//            parts (s32[N]: bit k set if state part k of the param, in the
//            order mu, mu_scale, nu, nu_scale, ecc, travels; the others are
//            read as empty arrays),
//            names (string: the N leaf names separated by '\n', for messages).
// Validity, moment counts, moment kinds and hyper-parameter fields come from
// the library's descriptors (lowbit_algorithm_info, lowbit_hparam_info,
// lowbit_moments_in_use): nothing here names an algorithm.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <sstream>

#include "lowbit.h"
#include "xla/ffi/api/ffi.h"

namespace lowbit {
namespace jaxffi {

namespace ffi = ::xla::ffi;

// Failures of a handler: a status and a message, turned into an ffi::Error.
struct Error {
  lowbit_status_t status;
  std::string message;
  const char* what() const { return message.c_str(); }
};

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

template <class... Parts>
[[noreturn]] void fail(lowbit_status_t status, const Parts&... parts) {
  throw Error{status, concat(parts...)};
}

#define LOWBIT_REQUIRE(cond, status, ...) \
  do {                                    \
    if (!(cond)) ::lowbit::jaxffi::fail(status, __VA_ARGS__); \
  } while (0)

// A C API call's failure, with its message.
inline void check_status(lowbit_status_t status, const char* message) {
  if (status != LOWBIT_SUCCESS) throw Error{status, message};
}

constexpr int kLayoutColumns = LOWBIT_STATE_RECORD_INT32;
constexpr int kMaxDims = LOWBIT_MAX_DIMS;
constexpr int32_t kLastStateFormat = LOWBIT_STATE_4BIT_DYN;

inline const char* format_name(int32_t f) { return lowbit_state_format_name(lowbit_state_format_t(f)); }

// Bumped whenever the buffer or attribute layout above changes; the Python
// side refuses a module with another version.
constexpr int32_t kProtocolVersion = 5;
constexpr size_t kLeadingArgs = 3;
constexpr size_t kArgsPerParam = 7;
constexpr size_t kRetsPerParam = 6;

struct StepAttrs {
  int32_t algorithm;
  std::string_view hparam_names;
  ffi::Span<const double> hparam_values;
  ffi::Span<const float> weight_decay;
  ffi::Span<const int32_t> formats;
  ffi::Span<const int32_t> rounding;
  ffi::Span<const int32_t> normalizations;
  ffi::Span<const int32_t> parts;
  uint64_t seed;
  int32_t skip_nonfinite;
  std::string_view names;
};

// '\n'-separated fields of an attribute (none for an empty string).
inline std::vector<std::string_view> split_lines(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t cut; !s.empty(); s.remove_prefix(cut + 1)) {
    cut = s.find('\n');
    out.push_back(s.substr(0, cut));
    if (cut == std::string_view::npos) break;
  }
  return out;
}

// An algorithm as the library describes it (lowbit_algorithm_info and its
// lowbit_hparam_info entries), read once per algorithm and thread.
struct Described {
  lowbit_algorithm_info_t info;
  std::vector<lowbit_hparam_info_t> hparams;
};

// The algorithms a JAX step may take: every described one but the
// distributed (1-bit) optimizers, which need a communicator. For messages.
inline std::string steppable_algorithms() {
  int32_t count = 0;
  if (lowbit_algorithms(nullptr, 0, &count) != LOWBIT_SUCCESS) return "?";
  std::vector<lowbit_algorithm_t> all(size_t(count > 0 ? count : 0));
  if (lowbit_algorithms(all.data(), count, &count) != LOWBIT_SUCCESS) return "?";
  std::string out;
  for (lowbit_algorithm_t a : all) {
    lowbit_algorithm_info_t info;
    lowbit_algorithm_info_init(&info);
    if (lowbit_algorithm_info(a, &info) != LOWBIT_SUCCESS || info.distributed) continue;
    out += concat(out.empty() ? "" : ", ", info.name, " (", int(a), ")");
  }
  return out;
}

// The descriptor of `algorithm`, or an error naming the value and the
// algorithms a step takes.
inline const Described& describe(int32_t algorithm) {
  thread_local std::vector<std::unique_ptr<Described>> cache;
  for (const auto& d : cache)
    if (d->info.algorithm == algorithm) return *d;
  auto d = std::make_unique<Described>();
  lowbit_algorithm_info_init(&d->info);
  if (lowbit_algorithm_info(lowbit_algorithm_t(algorithm), &d->info) != LOWBIT_SUCCESS)
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, "algorithm = ", algorithm, " is not an algorithm of this library (",
         steppable_algorithms(), ")");
  LOWBIT_REQUIRE(!d->info.distributed, LOWBIT_ERROR_INVALID_ARGUMENT, "algorithm = ", algorithm, " (",
                 d->info.name, ") is a distributed optimizer (it needs a communicator); a JAX step takes ",
                 steppable_algorithms());
  d->hparams.resize(size_t(d->info.num_hparams));
  for (int32_t i = 0; i < d->info.num_hparams; ++i) {
    lowbit_hparam_info_init(&d->hparams[size_t(i)]);
    check_status(lowbit_hparam_info(lowbit_algorithm_t(algorithm), i, &d->hparams[size_t(i)]), lowbit_last_error());
  }
  cache.push_back(std::move(d));
  return *cache.back();
}

inline std::string hparam_list(const Described& d) {
  std::string out;
  for (const lowbit_hparam_info_t& h : d.hparams) {
    const std::string_view name(h.name);
    if (name != "lr" && name != "weight_decay") out += concat(out.empty() ? "" : ", ", name);
  }
  return out;
}

// Writes the hyper-parameters of the hparam_names / hparam_values attributes
// into `h` at the fields their descriptors give; every name, count and value
// type checked (the values' bounds: lowbit_hparams_check, later).
inline void fill_hparams(const Described& d, std::string_view names, ffi::Span<const double> values,
                         lowbit_hparams_t& h) {
  const std::vector<std::string_view> fields = split_lines(names);
  size_t at = 0;
  std::vector<const lowbit_hparam_info_t*> seen;
  for (std::string_view field : fields) {
    const lowbit_hparam_info_t* spec = nullptr;
    for (const lowbit_hparam_info_t& s : d.hparams)
      if (field == s.name) spec = &s;
    LOWBIT_REQUIRE(spec, LOWBIT_ERROR_INVALID_ARGUMENT, "hparam_names: '", field, "' is not a hyper-parameter of ",
                   d.info.name, " (its: ", hparam_list(d), ")");
    LOWBIT_REQUIRE(field != "lr" && field != "weight_decay", LOWBIT_ERROR_INVALID_ARGUMENT, "hparam_names: '", field,
                   "' travels as ", field == "lr" ? "input 0" : "the weight_decay attribute (one per param)");
    LOWBIT_REQUIRE(std::find(seen.begin(), seen.end(), spec) == seen.end(), LOWBIT_ERROR_INVALID_ARGUMENT,
                   "hparam_names: '", field, "' is given twice");
    seen.push_back(spec);
    const size_t count = size_t(spec->count);
    LOWBIT_REQUIRE(at + count <= values.size(), LOWBIT_ERROR_INVALID_ARGUMENT, "hparam_values has ", values.size(),
                   " values but hparam_names (", fields.size(), " names) needs more: '", field, "' takes ", count);
    LOWBIT_REQUIRE(spec->offset + 4 * count <= sizeof h, LOWBIT_ERROR_INTERNAL, "the descriptor of ", field,
                   " lies outside lowbit_hparams_t");
    char* dst = reinterpret_cast<char*>(&h) + spec->offset;
    for (size_t k = 0; k < count; ++k) {
      const double v = values[at + k];
      if (spec->type == LOWBIT_HPARAM_REAL) {
        const float x = float(v);
        std::memcpy(dst + 4 * k, &x, 4);
      } else {
        LOWBIT_REQUIRE(v == std::floor(v) && v >= double(INT32_MIN) && v <= double(INT32_MAX),
                       LOWBIT_ERROR_INVALID_ARGUMENT, field, " = ", v, " must be an integer (",
                       spec->type == LOWBIT_HPARAM_FLAG ? "a flag, 0 or 1" : "an int32 value", ")");
        const int32_t x = int32_t(v);
        std::memcpy(dst + 4 * k, &x, 4);
      }
    }
    at += count;
  }
  LOWBIT_REQUIRE(at == values.size(), LOWBIT_ERROR_INVALID_ARGUMENT, "hparam_values has ", values.size(),
                 " values but hparam_names (", fields.size(), " names) takes ", at);
}

inline const char* ffi_dtype_name(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::PRED: return "bool";
    case ffi::DataType::S8: return "int8";
    case ffi::DataType::S16: return "int16";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::S64: return "int64";
    case ffi::DataType::U8: return "uint8";
    case ffi::DataType::U16: return "uint16";
    case ffi::DataType::U32: return "uint32";
    case ffi::DataType::U64: return "uint64";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F64: return "float64";
    case ffi::DataType::BF16: return "bfloat16";
    default: return "an unsupported dtype";
  }
}

inline bool to_lowbit_dtype(ffi::DataType t, lowbit_dtype_t* out) {
  switch (t) {
    case ffi::DataType::F32: *out = LOWBIT_DTYPE_FLOAT32; return true;
    case ffi::DataType::BF16: *out = LOWBIT_DTYPE_BFLOAT16; return true;
    case ffi::DataType::F16: *out = LOWBIT_DTYPE_FLOAT16; return true;
    default: return false;
  }
}

// The element type a moment's data buffer must have in a given format.
inline ffi::DataType moment_data_dtype(lowbit_state_format_t f) {
  switch (f) {
    case LOWBIT_STATE_FP32: return ffi::DataType::F32;
    case LOWBIT_STATE_BF16: return ffi::DataType::BF16;
    default: return ffi::DataType::U8;
  }
}

inline std::string shape_string(ffi::Span<const int64_t> dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  if (dims.size() == 1) s += ",";
  return s + ")";
}

inline const char* rounding_name(int32_t r) {
  switch (r) {
    case 0: return "nearest";
    case 1: return "stochastic";
    case 2: return "error-correction";
  }
  return "unknown";
}

inline const char* norm_value_name(int32_t n) {
  switch (n) {
    case 0: return "none";
    case LOWBIT_NORMALIZATION_BLOCK: return "block";
    case LOWBIT_NORMALIZATION_RANK1: return "rank1";
    case LOWBIT_NORMALIZATION_FACTORED: return "factored";
  }
  return "unknown";
}

// A layout record (core/layout_record.hpp) for messages.
inline std::string layout_string(const int32_t* r) {
  auto name = [](int32_t f) { return f == 0 ? "none" : format_name(lowbit_state_format_t(f)); };
  std::string shape = "(";
  for (int k = 0; k < r[5] && k < kMaxDims; ++k) shape += concat(k ? ", " : "", r[6 + k]);
  shape += r[5] == 1 ? ",)" : ")";
  return concat("(moment 0: ", name(r[0]), " ", norm_value_name(r[3]), ", moment 1: ", name(r[1]), " ",
                norm_value_name(r[4]), ", rounding: ", rounding_name(r[2]), ", shape: ", r[5] ? shape : "flat",
                ")");
}

inline ffi::ErrorCode error_code(lowbit_status_t s) {
  switch (s) {
    case LOWBIT_ERROR_INVALID_ARGUMENT:
    case LOWBIT_ERROR_NULL_POINTER: return ffi::ErrorCode::kInvalidArgument;
    case LOWBIT_ERROR_UNSUPPORTED: return ffi::ErrorCode::kUnimplemented;
    case LOWBIT_ERROR_OUT_OF_MEMORY: return ffi::ErrorCode::kResourceExhausted;
    case LOWBIT_ERROR_INVALID_STATE: return ffi::ErrorCode::kFailedPrecondition;
    default: return ffi::ErrorCode::kInternal;
  }
}

// Runs `body`, turning every exception into an ffi::Error with the message
// (no exception may cross into XLA).
template <class Body>
ffi::Error guarded(const char* what, Body&& body) {
  try {
    body();
    return ffi::Error::Success();
  } catch (const Error& e) {
    return ffi::Error(error_code(e.status), concat("lowbit ", what, ": ", e.message));
  } catch (const std::bad_alloc&) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, concat("lowbit ", what, ": out of host memory"));
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, concat("lowbit ", what, ": ", e.what()));
  }
}

// The state plan of a leaf, as lowbit_plan_param_state gives it to a param of
// this dtype, size and (bound) shape with these attributes: formats and
// normalisations as resolved, the size threshold off. The hyper-parameters
// enter a plan only through the number of moments they keep.
struct PlanKey {
  int32_t algorithm, num_moments, f[2], nz[2], rounding, dtype, ndim, pad_;
  int64_t numel, dims[LOWBIT_MAX_DIMS];
  bool operator==(const PlanKey& o) const { return std::memcmp(this, &o, sizeof o) == 0; }
};

inline lowbit_state_plan_t plan_leaf(const PlanKey& k, const lowbit_hparams_t& h) {
  lowbit_optimizer_config_t c;
  lowbit_optimizer_config_init(&c, lowbit_algorithm_t(k.algorithm));
  c.min_quantized_numel = 0;
  c.state_format = k.f[0] ? lowbit_state_format_t(k.f[0]) : LOWBIT_STATE_FP32;
  c.second_state_format = lowbit_state_format_t(k.f[1]);
  c.first_normalization = lowbit_normalization_t(k.nz[0]);
  c.second_normalization = lowbit_normalization_t(k.nz[1]);
  c.stochastic_rounding = k.rounding == LOWBIT_ROUNDING_STOCHASTIC;
  c.error_correction = k.rounding == LOWBIT_ROUNDING_ERROR_CORRECTION;
  lowbit_param_config_t pc;
  lowbit_param_config_init(&pc);
  pc.param = lowbit_tensor_t{nullptr, k.numel, lowbit_dtype_t(k.dtype), LOWBIT_DEVICE_CPU, 0};
  pc.ndim = k.ndim;
  for (int d = 0; d < k.ndim; ++d) pc.shape[d] = k.dims[d];
  lowbit_state_plan_t plan;
  lowbit_state_plan_init(&plan);
  check_status(lowbit_plan_param_state(&c, &h, &pc, &plan), lowbit_last_error());
  return plan;
}

inline void check_scalar(const ffi::AnyBuffer& b, ffi::DataType dtype, const char* what) {
  LOWBIT_REQUIRE(b.element_type() == dtype && b.dimensions().size() == 0, LOWBIT_ERROR_INVALID_ARGUMENT, what,
                 " must be a ", ffi_dtype_name(dtype), " scalar, got ", ffi_dtype_name(b.element_type()),
                 shape_string(b.dimensions()));
}

// Bits of the `parts` attribute: which state parts of a param travel as
// buffers (in this order: mu, mu_scale, nu, nu_scale, ecc).
constexpr int32_t kAllParts = 31;
constexpr int kStateParts = 5;

// What an absent part reads as: a 0-element float32 buffer.
inline const XLA_FFI_Buffer* empty_part() {
  static int64_t dims[1] = {0};
  static const XLA_FFI_Buffer b{XLA_FFI_Buffer_STRUCT_SIZE, nullptr, XLA_FFI_DataType_F32, nullptr, 1, dims};
  return &b;
}

inline int part_count(int32_t mask) { return __builtin_popcount(unsigned(mask)); }

// One parameter's buffers.
struct LeafBuffers {
  ffi::AnyBuffer in[kArgsPerParam];
  ffi::AnyBuffer out[kRetsPerParam];
};

inline ffi::AnyBuffer arg_buffer(const ffi::RemainingArgs& args, size_t i) {
  auto b = args.get<ffi::AnyBuffer>(i);
  if (!b) fail(LOWBIT_ERROR_INVALID_ARGUMENT, "input ", i + kLeadingArgs, " is not a buffer");
  return *b;
}

inline ffi::AnyBuffer ret_buffer(const ffi::RemainingRets& rets, size_t i) {
  auto b = rets.get<ffi::AnyBuffer>(i);
  if (!b) fail(LOWBIT_ERROR_INVALID_ARGUMENT, "output ", i + 1, " is not a buffer");
  return **b;
}

// Everything decoded and checked; the buffers point at the output buffers.
// Leaves with the same weight decay share a group. Kept from call to call
// (thread-local): the plans are made again only for leaves whose key changed.
struct PreparedStep {
  std::vector<lowbit_param_buffers_t> params;
  std::vector<PlanKey> keys;
  std::vector<lowbit_state_plan_t> plans;  // params[i].plan points at plans[i]
  std::vector<lowbit_hparams_t> hparams;   // per group; lr comes from the lr buffer
  // (dst, src, bytes): inputs to copy into outputs that XLA did not alias.
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  std::vector<Copy> copies;
};

class StepDecoder {
 public:
  StepDecoder(const StepAttrs& a, const ffi::RemainingArgs& args, const ffi::RemainingRets& rets)
      : a_(a), args_(args), rets_(rets) {}

  // `lr`, `count` and `layout`: inputs 0..2 when they are host memory (CPU),
  // checked here; nullptr on CUDA, where the engine checks them on the device.
  // `layout_dims`: the dims of input 2.
  // `device`, `device_index`: where the buffers are.
  void prepare(const float* lr, const int32_t* count, const int32_t* layout, ffi::Span<const int64_t> layout_dims,
               lowbit_device_t device, int32_t device_index, PreparedStep& out) {
    const lowbit_algorithm_t algorithm = lowbit_algorithm_t(a_.algorithm);
    const Described& described = describe(a_.algorithm);
    lowbit_hparams_t h;
    lowbit_hparams_init(&h, algorithm);
    fill_hparams(described, a_.hparam_names, a_.hparam_values, h);
    const size_t n = a_.parts.size();
    LOWBIT_REQUIRE(n > 0, LOWBIT_ERROR_INVALID_ARGUMENT, "the parts attribute is empty (no params)");
    LOWBIT_REQUIRE(a_.weight_decay.size() == n && a_.rounding.size() == n && a_.formats.size() == 2 * n &&
                       a_.normalizations.size() == 2 * n,
                   LOWBIT_ERROR_INVALID_ARGUMENT,
                   "attributes parts/weight_decay/rounding/formats/normalizations have ", n, "/",
                   a_.weight_decay.size(), "/", a_.rounding.size(), "/", a_.formats.size(), "/",
                   a_.normalizations.size(), " entries (expected N/N/N/2N/2N)");
    in_at_.resize(n + 1);
    in_at_[0] = 0;
    for (size_t i = 0; i < n; ++i) {
      LOWBIT_REQUIRE(a_.parts[i] >= 0 && a_.parts[i] <= kAllParts, LOWBIT_ERROR_INVALID_ARGUMENT, "parts[", i,
                     "] = ", a_.parts[i], " is not a mask of the 5 state parts (0 to 31)");
      in_at_[i + 1] = in_at_[i] + 2 + size_t(part_count(a_.parts[i]));
    }
    LOWBIT_REQUIRE(args_.size() == in_at_[n] && rets_.size() == out_at(n), LOWBIT_ERROR_INVALID_ARGUMENT,
                   "expected ", in_at_[n] + kLeadingArgs, " inputs and ", out_at(n) + 1,
                   " outputs for the parts attribute (lr, count, layout, then param, grad and the present state "
                   "parts per param), got ",
                   args_.size() + kLeadingArgs, " and ", rets_.size() + 1);
    num_leaves_ = n;
    names_split_ = false;
    LOWBIT_REQUIRE(!count || (*count >= 0 && *count < INT32_MAX), LOWBIT_ERROR_INVALID_ARGUMENT, "state.count = ",
                   count ? *count : 0, " must be in [0, 2^31 - 1)");
    LOWBIT_REQUIRE(layout_dims.size() == 2 && layout_dims[0] == int64_t(n) && layout_dims[1] == kLayoutColumns,
                   LOWBIT_ERROR_INVALID_ARGUMENT, "state.layout has shape ", shape_string(layout_dims),
                   " but the optimizer has ", n, " params: expected (", n, ", ", kLayoutColumns,
                   ") (a state made by init() for another params tree, or by an older lowbit.jax?)");

    h.lr = lr ? *lr : 0.f;

    out.params.resize(n);
    if (out.keys.size() != n) {
      out.keys.assign(n, PlanKey{});
      out.keys.shrink_to_fit();
      out.plans.assign(n, lowbit_state_plan_t{});
    }
    out.hparams.clear();
    out.copies.clear();
    int32_t num_moments = -1;  // lowbit_moments_in_use, with the first group's check
    for (size_t i = 0; i < n; ++i) {
      h.weight_decay = a_.weight_decay[i];
      size_t g = 0;
      while (g < out.hparams.size() && out.hparams[g].weight_decay != h.weight_decay) ++g;
      if (g == out.hparams.size()) {
        // leaves differ only in weight decay: checked once per group, at its
        // first leaf (the one a message names)
        const lowbit_status_t st = lowbit_hparams_check(&h, algorithm);
        if (st != LOWBIT_SUCCESS) fail(st, lowbit_last_error(), " (param ", name(i), ")");
        if (num_moments < 0) {
          check_status(lowbit_moments_in_use(algorithm, &h, &num_moments), lowbit_last_error());
          LOWBIT_REQUIRE(num_moments <= 2, LOWBIT_ERROR_UNSUPPORTED, described.info.name, " keeps ", num_moments,
                         " moments with these hyper-parameters; the JAX state carries 2 (mu, nu)");
        }
        out.hparams.push_back(h);
      }
      LeafBuffers b = leaf(i);
      lowbit_param_buffers_t& v = out.params[i];
      lowbit_param_buffers_init(&v);
      v.group = int32_t(g);
      check_leaf(i, b, described, out.hparams[g], num_moments, layout ? layout + kLayoutColumns * i : nullptr,
                 device, device_index, out.keys[i], out.plans[i], v);
      // Views write into the outputs; an output XLA did not alias to its
      // input starts as a copy of it.
      static const int in_of_out[kRetsPerParam] = {0, 2, 3, 4, 5, 6};
      for (size_t k = 0; k < kRetsPerParam; ++k) {
        const ffi::AnyBuffer& src = b.in[in_of_out[k]];
        const ffi::AnyBuffer& dst = b.out[k];
        if (src.size_bytes() && dst.untyped_data() != src.untyped_data())
          out.copies.push_back({dst.untyped_data(), src.untyped_data(), src.size_bytes()});
      }
    }
  }

 private:
  // Param i's buffers: its present parts from the call, the others empty.
  LeafBuffers leaf(size_t i) const {
    const ffi::AnyBuffer empty(empty_part());
    LeafBuffers b{{arg_buffer(args_, in_at_[i]), arg_buffer(args_, in_at_[i] + 1), empty, empty, empty, empty, empty},
                  {ret_buffer(rets_, out_at(i)), empty, empty, empty, empty, empty}};
    size_t in = in_at_[i] + 2, out = out_at(i) + 1;
    for (int k = 0; k < kStateParts; ++k)
      if (a_.parts[i] & (1 << k)) b.in[2 + k] = arg_buffer(args_, in++), b.out[1 + k] = ret_buffer(rets_, out++);
    return b;
  }

  // The leaf names are only for messages: split on the first message that
  // needs one, never on a step that succeeds.
  void split_names() const {
    if (names_split_) return;
    names_split_ = true;
    names_ = split_lines(a_.names);
    if (names_.size() != num_leaves_) names_.clear();
  }

  std::string name(size_t i) const {
    split_names();
    if (i < names_.size() && !names_[i].empty()) return concat(names_[i], " (leaf ", i, ")");
    return concat("leaf ", i);
  }

  // `why()` (what needs this size, for the message) is only called on failure.
  template <class Why>
  void check_size(size_t i, const char* part, const ffi::AnyBuffer& b, ffi::DataType dtype, int64_t elements,
                  const Why& why) const {
    if (int64_t(b.element_count()) == elements && (elements == 0 || b.element_type() == dtype)) return;
    // A part without elements never travels (lowbit.jax passes None or a
    // zero-size array as absent), so it reads as absent here.
    std::string need = elements ? concat(ffi_dtype_name(dtype), "(", elements, ",)") : std::string("none (None)");
    std::string got = b.element_count() ? concat(ffi_dtype_name(b.element_type()), shape_string(b.dimensions()))
                                         : std::string("absent (None or zero-size)");
    fail(LOWBIT_ERROR_INVALID_ARGUMENT, "param ", name(i), ": state ", part, " is ", got, " but ", why(), " needs ",
         need, " (a state made for another param, dtype or format?)");
  }

  void check_leaf(size_t i, const LeafBuffers& b, const Described& described, const lowbit_hparams_t& h,
                  int num_moments, const int32_t* recorded, lowbit_device_t device, int32_t device_index, PlanKey& key,
                  lowbit_state_plan_t& plan, lowbit_param_buffers_t& v) const {
    const ffi::AnyBuffer& param = b.in[0];
    const ffi::AnyBuffer& grad = b.in[1];
    lowbit_dtype_t param_dtype, grad_dtype;
    LOWBIT_REQUIRE(to_lowbit_dtype(param.element_type(), &param_dtype), LOWBIT_ERROR_INVALID_ARGUMENT, "param ",
                   name(i), " has dtype ", ffi_dtype_name(param.element_type()),
                   "; lowbit updates float32, bfloat16 and float16 params");
    LOWBIT_REQUIRE(to_lowbit_dtype(grad.element_type(), &grad_dtype), LOWBIT_ERROR_INVALID_ARGUMENT, "grad of param ",
                   name(i), " has dtype ", ffi_dtype_name(grad.element_type()),
                   "; gradients must be float32, bfloat16 or float16");
    LOWBIT_REQUIRE(param.dimensions() == grad.dimensions(), LOWBIT_ERROR_INVALID_ARGUMENT, "grad of param ", name(i),
                   " has shape ", shape_string(grad.dimensions()), " but the param has shape ",
                   shape_string(param.dimensions()));
    const int64_t numel = int64_t(param.element_count());
    v.param = lowbit_tensor_t{b.out[0].untyped_data(), numel, param_dtype, device, device_index};
    v.grad = lowbit_tensor_t{grad.untyped_data(), numel, grad_dtype, device, device_index};

    const int32_t f[2] = {a_.formats[2 * i], a_.formats[2 * i + 1]};
    const int32_t nz[2] = {a_.normalizations[2 * i], a_.normalizations[2 * i + 1]};
    const int32_t rounding = a_.rounding[i];
    // The shape the state is planned and bound with: the buffer's, for a
    // param with a RANK1 or FACTORED moment; flat otherwise (no moment reads
    // it).
    const bool shaped = nz[0] == LOWBIT_NORMALIZATION_RANK1 || nz[0] == LOWBIT_NORMALIZATION_FACTORED ||
                        nz[1] == LOWBIT_NORMALIZATION_RANK1 || nz[1] == LOWBIT_NORMALIZATION_FACTORED;
    // The params of an algorithm that steps matrices (Muon) always carry
    // their shape; the state record keeps the bound one (flat unless a
    // moment is shaped).
    const bool matrices = described.info.matrices != 0;
    v.ndim = 0;
    if (shaped || matrices) {
      const auto dims = param.dimensions();
      LOWBIT_REQUIRE(dims.size() >= 2 && dims.size() <= size_t(kMaxDims), LOWBIT_ERROR_INVALID_ARGUMENT, "param ",
                     name(i), " has shape ", shape_string(dims), ": ",
                     matrices ? concat(described.info.title, " steps matrices of 2 to ")
                              : std::string("rank1 and factored moments need 2 to "),
                     kMaxDims, " dims");
      v.ndim = int32_t(dims.size());
      for (size_t k = 0; k < dims.size(); ++k) {
        LOWBIT_REQUIRE(dims[k] >= 1 && dims[k] <= INT32_MAX, LOWBIT_ERROR_INVALID_ARGUMENT, "param ", name(i),
                       " has shape ", shape_string(dims), ": rank1 and factored moments need dims in [1, 2^31)");
        v.shape[k] = dims[k];
      }
    }
    const int32_t bound_ndim = shaped ? v.ndim : 0;
    int32_t expected[kLayoutColumns] = {f[0], f[1], rounding, nz[0], nz[1], bound_ndim};
    for (int k = 0; k < bound_ndim; ++k) expected[6 + k] = int32_t(v.shape[k]);
    LOWBIT_REQUIRE(!recorded || std::equal(expected, expected + kLayoutColumns, recorded),
                   LOWBIT_ERROR_INVALID_ARGUMENT, "param ", name(i), ": the state was created with ",
                   recorded ? layout_string(recorded) : std::string(), " but this optimizer uses ",
                   layout_string(expected), " for it");
    static const char* const data_part[2] = {"mu", "nu"};
    static const char* const scale_part[2] = {"mu_scale", "nu_scale"};
    for (int m = 0; m < 2; ++m) {
      if (m >= num_moments) {
        LOWBIT_REQUIRE(f[m] == 0 && nz[m] == 0, LOWBIT_ERROR_INVALID_ARGUMENT, "param ", name(i), ": formats[",
                       2 * i + m, "] = ", f[m], " and normalizations[", 2 * i + m, "] = ", nz[m],
                       " but the algorithm keeps only ", num_moments, " moments (expected 0)");
        auto why = [] { return "an algorithm without this moment"; };
        check_size(i, data_part[m], b.in[2 + 2 * m], ffi::DataType::F32, 0, why);
        check_size(i, scale_part[m], b.in[3 + 2 * m], ffi::DataType::F32, 0, why);
        continue;
      }
      LOWBIT_REQUIRE(f[m] >= LOWBIT_STATE_FP32 && f[m] <= kLastStateFormat, LOWBIT_ERROR_INVALID_ARGUMENT, "param ",
                     name(i), ": formats[", 2 * i + m, "] = ", f[m], " is not a lowbit_state_format_t value");
      switch (nz[m]) {
        case LOWBIT_NORMALIZATION_BLOCK: break;
        case LOWBIT_NORMALIZATION_RANK1:
          LOWBIT_REQUIRE(f[m] == LOWBIT_STATE_8BIT || f[m] == LOWBIT_STATE_4BIT, LOWBIT_ERROR_INVALID_ARGUMENT,
                         "param ", name(i), ": normalizations[", 2 * i + m, "] = rank1 needs the 8bit or 4bit format (",
                         format_name(f[m]), ")");
          break;
        case LOWBIT_NORMALIZATION_FACTORED:
          LOWBIT_REQUIRE(m == 1 && f[m] == LOWBIT_STATE_FP32 && described.info.factored_second,
                         LOWBIT_ERROR_INVALID_ARGUMENT, "param ", name(i), ": normalizations[", 2 * i + m,
                         "] = factored needs the second moment (slot 1), stored as fp32 accumulators, of an "
                         "algorithm whose descriptor allows it (",
                         described.info.name, described.info.factored_second ? " does)" : " does not)");
          break;
        default:
          fail(LOWBIT_ERROR_INVALID_ARGUMENT, "param ", name(i), ": normalizations[", 2 * i + m, "] = ", nz[m],
               " is not block (1), rank1 (2) or factored (3)");
      }
    }
    LOWBIT_REQUIRE(rounding >= 0 && rounding <= 2, LOWBIT_ERROR_INVALID_ARGUMENT, "param ", name(i), ": rounding[", i,
                   "] = ", rounding, " must be 0 (nearest), 1 (stochastic) or 2 (error correction)");
    LOWBIT_REQUIRE(rounding == 0 || param_dtype != LOWBIT_DTYPE_FLOAT32, LOWBIT_ERROR_INVALID_ARGUMENT, "param ",
                   name(i), ": ", rounding_name(rounding), " rounding applies to 16-bit params, this one is float32");

    // The plan of these attributes (made again only when they change).
    PlanKey k{};
    k.algorithm = described.info.algorithm;
    k.num_moments = num_moments;
    k.f[0] = f[0], k.f[1] = f[1], k.nz[0] = nz[0], k.nz[1] = nz[1];
    k.rounding = rounding;
    k.dtype = param_dtype;
    k.ndim = v.ndim;
    k.numel = numel;
    for (int d = 0; d < v.ndim; ++d) k.dims[d] = v.shape[d];
    if (!(k == key)) {
      try {
        plan = plan_leaf(k, h);
      } catch (const Error& e) {
        fail(e.status, "param ", name(i), ": ", e.message);
      }
      key = k;
    }
    v.plan = &plan;
    for (int m = 0; m < num_moments; ++m) {
      const ffi::AnyBuffer& data = b.in[2 + 2 * m];
      const ffi::AnyBuffer& scales = b.in[3 + 2 * m];
      const ffi::DataType ddt = moment_data_dtype(lowbit_state_format_t(f[m]));
      const int64_t elem_bytes = ddt == ffi::DataType::F32 ? 4 : (ddt == ffi::DataType::BF16 ? 2 : 1);
      auto why = [&] {
        if (nz[m] == LOWBIT_NORMALIZATION_BLOCK)
          return concat("the ", format_name(f[m]), " format of a ", numel, "-element param");
        return concat("the ", format_name(f[m]), " ", norm_value_name(nz[m]), " format of a param of shape ",
                      shape_string(ffi::Span<const int64_t>(v.shape, size_t(v.ndim))));
      };
      check_size(i, data_part[m], data, ddt, plan.data_bytes[m] / elem_bytes, why);
      check_size(i, scale_part[m], scales, ffi::DataType::F32, plan.scale_count[m], why);
      v.moment[m] = b.out[1 + 2 * m].untyped_data();
      v.moment_bytes[m] = int64_t(b.out[1 + 2 * m].size_bytes());
      v.scales[m] = static_cast<float*>(b.out[2 + 2 * m].untyped_data());
      v.scale_count[m] = int64_t(b.out[2 + 2 * m].element_count());
    }
    const ffi::AnyBuffer& ecc = b.in[6];
    if (rounding == LOWBIT_ROUNDING_ERROR_CORRECTION) {
      check_size(i, "ecc", ecc, ffi::DataType::U8, numel, [] { return "error correction of this param"; });
      v.ecc = static_cast<uint8_t*>(b.out[5].untyped_data());
      v.ecc_bytes = numel;
    } else {
      check_size(i, "ecc", ecc, ffi::DataType::U8, 0, [] { return "a param without error correction"; });
    }
    // Outputs must mirror their inputs (XLA aliasing guarantees it; checked
    // so that a hand-written call cannot make the engine overrun a buffer).
    static const int in_of_out[kRetsPerParam] = {0, 2, 3, 4, 5, 6};
    static const char* const out_part[kRetsPerParam] = {"param", "mu", "mu_scale", "nu", "nu_scale", "ecc"};
    for (size_t k = 0; k < kRetsPerParam; ++k) {
      const ffi::AnyBuffer& src = b.in[in_of_out[k]];
      const ffi::AnyBuffer& dst = b.out[k];
      LOWBIT_REQUIRE(src.element_type() == dst.element_type() && src.element_count() == dst.element_count(),
                     LOWBIT_ERROR_INVALID_ARGUMENT, "param ", name(i), ": output ", out_part[k], " is ",
                     ffi_dtype_name(dst.element_type()), shape_string(dst.dimensions()), " but its input is ",
                     ffi_dtype_name(src.element_type()), shape_string(src.dimensions()));
    }
  }

  const StepAttrs& a_;
  const ffi::RemainingArgs& args_;
  const ffi::RemainingRets& rets_;
  size_t num_leaves_ = 0;
  std::vector<size_t> in_at_;  // param i's first input among the remaining ones
  // Param i's first output: each param before it has one output fewer than
  // inputs (its grad has none).
  size_t out_at(size_t i) const { return in_at_[i] - i; }
  mutable bool names_split_ = false;
  mutable std::vector<std::string_view> names_;
};

// The checks of inputs 0..2 and output 0 that need no data.
inline void check_leading(const ffi::AnyBuffer& lr, const ffi::AnyBuffer& count, const ffi::AnyBuffer& layout,
                          const ffi::AnyBuffer& count_out) {
  check_scalar(lr, ffi::DataType::F32, "lr");
  check_scalar(count, ffi::DataType::S32, "state.count");
  check_scalar(count_out, ffi::DataType::S32, "the count output");
  LOWBIT_REQUIRE(layout.element_type() == ffi::DataType::S32, LOWBIT_ERROR_INVALID_ARGUMENT,
                 "state.layout must be int32, got ", ffi_dtype_name(layout.element_type()));
}

// The FFI signature of the step after the platform context (CPU: none; CUDA:
// the stream): the protocol at the top of this file.
template <class Binding>
auto bind_step_signature(Binding b) {
  return std::move(b).template Arg<ffi::AnyBuffer>()  // lr
      .template Arg<ffi::AnyBuffer>()      // count
      .template Arg<ffi::AnyBuffer>()      // layout
      .RemainingArgs()
      .template Ret<ffi::AnyBuffer>()  // count
      .RemainingRets()
      .template Attr<int32_t>("algorithm")
      .template Attr<std::string_view>("hparam_names")
      .template Attr<ffi::Span<const double>>("hparam_values")
      .template Attr<ffi::Span<const float>>("weight_decay")
      .template Attr<ffi::Span<const int32_t>>("formats")
      .template Attr<ffi::Span<const int32_t>>("rounding")
      .template Attr<ffi::Span<const int32_t>>("normalizations")
      .template Attr<ffi::Span<const int32_t>>("parts")
      .template Attr<uint64_t>("seed")
      .template Attr<int32_t>("skip_nonfinite")
      .template Attr<int32_t>("num_threads")
      .template Attr<std::string_view>("names");
}

// Enqueues the functional step over the prepared leaves: it reads lr and
// count (and on CUDA checks the state records) in stream order and writes
// count_out = count + 1 unless the step was skipped.
inline void run_step(lowbit_step_context_t ctx, PreparedStep& prep, const float* lr, const int32_t* count,
                     int32_t* count_out, const int32_t* layout, void* stream) {
  lowbit_step_args_t args;
  lowbit_step_args_init(&args);
  args.hparams = prep.hparams.data();
  args.num_groups = int32_t(prep.hparams.size());
  args.lr = lr;
  args.count = count;
  args.count_out = count_out;
  args.records = layout;
  check_status(lowbit_functional_step(ctx, prep.params.data(), int64_t(prep.params.size()), &args, stream),
               lowbit_step_context_last_error(ctx));
}

// The step context of this thread for a step's algorithm, seed and
// non-finite check on a device (CPU: with num_threads threads); created once
// per combination (CUDA: it holds device memory).
inline lowbit_step_context_t step_context(int32_t algorithm, uint64_t seed, int32_t skip_nonfinite,
                                          lowbit_device_t device, int32_t device_index, int32_t num_threads) {
  struct Entry {
    int32_t algorithm, skip, device, index, threads;
    uint64_t seed;
    std::unique_ptr<lowbit_step_context, lowbit_status_t (*)(lowbit_step_context_t)> ctx;
  };
  thread_local std::vector<Entry> contexts;
  for (Entry& e : contexts)
    if (e.algorithm == algorithm && e.skip == skip_nonfinite && e.device == device && e.index == device_index &&
        e.threads == num_threads && e.seed == seed)
      return e.ctx.get();
  lowbit_optimizer_config_t c;
  lowbit_optimizer_config_init(&c, lowbit_algorithm_t(algorithm));
  c.device = device;
  c.device_index = device_index;
  c.seed = seed;
  c.skip_nonfinite = skip_nonfinite != 0;
  c.num_threads = num_threads;
  lowbit_step_context_t ctx = nullptr;
  check_status(lowbit_step_context_create(&ctx, &c), lowbit_last_error());
  contexts.push_back(Entry{algorithm, skip_nonfinite, int32_t(device), device_index, num_threads, seed,
                           {ctx, lowbit_step_context_destroy}});
  return ctx;
}

}  // namespace jaxffi
}  // namespace lowbit
