// fuse_for_inference with kept tensors, and calibration on the fused graph: every tensor the
// quantizers read keeps its range, so QDQ export gives the same model as from the unfused graph.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "calib/calibrator.h"
#include "ir/onnx_io.h"
#include "ir/verify.h"
#include "passes/fold_constants.h"
#include "passes/fuse_conv_bn.h"
#include "passes/inference_fusion.h"
#include "passes/insert_qdq.h"
#include "passes/pass.h"
#include "runtime/devices.h"
#include "test_util.h"

using namespace mpq;
namespace fs = std::filesystem;

namespace {

fs::path model_path(const std::string& stem) { return test::source_dir() / "tests/models" / (stem + ".onnx"); }
fs::path data_path(const std::string& stem) { return test::source_dir() / "tests/models" / (stem + "_data"); }

// The model as `mpq quantize` prepares it before calibrating: constants and BatchNorm folded.
ir::Model prepared(const std::string& stem) {
  ir::Model m = ir::load_model(model_path(stem));
  passes::FoldConstants fold;
  passes::FuseConvBn fuse;
  passes::run_pass(fold, m);
  passes::run_pass(fuse, m);
  return m;
}

calib::CalibrationTable minmax(const ir::Model& m, const std::string& stem) {
  data::FeedSource feeds = data::FeedSource::open(data_path(stem), m);
  calib::CalibOptions o;
  o.method = calib::RangeMethod::MinMax;
  o.threads = 2;
  return calib::calibrate(m, feeds, o);
}

std::vector<std::string> output_names(const ir::Model& m) {
  std::vector<std::string> names;
  for (const ir::Value* v : m.graph->outputs()) names.push_back(v->name());
  return names;
}

// Quantized tensor name -> its scale, read from the QuantizeLinear nodes of a QDQ model.
std::map<std::string, float> activation_scales(const ir::Model& m) {
  std::map<std::string, float> scales;
  for (const auto& n : m.graph->nodes())
    if (n->op_type == "QuantizeLinear" && !n->input(0)->has_initializer())
      scales[n->input(0)->name()] = n->input(1)->initializer().get_double(0) > 0
                                        ? static_cast<float>(n->input(1)->initializer().get_double(0))
                                        : 0.0f;
  return scales;
}

}  // namespace

TEST_CASE("calibration on the fused graph covers every tensor QDQ export reads, with the same ranges", "[inference_fusion]") {
  for (const std::string stem : {"resnet_bn_op13", "mobilenetv3_op13", "unet_op17", "transformer_op13"}) {
    DYNAMIC_SECTION(stem) {
      const ir::Model m = prepared(stem);
      passes::QdqOptions qo;
      const std::set<std::string> keep = passes::tensors_to_calibrate(m, qo);
      REQUIRE(keep.size() >= 3);

      ir::Model fused = m.clone();
      passes::fuse_for_inference(fused, rt::BackendKind::CPU, keep);
      ir::verify_or_throw(fused);
      CHECK(output_names(fused) == output_names(m));  // the kept tensors were outputs only while fusing
      const bool cnn = stem != "transformer_op13";
      if (cnn) {
        // The point of it: the convolutions ran fused (fewer nodes, fewer tensors to observe).
        CHECK(test::count_ops(fused, "FusedConv") > 0);
        CHECK(fused.graph->num_nodes() < m.graph->num_nodes());
      }

      const calib::CalibrationTable plain = minmax(m, stem);
      const calib::CalibrationTable fast = minmax(fused, stem);
      CHECK(fast.tensors.size() <= plain.tensors.size());
      if (cnn) CHECK(fast.tensors.size() < plain.tensors.size());
      for (const std::string& name : keep) {
        INFO(name);
        const calib::TensorCalib* a = plain.find(name);
        const calib::TensorCalib* b = fast.find(name);
        REQUIRE(a);
        REQUIRE(b);
        CHECK(b->min == Approx(a->min).margin(1e-5).epsilon(1e-5));
        CHECK(b->max == Approx(a->max).margin(1e-5).epsilon(1e-5));
        CHECK(b->count == a->count);
      }

      // The export is the same from either table: the same tensors quantized, the same scales.
      ir::Model qa = m.clone(), qb = m.clone();
      const passes::QdqReport ra = passes::insert_qdq(qa, plain, qo);
      const passes::QdqReport rb = passes::insert_qdq(qb, fast, qo);
      CHECK(ra.activation_pairs == rb.activation_pairs);
      CHECK(ra.activation_pairs > 0);
      const auto sa = activation_scales(qa), sb = activation_scales(qb);
      REQUIRE(sa.size() == sb.size());
      for (const auto& [name, scale] : sa) {
        INFO(name);
        REQUIRE(sb.count(name));
        CHECK(sb.at(name) == Approx(scale).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("tensors kept for QOperator export survive fusion; without keeping them they are fused away", "[inference_fusion]") {
  const ir::Model m = prepared("resnet_bn_op13");
  const std::set<std::string> qdq = passes::tensors_to_calibrate(m, passes::QdqOptions{});
  const std::set<std::string> qop = passes::tensors_to_calibrate(m, passes::QdqOptions{}, /*qoperator=*/true);
  // QLinearConv needs each convolution's own output range.
  std::vector<std::string> conv_outputs;
  for (const auto& n : m.graph->nodes())
    if (n->op_type == "Conv") conv_outputs.push_back(n->output(0)->name());
  REQUIRE(!conv_outputs.empty());
  for (const std::string& name : conv_outputs) CHECK(qop.count(name));
  CHECK(qop.size() > qdq.size());
  for (const std::string& name : qdq) CHECK(qop.count(name));

  auto visible = [](const ir::Model& g, const std::string& name) {
    const ir::Value* v = g.graph->find(name);
    return v && (v->producer() || v->is_graph_input());
  };
  ir::Model kept = m.clone();
  passes::fuse_for_inference(kept, rt::BackendKind::CPU, qop);
  for (const std::string& name : qop) CHECK(visible(kept, name));
  ir::Model all_fused = m.clone();
  passes::fuse_for_inference(all_fused, rt::BackendKind::CPU);
  int hidden = 0;
  for (const std::string& name : conv_outputs) hidden += visible(all_fused, name) ? 0 : 1;
  CHECK(hidden > 0);
}

TEST_CASE("the CUDA backend's fusion folds BatchNorm only and keeps the graph's interface", "[inference_fusion]") {
  ir::Model m = ir::load_model(model_path("resnet_bn_op13"));
  const auto before = output_names(m);
  passes::fuse_for_inference(m, rt::BackendKind::CUDA);
  ir::verify_or_throw(m);
  CHECK(test::count_ops(m, "BatchNormalization") == 0);
  CHECK(test::count_ops(m, "FusedConv") == 0);
  CHECK(output_names(m) == before);
}
