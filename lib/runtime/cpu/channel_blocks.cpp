#include "runtime/cpu/channel_blocks.h"

#include <immintrin.h>

#include <algorithm>

#include "runtime/cpu/transpose16.h"
#include "runtime/thread_pool.h"

namespace mpq::rt::cpu {

bool valid_channel_block(int64_t block) { return block == 0 || block == 8 || block == 16 || block == kChannelsLast; }

// One task per (image, channel block): it reads b planes and writes one interleaved block (or the
// reverse), every element exactly once, so the result is independent of the thread count.
// Channels-last splits over pixels instead.
void to_channel_blocks(ThreadPool& pool, const float* src, float* dst, int64_t n, int64_t c, int64_t spatial,
                       int64_t block) {
  if (block == kChannelsLast) {
    // One block of all C channels: split over pixels, so that one image still uses every thread.
    if (c <= 0) return;
    pool.parallel_for(n * spatial, std::max<int64_t>(1, 4096 / c), [&](int64_t lo, int64_t hi) {
      for (int64_t q = lo; q < hi; ++q) {
        const float* s = src + (q / spatial) * c * spatial + q % spatial;
        float* d = dst + q * c;
        for (int64_t k = 0; k < c; ++k) d[k] = s[k * spatial];
      }
    });
    return;
  }
  const int64_t blocks = c / block;
  pool.parallel_for(n * blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const float* s = src + t * block * spatial;  // channels t*b .. t*b+b-1 of image t / blocks
      float* d = dst + t * block * spatial;
      for (int64_t k = 0; k < block; ++k)
        for (int64_t p = 0; p < spatial; ++p) d[p * block + k] = s[k * spatial + p];
    }
  });
}

void from_channel_blocks(ThreadPool& pool, const float* src, float* dst, int64_t n, int64_t c, int64_t spatial,
                         int64_t block) {
  if (block == kChannelsLast) {
    if (c <= 0) return;
    pool.parallel_for(n * spatial, std::max<int64_t>(1, 4096 / c), [&](int64_t lo, int64_t hi) {
      for (int64_t q = lo; q < hi; ++q) {
        const float* s = src + q * c;
        float* d = dst + (q / spatial) * c * spatial + q % spatial;
        for (int64_t k = 0; k < c; ++k) d[k * spatial] = s[k];
      }
    });
    return;
  }
  const int64_t blocks = c / block;
  pool.parallel_for(n * blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const float* s = src + t * block * spatial;
      float* d = dst + t * block * spatial;
      for (int64_t k = 0; k < block; ++k)
        for (int64_t p = 0; p < spatial; ++p) d[k * spatial + p] = s[p * block + k];
    }
  });
}

namespace {

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized reports
// inside the intrinsic headers (a known false positive, as in calib/histogram.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Tiles of 16 pixels x 16 channels: 16 pixel rows in, 16 channel rows out.
__attribute__((target("avx512f"), noinline)) void channels_last_to_plain_avx512(const float* src, float* dst, int64_t c,
                                                                                int64_t spatial) {
  const int64_t c16 = c - c % 16, p16 = spatial - spatial % 16;
  for (int64_t c0 = 0; c0 < c16; c0 += 16) {
    for (int64_t p0 = 0; p0 < p16; p0 += 16) {
      __m512 r[16];
      for (int k = 0; k < 16; ++k) r[k] = _mm512_loadu_ps(src + (p0 + k) * c + c0);
      transpose16x16(r);
      for (int k = 0; k < 16; ++k) _mm512_storeu_ps(dst + (c0 + k) * spatial + p0, r[k]);
    }
    for (int64_t p = p16; p < spatial; ++p)
      for (int64_t k = c0; k < c0 + 16; ++k) dst[k * spatial + p] = src[p * c + k];
  }
  for (int64_t k = c16; k < c; ++k)
    for (int64_t p = 0; p < spatial; ++p) dst[k * spatial + p] = src[p * c + k];
}
#pragma GCC diagnostic pop

}  // namespace

void channels_last_to_plain(const float* src, float* dst, int64_t n, int64_t c, int64_t spatial) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  for (int64_t i = 0; i < n; ++i) {
    const float* s = src + i * c * spatial;
    float* d = dst + i * c * spatial;
    if (avx512) {
      channels_last_to_plain_avx512(s, d, c, spatial);
      continue;
    }
    for (int64_t p = 0; p < spatial; ++p)
      for (int64_t k = 0; k < c; ++k) d[k * spatial + p] = s[p * c + k];
  }
}

}  // namespace mpq::rt::cpu
