#pragma once
// Pooling and resize over the two trailing (spatial) dimensions of an NCHW tensor; one thread per
// output element (per input element for pooling's backward). Geometry is resolved on the host (explicit pads, output sizes computed by
// rt::cpu::pool_output_size / Resize's rules) so the bodies only index.
#include "kernels/hd.h"

namespace mpq::cuda {

// AveragePool's divisor for the window of output (oy, ox): the taps inside the input, or with
// count_include_pad those inside the padded input (never the ceil_mode overhang past the end
// padding), as rt::cpu::avg_pool_ref. The window is a product of a row and a column range, so the
// count is the product of the two per-axis counts. Shared by the forward and backward bodies.
MPQ_HD inline int64_t pool2d_window_count(const Pool2dGeom& g, bool count_include_pad, int64_t oy, int64_t ox) {
  const int64_t y_lo = count_include_pad ? -g.pad_t : 0, y_hi = count_include_pad ? g.ih + g.pad_b : g.ih;
  const int64_t x_lo = count_include_pad ? -g.pad_l : 0, x_hi = count_include_pad ? g.iw + g.pad_r : g.iw;
  int64_t rows = 0, cols = 0;
  for (int64_t ky = 0; ky < g.kh; ++ky) {
    const int64_t yy = oy * g.sh + ky * g.dh - g.pad_t;
    rows += yy >= y_lo && yy < y_hi;
  }
  for (int64_t kx = 0; kx < g.kw; ++kx) {
    const int64_t xx = ox * g.sw + kx * g.dw - g.pad_l;
    cols += xx >= x_lo && xx < x_hi;
  }
  return rows * cols;
}

// MaxPool (is_max) or AveragePool (divided by pool2d_window_count).
struct Pool2dBody {
  bool is_max;
  bool count_include_pad;
  Pool2dGeom g;
  const float* x;
  float* y;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t total = g.planes * g.oh * g.ow;
    for (int64_t i = t.global(); i < total; i += t.stride()) {
      const int64_t ox = i % g.ow, oy = (i / g.ow) % g.oh, p = i / (g.ow * g.oh);
      const float* plane = x + p * g.ih * g.iw;
      float m = 0.0f;
      bool any = false;
      double s = 0.0;
      for (int64_t ky = 0; ky < g.kh; ++ky) {
        const int64_t yy = oy * g.sh + ky * g.dh - g.pad_t;
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          const int64_t xx = ox * g.sw + kx * g.dw - g.pad_l;
          const bool inside = yy >= 0 && yy < g.ih && xx >= 0 && xx < g.iw;
          if (inside) {
            const float v = plane[yy * g.iw + xx];
            if (!any || v > m || hd_isnan(v)) m = hd_isnan(m) ? m : v;
            any = true;
            s += v;
          }
        }
      }
      const int64_t count = is_max ? 0 : pool2d_window_count(g, count_include_pad, oy, ox);
      y[i] = is_max ? m : (count > 0 ? static_cast<float>(s / static_cast<double>(count)) : 0.0f);
    }
  }
};

// Backward of Pool2dBody: one thread per input element, which gathers from the output windows
// that cover it (each tap (ky, kx) of the kernel names at most one such window), so every dX
// element has one writer and no atomics are needed. MaxPool: dY goes to the window's first
// maximum in row-major tap order, never the padding (strictly greater replaces, as
// lib/train/grads/pool_grad.cpp); AveragePool: dY / pool2d_window_count, as the forward divides.
struct Pool2dGradBody {
  bool is_max;
  bool count_include_pad;
  Pool2dGeom g;
  const float* x;  // MaxPool only: the argmax is found again from X
  const float* dy;
  float* dx;

