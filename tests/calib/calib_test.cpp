// Calibration statistics, range methods, quantization parameters and the calibration table.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cfloat>
#include <cstring>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>

#include "calib/calibrator.h"
#include "calib/histogram.h"
#include "calib/qparams.h"
#include "calib/quant_ref.h"
#include "calib/range_methods.h"
#include "calib/table.h"
#include "data/npy.h"
#include "ir/onnx_io.h"
#include "runtime/executor.h"
#include "runtime/thread_pool.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::calib;
namespace fs = std::filesystem;

namespace {

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> laplace(size_t n, uint32_t seed, float b = 1.0f) {
  std::mt19937 rng(seed);
  std::exponential_distribution<float> e(1.0f / b);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> v(n);
  for (float& x : v) x = sign(rng) ? e(rng) : -e(rng);
  return v;
}

TensorStats stats_of(const std::vector<float>& v, size_t chunks = 7) {
  TensorStats s(true);
  size_t step = (v.size() + chunks - 1) / chunks;
  for (size_t i = 0; i < v.size(); i += step) s.add(v.data() + i, static_cast<int64_t>(std::min(step, v.size() - i)));
  return s;
}

}  // namespace

TEST_CASE("histogram add agrees with its reference and keeps every count", "[calib][histogram]") {
  std::vector<float> v = gaussian(200001, 1, 2.0f);
  Histogram fast(2048), ref(2048);
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  fast.add(v.data(), static_cast<int64_t>(v.size()), m);
  ref.add_ref(v.data(), static_cast<int64_t>(v.size()));
  REQUIRE(fast.range() == ref.range());
  uint64_t diff = 0, total = 0;
  for (size_t i = 0; i < fast.signed_counts().size(); ++i) {
    diff += static_cast<uint64_t>(std::llabs(static_cast<long long>(fast.signed_counts()[i]) - static_cast<long long>(ref.signed_counts()[i])));
    total += fast.signed_counts()[i];
  }
  CHECK(total == v.size());
  CHECK(diff == 0);
}

namespace {

// Data shaped like real activations: runs of one value (a constant image background and the
// feature maps over it), exact zeros and -0 (ReLU), ties on bin edges on both sides of zero, tiny
// and denormal negatives (bin -1, not the zero bin), a value in the very last bin, odd lengths for
// the tails.
std::vector<float> activation_like(size_t n, uint32_t seed) {
  std::vector<float> v = gaussian(n, seed, 1.5f);
  for (size_t i = 0; i < n; ++i) {
    if (i % 97 < 40) v[i] = -0.8101983f;                // background run
    else if (i % 13 == 0) v[i] = (i % 2) ? 0.0f : -0.0f;  // ReLU zeros of both signs
    else if (i % 29 == 0) v[i] = 0.25f;                  // exactly on a bin edge
    else if (i % 31 == 0) v[i] = -0.25f;                 // on a bin edge below zero
    else if (i % 37 == 0) v[i] = (i % 2) ? -1e-30f : -FLT_TRUE_MIN;  // just below zero, denormal too
    else if (i % 43 == 0) v[i] = std::nextafter(8.0f, 0.0f);         // in the last bin of range 8
  }
  return v;
}

void require_same_stats(const TensorStats& a, const TensorStats& b) {
  REQUIRE(a.count == b.count);
  REQUIRE(a.nan_count == b.nan_count);
  REQUIRE(a.inf_count == b.inf_count);
  REQUIRE(a.min == b.min);
  REQUIRE(a.max == b.max);
  REQUIRE(a.histogram.range() == b.histogram.range());
  REQUIRE(a.histogram.total() == b.histogram.total());
  REQUIRE(a.histogram.exact_zeros() == b.histogram.exact_zeros());
  REQUIRE(a.histogram.signed_counts() == b.histogram.signed_counts());
}

}  // namespace

TEST_CASE("vectorized min/max scan agrees with its reference on odd lengths and non-finite values",
          "[calib][histogram]") {
  std::vector<float> v = activation_like(1031, 11);
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 1031}) {
    MinMaxScan fast = scan_min_max(v.data(), n), ref = scan_min_max_ref(v.data(), n);
    CHECK(fast.all_finite);
    CHECK(fast.lo == ref.lo);
    CHECK(fast.hi == ref.hi);
  }
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    for (size_t pos : {0u, 5u, 8u, 16u, 1030u}) {
      std::vector<float> w = v;
      w[pos] = bad;
      CHECK_FALSE(scan_min_max(w.data(), static_cast<int64_t>(w.size())).all_finite);
    }
  }
}

