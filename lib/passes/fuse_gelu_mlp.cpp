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

// A float32 constant of rank 1 with n values.
bool constant_row(const ir::Value* v, int64_t n) {
  const Tensor* t = constant_value(v);
  return t && t->dtype() == DType::Float32 && t->rank() == 1 && t->numel() == n;
}

// The LayerNormalization whose output only the block's first product reads, to be folded into the
// node: over the last axis, with constant float32 scale and bias of K values, its mean and
// inverse deviation outputs unread; or null.
ir::Node* layer_norm_before(const ir::Model& model, const ir::Node& first, int64_t k) {
  ir::Value* normalized = first.input(0);
  if (!only_inside(model, normalized) || !normalized->producer()) return nullptr;
  ir::Node* ln = normalized->producer();
  if (ln->op_type != "LayerNormalization" || (ln->domain != "mpq" && !ln->domain.empty())) return nullptr;
  if (ln->domain.empty() && model.opset("") < 17) return nullptr;
  if (ln->num_inputs() != 3 || ln->output(0) != normalized) return nullptr;
  for (size_t i = 1; i < ln->num_outputs(); ++i)
    if (ln->output(i) && (ln->output(i)->is_graph_output() || consumer_count(model, ln->output(i)) != 0)) return nullptr;
  const ir::Value* x = ln->input(0);
  const int64_t axis = ln->attr_int("axis", -1);
  const bool last_axis = axis == -1 || (x && x->type.has_shape && axis == static_cast<int64_t>(x->type.dims.size()) - 1);
  if (!x || !last_axis || !constant_row(ln->input(1), k) || !constant_row(ln->input(2), k)) return nullptr;
  return ln;
}

// The Add after the block's second product that adds the block's input back (a residual
// connection, N == K); or null.
ir::Node* residual_after(const ir::Model& model, const ir::Node& second, const ir::Value* block_input, int64_t k,
                         int64_t n) {
  ir::Value* y = second.output(0);
  if (n != k || !only_inside(model, y) || y->uses().size() != 1) return nullptr;
  ir::Node* add = y->uses()[0].node;
  if (!add || !add->domain.empty() || add->op_type != "Add" || add->num_inputs() != 2 || add->num_outputs() != 1)
    return nullptr;
  const ir::Value* other = add->input(add->input(0) == y ? 1 : 0);
  return other == block_input && other != y ? add : nullptr;
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
  const Tensor* w1_value = constant_value(first->input(1));
  const Tensor* w2_value = constant_value(second->input(1));
  const int64_t k = w1_value->dim(0), n = w2_value->dim(1);
  // The pre-norm block around it where there is one: x -> LayerNorm -> block -> Add(x, .).
  ir::Node* ln = layer_norm_before(model, *first, k);
  ir::Value* x = ln ? ln->input(0) : first->input(0);
  ir::Node* add = residual_after(model, *second, x, k, n);
  std::vector<ir::Value*> inputs = {x, first->input(1), first->input(2), second->input(1), second->input(2)};
  if (ln) {
    inputs.push_back(ln->input(1));
    inputs.push_back(ln->input(2));
  }
  ir::Value* out = add ? add->output(0) : second->output(0);
  const std::string approximate = node.attr_string("approximate", "none");
  // Everything read from the folded nodes is read before they are removed.
  const float epsilon = ln ? ln->attr_float("epsilon", 1e-5f) : 1e-5f;
  const int64_t axis = ln ? ln->attr_int("axis", -1) : -1;
  const std::string name = node.name.empty() ? std::string() : node.name + "_mlp";
  std::string what = fmt::format("{}, {} and {}", first->label(), node.label(), second->label());
  if (ln) what = ln->label() + ", " + what;
  if (add) what += " with " + add->label();
  const bool folds_norm = ln != nullptr, folds_add = add != nullptr;  // the nodes are gone below
  if (folds_add) g.remove_node(add);
  g.remove_node(second);
  g.remove_node(&node);
  g.remove_node(first);
  if (folds_norm) g.remove_node(ln);
  ir::Node* mlp = g.add_node("GeluMlp", inputs, {out}, name, "mpq");
  mlp->set_attr(ir::Attribute::make_string("approximate", approximate));
  if (folds_norm) {
    mlp->set_attr(ir::Attribute::make_int("layer_norm", 1));
    mlp->set_attr(ir::Attribute::make_float("epsilon", epsilon));
    mlp->set_attr(ir::Attribute::make_int("axis", axis));  // checked against X's rank
  }
  if (folds_add) mlp->set_attr(ir::Attribute::make_int("residual", 1));
  if (model.opset("mpq") == 0) model.set_opset("mpq", 1);
  ++stats.changed;
  stats.notes.push_back(fmt::format("fused {} into one GeluMlp", what));
}

}  // namespace mpq::passes
