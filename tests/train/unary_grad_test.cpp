// Backward of the element-wise unary ops (train/grads/unary_grad.cpp) against float64 central
// finite differences on odd shapes, every attribute and opset variant, inputs kept away from the
// kinks where finite differences are not valid.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ir/graph.h"
#include "runtime/cpu/unary.h"
#include "test_util.h"
#include "train/autograd.h"
#include "train/grad_check.h"

using namespace mpq;
using ir::Attribute;

namespace {

const Shape kShape = {3, 13, 9, 7};

// Moves every element within `margin` of one of `kinks` to that distance from it.
Tensor away_from(Tensor t, const std::vector<float>& kinks, float margin = 0.05f) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    for (float k : kinks)
      if (std::fabs(p[i] - k) < margin) p[i] = p[i] >= k ? k + margin : k - margin;
  return t;
}

Tensor input(uint32_t seed, float lo = -3, float hi = 3, const std::vector<float>& kinks = {}) {
  return away_from(test::random_tensor(kShape, seed, lo, hi), kinks);
}

// Finite-difference settings for inputs of a few thousand elements: the loss sums that many
// terms, and its rounding (about 1e-14) over 2 eps would swamp the default atol at eps = 1e-6.
test::GradCheckOptions fd_options(int opset = 17) {
  test::GradCheckOptions o;
  o.opset = opset;
  o.eps = 1e-5;
  o.atol = 1e-8;
  return o;
}

bool bit_identical(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

struct Case {
  const char* op;
  std::vector<Attribute> attrs;
  float lo, hi;
  std::vector<float> kinks;
  int opset = 17;
};

}  // namespace

TEST_CASE("Activations and math functions backward", "[train][grad]") {
  const std::vector<Case> cases = {
      {"Relu", {}, -3, 3, {0}},
      {"LeakyRelu", {}, -3, 3, {0}},
      {"LeakyRelu", {Attribute::make_float("alpha", 0.2f)}, -3, 3, {0}},
      {"Elu", {}, -3, 3, {0}},
      {"Elu", {Attribute::make_float("alpha", 0.7f)}, -3, 3, {0}},
      {"Sigmoid", {}, -6, 6, {}},
      {"Tanh", {}, -3, 3, {}},
      {"HardSigmoid", {}, -4, 4, {-2.5f, 2.5f}},
      {"HardSigmoid", {Attribute::make_float("alpha", 1.0f / 6), Attribute::make_float("beta", 0.5f)}, -5, 5, {-3, 3}},
      {"HardSwish", {}, -5, 5, {-3, 3}},
      {"Erf", {}, -3, 3, {}},
      {"Gelu", {}, -4, 4, {}, 20},
      {"Gelu", {Attribute::make_string("approximate", "none")}, -4, 4, {}, 20},
      {"Gelu", {Attribute::make_string("approximate", "tanh")}, -4, 4, {}, 20},
      {"Softplus", {}, -6, 6, {}},
      {"Sqrt", {}, 0.2f, 4, {}},
      {"Exp", {}, -3, 2, {}},
      {"Log", {}, 0.2f, 5, {}},
      {"Neg", {}, -3, 3, {}},
      {"Abs", {}, -3, 3, {0}},
      {"Reciprocal", {}, 0.4f, 3, {}},
      {"Reciprocal", {}, -3, -0.4f, {}},
      {"Identity", {}, -3, 3, {}},
      {"Cast", {Attribute::make_int("to", 11)}, -3, 3, {}},  // float64 (float32 -> float64 on the float32 pass)
  };
  uint32_t seed = 100;
  for (const Case& c : cases) {
    for (int rep = 0; rep < 2; ++rep) {
      INFO(c.op << " case seed " << seed);
      test::GradCheckOptions o = fd_options(c.opset);
      o.seed = seed;
      test::check_gradients(c.op, {input(seed++, c.lo, c.hi, c.kinks)}, c.attrs, o);
    }
  }
}

