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
  any_planned_ = false;
  // Per slot: the planned step that computes it (-1 for none), and whether it is a small constant.
  std::vector<int> producer(slots, -1);
  std::vector<char> small_constant(slots, 0);
  for (const auto& [slot, value] : constants)
    if (small(value)) small_constant[static_cast<size_t>(slot)] = 1;
  // A graph output goes to the caller: the step writing one is never kept (its copy would be the
  // caller's).
  std::vector<char> is_output(slots, 0);
  for (int s : graph_outputs) is_output[static_cast<size_t>(s)] = 1;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = *nodes[i];
    if (!n.domain.empty() || !n.subgraphs().empty()) continue;
    bool qualifies = false;
    const bool shape_only = n.op_type == "Shape" || n.op_type == "Size";
    if (shape_only) {
      qualifies = !inputs[i].empty() && inputs[i][0] >= 0;
    } else if (derived_ops().count(n.op_type)) {
      bool from_shapes = false, all_small = true;
      for (int s : inputs[i]) {
        if (s < 0) continue;
        from_shapes = from_shapes || producer[static_cast<size_t>(s)] >= 0;
        all_small = all_small && (producer[static_cast<size_t>(s)] >= 0 || small_constant[static_cast<size_t>(s)]);
      }
      qualifies = from_shapes && all_small;
    }
    for (int s : outputs[i])
      if (s >= 0 && is_output[static_cast<size_t>(s)]) qualifies = false;
    if (!qualifies) continue;
    Step& st = steps_[i];
    st.planned = st.eligible = any_planned_ = true;
    st.shape_only = shape_only;
    if (!shape_only)
      for (int s : inputs[i]) st.producer.push_back(s >= 0 ? producer[static_cast<size_t>(s)] : -1);
    for (int s : outputs[i])
      if (s >= 0) producer[static_cast<size_t>(s)] = static_cast<int>(i);
  }
}

void ShapeValueCache::drop(Step& st) {
  st.eligible = false;
  st.valid = false;
  st.key.clear();
  st.outputs.clear();
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
      // Computed this run by a step still kept, at the version recorded: the same value, since a
      // kept step's version changes whenever its outputs do.
      const int p = st.producer[i];
      if (p >= 0) {
        const Step& from = steps_[static_cast<size_t>(p)];
        if (from.eligible && from.valid && from.version == st.key_version[i]) continue;
      }
      if (!same_value(*ins[i], st.key[i])) return false;
    }
  }
  for (size_t i = 0; i < outs.size() && i < st.outputs.size(); ++i) outs[i] = st.outputs[i];
  g_reused.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void ShapeValueCache::remember(int step, const std::vector<const Tensor*>& ins, const std::vector<Tensor>& outs) {
  Step& st = steps_[static_cast<size_t>(step)];
  // Larger than a size (ConstantOfShape, Expand, Tile of a big shape; an input larger than the
  // plan saw): not worth keeping. The step recomputes from now on, and its consumers compare its
  // outputs by value.
  for (const Tensor& t : outs)
    if (t.defined() && !small(t)) return drop(st);
  if (st.shape_only) {
    if (ins.empty() || !ins[0]) return drop(st);
    st.input_shape = ins[0]->shape();
  } else {
    for (const Tensor* t : ins)
      if (t && !small(*t)) return drop(st);
    st.key.clear();
    st.key_version.assign(ins.size(), 0);
    for (size_t i = 0; i < ins.size(); ++i) {
      st.key.push_back(ins[i] ? ins[i]->clone() : Tensor());
      const int p = st.producer[i];
      if (p >= 0) st.key_version[i] = steps_[static_cast<size_t>(p)].version;
    }
  }
  bool unchanged = st.valid && st.outputs.size() == outs.size();
  for (size_t i = 0; unchanged && i < outs.size(); ++i)
    unchanged = outs[i].defined() == st.outputs[i].defined() && (!outs[i].defined() || same_value(outs[i], st.outputs[i]));
  if (!unchanged) {
    // The cache's own copies: a kernel's output may be a view of a feed or a constant, or be
    // handed on to the caller.
    st.outputs.clear();
    for (const Tensor& t : outs) st.outputs.push_back(t.defined() ? t.clone() : Tensor());
    st.version = ++next_version_;
  }
  st.valid = true;
}

bool ShapeValueCache::shares_buffer(const Tensor& t) const {
  const std::shared_ptr<void>& b = t.buffer();
  if (!b) return false;
  for (const Step& st : steps_)
    for (const Tensor& kept : st.outputs) {
      const std::shared_ptr<void>& k = kept.buffer();
      if (k && !b.owner_before(k) && !k.owner_before(b)) return true;
    }
  return false;
}

}  // namespace mpq::rt
