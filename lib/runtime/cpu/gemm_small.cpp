// Float32 Gemm with a small right operand, every row by the same arithmetic (see gemm_small.h).
// Compiled with -ffp-contract=off (lib/CMakeLists.txt): the final alpha * acc + beta * C must round
// the product and the sum apart in the scalar reference as in the vector code; the fused
// multiply-adds of the sums are explicit (std::fma, _mm512_fmadd_ps, _mm256_fmadd_ps).
#include "runtime/cpu/gemm_small.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "runtime/cpu/conv_common.h"
#include "runtime/thread_pool.h"

namespace mpq::rt::cpu {

namespace {

constexpr int kLanes = 16;  // the partial sums of a transposed-B dot product, whatever the ISA

inline float finish(float acc, float alpha, float beta, const float* c) {
  const float v = alpha * acc;
  return beta == 0.0f ? v : v + beta * *c;
}

// One element of C with B not transposed: k in order.
inline float nn_element(const float* arow, const float* b, int64_t ldb, int64_t col, int64_t k) {
  float acc = 0.0f;
  for (int64_t p = 0; p < k; ++p) acc = std::fma(arow[p], b[p * ldb + col], acc);
  return acc;
}

// One element of C with B transposed: K padded with zeros to a multiple of sixteen, lane j the
// fma over k = j, j + 16, ... (fma(0, 0, s) where k >= K, as a masked vector load gives), then the
// lanes' tree.
inline float nt_element(const float* arow, const float* brow, int64_t k) {
  float lane[kLanes] = {};
  for (int64_t p0 = 0; p0 < k; p0 += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const int64_t p = p0 + j;
      lane[j] = std::fma(p < k ? arow[p] : 0.0f, p < k ? brow[p] : 0.0f, lane[j]);
    }
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j) lane[j] = lane[j] + lane[j + width];
  return lane[0];
}

// ---------------------------------------------------------------- AVX-512

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized reports
// (a known false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The tree of gemm_small.h on sixteen lanes: 8 onto 0, 4, 2, 1.
__attribute__((target("avx512f"), always_inline)) inline float tree16_avx512(__m512 x) {
  const __m256 lo = _mm512_castps512_ps256(x);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
  const __m256 q = _mm256_add_ps(lo, hi);
  const __m128 r = _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1));
  const __m128 s = _mm_add_ps(r, _mm_movehl_ps(r, r));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

__attribute__((target("avx512f"), always_inline)) inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1u);
}

// R rows x V vectors of 16 columns; the last vector's columns masked to `last` (16: all).
template <int R, int V>
__attribute__((target("avx512f"), always_inline)) inline void nn_tile_avx512(const float* a, int64_t lda,
                                                                             const float* b, int64_t ldb, int64_t k,
                                                                             float alpha, float beta, float* c,
                                                                             int64_t ldc, __mmask16 last) {
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    __m512 bv[V];
    for (int v = 0; v < V; ++v)
      bv[v] = v == V - 1 ? _mm512_maskz_loadu_ps(last, b + p * ldb + v * 16) : _mm512_loadu_ps(b + p * ldb + v * 16);
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + p]);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m512 al = _mm512_set1_ps(alpha), be = _mm512_set1_ps(beta);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) {
      float* out = c + r * ldc + v * 16;
      const __mmask16 m = v == V - 1 ? last : static_cast<__mmask16>(0xFFFF);
      __m512 y = _mm512_mul_ps(al, acc[r][v]);
      if (beta != 0.0f) y = _mm512_add_ps(y, _mm512_mul_ps(be, _mm512_maskz_loadu_ps(m, out)));
      _mm512_mask_storeu_ps(out, m, y);
    }
}

