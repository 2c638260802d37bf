// Quantization: QuantizeLinear, DequantizeLinear (per tensor, per axis, blocked), DynamicQuantizeLinear.
// The integer matmul/conv ops live in quant_gemm.cpp. Every formula matches lib/calib/quant_ref
// bit for bit (tests/runtime/quant_test.cpp checks this on millions of values).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "runtime/cpu/common.h"
#include "runtime/cpu/quant_internal.h"
#include "runtime/cpu/register_all.h"

namespace mpq::rt::cpu {

namespace quant {

bool is_float8(DType t) {
  return t == DType::Float8E4M3FN || t == DType::Float8E4M3FNUZ || t == DType::Float8E5M2 ||
         t == DType::Float8E5M2FNUZ;
}

bool is_quant_int_type(DType t) {
  switch (t) {
    case DType::Int8:
    case DType::UInt8:
    case DType::Int16:
    case DType::UInt16:
    case DType::Int32:
    case DType::Int4:
    case DType::UInt4: return true;
    default: return false;
  }
}

QRange qrange_of(DType t) {
  switch (t) {
    case DType::Int8: return {-128, 127};
    case DType::UInt8: return {0, 255};
    case DType::Int16: return {-32768, 32767};
    case DType::UInt16: return {0, 65535};
    case DType::Int4: return {-8, 7};
    case DType::UInt4: return {0, 15};
    case DType::Int32: return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    default: fail_internal("qrange_of: {} is not a quantized integer type", dtype_name(t));
  }
}

void unpack_int4(const uint8_t* packed, int64_t n, bool is_signed, int8_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    int v = (packed[i >> 1] >> ((i & 1) * 4)) & 0xF;
    if (is_signed && v >= 8) v -= 16;
    out[i] = static_cast<int8_t>(v);
  }
}

void pack_int4(const int8_t* values, int64_t n, uint8_t* packed) {
  for (int64_t i = 0; i + 1 < n; i += 2)
    packed[i >> 1] = static_cast<uint8_t>((values[i] & 0xF) | ((values[i + 1] & 0xF) << 4));
  if (n & 1) packed[n >> 1] = static_cast<uint8_t>(values[n - 1] & 0xF);
}

std::vector<int32_t> read_int32(const Tensor& t) {
  const int64_t n = t.numel();
  std::vector<int32_t> out(static_cast<size_t>(n));
  if (t.dtype() == DType::Int4 || t.dtype() == DType::UInt4) {
    std::vector<int8_t> tmp(static_cast<size_t>(n));
    unpack_int4(static_cast<const uint8_t*>(t.raw_data()), n, t.dtype() == DType::Int4, tmp.data());
    for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = tmp[static_cast<size_t>(i)];
    return out;
  }
  visit_quant_storage(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = t.data<T>();
    for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<int32_t>(p[i]);
  });
  return out;
}

void check_scales(const KernelContext& ctx, const float* scale, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = scale[i];
    if (!(s > 0.0f) || !std::isfinite(s))
      ctx.fail("{} must be finite and positive, got {} (element {})", what, s, i);
  }
}

std::vector<float> read_scales(const KernelContext& ctx, const Tensor& t, const char* what) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::Float32) {
    const float* p = t.data<float>();
    std::copy(p, p + t.numel(), out.begin());
  } else if (t.dtype() == DType::Float64) {
    const double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<size_t>(i)] = static_cast<float>(p[i]);
  } else {
    ctx.fail("{} must be a float tensor, got {}", what, dtype_name(t.dtype()));
  }
  check_scales(ctx, out.data(), t.numel(), what);
  return out;
}

}  // namespace quant

