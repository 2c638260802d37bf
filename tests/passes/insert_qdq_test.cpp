// QDQ insertion: placement conventions, weight/bias encodings, protected patterns, shared scales,
// exclusions, opset upgrade, and `mpq quantize` end to end.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <set>

#include "calib/calibrator.h"
#include "calib/quant_ref.h"
#include "ir/dump.h"
#include "ir/onnx_io.h"
#include "ir/verify.h"
#include "passes/fuse_conv_bn.h"
#include "passes/insert_qdq.h"
#include "passes/patterns.h"
#include "passes/to_qoperator.h"
#include "passes/upgrade_opset.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;
namespace fs = std::filesystem;

namespace {

fs::path model_path(const std::string& stem) { return test::source_dir() / "tests/models" / (stem + ".onnx"); }
fs::path data_path(const std::string& stem) { return test::source_dir() / "tests/models" / (stem + "_data"); }

calib::CalibrationTable calibrate(const Model& m, const std::string& stem) {
  data::FeedSource feeds = data::FeedSource::open(data_path(stem), m);
  calib::CalibOptions o;
  o.method = calib::RangeMethod::MinMax;
  return calib::calibrate(m, feeds, o);
}

const Node* producer_op(const Value* v, const std::string& op) {
  return v && v->producer() && v->producer()->op_type == op ? v->producer() : nullptr;
}

int count(const Model& m, const std::string& op) { return test::count_ops(m, op); }

double cosine(const Tensor& a, const Tensor& b) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    ab += a.get_double(i) * b.get_double(i);
    aa += a.get_double(i) * a.get_double(i);
    bb += b.get_double(i) * b.get_double(i);
  }
  return ab / std::sqrt(aa * bb);
}

std::vector<Tensor> run_first_feed(const Model& m, const std::string& stem) {
  data::FeedSource feeds = data::FeedSource::open(data_path(stem), m);
  rt::Executor exec(m);
  return exec.run(feeds.get(2).tensors);
}

}  // namespace

TEST_CASE("quantize_weight: per-channel int8 symmetric, within half a step", "[qdq][weights]") {
  Tensor w = test::random_tensor({4, 3, 3, 3}, 1, -2.0f, 2.0f);
  w.data<float>()[5] = 7.0f;  // channel 0 gets a large value
  passes::QuantizedWeight q = passes::quantize_weight(w, 0);
  REQUIRE(q.scale_list.size() == 4);
  CHECK(q.scale_list[0] == Approx(7.0f / 127));
  for (int64_t i = 0; i < w.numel(); ++i) {
    int8_t v = q.values.data<int8_t>()[i];
    CHECK(v >= -127);
    float s = q.scale_list[static_cast<size_t>(i / 27)];
    CHECK(std::fabs(v * s - w.data<float>()[i]) <= s / 2 + 1e-7f);
  }
  passes::QuantizedWeight t = passes::quantize_weight(w, -1);
  CHECK(t.scales.rank() == 0);
  // Axis 1 (ConvTranspose layout).
  passes::QuantizedWeight c1 = passes::quantize_weight(test::random_tensor({2, 5, 3, 3}, 2), 1);
  CHECK(c1.scales.shape() == Shape{5});
}

