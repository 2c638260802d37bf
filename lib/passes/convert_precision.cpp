#include "passes/convert_precision.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <unordered_set>

#include "core/error.h"
#include "core/half.h"
#include "passes/narrow_gather_tables.h"
#include "passes/patterns.h"
#include "passes/precision_policy.h"
#include "passes/precision_schema.h"
#include "passes/upgrade_opset.h"
#include "runtime/low_precision.h"
#include "runtime/node_eval.h"

namespace mpq::passes {

namespace {

using namespace precision;
using ir::Graph;
using ir::Node;
using ir::Value;

enum class Prec : uint8_t { F32, Low };

// How a node input or output takes part in the node's precision.
enum class Role : uint8_t {
  Ignore,   // not a float32 tensor (or an output outside the main group: stays FP32)
  Main,     // shares the node's precision
  Fixed32,  // must be FP32 whatever the node's precision
  AsIs,     // any precision is fine (Shape's input, Cast's input): never gets a Cast
  Widest,   // an input-only group of the same type (Equal's A and B): the widest member wins
};

enum class Kind : uint8_t {
  None,    // no float32 main group (nothing to decide)
  Fixed,   // precision fixed by the policy, a pin or the user
  Follow,  // precision from the inputs (decided going forward)
  Flex,    // precision from the consumers (constants, casts, nodes fed only by constants/graph inputs)
};

struct Slot {
  Role role = Role::Ignore;
  int group = -1;  // Widest: index into NodeState::widest
};

struct NodeState {
  Node* node = nullptr;
  std::vector<Slot> in, out;
  bool has_main = false;
  bool counted = true;  // a compute node (Constant and Cast plumbing are not counted)
  Kind kind = Kind::None;
  Prec prec = Prec::F32;
  std::vector<Prec> widest;
  std::string category, reason;  // why the node is FP32
};

bool is_random(const std::string& op) {
  return op == "RandomNormal" || op == "RandomUniform" || op == "RandomNormalLike" || op == "RandomUniformLike" ||
         op == "Multinomial" || op == "Bernoulli";
}

bool is_sequence_op(const std::string& op) {
  return op.rfind("Sequence", 0) == 0 || op == "SplitToSequence" || op == "ConcatFromSequence" ||
         op.rfind("Optional", 0) == 0;
}

double max_abs_finite(const Tensor& t) {
  if (t.dtype() != DType::Float32 || !t.is_host()) return 0.0;
  const float* p = t.data<float>();
  double m = 0.0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    float a = std::fabs(p[i]);
    if (std::isfinite(a) && a > m) m = a;
  }
  return m;
}

// Rounds a float32 tensor to `low`, counting non-zero finite values that become zero.
Tensor to_low(const Tensor& t, DType low, int64_t* underflow) {
  Tensor out = rt::narrow_from_float32(t, low);
  int64_t n = 0;
  const float* src = t.data<float>();
  const uint16_t* dst = static_cast<const uint16_t*>(out.raw_data());
  for (int64_t i = 0; i < t.numel(); ++i)
    if (src[i] != 0.0f && std::isfinite(src[i]) && (dst[i] & 0x7fffu) == 0) ++n;
  if (underflow) *underflow = n;
  return out;
}

// The float32 value of a Constant node (value / value_float / value_floats), or undefined.
Tensor constant_float_value(const Node& n) {
  if (const Tensor* t = n.attr_tensor("value")) return t->dtype() == DType::Float32 ? *t : Tensor();
  if (const ir::Attribute* a = n.attr("value_float")) return Tensor::scalar<float>(a->f);
  if (const ir::Attribute* a = n.attr("value_floats"))
    return Tensor::from<float>({static_cast<int64_t>(a->floats.size())}, a->floats);
  return {};
}

bool exact_widening(DType from, DType to) {
  if (from == to) return true;
  if ((from == DType::Float16 || from == DType::BFloat16) && (to == DType::Float32 || to == DType::Float64)) return true;
  return from == DType::Float32 && to == DType::Float64;
}

std::string node_display_name(const Node& n) { return n.name.empty() ? n.label() : n.name; }

// Renames the outer-scope reference `old_name` inside `body` (and deeper bodies) to `new_name`.
void rename_outer_ref(Graph& body, const std::string& old_name, const std::string& new_name) {
  Value* ref = body.find(old_name);
  if (ref && !ref->is_outer_scope()) return;  // shadowed by a local definition
  if (ref) {
    Value* target = body.find(new_name);
    if (!target) target = body.add_outer_scope_value(new_name);
    body.replace_uses(ref, target);
    for (size_t i = 0; i < body.outputs().size(); ++i)
      if (body.outputs()[i] == ref) body.set_output(i, target);
    body.remove_unused_values();
    return;
  }
  for (const auto& n : body.nodes())
    for (Graph* sub : n->subgraphs()) rename_outer_ref(*sub, old_name, new_name);
}

class GraphConverter {
 public:
  GraphConverter(ir::Model& model, Graph& g, const ConvertOptions& opt, ConvertReport& rep, bool top,
                 const NameTypes& outer)
      : model_(model), g_(g), opt_(opt), rep_(rep), top_(top), outer_(outer), low_(opt.low) {}

