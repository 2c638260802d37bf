#include "ir/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <queue>
#include <set>
#include <unordered_set>

#include "core/error.h"

namespace mpq::ir {

// ---------------------------------------------------------------- ValueType

ValueType ValueType::tensor(DType elem, std::vector<Dim> dims) {
  ValueType t;
  t.kind = Kind::Tensor;
  t.elem = elem;
  t.has_shape = true;
  t.dims = std::move(dims);
  return t;
}

ValueType ValueType::tensor(DType elem, const Shape& shape) {
  std::vector<Dim> dims;
  for (int64_t d : shape) dims.push_back(Dim::fixed(d));
  return tensor(elem, std::move(dims));
}

ValueType ValueType::tensor_unranked(DType elem) {
  ValueType t;
  t.kind = Kind::Tensor;
  t.elem = elem;
  return t;
}

std::optional<Shape> ValueType::static_shape() const {
  if (kind != Kind::Tensor || !has_shape) return std::nullopt;
  Shape s;
  for (const Dim& d : dims) {
    if (!d.known()) return std::nullopt;
    s.push_back(d.value);
  }
  return s;
}

std::string ValueType::str() const {
  if (kind == Kind::Unknown) return "?";
  if (kind == Kind::Other) return "non-tensor";
  std::string s = elem == DType::Undefined ? "?" : dtype_name(elem);
  if (!has_shape) return s + "[...]";
  s += "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ",";
    if (dims[i].known())
      s += std::to_string(dims[i].value);
    else if (!dims[i].param.empty())
      s += dims[i].param;
    else
      s += "?";
  }
  return s + "]";
}

// ---------------------------------------------------------------- Attribute

Attribute Attribute::make_int(std::string name, int64_t v) {
  Attribute a;
  a.name = std::move(name);
  a.type = AttrType::Int;
  a.i = v;
  return a;
}
Attribute Attribute::make_float(std::string name, float v) {
  Attribute a;
  a.name = std::move(name);
  a.type = AttrType::Float;
  a.f = v;
  return a;
}
Attribute Attribute::make_string(std::string name, std::string v) {
  Attribute a;
  a.name = std::move(name);
  a.type = AttrType::String;
  a.s = std::move(v);
  return a;
}
Attribute Attribute::make_ints(std::string name, std::vector<int64_t> v) {
  Attribute a;
  a.name = std::move(name);
  a.type = AttrType::Ints;
  a.ints = std::move(v);
  return a;
}
Attribute Attribute::make_floats(std::string name, std::vector<float> v) {
  Attribute a;
  a.name = std::move(name);
  a.type = AttrType::Floats;
  a.floats = std::move(v);
  return a;
}
Attribute Attribute::make_tensor(std::string name, Tensor v) {
  Attribute a;
  a.name = std::move(name);
  a.type = AttrType::Tensor;
  a.t = std::move(v);
  return a;
}
Attribute Attribute::make_graph(std::string name, std::shared_ptr<Graph> v) {
  Attribute a;
  a.name = std::move(name);
  a.type = AttrType::Graph;
  a.g = std::move(v);
  return a;
}

const char* attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::Float: return "float";
    case AttrType::Int: return "int";
    case AttrType::String: return "string";
    case AttrType::Tensor: return "tensor";
    case AttrType::Graph: return "graph";
    case AttrType::Floats: return "floats";
    case AttrType::Ints: return "ints";
    case AttrType::Strings: return "strings";
    case AttrType::Tensors: return "tensors";
    case AttrType::Graphs: return "graphs";
    case AttrType::SparseTensor: return "sparse_tensor";
    case AttrType::SparseTensors: return "sparse_tensors";
    case AttrType::TypeProto: return "type_proto";
    case AttrType::TypeProtos: return "type_protos";
    default: return "undefined";
  }
}

// ---------------------------------------------------------------- Node

const Attribute* Node::attr(std::string_view n) const {
  for (const Attribute& a : attributes)
    if (a.name == n) return &a;
  return nullptr;
}

namespace {
[[noreturn]] void wrong_attr_type(const Node& node, const Attribute& a, const char* expected) {
  fail_input("{}: attribute '{}' is {}, expected {}", node.label(), a.name, attr_type_name(a.type), expected);
}
}  // namespace

