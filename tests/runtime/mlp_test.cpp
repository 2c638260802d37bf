// mpq::GeluMlp (runtime/cpu/mlp.cpp): the same bits as the nodes it replaces, mpq::MatMulBias -> Gelu
// -> mpq::MatMulBias (with a LayerNormalization before and a residual Add after, or either), for
// odd row counts, ranks, empty and scalar biases, both approximations, on 1-3 threads (bands of
// rows) and on OpenBLAS (a DeterministicBlas scope); bad shapes, types and attributes are errors
// naming the node.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "ir/graph.h"
#include "runtime/cpu/conv_common.h"
#include "runtime/cpu/gemm_small.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;

namespace {

struct MlpShape {
  Shape x;  // [..., K]
  int64_t hidden = 48, out = 16;
  bool scalar_b1 = false, scalar_b2 = false;
  std::string approximate = "none";
  bool layer_norm = false;  // LayerNormalization(x) first (epsilon 1e-6)
  bool residual = false;    // Add(x, block) after (out == K)
};

// x -> (fused) GeluMlp -> y, or (unfused) MatMulBias -> mpq::Gelu -> MatMulBias -> y.
Model mlp_model(const MlpShape& s, bool fused) {
  Model m;
  m.set_opset("", 17);  // LayerNormalization
  m.set_opset("mpq", 1);
  Graph& g = *m.graph;
  const int64_t K = s.x.back();
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, s.x));
  g.add_input(x);
  Value* w1 = g.add_initializer("w1", test::random_tensor({K, s.hidden}, 11, -0.5f, 0.5f));
  Value* b1 = g.add_initializer("b1", test::random_tensor(s.scalar_b1 ? Shape{1} : Shape{s.hidden}, 12));
  Value* w2 = g.add_initializer("w2", test::random_tensor({s.hidden, s.out}, 13, -0.5f, 0.5f));
  Value* b2 = g.add_initializer("b2", test::random_tensor(s.scalar_b2 ? Shape{1} : Shape{s.out}, 14));
  Value* ln_scale = g.add_initializer("ln_scale", test::random_tensor({K}, 15, 0.5f, 1.5f));
  Value* ln_bias = g.add_initializer("ln_bias", test::random_tensor({K}, 16));
  Value* y = g.add_value("y");
  if (fused) {
    std::vector<Value*> inputs = {x, w1, b1, w2, b2};
    if (s.layer_norm) inputs.insert(inputs.end(), {ln_scale, ln_bias});
    Node* n = g.add_node("GeluMlp", inputs, {y}, "mlp", "mpq");
    n->set_attr(Attribute::make_string("approximate", s.approximate));
    if (s.layer_norm) {
      n->set_attr(Attribute::make_int("layer_norm", 1));
      n->set_attr(Attribute::make_float("epsilon", 1e-6f));
    }
    if (s.residual) n->set_attr(Attribute::make_int("residual", 1));
  } else {
    Value* in = x;
    if (s.layer_norm) {
      in = g.add_value("normalized");
      g.add_node("LayerNormalization", {x, ln_scale, ln_bias}, {in}, "ln")
          ->set_attr(Attribute::make_float("epsilon", 1e-6f));
    }
    Value* h = g.add_value("h");
    Value* a = g.add_value("a");
    Value* block = s.residual ? g.add_value("block") : y;
    g.add_node("MatMulBias", {in, w1, b1}, {h}, "fc1", "mpq");
    g.add_node("Gelu", {h}, {a}, "gelu", "mpq")->set_attr(Attribute::make_string("approximate", s.approximate));
    g.add_node("MatMulBias", {a, w2, b2}, {block}, "fc2", "mpq");
    if (s.residual) g.add_node("Add", {x, block}, {y}, "residual");
  }
  g.add_output(y);
  return m;
}

}  // namespace

TEST_CASE("mpq::GeluMlp gives the bits of MatMulBias -> Gelu -> MatMulBias on any thread count", "[runtime][mlp]") {
  std::vector<MlpShape> shapes;
  for (const Shape& x :
       {Shape{24}, Shape{0, 24}, Shape{1, 24}, Shape{5, 24}, Shape{1, 17, 64}, Shape{3, 11, 24}, Shape{2, 33, 64}}) {
    MlpShape s;
    s.x = x;
    if (x.back() == 64) {
      s.hidden = 128;  // the ViT's block: 17 rows split into two bands
      s.out = 64;
    }
    shapes.push_back(s);
  }
  for (const bool residual : {false, true}) {  // the pre-norm block, with and without its residual Add
    MlpShape s;
    s.x = {1, 17, 64};
    s.hidden = 128;
    s.out = residual ? 64 : 40;
    s.layer_norm = true;
    s.residual = residual;
    shapes.push_back(s);
  }
  MlpShape add_only;
  add_only.x = {6, 24};
  add_only.out = 24;
  add_only.residual = true;
  shapes.push_back(add_only);
  MlpShape odd;
  odd.x = {7, 24};
  odd.hidden = 40;  // columns left over from whole vectors in both products
  odd.out = 21;
  odd.scalar_b1 = true;
  odd.scalar_b2 = true;
  shapes.push_back(odd);
  for (const std::string approximate : {"none", "tanh"})
    for (MlpShape s : shapes) {
      s.approximate = approximate;
      INFO("x " << shape_str(s.x) << " hidden " << s.hidden << " out " << s.out << " approximate " << approximate
                 << " layer_norm " << s.layer_norm << " residual " << s.residual);
      const rt::Feeds feeds{{"x", test::random_tensor(s.x, 21, -3.0f, 3.0f)}};
      const Tensor expected = test::run_model(mlp_model(s, false), feeds, 1)[0];
      for (int threads : {1, 2, 3}) {
        INFO(threads << " threads");
        const Tensor got = test::run_model(mlp_model(s, true), feeds, threads)[0];
        REQUIRE(got.shape() == expected.shape());
        CHECK(test::same_bits(got, expected));
      }
    }
}

