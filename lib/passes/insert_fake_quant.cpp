#include "passes/insert_fake_quant.h"

#include <fmt/format.h>

#include "passes/pass.h"
#include "passes/quant_placement.h"
#include "runtime/cpu/fake_quant.h"

namespace mpq::passes {

namespace {

using ir::Attribute;
using ir::Graph;
using ir::Node;
using ir::Value;

Node* add_fake_quant(Graph& g, Value* x, Value* scale, Value* zero_point, Value* y, int32_t qmin, int32_t qmax, int axis) {
  std::vector<Value*> ins = {x, scale};
  if (zero_point) ins.push_back(zero_point);
  Node* n = g.add_node(rt::cpu::kFakeQuantOp, ins, {y}, "", rt::cpu::kFakeQuantDomain);
  n->set_attr(Attribute::make_int("qmin", qmin));
  n->set_attr(Attribute::make_int("qmax", qmax));
  if (axis >= 0) n->set_attr(Attribute::make_int("axis", axis));
  return n;
}

}  // namespace

FakeQuantReport insert_fake_quant(ir::Model& model, const calib::CalibrationTable& table, const QdqOptions& o) {
  if (o.activation_type != "int8" && o.activation_type != "uint8")
    fail_input("activation type must be int8 or uint8, got '{}'", o.activation_type);
  if (o.weight_bits != 8 && o.weight_bits != 4) fail_input("weight bits must be 8 or 4, got {}", o.weight_bits);
  FakeQuantReport out;
  const bool per_channel = prepare_opset_for_qdq(model, o.per_channel, out.report.notes);
  QuantPlacement plan = place_quantizers(model, table, o, per_channel);
  out.report.quantized = plan.report.quantized;
  out.report.skipped = plan.report.skipped;
  out.report.per_channel = per_channel;
  for (std::string& n : plan.report.notes) out.report.notes.push_back(std::move(n));
  if (model.opset(rt::cpu::kFakeQuantDomain) == 0) model.set_opset(rt::cpu::kFakeQuantDomain, 1);
  Graph& g = *model.graph;

  // One step size (and zero point) per scale group.
  std::map<int, std::pair<Value*, Value*>> group_params;
  std::map<int, calib::QParams> group_q;
  auto params_of = [&](int group) {
    auto it = group_params.find(group);
    if (it != group_params.end()) return it->second;
    const calib::QParams q = activation_qparams(plan.group_ranges[static_cast<size_t>(group)], o);
    Value* s = g.add_initializer(g.unique_name(fmt::format("qat.act_scale{}", group)), Tensor::scalar<float>(q.scale));
    Value* z = g.add_initializer(g.unique_name(fmt::format("qat.act_zp{}", group)), Tensor::scalar<int32_t>(q.zero_point));
    out.activation_scales.push_back(s->name());
    group_q[group] = q;
    return group_params[group] = {s, z};
  };
  for (const QuantPlacement::Output& po : plan.outputs) {
    // The producer writes a renamed float tensor; FakeQuant restores the output's own name.
    Value* v = po.value;
    auto [s, z] = params_of(po.group);
    Value* pre = g.add_value(g.unique_name(v->name() + "_float"), v->type);
    g.set_node_output(v->producer(), static_cast<size_t>(v->producer_index()), pre);
    const calib::QParams& q = group_q.at(po.group);
    add_fake_quant(g, pre, s, z, v, q.qmin, q.qmax, -1);
    ++out.nodes;
  }
  std::map<const Node*, Value*> anchor_input_scale;
  for (const QuantPlacement::Activation& act : plan.activations) {
    auto [s, z] = params_of(act.group);
    const calib::QParams& q = group_q.at(act.group);
    Value* fq = g.add_value(g.unique_name(act.value->name() + "_fq"));
    add_fake_quant(g, act.value, s, z, fq, q.qmin, q.qmax, -1);
    for (const auto& [consumer, index] : act.consumers) {
      g.set_node_input(consumer, index, fq);
      if (index == 0) anchor_input_scale[consumer] = s;
    }
    ++out.nodes;
  }
  out.report.activation_pairs = out.nodes;

  // Weights: one FakeQuant per (weight, axis), shared by the nodes that read the weight.
  const int qmax = weight_qmax(o);
  std::map<std::pair<Value*, int>, std::pair<Value*, Value*>> done;  // (weight, axis) -> (fake-quantized, scale)
  for (const QuantPlacement::Anchor& a : plan.anchors) {
    if (!a.has_weight) continue;
    Value* w = a.node->input(1);
    const int axis = per_channel ? a.weight_axis : -1;
    auto& [fq, scale] = done[{w, axis}];
    if (!fq) {
      const Tensor* wt = constant_value(w);
      const std::vector<float> scales = weight_channel_scales(*wt, axis, qmax);
      Value* s = g.add_initializer(g.unique_name(w->name() + ".qat_scale"),
                                   axis < 0 ? Tensor::scalar<float>(scales[0])
                                            : Tensor::from<float>({static_cast<int64_t>(scales.size())}, scales));
      out.weight_scales.push_back(s->name());
      out.weights.push_back(w->name());
      fq = g.add_value(g.unique_name(w->name() + "_fq"));
      scale = s;
      add_fake_quant(g, w, s, nullptr, fq, -qmax, qmax, axis);
      ++out.nodes;
      ++out.report.weight_tensors;
    }
    g.set_node_input(a.node, 1, fq);
    // The export stores this bias as int32 at input scale x weight scale: train with that rounding.
    auto in_scale = anchor_input_scale.find(a.node);
    if (a.quantize_bias && in_scale != anchor_input_scale.end()) {
      Value* b = a.node->input(2);
      Value* bq = g.add_value(g.unique_name(b->name() + "_fq"));
      g.add_node(rt::cpu::kFakeQuantBiasOp, {b, in_scale->second, scale}, {bq}, "", rt::cpu::kFakeQuantDomain);
      g.set_node_input(a.node, 2, bq);
      ++out.report.int32_biases;
    }
  }
  // Embedding tables: the export stores them int8 per row (quantize_embeddings.h), so training sees
  // that rounding, with a learned step size per row that the export then uses.
  for (const EmbeddingTable& e : plan.embeddings) {
    const Tensor& t = e.table->initializer();
    const std::vector<float> scales = weight_channel_scales(t, 0, 127);
    Value* s = g.add_initializer(g.unique_name(e.table->name() + ".qat_scale"),
                                 Tensor::from<float>({static_cast<int64_t>(scales.size())}, scales));
    Value* fq = g.add_value(g.unique_name(e.table->name() + "_fq"));
    add_fake_quant(g, e.table, s, nullptr, fq, -127, 127, 0);
    for (Node* gather : e.gathers) g.set_node_input(gather, 0, fq);
    out.weight_scales.push_back(s->name());
    out.weights.push_back(e.table->name());
    ++out.nodes;
    ++out.report.embedding_tables;
  }
  g.topological_sort();
  return out;
}

LearnedScales strip_fake_quant(ir::Model& model) {
  LearnedScales learned;
  Graph& g = *model.graph;
  std::vector<Node*> fqs, biases;
  for (const auto& n : g.nodes()) {
    if (n->domain != rt::cpu::kFakeQuantDomain) continue;
    if (n->op_type == rt::cpu::kFakeQuantOp) fqs.push_back(n.get());
    if (n->op_type == rt::cpu::kFakeQuantBiasOp) biases.push_back(n.get());
  }
  for (Node* n : biases) {
    g.replace_uses(n->output(0), n->input(0));
    g.remove_node(n);
  }
  for (Node* n : fqs) {
    Value* x = n->input(0);
    Value* y = n->output(0);
    const Tensor* scale = constant_value(n->input(1));
    if (!scale) fail_input("{}: its scale is not a constant", n->label());
    const int32_t qmin = static_cast<int32_t>(n->attr_int("qmin", -128)), qmax = static_cast<int32_t>(n->attr_int("qmax", 127));
    std::vector<float> s(scale->data<float>(), scale->data<float>() + scale->numel());
    const bool weight = constant_value(x) != nullptr;
    if (weight) {
      learned.weights[x->name()] = s;
    } else {
      calib::QParams q;
      q.scale = s.at(0);
      const Tensor* zp = n->input(2) ? constant_value(n->input(2)) : nullptr;
      q.zero_point = zp ? static_cast<int32_t>(zp->get_int64(0)) : 0;
      q.qmin = qmin;
      q.qmax = qmax;
      q.dtype = qmin < 0 ? DType::Int8 : DType::UInt8;
      learned.activations[y->is_graph_output() ? y->name() : x->name()] = q;
    }
    if (y->is_graph_output()) {
      // Give the name back to the producer: its output is renamed "<output>_float".
      Node* prod = x->producer();
      const int idx = x->producer_index();
      g.remove_node(n);
      if (prod) {
        g.set_node_output(prod, static_cast<size_t>(idx), y);
      } else {
        fail_input("graph output '{}' is fake-quantized but has no producer", y->name());
      }
      g.replace_uses(x, y);
    } else {
      g.replace_uses(y, x);
      g.remove_node(n);
    }
  }
  g.remove_unused_values();
  remove_unused_initializers(model);
  // Keep the custom domain out of the exported model.
  std::erase_if(model.opset_imports, [](const ir::OpsetId& o) { return o.domain == rt::cpu::kFakeQuantDomain; });
  g.topological_sort();
  return learned;
}

}  // namespace mpq::passes
