// Streaming accuracy metrics against naive double-precision references written here.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

#include "core/half.h"
#include "runtime/low_precision.h"
#include "test_util.h"
#include "validate/metrics.h"

using namespace mpq;
using namespace mpq::validate;

namespace {

struct NaiveMetrics {
  double cosine, rel_l2, snr_db, max_abs, mean_abs;
};

NaiveMetrics naive(const std::vector<float>& r, const std::vector<float>& c) {
  double rr = 0, cc = 0, rc = 0, ee = 0, mx = 0, ab = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    const double a = r[i], b = c[i];
    rr += a * a;
    cc += b * b;
    rc += a * b;
    ee += (b - a) * (b - a);
    mx = std::max(mx, std::fabs(b - a));
    ab += std::fabs(b - a);
  }
  return {rc / std::sqrt(rr * cc), std::sqrt(ee / rr), 10.0 * std::log10(rr / ee), mx, ab / static_cast<double>(r.size())};
}

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> add_noise(const std::vector<float>& v, uint32_t seed, float scale) {
  std::vector<float> n = random_vec(v.size(), seed, scale);
  for (size_t i = 0; i < v.size(); ++i) n[i] += v[i];
  return n;
}

}  // namespace

TEST_CASE("metrics match a naive reference on odd sizes", "[validate][metrics]") {
  for (size_t n : {1u, 3u, 7u, 1001u, 4099u}) {
    auto r = random_vec(n, 11 + static_cast<uint32_t>(n));
    auto c = add_noise(r, 99 + static_cast<uint32_t>(n), 0.05f);
    NaiveMetrics want = naive(r, c);
    ErrorStats s;
    s.add(r.data(), c.data(), static_cast<int64_t>(n));
    INFO("n = " << n);
    CHECK(s.count() == static_cast<int64_t>(n));
    CHECK(s.cosine() == Approx(want.cosine).epsilon(1e-12));
    CHECK(s.rel_l2() == Approx(want.rel_l2).epsilon(1e-10));
    CHECK(s.snr_db() == Approx(want.snr_db).epsilon(1e-10));
    CHECK(s.max_abs_error() == Approx(want.max_abs).epsilon(1e-12));
    CHECK(s.mean_abs_error() == Approx(want.mean_abs).epsilon(1e-10));
    // Free functions agree with the accumulator.
    CHECK(cosine_similarity(r.data(), c.data(), static_cast<int64_t>(n)) == Approx(want.cosine).epsilon(1e-12));
    CHECK(snr_db(r.data(), c.data(), static_cast<int64_t>(n)) == Approx(want.snr_db).epsilon(1e-10));
  }
}

TEST_CASE("metrics stream: chunks and merges equal one pass", "[validate][metrics]") {
  auto r = random_vec(3001, 5);
  auto c = add_noise(r, 6, 0.1f);
  ErrorStats whole;
  whole.add(r.data(), c.data(), 3001);
  ErrorStats chunked, a, b;
  for (int64_t off = 0; off < 3001; off += 97) chunked.add(r.data() + off, c.data() + off, std::min<int64_t>(97, 3001 - off));
  a.add(r.data(), c.data(), 1500);
  b.add(r.data() + 1500, c.data() + 1500, 1501);
  a.merge(b);
  for (const ErrorStats* s : {&chunked, &a}) {
    CHECK(s->count() == 3001);
    CHECK(s->cosine() == Approx(whole.cosine()).epsilon(1e-12));
    CHECK(s->snr_db() == Approx(whole.snr_db()).epsilon(1e-10));
    CHECK(s->max_abs_error() == whole.max_abs_error());
  }
}

TEST_CASE("metrics: exact, scaled and degenerate inputs", "[validate][metrics]") {
  std::vector<float> r = {1, -2, 3, 0.5f, -0.25f};
  ErrorStats same;
  same.add(r.data(), r.data(), 5);
  CHECK(same.cosine() == 1.0);
  CHECK(same.rel_l2() == 0.0);
  CHECK(std::isinf(same.snr_db()));
  CHECK(same.snr_db() > 0);
  CHECK(same.max_abs_error() == 0.0);

  std::vector<float> twice = r;
  for (float& x : twice) x *= 2;
  ErrorStats scaled;
  scaled.add(r.data(), twice.data(), 5);
  CHECK(scaled.cosine() == Approx(1.0));
  CHECK(scaled.rel_l2() == Approx(1.0));
  CHECK(scaled.snr_db() == Approx(0.0).margin(1e-12));
  CHECK(scaled.max_abs_error() == Approx(3.0));

  std::vector<float> neg = r;
  for (float& x : neg) x = -x;
  CHECK(cosine_similarity(r.data(), neg.data(), 5) == Approx(-1.0));

  std::vector<float> zeros(5, 0.0f);
  CHECK(cosine_similarity(zeros.data(), zeros.data(), 5) == 1.0);
  CHECK(cosine_similarity(zeros.data(), r.data(), 5) == 0.0);
  ErrorStats from_zero;
  from_zero.add(zeros.data(), r.data(), 5);
  CHECK(std::isinf(from_zero.snr_db()));
  CHECK(from_zero.snr_db() < 0);

  ErrorStats empty;
  CHECK(std::isnan(empty.cosine()));
  CHECK(std::isnan(empty.snr_db()));
}

