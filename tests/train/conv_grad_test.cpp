// Backward of Conv and ConvTranspose (train/grads/conv_grad.cpp, conv_grad_depthwise.cpp) against
// float64 central finite differences: 1-D, 2-D and 3-D windows, groups, depthwise with a channel
// multiplier, strides, dilations, asymmetric and automatic padding, pointwise kernels, with and
// without bias, ConvTranspose's output_padding and output_shape; shapes large enough to split the
// images into several GEMM chunks and one image into row tiles; bit-identical gradients on 1 and 3
// threads; weights given as constants get no gradient; dX through oneDNN's backward-data kernel
// (forced on for every shape it takes) checked the same way.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/cpu/conv_onednn.h"
#include "test_util.h"
#include "train/autograd.h"
#include "train/grad_check.h"

using namespace mpq;
using ir::Attribute;

namespace {

using Attrs = std::vector<Attribute>;

struct ConvCase {
  std::string name;
  Shape x, w;
  bool bias;
  Attrs attrs;
};

// Output channels of a Conv weight / ConvTranspose weight times the group.
int64_t out_channels(const std::string& op, const ConvCase& c) {
  if (op == "Conv") return c.w[0];
  int64_t group = 1;
  for (const Attribute& a : c.attrs)
    if (a.name == "group") group = a.i;
  return c.w[1] * group;
}

void check_case(const std::string& op, const ConvCase& c, uint32_t seed, test::GradCheckOptions o = {}) {
  INFO(op << " case " << c.name << " seed " << seed);
  std::vector<Tensor> inputs = {test::random_tensor(c.x, seed), test::random_tensor(c.w, seed + 1)};
  if (c.bias) inputs.push_back(test::random_tensor({out_channels(op, c)}, seed + 2));
  o.seed = seed;
  // Y is linear in each input on its own, so the central difference is exact up to rounding at any
  // step; a large one keeps the rounding of the loss (a sum over every output) out of it.
  o.eps = 1e-3;
  test::check_gradients(op, inputs, c.attrs, o);
}

const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cases = {
      {"3x3 pad 1", {3, 13, 9, 7}, {5, 13, 3, 3}, true, {Attribute::make_ints("pads", {1, 1, 1, 1})}},
      {"stride 2, dilation 2, asymmetric pads",
       {3, 4, 9, 7},
       {6, 4, 3, 2},
       true,
       {Attribute::make_ints("strides", {2, 2}), Attribute::make_ints("dilations", {2, 1}),
        Attribute::make_ints("pads", {1, 0, 2, 1})}},
      {"stride 3 columns, no bias", {2, 3, 8, 10}, {4, 3, 2, 3}, false, {Attribute::make_ints("strides", {1, 3})}},
      {"groups 3", {3, 6, 9, 7}, {9, 2, 3, 3}, true,
       {Attribute::make_int("group", 3), Attribute::make_ints("pads", {0, 1, 1, 0})}},
      {"depthwise", {3, 5, 9, 7}, {5, 1, 3, 3}, true,
       {Attribute::make_int("group", 5), Attribute::make_ints("pads", {1, 1, 1, 1})}},
      {"depthwise multiplier 2, stride 2, dilation 2",
       {3, 5, 9, 7},
       {10, 1, 3, 2},
       true,
       {Attribute::make_int("group", 5), Attribute::make_ints("strides", {2, 2}), Attribute::make_ints("dilations", {2, 2}),
        Attribute::make_ints("pads", {2, 0, 1, 3})}},
      {"depthwise stride 3, window past the input", {2, 3, 8, 11}, {3, 1, 2, 2}, false,
       {Attribute::make_int("group", 3), Attribute::make_ints("strides", {3, 3})}},
      {"SAME_UPPER stride 2", {2, 3, 9, 7}, {4, 3, 3, 3}, true,
       {Attribute::make_string("auto_pad", "SAME_UPPER"), Attribute::make_ints("strides", {2, 2})}},
      {"SAME_LOWER stride 2", {2, 3, 9, 8}, {4, 3, 2, 3}, true,
       {Attribute::make_string("auto_pad", "SAME_LOWER"), Attribute::make_ints("strides", {2, 2})}},
      {"VALID", {2, 3, 9, 7}, {4, 3, 3, 3}, true, {Attribute::make_string("auto_pad", "VALID")}},
      {"pointwise", {3, 13, 9, 7}, {6, 13, 1, 1}, true, {}},
      {"pointwise groups", {3, 6, 5, 7}, {4, 3, 1, 1}, true, {Attribute::make_int("group", 2)}},
      {"1x1 stride 2", {3, 4, 9, 7}, {5, 4, 1, 1}, true, {Attribute::make_ints("strides", {2, 2})}},
      {"1-D groups stride 2", {3, 4, 11}, {6, 2, 3}, true,
       {Attribute::make_int("group", 2), Attribute::make_ints("strides", {2}), Attribute::make_ints("pads", {1, 2})}},
      {"1-D depthwise dilation 2", {3, 4, 13}, {8, 1, 3}, true,
       {Attribute::make_int("group", 4), Attribute::make_ints("dilations", {2}), Attribute::make_ints("pads", {2, 1})}},
      {"3-D", {2, 3, 5, 4, 6}, {4, 3, 2, 3, 2}, true,
       {Attribute::make_ints("strides", {2, 1, 2}), Attribute::make_ints("pads", {1, 0, 1, 0, 1, 1})}},
      {"3-D, fewer outputs than inputs", {2, 5, 4, 3, 5}, {2, 5, 2, 2, 3}, true,
       {Attribute::make_ints("dilations", {1, 2, 1}), Attribute::make_ints("pads", {1, 1, 0, 0, 1, 2})}},
      {"3-D depthwise", {2, 3, 4, 5, 4}, {3, 1, 2, 2, 3}, true,
       {Attribute::make_int("group", 3), Attribute::make_ints("pads", {0, 1, 1, 1, 0, 1})}},
  };
  return cases;
}

