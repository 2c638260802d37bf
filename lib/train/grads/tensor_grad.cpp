// Backward of the indexing ops Gather and GatherElements (forward: runtime/cpu/tensor_gather.cpp):
// the output gradient is added back into zeros of the data's shape at the gathered positions.
// Indices may repeat (an embedding row used by several tokens), so cells receive sums. Each data
// cell is owned by one work item, which adds its contributions in index order, so the result is
// bit-identical at any thread count. Indices are never differentiable; they are checked again
// (negative ones wrapped) because the backward writes through them.
#include <algorithm>

#include "runtime/cpu/shape_internal.h"
#include "train/grads/grad_util.h"
#include "train/grads/register_all_grads.h"
#include "train/grads/shape_grad_util.h"

namespace mpq::train::grads {

namespace {

using grad_util::visit_float;

std::vector<int64_t> checked_indices(const GradContext& ctx, const Tensor& t, int64_t dim) {
  if (t.dtype() != DType::Int64 && t.dtype() != DType::Int32)
    ctx.fail("indices must be int32 or int64, got {}", dtype_name(t.dtype()));
  std::vector<int64_t> v = t.to_int64_vector();
  for (int64_t& i : v) {
    const int64_t orig = i;
    if (i < 0) i += dim;
    if (i < 0 || i >= dim) ctx.fail("index value {} is out of range for a dimension of size {}", orig, dim);
  }
  return v;
}

// Data [outer, dim, inner], indices (ni of them), output [outer, ni, inner]:
// dx[o, v, :] = sum of g[o, j, :] over the j with idx[j] == v, in increasing j. That is the output
// gradient folded along its index axis (fold_axis): work items are data rows, each summing its
// own contributions, so an embedding table's rows are filled in parallel without sharing a cell.
void gather_grad(GradContext& ctx) {
  const Tensor& g = ctx.grad_output(0);
  const Shape& ds = ctx.input_shape(0);
  const int r = static_cast<int>(ds.size());
  if (r == 0) ctx.fail("data must have rank >= 1");
  const int axis = grad_axis(ctx, ctx.node().attr_int("axis", 0), r);
  const int64_t dim = ds[static_cast<size_t>(axis)];
  const Tensor& ind = ctx.input(1);
  const std::vector<int64_t> idx = checked_indices(ctx, ind, dim);
  Shape out(ds.begin(), ds.begin() + axis);
  out.insert(out.end(), ind.shape().begin(), ind.shape().end());
  out.insert(out.end(), ds.begin() + axis + 1, ds.end());
  if (g.shape() != out)
    fail_internal("{} (backward): output gradient {} does not match the gathered shape {}", ctx.node().label(),
                  shape_str(g.shape()), shape_str(out));
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= ds[static_cast<size_t>(d)];
  for (int d = axis + 1; d < r; ++d) inner *= ds[static_cast<size_t>(d)];
  const Tensor g3 = g.reshaped({outer, static_cast<int64_t>(idx.size()), inner});
  ctx.set_grad(0, fold_axis(ctx.pool(), g3, 1, idx, dim).reshaped(ds));
}

// Indices and output share a shape I of the data's rank (I <= data's shape off the axis). The
// elements of a line along the axis (fixed other coordinates) all land in the same data line, and
// different lines in different data lines: work items are lines, each walked in axis order.
void gather_elements_grad(GradContext& ctx) {
  const Tensor& g = ctx.grad_output(0);
  const Shape& ds = ctx.input_shape(0);
  const int r = static_cast<int>(ds.size());
  if (r == 0) ctx.fail("data must have rank >= 1");
  const size_t axis = static_cast<size_t>(grad_axis(ctx, ctx.node().attr_int("axis", 0), r));
  const Tensor& ind = ctx.input(1);
  const Shape& is = ind.shape();
  if (ind.rank() != r) ctx.fail("indices {} must have the rank of data {}", shape_str(is), shape_str(ds));
  for (size_t d = 0; d < ds.size(); ++d)
    if (d != axis && is[d] > ds[d])
      ctx.fail("indices {} exceed data {} along axis {}", shape_str(is), shape_str(ds), d);
  if (g.shape() != is)
    fail_internal("{} (backward): output gradient {} does not match the indices' shape {}", ctx.node().label(),
                  shape_str(g.shape()), shape_str(is));
  const std::vector<int64_t> idx = checked_indices(ctx, ind, ds[axis]);
  Tensor dx = Tensor::zeros(g.dtype(), ds);
  if (dx.numel() == 0 || g.numel() == 0) {
    ctx.set_grad(0, std::move(dx));
    return;
  }
  const std::vector<int64_t> dstr = rt::cpu::strides_of(ds), istr = rt::cpu::strides_of(is);
  // Lines: every index of I with the axis coordinate fixed to 0.
  Shape line_dims;
  std::vector<size_t> line_axes;
  for (size_t d = 0; d < is.size(); ++d)
    if (d != axis) {
      line_dims.push_back(is[d]);
      line_axes.push_back(d);
    }
  const int64_t lines = shape_numel(line_dims), len = is[axis];
  const int64_t astr_x = dstr[axis], astr_i = istr[axis];
  visit_float(g.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = g.data<T>();
    T* px = dx.data<T>();
    ctx.pool().parallel_for(lines, std::max<int64_t>(1, 16384 / std::max<int64_t>(len, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t l = lo; l < hi; ++l) {
        int64_t rem = l, xoff = 0, ioff = 0;
        for (size_t k = line_dims.size(); k-- > 0;) {
          const int64_t c = rem % line_dims[k];
          rem /= line_dims[k];
          xoff += c * dstr[line_axes[k]];
          ioff += c * istr[line_axes[k]];
        }
        for (int64_t a = 0; a < len; ++a) {
          const int64_t e = ioff + a * astr_i;
          px[xoff + idx[static_cast<size_t>(e)] * astr_x] += pg[e];
        }
      }
    });
  });
  ctx.set_grad(0, std::move(dx));
}

}  // namespace

void register_tensor_grads(GradRegistry& r) {
  auto add = [&](const char* op, int since, GradFn fn) {
    GradDef d;
    d.op_type = op;
    d.since = since;
    d.fn = fn;
    d.differentiable = bit(0);
    d.saved_inputs = bit(1);  // the indices
    r.add(std::move(d));
  };
  add("Gather", 1, gather_grad);
  add("GatherElements", 11, gather_elements_grad);
}

}  // namespace mpq::train::grads
