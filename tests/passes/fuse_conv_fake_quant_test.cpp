// fuse_conv_fake_quant: an mpq::FakeQuant with one scale right after a float32 convolution runs in
// mpq::FusedConv's epilogue (attribute fake_quant) with FakeQuant's bits: ties to even, clamping at
// both ends, -0, on oneDNN's post-ops and on mpq's own kernels, plain and channel-blocked; the
// guarded cases are left alone; a malformed attribute is refused naming the node.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "ir/verify.h"
#include "passes/fuse_conv_activation.h"
#include "passes/fuse_conv_fake_quant.h"
#include "passes/fuse_qdq_pair.h"
#include "passes/pass.h"
#include "runtime/cpu/channel_blocks.h"
#include "runtime/cpu/conv_onednn.h"
#include "runtime/cpu/quant_internal.h"
#include "runtime/executor.h"
#include "runtime/thread_pool.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// x [2, 16, 9, 7] -> Conv (3x3, pad 1) -> Relu -> QuantizeLinear -> DequantizeLinear -> Conv (1x1) -> y
struct Options {
  bool conv_output_read_twice = false;  // an Identity also reads the first Conv's output
  bool conv_output_is_graph_output = false;
  bool per_channel = false;  // FakeQuant with one scale per channel: not fused
  bool sigmoid_after_quant = false;  // DequantizeLinear -> Sigmoid -> the second Conv
  bool relu = true;                  // the first Conv's Relu (without it, the Conv feeds Q directly)
};

Model qdq_conv_model(const Options& o) {
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2, 16, 9, 7}));
  g.add_input(x);
  Value* c1 = g.add_value("c1", ValueType::tensor(DType::Float32, Shape{2, 16, 9, 7}));
  Node* conv = g.add_node("Conv",
                          {x, g.add_initializer("w1", test::random_tensor({16, 16, 3, 3}, 61, -0.3f, 0.3f)),
                           g.add_initializer("b1", test::random_tensor({16}, 62))},
                          {c1}, "conv1");
  conv->set_attr(Attribute::make_ints("pads", {1, 1, 1, 1}));
  Value* r = c1;
  if (o.relu) {
    r = g.add_value("r", ValueType::tensor(DType::Float32, Shape{2, 16, 9, 7}));
    g.add_node("Relu", {c1}, {r}, "relu1");
  }
  Value* q = g.add_value("q");
  Value* s = o.per_channel ? g.add_initializer("s", test::random_tensor({16}, 63, 0.02f, 0.05f))
                           : g.add_initializer("s", Tensor::from<float>({}, {0.037f}));
  Value* zp = o.per_channel ? g.add_initializer("zp", Tensor::from<uint8_t>({16}, std::vector<uint8_t>(16, 7)))
                            : g.add_initializer("zp", Tensor::from<uint8_t>({}, {7}));
  Node* qn = g.add_node("QuantizeLinear", {r, s, zp}, {q}, "quant");
  Value* dq = g.add_value("dq");
  Node* dqn = g.add_node("DequantizeLinear", {q, s, zp}, {dq}, "dequant");
  if (o.per_channel) {
    qn->set_attr(Attribute::make_int("axis", 1));
    dqn->set_attr(Attribute::make_int("axis", 1));
  }
  if (o.sigmoid_after_quant) {
    Value* sg = g.add_value("sg");
    g.add_node("Sigmoid", {dq}, {sg}, "sigmoid");
    dq = sg;
  }
  Value* y = g.add_value("y");
  g.add_node("Conv", {dq, g.add_initializer("w2", test::random_tensor({8, 16, 1, 1}, 64))}, {y}, "conv2");
  g.add_output(y);
  if (o.conv_output_read_twice) {
    Value* other = g.add_value("other");
    g.add_node("Identity", {r}, {other}, "other_reader");
    g.add_output(other);
  }
  if (o.conv_output_is_graph_output) g.add_output(r);
  return m;
}

std::vector<Tensor> run_model(const Model& m, const Tensor& x, int threads) { return test::run_model(m, {{"x", x}}, threads); }

int count_op(const Model& m, const std::string& op) {
  int n = 0;
  for (const auto& node : m.graph->nodes()) n += node->op_type == op ? 1 : 0;
  return n;
}

// The pipeline up to this pass, as `mpq run` runs it.
Model fused(const Model& original) {
  Model m = original.clone();
  passes::FuseConvActivation act;
  passes::FuseQdqPair qdq;
  passes::FuseConvFakeQuant fq;
  passes::run_pass(act, m);
  passes::run_pass(qdq, m);
  passes::run_pass(fq, m);
  return m;
}

}  // namespace

