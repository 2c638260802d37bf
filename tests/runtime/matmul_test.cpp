// Gemm and MatMul against the scalar references (and the references against hand-computed values):
// transposes, alpha/beta, every C broadcast, legacy opsets, 1-D promotion, batch broadcasting,
// float32 / float64 / integer types; malformed nodes rejected.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/blas_kernels.h"
#include "runtime/cpu/conv_onednn.h"
#include "runtime/cpu/matmul_onednn.h"
#include "runtime/cpu/reference.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;

namespace {

using Attrs = std::vector<ir::Attribute>;

std::vector<Tensor> run_node(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                             int opset = 17, int threads = 2) {
  return test::run_node(op, inputs, attrs, 1, opset, threads);
}

void check_close(const Tensor& got, const Tensor& want, double rel = 1e-4) {
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(shape_str(got.shape()) == shape_str(want.shape()));
  double scale = 1.0;
  for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::fabs(want.get_double(i)));
  CHECK(test::max_abs_diff(got, want) <= rel * scale);
}

// Seeded small integers in [-9, 9] of the given type.
Tensor random_ints(const Shape& shape, uint32_t seed, DType dtype) {
  Tensor f = test::random_tensor(shape, seed, -9.5f, 9.5f);
  Tensor t(DType::Int64, shape);
  for (int64_t i = 0; i < f.numel(); ++i) t.data<int64_t>()[i] = static_cast<int64_t>(std::lround(f.data<float>()[i]));
  if (dtype == DType::UInt32 || dtype == DType::UInt64)
    for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = std::abs(t.data<int64_t>()[i]);
  return t.cast_to(dtype);
}

}  // namespace

TEST_CASE("gemm_ref and matmul_ref match hand-computed values", "[matmul][reference]") {
  Tensor a = Tensor::from<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::from<float>({3, 2}, {7, 8, 9, 10, 11, 12});
  Tensor c = Tensor::from<float>({2}, {100, 200});
  Tensor y = rt::cpu::gemm_ref(a, b, &c, 2.0, 0.5, false, false);
  // A*B = [[58, 64], [139, 154]]
  CHECK(y.data<float>()[0] == Approx(2 * 58 + 50));
  CHECK(y.data<float>()[1] == Approx(2 * 64 + 100));
  CHECK(y.data<float>()[2] == Approx(2 * 139 + 50));
  CHECK(y.data<float>()[3] == Approx(2 * 154 + 100));
  Tensor yt = rt::cpu::gemm_ref(b, a, nullptr, 1.0, 0.0, true, true);  // B^T A^T = (AB)^T
  CHECK(yt.data<float>()[1] == Approx(139));
  Tensor m = rt::cpu::matmul_ref(Tensor::from<float>({3}, {1, 2, 3}), b);
  REQUIRE(m.shape() == Shape{2});
  CHECK(m.data<float>()[0] == Approx(58));
  Tensor mi = rt::cpu::matmul_ref(a.cast_to(DType::Int32), b.cast_to(DType::Int32));
  CHECK(mi.data<int32_t>()[3] == 154);
}

TEST_CASE("Gemm matches the reference", "[matmul][gemm]") {
  uint32_t seed = 1;
  struct Case {
    int64_t m, n, k;
    bool ta, tb;
    float alpha, beta;
    Shape c;  // empty: no C
  };
  std::vector<Case> cases = {
      {3, 5, 7, false, false, 1.0f, 1.0f, {3, 5}},  {5, 3, 7, true, false, 0.5f, 2.0f, {3}},
      {7, 5, 3, false, true, -1.5f, 1.0f, {7, 1}},   {13, 1, 5, true, true, 1.0f, 0.25f, {1}},
      {1, 13, 5, false, false, 2.0f, 1.0f, {}},      {5, 7, 3, false, false, 1.0f, -1.0f, {1, 7}},
      {3, 3, 3, true, false, 1.0f, 0.0f, {3, 3}},    {1, 1, 1, false, false, 1.0f, 1.0f, {}},
      {70, 90, 110, false, true, 1.0f, 1.0f, {90}},  {65, 80, 129, true, true, 0.75f, 1.5f, {65, 80}},
  };
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const Case& c : cases) {
      INFO("M=" << c.m << " N=" << c.n << " K=" << c.k << " transA=" << c.ta << " transB=" << c.tb << " alpha=" << c.alpha
                << " beta=" << c.beta << " C=" << shape_str(c.c) << " " << dtype_name(dtype));
      Tensor a = test::random_tensor(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, seed++).cast_to(dtype);
      Tensor b = test::random_tensor(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, seed++).cast_to(dtype);
      Tensor cc = c.c.empty() ? Tensor() : test::random_tensor(c.c, seed++).cast_to(dtype);
      Attrs attrs{ir::Attribute::make_int("transA", c.ta), ir::Attribute::make_int("transB", c.tb),
                  ir::Attribute::make_float("alpha", c.alpha), ir::Attribute::make_float("beta", c.beta)};
      std::vector<Tensor> ins{a, b};
      if (cc.defined()) ins.push_back(cc);
      Tensor got = run_node("Gemm", ins, attrs)[0];
      check_close(got, rt::cpu::gemm_ref(a, b, cc.defined() ? &cc : nullptr, c.alpha, c.beta, c.ta, c.tb));
    }
  }
}

