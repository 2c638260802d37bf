// Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, ArgMax/ArgMin, CumSum.
//
// Reduce* take their axes as an attribute (ReduceSum before opset 13, the others before 18) or as
// an optional second input (from then on); either form is accepted at any opset. An empty axes
// list reduces every axis, or nothing with noop_with_empty_axes=1. Reducing an empty set gives
// the op's identity (0 for sums, 1 for Prod, -inf / the lowest value for Max, -inf for the log
// reductions, NaN for Mean).
#include <cmath>
#include <limits>
#include <type_traits>

#include "runtime/cpu/common.h"
#include "runtime/cpu/math_reduce.h"
#include "runtime/cpu/math_util.h"
#include "runtime/cpu/register_all.h"

namespace mpq::rt::cpu {

namespace {

// Sums of float accumulate in double: a float accumulator loses ~1e-3 of a long sum that
// cancels (the engine's 8 lanes still vectorise the conversion). Other types use their own.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, float>, double, T>;

template <typename T>
T lowest_value() {
  if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::lowest();
}
template <typename T>
T highest_value() {
  if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::max();
}

template <typename T>
T abs_value(T x) {
  if constexpr (std::is_floating_point_v<T>) return std::fabs(x);
  else if constexpr (std::is_signed_v<T>) return static_cast<T>(x < 0 ? -x : x);
  else return x;
}

template <typename T>
__attribute__((always_inline)) inline T exp_value(T x) {
  if constexpr (std::is_same_v<T, float>) return math::fast_exp(x);
  else if constexpr (std::is_floating_point_v<T>) return std::exp(x);
  else return static_cast<T>(std::exp(static_cast<double>(x)));
}

template <typename T>
T log_value(T x) {
  if constexpr (std::is_floating_point_v<T>) return std::log(x);
  else return static_cast<T>(std::log(static_cast<double>(x)));
}

template <typename T>
struct SumOp {
  using Acc = acc_t<T>;
  static Acc init() { return Acc(0); }
  static Acc map(T x, Acc) { return x; }
  static Acc comb(Acc a, Acc b) { return static_cast<Acc>(a + b); }
  static T fin(Acc a, int64_t, Acc) { return static_cast<T>(a); }
};

template <typename T>
struct MeanOp : SumOp<T> {
  using Acc = acc_t<T>;
  static T fin(Acc a, int64_t n, Acc) {
    if constexpr (std::is_floating_point_v<T>) return static_cast<T>(a / static_cast<Acc>(n));  // 0 / 0: NaN
    else return n == 0 ? T(0) : static_cast<T>(a / static_cast<Acc>(n));
  }
};

template <typename T>
struct SumSquareOp : SumOp<T> {
  using Acc = acc_t<T>;
  static Acc map(T x, Acc) { return static_cast<Acc>(static_cast<Acc>(x) * static_cast<Acc>(x)); }
};

template <typename T>
struct L1Op : SumOp<T> {
  using Acc = acc_t<T>;
  static Acc map(T x, Acc) { return static_cast<Acc>(abs_value(x)); }
};

template <typename T>
struct L2Op : SumSquareOp<T> {
  using Acc = acc_t<T>;
  static T fin(Acc a, int64_t, Acc) {
    return static_cast<T>(std::sqrt(static_cast<double>(a)));
  }
};

template <typename T>
struct LogSumOp : SumOp<T> {
  using Acc = acc_t<T>;
  static T fin(Acc a, int64_t, Acc) { return static_cast<T>(log_value(a)); }
};

// Second pass of LogSumExp: shift is the finite maximum of the output's inputs (0 otherwise).
template <typename T>
struct LogSumExpOp : SumOp<T> {
  using Acc = acc_t<T>;
  static Acc map(T x, Acc s) { return static_cast<Acc>(exp_value(static_cast<T>(x - static_cast<T>(s)))); }
  static T fin(Acc a, int64_t, Acc s) { return static_cast<T>(log_value(a) + s); }
};

template <typename T>
struct MaxOp {
  using Acc = T;
  static Acc init() { return lowest_value<T>(); }
  static Acc map(T x, Acc) { return x; }
  // NaN is sticky: once in the accumulator it stays, and a NaN input replaces it.
  static Acc comb(Acc a, Acc b) {
    if constexpr (std::is_floating_point_v<T>) return math::sel((b > a) | (b != b), b, a);
    else return b > a ? b : a;
  }
  static T fin(Acc a, int64_t, Acc) { return a; }
  // Contiguous rows of float take the explicitly vectorised path.
  static Acc row(const T* p, int64_t n, Acc)
    requires std::is_same_v<T, float>
  {
    return math::row_max(p, n);
  }
};

template <typename T>
struct MinOp : MaxOp<T> {
  using Acc = T;
  static Acc init() { return highest_value<T>(); }
  static Acc comb(Acc a, Acc b) {
    if constexpr (std::is_floating_point_v<T>) return math::sel((b < a) | (b != b), b, a);
    else return b < a ? b : a;
  }
  static Acc row(const T* p, int64_t n, Acc)
    requires std::is_same_v<T, float>
  {
    return math::row_min(p, n);
  }
};

template <typename T>
struct ProdOp : SumOp<T> {
  using Acc = acc_t<T>;
  static Acc init() { return Acc(1); }
  static Acc comb(Acc a, Acc b) { return static_cast<Acc>(a * b); }
};

enum class RKind { Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare };

// Axes from the second input (when present) or the attribute; empty when neither gives any.
std::vector<int64_t> read_axes(const KernelContext& ctx) {
  if (ctx.has_input(1)) return input_ints(ctx, 1);
  return ctx.node().attr_ints("axes", {});
}

template <RKind K, typename T>
void reduce_typed(KernelContext& ctx, const math::ReducePlan& plan, const Tensor& x, Tensor& out) {
  ThreadPool& pool = ctx.pool();
  const T* px = x.data<T>();
  T* po = out.data<T>();
  if constexpr (K == RKind::Sum) math::run_reduce<T, T, SumOp<T>>(pool, plan, px, po, nullptr);
  if constexpr (K == RKind::Mean) math::run_reduce<T, T, MeanOp<T>>(pool, plan, px, po, nullptr);
  if constexpr (K == RKind::Max) math::run_reduce<T, T, MaxOp<T>>(pool, plan, px, po, nullptr);
  if constexpr (K == RKind::Min) math::run_reduce<T, T, MinOp<T>>(pool, plan, px, po, nullptr);
  if constexpr (K == RKind::Prod) math::run_reduce<T, T, ProdOp<T>>(pool, plan, px, po, nullptr);
  if constexpr (K == RKind::L1) math::run_reduce<T, T, L1Op<T>>(pool, plan, px, po, nullptr);
  if constexpr (K == RKind::L2) math::run_reduce<T, T, L2Op<T>>(pool, plan, px, po, nullptr);
  if constexpr (K == RKind::LogSum) math::run_reduce<T, T, LogSumOp<T>>(pool, plan, px, po, nullptr);
  if constexpr (K == RKind::SumSquare) math::run_reduce<T, T, SumSquareOp<T>>(pool, plan, px, po, nullptr);
  if constexpr (K == RKind::LogSumExp) {
    std::vector<T> maxima(static_cast<size_t>(plan.outputs));
    math::run_reduce<T, T, MaxOp<T>>(pool, plan, px, maxima.data(), nullptr);
    std::vector<acc_t<T>> shift(maxima.size());
    for (size_t i = 0; i < maxima.size(); ++i) {
      T s = maxima[i];
      if constexpr (std::is_floating_point_v<T>) {
        if (!std::isfinite(s)) s = T(0);
      } else {
        if (s == lowest_value<T>()) s = T(0);
      }
      shift[i] = s;
    }
    math::run_reduce<T, T, LogSumExpOp<T>>(pool, plan, px, po, shift.data());
  }
}

template <RKind K>
void reduce_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  constexpr bool kBoolOk = K == RKind::Max || K == RKind::Min;  // bool from opset 20: any / all
  if (!dtype_is_float(x.dtype()) && !dtype_is_integer(x.dtype()) && !(kBoolOk && x.dtype() == DType::Bool))
    ctx.fail("needs a numeric input, got {}", dtype_name(x.dtype()));
  const int rank = x.rank();
  const bool keepdims = ctx.node().attr_int("keepdims", 1) != 0;
  const bool noop = ctx.node().attr_int("noop_with_empty_axes", 0) != 0;
  std::vector<int64_t> axes = read_axes(ctx);
  std::vector<bool> reduce(static_cast<size_t>(rank), axes.empty() && !noop);
  for (int64_t a : axes) {
    const int ax = normalize_axis(ctx, a, rank);
    if (reduce[static_cast<size_t>(ax)]) ctx.fail("axis {} is listed twice", a);
    reduce[static_cast<size_t>(ax)] = true;
  }
  Shape out_shape;
  for (int i = 0; i < rank; ++i) {
    if (!reduce[static_cast<size_t>(i)]) out_shape.push_back(x.shape()[static_cast<size_t>(i)]);
    else if (keepdims) out_shape.push_back(1);
  }
  // With noop and no axes nothing is reduced: every element is its own one-element set, so the
  // op's map and finalisation still apply (ReduceSumSquare squares, ReduceLogSum takes the log).
  const math::ReducePlan plan = math::plan_reduce(x.shape(), reduce);
  Tensor& out = ctx.alloc_output(0, x.dtype(), out_shape);
  if constexpr (kBoolOk) {
    if (x.dtype() == DType::Bool) {
      reduce_typed<K, bool>(ctx, plan, x, out);
      return;
    }
  }
  visit_arith(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    reduce_typed<K, T>(ctx, plan, x, out);
  });
}

