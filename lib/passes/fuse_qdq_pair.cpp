#include "passes/fuse_qdq_pair.h"

#include <fmt/format.h>

#include <cmath>

#include "runtime/cpu/fake_quant.h"

namespace mpq::passes {

namespace {

struct QuantParams {
  float scale = 0;
  int32_t zero_point = 0;
  int32_t qmin = 0, qmax = 255;
};

// The scalar scale and zero point of a QuantizeLinear or DequantizeLinear node, when they are
// constants of the supported kinds.
bool scalar_params(const ir::Node& n, QuantParams& p) {
  if (!n.domain.empty() || n.num_inputs() < 2 || n.num_outputs() != 1) return false;
  if (n.has_attr("block_size") && n.attr_int("block_size", 0) != 0) return false;
  const Tensor* s = constant_value(n.input(1));
  if (!s || s->dtype() != DType::Float32 || s->numel() != 1) return false;
  p.scale = s->data<float>()[0];
  if (!(p.scale > 0) || !std::isfinite(p.scale)) return false;
  const ir::Value* zp_value = n.num_inputs() > 2 ? n.input(2) : nullptr;
  if (!zp_value) {  // no zero point: uint8, zero
    p.zero_point = 0;
    p.qmin = 0;
    p.qmax = 255;
    return true;
  }
  const Tensor* zp = constant_value(zp_value);
  if (!zp || zp->numel() != 1) return false;
  if (zp->dtype() == DType::Int8) {
    p.qmin = -128;
    p.qmax = 127;
  } else if (zp->dtype() == DType::UInt8) {
    p.qmin = 0;
    p.qmax = 255;
  } else {
    return false;
  }
  p.zero_point = static_cast<int32_t>(zp->get_int64(0));
  return true;
}

bool same(const QuantParams& a, const QuantParams& b) {
  return a.scale == b.scale && a.zero_point == b.zero_point && a.qmin == b.qmin && a.qmax == b.qmax;
}

bool fusable(const ir::Model& model, const ir::Node& q, QuantParams& p) {
  if (q.op_type != "QuantizeLinear" || !scalar_params(q, p)) return false;
  const ir::Value* x = q.input(0);
  if (!x || !x->type.is_tensor() || x->type.elem != DType::Float32) return false;
  // A quantized constant (a weight quantized in the graph) is left for constant folding to turn
  // into a float constant, which the convolution then packs once; a FakeQuant would hide it.
  if (constant_value(x)) return false;
  // Opset 21+ output_dtype may name a type other than the zero point's.
  if (q.has_attr("output_dtype") && q.attr_int("output_dtype", 0) != 0) return false;
  const ir::Value* qv = q.output(0);
  if (!qv || qv->is_graph_output() || qv->uses().empty()) return false;
  if (consumer_count(model, qv) != qv->uses().size()) return false;  // read inside a subgraph
  bool first = true;
  for (const ir::Use& u : qv->uses()) {
    const ir::Node& dq = *u.node;
    QuantParams d;
    if (dq.op_type != "DequantizeLinear" || u.input_index != 0 || !scalar_params(dq, d) || !same(p, d)) return false;
    const ir::Value* out = dq.output(0);
    if (!out || (!first && out->is_graph_output())) return false;
    if (consumer_count(model, out) != out->uses().size()) return false;
    first = false;
  }
  return true;
}

}  // namespace

bool FuseQdqPair::match(const ir::Model& model, const ir::Node& node) const {
  QuantParams p;
  return fusable(model, node, p);
}

void FuseQdqPair::apply(ir::Model& model, ir::Node& node, PassStats& stats) {
  QuantParams p;
  fusable(model, node, p);
  ir::Graph& g = *model.graph;
  ir::Value* x = node.input(0);
  std::vector<ir::Node*> readers;
  for (const ir::Use& u : node.output(0)->uses()) readers.push_back(u.node);
  ir::Value* out = readers.front()->output(0);
  // Further readers compute the same values: their readers read the first one's output instead.
  for (size_t i = 1; i < readers.size(); ++i) g.replace_uses(readers[i]->output(0), out);
  const std::string what = node.label();
  const std::string name = node.name.empty() ? std::string() : node.name + "_fake_quant";
  for (ir::Node* r : readers) g.remove_node(r);
  g.remove_node(&node);
  ir::Value* scale = g.add_initializer(g.unique_name(x->name() + ".fq_scale"), Tensor::scalar<float>(p.scale));
  ir::Value* zero_point = g.add_initializer(g.unique_name(x->name() + ".fq_zero_point"), Tensor::scalar<int32_t>(p.zero_point));
  ir::Node* fq = g.add_node(rt::cpu::kFakeQuantOp, {x, scale, zero_point}, {out}, name, rt::cpu::kFakeQuantDomain);
  fq->set_attr(ir::Attribute::make_int("qmin", p.qmin));
  fq->set_attr(ir::Attribute::make_int("qmax", p.qmax));
  if (model.opset(rt::cpu::kFakeQuantDomain) == 0) model.set_opset(rt::cpu::kFakeQuantDomain, 1);
  ++stats.changed;
  stats.notes.push_back(fmt::format("fused {} and its {} DequantizeLinear reader(s) into one FakeQuant", what, readers.size()));
}

}  // namespace mpq::passes