TEST_CASE("Gemm scalar C, legacy opsets and integer types", "[matmul][gemm]") {
  Tensor a = test::random_tensor({4, 3}, 50);
  Tensor b = test::random_tensor({3, 5}, 51);
  Tensor c = Tensor::scalar<float>(0.5f);
  check_close(run_node("Gemm", {a, b, c}, {})[0], rt::cpu::gemm_ref(a, b, &c, 1, 1, false, false));
  // Opset 6 with the legacy broadcast attribute, and opset 1.
  Tensor cv = test::random_tensor({5}, 52);
  check_close(run_node("Gemm", {a, b, cv}, {ir::Attribute::make_int("broadcast", 1)}, 6)[0],
              rt::cpu::gemm_ref(a, b, &cv, 1, 1, false, false));
  Tensor cf = test::random_tensor({4, 5}, 53);
  check_close(run_node("Gemm", {a, b, cf}, {ir::Attribute::make_float("beta", 2.0f)}, 1)[0],
              rt::cpu::gemm_ref(a, b, &cf, 1, 2, false, false));
  for (DType dtype : {DType::Int32, DType::Int64, DType::UInt32, DType::UInt64}) {
    INFO(dtype_name(dtype));
    Tensor ai = random_ints({5, 7}, 60, dtype), bi = random_ints({5, 3}, 61, dtype), ci = random_ints({3}, 62, dtype);
    Tensor got = run_node("Gemm", {ai, bi, ci}, {ir::Attribute::make_int("transA", 1), ir::Attribute::make_float("alpha", 2.0f)})[0];
    Tensor want = rt::cpu::gemm_ref(ai, bi, &ci, 2, 1, true, false);
    REQUIRE(got.dtype() == dtype);
    REQUIRE(got.shape() == want.shape());
    for (int64_t i = 0; i < got.numel(); ++i) CHECK(got.get_int64(i) == want.get_int64(i));
  }
}

TEST_CASE("Gemm rejects malformed nodes", "[matmul][gemm][negative]") {
  Tensor a = test::random_tensor({4, 3}, 1);
  Tensor b = test::random_tensor({3, 5}, 2);
  CHECK_THROWS_AS(run_node("Gemm", {a, test::random_tensor({4, 5}, 3)}, {}), Error);  // K mismatch
  CHECK_THROWS_AS(run_node("Gemm", {a, b, test::random_tensor({3, 5}, 4)}, {}), Error);  // C not broadcastable
  CHECK_THROWS_AS(run_node("Gemm", {a, b, test::random_tensor({2, 4, 5}, 4)}, {}), Error);  // C rank 3
  CHECK_THROWS_AS(run_node("Gemm", {test::random_tensor({2, 4, 3}, 5), b}, {}), Error);  // A rank 3
  CHECK_THROWS_AS(run_node("Gemm", {a, b.cast_to(DType::Float64)}, {}), Error);  // mixed types
  CHECK_THROWS_AS(run_node("Gemm", {a.cast_to(DType::Bool), b.cast_to(DType::Bool)}, {}), Error);
}

