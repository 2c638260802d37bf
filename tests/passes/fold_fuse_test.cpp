// fold_constants and fuse_conv_bn: rewrite when the pattern is there, keep the model's outputs,
// leave guarded cases alone, and leave a graph the verifier accepts.
#include <catch2/catch.hpp>

#include "ir/dump.h"
#include "ir/onnx_io.h"
#include "ir/verify.h"
#include "passes/fold_constants.h"
#include "passes/fuse_conv_bn.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;
namespace fs = std::filesystem;

namespace {

using test::count_ops;

std::vector<Tensor> run(const Model& m, const rt::Feeds& feeds) { return test::run_model(m, feeds); }

Value* add_const(Graph& g, const std::string& name, Tensor t) { return g.add_initializer(g.unique_name(name), std::move(t)); }

// x[1,C,5,5] -> Conv(w,b) -> BN -> y ; optionally the conv output also feeds a Relu graph output.
Model conv_bn_model(bool conv_output_shared) {
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  const int64_t cin = 3, cout = 4;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{1, cin, 5, 5}));
  g.add_input(x);
  Value* w = add_const(g, "w", test::random_tensor({cout, cin, 3, 3}, 1));
  Value* b = add_const(g, "b", test::random_tensor({cout}, 2));
  Value* c = g.add_value("c");
  Node* conv = g.add_node("Conv", {x, w, b}, {c}, "conv");
  conv->set_attr(Attribute::make_ints("pads", {1, 1, 1, 1}));
  Value* gamma = add_const(g, "gamma", test::random_tensor({cout}, 3, 0.5f, 1.5f));
  Value* beta = add_const(g, "beta", test::random_tensor({cout}, 4));
  Value* mean = add_const(g, "mean", test::random_tensor({cout}, 5));
  Value* var = add_const(g, "var", test::random_tensor({cout}, 6, 0.1f, 2.0f));
  Value* y = g.add_value("y");
  g.add_node("BatchNormalization", {c, gamma, beta, mean, var}, {y}, "bn")->set_attr(Attribute::make_float("epsilon", 1e-3f));
  g.add_output(y);
  if (conv_output_shared) {
    Value* r = g.add_value("r");
    g.add_node("Relu", {c}, {r}, "relu");
    g.add_output(r);
  }
  return m;
}

}  // namespace

TEST_CASE("fuse_conv_bn folds BatchNormalization into Conv and keeps the outputs", "[passes][fuse]") {
  Model m = conv_bn_model(false);
  rt::Feeds feeds{{"x", test::random_tensor({1, 3, 5, 5}, 7)}};
  auto before = run(m, feeds);
  passes::FuseConvBn pass;
  passes::PassStats s = passes::run_pass(pass, m);
  CHECK(s.changed == 1);
  CHECK(count_ops(m, "BatchNormalization") == 0);
  CHECK(verify(m).empty());
  CHECK(m.graph->outputs()[0]->name() == "y");
  auto after = run(m, feeds);
  CHECK(test::rel_l2(after[0], before[0]) < 1e-5);
  // The unused original weights are gone.
  CHECK(m.graph->find("w") == nullptr);
}

TEST_CASE("fuse_conv_bn leaves a conv whose output has other consumers", "[passes][fuse]") {
  Model m = conv_bn_model(true);
  std::string text = dump(m);
  passes::FuseConvBn pass;
  CHECK(passes::run_pass(pass, m).changed == 0);
  CHECK(dump(m) == text);
}

TEST_CASE("fuse_conv_bn on the exported unfused model", "[passes][fuse]") {
  fs::path path = test::source_dir() / "tests/models/conv_bn_unfused.onnx";
  Model m = load_model(path);
  int bns = count_ops(m, "BatchNormalization");
  REQUIRE(bns >= 1);
  rt::Feeds feeds{{m.graph->required_inputs()[0]->name(), test::random_tensor({1, 3, 16, 16}, 11)}};
  auto before = run(m, feeds);
  passes::FuseConvBn pass;
  CHECK(passes::run_pass(pass, m).changed == bns);
  CHECK(count_ops(m, "BatchNormalization") == 0);
  auto after = run(m, feeds);
  CHECK(test::rel_l2(after[0], before[0]) < 1e-5);
}

