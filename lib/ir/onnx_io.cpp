#include "ir/onnx_io.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <climits>
#include <cstring>
#include <fstream>
#include <unordered_set>

#include "core/error.h"
#include "core/file_io.h"
#include "ir/onnx_proto.h"

namespace mpq::ir {

namespace {

constexpr uint64_t kProtobufLimit = (uint64_t(1) << 31) - 1;

// ---------------------------------------------------------------- tensors

template <typename Field>
void check_count(const onnx::TensorProto& p, const Field& field, int64_t expected, const char* field_name) {
  if (static_cast<int64_t>(field.size()) != expected)
    fail_input("tensor '{}': {} holds {} values, its shape needs {}", p.name(), field_name, field.size(), expected);
}

bool is_safe_relative(const std::string& location) {
  if (location.empty()) return false;
  fs::path p(location);
  if (p.is_absolute()) return false;
  return true;
}

}  // namespace

std::shared_ptr<void> ExternalDataReader::read(const std::string& tensor_name, const std::string& location,
                                               int64_t offset, int64_t length, size_t expected_bytes) {
  if (!is_safe_relative(location))
    fail_input("tensor '{}': external data location '{}' must be a relative path inside the model's folder",
               tensor_name, location);
  std::error_code ec;
  fs::path base = fs::weakly_canonical(base_dir_.empty() ? fs::current_path() : base_dir_, ec);
  fs::path full = fs::weakly_canonical(base / location, ec);
  auto rel = full.lexically_relative(base);
  if (ec || rel.empty() || rel.native().starts_with("..") || rel.is_absolute())
    fail_input("tensor '{}': external data location '{}' escapes the model's folder {}", tensor_name, location,
               base.string());
  auto it = files_.find(full.string());
  if (it == files_.end()) {
    if (!fs::is_regular_file(full, ec))
      fail_input("tensor '{}': external data file '{}' not found beside the model", tensor_name, location);
    it = files_.emplace(full.string(), MappedFile::open(full)).first;
  }
  const MappedFile& file = *it->second;
  if (offset < 0) fail_input("tensor '{}': negative external data offset {}", tensor_name, offset);
  uint64_t off = static_cast<uint64_t>(offset);
  uint64_t len = length < 0 ? (off <= file.size() ? file.size() - off : 0) : static_cast<uint64_t>(length);
  if (off + len > file.size())
    fail_input("tensor '{}': external data [{}, {}) lies beyond the end of '{}' ({} bytes)", tensor_name, off,
               off + len, location, file.size());
  if (len != expected_bytes)
    fail_input("tensor '{}': external data holds {} bytes, its shape and type need {}", tensor_name, len,
               expected_bytes);
  bool counted = false;
  for (auto& [loc, n] : usage_)
    if (loc == location) {
      n += len;
      counted = true;
    }
  if (!counted) usage_.emplace_back(location, len);
  const uint8_t* src = file.data() + off;
  if (off % 64 == 0) {
    // Zero-copy: the tensor shares ownership of the mapping.
    return std::shared_ptr<void>(it->second, const_cast<uint8_t*>(src));
  }
  auto buf = host_alloc(len);
  if (len) std::memcpy(buf.get(), src, len);
  return buf;
}

Tensor tensor_from_proto(const onnx::TensorProto& p, ExternalDataReader* external) {
  if (!dtype_is_valid(p.data_type()) || p.data_type() == 0)
    fail_input("tensor '{}': unknown data type {}", p.name(), p.data_type());
  const DType dtype = static_cast<DType>(p.data_type());
  Shape shape(p.dims().begin(), p.dims().end());
  for (int64_t d : shape)
    if (d < 0) fail_input("tensor '{}': negative dimension in shape {}", p.name(), shape_str(shape));
  const int64_t n = shape_numel(shape);
  const size_t bytes = dtype_storage_bytes(dtype, n);

  if (p.data_location() == onnx::TensorProto_DataLocation_EXTERNAL) {
    if (dtype == DType::String) fail_input("tensor '{}': string tensors cannot use external data", p.name());
    if (!external) fail_input("tensor '{}': uses external data, which is not available here", p.name());
    std::string location;
    int64_t offset = 0, length = -1;
    for (const auto& kv : p.external_data()) {
      try {
        if (kv.key() == "location") location = kv.value();
        else if (kv.key() == "offset") offset = std::stoll(kv.value());
        else if (kv.key() == "length") length = std::stoll(kv.value());
      } catch (const std::exception&) {
        fail_input("tensor '{}': external data {} '{}' is not a number", p.name(), kv.key(), kv.value());
      }
    }
    return Tensor::wrap(dtype, shape, external->read(p.name(), location, offset, length, bytes));
  }

  if (dtype == DType::String) {
    check_count(p, p.string_data(), n, "string_data");
    return Tensor::from_strings(shape, std::vector<std::string>(p.string_data().begin(), p.string_data().end()));
  }

  Tensor t(dtype, shape);
  uint8_t* dst = static_cast<uint8_t*>(t.raw_data());
  if (p.has_raw_data()) {
    if (p.raw_data().size() != bytes)
      fail_input("tensor '{}': raw_data holds {} bytes, its shape {} of {} needs {}", p.name(), p.raw_data().size(),
                 shape_str(shape), dtype_name(dtype), bytes);
    if (bytes) std::memcpy(dst, p.raw_data().data(), bytes);
    return t;
  }
  switch (dtype) {
    case DType::Float32:
      check_count(p, p.float_data(), n, "float_data");
      if (n) std::memcpy(dst, p.float_data().data(), bytes);
      break;
    case DType::Complex64:
      check_count(p, p.float_data(), 2 * n, "float_data");
      if (n) std::memcpy(dst, p.float_data().data(), bytes);
      break;
    case DType::Float64:
      check_count(p, p.double_data(), n, "double_data");
      if (n) std::memcpy(dst, p.double_data().data(), bytes);
      break;
    case DType::Complex128:
      check_count(p, p.double_data(), 2 * n, "double_data");
      if (n) std::memcpy(dst, p.double_data().data(), bytes);
      break;
    case DType::Int64:
      check_count(p, p.int64_data(), n, "int64_data");
      if (n) std::memcpy(dst, p.int64_data().data(), bytes);
      break;
    case DType::UInt32:
    case DType::UInt64: {
      check_count(p, p.uint64_data(), n, "uint64_data");
      for (int64_t i = 0; i < n; ++i) {
        uint64_t v = p.uint64_data(static_cast<int>(i));
        if (dtype == DType::UInt32) {
          uint32_t w = static_cast<uint32_t>(v);
          std::memcpy(dst + 4 * i, &w, 4);
        } else {
          std::memcpy(dst + 8 * i, &v, 8);
        }
      }
      break;
    }
    case DType::Int4:
    case DType::UInt4: {
      // Two elements per int32 entry, first in the low nibble.
      check_count(p, p.int32_data(), static_cast<int64_t>(bytes), "int32_data");
      for (size_t i = 0; i < bytes; ++i) dst[i] = static_cast<uint8_t>(p.int32_data(static_cast<int>(i)));
      break;
    }
    default: {
      // int32, int16, int8, uint16, uint8, bool, float16, bfloat16, float8: one value per int32,
      // half types as their bit patterns.
      check_count(p, p.int32_data(), n, "int32_data");
      const int width = dtype_bits(dtype) / 8;
      for (int64_t i = 0; i < n; ++i) {
        int32_t v = p.int32_data(static_cast<int>(i));
        if (width == 1) {
          dst[i] = static_cast<uint8_t>(v);
        } else if (width == 2) {
          uint16_t w = static_cast<uint16_t>(v);
          std::memcpy(dst + 2 * i, &w, 2);
        } else {
          std::memcpy(dst + 4 * i, &v, 4);
        }
      }
      if (dtype == DType::Bool)
        for (int64_t i = 0; i < n; ++i) dst[i] = dst[i] ? 1 : 0;
      break;
    }
  }
  return t;
}

void tensor_to_proto(const Tensor& t, onnx::TensorProto* p, const ExternalDataSink* sink) {
  p->set_data_type(static_cast<int32_t>(t.dtype()));
  p->clear_dims();
  for (int64_t d : t.shape()) p->add_dims(d);
  if (t.dtype() == DType::String) {
    for (const std::string& s : t.strings()) p->add_string_data(s);
    return;
  }
  if (!t.is_host()) fail_internal("tensor_to_proto: tensor '{}' is on a device", p->name());
  if (sink && (*sink)(t, p)) return;
  p->set_raw_data(t.raw_data(), t.nbytes());
}

// ---------------------------------------------------------------- types

namespace {

ValueType type_from_proto(const onnx::TypeProto& tp) {
  ValueType vt;
  if (tp.has_tensor_type()) {
    const auto& tt = tp.tensor_type();
    vt.kind = ValueType::Kind::Tensor;
    vt.elem = dtype_is_valid(tt.elem_type()) ? static_cast<DType>(tt.elem_type()) : DType::Undefined;
    if (tt.has_shape()) {
      vt.has_shape = true;
      for (const auto& d : tt.shape().dim()) {
        if (d.has_dim_value()) vt.dims.push_back(Dim::fixed(d.dim_value()));
        else if (d.has_dim_param()) vt.dims.push_back(Dim::symbol(d.dim_param()));
        else vt.dims.push_back(Dim{});
      }
    }
    return vt;
  }
  if (tp.value_case() == onnx::TypeProto::VALUE_NOT_SET) return vt;
  vt.kind = ValueType::Kind::Other;
  vt.other = tp.SerializeAsString();
  return vt;
}

void type_to_proto(const ValueType& vt, onnx::TypeProto* tp) {
  if (vt.kind == ValueType::Kind::Other) {
    tp->ParseFromString(vt.other);
    return;
  }
  if (vt.kind != ValueType::Kind::Tensor) return;
  auto* tt = tp->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(vt.elem));
  if (!vt.has_shape) return;
  auto* shape = tt->mutable_shape();
  for (const Dim& d : vt.dims) {
    auto* pd = shape->add_dim();
    if (d.known()) pd->set_dim_value(d.value);
    else if (!d.param.empty()) pd->set_dim_param(d.param);
  }
}

// ---------------------------------------------------------------- graphs

class Importer {
 public:
  Importer(const fs::path& base_dir, std::string label) : external_(base_dir), label_(std::move(label)) {}

