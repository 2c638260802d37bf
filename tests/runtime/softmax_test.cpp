// Softmax, LogSoftmax and Hardmax (softmax.cpp) against a naive double reference: both axis
// semantics (opset < 13 flattens the trailing block, opset >= 13 normalises one axis), every axis
// of odd shapes, rows and column blocks wider than one chunk, large inputs (stability), float64,
// ties in Hardmax and malformed nodes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "runtime/cpu/unary.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;

namespace {

using Attrs = std::vector<ir::Attribute>;

Tensor run1(const std::string& op, const Tensor& x, const Attrs& attrs, int opset, int threads = 3) {
  ir::Model m;
  m.set_opset("", opset);
  ir::Graph* g = m.graph.get();
  ir::Value* in = g->add_value("x", ir::ValueType::tensor(x.dtype(), x.shape()));
  g->add_input(in);
  ir::Value* out = g->add_value("y");
  g->add_output(out);
  ir::Node* n = g->add_node(op, {in}, {out}, "node_under_test");
  for (const auto& a : attrs) n->set_attr(a);
  rt::ExecOptions opt;
  opt.threads = threads;
  rt::Executor ex(m, opt);
  return ex.run({{"x", x}}).at(0);
}

// Reference over the [outer, n, inner] view: normalise every (outer, inner) column of n values.
std::vector<double> reference(const std::string& op, const Tensor& x, int64_t outer, int64_t n, int64_t inner) {
  std::vector<double> y(static_cast<size_t>(x.numel()));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      auto at = [&](int64_t k) { return (o * n + k) * inner + j; };
      double m = -std::numeric_limits<double>::infinity();
      int64_t arg = 0;
      for (int64_t k = 0; k < n; ++k)
        if (x.get_double(at(k)) > m) {
          m = x.get_double(at(k));
          arg = k;
        }
      double s = 0;
      for (int64_t k = 0; k < n; ++k) s += std::exp(x.get_double(at(k)) - m);
      for (int64_t k = 0; k < n; ++k) {
        const double v = x.get_double(at(k));
        double r;
        if (op == "Softmax") r = std::exp(v - m) / s;
        else if (op == "LogSoftmax") r = v - m - std::log(s);
        else r = k == arg ? 1.0 : 0.0;
        y[static_cast<size_t>(at(k))] = r;
      }
    }
  return y;
}

void check_close(const Tensor& got, const std::vector<double>& want, double tol, const std::string& what) {
  INFO(what);
  REQUIRE(static_cast<size_t>(got.numel()) == want.size());
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.get_double(i), b = want[static_cast<size_t>(i)];
    if (!(std::fabs(a - b) <= tol * (1 + std::fabs(b)))) {
      if (bad++ < 5) UNSCOPED_INFO("element " << i << ": got " << a << " want " << b);
    }
  }
  CHECK(bad == 0);
}

const char* kOps[] = {"Softmax", "LogSoftmax", "Hardmax"};

}  // namespace

TEST_CASE("softmax family, opset 13: one axis", "[softmax]") {
  const Shape shape = {3, 5, 7};
  const Tensor x = test::random_tensor(shape, 31, -4, 4);
  for (const char* op : kOps) {
    for (int axis = -3; axis < 3; ++axis) {
      const int a = axis < 0 ? axis + 3 : axis;
      int64_t outer = 1, inner = 1;
      for (int i = 0; i < a; ++i) outer *= shape[static_cast<size_t>(i)];
      for (int i = a + 1; i < 3; ++i) inner *= shape[static_cast<size_t>(i)];
      const Tensor y = run1(op, x, {ir::Attribute::make_int("axis", axis)}, 13);
      REQUIRE(y.shape() == shape);
      check_close(y, reference(op, x, outer, shape[static_cast<size_t>(a)], inner), 2e-6,
                  std::string(op) + " axis " + std::to_string(axis));
    }
    // Default axis is -1.
    check_close(run1(op, x, {}, 13), reference(op, x, 15, 7, 1), 2e-6, std::string(op) + " default axis");
  }
}

TEST_CASE("softmax family, opset < 13: flattened trailing block", "[softmax]") {
  const Shape shape = {3, 5, 7};
  const Tensor x = test::random_tensor(shape, 32, -4, 4);
  for (const char* op : kOps) {
    for (int axis = 0; axis < 3; ++axis) {
      int64_t outer = 1;
      for (int i = 0; i < axis; ++i) outer *= shape[static_cast<size_t>(i)];
      const Tensor y = run1(op, x, {ir::Attribute::make_int("axis", axis)}, 11);
      check_close(y, reference(op, x, outer, 105 / outer, 1), 2e-6, std::string(op) + " legacy axis " + std::to_string(axis));
    }
    // Default axis is 1: rows of 35.
    check_close(run1(op, x, {}, 11), reference(op, x, 3, 35, 1), 2e-6, std::string(op) + " legacy default axis");
    check_close(run1(op, x, {ir::Attribute::make_int("axis", -1)}, 11), reference(op, x, 15, 7, 1), 2e-6,
                std::string(op) + " legacy axis -1");
  }
}

