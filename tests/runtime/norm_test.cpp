// Normalisation kernels (norm.cpp) against naive double references on odd shapes with fixed
// seeds: BatchNormalization (inference for several ranks, the old per-feature form, training mode
// with its running statistics), LayerNormalization (every axis, optional outputs, broadcast
// scale), InstanceNormalization, GroupNormalization (opset 18 and 21 parameter layouts),
// LpNormalization and MeanVarianceNormalization, plus malformed nodes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/cpu/unary.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;

namespace {

using Attrs = std::vector<ir::Attribute>;

std::vector<Tensor> run_node(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                             size_t n_outputs, int opset, int threads = 3) {
  return test::run_node(op, inputs, attrs, n_outputs, opset, threads);
}

Tensor run1(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs, int opset) {
  return run_node(op, inputs, attrs, 1, opset).at(0);
}

void check_close(const Tensor& got, const std::vector<double>& want, double tol, const std::string& what) {
  INFO(what);
  REQUIRE(static_cast<size_t>(got.numel()) == want.size());
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.get_double(i), b = want[static_cast<size_t>(i)];
    if (!(std::fabs(a - b) <= tol * (1 + std::fabs(b))))
      if (bad++ < 5) UNSCOPED_INFO("element " << i << ": got " << a << " want " << b);
  }
  CHECK(bad == 0);
}

// Mean and population variance of x[idx] over the given element indices.
void stats(const Tensor& x, const std::vector<int64_t>& idx, double& mean, double& var) {
  mean = 0;
  for (int64_t i : idx) mean += x.get_double(i);
  mean /= double(idx.size());
  var = 0;
  for (int64_t i : idx) var += (x.get_double(i) - mean) * (x.get_double(i) - mean);
  var /= double(idx.size());
}

}  // namespace

TEST_CASE("BatchNormalization inference", "[norm]") {
  for (const Shape& shape : {Shape{2, 3, 5, 7}, Shape{4, 3}, Shape{2, 3, 9}, Shape{1, 3, 2, 3, 4}}) {
    const int64_t C = 3;
    const Tensor x = test::random_tensor(shape, 51, -3, 3);
    const Tensor scale = test::random_tensor({C}, 52, 0.5f, 2);
    const Tensor bias = test::random_tensor({C}, 53, -1, 1);
    const Tensor mean = test::random_tensor({C}, 54, -1, 1);
    const Tensor var = test::random_tensor({C}, 55, 0.1f, 2);
    const int64_t S = x.numel() / (shape[0] * C);
    std::vector<double> want(static_cast<size_t>(x.numel()));
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t c = (i / S) % C;
      want[static_cast<size_t>(i)] = (x.get_double(i) - mean.get_double(c)) / std::sqrt(var.get_double(c) + 1e-3) *
                                         scale.get_double(c) + bias.get_double(c);
    }
    for (int opset : {7, 9, 15}) {
      const Tensor y = run1("BatchNormalization", {x, scale, bias, mean, var}, {ir::Attribute::make_float("epsilon", 1e-3f)}, opset);
      REQUIRE(y.shape() == shape);
      check_close(y, want, 2e-6, "BatchNormalization " + shape_str(shape) + " opset " + std::to_string(opset));
    }
  }
  // Opset < 9 with spatial=0: one parameter per (channel, position).
  const Tensor x = test::random_tensor({2, 3, 4}, 56, -3, 3);
  const Tensor p1 = test::random_tensor({3, 4}, 57, 0.5f, 2), p2 = test::random_tensor({3, 4}, 58, -1, 1);
  const Tensor p3 = test::random_tensor({3, 4}, 59, -1, 1), p4 = test::random_tensor({3, 4}, 60, 0.1f, 2);
  const Tensor y = run1("BatchNormalization", {x, p1, p2, p3, p4}, {ir::Attribute::make_int("spatial", 0)}, 7);
  std::vector<double> want(24);
  for (int64_t i = 0; i < 24; ++i) {
    const int64_t f = i % 12;
    want[static_cast<size_t>(i)] = (x.get_double(i) - p3.get_double(f)) / std::sqrt(p4.get_double(f) + 1e-5) * p1.get_double(f) + p2.get_double(f);
  }
  check_close(y, want, 2e-6, "BatchNormalization spatial=0");
}

