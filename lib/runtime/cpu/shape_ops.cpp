// Shape and data-movement ops: Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout (inference),
// Shape, Size, Transpose, Concat, Split, Expand, Tile, DepthToSpace, SpaceToDepth.
// Slice and Pad live in shape_slice_pad.cpp. Every op here moves bytes only, so they serve every
// element type (float16 included, registered native_low_precision) and strings where it is cheap.
#include <algorithm>
#include <random>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

#include "runtime/cpu/register_all.h"
#include "runtime/cpu/shape_internal.h"
#include "runtime/shape_rules.h"

namespace mpq::rt::cpu {

// ---------------------------------------------------------------- shared helpers (shape_internal.h)

StridedRuns make_runs(const Shape& shape, const std::vector<int64_t>& strides) {
  StridedRuns r;
  std::vector<int64_t> dims, st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!dims.empty() && st.back() == strides[d] * shape[d]) {
      dims.back() *= shape[d];
      st.back() = strides[d];
      continue;
    }
    dims.push_back(shape[d]);
    st.push_back(strides[d]);
  }
  if (dims.empty()) {
    r.inner = 1;
    r.inner_stride = 1;
    r.outer = 1;
    return r;
  }
  r.inner = dims.back();
  r.inner_stride = st.back();
  dims.pop_back();
  st.pop_back();
  r.dims = std::move(dims);
  r.strides = std::move(st);
  r.outer = 1;
  for (int64_t d : r.dims) r.outer *= d;
  return r;
}

namespace {

// memcpy of one contiguous run. Runs of 16, 32, 64 or 128 bytes (a head's 4-32 floats in
// attention's transposes) are copied by fixed-size moves the compiler inlines instead of a call per
// run; other lengths call memcpy. With
// for_runs' plain loop over the last dimension: Transpose of [8, 17, 3, 4, 16] to [3, 8, 4, 17,
// 16] (1,632 runs of 64 bytes), one thread, 4.3 -> 3.4 us.
inline void copy_run(void* d, const void* s, size_t bytes) {
  switch (bytes) {
    case 16: std::memcpy(d, s, 16); return;
    case 32: std::memcpy(d, s, 32); return;
    case 64: std::memcpy(d, s, 64); return;
    case 128: std::memcpy(d, s, 128); return;
    default: std::memcpy(d, s, bytes); return;
  }
}

}  // namespace

void strided_copy(ThreadPool& pool, const Tensor& src, int64_t base, const std::vector<int64_t>& strides,
                  Tensor& dst) {
  if (dst.numel() == 0) return;
  strided_copy_runs(pool, src, base, make_runs(dst.shape(), strides), dst);
}

void strided_copy_runs(ThreadPool& pool, const Tensor& src, int64_t base, const StridedRuns& r, Tensor& dst) {
  if (dst.numel() == 0) return;
  const int64_t inner = r.inner, is = r.inner_stride;
  if (src.dtype() == DType::String) {
    const auto& s = src.strings();
    auto& d = dst.strings();
    for_runs(r, 0, r.outer, [&](int64_t run, int64_t off) {
      for (int64_t i = 0; i < inner; ++i)
        d[static_cast<size_t>(run * inner + i)] = s[static_cast<size_t>(base + off + i * is)];
    });
    return;
  }
  visit_by_width(src.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* ps = static_cast<const T*>(src.raw_data()) + base;
    T* pd = static_cast<T*>(dst.raw_data());
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(inner, 1));
    pool.parallel_for(r.outer, grain, [&](int64_t lo, int64_t hi) {
      for_runs(r, lo, hi, [&](int64_t run, int64_t off) {
        T* d = pd + run * inner;
        const T* s = ps + off;
        if (is == 1) {
          copy_run(d, s, static_cast<size_t>(inner) * sizeof(T));
        } else if (is == 0) {
          std::fill(d, d + inner, s[0]);
        } else {
          for (int64_t i = 0; i < inner; ++i) d[i] = s[i * is];
        }
      });
    });
  });
}

