// Backward of MaxPool, AveragePool, GlobalAveragePool and GlobalMaxPool over 1 to 3 spatial
// dimensions, with the forward's windows (runtime/cpu/pool.cpp: strides, dilations, pads, auto_pad,
// ceil_mode through rt::cpu::forward_window).
//   MaxPool: dY goes to the input element the forward picked: the first maximum of the window in
//   row-major tap order, never the padding. The argmax is found again from X (the only value saved);
//   the optional Indices output carries no gradient.
//   AveragePool: dY / count goes to every tap inside the input, count as the forward divides by
//   (count_include_pad: the taps inside the padded input, the ceil_mode overhang never counting).
// Each (image, channel) plane is one task that adds its windows' contributions in a fixed order, so
// the gradients do not depend on the thread count. 1-D and 2-D windows run row by row (long inner
// loops over output columns), 3-D ones window by window; MaxPool's 2x2 stride-2 tiles have their
// own kernel.
#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>
#ifdef __SSE2__
#include <immintrin.h>
#endif

#include "runtime/cpu/conv_common.h"
#include "train/grads/grad_util.h"
#include "train/grads/register_all_grads.h"

namespace mpq::train::grads {

namespace {

using grad_util::visit_float;
using rt::cpu::ceil_div;
using rt::cpu::floor_div;
using rt::cpu::Window3;

// Per spatial dimension and output index: the first input position of the window, the taps
// [lo, hi) that fall inside the input and the number of taps inside the padded input.
struct DimTaps {
  std::vector<int64_t> start, lo, hi, padded;
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

struct PoolWindows {
  Window3 g;
  DimTaps t[3];
};

PoolWindows pool_windows(GradContext& ctx) {
  const Shape& xs = ctx.input_shape(0);
  if (xs.size() < 3) ctx.fail("X must have rank 3 or more (N, C, spatial...), got shape {}", shape_str(xs));
  const std::vector<int64_t> kernel = ctx.node().attr_ints("kernel_shape", {});
  if (kernel.empty()) ctx.fail("kernel_shape is required");
  const bool ceil_mode = ctx.node().attr_int("ceil_mode", 0) != 0;
  const rt::KernelContext kctx(ctx.node(), ctx.opset(), ctx.pool(), nullptr);
  const rt::cpu::Window win =
      rt::cpu::forward_window(kctx, std::vector<int64_t>(xs.begin() + 2, xs.end()), kernel, ceil_mode);
  if (win.rank() > 3)
    ctx.fail_unsupported("the {} backward takes 1 to 3 spatial dimensions, got {}", ctx.node().op_type, win.rank());
  PoolWindows p;
  p.g = rt::cpu::to_window3(win);
  for (int d = 0; d < 3; ++d) p.t[d] = dim_taps(p.g.in[d], p.g.out[d], p.g.k[d], p.g.s[d], p.g.d[d], p.g.pb[d], p.g.pe[d]);
  return p;
}

// Runs fn(plane) for the N * C planes on the pool.
template <typename F>
void for_planes(rt::ThreadPool& pool, int64_t planes, int64_t work_per_plane, F fn) {
  pool.parallel_for(planes, std::max<int64_t>(1, 32768 / std::max<int64_t>(work_per_plane, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) fn(p);
  });
}

// 1-D and 2-D windows (the common case) go row by row: for each output row, tap (kh, kw) is one
// run over the output columns, so the inner loops are long and free of index arithmetic.
bool is_2d(const Window3& g) { return g.in[0] == 1 && g.k[0] == 1 && g.out[0] == 1 && g.pb[0] == 0; }

// Per kw: the output columns [lo, hi) whose tap kw lies inside the input row.
struct ColumnTaps {
  std::vector<int64_t> lo, hi, off;  // off: input column of output column 0's tap
};

ColumnTaps column_taps(const Window3& g) {
  ColumnTaps c;
  for (int64_t kw = 0; kw < g.k[2]; ++kw) {
    const int64_t off = kw * g.d[2] - g.pb[2];
    const int64_t lo = std::clamp<int64_t>(ceil_div(-off, g.s[2]), 0, g.out[2]);
    c.lo.push_back(lo);
    c.hi.push_back(std::clamp<int64_t>(floor_div(g.in[2] - 1 - off, g.s[2]) + 1, lo, g.out[2]));
    c.off.push_back(off);
  }
  return c;
}

// One tap of a row of windows: b[ow] = max(b[ow], row[ow * s]) over [lo, hi), a[ow] following
// the element that wins (strictly greater only: earlier taps win ties). Without vector selects
// (SSE2 has none, and GCC turns the scalar select into a branch, which mispredicts on real data)
// this was four times PyTorch's time, hence the explicit SSE2 blocks for float.
template <typename T, int kStride>
void max_tap(const T* __restrict row, int64_t sw, int64_t lo, int64_t hi, int32_t base, T* __restrict b,
             int32_t* __restrict a) {
  const int64_t s = kStride > 0 ? kStride : sw;
  int64_t ow = lo;
#ifdef __SSE2__
  if constexpr (std::is_same_v<T, float> && kStride > 0) {
    const __m128i step = _mm_set1_epi32(4 * kStride);
    __m128i idx = _mm_add_epi32(_mm_set1_epi32(base + static_cast<int32_t>(lo * kStride)),
                                _mm_setr_epi32(0, kStride, 2 * kStride, 3 * kStride));
    // ow + 4 < hi keeps the stride-2 load (8 floats) inside the row's last window.
    for (; ow + 4 < hi; ow += 4, idx = _mm_add_epi32(idx, step)) {
      __m128 v;
      if constexpr (kStride == 1) {
        v = _mm_loadu_ps(row + ow);
      } else {
        v = _mm_shuffle_ps(_mm_loadu_ps(row + 2 * ow), _mm_loadu_ps(row + 2 * ow + 4), _MM_SHUFFLE(2, 0, 2, 0));
      }
      const __m128 cur = _mm_loadu_ps(b + ow);
      const __m128 take = _mm_cmpgt_ps(v, cur);
      _mm_storeu_ps(b + ow, _mm_or_ps(_mm_and_ps(take, v), _mm_andnot_ps(take, cur)));
      const __m128i t = _mm_castps_si128(take);
      const __m128i old = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + ow));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a + ow), _mm_or_si128(_mm_and_si128(t, idx), _mm_andnot_si128(t, old)));
    }
  }
