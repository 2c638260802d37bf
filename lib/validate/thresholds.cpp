#include "validate/thresholds.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "core/error.h"
#include "core/file_io.h"

namespace mpq::validate {

const std::vector<ThresholdKey>& threshold_keys() {
  static const std::vector<ThresholdKey> keys = {
      {"min_cosine", "--min-cosine", "cosine", true, &ThresholdSet::min_cosine},
      {"min_snr_db", "--min-snr-db", "snr_db", true, &ThresholdSet::min_snr_db},
      {"max_rel_l2", "--max-rel-l2", "rel_l2", false, &ThresholdSet::max_rel_l2},
      {"max_abs_error", "--max-abs-error", "max_abs_error", false, &ThresholdSet::max_abs_error},
      {"max_mean_abs_error", "--max-mean-abs-error", "mean_abs_error", false, &ThresholdSet::max_mean_abs_error},
      {"min_top1_agreement", "--min-top1-agreement", "top1_agreement", true, &ThresholdSet::min_top1_agreement},
      {"max_top1_drop", "--max-top1-drop", "top1_drop", false, &ThresholdSet::max_top1_drop},
      {"min_accuracy", "--min-accuracy", "accuracy", true, &ThresholdSet::min_accuracy},
  };
  return keys;
}

bool ThresholdSet::empty() const {
  for (const ThresholdKey& k : threshold_keys())
    if ((this->*k.member).has_value()) return false;
  return true;
}

void ThresholdSet::override_with(const ThresholdSet& over) {
  for (const ThresholdKey& k : threshold_keys())
    if ((over.*k.member).has_value()) this->*k.member = over.*k.member;
}

bool Thresholds::empty() const {
  if (!all.empty()) return false;
  for (const auto& [name, set] : outputs)
    if (!set.empty()) return false;
  return true;
}

ThresholdSet Thresholds::for_output(const std::string& name) const {
  ThresholdSet s = all;
  if (auto it = outputs.find(name); it != outputs.end()) s.override_with(it->second);
  return s;
}

void Thresholds::override_with(const ThresholdSet& flags) {
  if (flags.empty()) return;
  all.override_with(flags);
  for (auto& [name, set] : outputs) set.override_with(flags);
  source = source.empty() ? "flags" : source + " + flags";
}

namespace {

void parse_set(const nlohmann::json& obj, ThresholdSet& set, const std::string& where, const std::string& label, bool top) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string& key = it.key();
    if (top && (key == "outputs" || key == "description" || key == "$schema" || key == "comment")) continue;
    const ThresholdKey* found = nullptr;
    for (const ThresholdKey& k : threshold_keys())
      if (key == k.key) found = &k;
    if (!found) {
      std::string known;
      for (const ThresholdKey& k : threshold_keys()) known += std::string(known.empty() ? "" : ", ") + k.key;
      fail_input("{}: unknown threshold '{}'{} (known: {}{})", label, key, where, known,
                 top ? ", outputs, description" : "");
    }
    if (!it.value().is_number())
      fail_input("{}: threshold '{}'{} must be a number, got {}", label, key, where, it.value().dump());
    const double v = it.value().get<double>();
    if (!std::isfinite(v)) fail_input("{}: threshold '{}'{} must be finite", label, key, where);
    set.*(found->member) = v;
  }
}

}  // namespace

Thresholds parse_thresholds(const std::string& text, const std::string& label) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail_input("{}: not valid JSON: {}", label, e.what());
  }
  if (!j.is_object()) fail_input("{}: a thresholds file holds one JSON object", label);
  Thresholds t;
  t.source = label;
  parse_set(j, t.all, "", label, true);
  if (j.contains("outputs")) {
    const nlohmann::json& outs = j["outputs"];
    if (!outs.is_object()) fail_input("{}: \"outputs\" must map output names to threshold objects", label);
    for (auto it = outs.begin(); it != outs.end(); ++it) {
      if (!it.value().is_object()) fail_input("{}: \"outputs\".\"{}\" must be an object of thresholds", label, it.key());
      parse_set(it.value(), t.outputs[it.key()], fmt::format(" (output '{}')", it.key()), label, false);
    }
  }
  return t;
}