// R rows x C columns of dot products over K, the last chunk of K masked (zeros).
template <int R, int C>
__attribute__((target("avx512f"), always_inline)) inline void nt_tile_avx512(const float* a, int64_t lda,
                                                                             const float* b, int64_t ldb, int64_t k,
                                                                             float alpha, float beta, float* c,
                                                                             int64_t ldc) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; p += kLanes) {
    const __mmask16 m = first_lanes(k - p);
    __m512 av[R];
    for (int r = 0; r < R; ++r) av[r] = _mm512_maskz_loadu_ps(m, a + r * lda + p);
    for (int j = 0; j < C; ++j) {
      const __m512 bv = _mm512_maskz_loadu_ps(m, b + j * ldb + p);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_fmadd_ps(av[r], bv, acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) c[r * ldc + j] = finish(tree16_avx512(acc[r][j]), alpha, beta, c + r * ldc + j);
}

template <int R>
__attribute__((target("avx512f"), always_inline)) inline void nn_rows_avx512(const float* a, int64_t lda,
                                                                             const float* b, int64_t ldb, int64_t n,
                                                                             int64_t k, float alpha, float beta,
                                                                             float* c, int64_t ldc) {
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) nn_tile_avx512<R, 2>(a, lda, b + j, ldb, k, alpha, beta, c + j, ldc, 0xFFFF);
  for (; j < n; j += 16) nn_tile_avx512<R, 1>(a, lda, b + j, ldb, k, alpha, beta, c + j, ldc, first_lanes(n - j));
}

template <int R>
__attribute__((target("avx512f"), always_inline)) inline void nt_rows_avx512(const float* a, int64_t lda,
                                                                             const float* b, int64_t ldb, int64_t n,
                                                                             int64_t k, float alpha, float beta,
                                                                             float* c, int64_t ldc) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) nt_tile_avx512<R, 4>(a, lda, b + j * ldb, ldb, k, alpha, beta, c + j, ldc);
  for (; j < n; ++j) nt_tile_avx512<R, 1>(a, lda, b + j * ldb, ldb, k, alpha, beta, c + j, ldc);
}

__attribute__((target("avx512f"), noinline)) void rows_avx512(bool tb, int64_t r0, int64_t r1, int64_t n, int64_t k,
                                                              float alpha, const float* a, int64_t lda,
                                                              const float* b, int64_t ldb, float beta, float* c,
                                                              int64_t ldc) {
  int64_t i = r0;
  if (!tb) {
    for (; i + 8 <= r1; i += 8) nn_rows_avx512<8>(a + i * lda, lda, b, ldb, n, k, alpha, beta, c + i * ldc, ldc);
    for (; i + 4 <= r1; i += 4) nn_rows_avx512<4>(a + i * lda, lda, b, ldb, n, k, alpha, beta, c + i * ldc, ldc);
    for (; i < r1; ++i) nn_rows_avx512<1>(a + i * lda, lda, b, ldb, n, k, alpha, beta, c + i * ldc, ldc);
    return;
  }
  for (; i + 4 <= r1; i += 4) nt_rows_avx512<4>(a + i * lda, lda, b, ldb, n, k, alpha, beta, c + i * ldc, ldc);
  for (; i + 2 <= r1; i += 2) nt_rows_avx512<2>(a + i * lda, lda, b, ldb, n, k, alpha, beta, c + i * ldc, ldc);
  for (; i < r1; ++i) nt_rows_avx512<1>(a + i * lda, lda, b, ldb, n, k, alpha, beta, c + i * ldc, ldc);
}

#pragma GCC diagnostic pop

// ---------------------------------------------------------------- AVX2: sixteen lanes as two halves

__attribute__((target("avx2,fma"), always_inline)) inline float tree16_avx2(__m256 lo, __m256 hi) {
  const __m256 q = _mm256_add_ps(lo, hi);
  const __m128 r = _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1));
  const __m128 s = _mm_add_ps(r, _mm_movehl_ps(r, r));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

