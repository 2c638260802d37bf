#include "passes/insert_qdq.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <unordered_map>

#include "calib/qparams.h"
#include "calib/quant_ref.h"
#include "core/error.h"
#include "passes/pass.h"
#include "passes/patterns.h"
#include "passes/quant_placement.h"
#include "passes/quantize_embeddings.h"
#include "passes/upgrade_opset.h"

namespace mpq::passes {

namespace {

using ir::Attribute;
using ir::Graph;
using ir::Node;
using ir::Value;

}  // namespace

ir::Value* ZeroPoints::get(DType type, int32_t value) {
  ir::Value*& zp = by_value_[{type, value}];
  if (!zp)
    zp = g_.add_initializer(g_.unique_name(fmt::format("zp{}", by_value_.size() - 1)),
                            Tensor::scalar<int32_t>(value).cast_to(type));
  return zp;
}

namespace {
// Rows of a weight around its channel axis: `outer` blocks of `channels` runs of `inner` values.
struct ChannelLayout {
  int64_t outer = 1, channels = 1, inner = 1;
};
ChannelLayout channel_layout(const Tensor& w, int axis) {
  ChannelLayout l;
  if (axis < 0) {
    l.inner = w.numel();
    return l;
  }
  l.channels = w.dim(axis);
  for (int d = 0; d < axis; ++d) l.outer *= w.dim(d);
  for (int d = axis + 1; d < w.rank(); ++d) l.inner *= w.dim(d);
  return l;
}
}  // namespace

std::vector<float> weight_channel_scales(const Tensor& w, int axis, int qmax) {
  if (w.dtype() != DType::Float32) fail_internal("weight_channel_scales: {} weights", dtype_name(w.dtype()));
  const ChannelLayout l = channel_layout(w, axis);
  const float* src = w.data<float>();
  std::vector<float> amax(static_cast<size_t>(l.channels), 0.0f);
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t c = 0; c < l.channels; ++c) {
      const float* p = src + (o * l.channels + c) * l.inner;
      float m = amax[static_cast<size_t>(c)];
      for (int64_t i = 0; i < l.inner; ++i) m = std::max(m, std::fabs(p[i]));
      amax[static_cast<size_t>(c)] = m;
    }
  std::vector<float> scales;
  for (float a : amax) scales.push_back(calib::safe_scale(a, qmax));
  return scales;
}

QuantizedWeight quantize_weight_with_scales(const Tensor& w, int axis, const std::vector<float>& scales, int qmax) {
  if (w.dtype() != DType::Float32) fail_internal("quantize_weight: {} weights", dtype_name(w.dtype()));
  const ChannelLayout l = channel_layout(w, axis);
  if (static_cast<int64_t>(scales.size()) != l.channels)
    fail_input("{} weight scales for {} channels of a weight shaped {}", scales.size(), l.channels, shape_str(w.shape()));
  QuantizedWeight out;
  out.scale_list = scales;
  out.values = Tensor(DType::Int8, w.shape());
  const float* src = w.data<float>();
  int8_t* q = out.values.data<int8_t>();
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t c = 0; c < l.channels; ++c) {
      const float s = scales[static_cast<size_t>(c)];
      const int64_t base = (o * l.channels + c) * l.inner;
      for (int64_t i = 0; i < l.inner; ++i) q[base + i] = static_cast<int8_t>(calib::quantize_ref(src[base + i], s, 0, -qmax, qmax));
    }
  out.scales = axis < 0 ? Tensor::scalar<float>(scales[0]) : Tensor::from<float>({l.channels}, scales);
  return out;
}

QuantizedWeight quantize_weight(const Tensor& w, int axis, int qmax) {
  return quantize_weight_with_scales(w, axis, weight_channel_scales(w, axis, qmax), qmax);
}

bool prepare_opset_for_qdq(ir::Model& model, bool per_channel, std::vector<std::string>& notes) {
  const int64_t original_opset = model.opset();
  if (original_opset >= 13) return per_channel;
  std::string why;
  if (upgrade_opset(model, 13, &why)) {
    notes.push_back(fmt::format("raised the model's opset from {} to 13 for per-axis QuantizeLinear/DequantizeLinear",
                                original_opset));
    return per_channel;
  }
  if (original_opset < 10)
    fail_input("model opset {} has no QuantizeLinear/DequantizeLinear and cannot be raised: {}", original_opset, why);
  if (per_channel)
    notes.push_back(fmt::format("per-channel weights need opset 13 and this opset-{} model cannot be raised ({}): "
                                "weights are quantized per tensor",
                                original_opset, why));
  return false;
}