void copy_elements(const Tensor& src, int64_t src_off, Tensor& dst, int64_t dst_off, int64_t n) {
  if (n <= 0) return;
  if (src.dtype() == DType::String) {
    std::copy_n(src.strings().begin() + src_off, n, dst.strings().begin() + dst_off);
    return;
  }
  const size_t w = static_cast<size_t>(dtype_bits(src.dtype()) / 8);
  std::memcpy(static_cast<uint8_t*>(dst.raw_data()) + static_cast<size_t>(dst_off) * w,
              static_cast<const uint8_t*>(src.raw_data()) + static_cast<size_t>(src_off) * w, static_cast<size_t>(n) * w);
}

size_t elem_bytes(const KernelContext& ctx, DType t) {
  int bits = dtype_bits(t);
  if (bits < 8 || bits % 8 != 0) ctx.fail_unsupported("element type {} is not supported by this operation", dtype_name(t));
  return static_cast<size_t>(bits / 8);
}

std::vector<int64_t> optional_input_ints(const KernelContext& ctx, size_t i) {
  if (!ctx.has_input(i) || ctx.input(i).numel() == 0) return {};
  return input_ints(ctx, i);
}

namespace {

// dst[a * dst_row + b] = src[a + b * src_col] for a < A, b < B (one 2-D plane of a transpose).
template <int64_t kTile, typename T>
void transpose_plane(const T* src, T* dst, int64_t a_lo, int64_t a_hi, int64_t B, int64_t src_col, int64_t dst_row) {
  for (int64_t a0 = a_lo; a0 < a_hi; a0 += kTile) {
    const int64_t a1 = std::min(a0 + kTile, a_hi);
    for (int64_t b0 = 0; b0 < B; b0 += kTile) {
      const int64_t b1 = std::min(b0 + kTile, B);
      int64_t a = a0;
#if defined(__SSE2__)
      if constexpr (sizeof(T) == 4) {
        // 4x4 register transposes (bit-exact shuffles) over the tile's interior.
        for (; a + 4 <= a1; a += 4) {
          int64_t b = b0;
          for (; b + 4 <= b1; b += 4) {
            const float* s = reinterpret_cast<const float*>(src + a + b * src_col);
            __m128 r0 = _mm_loadu_ps(s);
            __m128 r1 = _mm_loadu_ps(s + src_col);
            __m128 r2 = _mm_loadu_ps(s + 2 * src_col);
            __m128 r3 = _mm_loadu_ps(s + 3 * src_col);
            _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
            float* d = reinterpret_cast<float*>(dst + a * dst_row + b);
            _mm_storeu_ps(d, r0);
            _mm_storeu_ps(d + dst_row, r1);
            _mm_storeu_ps(d + 2 * dst_row, r2);
            _mm_storeu_ps(d + 3 * dst_row, r3);
          }
          for (; b < b1; ++b)
            for (int64_t k = 0; k < 4; ++k) dst[(a + k) * dst_row + b] = src[a + k + b * src_col];
        }
      }
#endif
      for (; a < a1; ++a) {
        T* d = dst + a * dst_row;
        const T* s = src + a;
        for (int64_t b = b0; b < b1; ++b) d[b] = s[b * src_col];
      }
    }
  }
}

}  // namespace

TransposePlan plan_transpose(const Shape& in_shape, const std::vector<int64_t>& perm) {
  TransposePlan p;
  const size_t rank = perm.size();
  p.out_shape.resize(rank);
  const std::vector<int64_t> in_strides = strides_of(in_shape);
  p.strides.resize(rank);
  for (size_t i = 0; i < rank; ++i) {
    p.out_shape[i] = in_shape[static_cast<size_t>(perm[i])];
    p.strides[i] = in_strides[static_cast<size_t>(perm[i])];
  }
  if (shape_numel(p.out_shape) == 0) return p;
  p.runs = make_runs(p.out_shape, p.strides);
  const StridedRuns& r = p.runs;
  if (r.inner_stride == 1 || r.dims.empty()) return p;  // runs contiguous in the source: copies
  // The dimension that is contiguous in the source becomes the plane's rows; the output's inner
  // dimension its columns. Everything else is an outer loop.
  size_t k = r.dims.size();
  for (size_t d = 0; d < r.dims.size(); ++d)
    if (r.strides[d] == 1) k = d;
  if (k == r.dims.size()) return p;  // no contiguous source dimension: element by element
  std::vector<int64_t> dst_strides(r.dims.size());
  int64_t acc = r.inner;
  for (size_t d = r.dims.size(); d-- > 0;) {
    dst_strides[d] = acc;
    acc *= r.dims[d];
  }
  for (size_t d = 0; d < r.dims.size(); ++d) {
    if (d == k) continue;
    p.odims.push_back(r.dims[d]);
    p.osrc.push_back(r.strides[d]);
    p.odst.push_back(dst_strides[d]);
  }
  p.tiled = true;
  p.A = r.dims[k];
  p.B = r.inner;
  p.src_col = r.inner_stride;
  p.dst_row = dst_strides[k];
  return p;
}

