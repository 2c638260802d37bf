// Pooling: MaxPool (with Indices), AveragePool, LpPool, their Global forms, and MaxUnpool.
//
// 1-D and 2-D windows without an Indices output (the common case) take a fast path: each plane is
// copied once into a buffer padded with the reduction's identity and split into stride phases
// (as in the depthwise convolution), so that every tap of an output row is a contiguous run and
// the reduction is an elementwise max/add over output columns (AVX2 for float32 when the CPU has
// it). Averages divide by separable per-row and per-column tap counts.
// 3-D windows and MaxPool with Indices use a general loop whose windows are resolved once per
// call (first input position and valid tap range per output index and dimension); more than three
// spatial dimensions use the reference code. Planes (n, c) are spread over the kernel pool.
#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif
#include <limits>
#include <type_traits>
#include <vector>

#include "runtime/cpu/conv_common.h"
#include "runtime/cpu/reference.h"
#include "runtime/cpu/register_all.h"

namespace mpq::rt::cpu {

namespace {

// Per spatial dimension and output index: first input position and valid tap range [lo, hi).
struct DimTaps {
  std::vector<int64_t> start, lo, hi, padded;  // padded: taps inside the padded input
};

DimTaps dim_taps(int64_t in, int64_t out, int64_t k, int64_t s, int64_t d, int64_t pb, int64_t pe) {
  DimTaps t;
  for (int64_t o = 0; o < out; ++o) {
    const int64_t st = o * s - pb;
    const int64_t lo = std::clamp<int64_t>(ceil_div(-st, d), 0, k);
    const int64_t hi = std::clamp<int64_t>(floor_div(in - 1 - st, d) + 1, lo, k);
    const int64_t plo = std::clamp<int64_t>(ceil_div(-pb - st, d), 0, k);
    const int64_t phi = std::clamp<int64_t>(floor_div(in + pe - 1 - st, d) + 1, plo, k);
    t.start.push_back(st);
    t.lo.push_back(lo);
    t.hi.push_back(hi);
    t.padded.push_back(phi - plo);
  }
  return t;
}

struct PoolPlan {
  Window win;
  Window3 g;
  DimTaps t[3];
};

PoolPlan make_plan(const KernelContext& ctx, const Tensor& x) {
  if (x.rank() < 3) ctx.fail("X must have rank 3 or more (N, C, spatial...), got shape {}", shape_str(x.shape()));
  std::vector<int64_t> kernel = ctx.node().attr_ints("kernel_shape", {});
  if (kernel.empty()) ctx.fail("kernel_shape is required");
  const bool ceil_mode = ctx.node().attr_int("ceil_mode", 0) != 0;
  PoolPlan p;
  p.win = forward_window(ctx, Shape(x.shape().begin() + 2, x.shape().end()), kernel, ceil_mode);
  if (p.win.rank() <= 3) {
    p.g = to_window3(p.win);
    for (int d = 0; d < 3; ++d) p.t[d] = dim_taps(p.g.in[d], p.g.out[d], p.g.k[d], p.g.s[d], p.g.d[d], p.g.pb[d], p.g.pe[d]);
  }
  return p;
}

Shape pooled_shape(const Tensor& x, const Window& w) {
  Shape s{x.dim(0), x.dim(1)};
  s.insert(s.end(), w.out.begin(), w.out.end());
  return s;
}

WindowGeometry to_geometry(const Window& w, bool ceil_mode) {
  return WindowGeometry{w.kernel, w.strides, w.dilations, w.pads, 1, ceil_mode};
}

// Runs fn(first, last) over chunks of the N*C planes on the pool.
template <typename F>
void for_planes(ThreadPool& pool, int64_t planes, int64_t work_per_plane, F fn) {
  pool.parallel_for(planes, std::max<int64_t>(1, 32768 / std::max<int64_t>(work_per_plane, 1)),
                    [&](int64_t lo, int64_t hi) { fn(lo, hi); });
}

// Runs fn(plane) for every plane.
template <typename F>
void for_each_plane(ThreadPool& pool, int64_t planes, int64_t work_per_plane, F fn) {
  for_planes(pool, planes, work_per_plane, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) fn(p);
  });
}

