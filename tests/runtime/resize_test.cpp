// Resize and Upsample against a naive reference written the way ONNX's Python reference is: a
// recursive N-D interpolation that, for each output coordinate, edge-pads the input line, takes
// the n nearest neighbours (ties to the lower index) and dots them with the mode's coefficients.
// Covers every mode, coordinate transform and nearest rounding, cubic_coeff_a, exclude_outside,
// tf_crop_and_resize extrapolation, antialias, axes, keep_aspect_ratio_policy, the fused float32
// NCHW bilinear path, integer data, opset 10 and Upsample, and malformed nodes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/cpu/resize.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;

namespace {

using Attrs = std::vector<ir::Attribute>;

std::vector<Tensor> run_node(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                             size_t n_outputs = 1, int opset = 17, int threads = 2) {
  return test::run_node(op, inputs, attrs, n_outputs, opset, threads);
}

Tensor ints(std::vector<int64_t> v) { return Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v); }
Tensor floats(std::vector<float> v) { return Tensor::from<float>({static_cast<int64_t>(v.size())}, v); }

struct RefSpec {
  std::string mode = "nearest";
  std::string coord = "half_pixel";
  std::string nearest = "round_prefer_floor";  // or "simple" (opset 10 / Upsample)
  double a = -0.75;
  bool exclude_outside = false;
  bool antialias = false;
  double extrapolation = 0.0;
  std::vector<double> scales;  // per axis
  Shape out;                   // per axis
  std::vector<double> roi;     // starts then ends, per axis
};

double cubic(double x, double A) {
  x = std::fabs(x);
  if (x <= 1) return (A + 2) * x * x * x - (A + 3) * x * x + 1;
  if (x < 2) return A * x * x * x - 5 * A * x * x + 8 * A * x - 4 * A;
  return 0;
}

double interp_1d(const std::vector<double>& data, size_t axis, double x, const RefSpec& s) {
  const double L = static_cast<double>(data.size());
  const double scale = s.scales[axis];
  const double out_w = scale * L;
  double xo;
  if (s.coord == "align_corners") {
    xo = out_w == 1 ? 0 : x * (L - 1) / (out_w - 1);
  } else if (s.coord == "asymmetric") {
    xo = x / scale;
  } else if (s.coord == "tf_crop_and_resize") {
    const double r0 = s.roi[axis], r1 = s.roi[axis + s.scales.size()];
    xo = out_w == 1 ? (r1 - r0) * (L - 1) / 2 : x * (r1 - r0) * (L - 1) / (out_w - 1);
    xo += r0 * (L - 1);
    if (xo < 0 || xo > L - 1) return s.extrapolation;
  } else if (s.coord == "pytorch_half_pixel") {
    xo = out_w == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
  } else if (s.coord == "half_pixel") {
    xo = (x + 0.5) / scale - 0.5;
  } else if (s.coord == "half_pixel_symmetric") {
    const double adj = static_cast<double>(s.out[axis]) / out_w;
    xo = L / 2 * (1 - adj) + (x + 0.5) / scale - 0.5;
  } else {  // tf_half_pixel_for_nn
    xo = (x + 0.5) / scale;
  }
  const double xi = std::floor(xo);
  const double ratio = xo == xi ? 1.0 : xo - xi;
  std::vector<double> c;
  if (s.mode == "nearest") {
    if (ratio == 1.0) c = {0, 1};
    else if (s.nearest == "round_prefer_floor") c = {double(ratio <= 0.5), double(ratio > 0.5)};
    else if (s.nearest == "round_prefer_ceil") c = {double(ratio < 0.5), double(ratio >= 0.5)};
    else if (s.nearest == "floor") c = {1, 0};
    else if (s.nearest == "ceil") c = {0, 1};
    else c = scale < 1 ? std::vector<double>{0, 1} : std::vector<double>{1, 0};  // simple: ceil down, floor up
  } else if (s.mode == "linear") {
    if (s.antialias && scale < 1) {
      const int start = static_cast<int>(std::floor(-1 / scale) + 1);
      const int fp = 2 - 2 * start;
      double sum = 0;
      for (int i = start; i < start + fp; ++i) {
        c.push_back(std::clamp(1 - std::fabs((i - ratio) * scale), 0.0, 1.0));
        sum += c.back();
      }
      for (double& v : c) v /= sum;
    } else {
      c = {1 - ratio, ratio};
    }
  } else {
    if (s.antialias && scale < 1) {
      const int start = static_cast<int>(std::floor(-2 / scale) + 1);
      double sum = 0;
      for (int i = start; i < 2 - start; ++i) {
        c.push_back(cubic(scale * (i - ratio), s.a));
        sum += c.back();
      }
      for (double& v : c) v /= sum;
    } else {
      c = {cubic(ratio + 1, s.a), cubic(ratio, s.a), cubic(1 - ratio, s.a), cubic(2 - ratio, s.a)};
    }
  }
  // Edge-pad, then the n nearest padded positions (ties to the lower index), in order.
  const int64_t n = static_cast<int64_t>(c.size());
  const int64_t pad = (n + 1) / 2;
  const int64_t PL = static_cast<int64_t>(data.size()) + 2 * pad;
  std::vector<int64_t> cand(static_cast<size_t>(PL));
  std::iota(cand.begin(), cand.end(), 0);
  const double xp = xo + static_cast<double>(pad);
  std::stable_sort(cand.begin(), cand.end(), [&](int64_t p, int64_t q) {
    return std::fabs(xp - static_cast<double>(p)) < std::fabs(xp - static_cast<double>(q));
  });
  cand.resize(static_cast<size_t>(n));
  std::sort(cand.begin(), cand.end());
  if (s.exclude_outside) {
    double sum = 0;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t idx = cand[static_cast<size_t>(k)] - pad;
      if (idx < 0 || idx >= static_cast<int64_t>(data.size())) c[static_cast<size_t>(k)] = 0;
      sum += c[static_cast<size_t>(k)];
    }
    for (double& v : c) v /= sum;
  }
  double acc = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t idx = std::clamp<int64_t>(cand[static_cast<size_t>(k)] - pad, 0, static_cast<int64_t>(data.size()) - 1);
    acc += c[static_cast<size_t>(k)] * data[static_cast<size_t>(idx)];
  }
  return acc;
}