  std::unique_ptr<Graph> import_graph(const onnx::GraphProto& gp, Graph* parent) {
    auto g = std::make_unique<Graph>(gp.name(), parent);
    g->doc_string = gp.doc_string();
    std::unordered_set<std::string> seen_inputs;
    for (const auto& vi : gp.input()) {
      if (vi.name().empty()) fail_input("{}: graph '{}' has an input without a name", label_, gp.name());
      if (!seen_inputs.insert(vi.name()).second)
        fail_input("{}: graph '{}' lists input '{}' twice", label_, gp.name(), vi.name());
      Value* v = g->add_value(vi.name(), type_from_proto(vi.type()));
      v->doc_string = vi.doc_string();
      g->add_input(v);
    }
    for (const auto& tp : gp.initializer()) {
      if (tp.name().empty()) fail_input("{}: graph '{}' has an initializer without a name", label_, gp.name());
      Value* v = g->find(tp.name());
      if (v && v->has_initializer())
        fail_input("{}: initializer '{}' is defined twice", label_, tp.name());
      Tensor t = tensor_from_proto(tp, &external_);
      if (!v) v = g->add_value(tp.name());
      ValueType declared = v->type;
      g->set_initializer(v, std::move(t));
      if (v->is_graph_input() && declared.is_tensor()) v->type = declared;
    }
    for (const auto& sp : gp.sparse_initializer()) g->sparse_initializers.push_back(sp.SerializeAsString());
    for (const auto& qa : gp.quantization_annotation()) g->quantization_annotations.push_back(qa.SerializeAsString());

    // Every node output first, so nodes may appear in any order in the file.
    for (const auto& np : gp.node()) {
      for (const std::string& out : np.output()) {
        if (out.empty()) continue;
        if (Value* existing = g->find(out)) {
          if (existing->is_graph_input())
            fail_input("{}: value '{}' is both a graph input and an output of node '{}'", label_, out, np.name());
          if (existing->has_initializer())
            fail_input("{}: value '{}' is both an initializer and an output of node '{}'", label_, out, np.name());
          fail_input("{}: value '{}' is produced by more than one node (again by {} node '{}')", label_, out,
                     np.op_type(), np.name());
        }
        g->add_value(out);
      }
    }
    for (const auto& np : gp.node()) import_node(np, *g);

    for (const auto& vi : gp.value_info()) {
      Value* v = g->find(vi.name());
      if (!v || v->is_outer_scope()) continue;
      v->type = type_from_proto(vi.type());
      v->doc_string = vi.doc_string();
    }
    for (const auto& vi : gp.output()) {
      Value* v = g->find(vi.name());
      if (!v && parent) {
        if (!parent->find_in_scope(vi.name()))
          fail_input("{}: graph '{}' output '{}' is not defined", label_, gp.name(), vi.name());
        v = g->add_outer_scope_value(vi.name());
      }
      if (!v) fail_input("{}: graph output '{}' is not produced by any node, input or initializer", label_, vi.name());
      if (vi.has_type() && !v->is_outer_scope()) v->type = type_from_proto(vi.type());
      if (!vi.doc_string().empty()) v->doc_string = vi.doc_string();
      g->add_output(v);
    }
    return g;
  }