TEST_CASE("Clip backward: attribute bounds before opset 11, optional inputs after", "[train][grad]") {
  test::GradCheckOptions o = fd_options();
  o.wrt = {0};
  SECTION("ReLU6 as attributes (opset 6)") {
    o.opset = 6;
    for (uint32_t seed : {1u, 2u})
      test::check_gradients("Clip", {input(seed, -2, 8, {0, 6})},
                            {Attribute::make_float("min", 0.0f), Attribute::make_float("max", 6.0f)}, o);
    test::check_gradients("Clip", {input(3, -2, 2, {-0.5f})}, {Attribute::make_float("min", -0.5f)}, o);
    test::check_gradients("Clip", {input(4, -2, 2, {0.7f})}, {Attribute::make_float("max", 0.7f)}, o);
    test::check_gradients("Clip", {input(5, -2, 2)}, {}, o);
  }
  SECTION("bounds as inputs (opset 13)") {
    o.opset = 13;
    const Tensor lo = Tensor::scalar<float>(0.0f), hi = Tensor::scalar<float>(6.0f);
    for (uint32_t seed : {6u, 7u}) test::check_gradients("Clip", {input(seed, -2, 8, {0, 6}), lo, hi}, {}, o);
    test::check_gradients("Clip", {input(8, -2, 2, {-0.3f}), Tensor::scalar<float>(-0.3f)}, {}, o);
    test::check_gradients("Clip", {input(9, -2, 2, {0.4f}), Tensor(), Tensor::scalar<float>(0.4f)}, {}, o);
    test::check_gradients("Clip", {input(10, -2, 2)}, {}, o);
  }
  SECTION("the gradient passes at the bounds themselves, as in PyTorch; bounds get none") {
    o.opset = 13;
    o.wrt = {0, 1, 2};  // bounds as graph inputs: the engine must still not differentiate them
    const Tensor x = Tensor::from<float>({5}, {-1.0f, 0.0f, 3.0f, 6.0f, 7.0f});
    const auto g = test::node_gradients("Clip", {x.cast_to(DType::Float64), Tensor::scalar<double>(0.0), Tensor::scalar<double>(6.0)},
                                        {}, o);
    REQUIRE(g[0].defined());
    const auto g_id = test::node_gradients("Identity", {x.cast_to(DType::Float64)}, {}, o);  // the loss weights R
    for (int64_t i = 0; i < 5; ++i) {
      const double expect = (i == 0 || i == 4) ? 0.0 : g_id[0].get_double(i);
      CHECK(g[0].get_double(i) == expect);
    }
    CHECK_FALSE(g[1].defined());
    CHECK_FALSE(g[2].defined());
  }
}

TEST_CASE("PRelu backward reaches X and the broadcast slope", "[train][grad]") {
  const std::vector<Shape> slopes = {{13, 1, 1}, {7}, {1}, {1, 13, 9, 1}, {3, 13, 9, 7}};
  uint32_t seed = 200;
  for (const Shape& s : slopes) {
    INFO("slope " << shape_str(s));
    for (int rep = 0; rep < 2; ++rep) {
      test::GradCheckOptions o = fd_options();
      o.seed = seed;
      test::check_gradients("PRelu", {input(seed, -3, 3, {0}), test::random_tensor(s, seed + 1, -0.5f, 0.8f)}, {}, o);
      seed += 2;
    }
  }
  SECTION("1-D channel slope before opset 7") {
    test::GradCheckOptions o = fd_options(6);
    test::check_gradients("PRelu", {input(300, -3, 3, {0}), test::random_tensor({13}, 301, 0.05f, 0.4f)}, {}, o);
  }
}

TEST_CASE("Dropout backward: identity without training mode, no gradient through the mask", "[train][grad]") {
  test::GradCheckOptions o = fd_options();
  o.wrt = {0};
  SECTION("opset 7, ratio attribute, mask output") {
    o.opset = 7;
    o.n_outputs = 2;
    test::check_gradients("Dropout", {input(11)}, {Attribute::make_float("ratio", 0.3f)}, o);
  }
  SECTION("opset 13 without training_mode, and with training_mode false") {
    o.opset = 13;
    test::check_gradients("Dropout", {input(12)}, {}, o);
    o.n_outputs = 2;
    Tensor off(DType::Bool, {});
    off.data<bool>()[0] = false;
    test::check_gradients("Dropout", {input(13), Tensor::scalar<float>(0.4f), off}, {}, o);
  }
  SECTION("training_mode true with a ratio is refused naming the node") {
    o.opset = 13;
    Tensor on(DType::Bool, {});
    on.data<bool>()[0] = true;
    const Tensor x = input(14).cast_to(DType::Float64);
    try {
      test::node_gradients("Dropout", {x, Tensor::scalar<double>(0.4), on}, {}, o);
      FAIL("expected an error");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::Unsupported);
      CHECK_THAT(e.what(), Catch::Contains("node_under_test") && Catch::Contains("training-mode Dropout"));
    }
  }
}