// Value of output position `x` interpolated over axes [axis, rank) of the block `data`/`shape`.
double interp_nd(const std::vector<double>& data, const Shape& shape, size_t axis, const std::vector<int64_t>& x,
                 const RefSpec& s) {
  if (axis + 1 == shape.size()) return interp_1d(data, axis, static_cast<double>(x[axis]), s);
  const int64_t n0 = shape[axis];
  const int64_t block = static_cast<int64_t>(data.size()) / std::max<int64_t>(n0, 1);
  std::vector<double> line(static_cast<size_t>(n0));
  for (int64_t i = 0; i < n0; ++i) {
    std::vector<double> sub(data.begin() + i * block, data.begin() + (i + 1) * block);
    line[static_cast<size_t>(i)] = interp_nd(sub, shape, axis + 1, x, s);
  }
  // Interpolate along `axis` over the line of sub-results.
  return interp_1d(line, axis, static_cast<double>(x[axis]), s);
}

Tensor resize_ref(const Tensor& in, const RefSpec& s) {
  std::vector<double> data(static_cast<size_t>(in.numel()));
  for (int64_t i = 0; i < in.numel(); ++i) data[static_cast<size_t>(i)] = in.get_double(i);
  Tensor out(DType::Float32, s.out);
  for (int64_t i = 0; i < out.numel(); ++i) {
    std::vector<int64_t> x(s.out.size());
    int64_t rem = i;
    for (size_t d = s.out.size(); d-- > 0;) {
      x[d] = rem % s.out[d];
      rem /= s.out[d];
    }
    out.data<float>()[i] = static_cast<float>(interp_nd(data, in.shape(), 0, x, s));
  }
  return out;
}

Attrs resize_attrs(const RefSpec& s) {
  Attrs a = {ir::Attribute::make_string("mode", s.mode), ir::Attribute::make_string("coordinate_transformation_mode", s.coord),
             ir::Attribute::make_float("cubic_coeff_a", static_cast<float>(s.a)),
             ir::Attribute::make_int("exclude_outside", s.exclude_outside ? 1 : 0),
             ir::Attribute::make_float("extrapolation_value", static_cast<float>(s.extrapolation))};
  if (s.nearest != "simple") a.push_back(ir::Attribute::make_string("nearest_mode", s.nearest));
  if (s.antialias) a.push_back(ir::Attribute::make_int("antialias", 1));
  return a;
}