namespace {

using namespace quant;

// How the scale / zero point apply to x, viewed as [outer, channels, inner] around `axis`.
struct Layout {
  enum Kind { PerTensor, PerAxis, Blocked } kind = PerTensor;
  int64_t outer = 1, channels = 1, inner = 1;
  int64_t block = 0, blocks = 1;
};

Layout param_layout(const KernelContext& ctx, const Tensor& x, const Tensor& scale, const Tensor* zp) {
  const ir::Node& node = ctx.node();
  Layout L;
  const int64_t block = ctx.opset() >= 21 ? node.attr_int("block_size", 0) : 0;
  if (block < 0) ctx.fail("block_size must be >= 0, got {}", block);
  if (block == 0 && scale.numel() == 1 && scale.rank() <= 1) {
    L.kind = Layout::PerTensor;
    L.inner = x.numel();
  } else {
    if (ctx.opset() < 13) ctx.fail("the scale must be a scalar before opset 13, got shape {}", shape_str(scale.shape()));
    const int axis = normalize_axis(ctx, node.attr_int("axis", 1), x.rank());
    for (int d = 0; d < axis; ++d) L.outer *= x.dim(d);
    L.channels = x.dim(axis);
    for (int d = axis + 1; d < x.rank(); ++d) L.inner *= x.dim(d);
    if (block == 0) {
      if (scale.rank() != 1 || scale.dim(0) != L.channels)
        ctx.fail("per-axis scale must be 1-D of size {} (dimension {} of input {}), got shape {}", L.channels, axis,
                 shape_str(x.shape()), shape_str(scale.shape()));
      L.kind = Layout::PerAxis;
    } else {
      L.kind = Layout::Blocked;
      L.block = block;
      L.blocks = (L.channels + block - 1) / block;
      bool ok = scale.rank() == x.rank();
      for (int d = 0; ok && d < x.rank(); ++d) ok = scale.dim(d) == (d == axis ? L.blocks : x.dim(d));
      if (!ok)
        ctx.fail("blocked scale for input {} (axis {}, block_size {}) must have the input's shape with dimension {} "
                 "equal to {}, got {}",
                 shape_str(x.shape()), axis, block, axis, L.blocks, shape_str(scale.shape()));
    }
  }
  if (zp && zp->shape() != scale.shape() && !(zp->numel() == 1 && scale.numel() == 1))
    ctx.fail("zero point shape {} differs from scale shape {}", shape_str(zp->shape()), shape_str(scale.shape()));
  return L;
}

// Drives `run(off, len, s, z)` (one scale for a contiguous run) and `run_vec(off, len, s*, z*)` (a
// scale per element) over every element of x according to the layout, in parallel.
template <typename RunScalar, typename RunVec>
void for_each_run(ThreadPool& pool, const Layout& L, const float* s, const int32_t* z, RunScalar run, RunVec run_vec) {
  const int64_t n = L.outer * L.channels * L.inner;
  if (n == 0) return;
  constexpr int64_t kGrain = 16384;
  switch (L.kind) {
    case Layout::PerTensor:
      pool.parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) { run(lo, hi - lo, s[0], z[0]); });
      break;
    case Layout::PerAxis:
      if (L.inner >= 32) {
        const int64_t rows = L.outer * L.channels;
        pool.parallel_for(rows, std::max<int64_t>(1, kGrain / L.inner), [&](int64_t lo, int64_t hi) {
          for (int64_t r = lo; r < hi; ++r) {
            const int64_t c = r % L.channels;
            run(r * L.inner, L.inner, s[c], z[c]);
          }
        });
      } else {
        // Short runs: expand the parameters to one per element of a [channels, inner] row.
        const int64_t row = L.channels * L.inner;
        std::vector<float> es(static_cast<size_t>(row));
        std::vector<int32_t> ez(static_cast<size_t>(row));
        for (int64_t c = 0; c < L.channels; ++c)
          for (int64_t i = 0; i < L.inner; ++i) {
            es[static_cast<size_t>(c * L.inner + i)] = s[c];
            ez[static_cast<size_t>(c * L.inner + i)] = z[c];
          }
        pool.parallel_for(L.outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(row, 1)), [&](int64_t lo, int64_t hi) {
          for (int64_t o = lo; o < hi; ++o) run_vec(o * row, row, es.data(), ez.data());
        });
      }
      break;
    case Layout::Blocked:
      if (L.inner == 1) {
        // Blocks are contiguous runs along the last axis.
        const int64_t units = L.outer * L.blocks;
        pool.parallel_for(units, std::max<int64_t>(1, kGrain / L.block), [&](int64_t lo, int64_t hi) {
          for (int64_t u = lo; u < hi; ++u) {
            const int64_t o = u / L.blocks, b = u % L.blocks;
            const int64_t start = b * L.block;
            const int64_t len = std::min(L.block, L.channels - start);
            run(o * L.channels + start, len, s[u], z[u]);
          }
        });
      } else {
        const int64_t rows = L.outer * L.channels;
        pool.parallel_for(rows, std::max<int64_t>(1, kGrain / L.inner), [&](int64_t lo, int64_t hi) {
          for (int64_t r = lo; r < hi; ++r) {
            const int64_t o = r / L.channels, c = r % L.channels;
            const int64_t p = (o * L.blocks + c / L.block) * L.inner;
            run_vec(r * L.inner, L.inner, s + p, z + p);
          }
        });
      }
      break;
  }
}

// The zero point values (zeros when absent), checked against the quantized type.
std::vector<int32_t> zero_points(const KernelContext& ctx, const Tensor* zp, DType qtype, int64_t count) {
  if (!zp) return std::vector<int32_t>(static_cast<size_t>(count), 0);
  if (zp->dtype() != qtype)
    ctx.fail("zero point type {} does not match the quantized type {}", dtype_name(zp->dtype()), dtype_name(qtype));
  return read_int32(*zp);
}

