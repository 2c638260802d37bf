#include "validate/sensitivity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "runtime/executor.h"
#include "validate/report_json.h"

namespace mpq::validate {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool is_compute_op(const ir::Node& n) {
  return n.domain.empty() &&
         (n.op_type == "Conv" || n.op_type == "ConvTranspose" || n.op_type == "Gemm" || n.op_type == "MatMul");
}

// The FP32 side, run once: class scores of one output per chunk, and labels.
class ReferenceCache {
 public:
  ReferenceCache(const ir::Model& ref, const data::FeedSource& feeds, const CompareOptions& o)
      : ref_(ref), feeds_(feeds), o_(o) {
    rt::ExecOptions eo;
    eo.backend = o.backend;
    eo.threads = o.threads;
    rt::Executor exec(ref, eo);
    const auto& labels = feeds.labels();
    for_each_chunk(feeds, o.batch_rows, o.max_samples, [&](const Chunk& c) {
      std::vector<Tensor> outs = exec.run(adapt_feeds(ref, c.tensors));
      if (chunks_.empty()) pick_output(outs, c.rows);
      Tensor scores = as_float32(outs.at(out_index_)).clone();
      auto layout = class_layout(scores.shape(), o.class_axis);
      if (!layout || layout->positions() != c.rows)
        fail_input("output '{}': shape {} does not hold one class-score row per sample", name_, shape_str(scores.shape()));
      Entry e;
      e.rows = c.rows;
      e.classes = argmax_classes(scores.data<float>(), *layout);
      if (labels) {
        if (c.first_row + c.rows > static_cast<int64_t>(labels->size()))
          fail_input("{} labels for at least {} samples", labels->size(), c.first_row + c.rows);
        e.labels.assign(labels->begin() + c.first_row, labels->begin() + c.first_row + c.rows);
        for (size_t i = 0; i < e.labels.size(); ++i) ref_correct_ += e.classes[i] == e.labels[i] ? 1 : 0;
      }
      e.scores = std::move(scores);
      rows_ += c.rows;
      chunks_.push_back(std::move(e));
    });
    if (chunks_.empty()) fail_input("{}: no samples to evaluate on", feeds.dir().string());
  }

  bool labels() const { return feeds_.labels().has_value(); }
  const std::string& output() const { return name_; }
  int64_t rows() const { return rows_; }
  double accuracy() const { return labels() ? static_cast<double>(ref_correct_) / static_cast<double>(rows_) : kNaN; }

  Evaluation evaluate(const ir::Model& cand) const {
    const std::vector<size_t> out_map = map_outputs(ref_, cand);
    rt::ExecOptions eo;
    eo.backend = o_.backend;
    eo.threads = o_.threads;
    rt::Executor exec(cand, eo);
    ErrorStats err;
    Top1Stats top1;
    size_t k = 0;
    for_each_chunk(feeds_, o_.batch_rows, o_.max_samples, [&](const Chunk& c) {
      const Entry& e = chunks_.at(k++);
      std::vector<Tensor> outs = exec.run(adapt_feeds(cand, c.tensors));
      Tensor s = as_float32(outs.at(out_map[out_index_]));
      if (s.shape() != e.scores.shape())
        fail_input("output '{}': reference shape {} but candidate shape {}", name_, shape_str(e.scores.shape()), shape_str(s.shape()));
      err.add(e.scores.data<float>(), s.data<float>(), s.numel());
      auto layout = class_layout(s.shape(), o_.class_axis);
      std::vector<int64_t> cc = argmax_classes(s.data<float>(), *layout);
      if (labels()) top1.add_labels(e.classes, cc, e.labels);
      else top1.add(e.classes, cc);
    });
    Evaluation ev;
    ev.agreement = top1.agreement();
    ev.accuracy = labels() ? top1.cand_accuracy() : kNaN;
    ev.drop = labels() ? top1.accuracy_drop() : top1.disagreement();
    ev.output_snr_db = err.snr_db();
    return ev;
  }

 private:
  struct Entry {
    int64_t rows = 0;
    Tensor scores;
    std::vector<int64_t> classes;
    std::vector<int64_t> labels;
  };

  void pick_output(const std::vector<Tensor>& outs, int64_t rows) {
    const auto& g = *ref_.graph;
    for (size_t i = 0; i < outs.size(); ++i) {
      const std::string& name = g.outputs()[i]->name();
      if (!o_.label_output.empty() && name != o_.label_output) continue;
      auto layout = dtype_is_float(outs[i].dtype()) ? class_layout(outs[i].shape(), o_.class_axis) : std::nullopt;
      if (layout && layout->positions() == rows) {
        out_index_ = i;
        name_ = name;
        return;
      }
      if (!o_.label_output.empty()) break;
    }
    fail_input("sensitivity needs a classifier output (one row of class scores per sample on axis {}){}", o_.class_axis,
               o_.label_output.empty() ? "" : fmt::format("; '{}' is not one", o_.label_output));
  }

