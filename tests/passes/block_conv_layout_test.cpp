// block_conv_layout: tensors that flow only between 2-D float32 convolutions are marked
// channel-blocked (producer's y_block, readers' x_block / z_block), plain Convs on such edges become
// mpq::FusedConv, guarded edges (graph outputs, other readers, channel counts not a multiple of the
// block, subgraph readers) stay plain, and the model computes the same outputs on oneDNN and on
// mpq's kernels (the fallback with explicit conversions); the verifier accepts every result.
#include <catch2/catch.hpp>

#include "ir/onnx_io.h"
#include "ir/onnx_tools.h"
#include "ir/verify.h"
#include "passes/block_conv_layout.h"
#include "passes/fold_constants.h"
#include "passes/fuse_conv_bn.h"
#include "passes/fuse_conv_activation.h"
#include "runtime/cpu/channel_blocks.h"
#include "runtime/cpu/conv_onednn.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;

namespace {

Node* add_conv(Graph& g, Value* x, int64_t c, int64_t m, int64_t k, const std::string& name, uint32_t seed) {
  Value* w = g.add_initializer(name + "_w", test::random_tensor({m, c, k, k}, seed, -0.5f, 0.5f));
  Value* b = g.add_initializer(name + "_b", test::random_tensor({m}, seed + 1));
  Value* y = g.add_value(name + "_y");
  Node* n = g.add_node("Conv", {x, w, b}, {y}, name);
  const int64_t p = k / 2;
  n->set_attr(Attribute::make_ints("pads", {p, p, p, p}));
  return n;
}

Value* add_relu(Graph& g, Value* x, const std::string& name) {
  Value* y = g.add_value(name);
  g.add_node("Relu", {x}, {y}, name + "_relu");
  return y;
}

// x[2,3,10,10] -> a (3->16) relu -> r1 -> b (16->16) + r1, relu -> r2 -> c (16->24, 1x1) -> r3
//   -> d (24->12) -> r4 -> GlobalAveragePool -> y; r2 also feeds e (16->8) -> GlobalAveragePool -> y2.
// With `tap`, r3 is also read by a Relu that is a graph output.
Model chain_model(bool tap) {
  Model m;
  m.set_opset("", 17);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2, 3, 10, 10}));
  g.add_input(x);
  Value* r1 = add_relu(g, add_conv(g, x, 3, 16, 3, "a", 1)->output(0), "r1");
  Value* b = add_conv(g, r1, 16, 16, 3, "b", 3)->output(0);
  Value* sum = g.add_value("sum");
  g.add_node("Add", {b, r1}, {sum}, "add");
  Value* r2 = add_relu(g, sum, "r2");
  Value* r3 = add_conv(g, r2, 16, 24, 1, "c", 5)->output(0);
  Value* r4 = add_conv(g, r3, 24, 12, 3, "d", 7)->output(0);
  Value* y = g.add_value("y");
  g.add_node("GlobalAveragePool", {r4}, {y}, "gap");
  g.add_output(y);
  Value* e = add_conv(g, r2, 16, 8, 3, "e", 9)->output(0);
  Value* y2 = g.add_value("y2");
  g.add_node("GlobalAveragePool", {e}, {y2}, "gap2");
  g.add_output(y2);
  if (tap) g.add_output(add_relu(g, r3, "tap"));
  return m;
}

const Node& node_named(const Model& m, const std::string& name) {
  for (const auto& n : m.graph->nodes())
    if (n->name == name) return *n;
  FAIL("no node " << name);
  throw;
}

struct Blocks {
  int64_t x, z, y;
};
Blocks blocks_of(const Model& m, const std::string& name) {
  const Node& n = node_named(m, name);
  return {n.attr_int("x_block", 0), n.attr_int("z_block", 0), n.attr_int("y_block", 0)};
}

rt::Feeds feeds() { return {{"x", test::random_tensor({2, 3, 10, 10}, 42, -2.0f, 2.0f)}}; }

// The model's outputs before and after the passes agree, with oneDNN and with mpq's kernels.
void check_same_outputs(const Model& before, const Model& after) {
  const auto want = test::run_model(before, feeds());
  for (const auto use : {rt::cpu::OnednnUse::Auto, rt::cpu::OnednnUse::Off}) {
    rt::cpu::ScopedOnednn scope(use);
    const auto got = test::run_model(after, feeds());
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(test::rel_l2(got[i], want[i]) < 1e-5);
  }
}

