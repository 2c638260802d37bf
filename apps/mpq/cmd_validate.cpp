// Scaffolding so the CLI links while `mpq validate` is being written (replaced by the real command).
#include "cli.h"
#include "core/error.h"

namespace mpq::cli {

void setup_validate(CLI::App& sub, Action& action) {
  sub.callback([&action] { action = [] () -> int { fail_unsupported("mpq validate is not available in this build yet"); }; });
}

}  // namespace mpq::cli
