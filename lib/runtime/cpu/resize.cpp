// Resize (opset 10-19+) and Upsample (opset 1-9): nearest, n-linear and cubic interpolation over
// any set of axes, following the ONNX reference implementation's arithmetic:
//   * a per-axis coordinate transform maps output index x to a source coordinate x_ori
//     (half_pixel, half_pixel_symmetric, pytorch_half_pixel, align_corners, asymmetric,
//     tf_half_pixel_for_nn, tf_crop_and_resize; "output width" is scale * input length);
//   * taps are taken around x_ori with edge clamping; cubic uses cubic_coeff_a, exclude_outside
//     drops taps outside the input and renormalises; antialias widens linear/cubic filters by
//     1/scale when downsampling;
//   * tf_crop_and_resize gives extrapolation_value where x_ori falls outside the input.
// Interpolation is separable: one pass per resized axis (shrinking axes first). Float32 4-D
// inputs resized on H and W only get fused nearest / bilinear kernels. Opset 10 and Upsample use
// the pre-11 rules (asymmetric coordinates; nearest floors when upsampling, ceils when downsampling).
#include "runtime/cpu/resize.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "runtime/cpu/register_all.h"
#include "runtime/cpu/shape_internal.h"

namespace mpq::rt::cpu {

namespace {

enum class Mode { Nearest, Linear, Cubic };
enum class Coord { HalfPixel, HalfPixelSymmetric, PytorchHalfPixel, AlignCorners, Asymmetric, TfHalfPixelForNN, TfCropAndResize };
enum class NearestMode { RoundPreferFloor, RoundPreferCeil, Floor, Ceil, Simple };

struct ResizeSpec {
  Mode mode = Mode::Nearest;
  Coord coord = Coord::HalfPixel;
  NearestMode nearest = NearestMode::RoundPreferFloor;
  double cubic_a = -0.75;
  bool exclude_outside = false;
  bool antialias = false;
  float extrapolation = 0.0f;
  Shape out_shape;
  std::vector<double> scales;                 // per axis
  std::vector<double> roi_start, roi_end;     // per axis (tf_crop_and_resize)
};

// Taps of one axis: for output position j, n taps idx[j*n + t] (clamped) with weights w[j*n + t];
// outside[j] marks positions that take the extrapolation value.
struct AxisTaps {
  int64_t in_len = 0, out_len = 0;
  int n = 1;
  std::vector<int64_t> idx;
  std::vector<float> w;
  std::vector<uint8_t> outside;
  bool any_outside = false;
  bool identity() const {
    if (in_len != out_len || any_outside) return false;
    for (int64_t j = 0; j < out_len; ++j) {
      bool ok = false;
      for (int t = 0; t < n; ++t) {
        const size_t k = static_cast<size_t>(j * n + t);
        if (w[k] == 0.0f) continue;
        if (idx[k] != j || w[k] != 1.0f) return false;
        ok = true;
      }
      if (!ok) return false;
    }
    return true;
  }
};

double cubic_weight(double x, double A) {
  x = std::fabs(x);
  if (x <= 1.0) return ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
  if (x < 2.0) return ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
  return 0.0;
}

AxisTaps make_taps(const ResizeSpec& s, size_t axis, int64_t in_len, int64_t out_len) {
  AxisTaps t;
  t.in_len = in_len;
  t.out_len = out_len;
  const double scale = s.scales[axis];
  const double out_w = scale * static_cast<double>(in_len);  // the reference's "output width"
  const double L = static_cast<double>(in_len);
  const bool aa = s.antialias && scale < 1.0 && s.mode != Mode::Nearest;
  int start = 0;  // first tap offset relative to floor(x_ori) (with ratio in (0, 1])
  if (s.mode == Mode::Nearest) {
    t.n = 1;
  } else if (s.mode == Mode::Linear) {
    start = aa ? static_cast<int>(std::floor(-1.0 / scale) + 1.0) : 0;
    t.n = 2 - 2 * start;
  } else {
    start = aa ? static_cast<int>(std::floor(-2.0 / scale) + 1.0) : -1;
    t.n = 2 - 2 * start;
  }
  const size_t n = static_cast<size_t>(t.n);
  t.idx.assign(static_cast<size_t>(out_len) * n, 0);
  t.w.assign(static_cast<size_t>(out_len) * n, 0.0f);
  t.outside.assign(static_cast<size_t>(out_len), 0);
  std::vector<double> coeff(n);
  for (int64_t j = 0; j < out_len; ++j) {
    const double x = static_cast<double>(j);
    double xo = 0.0;
    switch (s.coord) {
      case Coord::HalfPixel: xo = (x + 0.5) / scale - 0.5; break;
      case Coord::HalfPixelSymmetric: {
        const double adjustment = static_cast<double>(out_len) / out_w;
        const double center = L / 2.0;
        xo = center * (1.0 - adjustment) + (x + 0.5) / scale - 0.5;
        break;
      }
      case Coord::PytorchHalfPixel: xo = out_w == 1.0 ? -0.5 : (x + 0.5) / scale - 0.5; break;
      case Coord::AlignCorners: xo = out_w == 1.0 ? 0.0 : x * (L - 1.0) / (out_w - 1.0); break;
      case Coord::Asymmetric: xo = x / scale; break;
      case Coord::TfHalfPixelForNN: xo = (x + 0.5) / scale; break;
      case Coord::TfCropAndResize: {
        const double r0 = s.roi_start[axis], r1 = s.roi_end[axis];
        xo = out_w == 1.0 ? (r1 - r0) * (L - 1.0) / 2.0 : x * (r1 - r0) * (L - 1.0) / (out_w - 1.0);
        xo += r0 * (L - 1.0);
        if (xo < 0.0 || xo > L - 1.0) {
          t.outside[static_cast<size_t>(j)] = 1;
          t.any_outside = true;
          continue;
        }
        break;
      }
    }
    const size_t base = static_cast<size_t>(j) * n;
    if (s.mode == Mode::Nearest) {
      int64_t i;
      const double fl = std::floor(xo);
      const double ratio = xo - fl;
      if (ratio == 0.0) {
        i = static_cast<int64_t>(fl);
      } else {
        switch (s.nearest) {
          case NearestMode::RoundPreferFloor: i = static_cast<int64_t>(ratio <= 0.5 ? fl : fl + 1.0); break;
          case NearestMode::RoundPreferCeil: i = static_cast<int64_t>(ratio < 0.5 ? fl : fl + 1.0); break;
          case NearestMode::Floor: i = static_cast<int64_t>(fl); break;
          case NearestMode::Ceil: i = static_cast<int64_t>(fl + 1.0); break;
          case NearestMode::Simple:
          default: i = static_cast<int64_t>(scale < 1.0 ? std::ceil(xo) : std::trunc(xo)); break;
        }
      }
      t.idx[base] = std::clamp<int64_t>(i, 0, in_len - 1);
      t.w[base] = 1.0f;
      continue;
    }
    // ratio in (0, 1]: an integer coordinate counts as the right end of the interval to its left.
    double fl = std::floor(xo);
    double ratio = xo - fl;
    if (ratio == 0.0) {
      ratio = 1.0;
      fl -= 1.0;
    }
    const double fs = aa ? scale : 1.0;
    double sum = 0.0;
    for (size_t k = 0; k < n; ++k) {
      const double d = (static_cast<double>(start + static_cast<int>(k)) - ratio) * fs;
      double c = s.mode == Mode::Linear ? std::clamp(1.0 - std::fabs(d), 0.0, 1.0) : cubic_weight(d, s.cubic_a);
      const int64_t src = static_cast<int64_t>(fl) + start + static_cast<int64_t>(k);
      if (s.exclude_outside && (src < 0 || src >= in_len)) c = 0.0;
      coeff[k] = c;
      sum += c;
    }
    const bool normalise = aa || s.exclude_outside;
    for (size_t k = 0; k < n; ++k) {
      const int64_t src = static_cast<int64_t>(fl) + start + static_cast<int64_t>(k);
      t.idx[base + k] = std::clamp<int64_t>(src, 0, in_len - 1);
      t.w[base + k] = static_cast<float>(normalise && sum != 0.0 ? coeff[k] / sum : coeff[k]);
    }
  }
  return t;
}

// One separable pass along `axis` of a float-like tensor: out[o, j, i] = sum_t w * in[o, idx, i].
template <typename T>
Tensor resample_axis(ThreadPool& pool, const Tensor& in, size_t axis, const AxisTaps& taps, T extrap) {
  Shape out_shape = in.shape();
  out_shape[axis] = taps.out_len;
  Tensor out(in.dtype(), out_shape);
  if (out.numel() == 0) return out;
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= in.shape()[d];
  for (size_t d = axis + 1; d < in.shape().size(); ++d) inner *= in.shape()[d];
  const int64_t L_in = taps.in_len, L_out = taps.out_len;
  const int n = taps.n;
  const T* pi = in.data<T>();
  T* po = out.data<T>();
  if (inner == 1) {
    pool.parallel_for(outer, std::max<int64_t>(1, 8192 / std::max<int64_t>(L_out * n, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        const T* src = pi + o * L_in;
        T* dst = po + o * L_out;
        for (int64_t j = 0; j < L_out; ++j) {
          if (taps.outside[static_cast<size_t>(j)]) {
            dst[j] = extrap;
            continue;
          }
          const int64_t* ix = taps.idx.data() + j * n;
          const float* w = taps.w.data() + j * n;
          T acc = 0;
          for (int t = 0; t < n; ++t) acc += static_cast<T>(w[t]) * src[ix[t]];
          dst[j] = acc;
        }
      }
    });
    return out;
  }
  pool.parallel_for(outer * L_out, std::max<int64_t>(1, 8192 / std::max<int64_t>(inner * n, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t it = lo; it < hi; ++it) {
      const int64_t o = it / L_out, j = it % L_out;
      T* dst = po + it * inner;
      if (taps.outside[static_cast<size_t>(j)]) {
        std::fill(dst, dst + inner, extrap);
        continue;
      }
      const int64_t* ix = taps.idx.data() + j * n;
      const float* w = taps.w.data() + j * n;
      const T* src = pi + o * L_in * inner;
      {
        const T w0 = static_cast<T>(w[0]);
        const T* s0 = src + ix[0] * inner;
        for (int64_t i = 0; i < inner; ++i) dst[i] = w0 * s0[i];
      }
      for (int t = 1; t < n; ++t) {
        const T wt = static_cast<T>(w[t]);
        if (wt == T(0)) continue;
        const T* st = src + ix[t] * inner;
        for (int64_t i = 0; i < inner; ++i) dst[i] += wt * st[i];
      }
    }
  });
  return out;
}

// The two row loops of bilinear_2d. dst[x] = wa[x] * src[x0[x]] + wb[x] * src[x1[x]] (horizontal)
// and dst[x] = w0 * h0[x] + w1 * h1[x] (vertical), each product rounded before the sum (no fused
// multiply-add), so the AVX2 versions give the portable loops' bits.
void horizontal_row_plain(const float* src, const int32_t* x0, const int32_t* x1, const float* wa, const float* wb,
                          float* dst, int64_t from, int64_t n) {
  for (int64_t x = from; x < n; ++x) dst[x] = wa[x] * src[x0[x]] + wb[x] * src[x1[x]];
}

void blend_rows_plain(const float* h0, const float* h1, float w0, float w1, float* dst, int64_t from, int64_t n) {
  for (int64_t x = from; x < n; ++x) dst[x] = w0 * h0[x] + w1 * h1[x];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// 8 outputs per step, the two taps gathered (U-Net's 2x upsampling of 32 x 16 x 16 at batch 1: the
// scalar loops took 30 us, most of the model's time outside its convolutions).
__attribute__((target("avx2"))) void horizontal_row_avx2(const float* src, const int32_t* x0, const int32_t* x1,
                                                         const float* wa, const float* wb, float* dst, int64_t from,
                                                         int64_t n) {
  int64_t x = from;
  for (; x + 8 <= n; x += 8) {
    const __m256 s0 = _mm256_i32gather_ps(src, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + x)), 4);
    const __m256 s1 = _mm256_i32gather_ps(src, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x1 + x)), 4);
    _mm256_storeu_ps(dst + x, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(wa + x), s0),
                                            _mm256_mul_ps(_mm256_loadu_ps(wb + x), s1)));
  }
  horizontal_row_plain(src, x0, x1, wa, wb, dst, x, n);
}