TEST_CASE("MatMul matches the reference", "[matmul]") {
  uint32_t seed = 100;
  struct Case {
    Shape a, b;
  };
  std::vector<Case> cases = {
      {{3, 5}, {5, 7}},                 // plain 2-D
      {{5}, {5, 7}},                    // 1-D left
      {{3, 5}, {5}},                    // 1-D right
      {{5}, {5}},                       // dot product
      {{2, 3, 5}, {5, 7}},              // batched A, shared B: folded into one GEMM
      {{3, 5}, {4, 5, 7}},              // batched B, shared A
      {{2, 1, 3, 5}, {1, 3, 5, 7}},     // broadcast both ways
      {{3, 1, 5}, {3, 5, 1}},           // N=1, M=1 per batch
      {{7}, {2, 3, 7, 5}},              // 1-D left against batched B
      {{2, 3, 7, 5}, {5}},              // batched A against 1-D right
      {{1, 13, 1, 9}, {5, 1, 9, 3}},    // size-1 batch dims on both sides
      {{4, 64, 96}, {4, 96, 80}},       // large enough to use BLAS threads per batch
      {{3, 0, 5}, {5, 4}},              // empty M
      {{3, 4, 0}, {0, 2}},              // empty K: zeros
  };
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const Case& c : cases) {
      INFO("A " << shape_str(c.a) << " B " << shape_str(c.b) << " " << dtype_name(dtype));
      Tensor a = test::random_tensor(c.a, seed++).cast_to(dtype);
      Tensor b = test::random_tensor(c.b, seed++).cast_to(dtype);
      check_close(run_node("MatMul", {a, b}, {})[0], rt::cpu::matmul_ref(a, b));
    }
  }
  for (DType dtype : {DType::Int32, DType::Int64, DType::UInt32, DType::UInt64}) {
    for (const Case& c : {Case{{2, 3, 5}, {5, 7}}, Case{{7}, {2, 3, 7, 5}}, Case{{3, 1, 5}, {2, 1, 5, 4}}}) {
      INFO("A " << shape_str(c.a) << " B " << shape_str(c.b) << " " << dtype_name(dtype));
      Tensor a = random_ints(c.a, seed++, dtype), b = random_ints(c.b, seed++, dtype);
      Tensor got = run_node("MatMul", {a, b}, {})[0];
      Tensor want = rt::cpu::matmul_ref(a, b);
      REQUIRE(got.shape() == want.shape());
      REQUIRE(got.dtype() == dtype);
      for (int64_t i = 0; i < got.numel(); ++i) CHECK(got.get_int64(i) == want.get_int64(i));
    }
  }
}

TEST_CASE("MatMul single-threaded and the executor's float16 path", "[matmul]") {
  Tensor a = test::random_tensor({6, 9, 11}, 300);
  Tensor b = test::random_tensor({6, 11, 4}, 301);
  check_close(run_node("MatMul", {a, b}, {}, 17, 1)[0], rt::cpu::matmul_ref(a, b));
  Tensor ah = a.cast_to(DType::Float16), bh = b.cast_to(DType::Float16);
  Tensor got = run_node("MatMul", {ah, bh}, {})[0];
  REQUIRE(got.dtype() == DType::Float16);
  Tensor want = rt::cpu::matmul_ref(ah.cast_to(DType::Float32), bh.cast_to(DType::Float32));
  check_close(got.cast_to(DType::Float32), want, 2e-3);
}

TEST_CASE("MatMul rejects malformed nodes", "[matmul][negative]") {
  CHECK_THROWS_AS(run_node("MatMul", {test::random_tensor({3, 4}, 1), test::random_tensor({5, 2}, 2)}, {}), Error);
  CHECK_THROWS_AS(run_node("MatMul", {test::random_tensor({2, 3, 4}, 1), test::random_tensor({3, 4, 2}, 2)}, {}), Error);
  CHECK_THROWS_AS(run_node("MatMul", {test::random_tensor({4}, 1), test::random_tensor({5}, 2)}, {}), Error);
  CHECK_THROWS_AS(run_node("MatMul", {Tensor::scalar<float>(1.0f), test::random_tensor({1, 2}, 2)}, {}), Error);
  CHECK_THROWS_AS(run_node("MatMul", {test::random_tensor({3, 4}, 1), test::random_tensor({4, 2}, 2).cast_to(DType::Float64)}, {}),
                  Error);
}

