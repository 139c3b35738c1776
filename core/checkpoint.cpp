// Checkpoint format, version 2 (all integers little-endian):
//   "LOWBITCK"  u32 version  u32 mode  u32 algorithm  u32 num_groups
//   u64 total_size (whole file)  u64 num_params  u64 seed  i64 freeze_step
//   groups: f32 lr beta1 beta2 eps weight_decay momentum dampening, i32 nesterov bias_correction
//   per param: i64 numel  u32 ndim  i64 dims[ndim]
//              u32 param_dtype  i32 group  i64 step  u32 rounding  u32 num_moments
//              per moment: u32 format  u32 normalization (0 block, 1 rank1, 2 factored)  u32 block
//                          u64 data_bytes  u64 scale_bytes  data  scales
//                          (rank1: codes, then the vectors and their workspace half;
//                           factored: format fp32, data = the accumulators; lowbit.h)
//              u64 ecc_bytes  ecc
//              u32 crc32 of this param record
//   u32 crc32 of everything before it
// Version 3 (written by optimizers whose extension has a checkpoint section:
// 0/1 Adam and 1-bit LAMB; the others still write version 2) inserts the
// extension's section before the final checksum
// (distributed/checkpoint_section.cpp).
// Version 4 (since 0.8, written where a group's algorithm reads a field of
// lowbit_hparams_t added in 0.8: RMSprop, Adagrad) is version 2 with, after
// each group's fields above, u32 n and the n 4-byte words of lowbit_hparams_t
// from `alpha` on (the fields since 0.8 in declaration order: f32 alpha, i32
// centered, f32 lr_decay, f32 initial_accumulator_value, and any a later
// release appends; a reader takes the words it knows and refuses more).
// Version 1 (lowbit 0.2) is the same without ndim / dims and normalization
// (1-D, blocks); it still loads. Materialised checkpoints hold every moment
// as fp32 / bf16 values (a factored v as its reconstruction v^).
// Loading parses and checks the whole file and builds the new state on the
// host before anything in the optimizer is replaced.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>

#include "checkpoint_io.hpp"
#include "codec.hpp"
#include "crc32.hpp"
#include "defaults.hpp"
#include "error.hpp"
#include "float16.hpp"
#include "hparam_specs.hpp"
#include "hparams.hpp"
#include "optimizer.hpp"
#include "quant.hpp"
#include "validation.hpp"

