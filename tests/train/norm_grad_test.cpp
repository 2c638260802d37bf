// BatchNormalization (training forward and backward, batch and running statistics) and
// LayerNormalization backward (train/grads/norm_grad.cpp) against float64 finite differences on
// odd shapes; running-statistic updates against hand-computed values over two steps; the eval
// form against the inference kernel; thread-count determinism; errors that name the node.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "ir/graph.h"
#include "runtime/thread_pool.h"
#include "test_util.h"
#include "train/autograd.h"
#include "train/grad_check.h"
#include "train/grad_registry.h"

using namespace mpq;
using ir::Attribute;

namespace {

// The loss sums a few thousand terms and one training-mode BatchNormalization input moves a whole
// channel; eps = 1e-4 keeps the rounding of that sum under atol (the functions are smooth).
test::GradCheckOptions fd_options(int opset, uint32_t seed, bool training) {
  test::GradCheckOptions o;
  o.opset = opset;
  o.seed = seed;
  o.eps = 1e-4;
  o.atol = 1e-8;
  o.training = training;
  return o;
}

bool bit_identical(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// X, scale, B, running mean, running var for a BatchNormalization over `shape` with `f` features.
std::vector<Tensor> bn_inputs(const Shape& shape, int64_t f, uint32_t seed, const Shape& param_shape = {}) {
  const Shape ps = param_shape.empty() ? Shape{f} : param_shape;
  return {test::random_tensor(shape, seed, -2, 3), test::random_tensor(ps, seed + 1, 0.5f, 1.5f),
          test::random_tensor(ps, seed + 2, -0.5f, 0.5f), test::random_tensor(ps, seed + 3, -0.3f, 0.3f),
          test::random_tensor(ps, seed + 4, 0.5f, 2.0f)};
}

}  // namespace

TEST_CASE("BatchNormalization backward in training and eval mode, ranks 2 to 5", "[train][grad]") {
  const std::vector<Shape> shapes = {{5, 13}, {3, 13, 11}, {3, 13, 9, 7}, {2, 5, 3, 4, 3}};
  uint32_t seed = 1100;
  for (const Shape& s : shapes) {
    for (bool training : {true, false}) {
      for (int rep = 0; rep < 2; ++rep) {
        INFO(shape_str(s) << (training ? " training" : " eval") << " seed " << seed);
        test::GradCheckOptions o = fd_options(15, seed, training);
        o.wrt = {0, 1, 2};
        std::vector<Attribute> attrs;
        if (rep == 1) attrs = {Attribute::make_float("epsilon", 1e-3f), Attribute::make_float("momentum", 0.8f)};
        test::check_gradients("BatchNormalization", bn_inputs(s, s[1], seed), attrs, o);
        seed += 5;
      }
    }
  }
}

TEST_CASE("BatchNormalization exported with training outputs: they carry no gradient", "[train][grad]") {
  SECTION("opset 15, training_mode=1, running mean and variance outputs") {
    for (bool training : {true, false}) {
      test::GradCheckOptions o = fd_options(15, 1200, training);
      o.wrt = {0, 1, 2};
      o.n_outputs = 3;
      o.loss_outputs = {0};
      test::check_gradients("BatchNormalization", bn_inputs({3, 13, 9, 7}, 13, 1200), {Attribute::make_int("training_mode", 1)}, o);
    }
  }
  SECTION("opset 7, five outputs") {
    test::GradCheckOptions o = fd_options(7, 1210, true);
    o.wrt = {0, 1, 2};
    o.n_outputs = 5;
    o.loss_outputs = {0};
    test::check_gradients("BatchNormalization", bn_inputs({3, 13, 5, 3}, 13, 1210), {}, o);
  }
  SECTION("spatial=0 before opset 9: one statistic per element of [C, H, W]") {
    for (bool training : {true, false}) {
      test::GradCheckOptions o = fd_options(8, 1220, training);
      o.wrt = {0, 1, 2};
      test::check_gradients("BatchNormalization", bn_inputs({4, 3, 5, 2}, 30, 1220, {3, 5, 2}),
                            {Attribute::make_int("spatial", 0)}, o);
    }
  }
}

namespace {

// A BatchNormalization model: X a graph input, scale/B/mean/var initializers.
ir::Model bn_model(const std::vector<Tensor>& params, float momentum, int opset, int n_outputs = 1) {
  ir::Model m;
  m.set_opset("", opset);
  ir::Graph* g = m.graph.get();
  ir::Value* x = g->add_value("x", ir::ValueType::tensor(DType::Float32, {3, 4, 5}));
  g->add_input(x);
  std::vector<ir::Value*> ins = {x};
  const char* names[] = {"scale", "bias", "mean", "var"};
  for (size_t i = 0; i < 4; ++i) ins.push_back(g->add_initializer(names[i], params[i]));
  std::vector<ir::Value*> outs;
  for (int j = 0; j < n_outputs; ++j) {
    outs.push_back(g->add_value("y" + std::to_string(j)));
    g->add_output(outs.back());
  }
  ir::Node* n = g->add_node("BatchNormalization", ins, outs, "bn");
  n->set_attr(Attribute::make_float("momentum", momentum));
  if (n_outputs > 1) n->set_attr(Attribute::make_int("training_mode", 1));
  return m;
}

// Per channel of [N, C, S]: batch mean and biased variance, in double.
void batch_stats(const Tensor& x, std::vector<double>& mean, std::vector<double>& var) {
  const int64_t N = x.dim(0), C = x.dim(1), S = x.dim(2);
  mean.assign(static_cast<size_t>(C), 0.0);
  var.assign(static_cast<size_t>(C), 0.0);
  for (int64_t c = 0; c < C; ++c) {
    double s = 0, q = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < S; ++i) s += x.get_double((n * C + c) * S + i);
    const double m = s / static_cast<double>(N * S);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < S; ++i) q += std::pow(x.get_double((n * C + c) * S + i) - m, 2);
    mean[static_cast<size_t>(c)] = m;
    var[static_cast<size_t>(c)] = q / static_cast<double>(N * S);
  }
}

