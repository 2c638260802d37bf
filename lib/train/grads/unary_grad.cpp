// Backward of the element-wise unary ops: the Relu family, Clip (ReLU6), Sigmoid, Tanh, the hard
// and smooth activations, Erf (GELU as exporters write it) and Gelu, Sqrt/Exp/Log/Neg/Abs/
// Reciprocal, and the ops a gradient passes through unchanged (Identity, float-to-float Cast,
// inference-mode Dropout).
//
// Each backward is dX = dY * f'(v) with v the cheapest forward value to keep: the output where
// f' is a function of it (Relu, Sigmoid, Tanh, HardSigmoid, Sqrt, Exp, Reciprocal), otherwise the
// input. Where the derivative is undefined (kinks) it follows PyTorch: Relu and Abs give 0 at 0,
// LeakyRelu and PRelu the negative slope, Clip passes the gradient at the bounds themselves.
// float32 uses the runtime's vectorisable exp/erf approximations (math_util.h), float64 libm.
#include <cmath>
#include <string>

#include "runtime/cpu/common.h"
#include "runtime/cpu/math_util.h"
#include "runtime/cpu/unary.h"
#include "train/grads/grad_util.h"
#include "train/grads/register_all_grads.h"

namespace mpq::train::grads {

namespace {

using grad_util::visit_float;
using rt::cpu::math::sel;

constexpr int64_t kGrain = 16384;

template <typename T>
constexpr bool is_f32 = std::is_same_v<T, float>;

template <typename T>
__attribute__((always_inline)) inline T exp_t(T x) {
  if constexpr (is_f32<T>) return rt::cpu::math::fast_exp(x);
  else return std::exp(x);
}

// Which forward value a backward functor reads.
enum class Source { Input, Output };

// ---- functors: constructed from the node, `T operator()(T g, T v)` gives dX for dY = g.

struct ReluGrad {
  static constexpr Source kSource = Source::Output;
  explicit ReluGrad(const ir::Node&) {}
  template <typename T>
  T operator()(T g, T y) const { return sel(y > T(0), g, T(0)); }
};

struct LeakyReluGrad {
  static constexpr Source kSource = Source::Input;
  float alpha;
  explicit LeakyReluGrad(const ir::Node& n) : alpha(n.attr_float("alpha", 0.01f)) {}
  template <typename T>
  T operator()(T g, T x) const { return sel(x > T(0), g, static_cast<T>(alpha) * g); }
};

struct EluGrad {
  static constexpr Source kSource = Source::Input;
  float alpha;
  explicit EluGrad(const ir::Node& n) : alpha(n.attr_float("alpha", 1.0f)) {}
  template <typename T>
  T operator()(T g, T x) const { return sel(x < T(0), static_cast<T>(alpha) * exp_t(sel(x < T(0), x, T(0))) * g, g); }
};

struct SigmoidGrad {
  static constexpr Source kSource = Source::Output;
  explicit SigmoidGrad(const ir::Node&) {}
  template <typename T>
  T operator()(T g, T y) const { return g * y * (T(1) - y); }
};

struct TanhGrad {
  static constexpr Source kSource = Source::Output;
  explicit TanhGrad(const ir::Node&) {}
  template <typename T>
  T operator()(T g, T y) const { return g * (T(1) - y * y); }
};

// y = clamp(alpha x + beta, 0, 1): the slope is alpha exactly where the output is strictly inside.
struct HardSigmoidGrad {
  static constexpr Source kSource = Source::Output;
  float alpha;
  explicit HardSigmoidGrad(const ir::Node& n) : alpha(n.attr_float("alpha", 0.2f)) {}
  template <typename T>
  T operator()(T g, T y) const { return sel((y > T(0)) & (y < T(1)), static_cast<T>(alpha) * g, T(0)); }
};

// y = x clamp(x / 6 + 1/2, 0, 1): 0 below -3, 1 above 3, x / 3 + 1/2 between (PyTorch's bounds).
struct HardSwishGrad {
  static constexpr Source kSource = Source::Input;
  explicit HardSwishGrad(const ir::Node&) {}
  template <typename T>
  T operator()(T g, T x) const {
    const T inner = x * static_cast<T>(1.0 / 3.0) + T(0.5);
    return g * sel(x < T(-3), T(0), sel(x > T(3), T(1), inner));
  }
};

// d erf(x) / dx = 2 / sqrt(pi) e^{-x^2}.
struct ErfGrad {
  static constexpr Source kSource = Source::Input;
  explicit ErfGrad(const ir::Node&) {}
  template <typename T>
  T operator()(T g, T x) const { return g * static_cast<T>(1.1283791670955126) * exp_t(-x * x); }
};

// Gelu (none): Phi(x) + x phi(x).
struct GeluErfGrad {
  static constexpr Source kSource = Source::Input;
  explicit GeluErfGrad(const ir::Node&) {}
  template <typename T>
  T operator()(T g, T x) const {
    const T pdf = static_cast<T>(0.3989422804014327) * exp_t(T(-0.5) * x * x);
    T cdf;
    if constexpr (is_f32<T>) cdf = 0.5f * rt::cpu::math::fast_one_plus_erf(x * 0.70710678118654752f);
    else cdf = T(0.5) * std::erfc(-x * static_cast<T>(0.70710678118654752));
    return g * (cdf + x * pdf);
  }
};

// Gelu (tanh): y = x s with s = sigmoid(2u), u = c (x + k x^3); dy/dx = s + x 2 s (1 - s) u'.
struct GeluTanhGrad {
  static constexpr Source kSource = Source::Input;
  explicit GeluTanhGrad(const ir::Node&) {}
  template <typename T>
  T operator()(T g, T x) const {
    const T c = static_cast<T>(0.7978845608028654), k = static_cast<T>(0.044715);
    const T u = c * (x + k * x * x * x);
    const T s = T(1) / (T(1) + exp_t(T(-2) * u));
    const T du = c * (T(1) + T(3) * k * x * x);
    return g * (s + x * T(2) * s * (T(1) - s) * du);
  }
};

// d softplus(x) / dx = sigmoid(x).
struct SoftplusGrad {
  static constexpr Source kSource = Source::Input;
  explicit SoftplusGrad(const ir::Node&) {}
  template <typename T>
  T operator()(T g, T x) const { return g / (T(1) + exp_t(-x)); }
};

struct SqrtGrad {
  static constexpr Source kSource = Source::Output;
  explicit SqrtGrad(const ir::Node&) {}
  template <typename T>
  T operator()(T g, T y) const { return g / (T(2) * y); }
};

struct ExpGrad {
  static constexpr Source kSource = Source::Output;
  explicit ExpGrad(const ir::Node&) {}
  template <typename T>
  T operator()(T g, T y) const { return g * y; }
};

struct LogGrad {
  static constexpr Source kSource = Source::Input;
  explicit LogGrad(const ir::Node&) {}
  template <typename T>
  T operator()(T g, T x) const { return g / x; }
};

struct AbsGrad {
  static constexpr Source kSource = Source::Input;
  explicit AbsGrad(const ir::Node&) {}
  template <typename T>
  T operator()(T g, T x) const { return sel(x > T(0), g, sel(x < T(0), -g, T(0))); }
};

// d(1/x)/dx = -1/x^2 = -y^2.
struct ReciprocalGrad {
  static constexpr Source kSource = Source::Output;
  explicit ReciprocalGrad(const ir::Node&) {}
  template <typename T>
  T operator()(T g, T y) const { return -g * y * y; }
};

// The float32 loop is compiled three times, as the forward's (runtime/cpu/unary.h): for the
// baseline ISA, AVX2 and AVX-512, picked by rt::cpu::unary_isa(). The functors and math_util's
// approximations inline into each; this file is compiled with -ffp-contract=off, so the three give
// the same bits.
template <class Op, typename T>
void grad_range(const Op& op, const T* pg, const T* pv, T* pd, int64_t lo, int64_t hi) {
  const Op local = op;  // kept in registers so that the loop vectorises
  for (int64_t i = lo; i < hi; ++i) pd[i] = local.template operator()<T>(pg[i], pv[i]);
}
#if defined(__x86_64__) && defined(__GNUC__)
template <class Op, typename T>
__attribute__((target("avx2"))) void grad_range_avx2(const Op& op, const T* pg, const T* pv, T* pd, int64_t lo, int64_t hi) {
  const Op local = op;
  for (int64_t i = lo; i < hi; ++i) pd[i] = local.template operator()<T>(pg[i], pv[i]);
}
template <class Op, typename T>
__attribute__((target("avx512f"))) void grad_range_avx512(const Op& op, const T* pg, const T* pv, T* pd, int64_t lo,
                                                            int64_t hi) {
  const Op local = op;
  for (int64_t i = lo; i < hi; ++i) pd[i] = local.template operator()<T>(pg[i], pv[i]);
}
#endif

template <class Op>
void elementwise_grad(GradContext& ctx) {
  if (!ctx.needs_grad(0)) return;
  const Tensor& g = ctx.grad_output(0);
  Tensor v = Op::kSource == Source::Input ? ctx.input(0) : ctx.output(0);
  if (v.shape() != g.shape())
    fail_internal("{} (backward): saved value of shape {} for a gradient of shape {}", ctx.node().label(),
                  shape_str(v.shape()), shape_str(g.shape()));
  v = grad_util::convert(v, g.dtype());
  const Op op(ctx.node());
  Tensor dx(g.dtype(), g.shape());
  visit_float(g.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = g.data<T>();
    const T* pv = v.data<T>();
    T* pd = dx.data<T>();
    const rt::cpu::UnaryIsa isa = is_f32<T> ? rt::cpu::unary_isa() : rt::cpu::UnaryIsa::Baseline;
    ctx.pool().parallel_for(g.numel(), kGrain, [&](int64_t lo, int64_t hi) {
#if defined(__x86_64__) && defined(__GNUC__)
      if constexpr (is_f32<T>) {
        if (isa == rt::cpu::UnaryIsa::Avx512) return grad_range_avx512(op, pg, pv, pd, lo, hi);
        if (isa == rt::cpu::UnaryIsa::Avx2) return grad_range_avx2(op, pg, pv, pd, lo, hi);
      }
#endif
      grad_range(op, pg, pv, pd, lo, hi);
    });
  });
  ctx.set_grad(0, std::move(dx));
}

void gelu_grad(GradContext& ctx) {
  const std::string a = ctx.node().attr_string("approximate", "none");
  if (a == "none") elementwise_grad<GeluErfGrad>(ctx);
  else if (a == "tanh") elementwise_grad<GeluTanhGrad>(ctx);
  else ctx.fail("Gelu approximate must be 'none' or 'tanh', got '{}'", a);
}

void neg_grad(GradContext& ctx) {
  if (ctx.needs_grad(0)) ctx.set_grad(0, grad_util::negate(ctx.pool(), ctx.grad_output(0)));
}

// Identity and float-to-float Cast: the engine rounds the gradient to the input's type.
void pass_through_grad(GradContext& ctx) {
  if (ctx.needs_grad(0)) ctx.set_grad(0, ctx.grad_output(0));
}

// Dropout runs as the identity unless a training_mode input (opset 12+) is true and the ratio is
// not 0 (see the forward kernel). Its mask output never carries a gradient.
void dropout_grad(GradContext& ctx) {
  if (ctx.opset() >= 12 && ctx.has_input(2)) {
    const Tensor& mode = ctx.input(2);
    const bool training = mode.numel() == 1 && mode.get_double(0) != 0.0;
    double ratio = ctx.node().attr_float("ratio", 0.5f);
    if (ctx.has_input(1)) ratio = ctx.input(1).get_double(0);
    if (training && ratio != 0.0)
      ctx.fail_unsupported("training-mode Dropout (random mask) has no backward; export the model with "
                           "training_mode false");
  }
  pass_through_grad(ctx);
}

// Clip: the gradient passes where lo <= x <= hi. Bounds are attributes before opset 11 and
// optional scalar inputs from 11; they get no gradient.
void clip_grad(GradContext& ctx) {
  if (!ctx.needs_grad(0)) return;
  const Tensor& g = ctx.grad_output(0);
  const Tensor x = grad_util::convert(ctx.input(0), g.dtype());
  Tensor dx(g.dtype(), g.shape());
  visit_float(g.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T lo = -std::numeric_limits<T>::infinity(), hi = std::numeric_limits<T>::infinity();
    if (ctx.opset() < 11) {
      if (ctx.node().has_attr("min")) lo = static_cast<T>(ctx.node().attr_float("min", 0.0f));
      if (ctx.node().has_attr("max")) hi = static_cast<T>(ctx.node().attr_float("max", 0.0f));
    } else {
      for (size_t i = 1; i <= 2; ++i) {
        if (!ctx.has_input(i)) continue;
        const Tensor& b = ctx.input(i);
        if (b.numel() != 1) ctx.fail("{} must be a scalar, got shape {}", i == 1 ? "min" : "max", shape_str(b.shape()));
        (i == 1 ? lo : hi) = static_cast<T>(b.get_double(0));
      }
    }
    const T* pg = g.data<T>();
    const T* px = x.data<T>();
    T* pd = dx.data<T>();
    ctx.pool().parallel_for(g.numel(), kGrain, [&](int64_t b, int64_t e) {
      const T l = lo, h = hi;
      for (int64_t i = b; i < e; ++i) pd[i] = sel((px[i] >= l) & (px[i] <= h), pg[i], T(0));
    });
  });
  ctx.set_grad(0, std::move(dx));
}

