// Conv and ConvTranspose: the fast paths (im2col + GEMM, pointwise 1x1, direct depthwise, grouped,
// dilated, strided, padded, auto_pad, 1-D and 3-D; mpq's own kernels and, where built in, oneDNN's,
// each checked separately) against the scalar reference implementations,
// on odd shapes with fixed seeds; the reference itself against hand-computed values and the
// adjoint identity <conv(x), y> == <x, conv_transpose(y)>; malformed nodes rejected.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/blas_kernels.h"
#include "runtime/cpu/channel_blocks.h"
#include "runtime/cpu/conv_onednn.h"
#include "runtime/cpu/gemm_small.h"
#include "runtime/cpu/matmul_onednn.h"
#include "runtime/cpu/reference.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
using rt::cpu::WindowGeometry;

namespace {

using Attrs = std::vector<ir::Attribute>;

// Runs one node through the executor; undefined tensors are omitted optional inputs.
std::vector<Tensor> run_node(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                             size_t n_outputs = 1, int opset = 17, int threads = 2) {
  return test::run_node(op, inputs, attrs, n_outputs, opset, threads);
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.get_double(i)));
  return m;
}

// Fast result within ~1e-4 relative of the reference.
void check_close(const Tensor& got, const Tensor& want, double rel = 1e-4) {
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(shape_str(got.shape()) == shape_str(want.shape()));
  const double tol = rel * std::max(1.0, max_abs(want));
  CHECK(test::max_abs_diff(got, want) <= tol);
}

Shape with_prefix(int64_t a, int64_t b, const std::vector<int64_t>& spatial) {
  Shape s{a, b};
  s.insert(s.end(), spatial.begin(), spatial.end());
  return s;
}

// The Conv/ConvTranspose attributes and the reference's geometry of a test case (ConvCase, TCase).
template <typename Case>
Attrs window_attrs(const Case& k) {
  Attrs attrs{ir::Attribute::make_int("group", k.group)};
  if (!k.strides.empty()) attrs.push_back(ir::Attribute::make_ints("strides", k.strides));
  if (!k.dilations.empty()) attrs.push_back(ir::Attribute::make_ints("dilations", k.dilations));
  if (!k.pads.empty()) attrs.push_back(ir::Attribute::make_ints("pads", k.pads));
  return attrs;
}

template <typename Case>
WindowGeometry geometry_of(const Case& k) {
  WindowGeometry geo;
  geo.strides = k.strides;
  geo.dilations = k.dilations;
  geo.pads = k.pads;
  geo.group = k.group;
  return geo;
}

// Runs `run(threads)` with mpq's own kernels and then, where oneDNN is built in, with oneDNN; both
// must match the reference, and where oneDNN ran, one thread and two must give the same bits (the
// shapes oneDNN would run through its thread-dependent GEMM are left to mpq).
template <typename F>
void check_conv_both_ways(F run, const Tensor& want, int threads) {
  {
    INFO("mpq's kernels");
    rt::cpu::ScopedOnednn off(rt::cpu::OnednnUse::Off);
    check_close(run(threads), want);
  }
  if (rt::cpu::onednn_available()) {
    INFO("oneDNN wherever it has a direct kernel (small shapes included)");
    rt::cpu::ScopedOnednn on(rt::cpu::OnednnUse::Always);
    const uint64_t before = rt::cpu::onednn_conv_count();
    Tensor one = run(1), two = run(2);
    check_close(two, want);
    // (mpq's own path threads OpenBLAS for inference, which rounds by thread count.)
    if (rt::cpu::onednn_conv_count() == before + 2) CHECK(test::max_abs_diff(one, two) == 0.0);
  }
}

struct ConvCase {
  int64_t n, c, m, group;
  std::vector<int64_t> in, kernel, strides, dilations, pads;
  bool bias;
};

std::string describe(const ConvCase& k) {
  return fmt::format("N={} C={} M={} group={} in={} kernel={} strides={} dilations={} pads={} bias={}", k.n, k.c, k.m,
                     k.group, shape_str(k.in), shape_str(k.kernel), shape_str(k.strides), shape_str(k.dilations),
                     shape_str(k.pads), k.bias);
}

void check_conv_case(const ConvCase& k, uint32_t seed, DType dtype = DType::Float32, int threads = 2) {
  INFO(describe(k));
  Tensor x = test::random_tensor(with_prefix(k.n, k.c, k.in), seed);
  Tensor w = test::random_tensor(with_prefix(k.m, k.c / k.group, k.kernel), seed + 1);
  Tensor b = test::random_tensor({k.m}, seed + 2);
  if (dtype != DType::Float32) {
    x = x.cast_to(dtype);
    w = w.cast_to(dtype);
    b = b.cast_to(dtype);
  }
  Attrs attrs = window_attrs(k);
  std::vector<Tensor> ins{x, w};
  if (k.bias) ins.push_back(b);
  Tensor want = rt::cpu::conv_ref(x, w, k.bias ? &b : nullptr, geometry_of(k));
  check_conv_both_ways([&](int t) { return run_node("Conv", ins, attrs, 1, 17, t)[0]; }, want, threads);
}

}  // namespace

