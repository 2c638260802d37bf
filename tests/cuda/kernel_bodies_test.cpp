// The shared CUDA kernel bodies (kernels/bodies/*.cuh) run on the host by the nvcc-compiled
// harness (kernels/host_harness.cu) over several launch shapes each (tests/cuda/host_grid.h),
// against mpq's CPU kernels run through the executor (and the naive references of
// runtime/cpu/reference.h for pooling). Odd shapes and fixed seeds throughout. Always runs: no GPU
// is involved. Quantization and statistics bodies are in quant_bodies_test.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/half.h"
#include "host_grid.h"
#include "kernels/lib_ops.h"
#include "kernels/ops.h"
#include "runtime/cpu/reference.h"
#include "runtime/cuda/plan_shape.h"
#include "test_util.h"

using namespace mpq;
using Attrs = std::vector<ir::Attribute>;
namespace plan = mpq::rt::cuda_plan;

namespace {

Tensor i64(Shape s, std::vector<int64_t> v) { return Tensor::from<int64_t>(std::move(s), v); }


}  // namespace

TEST_CASE("unary bodies match the CPU kernels", "[cuda][host_bodies]") {
  struct Case {
    const char* op;
    cuda::UnaryOp code;
    float lo, hi;
    float alpha = 0, beta = 0;  // HardSigmoid's attributes (HardSwish: its fixed 1/6, 1/2)
    int opset = 13;
  };
  const Case cases[] = {{"Relu", cuda::UnaryOp::Relu, -2, 2},     {"Sigmoid", cuda::UnaryOp::Sigmoid, -9, 9},
                        {"Tanh", cuda::UnaryOp::Tanh, -4, 4},     {"Exp", cuda::UnaryOp::Exp, -8, 8},
                        {"Log", cuda::UnaryOp::Log, 0.01f, 50},   {"Neg", cuda::UnaryOp::Neg, -3, 3},
                        {"Abs", cuda::UnaryOp::Abs, -3, 3},       {"Sqrt", cuda::UnaryOp::Sqrt, 0, 9},
                        {"Erf", cuda::UnaryOp::Erf, -3, 3},       {"Reciprocal", cuda::UnaryOp::Reciprocal, 0.1f, 4},
                        {"Identity", cuda::UnaryOp::Identity, -1, 1},
                        {"HardSigmoid", cuda::UnaryOp::HardSigmoid, -6, 6, 0.3f, 0.4f},
                        {"HardSwish", cuda::UnaryOp::HardSwish, -5, 5, 1.0f / 6.0f, 0.5f, 14}};
  uint32_t seed = 11;
  for (const Case& k : cases) {
    INFO(k.op);
    const Tensor x = test::random_tensor({3, 5, 7}, seed++, k.lo, k.hi);
    std::vector<ir::Attribute> attrs;
    if (k.code == cuda::UnaryOp::HardSigmoid)
      attrs = {ir::Attribute::make_float("alpha", k.alpha), ir::Attribute::make_float("beta", k.beta)};
    const Tensor want = test::run_node(k.op, {x}, attrs, 1, k.opset, 2).at(0);
    test::check_every_launch(want, 2e-6, 1e-7, [&](float* y, const cuda::LaunchCtx& c) {
      return cuda::host::unary(k.code, k.alpha, k.beta, x.data<float>(), y, x.numel(), c);
    });
  }
  SECTION("HardSigmoid keeps NaN, as the CPU kernel does") {
    const Tensor x = Tensor::from<float>({3}, {std::numeric_limits<float>::quiet_NaN(), -100.0f, 100.0f});
    const Tensor want = test::run_node("HardSigmoid", {x}, {}, 1, 13, 1).at(0);
    REQUIRE(std::isnan(want.data<float>()[0]));
    std::vector<float> y(3, 0.5f);
    REQUIRE(cuda::host::unary(cuda::UnaryOp::HardSigmoid, 0.2f, 0.5f, x.data<float>(), y.data(), 3, cuda::LaunchCtx{}) == 0);
    CHECK(std::isnan(y[0]));
    CHECK(y[1] == 0.0f);
    CHECK(y[2] == 1.0f);
  }
  SECTION("Gelu (erf form) against a double reference") {
    const Tensor x = test::random_tensor({37}, 5, -5, 5);
    Tensor want(DType::Float32, {37});
    for (int i = 0; i < 37; ++i) {
      const double v = x.data<float>()[i];
      want.data<float>()[i] = static_cast<float>(0.5 * v * (1 + std::erf(v / std::sqrt(2.0))));
    }
    test::check_every_launch(want, 1e-5, 1e-6, [&](float* y, const cuda::LaunchCtx& c) {
      return cuda::host::unary(cuda::UnaryOp::Gelu, 0, 0, x.data<float>(), y, 37, c);
    });
  }
}

