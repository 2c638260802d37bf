// Elementwise binary and variadic ops with numpy broadcasting: arithmetic, comparison, logic.
#include <cmath>
#include <type_traits>

#include "runtime/cpu/common.h"
#include "runtime/cpu/register_all.h"

namespace mpq::rt::cpu {

namespace {

enum class Arith { Add, Sub, Mul, Div, Pow, Mod, FMod, Min, Max, BitShiftLeft, BitShiftRight };

template <typename T>
T int_pow(T base, T exp) {
  if constexpr (std::is_integral_v<T>) {
    if (exp < 0) return base == 1 ? 1 : 0;
    T r = 1;
    while (exp > 0) {
      if (exp & 1) r = static_cast<T>(r * base);
      base = static_cast<T>(base * base);
      exp >>= 1;
    }
    return r;
  } else {
    return static_cast<T>(std::pow(base, exp));
  }
}

template <typename T>
T python_mod(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) return 0;
    T r = static_cast<T>(a % b);
    if constexpr (std::is_signed_v<T>)
      if (r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
    return r;
  } else {
    T r = std::fmod(a, b);
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
  }
}

template <typename T>
void arith_typed(KernelContext& ctx, Arith op, const Tensor& a, const Tensor& b, Tensor& out) {
  ThreadPool& pool = ctx.pool();
  switch (op) {
    case Arith::Add: broadcast_binary<T, T, T>(pool, a, b, out, [](T x, T y) { return static_cast<T>(x + y); }); break;
    case Arith::Sub: broadcast_binary<T, T, T>(pool, a, b, out, [](T x, T y) { return static_cast<T>(x - y); }); break;
    case Arith::Mul: broadcast_binary<T, T, T>(pool, a, b, out, [](T x, T y) { return static_cast<T>(x * y); }); break;
    case Arith::Div:
      if constexpr (std::is_integral_v<T>) {
        bool div_zero = false;
        broadcast_binary<T, T, T>(pool, a, b, out, [&](T x, T y) {
          if (y == 0) {
            div_zero = true;
            return T(0);
          }
          return static_cast<T>(x / y);
        });
        if (div_zero) ctx.fail("integer division by zero");
      } else {
        broadcast_binary<T, T, T>(pool, a, b, out, [](T x, T y) { return static_cast<T>(x / y); });
      }
      break;
    case Arith::Pow: broadcast_binary<T, T, T>(pool, a, b, out, [](T x, T y) { return int_pow<T>(x, y); }); break;
    case Arith::Mod: broadcast_binary<T, T, T>(pool, a, b, out, [](T x, T y) { return python_mod<T>(x, y); }); break;
    case Arith::FMod:
      broadcast_binary<T, T, T>(pool, a, b, out, [](T x, T y) {
        if constexpr (std::is_integral_v<T>) {
          return y == 0 ? T(0) : static_cast<T>(x % y);
        } else {
          return static_cast<T>(std::fmod(x, y));
        }
      });
      break;
    case Arith::Min:
      broadcast_binary<T, T, T>(pool, a, b, out, [](T x, T y) {
        if constexpr (std::is_floating_point_v<T>)
          if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<T>::quiet_NaN();
        return y < x ? y : x;
      });
      break;
    case Arith::Max:
      broadcast_binary<T, T, T>(pool, a, b, out, [](T x, T y) {
        if constexpr (std::is_floating_point_v<T>)
          if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<T>::quiet_NaN();
        return x < y ? y : x;
      });
      break;
    case Arith::BitShiftLeft:
      if constexpr (std::is_unsigned_v<T>) {
        broadcast_binary<T, T, T>(pool, a, b, out, [](T x, T y) { return y >= sizeof(T) * 8 ? T(0) : static_cast<T>(x << y); });
      } else {
        ctx.fail("BitShift needs an unsigned integer type");
      }
      break;
    case Arith::BitShiftRight:
      if constexpr (std::is_unsigned_v<T>) {
        broadcast_binary<T, T, T>(pool, a, b, out, [](T x, T y) { return y >= sizeof(T) * 8 ? T(0) : static_cast<T>(x >> y); });
      } else {
        ctx.fail("BitShift needs an unsigned integer type");
      }
      break;
  }
}

Tensor arith(KernelContext& ctx, Arith op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    ctx.fail("inputs have different element types ({} and {})", dtype_name(a.dtype()), dtype_name(b.dtype()));
  Shape shape = broadcast_shapes(ctx, {&a.shape(), &b.shape()});
  Tensor out(a.dtype(), shape);
  visit_arith(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    arith_typed<T>(ctx, op, a, b, out);
  });
  return out;
}

