#include "passes/smooth_quant.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "passes/pass.h"
#include "passes/patterns.h"
#include "runtime/executor.h"
#include "runtime/low_precision.h"

namespace mpq::passes {

namespace {

using ir::Graph;
using ir::Node;
using ir::Value;

// A MatMul/Gemm whose weight rows (input channels) can be rescaled.
struct Reader {
  Node* node = nullptr;
  bool rows_are_columns = false;  // Gemm transB = 1: input channel j is column j of B [N, K]
};

std::unordered_map<Value*, std::vector<Reader>> readers_by_activation(const Graph& g, const SmoothQuantOptions& o,
                                                                     std::vector<Value*>* order) {
  const std::vector<PatternMatch> patterns = find_fragile_patterns(g);
  const auto membership = pattern_membership(patterns);
  std::unordered_map<Value*, std::vector<Reader>> out;
  for (const auto& np : g.nodes()) {
    Node* n = np.get();
    if (!n->domain.empty() || (n->op_type != "MatMul" && n->op_type != "Gemm")) continue;
    if (o.exclude_nodes.count(n->name) || o.exclude_ops.count(n->op_type) || membership.count(n)) continue;
    Value* x = n->input(0);
    const Tensor* w = constant_value(n->input(1));
    if (!x || constant_value(x) || !w || w->dtype() != DType::Float32 || w->rank() != 2) continue;
    Reader r{n, false};
    if (n->op_type == "Gemm") {
      if (n->attr_int("transA", 0) != 0) continue;
      r.rows_are_columns = n->attr_int("transB", 0) != 0;
    }
    auto [it, inserted] = out.try_emplace(x);
    if (inserted && order) order->push_back(x);
    it->second.push_back(r);
  }
  return out;
}

int64_t input_channels(const Tensor& w, bool columns) { return columns ? w.dim(1) : w.dim(0); }

}  // namespace

std::vector<std::string> smooth_quant_targets(const ir::Model& model, const SmoothQuantOptions& o) {
  std::vector<Value*> order;
  readers_by_activation(*model.graph, o, &order);
  std::vector<std::string> names;
  for (Value* v : order) names.push_back(v->name());
  return names;
}

std::map<std::string, std::vector<float>> collect_channel_amax(const ir::Model& model, const data::FeedSource& feeds,
                                                               const std::vector<std::string>& names,
                                                               int64_t max_samples, rt::BackendKind backend,
                                                               int threads) {
  std::map<std::string, std::vector<float>> amax;
  const std::unordered_set<std::string> wanted(names.begin(), names.end());
  rt::ExecOptions eo;
  eo.backend = backend;
  eo.threads = threads;
  rt::Executor exec(model, eo);
  exec.set_observer([&](const ir::Value& v, const Tensor& t) {
    if (!wanted.count(v.name()) || t.rank() < 1 || !dtype_is_float(t.dtype())) return;
    Tensor f = t.dtype() == DType::Float32 ? t : rt::widen_to_float32(t);
    const int64_t c = f.dim(-1);
    if (c <= 0) return;
    std::vector<float>& m = amax[v.name()];
    if (m.empty()) m.assign(static_cast<size_t>(c), 0.0f);
    if (static_cast<int64_t>(m.size()) != c) fail_input("tensor '{}' changed its last dimension between feeds", v.name());
    const float* p = f.data<float>();
    const int64_t rows = f.numel() / c;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < c; ++j) {
        const float a = std::fabs(p[r * c + j]);
        if (a > m[static_cast<size_t>(j)] && std::isfinite(a)) m[static_cast<size_t>(j)] = a;
      }
  });
  int64_t total = static_cast<int64_t>(feeds.size());
  if (max_samples >= 0) total = std::min(total, max_samples);
  if (total == 0) fail_input("{}: no feeds for SmoothQuant statistics", feeds.dir().string());
  for (int64_t i = 0; i < total; ++i) exec.run(feeds.get(static_cast<size_t>(i)).tensors);
  return amax;
}

