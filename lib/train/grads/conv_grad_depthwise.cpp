// Direct backward of a depthwise convolution (one input channel per group) on the stride-phase grid
// of conv_grad_internal.h: each input plane is zero-padded and split by stride phase once, and dY's
// plane is laid on the grid (zeros in its extra columns), so every window tap is one contiguous run
// over all output positions of the plane, whatever the stride, dilation or padding:
//   dW[m, t] = sum over images of dot(dY on the grid, the run of tap t in X's phases);
//   dX       = the phases of dX, built by adding w[m, t] * (dY on the grid) onto the run of tap t,
//              then added back out of the padding and phases.
#include <algorithm>
#include <type_traits>
#include <vector>
#ifdef __x86_64__
#include <immintrin.h>
#endif

#include "train/grads/conv_grad_internal.h"

namespace mpq::train::grads {

namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MPQ_DW_GRAD_AVX2 1
#define MPQ_INLINE inline __attribute__((always_inline))
#else
#define MPQ_INLINE inline
#endif

// acc[t] += sum_i y[i] * x[off[t] + i] for the taps t < taps, over n8 elements (a multiple of 8),
// each in eight independent partial sums (so that the loops vectorise without reassociation: the
// order is fixed). kTaps > 0 fixes the tap count at compile time so that the partial sums of every
// tap stay in registers and y is loaded once for all of them.
template <typename T>
MPQ_INLINE double finish_lanes(const T* l) {
  return static_cast<double>(((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])));
}

template <typename T>
MPQ_INLINE void tap_dots(const T* __restrict y, const T* __restrict x, const int64_t* off, int64_t taps, int64_t n8,
                         double* acc) {
  for (int64_t t = 0; t < taps; ++t) {
    T lanes[8] = {};
    const T* xt = x + off[t];
    for (int64_t i = 0; i < n8; i += 8)
      for (int j = 0; j < 8; ++j) lanes[j] += y[i + j] * xt[i + j];
    acc[t] += finish_lanes(lanes);
  }
}

#ifdef MPQ_DW_GRAD_AVX2
// tap_dots for float with AVX: four taps at a time share each load of y. Lane j of a vector sums
// the same elements in the same order as lanes[j] above (multiply, then add), so the bits agree.
__attribute__((target("avx2"))) void tap_dots_avx2(const float* __restrict y, const float* __restrict x,
                                                   const int64_t* off, int64_t taps, int64_t n8, double* acc) {
  int64_t t = 0;
  for (; t + 4 <= taps; t += 4) {
    const float *x0 = x + off[t], *x1 = x + off[t + 1], *x2 = x + off[t + 2], *x3 = x + off[t + 3];
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int64_t i = 0; i < n8; i += 8) {
      const __m256 v = _mm256_loadu_ps(y + i);
      a0 = _mm256_add_ps(a0, _mm256_mul_ps(v, _mm256_loadu_ps(x0 + i)));
      a1 = _mm256_add_ps(a1, _mm256_mul_ps(v, _mm256_loadu_ps(x1 + i)));
      a2 = _mm256_add_ps(a2, _mm256_mul_ps(v, _mm256_loadu_ps(x2 + i)));
      a3 = _mm256_add_ps(a3, _mm256_mul_ps(v, _mm256_loadu_ps(x3 + i)));
    }
    alignas(32) float l[4][8];
    _mm256_store_ps(l[0], a0);
    _mm256_store_ps(l[1], a1);
    _mm256_store_ps(l[2], a2);
    _mm256_store_ps(l[3], a3);
    for (int k = 0; k < 4; ++k) acc[t + k] += finish_lanes(l[k]);
  }
  for (; t < taps; ++t) {
    const float* xt = x + off[t];
    __m256 a = _mm256_setzero_ps();
    for (int64_t i = 0; i < n8; i += 8) a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(xt + i)));
    alignas(32) float l[8];
    _mm256_store_ps(l, a);
    acc[t] += finish_lanes(l);
  }
}
#endif