// ---------------------------------------------------------------------------------------------
// QuantizeLinear(x, y_scale, y_zero_point?) -> y

void quantize_linear(KernelContext& ctx) {
  const Tensor& x_in = ctx.input(0);
  const Tensor& scale_t = ctx.input(1);
  const Tensor* zp_t = ctx.input_or_null(2);
  const ir::Node& node = ctx.node();

  DType qtype = zp_t ? zp_t->dtype() : DType::UInt8;
  if (ctx.opset() >= 21 && node.has_attr("output_dtype")) {
    const int64_t od = node.attr_int("output_dtype", 0);
    if (od != 0) {
      if (!dtype_is_valid(static_cast<int32_t>(od))) ctx.fail("output_dtype {} is not a valid element type", od);
      const DType want = static_cast<DType>(od);
      if (zp_t && zp_t->dtype() != want)
        ctx.fail("output_dtype {} does not match the zero point type {}", dtype_name(want), dtype_name(zp_t->dtype()));
      qtype = want;
    }
  }
  if (is_float8(qtype)) ctx.fail_unsupported("quantizing to {} is not supported", dtype_name(qtype));
  if (!is_quant_int_type(qtype) || qtype == DType::Int32)
    ctx.fail("cannot quantize to {} (expected int8, uint8, int16, uint16, int4 or uint4)", dtype_name(qtype));

  // x: float32 (float16/bfloat16 arrive widened), or int32 per opset 10.
  Tensor x = x_in;
  if (x.dtype() == DType::Int32 || x.dtype() == DType::Float64) {
    x = x_in.cast_to(DType::Float32);
  } else if (x.dtype() != DType::Float32) {
    ctx.fail("input must be float, got {}", dtype_name(x.dtype()));
  }
  if (scale_t.dtype() != DType::Float32) ctx.fail("y_scale must be float, got {}", dtype_name(scale_t.dtype()));

  Layout L = param_layout(ctx, x, scale_t, zp_t);
  std::vector<float> scale = read_scales(ctx, scale_t, "y_scale");
  std::vector<int32_t> zp = zero_points(ctx, zp_t, qtype, scale_t.numel());
  const QRange range = qrange_of(qtype);
  const float* px = x.data<float>();
  Tensor& y = ctx.alloc_output(0, qtype, x.shape());
  const int64_t n = x.numel();

  auto quantize_into = [&](auto* py) {
    using Q = std::remove_pointer_t<decltype(py)>;
    for_each_run(
        ctx.pool(), L, scale.data(), zp.data(),
        [&](int64_t off, int64_t len, float s, int32_t z) { quantize_run<Q>(px + off, len, s, z, range, py + off); },
        [&](int64_t off, int64_t len, const float* s, const int32_t* z) {
          quantize_run_vec<Q>(px + off, len, s, z, range, py + off);
        });
  };
  switch (qtype) {
    case DType::Int8: quantize_into(y.data<int8_t>()); break;
    case DType::UInt8: quantize_into(y.data<uint8_t>()); break;
    case DType::Int16: quantize_into(y.data<int16_t>()); break;
    case DType::UInt16: quantize_into(y.data<uint16_t>()); break;
    case DType::Int4:
    case DType::UInt4: {
      std::vector<int8_t> tmp(static_cast<size_t>(n));
      if (qtype == DType::Int4) {
        quantize_into(tmp.data());
      } else {
        // uint4 values fit in int8 as well; quantize as uint8 then narrow.
        std::vector<uint8_t> u(static_cast<size_t>(n));
        quantize_into(u.data());
        for (int64_t i = 0; i < n; ++i) tmp[static_cast<size_t>(i)] = static_cast<int8_t>(u[static_cast<size_t>(i)]);
      }
      pack_int4(tmp.data(), n, static_cast<uint8_t*>(y.raw_data()));
      break;
    }
    default: ctx.fail("cannot quantize to {}", dtype_name(qtype));
  }
}

// ---------------------------------------------------------------------------------------------
// DequantizeLinear(x, x_scale, x_zero_point?) -> y (float32; the executor rounds to the scale's
// float16/bfloat16 type from opset 19)

