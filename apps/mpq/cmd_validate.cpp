// mpq validate: compare a candidate model (FP16, INT8, ...) with its FP32 reference on the same
// feeds, gate on thresholds (exit 1 when any fails), write JSON / JUnit / HTML reports, and with
// --per-layer say where the error enters.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <iostream>
#include <map>

#include "cli.h"
#include "core/error.h"
#include "core/file_io.h"
#include "ir/onnx_io.h"
#include "ir/verify.h"
#include "runtime/devices.h"
#include "validate/report.h"
#include "validate/report_json.h"

namespace mpq::cli {

namespace {

struct ValidateOpts {
  std::string reference;
  std::string candidate;
  std::string data;
  std::string labels;
  std::string device = "cpu";
  std::string thresholds;
  std::vector<std::string> reports;
  std::map<std::string, double> limits;            // threshold key -> value given as a flag
  std::map<std::string, CLI::Option*> limit_opts;  // threshold key -> its flag
  bool per_layer = false;
  int top = 15;
  double jump_db = 10.0;
  int64_t max_samples = -1;
  int64_t batch_size = 64;
  int class_axis = 1;
  std::string label_output;
  int threads = 0;
  bool json = false;
};

ir::Model load_checked(const std::string& path, const char* role) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail_input("{} model {}: file not found", role, path);
  ir::Model m = ir::load_model(path);
  ir::verify_or_throw(m);
  return m;
}

void print_outputs(const validate::CompareResult& r) {
  size_t w = 6;
  for (const auto& o : r.outputs) w = std::max(w, o.name.size());
  std::cout << fmt::format("  {:<{}}  {:>10}  {:>10}  {:>10}  {:>8}  {:>11}\n", "output", w, "cosine", "rel-L2", "max-abs",
                           "SNR dB", "top-1 agree");
  for (const auto& o : r.outputs) {
    std::string agree = o.top1 ? fmt::format("{:.2f}%", 100.0 * o.top1->agreement()) : std::string("-");
    std::cout << fmt::format("  {:<{}}  {:>10}  {:>10}  {:>10}  {:>8}  {:>11}\n", o.name, w,
                             validate::format_value(o.stats.cosine()), validate::format_value(o.stats.rel_l2()),
                             validate::format_value(o.stats.max_abs_error()), validate::format_db(o.stats.snr_db()), agree);
    if (o.stats.nonfinite())
      std::cout << fmt::format("  {:<{}}  {} non-finite values (NaN/inf) in the reference or candidate\n", "", w,
                               o.stats.nonfinite());
  }
  if (const auto* lo = r.labelled_output())
    std::cout << fmt::format("  accuracy on {} labelled samples ({}): reference {:.2f}%, candidate {:.2f}%, drop {:.2f} points\n",
                             lo->top1->labelled(), lo->name, 100.0 * lo->top1->ref_accuracy(), 100.0 * lo->top1->cand_accuracy(),
                             100.0 * lo->top1->accuracy_drop());
}

void print_layers(const validate::PerLayerResult& pl, int top) {
  std::cout << fmt::format("per-layer: {} tensors compared, {} without a counterpart, at most {} of reference activations held;\n"
                           "  worst first (local SNR = noise the layer adds itself)\n",
                           pl.layers.size(), pl.unmatched.size(), human_bytes(static_cast<double>(pl.peak_window_bytes)));
  if (pl.masked)
    std::cout << fmt::format("  {} attention-mask fill value(s) (|x| >= half the mask constant) left out of the SNRs\n",
                             pl.masked);
  size_t w = 6;
  const size_t shown = std::min(pl.ranking.size(), static_cast<size_t>(std::max(top, 0)));
  for (size_t k = 0; k < shown; ++k) w = std::max(w, pl.layers[pl.ranking[k]].name.size());
  w = std::min<size_t>(w, 48);
  std::cout << fmt::format("  {:>4}  {:<{}}  {:<18}  {:>8}  {:>9}  {:>9}\n", "rank", "tensor", w, "op", "SNR dB", "upstream",
                           "local dB");
  for (size_t k = 0; k < shown; ++k) {
    const size_t i = pl.ranking[k];
    const auto& l = pl.layers[i];
    std::cout << fmt::format("  {:>4}  {:<{}}  {:<18}  {:>8}  {:>9}  {:>9}{}\n", k + 1, l.name, w, l.op_type,
                             validate::format_db(l.snr_db), validate::format_db(l.upstream_snr_db),
                             validate::format_db(l.local_snr_db), pl.first_jump && *pl.first_jump == i ? "  <- first jump" : "");
  }
  if (shown < pl.ranking.size()) std::cout << fmt::format("  ... {} more (see --report)\n", pl.ranking.size() - shown);
  if (pl.first_jump) {
    const auto& l = pl.layers[*pl.first_jump];
    std::cout << fmt::format("error first jumps at '{}' ({} node '{}'): SNR {} dB after {} dB upstream\n", l.name, l.op_type,
                             l.node, validate::format_db(l.snr_db), validate::format_db(l.upstream_snr_db));
  } else {
    std::cout << "no layer adds error: the compared tensors are identical\n";
  }
}

int validate_command(ValidateOpts& o) {
  auto t0 = std::chrono::steady_clock::now();
  // Everything that can be wrong with the inputs is checked before the (long) run.
  validate::Thresholds th;
  if (!o.thresholds.empty()) th = validate::read_thresholds(o.thresholds);
  validate::ThresholdSet flags;
  for (const validate::ThresholdKey& k : validate::threshold_keys()) {
    CLI::Option* opt = o.limit_opts.at(k.key);
    if (opt->count() > 0) flags.*(k.member) = o.limits.at(k.key);
  }
  th.override_with(flags);
  for (const std::string& r : o.reports) {
    validate::report_format_for(r);
    refuse_overwrite_input(o.reference, r);
    refuse_overwrite_input(o.candidate, r);
    const fs::path parent = fs::path(r).parent_path();
    std::error_code pec;
    if (!parent.empty() && !fs::is_directory(parent, pec)) fail_input("--report {}: folder {} does not exist", r, parent.string());
  }
  if (o.batch_size < 1) fail_input("--batch-size must be at least 1");
  if (o.jump_db < 0) fail_input("--jump-db must not be negative");
  const rt::BackendKind backend = rt::resolve_device(o.device);

  ir::Model ref = load_checked(o.reference, "reference");
  ir::Model cand = load_checked(o.candidate, "candidate");
  for (const auto& [name, set] : th.outputs) {
    bool found = false;
    for (const ir::Value* v : ref.graph->outputs()) found |= v->name() == name;
    if (!found) fail_input("{}: thresholds name output '{}', which the reference does not have", th.source, name);
  }
  validate::map_outputs(ref, cand);
  std::error_code ec;
  if (!fs::is_directory(o.data, ec)) fail_input("--data {}: not a folder", o.data);
  data::FeedSource feeds = data::FeedSource::open(o.data, ref);
  if (!o.labels.empty()) feeds.load_labels(o.labels);
  // An accuracy gate without labels cannot be evaluated: a CI job whose labels went missing must
  // not pass on the remaining checks.
  if (!feeds.labels()) {
    bool wants_accuracy = th.all.min_accuracy.has_value();
    for (const auto& [name, set] : th.outputs) wants_accuracy |= set.min_accuracy.has_value();
    if (wants_accuracy)
      fail_input("{}: min_accuracy needs labels: put labels.npy (or labels.txt) beside the data in {} or give --labels FILE",
                 th.source, o.data);
  }

  validate::CompareOptions co;
  co.backend = backend;
  co.threads = o.threads;
  co.batch_rows = o.batch_size;
  co.max_samples = o.max_samples;
  co.class_axis = o.class_axis;
  co.label_output = o.label_output;
  co.per_layer = o.per_layer;
  co.jump_db = o.jump_db;
  int64_t total = feeds.total_rows();
  if (o.max_samples >= 0) total = std::min(total, o.max_samples);
  Progress progress("validate", total);
  co.progress = [&](int64_t done, int64_t) { progress.update(done); };

  validate::ValidateReport rep;
  rep.reference = o.reference;
  rep.candidate = o.candidate;
  rep.data = o.data;
  rep.labels = o.labels;
  rep.device = o.device;
  rep.mpq_version = MPQ_VERSION;
  rep.result = validate::compare_models(ref, cand, feeds, co);
  progress.finish();
  rep.thresholds = th;
  rep.checks = validate::evaluate_checks(rep.result, th);
  for (const std::string& r : o.reports) validate::write_report(rep, r);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const bool passed = rep.passed();
  if (o.json) {
    std::cout << validate::report_to_json(rep).dump(2) << "\n";
    for (const auto& c : rep.checks)
      if (c.status == validate::Check::Status::Fail) std::cerr << "FAIL " << c.message << "\n";
    return passed ? 0 : 1;
  }
  const auto& r = rep.result;
  std::cout << fmt::format("validated {} against {} on {} sample(s) ({} feed(s), {} run(s)) in {:.2f} s\n", o.candidate,
                           o.reference, r.rows, r.feeds, r.runs, secs);
  print_outputs(r);
  if (r.per_layer) print_layers(*r.per_layer, o.top);
  if (rep.checks.empty()) {
    std::cout << "no thresholds given (--thresholds FILE or --min-cosine, --min-snr-db, ...): metrics only\n";
  } else {
    std::cout << fmt::format("checks ({}): {} passed, {} failed, {} skipped\n", th.source, rep.passed_checks(),
                             rep.failed_checks(), rep.skipped_checks());
    for (const auto& c : rep.checks) {
      if (c.status == validate::Check::Status::Fail) std::cout << "  FAIL " << c.message << "\n";
      else if (c.status == validate::Check::Status::Skip) std::cout << "  skip " << c.message << "\n";
    }
  }
  if (!o.reports.empty()) std::cout << fmt::format("wrote {}\n", fmt::join(o.reports, ", "));
  std::cout << (passed ? "PASSED" : "FAILED") << "\n";
  return passed ? 0 : 1;
}

}  // namespace

