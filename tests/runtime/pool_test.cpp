// Pooling kernels against the scalar references (and the references against hand-computed
// values): MaxPool with Indices and storage_order, AveragePool with count_include_pad, ceil_mode,
// dilations, auto_pad; LpPool, the Global pools and MaxUnpool; malformed nodes rejected.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/cpu/reference.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
using rt::cpu::WindowGeometry;

namespace {

using Attrs = std::vector<ir::Attribute>;

std::vector<Tensor> run_node(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                             size_t n_outputs = 1, int opset = 19, int threads = 2) {
  return test::run_node(op, inputs, attrs, n_outputs, opset, threads);
}

void check_close(const Tensor& got, const Tensor& want, double rel = 1e-5) {
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(shape_str(got.shape()) == shape_str(want.shape()));
  double scale = 1.0;
  for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::fabs(want.get_double(i)));
  CHECK(test::max_abs_diff(got, want) <= rel * scale);
}

void check_equal_ints(const Tensor& got, const Tensor& want) {
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(shape_str(got.shape()) == shape_str(want.shape()));
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) bad += got.get_int64(i) != want.get_int64(i);
  CHECK(bad == 0);
}

struct PoolCase {
  Shape x;
  std::vector<int64_t> kernel, strides, dilations, pads;
  bool ceil_mode;
};

Attrs pool_attrs(const PoolCase& c) {
  Attrs a{ir::Attribute::make_ints("kernel_shape", c.kernel), ir::Attribute::make_int("ceil_mode", c.ceil_mode)};
  if (!c.strides.empty()) a.push_back(ir::Attribute::make_ints("strides", c.strides));
  if (!c.dilations.empty()) a.push_back(ir::Attribute::make_ints("dilations", c.dilations));
  if (!c.pads.empty()) a.push_back(ir::Attribute::make_ints("pads", c.pads));
  return a;
}

WindowGeometry geometry(const PoolCase& c) {
  WindowGeometry g;
  g.kernel = c.kernel;
  g.strides = c.strides;
  g.dilations = c.dilations;
  g.pads = c.pads;
  g.ceil_mode = c.ceil_mode;
  return g;
}

std::string describe(const PoolCase& c) {
  return fmt::format("X={} kernel={} strides={} dilations={} pads={} ceil_mode={}", shape_str(c.x), shape_str(c.kernel),
                     shape_str(c.strides), shape_str(c.dilations), shape_str(c.pads), c.ceil_mode);
}

const std::vector<PoolCase>& pool_cases() {
  static const std::vector<PoolCase> cases = {
      {{1, 3, 13, 13}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}, false},
      {{3, 5, 13, 5}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}, true},
      {{1, 7, 5, 13}, {2, 3}, {1, 2}, {}, {0, 1, 1, 0}, true},
      {{2, 3, 13, 13}, {3, 3}, {1, 1}, {2, 2}, {2, 2, 2, 2}, false},
      {{1, 5, 12, 11}, {2, 2}, {3, 2}, {2, 3}, {1, 0, 0, 1}, true},
      {{1, 3, 1, 5}, {1, 3}, {1, 1}, {}, {0, 1, 0, 1}, false},
      {{2, 3, 13}, {5}, {3}, {}, {2, 2}, true},
      {{1, 3, 17}, {3}, {2}, {3}, {1, 0}, false},
      {{1, 2, 5, 7, 6}, {3, 2, 3}, {2, 1, 2}, {1, 2, 1}, {1, 0, 1, 1, 1, 0}, true},
      {{2, 3, 7, 7}, {7, 7}, {}, {}, {}, false},
      {{1, 2, 3, 4, 3, 3}, {2, 2, 2, 2}, {}, {}, {}, false},  // four spatial dims: reference fallback
  };
  return cases;
}

}  // namespace

