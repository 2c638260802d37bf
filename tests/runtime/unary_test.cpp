// Elementwise unary kernels (unary.cpp) against double-precision references: every activation
// and math function on odd shapes with fixed seeds (small tensors and tensors large enough to be
// split over threads and vectorised), special values (0, -0, inf, NaN, large magnitudes), the
// integer types, Clip and PRelu in their old and new forms, and malformed nodes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "runtime/cpu/unary.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;

namespace {

using Attrs = std::vector<ir::Attribute>;

std::vector<Tensor> run_node(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                             size_t n_outputs = 1, int opset = 20, int threads = 3) {
  return test::run_node(op, inputs, attrs, n_outputs, opset, threads);
}

Tensor run1(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs = {}, int opset = 20) {
  return run_node(op, inputs, attrs, 1, opset).at(0);
}

// Random values with a sprinkling of special ones.
Tensor test_input(const Shape& s, uint32_t seed, float lo, float hi, bool specials) {
  Tensor t = test::random_tensor(s, seed, lo, hi);
  if (specials) {
    const float sp[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN(), 1e-30f, -1e-30f, 1e-5f, -1e-5f, 87.0f, -87.0f, 0.5f,
                        -0.5f, 2.5f, -2.5f, 1.0f, -1.0f};
    float* p = t.data<float>();
    for (size_t i = 0; i < sizeof(sp) / sizeof(sp[0]) && static_cast<int64_t>(i * 7) < t.numel(); ++i) p[i * 7] = sp[i];
  }
  return t;
}

// Elementwise comparison with a relative tolerance; NaN must match NaN, inf must match exactly.
void check_close(const Tensor& got, const std::vector<double>& want, double rtol, double atol, const std::string& what) {
  INFO(what);
  REQUIRE(static_cast<size_t>(got.numel()) == want.size());
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.get_double(i);
    double b = want[static_cast<size_t>(i)];
    // A float32 result is compared with the reference rounded to float32 (overflow to inf included).
    if (got.dtype() == DType::Float32) b = static_cast<float>(b);
    bool ok;
    if (std::isnan(b)) ok = std::isnan(a);
    else if (std::isinf(b)) ok = a == b;
    else ok = std::fabs(a - b) <= atol + rtol * std::fabs(b);
    if (!ok && bad++ < 5) UNSCOPED_INFO("element " << i << ": got " << a << " want " << b);
  }
  CHECK(bad == 0);
}

struct FloatCase {
  std::string op;
  std::function<double(double)> ref;
  float lo, hi;
  Attrs attrs;
  int opset = 20;
};