TEST_CASE("insert_qdq on a ResNet: inputs of every Conv/Gemm, int8 weights, int32 bias, output quantized", "[qdq]") {
  Model m = load_model(model_path("resnet_bn_op13"));
  passes::FuseConvBn fuse;
  passes::run_pass(fuse, m);
  calib::CalibrationTable table = calibrate(m, "resnet_bn_op13");
  auto fp32 = run_first_feed(m, "resnet_bn_op13");
  passes::QdqOptions o;
  passes::QdqReport rep = passes::insert_qdq(m, table, o);
  REQUIRE(verify(m).empty());
  CHECK(m.opset() >= 13);
  CHECK(rep.per_channel);
  int anchors = 0;
  for (const auto& np : m.graph->nodes()) {
    const Node& n = *np;
    if (n.op_type != "Conv" && n.op_type != "Gemm") continue;
    ++anchors;
    INFO(n.label());
    CHECK(producer_op(n.input(0), "DequantizeLinear"));
    const Node* wdq = producer_op(n.input(1), "DequantizeLinear");
    REQUIRE(wdq);
    CHECK(wdq->input(0)->initializer().dtype() == DType::Int8);
    CHECK(wdq->has_attr("axis"));
    if (n.input(2)) {
      const Node* bdq = producer_op(n.input(2), "DequantizeLinear");
      REQUIRE(bdq);
      CHECK(bdq->input(0)->initializer().dtype() == DType::Int32);
      // Bias scale = input scale x weight scale.
      const Node* xdq = n.input(0)->producer();
      float xs = xdq->input(1)->initializer().data<float>()[0];
      float ws0 = wdq->input(1)->initializer().data<float>()[0];
      CHECK(bdq->input(1)->initializer().data<float>()[0] == xs * ws0);
    }
  }
  CHECK(anchors == rep.quantized["Conv"] + rep.quantized["Gemm"]);
  // The logits come out of a DequantizeLinear and keep their name.
  Value* out = m.graph->outputs()[0];
  CHECK(producer_op(out, "DequantizeLinear"));
  CHECK(out->name() == "output");
  // One Q/DQ pair per tensor: no tensor is quantized twice.
  std::set<const Value*> quantized;
  for (const auto& np : m.graph->nodes())
    if (np->op_type == "QuantizeLinear") CHECK(quantized.insert(np->input(0)).second);
  auto int8 = run_first_feed(m, "resnet_bn_op13");
  CHECK(cosine(int8[0], fp32[0]) > 0.99);
}

TEST_CASE("insert_qdq never cuts into LayerNorm, GELU or Softmax patterns", "[qdq][patterns]") {
  Model m = load_model(model_path("transformer_op13"));
  auto patterns = passes::find_fragile_patterns(*m.graph);
  int ln = 0, gelu = 0, softmax = 0;
  for (const auto& p : patterns) {
    ln += p.kind == passes::PatternKind::LayerNorm;
    gelu += p.kind == passes::PatternKind::Gelu;
    softmax += p.kind == passes::PatternKind::Softmax;
  }
  CHECK(ln >= 4);  // two layers, two norms each, written out at opset 13
  CHECK(gelu >= 2);
  CHECK(softmax >= 2);
  std::set<std::string> pattern_nodes;
  for (const auto& p : patterns)
    for (const Node* n : p.nodes) pattern_nodes.insert(n->name);
  calib::CalibrationTable table = calibrate(m, "transformer_op13");
  auto fp32 = run_first_feed(m, "transformer_op13");
  passes::QdqReport rep = passes::insert_qdq(m, table, passes::QdqOptions{});
  REQUIRE(verify(m).empty());
  CHECK(rep.quantized["MatMul"] > 0);
  bool attention_skipped = false;
  for (const auto& [node, why] : rep.skipped)
    if (why.find("attention") != std::string::npos) attention_skipped = true;
  CHECK(attention_skipped);
  for (const auto& np : m.graph->nodes()) {
    if (!pattern_nodes.count(np->name)) continue;
    for (const Value* in : np->inputs()) {
      INFO(np->label() << " reads " << (in ? in->name() : "-"));
      CHECK_FALSE(producer_op(in, "DequantizeLinear"));
    }
    for (const Value* out : np->outputs())
      for (const Use& u : out->uses()) {
        INFO(np->label() << " feeds " << u.node->label());
        if (pattern_nodes.count(u.node->name)) CHECK(u.node->op_type != "QuantizeLinear");
      }
  }
  auto int8 = run_first_feed(m, "transformer_op13");
  CHECK(cosine(int8[0], fp32[0]) > 0.99);
}

TEST_CASE("Concat inputs share the output's scale; exclusions keep nodes in float", "[qdq]") {
  Model m = load_model(model_path("unet_op17"));
  calib::CalibrationTable table = calibrate(m, "unet_op17");
  std::string excluded;
  for (const auto& np : m.graph->nodes())
    if (np->op_type == "Conv") excluded = np->name;  // the last conv
  passes::QdqOptions o;
  o.exclude_nodes = {excluded};
  passes::QdqReport rep = passes::insert_qdq(m, table, o);
  REQUIRE(verify(m).empty());
  int concats = 0;
  for (const auto& np : m.graph->nodes()) {
    if (np->op_type == "Concat") {
      std::set<float> scales;
      for (const Value* in : np->inputs()) {
        const Node* dq = producer_op(in, "DequantizeLinear");
        if (dq) scales.insert(dq->input(1)->initializer().data<float>()[0]);
      }
      if (!scales.empty()) {
        ++concats;
        CHECK(scales.size() == 1);
      }
    }
    if (np->name == excluded) CHECK_FALSE(producer_op(np->input(0), "DequantizeLinear"));
  }
  CHECK(concats >= 1);
  bool listed = false;
  for (const auto& [node, why] : rep.skipped) listed = listed || why.find("exclude") != std::string::npos;
  CHECK(listed);
}