// ---------------------------------------------------------------- fast 2-D path
//
// 1-D and 2-D windows (the common case) copy each plane once into a buffer padded with the
// reduction's identity (-inf / lowest for max, 0 for sums) whose rows are split into stride_w
// phases, as the depthwise convolution does. Every tap of an output row is then a contiguous run,
// and the reduction is a vectorisable elementwise loop over output columns.

enum class Reduce { Max, Sum, SumAbs, SumSquares, SumPow };

struct Plane2D {
  int64_t H, W, KH, KW, sh, sw, dh, dw, pt, pl, OH, OW;
  int64_t Hp, Lp, row_stride;
  std::vector<int64_t> tap_off;
};

bool is_2d(const Window3& g) { return g.in[0] == 1 && g.k[0] == 1 && g.out[0] == 1; }

Plane2D make_plane(const Window3& g) {
  Plane2D p{g.in[1], g.in[2], g.k[1], g.k[2], g.s[1], g.s[2], g.d[1], g.d[2], g.pb[1], g.pb[2], g.out[1], g.out[2], 0, 0, 0, {}};
  p.Hp = (p.OH - 1) * p.sh + (p.KH - 1) * p.dh + 1;
  p.Lp = ceil_div((p.OW - 1) * p.sw + (p.KW - 1) * p.dw + 1, p.sw);
  p.row_stride = p.sw * p.Lp;
  for (int64_t kh = 0; kh < p.KH; ++kh)
    for (int64_t kw = 0; kw < p.KW; ++kw) {
      const int64_t col = kw * p.dw;
      p.tap_off.push_back(kh * p.dh * p.row_stride + (col % p.sw) * p.Lp + col / p.sw);
    }
  return p;
}

template <typename T, Reduce R>
inline T pre(T v, double p) {
  if constexpr (R == Reduce::SumAbs) return v < T(0) ? -v : v;
  if constexpr (R == Reduce::SumSquares) return v * v;
  if constexpr (R == Reduce::SumPow) return static_cast<T>(std::pow(std::fabs(static_cast<double>(v)), p));
  (void)p;
  return v;
}

template <typename T, Reduce R>
void fill_plane(const T* x, T* buf, T* line, const Plane2D& p, T pad, double pw) {
  const int64_t wp = p.row_stride;
  const int64_t lo = std::min(p.pl, wp), hi = std::clamp<int64_t>(p.pl + p.W, lo, wp);
  for (int64_t r = 0; r < p.Hp; ++r) {
    T* row = buf + r * p.row_stride;
    const int64_t ih = r - p.pt;
    if (ih < 0 || ih >= p.H) {
      std::fill(row, row + wp, pad);
      continue;
    }
    T* dst = p.sw == 1 ? row : line;
    const T* src = x + ih * p.W - p.pl;
    for (int64_t j = 0; j < lo; ++j) dst[j] = pad;
    if constexpr (R == Reduce::Max || R == Reduce::Sum) {
      if (hi > lo) std::memcpy(dst + lo, src + lo, static_cast<size_t>(hi - lo) * sizeof(T));
    } else {
      for (int64_t j = lo; j < hi; ++j) dst[j] = pre<T, R>(src[j], pw);
    }
    for (int64_t j = hi; j < wp; ++j) dst[j] = pad;
    if (p.sw == 1) continue;
    if constexpr (std::is_same_v<T, float>) {
      if (p.sw == 2) {
        split_stride2(line, row, row + p.Lp, p.Lp);
        continue;
      }
    }
    if (p.sw == 2) {
      T* __restrict e = row;
      T* __restrict o = row + p.Lp;
      for (int64_t j = 0; j < p.Lp; ++j) {
        e[j] = line[2 * j];
        o[j] = line[2 * j + 1];
      }
    } else {
      for (int64_t ph = 0; ph < p.sw; ++ph)
        for (int64_t j = 0; j < p.Lp; ++j) row[ph * p.Lp + j] = line[j * p.sw + ph];
    }
  }
}

// acc[ow] = reduce over taps t of base[off[t] + ow], for ow < n. Portable version.
template <typename T, Reduce R>
void row_reduce_plain(T* acc, const T* base, const int64_t* off, int64_t taps, int64_t n) {
  T* __restrict a = acc;
  {
    const T* __restrict s = base + off[0];
    for (int64_t ow = 0; ow < n; ++ow) a[ow] = s[ow];
  }
  for (int64_t t = 1; t < taps; ++t) {
    const T* __restrict s = base + off[t];
    if constexpr (R == Reduce::Max) {
      for (int64_t ow = 0; ow < n; ++ow) a[ow] = s[ow] > a[ow] ? s[ow] : a[ow];
    } else {
      for (int64_t ow = 0; ow < n; ++ow) a[ow] += s[ow];
    }
  }
}