double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplus_d(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

std::vector<FloatCase> float_cases() {
  const double selu_a = 1.67326319217681884765625, selu_g = 1.05070102214813232421875;
  return {
      {"Relu", [](double x) { return x < 0 ? 0.0 : x; }, -5, 5, {}},
      {"LeakyRelu", [](double x) { return x < 0 ? double(0.01f) * x : x; }, -5, 5, {}},
      {"LeakyRelu", [](double x) { return x < 0 ? double(0.3f) * x : x; }, -5, 5, {ir::Attribute::make_float("alpha", 0.3f)}},
      {"Elu", [](double x) { return x < 0 ? std::expm1(x) : x; }, -6, 6, {}},
      {"Elu", [](double x) { return x < 0 ? 2.0 * std::expm1(x) : x; }, -6, 6, {ir::Attribute::make_float("alpha", 2.0f)}},
      {"Selu", [=](double x) { return x <= 0 ? selu_g * selu_a * std::expm1(x) : selu_g * x; }, -6, 6, {}},
      {"Celu", [](double x) { return x > 0 ? x : double(0.7f) * std::expm1(x / double(0.7f)); }, -6, 6,
       {ir::Attribute::make_float("alpha", 0.7f)}},
      {"ThresholdedRelu", [](double x) { return x > 1.0 ? x : 0.0; }, -3, 3, {}},
      {"Sigmoid", sigmoid_d, -30, 30, {}},
      {"HardSigmoid", [](double x) { return std::clamp(double(0.2f) * x + 0.5, 0.0, 1.0); }, -6, 6, {}},
      {"HardSwish", [](double x) { return x * std::clamp(x / 6 + 0.5, 0.0, 1.0); }, -6, 6, {}},
      {"Tanh", [](double x) { return std::tanh(x); }, -10, 10, {}},
      {"Erf", [](double x) { return std::erf(x); }, -4, 4, {}},
      {"Gelu", [](double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }, -12, 8, {}},
      {"Gelu",
       [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }, -6, 8,
       {ir::Attribute::make_string("approximate", "tanh")}},
      {"Mish", [](double x) { return x * std::tanh(softplus_d(x)); }, -20, 20, {}},
      {"Softplus", softplus_d, -30, 30, {}},
      {"Softsign", [](double x) { return x / (1 + std::fabs(x)); }, -10, 10, {}},
      {"Sqrt", [](double x) { return std::sqrt(x); }, 0, 100, {}},
      {"Exp", [](double x) { return std::exp(x); }, -80, 80, {}},
      {"Log", [](double x) { return std::log(x); }, 1e-6f, 1e6f, {}},
      {"Neg", [](double x) { return -x; }, -5, 5, {}},
      {"Abs", [](double x) { return std::fabs(x); }, -5, 5, {}},
      {"Reciprocal", [](double x) { return 1.0 / x; }, 0.1f, 10, {}},
      {"Floor", [](double x) { return std::floor(x); }, -10, 10, {}},
      {"Ceil", [](double x) { return std::ceil(x); }, -10, 10, {}},
      {"Round", [](double x) { return std::nearbyint(x); }, -10, 10, {}},
      {"Sign", [](double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : x); }, -3, 3, {}},
      {"Sin", [](double x) { return std::sin(x); }, -6, 6, {}},
      {"Cos", [](double x) { return std::cos(x); }, -6, 6, {}},
      {"Tan", [](double x) { return std::tan(x); }, -1.4f, 1.4f, {}},
      {"Asin", [](double x) { return std::asin(x); }, -1, 1, {}},
      {"Acos", [](double x) { return std::acos(x); }, -1, 1, {}},
      {"Atan", [](double x) { return std::atan(x); }, -10, 10, {}},
      {"Sinh", [](double x) { return std::sinh(x); }, -5, 5, {}},
      {"Cosh", [](double x) { return std::cosh(x); }, -5, 5, {}},
      {"Asinh", [](double x) { return std::asinh(x); }, -10, 10, {}},
      {"Acosh", [](double x) { return std::acosh(x); }, 1, 10, {}},
      {"Atanh", [](double x) { return std::atanh(x); }, -0.99f, 0.99f, {}},
      {"Shrink", [](double x) { return x < -0.5 ? x : (x > 0.5 ? x : 0.0); }, -2, 2, {}},
      {"Shrink", [](double x) { return x < -1.5 ? x + 0.25 : (x > 1.5 ? x - 0.25 : 0.0); }, -3, 3,
       {ir::Attribute::make_float("lambd", 1.5f), ir::Attribute::make_float("bias", 0.25f)}},
  };
}

std::vector<double> apply_ref(const Tensor& x, const std::function<double(double)>& f) {
  std::vector<double> r(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) r[static_cast<size_t>(i)] = f(x.get_double(i));
  return r;
}

}  // namespace

TEST_CASE("unary float32 ops match double references", "[unary]") {
  uint32_t seed = 100;
  for (const FloatCase& c : float_cases()) {
    for (const Shape& shape : {Shape{3, 5, 7}, Shape{70001}}) {
      const Tensor x = test_input(shape, seed++, c.lo, c.hi, false);
      const Tensor y = run1(c.op, {x}, c.attrs, c.opset);
      REQUIRE(y.dtype() == DType::Float32);
      REQUIRE(y.shape() == shape);
      // The reference sees the float32 input; the kernel's float32 result must be within 2e-6.
      check_close(y, apply_ref(x, c.ref), 2e-6, 1e-6, c.op + " on " + shape_str(shape));
    }
  }
}

TEST_CASE("unary float32 ops give the same bits built for SSE2, AVX2 and AVX-512", "[unary]") {
  // Every float case on an odd length (vector bodies and scalar tails) with special values; the
  // AVX-512 build must not contract into FMA or take another path (unary.cpp). NaN results only
  // need to be NaN: their sign bit may differ between builds.
  struct Reset {
    ~Reset() { rt::cpu::force_unary_isa(rt::cpu::UnaryIsa::Auto); }
  } reset;
  uint32_t seed = 300;
  for (const FloatCase& c : float_cases()) {
    const Tensor x = test_input({1037}, seed++, c.lo, c.hi, true);
    std::vector<Tensor> outs;
    for (const auto isa : {rt::cpu::UnaryIsa::Baseline, rt::cpu::UnaryIsa::Avx2, rt::cpu::UnaryIsa::Avx512}) {
      if (rt::cpu::force_unary_isa(isa) != isa) WARN("this CPU lacks unary ISA " << static_cast<int>(isa));
      outs.push_back(run1(c.op, {x}, c.attrs, c.opset));
    }
    INFO(c.op);
    for (size_t k = 1; k < outs.size(); ++k) {
      REQUIRE(outs[k].numel() == outs[0].numel());
      int64_t first_diff = -1;
      for (int64_t i = 0; i < outs[0].numel() && first_diff < 0; ++i)
        if (std::memcmp(outs[k].data<float>() + i, outs[0].data<float>() + i, 4) != 0 &&
            !(std::isnan(outs[k].data<float>()[i]) && std::isnan(outs[0].data<float>()[i])))  // a NaN's sign is free
          first_diff = i;
      INFO("ISA " << k << " differs first at " << first_diff << ": x = " << (first_diff >= 0 ? x.data<float>()[first_diff] : 0.0f)
                  << ", " << (first_diff >= 0 ? outs[k].data<float>()[first_diff] : 0.0f) << " vs "
                  << (first_diff >= 0 ? outs[0].data<float>()[first_diff] : 0.0f));
      CHECK(first_diff == -1);
    }
  }
}

