// fuse_matmul_bias: MatMul(A, constant 2-D B) + constant bias becomes one mpq::MatMulBias with the
// same outputs (A of rank 1-3, the bias on either side of the Add, per column or one value);
// guarded cases (a shared MatMul output, a bias that is not a row, a B that is not constant) are
// left alone; a bad bias at run time is an error naming the node.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "ir/onnx_io.h"
#include "ir/onnx_tools.h"
#include "ir/verify.h"
#include "passes/fuse_matmul_bias.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;

namespace {

struct Options {
  Shape a_shape{2, 5, 7};
  bool bias_first = false;        // Add(bias, MatMul) instead of Add(MatMul, bias)
  Shape bias_shape{3};            // N = 3
  bool matmul_out_shared = false; // the MatMul's output is also read by a Neg
  bool b_is_input = false;        // B is a graph input, not a constant
};

// a -> MatMul(a, B[7, 3]) -> Add(bias) -> y
Model matmul_bias_model(const Options& o) {
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  Value* a = g.add_value("a", ValueType::tensor(DType::Float32, o.a_shape));
  g.add_input(a);
  Value* b = nullptr;
  if (o.b_is_input) {
    b = g.add_value("b", ValueType::tensor(DType::Float32, Shape{7, 3}));
    g.add_input(b);
  } else {
    b = g.add_initializer("b", test::random_tensor({7, 3}, 2));
  }
  Value* p = g.add_value("p");
  g.add_node("MatMul", {a, b}, {p}, "mm");
  if (o.matmul_out_shared) {
    Value* n = g.add_value("neg");
    g.add_node("Neg", {p}, {n}, "neg");
    g.add_output(n);
  }
  Value* bias = g.add_initializer("bias", test::random_tensor(o.bias_shape, 3));
  Value* y = g.add_value("y");
  if (o.bias_first)
    g.add_node("Add", {bias, p}, {y}, "add");
  else
    g.add_node("Add", {p, bias}, {y}, "add");
  g.add_output(y);
  return m;
}

rt::Feeds feeds_for(const Model& m) {
  rt::Feeds f;
  uint32_t seed = 20;
  for (Value* v : m.graph->inputs()) {
    Shape s;
    for (const auto& d : v->type.dims) s.push_back(d.value);
    f[v->name()] = test::random_tensor(s, seed++, -2.0f, 2.0f);
  }
  return f;
}

passes::PassStats fuse_and_compare(Model& m) {
  rt::Feeds feeds = feeds_for(m);
  auto before = test::run_model(m, feeds);
  passes::FuseMatMulBias pass;
  passes::PassStats s = passes::run_pass(pass, m);
  REQUIRE(verify(m).empty());
  auto after = test::run_model(m, feeds);
  REQUIRE(after.size() == before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    CHECK(after[i].shape() == before[i].shape());
    CHECK(test::max_abs_diff(after[i], before[i]) < 1e-5);
  }
  return s;
}

}  // namespace

TEST_CASE("fuse_matmul_bias turns MatMul + bias Add into one node with the same outputs", "[passes][fuse]") {
  for (const Shape& a_shape : {Shape{7}, Shape{4, 7}, Shape{2, 5, 7}})
    for (bool bias_first : {false, true})
      for (const Shape& bias_shape : {Shape{3}, Shape{1}, Shape{}}) {
        INFO("A " << shape_str(a_shape) << " bias " << shape_str(bias_shape) << " bias_first=" << bias_first);
        Options o;
        o.a_shape = a_shape;
        o.bias_first = bias_first;
        o.bias_shape = bias_shape;
        Model m = matmul_bias_model(o);
        CHECK(fuse_and_compare(m).changed == 1);
        REQUIRE(m.graph->num_nodes() == 1);
        const Node& fused = *m.graph->nodes()[0];
        CHECK(fused.domain == "mpq");
        CHECK(fused.op_type == "MatMulBias");
        CHECK(fused.input(0)->name() == "a");
        CHECK(fused.input(2)->name() == "bias");
        CHECK(m.graph->outputs()[0]->name() == "y");
      }
}

TEST_CASE("fuse_matmul_bias leaves guarded patterns alone", "[passes][fuse]") {
  auto unchanged = [](const Options& o) {
    Model m = matmul_bias_model(o);
    const size_t nodes = m.graph->num_nodes();
    CHECK(fuse_and_compare(m).changed == 0);
    CHECK(m.graph->num_nodes() == nodes);
  };
  SECTION("the MatMul's output is read twice") {
    Options o;
    o.matmul_out_shared = true;
    unchanged(o);
  }
  SECTION("the bias is not a row of N values") {
    Options o;
    o.bias_shape = {5, 3};
    unchanged(o);
  }
  SECTION("B is a graph input") {
    Options o;
    o.b_is_input = true;
    unchanged(o);
  }
}

TEST_CASE("mpq::MatMulBias refuses a bias of the wrong length, naming the node", "[passes][fuse]") {
  Model m;
  m.set_opset("", 13);
  m.set_opset("mpq", 1);
  Graph& g = *m.graph;
  Value* a = g.add_value("a", ValueType::tensor(DType::Float32, Shape{4, 7}));
  g.add_input(a);
  Value* y = g.add_value("y");
  g.add_node("MatMulBias", {a, g.add_initializer("b", test::random_tensor({7, 3}, 2)),
                            g.add_initializer("bias", test::random_tensor({2}, 3))},
             {y}, "linear", "mpq");
  g.add_output(y);
  rt::Feeds feeds{{"a", test::random_tensor({4, 7}, 4)}};
  CHECK_THROWS_WITH(test::run_model(m, feeds), Catch::Contains("linear") && Catch::Contains("bias"));
}

TEST_CASE("fuse_matmul_bias on the exported transformers keeps their outputs", "[passes][fuse][models]") {
  for (const char* name : {"transformer_op13.onnx", "fashion/fashion_vit.onnx", "tiny_bert.onnx"}) {
    INFO(name);
    Model m = test::load_test_model(name);
    rt::Feeds feeds = test::random_feeds(m, 7);
    auto before = test::run_model(m, feeds);
    passes::FuseMatMulBias pass;
    const passes::PassStats st = passes::run_pass(pass, m);
    CHECK(st.changed >= 4);  // every block's linear layers
    CHECK(test::count_ops(m, "MatMulBias") == st.changed);
    auto after = test::run_model(m, feeds);
    for (size_t i = 0; i < before.size(); ++i) CHECK(test::rel_l2(after[i], before[i]) < 1e-6);
  }
}
