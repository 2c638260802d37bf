#pragma once
// mpq's IR: a Model holds a Graph of Nodes connected by Values. ONNX protobuf appears only in
// onnx_io.cpp. Values know their producer and their uses, so passes can insert and remove nodes
// (Cast, QuantizeLinear/DequantizeLinear, fake-quant) and rewire consumers in O(uses).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mpq::ir {

class Graph;
class Node;

// One dimension of a declared shape: a number, a symbolic name ("batch"), or unknown.
struct Dim {
  int64_t value = -1;
  std::string param;
  bool known() const { return value >= 0; }
  static Dim fixed(int64_t v) { return Dim{v, {}}; }
  static Dim symbol(std::string name) { return Dim{-1, std::move(name)}; }
  bool operator==(const Dim&) const = default;
};

// Declared type of a value (from value_info, graph inputs/outputs, or shape inference).
struct ValueType {
  enum class Kind { Unknown, Tensor, Other };
  Kind kind = Kind::Unknown;
  DType elem = DType::Undefined;  // Tensor only; Undefined when the elem type is not given
  bool has_shape = false;          // Tensor only; false means rank unknown
  std::vector<Dim> dims;
  std::string other;  // serialized onnx.TypeProto for sequence/map/optional/sparse types

  static ValueType tensor(DType elem, std::vector<Dim> dims);
  static ValueType tensor(DType elem, const Shape& shape);
  static ValueType tensor_unranked(DType elem);
  bool is_tensor() const { return kind == Kind::Tensor; }
  bool is_unknown() const { return kind == Kind::Unknown; }
  // Fixed shape when every dimension is known.
  std::optional<Shape> static_shape() const;
  std::string str() const;  // "float32[N,3,224,224]", "float32[?]", "?"
  bool operator==(const ValueType&) const = default;
};

struct Use {
  Node* node;
  int input_index;
};

class Value {
 public:
  const std::string& name() const { return name_; }
  Graph* graph() const { return graph_; }
  Node* producer() const { return producer_; }
  int producer_index() const { return producer_index_; }
  const std::vector<Use>& uses() const { return uses_; }
  bool has_initializer() const { return initializer_.defined(); }
  const Tensor& initializer() const { return initializer_; }
  bool is_graph_input() const { return is_input_; }
  bool is_graph_output() const { return is_output_; }
  // Referenced inside a subgraph but defined in an enclosing graph.
  bool is_outer_scope() const { return outer_scope_; }
  // Fixed value known before running: an initializer (that is not also an overridable graph input).
  bool is_constant() const { return has_initializer() && !is_input_; }

  ValueType type;
  std::string doc_string;

 private:
  friend class Graph;
  Value(Graph* g, std::string name) : name_(std::move(name)), graph_(g) {}
  std::string name_;
  Graph* graph_;
  Node* producer_ = nullptr;
  int producer_index_ = -1;
  std::vector<Use> uses_;
  Tensor initializer_;
  bool is_input_ = false;
  bool is_output_ = false;
  bool outer_scope_ = false;
};

// ONNX's AttributeProto.AttributeType numbering.
enum class AttrType {
  Undefined = 0,
  Float = 1,
  Int = 2,
  String = 3,
  Tensor = 4,
  Graph = 5,
  Floats = 6,
  Ints = 7,
  Strings = 8,
  Tensors = 9,
  Graphs = 10,
  SparseTensor = 11,
  SparseTensors = 12,
  TypeProto = 13,
  TypeProtos = 14,
};

struct Attribute {
  std::string name;
  AttrType type = AttrType::Undefined;
  float f = 0.0f;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::shared_ptr<Graph> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<Graph>> graphs;
  // Sparse tensors and type protos are kept verbatim (serialized protos): mpq never reads them.
  std::vector<std::string> opaque;
  std::string ref_attr_name;  // inside functions: refers to the caller's attribute
  std::string doc_string;

  static Attribute make_int(std::string name, int64_t v);
  static Attribute make_float(std::string name, float v);
  static Attribute make_string(std::string name, std::string v);
  static Attribute make_ints(std::string name, std::vector<int64_t> v);
  static Attribute make_floats(std::string name, std::vector<float> v);
  static Attribute make_tensor(std::string name, Tensor v);
  static Attribute make_graph(std::string name, std::shared_ptr<Graph> v);
};

const char* attr_type_name(AttrType t);

class Node {
 public:
  std::string name;
  std::string op_type;
  std::string domain;  // "" is the default ONNX domain ("ai.onnx" is normalised to "")
  std::string doc_string;
  std::vector<Attribute> attributes;

  Graph* graph() const { return graph_; }
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  // nullptr when the optional input/output is omitted or past the end.
  Value* input(size_t i) const { return i < inputs_.size() ? inputs_[i] : nullptr; }
  Value* output(size_t i) const { return i < outputs_.size() ? outputs_[i] : nullptr; }
  size_t num_inputs() const { return inputs_.size(); }
  size_t num_outputs() const { return outputs_.size(); }

  const Attribute* attr(std::string_view name) const;
  bool has_attr(std::string_view name) const { return attr(name) != nullptr; }
  int64_t attr_int(std::string_view name, int64_t fallback) const;
  float attr_float(std::string_view name, float fallback) const;
  std::string attr_string(std::string_view name, const std::string& fallback = "") const;
  std::vector<int64_t> attr_ints(std::string_view name, const std::vector<int64_t>& fallback = {}) const;
  std::vector<float> attr_floats(std::string_view name, const std::vector<float>& fallback = {}) const;
  const Tensor* attr_tensor(std::string_view name) const;
  Graph* attr_graph(std::string_view name) const;
  void set_attr(Attribute a);  // replaces an attribute of the same name
  void remove_attr(std::string_view name);

