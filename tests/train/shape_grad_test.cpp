// Backward of the shape and data-movement ops (train/grads/shape_grad.cpp, shape_grad_slice_pad.cpp)
// against float64 central finite differences on odd shapes, across the opset variants of their
// arguments (attributes or inputs), plus direct calls with arguments the backward must refuse.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <limits>

#include "ir/graph.h"
#include "test_util.h"
#include "train/backward_call.h"
#include "train/grad_check.h"

using namespace mpq;
using ir::Attribute;

namespace {

Tensor ints(const std::vector<int64_t>& v) { return Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v); }

test::GradCheckOptions at_opset(int opset, std::vector<size_t> wrt = {0}) {
  test::GradCheckOptions o;
  o.opset = opset;
  o.wrt = std::move(wrt);
  return o;
}

constexpr int64_t kBig = std::numeric_limits<int64_t>::max();

}  // namespace

TEST_CASE("Reshape and Flatten backward", "[train][grad]") {
  for (uint32_t seed : {1u, 2u, 3u}) {
    const Tensor x = test::random_tensor({3, 5, 7}, seed);
    test::check_gradients("Reshape", {x, ints({7, -1, 3})}, {}, at_opset(13));
    test::check_gradients("Reshape", {x, ints({0, 35})}, {}, at_opset(13));        // 0 copies a dimension
    test::check_gradients("Reshape", {x, ints({105})}, {}, at_opset(14));
    test::check_gradients("Reshape", {x}, {Attribute::make_ints("shape", {15, 7})}, at_opset(4));  // attribute form
    for (int64_t axis : {0, 1, 2, 3, -1})
      test::check_gradients("Flatten", {x}, {Attribute::make_int("axis", axis)}, at_opset(13));
  }
}

TEST_CASE("Squeeze and Unsqueeze backward, axes as attribute and as input", "[train][grad]") {
  const Tensor x = test::random_tensor({3, 1, 5, 1}, 4);
  test::check_gradients("Squeeze", {x}, {Attribute::make_ints("axes", {1})}, at_opset(11));
  test::check_gradients("Squeeze", {x}, {Attribute::make_ints("axes", {-1, 1})}, at_opset(11));
  test::check_gradients("Squeeze", {x}, {}, at_opset(11));                    // every size-1 axis
  test::check_gradients("Squeeze", {x, ints({3})}, {}, at_opset(13));
  test::check_gradients("Squeeze", {x}, {}, at_opset(13));
  const Tensor y = test::random_tensor({5, 3}, 5);
  test::check_gradients("Unsqueeze", {y}, {Attribute::make_ints("axes", {0, 3})}, at_opset(11));
  test::check_gradients("Unsqueeze", {y, ints({-1, 1})}, {}, at_opset(13));
  test::check_gradients("Unsqueeze", {test::random_tensor({}, 6), ints({0})}, {}, at_opset(13));  // scalar
}

TEST_CASE("Transpose backward applies the inverse permutation", "[train][grad]") {
  uint32_t seed = 10;
  const Tensor x = test::random_tensor({2, 3, 5, 7}, seed++);
  test::check_gradients("Transpose", {x}, {});  // default: reversed axes
  test::check_gradients("Transpose", {x}, {Attribute::make_ints("perm", {2, 0, 3, 1})});
  test::check_gradients("Transpose", {x}, {Attribute::make_ints("perm", {1, -1, 0, -2})});  // negative entries
  test::check_gradients("Transpose", {x}, {Attribute::make_ints("perm", {0, 1, 2, 3})});  // identity
  // A transpose wide enough for the tiled inner kernel.
  test::check_gradients("Transpose", {test::random_tensor({33, 70}, seed++)}, {});
}

TEST_CASE("Expand backward sums the broadcast copies", "[train][grad]") {
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{3, 1, 5}, {2, 3, 4, 5}},  // new leading axis and a stretched one
      {{1}, {4, 3}},
      {{3, 1}, {1, 1, 7}},        // bidirectional: the 1s of the shape keep the input's 3
      {{3, 5}, {3, 5}},           // no-op
      {{1, 1}, {1}},
  };
  uint32_t seed = 20;
  for (const auto& [xs, shape] : cases) {
    INFO(shape_str(xs) << " -> " << shape_str(shape));
    test::check_gradients("Expand", {test::random_tensor(xs, seed++), ints(shape)}, {}, at_opset(13));
  }
}