  ExternalDataReader& external() { return external_; }

 private:
  void import_node(const onnx::NodeProto& np, Graph& g) {
    std::vector<Value*> inputs;
    for (const std::string& in : np.input()) {
      if (in.empty()) {
        inputs.push_back(nullptr);
        continue;
      }
      Value* v = g.find(in);
      if (!v && g.parent() && g.parent()->find_in_scope(in)) v = g.add_outer_scope_value(in);
      if (!v)
        fail_input("{}: {} node '{}' reads '{}', which no node, graph input or initializer defines", label_,
                   np.op_type(), np.name(), in);
      inputs.push_back(v);
    }
    std::vector<Value*> outputs;
    for (const std::string& out : np.output()) outputs.push_back(out.empty() ? nullptr : g.find(out));
    Node* n = g.add_node(np.op_type(), inputs, outputs, np.name(), np.domain());
    n->doc_string = np.doc_string();
    for (const auto& ap : np.attribute()) n->attributes.push_back(import_attribute(ap, g, *n));
  }

  Attribute import_attribute(const onnx::AttributeProto& ap, Graph& g, const Node& n) {
    Attribute a;
    a.name = ap.name();
    a.type = static_cast<AttrType>(ap.type());
    a.ref_attr_name = ap.ref_attr_name();
    a.doc_string = ap.doc_string();
    if (a.type == AttrType::Undefined) {
      // Old exporters leave `type` unset; infer it from the field that is filled.
      if (ap.has_f()) a.type = AttrType::Float;
      else if (ap.has_i()) a.type = AttrType::Int;
      else if (ap.has_s()) a.type = AttrType::String;
      else if (ap.has_t()) a.type = AttrType::Tensor;
      else if (ap.has_g()) a.type = AttrType::Graph;
      else if (ap.floats_size()) a.type = AttrType::Floats;
      else if (ap.ints_size()) a.type = AttrType::Ints;
      else if (ap.strings_size()) a.type = AttrType::Strings;
      else if (ap.tensors_size()) a.type = AttrType::Tensors;
      else if (ap.graphs_size()) a.type = AttrType::Graphs;
    }
    try {
      switch (a.type) {
        case AttrType::Float: a.f = ap.f(); break;
        case AttrType::Int: a.i = ap.i(); break;
        case AttrType::String: a.s = ap.s(); break;
        case AttrType::Tensor: a.t = tensor_from_proto(ap.t(), &external_); break;
        case AttrType::Graph: a.g = std::shared_ptr<Graph>(import_graph(ap.g(), &g)); break;
        case AttrType::Floats: a.floats.assign(ap.floats().begin(), ap.floats().end()); break;
        case AttrType::Ints: a.ints.assign(ap.ints().begin(), ap.ints().end()); break;
        case AttrType::Strings: a.strings.assign(ap.strings().begin(), ap.strings().end()); break;
        case AttrType::Tensors:
          for (const auto& t : ap.tensors()) a.tensors.push_back(tensor_from_proto(t, &external_));
          break;
        case AttrType::Graphs:
          for (const auto& sg : ap.graphs()) a.graphs.push_back(std::shared_ptr<Graph>(import_graph(sg, &g)));
          break;
        case AttrType::SparseTensor: a.opaque.push_back(ap.sparse_tensor().SerializeAsString()); break;
        case AttrType::SparseTensors:
          for (const auto& s : ap.sparse_tensors()) a.opaque.push_back(s.SerializeAsString());
          break;
        case AttrType::TypeProto: a.opaque.push_back(ap.tp().SerializeAsString()); break;
        case AttrType::TypeProtos:
          for (const auto& s : ap.type_protos()) a.opaque.push_back(s.SerializeAsString());
          break;
        default:
          if (a.ref_attr_name.empty())
            fail_input("{}: {}: attribute '{}' has unknown type {}", label_, n.label(), a.name, static_cast<int>(ap.type()));
      }
    } catch (const Error& e) {
      if (a.type == AttrType::Graph || a.type == AttrType::Graphs) throw;
      fail_input("{}: {}: attribute '{}': {}", label_, n.label(), a.name, e.what());
    }
    return a;
  }

