// Raw views of one parameter's tensors and state, as the engines see them.
// The optimizer owns the memory; engines (CPU, CUDA) and the JAX handlers only
// read and write through these views.
#pragma once
#include <cstdint>

#include "lowbit.h"
#include "qmaps.hpp"
#include "shape.hpp"
#include "update_rules.hpp"

namespace lowbit {

// A moment stored in one of the state formats. `data` holds the elements
// (fp32, bf16, 8-bit codes, 4-bit code pairs or e4m3 bytes), `scales` one fp32
// absmax (FP8: absmax / 448) per block for the quantized formats.
struct MomentView {
  lowbit_state_format_t format = LOWBIT_STATE_FP32;
  void* data = nullptr;
  float* scales = nullptr;
  const QMap* map = nullptr;  // 8BIT / 4BIT only
  bool second = false;        // a second moment: positive values never encode to 0 (floor_positive)
  bool stochastic = false;    // codes rounded stochastically (4BIT_SR, stored as 4BIT: quant.hpp stochastic_code)
  // Block: `scales` per block. Rank1 (8BIT / 4BIT, ParamView::shape has >= 2
  // dims): `scales` holds the current vectors r_k, then as many floats of
  // step workspace. Factored (format FP32): `data` holds the accumulators
  // row, col and the row means (core/shape.hpp), `scales` is unused.
  Norm norm = Norm::Block;
};

// The values of lowbit_rounding_t.
enum class WeightRounding : int32_t {
  Nearest = LOWBIT_ROUNDING_NEAREST,
  Stochastic = LOWBIT_ROUNDING_STOCHASTIC,
  ErrorCorrection = LOWBIT_ROUNDING_ERROR_CORRECTION
};

// One parameter and its state as an engine sees it (what bind() takes).
struct ParamView {
  void* param = nullptr;
  lowbit_dtype_t param_dtype = LOWBIT_DTYPE_FLOAT32;
  int64_t numel = 0;
  int num_moments = 0;
  MomentView moment[2];
  uint8_t* ecc = nullptr;  // error-correction bytes (ErrorCorrection only)
  WeightRounding rounding = WeightRounding::Nearest;
  Shape shape{};  // ndim 0: flat (only Rank1 / Factored moments read it)
};

// The last value of lowbit_state_format_t.
constexpr lowbit_state_format_t kLastStateFormat = LOWBIT_STATE_4BIT_DYN;
// How a format's moment is laid out: 4BIT_SR and 4BIT_DYN as 4BIT (4BIT_SR's
// encoding differs, MomentView::stochastic; 4BIT_DYN's unsigned map,
// MomentView::map); every other format as itself.
inline lowbit_state_format_t storage_format(lowbit_state_format_t f) {
  return f == LOWBIT_STATE_4BIT_SR || f == LOWBIT_STATE_4BIT_DYN ? LOWBIT_STATE_4BIT : f;
}

// The lowbit_state_format_t a view was made from (moment_view): its format,
// 4BIT_SR for a stochastic one, 4BIT_DYN for one on the unsigned dynamic map.
inline lowbit_state_format_t public_format(const MomentView& v) {
  if (v.stochastic) return LOWBIT_STATE_4BIT_SR;
  return v.format == LOWBIT_STATE_4BIT && v.map == &qmap(MapId::UnsignedDynamic4) ? LOWBIT_STATE_4BIT_DYN : v.format;
}

// Whether rank-1 normalisation takes this format (8BIT, 4BIT, 4BIT_DYN: codes
// whose scale may come from vectors; FP8 and 4BIT_SR keep their blocks).
inline bool rank1_format(lowbit_state_format_t f) {
  return f == LOWBIT_STATE_8BIT || f == LOWBIT_STATE_4BIT || f == LOWBIT_STATE_4BIT_DYN;
}

int64_t block_size(lowbit_state_format_t format);
int64_t num_blocks(lowbit_state_format_t format, int64_t numel);
int64_t moment_data_bytes(lowbit_state_format_t format, int64_t numel);
int64_t moment_scale_bytes(lowbit_state_format_t format, int64_t numel);
// The size functions above are checked: numel < 0, or a size over INT64_MAX,
// throws lowbit::Error (INVALID_ARGUMENT naming param.numel). a + b bytes of
// the state of a param of `numel` elements, checked the same way.
int64_t checked_add_bytes(int64_t a, int64_t b, int64_t numel);
bool is_quantized(lowbit_state_format_t format);
const char* format_name(lowbit_state_format_t format);
const char* dtype_name(lowbit_dtype_t dtype);
int64_t dtype_bytes(lowbit_dtype_t dtype);
// The map of moment 0 (signed) or 1 (unsigned) for a quantized format.
const QMap* moment_map(lowbit_state_format_t format, lowbit_moment_kind_t kind);
// The view of moment 0 or 1 stored in `format` at data / scales.
MomentView moment_view(lowbit_state_format_t format, lowbit_moment_kind_t kind, void* data, float* scales);
// The kind a released plan left 0 (before 0.8): moment 0 signed, 1 unsigned.
lowbit_moment_kind_t kind_or_index(lowbit_moment_kind_t kind, int moment);
// Moment `slot` of the Adam family (0: signed, 1: unsigned), for the codec
// tests and benchmarks.
inline const QMap* adam_moment_map(lowbit_state_format_t format, int slot) {
  return moment_map(format, kind_or_index(lowbit_moment_kind_t(0), slot));
}
inline MomentView adam_moment_view(lowbit_state_format_t format, int slot, void* data, float* scales) {
  return moment_view(format, kind_or_index(lowbit_moment_kind_t(0), slot), data, scales);
}
// Sizes of a moment with a normalisation (Block: as above).
int64_t moment_data_bytes(lowbit_state_format_t format, Norm norm, const Shape& shape, int64_t numel);
int64_t moment_scale_bytes(lowbit_state_format_t format, Norm norm, const Shape& shape, int64_t numel);
const char* norm_name(Norm norm);
inline lowbit_normalization_t to_c_norm(Norm n) { return lowbit_normalization_t(int(n) + 1); }
inline Norm from_c_norm(lowbit_normalization_t n) {
  return n == LOWBIT_NORMALIZATION_RANK1 ? Norm::Rank1 : n == LOWBIT_NORMALIZATION_FACTORED ? Norm::Factored : Norm::Block;
}

// Encodes fp32 values that came from a stored moment (a materialised
// checkpoint, another format, read_moment) into `mv` so that decoding and
// re-encoding is a fixed point (reencode.cpp). Like a step's encoder except
// for the scale of a quantized block whose largest magnitude is a negative x:
// the smallest scale with which the map's most negative value decodes to x
// or beyond. A step's scale |x| decodes x as vmin * |x| (the signed maps have
// no -1: 8-bit x0.99297, 4-bit x0.8875), so each materialise / load cycle
// shrank such blocks by that factor. Rank-1 vector entries are fitted to
// their slices the same way; rank-1 and factored moments are then cycled
// (decode, encode) until a cycle leaves them unchanged. `via_bf16`: the values
// passed through bf16 (a bf16 checkpoint), and so does each such cycle.
void reencode_moment(const MomentView& mv, const Shape& shape, int64_t numel, const float* values,
                     bool via_bf16 = false);

}  // namespace lowbit