// ---- ArgMax / ArgMin

template <bool kMax, typename T>
inline bool better(T v, T best, bool last) {
  if constexpr (kMax) return last ? v >= best : v > best;
  else return last ? v <= best : v < best;
}

template <bool kMax>
void arg_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (!dtype_is_float(x.dtype()) && !dtype_is_integer(x.dtype()))
    ctx.fail("needs a numeric input, got {}", dtype_name(x.dtype()));
  const int rank = x.rank();
  const int axis = normalize_axis(ctx, ctx.node().attr_int("axis", 0), rank);
  const bool keepdims = ctx.node().attr_int("keepdims", 1) != 0;
  const bool last = ctx.node().attr_int("select_last_index", 0) != 0;
  if (rank > 0 && x.dim(axis) == 0) ctx.fail("cannot take the arg{} of an empty axis", kMax ? "max" : "min");
  Shape out_shape;
  for (int i = 0; i < rank; ++i) {
    if (i != axis) out_shape.push_back(x.shape()[static_cast<size_t>(i)]);
    else if (keepdims) out_shape.push_back(1);
  }
  const math::AxisLayout l = rank == 0 ? math::AxisLayout{} : math::axis_layout(x.shape(), axis);
  Tensor& out = ctx.alloc_output(0, DType::Int64, out_shape);
  int64_t* po = out.data<int64_t>();
  visit_arith(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data<T>();
    const int64_t n = l.n, inner = l.inner;
    if (inner == 1) {
      ctx.pool().parallel_for(l.outer, math::grain_for(n), [&](int64_t lo, int64_t hi) {
        for (int64_t o = lo; o < hi; ++o) {
          const T* row = px + o * n;
          if constexpr (std::is_same_v<T, float>) {
            // Vectorised extreme, then a scan for its first (or last) position. NaN wins, as in
            // numpy: the extreme is NaN and the scan finds the first NaN.
            const float m = kMax ? math::row_max(row, n) : math::row_min(row, n);
            const bool nan = m != m;
            int64_t bi = 0;
            if (last) {
              for (int64_t k = n - 1; k >= 0; --k)
                if (nan ? row[k] != row[k] : row[k] == m) {
                  bi = k;
                  break;
                }
            } else {
              for (int64_t k = 0; k < n; ++k)
                if (nan ? row[k] != row[k] : row[k] == m) {
                  bi = k;
                  break;
                }
            }
            po[o] = bi;
          } else {
            T best = row[0];
            int64_t bi = 0;
            for (int64_t k = 1; k < n; ++k)
              if (better<kMax>(row[k], best, last)) {
                best = row[k];
                bi = k;
              }
            po[o] = bi;
          }
        }
      });
      return;
    }
    constexpr int64_t kChunk = 256;
    const int64_t chunks = (inner + kChunk - 1) / kChunk;
    ctx.pool().parallel_for(l.outer * chunks, math::grain_for(n * std::min(inner, kChunk)), [&](int64_t lo, int64_t hi) {
      T best[kChunk];
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t o = t / chunks, j0 = (t % chunks) * kChunk;
        const int64_t w = std::min(kChunk, inner - j0);
        const T* base = px + o * n * inner + j0;
        int64_t* idx = po + o * inner + j0;
        for (int64_t j = 0; j < w; ++j) {
          best[j] = base[j];
          idx[j] = 0;
        }
        for (int64_t k = 1; k < n; ++k) {
          const T* xk = base + k * inner;
          for (int64_t j = 0; j < w; ++j) {
            const bool b = better<kMax>(xk[j], best[j], last);
            best[j] = b ? xk[j] : best[j];
            idx[j] = b ? k : idx[j];
          }
        }
      }
    });
  });
}

