// `mpq validate` end to end: exit codes both ways, reports, per-layer diagnosis of a model with
// one convolution's weights perturbed, INT8 candidates from `mpq quantize`, and bad input.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <random>

#include "ir/onnx_io.h"
#include "test_util.h"

using namespace mpq;
namespace fs = std::filesystem;

namespace {

const char* kConv = "/layer2/conv2/Conv";
const char* kConvOut = "/layer2/conv2/Conv_output_0";
const char* kConvWeight = "layer2.conv2.weight";

fs::path model() { return test::source_dir() / "tests" / "models" / "resnet_bn_op13.onnx"; }
fs::path data() { return test::source_dir() / "tests" / "models" / "resnet_bn_op13_data"; }

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

// The model with one convolution's weights multiplied by (1 + rel * N(0,1)).
fs::path perturbed_model(const test::TempDir& tmp, float rel) {
  ir::Model m = ir::load_model(model());
  ir::Value* w = m.graph->find(kConvWeight);
  REQUIRE(w);
  REQUIRE(w->has_initializer());
  Tensor t = w->initializer().clone();
  std::mt19937 rng(1234);
  std::normal_distribution<float> d(0.0f, 1.0f);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] *= 1.0f + rel * d(rng);
  m.graph->set_initializer(w, t);
  fs::path out = tmp / "perturbed.onnx";
  ir::save_model(m, out);
  return out;
}

std::string info(const test::CommandResult& r) { return "exit " + std::to_string(r.exit_code) + "\nstdout:\n" + r.out + "\nstderr:\n" + r.err; }

}  // namespace

TEST_CASE("validate: identical models pass every threshold (exit 0)", "[validate][cli]") {
  test::TempDir tmp;
  auto r = test::run_mpq({"validate", "--reference", model().string(), "--candidate", model().string(), "--data", data().string(),
                          "--min-cosine", "0.999999", "--min-snr-db", "100", "--max-abs-error", "0", "--max-top1-drop", "0",
                          "--report", (tmp / "r.json").string()});
  INFO(info(r));
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("PASSED"));
  CHECK_THAT(r.out, Catch::Contains("4 passed, 0 failed"));
  auto j = nlohmann::json::parse(slurp(tmp / "r.json"));
  CHECK(j["passed"] == true);
  CHECK(j["samples"] == 5);
  CHECK(j["outputs"][0]["snr_db"] == "inf");
  CHECK(j["outputs"][0]["cosine"] == 1.0);
}

TEST_CASE("validate: a perturbed convolution fails and --per-layer names it first", "[validate][cli]") {
  test::TempDir tmp;
  fs::path cand = perturbed_model(tmp, 1.0f);
  std::vector<std::string> args = {"validate",     "--reference", model().string(), "--candidate", cand.string(),
                                   "--data",       data().string(), "--min-cosine", "0.9999",    "--min-snr-db",
                                   "45",           "--per-layer",  "--report",      (tmp / "r.json").string(),
                                   "--report",     (tmp / "r.xml").string(), "--report", (tmp / "r.html").string()};
  auto r = test::run_mpq(args);
  INFO(info(r));
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Catch::Contains("FAIL output: cosine"));
  CHECK_THAT(r.out, Catch::Contains("FAIL output: snr_db"));
  CHECK_THAT(r.out, Catch::Contains(std::string("error first jumps at '") + kConvOut + "' (Conv node '" + kConv + "')"));
  CHECK_THAT(r.out, Catch::Contains("FAILED"));

  auto j = nlohmann::json::parse(slurp(tmp / "r.json"));
  CHECK(j["passed"] == false);
  CHECK(j["summary"]["failed"] == 2);
  const auto& pl = j["per_layer"];
  REQUIRE(pl.is_object());
  CHECK(pl["ranking"][0] == kConvOut);
  CHECK(pl["first_jump"]["name"] == kConvOut);
  CHECK(pl["first_jump"]["node"] == kConv);
  CHECK(pl["first_jump"]["op_type"] == "Conv");
  CHECK(pl["first_jump"]["upstream_snr_db"] == "inf");
  // Every layer that runs before the perturbed convolution is exact.
  int exact_before = 0;
  for (const auto& l : pl["layers"]) {
    if (l["name"] == kConvOut) break;
    CHECK(l["snr_db"] == "inf");
    ++exact_before;
  }
  CHECK(exact_before >= 6);
  CHECK(pl["compared"].get<int>() > 20);

  // The JUnit and HTML reports carry the same verdict.
  std::string xml = slurp(tmp / "r.xml");
  CHECK_THAT(xml, Catch::Contains("failures=\"2\""));
  CHECK_THAT(xml, Catch::Contains("<failure message=\"output: cosine"));
  std::string html = slurp(tmp / "r.html");
  CHECK_THAT(html, Catch::Contains("<svg"));
  CHECK_THAT(html, Catch::Contains(std::string("first jump: ") + kConvOut));

  // Deterministic: a second run writes byte-identical reports.
  fs::path first_json = tmp / "first.json", first_xml = tmp / "first.xml", first_html = tmp / "first.html";
  fs::copy_file(tmp / "r.json", first_json);
  fs::copy_file(tmp / "r.xml", first_xml);
  fs::copy_file(tmp / "r.html", first_html);
  auto again = test::run_mpq(args);
  CHECK(again.exit_code == 1);
  CHECK(slurp(tmp / "r.json") == slurp(first_json));
  CHECK(slurp(tmp / "r.xml") == slurp(first_xml));
  CHECK(slurp(tmp / "r.html") == slurp(first_html));

  // A real JUnit consumer (Python's XML parser, junitparser when installed) accepts the file.
  if (std::system("python3 -c 'import xml.etree.ElementTree' >/dev/null 2>&1") == 0) {
    std::string cmd = "python3 '" + (test::source_dir() / "tests" / "validate" / "junit_check.py").string() + "' '" +
                      (tmp / "r.xml").string() + "' --expect-failures 2";
    CHECK(std::system(cmd.c_str()) == 0);
  }

  // Loose thresholds pass the same candidate.
  auto loose = test::run_mpq({"validate", "--reference", model().string(), "--candidate", cand.string(), "--data",
                              data().string(), "--min-cosine", "0.5", "--min-snr-db", "0"});
  INFO(info(loose));
  CHECK(loose.exit_code == 0);
}

