// Backward of Add, Sub, Mul, Div, Pow and Where (train/grads/binary_grad.cpp) against float64
// central finite differences, with broadcasting in every direction on odd shapes.
#include <catch2/catch.hpp>

#include "test_util.h"
#include "train/grad_check.h"

using namespace mpq;

namespace {
const std::vector<std::pair<Shape, Shape>> kBroadcasts = {
    {{3, 5, 7}, {3, 5, 7}},  // same shape
    {{3, 5, 7}, {7}},        // trailing vector (bias)
    {{3, 1, 7}, {1, 5, 1}},  // both sides stretched
    {{2, 3, 5}, {}},         // scalar
    {{1}, {4, 3}},           // left operand stretched
};
}  // namespace

TEST_CASE("Add/Sub/Mul/Div backward with broadcasting", "[train][grad]") {
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    uint32_t seed = 10;
    for (const auto& [sa, sb] : kBroadcasts) {
      INFO(op << " " << shape_str(sa) << " " << shape_str(sb));
      const Tensor a = test::random_tensor(sa, seed++, -2, 2);
      // Keep divisors away from zero.
      const Tensor b = std::string(op) == "Div" ? test::random_tensor(sb, seed++, 0.5f, 2) : test::random_tensor(sb, seed++, -2, 2);
      test::check_gradients(op, {a, b}, {});
    }
  }
}

TEST_CASE("Pow backward on the base (squares, square roots, general exponents)", "[train][grad]") {
  const Tensor x = test::random_tensor({4, 9, 7}, 3, 0.3f, 2.5f);
  for (float e : {2.0f, 3.0f, 0.5f, 1.7f, -1.3f}) {
    INFO("exponent " << e);
    test::GradCheckOptions o;
    o.wrt = {0};
    test::check_gradients("Pow", {x, Tensor::scalar<float>(e)}, {}, o);
  }
  // Per-element exponents broadcast along the last axis.
  test::GradCheckOptions o;
  o.wrt = {0};
  test::check_gradients("Pow", {x, test::random_tensor({7}, 4, 0.5f, 2.0f)}, {}, o);
}

TEST_CASE("Where backward reaches both value inputs through the mask", "[train][grad]") {
  Tensor cond(DType::Bool, {5, 1, 7});
  for (int64_t i = 0; i < cond.numel(); ++i) cond.data<bool>()[i] = (i * 7919) % 3 != 0;
  test::GradCheckOptions o;
  o.wrt = {1, 2};
  test::check_gradients("Where", {cond, test::random_tensor({5, 4, 7}, 5), test::random_tensor({4, 1}, 6)}, {}, o);
}
