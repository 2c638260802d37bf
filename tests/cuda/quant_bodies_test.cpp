// Quantization and statistics kernel bodies (kernels/bodies/quant.cuh) run on the host by the
// nvcc-compiled harness, against calib/quant_ref (bit for bit), mpq's FakeQuant CPU kernel, and
// calib's min/max scan and histogram. Always runs: no GPU is involved.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "calib/histogram.h"
#include "calib/quant_ref.h"
#include "host_grid.h"
#include "kernels/ops.h"
#include "runtime/cpu/fake_quant.h"
#include "test_util.h"

using namespace mpq;

namespace {

// x viewed as [outer, channels, inner] with awkward values: exact ties (k + 0.5) * scale, values
// far outside the range, NaN and +-inf.
struct QuantCase {
  int64_t outer, channels, inner;
  std::vector<float> x, scale;
  std::vector<int32_t> zp;
  int32_t qmin, qmax;
  int64_t n() const { return outer * channels * inner; }
  cuda::QuantLayout layout(bool with_zp) const {
    cuda::QuantLayout l;
    l.outer = outer;
    l.channels = channels;
    l.inner = inner;
    l.scale = scale.data();
    l.zero_point = with_zp ? zp.data() : nullptr;
    l.qmin = qmin;
    l.qmax = qmax;
    return l;
  }
};

QuantCase make_case(int64_t outer, int64_t channels, int64_t inner, int32_t qmin, int32_t qmax, uint32_t seed) {
  QuantCase k{outer, channels, inner, {}, {}, {}, qmin, qmax};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> s(0.005f, 0.05f), u(-1.0f, 1.0f);
  std::uniform_int_distribution<int32_t> z(qmin / 2, qmax / 2);
  for (int64_t c = 0; c < channels; ++c) {
    k.scale.push_back(s(rng));
    k.zp.push_back(qmin == 0 ? z(rng) + (qmax + 1) / 4 : z(rng) / 4);
  }
  for (int64_t i = 0; i < k.n(); ++i) {
    const int64_t c = (i / inner) % channels;
    float v = u(rng) * 3.0f;
    switch (i % 11) {
      case 3: v = (std::floor(v * 10) + 0.5f) * k.scale[c]; break;  // a tie after division
      case 5: v = 1e6f; break;
      case 7: v = -1e6f; break;
      default: break;
    }
    k.x.push_back(v);
  }
  k.x[1] = std::numeric_limits<float>::quiet_NaN();
  k.x[2] = std::numeric_limits<float>::infinity();
  k.x[k.x.size() - 1] = -std::numeric_limits<float>::infinity();
  return k;
}

std::vector<QuantCase> cases() {
  return {make_case(1, 1, 203, -128, 127, 1), make_case(3, 5, 7, -128, 127, 2), make_case(2, 7, 3, 0, 255, 3),
          make_case(5, 3, 1, -127, 127, 4), make_case(1, 4, 9, -8, 7, 5)};
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b)); }

}  // namespace

