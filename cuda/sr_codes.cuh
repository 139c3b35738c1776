// The stochastic 4-bit codes (4BIT_SR) of the fast loops' whole tiles, with
// the bits of the CPU engine (core/codec.cpp encode_codes4_sr): for each
// element quant.hpp's stochastic_code16 against its block's decoded values,
// with rounding.hpp's state_bits of (key, element index).
//
// stochastic_code16 scans all 16 decoded values per element. Here the 16
// lanes of a block first write the block's table to shared memory, entry k =
// {d_k, (d_{k+1} - d_k) 2^-24} with d_k = map.values[k] * absmax as
// decoded_values16 computes it (and +Inf for the gap after d_15). Each
// element then finds pos = max({0} u {k : d_k <= x}) by a 4-step binary
// search (the d_k are sorted: the map's values are, and rounding the products
// by a finite absmax >= 0 keeps their order) and rounds up to pos + 1 when
// (bits >> 8) * gap_pos < x - d_pos. That is stochastic_code16's result:
//   - for 0 < count < 16 (count = #{d_k <= x}) it takes a = d_{count-1} =
//     d_pos and compares u (b - a) = (bits >> 8) 2^-24 (b - a) with x - a,
//     the same product when (b - a) 2^-24 is exact (below);
//   - for count = 0 (x < d_0 = d_pos) and count = 16 (gap +Inf) the compare
//     is false and the code is pos, as there.
// (b - a) 2^-24 is exact when b - a >= 2^-102 (or 0, or Inf): with absmax >=
// 2^-80 every gap of the 4-bit maps is above 2^-89 (their values are at
// least 2^-8 apart: tests/cuda/test_sr_codes_emulated.cpp checks), and with
// absmax 0 every gap is 0. Other blocks (a tinier absmax, NaN or Inf) take
// stochastic_code16 itself.
//
// The search runs on the table's shared-memory byte address: a block's table
// is 128 bytes, 128-byte aligned, so a step is a load, a compare and a
// predicated OR of the step's offset into the address, and the address's low
// 7 bits are 8 x the code. The host emulation runs the same steps on a byte
// offset (only the load and compare primitives differ).
#pragma once
#include <cstdint>
#include <cstring>

#include "core/quant.hpp"
#include "core/rounding.hpp"
#include "cuda/tables.hpp"

namespace lowbit {
namespace cuda {

// One entry of a block's table: d_k and (d_{k+1} - d_k) 2^-24.
struct alignas(8) SrEntry {
  float d, gap;
};

// A block's table: 128 bytes, 128-byte aligned.
struct alignas(128) SrTable {
  SrEntry e[16];
};
static_assert(sizeof(SrTable) == 128, "a block's table is 128 bytes");

constexpr float kSrMinAbsmax = 0x1p-80f;  // the smallest nonzero absmax of the search (above)

// The table address's primitives: on the GPU a 32-bit shared-memory address
// (predicated ORs and adds: a compare and one instruction per step), on the
// host emulation a byte offset into `tables`.
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ uint32_t sr_address(const SrEntry* tables, int byte_offset) {
  return uint32_t(__cvta_generic_to_shared(tables)) + uint32_t(byte_offset);
}
template <int kOff>
__device__ __forceinline__ float sr_load_d(const SrEntry*, uint32_t a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1+%2];" : "=f"(v) : "r"(a), "n"(kOff));
  return v;
}
__device__ __forceinline__ SrEntry sr_load(const SrEntry*, uint32_t a) {
  SrEntry e;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(e.d), "=f"(e.gap) : "r"(a));
  return e;
}
// a | kBit where d <= x (false for NaN), a + kAdd where l < r.
template <uint32_t kBit>
__device__ __forceinline__ uint32_t or_if_le(uint32_t a, float d, float x) {
  asm("{\n\t.reg .pred p;\n\tsetp.le.f32 p, %1, %2;\n\t@p or.b32 %0, %0, %3;\n\t}"
      : "+r"(a) : "f"(d), "f"(x), "n"(kBit));
  return a;
}
template <uint32_t kAdd>
__device__ __forceinline__ uint32_t add_if_lt(uint32_t a, float l, float r) {
  asm("{\n\t.reg .pred p;\n\tsetp.lt.f32 p, %1, %2;\n\t@p add.u32 %0, %0, %3;\n\t}"
      : "+r"(a) : "f"(l), "f"(r), "n"(kAdd));
  return a;
}
#else
inline uint32_t sr_address(const SrEntry*, int byte_offset) { return uint32_t(byte_offset); }
template <int kOff>
inline float sr_load_d(const SrEntry* tables, uint32_t a) {
  float v;
  std::memcpy(&v, reinterpret_cast<const char*>(tables) + a + kOff, 4);
  return v;
}
inline SrEntry sr_load(const SrEntry* tables, uint32_t a) {
  SrEntry e;
  std::memcpy(&e, reinterpret_cast<const char*>(tables) + a, sizeof e);
  return e;
}
template <uint32_t kBit>
inline uint32_t or_if_le(uint32_t a, float d, float x) { return d <= x ? a | kBit : a; }
template <uint32_t kAdd>
inline uint32_t add_if_lt(uint32_t a, float l, float r) { return l < r ? a + kAdd : a; }
#endif