TEST_CASE("fuse_conv_fake_quant moves a one-scale FakeQuant into the convolution with the same bits",
          "[passes][fuse_conv_fake_quant]") {
  const Model original = qdq_conv_model({});
  const Model m = fused(original);
  CHECK(verify(m).empty());
  CHECK(count_op(m, "FakeQuant") == 0);
  CHECK(count_op(m, "QuantizeLinear") == 0);
  // The convolution now writes the DequantizeLinear's value.
  REQUIRE(m.graph->find("dq") != nullptr);
  const Node* conv = m.graph->find("dq")->producer();
  REQUIRE(conv != nullptr);
  CHECK(passes::is_fused_conv(*conv));
  CHECK(conv->attr_string("activation", "") == "Relu");
  const std::vector<float> fq = conv->attr_floats("fake_quant", {});
  REQUIRE(fq.size() == 3);
  CHECK(fq[0] == 0.037f);
  CHECK(fq[1] == 0.0f - 7.0f);
  CHECK(fq[2] == 255.0f - 7.0f);
  const Tensor x = test::random_tensor({2, 16, 9, 7}, 65, -3.0f, 3.0f);
  for (const rt::cpu::OnednnUse use : {rt::cpu::OnednnUse::Off, rt::cpu::OnednnUse::Auto, rt::cpu::OnednnUse::Always})
    for (const int threads : {1, 2}) {
      INFO("oneDNN use " << static_cast<int>(use) << ", " << threads << " thread(s)");
      rt::cpu::ScopedOnednn scope(use);
      // QuantizeLinear and DequantizeLinear as written, the convolution chosen as in the fused run.
      const Tensor want = run_model(original, x, threads)[0];
      CHECK(same_bits(run_model(m, x, threads)[0], want));
    }
}

TEST_CASE("an activation after a fused fake quantization stays a node of its own", "[passes][fuse_conv_fake_quant]") {
  // Conv -> Q -> DQ -> Sigmoid: once the quantization is in the convolution, the Sigmoid after it
  // must not join the epilogue (it would run before the quantization).
  Options o;
  o.sigmoid_after_quant = true;
  o.relu = false;
  const Model original = qdq_conv_model(o);
  Model m = fused(original);
  passes::FuseConvActivation act;
  passes::run_pass(act, m);
  CHECK(verify(m).empty());
  CHECK(count_op(m, "Sigmoid") == 1);
  for (const auto& node : m.graph->nodes())
    if (node->has_attr("fake_quant")) CHECK_FALSE(node->has_attr("activation"));
  const Tensor x = test::random_tensor({2, 16, 9, 7}, 67, -3.0f, 3.0f);
  CHECK(same_bits(run_model(m, x, 2)[0], run_model(original, x, 2)[0]));
}

TEST_CASE("fuse_conv_fake_quant leaves guarded cases alone", "[passes][fuse_conv_fake_quant]") {
  for (int c = 0; c < 3; ++c) {
    Options o;
    o.conv_output_read_twice = c == 0;
    o.conv_output_is_graph_output = c == 1;
    o.per_channel = c == 2;
    INFO("case " << c);
    const Model original = qdq_conv_model(o);
    const Model m = fused(original);
    CHECK(verify(m).empty());
    CHECK(m.graph->find("r") != nullptr);  // the convolution's (fused Relu's) value is kept
    for (const auto& node : m.graph->nodes()) CHECK_FALSE(node->has_attr("fake_quant"));
    const Tensor x = test::random_tensor({2, 16, 9, 7}, 66, -3.0f, 3.0f);
    const std::vector<Tensor> want = run_model(original, x, 2), got = run_model(m, x, 2);
    REQUIRE(want.size() == got.size());
    for (size_t i = 0; i < want.size(); ++i) CHECK(same_bits(got[i], want[i]));
  }
}

