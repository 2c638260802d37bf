#pragma once
// Logging goes to stderr through spdlog; stdout is reserved for results and --json.
#include <spdlog/spdlog.h>

namespace mpq {
// Route the default logger to stderr at the given level ("warn", "info", "debug").
void init_logging(const std::string& level);
}  // namespace mpq