TEST_CASE("Tile backward sums over the tiles", "[train][grad]") {
  uint32_t seed = 30;
  const Tensor x = test::random_tensor({3, 2, 5}, seed++);
  test::check_gradients("Tile", {x, ints({2, 1, 3})}, {}, at_opset(13));
  test::check_gradients("Tile", {x, ints({1, 1, 1})}, {}, at_opset(13));
  test::check_gradients("Tile", {x, ints({3, 4, 1})}, {}, at_opset(13));
  test::check_gradients("Tile", {x, ints({2, 0, 1})}, {}, at_opset(13));  // empty output: zero gradient
  // Tile-1: a tile count and an axis.
  test::check_gradients("Tile", {x, ints({3}).reshaped({}), ints({-2}).reshaped({})}, {}, at_opset(5));
}

TEST_CASE("Concat backward hands each input its slab", "[train][grad]") {
  uint32_t seed = 40;
  const Tensor a = test::random_tensor({3, 2, 5}, seed++);
  const Tensor b = test::random_tensor({3, 4, 5}, seed++);
  const Tensor c = test::random_tensor({3, 1, 5}, seed++);
  test::check_gradients("Concat", {a, b, c}, {Attribute::make_int("axis", 1)});
  test::check_gradients("Concat", {a, b, c}, {Attribute::make_int("axis", -2)});
  test::check_gradients("Concat", {a.reshaped({6, 5}), b.reshaped({12, 5})}, {Attribute::make_int("axis", 0)});
  test::check_gradients("Concat", {a.reshaped({3, 10}), test::random_tensor({3, 7}, seed++)},
                        {Attribute::make_int("axis", -1)});
  // A constant operand gets nothing; the others still get their slabs.
  test::GradCheckOptions o;
  o.wrt = {0, 2};
  test::check_gradients("Concat", {a, b, c}, {Attribute::make_int("axis", 1)}, o);
  // Concat-1: axis 1 when the attribute is absent.
  test::check_gradients("Concat", {a, b}, {}, at_opset(3, {0, 1}));
  // A zero-width input.
  test::check_gradients("Concat", {a, test::random_tensor({3, 0, 5}, seed++), c}, {Attribute::make_int("axis", 1)},
                        at_opset(17, {0, 2}));
}

TEST_CASE("Split backward: attribute, input and num_outputs sizes", "[train][grad]") {
  uint32_t seed = 50;
  const Tensor x = test::random_tensor({3, 7, 5}, seed++);
  auto three = [](int opset) {
    test::GradCheckOptions o = at_opset(opset);
    o.n_outputs = 3;
    return o;
  };
  test::check_gradients("Split", {x}, {Attribute::make_int("axis", 1), Attribute::make_ints("split", {2, 4, 1})}, three(11));
  test::check_gradients("Split", {x}, {}, three(11));  // equal parts along axis 0
  test::check_gradients("Split", {x, ints({3, 0, 4})}, {Attribute::make_int("axis", -2)}, three(13));
  test::check_gradients("Split", {x}, {Attribute::make_int("axis", 1), Attribute::make_int("num_outputs", 3)},
                        three(18));  // 3, 3, 1
  test::check_gradients("Split", {x, ints({1, 5, 1})}, {Attribute::make_int("axis", 1)}, three(1));  // Split-1 input
  test::check_gradients("Split", {x}, {Attribute::make_int("axis", 2), Attribute::make_ints("split", {1, 3, 1})}, three(2));
  // Outputs without a gradient contribute zeros.
  for (std::vector<size_t> used : {std::vector<size_t>{0, 2}, std::vector<size_t>{1}}) {
    test::GradCheckOptions o = three(13);
    o.loss_outputs = used;
    test::check_gradients("Split", {x, ints({2, 4, 1})}, {Attribute::make_int("axis", 1)}, o);
  }
  test::GradCheckOptions one = at_opset(13);
  test::check_gradients("Split", {x}, {Attribute::make_int("axis", 0)}, one);  // a single output
}

