// The kernel thread pool (OpenMP) and the GEMMs split over it: every index of a loop runs exactly
// once at 1-4 threads, chunks respect the grain, a nested loop runs inline on the calling thread,
// the first exception of a chunk reaches the caller and the pool stays usable; blas_gemm_split and
// blas_gemm_rows against a naive float64 product for odd shapes, both transposes, splits along M
// and along N, at 1-3 threads, and the same bits as one unsplit GEMM on each piece;
// blas_gemm_split_bias against setting C to the bias first. OpenBLAS's
// kernel set after a pool exists: never its SSE3 fall-back on a CPU with AVX, and its GEMMs still
// right after the switch.
#include <catch2/catch.hpp>

#include <cblas.h>
#include <omp.h>
#include <strings.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "runtime/blas_kernels.h"
#include "runtime/cpu/conv_common.h"
#include "runtime/thread_pool.h"

using namespace mpq;

TEST_CASE("parallel_for covers every index once, in chunks of at least the grain", "[thread_pool]") {
  for (int threads : {1, 2, 3, 4}) {
    rt::ThreadPool pool(threads);
    REQUIRE(pool.size() == threads);
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{1001}}) {
      for (int64_t grain : {int64_t{1}, int64_t{5}, int64_t{300}}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        // Catch2's assertions are not thread-safe: chunks count what they see, the test checks after.
        std::atomic<int> short_chunks{0}, empty_chunks{0};
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
          if (b >= e) ++empty_chunks;
          if (e - b < grain && e != n) ++short_chunks;  // only the last chunk may be short
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        });
        for (int64_t i = 0; i < n; ++i) REQUIRE(hits[static_cast<size_t>(i)].load() == 1);
        REQUIRE(short_chunks.load() == 0);
        REQUIRE(empty_chunks.load() == 0);
      }
    }
    pool.parallel_for(0, 1, [&](int64_t, int64_t) { FAIL("an empty loop runs nothing"); });
  }
}

TEST_CASE("FunctionRef calls the callable it refers to, without copying it", "[thread_pool]") {
  // A lambda capturing more than std::function's inline buffer holds, a mutable one whose state
  // must change in place (a copy would leave it untouched), a return value, a named callable.
  int64_t a = 1, b = 2, c = 3, d = 4, e = 5;
  int64_t seen = 0;
  auto wide = [&](int64_t lo, int64_t hi) { seen += (hi - lo) * (a + b + c + d + e); };
  rt::FunctionRef<void(int64_t, int64_t)> ref(wide);
  ref(0, 3);
  ref(5, 6);
  CHECK(seen == 4 * 15);
  int calls = 0;
  auto counting = [calls](int task) mutable { return calls += task; };
  rt::FunctionRef<int(int)> counter(counting);
  CHECK(counter(2) == 2);
  CHECK(counter(5) == 7);
  CHECK(counting(1) == 8);  // the referred lambda itself was updated
  rt::FunctionRef<void(int)> dropping(counting);  // a result dropped, as std::function<void(int)> does
  dropping(2);
  CHECK(counting(0) == 10);
  struct Twice {
    int operator()(int x) const { return 2 * x; }
  } twice;
  CHECK(rt::FunctionRef<int(int)>(twice)(21) == 42);
  // Through the pool, a loop body with many captures sums every index once.
  rt::ThreadPool pool(2);
  std::vector<int64_t> hits(1000, 0);
  pool.parallel_for(1000, 7, [&, a, b, c, d, e](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) hits[static_cast<size_t>(i)] += a + b + c + d + e - 14;
  });
  CHECK(std::count(hits.begin(), hits.end(), 1) == 1000);
}

