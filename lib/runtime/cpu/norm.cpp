// Normalisation ops: BatchNormalization, LayerNormalization, InstanceNormalization,
// GroupNormalization, LpNormalization, MeanVarianceNormalization.
//
// Per-row statistics use two passes over the row (mean, then the sum of squared deviations),
// which stays accurate where E[x^2] - E[x]^2 would cancel. Rows are contiguous and the loops
// that apply the normalisation vectorise; rows are spread over the thread pool.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "runtime/cpu/common.h"
#include "runtime/cpu/math_reduce.h"
#include "runtime/cpu/math_util.h"
#include "runtime/cpu/norm.h"
#include "runtime/cpu/register_all.h"
#include "runtime/cpu/unary.h"

namespace mpq::rt::cpu {

namespace {

// A parameter tensor (scale, bias, mean, ...) as values of T.
template <typename T>
std::vector<T> param_values(const Tensor& t) {
  if (!dtype_is_float(t.dtype()) && !dtype_is_integer(t.dtype()))
    fail_input("parameter of type {} is not numeric", dtype_name(t.dtype()));
  std::vector<T> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == dtype_of<T>) {
    const T* p = t.data<T>();
    std::copy(p, p + t.numel(), v.begin());
  } else {
    for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = static_cast<T>(t.get_double(i));
  }
  return v;
}

// Whether a parameter of shape `a` holds the values of `b` in order: the same shape once leading
// ones are dropped from both.
bool same_but_leading_ones(const Shape& a, const Shape& b) {
  auto i = a.begin(), j = b.begin();
  while (i != a.end() && *i == 1) ++i;
  while (j != b.end() && *j == 1) ++j;
  return std::equal(i, a.end(), j, b.end());
}

// `t` broadcast (numpy rules, unidirectionally) to `target`, flattened.
template <typename T>
std::vector<T> expand_param(const KernelContext& ctx, const Tensor& t, const Shape& target, const char* what) {
  const int64_t n = shape_numel(target);
  if (same_but_leading_ones(t.shape(), target)) return param_values<T>(t);
  Shape shape = broadcast_shapes(ctx, {&t.shape(), &target});
  if (shape != target) ctx.fail("{} of shape {} does not broadcast to {}", what, shape_str(t.shape()), shape_str(target));
  std::vector<T> src = param_values<T>(t);
  std::vector<T> out(static_cast<size_t>(n));
  const size_t off = target.size() - t.shape().size();
  std::vector<int64_t> tstr = strides_of(t.shape());
  std::vector<int64_t> idx(target.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t o = 0;
    for (size_t d = off; d < target.size(); ++d)
      if (t.shape()[d - off] != 1) o += idx[d] * tstr[d - off];
    out[static_cast<size_t>(i)] = src[static_cast<size_t>(o)];
    for (size_t d = target.size(); d-- > 0;) {
      if (++idx[d] < target[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// The D = numel(target) values of `t` broadcast to `target`: `t`'s own data where it already holds
// them in order (the same element type, and the same shape once leading ones are dropped: a
// LayerNorm's scale and bias, read on every run without a copy), else expand_param's copy in
// `storage`.
template <typename T>
const T* param_row(const KernelContext& ctx, const Tensor& t, const Shape& target, const char* what,
                   std::vector<T>& storage) {
  if (t.dtype() == dtype_of<T> && same_but_leading_ones(t.shape(), target)) return t.data<T>();
  storage = expand_param<T>(ctx, t, target, what);
  return storage.data();
}

template <typename F>
void dispatch_float(const KernelContext& ctx, DType t, F&& f) {
  if (t == DType::Float32) f(TypeTag<float>{});
  else if (t == DType::Float64) f(TypeTag<double>{});
  else ctx.fail("needs a floating-point input, got {}", dtype_name(t));
}

// y = x * a + b over `s` contiguous elements.
template <typename T>
inline void affine(const T* x, T* y, int64_t s, T a, T b) {
  for (int64_t i = 0; i < s; ++i) y[i] = x[i] * a + b;
}

// Mean and 1/sqrt(var + eps) of a contiguous row.
template <typename T>
__attribute__((always_inline)) inline void row_stats(const T* x, int64_t n, double eps, T& mean, T& inv_std) {
  mean = n > 0 ? math::row_sum_t(x, n) / static_cast<T>(n) : T(0);
  const T var = n > 0 ? math::row_sq_dev_t(x, n, mean) / static_cast<T>(n) : T(0);
  inv_std = T(1) / std::sqrt(var + static_cast<T>(eps));
}

// ---- BatchNormalization

void batchnorm_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  const Tensor& bias = ctx.input(2);
  const Tensor& mean_in = ctx.input(3);
  const Tensor& var_in = ctx.input(4);
  if (x.rank() < 2) ctx.fail("input must have rank >= 2, got shape {}", shape_str(x.shape()));
  const double eps = ctx.node().attr_float("epsilon", 1e-5f);
  const double momentum = ctx.node().attr_float("momentum", 0.9f);
  bool training = false;
  if (ctx.opset() >= 14) {
    training = ctx.node().attr_int("training_mode", 0) != 0;
  } else {
    // Before opset 14 the statistics outputs exist only in training (is_test=0 before opset 7).
    for (size_t i = 1; i < 5; ++i)
      if (ctx.output_wanted(i)) training = true;
    if (ctx.opset() < 7 && ctx.node().attr_int("is_test", 0) != 0) training = false;
  }
  const int64_t N = x.dim(0), C = x.dim(1);
  const int64_t per_n = N > 0 ? x.numel() / N : 0;
  const int64_t F = scale.numel();
  // Per channel, or (spatial=0 before opset 9) one value per feature of [C, D1, ...].
  if (F != C && !(F == per_n && ctx.opset() < 9))
    ctx.fail("scale has {} values for {} channels", F, C);
  for (const Tensor* t : {&bias, &mean_in, &var_in})
    if (t->numel() != F) ctx.fail("scale, B, mean and var must have the same size ({} and {})", F, t->numel());
  const int64_t S = F > 0 ? per_n / F : 0;  // contiguous elements per (n, feature)
  Tensor& y = ctx.alloc_output(0, x.dtype(), x.shape());
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    std::vector<T> sc = param_values<T>(scale), bi = param_values<T>(bias);
    std::vector<T> mean = param_values<T>(mean_in), var = param_values<T>(var_in);
    if (training) {
      // Batch statistics per feature over N and the spatial positions (population variance).
      std::vector<T> bmean(static_cast<size_t>(F)), bvar(static_cast<size_t>(F));
      ctx.pool().parallel_for(F, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t f = lo; f < hi; ++f) {
          T s = 0;
          for (int64_t n = 0; n < N; ++n) s += math::row_sum_t(px + n * per_n + f * S, S);
          const T m = N * S > 0 ? s / static_cast<T>(N * S) : T(0);
          T q = 0;
          for (int64_t n = 0; n < N; ++n) q += math::row_sq_dev_t(px + n * per_n + f * S, S, m);
          bmean[static_cast<size_t>(f)] = m;
          bvar[static_cast<size_t>(f)] = N * S > 0 ? q / static_cast<T>(N * S) : T(0);
        }
      });
      const T mom = static_cast<T>(momentum);
      auto emit = [&](size_t i, const std::vector<T>& v) {
        if (!ctx.output_wanted(i)) return;
        Tensor& t = ctx.alloc_output(i, x.dtype(), {F});
        std::copy(v.begin(), v.end(), t.data<T>());
      };
      std::vector<T> run_mean(static_cast<size_t>(F)), run_var(static_cast<size_t>(F));
      for (size_t f = 0; f < static_cast<size_t>(F); ++f) {
        run_mean[f] = mean[f] * mom + bmean[f] * (T(1) - mom);
        run_var[f] = var[f] * mom + bvar[f] * (T(1) - mom);
      }
      emit(1, run_mean);
      emit(2, run_var);
      emit(3, bmean);
      emit(4, bvar);
      mean = bmean;
      var = bvar;
    }
    std::vector<T> a(static_cast<size_t>(F)), b(static_cast<size_t>(F));
    for (size_t f = 0; f < static_cast<size_t>(F); ++f) {
      a[f] = static_cast<T>(static_cast<double>(sc[f]) / std::sqrt(static_cast<double>(var[f]) + eps));
      b[f] = bi[f] - mean[f] * a[f];
    }
    if (S == 1) {
      ctx.pool().parallel_for(N, math::grain_for(F), [&](int64_t lo, int64_t hi) {
        for (int64_t n = lo; n < hi; ++n) {
          const T* xn = px + n * F;
          T* yn = py + n * F;
          for (int64_t f = 0; f < F; ++f) yn[f] = xn[f] * a[static_cast<size_t>(f)] + b[static_cast<size_t>(f)];
        }
      });
    } else {
      ctx.pool().parallel_for(N * F, math::grain_for(S), [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) {
          const size_t f = static_cast<size_t>(t % F);
          affine(px + t * S, py + t * S, S, a[f], b[f]);
        }
      });
    }
  });
}

