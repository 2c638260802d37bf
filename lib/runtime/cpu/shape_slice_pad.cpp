// Slice (steps, negative steps, clamping, axes; attributes before opset 10) and Pad (constant,
// reflect, edge, wrap; negative pads crop; attributes before opset 11, axes from opset 18).
#include <algorithm>
#include <limits>

#include "runtime/cpu/register_all.h"
#include "runtime/cpu/shape_internal.h"

namespace mpq::rt::cpu {

namespace {

void slice_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int r = x.rank();
  std::vector<int64_t> starts, ends, axes, steps;
  if (ctx.opset() < 10) {
    starts = ctx.node().attr_ints("starts");
    ends = ctx.node().attr_ints("ends");
    axes = ctx.node().attr_ints("axes");
  } else {
    starts = input_ints(ctx, 1);
    ends = input_ints(ctx, 2);
    axes = optional_input_ints(ctx, 3);
    steps = optional_input_ints(ctx, 4);
  }
  if (starts.size() != ends.size())
    ctx.fail("starts {} and ends {} have different lengths", shape_str(starts), shape_str(ends));
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size())
    ctx.fail("starts, ends, axes and steps must have the same length");
  Shape out = x.shape();
  const std::vector<int64_t> xs = strides_of(x.shape());
  std::vector<int64_t> st = xs;
  std::vector<bool> seen(static_cast<size_t>(r), false);
  int64_t base = 0;
  bool empty = false;
  for (size_t i = 0; i < starts.size(); ++i) {
    const int ax = normalize_axis(ctx, axes[i], r);
    if (seen[static_cast<size_t>(ax)]) ctx.fail("axis {} is repeated", axes[i]);
    seen[static_cast<size_t>(ax)] = true;
    const int64_t d = x.shape()[static_cast<size_t>(ax)];
    const int64_t step = steps[i];
    if (step == 0) ctx.fail("step for axis {} must not be 0", axes[i]);
    int64_t s = starts[i], e = ends[i];
    if (s < 0) s += d;
    if (e < 0) e += d;
    int64_t len;
    if (step > 0) {
      s = std::clamp<int64_t>(s, 0, d);
      e = std::clamp<int64_t>(e, 0, d);
      len = e > s ? (e - s + step - 1) / step : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, d - 1);
      e = std::clamp<int64_t>(e, -1, d - 1);
      len = s > e ? (s - e + (-step) - 1) / (-step) : 0;
    }
    out[static_cast<size_t>(ax)] = len;
    if (len == 0) {
      empty = true;
      continue;
    }
    st[static_cast<size_t>(ax)] = xs[static_cast<size_t>(ax)] * step;
    base += s * xs[static_cast<size_t>(ax)];
  }
  if (!empty && out == x.shape()) {
    bool unit = true;
    for (size_t i = 0; i < st.size(); ++i)
      if (st[i] != xs[i] && out[i] > 1) unit = false;
    if (unit && base == 0) {
      ctx.set_output(0, x);
      return;
    }
  }
  Tensor& y = ctx.alloc_output(0, x.dtype(), out);
  if (empty) return;
  strided_copy(ctx.pool(), x, base, st, y);
}

enum class PadMode { Constant, Reflect, Edge, Wrap };

