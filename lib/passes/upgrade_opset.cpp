#include "passes/upgrade_opset.h"

#include <fmt/format.h>

#include "core/error.h"

namespace mpq::passes {

namespace {

using ir::Attribute;
using ir::Graph;
using ir::Node;
using ir::Value;

// Moves an ints attribute into a new int64 initializer input at position `index`.
void attr_to_input(Graph& g, Node* n, const std::string& attr, size_t index) {
  const Attribute* a = n->attr(attr);
  if (!a) return;
  std::vector<int64_t> v = a->ints;
  Value* c = g.add_initializer(g.unique_name((n->name.empty() ? n->op_type : n->name) + "_" + attr),
                               Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v));
  while (n->num_inputs() < index) g.set_node_input(n, n->num_inputs(), nullptr);
  g.set_node_input(n, index, c);
  n->remove_attr(attr);
}

int rank_of(const Value* v) {
  if (!v || !v->type.is_tensor() || !v->type.has_shape) return -1;
  return static_cast<int>(v->type.dims.size());
}

}  // namespace

bool upgrade_opset(ir::Model& model, int target, std::string* why_not) {
  const int64_t from = model.opset();
  if (from >= target) return true;
  auto refuse = [&](std::string why) {
    if (why_not) *why_not = std::move(why);
    return false;
  };
  if (from < 10) return refuse(fmt::format("opset {} is older than 10", from));
  Graph& g = *model.graph;
  // Check everything first so a refusal leaves the model untouched.
  for (const auto& np : g.nodes()) {
    const Node& n = *np;
    if (!n.subgraphs().empty()) return refuse(fmt::format("{} has a subgraph", n.label()));
    if (!n.domain.empty()) continue;
    if ((n.op_type == "Softmax" || n.op_type == "LogSoftmax" || n.op_type == "Hardmax") && from < 13) {
      int64_t axis = n.attr_int("axis", 1);
      int r = rank_of(n.input(0));
      if (!(axis == -1 || (r > 0 && (axis == r - 1 || axis + r == r - 1))))
        return refuse(fmt::format("{} normalises a flattened block (axis {} of rank {})", n.label(), axis, r));
    }
  }
  for (const auto& np : g.nodes()) {
    Node* n = np.get();
    if (!n->domain.empty()) continue;
    const std::string& op = n->op_type;
    if (from < 11 && op == "Pad" && n->has_attr("pads")) {
      float value = n->attr_float("value", 0.0f);
      attr_to_input(g, n, "pads", 1);
      n->remove_attr("value");
      if (value != 0.0f) {
        DType t = n->input(0)->type.is_tensor() && n->input(0)->type.elem != DType::Undefined ? n->input(0)->type.elem
                                                                                            : DType::Float32;
        Value* cv = g.add_initializer(g.unique_name("pad_value"), Tensor::scalar<float>(value).cast_to(t));
        g.set_node_input(n, 2, cv);
      }
    } else if (from < 11 && op == "Clip" && (n->has_attr("min") || n->has_attr("max"))) {
      DType t = n->input(0)->type.is_tensor() && n->input(0)->type.elem != DType::Undefined ? n->input(0)->type.elem
                                                                                          : DType::Float32;
      if (n->has_attr("min"))
        g.set_node_input(n, 1, g.add_initializer(g.unique_name("clip_min"), Tensor::scalar<float>(n->attr_float("min", 0)).cast_to(t)));
      if (n->has_attr("max"))
        g.set_node_input(n, 2, g.add_initializer(g.unique_name("clip_max"), Tensor::scalar<float>(n->attr_float("max", 0)).cast_to(t)));
      n->remove_attr("min");
      n->remove_attr("max");
    } else if (op == "Squeeze" || op == "Unsqueeze") {
      attr_to_input(g, n, "axes", 1);
    } else if (op == "ReduceSum") {
      attr_to_input(g, n, "axes", 1);
    } else if (op == "Split") {
      attr_to_input(g, n, "split", 1);
    } else if (op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") {
      n->set_attr(Attribute::make_int("axis", -1));
    }
  }
  model.set_opset("", target);
  return true;
}

}  // namespace mpq::passes
