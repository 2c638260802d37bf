// Direct depthwise convolution (one input channel per group) for float32.
//
// Each input plane is copied once into a zero-padded buffer whose rows are split into `stride_w`
// phases (phase p holds padded columns p, p + s, p + 2s, ...). Every tap (kh, kw) of every output
// row is then a contiguous run of that buffer, whatever the stride, dilation or padding, so the
// inner loop is a branch-free multiply-add over output columns: AVX2/FMA when the CPU has it
// (checked at run time; the build targets baseline x86-64), plain vectorisable C++ otherwise.
#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/cpu/conv_common.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MPQ_DW_AVX2 1
#endif

namespace mpq::rt::cpu {

namespace {

// Floats allocated past the end of the padded plane buffer, so that a tail of up to 15 output
// columns can be computed with full 8-lane loads.
constexpr int64_t kSlack = 16;

struct DwPlan {
  int64_t H, W, KH, KW, sh, sw, dh, dw, pt, pl, OH, OW;
  int64_t Hp, Lp, row_stride;  // padded rows, phase length, floats per padded row (sw * Lp)
  std::vector<int64_t> tap_off;  // offset of tap (kh, kw) from the start of an output row's window
};

DwPlan make_plan(const Window3& g) {
  DwPlan p;
  p.H = g.in[1];
  p.W = g.in[2];
  p.KH = g.k[1];
  p.KW = g.k[2];
  p.sh = g.s[1];
  p.sw = g.s[2];
  p.dh = g.d[1];
  p.dw = g.d[2];
  p.pt = g.pb[1];
  p.pl = g.pb[2];
  p.OH = g.out[1];
  p.OW = g.out[2];
  p.Hp = (p.OH - 1) * p.sh + (p.KH - 1) * p.dh + 1;
  const int64_t wp = (p.OW - 1) * p.sw + (p.KW - 1) * p.dw + 1;
  p.Lp = ceil_div(wp, p.sw);
  p.row_stride = p.sw * p.Lp;
  for (int64_t kh = 0; kh < p.KH; ++kh)
    for (int64_t kw = 0; kw < p.KW; ++kw) {
      const int64_t col = kw * p.dw;
      p.tap_off.push_back(kh * p.dh * p.row_stride + (col % p.sw) * p.Lp + col / p.sw);
    }
  return p;
}

#ifdef MPQ_DW_AVX2
bool cpu_has_avx2_fma() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

// dst0[j] = src[2j], dst1[j] = src[2j+1] for j < n.
__attribute__((target("avx2"))) void split2_avx2(const float* src, float* dst0, float* dst1, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 a = _mm256_loadu_ps(src + 2 * j), b = _mm256_loadu_ps(src + 2 * j + 8);
    // Within each 128-bit lane: evens / odds of a and b, then restore the order of the 64-bit blocks.
    const __m256 e = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    const __m256 o = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    _mm256_storeu_ps(dst0 + j, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0))));
    _mm256_storeu_ps(dst1 + j, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0))));
  }
  for (; j < n; ++j) {
    dst0[j] = src[2 * j];
    dst1[j] = src[2 * j + 1];
  }
}
#endif

#ifdef MPQ_DW_AVX2
__attribute__((target("avx2"))) void gather_stride2_avx2(const float* src, float* dst, int64_t n) {
  int64_t j = 0;
  // j + 9 <= n keeps the last 16-float load (up to src[2j + 15]) below src[2n - 2].
  for (; j + 9 <= n; j += 8) {
    const __m256 a = _mm256_loadu_ps(src + 2 * j), b = _mm256_loadu_ps(src + 2 * j + 8);
    const __m256 e = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    _mm256_storeu_ps(dst + j, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0))));
  }
  for (; j < n; ++j) dst[j] = src[2 * j];
}
#endif

