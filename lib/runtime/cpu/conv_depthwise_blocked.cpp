// Depthwise 2-D convolution on channel-blocked tensors (runtime/cpu/channel_blocks.h): X and Y
// are [N, C/B, H, W, B], so the B channels of a block sit next to each other and every tap is one
// B-wide multiply-add (AVX-512 for B = 16, AVX2/FMA for B = 8, checked at run time; plain C++
// otherwise). Where oneDNN has no direct kernel for a blocked depthwise convolution (oneDNN 2.6 on
// AVX-512 BF16 cores offers only its reference one), this spares the two layout conversions of
// the generic fallback.
#include <algorithm>
#include <vector>

#include "runtime/cpu/conv_common.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MPQ_DWB_X86 1
#endif

namespace mpq::rt::cpu {

namespace {

struct Geometry {
  int64_t H, W, KH, KW, sh, sw, dh, dw, pt, pl, OH, OW;
};

// One output row of one channel block: acc = bias + sum over the taps inside the input.
template <int B>
void row_generic(const float* xb, const float* wb, const float* bias, float* yrow, int64_t oh, const Geometry& g) {
  for (int64_t ow = 0; ow < g.OW; ++ow) {
    float acc[B];
    for (int j = 0; j < B; ++j) acc[j] = bias ? bias[j] : 0.0f;
    for (int64_t kh = 0; kh < g.KH; ++kh) {
      const int64_t ih = oh * g.sh - g.pt + kh * g.dh;
      if (ih < 0 || ih >= g.H) continue;
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        const int64_t iw = ow * g.sw - g.pl + kw * g.dw;
        if (iw < 0 || iw >= g.W) continue;
        const float* xp = xb + (ih * g.W + iw) * B;
        const float* wp = wb + (kh * g.KW + kw) * B;
        for (int j = 0; j < B; ++j) acc[j] += xp[j] * wp[j];
      }
    }
    for (int j = 0; j < B; ++j) yrow[ow * B + j] = acc[j];
  }
}

#ifdef MPQ_DWB_X86
__attribute__((target("avx512f"))) void row_avx512(const float* xb, const float* wb, const float* bias, float* yrow, int64_t oh,
                                                   const Geometry& g) {
  const __m512 b = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int64_t ow = 0; ow < g.OW; ++ow) {
    __m512 acc = b;
    for (int64_t kh = 0; kh < g.KH; ++kh) {
      const int64_t ih = oh * g.sh - g.pt + kh * g.dh;
      if (ih < 0 || ih >= g.H) continue;
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        const int64_t iw = ow * g.sw - g.pl + kw * g.dw;
        if (iw < 0 || iw >= g.W) continue;
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(xb + (ih * g.W + iw) * 16), _mm512_loadu_ps(wb + (kh * g.KW + kw) * 16), acc);
      }
    }
    _mm512_storeu_ps(yrow + ow * 16, acc);
  }
}

__attribute__((target("avx2,fma"))) void row_avx2(const float* xb, const float* wb, const float* bias, float* yrow, int64_t oh,
                                                  const Geometry& g) {
  const __m256 b = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
  for (int64_t ow = 0; ow < g.OW; ++ow) {
    __m256 acc = b;
    for (int64_t kh = 0; kh < g.KH; ++kh) {
      const int64_t ih = oh * g.sh - g.pt + kh * g.dh;
      if (ih < 0 || ih >= g.H) continue;
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        const int64_t iw = ow * g.sw - g.pl + kw * g.dw;
        if (iw < 0 || iw >= g.W) continue;
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(xb + (ih * g.W + iw) * 8), _mm256_loadu_ps(wb + (kh * g.KW + kw) * 8), acc);
      }
    }
    _mm256_storeu_ps(yrow + ow * 8, acc);
  }
}
#endif

using RowFn = void (*)(const float*, const float*, const float*, float*, int64_t, const Geometry&);

RowFn pick_row(int64_t block) {
#ifdef MPQ_DWB_X86
  if (block == 16 && __builtin_cpu_supports("avx512f")) return row_avx512;
  if (block == 8 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return row_avx2;
#endif
  return block == 16 ? row_generic<16> : row_generic<8>;
}

}  // namespace

void depthwise_conv2d_blocked(ThreadPool& pool, const float* x, const float* w, const float* bias, float* y, int64_t n,
                              int64_t c, int64_t block, const Window3& win) {
  if (block != 8 && block != 16) fail_internal("depthwise_conv2d_blocked: block {}", block);
  if (c % block != 0 || win.in[0] != 1 || win.k[0] != 1)
    fail_internal("depthwise_conv2d_blocked: {} channels, block {}, {}-D window", c, block, win.in[0] == 1 ? 2 : 3);
  const Geometry g{win.in[1], win.in[2], win.k[1], win.k[2], win.s[1], win.s[2], win.d[1], win.d[2], win.pb[1], win.pb[2],
                   win.out[1], win.out[2]};
  const int64_t blocks = c / block, taps = g.KH * g.KW;
  // W [C, 1, KH, KW] -> [C/B, KH, KW, B], the bias as it is (B consecutive values per block).
  std::vector<float> wr(static_cast<size_t>(c * taps));
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t t = 0; t < taps; ++t)
      wr[static_cast<size_t>(((ch / block) * taps + t) * block + ch % block)] = w[ch * taps + t];
  const RowFn row = pick_row(block);
  const int64_t in_plane = g.H * g.W * block, out_plane = g.OH * g.OW * block;
  // Output rows of every (image, block) pair, in parallel, at least kMinChunkMacs multiply-adds to a
  // chunk: a second thread reads the rows the first one wrote last, and a small convolution costs
  // less than that move (fashion_mobilenet's first depthwise convolution at batch 1, 16 channels
  // 28 x 28 -> 14 x 14, 28K multiply-adds: 4.9 us on one thread, 12.5 us split over two).
  constexpr int64_t kMinChunkMacs = 65536;
  const int64_t row_macs = std::max<int64_t>(1, g.OW * block * taps);
  pool.parallel_for(n * blocks * g.OH, std::max<int64_t>(4, kMinChunkMacs / row_macs), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t oh = r % g.OH, plane = r / g.OH, cb = plane % blocks;
      row(x + plane * in_plane, wr.data() + cb * taps * block, bias ? bias + cb * block : nullptr,
          y + plane * out_plane + oh * g.OW * block, oh, g);
    }
  });
}

}  // namespace mpq::rt::cpu