namespace {

// mpq::MatMulBias with B and the bias as initializers (as passes/fuse_matmul_bias leaves them), run
// by one executor on each A in turn (A's leading dimensions may change between runs).
std::vector<Tensor> run_matmul_bias_each(const std::vector<Tensor>& as, const Tensor& b, const Tensor& bias,
                                         int threads) {
  ir::Model m;
  m.set_opset("", 17);
  m.set_opset("mpq", 1);
  ir::Graph& g = *m.graph;
  ir::Value* av = g.add_value("a");
  g.add_input(av);
  ir::Value* bv = g.add_initializer("b", b);
  ir::Value* cv = g.add_initializer("bias", bias);
  ir::Value* y = g.add_value("y");
  g.add_output(y);
  g.add_node("MatMulBias", {av, bv, cv}, {y}, "mm", "mpq");
  rt::ExecOptions o;
  o.threads = threads;
  rt::Executor ex(m, o);
  std::vector<Tensor> outs;
  for (const Tensor& a : as) outs.push_back(ex.run({{"a", a}}).at(0));
  return outs;
}

// The same A twice (the second run reuses the packed B).
std::vector<Tensor> run_matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, int threads) {
  return run_matmul_bias_each({a, a}, b, bias, threads);
}

// Y = A B + bias in float64.
std::vector<double> matmul_bias_ref(const Tensor& a, const Tensor& b, const Tensor& bias) {
  const int64_t K = b.dim(0), N = b.dim(1), M = a.numel() / K;
  std::vector<double> y(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = bias.get_double(bias.numel() == 1 ? 0 : j);
      for (int64_t k = 0; k < K; ++k) s += a.get_double(i * K + k) * b.get_double(k * N + j);
      y[static_cast<size_t>(i * N + j)] = s;
    }
  return y;
}

}  // namespace

TEST_CASE("mpq::MatMulBias with constant B: oneDNN (packed once) and OpenBLAS match a float64 reference",
          "[matmul][onednn]") {
  struct Case {
    Shape a;
    int64_t n;
    bool scalar_bias;
    bool onednn;  // large enough for oneDNN, per-column bias, B over kSmallGemmMaxB
  };
  const std::vector<Case> cases = {{{8, 16, 128}, 192, false, true},  // a QKV projection (width 128) at batch 8
                                   {{3, 37, 131}, 135, false, true},  // odd sizes
                                   {{8, 16, 64}, 192, false, false},  // width 64: B small, mpq's own kernel
                                   {{111, 160}, 128, true, false},    // one bias for all: OpenBLAS
                                   {{111, 128}, 64, true, false},     // one bias for all, B small
                                   {{4, 8}, 8, false, false}};        // B small
  uint32_t seed = 40;
  for (const Case& c : cases)
    for (const int threads : {1, 2}) {
      INFO("A " << shape_str(c.a) << ", N " << c.n << ", " << threads << " thread(s)");
      const int64_t K = c.a.back();
      const Tensor a = test::random_tensor(c.a, seed++, -1.0f, 1.0f);
      const Tensor b = test::random_tensor({K, c.n}, seed++, -1.0f, 1.0f);
      const Tensor bias = test::random_tensor({c.scalar_bias ? 1 : c.n}, seed++, -1.0f, 1.0f);
      const std::vector<double> want = matmul_bias_ref(a, b, bias);
      const uint64_t before = rt::cpu::onednn_matmul_count(), packs_before = rt::cpu::onednn_matmul_pack_count();
      const auto got = run_matmul_bias(a, b, bias, threads);
      const uint64_t ran = rt::cpu::onednn_matmul_count() - before;
      const bool on = c.onednn && rt::cpu::onednn_enabled();
      CHECK(ran == (on ? 2u : 0u));
      CHECK(rt::cpu::onednn_matmul_pack_count() - packs_before == (on ? 1u : 0u));  // B packed once
      for (const Tensor& y : got) {
        REQUIRE(y.numel() == static_cast<int64_t>(want.size()));
        double worst = 0;
        for (int64_t i = 0; i < y.numel(); ++i)
          worst = std::max(worst, std::fabs(y.get_double(i) - want[static_cast<size_t>(i)]) / (1.0 + std::fabs(want[static_cast<size_t>(i)])));
        CHECK(worst < 1e-5);
      }
      CHECK(test::max_abs_diff(got[0], got[1]) == 0.0);  // the packed B is reused as it was
      // The same through OpenBLAS (oneDNN off): the two paths agree to float rounding.
      rt::cpu::ScopedOnednn off(rt::cpu::OnednnUse::Off);
      const auto blas = run_matmul_bias(a, b, bias, threads);
      CHECK(test::rel_l2(blas[0], got[0]) < 1e-6);
    }
}

