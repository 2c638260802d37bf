// Backward of ReduceSum, ReduceMean, ReduceMax and ReduceMin (train/grads/reduce_grad.cpp): axes
// as an attribute (older opsets) or an input, keepdims 0/1, negative axes, all-axes reduction and
// noop_with_empty_axes, against float64 finite differences; Max/Min send the gradient to the first
// extreme of each set; thread-count determinism; a bad axis named in the error.
#include <catch2/catch.hpp>

#include <cstring>
#include <optional>
#include <string>

#include "core/error.h"
#include "ir/graph.h"
#include "runtime/thread_pool.h"
#include "test_util.h"
#include "train/grad_check.h"
#include "train/grad_registry.h"

using namespace mpq;
using ir::Attribute;

namespace {

const Shape kShape = {3, 13, 9, 7};

// The loss sums a few thousand terms; eps = 1e-5 keeps its rounding under atol.
test::GradCheckOptions fd_options(int opset, uint32_t seed) {
  test::GradCheckOptions o;
  o.opset = opset;
  o.seed = seed;
  o.eps = 1e-5;
  o.atol = 1e-8;
  o.wrt = {0};
  return o;
}

struct AxesCase {
  std::optional<std::vector<int64_t>> axes;  // nullopt: not given at all
  int keepdims;
  int noop = 0;
};

const std::vector<AxesCase> kAxes = {
    {std::vector<int64_t>{1}, 1},       {std::vector<int64_t>{1}, 0},     {std::vector<int64_t>{-1}, 1},
    {std::vector<int64_t>{0, 2}, 0},    {std::vector<int64_t>{-3, 3}, 1}, {std::vector<int64_t>{0, 1, 2, 3}, 0},
    {std::nullopt, 1},                  {std::nullopt, 0},                {std::vector<int64_t>{}, 0},
    {std::nullopt, 1, 1},               {std::vector<int64_t>{}, 0, 1},   {std::vector<int64_t>{2}, 0, 1},
};

std::string describe(const AxesCase& c) {
  std::string s = "axes ";
  if (!c.axes) s += "none";
  else
    for (int64_t a : *c.axes) s += std::to_string(a) + " ";
  return s + " keepdims " + std::to_string(c.keepdims) + " noop " + std::to_string(c.noop);
}

// Runs the check with the axes as an attribute (`as_input` false) or as input 1.
void check_reduce(const char* op, int opset, bool as_input, const AxesCase& c, const Tensor& x, uint32_t seed) {
  INFO(op << " opset " << opset << " " << describe(c));
  std::vector<Attribute> attrs = {Attribute::make_int("keepdims", c.keepdims)};
  if (c.noop) attrs.push_back(Attribute::make_int("noop_with_empty_axes", 1));
  std::vector<Tensor> inputs = {x};
  if (c.axes) {
    if (as_input) inputs.push_back(Tensor::from<int64_t>({static_cast<int64_t>(c.axes->size())}, *c.axes));
    else if (!c.axes->empty()) attrs.push_back(Attribute::make_ints("axes", *c.axes));
  }
  test::check_gradients(op, inputs, attrs, fd_options(opset, seed));
}

}  // namespace

TEST_CASE("ReduceSum and ReduceMean backward: axes attribute and input, keepdims, noop", "[train][grad]") {
  uint32_t seed = 800;
  for (const auto& [op, attr_opset, input_opset] : {std::tuple{"ReduceSum", 11, 13}, std::tuple{"ReduceMean", 13, 18}}) {
    for (const AxesCase& c : kAxes) {
      // noop_with_empty_axes exists only with the input form.
      if (!c.noop) check_reduce(op, attr_opset, false, c, test::random_tensor(kShape, seed, -2, 2), seed);
      ++seed;
      check_reduce(op, input_opset, true, c, test::random_tensor(kShape, seed, -2, 2), seed);
      ++seed;
    }
  }
}

