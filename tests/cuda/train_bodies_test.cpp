// The training bodies (kernels/bodies/train.cuh, and the convolution backward bodies of
// kernels/bodies/linalg.cuh behind the library entries) run by the nvcc-compiled host harness over every
// launch shape (tests/cuda/host_grid.h), against mpq's CPU training code: the backward kernels of
// lib/train/grads (called directly with the forward outputs saved), the SGD/AdamW optimizers of
// lib/train/optimizer.cpp and GradScaler::unscale. Fixed seeds, odd shapes. Always runs.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cpu_backward.h"
#include "host_grid.h"
#include "kernels/lib_ops.h"
#include "kernels/ops.h"
#include "runtime/cuda/plan_conv.h"
#include "runtime/cuda/plan_gemm.h"
#include "runtime/cuda/plan_shape.h"
#include "runtime/thread_pool.h"
#include "test_util.h"
#include "train/grad_registry.h"
#include "train/grad_scaler.h"
#include "train/optimizer.h"

using namespace mpq;

namespace {

// dX of a one-node model from the CPU backward kernel, with the forward outputs saved.
Tensor cpu_backward(const std::string& op, int opset, const Tensor& x, const Tensor& y, const Tensor& dy,
                    const std::vector<ir::Attribute>& attrs = {}) {
  ir::Model model;
  model.set_opset("", opset);
  ir::Graph* g = model.graph.get();
  ir::Node* node = g->add_node(op, {g->add_value("x")}, {g->add_value("y")}, "node_under_test");
  for (const auto& a : attrs) node->set_attr(a);
  const train::GradDef* def = train::GradRegistry::global().find("", op, opset, rt::BackendKind::CPU);
  REQUIRE(def);
  rt::ThreadPool pool(1);
  train::GradContext ctx(*node, opset, pool);
  ctx.mutable_inputs() = {x};
  ctx.mutable_input_shapes() = {x.shape()};
  ctx.mutable_input_dtypes() = {x.dtype()};
  ctx.mutable_input_present() = {1};
  ctx.mutable_wanted() = {1};
  ctx.mutable_outputs() = {y};
  ctx.mutable_output_shapes() = {y.shape()};
  ctx.mutable_grad_outputs() = {dy};
  ctx.mutable_grads().resize(1);
  def->fn(ctx);
  return ctx.mutable_grads().at(0);
}


using test::cpu_backward_inputs;

}  // namespace

TEST_CASE("unary backward bodies match the CPU backward kernels", "[cuda][host_bodies][train]") {
  struct Case {
    const char* op;
    cuda::UnaryOp code;
    float lo, hi;
    int opset;
  };
  const Case cases[] = {{"Relu", cuda::UnaryOp::Relu, -2, 2, 14},          {"Sigmoid", cuda::UnaryOp::Sigmoid, -4, 4, 13},
                        {"Tanh", cuda::UnaryOp::Tanh, -3, 3, 13},          {"Exp", cuda::UnaryOp::Exp, -2, 2, 13},
                        {"Log", cuda::UnaryOp::Log, 0.1f, 3, 13},          {"Neg", cuda::UnaryOp::Neg, -2, 2, 13},
                        {"Abs", cuda::UnaryOp::Abs, -2, 2, 13},            {"Sqrt", cuda::UnaryOp::Sqrt, 0.1f, 4, 13},
                        {"Erf", cuda::UnaryOp::Erf, -2, 2, 13},            {"Gelu", cuda::UnaryOp::Gelu, -3, 3, 20},
                        {"Reciprocal", cuda::UnaryOp::Reciprocal, 0.2f, 3, 13}, {"Identity", cuda::UnaryOp::Identity, -2, 2, 16},
                        // HardSigmoid with its default alpha (0.2), the node cpu_backward builds has no attributes
                        {"HardSigmoid", cuda::UnaryOp::HardSigmoid, -6, 6, 6}, {"HardSwish", cuda::UnaryOp::HardSwish, -5, 5, 14}};
  for (const Case& c : cases) {
    INFO(c.op);
    const Tensor x = test::random_tensor({3, 37}, 21, c.lo, c.hi), dy = test::random_tensor({3, 37}, 22);
    const Tensor y = test::run_node(c.op, {x}, {}, 1, c.opset, 1).at(0);
    const Tensor want = cpu_backward(c.op, c.opset, x, y, dy);
    REQUIRE(want.defined());
    test::check_every_launch(want, 1e-5, 1e-6, [&](float* dx, const cuda::LaunchCtx& ctx) {
      return cuda::host::unary_grad(c.code, c.code == cuda::UnaryOp::HardSigmoid ? 0.2f : 0.0f, x.data<float>(), y.data<float>(), dy.data<float>(), dx, x.numel(), ctx);
    });
  }
}

TEST_CASE("softmax backward bodies match the CPU backward kernels on every axis", "[cuda][host_bodies][train]") {
  const Shape s = {3, 5, 7};
  const Tensor x = test::random_tensor(s, 23, -3, 3), dy = test::random_tensor(s, 24);
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    for (int64_t axis = -3; axis < 3; ++axis) {
      INFO(op << " axis " << axis);
      const std::vector<ir::Attribute> attrs = {ir::Attribute::make_int("axis", axis)};
      const Tensor y = test::run_node(op, {x}, attrs, 1, 13, 1).at(0);
      const Tensor want = cpu_backward(op, 13, x, y, dy, attrs);
      const rt::cuda_plan::AxisView v = rt::cuda_plan::axis_view(s, axis < 0 ? axis + 3 : axis);
      test::check_every_launch(want, 1e-5, 1e-6, [&](float* dx, const cuda::LaunchCtx& ctx) {
        return cuda::host::softmax_grad(std::string(op) == "LogSoftmax", y.data<float>(), dy.data<float>(), dx, v.outer, v.n,
                                        v.inner, ctx);
      });
    }
  }
}

TEST_CASE("LayerNorm backward bodies match the CPU backward kernel", "[cuda][host_bodies][train]") {
  // The forward body's Mean and InvStdDev feed the backward bodies, as a GPU runner would save
  // them; dX, dScale and dBias against lib/train/grads/norm_grad.cpp's LayerNormalization.
  struct Case {
    Shape x;
    int64_t axis;
  };
  for (const Case& c : {Case{{7, 13}, -1}, Case{{2, 3, 5}, 1}, Case{{1, 37}, 1}, Case{{33, 1}, -1}, Case{{2, 3, 4, 5}, 2}}) {
    const int64_t rank = static_cast<int64_t>(c.x.size()), axis = c.axis < 0 ? c.axis + rank : c.axis;
    INFO("x " << shape_str(c.x) << " axis " << c.axis);
    const Shape norm(c.x.begin() + axis, c.x.end());
    const int64_t n = shape_numel(norm), rows = shape_numel(c.x) / n;
    const Tensor x = test::random_tensor(c.x, 41, -2, 3), scale = test::random_tensor(norm, 42, 0.5f, 1.5f),
                 bias = test::random_tensor(norm, 43), dy = test::random_tensor(c.x, 44);
    const float eps = 1e-5f;
    std::vector<float> mean(static_cast<size_t>(rows)), inv(static_cast<size_t>(rows)), y(static_cast<size_t>(x.numel()));
    REQUIRE(cuda::host::layer_norm(x.data<float>(), scale.data<float>(), bias.data<float>(), y.data(), mean.data(), inv.data(),
                                   rows, n, eps, test::launches_for(rows).front()) == 0);

    const std::vector<Tensor> want = cpu_backward_inputs("LayerNormalization", 17, {x, scale, bias}, Tensor(DType::Float32, c.x), dy,
                                                         {ir::Attribute::make_int("axis", c.axis), ir::Attribute::make_float("epsilon", eps)},
                                                         {1, 1, 1});
    const Tensor& want_dx = want.at(0);
    const Tensor& want_ds = want.at(1);
    const Tensor& want_db = want.at(2);
    REQUIRE(want_dx.defined());
    REQUIRE(want_ds.defined());
    REQUIRE(want_db.defined());

    test::check_every_launch(want_dx, 1e-4, 1e-5, [&](float* dx, const cuda::LaunchCtx& lc) {
      return cuda::host::layer_norm_grad_x(x.data<float>(), mean.data(), inv.data(), scale.data<float>(), dy.data<float>(), dx,
                                           rows, n, lc);
    });
    test::check_every_launch(want_ds, 1e-4, 1e-5, [&](float* ds, const cuda::LaunchCtx& lc) {
      return cuda::host::layer_norm_grad_params(x.data<float>(), mean.data(), inv.data(), dy.data<float>(), ds, nullptr, rows,
                                                n, lc);
    });
    test::check_every_launch(want_db, 1e-5, 1e-6, [&](float* db, const cuda::LaunchCtx& lc) {
      return cuda::host::layer_norm_grad_params(x.data<float>(), mean.data(), inv.data(), dy.data<float>(), nullptr, db, rows,
                                                n, lc);
    });
  }
}