#endif
  for (; ow < hi; ++ow) {
    const T v = row[ow * s];
    if (v > b[ow]) {
      b[ow] = v;
      a[ow] = base + static_cast<int32_t>(ow * s);
    }
  }
}

template <typename T>
void max_pool_backward_2d(rt::ThreadPool& pool, const PoolWindows& pw, const T* x, const T* dy, T* dx, int64_t planes) {
  const Window3& g = pw.g;
  const int64_t H = g.in[1], W = g.in[2], OH = g.out[1], OW = g.out[2], sw = g.s[2];
  const ColumnTaps ct = column_taps(g);
  // First tap inside the input row per output column (-1: none), so that a window of -inf still
  // sends its gradient to its first element, never to the padding.
  std::vector<int64_t> first_col(static_cast<size_t>(OW), -1);
  for (int64_t kw = g.k[2] - 1; kw >= 0; --kw)
    for (int64_t ow = ct.lo[static_cast<size_t>(kw)]; ow < ct.hi[static_cast<size_t>(kw)]; ++ow)
      first_col[static_cast<size_t>(ow)] = ow * sw + ct.off[static_cast<size_t>(kw)];
  auto tap = sw == 1 ? max_tap<T, 1> : sw == 2 ? max_tap<T, 2> : max_tap<T, 0>;
  for_planes(pool, planes, OH * OW * g.k_size(), [&](int64_t plane) {
    thread_local std::vector<T> best;
    thread_local std::vector<int32_t> at;
    best.resize(static_cast<size_t>(OW));
    at.resize(static_cast<size_t>(OW));
    const T* xp = x + plane * H * W;
    const T* gp = dy + plane * OH * OW;
    T* dp = dx + plane * H * W;
    std::fill(dp, dp + H * W, T(0));
    for (int64_t oh = 0; oh < OH; ++oh) {
      const int64_t kh0 = pw.t[1].lo[oh], kh1 = pw.t[1].hi[oh];
      const int64_t ih0 = pw.t[1].start[oh] + kh0 * g.d[1];
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t c = first_col[static_cast<size_t>(ow)];
        best[static_cast<size_t>(ow)] = -std::numeric_limits<T>::infinity();
        at[static_cast<size_t>(ow)] = kh0 < kh1 && c >= 0 ? static_cast<int32_t>(ih0 * W + c) : -1;
      }
      for (int64_t kh = kh0; kh < kh1; ++kh) {
        const int64_t ih = pw.t[1].start[oh] + kh * g.d[1];
        for (int64_t kw = 0; kw < g.k[2]; ++kw) {
          const int64_t off = ct.off[static_cast<size_t>(kw)];
          tap(xp + ih * W + off, sw, ct.lo[static_cast<size_t>(kw)], ct.hi[static_cast<size_t>(kw)],
              static_cast<int32_t>(ih * W + off), best.data(), at.data());
        }
      }
      const T* grow = gp + oh * OW;
      for (int64_t ow = 0; ow < OW; ++ow)
        if (at[static_cast<size_t>(ow)] >= 0) dp[at[static_cast<size_t>(ow)]] += grow[ow];
    }
  });
}