// PRelu: y = x < 0 ? s x : x with the slope broadcast to X (a 1-D channel slope before opset 7,
// as the forward kernel reads it). dX = g (x < 0 ? s : 1), dS = sum over the broadcast of g min(x, 0).
void prelu_grad(GradContext& ctx) {
  const Tensor& g = ctx.grad_output(0);
  const Tensor x = grad_util::convert(ctx.input(0), g.dtype());
  Tensor slope = grad_util::convert(ctx.input(1), g.dtype());
  if (ctx.opset() < 7 && slope.rank() == 1 && x.rank() >= 3 && slope.numel() == x.dim(1) && slope.numel() > 1) {
    Shape s(static_cast<size_t>(x.rank() - 1), 1);
    s[0] = slope.numel();
    slope = slope.reshaped(s);
  }
  if (slope.rank() > x.rank()) ctx.fail("slope of shape {} does not broadcast to X of shape {}", shape_str(slope.shape()), shape_str(x.shape()));
  for (int d = 0; d < slope.rank(); ++d) {
    const int64_t sd = slope.dim(d), xd = x.dim(x.rank() - slope.rank() + d);
    if (sd != 1 && sd != xd)
      ctx.fail("slope of shape {} does not broadcast to X of shape {}", shape_str(slope.shape()), shape_str(x.shape()));
  }
  visit_float(g.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = g.data<T>();
    const T* px = x.data<T>();
    if (ctx.needs_grad(0)) {
      Tensor dx(g.dtype(), g.shape());
      T* pd = dx.data<T>();
      const T* ps = slope.data<T>();
      const rt::cpu::BroadcastIter it(x.shape(), {&slope.shape()});
      const int64_t inner = it.inner(), ss = it.inner_stride(0);
      ctx.pool().parallel_for(it.outer_count(), std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)),
                              [&](int64_t lo, int64_t hi) {
                                int64_t off[rt::cpu::BroadcastIter::kMaxInputs];
                                for (int64_t o = lo; o < hi; ++o) {
                                  it.offsets(o, off);
                                  const T* s = ps + off[0];
                                  const int64_t base = o * inner;
                                  for (int64_t i = 0; i < inner; ++i) {
                                    const T xi = px[base + i];
                                    pd[base + i] = sel(xi < T(0), s[i * ss] * pg[base + i], pg[base + i]);
                                  }
                                }
                              });
      ctx.set_grad(0, std::move(dx));
    }
    if (ctx.needs_grad(1)) {
      Tensor t(g.dtype(), g.shape());
      T* pt = t.data<T>();
      ctx.pool().parallel_for(g.numel(), kGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) pt[i] = sel(px[i] < T(0), px[i] * pg[i], T(0));
      });
      ctx.set_grad(1, grad_util::reduce_to_shape(ctx.pool(), t, slope.shape()).reshaped(ctx.input_shape(1)));
    }
  });
}

}  // namespace