TEST_CASE("pooling backward body matches the CPU backward kernels", "[cuda][host_bodies][train]") {
  // MaxPool and AveragePool: pads on every side (asymmetric too), strides, dilations (MaxPool),
  // ceil_mode, count_include_pad, the 2x2 stride-2 tiles the CPU has its own kernel for, and ties
  // (values on a coarse grid), where dY must go to the window's first maximum.
  struct Case {
    const char* op;
    Shape x;
    std::vector<int64_t> k, s, pads, dil;
    int ceil_mode, count_include_pad;
    bool ties;
  };
  const Case cases[] = {
      {"MaxPool", {2, 3, 9, 11}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0, 0, false},
      {"MaxPool", {1, 2, 8, 10}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 0, 0, false},
      {"MaxPool", {1, 1, 10, 9}, {3, 2}, {1, 2}, {1, 0, 2, 1}, {2, 1}, 1, 0, false},
      {"MaxPool", {2, 2, 7, 7}, {3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 0, 0, true},
      {"AveragePool", {2, 3, 9, 11}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 1, 0, false},
      {"AveragePool", {2, 3, 9, 11}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 1, 1, false},
      {"AveragePool", {1, 2, 6, 7}, {2, 3}, {1, 2}, {0, 1, 1, 0}, {1, 1}, 0, 1, false},
  };
  for (const Case& c : cases) {
    INFO(c.op << " x " << shape_str(c.x) << " k " << c.k[0] << "x" << c.k[1] << " s " << c.s[0] << "x" << c.s[1] << " dil "
              << c.dil[0] << "x" << c.dil[1] << " ceil " << c.ceil_mode << " include_pad " << c.count_include_pad);
    Tensor x = test::random_tensor(c.x, 45, -2, 2);
    if (c.ties)
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::round(x.data<float>()[i]);
    std::vector<ir::Attribute> attrs = {ir::Attribute::make_ints("kernel_shape", c.k), ir::Attribute::make_ints("strides", c.s),
                                        ir::Attribute::make_ints("pads", c.pads), ir::Attribute::make_int("ceil_mode", c.ceil_mode)};
    const bool is_max = std::string(c.op) == "MaxPool";
    if (is_max) attrs.push_back(ir::Attribute::make_ints("dilations", c.dil));
    else attrs.push_back(ir::Attribute::make_int("count_include_pad", c.count_include_pad));
    const int opset = is_max ? 12 : 19;
    const Tensor y = test::run_node(c.op, {x}, attrs, 1, opset, 1).at(0);
    const Tensor dy = test::random_tensor(y.shape(), 46);
    const Tensor want = cpu_backward(c.op, opset, x, y, dy, attrs);
    REQUIRE(want.defined());
    cuda::Pool2dGeom g;
    g.planes = c.x[0] * c.x[1];
    g.ih = c.x[2];
    g.iw = c.x[3];
    g.oh = y.shape()[2];
    g.ow = y.shape()[3];
    g.kh = c.k[0];
    g.kw = c.k[1];
    g.sh = c.s[0];
    g.sw = c.s[1];
    g.dh = c.dil[0];
    g.dw = c.dil[1];
    g.pad_t = c.pads[0];
    g.pad_l = c.pads[1];
    g.pad_b = c.pads[2];
    g.pad_r = c.pads[3];
    test::check_every_launch(want, 1e-5, 1e-6, [&](float* dx, const cuda::LaunchCtx& ctx) {
      return cuda::host::pool2d_grad(is_max, c.count_include_pad != 0, g, is_max ? x.data<float>() : nullptr, dy.data<float>(), dx,
                                     ctx);
    });
  }
}

TEST_CASE("resize backward body matches the CPU backward kernel (nearest and linear)", "[cuda][host_bodies][train]") {
  // Up and down, unequal axes, every coordinate transform and nearest mode the forward body runs.
  const Tensor x = test::random_tensor({2, 3, 5, 7}, 47, -2, 2);
  const std::pair<const char*, cuda::ResizeCoord> coords[] = {{"half_pixel", cuda::ResizeCoord::HalfPixel},
                                                              {"pytorch_half_pixel", cuda::ResizeCoord::PytorchHalfPixel},
                                                              {"align_corners", cuda::ResizeCoord::AlignCorners},
                                                              {"asymmetric", cuda::ResizeCoord::Asymmetric}};
  const std::pair<const char*, cuda::ResizeNearest> nears[] = {{"round_prefer_floor", cuda::ResizeNearest::RoundPreferFloor},
                                                               {"round_prefer_ceil", cuda::ResizeNearest::RoundPreferCeil},
                                                               {"floor", cuda::ResizeNearest::Floor},
                                                               {"ceil", cuda::ResizeNearest::Ceil}};
  const std::vector<std::pair<float, float>> scales = {{2.0f, 1.5f}, {0.6f, 0.43f}, {1.0f, 3.0f}, {2.5f, 0.8f}};
  for (const auto& [sh, sw] : scales)
    for (const auto& [coord_name, coord] : coords)
      for (bool linear : {false, true})
        for (const auto& [near_name, nearest] : nears) {
          if (linear && nearest != cuda::ResizeNearest::RoundPreferFloor) continue;
          INFO("scales " << sh << "x" << sw << " " << coord_name << (linear ? " linear" : " nearest ") << (linear ? "" : near_name));
          const Tensor sc = Tensor::from<float>({4}, {1.0f, 1.0f, sh, sw});
          const std::vector<ir::Attribute> attrs = {ir::Attribute::make_string("mode", linear ? "linear" : "nearest"),
                                                    ir::Attribute::make_string("coordinate_transformation_mode", coord_name),
                                                    ir::Attribute::make_string("nearest_mode", near_name)};
          const Tensor y = test::run_node("Resize", {x, Tensor(), sc}, attrs, 1, 13, 1).at(0);
          const Tensor dy = test::random_tensor(y.shape(), 48);
          const Tensor want = cpu_backward_inputs("Resize", 13, {x, Tensor(), sc}, y, dy, attrs, {1, 0, 0}).at(0);
          REQUIRE(want.defined());
          cuda::Resize2dGeom g;
          g.linear = linear;
          g.coord = coord;
          g.nearest = nearest;
          g.planes = 6;
          g.ih = 5;
          g.iw = 7;
          g.oh = y.dim(2);
          g.ow = y.dim(3);
          g.scale_h = sh;
          g.scale_w = sw;
          test::check_every_launch(want, 1e-5, 1e-6, [&](float* dx, const cuda::LaunchCtx& ctx) {
            return cuda::host::resize2d_grad(g, dy.data<float>(), dx, ctx);
          });
        }
}

TEST_CASE("data-movement backward: Gather and Slice bodies, Transpose and Concat plans match the CPU backward kernels",
          "[cuda][host_bodies][train]") {
  namespace plan = rt::cuda_plan;
  auto i64 = [](const std::vector<int64_t>& v) { return Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v); };
  SECTION("Gather on each axis: repeated and negative indices add up") {
    const Tensor x = test::random_tensor({3, 7, 4}, 49);
    const std::vector<int64_t> idx = {-1, 0, 2, 2, 1, 0};
    for (int64_t axis = 0; axis < 3; ++axis) {
      INFO("axis " << axis);
      std::vector<int64_t> in_axis = idx;
      for (int64_t& k : in_axis) k = k % x.dim(axis);  // stay in range on the short axes
      const std::vector<ir::Attribute> attrs = {ir::Attribute::make_int("axis", axis)};
      const Tensor y = test::run_node("Gather", {x, i64(in_axis)}, attrs, 1, 13, 1).at(0);
      const Tensor dy = test::random_tensor(y.shape(), 50);
      const Tensor want = cpu_backward_inputs("Gather", 13, {x, i64(in_axis)}, y, dy, attrs, {1, 0}).at(0);
      REQUIRE(want.defined());
      const plan::AxisView v = plan::axis_view(x.shape(), axis);
      test::check_every_launch(want, 1e-6, 1e-6, [&](float* dx, const cuda::LaunchCtx& c) {
        return cuda::host::gather_grad(in_axis.data(), dy.data<float>(), dx, v.outer, v.n, v.inner,
                                       static_cast<int64_t>(in_axis.size()), c);
      });
      // The indexed body with the inverse index: row offsets and positions grouped by row.
      std::vector<int64_t> offsets(static_cast<size_t>(v.n + 1), 0), positions;
      for (int64_t k : in_axis) ++offsets[static_cast<size_t>((k < 0 ? k + v.n : k) + 1)];
      for (int64_t a = 0; a < v.n; ++a) offsets[static_cast<size_t>(a + 1)] += offsets[static_cast<size_t>(a)];
      for (int64_t a = 0; a < v.n; ++a)
        for (size_t k = 0; k < in_axis.size(); ++k)
          if ((in_axis[k] < 0 ? in_axis[k] + v.n : in_axis[k]) == a) positions.push_back(static_cast<int64_t>(k));
      test::check_every_launch(want, 1e-6, 1e-6, [&](float* dx, const cuda::LaunchCtx& c) {
        return cuda::host::gather_grad_indexed(offsets.data(), positions.data(), dy.data<float>(), dx, v.outer, v.n, v.inner,
                                               static_cast<int64_t>(in_axis.size()), c);
      });
    }
  }
  SECTION("Slice: steps forwards and backwards, negative starts, clamped ends, an empty axis") {
    const Tensor x = test::random_tensor({4, 6, 5}, 51);
    struct Case {
      std::vector<int64_t> starts, ends, axes, steps;
    };
    for (const Case& c : {Case{{1, 0}, {3, 5}, {0, 2}, {1, 2}}, Case{{-1, 4}, {-100, 0}, {1, 2}, {-2, -1}},
                          Case{{0, 2, -3}, {100, 5, 100}, {0, 1, 2}, {3, 1, 1}}, Case{{2}, {2}, {1}, {1}}}) {
      INFO("starts " << c.starts.size() << " first " << c.starts[0] << " step " << c.steps[0]);
      const std::vector<Tensor> inputs = {x, i64(c.starts), i64(c.ends), i64(c.axes), i64(c.steps)};
      const Tensor y = test::run_node("Slice", inputs, {}, 1, 13, 1).at(0);
      const Tensor dy = test::random_tensor(y.shape(), 52);
      const Tensor want = cpu_backward_inputs("Slice", 13, inputs, y, dy, {}, {1, 0, 0, 0, 0}).at(0);
      REQUIRE(want.defined());
      const cuda::SliceGeom g = plan::make_slice_grad_geom(x.shape(), c.starts, c.ends, c.axes, c.steps);
      test::check_every_launch(want, 0, 0, [&](float* dx, const cuda::LaunchCtx& ctx) {
        return cuda::host::slice_grad(g, dy.data<float>(), dx, x.numel(), ctx);
      });
    }
  }
  SECTION("Transpose: dY transposed by the inverse permutation") {
    const Tensor x = test::random_tensor({2, 3, 4, 5}, 53);
    for (const std::vector<int64_t>& perm : {std::vector<int64_t>{3, 1, 0, 2}, std::vector<int64_t>{1, 2, 3, 0}, std::vector<int64_t>{}}) {
      const std::vector<ir::Attribute> attrs =
          perm.empty() ? std::vector<ir::Attribute>{} : std::vector<ir::Attribute>{ir::Attribute::make_ints("perm", perm)};
      const Tensor y = test::run_node("Transpose", {x}, attrs, 1, 13, 1).at(0);
      const Tensor dy = test::random_tensor(y.shape(), 54);
      const Tensor want = cpu_backward_inputs("Transpose", 13, {x}, y, dy, attrs, {1}).at(0);
      REQUIRE(want.defined());
      Shape back;
      const cuda::StridedView v = plan::make_transpose_view(y.shape(), plan::inverse_permutation(perm, 4), &back);
      REQUIRE(back == x.shape());
      test::check_every_launch(want, 0, 0, [&](float* dx, const cuda::LaunchCtx& c) {
        return cuda::host::strided_copy(v, dy.data<float>(), dx, x.numel(), c);
      });
    }
    CHECK_THROWS_WITH(plan::inverse_permutation({0, 0, 1}, 3), Catch::Contains("bad perm"));
  }
  SECTION("Concat: each input's gradient is its Slice of dY") {
    const std::vector<Tensor> xs = {test::random_tensor({2, 3, 4}, 55), test::random_tensor({2, 5, 4}, 56),
                                    test::random_tensor({2, 1, 4}, 57)};
    const std::vector<ir::Attribute> attrs = {ir::Attribute::make_int("axis", 1)};
    const Tensor y = test::run_node("Concat", xs, attrs, 1, 13, 1).at(0);
    const Tensor dy = test::random_tensor(y.shape(), 58);
    const std::vector<Tensor> want = cpu_backward_inputs("Concat", 13, xs, y, dy, attrs, {1, 1, 1});
    int64_t offset = 0;
    for (size_t k = 0; k < xs.size(); ++k) {
      INFO("input " << k);
      REQUIRE(want.at(k).defined());
      Shape part;
      const cuda::StridedView v = plan::make_slice_view(dy.shape(), {offset}, {offset + xs[k].dim(1)}, {1}, {1}, &part);
      REQUIRE(part == xs[k].shape());
      test::check_every_launch(want[k], 0, 0, [&](float* dx, const cuda::LaunchCtx& c) {
        return cuda::host::strided_copy(v, dy.data<float>(), dx, xs[k].numel(), c);
      });
      offset += xs[k].dim(1);
    }
  }
}