void dequantize_linear(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& scale_t = ctx.input(1);
  const Tensor* zp_t = ctx.input_or_null(2);
  const DType qtype = x.dtype();
  if (is_float8(qtype)) ctx.fail_unsupported("dequantizing {} is not supported", dtype_name(qtype));
  if (!is_quant_int_type(qtype)) ctx.fail("cannot dequantize {}", dtype_name(qtype));
  if (scale_t.dtype() != DType::Float32) ctx.fail("x_scale must be float, got {}", dtype_name(scale_t.dtype()));

  Layout L = param_layout(ctx, x, scale_t, zp_t);
  std::vector<float> scale = read_scales(ctx, scale_t, "x_scale");
  std::vector<int32_t> zp = zero_points(ctx, zp_t, qtype, scale_t.numel());
  if (qtype == DType::Int32)
    for (int32_t z : zp)
      if (z != 0) ctx.fail("the zero point of an int32 input must be 0, got {}", z);
  Tensor& y = ctx.alloc_output(0, DType::Float32, x.shape());
  float* py = y.data<float>();

  auto dequantize_from = [&](const auto* px) {
    using Q = std::remove_const_t<std::remove_pointer_t<decltype(px)>>;
    for_each_run(
        ctx.pool(), L, scale.data(), zp.data(),
        [&](int64_t off, int64_t len, float s, int32_t z) { dequantize_run<Q>(px + off, len, s, z, py + off); },
        [&](int64_t off, int64_t len, const float* s, const int32_t* z) {
          dequantize_run_vec<Q>(px + off, len, s, z, py + off);
        });
  };
  if (qtype == DType::Int4 || qtype == DType::UInt4) {
    std::vector<int8_t> tmp(static_cast<size_t>(x.numel()));
    unpack_int4(static_cast<const uint8_t*>(x.raw_data()), x.numel(), qtype == DType::Int4, tmp.data());
    dequantize_from(static_cast<const int8_t*>(tmp.data()));
    return;
  }
  visit_quant_storage(qtype, [&](auto tag) {
    using Q = typename decltype(tag)::type;
    dequantize_from(x.data<Q>());
  });
}

// ---------------------------------------------------------------------------------------------
// DynamicQuantizeLinear(x) -> y (uint8), y_scale, y_zero_point, as ONNX Runtime computes them.

void dynamic_quantize_linear(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.dtype() != DType::Float32) ctx.fail("input must be float32, got {}", dtype_name(x.dtype()));
  const float* px = x.data<float>();
  const int64_t n = x.numel();

  // Range including zero.
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(64, n / 16384));
  std::vector<float> mins(static_cast<size_t>(chunks), 0.0f), maxs(static_cast<size_t>(chunks), 0.0f);
  ctx.pool().parallel_for(chunks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
      float mn = 0.0f, mx = 0.0f;
      for (int64_t i = b; i < e; ++i) {
        mn = px[i] < mn ? px[i] : mn;
        mx = px[i] > mx ? px[i] : mx;
      }
      mins[static_cast<size_t>(c)] = mn;
      maxs[static_cast<size_t>(c)] = mx;
    }
  });
  const float mn = *std::min_element(mins.begin(), mins.end());
  const float mx = *std::max_element(maxs.begin(), maxs.end());
  if (!std::isfinite(mn) || !std::isfinite(mx)) ctx.fail("input holds an infinite value; no scale can represent it");

  constexpr float qmin = 0.0f, qmax = 255.0f;
  const float scale = mx == mn ? 1.0f : (mx - mn) / (qmax - qmin);
  const float initial_zp = qmin - mn / scale;
  float zpf = std::max(qmin, std::min(qmax, initial_zp));
  zpf = (zpf + kRoundMagic) - kRoundMagic;  // ties to even (zpf is in [0, 255])
  const int32_t zp = static_cast<int32_t>(zpf);

  Tensor& y = ctx.alloc_output(0, DType::UInt8, x.shape());
  uint8_t* py = y.data<uint8_t>();
  const QRange range{0, 255};
  ctx.pool().parallel_for(n, 16384,
                          [&](int64_t lo, int64_t hi) { quantize_run<uint8_t>(px + lo, hi - lo, scale, zp, range, py + lo); });
  if (ctx.output_wanted(1)) ctx.alloc_output(1, DType::Float32, {}).data<float>()[0] = scale;
  if (ctx.output_wanted(2)) ctx.alloc_output(2, DType::UInt8, {}).data<uint8_t>()[0] = static_cast<uint8_t>(zp);
}

}  // namespace

void register_quant(OpRegistry& r) {
  r.add_fn("", "QuantizeLinear", 10, kMaxOpset, BackendKind::CPU, quantize_linear);
  r.add_fn("", "DequantizeLinear", 10, kMaxOpset, BackendKind::CPU, dequantize_linear);
  r.add_fn("", "DynamicQuantizeLinear", 11, kMaxOpset, BackendKind::CPU, dynamic_quantize_linear);
  quant::register_quant_gemm(r);
}

}  // namespace mpq::rt::cpu
