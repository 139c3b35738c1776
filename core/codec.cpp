// The CPU codec's entry points for callers outside the per-level loops
// (checkpoints, read/write_moment, tests): each runs its body
// (codec_tiles.hpp) compiled for the running level.
#include "codec.hpp"

#include "codec_tiles.hpp"
#include "isa.hpp"

namespace lowbit {
namespace {

// Each tile function once per level (core/isa.hpp) over its body in codec_tiles.hpp.
LOWBIT_PER_ISA(void, decode_tile, (const MomentView& mv, int64_t base, int n, float* out),
               tiles::decode_moment_tile(mv, base, n, out))
LOWBIT_PER_ISA(void, encode_tile, (const MomentView& mv, int64_t base, int n, const float* in),
               tiles::encode_moment_tile(mv, base, n, in))
LOWBIT_PER_ISA(void, encode_tile_sr, (const MomentView& mv, int64_t base, int n, const float* in, uint64_t key),
               tiles::encode_moment_tile_stochastic(mv, base, n, in, key))
LOWBIT_PER_ISA(void, load_tensor, (const void* data, lowbit_dtype_t dtype, int64_t base, int n, float* out),
               tiles::load_tensor_tile(data, dtype, base, n, out))
LOWBIT_PER_ISA(void, load_param, (const ParamView& pv, int64_t base, int n, float* out),
               tiles::load_param_tile(pv, base, n, out))
LOWBIT_PER_ISA(void, store_param, (const ParamView& pv, uint64_t key, int64_t base, int n, const float* in),
               tiles::store_param_tile(pv, key, base, n, in))

inline void decode_all(const MomentView& mv, int64_t numel, float* out) {
  for (int64_t base = 0; base < numel; base += kTile)
    tiles::decode_moment_tile(mv, base, int(numel - base < kTile ? numel - base : kTile), out + base);
}
inline void encode_all(const MomentView& mv, int64_t numel, const float* in) {
  for (int64_t base = 0; base < numel; base += kTile)
    tiles::encode_moment_tile(mv, base, int(numel - base < kTile ? numel - base : kTile), in + base);
}
LOWBIT_PER_ISA(void, decode_whole, (const MomentView& mv, int64_t numel, float* out), decode_all(mv, numel, out))
LOWBIT_PER_ISA(void, encode_whole, (const MomentView& mv, int64_t numel, const float* in), encode_all(mv, numel, in))

}  // namespace

bool simd_codec_active() { return simd_codec() != SimdCodec::None; }

void decode_moment_tile(const MomentView& mv, int64_t base, int n, float* out) {
  LOWBIT_ISA_PICK(decode_tile)(mv, base, n, out);
}
void encode_moment_tile(const MomentView& mv, int64_t base, int n, const float* in) {
  LOWBIT_ISA_PICK(encode_tile)(mv, base, n, in);
}
void encode_moment_tile_stochastic(const MomentView& mv, int64_t base, int n, const float* in, uint64_t key) {
  LOWBIT_ISA_PICK(encode_tile_sr)(mv, base, n, in, key);
}
void load_tensor_tile(const void* data, lowbit_dtype_t dtype, int64_t base, int n, float* out) {
  LOWBIT_ISA_PICK(load_tensor)(data, dtype, base, n, out);
}
void load_param_tile(const ParamView& pv, int64_t base, int n, float* out) {
  LOWBIT_ISA_PICK(load_param)(pv, base, n, out);
}
void store_param_tile(const ParamView& pv, uint64_t key, int64_t base, int n, const float* in) {
  LOWBIT_ISA_PICK(store_param)(pv, key, base, n, in);
}

void decode_moment(const MomentView& mv, int64_t numel, float* out) { LOWBIT_ISA_PICK(decode_whole)(mv, numel, out); }
void encode_moment(const MomentView& mv, int64_t numel, const float* in) { LOWBIT_ISA_PICK(encode_whole)(mv, numel, in); }

}  // namespace lowbit