// code << 4j of the code whose 8 x code sits in bits 3..6 of a.
template <int J>
__device__ __forceinline__ uint32_t sr_nibble(uint32_t a) {
  return (J == 0 ? a >> 3 : a << (4 * J - 3)) & (0xFu << (4 * J));
}

// The codes of one lane's 8 elements x[j] (indices e0 .. e0 + 7, e0 a
// multiple of 8) of a first moment, all in the 4-bit block of this absmax
// (lanes 0-15 and 16-31 of the warp: one block each), rounded stochastically
// with the bits of state_rounding_key `key`, as nibbles (element j in bits
// 4j .. 4j + 3). No floor_positive: not a second moment's codes (but for a
// map without a zero, where it changes nothing). Every lane of the warp must
// call it (two warp barriers).
__device__ __forceinline__ uint32_t sr_codes(const QMap& sm, const float (&x)[8], float absmax, uint64_t key,
                                             int64_t e0, int lane, int warp) {
  __shared__ SrTable table_of[kWarps * 2];
  const SrEntry* const tables = table_of[0].e;
  const int block = warp * 2 + (lane >> 4), k = lane & 15;
  const float d = sm.values[k] * absmax;
  const float next = k < 15 ? sm.values[k + 1] * absmax : bits_float(0x7F800000u);
  __syncwarp();  // every lane is done with the previous tile's table
  table_of[block].e[k] = SrEntry{d, (next - d) * 0x1p-24f};
  __syncwarp();
  uint32_t bits[8];
  state_bits_run(key, uint64_t(e0), bits);
  uint32_t packed = 0;
  if ((absmax >= kSrMinAbsmax && absmax <= 3.40282347e38f) || absmax == 0.f) {
    const uint32_t base = sr_address(tables, block * 128);
    const float d8 = sr_load_d<64>(tables, base);
    uint32_t a[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      a[j] = or_if_le<64>(base, d8, x[j]);
      a[j] = or_if_le<32>(a[j], sr_load_d<32>(tables, a[j]), x[j]);
      a[j] = or_if_le<16>(a[j], sr_load_d<16>(tables, a[j]), x[j]);
      a[j] = or_if_le<8>(a[j], sr_load_d<8>(tables, a[j]), x[j]);
      const SrEntry e = sr_load(tables, a[j]);  // pos = (a & 127) / 8
      a[j] = add_if_lt<8>(a[j], float(bits[j] >> 8) * e.gap, x[j] - e.d);  // round up
    }
    packed = sr_nibble<0>(a[0]) | sr_nibble<1>(a[1]) | sr_nibble<2>(a[2]) | sr_nibble<3>(a[3]) |
             sr_nibble<4>(a[4]) | sr_nibble<5>(a[5]) | sr_nibble<6>(a[6]) | sr_nibble<7>(a[7]);
  } else {
    float decoded[16];
    decoded_values16(sm, absmax, decoded);
#pragma unroll
    for (int j = 0; j < 8; ++j) packed |= uint32_t(stochastic_code16(decoded, x[j], bits[j])) << (4 * j);
  }
  return packed;
}

}  // namespace cuda
}  // namespace lowbit