  void run() {
    g_.topological_sort();
    types_ = infer_elem_types(model_, g_, outer_);
    for (const auto& n : g_.nodes()) {
      nodes_.emplace_back();
      nodes_.back().node = n.get();
    }
    for (size_t i = 0; i < nodes_.size(); ++i) index_[nodes_[i].node] = i;
    unify_types();
    // BF16 too: float32 lowest (-3.4028e38, the fill value of attention masks) rounds to -inf in
    // bfloat16, whose largest finite value is 3.3895e38.
    eval_constants();
    for (const PatternMatch& m : find_fragile_patterns(g_)) {
      if (m.kind != PatternKind::LayerNorm || m.nodes.size() < 2) continue;
      std::string what = fmt::format("written-out LayerNorm of '{}' ({} nodes)", m.input ? m.input->name() : "?",
                                     m.nodes.size());
      for (Node* n : m.nodes) pattern_[n] = what;
    }
    for (const auto& n : g_.nodes())
      for (Graph* sub : n->subgraphs())
        for (const std::string& name : ir::outer_references(*sub)) body_refs_.insert(name);
    for (const auto& n : g_.nodes()) {
      bool live = false;
      for (Value* v : n->outputs())
        if (v && (!v->uses().empty() || v->is_graph_output() || body_refs_.count(v->name()))) live = true;
      if (!live) initially_dead_.insert(n.get());
    }
    for (NodeState& s : nodes_) classify(s);
    forward();
    backward();
    apply();
    cleanup();
    report();
    recurse();
  }

 private:
  ir::Model& model_;
  Graph& g_;
  const ConvertOptions& opt_;
  ConvertReport& rep_;
  const bool top_;
  const NameTypes& outer_;
  const DType low_;

  TypeMap types_;
  std::vector<NodeState> nodes_;
  std::unordered_map<const Node*, size_t> index_;
  std::unordered_map<const Value*, double> const_max_;
  std::unordered_map<const Node*, std::string> pattern_;
  std::unordered_set<std::string> body_refs_;
  std::unordered_map<const Value*, Prec> produced_;
  std::unordered_set<const Value*> soft_;      // ignored by the follow rule (constants, graph inputs, deferred)
  std::unordered_set<const Value*> deferred_;  // precision decided by the consumers
  std::map<std::pair<const Value*, Prec>, Value*> versions_;
  std::unordered_set<const Value*> created_;
  std::vector<Node*> created_nodes_;
  std::unordered_set<const Node*> created_casts_;
  std::vector<Value*> copied_inits_;
  std::unordered_set<const Node*> removed_;
  std::unordered_set<const Value*> overflow_seen_;
  std::unordered_set<const Node*> initially_dead_;

  // ---------------------------------------------------------------- types

  DType orig(const Value* v) const {
    if (!v) return DType::Undefined;
    auto it = types_.find(v);
    return it == types_.end() ? DType::Undefined : it->second;
  }
  bool cand(const Value* v) const { return v && orig(v) == DType::Float32; }
  bool is_const_init(const Value* v) const { return v->has_initializer() && !v->is_graph_input(); }
  Prec produced(const Value* v) const {
    auto it = produced_.find(v);
    return it == produced_.end() ? Prec::F32 : it->second;
  }
  DType dtype_of(Prec p) const { return p == Prec::Low ? low_ : DType::Float32; }
  DType final_dtype(const Value* v) const {
    DType d = orig(v);
    return d == DType::Float32 ? dtype_of(produced(v)) : d;
  }
  Prec io_prec() const { return top_ && !opt_.keep_io_types ? Prec::Low : Prec::F32; }
  int64_t opset_of(const Node& n) const {
    int64_t v = model_.opset(n.domain);
    return v == 0 ? 1 : v;
  }

  // Values of unknown type that share a type constraint with a typed input/output get its type.
  void unify_types() {
    for (NodeState& s : nodes_) {
      const Node& n = *s.node;
      if (!n.subgraphs().empty()) continue;
      const OpSignature& sig = op_signature(n.domain, n.op_type, opset_of(n));
      if (!sig.known) continue;
      std::map<std::string, DType> param_type;
      auto note = [&](const TypeParam* p, const Value* v) {
        if (!p || !v || p->name.rfind("tensor(", 0) == 0) return;
        DType d = orig(v);
        if (d != DType::Undefined) param_type.emplace(p->name, d);
      };
      for (size_t i = 0; i < n.num_inputs(); ++i) note(sig.input(i), n.input(i));
      for (size_t i = 0; i < n.num_outputs(); ++i) note(sig.output(i), n.output(i));
      auto fill = [&](const TypeParam* p, const Value* v) {
        if (!p || !v || orig(v) != DType::Undefined || p->variadic) return;
        auto it = param_type.find(p->name);
        if (it != param_type.end()) types_[v] = it->second;
      };
      for (size_t i = 0; i < n.num_inputs(); ++i) fill(sig.input(i), n.input(i));
      for (size_t i = 0; i < n.num_outputs(); ++i) fill(sig.output(i), n.output(i));
    }
  }

  // Max |x| of every constant-derived float32 value (initializers, Constant nodes and nodes fed
  // only by them), so a consumer of an overflowing constant stays FP32 even behind a Transpose.
  void eval_constants() {
    std::unordered_map<const Value*, Tensor> vals;
    for (Value* v : g_.initializers())
      if (is_const_init(v)) {
        vals[v] = v->initializer();
        if (v->initializer().dtype() == DType::Float32) const_max_[v] = max_abs_finite(v->initializer());
      }
    size_t budget = size_t(256) << 20;
    for (NodeState& s : nodes_) {
      const Node& n = *s.node;
      if (!n.domain.empty() || !n.subgraphs().empty() || is_random(n.op_type) || n.num_outputs() == 0) continue;
      std::vector<const Tensor*> ins(n.num_inputs(), nullptr);
      bool all = true;
      for (size_t i = 0; i < n.num_inputs() && all; ++i) {
        if (!n.input(i)) continue;
        auto it = vals.find(n.input(i));
        if (it == vals.end()) all = false;
        else ins[i] = &it->second;
      }
      if (!all) continue;
      std::vector<Tensor> outs;
      try {
        outs = rt::evaluate_node(n, static_cast<int>(opset_of(n)), ins);
      } catch (const Error&) {
        continue;
      }
      for (size_t i = 0; i < outs.size() && i < n.num_outputs(); ++i) {
        if (!n.output(i) || !outs[i].defined()) continue;
        if (outs[i].nbytes() > budget) continue;
        budget -= outs[i].nbytes();
        if (outs[i].dtype() == DType::Float32) const_max_[n.output(i)] = max_abs_finite(outs[i]);
        vals[n.output(i)] = std::move(outs[i]);
      }
    }
  }

