// Backward of Add, Sub, Mul, Div, Pow and Where (train/grads/binary_grad.cpp) against float64
// central finite differences, with broadcasting in every direction on odd shapes.
#include <catch2/catch.hpp>

#include "test_util.h"
#include "train/grad_check.h"
#include "train/grads/grad_util.h"

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

// reduce_to_shape (the broadcast operand's gradient) against a naive float64 sum in the reduced
// index's order: the same bits, on one thread and three, for the row-block path (innermost run
// kept, 8 wide or more, several blocks) and the general one.
TEST_CASE("reduce_to_shape sums broadcast dimensions in a fixed order", "[train][grad]") {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{37, 70}, {70}},            // bias gradient, one row block per 16 columns
      {{4, 600}, {600}},           // several blocks of 80
      {{3, 29, 40}, {3, 1, 40}},   // kept outer run
      {{5, 2, 9, 33}, {2, 1, 33}}, // reduced, kept, reduced, kept
      {{6, 5, 7}, {5, 1}},         // innermost reduced: the general loop
      {{11, 3}, {1, 3}},           // inner run too narrow for row blocks
      {{0, 5, 16}, {0, 1, 16}},    // empty
  };
  for (DType dt : {DType::Float32, DType::Float64}) {
    uint32_t seed = 40;
    for (const auto& [from, to] : cases) {
      INFO(dtype_name(dt) << " " << shape_str(from) << " -> " << shape_str(to));
      const Tensor g = test::random_tensor(from, seed++, -3, 3).cast_to(dt);
      const Tensor gd = g.cast_to(DType::Float64);
      // Naive: out[o] = sum over g's elements that broadcast onto o, in g's flat order.
      const size_t lead = from.size() - to.size();
      std::vector<double> want(static_cast<size_t>(shape_numel(to)), 0.0);
      for (int64_t i = 0; i < g.numel(); ++i) {
        int64_t rem = i, o = 0, ostride = 1;
        for (size_t d = from.size(); d-- > 0;) {
          const int64_t c = rem % from[d];
          rem /= from[d];
          if (d >= lead) {
            const int64_t t = to[d - lead];
            if (t != 1) o += c * ostride;
            ostride *= t;
          }
        }
        want[static_cast<size_t>(o)] += gd.data<double>()[i];
      }
      for (int threads : {1, 3}) {
        rt::ThreadPool pool(threads);
        const Tensor got = train::grad_util::reduce_to_shape(pool, g, to).cast_to(DType::Float64);
        REQUIRE(got.shape() == to);
        for (size_t o = 0; o < want.size(); ++o) {
          const double w = dt == DType::Float32 ? static_cast<double>(static_cast<float>(want[o])) : want[o];
          REQUIRE(got.data<double>()[o] == w);
        }
      }
    }
  }
}