// ---- LayerNormalization (opset 17)

// Rows [lo, hi) of [rows, D]: each row's mean and 1/sqrt(var + eps), then the affine map.
template <typename T>
__attribute__((always_inline)) inline void layernorm_rows(const T* px, T* py, const T* s, const T* b, int64_t D,
                                                          double eps, T* pmean, T* pinv, int64_t lo, int64_t hi) {
  for (int64_t r = lo; r < hi; ++r) {
    const T* xr = px + r * D;
    T* yr = py + r * D;
    T mean, inv;
    row_stats(xr, D, eps, mean, inv);
    for (int64_t i = 0; i < D; ++i) yr[i] = (xr[i] - mean) * inv * s[i] + b[i];
    if (pmean) pmean[r] = mean;
    if (pinv) pinv[r] = inv;
  }
}

// The float rows built for SSE2, AVX2 and AVX-512, as the unary kernels pick (unary_isa). A
// transformer's rows are short (64-256 values): the SSE2 build's 4-lane sums and affine loop took
// 29 ns a row of 64 (LayerNormalization over [8, 17, 64], one thread). norm.cpp is compiled with
// -ffp-contract=off, and the sums keep their 16 lanes in every build, so the three give the same
// bits.
void layernorm_float_rows_sse2(const float* px, float* py, const float* s, const float* b, int64_t D, double eps,
                               float* pmean, float* pinv, int64_t lo, int64_t hi) {
  layernorm_rows(px, py, s, b, D, eps, pmean, pinv, lo, hi);
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void layernorm_float_rows_avx2(const float* px, float* py, const float* s,
                                                               const float* b, int64_t D, double eps, float* pmean,
                                                               float* pinv, int64_t lo, int64_t hi) {
  layernorm_rows(px, py, s, b, D, eps, pmean, pinv, lo, hi);
}
__attribute__((target("avx512f"))) void layernorm_float_rows_avx512(const float* px, float* py, const float* s,
                                                                    const float* b, int64_t D, double eps, float* pmean,
                                                                    float* pinv, int64_t lo, int64_t hi) {
  layernorm_rows(px, py, s, b, D, eps, pmean, pinv, lo, hi);
}
#endif

void layernorm_float_rows(const float* px, float* py, const float* s, const float* b, int64_t D, double eps,
                          float* pmean, float* pinv, int64_t lo, int64_t hi) {
#if defined(__x86_64__) && defined(__GNUC__)
  switch (unary_isa()) {
    case UnaryIsa::Avx512: return layernorm_float_rows_avx512(px, py, s, b, D, eps, pmean, pinv, lo, hi);
    case UnaryIsa::Avx2: return layernorm_float_rows_avx2(px, py, s, b, D, eps, pmean, pinv, lo, hi);
    default: break;
  }
#endif
  layernorm_float_rows_sse2(px, py, s, b, D, eps, pmean, pinv, lo, hi);
}

void layernorm_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  const Tensor* bias = ctx.input_or_null(2);
  const int rank = x.rank();
  if (rank == 0) ctx.fail("input must have rank >= 1");
  const int axis = normalize_axis(ctx, ctx.node().attr_int("axis", -1), rank);
  const double eps = ctx.node().attr_float("epsilon", 1e-5f);
  Shape norm_shape(x.shape().begin() + axis, x.shape().end());
  const int64_t D = shape_numel(norm_shape);
  const int64_t rows = D > 0 ? x.numel() / D : shape_numel(Shape(x.shape().begin(), x.shape().begin() + axis));
  Shape stat_shape;  // only for the optional Mean and InvStdDev outputs
  if (ctx.output_wanted(1) || ctx.output_wanted(2)) {
    stat_shape.assign(x.shape().begin(), x.shape().begin() + axis);
    stat_shape.resize(static_cast<size_t>(rank), 1);
  }
  Tensor& y = ctx.alloc_output(0, x.dtype(), x.shape());
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<T> sc_storage, bi_storage;
    const T* s = param_row<T>(ctx, scale, norm_shape, "Scale", sc_storage);
    if (!bias) bi_storage.assign(static_cast<size_t>(D), T(0));
    const T* b = bias ? param_row<T>(ctx, *bias, norm_shape, "B", bi_storage) : bi_storage.data();
    T* pmean = ctx.output_wanted(1) ? ctx.alloc_output(1, x.dtype(), stat_shape).template data<T>() : nullptr;
    T* pinv = ctx.output_wanted(2) ? ctx.alloc_output(2, x.dtype(), stat_shape).template data<T>() : nullptr;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    ctx.pool().parallel_for(rows, math::grain_for(D, 16384), [&](int64_t lo, int64_t hi) {
      if constexpr (std::is_same_v<T, float>) layernorm_float_rows(px, py, s, b, D, eps, pmean, pinv, lo, hi);
      else layernorm_rows(px, py, s, b, D, eps, pmean, pinv, lo, hi);
    });
  });
}

