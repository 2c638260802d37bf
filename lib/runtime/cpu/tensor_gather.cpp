// Indexing ops: Gather, GatherElements, GatherND (batch_dims), Scatter (opset 9-10),
// ScatterElements and ScatterND (reduction none/add/mul/max/min), Compress.
// Indices may be negative (counted from the end); an index out of range is a BadInput error.
#include <algorithm>
#include <type_traits>

#include "runtime/cpu/register_all.h"
#include "runtime/cpu/shape_internal.h"

namespace mpq::rt::cpu {

namespace {

// Indices as int64, negative ones wrapped, every one checked against `dim`.
std::vector<int64_t> checked_indices(const KernelContext& ctx, const Tensor& t, int64_t dim, const char* what) {
  if (t.dtype() != DType::Int64 && t.dtype() != DType::Int32)
    ctx.fail("{} must be int32 or int64, got {}", what, dtype_name(t.dtype()));
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::Int64) {
    std::copy_n(t.data<int64_t>(), t.numel(), v.begin());
  } else {
    std::copy_n(t.data<int32_t>(), t.numel(), v.begin());
  }
  for (int64_t& i : v) {
    const int64_t orig = i;
    if (i < 0) i += dim;
    if (i < 0 || i >= dim) ctx.fail("{} value {} is out of range for a dimension of size {}", what, orig, dim);
  }
  return v;
}

void gather_kernel(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  const int r = data.rank();
  if (r == 0) ctx.fail("data must have rank >= 1");
  const int axis = normalize_axis(ctx, ctx.node().attr_int("axis", 0), r);
  const int64_t dim = data.shape()[static_cast<size_t>(axis)];
  std::vector<int64_t> idx = checked_indices(ctx, ind, dim, "index");
  Shape out_shape(data.shape().begin(), data.shape().begin() + axis);
  out_shape.insert(out_shape.end(), ind.shape().begin(), ind.shape().end());
  out_shape.insert(out_shape.end(), data.shape().begin() + axis + 1, data.shape().end());
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= data.shape()[static_cast<size_t>(d)];
  for (int d = axis + 1; d < r; ++d) inner *= data.shape()[static_cast<size_t>(d)];
  const int64_t ni = static_cast<int64_t>(idx.size());
  Tensor& out = ctx.alloc_output(0, data.dtype(), out_shape);
  if (out.numel() == 0) return;
  if (data.dtype() == DType::String) {
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < ni; ++j) copy_elements(data, (o * dim + idx[static_cast<size_t>(j)]) * inner, out, (o * ni + j) * inner, inner);
    return;
  }
  visit_by_width(data.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pd = static_cast<const T*>(data.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    ctx.pool().parallel_for(outer * ni, std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t it = lo; it < hi; ++it) {
        const int64_t o = it / ni, j = it % ni;
        const T* s = pd + (o * dim + idx[static_cast<size_t>(j)]) * inner;
        T* d = po + it * inner;
        if (inner == 1) {
          *d = *s;
        } else {
          std::memcpy(d, s, static_cast<size_t>(inner) * sizeof(T));
        }
      }
    });
  });
}

// Source offset in `data` (strides ds, axis stride dropped) for every element of an
// indices-shaped tensor, in order: fn(element, base_offset).
template <typename F>
void for_each_element(const Shape& ind_shape, const Shape& data_shape, int axis, F&& fn) {
  std::vector<int64_t> ds = strides_of(data_shape);
  ds[static_cast<size_t>(axis)] = 0;
  const StridedRuns runs = make_runs(ind_shape, ds);
  const int64_t inner = runs.inner, is = runs.inner_stride;
  for_runs(runs, 0, runs.outer, [&](int64_t run, int64_t off) {
    for (int64_t i = 0; i < inner; ++i) fn(run * inner + i, off + i * is);
  });
}

void check_elementwise_shapes(const KernelContext& ctx, const Tensor& data, const Tensor& ind, int axis) {
  if (ind.rank() != data.rank())
    ctx.fail("indices {} must have the rank of data {}", shape_str(ind.shape()), shape_str(data.shape()));
  for (int d = 0; d < data.rank(); ++d)
    if (d != axis && ind.shape()[static_cast<size_t>(d)] > data.shape()[static_cast<size_t>(d)])
      ctx.fail("indices {} exceed data {} along axis {}", shape_str(ind.shape()), shape_str(data.shape()), d);
}

