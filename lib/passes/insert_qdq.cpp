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
#include "passes/upgrade_opset.h"

namespace mpq::passes {

namespace {

using ir::Attribute;
using ir::Graph;
using ir::Node;
using ir::Value;

struct Anchor {
  Node* node = nullptr;
  std::vector<size_t> activation_inputs;
  int weight_axis = -1;  // channel axis of input 1 (when it is a constant weight)
  bool has_weight = false;
  bool quantize_bias = false;
};

// Groups of tensors that must share one scale (MaxPool/Concat/Resize inputs and outputs).
class ScaleGroups {
 public:
  Value* find(Value* v) {
    auto it = parent_.find(v);
    if (it == parent_.end() || it->second == v) return v;
    Value* root = find(it->second);
    parent_[v] = root;
    return root;
  }
  void unite(Value* a, Value* b) {
    Value* ra = find(a);
    Value* rb = find(b);
    if (ra != rb) parent_[rb] = ra;
  }

 private:
  std::unordered_map<Value*, Value*> parent_;
};

bool is_anchor_op(const std::string& op) {
  return op == "Conv" || op == "ConvTranspose" || op == "Gemm" || op == "MatMul";
}

}  // namespace

ir::Value* ZeroPoints::get(DType type, int32_t value) {
  ir::Value*& zp = by_value_[{type, value}];
  if (!zp)
    zp = g_.add_initializer(g_.unique_name(fmt::format("zp{}", by_value_.size() - 1)),
                            Tensor::scalar<int32_t>(value).cast_to(type));
  return zp;
}

QuantizedWeight quantize_weight(const Tensor& w, int axis, int qmax) {
  if (w.dtype() != DType::Float32) fail_internal("quantize_weight: {} weights", dtype_name(w.dtype()));
  QuantizedWeight out;
  const int64_t channels = axis < 0 ? 1 : w.dim(axis);
  int64_t outer = 1, inner = 1;
  if (axis >= 0) {
    for (int d = 0; d < axis; ++d) outer *= w.dim(d);
    for (int d = axis + 1; d < w.rank(); ++d) inner *= w.dim(d);
  } else {
    inner = w.numel();
  }
  const float* src = w.data<float>();
  std::vector<float> amax(static_cast<size_t>(channels), 0.0f);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c) {
      const float* p = src + (o * channels + c) * inner;
      float m = amax[static_cast<size_t>(c)];
      for (int64_t i = 0; i < inner; ++i) m = std::max(m, std::fabs(p[i]));
      amax[static_cast<size_t>(c)] = m;
    }
  for (float a : amax) out.scale_list.push_back(calib::safe_scale(a, qmax));
  out.values = Tensor(DType::Int8, w.shape());
  int8_t* q = out.values.data<int8_t>();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c) {
      const float s = out.scale_list[static_cast<size_t>(c)];
      const int64_t base = (o * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i) q[base + i] = static_cast<int8_t>(calib::quantize_ref(src[base + i], s, 0, -qmax, qmax));
    }
  out.scales = axis < 0 ? Tensor::scalar<float>(out.scale_list[0]) : Tensor::from<float>({channels}, out.scale_list);
  return out;
}

