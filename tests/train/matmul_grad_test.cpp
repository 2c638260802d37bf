// Backward of Gemm (every transA/transB/alpha/beta combination, bias broadcast) and MatMul (1-D
// promotion, batch broadcasting on either side) against float64 finite differences.
#include <catch2/catch.hpp>

#include "ir/graph.h"
#include "test_util.h"
#include "train/grad_check.h"

using namespace mpq;
using ir::Attribute;

TEST_CASE("Gemm backward", "[train][grad]") {
  const int64_t M = 5, K = 7, N = 3;
  uint32_t seed = 20;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (const Shape& cs : {Shape{N}, Shape{M, N}, Shape{1}}) {
        INFO("transA " << ta << " transB " << tb << " C " << shape_str(cs));
        const Tensor a = test::random_tensor(ta ? Shape{K, M} : Shape{M, K}, seed++);
        const Tensor b = test::random_tensor(tb ? Shape{N, K} : Shape{K, N}, seed++);
        const Tensor c = test::random_tensor(cs, seed++);
        test::check_gradients("Gemm", {a, b, c},
                              {Attribute::make_int("transA", ta), Attribute::make_int("transB", tb),
                               Attribute::make_float("alpha", 0.7f), Attribute::make_float("beta", 1.3f)});
      }
  // Without C.
  test::check_gradients("Gemm", {test::random_tensor({4, 6}, 30), test::random_tensor({6, 2}, 31)}, {});
}

TEST_CASE("MatMul backward", "[train][grad]") {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{5, 7}, {7, 3}},              // plain
      {{2, 3, 5, 7}, {7, 4}},        // shared 2-D weight (Linear layer)
      {{2, 3, 5, 7}, {2, 3, 7, 4}},  // batched (attention)
      {{3, 1, 5, 7}, {1, 2, 7, 4}},  // both broadcast
      {{5, 7}, {3, 7, 2}},           // left operand shared across a batch
      {{7}, {2, 7, 3}},              // 1-D left
      {{2, 5, 7}, {7}},              // 1-D right
      {{7}, {7}},                    // dot product
  };
  uint32_t seed = 40;
  for (const auto& [sa, sb] : cases) {
    INFO(shape_str(sa) << " x " << shape_str(sb));
    test::check_gradients("MatMul", {test::random_tensor(sa, seed++), test::random_tensor(sb, seed++)}, {});
  }
}