int64_t Node::attr_int(std::string_view n, int64_t fallback) const {
  const Attribute* a = attr(n);
  if (!a) return fallback;
  if (a->type != AttrType::Int) wrong_attr_type(*this, *a, "int");
  return a->i;
}

float Node::attr_float(std::string_view n, float fallback) const {
  const Attribute* a = attr(n);
  if (!a) return fallback;
  if (a->type == AttrType::Int) return static_cast<float>(a->i);
  if (a->type != AttrType::Float) wrong_attr_type(*this, *a, "float");
  return a->f;
}

std::string Node::attr_string(std::string_view n, const std::string& fallback) const {
  const Attribute* a = attr(n);
  if (!a) return fallback;
  if (a->type != AttrType::String) wrong_attr_type(*this, *a, "string");
  return a->s;
}

std::vector<int64_t> Node::attr_ints(std::string_view n, const std::vector<int64_t>& fallback) const {
  const Attribute* a = attr(n);
  if (!a) return fallback;
  if (a->type == AttrType::Int) return {a->i};
  if (a->type != AttrType::Ints) wrong_attr_type(*this, *a, "ints");
  return a->ints;
}

std::vector<float> Node::attr_floats(std::string_view n, const std::vector<float>& fallback) const {
  const Attribute* a = attr(n);
  if (!a) return fallback;
  if (a->type == AttrType::Float) return {a->f};
  if (a->type != AttrType::Floats) wrong_attr_type(*this, *a, "floats");
  return a->floats;
}

const Tensor* Node::attr_tensor(std::string_view n) const {
  const Attribute* a = attr(n);
  if (!a) return nullptr;
  if (a->type != AttrType::Tensor) wrong_attr_type(*this, *a, "tensor");
  return &a->t;
}

Graph* Node::attr_graph(std::string_view n) const {
  const Attribute* a = attr(n);
  if (!a) return nullptr;
  if (a->type != AttrType::Graph) wrong_attr_type(*this, *a, "graph");
  return a->g.get();
}

void Node::set_attr(Attribute a) {
  for (Attribute& existing : attributes) {
    if (existing.name == a.name) {
      existing = std::move(a);
      return;
    }
  }
  attributes.push_back(std::move(a));
}

void Node::remove_attr(std::string_view n) {
  std::erase_if(attributes, [&](const Attribute& a) { return a.name == n; });
}

std::string Node::label() const {
  std::string op = domain.empty() ? op_type : domain + "::" + op_type;
  if (!name.empty()) return fmt::format("{} node '{}'", op, name);
  if (!outputs_.empty() && outputs_[0]) return fmt::format("{} node producing '{}'", op, outputs_[0]->name());
  return fmt::format("{} node #{}", op, index_);
}

std::vector<Graph*> Node::subgraphs() const {
  std::vector<Graph*> out;
  for (const Attribute& a : attributes) {
    if (a.type == AttrType::Graph && a.g) out.push_back(a.g.get());
    if (a.type == AttrType::Graphs)
      for (const auto& g : a.graphs)
        if (g) out.push_back(g.get());
  }
  return out;
}

// ---------------------------------------------------------------- Graph

Graph::Graph(std::string n, Graph* parent) : name(std::move(n)), parent_(parent) {}
Graph::~Graph() = default;

Value* Graph::find(std::string_view n) const {
  auto it = by_name_.find(std::string(n));
  return it == by_name_.end() ? nullptr : it->second;
}

Value* Graph::find_in_scope(std::string_view n) const {
  for (const Graph* g = this; g; g = g->parent_) {
    Value* v = g->find(n);
    if (v && !v->is_outer_scope()) return v;
  }
  return nullptr;
}

Value* Graph::new_value(const std::string& n) {
  auto v = std::unique_ptr<Value>(new Value(this, n));
  Value* raw = v.get();
  values_.push_back(std::move(v));
  by_name_[n] = raw;
  return raw;
}