TEST_CASE("parallel_for runs on a team of the pool's size, and a nested loop runs inline", "[thread_pool]") {
  rt::ThreadPool pool(2);
  REQUIRE_FALSE(rt::ThreadPool::inside_parallel_loop());
  std::atomic<int> wrong_team{0}, outside{0}, nested_off_thread{0}, nested_items{0};
  pool.parallel_for(64, 1, [&](int64_t, int64_t) {
    if (omp_get_num_threads() != 2) ++wrong_team;
    if (!rt::ThreadPool::inside_parallel_loop()) ++outside;
    const int me = omp_get_thread_num();
    pool.parallel_for(8, 1, [&](int64_t b, int64_t e) {
      if (omp_get_thread_num() != me || omp_get_num_threads() != 2) ++nested_off_thread;
      nested_items += static_cast<int>(e - b);
    });
  });
  REQUIRE(wrong_team.load() == 0);
  REQUIRE(outside.load() == 0);
  REQUIRE(nested_off_thread.load() == 0);
  REQUIRE(nested_items.load() == 8 * 8);  // 8 outer chunks, each ran its nested loop whole
  REQUIRE_FALSE(rt::ThreadPool::inside_parallel_loop());
  // A loop of a single chunk never starts a team.
  pool.parallel_for(3, 10, [&](int64_t b, int64_t e) {
    if (omp_in_parallel() || b != 0 || e != 3) ++wrong_team;
  });
  REQUIRE(wrong_team.load() == 0);
}

TEST_CASE("an exception in a chunk reaches the caller and the pool stays usable", "[thread_pool]") {
  for (int threads : {1, 3}) {
    rt::ThreadPool pool(threads);
    REQUIRE_THROWS_WITH(pool.parallel_for(100, 1,
                                          [&](int64_t b, int64_t e) {
                                            if (b <= 42 && 42 < e) throw std::runtime_error("chunk 42 failed");
                                          }),
                        "chunk 42 failed");
    std::atomic<int64_t> sum{0};
    pool.parallel_for(100, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    });
    REQUIRE(sum.load() == 4950);
    REQUIRE_FALSE(rt::ThreadPool::inside_parallel_loop());
  }
}

TEST_CASE("run_per_thread runs task i on team thread i, every task once, inline when nested", "[thread_pool]") {
  for (int threads : {1, 2, 3}) {
    rt::ThreadPool pool(threads);
    for (int n : {1, 2, 3}) {
      INFO(threads << " threads, " << n << " tasks");
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> off_thread{0};
      pool.run_per_thread(n, [&](int task) {
        hits[static_cast<size_t>(task)]++;
        // Task i on thread i whenever OpenMP gave a thread per task (it may give fewer, e.g. with
        // OMP_DYNAMIC; then a thread takes every team-th task).
        if (n > 1 && omp_get_num_threads() == n && omp_get_thread_num() != task) ++off_thread;
      });
      for (int i = 0; i < n; ++i) REQUIRE(hits[static_cast<size_t>(i)].load() == 1);
      REQUIRE(off_thread.load() == 0);
    }
  }
  rt::ThreadPool pool(2);
  std::atomic<int> nested_off_thread{0}, nested_tasks{0};
  pool.parallel_for(4, 1, [&](int64_t, int64_t) {
    const int me = omp_get_thread_num();
    pool.run_per_thread(2, [&](int) {
      if (omp_get_thread_num() != me) ++nested_off_thread;
      ++nested_tasks;
    });
  });
  REQUIRE(nested_off_thread.load() == 0);
  REQUIRE(nested_tasks.load() == 8);
  REQUIRE_THROWS_WITH(pool.run_per_thread(2,
                                          [](int task) {
                                            if (task == 1) throw std::runtime_error("task 1 failed");
                                          }),
                      "task 1 failed");
  REQUIRE_FALSE(rt::ThreadPool::inside_parallel_loop());
}

namespace {

// C = alpha * op(A) * op(B) + beta * C0 in float64, row-major with leading dimensions.
std::vector<double> naive_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                               const std::vector<float>& a, int64_t lda, const std::vector<float>& b, int64_t ldb,
                               float beta, const std::vector<float>& c0, int64_t ldc) {
  std::vector<double> c(c0.begin(), c0.end());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? a[static_cast<size_t>(p * lda + i)] : a[static_cast<size_t>(i * lda + p)];
        const double bv = tb ? b[static_cast<size_t>(j * ldb + p)] : b[static_cast<size_t>(p * ldb + j)];
        s += av * bv;
      }
      double& out = c[static_cast<size_t>(i * ldc + j)];
      out = alpha * s + beta * out;
    }
  return c;
}

}  // namespace

