#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "calib/range_methods.h"
#include "cli.h"
#include "core/file_io.h"
#include "ir/onnx_io.h"
#include "runtime/devices.h"
#include "train/qat.h"

namespace mpq::cli {

namespace {

struct QatOpts {
  std::string model, output, data, eval_data, calib, method = "entropy";
  int64_t calib_samples = 512;
  std::string loss = "distill";
  double temperature = 1.0;
  int64_t epochs = 1, steps = -1, batch_size = 64, warmup = -1;
  double lr = 1e-4, weight_decay = 0.0, max_grad_norm = 0.0;
  std::string optimizer = "adamw";
  int weight_bits = 8;
  bool per_channel = false, per_tensor = false;
  std::string activation_type = "int8";
  bool learn_scales = false, fixed_scales = false;
  int64_t freeze_ranges_after = -1;
  std::string amp = "off", device = "cpu";
  int threads = 0;
  uint64_t seed = 0;
  std::vector<std::string> exclude_nodes, exclude_ops;
  std::string checkpoint;
  int64_t every = 0;
  bool resume = false, json = false;
};

std::atomic<bool> g_stop{false};
extern "C" void on_sigint(int) {
  g_stop.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

std::string duration(double s) {
  if (s < 60) return fmt::format("{:.0f}s", s);
  if (s < 3600) return fmt::format("{}m{:02.0f}s", static_cast<int>(s / 60), std::fmod(s, 60.0));
  return fmt::format("{}h{:02d}m", static_cast<int>(s / 3600), static_cast<int>(std::fmod(s, 3600.0) / 60));
}

std::string pct(double v) { return v < 0 ? std::string("-") : fmt::format("{:.2f}%", 100.0 * v); }

int qat_command(const QatOpts& o) {
  if (o.per_channel && o.per_tensor) fail_input("--per-channel and --per-tensor exclude each other");
  if (o.learn_scales && o.fixed_scales) fail_input("--learn-scales and --fixed-scales exclude each other");
  if (o.epochs < 1 && o.steps <= 0) fail_input("--epochs must be at least 1");
  if (o.every > 0 && o.checkpoint.empty()) fail_input("--every needs --checkpoint DIR");
  if (o.weight_bits == 4 && o.activation_type != "int8" && o.activation_type != "uint8")
    fail_input("--activation-type must be int8 or uint8");
  const rt::BackendKind device = rt::resolve_device(o.device);
  refuse_overwrite_input(o.model, o.output);
  const fs::path out_dir = fs::path(o.output).has_parent_path() ? fs::path(o.output).parent_path() : fs::path(".");
  if (!fs::is_directory(out_dir)) fail_input("{}: output folder {} does not exist", o.output, out_dir.string());

  train::QatOptions q;
  q.model = o.model;
  q.data = o.data;
  q.eval_data = o.eval_data;
  q.calib_table = o.calib;
  q.method = calib::parse_range_method(o.method);
  q.calib_samples = o.calib_samples;
  q.loss = o.loss;
  q.temperature = o.temperature;
  q.epochs = o.epochs;
  q.steps = o.steps;
  q.batch_size = o.batch_size;
  q.lr = o.lr;
  q.optimizer = o.optimizer;
  q.weight_decay = o.weight_decay;
  q.warmup = o.warmup;
  q.max_grad_norm = o.max_grad_norm;
  q.quant.weight_bits = o.weight_bits;
  q.quant.per_channel = !o.per_tensor;
  q.quant.activation_type = o.activation_type;
  q.quant.exclude_nodes = split_comma_list(o.exclude_nodes);
  q.quant.exclude_ops = split_comma_list(o.exclude_ops);
  q.learn_scales = !o.fixed_scales;
  q.freeze_ranges_after = o.freeze_ranges_after;
  q.amp = train::parse_amp(o.amp);
  q.device = device;
  q.threads = o.threads;
  q.seed = o.seed;
  q.checkpoint_dir = o.checkpoint;
  q.checkpoint_every = o.every;
  q.resume = o.resume;
  q.command = command_line();
  q.log = [](const std::string& line) { spdlog::info("{}", line); };

  // Progress: a live line on a terminal, a log line every tenth of the run otherwise.
  const bool tty = stderr_is_terminal();
  auto last_draw = std::chrono::steady_clock::now();
  int64_t last_logged_tenth = -1;
  q.progress = [&](const train::QatProgress& p) {
    const std::string line = fmt::format(
        "epoch {}/{} step {}/{} loss {:.5g} lr {:.2e}{} | {:.0f} samples/s | ETA {}{}", p.epoch, p.epochs, p.step, p.steps,
        p.loss, p.lr, q.amp == train::Amp::Fp16 ? fmt::format(" scale {:g}", p.loss_scale) : std::string(),
        p.samples_per_second, duration(p.eta_seconds), p.skipped ? " (step skipped: inf/NaN)" : "");
    if (tty) {
      const auto now = std::chrono::steady_clock::now();
      if (p.step == p.steps || now - last_draw > std::chrono::milliseconds(200)) {
        std::fprintf(stderr, "\r\033[K%s", line.c_str());
        std::fflush(stderr);
        last_draw = now;
      }
    } else {
      const int64_t tenth = p.step * 10 / std::max<int64_t>(p.steps, 1);
      if (tenth != last_logged_tenth) {
        last_logged_tenth = tenth;
        spdlog::info("{}", line);
      }
    }
  };
  g_stop = false;
  q.stop_requested = [] { return g_stop.load(); };
  auto previous = std::signal(SIGINT, on_sigint);
  train::QatResult r;
  try {
    r = train::qat_finetune(q);
  } catch (...) {
    std::signal(SIGINT, previous);
    if (tty) std::fprintf(stderr, "\n");
    throw;
  }
  std::signal(SIGINT, previous);
  if (tty) std::fprintf(stderr, "\n");
  if (r.interrupted) {
    std::fprintf(stderr, "mpq: interrupted at step %lld of %lld; %s\n", static_cast<long long>(r.steps_done),
                 static_cast<long long>(r.total_steps),
                 o.checkpoint.empty() ? "nothing was written (give --checkpoint DIR to be able to resume)"
                                      : fmt::format("checkpoint in {}: continue with --resume", o.checkpoint).c_str());
    return 130;
  }
  ir::save_model(r.exported, o.output);
  const uintmax_t size_before = fs::file_size(o.model), size_after = fs::file_size(o.output);

  if (o.json) {
    nlohmann::json j;
    j["output"] = o.output;
    j["steps"] = r.total_steps;
    j["resumed_from_step"] = r.start_step;
    j["seconds"] = r.seconds;
    j["seconds_per_epoch"] = r.seconds_per_epoch;
    // The steady-state step: the median over the steps after the first (which plans the kernels).
    if (r.step_ms.size() > 1) {
      std::vector<double> later(r.step_ms.begin() + 1, r.step_ms.end());
      std::nth_element(later.begin(), later.begin() + static_cast<std::ptrdiff_t>(later.size() / 2), later.end());
      j["step_ms_median"] = later[later.size() / 2];
      j["first_step_ms"] = r.step_ms.front();
    }
    j["first_loss"] = r.first_loss;
    j["final_loss"] = r.final_loss;
    j["losses"] = r.losses;
    j["skipped_steps"] = r.skipped_steps;
    j["final_loss_scale"] = r.final_loss_scale;
    j["calibration"] = r.calibration_method;
    j["quantized"] = r.report.quantized;
    j["weight_bits"] = o.weight_bits;
    j["per_channel"] = r.report.per_channel;
    j["trainable_parameters"] = r.trainable_parameters;
    j["trainable_scales"] = r.trainable_scales;
    j["peak_step_bytes"] = r.peak_step_bytes;
    j["size_before_bytes"] = size_before;
    j["size_after_bytes"] = size_after;
    j["notes"] = r.notes;
    if (r.has_eval) {
      auto m = [](const train::QatMetrics& x) {
        return nlohmann::json{{"rows", x.rows}, {"accuracy", x.accuracy}, {"agreement_with_fp32", x.agreement}, {"rel_l2_vs_fp32", x.rel_l2}};
      };
      j["eval"] = {{"fp32", m(r.fp32)}, {"before", m(r.before)}, {"after", m(r.after)}};
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  int nodes = 0;
  for (const auto& [op, n] : r.report.quantized) nodes += n;
  std::cout << fmt::format("fine-tuned {} quantized node(s) ({}-bit weights {}, {} activations) for {} step(s){} in {} "
                           "({} per epoch); loss {:.5g} -> {:.5g}{}\n",
                           nodes, o.weight_bits, r.report.per_channel ? "per channel" : "per tensor", o.activation_type,
                           r.total_steps - r.start_step, r.start_step ? fmt::format(" (resumed at {})", r.start_step) : "",
                           duration(r.seconds), duration(r.seconds_per_epoch), r.first_loss, r.final_loss,
                           r.skipped_steps ? fmt::format("; {} step(s) skipped on inf/NaN", r.skipped_steps) : "");
  std::cout << fmt::format("  initial ranges: {}; {} trainable values, {} step size tensor(s) {}\n", r.calibration_method,
                           r.trainable_parameters, r.trainable_scales, o.fixed_scales ? "(fixed)" : "learned (LSQ)");
  for (const std::string& n : r.notes) std::cout << "  note: " << n << "\n";
  if (r.has_eval) {
    std::cout << fmt::format("  on {} ({} rows):   accuracy   agreement with FP32\n", o.eval_data, r.fp32.rows);
    std::cout << fmt::format("    FP32                 {:>8}\n", pct(r.fp32.accuracy));
    std::cout << fmt::format("    before (PTQ scales)  {:>8}   {:>8}\n", pct(r.before.accuracy), pct(r.before.agreement));
    std::cout << fmt::format("    after QAT            {:>8}   {:>8}\n", pct(r.after.accuracy), pct(r.after.agreement));
  }
  std::cout << fmt::format("wrote {}: {} -> {} ({:.1f}% of FP32)\n", o.output, human_bytes(static_cast<double>(size_before)),
                           human_bytes(static_cast<double>(size_after)),
                           100.0 * static_cast<double>(size_after) / static_cast<double>(size_before));
  return 0;
}

}  // namespace

void setup_qat_finetune(CLI::App& sub, Action& action) {
  auto o = std::make_shared<QatOpts>();
  std::vector<std::string> methods;
  for (const auto& m : calib::range_methods()) methods.push_back(m.name);
  sub.add_option("MODEL", o->model, "FP32 ONNX model")->required();
  sub.add_option("--data", o->data, "training data folder (any --data layout; labels.npy beside it for --loss ce)")->required();
  sub.add_option("-o,--output", o->output, "INT8 QDQ model to write")->required();
  sub.add_option("--calib", o->calib, "initial ranges from `mpq calibrate` (default: calibrate on --data)");
  sub.add_option("--method", o->method, "range method when calibrating: minmax, percentile, entropy (default), mse")
      ->check(CLI::IsMember(methods));
  sub.add_option("--calib-samples", o->calib_samples, "rows of --data to calibrate on (default 512)")->check(kCount);
  sub.add_option("--loss", o->loss,
                 "distill (default: no labels; KL to the FP32 model's softmax for classifiers, MSE otherwise), ce "
                 "(labels), distill+ce")
      ->check(CLI::IsMember({"distill", "ce", "distill+ce"}));
  sub.add_option("--temperature", o->temperature, "distillation temperature (default 1)");
  sub.add_option("--epochs", o->epochs, "passes over --data (default 1)");
  sub.add_option("--steps", o->steps, "optimizer steps (overrides --epochs)")->check(whole_number_at_least(1));
  sub.add_option("--batch-size", o->batch_size, "rows per step (default 64)");
  sub.add_option("--lr", o->lr, "peak learning rate (default 1e-4); cosine decay after the warm-up");
  sub.add_option("--optimizer", o->optimizer, "adamw (default) or sgd (momentum 0.9)")->check(CLI::IsMember({"adamw", "sgd"}));
  sub.add_option("--weight-decay", o->weight_decay, "weight decay of the weights (default 0; never on biases or step sizes)");
  sub.add_option("--warmup", o->warmup, "linear warm-up steps (default: 5% of the steps, at most 100)")->check(kCount);
  sub.add_option("--clip-grad-norm", o->max_grad_norm, "clip gradients to this global L2 norm (default: off)");
  sub.add_option("--weight-bits", o->weight_bits, "8 (default, [-127, 127]) or 4 ([-7, 7], stored as int8)")->check(CLI::IsMember({4, 8}));
  sub.add_flag("--per-channel", o->per_channel, "weights per output channel (default)");
  sub.add_flag("--per-tensor", o->per_tensor, "one weight scale per tensor");
  sub.add_option("--activation-type", o->activation_type, "int8 (symmetric, default) or uint8 (asymmetric)")
      ->check(CLI::IsMember({"int8", "uint8"}));
  sub.add_flag("--learn-scales", o->learn_scales, "train the step sizes with LSQ (default)");
  sub.add_flag("--fixed-scales", o->fixed_scales, "keep the calibrated scales; train weights and biases only");
  sub.add_option("--freeze-ranges-after", o->freeze_ranges_after, "stop training the step sizes after this many steps")->check(kCount);
  sub.add_option("--amp", o->amp, "mixed precision: off (default), fp16 (with dynamic loss scaling) or bf16")
      ->check(CLI::IsMember({"off", "fp16", "bf16"}));
  sub.add_option("--device", o->device,
                 "cpu (default), auto (cuda when a GPU is usable, else cpu) or cuda (the student's forward and backward and the teacher on the GPU, "
                 "with the optimizer update; FP32 models, --amp as on the CPU; docs/gpu.md)")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub.add_option("--threads", o->threads, "CPU threads (default: one per CPU this process may run on, as taskset or a cpuset allows)")->check(kCount);
  sub.add_option("--seed", o->seed, "shuffling seed (default 0); same seed, data and flags give identical output");
  sub.add_option("--exclude-nodes", o->exclude_nodes, "node names to keep in float (comma separated)");
  sub.add_option("--exclude-ops", o->exclude_ops, "op types to keep in float (comma separated)");
  sub.add_option("--eval-data", o->eval_data, "report accuracy (labels) and agreement with FP32 before and after");
  sub.add_option("--checkpoint", o->checkpoint, "folder for checkpoints (written atomically at the end, on Ctrl-C, and with --every)");
  sub.add_option("--every", o->every, "also checkpoint every N steps")->check(kCount);
  sub.add_flag("--resume", o->resume, "continue from the checkpoint in --checkpoint (bit-identical to an uninterrupted run)");
  sub.add_flag("--json", o->json, "print the summary as JSON to stdout");
  sub.footer(
      "Example: mpq qat-finetune model.onnx --data train_images/ --eval-data test_images/ --epochs 1 -o model.int8.onnx\n"
      "Without labels the FP32 model teaches its quantized copy (--loss distill). Ctrl-C stops after the current step,\n"
      "writes a checkpoint when --checkpoint is given and exits with 130; no output model is written.");
  sub.callback([&action, o] { action = [o] { return qat_command(*o); }; });
}

}  // namespace mpq::cli