TEST_CASE("conv_ref matches hand-computed values", "[conv][reference]") {
  // 1x1x3x3 input 1..9, 2x2 kernel [[1,2],[3,4]], pad 1 on top/left only, bias 10.
  Tensor x = Tensor::from<float>({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor w = Tensor::from<float>({1, 1, 2, 2}, {1, 2, 3, 4});
  Tensor b = Tensor::from<float>({1}, {10});
  WindowGeometry geo;
  geo.pads = {1, 1, 0, 0};
  Tensor y = rt::cpu::conv_ref(x, w, &b, geo);
  REQUIRE(y.shape() == Shape{1, 1, 3, 3});
  // y[0,0] = 4*1 = 4; y[0,1] = 3*1 + 4*2 = 11; y[1,1] = 1*1 + 2*2 + 3*4 + 4*5 = 37.
  CHECK(y.data<float>()[0] == Approx(14));
  CHECK(y.data<float>()[1] == Approx(21));
  CHECK(y.data<float>()[4] == Approx(47));
  CHECK(y.data<float>()[8] == Approx(10 + 5 + 2 * 6 + 3 * 8 + 4 * 9));
}

TEST_CASE("conv_transpose_ref is the adjoint of conv_ref", "[conv][reference]") {
  // <conv(x, w), y> == <x, conv_transpose(y, w)> for matching geometry (no output padding needed
  // when the sizes line up), groups included.
  struct Case {
    Shape x, w;
    WindowGeometry g;
  };
  std::vector<Case> cases = {
      {{2, 3, 7, 5}, {4, 3, 3, 3}, {{}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, false}},
      {{1, 6, 9, 9}, {4, 3, 3, 2}, {{}, {2, 2}, {1, 2}, {0, 1, 0, 1}, 2, false}},
      {{1, 2, 11}, {5, 2, 4}, {{}, {3}, {1}, {2, 1}, 1, false}},
  };
  uint32_t seed = 100;
  for (const Case& c : cases) {
    Tensor x = test::random_tensor(c.x, seed++).cast_to(DType::Float64);
    Tensor w = test::random_tensor(c.w, seed++).cast_to(DType::Float64);
    Tensor y = rt::cpu::conv_ref(x, w, nullptr, c.g);
    Tensor r = test::random_tensor(y.shape(), seed++).cast_to(DType::Float64);
    // conv_transpose_ref's W is [C_in_of_transpose = M, C/group, k...]: the same tensor as conv's W.
    std::vector<int64_t> opad(c.x.size() - 2);
    for (size_t d = 0; d < opad.size(); ++d) {
      const int64_t natural = c.g.strides[d] * (y.dim(static_cast<int>(d) + 2) - 1) + (c.w[d + 2] - 1) * c.g.dilations[d] +
                              1 - c.g.pads[d] - c.g.pads[opad.size() + d];
      opad[d] = c.x[d + 2] - natural;
    }
    Tensor xt = rt::cpu::conv_transpose_ref(r, w, nullptr, c.g, opad);
    REQUIRE(xt.shape() == x.shape());
    double lhs = 0, rhs = 0;
    for (int64_t i = 0; i < y.numel(); ++i) lhs += y.data<double>()[i] * r.data<double>()[i];
    for (int64_t i = 0; i < x.numel(); ++i) rhs += x.data<double>()[i] * xt.data<double>()[i];
    CHECK(lhs == Approx(rhs).epsilon(1e-9));
  }
}

TEST_CASE("Conv im2col path matches the reference on odd shapes", "[conv]") {
  uint32_t seed = 1;
  for (int64_t n : {1, 3})
    for (int64_t c : {3, 5, 7})
      for (int64_t k : {1, 3, 5})
        for (int64_t hw : {1, 5, 13}) {
          // Enough padding that every kernel fits the 1-pixel inputs.
          const int64_t p = hw < k ? (k - hw + 1) / 2 : k / 2;
          check_conv_case({n, c, 4, 1, {hw, 13}, {k, k}, {1, 1}, {1, 1}, {p, p, p, p}, true}, seed++);
          check_conv_case({n, c, 5, 1, {hw + 2, hw}, {k, 1}, {2, 1}, {1, 1}, {p, 0, p, 0}, n == 1}, seed++);
        }
}

TEST_CASE("Conv strided, dilated and asymmetrically padded", "[conv]") {
  uint32_t seed = 200;
  check_conv_case({1, 3, 4, 1, {13, 11}, {3, 3}, {2, 2}, {1, 1}, {0, 0, 0, 0}, true}, seed++);
  check_conv_case({2, 5, 3, 1, {13, 13}, {3, 5}, {3, 2}, {2, 1}, {1, 2, 0, 1}, true}, seed++);
  check_conv_case({1, 7, 6, 1, {9, 14}, {3, 3}, {1, 1}, {3, 2}, {3, 2, 3, 2}, false}, seed++);
  check_conv_case({3, 3, 2, 1, {5, 13}, {5, 3}, {1, 3}, {1, 1}, {2, 0, 2, 4}, true}, seed++);
}

TEST_CASE("Conv im2col over several tiles of output rows", "[conv]") {
  // Column buffers of about 1 MiB: these shapes need several tiles, the last one partial, and in
  // 3-D the tiles cross depth boundaries.
  uint32_t seed = 250;
  check_conv_case({1, 16, 8, 1, {64, 64}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, seed++);
  check_conv_case({2, 16, 5, 1, {130, 67}, {3, 3}, {2, 1}, {1, 1}, {1, 0, 1, 2}, true}, seed++);
  check_conv_case({1, 8, 4, 1, {6, 40, 40}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1, 0, 1, 1}, false}, seed++);
}

TEST_CASE("Conv pointwise 1x1 path", "[conv]") {
  uint32_t seed = 300;
  check_conv_case({3, 7, 5, 1, {13, 5}, {1, 1}, {}, {}, {}, true}, seed++);
  check_conv_case({1, 5, 9, 1, {1, 1}, {1, 1}, {}, {}, {}, false}, seed++);
  check_conv_case({2, 6, 9, 3, {5, 7}, {1, 1}, {}, {}, {}, true}, seed++);
  // 1x1 with stride or padding goes through im2col.
  check_conv_case({1, 7, 5, 1, {13, 13}, {1, 1}, {2, 2}, {}, {1, 0, 1, 0}, true}, seed++);
  // Large enough that OpenBLAS threads the GEMM.
  check_conv_case({1, 64, 48, 1, {24, 24}, {1, 1}, {}, {}, {}, true}, seed++);
}

TEST_CASE("Conv depthwise direct kernel", "[conv][depthwise]") {
  uint32_t seed = 400;
  for (int64_t c : {3, 5, 7})
    for (int64_t mult : {1, 2})
      for (int64_t k : {3, 5})
        for (int64_t s : {1, 2})
          for (int64_t w : {1, 5, 13, 37}) {
            const int64_t p = k / 2;
            check_conv_case({1 + (w == 5 ? 2 : 0), c, c * mult, c, {w == 1 ? 1 : 11, w}, {k, k}, {s, s}, {1, 1}, {p, p, p, p},
                             mult == 1},
                            seed++);
          }
  // Dilated, asymmetric padding, mixed strides, kernel sizes other than 3 and 5.
  check_conv_case({2, 5, 5, 5, {13, 17}, {3, 3}, {1, 2}, {2, 2}, {2, 1, 2, 3}, true}, seed++);
  check_conv_case({1, 4, 8, 4, {9, 21}, {7, 7}, {3, 3}, {1, 1}, {3, 3, 3, 3}, true}, seed++);
  check_conv_case({1, 6, 6, 6, {8, 8}, {2, 4}, {1, 1}, {1, 1}, {0, 0, 0, 0}, false}, seed++);
  check_conv_case({1, 3, 3, 3, {12, 40}, {1, 3}, {2, 3}, {1, 1}, {0, 1, 1, 2}, true}, seed++);
  // 1-D depthwise and single-threaded execution.
  check_conv_case({2, 5, 10, 5, {29}, {3}, {2}, {1}, {1, 1}, true}, seed++);
  check_conv_case({1, 32, 32, 32, {28, 28}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, seed++, DType::Float32, 1);
}

TEST_CASE("Conv grouped", "[conv]") {
  uint32_t seed = 500;
  check_conv_case({1, 6, 9, 3, {13, 5}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, seed++);
  check_conv_case({3, 8, 4, 2, {7, 7}, {5, 3}, {2, 1}, {1, 2}, {2, 2, 2, 2}, true}, seed++);
  check_conv_case({2, 6, 6, 2, {5}, {3}, {1}, {2}, {2, 1}, false}, seed++);
  // Big per-group GEMMs: (image, group) tasks run one after the other with BLAS threads.
  check_conv_case({1, 64, 64, 2, {20, 20}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, seed++);
}

TEST_CASE("Conv 1-D and 3-D", "[conv]") {
  uint32_t seed = 600;
  check_conv_case({3, 5, 4, 1, {13}, {5}, {2}, {1}, {2, 1}, true}, seed++);
  check_conv_case({1, 3, 7, 1, {1}, {1}, {}, {}, {}, true}, seed++);
  check_conv_case({2, 3, 4, 1, {5, 7, 6}, {3, 3, 3}, {1, 2, 1}, {1, 1, 2}, {1, 1, 1, 1, 0, 2}, true}, seed++);
  check_conv_case({1, 4, 4, 4, {5, 5, 5}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, false}, seed++);
  check_conv_case({1, 5, 3, 1, {3, 4, 5}, {1, 1, 1}, {}, {}, {}, true}, seed++);
  // Four spatial dimensions fall back to the reference (still correct).
  check_conv_case({1, 2, 3, 1, {3, 4, 3, 3}, {2, 1, 2, 2}, {1, 1, 2, 1}, {}, {}, true}, seed++);
}

TEST_CASE("Conv float64 path", "[conv]") {
  uint32_t seed = 700;
  check_conv_case({2, 5, 3, 1, {13, 5}, {3, 3}, {2, 1}, {1, 2}, {1, 2, 1, 2}, true}, seed++, DType::Float64);
  check_conv_case({1, 6, 6, 6, {11, 11}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, seed++, DType::Float64);
  check_conv_case({3, 7, 5, 1, {5, 5}, {1, 1}, {}, {}, {}, false}, seed++, DType::Float64);
}

TEST_CASE("Conv auto_pad", "[conv]") {
  uint32_t seed = 800;
  struct Case {
    const char* mode;
    int64_t in, k, s, d;
  };
  for (Case c : {Case{"SAME_UPPER", 13, 3, 2, 1}, Case{"SAME_LOWER", 13, 4, 2, 1}, Case{"SAME_UPPER", 10, 4, 3, 1},
                 Case{"SAME_LOWER", 10, 3, 1, 2}, Case{"VALID", 13, 3, 2, 1}, Case{"VALID", 7, 5, 1, 1}}) {
    for (int64_t group : {1, 3}) {
      INFO(c.mode << " in=" << c.in << " k=" << c.k << " s=" << c.s << " d=" << c.d << " group=" << group);
      Tensor x = test::random_tensor({1, 3, c.in, c.in - 2}, seed++);
      Tensor w = test::random_tensor({6, 3 / group, c.k, c.k}, seed++);
      Attrs attrs{ir::Attribute::make_string("auto_pad", c.mode), ir::Attribute::make_ints("strides", {c.s, c.s}),
                  ir::Attribute::make_ints("dilations", {c.d, c.d}), ir::Attribute::make_int("group", group),
                  // pads are ignored when auto_pad is set
                  ir::Attribute::make_ints("pads", {9, 9, 9, 9})};
      Tensor got = run_node("Conv", {x, w}, attrs)[0];
      // Expected pads, computed here independently of the kernel.
      WindowGeometry geo;
      geo.strides = {c.s, c.s};
      geo.dilations = {c.d, c.d};
      geo.group = group;
      std::vector<int64_t> begin, end;
      for (int64_t in : {c.in, c.in - 2}) {
        int64_t total = 0;
        if (std::string(c.mode) != "VALID") {
          const int64_t out = (in + c.s - 1) / c.s;
          total = std::max<int64_t>(0, (out - 1) * c.s + (c.k - 1) * c.d + 1 - in);
        }
        const bool upper = std::string(c.mode) == "SAME_UPPER";
        begin.push_back(upper ? total / 2 : total - total / 2);
        end.push_back(total - begin.back());
      }
      geo.pads = {begin[0], begin[1], end[0], end[1]};
      check_close(got, rt::cpu::conv_ref(x, w, nullptr, geo));
      if (std::string(c.mode) != "VALID") {
        CHECK(got.dim(2) == (c.in + c.s - 1) / c.s);
      }
    }
  }
}

TEST_CASE("Conv rejects malformed nodes", "[conv][negative]") {
  Tensor x = test::random_tensor({1, 4, 5, 5}, 1);
  Tensor w = test::random_tensor({2, 4, 3, 3}, 2);
  // Channel mismatch.
  CHECK_THROWS_AS(run_node("Conv", {x, test::random_tensor({2, 3, 3, 3}, 3)}, {}), Error);
  // Weight rank differs from X.
  CHECK_THROWS_AS(run_node("Conv", {x, test::random_tensor({2, 4, 3}, 3)}, {}), Error);
  // Unknown auto_pad.
  CHECK_THROWS_AS(run_node("Conv", {x, w}, {ir::Attribute::make_string("auto_pad", "SAME")}), Error);
  // group does not divide C / does not match W.
  CHECK_THROWS_AS(run_node("Conv", {x, w}, {ir::Attribute::make_int("group", 3)}), Error);
  CHECK_THROWS_AS(run_node("Conv", {x, w}, {ir::Attribute::make_int("group", 2)}), Error);
  // Bias of the wrong length.
  CHECK_THROWS_AS(run_node("Conv", {x, w, test::random_tensor({3}, 4)}, {}), Error);
  // Kernel larger than the (unpadded) input; wrong number of pads / strides; zero stride.
  CHECK_THROWS_AS(run_node("Conv", {x, test::random_tensor({2, 4, 7, 7}, 5)}, {}), Error);
  CHECK_THROWS_AS(run_node("Conv", {x, w}, {ir::Attribute::make_ints("pads", {1, 1})}), Error);
  CHECK_THROWS_AS(run_node("Conv", {x, w}, {ir::Attribute::make_ints("strides", {1, 0})}), Error);
  CHECK_THROWS_AS(run_node("Conv", {x, w}, {ir::Attribute::make_ints("strides", {1, 1, 1})}), Error);
  // kernel_shape disagreeing with W; X of rank 2; integer X.
  CHECK_THROWS_AS(run_node("Conv", {x, w}, {ir::Attribute::make_ints("kernel_shape", {5, 5})}), Error);
  CHECK_THROWS_AS(run_node("Conv", {test::random_tensor({4, 5}, 6), test::random_tensor({2, 4}, 7)}, {}), Error);
  CHECK_THROWS_AS(run_node("Conv", {x.cast_to(DType::Int32), w.cast_to(DType::Int32)}, {}), Error);
  // The error names the node.
  try {
    run_node("Conv", {x, test::random_tensor({2, 3, 3, 3}, 3)}, {});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::BadInput);
    CHECK(std::string(e.what()).find("node") != std::string::npos);
  }
}

// ---------------------------------------------------------------- one pixel in, one out

// A 1x1 convolution of a single pixel (a squeeze-and-excitation block's) is a product with a small
// B in mpq's own kernel: the bits of small_gemm_ref with the bias as C, then the epilogue; plain
// and channels-last tensors alike; a batch's rows each as alone; blocked ones, groups and a second
// pixel elsewhere.
TEST_CASE("a 1x1 convolution of one pixel runs as a small-B product", "[conv][gemm_small]") {
  if (!rt::cpu::small_gemm_applies(false, true, 40, 24)) {
    WARN("not exercised: products stay with OpenBLAS on this CPU");
    return;
  }
  const int64_t n = 3, c = 40, m = 24;
  const Tensor x = test::random_tensor({n, c, 1, 1}, 71, -2.0f, 2.0f);
  const Tensor w = test::random_tensor({m, c, 1, 1}, 72);
  const Tensor b = test::random_tensor({m}, 73);
  std::vector<float> want(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i) std::copy(b.data<float>(), b.data<float>() + m, want.begin() + i * m);
  rt::cpu::small_gemm_ref(true, 0, n, m, c, 1.0f, x.data<float>(), c, w.data<float>(), c, 1.0f, want.data(), m);
  auto same = [&](const Tensor& got, const std::vector<float>& expect) {
    return got.numel() == static_cast<int64_t>(expect.size()) &&
           std::memcmp(got.data<float>(), expect.data(), expect.size() * sizeof(float)) == 0;
  };
  const uint64_t onednn_before = rt::cpu::onednn_conv_count();
  CHECK(same(run_node("Conv", {x, w, b}, {})[0], want));
  // 1-D, and every image alone: the same bits.
  CHECK(same(run_node("Conv", {x.reshaped({n, c, 1}), w.reshaped({m, c, 1}), b}, {})[0], want));
  for (int64_t i = 0; i < n; ++i) {
    const Tensor image = Tensor::from<float>({1, c, 1, 1}, std::vector<float>(x.data<float>() + i * c, x.data<float>() + (i + 1) * c));
    const Tensor one = run_node("Conv", {image, w, b}, {})[0];
    CHECK(std::memcmp(one.data<float>(), want.data() + i * m, sizeof(float) * m) == 0);
  }
  // mpq::FusedConv with Relu and a residual Z, plain and channels-last.
  const Tensor z = test::random_tensor({n, m, 1, 1}, 74);
  std::vector<float> fused = want;
  for (size_t i = 0; i < fused.size(); ++i) fused[i] = std::max(0.0f, fused[i] + z.data<float>()[i]);
  for (const int64_t layout : {int64_t{0}, rt::cpu::kChannelsLast}) {
    INFO("layout " << layout);
    const Attrs attrs{ir::Attribute::make_string("activation", "Relu"), ir::Attribute::make_int("x_block", layout),
                      ir::Attribute::make_int("z_block", layout), ir::Attribute::make_int("y_block", layout)};
    const Tensor got = test::run_node("FusedConv", {x, w, b, z}, attrs, 1, 17, 2, "mpq")[0];
    for (size_t i = 0; i < fused.size(); ++i) {
      INFO("element " << i);
      CHECK(got.data<float>()[i] == fused[i]);
    }
  }
  CHECK(rt::cpu::onednn_conv_count() == onednn_before);
  // Not this path (checked against the reference): groups, a 2x1 image, a 3x3 kernel on one padded
  // pixel, and a padded 1x1 kernel whose single output pixel reads the padding (stride 2, pads
  // before only: the bias alone).
  check_conv_case({n, c, m, 2, {1, 1}, {1, 1}, {}, {}, {}, true}, 75);
  check_conv_case({n, c, m, 1, {2, 1}, {1, 1}, {}, {}, {}, true}, 76);
  check_conv_case({n, c, m, 1, {1, 1}, {3, 3}, {}, {}, {1, 1, 1, 1}, true}, 77);
  check_conv_case({n, c, m, 1, {1, 1}, {1, 1}, {2, 2}, {}, {1, 1, 0, 0}, true}, 78);
}

// ---------------------------------------------------------------- ConvTranspose

namespace {

struct TCase {
  int64_t n, c, m, group;  // m: output channels
  std::vector<int64_t> in, kernel, strides, dilations, pads, output_padding;
  bool bias;
};

void check_transpose_case(const TCase& k, uint32_t seed, DType dtype = DType::Float32) {
  INFO(fmt::format("N={} C={} M={} group={} in={} kernel={} strides={} dilations={} pads={} output_padding={}", k.n, k.c,
                   k.m, k.group, shape_str(k.in), shape_str(k.kernel), shape_str(k.strides), shape_str(k.dilations),
                   shape_str(k.pads), shape_str(k.output_padding)));
  Tensor x = test::random_tensor(with_prefix(k.n, k.c, k.in), seed).cast_to(dtype);
  Tensor w = test::random_tensor(with_prefix(k.c, k.m / k.group, k.kernel), seed + 1).cast_to(dtype);
  Tensor b = test::random_tensor({k.m}, seed + 2).cast_to(dtype);
  Attrs attrs = window_attrs(k);
  if (!k.output_padding.empty()) attrs.push_back(ir::Attribute::make_ints("output_padding", k.output_padding));
  std::vector<Tensor> ins{x, w};
  if (k.bias) ins.push_back(b);
  Tensor got = run_node("ConvTranspose", ins, attrs)[0];
  check_close(got, rt::cpu::conv_transpose_ref(x, w, k.bias ? &b : nullptr, geometry_of(k), k.output_padding));
}

}  // namespace

TEST_CASE("ConvTranspose matches the reference", "[conv][transpose]") {
  uint32_t seed = 900;
  check_transpose_case({1, 3, 5, 1, {5, 5}, {3, 3}, {}, {}, {}, {}, true}, seed++);
  check_transpose_case({3, 5, 3, 1, {13, 5}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}, {1, 1}, true}, seed++);
  check_transpose_case({1, 7, 4, 1, {5, 13}, {5, 3}, {3, 2}, {2, 1}, {0, 1, 2, 0}, {1, 0}, false}, seed++);
  check_transpose_case({2, 6, 9, 3, {7, 5}, {3, 3}, {2, 1}, {1, 1}, {1, 0, 1, 0}, {}, true}, seed++);
  check_transpose_case({1, 4, 4, 4, {9, 9}, {4, 4}, {2, 2}, {}, {1, 1, 1, 1}, {}, true}, seed++);
  check_transpose_case({1, 3, 5, 1, {1, 1}, {5, 5}, {}, {}, {}, {}, true}, seed++);
  // Pointwise (GEMM straight into Y), 1-D, 3-D, float64.
  check_transpose_case({3, 7, 5, 1, {5, 13}, {1, 1}, {}, {}, {}, {}, true}, seed++);
  check_transpose_case({2, 5, 3, 1, {13}, {5}, {3}, {2}, {2, 1}, {2}, true}, seed++);
  check_transpose_case({1, 3, 2, 1, {3, 4, 5}, {3, 3, 2}, {2, 1, 2}, {1, 2, 1}, {1, 0, 1, 0, 1, 1}, {1, 0, 0}, true}, seed++);
  check_transpose_case({2, 5, 3, 1, {6, 7}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}, {}, true}, seed++, DType::Float64);
  // Large enough that OpenBLAS threads the GEMM.
  check_transpose_case({1, 64, 32, 1, {16, 16}, {4, 4}, {2, 2}, {}, {1, 1, 1, 1}, {}, true}, seed++);
  // Per-image GEMMs above the single-thread size on two threads: a batch that fills the threads
  // evenly (2, 8 images) runs one image per task, each with its own column buffer; 3 images split
  // each GEMM and col2im over the threads instead.
  for (const int64_t n : {2, 3, 8})
    check_transpose_case({n, 64, 32, 1, {8, 8}, {2, 2}, {2, 2}, {}, {}, {}, true}, seed++);
}

// Kernel equal to stride (the columns interleaved straight into Y with the bias): stride 2 with
// widths that leave a tail for the 8-wide loop (9, 3) or none (16), stride 3 and mixed strides,
// groups, no bias, 1-D, 3-D and float64; then shapes just outside it (output_padding, a pad),
// which take the fill-and-add path.
TEST_CASE("ConvTranspose with kernel equal to stride matches the reference", "[conv][transpose]") {
  uint32_t seed = 950;
  check_transpose_case({1, 64, 32, 1, {8, 9}, {2, 2}, {2, 2}, {}, {}, {}, true}, seed++);
  check_transpose_case({2, 6, 4, 1, {5, 16}, {2, 2}, {2, 2}, {}, {}, {}, false}, seed++);
  check_transpose_case({1, 6, 8, 2, {7, 3}, {2, 2}, {2, 2}, {}, {}, {}, true}, seed++);
  check_transpose_case({1, 5, 3, 1, {4, 5}, {3, 3}, {3, 3}, {}, {}, {}, true}, seed++);
  check_transpose_case({1, 5, 3, 1, {4, 5}, {3, 2}, {3, 2}, {}, {}, {}, true}, seed++);
  check_transpose_case({2, 4, 3, 1, {11}, {2}, {2}, {}, {}, {}, true}, seed++);
  check_transpose_case({1, 4, 3, 1, {3, 4, 5}, {2, 2, 2}, {2, 2, 2}, {}, {}, {}, true}, seed++);
  check_transpose_case({1, 5, 4, 1, {6, 10}, {2, 2}, {2, 2}, {}, {}, {}, true}, seed++, DType::Float64);
  check_transpose_case({1, 5, 4, 1, {6, 10}, {2, 2}, {2, 2}, {}, {}, {1, 1}, true}, seed++);
  check_transpose_case({1, 5, 4, 1, {6, 10}, {2, 2}, {2, 2}, {}, {1, 0, 0, 0}, {}, true}, seed++);
}

TEST_CASE("ConvTranspose's GEMMs go to oneDNN where OpenBLAS runs without AVX-512 on an AVX-512 CPU",
          "[conv][transpose][onednn]") {
  // As mpq::MatMulBias's case in matmul_test: OpenBLAS's kernel table switched to Haswell (an AMD
  // Zen 5 machine's OPENBLAS_CORETYPE) and to SkylakeX, the process's kernels restored after.
  test::BlasKernelSwitch blas;
  if (!blas.usable()) {
    WARN("not exercised: " << blas.why());
    return;
  }
  uint32_t seed = 970;
  for (const char* kernels : {"Haswell", "SkylakeX"}) {
    INFO(kernels << " kernels");
    REQUIRE(blas.to(kernels));
    const bool below = std::string(kernels) == "Haswell";
    CHECK(rt::blas_kernels_below_cpu() == below);
    // One image on two threads, each with its output channels' rows (U-Net's upsampling at batch 1);
    // a batch of 8, an image per task; 3 images, each GEMM split over the threads; the general
    // path (overlapping windows, col2im); float64 always on OpenBLAS.
    const uint64_t ran = rt::cpu::onednn_sgemm_count();
    check_transpose_case({1, 64, 32, 1, {8, 9}, {2, 2}, {2, 2}, {}, {}, {}, true}, seed++);
    const uint64_t after_one = rt::cpu::onednn_sgemm_count();
    CHECK(after_one - ran == (below ? 2u : 0u));
    check_transpose_case({8, 64, 32, 1, {8, 8}, {2, 2}, {2, 2}, {}, {}, {}, true}, seed++);
    check_transpose_case({3, 64, 32, 1, {8, 8}, {2, 2}, {2, 2}, {}, {}, {}, false}, seed++);
    const uint64_t after_batches = rt::cpu::onednn_sgemm_count();
    CHECK(after_batches - after_one == (below ? 11u : 0u));
    check_transpose_case({2, 5, 3, 1, {6, 7}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}, {}, true}, seed++);
    const uint64_t after_general = rt::cpu::onednn_sgemm_count();
    CHECK(after_general - after_batches == (below ? 2u : 0u));
    check_transpose_case({2, 5, 3, 1, {6, 7}, {2, 2}, {2, 2}, {}, {}, {}, true}, seed++, DType::Float64);
    CHECK(rt::cpu::onednn_sgemm_count() == after_general);
  }
  CHECK(blas.restore());
}

TEST_CASE("ConvTranspose with kernel equal to stride gives the fill-and-add path's bits", "[conv][transpose]") {
  // The same weights as a 3x3-kernel, stride-2 ConvTranspose whose extra taps are zero would
  // overlap, so it takes the general path; with the bias absent a -0 column value must still give
  // +0 (the general path fills Y with 0 and adds).
  Tensor x = test::random_tensor({1, 3, 4, 5}, 31);
  Tensor w = test::random_tensor({3, 2, 2, 2}, 32);
  // The first input row zero in every channel and W[:, 0, 0, 0] negative: those columns are
  // (+0 * negative) summed, -0.
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t i = 0; i < 5; ++i) x.data<float>()[c * 20 + i] = 0.0f;
    float& tap = w.data<float>()[c * 8];
    tap = -std::fabs(tap) - 0.1f;
  }
  Tensor w3(DType::Float32, {3, 2, 3, 3});
  std::fill(w3.data<float>(), w3.data<float>() + w3.numel(), 0.0f);
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t m = 0; m < 2; ++m)
      for (int64_t kh = 0; kh < 2; ++kh)
        for (int64_t kw = 0; kw < 2; ++kw)
          w3.data<float>()[((c * 2 + m) * 3 + kh) * 3 + kw] = w.data<float>()[((c * 2 + m) * 2 + kh) * 2 + kw];
  const Attrs strides{ir::Attribute::make_ints("strides", {2, 2})};
  Tensor fast = run_node("ConvTranspose", {x, w}, strides)[0];
  // The 3x3 output is one row and column larger; its top-left [8, 10] is the same sums.
  Tensor general = run_node("ConvTranspose", {x, w3}, strides)[0];
  REQUIRE(fast.shape() == Shape{1, 2, 8, 10});
  REQUIRE(general.shape() == Shape{1, 2, 9, 11});
  int64_t differ = 0;
  for (int64_t m = 0; m < 2; ++m)
    for (int64_t h = 0; h < 8; ++h)
      for (int64_t v = 0; v < 10; ++v) {
        const float a = fast.data<float>()[(m * 8 + h) * 10 + v], b = general.data<float>()[(m * 9 + h) * 11 + v];
        differ += std::memcmp(&a, &b, sizeof(float)) != 0;
      }
  CHECK(differ == 0);
  CHECK(std::signbit(fast.data<float>()[0]) == false);  // -0 from the columns, +0 in Y
}

