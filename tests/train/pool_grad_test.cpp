// Backward of MaxPool, AveragePool, GlobalAveragePool and GlobalMaxPool (train/grads/pool_grad.cpp)
// against float64 finite differences over 1-D, 2-D and 3-D windows with strides, dilations,
// asymmetric and automatic pads, ceil_mode and count_include_pad; MaxPool's choice on ties (the
// first maximum, never the padding) checked directly; the Indices output; bit-identical gradients
// on 1 and 3 threads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "test_util.h"
#include "train/autograd.h"
#include "train/grad_check.h"

using namespace mpq;
using ir::Attribute;

namespace {

using Attrs = std::vector<Attribute>;

// Distinct values 2/n apart in [-1, 1), shuffled: no window has two maxima within the
// finite-difference step, so MaxPool's gradient is checked where it is defined.
Tensor distinct_tensor(const Shape& shape, uint32_t seed) {
  Tensor t(DType::Float32, shape);
  const int64_t n = t.numel();
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  for (int64_t i = 0; i < n; ++i)
    t.data<float>()[i] = -1.0f + 2.0f * static_cast<float>(order[static_cast<size_t>(i)]) / static_cast<float>(n);
  return t;
}

struct PoolCase {
  std::string name;
  Shape x;
  Attrs attrs;
};

// dL/dX of a one-node model for a given dL/dY (the training engine on one thread).
Tensor input_grad(const std::string& op, const Tensor& x, const Attrs& attrs, const Tensor& dy) {
  ir::Model model;
  model.set_opset("", 17);
  ir::Graph* g = model.graph.get();
  ir::Value* in = g->add_value("x", ir::ValueType::tensor(x.dtype(), x.shape()));
  g->add_input(in);
  ir::Value* out = g->add_value("y");
  g->add_output(out);
  ir::Node* n = g->add_node(op, {in}, {out}, "node_under_test");
  for (const Attribute& a : attrs) n->set_attr(a);
  train::AutogradOptions o;
  o.threads = 1;
  o.input_grads = true;
  o.default_parameters = false;
  train::Autograd engine(model, o);
  const std::vector<Tensor> y = engine.forward({{"x", x}});
  REQUIRE(y.at(0).shape() == dy.shape());
  engine.backward({dy});
  return engine.input_grads().at(0);
}

test::GradCheckOptions max_pool_options(uint32_t seed) {
  test::GradCheckOptions o;
  o.seed = seed;
  o.eps = 1e-5;  // far below the 2/n gap between values
  return o;
}

test::GradCheckOptions linear_options(uint32_t seed) {
  test::GradCheckOptions o;
  o.seed = seed;
  o.eps = 1e-3;  // Y is linear in X: exact up to rounding at any step
  return o;
}

}  // namespace

TEST_CASE("MaxPool backward", "[train][grad]") {
  const std::vector<PoolCase> cases = {
      {"3x3 stride 2, asymmetric pads", {3, 13, 9, 7},
       {Attribute::make_ints("kernel_shape", {3, 3}), Attribute::make_ints("strides", {2, 2}),
        Attribute::make_ints("pads", {1, 0, 1, 1})}},
      {"2x2 stride 2", {3, 4, 8, 6}, {Attribute::make_ints("kernel_shape", {2, 2}), Attribute::make_ints("strides", {2, 2})}},
      {"overlapping 3x2 windows, dilation 2, ceil_mode", {2, 3, 11, 9},
       {Attribute::make_ints("kernel_shape", {3, 2}), Attribute::make_ints("strides", {2, 2}),
        Attribute::make_ints("dilations", {2, 2}), Attribute::make_int("ceil_mode", 1)}},
      {"ceil_mode with pads", {2, 3, 9, 7},
       {Attribute::make_ints("kernel_shape", {3, 3}), Attribute::make_ints("strides", {2, 2}),
        Attribute::make_ints("pads", {1, 1, 1, 1}), Attribute::make_int("ceil_mode", 1)}},
      {"SAME_UPPER", {2, 3, 9, 7},
       {Attribute::make_ints("kernel_shape", {3, 3}), Attribute::make_ints("strides", {2, 2}),
        Attribute::make_string("auto_pad", "SAME_UPPER")}},
      {"SAME_LOWER", {2, 3, 8, 7},
       {Attribute::make_ints("kernel_shape", {2, 3}), Attribute::make_ints("strides", {2, 1}),
        Attribute::make_string("auto_pad", "SAME_LOWER")}},
      {"1-D", {3, 4, 13},
       {Attribute::make_ints("kernel_shape", {3}), Attribute::make_ints("strides", {2}), Attribute::make_ints("pads", {1, 2}),
        Attribute::make_int("ceil_mode", 1)}},
      {"3-D", {2, 3, 5, 4, 6},
       {Attribute::make_ints("kernel_shape", {2, 2, 3}), Attribute::make_ints("strides", {2, 1, 2}),
        Attribute::make_ints("pads", {0, 1, 1, 1, 0, 1}), Attribute::make_int("ceil_mode", 1)}},
      // Rows of 15 and 22 windows: the vector blocks of the float32 path, stride 2 and 1.
      {"wide rows, stride 2", {2, 3, 5, 29},
       {Attribute::make_ints("kernel_shape", {2, 3}), Attribute::make_ints("strides", {2, 2}),
        Attribute::make_ints("pads", {0, 1, 0, 1})}},
      {"wide rows, stride 1", {2, 3, 4, 23}, {Attribute::make_ints("kernel_shape", {2, 2})}},
      // 2x2 tiles (the common CNN pooling) with an odd last row and column that no window covers.
      {"2x2 tiles, odd sizes", {2, 3, 9, 19}, {Attribute::make_ints("kernel_shape", {2, 2}), Attribute::make_ints("strides", {2, 2})}},
  };
  uint32_t seed = 600;
  for (const PoolCase& c : cases) {
    INFO("MaxPool " << c.name);
    test::check_gradients("MaxPool", {distinct_tensor(c.x, seed)}, c.attrs, max_pool_options(seed));
    seed += 10;
  }
}