__attribute__((target("avx2"))) void blend_rows_avx2(const float* h0, const float* h1, float w0, float w1, float* dst,
                                                     int64_t from, int64_t n) {
  const __m256 a = _mm256_set1_ps(w0), b = _mm256_set1_ps(w1);
  int64_t x = from;
  for (; x + 8 <= n; x += 8)
    _mm256_storeu_ps(dst + x, _mm256_add_ps(_mm256_mul_ps(a, _mm256_loadu_ps(h0 + x)),
                                            _mm256_mul_ps(b, _mm256_loadu_ps(h1 + x))));
  blend_rows_plain(h0, h1, w0, w1, dst, x, n);
}
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// 16 outputs per step without gathers (slow on CPUs with the gather data sampling mitigation: the
// AVX2 loop above was 4% of an INT8 U-Net run): where the 16 outputs' taps lie within 16
// consecutive inputs (any upsampling, mild downsampling), one load of those inputs and two
// in-register permutes give both taps; otherwise the step gathers. Same products and sums as the
// portable loop, so the same bits. Not inlined, so that its own vzeroupper ends every use of the
// 512-bit registers (see calib/histogram.cpp). GCC 12's AVX-512 intrinsics start from
// _mm512_undefined_*(), which -Wmaybe-uninitialized reports (a known false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"), noinline)) void horizontal_row_avx512(const float* src, const int32_t* x0, const int32_t* x1,
                                                              const float* wa, const float* wb, float* dst, int64_t from,
                                                              int64_t n) {
  int64_t x = from;
  for (; x + 16 <= n; x += 16) {
    const __m512i i0 = _mm512_loadu_si512(x0 + x), i1 = _mm512_loadu_si512(x1 + x);
    // Taps need not grow with x (a reversed region of interest), so the window is their range.
    const int32_t base = _mm512_reduce_min_epi32(_mm512_min_epi32(i0, i1));
    const int32_t top = _mm512_reduce_max_epi32(_mm512_max_epi32(i0, i1));
    __m512 s0, s1;
    if (top - base < 16 && base >= 0) {
      // Only the inputs the taps name: nothing past the row's last tap is read.
      const __mmask16 m = static_cast<__mmask16>((1u << (top - base + 1)) - 1u);
      const __m512 window = _mm512_maskz_loadu_ps(m, src + base);
      const __m512i b = _mm512_set1_epi32(base);
      s0 = _mm512_permutexvar_ps(_mm512_sub_epi32(i0, b), window);
      s1 = _mm512_permutexvar_ps(_mm512_sub_epi32(i1, b), window);
    } else {
      s0 = _mm512_i32gather_ps(i0, src, 4);
      s1 = _mm512_i32gather_ps(i1, src, 4);
    }
    _mm512_storeu_ps(dst + x, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(wa + x), s0),
                                            _mm512_mul_ps(_mm512_loadu_ps(wb + x), s1)));
  }
  horizontal_row_plain(src, x0, x1, wa, wb, dst, x, n);
}

