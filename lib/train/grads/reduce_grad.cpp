// Backward of ReduceSum, ReduceMean, ReduceMax and ReduceMin.
//
// Axes are read as the forward kernel reads them (runtime/cpu/reduce.cpp): the optional second
// input when present, else the `axes` attribute (the attribute form is what ReduceSum before
// opset 13 and the others before 18 use); an empty list reduces every axis, or none with
// noop_with_empty_axes=1. The output gradient, seen with the reduced axes kept as size 1, is
// broadcast back over the input: as is for Sum, divided by the number of reduced elements for
// Mean, and for Max/Min given whole to the first element (in row-major order) of each reduced
// set that equals the result, zero elsewhere.
#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/cpu/common.h"
#include "train/grads/grad_util.h"
#include "train/grads/register_all_grads.h"

namespace mpq::train::grads {

namespace {

using grad_util::visit_float;
constexpr int64_t kGrain = 16384;

struct ReduceGeometry {
  Shape in_shape, kept_shape;  // kept_shape: the input's shape with reduced axes set to 1
  int64_t count = 1;           // elements per reduced set
};

ReduceGeometry reduce_geometry(const GradContext& ctx) {
  const ir::Node& n = ctx.node();
  ReduceGeometry geo;
  geo.in_shape = ctx.input_shape(0);
  const int rank = static_cast<int>(geo.in_shape.size());
  const bool noop = n.attr_int("noop_with_empty_axes", 0) != 0;
  const std::vector<int64_t> axes = ctx.has_input(1) ? ctx.input(1).to_int64_vector() : n.attr_ints("axes", {});
  std::vector<bool> reduce(static_cast<size_t>(rank), axes.empty() && !noop);
  for (int64_t a : axes) {
    const int64_t ax = a < 0 ? a + rank : a;
    if (ax < 0 || ax >= std::max(rank, 1)) ctx.fail("axis {} is out of range for rank {}", a, rank);
    if (reduce[static_cast<size_t>(ax)]) ctx.fail("axis {} is listed twice", a);
    reduce[static_cast<size_t>(ax)] = true;
  }
  geo.kept_shape = geo.in_shape;
  for (size_t d = 0; d < geo.in_shape.size(); ++d) {
    if (!reduce[d]) continue;
    geo.count *= geo.in_shape[d];
    geo.kept_shape[d] = 1;
  }
  return geo;
}

// out[i] = src[the reduced set of i] over the input's shape.
template <typename T>
void broadcast_back(rt::ThreadPool& pool, const ReduceGeometry& geo, const T* src, T* out) {
  const rt::cpu::BroadcastIter it(geo.in_shape, {&geo.kept_shape});
  const int64_t inner = it.inner(), stride = it.inner_stride(0);
  pool.parallel_for(it.outer_count(), std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)), [&](int64_t lo, int64_t hi) {
    int64_t off[rt::cpu::BroadcastIter::kMaxInputs];
    for (int64_t o = lo; o < hi; ++o) {
      it.offsets(o, off);
      T* dst = out + o * inner;
      const T* s = src + off[0];
      if (stride == 0) std::fill(dst, dst + inner, s[0]);
      else std::copy(s, s + inner, dst);
    }
  });
}

template <bool kMean>
void sum_mean_grad(GradContext& ctx) {
  if (!ctx.needs_grad(0)) return;
  const Tensor& g = ctx.grad_output(0);
  const ReduceGeometry geo = reduce_geometry(ctx);
  if (g.numel() != shape_numel(geo.kept_shape))
    fail_internal("{} (backward): gradient of shape {} for a reduction of {} to {}", ctx.node().label(),
                  shape_str(g.shape()), shape_str(geo.in_shape), shape_str(geo.kept_shape));
  Tensor dx(g.dtype(), geo.in_shape);
  if (dx.numel() > 0) {
    visit_float(g.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* pg = g.data<T>();
      std::vector<T> scaled;
      if constexpr (kMean) {
        scaled.resize(static_cast<size_t>(g.numel()));
        const T count = static_cast<T>(geo.count);
        for (size_t i = 0; i < scaled.size(); ++i) scaled[i] = pg[i] / count;
        pg = scaled.data();
      }
      broadcast_back<T>(ctx.pool(), geo, pg, dx.data<T>());
    });
  }
  ctx.set_grad(0, std::move(dx));
}

void extreme_grad(GradContext& ctx) {
  if (!ctx.needs_grad(0)) return;
  const Tensor& g = ctx.grad_output(0);
  const Tensor x = grad_util::convert(ctx.input(0), g.dtype());
  const Tensor y = grad_util::convert(ctx.output(0), g.dtype());
  const ReduceGeometry geo = reduce_geometry(ctx);
  if (g.numel() != shape_numel(geo.kept_shape) || y.numel() != g.numel())
    fail_internal("{} (backward): gradient of shape {} for a reduction of {} to {}", ctx.node().label(),
                  shape_str(g.shape()), shape_str(geo.in_shape), shape_str(geo.kept_shape));
  Tensor dx = Tensor::zeros(g.dtype(), geo.in_shape);
  if (dx.numel() > 0) {
    visit_float(g.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* pg = g.data<T>();
      const T* px = x.data<T>();
      const T* py = y.data<T>();
      T* pd = dx.data<T>();
      // One sequential pass in row-major order: the first match of each set takes the gradient.
      std::vector<char> taken(static_cast<size_t>(g.numel()), 0);
      const rt::cpu::BroadcastIter it(geo.in_shape, {&geo.kept_shape});
      const int64_t inner = it.inner(), stride = it.inner_stride(0);
      int64_t off[rt::cpu::BroadcastIter::kMaxInputs];
      for (int64_t o = 0; o < it.outer_count(); ++o) {
        it.offsets(o, off);
        for (int64_t i = 0; i < inner; ++i) {
          const int64_t e = o * inner + i, r = off[0] + i * stride;
          const T xv = px[e], yv = py[r];
          const bool match = xv == yv || (xv != xv && yv != yv);
          if (!match || taken[static_cast<size_t>(r)]) continue;
          taken[static_cast<size_t>(r)] = 1;
          pd[e] = pg[r];
        }
      }
    });
  }
  ctx.set_grad(0, std::move(dx));
}

}  // namespace

void register_reduce_grads(GradRegistry& r) {
  auto add = [&](const char* op, GradFn fn, uint32_t saved_in, uint32_t saved_out) {
    GradDef d;
    d.op_type = op;
    d.fn = fn;
    d.differentiable = bit(0);  // the axes input never gets a gradient
    d.saved_inputs = saved_in;
    d.saved_outputs = saved_out;
    r.add(std::move(d));
  };
  add("ReduceSum", sum_mean_grad<false>, bit(1), 0);
  add("ReduceMean", sum_mean_grad<true>, bit(1), 0);
  add("ReduceMax", extreme_grad, bit(0) | bit(1), bit(0));
  add("ReduceMin", extreme_grad, bit(0) | bit(1), bit(0));
}

}  // namespace mpq::train::grads
