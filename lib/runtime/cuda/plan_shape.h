#pragma once
// Host-side planning for the shared CUDA kernel bodies: turns ONNX shapes and attributes into the
// plain launch descriptions of kernels/params.h. Compiled by g++ into mpq_runtime (no CUDA headers),
// so it is unit-tested on every machine; tests/cuda/ runs the bodies on these plans.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/params.h"

namespace mpq::rt::cuda_plan {

// numpy broadcasting of A and B: output shape into *out, strides 0 along broadcast dimensions.
// BadInput when the shapes do not broadcast or the rank exceeds cuda::kMaxRank.
cuda::Broadcast2 make_broadcast2(const Shape& a, const Shape& b, Shape* out);

// Transpose by `perm` (empty: reverse the dimensions); output shape into *out.
cuda::StridedView make_transpose_view(const Shape& in, const std::vector<int64_t>& perm, Shape* out);

// ONNX Slice (opset >= 10): starts/ends clamped per ONNX (negative values count from the end,
// steps may be negative, never 0); axes empty means 0..k-1. Output shape into *out.
cuda::StridedView make_slice_view(const Shape& in, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                                  const std::vector<int64_t>& axes, const std::vector<int64_t>& steps, Shape* out);

// Slice's backward (SliceGradBody) for the same arguments as make_slice_view.
cuda::SliceGeom make_slice_grad_geom(const Shape& in, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                                     const std::vector<int64_t>& axes, const std::vector<int64_t>& steps);

// Transpose's backward is a Transpose of dY by the inverse of `perm` (empty: reversed dimensions).
// BadInput on a perm that is not a permutation of 0..rank-1.
std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm, size_t rank);

// The backward of a reduction (keepdims or not) or of a broadcast read: a view over `to` whose
// element i reads `from` at the broadcast position (step 0 along the dimensions `from` has as 1 or
// lacks). `from` must broadcast to `to` without changing it. BadInput otherwise.
cuda::StridedView make_broadcast_view(const Shape& from, const Shape& to);

// Pad's backward in constant mode: dX is the window of dY that X occupies. `pads` is ONNX's
// [begin_0 .. begin_{r-1}, end_0 .. end_{r-1}] for every axis, all >= 0 (a negative pad crops X:
// not a view; BadInput).
cuda::StridedView make_pad_grad_view(const Shape& x, const std::vector<int64_t>& pads);

// [outer, n, inner] view of `shape` around `axis` (negative counts from the end).
struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
};
AxisView axis_view(const Shape& shape, int64_t axis);

// 2-D pooling over NCHW (kernel, strides, dilations: 2 values or empty for 1; pads: 4 values
// [top, left, bottom, right] or empty), output sizes as rt::cpu::pool_output_size.
cuda::Pool2dGeom make_pool2d_geom(const Shape& x, const std::vector<int64_t>& kernel, const std::vector<int64_t>& strides,
                                  const std::vector<int64_t>& dilations, const std::vector<int64_t>& pads,
                                  bool ceil_mode);

}  // namespace mpq::rt::cuda_plan
