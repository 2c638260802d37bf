// move_conv_before_resize: Conv 1x1 (Resize(X)) becomes Resize(Conv 1x1 (X)) with the same outputs to
// float rounding, for nearest, linear and cubic upsampling Resizes, opset 10 and 13, with and
// without bias, also through the whole inference pipeline; guarded cases (a kernel larger than 1x1,
// strides, pads, groups, SAME padding, a Resize output read twice or kept as a graph output,
// tf_crop_and_resize, sizes, scales not constant or on the channels, downsampling, more work
// after the move) are left alone.
#include <catch2/catch.hpp>

#include "ir/verify.h"
#include "passes/inference_fusion.h"
#include "passes/move_conv_before_resize.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;

namespace {

struct Options {
  int64_t opset = 13;
  std::string mode = "linear";
  std::string transform = "half_pixel";
  std::vector<float> scales{1.0f, 1.0f, 2.0f, 2.0f};
  bool use_sizes = false;     // sizes instead of scales
  int64_t kernel = 1;
  int64_t stride = 1;
  int64_t pad = 0;
  int64_t group = 1;
  int64_t cout = 3;                // output channels per group
  std::string auto_pad;            // set when not empty
  bool scales_are_input = false;   // scales a graph input, not a constant
  bool bias = true;
  bool resize_read_twice = false;  // a Neg also reads the Resize's output
  bool resize_is_output = false;   // the Resize's output is also a graph output
};

// x [2, 4, 5, 7] -> Resize -> Conv(W [3, 4 / group, k, k], bias) -> y
Model resize_conv_model(const Options& o) {
  Model m;
  m.set_opset("", o.opset);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2, 4, 5, 7}));
  g.add_input(x);
  Value* up = g.add_value("up");
  std::vector<Value*> rz_inputs{x};
  if (o.opset >= 11) rz_inputs.push_back(g.add_initializer("roi", Tensor::from<float>({0}, {})));
  if (o.use_sizes) {
    rz_inputs.push_back(g.add_initializer("scales", Tensor::from<float>({0}, {})));
    rz_inputs.push_back(g.add_initializer("sizes", Tensor::from<int64_t>({4}, {2, 4, 10, 14})));
  } else {
    if (o.scales_are_input) {
      Value* sc = g.add_value("scales", ValueType::tensor(DType::Float32, Shape{4}));
      g.add_input(sc);
      rz_inputs.push_back(sc);
    } else {
      rz_inputs.push_back(g.add_initializer("scales", Tensor::from<float>({4}, o.scales)));
    }
  }
  Node* rz = g.add_node("Resize", rz_inputs, {up}, "resize");
  rz->set_attr(Attribute::make_string("mode", o.mode));
  if (o.opset >= 11) rz->set_attr(Attribute::make_string("coordinate_transformation_mode", o.transform));
  const int64_t cin = 4 / o.group;
  std::vector<Value*> conv_inputs{up, g.add_initializer("w", test::random_tensor({o.cout * o.group, cin, o.kernel, o.kernel}, 5))};
  if (o.bias) conv_inputs.push_back(g.add_initializer("b", test::random_tensor({o.cout * o.group}, 6)));
  Value* y = g.add_value("y");
  Node* conv = g.add_node("Conv", conv_inputs, {y}, "conv");
  conv->set_attr(Attribute::make_ints("strides", {o.stride, o.stride}));
  conv->set_attr(Attribute::make_ints("pads", {o.pad, o.pad, o.pad, o.pad}));
  conv->set_attr(Attribute::make_int("group", o.group));
  if (!o.auto_pad.empty()) conv->set_attr(Attribute::make_string("auto_pad", o.auto_pad));
  g.add_output(y);
  if (o.resize_read_twice) {
    Value* n = g.add_value("neg");
    g.add_node("Neg", {up}, {n}, "neg");
    g.add_output(n);
  }
  if (o.resize_is_output) g.add_output(up);
  return m;
}

passes::PassStats move_and_compare(Model& m) {
  const rt::Feeds feeds{{"x", test::random_tensor({2, 4, 5, 7}, 21, -2.0f, 2.0f)}};
  const auto before = test::run_model(m, feeds);
  passes::MoveConvBeforeResize pass;
  passes::PassStats s = passes::run_pass(pass, m);  // verifies the IR
  REQUIRE(verify(m).empty());
  const auto after = test::run_model(m, feeds);
  REQUIRE(after.size() == before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    CHECK(after[i].shape() == before[i].shape());
    CHECK(test::max_abs_diff(after[i], before[i]) < 2e-5);
  }
  return s;
}

// The top-level node op types in order.
std::vector<std::string> op_order(const Model& m) {
  std::vector<std::string> ops;
  for (const auto& n : m.graph->nodes()) ops.push_back(n->op_type);
  return ops;
}

}  // namespace

