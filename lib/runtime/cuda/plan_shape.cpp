#include "runtime/cuda/plan_shape.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/cpu/reference.h"

namespace mpq::rt::cuda_plan {

namespace {
void check_rank(size_t rank, const char* what) {
  if (rank > static_cast<size_t>(cuda::kMaxRank))
    fail_unsupported("CUDA {}: rank {} exceeds the kernels' limit of {}", what, rank, cuda::kMaxRank);
}
std::vector<int64_t> row_major_strides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int d = static_cast<int>(s.size()) - 2; d >= 0; --d) st[d] = st[d + 1] * s[d + 1];
  return st;
}
}  // namespace

cuda::Broadcast2 make_broadcast2(const Shape& a, const Shape& b, Shape* out) {
  const size_t rank = std::max(a.size(), b.size());
  check_rank(rank, "broadcast");
  cuda::Broadcast2 bc;
  bc.rank = static_cast<int>(rank);
  const std::vector<int64_t> sa = row_major_strides(a), sb = row_major_strides(b);
  out->assign(rank, 1);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t ia = static_cast<int64_t>(d) - static_cast<int64_t>(rank - a.size());
    const int64_t ib = static_cast<int64_t>(d) - static_cast<int64_t>(rank - b.size());
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      fail_input("shapes {} and {} do not broadcast (dimension {}: {} vs {})", shape_str(a), shape_str(b), d, da, db);
    const int64_t dim = da == 1 ? db : da;
    (*out)[d] = dim;
    bc.dims[d] = dim;
    bc.a_stride[d] = (ia >= 0 && da != 1) ? sa[ia] : 0;
    bc.b_stride[d] = (ib >= 0 && db != 1) ? sb[ib] : 0;
  }
  return bc;
}

cuda::StridedView make_broadcast_view(const Shape& from, const Shape& to) {
  Shape joined;
  const cuda::Broadcast2 bc = make_broadcast2(from, to, &joined);
  if (joined != to) fail_input("shape {} does not broadcast to {} without changing it", shape_str(from), shape_str(to));
  cuda::StridedView v;
  v.rank = bc.rank;
  for (int d = 0; d < bc.rank; ++d) {
    v.dims[d] = bc.dims[d];
    v.in_step[d] = bc.a_stride[d];
  }
  return v;
}

cuda::StridedView make_pad_grad_view(const Shape& x, const std::vector<int64_t>& pads) {
  check_rank(x.size(), "Pad");
  const size_t r = x.size();
  if (pads.size() != 2 * r) fail_input("Pad: {} pads for rank {} (expected {})", pads.size(), r, 2 * r);
  Shape y(r);
  for (size_t d = 0; d < r; ++d) {
    if (pads[d] < 0 || pads[d + r] < 0) fail_input("Pad: negative pads crop the input; not a view of dY");
    y[d] = x[d] + pads[d] + pads[d + r];
  }
  const std::vector<int64_t> sy = row_major_strides(y);
  cuda::StridedView v;
  v.rank = static_cast<int>(r);
  for (size_t d = 0; d < r; ++d) {
    v.dims[d] = x[d];
    v.in_step[d] = sy[d];
    v.base += pads[d] * sy[d];
  }
  return v;
}

cuda::StridedView make_transpose_view(const Shape& in, const std::vector<int64_t>& perm_in, Shape* out) {
  check_rank(in.size(), "Transpose");
  std::vector<int64_t> perm = perm_in;
  if (perm.empty())
    for (int64_t d = static_cast<int64_t>(in.size()) - 1; d >= 0; --d) perm.push_back(d);
  if (perm.size() != in.size()) fail_input("Transpose: perm has {} entries for rank {}", perm.size(), in.size());
  std::vector<bool> seen(in.size(), false);
  const std::vector<int64_t> st = row_major_strides(in);
  cuda::StridedView v;
  v.rank = static_cast<int>(in.size());
  out->assign(in.size(), 1);
  for (size_t d = 0; d < perm.size(); ++d) {
    const int64_t p = perm[d];
    if (p < 0 || p >= static_cast<int64_t>(in.size()) || seen[p]) fail_input("Transpose: perm is not a permutation");
    seen[p] = true;
    (*out)[d] = in[p];
    v.dims[d] = in[p];
    v.in_step[d] = st[p];
  }
  return v;
}

