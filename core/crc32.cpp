#include "crc32.hpp"

namespace lowbit {
namespace {
struct Table {
  uint32_t v[256];
  Table() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      v[i] = c;
    }
  }
};
}  // namespace

uint32_t crc32(const void* data, size_t size, uint32_t crc) {
  static const Table table;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table.v[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}
}  // namespace lowbit