// Opsets before 7 broadcast only with broadcast=1, aligning B with A from `axis` (default: suffix).
Tensor legacy_broadcast_b(const KernelContext& ctx, const Tensor& a, const Tensor& b) {
  if (ctx.opset() >= 7 || !ctx.node().attr_int("broadcast", 0) || !ctx.node().has_attr("axis")) return b;
  int axis = normalize_axis(ctx, ctx.node().attr_int("axis", 0), a.rank());
  Shape shape = b.shape();
  while (static_cast<int>(shape.size()) + axis < a.rank()) shape.push_back(1);
  return b.reshaped(shape);
}

template <Arith op>
void arith_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  ctx.set_output(0, arith(ctx, op, a, legacy_broadcast_b(ctx, a, ctx.input(1))));
}

// x^2 and x^3 with a scalar exponent (LayerNorm's variance and tanh-GELU as exported by PyTorch):
// products instead of powf, as ONNX Runtime does. x*x is exactly powf(x, 2), both correctly rounded.
bool pow_small_integer_exponent(KernelContext& ctx, const Tensor& a, const Tensor& b) {
  if (a.dtype() != DType::Float32 || b.numel() != 1 || !dtype_is_float(b.dtype()) || b.rank() > a.rank()) return false;
  const double e = b.get_double(0);
  if (e != 2.0 && e != 3.0) return false;
  Tensor& y = ctx.alloc_output(0, DType::Float32, a.shape());
  const float* x = a.data<float>();
  float* out = y.data<float>();
  const bool cube = e == 3.0;
  ctx.pool().parallel_for(a.numel(), 16384, [&](int64_t lo, int64_t hi) {
    if (cube)
      for (int64_t i = lo; i < hi; ++i) out[i] = x[i] * x[i] * x[i];
    else
      for (int64_t i = lo; i < hi; ++i) out[i] = x[i] * x[i];
  });
  return true;
}

void pow_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (pow_small_integer_exponent(ctx, a, b)) return;
  if (a.dtype() == b.dtype()) {
    ctx.set_output(0, arith(ctx, Arith::Pow, a, b));
    return;
  }
  // Pow allows a different exponent type (opset 12+): compute in double, store in the base type.
  Shape shape = broadcast_shapes(ctx, {&a.shape(), &b.shape()});
  Tensor bd = b.cast_to(DType::Float64);
  Tensor ad = a.cast_to(DType::Float64);
  Tensor tmp(DType::Float64, shape);
  broadcast_binary<double, double, double>(ctx.pool(), ad, bd, tmp, [](double x, double y) { return std::pow(x, y); });
  ctx.set_output(0, tmp.cast_to(a.dtype()));
}

void mod_kernel(KernelContext& ctx) {
  Arith op = ctx.node().attr_int("fmod", 0) ? Arith::FMod : Arith::Mod;
  if (op == Arith::Mod && dtype_is_float(ctx.input(0).dtype())) ctx.fail("Mod with fmod=0 needs integer inputs");
  ctx.set_output(0, arith(ctx, op, ctx.input(0), ctx.input(1)));
}

void bitshift_kernel(KernelContext& ctx) {
  std::string dir = ctx.node().attr_string("direction");
  if (dir != "LEFT" && dir != "RIGHT") ctx.fail("BitShift direction must be LEFT or RIGHT, got '{}'", dir);
  ctx.set_output(0, arith(ctx, dir == "LEFT" ? Arith::BitShiftLeft : Arith::BitShiftRight, ctx.input(0), ctx.input(1)));
}

// Min, Max, Sum, Mean: fold the inputs pairwise with broadcasting.
template <Arith op, bool mean = false>
void variadic_kernel(KernelContext& ctx) {
  if (ctx.num_inputs() == 0) ctx.fail("needs at least one input");
  Tensor acc = ctx.input(0);
  for (size_t i = 1; i < ctx.num_inputs(); ++i) acc = arith(ctx, op, acc, ctx.input(i));
  if (ctx.num_inputs() == 1) acc = acc.clone();
  if constexpr (mean) {
    if (!dtype_is_float(acc.dtype())) ctx.fail("Mean needs floating-point inputs");
    Tensor n = Tensor(acc.dtype(), {});
    visit_arith(acc.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      n.data<T>()[0] = static_cast<T>(ctx.num_inputs());
    });
    acc = arith(ctx, Arith::Div, acc, n);
  }
  ctx.set_output(0, std::move(acc));
}

