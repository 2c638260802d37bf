// fuse_gelu_mlp: mpq::MatMulBias -> Gelu -> mpq::MatMulBias becomes one mpq::GeluMlp with the same
// bits (one and two threads), with a pre-norm block's LayerNorm and residual Add folded in where
// only the block reads them; guarded cases (an intermediate read elsewhere or a graph output,
// weights too large or too narrow for mpq's small-B kernel, weights that are not constants, an
// ONNX Gelu of another approximation) are left alone; on the exported transformers every
// feed-forward block fuses and the outputs keep their bits.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "ir/verify.h"
#include "passes/fuse_gelu.h"
#include "passes/fuse_gelu_mlp.h"
#include "passes/fuse_layer_norm.h"
#include "passes/fuse_matmul_bias.h"
#include "passes/inference_fusion.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;

namespace {

struct Options {
  int64_t k = 24, hidden = 48, out = 32;
  bool hidden_read_twice = false;    // fc1's output also feeds a Neg (a graph output)
  bool gelu_is_output = false;       // the Gelu's output is also a graph output
  bool w2_is_input = false;          // W2 is a graph input
  bool onnx_gelu = false;            // ONNX Gelu (opset 20) instead of mpq::Gelu
  std::string approximate = "none";
  bool pre_norm = false;             // x -> LayerNormalization -> block -> Add(x, .) (out == k)
  bool normalized_read_twice = false;  // with pre_norm: the LayerNorm's output also feeds a Neg
  bool add_other = false;            // with pre_norm: the Add adds another input, not x
  bool mean_read = false;            // with pre_norm: the LayerNorm's Mean output is a graph output
  int64_t ln_axis = -1;              // with pre_norm: the LayerNorm's axis
};

// x[2, 9, K] -> MatMulBias(W1, b1) -> Gelu -> MatMulBias(W2, b2) -> y
Model mlp_model(const Options& o) {
  Model m;
  m.set_opset("", o.onnx_gelu ? 20 : 17);
  m.set_opset("mpq", 1);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2, 9, o.k}));
  g.add_input(x);
  Value* in = x;
  if (o.pre_norm) {
    in = g.add_value("normalized");
    std::vector<Value*> outs = {in};
    if (o.mean_read) outs.push_back(g.add_value("mean"));
    Node* ln = g.add_node("LayerNormalization",
                          {x, g.add_initializer("ln_scale", test::random_tensor({o.k}, 6, 0.5f, 1.5f)),
                           g.add_initializer("ln_bias", test::random_tensor({o.k}, 7))},
                          outs, "ln");
    ln->set_attr(Attribute::make_float("epsilon", 1e-6f));
    ln->set_attr(Attribute::make_int("axis", o.ln_axis));
    if (o.mean_read) g.add_output(outs[1]);
  }
  Value* w1 = g.add_initializer("w1", test::random_tensor({o.k, o.hidden}, 2, -0.5f, 0.5f));
  Value* b1 = g.add_initializer("b1", test::random_tensor({o.hidden}, 3));
  Value* w2 = nullptr;
  if (o.w2_is_input) {
    w2 = g.add_value("w2", ValueType::tensor(DType::Float32, Shape{o.hidden, o.out}));
    g.add_input(w2);
  } else {
    w2 = g.add_initializer("w2", test::random_tensor({o.hidden, o.out}, 4, -0.5f, 0.5f));
  }
  Value* b2 = g.add_initializer("b2", test::random_tensor({o.out}, 5));
  Value* h = g.add_value("h");
  Value* a = g.add_value("a");
  Value* y = g.add_value("y");
  g.add_node("MatMulBias", {in, w1, b1}, {h}, "fc1", "mpq");
  Node* gelu = g.add_node("Gelu", {h}, {a}, "gelu", o.onnx_gelu ? "" : "mpq");
  gelu->set_attr(Attribute::make_string("approximate", o.approximate));
  if (o.pre_norm) {
    Value* block = g.add_value("block");
    g.add_node("MatMulBias", {a, w2, b2}, {block}, "fc2", "mpq");
    Value* other = x;
    if (o.add_other) {
      other = g.add_value("other", ValueType::tensor(DType::Float32, Shape{2, 9, o.k}));
      g.add_input(other);
    }
    g.add_node("Add", {block, other}, {y}, "residual");
    if (o.normalized_read_twice) {
      Value* n = g.add_value("neg_normalized");
      g.add_node("Neg", {in}, {n}, "neg_normalized");
      g.add_output(n);
    }
  } else {
    g.add_node("MatMulBias", {a, w2, b2}, {y}, "fc2", "mpq");
  }
  g.add_output(y);
  if (o.hidden_read_twice) {
    Value* n = g.add_value("neg");
    g.add_node("Neg", {h}, {n}, "neg");
    g.add_output(n);
  }
  if (o.gelu_is_output) g.add_output(a);
  return m;
}

