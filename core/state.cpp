#include "state.hpp"

namespace lowbit {

bool is_quantized(lowbit_state_format_t format) {
  return format == LOWBIT_STATE_8BIT || format == LOWBIT_STATE_4BIT || format == LOWBIT_STATE_FP8;
}

int64_t block_size(lowbit_state_format_t format) {
  switch (format) {
    case LOWBIT_STATE_8BIT:
    case LOWBIT_STATE_FP8: return kBlock8;
    case LOWBIT_STATE_4BIT: return kBlock4;
    default: return 1;
  }
}

int64_t num_blocks(lowbit_state_format_t format, int64_t numel) {
  if (!is_quantized(format)) return 0;
  int64_t b = block_size(format);
  return (numel + b - 1) / b;
}

int64_t moment_data_bytes(lowbit_state_format_t format, int64_t numel) {
  switch (format) {
    case LOWBIT_STATE_FP32: return 4 * numel;
    case LOWBIT_STATE_BF16: return 2 * numel;
    case LOWBIT_STATE_8BIT:
    case LOWBIT_STATE_FP8: return numel;
    case LOWBIT_STATE_4BIT: return (numel + 1) / 2;
    default: return 0;
  }
}

int64_t moment_scale_bytes(lowbit_state_format_t format, int64_t numel) {
  return 4 * num_blocks(format, numel);
}

const char* format_name(lowbit_state_format_t format) {
  switch (format) {
    case LOWBIT_STATE_DEFAULT: return "default";
    case LOWBIT_STATE_FP32: return "fp32";
    case LOWBIT_STATE_BF16: return "bf16";
    case LOWBIT_STATE_8BIT: return "8bit";
    case LOWBIT_STATE_4BIT: return "4bit";
    case LOWBIT_STATE_FP8: return "fp8";
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

const QMap* moment_map(lowbit_state_format_t format, int moment) {
  if (format == LOWBIT_STATE_8BIT) return &qmap(moment == 0 ? MapId::SignedDynamic8 : MapId::UnsignedDynamic8);
  if (format == LOWBIT_STATE_4BIT) return &qmap(moment == 0 ? MapId::SignedDynamic4 : MapId::UnsignedLinear4);
  return nullptr;
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

MomentView moment_view(lowbit_state_format_t format, int moment, void* data, float* scales) {
  MomentView v;
  v.format = format;
  v.data = data;
  v.scales = scales;
  v.map = moment_map(format, moment);
  v.second = moment == 1;
  return v;
}

}  // namespace lowbit
