// Backward of Resize and Upsample (train/grads/resize_grad.cpp) against float64 finite differences:
// nearest (every nearest_mode), linear (1-D, 2-D, on any axis) and cubic, up and down, with every
// supported coordinate transform; scales or sizes, axes and keep_aspect_ratio_policy, antialias,
// exclude_outside; Resize-10/11/13/18 and Upsample-7/9. roi, scales and sizes get no gradient;
// tf_crop_and_resize is reported, naming the node, when the backward runs; gradients are
// bit-identical on 1 and 3 threads.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "core/error.h"
#include "ir/graph.h"
#include "test_util.h"
#include "train/autograd.h"
#include "train/grad_check.h"

using namespace mpq;
using ir::Attribute;

namespace {

using Attrs = std::vector<Attribute>;

Tensor floats(const std::vector<float>& v) { return Tensor::from<float>({static_cast<int64_t>(v.size())}, v); }
Tensor ints(const std::vector<int64_t>& v) { return Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v); }

// Resize's inputs at `opset`: X, then roi / scales / sizes as that opset lays them out.
std::vector<Tensor> resize_inputs(int opset, const Tensor& x, const std::vector<float>& scales,
                                  const std::vector<int64_t>& sizes = {}) {
  if (opset < 11) return {x, floats(scales)};
  const Tensor roi = opset < 13 ? Tensor(DType::Float32, {0}) : Tensor();
  if (!sizes.empty()) return {x, roi, opset < 13 ? Tensor(DType::Float32, {0}) : Tensor(), ints(sizes)};
  return {x, roi, floats(scales)};
}

void check_resize(const std::string& what, int opset, const Shape& xs, const std::vector<float>& scales,
                  const std::vector<int64_t>& sizes, const Attrs& attrs, uint32_t seed, const std::string& op = "Resize") {
  INFO(op << "-" << opset << " " << what << " X " << shape_str(xs));
  test::GradCheckOptions o;
  o.opset = opset;
  o.wrt = {0};
  o.seed = seed;
  o.eps = 1e-3;  // Y is linear in X: exact up to rounding at any step
  const Tensor x = test::random_tensor(xs, seed);
  test::check_gradients(op, op == "Resize" ? resize_inputs(opset, x, scales, sizes) : std::vector<Tensor>{x, floats(scales)},
                        attrs, o);
}

const char* const kCoords[] = {"half_pixel",    "pytorch_half_pixel",   "align_corners",
                               "asymmetric",    "half_pixel_symmetric", "tf_half_pixel_for_nn"};

}  // namespace

TEST_CASE("Resize backward, nearest: every nearest_mode and coordinate transform, up and down", "[train][grad]") {
  uint32_t seed = 1000;
  for (const char* nearest : {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})
    for (const char* coord : kCoords)
      for (const std::vector<float>& scales : {std::vector<float>{1, 1, 2.5f, 1.75f}, std::vector<float>{1, 1, 0.6f, 0.8f}}) {
        check_resize(std::string(nearest) + " " + coord, 13, {2, 3, 5, 4}, scales, {},
                     {Attribute::make_string("mode", "nearest"), Attribute::make_string("nearest_mode", nearest),
                      Attribute::make_string("coordinate_transformation_mode", coord)},
                     seed++);
      }
}

TEST_CASE("Resize backward, linear: every coordinate transform, up and down, any axis", "[train][grad]") {
  uint32_t seed = 1100;
  for (const char* coord : kCoords)
    for (const std::vector<float>& scales : {std::vector<float>{1, 1, 1.6f, 2.25f}, std::vector<float>{1, 1, 0.6f, 0.75f}})
      check_resize(std::string("bilinear ") + coord, 13, {2, 3, 5, 4}, scales, {},
                   {Attribute::make_string("mode", "linear"), Attribute::make_string("coordinate_transformation_mode", coord)},
                   seed++);
  // 1-D linear on the last axis of a 3-D tensor, and a resize of the channel axis.
  check_resize("1-D linear", 13, {3, 4, 7}, {1, 1, 2.3f}, {},
               {Attribute::make_string("mode", "linear"), Attribute::make_string("coordinate_transformation_mode", "align_corners")},
               seed++);
  check_resize("linear over channels", 13, {2, 4, 3, 5}, {1, 1.5f, 1, 2}, {}, {Attribute::make_string("mode", "linear")}, seed++);
  // Exact integer factors (the common 2x upsampling of a U-Net decoder).
  check_resize("bilinear 2x", 13, {2, 3, 4, 5}, {1, 1, 2, 2}, {},
               {Attribute::make_string("mode", "linear"), Attribute::make_string("coordinate_transformation_mode", "pytorch_half_pixel")},
               seed++);
}

TEST_CASE("Resize backward, cubic, exclude_outside, antialias", "[train][grad]") {
  uint32_t seed = 1200;
  for (int exclude : {0, 1})
    for (const std::vector<float>& scales : {std::vector<float>{1, 1, 1.8f, 2.5f}, std::vector<float>{1, 1, 0.7f, 0.6f}})
      check_resize("cubic exclude_outside " + std::to_string(exclude), 13, {2, 2, 6, 5}, scales, {},
                   {Attribute::make_string("mode", "cubic"), Attribute::make_int("exclude_outside", exclude),
                    Attribute::make_float("cubic_coeff_a", -0.5f)},
                   seed++);
  for (const char* mode : {"linear", "cubic"})
    check_resize(std::string("antialiased ") + mode, 18, {2, 2, 9, 8}, {1, 1, 0.45f, 0.6f}, {},
                 {Attribute::make_string("mode", mode), Attribute::make_int("antialias", 1)}, seed++);
}