template <typename T>
using RowReduceFn = void (*)(T*, const T*, const int64_t*, int64_t, int64_t);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// float32 with AVX: 8-lane blocks, all taps accumulated in registers before one store.
template <Reduce R>
__attribute__((target("avx2"), always_inline)) inline __m256 op(__m256 a, __m256 b) {
  if constexpr (R == Reduce::Max)
    return _mm256_max_ps(b, a);  // b > a ? b : a, like the scalar code
  else
    return _mm256_add_ps(a, b);
}

template <Reduce R>
__attribute__((target("avx2"))) void row_reduce_avx2(float* acc, const float* base, const int64_t* off, int64_t taps,
                                                     int64_t n) {
  int64_t ow = 0;
  for (; ow + 16 <= n; ow += 16) {
    __m256 a0 = _mm256_loadu_ps(base + off[0] + ow), a1 = _mm256_loadu_ps(base + off[0] + ow + 8);
    for (int64_t t = 1; t < taps; ++t) {
      a0 = op<R>(a0, _mm256_loadu_ps(base + off[t] + ow));
      a1 = op<R>(a1, _mm256_loadu_ps(base + off[t] + ow + 8));
    }
    _mm256_storeu_ps(acc + ow, a0);
    _mm256_storeu_ps(acc + ow + 8, a1);
  }
  for (; ow + 8 <= n; ow += 8) {
    __m256 a0 = _mm256_loadu_ps(base + off[0] + ow);
    for (int64_t t = 1; t < taps; ++t) a0 = op<R>(a0, _mm256_loadu_ps(base + off[t] + ow));
    _mm256_storeu_ps(acc + ow, a0);
  }
  if (ow < n) row_reduce_plain<float, R>(acc + ow, base + ow, off, taps, n - ow);
}
#endif

template <typename T, Reduce R>
RowReduceFn<T> pick_row_reduce() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if constexpr (std::is_same_v<T, float>) {
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) return row_reduce_avx2<R>;
  }
#endif
  return row_reduce_plain<T, R>;
}

// Per output index of one dimension: 1 / (number of taps counted by the average).
template <typename T>
std::vector<T> inverse_counts(const DimTaps& t, bool count_include_pad) {
  std::vector<T> v(t.lo.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t n = count_include_pad ? t.padded[i] : t.hi[i] - t.lo[i];
    v[i] = n > 0 ? T(1) / static_cast<T>(n) : T(0);
  }
  return v;
}

// kind: Max, Average (scaled by inverse counts) or Lp (root of the sum).
enum class Finish { None, Average, Root };

template <typename T, Reduce R>
void pool2d(ThreadPool& pool, const PoolPlan& pp, const T* x, T* y, int64_t planes, Finish finish,
            bool count_include_pad, double pw) {
  const Plane2D p = make_plane(pp.g);
  const int64_t taps = static_cast<int64_t>(p.tap_off.size());
  const T pad = R == Reduce::Max ? (std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                                          : std::numeric_limits<T>::lowest())
                                 : T(0);
  std::vector<T> inv_h, inv_w;
  if (finish == Finish::Average) {
    inv_h = inverse_counts<T>(pp.t[1], count_include_pad);
    inv_w = inverse_counts<T>(pp.t[2], count_include_pad);
  }
  const int64_t in_plane = p.H * p.W, out_plane = p.OH * p.OW;
  const RowReduceFn<T> row_fn = pick_row_reduce<T, R>();
  for_planes(pool, planes, out_plane * taps, [&](int64_t lo, int64_t hi) {
    std::vector<T> buf(static_cast<size_t>(p.Hp * p.row_stride)), line(static_cast<size_t>(p.row_stride));
    for (int64_t plane = lo; plane < hi; ++plane) {
      fill_plane<T, R>(x + plane * in_plane, buf.data(), line.data(), p, pad, pw);
      for (int64_t oh = 0; oh < p.OH; ++oh) {
        const T* base = buf.data() + oh * p.sh * p.row_stride;
        T* __restrict acc = y + plane * out_plane + oh * p.OW;
        row_fn(acc, base, p.tap_off.data(), taps, p.OW);
        if constexpr (R != Reduce::Max) {
          if (finish == Finish::Average) {
            const T ih = inv_h[static_cast<size_t>(oh)];
            const T* __restrict iw = inv_w.data();
            for (int64_t ow = 0; ow < p.OW; ++ow) acc[ow] *= ih * iw[ow];
          } else if (finish == Finish::Root) {
            if constexpr (R == Reduce::SumSquares) {
              for (int64_t ow = 0; ow < p.OW; ++ow) acc[ow] = std::sqrt(acc[ow]);
            } else if constexpr (R == Reduce::SumPow) {
              for (int64_t ow = 0; ow < p.OW; ++ow) acc[ow] = static_cast<T>(std::pow(static_cast<double>(acc[ow]), 1.0 / pw));
            }
          }
        }
      }
    }
  });
}

