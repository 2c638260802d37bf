// Softmax, LogSoftmax and Hardmax.
//
// Opset < 13 coerces the input to 2-D at `axis` (default 1) and normalises each row of the
// flattened trailing block; opset >= 13 normalises along the single axis (default -1). Both are
// an [outer, n, inner] view: inner == 1 is a contiguous row per outer index, inner > 1 is processed
// as columns, `kChunk` at a time, so every inner loop stays contiguous. Softmax subtracts the
// maximum before exponentiating.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <limits>

#include "runtime/cpu/common.h"
#include "runtime/cpu/math_util.h"
#include "runtime/cpu/register_all.h"
#include "runtime/cpu/unary.h"

namespace mpq::rt::cpu {

namespace {

enum class Kind { Softmax, LogSoftmax, Hardmax };

template <typename T>
__attribute__((always_inline)) inline T exp_t(T x) {
  if constexpr (std::is_same_v<T, float>) return math::fast_exp(x);
  else return std::exp(x);
}

template <typename T>
__attribute__((always_inline)) inline T log_t(T x) {
  if constexpr (std::is_same_v<T, float>) return math::fast_log(x);
  else return std::log(x);
}

template <typename T>
T row_max_t(const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return math::row_max(x, n);
  } else {
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t i = 0; i < n; ++i) m = math::sel(x[i] > m, x[i], m);
    return m;
  }
}

// One contiguous row of n elements.
template <Kind K, typename T>
void row(const T* x, T* y, int64_t n) {
  if constexpr (K == Kind::Hardmax) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
      if (x[i] > x[best]) best = i;
    for (int64_t i = 0; i < n; ++i) y[i] = T(0);
    if (n > 0) y[best] = T(1);
  } else {
    const T m = row_max_t(x, n);
    for (int64_t i = 0; i < n; ++i) y[i] = exp_t<T>(x[i] - m);
    const T s = math::row_sum_t(y, n);
    if constexpr (K == Kind::Softmax) {
      const T inv = T(1) / s;
      for (int64_t i = 0; i < n; ++i) y[i] *= inv;
    } else {
      const T ls = log_t<T>(s);
      for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - ls;
    }
  }
}

constexpr int64_t kChunk = 256;

// Softmax / LogSoftmax of float rows [lo, hi), a block of rows at a time: each row's maximum is
// subtracted, then one exp loop runs over the whole block, then each row is summed and scaled.
// Same values as row() (e^(x - max) of the same float difference), but the exp loop is long even
// when rows are short (attention over 16-64 tokens), instead of a vector loop and a scalar tail
// per row. Built for SSE2, AVX2 and AVX-512 as a whole (the row passes too, not only the exp: on
// attention's rows of 17 the passes around the exp took two thirds of the time); every step is
// the same float operation in the same order in the three builds, so they give the same bits.
template <Kind K>
__attribute__((always_inline)) inline void float_rows_body(const float* x, float* y, int64_t n, int64_t lo, int64_t hi) {
  constexpr int64_t kBlockElems = 4096;
  const int64_t rows_per_block = std::max<int64_t>(1, kBlockElems / std::max<int64_t>(n, 1));
  float maxima[kBlockElems];
  for (int64_t b0 = lo; b0 < hi; b0 += rows_per_block) {
    const int64_t b1 = std::min(hi, b0 + rows_per_block);
    for (int64_t o = b0; o < b1; ++o) {
      const float* xr = x + o * n;
      float* yr = y + o * n;
      const float m = math::row_max(xr, n);
      maxima[o - b0] = m;
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] - m;
    }
    float* yb = y + b0 * n;
    const int64_t count = (b1 - b0) * n;
    for (int64_t i = 0; i < count; ++i) yb[i] = math::fast_exp(yb[i]);
    for (int64_t o = b0; o < b1; ++o) {
      const float* xr = x + o * n;
      float* yr = y + o * n;
      const float sum = math::row_sum(yr, n);
      if constexpr (K == Kind::Softmax) {
        const float inv = 1.0f / sum;
        for (int64_t i = 0; i < n; ++i) yr[i] *= inv;
      } else {
        const float m = maxima[o - b0], ls = math::fast_log(sum);
        for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] - m) - ls;
      }
    }
  }
}

template <Kind K>
void float_rows_sse2(const float* x, float* y, int64_t n, int64_t lo, int64_t hi) {
  float_rows_body<K>(x, y, n, lo, hi);
}
#if defined(__x86_64__) && defined(__GNUC__)
template <Kind K>
__attribute__((target("avx2"))) void float_rows_avx2(const float* x, float* y, int64_t n, int64_t lo, int64_t hi) {
  float_rows_body<K>(x, y, n, lo, hi);
}
template <Kind K>
__attribute__((target("avx512f"))) void float_rows_avx512(const float* x, float* y, int64_t n, int64_t lo, int64_t hi) {
  float_rows_body<K>(x, y, n, lo, hi);
}
#endif

template <Kind K>
void float_rows(const float* x, float* y, int64_t n, int64_t lo, int64_t hi) {
#if defined(__x86_64__) && defined(__GNUC__)
  switch (unary_isa()) {
    case UnaryIsa::Avx512: return float_rows_avx512<K>(x, y, n, lo, hi);
    case UnaryIsa::Avx2: return float_rows_avx2<K>(x, y, n, lo, hi);
    default: break;
  }
#endif
  float_rows_sse2<K>(x, y, n, lo, hi);
}