namespace {

// Forces one binning kernel for a test's lifetime; reports the one that runs.
struct ForcedBinning {
  explicit ForcedBinning(BinningKernel k) : running(force_binning_kernel(k)) {}
  ~ForcedBinning() { force_binning_kernel(BinningKernel::Auto); }
  BinningKernel running;
};

}  // namespace

TEST_CASE("fast and pooled statistics equal the scalar reference bit for bit", "[calib][histogram]") {
  // Every kernel this CPU has: AVX-512 (packed non-zero indices), AVX2, scalar.
  const BinningKernel wanted = GENERATE(BinningKernel::Avx512, BinningKernel::Avx2, BinningKernel::Scalar);
  ForcedBinning forced(wanted);
  if (forced.running != wanted) WARN("this CPU lacks binning kernel " << static_cast<int>(wanted) << "; the next narrower one runs");
  rt::ThreadPool pool(3);
  for (size_t n : {size_t{1}, size_t{9}, size_t{4099}, size_t{300007}}) {
    std::vector<float> v = activation_like(n, static_cast<uint32_t>(n));
    TensorStats ref(true), fast(true), pooled(true);
    // Two adds each, the second with a wider range: widening must not depend on the path.
    std::vector<float> wide = gaussian(n, 5, 30.0f);
    ref.add_ref(v.data(), static_cast<int64_t>(n));
    ref.add_ref(wide.data(), static_cast<int64_t>(n));
    fast.add(v.data(), static_cast<int64_t>(n));
    fast.add(wide.data(), static_cast<int64_t>(n));
    pooled.add(v.data(), static_cast<int64_t>(n), &pool);
    pooled.add(wide.data(), static_cast<int64_t>(n), &pool);
    INFO("n = " << n);
    require_same_stats(fast, ref);
    require_same_stats(pooled, ref);
  }
  SECTION("a bin count that is not a power of two (--bins 1000): scale no longer a power of two") {
    std::vector<float> v = activation_like(20011, 21);
    for (size_t i = 0; i < v.size(); i += 7) v[i] = 0.01f * static_cast<float>(i % 300);  // products near integers
    TensorStats ref(true, 1000), fast(true, 1000), pooled(true, 1000);
    ref.add_ref(v.data(), static_cast<int64_t>(v.size()));
    fast.add(v.data(), static_cast<int64_t>(v.size()));
    pooled.add(v.data(), static_cast<int64_t>(v.size()), &pool);
    require_same_stats(fast, ref);
    require_same_stats(pooled, ref);
  }
  SECTION("a tensor of denormals: bins / R past float's range") {
    std::vector<float> v(5003);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(static_cast<int>(i % 211) - 100) * 1e-42f;  // |x| <= 1.5e-40, all denormal
    TensorStats ref(true), fast(true), pooled(true);
    ref.add_ref(v.data(), static_cast<int64_t>(v.size()));
    fast.add(v.data(), static_cast<int64_t>(v.size()));
    pooled.add(v.data(), static_cast<int64_t>(v.size()), &pool);
    REQUIRE(ref.histogram.bins() / ref.histogram.range() > static_cast<double>(FLT_MAX));
    require_same_stats(fast, ref);
    require_same_stats(pooled, ref);
    // Negatives below the centre, positives and zeros from it up: an overflowed float scale would
    // have sent them to the end bins.
    const auto& counts = fast.histogram.signed_counts();
    const auto centre = static_cast<std::ptrdiff_t>(fast.histogram.bins());
    const auto negatives = std::count_if(v.begin(), v.end(), [](float x) { return x < 0; });
    CHECK(std::accumulate(counts.begin(), counts.begin() + centre, uint64_t{0}) == static_cast<uint64_t>(negatives));
    CHECK(counts.front() == 0);
    CHECK(counts.back() == 0);
  }
  SECTION("NaN and inf take the counting path on every route") {
    std::vector<float> v = activation_like(300007, 3);
    v[17] = NAN;
    v[200000] = INFINITY;
    TensorStats ref(true), pooled(true);
    ref.add_ref(v.data(), static_cast<int64_t>(v.size()));
    pooled.add(v.data(), static_cast<int64_t>(v.size()), &pool);
    require_same_stats(pooled, ref);
    CHECK(pooled.nan_count == 1);
    CHECK(pooled.inf_count == 1);
  }
  SECTION("single-thread adds scan and bin in rounds; a NaN or inf past the first rounds splits them") {
    // 9000 values: the rounds before the bad value are binned as scanned, the rest is counted. The
    // second array widens the range in its last round.
    for (size_t bad_at : {size_t{0}, size_t{2047}, size_t{2048}, size_t{6001}, size_t{8999}}) {
      std::vector<float> v = activation_like(9000, 4);
      v[bad_at] = bad_at % 2 ? -INFINITY : NAN;
      std::vector<float> w = activation_like(9000, 5);
      w[8990] = 1000.0f;
      TensorStats ref(true), fast(true);
      for (const auto* x : {&w, &v, &w}) {
        ref.add_ref(x->data(), static_cast<int64_t>(x->size()));
        fast.add(x->data(), static_cast<int64_t>(x->size()));
      }
      INFO("bad value at " << bad_at);
      require_same_stats(fast, ref);
      CHECK(fast.nan_count + fast.inf_count == 1);
      CHECK(fast.count == 3 * 9000 - 1);
    }
  }
}