// 2x2 windows at stride 2 without padding or dilation (the pooling of most small CNNs) tile X:
// each window's four elements get dY or zero directly, with no zero fill and no scatter.
bool is_2x2_tiles(const Window3& g) {
  return is_2d(g) && g.k[1] == 2 && g.k[2] == 2 && g.s[1] == 2 && g.s[2] == 2 && g.d[1] == 1 && g.d[2] == 1 &&
         g.pb[1] == 0 && g.pb[2] == 0 && 2 * g.out[1] <= g.in[1] && 2 * g.out[2] <= g.in[2];
}

// Window (a b / c d): the first maximum in that order (strictly greater replaces).
template <typename T>
inline int first_max4(T a, T b, T c, T d) {
  int at = 0;
  T best = a;
  if (b > best) {
    best = b;
    at = 1;
  }
  if (c > best) {
    best = c;
    at = 2;
  }
  if (d > best) at = 3;
  return at;
}

template <typename T>
void max_pool_2x2_backward(rt::ThreadPool& pool, const Window3& g, const T* x, const T* dy, T* dx, int64_t planes) {
  const int64_t H = g.in[1], W = g.in[2], OH = g.out[1], OW = g.out[2];
  for_planes(pool, planes, H * W, [&](int64_t plane) {
    const T* xp = x + plane * H * W;
    const T* gp = dy + plane * OH * OW;
    T* dp = dx + plane * H * W;
    for (int64_t oh = 0; oh < OH; ++oh) {
      const T* r0 = xp + 2 * oh * W;
      const T* r1 = r0 + W;
      T* d0 = dp + 2 * oh * W;
      T* d1 = d0 + W;
      const T* gr = gp + oh * OW;
      int64_t ow = 0;
#ifdef __SSE2__
      if constexpr (std::is_same_v<T, float>) {
        // Four windows at once: split each row pair into even (left) and odd (right) columns.
        const __m128i one = _mm_set1_epi32(1), two = _mm_set1_epi32(2), three = _mm_set1_epi32(3);
        for (; ow + 4 <= OW; ow += 4) {
          const __m128 p0 = _mm_loadu_ps(r0 + 2 * ow), p1 = _mm_loadu_ps(r0 + 2 * ow + 4);
          const __m128 q0 = _mm_loadu_ps(r1 + 2 * ow), q1 = _mm_loadu_ps(r1 + 2 * ow + 4);
          const __m128 a = _mm_shuffle_ps(p0, p1, _MM_SHUFFLE(2, 0, 2, 0)), b = _mm_shuffle_ps(p0, p1, _MM_SHUFFLE(3, 1, 3, 1));
          const __m128 c = _mm_shuffle_ps(q0, q1, _MM_SHUFFLE(2, 0, 2, 0)), d = _mm_shuffle_ps(q0, q1, _MM_SHUFFLE(3, 1, 3, 1));
          __m128 best = a;
          __m128i at = _mm_setzero_si128();
          auto take = [&](__m128 v, __m128i code) {
            const __m128 t = _mm_cmpgt_ps(v, best);
            best = _mm_or_ps(_mm_and_ps(t, v), _mm_andnot_ps(t, best));
            const __m128i ti = _mm_castps_si128(t);
            at = _mm_or_si128(_mm_and_si128(ti, code), _mm_andnot_si128(ti, at));
          };
          take(b, one);
          take(c, two);
          take(d, three);
          const __m128 gv = _mm_loadu_ps(gr + ow);
          auto part = [&](__m128i code) { return _mm_and_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(at, code)), gv); };
          const __m128 ga = part(_mm_setzero_si128()), gb = part(one), gc = part(two), gd = part(three);
          _mm_storeu_ps(d0 + 2 * ow, _mm_unpacklo_ps(ga, gb));
          _mm_storeu_ps(d0 + 2 * ow + 4, _mm_unpackhi_ps(ga, gb));
          _mm_storeu_ps(d1 + 2 * ow, _mm_unpacklo_ps(gc, gd));
          _mm_storeu_ps(d1 + 2 * ow + 4, _mm_unpackhi_ps(gc, gd));
        }
      }
#endif
      for (; ow < OW; ++ow) {
        const int at = first_max4(r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]);
        d0[2 * ow] = at == 0 ? gr[ow] : T(0);
        d0[2 * ow + 1] = at == 1 ? gr[ow] : T(0);
        d1[2 * ow] = at == 2 ? gr[ow] : T(0);
        d1[2 * ow + 1] = at == 3 ? gr[ow] : T(0);
      }
      for (int64_t w = 2 * OW; w < W; ++w) d0[w] = d1[w] = T(0);  // a last odd column no window covers
    }
    std::fill(dp + 2 * OH * W, dp + H * W, T(0));  // a last odd row
  });
}