void run_transpose(ThreadPool& pool, const TransposePlan& p, const Tensor& src, Tensor& out) {
  if (out.numel() == 0) return;
  if (src.dtype() == DType::String || !p.tiled) {
    strided_copy_runs(pool, src, 0, p.runs, out);
    return;
  }
  int64_t n_outer = 1;
  for (int64_t d : p.odims) n_outer *= d;
  const int64_t A = p.A, B = p.B, src_col = p.src_col, dst_row = p.dst_row;
  // Work items: (outer index, block of 64 rows). Wide planes use 64x64 tiles, narrow ones 32x32
  // (measured: 64 wins for B >= 128, 32 for B = 64).
  constexpr int64_t kRows = 64;
  const int64_t row_blocks = (A + kRows - 1) / kRows;
  const int64_t items = n_outer * row_blocks;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(kRows * B, 1));
  const bool wide = B >= 128;
  visit_by_width(src.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* ps = static_cast<const T*>(src.raw_data());
    T* pd = static_cast<T*>(out.raw_data());
    pool.parallel_for(items, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t it = lo; it < hi; ++it) {
        int64_t o = it / row_blocks, blk = it % row_blocks;
        int64_t so = 0, dof = 0;
        for (size_t d = p.odims.size(); d-- > 0;) {
          int64_t idx = o % p.odims[d];
          o /= p.odims[d];
          so += idx * p.osrc[d];
          dof += idx * p.odst[d];
        }
        const int64_t a0 = blk * kRows, a1 = std::min(A, a0 + kRows);
        if (wide) {
          transpose_plane<64, T>(ps + so, pd + dof, a0, a1, B, src_col, dst_row);
        } else {
          transpose_plane<32, T>(ps + so, pd + dof, a0, a1, B, src_col, dst_row);
        }
      }
    });
  });
}

Tensor transpose_tensor(ThreadPool& pool, const Tensor& src, const std::vector<int64_t>& perm) {
  const TransposePlan p = plan_transpose(src.shape(), perm);
  Tensor out(src.dtype(), p.out_shape);
  run_transpose(pool, p, src, out);
  return out;
}

namespace {

// ---------------------------------------------------------------- view ops

// The output shapes come from runtime/shape_rules.h, shared with the CUDA planner.
void reshape_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const std::vector<int64_t> spec = ctx.opset() < 5 ? ctx.node().attr_ints("shape") : input_ints(ctx, 1);
  const bool allowzero = ctx.opset() >= 14 && ctx.node().attr_int("allowzero", 0) != 0;
  Shape out;
  if (const std::string why = reshape_shape(x.shape(), spec, allowzero, &out); !why.empty()) ctx.fail("{}", why);
  ctx.set_output(0, x.reshaped(std::move(out)));
}

void flatten_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Shape out;
  if (const std::string why = flatten_shape(x.shape(), ctx.node().attr_int("axis", 1), &out); !why.empty()) ctx.fail("{}", why);
  ctx.set_output(0, x.reshaped(std::move(out)));
}

std::vector<int64_t> axes_arg(const KernelContext& ctx) {
  if (ctx.opset() >= 13) return optional_input_ints(ctx, 1);
  return ctx.node().attr_ints("axes");
}