TEST_CASE("unary float32 ops handle special values", "[unary]") {
  const std::vector<std::string> ops = {"Relu", "LeakyRelu", "Elu", "Selu", "Sigmoid", "Tanh", "Erf", "Gelu", "Mish",
                                        "Softplus", "Softsign", "Exp", "Neg", "Abs", "Floor", "Ceil", "Round", "Sign"};
  for (const std::string& op : ops) {
    for (const FloatCase& c : float_cases()) {
      if (c.op != op || !c.attrs.empty()) continue;
      const Tensor x = test_input({9, 13}, 7, -100, 100, true);
      const Tensor y = run1(op, {x});
      std::vector<double> want = apply_ref(x, c.ref);
      // The double references give the IEEE answers at 0, inf and NaN.
      check_close(y, want, 2e-6, 1e-6, op + " with special values");
    }
  }
  // Log: 0 -> -inf, negative -> NaN, inf -> inf, denormal input.
  const Tensor x = Tensor::from<float>({6}, {0.0f, -1.0f, std::numeric_limits<float>::infinity(), 1e-40f, 1.0f, 3e38f});
  check_close(run1("Log", {x}), apply_ref(x, [](double v) { return std::log(v); }), 2e-6, 0, "Log special values");
}

TEST_CASE("Round is half to even and keeps the sign of zero", "[unary]") {
  const Tensor x = Tensor::from<float>({9}, {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 0.49999997f, 3.7f, -3.2f});
  const Tensor y = run1("Round", {x});
  const std::vector<float> want = {0, 2, 2, -0.0f, -2, -2, 0, 4, -3};
  for (int64_t i = 0; i < 9; ++i) CHECK(y.data<float>()[i] == want[static_cast<size_t>(i)]);
  CHECK(std::signbit(y.data<float>()[3]));
}

TEST_CASE("unary float64 ops use double precision", "[unary]") {
  uint32_t seed = 900;
  for (const FloatCase& c : float_cases()) {
    Tensor x = test_input({4, 9}, seed++, c.lo, c.hi, false).cast_to(DType::Float64);
    const Tensor y = run1(c.op, {x}, c.attrs, c.opset);
    REQUIRE(y.dtype() == DType::Float64);
    check_close(y, apply_ref(x, c.ref), 1e-12, 1e-14, c.op + " float64");
  }
}

TEST_CASE("unary ops on float16 run in float32 and round back", "[unary]") {
  Tensor x32 = test::random_tensor({5, 11}, 3, -4, 4);
  Tensor x16(DType::Float16, x32.shape());
  for (int64_t i = 0; i < x32.numel(); ++i) x16.data<Float16>()[i] = to_half(x32.data<float>()[i]);
  const Tensor y = run1("Sigmoid", {x16});
  REQUIRE(y.dtype() == DType::Float16);
  for (int64_t i = 0; i < y.numel(); ++i) {
    const double v = to_float(x16.data<Float16>()[i]);
    CHECK(std::fabs(to_float(y.data<Float16>()[i]) - sigmoid_d(v)) < 1e-3);
  }
}

