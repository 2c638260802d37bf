#pragma once
// Internal to the Conv / ConvTranspose backward (conv_grad.cpp, conv_grad_depthwise.cpp): short
// copies, the stride-phase grid both use, and the direct depthwise backward. Not a public API.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>
#ifdef __SSE2__
#include <immintrin.h>
#endif

#include "runtime/cpu/conv_common.h"
#include "runtime/thread_pool.h"

namespace mpq::train::grads {

// Copies n elements; rows here are a few dozen elements long, where a memcpy call costs as much as
// the copy (and GCC turns a plain loop into one).
inline void copy_row(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
#ifdef __SSE2__
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(dst + i, _mm_loadu_ps(src + i));
#endif
  for (; i < n; ++i) dst[i] = src[i];
}
inline void copy_row(const double* src, double* dst, int64_t n) {
  int64_t i = 0;
#ifdef __SSE2__
  for (; i + 2 <= n; i += 2) _mm_storeu_pd(dst + i, _mm_loadu_pd(src + i));
#endif
  for (; i < n; ++i) dst[i] = src[i];
}

template <typename T>
inline void copy_strided(const T* src, int64_t stride, T* dst, int64_t n) {
  if (stride == 1) {
    copy_row(src, dst, n);
  } else if (std::is_same_v<T, float> && stride == 2 && n >= 16) {
    // Its vector loop needs 9 elements or more; on shorter rows the call is all the cost.
    if constexpr (std::is_same_v<T, float>) rt::cpu::gather_stride2(src, dst, n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i * stride];
  }
}

// 1-D and 2-D windows take a faster im2col, as the forward's phase planes do. P's planes are first
// copied, zero-padded to the extent the windows read and split by stride phase: phase (py, px)
// holds padded rows py, py + sy, ... and columns px, px + sx, ..., Wq wide. On that grid, output
// position (oh, ow) is oh * Wq + ow, and window tap (kh, kw) reads phase (kh*dh % sy, kw*dw % sx)
// at a fixed offset from it, so column row (c, kh, kw) is one contiguous run of a phase plane: one
// long copy instead of a short one per output row, and col2im becomes long runs of additions. The
// grid has Wq - OW extra columns per output row; Q gets zeros there, so they add nothing to dW or
// to col2im, and W im2col(P) drops them.
struct Grid {
  bool on = false;
  int64_t sy = 1, sx = 1, Wq = 0;
  std::vector<int64_t> tap_phase, tap_off;  // per tap: phase (py * sx + px) and offset in its plane
  // Phase rows of a piece of `rows` output rows.
  int64_t phase_rows(const rt::cpu::Window3& g, int64_t rows) const {
    return rt::cpu::ceil_div((rows - 1) * sy + (g.k[1] - 1) * g.d[1] + 1, sy);
  }
};

inline Grid grid_of(const rt::cpu::Window3& g) {
  Grid r;
  if (g.in[0] != 1 || g.k[0] != 1 || g.out[0] != 1 || g.pb[0] != 0) return r;
  r.on = true;
  r.sy = g.s[1];
  r.sx = g.s[2];
  r.Wq = rt::cpu::ceil_div((g.out[2] - 1) * r.sx + (g.k[2] - 1) * g.d[2] + 1, r.sx);
  for (int64_t kh = 0; kh < g.k[1]; ++kh)
    for (int64_t kw = 0; kw < g.k[2]; ++kw) {
      const int64_t ty = kh * g.d[1], tx = kw * g.d[2];
      r.tap_phase.push_back((ty % r.sy) * r.sx + tx % r.sx);
      r.tap_off.push_back(ty / r.sy * r.Wq + tx / r.sx);
    }
  return r;
}

// Calls fn(row i of phase (py, px), input row ih, first and end column j_lo, j_hi inside the input,
// input column of j = 0) for the phase rows of a plane W wide whose padded row 0 is input row r0 - pt.
template <typename F>
inline void for_phase_rows(const Grid& grid, int64_t W, int64_t pt, int64_t pl, int64_t r0, int64_t Hq, F&& fn) {
  for (int64_t py = 0; py < grid.sy; ++py)
    for (int64_t px = 0; px < grid.sx; ++px) {
      const int64_t j_lo = std::clamp<int64_t>(rt::cpu::ceil_div(pl - px, grid.sx), 0, grid.Wq);
      const int64_t j_hi = std::clamp<int64_t>(rt::cpu::ceil_div(pl + W - px, grid.sx), j_lo, grid.Wq);
      const int64_t plane = (py * grid.sx + px) * Hq * grid.Wq;
      for (int64_t i = 0; i < Hq; ++i) fn(plane + i * grid.Wq, r0 + py + grid.sy * i - pt, j_lo, j_hi, px - pl);
    }
}

// The phase planes of one H x W plane for a piece starting at padded row r0 (zero outside it).
template <typename T>
inline void fill_phases(const T* src, int64_t H, int64_t W, int64_t pt, int64_t pl, int64_t r0, int64_t Hq, const Grid& grid,
                 T* dst) {
  for_phase_rows(grid, W, pt, pl, r0, Hq, [&](int64_t at, int64_t ih, int64_t j_lo, int64_t j_hi, int64_t c0) {
    T* row = dst + at;
    if (ih < 0 || ih >= H) {
      std::fill(row, row + grid.Wq, T(0));
      return;
    }
    std::fill(row, row + j_lo, T(0));
    copy_strided(src + ih * W + c0 + j_lo * grid.sx, grid.sx, row + j_lo, j_hi - j_lo);
    std::fill(row + j_hi, row + grid.Wq, T(0));
  });
}

// The transpose of fill_phases: dst[input position] += the phase-plane element holding it.
template <typename T>
inline void add_phases(const T* src, int64_t H, int64_t W, int64_t pt, int64_t pl, int64_t r0, int64_t Hq, const Grid& grid,
                T* dst) {
  for_phase_rows(grid, W, pt, pl, r0, Hq, [&](int64_t at, int64_t ih, int64_t j_lo, int64_t j_hi, int64_t c0) {
    if (ih < 0 || ih >= H) return;
    const T* __restrict row = src + at;
    T* __restrict out = dst + ih * W + c0;
    const int64_t sx = grid.sx;
    if (sx == 1) {
      for (int64_t j = j_lo; j < j_hi; ++j) out[j] += row[j];
    } else {
      for (int64_t j = j_lo; j < j_hi; ++j) out[j * sx] += row[j];
    }
  });
}


// Backward of a depthwise Conv (group == C, W [C*mult, 1, KH, KW]) over 1-D or 2-D windows (1-D
// passes in[1] = k[1] = out[1] = 1 in the leading slots of g, as rt::cpu::to_window3 does).
// x [N, C, H, W] and dw [C*mult, KH*KW] are read / written only when dw is not null; w and dx
// likewise. Each dW element sums over the images in order, each dX plane is written by one task:
// the results do not depend on the thread count.
template <typename T>
void depthwise_conv_backward(rt::ThreadPool& pool, const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t n,
                             int64_t c, int64_t mult, const rt::cpu::Window3& g);

extern template void depthwise_conv_backward<float>(rt::ThreadPool&, const float*, const float*, const float*, float*,
                                                    float*, int64_t, int64_t, int64_t, const rt::cpu::Window3&);
extern template void depthwise_conv_backward<double>(rt::ThreadPool&, const double*, const double*, const double*,
                                                     double*, double*, int64_t, int64_t, int64_t,
                                                     const rt::cpu::Window3&);

// True for the windows depthwise_conv_backward serves (at most two spatial dimensions).
inline bool depthwise_backward_applies(const rt::cpu::Window3& g) {
  return g.in[0] == 1 && g.k[0] == 1 && g.out[0] == 1 && g.pb[0] == 0;
}

}  // namespace mpq::train::grads