TEST_CASE("ConvTranspose output_shape and auto_pad", "[conv][transpose]") {
  Tensor x = test::random_tensor({1, 3, 5, 7}, 1000);
  Tensor w = test::random_tensor({3, 2, 3, 3}, 1001);
  // Natural size: 2*(in-1) + 3 = 11 x 15.
  auto ref_with = [&](std::vector<int64_t> pads, std::vector<int64_t> opad) {
    WindowGeometry geo;
    geo.strides = {2, 2};
    geo.pads = std::move(pads);
    return rt::cpu::conv_transpose_ref(x, w, nullptr, geo, opad);
  };
  SECTION("output_shape smaller than natural: NOTSET puts the odd pad at the beginning") {
    Tensor got = run_node("ConvTranspose", {x, w},
                          {ir::Attribute::make_ints("strides", {2, 2}), ir::Attribute::make_ints("output_shape", {10, 12})})[0];
    REQUIRE(got.shape() == Shape{1, 2, 10, 12});
    check_close(got, ref_with({1, 2, 0, 1}, {}));
  }
  SECTION("output_shape with N and C, larger than natural: the extra rows hold the bias only") {
    Tensor got = run_node("ConvTranspose", {x, w},
                          {ir::Attribute::make_ints("strides", {2, 2}),
                           ir::Attribute::make_ints("output_shape", {1, 2, 12, 15})})[0];
    REQUIRE(got.shape() == Shape{1, 2, 12, 15});
    check_close(got, ref_with({0, 0, 0, 0}, {1, 0}));
  }
  SECTION("SAME_UPPER: output is in*stride, extra padding at the end") {
    Tensor got = run_node("ConvTranspose", {x, w},
                          {ir::Attribute::make_ints("strides", {2, 2}), ir::Attribute::make_string("auto_pad", "SAME_UPPER")})[0];
    REQUIRE(got.shape() == Shape{1, 2, 10, 14});
    check_close(got, ref_with({0, 0, 1, 1}, {}));
  }
  SECTION("SAME_LOWER: extra padding at the beginning") {
    Tensor got = run_node("ConvTranspose", {x, w},
                          {ir::Attribute::make_ints("strides", {2, 2}), ir::Attribute::make_string("auto_pad", "SAME_LOWER")})[0];
    REQUIRE(got.shape() == Shape{1, 2, 10, 14});
    check_close(got, ref_with({1, 1, 0, 0}, {}));
  }
  SECTION("VALID ignores pads") {
    Tensor got = run_node("ConvTranspose", {x, w},
                          {ir::Attribute::make_ints("strides", {2, 2}), ir::Attribute::make_string("auto_pad", "VALID"),
                           ir::Attribute::make_ints("pads", {1, 1, 1, 1})})[0];
    check_close(got, ref_with({0, 0, 0, 0}, {}));
  }
}

