// mpq::FakeQuant: the forward kernel (its AVX-512 and SSE2 builds) against calib/quant_ref.h bit for
// bit (per tensor, per channel on any axis, int8/uint8/4-bit ranges, ties, NaN and infinities), and its backward (the
// straight-through estimator's clipping mask, LSQ's step-size gradient with 1/sqrt(N*Qp)) against
// the scalar references, bit-identical at any thread count.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "calib/quant_ref.h"
#include "runtime/cpu/fake_quant.h"
#include "test_util.h"
#include "train/grad_check.h"

using namespace mpq;
using ir::Attribute;

namespace {

std::vector<Attribute> range(int qmin, int qmax, int axis = 1) {
  return {Attribute::make_int("qmin", qmin), Attribute::make_int("qmax", qmax), Attribute::make_int("axis", axis)};
}

// X [2, 5, 7, 3] with values that hit rounding ties, both clipping sides, NaN and infinities.
Tensor awkward_input() {
  Tensor x = test::random_tensor({2, 5, 7, 3}, 17, -6, 6);
  float* p = x.data<float>();
  p[0] = 0.25f;   // a tie at scale 0.5 -> 0.5 rounds to 0
  p[1] = 0.75f;   // 1.5 rounds to 2
  p[2] = -1.25f;  // -2.5 rounds to -2
  p[3] = std::numeric_limits<float>::quiet_NaN();
  p[4] = std::numeric_limits<float>::infinity();
  p[5] = -std::numeric_limits<float>::infinity();
  p[6] = 1e30f;
  return x;
}

}  // namespace