TEST_CASE("integer unary ops", "[unary]") {
  const Tensor i32 = Tensor::from<int32_t>({7}, {-5, -1, 0, 1, 7, -2147483647, 2147483647});
  {
    const Tensor y = run1("Relu", {i32});
    const std::vector<int32_t> want = {0, 0, 0, 1, 7, 0, 2147483647};
    for (int64_t i = 0; i < 7; ++i) CHECK(y.data<int32_t>()[i] == want[static_cast<size_t>(i)]);
  }
  {
    const Tensor y = run1("Neg", {i32});
    for (int64_t i = 0; i < 7; ++i) CHECK(y.data<int32_t>()[i] == -i32.data<int32_t>()[i]);
  }
  {
    const Tensor y = run1("Abs", {Tensor::from<int8_t>({4}, {-3, 3, 0, -127})});
    const std::vector<int8_t> want = {3, 3, 0, 127};
    for (int64_t i = 0; i < 4; ++i) CHECK(y.data<int8_t>()[i] == want[static_cast<size_t>(i)]);
  }
  {
    const Tensor y = run1("Sign", {Tensor::from<int64_t>({3}, {-9, 0, 4})});
    CHECK(y.data<int64_t>()[0] == -1);
    CHECK(y.data<int64_t>()[1] == 0);
    CHECK(y.data<int64_t>()[2] == 1);
    const Tensor u = run1("Sign", {Tensor::from<uint8_t>({2}, {0, 200})});
    CHECK(u.data<uint8_t>()[0] == 0);
    CHECK(u.data<uint8_t>()[1] == 1);
  }
  {
    const Tensor y = run1("BitwiseNot", {Tensor::from<uint8_t>({3}, {0, 1, 0xf0})});
    CHECK(y.data<uint8_t>()[0] == 0xff);
    CHECK(y.data<uint8_t>()[1] == 0xfe);
    CHECK(y.data<uint8_t>()[2] == 0x0f);
    const Tensor z = run1("BitwiseNot", {Tensor::from<int32_t>({2}, {0, -1})});
    CHECK(z.data<int32_t>()[0] == -1);
    CHECK(z.data<int32_t>()[1] == 0);
  }
}

TEST_CASE("IsNaN, IsInf and Not", "[unary]") {
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x = Tensor::from<float>({5}, {1.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 0.0f});
  const Tensor n = run1("IsNaN", {x});
  REQUIRE(n.dtype() == DType::Bool);
  const std::vector<bool> nan_want = {false, false, false, true, false};
  for (int64_t i = 0; i < 5; ++i) CHECK(n.data<bool>()[i] == nan_want[static_cast<size_t>(i)]);
  struct Flags {
    int64_t neg, pos;
    std::vector<bool> want;
  };
  for (const Flags& f : {Flags{1, 1, {false, true, true, false, false}}, Flags{0, 1, {false, true, false, false, false}},
                         Flags{1, 0, {false, false, true, false, false}}}) {
    const Tensor y = run1("IsInf", {x}, {ir::Attribute::make_int("detect_negative", f.neg),
                                         ir::Attribute::make_int("detect_positive", f.pos)});
    for (int64_t i = 0; i < 5; ++i) CHECK(y.data<bool>()[i] == f.want[static_cast<size_t>(i)]);
  }
  const Tensor b = Tensor::from<bool>({3}, {true, false, true});
  const Tensor nb = run1("Not", {b});
  CHECK(!nb.data<bool>()[0]);
  CHECK(nb.data<bool>()[1]);
  CHECK(!nb.data<bool>()[2]);
}

TEST_CASE("Clip: attributes before opset 11, optional inputs after, integer types", "[unary]") {
  const Tensor x = test_input({6, 7}, 11, -3, 3, false);
  auto clip_ref = [](double lo, double hi) {
    return [=](double v) { return std::min(hi, std::max(v, lo)); };
  };
  // Opset 6: attributes.
  check_close(run1("Clip", {x}, {ir::Attribute::make_float("min", -1.0f), ir::Attribute::make_float("max", 0.5f)}, 6),
              apply_ref(x, clip_ref(-1.0, 0.5)), 0, 0, "Clip opset 6");
  check_close(run1("Clip", {x}, {ir::Attribute::make_float("max", 0.5f)}, 6), apply_ref(x, clip_ref(-1e30, 0.5)), 0, 0,
              "Clip opset 6 max only");
  // Opset 13: inputs, min omitted.
  check_close(run1("Clip", {x, Tensor(), Tensor::scalar<float>(1.25f)}, {}, 13), apply_ref(x, clip_ref(-1e30, 1.25)), 0, 0,
              "Clip opset 13 max only");
  check_close(run1("Clip", {x, Tensor::scalar<float>(-0.25f)}, {}, 13), apply_ref(x, clip_ref(-0.25, 1e30)), 0, 0,
              "Clip opset 13 min only");
  check_close(run1("Clip", {x}, {}, 13), apply_ref(x, clip_ref(-1e30, 1e30)), 0, 0, "Clip without bounds");
  // min > max: everything becomes max (numpy's order of application).
  check_close(run1("Clip", {x, Tensor::scalar<float>(2.0f), Tensor::scalar<float>(1.0f)}, {}, 13),
              apply_ref(x, clip_ref(2.0, 1.0)), 0, 0, "Clip min > max");
  // Integers.
  const Tensor xi = Tensor::from<int8_t>({5}, {-128, -3, 0, 5, 127});
  const Tensor yi = run1("Clip", {xi, Tensor::scalar<int8_t>(-2), Tensor::scalar<int8_t>(4)}, {}, 13);
  const std::vector<int8_t> want = {-2, -2, 0, 4, 4};
  for (int64_t i = 0; i < 5; ++i) CHECK(yi.data<int8_t>()[i] == want[static_cast<size_t>(i)]);
  // Bad bounds.
  CHECK_THROWS_AS(run1("Clip", {x, Tensor::from<float>({2}, {0.0f, 1.0f})}, {}, 13), Error);
  CHECK_THROWS_AS(run1("Clip", {x, Tensor::scalar<double>(0.0)}, {}, 13), Error);
}