TEST_CASE("QuantizeLinear / DequantizeLinear bodies are bit-exact with quant_ref", "[cuda][host_bodies][quant]") {
  for (const QuantCase& k : cases())
    for (bool with_zp : {false, true}) {
      INFO("[" << k.outer << "," << k.channels << "," << k.inner << "] q in [" << k.qmin << "," << k.qmax << "] zp "
               << with_zp);
      const cuda::QuantLayout l = k.layout(with_zp);
      std::vector<int32_t> want(static_cast<size_t>(k.n()));
      calib::quantize_per_axis_ref(k.x.data(), k.outer, k.channels, k.inner, k.scale.data(),
                                   with_zp ? k.zp.data() : nullptr, k.qmin, k.qmax, want.data());
      std::vector<float> want_dq(want.size());
      calib::dequantize_per_axis_ref(want.data(), k.outer, k.channels, k.inner, k.scale.data(),
                                     with_zp ? k.zp.data() : nullptr, want_dq.data());
      for (const cuda::LaunchCtx& c : test::launches_for(k.n())) {
        INFO("launch " << test::launch_str(c));
        std::vector<int32_t> q(want.size(), 12345);
        REQUIRE(cuda::host::quantize(l, k.x.data(), q.data(), c) == 0);
        CHECK(q == want);
        std::vector<float> dq = test::nan_filled(want.size());
        REQUIRE(cuda::host::dequantize(l, want.data(), dq.data(), c) == 0);
        CHECK(test::first_mismatch(dq.data(), want_dq.data(), k.n(), 0, 0) == -1);
        if (k.qmin >= -128 && k.qmax <= 127) {
          std::vector<int8_t> q8(want.size(), 99);
          REQUIRE(cuda::host::quantize(l, k.x.data(), q8.data(), c) == 0);
          std::vector<int8_t> dq_in(want.begin(), want.end());
          for (size_t i = 0; i < want.size(); ++i) REQUIRE(q8[i] == static_cast<int8_t>(want[i]));
          REQUIRE(cuda::host::dequantize(l, dq_in.data(), dq.data(), c) == 0);
          CHECK(test::first_mismatch(dq.data(), want_dq.data(), k.n(), 0, 0) == -1);
        }
        if (k.qmin >= 0 && k.qmax <= 255) {
          std::vector<uint8_t> q8(want.size(), 99);
          REQUIRE(cuda::host::quantize(l, k.x.data(), q8.data(), c) == 0);
          for (size_t i = 0; i < want.size(); ++i) REQUIRE(q8[i] == static_cast<uint8_t>(want[i]));
        }
      }
    }
}

TEST_CASE("FakeQuant body is bit-exact with quant_ref and mpq's FakeQuant kernel", "[cuda][host_bodies][quant]") {
  for (const QuantCase& k : cases()) {
    INFO("[" << k.outer << "," << k.channels << "," << k.inner << "] q in [" << k.qmin << "," << k.qmax << "]");
    const cuda::QuantLayout l = k.layout(true);
    std::vector<float> want(static_cast<size_t>(k.n()));
    calib::fake_quantize_per_axis_ref(k.x.data(), k.outer, k.channels, k.inner, k.scale.data(), k.zp.data(), k.qmin,
                                      k.qmax, want.data());
    // The CPU kernel through the executor, as QAT evaluates it.
    const Tensor x = Tensor::from<float>({k.outer, k.channels, k.inner}, k.x);
    const Tensor scale = k.channels == 1 ? Tensor::scalar<float>(k.scale[0]) : Tensor::from<float>({k.channels}, k.scale);
    const Tensor zp = k.channels == 1 ? Tensor::scalar<int32_t>(k.zp[0]) : Tensor::from<int32_t>({k.channels}, k.zp);
    const Tensor cpu = test::run_node("FakeQuant", {x, scale, zp},
                                      {ir::Attribute::make_int("qmin", k.qmin), ir::Attribute::make_int("qmax", k.qmax),
                                       ir::Attribute::make_int("axis", 1)},
                                      1, 13, 2, "mpq")
                           .at(0);
    for (int64_t i = 0; i < k.n(); ++i) REQUIRE(same_bits(cpu.data<float>()[i], want[static_cast<size_t>(i)]));
    for (const cuda::LaunchCtx& c : test::launches_for(k.n())) {
      INFO("launch " << test::launch_str(c));
      std::vector<float> y = test::nan_filled(want.size());
      y[1] = 7.0f;  // x[1] is NaN: its output must be written (0), not left as the sentinel
      REQUIRE(cuda::host::fake_quant(l, k.x.data(), y.data(), c) == 0);
      for (size_t i = 0; i < want.size(); ++i) {
        INFO("element " << i << ": " << y[i] << " vs " << want[i]);
        REQUIRE(same_bits(y[i], want[i]));
      }
    }
  }
}

