// Thresholds: file parsing, flag overrides, and checks that pass and fail both ways on constructed
// comparisons.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <random>

#include "test_util.h"
#include "validate/thresholds.h"

using namespace mpq;
using namespace mpq::validate;

namespace {

// A comparison with one classifier output "logits" ([rows, 4]) whose candidate is the reference
// plus noise of the given size, and one regression output "box" without class scores.
CompareResult constructed(float noise, bool labels) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const int rows = 200, classes = 4;
  std::vector<float> ref(rows * classes), cand(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    ref[i] = d(rng);
    cand[i] = ref[i] + noise * d(rng);
  }
  CompareResult r;
  r.rows = rows;
  r.feeds = 1;
  r.runs = 1;
  r.have_labels = labels;
  OutputResult logits;
  logits.name = "logits";
  logits.shape = {rows, classes};
  logits.stats.add_rows(ref.data(), cand.data(), static_cast<int64_t>(ref.size()), rows);
  ClassLayout l{rows, classes, 1};
  auto rc = argmax_classes(ref.data(), l);
  auto cc = argmax_classes(cand.data(), l);
  Top1Stats t;
  if (labels) {
    t.add_labels(rc, cc, rc);  // labels = reference predictions: reference accuracy 100%
    logits.labelled = true;
  } else {
    t.add(rc, cc);
  }
  logits.top1 = t;
  r.outputs.push_back(logits);
  OutputResult box;
  box.name = "box";
  box.shape = {rows};
  box.stats.add(ref.data(), cand.data(), rows);
  r.outputs.push_back(box);
  return r;
}

const Check* find_check(const std::vector<Check>& checks, const std::string& id) {
  for (const Check& c : checks)
    if (c.id == id) return &c;
  return nullptr;
}

}  // namespace

TEST_CASE("thresholds file: parse, per-output overrides, flags win", "[validate][thresholds]") {
  Thresholds t = parse_thresholds(R"({"description": "demo", "min_cosine": 0.99, "min_snr_db": 20,
                                      "outputs": {"logits": {"min_snr_db": 30, "max_top1_drop": 0.01}}})",
                                  "t.json");
  CHECK(*t.all.min_cosine == 0.99);
  CHECK(*t.for_output("logits").min_snr_db == 30);
  CHECK(*t.for_output("box").min_snr_db == 20);
  CHECK(*t.for_output("logits").min_cosine == 0.99);
  CHECK_FALSE(t.for_output("box").max_top1_drop);
  ThresholdSet flags;
  flags.min_snr_db = 10;
  t.override_with(flags);
  CHECK(*t.for_output("logits").min_snr_db == 10);
  CHECK(*t.for_output("box").min_snr_db == 10);
  CHECK(t.source == "t.json + flags");
  CHECK_FALSE(t.empty());
  CHECK(Thresholds{}.empty());
}

TEST_CASE("thresholds file: mistakes are input errors naming the key", "[validate][thresholds]") {
  CHECK_THROWS_WITH(parse_thresholds(R"({"min_cosin": 0.9})", "t.json"), Catch::Contains("unknown threshold 'min_cosin'"));
  CHECK_THROWS_WITH(parse_thresholds(R"({"min_cosine": "high"})", "t.json"), Catch::Contains("must be a number"));
  CHECK_THROWS_WITH(parse_thresholds(R"({"outputs": {"y": {"max_drop": 1}}})", "t.json"),
                    Catch::Contains("unknown threshold 'max_drop' (output 'y')"));
  CHECK_THROWS_WITH(parse_thresholds("[1, 2]", "t.json"), Catch::Contains("one JSON object"));
  CHECK_THROWS_WITH(parse_thresholds("{", "t.json"), Catch::Contains("not valid JSON"));
  try {
    parse_thresholds(R"({"min_cosin": 0.9})", "t.json");
  } catch (const Error& e) {
    CHECK(e.exit_code() == 2);
  }
  CHECK_THROWS_WITH(read_thresholds("/nonexistent/thresholds.json"), Catch::Contains("not found"));
}

TEST_CASE("checks pass when the candidate is close and fail when it is not", "[validate][thresholds]") {
  Thresholds t = parse_thresholds(R"({"min_cosine": 0.999, "min_snr_db": 30, "max_rel_l2": 0.05,
                                      "max_abs_error": 0.1, "min_top1_agreement": 0.97, "max_top1_drop": 0.02})",
                                  "t.json");
  {
    CompareResult close = constructed(0.001f, false);
    auto checks = evaluate_checks(close, t);
    for (const Check& c : checks) {
      INFO(c.message);
      CHECK(c.status != Check::Status::Fail);
    }
    // box has no class scores: its top-1 checks are skipped, not passed or failed.
    REQUIRE(find_check(checks, "box/min_top1_agreement"));
    CHECK(find_check(checks, "box/min_top1_agreement")->status == Check::Status::Skip);
    CHECK(find_check(checks, "logits/min_top1_agreement")->status == Check::Status::Pass);
    CHECK(find_check(checks, "logits/max_top1_drop")->metric == "top1_disagreement");
  }
  {
    CompareResult far = constructed(0.5f, false);
    auto checks = evaluate_checks(far, t);
    for (const char* id : {"logits/min_cosine", "logits/min_snr_db", "logits/max_rel_l2", "logits/max_abs_error",
                           "logits/min_top1_agreement", "logits/max_top1_drop", "box/min_snr_db"}) {
      const Check* c = find_check(checks, id);
      REQUIRE(c);
      INFO(id << ": " << c->message);
      CHECK(c->status == Check::Status::Fail);
    }
    const Check* cos = find_check(checks, "logits/min_cosine");
    CHECK_THAT(cos->message, Catch::Contains("logits: cosine") && Catch::Contains("< 0.999"));
  }
}

