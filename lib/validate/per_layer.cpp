#include "validate/per_layer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace mpq::validate {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool is_passthrough(const ir::Node* n) {
  return n && n->domain.empty() && (n->op_type == "DequantizeLinear" || n->op_type == "QuantizeLinear" || n->op_type == "Cast");
}

// A tensor worth comparing: fed at run time or computed by a node (constants are not layers).
bool comparable(const ir::Value* v) {
  if (!v) return false;
  if (v->is_graph_input()) return !v->has_initializer();
  const ir::Node* p = v->producer();
  return p && p->op_type != "Constant";
}

bool declared_non_float(const ir::Value* v) {
  return v->type.is_tensor() && v->type.elem != DType::Undefined && !dtype_is_float(v->type.elem);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Nodes of a graph in a dependency order (Kahn, stable: ties keep the stored order).
std::vector<const ir::Node*> topo_nodes(const ir::Graph& g) {
  std::unordered_map<const ir::Node*, int> pending;
  std::unordered_map<const ir::Node*, size_t> index;
  const auto& nodes = g.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i].get()] = i;
  for (const auto& n : nodes) {
    int deps = 0;
    for (const ir::Value* in : n->inputs())
      if (in && in->producer() && in->producer()->graph() == &g) ++deps;
    pending[n.get()] = deps;
  }
  std::vector<const ir::Node*> ready, out;
  for (const auto& n : nodes)
    if (pending[n.get()] == 0) ready.push_back(n.get());
  auto cmp = [&](const ir::Node* a, const ir::Node* b) { return index[a] > index[b]; };
  std::make_heap(ready.begin(), ready.end(), cmp);
  while (!ready.empty()) {
    std::pop_heap(ready.begin(), ready.end(), cmp);
    const ir::Node* n = ready.back();
    ready.pop_back();
    out.push_back(n);
    for (const ir::Value* o : n->outputs()) {
      if (!o) continue;
      for (const ir::Use& u : o->uses()) {
        if (u.node->graph() != &g) continue;
        if (--pending[u.node] == 0) {
          ready.push_back(u.node);
          std::push_heap(ready.begin(), ready.end(), cmp);
        }
      }
    }
  }
  // A cycle (invalid model): append the rest in stored order so every node is visited once.
  if (out.size() < nodes.size()) {
    std::unordered_set<const ir::Node*> seen(out.begin(), out.end());
    for (const auto& n : nodes)
      if (!seen.count(n.get())) out.push_back(n.get());
  }
  return out;
}

// min() that lets NaN win (an unknown error upstream makes the upstream unknown).
double worst(double a, double b) {
  if (a != a || b != b) return std::numeric_limits<double>::quiet_NaN();
  return std::min(a, b);
}

}  // namespace

std::vector<std::pair<std::string, int>> candidate_origins(const ir::Value& v) {
  std::vector<std::pair<std::string, int>> out;
  int h = 0;
  const ir::Value* cur = &v;
  while (is_passthrough(cur->producer()) && cur->producer()->input(0)) {
    cur = cur->producer()->input(0);
    out.emplace_back(cur->name(), ++h);
  }
  const std::string suffix = "_dequantized";
  if (ends_with(v.name(), suffix)) out.emplace_back(v.name().substr(0, v.name().size() - suffix.size()), 1);
  return out;
}

