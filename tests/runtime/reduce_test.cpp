// Reductions (reduce.cpp) against naive references: every Reduce* op over every subset of axes of
// an odd 4-D shape, with and without keepdims, axes as attribute (old opsets) and as input (new
// opsets), noop_with_empty_axes, empty-set reductions, large tensors (split over threads), the
// integer types and NaN; ArgMax/ArgMin with ties and select_last_index; CumSum in all modes; and
// malformed nodes.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;

namespace {

using Attrs = std::vector<ir::Attribute>;

std::vector<Tensor> run_node(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs, int opset,
                             int threads = 3) {
  return test::run_node(op, inputs, attrs, 1, opset, threads);
}

Tensor run1(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs, int opset) {
  return run_node(op, inputs, attrs, opset).at(0);
}

Tensor ints(const std::vector<int64_t>& v) { return Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v); }

struct RefOp {
  std::string name;
  double init;
  std::function<double(double, double)> step;              // acc, x -> acc
  std::function<double(double, int64_t, double)> finish;  // acc, count, max -> y
};

std::vector<RefOp> ref_ops() {
  const double inf = std::numeric_limits<double>::infinity();
  auto id = [](double a, int64_t, double) { return a; };
  return {
      {"ReduceSum", 0, [](double a, double x) { return a + x; }, id},
      {"ReduceMean", 0, [](double a, double x) { return a + x; }, [](double a, int64_t n, double) { return a / double(n); }},
      {"ReduceMax", -inf, [](double a, double x) { return std::max(a, x); }, id},
      {"ReduceMin", inf, [](double a, double x) { return std::min(a, x); }, id},
      {"ReduceProd", 1, [](double a, double x) { return a * x; }, id},
      {"ReduceL1", 0, [](double a, double x) { return a + std::fabs(x); }, id},
      {"ReduceL2", 0, [](double a, double x) { return a + x * x; }, [](double a, int64_t, double) { return std::sqrt(a); }},
      {"ReduceLogSum", 0, [](double a, double x) { return a + x; }, [](double a, int64_t, double) { return std::log(a); }},
      {"ReduceLogSumExp", 0, [](double a, double x) { return a + std::exp(x); },
       [](double a, int64_t, double) { return std::log(a); }},
      {"ReduceSumSquare", 0, [](double a, double x) { return a + x * x; }, id},
  };
}

// Naive reduction: output index of every input element from the kept coordinates.
std::vector<double> reduce_ref(const RefOp& op, const Tensor& x, const std::vector<bool>& red) {
  const Shape& s = x.shape();
  int64_t outputs = 1, count = 1;
  for (size_t d = 0; d < s.size(); ++d) (red[d] ? count : outputs) *= s[d];
  std::vector<double> acc(static_cast<size_t>(outputs), op.init);
  std::vector<int64_t> idx(s.size(), 0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t o = 0;
    for (size_t d = 0; d < s.size(); ++d)
      if (!red[d]) o = o * s[d] + idx[d];
    acc[static_cast<size_t>(o)] = op.step(acc[static_cast<size_t>(o)], x.get_double(i));
    for (size_t d = s.size(); d-- > 0;) {
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
    }
  }
  for (double& a : acc) a = op.finish(a, count, 0);
  return acc;
}

Shape reduced_shape(const Shape& s, const std::vector<bool>& red, bool keepdims) {
  Shape out;
  for (size_t d = 0; d < s.size(); ++d) {
    if (!red[d]) out.push_back(s[d]);
    else if (keepdims) out.push_back(1);
  }
  return out;
}