TEST_CASE("pool references match hand-computed values", "[pool][reference]") {
  // ceil_mode: a window starting in the end padding is dropped; one starting in the input is kept.
  CHECK(rt::cpu::pool_output_size(4, 3, 2, 1, 0, 0, false) == 1);
  CHECK(rt::cpu::pool_output_size(4, 3, 2, 1, 0, 0, true) == 2);
  CHECK(rt::cpu::pool_output_size(5, 2, 2, 1, 0, 1, true) == 3);
  CHECK(rt::cpu::pool_output_size(4, 2, 2, 1, 0, 1, true) == 2);
  CHECK(rt::cpu::pool_output_size(5, 3, 1, 2, 0, 0, false) == 1);
  Tensor x = Tensor::from<float>({1, 1, 3, 3}, {1, 2, 3, 4, 9, 6, 7, 8, 5});
  WindowGeometry g;
  g.kernel = {2, 2};
  g.pads = {1, 1, 0, 0};
  Tensor idx;
  Tensor mx = rt::cpu::max_pool_ref(x, g, &idx);
  REQUIRE(mx.shape() == Shape{1, 1, 3, 3});
  CHECK(mx.data<float>()[0] == 1);
  CHECK(mx.data<float>()[4] == 9);
  CHECK(mx.data<float>()[8] == 9);
  CHECK(idx.data<int64_t>()[8] == 4);
  Tensor idx_col;
  rt::cpu::max_pool_ref(x, g, &idx_col, 1);
  // Output (0, 2) sees 2 and 3; the max 3 sits at (h=0, w=2): row-major 2, column-major w*H + h = 6.
  CHECK(idx.data<int64_t>()[2] == 2);
  CHECK(idx_col.data<int64_t>()[2] == 6);
  Tensor avg = rt::cpu::avg_pool_ref(x, g, false);
  Tensor avg_pad = rt::cpu::avg_pool_ref(x, g, true);
  CHECK(avg.data<float>()[0] == Approx(1));
  CHECK(avg_pad.data<float>()[0] == Approx(0.25));
  CHECK(avg.data<float>()[1] == Approx(1.5));
  CHECK(avg_pad.data<float>()[4] == Approx(4.0));
}

TEST_CASE("MaxPool matches the reference", "[pool][maxpool]") {
  uint32_t seed = 1;
  for (const PoolCase& c : pool_cases()) {
    INFO(describe(c));
    Tensor x = test::random_tensor(c.x, seed++);
    Tensor y = run_node("MaxPool", {x}, pool_attrs(c))[0];
    check_close(y, rt::cpu::max_pool_ref(x, geometry(c)));
    for (int order : {0, 1}) {
      INFO("storage_order " << order);
      Attrs attrs = pool_attrs(c);
      attrs.push_back(ir::Attribute::make_int("storage_order", order));
      std::vector<Tensor> outs = run_node("MaxPool", {x}, attrs, 2);
      Tensor want_idx;
      Tensor want = rt::cpu::max_pool_ref(x, geometry(c), &want_idx, order);
      check_close(outs[0], want);
      check_equal_ints(outs[1], want_idx);
    }
    Tensor xd = x.cast_to(DType::Float64);
    check_close(run_node("MaxPool", {xd}, pool_attrs(c))[0], rt::cpu::max_pool_ref(xd, geometry(c)));
  }
}

// The 2x2 stride-2 fast path (no padded copy of the plane): widths that leave no tail, a tail and
// only a tail for the 8-wide vector loop, odd H and W (the last row and column dropped), end pads
// that no window reaches, and NaNs in every tap position (a NaN wins only as the first tap, as in
// the reference). Shapes that must leave the fast path (ceil_mode with a partial window, a begin
// pad) are checked too, without NaNs.
TEST_CASE("MaxPool 2x2 stride 2 matches the reference bit for bit", "[pool][maxpool]") {
  const std::vector<PoolCase> cases = {
      {{1, 3, 32, 32}, {2, 2}, {2, 2}, {}, {}, false},   {{2, 5, 9, 33}, {2, 2}, {2, 2}, {}, {}, false},
      {{1, 2, 6, 38}, {2, 2}, {2, 2}, {}, {}, false},    {{3, 1, 4, 6}, {2, 2}, {2, 2}, {}, {}, false},
      {{1, 2, 6, 6}, {2, 2}, {2, 2}, {}, {0, 0, 1, 1}, false},
      {{1, 2, 7, 9}, {2, 2}, {2, 2}, {}, {}, true},      {{1, 2, 8, 8}, {2, 2}, {2, 2}, {}, {1, 1, 0, 0}, false},
  };
  // Same values, NaN where the reference has NaN.
  auto differing = [](const Tensor& got, const Tensor& want) {
    REQUIRE(got.dtype() == want.dtype());
    REQUIRE(got.shape() == want.shape());
    int64_t n = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      const double g = got.get_double(i), w = want.get_double(i);
      n += std::isnan(w) ? !std::isnan(g) : g != w;
    }
    return n;
  };
  uint32_t seed = 500;
  for (const PoolCase& c : cases) {
    INFO(describe(c));
    Tensor x = test::random_tensor(c.x, seed++, -50.0f, 50.0f);
    float* xp = x.data<float>();
    // NaNs in every tap position of some windows (a stride of 37 walks through them), two in the
    // first window.
    // Only on the fast path's shapes: the general path pads with -inf, which, as a first tap,
    // lets a NaN after it lose (the reference takes the first tap inside the plane).
    const bool fast = (c.pads.empty() || (c.pads[0] == 0 && c.pads[1] == 0)) && !c.ceil_mode;
    for (int64_t i = 5; fast && i < x.numel(); i += 37) xp[i] = std::nanf("");
    if (fast) xp[0] = xp[1] = std::nanf("");
    for (int threads : {1, 2}) {
      INFO("threads " << threads);
      CHECK(differing(test::run_node("MaxPool", {x}, pool_attrs(c), 1, 19, threads)[0],
                      rt::cpu::max_pool_ref(x, geometry(c))) == 0);
    }
    const Tensor xd = x.cast_to(DType::Float64);
    CHECK(differing(run_node("MaxPool", {xd}, pool_attrs(c))[0], rt::cpu::max_pool_ref(xd, geometry(c))) == 0);
    // Integers (whole values: the reference works in float) take the portable row loop.
    Tensor xr(DType::Float32, c.x);
    for (int64_t i = 0; i < x.numel(); ++i) xr.data<float>()[i] = std::isnan(xp[i]) ? 0.0f : std::round(xp[i]);
    CHECK(differing(run_node("MaxPool", {xr.cast_to(DType::Int32)}, pool_attrs(c), 1, 12)[0],
                    rt::cpu::max_pool_ref(xr, geometry(c)).cast_to(DType::Int32)) == 0);
  }
}

