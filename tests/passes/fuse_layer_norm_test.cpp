// fuse_layer_norm: the written-out LayerNorm (ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add)
// becomes one mpq::LayerNormalization with the same outputs (to float rounding); guarded cases
// (an intermediate read elsewhere, another axis, another exponent, a gamma that is not a row
// vector) are left alone; the verifier accepts every result.
#include <catch2/catch.hpp>

#include <cmath>

#include "ir/onnx_io.h"
#include "ir/onnx_tools.h"
#include "ir/verify.h"
#include "passes/fuse_layer_norm.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;

namespace {

struct Options {
  int opset = 13;               // 18: ReduceMean takes its axes as an input
  bool square_by_mul = false;   // Mul(d, d) instead of Pow(d, 2)
  bool beta = true;             // the final Add(beta)
  bool sub_is_output = false;   // the centred tensor is also a graph output
  int64_t axis = -1;            // the axis both ReduceMeans reduce
  float exponent = 2.0f;
  bool gamma_2d = false;        // gamma of shape [5, 7]: a per-position scale, not a LayerNorm
};

// x[3, 5, 7] -> written-out LayerNorm over the last axis -> y
Model layer_norm_model(const Options& o) {
  Model m;
  m.set_opset("", o.opset);
  Graph& g = *m.graph;
  const Shape shape{3, 5, 7};
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, shape));
  g.add_input(x);
  auto value = [&](const char* name) { return g.add_value(name, ValueType::tensor(DType::Float32, shape)); };
  auto reduce_mean = [&](Value* in, const char* name) {
    Value* out = g.add_value(name);
    if (o.opset >= 18) {
      Value* axes = g.add_initializer(std::string(name) + "_axes", Tensor::from<int64_t>({1}, {o.axis}));
      g.add_node("ReduceMean", {in, axes}, {out}, name);
    } else {
      g.add_node("ReduceMean", {in}, {out}, name)->set_attr(Attribute::make_ints("axes", {o.axis}));
    }
    return out;
  };
  Value* mean = reduce_mean(x, "mean");
  Value* d = value("d");
  g.add_node("Sub", {x, mean}, {d}, "sub");
  if (o.sub_is_output) g.add_output(d);
  Value* sq = value("sq");
  if (o.square_by_mul)
    g.add_node("Mul", {d, d}, {sq}, "square");
  else
    g.add_node("Pow", {d, g.add_initializer("two", Tensor::from<float>({}, {o.exponent}))}, {sq}, "square");
  Value* var = reduce_mean(sq, "var");
  Value* ve = g.add_value("ve");
  g.add_node("Add", {var, g.add_initializer("eps", Tensor::from<float>({}, {1e-5f}))}, {ve}, "add_eps");
  Value* sd = g.add_value("sd");
  g.add_node("Sqrt", {ve}, {sd}, "sqrt");
  Value* n = value("n");
  g.add_node("Div", {d, sd}, {n}, "div");
  Value* gamma = g.add_initializer("gamma", test::random_tensor(o.gamma_2d ? Shape{5, 7} : Shape{7}, 3, 0.5f, 1.5f));
  Value* scaled = g.add_value(o.beta ? "scaled" : "y");
  g.add_node("Mul", {gamma, n}, {scaled}, "mul_gamma");  // gamma first: the commuted form
  Value* y = scaled;
  if (o.beta) {
    y = g.add_value("y");
    g.add_node("Add", {scaled, g.add_initializer("beta", test::random_tensor({7}, 4))}, {y}, "add_beta");
  }
  g.add_output(y);
  return m;
}

// Runs the pass; checks the verifier and that every output kept its value; returns the stats.
passes::PassStats fuse_and_compare(Model& m) {
  rt::Feeds feeds{{"x", test::random_tensor({3, 5, 7}, 11, -3.0f, 3.0f)}};
  auto before = test::run_model(m, feeds);
  passes::FuseLayerNorm pass;
  passes::PassStats s = passes::run_pass(pass, m);
  REQUIRE(verify(m).empty());
  auto after = test::run_model(m, feeds);
  REQUIRE(after.size() == before.size());
  for (size_t i = 0; i < before.size(); ++i) CHECK(test::max_abs_diff(after[i], before[i]) < 1e-5);
  return s;
}

}  // namespace

TEST_CASE("fuse_layer_norm turns the written-out LayerNorm into one node with the same outputs", "[passes][fuse]") {
  for (int opset : {13, 18})
    for (bool square_by_mul : {false, true})
      for (bool beta : {false, true}) {
        INFO("opset " << opset << " square_by_mul=" << square_by_mul << " beta=" << beta);
        Options o;
        o.opset = opset;
        o.square_by_mul = square_by_mul;
        o.beta = beta;
        Model m = layer_norm_model(o);
        CHECK(fuse_and_compare(m).changed == 1);
        REQUIRE(m.graph->num_nodes() == 1);
        const Node& ln = *m.graph->nodes()[0];
        CHECK(ln.domain == "mpq");
        CHECK(ln.op_type == "LayerNormalization");
        CHECK(ln.num_inputs() == (beta ? 3u : 2u));
        CHECK(ln.attr_int("axis", 0) == -1);
        CHECK(ln.attr_float("epsilon", 0.0f) == 1e-5f);
        CHECK(m.graph->outputs()[0]->name() == "y");
        CHECK(m.opset("mpq") == 1);
      }
  SECTION("the axis written as rank - 1 counts as the last axis") {
    Options o;
    o.axis = 2;
    Model m = layer_norm_model(o);
    CHECK(fuse_and_compare(m).changed == 1);
  }
}

TEST_CASE("fuse_layer_norm leaves guarded patterns alone", "[passes][fuse]") {
  auto unchanged = [](const Options& o) {
    Model m = layer_norm_model(o);
    const size_t nodes = m.graph->num_nodes();
    CHECK(fuse_and_compare(m).changed == 0);
    CHECK(m.graph->num_nodes() == nodes);
  };
  SECTION("the centred tensor is also a graph output") {
    Options o;
    o.sub_is_output = true;
    unchanged(o);
  }
  SECTION("the means run over another axis") {
    Options o;
    o.axis = 1;
    unchanged(o);
  }
  SECTION("the exponent is not 2") {
    Options o;
    o.exponent = 2.5f;
    unchanged(o);
  }
  SECTION("gamma varies along more than the normalised axis") {
    Options o;
    o.gamma_2d = true;
    unchanged(o);
  }
}

TEST_CASE("fuse_layer_norm on the exported transformers keeps their outputs", "[passes][fuse][models]") {
  for (const char* name : {"transformer_op13.onnx", "fashion/fashion_vit.onnx"}) {
    INFO(name);
    Model m = test::load_test_model(name);
    rt::Feeds feeds = test::random_feeds(m, 5);
    auto before = test::run_model(m, feeds);
    passes::FuseLayerNorm pass;
    const passes::PassStats st = passes::run_pass(pass, m);
    CHECK(st.changed >= 3);  // every block's two LayerNorms and the final one
    CHECK(test::count_ops(m, "Sqrt") == 0);  // (a ReduceMean over the tokens, the pooling, stays)
    CHECK(test::count_ops(m, "Pow") == 0);
    CHECK(test::count_ops(m, "LayerNormalization") == st.changed);
    auto after = test::run_model(m, feeds);
    for (size_t i = 0; i < before.size(); ++i) CHECK(test::rel_l2(after[i], before[i]) < 1e-5);
  }
}
