// mpq: one binary for FP16/BF16 conversion, INT8 calibration and quantization, and validation.
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>

#include "cli.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/blas_kernels.h"
#include "runtime/devices.h"
#include "runtime/thread_pool.h"

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

// Threads of this process that are running or waiting for a core (OpenBLAS starts its threads
// when it is loaded, and they spin for a while).
int own_running_threads() {
  int running = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream stat(task.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');  // the name in parentheses may hold spaces
    if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'R') ++running;
  }
  return std::max(running, 1);
}

// Threads of other processes running or waiting for a core right now (procs_running in /proc/stat
// less this process's); -1 where /proc/stat cannot be read.
int other_running_threads() {
  std::ifstream stat("/proc/stat");
  std::string key;
  while (stat >> key) {
    if (key == "procs_running") {
      int running = 0;
      if (!(stat >> running)) return -1;
      return std::max(running - own_running_threads(), 0);
    }
    stat.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return -1;
}

// Whether other processes keep more than a quarter of the cores busy. A quiet machine answers at
// once. Otherwise it looks every 2 ms for up to 100 ms: 5 looks in a row (10 ms) with few enough
// other threads count as quiet, since threads that spin for a while after their own work (ONNX
// Runtime's spin for about 45 ms after a run, which is when a benchmark starts mpq) are not load.
bool machine_busy() {
  const long cores = std::max(sysconf(_SC_NPROCESSORS_ONLN), 1L);
  int quiet_looks = 0;
  for (int look = 0; look < 50; ++look) {
    const int others = other_running_threads();
    if (others < 0) return true;
    if (4L * others <= cores) {
      if (look == 0 || ++quiet_looks == 5) return false;
    } else {
      quiet_looks = 0;
    }
    usleep(2000);
  }
  return true;
}

// All of a run's threads are one OpenMP team: mpq's kernel pool and oneDNN share it, and OpenBLAS
// runs on the calling thread (runtime/thread_pool.h). How the team's idle threads wait between two
// parallel loops depends on whether the machine is busy (machine_busy):
// - quiet: they spin for GOMP_SPINCOUNT=20000 iterations (about 0.6 ms on the 2-core EPYC VM)
//   before they sleep, as ONNX Runtime's do. Waking a sleeping thread costs about 15 us, more than
//   many of a small model's loops take; libgomp's default (300000 iterations, about 10 ms) would
//   keep a core busy long after a run. scripts/bench_run.py, 2 threads, 20 rows, quiet: geometric
//   mean mpq/ONNX Runtime 1.19-1.26 with mpq's own pool and threads asleep (the setting before),
//   0.98-1.00 with this (docs/runtime.md).
// - busy: they sleep at once (OMP_WAIT_POLICY=PASSIVE), since a spinning thread takes the core the
//   thread it waits for needs: mobilenetv3 at batch 8 on 2 threads beside a 2-job build had a p90
//   of 9-26 ms spinning and 1.2-6.4 ms asleep.
// OPENBLAS_THREAD_TIMEOUT=4 keeps OpenBLAS's idle threads (unused: its GEMMs run on the calling
// thread) from spinning. GLIBC_TUNABLES=glibc.malloc.tcache_count=64 lets each thread keep 64 freed
// blocks per small size (glibc's default is 7) for the next allocation: oneDNN allocates and frees
// a few small objects on every primitive execution, and at batch 1 glibc's slower paths
// (_int_malloc, _int_free) took about 12% of a MobileNetV3 run (perf). `mpq run --repeat 3000`,
// one thread, three runs each: MobileNetV3 at batch 1 0.065 -> 0.060 ms, transformer 0.054 ->
// 0.050 ms; the batch-8 rows unchanged (tcache_count 32: 0.062, 128 and 1024: as 64). libgomp,
// OpenBLAS and glibc read these variables when they are loaded (before main), so mpq sets them
// and runs itself again; values the user set are kept (OMP_WAIT_POLICY or GOMP_SPINCOUNT set: mpq
// sets neither; a GLIBC_TUNABLES that names tcache_count is left as it is, another one gets the
// setting appended). MPQ_IDLE_THREADS says what was chosen (spin or sleep; unset where the user
// chose), for `mpq run` to report. Where the user asked OpenMP to bind threads (OMP_PROC_BIND=close,
// as CPU tuning guides advise), libgomp has pinned this thread to one CPU before main, and the new
// process would inherit that mask: both threads on one core, resnet_bn at batch 8 on two threads
// 1.9 ms against 0.6-1.1. The mask is widened to OpenMP's places first.
void set_runtime_environment(char** argv) {
  if (std::getenv("MPQ_THREAD_ENV_SET") != nullptr) return;  // already re-run
  bool changed = false;
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr) {
    const bool busy = machine_busy();
    changed |= setenv(busy ? "OMP_WAIT_POLICY" : "GOMP_SPINCOUNT", busy ? "PASSIVE" : "20000", 1) == 0;
    setenv("MPQ_IDLE_THREADS", busy ? "sleep" : "spin", 1);
  } else {
    unsetenv("MPQ_IDLE_THREADS");  // the user's setting (one inherited from another mpq would be stale)
  }
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr) changed |= setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1) == 0;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  const std::string tcache = "glibc.malloc.tcache_count=64";
  if (tunables == nullptr || *tunables == '\0')
    changed |= setenv("GLIBC_TUNABLES", tcache.c_str(), 1) == 0;
  else if (std::string(tunables).find("glibc.malloc.tcache_count") == std::string::npos)
    changed |= setenv("GLIBC_TUNABLES", (std::string(tunables) + ":" + tcache).c_str(), 1) == 0;
  if (!changed || setenv("MPQ_THREAD_ENV_SET", "1", 1) != 0) return;
  mpq::rt::widen_affinity_to_openmp_places();
  execv("/proc/self/exe", argv);  // returns only on failure: then carry on with the defaults
  setenv("MPQ_IDLE_THREADS", "libgomp default", 1);  // libgomp read its variables before main
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mpq;
  set_runtime_environment(argv);
  // First, while the only other threads are OpenBLAS's idle workers (they read no environment and
  // run no GEMM): it may swap OpenBLAS's kernel table and sets and clears an environment variable.
  rt::ensure_blas_kernels();
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