TEST_CASE("move_conv_before_resize runs a 1x1 Conv before the Resize that feeds it, same outputs",
          "[passes][move_conv_before_resize]") {
  struct Case {
    const char* what;
    Options o;
  };
  std::vector<Case> cases;
  cases.push_back({"linear 2x, half_pixel", {}});
  Options o;
  o.mode = "nearest";
  cases.push_back({"nearest 2x", o});
  o = {};
  o.mode = "cubic";
  o.transform = "align_corners";
  cases.push_back({"cubic 2x, align_corners", o});
  o = {};
  o.cout = 6;  // more channels out than in, still less work: 4 * 6 / 4 + 4 * 6 < 4 * 6 + 4 * 4
  o.scales = {1.0f, 1.0f, 2.0f, 2.0f};
  cases.push_back({"linear 2x to more channels", o});
  o = {};
  o.auto_pad = "VALID";
  cases.push_back({"auto_pad VALID", o});
  o = {};
  o.bias = false;
  o.scales = {1.0f, 1.0f, 3.0f, 1.0f};
  cases.push_back({"no bias, 3x on one axis", o});
  o = {};
  o.opset = 10;
  o.mode = "nearest";
  cases.push_back({"opset 10 Resize(X, scales)", o});
  for (const Case& c : cases) {
    INFO(c.what);
    Model m = resize_conv_model(c.o);
    const passes::PassStats s = move_and_compare(m);
    CHECK(s.changed == 1);
    CHECK(op_order(m) == std::vector<std::string>{"Conv", "Resize"});
    // The names stay with their nodes; the graph output is still the Resize's now.
    CHECK(m.graph->find("y")->producer()->name == "resize");
  }
}

TEST_CASE("move_conv_before_resize leaves guarded cases alone", "[passes][move_conv_before_resize]") {
  struct Case {
    const char* what;
    Options o;
  };
  std::vector<Case> cases;
  Options o;
  o.kernel = 3;
  o.pad = 1;
  cases.push_back({"3x3 kernel", o});
  o = {};
  o.stride = 2;
  cases.push_back({"stride 2", o});
  o = {};
  o.pad = 1;
  cases.push_back({"padding", o});
  o = {};
  o.group = 2;
  cases.push_back({"two groups", o});
  o = {};
  o.resize_read_twice = true;
  cases.push_back({"Resize output read twice", o});
  o = {};
  o.resize_is_output = true;
  cases.push_back({"Resize output kept as a graph output", o});
  o = {};
  o.transform = "tf_crop_and_resize";
  cases.push_back({"tf_crop_and_resize", o});
  o = {};
  o.use_sizes = true;
  cases.push_back({"sizes", o});
  o = {};
  o.scales = {1.0f, 2.0f, 1.0f, 1.0f};
  cases.push_back({"a channel scale", o});
  o = {};
  o.scales = {1.0f, 1.0f, 0.5f, 0.75f};
  cases.push_back({"downsampling: the Conv would run on more pixels", o});
  o = {};
  o.scales = {1.0f, 1.0f, 1.0f, 1.0f};
  cases.push_back({"scales of 1", o});
  o = {};
  o.mode = "cubic";
  o.cout = 64;
  cases.push_back({"cubic 2x to 64 channels: the Resize's extra taps cost more than the Conv saves", o});
  o = {};
  o.scales_are_input = true;
  cases.push_back({"scales not a constant", o});
  o = {};
  o.auto_pad = "SAME_UPPER";
  cases.push_back({"auto_pad SAME_UPPER", o});
  for (const Case& c : cases) {
    INFO(c.what);
    Model m = resize_conv_model(c.o);
    passes::MoveConvBeforeResize pass;
    const std::vector<std::string> before = op_order(m);
    const passes::PassStats s = passes::run_pass(pass, m);
    CHECK(s.changed == 0);
    CHECK(op_order(m) == before);
  }
}

TEST_CASE("fuse_for_inference moves the Conv only where the Resize's output need not stay observable",
          "[passes][move_conv_before_resize]") {
  {
    // The whole pipeline (fusions and channel-blocked layouts) against the graph as written.
    Model m = resize_conv_model({});
    const rt::Feeds feeds{{"x", test::random_tensor({2, 4, 5, 7}, 22, -2.0f, 2.0f)}};
    const auto want = test::run_model(m, feeds);
    passes::fuse_for_inference(m, rt::BackendKind::CPU);
    REQUIRE(verify(m).empty());
    REQUIRE(m.graph->find("y"));
    CHECK(m.graph->find("y")->producer()->op_type == "Resize");
    const auto got = test::run_model(m, feeds);
    REQUIRE(got.size() == want.size());
    CHECK(test::max_abs_diff(got[0], want[0]) < 2e-5);
  }
  {
    // Calibration keeps the Conv's input observable (its range quantizes it): no move.
    Model m = resize_conv_model({});
    passes::fuse_for_inference(m, rt::BackendKind::CPU, {"up"});
    REQUIRE(m.graph->find("up"));
    CHECK(m.graph->find("up")->producer()->op_type == "Resize");
    CHECK(m.graph->find("y")->producer()->op_type != "Resize");
  }
}