TEST_CASE("a widening histogram equals one built with the final range", "[calib][histogram]") {
  std::vector<float> small = gaussian(50000, 2, 0.5f);
  std::vector<float> big = gaussian(50000, 3, 40.0f);
  TensorStats streamed(true);
  streamed.add(small.data(), static_cast<int64_t>(small.size()));
  double r_before = streamed.histogram.range();
  streamed.add(big.data(), static_cast<int64_t>(big.size()));
  CHECK(streamed.histogram.range() > r_before);
  std::vector<float> all = small;
  all.insert(all.end(), big.begin(), big.end());
  TensorStats once(true);
  once.add(all.data(), static_cast<int64_t>(all.size()));
  REQUIRE(streamed.histogram.range() == once.histogram.range());
  CHECK(streamed.histogram.total() == all.size());
  uint64_t diff = 0;
  for (size_t i = 0; i < once.histogram.signed_counts().size(); ++i)
    diff += static_cast<uint64_t>(std::llabs(static_cast<long long>(once.histogram.signed_counts()[i]) -
                                             static_cast<long long>(streamed.histogram.signed_counts()[i])));
  CHECK(diff <= all.size() / 10000);
  CHECK(streamed.min == once.min);
  CHECK(streamed.max == once.max);
}

TEST_CASE("percentile thresholds match analytic and exact quantiles", "[calib][percentile]") {
  std::vector<float> g = gaussian(400000, 4);
  TensorStats s = stats_of(g);
  const double width = s.histogram.bin_width();
  // P(|x| < 3.2905) = 99.9% for N(0, 1).
  double p999 = percentile_abs(s.histogram, 99.9);
  CHECK(std::fabs(p999 - percentile_ref(g, 99.9, true)) <= 2 * width);
  CHECK(std::fabs(p999 - 3.2905) < 0.05);
  // Asymmetric quantiles of a shifted Laplace distribution.
  std::vector<float> l = laplace(400000, 5, 0.7f);
  for (float& x : l) x += 1.5f;
  TensorStats ls = stats_of(l);
  double lo = 0, hi = 0;
  percentile_signed(ls.histogram, 99.0, &lo, &hi);
  CHECK(std::fabs(lo - percentile_ref(l, 1.0, false)) <= 2 * ls.histogram.bin_width());
  CHECK(std::fabs(hi - percentile_ref(l, 99.0, false)) <= 2 * ls.histogram.bin_width());
  // Laplace(b) quantile: mu + b ln(2p) for the upper tail: 1.5 + 0.7 * ln(50) = 4.238.
  CHECK(std::fabs(hi - (1.5 + 0.7 * std::log(50.0))) < 0.05);
}

