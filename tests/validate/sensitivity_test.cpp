// Sensitivity search on a classifier built here: a layer whose calibration range was sabotaged
// costs the accuracy, is ranked first and is the one kept in FP32; a generous budget keeps nothing;
// the CLI wraps it.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>

#include "calib/calibrator.h"
#include "calib/qparams.h"
#include "data/npy.h"
#include "ir/onnx_io.h"
#include "passes/insert_qdq.h"
#include "runtime/executor.h"
#include "test_util.h"
#include "validate/sensitivity.h"

using namespace mpq;
using namespace mpq::validate;
namespace fs = std::filesystem;

namespace {

ir::ValueType batch_type(int64_t features) {
  return ir::ValueType::tensor(DType::Float32, std::vector<ir::Dim>{ir::Dim::symbol("N"), ir::Dim::fixed(features)});
}

// A small classifier built here: x[N,16] -> mm1 -> Relu -> h1 -> mm2 -> Relu -> h2 -> mm3 -> logits[N,10].
// Random weights without normalisation give well-spread predictions on random inputs.
ir::Model classifier() {
  ir::Model m;
  m.set_opset("", 17);
  ir::Graph* g = m.graph.get();
  ir::Value* x = g->add_value("x", batch_type(16));
  g->add_input(x);
  ir::Value* w1 = g->add_initializer("w1", test::random_tensor({16, 32}, 1, -0.4f, 0.4f));
  ir::Value* w2 = g->add_initializer("w2", test::random_tensor({32, 32}, 2, -0.3f, 0.3f));
  ir::Value* w3 = g->add_initializer("w3", test::random_tensor({32, 10}, 3, -0.3f, 0.3f));
  auto v = [&](const char* n) { return g->add_value(n); };
  ir::Value *a1 = v("a1"), *h1 = v("h1"), *a2 = v("a2"), *h2 = v("h2");
  ir::Value* logits = g->add_value("logits", batch_type(10));
  g->add_node("MatMul", {x, w1}, {a1}, "mm1");
  g->add_node("Relu", {a1}, {h1}, "relu1");
  g->add_node("MatMul", {h1, w2}, {a2}, "mm2");
  g->add_node("Relu", {a2}, {h2}, "relu2");
  g->add_node("MatMul", {h2, w3}, {logits}, "mm3");
  g->add_output(logits);
  return m;
}

// 200 random samples with labels equal to the FP32 model's predictions (accuracy 100%), and the
// model saved beside them for the CLI.
struct Data {
  test::TempDir tmp{"mpq-sens"};
  Data() {
    ir::Model m = classifier();
    fs::create_directories(tmp / "eval");
    Tensor x = test::random_tensor({200, 16}, 77, -1.0f, 1.0f);
    rt::ExecOptions eo;
    eo.threads = 1;
    rt::Executor exec(m, eo);
    Tensor logits = exec.run({{"x", x}})[0];
    std::vector<int64_t> labels;
    for (int64_t r = 0; r < 200; ++r) {
      const float* row = logits.data<float>() + r * 10;
      labels.push_back(std::max_element(row, row + 10) - row);
    }
    data::write_npy(tmp / "eval" / "x.npy", x);
    data::write_npy(tmp / "eval" / "labels.npy", Tensor::from<int64_t>({200}, labels));
    ir::save_model(m, tmp / "model.onnx");
  }
  fs::path dir() const { return tmp / "eval"; }
  fs::path model() const { return tmp / "model.onnx"; }
};

// A quantizer whose calibration range for `sabotage` is cut to 1/20th, so the MatMul reading it
// clips most of its input.
struct Quantizer {
  ir::Model prepared;
  calib::CalibrationTable table;
  Quantizer(const ir::Model& fp32, const data::FeedSource& feeds, const std::string& sabotage) : prepared(fp32.clone()) {
    calib::CalibOptions co;
    co.method = calib::RangeMethod::MinMax;
    co.threads = 1;
    table = calib::calibrate(prepared, feeds, co);
    if (!sabotage.empty()) {
      bool found = false;
      for (auto& t : table.tensors) {
        if (t.name != sabotage) continue;
        t.amax /= 20.0;
        t.min /= 20.0;
        t.max /= 20.0;
        t.q = calib::symmetric_int8(t.amax);
        found = true;
      }
      REQUIRE(found);
    }
  }
  ir::Model operator()(const std::set<std::string>& keep) const {
    ir::Model m = prepared.clone();
    passes::QdqOptions qo;
    qo.exclude_nodes = keep;
    passes::insert_qdq(m, table, qo);
    return m;
  }
};

}  // namespace

TEST_CASE("quantized compute nodes of a QDQ model", "[validate][sensitivity]") {
  Data d;
  ir::Model m = classifier();
  data::FeedSource feeds = data::FeedSource::open(d.dir(), m);
  Quantizer q(m, feeds, "");
  auto nodes = quantized_compute_nodes(q({}));
  REQUIRE(nodes.size() == 3);
  CHECK(nodes[0] == std::make_pair(std::string("mm1"), std::string("MatMul")));
  auto fewer = quantized_compute_nodes(q({"mm2"}));
  CHECK(fewer.size() == 2);
  CHECK(quantized_compute_nodes(m).empty());
}

