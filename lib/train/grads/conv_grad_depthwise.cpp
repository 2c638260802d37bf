// Direct backward of a depthwise convolution (one input channel per group), the layout of the
// forward's depthwise kernel (runtime/cpu/conv_depthwise.cpp): each input plane is laid out once
// in a zero-padded buffer whose rows are split into stride_w phases, so that every window tap of
// an output row is one contiguous run of that buffer whatever the stride, dilation or padding.
//   dW[m, t] = sum over images and output rows of dot(dY row, run of tap t in the padded X);
//   dX       = the padded buffer of dX, built by adding w[m, t] * dY row onto the run of tap t,
//              then copied out of the padding and phases.
#include <algorithm>
#include <cstring>
#include <vector>

#include "train/grads/conv_grad_internal.h"

namespace mpq::train::grads {

namespace {

using rt::cpu::ceil_div;
using rt::cpu::Window3;

struct DwGeometry {
  int64_t H, W, KH, KW, sh, sw, dh, dw, pt, pl, OH, OW;
  int64_t Hp, Lp, rs;            // padded rows read, phase length, elements per padded row (sw * Lp)
  std::vector<int64_t> tap_off;  // offset of tap (kh, kw) from the start of an output row's window
};

DwGeometry make_geometry(const Window3& g) {
  DwGeometry p{g.in[1], g.in[2], g.k[1], g.k[2], g.s[1], g.s[2], g.d[1], g.d[2], g.pb[1], g.pb[2], g.out[1], g.out[2],
               0, 0, 0, {}};
  p.Hp = (p.OH - 1) * p.sh + (p.KH - 1) * p.dh + 1;
  p.Lp = ceil_div((p.OW - 1) * p.sw + (p.KW - 1) * p.dw + 1, p.sw);
  p.rs = p.sw * p.Lp;
  for (int64_t kh = 0; kh < p.KH; ++kh)
    for (int64_t kw = 0; kw < p.KW; ++kw) {
      const int64_t col = kw * p.dw;
      p.tap_off.push_back(kh * p.dh * p.rs + (col % p.sw) * p.Lp + col / p.sw);
    }
  return p;
}

// Padded column j of a row holds input column j - pl: columns [lo, lo + count) hold input columns
// [0, count), the others are padding.
struct Inside {
  int64_t lo, count;
};
Inside inside_columns(const DwGeometry& p) {
  return {std::min(p.pl, p.rs), std::clamp<int64_t>(p.rs - p.pl, 0, p.W)};
}

// Padded, phase-split copy of one input plane; `line` holds one padded row.
template <typename T>
void fill_padded(const T* x, T* buf, T* line, const DwGeometry& p) {
  const Inside in = inside_columns(p);
  for (int64_t r = 0; r < p.Hp; ++r) {
    T* row = buf + r * p.rs;
    const int64_t ih = r - p.pt;
    if (ih < 0 || ih >= p.H) {
      std::fill(row, row + p.rs, T(0));
      continue;
    }
    T* dst = p.sw == 1 ? row : line;
    std::fill(dst, dst + in.lo, T(0));
    std::memcpy(dst + in.lo, x + ih * p.W, static_cast<size_t>(in.count) * sizeof(T));
    std::fill(dst + in.lo + in.count, dst + p.rs, T(0));
    if (p.sw == 1) continue;
    for (int64_t ph = 0; ph < p.sw; ++ph)
      for (int64_t j = 0; j < p.Lp; ++j) row[ph * p.Lp + j] = line[j * p.sw + ph];
  }
}

// The inverse copy: the input plane's part of a padded, phase-split buffer (input positions that no
// window reads get zero).
template <typename T>
void unfold_padded(const T* buf, T* x, T* line, const DwGeometry& p) {
  const Inside in = inside_columns(p);
  for (int64_t ih = 0; ih < p.H; ++ih) {
    T* out = x + ih * p.W;
    const int64_t r = ih + p.pt;
    if (r >= p.Hp) {
      std::fill(out, out + p.W, T(0));
      continue;
    }
    const T* row = buf + r * p.rs;
    if (p.sw > 1) {
      for (int64_t ph = 0; ph < p.sw; ++ph)
        for (int64_t j = 0; j < p.Lp; ++j) line[j * p.sw + ph] = row[ph * p.Lp + j];
      row = line;
    }
    std::memcpy(out, row + in.lo, static_cast<size_t>(in.count) * sizeof(T));
    std::fill(out + in.count, out + p.W, T(0));
  }
}

// sum over rows r < rows and i < n of a[r * a_step + i] * b[r * b_step + i], in eight independent
// partial sums (so that the loop vectorises without reassociation: the order is fixed).
template <typename T>
T plane_dot(const T* a, int64_t a_step, const T* b, int64_t b_step, int64_t rows, int64_t n) {
  T lanes[8] = {};
  const int64_t n8 = n / 8 * 8;
  for (int64_t r = 0; r < rows; ++r) {
    const T* __restrict x = a + r * a_step;
    const T* __restrict y = b + r * b_step;
    for (int64_t i = 0; i < n8; i += 8)
      for (int j = 0; j < 8; ++j) lanes[j] += x[i + j] * y[i + j];
    for (int64_t i = n8; i < n; ++i) lanes[i - n8] += x[i] * y[i];
  }
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

template <typename T>
inline void axpy(T* __restrict dst, T a, const T* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += a * src[i];
}

}  // namespace

template <typename T>
void depthwise_conv_backward(rt::ThreadPool& pool, const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t n,
                             int64_t c, int64_t mult, const Window3& g) {
  const DwGeometry p = make_geometry(g);
  const int64_t taps = p.KH * p.KW;
  const int64_t in_plane = p.H * p.W, out_plane = p.OH * p.OW;
  const size_t buf_elems = static_cast<size_t>(p.Hp * p.rs);
  const int64_t row_step = p.sh * p.rs;
  if (dw) {
    // One task per channel: its mult * taps weights sum over every image in order.
    pool.parallel_for(c, 1, [&](int64_t lo, int64_t hi) {
      std::vector<T> buf(buf_elems), line(static_cast<size_t>(p.rs));
      std::vector<double> acc(static_cast<size_t>(mult * taps));
      for (int64_t ci = lo; ci < hi; ++ci) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t img = 0; img < n; ++img) {
          fill_padded(x + (img * c + ci) * in_plane, buf.data(), line.data(), p);
          for (int64_t mi = 0; mi < mult; ++mi) {
            const T* dyp = dy + ((img * c + ci) * mult + mi) * out_plane;
            for (int64_t t = 0; t < taps; ++t)
              acc[static_cast<size_t>(mi * taps + t)] += static_cast<double>(
                  plane_dot(dyp, p.OW, buf.data() + p.tap_off[static_cast<size_t>(t)], row_step, p.OH, p.OW));
          }
        }
        for (int64_t k = 0; k < mult * taps; ++k) dw[ci * mult * taps + k] = static_cast<T>(acc[static_cast<size_t>(k)]);
      }
    });
  }
  if (dx) {
    const int64_t work = std::max<int64_t>(1, mult * taps * out_plane);
    pool.parallel_for(n * c, std::max<int64_t>(1, 65536 / work), [&](int64_t lo, int64_t hi) {
      std::vector<T> buf(buf_elems), line(static_cast<size_t>(p.rs));
      for (int64_t plane = lo; plane < hi; ++plane) {
        const int64_t ci = plane % c;
        std::fill(buf.begin(), buf.end(), T(0));
        for (int64_t mi = 0; mi < mult; ++mi) {
          const T* dyp = dy + (plane * mult + mi) * out_plane;
          const T* wm = w + (ci * mult + mi) * taps;
          for (int64_t oh = 0; oh < p.OH; ++oh) {
            T* base = buf.data() + oh * row_step;
            for (int64_t t = 0; t < taps; ++t) axpy(base + p.tap_off[static_cast<size_t>(t)], wm[t], dyp + oh * p.OW, p.OW);
          }
        }
        unfold_padded(buf.data(), dx + plane * in_plane, line.data(), p);
      }
    });
  }
}

template void depthwise_conv_backward<float>(rt::ThreadPool&, const float*, const float*, const float*, float*, float*,
                                             int64_t, int64_t, int64_t, const Window3&);
template void depthwise_conv_backward<double>(rt::ThreadPool&, const double*, const double*, const double*, double*,
                                              double*, int64_t, int64_t, int64_t, const Window3&);

}  // namespace mpq::train::grads