TEST_CASE("float conversion body rounds to FP16 and BF16 as core/half.h does, bit for bit", "[cuda][host_bodies][amp]") {
  // Random values over FP16's whole range and beyond (overflow to inf), subnormals, ties, signed
  // zeros, inf and NaN.
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, -70000.0f, 6.1035156e-05f, 6.0e-08f,
                          2.9e-08f, 1.0e-10f, 1.0009765625f + 0.00048828125f, 1.00146484375f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), 3.3895e38f, 1.1754944e-38f, 9.2e-41f};
  const Tensor r = test::random_tensor({997}, 77, -80000.0f, 80000.0f);
  for (int64_t i = 0; i < r.numel(); ++i) v.push_back(i % 3 == 0 ? r.data<float>()[i] * 1e-8f : r.data<float>()[i]);
  const int64_t n = static_cast<int64_t>(v.size());
  for (const bool bf16 : {false, true}) {
    INFO((bf16 ? "BF16" : "FP16"));
    Tensor want_low(DType::Int32, {n}), want_back(DType::Float32, {n});
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t bits = bf16 ? float_to_bf16_bits(v[static_cast<size_t>(i)]) : float_to_half_bits(v[static_cast<size_t>(i)]);
      want_low.data<int32_t>()[i] = bits;
      want_back.data<float>()[i] = bf16 ? bf16_bits_to_float(bits) : half_bits_to_float(bits);
    }
    for (const cuda::LaunchCtx& c : test::launches_for(n)) {
      INFO("launch " << test::launch_str(c));
      std::vector<uint16_t> low(static_cast<size_t>(n), 0xabcd);
      std::vector<float> back(static_cast<size_t>(n), -1.0f);
      REQUIRE(cuda::host::convert_float(bf16 ? cuda::FloatConvert::F32ToBF16 : cuda::FloatConvert::F32ToF16, v.data(), low.data(), n, c) == 0);
      REQUIRE(cuda::host::convert_float(bf16 ? cuda::FloatConvert::BF16ToF32 : cuda::FloatConvert::F16ToF32, low.data(), back.data(), n, c) == 0);
      int bad_low = 0, bad_back = 0;
      for (int64_t i = 0; i < n; ++i) {
        bad_low += low[static_cast<size_t>(i)] != static_cast<uint16_t>(want_low.data<int32_t>()[i]);
        const float w = want_back.data<float>()[i], g = back[static_cast<size_t>(i)];
        bad_back += std::memcmp(&w, &g, 4) != 0;
      }
      CHECK(bad_low == 0);
      CHECK(bad_back == 0);
    }
  }
  // The cases the rounding rules are about.
  CHECK(float_to_half_bits(65520.0f) == 0x7c00);  // rounds past the largest half: inf
  CHECK(std::isnan(half_bits_to_float(float_to_half_bits(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("binary bodies broadcast as the CPU kernels do", "[cuda][host_bodies]") {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{2, 1, 5, 3}, {4, 1, 3}}, {{7}, {3, 1}}, {{1}, {2, 3, 5}}, {{3, 5}, {3, 5}}, {{2, 3, 1, 1, 3}, {1, 1, 4, 5, 1}}};
  struct Case {
    const char* op;
    cuda::BinaryOp code;
  };
  const Case ops[] = {{"Add", cuda::BinaryOp::Add}, {"Sub", cuda::BinaryOp::Sub}, {"Mul", cuda::BinaryOp::Mul},
                      {"Div", cuda::BinaryOp::Div}, {"Max", cuda::BinaryOp::Max}, {"Min", cuda::BinaryOp::Min},
                      {"Pow", cuda::BinaryOp::Pow}};
  uint32_t seed = 100;
  for (const auto& [sa, sb] : shapes)
    for (const Case& k : ops) {
      INFO(k.op << " " << shape_str(sa) << " with " << shape_str(sb));
      const bool pow = k.code == cuda::BinaryOp::Pow;
      const Tensor a = test::random_tensor(sa, seed++, pow ? 0.1f : -2, 2);
      const Tensor b = test::random_tensor(sb, seed++, pow ? -2.0f : 0.5f, pow ? 2.0f : 3.0f);
      const Tensor want = test::run_node(k.op, {a, b}, {}, 1, 13, 2).at(0);
      Shape out;
      const cuda::Broadcast2 bc = plan::make_broadcast2(sa, sb, &out);
      REQUIRE(out == want.shape());
      test::check_every_launch(want, 2e-6, 1e-7, [&](float* y, const cuda::LaunchCtx& c) {
        return cuda::host::binary(k.code, bc, a.data<float>(), b.data<float>(), y, want.numel(), c);
      });
    }
  Shape out;
  CHECK_THROWS_AS(plan::make_broadcast2({3, 4}, {5, 4}, &out), Error);
}

TEST_CASE("reduction bodies match ReduceSum/Mean/Max/Min over every axis", "[cuda][host_bodies]") {
  const Shape shape{3, 4, 5, 2};
  const Tensor x = test::random_tensor(shape, 21, -3, 3);
  struct Case {
    const char* op;
    cuda::ReduceOp code;
  };
  const Case ops[] = {{"ReduceSum", cuda::ReduceOp::Sum}, {"ReduceMean", cuda::ReduceOp::Mean},
                      {"ReduceMax", cuda::ReduceOp::Max}, {"ReduceMin", cuda::ReduceOp::Min}};
  for (const Case& k : ops)
    for (int64_t axis = 0; axis < 4; ++axis) {
      INFO(k.op << " axis " << axis);
      Tensor want = k.code == cuda::ReduceOp::Sum
                        ? test::run_node(k.op, {x, i64({1}, {axis})}, {ir::Attribute::make_int("keepdims", 1)}, 1, 13, 2).at(0)
                        : test::run_node(k.op, {x}, {ir::Attribute::make_ints("axes", {axis})}, 1, 13, 2).at(0);
      const plan::AxisView v = plan::axis_view(shape, axis);
      test::check_every_launch(want, 1e-6, 1e-6, [&](float* y, const cuda::LaunchCtx& c) {
        return cuda::host::reduce(k.code, x.data<float>(), y, v.outer, v.n, v.inner, c);
      });
    }
}

TEST_CASE("softmax bodies match Softmax and LogSoftmax (opset 13) on every axis", "[cuda][host_bodies]") {
  const Shape shape{3, 7, 5};
  Tensor x = test::random_tensor(shape, 31, -6, 6);
  x.data<float>()[4] = 80.0f;  // large values: the max subtraction must keep exp finite
  for (const char* op : {"Softmax", "LogSoftmax"})
    for (int64_t axis = -3; axis < 3; ++axis) {
      INFO(op << " axis " << axis);
      const Tensor want = test::run_node(op, {x}, {ir::Attribute::make_int("axis", axis)}, 1, 13, 2).at(0);
      const plan::AxisView v = plan::axis_view(shape, axis);
      test::check_every_launch(want, 2e-6, 1e-7, [&](float* y, const cuda::LaunchCtx& c) {
        return cuda::host::softmax(std::string(op) == "LogSoftmax", x.data<float>(), y, v.outer, v.n, v.inner, c);
      });
    }
}

// Rows of kSoftmaxChunkedFrom values or more take the chunked path (row maximum and sum as chunked
// reductions, then one thread per element): rows along the last axis, a middle axis and the
// first, a large value in one row, and a NaN in another (its row comes out NaN, as on the CPU).
TEST_CASE("softmax on long rows (chunked) matches Softmax and LogSoftmax", "[cuda][host_bodies]") {
  for (const Shape& shape : {Shape{3, 1500}, Shape{2, 1030, 3}, Shape{4096, 2}}) {
    Tensor x = test::random_tensor(shape, 32, -8, 8);
    x.data<float>()[7] = 85.0f;
    x.data<float>()[x.numel() - 2] = std::numeric_limits<float>::quiet_NaN();
    const int64_t axis = shape.size() == 3 ? 1 : (shape[0] == 4096 ? 0 : 1);
    const plan::AxisView v = plan::axis_view(shape, axis);
    REQUIRE(v.n >= cuda::kSoftmaxChunkedFrom);
    for (const char* op : {"Softmax", "LogSoftmax"}) {
      INFO(op << " " << shape_str(shape) << " axis " << axis);
      const Tensor want = test::run_node(op, {x}, {ir::Attribute::make_int("axis", axis)}, 1, 13, 2).at(0);
      test::check_every_launch(want, 2e-6, 1e-7, [&](float* y, const cuda::LaunchCtx& c) {
        return cuda::host::softmax(std::string(op) == "LogSoftmax", x.data<float>(), y, v.outer, v.n, v.inner, c);
      });
    }
  }
}

TEST_CASE("layer norm body matches LayerNormalization (Y, Mean, InvStdDev)", "[cuda][host_bodies]") {
  const Tensor x = test::random_tensor({3, 5, 13}, 41, -2, 4);
  const Tensor gamma = test::random_tensor({13}, 42, 0.5f, 1.5f);
  const Tensor beta = test::random_tensor({13}, 43, -1, 1);
  const float eps = 1e-5f;
  const std::vector<Tensor> want =
      test::run_node("LayerNormalization", {x, gamma, beta}, {ir::Attribute::make_int("axis", -1),
                                                             ir::Attribute::make_float("epsilon", eps)},
                     3, 17, 2);
  for (const cuda::LaunchCtx& c : test::launches_for(15)) {
    INFO("launch " << test::launch_str(c));
    std::vector<float> y = test::nan_filled(3 * 5 * 13), mean = test::nan_filled(15), inv = test::nan_filled(15);
    REQUIRE(cuda::host::layer_norm(x.data<float>(), gamma.data<float>(), beta.data<float>(), y.data(), mean.data(),
                                   inv.data(), 15, 13, eps, c) == 0);
    CHECK(test::first_mismatch(y.data(), want[0].data<float>(), 195, 1e-5, 1e-6) == -1);
    CHECK(test::first_mismatch(mean.data(), want[1].data<float>(), 15, 1e-6, 1e-7) == -1);
    CHECK(test::first_mismatch(inv.data(), want[2].data<float>(), 15, 1e-5, 1e-7) == -1);
  }
}

TEST_CASE("pooling bodies match the naive references", "[cuda][host_bodies]") {
  const Shape shape{2, 3, 9, 8};
  const Tensor x = test::random_tensor(shape, 51, -5, 5);
  struct Geo {
    std::vector<int64_t> kernel, strides, dilations, pads;
    bool ceil;
  };
  const Geo geos[] = {{{3, 2}, {2, 1}, {}, {1, 0, 1, 1}, false},
                      {{3, 3}, {2, 3}, {}, {1, 1, 0, 2}, true},
                      {{2, 3}, {1, 2}, {2, 1}, {0, 1, 1, 0}, true},
                      {{9, 8}, {}, {}, {}, false}};
  for (const Geo& geo : geos) {
    rt::cpu::WindowGeometry g;
    g.kernel = geo.kernel;
    g.strides = geo.strides;
    g.dilations = geo.dilations;
    g.pads = geo.pads;
    g.ceil_mode = geo.ceil;
    const cuda::Pool2dGeom pg = plan::make_pool2d_geom(shape, geo.kernel, geo.strides, geo.dilations, geo.pads, geo.ceil);
    INFO("kernel " << geo.kernel[0] << "x" << geo.kernel[1] << " ceil " << geo.ceil);
    const Tensor want_max = rt::cpu::max_pool_ref(x, g);
    REQUIRE(want_max.numel() == pg.planes * pg.oh * pg.ow);
    test::check_every_launch(want_max, 0, 0, [&](float* y, const cuda::LaunchCtx& c) {
      return cuda::host::pool2d(true, false, pg, x.data<float>(), y, c);
    });
    if (!geo.dilations.empty()) continue;  // AveragePool has dilations only from opset 19
    for (bool cip : {false, true}) {
      INFO("count_include_pad " << cip);
      const Tensor want_avg = rt::cpu::avg_pool_ref(x, g, cip);
      test::check_every_launch(want_avg, 1e-6, 1e-7, [&](float* y, const cuda::LaunchCtx& c) {
        return cuda::host::pool2d(false, cip, pg, x.data<float>(), y, c);
      });
    }
  }
}

TEST_CASE("resize bodies match Resize (nearest and linear)", "[cuda][host_bodies]") {
  const Tensor x = test::random_tensor({2, 3, 5, 7}, 61, -2, 2);
  struct Coord {
    const char* name;
    cuda::ResizeCoord code;
  };
  const Coord coords[] = {{"half_pixel", cuda::ResizeCoord::HalfPixel},
                          {"pytorch_half_pixel", cuda::ResizeCoord::PytorchHalfPixel},
                          {"align_corners", cuda::ResizeCoord::AlignCorners},
                          {"asymmetric", cuda::ResizeCoord::Asymmetric}};
  struct Near {
    const char* name;
    cuda::ResizeNearest code;
  };
  const Near nears[] = {{"round_prefer_floor", cuda::ResizeNearest::RoundPreferFloor},
                        {"round_prefer_ceil", cuda::ResizeNearest::RoundPreferCeil},
                        {"floor", cuda::ResizeNearest::Floor},
                        {"ceil", cuda::ResizeNearest::Ceil}};
  const std::vector<std::pair<float, float>> scales = {{2.0f, 1.5f}, {0.6f, 0.43f}, {1.0f, 3.0f}};
  for (const auto& [sh, sw] : scales)
    for (const Coord& co : coords)
      for (bool linear : {false, true})
        for (const Near& ne : nears) {
          if (linear && ne.code != cuda::ResizeNearest::RoundPreferFloor) continue;
          INFO("scales " << sh << "x" << sw << " " << co.name << (linear ? " linear" : " nearest ") << (linear ? "" : ne.name));
          const Tensor sc = Tensor::from<float>({4}, {1.0f, 1.0f, sh, sw});
          const Tensor want =
              test::run_node("Resize", {x, Tensor(), sc},
                             {ir::Attribute::make_string("mode", linear ? "linear" : "nearest"),
                              ir::Attribute::make_string("coordinate_transformation_mode", co.name),
                              ir::Attribute::make_string("nearest_mode", ne.name)},
                             1, 13, 2)
                  .at(0);
          cuda::Resize2dGeom g;
          g.linear = linear;
          g.coord = co.code;
          g.nearest = ne.code;
          g.planes = 6;
          g.ih = 5;
          g.iw = 7;
          g.oh = want.dim(2);
          g.ow = want.dim(3);
          g.scale_h = sh;
          g.scale_w = sw;
          test::check_every_launch(want, 1e-5, 1e-6, [&](float* y, const cuda::LaunchCtx& c) {
            return cuda::host::resize2d(g, x.data<float>(), y, c);
          });
        }
}

TEST_CASE("gather, slice, transpose and concat bodies match the CPU kernels", "[cuda][host_bodies]") {
  const Tensor x = test::random_tensor({3, 7, 4}, 71, -1, 1);
  SECTION("Gather on each axis, negative indices") {
    for (int64_t axis = 0; axis < 3; ++axis) {
      INFO("axis " << axis);
      const std::vector<int64_t> idx = {-1, 0, 2, 2, 1};
      const Tensor want = test::run_node("Gather", {x, i64({5}, idx)}, {ir::Attribute::make_int("axis", axis)}, 1, 13, 2).at(0);
      const plan::AxisView v = plan::axis_view(x.shape(), axis);
      int bad = 0;
      test::check_every_launch(want, 0, 0, [&](float* y, const cuda::LaunchCtx& c) {
        return cuda::host::gather(x.data<float>(), idx.data(), y, v.outer, v.n, v.inner, 5, &bad, c);
      });
      CHECK(bad == 0);
    }
    const std::vector<int64_t> out_of_range = {0, 7};
    std::vector<float> y(3 * 2 * 4);
    int bad = 0;
    REQUIRE(cuda::host::gather(x.data<float>(), out_of_range.data(), y.data(), 3, 7, 4, 2, &bad, {cuda::LaunchShape{2, 5}}) == 0);
    CHECK(bad == 1);
  }
  SECTION("Slice with negative starts, steps and clamping") {
    struct Case {
      std::vector<int64_t> starts, ends, axes, steps;
    };
    const Case cases[] = {{{1, 2}, {3, 7}, {0, 1}, {1, 2}},
                          {{-1}, {-100}, {1}, {-2}},
                          {{0, -3, 1}, {100, -1, 4}, {0, 1, 2}, {2, 1, 3}},
                          {{2}, {1}, {2}, {1}},
                          {{5, 3}, {0, -10}, {1, -3}, {-1, -1}}};
    for (const Case& k : cases) {
      const Tensor want = test::run_node("Slice",
                                         {x, i64({static_cast<int64_t>(k.starts.size())}, k.starts),
                                          i64({static_cast<int64_t>(k.ends.size())}, k.ends),
                                          i64({static_cast<int64_t>(k.axes.size())}, k.axes),
                                          i64({static_cast<int64_t>(k.steps.size())}, k.steps)},
                                         {}, 1, 13, 2)
                             .at(0);
      Shape out;
      const cuda::StridedView v = plan::make_slice_view(x.shape(), k.starts, k.ends, k.axes, k.steps, &out);
      INFO("slice to " << shape_str(want.shape()));
      REQUIRE(out == want.shape());
      if (want.numel() == 0) continue;
      test::check_every_launch(want, 0, 0, [&](float* y, const cuda::LaunchCtx& c) {
        return cuda::host::strided_copy(v, x.data<float>(), y, want.numel(), c);
      });
    }
  }
  SECTION("Transpose, every permutation of a rank-4 tensor") {
    const Tensor x4 = test::random_tensor({2, 3, 1, 5}, 72);
    std::vector<int64_t> perm = {0, 1, 2, 3};
    do {
      const Tensor want = test::run_node("Transpose", {x4}, {ir::Attribute::make_ints("perm", perm)}, 1, 13, 2).at(0);
      Shape out;
      const cuda::StridedView v = plan::make_transpose_view(x4.shape(), perm, &out);
      REQUIRE(out == want.shape());
      test::check_every_launch(want, 0, 0, [&](float* y, const cuda::LaunchCtx& c) {
        return cuda::host::strided_copy(v, x4.data<float>(), y, want.numel(), c);
      });
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
  SECTION("Concat on the middle axis") {
    const Tensor a = test::random_tensor({2, 3, 4}, 73), b = test::random_tensor({2, 1, 4}, 74),
                 d = test::random_tensor({2, 5, 4}, 75);
    const Tensor want = test::run_node("Concat", {a, b, d}, {ir::Attribute::make_int("axis", 1)}, 1, 13, 2).at(0);
    test::check_every_launch(want, 0, 0, [&](float* y, const cuda::LaunchCtx& c) {
      int64_t offset = 0;
      for (const Tensor* t : {&a, &b, &d}) {
        if (int e = cuda::host::concat_part(t->data<float>(), y, 2, t->dim(1), 4, 9, offset, c)) return e;
        offset += t->dim(1);
      }
      return 0;
    });
  }
}

TEST_CASE("direct matmul and convolution bodies run the cuBLASLt/cuDNN plans as the references do",
          "[cuda][host_bodies][linalg]") {
  // GEMM: mpq's row-major problem -> plan_gemm (operand swap, transposes, batch strides) ->
  // matmul_geom -> the body, over every launch shape, against gemm_ref / matmul_ref (double).
  struct GemmCase {
    int64_t m, n, k, batch;
    bool ta, tb;
  };
  for (const GemmCase& c : {GemmCase{5, 3, 7, 1, false, false}, GemmCase{4, 6, 3, 1, true, false},
                            GemmCase{3, 5, 9, 1, false, true}, GemmCase{2, 7, 5, 1, true, true},
                            GemmCase{3, 4, 5, 3, false, false}}) {
    INFO("m " << c.m << " n " << c.n << " k " << c.k << " batch " << c.batch << " transA " << c.ta << " transB " << c.tb);
    Shape as = c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, bs = c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n};
    if (c.batch > 1) {
      as.insert(as.begin(), c.batch);
      bs.insert(bs.begin(), c.batch);
    }
    const Tensor a = test::random_tensor(as, 11), b = test::random_tensor(bs, 12);
    const Tensor want = c.batch > 1 ? rt::cpu::matmul_ref(a, b) : rt::cpu::gemm_ref(a, b, nullptr, 1.0, 0.0, c.ta, c.tb);
    plan::GemmRequest r;
    r.m = c.m;
    r.n = c.n;
    r.k = c.k;
    r.trans_a = c.ta;
    r.trans_b = c.tb;
    r.batch = c.batch;
    const plan::GemmPlan p = plan::plan_gemm(r);
    REQUIRE(p.use_cublaslt);
    test::check_every_launch(want, 1e-5, 1e-5, [&](float* y, const cuda::LaunchCtx& ctx) {
      // cuBLASLt's A is mpq's B.
      return cuda::host::matmul(cuda::matmul_geom(p), b.data<float>(), a.data<float>(), y, ctx);
    });
  }
  // Convolution: plan_conv -> conv_geom -> the body, against conv_ref, for 1-D, 2-D (groups,
  // depthwise, strides, dilations) and 3-D.
  struct ConvCase {
    Shape x, w;
    std::vector<int64_t> strides, dilations, pads;
    int64_t group;
  };
  const ConvCase convs[] = {{{2, 4, 7, 6}, {6, 2, 3, 3}, {2, 1}, {1, 2}, {1, 1, 1, 1}, 2},
                            {{1, 3, 5, 5}, {3, 1, 3, 3}, {}, {}, {1, 1, 1, 1}, 3},
                            {{2, 3, 11}, {4, 3, 3}, {2}, {2}, {2, 2}, 1},
                            {{1, 2, 4, 5, 5}, {3, 2, 2, 3, 3}, {1, 2, 1}, {}, {0, 1, 1, 0, 1, 1}, 1}};
  for (const ConvCase& c : convs) {
    INFO("x " << shape_str(c.x) << " w " << shape_str(c.w));
    const Tensor x = test::random_tensor(c.x, 13), w = test::random_tensor(c.w, 14);
    rt::cpu::WindowGeometry g;
    g.strides = c.strides;
    g.dilations = c.dilations;
    g.pads = c.pads;
    g.group = c.group;
    const Tensor want = rt::cpu::conv_ref(x, w, nullptr, g);
    const plan::ConvPlan p = plan::plan_conv(plan::ConvRequest{c.x, c.w, c.strides, c.dilations, c.pads, c.group});
    REQUIRE(p.use_cudnn);
    REQUIRE(p.y_shape == want.shape());
    test::check_every_launch(want, 1e-5, 1e-5, [&](float* y, const cuda::LaunchCtx& ctx) {
      return cuda::host::conv_direct(cuda::conv_geom(p), x.data<float>(), w.data<float>(), y, ctx);
    });
  }
}