namespace lowbit {
namespace {

// Fuzz builds skip checksum verification so mutated inputs reach the parser.
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
constexpr bool kVerifyChecksums = false;
#else
constexpr bool kVerifyChecksums = true;
#endif

constexpr char kMagic[8] = {'L', 'O', 'W', 'B', 'I', 'T', 'C', 'K'};
constexpr uint32_t kVersion = 2;
constexpr uint32_t kVersionWithSection = 3;  // kVersion plus the extension's section
constexpr uint32_t kVersionWith08Hparams = 4;  // kVersion plus the groups' 0.8 fields
constexpr size_t k08Offset = offsetof(lowbit_hparams_t, alpha);
constexpr uint32_t k08Words = uint32_t((sizeof(lowbit_hparams_t) - k08Offset) / 4);
static_assert((sizeof(lowbit_hparams_t) - k08Offset) % 4 == 0, "the 0.8 fields are 4-byte words");
constexpr uint64_t k08GroupBytes = 4 + 4 * uint64_t(k08Words);

// Whether any group reads a hyper-parameter that 0.8 added.
bool reads_08_hparams(const std::vector<lowbit_hparams_t>& groups, lowbit_algorithm_t optimizer_algorithm) {
  for (const lowbit_hparams_t& h : groups)
    for (const lowbit_hparam_info_t& i : hparam_infos(group_algorithm(h, optimizer_algorithm)))
      if (i.since >= kSince08) return true;
  return false;
}

using Writer = CheckpointWriter;
using Reader = CheckpointReader;

// The magic and the format version at the start of a checkpoint, checked.
uint32_t read_magic_and_version(Reader& r) {
  LOWBIT_REQUIRE(std::memcmp(r.take(8, "magic"), kMagic, 8) == 0, LOWBIT_ERROR_CORRUPT_DATA,
                 "not a lowbit checkpoint (bad magic)");
  const uint32_t version = r.get<uint32_t>("version");
  LOWBIT_REQUIRE(version >= 1 && version <= kVersionWith08Hparams, LOWBIT_ERROR_VERSION_MISMATCH,
                 "checkpoint format version ", version, " is not supported (this library reads versions 1 to ",
                 kVersionWith08Hparams, ")");
  return version;
}

struct LoadedMoment {
  std::vector<uint8_t> data, scales;
};
struct LoadedParam {
  int32_t group;
  int64_t step;
  LoadedMoment moment[2];
  std::vector<uint8_t> ecc;
};


}  // namespace

std::vector<uint8_t> Optimizer::save(lowbit_checkpoint_mode_t mode, void* stream) const {
  LOWBIT_REQUIRE(mode >= LOWBIT_CHECKPOINT_COMPRESSED && mode <= LOWBIT_CHECKPOINT_MATERIALIZED_BF16,
                 LOWBIT_ERROR_INVALID_ARGUMENT, "mode = ", int(mode), " is not a lowbit_checkpoint_mode_t value");
  Writer w;
  w.append(kMagic, 8);
  const bool ext = extension_ && extension_->has_checkpoint_section();
  const bool with_08 = reads_08_hparams(groups_, config_.algorithm);
  w.put<uint32_t>(ext ? kVersionWithSection : with_08 ? kVersionWith08Hparams : kVersion);
  w.put<uint32_t>(uint32_t(mode));
  w.put<uint32_t>(uint32_t(config_.algorithm));
  w.put<uint32_t>(uint32_t(groups_.size()));
  size_t total_size_at = w.out.size();
  w.put<uint64_t>(0);
  w.put<uint64_t>(params_.size());
  w.put<uint64_t>(config_.seed);
  w.put<int64_t>(config_.freeze_step);
  for (const lowbit_hparams_t& h : groups_) {
    for (float f : {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.momentum, h.dampening}) w.put<float>(f);
    w.put<int32_t>(h.nesterov);
    w.put<int32_t>(h.bias_correction);
    if (config_.algorithm == LOWBIT_ALGORITHM_MUON) {  // a Muon checkpoint's groups also hold these
      w.put<int32_t>(int32_t(h.algorithm));
      w.put<int32_t>(h.ns_steps);
      for (float f : h.ns_coefficients) w.put<float>(f);
      w.put<int32_t>(int32_t(h.adjust_lr));
      w.put<int32_t>(int32_t(h.ns_precision));
    }
    if (with_08) {
      w.put<uint32_t>(k08Words);
      for (uint32_t k = 0; k < k08Words; ++k) {
        uint32_t word;
        std::memcpy(&word, reinterpret_cast<const char*>(&h) + k08Offset + 4 * k, 4);
        w.put<uint32_t>(word);
      }
    }
  }
  std::vector<uint8_t> data, scales;
  std::vector<float> values;
  const std::vector<int64_t> step_counts = steps(stream);
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamState& p = params_[i];
    size_t record_start = w.out.size();
    w.put<int64_t>(p.param.numel);
    w.put<uint32_t>(uint32_t(p.shape.ndim));
    for (int k = 0; k < p.shape.ndim; ++k) w.put<int64_t>(p.shape.dim[k]);
    w.put<uint32_t>(uint32_t(p.param.dtype));
    w.put<int32_t>(p.group);
    w.put<int64_t>(step_counts[i]);
    w.put<uint32_t>(uint32_t(p.rounding));
    w.put<uint32_t>(uint32_t(p.num_moments));
    for (int m = 0; m < p.num_moments; ++m) {
      const MomentState& ms = p.moment[m];
      data.resize(ms.data.bytes());
      scales.resize(ms.scales.bytes());
      engine_->copy_to_host(data.data(), ms.data.data(), data.size(), stream);
      engine_->copy_to_host(scales.data(), ms.scales.data(), scales.size(), stream);
      lowbit_state_format_t out_format = ms.format;
      Norm out_norm = ms.norm;
      if (mode != LOWBIT_CHECKPOINT_COMPRESSED) {
        MomentView host = moment_view(p, m);
        host.data = data.data();
        host.scales = reinterpret_cast<float*>(scales.data());
        values.resize(size_t(p.param.numel));
        decode_moment(host, p.shape, p.param.numel, values.data());
        out_norm = Norm::Block;
        out_format = mode == LOWBIT_CHECKPOINT_MATERIALIZED_FP32 ? LOWBIT_STATE_FP32 : LOWBIT_STATE_BF16;
        data.assign(size_t(moment_data_bytes(out_format, p.param.numel)), 0);
        scales.clear();
        MomentView out = lowbit::moment_view(out_format, ms.kind, data.data(), nullptr);
        reencode_moment(out, p.shape, p.param.numel, values.data());  // bf16: saturating
      }
      w.put<uint32_t>(uint32_t(out_format));
      w.put<uint32_t>(uint32_t(out_norm));
      w.put<uint32_t>(uint32_t(out_norm == Norm::Block ? block_size(out_format) : 0));
      w.put<uint64_t>(data.size());
      w.put<uint64_t>(scales.size());
      w.append(data.data(), data.size());
      w.append(scales.data(), scales.size());
    }
    data.resize(p.ecc.bytes());
    if (!data.empty()) engine_->copy_to_host(data.data(), p.ecc.data(), data.size(), stream);
    w.put<uint64_t>(data.size());
    w.append(data.data(), data.size());
    w.put<uint32_t>(crc32(w.out.data() + record_start, w.out.size() - record_start));
  }
  if (ext) extension_->save_section(w, stream);
  uint64_t total = w.out.size() + 4;
  std::memcpy(w.out.data() + total_size_at, &total, 8);
  w.put<uint32_t>(crc32(w.out.data(), w.out.size()));
  return std::move(w.out);
}

