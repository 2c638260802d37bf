#pragma once
// Internal helpers of the math kernel families (unary.cpp, softmax.cpp, reduce.cpp, norm.cpp):
// branch-free float32 approximations of exp/log/tanh/erf that the compiler can vectorise (the
// libm calls cannot be vectorised without -ffast-math), multi-lane reductions over contiguous
// rows, and the [outer, n, inner] view of a tensor around one axis.
//
// Accuracy: fast_exp and fast_log are within 2 ulp over their whole range (Cephes' polynomials);
// the derived functions keep a relative error below 1e-6 (fast_erfc_pos: below 1.6e-6 for z < 4,
// about 8e-6 far in its tail), far inside ONNX's test tolerance.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/tensor.h"

namespace mpq::rt::cpu::math {

inline float bits_to_f(uint32_t u) { return std::bit_cast<float>(u); }
inline uint32_t f_to_bits(float f) { return std::bit_cast<uint32_t>(f); }

// c ? a : b as a bit blend. GCC (with the default -ftrapping-math) refuses to if-convert a
// conditional whose arms do floating-point arithmetic, which keeps such loops scalar; a blend of
// two values computed unconditionally vectorises.
template <typename T>
inline T sel(bool c, T a, T b) {
  if constexpr (std::is_same_v<T, float>) {
    const uint32_t m = 0u - static_cast<uint32_t>(c);
    return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
  } else if constexpr (std::is_same_v<T, double>) {
    const uint64_t m = uint64_t{0} - static_cast<uint64_t>(c);
    return std::bit_cast<double>((std::bit_cast<uint64_t>(a) & m) | (std::bit_cast<uint64_t>(b) & ~m));
  } else {
    return c ? a : b;
  }
}

// e^x. Overflows to inf above ~88.72, underflows to 0 (denormals kept approximately), NaN in, NaN out.
__attribute__((always_inline)) inline float fast_exp(float x) {
  x = sel(x < -104.0f, -104.0f, x);
  x = sel(x > 88.8f, 88.8f, x);
  const float t = x * 1.44269504088896341f;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  float fn = t + magic;
  const int32_t n = static_cast<int32_t>(f_to_bits(fn)) - static_cast<int32_t>(f_to_bits(magic));
  fn -= magic;
  float r = x - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  // The polynomial by Estrin's scheme (shorter dependent chains than Horner's; see fast_erfc_pos).
  const float r2 = r * r;
  const float c01 = r * 1.6666665459e-1f + 5.0000001201e-1f;
  const float c23 = r * 8.3334519073e-3f + 4.1665795894e-2f;
  const float c45 = r * 1.9875691500e-4f + 1.3981999507e-3f;
  const float p = ((r2 * r2) * c45 + (r2 * c23 + c01)) * r2 + r + 1.0f;
  // 2^n in two factors so that n in [-150, 128] never leaves the normal exponent range.
  const int32_t n1 = n >> 1;
  const int32_t n2 = n - n1;
  const float s1 = bits_to_f(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = bits_to_f(static_cast<uint32_t>(n2 + 127) << 23);
  return p * s1 * s2;
}

// e^x - 1, accurate near 0.
__attribute__((always_inline)) inline float fast_expm1(float x) {
  const float big = fast_exp(x) - 1.0f;
  // Taylor series for |x| < 0.5 (truncation error < 6e-9).
  float p = 1.0f / 40320.0f;
  p = p * x + 1.0f / 5040.0f;
  p = p * x + 1.0f / 720.0f;
  p = p * x + 1.0f / 120.0f;
  p = p * x + 1.0f / 24.0f;
  p = p * x + 1.0f / 6.0f;
  p = p * x + 0.5f;
  const float small = (p * x) * x + x;
  return sel(std::fabs(x) < 0.5f, small, big);
}

// Natural logarithm: -inf at 0, NaN below 0, inf at inf, denormals handled.
__attribute__((always_inline)) inline float fast_log(float x) {
  const bool denorm = x < std::numeric_limits<float>::min();
  const float xs = sel(denorm, x * 8388608.0f, x);  // scale denormals by 2^23
  const uint32_t bits = f_to_bits(xs);
  int32_t e = static_cast<int32_t>((bits >> 23) & 0xffu) - 126;
  float m = bits_to_f((bits & 0x7fffffu) | 0x3f000000u);  // mantissa in [0.5, 1)
  const bool lo = m < 0.707106781186547524f;
  e -= static_cast<int32_t>(lo);
  m = sel(lo, m + m - 1.0f, m - 1.0f);
  const float ef = static_cast<float>(e) - sel(denorm, 23.0f, 0.0f);
  const float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y += ef * -2.12194440e-4f;
  y += -0.5f * z;
  float r = m + y;
  r += ef * 0.693359375f;
  const float inf = std::numeric_limits<float>::infinity();
  r = sel(x == 0.0f, -inf, r);
  r = sel(x == inf, inf, r);
  r = sel((x < 0.0f) | (x != x), std::numeric_limits<float>::quiet_NaN(), r);
  return r;
}

// log(1 + x) accurate near 0 (x >= -1).
__attribute__((always_inline)) inline float fast_log1p(float x) {
  const float u = 1.0f + x;
  const float d = u - 1.0f;
  // log(u) * x / (u - 1) corrects the rounding of 1 + x; when u == 1 the answer is x itself.
  const float corrected = fast_log(u) * (x / sel(d == 0.0f, 1.0f, d));
  return sel(d == 0.0f, x, sel(u == std::numeric_limits<float>::infinity(), u, corrected));
}

__attribute__((always_inline)) inline float fast_sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

__attribute__((always_inline)) inline float fast_tanh(float x) {
  const float ax = std::fabs(x);
  // Large |x|: 1 - 2 / (e^{2|x|} + 1); small |x|: Cephes' odd polynomial.
  const float big = 1.0f - 2.0f / (fast_exp(2.0f * ax) + 1.0f);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  return sel(ax < 0.625f, small, std::copysign(big, x));
}

// erfc(z) for z >= 0 (Chebyshev fit, Numerical Recipes 6.2): relative error below 6e-7 for z < 2,
// 1.6e-6 for z < 4, growing to about 8e-6 where erfc leaves the normal floats (z near 9.2; the
// float rounding of the exponent's argument).
__attribute__((always_inline)) inline float fast_erfc_pos(float z) {
  const float t = 1.0f / (1.0f + 0.5f * z);
  // The degree-9 polynomial in t by Estrin's scheme: pairs, then t^2, t^4 and t^8 combine them.
  // Four dependent steps instead of Horner's nine (a product and a sum each): with the division
  // and the exponential, Horner's chain was long enough that the vector loop waited on it. Gelu
  // at 17 x 1024 values, one thread: 16.7 -> 11.9 us with fast_exp's polynomial done the same way
  // (`mpq run --profile-nodes`), the same accuracy as Horner's (see above).
  const float t2 = t * t;
  const float t4 = t2 * t2;
  const float t8 = t4 * t4;
  const float c01 = t * 1.00002368f - 1.26551223f;
  const float c23 = t * 0.09678418f + 0.37409196f;
  const float c45 = t * 0.27886807f - 0.18628806f;
  const float c67 = t * 1.48851587f - 1.13520398f;
  const float c89 = t * 0.17087277f - 0.82215223f;
  const float c03 = t2 * c23 + c01;
  const float c47 = t2 * c67 + c45;
  const float c07 = t4 * c47 + c03;
  const float p = t8 * c89 + c07;
  return t * fast_exp(-z * z + p);
}

// erf(x) for |x| < 0.5 by its Taylor series (relative error < 1e-8).
__attribute__((always_inline)) inline float erf_small(float x) {
  const float z = x * x;
  float p = 1.0f / 9360.0f;
  p = -p * z + 1.0f / 1320.0f;
  p = p * z - 1.0f / 216.0f;
  p = p * z + 1.0f / 42.0f;
  p = p * z - 1.0f / 10.0f;
  p = p * z + 1.0f / 3.0f;
  p = p * z - 1.0f;
  return -1.1283791670955126f * x * p;
}

__attribute__((always_inline)) inline float fast_erf(float x) {
  const float ax = std::fabs(x);
  const float big = std::copysign(1.0f - fast_erfc_pos(ax), x);
  return sel(ax < 0.5f, erf_small(x), sel(x != x, x, big));
}

// 1 + erf(x) without cancellation for negative x (for Gelu): erfc(-x) alone, one branch per
// element, about a quarter fewer instructions than also evaluating erf_small. Near 0, 1 + erf(x)
// is near 1, so erf_small's reason (erf's own cancellation there) does not arise; the relative
// error is that of fast_erfc_pos in float, up to about 5e-7 near 0 (2.3e-7 with erf_small) and,
// as before, about 8e-6 far in the negative tail, where Gelu is below 1e-17.
__attribute__((always_inline)) inline float fast_one_plus_erf(float x) {
  const float c = fast_erfc_pos(std::fabs(x));
  return sel(x != x, x, sel(x > 0.0f, 2.0f - c, c));
}

// Sum / max of a contiguous float row with independent lanes (vectorised without -ffast-math).
__attribute__((always_inline)) inline float row_sum(const float* x, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j];
  float s = 0.0f;
  for (; i < n; ++i) s += x[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

// Max / min of a contiguous float row; NaN anywhere gives NaN. Written with GCC/Clang vector
// extensions: a select-based reduction is not auto-vectorised.
namespace detail {
typedef float v4f __attribute__((vector_size(16)));
inline v4f load4(const float* p) {
  v4f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <bool kMax>
__attribute__((always_inline)) inline float row_extreme(const float* x, int64_t n) {
  const float init = kMax ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  v4f a0 = {init, init, init, init}, a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const v4f x0 = load4(x + i), x1 = load4(x + i + 4), x2 = load4(x + i + 8), x3 = load4(x + i + 12);
    if constexpr (kMax) {
      a0 = ((x0 > a0) | (x0 != x0)) ? x0 : a0;
      a1 = ((x1 > a1) | (x1 != x1)) ? x1 : a1;
      a2 = ((x2 > a2) | (x2 != x2)) ? x2 : a2;
      a3 = ((x3 > a3) | (x3 != x3)) ? x3 : a3;
    } else {
      a0 = ((x0 < a0) | (x0 != x0)) ? x0 : a0;
      a1 = ((x1 < a1) | (x1 != x1)) ? x1 : a1;
      a2 = ((x2 < a2) | (x2 != x2)) ? x2 : a2;
      a3 = ((x3 < a3) | (x3 != x3)) ? x3 : a3;
    }
  }
  // The four accumulators pairwise, then their four lanes and the tail one at a time. (Sixteen
  // lanes one at a time, each a compare and a branch, took longer than the vector loop on the
  // short rows of attention's Softmax.) Which of equal values is kept (+0 or -0) may differ from
  // a scan in order; a NaN anywhere still gives NaN.
  const auto pick = [](v4f a, v4f b) {
    if constexpr (kMax) return ((b > a) | (b != b)) ? b : a;
    else return ((b < a) | (b != b)) ? b : a;
  };
  const v4f a = pick(pick(a0, a1), pick(a2, a3));
  float m = init;
  auto take = [&m](float v) {
    if (m != m) return;  // a NaN was found: it stays
    if (v != v || (kMax ? v > m : v < m)) m = v;
  };
  for (int j = 0; j < 4; ++j) take(a[j]);
  for (; i < n; ++i) take(x[i]);
  return m;
}
}  // namespace detail

__attribute__((always_inline)) inline float row_max(const float* x, int64_t n) { return detail::row_extreme<true>(x, n); }
__attribute__((always_inline)) inline float row_min(const float* x, int64_t n) { return detail::row_extreme<false>(x, n); }

// Sum of (x - mean)^2 over a contiguous row.
__attribute__((always_inline)) inline float row_sq_dev(const float* x, int64_t n, float mean) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) {
      const float d = x[i + j] - mean;
      acc[j] += d * d;
    }
  float s = 0.0f;
  for (; i < n; ++i) {
    const float d = x[i] - mean;
    s += d * d;
  }
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

// Generic (double) versions used by the float64 paths.
template <typename T>
__attribute__((always_inline)) inline T row_sum_t(const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return row_sum(x, n);
  } else {
    T s = 0;
    for (int64_t i = 0; i < n; ++i) s += x[i];
    return s;
  }
}

template <typename T>
__attribute__((always_inline)) inline T row_sq_dev_t(const T* x, int64_t n, T mean) {
  if constexpr (std::is_same_v<T, float>) {
    return row_sq_dev(x, n, mean);
  } else {
    T s = 0;
    for (int64_t i = 0; i < n; ++i) s += (x[i] - mean) * (x[i] - mean);
    return s;
  }
}

// A tensor seen as [outer, n, inner] around `axis`.
struct AxisLayout {
  int64_t outer = 1, n = 1, inner = 1;
};

inline AxisLayout axis_layout(const Shape& shape, int axis) {
  AxisLayout l;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (i < axis) l.outer *= shape[static_cast<size_t>(i)];
    else if (i == axis) l.n = shape[static_cast<size_t>(i)];
    else l.inner *= shape[static_cast<size_t>(i)];
  }
  return l;
}

// Grain (in outer items) so that one parallel chunk holds about `work` elements.
inline int64_t grain_for(int64_t per_item, int64_t work = 32768) {
  return std::max<int64_t>(1, work / std::max<int64_t>(per_item, 1));
}

}  // namespace mpq::rt::cpu::math