// Inverse tap counts per output index of one dimension, as the forward's 2-D path divides.
template <typename T>
std::vector<T> inverse_counts(const DimTaps& t, bool count_include_pad) {
  std::vector<T> v(t.lo.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t n = count_include_pad ? t.padded[i] : t.hi[i] - t.lo[i];
    v[i] = n > 0 ? T(1) / static_cast<T>(n) : T(0);
  }
  return v;
}

template <typename T>
void avg_pool_backward_2d(rt::ThreadPool& pool, const PoolWindows& pw, bool count_include_pad, const T* dy, T* dx,
                          int64_t planes) {
  const Window3& g = pw.g;
  const int64_t H = g.in[1], W = g.in[2], OH = g.out[1], OW = g.out[2], sw = g.s[2];
  const ColumnTaps ct = column_taps(g);
  const std::vector<T> inv_h = inverse_counts<T>(pw.t[1], count_include_pad);
  const std::vector<T> inv_w = inverse_counts<T>(pw.t[2], count_include_pad);
  for_planes(pool, planes, OH * OW * g.k_size(), [&](int64_t plane) {
    thread_local std::vector<T> share;
    share.resize(static_cast<size_t>(OW));
    const T* gp = dy + plane * OH * OW;
    T* dp = dx + plane * H * W;
    std::fill(dp, dp + H * W, T(0));
    for (int64_t oh = 0; oh < OH; ++oh) {
      const T ih_inv = inv_h[static_cast<size_t>(oh)];
      for (int64_t ow = 0; ow < OW; ++ow) share[static_cast<size_t>(ow)] = gp[oh * OW + ow] * (ih_inv * inv_w[static_cast<size_t>(ow)]);
      for (int64_t kh = pw.t[1].lo[oh]; kh < pw.t[1].hi[oh]; ++kh) {
        T* row = dp + (pw.t[1].start[oh] + kh * g.d[1]) * W;
        for (int64_t kw = 0; kw < g.k[2]; ++kw) {
          T* r = row + ct.off[static_cast<size_t>(kw)];
          const T* v = share.data();
          if (sw == 1) {
            for (int64_t ow = ct.lo[static_cast<size_t>(kw)]; ow < ct.hi[static_cast<size_t>(kw)]; ++ow) r[ow] += v[ow];
          } else {
            for (int64_t ow = ct.lo[static_cast<size_t>(kw)]; ow < ct.hi[static_cast<size_t>(kw)]; ++ow) r[ow * sw] += v[ow];
          }
        }
      }
    }
  });
}