TEST_CASE("validate: an INT8 model from mpq quantize, thresholds from a file, both ways", "[validate][cli]") {
  test::TempDir tmp;
  fs::path q = tmp / "int8.onnx";
  auto qr = test::run_mpq({"quantize", model().string(), "--data", data().string(), "-o", q.string()});
  INFO(info(qr));
  REQUIRE(qr.exit_code == 0);
  write_text(tmp / "loose.json", R"({"description": "test", "min_cosine": 0.5, "outputs": {"output": {"min_snr_db": 1}}})");
  write_text(tmp / "strict.json", R"({"min_cosine": 0.999999, "min_snr_db": 80})");
  auto pass = test::run_mpq({"validate", "--reference", model().string(), "--candidate", q.string(), "--data", data().string(),
                             "--thresholds", (tmp / "loose.json").string(), "--per-layer", "--json"});
  INFO(info(pass));
  CHECK(pass.exit_code == 0);
  auto j = nlohmann::json::parse(pass.out);  // --json: the report on stdout, nothing else
  CHECK(j["passed"] == true);
  CHECK(j["thresholds"]["source"] == (tmp / "loose.json").string());
  CHECK(j["checks"].size() == 2);
  // Per-layer matching works through the inserted QuantizeLinear/DequantizeLinear nodes and the
  // BatchNormalization folded into the convolutions.
  CHECK(j["per_layer"]["compared"].get<int>() >= 15);
  CHECK(j["per_layer"]["first_jump"].is_object());
  auto fail = test::run_mpq({"validate", "--reference", model().string(), "--candidate", q.string(), "--data", data().string(),
                             "--thresholds", (tmp / "strict.json").string()});
  INFO(info(fail));
  CHECK(fail.exit_code == 1);
  CHECK_THAT(fail.out, Catch::Contains("FAIL output: cosine"));
  CHECK_THAT(fail.out, Catch::Contains("FAIL output: snr_db"));
  // A flag overrides the file.
  auto over = test::run_mpq({"validate", "--reference", model().string(), "--candidate", q.string(), "--data", data().string(),
                             "--thresholds", (tmp / "strict.json").string(), "--min-cosine", "0.5", "--min-snr-db", "1"});
  CHECK(over.exit_code == 0);
}