TEST_CASE("metrics: a NaN or inf makes every metric NaN and is counted", "[validate][metrics]") {
  std::vector<float> r = {1, 2, 3, 4};
  std::vector<float> c = {1, std::numeric_limits<float>::quiet_NaN(), 3, std::numeric_limits<float>::infinity()};
  ErrorStats s;
  s.add(r.data(), c.data(), 4);
  CHECK(s.nonfinite() == 2);
  CHECK(std::isnan(s.cosine()));
  CHECK(std::isnan(s.snr_db()));
  CHECK(std::isnan(s.rel_l2()));
  CHECK(std::isnan(s.max_abs_error()));
  // Still NaN after more clean data.
  s.add(r.data(), r.data(), 4);
  CHECK(std::isnan(s.cosine()));
}

TEST_CASE("metrics: worst row cosine", "[validate][metrics]") {
  // Three rows of two: the first two identical, the last one orthogonal to its reference.
  std::vector<float> r = {1, 1, 1, 1, 2, 2};
  std::vector<float> c = {1, 1, 1, 1, 2, -2};
  ErrorStats s;
  s.add_rows(r.data(), c.data(), 6, 3);
  CHECK(s.rows() == 3);
  CHECK(s.min_row_cosine() == Approx(0.0).margin(1e-12));
  CHECK(s.count() == 6);
  ErrorStats t;
  t.add(r.data(), c.data(), 6);
  CHECK(s.cosine() == Approx(t.cosine()));
  CHECK(std::isnan(t.min_row_cosine()));
}

TEST_CASE("tensor metrics widen float16 and reject shape mismatches", "[validate][metrics]") {
  Tensor a = test::random_tensor({3, 5}, 1);
  Tensor h = rt::narrow_from_float32(a, DType::Float16);
  ErrorStats s;
  s.add(a, h);
  CHECK(s.snr_db() > 60.0);  // float16 rounding: ~2^-11 relative
  CHECK(s.snr_db() < 90.0);
  ErrorStats bad;
  CHECK_THROWS_AS(bad.add(a, test::random_tensor({5, 3}, 1)), Error);
  CHECK_THROWS_AS(bad.add(a, Tensor::from<int64_t>({3, 5}, std::vector<int64_t>(15, 1))), Error);
}

TEST_CASE("class layout and argmax", "[validate][metrics]") {
  CHECK_FALSE(class_layout({10}, 1));
  CHECK_FALSE(class_layout({4, 1}, 1));
  auto l = class_layout({2, 3}, 1);
  REQUIRE(l);
  CHECK(l->positions() == 2);
  CHECK(l->classes == 3);
  auto seg = class_layout({2, 3, 4, 5}, 1);
  REQUIRE(seg);
  CHECK(seg->positions() == 40);
  auto last = class_layout({2, 7, 11}, -1);
  REQUIRE(last);
  CHECK(last->classes == 11);
  CHECK(last->positions() == 14);

  // [2 rows, 3 classes]; the second row has a tie (lowest class wins).
  std::vector<float> scores = {0.1f, 0.7f, 0.2f, 0.5f, 0.1f, 0.5f};
  auto cls = argmax_classes(scores.data(), *l);
  CHECK(cls == std::vector<int64_t>{1, 0});
  // Class axis 1 of [1, 3, 2]: positions are the 2 inner elements.
  ClassLayout l3{1, 3, 2};
  std::vector<float> s3 = {0, 9, 5, 1, 7, 0};  // class c at [c*2 + inner]
  CHECK(argmax_classes(s3.data(), l3) == std::vector<int64_t>{2, 0});
  std::vector<float> with_nan = {0.1f, std::numeric_limits<float>::quiet_NaN(), 0.2f, 0.5f, 0.1f, 0.0f};
  CHECK(argmax_classes(with_nan.data(), *l) == std::vector<int64_t>{-1, 0});
}

TEST_CASE("top-1 agreement and accuracy", "[validate][metrics]") {
  Top1Stats t;
  t.add_labels({1, 2, 3, 4}, {1, 2, 0, 4}, {1, 2, 3, 0});
  CHECK(t.positions() == 4);
  CHECK(t.agreement() == Approx(0.75));
  CHECK(t.ref_accuracy() == Approx(0.75));
  CHECK(t.cand_accuracy() == Approx(0.5));
  CHECK(t.accuracy_drop() == Approx(0.25));
  Top1Stats u;
  u.add({0, 0}, {0, 1});
  CHECK(std::isnan(u.ref_accuracy()));
  t.merge(u);
  CHECK(t.positions() == 6);
  CHECK(t.agreement() == Approx(4.0 / 6.0));
  CHECK(t.labelled() == 4);
  CHECK_THROWS_AS(u.add({1}, {1, 2}), Error);
  CHECK_THROWS_AS(u.add_labels({1}, {1}, {1, 2}), Error);
}