TEST_CASE("MaxPool backward with the Indices output", "[train][grad]") {
  test::GradCheckOptions o = max_pool_options(700);
  o.n_outputs = 2;
  test::check_gradients("MaxPool", {distinct_tensor({3, 5, 9, 7}, 700)},
                        {Attribute::make_ints("kernel_shape", {3, 3}), Attribute::make_ints("strides", {2, 2}),
                         Attribute::make_ints("pads", {1, 1, 1, 1})},
                        o);
}

TEST_CASE("MaxPool backward: ties go to the first maximum, never to the padding", "[train][grad]") {
  // Every element -2: each window's maximum is a tie of all its taps inside X; the padding (-inf)
  // never wins. 2x2 windows, stride 2, pads 1 on a 4x4 plane give 3x3 windows; window (i, j)'s
  // first tap inside X is row max(0, 2i-1), column max(0, 2j-1).
  Tensor x(DType::Float64, {1, 1, 4, 4});
  std::fill(x.data<double>(), x.data<double>() + 16, -2.0);
  Tensor dy(DType::Float64, {1, 1, 3, 3});
  for (int64_t i = 0; i < 9; ++i) dy.data<double>()[i] = static_cast<double>(i + 1);
  const Tensor dx = input_grad("MaxPool", x,
                               {Attribute::make_ints("kernel_shape", {2, 2}), Attribute::make_ints("strides", {2, 2}),
                                Attribute::make_ints("pads", {1, 1, 1, 1})},
                               dy);
  std::vector<double> want(16, 0.0);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 3; ++j)
      want[static_cast<size_t>(std::max<int64_t>(0, 2 * i - 1) * 4 + std::max<int64_t>(0, 2 * j - 1))] +=
          static_cast<double>(i * 3 + j + 1);
  for (int64_t e = 0; e < 16; ++e) {
    INFO("element " << e);
    CHECK(dx.data<double>()[e] == want[static_cast<size_t>(e)]);
  }
  // 2x2 tiles without padding (their own kernel, float32 in vector blocks of four windows): each
  // window's top-left element wins.
  Tensor xt(DType::Float32, {1, 1, 4, 10});
  std::fill(xt.data<float>(), xt.data<float>() + 40, 1.5f);
  Tensor dyt(DType::Float32, {1, 1, 2, 5});
  for (int64_t i = 0; i < 10; ++i) dyt.data<float>()[i] = static_cast<float>(i + 1);
  const Tensor dxt =
      input_grad("MaxPool", xt, {Attribute::make_ints("kernel_shape", {2, 2}), Attribute::make_ints("strides", {2, 2})}, dyt);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 10; ++c) {
      INFO("row " << r << " column " << c);
      const float expect = r % 2 == 0 && c % 2 == 0 ? static_cast<float>(r / 2 * 5 + c / 2 + 1) : 0.0f;
      CHECK(dxt.data<float>()[r * 10 + c] == expect);
    }
}

