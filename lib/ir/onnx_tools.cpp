#include "ir/onnx_tools.h"

#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include <fmt/format.h>

#include <unordered_map>

#include "core/error.h"
#include "ir/onnx_proto.h"

namespace mpq::ir {

int64_t libonnx_max_opset() {
  const auto& map = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  auto it = map.find(onnx::ONNX_DOMAIN);
  return it == map.end() ? 0 : it->second.second;
}

namespace {
constexpr int64_t kLibonnxMaxIr = onnx::Version::IR_VERSION;

std::string too_new_reason(const Model& model) {
  if (model.ir_version > kLibonnxMaxIr)
    return fmt::format("IR version {} is newer than libonnx's checker knows ({})", model.ir_version, kLibonnxMaxIr);
  if (model.opset() > libonnx_max_opset())
    return fmt::format("opset {} is newer than libonnx knows ({})", model.opset(), libonnx_max_opset());
  return {};
}
}  // namespace

CheckResult check_model(const Model& model) {
  CheckResult r;
  if (std::string why = too_new_reason(model); !why.empty()) {
    r.message = "not checked: " + why;
    return r;
  }
  onnx::ModelProto mp;
  model_to_proto(model, &mp, nullptr);
  r.ran = true;
  try {
    onnx::checker::check_model(mp);
    r.ok = true;
  } catch (const std::exception& e) {
    r.message = e.what();
  }
  return r;
}

namespace {

void apply_inferred(Graph& g, const onnx::GraphProto& gp, int& typed) {
  auto apply = [&](const onnx::ValueInfoProto& vi) {
    Value* v = g.find(vi.name());
    if (!v || v->is_outer_scope() || !vi.type().has_tensor_type()) return;
    const auto& tt = vi.type().tensor_type();
    ValueType inferred;
    inferred.kind = ValueType::Kind::Tensor;
    inferred.elem = dtype_is_valid(tt.elem_type()) ? static_cast<DType>(tt.elem_type()) : DType::Undefined;
    if (tt.has_shape()) {
      inferred.has_shape = true;
      for (const auto& d : tt.shape().dim()) {
        if (d.has_dim_value()) inferred.dims.push_back(Dim::fixed(d.dim_value()));
        else if (d.has_dim_param()) inferred.dims.push_back(Dim::symbol(d.dim_param()));
        else inferred.dims.push_back(Dim{});
      }
    }
    ValueType& cur = v->type;
    bool better = cur.is_unknown() || (cur.is_tensor() && cur.elem == DType::Undefined && inferred.elem != DType::Undefined) ||
                  (cur.is_tensor() && !cur.has_shape && inferred.has_shape);
    if (!better && cur.is_tensor() && cur.has_shape && inferred.has_shape && cur.dims.size() == inferred.dims.size()) {
      // Fill unknown dimensions only.
      bool changed = false;
      for (size_t i = 0; i < cur.dims.size(); ++i) {
        if (!cur.dims[i].known() && cur.dims[i].param.empty() && (inferred.dims[i].known() || !inferred.dims[i].param.empty())) {
          cur.dims[i] = inferred.dims[i];
          changed = true;
        }
      }
      if (changed) ++typed;
      return;
    }
    if (better) {
      if (cur.is_tensor() && cur.elem != DType::Undefined) inferred.elem = cur.elem;
      cur = inferred;
      ++typed;
    }
  };
  for (const auto& vi : gp.value_info()) apply(vi);
  for (const auto& vi : gp.output()) apply(vi);
  // Subgraphs: match nodes by position (export keeps node order).
  for (int i = 0; i < gp.node_size() && static_cast<size_t>(i) < g.nodes().size(); ++i) {
    const auto& np = gp.node(i);
    Node* n = g.nodes()[static_cast<size_t>(i)].get();
    for (const auto& ap : np.attribute()) {
      if (ap.has_g()) {
        if (Graph* sub = n->attr_graph(ap.name())) apply_inferred(*sub, ap.g(), typed);
      }
    }
  }
}

}  // namespace

int infer_shapes(Model& model, std::string* note) {
  if (model.opset() > libonnx_max_opset()) {
    if (note) *note = fmt::format("shape inference skipped: opset {} is newer than libonnx knows ({})", model.opset(),
                                  libonnx_max_opset());
    return 0;
  }
  onnx::ModelProto mp;
  model_to_proto(model, &mp, nullptr);
  // libonnx refuses IR versions it does not know; inference does not depend on them.
  if (mp.ir_version() > kLibonnxMaxIr) mp.set_ir_version(kLibonnxMaxIr);
  try {
    onnx::ShapeInferenceOptions options(false, 0, true);
    onnx::shape_inference::InferShapes(mp, onnx::OpSchemaRegistry::Instance(), options);
  } catch (const std::exception& e) {
    if (note) *note = fmt::format("shape inference stopped: {}", e.what());
    return 0;
  }
  int typed = 0;
  apply_inferred(*model.graph, mp.graph(), typed);
  return typed;
}

}  // namespace mpq::ir