// ---------------------------------------------------------------- MaxPool

// MaxPool 2x2 with stride 2, no padding, no dilation and no partial window (the downsampling of
// U-Net and VGG-style networks): each output is the max of four inputs, read straight from the
// plane. The general path first copies every plane into a padded buffer split into stride phases,
// which for so small a window cost more than the max itself (U-Net at batch 1: 9-11 us per
// MaxPool). The taps are taken in the general path's order, (0,0), (0,1), (1,0), (1,1), with its
// rule (`v > best ? v : best`: a NaN tap is kept only when it comes first), so the bits are the
// same.
bool is_max_pool_2x2(const PoolPlan& pp) {
  const Window3& g = pp.g;
  return is_2d(g) && g.k[1] == 2 && g.k[2] == 2 && g.s[1] == 2 && g.s[2] == 2 && g.d[1] == 1 && g.d[2] == 1 &&
         g.pb[1] == 0 && g.pb[2] == 0 && 2 * g.out[1] <= g.in[1] && 2 * g.out[2] <= g.in[2];
}

template <typename T>
inline T max_tap(T best, T v) {
  return v > best ? v : best;
}

// Output columns [from, OW) of one output row, from input rows r0 and r1 (r1 = r0 + W).
template <typename T>
void max_pool_2x2_row_plain(const T* r0, const T* r1, T* y, int64_t from, int64_t OW) {
  for (int64_t ow = from; ow < OW; ++ow) {
    T best = r0[2 * ow];
    best = max_tap(best, r0[2 * ow + 1]);
    best = max_tap(best, r1[2 * ow]);
    y[ow] = max_tap(best, r1[2 * ow + 1]);
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The even (imm 0x88) or odd (0xDD) columns of the 16 values x, z: the shuffle gives
// [x0 x2 z0 z2 | x4 x6 z4 z6], the permute puts the four 64-bit pairs in order.
template <int kImm>
__attribute__((target("avx2"), always_inline)) inline __m256 columns_avx2(__m256 x, __m256 z) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x, z, kImm)), 0xD8));
}

// float32, 8 outputs per step; _mm256_max_ps(v, best) is `v > best ? v : best` (NaN or equal: best).
__attribute__((target("avx2"))) void max_pool_2x2_row_avx2(const float* r0, const float* r1, float* y, int64_t OW) {
  int64_t ow = 0;
  for (; ow + 8 <= OW; ow += 8) {
    const __m256 a0 = _mm256_loadu_ps(r0 + 2 * ow), a1 = _mm256_loadu_ps(r0 + 2 * ow + 8);
    const __m256 b0 = _mm256_loadu_ps(r1 + 2 * ow), b1 = _mm256_loadu_ps(r1 + 2 * ow + 8);
    __m256 best = columns_avx2<0x88>(a0, a1);
    best = _mm256_max_ps(columns_avx2<0xDD>(a0, a1), best);
    best = _mm256_max_ps(columns_avx2<0x88>(b0, b1), best);
    best = _mm256_max_ps(columns_avx2<0xDD>(b0, b1), best);
    _mm256_storeu_ps(y + ow, best);
  }
  max_pool_2x2_row_plain(r0, r1, y, ow, OW);
}
#endif