TEST_CASE("BatchNorm training forward and backward bodies match the CPU training code", "[cuda][host_bodies][train]") {
  // Batch statistics and the running update against a double loop, Y against the CPU inference
  // kernel given those statistics, and dX / dScale / dB against lib/train/grads/norm_grad.cpp given
  // the same statistics, in training and in eval.
  for (const Shape& xs : {Shape{3, 4, 5, 6}, Shape{7, 5}, Shape{1, 3, 1, 9}}) {
    const int64_t n = xs[0], f = xs[1], sp = shape_numel(xs) / (n * f);
    const Tensor x = test::random_tensor(xs, 59, -2, 3), scale = test::random_tensor({f}, 60, 0.5f, 1.5f),
                 bias = test::random_tensor({f}, 61), run_mean = test::random_tensor({f}, 62),
                 run_var = test::random_tensor({f}, 63, 0.5f, 2.0f), dy = test::random_tensor(xs, 64);
    const float eps = 1e-5f;
    for (bool training : {true, false}) {
      INFO("x " << shape_str(xs) << (training ? " training" : " eval"));
      const cuda::LaunchCtx one{cuda::LaunchShape{2, 3}};
      std::vector<float> mean(static_cast<size_t>(f)), inv(static_cast<size_t>(f));
      std::vector<float> upd_mean(run_mean.data<float>(), run_mean.data<float>() + f), upd_var(run_var.data<float>(), run_var.data<float>() + f);
      const float momentum = 0.9f;
      REQUIRE(cuda::host::batch_norm_stats(x.data<float>(), training ? nullptr : run_mean.data<float>(), run_var.data<float>(),
                                           mean.data(), inv.data(), n, f, sp, eps, upd_mean.data(), upd_var.data(), momentum,
                                           one) == 0);
      // The statistics the CPU inference kernel gets below: batch ones (double loop) or running ones.
      std::vector<float> ref_mean(static_cast<size_t>(f)), ref_var(static_cast<size_t>(f));
      for (int64_t c = 0; c < f; ++c) {
        double m = run_mean.data<float>()[c], v = run_var.data<float>()[c];
        if (training) {
          double sum = 0, sq = 0;
          for (int64_t b = 0; b < n; ++b)
            for (int64_t i = 0; i < sp; ++i) sum += x.data<float>()[(b * f + c) * sp + i];
          m = sum / static_cast<double>(n * sp);
          for (int64_t b = 0; b < n; ++b)
            for (int64_t i = 0; i < sp; ++i) sq += std::pow(x.data<float>()[(b * f + c) * sp + i] - m, 2);
          v = sq / static_cast<double>(n * sp);
        }
        ref_mean[static_cast<size_t>(c)] = static_cast<float>(m);
        ref_var[static_cast<size_t>(c)] = static_cast<float>(v);
        CHECK(mean[static_cast<size_t>(c)] == Approx(m).margin(1e-6));
        CHECK(inv[static_cast<size_t>(c)] == Approx(1.0 / std::sqrt(v + eps)).epsilon(1e-5));
        // The running statistics: moved in training (PyTorch's unbiased variance), untouched in eval
        // (the body is given them to update in both).
        const double count = static_cast<double>(n * sp), unbias = count > 1 ? count / (count - 1) : 1.0;
        const double want_mean = training ? momentum * run_mean.data<float>()[c] + (1 - momentum) * m : run_mean.data<float>()[c];
        const double want_var = training ? momentum * run_var.data<float>()[c] + (1 - momentum) * v * unbias : run_var.data<float>()[c];
        CHECK(upd_mean[static_cast<size_t>(c)] == Approx(want_mean).margin(1e-6));
        CHECK(upd_var[static_cast<size_t>(c)] == Approx(want_var).epsilon(1e-5));
      }
      const Tensor mean_t = Tensor::from<float>({f}, mean), inv_t = Tensor::from<float>({f}, inv);
      // Y against the CPU BatchNormalization kernel run with those statistics.
      const Tensor want_y = test::run_node("BatchNormalization",
                                           {x, scale, bias, Tensor::from<float>({f}, ref_mean), Tensor::from<float>({f}, ref_var)},
                                           {ir::Attribute::make_float("epsilon", eps)}, 1, 15, 1)
                                .at(0);
      test::check_every_launch(want_y, 1e-5, 1e-5, [&](float* y, const cuda::LaunchCtx& ctx) {
        return cuda::host::batch_norm_apply(x.data<float>(), scale.data<float>(), bias.data<float>(), mean.data(), inv.data(), y, n,
                                            f, sp, ctx);
      });

      const std::vector<Tensor> want = cpu_backward_inputs("BatchNormalization", 15, {x, scale, bias, run_mean, run_var}, want_y, dy,
                                                           {ir::Attribute::make_float("epsilon", eps)}, {1, 1, 1, 0, 0},
                                                           {mean_t, inv_t}, training);
      REQUIRE(want.at(0).defined());
      std::vector<double> sums(static_cast<size_t>(2 * f));
      test::check_every_launch(want.at(1), 1e-5, 1e-5, [&](float* ds, const cuda::LaunchCtx& ctx) {
        return cuda::host::batch_norm_grad_sums(x.data<float>(), mean.data(), inv.data(), dy.data<float>(), sums.data(), ds, nullptr,
                                                n, f, sp, ctx);
      });
      test::check_every_launch(want.at(2), 1e-5, 1e-5, [&](float* db, const cuda::LaunchCtx& ctx) {
        return cuda::host::batch_norm_grad_sums(x.data<float>(), mean.data(), inv.data(), dy.data<float>(), sums.data(), nullptr, db,
                                                n, f, sp, ctx);
      });
      test::check_every_launch(want.at(0), 1e-4, 1e-5, [&](float* dx, const cuda::LaunchCtx& ctx) {
        return cuda::host::batch_norm_grad_x(training, x.data<float>(), mean.data(), inv.data(), scale.data<float>(),
                                             dy.data<float>(), sums.data(), dx, n, f, sp, ctx);
      });
    }
  }
}