Model fused_and_blocked(Model m, int64_t block, passes::PassStats* stats = nullptr, bool channels_last = false) {
  infer_shapes(m);  // as `mpq run` does: the residual Add fuses only between known, equal shapes
  passes::FuseConvActivation fuse;
  passes::run_pass(fuse, m);
  passes::BlockConvLayout pass(block, channels_last);
  passes::PassStats s = passes::run_pass(pass, m);
  REQUIRE(verify(m).empty());
  if (stats) *stats = s;
  return m;
}

}  // namespace

TEST_CASE("block_conv_layout keeps convolution-to-convolution tensors blocked", "[passes][blocked]") {
  const Model plain = chain_model(false);
  passes::PassStats stats;
  const Model m = fused_and_blocked(chain_model(false), 8, &stats);
  CHECK(stats.changed == 4);  // r1, r2, r3 and e's output, which only a global pool reads
  const Blocks a = blocks_of(m, "a"), b = blocks_of(m, "b"), c = blocks_of(m, "c"), d = blocks_of(m, "d"),
               e = blocks_of(m, "e");
  CHECK((a.x == 0 && a.z == 0 && a.y == 8));
  CHECK((b.x == 8 && b.z == 8 && b.y == 8));  // r1 is both its input and its residual
  CHECK((c.x == 8 && c.y == 8));
  CHECK((d.x == 8 && d.y == 0));  // 12 output channels, read by a pooling: plain
  CHECK((e.x == 8 && e.y == 8));  // 8 channels: the pool reads them blocked
  CHECK(node_named(m, "gap").domain.empty());
  CHECK((node_named(m, "gap2").domain == "mpq" && node_named(m, "gap2").attr_int("x_block", 0) == 8));
  // c had no activation: it became a FusedConv to carry the layout.
  CHECK(node_named(m, "c").op_type == "FusedConv");
  CHECK(node_named(m, "c").domain == "mpq");
  CHECK(test::count_ops(m, "Conv") == 0);
  check_same_outputs(plain, m);
}

TEST_CASE("block_conv_layout with 16-channel blocks skips 24-channel tensors", "[passes][blocked]") {
  const Model m = fused_and_blocked(chain_model(false), 16);
  CHECK(blocks_of(m, "a").y == 16);
  CHECK(blocks_of(m, "b").y == 16);
  CHECK(blocks_of(m, "c").x == 16);
  CHECK(blocks_of(m, "c").y == 0);  // r3 has 24 channels
  CHECK(blocks_of(m, "d").x == 0);
  check_same_outputs(chain_model(false), m);
}