__attribute__((target("avx512f"), noinline)) void blend_rows_avx512(const float* h0, const float* h1, float w0, float w1,
                                                          float* dst, int64_t from, int64_t n) {
  const __m512 a = _mm512_set1_ps(w0), b = _mm512_set1_ps(w1);
  int64_t x = from;
  for (; x + 16 <= n; x += 16)
    _mm512_storeu_ps(dst + x, _mm512_add_ps(_mm512_mul_ps(a, _mm512_loadu_ps(h0 + x)),
                                            _mm512_mul_ps(b, _mm512_loadu_ps(h1 + x))));
  blend_rows_plain(h0, h1, w0, w1, dst, x, n);
}
#pragma GCC diagnostic pop
#endif

// Set while a ScopedResizeBaseline lives: the portable row loops only.
std::atomic<bool> g_resize_baseline{false};

using HorizontalRowFn = void (*)(const float*, const int32_t*, const int32_t*, const float*, const float*, float*,
                                 int64_t, int64_t);
using BlendRowsFn = void (*)(const float*, const float*, float, float, float*, int64_t, int64_t);

// Fused bilinear for float32 [N, C, H, W] resized on H and W only: each needed input row is
// interpolated horizontally once into a small row cache, then output rows blend two cached rows.
Tensor bilinear_2d(ThreadPool& pool, const Tensor& in, const AxisTaps& ty, const AxisTaps& tx) {
  const int64_t H = in.dim(2), W = in.dim(3), OH = ty.out_len, OW = tx.out_len;
  const int64_t planes = in.dim(0) * in.dim(1);
  Tensor out(DType::Float32, {in.dim(0), in.dim(1), OH, OW});
  const float* pi = in.data<float>();
  float* po = out.data<float>();
  std::vector<int32_t> x0(static_cast<size_t>(OW)), x1(static_cast<size_t>(OW));
  std::vector<float> wa(static_cast<size_t>(OW)), wb(static_cast<size_t>(OW));
  for (int64_t x = 0; x < OW; ++x) {
    x0[static_cast<size_t>(x)] = static_cast<int32_t>(tx.idx[static_cast<size_t>(2 * x)]);
    x1[static_cast<size_t>(x)] = static_cast<int32_t>(tx.idx[static_cast<size_t>(2 * x + 1)]);
    wa[static_cast<size_t>(x)] = tx.w[static_cast<size_t>(2 * x)];
    wb[static_cast<size_t>(x)] = tx.w[static_cast<size_t>(2 * x + 1)];
  }
  HorizontalRowFn horizontal_row = horizontal_row_plain;
  BlendRowsFn blend_rows = blend_rows_plain;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool avx2 = __builtin_cpu_supports("avx2");
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!g_resize_baseline.load(std::memory_order_relaxed)) {
    if (avx512) {
      horizontal_row = horizontal_row_avx512;
      blend_rows = blend_rows_avx512;
    } else if (avx2) {
      horizontal_row = horizontal_row_avx2;
      blend_rows = blend_rows_avx2;
    }
  }