TEST_CASE("convolution backward through the cuDNN plan's host entries matches the CPU backward kernel",
          "[cuda][host_bodies][train]") {
  // The host side of conv_backward_data / conv_backward_filter runs the direct bodies over the
  // plan's geometry: this checks both the bodies and that the plan describes the backward the CPU
  // computes, in every layout cuDNN gets (1-D as 2-D with H = 1, 3-D, groups, depthwise).
  struct Case {
    Shape x, w;
    std::vector<int64_t> strides, dilations, pads;
    int64_t group;
  };
  const Case cases[] = {
      {{2, 3, 9, 8}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1},
      {{1, 4, 11, 10}, {6, 2, 3, 2}, {2, 3}, {1, 1}, {1, 0, 1, 0}, 2},
      {{2, 5, 7, 7}, {5, 1, 3, 3}, {2, 2}, {2, 2}, {2, 2, 2, 2}, 5},       // depthwise, dilated
      {{1, 2, 10, 10}, {3, 2, 3, 3}, {3, 3}, {1, 1}, {0, 0, 0, 0}, 1},     // last input rows never read
      {{2, 3, 13}, {4, 3, 4}, {3}, {2}, {2, 2}, 1},                        // 1-D
      {{1, 2, 5, 6, 4}, {3, 2, 2, 3, 2}, {1, 2, 1}, {1, 1, 2}, {1, 0, 1, 1, 0, 1}, 1},  // 3-D
  };
  uint32_t seed = 60;
  for (const Case& c : cases) {
    INFO("x " << shape_str(c.x) << " w " << shape_str(c.w) << " group " << c.group);
    const Tensor x = test::random_tensor(c.x, seed++);
    const Tensor w = test::random_tensor(c.w, seed++);
    const Tensor b = test::random_tensor({c.w[0]}, seed++);
    const std::vector<ir::Attribute> attrs = {
        ir::Attribute::make_ints("strides", c.strides), ir::Attribute::make_ints("dilations", c.dilations),
        ir::Attribute::make_ints("pads", c.pads), ir::Attribute::make_int("group", c.group)};
    const Tensor y = test::run_node("Conv", {x, w, b}, attrs, 1, 11, 1).at(0);
    const Tensor dy = test::random_tensor(y.shape(), seed++);
    const std::vector<Tensor> want = cpu_backward_inputs("Conv", 11, {x, w, b}, y, dy, attrs, {1, 1, 1});
    REQUIRE(want.at(0).defined());
    REQUIRE(want.at(1).defined());
    REQUIRE(want.at(2).defined());

    rt::cuda_plan::ConvRequest r{c.x, c.w, c.strides, c.dilations, c.pads, c.group};
    const rt::cuda_plan::ConvPlan plan = rt::cuda_plan::plan_conv(r);
    REQUIRE(plan.use_cudnn);
    REQUIRE(plan.y_shape == y.shape());
    test::check_every_launch(want.at(0), 1e-4, 1e-5, [&](float* dx, const cuda::LaunchCtx& lc) {
      return cuda::host::conv_backward_data(plan, w.data<float>(), dy.data<float>(), dx, nullptr, 0, lc).code;
    });
    test::check_every_launch(want.at(1), 1e-4, 1e-5, [&](float* dw, const cuda::LaunchCtx& lc) {
      return cuda::host::conv_backward_filter(plan, x.data<float>(), dy.data<float>(), dw, nullptr, 0, lc).code;
    });
    const int64_t spatial = y.numel() / (y.dim(0) * y.dim(1));
    test::check_every_launch(want.at(2), 1e-5, 1e-6, [&](float* db, const cuda::LaunchCtx& lc) {
      return cuda::host::channel_grad_sum(y.dim(0), y.dim(1), spatial, dy.data<float>(), db, lc);
    });
  }
  SECTION("the backward entries refuse non-FP32 plans with NOT_SUPPORTED, as the forward does") {
    rt::cuda_plan::ConvRequest r{{1, 2, 5, 5}, {2, 2, 3, 3}, {}, {}, {}, 1};
    r.type = rt::cuda_plan::ConvDataType::F16;
    const rt::cuda_plan::ConvPlan plan = rt::cuda_plan::plan_conv(r);
    const cuda::LaunchCtx lc{};
    CHECK(cuda::host::conv_backward_data(plan, nullptr, nullptr, nullptr, nullptr, 0, lc).code == cuda::kCudnnStatusNotSupported);
    CHECK(cuda::host::conv_backward_filter(plan, nullptr, nullptr, nullptr, nullptr, 0, lc).code == cuda::kCudnnStatusNotSupported);
  }
}