TEST_CASE("mpq::GeluMlp on OpenBLAS where mpq's small-B kernel is off keeps the unfused bits", "[runtime][mlp]") {
  for (const bool block : {false, true}) {  // with the LayerNorm and the residual Add, or without
    MlpShape s;
    s.x = {9, 24};
    s.layer_norm = s.residual = block;
    if (block) s.out = 24;
    INFO("layer_norm and residual " << block);
    const rt::Feeds feeds{{"x", test::random_tensor(s.x, 31, -3.0f, 3.0f)}};
    rt::cpu::DeterministicBlas blas;  // small_gemm_applies is false on this thread
    REQUIRE_FALSE(rt::cpu::small_gemm_applies(false, false, 24, s.hidden));
    const Tensor expected = test::run_model(mlp_model(s, false), feeds, 1)[0];
    const Tensor got = test::run_model(mlp_model(s, true), feeds, 1)[0];
    CHECK(test::same_bits(got, expected));
  }
}

TEST_CASE("mpq::GeluMlp refuses bad shapes, types and attributes, naming the node", "[runtime][mlp]") {
  auto run = [](Model m, const Shape& x) { return test::run_model(m, {{"x", test::random_tensor(x, 5)}}, 1); };
  SECTION("W2 does not take W1's columns") {
    MlpShape s;
    s.x = {4, 24};
    Model m = mlp_model(s, true);
    m.graph->set_initializer(m.graph->find("w2"), test::random_tensor({47, 16}, 1));
    CHECK_THROWS_WITH(run(std::move(m), {4, 24}), Catch::Contains("mlp") && Catch::Contains("do not chain"));
  }
  SECTION("a bias of the wrong length") {
    MlpShape s;
    s.x = {4, 24};
    Model m = mlp_model(s, true);
    m.graph->set_initializer(m.graph->find("b2"), test::random_tensor({3}, 1));
    CHECK_THROWS_WITH(run(std::move(m), {4, 24}), Catch::Contains("mlp") && Catch::Contains("biases"));
  }
  SECTION("layer_norm = 1 without its scale and bias") {
    MlpShape s;
    s.x = {4, 24};
    Model m = mlp_model(s, true);
    m.graph->nodes()[0]->set_attr(Attribute::make_int("layer_norm", 1));
    CHECK_THROWS_WITH(run(std::move(m), {4, 24}), Catch::Contains("mlp") && Catch::Contains("scale and bias"));
  }
  SECTION("a layer norm axis other than X's last") {
    MlpShape s;
    s.x = {2, 4, 24};
    s.layer_norm = true;
    Model m = mlp_model(s, true);
    m.graph->nodes()[0]->set_attr(Attribute::make_int("axis", 1));
    CHECK_THROWS_WITH(run(std::move(m), {2, 4, 24}), Catch::Contains("mlp") && Catch::Contains("axis"));
  }
  SECTION("residual = 1 where the block changes the row's width") {
    MlpShape s;
    s.x = {4, 24};
    Model m = mlp_model(s, true);  // out 16
    m.graph->nodes()[0]->set_attr(Attribute::make_int("residual", 1));
    CHECK_THROWS_WITH(run(std::move(m), {4, 24}), Catch::Contains("mlp") && Catch::Contains("residual"));
  }
  SECTION("an unknown approximation") {
    MlpShape s;
    s.x = {4, 24};
    s.approximate = "cubic";
    CHECK_THROWS_WITH(run(mlp_model(s, true), {4, 24}), Catch::Contains("mlp") && Catch::Contains("cubic"));
  }
  SECTION("float64 weights") {
    MlpShape s;
    s.x = {4, 24};
    Model m = mlp_model(s, true);
    Value* w1 = m.graph->find("w1");
    m.graph->set_initializer(w1, w1->initializer().cast_to(DType::Float64));
    CHECK_THROWS_WITH(run(std::move(m), {4, 24}), Catch::Contains("mlp") && Catch::Contains("float32"));
  }
}