// Padded, phase-split copy of one input plane. `tmp` holds one padded row (sw * Lp floats).
void fill_padded(const float* x, float* buf, float* tmp, const DwPlan& p) {
  const int64_t wp = p.row_stride;  // padded row length, rounded up to whole phases
  const int64_t lo = std::min(p.pl, wp), hi = std::clamp<int64_t>(p.pl + p.W, lo, wp);
  for (int64_t r = 0; r < p.Hp; ++r) {
    float* row = buf + r * p.row_stride;
    const int64_t ih = r - p.pt;
    if (ih < 0 || ih >= p.H) {
      std::fill(row, row + p.row_stride, 0.0f);
      continue;
    }
    // Padded column j reads input column j - pl.
    float* line = p.sw == 1 ? row : tmp;
    std::fill(line, line + lo, 0.0f);
    std::memcpy(line + lo, x + ih * p.W + (lo - p.pl), static_cast<size_t>(hi - lo) * sizeof(float));
    std::fill(line + hi, line + wp, 0.0f);
    if (p.sw == 1) continue;
#ifdef MPQ_DW_AVX2
    if (p.sw == 2 && cpu_has_avx2_fma()) {
      split2_avx2(line, row, row + p.Lp, p.Lp);
      continue;
    }
#endif
    for (int64_t ph = 0; ph < p.sw; ++ph)
      for (int64_t j = 0; j < p.Lp; ++j) row[ph * p.Lp + j] = line[j * p.sw + ph];
  }
}

// Output rows r < rows of one plane: y[r * y_step + ow] = b + sum_t w[t] * base[r * row_step + off[t] + ow].
// Portable version (the compiler vectorises the inner loop).
void rows_generic(const float* base, int64_t row_step, int64_t rows, const int64_t* off, const float* w, int64_t taps,
                  float b, float* y, int64_t y_step, int64_t ow_n) {
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict yr = y + r * y_step;
    for (int64_t ow = 0; ow < ow_n; ++ow) yr[ow] = b;
    for (int64_t t = 0; t < taps; ++t) {
      const float* __restrict s = base + r * row_step + off[t];
      const float wv = w[t];
      for (int64_t ow = 0; ow < ow_n; ++ow) yr[ow] += wv * s[ow];
    }
  }
}

#ifdef MPQ_DW_AVX2
// AVX2/FMA: NV 8-lane vectors of output columns starting at `ow`, for ROWS output rows at once
// (independent accumulator chains keep both FMA pipes busy). TAPS > 0 fixes the tap count at
// compile time (3x3 and 5x5 kernels). A partial block (`valid` < NV * 8 columns) still loads full
// vectors (the buffer has kSlack floats past its end, and lanes past the row only feed lanes that
// are not stored) and stores through a small array (masked stores are slow on AMD CPUs).
template <int ROWS, int TAPS, int NV>
__attribute__((target("avx2,fma"), always_inline)) inline void block_avx2(const float* base, int64_t row_step,
                                                                         const int64_t* off, const float* w,
                                                                         int64_t taps_rt, __m256 bv, float* y,
                                                                         int64_t y_step, int64_t ow, int64_t valid) {
  const int64_t taps = TAPS > 0 ? TAPS : taps_rt;
  __m256 a[ROWS][NV];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) a[r][v] = bv;
  for (int64_t t = 0; t < taps; ++t) {
    const __m256 wv = _mm256_broadcast_ss(w + t);
    const float* s = base + off[t] + ow;
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < NV; ++v) a[r][v] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(s + r * row_step + 8 * v), a[r][v]);
  }
  if (valid == NV * 8) {
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < NV; ++v) _mm256_storeu_ps(y + r * y_step + ow + 8 * v, a[r][v]);
  } else {
    alignas(32) float out[NV * 8];
    for (int r = 0; r < ROWS; ++r) {
      for (int v = 0; v < NV; ++v) _mm256_store_ps(out + 8 * v, a[r][v]);
      std::memcpy(y + r * y_step + ow, out, static_cast<size_t>(valid) * sizeof(float));
    }
  }
}