void check_close(const Tensor& got, const std::vector<double>& want, double rtol, double atol, const std::string& what) {
  INFO(what);
  REQUIRE(static_cast<size_t>(got.numel()) == want.size());
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.get_double(i), b = want[static_cast<size_t>(i)];
    bool ok;
    if (std::isnan(b)) ok = std::isnan(a);
    else if (std::isinf(b)) ok = a == b;
    else ok = std::fabs(a - b) <= atol + rtol * std::fabs(b);
    if (!ok && bad++ < 5) UNSCOPED_INFO("element " << i << ": got " << a << " want " << b);
  }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("Reduce* over every subset of axes, axes as input (opset 18)", "[reduce]") {
  const Shape shape = {3, 4, 5, 6};
  // Positive values keep ReduceLogSum defined; the range keeps ReduceProd finite.
  const Tensor x = test::random_tensor(shape, 41, 0.5f, 1.5f);
  for (const RefOp& op : ref_ops()) {
    for (int mask = 0; mask < 16; ++mask) {
      std::vector<bool> red(4);
      std::vector<int64_t> axes;
      for (int d = 0; d < 4; ++d)
        if (mask & (1 << d)) {
          red[static_cast<size_t>(d)] = true;
          axes.push_back(d % 2 ? d - 4 : d);  // mix negative and positive axes
        }
      if (axes.empty()) red.assign(4, true);  // no axes: reduce everything
      for (int keep = 0; keep < 2; ++keep) {
        std::vector<Tensor> ins = {x};
        if (!axes.empty()) ins.push_back(ints(axes));
        const Tensor y = run1(op.name, ins, {ir::Attribute::make_int("keepdims", keep)}, 18);
        REQUIRE(y.shape() == reduced_shape(shape, red, keep));
        check_close(y, reduce_ref(op, x, red), 2e-6, 1e-6, op.name + " mask " + std::to_string(mask));
      }
    }
  }
}

TEST_CASE("Reduce* with axes as attribute (old opsets)", "[reduce]") {
  const Tensor x = test::random_tensor({5, 3, 7}, 42, 0.5f, 1.5f);
  for (const RefOp& op : ref_ops()) {
    const int opset = op.name == "ReduceSum" ? 11 : 13;
    const Tensor y = run1(op.name, {x}, {ir::Attribute::make_ints("axes", {0, 2})}, opset);
    REQUIRE(y.shape() == Shape({1, 3, 1}));
    check_close(y, reduce_ref(op, x, {true, false, true}), 2e-6, 1e-6, op.name + " attribute axes");
    const Tensor z = run1(op.name, {x}, {ir::Attribute::make_ints("axes", {-2}), ir::Attribute::make_int("keepdims", 0)}, opset);
    REQUIRE(z.shape() == Shape({5, 7}));
    check_close(z, reduce_ref(op, x, {false, true, false}), 2e-6, 1e-6, op.name + " attribute axis -2");
  }
}

TEST_CASE("noop_with_empty_axes and empty axes", "[reduce]") {
  const Tensor x = test::random_tensor({3, 4}, 43, -1, 1);
  const Tensor same = run1("ReduceSum", {x, ints({})}, {ir::Attribute::make_int("noop_with_empty_axes", 1)}, 13);
  REQUIRE(same.shape() == x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) CHECK(same.data<float>()[i] == x.data<float>()[i]);
  const Tensor sq = run1("ReduceSumSquare", {x}, {ir::Attribute::make_int("noop_with_empty_axes", 1)}, 18);
  for (int64_t i = 0; i < x.numel(); ++i) CHECK(sq.data<float>()[i] == x.data<float>()[i] * x.data<float>()[i]);
  // Empty axes without noop reduce everything.
  const Tensor all = run1("ReduceSum", {x, ints({})}, {ir::Attribute::make_int("keepdims", 0)}, 13);
  REQUIRE(all.shape() == Shape{});
  double s = 0;
  for (int64_t i = 0; i < x.numel(); ++i) s += x.data<float>()[i];
  CHECK(all.data<float>()[0] == Approx(s).margin(1e-6));
}

TEST_CASE("reductions of an empty set give the identity", "[reduce]") {
  const Tensor x(DType::Float32, {2, 0, 3});
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const std::vector<std::pair<std::string, double>> cases = {
      {"ReduceSum", 0},        {"ReduceProd", 1},     {"ReduceMax", -inf},  {"ReduceMin", inf},
      {"ReduceMean", nan},     {"ReduceL1", 0},       {"ReduceL2", 0},      {"ReduceSumSquare", 0},
      {"ReduceLogSum", -inf},  {"ReduceLogSumExp", -inf}};
  for (const auto& [op, v] : cases) {
    const Tensor y = run1(op, {x, ints({1})}, {}, 18);
    REQUIRE(y.shape() == Shape({2, 1, 3}));
    check_close(y, std::vector<double>(6, v), 0, 0, op + " of an empty set");
  }
  // Reducing over a non-empty axis of an empty tensor gives an empty result.
  const Tensor e = run1("ReduceSum", {x, ints({0})}, {ir::Attribute::make_int("keepdims", 0)}, 18);
  CHECK(e.shape() == Shape({0, 3}));
}

