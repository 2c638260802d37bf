#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <iostream>
#include <sstream>

#include "calib/calibrator.h"
#include "cli.h"
#include "core/file_io.h"
#include "ir/onnx_io.h"
#include "ir/verify.h"
#include "passes/fold_constants.h"
#include "passes/fuse_conv_bn.h"
#include "passes/inference_fusion.h"
#include "passes/insert_fake_quant.h"
#include "passes/insert_qdq.h"
#include "passes/model_family.h"
#include "passes/quantize_dynamic.h"
#include "passes/smooth_quant.h"
#include "passes/to_qoperator.h"
#include "runtime/devices.h"
#include "validate/sensitivity.h"

namespace mpq::cli {

namespace {

struct QuantizeOpts {
  std::string model;
  std::string output;
  std::string calib;
  std::string data;
  std::string method = "entropy";
  double percentile = 99.999;
  int64_t max_samples = -1;
  int batch_size = 1;
  bool per_tensor = false;
  bool per_channel = false;
  std::string activation_type = "auto";
  std::string mode = "auto";
  std::string granularity = "token";
  double smooth_quant = -1;  // < 0: off; otherwise SmoothQuant's alpha
  bool no_smooth_quant = false;
  bool float_embeddings = false;
  bool symmetric = false;
  bool reduce_range = false;
  int weight_bits = 8;
  bool float_bias = false;
  bool no_fuse = false;
  bool quantize_attention = false;
  bool float_outputs = false;
  std::vector<std::string> exclude_nodes;
  std::vector<std::string> exclude_ops;
  std::string format = "qdq";
  std::string device = "cpu";
  int threads = 0;
  bool json = false;
  double max_top1_drop = -1;  // < 0: no accuracy budget
  std::string eval_data;      // evaluation data for the budget
};

// What `--mode auto` and `--activation-type auto` resolve to for this model, and why (printed).
struct Choice {
  std::string mode;             // static | dynamic
  std::string activation_type;  // int8 | uint8 (static)
  double smooth_quant = -1;     // SmoothQuant alpha chosen by default (< 0: none)
  std::string why;
};

Choice choose_defaults(const QuantizeOpts& o, const passes::FamilyGuess& family) {
  Choice c;
  const bool transformer = family.family == passes::ModelFamily::Transformer;
  const std::string fam = fmt::format("{} ({})", passes::family_name(family.family), family.why);
  if (o.mode != "auto") {
    c.mode = o.mode;
    c.why = fmt::format("mode {} as asked; model looks like a {}", o.mode, fam);
  } else if (!o.calib.empty()) {
    c.mode = "static";
    c.why = fmt::format("mode static: a calibration table was given; model looks like a {}", fam);
  } else if (transformer) {
    c.mode = "dynamic";
    c.why = fmt::format("mode dynamic (per-{} ranges at run time) for a {}; --mode static uses calibration data instead",
                        o.granularity, fam);

  } else if (!o.data.empty()) {
    c.mode = "static";
    c.why = fmt::format("mode static (calibrated ranges) for a {}", fam);
  } else {
    fail_input("no calibration data: this model looks like a {}, which needs --data DIR or --calib TABLE for static "
               "quantization (or --mode dynamic, which quantizes only its MatMul/Gemm weights without data)",
               fam);
  }
  if (transformer && !o.data.empty() && o.smooth_quant < 0 && !o.no_smooth_quant) {
    // With data at hand, SmoothQuant helps both modes on encoders: an outlier channel widens every
    // per-tensor range and every token's range (docs/quantize.md: all-MiniLM-L6-v2, tiny_bert).
    c.smooth_quant = 0.5;
    c.why += "; SmoothQuant alpha 0.5 from --data (--no-smooth-quant: off)";
  }
  c.activation_type = o.activation_type;
  if (c.mode == "static" && o.activation_type == "auto") {
    // Transformer activations (after GELU, Softmax, LayerNorm with a shifted mean) are seldom
    // centred on zero: asymmetric uint8 uses all 256 levels where symmetric int8 wastes half.
    c.activation_type = transformer ? "uint8" : "int8";
    c.why += transformer ? "; activations uint8 asymmetric (transformer; --activation-type int8 for TensorRT)"
                         : "; activations int8 symmetric (TensorRT's convention)";
  }
  return c;
}

int quantize_dynamic_command(const QuantizeOpts& o, ir::Model& model, const Choice& choice, rt::BackendKind backend,
                             uintmax_t size_before, std::chrono::steady_clock::time_point t0);

// SmoothQuant on the prepared model from per-channel maxima on --data; returns the summary line.
std::string apply_smooth_quant(const QuantizeOpts& o, ir::Model& model, rt::BackendKind backend) {
  passes::SmoothQuantOptions so;
  so.alpha = o.smooth_quant;
  so.exclude_nodes = split_comma_list(o.exclude_nodes);
  so.exclude_ops = split_comma_list(o.exclude_ops);
  data::DataOptions dopts;
  dopts.max_feeds = o.max_samples;
  data::FeedSource feeds = data::FeedSource::open(o.data, model, dopts);
  auto amax = passes::collect_channel_amax(model, feeds, passes::smooth_quant_targets(model, so), o.max_samples, backend,
                                           o.threads);
  passes::SmoothQuantReport r = passes::smooth_quant(model, amax, so);
  ir::verify_or_throw(model);
  model.set_metadata("mpq.quantization.smooth_quant_alpha", fmt::format("{}", o.smooth_quant));
  for (const std::string& n : r.notes) spdlog::warn("{}", n);
  return fmt::format("SmoothQuant alpha {}: {} activation(s) smoothed into {} weight(s) ({} folded into LayerNorm, {} Mul "
                     "inserted), largest channel factor {:.3g}",
                     o.smooth_quant, r.activations, r.weights, r.folded, r.muls, r.largest_factor);
}


int quantize_command(const QuantizeOpts& given) {
  QuantizeOpts o = given;
  if (o.per_tensor && o.per_channel) fail_input("--per-channel and --per-tensor exclude each other");
  if (o.weight_bits == 4 && o.reduce_range) fail_input("--reduce-range is for 8-bit weights; 4-bit weights are [-7, 7] already");
  if (!o.calib.empty() && !o.data.empty()) fail_input("give one of --calib TABLE or --data DIR, not both");
  if (o.smooth_quant >= 0 && o.no_smooth_quant) fail_input("--smooth-quant and --no-smooth-quant exclude each other");
  if (o.smooth_quant >= 0 && o.data.empty())
    fail_input("--smooth-quant needs --data DIR (per-channel activation maxima; a --calib table holds per-tensor ranges only)");
  rt::BackendKind backend = rt::resolve_device(o.device);
  refuse_overwrite_input(o.model, o.output);
  if (o.max_top1_drop >= 0 && o.eval_data.empty()) fail_input("--max-top1-drop needs --eval-data DIR (evaluation data; labels.npy beside it gives the accuracy drop)");
  if (o.max_top1_drop < 0 && !o.eval_data.empty()) fail_input("--eval-data is only used with --max-top1-drop");
  auto t0 = std::chrono::steady_clock::now();
  ir::Model model = ir::load_model(o.model);
  ir::verify_or_throw(model);
  const uintmax_t size_before = fs::file_size(o.model);

  // Prepare: fold constants and BatchNormalization so weights are final before they are quantized.
  passes::FoldConstants fold;
  passes::PassStats folded = passes::run_pass(fold, model);
  passes::PassStats fused;
  if (!o.no_fuse) {
    passes::FuseConvBn fuse;
    fused = passes::run_pass(fuse, model);
  }
  const Choice choice = choose_defaults(o, passes::guess_model_family(model));
  if (choice.smooth_quant >= 0) o.smooth_quant = choice.smooth_quant;
  if (choice.mode == "dynamic") return quantize_dynamic_command(o, model, choice, backend, size_before, t0);
  if (o.calib.empty() && o.data.empty()) fail_input("static quantization needs --data DIR or --calib TABLE");
  o.activation_type = choice.activation_type;
  if (o.symmetric && o.activation_type == "int8") spdlog::debug("int8 activations are symmetric already");
  std::string smoothing;
  if (o.smooth_quant >= 0) smoothing = apply_smooth_quant(o, model, backend);

  passes::QdqOptions qo;
  qo.per_channel = !o.per_tensor;
  qo.activation_type = o.activation_type;
  qo.symmetric = o.symmetric;
  qo.reduce_range = o.reduce_range;
  qo.weight_bits = o.weight_bits;
  qo.quantize_bias = !o.float_bias;
  qo.quantize_attention = o.quantize_attention;
  qo.quantize_outputs = !o.float_outputs;
  qo.exclude_nodes = split_comma_list(o.exclude_nodes);
  qo.exclude_ops = split_comma_list(o.exclude_ops);
  qo.quantize_embeddings = !o.float_embeddings;
  calib::CalibrationTable table;
  std::string method;
  uint64_t samples = 0;
  if (!o.calib.empty()) {
    table = calib::read_table(o.calib);
    method = table.method;
    samples = table.samples;
  } else {
    calib::CalibOptions co;
    co.method = calib::parse_range_method(o.method);
    co.range.percentile = o.percentile;
    co.max_samples = o.max_samples;
    co.batch_size = o.batch_size;
    co.activation_type = o.activation_type;
    co.backend = backend;
    co.threads = o.threads;
    data::DataOptions dopts;
    dopts.max_feeds = o.max_samples;
    // Calibration runs the graph fused as `mpq run` runs it, keeping observable every tensor whose
    // range the quantizers below read (fused-away tensors, such as a convolution's output before
    // its ReLU, get no range and need none).
    ir::Model calib_model = model.clone();
    passes::fuse_for_inference(calib_model, backend, passes::tensors_to_calibrate(model, qo, o.format == "qoperator"));
    data::FeedSource feeds = data::FeedSource::open(o.data, calib_model, dopts);
    Progress progress("calibrate", static_cast<int64_t>(feeds.size()));
    co.progress = [&](int64_t done, int64_t) { progress.update(done); };
    table = calib::calibrate(calib_model, feeds, co);
    progress.finish();
    method = table.method;
    samples = table.samples;
  }

  // Accuracy budget: keep the fewest quantized compute nodes in float that meet it on the evaluation
  // data (the search of `mpq sensitivity`, lib/validate/sensitivity.h).
  std::vector<std::string> kept_fp32;
  bool budget_met = true;
  if (o.max_top1_drop >= 0) {
    ir::Model reference = ir::load_model(o.model);
    data::FeedSource eval = data::FeedSource::open(o.eval_data, reference);
    validate::SensitivityOptions so;
    so.max_top1_drop = o.max_top1_drop;
    so.compare.backend = backend;
    so.compare.threads = o.threads;
    so.log = [](const std::string& line) { spdlog::info("{}", line); };
    auto quantize_keeping = [&](const std::set<std::string>& keep) {
      ir::Model m = model.clone();
      passes::QdqOptions q = qo;
      q.exclude_nodes.insert(keep.begin(), keep.end());
      passes::insert_qdq(m, table, q);
      return m;
    };
    validate::SensitivityResult sr = validate::run_sensitivity(reference, eval, quantize_keeping, so);
    kept_fp32 = sr.kept;
    budget_met = sr.met;
    qo.exclude_nodes.insert(kept_fp32.begin(), kept_fp32.end());
    std::vector<std::string> sorted = kept_fp32;
    std::sort(sorted.begin(), sorted.end());
    model.set_metadata("mpq.sensitivity.kept_fp32", fmt::format("{}", fmt::join(sorted, ",")));
    model.set_metadata("mpq.sensitivity.max_top1_drop", fmt::format("{}", o.max_top1_drop));
    spdlog::info("accuracy budget {:.2f} points {}: {} node(s) kept in FP32{}{}", 100.0 * o.max_top1_drop,
                 sr.met ? "met" : "NOT met", kept_fp32.size(), kept_fp32.empty() ? "" : ": ",
                 fmt::format("{}", fmt::join(kept_fp32, ", ")));
  }
  passes::QdqReport rep;
  if (o.format == "fakequant") {
    // The graph qat-finetune trains, at its starting point: mpq::FakeQuant where Q/DQ would go.
    rep = passes::insert_fake_quant(model, table, qo).report;
  } else {
    rep = passes::insert_qdq(model, table, qo);
  }
  ir::verify_or_throw(model);
  int qop_nodes = 0;
  if (o.format == "qoperator") {
    qop_nodes = passes::convert_to_qoperator(model, table, qo);
    ir::verify_or_throw(model);
  }

  model.set_metadata("mpq.version", MPQ_VERSION);
  model.set_metadata("mpq.command", command_line());
  model.set_metadata("mpq.quantization.format", o.format);
  model.set_metadata("mpq.quantization.calibration_method", method);
  model.set_metadata("mpq.quantization.calibration_samples", std::to_string(samples));
  const int wmax = o.weight_bits == 4 ? 7 : (o.reduce_range ? 63 : 127);
  model.set_metadata("mpq.quantization.weights", fmt::format("{} symmetric {} in [-{}, {}]{}", o.weight_bits == 4 ? "4-bit" : "int8",
                                                             rep.per_channel ? "per-channel" : "per-tensor", wmax, wmax,
                                                             o.weight_bits == 4 ? " (stored as int8)" : ""));
  model.set_metadata("mpq.quantization.activations", o.activation_type == "int8" ? "int8 symmetric per-tensor"
                                                                                 : (o.symmetric ? "uint8 symmetric per-tensor" : "uint8 asymmetric per-tensor"));
  model.set_metadata("mpq.quantization.bias", o.float_bias ? "float" : "int32");
  ir::save_model(model, o.output);
  const uintmax_t size_after = fs::file_size(o.output);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int quantized = 0;
  for (const auto& [op, n] : rep.quantized) quantized += n;
  if (o.json) {
    nlohmann::json j;
    j["output"] = o.output;
    j["format"] = o.format;
    j["quantized"] = rep.quantized;
    j["skipped"] = nlohmann::json::array();
    for (const auto& [node, why] : rep.skipped) j["skipped"].push_back({{"node", node}, {"reason", why}});
    j["activation_qdq_pairs"] = rep.activation_pairs;
    j["weight_tensors"] = rep.weight_tensors;
    j["int32_biases"] = rep.int32_biases;
    j["per_channel"] = rep.per_channel;
    j["folded_constants"] = folded.changed;
    j["fused_batchnorms"] = fused.changed;
    j["qoperator_nodes"] = qop_nodes;
    j["size_before_bytes"] = size_before;
    j["size_after_bytes"] = size_after;
    j["calibration"] = {{"method", method}, {"samples", samples}};
    j["mode"] = "static";
    j["activation_type"] = o.activation_type;
    j["choice"] = choice.why;
    j["embedding_tables"] = rep.embedding_tables;
    if (!smoothing.empty()) j["smooth_quant"] = smoothing;
    j["notes"] = rep.notes;
    j["seconds"] = secs;
    if (o.max_top1_drop >= 0)
      j["sensitivity"] = {{"max_top1_drop", o.max_top1_drop}, {"met", budget_met}, {"kept_fp32", kept_fp32}};
    std::cout << j.dump(2) << "\n";
    return budget_met ? 0 : 1;
  }
  std::vector<std::string> by_op;
  for (const auto& [op, n] : rep.quantized) by_op.push_back(fmt::format("{} {}", op, n));
  std::cout << fmt::format("quantized {} node(s) to INT8 ({}): {}\n", quantized, o.format, fmt::join(by_op, ", "));
  std::cout << "  " << choice.why << "\n";
  if (!smoothing.empty()) std::cout << "  " << smoothing << "\n";
  if (rep.embedding_tables)
    std::cout << fmt::format("  {} embedding table(s) stored int8 per row ({} saved)\n", rep.embedding_tables,
                             human_bytes(static_cast<double>(rep.embedding_bytes_saved)));
  std::cout << fmt::format("  {} activation Q/DQ pairs, {} weight tensors ({}), {} int32 biases; {} BatchNorm fused, {} constants folded\n",
                           rep.activation_pairs, rep.weight_tensors, rep.per_channel ? "per channel" : "per tensor",
                           rep.int32_biases, fused.changed, folded.changed);
  if (o.format == "qoperator") std::cout << fmt::format("  {} QOperator node(s)\n", qop_nodes);
  if (!rep.skipped.empty()) {
    std::cout << fmt::format("  kept in float: {}\n", rep.skipped.size());
    for (const auto& [node, why] : rep.skipped) std::cout << fmt::format("    {}: {}\n", node, why);
  }
  for (const std::string& note : rep.notes) std::cout << "  note: " << note << "\n";
  std::cout << fmt::format("  calibration: {} on {} sample(s)\n", method, samples);
  std::cout << fmt::format("wrote {}: {} -> {} ({:.1f}% of FP32) in {:.2f} s\n", o.output,
                           human_bytes(static_cast<double>(size_before)), human_bytes(static_cast<double>(size_after)),
                           100.0 * static_cast<double>(size_after) / static_cast<double>(size_before), secs);
  if (o.max_top1_drop >= 0)
    std::cout << fmt::format("  accuracy budget {:.2f} points {}; kept in FP32 ({}): {}\n", 100.0 * o.max_top1_drop,
                             budget_met ? "met" : "NOT met (exit 1)", kept_fp32.size(),
                             kept_fp32.empty() ? std::string("none") : fmt::format("{}", fmt::join(kept_fp32, ", ")));
  return budget_met ? 0 : 1;
}

int quantize_dynamic_command(const QuantizeOpts& o, ir::Model& model, const Choice& choice, rt::BackendKind backend,
                             uintmax_t size_before, std::chrono::steady_clock::time_point t0) {
  if (!o.calib.empty()) fail_input("--calib is for --mode static: dynamic quantization computes ranges at run time");
  if (o.weight_bits != 8) fail_input("--weight-bits {} is for --mode static (dynamic mode stores int8 weights)", o.weight_bits);
  if (o.format != "qdq") fail_input("--format {} is for --mode static", o.format);
  if (o.max_top1_drop >= 0) fail_input("--max-top1-drop is for --mode static");
  if (o.activation_type != "auto")
    fail_input("--activation-type is for --mode static: dynamic quantization uses uint8 activations "
               "(DynamicQuantizeLinear's type)");
  std::string smoothing;
  if (o.smooth_quant >= 0) smoothing = apply_smooth_quant(o, model, backend);
  passes::DynamicQuantOptions dq;
  dq.granularity = passes::parse_granularity(o.granularity);
  dq.per_channel = !o.per_tensor;
  dq.reduce_range = o.reduce_range;
  dq.quantize_embeddings = !o.float_embeddings;
  dq.exclude_nodes = split_comma_list(o.exclude_nodes);
  dq.exclude_ops = split_comma_list(o.exclude_ops);
  passes::DynamicQuantReport rep = passes::quantize_dynamic(model, dq);
  ir::verify_or_throw(model);
  const int qmax = o.reduce_range ? 63 : 127;
  model.set_metadata("mpq.version", MPQ_VERSION);
  model.set_metadata("mpq.command", command_line());
  model.set_metadata("mpq.quantization.mode", "dynamic");
  model.set_metadata("mpq.quantization.weights",
                     fmt::format("int8 symmetric {} in [-{}, {}], stored as uint8 with zero point 128",
                                 dq.per_channel ? "per-channel" : "per-tensor", qmax, qmax));
  model.set_metadata("mpq.quantization.activations",
                     fmt::format("uint8 asymmetric per {}, computed at run time", o.granularity));
  model.set_metadata("mpq.quantization.embeddings", rep.embedding_tables ? "int8 per row" : "float");
  ir::save_model(model, o.output);
  const uintmax_t size_after = fs::file_size(o.output);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int quantized = 0;
  for (const auto& [op, n] : rep.quantized) quantized += n;
  if (o.json) {
    nlohmann::json j;
    j["output"] = o.output;
    j["mode"] = "dynamic";
    j["granularity"] = o.granularity;
    j["choice"] = choice.why;
    j["quantized"] = rep.quantized;
    j["skipped"] = nlohmann::json::array();
    for (const auto& [node, why] : rep.skipped) j["skipped"].push_back({{"node", node}, {"reason", why}});
    j["dynamic_activations"] = rep.activations;
    j["weight_tensors"] = rep.weight_tensors;
    j["embedding_tables"] = rep.embedding_tables;
    j["per_channel"] = dq.per_channel;
    j["size_before_bytes"] = size_before;
    j["size_after_bytes"] = size_after;
    j["notes"] = rep.notes;
    if (!smoothing.empty()) j["smooth_quant"] = smoothing;
    j["seconds"] = secs;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::vector<std::string> by_op;
  for (const auto& [op, n] : rep.quantized) by_op.push_back(fmt::format("{} {}", op, n));
  std::cout << fmt::format("quantized {} node(s) to INT8 (dynamic, per {}): {}\n", quantized, o.granularity,
                           fmt::join(by_op, ", "));
  std::cout << "  " << choice.why << "\n";
  if (!smoothing.empty()) std::cout << "  " << smoothing << "\n";
  std::cout << fmt::format("  {} activation(s) quantized at run time, {} weight tensors ({}); {} embedding table(s) stored "
                           "int8 per row ({} saved)\n",
                           rep.activations, rep.weight_tensors, dq.per_channel ? "per channel" : "per tensor",
                           rep.embedding_tables, human_bytes(static_cast<double>(rep.embedding_bytes_saved)));
  if (!rep.skipped.empty()) {
    std::cout << fmt::format("  kept in float: {}\n", rep.skipped.size());
    for (const auto& [node, why] : rep.skipped) std::cout << fmt::format("    {}: {}\n", node, why);
  }
  for (const std::string& note : rep.notes) std::cout << "  note: " << note << "\n";
  std::cout << fmt::format("wrote {}: {} -> {} ({:.1f}% of FP32) in {:.2f} s\n", o.output,
                           human_bytes(static_cast<double>(size_before)), human_bytes(static_cast<double>(size_after)),
                           100.0 * static_cast<double>(size_after) / static_cast<double>(size_before), secs);
  return 0;
}

}  // namespace

void setup_quantize(CLI::App& sub, Action& action) {
  auto o = std::make_shared<QuantizeOpts>();
  std::vector<std::string> names;
  for (const auto& m : calib::range_methods()) names.push_back(m.name);
  sub.add_option("MODEL", o->model, "FP32 ONNX model")->required();
  sub.add_option("-o,--output", o->output, "quantized model to write")->required();
  sub.add_option("--calib", o->calib, "static mode: calibration table from `mpq calibrate` (.json or .pb)");
  sub.add_option("--data", o->data, "calibration data folder (static mode, --smooth-quant)");
  sub.add_option("--method", o->method, "range method with --data: minmax, percentile, entropy (default), mse")
      ->check(CLI::IsMember(names));
  sub.add_option("--percentile", o->percentile, "percentile for --method percentile");
  sub.add_option("--max-samples", o->max_samples, "use at most N feeds for calibration")->check(kCount);
  sub.add_option("--batch-size", o->batch_size, "feeds per calibration run");
  sub.add_flag("--per-channel", o->per_channel, "per-channel int8 weights (default)");
  sub.add_flag("--per-tensor", o->per_tensor, "one scale per weight tensor");
  sub.add_option("--mode", o->mode,
                 "auto (default), static or dynamic. static: activation ranges calibrated once on --data, Q/DQ pairs "
                 "everywhere; the choice for CNNs and for TensorRT/int8 accelerators. dynamic: int8 weights, activation "
                 "ranges computed by the model on every run, no data needed; the choice for transformer encoders "
                 "(BERT, sentence embedders) on CPU, whose ranges change per sentence and per token. auto: dynamic for "
                 "transformers, static for the rest (printed)")
      ->check(CLI::IsMember({"auto", "static", "dynamic"}));
  sub.add_option("--granularity", o->granularity,
                 "dynamic mode: token (default; one uint8 range per token, most accurate) or tensor "
                 "(DynamicQuantizeLinear, the form ONNX Runtime fuses into one kernel: fastest there, less accurate)")
      ->check(CLI::IsMember({"token", "tensor"}));
  sub.add_option("--smooth-quant", o->smooth_quant,
                 "SmoothQuant with this alpha (flag alone: 0.5): move activation outlier channels into the next "
                 "MatMul/Gemm weights before quantizing; needs --data")
      ->expected(0, 1)
      ->default_str("0.5")
      ->check(CLI::Range(0.0, 1.0));
  sub.add_flag("--no-smooth-quant", o->no_smooth_quant, "no SmoothQuant (on by default for transformers given --data)");
  sub.add_flag("--float-embeddings", o->float_embeddings, "keep Gather tables (word/position embeddings) in float");
  sub.add_option("--activation-type", o->activation_type,
                 "static mode: auto (default: int8 for CNNs, uint8 for transformers), int8 (symmetric, TensorRT) or "
                 "uint8 (asymmetric)")
      ->check(CLI::IsMember({"auto", "int8", "uint8"}));
  sub.add_flag("--symmetric", o->symmetric, "symmetric uint8 activations (zero point 128)");
  sub.add_flag("--reduce-range", o->reduce_range,
               "7-bit weights [-63, 63] (ONNX Runtime's reduce_range): use for ONNX Runtime on x86 CPUs without "
               "VNNI, whose uint8 x int8 kernels saturate on full-range weights");
  sub.add_option("--weight-bits", o->weight_bits,
                 "8 (default, [-127, 127]) or 4 ([-7, 7], stored as int8 values: the post-training baseline for 4-bit QAT)")
      ->check(CLI::IsMember({4, 8}));
  sub.add_flag("--float-bias", o->float_bias, "keep biases in float instead of int32");
  sub.add_flag("--no-fuse", o->no_fuse, "do not fold BatchNormalization into Conv/Gemm first");
  sub.add_flag("--quantize-attention", o->quantize_attention, "also quantize MatMuls whose inputs are both activations");
  sub.add_flag("--float-outputs", o->float_outputs, "leave graph outputs of Conv/Gemm/MatMul unquantized");
  sub.add_option("--exclude-nodes", o->exclude_nodes, "node names to keep in float (comma separated)");
  sub.add_option("--exclude-ops", o->exclude_ops, "op types to keep in float (comma separated)");
  sub.add_option("--format", o->format,
                 "qdq (QuantizeLinear/DequantizeLinear, default), qoperator (QLinearConv, ...) or fakequant (the "
                 "fake-quantized training graph qat-finetune starts from, with mpq::FakeQuant nodes: runs in mpq, "
                 "not in other runtimes)")
      ->check(CLI::IsMember({"qdq", "qoperator", "fakequant"}));
  sub.add_option("--device", o->device, std::string("calibration device: ") + kDeviceHelp)->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub.add_option("--threads", o->threads, "CPU threads (default: one per CPU this process may run on, as taskset or a cpuset allows)")->check(kCount);
  sub.add_flag("--json", o->json, "print the summary as JSON to stdout");
  sub.add_option("--max-top1-drop", o->max_top1_drop,
                 "accuracy budget (fraction, 0.01 = 1 point): keep the fewest compute nodes in FP32 that meet it on --eval-data "
                 "(exit 1 when it cannot be met; see mpq sensitivity)");
  sub.add_option("--eval-data", o->eval_data, "evaluation data for --max-top1-drop (labels.npy beside it: accuracy drop; "
                                               "without: top-1 disagreement with FP32)");
  sub.footer("Examples:\n  mpq quantize cnn.onnx --data calib_data/calib --method entropy -o cnn.int8.onnx      # static\n"
             "  mpq quantize encoder.onnx -o encoder.int8.onnx                                     # dynamic, no data\n"
             "  mpq quantize encoder.onnx --mode static --data sentences/ --smooth-quant -o enc.int8.onnx");
  sub.callback([&action, o] { action = [o] { return quantize_command(*o); }; });
}

}  // namespace mpq::cli