TEST_CASE("block_conv_layout with channels-last keeps a chain with a 24-channel tensor NHWC as a whole",
          "[passes][blocked]") {
  // a -> r1 -> b (r1 also as b's residual) -> r2 -> c (16 -> 24) -> r3 -> d, and r2 -> e: every kept
  // edge meets another at a convolution, so one group; r3's 24 channels make it channels-last.
  const int64_t last = rt::cpu::kChannelsLast;
  passes::PassStats stats;
  const Model m = fused_and_blocked(chain_model(false), 16, &stats, /*channels_last=*/true);
  CHECK(stats.changed == 5);  // r1, r2 and r3, and d's and e's outputs, which only global pools read
  for (const char* name : {"a", "b", "c"}) CHECK(blocks_of(m, name).y == last);
  for (const char* name : {"b", "c", "d", "e"}) CHECK(blocks_of(m, name).x == last);
  CHECK(blocks_of(m, "b").z == last);
  CHECK(blocks_of(m, "d").y == last);  // read by GlobalAveragePool, in the group's layout
  CHECK(blocks_of(m, "e").y == last);
  for (const char* name : {"gap", "gap2"}) CHECK(node_named(m, name).attr_int("x_block", 0) == last);
  check_same_outputs(chain_model(false), m);

  // Where every count is a multiple of the block, the option changes nothing: d's 12 channels, read
  // only by a pool, neither fit 8-channel blocks nor make the chain channels-last; they stay plain.
  const Model eight = fused_and_blocked(chain_model(false), 8, nullptr, true);
  for (const char* name : {"a", "b", "c", "e"}) CHECK(blocks_of(eight, name).y == 8);
  CHECK(blocks_of(eight, "d").x == 8);
  CHECK(blocks_of(eight, "d").y == 0);
  CHECK(node_named(eight, "gap").domain.empty());
  check_same_outputs(chain_model(false), eight);

  // Two groups: a tensor that a MaxPool reads splits the chain, and each group decides for itself.
  auto split = [] {
    Model sm;
    sm.set_opset("", 17);
    Graph& g = *sm.graph;
    Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2, 3, 10, 10}));
    g.add_input(x);
    Value* r1 = add_relu(g, add_conv(g, x, 3, 16, 3, "a", 11)->output(0), "r1");
    Value* r2 = add_relu(g, add_conv(g, r1, 16, 32, 3, "b", 13)->output(0), "r2");  // 16-blocked group a, b
    Value* p = g.add_value("p");
    g.add_node("MaxPool", {r2}, {p}, "pool")->set_attr(Attribute::make_ints("kernel_shape", {2, 2}));
    Value* r3 = add_relu(g, add_conv(g, p, 32, 24, 1, "c", 15)->output(0), "r3");  // channels-last group c, d
    Value* y = add_conv(g, r3, 24, 8, 3, "d", 17)->output(0);
    g.add_output(y);
    return sm;
  };
  const Model two = fused_and_blocked(split(), 16, nullptr, true);
  CHECK(blocks_of(two, "a").y == 16);
  CHECK(blocks_of(two, "b").x == 16);
  CHECK(blocks_of(two, "b").y == 0);  // read by MaxPool
  CHECK(blocks_of(two, "c").y == last);
  CHECK(blocks_of(two, "d").x == last);
  const rt::Feeds f{{"x", test::random_tensor({2, 3, 10, 10}, 43, -2.0f, 2.0f)}};
  const auto want = test::run_model(split(), f);
  for (const auto use : {rt::cpu::OnednnUse::Auto, rt::cpu::OnednnUse::Off}) {
    rt::cpu::ScopedOnednn scope(use);
    const auto got = test::run_model(two, f);
    REQUIRE(got.size() == want.size());
    CHECK(test::rel_l2(got[0], want[0]) < 1e-5);
  }
}

TEST_CASE("block_conv_layout leaves tensors other ops or the caller read", "[passes][blocked]") {
  const Model m = fused_and_blocked(chain_model(true), 8);
  CHECK(blocks_of(m, "c").y == 0);  // r3 is also read by the tap Relu
  CHECK(blocks_of(m, "d").x == 0);
  CHECK(blocks_of(m, "b").y == 8);  // the rest of the chain is unaffected
  check_same_outputs(chain_model(true), m);

  // A graph output is never blocked, even when only convolutions read it otherwise.
  auto with_r3_output = [] {
    Model m = chain_model(false);
    for (Value* v : m.graph->values())
      if (v->name() == "c_y") m.graph->add_output(v);
    return m;
  };
  const Model out = fused_and_blocked(with_r3_output(), 8);
  CHECK(blocks_of(out, "c").y == 0);
  CHECK(blocks_of(out, "d").x == 0);
  CHECK(blocks_of(out, "b").y == 8);
  check_same_outputs(with_r3_output(), out);
}

TEST_CASE("block_conv_layout rejects a block size the kernels do not know", "[passes][blocked][negative]") {
  Model m = chain_model(false);
  passes::BlockConvLayout pass(4);
  CHECK_THROWS_WITH(passes::run_pass(pass, m), Catch::Contains("block 4"));
}