TEST_CASE("large reductions split over threads", "[reduce]") {
  const Tensor x = test::random_tensor({300007}, 44, -1, 1);
  for (const char* name : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2", "ReduceLogSumExp"}) {
    for (const RefOp& op : ref_ops()) {
      if (op.name != name) continue;
      check_close(run1(name, {x}, {}, 18), reduce_ref(op, x, {true}), 1e-5, 1e-5, std::string(name) + " of 300007");
    }
  }
  // Kept inner dimension wider than one chunk, reduced outer dimension.
  const Tensor w = test::random_tensor({37, 1100}, 45, -1, 1);
  for (const RefOp& op : ref_ops()) {
    if (op.name != "ReduceSum" && op.name != "ReduceMax") continue;
    check_close(run1(op.name, {w, ints({0})}, {}, 18), reduce_ref(op, w, {true, false}), 1e-5, 1e-5, op.name + " wide columns");
  }
}

TEST_CASE("reductions on integer types and NaN", "[reduce]") {
  const Tensor xi = Tensor::from<int32_t>({2, 3}, {1, -7, 3, 4, 5, -6});
  const Tensor s = run1("ReduceSum", {xi, ints({1})}, {ir::Attribute::make_int("keepdims", 0)}, 13);
  REQUIRE(s.dtype() == DType::Int32);
  CHECK(s.data<int32_t>()[0] == -3);
  CHECK(s.data<int32_t>()[1] == 3);
  const Tensor mx = run1("ReduceMax", {xi}, {ir::Attribute::make_ints("axes", {0}), ir::Attribute::make_int("keepdims", 0)}, 13);
  CHECK(mx.data<int32_t>()[0] == 4);
  CHECK(mx.data<int32_t>()[1] == 5);
  CHECK(mx.data<int32_t>()[2] == 3);
  const Tensor mean = run1("ReduceMean", {xi, ints({0})}, {ir::Attribute::make_int("keepdims", 0)}, 18);
  CHECK(mean.data<int32_t>()[2] == -1);  // (3 - 6) / 2 truncates
  const Tensor u8 = Tensor::from<uint8_t>({4}, {3, 250, 7, 0});
  CHECK(run1("ReduceMin", {u8}, {}, 18).data<uint8_t>()[0] == 0);
  CHECK(run1("ReduceMax", {u8}, {}, 18).data<uint8_t>()[0] == 250);
  const Tensor i64 = Tensor::from<int64_t>({3}, {3, 4, 5});
  CHECK(run1("ReduceProd", {i64}, {}, 18).data<int64_t>()[0] == 60);
  CHECK(run1("ReduceSumSquare", {i64}, {}, 18).data<int64_t>()[0] == 50);
  // NaN propagates through max/min and sums.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor xn = Tensor::from<float>({2, 20}, std::vector<float>(40, 1.0f));
  Tensor xm = xn.clone();
  xm.data<float>()[13] = nan;
  for (const char* op : {"ReduceMax", "ReduceMin", "ReduceSum"}) {
    const Tensor y = run1(op, {xm, ints({1})}, {}, 18);
    CHECK(std::isnan(y.data<float>()[0]));
    CHECK(y.data<float>()[1] == (std::string(op) == "ReduceSum" ? 20.0f : 1.0f));
  }
}