enum class Cmp { Equal, Less, Greater, LessOrEqual, GreaterOrEqual };

template <Cmp op>
void compare_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != b.dtype())
    ctx.fail("inputs have different element types ({} and {})", dtype_name(a.dtype()), dtype_name(b.dtype()));
  Shape shape = broadcast_shapes(ctx, {&a.shape(), &b.shape()});
  Tensor& out = ctx.alloc_output(0, DType::Bool, shape);
  if (a.dtype() == DType::String) {
    if (op != Cmp::Equal) ctx.fail("only Equal compares strings");
    // Strings: broadcast through index arithmetic on a BroadcastIter (rare, small).
    BroadcastIter it(shape, {&a.shape(), &b.shape()});
    bool* po = out.data<bool>();
    int64_t off[BroadcastIter::kMaxInputs];
    for (int64_t o = 0; o < it.outer_count(); ++o) {
      it.offsets(o, off);
      for (int64_t i = 0; i < it.inner(); ++i)
        po[o * it.inner() + i] = a.strings()[static_cast<size_t>(off[0] + i * it.inner_stride(0))] ==
                                 b.strings()[static_cast<size_t>(off[1] + i * it.inner_stride(1))];
    }
    return;
  }
  visit_arith_bool(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    broadcast_binary<T, T, bool>(ctx.pool(), a, b, out, [](T x, T y) {
      if constexpr (op == Cmp::Equal) return x == y;
      if constexpr (op == Cmp::Less) return x < y;
      if constexpr (op == Cmp::Greater) return x > y;
      if constexpr (op == Cmp::LessOrEqual) return x <= y;
      if constexpr (op == Cmp::GreaterOrEqual) return x >= y;
    });
  });
}

enum class Logic { And, Or, Xor };

template <Logic op>
void logic_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != DType::Bool || b.dtype() != DType::Bool) ctx.fail("logical ops need bool inputs");
  Shape shape = broadcast_shapes(ctx, {&a.shape(), &b.shape()});
  Tensor& out = ctx.alloc_output(0, DType::Bool, shape);
  broadcast_binary<bool, bool, bool>(ctx.pool(), a, b, out, [](bool x, bool y) {
    if constexpr (op == Logic::And) return x && y;
    if constexpr (op == Logic::Or) return x || y;
    if constexpr (op == Logic::Xor) return x != y;
  });
}

enum class Bitwise { And, Or, Xor };

template <Bitwise op>
void bitwise_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != b.dtype() || !dtype_is_integer(a.dtype())) ctx.fail("bitwise ops need matching integer inputs");
  Shape shape = broadcast_shapes(ctx, {&a.shape(), &b.shape()});
  Tensor& out = ctx.alloc_output(0, a.dtype(), shape);
  visit_arith(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T>) {
      broadcast_binary<T, T, T>(ctx.pool(), a, b, out, [](T x, T y) {
        if constexpr (op == Bitwise::And) return static_cast<T>(x & y);
        if constexpr (op == Bitwise::Or) return static_cast<T>(x | y);
        if constexpr (op == Bitwise::Xor) return static_cast<T>(x ^ y);
      });
    }
  });
}