TEST_CASE("MaxPool on integer types and with auto_pad", "[pool][maxpool]") {
  Tensor xf = test::random_tensor({2, 3, 9, 11}, 77, -100.0f, 100.0f);
  Tensor xr(DType::Float32, xf.shape());
  for (int64_t i = 0; i < xf.numel(); ++i) xr.data<float>()[i] = std::round(xf.data<float>()[i]);
  PoolCase c{xf.shape(), {3, 3}, {2, 2}, {}, {1, 1, 1, 1}, true};
  Tensor want = rt::cpu::max_pool_ref(xr, geometry(c));
  for (DType dtype : {DType::Int8, DType::Int32, DType::Int64}) {
    INFO(dtype_name(dtype));
    check_equal_ints(run_node("MaxPool", {xr.cast_to(dtype)}, pool_attrs(c), 1, 12)[0], want.cast_to(dtype));
  }
  Tensor xu(DType::Float32, xf.shape());
  for (int64_t i = 0; i < xf.numel(); ++i) xu.data<float>()[i] = std::fabs(xr.data<float>()[i]);
  check_equal_ints(run_node("MaxPool", {xu.cast_to(DType::UInt8)}, pool_attrs(c), 1, 12)[0],
                   rt::cpu::max_pool_ref(xu, geometry(c)).cast_to(DType::UInt8));
  // auto_pad: pads computed here (SAME_UPPER puts the odd one at the end), given ones ignored.
  for (const char* mode : {"SAME_UPPER", "SAME_LOWER", "VALID"}) {
    INFO(mode);
    Attrs attrs{ir::Attribute::make_ints("kernel_shape", {4, 3}), ir::Attribute::make_ints("strides", {2, 2}),
                ir::Attribute::make_string("auto_pad", mode), ir::Attribute::make_ints("pads", {5, 5, 5, 5})};
    PoolCase e{xf.shape(), {4, 3}, {2, 2}, {}, {}, false};
    const std::string m = mode;
    // H = 9: out 5, total (5-1)*2 + 4 - 9 = 3; W = 11: out 6, total (6-1)*2 + 3 - 11 = 2.
    if (m == "SAME_UPPER") e.pads = {1, 1, 2, 1};
    if (m == "SAME_LOWER") e.pads = {2, 1, 1, 1};
    Tensor got = run_node("MaxPool", {xf}, attrs)[0];
    check_close(got, rt::cpu::max_pool_ref(xf, geometry(e)));
    if (m != "VALID") CHECK(got.shape() == Shape{2, 3, 5, 6});
  }
}

TEST_CASE("AveragePool matches the reference", "[pool][averagepool]") {
  uint32_t seed = 100;
  for (const PoolCase& c : pool_cases()) {
    for (bool include_pad : {false, true}) {
      INFO(describe(c) << " count_include_pad=" << include_pad);
      Tensor x = test::random_tensor(c.x, seed++);
      Attrs attrs = pool_attrs(c);
      attrs.push_back(ir::Attribute::make_int("count_include_pad", include_pad));
      check_close(run_node("AveragePool", {x}, attrs)[0], rt::cpu::avg_pool_ref(x, geometry(c), include_pad));
      Tensor xd = x.cast_to(DType::Float64);
      check_close(run_node("AveragePool", {xd}, attrs)[0], rt::cpu::avg_pool_ref(xd, geometry(c), include_pad));
    }
  }
}

