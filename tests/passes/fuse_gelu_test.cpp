// fuse_gelu: the written-out erf GELU (Div(sqrt 2)/Mul(1/sqrt 2) -> Erf -> Add(1) -> Mul(x) ->
// Mul(0.5), or with 0.5 x as the last factor) becomes one mpq::Gelu with the same outputs;
// guarded cases (an intermediate read elsewhere, another scale, no 0.5) are left alone.
#include <catch2/catch.hpp>

#include <cmath>

#include "ir/onnx_io.h"
#include "ir/onnx_tools.h"
#include "ir/verify.h"
#include "passes/fuse_gelu.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;

namespace {

struct Options {
  bool scale_by_mul = false;    // Mul(x, 1/sqrt 2) instead of Div(x, sqrt 2)
  bool half_first = false;      // Mul(Mul(x, 0.5), 1 + erf) instead of Mul(Mul(x, 1 + erf), 0.5)
  bool erf_is_output = false;   // the Erf's output is also a graph output
  float divisor = std::sqrt(2.0f);
  bool half = true;             // the 0.5 factor is there
};

// x[4, 9] -> written-out GELU -> y
Model gelu_model(const Options& o) {
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  const Shape shape{4, 9};
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, shape));
  g.add_input(x);
  auto scalar = [&](const char* name, float v) { return g.add_initializer(name, Tensor::from<float>({}, {v})); };
  Value* s = g.add_value("s");
  if (o.scale_by_mul)
    g.add_node("Mul", {x, scalar("inv_sqrt2", 1.0f / o.divisor)}, {s}, "scale");
  else
    g.add_node("Div", {x, scalar("sqrt2", o.divisor)}, {s}, "scale");
  Value* e = g.add_value("e");
  g.add_node("Erf", {s}, {e}, "erf");
  if (o.erf_is_output) g.add_output(e);
  Value* a = g.add_value("a");
  g.add_node("Add", {e, scalar("one", 1.0f)}, {a}, "add_one");
  if (o.half_first) {
    Value* hx = g.add_value("hx");
    g.add_node("Mul", {x, scalar("half", 0.5f)}, {hx}, "half");
    Value* y = g.add_value("y");
    g.add_node("Mul", {hx, a}, {y}, "mul");
    g.add_output(y);
  } else {
    Value* p = g.add_value(o.half ? "p" : "y");
    g.add_node("Mul", {x, a}, {p}, "mul");
    Value* y = p;
    if (o.half) {
      y = g.add_value("y");
      g.add_node("Mul", {p, scalar("half", 0.5f)}, {y}, "half");
    }
    g.add_output(y);
  }
  return m;
}

passes::PassStats fuse_and_compare(Model& m) {
  rt::Feeds feeds{{"x", test::random_tensor({4, 9}, 21, -4.0f, 4.0f)}};
  auto before = test::run_model(m, feeds);
  passes::FuseGelu pass;
  passes::PassStats s = passes::run_pass(pass, m);
  REQUIRE(verify(m).empty());
  auto after = test::run_model(m, feeds);
  REQUIRE(after.size() == before.size());
  for (size_t i = 0; i < before.size(); ++i) CHECK(test::max_abs_diff(after[i], before[i]) < 1e-5);
  return s;
}

}  // namespace

TEST_CASE("fuse_gelu turns the written-out erf GELU into one node with the same outputs", "[passes][fuse]") {
  for (bool scale_by_mul : {false, true})
    for (bool half_first : {false, true}) {
      INFO("scale_by_mul=" << scale_by_mul << " half_first=" << half_first);
      Options o;
      o.scale_by_mul = scale_by_mul;
      o.half_first = half_first;
      Model m = gelu_model(o);
      CHECK(fuse_and_compare(m).changed == 1);
      REQUIRE(m.graph->num_nodes() == 1);
      const Node& gelu = *m.graph->nodes()[0];
      CHECK(gelu.domain == "mpq");
      CHECK(gelu.op_type == "Gelu");
      CHECK(gelu.attr_string("approximate") == "none");
      CHECK(gelu.input(0)->name() == "x");
      CHECK(m.graph->outputs()[0]->name() == "y");
    }
}

TEST_CASE("fuse_gelu leaves guarded patterns alone", "[passes][fuse]") {
  auto unchanged = [](const Options& o) {
    Model m = gelu_model(o);
    const size_t nodes = m.graph->num_nodes();
    CHECK(fuse_and_compare(m).changed == 0);
    CHECK(m.graph->num_nodes() == nodes);
  };
  SECTION("the Erf's output is also a graph output") {
    Options o;
    o.erf_is_output = true;
    unchanged(o);
  }
  SECTION("the input is divided by 2, not sqrt 2") {
    Options o;
    o.divisor = 2.0f;
    unchanged(o);
  }
  SECTION("no 0.5 factor: x * (1 + erf(x / sqrt 2)) is twice GELU") {
    Options o;
    o.half = false;
    unchanged(o);
  }
}

TEST_CASE("fuse_gelu on the exported transformers keeps their outputs", "[passes][fuse][models]") {
  for (const char* name : {"transformer_op13.onnx", "fashion/fashion_vit.onnx"}) {
    INFO(name);
    Model m = test::load_test_model(name);
    rt::Feeds feeds = test::random_feeds(m, 6);
    auto before = test::run_model(m, feeds);
    passes::FuseGelu pass;
    const passes::PassStats st = passes::run_pass(pass, m);
    CHECK(st.changed >= 2);  // one per block
    CHECK(test::count_ops(m, "Erf") == 0);
    CHECK(test::count_ops(m, "Gelu") == st.changed);
    auto after = test::run_model(m, feeds);
    for (size_t i = 0; i < before.size(); ++i) CHECK(test::rel_l2(after[i], before[i]) < 1e-5);
  }
}