  // ---------------------------------------------------------------- classification

  void pin(NodeState& s, std::string category, std::string reason) {
    s.kind = Kind::Fixed;
    s.prec = Prec::F32;
    s.category = std::move(category);
    s.reason = std::move(reason);
  }

  void classify(NodeState& s) {
    Node& n = *s.node;
    const std::string& op = n.op_type;
    s.in.assign(n.num_inputs(), {});
    s.out.assign(n.num_outputs(), {});
    bool any = false;
    for (Value* v : n.inputs()) any = any || cand(v);
    for (Value* v : n.outputs()) any = any || cand(v);
    if (!any) {
      s.counted = false;
      return;
    }
    auto fix_inputs = [&] {
      for (size_t i = 0; i < n.num_inputs(); ++i)
        if (cand(n.input(i))) s.in[i].role = Role::Fixed32;
    };
    if (!n.subgraphs().empty()) {
      fix_inputs();
      s.category = "subgraph";
      s.reason = "control flow: interface kept in FP32, body converted on its own";
      return;
    }
    if (!n.domain.empty()) {
      fix_inputs();
      s.category = "custom";
      s.reason = fmt::format("op of domain '{}' runs as it is", n.domain);
      return;
    }
    const bool is_constant = op == "Constant" || op == "ConstantOfShape";
    if (is_constant || op == "Cast") {
      s.counted = false;
      if (op == "Cast" && cand(n.input(0))) s.in[0].role = Role::AsIs;
      bool convertible = cand(n.output(0)) && (op != "Constant" || constant_float_value(n).defined());
      if (!convertible) return;
      s.out[0].role = Role::Main;
      s.has_main = true;
      s.kind = Kind::Flex;
      apply_pins(s, /*flex=*/true);
      return;
    }
    if (inputs_pinned_fp32(op) || is_sequence_op(op)) {
      fix_inputs();
      s.category = "policy";
      s.reason = is_sequence_op(op) ? "sequence/optional op: element types kept" : policy_entry(op)->why;
      return;
    }
    const OpSignature& sig = op_signature(n.domain, op, opset_of(n));
    if (!sig.known) {
      fix_inputs();
      s.category = "schema";
      s.reason = fmt::format("libonnx has no schema for {} at opset {}: kept as it is", op, opset_of(n));
      return;
    }
    struct Group {
      std::vector<size_t> ins, outs;
      const TypeParam* param = nullptr;
    };
    std::vector<std::pair<std::string, Group>> groups;  // in first-seen order
    auto group_of = [&](const TypeParam* p) -> Group& {
      for (auto& [name, grp] : groups)
        if (name == p->name) return grp;
      groups.emplace_back(p->name, Group{});
      groups.back().second.param = p;
      return groups.back().second;
    };
    auto groupable = [](const TypeParam* p) { return p && p->name.rfind("tensor(", 0) != 0 && p->f32; };
    for (size_t i = 0; i < n.num_inputs(); ++i) {
      if (!cand(n.input(i))) continue;
      const TypeParam* p = sig.input(i);
      if (!groupable(p) || input_stays_fp32(op, i)) s.in[i].role = Role::Fixed32;
      else group_of(p).ins.push_back(i);
    }
    for (size_t i = 0; i < n.num_outputs(); ++i) {
      if (!cand(n.output(i))) continue;
      const TypeParam* p = sig.output(i);
      if (groupable(p)) group_of(p).outs.push_back(i);
    }
    // The main group: the one holding the first float32 output.
    std::string main_name;
    size_t best_out = SIZE_MAX;
    for (auto& [name, grp] : groups)
      if (!grp.outs.empty() && grp.outs.front() < best_out) {
        best_out = grp.outs.front();
        main_name = name;
      }
    const TypeParam* main_param = nullptr;
    for (auto& [name, grp] : groups) {
      if (name == main_name) {
        for (size_t i : grp.ins) s.in[i].role = Role::Main;
        for (size_t i : grp.outs) s.out[i].role = Role::Main;
        s.has_main = true;
        main_param = grp.param;
      } else if (!grp.outs.empty()) {
        for (size_t i : grp.ins) s.in[i].role = Role::Fixed32;
      } else if (grp.ins.size() >= 2) {
        int gi = static_cast<int>(s.widest.size());
        s.widest.push_back(Prec::F32);
        for (size_t i : grp.ins) s.in[i] = Slot{Role::Widest, gi};
      } else {
        for (size_t i : grp.ins) s.in[i].role = Role::AsIs;
      }
    }
    if (!s.has_main) {
      s.counted = false;
      return;
    }
    if (!main_param->allows(low_)) {
      pin(s, "schema",
          fmt::format("ONNX {}-{} does not accept {}", op, sig.since_version, dtype_name(low_)));
      return;
    }
    apply_pins(s, /*flex=*/false);
  }

  bool named(const std::set<std::string>& set, const Node& n) const { return !n.name.empty() && set.count(n.name); }