  const ir::Model& ref_;
  const data::FeedSource& feeds_;
  CompareOptions o_;
  std::vector<Entry> chunks_;
  size_t out_index_ = 0;
  std::string name_;
  int64_t rows_ = 0;
  int64_t ref_correct_ = 0;
};

std::string format_eval(const Evaluation& e, bool labels) {
  if (labels)
    return fmt::format("accuracy {:.2f}%, drop {:.2f} points, top-1 agreement {:.2f}%, output SNR {} dB", 100.0 * e.accuracy,
                       100.0 * e.drop, 100.0 * e.agreement, format_db(e.output_snr_db));
  return fmt::format("top-1 disagreement {:.2f}%, output SNR {} dB", 100.0 * e.drop, format_db(e.output_snr_db));
}

// The reference tensor a quantized node's output stands for: its own name, or, for a graph output
// that insert_qdq renamed, the DequantizeLinear output that restores the name.
std::string layer_name_of(const ir::Node& n) {
  const ir::Value* out = n.output(0);
  if (!out) return {};
  if (out->uses().size() == 1 && out->uses()[0].node->op_type == "QuantizeLinear") {
    const ir::Value* q = out->uses()[0].node->output(0);
    if (q && q->uses().size() == 1 && q->uses()[0].node->op_type == "DequantizeLinear" && q->uses()[0].node->output(0))
      return q->uses()[0].node->output(0)->name();
  }
  return out->name();
}

}  // namespace

std::vector<std::pair<std::string, std::string>> quantized_compute_nodes(const ir::Model& model) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& n : model.graph->nodes()) {
    if (!is_compute_op(*n) || n->name.empty()) continue;
    bool reads_dq = false;
    for (const ir::Value* in : n->inputs())
      if (in && in->producer() && in->producer()->op_type == "DequantizeLinear") reads_dq = true;
    if (reads_dq) out.emplace_back(n->name, n->op_type);
  }
  return out;
}

