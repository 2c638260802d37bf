#pragma once
// A 16 x 16 tile of float32 transposed in AVX-512 registers (four rounds of shuffles): r[k] holds
// row k on entry (16 consecutive values) and column k on return. For the NCHW <-> NHWC layout
// conversions around int8 convolutions (quantize_nhwc.cpp, channel_blocks.cpp), which are pure data
// movement: the same bits as any scalar loop. Include only from code built for AVX-512 (the functions
// that call it carry target("avx512f")).
#include <immintrin.h>

namespace mpq::rt::cpu {

__attribute__((target("avx512f"), always_inline)) inline void transpose16x16(__m512 (&r)[16]) {
  __m512 t[16];
  // Round 1: interleave pairs of rows (32-bit elements).
  for (int k = 0; k < 16; k += 2) {
    t[k] = _mm512_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm512_unpackhi_ps(r[k], r[k + 1]);
  }
  // Round 2: interleave pairs of pairs (64-bit elements).
  for (int k = 0; k < 16; k += 4) {
    r[k] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[k]), _mm512_castps_pd(t[k + 2])));
    r[k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[k]), _mm512_castps_pd(t[k + 2])));
    r[k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[k + 1]), _mm512_castps_pd(t[k + 3])));
    r[k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[k + 1]), _mm512_castps_pd(t[k + 3])));
  }
  // Rounds 3 and 4: 128-bit lanes across groups of four rows, then of eight.
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm512_shuffle_f32x4(r[k], r[k + 4], 0x88);
    t[k + 4] = _mm512_shuffle_f32x4(r[k], r[k + 4], 0xdd);
    t[k + 8] = _mm512_shuffle_f32x4(r[k + 8], r[k + 12], 0x88);
    t[k + 12] = _mm512_shuffle_f32x4(r[k + 8], r[k + 12], 0xdd);
  }
  for (int k = 0; k < 8; ++k) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
    r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
  }
}

}  // namespace mpq::rt::cpu
