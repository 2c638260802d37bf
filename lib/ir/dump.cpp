#include "ir/dump.h"

#include <fmt/format.h>

#include <cmath>
#include <sstream>

namespace mpq::ir {

namespace {

void fnv(uint64_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string fmt_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{:.6g}", v);
}

std::string tensor_summary(const Tensor& t, const DumpOptions& o) {
  if (!t.defined()) return "<none>";
  std::string s = fmt::format("{}{} #{:016x}", dtype_name(t.dtype()), shape_str(t.shape()), tensor_digest(t));
  if (o.max_values <= 0 || t.numel() == 0 || !t.is_host()) return s;
  std::vector<std::string> vals;
  int64_t n = std::min<int64_t>(t.numel(), o.max_values);
  for (int64_t i = 0; i < n; ++i) {
    if (t.dtype() == DType::String) vals.push_back(quote(t.strings()[static_cast<size_t>(i)]));
    else if (dtype_is_float(t.dtype())) vals.push_back(fmt_float(t.get_double(i)));
    else if (dtype_is_integer(t.dtype()) && dtype_bits(t.dtype()) >= 8) vals.push_back(std::to_string(t.get_int64(i)));
    else if (t.dtype() == DType::Bool) vals.push_back(t.get_int64(i) ? "true" : "false");
    else break;
  }
  if (vals.empty()) return s;
  return s + fmt::format(" {{{}{}}}", fmt::join(vals, ", "), t.numel() > n ? ", ..." : "");
}

class Dumper {
 public:
  explicit Dumper(const DumpOptions& o) : o_(o) {}

  void graph(const Graph& g, int indent) {
    std::string pad(static_cast<size_t>(indent), ' ');
    out_ << "graph " << quote(g.name) << " {\n";
    std::string in = pad + "  ";
    if (o_.show_doc_strings && !g.doc_string.empty()) out_ << in << "doc " << quote(g.doc_string) << "\n";
    for (Value* v : g.inputs()) {
      out_ << in << "input " << v->name() << ": " << v->type.str();
      doc(*v);
      out_ << "\n";
    }
    for (Value* v : g.initializers()) {
      out_ << in << "init " << v->name() << ": " << tensor_summary(v->initializer(), o_);
      if (o_.show_types && v->type != ValueType::tensor(v->initializer().dtype(), v->initializer().shape()))
        out_ << " declared " << v->type.str();
      out_ << "\n";
    }
    for (const std::string& s : g.sparse_initializers) out_ << in << "sparse_init #" << digest(s) << "\n";
    for (const std::string& s : g.quantization_annotations) out_ << in << "quant_annotation #" << digest(s) << "\n";
    for (const auto& n : g.nodes()) node(*n, indent + 2);
    for (Value* v : g.outputs()) {
      out_ << in << "output " << v->name();
      if (o_.show_types) out_ << ": " << v->type.str();
      doc(*v);
      out_ << "\n";
    }
    out_ << pad << "}";
  }

  std::string str() const { return out_.str(); }
  std::ostringstream& out() { return out_; }

 private:
  static std::string digest(const std::string& bytes) {
    uint64_t h = 0xcbf29ce484222325ull;
    fnv(h, bytes.data(), bytes.size());
    return fmt::format("{:016x}", h);
  }

  void doc(const Value& v) {
    if (o_.show_doc_strings && !v.doc_string.empty()) out_ << " doc " << quote(v.doc_string);
  }

  void node(const Node& n, int indent) {
    std::string pad(static_cast<size_t>(indent), ' ');
    out_ << pad;
    std::vector<std::string> outs;
    for (Value* v : n.outputs()) {
      if (!v) {
        outs.push_back("_");
        continue;
      }
      std::string s = v->name();
      if (o_.show_types && !v->type.is_unknown()) s += ": " + v->type.str();
      if (o_.show_doc_strings && !v->doc_string.empty()) s += " doc " + quote(v->doc_string);
      outs.push_back(s);
    }
    out_ << fmt::format("{}", fmt::join(outs, ", ")) << " = ";
    if (!n.domain.empty()) out_ << n.domain << "::";
    out_ << n.op_type;
    if (!n.name.empty()) out_ << " " << quote(n.name);
    std::vector<std::string> ins;
    for (Value* v : n.inputs()) ins.push_back(v ? (v->is_outer_scope() ? "^" + v->name() : v->name()) : "_");
    out_ << " (" << fmt::format("{}", fmt::join(ins, ", ")) << ")";
    if (!n.attributes.empty()) {
      out_ << " {";
      for (size_t i = 0; i < n.attributes.size(); ++i) {
        if (i) out_ << ", ";
        attribute(n.attributes[i], indent);
      }
      out_ << "}";
    }
    if (o_.show_doc_strings && !n.doc_string.empty()) out_ << " doc " << quote(n.doc_string);
    out_ << "\n";
  }