// Runs Resize with scales (use_sizes=false) or sizes and compares with the reference.
void check_resize(const Tensor& x, RefSpec s, const std::vector<float>& scales, bool use_sizes, int opset = 19,
                  double tol = 2e-5) {
  const size_t r = static_cast<size_t>(x.rank());
  s.scales.assign(r, 1.0);
  s.out = x.shape();
  for (size_t d = 0; d < r; ++d) {
    s.out[d] = static_cast<int64_t>(std::floor(scales[d] * static_cast<float>(x.shape()[d])));
    s.scales[d] = use_sizes ? static_cast<double>(s.out[d]) / static_cast<double>(x.shape()[d]) : scales[d];
  }
  if (s.roi.empty()) {
    s.roi.assign(r, 0.0);
    s.roi.insert(s.roi.end(), r, 1.0);
  }
  std::vector<float> roi(s.roi.begin(), s.roi.end());
  Tensor roi_t = s.coord == "tf_crop_and_resize" ? floats(roi) : Tensor();
  Tensor got = use_sizes ? run_node("Resize", {x, roi_t, Tensor(), ints(s.out)}, resize_attrs(s), 1, opset)[0]
                         : run_node("Resize", {x, roi_t, floats(scales)}, resize_attrs(s), 1, opset)[0];
  Tensor want = resize_ref(x, s);
  INFO("mode " << s.mode << " coord " << s.coord << " nearest " << s.nearest << " sizes " << use_sizes << " out "
               << shape_str(s.out) << " antialias " << s.antialias << " exclude " << s.exclude_outside);
  REQUIRE(got.shape() == want.shape());
  CHECK(test::max_abs_diff(got, want) <= tol);
}

}  // namespace

TEST_CASE("Resize nearest: every coordinate transform and rounding mode", "[resize]") {
  Tensor x = test::random_tensor({1, 2, 5, 7}, 1);
  for (const std::string coord : {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric",
                                  "tf_half_pixel_for_nn"}) {
    for (const std::string nm : {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}) {
      RefSpec s;
      s.coord = coord;
      s.nearest = nm;
      check_resize(x, s, {1.0f, 1.0f, 1.7f, 2.3f}, false);
      check_resize(x, s, {1.0f, 1.0f, 0.6f, 0.45f}, false);
      check_resize(x, s, {1.0f, 1.0f, 2.0f, 1.5f}, true);
    }
  }
}