const Tensor* find_state(const train::Autograd& engine, const std::string& name) {
  for (const train::StateBuffer& b : engine.state())
    if (b.name == name) return &b.value;
  return nullptr;
}

}  // namespace

TEST_CASE("BatchNormalization running statistics follow PyTorch over two steps", "[train][grad]") {
  const float momentum = 0.8f;  // ONNX momentum: PyTorch's momentum 0.2
  const std::vector<Tensor> params = {test::random_tensor({4}, 1, 0.5f, 1.5f), test::random_tensor({4}, 2),
                                      test::random_tensor({4}, 3), test::random_tensor({4}, 4, 0.5f, 2.0f)};
  ir::Model m = bn_model(params, momentum, 15);
  train::AutogradOptions opt;
  opt.threads = 2;
  train::Autograd engine(m, opt);
  REQUIRE(engine.training());
  std::vector<double> run_mean(4), run_var(4);
  for (size_t c = 0; c < 4; ++c) {
    run_mean[c] = params[2].get_double(static_cast<int64_t>(c));
    run_var[c] = params[3].get_double(static_cast<int64_t>(c));
  }
  const double M = 3 * 5;
  for (uint32_t step = 0; step < 2; ++step) {
    INFO("step " << step);
    const Tensor x = test::random_tensor({3, 4, 5}, 10 + step, -1, 4);
    const std::vector<Tensor> y = engine.forward({{"x", x}});
    std::vector<double> bm, bv;
    batch_stats(x, bm, bv);
    for (size_t c = 0; c < 4; ++c) {
      run_mean[c] = momentum * run_mean[c] + (1 - momentum) * bm[c];
      run_var[c] = momentum * run_var[c] + (1 - momentum) * bv[c] * M / (M - 1);  // unbiased
    }
    const Tensor* mean = find_state(engine, "mean");
    const Tensor* var = find_state(engine, "var");
    REQUIRE(mean);
    REQUIRE(var);
    for (size_t c = 0; c < 4; ++c) {
      CHECK(mean->get_double(static_cast<int64_t>(c)) == Approx(run_mean[c]).epsilon(1e-6));
      CHECK(var->get_double(static_cast<int64_t>(c)) == Approx(run_var[c]).epsilon(1e-6));
    }
    // Y is normalised with the batch statistics (biased variance), not the running ones.
    for (int64_t i = 0; i < x.numel(); ++i) {
      const size_t c = static_cast<size_t>((i / 5) % 4);
      const double expect = (x.get_double(i) - bm[c]) / std::sqrt(bv[c] + 1e-5) * params[0].get_double(static_cast<int64_t>(c)) +
                            params[1].get_double(static_cast<int64_t>(c));
      CHECK(y[0].get_double(i) == Approx(expect).margin(1e-5));
    }
  }
  // Eval mode uses (and keeps) the running statistics; write_back stores them.
  engine.set_training(false);
  const Tensor x = test::random_tensor({3, 4, 5}, 20);
  const std::vector<Tensor> y = engine.forward({{"x", x}});
  for (int64_t i = 0; i < x.numel(); ++i) {
    const size_t c = static_cast<size_t>((i / 5) % 4);
    const double expect = (x.get_double(i) - run_mean[c]) / std::sqrt(run_var[c] + 1e-5) * params[0].get_double(static_cast<int64_t>(c)) +
                          params[1].get_double(static_cast<int64_t>(c));
    CHECK(y[0].get_double(i) == Approx(expect).margin(1e-5));
  }
  CHECK(find_state(engine, "mean")->get_double(0) == Approx(run_mean[0]).epsilon(1e-6));
  engine.write_back(m);
  CHECK(m.graph->find("var")->initializer().get_double(3) == Approx(run_var[3]).epsilon(1e-6));
}

