// Backward of the broadcasting element-wise binary ops: Add, Sub, Mul, Div, Pow (base only: the
// exponent of the Pow nodes exporters write is a constant) and Where (both value inputs). Each input
// gradient is the element-wise product at the output's shape, summed back over the dimensions
// broadcasting stretched (grad_util::reduce_to_shape).
#include <cmath>

#include "runtime/cpu/common.h"
#include "train/grads/grad_util.h"
#include "train/grads/register_all_grads.h"

namespace mpq::train::grads {

namespace {

using grad_util::reduce_to_shape;
using grad_util::visit_float;

// out = f(a, b) at the broadcast shape of a and b (which is g's shape in every use below).
template <typename T, typename F>
Tensor combine(rt::ThreadPool& pool, const Tensor& a, const Tensor& b, const Shape& out_shape, F f) {
  Tensor out(a.dtype(), out_shape);
  rt::cpu::broadcast_binary<T, T, T>(pool, a, b, out, f);
  return out;
}

void add_sub_grad(GradContext& ctx, bool sub) {
  const Tensor& g = ctx.grad_output(0);
  if (ctx.needs_grad(0)) ctx.set_grad(0, reduce_to_shape(ctx.pool(), g, ctx.input_shape(0)));
  if (ctx.needs_grad(1)) {
    Tensor gb = reduce_to_shape(ctx.pool(), g, ctx.input_shape(1));
    ctx.set_grad(1, sub ? grad_util::negate(ctx.pool(), gb) : gb);
  }
}

void add_grad(GradContext& ctx) { add_sub_grad(ctx, false); }
void sub_grad(GradContext& ctx) { add_sub_grad(ctx, true); }

void mul_grad(GradContext& ctx) {
  const Tensor& g = ctx.grad_output(0);
  visit_float(g.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto prod = [](T x, T y) { return x * y; };
    if (ctx.needs_grad(0))
      ctx.set_grad(0, reduce_to_shape(ctx.pool(), combine<T>(ctx.pool(), g, ctx.input(1), g.shape(), prod), ctx.input_shape(0)));
    if (ctx.needs_grad(1))
      ctx.set_grad(1, reduce_to_shape(ctx.pool(), combine<T>(ctx.pool(), g, ctx.input(0), g.shape(), prod), ctx.input_shape(1)));
  });
}

void div_grad(GradContext& ctx) {
  const Tensor& g = ctx.grad_output(0);
  const Tensor& b = ctx.input(1);
  visit_float(g.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (ctx.needs_grad(0))
      ctx.set_grad(0, reduce_to_shape(ctx.pool(), combine<T>(ctx.pool(), g, b, g.shape(), [](T x, T y) { return x / y; }),
                                      ctx.input_shape(0)));
    if (ctx.needs_grad(1)) {
      // d(a/b)/db = -a / b^2
      Tensor ga = combine<T>(ctx.pool(), g, ctx.input(0), g.shape(), [](T x, T y) { return x * y; });
      Tensor gb = combine<T>(ctx.pool(), ga, b, g.shape(), [](T x, T y) { return -x / (y * y); });
      ctx.set_grad(1, reduce_to_shape(ctx.pool(), gb, ctx.input_shape(1)));
    }
  });
}

// dY/dA = B * A^(B-1); squares and square roots (written-out LayerNorm, GELU) get exact forms.
template <typename T>
T pow_slope(T a, T b) {
  if (b == T(2)) return T(2) * a;
  if (b == T(1)) return T(1);
  if (b == T(3)) return T(3) * a * a;
  if (b == T(0.5)) return T(0.5) / std::sqrt(a);
  return b * static_cast<T>(std::pow(a, b - T(1)));
}

void pow_grad(GradContext& ctx) {
  const Tensor& g = ctx.grad_output(0);
  const Tensor& a = ctx.input(0);
  Tensor b = ctx.input(1);
  visit_float(g.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (b.dtype() != g.dtype()) b = b.cast_to(g.dtype());  // integer exponents
    Tensor slope = combine<T>(ctx.pool(), a, b, g.shape(), [](T x, T y) { return pow_slope(x, y); });
    Tensor ga = combine<T>(ctx.pool(), g, slope, g.shape(), [](T x, T y) { return x * y; });
    ctx.set_grad(0, reduce_to_shape(ctx.pool(), ga, ctx.input_shape(0)));
  });
}

void where_grad(GradContext& ctx) {
  const Tensor& g = ctx.grad_output(0);
  const Tensor& cond = ctx.input(0);
  visit_float(g.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (size_t side : {size_t{1}, size_t{2}}) {
      if (!ctx.needs_grad(side)) continue;
      const bool take = side == 1;
      Tensor masked(g.dtype(), g.shape());
      rt::cpu::broadcast_binary<bool, T, T>(ctx.pool(), cond, g, masked,
                                            [take](bool c, T v) { return c == take ? v : T(0); });
      ctx.set_grad(side, reduce_to_shape(ctx.pool(), masked, ctx.input_shape(side)));
    }
  });
}

}  // namespace

void register_binary_grads(GradRegistry& r) {
  auto add = [&](const char* op, GradFn fn, uint32_t diff, uint32_t saved_in) {
    GradDef d;
    d.op_type = op;
    d.fn = fn;
    d.differentiable = diff;
    d.saved_inputs = saved_in;
    r.add(std::move(d));
  };
  add("Add", add_grad, bit(0) | bit(1), 0);
  add("Sub", sub_grad, bit(0) | bit(1), 0);
  add("Mul", mul_grad, bit(0) | bit(1), bit(0) | bit(1));
  add("Div", div_grad, bit(0) | bit(1), bit(0) | bit(1));
  add("Pow", pow_grad, bit(0), bit(0) | bit(1));
  add("Where", where_grad, bit(1) | bit(2), bit(0));
}

}  // namespace mpq::train::grads