template <typename T>
void max_pool_2x2(ThreadPool& pool, const PoolPlan& pp, const T* x, T* y, int64_t planes) {
  const int64_t H = pp.g.in[1], W = pp.g.in[2], OH = pp.g.out[1], OW = pp.g.out[2];
  using RowFn = void (*)(const T*, const T*, T*, int64_t);
  RowFn row_fn = [](const T* r0, const T* r1, T* out, int64_t n) { max_pool_2x2_row_plain(r0, r1, out, 0, n); };
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if constexpr (std::is_same_v<T, float>) {
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) row_fn = max_pool_2x2_row_avx2;
  }
#endif
  for_planes(pool, planes, OH * OW * 4, [&](int64_t lo, int64_t hi) {
    for (int64_t plane = lo; plane < hi; ++plane)
      for (int64_t oh = 0; oh < OH; ++oh) {
        const T* r0 = x + (plane * H + 2 * oh) * W;
        row_fn(r0, r0 + W, y + (plane * OH + oh) * OW, OW);
      }
  });
}

template <typename T, bool kIndices>
void max_pool_typed(ThreadPool& pool, const PoolPlan& pp, const T* x, T* y, int64_t* idx, int64_t planes,
                    int storage_order) {
  const Window3& g = pp.g;
  const int64_t in_size = g.in_size(), out_size = g.out_size();
  const int64_t H = g.in[1], W = g.in[2], D = g.in[0];
  const T init = std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                       : std::numeric_limits<T>::lowest();
  for_each_plane(pool, planes, out_size * g.k_size(), [&](int64_t plane) {
    const T* xp = x + plane * in_size;
    T* yp = y + plane * out_size;
    int64_t* ip = kIndices ? idx + plane * out_size : nullptr;
    int64_t o = 0;
    for (int64_t od = 0; od < g.out[0]; ++od)
      for (int64_t oh = 0; oh < g.out[1]; ++oh)
        for (int64_t ow = 0; ow < g.out[2]; ++ow, ++o) {
          T best = init;
          int64_t bi = -1;
          for (int64_t kd = pp.t[0].lo[od]; kd < pp.t[0].hi[od]; ++kd) {
            const int64_t id = pp.t[0].start[od] + kd * g.d[0];
            for (int64_t kh = pp.t[1].lo[oh]; kh < pp.t[1].hi[oh]; ++kh) {
              const int64_t ih = pp.t[1].start[oh] + kh * g.d[1];
              const T* row = xp + (id * H + ih) * W;
              const int64_t w0 = pp.t[2].start[ow];
              for (int64_t kw = pp.t[2].lo[ow]; kw < pp.t[2].hi[ow]; ++kw) {
                const int64_t iw = w0 + kw * g.d[2];
                const T v = row[iw];
                if constexpr (kIndices) {
                  if (v > best || bi < 0) {
                    best = v;
                    bi = storage_order == 0 ? (id * H + ih) * W + iw : (iw * H + ih) * D + id;
                  }
                } else {
                  best = v > best ? v : best;
                }
              }
            }
          }
          yp[o] = best;
          if constexpr (kIndices) ip[o] = plane * in_size + bi;
        }
  });
}

void max_pool_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  PoolPlan pp = make_plan(ctx, x);
  const bool want_idx = ctx.output_wanted(1);
  const int storage_order = static_cast<int>(ctx.node().attr_int("storage_order", 0));
  if (storage_order != 0 && storage_order != 1) ctx.fail("storage_order must be 0 or 1, got {}", storage_order);
  if (pp.win.rank() > 3) {
    if (!dtype_is_float(x.dtype())) ctx.fail_unsupported("MaxPool over more than 3 spatial dimensions needs a float input");
    Tensor indices;
    ctx.set_output(0, max_pool_ref(x, to_geometry(pp.win, ctx.node().attr_int("ceil_mode", 0) != 0),
                                   want_idx ? &indices : nullptr, storage_order));
    if (want_idx) ctx.set_output(1, indices);
    return;
  }
  const Shape yshape = pooled_shape(x, pp.win);
  Tensor& y = ctx.alloc_output(0, x.dtype(), yshape);
  int64_t* ip = want_idx ? ctx.alloc_output(1, DType::Int64, yshape).data<int64_t>() : nullptr;
  const int64_t planes = x.dim(0) * x.dim(1);
  visit_arith(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (want_idx)
      max_pool_typed<T, true>(ctx.pool(), pp, x.data<T>(), y.data<T>(), ip, planes, storage_order);
    else if (is_max_pool_2x2(pp))
      max_pool_2x2<T>(ctx.pool(), pp, x.data<T>(), y.data<T>(), planes);
    else if (is_2d(pp.g))
      pool2d<T, Reduce::Max>(ctx.pool(), pp, x.data<T>(), y.data<T>(), planes, Finish::None, false, 1.0);
    else
      max_pool_typed<T, false>(ctx.pool(), pp, x.data<T>(), y.data<T>(), nullptr, planes, storage_order);
  });
}

