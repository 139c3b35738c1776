// The hand-written moment codecs behind one switch: the form of the running
// level (simd_codec(), core/cpu_features.hpp) for a whole tile or a rank-1
// run, or false / 0 where it has none (the caller takes the portable rule).
// Every form gives the portable rule's bits.
#pragma once
#include <cstdint>

#include "codec_avx2.hpp"
#include "codec_avx512.hpp"
#if defined(__aarch64__)
#include "codec_neon.hpp"
#define LOWBIT_NEON_CODEC(call) return call
#else
#define LOWBIT_NEON_CODEC(call) break
#endif
#include "cpu_features.hpp"

namespace lowbit {

inline bool simd_decode_tile(SimdCodec c, const MomentView& mv, int64_t base, float* out) {
  switch (c) {
    case SimdCodec::Avx512: return avx512_decode_tile(mv, base, out);
    case SimdCodec::Avx2: return avx2_decode_tile(mv, base, out);
    case SimdCodec::Neon: LOWBIT_NEON_CODEC(neon_decode_tile(mv, base, out));
    case SimdCodec::None: break;
  }
  return false;
}

inline bool simd_encode_tile(SimdCodec c, const MomentView& mv, int64_t base, const float* in) {
  switch (c) {
    case SimdCodec::Avx512: return avx512_encode_tile(mv, base, in);
    case SimdCodec::Avx2: return avx2_encode_tile(mv, base, in);
    case SimdCodec::Neon: LOWBIT_NEON_CODEC(neon_encode_tile(mv, base, in));
    case SimdCodec::None: break;
  }
  return false;
}

inline bool simd_encode_tile_sr(SimdCodec c, const MomentView& mv, int64_t base, const float* in, uint64_t key) {
  switch (c) {
    case SimdCodec::Avx512: return avx512_encode_tile_sr(mv, base, in, key);
    case SimdCodec::Avx2: return avx2_encode_tile_sr(mv, base, in, key);
    case SimdCodec::Neon: LOWBIT_NEON_CODEC(neon_encode_tile_sr(mv, base, in, key));
    case SimdCodec::None: break;
  }
  return false;
}

inline int simd_decode_rank1(SimdCodec c, const MomentView& mv, int64_t base, int n, const float* scale, float* out) {
  switch (c) {
    case SimdCodec::Avx512: return avx512_decode_rank1(mv, base, n, scale, out);
    case SimdCodec::Avx2: return avx2_decode_rank1(mv, base, n, scale, out);
    case SimdCodec::Neon: LOWBIT_NEON_CODEC(neon_decode_rank1(mv, base, n, scale, out));
    case SimdCodec::None: break;
  }
  return 0;
}

inline int simd_encode_rank1(SimdCodec c, const MomentView& mv, int64_t base, int n, const float* scale,
                             const float* in) {
  switch (c) {
    case SimdCodec::Avx512: return avx512_encode_rank1(mv, base, n, scale, in);
    case SimdCodec::Avx2: return avx2_encode_rank1(mv, base, n, scale, in);
    case SimdCodec::Neon: LOWBIT_NEON_CODEC(neon_encode_rank1(mv, base, n, scale, in));
    case SimdCodec::None: break;
  }
  return 0;
}

}  // namespace lowbit