  ExternalDataReader external_;
  std::string label_;
};

class Exporter {
 public:
  explicit Exporter(const ExternalDataSink* sink) : sink_(sink) {}

  void export_graph(const Graph& g, onnx::GraphProto* gp) {
    gp->set_name(g.name);
    if (!g.doc_string.empty()) gp->set_doc_string(g.doc_string);
    for (Value* v : g.inputs()) value_info(*v, gp->add_input());
    for (Value* v : g.initializers()) {
      auto* tp = gp->add_initializer();
      tp->set_name(v->name());
      tensor_to_proto(v->initializer(), tp, sink_);
    }
    for (const std::string& s : g.sparse_initializers) gp->add_sparse_initializer()->ParseFromString(s);
    for (const std::string& s : g.quantization_annotations) gp->add_quantization_annotation()->ParseFromString(s);
    for (const auto& node : g.nodes()) export_node(*node, gp->add_node());
    for (Value* v : g.values()) {
      if (v->is_graph_input() || v->is_graph_output() || v->has_initializer() || v->is_outer_scope()) continue;
      if (v->type.is_unknown() && v->doc_string.empty()) continue;
      if (!v->producer()) continue;
      value_info(*v, gp->add_value_info());
    }
    for (Value* v : g.outputs()) value_info(*v, gp->add_output());
  }