template <int ROWS, int TAPS>
__attribute__((target("avx2,fma"))) void rows_avx2(const float* base, int64_t row_step, const int64_t* off,
                                                   const float* w, int64_t taps, float b, float* y, int64_t y_step,
                                                   int64_t ow_n) {
  const __m256 bv = _mm256_set1_ps(b);
  int64_t ow = 0;
  for (; ow + 16 <= ow_n; ow += 16) block_avx2<ROWS, TAPS, 2>(base, row_step, off, w, taps, bv, y, y_step, ow, 16);
  const int64_t rem = ow_n - ow;
  if (rem > 8)
    block_avx2<ROWS, TAPS, 2>(base, row_step, off, w, taps, bv, y, y_step, ow, rem);
  else if (rem > 0)
    block_avx2<ROWS, TAPS, 1>(base, row_step, off, w, taps, bv, y, y_step, ow, rem);
}

template <int TAPS>
void rows_avx2_any(const float* base, int64_t row_step, int64_t rows, const int64_t* off, const float* w, int64_t taps,
                   float b, float* y, int64_t y_step, int64_t ow_n) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    rows_avx2<4, TAPS>(base + r * row_step, row_step, off, w, taps, b, y + r * y_step, y_step, ow_n);
  for (; r < rows; ++r) rows_avx2<1, TAPS>(base + r * row_step, row_step, off, w, taps, b, y + r * y_step, y_step, ow_n);
}
#endif

using RowsFn = void (*)(const float*, int64_t, int64_t, const int64_t*, const float*, int64_t, float, float*, int64_t,
                        int64_t);

RowsFn pick_rows_fn(int64_t taps) {
#ifdef MPQ_DW_AVX2
  if (cpu_has_avx2_fma()) {
    if (taps == 9) return rows_avx2_any<9>;
    if (taps == 25) return rows_avx2_any<25>;
    return rows_avx2_any<0>;
  }
#endif
  (void)taps;
  return rows_generic;
}

}  // namespace

void split_stride2(const float* src, float* dst0, float* dst1, int64_t n) {
#ifdef MPQ_DW_AVX2
  if (cpu_has_avx2_fma()) {
    split2_avx2(src, dst0, dst1, n);
    return;
  }
#endif
  for (int64_t j = 0; j < n; ++j) {
    dst0[j] = src[2 * j];
    dst1[j] = src[2 * j + 1];
  }
}

void gather_stride2(const float* src, float* dst, int64_t n) {
#ifdef MPQ_DW_AVX2
  if (cpu_has_avx2_fma()) {
    gather_stride2_avx2(src, dst, n);
    return;
  }
#endif
  for (int64_t j = 0; j < n; ++j) dst[j] = src[2 * j];
}

void depthwise_conv2d(ThreadPool& pool, const float* x, const float* w, const float* bias, float* y, int64_t n,
                      int64_t c, int64_t mult, const Window3& g) {
  const DwPlan p = make_plan(g);
  const int64_t taps = p.KH * p.KW;
  const RowsFn rows = pick_rows_fn(taps);
  const int64_t in_plane = p.H * p.W, out_plane = p.OH * p.OW;
  const int64_t work_per_plane = std::max<int64_t>(1, mult * out_plane * taps);
  pool.parallel_for(n * c, std::max<int64_t>(1, 65536 / work_per_plane), [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(static_cast<size_t>(p.Hp * p.row_stride + kSlack), 0.0f);
    std::vector<float> tmp(static_cast<size_t>(p.row_stride));
    for (int64_t plane = lo; plane < hi; ++plane) {
      const int64_t ci = plane % c;
      fill_padded(x + plane * in_plane, buf.data(), tmp.data(), p);
      for (int64_t mi = 0; mi < mult; ++mi) {
        const int64_t m = ci * mult + mi;
        rows(buf.data(), p.sh * p.row_stride, p.OH, p.tap_off.data(), w + m * taps, taps, bias ? bias[m] : 0.0f,
             y + (plane * mult + mi) * out_plane, p.OW, p.OW);
      }
    }
  });
}

}  // namespace mpq::rt::cpu
