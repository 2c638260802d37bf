#pragma once
// Accuracy thresholds (from flags or a JSON file kept in the user's repository) and the checks
// they produce against a comparison. The file format is documented in docs/validate.md:
//
//   { "description": "free text",
//     "min_cosine": 0.999, "min_snr_db": 30, "max_rel_l2": 0.05, "max_abs_error": 0.5,
//     "max_mean_abs_error": 0.05, "min_top1_agreement": 0.99, "max_top1_drop": 0.01,
//     "min_accuracy": 0.85,
//     "outputs": { "logits": { "min_snr_db": 25 } } }
//
// Top-level keys apply to every output; "outputs" overrides them per output. Fractions are
// fractions (0.01 = one percentage point). Unknown keys are errors, so a typo cannot silently
// disable a gate.
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "validate/compare.h"

namespace mpq::validate {

struct ThresholdSet {
  std::optional<double> min_cosine;
  std::optional<double> min_snr_db;
  std::optional<double> max_rel_l2;
  std::optional<double> max_abs_error;
  std::optional<double> max_mean_abs_error;
  std::optional<double> min_top1_agreement;
  // With labels: reference accuracy minus candidate accuracy on the labelled output. Without
  // labels (and on unlabelled outputs): the fraction of positions whose top-1 class changed,
  // which bounds any accuracy drop.
  std::optional<double> max_top1_drop;
  std::optional<double> min_accuracy;  // candidate accuracy on the labelled output

  bool empty() const;
  // Values set in `over` replace those here.
  void override_with(const ThresholdSet& over);
};

// Every threshold key in a fixed order, for parsing, printing and reports.
struct ThresholdKey {
  const char* key;     // "min_cosine"
  const char* flag;    // "--min-cosine"
  const char* metric;  // "cosine"
  bool is_min;         // value must be >= threshold (else <=)
  std::optional<double> ThresholdSet::*member;
};
const std::vector<ThresholdKey>& threshold_keys();

struct Thresholds {
  ThresholdSet all;
  std::map<std::string, ThresholdSet> outputs;
  std::string source;  // "flags", the file name, or "file + flags"
  bool empty() const;
  // The set in force for one output.
  ThresholdSet for_output(const std::string& name) const;
  // Flags win over the file, for every output.
  void override_with(const ThresholdSet& flags);
};

// BadInput (naming the file and key) on unreadable JSON, unknown keys, non-numeric values.
Thresholds parse_thresholds(const std::string& json_text, const std::string& label);
Thresholds read_thresholds(const std::filesystem::path& file);

struct Check {
  enum class Status { Pass, Fail, Skip };
  std::string id;      // "<output>/<key>", stable across runs
  std::string output;
  std::string key;     // threshold key, e.g. "min_cosine"
  std::string metric;  // e.g. "cosine", "accuracy_drop", "top1_disagreement"
  std::string comparison;  // ">=" or "<="
  double threshold = 0;
  double value = 0;    // NaN when skipped
  Status status = Status::Skip;
  std::string message;  // "cosine 0.98120 < 0.99 (min_cosine)"
};
const char* status_name(Check::Status s);

// One check per (output, threshold in force) in output order and key order. Fails (BadInput)
// when the thresholds name an output the reference does not have.
std::vector<Check> evaluate_checks(const CompareResult& result, const Thresholds& thresholds);

// Compact number formatting shared by console output and reports ("inf", "nan" for non-finite).
std::string format_value(double v);

}  // namespace mpq::validate
