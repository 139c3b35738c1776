// Byte-level writing and checked reading of checkpoints (checkpoint.cpp; a
// layer above core writes its own section with them). Little-endian hosts.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "error.hpp"

namespace lowbit {

class CheckpointWriter {
 public:
  template <class T>
  void put(T v) {
    append(&v, sizeof(T));
  }
  void append(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  }
  std::vector<uint8_t> out;
};

// Every read is checked against the end: a truncated or corrupt file is
// LOWBIT_ERROR_CORRUPT_DATA naming the field, never a read past the buffer.
class CheckpointReader {
 public:
  CheckpointReader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  template <class T>
  T get(const char* field) {
    T v;
    std::memcpy(&v, take(sizeof(T), field), sizeof(T));
    return v;
  }
  const uint8_t* take(uint64_t n, const char* field) {
    if (n > n_ - pos_) fail(LOWBIT_ERROR_CORRUPT_DATA, "checkpoint is truncated or corrupt: ", field, " needs ", n,
                            " bytes at offset ", pos_, " but only ", n_ - pos_, " remain");
    const uint8_t* r = p_ + pos_;
    pos_ += size_t(n);
    return r;
  }
  size_t pos() const { return pos_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

}  // namespace lowbit
