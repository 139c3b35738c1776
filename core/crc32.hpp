#pragma once
#include <cstddef>
#include <cstdint>

namespace lowbit {
// CRC-32 (IEEE 802.3, as zlib's crc32); `crc` chains calls.
uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);
}  // namespace lowbit
