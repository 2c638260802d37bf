#pragma once
// The JSON report (schema "mpq-validate-report", version 1; documented in docs/validate.md).
// Non-finite numbers are written as the strings "inf", "-inf" and "nan".
#include <nlohmann/json.hpp>

#include "validate/report.h"

namespace mpq::validate {

inline constexpr int kReportSchemaVersion = 1;

nlohmann::json report_to_json(const ValidateReport& report);
// A number, or "inf" / "-inf" / "nan".
nlohmann::json json_number(double v);

}  // namespace mpq::validate
