#pragma once
// The output shapes of the ops that only relabel dimensions (Reshape, Flatten, Squeeze,
// Unsqueeze), shared by their CPU kernels (runtime/cpu/shape_ops.cpp) and the CUDA planner
// (runtime/cuda/node_plan.cpp), so both accept and reject exactly the same nodes. Each sets *out
// and returns an empty string, or returns why the node is invalid (the kernels' error message,
// without the node's label).
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mpq::rt {

// spec: Reshape's target (0 copies the input's dimension unless allowzero, one -1 is inferred).
std::string reshape_shape(const Shape& in, const std::vector<int64_t>& spec, bool allowzero, Shape* out);
// axis in [-rank, rank]: [prod(in[:axis]), prod(in[axis:])].
std::string flatten_shape(const Shape& in, int64_t axis, Shape* out);
// axes empty: every dimension of size 1.
std::string squeeze_shape(const Shape& in, const std::vector<int64_t>& axes, Shape* out);
std::string unsqueeze_shape(const Shape& in, const std::vector<int64_t>& axes, Shape* out);

}  // namespace mpq::rt
