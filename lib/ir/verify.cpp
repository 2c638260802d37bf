#include "ir/verify.h"

#include <fmt/format.h>

#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"

namespace mpq::ir {

namespace {

void check_graph(const Graph& g, std::vector<std::string>& problems) {
  const std::string where = g.parent() ? fmt::format("subgraph '{}'", g.name) : fmt::format("graph '{}'", g.name);
  std::unordered_map<const Node*, size_t> position;
  for (size_t i = 0; i < g.nodes().size(); ++i) position[g.nodes()[i].get()] = i;

  for (Value* v : g.values()) {
    if (v->graph() != &g) problems.push_back(fmt::format("{}: value '{}' has the wrong owner", where, v->name()));
    int defs = (v->producer() ? 1 : 0) + (v->is_graph_input() ? 1 : 0) +
               ((v->has_initializer() && !v->is_graph_input()) ? 1 : 0) + (v->is_outer_scope() ? 1 : 0);
    if (defs > 1)
      problems.push_back(fmt::format("{}: value '{}' has more than one definition", where, v->name()));
    bool needed = !v->uses().empty() || v->is_graph_output();
    if (defs == 0 && needed)
      problems.push_back(fmt::format("{}: value '{}' is used but never defined", where, v->name()));
    if (v->is_outer_scope() && (!g.parent() || !g.parent()->find_in_scope(v->name())))
      problems.push_back(fmt::format("{}: '{}' refers to an enclosing scope that does not define it", where, v->name()));
    if (v->has_initializer()) {
      const Tensor& t = v->initializer();
      if (v->type.is_tensor() && v->type.elem != DType::Undefined && v->type.elem != t.dtype())
        problems.push_back(fmt::format("{}: initializer '{}' holds {} but is declared {}", where, v->name(),
                                       dtype_name(t.dtype()), dtype_name(v->type.elem)));
      if (v->type.is_tensor() && v->type.has_shape && !v->is_graph_input()) {
        bool match = v->type.dims.size() == t.shape().size();
        for (size_t i = 0; match && i < v->type.dims.size(); ++i)
          if (v->type.dims[i].known() && v->type.dims[i].value != t.shape()[i]) match = false;
        if (!match)
          problems.push_back(fmt::format("{}: initializer '{}' has shape {} but is declared {}", where, v->name(),
                                         shape_str(t.shape()), v->type.str()));
      }
    }
    if (v->type.is_tensor() && v->type.elem != DType::Undefined && !dtype_is_valid(static_cast<int32_t>(v->type.elem)))
      problems.push_back(fmt::format("{}: value '{}' has an invalid element type", where, v->name()));
    for (const Use& u : v->uses()) {
      if (u.input_index < 0 || static_cast<size_t>(u.input_index) >= u.node->num_inputs() ||
          u.node->input(static_cast<size_t>(u.input_index)) != v)
        problems.push_back(fmt::format("{}: use list of '{}' is out of sync", where, v->name()));
    }
  }

  for (const auto& np : g.nodes()) {
    const Node& n = *np;
    if (n.graph() != &g) problems.push_back(fmt::format("{}: {} has the wrong owner", where, n.label()));
    if (n.op_type.empty()) problems.push_back(fmt::format("{}: a node has no op_type", where));
    for (size_t i = 0; i < n.num_inputs(); ++i) {
      Value* v = n.input(i);
      if (!v) continue;
      if (v->graph() != &g) {
        problems.push_back(fmt::format("{}: {} input {} belongs to another graph", where, n.label(), i));
        continue;
      }
      // Producer must come first (the node order is the execution order).
      if (v->producer()) {
        auto it = position.find(v->producer());
        if (it != position.end() && it->second >= position[&n])
          problems.push_back(fmt::format("{}: {} reads '{}' before {} produces it (cycle or unsorted)", where,
                                         n.label(), v->name(), v->producer()->label()));
      }
    }
    for (size_t i = 0; i < n.num_outputs(); ++i) {
      Value* v = n.output(i);
      if (v && (v->producer() != &n || v->producer_index() != static_cast<int>(i)))
        problems.push_back(fmt::format("{}: output '{}' of {} does not point back to it", where, v->name(), n.label()));
    }
    for (Graph* sub : n.subgraphs()) {
      if (sub->parent() != &g)
        problems.push_back(fmt::format("{}: subgraph of {} has the wrong parent", where, n.label()));
      check_graph(*sub, problems);
    }
  }
  for (Value* v : g.outputs()) {
    if (!v->producer() && !v->is_graph_input() && !v->has_initializer() && !v->is_outer_scope())
      problems.push_back(fmt::format("{}: output '{}' is never defined", where, v->name()));
  }
}

}  // namespace

std::vector<std::string> verify(const Graph& graph) {
  std::vector<std::string> problems;
  check_graph(graph, problems);
  return problems;
}

std::vector<std::string> verify(const Model& model) { return verify(*model.graph); }

void verify_or_throw(const Model& model) {
  auto problems = verify(model);
  if (!problems.empty()) {
    std::string where = model.path.empty() ? std::string("model") : model.path.string();
    fail_input("{}: {}", where, problems.front());
  }
}

}  // namespace mpq::ir