TEST_CASE("GEMMs split over the pool match a float64 product at any thread count", "[thread_pool][gemm]") {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  struct Case {
    int64_t m, n, k;
  };
  // Above the split threshold (M*N*K > 262144): long M (split by rows), long N (by columns), a
  // square one with ragged pieces; and one below it (never split).
  const Case cases[] = {{301, 37, 41}, {19, 517, 45}, {97, 101, 103}, {13, 11, 7}};
  for (const Case& cs : cases) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool ta = (variant & 1) != 0, tb = (variant & 2) != 0;
      const int64_t lda = (ta ? cs.m : cs.k) + 3, ldb = (tb ? cs.k : cs.n) + 2, ldc = cs.n + 5;
      std::vector<float> a(static_cast<size_t>((ta ? cs.k : cs.m) * lda)), b(static_cast<size_t>((tb ? cs.n : cs.k) * ldb)),
          c0(static_cast<size_t>(cs.m * ldc));
      for (float& v : a) v = u(rng);
      for (float& v : b) v = u(rng);
      for (float& v : c0) v = u(rng);
      const float alpha = 0.75f, beta = variant == 3 ? 0.f : 0.5f;
      const std::vector<double> want = naive_gemm(ta, tb, cs.m, cs.n, cs.k, alpha, a, lda, b, ldb, beta, c0, ldc);
      for (int threads : {1, 2, 3}) {
        rt::ThreadPool pool(threads);
        for (int rows_api = 0; rows_api < 2; ++rows_api) {
          std::vector<float> c = c0;
          if (rows_api)
            rt::cpu::blas_gemm_rows(pool, ta, tb, cs.m, cs.n, cs.k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
          else
            rt::cpu::blas_gemm_split(pool, ta, tb, cs.m, cs.n, cs.k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(),
                                     ldc);
          INFO("m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " ta=" << ta << " tb=" << tb << " threads=" << threads);
          double worst = 0;
          for (int64_t i = 0; i < cs.m; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
              const size_t at = static_cast<size_t>(i * ldc + j);
              // Padding columns past N are never written.
              if (j >= cs.n) REQUIRE(c[at] == c0[at]);
              else worst = std::max(worst, std::abs(c[at] - want[at]));
            }
          REQUIRE(worst < 1e-4 * static_cast<double>(cs.k));
        }
      }
    }
  }
}