// ---------------------------------------------------------------- AveragePool, LpPool

enum class SumKind { Average, Lp };

template <typename T>
void sum_pool_typed(ThreadPool& pool, const PoolPlan& pp, const T* x, T* y, int64_t planes, SumKind kind,
                    bool count_include_pad, double p) {
  const Window3& g = pp.g;
  const int64_t in_size = g.in_size(), out_size = g.out_size();
  const int64_t H = g.in[1], W = g.in[2];
  const bool p2 = p == 2.0, p1 = p == 1.0;
  for_each_plane(pool, planes, out_size * g.k_size(), [&](int64_t plane) {
    const T* xp = x + plane * in_size;
    T* yp = y + plane * out_size;
    int64_t o = 0;
    for (int64_t od = 0; od < g.out[0]; ++od)
      for (int64_t oh = 0; oh < g.out[1]; ++oh)
        for (int64_t ow = 0; ow < g.out[2]; ++ow, ++o) {
          T acc = 0;
          for (int64_t kd = pp.t[0].lo[od]; kd < pp.t[0].hi[od]; ++kd) {
            const int64_t id = pp.t[0].start[od] + kd * g.d[0];
            for (int64_t kh = pp.t[1].lo[oh]; kh < pp.t[1].hi[oh]; ++kh) {
              const int64_t ih = pp.t[1].start[oh] + kh * g.d[1];
              const T* row = xp + (id * H + ih) * W + pp.t[2].start[ow];
              const int64_t dw = g.d[2];
              if (kind == SumKind::Average) {
                for (int64_t kw = pp.t[2].lo[ow]; kw < pp.t[2].hi[ow]; ++kw) acc += row[kw * dw];
              } else if (p2) {
                for (int64_t kw = pp.t[2].lo[ow]; kw < pp.t[2].hi[ow]; ++kw) acc += row[kw * dw] * row[kw * dw];
              } else if (p1) {
                for (int64_t kw = pp.t[2].lo[ow]; kw < pp.t[2].hi[ow]; ++kw) acc += std::fabs(row[kw * dw]);
              } else {
                for (int64_t kw = pp.t[2].lo[ow]; kw < pp.t[2].hi[ow]; ++kw)
                  acc += static_cast<T>(std::pow(std::fabs(static_cast<double>(row[kw * dw])), p));
              }
            }
          }
          if (kind == SumKind::Average) {
            const int64_t n = count_include_pad
                                  ? pp.t[0].padded[od] * pp.t[1].padded[oh] * pp.t[2].padded[ow]
                                  : (pp.t[0].hi[od] - pp.t[0].lo[od]) * (pp.t[1].hi[oh] - pp.t[1].lo[oh]) *
                                        (pp.t[2].hi[ow] - pp.t[2].lo[ow]);
            yp[o] = n > 0 ? acc / static_cast<T>(n) : T(0);
          } else {
            yp[o] = p2 ? std::sqrt(acc) : p1 ? acc : static_cast<T>(std::pow(static_cast<double>(acc), 1.0 / p));
          }
        }
  });
}

// Lp norm order: an int from opset 2, a float in opset 1.
double read_p(const KernelContext& ctx) {
  const ir::Attribute* a = ctx.node().attr("p");
  double p = 2.0;
  if (a) p = a->type == ir::AttrType::Float ? static_cast<double>(a->f) : static_cast<double>(a->i);
  if (!(p > 0.0)) ctx.fail("p must be positive, got {}", p);
  return p;
}

void check_float_x(const KernelContext& ctx, const Tensor& x) {
  if (x.dtype() != DType::Float32 && x.dtype() != DType::Float64)
    ctx.fail("X must be a floating-point tensor, got {}", dtype_name(x.dtype()));
}