template <typename T>
MPQ_INLINE void axpy(T* __restrict dst, T a, const T* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += a * src[i];
}

// dY's plane (OH x OW) on the grid: row r at r * Wq. The Wq - OW extra columns between rows are
// never written: the caller zeroes the buffer once.
template <typename T>
void to_grid(const T* src, int64_t OH, int64_t OW, int64_t Wq, T* dst) {
  for (int64_t r = 0; r < OH; ++r) copy_row(src + r * OW, dst + r * Wq, OW);
}

struct DwShape {
  int64_t n, c, mult, H, W, OH, OW, pt, pl;
  int64_t Hq, plane_q, chan, len, taps;
  int64_t len8;                 // len rounded up to whole vectors of 8
  std::vector<int64_t> tap_at;  // where each tap's run starts in a channel's phases
};

// dW of channel ci (mult * taps weights), summed over the images in order.
template <typename T, typename Dots>
MPQ_INLINE void channel_weights(const DwShape& s, const Grid& grid, const T* x, const T* dy, T* dw, int64_t ci,
                                T* phases, T* dyg, double* acc, Dots dots) {
  const int64_t in_plane = s.H * s.W, out_plane = s.OH * s.OW, k = s.mult * s.taps;
  std::fill(acc, acc + k, 0.0);
  for (int64_t img = 0; img < s.n; ++img) {
    fill_phases(x + (img * s.c + ci) * in_plane, s.H, s.W, s.pt, s.pl, 0, s.Hq, grid, phases);
    for (int64_t mi = 0; mi < s.mult; ++mi) {
      to_grid(dy + ((img * s.c + ci) * s.mult + mi) * out_plane, s.OH, s.OW, grid.Wq, dyg);
      dots(dyg, phases, s.tap_at.data(), s.taps, s.len8, acc + mi * s.taps);
    }
  }
  for (int64_t i = 0; i < k; ++i) dw[ci * k + i] = static_cast<T>(acc[i]);
}

// dX of plane (image, channel) `plane`.
template <typename T>
MPQ_INLINE void plane_input(const DwShape& s, const Grid& grid, const T* w, const T* dy, T* dx, int64_t plane, T* phases,
                            T* dyg) {
  const int64_t ci = plane % s.c, in_plane = s.H * s.W, out_plane = s.OH * s.OW;
  std::fill(phases, phases + s.chan, T(0));
  for (int64_t mi = 0; mi < s.mult; ++mi) {
    to_grid(dy + (plane * s.mult + mi) * out_plane, s.OH, s.OW, grid.Wq, dyg);
    const T* wm = w + (ci * s.mult + mi) * s.taps;
    for (int64_t t = 0; t < s.taps; ++t) axpy(phases + s.tap_at[static_cast<size_t>(t)], wm[t], dyg, s.len);
  }
  T* out = dx + plane * in_plane;
  std::fill(out, out + in_plane, T(0));
  add_phases(phases, s.H, s.W, s.pt, s.pl, 0, s.Hq, grid, out);
}

template <typename T>
using ChannelWeightsFn = void (*)(const DwShape&, const Grid&, const T*, const T*, T*, int64_t, T*, T*, double*);
template <typename T>
using PlaneInputFn = void (*)(const DwShape&, const Grid&, const T*, const T*, T*, int64_t, T*, T*);

template <typename T>
void channel_weights_plain(const DwShape& s, const Grid& grid, const T* x, const T* dy, T* dw, int64_t ci, T* phases,
                           T* dyg, double* acc) {
  channel_weights(s, grid, x, dy, dw, ci, phases, dyg, acc, tap_dots<T>);
}
template <typename T>
void plane_input_plain(const DwShape& s, const Grid& grid, const T* w, const T* dy, T* dx, int64_t plane, T* phases,
                       T* dyg) {
  plane_input(s, grid, w, dy, dx, plane, phases, dyg);
}

