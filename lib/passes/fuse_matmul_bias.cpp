#include "passes/fuse_matmul_bias.h"

#include <fmt/format.h>

namespace mpq::passes {

namespace {

// Index (0 or 1) of the Add input that a fusable MatMul produces, or -1.
int matmul_input(const ir::Model& model, const ir::Node& add) {
  if (!add.domain.empty() || add.num_inputs() != 2 || add.num_outputs() != 1) return -1;
  for (size_t i = 0; i < 2; ++i) {
    const ir::Value* v = add.input(i);
    const ir::Value* bias_v = add.input(1 - i);
    if (!v || !bias_v || !v->producer() || v->is_graph_output() || consumer_count(model, v) != 1) continue;
    const ir::Node& mm = *v->producer();
    if (!mm.domain.empty() || mm.op_type != "MatMul" || mm.num_outputs() != 1) continue;
    const ir::Value* a = mm.input(0);
    if (!a || !a->type.is_tensor() || a->type.elem != DType::Float32) continue;
    if (a->type.has_shape && a->type.dims.empty()) continue;
    const Tensor* b = constant_value(mm.input(1));
    const Tensor* bias = constant_value(bias_v);
    if (!b || b->dtype() != DType::Float32 || b->rank() != 2) continue;
    if (!bias || bias->dtype() != DType::Float32 || bias->rank() > 1) continue;
    if (bias->numel() != b->dim(1) && bias->numel() != 1) continue;
    return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

bool FuseMatMulBias::match(const ir::Model& model, const ir::Node& node) const { return matmul_input(model, node) >= 0; }

void FuseMatMulBias::apply(ir::Model& model, ir::Node& node, PassStats& stats) {
  const auto mi = static_cast<size_t>(matmul_input(model, node));
  ir::Graph& g = *model.graph;
  ir::Node* mm = node.input(mi)->producer();
  ir::Value* a = mm->input(0);
  ir::Value* b = mm->input(1);
  ir::Value* bias = node.input(1 - mi);
  ir::Value* out = node.output(0);
  const std::string name = mm->name.empty() ? std::string() : mm->name + "_bias";
  const std::string what = fmt::format("{} and {}", mm->label(), node.label());
  g.remove_node(&node);
  g.remove_node(mm);
  g.add_node("MatMulBias", {a, b, bias}, {out}, name, "mpq");
  if (model.opset("mpq") == 0) model.set_opset("mpq", 1);
  ++stats.changed;
  stats.notes.push_back(fmt::format("fused {} into one MatMulBias", what));
}

}  // namespace mpq::passes
