// Reports: the JSON schema documented in docs/validate.md, well-formed JUnit XML (checked with a
// small strict XML parser written here), a self-contained HTML page with its SVG charts, and
// byte-identical output for identical runs.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <random>

#include "test_util.h"
#include "validate/report.h"
#include "validate/report_html.h"
#include "validate/report_json.h"
#include "validate/report_junit.h"

using namespace mpq;
using namespace mpq::validate;

namespace {

// ---- a strict, minimal XML 1.0 parser (elements, attributes, text, entities, prolog, comments)
struct XmlNode {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::vector<std::unique_ptr<XmlNode>> children;
  std::string text;
  std::vector<const XmlNode*> all(const std::string& n) const {
    std::vector<const XmlNode*> out;
    for (const auto& c : children)
      if (c->name == n) out.push_back(c.get());
    return out;
  }
};

class XmlParser {
 public:
  explicit XmlParser(const std::string& s) : s_(s) {}
  std::unique_ptr<XmlNode> parse_document() {
    if (s_.compare(0, 5, "<?xml") == 0) {
      size_t e = s_.find("?>");
      if (e == std::string::npos) throw std::runtime_error("unterminated prolog");
      i_ = e + 2;
    }
    skip_misc();
    auto root = parse_element();
    skip_misc();
    if (i_ != s_.size()) throw std::runtime_error("content after the root element at " + std::to_string(i_));
    return root;
  }

