// Backward of Softmax and LogSoftmax (train/grads/softmax_grad.cpp): the opset < 13 semantics
// (input coerced to 2-D at `axis`) and the 13+ per-axis semantics, every axis including negative
// ones, contiguous rows and column blocks wider than one chunk, against float64 finite
// differences; thread-count determinism; a bad axis named in the error.
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

// The loss sums a few thousand terms, and a LogSoftmax row of 2,457 values (legacy axis 0 or 1)
// moves every one of them, by terms near log(1/2457) = -7.8; eps = 1e-4 keeps the rounding of that
// sum under atol (the functions are smooth, so the truncation error stays far below it).
test::GradCheckOptions fd_options(int opset, uint32_t seed) {
  test::GradCheckOptions o;
  o.opset = opset;
  o.seed = seed;
  o.eps = 1e-4;
  o.atol = 1e-8;
  return o;
}

}  // namespace

TEST_CASE("Softmax and LogSoftmax backward at every axis, opset 13 and legacy", "[train][grad]") {
  const Shape shape = {3, 13, 9, 7};
  uint32_t seed = 500;
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    for (int opset : {11, 13}) {
      std::vector<std::optional<int64_t>> axes = {std::nullopt, 0, 1, 2, 3, -1, -2, -4};
      for (const auto& axis : axes) {
        INFO(op << " opset " << opset << " axis " << (axis ? std::to_string(*axis) : "default"));
        std::vector<Attribute> attrs;
        if (axis) attrs.push_back(Attribute::make_int("axis", *axis));
        test::check_gradients(op, {test::random_tensor(shape, seed, -3, 3)}, attrs, fd_options(opset, seed));
        ++seed;
      }
    }
  }
}

TEST_CASE("Softmax backward over columns wider than one chunk and a 1-D input", "[train][grad]") {
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    INFO(op);
    // inner = 301 > 256 columns per block.
    test::GradCheckOptions o = fd_options(13, 600);
    o.max_elements = 200;
    test::check_gradients(op, {test::random_tensor({2, 5, 301}, 600, -3, 3)}, {Attribute::make_int("axis", 1)}, o);
    test::check_gradients(op, {test::random_tensor({11}, 601, -3, 3)}, {}, fd_options(13, 601));
    test::check_gradients(op, {test::random_tensor({11}, 602, -3, 3)}, {Attribute::make_int("axis", 0)}, fd_options(9, 602));
  }
}

TEST_CASE("Softmax backward is bit-identical at any thread count", "[train][grad]") {
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    for (int64_t axis : {-1, 1}) {
      INFO(op << " axis " << axis);
      const Tensor x = test::random_tensor({6, 40, 21, 19}, 700, -4, 4);
      test::GradCheckOptions o;
      o.opset = 13;
      o.threads = 1;
      const auto one = test::node_gradients(op, {x}, {Attribute::make_int("axis", axis)}, o);
      o.threads = 3;
      const auto three = test::node_gradients(op, {x}, {Attribute::make_int("axis", axis)}, o);
      REQUIRE(one[0].defined());
      REQUIRE(three[0].defined());
      CHECK(std::memcmp(one[0].raw_data(), three[0].raw_data(), one[0].nbytes()) == 0);
    }
  }
}

TEST_CASE("Softmax backward with an out-of-range axis names the node", "[train][grad]") {
  ir::Model m;
  ir::Graph* g = m.graph.get();
  ir::Value* x = g->add_value("x");
  ir::Value* y = g->add_value("y");
  ir::Node* n = g->add_node("Softmax", {x}, {y}, "attention_softmax");
  n->set_attr(Attribute::make_int("axis", 4));
  const train::GradDef* def = train::GradRegistry::global().find("", "Softmax", 13, rt::BackendKind::CPU);
  REQUIRE(def);
  rt::ThreadPool pool(1);
  train::GradContext ctx(*n, 13, pool);
  const Tensor t = test::random_tensor({2, 3, 5}, 1);
  ctx.mutable_input_shapes() = {t.shape()};
  ctx.mutable_input_dtypes() = {DType::Float32};
  ctx.mutable_input_present() = {1};
  ctx.mutable_inputs() = {Tensor()};
  ctx.mutable_output_shapes() = {t.shape()};
  ctx.mutable_outputs() = {t};
  ctx.mutable_grad_outputs() = {t};
  ctx.mutable_wanted() = {1};
  ctx.mutable_grads().resize(1);
  CHECK_THROWS_WITH(def->fn(ctx), Catch::Contains("attention_softmax") && Catch::Contains("axis 4 is out of range"));
  n->set_attr(Attribute::make_int("axis", -4));
  CHECK_THROWS_WITH(def->fn(ctx), Catch::Contains("attention_softmax") && Catch::Contains("axis -4 is out of range"));
}