// ---- CumSum

void cumsum_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (!dtype_is_float(x.dtype()) && !dtype_is_integer(x.dtype()))
    ctx.fail("needs a numeric input, got {}", dtype_name(x.dtype()));
  const std::vector<int64_t> axis_v = input_ints(ctx, 1);
  if (axis_v.size() != 1) ctx.fail("axis must hold one value, got {}", axis_v.size());
  const int rank = x.rank();
  if (rank == 0) ctx.fail("input must have rank >= 1");
  const int axis = normalize_axis(ctx, axis_v[0], rank);
  const bool exclusive = ctx.node().attr_int("exclusive", 0) != 0;
  const bool reverse = ctx.node().attr_int("reverse", 0) != 0;
  const math::AxisLayout l = math::axis_layout(x.shape(), axis);
  Tensor& out = ctx.alloc_output(0, x.dtype(), x.shape());
  if (x.numel() == 0) return;
  visit_arith(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data<T>();
    T* py = out.data<T>();
    const int64_t n = l.n, inner = l.inner;
    if (inner == 1) {
      ctx.pool().parallel_for(l.outer, math::grain_for(n), [&](int64_t lo, int64_t hi) {
        for (int64_t o = lo; o < hi; ++o) {
          const T* xr = px + o * n;
          T* yr = py + o * n;
          T a = T(0);
          for (int64_t s = 0; s < n; ++s) {
            const int64_t k = reverse ? n - 1 - s : s;
            const T v = xr[k];
            if (exclusive) yr[k] = a;
            a = static_cast<T>(a + v);
            if (!exclusive) yr[k] = a;
          }
        }
      });
      return;
    }
    ctx.pool().parallel_for(l.outer, math::grain_for(n * inner), [&](int64_t lo, int64_t hi) {
      std::vector<T> acc(static_cast<size_t>(inner));
      for (int64_t o = lo; o < hi; ++o) {
        std::fill(acc.begin(), acc.end(), T(0));
        for (int64_t s = 0; s < n; ++s) {
          const int64_t k = reverse ? n - 1 - s : s;
          const T* xk = px + (o * n + k) * inner;
          T* yk = py + (o * n + k) * inner;
          T* a = acc.data();
          if (exclusive) {
            for (int64_t j = 0; j < inner; ++j) {
              yk[j] = a[j];
              a[j] = static_cast<T>(a[j] + xk[j]);
            }
          } else {
            for (int64_t j = 0; j < inner; ++j) {
              a[j] = static_cast<T>(a[j] + xk[j]);
              yk[j] = a[j];
            }
          }
        }
      }
    });
  });
}

}  // namespace