#endif
  // Work items: (plane, block of output rows); each keeps its own cache of two horizontal rows.
  const int64_t rows_per_block = std::max<int64_t>(1, std::min<int64_t>(OH, 16384 / std::max<int64_t>(OW, 1)));
  const int64_t blocks = (OH + rows_per_block - 1) / rows_per_block;
  pool.parallel_for(planes * blocks, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> cache(static_cast<size_t>(2 * OW));
    int64_t cached[2] = {-1, -1};
    const float* cached_plane = nullptr;
    for (int64_t it = lo; it < hi; ++it) {
      const int64_t p = it / blocks, blk = it % blocks;
      const float* plane = pi + p * H * W;
      if (plane != cached_plane) {
        cached[0] = cached[1] = -1;
        cached_plane = plane;
      }
      // Horizontal pass of source row `r` into cache slot `slot`.
      auto horizontal = [&](int64_t r, int slot) {
        horizontal_row(plane + r * W, x0.data(), x1.data(), wa.data(), wb.data(), cache.data() + slot * OW, 0, OW);
        cached[slot] = r;
      };
      auto row = [&](int64_t r) -> const float* {
        if (cached[0] == r) return cache.data();
        if (cached[1] == r) return cache.data() + OW;
        // Replace the slot that the next rows need least: the lower source row.
        const int slot = cached[0] < cached[1] ? 0 : 1;
        horizontal(r, slot);
        return cache.data() + slot * OW;
      };
      const int64_t y_end = std::min(OH, (blk + 1) * rows_per_block);
      for (int64_t y = blk * rows_per_block; y < y_end; ++y) {
        const int64_t r0 = ty.idx[static_cast<size_t>(2 * y)], r1 = ty.idx[static_cast<size_t>(2 * y + 1)];
        const float wy0 = ty.w[static_cast<size_t>(2 * y)], wy1 = ty.w[static_cast<size_t>(2 * y + 1)];
        float* dst = po + (p * OH + y) * OW;
        const float* h0 = row(r0);
        if (r1 == r0) {
          const float wsum = wy0 + wy1;
          for (int64_t x = 0; x < OW; ++x) dst[x] = wsum * h0[x];
          continue;
        }
        // Keep h0 cached while fetching h1: if h0 sits in slot 0, r1 must go to slot 1 and vice versa.
        const float* h1;
        if (cached[0] == r1) {
          h1 = cache.data();
        } else if (cached[1] == r1) {
          h1 = cache.data() + OW;
        } else {
          const int slot = (h0 == cache.data()) ? 1 : 0;
          horizontal(r1, slot);
          h1 = cache.data() + slot * OW;
        }
        blend_rows(h0, h1, wy0, wy1, dst, 0, OW);
      }
    }
  });
  return out;
}