TEST_CASE("AveragePool backward", "[train][grad]") {
  const std::vector<PoolCase> cases = {
      {"3x3 stride 2, asymmetric pads, padding excluded", {3, 13, 9, 7},
       {Attribute::make_ints("kernel_shape", {3, 3}), Attribute::make_ints("strides", {2, 2}),
        Attribute::make_ints("pads", {1, 0, 2, 1})}},
      {"3x3 stride 2, asymmetric pads, padding counted", {3, 5, 9, 7},
       {Attribute::make_ints("kernel_shape", {3, 3}), Attribute::make_ints("strides", {2, 2}),
        Attribute::make_ints("pads", {1, 0, 2, 1}), Attribute::make_int("count_include_pad", 1)}},
      {"ceil_mode, padding counted", {2, 3, 9, 8},
       {Attribute::make_ints("kernel_shape", {3, 2}), Attribute::make_ints("strides", {2, 3}),
        Attribute::make_ints("pads", {1, 1, 1, 0}), Attribute::make_int("ceil_mode", 1),
        Attribute::make_int("count_include_pad", 1)}},
      {"ceil_mode, padding excluded", {2, 3, 9, 8},
       {Attribute::make_ints("kernel_shape", {3, 2}), Attribute::make_ints("strides", {2, 3}),
        Attribute::make_ints("pads", {1, 1, 1, 0}), Attribute::make_int("ceil_mode", 1)}},
      {"SAME_LOWER", {2, 3, 9, 7},
       {Attribute::make_ints("kernel_shape", {2, 3}), Attribute::make_ints("strides", {2, 2}),
        Attribute::make_string("auto_pad", "SAME_LOWER")}},
      {"1-D", {3, 4, 13},
       {Attribute::make_ints("kernel_shape", {4}), Attribute::make_ints("strides", {3}), Attribute::make_ints("pads", {2, 1}),
        Attribute::make_int("count_include_pad", 1)}},
      {"3-D", {2, 3, 5, 4, 6},
       {Attribute::make_ints("kernel_shape", {2, 2, 3}), Attribute::make_ints("strides", {2, 1, 2}),
        Attribute::make_ints("pads", {1, 0, 1, 0, 1, 1}), Attribute::make_int("ceil_mode", 1)}},
  };
  uint32_t seed = 800;
  for (const PoolCase& c : cases) {
    INFO("AveragePool " << c.name);
    test::check_gradients("AveragePool", {test::random_tensor(c.x, seed)}, c.attrs, linear_options(seed));
    seed += 10;
  }
  // Dilated windows (opset 19).
  test::GradCheckOptions o = linear_options(890);
  o.opset = 19;
  test::check_gradients("AveragePool", {test::random_tensor({2, 3, 11, 9}, 890)},
                        {Attribute::make_ints("kernel_shape", {3, 2}), Attribute::make_ints("strides", {2, 2}),
                         Attribute::make_ints("dilations", {2, 3}), Attribute::make_ints("pads", {1, 1, 0, 2}),
                         Attribute::make_int("count_include_pad", 1)},
                        o);
}

TEST_CASE("GlobalAveragePool and GlobalMaxPool backward", "[train][grad]") {
  uint32_t seed = 900;
  for (const Shape& s : {Shape{3, 13, 9, 7}, Shape{3, 4, 11}, Shape{2, 3, 3, 4, 5}}) {
    INFO(shape_str(s));
    test::check_gradients("GlobalAveragePool", {test::random_tensor(s, seed)}, {}, linear_options(seed));
    test::check_gradients("GlobalMaxPool", {distinct_tensor(s, seed + 1)}, {}, max_pool_options(seed + 1));
    seed += 10;
  }
}

TEST_CASE("GlobalMaxPool backward: a tie goes to the first maximum", "[train][grad]") {
  const Tensor x = Tensor::from<double>({1, 2, 2, 2}, {0.5, 3.0, 3.0, -1.0, 7.0, 2.0, 7.0, 7.0});
  const Tensor dx = input_grad("GlobalMaxPool", x, {}, Tensor::from<double>({1, 2, 1, 1}, {10.0, 20.0}));
  const std::vector<double> want = {0, 10, 0, 0, 20, 0, 0, 0};
  for (int64_t e = 0; e < 8; ++e) {
    INFO("element " << e);
    CHECK(dx.data<double>()[e] == want[static_cast<size_t>(e)]);
  }
}

TEST_CASE("Pool gradients are bit-identical on 1 and 3 threads", "[train][grad]") {
  const Tensor x = test::random_tensor({16, 32, 28, 28}, 31);
  const std::vector<std::pair<std::string, Attrs>> runs = {
      {"MaxPool", {Attribute::make_ints("kernel_shape", {3, 3}), Attribute::make_ints("strides", {2, 2}),
                   Attribute::make_ints("pads", {1, 1, 1, 1})}},
      {"AveragePool", {Attribute::make_ints("kernel_shape", {3, 3}), Attribute::make_ints("strides", {2, 2}),
                       Attribute::make_ints("pads", {1, 1, 1, 1}), Attribute::make_int("count_include_pad", 1)}},
      {"GlobalAveragePool", {}},
      {"GlobalMaxPool", {}},
  };
  for (const auto& [op, attrs] : runs) {
    INFO(op);
    test::GradCheckOptions o;
    o.threads = 1;
    const Tensor one = test::node_gradients(op, {x}, attrs, o)[0];
    o.threads = 3;
    const Tensor three = test::node_gradients(op, {x}, attrs, o)[0];
    REQUIRE(one.dtype() == DType::Float32);
    CHECK(test::max_abs_diff(one, three) == 0.0);
  }
}

TEST_CASE("Pool backward over four spatial dimensions is reported as unsupported, naming the node", "[train][grad]") {
  const Tensor x = test::random_tensor({1, 2, 3, 3, 3, 3}, 1);
  test::GradCheckOptions o;
  for (const char* op : {"MaxPool", "AveragePool"}) {
    INFO(op);
    REQUIRE_THROWS_WITH(test::node_gradients(op, {x}, {Attribute::make_ints("kernel_shape", {2, 2, 2, 2})}, o),
                        Catch::Contains("node_under_test") && Catch::Contains("spatial dimensions"));
  }
}
