// mpq: one binary for FP16/BF16 conversion, INT8 calibration and quantization, and validation.
#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "cli.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/devices.h"

namespace mpq::cli {

// The one table of subcommands: it drives parsing and the --help listing.
const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"inspect", "Describe a model: inputs, outputs, ops, parameters, external data", setup_inspect},
      {"run", "Run a model on a data folder and write or summarise its outputs", setup_run},
      {"convert", "Convert to FP16 or BF16, keeping numerically fragile ops in FP32", setup_convert},
      {"calibrate", "Collect activation ranges on calibration data and write a calibration table", setup_calibrate},
      {"quantize", "Quantize to INT8 and export standard QDQ (or QOperator) ONNX", setup_quantize},
      {"validate", "Compare a candidate model with its FP32 reference and gate on thresholds", setup_validate},
      {"sensitivity", "Rank quantized layers by the accuracy they cost; keep the fewest in FP32 to meet a budget", setup_sensitivity},
      {"qat-finetune", "Quantization-aware fine-tuning (label-free distillation by default), exported as INT8 QDQ", setup_qat_finetune},
      {"devices", "Show the compute devices this build can use", setup_devices},
  };
  return table;
}

std::string version_text() {
  rt::DeviceReport d = rt::query_devices();
  std::string cuda = d.cuda_built ? fmt::format("CUDA runtime {}.{}", d.cuda_runtime_version / 1000,
                                                 (d.cuda_runtime_version % 1000) / 10)
                                  : std::string("no CUDA");
  std::string gpu = d.gpus.empty() ? d.cuda_unavailable_reason : fmt::format("{} GPU(s), first: {}", d.gpus.size(), d.gpus[0].name);
  return fmt::format("mpq {} ({}; {})", MPQ_VERSION, cuda, gpu);
}

}  // namespace mpq::cli

namespace {

// All of a run's threads are one OpenMP team: mpq's kernel pool and oneDNN share it, and OpenBLAS
// runs on the calling thread (runtime/thread_pool.h). Between two parallel loops the team's idle
// threads spin for GOMP_SPINCOUNT iterations before they sleep; waking a sleeping one costs about
// 15 us, more than many of a small model's loops take, while libgomp's default spin (300000
// iterations, about 10 ms on the 2-core EPYC VM) keeps a core busy long after a run. 20000
// iterations (about 0.6 ms) bridge the gaps between the nodes of a run and between runs. Measured
// with scripts/bench_run.py, 2 threads, 20 rows: geometric mean mpq/ONNX Runtime 1.20 with mpq's
// own pool and everything asleep (OMP_WAIT_POLICY=PASSIVE, the setting before), 1.10 with 20000
// spins and 1.08 with 200000 (see docs/runtime.md). Earlier, with three thread sets competing for
// two cores, the default spin made fashion_resnet's p90 200 ms. OPENBLAS_THREAD_TIMEOUT=4 keeps
// OpenBLAS's idle threads (which the pool's one-thread GEMMs leave unused) from spinning too.
// libgomp and OpenBLAS read these variables when they are loaded (before main), so mpq sets them
// and runs itself again; values the user set are kept (OMP_WAIT_POLICY counts as a setting).
void short_spinning_idle_threads(char** argv) {
  if (std::getenv("MPQ_THREAD_ENV_SET") != nullptr) return;  // already re-run
  bool changed = false;
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr)
    changed |= setenv("GOMP_SPINCOUNT", "20000", 1) == 0;
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr) changed |= setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1) == 0;
  if (!changed || setenv("MPQ_THREAD_ENV_SET", "1", 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only on failure: then carry on with the defaults
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mpq;
  short_spinning_idle_threads(argv);
  cli::set_command_line(argc, argv);
  CLI::App app{"mpq: convert, quantize, fine-tune (QAT) and validate ONNX models (FP16/BF16, INT8 QDQ), no Python needed.\n"
               "Example: mpq inspect model.onnx"};
  app.set_version_flag("--version", [] { return cli::version_text(); });
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "stderr log level: trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.require_subcommand(1);
  cli::Action action;
  for (const cli::Command& c : cli::commands()) {
    CLI::App* sub = app.add_subcommand(c.name, c.summary);
    c.setup(*sub, action);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  init_logging(log_level);
  try {
    return action ? action() : 2;
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "mpq: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mpq: error: out of memory\n");
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpq: internal error: %s\n", e.what());
    return 3;
  }
}