TEST_CASE("validate: labels give accuracy and the drop", "[validate][cli]") {
  test::TempDir tmp;
  fs::path cand = perturbed_model(tmp, 0.3f);
  // Arbitrary labels: what matters is that both accuracies and their difference are reported.
  write_text(tmp / "labels.txt", "0\n1\n2\n3\n4\n");
  auto r = test::run_mpq({"validate", "--reference", model().string(), "--candidate", cand.string(), "--data", data().string(),
                          "--labels", (tmp / "labels.txt").string(), "--max-top1-drop", "1", "--min-accuracy", "0", "--json"});
  INFO(info(r));
  CHECK(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["accuracy"].is_object());
  CHECK(j["accuracy"]["samples"] == 5);
  CHECK(j["accuracy"]["output"] == "output");
  const double ra = j["accuracy"]["reference"], ca = j["accuracy"]["candidate"], drop = j["accuracy"]["drop"];
  CHECK(drop == Approx(ra - ca));
  CHECK(j["checks"][0]["metric"] == "accuracy_drop");
  // Too few labels: bad input.
  write_text(tmp / "short.txt", "0\n1\n");
  auto bad = test::run_mpq({"validate", "--reference", model().string(), "--candidate", cand.string(), "--data", data().string(),
                            "--labels", (tmp / "short.txt").string()});
  INFO(info(bad));
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("2 labels for 5 data rows"));
}

TEST_CASE("validate: bad input exits 2 before any work", "[validate][cli]") {
  test::TempDir tmp;
  const std::string ref = model().string(), d = data().string();
  auto expect2 = [](const test::CommandResult& r, const std::string& needle) {
    INFO(info(r));
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(needle));
    CHECK(r.out.empty());
  };
  expect2(test::run_mpq({"validate", "--reference", ref, "--candidate", (tmp / "none.onnx").string(), "--data", d}),
          "file not found");
  expect2(test::run_mpq({"validate", "--reference", ref, "--candidate", ref, "--data", (tmp / "nodata").string()}), "not a folder");
  // A candidate without the reference's output.
  expect2(test::run_mpq({"validate", "--reference", ref, "--candidate",
                         (test::testdata_dir() / "node" / "test_relu" / "model.onnx").string(), "--data", d}),
          "the candidate has no output 'output'");
  // A candidate whose output has another shape (detected on the first feed).
  expect2(test::run_mpq({"validate", "--reference", ref, "--candidate",
                         (test::source_dir() / "tests" / "models" / "unet_op13.onnx").string(), "--data", d}),
          "reference shape [1,10] but candidate shape [1,2,32,32]");
  // Data that does not fit the model.
  expect2(test::run_mpq({"validate", "--reference", ref, "--candidate", ref, "--data",
                         (test::source_dir() / "tests" / "models" / "transformer_op13_data").string()}),
          "input");
  write_text(tmp / "typo.json", R"({"min_cosin": 0.99})");
  expect2(test::run_mpq({"validate", "--reference", ref, "--candidate", ref, "--data", d, "--thresholds", (tmp / "typo.json").string()}),
          "unknown threshold 'min_cosin'");
  write_text(tmp / "other.json", R"({"outputs": {"probabilities": {"min_cosine": 0.99}}})");
  expect2(test::run_mpq({"validate", "--reference", ref, "--candidate", ref, "--data", d, "--thresholds", (tmp / "other.json").string()}),
          "'probabilities'");
  expect2(test::run_mpq({"validate", "--reference", ref, "--candidate", ref, "--data", d, "--report", (tmp / "r.txt").string()}),
          ".json, .xml (JUnit) or .html");
  expect2(test::run_mpq({"validate", "--reference", ref, "--candidate", ref, "--data", d, "--thresholds", (tmp / "missing.json").string()}),
          "not found");
  expect2(test::run_mpq({"validate", "--reference", ref, "--candidate", ref, "--data", d, "--report",
                         (tmp / "no-such-folder" / "r.json").string()}),
          "does not exist");
  CHECK_FALSE(fs::exists(tmp / "no-such-folder"));
  // An accuracy gate on data without labels cannot be evaluated (it must not pass on the rest).
  expect2(test::run_mpq({"validate", "--reference", ref, "--candidate", ref, "--data", d, "--min-cosine", "0.5", "--min-accuracy", "0.5"}),
          "min_accuracy needs labels");
  // Missing required flags: usage error, exit 2.
  auto usage = test::run_mpq({"validate", "--reference", ref});
  CHECK(usage.exit_code == 2);
}

TEST_CASE("validate --help explains exit codes with an example", "[validate][cli]") {
  auto r = test::run_mpq({"validate", "--help"});
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("--per-layer"));
  CHECK_THAT(r.out, Catch::Contains("--thresholds"));
  CHECK_THAT(r.out, Catch::Contains("Exit status: 0"));
  CHECK_THAT(r.out, Catch::Contains("Example: mpq validate"));
}