TEST_CASE("BatchNormalization exported in training mode outputs the new running statistics", "[train][grad]") {
  const std::vector<Tensor> params = {test::random_tensor({4}, 1, 0.5f, 1.5f), test::random_tensor({4}, 2),
                                      test::random_tensor({4}, 3), test::random_tensor({4}, 4, 0.5f, 2.0f)};
  ir::Model m = bn_model(params, 0.9f, 15, 3);
  train::AutogradOptions opt;
  opt.threads = 1;
  train::Autograd engine(m, opt);
  const std::vector<Tensor> y = engine.forward({{"x", test::random_tensor({3, 4, 5}, 30)}});
  REQUIRE(y.size() == 3);
  CHECK(bit_identical(y[1], *find_state(engine, "mean")));
  CHECK(bit_identical(y[2], *find_state(engine, "var")));
}

TEST_CASE("BatchNormalization in eval mode equals the inference kernel bit for bit", "[train][grad]") {
  const std::vector<Tensor> in = bn_inputs({3, 13, 9, 7}, 13, 1300);
  const std::vector<Tensor> ref = test::run_node("BatchNormalization", in, {}, 1, 15, 2);
  ir::Model m;
  m.set_opset("", 15);
  ir::Graph* g = m.graph.get();
  ir::Value* x = g->add_value("x", ir::ValueType::tensor(DType::Float32, in[0].shape()));
  g->add_input(x);
  std::vector<ir::Value*> ins = {x};
  for (size_t i = 1; i < 5; ++i) ins.push_back(g->add_initializer("p" + std::to_string(i), in[i]));
  ir::Value* y = g->add_value("y");
  g->add_output(y);
  g->add_node("BatchNormalization", ins, {y}, "bn");
  train::AutogradOptions opt;
  opt.training = false;
  train::Autograd engine(m, opt);
  CHECK(bit_identical(engine.forward({{"x", in[0]}})[0], ref[0]));
}

TEST_CASE("BatchNormalization training needs more than one value per channel", "[train][grad]") {
  test::GradCheckOptions o = fd_options(15, 1, true);
  o.wrt = {0};
  CHECK_THROWS_WITH(test::node_gradients("BatchNormalization", bn_inputs({1, 3}, 3, 1), {}, o),
                    Catch::Contains("node_under_test") && Catch::Contains("more than one value per channel"));
}

TEST_CASE("LayerNormalization backward: axes, epsilon, optional bias, broadcast parameters", "[train][grad]") {
  const Shape shape = {3, 13, 9, 7};
  struct Case {
    int64_t axis;
    Shape scale, bias;  // empty bias: omitted
  };
  const std::vector<Case> cases = {
      {-1, {7}, {7}},         {-1, {7}, {}},         {3, {7}, {1}},             {2, {9, 7}, {9, 7}},
      {-2, {9, 1}, {7}},      {1, {13, 9, 7}, {1}},  {-3, {7}, {13, 1, 1}},     {0, {3, 13, 9, 7}, {}},
      {-4, {9, 7}, {13, 1, 7}},
  };
  uint32_t seed = 1400;
  for (const Case& c : cases) {
    for (int rep = 0; rep < 2; ++rep) {
      INFO("axis " << c.axis << " scale " << shape_str(c.scale) << " bias " << shape_str(c.bias) << " seed " << seed);
      std::vector<Tensor> in = {test::random_tensor(shape, seed, -2, 3), test::random_tensor(c.scale, seed + 1, 0.5f, 1.5f)};
      if (!c.bias.empty()) in.push_back(test::random_tensor(c.bias, seed + 2));
      std::vector<Attribute> attrs = {Attribute::make_int("axis", c.axis)};
      if (rep == 1) attrs.push_back(Attribute::make_float("epsilon", 1e-2f));
      test::GradCheckOptions o = fd_options(17, seed, true);
      test::check_gradients("LayerNormalization", in, attrs, o);
      seed += 3;
    }
  }
}