template <SumKind kind>
void sum_pool_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  check_float_x(ctx, x);
  PoolPlan pp = make_plan(ctx, x);
  const bool count_include_pad = ctx.node().attr_int("count_include_pad", 0) != 0;
  const double p = kind == SumKind::Lp ? read_p(ctx) : 1.0;
  if (pp.win.rank() > 3) {
    if (kind == SumKind::Lp) ctx.fail_unsupported("LpPool over more than 3 spatial dimensions is not implemented");
    ctx.set_output(0, avg_pool_ref(x, to_geometry(pp.win, ctx.node().attr_int("ceil_mode", 0) != 0), count_include_pad));
    return;
  }
  Tensor& y = ctx.alloc_output(0, x.dtype(), pooled_shape(x, pp.win));
  const int64_t planes = x.dim(0) * x.dim(1);
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    if (!is_2d(pp.g)) {
      sum_pool_typed<T>(ctx.pool(), pp, xp, yp, planes, kind, count_include_pad, p);
    } else if (kind == SumKind::Average) {
      pool2d<T, Reduce::Sum>(ctx.pool(), pp, xp, yp, planes, Finish::Average, count_include_pad, p);
    } else if (p == 2.0) {
      pool2d<T, Reduce::SumSquares>(ctx.pool(), pp, xp, yp, planes, Finish::Root, false, p);
    } else if (p == 1.0) {
      pool2d<T, Reduce::SumAbs>(ctx.pool(), pp, xp, yp, planes, Finish::Root, false, p);
    } else {
      pool2d<T, Reduce::SumPow>(ctx.pool(), pp, xp, yp, planes, Finish::Root, false, p);
    }
  };
  if (x.dtype() == DType::Float32)
    run(TypeTag<float>{});
  else
    run(TypeTag<double>{});
}

// ---------------------------------------------------------------- Global pools

enum class GlobalKind { Average, Max, Lp };

template <GlobalKind kind>
void global_pool_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 3) ctx.fail("X must have rank 3 or more (N, C, spatial...), got shape {}", shape_str(x.shape()));
  if (kind != GlobalKind::Max) check_float_x(ctx, x);
  const double p = kind == GlobalKind::Lp ? read_p(ctx) : 1.0;
  Shape yshape(x.shape().begin(), x.shape().begin() + 2);
  yshape.resize(static_cast<size_t>(x.rank()), 1);
  Tensor& y = ctx.alloc_output(0, x.dtype(), yshape);
  const int64_t planes = x.dim(0) * x.dim(1);
  const int64_t n = planes == 0 ? 0 : x.numel() / planes;
  if (n == 0 && kind == GlobalKind::Max && planes > 0) ctx.fail("GlobalMaxPool over an empty spatial extent");
  visit_arith(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    for_each_plane(ctx.pool(), planes, n, [&](int64_t plane) {
      const T* s = xp + plane * n;
      // Eight independent partial results so that the loops vectorise without reassociation.
      constexpr int64_t L = 8;
      const int64_t n8 = n / L * L;
      if constexpr (kind == GlobalKind::Max) {
        T m = s[0];
        if (n8 > 0) {
          T part[L];
          for (int64_t j = 0; j < L; ++j) part[j] = s[j];
          for (int64_t i = L; i < n8; i += L)
            for (int64_t j = 0; j < L; ++j) part[j] = s[i + j] > part[j] ? s[i + j] : part[j];
          for (int64_t j = 0; j < L; ++j) m = part[j] > m ? part[j] : m;
        }
        for (int64_t i = n8; i < n; ++i) m = s[i] > m ? s[i] : m;
        yp[plane] = m;
      } else if constexpr (std::is_floating_point_v<T>) {
        T acc = 0;
        if (kind == GlobalKind::Average) {
          T part[L] = {};
          for (int64_t i = 0; i < n8; i += L)
            for (int64_t j = 0; j < L; ++j) part[j] += s[i + j];
          for (int64_t j = 0; j < L; ++j) acc += part[j];
          for (int64_t i = n8; i < n; ++i) acc += s[i];
          yp[plane] = n > 0 ? acc / static_cast<T>(n) : T(0);
        } else if (p == 2.0) {
          for (int64_t i = 0; i < n; ++i) acc += s[i] * s[i];
          yp[plane] = std::sqrt(acc);
        } else {
          for (int64_t i = 0; i < n; ++i) acc += static_cast<T>(std::pow(std::fabs(static_cast<double>(s[i])), p));
          yp[plane] = static_cast<T>(std::pow(static_cast<double>(acc), 1.0 / p));
        }
      }
    });
  });
}