void squeeze_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Shape out;
  if (const std::string why = squeeze_shape(x.shape(), axes_arg(ctx), &out); !why.empty()) ctx.fail("{}", why);
  ctx.set_output(0, x.reshaped(std::move(out)));
}

void unsqueeze_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Shape out;
  if (const std::string why = unsqueeze_shape(x.shape(), axes_arg(ctx), &out); !why.empty()) ctx.fail("{}", why);
  ctx.set_output(0, x.reshaped(std::move(out)));
}

void identity_kernel(KernelContext& ctx) { ctx.set_output(0, ctx.input(0)); }

Tensor filled_mask(DType t, const Shape& shape) {
  Tensor m = Tensor::zeros(t, shape);
  if (t == DType::Bool) {
    std::fill_n(m.data<bool>(), m.numel(), true);
  } else {
    Tensor one = Tensor::scalar<float>(1.0f).cast_to(t);
    for (int64_t i = 0; i < m.numel(); ++i) copy_elements(one, 0, m, i, 1);
  }
  return m;
}

void dropout_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  bool training = false;
  float ratio = ctx.node().attr_float("ratio", 0.5f);
  if (ctx.opset() >= 12) {
    if (ctx.has_input(1)) ratio = static_cast<float>(input_scalar(ctx, 1));
    if (ctx.has_input(2)) {
      const Tensor& t = ctx.input(2);
      if (t.dtype() != DType::Bool || t.numel() != 1) ctx.fail("training_mode must be a bool scalar");
      training = t.data<bool>()[0];
    }
  }
  // Before opset 12 there is no way to ask for training at run time: old models (is_test attribute
  // or not) are run for inference, as ONNX Runtime does.
  const bool want_mask = ctx.output_wanted(1);
  const DType mask_type = ctx.opset() >= 10 ? DType::Bool : x.dtype();
  if (!training || ratio == 0.0f) {
    ctx.set_output(0, x);
    if (want_mask) ctx.set_output(1, filled_mask(mask_type, x.shape()));
    return;
  }
  if (ratio < 0.0f || ratio >= 1.0f) ctx.fail("ratio {} must be in [0, 1)", ratio);
  if (!dtype_is_float(x.dtype())) ctx.fail("training-mode Dropout needs a float input");
  // Training mode: keep where u >= ratio, u uniform in [0, 1) drawn as numpy's legacy
  // RandomState(seed).uniform does (MT19937, 53-bit doubles), so a given seed reproduces the
  // reference outputs.
  std::mt19937 rng(static_cast<uint32_t>(ctx.node().attr_int("seed", 0)));
  const int64_t n = x.numel();
  Tensor mask = Tensor::zeros(DType::Bool, x.shape());
  bool* pm = mask.data<bool>();
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = static_cast<uint32_t>(rng()) >> 5, b = static_cast<uint32_t>(rng()) >> 6;
    const double u = (static_cast<double>(a) * 67108864.0 + static_cast<double>(b)) / 9007199254740992.0;
    pm[i] = u >= static_cast<double>(ratio);
  }
  const double scale = 1.0 / (1.0 - ratio);
  Tensor& y = ctx.alloc_output(0, x.dtype(), x.shape());
  if (x.dtype() == DType::Float32) {
    const float* px = x.data<float>();
    float* py = y.data<float>();
    for (int64_t i = 0; i < n; ++i) py[i] = pm[i] ? static_cast<float>(px[i] * scale) : 0.0f;
  } else if (x.dtype() == DType::Float64) {
    const double* px = x.data<double>();
    double* py = y.data<double>();
    for (int64_t i = 0; i < n; ++i) py[i] = pm[i] ? px[i] * scale : 0.0;
  } else {
    Tensor xf = x.cast_to(DType::Float32);
    Tensor yf(DType::Float32, x.shape());
    for (int64_t i = 0; i < n; ++i) yf.data<float>()[i] = pm[i] ? static_cast<float>(xf.data<float>()[i] * scale) : 0.0f;
    y = yf.cast_to(x.dtype());
  }
  if (want_mask) ctx.set_output(1, mask_type == DType::Bool ? mask : mask.cast_to(mask_type));
}

