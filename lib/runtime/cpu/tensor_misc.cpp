// Sorting-style and data-dependent ops: TopK (ties keep the lower index), Unique (sorted or in
// order of first occurrence, with or without axis), ReverseSequence, NonZero.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <type_traits>

#include "runtime/cpu/register_all.h"
#include "runtime/cpu/shape_internal.h"

namespace mpq::rt::cpu {

namespace {

// Strict "a ranks before b" for TopK: NaN counts as the largest value.
template <typename T>
inline bool greater_than(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return !std::isnan(b);
    if (std::isnan(b)) return false;
  }
  return a > b;
}

void topk_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int r = x.rank();
  if (r == 0) ctx.fail("input must have rank >= 1");
  const int axis = normalize_axis(ctx, ctx.node().attr_int("axis", -1), r);
  int64_t k;
  if (ctx.opset() >= 10) {
    const Tensor& kt = ctx.input(1);
    if (kt.numel() != 1) ctx.fail("K must hold one value, got shape {}", shape_str(kt.shape()));
    k = kt.get_int64(0);
  } else {
    k = ctx.node().attr_int("k", -1);
  }
  const bool largest = ctx.opset() < 11 || ctx.node().attr_int("largest", 1) != 0;
  const int64_t dim = x.shape()[static_cast<size_t>(axis)];
  if (k < 0 || k > dim) ctx.fail("K = {} is out of range for axis {} of size {}", k, axis, dim);
  Shape out_shape = x.shape();
  out_shape[static_cast<size_t>(axis)] = k;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= x.shape()[static_cast<size_t>(d)];
  for (int d = axis + 1; d < r; ++d) inner *= x.shape()[static_cast<size_t>(d)];
  Tensor& vals = ctx.alloc_output(0, x.dtype(), out_shape);
  Tensor& inds = ctx.alloc_output(1, DType::Int64, out_shape);
  if (vals.numel() == 0) return;
  visit_arith(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data<T>();
    T* pv = vals.data<T>();
    int64_t* pi = inds.data<int64_t>();
    ctx.pool().parallel_for(outer * inner, std::max<int64_t>(1, 4096 / std::max<int64_t>(dim, 1)), [&](int64_t lo, int64_t hi) {
      std::vector<T> buf(static_cast<size_t>(dim));
      std::vector<int64_t> order(static_cast<size_t>(dim));
      for (int64_t s = lo; s < hi; ++s) {
        const int64_t o = s / inner, i = s % inner;
        const T* src = px + o * dim * inner + i;
        for (int64_t j = 0; j < dim; ++j) buf[static_cast<size_t>(j)] = src[j * inner];
        std::iota(order.begin(), order.end(), int64_t{0});
        auto before = [&](int64_t a, int64_t b) {
          const T va = buf[static_cast<size_t>(a)], vb = buf[static_cast<size_t>(b)];
          if (largest) {
            if (greater_than(va, vb)) return true;
            if (greater_than(vb, va)) return false;
          } else {
            if (greater_than(vb, va)) return true;
            if (greater_than(va, vb)) return false;
          }
          return a < b;
        };
        std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
        T* dv = pv + o * k * inner + i;
        int64_t* di = pi + o * k * inner + i;
        for (int64_t j = 0; j < k; ++j) {
          dv[j * inner] = buf[static_cast<size_t>(order[static_cast<size_t>(j)])];
          di[j * inner] = order[static_cast<size_t>(j)];
        }
      }
    });
  });
}