TEST_CASE("ReduceMax and ReduceMin backward (distinct values)", "[train][grad]") {
  uint32_t seed = 900;
  for (const auto& [op, attr_opset, input_opset] : {std::tuple{"ReduceMax", 13, 18}, std::tuple{"ReduceMin", 13, 18}}) {
    for (const AxesCase& c : kAxes) {
      if (!c.noop) check_reduce(op, attr_opset, false, c, test::random_tensor(kShape, seed, -2, 2), seed);
      ++seed;
      check_reduce(op, input_opset, true, c, test::random_tensor(kShape, seed, -2, 2), seed);
      ++seed;
    }
  }
}

TEST_CASE("ReduceMax and ReduceMin give the gradient to the first extreme of a tie", "[train][grad]") {
  // Rows of [2, 5] reduced over axis 1: ties at positions 1 and 3 (max) and 0 and 4 (min).
  const Tensor x = Tensor::from<double>({2, 5}, {-1, 4, 2, 4, -1, 3, 3, 0, 3, 0});
  test::GradCheckOptions o;
  o.opset = 13;
  for (const auto& [op, first0, first1] : {std::tuple{"ReduceMax", 1, 5}, std::tuple{"ReduceMin", 0, 7}}) {
    INFO(op);
    const auto g = test::node_gradients(op, {x}, {Attribute::make_ints("axes", {1}), Attribute::make_int("keepdims", 0)}, o);
    REQUIRE(g[0].defined());
    for (int64_t i = 0; i < 10; ++i) {
      INFO("element " << i);
      if (i == first0 || i == first1) CHECK(g[0].get_double(i) != 0.0);
      else CHECK(g[0].get_double(i) == 0.0);
    }
  }
}

TEST_CASE("Reduce backward is bit-identical at any thread count", "[train][grad]") {
  const Tensor x = test::random_tensor({5, 64, 23, 21}, 1000);
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax"}) {
    for (const std::vector<int64_t>& axes : {std::vector<int64_t>{2, 3}, std::vector<int64_t>{0, 2}}) {
      INFO(op << " " << axes[0] << "," << axes[1]);
      test::GradCheckOptions o;
      o.opset = 13;
      o.wrt = {0};
      const std::vector<Attribute> attrs = {Attribute::make_ints("axes", axes)};
      o.threads = 1;
      const auto one = test::node_gradients(op, {x}, attrs, o);
      o.threads = 3;
      const auto three = test::node_gradients(op, {x}, attrs, o);
      REQUIRE(one[0].defined());
      REQUIRE(three[0].defined());
      CHECK(std::memcmp(one[0].raw_data(), three[0].raw_data(), one[0].nbytes()) == 0);
    }
  }
}

TEST_CASE("Reduce backward with a bad axis names the node", "[train][grad]") {
  ir::Model m;
  ir::Graph* g = m.graph.get();
  ir::Node* n = g->add_node("ReduceMean", {g->add_value("x")}, {g->add_value("y")}, "pool_mean");
  const train::GradDef* def = train::GradRegistry::global().find("", "ReduceMean", 13, rt::BackendKind::CPU);
  REQUIRE(def);
  rt::ThreadPool pool(1);
  train::GradContext ctx(*n, 13, pool);
  ctx.mutable_input_shapes() = {Shape{2, 3}};
  ctx.mutable_input_dtypes() = {DType::Float32};
  ctx.mutable_input_present() = {1};
  ctx.mutable_inputs() = {Tensor()};
  ctx.mutable_output_shapes() = {Shape{2}};
  ctx.mutable_grad_outputs() = {test::random_tensor({2}, 1)};
  ctx.mutable_wanted() = {1};
  n->set_attr(Attribute::make_ints("axes", {2}));
  CHECK_THROWS_WITH(def->fn(ctx), Catch::Contains("pool_mean") && Catch::Contains("axis 2 is out of range"));
  n->set_attr(Attribute::make_ints("axes", {1, -1}));
  CHECK_THROWS_WITH(def->fn(ctx), Catch::Contains("pool_mean") && Catch::Contains("listed twice"));
}
