// Backward of the shape and data-movement ops: Reshape, Flatten, Squeeze, Unsqueeze (views of the
// output gradient with the input's shape), Transpose (the inverse permutation), Expand and Tile
// (sums over the broadcast copies and the tiles), Concat (each input its slab of the gradient) and
// Split (the output gradients side by side, zeros for outputs that carry none). Slice and Pad live
// in shape_grad_slice_pad.cpp.
//
// Only the data input is differentiable; shapes, axes, split sizes and repeats never are. The
// forward kernels (runtime/cpu/shape_ops.cpp) define the attribute handling mirrored here. Every
// kernel moves or sums values in a fixed order, so results do not depend on the thread count.
#include <algorithm>
#include <cstring>

#include "runtime/cpu/shape_internal.h"
#include "train/grads/grad_util.h"
#include "train/grads/register_all_grads.h"
#include "train/grads/shape_grad_util.h"

namespace mpq::train::grads {

namespace {

using grad_util::visit_float;

// Reshape, Flatten, Squeeze, Unsqueeze: the input and output share their elements in order, so
// the gradient is the output gradient seen with the input's shape (whatever the axes or shape
// arguments were, in attributes or inputs).
void view_grad(GradContext& ctx) {
  const Tensor& g = ctx.grad_output(0);
  const Shape& xs = ctx.input_shape(0);
  if (g.numel() != shape_numel(xs))
    fail_internal("{} (backward): output gradient {} does not hold the {} elements of input {}", ctx.node().label(),
                  shape_str(g.shape()), shape_numel(xs), shape_str(xs));
  ctx.set_grad(0, g.shape() == xs ? g : g.reshaped(xs));
}

void transpose_grad(GradContext& ctx) {
  const Tensor& g = ctx.grad_output(0);
  const int r = static_cast<int>(ctx.input_shape(0).size());
  std::vector<int64_t> perm = ctx.node().attr_ints("perm");
  if (perm.empty())
    for (int i = r - 1; i >= 0; --i) perm.push_back(i);
  if (static_cast<int>(perm.size()) != r) ctx.fail("perm {} does not match input rank {}", shape_str(perm), r);
  std::vector<int64_t> inverse(static_cast<size_t>(r), -1);
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) {
    const int64_t p = perm[i] < 0 ? perm[i] + r : perm[i];
    if (p < 0 || p >= r || inverse[static_cast<size_t>(p)] >= 0)
      ctx.fail("perm {} is not a permutation of 0..{}", shape_str(perm), r - 1);
    inverse[static_cast<size_t>(p)] = static_cast<int64_t>(i);
    if (p != static_cast<int64_t>(i)) identity = false;
  }
  ctx.set_grad(0, identity ? g : rt::cpu::transpose_tensor(ctx.pool(), g, inverse));
}

void expand_grad(GradContext& ctx) {
  ctx.set_grad(0, grad_util::reduce_to_shape(ctx.pool(), ctx.grad_output(0), ctx.input_shape(0)));
}

// The output of Tile is the input repeated reps[d] times along each axis d. Seen as
// [reps0, d0, reps1, d1, ...] its gradient sums over the reps axes. The repeats follow from the
// shapes (output = reps * input per axis), which also covers Tile-1's `tiles`/`axis` inputs.
void tile_grad(GradContext& ctx) {
  const Tensor& g = ctx.grad_output(0);
  const Shape& xs = ctx.input_shape(0);
  if (g.shape().size() != xs.size())
    fail_internal("{} (backward): output gradient {} and input {} differ in rank", ctx.node().label(),
                  shape_str(g.shape()), shape_str(xs));
  Shape view, kept;
  for (size_t d = 0; d < xs.size(); ++d) {
    const int64_t in = xs[d], out = g.shape()[d];
    const int64_t reps = in == 0 ? 1 : out / in;
    if (in == 0 ? out != 0 : out % in != 0)
      fail_internal("{} (backward): output gradient {} is not a tiling of input {}", ctx.node().label(),
                    shape_str(g.shape()), shape_str(xs));
    view.push_back(reps);
    view.push_back(in);
    kept.push_back(1);
    kept.push_back(in);
  }
  ctx.set_grad(0, grad_util::reduce_to_shape(ctx.pool(), g.reshaped(view), kept).reshaped(xs));
}

void concat_grad(GradContext& ctx) {
  const Tensor& g = ctx.grad_output(0);
  std::vector<size_t> present;
  for (size_t i = 0; i < ctx.num_inputs(); ++i)
    if (ctx.has_input(i)) present.push_back(i);
  if (present.empty()) ctx.fail("needs at least one input");
  if (present.size() == 1) {
    ctx.set_grad(present[0], g);
    return;
  }
  const Shape& first = ctx.input_shape(present[0]);
  const int r = static_cast<int>(first.size());
  if (r == 0) ctx.fail("cannot concatenate scalars");
  const int axis = grad_axis(ctx, ctx.node().attr_int("axis", 1), r);
  int64_t total = 0;
  for (size_t i : present) total += ctx.input_shape(i)[static_cast<size_t>(axis)];
  Shape expect = first;
  expect[static_cast<size_t>(axis)] = total;
  if (g.shape() != expect)
    fail_internal("{} (backward): output gradient {} does not match the concatenated shape {}", ctx.node().label(),
                  shape_str(g.shape()), shape_str(expect));
  // Input i's slab starts at its offset along the axis and is read with the gradient's strides.
  const std::vector<int64_t> gstrides = rt::cpu::strides_of(g.shape());
  int64_t offset = 0;
  for (size_t i : present) {
    const Shape& s = ctx.input_shape(i);
    if (ctx.needs_grad(i)) {
      Tensor gi(g.dtype(), s);
      rt::cpu::strided_copy(ctx.pool(), g, offset * gstrides[static_cast<size_t>(axis)], gstrides, gi);
      ctx.set_grad(i, std::move(gi));
    }
    offset += s[static_cast<size_t>(axis)];
  }
}

// Split sizes as the forward kernel derives them: the `split` attribute (opsets 2-12; an input in
// Split-1), the `split` input (13+), `num_outputs` (18+, the last part smaller) or equal parts.
std::vector<int64_t> split_sizes(const GradContext& ctx, int64_t dim) {
  const size_t n_out = ctx.num_outputs();
  std::vector<int64_t> sizes;
  if (ctx.opset() >= 13) {
    sizes = saved_ints(ctx, 1);
  } else {
    sizes = ctx.node().attr_ints("split");
    if (sizes.empty()) sizes = saved_ints(ctx, 1);
  }
  if (sizes.empty()) {
    int64_t n = static_cast<int64_t>(n_out);
    if (ctx.opset() >= 18 && ctx.node().has_attr("num_outputs")) {
      n = ctx.node().attr_int("num_outputs", 0);
      if (n <= 0 || n != static_cast<int64_t>(n_out))
        ctx.fail("num_outputs is {} but the node has {} outputs", n, n_out);
      const int64_t each = (dim + n - 1) / n;
      for (int64_t i = 0; i < n; ++i) sizes.push_back(std::clamp<int64_t>(dim - i * each, 0, each));
    } else {
      if (n == 0 || dim % n != 0) ctx.fail("dimension of size {} cannot be split evenly into {} outputs", dim, n);
      sizes.assign(static_cast<size_t>(n), dim / n);
    }
  }
  if (sizes.size() != n_out) ctx.fail("split has {} sizes but the node has {} outputs", sizes.size(), n_out);
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) ctx.fail("split sizes {} must not be negative", shape_str(sizes));
    total += s;
  }
  if (total != dim) ctx.fail("split sizes {} do not add up to the axis size {}", shape_str(sizes), dim);
  return sizes;
}