 private:
  void value_info(const Value& v, onnx::ValueInfoProto* vi) {
    vi->set_name(v.name());
    if (!v.doc_string.empty()) vi->set_doc_string(v.doc_string);
    if (!v.type.is_unknown()) type_to_proto(v.type, vi->mutable_type());
  }

  void export_node(const Node& n, onnx::NodeProto* np) {
    np->set_op_type(n.op_type);
    if (!n.name.empty()) np->set_name(n.name);
    if (!n.domain.empty()) np->set_domain(n.domain);
    if (!n.doc_string.empty()) np->set_doc_string(n.doc_string);
    for (Value* v : n.inputs()) np->add_input(v ? v->name() : std::string());
    for (Value* v : n.outputs()) np->add_output(v ? v->name() : std::string());
    for (const Attribute& a : n.attributes) export_attribute(a, np->add_attribute());
  }

  void export_attribute(const Attribute& a, onnx::AttributeProto* ap) {
    ap->set_name(a.name);
    ap->set_type(static_cast<onnx::AttributeProto_AttributeType>(a.type));
    if (!a.ref_attr_name.empty()) ap->set_ref_attr_name(a.ref_attr_name);
    if (!a.doc_string.empty()) ap->set_doc_string(a.doc_string);
    switch (a.type) {
      case AttrType::Float: ap->set_f(a.f); break;
      case AttrType::Int: ap->set_i(a.i); break;
      case AttrType::String: ap->set_s(a.s); break;
      case AttrType::Tensor: tensor_to_proto(a.t, ap->mutable_t(), nullptr); break;
      case AttrType::Graph: export_graph(*a.g, ap->mutable_g()); break;
      case AttrType::Floats: for (float f : a.floats) ap->add_floats(f); break;
      case AttrType::Ints: for (int64_t i : a.ints) ap->add_ints(i); break;
      case AttrType::Strings: for (const auto& s : a.strings) ap->add_strings(s); break;
      case AttrType::Tensors: for (const auto& t : a.tensors) tensor_to_proto(t, ap->add_tensors(), nullptr); break;
      case AttrType::Graphs: for (const auto& g : a.graphs) export_graph(*g, ap->add_graphs()); break;
      case AttrType::SparseTensor: ap->mutable_sparse_tensor()->ParseFromString(a.opaque.at(0)); break;
      case AttrType::SparseTensors: for (const auto& s : a.opaque) ap->add_sparse_tensors()->ParseFromString(s); break;
      case AttrType::TypeProto: ap->mutable_tp()->ParseFromString(a.opaque.at(0)); break;
      case AttrType::TypeProtos: for (const auto& s : a.opaque) ap->add_type_protos()->ParseFromString(s); break;
      default: break;
    }
  }