TEST_CASE("ConvTranspose rejects malformed nodes", "[conv][transpose][negative]") {
  Tensor x = test::random_tensor({1, 4, 5, 5}, 1);
  Tensor w = test::random_tensor({4, 2, 3, 3}, 2);
  CHECK_THROWS_AS(run_node("ConvTranspose", {x, test::random_tensor({3, 2, 3, 3}, 3)}, {}), Error);
  CHECK_THROWS_AS(run_node("ConvTranspose", {x, test::random_tensor({4, 2, 3}, 3)}, {}), Error);
  CHECK_THROWS_AS(run_node("ConvTranspose", {x, w}, {ir::Attribute::make_string("auto_pad", "FULL")}), Error);
  CHECK_THROWS_AS(run_node("ConvTranspose", {x, w}, {ir::Attribute::make_int("group", 3)}), Error);
  CHECK_THROWS_AS(run_node("ConvTranspose", {x, w, test::random_tensor({3}, 4)}, {}), Error);
  CHECK_THROWS_AS(run_node("ConvTranspose", {x, w}, {ir::Attribute::make_ints("output_shape", {7})}), Error);
  CHECK_THROWS_AS(run_node("ConvTranspose", {x, w}, {ir::Attribute::make_ints("pads", {4, 4, 4, 4})}), Error);
}

