// Backward of Slice and Pad (forward: runtime/cpu/shape_slice_pad.cpp, whose argument handling is
// mirrored here: attributes before opsets 10 / 11, inputs after, Pad's axes input from 18).
//
// Slice: the selected cells never overlap (steps are non-zero, axes distinct), so the gradient is
// the output gradient written into zeros of the input's shape through the slice's strides.
// Pad: every output cell comes from at most one input cell, chosen per axis independently (the
// forward's per-axis source maps), so the gradient folds one axis at a time: along an axis that
// reflect/edge/wrap padding replicated, each input index sums the output indices that copied it,
// in increasing order; along the other axes it is a window of the gradient (negative pads crop:
// cropped cells get zero). Every sum has a fixed order, whatever the thread count.
#include <algorithm>
#include <cstring>

#include "runtime/cpu/shape_internal.h"
#include "train/grads/grad_util.h"
#include "train/grads/shape_grad_util.h"

namespace mpq::train::grads {

namespace {

using grad_util::visit_float;
using rt::cpu::strides_of;

// dst[base + sum_d idx_d * strides_d] = src[idx] for every index of src's (contiguous) shape.
void strided_scatter(rt::ThreadPool& pool, const Tensor& src, Tensor& dst, int64_t base,
                     const std::vector<int64_t>& strides) {
  if (src.numel() == 0) return;
  const rt::cpu::StridedRuns runs = rt::cpu::make_runs(src.shape(), strides);
  const int64_t inner = runs.inner, is = runs.inner_stride;
  visit_float(src.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* ps = src.data<T>();
    T* pd = dst.data<T>() + base;
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(inner, 1));
    pool.parallel_for(runs.outer, grain, [&](int64_t lo, int64_t hi) {
      rt::cpu::for_runs(runs, lo, hi, [&](int64_t run, int64_t off) {
        const T* s = ps + run * inner;
        T* d = pd + off;
        if (is == 1) {
          std::memcpy(d, s, static_cast<size_t>(inner) * sizeof(T));
        } else {
          for (int64_t i = 0; i < inner; ++i) d[i * is] = s[i];
        }
      });
    });
  });
}

void slice_grad(GradContext& ctx) {
  const Tensor& g = ctx.grad_output(0);
  const Shape& xs = ctx.input_shape(0);
  const int r = static_cast<int>(xs.size());
  std::vector<int64_t> starts, ends, axes, steps;
  if (ctx.opset() < 10) {
    starts = ctx.node().attr_ints("starts");
    ends = ctx.node().attr_ints("ends");
    axes = ctx.node().attr_ints("axes");
  } else {
    starts = saved_ints(ctx, 1);
    ends = saved_ints(ctx, 2);
    axes = saved_ints(ctx, 3);
    steps = saved_ints(ctx, 4);
  }
  if (starts.size() != ends.size())
    ctx.fail("starts {} and ends {} have different lengths", shape_str(starts), shape_str(ends));
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size())
    ctx.fail("starts, ends, axes and steps must have the same length");
  Shape out = xs;
  const std::vector<int64_t> xstrides = strides_of(xs);
  std::vector<int64_t> st = xstrides;
  std::vector<bool> seen(static_cast<size_t>(r), false);
  int64_t base = 0;
  bool empty = false;
  for (size_t i = 0; i < starts.size(); ++i) {
    const size_t ax = static_cast<size_t>(grad_axis(ctx, axes[i], r));
    if (seen[ax]) ctx.fail("axis {} is repeated", axes[i]);
    seen[ax] = true;
    const int64_t d = xs[ax], step = steps[i];
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
    out[ax] = len;
    if (len == 0) {
      empty = true;
      continue;
    }
    st[ax] = xstrides[ax] * step;
    base += s * xstrides[ax];
  }
  if (g.shape() != out)
    fail_internal("{} (backward): output gradient {} does not match the slice's shape {}", ctx.node().label(),
                  shape_str(g.shape()), shape_str(out));
  if (!empty && out == xs && base == 0) {
    bool unit = true;
    for (size_t d = 0; d < st.size(); ++d)
      if (st[d] != xstrides[d] && out[d] > 1) unit = false;
    if (unit) {
      ctx.set_grad(0, g);
      return;
    }
  }
  Tensor dx = Tensor::zeros(g.dtype(), xs);
  if (!empty) strided_scatter(ctx.pool(), g, dx, base, st);
  ctx.set_grad(0, std::move(dx));
}

enum class PadMode { Constant, Reflect, Edge, Wrap };