TEST_CASE("BatchNormalization training mode", "[norm]") {
  const Shape shape = {3, 2, 5};
  const Tensor x = test::random_tensor(shape, 61, -3, 3);
  const Tensor scale = test::random_tensor({2}, 62, 0.5f, 2), bias = test::random_tensor({2}, 63, -1, 1);
  const Tensor mean = test::random_tensor({2}, 64, -1, 1), var = test::random_tensor({2}, 65, 0.1f, 2);
  const auto outs = run_node("BatchNormalization", {x, scale, bias, mean, var},
                             {ir::Attribute::make_int("training_mode", 1), ir::Attribute::make_float("momentum", 0.8f)}, 3, 15);
  std::vector<double> want(30), rmean(2), rvar(2);
  for (int64_t c = 0; c < 2; ++c) {
    std::vector<int64_t> idx;
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t s = 0; s < 5; ++s) idx.push_back((n * 2 + c) * 5 + s);
    double m, v;
    stats(x, idx, m, v);
    for (int64_t i : idx)
      want[static_cast<size_t>(i)] = (x.get_double(i) - m) / std::sqrt(v + 1e-5) * scale.get_double(c) + bias.get_double(c);
    rmean[static_cast<size_t>(c)] = mean.get_double(c) * double(0.8f) + m * (1 - double(0.8f));
    rvar[static_cast<size_t>(c)] = var.get_double(c) * double(0.8f) + v * (1 - double(0.8f));
  }
  check_close(outs[0], want, 2e-6, "training Y");
  check_close(outs[1], rmean, 2e-6, "running mean");
  check_close(outs[2], rvar, 2e-6, "running var");
}

TEST_CASE("LayerNormalization over every axis", "[norm]") {
  const Shape shape = {3, 4, 5};
  const Tensor x = test::random_tensor(shape, 66, -3, 3);
  for (int axis = -3; axis < 3; ++axis) {
    const int a = axis < 0 ? axis + 3 : axis;
    Shape ns(shape.begin() + a, shape.end());
    const int64_t D = shape_numel(ns), rows = x.numel() / D;
    const Tensor scale = test::random_tensor(ns, 67, 0.5f, 2), bias = test::random_tensor(ns, 68, -1, 1);
    const auto outs = run_node("LayerNormalization", {x, scale, bias},
                               {ir::Attribute::make_int("axis", axis), ir::Attribute::make_float("epsilon", 1e-4f)}, 3, 17);
    std::vector<double> want(static_cast<size_t>(x.numel())), wm(static_cast<size_t>(rows)), wi(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int64_t> idx;
      for (int64_t i = 0; i < D; ++i) idx.push_back(r * D + i);
      double m, v;
      stats(x, idx, m, v);
      wm[static_cast<size_t>(r)] = m;
      wi[static_cast<size_t>(r)] = 1 / std::sqrt(v + double(1e-4f));
      for (int64_t i = 0; i < D; ++i)
        want[static_cast<size_t>(r * D + i)] = (x.get_double(r * D + i) - m) * wi[static_cast<size_t>(r)] * scale.get_double(i) + bias.get_double(i);
    }
    check_close(outs[0], want, 2e-6, "LayerNormalization axis " + std::to_string(axis));
    Shape stat_shape(shape.begin(), shape.begin() + a);
    stat_shape.resize(3, 1);
    REQUIRE(outs[1].shape() == stat_shape);
    REQUIRE(outs[2].shape() == stat_shape);
    check_close(outs[1], wm, 2e-6, "LayerNormalization Mean");
    check_close(outs[2], wi, 2e-6, "LayerNormalization InvStdDev");
  }
  // No bias, scale of shape [5] broadcast over a normalised shape [4, 5], wide rows in parallel.
  const Tensor w = test::random_tensor({33, 4, 257}, 69, -2, 2);
  const Tensor scale = test::random_tensor({257}, 70, 0.5f, 2);
  const Tensor y = run1("LayerNormalization", {w, scale}, {ir::Attribute::make_int("axis", 1)}, 17);
  std::vector<double> want(static_cast<size_t>(w.numel()));
  const int64_t D = 4 * 257;
  for (int64_t r = 0; r < 33; ++r) {
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < D; ++i) idx.push_back(r * D + i);
    double m, v;
    stats(w, idx, m, v);
    for (int64_t i = 0; i < D; ++i)
      want[static_cast<size_t>(r * D + i)] = (w.get_double(r * D + i) - m) / std::sqrt(v + double(1e-5f)) * scale.get_double(i % 257);
  }
  check_close(y, want, 2e-6, "LayerNormalization broadcast scale, no bias");
  // A scale and bias with leading ones ([1, 1, 257] over a normalised [257]) are read as they are.
  const Tensor scale3 = scale.reshaped({1, 1, 257});
  const Tensor bias3 = test::random_tensor({1, 257}, 71, -1, 1);
  const Tensor y3 = run1("LayerNormalization", {w, scale3, bias3}, {}, 17);
  std::vector<double> want3(static_cast<size_t>(w.numel()));
  for (int64_t r = 0; r < 33 * 4; ++r) {
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < 257; ++i) idx.push_back(r * 257 + i);
    double m, v;
    stats(w, idx, m, v);
    for (int64_t i = 0; i < 257; ++i)
      want3[static_cast<size_t>(r * 257 + i)] =
          (w.get_double(r * 257 + i) - m) / std::sqrt(v + double(1e-5f)) * scale.get_double(i) + bias3.get_double(i);
  }
  check_close(y3, want3, 2e-6, "LayerNormalization scale and bias with leading ones");
}

