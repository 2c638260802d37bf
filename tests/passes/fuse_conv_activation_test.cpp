// fuse_conv_activation: Conv [+ residual Add] [+ activation] becomes one mpq::FusedConv with the
// same outputs; guarded cases (shared or graph-output intermediates, non-constant Clip bounds,
// broadcasting Adds, float16) are left alone; the verifier accepts every result.
#include <catch2/catch.hpp>

#include "ir/dump.h"
#include "ir/onnx_io.h"
#include "ir/onnx_tools.h"
#include "ir/verify.h"
#include "passes/fuse_conv_activation.h"
#include "passes/fuse_conv_bn.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;

namespace {

using test::count_ops;

std::vector<Tensor> run(const Model& m, const rt::Feeds& feeds) { return test::run_model(m, feeds); }

struct Options {
  std::string act = "Relu";
  bool residual = true;
  bool conv_out_is_output = false;  // the Conv's output is also a graph output
  bool add_out_shared = false;      // the Add's output has a second consumer
  bool clip_bound_input = false;    // Clip's max comes from a graph input
  bool broadcast_residual = false;  // the residual is [1, C, 1, 1]
};

// x[2,3,6,6] -> Conv -> (Add r) -> act -> y
Model conv_act_model(const Options& o) {
  Model m;
  m.set_opset("", 14);  // HardSwish
  Graph& g = *m.graph;
  const Shape out_shape{2, 4, 6, 6};
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2, 3, 6, 6}));
  g.add_input(x);
  Value* w = g.add_initializer("w", test::random_tensor({4, 3, 3, 3}, 1));
  Value* b = g.add_initializer("b", test::random_tensor({4}, 2));
  Value* c = g.add_value("c", ValueType::tensor(DType::Float32, out_shape));
  g.add_node("Conv", {x, w, b}, {c}, "conv")->set_attr(Attribute::make_ints("pads", {1, 1, 1, 1}));
  if (o.conv_out_is_output) g.add_output(c);
  Value* pre = c;
  if (o.residual) {
    const Shape rs = o.broadcast_residual ? Shape{1, 4, 1, 1} : out_shape;
    Value* r = g.add_value("r", ValueType::tensor(DType::Float32, rs));
    g.add_input(r);
    pre = g.add_value("s", ValueType::tensor(DType::Float32, out_shape));
    g.add_node("Add", {r, c}, {pre}, "add");
    if (o.add_out_shared) {
      Value* n = g.add_value("neg");
      g.add_node("Neg", {pre}, {n}, "neg");
      g.add_output(n);
    }
  }
  Value* y = g.add_value("y");
  std::vector<Value*> ins{pre};
  if (o.act == "Clip") {
    ins.push_back(g.add_initializer("lo", Tensor::from<float>({}, {-0.25f})));
    if (o.clip_bound_input) {
      Value* hi = g.add_value("hi", ValueType::tensor(DType::Float32, Shape{}));
      g.add_input(hi);
      ins.push_back(hi);
    } else {
      ins.push_back(g.add_initializer("hi", Tensor::from<float>({}, {0.5f})));
    }
  }
  Node* a = g.add_node(o.act, ins, {y}, "act");
  if (o.act == "LeakyRelu") a->set_attr(Attribute::make_float("alpha", 0.2f));
  if (o.act == "HardSigmoid") a->set_attr(Attribute::make_float("beta", 0.3f));
  g.add_output(y);
  return m;
}

rt::Feeds feeds_for(const Model& m) {
  rt::Feeds f;
  uint32_t seed = 10;
  for (Value* v : m.graph->inputs()) {
    Shape s;
    for (const auto& d : v->type.dims) s.push_back(d.value);
    f[v->name()] = v->name() == "hi" ? Tensor::from<float>({}, {0.5f}) : test::random_tensor(s, seed++, -2.0f, 2.0f);
  }
  return f;
}

}  // namespace

