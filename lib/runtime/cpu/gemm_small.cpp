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

// The scalar pieces are always inlined: inside the AVX-512 and AVX2 builds (the columns and sums
// left over from their vectors) std::fma is then one instruction, not a call into libm.
__attribute__((always_inline)) inline float finish(float acc, float alpha, float beta, const float* c) {
  const float v = alpha * acc;
  return beta == 0.0f ? v : v + beta * *c;
}

// One element of C with B not transposed: k in order.
__attribute__((always_inline)) inline float nn_element(const float* arow, const float* b, int64_t ldb, int64_t col, int64_t k) {
  float acc = 0.0f;
  for (int64_t p = 0; p < k; ++p) acc = std::fma(arow[p], b[p * ldb + col], acc);
  return acc;
}

// One element of C with B transposed: sixteen lanes, their tree, then the tail.
__attribute__((always_inline)) inline float nt_element(const float* arow, const float* brow, int64_t k) {
  const int64_t k16 = k / kLanes * kLanes;
  float lane[kLanes] = {};
  for (int64_t p = 0; p < k16; ++p) lane[p % kLanes] = std::fma(arow[p], brow[p], lane[p % kLanes]);
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j) lane[j] = lane[j] + lane[j + width];
  float acc = lane[0];
  for (int64_t p = k16; p < k; ++p) acc = std::fma(arow[p], brow[p], acc);
  return acc;
}

// The columns [c0, n) of rows [r0, r1) by the scalar loops (the vector kernels' leftover columns).
__attribute__((always_inline)) inline void scalar_columns(bool tb, int64_t r0, int64_t r1, int64_t c0, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t i = r0; i < r1; ++i) {
    const float* arow = a + i * lda;
    float* crow = c + i * ldc;
    for (int64_t j = c0; j < n; ++j) {
      const float acc = tb ? nt_element(arow, b + j * ldb, k) : nn_element(arow, b, ldb, j, k);
      crow[j] = finish(acc, alpha, beta, crow + j);
    }
  }
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

template <int R, int V>
__attribute__((target("avx512f"), always_inline)) inline void nn_tile_avx512(const float* a, int64_t lda,
                                                                             const float* b, int64_t ldb, int64_t k,
                                                                             float alpha, float beta, float* c,
                                                                             int64_t ldc) {
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    __m512 bv[V];
    for (int v = 0; v < V; ++v) bv[v] = _mm512_loadu_ps(b + p * ldb + v * 16);
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + p]);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m512 al = _mm512_set1_ps(alpha), be = _mm512_set1_ps(beta);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) {
      float* out = c + r * ldc + v * 16;
      __m512 y = _mm512_mul_ps(al, acc[r][v]);
      if (beta != 0.0f) y = _mm512_add_ps(y, _mm512_mul_ps(be, _mm512_loadu_ps(out)));
      _mm512_storeu_ps(out, y);
    }
}

template <int R, int C>
__attribute__((target("avx512f"), always_inline)) inline void nt_tile_avx512(const float* a, int64_t lda,
                                                                             const float* b, int64_t ldb, int64_t k,
                                                                             float alpha, float beta, float* c,
                                                                             int64_t ldc) {
  const int64_t k16 = k / kLanes * kLanes;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k16; p += kLanes) {
    __m512 av[R];
    for (int r = 0; r < R; ++r) av[r] = _mm512_loadu_ps(a + r * lda + p);
    for (int j = 0; j < C; ++j) {
      const __m512 bv = _mm512_loadu_ps(b + j * ldb + p);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_fmadd_ps(av[r], bv, acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) {
      float s = tree16_avx512(acc[r][j]);
      for (int64_t p = k16; p < k; ++p) s = std::fma(a[r * lda + p], b[j * ldb + p], s);
      c[r * ldc + j] = finish(s, alpha, beta, c + r * ldc + j);
    }
}

__attribute__((target("avx512f"), noinline)) void rows_avx512(bool tb, int64_t r0, int64_t r1, int64_t n, int64_t k,
                                                              float alpha, const float* a, int64_t lda,
                                                              const float* b, int64_t ldb, float beta, float* c,
                                                              int64_t ldc) {
  int64_t i = r0;
  if (!tb) {
    const int64_t n32 = n / 32 * 32, n16 = n / 16 * 16;
    for (; i + 8 <= r1; i += 8) {
      for (int64_t j = 0; j < n32; j += 32) nn_tile_avx512<8, 2>(a + i * lda, lda, b + j, ldb, k, alpha, beta, c + i * ldc + j, ldc);
      if (n16 > n32) nn_tile_avx512<8, 1>(a + i * lda, lda, b + n32, ldb, k, alpha, beta, c + i * ldc + n32, ldc);
    }
    for (; i + 4 <= r1; i += 4) {
      for (int64_t j = 0; j < n32; j += 32) nn_tile_avx512<4, 2>(a + i * lda, lda, b + j, ldb, k, alpha, beta, c + i * ldc + j, ldc);
      if (n16 > n32) nn_tile_avx512<4, 1>(a + i * lda, lda, b + n32, ldb, k, alpha, beta, c + i * ldc + n32, ldc);
    }
    for (; i < r1; ++i) {
      for (int64_t j = 0; j < n32; j += 32) nn_tile_avx512<1, 2>(a + i * lda, lda, b + j, ldb, k, alpha, beta, c + i * ldc + j, ldc);
      if (n16 > n32) nn_tile_avx512<1, 1>(a + i * lda, lda, b + n32, ldb, k, alpha, beta, c + i * ldc + n32, ldc);
    }
    scalar_columns(false, r0, r1, n16, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const int64_t n4 = n / 4 * 4;
  for (; i + 4 <= r1; i += 4) {
    for (int64_t j = 0; j < n4; j += 4) nt_tile_avx512<4, 4>(a + i * lda, lda, b + j * ldb, ldb, k, alpha, beta, c + i * ldc + j, ldc);
    for (int64_t j = n4; j < n; ++j) nt_tile_avx512<4, 1>(a + i * lda, lda, b + j * ldb, ldb, k, alpha, beta, c + i * ldc + j, ldc);
  }
  for (; i + 2 <= r1; i += 2) {
    for (int64_t j = 0; j < n4; j += 4) nt_tile_avx512<2, 4>(a + i * lda, lda, b + j * ldb, ldb, k, alpha, beta, c + i * ldc + j, ldc);
    for (int64_t j = n4; j < n; ++j) nt_tile_avx512<2, 1>(a + i * lda, lda, b + j * ldb, ldb, k, alpha, beta, c + i * ldc + j, ldc);
  }
  for (; i < r1; ++i) {
    for (int64_t j = 0; j < n4; j += 4) nt_tile_avx512<1, 4>(a + i * lda, lda, b + j * ldb, ldb, k, alpha, beta, c + i * ldc + j, ldc);
    for (int64_t j = n4; j < n; ++j) nt_tile_avx512<1, 1>(a + i * lda, lda, b + j * ldb, ldb, k, alpha, beta, c + i * ldc + j, ldc);
  }
}

#pragma GCC diagnostic pop

// ---------------------------------------------------------------- AVX2: sixteen lanes as two halves

__attribute__((target("avx2,fma"), always_inline)) inline float tree16_avx2(__m256 lo, __m256 hi) {
  const __m256 q = _mm256_add_ps(lo, hi);
  const __m128 r = _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1));
  const __m128 s = _mm_add_ps(r, _mm_movehl_ps(r, r));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void nn_tile_avx2(const float* a, int64_t lda, const float* b,
                                                                            int64_t ldb, int64_t k, float alpha,
                                                                            float beta, float* c, int64_t ldc) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const __m256 b0 = _mm256_loadu_ps(b + p * ldb), b1 = _mm256_loadu_ps(b + p * ldb + 8);
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
      __m256 y = _mm256_mul_ps(al, acc[r][v]);
      if (beta != 0.0f) y = _mm256_add_ps(y, _mm256_mul_ps(be, _mm256_loadu_ps(out)));
      _mm256_storeu_ps(out, y);
    }
}