TEST_CASE("FakeQuant forward equals QuantizeLinear -> DequantizeLinear bit for bit", "[train][fake_quant]") {
  const Tensor x = awkward_input();
  struct Case {
    int qmin, qmax, axis;
    Tensor scale, zp;
  };
  const std::vector<Case> cases = {
      {-128, 127, 1, Tensor::scalar<float>(0.5f), Tensor::scalar<int32_t>(0)},
      {0, 255, 1, Tensor::scalar<float>(0.031f), Tensor::scalar<int32_t>(131)},
      {-127, 127, 1, test::random_tensor({5}, 3, 0.01f, 0.2f), Tensor()},
      {-7, 7, 2, test::random_tensor({7}, 4, 0.2f, 1.0f), Tensor()},
      {-7, 7, -1, test::random_tensor({3}, 5, 0.2f, 1.0f), Tensor::from<int32_t>({3}, {0, 1, -2})},
  };
  // Both builds of the loop: AVX-512 (where this CPU has it) and SSE2.
  for (const bool baseline : {false, true}) {
    std::optional<rt::cpu::ScopedFakeQuantBaseline> sse2;
    if (baseline) sse2.emplace();
    if (!baseline && !rt::cpu::fake_quant_avx512()) WARN("no AVX-512 on this CPU: only FakeQuant's SSE2 build is tested");
    for (const Case& c : cases) {
      INFO("range [" << c.qmin << ", " << c.qmax << "] axis " << c.axis << " scales " << c.scale.numel()
                     << (baseline ? ", SSE2" : ", widest build"));
      const Tensor y = test::run_node("FakeQuant", {x, c.scale, c.zp}, range(c.qmin, c.qmax, c.axis), 1, 17, 3, "mpq").at(0);
      const int axis = c.axis < 0 ? c.axis + x.rank() : c.axis;
      int64_t outer = 1, channels = c.scale.numel(), inner = 1;
      if (channels == 1) {
        inner = x.numel();
      } else {
        for (int d = 0; d < axis; ++d) outer *= x.dim(d);
        for (int d = axis + 1; d < x.rank(); ++d) inner *= x.dim(d);
      }
      std::vector<int32_t> zp(static_cast<size_t>(channels), 0);
      for (int64_t k = 0; c.zp.defined() && k < channels; ++k) zp[static_cast<size_t>(k)] = static_cast<int32_t>(c.zp.get_int64(c.zp.numel() == 1 ? 0 : k));
      std::vector<float> want(static_cast<size_t>(x.numel()));
      calib::fake_quantize_per_axis_ref(x.data<float>(), outer, channels, inner, c.scale.data<float>(), zp.data(), c.qmin,
                                        c.qmax, want.data());
      CHECK(std::memcmp(y.data<float>(), want.data(), want.size() * sizeof(float)) == 0);
    }
    // Every rounding tie of an int8 range at an odd scale, (k + 0.5) * scale, with the two floats
    // below it and the three above, where x / scale lands on either side of the tie (280 ties, 1,680
    // values, padded with zeros to 4,099 for a vector tail).
    {
      const float scale = 0.0371f;
      std::vector<float> values;
      for (int k = -140; k < 140 && values.size() < 4099; ++k) {
        const float tie = (static_cast<float>(k) + 0.5f) * scale;
        for (float v = std::nextafter(std::nextafter(tie, -1e9f), -1e9f); values.size() < 4099; v = std::nextafter(v, 1e9f)) {
          values.push_back(v);
          if (v > std::nextafter(std::nextafter(tie, 1e9f), 1e9f)) break;
        }
      }
      while (values.size() < 4099) values.push_back(0.0f);
      const Tensor ties = Tensor::from<float>({static_cast<int64_t>(values.size())}, values);
      const Tensor y = test::run_node("FakeQuant", {ties, Tensor::scalar<float>(scale)}, range(-128, 127), 1, 17, 1, "mpq").at(0);
      std::vector<float> want(values.size());
      const int32_t zero = 0;
      calib::fake_quantize_per_axis_ref(values.data(), 1, 1, static_cast<int64_t>(values.size()), &scale, &zero, -128, 127,
                                        want.data());
      CHECK(std::memcmp(y.data<float>(), want.data(), want.size() * sizeof(float)) == 0);
    }
  }
  // A range far wider than any integer type QuantizeLinear writes (FakeQuant allows any in int32):
  // values past 2^22 must still round half to even, exactly.
  {
    Tensor wide = Tensor::from<float>({8}, {4194305.0f, 4194304.5f, -4194305.0f, 8388609.0f, 12345679.0f, -0.0f, 2.5f,
                                            -3.5f});
    const int32_t lo = -(1 << 30), hi = 1 << 30;
    const Tensor y = test::run_node("FakeQuant", {wide, Tensor::scalar<float>(1.0f)}, range(lo, hi), 1, 17, 1, "mpq").at(0);
    std::vector<float> want(8);
    const float one = 1.0f;
    const int32_t zero = 0;
    calib::fake_quantize_per_axis_ref(wide.data<float>(), 1, 1, 8, &one, &zero, lo, hi, want.data());
    CHECK(std::memcmp(y.data<float>(), want.data(), want.size() * sizeof(float)) == 0);
    CHECK(y.data<float>()[0] == 4194305.0f);
  }
  // Bad parameters name the node.
  CHECK_THROWS_WITH(test::run_node("FakeQuant", {x, Tensor::scalar<float>(0.0f)}, range(-128, 127), 1, 17, 1, "mpq"),
                    Catch::Contains("node_under_test") && Catch::Contains("positive"));
  CHECK_THROWS_WITH(test::run_node("FakeQuant", {x, test::random_tensor({4}, 6, 0.1f, 1)}, range(-128, 127), 1, 17, 1, "mpq"),
                    Catch::Contains("4 scales"));
  CHECK_THROWS_AS(test::run_node("FakeQuant", {x, Tensor::scalar<float>(0.1f), Tensor::scalar<int32_t>(300)}, range(-128, 127), 1, 17, 1, "mpq"),
                  Error);
}