TEST_CASE("the sabotaged layer is ranked first and kept in FP32", "[validate][sensitivity]") {
  Data d;
  ir::Model m = classifier();
  data::FeedSource feeds = data::FeedSource::open(d.dir(), m);
  REQUIRE(feeds.labels());
  Quantizer q(m, feeds, "h1");  // the input of mm2
  SensitivityOptions so;
  so.max_top1_drop = 0.0;
  so.rank = SensitivityRank::Exclusion;
  so.compare.threads = 1;
  so.compare.batch_rows = 64;
  SensitivityResult r = run_sensitivity(m, feeds, std::cref(q), so);
  INFO(sensitivity_to_json(r).dump(2));
  CHECK(r.labels);
  CHECK(r.metric == "accuracy_drop");
  CHECK(r.samples == 200);
  CHECK(r.reference_accuracy == 1.0);
  CHECK(r.candidates == 3);
  CHECK(r.initial.drop > 0.0);
  REQUIRE_FALSE(r.ranking.empty());
  CHECK(r.ranking.front().node == "mm2");
  CHECK(r.met);
  CHECK(r.final_eval.drop <= 0.0);
  REQUIRE_FALSE(r.kept.empty());
  CHECK(r.kept.front() == "mm2");
  CHECK(r.evaluations >= 1 + 3 + static_cast<int>(r.kept.size()));

  // SNR ranking (one per-layer pass) points at the same node.
  so.rank = SensitivityRank::Snr;
  SensitivityResult s = run_sensitivity(m, feeds, std::cref(q), so);
  CHECK(s.rank_method == "snr");
  REQUIRE_FALSE(s.ranking.empty());
  CHECK(s.ranking.front().node == "mm2");
  CHECK(s.met);

  // A generous budget keeps everything quantized after one evaluation.
  so.max_top1_drop = 1.0;
  SensitivityResult g = run_sensitivity(m, feeds, std::cref(q), so);
  CHECK(g.met);
  CHECK(g.kept.empty());
  CHECK(g.evaluations == 1);
  auto j = sensitivity_to_json(g);
  CHECK(j["schema"] == "mpq-sensitivity-report");
  CHECK(j["kept_in_float"].empty());
}

TEST_CASE("sensitivity without labels uses top-1 disagreement; a non-classifier is an input error", "[validate][sensitivity]") {
  Data d;
  fs::remove(d.dir() / "labels.npy");
  ir::Model m = classifier();
  data::FeedSource feeds = data::FeedSource::open(d.dir(), m);
  REQUIRE_FALSE(feeds.labels());
  Quantizer q(m, feeds, "h1");
  SensitivityOptions so;
  so.max_top1_drop = 0.0;
  so.compare.threads = 1;
  so.max_keep = 1;
  SensitivityResult r = run_sensitivity(m, feeds, std::cref(q), so);
  CHECK(r.metric == "top1_disagreement");
  CHECK(r.initial.drop > 0.0);
  REQUIRE(r.kept.size() == 1);
  CHECK(r.kept[0] == "mm2");
  so.compare.label_output = "nope";
  CHECK_THROWS_WITH(run_sensitivity(m, feeds, std::cref(q), so), Catch::Contains("classifier output"));
}

TEST_CASE("mpq sensitivity end to end", "[validate][sensitivity][cli]") {
  Data d;
  test::TempDir out;
  // The sabotaged table goes in through --calib.
  ir::Model m = classifier();
  data::FeedSource feeds = data::FeedSource::open(d.dir(), m);
  Quantizer q(m, feeds, "h1");
  calib::write_table(q.table, out / "bad.json");
  auto r = test::run_mpq({"sensitivity", d.model().string(), "--data", d.dir().string(), "--calib", (out / "bad.json").string(),
                          "--max-top1-drop", "0.02", "-o", (out / "mixed.onnx").string(), "--report", (out / "s.json").string(),
                          "--threads", "1"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("kept in FP32 (1): mm2"));
  ir::Model mixed = ir::load_model(out / "mixed.onnx");
  CHECK(mixed.get_metadata("mpq.sensitivity.kept_fp32") == "mm2");
  auto nodes = quantized_compute_nodes(mixed);
  CHECK(nodes.size() == 2);
  std::ifstream in(out / "s.json");
  auto j = nlohmann::json::parse(in);
  CHECK(j["met"] == true);
  CHECK(j["kept_in_float"] == nlohmann::json::array({"mm2"}));
  // The written model meets the budget when validated independently.
  auto v = test::run_mpq({"validate", "--reference", d.model().string(), "--candidate", (out / "mixed.onnx").string(), "--data",
                          d.dir().string(), "--max-top1-drop", "0.02"});
  INFO(v.out << v.err);
  CHECK(v.exit_code == 0);
  // An impossible budget with nothing allowed in float: exit 1.
  auto none = test::run_mpq({"sensitivity", d.model().string(), "--data", d.dir().string(), "--calib", (out / "bad.json").string(),
                             "--max-top1-drop", "0", "--max-keep", "0", "--threads", "1"});
  CHECK(none.exit_code == 1);
  // Bad usage: neither calibration source.
  auto bad = test::run_mpq({"sensitivity", d.model().string(), "--data", d.dir().string()});
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("--calib TABLE or --calib-data DIR"));
}