std::unordered_map<std::string, double> mask_thresholds(const ir::Model& ref) {
  constexpr double kFill = 1e4;
  static const std::unordered_set<std::string> carriers = {
      "Where", "Mul", "Sub", "Add", "Neg", "Min", "Max", "Cast", "Expand", "Unsqueeze", "Squeeze", "Reshape",
      "Flatten", "Slice", "Transpose", "Concat", "Tile", "Identity", "Gather"};
  const ir::Graph& g = *ref.graph;
  std::unordered_map<const ir::Value*, double> fill;  // value -> largest fill magnitude reaching it
  auto big_constant = [](const ir::Value* v) -> double {
    const Tensor* t = nullptr;
    if (v->is_constant()) t = &v->initializer();
    else if (v->producer() && v->producer()->op_type == "Constant") t = v->producer()->attr_tensor("value");
    if (!t || !t->is_host() || !dtype_is_float(t->dtype()) || t->numel() > 4096) return 0.0;
    double m = 0.0;
    for (int64_t i = 0; i < t->numel(); ++i) m = std::max(m, std::fabs(t->get_double(i)));
    return m >= kFill ? m : 0.0;
  };
  std::unordered_map<std::string, double> out;
  for (const ir::Node* n : topo_nodes(g)) {
    if (!n->domain.empty() || !carriers.count(n->op_type)) continue;
    double f = 0.0;
    for (const ir::Value* in : n->inputs()) {
      if (!in) continue;
      if (auto it = fill.find(in); it != fill.end()) f = std::max(f, it->second);
      else f = std::max(f, big_constant(in));
    }
    if (!(f > 0.0)) continue;
    for (const ir::Value* o : n->outputs()) {
      if (!o) continue;
      fill[o] = f;
      out[o->name()] = 0.5 * std::min(f, 3.4e38);
    }
  }
  return out;
}

LayerMatching match_layers(const ir::Model& ref, const ir::Model& cand) {
  const ir::Graph& rg = *ref.graph;
  const ir::Graph& cg = *cand.graph;

  // Rule 2 index: reference name -> (hops, candidate value), fewest hops, first in graph order.
  std::unordered_map<std::string, std::pair<int, const ir::Value*>> via;
  for (const ir::Node* n : topo_nodes(cg)) {
    if (n->op_type == "QuantizeLinear") continue;  // integer tensors are never compared
    for (const ir::Value* out : n->outputs()) {
      if (!out || declared_non_float(out)) continue;
      for (const auto& [origin, hops] : candidate_origins(*out)) {
        auto it = via.find(origin);
        if (it == via.end() || hops < it->second.first) via[origin] = {hops, out};
      }
    }
  }

  LayerMatching m;
  const auto masks = mask_thresholds(ref);
  std::unordered_set<const ir::Value*> used;
  auto try_match = [&](const ir::Value* r) {
    if (!comparable(r) || declared_non_float(r) || m.by_ref.count(r->name())) return;
    LayerMatch lm;
    lm.ref_name = r->name();
    lm.ref_node = r->producer();
    if (auto it = masks.find(r->name()); it != masks.end()) lm.mask_threshold = it->second;
    const ir::Value* c = cg.find(r->name());
    if (c && comparable(c) && !declared_non_float(c) && !used.count(c)) {
      lm.cand_name = c->name();
    } else if (auto it = via.find(r->name()); it != via.end() && !used.count(it->second.second)) {
      c = it->second.second;
      lm.cand_name = c->name();
      lm.exact = false;
      lm.hops = it->second.first;
    } else {
      if (r->producer()) m.unmatched.push_back(r->name());
      return;
    }
    used.insert(c);
    m.by_ref[lm.ref_name] = m.matches.size();
    m.by_cand[lm.cand_name] = m.matches.size();
    m.matches.push_back(std::move(lm));
  };
  for (const ir::Value* in : rg.inputs()) try_match(in);
  for (const ir::Node* n : topo_nodes(rg))
    for (const ir::Value* out : n->outputs()) try_match(out);
  return m;
}

