#pragma once
// JUnit XML for CI systems: one <testsuite> per run, one <testcase> per threshold check (failed
// checks carry a <failure>, checks that do not apply a <skipped>), the metrics in <properties>
// and the per-layer table in <system-out>.
#include <string>

#include "validate/report.h"

namespace mpq::validate {

std::string report_to_junit(const ValidateReport& report);
// XML text/attribute escaping; drops characters XML 1.0 does not allow.
std::string xml_escape(const std::string& s);

}  // namespace mpq::validate