const std::vector<ConvCase>& conv_transpose_cases() {
  static const std::vector<ConvCase> cases = {
      {"3x3 pad 1", {3, 13, 5, 4}, {13, 4, 3, 3}, true, {Attribute::make_ints("pads", {1, 1, 1, 1})}},
      {"stride 2, output_padding, asymmetric pads",
       {3, 4, 5, 4},
       {4, 3, 3, 2},
       true,
       {Attribute::make_ints("strides", {2, 3}), Attribute::make_ints("output_padding", {1, 2}),
        Attribute::make_ints("pads", {1, 0, 0, 2})}},
      {"dilation 2, no bias", {2, 3, 4, 5}, {3, 2, 2, 3}, false, {Attribute::make_ints("dilations", {2, 2})}},
      {"groups 2", {3, 6, 4, 5}, {6, 2, 3, 3}, true,
       {Attribute::make_int("group", 2), Attribute::make_ints("strides", {2, 2}), Attribute::make_ints("pads", {1, 1, 0, 0})}},
      {"depthwise", {2, 4, 5, 4}, {4, 1, 3, 3}, true, {Attribute::make_int("group", 4), Attribute::make_ints("strides", {2, 2})}},
      {"output_shape", {2, 3, 4, 3}, {3, 2, 3, 3}, true,
       {Attribute::make_ints("strides", {2, 2}), Attribute::make_ints("output_shape", {10, 8})}},
      {"SAME_UPPER", {2, 3, 4, 3}, {3, 2, 3, 2}, true,
       {Attribute::make_string("auto_pad", "SAME_UPPER"), Attribute::make_ints("strides", {2, 2})}},
      {"SAME_LOWER", {2, 3, 4, 3}, {3, 2, 2, 3}, true,
       {Attribute::make_string("auto_pad", "SAME_LOWER"), Attribute::make_ints("strides", {2, 2})}},
      {"pointwise", {3, 5, 4, 3}, {5, 7, 1, 1}, true, {}},
      {"1-D", {3, 4, 7}, {4, 3, 3}, true, {Attribute::make_ints("strides", {2}), Attribute::make_ints("pads", {1, 0})}},
      {"3-D", {2, 3, 3, 4, 2}, {3, 2, 2, 2, 3}, true,
       {Attribute::make_ints("strides", {2, 1, 2}), Attribute::make_ints("pads", {0, 1, 1, 1, 0, 0})}},
  };
  return cases;
}

}  // namespace

