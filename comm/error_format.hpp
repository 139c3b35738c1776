// The compact formats of the worker and server errors
// (lowbit_comm_config_t.error_format; docs/COMMUNICATOR.md, section 5b): the
// bytes a buffer of `count` errors takes and how they are laid out.
//   BF16: count uint16, the high half of the fp32 error rounded to nearest even.
//   INT8: blocks of kErrorBlock elements; ceil(count / kErrorBlock) fp32
//         absmax scales first, then count int8 codes k in [-127, 127]:
//         value = (float(k) * absmax) / 127 in fp32.
#pragma once
#include <cstdint>


namespace lowbit {
namespace onebit {

// lowbit_comm_error_format_t's values.
enum : int32_t { kErrorFp32 = 0, kErrorBf16 = 1, kErrorInt8 = 2 };

constexpr int64_t kErrorBlock = 256;

inline int64_t error_blocks(int64_t count) { return (count + kErrorBlock - 1) / kErrorBlock; }

// Bytes of `count` errors in `format` (FP32: 4 per element).
inline int64_t error_bytes(int32_t format, int64_t count) {
  switch (format) {
    case kErrorBf16: return 2 * count;
    case kErrorInt8: return 4 * error_blocks(count) + count;
    default: return 4 * count;
  }
}

}  // namespace onebit
}  // namespace lowbit
