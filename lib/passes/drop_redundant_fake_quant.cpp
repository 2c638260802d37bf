#include "passes/drop_redundant_fake_quant.h"

#include <algorithm>
#include <cmath>

#include "passes/fuse_conv_activation.h"
#include "passes/fuse_conv_fake_quant.h"

namespace mpq::passes {

namespace {

// Ops whose output elements are some of their data inputs' elements, unchanged.
bool moves_elements(const ir::Node& n) {
  if (!n.domain.empty() && n.domain != "ai.onnx") return false;
  const std::string& t = n.op_type;
  return t == "MaxPool" || t == "Concat" || t == "Reshape" || t == "Flatten" || t == "Transpose" || t == "Squeeze" ||
         t == "Unsqueeze" || t == "Identity";
}

// The inputs of a moving op that carry its elements (Reshape's shape and Squeeze's axes do not).
size_t data_inputs(const ir::Node& n) {
  if (n.op_type == "Concat") return n.num_inputs();
  return 1;
}

bool grid_of(const ir::Value* v, FakeQuantGrid& grid, int depth) {
  const ir::Node* p = v ? v->producer() : nullptr;
  if (!p || depth > 16) return false;
  if (is_fused_conv(*p) && p->has_attr("fake_quant")) {
    if (v->producer_index() != 0) return false;
    const std::vector<float> f = p->attr_floats("fake_quant", {});
    if (f.size() != 3 || !(f[0] > 0.0f) || !std::isfinite(f[0])) return false;
    grid = {f[0], f[1], f[2]};
    return true;
  }
  if (scalar_fake_quant(*p, grid.scale, grid.lo, grid.hi)) return true;
  // MaxPool's second output holds indices; only its values (output 0) are elements of X.
  if (!moves_elements(*p) || v->producer_index() != 0) return false;
  const size_t n = data_inputs(*p);
  if (n == 0) return false;
  for (size_t i = 0; i < n; ++i) {
    FakeQuantGrid g;
    if (!grid_of(p->input(i), g, depth + 1)) return false;
    if (i == 0) {
      grid = g;
    } else {
      if (g.scale != grid.scale) return false;
      grid.lo = std::min(grid.lo, g.lo);
      grid.hi = std::max(grid.hi, g.hi);
    }
  }
  return true;
}

}  // namespace

bool fake_quant_grid(const ir::Value* v, FakeQuantGrid& grid) { return grid_of(v, grid, 0); }

bool DropRedundantFakeQuant::match(const ir::Model&, const ir::Node& node) const {
  float s = 0, lo = 0, hi = 0;
  if (!scalar_fake_quant(node, s, lo, hi)) return false;
  const ir::Value* y = node.output(0);
  if (!y || y->is_graph_output()) return false;
  FakeQuantGrid in;
  return fake_quant_grid(node.input(0), in) && in.scale == s && in.lo >= lo && in.hi <= hi;
}

void DropRedundantFakeQuant::apply(ir::Model& model, ir::Node& node, PassStats& stats) {
  model.graph->replace_uses(node.output(0), node.input(0));
  stats.notes.push_back(node.label() + ": its input already lies on its grid, dropped");
  ++stats.changed;
}

}  // namespace mpq::passes
