#include "runtime/cpu/quantize_nhwc.h"

#include <immintrin.h>

#include <atomic>
#include <cmath>

#include "runtime/cpu/transpose16.h"

namespace mpq::rt::cpu {

namespace {

// One value: the float product, clamped to [-128, 127] (max first: a NaN takes the lower bound), then
// rounded to nearest even (the clamp bounds are integers, so clamping first changes nothing else).
inline int8_t quantize_value(float x, float inv) {
  float v = x * inv;
  v = v > -128.0f ? v : -128.0f;
  v = v < 127.0f ? v : 127.0f;
  return static_cast<int8_t>(std::nearbyint(v));
}

std::atomic<bool> g_scalar_only{false};

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized reports
// inside the intrinsic headers (a known false positive, as in calib/histogram.cpp); silenced for the
// AVX-512 functions only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// 16 products clamped and converted as quantize_value does: vmaxps returns its second operand where
// either is NaN, so a NaN gives -128; vcvtps2dq rounds to nearest even (the default MXCSR mode); the
// values are already within int8, so vpmovsdb's saturation changes nothing.
__attribute__((target("avx512f"))) inline __m128i quantize16(__m512 x, __m512 inv, __m512 lo, __m512 hi) {
  __m512 v = _mm512_max_ps(_mm512_mul_ps(x, inv), lo);
  v = _mm512_min_ps(v, hi);
  return _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v));
}

// NHWC in and out: one run of n * h * w * c values.
__attribute__((target("avx512f"), noinline)) void quantize_run_avx512(const float* x, int64_t count, float inv_s,
                                                                      int8_t* q) {
  const __m512 inv = _mm512_set1_ps(inv_s), lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(127.0f);
  int64_t i = 0;
  for (; i + 16 <= count; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), quantize16(_mm512_loadu_ps(x + i), inv, lo, hi));
  for (; i < count; ++i) q[i] = quantize_value(x[i], inv_s);
}

// NCHW in, NHWC out, in tiles of 16 channels x 16 pixels: the 16 channel rows of a tile are loaded,
// transposed in registers (transpose16.h) into 16 pixels of 16 channels each, quantized and stored as
// 16 bytes per pixel. The channels and pixels that do not fill a tile take the scalar loop.
__attribute__((target("avx512f"), noinline)) void transpose_quantize_avx512(const float* x, int64_t c, int64_t hw,
                                                                            float inv_s, int8_t* q) {
  const __m512 inv = _mm512_set1_ps(inv_s), lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(127.0f);
  const int64_t c16 = c - c % 16, p16 = hw - hw % 16;
  for (int64_t c0 = 0; c0 < c16; c0 += 16) {
    for (int64_t p0 = 0; p0 < p16; p0 += 16) {
      __m512 r[16];
      for (int k = 0; k < 16; ++k) r[k] = _mm512_loadu_ps(x + (c0 + k) * hw + p0);
      transpose16x16(r);
      // r[k] now holds pixel p0 + k, channels c0 .. c0 + 15.
      for (int k = 0; k < 16; ++k)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + (p0 + k) * c + c0), quantize16(r[k], inv, lo, hi));
    }
    for (int64_t p = p16; p < hw; ++p)
      for (int64_t k = c0; k < c0 + 16; ++k) q[p * c + k] = quantize_value(x[k * hw + p], inv_s);
  }
  for (int64_t k = c16; k < c; ++k)
    for (int64_t p = 0; p < hw; ++p) q[p * c + k] = quantize_value(x[k * hw + p], inv_s);
}

#pragma GCC diagnostic pop

}  // namespace

void quantize_to_nhwc_s8_ref(const float* x, bool channels_last, int64_t n, int64_t c, int64_t h, int64_t w, float inv,
                             int8_t* q) {
  const int64_t hw = h * w;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < hw; ++p)
      for (int64_t k = 0; k < c; ++k) {
        const float v = channels_last ? x[(i * hw + p) * c + k] : x[(i * c + k) * hw + p];
        q[(i * hw + p) * c + k] = quantize_value(v, inv);
      }
}

bool quantize_nhwc_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has && !g_scalar_only.load(std::memory_order_relaxed);
}

ScopedQuantizeNhwcScalar::ScopedQuantizeNhwcScalar() : previous_(g_scalar_only.exchange(true)) {}
ScopedQuantizeNhwcScalar::~ScopedQuantizeNhwcScalar() { g_scalar_only.store(previous_); }

void quantize_to_nhwc_s8(const float* x, bool channels_last, int64_t n, int64_t c, int64_t h, int64_t w, float inv,
                         int8_t* q) {
  if (!quantize_nhwc_avx512()) return quantize_to_nhwc_s8_ref(x, channels_last, n, c, h, w, inv, q);
  const int64_t hw = h * w;
  if (channels_last) return quantize_run_avx512(x, n * hw * c, inv, q);
  for (int64_t i = 0; i < n; ++i) transpose_quantize_avx512(x + i * c * hw, c, hw, inv, q + i * c * hw);
}

}  // namespace mpq::rt::cpu
