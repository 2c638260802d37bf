// Dynamic quantization (per-token and per-tensor run-time ranges), int8 embedding tables, and the
// model-family guess behind `mpq quantize`'s defaults.
#include <catch2/catch.hpp>

#include <cmath>

#include "core/error.h"
#include "data/feeds.h"
#include "ir/onnx_io.h"
#include "ir/verify.h"
#include "passes/insert_qdq.h"
#include "passes/model_family.h"
#include "passes/pass.h"
#include "passes/quantize_dynamic.h"
#include "passes/quantize_embeddings.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;
namespace fs = std::filesystem;
using passes::DynamicQuantOptions;

namespace {

fs::path tiny_bert() { return test::source_dir() / "tests/models/tiny_bert.onnx"; }
fs::path tiny_bert_data() { return test::source_dir() / "tests/models/tiny_bert_data"; }

// Mean and lowest row cosine of `emb` outputs (output 0, [N, D]) over every feed.
std::pair<double, double> embedding_cosines(const Model& ref, const Model& cand, int threads = 0) {
  data::FeedSource feeds = data::FeedSource::open(tiny_bert_data(), ref);
  rt::ExecOptions eo;
  eo.threads = threads;
  rt::Executor re(ref, eo), ce(cand, eo);
  double sum = 0, lowest = 1;
  int64_t rows = 0;
  for (size_t f = 0; f < feeds.size(); ++f) {
    auto feed = feeds.get(f).tensors;
    Tensor a = re.run(feed).at(0), b = ce.run(feed).at(0);
    const int64_t n = a.dim(0), d = a.dim(1);
    for (int64_t r = 0; r < n; ++r) {
      double ab = 0, aa = 0, bb = 0;
      for (int64_t k = 0; k < d; ++k) {
        const double x = a.data<float>()[r * d + k], y = b.data<float>()[r * d + k];
        ab += x * y;
        aa += x * x;
        bb += y * y;
      }
      const double c = ab / std::sqrt(aa * bb);
      sum += c;
      lowest = std::min(lowest, c);
      ++rows;
    }
  }
  return {sum / static_cast<double>(rows), lowest};
}

int64_t float32_weight_values(const Model& m) {
  int64_t n = 0;
  for (const Value* v : m.graph->initializers())
    if (v->initializer().dtype() == DType::Float32 && v->initializer().numel() >= 4096) n += v->initializer().numel();
  return n;
}

// x [2, 3, 7] -> MatMul(W [7, 5]) -> y, and the same x through Gemm(transB, beta 0.5, C) on its
// first row block; opset 17.
Model small_dense_model() {
  Model m;
  m.set_opset("", 17);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2, 3, 7}));
  g.add_input(x);
  Value* x2 = g.add_value("x2", ValueType::tensor(DType::Float32, Shape{4, 7}));
  g.add_input(x2);
  Value* w = g.add_initializer("w", test::random_tensor({7, 5}, 11));
  Value* b = g.add_initializer("b", test::random_tensor({6, 7}, 12));  // Gemm B, transB: [N=6, K=7]
  Value* c = g.add_initializer("c", test::random_tensor({6}, 13));
  Value* y = g.add_value("y");
  Value* z = g.add_value("z");
  g.add_node("MatMul", {x, w}, {y}, "mm");
  Node* gemm = g.add_node("Gemm", {x2, b, c}, {z}, "gemm");
  gemm->set_attr(Attribute::make_int("transB", 1));
  gemm->set_attr(Attribute::make_float("beta", 0.5f));
  g.add_output(y);
  g.add_output(z);
  return m;
}

}  // namespace

