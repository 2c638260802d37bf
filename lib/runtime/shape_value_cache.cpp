#include "runtime/shape_value_cache.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_set>
#include <utility>

namespace mpq::rt {

namespace {
std::atomic<int64_t> g_reused{0};

// Pure ops (default domain) that reshape-target arithmetic uses: their outputs are a function of
// their inputs' values alone, with no state, randomness or subgraph.
const std::unordered_set<std::string>& derived_ops() {
  static const std::unordered_set<std::string> ops = {
      "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Identity", "Reshape", "Flatten", "Transpose",
      "Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Floor", "Ceil", "Sqrt", "Max", "Min",
      "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Where",
      "ReduceProd", "ReduceSum", "ReduceMin", "ReduceMax", "Range", "ConstantOfShape", "Expand", "Tile"};
  return ops;
}

bool small(const Tensor& t) {
  return t.defined() && t.is_host() && t.dtype() != DType::String && t.numel() <= ShapeValueCache::kMaxValues;
}

bool same_value(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}
}  // namespace

bool shape_value_cache_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("MPQ_SHAPE_VALUE_CACHE");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

int64_t ShapeValueCache::reused_count() { return g_reused.load(std::memory_order_relaxed); }

void ShapeValueCache::plan(const std::vector<const ir::Node*>& nodes, const std::vector<std::vector<int>>& inputs,
                           const std::vector<std::vector<int>>& outputs, size_t slots,
                           const std::vector<std::pair<int, Tensor>>& constants,
                           const std::vector<int>& graph_outputs) {
  steps_.assign(nodes.size(), Step{});
  // Per slot: 1 computed from shapes by an eligible step, 2 a small constant.
  std::vector<char> kind(slots, 0);
  for (const auto& [slot, value] : constants)
    if (small(value)) kind[static_cast<size_t>(slot)] = 2;
  // A graph output goes to the caller, who may write into it: never shared with a kept value.
  std::vector<char> is_output(slots, 0);
  for (int s : graph_outputs) is_output[static_cast<size_t>(s)] = 1;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = *nodes[i];
    if (!n.domain.empty() || !n.subgraphs().empty()) continue;
    bool eligible = false;
    const bool shape_only = n.op_type == "Shape" || n.op_type == "Size";
    if (shape_only) {
      eligible = !inputs[i].empty() && inputs[i][0] >= 0;
    } else if (derived_ops().count(n.op_type)) {
      bool from_shapes = false, all_small = true;
      for (int s : inputs[i]) {
        if (s < 0) continue;
        from_shapes = from_shapes || kind[static_cast<size_t>(s)] == 1;
        all_small = all_small && kind[static_cast<size_t>(s)] != 0;
      }
      eligible = from_shapes && all_small;
    }
    for (int s : outputs[i])
      if (s >= 0 && is_output[static_cast<size_t>(s)]) eligible = false;
    if (!eligible) continue;
    steps_[i].eligible = true;
    steps_[i].shape_only = shape_only;
    for (int s : inputs[i]) steps_[i].from_kept_step.push_back(s >= 0 && kind[static_cast<size_t>(s)] == 1);
    for (int s : outputs[i])
      if (s >= 0) kind[static_cast<size_t>(s)] = 1;
  }
}

bool ShapeValueCache::reuse(int step, const std::vector<const Tensor*>& ins, std::vector<Tensor>& outs) {
  Step& st = steps_[static_cast<size_t>(step)];
  if (!st.valid) return false;
  if (st.shape_only) {
    if (ins.empty() || !ins[0] || ins[0]->shape() != st.input_shape) return false;
  } else {
    if (ins.size() != st.key.size()) return false;
    for (size_t i = 0; i < ins.size(); ++i) {
      if (!ins[i] != !st.key[i].defined()) return false;
      if (!ins[i]) continue;
      const bool held = st.key[i].same_buffer(*ins[i]) && st.key[i].dtype() == ins[i]->dtype() &&
                        st.key[i].shape() == ins[i]->shape();
      if (!held && !same_value(*ins[i], st.key[i])) return false;
    }
  }
  for (size_t i = 0; i < outs.size() && i < st.outputs.size(); ++i) outs[i] = st.outputs[i];
  g_reused.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void ShapeValueCache::remember(int step, const std::vector<const Tensor*>& ins, const std::vector<Tensor>& outs) {
  Step& st = steps_[static_cast<size_t>(step)];
  st.valid = false;
  for (const Tensor& t : outs) {
    // Larger than a size (ConstantOfShape, Expand, Tile of a big shape): not worth keeping, and
    // its consumers then read it as any other value. The step recomputes from now on.
    if (t.defined() && !small(t)) {
      st.eligible = false;
      st.key.clear();
      st.outputs.clear();
      return;
    }
  }
  if (st.shape_only) {
    if (ins.empty() || !ins[0]) return;
    st.input_shape = ins[0]->shape();
  } else {
    st.key.clear();
    for (const Tensor* t : ins) {
      if (t && !small(*t)) {  // an input larger than the plan saw (not a constant): never kept
        st.eligible = false;
        st.outputs.clear();
        return;
      }
      const bool share = st.from_kept_step[st.key.size()] != 0;
      st.key.push_back(!t ? Tensor() : share ? *t : t->clone());
    }
  }
  st.outputs = outs;
  st.valid = true;
}

}  // namespace mpq::rt