TEST_CASE("AveragePool with auto_pad SAME never counts padding", "[pool][averagepool]") {
  Tensor x = test::random_tensor({1, 2, 7, 6}, 5);
  Attrs attrs{ir::Attribute::make_ints("kernel_shape", {3, 3}), ir::Attribute::make_string("auto_pad", "SAME_LOWER")};
  PoolCase e{x.shape(), {3, 3}, {}, {}, {1, 1, 1, 1}, false};
  check_close(run_node("AveragePool", {x}, attrs)[0], rt::cpu::avg_pool_ref(x, geometry(e), false));
}

namespace {

// Naive 2-D LpPool (no dilation) written out here.
Tensor lp_pool_naive(const Tensor& x, int64_t k, int64_t s, int64_t pad, double p) {
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  const int64_t OH = (H + 2 * pad - k) / s + 1, OW = (W + 2 * pad - k) / s + 1;
  Tensor y(DType::Float32, {N, C, OH, OW});
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double acc = 0;
        for (int64_t i = 0; i < k; ++i)
          for (int64_t j = 0; j < k; ++j) {
            int64_t h = oh * s - pad + i, w = ow * s - pad + j;
            if (h >= 0 && h < H && w >= 0 && w < W) acc += std::pow(std::fabs(x.data<float>()[(nc * H + h) * W + w]), p);
          }
        y.data<float>()[(nc * OH + oh) * OW + ow] = static_cast<float>(std::pow(acc, 1.0 / p));
      }
  return y;
}

}  // namespace

TEST_CASE("LpPool and GlobalLpPool", "[pool][lppool]") {
  Tensor x = test::random_tensor({2, 3, 9, 7}, 9);
  for (int64_t p : {1, 2, 3}) {
    INFO("p=" << p);
    Attrs attrs{ir::Attribute::make_ints("kernel_shape", {3, 3}), ir::Attribute::make_ints("strides", {2, 2}),
                ir::Attribute::make_ints("pads", {1, 1, 1, 1}), ir::Attribute::make_int("p", p)};
    check_close(run_node("LpPool", {x}, attrs)[0], lp_pool_naive(x, 3, 2, 1, static_cast<double>(p)));
    Tensor g = run_node("GlobalLpPool", {x}, {ir::Attribute::make_int("p", p)})[0];
    Tensor want(DType::Float32, {2, 3, 1, 1});
    for (int64_t nc = 0; nc < 6; ++nc) {
      double acc = 0;
      for (int64_t i = 0; i < 63; ++i) acc += std::pow(std::fabs(x.data<float>()[nc * 63 + i]), static_cast<double>(p));
      want.data<float>()[nc] = static_cast<float>(std::pow(acc, 1.0 / static_cast<double>(p)));
    }
    check_close(g, want);
  }
  // Opset 1 takes p as a float attribute.
  Attrs legacy{ir::Attribute::make_ints("kernel_shape", {2, 2}), ir::Attribute::make_float("p", 3.0f)};
  check_close(run_node("LpPool", {x}, legacy, 1, 1)[0], lp_pool_naive(x, 2, 1, 0, 3.0));
}

TEST_CASE("GlobalAveragePool and GlobalMaxPool", "[pool][global]") {
  for (Shape s : {Shape{2, 3, 5, 7}, Shape{1, 4, 13}, Shape{2, 2, 3, 4, 5}, Shape{1, 3, 1, 1}}) {
    INFO(shape_str(s));
    Tensor x = test::random_tensor(s, 11);
    Tensor avg = run_node("GlobalAveragePool", {x}, {})[0];
    Tensor mx = run_node("GlobalMaxPool", {x}, {})[0];
    Shape ys(s.size(), 1);
    ys[0] = s[0];
    ys[1] = s[1];
    REQUIRE(avg.shape() == ys);
    REQUIRE(mx.shape() == ys);
    const int64_t planes = s[0] * s[1], n = x.numel() / planes;
    for (int64_t p = 0; p < planes; ++p) {
      double sum = 0, m = -1e30;
      for (int64_t i = 0; i < n; ++i) {
        sum += x.data<float>()[p * n + i];
        m = std::max<double>(m, x.data<float>()[p * n + i]);
      }
      CHECK(avg.data<float>()[p] == Approx(sum / static_cast<double>(n)).epsilon(1e-5));
      CHECK(mx.data<float>()[p] == static_cast<float>(m));
    }
  }
}