void gather_elements_kernel(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  const int r = data.rank();
  if (r == 0) ctx.fail("data must have rank >= 1");
  const int axis = normalize_axis(ctx, ctx.node().attr_int("axis", 0), r);
  check_elementwise_shapes(ctx, data, ind, axis);
  const int64_t dim = data.shape()[static_cast<size_t>(axis)];
  const int64_t astride = strides_of(data.shape())[static_cast<size_t>(axis)];
  std::vector<int64_t> idx = checked_indices(ctx, ind, dim, "index");
  Tensor& out = ctx.alloc_output(0, data.dtype(), ind.shape());
  if (out.numel() == 0) return;
  if (data.dtype() == DType::String) {
    for_each_element(ind.shape(), data.shape(), axis, [&](int64_t e, int64_t off) {
      copy_elements(data, off + idx[static_cast<size_t>(e)] * astride, out, e, 1);
    });
    return;
  }
  visit_by_width(data.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pd = static_cast<const T*>(data.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    for_each_element(ind.shape(), data.shape(), axis,
                     [&](int64_t e, int64_t off) { po[e] = pd[off + idx[static_cast<size_t>(e)] * astride]; });
  });
}

enum class Reduction { None, Add, Mul, Max, Min };

Reduction reduction_attr(const KernelContext& ctx) {
  const std::string s = ctx.node().attr_string("reduction", "none");
  if (s == "none") return Reduction::None;
  if (s == "add") return Reduction::Add;
  if (s == "mul") return Reduction::Mul;
  if (s == "max") return Reduction::Max;
  if (s == "min") return Reduction::Min;
  ctx.fail("unknown reduction '{}'", s);
}

template <typename T>
inline void apply(T& dst, T v, Reduction red) {
  switch (red) {
    case Reduction::None: dst = v; break;
    case Reduction::Add:
      if constexpr (std::is_same_v<T, bool>) dst = dst || v;
      else dst = static_cast<T>(dst + v);
      break;
    case Reduction::Mul:
      if constexpr (std::is_same_v<T, bool>) dst = dst && v;
      else dst = static_cast<T>(dst * v);
      break;
    case Reduction::Max: dst = std::max(dst, v); break;
    case Reduction::Min: dst = std::min(dst, v); break;
  }
}

// Runs fn with T = the storage type: by width for plain assignment, arithmetic for reductions.
template <typename F>
void visit_scatter(const KernelContext& ctx, DType t, Reduction red, F&& f) {
  if (red == Reduction::None) {
    visit_by_width(t, [&](auto tag) { f(tag, Reduction::None); });
  } else {
    if (!(dtype_is_float(t) || dtype_is_integer(t) || t == DType::Bool) || t == DType::Float16 || t == DType::BFloat16)
      ctx.fail_unsupported("reduction on {} is not supported", dtype_name(t));
    visit_arith_bool(t, [&](auto tag) { f(tag, red); });
  }
}

