#pragma once
// Helpers shared by the backward kernels and the autograd engine: float/double dispatch, type
// conversion, gradient sums and the reduction of a broadcast gradient back to its input's shape.
#include <cstdint>

#include "core/dispatch.h"
#include "core/tensor.h"
#include "runtime/thread_pool.h"
#include "train/grad_registry.h"

namespace mpq::train::grad_util {

// Calls f(TypeTag<float>) or f(TypeTag<double>); other types are an Unsupported error.
template <typename F>
decltype(auto) visit_float(DType t, F&& f) {
  if (t == DType::Float32) return f(TypeTag<float>{});
  if (t == DType::Float64) return f(TypeTag<double>{});
  fail_unsupported("backward kernels take float32 or float64, got {}", dtype_name(t));
}

// `t` converted to `to` (the same tensor when it already has that type). Float16/BFloat16 go
// through float32 with round-to-nearest-even, as the executor rounds.
Tensor convert(const Tensor& t, DType to);

// a + b for tensors of one shape and type (a new tensor; FP16/BF16 summed in float32 and rounded).
Tensor add(rt::ThreadPool& pool, const Tensor& a, const Tensor& b);
// acc += g in place; acc must be a float32/float64 tensor the caller owns, g of the same type.
void add_into(rt::ThreadPool& pool, Tensor& acc, const Tensor& g);

// Sum of `g` over the dimensions that numpy broadcasting expanded when `shape` was broadcast to
// g's shape (leading dimensions added, size-1 dimensions stretched): the gradient of a broadcast
// operand. Each output element is summed in a fixed order (double accumulators), whatever the
// thread count. Returns g itself when the shapes are equal.
Tensor reduce_to_shape(rt::ThreadPool& pool, const Tensor& g, const Shape& shape);

// -g (a new tensor).
Tensor negate(rt::ThreadPool& pool, const Tensor& g);

}  // namespace mpq::train::grad_util