void where_kernel(KernelContext& ctx) {
  const Tensor& cond = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& y = ctx.input(2);
  if (cond.dtype() != DType::Bool) ctx.fail("condition must be bool, got {}", dtype_name(cond.dtype()));
  if (x.dtype() != y.dtype()) ctx.fail("X and Y have different types ({} and {})", dtype_name(x.dtype()), dtype_name(y.dtype()));
  Shape shape = broadcast_shapes(ctx, {&cond.shape(), &x.shape(), &y.shape()});
  BroadcastIter it(shape, {&cond.shape(), &x.shape(), &y.shape()});
  if (x.dtype() == DType::String) {
    std::vector<std::string> vals(static_cast<size_t>(shape_numel(shape)));
    int64_t off[BroadcastIter::kMaxInputs];
    for (int64_t o = 0; o < it.outer_count(); ++o) {
      it.offsets(o, off);
      for (int64_t i = 0; i < it.inner(); ++i) {
        bool c = cond.data<bool>()[off[0] + i * it.inner_stride(0)];
        vals[static_cast<size_t>(o * it.inner() + i)] =
            c ? x.strings()[static_cast<size_t>(off[1] + i * it.inner_stride(1))]
              : y.strings()[static_cast<size_t>(off[2] + i * it.inner_stride(2))];
      }
    }
    ctx.set_output(0, Tensor::from_strings(shape, std::move(vals)));
    return;
  }
  Tensor& out = ctx.alloc_output(0, x.dtype(), shape);
  visit_by_width(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool* pc = cond.data<bool>();
    const T* px = static_cast<const T*>(x.raw_data());
    const T* py = static_cast<const T*>(y.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    const int64_t inner = it.inner();
    const int64_t sc = it.inner_stride(0), sx = it.inner_stride(1), sy = it.inner_stride(2);
    ctx.pool().parallel_for(it.outer_count(), std::max<int64_t>(1, 8192 / std::max<int64_t>(inner, 1)),
                            [&](int64_t lo, int64_t hi) {
                              int64_t off[BroadcastIter::kMaxInputs];
                              for (int64_t o = lo; o < hi; ++o) {
                                it.offsets(o, off);
                                for (int64_t i = 0; i < inner; ++i)
                                  po[o * inner + i] = pc[off[0] + i * sc] ? px[off[1] + i * sx] : py[off[2] + i * sy];
                              }
                            });
  });
}

}  // namespace

void register_binary(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  r.add_fn("", "Add", 1, kMaxOpset, cpu, arith_kernel<Arith::Add>);
  r.add_fn("", "Sub", 1, kMaxOpset, cpu, arith_kernel<Arith::Sub>);
  r.add_fn("", "Mul", 1, kMaxOpset, cpu, arith_kernel<Arith::Mul>);
  r.add_fn("", "Div", 1, kMaxOpset, cpu, arith_kernel<Arith::Div>);
  r.add_fn("", "Pow", 1, kMaxOpset, cpu, pow_kernel);
  r.add_fn("", "Mod", 1, kMaxOpset, cpu, mod_kernel);
  r.add_fn("", "BitShift", 1, kMaxOpset, cpu, bitshift_kernel);
  r.add_fn("", "Min", 1, kMaxOpset, cpu, variadic_kernel<Arith::Min>);
  r.add_fn("", "Max", 1, kMaxOpset, cpu, variadic_kernel<Arith::Max>);
  r.add_fn("", "Sum", 1, kMaxOpset, cpu, variadic_kernel<Arith::Add>);
  r.add_fn("", "Mean", 1, kMaxOpset, cpu, variadic_kernel<Arith::Add, true>);
  r.add_fn("", "Equal", 1, kMaxOpset, cpu, compare_kernel<Cmp::Equal>);
  r.add_fn("", "Less", 1, kMaxOpset, cpu, compare_kernel<Cmp::Less>);
  r.add_fn("", "Greater", 1, kMaxOpset, cpu, compare_kernel<Cmp::Greater>);
  r.add_fn("", "LessOrEqual", 1, kMaxOpset, cpu, compare_kernel<Cmp::LessOrEqual>);
  r.add_fn("", "GreaterOrEqual", 1, kMaxOpset, cpu, compare_kernel<Cmp::GreaterOrEqual>);
  r.add_fn("", "And", 1, kMaxOpset, cpu, logic_kernel<Logic::And>);
  r.add_fn("", "Or", 1, kMaxOpset, cpu, logic_kernel<Logic::Or>);
  r.add_fn("", "Xor", 1, kMaxOpset, cpu, logic_kernel<Logic::Xor>);
  r.add_fn("", "BitwiseAnd", 1, kMaxOpset, cpu, bitwise_kernel<Bitwise::And>);
  r.add_fn("", "BitwiseOr", 1, kMaxOpset, cpu, bitwise_kernel<Bitwise::Or>);
  r.add_fn("", "BitwiseXor", 1, kMaxOpset, cpu, bitwise_kernel<Bitwise::Xor>);
  // Where selects bytes: serve every type natively, float16 included.
  r.add_fn("", "Where", 1, kMaxOpset, cpu, where_kernel, /*native_low_precision=*/true);
}

}  // namespace mpq::rt::cpu