TEST_CASE("matrix-product backward GEMM plans compute the CPU backward kernels' gradients",
          "[cuda][host_bodies][train]") {
  namespace plan = rt::cuda_plan;
  // dA and dB through plan_matmul_grad -> plan_gemm -> the host gemm entry (the direct body over
  // the cuBLASLt plan), for every transpose combination and batched / broadcast products.
  auto run_grad = [](const plan::GemmGradRequest& g, const Tensor& dy, const Tensor& operand, const Tensor& want) {
    const plan::GemmPlan p = plan::plan_gemm(g.request);
    REQUIRE(p.use_cublaslt);
    const Tensor& first = g.grad_first ? dy : operand;
    const Tensor& second = g.grad_first ? operand : dy;
    test::check_every_launch(want, 1e-4, 1e-5, [&](float* out, const cuda::LaunchCtx& lc) {
      return cuda::host::gemm(p, first.data<float>(), second.data<float>(), out, nullptr, 0, lc).code;
    });
  };
  SECTION("Gemm with transA / transB") {
    const int64_t M = 5, K = 7, N = 3;
    uint32_t seed = 80;
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        INFO("transA " << ta << " transB " << tb);
        const Tensor a = test::random_tensor(ta ? Shape{K, M} : Shape{M, K}, seed++);
        const Tensor b = test::random_tensor(tb ? Shape{N, K} : Shape{K, N}, seed++);
        const std::vector<ir::Attribute> attrs = {ir::Attribute::make_int("transA", ta), ir::Attribute::make_int("transB", tb)};
        const Tensor y = test::run_node("Gemm", {a, b}, attrs, 1, 13, 1).at(0);
        const Tensor dy = test::random_tensor(y.shape(), seed++);
        const std::vector<Tensor> want = cpu_backward_inputs("Gemm", 13, {a, b}, y, dy, attrs, {1, 1});
        plan::GemmRequest f;
        f.m = M;
        f.n = N;
        f.k = K;
        f.trans_a = ta != 0;
        f.trans_b = tb != 0;
        const plan::MatmulGradRequests g = plan::plan_matmul_grad(f);
        run_grad(g.da, dy, b, want.at(0));
        run_grad(g.db, dy, a, want.at(1));
      }
  }
  SECTION("MatMul: equal batches (strided-batched) and a 2-D B folded into M") {
    struct Case {
      Shape a, b;
      plan::GemmRequest f;
    };
    plan::GemmRequest batched;
    batched.m = 5, batched.k = 7, batched.n = 4, batched.batch = 3;
    plan::GemmRequest folded;
    folded.m = 2 * 3 * 5, folded.k = 7, folded.n = 4;
    uint32_t seed = 90;
    for (const Case& c : {Case{{3, 5, 7}, {3, 7, 4}, batched}, Case{{2, 3, 5, 7}, {7, 4}, folded}}) {
      INFO("A " << shape_str(c.a) << " B " << shape_str(c.b));
      const Tensor a = test::random_tensor(c.a, seed++);
      const Tensor b = test::random_tensor(c.b, seed++);
      const Tensor y = test::run_node("MatMul", {a, b}, {}, 1, 13, 1).at(0);
      const Tensor dy = test::random_tensor(y.shape(), seed++);
      const std::vector<Tensor> want = cpu_backward_inputs("MatMul", 13, {a, b}, y, dy, {}, {1, 1});
      const plan::MatmulGradRequests g = plan::plan_matmul_grad(c.f);
      run_grad(g.da, dy, b, want.at(0));
      run_grad(g.db, dy, a, want.at(1));
    }
  }
  SECTION("a forward with leading dimensions is refused") {
    plan::GemmRequest f;
    f.m = f.n = f.k = 4;
    f.lda = 8;
    CHECK_THROWS_WITH(plan::plan_matmul_grad(f), Catch::Contains("packed"));
  }
}