template <typename T>
void max_pool_backward(rt::ThreadPool& pool, const PoolWindows& pw, const T* x, const T* dy, T* dx, int64_t planes) {
  const Window3& g = pw.g;
  const int64_t in_size = g.in_size(), out_size = g.out_size(), H = g.in[1], W = g.in[2];
  for_planes(pool, planes, out_size * g.k_size(), [&](int64_t plane) {
    const T* xp = x + plane * in_size;
    const T* gp = dy + plane * out_size;
    T* dp = dx + plane * in_size;
    std::fill(dp, dp + in_size, T(0));
    int64_t o = 0;
    for (int64_t od = 0; od < g.out[0]; ++od)
      for (int64_t oh = 0; oh < g.out[1]; ++oh)
        for (int64_t ow = 0; ow < g.out[2]; ++ow, ++o) {
          T best = T(0);
          int64_t at = -1;
          for (int64_t kd = pw.t[0].lo[od]; kd < pw.t[0].hi[od]; ++kd) {
            const int64_t id = pw.t[0].start[od] + kd * g.d[0];
            for (int64_t kh = pw.t[1].lo[oh]; kh < pw.t[1].hi[oh]; ++kh) {
              const int64_t row = (id * H + pw.t[1].start[oh] + kh * g.d[1]) * W + pw.t[2].start[ow];
              for (int64_t kw = pw.t[2].lo[ow]; kw < pw.t[2].hi[ow]; ++kw) {
                const int64_t i = row + kw * g.d[2];
                if (at < 0 || xp[i] > best) {
                  best = xp[i];
                  at = i;
                }
              }
            }
          }
          if (at >= 0) dp[at] += gp[o];
        }
  });
}

template <typename T>
void avg_pool_backward(rt::ThreadPool& pool, const PoolWindows& pw, bool count_include_pad, const T* dy, T* dx,
                       int64_t planes) {
  const Window3& g = pw.g;
  const int64_t in_size = g.in_size(), out_size = g.out_size(), H = g.in[1], W = g.in[2];
  for_planes(pool, planes, out_size * g.k_size(), [&](int64_t plane) {
    const T* gp = dy + plane * out_size;
    T* dp = dx + plane * in_size;
    std::fill(dp, dp + in_size, T(0));
    int64_t o = 0;
    for (int64_t od = 0; od < g.out[0]; ++od)
      for (int64_t oh = 0; oh < g.out[1]; ++oh)
        for (int64_t ow = 0; ow < g.out[2]; ++ow, ++o) {
          const int64_t n = count_include_pad ? pw.t[0].padded[od] * pw.t[1].padded[oh] * pw.t[2].padded[ow]
                                              : (pw.t[0].hi[od] - pw.t[0].lo[od]) * (pw.t[1].hi[oh] - pw.t[1].lo[oh]) *
                                                    (pw.t[2].hi[ow] - pw.t[2].lo[ow]);
          if (n <= 0) continue;
          const T v = gp[o] / static_cast<T>(n);
          for (int64_t kd = pw.t[0].lo[od]; kd < pw.t[0].hi[od]; ++kd) {
            const int64_t id = pw.t[0].start[od] + kd * g.d[0];
            for (int64_t kh = pw.t[1].lo[oh]; kh < pw.t[1].hi[oh]; ++kh) {
              T* row = dp + (id * H + pw.t[1].start[oh] + kh * g.d[1]) * W + pw.t[2].start[ow];
              for (int64_t kw = pw.t[2].lo[ow]; kw < pw.t[2].hi[ow]; ++kw) row[kw * g.d[2]] += v;
            }
          }
        }
  });
}