// Runs the pass and checks the outputs keep their bits on one and two threads.
passes::PassStats fuse_and_compare(Model& m) {
  const rt::Feeds feeds = test::random_feeds(m, 30);
  std::vector<std::vector<Tensor>> before;
  for (int threads : {1, 2}) before.push_back(test::run_model(m, feeds, threads));
  passes::FuseGeluMlp pass;
  passes::PassStats s = passes::run_pass(pass, m);
  REQUIRE(verify(m).empty());
  for (int t = 0; t < 2; ++t) {
    const auto after = test::run_model(m, feeds, t + 1);
    REQUIRE(after.size() == before[static_cast<size_t>(t)].size());
    for (size_t i = 0; i < after.size(); ++i) CHECK(test::same_bits(after[i], before[static_cast<size_t>(t)][i]));
  }
  return s;
}

}  // namespace

TEST_CASE("fuse_gelu_mlp turns MatMulBias -> Gelu -> MatMulBias into one node with the same bits", "[passes][fuse]") {
  for (const bool onnx_gelu : {false, true})
    for (const std::string approximate : {"none", "tanh"}) {
      INFO((onnx_gelu ? "ONNX" : "mpq") << " Gelu, approximate " << approximate);
      Options o;
      o.onnx_gelu = onnx_gelu;
      o.approximate = approximate;
      Model m = mlp_model(o);
      CHECK(fuse_and_compare(m).changed == 1);
      REQUIRE(m.graph->num_nodes() == 1);
      const Node& fused = *m.graph->nodes()[0];
      CHECK(fused.domain == "mpq");
      CHECK(fused.op_type == "GeluMlp");
      CHECK(fused.attr_string("approximate", "") == approximate);
      CHECK(fused.input(0)->name() == "x");
      CHECK(fused.input(3)->name() == "w2");
      CHECK(m.graph->outputs()[0]->name() == "y");
    }
}

TEST_CASE("fuse_gelu_mlp folds a pre-norm block's LayerNorm and residual Add in where it can", "[passes][fuse]") {
  struct Case {
    const char* what;
    bool read_twice, add_other;
    size_t nodes;         // after the pass
    bool norm, residual;  // folded into the node
    bool mean_read = false;
  };
  for (const Case& c : {Case{"the whole block", false, false, 1, true, true},
                        Case{"the LayerNorm's Mean read (a graph output)", false, false, 3, false, false, true},
                        Case{"the LayerNorm's output read elsewhere (the Add then adds what the node does not read)", true, false, 4, false, false},
                        Case{"an Add of another tensor", false, true, 2, true, false}}) {
    INFO(c.what);
    Options o;
    o.k = o.out = 24;
    o.pre_norm = true;
    o.normalized_read_twice = c.read_twice;
    o.add_other = c.add_other;
    o.mean_read = c.mean_read;
    Model m = mlp_model(o);
    CHECK(fuse_and_compare(m).changed == 1);
    CHECK(m.graph->num_nodes() == c.nodes);
    REQUIRE(test::count_ops(m, "GeluMlp") == 1);
    for (const auto& n : m.graph->nodes()) {
      if (n->op_type != "GeluMlp") continue;
      CHECK((n->attr_int("layer_norm", 0) == 1) == c.norm);
      CHECK((n->attr_int("residual", 0) == 1) == c.residual);
      CHECK(n->num_inputs() == (c.norm ? 7u : 5u));
      if (c.norm) CHECK(n->attr_float("epsilon", 0.0f) == 1e-6f);
    }
  }
}

TEST_CASE("fuse_gelu_mlp folds no LayerNorm over more than the last axis", "[passes][fuse]") {
  Options o;
  o.k = o.out = 24;
  o.pre_norm = true;
  o.ln_axis = 1;  // over [9, K] (its scale would need that shape too: the pass alone here)
  Model m = mlp_model(o);
  passes::FuseGeluMlp pass;
  CHECK(passes::run_pass(pass, m).changed == 1);
  CHECK(test::count_ops(m, "LayerNormalization") == 1);
  for (const auto& n : m.graph->nodes())
    if (n->op_type == "GeluMlp") CHECK(n->attr_int("layer_norm", 0) == 0);
}

