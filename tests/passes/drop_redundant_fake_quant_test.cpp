// drop_redundant_fake_quant: a FakeQuant whose input already lies on its grid (after a MaxPool or
// Concat of values quantized with the same parameters, as QDQ models quantize them again) is
// dropped with the same output bits; different scales, narrower bounds and graph outputs keep it;
// fake_quant_grid looks through the moving ops, so the convolution after a Concat still runs in
// int8.
#include <catch2/catch.hpp>

#include <vector>

#include "ir/verify.h"
#include "passes/drop_redundant_fake_quant.h"
#include "passes/fuse_conv_activation.h"
#include "passes/fuse_conv_fake_quant.h"
#include "passes/fuse_qdq_pair.h"
#include "passes/pass.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;

namespace {

using test::same_bits;

struct Options {
  float pool_requant_scale = 0.05f;     // the QDQ after the MaxPool (0.05: the same as its input's)
  bool pool_requant_uint8 = false;       // that QDQ in uint8 (bounds [0, 255] against [-128, 127])
};

// Q -> DQ of v with scale s and an int8 (or uint8) zero point 0.
Value* qdq(Graph& g, Value* v, float s, bool uint8, const std::string& name) { return test::add_qdq(g, v, name, s, uint8); }

// x [1, 16, 9, 7]:
//   a = QDQ(Relu(Conv3x3(x)))                  (fused into the convolution)
//   b = QDQ(MaxPool3x3(QDQ(x)))                 (the first QDQ a FakeQuant of its own)
//   y = Conv1x1(QDQ(Concat(a, b)))
Model model(const Options& o) {
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  const Shape shape{1, 16, 9, 7};
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, shape));
  g.add_input(x);
  Value* c = g.add_value("c", ValueType::tensor(DType::Float32, shape));
  Node* conv = g.add_node("Conv",
                          {x, g.add_initializer("w1", test::random_tensor({16, 16, 3, 3}, 71, -0.3f, 0.3f)),
                           g.add_initializer("b1", test::random_tensor({16}, 72))},
                          {c}, "conv1");
  conv->set_attr(Attribute::make_ints("pads", {1, 1, 1, 1}));
  Value* r = g.add_value("r", ValueType::tensor(DType::Float32, shape));
  g.add_node("Relu", {c}, {r}, "relu1");
  Value* a = qdq(g, r, 0.05f, false, "qa");
  Value* xq = qdq(g, x, 0.05f, false, "qx");
  Value* p = g.add_value("p", ValueType::tensor(DType::Float32, shape));
  Node* pool = g.add_node("MaxPool", {xq}, {p}, "pool");
  pool->set_attr(Attribute::make_ints("kernel_shape", {3, 3}));
  pool->set_attr(Attribute::make_ints("pads", {1, 1, 1, 1}));
  Value* b = qdq(g, p, o.pool_requant_scale, o.pool_requant_uint8, "qp");
  Value* cat = g.add_value("cat", ValueType::tensor(DType::Float32, Shape{1, 32, 9, 7}));
  g.add_node("Concat", {a, b}, {cat}, "concat")->set_attr(Attribute::make_int("axis", 1));
  Value* catq = qdq(g, cat, 0.05f, false, "qc");
  Value* y = g.add_value("y");
  g.add_node("Conv", {catq, g.add_initializer("w2", test::random_tensor({8, 32, 1, 1}, 73))}, {y}, "conv2");
  g.add_output(y);
  return m;
}

// The inference pipeline's passes up to and including this one, as `mpq run` runs them.
Model fused(const Model& original, bool drop) {
  Model m = original.clone();
  passes::FuseConvActivation act;
  passes::FuseQdqPair qdq_pair;
  passes::FuseConvFakeQuant conv_fq;
  passes::DropRedundantFakeQuant drop_fq;
  passes::run_pass(act, m);
  passes::run_pass(qdq_pair, m);
  passes::run_pass(conv_fq, m);
  if (drop) passes::run_pass(drop_fq, m);
  return m;
}