template <int R, int C>
__attribute__((target("avx2,fma"), always_inline)) inline void nt_tile_avx2(const float* a, int64_t lda, const float* b,
                                                                            int64_t ldb, int64_t k, float alpha,
                                                                            float beta, float* c, int64_t ldc) {
  const int64_t k16 = k / kLanes * kLanes;
  __m256 lo[R][C], hi[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) lo[r][j] = hi[r][j] = _mm256_setzero_ps();
  for (int64_t p = 0; p < k16; p += kLanes) {
    for (int j = 0; j < C; ++j) {
      const __m256 b0 = _mm256_loadu_ps(b + j * ldb + p), b1 = _mm256_loadu_ps(b + j * ldb + p + 8);
      for (int r = 0; r < R; ++r) {
        lo[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + r * lda + p), b0, lo[r][j]);
        hi[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + r * lda + p + 8), b1, hi[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) {
      float s = tree16_avx2(lo[r][j], hi[r][j]);
      for (int64_t p = k16; p < k; ++p) s = std::fma(a[r * lda + p], b[j * ldb + p], s);
      c[r * ldc + j] = finish(s, alpha, beta, c + r * ldc + j);
    }
}

__attribute__((target("avx2,fma"), noinline)) void rows_avx2(bool tb, int64_t r0, int64_t r1, int64_t n, int64_t k,
                                                             float alpha, const float* a, int64_t lda, const float* b,
                                                             int64_t ldb, float beta, float* c, int64_t ldc) {
  int64_t i = r0;
  if (!tb) {
    const int64_t n16 = n / 16 * 16;
    for (; i + 4 <= r1; i += 4)
      for (int64_t j = 0; j < n16; j += 16) nn_tile_avx2<4>(a + i * lda, lda, b + j, ldb, k, alpha, beta, c + i * ldc + j, ldc);
    for (; i < r1; ++i)
      for (int64_t j = 0; j < n16; j += 16) nn_tile_avx2<1>(a + i * lda, lda, b + j, ldb, k, alpha, beta, c + i * ldc + j, ldc);
    scalar_columns(false, r0, r1, n16, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const int64_t n2 = n / 2 * 2;
  for (; i + 2 <= r1; i += 2) {
    for (int64_t j = 0; j < n2; j += 2) nt_tile_avx2<2, 2>(a + i * lda, lda, b + j * ldb, ldb, k, alpha, beta, c + i * ldc + j, ldc);
    if (n2 < n) nt_tile_avx2<2, 1>(a + i * lda, lda, b + n2 * ldb, ldb, k, alpha, beta, c + i * ldc + n2, ldc);
  }
  for (; i < r1; ++i) {
    for (int64_t j = 0; j < n2; j += 2) nt_tile_avx2<1, 2>(a + i * lda, lda, b + j * ldb, ldb, k, alpha, beta, c + i * ldc + j, ldc);
    if (n2 < n) nt_tile_avx2<1, 1>(a + i * lda, lda, b + n2 * ldb, ldb, k, alpha, beta, c + i * ldc + n2, ldc);
  }
}

}  // namespace

bool small_gemm_applies(bool ta, int64_t k, int64_t n) {
  // Without AVX2 and FMA the scalar loop (a libm call per multiply-add) would be slower than OpenBLAS.
  return !ta && k > 0 && n > 0 && k * n <= kSmallGemmMaxB && !deterministic_blas() &&
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
  scalar_columns(tb, r0, r1, 0, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
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