TEST_CASE("fuse_gelu_mlp leaves guarded patterns alone", "[passes][fuse]") {
  auto unchanged = [](const Options& o) {
    Model m = mlp_model(o);
    const size_t nodes = m.graph->num_nodes();
    CHECK(fuse_and_compare(m).changed == 0);
    CHECK(m.graph->num_nodes() == nodes);
  };
  Options o;
  SECTION("fc1's output is read twice") { o.hidden_read_twice = true; }
  SECTION("the Gelu's output is a graph output") { o.gelu_is_output = true; }
  SECTION("W2 is a graph input") { o.w2_is_input = true; }
  SECTION("W1 too large for the small-B kernel") {
    o.k = 128;
    o.hidden = 160;  // 20,480 values
  }
  SECTION("a hidden layer narrower than one vector") { o.hidden = 8; }
  SECTION("W2 too large for the small-B kernel") { o.out = 400; }  // 19,200 values
  unchanged(o);
}

TEST_CASE("fuse_gelu_mlp leaves a Gelu of an unknown approximation, or an ONNX Gelu before opset 20, alone",
          "[passes][fuse]") {
  for (const bool unknown_approximation : {true, false}) {
    Options o;
    if (unknown_approximation)
      o.approximate = "fast";  // the Gelu kernel refuses it at run time, naming the node
    else
      o.onnx_gelu = true;
    Model m = mlp_model(o);
    if (!unknown_approximation) m.set_opset("", 17);  // no ONNX Gelu there
    passes::FuseGeluMlp pass;
    CHECK(passes::run_pass(pass, m).changed == 0);
    CHECK(test::count_ops(m, "Gelu") == 1);
  }
}

TEST_CASE("fuse_gelu_mlp on the exported transformers fuses every block and keeps the outputs' bits",
          "[passes][fuse][models]") {
  for (const auto& [name, blocks] : {std::pair{"transformer_op17.onnx", 2}, std::pair{"fashion/fashion_vit.onnx", 4}}) {
    INFO(name);
    Model m = test::load_test_model(name);
    const rt::Feeds feeds = test::random_feeds(m, 9);
    passes::FuseLayerNorm layer_norm;
    passes::FuseMatMulBias matmul_bias;
    passes::FuseGelu gelu;
    passes::run_pass(layer_norm, m);
    passes::run_pass(matmul_bias, m);
    passes::run_pass(gelu, m);
    std::vector<std::vector<Tensor>> before;
    for (int threads : {1, 2}) before.push_back(test::run_model(m, feeds, threads));
    passes::FuseGeluMlp mlp;
    CHECK(passes::run_pass(mlp, m).changed == blocks);
    REQUIRE(verify(m).empty());
    CHECK(test::count_ops(m, "GeluMlp") == blocks);
    CHECK(test::count_ops(m, "Gelu") == 0);
    for (const auto& n : m.graph->nodes())  // every block is pre-norm with a residual
      if (n->op_type == "GeluMlp") CHECK((n->attr_int("layer_norm", 0) == 1 && n->attr_int("residual", 0) == 1));
    for (int t = 0; t < 2; ++t) {
      const auto after = test::run_model(m, feeds, t + 1);
      for (size_t i = 0; i < after.size(); ++i) CHECK(test::same_bits(after[i], before[static_cast<size_t>(t)][i]));
    }
  }
}

TEST_CASE("mpq run's fusions include fuse_gelu_mlp unless MPQ_GELU_MLP=0", "[passes][fuse][models]") {
  auto fused_blocks = [] {
    Model m = test::load_test_model("transformer_op17.onnx");
    passes::fuse_for_inference(m, rt::BackendKind::CPU, {});
    return test::count_ops(m, "GeluMlp");
  };
  // Restores the caller's MPQ_GELU_MLP (or its absence) however the test leaves.
  struct EnvGuard {
    bool had = std::getenv("MPQ_GELU_MLP") != nullptr;
    std::string value = had ? std::getenv("MPQ_GELU_MLP") : "";
    ~EnvGuard() {
      if (had)
        setenv("MPQ_GELU_MLP", value.c_str(), 1);
      else
        unsetenv("MPQ_GELU_MLP");
    }
  } guard;
  unsetenv("MPQ_GELU_MLP");
  CHECK(fused_blocks() == 2);
  setenv("MPQ_GELU_MLP", "0", 1);
  CHECK(fused_blocks() == 0);
}