void setup_validate(CLI::App& sub, Action& action) {
  auto o = std::make_shared<ValidateOpts>();
  sub.add_option("--reference", o->reference, "FP32 reference model")->required();
  sub.add_option("--candidate", o->candidate, "model to check (FP16, INT8 QDQ, ...); must have the reference's outputs")->required();
  sub.add_option("--data", o->data, "data folder (feed folders, .npy/.pb files or images; labels.npy beside them is used)")
      ->required();
  sub.add_option("--labels", o->labels, "labels file (.npy or .txt, one per sample) when not beside the data");
  sub.add_option("--device", o->device, kDeviceHelp)->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub.add_option("--thresholds", o->thresholds, "JSON thresholds file (see docs/validate.md); flags override it");
  for (const validate::ThresholdKey& k : validate::threshold_keys()) {
    o->limits[k.key] = 0.0;
    std::string help;
    const std::string key = k.key;
    if (key == "min_cosine") help = "fail when an output's cosine similarity is below X";
    else if (key == "min_snr_db") help = "fail when an output's SNR is below X dB";
    else if (key == "max_rel_l2") help = "fail when an output's relative L2 error exceeds X";
    else if (key == "max_abs_error") help = "fail when an output's largest absolute error exceeds X";
    else if (key == "max_mean_abs_error") help = "fail when an output's mean absolute error exceeds X";
    else if (key == "min_top1_agreement") help = "fail when top-1 agrees with the reference on less than X (fraction)";
    else if (key == "max_top1_drop") help = "fail when accuracy drops by more than X (fraction; without labels: top-1 disagreement)";
    else if (key == "min_accuracy") help = "fail when the candidate's accuracy (labels) is below X (fraction)";
    o->limit_opts[k.key] = sub.add_option(k.flag, o->limits[k.key], help);
  }
  sub.add_option("--report", o->reports, "write a report; format by extension: .json, .xml (JUnit), .html (repeatable)");
  sub.add_flag("--per-layer", o->per_layer, "compare every intermediate tensor matched by name and rank layers by the error they add");
  sub.add_option("--top", o->top, "per-layer rows to print (default 15)")->check(kCount);
  sub.add_option("--jump-db", o->jump_db, "first jump: first layer whose local SNR is within X dB of the worst (default 10)");
  sub.add_option("--max-samples", o->max_samples, "compare at most N samples (batch rows)")->check(kCount);
  sub.add_option("--batch-size", o->batch_size, "rows per run when a data file holds a batch (default 64)");
  sub.add_option("--class-axis", o->class_axis, "axis of class scores for top-1 (default 1; -1 for the last)");
  sub.add_option("--label-output", o->label_output, "output the labels refer to (default: the first classifier-shaped one)");
  sub.add_option("--threads", o->threads, "CPU threads (default: one per CPU this process may run on, as taskset or a cpuset allows)")->check(kCount);
  sub.add_flag("--json", o->json, "print the JSON report to stdout");
  sub.footer(
      "Exit status: 0 every threshold holds, 1 a threshold failed (each printed), 2 bad input.\n"
      "Example: mpq validate --reference calib_data/demo.onnx --candidate demo_int8.onnx --data calib_data/eval \\\n"
      "           --thresholds ci/thresholds/demo_int8.json --report validate.xml --per-layer");
  sub.callback([&action, o] { action = [o] { return validate_command(*o); }; });
}

}  // namespace mpq::cli