Value* Graph::add_value(const std::string& n, ValueType type) {
  if (n.empty()) fail_internal("Graph::add_value: empty name");
  if (find(n)) fail_input("graph '{}': value name '{}' is defined twice", name, n);
  Value* v = new_value(n);
  v->type = std::move(type);
  return v;
}

Value* Graph::add_outer_scope_value(const std::string& n) {
  if (Value* existing = find(n)) return existing;
  Value* v = new_value(n);
  v->outer_scope_ = true;
  return v;
}

Value* Graph::add_initializer(const std::string& n, Tensor t) {
  Value* v = find(n);
  if (!v) v = add_value(n);
  set_initializer(v, std::move(t));
  return v;
}

void Graph::set_initializer(Value* v, Tensor t) {
  if (v->producer_) fail_input("graph '{}': initializer '{}' is also produced by {}", name, v->name(), v->producer_->label());
  bool had = v->has_initializer();
  if (!v->type.is_tensor() || v->type.elem != t.dtype() || !v->type.has_shape) {
    v->type = ValueType::tensor(t.dtype(), t.shape());
  } else {
    auto s = v->type.static_shape();
    if (!s || *s != t.shape()) v->type = ValueType::tensor(t.dtype(), t.shape());
  }
  v->initializer_ = std::move(t);
  if (!had) initializers_.push_back(v);
}

void Graph::clear_initializer(Value* v) {
  if (!v->has_initializer()) return;
  v->initializer_ = Tensor();
  std::erase(initializers_, v);
}

namespace {
Graph* root_of(Graph* g) {
  while (g->parent()) g = g->parent();
  return g;
}
bool name_used_in_tree(const Graph& g, const std::string& n) {
  if (g.find(n)) return true;
  for (const auto& node : g.nodes())
    for (Graph* sub : node->subgraphs())
      if (name_used_in_tree(*sub, n)) return true;
  return false;
}
}  // namespace

std::string Graph::unique_name(const std::string& base) {
  Graph* root = root_of(this);
  std::string b = base.empty() ? std::string("v") : base;
  if (!name_used_in_tree(*root, b)) return b;
  for (;;) {
    std::string candidate = fmt::format("{}_{}", b, ++name_counter_);
    if (!name_used_in_tree(*root, candidate)) return candidate;
  }
}

std::vector<Value*> Graph::values() const {
  std::vector<Value*> out;
  out.reserve(values_.size());
  for (const auto& v : values_) out.push_back(v.get());
  return out;
}

void Graph::add_input(Value* v) {
  if (v->graph_ != this) fail_internal("add_input: value '{}' belongs to another graph", v->name());
  if (v->is_input_) return;
  v->is_input_ = true;
  inputs_.push_back(v);
}

void Graph::add_output(Value* v) {
  if (v->graph_ != this) fail_internal("add_output: value '{}' belongs to another graph", v->name());
  v->is_output_ = true;
  outputs_.push_back(v);
}

void Graph::set_output(size_t i, Value* v) {
  Value* old = outputs_.at(i);
  outputs_[i] = v;
  old->is_output_ = std::find(outputs_.begin(), outputs_.end(), old) != outputs_.end();
  v->is_output_ = true;
}

void Graph::truncate_outputs(size_t count) {
  if (count >= outputs_.size()) return;
  std::vector<Value*> dropped(outputs_.begin() + static_cast<std::ptrdiff_t>(count), outputs_.end());
  outputs_.resize(count);
  for (Value* v : dropped) v->is_output_ = std::find(outputs_.begin(), outputs_.end(), v) != outputs_.end();
}

void Graph::remove_input(Value* v) {
  std::erase(inputs_, v);
  v->is_input_ = false;
}

std::vector<Value*> Graph::required_inputs() const {
  std::vector<Value*> out;
  for (Value* v : inputs_)
    if (!v->has_initializer()) out.push_back(v);
  return out;
}

void Graph::attach_input(Node* n, size_t i, Value* v) {
  n->inputs_[i] = v;
  if (v) v->uses_.push_back(Use{n, static_cast<int>(i)});
}

void Graph::detach_input(Node* n, size_t i) {
  Value* v = n->inputs_[i];
  if (!v) return;
  auto& uses = v->uses_;
  for (auto it = uses.begin(); it != uses.end(); ++it) {
    if (it->node == n && it->input_index == static_cast<int>(i)) {
      uses.erase(it);
      break;
    }
  }
  n->inputs_[i] = nullptr;
}

