// Helpers shared by the data-movement backward kernels (declared in shape_grad_util.h).
#include "train/grads/shape_grad_util.h"

#include <algorithm>
#include <cstring>

#include "train/grads/grad_util.h"

namespace mpq::train::grads {

using grad_util::visit_float;

int grad_axis(const GradContext& ctx, int64_t axis, int rank) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) ctx.fail("axis {} is out of range for rank {}", axis, rank);
  return static_cast<int>(a);
}

std::vector<int64_t> saved_ints(const GradContext& ctx, size_t i) {
  if (!ctx.has_input(i)) return {};
  const Tensor& t = ctx.input(i);
  if (t.dtype() != DType::Int64 && t.dtype() != DType::Int32)
    ctx.fail("input {} must be int32 or int64, got {}", i, dtype_name(t.dtype()));
  return t.to_int64_vector();
}

Tensor fold_axis(rt::ThreadPool& pool, const Tensor& src, size_t axis, const std::vector<int64_t>& map, int64_t size) {
  const Shape& cs = src.shape();
  if (axis >= cs.size() || static_cast<int64_t>(map.size()) != cs[axis])
    fail_internal("fold_axis: a map of {} entries for axis {} of {}", map.size(), axis, shape_str(cs));
  Shape ns = cs;
  ns[axis] = size;
  // The sources' output indices, grouped by source (counting sort keeps each group in order).
  std::vector<int64_t> begin(static_cast<size_t>(size) + 1, 0), order(map.size());
  for (int64_t m : map) {
    if (m >= size) fail_internal("fold_axis: target {} is out of range for size {}", m, size);
    if (m >= 0) ++begin[static_cast<size_t>(m) + 1];
  }
  for (size_t j = 0; j < static_cast<size_t>(size); ++j) begin[j + 1] += begin[j];
  std::vector<int64_t> fill(begin.begin(), begin.end() - 1);
  for (size_t i = 0; i < map.size(); ++i)
    if (map[i] >= 0) order[static_cast<size_t>(fill[static_cast<size_t>(map[i])]++)] = static_cast<int64_t>(i);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= cs[d];
  for (size_t d = axis + 1; d < cs.size(); ++d) inner *= cs[d];
  const int64_t in_dim = cs[axis];
  Tensor out(src.dtype(), ns);
  if (out.numel() == 0) return out;
  visit_float(src.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pc = src.data<T>();
    T* po = out.data<T>();
    const int64_t per_item = std::max<int64_t>(1, inner * static_cast<int64_t>(map.size()) / std::max<int64_t>(size, 1));
    pool.parallel_for(outer * size, std::max<int64_t>(1, 16384 / per_item), [&](int64_t lo, int64_t hi) {
      for (int64_t it = lo; it < hi; ++it) {
        const int64_t o = it / size;
        const size_t j = static_cast<size_t>(it % size);
        T* d = po + it * inner;
        const int64_t b = begin[j], e = begin[j + 1];
        if (b == e) {
          std::fill(d, d + inner, T(0));
          continue;
        }
        const T* row = pc + o * in_dim * inner;
        std::memcpy(d, row + order[static_cast<size_t>(b)] * inner, static_cast<size_t>(inner) * sizeof(T));
        for (int64_t k = b + 1; k < e; ++k) {
          const T* s = row + order[static_cast<size_t>(k)] * inner;
          for (int64_t q = 0; q < inner; ++q) d[q] += s[q];
        }
      }
    });
  });
  return out;
}

}  // namespace mpq::train::grads
