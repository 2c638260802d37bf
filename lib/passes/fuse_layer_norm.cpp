#include "passes/fuse_layer_norm.h"

#include <fmt/format.h>

#include "passes/patterns.h"

namespace mpq::passes {

namespace {

// The recogniser's node order: ReduceMean, Sub, Pow|Mul, ReduceMean, Add(eps), Sqrt, Div, then
// the optional Mul(gamma) and Add(beta).
constexpr size_t kMean = 0, kSquare = 2, kVar = 3, kAddEps = 4, kDiv = 6, kGamma = 7, kBeta = 8;

// The ReduceMean keeps its rank and averages over the last axis only (axes from the attribute,
// or from the constant second input since opset 18).
bool reduces_last_axis(const ir::Node& mean, const ir::Value* x) {
  if (mean.attr_int("keepdims", 1) != 1) return false;
  std::vector<int64_t> axes;
  if (mean.has_attr("axes")) {
    axes = mean.attr_ints("axes");
  } else if (const Tensor* t = mean.num_inputs() > 1 ? constant_value(mean.input(1)) : nullptr) {
    if (t->dtype() != DType::Int64) return false;
    for (int64_t i = 0; i < t->numel(); ++i) axes.push_back(t->data<int64_t>()[i]);
  } else {
    return false;
  }
  if (axes.size() != 1) return false;
  if (axes[0] == -1) return true;
  return x->type.is_tensor() && x->type.has_shape && axes[0] == static_cast<int64_t>(x->type.dims.size()) - 1;
}

// A float32 constant of rank <= 1 (broadcasts along the last axis as the LayerNorm parameter does).
bool row_parameter(const ir::Value* v) {
  const Tensor* t = constant_value(v);
  return t && t->dtype() == DType::Float32 && t->rank() <= 1 && t->numel() > 0;
}

bool fusable(const ir::Model& model, const ir::Node& sub, PatternMatch& m) {
  if (!sub.domain.empty() || !match_written_layernorm(const_cast<ir::Node*>(&sub), m)) return false;
  if (m.nodes.size() <= kGamma) return false;  // no affine part: the fused op needs gamma
  const ir::Value* x = m.input;
  if (!x->type.is_tensor() || x->type.elem != DType::Float32) return false;
  for (const ir::Node* n : m.nodes)
    if (n->num_outputs() != 1) return false;
  if (!reduces_last_axis(*m.nodes[kMean], x) || !reduces_last_axis(*m.nodes[kVar], x)) return false;
  const ir::Node& square = *m.nodes[kSquare];
  if (square.op_type == "Pow") {
    const Tensor* e = constant_value(square.input(1));
    if (!e || e->get_double(0) != 2.0) return false;
  }
  const ir::Node& add_eps = *m.nodes[kAddEps];
  const Tensor* eps = constant_value(other_input(&add_eps, m.nodes[kVar]->output(0)));
  if (!eps || eps->numel() != 1 || eps->dtype() != DType::Float32 || !(eps->data<float>()[0] >= 0.0f)) return false;
  const ir::Node* gamma = m.nodes[kGamma];
  if (!row_parameter(other_input(gamma, m.nodes[kDiv]->output(0)))) return false;
  if (m.nodes.size() > kBeta && !row_parameter(other_input(m.nodes[kBeta], gamma->output(0)))) return false;
  return match_is_self_contained(model, m);
}

}  // namespace

bool FuseLayerNorm::match(const ir::Model& model, const ir::Node& node) const {
  PatternMatch m;
  return fusable(model, node, m);
}

void FuseLayerNorm::apply(ir::Model& model, ir::Node& node, PassStats& stats) {
  PatternMatch m;
  fusable(model, node, m);
  ir::Graph& g = *model.graph;
  const ir::Node* add_eps = m.nodes[kAddEps];
  const ir::Value* var = m.nodes[kVar]->output(0);
  const float eps = constant_value(other_input(add_eps, var))->data<float>()[0];
  std::vector<ir::Value*> inputs = {m.input, other_input(m.nodes[kGamma], m.nodes[kDiv]->output(0))};
  if (m.nodes.size() > kBeta) inputs.push_back(other_input(m.nodes[kBeta], m.nodes[kGamma]->output(0)));
  ir::Value* out = m.output;
  const std::string name = m.nodes[kMean]->name.empty() ? std::string() : m.nodes[kMean]->name + "_fused";
  const std::string what = m.nodes[kMean]->label();
  for (ir::Node* n : m.nodes) g.remove_node(n);
  ir::Node* ln = g.add_node("LayerNormalization", inputs, {out}, name, "mpq");
  ln->set_attr(ir::Attribute::make_int("axis", -1));
  ln->set_attr(ir::Attribute::make_float("epsilon", eps));
  if (model.opset("mpq") == 0) model.set_opset("mpq", 1);
  ++stats.changed;
  stats.notes.push_back(fmt::format("fused the LayerNorm starting at {} ({} nodes) into one", what, m.nodes.size()));
}

}  // namespace mpq::passes
