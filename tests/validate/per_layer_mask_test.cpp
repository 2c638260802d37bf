// Per-layer validation on an encoder with an additive attention mask: the mask's fill values
// (-3.4e38) are left out, so the attention-score tensors get a real SNR instead of hundreds of dB;
// and the same mask-carrying tensors never get Q/DQ pairs nor FP16 storage.
#include <catch2/catch.hpp>

#include <cmath>

#include "calib/calibrator.h"
#include "data/feeds.h"
#include "ir/onnx_io.h"
#include "passes/convert_precision.h"
#include "passes/insert_qdq.h"
#include "passes/quantize_dynamic.h"
#include "validate/compare.h"
#include "validate/per_layer.h"
#include "test_util.h"

using namespace mpq;
namespace fs = std::filesystem;

namespace {
fs::path models() { return test::source_dir() / "tests/models"; }
}  // namespace

TEST_CASE("mask_thresholds finds the attention-mask path and nothing else", "[per-layer][mask]") {
  ir::Model m = ir::load_model(models() / "tiny_bert.onnx");
  auto masks = validate::mask_thresholds(m);
  int adds = 0, softmax = 0;
  for (const auto& [name, threshold] : masks) {
    const ir::Value* v = m.graph->find(name);
    REQUIRE(v);
    CHECK(threshold > 1e38);  // half of float32's lowest, the exporter's fill value
    if (v->producer()->op_type == "Add") ++adds;
    if (v->producer()->op_type == "Softmax") ++softmax;
  }
  CHECK(adds == 3);  // scores + mask, once per layer
  CHECK(softmax == 0);
  // A CNN has no mask path.
  CHECK(validate::mask_thresholds(ir::load_model(models() / "resnet_bn_op13.onnx")).empty());
}

TEST_CASE("per-layer SNR of masked attention scores is meaningful", "[per-layer][mask]") {
  ir::Model ref = ir::load_model(models() / "tiny_bert.onnx");
  ir::Model cand = ref.clone();
  passes::DynamicQuantOptions o;
  o.granularity = passes::DynamicQuantOptions::Granularity::Tensor;
  passes::quantize_dynamic(cand, o);
  data::FeedSource feeds = data::FeedSource::open(models() / "tiny_bert_data", ref);
  validate::CompareOptions co;
  co.per_layer = true;
  validate::CompareResult r = validate::compare_models(ref, cand, feeds, co);
  REQUIRE(r.per_layer);
  CHECK(r.per_layer->masked > 0);  // the eval feeds are padded: some keys are masked
  int scores = 0;
  for (const validate::LayerResult& l : r.per_layer->layers) {
    if (l.op_type != "Add" || l.masked == 0) continue;
    ++scores;
    INFO(l.name << ": " << l.snr_db << " dB");
    CHECK(l.snr_db < 80.0);  // with the fill values in, sum(r^2) ~ 1e76 gave several hundred dB
    CHECK(l.stats.count() > 0);
  }
  CHECK(scores == 3);
  for (const validate::LayerResult& l : r.per_layer->layers)
    if (l.op_type == "Softmax") CHECK(l.upstream_snr_db < 80.0);
}

TEST_CASE("masks and position ids never go through Q/DQ, and stay FP32 in FP16", "[mask][qdq][fp16]") {
  ir::Model ref = ir::load_model(models() / "tiny_bert.onnx");
  const auto masks = validate::mask_thresholds(ref);
  REQUIRE(masks.size() >= 4);
  // Static INT8 with the encoder defaults (uint8, every quantizable input).
  ir::Model q = ref.clone();
  data::FeedSource calib = data::FeedSource::open(models() / "tiny_bert_calib", q);
  calib::CalibOptions co;
  co.activation_type = "uint8";
  passes::QdqOptions qo;
  qo.activation_type = "uint8";
  qo.quantize_attention = true;  // even with attention MatMuls quantized
  passes::insert_qdq(q, calib::calibrate(q, calib, co), qo);
  int quantizers = 0;
  for (const auto& n : q.graph->nodes()) {
    if (n->op_type != "QuantizeLinear") continue;
    ++quantizers;
    INFO(n->input(0)->name());
    CHECK_FALSE(masks.count(n->input(0)->name()));
    CHECK(n->input(0)->type.elem != DType::Int64);
  }
  CHECK(quantizers > 10);
  // FP16: every mask-carrying tensor is still computed in float32.
  ir::Model h = ref.clone();
  passes::convert_precision(h, {});
  for (const auto& [name, threshold] : masks) {
    const ir::Value* v = h.graph->find(name);
    REQUIRE(v);
    const ir::Node* p = v->producer();
    REQUIRE(p);
    for (const ir::Value* in : p->inputs())
      if (in && in->has_initializer()) CHECK(in->initializer().dtype() != DType::Float16);
  }
  auto out = test::run_model(h, {{"input_ids", Tensor::from<int64_t>({1, 3}, {5, 9, 0})},
                                  {"attention_mask", Tensor::from<int64_t>({1, 3}, {1, 1, 0})}});
  for (int64_t i = 0; i < out[0].numel(); ++i) CHECK(std::isfinite(out[0].data<float>()[i]));
}
