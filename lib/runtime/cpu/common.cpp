#include "runtime/cpu/common.h"

#include <algorithm>

namespace mpq::rt::cpu {

int normalize_axis(const KernelContext& ctx, int64_t axis, int rank) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= std::max(rank, 1)) ctx.fail("axis {} is out of range for rank {}", axis, rank);
  return static_cast<int>(a);
}

std::vector<int64_t> strides_of(const Shape& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) s[static_cast<size_t>(i)] = s[static_cast<size_t>(i) + 1] * shape[static_cast<size_t>(i) + 1];
  return s;
}

Shape broadcast_shapes(const KernelContext& ctx, const std::vector<const Shape*>& shapes) {
  size_t rank = 0;
  for (const Shape* s : shapes) rank = std::max(rank, s->size());
  Shape out(rank, 1);
  for (const Shape* s : shapes) {
    size_t off = rank - s->size();
    for (size_t i = 0; i < s->size(); ++i) {
      int64_t d = (*s)[i];
      int64_t& o = out[off + i];
      if (d == o || d == 1) continue;
      if (o == 1) {
        o = d;
        continue;
      }
      std::vector<std::string> strs;
      for (const Shape* t : shapes) strs.push_back(shape_str(*t));
      ctx.fail("shapes {} cannot be broadcast together", fmt::join(strs, " and "));
    }
  }
  return out;
}

BroadcastIter::BroadcastIter(const Shape& out, const std::vector<const Shape*>& ins) : n_inputs_(ins.size()) {
  if (ins.size() > kMaxInputs) fail_internal("BroadcastIter: at most {} inputs", kMaxInputs);
  const size_t rank = out.size();
  // Per-dim strides of each input (0 where broadcast), in the output's rank.
  std::vector<std::array<int64_t, kMaxInputs>> dim_strides(rank);
  for (size_t k = 0; k < ins.size(); ++k) {
    const Shape& s = *ins[k];
    size_t off = rank - s.size();
    int64_t stride = 1;
    for (size_t d = rank; d-- > 0;) {
      int64_t dim = d >= off ? s[d - off] : 1;
      dim_strides[d][k] = (dim == 1) ? 0 : stride;
      stride *= dim;
    }
  }
  // Collapse adjacent dims d-1, d when every input is contiguous across them (or broadcast in both).
  std::vector<int64_t> dims;
  std::vector<std::array<int64_t, kMaxInputs>> strides;
  for (size_t d = 0; d < rank; ++d) {
    if (out[d] == 1) continue;
    if (!dims.empty()) {
      bool merge = true;
      for (size_t k = 0; k < ins.size(); ++k) {
        int64_t prev = strides.back()[k], cur = dim_strides[d][k];
        if (!((prev == 0 && cur == 0) || (cur != 0 && prev == cur * out[d]))) merge = false;
      }
      if (merge) {
        dims.back() *= out[d];
        strides.back() = dim_strides[d];
        continue;
      }
    }
    dims.push_back(out[d]);
    strides.push_back(dim_strides[d]);
  }
  if (dims.empty()) {
    dims.push_back(1);
    strides.push_back({});
  }
  inner_ = dims.back();
  for (size_t k = 0; k < ins.size(); ++k) inner_strides_[k] = strides.back()[k] == 0 ? 0 : 1;
  outer_dims_.assign(dims.begin(), dims.end() - 1);
  strides_.assign(strides.begin(), strides.end() - 1);
  outer_ = 1;
  for (int64_t d : outer_dims_) outer_ *= d;
}

void BroadcastIter::offsets(int64_t o, int64_t* in_offsets) const {
  for (size_t k = 0; k < n_inputs_; ++k) in_offsets[k] = 0;
  for (size_t d = outer_dims_.size(); d-- > 0;) {
    int64_t idx = o % outer_dims_[d];
    o /= outer_dims_[d];
    for (size_t k = 0; k < n_inputs_; ++k) in_offsets[k] += idx * strides_[d][k];
  }
}

std::vector<int64_t> input_ints(const KernelContext& ctx, size_t i) {
  const Tensor& t = ctx.input(i);
  if (!dtype_is_integer(t.dtype())) ctx.fail("input {} must be an integer tensor, got {}", i, dtype_name(t.dtype()));
  return t.to_int64_vector();
}

double input_scalar(const KernelContext& ctx, size_t i) {
  const Tensor& t = ctx.input(i);
  if (t.numel() != 1) ctx.fail("input {} must hold one value, got shape {}", i, shape_str(t.shape()));
  return t.get_double(0);
}

}  // namespace mpq::rt::cpu