TEST_CASE("entropy threshold equals its reference and lies between p99 and max", "[calib][entropy]") {
  for (uint32_t seed : {6u, 7u}) {
    std::vector<float> v = seed == 6 ? gaussian(300000, seed) : laplace(300000, seed);
    TensorStats s = stats_of(v);
    double fast = entropy_threshold(s.histogram, 128, 128);
    std::vector<uint64_t> abs = s.histogram.abs_counts(true);
    double ref = entropy_threshold_ref(std::vector<double>(abs.begin(), abs.end()), s.histogram.bin_width(), 128, 128);
    CHECK(fast == Approx(ref).epsilon(1e-12));
    // The raw cut may lie past the data (empty top bins); the range used is clipped to the max.
    double chosen = compute_range(RangeMethod::Entropy, s, RangeOptions{}).amax;
    CHECK(chosen >= percentile_ref(v, 99.0, true));
    CHECK(chosen <= s.amax());
  }
}

TEST_CASE("entropy and mse keep their footing on ReLU zeros and spiky inputs", "[calib][entropy]") {
  // ReLU output: 60% exact zeros, the rest half-normal.
  std::vector<float> relu = gaussian(200000, 12);
  for (size_t i = 0; i < relu.size(); ++i) relu[i] = (i % 5 < 3) ? 0.0f : std::fabs(relu[i]);
  // An image input: half the pixels are one background value, the rest spread up to 2.
  std::vector<float> image(200000);
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> bright(-0.8f, 2.0f);
  for (size_t i = 0; i < image.size(); ++i) image[i] = (i % 2) ? -0.81f : bright(rng);
  for (const auto* data : {&relu, &image}) {
    TensorStats s = stats_of(*data);
    CHECK(s.histogram.exact_zeros() == (data == &relu ? 120000u : 0u));
    std::vector<float> nonzero;
    for (float v : *data)
      if (v != 0.0f) nonzero.push_back(v);
    const double p99 = percentile_ref(nonzero, 99.0, true);
    for (RangeMethod m : {RangeMethod::Entropy, RangeMethod::Mse}) {
      double t = compute_range(m, s, RangeOptions{}).amax;
      INFO(range_method_info(m).name << " threshold " << t << ", p99 " << p99);
      CHECK(t >= p99 - 2 * s.histogram.bin_width());
      CHECK(t <= s.amax());
    }
  }
}

TEST_CASE("mse threshold agrees with brute force and lies between p99 and max", "[calib][mse]") {
  std::vector<float> v = laplace(60000, 8);
  TensorStats s = stats_of(v);
  double fast = mse_threshold(s.histogram, 127);
  double ref = mse_threshold_ref(v, 127, 256);
  CHECK(fast >= percentile_ref(v, 99.0, true));
  CHECK(fast <= s.amax() + s.histogram.bin_width());
  // Both minimise the same error; allow the grid resolution of the brute-force search.
  CHECK(std::fabs(fast - ref) <= 0.05 * s.amax());
}

TEST_CASE("degenerate tensors get valid ranges and scales", "[calib][edge]") {
  RangeOptions ro;
  for (RangeMethod m : {RangeMethod::MinMax, RangeMethod::Percentile, RangeMethod::Entropy, RangeMethod::Mse}) {
    INFO(range_method_info(m).name);
    std::vector<float> zeros(1000, 0.0f);
    TensorStats z(true);
    z.add(zeros.data(), 1000);
    Range r = compute_range(m, z, ro);
    CHECK(r.amax == 0.0);
    QParams q = symmetric_int8(r.amax);
    CHECK(q.scale == 1.0f);
    CHECK(q.zero_point == 0);

    std::vector<float> constant(500, 5.0f);
    TensorStats c(true);
    c.add(constant.data(), 500);
    Range rc = compute_range(m, c, ro);
    CHECK(rc.amax > 0.0);
    CHECK(rc.amax <= 5.0);
    CHECK(symmetric_int8(rc.amax).scale > 0.0f);

    float single = -3.0f;
    TensorStats one(true);
    one.add(&single, 1);
    CHECK(compute_range(m, one, ro).amax > 0.0);
  }
  // A single negative constant in uint8: zero point at the top so 0 stays representable.
  QParams neg = asymmetric_uint8(-3.0, -3.0);
  CHECK(neg.zero_point == 255);
  CHECK(dequantize_ref(quantize_ref(0.0f, neg.scale, neg.zero_point, 0, 255), neg.scale, neg.zero_point) == 0.0f);
  // Denormal and zero ranges never produce a zero or denormal scale.
  CHECK(symmetric_int8(1e-45).scale == 1.0f);
  CHECK(asymmetric_uint8(0.0, 1e-44).scale == 1.0f);
  CHECK(weight_scale(0.0) == 1.0f);
  CHECK(safe_scale(1.0, 127) >= FLT_MIN);
}