TEST_CASE("a split GEMM that sets C to a bias per row gives the bits of setting C first", "[thread_pool][gemm]") {
  // blas_gemm_split_bias sets each piece's part of C to the bias on the thread that then sums into
  // it; the result must be what setting all of C and one blas_gemm_split with beta 1 give (the same
  // pieces), and, without a bias, what beta 0 gives. Columns past N are never written.
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  struct Case {
    int64_t m, n, k;
  };
  // Split by rows, by columns (U-Net's 1x1 convolution after its Resize: 16 x 1024 x 32; and one
  // 6x larger, still split should the threshold of 262,144 multiply-adds grow), ragged pieces, and
  // below the split threshold.
  const Case cases[] = {{601, 37, 61}, {16, 1024, 32}, {16, 4096, 48}, {97, 101, 103}, {13, 11, 7}};
  for (const Case& cs : cases) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool ta = (variant & 1) != 0, tb = (variant & 2) != 0;
      const int64_t lda = (ta ? cs.m : cs.k) + 1, ldb = (tb ? cs.k : cs.n) + 3, ldc = cs.n + 2;
      std::vector<float> a(static_cast<size_t>((ta ? cs.k : cs.m) * lda)), b(static_cast<size_t>((tb ? cs.n : cs.k) * ldb)),
          bias(static_cast<size_t>(cs.m)), c0(static_cast<size_t>(cs.m * ldc));
      for (float& v : a) v = u(rng);
      for (float& v : b) v = u(rng);
      for (float& v : bias) v = u(rng);
      for (float& v : c0) v = u(rng);  // stale values: must not leak into the result
      const std::vector<float> zeros(c0.size(), 0.f);
      const std::vector<double> want = naive_gemm(ta, tb, cs.m, cs.n, cs.k, 1.f, a, lda, b, ldb, 0.f, zeros, ldc);
      for (int threads : {1, 2, 3}) {
        rt::ThreadPool pool(threads);
        for (int deterministic = 0; deterministic < 2; ++deterministic) {
          INFO("m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " ta=" << ta << " tb=" << tb << " threads=" << threads
                    << " deterministic=" << deterministic);
          std::unique_ptr<rt::cpu::DeterministicBlas> scope;
          if (deterministic) scope = std::make_unique<rt::cpu::DeterministicBlas>();
          std::vector<float> filled = c0, fused = c0, plain = c0, unbiased = c0;
          for (int64_t i = 0; i < cs.m; ++i)
            std::fill(filled.begin() + i * ldc, filled.begin() + i * ldc + cs.n, bias[static_cast<size_t>(i)]);
          rt::cpu::blas_gemm_split(pool, ta, tb, cs.m, cs.n, cs.k, 1.f, a.data(), lda, b.data(), ldb, 1.f, filled.data(),
                                   ldc);
          rt::cpu::blas_gemm_split_bias(pool, ta, tb, cs.m, cs.n, cs.k, a.data(), lda, b.data(), ldb, bias.data(),
                                        fused.data(), ldc);
          REQUIRE(fused == filled);
          rt::cpu::blas_gemm_split(pool, ta, tb, cs.m, cs.n, cs.k, 1.f, a.data(), lda, b.data(), ldb, 0.f, plain.data(),
                                   ldc);
          rt::cpu::blas_gemm_split_bias(pool, ta, tb, cs.m, cs.n, cs.k, a.data(), lda, b.data(), ldb, nullptr,
                                        unbiased.data(), ldc);
          REQUIRE(unbiased == plain);
          double worst = 0;
          for (int64_t i = 0; i < cs.m; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
              const size_t at = static_cast<size_t>(i * ldc + j);
              if (j >= cs.n) {
                REQUIRE(fused[at] == c0[at]);
                REQUIRE(unbiased[at] == c0[at]);
              } else {
                worst = std::max(worst, std::abs(fused[at] - (want[at] + bias[static_cast<size_t>(i)])));
              }
            }
          REQUIRE(worst < 1e-4 * static_cast<double>(cs.k));
        }
      }
    }
  }
}

TEST_CASE("the float64 split GEMM with a bias per row gives the bits of setting C first", "[thread_pool][gemm]") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  // By rows and by columns, on two threads.
  for (const auto& [m, n, k] : {std::array<int64_t, 3>{301, 37, 41}, std::array<int64_t, 3>{16, 1024, 32}}) {
    const int64_t ldc = n + 1;
    std::vector<double> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), bias(static_cast<size_t>(m)),
        c0(static_cast<size_t>(m * ldc));
    for (double& v : a) v = u(rng);
    for (double& v : b) v = u(rng);
    for (double& v : bias) v = u(rng);
    for (double& v : c0) v = u(rng);
    rt::ThreadPool pool(2);
    std::vector<double> filled = c0, fused = c0;
    for (int64_t i = 0; i < m; ++i)
      std::fill(filled.begin() + i * ldc, filled.begin() + i * ldc + n, bias[static_cast<size_t>(i)]);
    rt::cpu::blas_gemm_split(pool, false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 1.0, filled.data(), ldc);
    rt::cpu::blas_gemm_split_bias(pool, false, false, m, n, k, a.data(), k, b.data(), n, bias.data(), fused.data(), ldc);
    INFO("m=" << m << " n=" << n << " k=" << k);
    REQUIRE(fused == filled);
    REQUIRE(fused != c0);
  }
}

TEST_CASE("a GEMM split inside a parallel loop runs as one call on that thread", "[thread_pool][gemm]") {
  // Same bits as a direct one-thread GEMM: the split is skipped, not run with other pieces.
  const int64_t m = 64, n = 96, k = 80;
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (float& v : a) v = u(rng);
  for (float& v : b) v = u(rng);
  // The pool first: it puts OpenBLAS on the calling thread (threaded, OpenBLAS rounds differently).
  rt::ThreadPool pool(2);
  std::vector<float> direct(static_cast<size_t>(m * n)), nested(static_cast<size_t>(m * n));
  rt::cpu::blas_gemm(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, direct.data(), n);
  pool.parallel_for(2, 1, [&](int64_t lo, int64_t) {
    if (lo == 0)
      rt::cpu::blas_gemm_split(pool, false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, nested.data(), n);
  });
  REQUIRE(nested == direct);
}