// Nearest over all axes at once (any element width): a gather through per-axis index tables.
Tensor nearest_nd(ThreadPool& pool, const Tensor& in, const std::vector<AxisTaps>& taps, const Tensor& extrap) {
  const size_t r = static_cast<size_t>(in.rank());
  Shape out_shape(r);
  for (size_t d = 0; d < r; ++d) out_shape[d] = taps[d].out_len;
  Tensor out(in.dtype(), out_shape);
  if (out.numel() == 0) return out;
  const std::vector<int64_t> st = strides_of(in.shape());
  std::vector<std::vector<int64_t>> off(r);
  for (size_t d = 0; d < r; ++d) {
    off[d].resize(static_cast<size_t>(taps[d].out_len));
    for (int64_t j = 0; j < taps[d].out_len; ++j)
      off[d][static_cast<size_t>(j)] = taps[d].outside[static_cast<size_t>(j)] ? -1 : taps[d].idx[static_cast<size_t>(j)] * st[d];
  }
  const size_t last = r - 1;
  const int64_t W = out_shape[last];
  const int64_t rows = out.numel() / W;
  visit_by_width(in.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pi = static_cast<const T*>(in.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    T ev;
    std::memcpy(&ev, extrap.raw_data(), sizeof(T));
    const int64_t* offl = off[last].data();
    const bool last_outside = taps[last].any_outside;
    pool.parallel_for(rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(W, 1)), [&](int64_t lo, int64_t hi) {
      std::vector<int64_t> idx(last, 0);
      int64_t o = lo;
      for (size_t d = last; d-- > 0;) {
        idx[d] = o % out_shape[d];
        o /= out_shape[d];
      }
      int64_t prev_base = -1;
      for (int64_t row = lo; row < hi; ++row) {
        T* dst = po + row * W;
        int64_t base = 0;
        bool outside = false;
        for (size_t d = 0; d < last; ++d) {
          const int64_t v = off[d][static_cast<size_t>(idx[d])];
          if (v < 0) outside = true;
          base += v;
        }
        if (outside) {
          std::fill(dst, dst + W, ev);
        } else if (row > lo && base == prev_base) {
          std::memcpy(dst, dst - W, static_cast<size_t>(W) * sizeof(T));  // same source row as the last one
        } else {
          const T* src = pi + base;
          if (last_outside) {
            for (int64_t x = 0; x < W; ++x) dst[x] = offl[x] < 0 ? ev : src[offl[x]];
          } else {
            for (int64_t x = 0; x < W; ++x) dst[x] = src[offl[x]];
          }
        }
        prev_base = outside ? -1 : base;
        for (size_t d = last; d-- > 0;) {
          if (++idx[d] < out_shape[d]) break;
          idx[d] = 0;
        }
      }
    });
  });
  return out;
}

