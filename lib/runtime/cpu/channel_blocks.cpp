#include "runtime/cpu/channel_blocks.h"

#include <algorithm>

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

}  // namespace mpq::rt::cpu
