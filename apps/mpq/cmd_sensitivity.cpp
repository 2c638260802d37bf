// mpq sensitivity: quantize to INT8, measure the top-1 drop on evaluation data, and when it is over
// budget keep the fewest quantized layers in FP32 that meet it (lib/validate/sensitivity.h).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <iostream>
#include <sstream>

#include "calib/calibrator.h"
#include "cli.h"
#include "core/error.h"
#include "core/file_io.h"
#include "ir/onnx_io.h"
#include "ir/verify.h"
#include "passes/fold_constants.h"
#include "passes/fuse_conv_bn.h"
#include "passes/insert_qdq.h"
#include "runtime/devices.h"
#include "validate/sensitivity.h"

namespace mpq::cli {

namespace {

struct SensitivityOpts {
  std::string model;
  std::string data;
  std::string labels;
  std::string calib;
  std::string calib_data;
  std::string method = "entropy";
  int64_t calib_samples = -1;
  double max_top1_drop = 0.01;
  std::string rank = "auto";
  int max_keep = -1;
  bool no_prune = false;
  std::string output;
  std::string report;
  bool per_tensor = false;
  std::string activation_type = "int8";
  bool float_bias = false;
  bool no_fuse = false;
  std::vector<std::string> exclude_nodes;
  std::vector<std::string> exclude_ops;
  int64_t max_samples = -1;
  int64_t batch_size = 64;
  int class_axis = 1;
  std::string label_output;
  std::string device = "cpu";
  int threads = 0;
  bool json = false;
};

int sensitivity_command(const SensitivityOpts& o) {
  if (o.calib.empty() == o.calib_data.empty()) fail_input("give exactly one of --calib TABLE or --calib-data DIR");
  if (!o.output.empty()) refuse_overwrite_input(o.model, o.output);
  if (!o.report.empty()) {
    refuse_overwrite_input(o.model, o.report);
    if (fs::path(o.report).extension() != ".json") fail_input("--report {}: the sensitivity report is JSON (.json)", o.report);
  }
  const rt::BackendKind backend = rt::resolve_device(o.device);
  auto t0 = std::chrono::steady_clock::now();

  ir::Model reference = ir::load_model(o.model);
  ir::verify_or_throw(reference);
  data::FeedSource eval = data::FeedSource::open(o.data, reference);
  if (!o.labels.empty()) eval.load_labels(o.labels);

  // Prepared FP32 model (constants folded, BatchNormalization fused) and its calibration table:
  // made once, then quantized with different nodes kept in float.
  ir::Model prepared = reference.clone();
  passes::FoldConstants fold;
  passes::run_pass(fold, prepared);
  if (!o.no_fuse) {
    passes::FuseConvBn fuse;
    passes::run_pass(fuse, prepared);
  }
  calib::CalibrationTable table;
  if (!o.calib.empty()) {
    table = calib::read_table(o.calib);
  } else {
    calib::CalibOptions co;
    co.method = calib::parse_range_method(o.method);
    co.max_samples = o.calib_samples;
    co.activation_type = o.activation_type;
    co.backend = backend;
    co.threads = o.threads;
    data::DataOptions dopts;
    dopts.max_feeds = o.calib_samples;
    data::FeedSource calib_feeds = data::FeedSource::open(o.calib_data, prepared, dopts);
    Progress progress("calibrate", static_cast<int64_t>(calib_feeds.size()));
    co.progress = [&](int64_t done, int64_t) { progress.update(done); };
    table = calib::calibrate(prepared, calib_feeds, co);
  }
  passes::QdqOptions qo;
  qo.per_channel = !o.per_tensor;
  qo.activation_type = o.activation_type;
  qo.quantize_bias = !o.float_bias;
  qo.exclude_ops = split_comma_list(o.exclude_ops);
  const std::set<std::string> pinned = split_comma_list(o.exclude_nodes);
  auto quantize = [&](const std::set<std::string>& keep) {
    ir::Model m = prepared.clone();
    passes::QdqOptions q = qo;
    q.exclude_nodes = pinned;
    q.exclude_nodes.insert(keep.begin(), keep.end());
    passes::insert_qdq(m, table, q);
    return m;
  };

  validate::SensitivityOptions so;
  so.max_top1_drop = o.max_top1_drop;
  so.rank = o.rank == "exclusion" ? validate::SensitivityRank::Exclusion
            : o.rank == "snr"     ? validate::SensitivityRank::Snr
                                  : validate::SensitivityRank::Auto;
  so.max_keep = o.max_keep;
  so.prune = !o.no_prune;
  so.compare.backend = backend;
  so.compare.threads = o.threads;
  so.compare.batch_rows = o.batch_size;
  so.compare.max_samples = o.max_samples;
  so.compare.class_axis = o.class_axis;
  so.compare.label_output = o.label_output;
  so.log = [](const std::string& line) { spdlog::info("{}", line); };
  validate::SensitivityResult r = validate::run_sensitivity(reference, eval, quantize, so);

  if (!o.output.empty()) {
    ir::Model m = quantize(std::set<std::string>(r.kept.begin(), r.kept.end()));
    ir::verify_or_throw(m);
    std::vector<std::string> kept_sorted = r.kept;
    std::sort(kept_sorted.begin(), kept_sorted.end());
    m.set_metadata("mpq.version", MPQ_VERSION);
    m.set_metadata("mpq.command", command_line());
    m.set_metadata("mpq.quantization.format", "qdq");
    m.set_metadata("mpq.quantization.calibration_method", table.method);
    m.set_metadata("mpq.quantization.calibration_samples", std::to_string(table.samples));
    m.set_metadata("mpq.sensitivity.kept_fp32", fmt::format("{}", fmt::join(kept_sorted, ",")));
    m.set_metadata("mpq.sensitivity.max_top1_drop", fmt::format("{}", o.max_top1_drop));
    ir::save_model(m, o.output);
  }
  nlohmann::json j = validate::sensitivity_to_json(r);
  if (!o.report.empty()) write_file_atomic(o.report, j.dump(2) + "\n");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (o.json) {
    if (!o.output.empty()) j["output_model"] = o.output;
    std::cout << j.dump(2) << "\n";
    return r.met ? 0 : 1;
  }
  auto pts = [](double v) { return fmt::format("{:.2f}", 100.0 * v); };
  const std::string what = r.labels ? "accuracy drop" : "top-1 disagreement with FP32";
  std::cout << fmt::format("sensitivity of {} on {} sample(s) ({}{}), budget: {} <= {} points\n", o.model, r.samples, what,
                           r.labels ? fmt::format(", FP32 accuracy {:.2f}%", 100.0 * r.reference_accuracy) : "",
                           what, pts(r.budget));
  std::cout << fmt::format("  all {} quantized compute node(s) in INT8: {} {} points\n", r.candidates, what, pts(r.initial.drop));
  if (!r.ranking.empty()) {
    std::cout << fmt::format("  ranking ({}), most costly first:\n", r.rank_method);
    for (size_t k = 0; k < r.ranking.size(); ++k) {
      const auto& c = r.ranking[k];
      if (r.rank_method == "exclusion")
        std::cout << fmt::format("    {:>3}. {:<28} {:<6} {} in float: {} points\n", k + 1, c.node, c.op_type, what,
                                 pts(c.drop_in_float));
      else
        std::cout << fmt::format("    {:>3}. {:<28} {:<6} local SNR {} dB\n", k + 1, c.node, c.op_type,
                                 validate::format_db(c.local_snr_db));
    }
  }
  if (r.kept.empty()) {
    std::cout << (r.met ? "  budget met with every node quantized: nothing kept in FP32\n"
                        : "  budget not met and nothing could be kept in FP32\n");
  } else {
    std::cout << fmt::format("  kept in FP32 ({}): {}\n", r.kept.size(), fmt::join(r.kept, ", "));
  }
  std::cout << fmt::format("  result: {} {} points ({}), {} evaluation(s) in {:.1f} s\n", what, pts(r.final_eval.drop),
                           r.met ? "within budget" : "OVER BUDGET", r.evaluations, secs);
  if (!o.output.empty()) std::cout << fmt::format("wrote {}\n", o.output);
  if (!o.report.empty()) std::cout << fmt::format("wrote {}\n", o.report);
  if (!r.met) std::cerr << "mpq: the budget could not be met; the written model keeps every ranked node in float\n";
  return r.met ? 0 : 1;
}

}  // namespace

void setup_sensitivity(CLI::App& sub, Action& action) {
  auto o = std::make_shared<SensitivityOpts>();
  std::vector<std::string> names;
  for (const auto& m : calib::range_methods()) names.push_back(m.name);
  sub.add_option("MODEL", o->model, "FP32 ONNX model")->required();
  sub.add_option("--data", o->data, "evaluation data folder (labels.npy beside it gives the accuracy drop)")->required();
  sub.add_option("--labels", o->labels, "labels file when not beside the data");
  sub.add_option("--calib", o->calib, "calibration table from `mpq calibrate`");
  sub.add_option("--calib-data", o->calib_data, "or calibrate here, on this data folder");
  sub.add_option("--method", o->method, "range method with --calib-data (default entropy)")->check(CLI::IsMember(names));
  sub.add_option("--calib-samples", o->calib_samples, "use at most N calibration feeds")->check(kCount);
  sub.add_option("--max-top1-drop", o->max_top1_drop, "budget: largest accuracy drop (fraction, default 0.01 = 1 point)");
  sub.add_option("--rank", o->rank, "auto (default), exclusion (one evaluation per node) or snr (one per-layer pass)")
      ->check(CLI::IsMember({"auto", "exclusion", "snr"}));
  sub.add_option("--max-keep", o->max_keep, "keep at most N nodes in FP32")->check(kCount);
  sub.add_flag("--no-prune", o->no_prune, "do not try to drop kept nodes again after the budget is met");
  sub.add_option("-o,--output", o->output, "write the quantized model with the kept nodes in FP32");
  sub.add_option("--report", o->report, "write the search as JSON");
  sub.add_flag("--per-tensor", o->per_tensor, "one scale per weight tensor (default per channel)");
  sub.add_option("--activation-type", o->activation_type, "int8 (default) or uint8")->check(CLI::IsMember({"int8", "uint8"}));
  sub.add_flag("--float-bias", o->float_bias, "keep biases in float");
  sub.add_flag("--no-fuse", o->no_fuse, "do not fold BatchNormalization into Conv first");
  sub.add_option("--exclude-nodes", o->exclude_nodes, "nodes always kept in float (comma separated)");
  sub.add_option("--exclude-ops", o->exclude_ops, "op types always kept in float (comma separated)");
  sub.add_option("--max-samples", o->max_samples, "evaluate on at most N samples")->check(kCount);
  sub.add_option("--batch-size", o->batch_size, "rows per run when a data file holds a batch (default 64)");
  sub.add_option("--class-axis", o->class_axis, "axis of class scores (default 1)");
  sub.add_option("--label-output", o->label_output, "classifier output to score (default: the first one)");
  sub.add_option("--device", o->device, kDeviceHelp)->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub.add_option("--threads", o->threads, "CPU threads (default: one per CPU this process may run on, as taskset or a cpuset allows)")->check(kCount);
  sub.add_flag("--json", o->json, "print the search as JSON to stdout");
  sub.footer(
      "Exit status: 0 budget met, 1 not met, 2 bad input.\n"
      "Example: mpq sensitivity calib_data/demo.onnx --data calib_data/eval --calib-data calib_data/calib \\\n"
      "           --max-top1-drop 0.005 -o demo_int8_mixed.onnx");
  sub.callback([&action, o] { action = [o] { return sensitivity_command(*o); }; });
}

}  // namespace mpq::cli
