#pragma once
// Small helpers shared by the data-movement backward kernels (shape_grad*.cpp, tensor_grad.cpp):
// axis normalisation and integer inputs read the way the forward kernels read them, with errors
// that name the node.
#include <cstdint>
#include <vector>

#include "runtime/thread_pool.h"
#include "train/grad_registry.h"

namespace mpq::train::grads {

// `axis` in [-rank, rank) mapped into [0, rank).
int grad_axis(const GradContext& ctx, int64_t axis, int rank);

// A saved integer input (shapes, axes, pads, starts) as int64 values; empty when the input is
// omitted or has no elements, as optional inputs of the forward kernels are read.
std::vector<int64_t> saved_ints(const GradContext& ctx, size_t i);

// The adjoint of a copy along one axis: src's index i along `axis` was copied from index map[i]
// (< 0: from nowhere, a constant) of an axis of `size` elements. Returns src with that axis folded
// back to `size`: index j holds the sum of the slices i with map[i] == j, added in increasing i
// (zeros where none), so the result is the same at any thread count. Serves Pad's replicated
// cells and Gather's repeated indices.
Tensor fold_axis(rt::ThreadPool& pool, const Tensor& src, size_t axis, const std::vector<int64_t>& map, int64_t size);

// Backward of Slice and Pad (shape_grad_slice_pad.cpp), registered by register_shape_grads.
void register_slice_pad_grads(GradRegistry& r);

}  // namespace mpq::train::grads
