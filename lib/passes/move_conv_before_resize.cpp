#include "passes/move_conv_before_resize.h"

#include <fmt/format.h>

namespace mpq::passes {

namespace {

bool all_equal(const std::vector<int64_t>& v, int64_t x) {
  for (const int64_t e : v)
    if (e != x) return false;
  return true;
}

// Whether a constant input is absent or empty (an omitted optional input of Resize).
bool absent_or_empty(const ir::Value* v) {
  if (!v) return true;
  const Tensor* t = constant_value(v);
  return t && t->numel() == 0;
}

// The Resize that feeds `conv` when the two may trade places, else nullptr.
const ir::Node* movable_resize(const ir::Model& model, const ir::Node& conv) {
  if (!conv.domain.empty() || conv.num_outputs() != 1 || conv.num_inputs() < 2 || conv.num_inputs() > 3) return nullptr;
  const ir::Value* x = conv.input(0);
  if (!x || !x->producer() || x->is_graph_output() || consumer_count(model, x) != 1) return nullptr;
  // The convolution: a 1x1 kernel at stride 1 without padding, one group.
  const Tensor* w = constant_value(conv.input(1));
  if (!w || w->dtype() != DType::Float32 || w->rank() != 4 || w->dim(2) != 1 || w->dim(3) != 1) return nullptr;
  if (conv.attr_int("group", 1) != 1 || !all_equal(conv.attr_ints("strides"), 1) || !all_equal(conv.attr_ints("pads"), 0))
    return nullptr;
  const std::string auto_pad = conv.attr_string("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "VALID") return nullptr;
  if (const ir::Value* b = conv.input(2); b && b->type.is_tensor() && b->type.elem != DType::Float32) return nullptr;
  // The Resize: float32 data, scales of 1 on the batch and channel axes.
  const ir::Node& rz = *x->producer();
  if (!rz.domain.empty() || rz.op_type != "Resize" || rz.num_outputs() != 1) return nullptr;
  const ir::Value* data = rz.input(0);
  if (!data || (data->type.is_tensor() && data->type.elem != DType::Float32)) return nullptr;
  if (rz.has_attr("axes") || rz.attr_string("coordinate_transformation_mode") == "tf_crop_and_resize") return nullptr;
  const std::string mode = rz.attr_string("mode", "nearest");
  if (mode != "nearest" && mode != "linear" && mode != "cubic") return nullptr;
  // Opset 10: Resize(X, scales); from 11: Resize(X, roi, scales, sizes).
  const bool opset10 = model.opset("") < 11;
  const Tensor* scales = constant_value(rz.input(opset10 ? 1 : 2));
  if (!opset10 && !absent_or_empty(rz.input(3))) return nullptr;
  if (!scales || scales->dtype() != DType::Float32 || scales->numel() != 4) return nullptr;
  if (scales->get_double(0) != 1.0 || scales->get_double(1) != 1.0) return nullptr;
  // Only where it saves work. Per output pixel, with `taps` input pixels read per output pixel
  // and channel (nearest 1, linear 4, cubic 16) and s the Resize's area factor: Cin * Cout + taps
  // * Cin before, Cin * Cout / s + taps * Cout after. An upsampling (s > 1) to fewer or as many
  // channels always gains; a downsampling never does.
  const double sh = scales->get_double(2), sw = scales->get_double(3);
  if (!(sh >= 1.0 && sw >= 1.0 && sh * sw > 1.0)) return nullptr;
  const double cout = static_cast<double>(w->dim(0)), cin = static_cast<double>(w->dim(1));
  const double taps = mode == "nearest" ? 1.0 : (mode == "linear" ? 4.0 : 16.0);
  if (cin * cout / (sh * sw) + taps * cout >= cin * cout + taps * cin) return nullptr;
  return &rz;
}

}  // namespace

bool MoveConvBeforeResize::match(const ir::Model& model, const ir::Node& node) const {
  return movable_resize(model, node) != nullptr;
}

void MoveConvBeforeResize::apply(ir::Model& model, ir::Node& node, PassStats& stats) {
  ir::Graph& g = *model.graph;
  ir::Node* rz = node.input(0)->producer();
  std::vector<ir::Value*> conv_inputs = node.inputs();
  std::vector<ir::Value*> rz_inputs = rz->inputs();
  ir::Value* out = node.output(0);
  const std::string conv_name = node.name, rz_name = rz->name;
  const std::vector<ir::Attribute> conv_attrs = node.attributes, rz_attrs = rz->attributes;
  const std::string what = fmt::format("{} before {}", node.label(), rz->label());
  conv_inputs[0] = rz_inputs[0];
  // [N, Cout, H, W] where X's shape is declared.
  ir::ValueType low_type = ir::ValueType::tensor_unranked(DType::Float32);
  if (const ir::ValueType& xt = rz_inputs[0]->type; xt.is_tensor() && xt.has_shape && xt.dims.size() == 4) {
    low_type = ir::ValueType::tensor(DType::Float32, xt.dims);
    low_type.dims[1] = ir::Dim::fixed(constant_value(conv_inputs[1])->dim(0));
  }
  ir::Value* low = g.add_value(g.unique_name(out->name() + "_before_resize"), low_type);
  rz_inputs[0] = low;
  g.remove_node(&node);
  g.remove_node(rz);
  ir::Node* conv = g.add_node("Conv", conv_inputs, {low}, conv_name);
  conv->attributes = conv_attrs;
  ir::Node* resize = g.add_node("Resize", rz_inputs, {out}, rz_name);
  resize->attributes = rz_attrs;
  ++stats.changed;
  stats.notes.push_back(fmt::format("moved {}: the 1x1 convolution runs at the lower resolution", what));
}

}  // namespace mpq::passes
