#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace mpq {
void init_logging(const std::string& level) {
  static bool done = false;
  if (!done) {
    auto logger = spdlog::stderr_color_mt("mpq");
    logger->set_pattern("%^[%l]%$ %v");
    spdlog::set_default_logger(logger);
    done = true;
  }
  spdlog::set_level(spdlog::level::from_str(level));
}
}  // namespace mpq
