#include "state.hpp"

#include "error.hpp"

namespace lowbit {

bool is_quantized(lowbit_state_format_t format) {
  format = storage_format(format);
  return format == LOWBIT_STATE_8BIT || format == LOWBIT_STATE_4BIT || format == LOWBIT_STATE_FP8;
}

int64_t block_size(lowbit_state_format_t format) {
  switch (storage_format(format)) {
    case LOWBIT_STATE_8BIT:
    case LOWBIT_STATE_FP8: return kBlock8;
    case LOWBIT_STATE_4BIT: return kBlock4;
    default: return 1;
  }
}

namespace {

// Sizes are computed in checked int64 arithmetic: a numel whose state would
// take more than INT64_MAX bytes is an error, never a wrapped size.
[[noreturn]] void too_large(lowbit_state_format_t format, int64_t numel) {
  fail(LOWBIT_ERROR_INVALID_ARGUMENT, "param.numel = ", numel, " is too large: its ", format_name(format),
       " state would take more than INT64_MAX bytes");
}

void check_numel(int64_t numel) {
  LOWBIT_REQUIRE(numel >= 0, LOWBIT_ERROR_INVALID_ARGUMENT, "param.numel = ", numel, " must be >= 0");
}

}  // namespace

int64_t num_blocks(lowbit_state_format_t format, int64_t numel) {
  check_numel(numel);
  if (!is_quantized(format)) return 0;
  const int64_t b = block_size(format);
  return numel / b + (numel % b != 0);  // ceil, without numel + b - 1
}

int64_t moment_data_bytes(lowbit_state_format_t format, int64_t numel) {
  check_numel(numel);
  int64_t bytes = 0;
  switch (storage_format(format)) {
    case LOWBIT_STATE_FP32:
      if (__builtin_mul_overflow(numel, int64_t(4), &bytes)) too_large(format, numel);
      return bytes;
    case LOWBIT_STATE_BF16:
      if (__builtin_mul_overflow(numel, int64_t(2), &bytes)) too_large(format, numel);
      return bytes;
    case LOWBIT_STATE_8BIT:
    case LOWBIT_STATE_FP8: return numel;
    case LOWBIT_STATE_4BIT: return numel / 2 + numel % 2;  // ceil, without numel + 1
    default: return 0;
  }
}

int64_t moment_scale_bytes(lowbit_state_format_t format, int64_t numel) {
  return 4 * num_blocks(format, numel);  // at most 4 * ceil(INT64_MAX / 128)
}

int64_t checked_add_bytes(int64_t a, int64_t b, int64_t numel) {
  int64_t sum = 0;
  LOWBIT_REQUIRE(!__builtin_add_overflow(a, b, &sum), LOWBIT_ERROR_INVALID_ARGUMENT, "param.numel = ", numel,
                 " is too large: its state would take more than INT64_MAX bytes");
  return sum;
}

const char* format_name(lowbit_state_format_t format) {
  switch (format) {
    case LOWBIT_STATE_DEFAULT: return "default";
    case LOWBIT_STATE_FP32: return "fp32";
    case LOWBIT_STATE_BF16: return "bf16";
    case LOWBIT_STATE_8BIT: return "8bit";
    case LOWBIT_STATE_4BIT: return "4bit";
    case LOWBIT_STATE_FP8: return "fp8";
    case LOWBIT_STATE_4BIT_SR: return "4bit-sr";
    case LOWBIT_STATE_4BIT_DYN: return "4bit-dyn";
    default: return "unknown";
  }
}

const char* dtype_name(lowbit_dtype_t dtype) {
  switch (dtype) {
    case LOWBIT_DTYPE_FLOAT32: return "float32";
    case LOWBIT_DTYPE_BFLOAT16: return "bfloat16";
    case LOWBIT_DTYPE_FLOAT16: return "float16";
    default: return "unknown";
  }
}

int64_t dtype_bytes(lowbit_dtype_t dtype) { return dtype == LOWBIT_DTYPE_FLOAT32 ? 4 : 2; }

const QMap* moment_map(lowbit_state_format_t format, lowbit_moment_kind_t kind) {
  const bool signed_map = kind != LOWBIT_MOMENT_UNSIGNED;
  if (format == LOWBIT_STATE_4BIT_DYN) return &qmap(signed_map ? MapId::SignedDynamic4 : MapId::UnsignedDynamic4);
  format = storage_format(format);
  if (format == LOWBIT_STATE_8BIT) return &qmap(signed_map ? MapId::SignedDynamic8 : MapId::UnsignedDynamic8);
  if (format == LOWBIT_STATE_4BIT) return &qmap(signed_map ? MapId::SignedDynamic4 : MapId::UnsignedLinear4);
  return nullptr;
}

lowbit_moment_kind_t kind_or_index(lowbit_moment_kind_t kind, int moment) {
  return kind != 0 ? kind : moment == 0 ? LOWBIT_MOMENT_SIGNED : LOWBIT_MOMENT_UNSIGNED;
}

int64_t moment_data_bytes(lowbit_state_format_t format, Norm norm, const Shape& shape, int64_t numel) {
  if (norm == Norm::Factored) return 4 * factored_floats(shape, numel);
  return moment_data_bytes(format, numel);
}

int64_t moment_scale_bytes(lowbit_state_format_t format, Norm norm, const Shape& shape, int64_t numel) {
  if (norm == Norm::Factored) return 0;
  if (norm == Norm::Rank1) return 4 * 2 * shape_dim_sum(shape);
  return moment_scale_bytes(format, numel);
}

const char* norm_name(Norm norm) {
  switch (norm) {
    case Norm::Block: return "block";
    case Norm::Rank1: return "rank1";
    case Norm::Factored: return "factored";
  }
  return "unknown";
}

MomentView moment_view(lowbit_state_format_t format, lowbit_moment_kind_t kind, void* data, float* scales) {
  MomentView v;
  v.format = storage_format(format);
  v.stochastic = format == LOWBIT_STATE_4BIT_SR;
  v.data = data;
  v.scales = scales;
  v.map = moment_map(format, kind);
  v.second = kind == LOWBIT_MOMENT_UNSIGNED;
  return v;
}

}  // namespace lowbit