void split_grad(GradContext& ctx) {
  const Shape& xs = ctx.input_shape(0);
  const int r = static_cast<int>(xs.size());
  if (r == 0) ctx.fail("cannot split a scalar");
  const int axis = grad_axis(ctx, ctx.node().attr_int("axis", 0), r);
  const std::vector<int64_t> sizes = split_sizes(ctx, xs[static_cast<size_t>(axis)]);
  const size_t n_out = sizes.size();
  DType type = DType::Undefined;
  for (size_t k = 0; k < n_out; ++k) {
    if (!ctx.has_grad_output(k)) continue;
    const Tensor& gk = ctx.grad_output(k);
    Shape s = xs;
    s[static_cast<size_t>(axis)] = sizes[k];
    if (gk.shape() != s)
      fail_internal("{} (backward): gradient of output {} has shape {}, the output has {}", ctx.node().label(), k,
                    shape_str(gk.shape()), shape_str(s));
    type = gk.dtype();
  }
  if (type == DType::Undefined) fail_internal("{} (backward): no output has a gradient", ctx.node().label());
  if (n_out == 1) {
    ctx.set_grad(0, ctx.grad_output(0));
    return;
  }
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= xs[static_cast<size_t>(d)];
  for (int d = axis + 1; d < r; ++d) inner *= xs[static_cast<size_t>(d)];
  const int64_t row = xs[static_cast<size_t>(axis)] * inner;
  std::vector<int64_t> chunk(n_out), start(n_out);
  std::vector<const Tensor*> grads(n_out, nullptr);
  int64_t acc = 0;
  for (size_t k = 0; k < n_out; ++k) {
    chunk[k] = sizes[k] * inner;
    start[k] = acc;
    acc += chunk[k];
    if (ctx.has_grad_output(k)) grads[k] = &ctx.grad_output(k);
  }
  Tensor dx(type, xs);
  if (dx.numel() == 0) {
    ctx.set_grad(0, std::move(dx));
    return;
  }
  visit_float(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* px = dx.data<T>();
    const int64_t n = static_cast<int64_t>(n_out);
    const int64_t grain = std::max<int64_t>(1, 16384 * n / std::max<int64_t>(row, 1));
    ctx.pool().parallel_for(outer * n, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t it = lo; it < hi; ++it) {
        const int64_t o = it / n;
        const size_t k = static_cast<size_t>(it % n);
        if (chunk[k] == 0) continue;
        T* dst = px + o * row + start[k];
        if (grads[k]) std::memcpy(dst, grads[k]->data<T>() + o * chunk[k], static_cast<size_t>(chunk[k]) * sizeof(T));
        else std::fill(dst, dst + chunk[k], T(0));
      }
    });
  });
  ctx.set_grad(0, std::move(dx));
}

}  // namespace

void register_shape_grads(GradRegistry& r) {
  auto add = [&](const char* op, int since, GradFn fn, uint32_t saved_in) {
    GradDef d;
    d.op_type = op;
    d.since = since;
    d.fn = fn;
    d.differentiable = bit(0);
    d.saved_inputs = saved_in;
    r.add(std::move(d));
  };
  add("Reshape", 1, view_grad, 0);
  add("Flatten", 1, view_grad, 0);
  add("Squeeze", 1, view_grad, 0);
  add("Unsqueeze", 1, view_grad, 0);
  add("Transpose", 1, transpose_grad, 0);
  add("Expand", 8, expand_grad, 0);
  add("Tile", 1, tile_grad, 0);
  add("Split", 1, split_grad, bit(1));  // the sizes (an input in Split-1 and from opset 13)
  // Concat: every input is data.
  GradDef concat;
  concat.op_type = "Concat";
  concat.fn = concat_grad;
  concat.differentiable = kAllInputs;
  r.add(std::move(concat));
  register_slice_pad_grads(r);
}

}  // namespace mpq::train::grads