TEST_CASE("Conv backward", "[train][grad]") {
  uint32_t seed = 100;
  for (const ConvCase& c : conv_cases()) {
    check_case("Conv", c, seed);
    seed += 10;
  }
}

TEST_CASE("Conv backward on other seeds", "[train][grad]") {
  for (uint32_t seed : {3u, 77u}) {
    check_case("Conv", conv_cases()[1], seed);
    check_case("Conv", conv_cases()[5], seed);
    check_case("Conv", conv_cases()[13], seed);
  }
}

TEST_CASE("ConvTranspose backward", "[train][grad]") {
  uint32_t seed = 300;
  for (const ConvCase& c : conv_transpose_cases()) {
    check_case("ConvTranspose", c, seed);
    seed += 10;
  }
}

TEST_CASE("Conv backward over several image pieces and row tiles", "[train][grad]") {
  // conv_grad.cpp cuts the work into pieces whose float64 column matrix (channels x taps rows,
  // one per output position) fits 1 MiB: several small images side by side, or row tiles of one
  // large image, whose col2im additions overlap in dX when strided.
  test::GradCheckOptions o;
  o.max_elements = 24;
  // 72 x 12 per output row: 15 images a piece, then 5, in two dW slices.
  check_case("Conv", {"pieces of images", {20, 8, 10, 10}, {6, 8, 3, 3}, true, {Attribute::make_ints("pads", {1, 1, 1, 1})}},
             500, o);
  // 144 x 48 per output row: tiles of 19 rows.
  check_case("Conv", {"tiles", {1, 16, 48, 48}, {3, 16, 3, 3}, true, {Attribute::make_ints("pads", {1, 0, 1, 0})}}, 510, o);
  // 216 x 31 per output row, 30 rows: two tiles whose windows share input rows.
  check_case("Conv",
             {"strided tiles", {1, 24, 60, 60}, {3, 24, 3, 3}, false,
              {Attribute::make_ints("strides", {2, 2}), Attribute::make_ints("pads", {1, 1, 1, 1})}},
             515, o);
  // dY's windows at X's 24 rows, 432 x 25 per row: two tiles.
  check_case("ConvTranspose",
             {"tiles", {1, 3, 24, 24}, {3, 48, 3, 3}, true, {Attribute::make_ints("strides", {2, 2})}}, 520, o);
}

TEST_CASE("Conv backward: a constant weight gets no gradient, the bias and input still do", "[train][grad]") {
  // wrt lists the graph inputs; W (input 1) is an initializer, and the harness checks that the
  // engine asks for no gradient of it.
  test::GradCheckOptions o;
  o.wrt = {0, 2};
  test::check_gradients("Conv", {test::random_tensor({2, 3, 7, 6}, 1), test::random_tensor({4, 3, 3, 3}, 2),
                                 test::random_tensor({4}, 3)},
                        {Attribute::make_ints("pads", {1, 1, 1, 1})}, o);
  o.wrt = {1};
  test::check_gradients("Conv", {test::random_tensor({2, 4, 7, 6}, 4), test::random_tensor({4, 1, 3, 3}, 5)},
                        {Attribute::make_int("group", 4)}, o);
}