uint64_t Optimizer::checkpoint_size(const uint8_t* head) const {
  Reader r(head, kCheckpointHeadBytes);
  const uint32_t version = read_magic_and_version(r);
  r.get<uint32_t>("mode");
  r.get<uint32_t>("algorithm");
  const uint32_t num_groups = r.get<uint32_t>("num_groups");
  const uint64_t total = r.get<uint64_t>("total_size");
  // The largest checkpoint of this optimizer's params with num_groups groups:
  // the header, the groups, and per param its record (with up to 8 dims) with
  // every moment in the widest layout (fp32 values, or factored accumulators:
  // at most 3 floats per element; block scales, or rank-1 vectors: 8 bytes
  // per unit of the dims' sum) and error-correction bytes, then the checksum.
  // Saturating: a sum past 2^64 only makes the bound larger.
  auto add = [](uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; };
  auto mul = [](uint64_t a, uint64_t b) { return b && a > UINT64_MAX / b ? UINT64_MAX : a * b; };
  const uint64_t fixed = 56, record = 32 + 8 + 4 + 4 + 8 * kMaxDims, moment = 28;
  const uint64_t group = (config_.algorithm == LOWBIT_ALGORITHM_MUON ? 36 + 28 : 36) +  // Muon's group fields
                         (version == kVersionWith08Hparams ? k08GroupBytes : 0);
  uint64_t largest = add(add(fixed, mul(group, num_groups)), 4);
  for (const ParamState& p : params_) {
    const uint64_t n = uint64_t(p.param.numel);
    largest = add(largest, add(record, n));
    // fp32 data is the widest format except for tiny params, where one
    // scale per block can outweigh it: bound both together.
    uint64_t dim_sum = 0;
    for (int k = 0; k < p.shape.ndim; ++k) dim_sum = add(dim_sum, uint64_t(p.shape.dim[k]));
    const uint64_t widest = add(add(moment, mul(12, n)), add(mul(4, n / 128 + 1), mul(8, dim_sum)));
    largest = add(largest, mul(uint64_t(p.num_moments), widest));
  }
  if (version == kVersionWithSection && extension_) largest = add(largest, extension_->max_section_bytes(num_groups));
  const uint64_t smallest = fixed + 4;
  LOWBIT_REQUIRE(total >= smallest && total <= largest, LOWBIT_ERROR_CORRUPT_DATA,
                 "checkpoint header announces ", total, " bytes; a checkpoint of this optimizer's ", params_.size(),
                 " params with ", num_groups, " groups takes ", smallest, " to ", largest, " bytes");
  return total;
}