  void apply_pins(NodeState& s, bool flex) {
    const Node& n = *s.node;
    const bool keep_by_name = named(opt_.keep_fp32, n), force_by_name = named(opt_.force_low, n);
    const bool user_keep = keep_by_name || (!force_by_name && opt_.keep_fp32.count(n.op_type));
    const bool user_force = !user_keep && (force_by_name || opt_.force_low.count(n.op_type));
    const OpClass cls = policy_class(n.domain, n.op_type, low_);
    if (user_keep) return pin(s, "user", "--keep-fp32");
    if (!user_force) {
      if (auto it = pattern_.find(&n); it != pattern_.end()) return pin(s, "pattern", it->second);
      if (cls == OpClass::Fp32 && !flex) {
        const PolicyEntry* e = policy_entry(n.op_type);
        return pin(s, "policy", fmt::format("{} runs in FP32: {}", n.op_type, e ? e->why : "custom op"));
      }
    }
    // Constants above the low type's range: the consumer keeps the FP32 constant.
    for (size_t i = 0; i < n.num_inputs(); ++i) {
      if (s.in[i].role != Role::Main) continue;
      auto it = const_max_.find(n.input(i));
      if (it == const_max_.end() || it->second <= low_max(low_)) continue;
      if (overflow_seen_.insert(n.input(i)).second) ++rep_.overflow_constants;
      return pin(s, "constant",
                 fmt::format("constant '{}' has |x| up to {:.4g} > {} ({} max): kept FP32 instead of clamping",
                             n.input(i)->name(), it->second, low_max(low_), low_suffix(low_)));
    }
    if (!user_force && opt_.magnitudes && top_) {
      double worst = -1.0;
      std::string where;
      auto look = [&](const Value* v, const char* kind) {
        if (!cand(v)) return;
        auto it = opt_.magnitudes->find(v->name());
        if (it == opt_.magnitudes->end()) return;
        if (it->second > worst) {
          worst = it->second;
          where = fmt::format("{} '{}'", kind, v->name());
        }
      };
      for (size_t i = 0; i < n.num_inputs(); ++i)
        if (s.in[i].role == Role::Main) look(n.input(i), "input");
      for (size_t i = 0; i < n.num_outputs(); ++i)
        if (s.out[i].role == Role::Main) look(n.output(i), "output");
      if (!(worst <= low_max(low_)))
        return pin(s, "data", fmt::format("max |x| = {:.4g} at {} would overflow {} (max {})", worst, where,
                                          low_suffix(low_), low_max(low_)));
      if (worst > opt_.max_magnitude)
        return pin(s, "data", fmt::format("max |x| = {:.4g} at {} exceeds --max-magnitude {}", worst, where,
                                          opt_.max_magnitude));
    }
    if (flex) return;  // Constant / Cast: decided by the consumers
    if (user_force || cls == OpClass::Low) {
      s.kind = Kind::Fixed;
      s.prec = Prec::Low;
    } else {
      s.kind = Kind::Follow;
    }
  }

  // ---------------------------------------------------------------- deciding

  void forward() {
    for (Value* v : g_.values()) {
      if (!cand(v)) continue;
      if (is_const_init(v)) {
        soft_.insert(v);
        deferred_.insert(v);
      } else if (v->is_outer_scope() || (v->is_graph_input() && (!top_ || opt_.keep_io_types || v->has_initializer()))) {
        soft_.insert(v);
        produced_[v] = Prec::F32;
      } else if (v->is_graph_input()) {
        produced_[v] = Prec::Low;
      }
    }
    for (NodeState& s : nodes_) {
      Node& n = *s.node;
      for (size_t gi = 0; gi < s.widest.size(); ++gi) {
        bool any = false, wide = false;
        for (size_t i = 0; i < n.num_inputs(); ++i) {
          if (s.in[i].role != Role::Widest || s.in[i].group != static_cast<int>(gi)) continue;
          auto big = const_max_.find(n.input(i));
          if (big != const_max_.end() && big->second > low_max(low_)) wide = true;
          if (soft_.count(n.input(i))) continue;
          any = true;
          wide = wide || produced(n.input(i)) == Prec::F32;
        }
        s.widest[gi] = (any && !wide) ? Prec::Low : Prec::F32;
      }
      if (s.kind == Kind::Follow) {
        const Value* wide_input = nullptr;
        bool any = false;
        for (size_t i = 0; i < n.num_inputs(); ++i) {
          if (s.in[i].role != Role::Main || soft_.count(n.input(i))) continue;
          any = true;
          if (produced(n.input(i)) == Prec::F32 && !wide_input) wide_input = n.input(i);
        }
        if (!any) {
          s.kind = Kind::Flex;
        } else {
          s.prec = wide_input ? Prec::F32 : Prec::Low;
          if (wide_input) {
            s.category = "follow";
            s.reason = fmt::format("follows FP32 input '{}'", wide_input->name());
          }
        }
      }
      for (size_t i = 0; i < n.num_outputs(); ++i) {
        Value* v = n.output(i);
        if (!cand(v)) continue;
        if (s.out[i].role == Role::Main && s.kind == Kind::Flex) {
          soft_.insert(v);
          deferred_.insert(v);
        } else {
          produced_[v] = s.out[i].role == Role::Main ? s.prec : Prec::F32;
        }
      }
    }
  }

  // Precision a consumer slot needs, if any.
  std::optional<Prec> requirement(const Node* consumer, size_t index) const {
    auto it = index_.find(consumer);
    if (it == index_.end()) return std::nullopt;
    const NodeState& s = nodes_[it->second];
    if (index >= s.in.size()) return std::nullopt;
    const Slot& slot = s.in[index];
    switch (slot.role) {
      case Role::Main: return s.prec;
      case Role::Fixed32: return Prec::F32;
      case Role::Widest: return s.widest[static_cast<size_t>(slot.group)];
      default: return std::nullopt;
    }
  }

  // Low when every consumer that cares needs low (and at least one does).
  Prec resolve_by_consumers(const Value* v, bool* any_out = nullptr) const {
    bool any = false, all_low = true;
    for (const ir::Use& u : v->uses())
      if (auto r = requirement(u.node, static_cast<size_t>(u.input_index))) {
        any = true;
        all_low = all_low && *r == Prec::Low;
      }
    if (v->is_graph_output()) {
      any = true;
      all_low = all_low && io_prec() == Prec::Low;
    }
    if (body_refs_.count(v->name())) {
      any = true;
      all_low = false;
    }
    if (any_out) *any_out = any;
    return any && all_low ? Prec::Low : Prec::F32;
  }