TEST_CASE("per-tensor weights and uint8 activations", "[qdq]") {
  Model m = load_model(model_path("mobilenetv3_op13"));
  calib::CalibrationTable table = calibrate(m, "mobilenetv3_op13");
  passes::QdqOptions o;
  o.per_channel = false;
  o.activation_type = "uint8";
  passes::insert_qdq(m, table, o);
  REQUIRE(verify(m).empty());
  int int32_biases = 0;
  for (const auto& np : m.graph->nodes()) {
    if (np->op_type != "DequantizeLinear") continue;
    const Tensor& scale = np->input(1)->initializer();
    const Tensor& q = np->input(0)->has_initializer() ? np->input(0)->initializer() : Tensor();
    if (q.defined() && q.dtype() == DType::Int8) CHECK(scale.rank() == 0);
    if (q.defined() && q.dtype() == DType::Int32) {
      ++int32_biases;
      CHECK(scale.rank() == 0);  // one weight scale, so one bias scale
      CHECK_FALSE(np->has_attr("axis"));
    }
    if (!np->input(0)->has_initializer()) CHECK(np->input(2)->initializer().dtype() == DType::UInt8);
  }
  CHECK(int32_biases > 0);
}

TEST_CASE("QOperator conversion gives QLinearConv/QLinearMatMul that run", "[qdq][qoperator]") {
  Model m = load_model(model_path("resnet_bn_op13"));
  passes::FuseConvBn fuse;
  passes::run_pass(fuse, m);
  calib::CalibrationTable table = calibrate(m, "resnet_bn_op13");
  auto fp32 = run_first_feed(m, "resnet_bn_op13");
  passes::QdqOptions o;
  passes::insert_qdq(m, table, o);
  int converted = passes::convert_to_qoperator(m, table, o);
  REQUIRE(verify(m).empty());
  CHECK(converted == count(m, "QLinearConv"));
  CHECK(count(m, "Conv") == 0);
  auto out = run_first_feed(m, "resnet_bn_op13");
  CHECK(cosine(out[0], fp32[0]) > 0.98);
}

TEST_CASE("upgrade_opset moves attributes to inputs and keeps results", "[qdq][opset]") {
  Model m;
  m.set_opset("", 11);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2, 1, 5}));
  g.add_input(x);
  Value* s = g.add_value("s", ValueType::tensor(DType::Float32, Shape{2, 5}));
  g.add_node("Squeeze", {x}, {s}, "sq")->set_attr(Attribute::make_ints("axes", {1}));
  Value* y = g.add_value("y");
  g.add_node("Softmax", {s}, {y}, "sm")->set_attr(Attribute::make_int("axis", 1));
  Value* z = g.add_value("z");
  g.add_node("ReduceSum", {y}, {z}, "rs")->set_attr(Attribute::make_ints("axes", {1}));
  g.add_output(z);
  Value* yy = g.add_value("yy");
  g.add_node("Identity", {y}, {yy}, "id");
  g.add_output(yy);
  rt::Feeds feeds{{"x", test::random_tensor({2, 1, 5}, 3)}};
  std::vector<Tensor> before;
  {
    rt::Executor e(m);
    before = e.run(feeds);
  }
  std::string why;
  REQUIRE(passes::upgrade_opset(m, 13, &why));
  CHECK(m.opset() == 13);
  CHECK(verify(m).empty());
  CHECK_FALSE(m.graph->nodes()[0]->has_attr("axes"));
  rt::Executor e(m);
  auto after = e.run(feeds);
  CHECK(test::max_abs_diff(after[0], before[0]) < 1e-6);
  CHECK(test::max_abs_diff(after[1], before[1]) < 1e-6);

  // A flattened-block Softmax cannot be raised: the model is left untouched.
  Model f;
  f.set_opset("", 11);
  Value* a = f.graph->add_value("a", ValueType::tensor(DType::Float32, Shape{2, 3, 4}));
  f.graph->add_input(a);
  Value* b = f.graph->add_value("b");
  f.graph->add_node("Softmax", {a}, {b}, "sm")->set_attr(Attribute::make_int("axis", 1));
  f.graph->add_output(b);
  std::string text = dump(f);
  CHECK_FALSE(passes::upgrade_opset(f, 13, &why));
  CHECK_THAT(why, Catch::Contains("flattened"));
  CHECK(dump(f) == text);
}