// ---- InstanceNormalization

void instancenorm_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  const Tensor& bias = ctx.input(2);
  if (x.rank() < 2) ctx.fail("input must have rank >= 2, got shape {}", shape_str(x.shape()));
  const double eps = ctx.node().attr_float("epsilon", 1e-5f);
  const int64_t N = x.dim(0), C = x.dim(1);
  if (scale.numel() != C || bias.numel() != C)
    ctx.fail("scale and B must have {} values (one per channel), got {} and {}", C, scale.numel(), bias.numel());
  const int64_t S = N * C > 0 ? x.numel() / (N * C) : 0;
  Tensor& y = ctx.alloc_output(0, x.dtype(), x.shape());
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::vector<T> sc = param_values<T>(scale), bi = param_values<T>(bias);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    ctx.pool().parallel_for(N * C, math::grain_for(S, 16384), [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const size_t c = static_cast<size_t>(t % C);
        T mean, inv;
        row_stats(px + t * S, S, eps, mean, inv);
        const T a = inv * sc[c];
        affine(px + t * S, py + t * S, S, a, bi[c] - mean * a);
      }
    });
  });
}

// ---- GroupNormalization: scale/bias per group (opset 18) or per channel (opset 21).

void groupnorm_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  const Tensor& bias = ctx.input(2);
  if (x.rank() < 2) ctx.fail("input must have rank >= 2, got shape {}", shape_str(x.shape()));
  if (!ctx.node().has_attr("num_groups")) ctx.fail("attribute num_groups is required");
  const int64_t G = ctx.node().attr_int("num_groups", 1);
  const double eps = ctx.node().attr_float("epsilon", 1e-5f);
  const int64_t N = x.dim(0), C = x.dim(1);
  if (G <= 0 || C % G != 0) ctx.fail("num_groups {} does not divide the {} channels", G, C);
  const int64_t expect = ctx.opset() >= 21 ? C : G;
  if (scale.numel() != expect || bias.numel() != expect)
    ctx.fail("scale and bias must have {} values at opset {}, got {} and {}", expect, ctx.opset(), scale.numel(), bias.numel());
  const bool per_channel = ctx.opset() >= 21;
  const int64_t S = N * C > 0 ? x.numel() / (N * C) : 0;
  const int64_t cpg = C / G;
  Tensor& y = ctx.alloc_output(0, x.dtype(), x.shape());
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::vector<T> sc = param_values<T>(scale), bi = param_values<T>(bias);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t block = cpg * S;
    ctx.pool().parallel_for(N * G, math::grain_for(block, 16384), [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t g = t % G;
        T mean, inv;
        row_stats(px + t * block, block, eps, mean, inv);
        for (int64_t k = 0; k < cpg; ++k) {
          const size_t p = static_cast<size_t>(per_channel ? g * cpg + k : g);
          const T a = inv * sc[p];
          affine(px + t * block + k * S, py + t * block + k * S, S, a, bi[p] - mean * a);
        }
      }
    });
  });
}