TEST_CASE("GELU written out with Erf (as exporters write it) has the exact GELU gradient", "[train][grad]") {
  // y = x * 0.5 * (1 + erf(x / sqrt 2)): Div, Erf, Add, Mul, Mul.
  ir::Model m;
  m.set_opset("", 13);
  ir::Graph* g = m.graph.get();
  const Tensor x = test::random_tensor(kShape, 400, -4, 4).cast_to(DType::Float64);
  ir::Value* in = g->add_value("x", ir::ValueType::tensor(DType::Float64, kShape));
  g->add_input(in);
  auto value = [&](const char* name) { return g->add_value(name); };
  ir::Value *scaled = value("scaled"), *erf = value("erf"), *one_plus = value("one_plus"), *prod = value("prod"),
            *y = value("y");
  g->add_node("Div", {in, g->add_initializer("sqrt2", Tensor::scalar<double>(std::sqrt(2.0)))}, {scaled}, "div");
  g->add_node("Erf", {scaled}, {erf}, "erf");
  g->add_node("Add", {erf, g->add_initializer("one", Tensor::scalar<double>(1.0))}, {one_plus}, "add");
  g->add_node("Mul", {in, one_plus}, {prod}, "mul");
  g->add_node("Mul", {prod, g->add_initializer("half", Tensor::scalar<double>(0.5))}, {y}, "half");
  g->add_output(y);
  train::AutogradOptions opt;
  opt.threads = 2;
  opt.input_grads = true;
  opt.default_parameters = false;
  train::Autograd engine(m, opt);
  engine.forward({{"x", x}});
  const Tensor r = test::random_tensor(kShape, 401).cast_to(DType::Float64);
  engine.backward({r});
  const Tensor& dx = engine.input_grads().at(0);
  REQUIRE(dx.defined());
  double worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.get_double(i);
    const double expect = r.get_double(i) * (0.5 * std::erfc(-v / std::sqrt(2.0)) + v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI));
    worst = std::max(worst, std::fabs(dx.get_double(i) - expect));
  }
  CHECK(worst < 1e-12);
}

TEST_CASE("Unary backward is bit-identical at any thread count", "[train][grad]") {
  const Shape big = {4, 16, 33, 31};  // several parallel chunks
  struct Det {
    const char* op;
    std::vector<Tensor> inputs;
    std::vector<Attribute> attrs;
    int opset;
  };
  const std::vector<Det> cases = {
      {"PRelu", {test::random_tensor(big, 1), test::random_tensor({16, 1, 1}, 2)}, {}, 17},
      {"Gelu", {test::random_tensor(big, 3, -4, 4)}, {Attribute::make_string("approximate", "tanh")}, 20},
      {"Sigmoid", {test::random_tensor(big, 4, -4, 4)}, {}, 17},
      {"HardSwish", {test::random_tensor(big, 5, -4, 4)}, {}, 17},
  };
  for (const Det& c : cases) {
    INFO(c.op);
    test::GradCheckOptions o;
    o.opset = c.opset;
    o.threads = 1;
    const auto one = test::node_gradients(c.op, c.inputs, c.attrs, o);
    o.threads = 3;
    const auto three = test::node_gradients(c.op, c.inputs, c.attrs, o);
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      REQUIRE(one[i].defined());
      CHECK(bit_identical(one[i], three[i]));
    }
  }
}

TEST_CASE("Unary backward gives the same bits built for SSE2, AVX2 and AVX-512", "[train][grad]") {
  // The float32 loop runs the build rt::cpu::unary_isa() picks (unary_grad.cpp); an odd length
  // covers the vector bodies and the scalar tails.
  struct Reset {
    ~Reset() { rt::cpu::force_unary_isa(rt::cpu::UnaryIsa::Auto); }
  } reset;
  struct Case {
    const char* op;
    float lo, hi;
    std::vector<Attribute> attrs;
    int opset;
  };
  const std::vector<Case> cases = {
      {"Relu", -3, 3, {}, 17},           {"LeakyRelu", -3, 3, {}, 17},   {"Elu", -3, 3, {}, 17},
      {"Sigmoid", -9, 9, {}, 17},        {"Tanh", -5, 5, {}, 17},        {"HardSigmoid", -4, 4, {}, 17},
      {"HardSwish", -4, 4, {}, 17},      {"Erf", -4, 4, {}, 17},         {"Softplus", -9, 9, {}, 17},
      {"Sqrt", 0.01f, 9, {}, 17},        {"Exp", -9, 9, {}, 17},         {"Log", 0.01f, 9, {}, 17},
      {"Abs", -3, 3, {}, 17},            {"Reciprocal", 0.1f, 9, {}, 17},
      {"Gelu", -6, 6, {Attribute::make_string("approximate", "none")}, 20},
      {"Gelu", -6, 6, {Attribute::make_string("approximate", "tanh")}, 20},
  };
  uint32_t seed = 700;
  for (const Case& c : cases) {
    INFO(c.op);
    const Tensor x = test::random_tensor({1037}, seed++, c.lo, c.hi);
    test::GradCheckOptions o;
    o.opset = c.opset;
    std::vector<Tensor> grads;
    for (const auto isa : {rt::cpu::UnaryIsa::Baseline, rt::cpu::UnaryIsa::Avx2, rt::cpu::UnaryIsa::Avx512}) {
      if (rt::cpu::force_unary_isa(isa) != isa) WARN("this CPU lacks unary ISA " << static_cast<int>(isa));
      grads.push_back(test::node_gradients(c.op, {x}, c.attrs, o).at(0));
    }
    for (size_t k = 1; k < grads.size(); ++k) {
      REQUIRE(grads[k].defined());
      CHECK(bit_identical(grads[0], grads[k]));
    }
  }
}