Node* Graph::add_node(std::string op_type, std::vector<Value*> inputs, std::vector<Value*> outputs,
                      std::string node_name, std::string domain) {
  auto node = std::unique_ptr<Node>(new Node(this));
  Node* n = node.get();
  n->op_type = std::move(op_type);
  n->name = std::move(node_name);
  n->domain = canonical_domain(domain);
  n->index_ = next_node_index_++;
  n->inputs_.assign(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] && inputs[i]->graph_ != this)
      fail_internal("{}: input '{}' belongs to another graph", n->label(), inputs[i]->name());
    attach_input(n, i, inputs[i]);
  }
  n->outputs_.assign(outputs.size(), nullptr);
  for (size_t i = 0; i < outputs.size(); ++i) {
    Value* v = outputs[i];
    if (!v) continue;
    if (v->graph_ != this) fail_internal("{}: output '{}' belongs to another graph", n->label(), v->name());
    if (v->producer_)
      fail_input("value '{}' is produced twice: by {} and by {}", v->name(), v->producer_->label(), n->label());
    if (v->has_initializer()) fail_input("value '{}' is both an initializer and an output of {}", v->name(), n->label());
    if (v->is_input_) fail_input("value '{}' is both a graph input and an output of {}", v->name(), n->label());
    v->producer_ = n;
    v->producer_index_ = static_cast<int>(i);
    n->outputs_[i] = v;
  }
  nodes_.push_back(std::move(node));
  return n;
}

Node* Graph::add_node_with_new_outputs(std::string op_type, std::vector<Value*> inputs, size_t num_outputs,
                                       const std::string& base, std::string domain) {
  std::vector<Value*> outs;
  for (size_t i = 0; i < num_outputs; ++i)
    outs.push_back(add_value(unique_name(num_outputs == 1 ? base : fmt::format("{}_{}", base, i))));
  std::string node_name = unique_name(base + "_node");
  return add_node(std::move(op_type), std::move(inputs), std::move(outs), std::move(node_name), std::move(domain));
}

void Graph::remove_node(Node* n) {
  for (size_t i = 0; i < n->inputs_.size(); ++i) detach_input(n, i);
  for (Value* v : n->outputs_) {
    if (!v) continue;
    v->producer_ = nullptr;
    v->producer_index_ = -1;
  }
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& p) { return p.get() == n; });
  if (it == nodes_.end()) fail_internal("remove_node: {} is not in graph '{}'", n->label(), name);
  nodes_.erase(it);
}

void Graph::set_node_input(Node* n, size_t i, Value* v) {
  if (v && v->graph_ != this) fail_internal("{}: input '{}' belongs to another graph", n->label(), v->name());
  if (i >= n->inputs_.size()) n->inputs_.resize(i + 1, nullptr);
  detach_input(n, i);
  attach_input(n, i, v);
}

void Graph::set_node_output(Node* n, size_t i, Value* v) {
  if (i >= n->outputs_.size()) n->outputs_.resize(i + 1, nullptr);
  if (Value* old = n->outputs_[i]) {
    old->producer_ = nullptr;
    old->producer_index_ = -1;
  }
  n->outputs_[i] = v;
  if (v) {
    if (v->producer_ && v->producer_ != n)
      fail_internal("set_node_output: '{}' is already produced by {}", v->name(), v->producer_->label());
    v->producer_ = n;
    v->producer_index_ = static_cast<int>(i);
  }
}

namespace {
// Rename the outer-scope references of `old_name` in the subgraphs of `g` (recursively).
void rename_outer_refs(Graph& g, const std::string& old_name, Value* replacement);
}  // namespace

void Graph::replace_uses(Value* from, Value* to) {
  if (from == to) return;
  std::vector<Use> uses = from->uses_;
  for (const Use& u : uses) set_node_input(u.node, static_cast<size_t>(u.input_index), to);
  for (const auto& node : nodes_)
    for (Graph* sub : node->subgraphs()) rename_outer_refs(*sub, from->name(), to);
}

