// Tensor creation and simple index ops: Constant, ConstantOfShape, Range, EyeLike, OneHot, Trilu.
// Cast/CastLike are in tensor_cast.cpp, Gather/Scatter/Compress in tensor_gather.cpp, TopK,
// Unique, ReverseSequence and NonZero in tensor_misc.cpp.
#include <algorithm>
#include <cmath>

#include "runtime/cpu/register_all.h"
#include "runtime/cpu/shape_internal.h"

namespace mpq::rt::cpu {

namespace {

void constant_kernel(KernelContext& ctx) {
  const ir::Node& n = ctx.node();
  if (n.has_attr("sparse_value")) ctx.fail_unsupported("sparse_value constants are not supported");
  if (const Tensor* t = n.attr_tensor("value")) {
    ctx.set_output(0, *t);
  } else if (n.has_attr("value_float")) {
    ctx.set_output(0, Tensor::scalar<float>(n.attr_float("value_float", 0.0f)));
  } else if (n.has_attr("value_floats")) {
    std::vector<float> v = n.attr_floats("value_floats");
    ctx.set_output(0, Tensor::from<float>({static_cast<int64_t>(v.size())}, v));
  } else if (n.has_attr("value_int")) {
    ctx.set_output(0, Tensor::scalar<int64_t>(n.attr_int("value_int", 0)));
  } else if (n.has_attr("value_ints")) {
    std::vector<int64_t> v = n.attr_ints("value_ints");
    ctx.set_output(0, Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v));
  } else if (n.has_attr("value_string")) {
    ctx.set_output(0, Tensor::from_strings({}, {n.attr_string("value_string")}));
  } else if (const ir::Attribute* a = n.attr("value_strings")) {
    ctx.set_output(0, Tensor::from_strings({static_cast<int64_t>(a->strings.size())}, a->strings));
  } else {
    ctx.fail("has no value attribute");
  }
}

// Fill `out` with copies of the single element of `value` (same dtype).
void fill_with(ThreadPool& pool, Tensor& out, const Tensor& value) {
  const int64_t n = out.numel();
  if (n == 0) return;
  if (out.dtype() == DType::String) {
    std::fill(out.strings().begin(), out.strings().end(), value.strings()[0]);
    return;
  }
  visit_by_width(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v;
    std::memcpy(&v, value.raw_data(), sizeof(T));
    T* p = static_cast<T*>(out.raw_data());
    pool.parallel_for(n, 65536, [&](int64_t lo, int64_t hi) { std::fill(p + lo, p + hi, v); });
  });
}

void constant_of_shape_kernel(KernelContext& ctx) {
  std::vector<int64_t> dims = input_ints(ctx, 0);
  for (int64_t d : dims)
    if (d < 0) ctx.fail("shape {} has a negative dimension", shape_str(dims));
  Tensor value = Tensor::zeros(DType::Float32, {});
  if (const Tensor* v = ctx.node().attr_tensor("value")) {
    if (v->numel() != 1) ctx.fail("value must hold one element, got shape {}", shape_str(v->shape()));
    value = *v;
  }
  Tensor& out = ctx.alloc_output(0, value.dtype(), Shape(dims.begin(), dims.end()));
  fill_with(ctx.pool(), out, value);
}

void range_kernel(KernelContext& ctx) {
  const Tensor& s = ctx.input(0);
  const Tensor& l = ctx.input(1);
  const Tensor& d = ctx.input(2);
  if (s.dtype() != l.dtype() || s.dtype() != d.dtype()) ctx.fail("start, limit and delta must have the same type");
  if (s.numel() != 1 || l.numel() != 1 || d.numel() != 1) ctx.fail("start, limit and delta must be scalars");
  visit_arith(s.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T start = s.data<T>()[0], limit = l.data<T>()[0], delta = d.data<T>()[0];
    if (delta == T(0)) ctx.fail("delta must not be 0");
    int64_t n;
    if constexpr (std::is_floating_point_v<T>) {
      n = static_cast<int64_t>(std::max(std::ceil((static_cast<double>(limit) - static_cast<double>(start)) / static_cast<double>(delta)), 0.0));
    } else {
      const int64_t span = static_cast<int64_t>(limit) - static_cast<int64_t>(start);
      const int64_t dl = static_cast<int64_t>(delta);
      // ceil(span / dl) for integers of either sign.
      n = span / dl + ((span % dl != 0 && ((span < 0) == (dl < 0))) ? 1 : 0);
      n = std::max<int64_t>(n, 0);
    }
    Tensor& out = ctx.alloc_output(0, s.dtype(), {n});
    T* p = out.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(start + static_cast<T>(i) * delta);
  });
}

