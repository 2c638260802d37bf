#include "validate/report_json.h"

#include <cmath>

namespace mpq::validate {

nlohmann::json json_number(double v) {
  if (v != v) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

namespace {

nlohmann::json set_to_json(const ThresholdSet& s) {
  nlohmann::json j = nlohmann::json::object();
  for (const ThresholdKey& k : threshold_keys())
    if ((s.*k.member).has_value()) j[k.key] = *(s.*k.member);
  return j;
}

nlohmann::json stats_fields(nlohmann::json j, const ErrorStats& s) {
  j["elements"] = s.count();
  j["nonfinite"] = s.nonfinite();
  j["cosine"] = json_number(s.cosine());
  j["rel_l2"] = json_number(s.rel_l2());
  j["snr_db"] = json_number(s.snr_db());
  j["max_abs_error"] = json_number(s.max_abs_error());
  j["mean_abs_error"] = json_number(s.mean_abs_error());
  return j;
}

nlohmann::json layer_json(const LayerResult& l, int rank) {
  nlohmann::json j;
  j["rank"] = rank;
  j["order"] = l.order;
  j["name"] = l.name;
  j["candidate_name"] = l.cand_name;
  j["node"] = l.node;
  j["op_type"] = l.op_type;
  j = stats_fields(std::move(j), l.stats);
  j["upstream_snr_db"] = json_number(l.upstream_snr_db);
  j["drop_db"] = json_number(l.drop_db);
  j["local_snr_db"] = json_number(l.local_snr_db);
  return j;
}

}  // namespace

nlohmann::json report_to_json(const ValidateReport& rep) {
  const CompareResult& r = rep.result;
  nlohmann::json j;
  j["schema"] = "mpq-validate-report";
  j["schema_version"] = kReportSchemaVersion;
  j["mpq_version"] = rep.mpq_version;
  j["passed"] = rep.passed();
  j["reference"] = rep.reference;
  j["candidate"] = rep.candidate;
  j["data"] = rep.data;
  j["labels"] = rep.labels.empty() ? (r.have_labels ? nlohmann::json("(from data folder)") : nlohmann::json(nullptr))
                                   : nlohmann::json(rep.labels);
  j["device"] = rep.device;
  j["samples"] = r.rows;
  j["feeds"] = r.feeds;
  j["runs"] = r.runs;

  nlohmann::json th;
  th["source"] = rep.thresholds.source.empty() ? nlohmann::json(nullptr) : nlohmann::json(rep.thresholds.source);
  th["all"] = set_to_json(rep.thresholds.all);
  th["outputs"] = nlohmann::json::object();
  for (const auto& [name, set] : rep.thresholds.outputs) th["outputs"][name] = set_to_json(set);
  j["thresholds"] = th;

  j["outputs"] = nlohmann::json::array();
  nlohmann::json accuracy = nullptr;
  for (const OutputResult& o : r.outputs) {
    nlohmann::json oj;
    oj["name"] = o.name;
    oj["shape"] = o.shape;
    oj["reference_dtype"] = dtype_name(o.ref_dtype);
    oj["candidate_dtype"] = dtype_name(o.cand_dtype);
    oj = stats_fields(std::move(oj), o.stats);
    oj["min_row_cosine"] = json_number(o.stats.min_row_cosine());
    if (o.top1) {
      oj["top1"] = {{"positions", o.top1->positions()},
                    {"agree", o.top1->agree()},
                    {"agreement", json_number(o.top1->agreement())}};
    } else {
      oj["top1"] = nullptr;
    }
    oj["labelled"] = o.labelled;
    j["outputs"].push_back(oj);
    if (o.labelled && o.top1) {
      accuracy = {{"output", o.name},
                  {"samples", o.top1->labelled()},
                  {"reference_correct", o.top1->ref_correct()},
                  {"candidate_correct", o.top1->cand_correct()},
                  {"reference", json_number(o.top1->ref_accuracy())},
                  {"candidate", json_number(o.top1->cand_accuracy())},
                  {"drop", json_number(o.top1->accuracy_drop())}};
    }
  }
  j["accuracy"] = accuracy;

  j["checks"] = nlohmann::json::array();
  for (const Check& c : rep.checks) {
    j["checks"].push_back({{"id", c.id},
                           {"output", c.output},
                           {"threshold_key", c.key},
                           {"metric", c.metric},
                           {"comparison", c.comparison},
                           {"threshold", c.threshold},
                           {"value", json_number(c.value)},
                           {"status", status_name(c.status)},
                           {"message", c.message}});
  }
  j["summary"] = {{"checks", rep.checks.size()},
                  {"passed", rep.passed_checks()},
                  {"failed", rep.failed_checks()},
                  {"skipped", rep.skipped_checks()}};

  if (r.per_layer) {
    const PerLayerResult& pl = *r.per_layer;
    nlohmann::json p;
    p["jump_db"] = pl.jump_db;
    p["compared"] = pl.layers.size();
    p["peak_window_bytes"] = pl.peak_window_bytes;
    p["masked_values"] = pl.masked;
    std::vector<int> rank_of(pl.layers.size(), 0);
    for (size_t k = 0; k < pl.ranking.size(); ++k) rank_of[pl.ranking[k]] = static_cast<int>(k) + 1;
    p["first_jump"] = pl.first_jump ? layer_json(pl.layers[*pl.first_jump], rank_of[*pl.first_jump]) : nlohmann::json(nullptr);
    p["ranking"] = nlohmann::json::array();
    for (size_t k : pl.ranking) p["ranking"].push_back(pl.layers[k].name);
    p["layers"] = nlohmann::json::array();
    for (size_t i = 0; i < pl.layers.size(); ++i) p["layers"].push_back(layer_json(pl.layers[i], rank_of[i]));
    p["unmatched"] = pl.unmatched;
    j["per_layer"] = p;
  } else {
    j["per_layer"] = nullptr;
  }
  return j;
}

}  // namespace mpq::validate