  void backward() {
    for (size_t k = nodes_.size(); k-- > 0;) {
      NodeState& s = nodes_[k];
      if (s.kind != Kind::Flex) continue;
      Node& n = *s.node;
      bool any = false, all_low = true;
      for (size_t i = 0; i < n.num_outputs(); ++i) {
        if (s.out[i].role != Role::Main) continue;
        bool a = false;
        Prec p = resolve_by_consumers(n.output(i), &a);
        if (a) {
          any = true;
          all_low = all_low && p == Prec::Low;
        }
      }
      s.prec = any && all_low ? Prec::Low : Prec::F32;
      if (s.prec == Prec::F32 && s.category.empty()) {
        s.category = "follow";
        s.reason = any ? "fed by constants/graph inputs only; a consumer needs FP32"
                       : "fed by constants/graph inputs only; no consumer needs low precision";
      }
      for (size_t i = 0; i < n.num_outputs(); ++i)
        if (s.out[i].role == Role::Main) produced_[n.output(i)] = s.prec;
    }
    for (Value* v : g_.initializers())
      if (deferred_.count(v)) produced_[v] = resolve_by_consumers(v);
  }

  // ---------------------------------------------------------------- rewriting

  ir::ValueType typed_like(const Value* v, DType elem) const {
    ir::ValueType t = v->type;
    if (t.is_tensor()) t.elem = elem;
    else t = ir::ValueType::tensor_unranked(elem);
    return t;
  }

  void count_underflow(const std::string& name, int64_t n) {
    if (n <= 0) return;
    rep_.underflow_values += n;
    rep_.underflow_tensors.emplace_back(name, n);
  }

  // The value `v` in precision `r`: a converted copy of a constant, or one shared Cast.
  Value* version(Value* v, Prec r) {
    auto key = std::make_pair(static_cast<const Value*>(v), r);
    if (auto it = versions_.find(key); it != versions_.end()) return it->second;
    const DType to = dtype_of(r);
    const std::string name = g_.unique_name(fmt::format("{}_{}", v->name(), r == Prec::Low ? low_suffix(low_) : "fp32"));
    Value* out = nullptr;
    Node* producer = v->producer();
    if (is_const_init(v)) {
      int64_t uf = 0;
      Tensor data = r == Prec::Low ? to_low(v->initializer(), low_, &uf) : v->initializer();
      out = g_.add_initializer(name, data);
      if (r == Prec::Low) {
        ++rep_.initializer_copies;
        count_underflow(name, uf);
      }
      copied_inits_.push_back(v);
    } else if (producer && producer->domain.empty() && producer->op_type == "Constant" &&
               constant_float_value(*producer).defined()) {
      int64_t uf = 0;
      Tensor orig_value = constant_float_value(*producer);
      Tensor data = r == Prec::Low ? to_low(orig_value, low_, &uf) : orig_value;
      out = g_.add_value(name, ir::ValueType::tensor(to, data.shape()));
      Node* c = g_.add_node("Constant", {}, {out}, name);
      c->set_attr(ir::Attribute::make_tensor("value", data));
      created_nodes_.push_back(c);
      if (r == Prec::Low) {
        ++rep_.initializer_copies;
        count_underflow(name, uf);
      }
    } else {
      out = g_.add_value(name, typed_like(v, to));
      Node* c = g_.add_node("Cast", {v}, {out}, name);
      c->set_attr(ir::Attribute::make_int("to", static_cast<int64_t>(to)));
      created_nodes_.push_back(c);
      created_casts_.insert(c);
    }
    types_[out] = DType::Float32;
    produced_[out] = r;
    created_.insert(out);
    versions_[key] = out;
    return out;
  }

  void apply() {
    const Prec io = io_prec();
    // Graph outputs keep their names (the interface): a mismatching producer writes a renamed
    // value and one Cast produces the output.
    for (size_t i = 0; i < g_.outputs().size(); ++i) {
      Value* v = g_.outputs()[i];
      if (!cand(v) || produced(v) == io) continue;
      if (is_const_init(v)) {
        produced_[v] = io;  // converted in place below; other consumers get a copy
        continue;
      }
      Node* p = v->producer();
      if (!p) continue;
      const Prec inner = produced(v);
      Value* renamed = g_.add_value(g_.unique_name(fmt::format("{}_{}", v->name(), inner == Prec::Low ? low_suffix(low_) : "fp32")),
                                    typed_like(v, dtype_of(inner)));
      g_.set_node_output(p, static_cast<size_t>(v->producer_index()), renamed);
      g_.replace_uses(v, renamed);
      if (body_refs_.count(v->name())) body_refs_.insert(renamed->name());
      types_[renamed] = DType::Float32;
      produced_[renamed] = inner;
      produced_[v] = io;
      Node* c = g_.add_node("Cast", {renamed}, {v}, renamed->name() + "_to_output");
      c->set_attr(ir::Attribute::make_int("to", static_cast<int64_t>(dtype_of(io))));
      created_nodes_.push_back(c);
      created_casts_.insert(c);
      versions_[{renamed, io}] = v;
    }
    // Every input gets the precision its slot needs.
    for (NodeState& s : nodes_) {
      Node& n = *s.node;
      for (size_t i = 0; i < n.num_inputs(); ++i) {
        Value* v = n.input(i);
        if (!cand(v)) continue;
        auto r = requirement(&n, i);
        if (r && produced(v) != *r) g_.set_node_input(&n, i, version(v, *r));
      }
    }
    // Bodies read values of this graph in FP32.
    for (NodeState& s : nodes_) {
      for (Graph* body : s.node->subgraphs())
        for (const std::string& name : ir::outer_references(*body)) {
          Value* v = g_.find(name);
          if (!v || !cand(v) || produced(v) != Prec::Low) continue;
          Value* v32 = version(v, Prec::F32);
          rename_outer_ref(*body, name, v32->name());
        }
    }
    // In-place conversion of everything produced in low precision.
    for (Value* v : g_.values()) {
      if (!cand(v) || produced(v) != Prec::Low || created_.count(v)) continue;
      Node* p = v->producer();
      if (is_const_init(v)) {
        int64_t uf = 0;
        Tensor data = to_low(v->initializer(), low_, &uf);
        g_.set_initializer(v, std::move(data));
        ++rep_.initializers_converted;
        count_underflow(v->name(), uf);
      } else if (p && p->domain.empty() && p->op_type == "Constant") {
        int64_t uf = 0;
        Tensor data = to_low(constant_float_value(*p), low_, &uf);
        p->remove_attr("value_float");
        p->remove_attr("value_floats");
        p->set_attr(ir::Attribute::make_tensor("value", data));
        ++rep_.initializers_converted;
        count_underflow(v->name(), uf);
      } else if (p && p->domain.empty() && p->op_type == "ConstantOfShape") {
        const Tensor* t = p->attr_tensor("value");
        Tensor value = t ? *t : Tensor::from<float>({1}, {0.0f});
        p->set_attr(ir::Attribute::make_tensor("value", rt::narrow_from_float32(value, low_)));
      } else if (p && p->domain.empty() && p->op_type == "Cast") {
        p->set_attr(ir::Attribute::make_int("to", static_cast<int64_t>(low_)));
        ++rep_.casts_retargeted;
      }
      if (v->type.is_tensor()) v->type.elem = low_;
      else if (v->is_graph_input()) v->type = ir::ValueType::tensor_unranked(low_);
    }
  }

