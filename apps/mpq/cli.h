#pragma once
// Shared pieces of the CLI. Each subcommand lives in its own file and only parses, calls lib and
// prints; the table in main.cpp feeds both parsing and `mpq --help`.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace mpq::cli {

// --help text of every command's --device option (one wording; runtime/devices.cpp decides).
inline constexpr const char* kDeviceHelp =
    "cpu, cuda (the CUDA path, see docs/gpu.md) or auto (cuda when a GPU is usable, else cpu)";
inline constexpr const char* kTf32Help =
    "CUDA path: FP32 matrix products and convolutions may use TF32 tensor-core math (10 mantissa bits in the "
    "products, as PyTorch's allow_tf32; off by default)";

// Whole-number options checked at parsing, with a message naming the bound (CLI11's own range
// validators print theirs up to DBL_MAX, 300 digits). Inside mpq a negative value is often the
// "not given" default (all feeds, automatic warm-up); typed by a user it is a mistake.
inline CLI::Validator whole_number_at_least(long long least) {
  return CLI::Validator(
      [least](std::string& value) -> std::string {
        std::size_t used = 0;
        long long n = least - 1;
        try {
          n = std::stoll(value, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != value.size() || n < least)
          return "must be a whole number, " + std::to_string(least) + " or more, got " + value;
        return "";
      },
      least == 0 ? "COUNT" : "COUNT>=" + std::to_string(least));
}
// --max-samples, --threads (0: one per CPU), --repeat and the like.
inline const CLI::Validator kCount = whole_number_at_least(0);

// Returns the process exit code.
using Action = std::function<int()>;

struct Command {
  const char* name;
  const char* summary;
  // Adds options to `sub` and sets `action` to run once parsing succeeded.
  void (*setup)(CLI::App& sub, Action& action);
};

// Subcommand setups (one file each).
void setup_inspect(CLI::App& sub, Action& action);
void setup_devices(CLI::App& sub, Action& action);
void setup_run(CLI::App& sub, Action& action);
void setup_calibrate(CLI::App& sub, Action& action);
void setup_quantize(CLI::App& sub, Action& action);
void setup_convert(CLI::App& sub, Action& action);
void setup_validate(CLI::App& sub, Action& action);
void setup_sensitivity(CLI::App& sub, Action& action);
void setup_qat_finetune(CLI::App& sub, Action& action);

// The command line as typed, for provenance in output files.
const std::string& command_line();
void set_command_line(int argc, char** argv);

bool stderr_is_terminal();

// A progress bar on stderr, drawn only when stderr is a terminal.
class Progress {
 public:
  Progress(std::string label, int64_t total);
  ~Progress();
  void update(int64_t done);
  void finish();

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

std::string human_bytes(double bytes);
std::string human_count(double n);
// "a,b" "c" -> {a, b, c}: repeatable flags that also take comma-separated lists.
std::set<std::string> split_comma_list(const std::vector<std::string>& items);

}  // namespace mpq::cli