  // "Conv node 'conv1'" (or "Conv node #12 (unnamed)") for error messages.
  std::string label() const;
  // Subgraphs held by attributes (If branches, Loop/Scan bodies).
  std::vector<Graph*> subgraphs() const;

 private:
  friend class Graph;
  explicit Node(Graph* g) : graph_(g) {}
  Graph* graph_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  int64_t index_ = 0;  // creation order, for stable sorting and unnamed labels
};

class Graph {
 public:
  explicit Graph(std::string name = {}, Graph* parent = nullptr);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  std::string name;
  std::string doc_string;
  // Kept verbatim for round-trips: serialized SparseTensorProto / TensorAnnotation.
  std::vector<std::string> sparse_initializers;
  std::vector<std::string> quantization_annotations;

  Graph* parent() const { return parent_; }
  void set_parent(Graph* p) { parent_ = p; }

  // ---- values
  Value* find(std::string_view name) const;  // this graph only
  // Search this graph, then enclosing graphs.
  Value* find_in_scope(std::string_view name) const;
  Value* add_value(const std::string& name, ValueType type = {});  // fails when the name exists
  // Reference to a value of an enclosing graph (subgraph imports).
  Value* add_outer_scope_value(const std::string& name);
  Value* add_initializer(const std::string& name, Tensor t);
  void set_initializer(Value* v, Tensor t);
  void clear_initializer(Value* v);
  // A name not used by any value in this graph, its ancestors or its subgraphs, based on `base`.
  std::string unique_name(const std::string& base);
  std::vector<Value*> values() const;  // in creation order
  // Initializers in file order (new ones appended).
  const std::vector<Value*>& initializers() const { return initializers_; }

  // ---- interface
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  void add_input(Value* v);
  void add_output(Value* v);
  void set_output(size_t i, Value* v);
  // Keeps the first `count` outputs (undoes add_output calls made after them).
  void truncate_outputs(size_t count);
  void remove_input(Value* v);
  // Graph inputs a caller must feed (inputs without an initializer default).
  std::vector<Value*> required_inputs() const;

  // ---- nodes
  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  size_t num_nodes() const { return nodes_.size(); }
  // Appends a node; outputs must not be produced by another node. nullptr entries are omitted
  // optional inputs/outputs.
  Node* add_node(std::string op_type, std::vector<Value*> inputs, std::vector<Value*> outputs,
                 std::string name = {}, std::string domain = {});
  // Convenience: creates fresh output values named from `base`.
  Node* add_node_with_new_outputs(std::string op_type, std::vector<Value*> inputs, size_t num_outputs,
                                  const std::string& base, std::string domain = {});
  void remove_node(Node* n);
  void set_node_input(Node* n, size_t i, Value* v);
  void set_node_output(Node* n, size_t i, Value* v);
  // Rewire every node input (in this graph and nested subgraphs by name) from `from` to `to`.
  // Graph outputs are not touched: their names are the model's interface.
  void replace_uses(Value* from, Value* to);
  // Stable topological order (keeps the existing order where it is already valid); throws a
  // BadInput error naming a node on the cycle when there is one.
  void topological_sort();
  // Drop values that nothing produces, uses, feeds or returns.
  void remove_unused_values();
  // Drop nodes whose outputs are unused and which are not graph outputs (iteratively).
  size_t remove_dead_nodes();

  // Deep copy (subgraphs included) with the given parent.
  std::unique_ptr<Graph> clone(Graph* parent = nullptr) const;

 private:
  void attach_input(Node* n, size_t i, Value* v);
  void detach_input(Node* n, size_t i);
  Value* new_value(const std::string& name);

  Graph* parent_;
  std::vector<std::unique_ptr<Value>> values_;
  std::unordered_map<std::string, Value*> by_name_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  std::vector<Value*> initializers_;
  std::vector<std::unique_ptr<Node>> nodes_;
  int64_t next_node_index_ = 0;
  int64_t name_counter_ = 0;
};

struct OpsetId {
  std::string domain;
  int64_t version = 0;
  bool operator==(const OpsetId&) const = default;
};

class Model {
 public:
  Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  int64_t ir_version = 8;
  std::vector<OpsetId> opset_imports;
  std::string producer_name;
  std::string producer_version;
  std::string domain;
  int64_t model_version = 0;
  std::string doc_string;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::unique_ptr<Graph> graph;
  // Kept verbatim for round-trips.
  std::vector<std::string> functions;
  std::vector<std::string> training_info;
  // Where the model was loaded from (messages, external data); empty for in-memory models.
  std::filesystem::path path;
  // External data files the loaded model read, with the bytes taken from each (for inspect).
  std::vector<std::pair<std::string, uint64_t>> external_files;

  // Version imported for a domain ("" and "ai.onnx" are the same); 0 when not imported.
  int64_t opset(std::string_view domain = "") const;
  void set_opset(const std::string& domain, int64_t version);
  void set_metadata(const std::string& key, const std::string& value);
  std::string get_metadata(const std::string& key) const;
  Model clone() const;
};

// Normalises "ai.onnx" to "".
std::string canonical_domain(std::string_view domain);

// Names a subgraph (and the subgraphs inside it) reads from enclosing scopes.
std::vector<std::string> outer_references(const Graph& subgraph);

// The constant value of `v` (an initializer that is not an overridable graph input, or a Constant
// node's `value`), or nullptr.
const Tensor* constant_value(const Value* v);

}  // namespace mpq::ir