  // Flat index (within the plane) of the window's first maximum, -1 when no tap is inside.
  MPQ_HD int64_t window_argmax(const float* plane, int64_t oy, int64_t ox) const {
    int64_t at = -1;
    float best = 0.0f;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t yy = oy * g.sh + ky * g.dh - g.pad_t;
      if (yy < 0 || yy >= g.ih) continue;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t xx = ox * g.sw + kx * g.dw - g.pad_l;
        if (xx < 0 || xx >= g.iw) continue;
        const float v = plane[yy * g.iw + xx];
        if (at < 0 || v > best) {
          best = v;
          at = yy * g.iw + xx;
        }
      }
    }
    return at;
  }

  MPQ_HD void operator()(const Thread& t) const {
    const int64_t total = g.planes * g.ih * g.iw;
    for (int64_t i = t.global(); i < total; i += t.stride()) {
      const int64_t ix = i % g.iw, iy = (i / g.iw) % g.ih, p = i / (g.iw * g.ih);
      const float* plane = x ? x + p * g.ih * g.iw : nullptr;
      const float* dplane = dy + p * g.oh * g.ow;
      double s = 0.0;
      for (int64_t ky = 0; ky < g.kh; ++ky) {
        const int64_t ny = iy + g.pad_t - ky * g.dh;  // oy * sh
        if (ny < 0 || ny % g.sh != 0 || ny / g.sh >= g.oh) continue;
        const int64_t oy = ny / g.sh;
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          const int64_t nx = ix + g.pad_l - kx * g.dw;
          if (nx < 0 || nx % g.sw != 0 || nx / g.sw >= g.ow) continue;
          const int64_t ox = nx / g.sw;
          const float d = dplane[oy * g.ow + ox];
          if (is_max) {
            if (window_argmax(plane, oy, ox) == iy * g.iw + ix) s += d;
          } else {
            const int64_t count = pool2d_window_count(g, count_include_pad, oy, ox);
            if (count > 0) s += static_cast<double>(d) / static_cast<double>(count);
          }
        }
      }
      dx[i] = static_cast<float>(s);
    }
  }
};

// Input coordinate of output index j along an axis of in_len, with the scale that the node gave
// (or out_len / in_len when it gave sizes). As in the ONNX reference (and mpq's CPU kernel), the
// "output width" of align_corners / pytorch_half_pixel is scale * in_len, not the rounded length.
MPQ_HD inline double resize_source_coord(ResizeCoord mode, int64_t j, int64_t in_len, double scale) {
  const double x = static_cast<double>(j);
  const double out_w = scale * static_cast<double>(in_len);
  switch (mode) {
    case ResizeCoord::HalfPixel: return (x + 0.5) / scale - 0.5;
    case ResizeCoord::PytorchHalfPixel: return out_w == 1.0 ? -0.5 : (x + 0.5) / scale - 0.5;
    case ResizeCoord::AlignCorners: return out_w == 1.0 ? 0.0 : x * static_cast<double>(in_len - 1) / (out_w - 1.0);
    case ResizeCoord::Asymmetric: return x / scale;
  }
  return x / scale;
}

MPQ_HD inline int64_t resize_nearest_index(ResizeNearest mode, double xo, int64_t in_len) {
  const double fl = floor(xo);
  int64_t k;
  switch (mode) {
    case ResizeNearest::Floor: k = static_cast<int64_t>(fl); break;
    case ResizeNearest::Ceil: k = static_cast<int64_t>(ceil(xo)); break;
    case ResizeNearest::RoundPreferCeil: k = static_cast<int64_t>(xo - fl >= 0.5 ? fl + 1 : fl); break;
    default: k = static_cast<int64_t>(xo - fl > 0.5 ? fl + 1 : fl); break;
  }
  return k < 0 ? 0 : (k >= in_len ? in_len - 1 : k);
}