  // ---------------------------------------------------------------- clean-up

  std::unordered_set<std::string> refs_now_;
  void refresh_refs() {
    refs_now_.clear();
    for (const auto& n : g_.nodes())
      for (Graph* sub : n->subgraphs())
        for (const std::string& r : ir::outer_references(*sub)) refs_now_.insert(r);
  }
  bool referenced(const Value* v) const {
    return !v->uses().empty() || v->is_graph_output() || refs_now_.count(v->name());
  }

  void remove(Node* n) {
    if (created_casts_.count(n)) {
      created_casts_.erase(n);
    } else if (n->op_type == "Cast") {
      ++rep_.casts_removed;
    }
    removed_.insert(n);
    g_.remove_node(n);
  }

  void cleanup() {
    bool changed = true;
    while (changed) {
      changed = false;
      refresh_refs();
      std::vector<Node*> casts;
      for (const auto& n : g_.nodes())
        if (n->domain.empty() && n->op_type == "Cast" && n->num_inputs() == 1 && n->input(0) && n->output(0))
          casts.push_back(n.get());
      for (Node* c : casts) {
        if (removed_.count(c)) continue;
        Value* x = c->input(0);
        Value* y = c->output(0);
        const DType to = static_cast<DType>(c->attr_int("to", 0));
        const DType dx = final_dtype(x);
        if (dx == to && !y->is_graph_output()) {  // no-op Cast
          g_.replace_uses(y, x);
          remove(c);
          changed = true;
          continue;
        }
        Node* inner = x->producer();
        if (!inner || !inner->domain.empty() || inner->op_type != "Cast" || removed_.count(inner)) continue;
        Value* x0 = inner->input(0);
        const DType d0 = final_dtype(x0);
        const DType mid = static_cast<DType>(inner->attr_int("to", 0));
        if (d0 == DType::Undefined || !exact_widening(d0, mid)) continue;
        if (d0 == to && !y->is_graph_output()) {
          g_.replace_uses(y, x0);  // round trip through a wider type
          remove(c);
        } else {
          g_.set_node_input(c, 0, x0);  // skip the exact widening
        }
        if (!referenced(x)) remove(inner);
        changed = true;
      }
    }
    // One Cast per (tensor, type).
    std::map<std::pair<const Value*, int64_t>, Node*> first;
    std::vector<Node*> casts;
    for (const auto& n : g_.nodes())
      if (n->domain.empty() && n->op_type == "Cast" && n->num_inputs() == 1 && n->input(0) && n->output(0))
        casts.push_back(n.get());
    for (Node* c : casts) {
      auto key = std::make_pair(static_cast<const Value*>(c->input(0)), c->attr_int("to", 0));
      auto [it, fresh] = first.emplace(key, c);
      if (fresh || c->output(0)->is_graph_output()) continue;
      g_.replace_uses(c->output(0), it->second->output(0));
      remove(c);
    }
    // Nodes this pass made or left without readers.
    for (bool again = true; again;) {
      again = false;
      refresh_refs();
      std::vector<Node*> candidates;
      for (const auto& n : g_.nodes())
        if (n->domain.empty() && (n->op_type == "Cast" || n->op_type == "Constant")) candidates.push_back(n.get());
      for (Node* n : candidates) {
        bool live = false;
        for (Value* v : n->outputs())
          if (v && referenced(v)) live = true;
        bool ours = std::find(created_nodes_.begin(), created_nodes_.end(), n) != created_nodes_.end() ||
                    (index_.count(n) && !initially_dead_.count(n));
        if (!live && ours && n->num_outputs() > 0) {
          remove(n);
          again = true;
        }
      }
    }
    refresh_refs();
    for (Value* v : copied_inits_)
      if (v->has_initializer() && !referenced(v)) g_.clear_initializer(v);
    g_.remove_unused_values();
    g_.topological_sort();
  }

  // ---------------------------------------------------------------- report and bodies