QdqReport insert_qdq(ir::Model& model, const calib::CalibrationTable& table, const QdqOptions& o) {
  if (o.activation_type != "int8" && o.activation_type != "uint8")
    fail_input("activation type must be int8 or uint8, got '{}'", o.activation_type);
  Graph& g = *model.graph;
  QdqReport rep;
  bool per_channel = o.per_channel;
  const int64_t original_opset = model.opset();
  if (original_opset < 13) {
    std::string why;
    if (upgrade_opset(model, 13, &why)) {
      rep.notes.push_back(fmt::format("raised the model's opset from {} to 13 for per-axis QuantizeLinear/DequantizeLinear",
                                      original_opset));
    } else if (original_opset < 10) {
      fail_input("model opset {} has no QuantizeLinear/DequantizeLinear and cannot be raised: {}", original_opset, why);
    } else if (per_channel) {
      per_channel = false;
      rep.notes.push_back(fmt::format("per-channel weights need opset 13 and this opset-{} model cannot be raised ({}): "
                                      "weights are quantized per tensor",
                                      original_opset, why));
    }
  }
  rep.per_channel = per_channel;

  const std::vector<PatternMatch> patterns = find_fragile_patterns(g);
  const auto membership = pattern_membership(patterns);
  auto excluded = [&](const Node* n) { return o.exclude_nodes.count(n->name) || o.exclude_ops.count(n->op_type); };
  auto calibrated = [&](const Value* v) { return v && !constant_value(v) && table.find(v->name()) != nullptr; };

  // ---- 1. anchors: the nodes whose inputs get quantized
  std::vector<Anchor> anchors;
  std::set<const Node*> anchor_set;
  for (const auto& np : g.nodes()) {
    Node* n = np.get();
    if (!n->domain.empty() || !is_anchor_op(n->op_type)) continue;
    const std::string& op = n->op_type;
    if (excluded(n)) {
      rep.skipped.emplace_back(n->label(), o.exclude_nodes.count(n->name) ? "excluded by --exclude-nodes" : "excluded by --exclude-ops");
      continue;
    }
    if (auto it = membership.find(n); it != membership.end()) {
      rep.skipped.emplace_back(n->label(), fmt::format("inside a {} pattern", pattern_name(patterns[it->second].kind)));
      continue;
    }
    Value* x = n->input(0);
    Value* w = n->input(1);
    if (!calibrated(x)) {
      rep.skipped.emplace_back(n->label(), constant_value(x) ? "first input is a constant"
                                                                 : fmt::format("no calibration range for input '{}'", x ? x->name() : "?"));
      continue;
    }
    Anchor a;
    a.node = n;
    a.activation_inputs = {0};
    const Tensor* wt = constant_value(w);
    if (op == "MatMul" && !wt) {
      if (!o.quantize_attention) {
        rep.skipped.emplace_back(n->label(), "both inputs are activations (attention); --quantize-attention includes it");
        continue;
      }
      if (!calibrated(w)) {
        rep.skipped.emplace_back(n->label(), fmt::format("no calibration range for input '{}'", w ? w->name() : "?"));
        continue;
      }
      a.activation_inputs.push_back(1);
    } else {
      if (!wt || wt->dtype() != DType::Float32) {
        rep.skipped.emplace_back(n->label(), "weight is not a float32 initializer");
        continue;
      }
      const int r = wt->rank();
      if ((op == "Conv" || op == "ConvTranspose") && r < 3) {
        rep.skipped.emplace_back(n->label(), "weight rank below 3");
        continue;
      }
      if ((op == "Gemm" && r != 2) || (op == "MatMul" && r < 2)) {
        rep.skipped.emplace_back(n->label(), "unexpected weight rank");
        continue;
      }
      a.has_weight = true;
      if (op == "Conv") a.weight_axis = 0;
      else if (op == "ConvTranspose") a.weight_axis = 1;
      else if (op == "Gemm") a.weight_axis = n->attr_int("transB", 0) ? 0 : 1;
      else a.weight_axis = r - 1;
      const int64_t channels = wt->dim(a.weight_axis);
      const Tensor* b = constant_value(n->input(2));
      bool bias_ok = b && b->dtype() == DType::Float32 && b->rank() == 1 && b->numel() == channels;
      if (op == "Gemm") bias_ok = bias_ok && n->attr_float("alpha", 1.0f) == 1.0f && n->attr_float("beta", 1.0f) == 1.0f;
      if (op == "ConvTranspose" && n->attr_int("group", 1) != 1) bias_ok = false;  // bias has C_out, weight axis 1 has C_out/group
      a.quantize_bias = o.quantize_bias && bias_ok && (op == "Conv" || op == "ConvTranspose" || op == "Gemm");
    }
    anchors.push_back(a);
    anchor_set.insert(n);
    ++rep.quantized[op];
  }

  // ---- 2. tensors to quantize, and which consumers read the dequantized value
  std::vector<Value*> order;
  std::map<Value*, std::vector<std::pair<Node*, size_t>>> rewire;
  auto want = [&](Value* v, Node* consumer, size_t index) {
    auto [it, inserted] = rewire.try_emplace(v);
    if (inserted) order.push_back(v);
    for (const auto& [c, i] : it->second)
      if (c == consumer && i == index) return;
    it->second.emplace_back(consumer, index);
  };
  for (const Anchor& a : anchors)
    for (size_t i : a.activation_inputs) want(a.node->input(i), a.node, i);

  // Upward through MaxPool / Concat / nearest Resize: their inputs share the output's scale, so the
  // op runs on int8 values with no extra rounding.
  ScaleGroups groups;
  for (size_t k = 0; k < order.size(); ++k) {
    Value* v = order[k];
    Node* p = v->producer();
    if (!p || !p->domain.empty() || membership.count(p) || excluded(p) || p->output(0) != v) continue;
    const std::string& op = p->op_type;
    std::vector<size_t> data_inputs;
    if (op == "MaxPool" && !p->output(1)) data_inputs = {0};
    else if (op == "Concat") for (size_t i = 0; i < p->num_inputs(); ++i) data_inputs.push_back(i);
    else if ((op == "Resize" || op == "Upsample") && p->attr_string("mode", "nearest") == "nearest") data_inputs = {0};
    if (data_inputs.empty()) continue;
    bool all = true;
    for (size_t i : data_inputs) all = all && calibrated(p->input(i));
    if (!all) continue;
    for (size_t i : data_inputs) {
      want(p->input(i), p, i);
      groups.unite(v, p->input(i));
    }
    ++rep.quantized[op];
  }
  // Residual Add: one input straight from a quantized Conv/Gemm/MatMul, the other already
  // quantized: the Add reads the shared DequantizeLinear so TensorRT fuses it into the conv.
  // Pooling/Add/Mul whose every activation input and output are quantized read them too.
  for (const auto& np : g.nodes()) {
    Node* n = np.get();
    if (!n->domain.empty() || membership.count(n) || excluded(n) || anchor_set.count(n)) continue;
    const std::string& op = n->op_type;
    if (op != "Add" && op != "Mul" && op != "AveragePool" && op != "GlobalAveragePool" && op != "MaxPool" &&
        op != "GlobalMaxPool")
      continue;
    std::vector<size_t> acts;
    for (size_t i = 0; i < n->num_inputs(); ++i)
      if (n->input(i) && !constant_value(n->input(i))) acts.push_back(i);
    if (acts.empty()) continue;
    bool all_in = true;
    for (size_t i : acts) all_in = all_in && rewire.count(n->input(i));
    if (all_in && n->output(0) && rewire.count(n->output(0))) {
      for (size_t i : acts) want(n->input(i), n, i);
      continue;
    }
    if (op == "Add" && acts.size() == 2) {
      for (int side = 0; side < 2; ++side) {
        Value* from_anchor = n->input(acts[static_cast<size_t>(side)]);
        Value* other = n->input(acts[static_cast<size_t>(1 - side)]);
        if (from_anchor->producer() && anchor_set.count(from_anchor->producer()) && rewire.count(other)) {
          want(other, n, acts[static_cast<size_t>(1 - side)]);
          break;
        }
      }
    }
  }

  // ---- 3. quantization parameters per tensor (shared within a group)
  auto table_q = [&](const calib::TensorCalib& c) {
    if (o.activation_type == "int8") return calib::symmetric_int8(c.amax);
    if (o.symmetric) return calib::asymmetric_uint8(-c.amax, c.amax);
    return calib::asymmetric_uint8(c.min, c.max);
  };
  std::unordered_map<Value*, calib::TensorCalib> group_range;
  std::vector<Value*> graph_outputs_to_quantize;
  if (o.quantize_outputs)
    for (Value* v : g.outputs())
      if (v->producer() && anchor_set.count(v->producer()) && table.find(v->name()) && !rewire.count(v))
        graph_outputs_to_quantize.push_back(v);
  auto merge_range = [&](Value* v) {
    const calib::TensorCalib* c = table.find(v->name());
    Value* root = groups.find(v);
    auto [it, inserted] = group_range.try_emplace(root, *c);
    if (!inserted) {
      it->second.min = std::min(it->second.min, c->min);
      it->second.max = std::max(it->second.max, c->max);
      it->second.amax = std::max(it->second.amax, c->amax);
    }
  };
  for (Value* v : order) merge_range(v);
  for (Value* v : graph_outputs_to_quantize) merge_range(v);
  auto qparams_of = [&](Value* v) { return table_q(group_range.at(groups.find(v))); };

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
  for (Value* v : graph_outputs_to_quantize) {
    // The producer writes a renamed float tensor; Q/DQ restore the output's own name.
    calib::QParams q = qparams_of(v);
    Node* prod = v->producer();
    const int idx = v->producer_index();
    Value* pre = g.add_value(g.unique_name(v->name() + "_float"), v->type);
    g.set_node_output(prod, static_cast<size_t>(idx), pre);
    make_pair(pre, v, q, next_id++);
  }
  for (Value* v : order) {
    calib::QParams q = qparams_of(v);
    const int id = next_id++;
    Value* dq = g.add_value(fresh("dq", id));
    make_pair(v, dq, q, id);
    for (const auto& [consumer, index] : rewire[v]) {
      g.set_node_input(consumer, index, dq);
      if (index == 0 && anchor_set.count(consumer)) anchor_input_q[consumer] = q;
    }
  }

  // ---- 5. weights and biases
  std::map<std::pair<Value*, int>, std::pair<Value*, std::vector<float>>> weight_cache;
  for (const Anchor& a : anchors) {
    if (!a.has_weight) continue;
    Node* n = a.node;
    Value* w = n->input(1);
    const int axis = per_channel ? a.weight_axis : -1;
    auto key = std::make_pair(w, axis);
    auto it = weight_cache.find(key);
    if (it == weight_cache.end()) {
      QuantizedWeight qw = quantize_weight(*constant_value(w), axis, o.reduce_range ? 63 : 127);
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

  g.topological_sort();
  g.remove_dead_nodes();  // Constant nodes whose weights were replaced
  remove_unused_initializers(model);
  return rep;
}

}  // namespace mpq::passes
