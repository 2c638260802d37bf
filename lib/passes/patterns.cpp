#include "passes/patterns.h"

#include <algorithm>
#include <set>

#include "passes/pass.h"

namespace mpq::passes {

const char* pattern_name(PatternKind k) {
  switch (k) {
    case PatternKind::Softmax: return "Softmax";
    case PatternKind::LayerNorm: return "LayerNorm";
    case PatternKind::Gelu: return "GELU";
  }
  return "?";
}

namespace {

using ir::Node;
using ir::Value;

Node* producer_op(const Value* v, const char* op) {
  if (!v || !v->producer() || v->producer()->op_type != op || !v->producer()->domain.empty()) return nullptr;
  return v->producer();
}

std::vector<Node*> consumers(const Value* v) {
  std::vector<Node*> out;
  if (!v) return out;
  for (const ir::Use& u : v->uses()) out.push_back(u.node);
  return out;
}

Node* single_consumer_op(const Value* v, const char* op) {
  if (!v || v->uses().size() != 1 || v->is_graph_output()) return nullptr;
  Node* n = v->uses()[0].node;
  return (n->op_type == op && n->domain.empty()) ? n : nullptr;
}

bool is_const(const Value* v) { return constant_value(v) != nullptr; }

}  // namespace

Value* other_input(const Node* n, const Value* v) { return n->input(0) == v ? n->input(1) : n->input(0); }

bool scalar_const_near(const Value* v, double target, double tol) {
  const Tensor* t = constant_value(v);
  if (!t || t->numel() != 1 || !dtype_is_float(t->dtype())) return false;
  return std::fabs(t->get_double(0) - target) <= tol;
}

// ReduceMean(x) -> Sub(x, mean) -> Pow(d, 2) | Mul(d, d) -> ReduceMean -> Add(eps) -> Sqrt -> Div(d, std)
// [-> Mul(gamma) -> Add(beta)]
bool match_written_layernorm(Node* sub, PatternMatch& m) {
  if (sub->op_type != "Sub" || !sub->domain.empty()) return false;
  Value* x = sub->input(0);
  Node* mean = producer_op(sub->input(1), "ReduceMean");
  if (!x || !mean || mean->input(0) != x) return false;
  Value* d = sub->output(0);
  Node* square = nullptr;
  Node* div = nullptr;
  for (Node* c : consumers(d)) {
    if ((c->op_type == "Pow" && scalar_const_near(c->input(1), 2.0, 1e-6)) ||
        (c->op_type == "Mul" && c->input(0) == d && c->input(1) == d))
      square = c;
    else if (c->op_type == "Div" && c->input(0) == d)
      div = c;
  }
  if (!square || !div) return false;
  Node* var = single_consumer_op(square->output(0), "ReduceMean");
  if (!var) return false;
  Node* add_eps = single_consumer_op(var->output(0), "Add");
  if (!add_eps || !is_const(other_input(add_eps, var->output(0)))) return false;
  Node* sqrt = single_consumer_op(add_eps->output(0), "Sqrt");
  if (!sqrt || div->input(1) != sqrt->output(0)) return false;
  m.kind = PatternKind::LayerNorm;
  m.nodes = {mean, sub, square, var, add_eps, sqrt, div};
  m.input = x;
  m.output = div->output(0);
  // Optional affine part.
  if (Node* mul = single_consumer_op(m.output, "Mul"); mul && is_const(other_input(mul, m.output))) {
    m.nodes.push_back(mul);
    m.output = mul->output(0);
    if (Node* add = single_consumer_op(m.output, "Add"); add && is_const(other_input(add, m.output))) {
      m.nodes.push_back(add);
      m.output = add->output(0);
    }
  }
  return true;
}

// Div(x, sqrt2) | Mul(x, 1/sqrt2) -> Erf -> Add(1) -> Mul(x or 0.5x, .) [-> Mul(0.5)]
bool match_written_gelu_erf(Node* erf, PatternMatch& m) {
  if (erf->op_type != "Erf" || !erf->domain.empty()) return false;
  Node* scale = producer_op(erf->input(0), "Div");
  if (!scale) scale = producer_op(erf->input(0), "Mul");
  if (!scale || !is_const(scale->input(1))) return false;
  Value* x = scale->input(0);
  Node* add = single_consumer_op(erf->output(0), "Add");
  if (!add || !scalar_const_near(other_input(add, erf->output(0)), 1.0, 1e-6)) return false;
  Node* mul = single_consumer_op(add->output(0), "Mul");
  if (!mul) return false;
  m.kind = PatternKind::Gelu;
  m.nodes = {scale, erf, add, mul};
  m.input = x;
  Value* other = other_input(mul, add->output(0));
  if (other != x) {
    Node* half = producer_op(other, "Mul");
    if (!half || half->input(0) != x || !scalar_const_near(half->input(1), 0.5, 1e-6)) return false;
    m.nodes.push_back(half);
  }
  m.output = mul->output(0);
  if (other == x) {
    if (Node* half = single_consumer_op(m.output, "Mul"); half && scalar_const_near(other_input(half, m.output), 0.5, 1e-6)) {
      m.nodes.push_back(half);
      m.output = half->output(0);
    }
  }
  return true;
}

bool match_is_self_contained(const ir::Model& model, const PatternMatch& m) {
  std::set<const Node*> inside(m.nodes.begin(), m.nodes.end());
  for (const Node* n : m.nodes)
    for (const Value* v : n->outputs()) {
      if (!v || v == m.output) continue;
      if (v->is_graph_output() || consumer_count(model, v) != v->uses().size()) return false;
      for (const ir::Use& u : v->uses())
        if (!inside.count(u.node)) return false;
    }
  return true;
}

namespace {

// Pow(x,3) -> Mul(c) -> Add(x, .) -> Mul(c) -> Tanh -> Add(1) -> Mul(x|0.5x, .) [-> Mul(0.5)]
bool match_gelu_tanh(Node* tanh, PatternMatch& m) {
  if (tanh->op_type != "Tanh" || !tanh->domain.empty()) return false;
  Node* scale = producer_op(tanh->input(0), "Mul");
  if (!scale) return false;
  Value* sum_v = is_const(scale->input(1)) ? scale->input(0) : scale->input(1);
  Node* sum = producer_op(sum_v, "Add");
  if (!sum) return false;
  Node* cube_scale = producer_op(sum->input(1), "Mul");
  Value* x = sum->input(0);
  if (!cube_scale) {
    cube_scale = producer_op(sum->input(0), "Mul");
    x = sum->input(1);
  }
  if (!cube_scale) return false;
  Value* cube_v = is_const(cube_scale->input(1)) ? cube_scale->input(0) : cube_scale->input(1);
  Node* cube = producer_op(cube_v, "Pow");
  if (!cube || cube->input(0) != x || !scalar_const_near(cube->input(1), 3.0, 1e-6)) return false;
  Node* add = single_consumer_op(tanh->output(0), "Add");
  if (!add || !scalar_const_near(other_input(add, tanh->output(0)), 1.0, 1e-6)) return false;
  Node* mul = single_consumer_op(add->output(0), "Mul");
  if (!mul) return false;
  m.kind = PatternKind::Gelu;
  m.nodes = {cube, cube_scale, sum, scale, tanh, add, mul};
  m.input = x;
  Value* other = other_input(mul, add->output(0));
  if (other != x) {
    Node* half = producer_op(other, "Mul");
    if (!half || half->input(0) != x) return false;
    m.nodes.push_back(half);
  }
  m.output = mul->output(0);
  if (Node* half = single_consumer_op(m.output, "Mul"); other == x && half && scalar_const_near(other_input(half, m.output), 0.5, 1e-6)) {
    m.nodes.push_back(half);
    m.output = half->output(0);
  }
  return true;
}

}  // namespace

std::vector<PatternMatch> find_fragile_patterns(const ir::Graph& graph) {
  std::vector<PatternMatch> out;
  std::set<const Node*> taken;
  auto accept = [&](PatternMatch& m) {
    for (Node* n : m.nodes)
      if (taken.count(n)) return;
    for (Node* n : m.nodes) taken.insert(n);
    out.push_back(std::move(m));
  };
  for (const auto& np : graph.nodes()) {
    Node* n = np.get();
    if (!n->domain.empty() || taken.count(n)) continue;
    PatternMatch m;
    if (n->op_type == "Softmax" || n->op_type == "LogSoftmax") {
      m = PatternMatch{PatternKind::Softmax, {n}, n->input(0), n->output(0)};
      accept(m);
    } else if (n->op_type == "LayerNormalization") {
      m = PatternMatch{PatternKind::LayerNorm, {n}, n->input(0), n->output(0)};
      accept(m);
    } else if (n->op_type == "Gelu") {
      m = PatternMatch{PatternKind::Gelu, {n}, n->input(0), n->output(0)};
      accept(m);
    } else if (match_written_layernorm(n, m) || match_written_gelu_erf(n, m) || match_gelu_tanh(n, m)) {
      accept(m);
    }
  }
  return out;
}

std::unordered_map<const ir::Node*, size_t> pattern_membership(const std::vector<PatternMatch>& matches) {
  std::unordered_map<const ir::Node*, size_t> out;
  for (size_t i = 0; i < matches.size(); ++i)
    for (ir::Node* n : matches[i].nodes) out[n] = i;
  return out;
}

bool is_interior_edge(const ir::Value* v, const std::vector<PatternMatch>& matches,
                      const std::unordered_map<const ir::Node*, size_t>& membership) {
  (void)matches;
  if (!v || !v->producer()) return false;
  auto p = membership.find(v->producer());
  if (p == membership.end()) return false;
  for (const ir::Use& u : v->uses()) {
    auto c = membership.find(u.node);
    if (c != membership.end() && c->second == p->second) return true;
  }
  return false;
}

}  // namespace mpq::passes