TEST_CASE("Conv and ConvTranspose gradients are bit-identical on 1 and 3 threads", "[train][grad]") {
  struct Run {
    std::string op;
    ConvCase c;
  };
  const std::vector<Run> runs = {
      {"Conv", {"N=64 32->64 3x3 14x14", {64, 32, 14, 14}, {64, 32, 3, 3}, true, {Attribute::make_ints("pads", {1, 1, 1, 1})}}},
      {"Conv", {"depthwise 28x28", {16, 32, 28, 28}, {32, 1, 3, 3}, true,
                {Attribute::make_int("group", 32), Attribute::make_ints("pads", {1, 1, 1, 1})}}},
      {"Conv", {"pointwise", {32, 32, 14, 14}, {48, 32, 1, 1}, true, {}}},
      {"Conv", {"groups 16", {16, 32, 14, 14}, {32, 2, 3, 3}, true, {Attribute::make_int("group", 16)}}},
      {"Conv", {"stride 2", {16, 32, 14, 14}, {32, 32, 3, 3}, true,
                {Attribute::make_ints("strides", {2, 2}), Attribute::make_ints("pads", {1, 1, 1, 1})}}},
      {"Conv", {"row tiles", {2, 16, 150, 150}, {8, 16, 3, 3}, false, {}}},
      {"ConvTranspose", {"stride 2", {32, 16, 7, 7}, {16, 8, 3, 3}, true, {Attribute::make_ints("strides", {2, 2})}}},
  };
  for (const Run& r : runs) {
    INFO(r.op << " " << r.c.name);
    std::vector<Tensor> inputs = {test::random_tensor(r.c.x, 11), test::random_tensor(r.c.w, 12)};
    if (r.c.bias) inputs.push_back(test::random_tensor({out_channels(r.op, r.c)}, 13));
    test::GradCheckOptions o;
    o.threads = 1;
    const std::vector<Tensor> one = test::node_gradients(r.op, inputs, r.c.attrs, o);
    o.threads = 3;
    const std::vector<Tensor> three = test::node_gradients(r.op, inputs, r.c.attrs, o);
    for (size_t i = 0; i < inputs.size(); ++i) {
      INFO("input " << i);
      REQUIRE(one[i].defined());
      REQUIRE(one[i].dtype() == DType::Float32);
      CHECK(test::max_abs_diff(one[i], three[i]) == 0.0);
    }
  }
}

TEST_CASE("Conv backward over four spatial dimensions is reported as unsupported, naming the node", "[train][grad]") {
  const std::vector<Tensor> inputs = {test::random_tensor({1, 2, 3, 3, 3, 3}, 1), test::random_tensor({2, 2, 2, 2, 2, 2}, 2)};
  test::GradCheckOptions o;
  REQUIRE_THROWS_WITH(test::node_gradients("Conv", inputs, {}, o),
                      Catch::Contains("node_under_test") && Catch::Contains("backward") &&
                          Catch::Contains("spatial dimensions"));
}