void pad_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int r = x.rank();
  const auto& node = ctx.node();
  std::vector<int64_t> pads;
  Tensor cval;  // one element of x's type
  if (ctx.opset() < 11) {
    pads = node.attr_ints(ctx.opset() < 2 ? "paddings" : "pads");
    if (x.dtype() != DType::String) cval = Tensor::scalar<float>(node.attr_float("value", 0.0f)).cast_to(x.dtype());
  } else {
    pads = input_ints(ctx, 1);
    if (ctx.has_input(2) && ctx.input(2).numel() > 0) {
      const Tensor& c = ctx.input(2);
      if (c.dtype() != x.dtype())
        ctx.fail("constant_value has type {} but data has type {}", dtype_name(c.dtype()), dtype_name(x.dtype()));
      cval = c.numel() == 1 ? c.reshaped({}) : c;
    } else if (x.dtype() != DType::String) {
      cval = Tensor::zeros(x.dtype(), {});
    }
  }
  if (x.dtype() == DType::String) ctx.fail_unsupported("Pad of string tensors is not supported");
  const std::string mode_s = node.attr_string("mode", "constant");
  PadMode mode;
  if (mode_s == "constant") mode = PadMode::Constant;
  else if (mode_s == "reflect") mode = PadMode::Reflect;
  else if (mode_s == "edge") mode = PadMode::Edge;
  else if (mode_s == "wrap") mode = PadMode::Wrap;
  else ctx.fail("unknown pad mode '{}'", mode_s);

  // Full per-axis begin/end pads.
  std::vector<int64_t> pb(static_cast<size_t>(r), 0), pe(static_cast<size_t>(r), 0);
  std::vector<int64_t> axes = ctx.opset() >= 18 ? optional_input_ints(ctx, 3) : std::vector<int64_t>{};
  if (axes.empty()) {
    if (pads.size() != 2 * static_cast<size_t>(r))
      ctx.fail("pads {} must have 2 * rank = {} values", shape_str(pads), 2 * r);
    for (int i = 0; i < r; ++i) {
      pb[static_cast<size_t>(i)] = pads[static_cast<size_t>(i)];
      pe[static_cast<size_t>(i)] = pads[static_cast<size_t>(i + r)];
    }
  } else {
    const size_t na = axes.size();
    if (pads.size() != 2 * na) ctx.fail("pads {} must have 2 * len(axes) = {} values", shape_str(pads), 2 * na);
    for (size_t i = 0; i < na; ++i) {
      int ax = normalize_axis(ctx, axes[i], r);
      pb[static_cast<size_t>(ax)] = pads[i];
      pe[static_cast<size_t>(ax)] = pads[i + na];
    }
  }
  if (r == 0) {
    ctx.set_output(0, x);
    return;
  }
  // Negative pads crop: work on the window [lo, lo + len) of each axis, then pad it.
  Shape out(static_cast<size_t>(r));
  std::vector<int64_t> lo(static_cast<size_t>(r)), len(static_cast<size_t>(r));
  bool any_pad = false;
  for (size_t d = 0; d < static_cast<size_t>(r); ++d) {
    const int64_t dim = x.shape()[d];
    lo[d] = std::max<int64_t>(0, -pb[d]);
    len[d] = dim - lo[d] - std::max<int64_t>(0, -pe[d]);
    if (len[d] < 0) ctx.fail("pads {} crop more than the size of axis {} ({})", shape_str(pads), d, dim);
    pb[d] = std::max<int64_t>(0, pb[d]);
    pe[d] = std::max<int64_t>(0, pe[d]);
    out[d] = pb[d] + len[d] + pe[d];
    if (pb[d] || pe[d]) any_pad = true;
    if (len[d] == 0 && (pb[d] || pe[d]) && mode != PadMode::Constant)
      ctx.fail("cannot {}-pad axis {} of size 0", mode_s, d);
  }
  if (!any_pad && out == x.shape()) {
    ctx.set_output(0, x);
    return;
  }
  // Source index (or -1 for the constant) of every output position, per axis.
  std::vector<std::vector<int64_t>> map(static_cast<size_t>(r));
  for (size_t d = 0; d < static_cast<size_t>(r); ++d) {
    auto& m = map[d];
    m.resize(static_cast<size_t>(out[d]));
    const int64_t n = len[d];
    for (int64_t i = 0; i < out[d]; ++i) {
      int64_t s = i - pb[d];
      if (s < 0 || s >= n) {
        switch (mode) {
          case PadMode::Constant: s = -1; break;
          case PadMode::Edge: s = std::clamp<int64_t>(s, 0, n - 1); break;
          case PadMode::Wrap: s = ((s % n) + n) % n; break;
          case PadMode::Reflect:
            if (n == 1) {
              s = 0;
            } else {
              const int64_t period = 2 * (n - 1);
              s = ((s % period) + period) % period;
              if (s >= n) s = period - s;
            }
            break;
        }
      }
      m[static_cast<size_t>(i)] = s < 0 ? -1 : s + lo[d];
    }
  }
  Tensor& y = ctx.alloc_output(0, x.dtype(), out);
  if (y.numel() == 0) return;
  const std::vector<int64_t> xs = strides_of(x.shape());
  const size_t last = static_cast<size_t>(r - 1);
  const int64_t W = out[last];
  const int64_t mid_lo = pb[last], mid_hi = pb[last] + len[last];  // identity-mapped run of the last axis
  int64_t rows = 1;
  for (size_t d = 0; d < last; ++d) rows *= out[d];
  visit_by_width(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x.raw_data());
    T* py = static_cast<T*>(y.raw_data());
    T c{};
    if (cval.defined()) std::memcpy(&c, cval.raw_data(), sizeof(T));
    const auto& mlast = map[last];
    ctx.pool().parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(W, 1)), [&](int64_t r0, int64_t r1) {
      std::vector<int64_t> idx(last, 0);
      int64_t o = r0;
      for (size_t d = last; d-- > 0;) {
        idx[d] = o % out[d];
        o /= out[d];
      }
      for (int64_t row = r0; row < r1; ++row) {
        T* dst = py + row * W;
        bool constant_row = false;
        int64_t base = 0;
        for (size_t d = 0; d < last; ++d) {
          int64_t s = map[d][static_cast<size_t>(idx[d])];
          if (s < 0) {
            constant_row = true;
            break;
          }
          base += s * xs[d];
        }
        if (constant_row) {
          std::fill(dst, dst + W, c);
        } else {
          const T* src = px + base;
          for (int64_t j = 0; j < mid_lo; ++j) {
            int64_t s = mlast[static_cast<size_t>(j)];
            dst[j] = s < 0 ? c : src[s];
          }
          if (mid_hi > mid_lo) std::memcpy(dst + mid_lo, src + lo[last], static_cast<size_t>(mid_hi - mid_lo) * sizeof(T));
          for (int64_t j = mid_hi; j < W; ++j) {
            int64_t s = mlast[static_cast<size_t>(j)];
            dst[j] = s < 0 ? c : src[s];
          }
        }
        for (size_t d = last; d-- > 0;) {
          if (++idx[d] < out[d]) break;
          idx[d] = 0;
        }
      }
    });
  });
}

}  // namespace

void register_shape_slice_pad(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  r.add_fn("", "Slice", 1, kMaxOpset, cpu, slice_kernel, true);
  r.add_fn("", "Pad", 1, kMaxOpset, cpu, pad_kernel, true);
}

}  // namespace mpq::rt::cpu