  void report() {
    rep_.casts_inserted += static_cast<int>(created_casts_.size());
    for (NodeState& s : nodes_) {
      if (removed_.count(s.node)) continue;
      const Node& n = *s.node;
      if (s.has_main && s.counted) {
        if (s.prec == Prec::Low) {
          ++rep_.nodes_low;
          continue;
        }
        if (s.category.empty()) s.category = "follow";
      } else if (s.has_main || s.category.empty()) {
        continue;  // Constant / Cast plumbing, or nothing float
      }
      ++rep_.nodes_fp32;
      std::string prefix = top_ ? "" : fmt::format("[{}] ", g_.name.empty() ? "body" : g_.name);
      rep_.kept.push_back(KeptNode{prefix + node_display_name(n), n.op_type, s.category, s.reason});
      ++rep_.kept_by_category[s.category];
    }
  }

  void recurse() {
    NameTypes names = outer_;
    for (const Value* v : g_.values()) {
      DType d = final_dtype(v);
      if (d != DType::Undefined) names[v->name()] = d;
    }
    for (const auto& n : g_.nodes())
      for (Graph* body : n->subgraphs()) {
        GraphConverter(model_, *body, opt_, rep_, false, names).run();
        ++rep_.subgraphs;
      }
  }
};

// Raises a model at opset 13..15 to 16, where Relu, Pow, Where, LeakyRelu, PRelu and the
// comparisons accept bfloat16. No op changes meaning on the way except RoiAlign (whose default
// coordinate_transformation_mode became half_pixel at 16: the old behaviour is written out) and
// BatchNormalization training outputs (refused).
bool raise_to_16(ir::Model& model, std::string* why) {
  std::vector<Graph*> graphs = {model.graph.get()};
  for (size_t k = 0; k < graphs.size(); ++k)
    for (const auto& n : graphs[k]->nodes()) {
      if (n->domain.empty() && n->op_type == "BatchNormalization" && n->num_outputs() > 1) {
        for (size_t i = 1; i < n->num_outputs(); ++i)
          if (n->output(i)) {
            *why = fmt::format("{} has training outputs", n->label());
            return false;
          }
      }
      for (Graph* sub : n->subgraphs()) graphs.push_back(sub);
    }
  for (Graph* g : graphs)
    for (const auto& n : g->nodes())
      if (n->domain.empty() && n->op_type == "RoiAlign" && !n->has_attr("coordinate_transformation_mode"))
        n->set_attr(ir::Attribute::make_string("coordinate_transformation_mode", "output_half_pixel"));
  model.set_opset("", 16);
  if (model.ir_version < 8) model.ir_version = 8;
  return true;
}

// True when some op in the model would accept bfloat16 at opset 16 but not at its current opset.
bool bf16_gains_at_16(const ir::Model& model) {
  const int64_t now = model.opset();
  std::vector<const Graph*> graphs = {model.graph.get()};
  for (size_t k = 0; k < graphs.size(); ++k)
    for (const auto& n : graphs[k]->nodes()) {
      for (Graph* sub : n->subgraphs()) graphs.push_back(sub);
      if (!n->domain.empty()) continue;
      const OpSignature& a = op_signature("", n->op_type, now);
      const OpSignature& b = op_signature("", n->op_type, 16);
      if (!a.known || !b.known || a.outputs.empty() || b.outputs.empty()) continue;
      if (!a.outputs[0].bf16 && b.outputs[0].bf16) return true;
    }
  return false;
}

// Ops whose meaning changes on the way from opset 10..12 to 13 in ways upgrade_opset does not
// rewrite: raising such a model would silently change it, so BF16 conversion refuses instead.
std::string unsafe_to_raise(const ir::Model& model) {
  const int64_t from = model.opset();
  for (const auto& n : model.graph->nodes()) {
    if (!n->domain.empty()) continue;
    if (from < 12 && n->op_type == "Dropout" && (n->has_attr("ratio") || n->has_attr("seed")))
      return fmt::format("{} has a ratio attribute (an input from opset 12)", n->label());
    if (from < 11 && n->op_type == "Resize")
      return fmt::format("{}: Resize changed inputs and coordinate mapping at opset 11", n->label());
    if (from < 11 && (n->op_type == "Scatter" || n->op_type == "Upsample"))
      return fmt::format("{}: {} is deprecated at opset 13", n->label(), n->op_type);
  }
  return {};
}

void check_overrides(const ir::Model& model, const ConvertOptions& opt) {
  for (const std::string& k : opt.keep_fp32)
    if (opt.force_low.count(k)) fail_input("'{}' is in both --keep-fp32 and --force-low", k);
  std::set<std::string> names, ops;
  std::vector<const Graph*> graphs = {model.graph.get()};
  for (size_t k = 0; k < graphs.size(); ++k)
    for (const auto& n : graphs[k]->nodes()) {
      if (!n->name.empty()) names.insert(n->name);
      ops.insert(n->op_type);
      for (Graph* sub : n->subgraphs()) graphs.push_back(sub);
    }
  auto check = [&](const std::set<std::string>& set, const char* flag) {
    for (const std::string& k : set) {
      if (names.count(k) || ops.count(k) || policy_entry(k) || op_signature("", k, model.opset()).known) continue;
      fail_input("{} '{}' names neither a node of the model nor an ONNX op type", flag, k);
    }
  };
  check(opt.keep_fp32, "--keep-fp32");
  check(opt.force_low, "--force-low");
}

}  // namespace