void shape_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t r = x.rank();
  int64_t start = 0, end = r;
  if (ctx.opset() >= 15) {
    start = ctx.node().attr_int("start", 0);
    end = ctx.node().attr_int("end", r);
    if (start < 0) start += r;
    if (end < 0) end += r;
    start = std::clamp<int64_t>(start, 0, r);
    end = std::clamp<int64_t>(end, 0, r);
  }
  const int64_t n = std::max<int64_t>(end - start, 0);
  Tensor& out = ctx.alloc_output(0, DType::Int64, {n});
  for (int64_t i = 0; i < n; ++i) out.data<int64_t>()[i] = x.shape()[static_cast<size_t>(start + i)];
}

void size_kernel(KernelContext& ctx) {
  Tensor& out = ctx.alloc_output(0, DType::Int64, {});
  out.data<int64_t>()[0] = ctx.input(0).numel();
}

// ---------------------------------------------------------------- copying ops

// Transpose with its plan kept between runs (perm is an attribute; the input's shape rarely
// changes): building it (the permuted shape and strides, the merged runs, a tiled plane's loops)
// allocated a dozen small vectors per call, about a quarter of a small transpose's time (a head's
// [1, 17, 3, 4, 16], 0.6 us). One kernel object per node and executor, which runs one step at a time.
class TransposeKernel : public OpKernel {
 public:
  explicit TransposeKernel(const ir::Node& node) : perm_attr_(node.attr_ints("perm")) {}

  void compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (!planned_ || x.shape() != shape_) plan(ctx, x.shape());
    if (identity_) {
      ctx.set_output(0, x);
      return;
    }
    Tensor& out = ctx.alloc_output(0, x.dtype(), plan_.out_shape);
    run_transpose(ctx.pool(), plan_, x, out);
  }

 private:
  void plan(KernelContext& ctx, const Shape& shape) {
    planned_ = false;
    const int r = static_cast<int>(shape.size());
    std::vector<int64_t> perm = perm_attr_;
    if (perm.empty()) {
      for (int i = r - 1; i >= 0; --i) perm.push_back(i);
    }
    if (static_cast<int>(perm.size()) != r) ctx.fail("perm {} does not match input rank {}", shape_str(perm), r);
    std::vector<bool> seen(static_cast<size_t>(r), false);
    identity_ = true;
    for (size_t i = 0; i < perm.size(); ++i) {
      int64_t p = perm[i] < 0 ? perm[i] + r : perm[i];
      if (p < 0 || p >= r || seen[static_cast<size_t>(p)]) ctx.fail("perm {} is not a permutation of 0..{}", shape_str(perm), r - 1);
      seen[static_cast<size_t>(p)] = true;
      perm[i] = p;
      if (p != static_cast<int64_t>(i)) identity_ = false;
    }
    if (!identity_) plan_ = plan_transpose(shape, perm);
    shape_ = shape;
    planned_ = true;
  }

  std::vector<int64_t> perm_attr_;
  bool planned_ = false;
  bool identity_ = false;
  Shape shape_;
  TransposePlan plan_;
};

