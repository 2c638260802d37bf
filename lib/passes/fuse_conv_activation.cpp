#include "passes/fuse_conv_activation.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/error.h"

namespace mpq::passes {

namespace {

const char* const kActivations[] = {"Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "Tanh", "HardSwish"};

bool is_activation(const std::string& op) {
  for (const char* a : kActivations)
    if (op == a) return true;
  return false;
}

// The Conv (or FusedConv that has no activation yet) producing `v`, read by `consumers` nodes, or
// nullptr.
ir::Node* fusable_conv(const ir::Model& model, const ir::Value* v, bool allow_z, size_t consumers = 1) {
  if (!v || !v->producer() || v->is_graph_output() || consumer_count(model, v) != consumers) return nullptr;
  ir::Node* p = v->producer();
  if (p->num_outputs() != 1) return nullptr;
  const bool plain = p->domain.empty() && p->op_type == "Conv";
  if (!plain && !is_fused_conv(*p)) return nullptr;
  if (is_fused_conv(*p) && (p->has_attr("activation") || (!allow_z && p->input(3)))) return nullptr;
  // A fused fake quantization comes last in the epilogue: an Add or activation after it cannot
  // move before it.
  if (p->has_attr("fake_quant")) return nullptr;
  // float32 only: a float16 Conv rounds its output before the activation, which fusion would skip.
  DType elem = v->type.is_tensor() ? v->type.elem : DType::Undefined;
  if (elem == DType::Undefined) {
    const Tensor* w = constant_value(p->input(1));
    if (w) elem = w->dtype();
  }
  if (elem != DType::Float32) return nullptr;
  return p;
}

bool same_known_shape(const ir::ValueType& a, const ir::ValueType& b) {
  if (!a.is_tensor() || !b.is_tensor() || !a.has_shape || !b.has_shape || a.elem != b.elem) return false;
  if (a.dims.size() != b.dims.size()) return false;
  for (size_t i = 0; i < a.dims.size(); ++i) {
    const auto& x = a.dims[i];
    const auto& y = b.dims[i];
    if (x.known() && y.known()) {
      if (x.value != y.value) return false;
    } else if (x.known() || y.known() || x.param.empty() || x.param != y.param) {
      return false;
    }
  }
  return true;
}

// Clip's bounds as constants (attributes before opset 11, optional inputs after); false when an
// input bound is not a constant.
bool clip_bounds(const ir::Node& clip, float& lo, float& hi) {
  lo = -std::numeric_limits<float>::infinity();
  hi = std::numeric_limits<float>::infinity();
  if (clip.has_attr("min")) lo = clip.attr_float("min", lo);
  if (clip.has_attr("max")) hi = clip.attr_float("max", hi);
  for (size_t i = 1; i <= 2; ++i) {
    const ir::Value* v = clip.input(i);
    if (!v) continue;
    const Tensor* t = constant_value(v);
    if (!t || t->numel() != 1 || t->dtype() != DType::Float32) return false;
    (i == 1 ? lo : hi) = t->data<float>()[0];
  }
  return true;
}

// For Mul(x, HardSigmoid(x)) with HardSigmoid's alpha = 1/6 and beta = 0.5 (how PyTorch exports
// Hardswish before opset 14): the HardSigmoid node, else nullptr.
ir::Node* hard_swish_gate(const ir::Model& model, const ir::Node& mul, size_t x_index) {
  if (mul.num_inputs() != 2) return nullptr;
  const ir::Value* x = mul.input(x_index);
  const ir::Value* h = mul.input(1 - x_index);
  if (!x || !h || !h->producer() || h->is_graph_output() || consumer_count(model, h) != 1) return nullptr;
  ir::Node* hs = h->producer();
  if (!hs->domain.empty() || hs->op_type != "HardSigmoid" || hs->input(0) != x) return nullptr;
  if (std::fabs(hs->attr_float("alpha", 0.2f) - 1.0f / 6.0f) > 1e-6f || hs->attr_float("beta", 0.5f) != 0.5f) return nullptr;
  return hs;
}

// Index (0 or 1) of the Add input whose Conv can take the other input as its residual Z, or -1.
int residual_conv_input(const ir::Model& model, const ir::Node& add) {
  if (add.num_inputs() != 2 || add.input(0) == add.input(1)) return -1;
  for (size_t i = 0; i < 2; ++i)
    if (fusable_conv(model, add.input(i), false) && same_known_shape(add.input(1 - i)->type, add.input(i)->type))
      return static_cast<int>(i);
  return -1;
}

// Index (0 or 1) of x in a Mul(x, HardSigmoid(x)) whose x is a fusable Conv's output, or -1.
int hard_swish_conv_input(const ir::Model& model, const ir::Node& mul) {
  for (size_t i = 0; i < mul.num_inputs() && i < 2; ++i)
    if (hard_swish_gate(model, mul, i) && fusable_conv(model, mul.input(i), true, 2)) return static_cast<int>(i);
  return -1;
}

}  // namespace

std::vector<std::string> FuseConvActivation::target_ops() const {
  std::vector<std::string> ops{"Add", "Mul"};
  for (const char* a : kActivations) ops.emplace_back(a);
  return ops;
}

bool FuseConvActivation::match(const ir::Model& model, const ir::Node& node) const {
  if (!node.domain.empty() || node.num_outputs() != 1 || !node.output(0)) return false;
  if (node.op_type == "Add") return residual_conv_input(model, node) >= 0;
  if (node.op_type == "Mul") return hard_swish_conv_input(model, node) >= 0;
  if (!is_activation(node.op_type) || !fusable_conv(model, node.input(0), true)) return false;
  if (node.op_type == "Clip") {
    float lo = 0, hi = 0;
    return clip_bounds(node, lo, hi);
  }
  return true;
}

void FuseConvActivation::apply(ir::Model& model, ir::Node& node, PassStats& stats) {
  ir::Graph& g = *model.graph;
  ir::Node* conv = nullptr;
  if (node.op_type == "Add") {
    const auto ci = static_cast<size_t>(residual_conv_input(model, node));
    conv = node.input(ci)->producer();
    ir::Value* z = node.input(1 - ci);
    if (conv->num_inputs() < 3) g.set_node_input(conv, 2, nullptr);
    g.set_node_input(conv, 3, z);
  } else if (node.op_type == "Mul") {
    const auto xi = static_cast<size_t>(hard_swish_conv_input(model, node));
    conv = node.input(xi)->producer();
    g.remove_node(hard_swish_gate(model, node, xi));
    conv->set_attr(ir::Attribute::make_string("activation", "HardSwish"));
  } else {
    conv = node.input(0)->producer();
    std::vector<float> params;
    if (node.op_type == "LeakyRelu") {
      params = {node.attr_float("alpha", 0.01f)};
    } else if (node.op_type == "HardSigmoid") {
      params = {node.attr_float("alpha", 0.2f), node.attr_float("beta", 0.5f)};
    } else if (node.op_type == "Clip") {
      float lo = 0, hi = 0;
      clip_bounds(node, lo, hi);
      params = {lo, hi};
    }
    conv->set_attr(ir::Attribute::make_string("activation", node.op_type));
    if (!params.empty()) conv->set_attr(ir::Attribute::make_floats("activation_params", params));
  }
  make_fused_conv(model, *conv);
  absorb_into_conv(model, *conv, node, stats);
}

void absorb_into_conv(ir::Model& model, ir::Node& conv, ir::Node& absorbed, PassStats& stats) {
  ir::Graph& g = *model.graph;
  ir::Value* out = absorbed.output(0);
  const std::string what = absorbed.label();
  g.remove_node(&absorbed);
  g.set_node_output(&conv, 0, out);
  ++stats.changed;
  stats.notes.push_back(fmt::format("fused {} into {}", what, conv.label()));
}

}  // namespace mpq::passes