TEST_CASE("mpq quantize end to end: summary, provenance, determinism, size", "[qdq][cli]") {
  test::TempDir tmp;
  std::string model = model_path("resnet_bn_op13").string();
  std::string data = data_path("resnet_bn_op13").string();
  auto r = test::run_mpq({"quantize", model, "--data", data, "-o", (tmp / "a.onnx").string(), "--json"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["quantized"]["Conv"].get<int>() > 0);
  CHECK(j["fused_batchnorms"].get<int>() > 0);
  CHECK(j["size_after_bytes"].get<double>() <= 0.30 * j["size_before_bytes"].get<double>());
  auto again = test::run_mpq({"quantize", model, "--data", data, "-o", (tmp / "b.onnx").string()});
  REQUIRE(again.exit_code == 0);
  CHECK_THAT(again.out, Catch::Contains("quantized") && Catch::Contains("% of FP32"));
  Model a = load_model(tmp / "a.onnx");
  CHECK(a.get_metadata("mpq.quantization.calibration_method") == "entropy");
  CHECK(a.get_metadata("mpq.quantization.calibration_samples") == "5");
  CHECK_FALSE(a.get_metadata("mpq.version").empty());
  // Byte-identical apart from the recorded command line (which names the output file).
  Model b = load_model(tmp / "b.onnx");
  a.set_metadata("mpq.command", "");
  b.set_metadata("mpq.command", "");
  CHECK(serialize_model(a) == serialize_model(b));
  // Through a calibration table, and the QOperator format.
  REQUIRE(test::run_mpq({"calibrate", model, "--data", data, "-o", (tmp / "t.json").string()}).exit_code == 0);
  auto q = test::run_mpq({"quantize", model, "--calib", (tmp / "t.json").string(), "-o", (tmp / "q.onnx").string(), "--format", "qoperator"});
  INFO(q.err);
  CHECK(q.exit_code == 0);
  CHECK(count(load_model(tmp / "q.onnx"), "QLinearConv") > 0);
  // Bad usage.
  CHECK(test::run_mpq({"quantize", model, "-o", (tmp / "c.onnx").string()}).exit_code == 2);
  CHECK(test::run_mpq({"quantize", model, "--data", data, "-o", model}).exit_code == 2);
}

// "y_float" -> "y": the renamed float producer of a quantized graph output.
std::string float_source(const std::string& name) {
  const std::string suffix = "_float";
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0
             ? name.substr(0, name.size() - suffix.size())
             : std::string();
}

TEST_CASE("generated tensors get short names and int8 activations share one zero point", "[qdq][size]") {
  Model m = load_model(model_path("mobilenetv3_op13"));
  std::set<std::string> original;
  for (const Value* v : m.graph->values()) original.insert(v->name());
  calib::CalibrationTable table = calibrate(m, "mobilenetv3_op13");
  const size_t before = serialize_model(m).size();
  passes::QdqOptions o;
  passes::QdqReport rep = passes::insert_qdq(m, table, o);
  REQUIRE(verify(m).empty());
  REQUIRE(rep.activation_pairs > 0);
  std::set<const Value*> zero_points;
  for (const auto& np : m.graph->nodes()) {
    if (np->op_type == "QuantizeLinear") zero_points.insert(np->input(2));
    for (const Value* v : np->outputs())
      if (!original.count(v->name()) && !original.count(float_source(v->name()))) {
        INFO(v->name());
        CHECK(v->name().size() <= 8);
      }
  }
  CHECK(zero_points.size() == 1);
  // Each pair's Q input keeps the original tensor name (a quantized graph output's float producer
  // writes "<output>_float"), so the graph still says what each pair quantizes.
  for (const auto& np : m.graph->nodes())
    if (np->op_type == "QuantizeLinear") {
      const std::string& in = np->input(0)->name();
      CHECK((original.count(in) || original.count(float_source(in))));
    }
  // Names were a quarter of this file before; payload alone (int8 weights, per-channel scales,
  // int32 biases) is about 30% of FP32 for this net.
  CHECK(serialize_model(m).size() <= before * 40 / 100);
}