// mpq FakeQuantBias against the CPU's fake_quantize_bias, bit for bit: per-channel and single
// weight scales, exact ties (k + 0.5 steps), and the all-or-nothing pass-through when one
// channel's value overflows int32 or is NaN.
TEST_CASE("FakeQuantBias body is bit-exact with the CPU kernel", "[cuda][host_bodies][quant]") {
  const int64_t n = 37;
  const Tensor bt = test::random_tensor({n}, 71, -3.0f, 3.0f);
  const Tensor wt = test::random_tensor({n}, 72, 0.01f, 0.1f);
  const float sx = 0.0625f;
  struct Case {
    const char* what;
    int64_t n_weight_scales;
    int poison;  // 0: none, 1: one channel far past int32, 2: one NaN
  };
  for (const Case& k : {Case{"per channel", n, 0}, Case{"one weight scale", 1, 0}, Case{"overflow", n, 1}, Case{"NaN", 1, 2}}) {
    INFO(k.what);
    std::vector<float> b(bt.data<float>(), bt.data<float>() + n), w(wt.data<float>(), wt.data<float>() + n);
    // Exact ties: 2.5 and -3.5 steps of channels 3 and 4 (round half to even: 2 and -4), with
    // power-of-two scales so that the quotients are exactly k + 0.5.
    w[0] = 0.125f;
    w[3] = 0.5f;
    w[4] = 0.25f;
    const float s3 = sx * w[k.n_weight_scales == 1 ? 0 : 3], s4 = sx * w[k.n_weight_scales == 1 ? 0 : 4];
    b[3] = 2.5f * s3;
    b[4] = -3.5f * s4;
    REQUIRE(b[3] / s3 == 2.5f);
    REQUIRE(b[4] / s4 == -3.5f);
    if (k.poison == 1) b[20] = 1e30f;
    if (k.poison == 2) b[20] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> want(static_cast<size_t>(n));
    const bool quantized = rt::cpu::fake_quantize_bias(b.data(), n, sx, w.data(), k.n_weight_scales, want.data());
    if (!quantized) want = b;
    CHECK(quantized == (k.poison == 0));
    for (const cuda::LaunchCtx& c : test::launches_for(n)) {
      INFO("launch " << test::launch_str(c));
      std::vector<float> y = test::nan_filled(static_cast<size_t>(n));
      REQUIRE(cuda::host::fake_quant_bias(b.data(), &sx, w.data(), n, k.n_weight_scales, y.data(), c) == 0);
      for (int64_t i = 0; i < n; ++i) {
        INFO("channel " << i << ": " << y[static_cast<size_t>(i)] << " vs " << want[static_cast<size_t>(i)]);
        REQUIRE(same_bits(y[static_cast<size_t>(i)], want[static_cast<size_t>(i)]));
      }
    }
  }
}