DType dtype_attr(const KernelContext& ctx, const char* name, DType fallback) {
  if (!ctx.node().has_attr(name)) return fallback;
  int64_t v = ctx.node().attr_int(name, 0);
  if (!dtype_is_valid(static_cast<int32_t>(v)) || v == 0) ctx.fail("attribute {} = {} is not a valid element type", name, v);
  return static_cast<DType>(v);
}

void eye_like_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() != 2) ctx.fail("input must be 2-D, got {}", shape_str(x.shape()));
  const DType t = dtype_attr(ctx, "dtype", x.dtype());
  if (t == DType::String) ctx.fail("EyeLike cannot produce strings");
  const int64_t k = ctx.node().attr_int("k", 0);
  const int64_t rows = x.dim(0), cols = x.dim(1);
  Tensor& out = ctx.alloc_output(0, t, x.shape());
  if (out.nbytes()) std::memset(out.raw_data(), 0, out.nbytes());
  Tensor one = Tensor::scalar<float>(1.0f).cast_to(t);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t j = i + k;
    if (j >= 0 && j < cols) copy_elements(one, 0, out, i * cols + j, 1);
  }
}

void one_hot_kernel(KernelContext& ctx) {
  const Tensor& indices = ctx.input(0);
  const Tensor& depth_t = ctx.input(1);
  const Tensor& values = ctx.input(2);
  if (depth_t.numel() != 1) ctx.fail("depth must hold one value, got shape {}", shape_str(depth_t.shape()));
  if (values.numel() != 2) ctx.fail("values must hold [off, on], got shape {}", shape_str(values.shape()));
  const int64_t depth = static_cast<int64_t>(depth_t.get_double(0));
  if (depth <= 0) ctx.fail("depth must be positive, got {}", depth);
  const int out_rank = indices.rank() + 1;
  const int axis = normalize_axis(ctx, ctx.node().attr_int("axis", -1), out_rank);
  Shape out_shape = indices.shape();
  out_shape.insert(out_shape.begin() + axis, depth);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= indices.shape()[static_cast<size_t>(d)];
  for (int d = axis; d < indices.rank(); ++d) inner *= indices.shape()[static_cast<size_t>(d)];
  Tensor& out = ctx.alloc_output(0, values.dtype(), out_shape);
  if (values.dtype() == DType::String) ctx.fail_unsupported("OneHot with string values is not supported");
  Tensor off = Tensor(values.dtype(), {});
  copy_elements(values, 0, off, 0, 1);
  fill_with(ctx.pool(), out, off);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double v = indices.get_double(o * inner + i);
      int64_t idx = static_cast<int64_t>(v);
      if (idx < 0) idx += depth;
      if (idx < 0 || idx >= depth) continue;
      copy_elements(values, 1, out, (o * depth + idx) * inner + i, 1);
    }
}

void trilu_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 2) ctx.fail("input must have rank >= 2, got {}", shape_str(x.shape()));
  int64_t k = 0;
  if (ctx.has_input(1)) k = static_cast<int64_t>(input_scalar(ctx, 1));
  const bool upper = ctx.node().attr_int("upper", 1) != 0;
  const int64_t N = x.dim(-2), M = x.dim(-1);
  const int64_t batch = N * M == 0 ? 0 : x.numel() / (N * M);
  Tensor& out = ctx.alloc_output(0, x.dtype(), x.shape());
  if (x.dtype() == DType::String) ctx.fail_unsupported("Trilu of strings is not supported");
  visit_by_width(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x.raw_data());
    T* py = static_cast<T*>(out.raw_data());
    ctx.pool().parallel_for(batch * N, std::max<int64_t>(1, 16384 / std::max<int64_t>(M, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t row = lo; row < hi; ++row) {
        const int64_t i = row % N;
        const T* s = px + row * M;
        T* d = py + row * M;
        // upper keeps j >= i + k; lower keeps j <= i + k.
        const int64_t edge = i + k;
        for (int64_t j = 0; j < M; ++j) {
          const bool keep = upper ? j >= edge : j <= edge;
          d[j] = keep ? s[j] : T{};
        }
      }
    });
  });
}

}  // namespace

void register_tensor_ops(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  r.add_fn("", "Constant", 1, kMaxOpset, cpu, constant_kernel, true);
  r.add_fn("", "ConstantOfShape", 9, kMaxOpset, cpu, constant_of_shape_kernel, true);
  r.add_fn("", "Range", 11, kMaxOpset, cpu, range_kernel);
  r.add_fn("", "EyeLike", 9, kMaxOpset, cpu, eye_like_kernel, true);
  r.add_fn("", "OneHot", 9, kMaxOpset, cpu, one_hot_kernel, true);
  r.add_fn("", "Trilu", 14, kMaxOpset, cpu, trilu_kernel, true);
  register_tensor_cast(r);
  register_tensor_gather(r);
  register_tensor_misc(r);
}

}  // namespace mpq::rt::cpu