void register_unary_grads(GradRegistry& r) {
  auto add = [&](const char* op, GradFn fn, uint32_t diff, uint32_t saved_in, uint32_t saved_out,
                 const char* domain = "") {
    GradDef d;
    d.domain = domain;
    d.op_type = op;
    d.fn = fn;
    d.differentiable = diff;
    d.saved_inputs = saved_in;
    d.saved_outputs = saved_out;
    r.add(std::move(d));
  };
  auto unary = [&](const char* op, GradFn fn, Source source) {
    add(op, fn, bit(0), source == Source::Input ? bit(0) : 0, source == Source::Output ? bit(0) : 0);
  };
  unary("Relu", elementwise_grad<ReluGrad>, ReluGrad::kSource);
  unary("LeakyRelu", elementwise_grad<LeakyReluGrad>, LeakyReluGrad::kSource);
  unary("Elu", elementwise_grad<EluGrad>, EluGrad::kSource);
  unary("Sigmoid", elementwise_grad<SigmoidGrad>, SigmoidGrad::kSource);
  unary("Tanh", elementwise_grad<TanhGrad>, TanhGrad::kSource);
  unary("HardSigmoid", elementwise_grad<HardSigmoidGrad>, HardSigmoidGrad::kSource);
  unary("HardSwish", elementwise_grad<HardSwishGrad>, HardSwishGrad::kSource);
  unary("Erf", elementwise_grad<ErfGrad>, ErfGrad::kSource);
  unary("Gelu", gelu_grad, Source::Input);
  // mpq::Gelu (passes/fuse_gelu.h; the training engine fuses exporters' five-node GELU into it).
  add("Gelu", gelu_grad, bit(0), bit(0), 0, "mpq");
  unary("Softplus", elementwise_grad<SoftplusGrad>, SoftplusGrad::kSource);
  unary("Sqrt", elementwise_grad<SqrtGrad>, SqrtGrad::kSource);
  unary("Exp", elementwise_grad<ExpGrad>, ExpGrad::kSource);
  unary("Log", elementwise_grad<LogGrad>, LogGrad::kSource);
  unary("Abs", elementwise_grad<AbsGrad>, AbsGrad::kSource);
  unary("Reciprocal", elementwise_grad<ReciprocalGrad>, ReciprocalGrad::kSource);
  add("Neg", neg_grad, bit(0), 0, 0);
  add("Identity", pass_through_grad, bit(0), 0, 0);
  add("Cast", pass_through_grad, bit(0), 0, 0);
  add("Dropout", dropout_grad, bit(0), bit(1) | bit(2), 0);
  add("Clip", clip_grad, bit(0), bit(0) | bit(1) | bit(2), 0);
  add("PRelu", prelu_grad, bit(0) | bit(1), bit(0) | bit(1), 0);
}

}  // namespace mpq::train::grads