TEST_CASE("Clip, reduction, global pooling, PRelu, Where, Expand and Pad backward bodies match the CPU backward kernels",
          "[cuda][host_bodies][train]") {
  namespace plan = rt::cuda_plan;
  auto to_dims = [](const cuda::Broadcast2& bc, const Shape& in) {
    std::vector<int64_t> d(static_cast<size_t>(bc.rank), 1);
    for (size_t i = 0; i < in.size(); ++i) d[static_cast<size_t>(bc.rank) - in.size() + i] = in[i];
    return d;
  };
  SECTION("Clip: the bounds themselves pass, an absent bound is infinite") {
    Tensor x = test::random_tensor({3, 5, 7}, 100, -2, 2);
    x.data<float>()[0] = -0.5f;  // exactly on the bounds
    x.data<float>()[1] = 1.25f;
    const Tensor lo = Tensor::scalar<float>(-0.5f), hi = Tensor::scalar<float>(1.25f);
    for (bool with_lo : {true, false}) {
      INFO("min given: " << with_lo);
      const std::vector<Tensor> inputs = {x, with_lo ? lo : Tensor(), hi};
      const Tensor y = test::run_node("Clip", inputs, {}, 1, 13, 1).at(0);
      const Tensor dy = test::random_tensor(y.shape(), 101);
      const Tensor want = cpu_backward_inputs("Clip", 13, inputs, y, dy, {}, {1, 0, 0}).at(0);
      REQUIRE(want.defined());
      const float l = with_lo ? -0.5f : -std::numeric_limits<float>::infinity();
      test::check_every_launch(want, 0, 0, [&](float* dx, const cuda::LaunchCtx& c) {
        return cuda::host::clip_grad(x.data<float>(), dy.data<float>(), dx, x.numel(), l, 1.25f, c);
      });
    }
  }
  SECTION("ReduceSum / ReduceMean (keepdims on and off) and GlobalAveragePool") {
    const Tensor x = test::random_tensor({2, 3, 4, 5}, 102);
    const Tensor axes = Tensor::from<int64_t>({2}, {1, 3});
    for (int keep : {1, 0})
      for (bool mean : {false, true}) {
        INFO((mean ? "ReduceMean" : "ReduceSum") << " keepdims " << keep);
        const std::vector<ir::Attribute> attrs =
            mean ? std::vector<ir::Attribute>{ir::Attribute::make_int("keepdims", keep), ir::Attribute::make_ints("axes", {1, 3})}
                 : std::vector<ir::Attribute>{ir::Attribute::make_int("keepdims", keep)};
        const std::vector<Tensor> inputs = mean ? std::vector<Tensor>{x} : std::vector<Tensor>{x, axes};
        const char* op = mean ? "ReduceMean" : "ReduceSum";
        const Tensor y = test::run_node(op, inputs, attrs, 1, 13, 1).at(0);
        const Tensor dy = test::random_tensor(y.shape(), 103);
        std::vector<char> wanted(inputs.size(), 0);
        wanted[0] = 1;
        const Tensor want = cpu_backward_inputs(op, 13, inputs, y, dy, attrs, wanted).at(0);
        REQUIRE(want.defined());
        const cuda::StridedView v = plan::make_broadcast_view({2, 1, 4, 1}, x.shape());
        test::check_every_launch(want, 0, 0, [&](float* dx, const cuda::LaunchCtx& c) {
          return cuda::host::broadcast_divide(v, mean ? 15.0f : 1.0f, dy.data<float>(), dx, x.numel(), c);
        });
      }
    const Tensor y = test::run_node("GlobalAveragePool", {x}, {}, 1, 13, 1).at(0);
    const Tensor dy = test::random_tensor(y.shape(), 104);
    const Tensor want = cpu_backward_inputs("GlobalAveragePool", 13, {x}, y, dy, {}, {1}).at(0);
    const cuda::StridedView v = plan::make_broadcast_view(y.shape(), x.shape());
    test::check_every_launch(want, 0, 0, [&](float* dx, const cuda::LaunchCtx& c) {
      return cuda::host::broadcast_divide(v, 20.0f, dy.data<float>(), dx, x.numel(), c);
    });
    CHECK_THROWS_WITH(plan::make_broadcast_view({2, 3}, {3, 3}), Catch::Contains("do not broadcast"));
    CHECK_THROWS_WITH(plan::make_broadcast_view({1, 3}, {3}), Catch::Contains("without changing it"));
  }
  SECTION("ReduceMax / ReduceMin (first match, ties and NaN) and GlobalMaxPool (first strict maximum)") {
    Tensor x = test::random_tensor({3, 4, 5}, 105, -2, 2);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::round(x.data<float>()[i] * 2.0f) / 2.0f;  // ties
    x.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
    const bool reduced[3] = {true, false, true};
    const int64_t dims[3] = {3, 4, 5};
    for (const char* op : {"ReduceMax", "ReduceMin"}) {
      INFO(op);
      const std::vector<ir::Attribute> attrs = {ir::Attribute::make_ints("axes", {0, 2})};
      const Tensor y = test::run_node(op, {x}, attrs, 1, 13, 1).at(0);
      const Tensor dy = test::random_tensor(y.shape(), 106);
      const Tensor want = cpu_backward_inputs(op, 13, {x}, y, dy, attrs, {1}).at(0);
      REQUIRE(want.defined());
      test::check_every_launch(want, 0, 0, [&](float* dx, const cuda::LaunchCtx& c) {
        return cuda::host::reduce_extreme_grad(3, dims, reduced, x.data<float>(), y.data<float>(), dy.data<float>(), dx, 4, c);
      });
    }
    const Tensor xp = test::random_tensor({2, 3, 4, 5}, 107, -2, 2);
    Tensor xt = xp.clone();
    for (int64_t i = 0; i < xt.numel(); ++i) xt.data<float>()[i] = std::round(xt.data<float>()[i]);  // many ties
    const Tensor y = test::run_node("GlobalMaxPool", {xt}, {}, 1, 13, 1).at(0);
    const Tensor dy = test::random_tensor(y.shape(), 108);
    const Tensor want = cpu_backward_inputs("GlobalMaxPool", 13, {xt}, y, dy, {}, {1}).at(0);
    const bool spatial[4] = {false, false, true, true};
    const int64_t gdims[4] = {2, 3, 4, 5};
    test::check_every_launch(want, 0, 0, [&](float* dx, const cuda::LaunchCtx& c) {
      return cuda::host::reduce_extreme_grad(4, gdims, spatial, xt.data<float>(), nullptr, dy.data<float>(), dx, 6, c);
    });
  }
  SECTION("PRelu: dX and the slope's gradient summed over the broadcast") {
    Tensor x = test::random_tensor({2, 3, 4, 5}, 109);
    x.data<float>()[3] = 0.0f;
    const Tensor slope = test::random_tensor({3, 1, 1}, 110, 0.05f, 0.5f);
    const Tensor y = test::run_node("PRelu", {x, slope}, {}, 1, 16, 1).at(0);
    const Tensor dy = test::random_tensor(y.shape(), 111);
    const std::vector<Tensor> want = cpu_backward_inputs("PRelu", 16, {x, slope}, y, dy, {}, {1, 1});
    REQUIRE(want.at(0).defined());
    REQUIRE(want.at(1).defined());
    Shape joined;
    const cuda::Broadcast2 bc = plan::make_broadcast2(x.shape(), slope.shape(), &joined);
    test::check_every_launch(want.at(0), 0, 0, [&](float* dx, const cuda::LaunchCtx& c) {
      return cuda::host::prelu_grad(bc, x.data<float>(), slope.data<float>(), dy.data<float>(), dx, nullptr, x.numel(), c);
    });
    const cuda::Broadcast2 back = plan::make_broadcast2(slope.shape(), x.shape(), &joined);
    const std::vector<int64_t> in_dims = to_dims(back, slope.shape());
    test::check_every_launch(want.at(1), 1e-5, 1e-6, [&](float* ds, const cuda::LaunchCtx& c) {
      std::vector<float> term(static_cast<size_t>(x.numel()));
      if (int st = cuda::host::prelu_grad(bc, x.data<float>(), slope.data<float>(), dy.data<float>(), nullptr, term.data(), x.numel(), c))
        return st;
      return cuda::host::sum_to_shape(back, in_dims.data(), term.data(), ds, slope.numel(), c);
    });
  }
  SECTION("Where: each branch gets dY where the condition picks it, summed to its shape") {
    const Tensor xb = test::random_tensor({3, 1, 5}, 112);
    Tensor cond(DType::Bool, {4, 1});
    const bool pattern[4] = {true, false, false, true};
    for (int i = 0; i < 4; ++i) cond.data<bool>()[i] = pattern[i];
    const Tensor yb = test::random_tensor({2, 1, 4, 5}, 113);
    const Tensor y = test::run_node("Where", {cond, xb, yb}, {}, 1, 16, 1).at(0);
    REQUIRE(y.shape() == Shape{2, 3, 4, 5});
    const Tensor dy = test::random_tensor(y.shape(), 114);
    const std::vector<Tensor> want = cpu_backward_inputs("Where", 16, {cond, xb, yb}, y, dy, {}, {0, 1, 1});
    Shape joined;
    const cuda::Broadcast2 cb = plan::make_broadcast2(cond.shape(), y.shape(), &joined);
    for (int side = 1; side <= 2; ++side) {
      INFO("branch " << side);
      const Shape& in = side == 1 ? xb.shape() : yb.shape();
      const cuda::Broadcast2 back = plan::make_broadcast2(in, y.shape(), &joined);
      const std::vector<int64_t> in_dims = to_dims(back, in);
      REQUIRE(want.at(static_cast<size_t>(side)).defined());
      test::check_every_launch(want.at(static_cast<size_t>(side)), 1e-6, 1e-6, [&](float* d, const cuda::LaunchCtx& c) {
        std::vector<float> masked(static_cast<size_t>(y.numel()));
        if (int st = cuda::host::where_grad(cb, cond.data<bool>(), dy.data<float>(), masked.data(), y.numel(), side == 1, c))
          return st;
        return cuda::host::sum_to_shape(back, in_dims.data(), masked.data(), d, shape_numel(in), c);
      });
    }
  }
  SECTION("Expand: dY summed to the input's shape (SumToShapeBody)") {
    const Tensor x = test::random_tensor({3, 1, 5}, 117);
    const std::vector<Tensor> inputs = {x, Tensor::from<int64_t>({4}, {2, 3, 4, 1})};
    const Tensor y = test::run_node("Expand", inputs, {}, 1, 13, 1).at(0);
    REQUIRE(y.shape() == Shape{2, 3, 4, 5});
    const Tensor dy = test::random_tensor(y.shape(), 118);
    const Tensor want = cpu_backward_inputs("Expand", 13, inputs, y, dy, {}, {1, 0}).at(0);
    REQUIRE(want.defined());
    Shape joined;
    const cuda::Broadcast2 back = plan::make_broadcast2(x.shape(), y.shape(), &joined);
    const std::vector<int64_t> in_dims = to_dims(back, x.shape());
    test::check_every_launch(want, 1e-6, 1e-6, [&](float* dx, const cuda::LaunchCtx& c) {
      return cuda::host::sum_to_shape(back, in_dims.data(), dy.data<float>(), dx, x.numel(), c);
    });
  }
  SECTION("Pad (constant): dX is the window of dY that X occupies") {
    const Tensor x = test::random_tensor({2, 3, 4}, 115);
    const std::vector<int64_t> pads = {0, 1, 2, 1, 0, 3};
    const std::vector<Tensor> inputs = {x, Tensor::from<int64_t>({6}, pads)};
    const Tensor y = test::run_node("Pad", inputs, {}, 1, 13, 1).at(0);
    const Tensor dy = test::random_tensor(y.shape(), 116);
    const Tensor want = cpu_backward_inputs("Pad", 13, inputs, y, dy, {}, {1, 0}).at(0);
    REQUIRE(want.defined());
    const cuda::StridedView v = plan::make_pad_grad_view(x.shape(), pads);
    test::check_every_launch(want, 0, 0, [&](float* dx, const cuda::LaunchCtx& c) {
      return cuda::host::strided_copy(v, dy.data<float>(), dx, x.numel(), c);
    });
    CHECK_THROWS_WITH(plan::make_pad_grad_view(x.shape(), {0, -1, 0, 0, 0, 0}), Catch::Contains("negative"));
  }
}