TEST_CASE("block_conv_layout on the shipped CNNs blocks their convolution chains, same outputs",
          "[passes][blocked][models]") {
  // The pipeline `mpq run` uses (shapes, folding, BatchNorm and activation fusion, blocking),
  // independent of whether oneDNN is built in: the pass itself only looks at the graph.
  for (const auto& [name, at_least] : std::vector<std::pair<std::string, int>>{{"resnet_bn_op17", 6},
                                                                                {"mobilenetv3_op17", 4}})
  for (const bool channels_last : {false, true}) {
    INFO(name << (channels_last ? " with channels-last at 16-channel blocks" : " at 8-channel blocks"));
    const int64_t want_block = channels_last ? 16 : 8;
    const auto path = test::source_dir() / "tests" / "models" / (name + ".onnx");
    const Model plain = load_model(path.string());
    Model m = load_model(path.string());
    infer_shapes(m);
    passes::FoldConstants fold;
    passes::FuseConvBn fuse_bn(true);
    passes::FuseConvActivation fuse;
    passes::BlockConvLayout block(want_block, channels_last);
    for (passes::Pass* p : std::vector<passes::Pass*>{&fold, &fuse_bn, &fuse}) passes::run_pass(*p, m);
    const passes::PassStats s = passes::run_pass(block, m);
    REQUIRE(verify(m).empty());
    CHECK(s.changed >= at_least);
    int blocked_outputs = 0, nhwc_outputs = 0;
    for (const auto& n : m.graph->nodes()) {
      blocked_outputs += n->attr_int("y_block", 0) == want_block ? 1 : 0;
      nhwc_outputs += n->attr_int("y_block", 0) == rt::cpu::kChannelsLast ? 1 : 0;
    }
    CHECK(blocked_outputs + nhwc_outputs == s.changed);
    // MobileNetV3's 24-, 72- and 120-channel chains are what channels-last is for; ResNet's counts
    // are all multiples of 16.
    if (!channels_last || name == "resnet_bn_op17") CHECK(nhwc_outputs == 0);
    else CHECK(nhwc_outputs > 0);
    const Value* in = m.graph->inputs()[0];
    Shape shape;
    for (const auto& d : in->type.dims) shape.push_back(d.known() ? d.value : 2);
    const rt::Feeds f{{in->name(), test::random_tensor(shape, 5, -1.0f, 1.0f)}};
    const auto want = test::run_model(plain, f);
    for (const auto use : {rt::cpu::OnednnUse::Auto, rt::cpu::OnednnUse::Off}) {
      rt::cpu::ScopedOnednn scope(use);
      const auto got = test::run_model(m, f);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) CHECK(test::rel_l2(got[i], want[i]) < 1e-5);
    }
  }
}

TEST_CASE("block_conv_layout leaves a tensor a subgraph reads from the outer scope", "[passes][blocked]") {
  // x -> a (3->16) -> r1 -> b (16->16) -> y, and an If whose branches read r1 from the outer scope:
  // r1 must stay plain (the branch's nodes see NCHW); b's output, read only by the graph output,
  // is plain anyway.
  auto build = [] {
    Model m;
    m.set_opset("", 17);
    Graph* g = m.graph.get();
    Value* x = g->add_value("x", ValueType::tensor(DType::Float32, Shape{1, 3, 6, 6}));
    g->add_input(x);
    Value* cond = g->add_value("cond", ValueType::tensor(DType::Bool, Shape{}));
    g->add_input(cond);
    Value* r1 = add_conv(*g, x, 3, 16, 3, "a", 31)->output(0);
    Value* y = add_conv(*g, r1, 16, 16, 3, "b", 33)->output(0);
    g->add_output(y);
    auto then_g = std::make_shared<Graph>("then", g);
    Value* t = then_g->add_value("t_out");
    then_g->add_node("Relu", {then_g->add_outer_scope_value("a_y")}, {t}, "t_relu");
    then_g->add_output(t);
    auto else_g = std::make_shared<Graph>("else", g);
    Value* e = else_g->add_value("e_out");
    else_g->add_node("Neg", {else_g->add_outer_scope_value("a_y")}, {e}, "e_neg");
    else_g->add_output(e);
    Value* out = g->add_value("branch");
    Node* n = g->add_node("If", {cond}, {out}, "if");
    n->set_attr(Attribute::make_graph("then_branch", then_g));
    n->set_attr(Attribute::make_graph("else_branch", else_g));
    g->add_output(out);
    return m;
  };
  Model m = build();
  passes::BlockConvLayout pass(8);
  const passes::PassStats s = passes::run_pass(pass, m);
  REQUIRE(verify(m).empty());
  CHECK(s.changed == 0);
  CHECK(blocks_of(m, "a").y == 0);
  CHECK(blocks_of(m, "b").x == 0);
  const rt::Feeds f{{"x", test::random_tensor({1, 3, 6, 6}, 35)}, {"cond", Tensor::from<bool>({}, {true})}};
  const auto want = test::run_model(build(), f);
  const auto got = test::run_model(m, f);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(test::rel_l2(got[i], want[i]) < 1e-6);
}

