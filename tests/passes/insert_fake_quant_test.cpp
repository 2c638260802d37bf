// Fake-quant insertion for QAT shares insert_qdq's placement: every Q/DQ pair of the export has a
// FakeQuant at the same tensor, with the same initial scale, so an untrained fake-quant model
// computes what the PTQ model computes; strip_fake_quant + insert_qdq with the learned scales
// reproduces the export exactly; 4-bit weights stay in [-7, 7].
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "calib/calibrator.h"
#include "ir/onnx_io.h"
#include "ir/verify.h"
#include "passes/fold_constants.h"
#include "passes/fuse_conv_bn.h"
#include "passes/insert_fake_quant.h"
#include "passes/insert_qdq.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
namespace fs = std::filesystem;

namespace {

struct Prepared {
  ir::Model model;
  calib::CalibrationTable table;
  std::vector<rt::Feeds> feeds;
};

Prepared prepare(const std::string& stem) {
  Prepared p;
  p.model = ir::load_model(test::source_dir() / "tests/models" / (stem + ".onnx"));
  passes::FoldConstants fold;
  passes::run_pass(fold, p.model);
  passes::FuseConvBn fuse;
  passes::run_pass(fuse, p.model);
  data::FeedSource src = data::FeedSource::open(test::source_dir() / "tests/models" / (stem + "_data"), p.model);
  calib::CalibOptions co;
  co.method = calib::RangeMethod::MinMax;
  p.table = calib::calibrate(p.model, src, co);
  for (size_t i = 0; i < src.size(); ++i) p.feeds.push_back(src.get(i).tensors);
  return p;
}

// Tensor names each kind of quantizer reads: activations (Q inputs / FakeQuant inputs that are not
// constants) and weights (initializers behind a weight DequantizeLinear / FakeQuant).
std::pair<std::multiset<std::string>, std::set<std::string>> quantized_names(const ir::Model& m) {
  std::multiset<std::string> acts;
  std::set<std::string> weights;
  for (const auto& n : m.graph->nodes()) {
    if (n->op_type == "QuantizeLinear" || n->op_type == "FakeQuant") {
      if (n->op_type == "FakeQuant" && n->input(0)->has_initializer()) weights.insert(n->input(0)->name());
      else acts.insert(n->input(0)->name());
    }
  }
  return {acts, weights};
}

}  // namespace

TEST_CASE("FakeQuant goes exactly where Q/DQ goes, with the same initial scales", "[qat][placement]") {
  for (const std::string stem : {"resnet_bn_op13", "mobilenetv3_op17", "transformer_op13", "unet_op13", "tiny_bert"}) {
    for (int bits : {8, 4}) {
      INFO(stem << " weight bits " << bits);
      Prepared p = prepare(stem);
      passes::QdqOptions o;
      o.weight_bits = bits;
      ir::Model qdq = p.model.clone();
      passes::insert_qdq(qdq, p.table, o);
      ir::Model fq = p.model.clone();
      const passes::FakeQuantReport rep = passes::insert_fake_quant(fq, p.table, o);
      ir::verify_or_throw(fq);
      const auto [qdq_acts, qdq_weights] = quantized_names(qdq);
      const auto [fq_acts, fq_weights] = quantized_names(fq);
      CHECK(fq_acts == qdq_acts);
      CHECK(static_cast<int>(fq_weights.size()) == rep.report.weight_tensors + rep.report.embedding_tables);
      if (stem == "tiny_bert") CHECK(rep.report.embedding_tables > 0);
      int weight_dq = 0;
      for (const auto& n : qdq.graph->nodes())
        if (n->op_type == "DequantizeLinear" && n->input(0)->has_initializer() &&
            n->input(0)->initializer().dtype() == DType::Int8)
          ++weight_dq;
      CHECK(weight_dq == rep.report.weight_tensors);
      CHECK(rep.weight_scales.size() == fq_weights.size());

      // Untrained, the fake-quant model computes exactly what the QDQ model computes.
      rt::Executor a(fq), b(qdq);
      for (const rt::Feeds& f : p.feeds) CHECK(test::max_abs_diff(a.run(f)[0], b.run(f)[0]) == 0.0);

      // strip + insert_qdq with the scales read back gives the export bit for bit.
      ir::Model back = fq.clone();
      passes::LearnedScales learned = passes::strip_fake_quant(back);
      ir::verify_or_throw(back);
      CHECK(test::count_ops(back, "FakeQuant") == 0);
      CHECK(back.opset("mpq") == 0);
      passes::QdqOptions with = o;
      with.activation_qparams = learned.activations;
      with.weight_scales = learned.weights;
      passes::insert_qdq(back, p.table, with);
      rt::Executor c(back);
      for (const rt::Feeds& f : p.feeds) {
        const std::vector<Tensor> x = b.run(f), y = c.run(f);
        CHECK(test::max_abs_diff(x[0], y[0]) == 0.0);
      }
      if (bits == 4) {
        // 4-bit weights sit behind DequantizeLinear; embedding tables (read by Gather) stay int8 per row.
        int four_bit = 0;
        for (const auto& n : back.graph->nodes()) {
          if (n->op_type != "DequantizeLinear" || !n->input(0)->has_initializer()) continue;
          const Tensor& t = n->input(0)->initializer();
          if (t.dtype() != DType::Int8 || t.rank() < 2) continue;
          ++four_bit;
          for (int64_t i = 0; i < t.numel(); ++i) REQUIRE(std::abs(t.data<int8_t>()[i]) <= 7);
        }
        CHECK(four_bit > 0);
      }
    }
  }
}

TEST_CASE("Fake-quant insertion respects exclusions and skipped patterns like insert_qdq", "[qat][placement]") {
  Prepared p = prepare("transformer_op17");
  passes::QdqOptions o;
  o.exclude_ops = {"Gemm"};
  ir::Model fq = p.model.clone();
  const passes::FakeQuantReport rep = passes::insert_fake_quant(fq, p.table, o);
  CHECK(rep.report.quantized.count("Gemm") == 0);
  bool gemm_skipped = false;
  for (const auto& [node, why] : rep.report.skipped) gemm_skipped |= why.find("--exclude-ops") != std::string::npos;
  CHECK(gemm_skipped);
  for (const auto& n : fq.graph->nodes())
    if (n->op_type == "Gemm") CHECK((n->input(1)->producer() == nullptr || n->input(1)->producer()->op_type != "FakeQuant"));
  passes::QdqOptions five;
  five.weight_bits = 5;
  CHECK_THROWS_AS(passes::insert_fake_quant(fq, p.table, five), Error);
}