// Columns [j0, j0 + w) of an [n, inner] block (w <= kChunk).
template <Kind K, typename T>
void columns(const T* x, T* y, int64_t n, int64_t inner, int64_t j0, int64_t w) {
  T a[kChunk];
  T b[kChunk];
  x += j0;
  y += j0;
  if constexpr (K == Kind::Hardmax) {
    int64_t idx[kChunk];
    for (int64_t j = 0; j < w; ++j) {
      a[j] = n > 0 ? x[j] : T(0);
      idx[j] = 0;
    }
    for (int64_t k = 1; k < n; ++k) {
      const T* xk = x + k * inner;
      for (int64_t j = 0; j < w; ++j) {
        const bool gt = xk[j] > a[j];
        a[j] = math::sel(gt, xk[j], a[j]);
        idx[j] = gt ? k : idx[j];
      }
    }
    for (int64_t k = 0; k < n; ++k) {
      T* yk = y + k * inner;
      for (int64_t j = 0; j < w; ++j) yk[j] = idx[j] == k ? T(1) : T(0);
    }
  } else {
    for (int64_t j = 0; j < w; ++j) {
      a[j] = -std::numeric_limits<T>::infinity();
      b[j] = T(0);
    }
    for (int64_t k = 0; k < n; ++k) {
      const T* xk = x + k * inner;
      for (int64_t j = 0; j < w; ++j) a[j] = math::sel(xk[j] > a[j], xk[j], a[j]);
    }
    for (int64_t k = 0; k < n; ++k) {
      const T* xk = x + k * inner;
      T* yk = y + k * inner;
      for (int64_t j = 0; j < w; ++j) {
        yk[j] = exp_t<T>(xk[j] - a[j]);
        b[j] += yk[j];
      }
    }
    if constexpr (K == Kind::Softmax) {
      for (int64_t j = 0; j < w; ++j) b[j] = T(1) / b[j];
      for (int64_t k = 0; k < n; ++k) {
        T* yk = y + k * inner;
        for (int64_t j = 0; j < w; ++j) yk[j] *= b[j];
      }
    } else {
      for (int64_t j = 0; j < w; ++j) b[j] = log_t<T>(b[j]);
      for (int64_t k = 0; k < n; ++k) {
        const T* xk = x + k * inner;
        T* yk = y + k * inner;
        for (int64_t j = 0; j < w; ++j) yk[j] = (xk[j] - a[j]) - b[j];
      }
    }
  }
}

template <Kind K, typename T>
void run(ThreadPool& pool, const T* x, T* y, const math::AxisLayout& l) {
  const int64_t n = l.n, inner = l.inner;
  if constexpr (std::is_same_v<T, float> && K != Kind::Hardmax) {
    if (inner == 1) {
      // An exp per element: chunks of about 4096 elements, so that small tensors still split.
      pool.parallel_for(l.outer, math::grain_for(n, 4096),
                        [&](int64_t lo, int64_t hi) { float_rows<K>(x, y, n, lo, hi); });
      return;
    }
  }
  if (inner == 1) {
    pool.parallel_for(l.outer, math::grain_for(n, 16384), [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) row<K, T>(x + o * n, y + o * n, n);
    });
    return;
  }
  const int64_t chunks = (inner + kChunk - 1) / kChunk;
  pool.parallel_for(l.outer * chunks, math::grain_for(n * std::min(inner, kChunk), 16384), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t o = t / chunks, c = t % chunks;
      const int64_t j0 = c * kChunk;
      columns<K, T>(x + o * n * inner, y + o * n * inner, n, inner, j0, std::min(kChunk, inner - j0));
    }
  });
}

template <Kind K>
void softmax_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int rank = x.rank();
  const bool legacy = ctx.opset() < 13;
  const int axis = normalize_axis(ctx, ctx.node().attr_int("axis", legacy ? 1 : -1), rank);
  math::AxisLayout l;
  if (legacy) {
    // Coerce to 2-D: [prod(dims[:axis]), prod(dims[axis:])].
    for (int i = 0; i < rank; ++i) (i < axis ? l.outer : l.n) *= x.shape()[static_cast<size_t>(i)];
  } else {
    l = math::axis_layout(x.shape(), axis);
  }
  Tensor& out = ctx.alloc_output(0, x.dtype(), x.shape());
  if (x.numel() == 0) return;
  if (x.dtype() == DType::Float32) run<K, float>(ctx.pool(), x.data<float>(), out.data<float>(), l);
  else if (x.dtype() == DType::Float64) run<K, double>(ctx.pool(), x.data<double>(), out.data<double>(), l);
  else ctx.fail("needs a floating-point input, got {}", dtype_name(x.dtype()));
}

}  // namespace

void register_softmax(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  r.add_fn("", "Softmax", 1, kMaxOpset, cpu, softmax_kernel<Kind::Softmax>);
  r.add_fn("", "LogSoftmax", 1, kMaxOpset, cpu, softmax_kernel<Kind::LogSoftmax>);
  r.add_fn("", "Hardmax", 1, kMaxOpset, cpu, softmax_kernel<Kind::Hardmax>);
}

}  // namespace mpq::rt::cpu