namespace {

// cblas_sgemm against a float64 product, both transposes: one small shape (OpenBLAS's small-matrix
// kernels) and one past its blocking sizes, which the kernel set's init() sets.
void check_sgemm(int64_t m, int64_t n, int64_t k) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int variant = 0; variant < 4; ++variant) {
    const bool ta = (variant & 1) != 0, tb = (variant & 2) != 0;
    const int64_t lda = ta ? m : k, ldb = tb ? k : n;
    std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), c(static_cast<size_t>(m * n), 0.f);
    for (float& v : a) v = dist(rng);
    for (float& v : b) v = dist(rng);
    const std::vector<double> want = naive_gemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, 0.f, c, n);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
                static_cast<int>(n), static_cast<int>(k), 1.f, a.data(), static_cast<int>(lda), b.data(),
                static_cast<int>(ldb), 0.f, c.data(), static_cast<int>(n));
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(c[i] - want[i]));
    INFO("sgemm " << m << "x" << n << "x" << k << " ta " << ta << " tb " << tb);
    REQUIRE(worst <= 2e-6 * static_cast<double>(k));
  }
}

}  // namespace

TEST_CASE("OpenBLAS runs the kernels this CPU's features allow once a pool exists", "[thread_pool][gemm]") {
  rt::ThreadPool pool(1);
  const rt::BlasKernels& k = rt::ensure_blas_kernels();
  INFO("detected " << k.detected << ", active " << k.active << " (" << k.reason << ")");
  REQUIRE(&k == &rt::ensure_blas_kernels());  // selected once
  REQUIRE(k.active == openblas_get_corename());
  REQUIRE(!k.reason.empty());
  const std::string wanted = rt::blas_kernels_for_this_cpu();
  const bool user_choice = std::getenv("OPENBLAS_CORETYPE") != nullptr;
  if (!user_choice && !wanted.empty() && !k.detected.empty()) {
    // OpenBLAS's own pick is kept unless it was the fall-back for an unknown model; that one is
    // replaced by the set the features allow.
    REQUIRE(strcasecmp(k.active.c_str(), "Prescott") != 0);
    if (strcasecmp(k.detected.c_str(), "Prescott") == 0) {
      REQUIRE(strcasecmp(k.active.c_str(), wanted.c_str()) == 0);
    } else {
      REQUIRE(k.active == k.detected);
    }
  }
  check_sgemm(37, 53, 29);
  check_sgemm(300, 260, 520);

  const std::string before = openblas_get_corename();
  // The fall-back on any machine: select Prescott through OpenBLAS's own entry points, as it does
  // for a model it does not know, then repair it; the repaired kernels compute.
  if (user_choice || wanted.empty() || rt::switch_blas_kernels("Prescott").empty()) {
    WARN("the fall-back repair is not exercised: OPENBLAS_CORETYPE set, no AVX, or no run-time kernel selection");
    return;
  }
  REQUIRE(strcasecmp(openblas_get_corename(), "Prescott") == 0);
  check_sgemm(37, 53, 29);
  const rt::BlasKernels repaired = rt::select_blas_kernels();
  INFO("repaired: detected " << repaired.detected << ", active " << repaired.active << " (" << repaired.reason << ")");
  REQUIRE(strcasecmp(repaired.detected.c_str(), "Prescott") == 0);
  REQUIRE(strcasecmp(repaired.active.c_str(), wanted.c_str()) == 0);
  REQUIRE(std::getenv("OPENBLAS_CORETYPE") == nullptr);  // not left for child processes
  check_sgemm(300, 260, 520);
  if (strcasecmp(before.c_str(), repaired.active.c_str()) != 0)  // leave the process as it was
    REQUIRE(rt::switch_blas_kernels(before) == before);
  REQUIRE(before == openblas_get_corename());
}