TEST_CASE("MaxUnpool inverts MaxPool's scatter", "[pool][maxunpool]") {
  Attrs attrs{ir::Attribute::make_ints("kernel_shape", {2, 2}), ir::Attribute::make_ints("strides", {2, 2})};
  // Default output size (in-1)*stride + kernel - pads: [2,3,8,6] for a [2,3,4,3] input.
  Tensor x = test::random_tensor({2, 3, 8, 6}, 21);
  std::vector<Tensor> mp = run_node("MaxPool", {x}, attrs, 2);
  Tensor y = run_node("MaxUnpool", {mp[0], mp[1]}, attrs)[0];
  REQUIRE(y.shape() == x.shape());
  std::vector<int> hit(static_cast<size_t>(y.numel()), 0);
  for (int64_t i = 0; i < mp[1].numel(); ++i) {
    const int64_t at = mp[1].data<int64_t>()[i];
    REQUIRE(at < y.numel());
    hit[static_cast<size_t>(at)] = 1;
    CHECK(y.data<float>()[at] == mp[0].data<float>()[i]);
    CHECK(y.data<float>()[at] == x.data<float>()[at]);
  }
  for (int64_t i = 0; i < y.numel(); ++i)
    if (!hit[static_cast<size_t>(i)]) CHECK(y.data<float>()[i] == 0.0f);
  // An odd input width is restored through the output_shape input.
  Tensor x7 = test::random_tensor({2, 3, 8, 7}, 22);
  std::vector<Tensor> mp7 = run_node("MaxPool", {x7}, attrs, 2);
  Tensor y7 = run_node("MaxUnpool", {mp7[0], mp7[1], Tensor::from<int64_t>({4}, {2, 3, 8, 7})}, attrs)[0];
  REQUIRE(y7.shape() == x7.shape());
  for (int64_t i = 0; i < mp7[1].numel(); ++i)
    CHECK(y7.data<float>()[mp7[1].data<int64_t>()[i]] == x7.data<float>()[mp7[1].data<int64_t>()[i]]);
  // Without output_shape the indices of the odd-width input fall outside the default output.
  CHECK_THROWS_AS(run_node("MaxUnpool", {mp7[0], mp7[1]}, attrs), Error);
  // An output_shape smaller than the default, or changing N, is rejected.
  CHECK_THROWS_AS(run_node("MaxUnpool", {mp[0], mp[1], Tensor::from<int64_t>({4}, {2, 3, 7, 6})}, attrs), Error);
  CHECK_THROWS_AS(run_node("MaxUnpool", {mp[0], mp[1], Tensor::from<int64_t>({4}, {1, 3, 8, 6})}, attrs), Error);
}

TEST_CASE("Pools reject malformed nodes", "[pool][negative]") {
  Tensor x = test::random_tensor({1, 3, 5, 5}, 1);
  CHECK_THROWS_AS(run_node("MaxPool", {x}, {}), Error);  // kernel_shape missing
  CHECK_THROWS_AS(run_node("MaxPool", {x}, {ir::Attribute::make_ints("kernel_shape", {3})}), Error);
  CHECK_THROWS_AS(run_node("MaxPool", {x}, {ir::Attribute::make_ints("kernel_shape", {3, 3}),
                                            ir::Attribute::make_string("auto_pad", "same")}),
                  Error);
  CHECK_THROWS_AS(run_node("MaxPool", {x}, {ir::Attribute::make_ints("kernel_shape", {3, 3}),
                                            ir::Attribute::make_int("storage_order", 2)}),
                  Error);
  CHECK_THROWS_AS(run_node("MaxPool", {x}, {ir::Attribute::make_ints("kernel_shape", {7, 7})}), Error);
  CHECK_THROWS_AS(run_node("AveragePool", {x}, {ir::Attribute::make_ints("kernel_shape", {3, 3}),
                                                ir::Attribute::make_ints("strides", {0, 1})}),
                  Error);
  CHECK_THROWS_AS(run_node("AveragePool", {x}, {ir::Attribute::make_ints("kernel_shape", {3, 3}),
                                                ir::Attribute::make_ints("pads", {1, 1, 1})}),
                  Error);
  CHECK_THROWS_AS(run_node("AveragePool", {test::random_tensor({3, 5}, 2)}, {ir::Attribute::make_ints("kernel_shape", {3})}),
                  Error);
  CHECK_THROWS_AS(run_node("GlobalAveragePool", {test::random_tensor({3, 5}, 2)}, {}), Error);
  CHECK_THROWS_AS(run_node("LpPool", {x}, {ir::Attribute::make_ints("kernel_shape", {3, 3}), ir::Attribute::make_int("p", 0)}),
                  Error);
}