template <typename T>
Tensor interpolate_typed(ThreadPool& pool, const Tensor& x, const ResizeSpec& s, const std::vector<AxisTaps>& taps) {
  const size_t r = taps.size();
  std::vector<size_t> order;
  for (size_t d = 0; d < r; ++d)
    if (!taps[d].identity()) order.push_back(d);
  if (order.empty()) return x;
  // Fused bilinear for the common NCHW case.
  if constexpr (std::is_same_v<T, float>) {
    if (r == 4 && s.mode == Mode::Linear && taps[2].n == 2 && taps[3].n == 2 && !taps[2].any_outside &&
        !taps[3].any_outside && taps[0].identity() && taps[1].identity())
      return bilinear_2d(pool, x, taps[2], taps[3]);
  }
  // Shrinking axes first keeps the intermediates small.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const double ra = static_cast<double>(taps[a].out_len) / static_cast<double>(std::max<int64_t>(taps[a].in_len, 1));
    const double rb = static_cast<double>(taps[b].out_len) / static_cast<double>(std::max<int64_t>(taps[b].in_len, 1));
    return ra < rb;
  });
  Tensor cur = x;
  for (size_t d : order) cur = resample_axis<T>(pool, cur, d, taps[d], static_cast<T>(s.extrapolation));
  return cur;
}

Tensor run_resize(KernelContext& ctx, const Tensor& x, const ResizeSpec& s) {
  const size_t r = static_cast<size_t>(x.rank());
  if (r == 0) return x;
  std::vector<AxisTaps> taps(r);
  for (size_t d = 0; d < r; ++d) taps[d] = make_taps(s, d, x.shape()[d], s.out_shape[d]);
  for (size_t d = 0; d < r; ++d)
    if (x.shape()[d] == 0 && s.out_shape[d] > 0) ctx.fail("cannot resize an empty axis {} to size {}", d, s.out_shape[d]);
  if (shape_numel(s.out_shape) == 0) return Tensor(x.dtype(), s.out_shape);
  if (s.mode == Mode::Nearest) {
    bool all_identity = true;
    for (const AxisTaps& t : taps) all_identity = all_identity && t.identity();
    if (all_identity) return x;
    Tensor ev = x.dtype() == DType::String ? Tensor() : Tensor::scalar<float>(s.extrapolation).cast_to(x.dtype());
    if (x.dtype() == DType::String) ctx.fail_unsupported("Resize of strings is not supported");
    return nearest_nd(ctx.pool(), x, taps, ev);
  }
  if (x.dtype() == DType::Float32) return interpolate_typed<float>(ctx.pool(), x, s, taps);
  if (x.dtype() == DType::Float64) return interpolate_typed<double>(ctx.pool(), x, s, taps);
  if (!dtype_is_integer(x.dtype())) ctx.fail_unsupported("{} Resize of {} is not supported", "linear/cubic", dtype_name(x.dtype()));
  // Integer data: interpolate in float32, then round half away from zero and saturate.
  Tensor f = interpolate_typed<float>(ctx.pool(), x.cast_to(DType::Float32), s, taps);
  Tensor out(x.dtype(), f.shape());
  visit_arith(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const float* pf = f.data<float>();
    T* po = out.data<T>();
    const double lo = static_cast<double>(std::numeric_limits<T>::lowest()), hi = static_cast<double>(std::numeric_limits<T>::max());
    for (int64_t i = 0; i < out.numel(); ++i) po[i] = static_cast<T>(std::clamp(std::round(static_cast<double>(pf[i])), lo, hi));
  });
  return out;
}

Mode parse_mode(const KernelContext& ctx, const std::string& m) {
  if (m == "nearest") return Mode::Nearest;
  if (m == "linear" || m == "bilinear" || m == "trilinear") return Mode::Linear;
  if (m == "cubic") return Mode::Cubic;
  ctx.fail("unknown mode '{}'", m);
}

