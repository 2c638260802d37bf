#pragma once
// One validation run, as the reports see it, and writing it by file extension:
// .json (docs/validate.md documents the schema), .xml (JUnit), .html (one self-contained page).
// Reports hold no timestamps or timings, so the same inputs give byte-identical files.
#include <filesystem>
#include <string>
#include <vector>

#include "validate/compare.h"
#include "validate/thresholds.h"

namespace mpq::validate {

struct ValidateReport {
  std::string reference;  // paths as given
  std::string candidate;
  std::string data;
  std::string labels;     // "" when the labels came from the data folder or there are none
  std::string device = "cpu";
  std::string mpq_version;
  CompareResult result;
  Thresholds thresholds;
  std::vector<Check> checks;

  int passed_checks() const;
  int failed_checks() const;
  int skipped_checks() const;
  bool passed() const { return failed_checks() == 0; }
};

enum class ReportFormat { Json, JUnit, Html };
// From the file extension (.json, .xml, .html/.htm); BadInput otherwise.
ReportFormat report_format_for(const std::filesystem::path& file);
std::string render_report(const ValidateReport& report, ReportFormat format);
// Atomic write (temporary file + rename).
void write_report(const ValidateReport& report, const std::filesystem::path& file);

}  // namespace mpq::validate