void rank_layers(const ir::Model& ref, PerLayerResult& result, const std::vector<LayerResult>& inputs) {
  const ir::Graph& g = *ref.graph;
  std::unordered_map<std::string, double> measured;
  for (const LayerResult& l : inputs) measured[l.name] = l.stats.snr_db();
  for (LayerResult& l : result.layers) {
    l.snr_db = l.stats.snr_db();
    measured[l.name] = l.snr_db;
  }

  // Effective SNR of every tensor: measured where compared; otherwise the worst of what its
  // producer reads (an uncompared tensor is taken to carry its inputs' error unchanged).
  std::unordered_map<const ir::Value*, double> eff;
  auto value_eff = [&](const ir::Value* v) -> double {
    if (!v || v->is_constant()) return kInf;
    if (auto it = measured.find(v->name()); it != measured.end()) return it->second;
    if (auto it = eff.find(v); it != eff.end()) return it->second;
    return kInf;  // graph inputs fed as is, outer-scope values
  };
  std::unordered_map<std::string, double> upstream;
  for (const ir::Node* n : topo_nodes(g)) {
    double up = kInf;
    for (const ir::Value* in : n->inputs()) up = worst(up, value_eff(in));
    for (const ir::Value* out : n->outputs()) {
      if (!out) continue;
      upstream[out->name()] = up;
      eff[out] = measured.count(out->name()) ? measured[out->name()] : up;
    }
  }

  for (LayerResult& l : result.layers) {
    auto it = upstream.find(l.name);
    const double up = it == upstream.end() ? kInf : it->second;
    l.upstream_snr_db = up;
    const double snr = l.snr_db;
    if (snr != snr || up != up) {
      l.drop_db = l.local_snr_db = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (std::isinf(up) && up > 0) l.drop_db = std::isinf(snr) && snr > 0 ? 0.0 : kInf;
    else l.drop_db = up - snr;
    const double noise = std::isinf(snr) ? (snr > 0 ? 0.0 : kInf) : std::pow(10.0, -snr / 10.0);
    const double noise_up = std::isinf(up) ? (up > 0 ? 0.0 : kInf) : std::pow(10.0, -up / 10.0);
    const double added = noise - noise_up;
    if (std::isinf(noise)) l.local_snr_db = -kInf;
    else if (!(added > 0.0)) l.local_snr_db = kInf;
    else l.local_snr_db = -10.0 * std::log10(added);
  }

  // Ranking: unknown (NaN) first, then lowest local SNR, then lowest SNR, then execution order.
  result.ranking.resize(result.layers.size());
  for (size_t i = 0; i < result.ranking.size(); ++i) result.ranking[i] = i;
  auto key_less = [](double a, double b) {  // NaN sorts first
    const bool an = a != a, bn = b != b;
    if (an != bn) return an;
    if (an) return false;
    return a < b;
  };
  std::stable_sort(result.ranking.begin(), result.ranking.end(), [&](size_t a, size_t b) {
    const LayerResult& x = result.layers[a];
    const LayerResult& y = result.layers[b];
    if (key_less(x.local_snr_db, y.local_snr_db)) return true;
    if (key_less(y.local_snr_db, x.local_snr_db)) return false;
    if (key_less(x.snr_db, y.snr_db)) return true;
    if (key_less(y.snr_db, x.snr_db)) return false;
    return x.order < y.order;
  });

  result.first_jump.reset();
  if (result.ranking.empty()) return;
  const LayerResult& worst_layer = result.layers[result.ranking.front()];
  const double w = worst_layer.local_snr_db;
  if (w != w) {
    for (size_t i = 0; i < result.layers.size(); ++i)
      if (result.layers[i].local_snr_db != result.layers[i].local_snr_db) {
        result.first_jump = i;
        break;
      }
    return;
  }
  if (std::isinf(w) && w > 0) return;  // no layer adds any error
  for (size_t i = 0; i < result.layers.size(); ++i)
    if (result.layers[i].local_snr_db <= w + result.jump_db) {
      result.first_jump = i;
      break;
    }
}

std::string format_db(double db) {
  if (db != db) return "nan";
  if (std::isinf(db)) return db > 0 ? "inf" : "-inf";
  return fmt::format("{:.2f}", db);
}

}  // namespace mpq::validate