TEST_CASE("LayerNormalization gives the same bits built for SSE2, AVX2 and AVX-512", "[norm]") {
  // The float rows run a loop built for each (norm.cpp): rows of a transformer's width, an odd
  // width with a vector tail, rows shorter than one vector; Mean and InvStdDev too.
  struct Reset {
    ~Reset() { rt::cpu::force_unary_isa(rt::cpu::UnaryIsa::Auto); }
  } reset;
  for (const Shape& shape : {Shape{8, 17, 64}, Shape{5, 3, 37}, Shape{9, 7}}) {
    const Tensor x = test::random_tensor(shape, 72, -40, 40);
    const Shape ns = {shape.back()};
    const Tensor scale = test::random_tensor(ns, 73, -2, 2), bias = test::random_tensor(ns, 74, -1, 1);
    std::vector<std::vector<Tensor>> outs;
    for (const auto isa : {rt::cpu::UnaryIsa::Baseline, rt::cpu::UnaryIsa::Avx2, rt::cpu::UnaryIsa::Avx512}) {
      if (rt::cpu::force_unary_isa(isa) != isa) WARN("this CPU lacks unary ISA " << static_cast<int>(isa));
      outs.push_back(run_node("LayerNormalization", {x, scale, bias}, {}, 3, 17));
    }
    for (size_t k = 1; k < outs.size(); ++k)
      for (size_t o = 0; o < 3; ++o) {
        INFO("shape " << shape_str(shape) << ", ISA " << k << ", output " << o);
        REQUIRE(outs[k][o].nbytes() == outs[0][o].nbytes());
        CHECK(std::memcmp(outs[k][o].raw_data(), outs[0][o].raw_data(), outs[0][o].nbytes()) == 0);
      }
  }
}