TEST_CASE("checks on the exact boundary pass; NaN always fails", "[validate][thresholds]") {
  CompareResult r = constructed(0.1f, false);
  const double cos = r.outputs[0].stats.cosine();
  Thresholds t;
  t.all.min_cosine = cos;
  auto checks = evaluate_checks(r, t);
  CHECK(find_check(checks, "logits/min_cosine")->status == Check::Status::Pass);
  t.all.min_cosine = std::nextafter(cos, 2.0);
  checks = evaluate_checks(r, t);
  CHECK(find_check(checks, "logits/min_cosine")->status == Check::Status::Fail);

  float nan = std::numeric_limits<float>::quiet_NaN();
  float one = 1.0f;
  r.outputs[1].stats.add(&one, &nan, 1);
  Thresholds loose;
  loose.all.max_abs_error = 1e30;
  checks = evaluate_checks(r, loose);
  CHECK(find_check(checks, "logits/max_abs_error")->status == Check::Status::Pass);
  CHECK(find_check(checks, "box/max_abs_error")->status == Check::Status::Fail);
}

TEST_CASE("accuracy checks with labels", "[validate][thresholds]") {
  CompareResult r = constructed(0.3f, true);
  const double drop = r.outputs[0].top1->accuracy_drop();
  REQUIRE(drop > 0.0);
  Thresholds pass, fail;
  pass.all.max_top1_drop = drop + 1e-9;
  pass.all.min_accuracy = 1.0 - drop - 1e-9;
  fail.all.max_top1_drop = drop - 1e-3;
  fail.all.min_accuracy = 1.0 - drop + 1e-3;
  auto pc = evaluate_checks(r, pass);
  auto fc = evaluate_checks(r, fail);
  CHECK(find_check(pc, "logits/max_top1_drop")->status == Check::Status::Pass);
  CHECK(find_check(pc, "logits/max_top1_drop")->metric == "accuracy_drop");
  CHECK(find_check(pc, "logits/min_accuracy")->status == Check::Status::Pass);
  CHECK(find_check(fc, "logits/max_top1_drop")->status == Check::Status::Fail);
  CHECK(find_check(fc, "logits/min_accuracy")->status == Check::Status::Fail);
  // The regression output has no labels: its accuracy check is skipped.
  CHECK(find_check(pc, "box/min_accuracy")->status == Check::Status::Skip);
}

TEST_CASE("thresholds naming an unknown output are an input error", "[validate][thresholds]") {
  CompareResult r = constructed(0.1f, false);
  Thresholds t = parse_thresholds(R"({"outputs": {"nope": {"min_cosine": 0.5}}})", "t.json");
  CHECK_THROWS_WITH(evaluate_checks(r, t), Catch::Contains("'nope'"));
}

TEST_CASE("a top-1 budget typed as a decimal holds on the exact count", "[validate][thresholds]") {
  // 998 of 1000 positions agree: 2 changed = 0.002 exactly, which a budget of 0.002 allows.
  // (1 - 998/1000 rounds to 0.0020000000000000018 and would fail it.)
  CompareResult r;
  r.rows = 1000;
  OutputResult o;
  o.name = "logits";
  o.shape = {1000, 2};
  std::vector<int64_t> ref(1000, 0), cand(1000, 0);
  cand[10] = cand[500] = 1;
  Top1Stats t;
  t.add(ref, cand);
  o.top1 = t;
  std::vector<float> zeros(2000, 0.0f);
  o.stats.add(zeros.data(), zeros.data(), 2000);
  r.outputs.push_back(o);
  CHECK(t.disagreement() == 0.002);
  Thresholds th = parse_thresholds(R"({"max_top1_drop": 0.002, "min_top1_agreement": 0.998})", "t.json");
  auto checks = evaluate_checks(r, th);
  CHECK(find_check(checks, "logits/max_top1_drop")->metric == "top1_disagreement");
  CHECK(find_check(checks, "logits/max_top1_drop")->status == Check::Status::Pass);
  CHECK(find_check(checks, "logits/min_top1_agreement")->status == Check::Status::Pass);
  th = parse_thresholds(R"({"max_top1_drop": 0.001})", "t.json");
  CHECK(find_check(evaluate_checks(r, th), "logits/max_top1_drop")->status == Check::Status::Fail);
}