// Scales and output sizes from either input, for the listed axes; fills s.scales / s.out_shape.
void shape_from_inputs(const KernelContext& ctx, const Tensor& x, const std::vector<int64_t>& axes,
                       const std::vector<float>& scales, const std::vector<int64_t>& sizes, ResizeSpec& s) {
  const size_t r = static_cast<size_t>(x.rank());
  s.scales.assign(r, 1.0);
  s.out_shape = x.shape();
  if (!scales.empty() && !sizes.empty()) ctx.fail("only one of 'scales' and 'sizes' may be given");
  if (scales.empty() && sizes.empty()) ctx.fail("one of 'scales' and 'sizes' must be given");
  if (!scales.empty()) {
    if (scales.size() != axes.size()) ctx.fail("scales has {} values for {} axes", scales.size(), axes.size());
    for (size_t i = 0; i < axes.size(); ++i) {
      const size_t d = static_cast<size_t>(axes[i]);
      if (!(scales[i] > 0.0f)) ctx.fail("scale {} for axis {} must be positive", scales[i], d);
      s.scales[d] = scales[i];
      s.out_shape[d] = static_cast<int64_t>(std::floor(scales[i] * static_cast<float>(x.shape()[d])));
    }
    return;
  }
  if (sizes.size() != axes.size()) ctx.fail("sizes has {} values for {} axes", sizes.size(), axes.size());
  const std::string policy = ctx.opset() >= 18 ? ctx.node().attr_string("keep_aspect_ratio_policy", "stretch") : "stretch";
  if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller")
    ctx.fail("unknown keep_aspect_ratio_policy '{}'", policy);
  double common = policy == "not_larger" ? 1e300 : 0.0;
  for (size_t i = 0; i < axes.size(); ++i) {
    const size_t d = static_cast<size_t>(axes[i]);
    if (sizes[i] < 0) ctx.fail("sizes {} must not be negative", shape_str(sizes));
    if (x.shape()[d] == 0) continue;
    const double sc = static_cast<double>(sizes[i]) / static_cast<double>(x.shape()[d]);
    common = policy == "not_larger" ? std::min(common, sc) : std::max(common, sc);
  }
  for (size_t i = 0; i < axes.size(); ++i) {
    const size_t d = static_cast<size_t>(axes[i]);
    int64_t out = sizes[i];
    double sc = x.shape()[d] == 0 ? 1.0 : static_cast<double>(out) / static_cast<double>(x.shape()[d]);
    if (policy != "stretch") {
      // One scale for every listed axis; sizes are rounded half up from it.
      out = static_cast<int64_t>(std::floor(common * static_cast<double>(x.shape()[d]) + 0.5));
      sc = common;
    }
    s.out_shape[d] = out;
    s.scales[d] = sc;
  }
}