  void attribute(const Attribute& a, int indent) {
    out_ << a.name << ": " << attr_type_name(a.type);
    if (!a.ref_attr_name.empty()) out_ << " ref " << a.ref_attr_name;
    switch (a.type) {
      case AttrType::Float: out_ << " " << fmt_float(a.f); break;
      case AttrType::Int: out_ << " " << a.i; break;
      case AttrType::String: out_ << " " << quote(a.s); break;
      case AttrType::Tensor: out_ << " " << tensor_summary(a.t, o_); break;
      case AttrType::Graph: out_ << " "; graph(*a.g, indent + 2); break;
      case AttrType::Floats: {
        std::vector<std::string> v;
        for (float f : a.floats) v.push_back(fmt_float(f));
        out_ << " [" << fmt::format("{}", fmt::join(v, ",")) << "]";
        break;
      }
      case AttrType::Ints: out_ << " [" << fmt::format("{}", fmt::join(a.ints, ",")) << "]"; break;
      case AttrType::Strings: {
        std::vector<std::string> v;
        for (const auto& s : a.strings) v.push_back(quote(s));
        out_ << " [" << fmt::format("{}", fmt::join(v, ",")) << "]";
        break;
      }
      case AttrType::Tensors:
        out_ << " [";
        for (size_t i = 0; i < a.tensors.size(); ++i) out_ << (i ? "; " : "") << tensor_summary(a.tensors[i], o_);
        out_ << "]";
        break;
      case AttrType::Graphs:
        out_ << " [";
        for (size_t i = 0; i < a.graphs.size(); ++i) {
          if (i) out_ << "; ";
          graph(*a.graphs[i], indent + 2);
        }
        out_ << "]";
        break;
      default:
        for (const std::string& s : a.opaque) out_ << " #" << digest(s);
        break;
    }
    if (o_.show_doc_strings && !a.doc_string.empty()) out_ << " doc " << quote(a.doc_string);
  }

  DumpOptions o_;
  std::ostringstream out_;
};

}  // namespace

uint64_t tensor_digest(const Tensor& t) {
  uint64_t h = 0xcbf29ce484222325ull;
  int32_t dt = static_cast<int32_t>(t.dtype());
  fnv(h, &dt, sizeof dt);
  for (int64_t d : t.shape()) fnv(h, &d, sizeof d);
  if (t.dtype() == DType::String) {
    for (const std::string& s : t.strings()) {
      uint64_t len = s.size();
      fnv(h, &len, sizeof len);
      fnv(h, s.data(), s.size());
    }
  } else if (t.is_host() && t.raw_data()) {
    fnv(h, t.raw_data(), t.nbytes());
  }
  return h;
}

std::string dump(const Graph& g, const DumpOptions& o) {
  Dumper d(o);
  d.graph(g, 0);
  return d.str() + "\n";
}

std::string dump(const Model& m, const DumpOptions& o) {
  Dumper d(o);
  auto& out = d.out();
  std::vector<std::string> opsets;
  for (const OpsetId& op : m.opset_imports)
    opsets.push_back(fmt::format("{}:{}", op.domain.empty() ? "ai.onnx" : op.domain, op.version));
  out << "model ir_version=" << m.ir_version << " opsets=[" << fmt::format("{}", fmt::join(opsets, ", ")) << "]";
  if (!m.producer_name.empty() || !m.producer_version.empty())
    out << " producer=" << quote(m.producer_name) << " " << quote(m.producer_version);
  if (!m.domain.empty()) out << " domain=" << quote(m.domain);
  if (m.model_version) out << " model_version=" << m.model_version;
  out << "\n";
  if (o.show_doc_strings && !m.doc_string.empty()) out << "doc " << quote(m.doc_string) << "\n";
  for (const auto& [k, v] : m.metadata) out << "metadata " << quote(k) << " = " << quote(v) << "\n";
  for (const std::string& f : m.functions) {
    uint64_t h = 0xcbf29ce484222325ull;
    fnv(h, f.data(), f.size());
    out << fmt::format("function #{:016x}\n", h);
  }
  for (const std::string& t : m.training_info) {
    uint64_t h = 0xcbf29ce484222325ull;
    fnv(h, t.data(), t.size());
    out << fmt::format("training_info #{:016x}\n", h);
  }
  d.graph(*m.graph, 0);
  return d.str() + "\n";
}

}  // namespace mpq::ir