void register_reduce(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  const int M = kMaxOpset;
  r.add_fn("", "ReduceSum", 1, M, cpu, reduce_kernel<RKind::Sum>);
  r.add_fn("", "ReduceMean", 1, M, cpu, reduce_kernel<RKind::Mean>);
  r.add_fn("", "ReduceMax", 1, M, cpu, reduce_kernel<RKind::Max>);
  r.add_fn("", "ReduceMin", 1, M, cpu, reduce_kernel<RKind::Min>);
  r.add_fn("", "ReduceProd", 1, M, cpu, reduce_kernel<RKind::Prod>);
  r.add_fn("", "ReduceL1", 1, M, cpu, reduce_kernel<RKind::L1>);
  r.add_fn("", "ReduceL2", 1, M, cpu, reduce_kernel<RKind::L2>);
  r.add_fn("", "ReduceLogSum", 1, M, cpu, reduce_kernel<RKind::LogSum>);
  r.add_fn("", "ReduceLogSumExp", 1, M, cpu, reduce_kernel<RKind::LogSumExp>);
  r.add_fn("", "ReduceSumSquare", 1, M, cpu, reduce_kernel<RKind::SumSquare>);
  r.add_fn("", "ArgMax", 1, M, cpu, arg_kernel<true>);
  r.add_fn("", "ArgMin", 1, M, cpu, arg_kernel<false>);
  r.add_fn("", "CumSum", 11, M, cpu, cumsum_kernel);
}

}  // namespace mpq::rt::cpu
