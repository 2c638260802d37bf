// Elementwise unary ops: activations (Relu family, Sigmoid, Tanh, Gelu, ...), math functions
// (Exp, Log, trigonometry, rounding), predicates (IsNaN, IsInf) and Clip / PRelu / Shrink.
//
// Each op is a small functor: constructed from the node's attributes, applied per element. The
// float32 path uses the vectorisable approximations of math_util.h; float64 uses libm.
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>

#include "runtime/cpu/common.h"
#include "runtime/cpu/math_util.h"
#include "runtime/cpu/register_all.h"
#include "runtime/cpu/unary.h"

namespace mpq::rt::cpu {

namespace {

using math::fast_exp;
using math::fast_expm1;
using math::fast_log;
using math::fast_log1p;
using math::fast_tanh;
using math::sel;

// Which element types an op accepts.
enum class Types { Float, SignedOrFloat, Number, Integer };

template <Types S, typename T>
constexpr bool type_allowed() {
  if constexpr (S == Types::Float) return std::is_floating_point_v<T>;
  if constexpr (S == Types::SignedOrFloat) return std::is_floating_point_v<T> || std::is_signed_v<T>;
  if constexpr (S == Types::Number) return true;
  if constexpr (S == Types::Integer) return std::is_integral_v<T>;
  return false;
}

const char* types_text(Types s) {
  switch (s) {
    case Types::Float: return "a floating-point";
    case Types::SignedOrFloat: return "a signed numeric";
    case Types::Number: return "a numeric";
    case Types::Integer: return "an integer";
  }
  return "a numeric";
}

// out[i] = f(in[i]) over [lo, hi). A local copy of the functor: its parameters then stay in
// registers, since no store through `out` can alias them, and the loop vectorises.
template <typename TI, typename TO, typename F>
void map_range(const TI* in, TO* out, int64_t lo, int64_t hi, const F& f) {
  const F local = f;
  for (int64_t i = lo; i < hi; ++i) out[i] = local(in[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
// The same loop compiled for AVX2 (8 floats per vector instead of SSE2's 4; the functors and
// math_util's approximations inline into it). No FMA: a contracted a*b+c would round differently
// from the SSE2 build, and both must give the same bits.
template <typename TI, typename TO, typename F>
__attribute__((target("avx2"))) void map_range_avx2(const TI* in, TO* out, int64_t lo, int64_t hi, const F& f) {
  const F local = f;
  for (int64_t i = lo; i < hi; ++i) out[i] = local(in[i]);
}

// And for AVX-512 (16 floats per vector). This file is compiled with -ffp-contract=off, so no
// product and sum are contracted into an FMA here either: the three builds give the same bits.
template <typename TI, typename TO, typename F>
__attribute__((target("avx512f"))) void map_range_avx512(const TI* in, TO* out, int64_t lo, int64_t hi, const F& f) {
  const F local = f;
  for (int64_t i = lo; i < hi; ++i) out[i] = local(in[i]);
}

bool cpu_has_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2");
  return ok;
}

bool cpu_has_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}
#endif

std::atomic<int> g_forced_isa{static_cast<int>(UnaryIsa::Auto)};

// Elements per chunk of a parallel loop: 16384 for ops of a few cycles per element; 2048 for the
// transcendental ones (kCostly: an exp, erf or log per element, 1-4 ns here), whose tensors in
// small transformers (16-64 tokens x 64-256 channels) would otherwise fit one or two chunks and
// leave the second thread idle.
template <typename Op>
constexpr int64_t elems_per_chunk() {
  if constexpr (requires { Op::kCostly; }) return Op::kCostly ? 2048 : 16384;
  else return 16384;
}

// Elements [lo, hi) on the calling thread, by the build of the ISA in force (unary_isa()).
template <typename TI, typename TO, typename F>
void map_range_isa(UnaryIsa forced, const TI* in, TO* out, int64_t lo, int64_t hi, const F& f) {
#if defined(__x86_64__) && defined(__GNUC__)
  if ((forced == UnaryIsa::Auto || forced == UnaryIsa::Avx512) && cpu_has_avx512())
    return map_range_avx512(in, out, lo, hi, f);
  if (forced != UnaryIsa::Baseline && cpu_has_avx2()) return map_range_avx2(in, out, lo, hi, f);
#endif
  map_range(in, out, lo, hi, f);
}

template <typename TI, typename TO, typename F>
void map_elems(ThreadPool& pool, const TI* in, TO* out, int64_t n, const F& f, int64_t grain = 16384) {
  const auto forced = static_cast<UnaryIsa>(g_forced_isa.load(std::memory_order_relaxed));
  pool.parallel_for(n, grain, [&](int64_t lo, int64_t hi) { map_range_isa(forced, in, out, lo, hi, f); });
}

template <typename T>
constexpr bool is_f32 = std::is_same_v<T, float>;

// ---- op functors: `template <class T> T operator()(T x) const`

struct Relu {
  static constexpr Types kTypes = Types::SignedOrFloat;
  explicit Relu(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const { return x < T(0) ? T(0) : x; }
};

struct LeakyRelu {
  static constexpr Types kTypes = Types::Float;
  float alpha;
  explicit LeakyRelu(const KernelContext& c) : alpha(c.node().attr_float("alpha", 0.01f)) {}
  template <typename T>
  T operator()(T x) const { return sel(x < T(0), static_cast<T>(alpha) * x, x); }
};

struct Elu {
  static constexpr Types kTypes = Types::Float;
  static constexpr bool kCostly = true;
  float alpha;
  explicit Elu(const KernelContext& c) : alpha(c.node().attr_float("alpha", 1.0f)) {}
  template <typename T>
  T operator()(T x) const {
    if constexpr (is_f32<T>) return sel(x < 0.0f, alpha * fast_expm1(x), x);
    else return x < T(0) ? static_cast<T>(alpha) * std::expm1(x) : x;
  }
};

struct Selu {
  static constexpr Types kTypes = Types::Float;
  static constexpr bool kCostly = true;
  float alpha, gamma;
  explicit Selu(const KernelContext& c)
      : alpha(c.node().attr_float("alpha", 1.67326319217681884765625f)),
        gamma(c.node().attr_float("gamma", 1.05070102214813232421875f)) {}
  template <typename T>
  T operator()(T x) const {
    const T a = static_cast<T>(alpha), g = static_cast<T>(gamma);
    if constexpr (is_f32<T>) return sel(x <= 0.0f, g * a * fast_expm1(x), g * x);
    else return x <= T(0) ? g * a * std::expm1(x) : g * x;
  }
};

struct Celu {
  static constexpr Types kTypes = Types::Float;
  static constexpr bool kCostly = true;
  float alpha;
  explicit Celu(const KernelContext& c) : alpha(c.node().attr_float("alpha", 1.0f)) {
    if (alpha == 0.0f) c.fail("Celu alpha must not be 0");
  }
  template <typename T>
  T operator()(T x) const {
    const T a = static_cast<T>(alpha);
    if constexpr (is_f32<T>) return sel(x > 0.0f, x, a * fast_expm1(x / a));
    else return x > T(0) ? x : a * std::expm1(x / a);
  }
};

struct ThresholdedRelu {
  static constexpr Types kTypes = Types::Float;
  float alpha;
  explicit ThresholdedRelu(const KernelContext& c) : alpha(c.node().attr_float("alpha", 1.0f)) {}
  template <typename T>
  T operator()(T x) const { return sel(x > static_cast<T>(alpha), x, T(0)); }
};

struct Sigmoid {
  static constexpr Types kTypes = Types::Float;
  static constexpr bool kCostly = true;
  explicit Sigmoid(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const {
    if constexpr (is_f32<T>) return math::fast_sigmoid(x);
    else return T(1) / (T(1) + std::exp(-x));
  }
};

struct HardSigmoid {
  static constexpr Types kTypes = Types::Float;
  float alpha, beta;
  explicit HardSigmoid(const KernelContext& c)
      : alpha(c.node().attr_float("alpha", 0.2f)), beta(c.node().attr_float("beta", 0.5f)) {}
  template <typename T>
  T operator()(T x) const {
    T v = static_cast<T>(alpha) * x + static_cast<T>(beta);
    v = sel(v < T(0), T(0), v);
    return sel(v > T(1), T(1), v);
  }
};

struct HardSwish {
  static constexpr Types kTypes = Types::Float;
  explicit HardSwish(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const {
    T v = x * static_cast<T>(1.0 / 6.0) + T(0.5);
    v = sel(v < T(0), T(0), v);
    v = sel(v > T(1), T(1), v);
    return x * v;
  }
};

struct Tanh {
  static constexpr Types kTypes = Types::Float;
  static constexpr bool kCostly = true;
  explicit Tanh(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const {
    if constexpr (is_f32<T>) return fast_tanh(x);
    else return std::tanh(x);
  }
};

struct Erf {
  static constexpr Types kTypes = Types::Float;
  static constexpr bool kCostly = true;
  explicit Erf(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const {
    if constexpr (is_f32<T>) return math::fast_erf(x);
    else return std::erf(x);
  }
};

// Gelu with approximate="none": 0.5 x (1 + erf(x / sqrt 2)).
struct GeluErf {
  static constexpr Types kTypes = Types::Float;
  static constexpr bool kCostly = true;
  GeluErf() = default;
  explicit GeluErf(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const {
    if constexpr (is_f32<T>) return 0.5f * x * math::fast_one_plus_erf(x * 0.70710678118654752f);
    else return T(0.5) * x * std::erfc(-x * static_cast<T>(0.70710678118654752));
  }
};

// Gelu with approximate="tanh": 0.5 x (1 + tanh(u)) == x sigmoid(2u), with no cancellation for
// negative x.
struct GeluTanh {
  static constexpr Types kTypes = Types::Float;
  static constexpr bool kCostly = true;
  GeluTanh() = default;
  explicit GeluTanh(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const {
    const T u = static_cast<T>(0.7978845608028654) * (x + static_cast<T>(0.044715) * x * x * x);
    if constexpr (is_f32<T>) return x / (1.0f + fast_exp(-2.0f * u));
    else return x / (T(1) + std::exp(T(-2) * u));
  }
};

// log(1 + e^x) without overflow: max(x, 0) + log1p(e^-|x|).
template <typename T>
__attribute__((always_inline)) inline T softplus(T x) {
  if constexpr (is_f32<T>) {
    return sel(x > 0.0f, x, 0.0f) + fast_log1p(fast_exp(-std::fabs(x)));
  } else {
    if (std::isnan(x)) return x;
    return (x > T(0) ? x : T(0)) + std::log1p(std::exp(-std::fabs(x)));
  }
}

struct Softplus {
  static constexpr Types kTypes = Types::Float;
  static constexpr bool kCostly = true;
  explicit Softplus(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const { return softplus(x); }
};

struct Mish {
  static constexpr Types kTypes = Types::Float;
  static constexpr bool kCostly = true;
  explicit Mish(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const {
    if constexpr (is_f32<T>) return x * fast_tanh(softplus(x));
    else return x * std::tanh(softplus(x));
  }
};

struct Softsign {
  static constexpr Types kTypes = Types::Float;
  explicit Softsign(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const { return x / (T(1) + std::fabs(x)); }
};

struct Exp {
  static constexpr Types kTypes = Types::Float;
  static constexpr bool kCostly = true;
  explicit Exp(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const {
    if constexpr (is_f32<T>) return fast_exp(x);
    else return std::exp(x);
  }
};

struct Log {
  static constexpr Types kTypes = Types::Float;
  static constexpr bool kCostly = true;
  explicit Log(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const {
    if constexpr (is_f32<T>) return fast_log(x);
    else return std::log(x);
  }
};

struct Neg {
  static constexpr Types kTypes = Types::SignedOrFloat;
  explicit Neg(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const { return static_cast<T>(-x); }
};

struct Abs {
  static constexpr Types kTypes = Types::Number;
  explicit Abs(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return std::fabs(x);
    else if constexpr (std::is_signed_v<T>) return static_cast<T>(x < 0 ? -x : x);
    else return x;
  }
};

struct Sign {
  static constexpr Types kTypes = Types::Number;
  explicit Sign(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const {
    if constexpr (std::is_unsigned_v<T>) return x > 0 ? T(1) : T(0);
    else return sel(x > T(0), T(1), sel(x < T(0), T(-1), x));  // keeps 0 and NaN
  }
};

struct Reciprocal {
  static constexpr Types kTypes = Types::Float;
  explicit Reciprocal(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const { return T(1) / x; }
};

// libm functions of one floating-point argument.
#define MPQ_LIBM_OP(Name, fn)                                \
  struct Name {                                              \
    static constexpr Types kTypes = Types::Float;            \
    explicit Name(const KernelContext&) {}                   \
    template <typename T>                                    \
    T operator()(T x) const { return std::fn(x); }           \
  };
MPQ_LIBM_OP(Sqrt, sqrt)

// Rounding. float32 uses the 2^23 trick (adding and subtracting 2^23 rounds half to even in the
// default rounding mode; larger magnitudes are already integers), which vectorises.
inline float round_even_f(float x) {
  const float ax = std::fabs(x);
  const float r = (ax + 8388608.0f) - 8388608.0f;
  return sel(ax < 8388608.0f, std::copysign(r, x), x);
}

struct Round {
  static constexpr Types kTypes = Types::Float;
  explicit Round(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const {
    if constexpr (is_f32<T>) return round_even_f(x);
    else return std::nearbyint(x);  // half to even in the default rounding mode
  }
};

struct Floor {
  static constexpr Types kTypes = Types::Float;
  explicit Floor(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const {
    if constexpr (is_f32<T>) {
      const float r = round_even_f(x);
      // floor(x) has the sign of x (or is +-0 with it), so copysign fixes the zero's sign.
      return sel(std::fabs(x) < 8388608.0f, std::copysign(sel(r > x, r - 1.0f, r), x), x);
    } else {
      return std::floor(x);
    }
  }
};

struct Ceil {
  static constexpr Types kTypes = Types::Float;
  explicit Ceil(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const {
    if constexpr (is_f32<T>) {
      const float r = round_even_f(x);
      return sel(std::fabs(x) < 8388608.0f, std::copysign(sel(r < x, r + 1.0f, r), x), x);
    } else {
      return std::ceil(x);
    }
  }
};

MPQ_LIBM_OP(Sin, sin)
MPQ_LIBM_OP(Cos, cos)
MPQ_LIBM_OP(Tan, tan)
MPQ_LIBM_OP(Asin, asin)
MPQ_LIBM_OP(Acos, acos)
MPQ_LIBM_OP(Atan, atan)
MPQ_LIBM_OP(Sinh, sinh)
MPQ_LIBM_OP(Cosh, cosh)
MPQ_LIBM_OP(Asinh, asinh)
MPQ_LIBM_OP(Acosh, acosh)
MPQ_LIBM_OP(Atanh, atanh)
#undef MPQ_LIBM_OP

struct Shrink {
  static constexpr Types kTypes = Types::Number;
  double lambd, bias;
  explicit Shrink(const KernelContext& c)
      : lambd(c.node().attr_float("lambd", 0.5f)), bias(c.node().attr_float("bias", 0.0f)) {}
  template <typename T>
  T operator()(T x) const {
    if constexpr (is_f32<T>) {
      const float l = static_cast<float>(lambd), b = static_cast<float>(bias);
      return sel(x < -l, x + b, sel(x > l, x - b, 0.0f));
    } else {
      const double v = static_cast<double>(x);
      return static_cast<T>(v < -lambd ? v + bias : (v > lambd ? v - bias : 0.0));
    }
  }
};

struct BitwiseNot {
  static constexpr Types kTypes = Types::Integer;
  explicit BitwiseNot(const KernelContext&) {}
  template <typename T>
  T operator()(T x) const { return static_cast<T>(~x); }
};

template <class Op>
void unary_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Op op(ctx);
  Tensor& out = ctx.alloc_output(0, x.dtype(), x.shape());
  if (x.dtype() == DType::Bool || x.dtype() == DType::String)
    ctx.fail("needs {} input, got {}", types_text(Op::kTypes), dtype_name(x.dtype()));
  visit_arith(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (type_allowed<Op::kTypes, T>()) {
      map_elems(ctx.pool(), x.data<T>(), out.data<T>(), x.numel(), [op](T v) { return op.template operator()<T>(v); },
                elems_per_chunk<Op>());
    } else {
      ctx.fail("needs {} input, got {}", types_text(Op::kTypes), dtype_name(x.dtype()));
    }
  });
}

// Gelu over n floats on the calling thread: the Gelu kernel's functor, loop and ISA, so the same bits.
template <class Op>
void gelu_range_with(const float* in, float* out, int64_t n) {
  const Op op;
  const auto forced = static_cast<UnaryIsa>(g_forced_isa.load(std::memory_order_relaxed));
  map_range_isa(forced, in, out, int64_t{0}, n, [op](float v) { return op.template operator()<float>(v); });
}

}  // namespace

void gelu_range(bool tanh, const float* in, float* out, int64_t n) {
  if (tanh) gelu_range_with<GeluTanh>(in, out, n);
  else gelu_range_with<GeluErf>(in, out, n);
}

namespace {

void gelu_kernel(KernelContext& ctx) {
  const std::string a = ctx.node().attr_string("approximate", "none");
  if (a == "none") unary_kernel<GeluErf>(ctx);
  else if (a == "tanh") unary_kernel<GeluTanh>(ctx);
  else ctx.fail("Gelu approximate must be 'none' or 'tanh', got '{}'", a);
}

// ---- predicates and logic

void isnan_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.alloc_output(0, DType::Bool, x.shape());
  if (x.dtype() == DType::Float32) {
    map_elems(ctx.pool(), x.data<float>(), out.data<bool>(), x.numel(), [](float v) { return v != v; });
  } else if (x.dtype() == DType::Float64) {
    map_elems(ctx.pool(), x.data<double>(), out.data<bool>(), x.numel(), [](double v) { return v != v; });
  } else {
    ctx.fail("needs a floating-point input, got {}", dtype_name(x.dtype()));
  }
}

void isinf_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const bool neg = ctx.node().attr_int("detect_negative", 1) != 0;
  const bool pos = ctx.node().attr_int("detect_positive", 1) != 0;
  Tensor& out = ctx.alloc_output(0, DType::Bool, x.shape());
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T inf = std::numeric_limits<T>::infinity();
    map_elems(ctx.pool(), x.data<T>(), out.data<bool>(), x.numel(),
              [&](T v) { return (pos && v == inf) || (neg && v == -inf); });
  };
  if (x.dtype() == DType::Float32) run(TypeTag<float>{});
  else if (x.dtype() == DType::Float64) run(TypeTag<double>{});
  else ctx.fail("needs a floating-point input, got {}", dtype_name(x.dtype()));
}

void not_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.dtype() != DType::Bool) ctx.fail("needs a bool input, got {}", dtype_name(x.dtype()));
  Tensor& out = ctx.alloc_output(0, DType::Bool, x.shape());
  map_elems(ctx.pool(), x.data<bool>(), out.data<bool>(), x.numel(), [](bool v) { return !v; });
}

// ---- Clip: attributes min/max before opset 11, optional inputs from 11.

void clip_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.alloc_output(0, x.dtype(), x.shape());
  if (x.dtype() == DType::Bool || x.dtype() == DType::String) ctx.fail("needs a numeric input, got {}", dtype_name(x.dtype()));
  visit_arith(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
    if (ctx.opset() < 11) {
      if (ctx.node().has_attr("min")) lo = static_cast<T>(ctx.node().attr_float("min", 0.0f));
      if (ctx.node().has_attr("max")) hi = static_cast<T>(ctx.node().attr_float("max", 0.0f));
    } else {
      for (size_t i = 1; i <= 2; ++i) {
        const Tensor* b = ctx.input_or_null(i);
        if (!b) continue;
        if (b->dtype() != x.dtype())
          ctx.fail("input {} has type {} but the input is {}", i == 1 ? "min" : "max", dtype_name(b->dtype()),
                   dtype_name(x.dtype()));
        if (b->numel() != 1) ctx.fail("{} must be a scalar, got shape {}", i == 1 ? "min" : "max", shape_str(b->shape()));
        (i == 1 ? lo : hi) = b->data<T>()[0];
      }
    }
    map_elems(ctx.pool(), x.data<T>(), out.data<T>(), x.numel(), [lo, hi](T v) {
      T r = v < lo ? lo : v;  // NaN passes through
      return r > hi ? hi : r;
    });
  });
}

// ---- PRelu: slope broadcast unidirectionally to X. Before opset 7 a 1-D slope of size C served
// the channel axis of an N-D input (old exporters relied on it).

void prelu_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor slope = ctx.input(1);
  if (slope.dtype() != x.dtype())
    ctx.fail("slope has type {} but X is {}", dtype_name(slope.dtype()), dtype_name(x.dtype()));
  if (ctx.opset() < 7 && slope.rank() == 1 && x.rank() >= 3 && slope.numel() == x.dim(1) && slope.numel() > 1) {
    Shape s(static_cast<size_t>(x.rank() - 1), 1);
    s[0] = slope.numel();
    slope = slope.reshaped(s);
  }
  Shape shape = broadcast_shapes(ctx, {&x.shape(), &slope.shape()});
  if (shape != x.shape())
    ctx.fail("slope of shape {} does not broadcast to X of shape {}", shape_str(slope.shape()), shape_str(x.shape()));
  Tensor& out = ctx.alloc_output(0, x.dtype(), x.shape());
  if (x.dtype() == DType::Bool || x.dtype() == DType::String) ctx.fail("needs a numeric input, got {}", dtype_name(x.dtype()));
  visit_arith(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_unsigned_v<T>) {
      broadcast_binary<T, T, T>(ctx.pool(), x, slope, out, [](T v, T) { return v; });
    } else {
      broadcast_binary<T, T, T>(ctx.pool(), x, slope, out, [](T v, T s) { return sel(v < T(0), static_cast<T>(s * v), v); });
    }
  });
}

}  // namespace

UnaryIsa force_unary_isa(UnaryIsa isa) {
  g_forced_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
  return unary_isa();
}

UnaryIsa unary_isa() {
  const auto isa = static_cast<UnaryIsa>(g_forced_isa.load(std::memory_order_relaxed));
#if defined(__x86_64__) && defined(__GNUC__)
  if ((isa == UnaryIsa::Auto || isa == UnaryIsa::Avx512) && cpu_has_avx512()) return UnaryIsa::Avx512;
  if (isa != UnaryIsa::Baseline && cpu_has_avx2()) return UnaryIsa::Avx2;
#endif
  return UnaryIsa::Baseline;
}

void register_unary(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  const int M = kMaxOpset;
  r.add_fn("", "Relu", 1, M, cpu, unary_kernel<Relu>);
  r.add_fn("", "LeakyRelu", 1, M, cpu, unary_kernel<LeakyRelu>);
  r.add_fn("", "PRelu", 1, M, cpu, prelu_kernel);
  r.add_fn("", "Elu", 1, M, cpu, unary_kernel<Elu>);
  r.add_fn("", "Selu", 1, M, cpu, unary_kernel<Selu>);
  r.add_fn("", "Celu", 12, M, cpu, unary_kernel<Celu>);
  r.add_fn("", "ThresholdedRelu", 1, M, cpu, unary_kernel<ThresholdedRelu>);  // experimental before 10
  r.add_fn("", "Sigmoid", 1, M, cpu, unary_kernel<Sigmoid>);
  r.add_fn("", "HardSigmoid", 1, M, cpu, unary_kernel<HardSigmoid>);
  r.add_fn("", "HardSwish", 14, M, cpu, unary_kernel<HardSwish>);
  r.add_fn("", "Tanh", 1, M, cpu, unary_kernel<Tanh>);
  r.add_fn("", "Erf", 9, M, cpu, unary_kernel<Erf>);
  r.add_fn("", "Gelu", 20, M, cpu, gelu_kernel);
  // The written-out erf GELU of older exports, fused by passes/fuse_gelu for `mpq run`.
  r.add_fn("mpq", "Gelu", 1, 1, cpu, gelu_kernel);
  r.add_fn("", "Mish", 18, M, cpu, unary_kernel<Mish>);
  r.add_fn("", "Softplus", 1, M, cpu, unary_kernel<Softplus>);
  r.add_fn("", "Softsign", 1, M, cpu, unary_kernel<Softsign>);
  r.add_fn("", "Clip", 1, M, cpu, clip_kernel);
  r.add_fn("", "Sqrt", 1, M, cpu, unary_kernel<Sqrt>);
  r.add_fn("", "Exp", 1, M, cpu, unary_kernel<Exp>);
  r.add_fn("", "Log", 1, M, cpu, unary_kernel<Log>);
  r.add_fn("", "Neg", 1, M, cpu, unary_kernel<Neg>);
  r.add_fn("", "Abs", 1, M, cpu, unary_kernel<Abs>);
  r.add_fn("", "Reciprocal", 1, M, cpu, unary_kernel<Reciprocal>);
  r.add_fn("", "Floor", 1, M, cpu, unary_kernel<Floor>);
  r.add_fn("", "Ceil", 1, M, cpu, unary_kernel<Ceil>);
  r.add_fn("", "Round", 11, M, cpu, unary_kernel<Round>);
  r.add_fn("", "Sign", 9, M, cpu, unary_kernel<Sign>);
  r.add_fn("", "Sin", 7, M, cpu, unary_kernel<Sin>);
  r.add_fn("", "Cos", 7, M, cpu, unary_kernel<Cos>);
  r.add_fn("", "Tan", 7, M, cpu, unary_kernel<Tan>);
  r.add_fn("", "Asin", 7, M, cpu, unary_kernel<Asin>);
  r.add_fn("", "Acos", 7, M, cpu, unary_kernel<Acos>);
  r.add_fn("", "Atan", 7, M, cpu, unary_kernel<Atan>);
  r.add_fn("", "Sinh", 9, M, cpu, unary_kernel<Sinh>);
  r.add_fn("", "Cosh", 9, M, cpu, unary_kernel<Cosh>);
  r.add_fn("", "Asinh", 9, M, cpu, unary_kernel<Asinh>);
  r.add_fn("", "Acosh", 9, M, cpu, unary_kernel<Acosh>);
  r.add_fn("", "Atanh", 9, M, cpu, unary_kernel<Atanh>);
  r.add_fn("", "IsNaN", 9, M, cpu, isnan_kernel);
  r.add_fn("", "IsInf", 10, M, cpu, isinf_kernel);
  r.add_fn("", "Not", 1, M, cpu, not_kernel);
  r.add_fn("", "Shrink", 9, M, cpu, unary_kernel<Shrink>);
  r.add_fn("", "BitwiseNot", 18, M, cpu, unary_kernel<BitwiseNot>);
}

}  // namespace mpq::rt::cpu