TEST_CASE("FusedConv's fake_quant gives fake_quantize_value's bits at ties and bounds", "[conv][fake_quant]") {
  // A 1x1 convolution with the identity as weights passes X through exactly, so Y's fake
  // quantization sees chosen values: ties (k + 0.5) * s on both sides of zero, values beyond both
  // bounds, -0 and tiny negatives (which round to +0 * s).
  const int64_t C = 16;
  const float s = 0.25f, lo = -5.0f, hi = 7.0f;  // qmin - zp, qmax - zp
  Tensor w = Tensor::zeros(DType::Float32, {C, C, 1, 1});
  for (int64_t c = 0; c < C; ++c) w.data<float>()[c * C + c] = 1.0f;
  Tensor x(DType::Float32, {1, C, 4, 5});
  const int64_t S = 20;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t k = i % 40 - 20;
    float v = (static_cast<float>(k) + 0.5f) * s;  // ties
    if (i % 7 == 3) v = static_cast<float>(k) * 0.3f;
    if (i % 11 == 5) v = -0.0f;
    if (i % 13 == 6) v = -0.01f;
    if (i % 17 == 8) v = 1e6f * (k < 0 ? -1.0f : 1.0f);
    x.data<float>()[i] = v;
  }
  Tensor want(DType::Float32, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i)
    want.data<float>()[i] = rt::cpu::quant::fake_quantize_value<false>(x.data<float>()[i], s, lo, hi);
  // Spot checks of the reference itself: a tie rounds to even, the bounds clamp, -0 gives +0.
  CHECK(rt::cpu::quant::fake_quantize_value<false>(0.5f * s, s, lo, hi) == 0.0f);
  CHECK(rt::cpu::quant::fake_quantize_value<false>(1.5f * s, s, lo, hi) == 2.0f * s);
  CHECK(rt::cpu::quant::fake_quantize_value<false>(-2.5f * s, s, lo, hi) == -2.0f * s);
  CHECK(rt::cpu::quant::fake_quantize_value<false>(100.0f, s, lo, hi) == hi * s);
  CHECK(rt::cpu::quant::fake_quantize_value<false>(-100.0f, s, lo, hi) == lo * s);
  CHECK_FALSE(std::signbit(rt::cpu::quant::fake_quantize_value<false>(-0.0f, s, lo, hi)));
  (void)S;
  for (const int64_t block : {int64_t{0}, int64_t{16}, rt::cpu::kChannelsLast})
    for (const rt::cpu::OnednnUse use : {rt::cpu::OnednnUse::Off, rt::cpu::OnednnUse::Always})
      for (const int threads : {1, 2}) {
        INFO("block " << block << ", oneDNN use " << static_cast<int>(use) << ", " << threads << " thread(s)");
        rt::cpu::ScopedOnednn scope(use);
        std::vector<ir::Attribute> attrs{ir::Attribute::make_floats("fake_quant", {s, lo, hi}),
                                         ir::Attribute::make_int("x_block", block), ir::Attribute::make_int("y_block", block)};
        Tensor in = x;
        if (block != 0) {
          in = Tensor(DType::Float32, x.shape());
          rt::ThreadPool pool(1);
          rt::cpu::to_channel_blocks(pool, x.data<float>(), in.data<float>(), 1, C, S, block);
        }
        const uint64_t before = rt::cpu::onednn_conv_count();
        Tensor got = test::run_node("FusedConv", {in, w}, attrs, 1, 17, threads, "mpq")[0];
        // In the CPU's own block oneDNN has a direct kernel: the post-ops, not mpq's kernels, ran.
        if (use == rt::cpu::OnednnUse::Always && block != 0 && block == rt::cpu::onednn_channel_block())
          CHECK(rt::cpu::onednn_conv_count() == before + 1);
        if (block != 0) {
          Tensor plain(DType::Float32, got.shape());
          rt::ThreadPool pool(1);
          rt::cpu::from_channel_blocks(pool, got.data<float>(), plain.data<float>(), 1, C, S, block);
          got = plain;
        }
        CHECK(same_bits(got, want));
      }
}

TEST_CASE("FusedConv refuses a malformed fake_quant", "[conv][fake_quant][negative]") {
  const Tensor x = test::random_tensor({1, 4, 5, 5}, 71);
  const Tensor w = test::random_tensor({4, 4, 3, 3}, 72);
  auto run = [&](std::vector<float> fq) {
    return test::run_node("FusedConv", {x, w}, {ir::Attribute::make_floats("fake_quant", fq)}, 1, 17, 1, "mpq");
  };
  CHECK_THROWS_WITH(run({0.1f, -128.0f}), Catch::Contains("node_under_test") && Catch::Contains("fake_quant"));
  CHECK_THROWS_WITH(run({0.0f, -128.0f, 127.0f}), Catch::Contains("fake_quant"));
  CHECK_THROWS_WITH(run({0.1f, 5.0f, -5.0f}), Catch::Contains("fake_quant"));
  CHECK_THROWS_WITH(run({0.1f, -1.5f, 127.0f}), Catch::Contains("fake_quant"));
  CHECK_NOTHROW(run({0.1f, -128.0f, 127.0f}));
}