namespace {

// ONNX Slice resolved per dimension: first input index, step and output extent (the output shape).
struct ResolvedSlice {
  std::vector<int64_t> begin, step;
  Shape out;
};

ResolvedSlice resolve_slice(const Shape& in, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                            const std::vector<int64_t>& axes_in, const std::vector<int64_t>& steps_in) {
  check_rank(in.size(), "Slice");
  const int64_t rank = static_cast<int64_t>(in.size());
  if (starts.size() != ends.size()) fail_input("Slice: {} starts but {} ends", starts.size(), ends.size());
  std::vector<int64_t> axes = axes_in, steps = steps_in;
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size()) fail_input("Slice: starts, ends, axes and steps differ in length");
  ResolvedSlice r{std::vector<int64_t>(in.size(), 0), std::vector<int64_t>(in.size(), 1), in};
  std::vector<bool> seen(in.size(), false);
  for (size_t i = 0; i < starts.size(); ++i) {
    int64_t ax = axes[i] < 0 ? axes[i] + rank : axes[i];
    if (ax < 0 || ax >= rank || seen[ax]) fail_input("Slice: bad or repeated axis {}", axes[i]);
    seen[ax] = true;
    const int64_t dim = in[ax], s = steps[i];
    if (s == 0) fail_input("Slice: step 0 on axis {}", ax);
    int64_t b = starts[i] < 0 ? starts[i] + dim : starts[i];
    int64_t e = ends[i] < 0 ? ends[i] + dim : ends[i];
    // The clamping rules of the ONNX specification: [0, dim] forwards, [-1, dim-1] backwards.
    if (s > 0) {
      b = std::clamp<int64_t>(b, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
    } else {
      b = std::clamp<int64_t>(b, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
    }
    const int64_t count = s > 0 ? std::max<int64_t>(0, (e - b + s - 1) / s) : std::max<int64_t>(0, (b - e + (-s) - 1) / (-s));
    r.out[ax] = count;
    r.begin[ax] = count > 0 ? b : 0;
    r.step[ax] = s;
  }
  return r;
}

}  // namespace

cuda::StridedView make_slice_view(const Shape& in, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                                  const std::vector<int64_t>& axes, const std::vector<int64_t>& steps, Shape* out) {
  const ResolvedSlice r = resolve_slice(in, starts, ends, axes, steps);
  *out = r.out;
  const std::vector<int64_t> st = row_major_strides(in);
  cuda::StridedView v;
  v.rank = static_cast<int>(in.size());
  for (size_t d = 0; d < in.size(); ++d) {
    v.dims[d] = r.out[d];
    v.in_step[d] = r.step[d] * st[d];
    v.base += r.begin[d] * st[d];
  }
  return v;
}

cuda::SliceGeom make_slice_grad_geom(const Shape& in, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                                     const std::vector<int64_t>& axes, const std::vector<int64_t>& steps) {
  const ResolvedSlice r = resolve_slice(in, starts, ends, axes, steps);
  cuda::SliceGeom g;
  g.rank = static_cast<int>(in.size());
  for (size_t d = 0; d < in.size(); ++d) {
    g.in_dims[d] = in[d];
    g.begin[d] = r.begin[d];
    g.step[d] = r.step[d];
    g.out_dims[d] = r.out[d];
  }
  return g;
}

std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm, size_t rank) {
  std::vector<int64_t> p = perm;
  if (p.empty())
    for (size_t d = rank; d-- > 0;) p.push_back(static_cast<int64_t>(d));
  if (p.size() != rank) fail_input("Transpose: perm has {} entries for rank {}", p.size(), rank);
  std::vector<int64_t> inv(rank, -1);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t a = p[d];
    if (a < 0 || a >= static_cast<int64_t>(rank) || inv[static_cast<size_t>(a)] >= 0) fail_input("Transpose: bad perm entry {}", a);
    inv[static_cast<size_t>(a)] = static_cast<int64_t>(d);
  }
  return inv;
}

AxisView axis_view(const Shape& shape, int64_t axis) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) fail_input("axis {} out of range for rank {}", axis, rank);
  AxisView v;
  for (int64_t d = 0; d < a; ++d) v.outer *= shape[d];
  v.n = shape[a];
  for (int64_t d = a + 1; d < rank; ++d) v.inner *= shape[d];
  return v;
}

cuda::Pool2dGeom make_pool2d_geom(const Shape& x, const std::vector<int64_t>& kernel, const std::vector<int64_t>& strides,
                                  const std::vector<int64_t>& dilations, const std::vector<int64_t>& pads,
                                  bool ceil_mode) {
  if (x.size() != 4) fail_unsupported("CUDA pooling handles 2-D (NCHW) inputs, got {}", shape_str(x));
  if (kernel.size() != 2) fail_input("pooling: kernel_shape needs 2 values");
  auto two = [](const std::vector<int64_t>& v, const char* what) {
    if (v.empty()) return std::vector<int64_t>{1, 1};
    if (v.size() != 2) fail_input("pooling: {} needs 2 values", what);
    return v;
  };
  const std::vector<int64_t> s = two(strides, "strides"), d = two(dilations, "dilations");
  std::vector<int64_t> p = pads.empty() ? std::vector<int64_t>{0, 0, 0, 0} : pads;
  if (p.size() != 4) fail_input("pooling: pads needs 4 values");
  cuda::Pool2dGeom g;
  g.planes = x[0] * x[1];
  g.ih = x[2];
  g.iw = x[3];
  g.kh = kernel[0];
  g.kw = kernel[1];
  g.sh = s[0];
  g.sw = s[1];
  g.dh = d[0];
  g.dw = d[1];
  g.pad_t = p[0];
  g.pad_l = p[1];
  g.pad_b = p[2];
  g.pad_r = p[3];
  g.oh = cpu::pool_output_size(g.ih, g.kh, g.sh, g.dh, g.pad_t, g.pad_b, ceil_mode);
  g.ow = cpu::pool_output_size(g.iw, g.kw, g.sw, g.dw, g.pad_l, g.pad_r, ceil_mode);
  return g;
}

}  // namespace mpq::rt::cuda_plan