calib::QParams activation_qparams(const calib::TensorCalib& c, const QdqOptions& o) {
  if (o.activation_type == "int8") return calib::symmetric_int8(c.amax);
  if (o.symmetric) return calib::asymmetric_uint8(-c.amax, c.amax);
  return calib::asymmetric_uint8(c.min, c.max);
}

int weight_qmax(const QdqOptions& o) { return o.weight_bits == 4 ? 7 : (o.reduce_range ? 63 : 127); }

QdqReport insert_qdq(ir::Model& model, const calib::CalibrationTable& table, const QdqOptions& o) {
  if (o.activation_type != "int8" && o.activation_type != "uint8")
    fail_input("activation type must be int8 or uint8, got '{}'", o.activation_type);
  Graph& g = *model.graph;
  QdqReport rep;
  const bool per_channel = prepare_opset_for_qdq(model, o.per_channel, rep.notes);
  rep.per_channel = per_channel;

  QuantPlacement plan = place_quantizers(model, table, o, per_channel);
  rep.quantized = plan.report.quantized;
  rep.skipped = plan.report.skipped;
  for (std::string& n : plan.report.notes) rep.notes.push_back(std::move(n));
  // Learned scales (QAT export) replace the ones the table's ranges give.
  auto qparams_for = [&](const Value* v, int group) {
    auto it = o.activation_qparams.find(v->name());
    return it != o.activation_qparams.end() ? it->second : activation_qparams(plan.group_ranges[static_cast<size_t>(group)], o);
  };
  std::set<const Node*> anchor_set;
  for (const auto& a : plan.anchors) anchor_set.insert(a.node);

  // ---- 4. activation Q/DQ pairs
  std::unordered_map<const Node*, calib::QParams> anchor_input_q;  // scale of each anchor's input 0
  // Generated tensors get short numbered names (s7 scale, q7 integer tensor, dq7 its dequantized
  // float) instead of "<original>_scale" and so on: torch-exported activation names run to 40
  // characters and each pair repeats its name about ten times, which made names a quarter of a
  // small MobileNet's INT8 file. The graph still shows which tensor each pair quantizes (the
  // QuantizeLinear input keeps its original name; weights feed their named node).
  int next_id = 0;
  auto fresh = [&](const char* prefix, int id) { return g.unique_name(fmt::format("{}{}", prefix, id)); };
  ZeroPoints zero_points(g);
  auto make_pair = [&](Value* input, Value* dq_out, const calib::QParams& q, int id) {
    Value* scale = g.add_initializer(fresh("s", id), Tensor::scalar<float>(q.scale));
    Value* zp = zero_points.get(q.dtype, q.zero_point);
    // New intermediate values carry no declared type: value_info would only grow the file.
    Value* qv = g.add_value(fresh("q", id));
    g.add_node("QuantizeLinear", {input, scale, zp}, {qv});  // unnamed: node names are optional and only grow the file
    g.add_node("DequantizeLinear", {qv, scale, zp}, {dq_out});
    ++rep.activation_pairs;
  };
  for (const QuantPlacement::Output& out : plan.outputs) {
    // The producer writes a renamed float tensor; Q/DQ restore the output's own name.
    Value* v = out.value;
    calib::QParams q = qparams_for(v, out.group);
    Node* prod = v->producer();
    const int idx = v->producer_index();
    Value* pre = g.add_value(g.unique_name(v->name() + "_float"), v->type);
    g.set_node_output(prod, static_cast<size_t>(idx), pre);
    make_pair(pre, v, q, next_id++);
  }
  for (const QuantPlacement::Activation& act : plan.activations) {
    Value* v = act.value;
    calib::QParams q = qparams_for(v, act.group);
    const int id = next_id++;
    Value* dq = g.add_value(fresh("dq", id));
    make_pair(v, dq, q, id);
    for (const auto& [consumer, index] : act.consumers) {
      g.set_node_input(consumer, index, dq);
      if (index == 0 && anchor_set.count(consumer)) anchor_input_q[consumer] = q;
    }
  }

  // ---- 5. weights and biases
  std::map<std::pair<Value*, int>, std::pair<Value*, std::vector<float>>> weight_cache;
  for (const QuantPlacement::Anchor& a : plan.anchors) {
    if (!a.has_weight) continue;
    Node* n = a.node;
    Value* w = n->input(1);
    const int axis = per_channel ? a.weight_axis : -1;
    auto key = std::make_pair(w, axis);
    auto it = weight_cache.find(key);
    if (it == weight_cache.end()) {
      const int qmax = weight_qmax(o);
      auto learned = o.weight_scales.find(w->name());
      QuantizedWeight qw = learned != o.weight_scales.end()
                               ? quantize_weight_with_scales(*constant_value(w), axis, learned->second, qmax)
                               : quantize_weight(*constant_value(w), axis, qmax);
      const int id = next_id++;
      Value* wq = g.add_initializer(fresh("q", id), qw.values);
      Value* ws = g.add_initializer(fresh("s", id), qw.scales);
      // Symmetric weights: the zero point is 0, which is DequantizeLinear's default for an absent
      // zero point of an int8 input; leaving it out keeps conv-net files near a quarter of FP32.
      Value* wdq = g.add_value(fresh("dq", id));
      Node* dq = g.add_node("DequantizeLinear", {wq, ws}, {wdq});
      if (axis >= 0) dq->set_attr(Attribute::make_int("axis", axis));
      it = weight_cache.emplace(key, std::make_pair(wdq, qw.scale_list)).first;
      ++rep.weight_tensors;
    }
    g.set_node_input(n, 1, it->second.first);
    if (!a.quantize_bias) continue;
    // Bias scale = input scale x weight scale (float32 product, as ONNX Runtime computes it).
    const calib::QParams* xq = &anchor_input_q.at(n);
    const Tensor& b = *constant_value(n->input(2));
    const std::vector<float>& ws = it->second.second;
    const int64_t channels = b.numel();
    std::vector<float> bscale(static_cast<size_t>(channels));
    std::vector<int32_t> bq(static_cast<size_t>(channels));
    bool overflow = false;
    for (int64_t c = 0; c < channels; ++c) {
      float s = xq->scale * (ws.size() == 1 ? ws[0] : ws[static_cast<size_t>(c)]);
      bscale[static_cast<size_t>(c)] = s;
      double r = std::nearbyint(static_cast<double>(b.data<float>()[c]) / static_cast<double>(s));
      if (!(std::fabs(r) <= static_cast<double>(INT_MAX))) overflow = true;
      bq[static_cast<size_t>(c)] = overflow ? 0 : static_cast<int32_t>(calib::round_half_to_even(b.data<float>()[c] / s));
    }
    if (overflow) {
      rep.notes.push_back(fmt::format("{}: bias kept in float (int32 would overflow at this scale)", n->label()));
      continue;
    }
    const int id = next_id++;
    Value* bqv = g.add_initializer(fresh("q", id), Tensor::from<int32_t>({channels}, bq));
    // Per-tensor weights give every channel the same bias scale: store it once.
    const bool one_scale = ws.size() == 1;
    Value* bsv = g.add_initializer(fresh("s", id), one_scale ? Tensor::scalar<float>(bscale[0])
                                                              : Tensor::from<float>({channels}, bscale));
    Value* bdq = g.add_value(fresh("dq", id));
    Node* dq = g.add_node("DequantizeLinear", {bqv, bsv}, {bdq});  // int32 zero point: 0, the default
    if (!one_scale) dq->set_attr(Attribute::make_int("axis", 0));
    g.set_node_input(n, 2, bdq);
    ++rep.int32_biases;
  }

  rep.embedding_tables = static_cast<int>(plan.embeddings.size());
  rep.embedding_bytes_saved = quantize_embedding_tables(g, plan.embeddings, &o.weight_scales);

  g.topological_sort();
  g.remove_dead_nodes();  // Constant nodes whose weights were replaced
  remove_unused_initializers(model);
  return rep;
}

}  // namespace mpq::passes