void pad_grad(GradContext& ctx) {
  const Tensor& g = ctx.grad_output(0);
  const Shape& xs = ctx.input_shape(0);
  const int r = static_cast<int>(xs.size());
  const ir::Node& node = ctx.node();
  const std::vector<int64_t> pads =
      ctx.opset() < 11 ? node.attr_ints(ctx.opset() < 2 ? "paddings" : "pads") : saved_ints(ctx, 1);
  const std::string mode_s = node.attr_string("mode", "constant");
  PadMode mode;
  if (mode_s == "constant") mode = PadMode::Constant;
  else if (mode_s == "reflect") mode = PadMode::Reflect;
  else if (mode_s == "edge") mode = PadMode::Edge;
  else if (mode_s == "wrap") mode = PadMode::Wrap;
  else ctx.fail("unknown pad mode '{}'", mode_s);

  std::vector<int64_t> pb(static_cast<size_t>(r), 0), pe(static_cast<size_t>(r), 0);
  const std::vector<int64_t> axes = ctx.opset() >= 18 ? saved_ints(ctx, 3) : std::vector<int64_t>{};
  if (axes.empty()) {
    if (pads.size() != 2 * static_cast<size_t>(r))
      ctx.fail("pads {} must have 2 * rank = {} values", shape_str(pads), 2 * r);
    for (size_t i = 0; i < static_cast<size_t>(r); ++i) {
      pb[i] = pads[i];
      pe[i] = pads[i + static_cast<size_t>(r)];
    }
  } else {
    const size_t na = axes.size();
    if (pads.size() != 2 * na) ctx.fail("pads {} must have 2 * len(axes) = {} values", shape_str(pads), 2 * na);
    for (size_t i = 0; i < na; ++i) {
      const size_t ax = static_cast<size_t>(grad_axis(ctx, axes[i], r));
      pb[ax] = pads[i];
      pe[ax] = pads[i + na];
    }
  }
  if (r == 0) {
    ctx.set_grad(0, g);
    return;
  }
  // The window [lo, lo + len) of each input axis survives cropping; pb/pe become the padding.
  Shape out(static_cast<size_t>(r));
  std::vector<int64_t> lo(static_cast<size_t>(r)), len(static_cast<size_t>(r));
  bool any_pad = false;
  for (size_t d = 0; d < static_cast<size_t>(r); ++d) {
    lo[d] = std::max<int64_t>(0, -pb[d]);
    len[d] = xs[d] - lo[d] - std::max<int64_t>(0, -pe[d]);
    if (len[d] < 0) ctx.fail("pads {} crop more than the size of axis {} ({})", shape_str(pads), d, xs[d]);
    pb[d] = std::max<int64_t>(0, pb[d]);
    pe[d] = std::max<int64_t>(0, pe[d]);
    out[d] = pb[d] + len[d] + pe[d];
    if (pb[d] || pe[d]) any_pad = true;
    if (len[d] == 0 && (pb[d] || pe[d]) && mode != PadMode::Constant)
      ctx.fail("cannot {}-pad axis {} of size 0", mode_s, d);
  }
  if (g.shape() != out)
    fail_internal("{} (backward): output gradient {} does not match the padded shape {}", node.label(),
                  shape_str(g.shape()), shape_str(out));
  if (!any_pad && out == xs) {
    ctx.set_grad(0, g);
    return;
  }

  // Fold the axes whose padding replicates input cells.
  Tensor cur = g;
  std::vector<bool> folded(static_cast<size_t>(r), false);
  for (size_t d = 0; d < static_cast<size_t>(r); ++d) {
    if (mode == PadMode::Constant || (!pb[d] && !pe[d])) continue;
    const int64_t n = len[d];
    std::vector<int64_t> map(static_cast<size_t>(out[d]));
    for (int64_t i = 0; i < out[d]; ++i) {
      int64_t s = i - pb[d];
      if (s < 0 || s >= n) {
        switch (mode) {
          case PadMode::Constant: break;
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
      map[static_cast<size_t>(i)] = s + lo[d];
    }
    cur = fold_axis(ctx.pool(), cur, d, map, xs[d]);
    folded[d] = true;
  }
  // The other axes keep cur's cells [pb, pb + len) as the input's [lo, lo + len).
  Shape window(static_cast<size_t>(r));
  const std::vector<int64_t> cstrides = strides_of(cur.shape());
  const std::vector<int64_t> xstrides = strides_of(xs);
  int64_t cbase = 0, xbase = 0;
  for (size_t d = 0; d < static_cast<size_t>(r); ++d) {
    window[d] = folded[d] ? xs[d] : len[d];
    if (folded[d]) continue;
    cbase += pb[d] * cstrides[d];
    xbase += lo[d] * xstrides[d];
  }
  Tensor win = cur;
  if (window != cur.shape()) {
    win = Tensor(cur.dtype(), window);
    rt::cpu::strided_copy(ctx.pool(), cur, cbase, cstrides, win);
  }
  if (window == xs) {
    ctx.set_grad(0, std::move(win));
    return;
  }
  Tensor dx = Tensor::zeros(g.dtype(), xs);
  strided_scatter(ctx.pool(), win, dx, xbase, xstrides);
  ctx.set_grad(0, std::move(dx));
}

}  // namespace

void register_slice_pad_grads(GradRegistry& r) {
  GradDef slice;
  slice.op_type = "Slice";
  slice.fn = slice_grad;
  slice.differentiable = bit(0);
  slice.saved_inputs = bit(1) | bit(2) | bit(3) | bit(4);  // starts, ends, axes, steps (opset 10+)
  r.add(std::move(slice));
  GradDef pad;
  pad.op_type = "Pad";
  pad.fn = pad_grad;
  pad.differentiable = bit(0);
  pad.saved_inputs = bit(1) | bit(3);  // pads (opset 11+), axes (opset 18+)
  r.add(std::move(pad));
}

}  // namespace mpq::train::grads