TEST_CASE("FakeQuant backward body: STE mask and LSQ scale gradient", "[cuda][host_bodies][quant]") {
  for (const QuantCase& k : cases()) {
    INFO("[" << k.outer << "," << k.channels << "," << k.inner << "] q in [" << k.qmin << "," << k.qmax << "]");
    const cuda::QuantLayout l = k.layout(true);
    const Tensor dyt = test::random_tensor({k.n()}, 9, -1, 1);
    const float* dy = dyt.data<float>();
    // Reference: quant_ref's mask and slope, summed per channel in double, times LSQ's factor.
    std::vector<float> want_dx(static_cast<size_t>(k.n()));
    std::vector<double> sums(static_cast<size_t>(k.channels), 0.0), factor(static_cast<size_t>(k.channels));
    for (int64_t i = 0; i < k.n(); ++i) {
      const int64_t c = (i / k.inner) % k.channels;
      const bool pass = calib::fake_quantize_passes_ref(k.x[i], k.scale[c], k.zp[c], k.qmin, k.qmax);
      want_dx[i] = pass ? dy[i] : 0.0f;
      sums[c] += static_cast<double>(dy[i]) *
                 calib::fake_quantize_scale_slope_ref(k.x[i], k.scale[c], k.zp[c], k.qmin, k.qmax);
    }
    for (int64_t c = 0; c < k.channels; ++c) factor[c] = calib::lsq_grad_scale_ref(k.outer * k.inner, k.zp[c], k.qmax);
    for (const cuda::LaunchCtx& c : test::launches_for(k.n())) {
      INFO("launch " << test::launch_str(c));
      std::vector<float> dx = test::nan_filled(want_dx.size());
      std::vector<double> terms(want_dx.size(), std::nan(""));
      REQUIRE(cuda::host::fake_quant_backward(l, k.x.data(), dy, dx.data(), terms.data(), c) == 0);
      CHECK(test::first_mismatch(dx.data(), want_dx.data(), k.n(), 0, 0) == -1);
      std::vector<float> dscale = test::nan_filled(static_cast<size_t>(k.channels));
      REQUIRE(cuda::host::channel_sum(k.outer, k.channels, k.inner, terms.data(), factor.data(), dscale.data(),
                                      test::launches_for(k.channels)[1]) == 0);
      for (int64_t ch = 0; ch < k.channels; ++ch) {
        INFO("channel " << ch);
        CHECK(dscale[ch] == Approx(sums[ch] * factor[ch]).epsilon(1e-6).margin(1e-9));
      }
    }
  }
}

TEST_CASE("min/max and histogram bodies match calib's scans", "[cuda][host_bodies][quant]") {
  Tensor t = test::random_tensor({4099}, 77, -3, 5);
  std::vector<float> x(t.data<float>(), t.data<float>() + t.numel());
  x[17] = 0.0f;
  x[100] = -7.25f;
  const calib::MinMaxScan ref = calib::scan_min_max_ref(x.data(), static_cast<int64_t>(x.size()));
  REQUIRE(ref.all_finite);
  const int bins = 64;
  calib::Histogram h(bins);
  h.add(x.data(), static_cast<int64_t>(x.size()), std::max(std::fabs(ref.lo), std::fabs(ref.hi)));
  const float scale = static_cast<float>(bins / h.range());
  for (const cuda::LaunchCtx& c : test::launches_for(static_cast<int64_t>(x.size()))) {
    INFO("launch " << test::launch_str(c));
    std::vector<cuda::MinMaxPartial> partial(static_cast<size_t>(c.shape.blocks * c.shape.threads));
    cuda::MinMaxPartial out{};
    REQUIRE(cuda::host::min_max(x.data(), static_cast<int64_t>(x.size()), partial.data(), &out, c) == 0);
    CHECK(out.lo == ref.lo);
    CHECK(out.hi == ref.hi);
    CHECK(out.nonfinite == 0);
    std::vector<unsigned long long> counts(2 * bins, 0);
    REQUIRE(cuda::host::histogram(x.data(), static_cast<int64_t>(x.size()), scale, bins, counts.data(), c) == 0);
    for (int b = 0; b < 2 * bins; ++b) {
      INFO("bin " << b);
      REQUIRE(counts[b] == h.signed_counts()[b]);
    }
  }
  SECTION("non-finite values are counted, not folded into the range") {
    x[5] = std::numeric_limits<float>::quiet_NaN();
    x[6] = std::numeric_limits<float>::infinity();
    std::vector<cuda::MinMaxPartial> partial(21);
    cuda::MinMaxPartial out{};
    REQUIRE(cuda::host::min_max(x.data(), static_cast<int64_t>(x.size()), partial.data(), &out, {cuda::LaunchShape{3, 7}}) == 0);
    CHECK(out.nonfinite == 2);
    CHECK(out.lo == ref.lo);
    CHECK(out.hi == ref.hi);
  }
}