void concat_kernel(KernelContext& ctx) {
  if (ctx.num_inputs() == 0) ctx.fail("needs at least one input");
  std::vector<const Tensor*> ins;
  for (size_t i = 0; i < ctx.num_inputs(); ++i)
    if (ctx.has_input(i)) ins.push_back(&ctx.input(i));
  if (ins.empty()) ctx.fail("needs at least one input");
  const Tensor& first = *ins[0];
  const int r = first.rank();
  if (r == 0) ctx.fail("cannot concatenate scalars");
  if (!ctx.node().has_attr("axis") && ctx.opset() >= 4) ctx.fail("attribute 'axis' is required");
  const int axis = normalize_axis(ctx, ctx.node().attr_int("axis", 1), r);
  Shape out_shape = first.shape();
  out_shape[static_cast<size_t>(axis)] = 0;
  for (const Tensor* t : ins) {
    if (t->dtype() != first.dtype())
      ctx.fail("inputs have different element types ({} and {})", dtype_name(first.dtype()), dtype_name(t->dtype()));
    if (t->rank() != r) ctx.fail("inputs have different ranks ({} and {})", shape_str(first.shape()), shape_str(t->shape()));
    for (int d = 0; d < r; ++d)
      if (d != axis && t->shape()[static_cast<size_t>(d)] != first.shape()[static_cast<size_t>(d)])
        ctx.fail("input shapes {} and {} differ outside axis {}", shape_str(first.shape()), shape_str(t->shape()), axis);
    out_shape[static_cast<size_t>(axis)] += t->shape()[static_cast<size_t>(axis)];
  }
  if (ins.size() == 1) {
    ctx.set_output(0, first);
    return;
  }
  Tensor& out = ctx.alloc_output(0, first.dtype(), out_shape);
  if (out.numel() == 0) return;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= out_shape[static_cast<size_t>(d)];
  for (int d = axis + 1; d < r; ++d) inner *= out_shape[static_cast<size_t>(d)];
  const int64_t out_row = out_shape[static_cast<size_t>(axis)] * inner;
  std::vector<int64_t> chunk(ins.size()), offset(ins.size());
  int64_t acc = 0;
  for (size_t i = 0; i < ins.size(); ++i) {
    chunk[i] = ins[i]->shape()[static_cast<size_t>(axis)] * inner;
    offset[i] = acc;
    acc += chunk[i];
  }
  if (first.dtype() == DType::String) {
    for (int64_t o = 0; o < outer; ++o)
      for (size_t i = 0; i < ins.size(); ++i) copy_elements(*ins[i], o * chunk[i], out, o * out_row + offset[i], chunk[i]);
    return;
  }
  const size_t w = elem_bytes(ctx, first.dtype());
  uint8_t* po = static_cast<uint8_t*>(out.raw_data());
  const int64_t n_in = static_cast<int64_t>(ins.size());
  const int64_t avg_bytes = std::max<int64_t>(1, out_row * static_cast<int64_t>(w) / n_in);
  ctx.pool().parallel_for(outer * n_in, std::max<int64_t>(1, 65536 / avg_bytes), [&](int64_t lo, int64_t hi) {
    for (int64_t it = lo; it < hi; ++it) {
      const int64_t o = it / n_in;
      const size_t i = static_cast<size_t>(it % n_in);
      if (chunk[i] == 0) continue;
      std::memcpy(po + static_cast<size_t>(o * out_row + offset[i]) * w,
                  static_cast<const uint8_t*>(ins[i]->raw_data()) + static_cast<size_t>(o * chunk[i]) * w,
                  static_cast<size_t>(chunk[i]) * w);
    }
  });
}