TEST_CASE("dynamic per-token quantization of a trained encoder: structure, accuracy, names", "[dynamic][models]") {
  Model ref = load_model(tiny_bert());
  Model m = ref.clone();
  passes::DynamicQuantReport rep = passes::quantize_dynamic(m, {});
  REQUIRE(verify(m).empty());
  CHECK(rep.quantized["MatMul"] == 12);  // Q/K/V fused as one qkv Linear, proj, fc1, fc2 per layer
  CHECK(rep.quantized["Gemm"] == 1);     // the classification head
  CHECK(rep.weight_tensors == 13);
  CHECK(rep.embedding_tables == 2);      // word (1024 x 64) and position (64 x 64) embeddings
  CHECK(rep.skipped.size() == 6);        // the attention MatMuls (two activations)
  for (const auto& [node, why] : rep.skipped) CHECK_THAT(why, Catch::Contains("attention"));
  CHECK(test::count_ops(m, "MatMulInteger") == 13);
  CHECK(test::count_ops(m, "DynamicQuantizeLinear") == 0);
  CHECK(rep.activations == 13);
  CHECK(float32_weight_values(m) == 0);  // every large weight is 8-bit now
  CHECK(m.graph->outputs().size() == 2);
  CHECK(m.graph->outputs()[0]->name() == "embedding");
  auto [mean, lowest] = embedding_cosines(ref, m);
  INFO("mean " << mean << " lowest " << lowest);
  CHECK(mean >= 0.998);
  CHECK(lowest >= 0.99);
  // The same at one and at two threads: inference lets OpenBLAS and the kernels split float work
  // by thread count, which moves last bits on some CPUs (seen on an AVX2 EPYC), and a run-time
  // quantizer may round such a difference either way; nothing more than that.
  auto one = embedding_cosines(ref, m, 1);
  auto two = embedding_cosines(ref, m, 2);
  CHECK(std::abs(one.first - two.first) < 1e-7);
  CHECK(std::abs(one.second - two.second) < 1e-6);
}

TEST_CASE("dynamic per-tensor quantization writes ONNX Runtime's DynamicQuantizeLinear form", "[dynamic][models]") {
  Model ref = load_model(tiny_bert());
  Model m = ref.clone();
  DynamicQuantOptions o;
  o.granularity = DynamicQuantOptions::Granularity::Tensor;
  passes::DynamicQuantReport rep = passes::quantize_dynamic(m, o);
  REQUIRE(verify(m).empty());
  CHECK(test::count_ops(m, "DynamicQuantizeLinear") == rep.activations);
  CHECK(test::count_ops(m, "MatMulInteger") == 13);
  CHECK(test::count_ops(m, "ReduceMin") == 0);
  // Every MatMulInteger reads its activation's zero point, as DynamicQuantizeLinear writes it, and
  // the weights' uint8 zero point 128 (uint8 x uint8: exact in ONNX Runtime on every x86 CPU).
  for (const auto& n : m.graph->nodes()) {
    if (n->op_type != "MatMulInteger") continue;
    REQUIRE(n->num_inputs() == 4);
    CHECK(n->input(2)->producer() != nullptr);
    CHECK(n->input(2)->producer()->op_type == "DynamicQuantizeLinear");
    CHECK(n->input(1)->initializer().dtype() == DType::UInt8);
    const Tensor& zp = n->input(3)->initializer();
    CHECK(zp.dtype() == DType::UInt8);
    CHECK(zp.numel() == 1);
    CHECK(zp.data<uint8_t>()[0] == 128);
  }
  auto [mean, lowest] = embedding_cosines(ref, m);
  INFO("mean " << mean << " lowest " << lowest);
  CHECK(mean >= 0.99);
  // Per token is the more accurate form on this model (outlier channels widen a per-tensor range).
  Model tok = ref.clone();
  passes::quantize_dynamic(tok, {});
  CHECK(embedding_cosines(ref, tok).first > mean);
}