 private:
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  void skip_misc() {
    for (;;) {
      skip_ws();
      if (s_.compare(i_, 4, "<!--") == 0) {
        size_t e = s_.find("-->", i_);
        if (e == std::string::npos) throw std::runtime_error("unterminated comment");
        i_ = e + 3;
      } else {
        return;
      }
    }
  }
  static bool name_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == ':';
  }
  std::string parse_name() {
    size_t b = i_;
    if (i_ >= s_.size() || !(std::isalpha(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_'))
      throw std::runtime_error("bad name at " + std::to_string(i_));
    while (i_ < s_.size() && name_char(s_[i_])) ++i_;
    return s_.substr(b, i_ - b);
  }
  std::string decode(const std::string& raw) {
    std::string out;
    for (size_t k = 0; k < raw.size(); ++k) {
      const unsigned char c = static_cast<unsigned char>(raw[k]);
      if (c == '<') throw std::runtime_error("'<' in text or attribute");
      if (c < 0x20 && c != '\n' && c != '\t' && c != '\r') throw std::runtime_error("control character");
      if (c != '&') {
        out += raw[k];
        continue;
      }
      size_t e = raw.find(';', k);
      if (e == std::string::npos) throw std::runtime_error("unterminated entity");
      std::string ent = raw.substr(k + 1, e - k - 1);
      if (ent == "amp") out += '&';
      else if (ent == "lt") out += '<';
      else if (ent == "gt") out += '>';
      else if (ent == "quot") out += '"';
      else if (ent == "apos") out += '\'';
      else if (ent.size() > 1 && ent[0] == '#' && std::all_of(ent.begin() + 1, ent.end(), ::isdigit)) out += static_cast<char>(std::stoi(ent.substr(1)));
      else throw std::runtime_error("unknown entity &" + ent + ";");
      k = e;
    }
    return out;
  }
  std::unique_ptr<XmlNode> parse_element() {
    if (i_ >= s_.size() || s_[i_] != '<') throw std::runtime_error("expected '<' at " + std::to_string(i_));
    ++i_;
    auto node = std::make_unique<XmlNode>();
    node->name = parse_name();
    for (;;) {
      skip_ws();
      if (s_.compare(i_, 2, "/>") == 0) {
        i_ += 2;
        return node;
      }
      if (i_ < s_.size() && s_[i_] == '>') {
        ++i_;
        break;
      }
      std::string an = parse_name();
      skip_ws();
      if (s_[i_] != '=') throw std::runtime_error("expected '=' after attribute " + an);
      ++i_;
      skip_ws();
      const char q = s_[i_];
      if (q != '"' && q != '\'') throw std::runtime_error("unquoted attribute " + an);
      size_t e = s_.find(q, i_ + 1);
      if (e == std::string::npos) throw std::runtime_error("unterminated attribute " + an);
      if (node->attrs.count(an)) throw std::runtime_error("duplicate attribute " + an);
      node->attrs[an] = decode(s_.substr(i_ + 1, e - i_ - 1));
      i_ = e + 1;
    }
    for (;;) {
      size_t lt = s_.find('<', i_);
      if (lt == std::string::npos) throw std::runtime_error("unterminated element " + node->name);
      node->text += decode(s_.substr(i_, lt - i_));
      i_ = lt;
      if (s_.compare(i_, 4, "<!--") == 0) {
        skip_misc();
        continue;
      }
      if (s_.compare(i_, 2, "</") == 0) {
        i_ += 2;
        std::string end = parse_name();
        if (end != node->name) throw std::runtime_error("</" + end + "> closes <" + node->name + ">");
        skip_ws();
        if (s_[i_] != '>') throw std::runtime_error("bad end tag");
        ++i_;
        return node;
      }
      node->children.push_back(parse_element());
    }
  }
  const std::string& s_;
  size_t i_ = 0;
};

std::unique_ptr<XmlNode> parse_xml(const std::string& s) { return XmlParser(s).parse_document(); }

ValidateReport sample_report(bool per_layer) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> ref(40), cand(40);
  for (size_t i = 0; i < ref.size(); ++i) {
    ref[i] = d(rng);
    cand[i] = ref[i] + 0.2f * d(rng);
  }
  ValidateReport rep;
  rep.reference = "models/ref <fp32>.onnx";  // characters that need escaping
  rep.candidate = "models/cand & \"int8\".onnx";
  rep.data = "data";
  rep.mpq_version = "0.1.0";
  CompareResult& r = rep.result;
  r.rows = 10;
  r.feeds = 2;
  r.runs = 2;
  r.have_labels = true;
  OutputResult o;
  o.name = "logits";
  o.shape = {5, 4};
  o.ref_dtype = o.cand_dtype = DType::Float32;
  o.stats.add_rows(ref.data(), cand.data(), 40, 10);
  ClassLayout l{10, 4, 1};
  Top1Stats t;
  auto rc = argmax_classes(ref.data(), l), cc = argmax_classes(cand.data(), l);
  t.add_labels(rc, cc, rc);
  o.top1 = t;
  o.labelled = true;
  r.outputs.push_back(o);
  OutputResult exact;
  exact.name = "aux";
  exact.shape = {5};
  exact.stats.add(ref.data(), ref.data(), 5);  // identical: SNR +inf
  r.outputs.push_back(exact);
  if (per_layer) {
    PerLayerResult pl;
    const char* names[] = {"conv1_out", "relu1_out", "conv2_out", "logits"};
    const double snr[] = {40.0, 41.0, 12.0, 11.5};
    const double up[] = {std::numeric_limits<double>::infinity(), 40.0, 41.0, 12.0};
    for (int i = 0; i < 4; ++i) {
      LayerResult lr;
      lr.name = names[i];
      lr.cand_name = names[i];
      lr.node = std::string("node_") + names[i];
      lr.op_type = i % 2 ? "Relu" : "Conv";
      lr.order = i + 1;
      lr.stats.add(ref.data(), cand.data(), 10);
      lr.snr_db = snr[i];
      lr.upstream_snr_db = up[i];
      lr.drop_db = up[i] - snr[i];
      lr.local_snr_db = snr[i] + 0.5;
      pl.layers.push_back(lr);
    }
    pl.ranking = {2, 3, 0, 1};
    pl.first_jump = 2;
    pl.unmatched = {"bn_out"};
    r.per_layer = pl;
  }
  rep.thresholds = parse_thresholds(R"({"min_cosine": 0.999, "min_snr_db": 10, "min_top1_agreement": 0.5,
                                        "outputs": {"aux": {"max_abs_error": 0.0}}})",
                                    "ci/thresholds <x>.json");
  rep.checks = evaluate_checks(r, rep.thresholds);
  return rep;
}

}  // namespace

TEST_CASE("the XML checker itself rejects broken XML", "[validate][report]") {
  CHECK_NOTHROW(parse_xml("<?xml version=\"1.0\"?>\n<a x=\"1\"><b/>t&amp;t</a>\n"));
  CHECK_THROWS(parse_xml("<a><b></a></b>"));
  CHECK_THROWS(parse_xml("<a x=1/>"));
  CHECK_THROWS(parse_xml("<a>&nbsp;</a>"));
  CHECK_THROWS(parse_xml("<a>x < y</a>"));
  CHECK_THROWS(parse_xml("<a/><b/>"));
  CHECK_THROWS(parse_xml("<a x=\"1\" x=\"2\"/>"));
}