ConvertReport convert_precision(ir::Model& model, const ConvertOptions& options) {
  if (options.low != DType::Float16 && options.low != DType::BFloat16)
    fail_input("convert_precision: target must be float16 or bfloat16, not {}", dtype_name(options.low));
  if (!(options.max_magnitude > 0.0)) fail_input("--max-magnitude must be positive, got {}", options.max_magnitude);
  check_overrides(model, options);
  ConvertReport rep;
  rep.low = options.low;
  rep.opset_before = model.opset();
  if (options.low == DType::BFloat16 && model.opset() > 0) {
    if (model.opset() < 13) {
      std::string why;
      if (!options.raise_opset)
        fail_input("BF16 needs opset 13 (Cast to bfloat16 and most ops); the model is at opset {}", model.opset());
      if (std::string unsafe = unsafe_to_raise(model); !unsafe.empty())
        fail_input("BF16 needs opset 13 (Cast to bfloat16 and most ops); the model is at opset {} and cannot be raised: {}",
                   rep.opset_before, unsafe);
      if (!upgrade_opset(model, 13, &why))
        fail_input("BF16 needs opset 13 (Cast to bfloat16 and most ops); the model is at opset {} and cannot be raised: {}",
                   rep.opset_before, why);
      rep.notes.push_back(fmt::format("opset raised from {} to 13 for bfloat16", rep.opset_before));
    }
    if (model.opset() < 16 && options.raise_opset && bf16_gains_at_16(model)) {
      std::string why;
      int64_t from = model.opset();
      if (raise_to_16(model, &why))
        rep.notes.push_back(fmt::format("opset raised from {} to 16 so that Relu/Pow/Where/LeakyRelu/PRelu accept bfloat16", from));
      else
        rep.notes.push_back(fmt::format("opset kept at {} ({}); ops without bfloat16 there stay FP32", from, why));
    }
  }
  GraphConverter(model, *model.graph, options, rep, true, NameTypes{}).run();
  if (options.narrow_tables_min_elements > 0) {
    NarrowedTables t = narrow_gather_tables(*model.graph, options.low, options.narrow_tables_min_elements, options.keep_fp32);
    rep.tables_narrowed = t.tables;
    rep.table_bytes_saved = t.bytes_saved;
    rep.initializers_converted += t.tables;
    rep.underflow_values += t.underflow_values;
    rep.underflow_tensors.insert(rep.underflow_tensors.end(), t.underflow_tensors.begin(), t.underflow_tensors.end());
  }
  rep.opset_after = model.opset();
  if (rep.underflow_values > 0)
    rep.notes.push_back(fmt::format("{} non-zero constant value(s) in {} tensor(s) became 0 in {}", rep.underflow_values,
                                    rep.underflow_tensors.size(), dtype_name(options.low)));
  if (rep.overflow_constants > 0)
    rep.notes.push_back(fmt::format("{} constant(s) exceed the {} range; their consumers stay FP32", rep.overflow_constants,
                                    dtype_name(options.low)));
  return rep;
}

int PrecisionLayout::max_casts_per_island() const {
  int m = 0;
  for (int c : casts_per_island) m = std::max(m, c);
  return m;
}

PrecisionLayout describe_precision(const ir::Model& model) {
  PrecisionLayout out;
  const Graph& g = *model.graph;
  TypeMap types = infer_elem_types(model, g, NameTypes{});
  auto type_of = [&](const Value* v) {
    auto it = types.find(v);
    return it == types.end() ? DType::Undefined : it->second;
  };
  auto plumbing = [](const Node& n) {
    return n.domain.empty() && (n.op_type == "Cast" || n.op_type == "Constant" || n.op_type == "ConstantOfShape");
  };
  std::vector<const Node*> nodes;
  for (const auto& n : g.nodes()) nodes.push_back(n.get());
  std::unordered_map<const Node*, size_t> fp32_index;
  std::vector<size_t> parent;
  for (const Node* n : nodes) {
    if (plumbing(*n)) continue;
    bool f32 = false, low = false;
    for (const Value* v : n->outputs()) {
      DType d = type_of(v);
      f32 = f32 || d == DType::Float32;
      low = low || d == DType::Float16 || d == DType::BFloat16;
    }
    if (f32) {
      fp32_index[n] = parent.size();
      parent.push_back(parent.size());
      ++out.fp32_nodes;
    } else if (low) {
      ++out.low_nodes;
    }
  }
  std::function<size_t(size_t)> find = [&](size_t i) { return parent[i] == i ? i : parent[i] = find(parent[i]); };
  for (const Node* n : nodes) {
    auto it = fp32_index.find(n);
    if (it == fp32_index.end()) continue;
    for (const Value* v : n->inputs()) {
      if (!v || !v->producer() || type_of(v) != DType::Float32) continue;
      auto p = fp32_index.find(v->producer());
      if (p != fp32_index.end()) parent[find(it->second)] = find(p->second);
    }
  }
  std::map<size_t, size_t> island_of_root;
  for (size_t i = 0; i < parent.size(); ++i) island_of_root.emplace(find(i), island_of_root.size());
  out.islands = static_cast<int>(island_of_root.size());
  out.casts_per_island.assign(island_of_root.size(), 0);
  auto island = [&](const Node* n) -> int {
    auto it = fp32_index.find(n);
    return it == fp32_index.end() ? -1 : static_cast<int>(island_of_root[find(it->second)]);
  };
  for (const Node* n : nodes) {
    if (!n->domain.empty() || n->op_type != "Cast") continue;
    ++out.casts;
    const Value* x = n->input(0);
    const Value* y = n->output(0);
    if ((x && x->is_graph_input()) || (y && y->is_graph_output())) {
      ++out.interface_casts;
      continue;
    }
    std::set<int> touched;
    if (x && x->producer()) touched.insert(island(x->producer()));
    if (y)
      for (const ir::Use& u : y->uses()) touched.insert(island(u.node));
    touched.erase(-1);
    if (!touched.empty()) ++out.boundary_casts;
    for (int i : touched) ++out.casts_per_island[static_cast<size_t>(i)];
  }
  return out;
}

PassStats ConvertPrecision::run(ir::Model& model) {
  report_ = convert_precision(model, options_);
  PassStats stats;
  stats.changed = report_.nodes_low + report_.casts_inserted + report_.initializers_converted;
  stats.notes = report_.notes;
  for (const KeptNode& k : report_.kept)
    if (k.category != "follow") stats.notes.push_back(fmt::format("{} ({}) kept FP32: {}", k.node, k.op, k.reason));
  return stats;
}

}  // namespace mpq::passes
