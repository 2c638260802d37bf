#include "passes/inference_fusion.h"

#include <optional>

#include "calib/table.h"
#include "ir/onnx_tools.h"
#include "passes/block_conv_layout.h"
#include "passes/drop_redundant_fake_quant.h"
#include "passes/fold_constants.h"
#include "passes/fuse_conv_activation.h"
#include "passes/fuse_conv_bn.h"
#include "passes/fuse_conv_fake_quant.h"
#include "passes/fuse_gelu.h"
#include "passes/fuse_gelu_mlp.h"
#include "passes/fuse_layer_norm.h"
#include "passes/fuse_matmul_bias.h"
#include "passes/fuse_qdq_pair.h"
#include "passes/int8_conv.h"
#include "passes/move_conv_before_resize.h"
#include "passes/pass.h"
#include "passes/quant_placement.h"
#include "runtime/devices.h"

namespace mpq::passes {

std::vector<std::string> fuse_for_inference(ir::Model& model, rt::BackendKind backend, const std::set<std::string>& keep) {
  // Shapes (best effort) let a residual Add fuse.
  ir::infer_shapes(model);
  ir::Graph& g = *model.graph;
  // Every fusion leaves graph outputs alone, so the kept values are made graph outputs while the
  // fusions run and taken off again before the layout pass (which would otherwise leave them
  // NCHW: a blocked tensor still holds the same values, which is all an observer needs).
  const size_t real_outputs = g.outputs().size();
  for (const std::string& name : keep)
    if (ir::Value* v = g.find(name); v && !v->is_graph_output()) g.add_output(v);

  FoldConstants fold;
  // A QDQ model's weights and biases are DequantizeLinear of int8/int32 initializers. Evaluated
  // here once (the same kernel, so the same values), they become float initializers: the
  // convolution then packs its weights once per plan instead of dequantizing and reordering them
  // on every run, and Conv + Relu/Add fuse as in a float model. Activation Q/DQ stay.
  fold.keep = {"QuantizeLinear"};
  // Float32 convolutions only: low-precision nodes run exactly as written, rounding included.
  FuseConvBn fuse_bn(/*float32_only=*/true);
  FuseConvActivation fuse_act;
  FuseLayerNorm fuse_ln;
  FuseGelu fuse_gelu;
  FuseMatMulBias fuse_matmul_bias;
  FuseGeluMlp fuse_gelu_mlp;
  MoveConvBeforeResize conv_before_resize;
  FuseQdqPair fuse_qdq;
  FuseConvFakeQuant fuse_conv_fq;
  DropRedundantFakeQuant drop_fq;
  MarkInt8Conv int8_conv;
  std::vector<Pass*> pipeline = {&fold, &fuse_bn};
  // mpq::FusedConv, mpq::LayerNormalization, mpq::Gelu, mpq::MatMulBias and mpq::GeluMlp are CPU kernels; the CUDA
  // path runs Conv through cuDNN and the Add/activation bodies, so it keeps the nodes apart.
  if (backend == rt::BackendKind::CPU) {
    pipeline.insert(pipeline.end(), {&conv_before_resize, &fuse_act, &fuse_ln, &fuse_gelu, &fuse_matmul_bias, &fuse_qdq, &fuse_conv_fq, &drop_fq});
    if (gelu_mlp_enabled()) pipeline.push_back(&fuse_gelu_mlp);
    if (int8_conv_enabled()) pipeline.push_back(&int8_conv);
  }
  std::vector<std::string> notes;
  for (Pass* pass : pipeline)
    for (std::string& note : run_pass(*pass, model).notes) notes.push_back(std::move(note));
  g.truncate_outputs(real_outputs);

  // Tensors between oneDNN convolutions stay in its channel-blocked layout (no reorders).
  if (backend == rt::BackendKind::CPU)
    if (const int64_t block = rt::cpu_conv_channel_block(); block > 0) {
      BlockConvLayout block_layout(block, rt::cpu_conv_channels_last());
      for (std::string& note : run_pass(block_layout, model).notes) notes.push_back(std::move(note));
    }
  return notes;
}

std::set<std::string> tensors_to_calibrate(const ir::Model& model, const QdqOptions& options, bool qoperator) {
  // Placement reads only whether a tensor has a range (and merges ranges of scale groups), so a
  // table naming every value with a dummy range yields the tensors a real table must cover.
  ir::Model m = model.clone();
  calib::CalibrationTable any;
  for (const ir::Value* v : m.graph->values()) {
    calib::TensorCalib c;
    c.name = v->name();
    c.min = -1.0;
    c.max = c.amax = 1.0;
    any.tensors.push_back(std::move(c));
  }
  QdqOptions o = options;
  o.exclude_nodes.clear();
  o.exclude_ops.clear();
  o.quantize_outputs = true;
  o.quantize_attention = true;
  const QuantPlacement plan = place_quantizers(m, any, o, o.per_channel);
  std::set<std::string> names;
  for (const auto& a : plan.activations) names.insert(a.value->name());
  for (const auto& out : plan.outputs) names.insert(out.value->name());
  if (qoperator)
    for (const auto& n : m.graph->nodes())
      if (n->domain.empty() && (n->op_type == "Conv" || n->op_type == "MatMul") && n->output(0))
        names.insert(n->output(0)->name());
  return names;
}

}  // namespace mpq::passes
