#include "passes/to_qoperator.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "calib/qparams.h"
#include "core/error.h"
#include "passes/pass.h"

namespace mpq::passes {

namespace {

using ir::Graph;
using ir::Node;
using ir::Value;

// The DequantizeLinear feeding `v`, or nullptr.
Node* dq_of(const Value* v) {
  if (!v || !v->producer() || v->producer()->op_type != "DequantizeLinear" || !v->producer()->domain.empty())
    return nullptr;
  return v->producer();
}

}  // namespace

int convert_to_qoperator(ir::Model& model, const calib::CalibrationTable& table, const QdqOptions& o) {
  Graph& g = *model.graph;
  int converted = 0;
  ZeroPoints zero_points(g);
  // QLinearConv/QLinearMatMul need every zero point; QDQ export leaves the weights' (0) out.
  auto zero_point_of = [&](Node* dq) -> Value* {
    if (dq->input(2)) return dq->input(2);
    return zero_points.get(dq->input(0)->type.elem == DType::UInt8 ? DType::UInt8 : DType::Int8, 0);
  };
  std::vector<Node*> candidates;
  for (const auto& n : g.nodes())
    if (n->domain.empty() && (n->op_type == "Conv" || n->op_type == "MatMul")) candidates.push_back(n.get());
  for (Node* n : candidates) {
    Node* dx = dq_of(n->input(0));
    Node* dw = dq_of(n->input(1));
    if (!dx || !dw) continue;
    Value* y = n->output(0);
    const calib::TensorCalib* yc = table.find(y->name());
    if (!yc) {
      // A table of the fused graph (calibrate --tensors quantized) has no range for a convolution's
      // own output when an activation was fused into it.
      spdlog::warn("{}: the calibration table has no range for its output '{}': it stays QDQ (calibrate with --tensors all "
                   "for --format qoperator)", n->label(), y->name());
      continue;
    }
    // The bias must already be int32 (DequantizeLinear of an int32 initializer) or absent.
    Value* bias_q = nullptr;
    if (n->op_type == "Conv" && n->input(2)) {
      Node* db = dq_of(n->input(2));
      if (!db || !db->input(0) || !db->input(0)->has_initializer() || db->input(0)->initializer().dtype() != DType::Int32)
        continue;
      bias_q = db->input(0);
    }
    calib::QParams yq = o.activation_type == "int8" ? calib::symmetric_int8(yc->amax)
                                                    : calib::asymmetric_uint8(yc->min, yc->max);
    // Short numbered names, as insert_qdq gives its tensors (see there for why).
    const int id = converted;
    Value* ys = g.add_initializer(g.unique_name(fmt::format("ys{}", id)), Tensor::scalar<float>(yq.scale));
    Value* yz = zero_points.get(yq.dtype, yq.zero_point);
    Value* yqv = g.add_value(g.unique_name(fmt::format("yq{}", id)));
    std::vector<Value*> ins = {dx->input(0), dx->input(1), zero_point_of(dx), dw->input(0), dw->input(1), zero_point_of(dw), ys, yz};
    if (bias_q) ins.push_back(bias_q);
    const std::string op = n->op_type == "Conv" ? "QLinearConv" : "QLinearMatMul";
    std::string name = n->name.empty() ? g.unique_name(fmt::format("{}_{}", y->name(), op)) : n->name;
    std::vector<ir::Attribute> attrs = n->attributes;
    g.remove_node(n);
    Node* q = g.add_node(op, ins, {yqv}, name);
    if (op == "QLinearConv") q->attributes = attrs;
    g.add_node("DequantizeLinear", {yqv, ys, yz}, {y});
    ++converted;
  }
  if (converted) {
    g.topological_sort();
    g.remove_dead_nodes();
    remove_unused_initializers(model);
  }
  return converted;
}

}  // namespace mpq::passes