TEST_CASE("Resize linear and cubic: coordinate transforms, cubic_coeff_a, exclude_outside", "[resize]") {
  Tensor x = test::random_tensor({1, 2, 6, 5}, 2);
  for (const std::string mode : {"linear", "cubic"}) {
    for (const std::string coord : {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"}) {
      for (int excl = 0; excl < 2; ++excl) {
        RefSpec s;
        s.mode = mode;
        s.coord = coord;
        s.exclude_outside = excl != 0;
        s.a = excl ? -0.5 : -0.75;
        check_resize(x, s, {1.0f, 1.0f, 1.5f, 2.2f}, false);
        check_resize(x, s, {1.0f, 1.0f, 0.5f, 0.8f}, false);
        check_resize(x, s, {1.0f, 1.0f, 1.34f, 0.4f}, true);
      }
    }
  }
}

TEST_CASE("Resize of every axis of a 3-D tensor, tf_crop_and_resize and antialias", "[resize]") {
  Tensor x = test::random_tensor({3, 4, 5}, 3);
  for (const std::string mode : {"nearest", "linear", "cubic"}) {
    RefSpec s;
    s.mode = mode;
    check_resize(x, s, {1.7f, 0.5f, 1.4f}, false);
    RefSpec t = s;
    t.coord = "tf_crop_and_resize";
    t.extrapolation = 10.0;
    t.roi = {0.0, 0.4, -0.2, 1.0, 0.8, 1.3};
    check_resize(x, t, {1.0f, 1.5f, 1.6f}, true);
    if (mode != "nearest") {
      RefSpec aa = s;
      aa.antialias = true;
      check_resize(x, aa, {1.0f, 0.5f, 0.4f}, false);
      check_resize(x, aa, {0.67f, 1.0f, 0.6f}, true);
      aa.exclude_outside = true;
      check_resize(x, aa, {1.0f, 0.5f, 0.4f}, false);
    }
  }
}

TEST_CASE("Resize float32 NCHW bilinear fast path matches the reference", "[resize]") {
  Tensor x = test::random_tensor({2, 3, 17, 23}, 4);
  RefSpec s;
  s.mode = "linear";
  check_resize(x, s, {1.0f, 1.0f, 1.83f, 1.75f}, true);
  check_resize(x, s, {1.0f, 1.0f, 2.0f, 2.0f}, false);
  check_resize(x, s, {1.0f, 1.0f, 0.5f, 0.7f}, false);
  s.coord = "align_corners";
  check_resize(x, s, {1.0f, 1.0f, 2.0f, 3.0f}, true);
  RefSpec n;
  check_resize(x, n, {1.0f, 1.0f, 2.0f, 2.0f}, false);
  n.coord = "asymmetric";
  n.nearest = "floor";
  check_resize(x, n, {1.0f, 1.0f, 3.0f, 3.0f}, false);
}

TEST_CASE("Resize bilinear: the vector row loops give the portable loops' bits", "[resize]") {
  // Widths around the 16-output steps, up- and downsampling (0.4 and 0.25: 16 outputs' taps span
  // more than 16 inputs, where the AVX-512 loop gathers), the U-Net's 2x, a reversed region of
  // interest (taps that fall with x), and each row loop's tail.
  uint32_t seed = 900;
  for (const int64_t w : {5, 16, 17, 31, 33, 64})
    for (const float scale : {2.0f, 1.83f, 3.0f, 0.7f, 0.4f, 0.25f})
      for (const bool crop : {false, true}) {
        const Tensor x = test::random_tensor({1, 3, 7, w}, seed++, -4.0f, 4.0f);
        RefSpec s;
        s.mode = "linear";
        std::vector<float> roi;
        if (crop) {
          s.coord = "tf_crop_and_resize";
          roi = {0, 0, 0.1f, 0.9f, 1, 1, 0.8f, 0.05f};  // W's region runs from 0.9 down to 0.05
        }
        const std::vector<float> scales{1.0f, 1.0f, 1.5f, scale};
        const Tensor roi_t = crop ? floats(roi) : Tensor();
        auto run = [&] { return run_node("Resize", {x, roi_t, floats(scales)}, resize_attrs(s), 1, 19)[0]; };
        INFO("W " << w << " scale " << scale << (crop ? " cropped, reversed" : ""));
        const Tensor fast = run();
        Tensor portable;
        {
          rt::cpu::ScopedResizeBaseline baseline;
          portable = run();
        }
        REQUIRE(fast.shape() == portable.shape());
        CHECK(std::memcmp(fast.raw_data(), portable.raw_data(), fast.nbytes()) == 0);
      }
}

TEST_CASE("Resize axes, keep_aspect_ratio_policy, integer data, opset 10/11 inputs", "[resize]") {
  Tensor x = test::random_tensor({1, 1, 4, 6}, 5);
  Attrs lin = {ir::Attribute::make_string("mode", "linear"), ir::Attribute::make_ints("axes", {3, 2})};
  Tensor a = run_node("Resize", {x, Tensor(), Tensor(), ints({9, 5})}, lin, 1, 18)[0];
  RefSpec s;
  s.mode = "linear";
  s.out = {1, 1, 5, 9};
  s.scales = {1, 1, 5.0 / 4.0, 9.0 / 6.0};
  CHECK(a.shape() == s.out);
  CHECK(test::max_abs_diff(a, resize_ref(x, s)) < 2e-5);
  // not_larger: one scale min(5/4, 18/6) = 1.25 -> [5, round(7.5)=8]; not_smaller: 3 -> [12, 18].
  Attrs nl = {ir::Attribute::make_string("keep_aspect_ratio_policy", "not_larger"), ir::Attribute::make_ints("axes", {2, 3}),
              ir::Attribute::make_string("mode", "linear")};
  Tensor knl = run_node("Resize", {x, Tensor(), Tensor(), ints({5, 18})}, nl, 1, 18)[0];
  CHECK(knl.shape() == Shape{1, 1, 5, 8});
  RefSpec sk;
  sk.mode = "linear";
  sk.out = {1, 1, 5, 8};
  sk.scales = {1, 1, 1.25, 1.25};  // the common scale, not 8/6
  CHECK(test::max_abs_diff(knl, resize_ref(x, sk)) < 2e-5);
  Attrs ns = {ir::Attribute::make_string("keep_aspect_ratio_policy", "not_smaller"), ir::Attribute::make_ints("axes", {2, 3})};
  CHECK(run_node("Resize", {x, Tensor(), Tensor(), ints({5, 18})}, ns, 1, 18)[0].shape() == Shape{1, 1, 12, 18});
  // Without axes the batch and channel sizes (1/1) bound the common scale.
  Attrs nl_all = {ir::Attribute::make_string("keep_aspect_ratio_policy", "not_larger")};
  CHECK(run_node("Resize", {x, Tensor(), Tensor(), ints({1, 1, 5, 18})}, nl_all, 1, 18)[0].shape() == Shape{1, 1, 4, 6});
  // uint8 nearest moves bytes; uint8 linear rounds half away from zero.
  Tensor u(DType::UInt8, {1, 1, 2, 2});
  for (int i = 0; i < 4; ++i) u.data<uint8_t>()[i] = static_cast<uint8_t>(10 * i + 1);
  Tensor un = run_node("Resize", {u, Tensor(), floats({1, 1, 2, 2})}, {}, 1, 13)[0];
  REQUIRE(un.dtype() == DType::UInt8);
  CHECK(un.to_int64_vector() == std::vector<int64_t>{1, 1, 11, 11, 1, 1, 11, 11, 21, 21, 31, 31, 21, 21, 31, 31});
  Tensor ul = run_node("Resize", {u, Tensor(), floats({1, 1, 1, 2})}, {ir::Attribute::make_string("mode", "linear")}, 1, 13)[0];
  CHECK(ul.to_int64_vector() == std::vector<int64_t>{1, 4, 9, 11, 21, 24, 29, 31});
  // Opset 11 requires the roi and scales slots (empty tensors when sizes are given).
  Tensor o11 = run_node("Resize", {x, Tensor(DType::Float32, {0}), Tensor(DType::Float32, {0}), ints({1, 1, 8, 12})}, {}, 1, 11)[0];
  CHECK(o11.shape() == Shape{1, 1, 8, 12});
  // Opset 10: asymmetric coordinates; nearest floors when upsampling and ceils when downsampling.
  RefSpec s10;
  s10.coord = "asymmetric";
  s10.nearest = "simple";
  s10.out = {1, 1, 6, 3};
  s10.scales = {1, 1, 1.5, 0.5};
  Tensor r10 = run_node("Resize", {x, floats({1, 1, 1.5f, 0.5f})}, {}, 1, 10)[0];
  CHECK(test::max_abs_diff(r10, resize_ref(x, s10)) == 0.0);
}

TEST_CASE("Upsample (opsets 7 and 9) nearest and linear", "[resize]") {
  Tensor x = test::random_tensor({1, 2, 3, 4}, 6);
  RefSpec s;
  s.coord = "asymmetric";
  s.nearest = "simple";
  s.out = {1, 2, 6, 12};
  s.scales = {1, 1, 2, 3};
  Tensor n9 = run_node("Upsample", {x, floats({1, 1, 2, 3})}, {}, 1, 9)[0];
  CHECK(test::max_abs_diff(n9, resize_ref(x, s)) == 0.0);
  s.mode = "linear";
  s.out = {1, 2, 7, 4};
  s.scales = {1, 1, 2.5, 1};
  Tensor l7 = run_node("Upsample", {x}, {ir::Attribute::make_string("mode", "linear"), ir::Attribute::make_floats("scales", {1, 1, 2.5f, 1})}, 1, 7)[0];
  CHECK(test::max_abs_diff(l7, resize_ref(x, s)) < 2e-5);
  CHECK_THROWS_WITH(run_node("Upsample", {x, floats({1, 1, 0.5f, 1})}, {}, 1, 9), Catch::Contains("node_under_test"));
}

TEST_CASE("Resize rejects malformed nodes", "[resize]") {
  Tensor x = test::random_tensor({1, 1, 4, 4}, 7);
  CHECK_THROWS_WITH(run_node("Resize", {x, Tensor(), floats({1, 1, 2, 2}), ints({1, 1, 8, 8})}, {}, 1, 13),
                    Catch::Contains("node_under_test"));
  CHECK_THROWS_AS(run_node("Resize", {x, Tensor(), floats({1, 2, 2})}, {}, 1, 13), Error);
  CHECK_THROWS_AS(run_node("Resize", {x, Tensor(), floats({1, 1, 0, 2})}, {}, 1, 13), Error);
  CHECK_THROWS_AS(run_node("Resize", {x, Tensor(), floats({1, 1, 2, 2})}, {ir::Attribute::make_string("mode", "area")}, 1, 13), Error);
  CHECK_THROWS_AS(
      run_node("Resize", {x, Tensor(), floats({1, 1, 2, 2})}, {ir::Attribute::make_string("coordinate_transformation_mode", "center")}, 1, 13),
      Error);
  CHECK_THROWS_AS(run_node("Resize", {x}, {}, 1, 13), Error);
}