TEST_CASE("Slice backward: attributes, inputs, negative and clamped bounds, steps", "[train][grad]") {
  uint32_t seed = 60;
  const Tensor x = test::random_tensor({5, 7, 6}, seed++);
  // Opset 1-9: attributes; negative starts, ends past the end, omitted axes.
  test::check_gradients("Slice", {x},
                        {Attribute::make_ints("starts", {1, -5}), Attribute::make_ints("ends", {4, 1000}),
                         Attribute::make_ints("axes", {0, 2})},
                        at_opset(9));
  test::check_gradients("Slice", {x}, {Attribute::make_ints("starts", {-3}), Attribute::make_ints("ends", {-1})},
                        at_opset(1));
  // Opset 10+: inputs.
  struct Case {
    std::vector<int64_t> starts, ends, axes, steps;  // empty axes / steps: omitted
  };
  const std::vector<Case> cases = {
      {{1, 0}, {4, kBig}, {0, 2}, {}},            // steps omitted
      {{0, 1}, {kBig, 7}, {}, {}},                // axes and steps omitted
      {{-1}, {-kBig}, {1}, {-1}},                 // whole axis reversed
      {{kBig, 1}, {-kBig, -2}, {2, 0}, {-2, 2}},  // negative step from a clamped start
      {{1, -2, 0}, {6, 0, 5}, {1, 2, 0}, {3, -1, 2}},
      {{-100}, {100}, {-1}, {4}},                 // clamped both ends
      {{3}, {2}, {0}, {1}},                       // empty: zero gradient
      {{0, 0, 0}, {kBig, kBig, kBig}, {}, {}},    // the whole tensor
  };
  for (const Case& c : cases) {
    INFO("starts " << shape_str(c.starts) << " ends " << shape_str(c.ends) << " axes " << shape_str(c.axes)
                   << " steps " << shape_str(c.steps));
    std::vector<Tensor> ins = {x, ints(c.starts), ints(c.ends)};
    if (!c.axes.empty() || !c.steps.empty()) ins.push_back(c.axes.empty() ? Tensor() : ints(c.axes));
    if (!c.steps.empty()) ins.push_back(ints(c.steps));
    test::check_gradients("Slice", ins, {}, at_opset(13));
  }
}

TEST_CASE("Pad backward: constant, reflect, edge and wrap, crops, axes", "[train][grad]") {
  uint32_t seed = 70;
  const Tensor x = test::random_tensor({3, 4, 5}, seed++);
  // Opset 2: attributes.
  test::check_gradients("Pad", {x},
                        {Attribute::make_ints("pads", {0, 1, 2, 1, 0, 3}), Attribute::make_float("value", 1.5f)},
                        at_opset(2));
  test::check_gradients("Pad", {x},
                        {Attribute::make_ints("pads", {1, 2, 2, 0, 1, 3}), Attribute::make_string("mode", "reflect")},
                        at_opset(2));
  test::check_gradients("Pad", {x}, {Attribute::make_ints("paddings", {0, 0, 1, 0, 0, 2})}, at_opset(1));
  // Opset 11+: inputs, every mode, crops alone and mixed with padding on the same and other axes.
  const std::vector<std::vector<int64_t>> pad_sets = {
      {1, 2, 6, 3, 1, 4},      // past size - 1 on axes 0 and 2: reflect goes round again
      {0, 0, 2, 0, 0, 0},
      {-1, 1, 0, 0, -2, 2},    // crop and pad
      {1, -1, -2, -1, 2, 1},
      {0, 0, 0, -1, 0, -2},    // crops only
  };
  for (const char* mode : {"constant", "reflect", "edge"})
    for (const auto& pads : pad_sets)
      for (uint32_t loss_seed : {7u, 8u}) {
        INFO(mode << " pads " << shape_str(pads) << " loss seed " << loss_seed);
        test::GradCheckOptions o = at_opset(13);
        o.seed = loss_seed;
        test::check_gradients("Pad", {x, ints(pads), Tensor::scalar<double>(0.25)},
                              {Attribute::make_string("mode", mode)}, o);
      }
  // Wrap (opset 19) and the axes input (opset 18), negative axes included.
  test::check_gradients("Pad", {x, ints({2, 1, 3, 4, 2, 1})}, {Attribute::make_string("mode", "wrap")}, at_opset(19));
  test::check_gradients("Pad", {x, ints({1, 2, 3, 1}), Tensor(), ints({-1, 1})}, {Attribute::make_string("mode", "reflect")},
                        at_opset(18));
  test::check_gradients("Pad", {x, ints({-1, 2, 1, -2}), Tensor::scalar<double>(-3.0), ints({0, -1})}, {},
                        at_opset(18));
  // Size-1 axes replicated by edge and reflect padding.
  const Tensor thin = test::random_tensor({3, 1, 5}, seed++);
  for (const char* mode : {"edge", "reflect", "wrap"}) {
    INFO(mode);
    test::check_gradients("Pad", {thin, ints({0, 2, 1, 0, 3, 0})}, {Attribute::make_string("mode", mode)}, at_opset(19));
  }
  // No padding at all: the gradient passes through.
  test::check_gradients("Pad", {x, ints({0, 0, 0, 0, 0, 0})}, {Attribute::make_string("mode", "edge")}, at_opset(13));
}

