#pragma once
// One self-contained HTML page: verdict, checks, per-output metrics with an inline SVG chart and,
// with --per-layer, an inline SVG chart of SNR per layer and the ranked table. No scripts, no
// external stylesheets, fonts or images.
#include <string>

#include "validate/report.h"

namespace mpq::validate {

std::string report_to_html(const ValidateReport& report);

}  // namespace mpq::validate