TEST_CASE("PRelu broadcasts the slope to X", "[unary]") {
  const Tensor x = test_input({2, 3, 4, 5}, 21, -2, 2, false);
  const Tensor slope = test::random_tensor({3, 1, 1}, 22, 0, 1);
  const Tensor y = run1("PRelu", {x, slope}, {}, 16);
  std::vector<double> want(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t c = (i / 20) % 3;
    const double v = x.get_double(i);
    want[static_cast<size_t>(i)] = v < 0 ? slope.get_double(c) * v : v;
  }
  check_close(y, want, 1e-6, 0, "PRelu [3,1,1] slope");
  // Legacy opset 6: a 1-D slope of size C applies per channel.
  const Tensor legacy = run1("PRelu", {x, slope.reshaped({3})}, {}, 6);
  check_close(legacy, want, 1e-6, 0, "PRelu legacy per-channel slope");
  // Scalar slope and int32.
  const Tensor yi = run1("PRelu", {Tensor::from<int32_t>({4}, {-4, -1, 0, 3}), Tensor::from<int32_t>({1}, {3})}, {}, 16);
  CHECK(yi.data<int32_t>()[0] == -12);
  CHECK(yi.data<int32_t>()[1] == -3);
  CHECK(yi.data<int32_t>()[3] == 3);
  // A slope that would enlarge X is rejected.
  CHECK_THROWS_AS(run1("PRelu", {x.reshaped({2, 3, 20}), test::random_tensor({2, 3, 20, 1}, 1)}, {}, 16), Error);
  CHECK_THROWS_AS(run1("PRelu", {x, test::random_tensor({4}, 1)}, {}, 16), Error);
}

TEST_CASE("unary ops on empty tensors", "[unary]") {
  for (const char* op : {"Sigmoid", "Relu", "Exp", "Round"}) {
    const Tensor y = run1(op, {Tensor(DType::Float32, {0, 3})});
    CHECK(y.shape() == Shape({0, 3}));
  }
  CHECK(run1("IsNaN", {Tensor(DType::Float32, {2, 0})}).shape() == Shape({2, 0}));
}

TEST_CASE("unary ops reject bad inputs and attributes", "[unary]") {
  const Tensor f = test::random_tensor({3}, 1);
  CHECK_THROWS_AS(run1("Relu", {Tensor::from<bool>({1}, {true})}), Error);
  CHECK_THROWS_AS(run1("Relu", {Tensor::from<uint8_t>({1}, {1})}), Error);
  CHECK_THROWS_AS(run1("Sqrt", {Tensor::from<int32_t>({1}, {4})}), Error);
  CHECK_THROWS_AS(run1("Sigmoid", {Tensor::from<int64_t>({1}, {4})}), Error);
  CHECK_THROWS_AS(run1("Gelu", {f}, {ir::Attribute::make_string("approximate", "erf")}), Error);
  CHECK_THROWS_AS(run1("Celu", {f}, {ir::Attribute::make_float("alpha", 0.0f)}), Error);
  CHECK_THROWS_AS(run1("Not", {f}), Error);
  CHECK_THROWS_AS(run1("BitwiseNot", {f}), Error);
  CHECK_THROWS_AS(run1("IsNaN", {Tensor::from<int32_t>({1}, {4})}), Error);
  CHECK_THROWS_AS(run1("PRelu", {f, Tensor::from<double>({1}, {0.1})}), Error);
  // Gelu does not exist before opset 20.
  CHECK_THROWS_AS(run1("Gelu", {f}, {}, 17), Error);
}