Thresholds read_thresholds(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) fail_input("{}: thresholds file not found", file.string());
  return parse_thresholds(read_file_bytes(file), file.string());
}

const char* status_name(Check::Status s) {
  switch (s) {
    case Check::Status::Pass: return "pass";
    case Check::Status::Fail: return "fail";
    case Check::Status::Skip: return "skip";
  }
  return "?";
}

std::string format_value(double v) {
  if (v != v) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.0f}", v);
  const double a = std::fabs(v);
  if (a >= 1e-3 && a < 1e6) return fmt::format("{:.6g}", v);
  return fmt::format("{:.4e}", v);
}

std::vector<Check> evaluate_checks(const CompareResult& r, const Thresholds& th) {
  for (const auto& [name, set] : th.outputs) {
    bool known = false;
    for (const OutputResult& o : r.outputs) known |= o.name == name;
    if (!known) {
      std::vector<std::string> names;
      for (const OutputResult& o : r.outputs) names.push_back(o.name);
      fail_input("{}: thresholds for output '{}', which the reference does not have (outputs: {})", th.source, name,
                 fmt::format("{}", fmt::join(names, ", ")));
    }
  }
  std::vector<Check> checks;
  for (const OutputResult& o : r.outputs) {
    const ThresholdSet set = th.for_output(o.name);
    for (const ThresholdKey& k : threshold_keys()) {
      const std::optional<double>& limit = set.*(k.member);
      if (!limit) continue;
      Check c;
      c.id = o.name + "/" + k.key;
      c.output = o.name;
      c.key = k.key;
      c.metric = k.metric;
      c.comparison = k.is_min ? ">=" : "<=";
      c.threshold = *limit;
      c.value = std::numeric_limits<double>::quiet_NaN();
      bool applies = true;
      std::string why_not;
      const std::string key = k.key;
      if (key == "min_cosine") c.value = o.stats.cosine();
      else if (key == "min_snr_db") c.value = o.stats.snr_db();
      else if (key == "max_rel_l2") c.value = o.stats.rel_l2();
      else if (key == "max_abs_error") c.value = o.stats.max_abs_error();
      else if (key == "max_mean_abs_error") c.value = o.stats.mean_abs_error();
      else if (key == "min_top1_agreement") {
        if (o.top1) c.value = o.top1->agreement();
        else applies = false, why_not = "output holds no class scores";
      } else if (key == "max_top1_drop") {
        if (o.labelled && o.top1) {
          c.metric = "accuracy_drop";
          c.value = o.top1->accuracy_drop();
        } else if (o.top1) {
          c.metric = "top1_disagreement";
          c.value = o.top1->disagreement();
        } else {
          applies = false, why_not = "output holds no class scores";
        }
      } else if (key == "min_accuracy") {
        if (o.labelled && o.top1) c.value = o.top1->cand_accuracy();
        else applies = false, why_not = r.have_labels ? "labels refer to another output" : "no labels given";
      }
      if (!applies) {
        c.status = Check::Status::Skip;
        c.message = fmt::format("{}: skipped ({}): {}", o.name, k.key, why_not);
        checks.push_back(std::move(c));
        continue;
      }
      const bool ok = k.is_min ? (c.value >= c.threshold) : (c.value <= c.threshold);  // NaN fails both
      c.status = ok ? Check::Status::Pass : Check::Status::Fail;
      c.message = fmt::format("{}: {} {} {} {} ({})", o.name, c.metric, format_value(c.value),
                              ok ? c.comparison : (k.is_min ? "<" : ">"), format_value(c.threshold), k.key);
      checks.push_back(std::move(c));
    }
  }
  return checks;
}

}  // namespace mpq::validate