TEST_CASE("fuse_conv_bn folds into Gemm and into MatMul + Add", "[passes][fuse]") {
  for (const char* op : {"Gemm", "MatMul"}) {
    INFO(op);
    Model m;
    m.set_opset("", 13);
    Graph& g = *m.graph;
    Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2, 6}));
    g.add_input(x);
    Value* w = add_const(g, "w", test::random_tensor(std::string(op) == "Gemm" ? Shape{5, 6} : Shape{6, 5}, 21));
    Value* h = g.add_value("h");
    if (std::string(op) == "Gemm") {
      Value* c = add_const(g, "c", test::random_tensor({5}, 22));
      g.add_node("Gemm", {x, w, c}, {h}, "gemm")->set_attr(Attribute::make_int("transB", 1));
    } else {
      g.add_node("MatMul", {x, w}, {h}, "mm");
    }
    std::vector<Value*> bn_in{h};
    for (int i = 0; i < 4; ++i) bn_in.push_back(add_const(g, "bn", test::random_tensor({5}, 30 + i, 0.2f, 1.2f)));
    Value* y = g.add_value("y");
    g.add_node("BatchNormalization", bn_in, {y}, "bn");
    g.add_output(y);
    rt::Feeds feeds{{"x", test::random_tensor({2, 6}, 40)}};
    auto before = run(m, feeds);
    passes::FuseConvBn pass;
    CHECK(passes::run_pass(pass, m).changed == 1);
    CHECK(count_ops(m, "BatchNormalization") == 0);
    CHECK(test::rel_l2(run(m, feeds)[0], before[0]) < 1e-5);
  }
}

TEST_CASE("fold_constants turns constant subgraphs into initializers", "[passes][fold]") {
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2, 3}));
  g.add_input(x);
  Value* k = g.add_value("k");
  g.add_node("Constant", {}, {k}, "const")->set_attr(Attribute::make_tensor("value", Tensor::from<float>({3}, {1, 2, 3})));
  Value* two = add_const(g, "two", Tensor::from<float>({1}, {2}));
  Value* k2 = g.add_value("k2");
  g.add_node("Mul", {k, two}, {k2}, "scale");
  Value* shape = g.add_value("shape");
  g.add_node("Shape", {x}, {shape}, "shape_of_x");
  Value* reshaped = g.add_value("reshaped");
  Value* y = g.add_value("y");
  g.add_node("Reshape", {x, shape}, {reshaped}, "reshape");
  g.add_node("Add", {reshaped, k2}, {y}, "add");
  g.add_output(y);
  rt::Feeds feeds{{"x", test::random_tensor({2, 3}, 50)}};
  auto before = run(m, feeds);
  passes::FoldConstants pass;
  passes::PassStats s = passes::run_pass(pass, m);
  CHECK(s.changed == 3);  // Constant, Mul, Shape
  CHECK(count_ops(m, "Constant") == 0);
  CHECK(count_ops(m, "Mul") == 0);
  CHECK(count_ops(m, "Shape") == 0);
  CHECK(count_ops(m, "Add") == 1);
  CHECK(m.graph->find("k2")->has_initializer());
  CHECK(m.graph->find("two") == nullptr);  // no longer read by anything
  CHECK(test::max_abs_diff(run(m, feeds)[0], before[0]) == 0.0);
}

TEST_CASE("fold_constants keeps QuantizeLinear/DequantizeLinear and graph outputs", "[passes][fold]") {
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  Value* q = add_const(g, "wq", Tensor::from<int8_t>({2}, {10, -20}));
  Value* s = add_const(g, "ws", Tensor::scalar<float>(0.1f));
  Value* w = g.add_value("w");
  g.add_node("DequantizeLinear", {q, s}, {w}, "dq");
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2}));
  g.add_input(x);
  Value* y = g.add_value("y");
  g.add_node("Add", {x, w}, {y}, "add");
  g.add_output(y);
  Value* c = add_const(g, "c", Tensor::from<float>({1}, {1}));
  Value* out2 = g.add_value("out2");
  g.add_node("Neg", {c}, {out2}, "neg");
  g.add_output(out2);
  passes::FoldConstants pass;
  CHECK(passes::run_pass(pass, m).changed == 0);
  CHECK(count_ops(m, "DequantizeLinear") == 1);
  CHECK(count_ops(m, "Neg") == 1);
}
