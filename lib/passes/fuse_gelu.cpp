#include "passes/fuse_gelu.h"

#include <fmt/format.h>

#include <cmath>

#include "passes/patterns.h"

namespace mpq::passes {

namespace {

bool fusable(const ir::Model& model, const ir::Node& erf, PatternMatch& m) {
  if (!erf.domain.empty() || !match_written_gelu_erf(const_cast<ir::Node*>(&erf), m)) return false;
  const ir::Value* x = m.input;
  if (!x->type.is_tensor() || x->type.elem != DType::Float32) return false;
  for (const ir::Node* n : m.nodes)
    if (n->num_outputs() != 1) return false;
  // The recogniser checks Add(1) and the 0.5 factor; the scaling before Erf must be 1/sqrt 2.
  const ir::Node& scale = *m.nodes[0];
  const bool ok = scalar_const_near(scale.input(1), scale.op_type == "Div" ? std::sqrt(2.0) : std::sqrt(0.5), 1e-6);
  if (!ok) return false;
  // Without the 0.5 factor it is x * (1 + erf(x / sqrt 2)), twice GELU: not this op.
  if (m.nodes.size() < 5) return false;
  return match_is_self_contained(model, m);
}

}  // namespace

bool FuseGelu::match(const ir::Model& model, const ir::Node& node) const {
  PatternMatch m;
  return fusable(model, node, m);
}

void FuseGelu::apply(ir::Model& model, ir::Node& node, PassStats& stats) {
  PatternMatch m;
  fusable(model, node, m);
  ir::Graph& g = *model.graph;
  ir::Value* x = m.input;
  ir::Value* out = m.output;
  const std::string name = node.name.empty() ? std::string() : node.name + "_fused";
  const std::string what = node.label();
  for (ir::Node* n : m.nodes) g.remove_node(n);
  ir::Node* gelu = g.add_node("Gelu", {x}, {out}, name, "mpq");
  gelu->set_attr(ir::Attribute::make_string("approximate", "none"));
  if (model.opset("mpq") == 0) model.set_opset("mpq", 1);
  ++stats.changed;
  stats.notes.push_back(fmt::format("fused the GELU around {} ({} nodes) into one", what, m.nodes.size()));
}

}  // namespace mpq::passes
