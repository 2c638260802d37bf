#include "validate/report.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "core/file_io.h"
#include "validate/report_html.h"
#include "validate/report_json.h"
#include "validate/report_junit.h"

namespace mpq::validate {

namespace {
int count_status(const std::vector<Check>& checks, Check::Status s) {
  return static_cast<int>(std::count_if(checks.begin(), checks.end(), [s](const Check& c) { return c.status == s; }));
}
}  // namespace

int ValidateReport::passed_checks() const { return count_status(checks, Check::Status::Pass); }
int ValidateReport::failed_checks() const { return count_status(checks, Check::Status::Fail); }
int ValidateReport::skipped_checks() const { return count_status(checks, Check::Status::Skip); }

ReportFormat report_format_for(const std::filesystem::path& file) {
  std::string ext = file.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".json") return ReportFormat::Json;
  if (ext == ".xml") return ReportFormat::JUnit;
  if (ext == ".html" || ext == ".htm") return ReportFormat::Html;
  fail_input("{}: report format is chosen by extension: .json, .xml (JUnit) or .html", file.string());
}

std::string render_report(const ValidateReport& report, ReportFormat format) {
  switch (format) {
    case ReportFormat::Json: return report_to_json(report).dump(2) + "\n";
    case ReportFormat::JUnit: return report_to_junit(report);
    case ReportFormat::Html: return report_to_html(report);
  }
  fail_internal("unknown report format");
}

void write_report(const ValidateReport& report, const std::filesystem::path& file) {
  const std::string text = render_report(report, report_format_for(file));
  std::error_code ec;
  std::filesystem::path parent = file.parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec))
    fail_input("{}: folder {} does not exist", file.string(), parent.string());
  write_file_atomic(file, text);
}

}  // namespace mpq::validate