TEST_CASE("FakeQuant backward: STE with the clipping mask and LSQ's step-size gradient", "[train][fake_quant]") {
  const Tensor x = test::random_tensor({3, 4, 5, 6}, 21, -3, 3);
  for (bool per_channel : {false, true}) {
    INFO((per_channel ? "per channel" : "per tensor"));
    const Tensor scale = per_channel ? test::random_tensor({4}, 22, 0.01f, 0.03f) : Tensor::scalar<float>(0.02f);
    const Tensor zp = per_channel ? Tensor() : Tensor::scalar<int32_t>(3);
    test::GradCheckOptions o;
    o.wrt = {0, 1};
    o.threads = 3;
    o.domain = "mpq";
    const std::vector<Tensor> g = test::node_gradients("FakeQuant", {x, scale, zp}, range(-128, 127), o);
    // The loss weights the check harness uses for this node: recompute them the same way.
    const Tensor r = test::random_tensor(x.shape(), o.seed * 131, -1, 1);
    const int64_t C = per_channel ? 4 : 1, inner = per_channel ? 30 : x.numel(), outer = per_channel ? 3 : 1;
    std::vector<double> ds(static_cast<size_t>(C), 0.0);
    int clipped = 0;
    for (int64_t o_ = 0; o_ < outer; ++o_)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < inner; ++i) {
          const int64_t k = (o_ * C + c) * inner + i;
          const float s = scale.data<float>()[c];
          const int32_t z = zp.defined() ? 3 : 0;
          const bool pass = calib::fake_quantize_passes_ref(x.data<float>()[k], s, z, -128, 127);
          clipped += !pass;
          CHECK(g[0].data<float>()[k] == (pass ? r.data<float>()[k] : 0.0f));
          ds[static_cast<size_t>(c)] += static_cast<double>(r.data<float>()[k]) *
                                        calib::fake_quantize_scale_slope_ref(x.data<float>()[k], s, z, -128, 127);
        }
    CHECK(clipped > 0);  // the data reaches both clipping regions
    for (int64_t c = 0; c < C; ++c) {
      const double want = ds[static_cast<size_t>(c)] * calib::lsq_grad_scale_ref(outer * inner, zp.defined() ? 3 : 0, 127);
      CHECK(g[1].data<float>()[c] == Approx(want).epsilon(1e-5));
    }
    // Same bits at one thread.
    o.threads = 1;
    const std::vector<Tensor> g1 = test::node_gradients("FakeQuant", {x, scale, zp}, range(-128, 127), o);
    CHECK(std::memcmp(g1[1].raw_data(), g[1].raw_data(), g[1].nbytes()) == 0);
  }
}

TEST_CASE("Scalar references of the fake-quant backward", "[train][fake_quant]") {
  CHECK(calib::fake_quantize_passes_ref(1.0f, 0.1f, 0, -128, 127));
  CHECK_FALSE(calib::fake_quantize_passes_ref(13.0f, 0.1f, 0, -128, 127));    // 130 > 127
  CHECK(calib::fake_quantize_passes_ref(12.74f, 0.1f, 0, -128, 127));          // rounds to 127
  CHECK_FALSE(calib::fake_quantize_passes_ref(-1.0f, 0.1f, 0, 0, 255));        // below a uint8 range
  CHECK(calib::fake_quantize_scale_slope_ref(0.26f, 0.1f, 0, -128, 127) == Approx(3.0f - 2.6f));
  CHECK(calib::fake_quantize_scale_slope_ref(100.0f, 0.1f, 5, -128, 127) == 122.0f);
  CHECK(calib::fake_quantize_scale_slope_ref(-100.0f, 0.1f, 5, -128, 127) == -133.0f);
  CHECK(calib::lsq_grad_scale_ref(100, 0, 127) == Approx(1.0 / std::sqrt(12700.0)));
  CHECK(calib::lsq_grad_scale_ref(64, 0, 7) == Approx(1.0 / std::sqrt(448.0)));
}

TEST_CASE("FakeQuantBias rounds like the export's int32 bias and passes the gradient", "[train][fake_quant]") {
  const Tensor b = Tensor::from<float>({3}, {0.1234567f, -2.5f, 1e-7f});
  const Tensor sx = Tensor::scalar<float>(0.02f);
  const Tensor sw = Tensor::from<float>({3}, {0.001f, 0.003f, 0.5f});
  const Tensor y = test::run_node("FakeQuantBias", {b, sx, sw}, {}, 1, 17, 1, "mpq").at(0);
  for (int64_t c = 0; c < 3; ++c) {
    const float s = 0.02f * sw.data<float>()[c];
    CHECK(y.data<float>()[c] == calib::dequantize_ref(static_cast<int32_t>(calib::round_half_to_even(b.data<float>()[c] / s)), s, 0));
  }
  // A bias that would overflow int32 stays float (the export keeps it float too).
  const Tensor big = Tensor::from<float>({3}, {1e9f, 0.0f, 1.0f});
  const Tensor kept = test::run_node("FakeQuantBias", {big, Tensor::scalar<float>(1e-3f), Tensor::scalar<float>(1e-3f)}, {}, 1, 17, 1, "mpq").at(0);
  CHECK(test::max_abs_diff(kept, big) == 0.0);
  test::GradCheckOptions o;
  o.wrt = {0};
  o.domain = "mpq";
  const std::vector<Tensor> g = test::node_gradients("FakeQuantBias", {b, sx, sw}, {}, o);
  const Tensor r = test::random_tensor({3}, o.seed * 131, -1, 1);
  CHECK(test::max_abs_diff(g[0], r) == 0.0);
}