TEST_CASE("Shape backward kernels are bit-identical at 1 and 3 threads", "[train][grad]") {
  // float32, large enough for the pool to split the work; the summing kernels matter most.
  const Tensor x = test::random_tensor({37, 41, 29}, 90);
  struct Case {
    const char* op;
    std::vector<Tensor> inputs;
    std::vector<Attribute> attrs;
    int opset;
    size_t n_outputs;
  };
  const std::vector<Case> cases = {
      {"Pad", {x, ints({3, 40, 2, 1, 45, 30})}, {Attribute::make_string("mode", "reflect")}, 13, 1},
      {"Pad", {x, ints({-2, 50, 7, 3, -9, 31})}, {Attribute::make_string("mode", "wrap")}, 19, 1},
      {"Pad", {x, ints({5, 0, 6, 0, 7, 1})}, {Attribute::make_string("mode", "edge")}, 13, 1},
      {"Tile", {x, ints({3, 1, 4})}, {}, 13, 1},
      {"Expand", {x.reshaped({37, 1, 41, 29}), ints({2, 37, 9, 41, 29})}, {}, 13, 1},
      {"Slice", {x, ints({-1, 3}), ints({-kBig, 40}), ints({0, 2}), ints({-2, 3})}, {}, 13, 1},
      {"Split", {x, ints({10, 0, 31})}, {Attribute::make_int("axis", 1)}, 13, 3},
      {"Transpose", {x}, {Attribute::make_ints("perm", {2, 0, 1})}, 13, 1},
  };
  for (const Case& c : cases) {
    INFO(c.op << " " << c.inputs.size() << " inputs");
    test::GradCheckOptions o = at_opset(c.opset);
    o.n_outputs = c.n_outputs;
    o.threads = 1;
    const Tensor one = test::node_gradients(c.op, c.inputs, c.attrs, o)[0];
    o.threads = 3;
    const Tensor three = test::node_gradients(c.op, c.inputs, c.attrs, o)[0];
    REQUIRE(one.defined());
    REQUIRE(three.shape() == one.shape());
    CHECK(one.dtype() == DType::Float32);
    CHECK(std::memcmp(one.raw_data(), three.raw_data(), one.nbytes()) == 0);
  }
}

TEST_CASE("Shape backward kernels refuse arguments the forward would refuse, naming the node", "[train][grad]") {
  const Tensor x = test::random_tensor({3, 4}, 80);
  auto refused = [](const std::function<void()>& call, const std::string& what) {
    try {
      call();
      FAIL("no error for " << what);
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(e.kind() == ErrorKind::BadInput);
      CHECK_THAT(e.what(), Catch::Contains("node_under_test") && Catch::Contains("(backward)") && Catch::Contains(what));
    }
  };
  refused([&] { test::call_backward("Slice", 13, {x, ints({0}), ints({2}), ints({1}), ints({0})}, {x}); },
          "must not be 0");
  refused([&] { test::call_backward("Slice", 13, {x, ints({0, 0}), ints({2, 2}), ints({1, -1})}, {x}); }, "repeated");
  refused([&] { test::call_backward("Slice", 13, {x, ints({0}), ints({2}), ints({2})}, {x}); }, "out of range");
  refused([&] { test::call_backward("Pad", 13, {x, ints({0, 1, 0, 1})}, {x}, {Attribute::make_string("mode", "mirror")}); },
          "unknown pad mode");
  refused([&] { test::call_backward("Pad", 13, {x, ints({0, -5, 0, 0})}, {x}); }, "crop more than");
  refused([&] { test::call_backward("Pad", 13, {x, ints({1, 1})}, {x}); }, "2 * rank");
  refused([&] { test::call_backward("Transpose", 13, {x}, {x}, {Attribute::make_ints("perm", {0, 0})}); },
          "not a permutation");
  refused([&] {
    test::call_backward("Split", 13, {x, ints({1, 2})}, {x.reshaped({3, 4})}, {Attribute::make_int("axis", 1)});
  }, "split has 2 sizes");
  refused([&] {
    test::call_backward("Split", 13, {x, ints({1, 2})}, {Tensor(), Tensor()}, {Attribute::make_int("axis", 1)});
  }, "do not add up");
  // Float sizes where integers belong.
  refused([&] { test::call_backward("Slice", 13, {x, x, ints({2})}, {x}); }, "int32 or int64");
}