namespace {

// A squeeze-and-excitation block: x[2,3,9,9] -> a (3 -> C) relu -> r1 -> GlobalAveragePool -> fc1
// (C -> 8, 1x1) relu -> fc2 (8 -> C, 1x1) HardSigmoid -> s; Mul(r1, s) (or Mul(s, r1)) -> u -> b
// (C -> 16) -> y. With `full_scale`, the Mul's other input is a [2, C, 9, 9] tensor instead (not a
// per-channel scale).
Model se_model(int64_t c, bool scale_first, bool full_scale) {
  Model m;
  m.set_opset("", 17);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2, 3, 9, 9}));
  g.add_input(x);
  Value* r1 = add_relu(g, add_conv(g, x, 3, c, 3, "a", 21)->output(0), "r1");
  Value* pooled = g.add_value("pooled");
  g.add_node("GlobalAveragePool", {r1}, {pooled}, "gap");
  Value* h = add_relu(g, add_conv(g, pooled, c, 8, 1, "fc1", 23)->output(0), "h");
  Value* s = g.add_value("s");
  g.add_node("HardSigmoid", {add_conv(g, h, 8, c, 1, "fc2", 25)->output(0)}, {s}, "gate");
  Value* other = s;
  if (full_scale) {
    other = g.add_value("other", ValueType::tensor(DType::Float32, Shape{2, c, 9, 9}));
    g.add_input(other);
  }
  Value* u = g.add_value("u");
  g.add_node("Mul", scale_first ? std::vector<Value*>{other, r1} : std::vector<Value*>{r1, other}, {u}, "scale");
  Value* y = add_conv(g, u, c, 16, 3, "b", 27)->output(0);
  g.add_output(y);
  g.add_output(pooled);  // the pool's output is plain [2, C, 1, 1] in any layout: a graph output may read it
  return m;
}

}  // namespace

TEST_CASE("block_conv_layout keeps a squeeze-and-excitation block's tensor in the convolutions' layout",
          "[passes][blocked]") {
  const int64_t last = rt::cpu::kChannelsLast;
  for (const int64_t c : {int64_t{16}, int64_t{24}})
    for (const bool scale_first : {false, true}) {
      INFO(c << " channels" << (scale_first ? ", the scale first" : ""));
      const int64_t want = c == 16 ? 16 : last;  // 24 channels: channels-last
      const Model m = fused_and_blocked(se_model(c, scale_first, false), 16, nullptr, /*channels_last=*/true);
      CHECK(blocks_of(m, "a").y == want);
      CHECK(blocks_of(m, "b").x == want);
      CHECK(blocks_of(m, "fc1").x == 0);  // the pool's [N, C, 1, 1] output is plain
      const Node& gap = node_named(m, "gap");
      CHECK((gap.domain == "mpq" && gap.op_type == "GlobalAveragePool" && gap.attr_int("x_block", 0) == want));
      const Node& scale = node_named(m, "scale");
      CHECK((scale.domain == "mpq" && scale.op_type == "ScaleChannels" && scale.attr_int("x_block", 0) == want));
      CHECK(scale.input(0)->name() == "r1");  // X first, whichever side it was on
      CHECK(scale.input(1)->name() == "s");
      const rt::Feeds f{{"x", test::random_tensor({2, 3, 9, 9}, 44, -2.0f, 2.0f)}};
      const auto want_out = test::run_model(se_model(c, scale_first, false), f);
      for (const auto use : {rt::cpu::OnednnUse::Auto, rt::cpu::OnednnUse::Off}) {
        rt::cpu::ScopedOnednn scope(use);
        const auto got = test::run_model(m, f);
        REQUIRE(got.size() == want_out.size());
        for (size_t i = 0; i < got.size(); ++i) CHECK(test::rel_l2(got[i], want_out[i]) < 1e-5);
      }
    }
  // Without channels-last, 24 channels stay plain, the block with them; at 8-channel blocks 16 do not.
  const Model plain24 = fused_and_blocked(se_model(24, false, false), 16);
  CHECK(blocks_of(plain24, "a").y == 0);
  CHECK(node_named(plain24, "gap").domain.empty());
  CHECK(node_named(plain24, "scale").op_type == "Mul");
  const Model eight = fused_and_blocked(se_model(16, false, false), 8);
  CHECK(blocks_of(eight, "a").y == 8);
  CHECK(node_named(eight, "scale").attr_int("x_block", 0) == 8);
  // A Mul by a full tensor is not a per-channel scale: r1 stays plain, the Mul a Mul.
  const Model full = fused_and_blocked(se_model(16, false, true), 16, nullptr, true);
  CHECK(blocks_of(full, "a").y == 0);
  CHECK(node_named(full, "scale").op_type == "Mul");
  CHECK(node_named(full, "gap").domain.empty());
}