  const ExternalDataSink* sink_;
};

}  // namespace

Model model_from_proto(const onnx::ModelProto& mp, const fs::path& base_dir, const std::string& label) {
  if (!mp.has_graph()) fail_input("{}: not an ONNX model (no graph)", label);
  if (mp.ir_version() <= 0) fail_input("{}: not an ONNX model (ir_version missing)", label);
  Model m;
  m.ir_version = mp.ir_version();
  for (const auto& o : mp.opset_import()) m.opset_imports.push_back(OpsetId{canonical_domain(o.domain()), o.version()});
  m.producer_name = mp.producer_name();
  m.producer_version = mp.producer_version();
  m.domain = mp.domain();
  m.model_version = mp.model_version();
  m.doc_string = mp.doc_string();
  for (const auto& kv : mp.metadata_props()) m.metadata.emplace_back(kv.key(), kv.value());
  for (const auto& f : mp.functions()) m.functions.push_back(f.SerializeAsString());
  for (const auto& t : mp.training_info()) m.training_info.push_back(t.SerializeAsString());
  Importer importer(base_dir, label);
  m.graph = importer.import_graph(mp.graph(), nullptr);
  m.external_files = importer.external().usage();
  return m;
}

void model_to_proto(const Model& m, onnx::ModelProto* mp, const ExternalDataSink* sink) {
  mp->set_ir_version(m.ir_version);
  for (const OpsetId& o : m.opset_imports) {
    auto* op = mp->add_opset_import();
    op->set_domain(o.domain);
    op->set_version(o.version);
  }
  if (!m.producer_name.empty()) mp->set_producer_name(m.producer_name);
  if (!m.producer_version.empty()) mp->set_producer_version(m.producer_version);
  if (!m.domain.empty()) mp->set_domain(m.domain);
  if (m.model_version) mp->set_model_version(m.model_version);
  if (!m.doc_string.empty()) mp->set_doc_string(m.doc_string);
  for (const auto& [k, v] : m.metadata) {
    auto* kv = mp->add_metadata_props();
    kv->set_key(k);
    kv->set_value(v);
  }
  for (const std::string& f : m.functions) mp->add_functions()->ParseFromString(f);
  for (const std::string& t : m.training_info) mp->add_training_info()->ParseFromString(t);
  Exporter exporter(sink);
  exporter.export_graph(*m.graph, mp->mutable_graph());
}

Model parse_model(const std::string& bytes, const fs::path& base_dir, const std::string& label) {
  if (bytes.empty()) fail_input("{}: empty file, not an ONNX model", label);
  onnx::ModelProto mp;
  google::protobuf::io::ArrayInputStream raw(bytes.data(), static_cast<int>(std::min<size_t>(bytes.size(), INT_MAX)));
  google::protobuf::io::CodedInputStream coded(&raw);
  coded.SetTotalBytesLimit(INT_MAX);
  if (bytes.size() > kProtobufLimit || !mp.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage())
    fail_input("{}: not a valid ONNX model (protobuf parse failed: truncated or not ONNX)", label);
  return model_from_proto(mp, base_dir, label);
}