void split_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int r = x.rank();
  if (r == 0) ctx.fail("cannot split a scalar");
  const int axis = normalize_axis(ctx, ctx.node().attr_int("axis", 0), r);
  const int64_t dim = x.shape()[static_cast<size_t>(axis)];
  const size_t n_out = ctx.num_outputs();
  std::vector<int64_t> sizes;
  if (ctx.opset() >= 13) {
    sizes = optional_input_ints(ctx, 1);
  } else {
    sizes = ctx.node().attr_ints("split");
    if (sizes.empty() && ctx.has_input(1)) sizes = input_ints(ctx, 1);  // Split-1 took `split` as input
  }
  if (sizes.empty()) {
    int64_t n = static_cast<int64_t>(n_out);
    if (ctx.opset() >= 18 && ctx.node().has_attr("num_outputs")) {
      n = ctx.node().attr_int("num_outputs", 0);
      if (n <= 0) ctx.fail("num_outputs must be positive, got {}", n);
      if (n != static_cast<int64_t>(n_out)) ctx.fail("num_outputs is {} but the node has {} outputs", n, n_out);
      const int64_t each = (dim + n - 1) / n;
      for (int64_t i = 0; i < n; ++i) sizes.push_back(std::clamp<int64_t>(dim - i * each, 0, each));
    } else {
      if (n == 0 || dim % n != 0) ctx.fail("dimension {} of size {} cannot be split evenly into {} outputs", axis, dim, n);
      sizes.assign(static_cast<size_t>(n), dim / n);
    }
  }
  if (sizes.size() != n_out) ctx.fail("split has {} sizes but the node has {} outputs", sizes.size(), n_out);
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) ctx.fail("split sizes {} must not be negative", shape_str(sizes));
    total += s;
  }
  if (total != dim) ctx.fail("split sizes {} do not add up to dimension {} of size {}", shape_str(sizes), axis, dim);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= x.shape()[static_cast<size_t>(d)];
  for (int d = axis + 1; d < r; ++d) inner *= x.shape()[static_cast<size_t>(d)];
  const int64_t in_row = dim * inner;
  int64_t off = 0;
  for (size_t k = 0; k < n_out; ++k) {
    Shape s = x.shape();
    s[static_cast<size_t>(axis)] = sizes[k];
    const int64_t chunk = sizes[k] * inner;
    const int64_t start = off;
    off += chunk;
    if (!ctx.output_wanted(k)) continue;
    if (outer == 1 && x.dtype() != DType::String && chunk == x.numel()) {
      ctx.set_output(k, x.reshaped(s));
      continue;
    }
    Tensor& out = ctx.alloc_output(k, x.dtype(), s);
    if (out.numel() == 0) continue;
    if (x.dtype() == DType::String) {
      for (int64_t o = 0; o < outer; ++o) copy_elements(x, o * in_row + start, out, o * chunk, chunk);
      continue;
    }
    const size_t w = elem_bytes(ctx, x.dtype());
    const uint8_t* px = static_cast<const uint8_t*>(x.raw_data());
    uint8_t* po = static_cast<uint8_t*>(out.raw_data());
    ctx.pool().parallel_for(outer, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, chunk * static_cast<int64_t>(w))),
                            [&](int64_t lo, int64_t hi) {
                              for (int64_t o = lo; o < hi; ++o)
                                std::memcpy(po + static_cast<size_t>(o * chunk) * w,
                                            px + static_cast<size_t>(o * in_row + start) * w, static_cast<size_t>(chunk) * w);
                            });
  }
}

void expand_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> shape = input_ints(ctx, 1);
  for (int64_t d : shape)
    if (d < 0) ctx.fail("shape {} has a negative dimension", shape_str(shape));
  Shape target(shape.begin(), shape.end());
  // Bidirectional broadcast: a 1 in the requested shape keeps the input's dimension.
  Shape out = broadcast_shapes(ctx, {&x.shape(), &target});
  const size_t r = out.size();
  const size_t off = r - x.shape().size();
  const std::vector<int64_t> xs = strides_of(x.shape());
  std::vector<int64_t> st(r, 0);
  for (size_t d = off; d < r; ++d) st[d] = x.shape()[d - off] == 1 ? 0 : xs[d - off];
  if (out == x.shape()) {
    ctx.set_output(0, x);
    return;
  }
  Tensor& y = ctx.alloc_output(0, x.dtype(), out);
  strided_copy(ctx.pool(), x, 0, st, y);
}

void tile_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int r = x.rank();
  std::vector<int64_t> reps;
  if (ctx.opset() < 6) {
    // Tile-1: `tiles` (scalar count) and `axis` inputs.
    int64_t tiles = static_cast<int64_t>(input_scalar(ctx, 1));
    int axis = normalize_axis(ctx, static_cast<int64_t>(input_scalar(ctx, 2)), r);
    reps.assign(static_cast<size_t>(r), 1);
    reps[static_cast<size_t>(axis)] = tiles;
  } else {
    reps = input_ints(ctx, 1);
  }
  if (static_cast<int>(reps.size()) != r) ctx.fail("repeats {} do not match input rank {}", shape_str(reps), r);
  Shape view, out;
  std::vector<int64_t> st;
  const std::vector<int64_t> xs = strides_of(x.shape());
  for (int d = 0; d < r; ++d) {
    const int64_t rep = reps[static_cast<size_t>(d)];
    if (rep < 0) ctx.fail("repeats {} must not be negative", shape_str(reps));
    view.push_back(rep);
    st.push_back(0);
    view.push_back(x.shape()[static_cast<size_t>(d)]);
    st.push_back(xs[static_cast<size_t>(d)]);
    out.push_back(rep * x.shape()[static_cast<size_t>(d)]);
  }
  Tensor y(x.dtype(), view);
  strided_copy(ctx.pool(), x, 0, st, y);
  ctx.set_output(0, y.reshaped(out));
}

