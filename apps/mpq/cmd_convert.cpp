// mpq convert --fp16 | --bf16: mixed precision that keeps fragile ops in FP32.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "cli.h"
#include "core/file_io.h"
#include "data/feeds.h"
#include "ir/onnx_io.h"
#include "ir/verify.h"
#include "passes/convert_precision.h"
#include "passes/precision_data.h"
#include "passes/precision_policy.h"
#include "runtime/devices.h"

namespace mpq::cli {

namespace {

namespace pp = passes::precision;

struct ConvertOpts {
  std::string model;
  std::string output;
  bool fp16 = false;
  bool bf16 = false;
  bool keep_io_types = true;
  std::vector<std::string> keep_fp32;
  std::vector<std::string> force_low;
  std::string data;
  double max_magnitude = 0.0;  // 0: the default of the target type
  int64_t max_samples = -1;
  bool validate = false;
  double min_cosine = -2.0;  // < -1: no gate
  bool list_policy = false;
  std::string device = "cpu";
  int threads = 0;
  bool json = false;
  int max_table_rows = 100;
};

std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (std::isnan(v)) return "nan";
  return fmt::format("{:.4g}", v);
}

nlohmann::json json_num(double v) {
  if (std::isfinite(v)) return v;
  return num(v);
}

int list_policy(const ConvertOpts& o) {
  const auto& table = pp::policy_table();
  if (o.json) {
    nlohmann::json j;
    j["ops"] = nlohmann::json::array();
    for (const auto& e : table)
      j["ops"].push_back({{"op", e.op}, {"fp16", pp::op_class_name(e.fp16)}, {"bf16", pp::op_class_name(e.bf16)}, {"why", e.why}});
    j["unlisted"] = "default-domain ops follow their inputs; ops of other domains stay FP32";
    j["patterns"] = {"written-out LayerNorm (ReduceMean, Sub, Pow|Mul, ReduceMean, Add, Sqrt, Div [, Mul, Add]) stays FP32"};
    j["fp32_inputs"] = {"Resize roi, scales", "Upsample scales", "RoiAlign rois", "Dropout ratio",
                        "NonMaxSuppression boxes, scores, score_threshold", "GridSample grid"};
    j["default_max_magnitude"] = {{"fp16", pp::kDefaultMaxMagnitude}, {"bf16", "off (only values beyond BF16's range)"}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "mpq convert policy: low = runs in FP16/BF16, fp32 = kept in FP32, follow = takes the precision of\n"
               "its inputs (mixed inputs: the widest; inputs that are only constants or graph inputs: whatever the\n"
               "consumers need).\n\n";
  std::cout << fmt::format("  {:<26} {:<7} {:<7} {}\n", "op", "fp16", "bf16", "why");
  for (const auto& e : table)
    std::cout << fmt::format("  {:<26} {:<7} {:<7} {}\n", e.op, pp::op_class_name(e.fp16), pp::op_class_name(e.bf16), e.why);
  std::cout << "\n  unlisted ops of the ONNX domain follow their inputs; ops of other domains stay FP32.\n"
               "  patterns: a written-out LayerNorm (ReduceMean, Sub, Pow|Mul, ReduceMean, Add, Sqrt, Div [, Mul, Add])\n"
               "    stays FP32 as a whole in both modes.\n"
               "  inputs that always stay FP32: Resize roi and scales, Upsample scales, RoiAlign rois, Dropout ratio,\n"
               "    NonMaxSuppression boxes/scores/score_threshold, GridSample grid.\n"
               "  an op whose ONNX schema at the model's opset rejects the low type stays FP32; so does the consumer of\n"
               "    a constant beyond the low type's range (FP16: |x| > 65504), and, with --data, every node whose\n"
               "    tensors exceed --max-magnitude (FP16 default 4096) or the low type's range.\n"
               "  overrides: --keep-fp32 OP_OR_NODE,... and --force-low OP_OR_NODE,... (a node name wins over an op type).\n";
  return 0;
}

int convert_command(const ConvertOpts& o) {
  if (o.list_policy) return list_policy(o);
  if (o.fp16 == o.bf16) fail_input("give exactly one of --fp16 or --bf16");
  if (o.model.empty()) fail_input("MODEL is required");
  if (o.output.empty()) fail_input("-o OUT is required");
  if (o.validate && o.data.empty()) fail_input("--validate needs --data DIR to run both models on");
  if (o.max_magnitude < 0.0 || std::isnan(o.max_magnitude)) fail_input("--max-magnitude must be positive");
  if (o.min_cosine > -2.0 && !o.validate) fail_input("--min-cosine needs --validate");
  const DType low = o.bf16 ? DType::BFloat16 : DType::Float16;
  rt::BackendKind backend = rt::resolve_device(o.device);
  refuse_overwrite_input(o.model, o.output);
  auto t0 = std::chrono::steady_clock::now();

  ir::Model model = ir::load_model(o.model);
  ir::verify_or_throw(model);
  const uintmax_t size_before = fs::file_size(o.model);
  // The untouched FP32 model: feeds are checked against it, magnitudes and references come from it.
  ir::Model reference = o.data.empty() ? ir::Model() : model.clone();

  passes::ConvertOptions co;
  co.low = low;
  co.keep_io_types = o.keep_io_types;
  co.keep_fp32 = split_comma_list(o.keep_fp32);
  co.force_low = split_comma_list(o.force_low);
  co.max_magnitude = o.max_magnitude > 0.0 ? o.max_magnitude
                                           : (low == DType::Float16 ? pp::kDefaultMaxMagnitude
                                                                    : std::numeric_limits<double>::max());
  rt::ExecOptions eopts;
  eopts.backend = backend;
  eopts.threads = o.threads;

  std::unordered_map<std::string, double> magnitudes;
  std::optional<data::FeedSource> feeds;
  if (!o.data.empty()) {
    data::DataOptions dopts;
    dopts.max_feeds = o.max_samples;
    feeds.emplace(data::FeedSource::open(o.data, reference, dopts));
    Progress progress("magnitudes", static_cast<int64_t>(feeds->size()));
    magnitudes = pp::collect_magnitudes(reference, *feeds, eopts, [&](int64_t d, int64_t) { progress.update(d); });
    progress.finish();
    co.magnitudes = &magnitudes;
  }

  passes::ConvertReport rep = passes::convert_precision(model, co);
  ir::verify_or_throw(model);
  passes::PrecisionLayout layout = passes::describe_precision(model);

  const char* type_name = low == DType::Float16 ? "float16" : "bfloat16";
  model.set_metadata("mpq.version", MPQ_VERSION);
  model.set_metadata("mpq.command", command_line());
  model.set_metadata("mpq.conversion.precision", type_name);
  model.set_metadata("mpq.conversion.keep_io_types", o.keep_io_types ? "true" : "false");
  model.set_metadata("mpq.conversion.nodes_low", std::to_string(rep.nodes_low));
  model.set_metadata("mpq.conversion.nodes_fp32", std::to_string(rep.nodes_fp32));
  if (rep.opset_after != rep.opset_before)
    model.set_metadata("mpq.conversion.opset", fmt::format("{} -> {}", rep.opset_before, rep.opset_after));
  if (feeds) {
    model.set_metadata("mpq.conversion.data_samples", std::to_string(feeds->size()));
    model.set_metadata("mpq.conversion.max_magnitude", num(co.max_magnitude));
  }
  ir::save_model(model, o.output);
  const uintmax_t size_after = fs::file_size(o.output);

  // Validation runs the written file, so it also checks that the output loads.
  std::optional<pp::Comparison> cmp;
  if (o.validate) {
    ir::Model written = ir::load_model(o.output);
    ir::verify_or_throw(written);
    Progress progress("validate", static_cast<int64_t>(feeds->size()));
    cmp = pp::compare_models(reference, written, *feeds, eopts, [&](int64_t d, int64_t) { progress.update(d); });
    progress.finish();
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bool gate_failed = false;
  if (cmp && o.min_cosine > -2.0)
    for (const auto& c : cmp->outputs)
      if (!(c.cosine >= o.min_cosine)) gate_failed = true;

  const double ratio = static_cast<double>(size_after) / static_cast<double>(std::max<uintmax_t>(size_before, 1));
  if (o.json) {
    nlohmann::json j;
    j["output"] = o.output;
    j["precision"] = type_name;
    j["keep_io_types"] = o.keep_io_types;
    j["nodes_low"] = rep.nodes_low;
    j["nodes_fp32"] = rep.nodes_fp32;
    j["kept_by_category"] = rep.kept_by_category;
    j["kept"] = nlohmann::json::array();
    for (const auto& k : rep.kept)
      j["kept"].push_back({{"node", k.node}, {"op", k.op}, {"category", k.category}, {"reason", k.reason}});
    j["casts"] = {{"inserted", rep.casts_inserted}, {"retargeted", rep.casts_retargeted}, {"removed", rep.casts_removed},
                  {"total", layout.casts}, {"interface", layout.interface_casts}, {"boundary", layout.boundary_casts}};
    j["fp32_islands"] = {{"count", layout.islands}, {"max_casts_per_island", layout.max_casts_per_island()}};
    j["initializers"] = {{"converted", rep.initializers_converted}, {"low_copies", rep.initializer_copies},
                         {"underflow_values", rep.underflow_values}, {"overflow_constants", rep.overflow_constants}};
    j["underflow_tensors"] = nlohmann::json::array();
    for (const auto& [name, n] : rep.underflow_tensors) j["underflow_tensors"].push_back({{"tensor", name}, {"values", n}});
    j["opset"] = {{"before", rep.opset_before}, {"after", rep.opset_after}};
    j["subgraphs"] = rep.subgraphs;
    j["size_before_bytes"] = size_before;
    j["size_after_bytes"] = size_after;
    j["size_ratio"] = ratio;
    if (feeds) j["data"] = {{"dir", o.data}, {"feeds", feeds->size()}, {"max_magnitude", json_num(co.max_magnitude)}};
    if (cmp) {
      j["validation"] = {{"feeds", cmp->feeds}, {"outputs", nlohmann::json::array()}};
      for (const auto& c : cmp->outputs)
        j["validation"]["outputs"].push_back({{"name", c.name}, {"cosine", json_num(c.cosine)}, {"rel_l2", json_num(c.rel_l2)},
                                              {"max_abs", json_num(c.max_abs)}, {"top1_rows", c.rows},
                                              {"top1_agree", c.top1_agree}, {"nonfinite", c.nonfinite}});
      if (o.min_cosine > -2.0) {
        j["validation"]["min_cosine"] = o.min_cosine;
        j["validation"]["passed"] = !gate_failed;
      }
    }
    j["notes"] = rep.notes;
    j["seconds"] = secs;
    std::cout << j.dump(2) << "\n";
    return gate_failed ? 1 : 0;
  }

  const char* up = low == DType::Float16 ? "FP16" : "BF16";
  std::cout << fmt::format("converted {} to {}: {} node(s) in {}, {} kept in FP32\n", o.model, up, rep.nodes_low, up,
                           rep.nodes_fp32);
  std::cout << fmt::format("  casts: {} in the graph ({} at the graph interface, {} around {} FP32 island(s), at most {} per island);"
                           " {} existing retargeted, {} removed\n",
                           layout.casts, layout.interface_casts, layout.boundary_casts, layout.islands,
                           layout.max_casts_per_island(), rep.casts_retargeted, rep.casts_removed);
  std::cout << fmt::format("  constants: {} stored in {} ({} extra low-precision copies), {} value(s) underflowed to 0, "
                           "{} beyond the {} range\n",
                           rep.initializers_converted, type_name, rep.initializer_copies, rep.underflow_values,
                           rep.overflow_constants, type_name);
  if (rep.tables_narrowed)
    std::cout << fmt::format("  embedding tables: {} stored in {} with a Cast after their FP32 Gather ({} saved)\n",
                             rep.tables_narrowed, type_name, human_bytes(static_cast<double>(rep.table_bytes_saved)));
  int follow = 0;
  std::vector<const passes::KeptNode*> shown;
  for (const auto& k : rep.kept) {
    if (k.category == "follow") ++follow;
    else shown.push_back(&k);
  }
  if (!shown.empty()) {
    size_t w = 4;
    for (const auto* k : shown) w = std::max(w, std::min<size_t>(k->node.size(), 48));
    std::cout << fmt::format("  kept in FP32:\n    {:<{}}  {:<20} {:<9} {}\n", "node", w, "op", "category", "reason");
    int rows = 0;
    for (const auto* k : shown) {
      if (rows++ >= o.max_table_rows) {
        std::cout << fmt::format("    ... and {} more (--json lists all)\n", shown.size() - static_cast<size_t>(o.max_table_rows));
        break;
      }
      std::cout << fmt::format("    {:<{}}  {:<20} {:<9} {}\n", k->node, w, k->op, k->category, k->reason);
    }
  }
  if (follow) std::cout << fmt::format("  {} more node(s) stay FP32 because they follow FP32 inputs or feed FP32 consumers\n", follow);
  for (const std::string& n : rep.notes) std::cout << "  note: " << n << "\n";
  if (feeds)
    std::cout << fmt::format("  data-aware: magnitudes from {} feed(s) of {}; threshold |x| > {}\n", feeds->size(), o.data,
                             num(co.max_magnitude));
  if (cmp) {
    std::cout << fmt::format("validation on {} feed(s): FP32 reference vs the written model ({} in {} storage, mpq)\n",
                             cmp->feeds, o.output, up);
    size_t w = 6;
    for (const auto& c : cmp->outputs) w = std::max(w, c.name.size());
    std::cout << fmt::format("    {:<{}}  {:>10}  {:>10}  {:>10}  {:>12}\n", "output", w, "cosine", "rel-L2", "max|err|", "top-1");
    for (const auto& c : cmp->outputs) {
      std::string top1 = c.rows ? fmt::format("{}/{}", c.top1_agree, c.rows) : "-";
      std::cout << fmt::format("    {:<{}}  {:>10.7f}  {:>10}  {:>10}  {:>12}{}\n", c.name, w, c.cosine, num(c.rel_l2),
                               num(c.max_abs), top1, c.nonfinite ? fmt::format("  ({} inf/NaN)", c.nonfinite) : "");
    }
    if (o.min_cosine > -2.0)
      std::cout << fmt::format("  {}: every output cosine >= {}\n", gate_failed ? "FAIL" : "PASS", o.min_cosine);
  }
  std::cout << fmt::format("wrote {}: {} -> {} ({:.1f}% of FP32) in {:.2f} s\n", o.output,
                           human_bytes(static_cast<double>(size_before)), human_bytes(static_cast<double>(size_after)),
                           100.0 * ratio, secs);
  return gate_failed ? 1 : 0;
}

}  // namespace

void setup_convert(CLI::App& sub, Action& action) {
  auto o = std::make_shared<ConvertOpts>();
  sub.add_option("MODEL", o->model, "FP32 ONNX model");
  sub.add_option("-o,--output", o->output, "converted model to write (never the input)");
  sub.add_flag("--fp16", o->fp16, "convert to float16 (IEEE half: max 65504)");
  sub.add_flag("--bf16", o->bf16, "convert to bfloat16 (FP32's range, 8-bit mantissa; opset raised to 13..16 as needed)");
  sub.add_flag("--keep-io-types,!--no-keep-io-types", o->keep_io_types,
               "keep the float32 graph inputs and outputs (default); --no-keep-io-types makes them float16/bfloat16");
  sub.add_option("--keep-fp32", o->keep_fp32, "op types or node names to keep in FP32 (comma separated)");
  sub.add_option("--force-low", o->force_low,
                 "op types or node names to run in FP16/BF16 whatever the policy (comma separated; a node name wins over an op type)");
  sub.add_option("--data", o->data,
                 "data-aware mode: run the FP32 model on this data folder and keep in FP32 every node whose tensors exceed "
                 "--max-magnitude or the target's range");
  sub.add_option("--max-magnitude", o->max_magnitude,
                 "with --data: keep a node in FP32 when one of its float inputs or outputs reaches |x| above this. "
                 "FP16 default 4096 = 65504/16 (rounded to 2^12): four binades of headroom below FP16's max, so a tensor "
                 "seen at the threshold may still grow 16x on unseen inputs, or be summed 16 times (residual adds, short "
                 "reductions, FP16 accumulation inside a kernel), before it overflows; the square of a value at the "
                 "threshold overflows, but products that do are caught on the data as outputs above 65504. "
                 "BF16 default: off (BF16 has FP32's range; only values beyond it count)");
  sub.add_option("--max-samples", o->max_samples, "use at most N feeds of --data")->check(kCount);
  sub.add_flag("--validate", o->validate,
               "with --data: run the FP32 and the converted model (mpq's FP16/BF16 execution) and print per-output "
               "cosine, relative L2, max abs error and top-1 agreement");
  sub.add_option("--min-cosine", o->min_cosine, "with --validate: exit 1 when an output's cosine is below this");
  sub.add_flag("--list-policy", o->list_policy, "print the op policy table and exit");
  sub.add_option("--device", o->device, std::string("device for --data runs: ") + kDeviceHelp)->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub.add_option("--threads", o->threads, "CPU threads for --data runs (default: one per CPU this process may run on, as taskset or a cpuset allows)")->check(kCount);
  sub.add_flag("--json", o->json, "print the summary as JSON to stdout");
  sub.footer("Examples:\n"
             "  mpq convert --fp16 model.onnx -o model.fp16.onnx\n"
             "  mpq convert --fp16 model.onnx -o model.fp16.onnx --data calib_data/eval --validate\n"
             "  mpq convert --bf16 model.onnx -o model.bf16.onnx --keep-fp32 Softmax,/head/Gemm\n"
             "  mpq convert --list-policy");
  sub.callback([&action, o] { action = [o] { return convert_command(*o); }; });
}

}  // namespace mpq::cli