TEST_CASE("Conv dX and dW through oneDNN: finite differences, and bit-identical on 1 and 3 threads", "[train][grad][onednn]") {
  // Forced on (small shapes and training included) for shapes with its direct kernels: channel
  // counts that are multiples of its 8-float block, strides, dilations, asymmetric pads, groups, 1-D.
  rt::cpu::ScopedOnednn always(rt::cpu::OnednnUse::Always);
  const uint64_t before = rt::cpu::onednn_conv_count();
  const std::vector<ConvCase> cases = {
      {"8->16 3x3 pad 1", {2, 8, 9, 7}, {16, 8, 3, 3}, true, {Attribute::make_ints("pads", {1, 1, 1, 1})}},
      {"16->8 stride 2, dilation 2, asymmetric pads",
       {2, 16, 11, 9},
       {8, 16, 3, 2},
       false,
       {Attribute::make_ints("strides", {2, 2}), Attribute::make_ints("dilations", {2, 1}),
        Attribute::make_ints("pads", {1, 0, 2, 1})}},
      {"groups 2", {1, 16, 7, 7}, {16, 8, 3, 3}, true,
       {Attribute::make_int("group", 2), Attribute::make_ints("pads", {1, 1, 1, 1})}},
      {"1-D", {2, 8, 13}, {8, 8, 5}, true, {Attribute::make_ints("pads", {2, 1})}},
  };
  // How many of the forward, dX and dW went through oneDNN: oneDNN 2.6 has direct backward kernels
  // for every case but the strided and dilated one (mpq's kernels run its dX and dW).
  const std::vector<uint64_t> onednn_passes = {3, 1, 3, 3};
  uint32_t seed = 700;
  for (size_t i = 0; i < cases.size(); ++i) {
    const ConvCase& c = cases[i];
    const uint64_t runs = rt::cpu::onednn_conv_count();
    test::GradCheckOptions o;
    o.wrt = {0, 1};
    check_case("Conv", c, seed++, o);
    INFO(c.name);
    if (rt::cpu::onednn_available()) CHECK(rt::cpu::onednn_conv_count() >= runs + onednn_passes[i]);
  }
  // 19 images: dW in blocks of 8, 8 and 3 (kImagesPerWeightBlock), added in block order.
  const ConvCase big{"N=19 32->64 3x3 14x14", {19, 32, 14, 14}, {64, 32, 3, 3}, true,
                     {Attribute::make_ints("pads", {1, 1, 1, 1})}};
  std::vector<Tensor> inputs = {test::random_tensor(big.x, 11), test::random_tensor(big.w, 12),
                                test::random_tensor({64}, 13)};
  test::GradCheckOptions o;
  o.threads = 1;
  const uint64_t before_big = rt::cpu::onednn_conv_count();
  const std::vector<Tensor> one = test::node_gradients("Conv", inputs, big.attrs, o);
  o.threads = 3;
  const std::vector<Tensor> three = test::node_gradients("Conv", inputs, big.attrs, o);
  // Forward, dX and dW through oneDNN in both runs: no quiet fall-back to mpq's kernels.
  if (rt::cpu::onednn_available()) CHECK(rt::cpu::onednn_conv_count() == before_big + 6);
  // mpq's own kernels (im2col and GEMMs) as the reference for the blocks' sum.
  std::vector<Tensor> reference;
  {
    rt::cpu::ScopedOnednn off(rt::cpu::OnednnUse::Off);
    o.threads = 1;
    reference = test::node_gradients("Conv", inputs, big.attrs, o);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    INFO("input " << i);
    CHECK(test::max_abs_diff(one[i], three[i]) == 0.0);
    CHECK(test::rel_l2(one[i], reference[i]) < 1e-6);
  }
  // oneDNN really ran where it is built in (forward and backward data).
  if (rt::cpu::onednn_available()) CHECK(rt::cpu::onednn_conv_count() > before + 8);
}

TEST_CASE("Training uses oneDNN's convolutions in FP32 by default and mpq's under mixed precision", "[train][grad][onednn]") {
  // A convolution oneDNN is measured faster on (16 -> 16 channels, 3x3 at 28x28, 4 images): the
  // engine's default policy sends its forward, dX and dW to oneDNN; with --amp fp16 the CPU engine
  // stays the CUDA path's reference and runs mpq's kernels (runtime/cpu/conv_onednn.cpp).
  if (!rt::cpu::onednn_enabled()) {
    WARN("oneDNN is not built in or is switched off (MPQ_ONEDNN=0): no policy to test");
    return;
  }
  ir::Model m;
  m.set_opset("", 17);
  ir::Graph& g = *m.graph;
  ir::Value* x = g.add_value("x", ir::ValueType::tensor(DType::Float32, Shape{4, 16, 28, 28}));
  g.add_input(x);
  ir::Value* w = g.add_initializer("w", test::random_tensor({16, 16, 3, 3}, 5));
  ir::Node* conv = g.add_node_with_new_outputs("Conv", {x, w}, 1, "conv");
  conv->set_attr(Attribute::make_ints("pads", {1, 1, 1, 1}));
  g.add_output(conv->output(0));
  const Tensor feed = test::random_tensor({4, 16, 28, 28}, 6), dy = test::random_tensor({4, 16, 28, 28}, 7);
  auto onednn_runs = [&](train::Amp amp) {
    train::AutogradOptions o;
    o.amp = amp;
    o.input_grads = true;
    o.threads = 2;
    train::Autograd engine(m, o);
    const uint64_t before = rt::cpu::onednn_conv_count();
    engine.forward({{"x", feed}});
    engine.backward({dy});
    return rt::cpu::onednn_conv_count() - before;
  };
  CHECK(onednn_runs(train::Amp::Off) == 3);
  const char* env = std::getenv("MPQ_ONEDNN");
  if (env && std::string(env) == "all") WARN("MPQ_ONEDNN=all forces oneDNN under mixed precision too: not checked");
  else CHECK(onednn_runs(train::Amp::Fp16) == 0);
}