SensitivityResult run_sensitivity(const ir::Model& reference, const data::FeedSource& feeds, const QuantizeFn& quantize,
                                  const SensitivityOptions& o) {
  auto log = [&](const std::string& line) {
    if (o.log) o.log(line);
  };
  if (!(o.max_top1_drop >= 0.0)) fail_input("--max-top1-drop must be a fraction >= 0, got {}", o.max_top1_drop);
  ReferenceCache cache(reference, feeds, o.compare);
  SensitivityResult r;
  r.labels = cache.labels();
  r.metric = r.labels ? "accuracy_drop" : "top1_disagreement";
  r.output = cache.output();
  r.samples = cache.rows();
  r.reference_accuracy = cache.accuracy();
  r.budget = o.max_top1_drop;
  if (r.labels) log(fmt::format("FP32 reference: accuracy {:.2f}% on {} samples", 100.0 * r.reference_accuracy, r.samples));

  auto evaluate = [&](const std::set<std::string>& keep) {
    ir::Model m = quantize(keep);
    ++r.evaluations;
    return cache.evaluate(m);
  };

  ir::Model full = quantize({});
  ++r.evaluations;
  r.initial = cache.evaluate(full);
  r.final_eval = r.initial;
  log(fmt::format("all quantized: {}", format_eval(r.initial, r.labels)));
  const auto nodes = quantized_compute_nodes(full);
  r.candidates = static_cast<int>(nodes.size());
  if (r.initial.drop <= o.max_top1_drop) {
    r.met = true;
    r.rank_method = "none";
    return r;
  }
  if (nodes.empty()) {
    r.rank_method = "none";
    return r;
  }

  // ---- rank
  SensitivityRank method = o.rank;
  if (method == SensitivityRank::Auto) method = nodes.size() <= 24 ? SensitivityRank::Exclusion : SensitivityRank::Snr;
  r.rank_method = method == SensitivityRank::Exclusion ? "exclusion" : "snr";
  if (method == SensitivityRank::Exclusion) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      const auto& [name, op] = nodes[i];
      Evaluation e = evaluate({name});
      NodeCost c;
      c.node = name;
      c.op_type = op;
      c.drop_in_float = e.drop;
      c.snr_db_in_float = e.output_snr_db;
      c.cost = r.initial.drop - e.drop;
      c.local_snr_db = kNaN;
      log(fmt::format("  [{}/{}] {} {} in float: {}", i + 1, nodes.size(), op, name, format_eval(e, r.labels)));
      r.ranking.push_back(std::move(c));
    }
    std::stable_sort(r.ranking.begin(), r.ranking.end(), [](const NodeCost& a, const NodeCost& b) {
      if (a.cost != b.cost) return a.cost > b.cost;
      const double sa = std::isfinite(a.snr_db_in_float) ? a.snr_db_in_float : (a.snr_db_in_float > 0 ? 1e9 : -1e9);
      const double sb = std::isfinite(b.snr_db_in_float) ? b.snr_db_in_float : (b.snr_db_in_float > 0 ? 1e9 : -1e9);
      return sa > sb;
    });
  } else {
    CompareOptions co = o.compare;
    co.per_layer = true;
    co.progress = nullptr;
    CompareResult cr = compare_models(reference, full, feeds, co);
    std::unordered_map<std::string, const LayerResult*> by_name;
    for (const LayerResult& l : cr.per_layer->layers) by_name[l.name] = &l;
    for (const auto& [name, op] : nodes) {
      const ir::Node* n = nullptr;
      for (const auto& node : full.graph->nodes())
        if (node->name == name) n = node.get();
      NodeCost c;
      c.node = name;
      c.op_type = op;
      c.drop_in_float = kNaN;
      c.snr_db_in_float = kNaN;
      auto it = n ? by_name.find(layer_name_of(*n)) : by_name.end();
      c.local_snr_db = it == by_name.end() ? std::numeric_limits<double>::infinity() : it->second->local_snr_db;
      c.cost = -(std::isnan(c.local_snr_db) ? -1e9 : c.local_snr_db);
      r.ranking.push_back(std::move(c));
    }
    std::stable_sort(r.ranking.begin(), r.ranking.end(), [](const NodeCost& a, const NodeCost& b) { return a.cost > b.cost; });
    for (const NodeCost& c : r.ranking) log(fmt::format("  {} {}: local SNR {} dB", c.op_type, c.node, format_db(c.local_snr_db)));
  }

  // ---- greedy fallback
  std::vector<std::string> kept;
  for (const NodeCost& c : r.ranking) {
    if (o.max_keep >= 0 && static_cast<int>(kept.size()) >= o.max_keep) break;
    kept.push_back(c.node);
    Evaluation e = evaluate(std::set<std::string>(kept.begin(), kept.end()));
    r.steps.push_back({kept, e});
    log(fmt::format("keep {} in float ({} kept): {}", c.node, kept.size(), format_eval(e, r.labels)));
    r.final_eval = e;
    if (e.drop <= o.max_top1_drop) {
      r.met = true;
      break;
    }
  }
  // ---- prune: a node added early may be unnecessary once later ones are in float.
  if (r.met && o.prune && kept.size() > 1) {
    for (size_t i = kept.size() - 1; i-- > 0;) {  // every node but the last one added
      std::vector<std::string> trial = kept;
      trial.erase(trial.begin() + static_cast<std::ptrdiff_t>(i));
      Evaluation e = evaluate(std::set<std::string>(trial.begin(), trial.end()));
      r.steps.push_back({trial, e});
      const bool ok = e.drop <= o.max_top1_drop;
      log(fmt::format("without {} ({} kept): {}{}", kept[i], trial.size(), format_eval(e, r.labels), ok ? " -> dropped" : ""));
      if (ok) {
        kept = std::move(trial);
        r.final_eval = e;
      }
    }
  }
  r.kept = kept;
  return r;
}

nlohmann::json sensitivity_to_json(const SensitivityResult& r) {
  auto eval_json = [&](const Evaluation& e) {
    return nlohmann::json{{"drop", json_number(e.drop)},
                          {"top1_agreement", json_number(e.agreement)},
                          {"accuracy", r.labels ? json_number(e.accuracy) : nlohmann::json(nullptr)},
                          {"output_snr_db", json_number(e.output_snr_db)}};
  };
  nlohmann::json j;
  j["schema"] = "mpq-sensitivity-report";
  j["schema_version"] = 1;
  j["metric"] = r.metric;
  j["output"] = r.output;
  j["samples"] = r.samples;
  j["labels"] = r.labels;
  j["reference_accuracy"] = r.labels ? json_number(r.reference_accuracy) : nlohmann::json(nullptr);
  j["max_top1_drop"] = r.budget;
  j["met"] = r.met;
  j["rank_method"] = r.rank_method;
  j["candidates"] = r.candidates;
  j["evaluations"] = r.evaluations;
  j["initial"] = eval_json(r.initial);
  j["final"] = eval_json(r.final_eval);
  j["kept_in_float"] = r.kept;
  j["ranking"] = nlohmann::json::array();
  for (const NodeCost& c : r.ranking)
    j["ranking"].push_back({{"node", c.node},
                            {"op_type", c.op_type},
                            {"cost", json_number(c.cost)},
                            {"drop_in_float", json_number(c.drop_in_float)},
                            {"output_snr_db_in_float", json_number(c.snr_db_in_float)},
                            {"local_snr_db", json_number(c.local_snr_db)}});
  j["steps"] = nlohmann::json::array();
  for (const SensitivityStep& s : r.steps) j["steps"].push_back({{"kept", s.kept}, {"result", eval_json(s.eval)}});
  return j;
}

}  // namespace mpq::validate