TEST_CASE("zero is exactly representable for any asymmetric range", "[calib][qparams]") {
  std::mt19937 rng(9);
  std::uniform_real_distribution<double> d(-50.0, 50.0);
  for (int i = 0; i < 2000; ++i) {
    double a = d(rng), b = d(rng);
    QParams q = asymmetric_uint8(std::min(a, b), std::max(a, b));
    CHECK(q.zero_point >= 0);
    CHECK(q.zero_point <= 255);
    CHECK(dequantize_ref(quantize_ref(0.0f, q.scale, q.zero_point, q.qmin, q.qmax), q.scale, q.zero_point) == 0.0f);
    QParams s = asymmetric_int8(std::min(a, b), std::max(a, b));
    CHECK(dequantize_ref(quantize_ref(0.0f, s.scale, s.zero_point, s.qmin, s.qmax), s.scale, s.zero_point) == 0.0f);
  }
  QParams r = symmetric_int8(10.0, true);
  CHECK(r.qmax == 63);
  CHECK(r.scale == Approx(10.0 / 63));
}

TEST_CASE("NaN and inf are counted, not folded into the range", "[calib][edge]") {
  std::vector<float> v = {1.0f, -2.0f, NAN, INFINITY, 0.5f, -INFINITY, NAN};
  TensorStats s(true);
  s.add(v.data(), static_cast<int64_t>(v.size()));
  CHECK(s.nan_count == 2);
  CHECK(s.inf_count == 2);
  CHECK(s.count == 3);
  CHECK(s.min == -2.0);
  CHECK(s.max == 1.0);
  CHECK(s.histogram.total() == 3);
  CalibOptions o;
  o.method = RangeMethod::Percentile;
  TensorCalib c = make_tensor_calib("t", s, o);
  CHECK(c.nan_count == 2);
  CHECK(std::isfinite(c.q.scale));
}

TEST_CASE("a zero minimum or maximum is +0 whichever zero comes first, NaN or not", "[calib][edge]") {
  // All non-positive (max 0) or all non-negative (min 0) data whose first zero is -0, with and
  // without a NaN (which takes the counting path) and through the reference.
  for (bool with_nan : {false, true}) {
    for (bool negative : {false, true}) {
      std::vector<float> v = {-0.0f, 0.0f, negative ? -1.5f : 1.5f, -0.0f};
      if (with_nan) v.insert(v.begin() + 1, NAN);
      for (int path = 0; path < 2; ++path) {
        TensorStats s(true);
        if (path == 0) s.add(v.data(), static_cast<int64_t>(v.size()));
        else s.add_ref(v.data(), static_cast<int64_t>(v.size()));
        INFO("nan " << with_nan << " negative " << negative << " reference " << path);
        const double zero_end = negative ? s.max : s.min;
        CHECK(zero_end == 0.0);
        CHECK_FALSE(std::signbit(zero_end));
        CHECK(s.nan_count == (with_nan ? 1u : 0u));
      }
    }
  }
}

TEST_CASE("per-channel weight ranges", "[calib][weights]") {
  // [2 out channels, 3 values]: channel 0 in [-4, 1], channel 1 in [0.5, 2].
  std::vector<float> w = {-4, 1, 0, 0.5f, 2, 1};
  std::vector<float> mins, maxs;
  channel_min_max(w.data(), 1, 2, 3, mins, maxs);
  CHECK(mins == std::vector<float>{-4, 0.5f});
  CHECK(maxs == std::vector<float>{1, 2});
  auto scales = weight_scales_per_channel({4.0f, 2.0f, 0.0f});
  CHECK(scales[0] == Approx(4.0 / 127));
  CHECK(scales[2] == 1.0f);
}