// ---- LpNormalization and MeanVarianceNormalization use the reduction engine.

template <typename T>
struct NormSumOp {
  using Acc = T;
  static Acc init() { return T(0); }
  static Acc comb(Acc a, Acc b) { return a + b; }
};
template <typename T>
struct AbsSumOp : NormSumOp<T> {
  static T map(T x, T) { return std::fabs(x); }
  static T fin(T a, int64_t, T) { return a; }
};
template <typename T>
struct SqrtSumSqOp : NormSumOp<T> {
  static T map(T x, T) { return x * x; }
  static T fin(T a, int64_t, T) { return std::sqrt(a); }
};
template <typename T>
struct MeanOp : NormSumOp<T> {
  static T map(T x, T) { return x; }
  static T fin(T a, int64_t n, T) { return n > 0 ? a / static_cast<T>(n) : T(0); }
};
// Population standard deviation around the shift (the mean).
template <typename T>
struct StdOp : NormSumOp<T> {
  static T map(T x, T m) { return (x - m) * (x - m); }
  static T fin(T a, int64_t n, T) { return n > 0 ? std::sqrt(a / static_cast<T>(n)) : T(0); }
};

void lpnorm_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int rank = x.rank();
  if (rank == 0) ctx.fail("input must have rank >= 1");
  const int axis = normalize_axis(ctx, ctx.node().attr_int("axis", -1), rank);
  const int64_t p = ctx.node().attr_int("p", 2);
  if (p != 1 && p != 2) ctx.fail("p must be 1 or 2, got {}", p);
  std::vector<bool> reduce(static_cast<size_t>(rank), false);
  reduce[static_cast<size_t>(axis)] = true;
  const math::ReducePlan plan = math::plan_reduce(x.shape(), reduce);
  Tensor& y = ctx.alloc_output(0, x.dtype(), x.shape());
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<T> norm(static_cast<size_t>(plan.outputs));
    if (p == 1) math::run_reduce<T, T, AbsSumOp<T>>(ctx.pool(), plan, x.data<T>(), norm.data(), nullptr);
    else math::run_reduce<T, T, SqrtSumSqOp<T>>(ctx.pool(), plan, x.data<T>(), norm.data(), nullptr);
    // A zero norm leaves the (zero) values as they are instead of producing NaN.
    for (T& v : norm) v = v == T(0) ? T(0) : T(1) / v;
    const T* inv = norm.data();
    math::apply_reduced(ctx.pool(), plan, x.data<T>(), y.data<T>(), [inv](T v, int64_t o) { return v * inv[o]; });
  });
}