TEST_CASE("dynamic quantization: MatMul and Gemm math on odd shapes, constant rows exact", "[dynamic]") {
  Model ref = small_dense_model();
  Model m = ref.clone();
  passes::DynamicQuantReport rep = passes::quantize_dynamic(m, {});
  REQUIRE(verify(m).empty());
  CHECK(rep.quantized["MatMul"] == 1);
  CHECK(rep.quantized["Gemm"] == 1);
  Tensor x = test::random_tensor({2, 3, 7}, 21, -3.0f, 2.0f);
  float* px = x.data<float>();
  for (int k = 0; k < 7; ++k) px[7 + k] = 0.625f;  // row 1: constant (hi == lo)
  Tensor x2 = test::random_tensor({4, 7}, 22, -1.0f, 4.0f);
  auto want = test::run_model(ref, {{"x", x}, {"x2", x2}});
  auto got = test::run_model(m, {{"x", x}, {"x2", x2}});
  REQUIRE(got.size() == 2);
  CHECK(got[0].shape() == Shape{2, 3, 5});
  CHECK(got[1].shape() == Shape{4, 6});
  CHECK(test::rel_l2(got[0], want[0]) < 0.02);
  CHECK(test::rel_l2(got[1], want[1]) < 0.02);
  // A constant row is represented exactly (q = 0, x = lo): only the int8 weights' error is left,
  // so it matches x times the dequantized weights to float rounding.
  passes::QuantizedWeight qw = passes::quantize_weight(*passes::constant_value(ref.graph->find("w")), 1);
  for (int n = 0; n < 5; ++n) {
    double y = 0;
    for (int k = 0; k < 7; ++k) y += 0.625 * qw.values.data<int8_t>()[k * 5 + n] * qw.scale_list[static_cast<size_t>(n)];
    CHECK(got[0].data<float>()[5 + n] == Approx(y).epsilon(1e-6));
  }
}

TEST_CASE("int8 embedding tables: per-row scales, shared tables, what is left alone", "[dynamic][embeddings]") {
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  Value* ids = g.add_value("ids", ValueType::tensor(DType::Int64, Shape{2, 4}));
  g.add_input(ids);
  Tensor table = test::random_tensor({300, 20}, 31, -0.5f, 0.5f);
  table.data<float>()[7 * 20 + 3] = 40.0f;  // one row with an outlier: must not hurt the others
  g.add_initializer("table", table);
  g.add_initializer("small", test::random_tensor({300, 10}, 32));     // below the size threshold
  g.add_initializer("tied", test::random_tensor({300, 20}, 33));      // also read by a MatMul
  g.add_initializer("sideways", test::random_tensor({20, 300}, 34));  // gathered on axis 1
  Value* a = g.add_value("a");
  Value* b = g.add_value("b");
  Value* c = g.add_value("c");
  Value* d = g.add_value("d");
  Value* e = g.add_value("e");
  Value* f = g.add_value("f");
  g.add_node("Gather", {g.find("table"), ids}, {a}, "g1");
  g.add_node("Gather", {g.find("table"), ids}, {b}, "g2");
  g.add_node("Gather", {g.find("small"), ids}, {c});
  g.add_node("Gather", {g.find("tied"), ids}, {d});
  g.add_node("MatMul", {a, g.find("sideways")}, {e});
  Node* side = g.add_node("Gather", {g.find("sideways"), ids}, {f});
  side->set_attr(Attribute::make_int("axis", 1));
  Value* t2 = g.add_value("t2");
  g.add_node("MatMul", {d, g.find("tied")}, {t2});  // [2,4,20] x [300,20]? only the graph shape matters here
  for (Value* v : {a, b, c, d, f}) g.add_output(v);
  auto tables = passes::find_embedding_tables(g, passes::kEmbeddingMinElements);
  REQUIRE(tables.size() == 1);
  CHECK(tables[0].table->name() == "table");
  CHECK(tables[0].gathers.size() == 2);
  CHECK(passes::find_embedding_tables(g, passes::kEmbeddingMinElements, {"g2"}).empty());
  CHECK(passes::find_embedding_tables(g, passes::kEmbeddingMinElements, {}, {"Gather"}).empty());

  Model ref = m.clone();
  const int64_t saved = passes::quantize_embedding_tables(*m.graph, passes::find_embedding_tables(*m.graph, 4096));
  // The MatMul of t2 only made "tied" a non-embedding; its shapes do not run: drop it from both.
  for (Model* mm : {&ref, &m}) {
    Graph& gg = *mm->graph;
    for (const auto& n : gg.nodes())
      if (n->output(0)->name() == "t2") {
        gg.remove_node(n.get());
        break;
      }
    gg.remove_unused_values();
  }
  REQUIRE(verify(m).empty());
  CHECK(saved == 300 * 20 * 4 - 300 * 20 - 300 * 4);
  CHECK_FALSE(m.graph->find("table"));
  CHECK(m.graph->find("small")->initializer().dtype() == DType::Float32);
  Tensor idv = Tensor::from<int64_t>({2, 4}, {0, 7, 299, 7, 5, 5, 1, 0});
  auto want = test::run_model(ref, {{"ids", idv}});
  auto got = test::run_model(m, {{"ids", idv}});
  // Each gathered row is that row's per-row int8 rounding: within half a step of the row's own scale.
  for (int out = 0; out < 2; ++out)
    for (int64_t i = 0; i < 8; ++i) {
      const int64_t row = idv.data<int64_t>()[i];
      float amax = 0;
      for (int k = 0; k < 20; ++k) amax = std::max(amax, std::fabs(table.data<float>()[row * 20 + k]));
      for (int k = 0; k < 20; ++k)
        CHECK(std::fabs(got[static_cast<size_t>(out)].data<float>()[i * 20 + k] - want[static_cast<size_t>(out)].data<float>()[i * 20 + k]) <=
              0.5f * amax / 127.0f * 1.0001f);
    }
  CHECK(test::max_abs_diff(got[2], want[2]) == 0.0);  // small table untouched
}