TEST_CASE("calibration table round-trips through JSON and protobuf; TensorRT cache format", "[calib][table]") {
  test::TempDir tmp;
  CalibrationTable t;
  t.mpq_version = "test";
  t.model = "m.onnx";
  t.method = "entropy";
  t.samples = 12;
  TensorCalib a;
  a.name = "conv1/out:0";
  a.min = -1.5;
  a.max = 2.25;
  a.amax = 2.0;
  a.q = symmetric_int8(2.0);
  a.method = "entropy";
  a.count = 99;
  t.tensors.push_back(a);
  write_table(t, tmp / "t.json");
  REQUIRE(fs::exists(tmp / "t.pb"));
  for (const char* f : {"t.json", "t.pb"}) {
    CalibrationTable b = read_table(tmp / f);
    REQUIRE(b.tensors.size() == 1);
    CHECK(b.tensors[0].name == a.name);
    CHECK(b.tensors[0].q.scale == a.q.scale);
    CHECK(b.tensors[0].amax == Approx(2.0));
    CHECK(b.samples == 12);
  }
  write_trt_cache(t, tmp / "cache.txt");
  std::ifstream in(tmp / "cache.txt");
  std::string header, line;
  std::getline(in, header);
  std::getline(in, line);
  CHECK(header == "TRT-8601-EntropyCalibration2");
  float scale = 2.0f / 127.0f;
  uint32_t bits;
  std::memcpy(&bits, &scale, 4);
  CHECK(line == fmt::format("conv1/out:0: {:08x}", bits));

  std::ofstream bad(tmp / "bad.json");
  bad << R"({"tensors": {"x": {"scale": 0}}})";
  bad.close();
  CHECK_THROWS_WITH(read_table(tmp / "bad.json"), Catch::Contains("invalid scale"));
}

TEST_CASE("mpq calibrate end to end, deterministic, with clear errors", "[calib][cli]") {
  test::TempDir tmp;
  fs::path model = test::source_dir() / "tests/models/resnet_bn_op13.onnx";
  fs::path data = test::source_dir() / "tests/models/resnet_bn_op13_data";
  for (const char* method : {"minmax", "percentile", "entropy", "mse"}) {
    fs::path out = tmp / fmt::format("{}.json", method);
    auto r = test::run_mpq({"calibrate", model.string(), "--data", data.string(), "--method", method, "-o", out.string(),
                            "--trt-cache", (tmp / "cache").string()});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    auto j = nlohmann::json::parse(std::ifstream(out));
    CHECK(j["method"] == method);
    CHECK(j["samples"] == 5);  // 1 + 1 + 3 rows
    REQUIRE(j["tensors"].contains("input"));
    CHECK(j["tensors"]["input"]["scale"].get<double>() > 0);
  }
  // Same inputs, same bytes.
  auto again = test::run_mpq({"calibrate", model.string(), "--data", data.string(), "--method", "entropy", "-o",
                              (tmp / "again.json").string()});
  REQUIRE(again.exit_code == 0);
  auto a = nlohmann::json::parse(std::ifstream(tmp / "entropy.json"));
  auto b = nlohmann::json::parse(std::ifstream(tmp / "again.json"));
  CHECK(a["tensors"] == b["tensors"]);
  // Wrong data shape: exit 2 naming the file and the input.
  fs::create_directories(tmp / "bad" / "feed_0");
  fs::copy_file(test::source_dir() / "tests/models/transformer_op13_data/feed_0/input.npy", tmp / "bad" / "feed_0" / "input.npy");
  auto bad = test::run_mpq({"calibrate", model.string(), "--data", (tmp / "bad").string(), "-o", (tmp / "x.json").string()});
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("input.npy"));
  CHECK_FALSE(fs::exists(tmp / "x.json"));
  // Refuses to overwrite the model.
  auto self = test::run_mpq({"calibrate", model.string(), "--data", data.string(), "-o", model.string()});
  CHECK(self.exit_code == 2);
  // A bin count the histogram cannot take: exit 2 naming the option, before any work, nothing written.
  for (const char* bins : {"3", "0", "-2", "2097152"}) {
    auto r = test::run_mpq({"calibrate", model.string(), "--data", data.string(), "--bins", bins, "-o",
                            (tmp / "bins.json").string()});
    INFO("--bins " << bins << ": " << r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("--bins must be an even number from 2 to 1048576"));
    CHECK_FALSE(fs::exists(tmp / "bins.json"));
  }
}