void Optimizer::load(const uint8_t* bytes, int64_t size, void* stream) {
  LOWBIT_REQUIRE(bytes != nullptr, LOWBIT_ERROR_NULL_POINTER, "buffer is NULL");
  LOWBIT_REQUIRE(size >= 0, LOWBIT_ERROR_INVALID_ARGUMENT, "size = ", size, " must be >= 0");
  Reader r(bytes, size_t(size));
  const uint32_t version = read_magic_and_version(r);
  uint32_t mode = r.get<uint32_t>("mode");
  uint32_t algorithm = r.get<uint32_t>("algorithm");
  uint32_t num_groups = r.get<uint32_t>("num_groups");
  uint64_t total = r.get<uint64_t>("total_size");
  LOWBIT_REQUIRE(total == uint64_t(size), LOWBIT_ERROR_CORRUPT_DATA, "checkpoint is truncated or has trailing data: ",
                 size, " bytes given, the header says ", total);
  uint32_t stored_crc;
  std::memcpy(&stored_crc, bytes + size - 4, 4);
  LOWBIT_REQUIRE(!kVerifyChecksums || crc32(bytes, size_t(size) - 4) == stored_crc, LOWBIT_ERROR_CORRUPT_DATA,
                 "checkpoint checksum mismatch: the data is corrupt");
  LOWBIT_REQUIRE(mode >= LOWBIT_CHECKPOINT_COMPRESSED && mode <= LOWBIT_CHECKPOINT_MATERIALIZED_BF16,
                 LOWBIT_ERROR_CORRUPT_DATA, "checkpoint mode ", mode, " is unknown");
  LOWBIT_REQUIRE(algorithm == uint32_t(config_.algorithm), LOWBIT_ERROR_STATE_MISMATCH, "checkpoint algorithm ",
                 algorithm, " differs from this optimizer's ", int(config_.algorithm));
  const bool has_section = extension_ && extension_->has_checkpoint_section();
  LOWBIT_REQUIRE((version == kVersionWithSection) == has_section, LOWBIT_ERROR_CORRUPT_DATA,
                 "checkpoint format version ", version, " does not fit algorithm ", algorithm,
                 " (0/1 Adam and 1-bit LAMB write version ", kVersionWithSection, ", the others 1 or ", kVersion, ")");
  uint64_t num_params = r.get<uint64_t>("num_params");
  LOWBIT_REQUIRE(num_params == params_.size(), LOWBIT_ERROR_STATE_MISMATCH, "checkpoint has ", num_params,
                 " params, this optimizer has ", params_.size());
  LOWBIT_REQUIRE(num_groups >= 1 && num_groups <= size_t(size) / 36, LOWBIT_ERROR_CORRUPT_DATA,
                 "checkpoint group count ", num_groups, " is impossible");
  uint64_t seed = r.get<uint64_t>("seed");
  int64_t freeze_step = r.get<int64_t>("freeze_step");
  std::vector<lowbit_hparams_t> groups(num_groups);
  for (lowbit_hparams_t& h : groups) {
    h = default_hparams(config_.algorithm);
    for (float* f : {&h.lr, &h.beta1, &h.beta2, &h.eps, &h.weight_decay, &h.momentum, &h.dampening})
      *f = r.get<float>("hparams");
    h.nesterov = r.get<int32_t>("nesterov");
    h.bias_correction = r.get<int32_t>("bias_correction");
    if (config_.algorithm == LOWBIT_ALGORITHM_MUON) {
      h.algorithm = lowbit_algorithm_t(r.get<int32_t>("algorithm"));
      h.ns_steps = r.get<int32_t>("ns_steps");
      for (float& f : h.ns_coefficients) f = r.get<float>("ns_coefficients");
      h.adjust_lr = lowbit_muon_lr_adjust_t(r.get<int32_t>("adjust_lr"));
      h.ns_precision = lowbit_ns_precision_t(r.get<int32_t>("ns_precision"));
    }
    if (version == kVersionWith08Hparams) {
      const uint32_t words = r.get<uint32_t>("hparams words");
      LOWBIT_REQUIRE(words <= k08Words, LOWBIT_ERROR_VERSION_MISMATCH, "checkpoint groups hold ", words,
                     " words of hyper-parameters since 0.8; this library knows ", k08Words,
                     " (a checkpoint of a newer library)");
      for (uint32_t k = 0; k < words; ++k) {
        const uint32_t word = r.get<uint32_t>("hparams");
        std::memcpy(reinterpret_cast<char*>(&h) + k08Offset + 4 * k, &word, 4);
      }
    }
    try {
      check_hparams(h, config_.algorithm);
    } catch (const Error& e) {
      fail(LOWBIT_ERROR_CORRUPT_DATA, "checkpoint holds invalid hyper-parameters: ", e.what());
    }
  }

  std::vector<LoadedParam> loaded(params_.size());
  std::vector<float> values;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamState& p = params_[i];
    LoadedParam& out = loaded[i];
    size_t record_start = r.pos();
    int64_t numel = r.get<int64_t>("numel");
    LOWBIT_REQUIRE(numel == p.param.numel, LOWBIT_ERROR_STATE_MISMATCH, "checkpoint param ", i, " has ", numel,
                   " elements, the registered param has ", p.param.numel);
    Shape shape{};  // the checkpoint's (the layout of its shaped moments)
    if (version >= 2) {
      const uint32_t ndim = r.get<uint32_t>("ndim");
      LOWBIT_REQUIRE(ndim <= uint32_t(kMaxDims), LOWBIT_ERROR_CORRUPT_DATA, "checkpoint param ", i, " has ", ndim,
                     " dims");
      shape.ndim = int32_t(ndim);
      int64_t product = 1;
      for (uint32_t k = 0; k < ndim; ++k) {
        shape.dim[k] = r.get<int64_t>("dims");
        LOWBIT_REQUIRE(shape.dim[k] >= 1 && shape.dim[k] <= numel && product <= numel / shape.dim[k],
                       LOWBIT_ERROR_CORRUPT_DATA, "checkpoint param ", i, " has a bad dim ", shape.dim[k]);
        product *= shape.dim[k];
      }
      LOWBIT_REQUIRE(ndim == 0 || product == numel, LOWBIT_ERROR_CORRUPT_DATA, "checkpoint param ", i,
                     ": its dims hold ", product, " elements, not ", numel);
    }
    r.get<uint32_t>("param_dtype");
    out.group = r.get<int32_t>("group");
    LOWBIT_REQUIRE(out.group >= 0 && uint32_t(out.group) < num_groups, LOWBIT_ERROR_CORRUPT_DATA, "checkpoint param ",
                   i, " names group ", out.group, " of ", num_groups);
    out.step = r.get<int64_t>("step");
    LOWBIT_REQUIRE(out.step >= 0 && out.step <= kMaxCheckpointStep, LOWBIT_ERROR_CORRUPT_DATA, "checkpoint param ", i,
                   " has step ", out.step, " (a step count is 0 .. 2^62 = ", kMaxCheckpointStep, ")");
    r.get<uint32_t>("rounding");
    uint32_t num_moments = r.get<uint32_t>("num_moments");
    LOWBIT_REQUIRE(num_moments == uint32_t(p.num_moments), LOWBIT_ERROR_STATE_MISMATCH, "checkpoint param ", i,
                   " keeps ", num_moments, " moments, the registered param keeps ", p.num_moments,
                   config_.algorithm == LOWBIT_ALGORITHM_SGD
                       ? " (SGD keeps a momentum buffer when the param's group has momentum != 0 at registration: "
                         "register it in a group with the momentum the saved optimizer was created with)"
                       : "");
    for (int m = 0; m < p.num_moments; ++m) {
      uint32_t raw_format = r.get<uint32_t>("format");
      const uint32_t raw_norm = version >= 2 ? r.get<uint32_t>("normalization") : 0u;
      uint32_t block = r.get<uint32_t>("block");
      uint64_t data_bytes = r.get<uint64_t>("data_bytes");
      uint64_t scale_bytes = r.get<uint64_t>("scale_bytes");
      LOWBIT_REQUIRE(raw_format >= LOWBIT_STATE_FP32 && raw_format <= kLastStateFormat, LOWBIT_ERROR_CORRUPT_DATA,
                     "checkpoint param ", i, " moment ", m, " has unknown format ", raw_format);
      auto format = lowbit_state_format_t(raw_format);
      const Norm norm = Norm(raw_norm <= 2 ? raw_norm : 0);
      const bool norm_ok = raw_norm == 0 || (shape.ndim >= 2 && ((raw_norm == 1 && rank1_format(format)) ||
                                                                  (raw_norm == 2 && m == 1 && format == LOWBIT_STATE_FP32)));
      bool layout_ok = norm_ok && block == uint32_t(norm == Norm::Block ? block_size(format) : 0);
      try {  // the sizes of `format` for numel, in checked arithmetic
        layout_ok = layout_ok && data_bytes == uint64_t(moment_data_bytes(format, norm, shape, numel)) &&
                    scale_bytes == uint64_t(moment_scale_bytes(format, norm, shape, numel));
      } catch (const Error&) {
        layout_ok = false;  // too large to size: no file can hold it
      }
      LOWBIT_REQUIRE(layout_ok, LOWBIT_ERROR_CORRUPT_DATA, "checkpoint param ", i, " moment ", m,
                     " has an inconsistent layout (format ", int(format), ", normalization ", raw_norm, ", block ",
                     block, ", ", data_bytes, " data bytes, ", scale_bytes, " scale bytes for ", numel,
                     " elements)");
      uint8_t* src_data = const_cast<uint8_t*>(r.take(data_bytes, "moment data"));
      uint8_t* stored_scales = const_cast<uint8_t*>(r.take(scale_bytes, "moment scales"));
      MomentView src =
          lowbit::moment_view(format, p.moment[m].kind, src_data, reinterpret_cast<float*>(stored_scales));
      src.norm = norm;
      const MomentState& dst = p.moment[m];
      bool same_shape = shape.ndim == p.shape.ndim;
      for (int k = 0; k < shape.ndim && same_shape; ++k) same_shape = shape.dim[k] == p.shape.dim[k];
      if (format == dst.format && norm == dst.norm && (norm == Norm::Block || same_shape)) {
        out.moment[m].data.assign(static_cast<uint8_t*>(src.data), static_cast<uint8_t*>(src.data) + data_bytes);
        out.moment[m].scales.assign(reinterpret_cast<uint8_t*>(src.scales),
                                    reinterpret_cast<uint8_t*>(src.scales) + scale_bytes);
        continue;
      }
      // Another format: the scales may be unaligned inside the buffer, so decode from a copy.
      std::vector<uint8_t> src_scales(reinterpret_cast<uint8_t*>(src.scales),
                                      reinterpret_cast<uint8_t*>(src.scales) + scale_bytes);
      src.scales = reinterpret_cast<float*>(src_scales.data());
      values.resize(size_t(numel));
      // A factored source's accumulators are unaligned inside the buffer as well.
      std::vector<uint8_t> src_copy;
      if (norm == Norm::Factored) {
        src_copy.assign(src_data, src_data + data_bytes);
        src.data = src_copy.data();
      }
      decode_moment(src, shape, numel, values.data());
      out.moment[m].data.assign(dst.data.bytes(), 0);
      out.moment[m].scales.assign(dst.scales.bytes(), 0);
      MomentView target = moment_view(p, m);
      target.data = out.moment[m].data.data();
      target.scales = reinterpret_cast<float*>(out.moment[m].scales.data());
      if (dst.norm != Norm::Block && m == 1)
        for (float& x : values) x = x < 0.f ? 0.f : x;  // a second moment from a checkpoint of another layout
      reencode_moment(target, p.shape, numel, values.data(), format == LOWBIT_STATE_BF16);
    }
    uint64_t ecc_bytes = r.get<uint64_t>("ecc_bytes");
    LOWBIT_REQUIRE(ecc_bytes == 0 || ecc_bytes == uint64_t(numel), LOWBIT_ERROR_CORRUPT_DATA, "checkpoint param ", i,
                   " has ", ecc_bytes, " error-correction bytes for ", numel, " elements");
    const uint8_t* ecc = r.take(ecc_bytes, "error-correction bytes");
    if (p.ecc.bytes()) out.ecc.assign(p.ecc.bytes(), 0);
    if (p.ecc.bytes() && ecc_bytes) std::memcpy(out.ecc.data(), ecc, p.ecc.bytes());
    uint32_t record_crc = crc32(bytes + record_start, r.pos() - record_start);
    LOWBIT_REQUIRE(r.get<uint32_t>("param checksum") == record_crc || !kVerifyChecksums, LOWBIT_ERROR_CORRUPT_DATA, "checkpoint param ", i,
                   " checksum mismatch");
  }
  std::function<void(void*)> commit_section;
  if (version == kVersionWithSection) commit_section = extension_->load_section(r, num_groups);
  r.get<uint32_t>("checksum");
  LOWBIT_REQUIRE(r.pos() == size_t(size), LOWBIT_ERROR_CORRUPT_DATA, "checkpoint has trailing bytes");
  // SGD: whether a param has a momentum buffer was decided when it was
  // registered (and the checkpoint's moment count matched it above), not by
  // the momentum its group has now: a group may set momentum to 0 and keep
  // its buffers (a schedule ending at 0 resumes). Only a param without a
  // buffer cannot take a group with momentum, as in set_hparams.
  for (size_t i = 0; i < params_.size(); ++i) {
    const float momentum = groups[size_t(loaded[i].group)].momentum;
    LOWBIT_REQUIRE(config_.algorithm != LOWBIT_ALGORITHM_SGD || params_[i].num_moments == 1 || momentum == 0.f,
                   LOWBIT_ERROR_STATE_MISMATCH, "checkpoint param ", i, " is in group ", loaded[i].group,
                   " with momentum = ", momentum, ", but the param was registered without momentum, so it has no "
                   "momentum buffer");
  }

  // Commit: nothing below can fail on the CPU engine.
  std::vector<int64_t> step_counts(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    ParamState& p = params_[i];
    for (int m = 0; m < p.num_moments; ++m) {
      engine_->copy_from_host(p.moment[m].data.data(), loaded[i].moment[m].data.data(), p.moment[m].data.bytes(),
                              stream);
      engine_->copy_from_host(p.moment[m].scales.data(), loaded[i].moment[m].scales.data(),
                              p.moment[m].scales.bytes(), stream);
    }
    if (p.ecc.bytes()) engine_->copy_from_host(p.ecc.data(), loaded[i].ecc.data(), p.ecc.bytes(), stream);
    p.group = loaded[i].group;
    param_groups_[i] = p.group;
    step_counts[i] = loaded[i].step;
  }
  if (!step_counts.empty()) engine_->write_steps(step_counts.data(), int64_t(step_counts.size()), stream);
  groups_ = std::move(groups);
  push_hparams();
  bind(0);
  config_.freeze_step = freeze_step;
  config_.seed = seed;  // stochastic rounding continues with the same bits
  if (commit_section) commit_section(stream);
  if (extension_) extension_->steps_changed(stream);
}

}  // namespace lowbit