#ifdef MPQ_DW_GRAD_AVX2
// The same loops compiled for AVX2 (8 floats a vector instead of SSE2's 4), picked at run time: the
// build targets baseline x86-64. Different vector widths keep the summation order (eight fixed
// partial sums), so both give the same bits.
template <typename T>
__attribute__((target("avx2"))) void channel_weights_avx2(const DwShape& s, const Grid& grid, const T* x, const T* dy,
                                                          T* dw, int64_t ci, T* phases, T* dyg, double* acc) {
  if constexpr (std::is_same_v<T, float>)
    channel_weights(s, grid, x, dy, dw, ci, phases, dyg, acc, tap_dots_avx2);
  else
    channel_weights(s, grid, x, dy, dw, ci, phases, dyg, acc, tap_dots<T>);
}
template <typename T>
__attribute__((target("avx2"))) void plane_input_avx2(const DwShape& s, const Grid& grid, const T* w, const T* dy, T* dx,
                                                      int64_t plane, T* phases, T* dyg) {
  plane_input(s, grid, w, dy, dx, plane, phases, dyg);
}

bool cpu_has_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2");
  return ok;
}
#endif

}  // namespace

template <typename T>
void depthwise_conv_backward(rt::ThreadPool& pool, const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t n,
                             int64_t c, int64_t mult, const rt::cpu::Window3& g) {
  const Grid grid = grid_of(g);
  DwShape s{n, c, mult, g.in[1], g.in[2], g.out[1], g.out[2], g.pb[1], g.pb[2], 0, 0, 0, 0, g.k_size(), 0, {}};
  s.Hq = grid.phase_rows(g, s.OH);
  s.plane_q = s.Hq * grid.Wq;
  s.chan = grid.sy * grid.sx * s.plane_q;
  s.len = (s.OH - 1) * grid.Wq + s.OW;  // grid positions of the output plane
  s.len8 = (s.len + 7) / 8 * 8;
  for (int64_t t = 0; t < s.taps; ++t)
    s.tap_at.push_back(grid.tap_phase[static_cast<size_t>(t)] * s.plane_q + grid.tap_off[static_cast<size_t>(t)]);
  // The dot products run over len8 elements: dY's grid buffer is zero past len, and the phases
  // buffer has room (zeros) for the last tap's run to read that far.
  const int64_t phases_size = s.chan + (s.len8 - s.len);
  ChannelWeightsFn<T> weights = channel_weights_plain<T>;
  PlaneInputFn<T> input = plane_input_plain<T>;
#ifdef MPQ_DW_GRAD_AVX2
  if (cpu_has_avx2()) {
    weights = channel_weights_avx2<T>;
    input = plane_input_avx2<T>;
  }
#endif
  if (dw) {
    // One task per channel: its mult * taps weights sum over every image in order.
    pool.parallel_for(c, 1, [&](int64_t lo, int64_t hi) {
      std::vector<T> phases(static_cast<size_t>(phases_size), T(0)), dyg(static_cast<size_t>(s.len8), T(0));
      std::vector<double> acc(static_cast<size_t>(mult * s.taps));
      for (int64_t ci = lo; ci < hi; ++ci) weights(s, grid, x, dy, dw, ci, phases.data(), dyg.data(), acc.data());
    });
  }
  if (dx) {
    const int64_t work = std::max<int64_t>(1, mult * s.taps * s.len);
    pool.parallel_for(n * c, std::max<int64_t>(1, 65536 / work), [&](int64_t lo, int64_t hi) {
      std::vector<T> phases(static_cast<size_t>(s.chan)), dyg(static_cast<size_t>(s.len), T(0));
      for (int64_t plane = lo; plane < hi; ++plane) input(s, grid, w, dy, dx, plane, phases.data(), dyg.data());
    });
  }
}

template void depthwise_conv_backward<float>(rt::ThreadPool&, const float*, const float*, const float*, float*, float*,
                                             int64_t, int64_t, int64_t, const rt::cpu::Window3&);
template void depthwise_conv_backward<double>(rt::ThreadPool&, const double*, const double*, const double*, double*,
                                              double*, int64_t, int64_t, int64_t, const rt::cpu::Window3&);

}  // namespace mpq::train::grads