TEST_CASE("dynamic quantization: exclusions, skipped nodes, bad input", "[dynamic]") {
  Model m = load_model(tiny_bert());
  DynamicQuantOptions o;
  o.exclude_nodes = {"/layers.0/fc1/MatMul"};
  o.exclude_ops = {"Gemm", "Gather"};
  passes::DynamicQuantReport rep = passes::quantize_dynamic(m, o);
  CHECK(rep.quantized["MatMul"] == 11);
  CHECK(rep.quantized.count("Gemm") == 0);
  CHECK(rep.embedding_tables == 0);
  int excluded = 0;
  for (const auto& [node, why] : rep.skipped) excluded += why.find("excluded") != std::string::npos;
  CHECK(excluded == 2);
  CHECK_THROWS_AS(passes::parse_granularity("row"), Error);
  CHECK(passes::parse_granularity("tensor") == DynamicQuantOptions::Granularity::Tensor);
  // Opset 9 cannot be raised: refused with the reason.
  Model old = small_dense_model();
  old.set_opset("", 9);
  CHECK_THROWS_WITH(passes::quantize_dynamic(old, {}), Catch::Contains("opset"));
}

TEST_CASE("quantize_dynamic is in the pass registry", "[dynamic]") {
  Model m = load_model(tiny_bert());
  auto stats = passes::run_passes(m, {"quantize_dynamic"});
  REQUIRE(stats.size() == 1);
  CHECK(stats[0].changed == 15);  // 13 MatMul/Gemm and 2 embedding tables
  CHECK(test::count_ops(m, "MatMulInteger") == 13);
}

TEST_CASE("model family guess behind mpq quantize's defaults", "[dynamic][family]") {
  auto family = [](const std::string& stem) {
    return passes::guess_model_family(load_model(test::source_dir() / "tests/models" / (stem + ".onnx"))).family;
  };
  CHECK(family("tiny_bert") == passes::ModelFamily::Transformer);
  CHECK(family("transformer_op13") == passes::ModelFamily::Transformer);
  CHECK(family("transformer_op17") == passes::ModelFamily::Transformer);
  CHECK(family("resnet_bn_op13") == passes::ModelFamily::Cnn);
  CHECK(family("unet_op17") == passes::ModelFamily::Cnn);
  CHECK(family("fashion/fashion_vit") == passes::ModelFamily::Transformer);
  CHECK(family("fashion/fashion_mobilenet") == passes::ModelFamily::Cnn);
}