TEST_CASE("ReduceMax / ReduceMin on bool are any / all", "[reduce]") {
  const Tensor b = Tensor::from<bool>({2, 3}, {true, false, true, false, false, false});
  const Tensor any = run1("ReduceMax", {b, ints({1})}, {ir::Attribute::make_int("keepdims", 0)}, 20);
  const Tensor all = run1("ReduceMin", {b, ints({0})}, {ir::Attribute::make_int("keepdims", 0)}, 20);
  REQUIRE(any.dtype() == DType::Bool);
  CHECK(any.data<bool>()[0]);
  CHECK(!any.data<bool>()[1]);
  CHECK(!all.data<bool>()[0]);
  CHECK(!all.data<bool>()[2]);
  CHECK(run1("ReduceMin", {Tensor::from<bool>({2}, {true, true})}, {}, 20).data<bool>()[0]);
  CHECK_THROWS_AS(run1("ReduceSum", {b}, {}, 20), Error);
}

TEST_CASE("float64 reductions", "[reduce]") {
  const Tensor x = test::random_tensor({4, 7, 3}, 46, 0.5f, 1.5f).cast_to(DType::Float64);
  for (const RefOp& op : ref_ops()) {
    const Tensor y = run1(op.name, {x, ints({0, 2})}, {}, 18);
    REQUIRE(y.dtype() == DType::Float64);
    check_close(y, reduce_ref(op, x, {true, false, true}), 1e-13, 1e-13, op.name + " float64");
  }
}

TEST_CASE("ArgMax and ArgMin", "[reduce]") {
  // Small integer values make ties common.
  std::mt19937 rng(47);
  const Shape shape = {3, 4, 5};
  Tensor x(DType::Float32, shape);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(rng() % 4);
  for (const char* op : {"ArgMax", "ArgMin"}) {
    const bool is_max = std::string(op) == "ArgMax";
    for (int axis = -3; axis < 3; ++axis) {
      const int a = axis < 0 ? axis + 3 : axis;
      for (int last = 0; last < 2; ++last)
        for (int keep = 0; keep < 2; ++keep) {
          const Tensor y = run1(op, {x}, {ir::Attribute::make_int("axis", axis), ir::Attribute::make_int("keepdims", keep),
                                          ir::Attribute::make_int("select_last_index", last)},
                                13);
          REQUIRE(y.dtype() == DType::Int64);
          std::vector<bool> red(3, false);
          red[static_cast<size_t>(a)] = true;
          REQUIRE(y.shape() == reduced_shape(shape, red, keep));
          int64_t outer = 1, inner = 1;
          for (int i = 0; i < a; ++i) outer *= shape[static_cast<size_t>(i)];
          for (int i = a + 1; i < 3; ++i) inner *= shape[static_cast<size_t>(i)];
          const int64_t n = shape[static_cast<size_t>(a)];
          int64_t bad = 0;
          for (int64_t o = 0; o < outer; ++o)
            for (int64_t j = 0; j < inner; ++j) {
              int64_t best = 0;
              for (int64_t k = 1; k < n; ++k) {
                const float v = x.data<float>()[(o * n + k) * inner + j];
                const float b = x.data<float>()[(o * n + best) * inner + j];
                const bool better = is_max ? (last ? v >= b : v > b) : (last ? v <= b : v < b);
                if (better) best = k;
              }
              if (y.data<int64_t>()[o * inner + j] != best) ++bad;
            }
          INFO(op << " axis " << axis << " last " << last);
          CHECK(bad == 0);
        }
    }
  }
  // NaN wins, as in numpy: the first NaN (or the last one with select_last_index).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor xn = Tensor::from<float>({2, 4}, {1, nan, 3, nan, 5, 2, 5, 1});
  for (const char* op : {"ArgMax", "ArgMin"}) {
    const Tensor first = run1(op, {xn}, {ir::Attribute::make_int("axis", 1)}, 13);
    const Tensor lastn = run1(op, {xn}, {ir::Attribute::make_int("axis", 1), ir::Attribute::make_int("select_last_index", 1)}, 13);
    CHECK(first.data<int64_t>()[0] == 1);
    CHECK(lastn.data<int64_t>()[0] == 3);
    const bool is_max = std::string(op) == "ArgMax";
    CHECK(first.data<int64_t>()[1] == (is_max ? 0 : 3));
    CHECK(lastn.data<int64_t>()[1] == (is_max ? 2 : 3));
  }
  // Column blocks wider than one chunk, int8 input.
  Tensor w(DType::Int8, {3, 700});
  for (int64_t i = 0; i < w.numel(); ++i) w.data<int8_t>()[i] = static_cast<int8_t>(rng() % 256 - 128);
  const Tensor y = run1("ArgMax", {w}, {ir::Attribute::make_int("keepdims", 0)}, 13);
  int64_t bad = 0;
  for (int64_t j = 0; j < 700; ++j) {
    int64_t best = 0;
    for (int64_t k = 1; k < 3; ++k)
      if (w.data<int8_t>()[k * 700 + j] > w.data<int8_t>()[best * 700 + j]) best = k;
    if (y.data<int64_t>()[j] != best) ++bad;
  }
  CHECK(bad == 0);
}