Model load_model(const fs::path& path) {
  std::string bytes = read_file_bytes(path);
  fs::path base = path.has_parent_path() ? path.parent_path() : fs::path(".");
  Model m = parse_model(bytes, base, path.string());
  m.path = path;
  return m;
}

namespace {

uint64_t initializer_bytes(const Graph& g) {
  uint64_t total = 0;
  for (Value* v : g.initializers()) total += v->initializer().nbytes();
  for (const auto& n : g.nodes())
    for (Graph* sub : n->subgraphs()) total += initializer_bytes(*sub);
  return total;
}

}  // namespace

void save_model(const Model& model, const fs::path& path, const SaveOptions& options) {
  bool external = options.external == ExternalData::Always ||
                  (options.external == ExternalData::Auto && initializer_bytes(*model.graph) > kProtobufLimit * 9 / 10);
  if (!external) {
    onnx::ModelProto mp;
    model_to_proto(model, &mp, nullptr);
    if (mp.ByteSizeLong() > kProtobufLimit)
      fail_input("{}: model is over protobuf's 2 GB limit; save it with external data", path.string());
    write_file_atomic(path, [&](std::ostream& out) {
      if (!mp.SerializeToOstream(&out)) fail_internal("{}: protobuf serialization failed", path.string());
    });
    return;
  }
  // Tensor bytes go to "<file name>.data" beside the model, each at a 64-byte aligned offset.
  const std::string data_name = path.filename().string() + ".data";
  const fs::path data_path = (path.has_parent_path() ? path.parent_path() : fs::path(".")) / data_name;
  onnx::ModelProto mp;
  write_file_atomic(data_path, [&](std::ostream& data_out) {
    uint64_t offset = 0;
    ExternalDataSink sink = [&](const Tensor& t, onnx::TensorProto* p) {
      if (t.nbytes() < options.external_min_bytes) return false;
      uint64_t pad = (64 - offset % 64) % 64;
      static const char zeros[64] = {};
      data_out.write(zeros, static_cast<std::streamsize>(pad));
      offset += pad;
      data_out.write(static_cast<const char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes()));
      p->set_data_location(onnx::TensorProto_DataLocation_EXTERNAL);
      auto add = [&](const char* k, const std::string& v) {
        auto* kv = p->add_external_data();
        kv->set_key(k);
        kv->set_value(v);
      };
      add("location", data_name);
      add("offset", std::to_string(offset));
      add("length", std::to_string(t.nbytes()));
      offset += t.nbytes();
      return true;
    };
    model_to_proto(model, &mp, &sink);
  });
  if (mp.ByteSizeLong() > kProtobufLimit)
    fail_input("{}: model graph alone is over protobuf's 2 GB limit", path.string());
  write_file_atomic(path, [&](std::ostream& out) {
    if (!mp.SerializeToOstream(&out)) fail_internal("{}: protobuf serialization failed", path.string());
  });
}

std::string serialize_model(const Model& model) {
  onnx::ModelProto mp;
  model_to_proto(model, &mp, nullptr);
  if (mp.ByteSizeLong() > kProtobufLimit) fail_input("model is over protobuf's 2 GB limit");
  return mp.SerializeAsString();
}

Tensor load_tensor_pb(const fs::path& path, std::string* name) {
  std::string bytes = read_file_bytes(path);
  onnx::TensorProto tp;
  if (!tp.ParseFromString(bytes)) fail_input("{}: not a serialized ONNX TensorProto", path.string());
  if (name) *name = tp.name();
  ExternalDataReader external(path.has_parent_path() ? path.parent_path() : fs::path("."));
  try {
    return tensor_from_proto(tp, &external);
  } catch (const Error& e) {
    fail_input("{}: {}", path.string(), e.what());
  }
}

void save_tensor_pb(const Tensor& t, const std::string& name, const fs::path& path) {
  onnx::TensorProto tp;
  tp.set_name(name);
  tensor_to_proto(t, &tp, nullptr);
  write_file_atomic(path, tp.SerializeAsString());
}

}  // namespace mpq::ir