TEST_CASE("InstanceNormalization and GroupNormalization", "[norm]") {
  const Shape shape = {2, 6, 3, 5};
  const Tensor x = test::random_tensor(shape, 71, -3, 3);
  const int64_t S = 15;
  {
    const Tensor scale = test::random_tensor({6}, 72, 0.5f, 2), bias = test::random_tensor({6}, 73, -1, 1);
    const Tensor y = run1("InstanceNormalization", {x, scale, bias}, {ir::Attribute::make_float("epsilon", 1e-3f)}, 6);
    std::vector<double> want(static_cast<size_t>(x.numel()));
    for (int64_t t = 0; t < 12; ++t) {
      std::vector<int64_t> idx;
      for (int64_t i = 0; i < S; ++i) idx.push_back(t * S + i);
      double m, v;
      stats(x, idx, m, v);
      for (int64_t i : idx)
        want[static_cast<size_t>(i)] = (x.get_double(i) - m) / std::sqrt(v + double(1e-3f)) * scale.get_double(t % 6) + bias.get_double(t % 6);
    }
    check_close(y, want, 2e-6, "InstanceNormalization");
  }
  for (int opset : {18, 21}) {
    const int64_t G = 3, P = opset >= 21 ? 6 : 3;
    const Tensor scale = test::random_tensor({P}, 74, 0.5f, 2), bias = test::random_tensor({P}, 75, -1, 1);
    const Tensor y = run1("GroupNormalization", {x, scale, bias}, {ir::Attribute::make_int("num_groups", G)}, opset);
    std::vector<double> want(static_cast<size_t>(x.numel()));
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t g = 0; g < G; ++g) {
        std::vector<int64_t> idx;
        for (int64_t c = g * 2; c < g * 2 + 2; ++c)
          for (int64_t i = 0; i < S; ++i) idx.push_back((n * 6 + c) * S + i);
        double m, v;
        stats(x, idx, m, v);
        for (int64_t i : idx) {
          const int64_t c = (i / S) % 6;
          const int64_t p = opset >= 21 ? c : g;
          want[static_cast<size_t>(i)] = (x.get_double(i) - m) / std::sqrt(v + double(1e-5f)) * scale.get_double(p) + bias.get_double(p);
        }
      }
    check_close(y, want, 2e-6, "GroupNormalization opset " + std::to_string(opset));
  }
}

TEST_CASE("LpNormalization and MeanVarianceNormalization", "[norm]") {
  const Shape shape = {3, 4, 5};
  Tensor x = test::random_tensor(shape, 76, -3, 3);
  for (int64_t i = 0; i < 4; ++i) x.data<float>()[i * 5] = 0.0f;  // a zero column along axis 1 for [0, :, 0]
  for (int64_t p : {1, 2})
    for (int axis = -3; axis < 3; ++axis) {
      const int a = axis < 0 ? axis + 3 : axis;
      int64_t outer = 1, inner = 1;
      for (int i = 0; i < a; ++i) outer *= shape[static_cast<size_t>(i)];
      for (int i = a + 1; i < 3; ++i) inner *= shape[static_cast<size_t>(i)];
      const int64_t n = shape[static_cast<size_t>(a)];
      const Tensor y = run1("LpNormalization", {x}, {ir::Attribute::make_int("axis", axis), ir::Attribute::make_int("p", p)}, 1);
      std::vector<double> want(static_cast<size_t>(x.numel()));
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t j = 0; j < inner; ++j) {
          double norm = 0;
          for (int64_t k = 0; k < n; ++k) {
            const double v = x.get_double((o * n + k) * inner + j);
            norm += p == 1 ? std::fabs(v) : v * v;
          }
          if (p == 2) norm = std::sqrt(norm);
          for (int64_t k = 0; k < n; ++k) {
            const int64_t i = (o * n + k) * inner + j;
            want[static_cast<size_t>(i)] = norm == 0 ? 0.0 : x.get_double(i) / norm;
          }
        }
      check_close(y, want, 2e-6, "LpNormalization p " + std::to_string(p) + " axis " + std::to_string(axis));
    }
  // MVN with its default axes {0, 2, 3} and with custom axes.
  const Shape s4 = {2, 3, 4, 5};
  const Tensor x4 = test::random_tensor(s4, 77, -3, 3);
  for (const std::vector<int64_t>& axes : {std::vector<int64_t>{0, 2, 3}, std::vector<int64_t>{1, -1}, std::vector<int64_t>{0}}) {
    Attrs attrs;
    if (axes.size() != 3) attrs.push_back(ir::Attribute::make_ints("axes", axes));
    const Tensor y = run1("MeanVarianceNormalization", {x4}, attrs, 13);
    std::vector<bool> red(4, false);
    for (int64_t a : axes) red[static_cast<size_t>(a < 0 ? a + 4 : a)] = true;
    // Group the elements by their kept coordinates.
    std::vector<std::vector<int64_t>> groups;
    std::vector<int64_t> key_of(static_cast<size_t>(x4.numel()));
    std::vector<int64_t> idx(4, 0);
    int64_t nkeys = 1;
    for (size_t d = 0; d < 4; ++d)
      if (!red[d]) nkeys *= s4[d];
    groups.resize(static_cast<size_t>(nkeys));
    for (int64_t i = 0; i < x4.numel(); ++i) {
      int64_t k = 0;
      for (size_t d = 0; d < 4; ++d)
        if (!red[d]) k = k * s4[d] + idx[d];
      groups[static_cast<size_t>(k)].push_back(i);
      for (size_t d = 4; d-- > 0;) {
        if (++idx[d] < s4[d]) break;
        idx[d] = 0;
      }
    }
    std::vector<double> want(static_cast<size_t>(x4.numel()));
    for (const auto& g : groups) {
      double m, v;
      stats(x4, g, m, v);
      for (int64_t i : g) want[static_cast<size_t>(i)] = (x4.get_double(i) - m) / (std::sqrt(v) + 1e-9);
    }
    check_close(y, want, 2e-6, "MeanVarianceNormalization");
  }
}

