// Backward of Resize (opset 10 to 19+) and Upsample (opset 1 to 9) with respect to X: the transpose
// of the interpolation. The forward (runtime/cpu/resize.cpp) is separable: along each resized axis,
// output position j is sum_t w[j, t] * in[idx[j, t]]. The gradient of one such pass sends
// w[j, t] * dY[j] back to idx[j, t]; here it is gathered instead of scattered: for every input
// position, the (j, t) taps that read it are listed once per axis (in j, t order), so every dX
// element is one fixed sum, computed by one task, whatever the thread count.
//
// The taps are built with the forward's arithmetic (same coordinate transforms, nearest rounding,
// linear / cubic coefficients, exclude_outside, antialias, weights rounded to float as the forward
// stores them): modes nearest (every nearest_mode), linear and cubic; coordinate transforms
// half_pixel, half_pixel_symmetric, pytorch_half_pixel, align_corners, asymmetric and
// tf_half_pixel_for_nn. tf_crop_and_resize (whose positions outside the region take a constant) is
// reported as unsupported. roi, scales and sizes never get a gradient.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/cpu/common.h"
#include "train/grads/grad_util.h"
#include "train/grads/register_all_grads.h"

namespace mpq::train::grads {

namespace {

using grad_util::visit_float;

enum class Mode { Nearest, Linear, Cubic };
enum class Coord { HalfPixel, HalfPixelSymmetric, PytorchHalfPixel, AlignCorners, Asymmetric, TfHalfPixelForNN };
enum class NearestMode { RoundPreferFloor, RoundPreferCeil, Floor, Ceil, Simple };

struct ResizeSpec {
  Mode mode = Mode::Nearest;
  Coord coord = Coord::HalfPixel;
  NearestMode nearest = NearestMode::RoundPreferFloor;
  double cubic_a = -0.75;
  bool exclude_outside = false;
  bool antialias = false;
  Shape out_shape;
  std::vector<double> scales;  // per axis
};

// Taps of one axis: output position j reads n inputs idx[j*n + t] with weights w[j*n + t].
struct AxisTaps {
  int64_t in_len = 0, out_len = 0;
  int n = 1;
  std::vector<int64_t> idx;
  std::vector<float> w;
  bool identity() const {
    if (in_len != out_len) return false;
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
  const double out_w = scale * static_cast<double>(in_len);  // the ONNX reference's "output width"
  const double L = static_cast<double>(in_len);
  const bool aa = s.antialias && scale < 1.0 && s.mode != Mode::Nearest;
  int start = 0;  // first tap relative to floor(x_ori)
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
  std::vector<double> coeff(n);
  for (int64_t j = 0; j < out_len; ++j) {
    const double x = static_cast<double>(j);
    double xo = 0.0;
    switch (s.coord) {
      case Coord::HalfPixel: xo = (x + 0.5) / scale - 0.5; break;
      case Coord::HalfPixelSymmetric: {
        const double adjustment = static_cast<double>(out_len) / out_w;
        xo = L / 2.0 * (1.0 - adjustment) + (x + 0.5) / scale - 0.5;
        break;
      }
      case Coord::PytorchHalfPixel: xo = out_w == 1.0 ? -0.5 : (x + 0.5) / scale - 0.5; break;
      case Coord::AlignCorners: xo = out_w == 1.0 ? 0.0 : x * (L - 1.0) / (out_w - 1.0); break;
      case Coord::Asymmetric: xo = x / scale; break;
      case Coord::TfHalfPixelForNN: xo = (x + 0.5) / scale; break;
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

// For each input position i, the output positions and weights that read it: (j[k], w[k]) for k in
// [first[i], first[i + 1]), in (j, t) order.
struct InverseTaps {
  std::vector<int64_t> first, j;
  std::vector<float> w;
};

InverseTaps invert(const AxisTaps& t) {
  InverseTaps r;
  r.first.assign(static_cast<size_t>(t.in_len + 1), 0);
  const size_t taps = t.idx.size();
  for (size_t k = 0; k < taps; ++k)
    if (t.w[k] != 0.0f) ++r.first[static_cast<size_t>(t.idx[k]) + 1];
  for (size_t i = 0; i < static_cast<size_t>(t.in_len); ++i) r.first[i + 1] += r.first[i];
  r.j.resize(static_cast<size_t>(r.first.back()));
  r.w.resize(r.j.size());
  std::vector<int64_t> fill(r.first.begin(), r.first.end() - 1);
  for (size_t k = 0; k < taps; ++k) {
    if (t.w[k] == 0.0f) continue;
    const size_t at = static_cast<size_t>(fill[static_cast<size_t>(t.idx[k])]++);
    r.j[at] = static_cast<int64_t>(k) / t.n;
    r.w[at] = t.w[k];
  }
  return r;
}

// The transpose of one interpolation pass along `axis`: g has the pass's output length on that
// axis, the result its input length.
template <typename T>
Tensor transpose_pass(rt::ThreadPool& pool, const Tensor& g, size_t axis, const AxisTaps& taps) {
  Shape shape = g.shape();
  shape[axis] = taps.in_len;
  Tensor out(g.dtype(), shape);
  if (out.numel() == 0) return out;
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const InverseTaps inv = invert(taps);
  const int64_t L_in = taps.in_len, L_out = taps.out_len;
  const T* src = g.data<T>();
  T* dst = out.data<T>();
  const int64_t per_row = std::max<int64_t>(1, inner * (static_cast<int64_t>(inv.j.size()) / std::max<int64_t>(L_in, 1) + 1));
  const int64_t* first = inv.first.data();
  const int64_t* js = inv.j.data();
  const float* ws = inv.w.data();
  if (inner == 1) {
    pool.parallel_for(outer, std::max<int64_t>(1, 16384 / (per_row * L_in)), [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        const T* s = src + o * L_out;
        T* d = dst + o * L_in;
        for (int64_t i = 0; i < L_in; ++i) {
          T acc = T(0);
          for (int64_t k = first[i]; k < first[i + 1]; ++k) acc += static_cast<T>(ws[k]) * s[js[k]];
          d[i] = acc;
        }
      }
    });
    return out;
  }
  pool.parallel_for(outer * L_in, std::max<int64_t>(1, 16384 / per_row), [&](int64_t lo, int64_t hi) {
    for (int64_t it = lo; it < hi; ++it) {
      const int64_t o = it / L_in, i = it % L_in;
      T* __restrict d = dst + it * inner;
      const T* s = src + o * L_out * inner;
      if (first[i] == first[i + 1]) {
        std::fill(d, d + inner, T(0));
        continue;
      }
      {
        const T w = static_cast<T>(ws[first[i]]);
        const T* __restrict r = s + js[first[i]] * inner;
        for (int64_t e = 0; e < inner; ++e) d[e] = w * r[e];
      }
      for (int64_t k = first[i] + 1; k < first[i + 1]; ++k) {
        const T w = static_cast<T>(ws[k]);
        const T* __restrict r = s + js[k] * inner;
        for (int64_t e = 0; e < inner; ++e) d[e] += w * r[e];
      }
    }
  });
  return out;
}

Mode parse_mode(const GradContext& ctx, const std::string& m) {
  if (m == "nearest") return Mode::Nearest;
  if (m == "linear" || m == "bilinear" || m == "trilinear") return Mode::Linear;
  if (m == "cubic") return Mode::Cubic;
  ctx.fail("unknown mode '{}'", m);
}

std::vector<float> float_values(const Tensor& t) {
  std::vector<float> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(static_cast<float>(t.get_double(i)));
  return v;
}

// Scales and output sizes from either input for the listed axes, as the forward computes them.
void shape_from_inputs(const GradContext& ctx, const Shape& xs, const std::vector<int64_t>& axes,
                       const std::vector<float>& scales, const std::vector<int64_t>& sizes, ResizeSpec& s) {
  s.scales.assign(xs.size(), 1.0);
  s.out_shape = xs;
  if (!scales.empty() && !sizes.empty()) ctx.fail("only one of 'scales' and 'sizes' may be given");
  if (scales.empty() && sizes.empty()) ctx.fail("one of 'scales' and 'sizes' must be given");
  if (!scales.empty()) {
    if (scales.size() != axes.size()) ctx.fail("scales has {} values for {} axes", scales.size(), axes.size());
    for (size_t i = 0; i < axes.size(); ++i) {
      const size_t d = static_cast<size_t>(axes[i]);
      if (!(scales[i] > 0.0f)) ctx.fail("scale {} for axis {} must be positive", scales[i], d);
      s.scales[d] = scales[i];
      s.out_shape[d] = static_cast<int64_t>(std::floor(scales[i] * static_cast<float>(xs[d])));
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
    if (xs[d] == 0) continue;
    const double sc = static_cast<double>(sizes[i]) / static_cast<double>(xs[d]);
    common = policy == "not_larger" ? std::min(common, sc) : std::max(common, sc);
  }
  for (size_t i = 0; i < axes.size(); ++i) {
    const size_t d = static_cast<size_t>(axes[i]);
    int64_t out = sizes[i];
    double sc = xs[d] == 0 ? 1.0 : static_cast<double>(out) / static_cast<double>(xs[d]);
    if (policy != "stretch") {
      out = static_cast<int64_t>(std::floor(common * static_cast<double>(xs[d]) + 0.5));
      sc = common;
    }
    s.out_shape[d] = out;
    s.scales[d] = sc;
  }
}

std::vector<int64_t> all_axes(size_t rank) {
  std::vector<int64_t> axes;
  for (size_t d = 0; d < rank; ++d) axes.push_back(static_cast<int64_t>(d));
  return axes;
}

ResizeSpec resize_spec(GradContext& ctx) {
  const ir::Node& node = ctx.node();
  const Shape& xs = ctx.input_shape(0);
  const size_t r = xs.size();
  ResizeSpec s;
  s.mode = parse_mode(ctx, node.attr_string("mode", "nearest"));
  if (ctx.opset() < 11) {
    s.coord = Coord::Asymmetric;
    s.nearest = NearestMode::Simple;
    shape_from_inputs(ctx, xs, all_axes(r), float_values(ctx.input(1)), {}, s);
    return s;
  }
  const std::string coord = node.attr_string("coordinate_transformation_mode", "half_pixel");
  if (coord == "half_pixel") s.coord = Coord::HalfPixel;
  else if (coord == "half_pixel_symmetric") s.coord = Coord::HalfPixelSymmetric;
  else if (coord == "pytorch_half_pixel") s.coord = Coord::PytorchHalfPixel;
  else if (coord == "align_corners") s.coord = Coord::AlignCorners;
  else if (coord == "asymmetric") s.coord = Coord::Asymmetric;
  else if (coord == "tf_half_pixel_for_nn") s.coord = Coord::TfHalfPixelForNN;
  else if (coord == "tf_crop_and_resize")
    ctx.fail_unsupported("coordinate_transformation_mode 'tf_crop_and_resize' has no backward (X's gradient is not "
                         "implemented for cropped resizes)");
  else ctx.fail("unknown coordinate_transformation_mode '{}'", coord);
  const std::string nm = node.attr_string("nearest_mode", "round_prefer_floor");
  if (nm == "round_prefer_floor") s.nearest = NearestMode::RoundPreferFloor;
  else if (nm == "round_prefer_ceil") s.nearest = NearestMode::RoundPreferCeil;
  else if (nm == "floor") s.nearest = NearestMode::Floor;
  else if (nm == "ceil") s.nearest = NearestMode::Ceil;
  else ctx.fail("unknown nearest_mode '{}'", nm);
  s.cubic_a = node.attr_float("cubic_coeff_a", -0.75f);
  s.exclude_outside = node.attr_int("exclude_outside", 0) != 0;
  s.antialias = ctx.opset() >= 18 && node.attr_int("antialias", 0) != 0;
  std::vector<int64_t> axes;
  if (ctx.opset() >= 18 && node.has_attr("axes")) {
    const rt::KernelContext kctx(node, ctx.opset(), ctx.pool(), nullptr);
    std::vector<bool> seen(r, false);
    for (int64_t a : node.attr_ints("axes")) {
      const int ax = rt::cpu::normalize_axis(kctx, a, static_cast<int>(r));
      if (seen[static_cast<size_t>(ax)]) ctx.fail("axis {} is repeated", a);
      seen[static_cast<size_t>(ax)] = true;
      axes.push_back(ax);
    }
  } else {
    axes = all_axes(r);
  }
  const std::vector<float> scales = ctx.has_input(2) ? float_values(ctx.input(2)) : std::vector<float>{};
  std::vector<int64_t> sizes;
  if (ctx.has_input(3) && ctx.input(3).numel() > 0) sizes = ctx.input(3).to_int64_vector();
  shape_from_inputs(ctx, xs, axes, scales, sizes, s);
  return s;
}

ResizeSpec upsample_spec(const GradContext& ctx) {
  const ir::Node& node = ctx.node();
  const Shape& xs = ctx.input_shape(0);
  ResizeSpec s;
  s.mode = parse_mode(ctx, node.attr_string("mode", "nearest"));
  if (s.mode == Mode::Cubic) ctx.fail("Upsample does not support cubic mode");
  s.coord = Coord::Asymmetric;
  s.nearest = NearestMode::Simple;
  std::vector<float> scales;
  if (ctx.opset() >= 9) {
    scales = float_values(ctx.input(1));
  } else if (ctx.opset() >= 7) {
    scales = node.attr_floats("scales");
  } else {
    if (xs.size() != 4) ctx.fail("Upsample-1 needs a 4-D input");
    scales = {1.0f, 1.0f, node.attr_float("height_scale", 1.0f), node.attr_float("width_scale", 1.0f)};
  }
  shape_from_inputs(ctx, xs, all_axes(xs.size()), scales, {}, s);
  return s;
}

void interpolation_grad(GradContext& ctx, const ResizeSpec& s) {
  const Tensor& dy = ctx.grad_output(0);
  const Shape& xs = ctx.input_shape(0);
  if (s.out_shape != dy.shape())
    fail_internal("{} (backward): the resize of {} computes {}, but dY is {}", ctx.node().label(), shape_str(xs),
                  shape_str(s.out_shape), shape_str(dy.shape()));
  std::vector<AxisTaps> taps(xs.size());
  std::vector<size_t> order;
  for (size_t d = 0; d < xs.size(); ++d) {
    taps[d] = make_taps(s, d, xs[d], s.out_shape[d]);
    if (!taps[d].identity()) order.push_back(d);
  }
  // Axes that shrink the gradient most first, to keep the intermediates small.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return static_cast<double>(taps[a].in_len) / static_cast<double>(std::max<int64_t>(taps[a].out_len, 1)) <
           static_cast<double>(taps[b].in_len) / static_cast<double>(std::max<int64_t>(taps[b].out_len, 1));
  });
  visit_float(dy.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Tensor g = dy;
    for (size_t d : order) g = transpose_pass<T>(ctx.pool(), g, d, taps[d]);
    ctx.set_grad(0, std::move(g));
  });
}

void resize_grad(GradContext& ctx) { interpolation_grad(ctx, resize_spec(ctx)); }
void upsample_grad(GradContext& ctx) { interpolation_grad(ctx, upsample_spec(ctx)); }

}  // namespace

void register_resize_grads(GradRegistry& r) {
  auto add = [&](const char* op, int since, int until, GradFn fn, uint32_t saved_inputs) {
    GradDef d;
    d.op_type = op;
    d.since = since;
    d.until = until;
    d.fn = fn;
    d.differentiable = bit(0);
    d.saved_inputs = saved_inputs;  // the scales / sizes that fix the taps
    r.add(std::move(d));
  };
  add("Resize", 10, 10, resize_grad, bit(1));
  add("Resize", 11, rt::kMaxOpset, resize_grad, bit(2) | bit(3));
  add("Upsample", 1, 8, upsample_grad, 0);
  add("Upsample", 9, rt::kMaxOpset, upsample_grad, bit(1));
}

}  // namespace mpq::train::grads