void depth_to_space_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t b = ctx.node().attr_int("blocksize", 0);
  if (x.rank() != 4) ctx.fail("input must be 4-D, got {}", shape_str(x.shape()));
  if (b <= 0) ctx.fail("blocksize must be positive, got {}", b);
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  if (C % (b * b) != 0) ctx.fail("channels {} are not divisible by blocksize^2 = {}", C, b * b);
  const std::string mode = ctx.opset() >= 11 ? ctx.node().attr_string("mode", "DCR") : "DCR";
  Tensor t;
  if (mode == "DCR") {
    t = transpose_tensor(ctx.pool(), x.reshaped({N, b, b, C / (b * b), H, W}), {0, 3, 4, 1, 5, 2});
  } else if (mode == "CRD") {
    t = transpose_tensor(ctx.pool(), x.reshaped({N, C / (b * b), b, b, H, W}), {0, 1, 4, 2, 5, 3});
  } else {
    ctx.fail("mode must be DCR or CRD, got '{}'", mode);
  }
  ctx.set_output(0, t.reshaped({N, C / (b * b), H * b, W * b}));
}

void space_to_depth_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t b = ctx.node().attr_int("blocksize", 0);
  if (x.rank() != 4) ctx.fail("input must be 4-D, got {}", shape_str(x.shape()));
  if (b <= 0) ctx.fail("blocksize must be positive, got {}", b);
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  if (H % b != 0 || W % b != 0) ctx.fail("spatial size {}x{} is not divisible by blocksize {}", H, W, b);
  Tensor t = transpose_tensor(ctx.pool(), x.reshaped({N, C, H / b, b, W / b, b}), {0, 3, 5, 1, 2, 4});
  ctx.set_output(0, t.reshaped({N, C * b * b, H / b, W / b}));
}

}  // namespace

void register_shape_ops(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  const bool native = true;  // pure data movement: any element type, float16 included
  r.add_fn("", "Reshape", 1, kMaxOpset, cpu, reshape_kernel, native);
  r.add_fn("", "Flatten", 1, kMaxOpset, cpu, flatten_kernel, native);
  r.add_fn("", "Squeeze", 1, kMaxOpset, cpu, squeeze_kernel, native);
  r.add_fn("", "Unsqueeze", 1, kMaxOpset, cpu, unsqueeze_kernel, native);
  r.add_fn("", "Identity", 1, kMaxOpset, cpu, identity_kernel, native);
  r.add_fn("", "Dropout", 1, kMaxOpset, cpu, dropout_kernel, native);
  r.add_fn("", "Shape", 1, kMaxOpset, cpu, shape_kernel, native);
  r.add_fn("", "Size", 1, kMaxOpset, cpu, size_kernel, native);
  KernelDef transpose;
  transpose.op_type = "Transpose";
  transpose.backend = cpu;
  transpose.since = 1;
  transpose.until = kMaxOpset;
  transpose.native_low_precision = native;
  transpose.factory = [](const ir::Node& node, int) -> std::unique_ptr<OpKernel> {
    return std::make_unique<TransposeKernel>(node);
  };
  r.add(std::move(transpose));
  r.add_fn("", "Concat", 1, kMaxOpset, cpu, concat_kernel, native);
  r.add_fn("", "Split", 1, kMaxOpset, cpu, split_kernel, native);
  r.add_fn("", "Expand", 8, kMaxOpset, cpu, expand_kernel, native);
  r.add_fn("", "Tile", 1, kMaxOpset, cpu, tile_kernel, native);
  r.add_fn("", "DepthToSpace", 1, kMaxOpset, cpu, depth_to_space_kernel, native);
  r.add_fn("", "SpaceToDepth", 1, kMaxOpset, cpu, space_to_depth_kernel, native);
  register_shape_slice_pad(r);
}

}  // namespace mpq::rt::cpu