TEST_CASE("mpq::MatMulBias goes to oneDNN from 48K multiply-adds where OpenBLAS runs without AVX-512 on an AVX-512 CPU",
          "[matmul][onednn]") {
  // An OPENBLAS_CORETYPE such as Haswell on an AVX-512 CPU (an AMD Zen 5 machine sets it): OpenBLAS's
  // sgemm runs at about half the CPU's speed, oneDNN at full speed. Simulated on any AVX-512 CPU by
  // switching OpenBLAS's kernel table; the process's kernels are restored after.
  test::BlasKernelSwitch blas;
  if (!blas.usable()) {
    WARN("not exercised: " << blas.why());
    return;
  }
  struct Case {
    int64_t m, k, n;
    bool onednn_below_cpu;  // with AVX2 kernels: oneDNN; with AVX-512 kernels every case is OpenBLAS's
  };
  // B over kSmallGemmMaxB (16K) throughout, except the last (mpq's own kernel either way).
  const std::vector<Case> cases = {{4, 128, 160, true}, {3, 130, 129, true}, {2, 130, 129, false}, {5, 3, 7, false}};
  uint32_t seed = 90;
  for (const char* kernels : {"Haswell", "SkylakeX"}) {
    REQUIRE(blas.to(kernels));
    const bool below = std::string(kernels) == "Haswell";
    CHECK(rt::blas_kernels_below_cpu() == below);
    for (const Case& c : cases) {
      INFO(kernels << " kernels, M " << c.m << ", K " << c.k << ", N " << c.n);
      const Tensor a = test::random_tensor({c.m, c.k}, seed++, -1.0f, 1.0f);
      const Tensor b = test::random_tensor({c.k, c.n}, seed++, -1.0f, 1.0f);
      const Tensor bias = test::random_tensor({c.n}, seed++, -1.0f, 1.0f);
      const uint64_t ran_before = rt::cpu::onednn_matmul_count();
      const auto got = run_matmul_bias(a, b, bias, 1);
      CHECK(rt::cpu::onednn_matmul_count() - ran_before == (below && c.onednn_below_cpu ? 2u : 0u));
      const std::vector<double> want = matmul_bias_ref(a, b, bias);
      double worst = 0;
      for (int64_t i = 0; i < got[0].numel(); ++i)
        worst = std::max(worst, std::fabs(got[0].get_double(i) - want[static_cast<size_t>(i)]) / (1.0 + std::fabs(want[static_cast<size_t>(i)])));
      CHECK(worst < 1e-5);
    }
  }
  CHECK(blas.restore());
}

TEST_CASE("mpq::MatMulBias on oneDNN: another batch size on the same node replans and stays right",
          "[matmul][onednn]") {
  // A transformer's projection (width 128, B over kSmallGemmMaxB) at batch 8, 3, 8, 5 tokens x 16
  // on one executor: each run must match the reference, whatever was planned and packed for the
  // run before.
  const Tensor b = test::random_tensor({128, 192}, 61, -1.0f, 1.0f);
  const Tensor bias = test::random_tensor({192}, 62, -1.0f, 1.0f);
  std::vector<Tensor> as;
  uint32_t seed = 63;
  for (const int64_t batch : {8, 3, 8, 5}) as.push_back(test::random_tensor({batch, 16, 128}, seed++, -1.0f, 1.0f));
  for (const int threads : {1, 2}) {
    INFO(threads << " thread(s)");
    const uint64_t packs_before = rt::cpu::onednn_matmul_pack_count(), ran_before = rt::cpu::onednn_matmul_count();
    const auto got = run_matmul_bias_each(as, b, bias, threads);
    CHECK(rt::cpu::onednn_matmul_count() - ran_before == (rt::cpu::onednn_enabled() ? as.size() : 0u));
    // Packed again only where a batch size changed oneDNN's layout for B: at most once per run.
    CHECK(rt::cpu::onednn_matmul_pack_count() - packs_before <= as.size());
    for (size_t i = 0; i < as.size(); ++i) {
      const std::vector<double> want = matmul_bias_ref(as[i], b, bias);
      REQUIRE(got[i].numel() == static_cast<int64_t>(want.size()));
      double worst = 0;
      for (int64_t j = 0; j < got[i].numel(); ++j)
        worst = std::max(worst, std::fabs(got[i].get_double(j) - want[static_cast<size_t>(j)]) /
                                    (1.0 + std::fabs(want[static_cast<size_t>(j)])));
      CHECK(worst < 1e-5);
    }
  }
}