void scatter_elements_kernel(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  const Tensor& upd = ctx.input(2);
  const int r = data.rank();
  if (r == 0) ctx.fail("data must have rank >= 1");
  const int axis = normalize_axis(ctx, ctx.node().attr_int("axis", 0), r);
  check_elementwise_shapes(ctx, data, ind, axis);
  if (upd.shape() != ind.shape())
    ctx.fail("updates {} must have the shape of indices {}", shape_str(upd.shape()), shape_str(ind.shape()));
  if (upd.dtype() != data.dtype()) ctx.fail("updates and data have different element types");
  const Reduction red = ctx.node().op_type == "Scatter" ? Reduction::None : reduction_attr(ctx);
  const int64_t dim = data.shape()[static_cast<size_t>(axis)];
  const int64_t astride = strides_of(data.shape())[static_cast<size_t>(axis)];
  std::vector<int64_t> idx = checked_indices(ctx, ind, dim, "index");
  Tensor out = data.clone();
  if (data.dtype() == DType::String) {
    if (red != Reduction::None) ctx.fail("reductions need numeric data");
    for_each_element(ind.shape(), data.shape(), axis, [&](int64_t e, int64_t off) {
      copy_elements(upd, e, out, off + idx[static_cast<size_t>(e)] * astride, 1);
    });
    ctx.set_output(0, std::move(out));
    return;
  }
  visit_scatter(ctx, data.dtype(), red, [&](auto tag, Reduction rd) {
    using T = typename decltype(tag)::type;
    const T* pu = static_cast<const T*>(upd.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    for_each_element(ind.shape(), data.shape(), axis, [&](int64_t e, int64_t off) {
      apply<T>(po[off + idx[static_cast<size_t>(e)] * astride], pu[e], rd);
    });
  });
  ctx.set_output(0, std::move(out));
}

// For GatherND/ScatterND: element offset of every index tuple (last axis of `ind`, length k) into
// data dimensions [first, first + k).
std::vector<int64_t> tuple_offsets(const KernelContext& ctx, const Tensor& ind, const Shape& data_shape, size_t first,
                                   int64_t k) {
  if (ind.dtype() != DType::Int64 && ind.dtype() != DType::Int32)
    ctx.fail("indices must be int32 or int64, got {}", dtype_name(ind.dtype()));
  const std::vector<int64_t> ds = strides_of(data_shape);
  const std::vector<int64_t> all = ind.to_int64_vector();
  const int64_t n = k == 0 ? 0 : static_cast<int64_t>(all.size()) / k;
  std::vector<int64_t> offs(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    int64_t off = 0;
    for (int64_t m = 0; m < k; ++m) {
      const size_t dd = first + static_cast<size_t>(m);
      int64_t i = all[static_cast<size_t>(t * k + m)];
      const int64_t dim = data_shape[dd];
      if (i < 0) i += dim;
      if (i < 0 || i >= dim)
        ctx.fail("index value {} is out of range for dimension {} of size {}", all[static_cast<size_t>(t * k + m)], dd, dim);
      off += i * ds[dd];
    }
    offs[static_cast<size_t>(t)] = off;
  }
  return offs;
}

void gather_nd_kernel(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  const int64_t b = ctx.opset() >= 12 ? ctx.node().attr_int("batch_dims", 0) : 0;
  const int64_t r = data.rank(), q = ind.rank();
  if (q < 1) ctx.fail("indices must have rank >= 1");
  if (b < 0 || b >= std::min(r, q)) ctx.fail("batch_dims {} must be less than the ranks of data and indices", b);
  const int64_t k = ind.shape().back();
  if (k < 0 || k > r - b) ctx.fail("indices' last dimension {} exceeds data rank {} minus batch_dims {}", k, r, b);
  for (int64_t d = 0; d < b; ++d)
    if (data.shape()[static_cast<size_t>(d)] != ind.shape()[static_cast<size_t>(d)])
      ctx.fail("batch dimensions of data {} and indices {} differ", shape_str(data.shape()), shape_str(ind.shape()));
  Shape out_shape(ind.shape().begin(), ind.shape().end() - 1);
  out_shape.insert(out_shape.end(), data.shape().begin() + b + k, data.shape().end());
  int64_t batch = 1, slice = 1;
  for (int64_t d = 0; d < b; ++d) batch *= data.shape()[static_cast<size_t>(d)];
  for (int64_t d = b + k; d < r; ++d) slice *= data.shape()[static_cast<size_t>(d)];
  const Shape batch_shape(data.shape().begin() + b, data.shape().end());
  const int64_t batch_stride = shape_numel(batch_shape);
  std::vector<int64_t> offs = tuple_offsets(ctx, ind, batch_shape, 0, k);
  if (k == 0) {
    // Empty tuples select whole batch entries.
    int64_t n = shape_numel(Shape(ind.shape().begin(), ind.shape().end() - 1));
    offs.assign(static_cast<size_t>(n), 0);
  }
  const int64_t per_batch = batch == 0 ? 0 : static_cast<int64_t>(offs.size()) / batch;
  Tensor& out = ctx.alloc_output(0, data.dtype(), out_shape);
  for (int64_t t = 0; t < static_cast<int64_t>(offs.size()); ++t) {
    const int64_t bi = per_batch == 0 ? 0 : t / per_batch;
    copy_elements(data, bi * batch_stride + offs[static_cast<size_t>(t)], out, t * slice, slice);
  }
}

void scatter_nd_kernel(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  const Tensor& upd = ctx.input(2);
  const int64_t r = data.rank(), q = ind.rank();
  if (q < 1) ctx.fail("indices must have rank >= 1");
  const int64_t k = ind.shape().back();
  if (k < 1 || k > r) ctx.fail("indices' last dimension {} must be in [1, {}]", k, r);
  Shape want(ind.shape().begin(), ind.shape().end() - 1);
  want.insert(want.end(), data.shape().begin() + k, data.shape().end());
  if (upd.shape() != want) ctx.fail("updates {} must have shape {}", shape_str(upd.shape()), shape_str(want));
  if (upd.dtype() != data.dtype()) ctx.fail("updates and data have different element types");
  const Reduction red = reduction_attr(ctx);
  int64_t slice = 1;
  for (int64_t d = k; d < r; ++d) slice *= data.shape()[static_cast<size_t>(d)];
  const std::vector<int64_t> offs = tuple_offsets(ctx, ind, data.shape(), 0, k);
  Tensor out = data.clone();
  if (data.dtype() == DType::String) {
    if (red != Reduction::None) ctx.fail("reductions need numeric data");
    for (size_t t = 0; t < offs.size(); ++t) copy_elements(upd, static_cast<int64_t>(t) * slice, out, offs[t], slice);
  } else {
    visit_scatter(ctx, data.dtype(), red, [&](auto tag, Reduction rd) {
      using T = typename decltype(tag)::type;
      const T* pu = static_cast<const T*>(upd.raw_data());
      T* po = static_cast<T*>(out.raw_data());
      for (size_t t = 0; t < offs.size(); ++t) {
        T* d = po + offs[t];
        const T* s = pu + static_cast<int64_t>(t) * slice;
        for (int64_t i = 0; i < slice; ++i) apply<T>(d[i], s[i], rd);
      }
    });
  }
  ctx.set_output(0, std::move(out));
}

void compress_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& cond = ctx.input(1);
  if (cond.rank() != 1) ctx.fail("condition must be 1-D, got {}", shape_str(cond.shape()));
  const bool has_axis = ctx.node().has_attr("axis");
  const Tensor src = has_axis ? x : x.reshaped({x.numel()});
  const int axis = has_axis ? normalize_axis(ctx, ctx.node().attr_int("axis", 0), x.rank()) : 0;
  const int64_t dim = src.shape()[static_cast<size_t>(axis)];
  std::vector<int64_t> keep;
  const int64_t n = std::min(dim, cond.numel());
  for (int64_t i = 0; i < n; ++i)
    if (cond.get_double(i) != 0.0) keep.push_back(i);
  for (int64_t i = n; i < cond.numel(); ++i)
    if (cond.get_double(i) != 0.0) ctx.fail("condition selects index {} beyond the axis size {}", i, dim);
  Shape out_shape = src.shape();
  out_shape[static_cast<size_t>(axis)] = static_cast<int64_t>(keep.size());
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= src.shape()[static_cast<size_t>(d)];
  for (int d = axis + 1; d < src.rank(); ++d) inner *= src.shape()[static_cast<size_t>(d)];
  Tensor& out = ctx.alloc_output(0, x.dtype(), out_shape);
  const int64_t nk = static_cast<int64_t>(keep.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < nk; ++j) copy_elements(src, (o * dim + keep[static_cast<size_t>(j)]) * inner, out, (o * nk + j) * inner, inner);
}

}  // namespace

void register_tensor_gather(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  r.add_fn("", "Gather", 1, kMaxOpset, cpu, gather_kernel, true);
  r.add_fn("", "GatherElements", 11, kMaxOpset, cpu, gather_elements_kernel, true);
  r.add_fn("", "GatherND", 11, kMaxOpset, cpu, gather_nd_kernel, true);
  r.add_fn("", "Compress", 9, kMaxOpset, cpu, compress_kernel, true);
  // Scatter* with a reduction does arithmetic: float16 data goes through float32 (exact for
  // plain assignment too).
  r.add_fn("", "Scatter", 9, kMaxOpset, cpu, scatter_elements_kernel);
  r.add_fn("", "ScatterElements", 11, kMaxOpset, cpu, scatter_elements_kernel);
  r.add_fn("", "ScatterND", 11, kMaxOpset, cpu, scatter_nd_kernel);
}

}  // namespace mpq::rt::cpu