TEST_CASE("Resize backward with sizes, axes and keep_aspect_ratio_policy", "[train][grad]") {
  check_resize("sizes", 13, {2, 3, 5, 4}, {}, {2, 3, 8, 3}, {Attribute::make_string("mode", "linear")}, 1300);
  check_resize("sizes (opset 11 layout)", 11, {2, 3, 5, 4}, {}, {2, 3, 3, 7}, {Attribute::make_string("mode", "nearest")}, 1301);
  for (const char* policy : {"stretch", "not_larger", "not_smaller"})
    check_resize(std::string("axes and ") + policy, 18, {2, 3, 5, 4}, {}, {7, 9},
                 {Attribute::make_string("mode", "linear"), Attribute::make_ints("axes", {2, 3}),
                  Attribute::make_string("keep_aspect_ratio_policy", policy)},
                 1302);
  check_resize("axes with scales", 18, {2, 3, 5, 4}, {1.5f, 0.5f}, {},
               {Attribute::make_string("mode", "nearest"), Attribute::make_ints("axes", {3, 2})}, 1303);
}

TEST_CASE("Resize-10 and Upsample backward (asymmetric, nearest floors up / ceils down)", "[train][grad]") {
  for (const char* mode : {"nearest", "linear"}) {
    check_resize(mode, 10, {2, 3, 5, 4}, {1, 1, 2.5f, 0.6f}, {}, {Attribute::make_string("mode", mode)}, 1400);
    check_resize(mode, 11, {2, 3, 5, 4}, {1, 1, 1.5f, 3}, {}, {Attribute::make_string("mode", mode)}, 1401);
    check_resize(mode, 9, {2, 3, 5, 4}, {1, 1, 2, 1.5f}, {}, {Attribute::make_string("mode", mode)}, 1402, "Upsample");
  }
  // Upsample-7 takes its scales as an attribute.
  test::GradCheckOptions o;
  o.opset = 7;
  o.eps = 1e-3;
  test::check_gradients("Upsample", {test::random_tensor({2, 3, 4, 3}, 1403)},
                        {Attribute::make_string("mode", "linear"), Attribute::make_floats("scales", {1, 1, 2, 2.5f})}, o);
}

TEST_CASE("Resize backward gives roi, scales and sizes no gradient", "[train][grad]") {
  // scales and sizes fed as graph inputs: the engine still differentiates X only.
  test::GradCheckOptions o;
  o.wrt = {0, 2};
  const Tensor x = test::random_tensor({2, 3, 4, 5}, 1500);
  std::vector<Tensor> g = test::node_gradients("Resize", resize_inputs(13, x, {1, 1, 2, 1.5f}),
                                               {Attribute::make_string("mode", "linear")}, o);
  CHECK(g[0].defined());
  CHECK_FALSE(g[2].defined());
  o.wrt = {0, 1, 2};
  o.opset = 11;
  g = test::node_gradients("Resize", resize_inputs(11, x, {1, 1, 2, 1.5f}), {Attribute::make_string("mode", "linear")}, o);
  CHECK(g[0].defined());
  CHECK_FALSE(g[1].defined());
  CHECK_FALSE(g[2].defined());
}

TEST_CASE("Resize gradients are bit-identical on 1 and 3 threads", "[train][grad]") {
  const Tensor x = test::random_tensor({16, 32, 28, 28}, 1600);
  for (const char* mode : {"nearest", "linear", "cubic"}) {
    INFO(mode);
    test::GradCheckOptions o;
    o.wrt = {0};
    o.threads = 1;
    const std::vector<Tensor> inputs = resize_inputs(13, x, {1, 1, 2, 1.5f});
    const Attrs attrs = {Attribute::make_string("mode", mode)};
    const Tensor one = test::node_gradients("Resize", inputs, attrs, o)[0];
    o.threads = 3;
    const Tensor three = test::node_gradients("Resize", inputs, attrs, o)[0];
    REQUIRE(one.dtype() == DType::Float32);
    CHECK(test::max_abs_diff(one, three) == 0.0);
  }
}

TEST_CASE("Resize backward of tf_crop_and_resize is unsupported and names the node when it runs", "[train][grad]") {
  ir::Model model;
  model.set_opset("", 13);
  ir::Graph* g = model.graph.get();
  ir::Value* x = g->add_value("x", ir::ValueType::tensor(DType::Float32, {1, 2, 4, 4}));
  g->add_input(x);
  ir::Value* roi = g->add_initializer("roi", floats({0, 0, 0.1f, 0.2f, 1, 1, 0.9f, 0.8f}));
  ir::Value* scales = g->add_initializer("scales", floats({1, 1, 2, 2}));
  ir::Value* y = g->add_value("y");
  g->add_output(y);
  ir::Node* n = g->add_node("Resize", {x, roi, scales}, {y}, "crop_resize");
  n->set_attr(Attribute::make_string("mode", "linear"));
  n->set_attr(Attribute::make_string("coordinate_transformation_mode", "tf_crop_and_resize"));
  train::AutogradOptions o;
  o.threads = 1;
  o.input_grads = true;
  o.default_parameters = false;
  train::Autograd engine(model, o);
  const std::vector<Tensor> out = engine.forward({{"x", test::random_tensor({1, 2, 4, 4}, 1700)}});
  REQUIRE(out.at(0).shape() == Shape{1, 2, 8, 8});
  try {
    engine.backward({test::random_tensor({1, 2, 8, 8}, 1701)});
    FAIL("the backward of tf_crop_and_resize ran");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Unsupported);
    CHECK_THAT(e.what(), Catch::Contains("crop_resize") && Catch::Contains("tf_crop_and_resize"));
  }
}