TEST_CASE("sum-to-shape body reduces a broadcast gradient to each input's shape", "[cuda][host_bodies][train]") {
  // The gradient of an input that was broadcast in Add/Mul/...: dY summed over the broadcast
  // dimensions, checked against a plain double loop.
  struct Case {
    Shape out, in;
  };
  for (const Case& c : {Case{{2, 3, 5}, {3, 1}}, Case{{2, 3, 5}, {5}}, Case{{4, 1, 6}, {1, 1, 6}}, Case{{2, 3, 4, 5}, {2, 1, 4, 1}},
                        Case{{3, 4}, {3, 4}}, Case{{3, 4}, {}}}) {
    INFO("out " << shape_str(c.out) << " in " << shape_str(c.in));
    const Tensor dy = test::random_tensor(c.out, 25);
    Shape joined;
    const cuda::Broadcast2 bc = rt::cuda_plan::make_broadcast2(c.in, c.out, &joined);
    REQUIRE(joined == c.out);
    std::vector<int64_t> in_dims(static_cast<size_t>(bc.rank), 1);
    for (size_t d = 0; d < c.in.size(); ++d) in_dims[static_cast<size_t>(bc.rank) - c.in.size() + d] = c.in[d];
    const int64_t in_n = shape_numel(c.in);
    std::vector<double> ref(static_cast<size_t>(in_n), 0.0);
    for (int64_t i = 0; i < dy.numel(); ++i) {
      int64_t rem = i, in_index = 0, stride = 1;
      for (int d = bc.rank - 1; d >= 0; --d) {
        const int64_t coord = rem % bc.dims[d];
        rem /= bc.dims[d];
        if (in_dims[static_cast<size_t>(d)] != 1) in_index += coord * stride;
        stride *= in_dims[static_cast<size_t>(d)];
      }
      ref[static_cast<size_t>(in_index)] += dy.data<float>()[i];
    }
    Tensor want(DType::Float32, c.in);
    for (int64_t i = 0; i < in_n; ++i) want.data<float>()[i] = static_cast<float>(ref[static_cast<size_t>(i)]);
    test::check_every_launch(want, 1e-6, 1e-6, [&](float* din, const cuda::LaunchCtx& ctx) {
      return cuda::host::sum_to_shape(bc, in_dims.data(), dy.data<float>(), din, in_n, ctx);
    });
  }
}

TEST_CASE("Pow's slope body is B * A^(B-1), exact for squares, cubes and square roots", "[cuda][host_bodies][train]") {
  // Per exponent, bases broadcast against it; the float64 slope is the reference.
  for (const float exponent : {2.0f, 1.0f, 3.0f, 0.5f, -1.5f, 2.7f, 0.0f}) {
    INFO("exponent " << exponent);
    const Tensor a = test::random_tensor({3, 7}, 26, 0.1f, 3.0f);
    const Tensor b = Tensor::scalar<float>(exponent);
    Shape joined;
    const cuda::Broadcast2 bc = rt::cuda_plan::make_broadcast2(a.shape(), b.shape(), &joined);
    REQUIRE(joined == a.shape());
    Tensor want(DType::Float32, a.shape());
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double x = a.data<float>()[i];
      want.data<float>()[i] = static_cast<float>(exponent * std::pow(x, exponent - 1.0));
    }
    test::check_every_launch(want, 2e-6, 1e-7, [&](float* y, const cuda::LaunchCtx& ctx) {
      return cuda::host::binary(cuda::BinaryOp::PowSlope, bc, a.data<float>(), b.data<float>(), y, want.numel(), ctx);
    });
  }
  // The exact forms keep a zero base finite where the general formula would not (0^-0.5 aside):
  // the slope of x^2 at 0 is 0, of x^1 is 1, of x^3 is 0.
  const Tensor zero = Tensor::scalar<float>(0.0f);
  for (const auto& [exponent, slope] : {std::pair{2.0f, 0.0f}, std::pair{1.0f, 1.0f}, std::pair{3.0f, 0.0f}}) {
    const Tensor b = Tensor::scalar<float>(exponent);
    Shape joined;
    const cuda::Broadcast2 bc = rt::cuda_plan::make_broadcast2(zero.shape(), b.shape(), &joined);
    Tensor want = Tensor::scalar<float>(slope);
    test::check_every_launch(want, 0, 0, [&](float* y, const cuda::LaunchCtx& ctx) {
      return cuda::host::binary(cuda::BinaryOp::PowSlope, bc, zero.data<float>(), b.data<float>(), y, 1, ctx);
    });
  }
}

TEST_CASE("unscale body matches GradScaler::unscale, non-finite values included", "[cuda][host_bodies][train]") {
  for (bool with_inf : {false, true}) {
    INFO("with inf " << with_inf);
    Tensor g = test::random_tensor({41}, 26, -100, 100);
    if (with_inf) g.data<float>()[17] = std::numeric_limits<float>::infinity();
    std::vector<train::Parameter> ps(1);
    ps[0].name = "w";
    ps[0].value = Tensor::zeros(DType::Float32, {41});
    ps[0].grad = g.clone();
    train::GradScaler scaler;
    const float inv = static_cast<float>(1.0 / scaler.scale());
    const bool cpu_found = scaler.unscale(ps);
    CHECK(cpu_found == with_inf);
    for (const cuda::LaunchCtx& c : test::launches_for(41)) {
      std::vector<float> gd(g.data<float>(), g.data<float>() + 41);
      int found = 0;
      REQUIRE(cuda::host::unscale(inv, gd.data(), 41, &found, c) == 0);
      CHECK((found != 0) == with_inf);
      CHECK(test::first_mismatch(gd.data(), ps[0].grad.data<float>(), 41, 0, 0) == -1);
    }
  }
}