TEST_CASE("mpq calibrate --tensors quantized: fewer tensors, the ones quantize reads, the same export", "[calib][cli]") {
  test::TempDir tmp;
  const fs::path model = test::source_dir() / "tests/models/resnet_bn_op13.onnx";
  const fs::path data = test::source_dir() / "tests/models/resnet_bn_op13_data";
  auto all = test::run_mpq({"calibrate", model.string(), "--data", data.string(), "--method", "minmax", "-o",
                            (tmp / "all.json").string()});
  auto quantized = test::run_mpq({"calibrate", model.string(), "--data", data.string(), "--method", "minmax",
                                  "--tensors", "quantized", "-o", (tmp / "q.json").string()});
  INFO(all.err << quantized.err);
  REQUIRE(all.exit_code == 0);
  REQUIRE(quantized.exit_code == 0);
  const auto ja = nlohmann::json::parse(std::ifstream(tmp / "all.json"));
  const auto jq = nlohmann::json::parse(std::ifstream(tmp / "q.json"));
  CHECK(jq["tensors"].size() < ja["tensors"].size());
  CHECK(jq["tensors"].size() >= 3);
  for (const auto& [name, t] : jq["tensors"].items()) {
    INFO(name);
    // A tensor of the fused graph keeps its name; after BatchNorm folding the ranges agree with the
    // unfused graph's to float rounding.
    REQUIRE(ja["tensors"].contains(name));
    CHECK(t["scale"].get<double>() == Approx(ja["tensors"][name]["scale"].get<double>()).epsilon(1e-4));
  }
  // quantize --calib reads either table to the same QDQ model: run both on one feed.
  for (const char* t : {"all", "q"}) {
    auto r = test::run_mpq({"quantize", model.string(), "--calib", (tmp / fmt::format("{}.json", t)).string(), "-o",
                            (tmp / fmt::format("{}.onnx", t)).string()});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
  const rt::Feeds feed = {{"input", data::read_npy(data / "feed_0" / "input.npy")}};
  const ir::Model ma = ir::load_model(tmp / "all.onnx"), mq = ir::load_model(tmp / "q.onnx");
  rt::Executor ea(ma), eq(mq);
  const std::vector<Tensor> ya = ea.run(feed), yq = eq.run(feed);
  REQUIRE(ya.size() == yq.size());
  // Scales equal to float rounding; a value on a rounding boundary may still land one step apart.
  double diff = 0, peak = 0;
  for (int64_t i = 0; i < ya[0].numel(); ++i) {
    diff = std::max(diff, std::abs(yq[0].get_double(i) - ya[0].get_double(i)));
    peak = std::max(peak, std::abs(ya[0].get_double(i)));
  }
  CHECK(peak > 0);
  CHECK(diff <= 0.01 * peak);

  // One thread folds each tensor as it is produced; two hold them and fold after each run, except a
  // residual that a FusedConv may overwrite in place. The histograms and so the table are the same.
  for (const char* threads : {"1", "2"}) {
    auto r = test::run_mpq({"calibrate", model.string(), "--data", data.string(), "--tensors", "quantized",
                            "--threads", threads, "-o", (tmp / fmt::format("e{}.json", threads)).string()});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
  const auto e1 = nlohmann::json::parse(std::ifstream(tmp / "e1.json"));
  const auto e2 = nlohmann::json::parse(std::ifstream(tmp / "e2.json"));
  CHECK(e1["tensors"].size() == jq["tensors"].size());
  CHECK(e1["tensors"] == e2["tensors"]);

  auto bad = test::run_mpq({"calibrate", model.string(), "--data", data.string(), "--tensors", "some", "-o",
                            (tmp / "bad.json").string()});
  CHECK(bad.exit_code != 0);
  CHECK_FALSE(fs::exists(tmp / "bad.json"));
  // A TensorRT cache needs the tensors the fused graph does not have.
  auto trt = test::run_mpq({"calibrate", model.string(), "--data", data.string(), "--tensors", "quantized", "--trt-cache",
                            (tmp / "c.cache").string(), "-o", (tmp / "t.json").string()});
  CHECK(trt.exit_code == 2);
  CHECK_THAT(trt.err, Catch::Contains("--tensors all"));
  CHECK_FALSE(fs::exists(tmp / "t.json"));
  CHECK_FALSE(fs::exists(tmp / "c.cache"));
  // QOperator export from that table leaves the convolutions whose output range it lacks as QDQ,
  // saying so.
  auto qop = test::run_mpq({"quantize", model.string(), "--calib", (tmp / "q.json").string(), "--format", "qoperator", "-o",
                            (tmp / "qop.onnx").string()});
  CHECK(qop.exit_code == 0);
  CHECK_THAT(qop.err, Catch::Contains("stays QDQ"));
}
