// Packing of a 4-bit block's codes for the AVX-512 encoders
// (codec_avx512.cpp, codec_avx512_sr.cpp), compiled for AVX-512 whatever the
// file's target: callers run them only where avx512_codec_supported().
#pragma once
#include <immintrin.h>

#include <cstdint>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

namespace lowbit {
namespace avx512 {

// 8 x 16 dword codes (each < 16: one 4-bit block; a negative one is stored
// as 0) packed two per byte, even element in the low nibble, into out[0, 64).
// Two rounds of in-lane unsigned saturating packs (codes in [0, 15] pass
// unchanged) give bytes whose words hold
// consecutive pairs; each word's pair becomes one byte, a third pack gathers
// those, and one word permute puts them in order (kPack4Order).
struct Pack4Order {
  uint16_t word[32];
  constexpr Pack4Order() : word() {
    // After the packs, word 8 L + 4 h + m of the result holds the pairs of
    // elements 64 h + 16 m + 4 L + {0..3}, which belong at word 16 h + 4 m + L.
    for (int h = 0; h < 2; ++h)
      for (int lane = 0; lane < 4; ++lane)
        for (int m = 0; m < 4; ++m) word[16 * h + 4 * m + lane] = uint16_t(8 * lane + 4 * h + m);
  }
};
constexpr Pack4Order kPack4Order;

inline void store_packed4_block(const __m512i (&c)[8], uint8_t* out) {
  __m512i pairs[2];
  for (int h = 0; h < 2; ++h) {
    const __m512i bytes = _mm512_packus_epi16(_mm512_packus_epi32(c[4 * h], c[4 * h + 1]),
                                              _mm512_packus_epi32(c[4 * h + 2], c[4 * h + 3]));
    // (w | w >> 4) & 0xFF: the low nibble from the even element, the high from the odd one
    pairs[h] = _mm512_ternarylogic_epi32(bytes, _mm512_srli_epi16(bytes, 4), _mm512_set1_epi16(0xFF), 0xA8);
  }
  const __m512i order = _mm512_loadu_si512(kPack4Order.word);
  _mm512_storeu_si512(out, _mm512_permutexvar_epi16(order, _mm512_packus_epi16(pairs[0], pairs[1])));
}

}  // namespace avx512
}  // namespace lowbit

#pragma GCC pop_options