TEST_CASE("fuse_conv_activation fuses Conv + Add + activation and keeps the outputs", "[passes][fuse]") {
  for (const std::string act : {"Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "Tanh", "HardSwish"})
    for (bool residual : {false, true}) {
      INFO(act << " residual=" << residual);
      Options o;
      o.act = act;
      o.residual = residual;
      Model m = conv_act_model(o);
      rt::Feeds feeds = feeds_for(m);
      auto before = run(m, feeds);
      passes::FuseConvActivation pass;
      passes::PassStats s = passes::run_pass(pass, m);
      CHECK(s.changed == (residual ? 2 : 1));
      CHECK(m.graph->num_nodes() == 1);
      CHECK(count_ops(m, "FusedConv") == 1);
      CHECK(verify(m).empty());
      CHECK(m.graph->outputs()[0]->name() == "y");
      const Node& fused = *m.graph->nodes()[0];
      CHECK(fused.domain == "mpq");
      CHECK(fused.attr_string("activation") == act);
      CHECK((fused.input(3) != nullptr) == residual);
      auto after = run(m, feeds);
      CHECK(test::rel_l2(after[0], before[0]) < 1e-6);
    }
}

TEST_CASE("fuse_conv_activation leaves guarded patterns alone", "[passes][fuse]") {
  auto fused_nodes = [](const Options& o) {
    Model m = conv_act_model(o);
    rt::Feeds feeds = feeds_for(m);
    auto before = run(m, feeds);
    passes::FuseConvActivation pass;
    passes::run_pass(pass, m);
    REQUIRE(verify(m).empty());
    auto after = run(m, feeds);
    for (size_t i = 0; i < before.size(); ++i) CHECK(test::rel_l2(after[i], before[i]) < 1e-6);
    return m;
  };
  SECTION("conv output is a graph output: nothing fuses") {
    Options o;
    o.conv_out_is_output = true;
    Model m = fused_nodes(o);
    CHECK(count_ops(m, "Conv") == 1);
    CHECK(count_ops(m, "Add") == 1);
    CHECK(count_ops(m, "Relu") == 1);
  }
  SECTION("Add output read twice: the Add fuses, the activation does not") {
    Options o;
    o.add_out_shared = true;
    Model m = fused_nodes(o);
    CHECK(count_ops(m, "FusedConv") == 1);
    CHECK(count_ops(m, "Relu") == 1);
    CHECK(count_ops(m, "Add") == 0);
  }
  SECTION("Clip with a bound fed at run time") {
    Options o;
    o.act = "Clip";
    o.clip_bound_input = true;
    Model m = fused_nodes(o);
    CHECK(count_ops(m, "Clip") == 1);
  }
  SECTION("broadcasting residual") {
    Options o;
    o.broadcast_residual = true;
    Model m = fused_nodes(o);
    CHECK(count_ops(m, "Add") == 1);
    // The activation follows the Add, not the Conv: it stays too.
    CHECK(count_ops(m, "Relu") == 1);
    CHECK(count_ops(m, "FusedConv") == 0);
  }
}

TEST_CASE("fuse_conv_bn then fuse_conv_activation on the exported ResNet", "[passes][fuse]") {
  Model m = load_model(test::source_dir() / "tests/models/fashion/fashion_resnet.onnx");
  rt::Feeds feeds{{"input", test::random_tensor({3, 1, 28, 28}, 5)}};
  auto before = run(m, feeds);
  // As `mpq run` does it: shapes let the residual Adds fuse; folding turns PyTorch's Identity-shared
  // BatchNorm biases into constants.
  infer_shapes(m);
  passes::run_passes(m, {"fold_constants", "fuse_conv_bn", "fuse_conv_activation"});
  CHECK(count_ops(m, "BatchNormalization") == 0);
  CHECK(count_ops(m, "Relu") == 0);
  CHECK(count_ops(m, "Add") == 0);
  // The two shortcut convolutions have nothing after them to fuse; they become the Z of the block's
  // second convolution.
  CHECK(count_ops(m, "FusedConv") == 7);
  CHECK(count_ops(m, "Conv") == 2);
  auto after = run(m, feeds);
  CHECK(test::rel_l2(after[0], before[0]) < 1e-5);
}

TEST_CASE("fuse_conv_activation recognises Hardswish exported as x * HardSigmoid(x)", "[passes][fuse]") {
  for (float alpha : {1.0f / 6.0f, 0.2f}) {
    INFO("alpha=" << alpha);
    Model m;
    m.set_opset("", 13);
    Graph& g = *m.graph;
    Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{1, 3, 5, 5}));
    g.add_input(x);
    Value* w = g.add_initializer("w", test::random_tensor({4, 3, 3, 3}, 1));
    Value* c = g.add_value("c");
    g.add_node("Conv", {x, w}, {c}, "conv")->set_attr(Attribute::make_ints("pads", {1, 1, 1, 1}));
    Value* h = g.add_value("h");
    g.add_node("HardSigmoid", {c}, {h}, "gate")->set_attr(Attribute::make_float("alpha", alpha));
    Value* y = g.add_value("y");
    g.add_node("Mul", {h, c}, {y}, "mul");
    g.add_output(y);
    rt::Feeds feeds{{"x", test::random_tensor({1, 3, 5, 5}, 2, -3.0f, 3.0f)}};
    auto before = run(m, feeds);
    passes::FuseConvActivation pass;
    passes::run_pass(pass, m);
    REQUIRE(verify(m).empty());
    if (alpha == 1.0f / 6.0f) {
      CHECK(m.graph->num_nodes() == 1);
      CHECK(m.graph->nodes()[0]->attr_string("activation") == "HardSwish");
    } else {
      CHECK(m.graph->num_nodes() == 3);  // x * HardSigmoid(x) with another slope is not Hardswish
    }
    auto after = run(m, feeds);
    CHECK(test::rel_l2(after[0], before[0]) < 1e-6);
  }
}