TEST_CASE("sum-of-squares partials give train::grad_norm; the value check flags what the training loop's check does",
          "[cuda][host_bodies][train]") {
  // Two gradients of odd sizes added into one set of partials, as DeviceParameters::grad_norm does.
  std::vector<train::Parameter> ps(2);
  ps[0].grad = test::random_tensor({41}, 31, -3, 3);
  ps[1].grad = test::random_tensor({7, 3}, 32, -1, 1);
  const double want = train::grad_norm(ps);
  for (const cuda::LaunchCtx& c : test::launches_for(41)) {
    INFO("launch " << test::launch_str(c));
    std::vector<double> partials(static_cast<size_t>(c.shape.blocks * c.shape.threads), std::nan(""));
    REQUIRE(cuda::host::sum_squares(ps[0].grad.data<float>(), 41, partials.data(), false, c) == 0);
    REQUIRE(cuda::host::sum_squares(ps[1].grad.data<float>(), 21, partials.data(), true, c) == 0);
    double total = std::nan("");
    REQUIRE(cuda::host::sum_partials(partials.data(), static_cast<int64_t>(partials.size()), &total, c) == 0);
    CHECK(std::sqrt(total) == Approx(want).epsilon(1e-12));
  }
  struct Case {
    const char* what;
    int64_t at;
    float value;
    bool positive;
    bool flagged;
  };
  for (const Case& k : {Case{"finite", -1, 0, false, false}, Case{"NaN", 40, std::nanf(""), false, true},
                        Case{"-inf", 0, -std::numeric_limits<float>::infinity(), false, true},
                        Case{"zero step size", 13, 0.0f, true, true}, Case{"negative weight", 13, -1.0f, false, false},
                        Case{"positive step sizes", -1, 0, true, false}}) {
    INFO(k.what);
    Tensor w = test::random_tensor({41}, 33, 0.01f, 1.0f);
    if (k.at >= 0) w.data<float>()[k.at] = k.value;
    for (const cuda::LaunchCtx& c : test::launches_for(41)) {
      int flag = 0;
      REQUIRE(cuda::host::check_values(w.data<float>(), 41, k.positive, &flag, c) == 0);
      CHECK((flag != 0) == k.flagged);
    }
  }
}

TEST_CASE("SGD and AdamW bodies take the same steps as the CPU optimizers", "[cuda][host_bodies][train]") {
  // Three steps with changing gradients; weight decay, momentum with Nesterov (SGD), and a
  // learned-scale parameter group stepped in log space.
  const int64_t n = 29;
  auto params = [&] {
    std::vector<train::Parameter> ps(2);
    ps[0].name = "w";
    ps[0].value = test::random_tensor({n}, 27);
    ps[1].name = "s";
    ps[1].value = test::random_tensor({n}, 28, 0.01f, 0.1f);
    for (auto& p : ps) p.grad = Tensor::zeros(DType::Float32, {n});
    return ps;
  };
  const std::vector<train::ParamGroup> groups = {train::ParamGroup{"w", {0}, 1.0, 0.01, false},
                                                 train::ParamGroup{"s", {1}, 0.5, 0.0, true}};
  const double lr = 0.05;
  for (bool adamw : {false, true}) {
    INFO((adamw ? "adamw" : "sgd"));
    std::vector<train::Parameter> cpu = params();
    train::SgdOptions so;
    so.momentum = 0.9;
    so.nesterov = true;
    train::AdamWOptions ao;
    std::unique_ptr<train::Optimizer> opt = adamw ? train::make_adamw(groups, ao) : train::make_sgd(groups, so);
    // Device state: per parameter the value, momentum (SGD) or m and v (AdamW).
    std::vector<std::vector<float>> w(2), s1(2, std::vector<float>(n, 0.0f)), s2(2, std::vector<float>(n, 0.0f));
    for (int p = 0; p < 2; ++p) w[p].assign(cpu[p].value.data<float>(), cpu[p].value.data<float>() + n);
    for (int step = 1; step <= 3; ++step) {
      INFO("step " << step);
      std::vector<Tensor> grads;
      for (int p = 0; p < 2; ++p) {
        grads.push_back(test::random_tensor({n}, 30 + 2 * step + p));
        cpu[p].grad = grads.back().clone();
      }
      opt->step(cpu, lr);
      for (int p = 0; p < 2; ++p) {
        const train::ParamGroup& g = groups[p];
        const double glr = lr * g.lr_scale;
        if (adamw) {
          const double bc1 = 1.0 - std::pow(ao.beta1, step), bc2 = 1.0 - std::pow(ao.beta2, step);
          cuda::AdamWStep a;
          a.decay = static_cast<float>(g.log_space ? 1.0 : 1.0 - glr * g.weight_decay);
          a.one_minus_b1 = static_cast<float>(1.0 - ao.beta1);
          a.one_minus_b2 = static_cast<float>(1.0 - ao.beta2);
          a.b2 = static_cast<float>(ao.beta2);
          a.step_size = static_cast<float>(glr / bc1);
          a.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
          a.eps = static_cast<float>(ao.eps);
          a.log_space = g.log_space;
          REQUIRE(cuda::host::adamw_step(a, w[p].data(), grads[p].data<float>(), s1[p].data(), s2[p].data(), n,
                                         cuda::LaunchCtx{cuda::LaunchShape{3, 7}}) == 0);
        } else {
          cuda::SgdStep sg;
          sg.rate = static_cast<float>(glr);
          sg.weight_decay = static_cast<float>(g.weight_decay);
          sg.momentum = static_cast<float>(so.momentum);
          sg.damp = static_cast<float>(1.0 - so.dampening);
          sg.nesterov = so.nesterov;
          sg.first = step == 1;
          sg.log_space = g.log_space;
          REQUIRE(cuda::host::sgd_step(sg, w[p].data(), grads[p].data<float>(), s1[p].data(), n,
                                       cuda::LaunchCtx{cuda::LaunchShape{2, 5}}) == 0);
        }
        INFO("parameter " << p);
        CHECK(test::first_mismatch(w[p].data(), cpu[p].value.data<float>(), n, 1e-6, 1e-7) == -1);
      }
    }
  }
}

// The chunked sums (kernels/bodies/chunk_sum.cuh) behind the per-channel reductions: long segments
// cut into many runs, a per-tensor sum of 300,000 values among them. Each total must be within
// double rounding of a long double serial sum (rounded to float, as the entry points store it), and
// bit-identical across launch shapes (the runs depend on the problem's size alone).
TEST_CASE("chunked per-channel sums match a serial sum and do not depend on the launch", "[cuda][host_bodies][train]") {
  struct Case {
    int64_t outer, channels, inner;
  };
  // [1, 5000, 300]: 10,000 runs, more than a one-thread launch's 4,096 blocks, so pass 1 walks its
  // grid-stride loop.
  for (const Case& k : {Case{1, 1, 300000}, Case{3, 5, 1000}, Case{64, 3, 49}, Case{2, 700, 130}, Case{1, 4, 1},
                        Case{1, 5000, 300}}) {
    INFO("[" << k.outer << ", " << k.channels << ", " << k.inner << "]");
    const int64_t n = k.outer * k.channels * k.inner;
    const Tensor xt = test::random_tensor({n}, 91, -3.0f, 3.0f);
    const float* x = xt.data<float>();
    std::vector<double> xd(x, x + n);
    std::vector<float> want(static_cast<size_t>(k.channels));
    for (int64_t c = 0; c < k.channels; ++c) {
      long double s = 0.0L;
      for (int64_t o = 0; o < k.outer; ++o)
        for (int64_t i = 0; i < k.inner; ++i) s += x[(o * k.channels + c) * k.inner + i];
      want[static_cast<size_t>(c)] = static_cast<float>(static_cast<double>(s));
    }
    std::vector<float> first;
    for (const cuda::LaunchCtx& c : {cuda::LaunchCtx{cuda::LaunchShape{1, 1}}, cuda::LaunchCtx{cuda::LaunchShape{3, 7}},
                                     cuda::LaunchCtx{cuda::launch_shape_for(k.channels, 64)}}) {
      INFO("launch " << test::launch_str(c));
      std::vector<float> got_conv = test::nan_filled(static_cast<size_t>(k.channels));
      std::vector<float> got_quant = test::nan_filled(static_cast<size_t>(k.channels));
      REQUIRE(cuda::host::channel_grad_sum(k.outer, k.channels, k.inner, x, got_conv.data(), c) == 0);
      REQUIRE(cuda::host::channel_sum(k.outer, k.channels, k.inner, xd.data(), nullptr, got_quant.data(), c) == 0);
      CHECK(test::first_mismatch(got_conv.data(), want.data(), k.channels, 1e-6, 1e-6) == -1);
      CHECK(got_quant == got_conv);
      if (first.empty()) first = got_conv;
      CHECK(got_conv == first);
    }
  }
}