// ---------------------------------------------------------------- MaxUnpool

void max_unpool_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  if (x.rank() < 3) ctx.fail("X must have rank 3 or more (N, C, spatial...), got shape {}", shape_str(x.shape()));
  if (ind.dtype() != DType::Int64) ctx.fail("I must be int64, got {}", dtype_name(ind.dtype()));
  if (ind.shape() != x.shape()) ctx.fail("I {} must have the shape of X {}", shape_str(ind.shape()), shape_str(x.shape()));
  const size_t k = static_cast<size_t>(x.rank() - 2);
  std::vector<int64_t> kernel = ctx.node().attr_ints("kernel_shape", {});
  if (kernel.size() != k) ctx.fail("kernel_shape must have {} values, got {}", k, kernel.size());
  std::vector<int64_t> strides = ctx.node().attr_ints("strides", {});
  if (strides.empty()) strides.assign(k, 1);
  std::vector<int64_t> pads = ctx.node().attr_ints("pads", {});
  if (pads.empty()) pads.assign(2 * k, 0);
  if (strides.size() != k || pads.size() != 2 * k) ctx.fail("strides/pads do not match {} spatial dimensions", k);
  Shape yshape{x.dim(0), x.dim(1)};
  for (size_t d = 0; d < k; ++d) {
    if (strides[d] <= 0 || kernel[d] <= 0) ctx.fail("kernel_shape and strides must be positive");
    yshape.push_back((x.dim(static_cast<int>(d) + 2) - 1) * strides[d] + kernel[d] - pads[d] - pads[k + d]);
  }
  if (ctx.has_input(2)) {
    std::vector<int64_t> os = input_ints(ctx, 2);
    if (os.size() != yshape.size()) ctx.fail("output_shape has {} values, expected {}", os.size(), yshape.size());
    if (os[0] != yshape[0] || os[1] != yshape[1]) ctx.fail("output_shape {} must keep N and C", shape_str(os));
    for (size_t d = 2; d < os.size(); ++d)
      if (os[d] < yshape[d]) ctx.fail("output_shape {} is smaller than the default {}", shape_str(os), shape_str(yshape));
    yshape = os;
  }
  for (int64_t d : yshape)
    if (d < 0) ctx.fail("the output shape {} is negative", shape_str(yshape));
  Tensor& y = ctx.alloc_output(0, x.dtype(), yshape);
  const int64_t total = y.numel();
  const int64_t* ip = ind.data<int64_t>();
  visit_by_width(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = static_cast<const T*>(x.raw_data());
    T* yp = static_cast<T*>(y.raw_data());
    std::fill(yp, yp + total, T(0));
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (ip[i] < 0 || ip[i] >= total) ctx.fail("index {} is outside the output of {} elements", ip[i], total);
      yp[ip[i]] = xp[i];
    }
  });
}

}  // namespace

void register_pool(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  r.add_fn("", "MaxPool", 1, kMaxOpset, cpu, max_pool_kernel);
  r.add_fn("", "AveragePool", 1, kMaxOpset, cpu, sum_pool_kernel<SumKind::Average>);
  r.add_fn("", "LpPool", 1, kMaxOpset, cpu, sum_pool_kernel<SumKind::Lp>);
  r.add_fn("", "GlobalAveragePool", 1, kMaxOpset, cpu, global_pool_kernel<GlobalKind::Average>);
  r.add_fn("", "GlobalMaxPool", 1, kMaxOpset, cpu, global_pool_kernel<GlobalKind::Max>);
  r.add_fn("", "GlobalLpPool", 1, kMaxOpset, cpu, global_pool_kernel<GlobalKind::Lp>);
  // Moves elements without arithmetic: serves float16/bfloat16 natively.
  r.add_fn("", "MaxUnpool", 1, kMaxOpset, cpu, max_unpool_kernel, /*native_low_precision=*/true);
}

}  // namespace mpq::rt::cpu
