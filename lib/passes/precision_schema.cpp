#include "passes/precision_schema.h"

#include <onnx/defs/schema.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

#include "ir/onnx_tools.h"

namespace mpq::passes::precision {

namespace {

std::optional<DType> parse_tensor_type(const std::string& s) {
  static const std::map<std::string, DType, std::less<>> names = {
      {"tensor(float)", DType::Float32},   {"tensor(float16)", DType::Float16}, {"tensor(bfloat16)", DType::BFloat16},
      {"tensor(double)", DType::Float64},  {"tensor(int8)", DType::Int8},       {"tensor(uint8)", DType::UInt8},
      {"tensor(int16)", DType::Int16},     {"tensor(uint16)", DType::UInt16},   {"tensor(int32)", DType::Int32},
      {"tensor(uint32)", DType::UInt32},   {"tensor(int64)", DType::Int64},     {"tensor(uint64)", DType::UInt64},
      {"tensor(bool)", DType::Bool},       {"tensor(string)", DType::String},   {"tensor(complex64)", DType::Complex64},
      {"tensor(complex128)", DType::Complex128},
  };
  auto it = names.find(s);
  if (it == names.end()) return std::nullopt;
  return it->second;
}

TypeParam make_param(const onnx::OpSchema::FormalParameter& p) {
  TypeParam t;
  t.name = p.GetTypeStr();
  t.variadic = p.GetOption() == onnx::OpSchema::Variadic;
  std::vector<DType> allowed;
  for (onnx::DataType d : p.GetTypes())
    if (d)
      if (auto dt = parse_tensor_type(*d)) allowed.push_back(*dt);
  std::sort(allowed.begin(), allowed.end());
  t.allowed = std::move(allowed);
  t.f32 = t.allows(DType::Float32);
  t.f16 = t.allows(DType::Float16);
  t.bf16 = t.allows(DType::BFloat16);
  return t;
}

OpSignature build_signature(const std::string& domain, const std::string& op, int64_t opset) {
  OpSignature sig;
  const int64_t max_known = ir::libonnx_max_opset();
  int64_t version = opset;
  if (domain.empty() && version > max_known) version = max_known;
  const onnx::OpSchema* schema =
      onnx::OpSchemaRegistry::Schema(op, static_cast<int>(std::max<int64_t>(version, 1)), domain);
  if (!schema) return sig;
  sig.known = true;
  sig.since_version = schema->SinceVersion();
  for (const auto& p : schema->inputs()) sig.inputs.push_back(make_param(p));
  for (const auto& p : schema->outputs()) sig.outputs.push_back(make_param(p));
  return sig;
}

const TypeParam* param_at(const std::vector<TypeParam>& params, size_t i) {
  if (i < params.size()) return &params[i];
  if (!params.empty() && params.back().variadic) return &params.back();
  return nullptr;
}

std::optional<DType> declared(const ir::Value* v) {
  if (v->has_initializer()) return v->initializer().dtype();
  if (v->type.is_tensor() && v->type.elem != DType::Undefined) return v->type.elem;
  return std::nullopt;
}

std::optional<DType> constant_dtype(const ir::Node& n) {
  if (const Tensor* t = n.attr_tensor("value")) return t->dtype();
  if (n.has_attr("value_float") || n.has_attr("value_floats")) return DType::Float32;
  if (n.has_attr("value_int") || n.has_attr("value_ints")) return DType::Int64;
  if (n.has_attr("value_string") || n.has_attr("value_strings")) return DType::String;
  return std::nullopt;
}

std::optional<DType> attr_dtype(const ir::Node& n, const char* name) {
  if (!n.has_attr(name)) return std::nullopt;
  int64_t v = n.attr_int(name, 0);
  if (!dtype_is_valid(static_cast<int32_t>(v)) || v == 0) return std::nullopt;
  return static_cast<DType>(v);
}

std::optional<DType> body_output(const ir::Graph* body, size_t i) {
  if (!body || i >= body->outputs().size()) return std::nullopt;
  return declared(body->outputs()[i]);
}

}  // namespace

bool TypeParam::allows(DType t) const { return std::binary_search(allowed.begin(), allowed.end(), t); }

const TypeParam* OpSignature::input(size_t i) const { return param_at(inputs, i); }
const TypeParam* OpSignature::output(size_t i) const { return param_at(outputs, i); }

const OpSignature& op_signature(const std::string& domain, const std::string& op, int64_t opset) {
  static std::mutex mu;
  static std::map<std::tuple<std::string, std::string, int64_t>, std::unique_ptr<OpSignature>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(domain, op, opset);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto sig = std::make_unique<OpSignature>(build_signature(domain, op, opset));
  const OpSignature& ref = *sig;
  cache.emplace(std::move(key), std::move(sig));
  return ref;
}

TypeMap infer_elem_types(const ir::Model& model, const ir::Graph& graph, const NameTypes& outer) {
  TypeMap m;
  for (const ir::Value* v : graph.values()) {
    if (auto d = declared(v)) {
      m[v] = *d;
    } else if (v->is_outer_scope()) {
      auto it = outer.find(v->name());
      if (it != outer.end()) m[v] = it->second;
    }
  }
  auto type_of = [&](const ir::Value* v) -> std::optional<DType> {
    if (!v) return std::nullopt;
    auto it = m.find(v);
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
  for (const auto& np : graph.nodes()) {
    const ir::Node& n = *np;
    const bool onnx_domain = n.domain.empty();
    const OpSignature* sig = nullptr;
    for (size_t i = 0; i < n.num_outputs(); ++i) {
      const ir::Value* out = n.output(i);
      if (!out || m.count(out)) continue;
      std::optional<DType> d;
      const std::string& op = n.op_type;
      if (onnx_domain && op == "Cast") {
        d = attr_dtype(n, "to");
      } else if (onnx_domain && op == "CastLike") {
        d = type_of(n.input(1));
      } else if (onnx_domain && op == "Constant") {
        d = constant_dtype(n);
      } else if (onnx_domain && op == "ConstantOfShape") {
        const Tensor* t = n.attr_tensor("value");
        d = t ? t->dtype() : DType::Float32;
      } else if (onnx_domain && (op == "RandomNormal" || op == "RandomUniform")) {
        d = attr_dtype(n, "dtype");
        if (!d) d = DType::Float32;
      } else if (onnx_domain && (op == "RandomNormalLike" || op == "RandomUniformLike" || op == "Bernoulli" ||
                                 op == "EyeLike")) {
        d = attr_dtype(n, "dtype");
        if (!d) d = type_of(n.input(0));
      } else if (onnx_domain && op == "Multinomial") {
        d = attr_dtype(n, "dtype");
        if (!d) d = DType::Int32;
      } else if (onnx_domain && op == "If") {
        d = body_output(n.attr_graph("then_branch"), i);
        if (!d) d = body_output(n.attr_graph("else_branch"), i);
      } else if (onnx_domain && op == "Loop") {
        d = body_output(n.attr_graph("body"), i + 1);
      } else if (onnx_domain && op == "Scan") {
        d = body_output(n.attr_graph("body"), i);
      } else {
        if (!sig) sig = &op_signature(n.domain, op, model.opset(n.domain));
        const TypeParam* p = sig->known ? sig->output(i) : nullptr;
        if (p) {
          if (auto fixed = parse_tensor_type(p->name)) {
            d = fixed;
          } else {
            for (size_t k = 0; k < n.num_inputs() && !d; ++k) {
              const TypeParam* ip = sig->input(k);
              if (ip && ip->name == p->name) d = type_of(n.input(k));
            }
            if (!d && p->allowed.size() == 1) d = p->allowed[0];
          }
        }
      }
      if (d) m[out] = *d;
    }
  }
  return m;
}

}  // namespace mpq::passes::precision