std::vector<Tensor> run_model(const Model& m, const Tensor& x, int threads) { return test::run_model(m, {{"x", x}}, threads); }

// Inputs with values on and between grid steps, ties (k + 0.5 steps) and beyond int8's range.
Tensor input(uint32_t seed) {
  Tensor x = test::random_tensor({1, 16, 9, 7}, seed, -8.0f, 8.0f);
  float* v = x.data<float>();
  for (int64_t i = 0; i < x.numel(); i += 5) v[i] = (static_cast<float>(i % 300) - 150.0f + 0.5f) * 0.05f;
  return x;
}

}  // namespace

TEST_CASE("drop_redundant_fake_quant drops re-quantization on the same grid, same bits", "[passes][drop_redundant_fake_quant]") {
  const Model original = model({});
  const Model kept = fused(original, false), dropped = fused(original, true);
  CHECK(verify(dropped).empty());
  // Left by the fusions: the FakeQuant of x, the MaxPool's and the Concat's; the convolution's is fused.
  CHECK(test::count_ops(kept, "FakeQuant") == 3);
  CHECK(test::count_ops(dropped, "FakeQuant") == 1);
  // The Concat now reads the MaxPool's output directly, and the convolution the Concat's.
  passes::FakeQuantGrid grid;
  REQUIRE(dropped.graph->find("cat") != nullptr);
  CHECK(passes::fake_quant_grid(dropped.graph->find("cat"), grid));
  CHECK(grid.scale == 0.05f);
  CHECK(grid.lo == -128.0f);
  CHECK(grid.hi == 127.0f);
  for (const int threads : {1, 2})
    for (const uint32_t seed : {81u, 82u}) {
      INFO(threads << " thread(s), seed " << seed);
      const Tensor x = input(seed);
      const Tensor want = run_model(original, x, threads)[0];
      CHECK(same_bits(run_model(kept, x, threads)[0], want));
      CHECK(same_bits(run_model(dropped, x, threads)[0], want));
    }
}

TEST_CASE("drop_redundant_fake_quant keeps a FakeQuant that changes values or is a graph output",
          "[passes][drop_redundant_fake_quant]") {
  SECTION("another scale after the MaxPool: it and the Concat's (mixed scales) stay") {
    Options o;
    o.pool_requant_scale = 0.07f;
    const Model m = fused(model(o), true);
    CHECK(test::count_ops(m, "FakeQuant") == 3);
    passes::FakeQuantGrid grid;
    CHECK_FALSE(passes::fake_quant_grid(m.graph->find("cat"), grid));
    const Tensor x = input(83);
    CHECK(same_bits(run_model(m, x, 2)[0], run_model(model(o), x, 2)[0]));
  }
  SECTION("bounds narrower than the input's (uint8 after int8): it stays, the Concat's too") {
    Options o;
    o.pool_requant_uint8 = true;
    const Model m = fused(model(o), true);
    CHECK(test::count_ops(m, "FakeQuant") == 3);
    const Tensor x = input(84);
    CHECK(same_bits(run_model(m, x, 2)[0], run_model(model(o), x, 2)[0]));
  }
  SECTION("the Concat's FakeQuant writes a graph output: it stays") {
    const Model original = model({});
    Model m = fused(original, false);
    Value* catq = nullptr;
    for (const auto& node : m.graph->nodes())
      if (node->op_type == "FakeQuant" && node->input(0)->name() == "cat") catq = node->output(0);
    REQUIRE(catq != nullptr);
    m.graph->add_output(catq);
    passes::DropRedundantFakeQuant drop_fq;
    passes::run_pass(drop_fq, m);
    CHECK(verify(m).empty());
    CHECK(test::count_ops(m, "FakeQuant") == 2);  // x's and the Concat's; the MaxPool's is dropped
    CHECK(catq->producer() != nullptr);
    CHECK(catq->producer()->op_type == "FakeQuant");
  }
}