namespace {
void rename_outer_refs(Graph& g, const std::string& old_name, Value* replacement) {
  Value* ref = g.find(old_name);
  if (ref && ref->is_outer_scope()) {
    Value* target = g.find(replacement->name());
    if (!target) target = g.add_outer_scope_value(replacement->name());
    g.replace_uses(ref, target);
  } else if (ref) {
    return;  // shadowed by a local definition: deeper graphs see the local one
  }
  for (const auto& node : g.nodes())
    for (Graph* sub : node->subgraphs()) rename_outer_refs(*sub, old_name, replacement);
}

// Names of outer-scope values a subgraph (and its own subgraphs) reads.
void collect_outer_refs(const Graph& g, std::set<std::string>& out) {
  for (Value* v : g.values())
    if (v->is_outer_scope() && (!v->uses().empty() || v->is_graph_output())) out.insert(v->name());
  for (const auto& node : g.nodes())
    for (Graph* sub : node->subgraphs()) {
      std::set<std::string> inner;
      collect_outer_refs(*sub, inner);
      for (const std::string& n : inner) {
        Value* local = g.find(n);
        if (!local || local->is_outer_scope()) out.insert(n);
      }
    }
}
}  // namespace

const Tensor* constant_value(const Value* v) {
  if (!v) return nullptr;
  if (v->is_constant()) return &v->initializer();
  // A Constant node's tensor (fold_constants turns these into initializers, but passes and the
  // executor's analyses also see unfolded graphs).
  const Node* p = v->producer();
  if (p && p->op_type == "Constant" && p->domain.empty() && p->attr("value") && p->attr("value")->type == AttrType::Tensor)
    return &p->attr("value")->t;
  return nullptr;
}

std::vector<std::string> outer_references(const Graph& subgraph) {
  std::set<std::string> refs;
  collect_outer_refs(subgraph, refs);
  return {refs.begin(), refs.end()};
}

void Graph::topological_sort() {
  const size_t n = nodes_.size();
  std::unordered_map<const Node*, size_t> pos;
  for (size_t i = 0; i < n; ++i) pos[nodes_[i].get()] = i;
  std::vector<std::vector<size_t>> succ(n);
  std::vector<size_t> indegree(n, 0);
  auto add_edge = [&](const Value* v, size_t consumer) {
    if (!v || !v->producer_ || v->graph_ != this) return;
    auto it = pos.find(v->producer_);
    if (it == pos.end()) return;
    succ[it->second].push_back(consumer);
    ++indegree[consumer];
  };
  for (size_t i = 0; i < n; ++i) {
    for (const Value* v : nodes_[i]->inputs_) add_edge(v, i);
    for (Graph* sub : nodes_[i]->subgraphs()) {
      std::set<std::string> refs;
      collect_outer_refs(*sub, refs);
      for (const std::string& r : refs) add_edge(find(r), i);
    }
  }
  std::priority_queue<size_t, std::vector<size_t>, std::greater<size_t>> ready;
  for (size_t i = 0; i < n; ++i)
    if (indegree[i] == 0) ready.push(i);
  std::vector<size_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    size_t i = ready.top();
    ready.pop();
    order.push_back(i);
    for (size_t s : succ[i])
      if (--indegree[s] == 0) ready.push(s);
  }
  if (order.size() != n) {
    for (size_t i = 0; i < n; ++i)
      if (indegree[i] > 0) fail_input("graph '{}' has a cycle through {}", name, nodes_[i]->label());
  }
  std::vector<std::unique_ptr<Node>> sorted;
  sorted.reserve(n);
  for (size_t i : order) sorted.push_back(std::move(nodes_[i]));
  nodes_ = std::move(sorted);
}

void Graph::remove_unused_values() {
  std::vector<std::unique_ptr<Value>> kept;
  for (auto& v : values_) {
    bool used = v->producer_ || !v->uses_.empty() || v->is_input_ || v->is_output_ || v->has_initializer();
    if (used) {
      kept.push_back(std::move(v));
    } else {
      by_name_.erase(v->name());
    }
  }
  values_ = std::move(kept);
}