TEST_CASE("Conv phase-plane path: strides, dilations, asymmetric pads, several tiles", "[conv]") {
  // 2-D convolutions whose padded width wastes at most 30% of the GEMM's columns run on
  // stride-phase planes; every stride/dilation/kernel combination here does, on 1 and 2 threads.
  uint32_t seed = 900;
  for (int64_t s : {1, 2, 3})
    for (int64_t d : {1, 2})
      for (int64_t k : {1, 2, 3, 5}) {
        const int64_t p = (k - 1) * d / 2;
        const int threads = 1 + static_cast<int>(seed % 2);
        check_conv_case({2, 5, 6, 1, {17, 31}, {k, k}, {s, s}, {d, d}, {p, p + 1, p, p % 2}, (k + s) % 2 == 0}, seed++,
                        DType::Float32, threads);
      }
  // Mixed strides, a kernel taller than wide, grouped, float64.
  check_conv_case({1, 6, 4, 1, {20, 33}, {5, 3}, {2, 1}, {1, 1}, {2, 1, 2, 1}, true}, seed++);
  check_conv_case({3, 8, 6, 2, {11, 29}, {3, 3}, {1, 2}, {2, 1}, {0, 1, 2, 0}, true}, seed++);
  check_conv_case({1, 4, 3, 1, {9, 30}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, true}, seed++, DType::Float64);
  // Several tiles of output rows, the last one partial; stride 1 and stride 2.
  check_conv_case({1, 16, 8, 1, {70, 70}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, seed++);
  check_conv_case({2, 32, 8, 1, {131, 66}, {3, 3}, {2, 2}, {1, 1}, {1, 0, 1, 1}, false}, seed++, DType::Float32, 1);
  // The fashion models' shapes: 3x3 at 28, 14 and 7 (the last falls back to im2col: 2 of 7 wasted).
  check_conv_case({8, 16, 16, 1, {28, 28}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, false}, seed++, DType::Float32, 1);
  check_conv_case({8, 16, 32, 1, {28, 28}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, false}, seed++, DType::Float32, 1);
  check_conv_case({8, 16, 32, 1, {28, 28}, {1, 1}, {2, 2}, {1, 1}, {0, 0, 0, 0}, false}, seed++, DType::Float32, 1);
  check_conv_case({8, 64, 64, 1, {7, 7}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, false}, seed++, DType::Float32, 2);
}

namespace {

// activation(conv_ref(x, w, b) + z), computed naively in double.
Tensor fused_conv_ref(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor* z, const WindowGeometry& geo,
                      const std::string& act, const std::vector<float>& params) {
  Tensor y = rt::cpu::conv_ref(x, w, b, geo);
  for (int64_t i = 0; i < y.numel(); ++i) {
    double v = y.get_double(i) + (z ? z->get_double(i) : 0.0);
    if (act == "Relu") v = std::max(v, 0.0);
    if (act == "LeakyRelu") v = v < 0 ? params[0] * v : v;
    if (act == "Clip") v = std::min(std::max(v, double(params[0])), double(params[1]));
    if (act == "Sigmoid") v = 1.0 / (1.0 + std::exp(-v));
    if (act == "HardSigmoid") v = std::min(std::max(params[0] * v + params[1], 0.0), 1.0);
    if (act == "Tanh") v = std::tanh(v);
    if (act == "HardSwish") v = v * std::min(std::max(v / 6.0 + 0.5, 0.0), 1.0);
    y.data<float>()[i] = static_cast<float>(v);
  }
  return y;
}

}  // namespace

TEST_CASE("FusedConv applies the residual and activation on every convolution strategy", "[conv][fused]") {
  const std::vector<std::pair<std::string, std::vector<float>>> acts = {
      {"", {}},           {"Relu", {}}, {"LeakyRelu", {0.1f}},        {"Clip", {-0.5f, 0.7f}},
      {"Sigmoid", {}},    {"Tanh", {}}, {"HardSigmoid", {0.3f, 0.4f}}, {"HardSwish", {}}};
  // phase planes, im2col fallback (wide kernel on a narrow map), pointwise, depthwise, grouped,
  // 3-D, and 4-D (reference fallback).
  const std::vector<ConvCase> convs = {
      {2, 5, 6, 1, {9, 21}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true},
      {1, 3, 4, 1, {6, 5}, {5, 5}, {1, 1}, {1, 1}, {2, 2, 2, 2}, false},
      {2, 7, 5, 1, {4, 6}, {1, 1}, {}, {}, {}, true},
      {1, 6, 6, 6, {9, 10}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, true},
      {1, 6, 4, 2, {7, 17}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true},
      {1, 3, 2, 1, {4, 5, 6}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, true},
      {1, 2, 3, 1, {3, 4, 3, 3}, {2, 1, 2, 2}, {1, 1, 1, 1}, {1, 1, 1, 1}, {0, 0, 0, 0, 0, 0, 0, 0}, false},
      // Channel counts oneDNN's direct kernels take (multiples of its 8-float block): dense 3x3,
      // strided 1x1, depthwise, 1-D.
      {2, 8, 16, 1, {9, 11}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true},
      {1, 16, 8, 1, {7, 9}, {1, 1}, {2, 2}, {1, 1}, {0, 0, 0, 0}, false},
      {2, 16, 16, 16, {9, 10}, {3, 3}, {2, 1}, {1, 1}, {1, 0, 1, 1}, true},
      {1, 8, 8, 1, {19}, {3}, {1}, {2}, {2, 2}, true},
  };
  uint32_t seed = 1000;
  for (const ConvCase& k : convs)
    for (const auto& [act, params] : acts)
      for (bool with_z : {false, true}) {
        INFO(describe(k) << " activation=" << act << " Z=" << with_z);
        Tensor x = test::random_tensor(with_prefix(k.n, k.c, k.in), seed++, -2.0f, 2.0f);
        Tensor w = test::random_tensor(with_prefix(k.m, k.c / k.group, k.kernel), seed++);
        Tensor b = test::random_tensor({k.m}, seed++);
        const WindowGeometry geo = geometry_of(k);
        Tensor plain = rt::cpu::conv_ref(x, w, k.bias ? &b : nullptr, geo);
        Tensor z = test::random_tensor(plain.shape(), seed++, -2.0f, 2.0f);
        Attrs attrs = window_attrs(k);
        if (!act.empty()) attrs.push_back(ir::Attribute::make_string("activation", act));
        if (!params.empty()) attrs.push_back(ir::Attribute::make_floats("activation_params", params));
        std::vector<Tensor> ins{x, w, k.bias ? b : Tensor()};
        if (with_z) ins.push_back(z);
        Tensor want = fused_conv_ref(x, w, k.bias ? &b : nullptr, with_z ? &z : nullptr, geo, act, params);
        check_conv_both_ways([&](int t) { return test::run_node("FusedConv", ins, attrs, 1, 17, t, "mpq")[0]; }, want, 2);
      }
}

TEST_CASE("FusedConv rejects a bad activation, parameters or Z", "[conv][fused][negative]") {
  Tensor x = test::random_tensor({1, 2, 5, 5}, 1);
  Tensor w = test::random_tensor({3, 2, 3, 3}, 2);
  auto run = [&](const Attrs& attrs, const Tensor& z) {
    return test::run_node("FusedConv", {x, w, Tensor(), z}, attrs, 1, 17, 1, "mpq");
  };
  Tensor z_ok = test::random_tensor({1, 3, 3, 3}, 3);
  CHECK_THROWS_WITH(run({ir::Attribute::make_string("activation", "Gelu")}, z_ok),
                    Catch::Contains("node_under_test") && Catch::Contains("'Gelu'"));
  CHECK_THROWS_WITH(run({ir::Attribute::make_string("activation", "Clip"), ir::Attribute::make_floats("activation_params", {1.0f})}, z_ok),
                    Catch::Contains("takes 2 activation_params"));
  CHECK_THROWS_WITH(run({}, test::random_tensor({1, 3, 5, 5}, 4)), Catch::Contains("Z is float32[1,3,5,5]"));
}

TEST_CASE("Conv on shapes oneDNN's direct kernels take: odd sizes, strides, dilations, pads, groups", "[conv][onednn]") {
  // Channel counts that are multiples of 8 (and a few that are not, padded inside oneDNN), odd
  // spatial sizes, asymmetric pads, depthwise with multiplier, the first layer of an image model.
  uint32_t seed = 1300;
  const uint64_t before = rt::cpu::onednn_conv_count();
  check_conv_case({1, 3, 16, 1, {23, 17}, {7, 7}, {2, 2}, {1, 1}, {3, 3, 3, 3}, true}, seed++);
  // oneDNN really ran (on one and on two threads) where it is built in.
  CHECK(rt::cpu::onednn_conv_count() == before + (rt::cpu::onednn_available() ? 2 : 0));
  check_conv_case({2, 8, 8, 1, {13, 11}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, seed++);
  check_conv_case({1, 16, 24, 1, {9, 7}, {3, 5}, {2, 1}, {2, 1}, {0, 2, 1, 1}, false}, seed++);
  check_conv_case({3, 24, 16, 1, {5, 5}, {1, 1}, {}, {}, {}, true}, seed++);
  check_conv_case({1, 32, 16, 1, {11, 11}, {1, 1}, {2, 2}, {}, {}, true}, seed++);
  check_conv_case({2, 16, 16, 16, {13, 9}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, seed++);
  check_conv_case({1, 24, 24, 24, {15, 15}, {5, 5}, {2, 2}, {1, 1}, {2, 2, 2, 2}, false}, seed++);
  check_conv_case({1, 8, 16, 8, {10, 10}, {3, 3}, {1, 1}, {2, 2}, {2, 1, 2, 3}, true}, seed++);
  check_conv_case({2, 16, 32, 2, {7, 9}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, seed++);
  check_conv_case({1, 8, 16, 1, {31}, {5}, {2}, {1}, {2, 2}, true}, seed++);
  check_conv_case({4, 64, 64, 1, {7, 7}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, seed++);
  check_conv_case({1, 5, 8, 1, {6, 6}, {3, 3}, {1, 1}, {1, 1}, {0, 0, 0, 0}, true}, seed++);
  check_conv_case({1, 40, 40, 40, {1, 1}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, seed++);
}