void mvn_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int rank = x.rank();
  const std::vector<int64_t> axes = ctx.node().attr_ints("axes", {0, 2, 3});
  std::vector<bool> reduce(static_cast<size_t>(rank), false);
  for (int64_t a : axes) {
    const int ax = normalize_axis(ctx, a, rank);
    if (reduce[static_cast<size_t>(ax)]) ctx.fail("axis {} is listed twice", a);
    reduce[static_cast<size_t>(ax)] = true;
  }
  const math::ReducePlan plan = math::plan_reduce(x.shape(), reduce);
  Tensor& y = ctx.alloc_output(0, x.dtype(), x.shape());
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<T> mean(static_cast<size_t>(plan.outputs)), inv(static_cast<size_t>(plan.outputs));
    math::run_reduce<T, T, MeanOp<T>>(ctx.pool(), plan, x.data<T>(), mean.data(), nullptr);
    math::run_reduce<T, T, StdOp<T>>(ctx.pool(), plan, x.data<T>(), inv.data(), mean.data());
    // ONNX's function body divides by (std + 1e-9).
    for (T& v : inv) v = T(1) / (v + static_cast<T>(1e-9));
    const T* m = mean.data();
    const T* s = inv.data();
    math::apply_reduced(ctx.pool(), plan, x.data<T>(), y.data<T>(), [m, s](T v, int64_t o) { return (v - m[o]) * s[o]; });
  });
}

}  // namespace

void layernorm_rows_float(const float* x, float* y, const float* scale, const float* bias, int64_t d, double epsilon,
                          int64_t rows) {
  layernorm_float_rows(x, y, scale, bias, d, epsilon, nullptr, nullptr, 0, rows);
}

void register_norm(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  const int M = kMaxOpset;
  r.add_fn("", "BatchNormalization", 1, M, cpu, batchnorm_kernel);
  r.add_fn("", "LayerNormalization", 17, M, cpu, layernorm_kernel);
  // The written-out LayerNorm of older exports, fused by passes/fuse_layer_norm for `mpq run`.
  r.add_fn("mpq", "LayerNormalization", 1, 1, cpu, layernorm_kernel);
  r.add_fn("", "InstanceNormalization", 1, M, cpu, instancenorm_kernel);
  r.add_fn("", "GroupNormalization", 18, M, cpu, groupnorm_kernel);
  r.add_fn("", "LpNormalization", 1, M, cpu, lpnorm_kernel);
  r.add_fn("", "MeanVarianceNormalization", 9, M, cpu, mvn_kernel);
}

}  // namespace mpq::rt::cpu
