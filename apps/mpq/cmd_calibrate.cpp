#include <fmt/format.h>

#include <chrono>
#include <iostream>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "calib/calibrator.h"
#include "cli.h"
#include "core/file_io.h"
#include "ir/onnx_io.h"
#include "ir/verify.h"
#include "passes/fold_constants.h"
#include "passes/fuse_conv_bn.h"
#include "passes/inference_fusion.h"
#include "passes/pass.h"
#include "runtime/devices.h"

namespace mpq::cli {

namespace {

struct CalibrateOpts {
  std::string model;
  std::string data;
  std::string output;
  std::string method = "entropy";
  double percentile = 99.999;
  int64_t max_samples = -1;
  int batch_size = 1;
  int bins = 2048;
  int threads = 0;
  std::string device = "cpu";
  std::string activation_type = "int8";
  bool reduce_range = false;
  std::string trt_cache;
  std::string tensors = "all";
  bool json = false;
};

// Kernels allocate their scratch (Conv's im2col buffer) on every call. Under calibration's
// allocation pattern the freed block ends up on top of glibc's heap and is handed back to the OS
// each time, so every feed faults it in again: 327k page faults on 2,000 Fashion-MNIST feeds, twice
// the CPU time of the run itself. Keeping freed memory (the working set is bounded) removes that.
void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

int calibrate_command(const CalibrateOpts& o) {
  keep_freed_memory();
  calib::CalibOptions co;
  co.method = calib::parse_range_method(o.method);
  co.range.percentile = o.percentile;
  if (!(o.percentile > 0.0 && o.percentile <= 100.0)) fail_input("--percentile must be in (0, 100], got {}", o.percentile);
  // Even: widening merges pairs of bins. At most 2^20: each tensor holds 48 bytes of counters per
  // bin (already 48 MiB there), the entropy search grows with the square, and AVX-512's binning is
  // exact only below 2^24 bins.
  constexpr int kMaxBins = 1 << 20;
  if (o.bins < 2 || o.bins > kMaxBins || o.bins % 2 != 0)
    fail_input("--bins must be an even number from 2 to {}, got {}", kMaxBins, o.bins);
  co.max_samples = o.max_samples;
  co.batch_size = o.batch_size;
  co.bins = o.bins;
  co.threads = o.threads;
  co.activation_type = o.activation_type;
  co.reduce_range = o.reduce_range;
  co.backend = rt::resolve_device(o.device);
  if (o.tensors == "quantized" && !o.trt_cache.empty())
    fail_input("--trt-cache needs --tensors all: TensorRT reads ranges of tensors the fused graph does not have");
  refuse_overwrite_input(o.model, o.output);
  refuse_overwrite_input(o.model, calib::binary_table_path(o.output));

  ir::Model model = ir::load_model(o.model);
  ir::verify_or_throw(model);
  if (o.tensors == "quantized") {
    // As `mpq quantize` calibrates: constants and BatchNorm folded, then the graph fused as `mpq
    // run` runs it, keeping observable every tensor QDQ export (and QAT) reads a range for.
    passes::FoldConstants fold;
    passes::FuseConvBn fuse_bn;
    passes::run_pass(fold, model);
    passes::run_pass(fuse_bn, model);
    passes::QdqOptions qo;
    qo.activation_type = o.activation_type;
    passes::fuse_for_inference(model, co.backend, passes::tensors_to_calibrate(model, qo));
  }
  data::DataOptions dopts;
  dopts.max_feeds = o.max_samples;
  data::FeedSource feeds = data::FeedSource::open(o.data, model, dopts);
  Progress progress("calibrate", static_cast<int64_t>(feeds.size()));
  co.progress = [&](int64_t done, int64_t) { progress.update(done); };
  auto t0 = std::chrono::steady_clock::now();
  calib::CalibrationTable table = calib::calibrate(model, feeds, co);
  progress.finish();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  table.mpq_version = MPQ_VERSION;
  table.model = o.model;
  table.command = command_line();
  calib::write_table(table, o.output);
  if (!o.trt_cache.empty()) calib::write_trt_cache(table, o.trt_cache);

  if (o.json) {
    nlohmann::json j = nlohmann::json::parse(calib::table_to_json(table));
    j["seconds"] = secs;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << fmt::format("calibrated {} tensors of {} with {} on {} sample(s) in {:.2f} s ({:.1f} samples/s)\n",
                             table.tensors.size(), o.model, table.method, table.samples, secs,
                             static_cast<double>(table.samples) / std::max(secs, 1e-9));
    std::cout << fmt::format("wrote {} and {}{}\n", o.output, calib::binary_table_path(o.output).string(),
                             o.trt_cache.empty() ? "" : " and TensorRT cache " + o.trt_cache);
  }
  return 0;
}

}  // namespace

void setup_calibrate(CLI::App& sub, Action& action) {
  auto o = std::make_shared<CalibrateOpts>();
  std::string methods;
  for (const auto& m : calib::range_methods()) methods += fmt::format("\n  {:<11} {}", m.name, m.help);
  std::vector<std::string> names;
  for (const auto& m : calib::range_methods()) names.push_back(m.name);
  sub.add_option("MODEL", o->model, "FP32 ONNX model")->required();
  sub.add_option("--data", o->data, "calibration data folder (see README: feed folders, .npy/.pb, images)")->required();
  sub.add_option("-o,--output", o->output, "calibration table to write (JSON; the .pb beside it holds the same)")->required();
  sub.add_option("--method", o->method, "range method (default entropy):" + methods)->check(CLI::IsMember(names));
  sub.add_option("--percentile", o->percentile, "percentile for --method percentile (default 99.999)");
  sub.add_option("--max-samples", o->max_samples, "use at most N feeds")->check(kCount);
  sub.add_option("--batch-size", o->batch_size, "feeds per run (models with a dynamic batch dimension)");
  sub.add_option("--bins", o->bins, "histogram bins over |x|: even, 2 to 1048576 (default 2048, TensorRT's)");
  sub.add_option("--activation-type", o->activation_type, "int8 (symmetric, default) or uint8 (asymmetric)")
      ->check(CLI::IsMember({"int8", "uint8"}));
  sub.add_flag("--reduce-range", o->reduce_range, "7-bit activations (PyTorch fbgemm's reduce_range)");
  sub.add_option("--trt-cache", o->trt_cache, "also write a TensorRT calibration cache");
  sub.add_option("--tensors", o->tensors,
                 "all (default): every float tensor of the graph as written, for any consumer (TensorRT, "
                 "--format qoperator); quantized: the graph fused as `mpq run` runs it, keeping every tensor QDQ "
                 "export and qat-finetune read (faster; not with --trt-cache, not for --format qoperator)")
      ->check(CLI::IsMember({"all", "quantized"}));
  sub.add_option("--threads", o->threads, "CPU threads (default: one per CPU this process may run on, as taskset or a cpuset allows)")->check(kCount);
  sub.add_option("--device", o->device, kDeviceHelp)->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub.add_flag("--json", o->json, "print the table and timing as JSON to stdout");
  sub.footer("Example: mpq calibrate model.onnx --data calib_data/calib --method entropy -o model.calib.json");
  sub.callback([&action, o] { action = [o] { return calibrate_command(*o); }; });
}

}  // namespace mpq::cli