// Lanes [0, count) of eight set (count may be <= 0 or > 8).
__attribute__((target("avx2,fma"), always_inline)) inline __m256i first_lanes8(int64_t count) {
  const int c = static_cast<int>(std::clamp<int64_t>(count, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// R rows x 16 columns, of which the first `cols` are kept (16: all, unmasked).
template <int R, bool kMasked>
__attribute__((target("avx2,fma"), always_inline)) inline void nn_tile_avx2(const float* a, int64_t lda, const float* b,
                                                                            int64_t ldb, int64_t k, float alpha,
                                                                            float beta, float* c, int64_t ldc,
                                                                            int64_t cols) {
  const __m256i m0 = first_lanes8(cols), m1 = first_lanes8(cols - 8);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const float* row = b + p * ldb;
    const __m256 b0 = kMasked ? _mm256_maskload_ps(row, m0) : _mm256_loadu_ps(row);
    const __m256 b1 = kMasked ? _mm256_maskload_ps(row + 8, m1) : _mm256_loadu_ps(row + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_set1_ps(a[r * lda + p]);
      acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  const __m256 al = _mm256_set1_ps(alpha), be = _mm256_set1_ps(beta);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 2; ++v) {
      float* out = c + r * ldc + v * 8;
      const __m256i m = v == 0 ? m0 : m1;
      __m256 y = _mm256_mul_ps(al, acc[r][v]);
      if (kMasked) {
        if (beta != 0.0f) y = _mm256_add_ps(y, _mm256_mul_ps(be, _mm256_maskload_ps(out, m)));
        _mm256_maskstore_ps(out, m, y);
      } else {
        if (beta != 0.0f) y = _mm256_add_ps(y, _mm256_mul_ps(be, _mm256_loadu_ps(out)));
        _mm256_storeu_ps(out, y);
      }
    }
}

template <int R, int C>
__attribute__((target("avx2,fma"), always_inline)) inline void nt_tile_avx2(const float* a, int64_t lda, const float* b,
                                                                            int64_t ldb, int64_t k, float alpha,
                                                                            float beta, float* c, int64_t ldc) {
  __m256 lo[R][C], hi[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) lo[r][j] = hi[r][j] = _mm256_setzero_ps();
  for (int64_t p = 0; p < k; p += kLanes) {
    const bool whole = p + kLanes <= k;
    const __m256i m0 = first_lanes8(k - p), m1 = first_lanes8(k - p - 8);
    for (int j = 0; j < C; ++j) {
      const float* brow = b + j * ldb + p;
      const __m256 b0 = whole ? _mm256_loadu_ps(brow) : _mm256_maskload_ps(brow, m0);
      const __m256 b1 = whole ? _mm256_loadu_ps(brow + 8) : _mm256_maskload_ps(brow + 8, m1);
      for (int r = 0; r < R; ++r) {
        const float* arow = a + r * lda + p;
        const __m256 a0 = whole ? _mm256_loadu_ps(arow) : _mm256_maskload_ps(arow, m0);
        const __m256 a1 = whole ? _mm256_loadu_ps(arow + 8) : _mm256_maskload_ps(arow + 8, m1);
        lo[r][j] = _mm256_fmadd_ps(a0, b0, lo[r][j]);
        hi[r][j] = _mm256_fmadd_ps(a1, b1, hi[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) c[r * ldc + j] = finish(tree16_avx2(lo[r][j], hi[r][j]), alpha, beta, c + r * ldc + j);
}

template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void nn_rows_avx2(const float* a, int64_t lda, const float* b,
                                                                            int64_t ldb, int64_t n, int64_t k,
                                                                            float alpha, float beta, float* c,
                                                                            int64_t ldc) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) nn_tile_avx2<R, false>(a, lda, b + j, ldb, k, alpha, beta, c + j, ldc, 16);
  if (j < n) nn_tile_avx2<R, true>(a, lda, b + j, ldb, k, alpha, beta, c + j, ldc, n - j);
}

template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void nt_rows_avx2(const float* a, int64_t lda, const float* b,
                                                                            int64_t ldb, int64_t n, int64_t k,
                                                                            float alpha, float beta, float* c,
                                                                            int64_t ldc) {
  int64_t j = 0;
  for (; j + 2 <= n; j += 2) nt_tile_avx2<R, 2>(a, lda, b + j * ldb, ldb, k, alpha, beta, c + j, ldc);
  if (j < n) nt_tile_avx2<R, 1>(a, lda, b + j * ldb, ldb, k, alpha, beta, c + j, ldc);
}

__attribute__((target("avx2,fma"), noinline)) void rows_avx2(bool tb, int64_t r0, int64_t r1, int64_t n, int64_t k,
                                                             float alpha, const float* a, int64_t lda, const float* b,
                                                             int64_t ldb, float beta, float* c, int64_t ldc) {
  int64_t i = r0;
  if (!tb) {
    for (; i + 4 <= r1; i += 4) nn_rows_avx2<4>(a + i * lda, lda, b, ldb, n, k, alpha, beta, c + i * ldc, ldc);
    for (; i < r1; ++i) nn_rows_avx2<1>(a + i * lda, lda, b, ldb, n, k, alpha, beta, c + i * ldc, ldc);
    return;
  }
  for (; i + 2 <= r1; i += 2) nt_rows_avx2<2>(a + i * lda, lda, b, ldb, n, k, alpha, beta, c + i * ldc, ldc);
  for (; i < r1; ++i) nt_rows_avx2<1>(a + i * lda, lda, b, ldb, n, k, alpha, beta, c + i * ldc, ldc);
}

}  // namespace

bool small_gemm_applies(bool ta, bool tb, int64_t k, int64_t n) {
  // Without AVX2 and FMA the scalar loop (a libm call per multiply-add) would be slower than OpenBLAS.
  return !ta && (tb ? k >= 8 : n >= 16) && k > 0 && n > 0 && k * n <= kSmallGemmMaxB && !deterministic_blas() &&
         small_gemm_isa() != SmallGemmIsa::Scalar;
}

void small_gemm(ThreadPool& pool, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  const int64_t grain = std::max<int64_t>(1, 262144 / std::max<int64_t>(n * k, 1));
  const SmallGemmIsa isa = small_gemm_isa();
  pool.parallel_for(m, grain, [&](int64_t r0, int64_t r1) {
    small_gemm_rows_on(isa, tb, r0, r1, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  });
}

void small_gemm_ref(bool tb, int64_t r0, int64_t r1, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                    const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t i = r0; i < r1; ++i) {
    const float* arow = a + i * lda;
    float* crow = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) {
      const float acc = tb ? nt_element(arow, b + j * ldb, k) : nn_element(arow, b, ldb, j, k);
      crow[j] = finish(acc, alpha, beta, crow + j);
    }
  }
}

SmallGemmIsa small_gemm_isa() {
  static const SmallGemmIsa chosen = small_gemm_isa_supported(SmallGemmIsa::Avx512) ? SmallGemmIsa::Avx512
                                     : small_gemm_isa_supported(SmallGemmIsa::Avx2) ? SmallGemmIsa::Avx2
                                                                                    : SmallGemmIsa::Scalar;
  return chosen;
}

bool small_gemm_isa_supported(SmallGemmIsa isa) {
  switch (isa) {
    case SmallGemmIsa::Avx512: return __builtin_cpu_supports("avx512f");
    case SmallGemmIsa::Avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case SmallGemmIsa::Scalar: return true;
  }
  return false;
}

void small_gemm_rows_on(SmallGemmIsa isa, bool tb, int64_t r0, int64_t r1, int64_t n, int64_t k, float alpha,
                        const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  switch (isa) {
    case SmallGemmIsa::Avx512: rows_avx512(tb, r0, r1, n, k, alpha, a, lda, b, ldb, beta, c, ldc); return;
    case SmallGemmIsa::Avx2: rows_avx2(tb, r0, r1, n, k, alpha, a, lda, b, ldb, beta, c, ldc); return;
    case SmallGemmIsa::Scalar: small_gemm_ref(tb, r0, r1, n, k, alpha, a, lda, b, ldb, beta, c, ldc); return;
  }
}

}  // namespace mpq::rt::cpu