TEST_CASE("xml_escape", "[validate][report]") {
  CHECK(xml_escape("a<b>&\"c'") == "a&lt;b&gt;&amp;&quot;c&apos;");
  CHECK(xml_escape(std::string("x\x01y")) == "x?y");
  CHECK(xml_escape("caf\xc3\xa9") == "caf\xc3\xa9");    // valid UTF-8 kept
  CHECK(xml_escape("bad\xff\xfe") == "bad??");          // invalid bytes replaced
  CHECK(xml_escape("\xed\xa0\x80") == "???");           // UTF-16 surrogate encoded in UTF-8
}

TEST_CASE("JUnit report is well-formed and has one testcase per check", "[validate][report]") {
  ValidateReport rep = sample_report(true);
  REQUIRE(rep.failed_checks() > 0);
  std::string xml = report_to_junit(rep);
  std::unique_ptr<XmlNode> root;
  REQUIRE_NOTHROW(root = parse_xml(xml));
  CHECK(root->name == "testsuites");
  auto suites = root->all("testsuite");
  REQUIRE(suites.size() == 1);
  const XmlNode& suite = *suites[0];
  auto cases = suite.all("testcase");
  CHECK(cases.size() == rep.checks.size());
  CHECK(suite.attrs.at("tests") == std::to_string(rep.checks.size()));
  CHECK(suite.attrs.at("failures") == std::to_string(rep.failed_checks()));
  CHECK(suite.attrs.at("skipped") == std::to_string(rep.skipped_checks()));
  int failures = 0;
  for (const XmlNode* c : cases) {
    CHECK(c->attrs.count("classname"));
    CHECK(c->attrs.count("name"));
    for (const XmlNode* f : c->all("failure")) {
      ++failures;
      CHECK_FALSE(f->attrs.at("message").empty());
    }
  }
  CHECK(failures == rep.failed_checks());
  // Escaped names come back intact.
  CHECK_THAT(suite.attrs.at("name"), Catch::Contains("cand & \"int8\""));
  REQUIRE(suite.all("system-out").size() == 1);
  CHECK_THAT(suite.all("system-out")[0]->text, Catch::Contains("error first jumps at: conv2_out"));

  // With no thresholds there is still one (passing) testcase.
  ValidateReport none = sample_report(false);
  none.checks.clear();
  none.thresholds = Thresholds{};
  auto r2 = parse_xml(report_to_junit(none));
  REQUIRE(r2->all("testsuite").size() == 1);
  CHECK(r2->all("testsuite")[0]->all("testcase").size() == 1);
}

TEST_CASE("JSON report follows the documented schema", "[validate][report]") {
  ValidateReport rep = sample_report(true);
  nlohmann::json j = report_to_json(rep);
  CHECK(j["schema"] == "mpq-validate-report");
  CHECK(j["schema_version"] == 1);
  for (const char* k : {"mpq_version", "passed", "reference", "candidate", "data", "labels", "device", "samples", "feeds", "runs",
                        "thresholds", "outputs", "accuracy", "checks", "summary", "per_layer"})
    CHECK(j.contains(k));
  CHECK(j["passed"].is_boolean());
  CHECK(j["passed"] == rep.passed());
  CHECK(j["samples"] == 10);
  REQUIRE(j["outputs"].size() == 2);
  const auto& o = j["outputs"][0];
  for (const char* k : {"name", "shape", "reference_dtype", "candidate_dtype", "elements", "nonfinite", "cosine", "rel_l2", "snr_db",
                        "max_abs_error", "mean_abs_error", "min_row_cosine", "top1", "labelled"})
    CHECK(o.contains(k));
  CHECK(o["cosine"].is_number());
  CHECK(o["top1"]["agreement"].is_number());
  // An identical output has infinite SNR, written as the string "inf".
  CHECK(j["outputs"][1]["snr_db"] == "inf");
  CHECK(j["outputs"][1]["top1"].is_null());
  CHECK(j["accuracy"]["output"] == "logits");
  CHECK(j["accuracy"]["drop"].is_number());
  REQUIRE(j["checks"].size() == rep.checks.size());
  for (const auto& c : j["checks"]) {
    for (const char* k : {"id", "output", "threshold_key", "metric", "comparison", "threshold", "value", "status", "message"})
      CHECK(c.contains(k));
    CHECK((c["status"] == "pass" || c["status"] == "fail" || c["status"] == "skip"));
  }
  CHECK(j["summary"]["failed"] == rep.failed_checks());
  CHECK(j["thresholds"]["all"]["min_cosine"] == 0.999);
  CHECK(j["thresholds"]["outputs"]["aux"]["max_abs_error"] == 0.0);
  const auto& pl = j["per_layer"];
  CHECK(pl["first_jump"]["name"] == "conv2_out");
  CHECK(pl["first_jump"]["rank"] == 1);
  CHECK(pl["ranking"][0] == "conv2_out");
  REQUIRE(pl["layers"].size() == 4);
  CHECK(pl["layers"][0]["upstream_snr_db"] == "inf");
  for (const char* k : {"rank", "order", "name", "candidate_name", "node", "op_type", "snr_db", "upstream_snr_db", "drop_db",
                        "local_snr_db", "cosine", "rel_l2", "max_abs_error", "elements"})
    CHECK(pl["layers"][0].contains(k));
  CHECK(pl["unmatched"][0] == "bn_out");
  // Without per-layer data the key is null.
  CHECK(report_to_json(sample_report(false))["per_layer"].is_null());
}