// Along one resized axis, output index j reads in[i0] * w0 + in[i1] * w1: nearest one tap (w1 = 0),
// linear the two neighbours of the source coordinate clamped into the input, as ONNX Runtime
// does (i1 = i0 at the last position). i0 never decreases as j grows (every coordinate transform
// is increasing in j), which the backward uses to find the outputs that read an input.
struct ResizeTaps {
  int64_t i0, i1;
  double w0, w1;
};
MPQ_HD inline ResizeTaps resize_axis_taps(const Resize2dGeom& g, bool height, int64_t j) {
  const int64_t in_len = height ? g.ih : g.iw;
  const double src = resize_source_coord(g.coord, j, in_len, height ? g.scale_h : g.scale_w);
  if (!g.linear) {
    const int64_t k = resize_nearest_index(g.nearest, src, in_len);
    return {k, k, 1.0, 0.0};
  }
  const double c = src < 0 ? 0 : (src > in_len - 1 ? static_cast<double>(in_len - 1) : src);
  const int64_t i0 = static_cast<int64_t>(floor(c));
  const double w = c - i0;
  return {i0, i0 + 1 < in_len ? i0 + 1 : i0, 1 - w, w};
}

struct Resize2dBody {
  Resize2dGeom g;
  const float* x;
  float* y;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t planes = g.planes, ih = g.ih, iw = g.iw, oh = g.oh, ow = g.ow;
    const int64_t total = planes * oh * ow;
    for (int64_t i = t.global(); i < total; i += t.stride()) {
      const int64_t ox = i % ow, oy = (i / ow) % oh, p = i / (ow * oh);
      const float* plane = x + p * ih * iw;
      const ResizeTaps ty = resize_axis_taps(g, true, oy), tx = resize_axis_taps(g, false, ox);
      if (!g.linear) {
        y[i] = plane[ty.i0 * iw + tx.i0];
        continue;
      }
      const double top = plane[ty.i0 * iw + tx.i0] * tx.w0 + plane[ty.i0 * iw + tx.i1] * tx.w1;
      const double bot = plane[ty.i1 * iw + tx.i0] * tx.w0 + plane[ty.i1 * iw + tx.i1] * tx.w1;
      y[i] = static_cast<float>(top * ty.w0 + bot * ty.w1);
    }
  }
};

// Backward of Resize2dBody with respect to X: the transpose of the interpolation, gathered. One
// thread per input element; along each axis the outputs that read input position k are a
// contiguous range, found by binary search on the taps' i0, and dX sums w_y * w_x * dY over
// them in a fixed order (no atomics). The interpolation is separable, so a tap's weight is the
// product of its two axes' weights.
struct Resize2dGradBody {
  Resize2dGeom g;
  const float* dy;
  float* dx;

  // The first output index along the axis whose first tap is at least `target` (out_len if none).
  MPQ_HD int64_t first_reading(bool height, int64_t target) const {
    int64_t lo = 0, hi = height ? g.oh : g.ow;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (resize_axis_taps(g, height, mid).i0 < target) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
  // The weight with which output j along the axis reads input position k.
  MPQ_HD double weight(bool height, int64_t j, int64_t k) const {
    const ResizeTaps t = resize_axis_taps(g, height, j);
    return (t.i0 == k ? t.w0 : 0.0) + (t.i1 == k ? t.w1 : 0.0);
  }

  MPQ_HD void operator()(const Thread& t) const {
    const int64_t total = g.planes * g.ih * g.iw;
    // A linear tap i1 = i0 + 1 also reads the position after i0.
    const int64_t reach = g.linear ? 1 : 0;
    for (int64_t i = t.global(); i < total; i += t.stride()) {
      const int64_t ix = i % g.iw, iy = (i / g.iw) % g.ih, p = i / (g.iw * g.ih);
      const float* dplane = dy + p * g.oh * g.ow;
      const int64_t y0 = first_reading(true, iy - reach), y1 = first_reading(true, iy + 1);
      const int64_t x0 = first_reading(false, ix - reach), x1 = first_reading(false, ix + 1);
      double s = 0.0;
      for (int64_t oy = y0; oy < y1; ++oy) {
        const double wy = weight(true, oy, iy);
        if (wy == 0.0) continue;
        for (int64_t ox = x0; ox < x1; ++ox) {
          const double wx = weight(false, ox, ix);
          if (wx != 0.0) s += wy * wx * dplane[oy * g.ow + ox];
        }
      }
      dx[i] = static_cast<float>(s);
    }
  }
};

}  // namespace mpq::cuda