size_t Graph::remove_dead_nodes() {
  size_t removed = 0;
  bool changed = true;
  while (changed) {
    changed = false;
    for (size_t i = nodes_.size(); i-- > 0;) {
      Node* node = nodes_[i].get();
      bool live = false;
      for (Value* v : node->outputs_)
        if (v && (!v->uses_.empty() || v->is_output_)) live = true;
      // Outputs read by subgraphs by name count as uses too.
      if (!live) {
        for (Value* v : node->outputs_) {
          if (!v) continue;
          for (const auto& other : nodes_)
            for (Graph* sub : other->subgraphs()) {
              std::set<std::string> refs;
              collect_outer_refs(*sub, refs);
              if (refs.count(v->name())) live = true;
            }
        }
      }
      if (!live) {
        remove_node(node);
        ++removed;
        changed = true;
      }
    }
  }
  remove_unused_values();
  return removed;
}

std::unique_ptr<Graph> Graph::clone(Graph* parent) const {
  auto g = std::make_unique<Graph>(name, parent);
  g->doc_string = doc_string;
  g->sparse_initializers = sparse_initializers;
  g->quantization_annotations = quantization_annotations;
  g->name_counter_ = name_counter_;
  for (const auto& v : values_) {
    Value* c = g->new_value(v->name());
    c->type = v->type;
    c->doc_string = v->doc_string;
    c->outer_scope_ = v->outer_scope_;
  }
  for (Value* v : initializers_) g->set_initializer(g->find(v->name()), v->initializer_);
  for (Value* v : inputs_) g->add_input(g->find(v->name()));
  for (const auto& node : nodes_) {
    std::vector<Value*> ins, outs;
    for (Value* v : node->inputs_) ins.push_back(v ? g->find(v->name()) : nullptr);
    for (Value* v : node->outputs_) outs.push_back(v ? g->find(v->name()) : nullptr);
    Node* c = g->add_node(node->op_type, ins, outs, node->name, node->domain);
    c->doc_string = node->doc_string;
    c->attributes = node->attributes;
    for (Attribute& a : c->attributes) {
      if (a.g) a.g = std::shared_ptr<Graph>(a.g->clone(g.get()));
      for (auto& sub : a.graphs)
        if (sub) sub = std::shared_ptr<Graph>(sub->clone(g.get()));
    }
  }
  for (Value* v : outputs_) g->add_output(g->find(v->name()));
  // Types set by set_initializer may differ from the declared ones; restore declarations.
  for (const auto& v : values_) g->find(v->name())->type = v->type;
  return g;
}

// ---------------------------------------------------------------- Model

Model::Model() : graph(std::make_unique<Graph>("main")) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

std::string canonical_domain(std::string_view domain) {
  if (domain == "ai.onnx") return "";
  return std::string(domain);
}

int64_t Model::opset(std::string_view d) const {
  std::string want = canonical_domain(d);
  for (const OpsetId& o : opset_imports)
    if (canonical_domain(o.domain) == want) return o.version;
  return 0;
}

void Model::set_opset(const std::string& d, int64_t version) {
  std::string want = canonical_domain(d);
  for (OpsetId& o : opset_imports) {
    if (canonical_domain(o.domain) == want) {
      o.version = version;
      return;
    }
  }
  opset_imports.push_back(OpsetId{want, version});
}

void Model::set_metadata(const std::string& key, const std::string& value) {
  for (auto& [k, v] : metadata) {
    if (k == key) {
      v = value;
      return;
    }
  }
  metadata.emplace_back(key, value);
}

std::string Model::get_metadata(const std::string& key) const {
  for (const auto& [k, v] : metadata)
    if (k == key) return v;
  return {};
}

Model Model::clone() const {
  Model m;
  m.ir_version = ir_version;
  m.opset_imports = opset_imports;
  m.producer_name = producer_name;
  m.producer_version = producer_version;
  m.domain = domain;
  m.model_version = model_version;
  m.doc_string = doc_string;
  m.metadata = metadata;
  m.graph = graph->clone(nullptr);
  m.functions = functions;
  m.training_info = training_info;
  m.path = path;
  m.external_files = external_files;
  return m;
}

}  // namespace mpq::ir