TEST_CASE("CumSum in every mode", "[reduce]") {
  const Shape shape = {3, 4, 5};
  const Tensor x = test::random_tensor(shape, 48, -1, 1);
  for (int axis = -3; axis < 3; ++axis) {
    const int a = axis < 0 ? axis + 3 : axis;
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < a; ++i) outer *= shape[static_cast<size_t>(i)];
    for (int i = a + 1; i < 3; ++i) inner *= shape[static_cast<size_t>(i)];
    const int64_t n = shape[static_cast<size_t>(a)];
    for (int excl = 0; excl < 2; ++excl)
      for (int rev = 0; rev < 2; ++rev) {
        const Tensor axis_t = (axis % 2) ? Tensor::scalar<int32_t>(axis) : Tensor::scalar<int64_t>(axis);
        const Tensor y = run1("CumSum", {x, axis_t}, {ir::Attribute::make_int("exclusive", excl), ir::Attribute::make_int("reverse", rev)}, 14);
        std::vector<double> want(static_cast<size_t>(x.numel()));
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t j = 0; j < inner; ++j) {
            double acc = 0;
            for (int64_t s = 0; s < n; ++s) {
              const int64_t k = rev ? n - 1 - s : s;
              const int64_t i = (o * n + k) * inner + j;
              if (excl) {
                want[static_cast<size_t>(i)] = acc;
                acc += x.get_double(i);
              } else {
                acc += x.get_double(i);
                want[static_cast<size_t>(i)] = acc;
              }
            }
          }
        check_close(y, want, 1e-5, 1e-6, "CumSum axis " + std::to_string(axis) + " exclusive " + std::to_string(excl) + " reverse " + std::to_string(rev));
      }
  }
  const Tensor yi = run1("CumSum", {Tensor::from<int64_t>({4}, {1, 2, 3, 4}), Tensor::scalar<int64_t>(0)}, {}, 14);
  CHECK(yi.data<int64_t>()[3] == 10);
  CHECK(yi.data<int64_t>()[1] == 3);
}

TEST_CASE("reductions reject bad nodes", "[reduce]") {
  const Tensor x = test::random_tensor({2, 3}, 1);
  CHECK_THROWS_AS(run1("ReduceSum", {x, ints({1, -1})}, {}, 13), Error);
  CHECK_THROWS_AS(run1("ReduceMean", {x, ints({2})}, {}, 18), Error);
  CHECK_THROWS_AS(run1("ReduceMax", {x}, {ir::Attribute::make_ints("axes", {-3})}, 13), Error);
  CHECK_THROWS_AS(run1("ReduceSum", {x, Tensor::from<float>({1}, {0.0f})}, {}, 13), Error);
  CHECK_THROWS_AS(run1("ReduceSum", {Tensor::from<bool>({1}, {true})}, {}, 13), Error);
  CHECK_THROWS_AS(run1("ArgMax", {x}, {ir::Attribute::make_int("axis", 2)}, 13), Error);
  CHECK_THROWS_AS(run1("ArgMin", {Tensor(DType::Float32, {2, 0})}, {ir::Attribute::make_int("axis", 1)}, 13), Error);
  CHECK_THROWS_AS(run1("CumSum", {x, ints({0, 1})}, {}, 14), Error);
  CHECK_THROWS_AS(run1("CumSum", {x, Tensor::scalar<int64_t>(2)}, {}, 14), Error);
  CHECK_THROWS_AS(run1("CumSum", {x, Tensor::scalar<float>(0.0f)}, {}, 14), Error);
}