void max_pool_grad(GradContext& ctx) {
  const Tensor& dy = ctx.grad_output(0);
  const PoolWindows pw = pool_windows(ctx);
  const Shape& xs = ctx.input_shape(0);
  Tensor dx(dy.dtype(), xs);
  visit_float(dy.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (is_2x2_tiles(pw.g))
      max_pool_2x2_backward<T>(ctx.pool(), pw.g, ctx.input(0).data<T>(), dy.data<T>(), dx.data<T>(), xs[0] * xs[1]);
    else if (is_2d(pw.g) && pw.g.in_size() <= std::numeric_limits<int32_t>::max())
      max_pool_backward_2d<T>(ctx.pool(), pw, ctx.input(0).data<T>(), dy.data<T>(), dx.data<T>(), xs[0] * xs[1]);
    else
      max_pool_backward<T>(ctx.pool(), pw, ctx.input(0).data<T>(), dy.data<T>(), dx.data<T>(), xs[0] * xs[1]);
  });
  ctx.set_grad(0, std::move(dx));
}

void avg_pool_grad(GradContext& ctx) {
  const Tensor& dy = ctx.grad_output(0);
  const PoolWindows pw = pool_windows(ctx);
  const Shape& xs = ctx.input_shape(0);
  const bool count_include_pad = ctx.node().attr_int("count_include_pad", 0) != 0;
  Tensor dx(dy.dtype(), xs);
  visit_float(dy.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (is_2d(pw.g))
      avg_pool_backward_2d<T>(ctx.pool(), pw, count_include_pad, dy.data<T>(), dx.data<T>(), xs[0] * xs[1]);
    else
      avg_pool_backward<T>(ctx.pool(), pw, count_include_pad, dy.data<T>(), dx.data<T>(), xs[0] * xs[1]);
  });
  ctx.set_grad(0, std::move(dx));
}

// Planes of X for the global pools, and the elements of each.
std::pair<int64_t, int64_t> global_planes(GradContext& ctx) {
  const Shape& xs = ctx.input_shape(0);
  if (xs.size() < 3) ctx.fail("X must have rank 3 or more (N, C, spatial...), got shape {}", shape_str(xs));
  const int64_t planes = xs[0] * xs[1];
  return {planes, planes == 0 ? 0 : shape_numel(xs) / planes};
}

void global_avg_pool_grad(GradContext& ctx) {
  const Tensor& dy = ctx.grad_output(0);
  const auto [planes, n] = global_planes(ctx);
  Tensor dx(dy.dtype(), ctx.input_shape(0));
  visit_float(dy.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* gp = dy.data<T>();
    T* dp = dx.data<T>();
    for_planes(ctx.pool(), planes, n, [&](int64_t p) { std::fill(dp + p * n, dp + (p + 1) * n, gp[p] / static_cast<T>(n)); });
  });
  ctx.set_grad(0, std::move(dx));
}

void global_max_pool_grad(GradContext& ctx) {
  const Tensor& dy = ctx.grad_output(0);
  const auto [planes, n] = global_planes(ctx);
  Tensor dx(dy.dtype(), ctx.input_shape(0));
  visit_float(dy.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = ctx.input(0).data<T>();
    const T* gp = dy.data<T>();
    T* dp = dx.data<T>();
    for_planes(ctx.pool(), planes, n, [&](int64_t p) {
      const T* s = xp + p * n;
      T* d = dp + p * n;
      std::fill(d, d + n, T(0));
      if (n == 0) return;
      int64_t at = 0;
      for (int64_t i = 1; i < n; ++i)
        if (s[i] > s[at]) at = i;
      d[at] = gp[p];
    });
  });
  ctx.set_grad(0, std::move(dx));
}

}  // namespace

void register_pool_grads(GradRegistry& r) {
  auto add = [&](const char* op, GradFn fn, uint32_t saved_inputs) {
    GradDef d;
    d.op_type = op;
    d.fn = fn;
    d.differentiable = bit(0);
    d.saved_inputs = saved_inputs;
    r.add(std::move(d));
  };
  add("MaxPool", max_pool_grad, bit(0));  // the argmax is found again in X
  add("AveragePool", avg_pool_grad, 0);
  add("GlobalAveragePool", global_avg_pool_grad, 0);
  add("GlobalMaxPool", global_max_pool_grad, bit(0));
}

}  // namespace mpq::train::grads
