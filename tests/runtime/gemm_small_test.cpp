// The small-B Gemm kernel (runtime/cpu/gemm_small): every instruction-set build against the scalar
// reference bit for bit, the reference against a float64 product, each row's bits independent of
// M, of the row's position and of the thread count, beta 0 never reading C, when it applies, and
// the Gemm and MatMul nodes running through it.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "runtime/cpu/conv_common.h"
#include "runtime/cpu/gemm_small.h"
#include "runtime/thread_pool.h"
#include "test_util.h"

using namespace mpq;
using rt::cpu::SmallGemmIsa;

namespace {

std::vector<float> random_values(size_t count, uint32_t seed) {
  const Tensor t = test::random_tensor({static_cast<int64_t>(count)}, seed, -1.0f, 1.0f);
  return std::vector<float>(t.data<float>(), t.data<float>() + count);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Problem {
  bool tb;
  int64_t m, n, k;
  float alpha, beta;
  bool tight;  // leading dimensions equal to the rows (buffers end where the data does), else wider
  std::vector<float> a, b, c;  // c: the C given (read where beta is not 0)
  int64_t lda() const { return tight ? k : k + 3; }
  int64_t ldb() const { return (tb ? k : n) + (tight ? 0 : 1); }
  int64_t ldc() const { return tight ? n : n + 2; }
};

Problem make_problem(bool tb, int64_t m, int64_t n, int64_t k, float alpha, float beta, uint32_t seed,
                     bool tight = false) {
  Problem p{tb, m, n, k, alpha, beta, tight, {}, {}, {}};
  p.a = random_values(static_cast<size_t>(m * p.lda()), seed);
  p.b = random_values(static_cast<size_t>((tb ? n : k) * p.ldb()), seed + 1);
  p.c = random_values(static_cast<size_t>(m * p.ldc()), seed + 2);
  return p;
}

std::vector<float> run_ref(const Problem& p) {
  std::vector<float> c = p.c;
  rt::cpu::small_gemm_ref(p.tb, 0, p.m, p.n, p.k, p.alpha, p.a.data(), p.lda(), p.b.data(), p.ldb(), p.beta, c.data(),
                          p.ldc());
  return c;
}

}  // namespace

TEST_CASE("small_gemm_ref computes alpha * A * op(B) + beta * C", "[gemm_small]") {
  for (const bool tb : {false, true}) {
    for (const float beta : {0.0f, 0.5f}) {
      const Problem p = make_problem(tb, 5, 17, 37, 0.75f, beta, 11);
      const std::vector<float> got = run_ref(p);
      for (int64_t i = 0; i < p.m; ++i) {
        for (int64_t j = 0; j < p.n; ++j) {
          double want = 0.0;
          for (int64_t q = 0; q < p.k; ++q) {
            const double bv = tb ? p.b[static_cast<size_t>(j * p.ldb() + q)] : p.b[static_cast<size_t>(q * p.ldb() + j)];
            want += static_cast<double>(p.a[static_cast<size_t>(i * p.lda() + q)]) * bv;
          }
          want = 0.75 * want + beta * static_cast<double>(p.c[static_cast<size_t>(i * p.ldc() + j)]);
          INFO("tb " << tb << " beta " << beta << " row " << i << " col " << j);
          CHECK(std::fabs(got[static_cast<size_t>(i * p.ldc() + j)] - want) <= 2e-6 * (1.0 + std::fabs(want)));
        }
      }
      // The padding between rows of C is left alone.
      for (int64_t i = 0; i < p.m; ++i)
        for (int64_t j = p.n; j < p.ldc(); ++j)
          CHECK(got[static_cast<size_t>(i * p.ldc() + j)] == p.c[static_cast<size_t>(i * p.ldc() + j)]);
    }
  }
}

TEST_CASE("every small_gemm build gives the reference's bits on odd shapes", "[gemm_small]") {
  uint32_t seed = 100;
  int builds = 0;
  for (const SmallGemmIsa isa : {SmallGemmIsa::Avx512, SmallGemmIsa::Avx2, SmallGemmIsa::Scalar}) {
    if (!rt::cpu::small_gemm_isa_supported(isa)) {
      WARN("this CPU lacks the instruction set of small_gemm build " << static_cast<int>(isa) << ": not compared");
      continue;
    }
    ++builds;
    for (const bool tb : {false, true})
      for (const int64_t m : {1, 2, 3, 4, 5, 9})
        for (const int64_t n : {1, 3, 10, 15, 16, 17, 33, 128})
          for (const int64_t k : {1, 5, 16, 17, 33, 96}) {
            const float beta = (m + n + k) % 3 == 0 ? 0.0f : (m % 2 == 0 ? 1.0f : -0.5f);
            // Tight leading dimensions on every other shape: a read past a row's end then leaves
            // the buffer on the last row (the sanitizer stage reports it).
            const bool tight = (m + n + k) % 2 == 0;
            const Problem p = make_problem(tb, m, n, k, m % 2 ? 1.0f : 0.6f, beta, seed += 3, tight);
            std::vector<float> got = p.c;
            rt::cpu::small_gemm_rows_on(isa, tb, 0, m, n, k, p.alpha, p.a.data(), p.lda(), p.b.data(), p.ldb(), beta,
                                        got.data(), p.ldc());
            INFO("isa " << static_cast<int>(isa) << " tb " << tb << " m " << m << " n " << n << " k " << k << " beta "
                        << beta << " tight " << tight);
            CHECK(same_bits(got, run_ref(p)));
          }
  }
  CHECK(builds >= 1);
}

TEST_CASE("a row's bits do not depend on M, its position or the thread count", "[gemm_small]") {
  rt::ThreadPool one(1), two(2);
  for (const bool tb : {false, true}) {
    INFO("tb " << tb);
    // 40 rows of K * N = 128 * 128 (the largest B): blocks of 16 rows from 256K multiply-adds, so
    // the two-thread runs really split (40 rows: three blocks).
    const Problem p = make_problem(tb, 40, 128, 128, 1.0f, 1.0f, 500);
    std::vector<float> whole_one = p.c, whole_two = p.c;
    rt::cpu::small_gemm(one, tb, p.m, p.n, p.k, 1.0f, p.a.data(), p.lda(), p.b.data(), p.ldb(), 1.0f, whole_one.data(),
                        p.ldc());
    rt::cpu::small_gemm(two, tb, p.m, p.n, p.k, 1.0f, p.a.data(), p.lda(), p.b.data(), p.ldb(), 1.0f, whole_two.data(),
                        p.ldc());
    CHECK(same_bits(whole_one, whole_two));
    // Each row alone (M = 1), and rows 3..10 as a batch of their own.
    std::vector<float> by_row = p.c;
    for (int64_t i = 0; i < p.m; ++i)
      rt::cpu::small_gemm(one, tb, 1, p.n, p.k, 1.0f, p.a.data() + i * p.lda(), p.lda(), p.b.data(), p.ldb(), 1.0f,
                          by_row.data() + i * p.ldc(), p.ldc());
    CHECK(same_bits(by_row, whole_one));
    std::vector<float> middle = p.c;
    rt::cpu::small_gemm(two, tb, 7, p.n, p.k, 1.0f, p.a.data() + 3 * p.lda(), p.lda(), p.b.data(), p.ldb(), 1.0f,
                        middle.data() + 3 * p.ldc(), p.ldc());
    for (int64_t i = 3; i < 10; ++i)
      CHECK(std::memcmp(middle.data() + i * p.ldc(), whole_one.data() + i * p.ldc(), sizeof(float) * p.n) == 0);
  }
}

TEST_CASE("small_gemm with beta 0 only writes C", "[gemm_small]") {
  // C full of NaN: every build, both layouts of B, whole and masked vectors (N 37), 9 rows.
  for (const SmallGemmIsa isa : {SmallGemmIsa::Avx512, SmallGemmIsa::Avx2, SmallGemmIsa::Scalar}) {
    if (!rt::cpu::small_gemm_isa_supported(isa)) continue;
    for (const bool tb : {false, true}) {
      INFO("isa " << static_cast<int>(isa) << " tb " << tb);
      const Problem p = make_problem(tb, 9, 37, 20, 1.0f, 0.0f, 900);
      std::vector<float> c(p.c.size(), std::numeric_limits<float>::quiet_NaN());
      rt::cpu::small_gemm_rows_on(isa, tb, 0, p.m, p.n, p.k, 1.0f, p.a.data(), p.lda(), p.b.data(), p.ldb(), 0.0f,
                                  c.data(), p.ldc());
      int64_t finite = 0;
      for (int64_t i = 0; i < p.m; ++i)
        for (int64_t j = 0; j < p.n; ++j) finite += std::isfinite(c[static_cast<size_t>(i * p.ldc() + j)]) ? 1 : 0;
      CHECK(finite == p.m * p.n);
    }
  }
}

TEST_CASE("small_gemm applies by K and N alone, never to a transposed A or in training", "[gemm_small]") {
  using rt::cpu::kSmallGemmMaxB;
  using rt::cpu::small_gemm_applies;
  if (rt::cpu::small_gemm_isa() == SmallGemmIsa::Scalar) {
    CHECK_FALSE(small_gemm_applies(false, true, 96, 128));  // OpenBLAS is the faster there
    return;
  }
  CHECK(small_gemm_applies(false, false, 96, 128));
  CHECK(small_gemm_applies(false, true, 96, 128));
  CHECK(small_gemm_applies(false, false, 1, kSmallGemmMaxB));
  CHECK_FALSE(small_gemm_applies(false, false, 2, kSmallGemmMaxB));
  CHECK_FALSE(small_gemm_applies(true, false, 96, 128));
  CHECK_FALSE(small_gemm_applies(false, false, 0, 128));
  // Mostly empty vectors: B [K, N] with N under 16, B [N, K] with K under 8.
  CHECK(small_gemm_applies(false, false, 1024, 16));
  CHECK_FALSE(small_gemm_applies(false, false, 1024, 15));
  CHECK(small_gemm_applies(false, true, 8, 2048));
  CHECK_FALSE(small_gemm_applies(false, true, 7, 2048));
  rt::cpu::DeterministicBlas training;
  CHECK_FALSE(small_gemm_applies(false, false, 96, 128));
  CHECK_FALSE(small_gemm_applies(false, true, 96, 128));
}

TEST_CASE("a Gemm node with a small B runs through small_gemm", "[gemm_small]") {
  if (rt::cpu::small_gemm_isa() == SmallGemmIsa::Scalar) {
    WARN("not exercised: this CPU lacks AVX2 and FMA, where products stay with OpenBLAS");
    return;
  }
  for (const int64_t trans_b : {0, 1}) {
    INFO("transB " << trans_b);
    const int64_t m = 3, k = 96, n = 20;
    const Tensor a = test::random_tensor({m, k}, 41);
    const Tensor b = test::random_tensor(trans_b ? Shape{n, k} : Shape{k, n}, 42);
    const Tensor c = test::random_tensor({n}, 43);
    const std::vector<Tensor> got =
        test::run_node("Gemm", {a, b, c},
                       {ir::Attribute::make_int("transB", trans_b), ir::Attribute::make_float("alpha", 0.5f),
                        ir::Attribute::make_float("beta", 2.0f)},
                       1, 17, 2);
    // The kernel's path: Y = beta * C broadcast, then alpha * A * op(B) + 1 * Y.
    std::vector<float> want(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) want[static_cast<size_t>(i * n + j)] = 2.0f * c.data<float>()[j];
    rt::cpu::small_gemm_ref(trans_b != 0, 0, m, n, k, 0.5f, a.data<float>(), k, b.data<float>(), trans_b ? k : n, 1.0f,
                            want.data(), n);
    REQUIRE(got[0].numel() == m * n);
    CHECK(std::memcmp(got[0].data<float>(), want.data(), want.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("MatMul with a small B runs through small_gemm, per batch entry and with B shared", "[gemm_small]") {
  if (rt::cpu::small_gemm_isa() == SmallGemmIsa::Scalar) {
    WARN("not exercised: this CPU lacks AVX2 and FMA, where products stay with OpenBLAS");
    return;
  }
  // Attention's per-head products ([2, 3, 5, 16] x [2, 3, 16, 17]) and a projection whose B is
  // shared by every row ([2, 5, 16] x [16, 17], one GEMM of 10 rows).
  const int64_t n = 17;
  const Tensor a = test::random_tensor({2, 3, 5, 16}, 61);
  const Tensor b = test::random_tensor({2, 3, 16, n}, 62);
  const std::vector<Tensor> heads = test::run_node("MatMul", {a, b}, {}, 1, 17, 2);
  REQUIRE(heads[0].shape() == Shape{2, 3, 5, n});
  std::vector<float> want(static_cast<size_t>(6 * 5 * n));
  for (int64_t t = 0; t < 6; ++t)
    rt::cpu::small_gemm_ref(false, 0, 5, n, 16, 1.0f, a.data<float>() + t * 5 * 16, 16, b.data<float>() + t * 16 * n, n,
                            0.0f, want.data() + t * 5 * n, n);
  CHECK(std::memcmp(heads[0].data<float>(), want.data(), want.size() * sizeof(float)) == 0);

  const Tensor rows = test::random_tensor({2, 5, 16}, 63);
  const Tensor shared = test::random_tensor({16, n}, 64);
  const std::vector<Tensor> projected = test::run_node("MatMul", {rows, shared}, {}, 1, 17, 2);
  std::vector<float> want_rows(static_cast<size_t>(10 * n));
  rt::cpu::small_gemm_ref(false, 0, 10, n, 16, 1.0f, rows.data<float>(), 16, shared.data<float>(), n, 0.0f,
                          want_rows.data(), n);
  CHECK(std::memcmp(projected[0].data<float>(), want_rows.data(), want_rows.size() * sizeof(float)) == 0);
}