void unique_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  const bool sorted = ctx.node().attr_int("sorted", 1) != 0;
  const bool has_axis = ctx.node().has_attr("axis");
  const Tensor x = has_axis ? x0 : x0.reshaped({x0.numel()});
  const int axis = has_axis ? normalize_axis(ctx, ctx.node().attr_int("axis", 0), x.rank()) : 0;
  const int64_t dim = x.shape()[static_cast<size_t>(axis)];
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= x.shape()[static_cast<size_t>(d)];
  for (int d = axis + 1; d < x.rank(); ++d) inner *= x.shape()[static_cast<size_t>(d)];
  // Three-way comparison of slices a and b along the axis (lexicographic in C order).
  std::function<int(int64_t, int64_t)> cmp;
  if (x.dtype() == DType::String) {
    const auto& s = x.strings();
    cmp = [&s, outer, inner, dim](int64_t a, int64_t b) {
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
          const auto& va = s[static_cast<size_t>((o * dim + a) * inner + i)];
          const auto& vb = s[static_cast<size_t>((o * dim + b) * inner + i)];
          if (va != vb) return va < vb ? -1 : 1;
        }
      return 0;
    };
  } else {
    visit_arith_bool(x.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* p = x.data<T>();
      cmp = [p, outer, inner, dim](int64_t a, int64_t b) {
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t i = 0; i < inner; ++i) {
            const T va = p[(o * dim + a) * inner + i], vb = p[(o * dim + b) * inner + i];
            if (va != vb) return va < vb ? -1 : 1;
          }
        return 0;
      };
    });
  }
  std::vector<int64_t> order(static_cast<size_t>(dim));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cmp(a, b) < 0; });
  // Groups of equal slices, each represented by its first occurrence.
  std::vector<int64_t> first, counts, group_of(static_cast<size_t>(dim));
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || cmp(order[i - 1], order[i]) != 0) {
      first.push_back(order[i]);
      counts.push_back(0);
    }
    group_of[static_cast<size_t>(order[i])] = static_cast<int64_t>(first.size()) - 1;
    ++counts.back();
  }
  std::vector<int64_t> rank(first.size());  // output position of each group
  std::iota(rank.begin(), rank.end(), int64_t{0});
  if (!sorted) {
    std::vector<int64_t> by_first(first.size());
    std::iota(by_first.begin(), by_first.end(), int64_t{0});
    std::sort(by_first.begin(), by_first.end(), [&](int64_t a, int64_t b) { return first[static_cast<size_t>(a)] < first[static_cast<size_t>(b)]; });
    for (size_t p = 0; p < by_first.size(); ++p) rank[static_cast<size_t>(by_first[p])] = static_cast<int64_t>(p);
  }
  const int64_t nu = static_cast<int64_t>(first.size());
  std::vector<int64_t> out_first(static_cast<size_t>(nu)), out_counts(static_cast<size_t>(nu));
  for (size_t g = 0; g < first.size(); ++g) {
    out_first[static_cast<size_t>(rank[g])] = first[g];
    out_counts[static_cast<size_t>(rank[g])] = counts[g];
  }
  Shape y_shape = x.shape();
  y_shape[static_cast<size_t>(axis)] = nu;
  Tensor& y = ctx.alloc_output(0, x.dtype(), y_shape);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < nu; ++j)
      copy_elements(x, (o * dim + out_first[static_cast<size_t>(j)]) * inner, y, (o * nu + j) * inner, inner);
  if (ctx.output_wanted(1)) ctx.set_output(1, Tensor::from<int64_t>({nu}, out_first));
  if (ctx.output_wanted(2)) {
    std::vector<int64_t> inv(static_cast<size_t>(dim));
    for (int64_t i = 0; i < dim; ++i) inv[static_cast<size_t>(i)] = rank[static_cast<size_t>(group_of[static_cast<size_t>(i)])];
    ctx.set_output(2, Tensor::from<int64_t>({dim}, inv));
  }
  if (ctx.output_wanted(3)) ctx.set_output(3, Tensor::from<int64_t>({nu}, out_counts));
}

void reverse_sequence_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& lens_t = ctx.input(1);
  if (x.rank() < 2) ctx.fail("input must have rank >= 2, got {}", shape_str(x.shape()));
  const int64_t batch_axis = ctx.node().attr_int("batch_axis", 1);
  const int64_t time_axis = ctx.node().attr_int("time_axis", 0);
  if (!((batch_axis == 0 && time_axis == 1) || (batch_axis == 1 && time_axis == 0)))
    ctx.fail("batch_axis and time_axis must be 0 and 1 in some order, got {} and {}", batch_axis, time_axis);
  const int64_t B = x.dim(static_cast<int>(batch_axis)), T = x.dim(static_cast<int>(time_axis));
  std::vector<int64_t> lens = lens_t.to_int64_vector();
  if (static_cast<int64_t>(lens.size()) != B) ctx.fail("sequence_lens has {} values for batch size {}", lens.size(), B);
  const int64_t inner = x.numel() / std::max<int64_t>(1, B * T);
  Tensor out = x.clone();
  auto offset = [&](int64_t b, int64_t t) { return (time_axis == 0 ? t * B + b : b * T + t) * inner; };
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lens[static_cast<size_t>(b)];
    if (len < 0 || len > T) ctx.fail("sequence length {} is out of range [0, {}]", len, T);
    for (int64_t t = 0; t < len; ++t) copy_elements(x, offset(b, len - 1 - t), out, offset(b, t), inner);
  }
  ctx.set_output(0, std::move(out));
}

void nonzero_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Shape shape = x.rank() == 0 ? Shape{1} : x.shape();
  const int r = static_cast<int>(shape.size());
  const int64_t n = x.numel();
  std::vector<int64_t> hits;
  visit_arith_bool(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = x.data<T>();
    for (int64_t i = 0; i < n; ++i)
      if (p[i] != T(0)) hits.push_back(i);
  });
  const int64_t nnz = static_cast<int64_t>(hits.size());
  Tensor& out = ctx.alloc_output(0, DType::Int64, {r, nnz});
  int64_t* po = out.data<int64_t>();
  const std::vector<int64_t> st = strides_of(shape);
  for (int64_t j = 0; j < nnz; ++j) {
    int64_t rem = hits[static_cast<size_t>(j)];
    for (int d = 0; d < r; ++d) {
      po[d * nnz + j] = rem / st[static_cast<size_t>(d)];
      rem %= st[static_cast<size_t>(d)];
    }
  }
}

}  // namespace

void register_tensor_misc(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  r.add_fn("", "TopK", 1, kMaxOpset, cpu, topk_kernel);
  r.add_fn("", "Unique", 11, kMaxOpset, cpu, unique_kernel);
  r.add_fn("", "ReverseSequence", 10, kMaxOpset, cpu, reverse_sequence_kernel, true);
  r.add_fn("", "NonZero", 9, kMaxOpset, cpu, nonzero_kernel);
}

}  // namespace mpq::rt::cpu