TEST_CASE("normalisation in float64", "[norm]") {
  const Tensor x = test::random_tensor({2, 3, 7}, 78, -3, 3).cast_to(DType::Float64);
  const Tensor scale = test::random_tensor({7}, 79, 0.5f, 2).cast_to(DType::Float64);
  const Tensor y = run1("LayerNormalization", {x, scale}, {}, 17);
  REQUIRE(y.dtype() == DType::Float64);
  std::vector<double> want(42);
  for (int64_t r = 0; r < 6; ++r) {
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < 7; ++i) idx.push_back(r * 7 + i);
    double m, v;
    stats(x, idx, m, v);
    for (int64_t i = 0; i < 7; ++i)
      want[static_cast<size_t>(r * 7 + i)] = (x.get_double(r * 7 + i) - m) / std::sqrt(v + double(1e-5f)) * scale.get_double(i);
  }
  check_close(y, want, 1e-12, "LayerNormalization float64");
  // A float32 scale of shape [1, 7] for float64 X is copied (converted), with the shape accepted
  // as the in-place path accepts it: the same values, so the same result.
  const Tensor scale32 = scale.cast_to(DType::Float32).reshaped({1, 7});
  check_close(run1("LayerNormalization", {x, scale32}, {}, 17), want, 1e-7, "float32 scale [1, 7] for float64 X");
}

TEST_CASE("normalisation ops reject bad nodes", "[norm]") {
  const Tensor x = test::random_tensor({2, 3, 4}, 1);
  const Tensor c3 = test::random_tensor({3}, 2), c4 = test::random_tensor({4}, 3);
  CHECK_THROWS_AS(run1("BatchNormalization", {x, c4, c4, c4, c4}, {}, 15), Error);
  CHECK_THROWS_AS(run1("BatchNormalization", {x, c3, c3, c4, c3}, {}, 15), Error);
  CHECK_THROWS_AS(run1("InstanceNormalization", {x, c4, c4}, {}, 6), Error);
  CHECK_THROWS_AS(run1("LayerNormalization", {x, c3}, {}, 17), Error);
  CHECK_THROWS_AS(run1("LayerNormalization", {x, c4}, {ir::Attribute::make_int("axis", 3)}, 17), Error);
  // As many values as the normalised shape [3, 4] holds, in another shape: not read as it.
  const Tensor c43 = test::random_tensor({4, 3}, 5);
  CHECK_THROWS_AS(run1("LayerNormalization", {x, c43}, {ir::Attribute::make_int("axis", 1)}, 17), Error);
  CHECK_THROWS_AS(run1("GroupNormalization", {x, c3, c3}, {ir::Attribute::make_int("num_groups", 2)}, 18), Error);
  CHECK_THROWS_AS(run1("GroupNormalization", {x, c3, c3}, {}, 18), Error);
  const Tensor c1 = test::random_tensor({1}, 4);
  CHECK_THROWS_AS(run1("GroupNormalization", {x, c1, c1}, {ir::Attribute::make_int("num_groups", 1)}, 21), Error);
  CHECK_THROWS_AS(run1("LpNormalization", {x}, {ir::Attribute::make_int("p", 3)}, 1), Error);
  CHECK_THROWS_AS(run1("MeanVarianceNormalization", {x}, {ir::Attribute::make_ints("axes", {0, 0})}, 13), Error);
  CHECK_THROWS_AS(run1("InstanceNormalization", {Tensor::from<int32_t>({1, 1, 1}, {1}), Tensor::from<int32_t>({1}, {1}), Tensor::from<int32_t>({1}, {1})}, {}, 6), Error);
}