void resize_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const ir::Node& node = ctx.node();
  const int opset = ctx.opset();
  const size_t r = static_cast<size_t>(x.rank());
  ResizeSpec s;
  s.mode = parse_mode(ctx, node.attr_string("mode", "nearest"));
  if (opset < 11) {
    if (s.mode == Mode::Cubic) ctx.fail("cubic mode needs opset 11");
    s.coord = Coord::Asymmetric;
    s.nearest = NearestMode::Simple;
    std::vector<float> scales;
    const Tensor& st = ctx.input(1);
    for (int64_t i = 0; i < st.numel(); ++i) scales.push_back(static_cast<float>(st.get_double(i)));
    std::vector<int64_t> axes;
    for (size_t d = 0; d < r; ++d) axes.push_back(static_cast<int64_t>(d));
    shape_from_inputs(ctx, x, axes, scales, {}, s);
    ctx.set_output(0, run_resize(ctx, x, s));
    return;
  }
  const std::string coord = node.attr_string("coordinate_transformation_mode", "half_pixel");
  if (coord == "half_pixel") s.coord = Coord::HalfPixel;
  else if (coord == "half_pixel_symmetric") s.coord = Coord::HalfPixelSymmetric;
  else if (coord == "pytorch_half_pixel") s.coord = Coord::PytorchHalfPixel;
  else if (coord == "align_corners") s.coord = Coord::AlignCorners;
  else if (coord == "asymmetric") s.coord = Coord::Asymmetric;
  else if (coord == "tf_half_pixel_for_nn") s.coord = Coord::TfHalfPixelForNN;
  else if (coord == "tf_crop_and_resize") s.coord = Coord::TfCropAndResize;
  else ctx.fail("unknown coordinate_transformation_mode '{}'", coord);
  const std::string nm = node.attr_string("nearest_mode", "round_prefer_floor");
  if (nm == "round_prefer_floor") s.nearest = NearestMode::RoundPreferFloor;
  else if (nm == "round_prefer_ceil") s.nearest = NearestMode::RoundPreferCeil;
  else if (nm == "floor") s.nearest = NearestMode::Floor;
  else if (nm == "ceil") s.nearest = NearestMode::Ceil;
  else ctx.fail("unknown nearest_mode '{}'", nm);
  s.cubic_a = node.attr_float("cubic_coeff_a", -0.75f);
  s.exclude_outside = node.attr_int("exclude_outside", 0) != 0;
  s.extrapolation = node.attr_float("extrapolation_value", 0.0f);
  s.antialias = opset >= 18 && node.attr_int("antialias", 0) != 0;
  std::vector<int64_t> axes;
  if (opset >= 18 && node.has_attr("axes")) {
    std::vector<bool> seen(r, false);
    for (int64_t a : node.attr_ints("axes")) {
      int ax = normalize_axis(ctx, a, static_cast<int>(r));
      if (seen[static_cast<size_t>(ax)]) ctx.fail("axis {} is repeated", a);
      seen[static_cast<size_t>(ax)] = true;
      axes.push_back(ax);
    }
  } else {
    for (size_t d = 0; d < r; ++d) axes.push_back(static_cast<int64_t>(d));
  }
  std::vector<float> scales;
  if (ctx.has_input(2)) {
    const Tensor& st = ctx.input(2);
    for (int64_t i = 0; i < st.numel(); ++i) scales.push_back(static_cast<float>(st.get_double(i)));
  }
  std::vector<int64_t> sizes = optional_input_ints(ctx, 3);
  shape_from_inputs(ctx, x, axes, scales, sizes, s);
  s.roi_start.assign(r, 0.0);
  s.roi_end.assign(r, 1.0);
  if (s.coord == Coord::TfCropAndResize) {
    if (!ctx.has_input(1) || ctx.input(1).numel() == 0) ctx.fail("tf_crop_and_resize needs a roi input");
    const Tensor& roi = ctx.input(1);
    if (roi.numel() != static_cast<int64_t>(2 * axes.size()))
      ctx.fail("roi has {} values, expected {}", roi.numel(), 2 * axes.size());
    for (size_t i = 0; i < axes.size(); ++i) {
      s.roi_start[static_cast<size_t>(axes[i])] = roi.get_double(static_cast<int64_t>(i));
      s.roi_end[static_cast<size_t>(axes[i])] = roi.get_double(static_cast<int64_t>(i + axes.size()));
    }
  }
  ctx.set_output(0, run_resize(ctx, x, s));
}

void upsample_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const ir::Node& node = ctx.node();
  const size_t r = static_cast<size_t>(x.rank());
  ResizeSpec s;
  s.mode = parse_mode(ctx, node.attr_string("mode", "nearest"));
  if (s.mode == Mode::Cubic) ctx.fail("Upsample does not support cubic mode");
  s.coord = Coord::Asymmetric;
  s.nearest = NearestMode::Simple;
  std::vector<float> scales;
  if (ctx.opset() >= 9) {
    const Tensor& st = ctx.input(1);
    for (int64_t i = 0; i < st.numel(); ++i) scales.push_back(static_cast<float>(st.get_double(i)));
  } else if (ctx.opset() >= 7) {
    scales = node.attr_floats("scales");
  } else {
    if (r != 4) ctx.fail("Upsample-1 needs a 4-D input");
    scales = {1.0f, 1.0f, node.attr_float("height_scale", 1.0f), node.attr_float("width_scale", 1.0f)};
  }
  for (float v : scales)
    if (v < 1.0f) ctx.fail("Upsample scales must be >= 1, got {}", v);
  std::vector<int64_t> axes;
  for (size_t d = 0; d < r; ++d) axes.push_back(static_cast<int64_t>(d));
  shape_from_inputs(ctx, x, axes, scales, {}, s);
  ctx.set_output(0, run_resize(ctx, x, s));
}

}  // namespace

ScopedResizeBaseline::ScopedResizeBaseline() : previous_(g_resize_baseline.exchange(true)) {}
ScopedResizeBaseline::~ScopedResizeBaseline() { g_resize_baseline.store(previous_); }

void register_resize(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  // Float16 inputs are interpolated in float32 by the executor (nearest is exact either way).
  r.add_fn("", "Resize", 10, kMaxOpset, cpu, resize_kernel);
  r.add_fn("", "Upsample", 1, kMaxOpset, cpu, upsample_kernel);
}

}  // namespace mpq::rt::cpu
