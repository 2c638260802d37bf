#include "passes/fuse_gelu_mlp.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "runtime/cpu/gemm_small.h"

namespace mpq::passes {

namespace {

// The constant W [rows, columns] of a float32 mpq::MatMulBias with a constant bias of rank <= 1, or
// null.
const Tensor* matmul_bias_weights(const ir::Node& n) {
  if (n.domain != "mpq" || n.op_type != "MatMulBias" || n.num_inputs() != 3 || n.num_outputs() != 1) return nullptr;
  const Tensor* w = constant_value(n.input(1));
  const Tensor* bias = constant_value(n.input(2));
  if (!w || w->dtype() != DType::Float32 || w->rank() != 2) return nullptr;
  if (!bias || bias->dtype() != DType::Float32 || bias->rank() > 1) return nullptr;
  if (bias->numel() != w->dim(1) && bias->numel() != 1) return nullptr;
  return w;
}

// Whether W [K, N] is a right operand mpq's small-B kernel takes on this CPU (gemm_small.h, B not
// transposed): the fused kernel's bits are the unfused nodes' only where both products run there.
bool small_right_operand(const Tensor& w) {
  return rt::cpu::small_gemm_applies(false, false, w.dim(0), w.dim(1));
}

// Read by exactly one node, and not a graph output.
bool only_inside(const ir::Model& model, const ir::Value* v) {
  return v && !v->is_graph_output() && consumer_count(model, v) == 1;
}

// The pattern's two products around this Gelu, or nulls.
std::pair<ir::Node*, ir::Node*> products(const ir::Model& model, const ir::Node& gelu) {
  if ((gelu.domain != "mpq" && !gelu.domain.empty()) || gelu.op_type != "Gelu") return {};
  if (gelu.domain.empty() && model.opset("") < 20) return {};  // no ONNX Gelu before opset 20
  if (gelu.num_inputs() != 1 || gelu.num_outputs() != 1) return {};
  const std::string approximate = gelu.attr_string("approximate", "none");
  if (approximate != "none" && approximate != "tanh") return {};
  ir::Value* hidden = gelu.input(0);
  if (!only_inside(model, hidden) || !hidden->producer()) return {};
  ir::Node* first = hidden->producer();
  const Tensor* w1 = matmul_bias_weights(*first);
  if (!w1 || !small_right_operand(*w1)) return {};
  ir::Value* activated = gelu.output(0);
  if (!only_inside(model, activated)) return {};
  if (activated->uses().size() != 1) return {};
  ir::Node* second = activated->uses()[0].node;
  if (!second || activated->uses()[0].input_index != 0) return {};
  const Tensor* w2 = matmul_bias_weights(*second);
  if (!w2 || !small_right_operand(*w2) || w2->dim(0) != w1->dim(1)) return {};
  return {first, second};
}

}  // namespace

bool gelu_mlp_enabled() {
  const char* v = std::getenv("MPQ_GELU_MLP");
  return v == nullptr || std::string(v) != "0";
}

bool FuseGeluMlp::match(const ir::Model& model, const ir::Node& node) const {
  return products(model, node).first != nullptr;
}

void FuseGeluMlp::apply(ir::Model& model, ir::Node& node, PassStats& stats) {
  auto [first, second] = products(model, node);
  ir::Graph& g = *model.graph;
  ir::Value* x = first->input(0);
  ir::Value* w1 = first->input(1);
  ir::Value* b1 = first->input(2);
  ir::Value* w2 = second->input(1);
  ir::Value* b2 = second->input(2);
  ir::Value* out = second->output(0);
  const std::string approximate = node.attr_string("approximate", "none");
  const std::string name = node.name.empty() ? std::string() : node.name + "_mlp";
  const std::string what = fmt::format("{}, {} and {}", first->label(), node.label(), second->label());
  g.remove_node(second);
  g.remove_node(&node);
  g.remove_node(first);
  ir::Node* mlp = g.add_node("GeluMlp", {x, w1, b1, w2, b2}, {out}, name, "mpq");
  mlp->set_attr(ir::Attribute::make_string("approximate", approximate));
  if (model.opset("mpq") == 0) model.set_opset("mpq", 1);
  ++stats.changed;
  stats.notes.push_back(fmt::format("fused {} into one GeluMlp", what));
}

}  // namespace mpq::passes
