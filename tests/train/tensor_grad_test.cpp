// Backward of Gather and GatherElements (train/grads/tensor_grad.cpp) against float64 central finite
// differences (any axis, negative, scalar, multi-dimensional and repeated indices), bit-identical
// gradients at 1 and 3 threads where indices repeat, and indices the backward must refuse.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>

#include "ir/graph.h"
#include "test_util.h"
#include "train/backward_call.h"
#include "train/grad_check.h"

using namespace mpq;
using ir::Attribute;

namespace {

// Indices of `shape` in [-dim, dim) (so negative ones occur), seeded; repeats are likely.
Tensor random_indices(const Shape& shape, int64_t dim, uint32_t seed, DType type = DType::Int64) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> pick(-dim, dim - 1);
  Tensor t(DType::Int64, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = pick(rng);
  return type == DType::Int64 ? t : t.cast_to(type);
}

test::GradCheckOptions data_only() {
  test::GradCheckOptions o;
  o.opset = 13;
  o.wrt = {0};
  return o;
}

bool bit_identical(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("Gather backward adds rows back, repeated indices accumulating", "[train][grad]") {
  uint32_t seed = 1;
  const Tensor x = test::random_tensor({5, 7, 3}, seed++);
  struct Case {
    int64_t axis;
    Shape indices;
  };
  const std::vector<Case> cases = {
      {0, {9}}, {1, {4, 3}}, {2, {2, 5}}, {-1, {7}}, {-3, {2, 2, 3}}, {1, {}},  // {}: a scalar index
  };
  for (const Case& c : cases) {
    const int64_t dim = x.shape()[static_cast<size_t>(c.axis < 0 ? c.axis + 3 : c.axis)];
    for (uint32_t s = 0; s < 2; ++s) {
      INFO("axis " << c.axis << " indices " << shape_str(c.indices) << " seed " << seed);
      test::check_gradients("Gather", {x, random_indices(c.indices, dim, seed++)}, {Attribute::make_int("axis", c.axis)},
                            data_only());
    }
  }
  // int32 indices, every row picked many times.
  test::check_gradients("Gather", {x, Tensor::from<int32_t>({8}, {1, 1, -4, 1, 0, 4, -1, 1})}, {}, data_only());
  // A 1-D table (inner size 1) and an empty index list.
  test::check_gradients("Gather", {test::random_tensor({11}, seed++), random_indices({6, 5}, 11, seed++)}, {}, data_only());
  test::check_gradients("Gather", {x, random_indices({0}, 5, seed++)}, {}, data_only());
}

TEST_CASE("GatherElements backward scatter-adds along the axis", "[train][grad]") {
  uint32_t seed = 30;
  const Tensor x = test::random_tensor({4, 6, 5}, seed++);
  struct Case {
    int64_t axis;
    Shape indices;
  };
  const std::vector<Case> cases = {
      {0, {7, 6, 5}},  // longer than the data along the axis: repeats guaranteed
      {1, {4, 3, 5}},
      {2, {3, 6, 2}},  // smaller than the data off the axis too
      {-1, {4, 6, 9}},
      {-2, {1, 1, 1}},
  };
  for (const Case& c : cases) {
    const int64_t dim = x.shape()[static_cast<size_t>(c.axis < 0 ? c.axis + 3 : c.axis)];
    INFO("axis " << c.axis << " indices " << shape_str(c.indices));
    test::check_gradients("GatherElements", {x, random_indices(c.indices, dim, seed++)},
                          {Attribute::make_int("axis", c.axis)}, data_only());
  }
  test::check_gradients("GatherElements", {test::random_tensor({9}, seed++), random_indices({13}, 9, seed++, DType::Int32)},
                        {}, data_only());
}

TEST_CASE("Gather and GatherElements gradients are bit-identical at 1 and 3 threads", "[train][grad]") {
  // float32, large enough for the pool to split the work, with heavily repeated indices.
  test::GradCheckOptions o = data_only();
  struct Case {
    const char* op;
    Tensor data, indices;
    int64_t axis;
  };
  const std::vector<Case> cases = {
      {"Gather", test::random_tensor({40, 300}, 50), random_indices({3000}, 40, 51), 0},  // embedding table
      {"Gather", test::random_tensor({200, 13, 9}, 52), random_indices({40, 17}, 13, 53), 1},
      {"Gather", test::random_tensor({600, 5}, 54), random_indices({31}, 5, 55), -1},
      {"GatherElements", test::random_tensor({300, 11, 7}, 56), random_indices({300, 40, 7}, 11, 57), 1},
  };
  for (const Case& c : cases) {
    INFO(c.op << " axis " << c.axis << " data " << shape_str(c.data.shape()));
    const std::vector<Attribute> attrs = {Attribute::make_int("axis", c.axis)};
    o.threads = 1;
    const std::vector<Tensor> one = test::node_gradients(c.op, {c.data, c.indices}, attrs, o);
    o.threads = 3;
    const std::vector<Tensor> three = test::node_gradients(c.op, {c.data, c.indices}, attrs, o);
    REQUIRE(one[0].defined());
    CHECK(one[0].dtype() == DType::Float32);
    CHECK(bit_identical(one[0], three[0]));
    CHECK_FALSE(one[1].defined());
  }
}

TEST_CASE("Gather backward refuses indices it cannot write through, naming the node", "[train][grad]") {
  const Tensor x = test::random_tensor({5, 4}, 70);
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
  const Tensor g2 = test::random_tensor({2, 4}, 71);
  refused([&] { test::call_backward("Gather", 13, {x, Tensor::from<int64_t>({2}, {1, 5})}, {g2}); }, "out of range");
  refused([&] { test::call_backward("Gather", 13, {x, Tensor::from<int64_t>({2}, {-6, 0})}, {g2}); }, "out of range");
  refused([&] { test::call_backward("Gather", 13, {x, Tensor::from<float>({2}, {1, 2})}, {g2}); }, "int32 or int64");
  refused([&] {
    test::call_backward("Gather", 13, {x, Tensor::from<int64_t>({2}, {1, 2})}, {g2}, {Attribute::make_int("axis", 2)});
  }, "out of range");
  refused([&] {
    test::call_backward("GatherElements", 13, {x, Tensor::from<int64_t>({1, 2}, {0, 4})}, {test::random_tensor({1, 2}, 72)},
                        {Attribute::make_int("axis", 1)});
  }, "out of range");
  refused([&] {
    test::call_backward("GatherElements", 13, {x, Tensor::from<int64_t>({6, 1}, {0, 0, 0, 0, 0, 0})},
                        {test::random_tensor({6, 1}, 73)}, {Attribute::make_int("axis", 1)});
  }, "exceed data");
  refused([&] {
    test::call_backward("GatherElements", 13, {x, Tensor::from<int64_t>({2}, {0, 1})}, {test::random_tensor({2}, 74)});
  }, "rank of data");
}

TEST_CASE("Only the data input of the indexing ops is differentiable", "[train][grad]") {
  for (const char* op : {"Gather", "GatherElements"}) {
    INFO(op);
    const train::GradDef* def = train::GradRegistry::global().find("", op, 13, rt::BackendKind::CPU);
    REQUIRE(def != nullptr);
    CHECK(def->differentiable == train::bit(0));
    CHECK(def->saved_inputs == train::bit(1));  // the indices, nothing large
  }
}