SmoothQuantReport smooth_quant(ir::Model& model, const std::map<std::string, std::vector<float>>& channel_amax,
                               const SmoothQuantOptions& o) {
  if (!(o.alpha >= 0.0 && o.alpha <= 1.0)) fail_input("SmoothQuant alpha must be in [0, 1], got {}", o.alpha);
  Graph& g = *model.graph;
  SmoothQuantReport rep;
  std::vector<Value*> order;
  auto readers = readers_by_activation(g, o, &order);
  for (Value* x : order) {
    auto stat = channel_amax.find(x->name());
    if (stat == channel_amax.end()) continue;
    const std::vector<Reader>& rs = readers[x];
    const int64_t k = static_cast<int64_t>(stat->second.size());
    bool fits = k > 1;
    for (const Reader& r : rs) fits = fits && input_channels(*constant_value(r.node->input(1)), r.rows_are_columns) == k;
    if (!fits) {
      rep.notes.push_back(fmt::format("'{}': channel count does not match its readers' weights; not smoothed", x->name()));
      continue;
    }
    // Largest weight magnitude per input channel over every reader.
    std::vector<float> wmax(static_cast<size_t>(k), 0.0f);
    for (const Reader& r : rs) {
      const Tensor& w = *constant_value(r.node->input(1));
      const float* p = w.data<float>();
      const int64_t rows = w.dim(0), cols = w.dim(1);
      for (int64_t a = 0; a < rows; ++a)
        for (int64_t b = 0; b < cols; ++b) {
          const size_t j = static_cast<size_t>(r.rows_are_columns ? b : a);
          wmax[j] = std::max(wmax[j], std::fabs(p[a * cols + b]));
        }
    }
    std::vector<float> s(static_cast<size_t>(k), 1.0f);
    for (size_t j = 0; j < s.size(); ++j) {
      const double ax = stat->second[j], aw = wmax[j];
      if (!(ax > 0.0) || !(aw > 0.0)) continue;
      const double f = std::pow(ax, o.alpha) / std::pow(aw, 1.0 - o.alpha);
      if (std::isfinite(f)) s[j] = static_cast<float>(std::clamp(f, 1e-5, 1e5));
      rep.largest_factor = std::max(rep.largest_factor, static_cast<double>(s[j]));
    }
    for (const Reader& r : rs) {
      Tensor w = constant_value(r.node->input(1))->clone();
      float* p = w.data<float>();
      const int64_t rows = w.dim(0), cols = w.dim(1);
      for (int64_t a = 0; a < rows; ++a)
        for (int64_t b = 0; b < cols; ++b) p[a * cols + b] *= s[static_cast<size_t>(r.rows_are_columns ? b : a)];
      g.set_node_input(r.node, 1, g.add_initializer(g.unique_name(r.node->input(1)->name() + "_smoothed"), w));
      ++rep.weights;
    }
    // X / s: into the producing LayerNormalization when only smoothed readers see X.
    Node* p = x->producer();
    bool fold = p && p->domain.empty() && p->op_type == "LayerNormalization" && p->attr_int("axis", -1) == -1 &&
                x->producer_index() == 0 && !x->is_graph_output() && x->uses().size() == rs.size();
    const Tensor* gamma = fold ? constant_value(p->input(1)) : nullptr;
    const Tensor* beta = fold && p->input(2) ? constant_value(p->input(2)) : nullptr;
    fold = fold && gamma && gamma->dtype() == DType::Float32 && gamma->numel() == k && (!p->input(2) || (beta && beta->dtype() == DType::Float32 && beta->numel() == k));
    if (fold) {
      for (size_t input = 1; input <= 2; ++input) {
        if (!p->input(input)) continue;
        Tensor t = constant_value(p->input(input))->clone();
        float* d = t.data<float>();
        for (int64_t j = 0; j < k; ++j) d[j] /= s[static_cast<size_t>(j)];
        g.set_node_input(p, input, g.add_initializer(g.unique_name(p->input(input)->name() + "_smoothed"), t));
      }
      ++rep.folded;
    } else {
      std::vector<float> inv(s.size());
      for (size_t j = 0; j < s.size(); ++j) inv[j] = 1.0f / s[j];
      Value* factor = g.add_initializer(g.unique_name(x->name() + "_smooth_scale"), Tensor::from<float>({k}, inv));
      Value* smoothed = g.add_value(g.unique_name(x->name() + "_smoothed"));
      g.add_node("Mul", {x, factor}, {smoothed});
      for (const Reader& r : rs) g.set_node_input(r.node, 0, smoothed);
      ++rep.muls;
    }
    ++rep.activations;
  }
  g.topological_sort();
  remove_unused_initializers(model);
  return rep;
}

}  // namespace mpq::passes
