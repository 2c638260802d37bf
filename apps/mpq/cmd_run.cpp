#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "cli.h"
#include "core/file_io.h"
#include "data/feeds.h"
#include "data/npy.h"
#include "ir/onnx_io.h"
#include "ir/verify.h"
#include "passes/inference_fusion.h"
#include "runtime/devices.h"
#include "runtime/executor.h"
#include "runtime/thread_pool.h"

namespace mpq::cli {

namespace {

struct RunOpts {
  std::string model;
  std::string data;
  std::string outputs;
  std::string device = "cpu";
  bool tf32 = false;
  int threads = 0;
  int repeat = 0;
  int64_t max_samples = -1;
  bool json = false;
  bool no_fusion = false;
  bool profile = false;
  bool profile_nodes = false;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  double pos = p / 100.0 * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(pos);
  size_t hi = std::min(lo + 1, v.size() - 1);
  double frac = pos - static_cast<double>(lo);
  return v[lo] * (1 - frac) + v[hi] * frac;
}

// How the run's idle threads wait between parallel loops, as main.cpp chose at start (spin on a
// quiet machine, sleep on a busy one) or "user" where OMP_WAIT_POLICY / GOMP_SPINCOUNT came from
// the user. Printed because a busy start (a benchmark started beside another program) makes a
// batch-1 run on two threads about twice as slow (U-Net INT8: 0.9-1.0 ms against 0.4-0.5), and
// the latency alone would not say why.
std::string idle_threads() {
  const char* chosen = std::getenv("MPQ_IDLE_THREADS");
  return chosen != nullptr ? chosen : "user";
}

// --profile: per op type, calls and milliseconds per timed run and share of the run's latency (the
// remainder is the executor's own work between nodes: buffers, bookkeeping).
nlohmann::json profile_json(const std::vector<rt::OpTime>& ops, const std::vector<double>& latencies_ms) {
  const auto runs = static_cast<double>(latencies_ms.size());
  double total_ms = 0;
  for (double v : latencies_ms) total_ms += v;
  nlohmann::json rows = nlohmann::json::array();
  for (const rt::OpTime& t : ops)
    rows.push_back({{"op", t.op},
                    {"calls_per_run", static_cast<double>(t.calls) / runs},
                    {"ms_per_run", t.seconds * 1e3 / runs},
                    {"share", total_ms > 0 ? t.seconds * 1e3 / total_ms : 0.0}});
  for (size_t i = 0; i < ops.size(); ++i)
    if (!ops[i].node.empty()) rows[i]["node"] = ops[i].node;
  return rows;
}

void print_profile(const std::vector<rt::OpTime>& ops, const std::vector<double>& latencies_ms) {
  const nlohmann::json rows = profile_json(ops, latencies_ms);
  const bool by_node = !ops.empty() && !ops[0].node.empty();
  std::cout << fmt::format("  time per {} (mean over the timed runs):\n    {:<24} {:>9} {:>11} {:>7}{}\n",
                           by_node ? "node" : "op type", "op", "calls/run", "ms/run", "share", by_node ? "  node" : "");
  double shown = 0;
  for (const auto& r : rows) {
    shown += r["share"].get<double>();
    std::cout << fmt::format("    {:<24} {:>9.1f} {:>11.4f} {:>6.1f}%{}\n", r["op"].get<std::string>(),
                             r["calls_per_run"].get<double>(), r["ms_per_run"].get<double>(),
                             100.0 * r["share"].get<double>(),
                             r.contains("node") ? "  " + r["node"].get<std::string>() : std::string());
  }
  std::cout << fmt::format("    {:<24} {:>9} {:>11} {:>6.1f}%\n", "(between nodes)", "", "", 100.0 * (1.0 - shown));
}

int run_command(const RunOpts& o) {
  rt::BackendKind backend = rt::resolve_device(o.device);
  if (o.profile && o.profile_nodes) fail_input("--profile and --profile-nodes: give one of them");
  const bool profiling = o.profile || o.profile_nodes;
  const char* flag = o.profile_nodes ? "--profile-nodes" : "--profile";
  if (profiling && o.repeat <= 0) fail_input("{} times the --repeat runs: give --repeat R", flag);
  if (profiling && backend != rt::BackendKind::CPU) fail_input("{} times CPU runs only (--device cpu)", flag);
  if (o.tf32 && backend != rt::BackendKind::CUDA) fail_input("--tf32 applies to the CUDA path only (--device cuda or auto with a GPU)");
  ir::Model model = ir::load_model(o.model);
  ir::verify_or_throw(model);
  if (!o.no_fusion)
    for (const auto& note : passes::fuse_for_inference(model, backend)) spdlog::debug("{}", note);
  data::DataOptions dopts;
  dopts.max_feeds = o.max_samples;
  data::FeedSource feeds = data::FeedSource::open(o.data, model, dopts);
  rt::ExecOptions eopts;
  eopts.backend = backend;
  eopts.threads = o.threads;
  eopts.allow_tf32 = o.tf32;
  rt::Executor exec(model, eopts);
  if (!o.outputs.empty()) {
    std::error_code ec;
    fs::create_directories(o.outputs, ec);
    if (ec) fail_input("{}: cannot create output folder: {}", o.outputs, ec.message());
  }
  const auto& out_names = exec.output_names();
  std::vector<std::vector<int64_t>> first_shapes(out_names.size());
  std::vector<DType> out_types(out_names.size(), DType::Undefined);
  std::vector<double> latencies_ms;
  Progress progress("run", static_cast<int64_t>(feeds.size()));
  auto t_start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < feeds.size(); ++i) {
    data::Feed feed = feeds.get(i);
    std::vector<Tensor> outs = exec.run(feed.tensors);
    if (o.repeat > 0) {
      exec.set_profiling(profiling);  // timed runs only: the warm-up creates oneDNN's primitives
      for (int r = 0; r < o.repeat; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        outs = exec.run(feed.tensors);
        auto t1 = std::chrono::steady_clock::now();
        latencies_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      exec.set_profiling(false);
    }
    for (size_t k = 0; k < outs.size(); ++k) {
      if (i == 0) {
        first_shapes[k] = outs[k].shape();
        out_types[k] = outs[k].dtype();
      }
      if (!o.outputs.empty()) {
        fs::path dir = fs::path(o.outputs) / data::sanitize_name(feed.id);
        fs::create_directories(dir);
        data::write_npy(dir / (data::sanitize_name(out_names[k]) + ".npy"), outs[k]);
      }
    }
    progress.update(static_cast<int64_t>(i + 1));
  }
  progress.finish();
  double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["device"] = rt::backend_name(backend);
    j["threads"] = exec.pool().size();
    j["idle_threads"] = idle_threads();
    j["cpus_allowed"] = rt::allowed_cpus();
    j["feeds"] = feeds.size();
    j["outputs"] = nlohmann::json::array();
    for (size_t k = 0; k < out_names.size(); ++k)
      j["outputs"].push_back({{"name", out_names[k]}, {"dtype", dtype_name(out_types[k])}, {"shape", first_shapes[k]}});
    if (!o.outputs.empty()) j["outputs_dir"] = o.outputs;
    if (o.repeat > 0) {
      double sum = 0;
      for (double v : latencies_ms) sum += v;
      j["latency_ms"] = {{"median", percentile(latencies_ms, 50)}, {"p90", percentile(latencies_ms, 90)},
                         {"p99", percentile(latencies_ms, 99)}, {"mean", sum / static_cast<double>(latencies_ms.size())},
                         {"min", *std::min_element(latencies_ms.begin(), latencies_ms.end())},
                         {"max", *std::max_element(latencies_ms.begin(), latencies_ms.end())}};
      j["timed_runs"] = latencies_ms.size();
      if (profiling) j["profile"] = profile_json(exec.profile(o.profile_nodes), latencies_ms);
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("ran {} on {} feed(s) from {} ({}, {} threads{}) in {:.2f} s\n", o.model, feeds.size(), o.data,
                           rt::backend_name(backend), exec.pool().size(),
                           exec.pool().size() > 1 ? fmt::format(", idle threads {}", idle_threads()) : "", total_s);
  for (size_t k = 0; k < out_names.size(); ++k)
    std::cout << fmt::format("  output {}: {}{}\n", out_names[k], dtype_name(out_types[k]), shape_str(first_shapes[k]));
  if (o.repeat > 0) {
    double sum = 0;
    for (double v : latencies_ms) sum += v;
    std::cout << fmt::format("  latency over {} timed runs (after 1 warm-up per feed): median {:.3f} ms, p90 {:.3f} ms, "
                             "p99 {:.3f} ms, mean {:.3f} ms, min {:.3f} ms\n",
                             latencies_ms.size(), percentile(latencies_ms, 50), percentile(latencies_ms, 90),
                             percentile(latencies_ms, 99), sum / static_cast<double>(latencies_ms.size()),
                             *std::min_element(latencies_ms.begin(), latencies_ms.end()));
  }
  if (profiling && o.repeat > 0) print_profile(exec.profile(o.profile_nodes), latencies_ms);
  if (!o.outputs.empty()) std::cout << fmt::format("  wrote outputs to {}/<feed id>/<output>.npy\n", o.outputs);
  return 0;
}

}  // namespace

void setup_run(CLI::App& sub, Action& action) {
  auto o = std::make_shared<RunOpts>();
  sub.add_option("MODEL", o->model, "ONNX model file")->required();
  sub.add_option("--data", o->data, "data folder (feed subfolders, flat .npy/.pb files, or images)")->required();
  sub.add_option("--outputs", o->outputs, "write OUT/<feed id>/<output name>.npy for every feed");
  sub.add_option("--threads", o->threads, "CPU threads (default: one per CPU this process may run on, as taskset or a cpuset allows)")->check(kCount);
  sub.add_option("--repeat", o->repeat, "time R runs of each feed after one warm-up, excluding load")->check(kCount);
  sub.add_option("--max-samples", o->max_samples, "use at most N feeds")->check(kCount);
  sub.add_option("--device", o->device, kDeviceHelp)->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub.add_flag("--tf32", o->tf32, kTf32Help);
  sub.add_flag("--no-fusion", o->no_fusion,
               "run the graph exactly as written (by default BatchNormalization is folded into the Conv "
               "before it, a residual Add and activation after a Conv run in its epilogue, written-out "
               "LayerNorm and GELU run as one node each, a MatMul's bias Add runs in its GEMM, and in a QDQ "
               "model constant DequantizeLinear is folded and each activation QuantizeLinear -> "
               "DequantizeLinear pair runs as one node, or in the epilogue of the Conv before it, with the "
               "same values)");
  sub.add_flag("--profile", o->profile,
               "with --repeat: time every node and print milliseconds per run by op type (JSON: \"profile\")");
  sub.add_flag("--profile-nodes", o->profile_nodes,
               "with --repeat: as --profile, one row per node (its name; JSON: \"profile\" rows with \"node\")");
  sub.add_flag("--json", o->json, "print one JSON object to stdout (latency_ms.median/p90 with --repeat)");
  sub.footer("Example: mpq run model.onnx --data calib_data/eval --outputs out/ --repeat 20 --json");
  sub.callback([&action, o] { action = [o] { return run_command(*o); }; });
}

}  // namespace mpq::cli
