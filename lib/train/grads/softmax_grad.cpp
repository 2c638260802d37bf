// Backward of Softmax and LogSoftmax from their saved output Y, over the same [outer, n, inner]
// view as the forward kernel (runtime/cpu/softmax.cpp): opset < 13 coerces the input to 2-D at
// `axis` (default 1), so a row is the whole trailing block; opset >= 13 normalises along the one
// axis (default -1).
//
//   Softmax:    dX = Y (dY - sum(dY Y))
//   LogSoftmax: dX = dY - exp(Y) sum(dY)
//
// Each row's sum is taken by one thread in a fixed order (lanes for contiguous rows, one running
// sum per column otherwise), so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "runtime/cpu/math_util.h"
#include "train/grads/grad_util.h"
#include "train/grads/register_all_grads.h"

namespace mpq::train::grads {

namespace {

using grad_util::visit_float;
namespace math = rt::cpu::math;

enum class Kind { Softmax, LogSoftmax };

template <typename T>
__attribute__((always_inline)) inline T exp_t(T x) {
  if constexpr (std::is_same_v<T, float>) return math::fast_exp(x);
  else return std::exp(x);
}

// sum_i a[i] * (b ? b[i] : 1) over a contiguous row, in 8 independent lanes (vectorises without
// reassociating; the order is fixed by n alone).
template <typename T>
T row_dot(const T* a, const T* b, int64_t n) {
  T acc[8] = {};
  int64_t i = 0;
  if (b) {
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  } else {
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; ++j) acc[j] += a[i + j];
  }
  T s = 0;
  for (; i < n; ++i) s += b ? a[i] * b[i] : a[i];
  for (int j = 0; j < 8; ++j) s += acc[j];
  return s;
}

template <Kind K, typename T>
void grad_row(const T* y, const T* g, T* dx, int64_t n) {
  if constexpr (K == Kind::Softmax) {
    const T s = row_dot(g, y, n);
    for (int64_t i = 0; i < n; ++i) dx[i] = y[i] * (g[i] - s);
  } else {
    const T s = row_dot<T>(g, nullptr, n);
    for (int64_t i = 0; i < n; ++i) dx[i] = g[i] - exp_t(y[i]) * s;
  }
}

constexpr int64_t kChunk = 256;

// Columns [j0, j0 + w) of an [n, inner] block.
template <Kind K, typename T>
void grad_columns(const T* y, const T* g, T* dx, int64_t n, int64_t inner, int64_t j0, int64_t w) {
  T s[kChunk];
  y += j0;
  g += j0;
  dx += j0;
  for (int64_t j = 0; j < w; ++j) s[j] = T(0);
  for (int64_t k = 0; k < n; ++k) {
    const T* yk = y + k * inner;
    const T* gk = g + k * inner;
    if constexpr (K == Kind::Softmax) {
      for (int64_t j = 0; j < w; ++j) s[j] += gk[j] * yk[j];
    } else {
      for (int64_t j = 0; j < w; ++j) s[j] += gk[j];
    }
  }
  for (int64_t k = 0; k < n; ++k) {
    const T* yk = y + k * inner;
    const T* gk = g + k * inner;
    T* dk = dx + k * inner;
    if constexpr (K == Kind::Softmax) {
      for (int64_t j = 0; j < w; ++j) dk[j] = yk[j] * (gk[j] - s[j]);
    } else {
      for (int64_t j = 0; j < w; ++j) dk[j] = gk[j] - exp_t(yk[j]) * s[j];
    }
  }
}

template <Kind K>
void softmax_grad(GradContext& ctx) {
  if (!ctx.needs_grad(0)) return;
  const Tensor& g = ctx.grad_output(0);
  const Tensor y = grad_util::convert(ctx.output(0), g.dtype());
  const Shape& shape = ctx.input_shape(0);
  const int rank = static_cast<int>(shape.size());
  const bool legacy = ctx.opset() < 13;
  const int64_t axis_attr = ctx.node().attr_int("axis", legacy ? 1 : -1);
  const int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
  if (axis < 0 || axis >= std::max(rank, 1)) ctx.fail("axis {} is out of range for rank {}", axis_attr, rank);
  math::AxisLayout l;
  if (legacy) {
    for (int i = 0; i < rank; ++i) (i < axis ? l.outer : l.n) *= shape[static_cast<size_t>(i)];
  } else {
    l = math::axis_layout(shape, static_cast<int>(axis));
  }
  if (y.shape() != shape || g.shape() != shape)
    fail_internal("{} (backward): output or gradient shape differs from the input's {}", ctx.node().label(), shape_str(shape));
  Tensor dx(g.dtype(), shape);
  if (dx.numel() > 0) {
    visit_float(g.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* py = y.data<T>();
      const T* pg = g.data<T>();
      T* pd = dx.data<T>();
      const int64_t n = l.n, inner = l.inner;
      if (inner == 1) {
        ctx.pool().parallel_for(l.outer, math::grain_for(n, 16384), [&](int64_t lo, int64_t hi) {
          for (int64_t o = lo; o < hi; ++o) grad_row<K, T>(py + o * n, pg + o * n, pd + o * n, n);
        });
        return;
      }
      const int64_t chunks = (inner + kChunk - 1) / kChunk;
      ctx.pool().parallel_for(l.outer * chunks, math::grain_for(n * std::min(inner, kChunk), 16384),
                              [&](int64_t lo, int64_t hi) {
                                for (int64_t t = lo; t < hi; ++t) {
                                  const int64_t o = t / chunks, j0 = (t % chunks) * kChunk;
                                  const int64_t off = o * n * inner;
                                  grad_columns<K, T>(py + off, pg + off, pd + off, n, inner, j0,
                                                     std::min(kChunk, inner - j0));
                                }
                              });
    });
  }
  ctx.set_grad(0, std::move(dx));
}

}  // namespace

void register_softmax_grads(GradRegistry& r) {
  for (auto [op, fn] : {std::pair{"Softmax", &softmax_grad<Kind::Softmax>}, std::pair{"LogSoftmax", &softmax_grad<Kind::LogSoftmax>}}) {
    GradDef d;
    d.op_type = op;
    d.fn = fn;
    d.differentiable = bit(0);
    d.saved_outputs = bit(0);
    r.add(std::move(d));
  }
}

}  // namespace mpq::train::grads