TEST_CASE("every field the JSON report writes is documented in docs/validate.md", "[validate][report]") {
  std::ifstream in(test::source_dir() / "docs" / "validate.md", std::ios::binary);
  REQUIRE(in);
  const std::string doc((std::istreambuf_iterator<char>(in)), {});
  auto documented = [&](const nlohmann::json& obj, const std::string& where) {
    REQUIRE(obj.is_object());
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      INFO(where << "." << it.key());
      CHECK(doc.find("`" + it.key() + "`") != std::string::npos);
    }
  };
  nlohmann::json j = report_to_json(sample_report(true));
  documented(j, "report");
  documented(j["thresholds"], "thresholds");
  documented(j["outputs"][0], "output");
  documented(j["outputs"][0]["top1"], "output.top1");
  documented(j["accuracy"], "accuracy");
  documented(j["checks"][0], "check");
  documented(j["summary"], "summary");
  documented(j["per_layer"], "per_layer");
  documented(j["per_layer"]["layers"][0], "layer");
}

TEST_CASE("HTML report is self-contained and holds the SVG charts", "[validate][report]") {
  ValidateReport rep = sample_report(true);
  std::string html = report_to_html(rep);
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK_THAT(html, Catch::Contains("</html>"));
  CHECK_THAT(html, Catch::Contains("FAILED"));
  CHECK_THAT(html, Catch::Contains("aria-label=\"SNR per output\""));
  CHECK_THAT(html, Catch::Contains("aria-label=\"SNR per layer\""));
  CHECK_THAT(html, Catch::Contains("first jump: conv2_out"));
  CHECK_THAT(html, Catch::Contains("cand &amp; &quot;int8&quot;.onnx"));
  // No scripts and no external assets: the only URL is the SVG namespace.
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("src=") == std::string::npos);
  CHECK(html.find("href=") == std::string::npos);
  CHECK(html.find("@import") == std::string::npos);
  CHECK(html.find("url(") == std::string::npos);
  size_t pos = 0;
  int urls = 0;
  while ((pos = html.find("http", pos)) != std::string::npos) {
    CHECK(html.compare(pos, 26, "http://www.w3.org/2000/svg") == 0);
    ++urls;
    pos += 4;
  }
  CHECK(urls == 2);
  // Every SVG is well-formed XML on its own.
  int svgs = 0;
  for (size_t b = html.find("<svg"); b != std::string::npos; b = html.find("<svg", b + 1)) {
    size_t e = html.find("</svg>", b);
    REQUIRE(e != std::string::npos);
    std::string svg = html.substr(b, e + 6 - b);
    INFO(svg.substr(0, 200));
    CHECK_NOTHROW(parse_xml(svg));
    ++svgs;
  }
  CHECK(svgs == 2);
  // Without per-layer data: one chart.
  std::string small = report_to_html(sample_report(false));
  CHECK(small.find("SNR per layer") == std::string::npos);
  CHECK_THAT(small, Catch::Contains("<svg"));
}

TEST_CASE("reports are deterministic and chosen by extension", "[validate][report]") {
  test::TempDir tmp;
  ValidateReport rep = sample_report(true);
  for (const char* name : {"r.json", "r.xml", "r.html"}) {
    write_report(rep, tmp / name);
    std::string first = render_report(rep, report_format_for(tmp / name));
    std::ifstream in(tmp / name, std::ios::binary);
    std::string on_disk((std::istreambuf_iterator<char>(in)), {});
    CHECK(on_disk == first);
    CHECK(render_report(sample_report(true), report_format_for(tmp / name)) == first);
  }
  CHECK(report_format_for("x.HTM") == ReportFormat::Html);
  CHECK_THROWS_WITH(report_format_for("x.txt"), Catch::Contains(".json, .xml (JUnit) or .html"));
  CHECK_THROWS_AS(write_report(rep, tmp / "missing-dir" / "r.json"), Error);
}
