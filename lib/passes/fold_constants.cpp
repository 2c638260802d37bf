#include "passes/fold_constants.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "runtime/node_eval.h"

namespace mpq::passes {

namespace {

bool is_random(const std::string& op) {
  return op == "RandomNormal" || op == "RandomUniform" || op == "RandomNormalLike" || op == "RandomUniformLike" ||
         op == "Multinomial" || op == "Bernoulli";
}

int node_opset(const ir::Model& m, const ir::Node& n) {
  int64_t v = m.opset(n.domain);
  return static_cast<int>(v == 0 ? 1 : v);
}

}  // namespace

PassStats FoldConstants::run(ir::Model& model) {
  PassStats stats;
  ir::Graph& g = *model.graph;
  std::vector<ir::Node*> order;
  for (const auto& n : g.nodes()) order.push_back(n.get());
  for (ir::Node* n : order) {
    // Cheap checks first.
    if (!n->domain.empty() || keep.count(n->op_type) || is_random(n->op_type) || !n->subgraphs().empty()) continue;
    bool produces_output = false;
    for (ir::Value* out : n->outputs())
      if (out && out->is_graph_output()) produces_output = true;
    if (produces_output || n->num_outputs() == 0) continue;

    std::vector<Tensor> holders(n->num_inputs());
    std::vector<const Tensor*> inputs(n->num_inputs(), nullptr);
    bool all_constant = true;
    for (size_t i = 0; i < n->num_inputs() && all_constant; ++i) {
      ir::Value* v = n->input(i);
      if (!v) continue;
      if (const Tensor* t = constant_value(v)) {
        inputs[i] = t;
      } else if (n->op_type == "Shape" && i == 0 && v->type.static_shape()) {
        inputs[i] = nullptr;  // handled below
      } else {
        all_constant = false;
      }
    }
    if (!all_constant) continue;

    std::vector<Tensor> outs;
    try {
      if (n->op_type == "Shape" && n->input(0) && !constant_value(n->input(0))) {
        // Only the declared static shape is needed, not the tensor; honour start/end (opset 15).
        Shape dims = *n->input(0)->type.static_shape();
        int64_t rank = static_cast<int64_t>(dims.size());
        int64_t start = n->attr_int("start", 0), end = n->attr_int("end", rank);
        if (start < 0) start += rank;
        if (end < 0) end += rank;
        start = std::clamp<int64_t>(start, 0, rank);
        end = std::clamp<int64_t>(end, start, rank);
        std::vector<int64_t> sliced(dims.begin() + start, dims.begin() + end);
        outs.push_back(Tensor::from<int64_t>({static_cast<int64_t>(sliced.size())}, sliced));
      } else {
        outs = rt::evaluate_node(*n, node_opset(model, *n), inputs);
      }
    } catch (const Error& e) {
      stats.notes.push_back(fmt::format("{}: not folded ({})", n->label(), e.what()));
      continue;
    }
    size_t bytes = 0;
    for (const Tensor& t : outs) bytes += t.defined() ? t.nbytes() : 0;
    if (bytes > max_output_bytes && n->op_type != "Constant") {
      stats.notes.push_back(fmt::format("{}: not folded (result of {} bytes)", n->label(), bytes));
      continue;
    }
    std::vector<ir::Value*> outputs = n->outputs();
    g.remove_node(n);
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!outputs[i] || !outs[i].defined()) continue;
      g.set_initializer(outputs[i], outs[i]);
    }
    ++stats.changed;
  }
  if (stats.changed) {
    stats.notes.push_back(fmt::format("folded {} node(s) into initializers", stats.changed));
    g.remove_dead_nodes();
    remove_unused_initializers(model);
  }
  return stats;
}

}  // namespace mpq::passes