TEST_CASE("softmax family on wide rows and column blocks, in parallel", "[softmax]") {
  // Rows longer than a lane block, many rows (parallel), and inner > one chunk of 256 columns.
  const Tensor rows = test::random_tensor({67, 1001}, 33, -10, 10);
  const Tensor cols = test::random_tensor({2, 9, 601}, 34, -10, 10);
  for (const char* op : kOps) {
    check_close(run1(op, rows, {}, 13), reference(op, rows, 67, 1001, 1), 2e-6, std::string(op) + " wide rows");
    check_close(run1(op, cols, {ir::Attribute::make_int("axis", 1)}, 13), reference(op, cols, 2, 9, 601), 2e-6,
                std::string(op) + " column blocks");
  }
}

TEST_CASE("softmax is stable for large inputs and exact in float64", "[softmax]") {
  const Tensor big = Tensor::from<float>({2, 4}, {1000, 1001, 1002, 1003, -1000, -2000, 3000, 0});
  check_close(run1("Softmax", big, {}, 13), reference("Softmax", big, 2, 4, 1), 1e-6, "large Softmax");
  check_close(run1("LogSoftmax", big, {}, 13), reference("LogSoftmax", big, 2, 4, 1), 1e-6, "large LogSoftmax");
  const Tensor xd = test::random_tensor({4, 6, 5}, 35, -3, 3).cast_to(DType::Float64);
  for (const char* op : kOps) {
    const Tensor y = run1(op, xd, {ir::Attribute::make_int("axis", 1)}, 13);
    REQUIRE(y.dtype() == DType::Float64);
    check_close(y, reference(op, xd, 4, 6, 5), 1e-13, std::string(op) + " float64");
  }
}

TEST_CASE("Hardmax picks the first of tied maxima", "[softmax]") {
  const Tensor x = Tensor::from<float>({2, 4}, {1, 3, 3, 2, 5, 5, 5, 5});
  const Tensor y = run1("Hardmax", x, {}, 13);
  const std::vector<float> want = {0, 1, 0, 0, 1, 0, 0, 0};
  for (int64_t i = 0; i < 8; ++i) CHECK(y.data<float>()[i] == want[static_cast<size_t>(i)]);
  const Tensor xt = x.reshaped({2, 4, 1});
  const Tensor yt = run1("Hardmax", Tensor::from<float>({4, 2}, {1, 5, 3, 5, 3, 5, 2, 5}), {ir::Attribute::make_int("axis", 0)}, 13);
  const std::vector<float> want_t = {0, 1, 1, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < 8; ++i) CHECK(yt.data<float>()[i] == want_t[static_cast<size_t>(i)]);
  CHECK(xt.numel() == 8);
}

TEST_CASE("softmax family on empty tensors", "[softmax]") {
  for (const char* op : kOps) {
    CHECK(run1(op, Tensor(DType::Float32, {2, 0}), {}, 13).shape() == Shape({2, 0}));
    CHECK(run1(op, Tensor(DType::Float32, {0, 4}), {}, 11).shape() == Shape({0, 4}));
  }
}

TEST_CASE("softmax family rejects bad nodes", "[softmax]") {
  const Tensor x = test::random_tensor({2, 3}, 1);
  CHECK_THROWS_AS(run1("Softmax", x, {ir::Attribute::make_int("axis", 2)}, 13), Error);
  CHECK_THROWS_AS(run1("LogSoftmax", x, {ir::Attribute::make_int("axis", -3)}, 13), Error);
  CHECK_THROWS_AS(run1("Hardmax", x, {ir::Attribute::make_int("axis", 5)}, 11), Error);
  CHECK_THROWS_AS(run1("Softmax", Tensor::from<int32_t>({2}, {1, 2}), {}, 13), Error);
}

TEST_CASE("Softmax gives the same bits built for SSE2, AVX2 and AVX-512", "[softmax]") {
  struct Reset {
    ~Reset() { rt::cpu::force_unary_isa(rt::cpu::UnaryIsa::Auto); }
  } reset;
  // Attention-like short rows (16, 17, 64 tokens), an odd row length with a vector tail and rows
  // shorter than a vector; the row passes and the exp are built for each ISA (softmax.cpp). Inputs
  // spread over exp's whole range, large negatives (underflow to 0) included.
  for (const Shape& shape : {Shape{3, 4, 16, 16}, Shape{2, 4, 17, 17}, Shape{2, 64, 64}, Shape{5, 7, 37}, Shape{6, 3}}) {
    const Tensor x = test::random_tensor(shape, 90, -120, 40);
    std::vector<Tensor> outs;
    for (const rt::cpu::UnaryIsa isa : {rt::cpu::UnaryIsa::Baseline, rt::cpu::UnaryIsa::Avx2, rt::cpu::UnaryIsa::Avx512}) {
      if (rt::cpu::force_unary_isa(isa) != isa) WARN("this CPU lacks unary ISA " << static_cast<int>(isa));
      for (const char* op : {"Softmax", "LogSoftmax"}) outs.push_back(run1(op, x, {}, 13, 1));
    }
    for (size_t k = 2; k < outs.size(); ++k) {
      INFO("shape " << shape_str(shape) << ", output " << k);
      const Tensor& want = outs[k % 2];
      REQUIRE(outs[k].nbytes() == want.nbytes());
      CHECK(std::memcmp(outs[k].raw_data(), want.raw_data(), want.nbytes()) == 0);
    }
  }
}
