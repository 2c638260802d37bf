#include "passes/quant_placement.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <unordered_map>

#include "passes/pass.h"
#include "passes/patterns.h"

namespace mpq::passes {

namespace {

using ir::Graph;
using ir::Node;
using ir::Value;

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

QuantPlacement place_quantizers(ir::Model& model, const calib::CalibrationTable& table, const QdqOptions& o,
                                bool per_channel) {
  Graph& g = *model.graph;
  QuantPlacement plan;
  plan.per_channel = per_channel;
  QdqReport& rep = plan.report;
  rep.per_channel = per_channel;
  const std::vector<PatternMatch> patterns = find_fragile_patterns(g);
  const auto membership = pattern_membership(patterns);
  auto excluded = [&](const Node* n) { return o.exclude_nodes.count(n->name) || o.exclude_ops.count(n->op_type); };
  auto calibrated = [&](const Value* v) { return v && !constant_value(v) && table.find(v->name()) != nullptr; };

  // ---- 1. anchors: the nodes whose inputs get quantized
  std::vector<QuantPlacement::Anchor>& anchors = plan.anchors;
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
    QuantPlacement::Anchor a;
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
  for (const QuantPlacement::Anchor& a : anchors)
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

  // ---- 3. graph outputs and scale groups with their merged ranges
  std::vector<Value*> graph_outputs_to_quantize;
  if (o.quantize_outputs)
    for (Value* v : g.outputs())
      if (v->producer() && anchor_set.count(v->producer()) && table.find(v->name()) && !rewire.count(v))
        graph_outputs_to_quantize.push_back(v);
  std::unordered_map<Value*, int> group_of_root;
  auto group_of = [&](Value* v) {
    const calib::TensorCalib* c = table.find(v->name());
    Value* root = groups.find(v);
    auto [it, inserted] = group_of_root.try_emplace(root, static_cast<int>(plan.group_ranges.size()));
    if (inserted) {
      plan.group_ranges.push_back(*c);
    } else {
      calib::TensorCalib& r = plan.group_ranges[static_cast<size_t>(it->second)];
      r.min = std::min(r.min, c->min);
      r.max = std::max(r.max, c->max);
      r.amax = std::max(r.amax, c->amax);
    }
    return it->second;
  };
  for (Value* v : graph_outputs_to_quantize) plan.outputs.push_back({v, group_of(v)});
  for (Value* v : order) plan.activations.push_back({v, rewire[v], group_of(v)});
  if (o.quantize_embeddings) plan.embeddings = find_embedding_tables(g, o.embedding_min_elements, o.exclude_nodes, o.exclude_ops);
  return plan;
}

}  // namespace mpq::passes
