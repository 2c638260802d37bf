#pragma once
// Internal helpers shared by the data-movement kernels (shape_*.cpp, tensor_*.cpp, resize.cpp):
// strided copies of any element width (strings included), an N-D transpose with a tiled inner
// kernel, and small attribute/input readers. Not a public API.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/cpu/common.h"

namespace mpq::rt::cpu {

// A strided view walked as `outer` runs of `inner` elements. Adjacent dimensions that are
// contiguous in the source are merged and size-1 dimensions dropped, so the odometer only turns
// where the memory layout really jumps.
struct StridedRuns {
  std::vector<int64_t> dims;     // outer dims (merged)
  std::vector<int64_t> strides;  // source strides (elements) of the outer dims
  int64_t inner = 1;             // elements per run
  int64_t inner_stride = 1;      // source stride (elements) inside a run; may be 0 or negative
  int64_t outer = 1;             // number of runs
};

// `shape` is the (contiguous) destination shape, `strides` the source stride of each dimension.
StridedRuns make_runs(const Shape& shape, const std::vector<int64_t>& strides);

// Calls f(run_index, src_offset) for runs [lo, hi) in order; src_offset is relative to the view base.
template <typename F>
void for_runs(const StridedRuns& r, int64_t lo, int64_t hi, F&& f) {
  const size_t nd = r.dims.size();
  int64_t idx_buf[16];
  std::vector<int64_t> idx_vec;
  int64_t* idx = idx_buf;
  if (nd > 16) {
    idx_vec.resize(nd);
    idx = idx_vec.data();
  }
  int64_t off = 0;
  int64_t o = lo;
  for (size_t d = nd; d-- > 0;) {
    idx[d] = o % r.dims[d];
    o /= r.dims[d];
    off += idx[d] * r.strides[d];
  }
  if (nd == 0) {
    for (int64_t run = lo; run < hi; ++run) f(run, off);
    return;
  }
  // Runs along the last dimension in a plain loop; the carry into the outer dimensions only when
  // it wraps (short runs, as in attention's transposes, were bound by a carry loop per run).
  const int64_t last_dim = r.dims[nd - 1], last_stride = r.strides[nd - 1];
  for (int64_t run = lo; run < hi;) {
    const int64_t n = std::min(hi - run, last_dim - idx[nd - 1]);
    for (int64_t k = 0; k < n; ++k) f(run + k, off + k * last_stride);
    run += n;
    if (run >= hi) break;
    // The last index wrapped: back to its 0, then carry.
    off -= idx[nd - 1] * last_stride;
    idx[nd - 1] = 0;
    for (size_t d = nd - 1; d-- > 0;) {
      if (++idx[d] < r.dims[d]) {
        off += r.strides[d];
        break;
      }
      off -= (r.dims[d] - 1) * r.strides[d];
      idx[d] = 0;
    }
  }
}

// dst (contiguous, `shape`) = the view of src at `base` with per-dimension `strides` (elements).
// Works for any fixed-width type and for strings.
void strided_copy(ThreadPool& pool, const Tensor& src, int64_t base, const std::vector<int64_t>& strides,
                  Tensor& dst);

// strided_copy with the runs already made (make_runs of dst's shape and the strides).
void strided_copy_runs(ThreadPool& pool, const Tensor& src, int64_t base, const StridedRuns& runs, Tensor& dst);

// How a transpose of a given input shape by a given (valid, non-negative) perm copies: made once,
// run as often as the shape stays (the Transpose kernel keeps it between runs).
struct TransposePlan {
  Shape out_shape;
  std::vector<int64_t> strides;  // the source stride of each output dimension
  StridedRuns runs;              // out_shape walked with those strides
  // A plane transpose inside (the source's contiguous dimension is not the output's inner one):
  // planes of A rows (source-contiguous) by B columns over the outer dimensions odims.
  bool tiled = false;
  std::vector<int64_t> odims, osrc, odst;
  int64_t A = 0, B = 0, src_col = 0, dst_row = 0;
};
TransposePlan plan_transpose(const Shape& in_shape, const std::vector<int64_t>& perm);
// Writes src transposed by the plan into out (out_shape, src's element type).
void run_transpose(ThreadPool& pool, const TransposePlan& plan, const Tensor& src, Tensor& out);

// Transposes src by `perm` into a new tensor (any element type).
Tensor transpose_tensor(ThreadPool& pool, const Tensor& src, const std::vector<int64_t>& perm);

// Copies n elements between tensors of the same dtype (strings included).
void copy_elements(const Tensor& src, int64_t src_off, Tensor& dst, int64_t dst_off, int64_t n);

// Element size in bytes for fixed-width types (fails for strings / packed types).
size_t elem_bytes(const KernelContext& ctx, DType t);

// Integer list from an optional input (empty when absent or an empty tensor).
std::vector<int64_t> optional_input_ints(const KernelContext& ctx, size_t i);

// Extra registration entry points (called from register_shape_ops / register_tensor_ops).
void register_shape_slice_pad(OpRegistry& r);  // shape_slice_pad.cpp: Slice, Pad
void register_tensor_gather(OpRegistry& r);    // tensor_gather.cpp: Gather*, Scatter*, Compress
void register_tensor_misc(OpRegistry& r);      // tensor_misc.cpp: TopK, Unique, ReverseSequence, NonZero
void register_tensor_cast(OpRegistry& r);      // tensor_cast.cpp: Cast, CastLike

}  // namespace mpq::rt::cpu