TEST_CASE("LayerNormalization Mean and InvStdDev outputs carry no gradient", "[train][grad]") {
  test::GradCheckOptions o = fd_options(17, 1500, true);
  o.n_outputs = 3;
  o.loss_outputs = {0};
  test::check_gradients("LayerNormalization",
                        {test::random_tensor({3, 13, 9, 7}, 1500), test::random_tensor({9, 7}, 1501), test::random_tensor({9, 7}, 1502)},
                        {Attribute::make_int("axis", 2)}, o);
}

TEST_CASE("Normalisation backward is bit-identical at any thread count", "[train][grad]") {
  SECTION("BatchNormalization, training and eval") {
    for (bool training : {true, false}) {
      const std::vector<Tensor> in = bn_inputs({9, 16, 33, 31}, 16, 1600);
      test::GradCheckOptions o;
      o.wrt = {0, 1, 2};
      o.training = training;
      o.threads = 1;
      const auto one = test::node_gradients("BatchNormalization", in, {}, o);
      o.threads = 3;
      const auto three = test::node_gradients("BatchNormalization", in, {}, o);
      for (size_t i = 0; i < 3; ++i) CHECK(bit_identical(one[i], three[i]));
    }
  }
  SECTION("BatchNormalization, rank 2") {
    const std::vector<Tensor> in = bn_inputs({3000, 24}, 24, 1610);
    test::GradCheckOptions o;
    o.wrt = {0, 1, 2};
    o.threads = 1;
    const auto one = test::node_gradients("BatchNormalization", in, {}, o);
    o.threads = 3;
    const auto three = test::node_gradients("BatchNormalization", in, {}, o);
    for (size_t i = 0; i < 3; ++i) CHECK(bit_identical(one[i], three[i]));
  }
  SECTION("LayerNormalization") {
    const std::vector<Tensor> in = {test::random_tensor({64, 197, 24}, 1620), test::random_tensor({24}, 1621),
                                    test::random_tensor({24}, 1622)};
    test::GradCheckOptions o;
    o.threads = 1;
    const auto one = test::node_gradients("LayerNormalization", in, {}, o);
    o.threads = 3;
    const auto three = test::node_gradients("LayerNormalization", in, {}, o);
    for (size_t i = 0; i < 3; ++i) CHECK(bit_identical(one[i], three[i]));
  }
}

TEST_CASE("LayerNormalization backward with an out-of-range axis names the node", "[train][grad]") {
  ir::Model m;
  ir::Graph* g = m.graph.get();
  ir::Node* n = g->add_node("LayerNormalization", {g->add_value("x"), g->add_value("s")}, {g->add_value("y")}, "block3_ln");
  n->set_attr(Attribute::make_int("axis", 3));
  const train::GradDef* def = train::GradRegistry::global().find("", "LayerNormalization", 17, rt::BackendKind::CPU);
  REQUIRE(def);
  rt::ThreadPool pool(1);
  train::GradContext ctx(*n, 17, pool);
  const Tensor x = test::random_tensor({2, 3, 5}, 1);
  ctx.mutable_input_shapes() = {x.shape(), Shape{5}};
  ctx.mutable_input_dtypes() = {DType::Float32, DType::Float32};
  ctx.mutable_input_present() = {1, 1};
  ctx.mutable_inputs() = {x, test::random_tensor({5}, 2)};
  ctx.mutable_output_shapes() = {x.shape()};
  ctx.mutable_grad_outputs() = {x};
  ctx.mutable_wanted() = {1, 1};
  CHECK_THROWS_WITH(def->fn(ctx), Catch::Contains("block3_ln") && Catch::Contains("axis 3 is out of range"));
}
